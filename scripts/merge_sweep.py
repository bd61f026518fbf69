"""Merge the seeds of one sweep directory into another of the same setting (pope.train.sweep_merge):

    PYTHONPATH=src python scripts/merge_sweep.py SOURCE DESTINATION [--replace-unfinished]

e.g. a seed trained in a later job, or on another machine (`runs/pope-fp32-seed5`), into the sweep it belongs to
(`runs/pope-fp32`), so that `pope report` sees one setting. Nothing is changed unless every check passes; an error
is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from pope.train.sweep_merge import merge_sweep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the sweep directory whose seeds are copied (left unchanged)")
    parser.add_argument("destination", help="the sweep directory they join")
    parser.add_argument(
        "--replace-unfinished",
        action="store_true",
        help="a seed in both: replace the destination's copy if it is unfinished",
    )
    args = parser.parse_args(argv)
    try:
        lines = merge_sweep(args.source, args.destination, replace_unfinished=args.replace_unfinished)
    except (ValueError, OSError) as error:
        print(f"merge_sweep.py: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `pope` command. Thin: each area registers its own sub-commands.

    pope train PRESET --pe NAME --out DIR        (pope.train.cli)
    pope data prepare NAME | info DIR            (pope.data.cli)
    pope eval ... | analyze ... | report ...     (pope.eval.cli)
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute sub-commands; each defines `register(subparsers)`.
# Imported lazily so `pope --help` stays fast and a missing optional extra only breaks its own command.
_COMMAND_MODULES = ("pope.train.cli", "pope.data.cli", "pope.eval.cli")


def build_parser() -> argparse.ArgumentParser:
    from pope.version import __version__

    parser = argparse.ArgumentParser(prog="pope", description="Polar Coordinate Positional Embeddings toolkit")
    parser.add_argument("--version", action="version", version=f"pope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            # Only tolerate the area itself being absent, never a broken import inside it.
            if err.name is not None and module_name.startswith(err.name):
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as err:  # user-facing errors: one clear line
        print(f"pope {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

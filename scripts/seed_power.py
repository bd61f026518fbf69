"""How many seeds a side would a sweep need? A planning estimate from the seeds already run:

    PYTHONPATH=src python scripts/seed_power.py RUNS_A RUNS_B [--sizes 5,6,8,10,12] [--alpha 0.05] [--at-best-valid]

RUNS_A and RUNS_B are sweep (or run) directories, as for `pope report`; their finished runs' headline values (the
report's, e.g. test accuracy; with --at-best-valid the metric at the best-validation checkpoint, the report's
other value) are the two samples. For each size N, both samples are topped up to N seeds with
values drawn from their own seeds (pope.eval.stats.resampled_power) and the share of imagined sweeps whose
permutation test reaches p < alpha is printed. It assumes new seeds look like the old ones: a plan, not a result.
An error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from pope.eval.report import collect_run, expand_runs
from pope.eval.stats import resampled_power


def finished_values(path: str, at_best_valid: bool = False) -> tuple[str, list[float]]:
    """(metric, values) of the finished runs under ``path``: the headline value, or the metric at the
    best-validation checkpoint; ValueError when fewer than two, or when they are scored by different metrics."""

    def value(record):
        return record.at_best_valid if at_best_valid else record.value

    records = [r for r in map(collect_run, expand_runs([path])) if r.finished and value(r) is not None]
    if len(records) < 2:
        raise ValueError(f"{path} has {len(records)} finished runs with a value; a resampling plan needs at least 2")
    metrics = sorted({str(r.metric) for r in records})
    if len(metrics) > 1:
        raise ValueError(f"{path} mixes runs scored by {', '.join(metrics)}: give one setting's runs")
    return metrics[0] + (" at best-valid" if at_best_valid else ""), [float(value(r)) for r in records]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_a", help="sweep or run directory of the first setting")
    parser.add_argument("runs_b", help="sweep or run directory of the second setting")
    parser.add_argument(
        "--sizes",
        default="5,6,8,10,12",
        help="seeds a side to plan for, comma-separated (a side already larger keeps its seeds)",
    )
    parser.add_argument("--alpha", type=float, default=0.05, help="the test's level (default 0.05)")
    parser.add_argument(
        "--at-best-valid",
        action="store_true",
        help="use the metric at each run's best-validation checkpoint instead of the headline value",
    )
    parser.add_argument("--simulations", type=int, default=400, help="imagined sweeps per size (default 400)")
    args = parser.parse_args(argv)
    try:
        try:
            sizes = sorted({int(s) for s in args.sizes.split(",")})
        except ValueError:
            raise ValueError(f"--sizes takes comma-separated whole numbers, got {args.sizes!r}") from None
        (metric_a, a), (metric_b, b) = (
            finished_values(path, args.at_best_valid) for path in (args.runs_a, args.runs_b)
        )
        if metric_a != metric_b:
            raise ValueError(
                f"{args.runs_a} is scored by {metric_a}, {args.runs_b} by {metric_b}: compare like with like"
            )
        rows = []
        for size in sizes:
            n_a, n_b = max(size, len(a)), max(size, len(b))
            power = resampled_power(a, b, n_a, n_b, alpha=args.alpha, simulations=args.simulations)
            rows.append(f"| {n_a} | {n_b} | {n_a - len(a) + n_b - len(b)} | {power:.2f} |")
    except (ValueError, OSError) as error:
        print(f"seed_power.py: {error}", file=sys.stderr)
        return 2
    print(f"{metric_a}. A: {args.runs_a}, {len(a)} finished seeds; B: {args.runs_b}, {len(b)} finished seeds.")
    print(
        f"Share of {args.simulations} resampled sweeps whose permutation p < {args.alpha} "
        "(new seeds drawn from each side's own values):\n"
    )
    print("| seeds A | seeds B | new runs | P(p < alpha) |\n|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

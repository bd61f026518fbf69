"""Accuracy-vs-step plot of indirect-indexing runs from their metrics JSONL files.

    python scripts/gpu_train_plot.py results/indirect_indexing/pope-seed0.jsonl \
        results/indirect_indexing/rope-seed0.jsonl --out results/indirect_indexing/accuracy_vs_step.png
Prints the table of test accuracy per evaluation and writes the PNG (test accuracy solid, validation
dashed; the paper's 3-seed means as horizontal lines).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

PAPER = {"pope": 0.9482, "rope": 0.1116}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", nargs="+", help="metrics.jsonl files (named PE-seedN.jsonl)")
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SystemExit("plotting needs matplotlib: pip install 'pope-attention[train]'") from err
    figure, axis = plt.subplots(figsize=(7, 4.2))
    table = {}
    for path in map(Path, args.jsonl):
        label = path.stem
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        evals = [r for r in records if r.get("kind") == "eval"]
        if not evals:
            raise SystemExit(f"{path} has no eval records")
        steps = [r["step"] for r in evals]
        line, = axis.plot(steps, [100 * r["test_accuracy"] for r in evals], marker="o", markersize=3,
                          label=f"{label} test")
        axis.plot(steps, [100 * r["valid_accuracy"] for r in evals], linestyle="--", color=line.get_color(),
                  alpha=0.6, label=f"{label} valid")
        pe = label.split("-")[0]
        if pe in PAPER:
            axis.axhline(100 * PAPER[pe], color=line.get_color(), linestyle=":", linewidth=1,
                         label=f"paper {pe} (3-seed mean)")
        table[label] = {r["step"]: r["test_accuracy"] for r in evals}
    axis.axhline(100 / 52, color="grey", linewidth=0.8, label="chance (1/52)")
    axis.set_xlabel("training step")
    axis.set_ylabel("accuracy on the target letter (%)")
    axis.set_title("Indirect indexing (8 layers, d_model 512), one seed each")
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=130)
    labels = list(table)
    steps = sorted(set().union(*(t.keys() for t in table.values())))
    print("step".rjust(8) + "".join(f"{label:>16}" for label in labels))
    for step in steps:
        print(f"{step:>8}" + "".join(f"{100 * table[l][step]:>15.2f}%" if step in table[l] else " " * 16
                                      for l in labels))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

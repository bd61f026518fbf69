"""Packed vs padded training (train.pack) on the document length distributions of jsb, maestro and text.

For each dataset and mode it builds the trainer twice on the same data and model (train.pack=false: every
piece padded to the longest; train.pack=true: pieces end to end, attention within each), runs --warmup steps
(compilation, CUDA-graph capture happen there), then times --steps steps as the training loop runs them
(train_step + loss accumulation, synchronised at both ends). It reports

- useful tokens/s: scored (non-padding) targets trained per second, the number packing should raise;
- a check, on the device: a packed fp32 forward's logits equal each piece's run alone (max |difference|);
- the padded path's padding fraction over a whole epoch (1 - scored targets / (rows x row width)), which
  depends only on the data and seq_len, not on the device; and a packed step's fill (scored targets /
  batch_size x seq_len, the slots of a padded step).

text is trained as a token stream by the trainer (no pad id); here its train documents are trained one by one
from a temporary copy of the split that names the end-of-text id as the pad id: the case packing is for.
Modes: `default` (the trainer's defaults for each path: on CUDA, compile, and a CUDA graph for the padded path
when it is possible), `eager` (no compile, no graph), `compile` (torch.compile on both; packed: dynamic shapes).
Dropout is set to 0 (--set model.dropout=0 by default): the Triton kernels do not run attention dropout.

    PYTHONPATH=src python benchmarks/packing.py --preset jsb --pe pope,rope --modes default,eager \
        --out benchmarks/results/packing.csv                          # one GPU
    PYTHONPATH=src python benchmarks/packing.py --preset jsb-tiny --steps 3 --warmup 1   # CPU smoke run
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pope.data.prepared import resolve_dataset  # noqa: E402
from pope.data.writer import PreparedWriter  # noqa: E402
from pope.provenance import provenance  # noqa: E402
from pope.train.batches import document_pieces  # noqa: E402
from pope.train.run_config import resolve_run_config  # noqa: E402
from pope.train.trainer import Trainer  # noqa: E402

MODES = {
    "default": [],
    "eager": ["train.compile=false", "train.cuda_graph=false"],
    "compile": ["train.compile=true", "train.cuda_graph=false"],
}
CHECK_TOLERANCE = 1e-3  # fp32 logits of a packed forward vs each piece alone (float rounding is ~1e-6)
TEXT_EOT_ID = 50256  # GPT-2's <|endoftext|>, at the end of every text document


def documents_copy(dataset, directory: Path) -> Path:
    """A dataset without a pad id (text) as a document dataset: its train split, pad id = end-of-text."""
    split = dataset.split("train")
    with PreparedWriter(directory, dataset.vocab_size, splits=("train",)) as writer:
        for begin, end in zip(split.doc_offsets[:-1], split.doc_offsets[1:]):
            writer.add_document("train", np.asarray(split.tokens[begin:end]))
        writer.finish(
            {
                "name": f"{dataset.name}-documents",
                "vocab": {"pad_id": TEXT_EOT_ID},
                "seq_len": 0,
                "request": {"dataset": dataset.name},
                "source": {"description": f"{dataset.path} train"},
                "train_transform": None,
            }
        )
    return directory


def padding_fraction(dataset, seq_len: int) -> dict:
    """The padded path's rows over one epoch of the train split (the trainer's pieces at seq_len): documents,
    pieces, row width and 1 - scored targets / (rows x width). Depends on the data and seq_len only."""
    _, lengths = document_pieces(dataset.split("train"), seq_len, source=str(dataset.path))
    width = max(int(lengths.max()) - 1, 1)
    return {
        "documents": len(dataset.split("train").document_lengths()),
        "pieces": len(lengths),
        "width": width,
        "mean_targets": float((lengths - 1).mean()),
        "padding_fraction": 1 - float((lengths - 1).sum()) / (len(lengths) * width),
    }


@torch.no_grad()
def packed_vs_alone(model, batches, pieces: int = 8) -> float:
    """Largest |logit difference| between a packed fp32 forward over (up to) `pieces` pieces of step 0 and each
    piece run alone: the packed path computes what the padded one does, on this device and backend."""
    inputs, _, packing = batches.get(0)
    bounds = packing["cu_seqlens"][: pieces + 1]
    model.eval()
    try:
        length = int(bounds[-1])
        packed, _ = model(inputs[:, :length], cu_seqlens=bounds.contiguous(), max_seqlen=packing["max_seqlen"])
        alone = torch.cat([model(inputs[:, a:b])[0][0] for a, b in zip(bounds.tolist(), bounds[1:].tolist())])
        return float((packed[0] - alone).abs().max())
    finally:
        model.train()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(data_dir: Path, vocab_size: int, args, pe: str, mode: str, pack: bool) -> dict:
    overrides = [
        f"train.data_dir={data_dir}",
        f"model.vocab_size={vocab_size}",
        "train.eval_splits=",
        "train.tensorboard=false",
        "train.progress=false",
        f"train.pack={str(pack).lower()}",
        f"train.device={args.device}",
        *MODES[mode],
        *args.extra,
    ]
    config = resolve_run_config(args.preset, pe, seed=0, overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, run_dir)
        try:
            device, batches = trainer.device, trainer.data.train
            for step in range(args.warmup):
                trainer.train_step(step)
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            accumulated, times, scored = torch.zeros((), device=device), [], 0
            step = args.warmup
            for _ in range(args.repeats):
                synchronize(device)
                begin = time.perf_counter()
                first = step
                for step in range(first, first + args.steps):
                    accumulated += trainer.train_step(step)
                synchronize(device)
                times.append(time.perf_counter() - begin)
                step += 1
            scored = sum(batches.scored_tokens(s) for s in range(args.warmup, step))
            seconds = sum(times)
            row = {
                "pack": pack,
                "graph": trainer.use_graph,
                "compiled": trainer.compile,
                "ms_per_step": 1000 * statistics.median(times) / args.steps,
                "scored_per_step": scored / (step - args.warmup),
                "useful_tokens_per_s": scored / seconds,
                "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
                "loss_finite": bool(torch.isfinite(accumulated)),
                "device": device,
            }
            if pack:
                row["fill"] = row["scored_per_step"] / (config.recipe.batch_size * config.recipe.seq_len)
                row["check_max_abs_diff"] = packed_vs_alone(trainer.model, batches)
            return row
        finally:
            trainer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--datasets",
        default="jsb,maestro,text",
        help="comma-separated prepared dataset names or directories (`pope data prepare NAME`)",
    )
    parser.add_argument("--preset", default="jsb", help="model size, batch size and seq_len (pope.presets)")
    parser.add_argument("--pe", default="pope", help="comma-separated encodings")
    parser.add_argument("--modes", default="default", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks (ms/step is their median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 4 for a CUDA graph)")
    parser.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=None,
        help="more --set overrides for both paths (default: model.dropout=0)",
    )
    parser.add_argument(
        "--padding-only",
        action="store_true",
        help="print the padded path's padding fraction per dataset at the preset's seq_len, no training",
    )
    parser.add_argument("--out", default=None, help="append the rows with provenance to this CSV")
    args = parser.parse_args()
    if args.padding_only:
        return print_padding(args)
    args.extra = ["model.dropout=0"] if args.extra is None else args.extra
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        parser.error(f"unknown mode in {args.modes!r}; choose from {', '.join(MODES)}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
            dataset = resolve_dataset(name)
            data_dir = dataset.path if dataset.pad_id is not None else documents_copy(dataset, Path(scratch) / name)
            fraction = padding_fraction(
                dataset, resolve_run_config(args.preset, "pope", overrides=["model.vocab_size=2"]).recipe.seq_len
            )["padding_fraction"]
            for pe in [p.strip() for p in args.pe.split(",") if p.strip()]:
                for mode in modes:
                    padded, packed = (
                        measure(data_dir, dataset.vocab_size, args, pe, mode, pack) for pack in (False, True)
                    )
                    padded["padding_fraction"] = fraction
                    for row in (padded, packed):
                        row.update(
                            dataset=dataset.name,
                            pe=pe,
                            mode=mode,
                            speedup=row["useful_tokens_per_s"] / padded["useful_tokens_per_s"],
                        )
                        rows.append(row)
                    print(
                        f"{dataset.name} {pe} {mode}: padded {padded['useful_tokens_per_s']:.0f} tok/s, packed "
                        f"{packed['useful_tokens_per_s']:.0f} tok/s",
                        flush=True,
                    )
    stamp = provenance(rows[0]["device"] if rows else "cpu")
    config = resolve_run_config(args.preset, "pope", overrides=["model.vocab_size=2"])
    print(f"\n{stamp['device']}  torch {stamp['torch']}  triton {stamp['triton']}  commit {stamp['git_commit']}")
    print(
        f"preset {args.preset}: {config.model.n_layer} layers, d_model {config.model.d_model}, {config.model.n_head} "
        f"heads; batch {config.recipe.batch_size} x seq_len {config.recipe.seq_len}; overrides {args.extra}"
    )
    print(
        f"{'dataset':<12}{'pe':<10}{'mode':<9}{'path':<8}{'compile/graph':<15}{'pad frac':>9}{'fill':>6}"
        f"{'scored/step':>12}{'ms/step':>10}{'useful tok/s':>14}{'speedup':>9}{'MiB':>8}"
    )
    for r in rows:
        pad = f"{r['padding_fraction']:.3f}" if "padding_fraction" in r else "0"
        fill = f"{r['fill']:.2f}" if "fill" in r else "-"
        mib = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        print(
            f"{r['dataset']:<12}{r['pe']:<10}{r['mode']:<9}{'packed' if r['pack'] else 'padded':<8}"
            f"{str(r['compiled'])[0]}/{str(r['graph'])[0]:<13}{pad:>9}{fill:>6}{r['scored_per_step']:>12.0f}"
            f"{r['ms_per_step']:>10.2f}{r['useful_tokens_per_s']:>14.0f}{r['speedup']:>8.2f}x{mib:>8}"
        )
    for r in rows:
        if "check_max_abs_diff" in r:
            print(
                f"check {r['dataset']} {r['pe']} {r['mode']}: max |packed - each piece alone| logits (fp32) = "
                f"{r['check_max_abs_diff']:.2e}"
            )
    bad = [r for r in rows if not r["loss_finite"] or r.get("check_max_abs_diff", 0.0) > CHECK_TOLERANCE]
    for r in bad:
        print(
            f"CHECK FAILED: {r['dataset']} {r['pe']} {'packed' if r['pack'] else 'padded'}: non-finite loss or "
            f"packed logits off by more than {CHECK_TOLERANCE}"
        )
    if args.out:
        write_csv(Path(args.out), rows, stamp, args, config)
        plot(Path(args.out).with_suffix(".png"), rows, stamp, args)
    return 1 if bad else 0


def plot(path: Path, rows: list[dict], stamp: dict, args) -> None:
    """Bars of useful tokens/s, padded vs packed, per (dataset, encoding, mode) of this run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r["dataset"], r["pe"], r["mode"]) for r in rows))
    figure, axis = plt.subplots(figsize=(max(5, 1.6 * len(cases)), 3.6))
    for offset, pack in ((-0.2, False), (0.2, True)):
        values = [
            next(
                r["useful_tokens_per_s"] for r in rows if (r["dataset"], r["pe"], r["mode"]) == c and r["pack"] == pack
            )
            for c in cases
        ]
        bars = axis.bar(np.arange(len(cases)) + offset, values, width=0.4, label="packed" if pack else "padded")
        if pack:
            speedups = [
                next(r["speedup"] for r in rows if (r["dataset"], r["pe"], r["mode"]) == c and r["pack"]) for c in cases
            ]
            axis.bar_label(bars, [f"{x:.2f}x" for x in speedups], fontsize=8)
    axis.set_xticks(np.arange(len(cases)), ["\n".join(c) for c in cases], fontsize=8)
    axis.set_ylabel("useful tokens / s")
    axis.set_title(f"train.pack, preset {args.preset}: {stamp['device']} ({stamp['git_commit']})", fontsize=9)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def print_padding(args) -> int:
    seq_len = resolve_run_config(args.preset, "pope", overrides=["model.vocab_size=2"]).recipe.seq_len
    print(f"padded path at seq_len {seq_len} (preset {args.preset}), train split, one epoch")
    print(f"{'dataset':<12}{'documents':>10}{'pieces':>8}{'row width':>10}{'mean targets':>13}{'pad frac':>9}")
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        dataset = resolve_dataset(name)
        r = padding_fraction(dataset, seq_len)
        print(
            f"{dataset.name:<12}{r['documents']:>10}{r['pieces']:>8}{r['width']:>10}{r['mean_targets']:>13.1f}"
            f"{r['padding_fraction']:>9.3f}"
        )
    return 0


def write_csv(path: Path, rows: list[dict], stamp: dict, args, config) -> None:
    columns = [
        "gpu",
        "torch",
        "triton",
        "commit",
        "date",
        "dataset",
        "preset",
        "pe",
        "mode",
        "path",
        "compiled",
        "cuda_graph",
        "batch_size",
        "seq_len",
        "padding_fraction",
        "fill",
        "scored_per_step",
        "ms_per_step",
        "useful_tokens_per_s",
        "speedup_vs_padded",
        "peak_mib",
        "command",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        if new:
            writer.writeheader()
        for r in rows:
            writer.writerow(
                {
                    "gpu": stamp["device"],
                    "torch": stamp["torch"],
                    "triton": stamp["triton"],
                    "commit": stamp["git_commit"],
                    "date": stamp["date_utc"][:16].replace("T", " "),
                    "dataset": r["dataset"],
                    "preset": args.preset,
                    "pe": r["pe"],
                    "mode": r["mode"],
                    "path": "packed" if r["pack"] else "padded",
                    "compiled": r["compiled"],
                    "cuda_graph": r["graph"],
                    "batch_size": config.recipe.batch_size,
                    "seq_len": config.recipe.seq_len,
                    "padding_fraction": round(r.get("padding_fraction", 0.0), 4),
                    "fill": round(r["fill"], 4) if "fill" in r else "",
                    "scored_per_step": round(r["scored_per_step"]),
                    "ms_per_step": round(r["ms_per_step"], 3),
                    "useful_tokens_per_s": round(r["useful_tokens_per_s"]),
                    "speedup_vs_padded": round(r["speedup"], 3),
                    "peak_mib": "" if r["peak_mib"] is None else round(r["peak_mib"]),
                    "command": stamp["command"],
                }
            )
    print(f"appended {len(rows)} rows to {path}")


if __name__ == "__main__":
    sys.exit(main())

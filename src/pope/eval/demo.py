"""The CPU demo behind ``make demo``: RoPE vs PoPE on real music, trained short, evaluated long.

    python -m pope.eval.demo [--out results/demo] [--steps 1200] [--fresh]

1. Data: the Bach chorales prepared by pope.data ("jsb": music21's 4-part chorales, 16th-note raster
   tokens, vocabulary 90, deterministic 229:76:77-proportion split; prepared on first use). For
   training at a short context the train split is read as one token stream (random 64-token windows,
   which may start anywhere in a chorale); evaluation keeps chorale boundaries.
2. Training: the jsb-tiny preset's recipe through pope.train (same trainer as ``pope train``), a
   3-layer, d_model 96, 4-head model at context 64 (16 sixteenth-note steps x 4 voices = one 4/4 bar),
   batch 32, --steps steps, seed 0: RoPE, and PoPE with each of the paper's delta inits (uniform,
   the jsb preset's default; zero, the paper's choice for length extrapolation). Runs live under
   $POPE_CACHE/demo/runs and are resumed, not retrained, by a second invocation (--fresh retrains).
3. Evaluation: ``pope eval length`` on the test split at 1x, 2x, 4x and 8x the training context
   (64, 128, 256, 512 tokens), on the chorales long enough for 512-token windows, so every length
   scores exactly the same tokens (docs/evaluation.md); prints the table, writes length.{csv,md,json,png}
   and demo.md (table + wall time + provenance) to --out.

Whatever the numbers say is what the demo reports; nothing is tuned to make one encoding win. Cost on one
CPU thread (the default, see --threads): about 2 minutes per model (1200 steps) and 15 s of evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pope.data.paths import cache_root
from pope.data.prepared import resolve_dataset
from pope.data.writer import PreparedWriter, reuse_if_prepared
from pope.eval.length_runs import length_table_markdown, run_length_eval, write_length_outputs
from pope.files import check_output_dir, write_text_atomic
from pope.provenance import provenance
from pope.train.run_config import resolve_run_config
from pope.train.trainer import run_training

TRAIN_CONTEXT = 64
EVAL_MULTIPLES = (1, 2, 4, 8)
# label -> PE spec. PoPE twice, with the paper's two delta inits: uniform in [-2π, 0] (its choice for
# JSB and the other in-distribution benchmarks, and the jsb preset's default) and zero (its choice
# for the length-extrapolation experiments). The paper says zero extrapolates best and uniform is
# slightly better in distribution; the demo measures both.
ENCODINGS = {"RoPE": "rope", "PoPE delta=U(-2pi,0)": "pope:delta_init=uniform", "PoPE delta=0": "pope:delta_init=zero"}
MODEL = {"n_layer": 3, "d_model": 96, "n_head": 4}
BATCH_SIZE = 32
DEFAULT_STEPS = 1200


def demo_root() -> Path:
    return cache_root() / "demo"


def chorale_stream_dataset(work_dir: Path):
    """The prepared chorales with the pad id dropped from the manifest, so pope.train samples random
    windows from the train split's token stream instead of padding whole chorales (up to 2048 tokens)
    to one example each. Tokens and document offsets are copied unchanged. Built once, then reused."""
    chorales = resolve_dataset("jsb", prepare_if_missing=True)
    request = {
        "derived_from": str(chorales.path),
        "source_request": chorales.manifest.get("request"),
        "source_sha256": {s: chorales.manifest["splits"][s]["sha256"] for s in chorales.split_names},
        "change": "pad_id removed (train as a token stream)",
    }
    out_dir = work_dir / "jsb-stream"
    existing = reuse_if_prepared(
        out_dir, request, force=(out_dir / "manifest.json").exists() and _request_of(out_dir) != request
    )
    if existing is not None:
        return chorales, existing
    vocab = {k: v for k, v in chorales.manifest["vocab"].items() if k not in ("size", "pad_id")}
    with PreparedWriter(out_dir, chorales.vocab_size, splits=chorales.split_names) as writer:
        for split in chorales.split_names:
            token_split = chorales.split(split)
            for index in range(token_split.n_docs):
                writer.add_document(split, np.asarray(token_split.document(index)))
        stream = writer.finish(
            {
                "name": "jsb-stream",
                "vocab": vocab,
                "request": request,
                "source": {"description": f"{chorales.path} with pad_id removed"},
            }
        )
    return chorales, stream


def _request_of(path: Path):
    try:
        return json.loads((path / "manifest.json").read_text()).get("request")
    except (OSError, ValueError):
        return None


def demo_run_config(pe: str, *, steps: int, data_dir: Path) -> dict:
    overrides = [f"model.{key}={value}" for key, value in MODEL.items()] + [
        f"model.max_seq_len={TRAIN_CONTEXT}",
        f"recipe.seq_len={TRAIN_CONTEXT}",
        f"recipe.batch_size={BATCH_SIZE}",
        f"recipe.max_steps={steps}",
        f"recipe.warmup_steps={min(50, steps)}",
        f"recipe.eval_interval={steps}",
        "recipe.eval_batches=16",
        f"train.data_dir={data_dir}",
        "train.device=cpu",
        "train.tensorboard=false",
        "train.eval_splits=valid",
        f"train.checkpoint_interval={max(1, min(200, steps))}",
        "train.log_interval=50",
    ]
    return resolve_run_config("jsb-tiny", pe, seed=0, overrides=overrides)


def train_demo_run(pe: str, run_dir: Path, *, steps: int, data_dir: Path) -> dict:
    config = demo_run_config(pe, steps=steps, data_dir=data_dir)
    if (run_dir / "config.json").exists() and not (run_dir / "checkpoints" / "last").exists():
        # the demo's own cache directory, interrupted before its first checkpoint: nothing to continue
        print(f"[demo] {pe}: {run_dir} stopped before its first checkpoint; training it again", flush=True)
        shutil.rmtree(run_dir)
    resume = (run_dir / "config.json").exists()
    if resume:
        print(f"[demo] {pe}: continuing/reusing {run_dir} (pass --fresh to retrain)", flush=True)
    try:
        return run_training(config, run_dir, resume=resume)
    except ValueError as err:
        if "resume refused" in str(err):
            raise ValueError(
                f"{run_dir} holds a demo run made with other settings; rerun with --fresh\n{err}"
            ) from None
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pope.eval.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/demo", help="where the table and plot go (default results/demo)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"training steps per model ({DEFAULT_STEPS})")
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo runs and retrain")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: tiny models gain little from a second thread, and two "
        "threads slow down badly when another process competes for the cores)",
    )
    parser.add_argument(
        "--max-docs",
        type=int,
        default=None,
        help="evaluate on the first N qualifying test chorales only (default: all; for quick checks)",
    )
    parser.add_argument(
        "--work", default=None, help="directory for the demo's runs and derived data (default $POPE_CACHE/demo)"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be positive")
    if args.threads < 1:
        parser.error("--threads must be positive")
    try:  # before minutes of training: the table, the plot and the runs can be written where asked
        check_output_dir(args.out)
        check_output_dir(args.work or demo_root(), what="--work" if args.work else "the demo's work directory")
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    load_before = _load_average()
    print("[demo] 1/3 data: Bach chorales (music21 corpus, prepared by pope.data)", flush=True)
    work_dir = Path(args.work) if args.work else demo_root()
    chorales, stream = chorale_stream_dataset(work_dir)
    test = chorales.split("test")
    print(
        f"[demo]     {chorales.path}: train {len(chorales.split('train')):,} tokens, test {len(test):,} tokens "
        f"in {test.n_docs} chorales",
        flush=True,
    )

    runs = {}
    for index, (label, pe) in enumerate(ENCODINGS.items()):
        run_dir = work_dir / "runs" / pe.replace(":", "-").replace("=", "-").replace(",", "-")
        if args.fresh and run_dir.exists():
            shutil.rmtree(run_dir)
        print(
            f"[demo] 2/3 training {pe} ({index + 1}/{len(ENCODINGS)}): {MODEL['n_layer']} layers, d_model "
            f"{MODEL['d_model']}, {MODEL['n_head']} heads, context {TRAIN_CONTEXT}, batch {BATCH_SIZE}, "
            f"{args.steps} steps",
            flush=True,
        )
        train_demo_run(pe, run_dir, steps=args.steps, data_dir=stream.path)
        runs[label] = run_dir
    trained = time.perf_counter()

    lengths = [TRAIN_CONTEXT * m for m in EVAL_MULTIPLES]
    print(f"[demo] 3/3 evaluating on the test chorales at {', '.join(map(str, lengths))} tokens", flush=True)
    out_dir = Path(args.out)
    entries = run_length_eval(
        [str(runs[label]) for label in ENCODINGS],
        str(chorales.path),
        lengths=lengths,
        split="test",
        out_dir=None,
        device="cpu",
        batch_size=8,
        max_docs=args.max_docs,
    )
    for entry, label in zip(entries, ENCODINGS):
        entry.label = label
    table = length_table_markdown(entries)
    wall = time.perf_counter() - started
    verdict = _verdict(entries)
    stamp = provenance("cpu")
    write_length_outputs(entries, out_dir, title="Bach chorales (test), trained at 64 tokens", provenance_stamp=stamp)
    summary = (
        f"# make demo: RoPE vs PoPE on Bach chorales, trained at {TRAIN_CONTEXT} tokens, "
        f"{args.steps} steps, seed 0\n\n{table}\n"
        f"{verdict}\n\nWall time: {wall:.0f} s in total ({trained - started:.0f} s data + training, "
        f"{wall - (trained - started):.0f} s evaluation); machine load average {load_before} at the start, "
        f"{_load_average()} at the end (other processes slow the demo down).\nPlot: {out_dir / 'length.png'}\n\n"
        + ", ".join(f"{k}: {stamp[k]}" for k in ("git_commit", "torch", "device", "date_utc", "command"))
        + "\n"
    )
    write_text_atomic(out_dir / "demo.md", summary)
    print()
    print(summary)
    return 0


def _load_average() -> str:
    try:
        return "/".join(f"{value:.1f}" for value in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"


def _verdict(entries) -> str:
    """Per length: each model's NLL and its difference to RoPE, read from the numbers."""
    rope = next(entry for entry in entries if entry.pe == "rope")
    lines = []
    for index, result in enumerate(rope.results):
        parts = [f"RoPE {result.mean_nll:.4f}"]
        for entry in entries:
            if entry is not rope:
                other = entry.results[index].mean_nll
                parts.append(f"{entry.label} {other:.4f} ({other - result.mean_nll:+.4f} vs RoPE)")
        lines.append(f"- L={result.length} ({result.length // TRAIN_CONTEXT}x): " + ", ".join(parts))
    return "Mean NLL in nats/token on the same test tokens at every length (negative = lower than RoPE):\n" + "\n".join(
        lines
    )


if __name__ == "__main__":
    sys.exit(main())

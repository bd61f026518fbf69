"""End-to-end training-step throughput: GPT-2 124M (preset owt-124m), PoPE through the fused Triton
kernels vs RoPE through SDPA. Batch 8 x 1024 tokens, bf16 autocast, torch.compile, fused AdamW.

Target (issue 5): PoPE tokens/s >= 0.9 x RoPE tokens/s. Each model is compiled first (warm-up steps are not
timed); the timed steps run back to back, timed with CUDA events. In the default mode PoPE's step waits on the
host when the host is slow (its operators' launchers are Python), so its ratio moves with the machine;
--compile-mode reduce-overhead replays CUDA graphs instead, taking the host out. --profile writes each model's top
GPU kernels.

What torch.compile made of each model is counted, because a graph break or a recompile can cost a step half its
speed: the graphs dynamo compiled over the warm-up and timed steps, its graph breaks and its recompiles
(torch._dynamo.utils counters and guard failures), and torch._dynamo.explain's graphs and breaks of one forward
pass, with the reasons. Dynamo's break counter misses breaks that skip a frame instead of splitting it, so the
graph counts are the check: a model is one graph, and any other count is printed as a warning with the reasons.

    PYTHONPATH=src python benchmarks/train_step_owt.py [--steps 20] [--out benchmarks/results]
Appends to OUT/train_step_owt.csv with GPU, versions, commit and date.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_io import append_csv, provenance  # noqa: E402  (same directory: shared provenance/CSV helpers)

SPECS = {"rope (sdpa)": "rope", "pope (triton)": "pope:backend=triton"}


def reset_dynamo() -> None:
    """Forget every compiled graph and zero dynamo's counters (graphs, breaks, recompiles)."""
    from torch._dynamo import utils

    torch._dynamo.reset()
    utils.counters.clear()
    utils.guard_failures.clear()


def dynamo_counts() -> dict:
    """What dynamo compiled since `reset_dynamo`: {"graphs", "graph_breaks", "recompiles"}. A recompile is a
    guard that failed on a compiled frame (its reasons are in torch._dynamo.utils.guard_failures)."""
    from torch._dynamo import utils

    return {
        "graphs": utils.counters["stats"]["unique_graphs"],
        "graph_breaks": sum(utils.counters["graph_break"].values()),
        "recompiles": sum(len(reasons) for reasons in utils.guard_failures.values()),
    }


def explain_counts(model, *inputs) -> dict:
    """torch._dynamo.explain of one forward pass: {"explain_graphs", "explain_breaks", "break_reasons"} (the
    reasons as text). Dynamo is reset afterwards, so the counts of a later torch.compile start from zero."""
    reset_dynamo()
    explanation = torch._dynamo.explain(model)(*inputs)
    reasons = [str(getattr(reason, "reason", reason)).splitlines()[0] for reason in explanation.break_reasons]
    reset_dynamo()
    return {
        "explain_graphs": explanation.graph_count,
        "explain_breaks": explanation.graph_break_count,
        "break_reasons": reasons,
    }


def graph_warning(counts: dict) -> str | None:
    """One line when the model is not one graph without breaks and recompiles (dynamo's or explain's count)."""
    clean = (counts["graphs"], counts["graph_breaks"], counts["recompiles"]) == (1, 0, 0) and (
        counts["explain_graphs"],
        counts["explain_breaks"],
    ) == (1, 0)
    if clean:
        return None
    reasons = "; ".join(counts["break_reasons"]) or "none given"
    return (
        f"not one graph: {counts['graphs']} graphs, {counts['graph_breaks']} counted breaks, "
        f"{counts['recompiles']} recompiles; explain: {counts['explain_graphs']} graphs, "
        f"{counts['explain_breaks']} breaks (reasons: {reasons})"
    )


def build_train_step(pe: str, *, batch: int, seq_len: int, compile_mode: str = "default"):
    """(train_step, cleanup, explained): one compiled GPT-2 124M training step on random tokens (not yet run: the
    first calls compile), a function that frees the model, and explain_counts of its forward pass. Dynamo is
    reset before compiling, so dynamo_counts() afterwards counts this model alone."""
    from pope.model import GPT
    from pope.presets import get_preset

    config = get_preset("owt-124m").model_config(pe=pe)
    torch.manual_seed(0)
    model = GPT(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), device="cuda")
    targets = torch.randint(0, config.vocab_size, (batch, seq_len), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        explained = explain_counts(model, idx, targets)
    compiled = torch.compile(model, mode=compile_mode)
    graphs = compile_mode == "reduce-overhead"  # CUDA-graph trees: each step replays recorded graphs

    def train_step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = compiled(idx, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def cleanup():
        nonlocal model, optimizer, compiled
        del model, optimizer, compiled
        torch.cuda.empty_cache()

    return train_step, cleanup, explained


def time_steps(train_step, steps: int):
    """(ms per step, last loss): `steps` steps back to back, timed with CUDA events (no sync in between)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = train_step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps, loss


def step_time(
    pe: str,
    *,
    batch: int,
    seq_len: int,
    steps: int,
    warmup: int,
    compile_mode: str = "default",
    profile_path: str | None = None,
) -> dict:
    train_step, cleanup, explained = build_train_step(pe, batch=batch, seq_len=seq_len, compile_mode=compile_mode)
    for _ in range(warmup):
        train_step()
    ms, loss = time_steps(train_step, steps)
    counts = {**dynamo_counts(), **explained}  # before the profile, whose steps are not the timed ones
    if profile_path is not None:  # after the timed steps: the profiler's own overhead is not in ms
        write_profile(train_step, profile_path)
    cleanup()
    return {
        "pe": pe,
        "ms_per_step": ms,
        "tokens_per_s": batch * seq_len / ms * 1e3,
        "loss": float(loss.detach()),
        **counts,
    }


def write_profile(train_step, path: str, steps: int = 3, rows: int = 30) -> None:
    """GPU time per kernel over `steps` steps (torch.profiler), the top `rows` by total GPU time, to path."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train_step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)
    with open(path, "w") as f:
        f.write(f"{steps} steps, sorted by total GPU time\n{table}\n")
    print(f"profile written to {path}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=["default", "reduce-overhead"],
        help="torch.compile mode; reduce-overhead replays CUDA graphs (CUDA-graph trees), taking the "
        "host (PoPE's Python autograd backward, launch overhead) out of the step time",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write each model's top GPU kernels over 3 steps to OUT/train_step_profile_<pe>.txt",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/train_step_owt.py needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for label, pe in SPECS.items():
        if args.compile_mode != "default":
            label = f"{label} [{args.compile_mode}]"
        row = {
            "model": label,
            **step_time(
                pe,
                batch=args.batch,
                seq_len=args.seq_len,
                steps=args.steps,
                warmup=args.warmup,
                compile_mode=args.compile_mode,
                profile_path=os.path.join(args.out, f"train_step_profile_{pe.split(':')[0]}.txt")
                if args.profile
                else None,
            ),
        }
        warning = graph_warning(row)
        row["break_reasons"] = " | ".join(row["break_reasons"])
        rows.append(row)
        print(
            f"{label:>26}: {row['ms_per_step']:.2f} ms/step, {row['tokens_per_s']:.0f} tokens/s, "
            f"graphs {row['graphs']}, graph breaks {row['graph_breaks']}, recompiles {row['recompiles']}, "
            f"loss {row['loss']:.3f}" + (f"\n{'':>26}  WARNING {warning}" if warning else ""),
            flush=True,
        )
    ratio = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    for row in rows:
        row["pope_over_rope"] = ratio
    append_csv(os.path.join(args.out, "train_step_owt.csv"), rows, provenance())
    print(f"PoPE/RoPE tokens/s = {ratio:.3f} ({'MET' if ratio >= 0.9 else 'MISSED'} target >= 0.9)")


if __name__ == "__main__":
    main()

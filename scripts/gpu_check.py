"""The GPU check: is PoPE correct, and is it still as fast as it was? One command, one NVIDIA GPU, about 7 minutes.

    python scripts/gpu_check.py [--out benchmarks/results] [--sections correctness,attention,gpt2,hf]
    python scripts/gpu_check.py --sections all      # also each preset's model (about 3 more minutes)
    python scripts/gpu_check.py --update-readme     # README's performance table from the CSV's latest run

Correctness, against float64 by the kernel tests' rule (the kernels' error at most 2x what plain PyTorch makes in the
same dtype, every output and gradient, fresh random inputs): the fused kernels forward + backward (bf16, fp16, fp32;
MHA, GQA, head dim 64 and 128, positions past 10^6), decode (one query against a long cache), varlen (packed
sequences), and the Hugging Face PoPE Llama (logits and every parameter gradient). Also: PoPE's compiled GPT is one
graph with no break and no recompile, as RoPE's is.

Speed, each ratio PoPE's over a baseline's timed side by side in one process: attention forward and forward +
backward at the standard shapes against SDPA without a positional encoding and against a compiled RoPE + SDPA; the
GPT-2 124M training step against RoPE's in both torch.compile modes; the Hugging Face PoPE Llama step against
Llama's; with --sections all (or presets), each preset's model against RoPE's, which compiles eight more models.
Each section runs in a process of its own: in one process, the earlier sections' state slowed the host side of a
later compiled PoPE step (GPT-2, default mode: 0.33x instead of 0.77x).

Every value is compared with benchmarks/gpu_check_thresholds.csv: its target (what we aim for) and its baseline (what
the check read when the thresholds were last set) with a tolerance. A value worse than baseline by more than the
tolerance is REGRESSED; a correctness failure is FAIL; either makes the exit status 1. Rows are appended to
OUT/gpu_check.csv with the GPU, library versions, commit, date and command. --smoke runs tiny shapes on the CPU
(kernels under TRITON_INTERPRET=1): it checks this script, and its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

import torch
from gpu_check_parts import correctness, speed

ROOT = Path(__file__).resolve().parent.parent
THRESHOLDS = ROOT / "benchmarks" / "gpu_check_thresholds.csv"
README = ROOT / "README.md"
README_BEGIN, README_END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"
SECTIONS = ("correctness", "attention", "gpt2", "presets", "hf")
# What a plain run checks: everything but "presets", whose eight compiled models would take the check past 8 minutes.
DEFAULT_SECTIONS = ("correctness", "attention", "gpt2", "hf")
CSV_FIELDS = ("run", "date_utc", "gpu", "torch", "triton", "cuda", "commit", "command", "section", "check", "value",
              "unit", "target", "baseline", "status")  # fmt: skip


# ---------------------------------------------------------------- thresholds and verdicts


def read_thresholds(path: Path = THRESHOLDS) -> dict:
    """check -> {better: higher|lower, target, baseline, tolerance, readme label}; floats or None where empty."""
    table = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            if row["better"] not in ("higher", "lower"):
                raise ValueError(f"{path}: check {row['check']!r} has better={row['better']!r}; use higher or lower")
            table[row["check"]] = {
                "better": row["better"],
                **{key: float(row[key]) if row[key] else None for key in ("target", "baseline", "tolerance")},
                "readme": row.get("readme", ""),
            }
    return table


def verdict(value: float | None, threshold: dict | None) -> str:
    """PASS, REGRESSED (worse than baseline beyond its tolerance), NEW (no baseline yet) or ERROR (no value)."""
    if value is None or not math.isfinite(value):
        return "ERROR"
    if threshold is None or threshold["baseline"] is None:
        return "NEW"
    allowed = threshold["baseline"] * (threshold["tolerance"] or 0.0)
    if threshold["better"] == "higher":
        return "PASS" if value >= threshold["baseline"] - allowed else "REGRESSED"
    return "PASS" if value <= threshold["baseline"] + allowed else "REGRESSED"


def target_met(value: float | None, threshold: dict | None) -> str:
    if value is None or threshold is None or threshold["target"] is None:
        return ""
    met = value >= threshold["target"] if threshold["better"] == "higher" else value <= threshold["target"]
    return "met" if met else "missed"


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def latest_rows(path: Path) -> list[dict]:
    """Each check's latest measured row in a gpu_check.csv (in the order checks were first measured): what the
    README's table shows."""
    rows = [row for row in read_rows(path) if row["value"]]
    if not rows:
        raise ValueError(f"{path} holds no measured rows: run python scripts/gpu_check.py first")
    latest = {}
    for row in rows:
        latest.setdefault(row["check"], row)
        latest[row["check"]] = row
    return list(latest.values())


def readme_table(rows: list[dict], thresholds: dict) -> str:
    """The README's performance section: the rows whose threshold has a readme label, with their provenance."""
    shown = [row for row in rows if thresholds.get(row["check"], {}).get("readme")]
    machines = sorted({(row["gpu"], row["torch"], row["triton"]) for row in shown})
    measured = "; ".join(
        f"one {gpu} (torch {torch_version}, triton {triton})" for gpu, torch_version, triton in machines
    )
    lines = [
        f"Measured by `python scripts/gpu_check.py` on {measured}, bf16, causal; each row's commit, date and command "
        "are in [benchmarks/results/gpu_check.csv](benchmarks/results/gpu_check.csv).",
        "",
        "| measurement | PoPE / baseline | target |",
        "|---|---|---|",
    ]
    for row in shown:
        threshold = thresholds[row["check"]]
        bound = "≥" if threshold["better"] == "higher" else "≤"
        value = float(row["value"])
        # three significant digits and the verdict spelled out: 0.947 must not read as meeting 0.95
        target = (
            f"{bound} {threshold['target']:g}×, {target_met(value, threshold)}"
            if threshold["target"] is not None
            else ""
        )
        lines.append(f"| {threshold['readme']} | {value:.3g}× | {target} |")
    return "\n".join(lines)


def update_readme(csv_path: Path, readme: Path = README) -> None:
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{readme} has no {README_BEGIN} ... {README_END} section to fill; add the two markers")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    table = readme_table(latest_rows(csv_path), read_thresholds())
    readme.write_text(f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}")
    print(f"updated the performance table in {readme} from {csv_path}")


# ---------------------------------------------------------------- measurement helpers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def bench_ms(fn, *, smoke: bool, cuda_graph: bool = False, rep_ms: int = 100, grad_to_none=None) -> float:
    """Median milliseconds of fn(): triton.testing.do_bench (CUDA events, warm-up, repeats for about rep_ms) on a GPU;
    with cuda_graph, of fn's launches captured in a CUDA graph and replayed (GPU time without the host's). A step of
    tens of milliseconds needs rep_ms in seconds: at 100 ms its median is of two or three runs. The tensors in
    grad_to_none get .grad = None before every call, as a training step's zero_grad(set_to_none=True) leaves them:
    a backward then writes fresh gradients instead of adding into old ones (an extra pass over each)."""
    if DEVICE == "cuda":
        import triton.testing

        if cuda_graph:
            return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median")
        return triton.testing.do_bench(
            fn, warmup=max(25, rep_ms // 4), rep=rep_ms, grad_to_none=grad_to_none, return_mode="median"
        )
    fn()
    times = []
    for _ in range(2 if smoke else 5):
        for tensor in grad_to_none or ():
            tensor.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def free_memory() -> None:
    import gc

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- the checks (each yields (check, value, unit))

MEASUREMENTS = {
    "correctness": correctness.rows,
    "attention": speed.attention_rows,
    "gpt2": speed.gpt2_rows,
    "presets": speed.preset_rows,
    "hf": speed.hf_rows,
}


def provenance(run: str | None) -> dict:
    from pope.provenance import command_line, commit_label, device_name, library_versions

    versions = library_versions()
    return {
        "run": run or uuid.uuid4().hex[:12],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": device_name(DEVICE),
        "torch": versions["torch"],
        "triton": versions["triton"] or "",
        "cuda": torch.version.cuda or "",
        "commit": commit_label() or "unknown",
        "command": command_line(),
    }


def run_sections(sections: list[str], smoke: bool, out: Path, thresholds: dict, run: str | None = None) -> list[dict]:
    """Run each section, writing each row to OUT/gpu_check.csv as it comes (a killed run keeps what it measured)."""
    stamp = provenance(run)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check.csv"
    new_file = not path.exists()
    rows = []
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new_file:
            writer.writeheader()
        for section in sections:
            print(f"== {section}", flush=True)
            started = time.perf_counter()
            try:
                for check, value, unit in MEASUREMENTS[section](bench_ms=bench_ms, smoke=smoke, device=DEVICE):
                    rows.append(record(writer, f, stamp, section, check, value, unit, thresholds))
            except Exception as error:  # one broken section must not hide the others' results
                traceback.print_exc()
                rows.append(record(writer, f, stamp, section, f"{section}: {type(error).__name__}", None, "", {}))
            free_memory()
            print(f"   ({time.perf_counter() - started:.0f} s)", flush=True)
    return rows


def record(writer, f, stamp: dict, section: str, check: str, value, unit: str, thresholds: dict) -> dict:
    threshold = thresholds.get(check)
    if section == "correctness":  # value: worst error over what the rule allows (<= 1 passes), or a pass flag
        status = "ERROR" if value is None else ("PASS" if value <= 1.0 else "FAIL")
    else:
        status = verdict(value, threshold)
    row = {
        **stamp,
        "section": section,
        "check": check,
        "value": "" if value is None else f"{value:.4g}",
        "unit": unit,
        "target": "" if not threshold or threshold["target"] is None else f"{threshold['target']:g}",
        "baseline": "" if not threshold or threshold["baseline"] is None else f"{threshold['baseline']:g}",
        "status": status,
    }
    writer.writerow(row)
    f.flush()
    met = target_met(value, threshold)
    print(f"   {status:<9} {check:<62} {row['value']:>9} {unit:<12} {('target ' + met) if met else ''}", flush=True)
    return row


def print_table(rows: list[dict], thresholds: dict) -> None:
    print(f"\n{'status':<9} {'check':<62} {'value':>9}  {'baseline':>8}  {'target':>7}")
    for row in rows:
        met = target_met(float(row["value"]) if row["value"] else None, thresholds.get(row["check"]))
        print(
            f"{row['status']:<9} {row['check']:<62} {row['value']:>9}  {row['baseline']:>8}  {row['target']:>7} {met}"
        )
    counts = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "NEW", "REGRESSED", "FAIL", "ERROR")}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n))


def parse_sections(text: str) -> list[str]:
    """The sections a --sections value names, in the check's order: "all" for every one; ValueError otherwise."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(SECTIONS)
    choices = f"choose from {', '.join(SECTIONS)}, or all alone"
    if not names:
        raise ValueError(f"--sections {text!r} names no section; {choices}")
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)} in --sections {text!r}; {choices}")
    return [name for name in SECTIONS if name in names]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where gpu_check.csv grows")
    parser.add_argument(
        "--sections",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated subset of {', '.join(SECTIONS)}, or all (default: {','.join(DEFAULT_SECTIONS)})",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script, not PoPE")
    parser.add_argument(
        "--run",
        help="run id of the rows (several invocations, e.g. --sections split over short jobs, may share one); "
        "default: a new id",
    )
    parser.add_argument("--update-readme", action="store_true", help="fill README's table from OUT/gpu_check.csv")
    args = parser.parse_args(argv)
    if args.update_readme:
        update_readme(args.out / "gpu_check.csv")
        return 0
    try:
        sections = parse_sections(args.sections)
    except ValueError as error:
        parser.error(str(error))
    if DEVICE != "cuda" and not args.smoke:
        raise SystemExit("scripts/gpu_check.py needs an NVIDIA GPU (torch.cuda.is_available() is False); "
                         "--smoke runs it on the CPU to test the script")  # fmt: skip
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the kernels through Triton's interpreter: set TRITON_INTERPRET=1")
    thresholds = read_thresholds()
    started = time.perf_counter()
    if len(sections) > 1:  # each section in a process of its own: one section's state cannot slow another's timing
        run = args.run or uuid.uuid4().hex[:12]
        for section in sections:
            command = [sys.executable, __file__, "--sections", section, "--out", str(args.out), "--run", run]
            subprocess.run(command + (["--smoke"] if args.smoke else []), check=False)
        rows = [row for row in read_rows(args.out / "gpu_check.csv") if row["run"] == run]
        missing = {s for s in sections if not any(row["section"] == s for row in rows)}
        for section in sorted(missing):  # a process that died before its first row (killed, out of memory)
            rows.append({"section": section, "check": f"{section}: no row written", "value": "", "baseline": "",
                         "target": "", "status": "ERROR"})  # fmt: skip
    else:
        with contextlib.ExitStack() as stack:
            if args.smoke:
                stack.enter_context(correctness.kernels_on_cpu())
            rows = run_sections(sections, args.smoke, args.out, thresholds, args.run)
    print_table(rows, thresholds)
    print(f"{time.perf_counter() - started:.0f} s; rows appended to {args.out / 'gpu_check.csv'}")
    return 1 if any(r["status"] in ("REGRESSED", "FAIL", "ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

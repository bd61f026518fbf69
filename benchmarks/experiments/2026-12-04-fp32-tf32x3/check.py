"""Could the exact fp32 path run on tensor cores? PoPE's kernels with fp32 inputs under "highest" use exact fp32 dots
(input_precision="ieee", FMA units): on an H200 fwd+bwd took 25-33x fp32 SDPA's time (2026-12-04, ../2026-12-02-
tf32-check/). This runs the same kernels with "tf32x3" dots instead (each product split into TF32 high and low parts,
three tensor-core products, fp32 sums) and reports (1) the error against float64 beside plain PyTorch fp32's (the 2x
rule, scripts/gpu_kernel_check.py's correctness check at fp32) and (2) fwd+bwd time beside fp32 SDPA and the "ieee"
kernels (../2026-12-02-tf32-check/speed.py's timing).

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/check.py             # on a GPU, ~3 min
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/check.py --smoke

--smoke runs one tiny shape through the interpreter (which multiplies tf32x3 operands exactly: it checks the script,
not the precision) and skips the timing. Prints one row per (shape, tensor) and one per (shape, provider), then a
verdict line. The kernels' dot precision is swapped by replacing pope.kernels.host.precision before anything
compiles; nothing in the package changes.
"""
import argparse
import sys
from pathlib import Path

import torch

import pope.kernels.host as host
from pope.testing import load_kernels as load  # a module from its file, under a name of ours

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SHAPES = [(1, 2, 2, 1024, 1024, 64, True), (2, 8, 2, 1000, 1000, 128, True), (4, 16, 4, 1, 3000, 128, True)]
SMOKE_SHAPES = [(1, 2, 1, 37, 37, 32, True)]
TIMED = ["4x16x4096x64", "2x16x4096x128"]  # B x H x N x d


PACKAGE_PRECISION = host.precision


def use_fp32_dots(kind: str) -> None:
    """fp32 inputs under "highest" get `kind` dots ("ieee" or "tf32x3"); everything else as the package chooses."""
    def precision(dtype, device):
        chosen = PACKAGE_PRECISION(dtype, device)
        return kind if chosen in ("ieee", "tf32x3") and torch.get_float32_matmul_precision() == "highest" else chosen
    host.precision = precision


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny shape, no timing (the interpreter on CPU)")
    args = parser.parse_args()
    kernel_check = load(str(ROOT / "scripts" / "gpu_kernel_check.py"), "gpu_kernel_check")
    torch.set_float32_matmul_precision("highest")
    use_fp32_dots("tf32x3")
    failed = 0
    print("shape (B, Hq, Hkv, Nq, Nk, d, causal) | tensor | tf32x3 kernels' max error | PyTorch fp32's | within 2x")
    for shape in SMOKE_SHAPES if args.smoke else SHAPES:
        result = kernel_check.check_correctness(shape, "fp32")
        for name in kernel_check.GRADIENT_NAMES:
            row = result[name]
            print(f"{shape} | {name} | {row['kernel']:.3g} | {row['reference']:.3g} | {row['ok']}")
        failed += not result["passed"]
    if not args.smoke:
        if not torch.cuda.is_available():
            print("check.py: the timing needs a CUDA GPU (or pass --smoke)", file=sys.stderr)
            return 2
        speed = load(str(ROOT / "benchmarks" / "experiments" / "2026-12-02-tf32-check" / "speed.py"), "tf32_speed")
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        print("shape | provider | fwd+bwd ms | / sdpa fp32")
        for shape in TIMED:
            times = {"sdpa fp32": speed.fwd_bwd_ms(shape, "sdpa fp32")}
            use_fp32_dots("ieee")
            times["pope fp32 ieee"] = speed.fwd_bwd_ms(shape, "pope fp32 exact")
            use_fp32_dots("tf32x3")
            times["pope fp32 tf32x3"] = speed.fwd_bwd_ms(shape, "pope fp32 exact")
            for provider, ms in times.items():
                print(f"{shape} | {provider} | {ms:.3f} | {ms / times['sdpa fp32']:.2f}")
    print("verdict: " + (f"{failed} shape(s) outside 2x" if failed else "tf32x3 within 2x of PyTorch fp32 at every shape"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Does Triton 3.6's automatic Hopper warp specialisation engage on the backward kernels written as one tagged loop?
Compile-only, for sm_90a (no GPU needed): per (kernel, head dim, tile, keys source, tagged) one JSON line with
whether the TTGIR has ttg.warp_specialize, the partitions' requested registers, the warps the kernel ends with,
setmaxnreg in the PTX, ptxas's registers and spills, spill instructions in / outside loops (SASS), shared memory,
programs per SM, wgmma and atomic instructions, or the compile error (e.g. the pass crashing).

Argument types as the shipped launcher passes them (scripts/kernel_registers.py: TMA descriptor block shapes,
16-byte aligned pointers and strides, batched: the packed-batch arguments and the dq' accumulator None).

    PYTHONPATH=src python benchmarks/experiments/2026-12-01-bwd-autows/compile_study.py [--quick] [--out F.jsonl]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, os.pardir, os.pardir, os.pardir)
sys.path[:0] = [HERE, os.path.join(ROOT, "scripts")]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import autows_bwd  # noqa: E402
import kernel_registers  # noqa: E402
from pope.kernels import bwd  # noqa: E402

FLAGS = {"dq": dict(CAUSAL=True, HAS_DELTA=True, MAGNITUDE=0, PRECISION="tf32"),
         "dkdv": dict(CAUSAL=True, MAGNITUDE=0, PRECISION="tf32")}
KERNELS = {("dq", "shipped"): bwd._pope_bwd_dq_kernel, ("dkdv", "shipped"): bwd._pope_bwd_dkdv_kernel,
           ("dq", "one-loop"): autows_bwd._autows_dq_kernel, ("dkdv", "one-loop"): autows_bwd._autows_dkdv_kernel}
SHIPPED = {("dq", 64): (64, 64, 4, 3), ("dq", 128): (128, 32, 8, 3),
           ("dkdv", 64): (64, 64, 4, 3), ("dkdv", 128): (64, 64, 8, 3)}
# (kernel, d, tile, keys from the pre-pass (dk/dv; None: as the launcher decides), form, tagged)
QUICK = [("dq", 64, (64, 64, 4, 3), None, "one-loop", True), ("dq", 64, (64, 64, 8, 3), None, "one-loop", True),
         ("dkdv", 64, (64, 64, 4, 3), None, "one-loop", True)]
FULL = (
    [(kind, d, SHIPPED[kind, d], None, "shipped", False) for kind in ("dq", "dkdv") for d in (64, 128)]
    + [("dkdv", 128, (64, 64, 8, 3), True, "shipped", False)]
    + [("dq", 64, tile, None, "one-loop", tagged) for tile, tagged in
       [((64, 64, 4, 3), False), ((64, 64, 4, 3), True), ((64, 64, 4, 2), True), ((128, 64, 4, 2), True),
        ((128, 32, 4, 2), True), ((64, 64, 8, 3), True)]]
    + [("dq", 128, tile, None, "one-loop", tagged) for tile, tagged in
       [((128, 32, 8, 3), False), ((128, 32, 8, 3), True), ((64, 32, 4, 2), True), ((64, 64, 4, 2), True),
        ((128, 32, 4, 2), True), ((128, 64, 4, 2), True)]]
    + [("dkdv", 64, tile, None, "one-loop", tagged) for tile, tagged in
       [((64, 64, 4, 3), False), ((64, 64, 4, 3), True), ((64, 64, 4, 2), True), ((64, 128, 4, 2), True),
        ((64, 64, 8, 3), True)]]
    + [("dkdv", 128, tile, keys, "one-loop", tagged) for tile, keys, tagged in
       [((64, 64, 8, 3), None, False), ((64, 64, 8, 3), None, True), ((64, 64, 4, 2), None, True),
        ((64, 64, 4, 2), True, True), ((64, 128, 4, 2), None, True), ((64, 128, 4, 2), True, True),
        ((32, 128, 4, 2), True, True), ((64, 64, 4, 3), True, True), ((32, 64, 4, 2), True, True)]])


def compile_one(kind: str, head_dim: int, tile: tuple, keys_from_prepass, form: str, tagged: bool,
                extra: dict | None = None) -> dict:
    kernel = KERNELS[kind, form]
    block_m, block_n, num_warps, num_stages = tile
    constexprs = kernel_registers.constexprs_for(kind, kernel, FLAGS[kind], head_dim, block_m, block_n, num_stages,
                                                 False, keys_from_prepass)
    if "DQAcc" in kernel.arg_names:
        constexprs["DQAcc"] = None  # the deterministic backward passes none (the atomic one a pointer)
    if "WARP_SPECIALIZE" in kernel.arg_names:
        constexprs["WARP_SPECIALIZE"] = tagged
    constexprs.update(extra or {})
    row = {"kernel": kind, "form": form, "tagged": tagged, "d": head_dim, "tile": list(tile),
           "keys_from_prepass": constexprs.get("KEYS_FROM_PREPASS"), **(extra or {})}
    types = kernel_registers.signature(kernel, constexprs)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if types[name].startswith("*") or name.startswith("stride_")}
    source = triton.compiler.ASTSource(fn=kernel, signature=types, constexprs=constexprs, attrs=aligned)
    started = time.time()
    try:
        with native_stderr() as log:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": num_warps, "num_stages": num_stages})
    except Exception as error:  # e.g. the warp-specialisation pass failing: a result, reported as such
        # where in the pass (its C++ assertion / unreachable line), from what MLIR wrote to the process's stderr
        where = sorted(set(re.findall(r"(\w+\.cpp:\d+)", log.read())))
        return {**row, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}", "failed_at": where,
                "compile_s": round(time.time() - started, 1)}
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    info = kernel_registers_ptxas(ptx)
    requested = re.search(r"requestedRegisters = array<i32: ([0-9, ]+)>", ttgir)
    warps = compiled.metadata.num_warps
    in_loops, outside = kernel_registers.spill_locations(compiled.asm["cubin"])
    return {**row, "warp_specialize_op": "ttg.warp_specialize(" in ttgir,
            "requested_registers": [int(x) for x in requested.group(1).split(",")] if requested else None,
            "warps": warps, "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\S*\s+(\d+)", ptx))),
            **info, "spill_instr_in_loops": in_loops, "spill_instr_outside": outside,
            "shared_B": compiled.metadata.shared,
            "programs_per_sm": kernel_registers.programs_per_sm(info["registers"], warps, compiled.metadata.shared)
            if info["registers"] else None,
            "wgmma": ptx.count("wgmma.mma_async"), "atomics": len(re.findall(r"\b(?:atom|red)\.", ptx)),
            "compile_s": round(time.time() - started, 1)}


@contextlib.contextmanager
def native_stderr():
    """Within: file descriptor 2 (where MLIR's C++ writes its reproducer and assertions) goes to a temporary file,
    yielded for reading afterwards."""
    log = tempfile.TemporaryFile("w+")
    saved = os.dup(2)
    sys.stderr.flush()
    os.dup2(log.fileno(), 2)
    try:
        yield log
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        log.seek(0)


def kernel_registers_ptxas(ptx: str) -> dict:
    """ptxas -v for sm_90a: registers, spill stores / loads (bytes), named barriers."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    try:
        text = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True,
                              text=True, timeout=600).stderr
    finally:
        os.unlink(f.name)

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None
    return {"registers": number(r"Used (\d+) registers"), "spill_stores_B": number(r"(\d+) bytes spill stores"),
            "spill_loads_B": number(r"(\d+) bytes spill loads"), "barriers": number(r"used (\d+) barriers")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three d=64 configurations only (the test's)")
    parser.add_argument("--out", default=None, help="append the JSON lines to this file too")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles the kernels, it does not interpret them")
    for config in QUICK if args.quick else FULL:
        line = json.dumps(compile_one(*config))
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Registers, spills and shared memory of the PoPE kernels compiled for Hopper (sm_90a), on any machine:
Triton compiles to PTX without a GPU and its bundled ptxas reports what each tile configuration costs.

A developer tool: docs/kernels.md's register analysis comes from it, and it checks a kernel change before any GPU
run. Compile-only numbers are not speed: a spill-free tile can be slower (fewer stages, one program per SM).

    PYTHONPATH=src python scripts/kernel_registers.py [--out DIR] [--kernels fwd,dq] [--head-dims 128] [--maxnreg N[,M]]
        [--tile BM,BN,WARPS,STAGES ...] [--block-m 32,64,128 --block-n 32,64 --warps 4,8 --stages 2,3]
        [--dtype fp32 --precision ieee|tf32|tf32x3]
Prints one line per (kernel, head dim, tile), and with --out writes them to DIR/kernel_registers.txt (.md with
--markdown): shared memory bytes, wgmma instructions, layout conversions in the
TTGIR (each one a trip through shared memory), how many programs an SM holds at once (registers and shared
memory), ptxas's report, and where the spills are in the SASS: spill instructions (STL / LDL) inside the kernel's
loops (run every key or query block: what costs time) and outside them (a program's prologue / epilogue: once per
program). --block-m/--block-n/--warps/--stages compile every combination (a grid; the shipped value of the
dimensions not given). The pre-pass ("prepass") takes its rows per program as BLOCK_M (no BLOCK_N).
--dtype fp32 compiles the fp32 specialisation of fwd, dq, dk/dv and the pre-pass (their fp32 tiles unless given) with
dots at --precision: "tf32x3" (three TF32 products per dot: what torch's "highest" float32 matmul precision gives
on a GPU with TF32 tensor cores), "tf32" (what "high" gives) or "ieee" (exact FMA dots: "highest" on older GPUs).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

from pope.kernels import bwd, configs, decode, fwd, prepass
from pope.kernels.interpreter import INTERPRET


def _shipped(kind: str) -> dict:
    """{head dim: [the shipped bf16 tile on sm_90]} of one kernel."""
    return {d: [configs.TILES[kind][(configs.MEASURED_ARCHITECTURE, d, torch.bfloat16)]] for d in configs.BUCKETS}


FLOAT32_POINTERS = {"Delta", "LSE", "RowDelta", "PackedLSE", "DDeltaPartial", "PartialOut", "PartialLSE"}
# (kernel, constexprs without HEAD_DIM / BLOCK_*, tiles per head dim); the lanes decode kernel has no BLOCK_M.
KERNELS = {
    "fwd": (fwd._pope_fwd_kernel, dict(CAUSAL=True, PRECISION="tf32"), _shipped("fwd")),
    "dq": (bwd._pope_bwd_dq_kernel, dict(CAUSAL=True, HAS_DELTA=True, MAGNITUDE=0, PRECISION="tf32"), _shipped("dq")),
    "dkdv": (bwd._pope_bwd_dkdv_kernel, dict(CAUSAL=True, MAGNITUDE=0, PRECISION="tf32"), _shipped("dkdv")),
    "decode": (
        decode._pope_decode_kernel,
        dict(CAUSAL=True, HAS_DELTA=True, MAGNITUDE=0, PRECISION="tf32"),
        # one query row padded to BLOCK_M = 16, the shipped (block_n, warps, stages)
        {d: [(16, *configs.decode_tile(d, torch.bfloat16, "tensor_cores"))] for d in (64, 128)},
    ),
    # the model's cache of magnitudes (magnitude "identity"): a bf16 key-phase table, bf16x2 products
    "decode-magnitudes": (
        decode._pope_decode_kernel,
        dict(CAUSAL=True, HAS_DELTA=True, MAGNITUDE=2, PRECISION="tf32"),
        {d: [(16, *configs.decode_tile(d, torch.bfloat16, "tensor_cores", "identity"))] for d in (64, 128)},
    ),
    "decode-lanes": (
        decode._pope_decode_lanes_kernel,
        dict(CAUSAL=True, HAS_DELTA=True, MAGNITUDE=0),
        # one query row per key head, the shipped (block_n, warps, stages)
        {d: [(1, *configs.decode_tile(d, torch.bfloat16, "lanes"))] for d in (64, 128)},
    ),
    # q' and k' in one launch (queries with delta); (rows per program, -, warps, stages) as the launcher runs it
    "prepass": (
        prepass._pope_transform_kernel,
        dict(HAS_DELTA=True, MAGNITUDE=0),
        {d: [(configs.TRANSFORM_ROWS if d <= 64 else configs.TRANSFORM_ROWS // 2, 0, 4, 3)] for d in (64, 128)},
    ),
}


FP32_KERNELS = {"fwd", "dq", "dkdv", "prepass"}
FP32_PRECISIONS = ("ieee", "tf32", "tf32x3")

# What only a packed (varlen) launch passes (None otherwise, constexprs).
VARLEN_ARGUMENTS = ("CuSeqlensQ", "CuSeqlensK", "PackedLSE")


def descriptor_types(constexprs: dict, element: str = "bf16") -> dict:
    """The TMA descriptor arguments' types (element type and block shape) as the launchers build them: q' and k'
    as one (rows, 2 BLOCK_D) tile [cos | sin], v and dO as (rows, BLOCK_D)."""
    bm, bn, bd = constexprs.get("BLOCK_M", 16), constexprs.get("BLOCK_N", 16), constexprs["BLOCK_D"]
    return {
        "kp_desc": f"tensordesc<{element}[1,{bn},{2 * bd}]>",
        "v_desc": f"tensordesc<{element}[1,1,{bn},{bd}]>",
        "qp_desc": f"tensordesc<{element}[1,{bm},{2 * bd}]>",
        "do_desc": f"tensordesc<{element}[1,1,{bm},{bd}]>",
        "lse_desc": f"tensordesc<fp32[1,{bm}]>",
        "rowdelta_desc": f"tensordesc<fp32[1,{bm}]>",
    }


def signature(kernel, constexprs: dict, element: str = "bf16") -> dict:
    """Each argument's Triton type as a launch with `element` (bf16 or fp32) inputs passes it."""
    types = {}
    descriptors = descriptor_types(constexprs, element)
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.endswith("_desc"):
            types[name] = descriptors[name]
        elif name in FLOAT32_POINTERS:
            types[name] = "*fp32"
        elif name == "Theta" or name.startswith("CuSeqlens"):  # turn words (pope.frequencies.turn_words); lengths
            types[name] = "*i32"
        elif name == "Table":  # the decode kernel's key-phase table: fp16 for bf16 raw keys, bf16 for magnitudes
            types[name] = "*bf16" if constexprs.get("MAGNITUDE") == 2 else "*fp16"
        elif name[0].isupper():
            types[name] = f"*{element}"
        elif name == "softmax_scale":
            types[name] = "fp32"
        else:
            types[name] = "i32"
    return types


def report(
    kernel, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None, element: str = "bf16"
) -> str:
    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    types = signature(kernel, constexprs, element)
    # As a launch on real tensors specialises them: pointers and row strides divisible by 16 (vector loads).
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if types[name].startswith("*") or name.startswith("stride_")
    }
    source = triton.compiler.ASTSource(fn=kernel, signature=types, constexprs=constexprs, attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    try:
        run = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True, timeout=300
        )
    finally:
        os.unlink(f.name)
    info = "; ".join(
        line.split("info    : ")[-1] for line in run.stderr.splitlines() if "Used" in line or "spill" in line
    )
    used = re.search(r"Used (\d+) registers", info)
    resident = programs_per_sm(int(used.group(1)), num_warps, compiled.metadata.shared) if used else "?"
    in_loops, outside = spill_locations(compiled.asm["cubin"])
    return (
        f"shared {compiled.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
        f"layout conversions {compiled.asm['ttgir'].count('ttg.convert_layout')}, programs per SM {resident}, "
        f"{info or run.stderr.strip()[:200]}; SASS spill instructions in loops {in_loops}, outside {outside}"
    )


def spill_locations(cubin: bytes) -> tuple[int, int]:
    """(spill instructions (STL / LDL) inside loops, outside them) in the kernel's SASS (cuobjdump -sass).

    A loop is the range from a predicated backward branch's target to the branch, longer than 32 instructions
    (shorter ones are barrier-wait spins; the unconditional jumps back from out-of-line waits are no loops).
    Inside: run every key / query block; outside: a program's prologue and epilogue."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, timeout=300).stdout
    finally:
        os.unlink(f.name)
    instructions = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)
    addresses = [int(address, 16) for address, _ in instructions]
    loops = []
    for address, text in zip(addresses, (text for _, text in instructions)):
        branch = re.match(r"@!?U?P\w+\s+BRA\s+0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address - 32 * 16:
            loops.append((int(branch.group(1), 16), address))
    in_loops = outside = 0
    for address, text in zip(addresses, (text for _, text in instructions)):
        if re.search(r"\b(STL|LDL)\b", text):
            if any(lo <= address <= hi for lo, hi in loops):
                in_loops += 1
            else:
                outside += 1
    return in_loops, outside


def programs_per_sm(registers: int, num_warps: int, shared_bytes: int) -> int:
    """Programs of this kernel an H100/H200 SM holds at once: 64K registers (allocated per thread in steps of 8),
    228 KB of shared memory (1 KB of it reserved per program), 64 warps. One program per SM leaves the SM idle
    while a program starts and ends; two overlap one's start and end with the other's products."""
    by_registers = 65536 // (-(-registers // 8) * 8 * 32 * num_warps)
    by_shared = 233472 // (shared_bytes + 1024)
    return min(by_registers, by_shared, 64 // num_warps)


MARKDOWN_HEADER = (
    "| kernel | d | tile (BM, BN, warps, stages) | maxnreg | registers | spill stores / loads (B) | "
    "spill instr. in loops / outside | shared (KB) | programs / SM | layout conv. | wgmma |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def markdown_row(name: str, head_dim: int, tile: tuple, cap, line: str) -> str:
    """One `report` line as a row under MARKDOWN_HEADER."""

    def field(pattern, default="-"):
        found = re.search(pattern, line)
        return found.group(1) if found else default

    if line.startswith("does not compile"):
        return f"| {name} | {head_dim} | {tile} | {cap or '-'} | {line} | | | | | | |"
    stores, loads = field(r"(\d+) bytes spill stores"), field(r"(\d+) bytes spill loads")
    in_loops, outside = field(r"in loops (\d+)"), field(r"outside (\d+)")
    registers, resident = field(r"Used (\d+) registers"), field(r"programs per SM (\d+)")
    shared, conversions = int(field(r"shared (\d+) B", "0")) / 1024, field(r"layout conversions (\d+)")
    wgmma = field(r"wgmma (\d+)")
    return (
        f"| {name} | {head_dim} | {tile} | {cap or '-'} | {registers} | {stores} / {loads} | {in_loops} / "
        f"{outside} | {shared:.0f} | {resident} | {conversions} | {wgmma} |"
    )


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(x) for x in text.split(",")]


def tiles_to_compile(shipped: list[tuple], args) -> list[tuple]:
    """--tile's tiles, else the grid of --block-m x --block-n x --warps x --stages (the shipped tile's value for a
    dimension not given), else the shipped tiles."""
    if args.tile:
        return [tuple(int(x) for x in tile.split(",")) for tile in args.tile]
    grid = [_ints(args.block_m), _ints(args.block_n), _ints(args.warps), _ints(args.stages)]
    if all(values is None for values in grid):
        return shipped
    return list(itertools.product(*(values or [shipped[0][i]] for i, values in enumerate(grid))))


def constexprs_for(
    name: str,
    kernel,
    flags: dict,
    head_dim: int,
    block_m: int,
    block_n: int,
    num_stages: int,
    varlen: bool,
    keys_from_prepass: bool | None = None,
) -> dict:
    """The constexprs a launcher passes for this kernel and tile (batched, or packed with `varlen`)."""
    if name == "prepass":
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_R=block_m, **flags)
    else:
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_D=head_dim, **flags)
    if "BLOCK_M" in kernel.arg_names:
        constexprs["BLOCK_M"] = block_m
    if "STAGES" in kernel.arg_names:  # the decode kernels pipeline through tl.range(num_stages=STAGES)
        constexprs["STAGES"] = num_stages
    if "IS_VARLEN" in kernel.arg_names:  # batched: the packed-batch arguments are None (constexprs)
        constexprs["IS_VARLEN"] = varlen
        if not varlen:
            constexprs.update({arg: None for arg in VARLEN_ARGUMENTS if arg in kernel.arg_names})
    if "KEYS_FROM_PREPASS" in kernel.arg_names:  # as the launcher decides; without, k'/v come as None
        constexprs["KEYS_FROM_PREPASS"] = (
            head_dim <= configs.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D if keys_from_prepass is None else keys_from_prepass
        )
        if not constexprs["KEYS_FROM_PREPASS"]:
            constexprs.update(kp_desc=None, v_desc=None)
    return constexprs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--maxnreg",
        default=None,
        help="cap registers per thread (ptxas .maxnreg); a comma-separated list compiles each cap",
    )
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated subset of {list(KERNELS)}")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument(
        "--tile",
        action="append",
        default=[],
        help="BLOCK_M,BLOCK_N,warps,stages to compile instead of the shipped tiles (repeatable)",
    )
    for dimension in ("block-m", "block-n", "warps", "stages"):
        parser.add_argument(f"--{dimension}", default=None, help=f"comma-separated {dimension} values of a tile grid")
    parser.add_argument(
        "--keys-from-prepass",
        choices=["auto", "yes", "no"],
        default="auto",
        help="dk/dv kernel: key block from k' by TMA (yes) or transformed in registers (no); auto: "
        "as the launcher decides (configs.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D)",
    )
    parser.add_argument("--markdown", action="store_true", help="print a markdown table instead of report lines")
    parser.add_argument("--out", default=None, help="also write the lines to DIR/kernel_registers.txt (or .md)")
    parser.add_argument(
        "--varlen", action="store_true", help="compile the packed (varlen) specialisation of the kernels that have one"
    )
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="the inputs' element type")
    parser.add_argument(
        "--precision",
        choices=FP32_PRECISIONS,
        default=None,
        help="fp32 dots: ieee (exact), tf32 or tf32x3; only with --dtype fp32, which needs it",
    )
    args = parser.parse_args(argv)
    if INTERPRET:
        raise SystemExit("unset TRITON_INTERPRET: this compiles the kernels, it does not interpret them")
    if (args.dtype == "fp32") != (args.precision is not None):
        raise SystemExit(
            "--precision goes with --dtype fp32 and --dtype fp32 needs it (ieee, tf32 or tf32x3): "
            "16-bit dots have one precision"
        )
    head_dims = [int(d) for d in args.head_dims.split(",")]
    lines = []

    def emit(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if args.markdown:
        emit(MARKDOWN_HEADER)
    caps = (
        [None]
        if args.maxnreg is None
        else [None if cap in ("", "none") else int(cap) for cap in args.maxnreg.split(",")]
    )
    for name in args.kernels.split(","):
        if name not in KERNELS:
            raise SystemExit(f"unknown kernel {name!r}; choose from {list(KERNELS)}")
        kernel, flags, tiles = KERNELS[name]
        if args.dtype == "fp32":
            if name not in FP32_KERNELS:
                raise SystemExit(
                    f"--dtype fp32 compiles {sorted(FP32_KERNELS)}, not {name!r} (the decode kernels' "
                    "fp32 variants are not modelled here)"
                )
            flags = {**flags, "PRECISION": args.precision} if "PRECISION" in flags else flags
            if name != "prepass":
                tiles = {d: [configs.shipped_tiles(name, d, torch.float32, args.precision)] for d in tiles}
        for head_dim, shipped in tiles.items():
            if head_dim not in head_dims:
                continue
            for (block_m, block_n, num_warps, num_stages), cap in itertools.product(
                tiles_to_compile(shipped, args), caps
            ):
                constexprs = constexprs_for(
                    name,
                    kernel,
                    flags,
                    head_dim,
                    block_m,
                    block_n,
                    num_stages,
                    args.varlen,
                    {"auto": None, "yes": True, "no": False}[args.keys_from_prepass],
                )
                try:
                    line = report(kernel, constexprs, num_warps, num_stages, cap, args.dtype)
                except Exception as error:  # a tile that does not compile (shared memory, layouts): say so, go on
                    line = f"does not compile: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
                tile = (block_m, block_n, num_warps, num_stages)
                if args.markdown:
                    emit(markdown_row(name, head_dim, tile, cap, line))
                else:
                    capped = f" maxnreg {cap}" if cap else ""
                    emit(f"{name:6s} d={head_dim:<3d} tile {tile}{capped}: {line}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "kernel_registers." + ("md" if args.markdown else "txt"))
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

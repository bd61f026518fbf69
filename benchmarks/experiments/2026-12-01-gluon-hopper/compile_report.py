"""Compile-only report of the Gluon attention forward for sm_90a, on any machine (no GPU).

For each (variant, BLOCK_N, STAGES) it compiles gluon_attention._attention_fwd_kernel with Triton's CUDA backend, runs
the bundled ptxas -v on the PTX and cuobjdump on the cubin, and prints what shows whether the Hopper machinery is
there: registers / spills / barriers (ptxas), shared memory, the setmaxnreg values in the PTX and USETMAXREG in the
SASS (register re-allocation per partition), wgmma / HGMMA shapes, TMA loads (cp.async.bulk.tensor / UTMALDG),
mbarrier waits and arrivals (SYNCS.*), CTA barriers (BAR.SYNC) inside and outside the SASS loops, spill instructions,
the TMA boxes the host must encode (tensordesc_meta), and the partitions and requested registers in the TTGIR.
The shipped Triton forward's main pass at d = 128 is compiled beside it for comparison (scripts/kernel_registers.py).

    PYTHONPATH=src python benchmarks/experiments/2026-12-01-gluon-hopper/compile_report.py [--json FILE] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "scripts")]

import triton  # noqa: E402

import gluon_attention  # noqa: E402

H100_SHARED_PER_BLOCK = 232448  # 227 KB: the most dynamic shared memory one block may use on sm_90
CONFIGS = [("plain", 64, 2), ("ws", 64, 2), ("ws-overlap", 64, 2), ("plain", 64, 3), ("ws", 64, 3),
           ("ws-overlap", 64, 3)]
QUICK_CONFIGS = [("plain", 64, 2), ("ws", 64, 2), ("ws-overlap", 64, 2)]


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def ptxas_info(ptx: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        run = subprocess.run([_tool("ptxas"), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(f.name)
    text = run.stderr

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None
    return {"registers": number(r"Used (\d+) registers"), "spill_stores_B": number(r"(\d+) bytes spill stores"),
            "spill_loads_B": number(r"(\d+) bytes spill loads"), "named_barriers": number(r"used (\d+) barriers"),
            # e.g. "wgmma.mma_async instructions are serialized due to ...": ptxas undoing the async pipeline
            "ptxas_warnings": [line.strip() for line in text.splitlines() if "warning" in line.lower()
                               or "performance" in line.lower()]}


def sass_of(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of every SASS instruction."""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              timeout=300).stdout
    finally:
        os.unlink(f.name)
    return [(int(address, 16), body) for address, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", text)]


def loop_ranges(instructions) -> list[tuple[int, int]]:
    """[target, branch] of each predicated backward branch spanning more than 32 instructions (the key loops; the
    short ones are mbarrier / wgmma wait spins), as scripts/kernel_registers.py's spill_locations finds them."""
    loops = []
    for address, text in instructions:
        branch = re.match(r"@!?U?P\w+\s+BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address - 32 * 16:
            loops.append((int(branch.group(1), 16), address))
    return loops


def count_in_loops(instructions, loops, pattern: str) -> tuple[int, int]:
    inside = outside = 0
    for address, text in instructions:
        if re.search(pattern, text):
            if any(lo <= address <= hi for lo, hi in loops):
                inside += 1
            else:
                outside += 1
    return inside, outside


def barriers_in_loops(instructions, loops) -> dict:
    """{"id, threads": count} of the BAR.SYNCs inside loops: "0x0, 0x80" syncs one 128-thread warpgroup (named
    barrier 0), a bare id every thread of the CTA."""
    found = {}
    for address, text in instructions:
        operands = re.match(r"BAR\.SYNC(?:\.DEFER_BLOCKING)?\s+(.*)", text)
        if operands and any(lo <= address <= hi for lo, hi in loops):
            key = operands.group(1).strip()
            key = key if "," in key else f"{key} (whole CTA)"
            found[key] = found.get(key, 0) + 1
    return found


def report(variant: str, block_n: int, stages: int) -> dict:
    compiled = gluon_attention.compile_for_hopper(variant, block_n=block_n, stages=stages)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    instructions = sass_of(compiled.asm["cubin"])
    loops = loop_ranges(instructions)
    sass = "\n".join(text for _, text in instructions)
    requested = re.search(r"requestedRegisters = array<i32: ([0-9, ]+)>", ttgir)
    bar_in, bar_out = count_in_loops(instructions, loops, r"\bBAR\.SYNC\b")
    spill_in, spill_out = count_in_loops(instructions, loops, r"\b(STL|LDL)\b")
    return {
        "variant": variant, "block_m": gluon_attention.BLOCK_M, "block_n": block_n, "stages": stages,
        "head_qk": 256, "head_v": 128, "warps_total": compiled.metadata.num_warps,
        "maxnreg": compiled.metadata.maxnreg, "shared_B": compiled.metadata.shared,
        "fits_shared": compiled.metadata.shared <= H100_SHARED_PER_BLOCK, **ptxas_info(ptx),
        "ttgir_warp_specialize": ttgir.count("ttg.warp_specialize"),
        "ttgir_requested_registers": [int(x) for x in requested.group(1).split(",")] if requested else None,
        "ttgir_convert_layout": ttgir.count("ttg.convert_layout"),
        "ptx_setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
        "ptx_wgmma": ptx.count("wgmma.mma_async"), "ptx_wgmma_wait": ptx.count("wgmma.wait_group"),
        "ptx_wgmma_wait_leaving_one": ptx.count("wgmma.wait_group.sync.aligned 1;"),
        "ptx_tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        "ptx_mbarrier_wait": ptx.count("mbarrier.try_wait"), "ptx_mbarrier_arrive": ptx.count("mbarrier.arrive"),
        "ptx_expect_tx": ptx.count("mbarrier.arrive.expect_tx"),
        "sass_usetmaxreg": sorted(set(re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", sass))),
        "sass_hgmma": {shape: sass.count(shape) for shape in sorted(set(re.findall(r"HGMMA\.\w+\.F32\.BF16", sass)))},
        "sass_utmaldg": sass.count("UTMALDG"), "sass_syncs_phasechk": sass.count("SYNCS.PHASECHK"),
        "sass_syncs_arrive": len(re.findall(r"SYNCS\.ARRIVE", sass)),
        "sass_loops": len(loops), "sass_bar_sync_in_loops": bar_in,
        "sass_bar_sync_in_loops_by_barrier": barriers_in_loops(instructions, loops), "sass_bar_sync_outside": bar_out,
        "sass_spill_instr_in_loops": spill_in, "sass_spill_instr_outside": spill_out,
        "tma_boxes": [meta["block_size"] for meta in compiled.metadata.tensordesc_meta],
    }


def shipped_forward_line() -> str:
    """The shipped Triton forward (q'/k' by TMA, d = 128, its shipped tile) as scripts/kernel_registers.py reports it."""
    import kernel_registers

    kernel, flags, tiles = kernel_registers.KERNELS["fwd"]
    block_m, block_n, warps, stages = tiles[128][0]
    constexprs = kernel_registers.constexprs_for("fwd", kernel, flags, 128, block_m, block_n, stages, False)
    return f"shipped Triton fwd d=128 tile {tiles[128][0]}: " + kernel_registers.report(kernel, constexprs, warps,
                                                                                       stages, None)


def summary_line(row: dict) -> str:
    loops = (f"BAR.SYNC in loops {row['sass_bar_sync_in_loops']} {row['sass_bar_sync_in_loops_by_barrier']} / outside {row['sass_bar_sync_outside']}, "
             f"spill instr. in loops {row['sass_spill_instr_in_loops']} / outside {row['sass_spill_instr_outside']}")
    return (f"{row['variant']:10s} BLOCK_N {row['block_n']} stages {row['stages']}: {row['warps_total']} warps, "
            f"{row['registers']} registers (maxnreg {row['maxnreg']}), spills {row['spill_stores_B']}/"
            f"{row['spill_loads_B']} B, shared {row['shared_B'] / 1024:.1f} KB"
            f"{'' if row['fits_shared'] else ' (OVER 227 KB)'}, setmaxnreg {row['ptx_setmaxnreg'] or 'none'}, "
            f"requested {row['ttgir_requested_registers']}, wgmma {row['ptx_wgmma']} (HGMMA {row['sass_hgmma']}, waits leaving one in flight "
            f"{row['ptx_wgmma_wait_leaving_one']}), "
            f"TMA loads {row['ptx_tma_loads']} (UTMALDG {row['sass_utmaldg']}, boxes {row['tma_boxes']}), "
            f"mbarrier waits {row['ptx_mbarrier_wait']} arrives {row['ptx_mbarrier_arrive']}, {loops}, "
            f"ptxas warnings {row['ptxas_warnings'] or 'none'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    parser.add_argument("--quick", action="store_true", help="only the two default configurations, no shipped kernel")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles the kernels (Gluon has no interpreter path)")
    rows = []
    for variant, block_n, stages in (QUICK_CONFIGS if args.quick else CONFIGS):
        row = report(variant, block_n, stages)
        rows.append(row)
        print(summary_line(row), flush=True)
    if not args.quick:
        print(shipped_forward_line(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

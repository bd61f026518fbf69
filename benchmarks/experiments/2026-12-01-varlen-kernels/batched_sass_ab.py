"""Do the batched kernels compile to the same code in two source trees? Each tree's affected kernels (pre-pass,
forward, dq, dk/dv, backward epilogue) are compiled for sm_90a here (no GPU: Triton's PTX, its bundled ptxas and
nvdisasm) at the shipped bf16 tiles, d = 64 / 128, causal and not (pre-pass with and without delta), with every
argument a newer tree added (the packed-batch ones) given its batched value (IS_VARLEN=False, the rest None, as
the launchers pass them); the PTX with line information stripped and the SASS are compared.

    python benchmarks/experiments/2026-12-01-varlen-kernels/batched_sass_ab.py --old OLD/src --new src
(`git archive 0e29760 src scripts | tar -x -C OLD` gives OLD.) Prints one line per kernel; exits 1 on a difference.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile


def compile_tree(out_path: str) -> None:
    """In a process whose path starts with one tree's src: {case: {ptx, sass hashes}} to out_path."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], os.pardir, "scripts"))  # that tree's scripts/
    import kernel_registers as registers

    from pope.kernels import bwd, configs, fwd, prepass

    describe = registers.descriptor_types
    registers.descriptor_types = lambda constexprs: describe({"BLOCK_N": 16, **constexprs})
    cases = []
    for d in (64, 128):
        tiles = {kind: configs.TILES[kind][("sm_90", d, torch.bfloat16)] for kind in ("fwd", "dq", "dkdv")}
        for causal in (True, False):
            common = dict(CAUSAL=causal, PRECISION="tf32", HEAD_DIM=d, BLOCK_D=d)
            cases.append((f"fwd d={d} causal={causal}", fwd._pope_fwd_kernel,
                          dict(common, BLOCK_M=tiles["fwd"][0], BLOCK_N=tiles["fwd"][1]), tiles["fwd"][2:]))
            cases.append((f"dq d={d} causal={causal}", bwd._pope_bwd_dq_kernel,
                          dict(common, HAS_DELTA=True, MAGNITUDE=0, BLOCK_M=tiles["dq"][0], BLOCK_N=tiles["dq"][1]),
                          tiles["dq"][2:]))
            keys_from_prepass = d <= configs.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D
            dkdv = dict(common, MAGNITUDE=0, BLOCK_M=tiles["dkdv"][0], BLOCK_N=tiles["dkdv"][1],
                        KEYS_FROM_PREPASS=keys_from_prepass)
            if not keys_from_prepass:
                dkdv.update(kp_desc=None, v_desc=None)
            cases.append((f"dkdv d={d} causal={causal}", bwd._pope_bwd_dkdv_kernel, dkdv, tiles["dkdv"][2:]))
        for has_delta in (True, False):
            cases.append((f"pre-pass d={d} delta={has_delta}", prepass._pope_transform_kernel,
                          dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_R=64 if d <= 64 else 32, HAS_DELTA=has_delta,
                               MAGNITUDE=0), (4, 1)))
        cases.append((f"epilogue d={d}", bwd._backward_epilogue_kernel, dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_R=64),
                      (4, 1)))
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    summary = {}
    for name, kernel, constexprs, (warps, stages) in cases:
        for arg in kernel.arg_names:  # arguments only a packed launch passes: their batched values
            if arg == "IS_VARLEN":
                constexprs[arg] = False
            elif arg in getattr(registers, "VARLEN_ARGUMENTS", ()):
                constexprs[arg] = None
        types = registers.signature(kernel, constexprs)
        aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names)
                   if types[arg].startswith("*") or arg.startswith("stride_")}
        source = triton.compiler.ASTSource(fn=kernel, signature=types, constexprs=constexprs, attrs=aligned)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps, "num_stages": stages})
        ptx = re.split(r"\n\s*\.section\s", compiled.asm["ptx"])[0]  # the DWARF sections hold line numbers
        ptx = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//)", line))
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-c", f.name], capture_output=True,
                              text=True).stdout
        os.unlink(f.name)
        sass = "\n".join(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line) for line in sass.splitlines()
                         if not line.strip().startswith("//"))
        summary[name] = {"ptx": hashlib.sha256(ptx.encode()).hexdigest()[:16],
                         "sass": hashlib.sha256(sass.encode()).hexdigest()[:16],
                         "sass_lines": len(sass.splitlines()), "shared": compiled.metadata.shared}
    with open(out_path, "w") as f:
        json.dump(summary, f, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the older tree's src directory")
    parser.add_argument("--new", required=True, help="the newer tree's src directory")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        compile_tree(args.worker)
        return 0
    results = {}
    for label, src in (("old", args.old), ("new", args.new)):
        path = os.path.join(tempfile.mkdtemp(), f"{label}.json")
        env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.path.abspath(src)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--old", "", "--new", "", "--worker", path],
                       env=env, check=True)
        with open(path) as f:
            results[label] = json.load(f)
    same = 0
    for name, old in results["old"].items():
        new = results["new"][name]
        equal = old["ptx"] == new["ptx"] and old["sass"] == new["sass"]
        same += equal
        print(f"{name:28s} PTX {'same' if old['ptx'] == new['ptx'] else 'DIFFERENT'}, SASS "
              f"{'same' if old['sass'] == new['sass'] else 'DIFFERENT'} ({old['sass_lines']} lines)")
    print(f"{same}/{len(results['old'])} kernels compile to the same PTX and SASS")
    return 0 if same == len(results["old"]) else 1


if __name__ == "__main__":
    sys.exit(main())

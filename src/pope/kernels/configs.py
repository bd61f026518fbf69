"""Tile configurations of the kernels: frozen tables keyed by (GPU architecture, head-dim bucket, dtype).

TILES[kind][(architecture, bucket, dtype)] -> Tiles(block_m, block_n, num_warps, num_stages) for the kernels
"fwd", "dq" and "dkdv"; bucket 64 holds head dims up to 64 (tile width BLOCK_D <= 64), bucket 128 the rest up to 128.
The tables are never changed: the entries were timed on an NVIDIA H200 (sm_90, docs/kernels.md), and another
architecture takes them until it has entries of its own. fp32 inputs take small one-stage tiles, or the fp32 operand
tiles overflow shared memory and registers; their dots are fp32-accurate (tf32x3, or exact FMA dots on GPUs without
TF32 tensor cores) unless PyTorch's float32 matmul precision allows TF32 (host.precision). fp32 launches with tf32x3
dots take TF32X3_TILES[kind][(architecture, bucket)] instead (`shipped_tiles` picks by the launch's precision).

A user override (tuning for another GPU): POPE_KERNEL_CONFIGS=FILE.json with
{"fwd"|"dq"|"dkdv": {"64"|"128": [BLOCK_M, BLOCK_N, warps, stages]}} for 16-bit inputs (time candidate tiles with
scripts/kernel_variants.py --fwd/--dq/--dkdv). `pick_tiles` reads it when a config is picked (each file once;
pope.settings.clear_caches() re-reads); a malformed file is a ValueError naming it. The interpreter always runs
(32, 32, 4, 1): small tiles keep it fast and exercise the multi-block paths.
"""

from __future__ import annotations

import json
import os
from types import MappingProxyType
from typing import NamedTuple

import torch

from pope.kernels.capability import cuda_capability
from pope.settings import SETTINGS

from .host import block_d
from .interpreter import INTERPRET


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


KINDS = ("fwd", "dq", "dkdv")
BUCKETS = (64, 128)
MEASURED_ARCHITECTURE = "sm_90"  # H100 / H200: where the entries were timed
ENVIRONMENT_VARIABLE = "POPE_KERNEL_CONFIGS"

# 16-bit inputs on sm_90. Forward (128, 64, 8, 3): with its q' block from the pre-pass, two programs per SM at
# d=64. dq: the fastest in the sweeps ((128, 32, 8, 3) at d=128 since its k'/v come by TMA). dk/dv (64, 64, 4, 3)
# at d=64: two 4-warp programs per SM; (64, 64, 8, 3) at d=128. Timings: docs/kernels.md.
_SIXTEEN_BIT = {
    "fwd": {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)},
    "dq": {64: (64, 64, 4, 3), 128: (128, 32, 8, 3)},
    "dkdv": {64: (64, 64, 4, 3), 128: (64, 64, 8, 3)},
}
_FP32 = {64: (32, 32, 4, 1), 128: (16, 32, 4, 1)}  # every kind
TILES = MappingProxyType(
    {
        kind: MappingProxyType(
            {
                (MEASURED_ARCHITECTURE, bucket, dtype): Tiles(
                    *(_FP32[bucket] if dtype == torch.float32 else by_bucket[bucket])
                )
                for bucket in BUCKETS
                for dtype in (torch.bfloat16, torch.float16, torch.float32)
            }
        )
        for kind, by_bucket in _SIXTEEN_BIT.items()
    }
)
# fp32 inputs with tf32x3 dots (host.precision at "highest"): the high and low operand parts double the registers a
# tile needs, so each kernel takes its own tile, most with 16-row query or key blocks. Under TF32 dots these tiles
# are slower than _FP32, so "tf32" (and "ieee") keep TILES' fp32 entries. Timings: docs/kernels.md.
_FP32_TF32X3 = {
    "fwd": {64: (64, 16, 4, 1), 128: (16, 32, 4, 1)},
    "dq": {64: (32, 32, 4, 1), 128: (128, 16, 8, 1)},
    "dkdv": {64: (16, 16, 4, 1), 128: (32, 16, 8, 1)},
}
TF32X3_TILES = MappingProxyType(
    {
        kind: MappingProxyType({(MEASURED_ARCHITECTURE, bucket): Tiles(*tiles) for bucket, tiles in by_bucket.items()})
        for kind, by_bucket in _FP32_TF32X3.items()
    }
)
INTERPRETER_TILES = Tiles(32, 32, 4, 1)

# Pre-pass rows per program (half at BLOCK_D > 64: 4K elements a program).
TRANSFORM_ROWS = 64
# Up to this BLOCK_D the dk/dv kernel reads its key block from the backward's k' (kept alive until it ends) instead of
# transforming it in registers: faster at d <= 64, slower at d = 128 on an H200 (docs/kernels.md).
DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D = 64


def architecture(device: torch.device) -> str:
    """ "sm_XY" of a CUDA device (its compute capability X.Y); the measured one for others (host-only timing)."""
    if device.type != "cuda":
        return MEASURED_ARCHITECTURE
    major, minor = cuda_capability(device)
    return f"sm_{major}{minor}"


def bucket(head_dim: int) -> int:
    return 64 if block_d(head_dim) <= 64 else 128


def pick_tiles(kind: str, head_dim: int, override, dtype: torch.dtype, device: torch.device, precision: str):
    """The (block_m, block_n, num_warps, num_stages) a launcher runs `kind` with: override when given, else the
    interpreter's tiles, else the POPE_KERNEL_CONFIGS file's entry (16-bit inputs), else `shipped_tiles` (the
    device's architecture, or the measured one). precision: the launch's dot precision (host.precision). Looked up
    once per (kind, head dim, dtype, device, precision, override file): it is on every eager call's host path."""
    if override is not None:
        return override
    if INTERPRET:
        return INTERPRETER_TILES
    path = os.environ.get(ENVIRONMENT_VARIABLE) if dtype != torch.float32 else None
    key = (kind, head_dim, dtype, device, precision, path)
    cache = SETTINGS.caches.tiles
    tiles = cache.get(key)
    if tiles is None:
        head_bucket = bucket(head_dim)
        from_file = tile_file(path).get(kind, {}).get(head_bucket) if path else None
        tiles = cache[key] = from_file or shipped_tiles(kind, head_bucket, dtype, precision, architecture(device))
    return tiles


def shipped_tiles(
    kind: str, head_bucket: int, dtype: torch.dtype, precision: str, arch: str = MEASURED_ARCHITECTURE
) -> Tiles:
    """The package's tile for `kind` at a head-dim bucket, dtype and dot precision on architecture `arch` (the
    measured architecture's when `arch` has no entry): TF32X3_TILES for fp32 inputs with tf32x3 dots, else TILES."""
    if dtype == torch.float32 and precision == "tf32x3":
        table, key = TF32X3_TILES[kind], (head_bucket,)
    else:
        table, key = TILES[kind], (head_bucket, dtype)
    return table.get((arch, *key)) or table[(MEASURED_ARCHITECTURE, *key)]


def tile_file(path: str) -> dict:
    """{kind: {bucket: Tiles}} from a POPE_KERNEL_CONFIGS file, parsed once per path (pope.settings' caches)."""
    cache = SETTINGS.caches.tile_files
    table = cache.get(path)
    if table is None:
        table = cache[path] = read_tile_file(path)
    return table


def read_tile_file(path: str) -> dict:
    """Parse and check a tile file (module docstring); ValueError saying what is wrong with it."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={path}: cannot read a JSON tile file ({error}); fix or unset it"
        ) from error
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected {{kernel: {{head-dim bucket: [BLOCK_M, BLOCK_N, warps, stages]}}}}")
    table = {}
    for kind, by_bucket in raw.items():
        if kind not in KINDS:
            raise ValueError(f"{path}: unknown kernel {kind!r}; expected one of {sorted(KINDS)}")
        if not isinstance(by_bucket, dict):
            raise ValueError(f"{path}: {kind} must map head-dim buckets 64/128 to [BLOCK_M, BLOCK_N, warps, stages]")
        for dim, config in by_bucket.items():
            if (
                str(dim) not in ("64", "128")
                or not isinstance(config, list)
                or len(config) != 4
                or not all(type(x) is int and x > 0 for x in config)
            ):
                raise ValueError(
                    f"{path}: {kind}[{dim}] must be head-dim bucket 64/128 -> [BLOCK_M, BLOCK_N, warps, "
                    f"stages] (positive ints); got {config!r}"
                )
            table.setdefault(kind, {})[int(dim)] = Tiles(*config)
    return table


# A register cap (Triton's maxnreg) for the lanes decode kernel; None: the compiler's choice (shipped). With exact
# angles the kernel went 127 -> 156 registers at d=64 (three 4-warp programs per SM instead of four); ptxas fits it
# in 128 without spills (four per SM). A cap pays only where it adds a program per SM: 128 at d=64, 96 (five per SM,
# some spills) at d=64 and d=128 (124 uncapped, four per SM). POPE_DECODE_LANES_MAXNREG=N sets it for a process
# (read at import: an A/B on the GPU, e.g. benchmarks/attention.py's decode rows with and without it); the
# candidates are the caps worth timing. The default changes only on a GPU timing.
DECODE_LANES_MAXNREG_VARIABLE = "POPE_DECODE_LANES_MAXNREG"
DECODE_LANES_MAXNREG_CANDIDATES = {64: (128, 96), 128: (96,)}


def _register_cap(variable: str) -> int | None:
    text = os.environ.get(variable)
    if not text:
        return None
    if not text.isdigit() or not 16 <= int(text) <= 255:
        raise ValueError(f"{variable}={text!r}: expected registers per thread, an integer in 16..255; fix or unset it")
    return int(text)


DECODE_LANES_MAXNREG: int | None = _register_cap(DECODE_LANES_MAXNREG_VARIABLE)


def decode_tile(head_dim: int, dtype: torch.dtype, method: str, magnitude: str = "softplus") -> tuple[int, int, int]:
    """Default (block_n, num_warps, stages) of a decode kernel ("lanes" or "tensor_cores"; both stream k/v
    through a cp.async pipeline of `stages` - 1 buffers), from the decode sweeps on an H200 (docs/kernels.md):
    "lanes": 2K-element key tiles, 4 warps, 3 stages (d=64: 32 keys, d=128: 16).
    "tensor_cores": 4 warps, 2 stages; 64 keys, but 32 at d = 128 for raw keys (a cache of magnitudes, whose 16-bit
    products need no fp32 copy of the tile, runs d = 128 fastest at 64 keys); fp32 one stage."""
    width = block_d(head_dim)
    if method == "lanes":
        return max(16, 2048 // width), 4, 3
    if dtype == torch.float32:
        return (64 if width <= 64 else 32), 4, 1
    return (64 if width <= 64 or magnitude == "identity" else 32), 4, 2

"""Key-phase tables of the tensor-core decode kernel: (rows >= Nk, 2 BLOCK_D) [cos | sin] of key positions.

A table is the pre-pass run over ones with magnitude "identity" (stride-0 rows, one read). Eager callers keep
tables across decode steps (keep=True): in pope.settings' caches (phase_tables), keyed by (theta's address,
device, dtype, BLOCK_D, rows). Guarantees: an entry holds its theta (so the address cannot be reused by another
tensor) and is never replaced or dropped while theta is unchanged (its version counter), because a CUDA graph
captured over a decode call keeps reading the table's memory; none is made while a graph is being captured (it
would live in the graph's private pool); rows are a power of two >= the cache length (>= MIN_PHASE_TABLE_ROWS), so a
growing cache makes few tables; at most MAX_PHASE_TABLES entries, then tables are built per call. A kept table gives
the same bits as one built per call.
"""

from __future__ import annotations

import torch

from pope.settings import SETTINGS

from . import host, prepass

MAX_PHASE_TABLES = 32
MIN_PHASE_TABLE_ROWS = 1024


def phase_table(theta: torch.Tensor, head_dim: int, seq_k: int, dtype: torch.dtype, keep: bool) -> torch.Tensor:
    """(rows >= seq_k, 2 BLOCK_D) [cos | sin] of key positions 0..rows-1 in dtype. keep=True: from / into the kept
    tables (module docstring); keep=False: built for this call."""
    block_d = host.block_d(head_dim)
    if not keep:
        return build_phase_table(theta, head_dim, block_d, seq_k, dtype)
    rows = max(MIN_PHASE_TABLE_ROWS, host.next_power_of_2(seq_k))
    key = (theta.data_ptr(), theta.device, dtype, block_d, rows)
    tables = SETTINGS.caches.phase_tables
    entry = tables.get(key)
    if entry is not None and entry[0] is theta and entry[1] == theta._version:
        return entry[2]
    table = build_phase_table(theta, head_dim, block_d, rows, dtype)
    capturing = theta.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and key not in tables and len(tables) < MAX_PHASE_TABLES:
        tables[key] = (theta, theta._version, table)
    return table


def build_phase_table(theta, head_dim: int, block_d: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    ones = torch.ones((1, 1, 1, head_dim), device=theta.device, dtype=dtype).expand(1, 1, rows, head_dim)
    return prepass.transform(ones, theta, None, position_offset=0, magnitude="identity").view(rows, 2 * block_d)


def release_phase_tables() -> int:
    """Drop the key-phase tables eager decode calls kept (at most 2x the longest cache's table per theta and dtype,
    e.g. 64 MB for 128K keys at d=128 in bf16). Returns how many were dropped. Only when no captured CUDA graph
    still replays a decode call: such a graph reads a kept table's memory."""
    tables = SETTINGS.caches.phase_tables
    count = len(tables)
    tables.clear()
    return count

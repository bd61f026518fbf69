"""Runtime switches and caches of the attention operators and kernels, in one place.

    import pope.settings
    pope.settings.SETTINGS.direct_launch            # read a switch
    with pope.settings.override(poison_outputs=True):  # tests: set switches for a block, restored after
        ...
    pope.settings.clear_caches()                     # drop every cache below (returns how many entries)

Switches (`SETTINGS`, attributes of one object):
    poison_outputs          every buffer a kernel writes starts NaN-filled, so an element a kernel forgets to
                            write fails a check (tests, scripts/gpu_check.py)
    direct_launch           after a launch site's first call, call the compiled kernel directly instead of
                            through Triton's launch path (only on the Triton version pope.kernels.launch was
                            written for; False: always Triton's path)
    raw_launch              direct launches call the compiled C launcher, with the TMA descriptors' encodings
                            kept per buffer (False: Triton's Python launcher, encoding every call)
    eager_autograd_function eager calls take pope.ops' autograd.Function (less host time); False: the
                            torch.library operators, as compiled code does
    reuse_prepass           a differentiated call's forward keeps the pre-pass's q', k' for its backward, which
                            then runs one launch less (~6 |q| less memory traffic); the price: 2 |q| + 2 |k| more
                            saved per call until the backward (False: SDPA's saved set, q', k' made again)
    decode_lanes_max_rows   decode calls with up to this many query rows per key head take the CUDA-core
                            "lanes" kernel, more rows the tensor-core kernel

Caches (`SETTINGS.caches`): each maps a key to something computed once; `clear_caches()` empties them all.
A cleared cache is rebuilt on the next call, with one exception to mind: the decode key-phase tables
(`phase_tables`) may be read by a captured CUDA graph; clear them only when no such graph is replayed any more.
Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields


@dataclass
class Caches:
    """Every process-wide cache of the attention path (see each user for its key)."""

    direct_launches: dict = field(default_factory=dict)  # pope.kernels.launch: compiled kernels by launch site
    phase_tables: dict = field(default_factory=dict)  # pope.kernels.phase_tables: decode key-phase tables
    frequencies: dict = field(default_factory=dict)  # pope.ops: theta per (head dim, base, device), eager calls
    capabilities: dict = field(default_factory=dict)  # pope.kernels.capability: CUDA compute capability per device
    sm_counts: dict = field(default_factory=dict)  # pope.kernels.host: multiprocessors per device
    block_d: dict = field(default_factory=dict)  # pope.kernels.buffers: head dim -> tile channels
    tile_files: dict = field(default_factory=dict)  # pope.kernels.configs: parsed POPE_KERNEL_CONFIGS files
    tiles: dict = field(default_factory=dict)  # pope.kernels.configs: picked tiles per (kind, head dim, dtype, ...)

    def clear(self) -> int:
        count = 0
        for item in fields(self):
            cache = getattr(self, item.name)
            count += len(cache)
            cache.clear()
        return count


@dataclass
class Settings:
    """The switches (module docstring) and the caches. One instance: SETTINGS."""

    poison_outputs: bool = False
    direct_launch: bool = True
    raw_launch: bool = True
    eager_autograd_function: bool = True
    reuse_prepass: bool = True
    decode_lanes_max_rows: int = 1
    caches: Caches = field(default_factory=Caches)


SETTINGS = Settings()
_SWITCHES = {item.name: item.type for item in fields(Settings) if item.name != "caches"}


@contextlib.contextmanager
def override(**switches):
    """Set switches for the duration of a `with` block; the previous values come back after it, also on error.

    Unknown names are a TypeError, values of the wrong type (a bool switch given "no" or 1) a TypeError too."""
    for name, value in switches.items():
        if name not in _SWITCHES:
            raise TypeError(f"unknown setting {name!r}; the settings are {sorted(_SWITCHES)}")
        wanted = bool if _SWITCHES[name] in (bool, "bool") else int
        if type(value) is not wanted:
            raise TypeError(f"setting {name} takes a {wanted.__name__}; got {value!r}")
    previous = {name: getattr(SETTINGS, name) for name in switches}
    for name, value in switches.items():
        setattr(SETTINGS, name, value)
    try:
        yield SETTINGS
    finally:
        for name, value in previous.items():
            setattr(SETTINGS, name, value)


def clear_caches() -> int:
    """Empty every cache in SETTINGS.caches; returns how many entries were dropped (module docstring: the decode
    key-phase tables only when no captured CUDA graph still replays a decode call)."""
    return SETTINGS.caches.clear()


__all__ = ["SETTINGS", "Settings", "Caches", "override", "clear_caches"]

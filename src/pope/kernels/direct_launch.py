"""How kernels are launched: Triton's own launch path, or a direct path written for Triton 3.6 only.

One gate, DIRECT_PATH, says whether this Triton is the version the direct path was written for (3.6.x): the path
depends on Triton's private internals (the compiled launcher's argument layout `_BASE_ARGS_FORMAT`, the closure
of its TMA-descriptor wrapper, TensorDescriptor's dataclass fields). With the gate closed (any other version),
every launch goes through `kernel[grid](...)` and every TMA descriptor through TensorDescriptor's checked
constructor: slower on the host, never wrong.

With the gate open, `launch` takes Triton's path on a launch site's first call and afterwards calls the compiled
kernel directly (no argument binding, specialisation or cache lookup: several times the launch itself in host
time, what an eager call at short sequences and a compiled model's step in torch.compile's default mode wait
on); `RawLaunch` also skips Triton's Python launcher and keeps each TMA descriptor's encoding per buffer; and
`descriptor` builds descriptors without re-running TensorDescriptor's checks (the launchers describe only
tensors that pass them; the tests run the checks on every descriptor the launchers make). Guarantees: a direct
launch runs the same compiled kernel with the same arguments as Triton's path (CPU tests hold `RawLaunch`'s
arguments to Triton's own launcher code and `specialization_site` to Triton's own specialisation); the
interpreter, a launch hook (e.g. the proton profiler), site=None or pope.settings' direct_launch=False always
take Triton's path.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton

from pope.settings import SETTINGS

from .interpreter import INTERPRET

try:  # host-side TMA descriptors, passed to kernels as arguments: Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError as _error:
    raise ImportError(
        f"pope's fused kernels need Triton >= 3.4 (triton.tools.tensor_descriptor); found triton "
        f"{triton.__version__}: pip install -U 'triton>=3.4'"
    ) from _error

WRITTEN_FOR = (3, 6)  # the Triton release (major, minor) whose internals the direct path knows


def written_for(version: str) -> bool:
    """Whether a Triton version string is the release the direct path was written for (3.6.x)."""
    parts = version.split(".")
    return len(parts) >= 3 and parts[:2] == [str(n) for n in WRITTEN_FOR]


DIRECT_PATH = written_for(triton.__version__) and hasattr(triton, "knobs")
# Compiled kernels by launch site are kept in pope.settings' caches (direct_launches), at most this many: a site
# key that changes with every call would grow it forever, so decode launches (the cache grows a key a step) key
# their sites by what Triton specialises on (specialization_site), not by shapes.
MAX_DIRECT_LAUNCHES = 512


def specialization_site(tag: str, args: tuple, meta: dict) -> tuple:
    """A launch-site key (launch) for calls whose shapes change every call (decode: the cache grows a key a step),
    so that a plan key (plan: shapes, strides) would never repeat: what Triton 3.6 specialises the compiled kernel on
    and nothing else, i.e. per tensor its dtype and 16-byte alignment, per int whether it is 1 (a constant then),
    divisible by 16, and which integer type holds it (i32 / i64 / u64), bools and floats by type, None as such;
    plus the constexprs and launch options. A CPU test holds it to Triton's own specialisation
    (native_specialize_impl): calls with equal keys run the same compiled kernel."""
    # One expression per argument, no calls beyond the tensor's own: this runs on every decode launch.
    key = tuple(
        (x.dtype, not x.data_ptr() & 15)
        if isinstance(x, torch.Tensor)
        else (x == 1, not x & 15, -2147483648 <= x < 2147483648, x < 9223372036854775808)
        if type(x) is int
        else type(x)
        for x in args
    )
    return tag, key, tuple(meta.items())


def launch(kernel, grid: tuple, site: tuple | None, args: tuple, **meta):
    """kernel[grid](*args, **meta). After the first launch of a site (plan key + launch-site tag), the compiled
    kernel is called directly: Triton's launch path (binding and specialising ~30 arguments, cache lookup,
    checks) costs several times the launch itself in host time, which is what an eager call at short
    sequences waits on (docs/kernels.md, host overhead), and so does a compiled model's step in torch.compile's
    default mode. Where it can (RawLaunch), the direct call skips Triton's Python launcher as well and reuses each
    TMA descriptor's encoding. site=None (or the interpreter, or a Triton launch hook) always takes Triton's path."""
    if site is None or not DIRECT_PATH or not SETTINGS.direct_launch or INTERPRET or launch_hooks_active():
        return kernel[grid](*args, **meta)
    device = torch.cuda.current_device()  # Triton launches on the current device, and loads kernels per device
    key = (kernel, site, grid, device)
    launches = SETTINGS.caches.direct_launches
    entry = launches.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **meta)
        if len(launches) >= MAX_DIRECT_LAUNCHES:
            launches.clear()
        # The compiled launcher takes every kernel parameter in order, constexprs included (it skips them).
        constants = tuple(meta[name] for name in kernel.arg_names[len(args) :])
        raw = RawLaunch.of(compiled) if SETTINGS.raw_launch else None
        launches[key] = (compiled.run, compiled.function, compiled.packed_metadata, constants, dict(meta), raw)
        return compiled
    run, function, packed_metadata, constants, first_meta, raw = entry
    if meta != first_meta:  # a config changed (a tile override): not the kernel that was compiled
        del launches[key]
        return launch(kernel, grid, site, args, **meta)
    stream = current_stream(device)
    grid_y = grid[1] if len(grid) > 1 else 1
    if raw is not None:
        raw(grid[0], grid_y, stream, function, packed_metadata, args + constants)
    else:
        run(grid[0], grid_y, 1, stream, function, packed_metadata, None, None, None, *args, *constants)
    return None


class RawLaunch:
    """A compiled kernel's C launcher, called without Triton's Python layers around it: CudaLauncher.__call__
    (scratch allocation, here none) and the wrapper that expands each host-side TensorDescriptor into
    (CUtensorMap, shape, strides) by encoding a fresh tensor map on every launch (`make_tensordesc_arg`,
    cuTensorMapEncodeTiled). Here each expansion is kept per (parameter, base pointer, shape, strides): within one
    launch site the caching allocator hands back the same buffers call after call, so a training step re-encodes
    nothing. Safe to reuse: the map holds only what the key holds, and the launcher copies it into the launch's
    parameters by value. The expansion itself is Triton's (`make_tensordesc_arg`), made on a miss.

    `of` returns None (the caller keeps Triton's launcher) unless the launcher is what this knows: Triton 3.6's
    CudaLauncher, no scratch memory, one CTA per program, and its `launch` either the C launcher itself (no
    descriptors) or the descriptor wrapper, recognised by its closure (launcher, signature indices, metadata), with
    every descriptor lowered to a CUtensorMap (nvTmaDesc). A CPU test holds the expansion to the wrapper's."""

    MAX_ENCODINGS = 64  # per launch site; cleared when full (pointers that keep changing)

    def __init__(self, c_launch, cooperative, pdl, descriptor_params, expand):
        self.c_launch = c_launch
        self.cooperative = cooperative
        self.pdl = pdl
        self.descriptor_params = descriptor_params  # ((parameter index, Triton's descriptor metadata), ...) in order
        self.expand = expand  # triton's make_tensordesc_arg(descriptor, metadata) -> [tensor map, *shape, *strides]
        self.encodings: dict = {}

    @classmethod
    def of(cls, compiled):
        try:  # Triton's NVIDIA launcher internals: where they are absent or differ, Triton's normal launch
            from triton.backends.nvidia import driver
        except ImportError:
            return None
        launcher = getattr(compiled, "run", None)
        if (
            not isinstance(launcher, getattr(driver, "CudaLauncher", ()))
            or getattr(driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO"  # the leading arguments, below
            or getattr(launcher, "global_scratch_size", 1)
            or getattr(launcher, "profile_scratch_size", 1)
            or getattr(launcher, "num_ctas", 1) != 1
        ):
            return None
        c_launch, descriptor_params, expand = launcher.launch, (), None
        closure = getattr(c_launch, "__closure__", None)
        if closure is not None:  # wrap_handle_tensordesc's wrapper around the C launcher: expand here instead
            cells = dict(zip(c_launch.__code__.co_freevars, (cell.cell_contents for cell in closure)))
            if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
                return None
            indices, metadata = sorted(cells["tensordesc_indices"]), list(cells["tensordesc_meta"] or ())
            if len(indices) != len(metadata) or any(m is None for m in metadata):
                return None  # descriptors passed decomposed (no TMA lowering): Triton's path
            c_launch, descriptor_params, expand = (
                cells["launcher"],
                tuple(zip(indices, metadata)),
                driver.make_tensordesc_arg,
            )
        return cls(c_launch, launcher.launch_cooperative_grid, launcher.launch_pdl, descriptor_params, expand)

    def expanded_args(self, params: tuple) -> list:
        """The kernel parameters as the C launcher takes them: each descriptor replaced by its expansion."""
        out, start = [], 0
        for index, metadata in self.descriptor_params:
            out.extend(params[start:index])
            descriptor = params[index]
            key = (index, descriptor.base.data_ptr(), tuple(descriptor.shape), tuple(descriptor.strides))
            expansion = self.encodings.get(key)
            if expansion is None:
                if len(self.encodings) >= self.MAX_ENCODINGS:
                    self.encodings.clear()
                expansion = self.encodings[key] = self.expand(descriptor, metadata)
            out.extend(expansion)
            start = index + 1
        out.extend(params[start:])
        return out

    def __call__(self, grid_x, grid_y, stream, function, packed_metadata, params: tuple):
        # The C launcher's leading arguments (Triton 3.6, driver._BASE_ARGS_FORMAT): grid, stream, function,
        # cooperative, PDL, global and profile scratch, metadata, launch metadata, enter and exit hooks.
        self.c_launch(
            grid_x,
            grid_y,
            1,
            stream,
            function,
            self.cooperative,
            self.pdl,
            None,
            None,
            packed_metadata,
            None,
            None,
            None,
            *self.expanded_args(params),
        )


def launch_hooks_active() -> bool:
    """A launch hook (e.g. Triton's proton profiler) wants to see launches: Triton 3.6 keeps hook chains that
    are empty when unused, older versions None."""
    if not hasattr(triton, "knobs"):  # an older Triton: take its own launch path
        return True
    runtime = triton.knobs.runtime
    return any(
        hook is not None and bool(getattr(hook, "calls", True))
        for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


def current_stream(device: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device)


def unchecked_descriptor(base, shape: list, strides: list, block_shape: list) -> TensorDescriptor:
    """TensorDescriptor(base, shape, strides, block_shape) without its __post_init__ checks (alignment, strides,
    block shape: ~5 us of host time each, six descriptors per eager forward+backward). The launchers describe only
    tensors that pass them (tma_ready's layouts and their own buffers); the tests run the checks on every
    descriptor the launchers make."""
    descriptor = object.__new__(TensorDescriptor)
    descriptor.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block_shape, padding="zero")
    return descriptor


def unchecked_descriptors_work() -> bool:
    """Whether this Triton's TensorDescriptor is the dataclass unchecked_descriptor knows (same fields, same
    values as its constructor gives); if not, descriptors are made the checked way."""
    try:
        names = tuple(field.name for field in dataclasses.fields(TensorDescriptor))
        probe = torch.zeros(4, 8)
        made = unchecked_descriptor(probe, [4, 8], [8, 1], [4, 8])
        checked = TensorDescriptor(probe, [4, 8], [8, 1], [4, 8])
    except Exception:
        return False
    return names == ("base", "shape", "strides", "block_shape", "padding") and all(
        getattr(made, name) is getattr(checked, name) or getattr(made, name) == getattr(checked, name) for name in names
    )


UNCHECKED_DESCRIPTORS = DIRECT_PATH and unchecked_descriptors_work()  # behind the one gate


def same_tiles(made: TensorDescriptor, t: torch.Tensor, block_shape: list) -> TensorDescriptor:
    """made (a descriptor of t) when its tiles are block_shape, else a new descriptor of t in those tiles."""
    return made if made.block_shape == block_shape else descriptor(t, block_shape)


# cp.async.bulk.tensor needs its shared-memory destination 128-byte aligned, and Triton 3.6 lays the stages of a
# pipelined TMA load's buffer end to end at the box's size: a box that is not a multiple of 128 bytes puts a stage
# at a misaligned address ("misaligned address" on the GPU; the interpreter checks no alignment).
TMA_SHARED_ALIGNMENT = 128


def descriptor(t: torch.Tensor, block_shape: list) -> TensorDescriptor:
    """A host-side TMA descriptor of t, copied tile by tile in block_shape; a tile's part outside t reads as
    zeros. Strides of size-1 dims are meaningless and may be unaligned: they are replaced by aligned ones.
    Raises ValueError for a box (block_shape) that is not a multiple of TMA_SHARED_ALIGNMENT bytes."""
    box_bytes = t.element_size() * math.prod(block_shape)
    if box_bytes % TMA_SHARED_ALIGNMENT:
        raise ValueError(
            f"a TMA box {list(block_shape)} of {t.dtype} is {box_bytes} bytes, not a multiple of "
            f"{TMA_SHARED_ALIGNMENT}: its pipeline stages would sit at misaligned shared-memory "
            f"addresses (a CUDA 'misaligned address' fault); use larger tiles"
        )
    strides = list(t.stride())
    for i in range(t.dim() - 2, -1, -1):
        if t.shape[i] == 1:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    if UNCHECKED_DESCRIPTORS:
        return unchecked_descriptor(t, list(t.shape), strides, list(block_shape))
    return TensorDescriptor(t, list(t.shape), strides, list(block_shape))

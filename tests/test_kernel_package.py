"""The kernel package's host side, no kernel run needed: pope.settings (switches, override, clear_caches), the
magnitude registry, tile configurations (frozen tables, the POPE_KERNEL_CONFIGS file), the direct-launch gate (both
branches), and scripts/kernel_bitwise_ab.py's comparison."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():  # as tests/kernel_fixtures.py: Triton's first import in interpreter mode
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the Triton kernels need pip install 'pope-attention[triton]'")

import pope.settings  # noqa: E402
from pope.magnitudes import MAGNITUDES, magnitude  # noqa: E402
from pope.settings import SETTINGS, clear_caches, override  # noqa: E402
from pope.testing import RecordingKernel  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def test_override_sets_switches_for_a_block_and_restores_them():
    assert SETTINGS.poison_outputs is False and SETTINGS.direct_launch is True
    with override(poison_outputs=True, direct_launch=False) as settings:
        assert settings is SETTINGS and SETTINGS.poison_outputs and not SETTINGS.direct_launch
    assert SETTINGS.poison_outputs is False and SETTINGS.direct_launch is True
    with pytest.raises(RuntimeError), override(decode_lanes_max_rows=4):
        assert SETTINGS.decode_lanes_max_rows == 4
        raise RuntimeError("restored on error too")
    assert SETTINGS.decode_lanes_max_rows == 1


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(poison=True), "unknown setting"),
        (dict(poison_outputs="no"), "takes a bool"),
        (dict(direct_launch=1), "takes a bool"),
        (dict(decode_lanes_max_rows=True), "takes a int"),
    ],
)
def test_override_refuses_unknown_names_and_wrong_types(changes, message):
    before = {name: getattr(SETTINGS, name) for name in ("poison_outputs", "direct_launch", "decode_lanes_max_rows")}
    with pytest.raises(TypeError, match=message), override(**changes):
        pass
    assert {name: getattr(SETTINGS, name) for name in before} == before


def test_clear_caches_empties_every_cache():
    from pope.kernels import host

    host.block_d(48)
    caches = SETTINGS.caches
    caches.frequencies["probe"] = 1
    caches.phase_tables["probe"] = 2
    assert clear_caches() >= 3
    assert all(not getattr(caches, name) for name in vars(caches))
    assert pope.settings.clear_caches() == 0


def test_operators_keep_their_frequencies_in_the_settings_cache():
    from pope.ops import fused as ops

    clear_caches()
    theta = ops._theta(16, 10000.0, torch.device("cpu"))
    assert ops._theta(16, 10000.0, torch.device("cpu")) is theta and len(SETTINGS.caches.frequencies) == 1
    clear_caches()
    assert ops._theta(16, 10000.0, torch.device("cpu")) is not theta


def test_magnitude_registry_is_the_one_list():
    import pope.attention
    from pope.encodings import PoPE

    assert list(MAGNITUDES) == ["softplus", "relu", "identity"]
    assert [m.kernel_code for m in MAGNITUDES.values()] == [0, 1, 2]  # jit_math._magnitude's branches
    x = torch.linspace(-3, 3, 13)
    assert torch.equal(MAGNITUDES["softplus"](x), torch.nn.functional.softplus(x))
    assert torch.equal(MAGNITUDES["relu"](x), torch.relu(x)) and MAGNITUDES["identity"](x) is x
    assert pope.attention.MAGNITUDES is MAGNITUDES  # what the reference and the modules use
    with pytest.raises(ValueError, match="choose one of"):
        magnitude("exp")
    # A plain dict, not a read-only mapping: torch.compile (2.11) breaks the graph on membership in a mappingproxy.
    assert type(MAGNITUDES) is dict
    with pytest.raises(ValueError, match="unknown PoPE magnitude"):
        PoPE(n_heads=1, n_kv_heads=1, head_dim=4, magnitude="exp")


def test_tile_tables_are_frozen_and_keyed_by_architecture_bucket_dtype_and_precision(monkeypatch):
    from pope.kernels import configs

    monkeypatch.setattr(configs, "INTERPRET", False)
    monkeypatch.delenv("POPE_KERNEL_CONFIGS", raising=False)
    table = configs.TILES["fwd"]
    assert table[("sm_90", 64, torch.bfloat16)] == (128, 64, 8, 3) == table[("sm_90", 128, torch.float16)]
    assert table[("sm_90", 64, torch.float32)] == (32, 32, 4, 1)
    with pytest.raises(TypeError):
        table[("sm_90", 64, torch.bfloat16)] = (16, 16, 4, 1)
    with pytest.raises(TypeError):
        configs.TILES["fwd"] = {}
    for arch in ("sm_90", "sm_80", "sm_120"):  # unmeasured architectures take the measured tiles
        monkeypatch.setattr(configs, "architecture", lambda device, arch=arch: arch)
        assert configs.pick_tiles("dq", 48, None, torch.bfloat16, "cuda", "tf32") == (64, 64, 4, 3)  # d=48: bucket 64
        assert configs.pick_tiles("dq", 96, None, torch.bfloat16, "cuda", "tf32") == (128, 32, 8, 3)
        assert configs.pick_tiles("dkdv", 128, None, torch.float32, "cuda", "tf32") == (16, 32, 4, 1)
        # fp32 with tf32x3 dots: a tile per kernel; with TF32 or exact dots, the shared fp32 tiles
        assert configs.pick_tiles("dkdv", 128, None, torch.float32, "cuda", "tf32x3") == (32, 16, 8, 1)
        assert configs.pick_tiles("fwd", 64, None, torch.float32, "cuda", "tf32x3") == (64, 16, 4, 1)
        assert configs.pick_tiles("fwd", 64, None, torch.float32, "cuda", "ieee") == (32, 32, 4, 1)
        assert configs.pick_tiles("dq", 64, None, torch.bfloat16, "cuda", "tf32x3") == (64, 64, 4, 3)  # 16-bit: TILES
    with pytest.raises(TypeError):
        configs.TF32X3_TILES["dq"][("sm_90", 64)] = (16, 16, 4, 1)
    assert configs.pick_tiles("dq", 64, (16, 16, 4, 1), torch.bfloat16, "cuda", "tf32") == (16, 16, 4, 1)  # explicit
    monkeypatch.setattr(configs, "INTERPRET", True)
    assert configs.pick_tiles("fwd", 128, None, torch.bfloat16, "cpu", "tf32") == configs.INTERPRETER_TILES


def test_tile_override_file_is_read_when_a_config_is_picked(monkeypatch, tmp_path):
    from pope.kernels import configs

    monkeypatch.setattr(configs, "INTERPRET", False)
    monkeypatch.setattr(configs, "architecture", lambda device: "sm_90")
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"dkdv": {"128": [32, 64, 4, 2]}}))
    monkeypatch.setenv("POPE_KERNEL_CONFIGS", str(path))
    assert configs.pick_tiles("dkdv", 128, None, torch.bfloat16, "cuda", "tf32") == (32, 64, 4, 2)
    assert configs.pick_tiles("dkdv", 64, None, torch.bfloat16, "cuda", "tf32") == (64, 64, 4, 3)  # not in the file
    assert configs.pick_tiles("dkdv", 128, None, torch.float32, "cuda", "tf32") == (16, 32, 4, 1)  # fp32 keeps its own
    assert configs.TILES["dkdv"][("sm_90", 128, torch.bfloat16)] == (64, 64, 8, 3)  # the table is unchanged
    monkeypatch.delenv("POPE_KERNEL_CONFIGS")
    assert configs.pick_tiles("dkdv", 128, None, torch.bfloat16, "cuda", "tf32") == (64, 64, 8, 3)
    for text, message in (
        ('{"bwd": {}}', "unknown kernel"),
        ('{"fwd": {"32": [1, 2, 3, 4]}}', "bucket 64/128"),
        ('{"fwd": {"64": [128, 64, 8]}}', "BLOCK_M"),
        ("not json", "cannot read"),
    ):
        bad = tmp_path / f"bad{len(text)}.json"
        bad.write_text(text)
        monkeypatch.setenv("POPE_KERNEL_CONFIGS", str(bad))
        with pytest.raises(ValueError, match=message):
            configs.pick_tiles("fwd", 64, None, torch.bfloat16, "cuda", "tf32")
    monkeypatch.setenv("POPE_KERNEL_CONFIGS", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="missing.json"):
        configs.pick_tiles("fwd", 64, None, torch.bfloat16, "cuda", "tf32")


def test_decode_lanes_register_cap_variable_is_checked(monkeypatch):
    """POPE_DECODE_LANES_MAXNREG (read at import): unset -> no cap; a register count -> that cap; anything else a
    ValueError naming the variable."""
    from pope.kernels import configs

    variable = configs.DECODE_LANES_MAXNREG_VARIABLE
    monkeypatch.delenv(variable, raising=False)
    assert configs._register_cap(variable) is None
    monkeypatch.setenv(variable, "128")
    assert configs._register_cap(variable) == 128
    for text in ("12x", "300", "-1"):
        monkeypatch.setenv(variable, text)
        with pytest.raises(ValueError, match=variable):
            configs._register_cap(variable)


def _direct_launch(monkeypatch, gate_open: bool):
    from pope.kernels import direct_launch

    monkeypatch.setattr(direct_launch, "DIRECT_PATH", gate_open)
    monkeypatch.setattr(direct_launch, "INTERPRET", False)
    monkeypatch.setattr(direct_launch, "current_stream", lambda device: 7)
    monkeypatch.setattr(SETTINGS.caches, "direct_launches", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return direct_launch


def test_gate_is_the_exact_triton_release_the_direct_path_was_written_for():
    import triton

    from pope.kernels import direct_launch

    assert [direct_launch.written_for(v) for v in ("3.6.0", "3.6.1", "3.6.0+git1234")] == [True] * 3
    assert not any(direct_launch.written_for(v) for v in ("3.5.1", "3.7.0", "4.6.0", "3.60.0", "3.6", ""))
    assert direct_launch.DIRECT_PATH == direct_launch.written_for(triton.__version__)


def test_gate_open_launches_directly_after_the_first_call(monkeypatch):
    direct_launch = _direct_launch(monkeypatch, gate_open=True)
    kernel, x = RecordingKernel(["X", "n", "BLOCK"]), torch.zeros(2)
    for _ in range(3):
        direct_launch.launch(kernel, (4,), ("site",), (x, 3), BLOCK=16, num_warps=4)
    assert kernel.triton_launches == 1 and len(kernel.compiled.calls) == 2
    with override(direct_launch=False):  # the switch sends every launch through Triton
        direct_launch.launch(kernel, (4,), ("site",), (x, 3), BLOCK=16, num_warps=4)
    assert kernel.triton_launches == 2


def test_gate_closed_takes_tritons_launch_path_and_checked_descriptors(monkeypatch):
    direct_launch = _direct_launch(monkeypatch, gate_open=False)
    monkeypatch.setattr(direct_launch, "UNCHECKED_DESCRIPTORS", False)
    kernel, x = RecordingKernel(["X", "n", "BLOCK"]), torch.zeros(2)
    for _ in range(3):
        direct_launch.launch(kernel, (4,), ("site",), (x, 3), BLOCK=16, num_warps=4)
    assert kernel.triton_launches == 3 and kernel.compiled.calls == [] and not SETTINGS.caches.direct_launches
    checked = []
    original = direct_launch.TensorDescriptor.__post_init__

    def post_init(self):
        checked.append(self)
        return original(self)

    monkeypatch.setattr(direct_launch.TensorDescriptor, "__post_init__", post_init)
    made = direct_launch.descriptor(torch.zeros(4, 64, dtype=torch.bfloat16), [1, 64])
    assert checked == [made]  # built by TensorDescriptor's own constructor, its checks run


def test_gate_decides_the_unchecked_descriptors_at_import():
    from pope.kernels import direct_launch

    assert direct_launch.UNCHECKED_DESCRIPTORS == (
        direct_launch.DIRECT_PATH and direct_launch.unchecked_descriptors_work()
    )


def test_bitwise_ab_comparison_reports_every_difference():
    spec = importlib.util.spec_from_file_location(
        "kernel_bitwise_ab", os.path.join(ROOT, "scripts", "kernel_bitwise_ab.py")
    )
    ab = importlib.util.module_from_spec(spec)
    sys.modules["kernel_bitwise_ab"] = ab
    spec.loader.exec_module(ab)
    same = torch.tensor([1.0, -0.0, float("nan")])
    old = {"case": {"out": same, "dq": torch.ones(2), "dk": torch.ones(2)}}
    new = {"case": {"out": same.clone(), "dq": torch.tensor([1.0, 1.0 + 2**-20]), "dv": torch.ones(2)}}
    rows = {r["tensor"]: r for r in ab.compare(old, new)}
    assert rows["out"]["equal"]  # NaN bits equal, and -0.0 is compared as bits
    assert not rows["dq"]["equal"] and rows["dq"]["max_abs_diff"] > 0
    assert not rows["dk"]["equal"] and not rows["dv"]["equal"]  # missing in one tree
    signed = ab.compare({"c": {"x": torch.tensor([0.0])}}, {"c": {"x": torch.tensor([-0.0])}})
    assert not signed[0]["equal"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dot_precision_follows_torchs_float32_matmul_precision(monkeypatch, dtype):
    """fp32 inputs: fp32-accurate dots ("tf32x3", three TF32 tensor-core products) at PyTorch's default "highest",
    TF32 at "high" / "medium", as torch.matmul; 16-bit inputs: tensor cores either way. The precision is part of
    each launch site's plan key, so a site compiled under one setting is never reused under another."""
    from pope.kernels import bwd, fwd, host

    launches = []  # (site, PRECISION) of the attention kernels; nothing runs
    monkeypatch.setattr(
        fwd.direct_launch,
        "launch",
        lambda kernel, grid, site, args, **meta: launches.append((site, meta.get("PRECISION"))),
    )
    q, k, v = (torch.randn(1, 2, 16, 32, dtype=dtype) for _ in range(3))
    theta = torch.ones(32)
    before = torch.get_float32_matmul_precision()
    try:
        for setting in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(setting)
            expected = "tf32x3" if dtype == torch.float32 and setting == "highest" else "tf32"
            assert host.precision(dtype, q.device) == expected
            launches.clear()
            fwd.forward(q, k, v, None, theta, causal=True, softmax_scale=0.1, q_offset=0, magnitude="softplus")
            bwd.backward(
                q,
                q,
                k,
                v,
                None,
                q,
                torch.zeros(1, 2, 16),
                theta,
                causal=True,
                softmax_scale=0.1,
                q_offset=0,
                magnitude="softplus",
            )
            kernel_launches = [(site, p) for site, p in launches if p is not None]
            assert len(kernel_launches) == 3 and {p for _, p in kernel_launches} == {expected}, kernel_launches
            if setting == "highest":
                sites_exact = {site for site, _ in kernel_launches}
            elif setting == "high":
                sites_tf32 = {site for site, _ in kernel_launches}
                assert sites_tf32.isdisjoint(sites_exact) == (dtype == torch.float32)
    finally:
        torch.set_float32_matmul_precision(before)


def test_fp32_dots_are_exact_on_gpus_without_tf32_tensor_cores(monkeypatch):
    """A CUDA GPU before Ampere (compute capability < 8.0) has no TF32 tensor cores: fp32 inputs get exact FMA dots
    ("ieee") at every float32 matmul precision; one with them gets tf32x3 at "highest" and TF32 at "high"."""
    from pope.kernels import host

    before = torch.get_float32_matmul_precision()
    gpu = torch.device("cuda", 0)
    try:
        for capability, expected in (
            ((7, 5), {"highest": "ieee", "high": "ieee"}),
            ((8, 0), {"highest": "tf32x3", "high": "tf32"}),
        ):
            monkeypatch.setattr(host, "cuda_capability", lambda device, capability=capability: capability)
            for setting, dots in expected.items():
                torch.set_float32_matmul_precision(setting)
                assert host.precision(torch.float32, gpu) == dots, (capability, setting)
                assert host.precision(torch.bfloat16, gpu) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)

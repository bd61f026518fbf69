"""The bwd-autows experiment (benchmarks/experiments/2026-12-01-bwd-autows): the backward's dq and dk/dv kernels
written as one loop over blocks masking every block, tagged for Triton 3.6's automatic Hopper warp specialisation.

Through the interpreter (which ignores warp_specialize): dq, dk, dv and d(delta) within 2x plain PyTorch's error
against float64 (bf16, causal and not, odd lengths, GQA with Nq < Nk, d = 32 / 64 / 128), and bitwise equal to the
shipped kernels' (same formulas, same accumulation order), outputs NaN-poisoned. Compile-only for sm_90a: the tagged
dk/dv kernel becomes a warp-specialised kernel at 4 warps; the tagged dq kernel does not (the pass fails) and
neither does anything at 8 warps."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pope.testing import kernel_test_setup  # before anything imports Triton

ON_GPU, DEVICE, INTERPRETER_IN_PROCESS = kernel_test_setup()

from pope.attention import reference_pope_attention  # noqa: E402
from pope.settings import override  # noqa: E402
from pope.testing import GRADIENT_NAMES, attention_inputs, check_within_rule, outputs_and_gradients  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
HERE = os.path.join(ROOT, "benchmarks", "experiments", "2026-12-01-bwd-autows")


def _triton(q, k, v, delta, **options):
    from pope.ops import triton_pope_attention

    return triton_pope_attention(q, k, v, delta, **options)


CASES = [  # (batch, Hq, Hkv, Nq, Nk, d, causal)
    pytest.param(1, 2, 2, 37, 37, 32, True, id="causal-37-d32"),
    pytest.param(1, 4, 2, 37, 97, 64, True, id="gqa-causal-Nq<Nk-d64"),
    pytest.param(2, 2, 1, 50, 50, 64, False, id="mqa-noncausal-50-d64"),
    pytest.param(1, 2, 1, 40, 40, 128, True, id="causal-40-d128"),
]


@pytest.mark.skipif(not INTERPRETER_IN_PROCESS or ON_GPU,
                    reason="CPU interpreter test (on a GPU: the experiment's gpu_check.py)")
@pytest.mark.parametrize("batch,n_q_heads,n_kv_heads,seq_q,seq_k,head_dim,causal", CASES)
def test_one_loop_backward_within_twice_pytorch_error_and_equal_to_shipped(
        monkeypatch, batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal):
    sys.path.insert(0, HERE)
    import autows_bwd

    launched = []
    launch = autows_bwd._WithConstexprs.__getitem__
    monkeypatch.setattr(autows_bwd._WithConstexprs, "__getitem__",
                        lambda self, grid: launched.append(self.kernel.fn.__name__) or launch(self, grid))

    generator = torch.Generator().manual_seed(seq_q * 100 + head_dim)
    q, k, v, delta, grad_out = attention_inputs(batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim,
                                                generator=generator)
    options = dict(base=10000.0, causal=causal, softmax_scale=head_dim ** -0.5, q_offset=seq_k - seq_q,
                   magnitude="softplus", rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    plain = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    with override(poison_outputs=True):
        shipped = outputs_and_gradients(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
        with autows_bwd.experimental_kernels():
            ours = outputs_and_gradients(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    assert launched == ["_autows_dq_kernel", "_autows_dkdv_kernel"], launched
    for name, mine, theirs, truth, base in zip(GRADIENT_NAMES, ours, plain, exact, shipped):
        errors = check_within_rule(mine, theirs, truth, torch.bfloat16)
        assert errors["ok"], f"{name}: error {errors['kernel']:.3e} > 2 x PyTorch bf16's {errors['reference']:.3e}"
        assert torch.equal(mine, base), f"{name}: differs from the shipped kernels' ({(mine - base).abs().max()})"


def test_automatic_warp_specialisation_engages_on_dkdv_only_at_four_warps():
    """Compile-only for sm_90a (compile_study.py --quick, d = 64): the one-loop dk/dv kernel at (64, 64, 4, 3) is a
    12-warp warp-specialised kernel (two consumer partitions asking for 232 registers each, setmaxnreg in the PTX,
    no spills); the one-loop dq kernel at 4 warps is not (Triton 3.6's pass fails on it), nor at 8 warps."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # it compiles
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    run = subprocess.run([sys.executable, os.path.join(HERE, "compile_study.py"), "--quick"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {(row["kernel"], row["tile"][2]): row for row in map(json.loads, run.stdout.splitlines())}
    dkdv = rows["dkdv", 4]
    assert dkdv["warp_specialize_op"] and dkdv["warps"] == 12 and dkdv["requested_registers"] == [232, 232], dkdv
    assert dkdv["setmaxnreg"] and dkdv["spill_stores_B"] == 0 and dkdv["atomics"] == 0, dkdv
    assert "error" in rows["dq", 4] or not rows["dq", 4]["warp_specialize_op"], rows["dq", 4]
    assert not rows["dq", 8]["warp_specialize_op"] and rows["dq", 8]["warps"] == 8, rows["dq", 8]


@pytest.mark.skipif(not INTERPRETER_IN_PROCESS or ON_GPU,
                    reason="CPU interpreter test (on a GPU: the experiment's gpu_check.py)")
def test_gpu_check_variants_pass_on_cpu():
    """gpu_check.py's correctness group, run on small CPU shapes through the interpreter: every variant (incl. the
    4-warp dk/dv tiles and, at d = 128, the dk/dv key block from k' by TMA) meets the 2x rule and is deterministic."""
    sys.path.insert(0, HERE)
    sys.modules.pop("gpu_check", None)  # another experiment's gpu_check.py may be imported under the same name
    import gpu_check

    rows = gpu_check.check([(1, 2, 2, 70, 70, 64, True), (1, 2, 1, 45, 45, 128, False)], "cpu")
    assert len(rows) == 2 * len(gpu_check.VARIANTS)
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]


@pytest.mark.skipif(not INTERPRETER_IN_PROCESS or ON_GPU,
                    reason="CPU interpreter test (on a GPU: the experiment's gpu_check.py)")
def test_gpu_check_timing_group_checks_the_candidate_on_its_timing_inputs_first(monkeypatch):
    """gpu_check.time_shape (what the lease's candidate step runs) at a tiny GQA d = 128 shape through the
    interpreter: the shipped backward and the one-loop dk/dv candidate are checked on the timing inputs (2x rule
    against float64 on the first key head's group, deterministic, bitwise the shipped kernels' here), the candidate's
    experimental dk/dv kernel is the one launched, and then each is timed (whole backward, dq and dk/dv alone)."""
    sys.path.insert(0, HERE)
    sys.modules.pop("gpu_check", None)
    import autows_bwd
    import gpu_check

    launched = []
    launch = autows_bwd._WithConstexprs.__getitem__
    monkeypatch.setattr(autows_bwd._WithConstexprs, "__getitem__",
                        lambda self, grid: launched.append(self.kernel.fn.__name__) or launch(self, grid))
    rows = gpu_check.time_shape("time-1x4x2x33x128", ["one-loop-dkdv"], device="cpu")
    checks = [row for row in rows if "ok" in row]
    timings = [row for row in rows if "backward_ms" in row]
    assert [row["variant"] for row in checks] == ["shipped", "one-loop-dkdv"]
    assert all(row["ok"] and row["deterministic"] and row["bitwise_equal_to_shipped"] for row in checks), checks
    assert all(row[name]["reference"] > 0 for row in checks for name in ("dq", "dk", "dv", "d_delta"))
    assert set(launched) == {"_autows_dkdv_kernel"}, launched  # the candidate ran; dq stayed the shipped kernel
    assert [row["variant"] for row in timings] == ["shipped", "one-loop-dkdv"]
    assert all(row[key] > 0 for row in timings for key in ("backward_ms", "dq_ms", "dkdv_ms")), timings
    assert "0.00x" not in gpu_check.table(rows) and "one-loop-dkdv" in gpu_check.table(rows)


def test_gpu_check_refuses_unknown_variants_and_groups():
    sys.path.insert(0, HERE)
    sys.modules.pop("gpu_check", None)
    import gpu_check

    with pytest.raises(SystemExit, match=r"unknown variant\(s\) \['fast'\]"):
        gpu_check.main(["--out", "unused", "--variants", "shipped,fast"])
    with pytest.raises(SystemExit, match="unknown group 'time-4x16'"):
        gpu_check.main(["--out", "unused", "--groups", "time-4x16"])
    assert gpu_check.timing_shape("time-2x32x8x4096x128") == (2, 32, 8, 4096, 128)
    assert gpu_check.timing_shape("time-4x16x4096x128") == (4, 16, 16, 4096, 128)

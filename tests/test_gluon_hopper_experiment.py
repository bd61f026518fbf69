"""The Gluon Hopper experiment (benchmarks/experiments/2026-12-01-gluon-hopper) still compiles for sm_90a on a CPU
machine, with the Hopper machinery its README describes: the warp-specialised forms re-allocate registers per
partition (setmaxnreg 240 for the consumers, 24 for the producer), both forms run their products on wgmma (64x64 for
S = q'k'^T over 256 channels, 64x128 for O += P v) and load by TMA into mbarrier-tracked stages, nothing spills, the
shared memory fits one program per SM, and only the plain form has whole-CTA barriers in its key loops (the
warp-specialised consumers sync their own warpgroup only). Compile-only: says nothing about correctness or speed
(the experiment's gpu_check.py does, on a GPU)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this Triton has no Gluon Hopper API")

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
SCRIPT = os.path.join(ROOT, "benchmarks", "experiments", "2026-12-01-gluon-hopper", "compile_report.py")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("gluon") / "report.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # it compiles, for sm_90a
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    run = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--json", str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return {row["variant"]: row for row in json.loads(out.read_text())}


def test_both_forms_use_wgmma_and_tma_without_spills(rows):
    for _variant, row in rows.items():
        assert row["spill_stores_B"] == 0 and row["spill_loads_B"] == 0, row
        assert not row["ptxas_warnings"], row  # e.g. ptxas serialising the async wgmma
        assert row["sass_spill_instr_in_loops"] == 0 and row["sass_spill_instr_outside"] == 0, row
        assert row["fits_shared"], row
        assert set(row["sass_hgmma"]) == {"HGMMA.64x64x16.F32.BF16", "HGMMA.64x128x16.F32.BF16"}, row
        assert row["ptx_tma_loads"] > 0 and row["sass_utmaldg"] == row["ptx_tma_loads"], row
        assert row["ptx_expect_tx"] > 0 and row["sass_syncs_phasechk"] > 0, row


def test_warp_specialised_forms_reallocate_registers_and_decouple_warpgroups(rows):
    plain = rows["plain"]
    assert plain["ttgir_warp_specialize"] == 0 and not plain["ptx_setmaxnreg"], plain
    # In the key loops: whole-CTA barriers in the plain form (a stage is refilled once all warps are done with it),
    # only 128-thread (one warpgroup) named barriers in the warp-specialised ones.
    assert any("whole CTA" in key for key in plain["sass_bar_sync_in_loops_by_barrier"]), plain
    for ws in (rows["ws"], rows["ws-overlap"]):
        assert ws["ttgir_warp_specialize"] == 1 and ws["ttgir_requested_registers"] == [240, 24], ws
        assert {("inc", "240"), ("dec", "24")} <= {tuple(x) for x in ws["ptx_setmaxnreg"]}, ws
        assert ws["warps_total"] == 12 and ws["maxnreg"] == 168, ws
        assert ws["sass_bar_sync_in_loops_by_barrier"], ws
        assert all(key.endswith("0x80") for key in ws["sass_bar_sync_in_loops_by_barrier"]), ws
    # Only the overlapped form leaves a wgmma in flight (P v) while it waits for the next S.
    assert rows["ws-overlap"]["ptx_wgmma_wait_leaving_one"] > 0 and rows["ws"]["ptx_wgmma_wait_leaving_one"] == 0


def test_triton_automatic_warp_specialisation_engages_at_four_warps_only():
    """Triton 3.6's own Hopper warp specialisation (tl.range(warp_specialize=True)) makes a warp-specialised kernel
    of the whole causal main pass (one tagged loop) at 4 warps, and does nothing at the shipped forward's 8."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    run = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(SCRIPT), "triton_autows.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {line.split(":")[0]: line for line in run.stdout.splitlines() if line.startswith("full causal")}
    four = lines["full causal main pass tile (128, 64, 4, 2), one tagged loop, every block masked"]
    assert "'warp_specialize_op': True" in four and "'spill_stores_B': 0" in four, four
    for loops in ("one tagged loop, every block masked", "unmasked loop tagged + masked loop"):
        eight = lines[f"full causal main pass tile (128, 64, 8, 2), {loops}"]
        assert "'warp_specialize_op': False" in eight, eight


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs through the Triton interpreter (CPU)")
@pytest.mark.parametrize("split", [False, True])
def test_triton_autows_main_pass_within_twice_pytorch_error(split):
    """The plain-Triton main pass of triton_autows.py (the interpreter ignores warp_specialize) on q'/k' from pope's
    pre-pass: o and lse within 2x plain PyTorch bf16's error vs float64, causal with a ragged tail and non-causal."""
    import torch

    sys.path.insert(0, os.path.dirname(SCRIPT))
    sys.modules.pop("gpu_check", None)  # another experiment's gpu_check.py may be imported under the same name
    import gpu_check
    import triton_autows

    from pope.testing import check_within_rule

    for seed, (heads, seq, causal) in enumerate([(2, 33, True), (1, 200, True), (1, 150, False)]):
        q_prime, k_prime, v, _ = gpu_check.primed_inputs(1, heads, seq, seed=seed, device="cpu")
        exact, plain = (
            gpu_check.attention_math(q_prime, k_prime, v, causal, dtype) for dtype in (torch.float64, torch.bfloat16)
        )
        o, lse = triton_autows.attention_forward(q_prime, k_prime, v, causal=causal, tile=(32, 32, 4, 1), split=split)
        for ours, theirs, truth in zip((o, lse), plain, exact):
            result = check_within_rule(ours, theirs, truth, torch.bfloat16)
            assert result["ok"], (heads, seq, causal, result)

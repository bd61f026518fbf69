"""scripts/gpu_hf_check.py --smoke runs on the CPU (tiny shapes; the "triton" model's attention through Triton's
interpreter where triton is installed): its checks and tables work. The numbers mean nothing here; the GPU run
is the check."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def test_gpu_hf_check_smoke(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1",
        "HF_HUB_OFFLINE": "1",
    }
    run = subprocess.run(
        [sys.executable, "scripts/gpu_hf_check.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_hf_check.json").read_text())
    assert [row["check"] for row in result["correctness"]][:3] == ["logits", "gradients", "cached decode"]
    assert all(row["passed"] for row in result["correctness"])
    has_triton = importlib.util.find_spec("triton") is not None
    assert result["kernels"] == ("triton interpreter" if has_triton else "reference (no TRITON_INTERPRET=1)")
    assert len(result["throughput"]) == 2 and "ratio_vs_rope" in result["throughput"][0]
    assert "| model | params | tokens/s |" in run.stdout

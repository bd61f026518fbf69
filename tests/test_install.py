"""scripts/install.py (`make setup`): the torch build it picks, its quick fallback when PyTorch's CPU index does not
answer, what it says it installed, and that the README, the Makefile and constraints.txt say the same thing."""

import http.server
import importlib.util
import re
import socket
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("pope_install_script", ROOT / "scripts" / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def test_the_build_follows_the_machine():
    assert install.choose_build("auto", system="Linux", gpu=False) == "cpu"
    assert install.choose_build("auto", system="Linux", gpu=True) == "cuda"
    assert install.choose_build("auto", system="Darwin", gpu=False) == "default"
    assert install.choose_build("cpu", system="Linux", gpu=True) == "cpu"
    with pytest.raises(ValueError, match="--torch must be one of auto, cpu, cuda"):
        install.choose_build("rocm")


def test_nvidia_gpu_detection(tmp_path):
    proc = tmp_path / "gpus"
    proc.mkdir()
    assert not install.nvidia_gpu_present(proc, smi="")
    (proc / "0000:01:00.0").mkdir()
    assert install.nvidia_gpu_present(proc, smi="")
    empty = tmp_path / "none"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n")
    smi.chmod(0o755)
    assert install.nvidia_gpu_present(empty, smi=str(smi))
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert not install.nvidia_gpu_present(empty, smi=str(smi))


def test_an_index_that_does_not_answer_costs_about_the_probe_timeout():
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        started = time.monotonic()
        assert not install.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu/torch/", timeout=0.5)
        assert time.monotonic() - started < 3
        assert not install.reachable(f"http://127.0.0.1:{closed_port}/", timeout=0.5)
    finally:
        silent.close()

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert install.reachable(f"http://127.0.0.1:{server.server_port}/", timeout=5)  # an answer, whatever it is
    finally:
        server.shutdown()


def test_pip_commands():
    cpu = install.torch_command("2.13.0", from_cpu_index=True, reinstall=False, python="py")
    assert cpu[:5] == ["py", "-m", "pip", "install", "--quiet"] and "torch==2.13.0" in cpu
    assert cpu[cpu.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert cpu[cpu.index("--timeout") + 1] == "10" and cpu[cpu.index("--retries") + 1] == "0"
    default = install.torch_command("2.13.0", from_cpu_index=False, reinstall=True, python="py")
    assert "--index-url" not in default and "--timeout" not in default and default[-1] == "--force-reinstall"


def test_the_cuda_build_keeps_its_own_triton(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# pins\ntorch==2.13.0\ntriton==3.6.0\ntransformers==5.25.0\n")
    assert "triton==3.6.0" in install.constraints_for(constraints, None)
    cuda = install.constraints_for(constraints, "13.0")
    assert "triton" not in cuda and "torch==2.13.0" in cuda and "transformers==5.25.0" in cuda
    assert install.pinned(constraints, "torch") == "2.13.0"
    with pytest.raises(ValueError, match="pins no lm-eval"):
        install.pinned(constraints, "lm-eval")


class FakeMachine:
    """install_torch's surroundings: whether the CPU index answers, what pip does, which torch imports after."""

    def __init__(self, monkeypatch, *, index_answers, pip_results, torch_after, torch_before=None):
        self.commands, self.pip_results = [], list(pip_results)
        self.torches = [torch_before, torch_after]
        monkeypatch.setattr(install, "reachable", lambda url, timeout=install.PROBE_SECONDS: index_answers)
        monkeypatch.setattr(install, "installed_torch", lambda python=None: self.torches.pop(0))
        monkeypatch.setattr(install.subprocess, "run", self.run)

    def run(self, command, **kwargs):
        self.commands.append(command)
        return type("Completed", (), {"returncode": self.pip_results.pop(0)})()


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_and_says_so(monkeypatch, capsys):
    machine = FakeMachine(monkeypatch, index_answers=False, pip_results=[0], torch_after=("2.13.0+cpu", None))
    assert install.install_torch("cpu", "2.13.0") == ("2.13.0+cpu", None)
    (command,) = machine.commands
    assert "--index-url" not in command
    out = capsys.readouterr().out
    assert "https://download.pytorch.org/whl/cpu did not answer" in out
    assert out.strip().splitlines()[-1] == "install: torch 2.13.0+cpu, the CPU build, from the default index"


def test_the_cpu_index_is_used_when_it_answers_and_a_failure_there_falls_back(monkeypatch, capsys):
    machine = FakeMachine(monkeypatch, index_answers=True, pip_results=[0], torch_after=("2.13.0+cpu", None))
    install.install_torch("cpu", "2.13.0")
    assert "--index-url" in machine.commands[0]
    assert capsys.readouterr().out.strip().endswith("the CPU build, from https://download.pytorch.org/whl/cpu")
    machine = FakeMachine(monkeypatch, index_answers=True, pip_results=[1, 0], torch_after=("2.13.0", "13.0"))
    install.install_torch("cpu", "2.13.0")
    assert "--index-url" in machine.commands[0] and "--index-url" not in machine.commands[1]
    out = capsys.readouterr().out
    assert "install: torch 2.13.0, the CUDA 13.0 build, from the default index" in out
    assert "note: not the CPU build this machine asked for" in out  # said, not hidden


def test_a_torch_of_the_other_build_is_reinstalled_and_the_right_one_kept(monkeypatch, capsys):
    machine = FakeMachine(
        monkeypatch,
        index_answers=False,
        pip_results=[0],
        torch_before=("2.13.0", "13.0"),
        torch_after=("2.13.0+cpu", None),
    )
    install.install_torch("cpu", "2.13.0")
    assert machine.commands[0][-1] == "--force-reinstall"
    machine = FakeMachine(
        monkeypatch, index_answers=False, pip_results=[], torch_before=("2.13.0+cpu", None), torch_after=None
    )
    install.install_torch("cpu", "2.13.0")
    assert machine.commands == [] and "already installed" in capsys.readouterr().out


def test_readme_makefile_and_constraints_agree():
    readme, makefile = (ROOT / "README.md").read_text(), (ROOT / "Makefile").read_text()
    constraints = ROOT / "constraints.txt"
    assert "scripts/install.py" in makefile and "constraints.txt" in makefile
    install_section = " ".join(readme.split("## Install", 1)[1].split("\n## ", 1)[0].split())
    for text in (install_section, makefile):
        assert "https://download.pytorch.org/whl/cpu" in text
    assert "make setup" in install_section and "[hf]" in install_section
    for package, name in (
        ("transformers", "transformers"),
        ("lm-eval", "lm-eval"),
        ("triton", "Triton"),
        ("torch", "torch"),
    ):
        version = install.pinned(constraints, package)
        assert re.search(rf"{name} {re.escape(version)}\b", install_section), f"README names no {name} {version}"

"""Install pope into the running Python's environment as `make setup` does: PyTorch's CPU build where no NVIDIA GPU is
present and the CUDA build otherwise, then the project with its extras at the versions of constraints.txt.

    python scripts/install.py [--torch auto|cpu|cuda] [--extras all] [--constraints constraints.txt]

Which torch build (``--torch``; `make setup TORCH=...`):
* ``auto`` (default): ``cuda`` when an NVIDIA GPU is visible (``/proc/driver/nvidia/gpus`` or ``nvidia-smi -L`` lists
  one), else ``cpu``; on macOS and Windows the default index's build (PyPI's torch there is not a CUDA build).
* ``cpu``: from PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu) when it answers within 5 seconds,
  pip then running with a 10-second timeout and no retries; otherwise (an offline machine, CI with a local wheel) from
  the default index and pip's find-links, saying so. On Linux the default index's torch is the CUDA build (~5.5 GB
  with its nvidia-* wheels): the last line then says that this is what was installed.
* ``cuda``: from the default index.
The last torch line names the build installed (``torch.version.cuda``) and where it came from. A torch of the pinned
version but the other build is reinstalled.

Then ``pip install -e .[EXTRAS] -c constraints.txt``. torch's CUDA build requires its own Triton (torch 2.13.0:
3.7.1), so with that build the constraints' triton line (the CPU build's, for Triton's interpreter) is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_SECONDS = 5.0
CPU_INDEX_PIP_OPTIONS = ("--timeout", "10", "--retries", "0")
BUILDS = ("auto", "cpu", "cuda")


def nvidia_gpu_present(proc: Path = Path("/proc/driver/nvidia/gpus"), smi: str | None = None) -> bool:
    """Whether an NVIDIA GPU is visible: the driver lists one under /proc, or ``nvidia-smi -L`` does."""
    if proc.is_dir() and any(proc.iterdir()):
        return True
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def choose_build(requested: str, *, system: str | None = None, gpu: bool | None = None) -> str:
    """'cpu', 'cuda' or 'default' (the default index's build: macOS, Windows) for ``requested`` in BUILDS."""
    if requested not in BUILDS:
        raise ValueError(f"--torch must be one of {', '.join(BUILDS)}; got {requested!r}")
    if requested != "auto":
        return requested
    if (system or platform.system()) != "Linux":
        return "default"
    return "cuda" if (nvidia_gpu_present() if gpu is None else gpu) else "cpu"


def reachable(url: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether ``url``'s server answers within ``timeout`` seconds (any HTTP status counts as an answer)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError, refused, DNS failure, timeout
        return False


def pinned(constraints: Path, package: str) -> str:
    """The version constraints.txt pins ``package`` to."""
    for line in constraints.read_text().splitlines():
        name, eq, version = line.split("#")[0].strip().partition("==")
        if eq and name.strip().lower() == package:
            return version.strip()
    raise ValueError(f"{constraints} pins no {package}; add a line {package}==VERSION")


def torch_command(version: str, *, from_cpu_index: bool, reinstall: bool, python: str = sys.executable) -> list[str]:
    """The pip command that installs torch ``version`` from the CPU index or the default one."""
    command = [python, "-m", "pip", "install", "--quiet", f"torch=={version}"]
    if from_cpu_index:
        command += ["--index-url", CPU_INDEX, *CPU_INDEX_PIP_OPTIONS]
    if reinstall:
        command.append("--force-reinstall")
    return command


def installed_torch(python: str = sys.executable) -> tuple[str, str | None] | None:
    """(torch.__version__, torch.version.cuda) of ``python``'s torch, or None when it has none."""
    code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    result = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    version, cuda = json.loads(result.stdout.strip().splitlines()[-1])
    return version, cuda


def describe(version: str, cuda: str | None) -> str:
    return f"torch {version}, " + (f"the CUDA {cuda} build" if cuda else "the CPU build")


def wrong_build(build: str, cuda: str | None) -> bool:
    """Whether a torch with CUDA version ``cuda`` (None: CPU) is the other build than ``build`` asks for."""
    return (build == "cpu" and cuda is not None) or (build == "cuda" and cuda is None)


def constraints_for(constraints: Path, torch_cuda: str | None) -> str:
    """constraints.txt's text for the project install: without its triton line under a CUDA build of torch."""
    lines = constraints.read_text().splitlines()
    if torch_cuda is not None:
        lines = [line for line in lines if line.split("==")[0].strip().lower() != "triton"]
    return "\n".join(lines) + "\n"


def say(message: str) -> None:
    print(f"install: {message}", flush=True)


class InstallError(Exception):
    """A step failed; the message says which (pip's own output is above it)."""


def pip(command: list[str], what: str, **kwargs) -> None:
    if subprocess.run(command, **kwargs).returncode != 0:
        raise InstallError(f"pip could not install {what}; its output is above")


def install_torch(build: str, version: str) -> tuple[str, str | None]:
    """Install torch ``version`` of ``build`` unless it is there; returns (version, cuda) of the installed torch."""
    present = installed_torch()
    if present is not None and present[0].split("+")[0] == version and not wrong_build(build, present[1]):
        say(f"{describe(*present)} is already installed")
        return present
    reinstall = present is not None and present[0].split("+")[0] == version
    source = "the default index"
    use_cpu_index = False
    if build == "cpu":
        started = time.monotonic()
        use_cpu_index = reachable(CPU_INDEX + "/torch/")
        if not use_cpu_index:
            say(
                f"{CPU_INDEX} did not answer ({time.monotonic() - started:.1f} s); installing torch from the default "
                "index and pip's find-links instead"
            )
    if use_cpu_index:
        say(f"installing torch {version} (CPU build) from {CPU_INDEX}")
        if subprocess.run(torch_command(version, from_cpu_index=True, reinstall=reinstall)).returncode == 0:
            source = CPU_INDEX
        else:
            say(f"pip could not install torch from {CPU_INDEX}; trying the default index")
            use_cpu_index = False
    if not use_cpu_index:
        if build != "cpu":
            say(f"installing torch {version} from the default index")
        pip(torch_command(version, from_cpu_index=False, reinstall=reinstall), f"torch {version}")
    present = installed_torch()
    if present is None:
        raise InstallError("torch was installed but does not import; see the output above")
    say(f"{describe(*present)}, from {source}")
    if wrong_build(build, present[1]):
        wanted = "CPU" if build == "cpu" else "CUDA"
        hint = f"pip install torch=={version} --index-url {CPU_INDEX}" if build == "cpu" else "check nvidia-smi"
        say(f"note: not the {wanted} build this machine asked for ({source} offered this one); for it: {hint}")
    return present


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="auto", choices=BUILDS, help="torch build (default auto)")
    parser.add_argument("--extras", default="all", help="the project's extras (default all)")
    parser.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt")
    args = parser.parse_args(argv)
    build = choose_build(args.torch)
    if build != "default":
        say(f"torch build: {build}" + (" (NVIDIA GPU found)" if build == "cuda" and args.torch == "auto" else ""))
    try:
        _, cuda = install_torch(build, pinned(args.constraints, "torch"))
        with tempfile.TemporaryDirectory() as scratch:
            constraints = Path(scratch) / "constraints.txt"
            constraints.write_text(constraints_for(args.constraints, cuda))
            say(f"installing pope[{args.extras}] at the versions of {os.path.relpath(args.constraints)}")
            command = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "-e",
                f".[{args.extras}]",
                "-c",
                str(constraints),
            ]
            pip(command, f"pope[{args.extras}]", cwd=ROOT)
    except (InstallError, ValueError, OSError) as err:
        print(f"install: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

import os

import pytest
import torch

# Deterministic, small CPU runs: tests must not depend on thread scheduling.
torch.set_num_threads(min(2, os.cpu_count() or 1))

# Without a GPU the kernel tests run the Triton kernels through Triton's interpreter, which is fixed when Triton is
# first imported (tests/kernel_fixtures.py's docstring). Collection imports Triton before the kernel modules
# (transformers does, under tests/test_hf_compat.py), so it is set here, first: else the kernel modules rerun
# themselves in a TRITON_INTERPRET=1 subprocess, tens of seconds more. pope.attention's "auto" backend takes the
# kernels on CUDA only, so nothing else changes; on a GPU the kernels are compiled as usual.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def seed():
    torch.manual_seed(0)
    return 0

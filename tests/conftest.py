import os

import pytest
import torch

# Deterministic, small CPU runs: tests must not depend on thread scheduling.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def seed():
    torch.manual_seed(0)
    return 0

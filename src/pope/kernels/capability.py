"""A CUDA device's compute capability, asked once per device (pope.settings' caches): the operators ask it to decide
whether the kernels can run a call, the launchers to pick tiles and precision. Importing this module imports
torch._dynamo (the decorator below), and with it Triton: pope.ops reaches it through pope.kernels' lazy names, on a
CUDA call only.
"""

from __future__ import annotations

import torch

from pope.settings import SETTINGS


# Compiled code asks this on every attention call (pope.ops.triton_unsupported_reason). Traced as written, the
# cache's first fill would change a dict that dynamo guards on, so every compiled model would recompile once and run
# in two graphs; marked constant, dynamo calls it once while tracing and keeps the answer
# (tests/test_compile_graphs.py).
@torch.compiler.assume_constant_result
def cuda_capability(device) -> tuple[int, int]:
    """torch.cuda.get_device_capability(device), asked once per device (pope.settings' caches): it is on every
    kernel call's path. A device's capability never changes, so compiled code may keep it as a constant."""
    capabilities = SETTINGS.caches.capabilities
    capability = capabilities.get(device)
    if capability is None:
        capability = capabilities[device] = torch.cuda.get_device_capability(device)
    return capability


@torch.compiler.assume_constant_result
def cudnn_attention_enabled() -> bool:
    """cuDNN present and SDPA's cuDNN backend enabled (backend "cudnn"). Asking is not traceable (torch.compile breaks
    its graph on torch.backends.cudnn.is_available()), so compiled code keeps the answer as a constant."""
    return torch.backends.cudnn.is_available() and torch.backends.cuda.cudnn_sdp_enabled()

"""Process-group setup for ``torchrun`` and the few collectives the trainer uses (model wrapping: parallel.py).

Under ``torchrun --nproc_per_node=N`` the environment has RANK / LOCAL_RANK / WORLD_SIZE; the
backend is NCCL on CUDA and gloo on CPU. Without them the run is a single process (rank 0 of 1).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pope.devices import resolve_device


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed(device: str = "auto") -> DistributedContext:
    """Initialise the process group if launched by torchrun; choose this process's device.
    ``device``: "auto" (CUDA if available), "cpu" or "cuda"."""
    if device not in ("auto", "cpu", "cuda"):  # the process picks its own GPU (LOCAL_RANK): no "cuda:N"
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    use_cuda = resolve_device(device) == "cuda"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistributedContext(
            device=torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        )
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        target = torch.device("cuda", local_rank)
    else:
        target = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(minutes=30),
            device_id=target if use_cuda else None,
        )
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, device=target)


def teardown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj, src: int = 0):
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj) -> list:
    """[rank 0's obj, rank 1's, ...] on every rank ([obj] without a process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def on_main_then_everywhere(function):
    """Run ``function()`` on rank 0 only and return its result on every rank; a ValueError, TypeError,
    FileNotFoundError or RuntimeError it raises is raised on every rank (so no rank waits forever)."""
    result, error = None, None
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            result = function()
        except (ValueError, TypeError, FileNotFoundError, RuntimeError) as err:
            error = err
    result, error = broadcast_object((result, error))
    if error is not None:
        raise error
    return result

"""How the model runs over processes: one class per strategy, chosen by ``make_strategy``.

Each strategy wraps the model for training, says how gradients are synchronised across the
micro-batches of a step, and moves full (unsharded) model and optimizer state in and out of
checkpoints, so a checkpoint is the same whatever wrote it and any strategy can resume it.

- ``SingleProcess``: no process group (also a torchrun world of one).
- ``DDP``: DistributedDataParallel; ``no_sync`` on all but the last micro-batch.
- ``FSDP2``: ``fully_shard`` on each transformer block, then the root; full state dicts through
  ``torch.distributed.checkpoint.state_dict`` (collectives: every rank calls them).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from pope.train.distributed import DistributedContext


class SingleProcess:
    name = "single"

    def __init__(self, context: DistributedContext) -> None:
        self.context = context

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to call for training; the caller keeps ``model`` for checkpoints and evaluation."""
        return model

    def gradient_sync(self, train_model: nn.Module, model: nn.Module, *, last_micro: bool):
        """Context for one micro-batch's backward: gradients are reduced across ranks only on the last."""
        return contextlib.nullcontext()

    def model_state(self, model: nn.Module) -> dict:
        return model.state_dict()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        state = optimizer.state_dict()
        for group in state["param_groups"]:  # the lr is recomputed from the schedule at every step
            group["lr"] = float(group["lr"])
        return state

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


class DDP(SingleProcess):
    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel
        device_ids = [self.context.local_rank] if self.context.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def gradient_sync(self, train_model, model, *, last_micro):
        return contextlib.nullcontext() if last_micro else train_model.no_sync()


class FSDP2(SingleProcess):
    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        blocks = getattr(model, "blocks", None)
        if blocks is None:
            raise ValueError("FSDP2 wrapping expects the model to have `.blocks` (a list of transformer blocks)")
        for block in blocks:
            fully_shard(block)
        fully_shard(model)  # converts the module in place: the "unwrapped" model is the sharded one
        return model

    def gradient_sync(self, train_model, model, *, last_micro):
        model.set_requires_gradient_sync(last_micro)
        return contextlib.nullcontext()

    def model_state(self, model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model, optimizer):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))

    def load_optimizer_state(self, model, optimizer, state):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True))


def make_strategy(context: DistributedContext, parallel: str) -> SingleProcess:
    """``parallel`` ('ddp' or 'fsdp') applies under torchrun with more than one process."""
    strategies = {"ddp": DDP, "fsdp": FSDP2}
    if parallel not in strategies:
        raise ValueError(f"train.parallel must be 'ddp' or 'fsdp', got {parallel!r}")
    return strategies[parallel](context) if context.is_distributed else SingleProcess(context)

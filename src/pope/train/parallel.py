"""How the model runs over processes: one class per strategy, chosen by ``make_strategy``.

Each strategy wraps the model for training, says how gradients are synchronised across the
micro-batches of a step, and moves full (unsharded) model and optimizer state in and out of
checkpoints, so a checkpoint is the same whatever wrote it and any strategy, on any number of
processes, can resume it. The optimizer state is stored keyed by parameter name (the layout of
``torch.distributed.checkpoint.state_dict``'s full optimizer state dict), for every strategy.

- ``SingleProcess``: no process group (also a torchrun world of one).
- ``DDP``: DistributedDataParallel; ``no_sync`` on all but the last micro-batch.
- ``FSDP2``: ``fully_shard`` on each transformer block, then the root; full state dicts through
  ``torch.distributed.checkpoint.state_dict`` (collectives: every rank calls them).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
        """The optimizer state keyed by parameter name (FSDP2's full layout, so every strategy reads it)."""
        return _plain_lr(keyed_by_name(optimizer.state_dict(), model, optimizer))

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(_keyed_by_id(keyed_by_name(state, model, optimizer), model, optimizer))


class DDP(SingleProcess):
    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.context.local_rank] if self.context.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def gradient_sync(self, train_model, model, *, last_micro):
        return contextlib.nullcontext() if last_micro else train_model.no_sync()


class FSDP2(SingleProcess):
    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        # imported here: FSDP's modules add ~0.5 s to every start, and only FSDP runs use them
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
        # imported here: FSDP's modules add ~0.5 s to every start, and only FSDP runs use them
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model, optimizer):
        """The full optimizer state keyed by parameter name: collectives, every rank calls it; rank 0 gets the
        state, the others an empty dict."""
        # imported here: FSDP's modules add ~0.5 s to every start, and only FSDP runs use them
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return _plain_lr(
            get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        )

    def load_optimizer_state(self, model, optimizer, state):
        # imported here: FSDP's modules add ~0.5 s to every start, and only FSDP runs use them
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            model,
            optimizer,
            optim_state_dict=keyed_by_name(state, model, optimizer),
            options=StateDictOptions(full_state_dict=True),
        )


def _plain_lr(state: dict) -> dict:
    for group in state.get("param_groups", []):  # the lr is recomputed from the schedule at every step
        group["lr"] = float(group["lr"])
    return state


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters in the order ``Optimizer.state_dict()`` numbers them."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def keyed_by_name(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """An optimizer state dict keyed by parameter name; one in ``Optimizer.state_dict()``'s layout
    (integer ids, written by single-process and DDP checkpoints before names) is renamed through
    ``optimizer``'s groups, which list the parameters in the order the ids count them."""
    if all(isinstance(key, str) for key in state["state"]) and all(
        isinstance(key, str) for group in state["param_groups"] for key in group["params"]
    ):
        return state
    current = _parameter_names(model, optimizer)
    stored = [i for group in state["param_groups"] for i in group["params"]]
    if len(stored) != len(current):
        raise ValueError(
            f"the checkpoint's optimizer state covers {len(stored)} parameters, this model has "
            f"{len(current)}; it was written for another model"
        )
    rename = dict(zip(stored, current))
    groups = [{**group, "params": [rename[i] for i in group["params"]]} for group in state["param_groups"]]
    return {"state": {rename[i]: value for i, value in state["state"].items()}, "param_groups": groups}


def _keyed_by_id(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A name-keyed optimizer state in ``Optimizer.load_state_dict``'s layout: the groups and their parameters in
    this optimizer's order (load_state_dict pairs them by position), numbered as its state_dict() numbers them."""
    names = _parameter_names(model, optimizer)
    ids = {name: i for i, name in enumerate(names)}
    stored = {frozenset(group["params"]): group for group in state["param_groups"]}
    groups, first = [], 0
    for group in optimizer.param_groups:
        mine = names[first : first + len(group["params"])]
        first += len(mine)
        if frozenset(mine) not in stored:
            raise ValueError(
                f"the checkpoint's optimizer state was written for another model: no parameter group "
                f"holds exactly {mine[:3]}{'...' if len(mine) > 3 else ''}"
            )
        groups.append({**stored[frozenset(mine)], "params": [ids[name] for name in mine]})
    return {"state": {ids[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def make_strategy(context: DistributedContext, parallel: str) -> SingleProcess:
    """``parallel`` ('ddp' or 'fsdp') applies under torchrun with more than one process."""
    strategies = {"ddp": DDP, "fsdp": FSDP2}
    if parallel not in strategies:
        raise ValueError(f"train.parallel must be 'ddp' or 'fsdp', got {parallel!r}")
    return strategies[parallel](context) if context.is_distributed else SingleProcess(context)

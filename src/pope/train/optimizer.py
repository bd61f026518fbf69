"""AdamW with decoupled weight decay and the parameter groups the recipes assume.

By default (``decay_params="matrices"``) weight decay applies to the weight matrices (Linear weights and the
token embedding, which with tied embeddings is also the output projection: decaying it matches GPT-2/nanoGPT
practice). No decay for:
- 1-D parameters: RMSNorm gains and all biases;
- positional-encoding parameters: PoPE's delta (phase offsets clamped to [-2pi, 0], decaying them
  would pull every phase towards 0) and learnable absolute position embeddings (a table of
  positions, not a projection). They are found by module type (``pope.encodings``), with the name
  fallbacks ``delta`` / ``pe.`` / ``pos_emb`` so a new encoding is not decayed by accident.

``decay_params="all"`` decays every parameter, as ``torch.optim.AdamW(model.parameters())`` does: for
checking a paper that does not say which parameters it decays. Decay then pulls PoPE's delta towards 0,
which also brings an entry that stepped below -2pi (frozen by the forward clamp) back into [-2pi, 0].
"""

from __future__ import annotations

import torch
from torch import nn

from pope.encodings import AbsolutePositionEmbedding, PositionalEncoding
from pope.presets import DECAY_PARAMS


def _positional_parameter_names(model: nn.Module) -> set[str]:
    names: set[str] = set()
    pe_types = (PositionalEncoding, AbsolutePositionEmbedding)
    for module_name, module in model.named_modules():
        if isinstance(module, pe_types):
            for param_name, _ in module.named_parameters():
                names.add(f"{module_name}.{param_name}" if module_name else param_name)
    return names


def split_decay_groups(model: nn.Module, decay_params: str = "matrices") -> tuple[list[str], list[str]]:
    """(names with weight decay, names without), each parameter once (tied weights counted once)."""
    if decay_params not in DECAY_PARAMS:
        raise ValueError(f"decay_params must be one of {', '.join(DECAY_PARAMS)}; got {decay_params!r}")
    if decay_params == "all":
        return [name for name, param in model.named_parameters() if param.requires_grad], []
    positional = _positional_parameter_names(model)
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # named_parameters() yields a tied tensor once
        if not param.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        is_positional = name in positional or leaf == "delta" or ".pe." in f".{name}" or "pos_emb" in name
        (no_decay if param.ndim < 2 or is_positional else decay).append(name)
    return decay, no_decay


def build_optimizer(
    model: nn.Module,
    *,
    lr: float | torch.Tensor,
    betas: tuple[float, float],
    weight_decay: float,
    decay_params: str = "matrices",
    eps: float = 1e-8,
    fused: bool = False,
    capturable: bool = False,
) -> torch.optim.AdamW:
    """AdamW over two groups (decay / no decay; one group, decay, with ``decay_params="all"``). ``lr`` may be
    a 1-element tensor (with ``fused`` or ``capturable``) so a captured CUDA graph reads the current value
    from device memory."""
    decay, no_decay = split_decay_groups(model, decay_params)
    params = dict(model.named_parameters())
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": weight_decay, "names": decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "names": no_decay},
    ]
    groups = [g for g in groups if g["params"]]
    kwargs = {"lr": lr, "betas": tuple(betas), "eps": eps}
    if fused:
        kwargs["fused"] = True
    if capturable:
        kwargs["capturable"] = True
    elif not fused and isinstance(lr, torch.Tensor):
        kwargs["foreach"] = False
    return torch.optim.AdamW(groups, **kwargs)

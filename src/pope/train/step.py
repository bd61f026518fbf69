"""One optimizer step, eager (``EagerStep``), and the same step captured in a CUDA graph (``GraphedStep``).

    lr = schedule(step)
    for each micro-batch (recipe.grad_accum):
        loss_sum = CE(model(x), y, sum over scored tokens)           (scored: targets != -100)
        backward(loss_sum * world_size / scored tokens of the GLOBAL batch)
    clip the global grad norm (recipe.grad_clip); AdamW step; PoPE deltas with delta_range="project" clamped

Dividing by the global batch's scored-token count (known on every rank, since the global batch is a
function of the step) makes the gradient and the loss those of one process on the whole batch,
whatever the number of ranks or micro-batches (DDP averages gradients, hence world_size).

``GraphedStep`` (one CUDA process, example data on the GPU): three eager warm-up steps on a side
stream (real training steps: compilation and AdamW state happen here), then forward, backward,
clipping and the fused, capturable AdamW are captured once into a CUDA graph; each later step copies
its batch into static buffers, fills the lr tensor and replays. No host sync.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F

from pope.encodings import project_deltas_, projected_deltas
from pope.train.batches import IGNORE_INDEX

CUDA_GRAPH_WARMUP_STEPS = 3


def autocast_context(device: torch.device, dtype: torch.dtype | None, *, cache_enabled: bool = True):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled)


class EagerStep:
    """One optimizer step over ``batches`` (ExampleBatches, WindowBatches or PackedDocumentBatches); returns this
    rank's share of the global mean loss as a device scalar (no host sync)."""

    def __init__(
        self,
        *,
        model,
        train_model,
        strategy,
        optimizer,
        schedule,
        batches,
        micro_steps: int,
        grad_clip: float,
        device: torch.device,
        autocast_dtype: torch.dtype | None,
        autocast_cache: bool = True,
    ) -> None:
        self.model, self.train_model, self.strategy, self.optimizer = model, train_model, strategy, optimizer
        self.schedule, self.batches, self.micro_steps, self.grad_clip = schedule, batches, micro_steps, grad_clip
        self.device, self.autocast_dtype, self.autocast_cache = device, autocast_dtype, autocast_cache
        self.world_size = strategy.context.world_size
        self.projected_deltas = projected_deltas(model)  # clamped in place after each update (usually none)

    def forward_backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, scale, packing: dict | None = None
    ) -> torch.Tensor:
        """One micro-batch (m, T), or packed documents (1, total) with packing = {"cu_seqlens", "max_seqlen",
        "cu_seqlens_host"} (pope.train.packing): returns the detached summed loss; gradients get loss_sum * scale."""
        # cache_enabled=False under a CUDA graph: it must not capture autocast's weight-cast cache
        with autocast_context(self.device, self.autocast_dtype, cache_enabled=self.autocast_cache):
            logits, _ = self.train_model(inputs, **(packing or {}))  # (m, T, V)
            loss_sum = F.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            )
        (loss_sum * scale).backward()
        return loss_sum.detach()

    def clip_and_update(self) -> None:
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip, foreach=self.device.type == "cuda")
        self.optimizer.step()
        project_deltas_(self.projected_deltas)

    def __call__(self, step: int) -> torch.Tensor:
        lr = self.schedule(step)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        scored = self.batches.scored_tokens(step)
        scale = self.world_size / scored
        total = torch.zeros((), device=self.device)
        for micro in range(self.micro_steps):
            inputs, targets, *packing = self.batches.get(step, micro)  # packed batches add their packing
            last = micro == self.micro_steps - 1
            with self.strategy.gradient_sync(self.train_model, self.model, last_micro=last):
                total += self.forward_backward(inputs, targets, scale, *packing)
        self.clip_and_update()
        self.optimizer.zero_grad(set_to_none=True)
        return total / scored


class GraphedStep:
    """The eager step captured once into a CUDA graph after CUDA_GRAPH_WARMUP_STEPS eager steps."""

    def __init__(self, eager: EagerStep, lr_tensor: torch.Tensor) -> None:
        self.eager, self.lr_tensor = eager, lr_tensor
        self.warmup_left = CUDA_GRAPH_WARMUP_STEPS
        self.graph = None

    def __call__(self, step: int) -> torch.Tensor:
        batches = self.eager.batches
        if self.graph is None:
            if self.warmup_left > 0:  # real training steps, run eagerly on a side stream
                self.warmup_left -= 1
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*capturable=True.*")
                    loss = self.eager(step)
                torch.cuda.current_stream().wait_stream(stream)
                return loss
            self._capture(step)
        self.lr_tensor.fill_(self.eager.schedule(step))
        inputs, targets = batches.get_all_micro(step)
        self.static_inputs.copy_(inputs)
        self.static_targets.copy_(targets)
        self.static_inverse_count.fill_(1.0 / batches.scored_tokens(step))
        self.graph.replay()
        return self.static_loss

    def _capture(self, step: int) -> None:
        eager, batches = self.eager, self.eager.batches
        inputs, targets = batches.get_all_micro(step)  # (A, m, T)
        self.static_inputs, self.static_targets = inputs.clone(), targets.clone()
        self.static_inverse_count = torch.full((), 1.0 / batches.scored_tokens(step), device=eager.device)
        eager.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            total = torch.zeros((), device=eager.device)
            for micro in range(eager.micro_steps):
                total += eager.forward_backward(
                    self.static_inputs[micro], self.static_targets[micro], self.static_inverse_count
                )
            eager.clip_and_update()
            self.static_loss = total * self.static_inverse_count
        self.graph = graph

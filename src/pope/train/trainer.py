"""The trainer: one loop for every preset, on CPU, one GPU, or several under torchrun.

One optimizer step (``Trainer.train_step``):

    lr = schedule(step)                       linear warmup, cosine to recipe.min_lr
    for each micro-batch (recipe.grad_accum):
        logits = model(x)                     bf16 autocast on CUDA
        loss_sum = CE(logits, y, sum over scored tokens)          (scored: targets != -100)
        backward(loss_sum * world_size / scored tokens of the GLOBAL batch)
    clip the global grad norm (recipe.grad_clip), AdamW step (decoupled weight decay)

Dividing by the global batch's scored-token count (known on every rank, since the global batch is
a function of the step) makes the gradient and the logged loss those of one process on the whole
batch, whatever the number of ranks or micro-batches (DDP averages gradients, hence world_size).

Fast path on one GPU (``train.cuda_graph``): the whole step above, fused AdamW included, is captured
once into a CUDA graph after three eager warm-up steps and replayed; each step then costs one batch
gather, one fill of the lr tensor and one graph launch, with no host sync (the loss is read only
every ``train.log_interval`` steps). ``train.compile`` compiles the model first (its kernels are what
the graph replays).

Evaluation every ``recipe.eval_interval`` steps and at the end on ``train.eval_splits``;
``checkpoints/best`` follows ``train.best_metric``; the summary reports the test metrics at the best
validation step and, labelled as such, the best test loss over all evaluations (what the paper
reports for JSB, MAESTRO and the genome).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pope import checkpoint as ckpt
from pope.provenance import device_name, git_commit, library_versions
from pope.train.config import RESUME_MUTABLE, config_differences, train_options
from pope.train.data import IGNORE_INDEX, ExampleBatches, Shard, evaluation_batches, load_training_data
from pope.train.distributed import (all_reduce_sum, barrier, setup_distributed, teardown_distributed, wrap_model)
from pope.train.metrics import MetricsLogger
from pope.train.optimizer import build_optimizer
from pope.train.schedule import WarmupCosineSchedule

CUDA_GRAPH_WARMUP_STEPS = 3


def _rng_state() -> dict:
    legacy = np.random.get_state()
    state = {"python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
             "numpy": [legacy[0], legacy[1].tolist(), int(legacy[2]), int(legacy[3]), float(legacy[4])],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Build with a resolved run config (``pope.train.config.resolve_run_config``) and a run dir."""

    def __init__(self, config: dict, run_dir: str | os.PathLike, *, resume: bool = False,
                 init_from: ckpt.Checkpoint | None = None) -> None:
        """init_from: start a new run from these weights (e.g. a fine-tune); ignored when resuming, where the
        run's own checkpoint wins. Loaded before the model is wrapped (DDP/FSDP2) or compiled."""
        from pope.model import GPT, GPTConfig

        self.config = config
        self.run_dir = Path(run_dir)
        self.options = train_options(config)
        self.recipe = config["recipe"]
        self.context = setup_distributed(self.options.device)
        self.device = self.context.device
        self.is_main = self.context.is_main
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        barrier()
        self.resume_from = self._check_resume(resume)

        _seed_everything(config["seed"])
        self.micro_steps = self.recipe["grad_accum"]
        self.data = load_training_data(self.recipe, self.options, micro_steps=self.micro_steps, seed=config["seed"],
                                       shard=Shard(self.context.rank, self.context.world_size), device=self.device,
                                       seq_len=self.recipe["seq_len"], is_main=self.is_main)
        if config["model"]["vocab_size"] < self.data.vocab_size:
            raise ValueError(f"model.vocab_size {config['model']['vocab_size']} is smaller than the data's vocabulary "
                             f"({self.data.vocab_size} ids)")
        self.model_config = GPTConfig.from_dict(config["model"])
        self.model = GPT(self.model_config).to(self.device)  # unwrapped: checkpoints and evaluation use it
        self.autocast_dtype = self._autocast_dtype()
        self.compile = self.options.compile if self.options.compile is not None else self.device.type == "cuda"
        self.use_graph = self._use_cuda_graph()
        self.schedule = WarmupCosineSchedule(self.recipe["lr"], self.recipe["min_lr"], self.recipe["warmup_steps"],
                                             self.recipe["max_steps"])
        self.step = 0
        self.best: dict = {}
        loaded = self._load_model_checkpoint(self.resume_from) if self.resume_from is not None else None
        if loaded is None and init_from is not None:
            ckpt.apply_model_state(self.model, init_from.model_state, source=f"checkpoint {init_from.path}")
        # wrap before building the optimizer: FSDP2 replaces the parameters by sharded DTensors
        self.train_model = wrap_model(self.model, self.context, self.options.parallel)
        fused = self.device.type == "cuda"
        self.lr_tensor = torch.tensor(self.schedule(0), device=self.device) if self.use_graph else None
        self.optimizer = build_optimizer(self.model, lr=self.lr_tensor if self.use_graph else self.schedule(0),
                                         betas=(self.recipe["beta1"], self.recipe["beta2"]),
                                         weight_decay=self.recipe["weight_decay"], fused=fused,
                                         capturable=self.use_graph)
        if loaded is not None:
            self._load_trainer_state(loaded.trainer_state)
        if self.compile:
            self.train_model = torch.compile(self.train_model)
        self._graph = None
        self._graph_warmup_left = CUDA_GRAPH_WARMUP_STEPS  # eager steps before capture (compile, AdamW state)
        self._loss_sum = torch.zeros((), device=self.device)  # sum of per-step losses since the last log
        self._loss_steps = 0

    # ------------------------------------------------------------------------------------------ setup
    def _autocast_dtype(self) -> torch.dtype | None:
        choice = self.options.autocast
        if choice == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else None
        return torch.bfloat16 if choice == "bf16" else None

    def _use_cuda_graph(self) -> bool:
        possible = (self.device.type == "cuda" and not self.context.is_distributed
                    and isinstance(self.data.train, ExampleBatches) and self.data.train.transform is None
                    and self.model_config.dropout == 0.0)
        if self.options.cuda_graph is None:
            return possible
        if self.options.cuda_graph and not possible:
            raise ValueError("train.cuda_graph=true needs one CUDA process, an example dataset without a train-time "
                             "transform, and dropout 0; set train.cuda_graph=false")
        return self.options.cuda_graph

    def _check_resume(self, resume: bool) -> Path | None:
        config_path = self.run_dir / "config.json"
        last = self.run_dir / "checkpoints" / "last"
        if not resume:
            if config_path.exists():
                raise ValueError(f"{self.run_dir} already holds a run; pass --resume to continue it or choose a new --out")
            return None
        if not config_path.exists():
            raise FileNotFoundError(f"--resume: {config_path} not found; {self.run_dir} is not a run directory")
        stored = json.loads(config_path.read_text())
        differences = config_differences(stored, self.config)
        if differences:
            raise ValueError("--resume refused: the run directory was trained with a different config:\n  "
                             + "\n  ".join(differences) + f"\n(only {', '.join(sorted(RESUME_MUTABLE))} may change)")
        resolved = ckpt._resolve_checkpoint_dir(last)
        return resolved if resolved.exists() else None  # a run killed before its first checkpoint restarts

    def _load_model_checkpoint(self, path: Path) -> ckpt.Checkpoint:
        loaded = ckpt.load_checkpoint(path, map_location="cpu")  # verified and fully read before any change
        state = loaded.trainer_state
        if state.get("data") != self.data.train.state_dict(state.get("step")):
            raise ValueError(f"checkpoint {path} was written for other data ({state.get('data')}); "
                             f"this run has {self.data.train.state_dict(state.get('step'))}")
        ckpt.apply_model_state(self.model, loaded.model_state, source=f"checkpoint {path}")
        return loaded

    def _load_trainer_state(self, state: dict) -> None:
        if self.context.is_distributed and self.options.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_tensor is not None:  # keep the one device tensor the captured graph reads
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_tensor
        self.step = int(state["step"])
        self.best = state.get("best", {})
        _set_rng_state(state["rng"])

    # ------------------------------------------------------------------------------------------ steps
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: a CUDA graph must not capture autocast's weight-cast cache
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=not self.use_graph)

    def _sync_context(self, micro: int):
        last = micro == self.micro_steps - 1
        if self.context.is_distributed and self.options.parallel == "ddp" and not last:
            return self.train_model.no_sync()
        if self.context.is_distributed and self.options.parallel == "fsdp":
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, scale) -> torch.Tensor:
        """One micro-batch: returns the detached summed loss; gradients get loss_sum * scale."""
        with self._autocast():
            logits, _ = self.train_model(inputs)  # (m, T, V)
            loss_sum = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                       reduction="sum")
        (loss_sum * scale).backward()
        return loss_sum.detach()

    def _clip_and_update(self) -> None:
        if self.recipe["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe["grad_clip"],
                                           foreach=self.device.type == "cuda")
        self.optimizer.step()

    def _eager_step(self, step: int) -> torch.Tensor:
        lr = self.schedule(step)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        scored = self.data.train.scored_tokens(step)
        scale = self.context.world_size / scored
        total = torch.zeros((), device=self.device)
        for micro in range(self.micro_steps):
            inputs, targets = self.data.train.get(step, micro)
            with self._sync_context(micro):
                total += self._forward_backward(inputs, targets, scale)
        self._clip_and_update()
        self.optimizer.zero_grad(set_to_none=True)
        return total / scored  # this rank's share of the global mean loss

    def _graph_step(self, step: int) -> torch.Tensor:
        """Step through the captured CUDA graph (capturing it on first use after the warm-up steps)."""
        batches: ExampleBatches = self.data.train
        if self._graph is None:
            if self._graph_warmup_left > 0:  # real training steps, run eagerly on a side stream
                self._graph_warmup_left -= 1
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*capturable=True.*")
                    loss = self._eager_step(step)
                torch.cuda.current_stream().wait_stream(stream)
                return loss
            self._capture(step)
        self.lr_tensor.fill_(self.schedule(step))
        inputs, targets = batches.get_all_micro(step)
        self._static_inputs.copy_(inputs)
        self._static_targets.copy_(targets)
        self._static_inverse_count.fill_(1.0 / batches.scored_tokens(step))
        self._graph.replay()
        return self._static_loss

    def _capture(self, step: int) -> None:
        batches: ExampleBatches = self.data.train
        inputs, targets = batches.get_all_micro(step)  # (A, m, T)
        self._static_inputs, self._static_targets = inputs.clone(), targets.clone()
        self._static_inverse_count = torch.full((), 1.0 / batches.scored_tokens(step), device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            total = torch.zeros((), device=self.device)
            for micro in range(self.micro_steps):
                total += self._forward_backward(self._static_inputs[micro], self._static_targets[micro],
                                                self._static_inverse_count)
            self._clip_and_update()
            self._static_loss = total * self._static_inverse_count
        self._graph = graph

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step; returns this rank's loss share as a device scalar (no host sync)."""
        self.train_model.train()
        return self._graph_step(step) if self.use_graph else self._eager_step(step)

    # ------------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, split: str) -> dict:
        """Mean loss and accuracy over the scored tokens of a whole split (windows: up to
        recipe.eval_batches batches). Uses the uncompiled model (no recompiles for eval shapes); under
        FSDP2 that is the sharded module itself (fully_shard converts the module in place)."""
        model = self.model
        model.eval()
        batch_size = self.options.eval_batch_size or self.recipe["batch_size"]
        shard = Shard(self.context.rank, self.context.world_size)
        if split in self.data.eval_examples:
            batches = evaluation_batches(batch_size=batch_size, shard=shard, device=self.device,
                                         examples=self.data.eval_examples[split])
        else:
            batches = evaluation_batches(batch_size=batch_size, shard=shard, device=self.device,
                                         tokens=self.data.eval_tokens[split], seq_len=self.data.seq_len,
                                         max_batches=self.recipe["eval_batches"])
        totals = torch.zeros(3, device=self.device, dtype=torch.float64)  # loss sum, correct, scored
        for inputs, targets in batches:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                logits, _ = model(inputs)
            logits = logits.float().flatten(0, 1)
            flat_targets = targets.flatten()
            scored = flat_targets != IGNORE_INDEX
            totals[0] += F.cross_entropy(logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum").double()
            totals[1] += ((logits.argmax(dim=-1) == flat_targets) & scored).sum()
            totals[2] += scored.sum()
        all_reduce_sum(totals)
        loss_sum, correct, count = totals.tolist()
        model.train()
        return {f"{split}_loss": loss_sum / max(count, 1), f"{split}_accuracy": correct / max(count, 1),
                f"{split}_scored_tokens": int(count)}

    # ------------------------------------------------------------------------------------ checkpoints
    def _best_metric(self) -> tuple[str, bool]:
        name = self.options.best_metric or ("valid_accuracy" if self.data.is_task else "valid_loss")
        return name, name.endswith("_accuracy")

    def _model_state(self) -> dict:
        if self.context.is_distributed and self.options.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict()

    def _optimizer_state(self) -> dict:
        if self.context.is_distributed and self.options.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
            return get_optimizer_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        state = self.optimizer.state_dict()
        for group in state["param_groups"]:  # the lr is recomputed from the schedule at every step
            group["lr"] = float(group["lr"])
        return state

    def save(self, name: str, metrics: dict | None = None) -> None:
        model_state, optimizer_state = self._model_state(), self._optimizer_state()  # collectives under FSDP
        if self.is_main:
            trainer_state = {"step": self.step, "optimizer": optimizer_state, "schedule": self.schedule.state_dict(),
                             "rng": _rng_state(), "data": self.data.train.state_dict(self.step), "best": self.best,
                             "metrics": metrics or {}, "run_config": self.config}
            ckpt.save_checkpoint(self.run_dir / "checkpoints" / name, model_state=model_state,
                                 model_config=self.model_config.to_dict(), trainer_state=trainer_state)
        barrier()

    def _write_records(self) -> None:
        if not self.is_main:
            return
        (self.run_dir / "config.json").write_text(json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        env = {"versions": library_versions(), "git": git_commit(), "device": str(self.device),
               "device_name": device_name(self.device), "world_size": self.context.world_size, "host": platform.node(),
               "command": sys.argv, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "resumed_from_step": self.step, "compile": self.compile, "cuda_graph": self.use_graph,
               "autocast": str(self.autocast_dtype), "model_params": self.model.num_params()}
        name = "env.json" if self.step == 0 else f"env.resume-{self.step}.json"
        (self.run_dir / name).write_text(json.dumps(env, indent=2) + "\n")

    # ------------------------------------------------------------------------------------------- loop
    def _evaluate_all(self, logger: MetricsLogger) -> dict:
        metrics = {}
        for split in [s.strip() for s in self.options.eval_splits.split(",") if s.strip()]:
            metrics.update(self.evaluate(split))
        logger.log({"step": self.step, "kind": "eval", **metrics})
        name, higher_is_better = self._best_metric()
        if name in metrics:
            value = metrics[name]
            previous = self.best.get("value")
            improved = previous is None or (value > previous if higher_is_better else value < previous)
            if improved:
                self.best = {"metric": name, "value": value, "step": self.step, "metrics": metrics}
        if "test_loss" in metrics and metrics["test_loss"] < self.best.get("best_test_loss", math.inf):
            self.best["best_test_loss"] = metrics["test_loss"]
            self.best["best_test_loss_step"] = self.step
        if "test_accuracy" in metrics and metrics["test_accuracy"] > self.best.get("best_test_accuracy", -1.0):
            self.best["best_test_accuracy"] = metrics["test_accuracy"]
            self.best["best_test_accuracy_step"] = self.step
        if self.best.get("step") == self.step:
            self.save("best", metrics)
        return metrics

    def train(self) -> dict:
        """Run (or continue) the schedule; returns the summary also written to RUN/summary.json."""
        total = self.recipe["max_steps"]
        stop = min(total, self.options.stop_at_step or total)
        self._write_records()
        logger = MetricsLogger(self.run_dir, enabled=self.is_main, total_steps=total, start_step=self.step,
                               tensorboard=self.options.tensorboard, progress=self.options.progress)
        checkpoint_every = self.options.checkpoint_interval or self.recipe["eval_interval"]
        tokens_per_step = self.recipe["batch_size"] * self.data.seq_len
        started = last_time = time.perf_counter()
        last_step = last_saved = self.step
        metrics = {}
        try:
            while self.step < stop:
                if self.options.max_seconds is not None and self._out_of_time(started):
                    if self.step != last_saved:
                        self.save("last", metrics)
                    break
                step = self.step
                self._loss_sum += self.train_step(step)
                self._loss_steps += 1
                self.step = step + 1
                logger.advance()
                if self.step % self.options.log_interval == 0 or self.step == stop:
                    loss = all_reduce_sum(self._loss_sum.clone()).item() / self._loss_steps  # host sync
                    now = time.perf_counter()
                    record = {"step": self.step, "kind": "train", "loss": loss, "lr": self.schedule(step),
                              "tokens_per_s": tokens_per_step * (self.step - last_step) / (now - last_time),
                              "step_ms": 1000 * (now - last_time) / (self.step - last_step)}
                    logger.log(record)
                    if not math.isfinite(loss):
                        raise RuntimeError(f"training loss is {loss} at step {self.step}; lower recipe.lr or check the data")
                    self._loss_sum.zero_()
                    self._loss_steps, last_time, last_step = 0, now, self.step
                if self.step % self.recipe["eval_interval"] == 0 or self.step == total:
                    metrics = self._evaluate_all(logger)
                if self.step % checkpoint_every == 0 or self.step == stop:
                    self.save("last", metrics)
                    last_saved = self.step
                    last_time = time.perf_counter()  # keep checkpoint time out of tokens/s
        finally:
            logger.close()
        summary = self._summary(metrics, time.perf_counter() - started)
        if self.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _out_of_time(self, started: float) -> bool:
        """Every rank stops at the same step: rank 0 decides (a broadcast every 100 steps)."""
        if self.step % 100:
            return False
        decision = torch.tensor(float(time.perf_counter() - started > self.options.max_seconds), device=self.device)
        if self.context.is_distributed:
            torch.distributed.broadcast(decision, src=0)
        return bool(decision.item())

    def _summary(self, final_metrics: dict, seconds: float) -> dict:
        best = self.best
        summary = {"step": self.step, "finished": self.step >= self.recipe["max_steps"], "seconds": seconds,
                   "final": final_metrics, "best_metric": best.get("metric"), "best_value": best.get("value"),
                   "best_step": best.get("step"),
                   "at_best_valid": best.get("metrics", {}),
                   "best_test_loss (min over evaluations; the paper's reporting)": best.get("best_test_loss"),
                   "best_test_loss_step": best.get("best_test_loss_step"),
                   "best_test_accuracy (max over evaluations)": best.get("best_test_accuracy"),
                   "best_test_accuracy_step": best.get("best_test_accuracy_step")}
        return summary

    def close(self) -> None:
        teardown_distributed()


def run_training(config: dict, run_dir: str | os.PathLike, *, resume: bool = False) -> dict:
    trainer = Trainer(config, run_dir, resume=resume)
    try:
        return trainer.train()
    finally:
        trainer.close()

"""The trainer: one loop for every preset, on CPU, one GPU, or several under torchrun.

``Trainer.train`` is the loop; the parts it is made of live beside it:

    rundir.py         --out checks, the run-directory lock, what a directory holds
    trainer_state.py  what --resume continues from, saving/loading trainer state, RNG states
    parallel.py       single process / DDP / FSDP2: wrapping, gradient sync, full state dicts
    step.py           one optimizer step, eager or replayed from a CUDA graph
    training_data.py  the data a run trains and evaluates on, loaded as the samplers below
    batches.py        training batches (a pure function of seed and step) and evaluation passes
    packing.py        packed document batches (train.pack): pieces end to end, no padding
    evaluate.py       loss and accuracy over a split
    metrics.py        metrics.jsonl, TensorBoard, progress bar, best-checkpoint bookkeeping
    stopping.py       SIGINT/SIGTERM, stop_at_step and max_seconds end with a checkpoint and a resume line
    run_records.py    config.json, env.json, the start banner, summaries of finished and extended runs, write failures

Evaluation every ``recipe.eval_interval`` steps and at the end on ``train.eval_splits``;
``checkpoints/best`` follows ``train.best_metric``; the summary reports the test metrics at the best
validation step and the best test loss / accuracy over all evaluations.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pope import checkpoint as ckpt
from pope.data.prepared import resolve_dataset
from pope.data.vocabulary import check_token_range
from pope.encodings import delta_outside_counts
from pope.files import write_text_atomic
from pope.model import GPT
from pope.train import run_records
from pope.train.batches import ExampleBatches, Shard
from pope.train.distributed import all_reduce_sum, on_main_then_everywhere, setup_distributed, teardown_distributed
from pope.train.evaluate import evaluate_split, evaluation_batch_count
from pope.train.metrics import BestTracker, MetricsLogger
from pope.train.optimizer import build_optimizer
from pope.train.parallel import make_strategy
from pope.train.run_config import RunConfig
from pope.train.rundir import RunLock, check_output_dir, describe_run, holds_run
from pope.train.schedule import WarmupDecaySchedule
from pope.train.step import EagerStep, GraphedStep
from pope.train.stopping import StopSignals, StopVote, resume_command
from pope.train.trainer_state import CheckpointManager, resume_checkpoint, seed_everything
from pope.train.training_data import load_training_data

WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
"""errno values of a write the disk or the directory refused: a run stopped by one is continued from its last
checkpoint once that is fixed."""


class Trainer:
    """Build with a run config (``pope.train.run_config.resolve_run_config``, or its dict layout) and a run dir.

    A new run needs a directory without a run in it; ``resume=True`` continues ``checkpoints/last``
    (an error when there is none). The directory is locked until ``close()``."""

    def __init__(
        self,
        config: RunConfig | dict,
        run_dir: str | os.PathLike,
        *,
        resume: bool = False,
        init_from: ckpt.Checkpoint | None = None,
    ) -> None:
        """init_from: start a new run from these weights (e.g. a fine-tune); ignored when resuming, where the
        run's own checkpoint wins. Loaded before the model is wrapped (DDP/FSDP2) or compiled."""
        self.config = RunConfig.coerce(config)
        self.run_dir = Path(run_dir)
        self.options, self.recipe = self.config.train, self.config.recipe
        self.context = setup_distributed(self.options.device)
        self.device, self.is_main = self.context.device, self.context.is_main
        self.lock = RunLock(self.run_dir)
        self.resume_from = on_main_then_everywhere(lambda: self._open_run_dir(resume))
        try:
            seed_everything(self.config.seed)
            self.micro_steps = self.recipe.grad_accum
            shard = Shard(self.context.rank, self.context.world_size)
            self.data = load_training_data(
                self.recipe.to_dict(),
                self.options,
                micro_steps=self.micro_steps,
                seed=self.config.seed,
                shard=shard,
                device=self.device,
                seq_len=self.recipe.seq_len,
                is_main=self.is_main,
            )
            on_main_then_everywhere(lambda: _check_vocabulary(self.data, self.config))
            self.model_config = self.config.model
            self.model = GPT(self.model_config).to(self.device)  # unwrapped: checkpoints and evaluation use it
            self.autocast_dtype = self._autocast_dtype()
            # process-wide: torch.matmul, cuBLAS and pope's kernels (kernels.host.precision) read it
            torch.set_float32_matmul_precision("highest" if self.options.fp32_matmul == "ieee" else "high")
            # packed batches change shape every step: compiled only on request, then with dynamic shapes
            self.compile = (
                self.options.compile
                if self.options.compile is not None
                else self.device.type == "cuda" and not self.options.pack
            )
            self.use_graph = self._use_cuda_graph()
            self.schedule = WarmupDecaySchedule(
                self.recipe.lr,
                self.recipe.min_lr,
                self.recipe.warmup_steps,
                self.recipe.max_steps,
                self.recipe.lr_decay,
            )
            self.strategy = make_strategy(self.context, self.options.parallel)
            self.checkpoints = CheckpointManager(self.run_dir, self.strategy, is_main=self.is_main)
            self.step, self.resumed_from_world_size = 0, None
            self.best = BestTracker(self._best_metric())
            self.seconds_before, self.last_metrics, self.extended_from = 0.0, {}, None
            loaded = None
            if self.resume_from is not None:
                loaded = self.checkpoints.load_model(self.resume_from, self.model, self.data.train.state_dict)
            elif init_from is not None:
                ckpt.apply_model_state(self.model, init_from.model_state, source=f"checkpoint {init_from.path}")
            # wrap before building the optimizer: FSDP2 replaces the parameters by sharded DTensors
            self.train_model = self.strategy.wrap(self.model)
            self.lr_tensor = torch.tensor(self.schedule(0), device=self.device) if self.use_graph else None
            self.optimizer = build_optimizer(
                self.model,
                lr=self.lr_tensor if self.use_graph else self.schedule(0),
                betas=(self.recipe.beta1, self.recipe.beta2),
                weight_decay=self.recipe.weight_decay,
                decay_params=self.recipe.weight_decay_params,
                fused=self.device.type == "cuda",
                capturable=self.use_graph,
            )
            if loaded is not None:
                self._restore(loaded.trainer_state)
            if self.compile:
                self.train_model = torch.compile(self.train_model, dynamic=True if self.options.pack else None)
            eager = EagerStep(
                model=self.model,
                train_model=self.train_model,
                strategy=self.strategy,
                optimizer=self.optimizer,
                schedule=self.schedule,
                batches=self.data.train,
                micro_steps=self.micro_steps,
                grad_clip=self.recipe.grad_clip,
                device=self.device,
                autocast_dtype=self.autocast_dtype,
                autocast_cache=not self.use_graph,
            )
            self.step_function = GraphedStep(eager, self.lr_tensor) if self.use_graph else eager
        except BaseException:
            self.lock.release()
            raise

    # ------------------------------------------------------------------------------------------ setup
    def _open_run_dir(self, resume: bool) -> Path | None:
        """Rank 0: check --out, lock it, and find what to resume from (None for a new run)."""
        if resume and not self.run_dir.is_dir():
            what = "is a file" if self.run_dir.exists() else "does not exist"
            raise FileNotFoundError(
                f"--resume: {self.run_dir} {what}, so it is not a run directory; "
                "give the --out of the run to continue, or start a new run without --resume"
            )
        try:
            check_output_dir(self.run_dir)
        except ValueError as err:
            if not resume:
                raise
            cause = err.__cause__
            reason = getattr(cause, "strerror", None) or str(cause or err)
            raise ValueError(
                f"--resume: {self.run_dir} cannot be written ({reason}); nothing was changed: make it writable "
                f"(chmod -R u+w {self.run_dir}), or copy the run to a writable place and resume the copy"
            ) from None
        self.lock.acquire()
        try:
            if resume:
                return resume_checkpoint(self.run_dir, self.config)
            if holds_run(self.run_dir):
                raise ValueError(
                    f"{self.run_dir} already holds a run ({describe_run(self.run_dir)}); pass --resume "
                    "to continue it, or choose a new --out"
                )
            return None
        except BaseException:
            self.lock.release()
            raise

    def _autocast_dtype(self) -> torch.dtype | None:
        choice = self.options.autocast
        if choice == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else None
        return torch.bfloat16 if choice == "bf16" else None

    def _use_cuda_graph(self) -> bool:
        possible = (
            self.device.type == "cuda"
            and not self.context.is_distributed
            and isinstance(self.data.train, ExampleBatches)
            and self.data.train.transform is None
            and self.model_config.dropout == 0.0
        )
        if self.options.cuda_graph is None:
            return possible
        if self.options.cuda_graph and not possible:
            raise ValueError(
                "train.cuda_graph=true needs one CUDA process, an example dataset without a train-time "
                "transform, and dropout 0; set train.cuda_graph=false"
            )
        return self.options.cuda_graph

    def _best_metric(self) -> str:
        return self.options.best_metric or ("valid_accuracy" if self.data.is_task else "valid_loss")

    def _restore(self, state: dict) -> None:
        self.checkpoints.load_trainer_state(state, model=self.model, optimizer=self.optimizer)
        if self.lr_tensor is not None:  # keep the one device tensor the captured graph reads
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_tensor
        self.step = int(state["step"])
        self.resumed_from_world_size = state.get("world_size")  # None: written before checkpoints recorded it
        self.best = BestTracker(self._best_metric(), state.get("best", {}))
        self.seconds_before = float(state.get("seconds") or 0.0)
        if "seconds" not in state:  # a checkpoint written before they kept it: the run's summary at that step has it
            self.seconds_before = run_records.summary_seconds(self.run_dir, self.step)
        self.last_metrics = dict(state.get("metrics") or {})  # the last evaluation, until this run evaluates again
        # an extended run (a larger recipe.max_steps) keeps the schedule it was trained with (pope.train.schedule)
        horizon = (state.get("schedule") or {}).get("total_steps", self.recipe.max_steps)
        if isinstance(horizon, int) and self.recipe.warmup_steps <= horizon < self.recipe.max_steps:
            self.extended_from = horizon
            self.schedule = WarmupDecaySchedule(
                self.recipe.lr, self.recipe.min_lr, self.recipe.warmup_steps, horizon, self.recipe.lr_decay
            )

    # ------------------------------------------------------------------------------- steps, evaluation
    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step; returns this rank's loss share as a device scalar (no host sync)."""
        self.train_model.train()
        return self.step_function(step)

    def evaluate(self, split: str, progress=None, *, whole: bool = False) -> dict:
        """Loss and accuracy over a split with the uncompiled model (no recompiles for eval shapes); under
        FSDP2 that is the sharded module itself (fully_shard converts the module in place). Token streams:
        ``recipe.eval_batches`` batches, or every target once with ``whole`` (the final evaluation)."""
        return evaluate_split(
            self.model,
            self.data,
            split,
            batch_size=self._eval_batch_size(),
            max_batches=None if whole else self.recipe.eval_batches,
            shard=Shard(self.context.rank, self.context.world_size),
            device=self.device,
            autocast_dtype=self.autocast_dtype,
            progress=progress,
        )

    def _eval_batch_size(self) -> int:
        return self.options.eval_batch_size or self.recipe.batch_size

    def _evaluate_all(self, logger: MetricsLogger, *, final: bool) -> dict:
        metrics = {}
        for split in self.options.splits:
            if final:  # the last evaluation scores every target of the split and can be long: show it
                total = evaluation_batch_count(
                    self.data,
                    split,
                    batch_size=self._eval_batch_size(),
                    max_batches=None,
                    shard=Shard(self.context.rank, self.context.world_size),
                )
                with logger.evaluation_progress(f"final evaluation ({split})", total) as bar:
                    metrics.update(self.evaluate(split, bar, whole=True))
            else:
                metrics.update(self.evaluate(split))
        # how many of PoPE's δ entries lie outside [-2π, 0] (stopped learning under the forward clamp): its course
        # over training, next to the accuracy, shows when entries freeze (pope.encodings.polar)
        metrics.update(delta_outside_counts(self.model))
        logger.log({"step": self.step, "kind": "eval", **metrics})
        if self.best.update(self.step, metrics):
            self.save("best", metrics)
        return metrics

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self, name: str, metrics: dict | None = None) -> None:
        state = {
            "step": self.step,
            "world_size": self.context.world_size,
            "schedule": self.schedule.state_dict(),
            "data": self.data.train.state_dict(self.step),
            "best": self.best.state,
            "metrics": metrics or {},
            "run_config": self.config.to_dict(),
            "seconds": self._seconds(),
        }
        self.checkpoints.save(
            name,
            model=self.model,
            optimizer=self.optimizer,
            model_config=self.model_config.to_dict(),
            trainer_state=state,
        )

    # ------------------------------------------------------------------------------------------- loop
    def train(self) -> dict:
        """Run (or continue) the schedule; returns the summary also written to RUN/summary.json. A stop
        before the end (stop_at_step, max_seconds, SIGINT, SIGTERM) writes checkpoints/last first and
        prints how to continue; the summary's ``stop_reason`` says why it ended."""
        total = self.recipe.max_steps
        stop = min(total, self.options.stop_at_step or total)
        if self.resume_from is not None and self.step >= stop:
            return run_records.nothing_to_train(self, stop)
        self._started = time.perf_counter()
        try:
            return self._train(total, stop)
        except OSError as err:
            if err.errno not in WRITE_FAILURES:
                raise
            raise run_records.write_failure(self, err) from err

    def _train(self, total: int, stop: int) -> dict:
        run_records.archive_finished_summary(self)
        if self.is_main:
            print(run_records.start_banner(self), flush=True)
        run_records.write_records(self)
        logger = MetricsLogger(
            self.run_dir,
            enabled=self.is_main,
            total_steps=total,
            start_step=self.step,
            tensorboard=self.options.tensorboard,
            progress=self.options.progress,
        )
        checkpoint_every = self.options.checkpoint_interval or self.recipe.eval_interval
        tokens_per_step = self.recipe.batch_size * self.data.seq_len
        started = last_time = time.perf_counter()
        last_step = last_saved = self.step
        metrics, reason = dict(self.last_metrics), "finished"  # a stop before the next evaluation reports the last
        loss_sum, loss_steps = torch.zeros((), device=self.device), 0  # per-step losses since the last log
        scored_tokens = 0  # scored (non-padding) targets since the last log
        votes = StopVote(self.device)
        with StopSignals() as signals:
            try:
                while self.step < stop:
                    if self.options.max_seconds is not None and self._out_of_time(started):
                        reason = "max_seconds"
                        break
                    step = self.step
                    loss_sum += self.train_step(step)
                    loss_steps += 1
                    scored_tokens += self.data.train.scored_tokens(step)  # host arithmetic, no sync
                    self.step = step + 1
                    logger.advance()
                    if self.step % self.options.log_interval == 0 or self.step == stop:
                        loss = all_reduce_sum(loss_sum.clone()).item() / loss_steps  # host sync
                        now = time.perf_counter()
                        logger.log(
                            {
                                "step": self.step,
                                "kind": "train",
                                "loss": loss,
                                "lr": self.schedule(step),
                                "tokens_per_s": tokens_per_step * (self.step - last_step) / (now - last_time),
                                "scored_tokens_per_s": scored_tokens / (now - last_time),
                                "step_ms": 1000 * (now - last_time) / (self.step - last_step),
                            }
                        )
                        if not math.isfinite(loss):
                            raise RuntimeError(
                                f"training loss is {loss} at step {self.step}; lower recipe.lr or check the data"
                            )
                        loss_sum.zero_()
                        loss_steps, scored_tokens, last_time, last_step = 0, 0, now, self.step
                    if self.step % self.recipe.eval_interval == 0 or self.step == total:
                        metrics = self._evaluate_all(logger, final=self.step == total)
                    if self.step % checkpoint_every == 0 or self.step == stop:
                        self.save("last", metrics)
                        last_saved = self.step
                        last_time = time.perf_counter()  # keep checkpoint time out of tokens/s
                    if votes.poll(signals.received is not None) and self.step < stop:
                        reason = signals.received or "SIGTERM"  # a rank without the signal stops with the others
                        break
                if reason == "finished" and self.step < total:
                    reason = "stop_at_step"
                if self.step != last_saved:
                    self.save("last", metrics)
            finally:
                logger.close()
        summary = self.summary(metrics, self._seconds(), reason)
        if self.is_main:
            write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
            if reason != "finished":
                print(f"stopped at step {self.step}; continue with: {self.resume_hint()}", file=sys.stderr, flush=True)
        return summary

    def resume_hint(self) -> str:
        return resume_command(fallback=f"pope train --resume {self.run_dir}")

    def _seconds(self) -> float:
        """Wall time of training: the invocations up to the checkpoint resumed from, plus this one so far."""
        started = getattr(self, "_started", None)
        return self.seconds_before + (time.perf_counter() - started if started is not None else 0.0)

    def _out_of_time(self, started: float) -> bool:
        """Every rank stops at the same step: rank 0 decides (a broadcast every 100 steps)."""
        if self.step % 100:
            return False
        decision = torch.tensor(float(time.perf_counter() - started > self.options.max_seconds), device=self.device)
        if self.context.is_distributed:
            torch.distributed.broadcast(decision, src=0)
        return bool(decision.item())

    def summary(self, final_metrics: dict, seconds: float, reason: str) -> dict:
        """summary.json's record of this run at its current step."""
        return {
            "step": self.step,
            "finished": self.step >= self.recipe.max_steps,
            "stop_reason": reason,
            "seconds": seconds,
            "final": final_metrics,
            **self.best.summary(),
        }

    def close(self) -> None:
        """Release the run directory and the process group."""
        self.lock.release()
        teardown_distributed()


def _check_vocabulary(data, config: RunConfig) -> None:
    """The model must cover the data's vocabulary and every token id actually in it (a file that
    disagrees with its manifest would otherwise fail deep inside the embedding). Reads every split once."""
    vocab = config.model.vocab_size
    if vocab < data.vocab_size:
        raise ValueError(
            f"model.vocab_size {vocab} is smaller than the data's vocabulary ({data.vocab_size} ids); "
            f"leave model.vocab_size unset or set it to at least {data.vocab_size}"
        )
    source = config.train.data_dir or config.recipe.dataset
    if not data.is_task:  # name the prepared dataset's files
        source = resolve_dataset(source).path
    splits = {split: [inputs, targets] for split, (inputs, targets) in data.eval_examples.items()}
    splits.update({split: [tokens] for split, tokens in data.eval_tokens.items()})
    train = data.train
    splits["train"] = [train.inputs, train.targets] if isinstance(train, ExampleBatches) else [train.tokens]
    for split, arrays in splits.items():
        largest = max(int(a.max()) if isinstance(a, torch.Tensor) else int(a.max(initial=0)) for a in arrays)
        try:
            name = f"{source}/{split}.bin" if not data.is_task else f"the {split} split of {source}"
            check_token_range(np.array([largest]), vocab, data_name=name)
        except ValueError as err:
            raise ValueError(
                f"{err} The data does not match its dataset's manifest ({data.vocab_size} ids): "
                "re-prepare it (pope data prepare NAME --force) or point train.data_dir at intact data"
            ) from None


def run_training(config: RunConfig | dict, run_dir: str | os.PathLike, *, resume: bool = False) -> dict:
    trainer = Trainer(config, run_dir, resume=resume)
    try:
        return trainer.train()
    finally:
        trainer.close()

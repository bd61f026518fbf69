"""Seed sweeps: ``pope train PRESET --pe PE --seeds 0-7 --out DIR``.

A sweep runs one ordinary training process per seed,
``python -m pope.cli train PRESET --pe PE --seed N --out DIR/seed-N [--set ...]`` with the sweep's own
``--set`` overrides, so ``DIR/seed-N/`` is exactly what that single command writes and every eval,
report and analysis tool reads it unchanged. Around the children the sweep guarantees:

- placement: seeds are spread over the visible GPUs (each child sees one GPU through
  CUDA_VISIBLE_DEVICES), at most ``jobs_per_gpu`` children per GPU at a time; on a machine without a
  GPU (or with ``--set train.device=cpu``) one seed at a time unless ``jobs`` asks for more. ``jobs``
  also caps the total number of children on GPUs.
- logs: each child's stdout and stderr go to ``DIR/seed-N.log`` (appended to on resume), beside the
  run directory, never inside it.
- resume: with ``resume``, a seed whose ``summary.json`` says finished is skipped, a seed with a
  ``config.json`` and a ``checkpoints/`` directory continues (``--resume``), any other starts; without
  ``resume`` an existing ``DIR/seed-N`` is an error raised before any child starts.
- starting over: a seed whose run directory has a ``config.json`` but no ``checkpoints/`` died before its
  first checkpoint. When it holds only what a run writes before its first logged step (``config.json``,
  ``env.json``, an empty ``metrics.jsonl``, TensorBoard event files, the lock), nothing is lost: those are
  removed and the seed starts from scratch with the sweep's config (config differences in resume-mutable
  keys are named; any other difference is refused), its log appended to, and the summary says "restarted
  from scratch". Anything else (metrics rows, other files, a lock held by a live trainer) is left alone:
  the seed is not started and one line says what the directory holds and what to do.
- out of memory: a seed that fails with CUDA out of memory (its log says ``CUDA out of memory`` or
  ``CUDA error: out of memory``) while other seeds of the sweep run on its GPU is put back at the front of
  the queue, at most ``OOM_RETRIES`` times, and that GPU then takes no more seeds than are still running
  there: the seed starts again (starting over or resuming as above) once one of them has ended. With no
  other seed on its GPU it fails as any other failure.
- failures: a failing seed does not stop the others; the result names each failed seed and its log.
- progress: one bar over all seeds' steps (tqdm on a terminal, else a status line every
  ``STATUS_SECONDS``), read from each child's ``metrics.jsonl``.
- signals: SIGINT/SIGTERM are forwarded to every child as SIGINT (a second signal kills them); the
  sweep waits and reports which seeds can be resumed. Checkpoints are written atomically, so a stopped
  seed resumes from its ``checkpoints/last``. A seed that ends cleanly on a signal sent to it alone (to free
  its GPU share for the others) is "stopped", not failed, and resumable.
- ``DIR/sweep.json`` records every invocation's command and each seed's latest status.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pope
from pope.files import keep_aside, write_json_atomic
from pope.provenance import portable_argv
from pope.train.seed_runs import (
    SeedRun,
    die_with_parent,
    last_step,
    out_of_memory,
    report_lines,
    run_finished,
    stopped_by_own_signal,
    why_not_start_over,
)
from pope.train.sweep_settings import extends_run, merge_overrides, parse_seeds, setting_of

DEFAULT_JOBS_PER_GPU = 1
"""Concurrent seeds per GPU: one. Sharing a GPU pays little even where it pays most: for the smallest preset
(indirect-indexing) under CUDA MPS, two processes side by side gave 12 % more steps per second than one, and four
or eight no more than two (benchmarks/results/sweep_throughput.csv, one H100; benchmarks/sweep_throughput.py
measures it). Without MPS the processes time-slice the GPU, and a preset that fills the GPU gains nothing and may
run out of memory. For small models, ``--jobs-per-gpu 2`` with MPS on (scripts/cuda_mps.sh) is the measured best."""
STATUS_SECONDS = 60.0
POLL_SECONDS = 0.2
"""How soon a finished child is noticed and the next seed started; a poll reads the tail of each running seed's
metrics.jsonl, so a short interval costs nothing, and short seeds (tiny presets) do not idle between them."""
STOP_GRACE_SECONDS = 60.0
OOM_RETRIES = 2
"""How many times a seed that ran out of GPU memory next to other seeds is put back in the queue."""


def visible_gpus(overrides: list[str]) -> list[str]:
    """GPU ids a child may be given: the entries of CUDA_VISIBLE_DEVICES when set, else 0..count-1;
    none when the run is forced onto the CPU (train.device=cpu)."""
    if any(item.replace(" ", "") == "train.device=cpu" for item in overrides):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip() and gpu.strip() != "-1"]
    import torch  # here: importing a sweep must not import torch (run_finished, called once per run)

    return [str(i) for i in range(torch.cuda.device_count())]


def resolved_config(preset: str, pe: str, *, seed: int = 0, overrides: list[str] | None = None) -> dict:
    """pope.train.run_config.resolve_run_config in config.json's layout (sections of plain values)."""
    from pope.train.run_config import resolve_run_config  # here: it imports torch, and importing a sweep must not

    return resolve_run_config(preset, pe, seed=seed, overrides=overrides).to_dict()


class Sweep:
    def __init__(
        self,
        preset: str,
        pe: str,
        seeds: list[int],
        out: str | os.PathLike,
        *,
        overrides: list[str] | None = None,
        resume: bool = False,
        jobs_per_gpu: int | None = None,
        jobs: int | None = None,
        progress: bool | None = None,
    ) -> None:
        overrides = list(overrides or [])
        if not seeds:
            raise ValueError("a sweep needs at least one seed")
        if (jobs_per_gpu is not None and jobs_per_gpu < 1) or (jobs is not None and jobs < 1):
            raise ValueError("--jobs and --jobs-per-gpu must be positive")
        # Validates preset, PE and every override before anything starts; gives the step counts.
        config = resolved_config(preset, pe, seed=seeds[0], overrides=overrides)
        total = min(config["recipe"]["max_steps"], config["train"]["stop_at_step"] or config["recipe"]["max_steps"])
        self.config = config
        self.preset, self.pe, self.overrides, self.resume = preset, pe, overrides, resume
        self.out = Path(out)
        self.gpus = visible_gpus(overrides)
        self.jobs_per_gpu = jobs_per_gpu or DEFAULT_JOBS_PER_GPU
        self.jobs = jobs or (len(self.gpus) * self.jobs_per_gpu if self.gpus else 1)
        # at most this many seeds at a time on each GPU (None: the CPU); lowered where a seed ran out of memory
        self.limits = {gpu: self.jobs_per_gpu for gpu in self.gpus} if self.gpus else {None: self.jobs}
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.runs = [SeedRun(seed, self.out / f"seed-{seed}", self.out / f"seed-{seed}.log", total) for seed in seeds]
        existing = [r.run_dir for r in self.runs if r.run_dir.exists()]
        if existing and not resume:
            raise ValueError(
                f"{', '.join(map(str, existing))} already exist(s); pass --resume to continue the "
                "unfinished seeds and skip the finished ones, or choose another --out"
            )
        self._check_one_setting()
        for run in self.runs:
            if resume and run_finished(run.run_dir, total):
                run.status, run.step = "skipped", last_step(run.run_dir / "metrics.jsonl")
        self._signal: int | None = None
        self._killed = False
        self._bar = None

    def _check_one_setting(self) -> None:
        """A sweep directory holds one setting: refuse seeds that would differ from the runs already in it
        in anything but the seed and how they are executed (a bad override, or the wrong --out)."""
        wanted = setting_of(self.config)
        for config_path in sorted(self.out.glob("seed-*/config.json")):
            try:
                found = setting_of(json.loads(config_path.read_text()))
            except ValueError:
                continue  # a damaged run record: its own seed resumes from its checkpoint's copy, or is reported
            differences = sorted(k for k in set(wanted) | set(found) if wanted.get(k) != found.get(k))
            if self.resume:  # a sweep extended on --resume (a larger recipe.max_steps): each seed continues
                differences = [k for k in differences if not extends_run(k, found.get(k), wanted.get(k))]
            if differences:
                shown = ", ".join(
                    f"{k}: {json.dumps(found.get(k))} there, {json.dumps(wanted.get(k))} now" for k in differences[:6]
                )
                raise ValueError(
                    f"{self.out} holds runs of another setting ({config_path.parent.name}: {shown}); "
                    "a sweep directory holds one setting: choose another --out or the same --set values"
                )

    # -------------------------------------------------------------------------------------- children
    def child_sets(self) -> list[str]:
        # no per-child bar (the sweep shows one) unless asked for; it changes no result (a resume-mutable key)
        given = {item.partition("=")[0].strip() for item in self.overrides}
        return [*([] if "train.progress" in given else ["train.progress=false"]), *self.overrides]

    def child_command(self, run: SeedRun) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "pope.cli",
            "train",
            self.preset,
            "--pe",
            self.pe,
            "--seed",
            str(run.seed),
            "--out",
            str(run.run_dir),
            *[x for s in self.child_sets() for x in ("--set", s)],
        ]
        if (run.run_dir / "config.json").exists():
            command.append("--resume")
        return command

    def _child_env(self, gpu: str | None) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        source_root = str(Path(pope.__file__).resolve().parents[1])  # children import this same pope
        env["PYTHONPATH"] = os.pathsep.join([source_root, *filter(None, [env.get("PYTHONPATH")])])
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        return env

    def _start(self, run: SeedRun, gpu: str | None) -> bool:
        """Start the seed's child; False when its run directory may not be touched (the seed then failed)."""
        self.out.mkdir(parents=True, exist_ok=True)
        reason = self._start_over_if_empty(run)
        if reason is not None:
            run.status, run.reason = "failed", reason
            run.log_line(f"not started: {reason}")
            self._say(f"seed {run.seed} not started: {reason}")
            return False
        command = self.child_command(run)
        handle = open(run.log, "a", buffering=1)
        handle.write(
            f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gpu={gpu} {subprocess.list2cmdline(command)}\n"
        )
        run._log_offset = handle.tell()
        run.process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._child_env(gpu),
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        run._log_handle, run.gpu, run.status, run.returncode = handle, gpu, "running", None
        return True

    def _start_over_if_empty(self, run: SeedRun) -> str | None:
        """A run directory with a config.json and no checkpoints/ died before its first checkpoint: empty it when
        it holds only start-up records of this seed (see the module docstring), so the seed starts from scratch.
        Returns why the seed must not start (the directory is then left as it is), or None."""
        # here: they import torch, and importing a sweep must not
        from pope.train.run_config import config_differences
        from pope.train.rundir import RunLock

        if not (run.run_dir / "config.json").is_file() or (run.run_dir / "checkpoints").exists():
            return None  # a new seed, or one that --resume continues (the child checks its checkpoint)
        config = resolved_config(self.preset, self.pe, seed=run.seed, overrides=self.child_sets())
        if problem := why_not_start_over(run.run_dir, run.seed, config):
            return problem
        lock = RunLock(run.run_dir)  # no trainer may write there while it is emptied
        try:
            lock.acquire()
        except RuntimeError as err:
            return str(err)
        try:
            if problem := why_not_start_over(run.run_dir, run.seed, config):  # changed before the lock was taken
                return problem
            changed = config_differences(json.loads((run.run_dir / "config.json").read_text()), config, ignore=set())
            for name in ("config.json", "env.json", "metrics.jsonl"):
                (run.run_dir / name).unlink(missing_ok=True)
            if (run.run_dir / "tensorboard").is_dir():
                shutil.rmtree(run.run_dir / "tensorboard")
        finally:
            lock.release()
        told = f"; its config.json differed ({'; '.join(changed)}), the sweep's is used" if changed else ""
        run.note("restarted from scratch" + told)
        run.log_line(f"starting over: {run.run_dir} held only start-up records (no checkpoint, no metrics){told}")
        self._say(f"seed {run.seed} starts over: {run.run_dir} had no checkpoint and no metrics{told}")
        return None

    def _finish(self, run: SeedRun, returncode: int) -> None:
        run._log_handle.close()
        run.process, run.returncode = None, returncode
        run.step = last_step(run.run_dir / "metrics.jsonl")
        if returncode == 0:
            run.status = "finished" if run_finished(run.run_dir) else "stopped"
        elif self._signal is not None:
            run.status = "interrupted"
        elif (signal_name := stopped_by_own_signal(run.run_dir, returncode)) is not None:
            run.status = "stopped"
            run.note(f"stopped by a {signal_name} sent to this seed alone; --resume continues it")
        else:
            run.status = "failed"

    def _free_slot(self, running: list[SeedRun]) -> str | None | bool:
        """The least-loaded GPU id (or None for CPU) with room for one more child, or False when all are busy."""
        if len(running) >= self.jobs:
            return False
        load = {slot: sum(r.gpu == slot for r in running) for slot in self.limits}
        free = [slot for slot in self.limits if load[slot] < self.limits[slot]]
        return min(free, key=load.get) if free else False

    def _requeue_after_out_of_memory(self, run: SeedRun) -> bool:
        """True when a failed seed ran out of GPU memory next to other seeds of the sweep on its GPU (and has
        retries left): its GPU's limit drops to the seeds still running there, and it is to be queued again."""
        if run.status != "failed" or run.oom_retries >= OOM_RETRIES or not out_of_memory(run):
            return False
        others = sum(r.status == "running" and r.gpu == run.gpu for r in self.runs)
        if not others:
            return False
        run.oom_retries += 1
        run.status = "pending"
        self.limits[run.gpu] = others
        run.note("requeued after CUDA out of memory")
        where = "the CPU" if run.gpu is None else f"GPU {run.gpu}"
        self._say(
            f"seed {run.seed} ran out of GPU memory (log {run.log}); it runs again when another seed ends "
            f"({where} now takes {others} seed(s) at a time)"
        )
        return True

    # ------------------------------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        first = self._signal is None
        self._signal = signum
        for run in self.runs:
            if run.process is not None and run.process.poll() is None:
                run.process.send_signal(signal.SIGINT if first else signal.SIGKILL)
        self._killed = not first

    # --------------------------------------------------------------------------------------- loop
    def run(self) -> list[SeedRun]:
        """Run every seed not skipped; returns the seeds with their final status."""
        # here: they import torch, and importing a sweep must not
        from pope.train.run_config import TrainOptions
        from pope.train.training_data import prepare_data

        if any(r.status != "skipped" for r in self.runs):  # once, not by several children at the same time
            prepare_data(self.config["recipe"], TrainOptions(**self.config["train"]))
        invocation = {
            "command": portable_argv(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seeds": [r.seed for r in self.runs],
            "resume": self.resume,
            "gpus": self.gpus,
            "jobs_per_gpu": self.jobs_per_gpu if self.gpus else None,
            "jobs": self.jobs,
        }
        self._write_record(invocation)
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = self._bar = self._progress_bar()
        queue = [r for r in self.runs if r.status != "skipped"]
        stop_deadline = None
        last_status = time.monotonic()
        try:
            while True:
                running = [r for r in self.runs if r.status == "running"]
                while queue and self._signal is None and (slot := self._free_slot(running)) is not False:
                    run = queue.pop(0)
                    if self._start(run, slot):
                        running.append(run)
                    self._write_record(invocation)
                ended = []
                for run in running:
                    returncode = run.process.poll()
                    if returncode is not None:
                        self._finish(run, returncode)
                        ended.append(run)
                    else:
                        run.step = last_step(run.run_dir / "metrics.jsonl")
                queue[:0] = [run for run in ended if self._requeue_after_out_of_memory(run)]
                if ended:
                    self._write_record(invocation)
                running = [r for r in self.runs if r.status == "running"]
                if bar is not None:
                    self._update_bar(bar)
                elif time.monotonic() - last_status > STATUS_SECONDS:
                    print("sweep: " + self.status_line(), file=sys.stderr, flush=True)
                    last_status = time.monotonic()
                if not running and (not queue or self._signal is not None):
                    break
                if self._signal is not None:
                    stop_deadline = stop_deadline or time.monotonic() + STOP_GRACE_SECONDS
                    if time.monotonic() > stop_deadline and not self._killed:
                        self._on_signal(self._signal, None)  # children ignored SIGINT: kill them
                time.sleep(POLL_SECONDS)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            if bar is not None:
                self._update_bar(bar)
                bar.close()
            self._write_record(invocation)
        return self.runs

    def _say(self, text: str) -> None:
        """A line on stderr while the sweep runs (above the progress bar when there is one)."""
        (self._bar.write if self._bar is not None else print)(f"sweep: {text}", file=sys.stderr)

    def status_line(self) -> str:
        done = sum(min(r.step, r.total_steps) for r in self.runs)
        total = sum(r.total_steps for r in self.runs)
        counts = {}
        for run in self.runs:
            counts[run.status] = counts.get(run.status, 0) + 1
        states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        seeds = " ".join(f"{r.seed}:{r.step}" for r in self.runs if r.status == "running")
        return f"{done}/{total} steps ({states})" + (f"; running seed:step {seeds}" if seeds else "")

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm.auto import tqdm  # here: ~50 ms, and shell scripts import this module once per run (run_finished)

        return tqdm(
            total=sum(r.total_steps for r in self.runs),
            unit="step",
            dynamic_ncols=True,
            desc=f"sweep {self.pe} x{len(self.runs)}",
        )

    def _update_bar(self, bar) -> None:
        bar.n = sum(min(r.step, r.total_steps) for r in self.runs)
        counts = {}
        for run in self.runs:
            counts[run.status] = counts.get(run.status, 0) + 1
        bar.set_postfix_str(" ".join(f"{status}={n}" for status, n in sorted(counts.items())), refresh=False)
        bar.refresh()

    def _write_record(self, invocation: dict) -> None:
        """Update DIR/sweep.json atomically. A record that is not valid JSON (damaged outside pope: its writes are
        atomic) is kept as sweep.json.damaged, with a notice, and a new one is written from this invocation."""
        path = self.out / "sweep.json"
        record = {"preset": self.preset, "pe": self.pe, "overrides": self.overrides, "invocations": [], "seeds": {}}
        if path.exists():
            try:
                stored = json.loads(path.read_text())
                if not isinstance(stored, dict):
                    raise ValueError("not a JSON object")
                record = {**record, **stored}
                record["overrides"] = merge_overrides(record.get("overrides") or [], self.overrides)
            except (ValueError, UnicodeDecodeError) as err:
                kept = keep_aside(path)
                self._say(f"{path} was damaged ({err}); kept as {kept.name}, a new record is written")
        invocations = [
            i
            for i in record["invocations"]
            if i.get("started_utc") != invocation["started_utc"] or i.get("command") != invocation["command"]
        ]
        record["invocations"] = invocations + [invocation]
        record["seeds"].update({str(r.seed): r.record() for r in self.runs})
        if self.out.exists():
            write_json_atomic(path, record)


def run_sweep_command(
    preset: str,
    pe: str,
    seeds_text: str,
    out: str,
    *,
    overrides: list[str],
    resume: bool,
    jobs_per_gpu: int | None,
    jobs: int | None,
) -> int:
    """`pope train PRESET --pe PE --seeds ...`: run the sweep, print one line per seed; 1 if a seed failed."""
    sweep = Sweep(
        preset,
        pe,
        parse_seeds(seeds_text),
        out,
        overrides=overrides,
        resume=resume,
        jobs_per_gpu=jobs_per_gpu,
        jobs=jobs,
    )
    placement = (
        f"{len(sweep.gpus)} GPU(s) x {sweep.jobs_per_gpu} job(s), at most {sweep.jobs} at once"
        if sweep.gpus
        else f"CPU, {sweep.jobs} at a time"
        + (" (no GPU visible: --jobs-per-gpu does not apply; --jobs sets how many)" if jobs_per_gpu else "")
    )
    print(f"sweep: {preset} --pe {pe}, seeds {[r.seed for r in sweep.runs]} -> {out} ({placement})", flush=True)
    lines, ok = report_lines(sweep.run())
    print("\n".join(lines), flush=True)
    return 0 if ok else 1

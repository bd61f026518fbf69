"""The reproduction's GPU stages (results/REPRODUCTION.md): each stage trains its seed sweeps with `pope train
--seeds`, then fine-tunes, evaluates and reports with the pope CLI, everything under --out.

    PYTHONPATH=src python scripts/reproduce.py jsb maestro --out runs/reproduce
    PYTHONPATH=src python scripts/reproduce.py genome --out runs/reproduce --max-seconds 3600           # a 1-h job
    PYTHONPATH=src python scripts/reproduce.py genome --out runs/reproduce --max-seconds 3600 --resume  # the next

Stages (preset; seeds, default in brackets, --seeds replaces them):
  indirect        indirect-indexing: PoPE and RoPE [0-2]; where each finished PoPE seed's delta ended up
                  (pope analyze delta of its final weights)
  jsb             jsb: PoPE (delta uniform) and RoPE [0-4]
  maestro         maestro, a 2000-step schedule (warmup 100, an evaluation every 50 steps, the best-valid
                  checkpoint kept): PoPE and RoPE [0-4]
  genome          genome-small: PoPE delta=U, RoPE and PoPE delta=0 [0-2]; ALiBi and NoPE (first seed); YaRN and
                  PoPE+ft fine-tuned at 4x the training length from the last seed of RoPE and of PoPE delta=0;
                  perplexity at 1x..10x of every run; frequency usage of the last seed's three runs
  text            text-256: RoPE and PoPE delta=0 [0-2]; PoPE delta=U, ALiBi and NoPE (first seed); YaRN and
                  PoPE+ft at 4x from the first seed; perplexity at 1x..10x and at 16x, 20x; frequency usage of
                  the first seed's RoPE, PoPE delta=0 and PoPE delta=U
  text-ablations  text-256: full PoPE (delta=0) beside identity magnitude, ReLU magnitude and no delta
                  (--ablations) [0-2]; perplexity at 1x..10x; frequency usage of each setting's first seed
Every stage ends with `pope report` of its runs into OUT/report-STAGE (text-ablations: against the full PoPE).
Sweeps are OUT/STAGE-SETTING/seed-N (e.g. OUT/genome-pope-d0/seed-2), fine-tunes OUT/SWEEP-ftCONTEXT, length
evaluations OUT/length-NAME; each command's output goes to OUT/logs/NAME.log.

A stage's sweeps run one after another, each with --jobs-per-gpu seeds at a time per visible GPU (default pope's:
one). Small models gain from sharing a GPU under CUDA MPS (scripts/cuda_mps.sh start, then --jobs-per-gpu 2).

Time limit and resume, as on any time-limited cluster job: with --max-seconds N the script asks the running
command to stop --grace-seconds before N (SIGINT: each training process finishes its step and writes
checkpoints/last) and starts nothing after that; a command still running at N is killed (a second SIGINT, which
makes a sweep kill its seeds; SIGKILL 10 s later), and its runs continue from their last checkpoint. SIGINT or
SIGTERM sent to the script (Ctrl-C, a scheduler's warning signal) stops it the same way, a second one as the limit
does. The same command with --resume then continues: finished seeds are skipped, stopped ones continue from their
checkpoints, fine-tunes resume, and an evaluation runs again only where its results are missing or cover other
runs. Without --resume the script
refuses an --out that already holds a stage's runs, so nothing is overwritten.

Exit status: 0 when every command ended well, 1 when one failed (the others still ran; the failed command's log
is named), 2 for bad arguments, 3 when stopped by --max-seconds or a signal (rerun with --resume).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pope.train.sweep import run_finished
from pope.train.sweep_settings import parse_seeds

STAGES = ("indirect", "jsb", "maestro", "genome", "text", "text-ablations")
PRESETS = {
    "indirect": "indirect-indexing",
    "jsb": "jsb",
    "maestro": "maestro",
    "genome": "genome-small",
    "text": "text-256",
    "text-ablations": "text-256",
}
SEEDS = {"indirect": "0-2", "jsb": "0-4", "maestro": "0-4", "genome": "0-2", "text": "0-2", "text-ablations": "0-2"}
STAGE_SETS = {
    # indirect-indexing trains 100k steps of a small model: evaluate in large batches, checkpoint and log less
    "indirect": ("train.eval_batch_size=1000", "train.checkpoint_interval=25000", "train.log_interval=500"),
    # the MAESTRO stand-in holds ~10 steps an epoch: 2000 steps are far past its validation minimum (step 350-500)
    "maestro": ("recipe.max_steps=2000", "recipe.warmup_steps=100", "recipe.eval_interval=50"),
}
FINETUNE_ARGS = {"genome": "--set recipe.grad_accum=2"}  # batch 64 x 4000 tokens as two micro-batches of 32
ABLATIONS = {
    "identity": "pope:delta_init=zero,magnitude=identity",
    "relu": "pope:delta_init=zero,magnitude=relu",
    "no-delta": "pope:use_delta=false",
    "wrap": "pope:delta_init=zero,delta_range=wrap",
}
DEFAULT_ABLATIONS = "identity,relu,no-delta"
LENGTH_FACTORS = (1, 2, 4, 8, 10)
FINETUNE_FACTOR = 4
STOPPED = 3
KILL_SECONDS = 10.0
"""After the second SIGINT (past the limit, or a second signal), how long a command has before it is killed."""


class Stopped(Exception):
    """The time limit or a signal stopped the call; every run it touched can be resumed."""


class Reproduction:
    """Runs pope CLI commands one at a time under --out, with the time limit, signals and resume rules above."""

    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        self.args, self.argv = args, argv
        self.out: Path = args.out
        self.started = time.monotonic()
        self.deadline = None if args.max_seconds is None else self.started + args.max_seconds
        self.stop_at = None if self.deadline is None else self.deadline - args.grace_seconds
        self.signal_name: str | None = None
        self.signals = 0
        self.process: subprocess.Popen | None = None
        self.failed: list[str] = []
        self.stop_reason: str | None = None
        self.killed: str | None = None  # a command still running at the limit
        self.command = [sys.executable, "-m", "pope.cli"]  # what `pope` is

    # ------------------------------------------------------------------ running one command
    def on_signal(self, signum, frame) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name
        self.signals += 1

    def _past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def _stop_requested(self) -> str | None:
        if self.signal_name is not None:
            return self.signal_name
        if self.stop_at is not None and time.monotonic() >= self.stop_at:
            return "--max-seconds"
        return None

    def pope(self, name: str, argv: list[str]) -> bool:
        """Run `pope ARGV` with its output in OUT/logs/NAME.log; True when it exits 0. Raises Stopped when the
        time limit or a signal stopped it (or came before it started)."""
        reason = self._stop_requested()
        if reason is not None:
            self.stop_reason = reason
            raise Stopped
        log = self.out / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{name}: pope {shlex.join(argv)}", flush=True)
        with open(log, "ab") as handle:
            handle.write(f"\n$ pope {shlex.join(argv)}\n".encode())
            handle.flush()
            # its own session: a terminal's Ctrl-C reaches this script only, which passes it on as one SIGINT
            self.process = subprocess.Popen(
                [*self.command, *argv],
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            asked = pressed = None
            while True:
                try:
                    returncode = self.process.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if asked is None and (reason := self._stop_requested()) is not None:
                    self.stop_reason = asked = reason
                    self.process.send_signal(signal.SIGINT)  # a sweep passes it on to every seed
                elif asked is not None and pressed is None and (self.signals > 1 or self._past_deadline(now)):
                    # out of time, or a second signal: a second SIGINT makes a sweep kill its seeds
                    pressed = now
                    self.process.send_signal(signal.SIGINT)
                    self.killed = name
                elif pressed is not None and now - pressed > KILL_SECONDS:
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process = None
        if asked is not None:
            print(f"{name}: stopped ({asked}); log {log}", flush=True)
            raise Stopped
        if returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:]
            print(f"{name}: FAILED (exit {returncode}); log {log}" + (f": {tail[0]}" if tail else ""), flush=True)
            self.failed.append(name)
            return False
        print(f"{name}: done", flush=True)
        return True

    # ------------------------------------------------------------------ the pieces of a stage
    def preset(self, stage: str) -> str:
        return self.args.preset or PRESETS[stage]

    def seeds(self, stage: str) -> list[int]:
        return parse_seeds(self.args.seeds or SEEDS[stage])

    def train_sets(self, stage: str) -> list[str]:
        """The stage's settings, each unless --set gives that key (pope train takes a key once), then --set."""
        given = {item.partition("=")[0] for item in self.args.set}
        defaults = [*STAGE_SETS.get(stage, ()), "train.progress=false"]
        if self.args.device:
            defaults.append(f"train.device={self.args.device}")
        return [s for s in defaults if s.partition("=")[0] not in given] + self.args.set

    def sweep(self, stage: str, name: str, pe: str, seeds: list[int]) -> Path:
        """`pope train PRESET --pe PE --seeds ... --out OUT/NAME --resume`: missing seeds start, finished ones are
        skipped, stopped ones continue (without --resume the directory did not exist: checked up front)."""
        out = self.out / name
        argv = ["train", self.preset(stage), "--pe", pe, "--seeds", ",".join(map(str, seeds))]
        argv += ["--out", str(out), "--resume"]
        if self.args.jobs_per_gpu is not None:
            argv += ["--jobs-per-gpu", str(self.args.jobs_per_gpu)]
        for item in self.train_sets(stage):
            argv += ["--set", item]
        self.pope(name, argv)
        return out

    def training_length(self, *sweeps: Path) -> int | None:
        """recipe.seq_len of the first seed that started in any of the sweeps (None when none has)."""
        for sweep in sweeps:
            for config in sorted(sweep.glob("seed-*/config.json")):
                return int(json.loads(config.read_text())["recipe"]["seq_len"])
        return None

    def finetune(self, stage: str, run: Path, sweep: Path, context: int) -> Path:
        """`pope finetune RUN --context C` into OUT/SWEEP-ftC (RoPE -> YaRN, PoPE -> PoPE+ft), once RUN has
        finished; a finished fine-tune is skipped, an interrupted one resumed."""
        out = self.out / f"{sweep.name}-ft{context}"
        if not run_finished(run) or run_finished(out):
            return out
        argv = ["finetune", str(run), "--context", str(context), "--steps", str(self.args.finetune_steps)]
        argv += ["--out", str(out)] + (["--resume"] if (out / "checkpoints" / "last").exists() else [])
        if self.args.device:
            argv += ["--set", f"train.device={self.args.device}"]
        argv += ["--set", "train.progress=false"]
        extra = self.args.finetune_args if self.args.finetune_args is not None else FINETUNE_ARGS.get(stage, "")
        self.pope(out.name, argv + shlex.split(extra))
        return out

    def length(self, name: str, data: str, lengths: list[int], runs: list[Path]) -> None:
        """`pope eval length` of the finished runs into OUT/length-NAME, unless its results already cover exactly
        these runs at these lengths."""
        finished = [run for run in runs if run_finished(run)]
        if not finished or not lengths:
            print(f"length-{name}: no finished run yet", flush=True)
            return
        out = self.out / f"length-{name}"
        if _length_done(out / "length.json", finished, lengths):
            return
        argv = ["eval", "length", *map(str, finished), "--data", data, "--lengths", ",".join(map(str, lengths))]
        argv += ["--out", str(out)] + (["--device", self.args.device] if self.args.device else [])
        self.pope(out.name, argv + shlex.split(self.args.eval_args))

    def frequencies(self, data: str, runs: list[Path]) -> None:
        """`pope analyze frequencies` of each finished run on DATA's test split, unless it has them."""
        for run in runs:
            if run_finished(run) and not (run / "eval" / "frequencies" / "frequency_usage.json").exists():
                argv = ["analyze", "frequencies", str(run), "--data", data, "--split", "test"]
                argv += ["--device", self.args.device] if self.args.device else []
                self.pope(f"frequencies-{run.parent.name}-{run.name}", argv)

    def delta(self, runs: list[Path]) -> None:
        """`pope analyze delta` of each finished run's final weights, unless it has it."""
        for run in runs:
            target = run / "eval" / "delta_state.json"
            if run_finished(run) and not target.exists():
                argv = ["analyze", "delta", str(run / "checkpoints" / "last"), "--out", str(target)]
                self.pope(f"delta-{run.parent.name}-{run.name}", argv)

    def report(self, stage: str, dirs: list[Path], against: Path | None = None) -> None:
        present = [d for d in dirs if (d / "sweep.json").exists() or (d / "config.json").exists()]
        if present:
            argv = ["report", *map(str, present), "--out", str(self.out / f"report-{stage}")]
            self.pope(f"report-{stage}", argv + (["--against", str(against)] if against else []))

    # ------------------------------------------------------------------ the stages
    def stage_dirs(self, stage: str) -> list[str]:
        """The directory names a stage writes first (its sweeps): their presence means an earlier call."""
        names = {
            "indirect": ["indirect-pope", "indirect-rope"],
            "jsb": ["jsb-pope", "jsb-rope"],
            "maestro": ["maestro-pope", "maestro-rope"],
            "genome": [f"genome-{s}" for s in ("pope", "rope", "pope-d0", "alibi", "nope")],
            "text": [f"text-{s}" for s in ("rope", "pope-d0", "pope-du", "alibi", "nope")],
            "text-ablations": ["ablation-full", *(f"ablation-{a}" for a in self.ablations())],
        }
        return names[stage]

    def ablations(self) -> list[str]:
        return [a.strip() for a in self.args.ablations.split(",") if a.strip()]

    def run_stage(self, stage: str) -> None:
        seeds = self.seeds(stage)
        first, last = seeds[:1], seeds[-1:]
        if stage in ("indirect", "jsb", "maestro"):
            pope = self.sweep(stage, f"{stage}-pope", "pope", seeds)
            rope = self.sweep(stage, f"{stage}-rope", "rope", seeds)
            if stage == "indirect":
                self.delta(seed_runs(pope))
            self.report(stage, [pope, rope])
        elif stage == "genome":
            trained = {
                "pope": self.sweep(stage, "genome-pope", "pope", seeds),
                "rope": self.sweep(stage, "genome-rope", "rope", seeds),
                "pope-d0": self.sweep(stage, "genome-pope-d0", "pope:delta_init=zero", seeds),
                "alibi": self.sweep(stage, "genome-alibi", "alibi", first),
                "nope": self.sweep(stage, "genome-nope", "nope", first),
            }
            self.evaluate(stage, "genome", "genome", trained, ["rope", "pope-d0"], last[0], ["pope", "rope", "pope-d0"])
        elif stage == "text":
            trained = {
                "rope": self.sweep(stage, "text-rope", "rope", seeds),
                "pope-d0": self.sweep(stage, "text-pope-d0", "pope:delta_init=zero", seeds),
                "pope-du": self.sweep(stage, "text-pope-du", "pope:delta_init=uniform", first),
                "alibi": self.sweep(stage, "text-alibi", "alibi", first),
                "nope": self.sweep(stage, "text-nope", "nope", first),
            }
            self.evaluate(stage, "text", "text", trained, ["rope", "pope-d0"], first[0], ["rope", "pope-d0", "pope-du"])
        else:  # text-ablations
            full = self.sweep(stage, "ablation-full", "pope:delta_init=zero", seeds)
            ablated = [self.sweep(stage, f"ablation-{a}", ABLATIONS[a], seeds) for a in self.ablations()]
            sweeps = [full, *ablated]
            runs = [run for sweep in sweeps for run in seed_runs(sweep)]
            n = self.training_length(*sweeps)
            self.length("ablations", "text", [n * f for f in LENGTH_FACTORS] if n else [], runs)
            self.frequencies("text", [sweep / f"seed-{first[0]}" for sweep in sweeps])
            self.report(stage, sweeps, against=full if (full / "sweep.json").exists() else None)

    def evaluate(self, stage, prefix, data, trained: dict, tuned: list[str], tune_seed: int, usage: list[str]):
        """The genome and text stages after training: fine-tunes at 4x from seed ``tune_seed`` of the ``tuned``
        sweeps, length evaluation of every run and fine-tune, frequency usage of that seed of the ``usage``
        sweeps, the report."""
        n = self.training_length(*trained.values())
        finetunes = []
        if n is not None:
            for key in tuned:
                sweep = trained[key]
                finetunes.append(self.finetune(stage, sweep / f"seed-{tune_seed}", sweep, FINETUNE_FACTOR * n))
        runs = [run for sweep in trained.values() for run in seed_runs(sweep)] + finetunes
        self.length(prefix, data, [n * f for f in LENGTH_FACTORS] if n else [], runs)
        if stage == "text":  # how far past 10x the flat curves hold
            self.length(f"{prefix}-long", data, [n * 16, n * 20] if n else [], runs)
        self.frequencies(data, [trained[key] / f"seed-{tune_seed}" for key in usage])
        self.report(stage, [*trained.values(), *finetunes])

    def resume_line(self) -> str:
        argv = list(self.argv) + ([] if "--resume" in self.argv else ["--resume"])
        return f"python {shlex.join([sys.argv[0], *argv])}"


def seed_runs(sweep: Path) -> list[Path]:
    """The seed directories of a sweep, by seed (not the seed-N.log files beside them)."""
    runs = [p for p in sweep.glob("seed-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(runs, key=lambda p: int(p.name[5:]))


def _length_done(path: Path, runs: list[Path], lengths: list[int]) -> bool:
    try:
        evaluated = json.loads(path.read_text())["runs"]
        covered = {Path(entry["run"]).resolve(): {r["length"] for r in entry["results"]} for entry in evaluated}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return covered == {run.resolve(): set(lengths) for run in runs}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="reproduce.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stages", nargs="+", metavar="STAGE", help=f"one or more of {', '.join(STAGES)}, or all")
    parser.add_argument("--out", type=Path, required=True, help="directory of every run, evaluation and log")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop cleanly by this wall-clock limit")
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=60.0,
        help="with --max-seconds: ask the running command to stop this long before the limit (default 60)",
    )
    parser.add_argument("--resume", action="store_true", help="continue the runs an earlier call left in --out")
    parser.add_argument("--seeds", default=None, help="the seeds of every multi-seed sweep, e.g. 0-4 (see above)")
    parser.add_argument("--preset", default=None, help="train this preset instead of the stage's (one stage only)")
    parser.add_argument("--jobs-per-gpu", type=int, default=None, help="seeds at once per GPU in each sweep")
    parser.add_argument("--device", default=None, help="cpu or cuda for training and evaluation (default: auto)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a `pope train --set` for every sweep (repeatable)",
    )
    parser.add_argument("--finetune-steps", type=int, default=500, help="steps of each fine-tune (default 500)")
    parser.add_argument(
        "--finetune-args",
        default=None,
        help=f"more `pope finetune` arguments, in place of the stage's own (genome: {FINETUNE_ARGS['genome']!r})",
    )
    parser.add_argument("--eval-args", default="", help="more `pope eval length` arguments, e.g. '--bf16'")
    parser.add_argument(
        "--ablations",
        default=DEFAULT_ABLATIONS,
        help=f"text-ablations: the settings beside the full PoPE, from {', '.join(ABLATIONS)} "
        f"(default {DEFAULT_ABLATIONS})",
    )
    args = parser.parse_args(argv)
    args.stages = list(STAGES) if args.stages == ["all"] else args.stages
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; give one or more of {', '.join(STAGES)}, or all")
    if len(set(args.stages)) < len(args.stages):
        parser.error("a stage is named twice; name each once")
    if args.preset and len(args.stages) > 1:
        parser.error("--preset replaces one stage's preset; name one stage with it")
    if args.max_seconds is not None and args.max_seconds <= args.grace_seconds:
        parser.error(f"--max-seconds {args.max_seconds:g} leaves no time before the {args.grace_seconds:g}-s grace")
    if args.jobs_per_gpu is not None and args.jobs_per_gpu < 1:
        parser.error("--jobs-per-gpu must be at least 1")
    if args.finetune_steps < 1:
        parser.error("--finetune-steps must be at least 1")
    bad = [a for a in args.ablations.split(",") if a.strip() and a.strip() not in ABLATIONS]
    if bad:
        parser.error(f"--ablations takes {', '.join(ABLATIONS)}, not {bad[0]!r}")
    if "text-ablations" in args.stages and not any(a.strip() for a in args.ablations.split(",")):
        parser.error("--ablations is empty: name at least one setting to train beside the full PoPE")
    if args.seeds is not None:
        try:
            parse_seeds(args.seeds)
        except ValueError as error:
            parser.error(str(error))
    if any("=" not in item for item in args.set):
        parser.error("--set takes SECTION.KEY=VALUE, e.g. --set train.compile=false")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    reproduction = Reproduction(args, argv)
    if not args.resume:
        earlier = [args.out / name for s in args.stages for name in reproduction.stage_dirs(s)]
        earlier = [path for path in earlier if path.exists()]
        if earlier:
            print(
                f"reproduce.py: {earlier[0]} already exists (an earlier call's runs); add --resume to continue "
                "them, or give a new --out",
                file=sys.stderr,
            )
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    handlers = {s: signal.signal(s, reproduction.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for stage in args.stages:
            print(f"== stage {stage} ({reproduction.preset(stage)})", flush=True)
            reproduction.run_stage(stage)
    except Stopped:
        seconds = time.monotonic() - reproduction.started
        how = (
            f"{reproduction.killed} did not stop in time and was killed (its runs continue from their last checkpoint)"
            if reproduction.killed
            else "every run checkpointed"
        )
        print(
            f"reproduce.py: stopped by {reproduction.stop_reason} after {seconds:.0f} s, {how}; "
            f"continue with: {reproduction.resume_line()}",
            flush=True,
        )
        return STOPPED
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if reproduction.failed:
        print(
            f"reproduce.py: {len(reproduction.failed)} command(s) failed: {', '.join(reproduction.failed)} "
            f"(logs in {args.out / 'logs'})",
            flush=True,
        )
        return 1
    print(f"reproduce.py: {', '.join(args.stages)} done in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

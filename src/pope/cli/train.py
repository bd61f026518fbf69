"""`pope train` and `pope finetune` (thin: argument parsing over pope.train).

    pope train PRESET --pe NAME --out DIR [--set section.key=value ...] [--resume] [--seed N]
    pope train --resume RUN [--set ...]          (RUN's own config; --set recipe.max_steps=N extends it)
    pope train PRESET [--pe NAME] [--set ...] --print-config     (every setting, nothing run)
    pope train PRESET --pe NAME --seeds 0-7 --out DIR [--jobs-per-gpu N] [--jobs N] [--resume]

With --seeds, one ordinary training process per seed writes DIR/seed-N/ (pope.train.sweep).

The indirect-indexing accuracy of a trained run is `pope eval accuracy RUN [--data FILE]` (registered by
pope.cli.eval over pope.train.evaluate.task_accuracy).
Under `torchrun --nproc_per_node=N pope train ...` the same command trains with DDP (or FSDP2 with
--set train.parallel=fsdp).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pope.cli.arguments import non_negative_int, positive_int


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train",
        help="train a preset (see docs/training.md)",
        description="Train one of the paper's presets with a positional encoding.",
    )
    train.add_argument(
        "preset", nargs="?", help="preset name, e.g. indirect-indexing, jsb, owt-124m, indirect-indexing-tiny"
    )
    train.add_argument(
        "--pe", help="positional encoding spec, e.g. pope, rope, 'rope:base=500000' (`pope pe` lists them)"
    )
    train.add_argument("--out", help="run directory (config, metrics, checkpoints)")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a model/recipe/train field, e.g. --set recipe.lr=1e-3 --set model.n_layer=2 "
        "--set train.compile=false (repeatable)",
    )
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="RUN",
        help="continue a run from its checkpoints/last: `--resume RUN` alone reads RUN's own config (a larger "
        "--set recipe.max_steps=N extends it); with PRESET --pe --out, that config must match RUN's",
    )
    train.add_argument("--seed", type=int, default=None, help="training seed (model init, data order); default 0")
    train.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="a seed sweep, e.g. 0-7 or 0,3,5: one training process per seed, each writing "
        "OUT/seed-N/ (log OUT/seed-N.log); with --resume finished seeds are skipped",
    )
    train.add_argument(
        "--jobs-per-gpu",
        type=int,
        default=None,
        metavar="N",
        help="with --seeds: concurrent seeds per visible GPU (default pope.train.sweep.DEFAULT_JOBS_PER_GPU = 1)",
    )
    train.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="with --seeds: at most N seeds at once (default: GPUs x --jobs-per-gpu; 1 on CPU)",
    )
    train.add_argument(
        "--print-config",
        action="store_true",
        help="print every setting of the resolved run config and exit (alone: with --pe pope)",
    )
    train.set_defaults(func=_train)
    _register_finetune(subparsers)


def _train(args: argparse.Namespace) -> int:
    if args.print_config and args.preset is not None and not args.resume:  # the preset's settings; nothing is run
        if args.pe is None:
            args.pe = "pope"
            print("pope train: --pe not given; showing the config with --pe pope", file=sys.stderr)
    else:
        _resolve_resume_target(args)
    if args.seeds is not None:
        if args.seed is not None or args.print_config:
            raise ValueError("--seeds runs a sweep; it cannot be combined with --seed or --print-config")
        from pope.train.sweep import run_sweep_command

        return run_sweep_command(
            args.preset,
            args.pe,
            args.seeds,
            args.out,
            overrides=args.overrides,
            resume=args.resume,
            jobs_per_gpu=args.jobs_per_gpu,
            jobs=args.jobs,
        )
    if args.jobs_per_gpu is not None or args.jobs is not None:
        raise ValueError("--jobs and --jobs-per-gpu apply to seed sweeps (--seeds)")
    if args.preset is not None:
        args.seed = 0 if args.seed is None else args.seed

    from pope.train.run_config import resolve_run_config
    from pope.train.stopping import exit_status
    from pope.train.trainer import run_training

    if args.preset is None:  # `pope train --resume RUN`: the run's own config, --set values on top
        from pope.train.run_config import resume_config
        from pope.train.trainer_state import stored_run_config

        config = resume_config(stored_run_config(Path(args.out), quiet=True), args.overrides, seed=args.seed)
    else:
        config = resolve_run_config(args.preset, args.pe, seed=args.seed, overrides=args.overrides)
    if args.print_config:
        print(json.dumps(config.to_dict(complete=True), indent=2))
        return 0
    try:
        summary = run_training(config, args.out, resume=args.resume)
    except KeyboardInterrupt:  # before the first step (data loading, compilation): nothing to save yet
        print(
            "pope train: interrupted before the first step; nothing new was written (an earlier "
            "checkpoints/last, if any, is unchanged)",
            file=sys.stderr,
        )
        return 130
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 reports
        print(json.dumps(summary, indent=2))
    return exit_status(summary)  # 130 / 143 after SIGINT / SIGTERM (checkpoint written), else 0


def _resolve_resume_target(args: argparse.Namespace) -> None:
    """`--resume RUN` names the run directory (as --out); PRESET and --pe may then be left out (the run's config.json
    says them), and a sweep directory (its sweep.json) resumes the sweep as it was recorded. Refuses, with what to
    give, a command that names no run or names two."""
    if isinstance(args.resume, str):
        run = args.resume
        if args.preset is None and not Path(run).expanduser().is_dir() and args.out is not None:
            args.preset, run = run, None  # `--out RUN --resume PRESET --pe PE`: --resume took the preset
        elif args.out is not None and Path(args.out).expanduser() != Path(run).expanduser():
            raise ValueError(f"--resume {run} and --out {args.out} name two directories; give the run directory once")
        if run is not None:
            args.out = run
        args.resume = True
    if args.out is None:
        if args.preset is None:
            raise ValueError("give PRESET --pe PE --out DIR for a new run, or --resume RUN to continue one")
        raise ValueError(
            f"--out is needed, e.g. `pope train {args.preset} --pe {args.pe or 'pope'} --out runs/{args.preset}-"
            f"{(args.pe or 'pope').split(':')[0]}` (`--print-config` alone shows the preset's settings; --resume RUN "
            "continues a run)"
        )
    if args.preset is None or args.pe is None:
        if not args.resume:
            missing = "PRESET" if args.preset is None else "--pe"
            raise ValueError(
                f"a new run needs PRESET and --pe ({missing} is missing); to continue the run in {args.out}, "
                f"use --resume {args.out}"
            )
        if (args.preset is None) != (args.pe is None):
            raise ValueError(
                f"--resume {args.out}: give both PRESET and --pe (checked against the run's config) or neither "
                "(the run's config.json says them)"
            )
        sweep_record = Path(args.out).expanduser() / "sweep.json"
        if sweep_record.is_file() and not (Path(args.out).expanduser() / "config.json").exists():
            from pope.train.sweep_settings import merge_overrides, recorded_sweep

            args.preset, args.pe, recorded_sets, recorded_seeds = recorded_sweep(sweep_record)
            args.overrides = merge_overrides(recorded_sets, args.overrides)
            args.seeds = recorded_seeds if args.seeds is None else args.seeds
        elif args.seeds is not None:
            raise ValueError(
                f"--seeds with --resume {args.out}: {args.out} holds no sweep record (sweep.json); resume a sweep "
                "with --resume SWEEP_DIR, or give PRESET --pe PE --seeds LIST --out DIR --resume"
            )


# --------------------------------------------------------------------------------------- finetune
def _register_finetune(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="extend a run's context by fine-tuning (RoPE -> YaRN, PoPE -> PoPE+ft)",
        description="The paper's context-extension fine-tune: batch 64, lr 6e-5, 20 warmup steps, no decay. "
        "RoPE becomes YaRN with scale = context / training context (alpha 1, beta 32, temperature "
        "(0.1 ln s + 1)^2 in the softmax scale); PoPE is fine-tuned without interpolation.",
    )
    parser.add_argument("run", help="trained run (or checkpoint) directory")
    parser.add_argument("--context", type=positive_int, required=True, help="new context length, e.g. 4096")
    parser.add_argument("--steps", type=positive_int, default=500, help="fine-tuning steps (default 500)")
    parser.add_argument("--out", default=None, help="run directory of the fine-tune (default RUN-ft{context})")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--lr", type=float, default=6e-5)
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help="warmup steps (default 20, the paper's for 500 steps; scaled for fewer --steps)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="recipe/train overrides as in `pope train`, e.g. --set recipe.grad_accum=8",
    )
    parser.add_argument("--resume", action="store_true", help="continue an interrupted fine-tune in --out")
    parser.set_defaults(func=_finetune)


def _finetune(args: argparse.Namespace) -> int:
    from pope.eval.runs import run_dir_of
    from pope.files import check_output_dir
    from pope.train.finetune import run_finetune
    from pope.train.stopping import exit_status

    out = args.out or f"{run_dir_of(args.run).as_posix().rstrip('/')}-ft{args.context}"
    check_output_dir(out, what="--out" if args.out else "the default --out (RUN-ft{context})")
    summary = run_finetune(
        args.run,
        out,
        context=args.context,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup,
        overrides=args.overrides,
        resume=args.resume,
    )
    print(json.dumps(summary, indent=2))
    print(f"fine-tuned run: {out}  (evaluate it with `pope eval length {out} ...`)")
    return exit_status(summary)  # 130 / 143 after SIGINT / SIGTERM (checkpoint written), else 0

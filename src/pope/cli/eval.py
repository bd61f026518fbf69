"""`pope eval length|downstream|accuracy`, `pope analyze frequencies|delta`, `pope report`.

Thin argument parsing over pope.eval; every heavy import happens inside the command that needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pope.cli.arguments import non_negative_int, positive_int


def register(subparsers) -> None:
    _register_eval(subparsers)
    _register_analyze(subparsers)
    _register_report(subparsers)


# ------------------------------------------------------------------------------------------- eval
def _register_eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate trained runs (length, downstream, accuracy)",
        description="Evaluate trained runs. See docs/evaluation.md.",
    )
    commands = parser.add_subparsers(dest="eval_command", metavar="WHAT")
    parser.set_defaults(func=lambda args: _usage(parser))

    length = commands.add_parser(
        "length",
        help="perplexity vs evaluation length (windows of exactly L tokens)",
        description="Mean NLL / perplexity per window length L over a prepared split: "
        "non-overlapping windows of exactly L tokens inside documents, "
        "every target scored once (docs/evaluation.md).",
    )
    length.add_argument("runs", nargs="+", metavar="RUN", help="run or checkpoint directories")
    length.add_argument(
        "--data",
        default=None,
        help="prepared dataset name or directory (pope data prepare); default: the one the runs trained on",
    )
    length.add_argument("--split", default="test", help="split to score (default test)")
    length.add_argument("--lengths", required=True, help="comma-separated window lengths, e.g. 1024,2048,4096")
    length.add_argument(
        "--out",
        default=None,
        help="directory for length.csv/.md/.json/.png; default for one run RUN/eval/length-DATA-SPLIT-LENGTHS, "
        "needed for several",
    )
    length.add_argument(
        "--tail",
        choices=("context", "drop"),
        default="context",
        help="a document's last (n-1) mod L targets: scored in one end-aligned window of L tokens "
        "(context, default) or left out and counted (drop)",
    )
    length.add_argument(
        "--all-documents",
        action="store_true",
        help="at each length score every document long enough for it (default: only documents "
        "long enough for the longest length, so every length scores the same tokens)",
    )
    length.add_argument(
        "--max-docs",
        type=positive_int,
        default=None,
        help="score only the first N qualifying documents (reported in the outputs)",
    )
    length.add_argument(
        "--batch-size", type=positive_int, default=8, help="windows per forward pass at the longest length"
    )
    length.add_argument(
        "--buckets", type=positive_int, default=8, help="window-position buckets for the per-position NLL"
    )
    length.add_argument("--device", default="auto", help="auto, cpu or cuda")
    length.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA (default fp32)")
    length.set_defaults(func=_eval_length)

    downstream = commands.add_parser(
        "downstream",
        help="zero-shot lm-eval tasks in the paper's table layout",
        description="Runs lm-evaluation-harness on the pope model (needs the task "
        "data from the Hugging Face hub, i.e. internet or a filled cache).",
    )
    downstream.add_argument(
        "run",
        help="run or checkpoint directory, or a Hugging Face model directory (save_pretrained, e.g. a pope.hf model)",
    )
    downstream.add_argument(
        "--tasks",
        default=None,
        help="comma-separated lm-eval tasks (default: the paper's lambada_openai,blimp,cbt,"
        "hellaswag,piqa,arc_easy; 'cbt' is defined by pope)",
    )
    downstream.add_argument(
        "--tokenizer",
        default="gpt2",
        help="gpt2 (default), bytes, or hf (the tokenizer saved in a Hugging Face model directory)",
    )
    downstream.add_argument(
        "--output", default=None, help="JSON file for the results (default RUN/eval/downstream.json)"
    )
    downstream.add_argument("--limit", type=float, default=None, help="examples per task (for quick checks)")
    downstream.add_argument("--num-fewshot", type=non_negative_int, default=None)
    downstream.add_argument("--include-path", default=None, help="directory of extra lm-eval task YAML files")
    downstream.add_argument("--batch-size", type=positive_int, default=8)
    downstream.add_argument("--device", default="auto", help="auto, cpu or cuda")
    downstream.set_defaults(func=_eval_downstream)

    accuracy = commands.add_parser(
        "accuracy",
        help="indirect-indexing accuracy on a file of examples",
        description="Accuracy of a trained indirect-indexing model on a file of "
        "examples, one per line (pope.train.evaluate.task_accuracy).",
    )
    accuracy.add_argument("run", help="run or checkpoint directory")
    accuracy.add_argument(
        "--data", default=None, help="file of examples, one per line; default: the --split of the run's own task data"
    )
    accuracy.add_argument("--split", default="test", help="split of the run's task data without --data (default test)")
    accuracy.add_argument("--batch-size", type=positive_int, default=256)
    accuracy.add_argument("--device", default="auto", help="auto, cpu or cuda")
    accuracy.add_argument("--json", action="store_true", help="print the result as JSON")
    accuracy.set_defaults(func=_eval_accuracy)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _eval_length(args: argparse.Namespace) -> int:
    import torch

    from pope.data.prepared import resolve_dataset
    from pope.devices import resolve_device
    from pope.eval.length import parse_lengths
    from pope.eval.length_runs import dataset_of_runs, length_table_markdown, run_length_eval
    from pope.eval.runs import run_dir_of

    device = resolve_device(args.device)
    if args.bf16 and not device.startswith("cuda"):
        raise ValueError("--bf16 needs a CUDA device")
    data = args.data if args.data is not None else dataset_of_runs(args.runs)
    out = args.out
    if out is None:  # the comparison of several runs belongs to none of them
        if len(args.runs) > 1:
            raise ValueError("give --out DIR for the table of several runs (one run's goes under RUN/eval/ by default)")
        lengths = parse_lengths(args.lengths)
        span = f"{min(lengths)}-{max(lengths)}" if len(set(lengths)) > 1 else f"{lengths[0]}"
        name = resolve_dataset(data).name
        out = run_dir_of(args.runs[0]) / "eval" / f"length-{name}-{args.split}-{span}"
    entries = run_length_eval(
        args.runs,
        data,
        lengths=args.lengths,
        split=args.split,
        out_dir=out,
        tail=args.tail,
        same_documents=not args.all_documents,
        max_docs=args.max_docs,
        batch_size=args.batch_size,
        n_buckets=args.buckets,
        device=device,
        autocast_dtype=torch.bfloat16 if args.bf16 else None,
        progress=sys.stderr.isatty(),  # a redirected log gets the table, not progress-bar frames
    )
    print(length_table_markdown(entries))
    print(f"wrote {Path(out) / 'length.csv'}, length.md, length.json, length.png")
    return 0


def _eval_downstream(args: argparse.Namespace) -> int:
    from pope.devices import resolve_device
    from pope.eval.downstream import (
        downstream_table,
        extra_rows,
        paper_downstream,
        paper_row,
        run_downstream,
        write_downstream,
    )
    from pope.eval.report import paper_encoding
    from pope.eval.runs import run_config, run_dir_of, run_label
    from pope.files import check_output_dir

    # lm-eval runs for minutes to hours: know before that its results can be written.
    if args.output is not None:
        check_output_dir(Path(args.output).parent, what="the directory of --output")
    else:
        check_output_dir(run_dir_of(args.run) / "eval", what="the run's eval directory")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise FileNotFoundError(f"--include-path {args.include_path} is not a directory of lm-eval task YAML files")
    if args.limit is not None and not args.limit > 0:
        raise ValueError(f"--limit must be a positive number of examples (or a fraction in (0, 1)), got {args.limit}")
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    out = run_downstream(
        args.run,
        tasks=tasks,
        tokenizer=args.tokenizer,
        device=resolve_device(args.device),
        batch_size=args.batch_size,
        limit=limit,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
    )
    label = run_label(args.run)
    rows = {label: paper_row(out["results"])}
    config = run_config(run_dir_of(args.run))
    encoding = paper_encoding(str(config.get("preset")), str(config.get("pe")))
    paper = paper_downstream(str(config.get("preset")), encoding or "")
    if paper:
        rows[f"paper: {config['preset']} {encoding}"] = paper
    print(downstream_table(rows))
    for task, value in extra_rows(out["results"]).items():
        print(f"{task}: {value:.2f}")
    print(f"wrote {write_downstream(args.run, out, label, output=args.output)}")
    return 0


def _eval_accuracy(args: argparse.Namespace) -> int:
    from pope.eval.runs import task_splits_of
    from pope.train.evaluate import task_accuracy  # the trainer's implementation

    if args.data is None:
        data = task_splits_of(args.run) / f"{args.split}.txt"
    elif args.split != "test":
        raise ValueError("--split chooses a split of the run's own task data; with --data give the file alone")
    else:
        data = args.data
    result = task_accuracy(args.run, str(data), batch_size=args.batch_size, device=args.device)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"accuracy {result['accuracy']:.4f} ({result['correct']}/{result['examples']}) loss {result['loss']:.4f}"
            f"  model {result['checkpoint']} (step {result['step']})  data {result['data']}"
        )
        print(
            "by shift (%): "
            + " ".join(f"{shift} {100 * row['accuracy']:.1f}" for shift, row in result["by_shift"].items())
        )
    return 0


# ---------------------------------------------------------------------------------------- analyze
def _register_analyze(subparsers) -> None:
    parser = subparsers.add_parser("analyze", help="analyses of trained runs (frequency usage, delta)")
    commands = parser.add_subparsers(dest="analyze_command", metavar="WHAT")
    parser.set_defaults(func=lambda args: _usage(parser))
    frequencies = commands.add_parser(
        "frequencies",
        help="query/key magnitude per layer x frequency, and the learned delta",
        description="Mean query/key magnitude per layer x frequency (PoPE: softplus magnitudes, d rows; RoPE: "
        "2-D chunk norms, d/2 rows), averaged over heads and tokens, as heatmaps; PoPE's learned "
        "delta per layer x head x frequency, read as a phase, and how far it moved from 0. Captured "
        "with forward hooks on q_proj/k_proj.",
    )
    frequencies.add_argument("run", help="run or checkpoint directory")
    source = frequencies.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="text file to run through the model (e.g. 10 Shakespeare sonnets)")
    source.add_argument("--data", help="prepared dataset name or directory (for non-text models)")
    frequencies.add_argument("--tokenizer", default=None, help="tokenizer for --text: gpt2 (default) or bytes")
    frequencies.add_argument("--split", default=None, help="split of --data (default test)")
    frequencies.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="use only the first N tokens of --data (stated in the output)",
    )
    frequencies.add_argument(
        "--seq-len",
        type=positive_int,
        default=None,
        help="tokens per forward pass (default: the model's training context)",
    )
    frequencies.add_argument("--out", default=None, help="output directory (default RUN/eval/frequencies)")
    frequencies.add_argument("--device", default="auto", help="auto, cpu or cuda")
    frequencies.set_defaults(func=_analyze_frequencies)
    delta = commands.add_parser(
        "delta",
        help="where PoPE's learned delta ended up: entries outside [-2pi, 0] per layer",
        description="Per layer, how many entries of PoPE's phase bias delta lie outside [-2pi, 0], where the score "
        "uses it bounded: with delta_range=clamp they get no gradient (they stopped learning), with "
        "wrap they are the entries the clamp would have stopped. Writes RUN/eval/delta_state.json.",
    )
    delta.add_argument(
        "run",
        help="run or checkpoint directory (a run directory: its best checkpoint if it has "
        "one, else its last; give RUN/checkpoints/last for the final weights)",
    )
    delta.add_argument("--out", default=None, help="JSON file to write (default RUN/eval/delta_state.json)")
    delta.set_defaults(func=_analyze_delta)


def _analyze_frequencies(args: argparse.Namespace) -> int:
    import numpy as np

    from pope.data.vocabulary import check_token_range, check_vocab_compatible
    from pope.devices import resolve_device
    from pope.eval.frequency_usage import (
        analyze_frequencies,
        chunk_tokens,
        delta_movement,
        format_delta_movement,
        position_bias_summary,
        write_frequency_report,
    )
    from pope.eval.runs import load_run_model, run_config, run_dir_of, run_label
    from pope.files import check_output_dir
    from pope.provenance import portable_path
    from pope.train.data_match import check_prepared_data, check_tokenizer, run_config_of

    out = check_output_dir(
        args.out if args.out else run_dir_of(args.run) / "eval" / "frequencies",
        what="--out" if args.out else "the default --out (RUN/eval/frequencies)",
    )
    for option, applies_to in (("tokenizer", "text"), ("split", "data"), ("max_tokens", "data")):
        if getattr(args, option) is not None and not getattr(args, applies_to):  # never silently ignored
            raise ValueError(f"--{option.replace('_', '-')} applies to --{applies_to} only")
    device = resolve_device(args.device)
    config = run_config_of(args.run)  # the run's data against what it is given, before the model is loaded
    if args.text:
        check_tokenizer(args.run, config, args.tokenizer or "gpt2")
    else:
        check_prepared_data(args.run, config, args.data)
    model, _ = load_run_model(args.run, device)
    vocab = model.config.vocab_size
    if args.text:
        from pope.eval.tokenizers import get_tokenizer

        path = Path(args.text)
        if not path.is_file():
            raise FileNotFoundError(f"--text {path} does not exist")
        tokenizer = get_tokenizer(args.tokenizer or "gpt2")
        check_vocab_compatible(tokenizer.vocab_size, vocab, data_name=f"tokenizer {tokenizer.name!r}")
        tokens = np.asarray(tokenizer.encode(path.read_text(encoding="utf-8")), dtype=np.int64)
        source = f"{path} ({tokenizer.name} tokens)"
    else:
        from pope.data.prepared import resolve_dataset

        dataset = resolve_dataset(args.data)
        split = args.split or "test"
        token_split = dataset.split(split)
        dataset.verify([split])  # a modified file is named here, not analysed
        check_vocab_compatible(dataset.vocab_size, vocab, data_name=f"dataset {dataset.name!r}")
        tokens = np.asarray(token_split.tokens, dtype=np.int64)
        source = f"{portable_path(dataset.path)} split {split}"
        if args.max_tokens is not None:
            source += f", first {args.max_tokens:,} of {len(tokens):,} tokens"
            tokens = tokens[: args.max_tokens]
    check_token_range(tokens, vocab, data_name=source)
    sequences = chunk_tokens(tokens, args.seq_len or model.config.max_seq_len)
    usage = analyze_frequencies(model, sequences, device=device)
    summary = None
    if usage.kind == "pope":  # the position-only score to 20x the length the run was trained at
        train_length = run_config(args.run).get("recipe", {}).get("seq_len") or model.config.max_seq_len
        summary = position_bias_summary(usage, train_length, 20 * train_length)
    written = write_frequency_report(usage, out, title=f"{run_label(args.run)} on {source}", position_bias=summary)
    np.set_printoptions(precision=3, suppress=True, linewidth=160)
    print(
        f"{usage.kind}: {usage.query.shape[0]} layers x {usage.query.shape[1]} frequencies, {usage.n_tokens:,} "
        f"tokens of {source}"
    )
    print("mean query magnitude per layer (rows) x frequency (columns, highest first):")
    print(usage.query)
    if summary:
        print(
            f"position-only score (PoPE, training length {summary['train_length']:,}, distances to "
            f"{summary['max_distance']:,}): {summary['heads_peaking_at_distance_0']} of {summary['n_heads']} heads "
            f"peak at distance 0 within the training length; {summary['heads_rising_past_training']} rise past "
            f"it above their maximum within it (median max past - max within: "
            f"{summary['median_excess_past_training']:+.3f})"
        )
    if usage.delta is not None:
        print(format_delta_movement(delta_movement(usage.delta)))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _analyze_delta(args: argparse.Namespace) -> int:
    from pope.eval.delta_state import DELTA_STATE_FILE, delta_state_table, write_delta_state
    from pope.eval.runs import run_dir_of
    from pope.files import check_output_dir

    out = Path(args.out).expanduser() if args.out else run_dir_of(args.run) / DELTA_STATE_FILE
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give the path of the JSON file to write")
    check_output_dir(out.parent, what="--out's directory" if args.out else "the run's eval directory")
    state, out = write_delta_state(args.run, out)
    print(delta_state_table(state))
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------------------- report
def _register_report(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="summary, plots and tidy tables (runs.csv, curves.csv) over runs and seeds",
        description="Metric per preset x positional encoding x setting, mean ± std over seeds, with the paper's "
        "number where the preset matches; comparisons against RoPE; for accuracy tasks (indirect indexing) test "
        "accuracy and lift-off; length and downstream tables when those evaluations exist. From run directories it "
        "also writes the tables runs.csv and curves.csv (lengths.csv, shifts.csv); from a folder of such tables it "
        "regenerates the summary and the plots.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="INPUT",
        help="run directories, sweep directories (pope train --seeds), or folders of tables (or their runs.csv)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="directory for report.md, the plots and the tables; default INPUT/report, allowed only with a "
        "single INPUT (never the current directory)",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        default=None,
        help="also compare every other setting of the same preset with this sweep directory "
        "(one of the inputs; for runs read from tables, a prefix of their run ids), e.g. recipe knobs against "
        "the paper's recipe",
    )
    parser.add_argument(
        "--only",
        metavar="GLOB",
        action="append",
        default=None,
        help="keep only the runs whose run id (runs.csv's run column, e.g. 'pope/seed-*') matches; repeatable",
    )
    parser.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from pope.eval.report import default_out, write_report
    from pope.files import check_output_dir

    out = check_output_dir(args.out) if args.out is not None else check_output_dir(default_out(args.runs))
    markdown, written = write_report(args.runs, out, against=args.against, only=args.only)
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0

"""``pope eval length`` over trained runs: load each run's model, score the split at every length
(pope.eval.length), and write the results (length.csv, length.md, length.json, a plot) and a record beside each run."""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pope.data.indirect_indexing import is_task_spec
from pope.data.prepared import resolve_dataset
from pope.data.vocabulary import check_token_range, check_vocab_compatible
from pope.eval.length import (
    LengthResult,
    check_bool,
    check_positive,
    evaluate_lengths,
    parse_lengths,
)
from pope.eval.runs import load_run_model, run_config, run_dir_of, run_label, short_pe_spec
from pope.eval.windows import plan_windows, validate_doc_offsets
from pope.files import (
    check_output_dir,
    finish_figure,
    height_with_legend_below,
    legend_below,
    plain_log_ticks,
    write_json_atomic,
    write_text_atomic,
)
from pope.optional import pyplot, require
from pope.provenance import portable_path, provenance
from pope.train.data_match import check_prepared_data, run_config_of


@dataclass
class RunLengthResults:
    label: str
    run: str
    pe: str
    train_length: int | None
    results: list[LengthResult]


def run_length_eval(
    runs: list[str],
    data: str,
    *,
    lengths,
    split: str = "test",
    out_dir: str | None = None,
    tail: str = "context",
    same_documents: bool = True,
    max_docs: int | None = None,
    batch_size: int = 8,
    n_buckets: int = 8,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
) -> list[RunLengthResults]:
    """Evaluate every run at every length; write, in ``out_dir``, length.csv, length.md, length.json and
    length.png over all runs, then RUN/eval/length-DATA-SPLIT-LENGTHS.json per run (LENGTHS: the shortest and longest
    evaluated, e.g. 256-2560, so evaluations of one run over other lengths are kept side by side).

    Both are written after each run, not once at the end: a call stopped part-way (a killed job, a job that reaches
    its time limit) keeps every run already evaluated, and ``out_dir``'s length.json says how many of the runs asked
    for it holds (``provenance.runs_done`` of ``runs_requested``).

    ``out_dir`` is checked before any work and written first; a run directory that cannot be written
    (read-only, ``eval`` not a directory) gets a warning on stderr, not an error, since the results are
    already in ``out_dir``. The scored split is re-hashed first: a modified file is named, not scored. ``data`` must
    have the vocabulary of every run's training data (pope.train.data_match): other data is a ValueError naming both,
    raised before any model is loaded.
    """

    lengths = parse_lengths(lengths)
    check_positive(batch_size=batch_size, n_buckets=n_buckets)
    check_bool(same_documents=same_documents, progress=progress)
    if not runs:
        raise ValueError("give at least one run directory")
    if out_dir is not None:
        out_dir = check_output_dir(out_dir)
    for run in runs:  # every run's data against --data before any model is loaded (a missing run: its load says so)
        if Path(run).expanduser().exists():
            check_prepared_data(run, run_config_of(run), data)
    dataset = resolve_dataset(data)
    token_split = dataset.split(split)
    dataset.verify([split])
    offsets = validate_doc_offsets(token_split.doc_offsets, len(token_split))
    # Fail before loading any model when the data is too short for the longest length.
    try:
        plan_windows(offsets, max(lengths), tail=tail)
    except ValueError as err:
        documents = (dataset.manifest.get("stats") or {}).get("documents_are")
        raise ValueError(f"{err}{f' Documents of {dataset.path}: {documents}.' if documents else ''}") from None
    stamp = {
        **provenance(device),
        "data": portable_path(dataset.path),
        "data_name": dataset.name,
        "split": split,
        "tail": tail,
        "same_documents": same_documents,
        "max_docs": max_docs,
        "n_buckets": n_buckets,
    }
    collected: list[RunLengthResults] = []
    span = f"{min(lengths)}-{max(lengths)}" if min(lengths) != max(lengths) else f"{lengths[0]}"
    for run in runs:
        model, info = load_run_model(run, device)
        data_name = f"dataset {dataset.name!r} ({dataset.path})"
        check_vocab_compatible(dataset.vocab_size, model.config.vocab_size, data_name=data_name)
        check_token_range(np.asarray(token_split.tokens), model.config.vocab_size, data_name=data_name)
        label = run_label(run)
        run_config = info.get("run_config") or {}
        train_length = (run_config.get("recipe") or {}).get("seq_len") or model.config.max_seq_len
        results = evaluate_lengths(
            model,
            token_split.tokens,
            offsets,
            lengths,
            tail=tail,
            same_documents=same_documents,
            max_docs=max_docs,
            batch_size=batch_size,
            device=device,
            autocast_dtype=autocast_dtype,
            progress=progress,
            label=label,
        )
        entry = RunLengthResults(
            label=label, run=str(run), pe=model.config.pe, train_length=int(train_length), results=results
        )
        record = {
            **stamp,
            "run": str(run),
            "checkpoint": info.get("path"),
            "step": info.get("step"),
            "pe": entry.pe,
            "train_length": entry.train_length,
            "results": [r.to_dict(n_buckets) for r in results],
        }
        collected.append(entry)
        del model
        _disambiguate_labels(collected)  # over the runs so far: a later run can make an earlier label ambiguous
        if out_dir is not None:  # where the user asked: first
            write_length_outputs(
                collected,
                Path(out_dir),
                n_buckets=n_buckets,
                title=f"{dataset.name} / {split}",
                provenance_stamp={**stamp, "runs_done": len(collected), "runs_requested": len(runs)},
            )
        write_beside_run(str(run), f"length-{dataset.name}-{split}-{span}.json", record, saved_in=out_dir)
    return collected


def dataset_of_runs(runs: list[str]) -> str:
    """The prepared dataset ``runs`` trained on (each one's train.data_dir, else its recipe.dataset): ``pope eval
    length``'s default --data. ValueError, saying to give --data, when a run records none, the runs differ, or they
    trained on the indirect-indexing task (no documents to score at several lengths)."""

    found = {}
    for run in runs:
        config = run_config(run)
        data = (config.get("train") or {}).get("data_dir") or (config.get("recipe") or {}).get("dataset")
        if not data:
            raise ValueError(f"{run} records no dataset (no config.json beside it); give --data NAME")
        found[str(run)] = str(data)
    if len(set(found.values())) > 1:
        listed = ", ".join(f"{run}: {data}" for run, data in found.items())
        raise ValueError(f"the runs trained on different data ({listed}); give --data NAME to score them on one")
    data = next(iter(found.values()))
    if is_task_spec(data):
        raise ValueError(
            f"the runs trained on the indirect-indexing task ({data}), which has no documents to score at several "
            f"lengths; give --data NAME of a prepared dataset"
        )
    return data


def write_beside_run(run: str, name: str, record: dict, *, saved_in=None) -> Path | None:
    """Write ``record`` to RUN/eval/NAME; on failure warn (naming where the results are) and return None."""

    path = run_dir_of(run) / "eval" / name
    try:
        return write_json_atomic(path, record)
    except OSError as err:
        where = f"; the results are in {saved_in}" if saved_in is not None else ""
        print(f"pope eval: warning: could not write {path} ({err.strerror or err}){where}", file=sys.stderr)
        return None


def _disambiguate_labels(entries: list[RunLengthResults]) -> None:
    """Label each entry by its run's ``run_label``; runs that share one ('seed-0' of two sweeps) are named by the
    shortest tail of their paths that tells them apart ('genome-pope/seed-0', 'genome-rope/seed-0'); the full path
    stays in each entry's ``run``. Idempotent: labels are derived from the paths alone."""

    groups: dict[str, list[RunLengthResults]] = {}
    for entry in entries:
        entry.label = run_label(entry.run)
        groups.setdefault(entry.label, []).append(entry)
    for label, group in groups.items():
        if len(group) < 2:
            continue
        parts = [Path(entry.run).parts for entry in group]
        for depth in range(2, max(map(len, parts)) + 1):
            tails = ["/".join(p[-depth:]) for p in parts]
            if len(set(tails)) == len(tails):
                break
        else:  # the same path given twice: number them
            tails = [f"{label} [{i + 1}]" for i in range(len(group))]
        for entry, tail in zip(group, tails):
            entry.label = tail


def length_table_markdown(entries: list[RunLengthResults]) -> str:
    """Rows: runs; columns: lengths; cells: mean NLL (perplexity)."""
    lengths = sorted({r.length for e in entries for r in e.results})
    header = "| run | PE | train len | " + " | ".join(f"L={length:,}" for length in lengths) + " |"
    lines = [header, "|" + "---|" * (3 + len(lengths))]
    for entry in entries:
        by_length = {r.length: r for r in entry.results}
        cells = [
            f"{by_length[L].mean_nll:.4f} ({by_length[L].perplexity:.3g})" if L in by_length else "—" for L in lengths
        ]
        lines.append(f"| {entry.label} | {entry.pe} | {entry.train_length or '?'} | " + " | ".join(cells) + " |")
    first = entries[0].results
    lines.append("")
    lines.append(
        "Cells: mean NLL in nats/token (perplexity). Scored targets per length: "
        + ", ".join(
            f"L={r.length:,}: {r.n_targets:,} in {r.plan['n_docs_used']:,} docs "
            f"({r.plan['n_docs_excluded']:,} docs / {r.plan['n_targets_excluded']:,} targets excluded)"
            for r in first
        )
        + "."
    )
    return "\n".join(lines) + "\n"


def write_length_outputs(
    entries: list[RunLengthResults],
    out_dir,
    *,
    n_buckets: int = 8,
    title: str = "",
    provenance_stamp: dict | None = None,
) -> list:
    """length.csv, length.md, length.json and length.png in ``out_dir``."""

    out_dir = Path(out_dir)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [
            "label",
            "run",
            "pe",
            "train_length",
            "length",
            "mean_nll",
            "perplexity",
            "n_targets",
            "n_windows",
            "n_tail_windows",
            "n_docs_used",
            "n_docs_excluded",
            "n_targets_excluded",
            "bucket_edges",
            "bucket_nll",
        ]
    )
    for entry in entries:
        for r in entry.results:
            edges, means, _ = r.bucket_nll(n_buckets)
            writer.writerow(
                [
                    entry.label,
                    entry.run,
                    entry.pe,
                    entry.train_length,
                    r.length,
                    f"{r.mean_nll:.6f}",
                    f"{r.perplexity:.6f}",
                    r.n_targets,
                    r.plan["n_windows"],
                    r.plan["n_tail_windows"],
                    r.plan["n_docs_used"],
                    r.plan["n_docs_excluded"],
                    r.plan["n_targets_excluded"],
                    ";".join(map(str, edges)),
                    ";".join(f"{m:.6f}" for m in means),
                ]
            )
    written = [write_text_atomic(out_dir / "length.csv", buffer.getvalue())]
    markdown = f"# Perplexity vs evaluation length{': ' + title if title else ''}\n\n" + length_table_markdown(entries)
    if provenance_stamp:
        markdown += (
            "\n"
            + ", ".join(f"{k}: {provenance_stamp[k]}" for k in ("git_commit", "torch", "device", "date_utc", "command"))
            + "\n"
        )
        done, requested = provenance_stamp.get("runs_done"), provenance_stamp.get("runs_requested")
        if done is not None and requested is not None and done < requested:
            markdown += (
                f"\n**Partial: {done} of the {requested} runs asked for** (the call stopped or is still "
                f"running; these files are rewritten after each run).\n"
            )
    written.append(write_text_atomic(out_dir / "length.md", markdown))
    written.append(
        write_json_atomic(
            out_dir / "length.json",
            {
                "provenance": provenance_stamp or {},
                "runs": [
                    {
                        "label": e.label,
                        "run": e.run,
                        "pe": e.pe,
                        "train_length": e.train_length,
                        "results": [r.to_dict(n_buckets) for r in e.results],
                    }
                    for e in entries
                ],
            },
        )
    )
    written.append(plot_length_curves(entries, out_dir / "length.png", n_buckets=n_buckets, title=title))
    return written


def plot_length_curves(entries: list[RunLengthResults], path, *, n_buckets: int = 8, title: str = ""):
    """Left: perplexity vs length (one line per run). Right: NLL per window-position bucket at the
    longest length (does the loss rise past the training length?)."""
    plt = pyplot()
    # the legend goes under both panels (inside the left one it hid the curves of six or more runs): the figure
    # grows by one legend row per two runs
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, height_with_legend_below(len(entries), row=0.22)))
    for entry in entries:
        lengths = [r.length for r in entry.results]
        legend = f"{entry.label} ({short_pe_spec(entry.pe)})"
        (line,) = left.plot(lengths, [r.perplexity for r in entry.results], marker="o", label=legend)
        longest = entry.results[-1]
        edges, means, _ = longest.bucket_nll(n_buckets)
        centers = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:])]
        right.plot(centers, means, marker=".", color=line.get_color(), label=legend)
    train_lengths = {e.train_length for e in entries if e.train_length}
    for train_length in train_lengths:
        for ax in (left, right):
            ax.axvline(train_length, color="grey", linestyle=":", linewidth=1)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    plain_log_ticks(left.yaxis)
    evaluated = sorted({r.length for e in entries for r in e.results})
    left.set_xticks(evaluated, [f"{L:,}" for L in evaluated], fontsize=8)  # the lengths run, not powers of 2
    left.xaxis.set_minor_locator(require("matplotlib.ticker").NullLocator())
    left.set_xlabel("evaluation length L (tokens); dotted: training length")
    left.set_ylabel("perplexity")
    left.set_title("perplexity vs window length")
    right.set_xlabel(f"position in the window (L = {max(r.length for e in entries for r in e.results):,})")
    right.set_ylabel("mean NLL (nats/token)")
    right.set_title("NLL by position at the longest length")
    left.grid(True, which="both", alpha=0.3)
    right.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    legend_below(fig, *left.get_legend_handles_labels(), columns=2)
    return finish_figure(fig, path, tight_layout=False)

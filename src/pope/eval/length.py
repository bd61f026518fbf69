"""Perplexity versus evaluation length (``pope eval length``).

For each length L the split is cut into windows of exactly L tokens by :func:`pope.eval.windows.plan_windows`
(documents never crossed, every target scored once; see that module or docs/evaluation.md), the model
scores every window in one forward pass, and we report the mean NLL (nats/token), the perplexity and the
mean NLL per bucket of window positions (does the loss rise late in the window, past the training
length?).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pope.eval.windows import WindowPlan, describe_split, plan_windows, validate_doc_offsets


@dataclass
class LengthResult:
    """Scores of one model at one window length."""

    length: int
    mean_nll: float  # nats per scored target
    n_targets: int
    position_nll_sum: np.ndarray  # (length,) float64: summed NLL per window position
    position_count: np.ndarray  # (length,) int64: scored targets per window position
    plan: dict = field(default_factory=dict)  # WindowPlan.stats()

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)

    def bucket_nll(self, n_buckets: int) -> tuple[list[int], list[float], list[int]]:
        """Mean NLL per bucket of window positions: (edges (n_buckets+1,), mean NLL, count); NaN if empty."""
        n_buckets = max(1, min(int(n_buckets), self.length))
        edges = np.linspace(0, self.length, n_buckets + 1).round().astype(np.int64)
        means, counts = [], []
        for lo, hi in zip(edges[:-1], edges[1:]):
            count = int(self.position_count[lo:hi].sum())
            total = float(self.position_nll_sum[lo:hi].sum())
            counts.append(count)
            means.append(total / count if count else float("nan"))
        return edges.tolist(), means, counts

    def to_dict(self, n_buckets: int = 8) -> dict:
        edges, means, counts = self.bucket_nll(n_buckets)
        return {
            "length": self.length,
            "mean_nll": self.mean_nll,
            "perplexity": self.perplexity,
            "n_targets": self.n_targets,
            "bucket_edges": edges,
            "bucket_nll": means,
            "bucket_count": counts,
            **{k: v for k, v in self.plan.items() if k != "length"},
        }


def check_vocab_compatible(data_vocab_size: int, model_vocab_size: int, *, data_name: str = "the data") -> None:
    """Refuse to score data with a vocabulary the model was not built for.

    A model whose vocabulary is larger than the data's (e.g. padded to a multiple of 64) can score it;
    a smaller one cannot, and equal sizes are the normal case. The data's maximum token id is checked
    separately by :func:`check_token_range`.
    """
    if int(data_vocab_size) > int(model_vocab_size):
        raise ValueError(
            f"vocabulary mismatch: {data_name} has {data_vocab_size:,} token ids but the model's vocabulary has "
            f"{model_vocab_size:,}; this model was trained on another tokenisation. Evaluate it on data "
            f"prepared with its own tokenizer."
        )


def check_token_range(tokens: np.ndarray, model_vocab_size: int, *, data_name: str = "the data") -> None:
    max_token = int(tokens.max(initial=0)) if tokens.size else 0
    if max_token >= model_vocab_size:
        raise ValueError(
            f"vocabulary mismatch: {data_name} contains token id {max_token:,} but the model only has "
            f"{model_vocab_size:,} ids; evaluate it on data prepared with its own tokenizer."
        )


def model_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) from a model following the GPT contract (returns (logits, loss)) or plain logits."""
    out = model(idx)
    return out[0] if isinstance(out, (tuple, list)) else out


def token_nll(logits: torch.Tensor, targets: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Per-token negative log-likelihood in fp32: logits (B, T, V), targets (B, T) -> (B, T).

    Computed ``chunk`` positions at a time so the fp32 temporaries stay small at long T and large V.
    """
    pieces = []
    for start in range(0, logits.shape[1], chunk):
        part = logits[:, start : start + chunk].float()  # (B, c, V)
        target = targets[:, start : start + chunk, None]  # (B, c, 1)
        pieces.append(torch.logsumexp(part, dim=-1) - part.gather(-1, target).squeeze(-1))
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def score_windows(
    model: torch.nn.Module,
    tokens: np.ndarray,
    plan: WindowPlan,
    *,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    description: str = "",
) -> LengthResult:
    """Score every window of ``plan`` over the flat ``tokens`` array with ``model``."""
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    length = plan.length
    device = torch.device(device)
    position_sum = np.zeros(length, dtype=np.float64)
    position_count = np.zeros(length, dtype=np.int64)
    positions = torch.arange(length, device=device)  # (L,)
    offsets = np.arange(length + 1, dtype=np.int64)  # (L+1,) inputs + the last target
    was_training = model.training
    model.eval()
    try:
        bar = tqdm(
            total=plan.n_windows, desc=description or f"L={length}", unit="win", disable=not progress, leave=False
        )
        for first in range(0, plan.n_windows, batch_size):
            starts = plan.starts[first : first + batch_size]  # (B,)
            chunk = np.asarray(tokens[starts[:, None] + offsets[None, :]], dtype=np.int64)  # (B, L+1)
            chunk = torch.from_numpy(chunk).to(device)
            inputs, targets = chunk[:, :-1], chunk[:, 1:]  # (B, L) each
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model_logits(model, inputs)  # (B, L, V)
            nll = token_nll(logits, targets)  # (B, L) fp32
            score_from = torch.from_numpy(plan.score_from[first : first + batch_size]).to(device)  # (B,)
            scored = positions[None, :] >= score_from[:, None]  # (B, L)
            position_sum += (nll * scored).double().sum(0).cpu().numpy()
            position_count += scored.sum(0).cpu().numpy()
            bar.update(len(starts))
        bar.close()
    finally:
        model.train(was_training)
    n_targets = int(position_count.sum())
    if n_targets != plan.n_targets_scored:  # cannot happen unless the plan was built for other data
        raise RuntimeError(f"scored {n_targets} targets but the window plan promised {plan.n_targets_scored}")
    return LengthResult(
        length=length,
        mean_nll=float(position_sum.sum() / n_targets),
        n_targets=n_targets,
        position_nll_sum=position_sum,
        position_count=position_count,
        plan=plan.stats(),
    )


def evaluate_lengths(
    model: torch.nn.Module,
    tokens: np.ndarray,
    doc_offsets: np.ndarray,
    lengths: list[int],
    *,
    tail: str = "context",
    same_documents: bool = True,
    max_docs: int | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    label: str = "",
) -> list[LengthResult]:
    """Score ``model`` at every length in ``lengths`` over one split.

    ``same_documents``: only documents long enough for the longest length are scored, at every length,
    so all lengths see the same documents (with ``tail="context"`` exactly the same targets) and the
    numbers are comparable across lengths; the excluded documents are counted in each result.
    ``max_docs``: score only the first ``max_docs`` documents that qualify (counted, never silent).
    """
    lengths = parse_lengths(lengths)
    _check_positive(batch_size=batch_size)
    _check_bool(same_documents=same_documents, progress=progress)
    offsets = validate_doc_offsets(doc_offsets, int(tokens.shape[0]))
    longest = max(lengths)
    min_doc_tokens = longest + 1 if same_documents else None
    if max_docs is not None:
        offsets = _first_qualifying_docs(offsets, max_docs, min_doc_tokens or min(lengths) + 1)
    results = []
    for length in lengths:
        try:
            plan = plan_windows(offsets, length, tail=tail, min_doc_tokens=min_doc_tokens)
        except ValueError as err:
            raise ValueError(f"{err} (full split: {describe_split(doc_offsets)})") from None
        result = score_windows(
            model,
            tokens,
            plan,
            batch_size=_batch_for(batch_size, length, longest),
            device=device,
            autocast_dtype=autocast_dtype,
            progress=progress,
            description=f"{label} L={length}".strip(),
        )
        if max_docs is not None:
            result.plan["max_docs"] = int(max_docs)
            n_docs_total = int(np.asarray(doc_offsets).shape[0] - 1)
            result.plan["n_docs_total"] = n_docs_total
            # Documents after the max_docs-th qualifying one are neither scored nor "excluded".
            result.plan["n_docs_not_reached"] = n_docs_total - plan.n_docs_used - plan.n_docs_excluded
        results.append(result)
    return results


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_bool(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, bool):  # "no" would be truthy: refuse rather than guess
            raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def _batch_for(batch_size: int, length: int, longest: int) -> int:
    """Keep tokens per batch roughly constant: the batch size is given for the longest length."""
    return max(1, batch_size * max(1, longest // length))


def _first_qualifying_docs(offsets: np.ndarray, max_docs: int, min_tokens: int) -> np.ndarray:
    """Offsets of the documents up to (and including) the ``max_docs``-th one with >= min_tokens tokens.

    Shorter documents before it are kept in the offsets (and so counted as excluded by the plan).
    """
    if max_docs < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs}")
    qualifies = np.diff(offsets) >= min_tokens
    cumulative = np.cumsum(qualifies)
    if cumulative[-1] <= max_docs:
        return offsets
    last_doc = int(np.searchsorted(cumulative, max_docs))  # index of the max_docs-th qualifying document
    return offsets[: last_doc + 2]


def parse_lengths(lengths) -> list[int]:
    """Accept "1024,2048" or an iterable of ints; return them sorted (positive, each given once)."""
    if isinstance(lengths, str):
        items = [item.strip() for item in lengths.split(",") if item.strip()]
        try:
            lengths = [int(item) for item in items]
        except ValueError:
            raise ValueError(f"lengths must be comma-separated integers like 1024,2048; got {lengths!r}") from None
    lengths = list(lengths)
    if not lengths:
        raise ValueError("give at least one evaluation length")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"evaluation lengths must be positive integers, got {length!r}")
    repeated = sorted({int(x) for x in lengths if lengths.count(x) > 1})
    if repeated:
        raise ValueError(f"evaluation length(s) {', '.join(map(str, repeated))} given more than once; list each once")
    return sorted(int(length) for length in lengths)


# ------------------------------------------------------------------------------------------------
# Runs -> result files (``pope eval length``)
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
    already in ``out_dir``. The scored split is re-hashed first: a modified file is named, not scored.
    """
    from pope.data.prepared import resolve_dataset
    from pope.eval.runs import load_run_model, run_label
    from pope.files import check_output_dir
    from pope.provenance import portable_path, provenance

    lengths = parse_lengths(lengths)
    _check_positive(batch_size=batch_size, n_buckets=n_buckets)
    _check_bool(same_documents=same_documents, progress=progress)
    if not runs:
        raise ValueError("give at least one run directory")
    if out_dir is not None:
        out_dir = check_output_dir(out_dir)
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


def write_beside_run(run: str, name: str, record: dict, *, saved_in=None) -> Path | None:
    """Write ``record`` to RUN/eval/NAME; on failure warn (naming where the results are) and return None."""
    from pope.eval.runs import run_dir_of
    from pope.files import write_json_atomic

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
    from pope.eval.runs import run_label

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
    import csv
    import io

    from pope.files import write_json_atomic, write_text_atomic

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
    from matplotlib.ticker import NullLocator

    from pope.eval.runs import short_pe_spec
    from pope.files import finish_figure, height_with_legend_below, legend_below, plain_log_ticks
    from pope.optional import pyplot

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
    left.xaxis.set_minor_locator(NullLocator())
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

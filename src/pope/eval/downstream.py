"""Zero-shot downstream accuracy with lm-evaluation-harness (``pope eval downstream``).

The model is a run or checkpoint directory of this project or a Hugging Face model directory (e.g. a
pope.hf PoPELlama saved with save_pretrained); see pope.eval.lm_eval_model.

The paper's table: LAMBADA (OpenAI version, last word greedy-correct: lm-eval's ``lambada_openai`` acc),
BLiMP (mean over its 67 subtasks: ``blimp`` acc), CBT (mean of the common-noun and named-entity tests),
HellaSwag, PIQA, ARC-Easy (``acc``), and their average. The tasks download their data from the Hugging
Face hub, so this needs internet (or a filled HF cache).

lm-eval 0.4.13 ships no Children's Book Test, so CBT is defined here (``pope_cbt_cn``, ``pope_cbt_ne``,
data ``cam-cst/cbt`` configs CN/NE, test split): the context is the 20 story sentences plus the
question up to the blank; each of the 10 candidates is scored as the candidate followed by the rest of
the question (P(candidate + rest | context), the GPT-2 paper's protocol); accuracy is the share of
questions whose answer scores highest.
"""

from __future__ import annotations

import math
from pathlib import Path

from pope.eval.runs import run_dir_of
from pope.files import write_json_atomic
from pope.optional import require
from pope.provenance import provenance

# (column, lm-eval task names whose metric is averaged, metric key)
PAPER_COLUMNS = (
    ("LAMBADA", ("lambada_openai",), "acc"),
    ("BLiMP", ("blimp",), "acc"),
    ("CBT", ("pope_cbt_cn", "pope_cbt_ne"), "acc"),
    ("HellaSwag", ("hellaswag",), "acc"),
    ("PIQA", ("piqa",), "acc"),
    ("ARC-E", ("arc_easy",), "acc"),
)
PAPER_TASKS = ("lambada_openai", "blimp", "cbt", "hellaswag", "piqa", "arc_easy")
# The paper's zero-shot accuracies (%), in PAPER_COLUMNS order, then the average (docs/paper.md).
PAPER_DOWNSTREAM = {
    ("owt-124m", "rope"): (28.74, 77.55, 38.80, 29.55, 60.28, 37.08, 45.33),
    ("owt-124m", "pope"): (27.67, 77.75, 44.43, 29.18, 59.58, 38.52, 46.19),
    ("owt-253m", "rope"): (31.38, 79.12, 48.51, 31.47, 62.24, 39.87, 48.76),
    ("owt-253m", "pope"): (30.47, 80.01, 49.39, 31.82, 61.70, 39.32, 48.78),
    ("owt-774m", "rope"): (35.95, 81.05, 52.56, 35.39, 63.55, 42.28, 51.80),
    ("owt-774m", "pope"): (36.89, 82.03, 53.67, 35.86, 63.93, 42.37, 52.46),
}
CBT_BLANK = "XXXXX"


def cbt_context(doc: dict) -> str:
    """The story sentences and the question up to the blank."""
    before = doc["question"].split(CBT_BLANK, 1)[0].rstrip()
    return " ".join(sentence.strip() for sentence in doc["sentences"]) + (" " + before if before else "")


def cbt_choices(doc: dict) -> list[str]:
    """Each candidate followed by the rest of the question."""
    after = doc["question"].split(CBT_BLANK, 1)[1] if CBT_BLANK in doc["question"] else ""
    return [option + after.rstrip() for option in doc["options"]]


def cbt_target(doc: dict) -> int:
    try:
        return list(doc["options"]).index(doc["answer"])
    except ValueError:
        raise ValueError(f"CBT answer {doc['answer']!r} is not among its options {doc['options']}") from None


def cbt_task_config(
    kind: str, *, dataset_path: str = "cam-cst/cbt", dataset_kwargs: dict | None = None, split: str = "test"
) -> dict:
    """lm-eval task config (a dict, loaded in-process) for CBT-CN (kind 'cn') or CBT-NE ('ne')."""
    if kind not in ("cn", "ne"):
        raise ValueError(f"CBT kind must be 'cn' or 'ne', got {kind!r}")
    config = {
        "task": f"pope_cbt_{kind}",
        "dataset_path": dataset_path,
        "test_split": split,
        "output_type": "multiple_choice",
        "doc_to_text": cbt_context,
        "doc_to_choice": cbt_choices,
        "doc_to_target": cbt_target,
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    if dataset_kwargs:
        config["dataset_kwargs"] = dataset_kwargs
    else:
        config["dataset_name"] = kind.upper()
    return config


def expand_tasks(tasks: list[str]) -> list:
    """Task names for lm-eval; 'cbt' becomes the two CBT task configs defined here."""
    expanded: list = []
    for task in tasks:
        if task == "cbt":
            expanded += [cbt_task_config("cn"), cbt_task_config("ne")]
        else:
            expanded.append(task)
    return expanded


def _task_manager(task_module, include_path: str | None, tasks: list):
    """lm-eval's TaskManager over include_path and lm-eval's own tasks; only include_path's when every task asked
    for is a task defined there (indexing lm-eval's thousands of task files takes seconds)."""
    if include_path:
        local = task_module.TaskManager(include_path=include_path, include_defaults=False)
        # older lm-eval versions name all_tasks only
        defined = set(local.all_subtasks if hasattr(local, "all_subtasks") else local.all_tasks)
        if all(isinstance(task, str) and task in defined for task in tasks):
            return local
        return task_module.TaskManager(include_path=include_path)
    return task_module.TaskManager()


def run_downstream(
    run: str | None,
    *,
    tasks: list[str] | None = None,
    tokenizer: str = "gpt2",
    device: str = "cpu",
    batch_size: int = 8,
    limit: float | None = None,
    include_path: str | None = None,
    num_fewshot: int | None = None,
    lm=None,
    task_manager=None,
) -> dict:
    """Run lm-eval's ``simple_evaluate`` on the model of ``run`` (a pope run/checkpoint or a Hugging Face model
    directory; tokenizer "hf" takes the latter's own tokenizer) or on a ready ``lm``. Returns its results."""
    evaluator = require("lm_eval", "eval")
    task_module = require("lm_eval.tasks", "eval")
    from pope.eval.lm_eval_model import PoPELM  # here: it imports lm_eval (the eval extra) at its top

    if lm is None:
        lm = PoPELM(path=run, tokenizer=tokenizer, device=device, batch_size=batch_size)
    task_list = expand_tasks(list(tasks or PAPER_TASKS))
    manager = task_manager or _task_manager(task_module, include_path, task_list)
    out = evaluator.simple_evaluate(
        model=lm,
        tasks=task_list,
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        bootstrap_iters=0,
        log_samples=False,
    )
    if out is None:  # non-zero ranks
        return {}
    return {
        "results": out["results"],
        "n_samples": out.get("n-samples", {}),
        "config": {
            "tasks": list(tasks or PAPER_TASKS),
            "limit": limit,
            "num_fewshot": num_fewshot,
            "tokenizer": tokenizer,
        },
    }


def metric_value(results: dict, task: str, metric: str) -> float | None:
    """A task's metric from lm-eval results ('acc,none' style keys), or None when absent."""
    entry = results.get(task)
    if not entry:
        return None
    for key in (f"{metric},none", metric):
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def paper_row(results: dict) -> dict[str, float | None]:
    """Accuracy in % per paper column (None when a task did not run) and the average over present columns."""
    row: dict[str, float | None] = {}
    for column, task_names, metric in PAPER_COLUMNS:
        values = [metric_value(results, task, metric) for task in task_names]
        row[column] = 100 * sum(values) / len(values) if values and all(v is not None for v in values) else None
    present = [v for v in row.values() if v is not None]
    row["Average"] = sum(present) / len(present) if len(present) == len(PAPER_COLUMNS) else None
    return row


def extra_rows(results: dict) -> dict[str, float]:
    """Tasks outside the paper's columns (e.g. local tasks): task -> acc in % (or first numeric metric)."""
    paper_tasks = {task for _, names, _ in PAPER_COLUMNS for task in names}
    extra = {}
    for task, _entry in results.items():
        if task in paper_tasks or task.startswith("blimp_"):
            continue
        value = metric_value(results, task, "acc")
        if value is not None:
            extra[task] = 100 * value
    return extra


def paper_downstream(preset: str, encoding: str) -> dict[str, float] | None:
    """The paper's row (column -> %) for an OpenWebText preset and "rope"/"pope", else None."""
    values = PAPER_DOWNSTREAM.get((preset, encoding))
    if values is None:
        return None
    return dict(zip([column for column, _, _ in PAPER_COLUMNS] + ["Average"], values))


def downstream_table(rows: dict[str, dict]) -> str:
    """Markdown table in the paper's layout; rows: label -> paper_row(...)."""
    columns = [column for column, _, _ in PAPER_COLUMNS] + ["Average"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, row in rows.items():
        cells = ["—" if row.get(c) is None else f"{row[c]:.2f}" for c in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_downstream(run: str, out: dict, label: str, output: str | Path | None = None) -> Path:
    """The results with provenance, written atomically to ``output`` (default RUN/eval/downstream.json, RUN
    being the run directory, or the Hugging Face model directory itself); returns the path."""
    path = Path(output) if output is not None else run_dir_of(run) / "eval" / "downstream.json"
    if path.is_dir():
        raise ValueError(f"output {path} is a directory; give the path of the JSON file to write")
    return write_json_atomic(
        path, {**provenance(), "run": str(run), "label": label, **out, "paper_row": paper_row(out["results"])}
    )

"""The benchmarks' own bookkeeping, on CPU: benchmarks/train_step_owt.py's count of what torch.compile made of a
model (graphs, graph breaks, recompiles, torch._dynamo.explain), and the CSV rows every benchmark appends."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TinyModel(torch.nn.Module):
    """Two linear layers; ``graph_break`` puts a break between them, ``scale`` is a Python int dynamo guards on."""

    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.graph_break = graph_break
        self.scale = 1

    def forward(self, x):
        x = self.first(x)
        if self.graph_break:
            torch._dynamo.graph_break()
        return (self.second(x) * self.scale).sum()


def _counts(benchmark, model: TinyModel, steps: int = 3, flip_scale_at: int | None = None) -> dict:
    """What the benchmark reports for ``model``: explain of one forward pass, then a compiled forward + backward
    per step (``scale`` changed before step ``flip_scale_at``)."""
    x = torch.randn(4, 8)
    explained = benchmark.explain_counts(model, x)
    compiled = torch.compile(model, backend="aot_eager")
    for step in range(steps):
        if step == flip_scale_at:
            model.scale = 2
        compiled(x).backward()
    return {**benchmark.dynamo_counts(), **explained}


def test_a_graph_break_is_counted():
    benchmark = _load("train_step_owt")
    counts = _counts(benchmark, TinyModel(graph_break=True))
    assert counts["graphs"] == 2 and counts["graph_breaks"] >= 1 and counts["recompiles"] == 0, counts
    assert counts["explain_graphs"] == 2 and counts["explain_breaks"] == 1, counts
    assert any("graph_break" in reason for reason in counts["break_reasons"]), counts["break_reasons"]
    warning = benchmark.graph_warning(counts)
    assert warning.startswith("not one graph: 2 graphs") and "graph_break" in warning


def test_a_recompile_is_counted_and_a_clean_model_is_one_graph():
    benchmark = _load("train_step_owt")
    clean = _counts(benchmark, TinyModel())
    assert (clean["graphs"], clean["graph_breaks"], clean["recompiles"]) == (1, 0, 0), clean
    assert (clean["explain_graphs"], clean["explain_breaks"], clean["break_reasons"]) == (1, 0, [])
    assert benchmark.graph_warning(clean) is None
    recompiled = _counts(benchmark, TinyModel(), flip_scale_at=1)
    assert recompiled["recompiles"] == 1 and recompiled["graphs"] == 2 and recompiled["graph_breaks"] == 0
    assert "1 recompiles" in benchmark.graph_warning(recompiled)


def test_append_csv_adds_new_columns_without_losing_earlier_rows(tmp_path):
    bench_io = _load("bench_io")
    path = tmp_path / "rows.csv"
    meta = {"gpu": "H100", "commit": "abc"}
    bench_io.append_csv(str(path), [{"model": "a", "graph_breaks": 0}], meta)
    bench_io.append_csv(str(path), [{"model": "b", "graph_breaks": 0}], meta)
    bench_io.append_csv(str(path), [{"model": "c", "graphs": 2, "graph_breaks": 1}], {**meta, "commit": "def"})
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, list(reader)
    assert header == ["gpu", "commit", "model", "graph_breaks", "graphs"]
    assert [(r["model"], r["commit"], r["graph_breaks"], r["graphs"]) for r in rows] == [
        ("a", "abc", "0", ""),
        ("b", "abc", "0", ""),
        ("c", "def", "1", "2"),
    ]
    assert not (tmp_path / "rows.csv.partial").exists()


def test_host_time_benchmark_writes_its_result_with_provenance_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    # benchmarks/launcher_host_time.py runs on CPU by design; its --out file's provenance line once asked CUDA for
    # a device name and crashed where torch has no CUDA
    from pope.kernels import direct_launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(direct_launch, "launch", direct_launch.launch)  # the benchmark mocks it: restored after
    _load("launcher_host_time").main(["--calls", "3", "--out", str(tmp_path)])
    first, result, operators = (tmp_path / "launcher_host_time.txt").read_text().splitlines()[:3]
    assert first.startswith("# gpu=cpu (") and "commit=" in first
    assert result.startswith("launcher host time, launches mocked: forward ")
    assert operators.startswith("operator host time (compiled code's call), launches mocked: forward ")

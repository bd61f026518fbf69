"""torch.compile sees PoPE's GPT as it sees RoPE's: one graph, no break, no recompile, the LM head inside, and
no copy of attention's outputs or gradients on their way back to the projections.

A graph break inside attention splits the compiled model in two and leaves the rest of the forward pass (the
language-model head, the loss) to run eagerly; a guard on mutable host state recompiles the model once and keeps two
graphs. Either costs PoPE's training step up to half its speed on a GPU, and neither shows in a loss or a unit test
of the kernels. These tests compile on CPU (the Triton kernels run under Triton's interpreter), so they catch the
class of regression without a GPU.
"""

from __future__ import annotations

import operator
from dataclasses import replace

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified

import pope.attention.api
from pope.model import GPT
from pope.ops import triton_unsupported_reason
from pope.presets import get_preset
from pope.settings import SETTINGS

PES = {"rope": "rope", "pope": "pope:backend=triton"}


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """pope.attention sends CPU tensors to the reference backend; let the interpreted kernels take them, so the
    compiled graph holds the custom operators a GPU run holds."""
    monkeypatch.setattr(
        pope.attention.api,
        "_triton_unsupported_reason",
        lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options),
    )


def small_gpt(pe: str) -> GPT:
    config = get_preset("owt-124m").model_config(pe=pe)
    config = replace(config, n_layer=2, d_model=64, n_head=2, vocab_size=97, max_seq_len=32)
    torch.manual_seed(0)
    return GPT(config)


def compiled_training_steps(model: GPT, steps: int = 3) -> dict:
    """Run `steps` compiled forward + backward steps; return dynamo's graph, break and recompile counts."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    idx = torch.randint(0, model.config.vocab_size, (2, 32))
    for step in range(steps):
        # After the first step a recompile raises (torch.compiler.set_stance) instead of passing unseen.
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            _, loss = compiled(idx, idx)
        loss.backward()
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "frames": counters["stats"]["calls_captured"],
    }


@pytest.mark.parametrize("name", sorted(PES))
def test_gpt_compiles_to_one_graph_without_breaks_or_recompiles(name, kernels_on_cpu):
    stats = compiled_training_steps(small_gpt(PES[name]))
    assert stats["breaks"] == 0, f"{name}: {dict(counters['graph_break'])}"
    assert stats["graphs"] == 1, f"{name}: {stats}"


def test_lm_head_and_loss_are_inside_poPEs_graph_as_in_ropes(kernels_on_cpu):
    """The one graph holds every matrix product of the model, the LM head's included: the same count for both
    encodings (PoPE's attention is one custom operator, RoPE's one SDPA call)."""
    products = {}
    for name, pe in PES.items():
        torch._dynamo.reset()
        model = small_gpt(pe)
        explanation = torch._dynamo.explain(model)(
            torch.zeros(2, 32, dtype=torch.long), torch.zeros(2, 32, dtype=torch.long)
        )
        assert explanation.graph_count == 1 and explanation.graph_break_count == 0, (name, explanation.break_reasons)
        (graph,) = explanation.graphs
        products[name] = sum(
            node.op == "call_function" and node.target in (torch._C._nn.linear, torch.nn.functional.linear)
            for node in graph.graph.nodes
        ) + sum(node.op == "call_module" and "proj" in str(node.target) for node in graph.graph.nodes)
        loss_inside = any("cross_entropy" in str(node.target) for node in graph.graph.nodes)
        assert loss_inside, f"{name}: the loss is outside the compiled graph"
    n_layer = 2
    assert products["pope"] == products["rope"] == n_layer * 6 + 1  # q, k, v, o, up, down per block + LM head


def test_parameters_outside_attention_are_the_same_for_both_encodings():
    """PoPE changes attention only: every other parameter has RoPE's name, shape and dtype (and PoPE adds only
    its delta per layer)."""
    shapes = {
        name: {n: (tuple(p.shape), p.dtype) for n, p in small_gpt(pe).named_parameters()} for name, pe in PES.items()
    }
    pope_only = {n for n in shapes["pope"] if n not in shapes["rope"]}
    assert pope_only == {f"blocks.{i}.attn.pe.delta" for i in range(2)}
    assert {n: s for n, s in shapes["pope"].items() if n not in pope_only} == shapes["rope"]


VIEWS = ("aten.view", "aten._unsafe_view", "aten.transpose", "aten.permute", "aten.t.", "aten.expand")
COPIES = ("aten.clone", "aten.copy", "aten._to_copy", "aten.contiguous")


def copied_operator_outputs(graph: torch.fx.Graph) -> list[str]:
    """The copies in `graph` of a pope:: operator's output, seen through views and tuple items."""

    def origin(node):
        while node.op == "call_function" and (str(node.target).startswith(VIEWS) or node.target is operator.getitem):
            node = node.args[0]
        return node

    copies = [node for node in graph.nodes if node.op == "call_function" and str(node.target).startswith(COPIES)]
    return [
        f"{node} of {origin(node.args[0])}" for node in copies if str(origin(node.args[0]).target).startswith("pope.")
    ]


def test_attention_outputs_and_gradients_reach_the_projections_without_a_copy(kernels_on_cpu):
    """The kernels return out, dq, dk, dv in the layout of the model's transposed projections, so the compiled
    training step moves them back to (B, T, H * d) by views: no clone of an operator's output in the forward or the
    backward graph (with contiguous outputs there were four a layer, ~0.4 ms of a GPT-2 124M step on an H100)."""
    graphs = {}

    def recording_backend(gm, example_inputs):
        def recorder(part):
            def compiler(graph_module, inputs):
                graphs[part] = graph_module.graph
                return make_boxed_func(graph_module.forward)

            return compiler

        return aot_module_simplified(gm, example_inputs, fw_compiler=recorder("fw"), bw_compiler=recorder("bw"))

    torch._dynamo.reset()
    model = small_gpt(PES["pope"])
    idx = torch.randint(0, model.config.vocab_size, (2, 32))
    _, loss = torch.compile(model, backend=recording_backend)(idx, idx)
    loss.backward()
    for part in ("fw", "bw"):
        operators = [n for n in graphs[part].nodes if str(n.target).startswith("pope.flash_attention")]
        assert len(operators) == 2, f"{part}: expected one pope:: operator a layer, found {operators}"
        assert copied_operator_outputs(graphs[part]) == [], part


def test_capability_lookup_leaves_no_guard_on_the_cache(monkeypatch):
    """Compiled code asks a CUDA device's capability on every attention call. The lookup fills a process-wide
    cache; if dynamo traced into it, its guard on that cache would fail on the next call and recompile the model.
    On CPU, a stand-in capability lets the same code run. Looked up as pope.ops looks it up: a lazy name of
    pope.kernels, loaded on first use (importing it imports torch._dynamo)."""
    from pope import kernels

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    SETTINGS.caches.capabilities.clear()
    torch._dynamo.reset()

    def scaled(x):
        major, _ = kernels.cuda_capability(x.device)
        return x * major

    compiled = torch.compile(scaled, fullgraph=True, backend="eager")
    x = torch.ones(3)
    assert torch.equal(compiled(x), x * 9)
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(2):
            assert torch.equal(compiled(x), x * 9)
    SETTINGS.caches.capabilities.clear()


def test_attention_checks_trace_without_a_break():
    """pope_attention's input checks (registries of magnitudes and backends included) run inside compiled code:
    they must trace as constants, with no graph break, on the reference backend too."""
    torch._dynamo.reset()
    q = torch.randn(1, 2, 8, 16)
    delta = torch.zeros(2, 16)

    def attend(q):
        return pope.attention.pope_attention(q, q, q, delta, backend="reference", magnitude="softplus")

    out = torch.compile(attend, fullgraph=True, backend="eager")(q)
    assert torch.allclose(out, attend(q))


@pytest.mark.parametrize("pe", ["rope", "pope:backend=reference", "pope:backend=triton"])
def test_a_compiled_gpt_called_at_another_length_still_traces_whole(pe, kernels_on_cpu):
    """The second length makes dynamo retrace with symbolic sizes (automatic dynamic shapes): attention's checks and
    the reference's causal decision must still trace without a break (fullgraph=True raises on one)."""
    torch._dynamo.reset()
    model = small_gpt(pe)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    for length in (32, 24, 16):
        idx = torch.randint(0, model.config.vocab_size, (2, length))
        logits, _ = compiled(idx)
        torch.testing.assert_close(logits, model(idx)[0])

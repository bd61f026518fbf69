"""Where a trained PoPE model's phase bias δ ended up (``pope analyze delta``).

δ (one entry per layer × head × frequency) enters the score bounded to [−2π, 0]
(:meth:`pope.encodings.PoPE.bounded_delta`), but the parameter itself may lie outside that interval:

* ``delta_range="clamp"`` (the paper's reading): an entry outside gets zero gradient, and positional parameters are
  not weight-decayed by default (pope.train.optimizer), so it has stopped learning for good, pinned at the bound
  (with ``recipe.weight_decay_params=all`` decay pulls an entry below −2π back inside);
* ``delta_range="wrap"``: the score uses the entry modulo 2π and it keeps learning; an entry outside is one that
  crossed a bound, i.e. one the clamp would have stopped;
* ``delta_range="project"``: the trainer puts every entry back inside after each optimizer step, so none is
  outside.

So the share of entries outside the interval measures, for a clamped model, how much of δ froze during training,
and for a wrapped one, how much the clamp would have frozen. Values exactly at a bound are inside (the clamp's
gradient is 1 there).
"""

from __future__ import annotations

from pathlib import Path

import torch

from pope.encodings import delta_outside, learned_deltas
from pope.eval.runs import load_run_model, run_dir_of
from pope.files import write_json_atomic

DELTA_STATE_FILE = "eval/delta_state.json"
"""Where ``pope analyze delta`` writes the result."""


def delta_state(model: torch.nn.Module) -> dict:
    """Per PoPE layer with a learned δ (in the order of ``model.blocks``): entries, how many lie below −2π and
    above 0, their share, and the raw values' range; plus the totals and the layers' ``delta_range`` /
    ``delta_init``. ValueError when no layer has a δ."""
    layers, ranges, inits = [], set(), set()
    for index, pe, raw in learned_deltas(model):
        below, above = delta_outside(raw)
        layers.append(
            {
                "layer": index,
                "entries": raw.numel(),
                "below": below,
                "above": above,
                "outside_share": (below + above) / raw.numel(),
                "min": float(raw.min()),
                "max": float(raw.max()),
            }
        )
        ranges.add(pe.delta_range)
        inits.add(pe.delta_init)
    if not layers:
        raise ValueError(
            "the model has no PoPE layer with a learned delta (another encoding, or PoPE with "
            "use_delta off): there is no delta to analyse"
        )
    entries = sum(layer["entries"] for layer in layers)
    outside = sum(layer["below"] + layer["above"] for layer in layers)
    return {
        "delta_range": "/".join(sorted(ranges)),
        "delta_init": "/".join(sorted(inits)),
        "entries": entries,
        "outside": outside,
        "outside_share": outside / entries,
        "layers": layers,
    }


def delta_state_table(state: dict) -> str:
    """The per-layer table ``pope analyze delta`` prints."""
    lines = [
        f"delta ({state['delta_range']}, init {state['delta_init']}): {state['outside']:,} of "
        f"{state['entries']:,} entries outside [-2pi, 0] ({100 * state['outside_share']:.1f} %)",
        f"{'layer':>5} {'entries':>8} {'below':>6} {'above':>6} {'outside':>8} {'min':>8} {'max':>8}",
    ]
    for layer in state["layers"]:
        lines.append(
            f"{layer['layer']:>5} {layer['entries']:>8} {layer['below']:>6} {layer['above']:>6} "
            f"{100 * layer['outside_share']:>7.1f}% {layer['min']:>8.3f} {layer['max']:>8.3f}"
        )
    return "\n".join(lines)


def write_delta_state(path: str | Path, out: str | Path | None = None) -> tuple[dict, Path]:
    """Load the model of a run directory (its best checkpoint if it has one, else its last) or of a checkpoint
    directory, and write its :func:`delta_state`, with the checkpoint's path and step, to ``out`` (default
    RUN/eval/delta_state.json, atomically). Returns (state, the file written)."""
    model, info = load_run_model(path)
    state = {"checkpoint": info["path"], "step": info["step"], **delta_state(model)}
    out = Path(out) if out is not None else run_dir_of(path) / DELTA_STATE_FILE
    return state, write_json_atomic(out, state)

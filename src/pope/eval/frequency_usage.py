"""Which frequencies does a trained model use? (``pope analyze frequencies``)

For every attention layer we capture the raw query and key projections with forward hooks on
``model.blocks[i].attn.q_proj`` / ``k_proj`` (the model itself is not modified) and average, over heads
and tokens, the magnitude that each frequency receives:

* PoPE: the magnitude of channel c is f(x_c) (softplus in the paper; the layer's own magnitude function),
  one row per frequency theta_c = base^(-(c-1)/r), r = rotary_dim or head_dim  -> r rows.
* RoPE (and YaRN/PI/NTK variants): the norm of each rotated 2-D chunk (x_i, x_{i+r/2}) for the
  rotate-half layout, (x_{2i}, x_{2i+1}) for the interleaved one  -> r/2 rows.

and, for PoPE, the learned phase bias delta (in [-2π, 0], as the layer uses it) per
layer × head × frequency, with how far it moved from 0 read as a phase (``delta_movement``). Row 0 is always
the highest frequency (theta = 1).

For PoPE also the *position-only score* of every head (``position_bias``): the score
sum_c |q_c| |k_c| cos(Δ·theta_c + delta_c) of a query and a key whose magnitudes are the layer's means, as a
function of the distance Δ = s − t, divided by sum_c |q_c| |k_c| (so it lies in [-1, 1] and is 1 where every
channel is in phase). It is what the encoding alone adds to a score: with delta = 0 it peaks at Δ = 0 and
falls off like a recency bias; a delta away from 0 moves the peak. Past the training length, a head whose
position-only score rises above every value it had within the training length prefers distances it never
saw (``position_bias_summary``). The magnitudes are averages over heads and tokens, so this describes the
encoding's share of the score, not any one token's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from pope.attention import MAGNITUDES
from pope.encodings import PoPE, RoPE
from pope.files import finish_figure, write_json_atomic
from pope.frequencies import pope_frequencies
from pope.optional import pyplot


@dataclass
class FrequencyUsage:
    kind: str  # "pope" or "rope"
    frequencies: np.ndarray  # (F,) radians per position, row order of the arrays below
    query: np.ndarray  # (n_layer, F) mean magnitude over heads and tokens
    key: np.ndarray  # (n_layer, F)
    delta: np.ndarray | None  # (n_layer, n_head, F) clamped delta (PoPE with delta) else None
    n_tokens: int

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "n_tokens": self.n_tokens,
            "frequencies": self.frequencies.tolist(),
            "query": self.query.tolist(),
            "key": self.key.tolist(),
            "delta": None if self.delta is None else self.delta.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> FrequencyUsage:
        """The inverse of ``to_dict`` (a frequency_usage.json read back)."""
        try:
            return cls(
                kind=data["kind"],
                frequencies=np.asarray(data["frequencies"], dtype=np.float64),
                query=np.asarray(data["query"], dtype=np.float64),
                key=np.asarray(data["key"], dtype=np.float64),
                delta=None if data.get("delta") is None else np.asarray(data["delta"], dtype=np.float64),
                n_tokens=int(data["n_tokens"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"not a frequency_usage.json of `pope analyze frequencies` ({err!r}); run it again"
            ) from None


def position_bias(usage: FrequencyUsage, distances: np.ndarray) -> np.ndarray:
    """(n_layer, n_head, len(distances)): each PoPE head's position-only score at each distance (module
    docstring), in [-1, 1]. Heads without a delta (PoPE without phase bias) all get delta = 0."""
    if usage.kind != "pope":
        raise ValueError(f"the position-only score is defined for PoPE, not {usage.kind!r}")
    weights = usage.query * usage.key  # (n_layer, F)
    delta = usage.delta if usage.delta is not None else np.zeros((weights.shape[0], 1, weights.shape[1]))
    distances = np.asarray(distances, dtype=np.float64)
    phase = distances[:, None] * usage.frequencies[None, :]  # (D, F), float64: exact at any distance here
    scores = np.einsum("lf,lhdf->lhd", weights, np.cos(phase[None, None] + delta[:, :, None, :]))
    return scores / weights.sum(axis=1)[:, None, None]


def position_bias_summary(usage: FrequencyUsage, train_length: int, max_distance: int) -> dict:
    """How the heads' position-only scores behave past the training length, over every whole distance up to
    max_distance: the number of heads whose maximum over [0, train_length] is at distance 0 (a recency bias);
    the number whose score somewhere in (train_length, max_distance] exceeds that maximum (they prefer a
    distance never seen in training; for a score that oscillates at random this also grows with the number of
    distances past the training length, so read it with the next value); and the median over heads of
    max(past) − max(within), negative when the far distances are never preferred."""
    if not 0 < train_length < max_distance:
        raise ValueError(f"need 0 < train_length < max_distance, got {train_length} and {max_distance}")
    bias = position_bias(usage, np.arange(max_distance + 1))
    within, past = bias[..., : train_length + 1], bias[..., train_length + 1 :]
    excess = past.max(-1) - within.max(-1)  # (n_layer, n_head)
    return {
        "train_length": train_length,
        "max_distance": max_distance,
        "n_heads": int(excess.size),
        "heads_peaking_at_distance_0": int((within.argmax(-1) == 0).sum()),
        "heads_rising_past_training": int((excess > 0).sum()),
        "median_excess_past_training": round(float(np.median(excess)), 4),
    }


def delta_phase(delta: np.ndarray) -> np.ndarray:
    """delta as the phase it is, in (-π, π]: a wrapped entry just below 0 (say -6.27) and one just above 0 (+0.01)
    are the same phase, and only this form shows it. Same shape as ``delta``."""
    return -np.remainder(-np.asarray(delta, dtype=np.float64) + math.pi, 2 * math.pi) + math.pi


DELTA_MOVED = 0.1
"""Phase distance from 0 (radians) past which ``delta_movement`` counts an entry as moved."""


def delta_movement(delta: np.ndarray) -> dict:
    """How far the learned delta (n_layer, n_head, F; row 0 of F the highest frequency) moved from its zero
    initialisation, measured as a phase (``delta_phase``), so clamped and wrapped runs compare: the share of
    entries exactly 0, moved by more than ``DELTA_MOVED`` rad, with a positive phase (only a wrapped delta can
    have one), the median and largest distance; and the same per quarter of the frequencies, highest first
    (a quarter holds F // 4 or one more frequency)."""

    def shares(phase: np.ndarray) -> dict:
        distance = np.abs(phase)
        return {
            "exactly_zero": round(float((distance == 0).mean()), 4),
            "moved": round(float((distance > DELTA_MOVED).mean()), 4),
            "positive": round(float((phase > 0).mean()), 4),
            "mean_distance": round(float(distance.mean()), 4),
        }

    phase = delta_phase(delta)
    distance = np.abs(phase)
    quarters = [shares(part) for part in np.array_split(phase, 4, axis=-1) if part.size]
    return {
        "entries": int(distance.size),
        "moved_threshold": DELTA_MOVED,
        **shares(phase),
        "median_distance": round(float(np.median(distance)), 4),
        "max_distance": round(float(distance.max()), 4),
        "by_frequency_quarter": quarters,
    }


def format_delta_movement(summary: dict) -> str:
    """One line for people: the shares of ``delta_movement`` in percent, the quarters' 'moved' shares."""
    quarters = ", ".join(f"{100 * q['moved']:.1f} %" for q in summary["by_frequency_quarter"])
    return (
        f"delta as a phase ({summary['entries']:,} entries): {100 * summary['exactly_zero']:.1f} % exactly 0, "
        f"{100 * summary['moved']:.1f} % moved more than {summary['moved_threshold']} rad (by frequency quarter, "
        f"highest first: {quarters}), {100 * summary['positive']:.1f} % positive; median distance from 0 "
        f"{summary['median_distance']:.4f} rad, largest {summary['max_distance']:.4f}"
    )


def frequency_magnitudes(projection: torch.Tensor, n_heads: int, pe: torch.nn.Module) -> torch.Tensor:
    """Per-frequency magnitudes of one projection output.

    projection: (B, T, n_heads * head_dim), the output of q_proj or k_proj.
    Returns (B, T, n_heads, F) in fp32: F = r for PoPE, r/2 for RoPE (see module docstring).
    """
    b, t, width = projection.shape
    head_dim = width // n_heads
    x = projection.float().view(b, t, n_heads, head_dim)
    if isinstance(pe, PoPE):
        r = pe.rotary_dim or head_dim
        return MAGNITUDES[pe.magnitude](x[..., :r])
    if isinstance(pe, RoPE):
        r = pe.rotary_dim
        if pe.layout == "half":
            first, second = x[..., : r // 2], x[..., r // 2 : r]
        else:
            first, second = x[..., 0:r:2], x[..., 1:r:2]
        return torch.sqrt(first * first + second * second)
    raise ValueError(
        f"frequency analysis needs a rotating positional encoding (pope, rope, yarn, pi, ntk, rope-half); "
        f"this model's attention uses {type(pe).__name__}"
    )


def encoding_frequencies(pe: torch.nn.Module, head_dim: int) -> tuple[str, np.ndarray]:
    """("pope" | "rope", the layer's frequencies in row order), from pope.frequencies / the layer's buffer."""
    if isinstance(pe, PoPE):
        return "pope", pope_frequencies(pe.rotary_dim or head_dim, pe.base).numpy()
    if isinstance(pe, RoPE):
        return "rope", pe.frequencies()[0].detach().float().cpu().numpy()
    frequency_magnitudes(torch.zeros(1, 1, head_dim), 1, pe)  # raises the explanatory error
    raise AssertionError("unreachable")


@torch.no_grad()
def analyze_frequencies(
    model: torch.nn.Module,
    sequences: list[torch.Tensor],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> FrequencyUsage:
    """Mean query/key magnitude per layer × frequency over all tokens of ``sequences`` (each (T,) long)."""
    if not sequences:
        raise ValueError("frequency analysis needs at least one token sequence")
    blocks = model.blocks
    config = model.config
    kind, frequencies = encoding_frequencies(blocks[0].attn.pe, config.head_dim)
    n_freq = frequencies.shape[0]
    sums = {name: torch.zeros(len(blocks), n_freq, dtype=torch.float64) for name in ("query", "key")}
    counts = {name: torch.zeros(len(blocks), dtype=torch.float64) for name in ("query", "key")}

    def make_hook(layer: int, name: str, n_heads: int, pe):
        def hook(_module, _inputs, output):  # output: (B, T, n_heads * head_dim)
            magnitudes = frequency_magnitudes(output, n_heads, pe)  # (B, T, n_heads, F)
            sums[name][layer] += magnitudes.double().sum(dim=(0, 1, 2)).cpu()
            counts[name][layer] += magnitudes.shape[0] * magnitudes.shape[1] * magnitudes.shape[2]

        return hook

    handles = []
    for layer, block in enumerate(blocks):
        attn = block.attn
        handles.append(attn.q_proj.register_forward_hook(make_hook(layer, "query", attn.n_head, attn.pe)))
        handles.append(attn.k_proj.register_forward_hook(make_hook(layer, "key", attn.n_kv_head, attn.pe)))
    was_training = model.training
    model.eval()
    n_tokens = 0
    try:
        for sequence in tqdm(sequences, desc="frequency analysis", unit="seq", disable=not progress, leave=False):
            idx = torch.as_tensor(sequence, dtype=torch.long, device=device).reshape(1, -1)  # (1, T)
            model(idx)
            n_tokens += idx.shape[1]
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)

    deltas = [block.attn.pe.bounded_delta() if isinstance(block.attn.pe, PoPE) else None for block in blocks]
    delta = None if any(d is None for d in deltas) else torch.stack(deltas).detach().float().cpu().numpy()
    return FrequencyUsage(
        kind=kind,
        frequencies=frequencies,
        query=(sums["query"] / counts["query"][:, None]).numpy(),
        key=(sums["key"] / counts["key"][:, None]).numpy(),
        delta=delta,
        n_tokens=n_tokens,
    )


def chunk_tokens(tokens: list[int] | np.ndarray, max_len: int) -> list[torch.Tensor]:
    """Cut a token stream into consecutive sequences of at most ``max_len`` (the last may be shorter)."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    if tokens.numel() == 0:
        raise ValueError("the text produced no tokens")
    return list(torch.split(tokens, max_len))


def plot_frequency_usage(usage: FrequencyUsage, path: Path, *, title: str = "") -> Path:
    """Heatmaps layer × frequency for queries and keys (like the paper's figure)."""
    plt = pyplot()
    n_layer, n_freq = usage.query.shape
    fig, axes = plt.subplots(1, 2, figsize=(min(16, 4 + 0.12 * n_freq * 2), 1.5 + 0.35 * n_layer), squeeze=False)
    label = "softplus magnitude" if usage.kind == "pope" else "2-D chunk norm"
    for ax, (name, values) in zip(axes[0], (("queries", usage.query), ("keys", usage.key))):
        image = ax.imshow(values, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
        ax.set_xlabel("frequency index (0 = highest, theta = 1)")
        ax.set_ylabel("layer")
        ax.set_title(f"{name}: mean {label}")
        fig.colorbar(image, ax=ax)
    return finish_figure(fig, path, title=title)


def plot_delta(delta: np.ndarray, path: Path, *, title: str = "") -> Path:
    """One heatmap per layer: head × frequency of delta as a phase in (-π, π] (``delta_phase``), on a diverging
    scale symmetric about 0 that reaches the largest distance, so small moves and a wrapped delta's positive
    phases show (a clamped delta is never positive)."""
    plt = pyplot()
    phase = delta_phase(delta)
    n_layer, n_head, n_freq = phase.shape
    limit = max(float(np.abs(phase).max()), 1e-3)  # all zero: any small symmetric scale
    n_cols = min(4, n_layer)
    n_rows = math.ceil(n_layer / n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(4 * n_cols, 0.4 * n_head * n_rows + 2), squeeze=False, layout="constrained"
    )  # makes room for the shared colorbar and every label
    for layer in range(n_rows * n_cols):
        ax = axes[layer // n_cols][layer % n_cols]
        if layer >= n_layer:
            ax.axis("off")
            continue
        image = ax.imshow(
            phase[layer], aspect="auto", origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest"
        )
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("frequency index (0 = highest)")
        ax.set_ylabel("head")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="delta as a phase in (-π, π] (rad)")
    return finish_figure(fig, path, title=title, tight_layout=False)


def plot_position_bias(
    usage: FrequencyUsage, path: Path, *, train_length: int, max_distance: int, title: str = ""
) -> Path:
    """One panel per layer: every head's position-only score against the distance, the training length marked."""
    plt = pyplot()
    distances = np.unique(np.geomspace(1, max_distance, 400).round().astype(int))
    bias = position_bias(usage, distances)
    n_layer = bias.shape[0]
    n_cols = min(4, n_layer)
    n_rows = math.ceil(n_layer / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.6 * n_cols, 2.8 * n_rows + 0.6), squeeze=False, sharey=True)
    for layer in range(n_rows * n_cols):
        ax = axes[layer // n_cols][layer % n_cols]
        if layer >= n_layer:
            ax.axis("off")
            continue
        for head in range(bias.shape[1]):
            ax.plot(distances, bias[layer, head], linewidth=1)
        ax.axvline(train_length, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("distance s − t (tokens)")
        ax.grid(True, alpha=0.3)
    for row in axes:
        row[0].set_ylabel("position-only score")
    return finish_figure(
        fig, path, title=(title + "\n" if title else "") + f"one line per head; dashed: training length {train_length}"
    )


def write_frequency_report(
    usage: FrequencyUsage, out_dir: Path, *, title: str = "", position_bias: dict | None = None
) -> list[Path]:
    """frequency_usage.json + frequency_usage.png (+ delta.png, delta.npy and the JSON's "delta_movement"
    (:func:`delta_movement`) for PoPE with delta; with a PoPE
    ``position_bias`` summary (:func:`position_bias_summary`): position_bias.png over its distances, and the
    summary in the JSON under "position_bias")."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = usage.to_dict()
    if position_bias is not None:
        data["position_bias"] = position_bias
    if usage.delta is not None:
        data["delta_movement"] = delta_movement(usage.delta)
    written = [write_json_atomic(out_dir / "frequency_usage.json", data)]
    written.append(plot_frequency_usage(usage, out_dir / "frequency_usage.png", title=title))
    if usage.delta is not None:
        np.save(out_dir / "delta.npy", usage.delta)
        written += [out_dir / "delta.npy", plot_delta(usage.delta, out_dir / "delta.png", title=title)]
    if position_bias is not None:
        written.append(
            plot_position_bias(
                usage,
                out_dir / "position_bias.png",
                title=title,
                train_length=position_bias["train_length"],
                max_distance=position_bias["max_distance"],
            )
        )
    return written

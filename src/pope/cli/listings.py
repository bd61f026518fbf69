"""`pope presets [NAME]` and `pope pe [NAME]`: what the presets and the positional encodings are; also `pope train
--list` and the preset names in `pope train --help` (the train command is registered first)."""

from __future__ import annotations

import argparse


def preset_rows() -> list[dict]:
    """One row per preset: name, layers, d_model, heads, parameters, dataset, context, description.

    Parameters are counted on a model built on the meta device (no memory, the real module code), with
    the preset's PoPE encoding; other encodings differ by at most PoPE's delta (n_head x head_dim per layer).
    """
    import torch

    from pope.model import GPT
    from pope.presets import PRESETS, list_presets

    rows = []
    for name in list_presets():
        preset = PRESETS[name]
        model = dict(preset.model)
        if "vocab_size" not in model:  # generated tasks carry their own vocabulary
            from pope.data.indirect_indexing import VOCAB_SIZE

            model["vocab_size"] = VOCAB_SIZE
        config = preset.model_config(pe="pope", **model)
        with torch.device("meta"):
            n_params = GPT(config).num_params()
        rows.append(
            {
                "name": name,
                "n_layer": config.n_layer,
                "d_model": config.d_model,
                "n_head": config.n_head,
                "params": n_params,
                "dataset": preset.recipe.dataset,
                "seq_len": preset.recipe.seq_len,
                "description": preset.description,
            }
        )
    return rows


def _human_count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"


def presets_table(name: str | None = None) -> str:
    """The presets as an aligned text table (or one preset's full settings when `name` is given)."""
    if name is not None:
        import json

        from pope.presets import get_preset

        preset = get_preset(name)
        return json.dumps(
            {
                "name": preset.name,
                "description": preset.description,
                "model": preset.model,
                "recipe": preset.recipe.to_dict(),
                "pope_delta_init": preset.pope_delta_init,
                "paper": preset.paper,
            },
            indent=2,
        )
    rows = preset_rows()
    header = f"{'preset':24s} {'size':>14s} {'params':>8s} {'dataset':18s} {'context':>7s}  description"
    lines = [header]
    for row in rows:
        size = f"{row['n_layer']} x {row['d_model']}"
        lines.append(
            f"{row['name']:24s} {size:>14s} {_human_count(row['params']):>8s} {row['dataset']:18s} "
            f"{row['seq_len']:>7d}  {row['description']}"
        )
    lines.append("size = layers x d_model; params with PoPE; `pope presets NAME` shows a preset's full settings")
    return "\n".join(lines)


def preset_names_help() -> str:
    """A sentence naming every preset, for `pope train --help`."""
    from pope.presets import list_presets

    return f"presets: {', '.join(list_presets())} (`pope presets` lists their sizes and datasets)"


def encodings_table(name: str | None = None) -> str:
    """Every positional encoding with its description and options (defaults), or just `name`'s."""
    from pope.encodings.registry import describe_positional_encoding, encoding_spec, list_positional_encodings

    names = [name.strip().lower()] if name is not None else list_positional_encodings()
    lines = []
    for pe in names:
        options = describe_positional_encoding(pe)  # ValueError naming the valid encodings for a bad name
        lines.append(f"{pe:15s} {encoding_spec(pe).description}")
        listed = ", ".join(f"{key}={value!r}" for key, value in options.items())
        lines.append(f"{'':15s} options: {listed or 'none'}")
        if pe == "pope":
            lines.append(f"{'':15s} {preset_delta_init_note()}")
    lines.append(
        "spec syntax: NAME or NAME:key=value,key=value, e.g. --pe pope:delta_init=zero or --pe rope:base=500000"
    )
    return "\n".join(lines)


def preset_delta_init_note() -> str:
    """How `pope train` fills PoPE's delta_init from the preset when --pe leaves it out (Preset.resolve_pe)."""
    from pope.presets import PRESETS

    by_init: dict[str, list[str]] = {}
    for name in sorted(PRESETS):
        by_init.setdefault(PRESETS[name].pope_delta_init, []).append(name)
    common = max(by_init, key=lambda init: len(by_init[init]))
    others = "; ".join(f"{init} for {', '.join(names)}" for init, names in by_init.items() if init != common)
    return (
        f"under `pope train`, a --pe without delta_init takes the preset's: {others}; {common} for the other "
        f"presets (the banner and --print-config show it)"
    )


class _PrintAndExit(argparse.Action):
    """`--list`-style flag: prints a listing and exits 0 before required arguments are checked (like --version)."""

    def __init__(self, option_strings, dest, listing=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.listing = listing

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.listing())
        parser.exit(0)


def register(subparsers) -> None:
    presets = subparsers.add_parser(
        "presets",
        help="list the paper's presets (size, dataset, description)",
        description="List the presets `pope train` accepts, or one preset's settings.",
    )
    presets.add_argument("name", nargs="?", help="show this preset's model and recipe")
    presets.set_defaults(func=lambda args: print(presets_table(args.name)))
    pe = subparsers.add_parser(
        "pe",
        help="list the positional encodings and their options",
        description="List the positional encodings `--pe` accepts, with their options.",
    )
    pe.add_argument("name", nargs="?", help="show only this encoding")
    pe.add_argument("--list", action="store_true", help="list every encoding (the default)")
    pe.set_defaults(func=lambda args: print(encodings_table(args.name)))
    train = subparsers.choices.get("train")
    if train is not None:  # name the presets in `pope train --help` and offer `pope train --list`
        train.epilog = preset_names_help  # called when the help is shown (_Parser)
        if "--list" not in train._option_string_actions:
            train.add_argument(
                "--list",
                action=_PrintAndExit,
                listing=presets_table,
                help="list the presets with their sizes and datasets, and exit",
            )

"""The `pope` command. Thin: each area registers its own sub-commands.

    pope train PRESET --pe NAME --out DIR        (pope.train.cli; `pope train --list` lists the presets)
    pope data prepare NAME | info DIR | offline  (pope.data.cli)
    pope eval ... | analyze ... | report ...     (pope.eval.cli)
    pope presets [NAME] | pe [--list] [NAME]     (here: what the presets and positional encodings are)

Every user-facing error ends as one line `pope CMD: error: ...` and exit status 1 (Ctrl-C: 130);
`pope --debug CMD ...` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute sub-commands; each defines `register(subparsers)`.
# Imported lazily so `pope --help` stays fast and a missing optional extra only breaks its own command.
_COMMAND_MODULES = ("pope.train.cli", "pope.data.cli", "pope.eval.cli")

# Exceptions that carry a message meant for the user (our code raises them with what is wrong and what to
# do). OSError covers FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError.
USER_ERRORS = (ValueError, TypeError, OSError, RuntimeError, ImportError)


# -------------------------------------------------------------------------------- argument types
def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse prints `argument --x: ...` and exits 2 otherwise)."""
    return _bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0)


def _bounded_int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
    return value


# ------------------------------------------------------------------------------------ listings
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
    from pope.encodings import _spec, describe_positional_encoding, list_positional_encodings

    names = [name.strip().lower()] if name is not None else list_positional_encodings()
    lines = []
    for pe in names:
        options = describe_positional_encoding(pe)  # ValueError naming the valid encodings for a bad name
        lines.append(f"{pe:15s} {_spec(pe).description}")
        listed = ", ".join(f"{key}={value!r}" for key, value in options.items())
        lines.append(f"{'':15s} options: {listed or 'none'}")
    lines.append(
        "spec syntax: NAME or NAME:key=value,key=value, e.g. --pe pope:delta_init=zero or --pe rope:base=500000"
    )
    return "\n".join(lines)


class _PrintAndExit(argparse.Action):
    """`--list`-style flag: prints a listing and exits 0 before required arguments are checked (like --version)."""

    def __init__(self, option_strings, dest, listing=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.listing = listing

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.listing())
        parser.exit(0)


def _register_listings(subparsers) -> None:
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


# ----------------------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands' too) whose epilog may be a function, called only when the help is shown:
    the preset names import pope.presets, hence torch, which commands such as `pope data info` do not need."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    from pope.version import __version__

    parser = _Parser(prog="pope", description="Polar Coordinate Positional Embeddings toolkit")
    parser.add_argument("--version", action="version", version=f"pope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            # Only tolerate the area itself being absent, never a broken import inside it.
            if err.name is not None and module_name.startswith(err.name):
                continue
            raise
        module.register(subparsers)
    _register_listings(subparsers)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    """'data prepare', 'eval length', 'train', ... for the error line."""
    parts = [args.command]
    for key in ("data_command", "eval_command", "analyze_command", "offline_command"):
        if getattr(args, key, None):
            parts.append(getattr(args, key))
    return " ".join(parts)


def _raised_by_pope(err: BaseException) -> bool:
    """Whether the innermost frame of the traceback is this package's code (its messages are written for
    users); an error from inside torch, numpy, ... gets a hint at --debug instead."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("pope")


def _one_line(err: BaseException) -> str:
    message = str(err).strip() or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in message:
        message = f"{err.filename}: {message}"
    if not _raised_by_pope(err):
        message += f" ({type(err).__name__}; `pope --debug ...` shows the traceback)"
    return message


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere on the line, not only before the command
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    command = _command_name(args)
    try:
        result = args.func(args)
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\npope {command}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as err:  # user-facing errors: one clear line
        if debug:
            raise
        print(f"pope {command}: error: {_one_line(err)}", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

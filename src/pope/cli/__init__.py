"""The `pope` command. Thin: each area's module here registers its own sub-commands.

    pope train PRESET --pe NAME --out DIR        (pope.cli.train; `pope train --list` lists the presets)
    pope finetune RUN --context N                (pope.cli.train)
    pope data prepare NAME | info DIR | offline  (pope.cli.data)
    pope export hf RUN OUT                       (pope.cli.export: a transformers model directory)
    pope eval ... | analyze ... | report ...     (pope.cli.eval)
    pope presets [NAME] | pe [--list] [NAME]     (pope.cli.listings: what the presets and positional encodings are)

Every user-facing error ends as one line `pope CMD: error: ...` and exit status 1 (Ctrl-C: 130);
`pope --debug CMD ...` shows the traceback instead.

The command modules import what a command runs inside the command's function, when it runs (the one layer of pope
that imports its own modules lazily): `pope --help` and `pope data ...` start without torch, and a missing optional
extra breaks only its own command.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from pope.parsing import did_you_mean
from pope.version import __version__

# Modules that contribute sub-commands; each defines `register(subparsers)`.
# Imported lazily so `pope --help` stays fast and a missing optional extra only breaks its own command.
_COMMAND_MODULES = ("pope.cli.train", "pope.cli.data", "pope.cli.eval", "pope.cli.export", "pope.cli.listings")

# Exceptions that carry a message meant for the user (our code raises them with what is wrong and what to
# do). OSError covers FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError.
USER_ERRORS = (ValueError, TypeError, OSError, RuntimeError, ImportError)


# A write the disk or the directory refused (full, over quota, read-only, not permitted).
_REFUSED_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


# ----------------------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands' too) whose epilog may be a function, called only when the help is shown:
    the preset names import pope.presets, hence torch, which commands such as `pope data info` do not need."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, with "did you mean" for a misspelled option (argparse exits 2 with the usage line)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _innermost_parser(parser, args)
        options = [option for action in command._actions for option in action.option_strings]
        shown = [f"{x}{did_you_mean(x.split('=')[0], options)}" if x.startswith("-") else x for x in extras]
        command.error(f"unrecognized arguments: {' '.join(shown)}")
    return args


def _innermost_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the sub-command the arguments chose ('pope eval length' -> its parser)."""
    while True:
        chosen = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, chosen[0].dest, None) if chosen else None
        if name not in (chosen[0].choices if chosen else {}):
            return parser
        parser = chosen[0].choices[name]


def _command_name(args: argparse.Namespace) -> str:
    """'data prepare', 'eval length', 'train', ... for the error line."""
    parts = [args.command]
    for key in ("data_command", "eval_command", "analyze_command", "offline_command", "export_command"):
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
    if isinstance(err, OSError) and err.errno in _REFUSED_WRITES and "; " not in message:
        # a bare "No space left on device": what was written is whole (atomic writes), so the fix is to rerun
        message += "; free space or make the directory writable, then run the command again"
    if not _raised_by_pope(err):
        message += f" ({type(err).__name__}; `pope --debug ...` shows the traceback)"
    return message


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere on the line, not only before the command
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = _parse(parser, argv)
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

"""One parser for option strings and one type check for config dataclasses, driven by annotations.

Used for ``--set section.key=value`` (pope.train.run_config), positional-encoding specs
("pope:delta_init=zero,use_delta=false", pope.encodings) and the ``__post_init__`` of every config
dataclass (GPTConfig, Recipe, TrainOptions, RunConfig), so text and Python values follow one rule:

- bool: text true/false, yes/no, on/off, 1/0 (any case); in Python only True/False.
- int: text of an integer ("2.0" is refused); in Python an int, never a bool or a float.
- float: text of a number; in Python an int or a float (stored as float), never a bool.
- str; ``Literal[...]``: one of the listed values.
- ``X | None``: also the text "none" / "null", or None in Python.

Text that does not fit is a ValueError naming the key, the value and what is accepted; a Python value
of the wrong type is a TypeError saying the same.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NONE_WORDS = ("none", "null")


def _alternatives(annotation) -> tuple[list, bool]:
    """(non-None alternatives of a union / Optional, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(annotation)
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], annotation is type(None)


def describe_type(annotation, *, text: bool = True) -> str:
    """What a value of ``annotation`` may be: as text ('true/false (also yes/no, on/off, 1/0)', 'an integer',
    'none', ...) or, with ``text=False``, as a Python value ('True or False', 'an int', 'None', ...)."""
    kinds, optional = _alternatives(annotation)
    names = (
        {bool: "true/false (also yes/no, on/off, 1/0)", int: "an integer", float: "a number", str: "a string"}
        if text
        else {bool: "True or False", int: "an int", float: "a float (or int)", str: "a str"}
    )
    words = []
    for kind in kinds:
        if typing.get_origin(kind) is Literal:
            words.append("one of " + ", ".join(repr(c) for c in typing.get_args(kind)))
        else:
            words.append(names.get(kind, getattr(kind, "__name__", str(kind))))
    return " or ".join(words + (["none" if text else "None"] if optional else []))


def did_you_mean(name, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' naming the choice closest to a misspelled ``name`` (difflib), or '' when none is
    close: for the one-line errors that list the valid names."""
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def parse_value(text: str, annotation, *, key: str):
    """Read ``text`` as a value of ``annotation`` (see the module docstring); ValueError names ``key``."""
    stripped = text.strip()
    lowered = stripped.lower()
    kinds, optional = _alternatives(annotation)
    if optional and lowered in NONE_WORDS:
        return None
    for kind in kinds:
        if typing.get_origin(kind) is Literal:
            if stripped in typing.get_args(kind):
                return stripped
        elif kind is bool:
            if lowered in TRUE_WORDS:
                return True
            if lowered in FALSE_WORDS:
                return False
        elif kind is int:
            try:
                return int(stripped)
            except ValueError:
                pass
        elif kind is float:
            try:
                return float(stripped)
            except ValueError:
                pass
        elif kind is str:
            return stripped
        else:
            raise TypeError(f"{key}: no text parser for type {kind!r}")
    raise ValueError(f"{key}={text!r}: cannot read {text!r} as {describe_type(annotation)}")


def check_value(value, annotation, *, key: str):
    """``value`` if it has ``annotation``'s type (an int for a float is returned as float), else TypeError;
    a Literal value outside its choices is a ValueError."""
    kinds, optional = _alternatives(annotation)
    if value is None:
        if optional:
            return None
        raise TypeError(f"{key} must be {describe_type(annotation, text=False)}; got None")
    for kind in kinds:
        if typing.get_origin(kind) is Literal:
            if value in typing.get_args(kind) and isinstance(value, str):
                return value
            if isinstance(value, str):
                raise ValueError(f"{key} must be {describe_type(annotation, text=False)}; got {value!r}")
        elif kind is bool:
            if isinstance(value, bool):
                return value
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif isinstance(value, kind):
            return value
    raise TypeError(f"{key} must be {describe_type(annotation, text=False)}; got {value!r} ({type(value).__name__})")


def field_types(cls) -> dict[str, Any]:
    """{field name: resolved annotation} of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_fields(instance) -> None:
    """Type-check every field of a dataclass instance (call from ``__post_init__``); ints given for
    float fields are stored as floats."""
    cls = type(instance)
    for name, annotation in field_types(cls).items():
        value = getattr(instance, name)
        checked = check_value(value, annotation, key=f"{cls.__name__}.{name}")
        if checked is not value:
            object.__setattr__(instance, name, checked)  # also on frozen dataclasses


def parse_assignments(
    items: Iterable[str], types_by_key: dict[str, Any], *, where: str, noun: str = "key"
) -> dict[str, Any]:
    """['key=value', ...] -> {key: typed value}. A missing '=', an unknown key, a key given twice and a
    value that does not read as its type are ValueErrors starting with ``where`` (e.g. the spec)."""
    result: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"{where}: {item!r} must look like {noun}=value")
        if key not in types_by_key:
            raise ValueError(
                f"{where}: no {noun} {key!r}{did_you_mean(key, types_by_key)}; valid {noun}s: "
                f"{', '.join(types_by_key) or 'none'}"
            )
        if key in result:
            raise ValueError(f"{where}: {noun} {key!r} is given twice; give each {noun} once")
        try:
            result[key] = parse_value(text, types_by_key[key], key=key)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    return result


def from_dict(cls, data: dict):
    """Build dataclass ``cls`` from a dict, refusing unknown keys with the list of valid ones."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} needs a dict of fields; got {type(data).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        hint = did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
        raise ValueError(f"unknown {cls.__name__} fields {unknown}{hint}; valid fields: {', '.join(known)}")
    return cls(**data)

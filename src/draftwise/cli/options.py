"""A command's options, generated from its config dataclass: one declaration per option.

Each config field carries its help, and where it needs them its flag, aliases, parser and choices, in its metadata
(`config.opt`); fields that are no user option are marked `config.internal`. `add` turns a config class's user fields
into argparse arguments; `values` reads back the ones given. argparse gets no defaults (SUPPRESS): a flag left out
stays out of the config's constructor, so the dataclass default applies, and the help shows that default.

Why a small generator over field metadata rather than tyro, jsonargparse or cyclopts: draftwise's flags have syntaxes
of their own that a library would reshape or need bending to keep — comma lists (--gammas 1,2,4, --temperatures
0,0.5,1), repeated flags whose values add up (--drafter, --baseline with llama-server:ARGS taken whole, commas
included), a scalar field that `bench` takes as a grid axis, --limit 0 for all, booleans with names of their own
(--fixed-sizes, --no-lookups), an old alias (--engines). This keeps every one of them exactly, in about a hundred
lines, with no new dependency.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from ..config import user_fields

_NOUNS = {int: "integers", float: "numbers", str: "names"}


def add(p: argparse.ArgumentParser, cls, axes: tuple[str, ...] = ()) -> None:
    """An argument per user field of `cls`; a field named in `axes` takes a comma list (a repeated flag for text)."""
    hints, groups = typing.get_type_hints(cls), {}
    for f in user_fields(cls):
        m = f.metadata
        if m.get("exclusive") and m["exclusive"] not in groups:
            groups[m["exclusive"]] = p.add_mutually_exclusive_group()
        target = groups[m["exclusive"]] if m.get("exclusive") else p
        if m.get("positional"):
            target.add_argument(f.name, help=m.get("help"), type=_parser(f, hints[f.name], False))
        else:
            target.add_argument(*flags(f), **_kwargs(f, hints[f.name], f.name in axes))


def values(cls, args: argparse.Namespace) -> dict:
    """The user fields of `cls` given on the command line (a repeated flag's values added up into a tuple)."""
    out = {}
    for f in user_fields(cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            out[f.name] = _added(value) if isinstance(value, list) else value
    return out


def flags(f: dataclasses.Field) -> list[str]:
    """The flags of a user field: its own (--field-name unless given; --no-field-name for a True boolean), aliases."""
    if f.metadata.get("flag"):
        first = f.metadata["flag"]
    elif f.default is True:
        first = "--no-" + f.name.replace("_", "-")
    else:
        first = "--" + f.name.replace("_", "-")
    return [first, *f.metadata.get("aliases", ())]


def _kwargs(f: dataclasses.Field, hint, axis: bool) -> dict:
    m = f.metadata
    kw = {"dest": f.name, "default": argparse.SUPPRESS, "help": _help(f), "required": m.get("required", False)}
    if _base(hint) is bool:
        return {**kw, "action": "store_false" if f.default else "store_true"}
    kw["type"] = _parser(f, hint, axis)
    if m.get("choices"):
        kw["choices"] = m["choices"]
    else:  # argparse would name the value after the dest; name it after the flag, as before
        kw["metavar"] = m.get("metavar") or flags(f)[0][2:].replace("-", "_").upper()
    if m.get("repeat") or axis and _base(hint) is str:
        kw["action"] = "append"
    return kw


def _parser(f: dataclasses.Field, hint, axis: bool):
    """One value's text → its value: the field's own parser, else from its type (tuples and axes: comma lists; a
    repeated flag of a tuple: one element each time)."""
    if f.metadata.get("parse"):
        return _typed(f.metadata["parse"])
    kind = _base(hint)
    if typing.get_origin(kind) is tuple:
        element = typing.get_args(kind)[0]
        return element if f.metadata.get("repeat") else _comma_list(element)
    if axis and kind is not str:
        return _comma_list(kind)
    return kind


def _base(hint):
    """`X | None` → X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _comma_list(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {_NOUNS[kind]}, got {text!r}") from None

    return parse


def _typed(parse):
    """A field's own parser, its ValueError shown by argparse as the flag's error."""

    def typed(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return typed


def _added(items: list) -> tuple:
    """A repeated flag's values: each a value, or a tuple of them (a comma list), in order."""
    out: list = []
    for item in items:
        out.extend(item if isinstance(item, tuple) else (item,))
    return tuple(out)


def _help(f: dataclasses.Field) -> str | None:
    """The field's help (argparse formats it: % doubled), with its default when that says something."""
    text = f.metadata.get("help")
    if text is None:
        return None
    text, shown = text.replace("%", "%%"), _shown(f.default)
    return f"{text} (default: {shown})" if shown else text


def _shown(default) -> str:
    """A default as it would be typed: comma lists joined; nothing for None, '', () and booleans."""
    if default is None or isinstance(default, bool) or default in ("", ()):
        return ""
    if isinstance(default, tuple):
        return ",".join(str(x) for x in default)
    return str(default)

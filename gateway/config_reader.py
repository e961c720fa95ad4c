"""The one reader of YAML configuration: a parsed document into typed msgspec structs, its errors
worded field first (`$.timeouts.connect_s: Expected float, got str`). The gateway's config
(gateway/config.py and the sections defined beside the code that uses them) and the tenants'
policy files (gateway/policy/) both read through it.

Rules the types cannot express live in a struct's `__post_init__`, which raises
ValueError("field: why") with the field relative to that struct; msgspec reports it at the
struct's path and `field_first` joins the two. A mapping keyed by names the operator chooses (a
category, a rule) is read entry by entry with `entries`, so an error names the entry: msgspec
itself would say `[...]`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class Section(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A config struct. Unknown keys are errors, so a typo fails at start-up instead of being
    ignored; frozen, because a config is read, never edited, once validated
    (`msgspec.structs.replace` makes a changed copy)."""


class FieldError(ValueError):
    """A document that does not fit its structs: `path` (`$.a.b[0]`, `$` for the whole) and why."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


def convert(data: Any, kind: type[T]) -> T:
    """`data` as a `kind`, or FieldError naming the field (with a close known name for a typo)."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        path, message = _split(field_first(str(exc)))
        unknown = re.fullmatch(r"unknown field", message)
        if unknown:
            hint = difflib.get_close_matches(path.rsplit(".", 1)[-1], _field_names(kind), n=1)
            message += f"; did you mean '{hint[0]}'?" if hint else ""
        raise FieldError(path, message) from None


def entries(value: Mapping[str, Any], kind: type[T], name: str) -> dict[str, T]:
    """Each value of an operator-keyed mapping as a `kind`, for a `__post_init__`: ValueError naming
    `name.key.field` (relative to the struct, as `__post_init__` errors are)."""
    read = {}
    for key, entry in value.items():
        try:
            read[key] = convert(entry, kind)
        except FieldError as exc:
            raise ValueError(f"{name}.{key}{exc.path.removeprefix('$')}: {exc.message}") from None
    return read


_AT = re.compile(r" - at `\$([^`]*)`$")
# How a __post_init__ rule words its error: "field: why", the field relative to its struct.
_OWN_FIELD = re.compile(r"([A-Za-z_][\w.\[\]/*-]*): ")
_NAMED_FIELD = re.compile(r"Object (missing required|contains unknown) field `([^`]+)`")


def field_first(message: str) -> str:
    """msgspec says 'Expected `int`, got `str` - at `$.listen.port`'; lead with the field instead,
    the way operators scan for it. A missing or unknown field is named in the path."""
    path, at = "$", _AT.search(message)
    if at:
        path, message = f"${at.group(1)}", message[: at.start()]
    own = _OWN_FIELD.match(message)
    if own:
        return f"{path}.{own.group(1)}: {message[own.end() :]}"
    named = _NAMED_FIELD.fullmatch(message)
    if named:
        what = "required field is missing" if named.group(1) == "missing required" else "unknown field"
        return f"{path}.{named.group(2)}: {what}"
    return f"{path}: {message}"


def _split(text: str) -> tuple[str, str]:
    path, _, message = text.partition(": ")
    return path, message


def _field_names(kind: Any) -> list[str]:
    """Every field name of every struct reachable from `kind`: the candidates for a typo's hint."""
    names: set[str] = set()
    seen: set[type] = set()

    def walk(info: Any) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in seen:
                return
            seen.add(info.cls)
            for field in info.fields:
                names.add(field.encode_name)
                walk(field.type)
        for attr in ("types", "item_type", "key_type", "value_type"):
            inner = getattr(info, attr, None)
            if isinstance(inner, tuple):
                for each in inner:
                    walk(each)
            elif inner is not None:
                walk(inner)

    walk(msgspec.inspect.type_info(kind))
    return sorted(names)

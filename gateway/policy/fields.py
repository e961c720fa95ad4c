"""Typed readers for YAML values that know where they are, so every error names file and field.

Strict on purpose: a policy is security configuration, and a value that only looks right (the
string "1000" for a limit, a misspelt key) must fail loudly rather than silently lift a limit.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.policy.errors import PolicyError


@dataclass(frozen=True)
class Where:
    """A position in a policy file: the file and a field path such as tenants[0].limits."""

    file: str
    path: str = ""

    def key(self, name: str) -> Where:
        return Where(self.file, f"{self.path}.{name}" if self.path else name)

    def index(self, i: int) -> Where:
        return Where(self.file, f"{self.path}[{i}]")

    def error(self, message: str) -> PolicyError:
        return PolicyError(self.file, self.path, message)


def shown(value: Any) -> str:
    """A value as YAML would spell it, for "got ..." in messages."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def mapping(
    value: Any, where: Where, *, required: Collection[str], optional: Collection[str]
) -> dict[str, Any]:
    """A mapping with string keys, all of them known and every required one present."""
    if not isinstance(value, Mapping):
        raise where.error(f"expected a mapping, got {shown(value)}")
    known = [*required, *optional]
    for key in value:
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            also = f"; did you mean '{hint[0]}'?" if hint else f"; known fields: {', '.join(known)}"
            raise where.key(str(key)).error("unknown field" + also)
    for key in required:
        if key not in value:
            raise where.key(key).error("missing required field")
    return dict(value)


def positive_int_or_none(value: Any, where: Where) -> int | None:
    """A positive integer, or null for "no limit". Booleans and floats are not integers here."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise where.error(f"expected a positive integer (or null for no limit), got {shown(value)}")
    return value


def boolean(value: Any, where: Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"expected true or false, got {shown(value)}")
    return value


def choice(value: Any, where: Where, options: Collection[str]) -> str:
    if value not in options:
        raise where.error(f"expected one of {', '.join(options)}, got {shown(value)}")
    return str(value)


def string(value: Any, where: Where) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"expected a non-empty string, got {shown(value)}")
    return value


def string_list(value: Any, where: Where) -> list[str]:
    if not isinstance(value, list):
        raise where.error(f"expected a list of strings, got {shown(value)}")
    return [string(item, where.index(i)) for i, item in enumerate(value)]

"""Config validation messages that lead with the offending field, the way operators scan for it."""

from __future__ import annotations

import re


def field_first(message: str, *, root: str = "$") -> str:
    """msgspec says 'Expected `int`, got `str` - at `$.listen.port`'; lead with the field instead.

    `root` is where the validated section sits in its file (`$.providers` for a nested section);
    a message naming no field is put under `root`, or left as it is for the whole document."""
    match = re.search(r" - at `\$([^`]*)`$", message)
    if match:
        return f"{root}{match.group(1)}: {message[: match.start()]}"
    missing = re.search(r"missing required field `([^`]+)`", message)
    if missing:
        return f"{root}.{missing.group(1)}: required field is missing"
    return message if root == "$" else f"{root}: {message}"

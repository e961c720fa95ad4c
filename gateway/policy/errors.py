"""The policy package's one exception: a policy that cannot be used, and exactly where it is wrong."""

from __future__ import annotations

from dataclasses import dataclass


class PolicyError(Exception):
    """An invalid policy: `file` (as given, e.g. policies/eu.yaml), `field` (a path such as
    tenants[0].limits.tokens_per_minute; "" for the file as a whole) and what is wrong."""

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file = file
        self.field = field
        self.message = message
        super().__init__(f"{file}: {field}: {message}" if field else f"{file}: {message}")


@dataclass(frozen=True)
class Where:
    """A position in a policy file: the file and a field path such as tenants[0], for errors that
    span tenants (a duplicate id or key across files)."""

    file: str
    path: str = ""

    def key(self, name: str) -> Where:
        return Where(self.file, f"{self.path}.{name}" if self.path else name)

    def error(self, message: str) -> PolicyError:
        return PolicyError(self.file, self.path, message)

"""Reading policy files from disk: one file, or every *.yaml/*.yml in a directory."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.policy.errors import PolicyError
from gateway.policy.policy_set import PolicySet, as_extra
from gateway.policy.schema import ParsedTenant, parse_document
from router.types import TenantPolicy

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class PolicySource:
    """The raw bytes of every policy file in a directory, and a digest of them all."""

    files: tuple[tuple[str, bytes], ...]  # (path as shown in errors, content), sorted by name
    digest: str


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a directory in name order; hidden files (editor temporaries) skipped."""
    if not directory.is_dir():
        raise PolicyError(str(directory), "", "policy directory does not exist")
    return sorted(
        p for p in directory.iterdir() if p.suffix in SUFFIXES and not p.name.startswith(".") and p.is_file()
    )


def read_source(directory: Path) -> PolicySource:
    files = tuple((str(p), p.read_bytes()) for p in policy_files(directory))
    digest = hashlib.sha256()
    for name, content in files:
        # Length-prefix each part so moving bytes between files changes the digest.
        for part in (name.encode(), content):
            digest.update(len(part).to_bytes(8, "big") + part)
    return PolicySource(files, digest.hexdigest())


def parse_file(name: str, content: bytes) -> list[ParsedTenant]:
    try:
        document = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(name, "", f"invalid YAML{where}: {problem}") from None
    return parse_document(document, name)


def build_policy_set(source: PolicySource, extra: Sequence[TenantPolicy] = ()) -> PolicySet:
    parsed = [entry for name, content in source.files for entry in parse_file(name, content)]
    return _build(parsed, extra)


def _build(parsed: list[ParsedTenant], extra: Sequence[TenantPolicy] = ()) -> PolicySet:
    safety = {tenant.tenant_id: policy for tenant, _, policy in parsed if policy is not None}
    tenants = [(tenant, where) for tenant, where, _ in parsed]
    return PolicySet.build([*tenants, *as_extra(extra)], safety=safety)


def load_policy_file(path: str | Path) -> PolicySet:
    path = Path(path)
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise PolicyError(str(path), "", f"cannot read: {exc.strerror}") from None
    return _build(parse_file(str(path), content))


def load_policy_dir(path: str | Path, *, extra: Sequence[TenantPolicy] = ()) -> PolicySet:
    """Every tenant in every policy file under `path`, plus `extra`; PolicyError on any problem."""
    return build_policy_set(read_source(Path(path)), extra)

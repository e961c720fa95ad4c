"""Real gateways for the safety tests: policies written as YAML files (as operators write them),
the keyword classifier made here, an audit file to read back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.policy import hash_api_key


def write_policies(
    directory: Path, tenants: dict[str, tuple[str, dict[str, Any] | None]], **extra: Any
) -> Path:
    """One file with a tenant per (id → (key, safety section or None)); `extra` adds fields to all."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for tenant_id, (key, safety) in tenants.items():
        entry: dict[str, Any] = {"id": tenant_id, "api_keys": [hash_api_key(key)], **extra}
        if safety is not None:
            entry["safety"] = safety
        entries.append(entry)
    path = directory / "tenants.yaml"
    tmp = directory / ".tenants.yaml.tmp"  # written whole, then renamed: a reload never sees half
    tmp.write_text(yaml.safe_dump({"tenants": entries}, allow_unicode=True), encoding="utf-8")
    tmp.rename(path)
    return directory


def audit_lines(
    path: Path, request_id: str, *, at_least: int = 1, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """The audit records of one request, once the writer has put at least `at_least` on disk."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = []
        if path.exists():
            text = path.read_text(encoding="utf-8")
            # The writer may be mid-line: only whole (newline-ended) lines are records yet.
            whole = text[: text.rfind("\n") + 1]
            records = [json.loads(line) for line in whole.splitlines() if line]
        mine = [r for r in records if r["request_id"] == request_id]
        if len(mine) >= at_least or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready"
        time.sleep(0.05)


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON payloads of a `data:` stream (OpenAI's or Anthropic's), in order; [DONE] skipped."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


def streamed_text(events: list[dict[str, Any]]) -> str:
    parts = []
    for event in events:
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            parts.append(delta.get("content") or choice.get("text") or "")
        delta = event.get("delta") or {}
        if event.get("type") == "content_block_delta":
            parts.append(delta.get("text") or "")
    return "".join(parts)

"""What the batch store holds, as the API and the runner read it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from protocol.objects import BatchStatus

# A line is pending until it has its answer (or its error) for the output files.
LineStatus = Literal["pending", "completed", "failed"]
RUNNABLE: tuple[str, ...] = ("validating", "in_progress")
TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)

# A lone surrogate: JSON's "\ud800" escape decodes to one, and no UTF-8 database can hold it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> bool:
    """Whether every store can hold `text` as it is: PostgreSQL's text cannot hold NUL, and no
    store a lone surrogate. No id the gateway made fails this, so an id that does names nothing;
    a name the client gives that does (a filename, a custom_id) is refused by name."""
    return "\x00" not in text and _LONE_SURROGATE.search(text) is None


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant_id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int


@dataclass(frozen=True)
class LineUsage:
    """Tokens of one answered line (or, summed, of a batch), as the Batch object's `usage` reports."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass
class BatchRecord:
    id: str
    tenant_id: str
    api_key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    callback_url: str | None
    status: BatchStatus
    created_at: int
    expires_at: int
    times: dict[str, int | None] = field(default_factory=dict)  # TIMESTAMPS that are set
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    # Why a batch `failed` (OpenAI's `errors.data` items); None for every other status.
    errors: list[dict[str, Any]] | None = None
    usage: LineUsage = field(default_factory=lambda: LineUsage(0, 0, 0))  # summed over answered lines


@dataclass(frozen=True)
class ClaimedLine:
    """A line this gateway holds the lease of, with what it needs to run it."""

    batch_id: str
    line_no: int
    custom_id: str
    url: str
    body: dict[str, Any]
    attempts: int
    tenant_id: str
    api_key_id: str


@dataclass(frozen=True)
class LineResult:
    batch_id: str
    line_no: int
    custom_id: str
    status: LineStatus
    result: dict[str, Any] | None  # the output line's `response` (or `error`) as the runner wrote it

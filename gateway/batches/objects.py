"""The Files and Batches APIs' objects, shaped as OpenAI's (openai.types.FileObject, Batch)."""

from __future__ import annotations

from typing import Any

from gateway.batches.records import TIMESTAMPS, BatchRecord, FileRecord

# The most files on a page of `GET /v1/files`, and the default: OpenAI's.
FILES_PAGE_LIMIT = 10_000


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(batch: BatchRecord) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": batch.created_at,
        "expires_at": batch.expires_at,
        **{name: batch.times.get(name) for name in TIMESTAMPS},
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "metadata": batch.metadata,
        "usage": {
            "input_tokens": batch.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": batch.usage.cached_tokens},
            "output_tokens": batch.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": batch.usage.prompt_tokens + batch.usage.completion_tokens,
        },
    }

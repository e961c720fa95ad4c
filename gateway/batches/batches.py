"""`Batches`: what the Files and Batches APIs do (upload, create, cancel, read), the store and
file storage they share with the runner, and the runner's task."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from gateway.batches.config import BatchesConfig
from gateway.batches.errors import (
    BatchInputError,
    BatchNotCancellable,
    BatchNotFound,
    FileTooLarge,
    batch_error,
)
from gateway.batches.input import ENDPOINTS, InputLine, parse_input
from gateway.batches.objects import FILES_PAGE_LIMIT
from gateway.batches.records import BatchRecord, FileRecord, storable
from gateway.batches.runner import BatchRunner
from gateway.batches.storage import FileStorage, LocalFileStorage
from gateway.batches.store import BatchStore, SqliteBatchStore
from gateway.call.pipeline import RequestPipeline
from gateway.ledger.build import postgres_dsn
from gateway.ledger.config import SqliteStoreConfig, StoreConfig
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicyStore
from gateway.runtime.tasks import cancel_and_wait
from protocol.objects import CALLBACK_URL_PATTERN, METADATA_KEY_LEN, METADATA_KEYS, METADATA_VALUE_LEN

logger = logging.getLogger(__name__)

COMPLETION_WINDOWS = {"24h": 24 * 3600}


class Batches:
    def __init__(
        self, config: BatchesConfig, store: BatchStore, storage: FileStorage, runner: BatchRunner
    ) -> None:
        self.config = config
        self.store = store
        self.storage = storage
        self.runner = runner
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            await self.store.start()
        except Exception as exc:  # the runner retries; the API answers 503 meanwhile
            logger.warning("batch store not reachable at start-up (will retry): %s", exc)
        self._task = asyncio.create_task(self.runner.run(), name="batch-runner")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self.runner.stop()
        await self.store.close()

    # -- files ------------------------------------------------------------------------------------

    async def upload(self, tenant_id: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        if purpose != "batch":
            raise BatchInputError(
                f"purpose {purpose!r} is not supported; only 'batch' files can be uploaded.",
                param="purpose",
                code="invalid_purpose",
            )
        if len(data) > self.config.max_file_bytes:
            raise FileTooLarge(len(data), self.config.max_file_bytes)
        if not storable(filename):
            raise BatchInputError("The file's name must not hold NUL or unpaired surrogates.", param="file")
        # Any content is taken, as OpenAI's Files API does: a batch created from the file reads it,
        # and a fault in it fails that batch with the line named in the batch's `errors`.
        record = FileRecord(
            "file-" + os.urandom(12).hex(), tenant_id, filename, purpose, len(data), int(time.time())
        )
        await self.storage.put(record.id, data)
        await self.store.add_file(record)
        return record

    async def file(self, file_id: str, tenant_id: str) -> FileRecord:
        record = await self.store.get_file(file_id, tenant_id) if storable(file_id) else None
        if record is None:
            raise BatchNotFound("file", file_id)
        return record

    async def content(self, file_id: str, tenant_id: str) -> bytes:
        await self.file(file_id, tenant_id)
        try:
            return await self.storage.get(file_id)
        except FileNotFoundError:
            raise BatchNotFound("file", file_id) from None

    async def file_page(
        self, tenant_id: str, *, purpose: str | None, limit: int, order: str, after: str | None
    ) -> tuple[list[FileRecord], bool]:
        """A page of the tenant's files by `created_at` (`order` asc or desc), and whether more follow."""
        if not 1 <= limit <= FILES_PAGE_LIMIT:
            raise BatchInputError(f"limit must be between 1 and {FILES_PAGE_LIMIT}.", param="limit")
        if order not in ("asc", "desc"):
            raise BatchInputError("order must be 'asc' or 'desc'.", param="order")
        if not all(storable(text) for text in (purpose or "", after or "")):
            return [], False  # no file has that purpose, or that id
        rows = await self.store.list_files(
            tenant_id, purpose=purpose, limit=limit + 1, newest_first=order == "desc", after=after
        )
        return rows[:limit], len(rows) > limit

    async def delete_file(self, file_id: str, tenant_id: str) -> None:
        if not storable(file_id) or not await self.store.delete_file(file_id, tenant_id):
            raise BatchNotFound("file", file_id)
        await self.storage.delete(file_id)

    # -- batches ----------------------------------------------------------------------------------

    async def create(
        self,
        tenant_id: str,
        api_key_id: str,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        callback_url: str | None,
    ) -> BatchRecord:
        if endpoint not in ENDPOINTS:
            raise BatchInputError(
                f"endpoint {endpoint!r} is not supported; use one of {sorted(ENDPOINTS)}.", param="endpoint"
            )
        if completion_window not in COMPLETION_WINDOWS:
            raise BatchInputError(
                f"completion_window {completion_window!r} is not supported; use '24h'.",
                param="completion_window",
            )
        _check_metadata(metadata)
        if callback_url is not None:
            callback_url = checked_callback_url(callback_url)
        record = await self.file(input_file_id, tenant_id)
        if record.purpose != "batch":
            raise BatchInputError(f"File '{input_file_id}' is not a batch input file.", param="input_file_id")
        data = await self.content(input_file_id, tenant_id)
        now = int(time.time())
        batch = BatchRecord(
            id="batch_" + os.urandom(12).hex(),
            tenant_id=tenant_id,
            api_key_id=api_key_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            metadata=metadata,
            callback_url=callback_url,
            status="validating",
            created_at=now,
            expires_at=now + COMPLETION_WINDOWS[completion_window],
        )
        try:
            lines = self._read_input(data, endpoint)
        except BatchInputError as exc:
            # The batch is created and has failed in validation, as OpenAI's does: the caller's
            # request was valid, the file it names is not (stored ended, with no lines).
            batch.status, batch.times["failed_at"], batch.errors = "failed", now, [exc.batch_error()]
            await self.store.add_batch(batch, (), enqueued_limit=self.config.max_enqueued_lines)
            self.runner.wake()  # an ended batch's callback is due
            return batch
        batch.total = len(lines)
        limit = self.config.max_enqueued_lines
        batch.errors = [
            batch_error(
                "enqueued_limit_exceeded",
                f"This batch's {len(lines)} requests, with those already waiting in your running "
                f"batches, pass the limit of {limit} enqueued requests. Wait for running batches to finish, "
                "or split the file.",
            )
        ]
        if await self.store.add_batch(batch, lines, enqueued_limit=limit):
            batch.errors = None
        else:
            batch.status, batch.times["failed_at"] = "failed", now
        self.runner.wake()  # lines to run, or an ended batch's callback due
        return batch

    def _read_input(self, data: bytes, endpoint: str) -> list[InputLine]:
        """The file's lines, each for the batch's `endpoint` (BatchInputError names a fault)."""
        lines = parse_input(data, max_lines=self.config.max_lines)
        for line in lines:
            if line.url != endpoint:
                raise BatchInputError(
                    f"Line {line.line_no}: url {line.url!r} does not match the batch's endpoint {endpoint!r}.",
                    param="endpoint",
                    code="mismatched_endpoint",
                    line=line.line_no,
                )
        return lines

    async def batch(self, batch_id: str, tenant_id: str) -> BatchRecord:
        record = await self.store.get_batch(batch_id, tenant_id) if storable(batch_id) else None
        if record is None:
            raise BatchNotFound("batch", batch_id)
        return record

    async def cancel(self, batch_id: str, tenant_id: str) -> BatchRecord:
        batch = await self.batch(batch_id, tenant_id)
        if batch.status not in ("cancelling", "cancelled"):
            if not await self.store.cancel(batch_id, tenant_id, int(time.time())):
                raise BatchNotCancellable(batch_id, batch.status)
            self.runner.wake()
        return await self.batch(batch_id, tenant_id)

    async def page(self, tenant_id: str, *, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        if not 1 <= limit <= 100:
            raise BatchInputError("limit must be between 1 and 100.", param="limit")
        if after is not None and not storable(after):
            return [], False  # no batch has that id
        rows = await self.store.list_batches(tenant_id, limit=limit + 1, after=after)
        return rows[:limit], len(rows) > limit


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise BatchInputError(f"metadata may have at most {METADATA_KEYS} keys.", param="metadata")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > METADATA_KEY_LEN or len(value) > METADATA_VALUE_LEN:
            raise BatchInputError(
                f"metadata[{key!r}]: keys are at most {METADATA_KEY_LEN} characters, values strings of at most "
                f"{METADATA_VALUE_LEN}.",
                param="metadata",
            )


def checked_callback_url(url: str) -> str:
    """`url` if it matches the document's pattern, as Python's `re` reads it: as JSON Schema tools
    written in Python do, which let a trailing newline through `$` (it is dropped here)."""
    if re.search(CALLBACK_URL_PATTERN, url) is None:
        raise BatchInputError(
            "callback_url must be an http(s) URL with an ASCII host name (xn-- form) or IPv4 "
            "address, a port up to 65535, in printable ASCII.",
            param="callback_url",
        )
    return url.removesuffix("\n")


def build_batches(
    config: BatchesConfig,
    database: StoreConfig,
    env: Mapping[str, str],
    pipeline: RequestPipeline,
    policies: PolicyStore,
    metrics: GatewayMetrics,
) -> Batches:
    """`database`: the ledger's store config; the batch tables sit beside the ledger's own."""
    store: BatchStore
    if isinstance(database, SqliteStoreConfig):
        store = SqliteBatchStore(Path(database.path))
    else:
        from gateway.batches.store.postgres import PostgresBatchStore  # psycopg only when used

        store = PostgresBatchStore(
            postgres_dsn(database, env), pool_size=database.pool_size, timeout_s=database.timeout_s
        )
    storage = LocalFileStorage(config.storage_dir)
    return Batches(config, store, storage, BatchRunner(config, store, storage, pipeline, policies, metrics))

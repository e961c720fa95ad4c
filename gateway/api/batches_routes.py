"""Files and Batches front door (OpenAI-compatible): `/v1/files` and `/v1/batches`.

Thin: authenticate, parse, call `Batches` (gateway/batches/), shape the object. Every id is the
caller's tenant's or a 404; errors are mapped once, in errors.py.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar._multipart import parse_multipart_form
from litestar.datastructures import UploadFile
from litestar.di import Provide
from litestar.params import Dependency
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.body import request_body
from gateway.api.doors import DEPENDENCIES, Call, Tenant, every_method_in_allow, openai_errors
from gateway.api.paging import cursor_page, page_query
from gateway.batches import BatchInputError
from gateway.batches.batches import Batches
from gateway.batches.objects import FILES_PAGE_LIMIT, batch_object, file_object
from protocol.errors import NotFoundError
from protocol.openai import decode_json_object


class _CreateBatch(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    callback_url: str | None = None


async def _enabled(batches: Batches | None, tenant: Tenant) -> Batches:
    """The doors' `service` dependency: the gateway's Files and Batches, or a 404 where they are
    off. It names `tenant`, so a caller without a valid key gets its 401 first."""
    if batches is None:
        raise NotFoundError("The Files and Batches APIs are not enabled on this gateway.", code="not_enabled")
    return batches


# Handlers name it with this type: the value is ours, so Litestar is told not to convert it.
Service = Annotated[Batches, Dependency(skip_validation=True)]
_DEPENDENCIES = {**DEPENDENCIES, "service": Provide(_enabled)}


async def _one_chunk(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data


def _all(fields: dict[str, Any], name: str) -> list[Any]:
    """The parser gives a field sent once as its value, one sent more often as a list."""
    value = fields.get(name)
    return [] if value is None else value if isinstance(value, list) else [value]


async def _upload_form(request: Request[Any, Any, Any]) -> tuple[str, str, bytes]:
    """(filename, purpose, content) of a multipart upload, read within the server's body limits."""
    kind, _, params = request.headers.get("content-type", "").partition(";")
    boundary = next(
        (
            v.strip().strip('"')
            for k, _, v in (p.strip().partition("=") for p in params.split(";"))
            if k == "boundary"
        ),
        None,
    )
    if kind.strip().lower() != "multipart/form-data" or not boundary:
        raise BatchInputError(
            "Upload the file as multipart/form-data (fields `file` and `purpose`).", param="file"
        )
    fields = await parse_multipart_form(_one_chunk(await request_body(request)), boundary.encode())
    files = [f for f in _all(fields, "file") if isinstance(f, UploadFile)]
    purposes = [p for p in _all(fields, "purpose") if isinstance(p, str)]
    if len(files) != 1:
        raise BatchInputError("The form needs exactly one `file` field holding a file.", param="file")
    if len(purposes) != 1:
        raise BatchInputError("The form needs a `purpose` field.", param="purpose")
    try:
        return files[0].filename or "upload.jsonl", purposes[0], await files[0].read()
    finally:
        await files[0].close()


class FilesController(Controller):
    path = "/v1/files"
    dependencies = _DEPENDENCIES
    exception_handlers = {Exception: openai_errors}
    before_request = every_method_in_allow

    @post("/", status_code=200)
    async def upload(
        self, request: Request[Any, Any, Any], call: Call, tenant: Tenant, service: Service
    ) -> ASGIApp:
        filename, purpose, data = await _upload_form(request)
        uploaded = await service.upload(tenant.tenant_id, filename, purpose, data)
        return Answer.json(file_object(uploaded), call.headers)

    @get("/")
    async def page(
        self, request: Request[Any, Any, Any], call: Call, tenant: Tenant, service: Service
    ) -> ASGIApp:
        query = request.query_params
        wanted = page_query(query, max_limit=FILES_PAGE_LIMIT, default_limit=FILES_PAGE_LIMIT, ordered=True)
        rows, more = await service.file_page(
            tenant.tenant_id,
            purpose=query.get("purpose") or None,
            limit=wanted.limit,
            order=wanted.order,
            after=wanted.after,
        )
        return Answer.json(cursor_page([file_object(f) for f in rows], has_more=more), call.headers)

    @get("/{file_id:str}")
    async def retrieve(self, file_id: str, call: Call, tenant: Tenant, service: Service) -> ASGIApp:
        return Answer.json(file_object(await service.file(file_id, tenant.tenant_id)), call.headers)

    @get("/{file_id:str}/content")
    async def content(self, file_id: str, call: Call, tenant: Tenant, service: Service) -> ASGIApp:
        data = await service.content(file_id, tenant.tenant_id)
        return Answer(data, call.headers, media_type="application/jsonl")

    @delete("/{file_id:str}", status_code=200)
    async def remove(self, file_id: str, call: Call, tenant: Tenant, service: Service) -> ASGIApp:
        await service.delete_file(file_id, tenant.tenant_id)
        return Answer.json({"id": file_id, "object": "file", "deleted": True}, call.headers)


class BatchesController(Controller):
    path = "/v1/batches"
    dependencies = _DEPENDENCIES
    exception_handlers = {Exception: openai_errors}
    before_request = every_method_in_allow

    @post("/", status_code=200)
    async def create(
        self, request: Request[Any, Any, Any], call: Call, tenant: Tenant, service: Service
    ) -> ASGIApp:
        try:
            wanted = msgspec.convert(decode_json_object(await request_body(request)), _CreateBatch)
        except msgspec.ValidationError as exc:  # it names the field
            raise BatchInputError(f"Invalid batch request: {exc}") from None
        batch = await service.create(
            tenant.tenant_id,
            call.api_key_id,
            input_file_id=wanted.input_file_id,
            endpoint=wanted.endpoint,
            completion_window=wanted.completion_window,
            metadata=wanted.metadata,
            callback_url=wanted.callback_url,
        )
        return Answer.json(batch_object(batch), call.headers)

    @get("/")
    async def page(
        self, request: Request[Any, Any, Any], call: Call, tenant: Tenant, service: Service
    ) -> ASGIApp:
        wanted = page_query(request.query_params, max_limit=100, default_limit=20, ordered=False)
        rows, more = await service.page(tenant.tenant_id, limit=wanted.limit, after=wanted.after)
        return Answer.json(cursor_page([batch_object(b) for b in rows], has_more=more), call.headers)

    @get("/{batch_id:str}")
    async def retrieve(self, batch_id: str, call: Call, tenant: Tenant, service: Service) -> ASGIApp:
        return Answer.json(batch_object(await service.batch(batch_id, tenant.tenant_id)), call.headers)

    @post("/{batch_id:str}/cancel", status_code=200)
    async def cancel(self, batch_id: str, call: Call, tenant: Tenant, service: Service) -> ASGIApp:
        return Answer.json(batch_object(await service.cancel(batch_id, tenant.tenant_id)), call.headers)

"""Every front door answers in its own error format, even for requests refused before any handler
runs: a header the HTTP parser rejects (a NUL byte in Authorization), a path with no route, a
missing key. /v1/messages answers in Anthropic's `{"type": "error", ...}`, the others in OpenAI's."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import GLOBAL_KEY, RunningGateway, gateway_config, run_gateway

BODY = b'{"model":"meridian-small","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    work: Path = tmp_path_factory.mktemp("doors")
    (work / "regions.yaml").write_text("nodes: []\n")
    with run_gateway(gateway_config(work / "regions.yaml")) as running:
        yield running


def _raw(gw: RunningGateway, path: str, authorization: bytes) -> tuple[int, dict[str, object]]:
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\nauthorization: " + authorization
            + b"\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
        )  # fmt: skip
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def _anthropic(body: dict[str, object]) -> bool:
    return body.get("type") == "error" and isinstance(body.get("error"), dict) and "type" in body["error"]  # type: ignore[operator]


def _openai(body: dict[str, object]) -> bool:
    return isinstance(body.get("error"), dict) and "message" in body["error"] and "type" not in body  # type: ignore[operator]


@pytest.mark.parametrize("authorization", [b"Bearer sk\x00secret", b"Bearer wrong-key", b"Basic x"])
@pytest.mark.parametrize(
    ("path", "anthropic"),
    [
        ("/v1/messages", True),
        ("/v1/messages/no-such", True),
        ("/v1/chat/completions", False),
        ("/v1/responses", False),
        ("/v1/no-such", False),
    ],
)
def test_each_door_refuses_in_its_own_format(
    gw: RunningGateway, path: str, anthropic: bool, authorization: bytes
) -> None:
    status, body = _raw(gw, path, authorization)
    assert status in (400, 401, 404, 405), (status, body)
    assert (_anthropic if anthropic else _openai)(body), body


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [("/v1/embeddings", False), ("/v1/chat/completion", False), ("/v1/messages/x", True)],
)
def test_a_path_with_no_endpoint_is_a_404_that_names_it(
    gw: RunningGateway, path: str, anthropic: bool
) -> None:
    """A typo'd or unserved endpoint says which URL it was, as OpenAI's "Invalid URL (POST ...)"
    does, not a bare "Not Found" a client could take for a missing model."""
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    response = httpx.post(gw.url + path, content=BODY, headers=headers, timeout=10)
    assert response.status_code == 404, response.text
    body = response.json()
    assert (_anthropic if anthropic else _openai)(body), body
    assert f"Invalid URL (POST {path})" in body["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "allowed", "anthropic"),
    [
        ("TRACE", "/v1/chat/completions", {"POST"}, False),
        ("GET", "/v1/completions", {"POST"}, False),
        ("PUT", "/v1/files/file-x", {"GET", "DELETE"}, False),
        ("DELETE", "/v1/messages", {"POST"}, True),
    ],
)
def test_a_method_a_path_does_not_serve_is_a_405_that_lists_the_methods_it_does(
    gw: RunningGateway, method: str, path: str, allowed: set[str], anthropic: bool
) -> None:
    """RFC 9110: a 405 carries `Allow`, so a client (or a tool reading the OpenAPI document) can
    tell a wrong method from a wrong path."""
    response = httpx.request(method, gw.url + path, headers={"authorization": "Bearer x"}, timeout=10)

    assert response.status_code == 405, response.text
    methods = {m.strip() for m in response.headers["allow"].split(",")}
    assert allowed <= methods and method not in methods
    assert (_anthropic if anthropic else _openai)(response.json()), response.text


def test_options_lists_exactly_the_methods_each_documented_path_serves(gw: RunningGateway) -> None:
    """Every path of the OpenAPI document, the ones served by several handlers included."""
    document = httpx.get(gw.url + "/openapi.json", timeout=10).json()
    for template, operations in document["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x-id", template)
        response = httpx.options(gw.url + path, timeout=10)
        assert response.status_code == 204, (path, response.text)
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed == {m.upper() for m in operations} | {"OPTIONS"}, path


def test_files_and_batches_switched_off_are_a_404_after_the_key_is_checked(tmp_path: Path) -> None:
    (tmp_path / "regions.yaml").write_text("nodes: []\n")
    config = gateway_config(tmp_path / "regions.yaml", batches={"enabled": False})
    with run_gateway(config) as off:
        for method, path in [
            ("GET", "/v1/batches"),
            ("POST", "/v1/files"),
            ("GET", "/v1/files/file-x/content"),
        ]:
            keyed = httpx.request(method, off.url + path, headers={"authorization": f"Bearer {GLOBAL_KEY}"})
            assert keyed.status_code == 404, keyed.text
            assert keyed.json()["error"]["code"] == "not_enabled"
            unkeyed = httpx.request(method, off.url + path)
            assert unkeyed.status_code == 401, unkeyed.text

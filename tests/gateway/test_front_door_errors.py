"""Every front door answers in its own error format, even for requests refused before any handler
runs: a header the HTTP parser rejects (a NUL byte in Authorization), a path with no route, a
missing key. /v1/messages answers in Anthropic's `{"type": "error", ...}`, the others in OpenAI's."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import RunningGateway, gateway_config, run_gateway

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

"""Hostile input against a real gateway and the real node behind it: never a 5xx, never a stack
trace, always a well-formed error in the endpoint's own format, nothing left held afterwards.

The fixed cases are the ones an outside tester found (invalid UTF-8, deep nesting, an 11 MB body,
a client leaving mid-upload, slowloris); the fuzz tests (hypothesis, bounded in count) cover JSON
shapes, depths, sizes, types, encodings and headers on every public endpoint of both servers.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import (
    AUTH,
    GLOBAL_KEY,
    SMALL_KEY,
    NodeProcess,
    RunningGateway,
    gateway_config,
    run_gateway,
    running_fleet,
    write_regions,
)

# Every door that reads a JSON body (the Files upload is multipart: tests/gateway/test_batches_api.py).
ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/batches",
)
NODE_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize")
TIMEOUT = httpx.Timeout(30.0)
# Short read timeouts so the slow-client cases run quickly; the defaults are documented in
# http_server/limits.py.
SERVER = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_connections": 256}


@pytest.fixture(scope="module")
def node(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    models = {"meridian-small": (llama_checkpoint, "small"), "meridian-large": (qwen2_checkpoint, "large")}
    logs = tmp_path_factory.mktemp("node-logs")
    with running_fleet([("eu-west-1", "eu-west", "eu")], models, logs) as fleet:
        yield fleet[0]


@pytest.fixture(scope="module")
def gw(node: NodeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    regions = write_regions(tmp_path_factory.mktemp("gw") / "regions.yaml", [node])
    with run_gateway(gateway_config(regions, server=SERVER)) as running:
        yield running


def valid(endpoint: str) -> dict[str, Any]:
    """A body the door serves (a batch: one it refuses only for naming no file, a 404)."""
    if endpoint == "/v1/completions":
        return {"model": "meridian-small", "prompt": "Hello", "max_tokens": 4}
    if endpoint.startswith("/v1/responses"):
        return {"model": "meridian-small", "input": "Hello", "max_output_tokens": 4}
    if endpoint == "/v1/batches":
        return {"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    return {"model": "meridian-small", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def with_field(endpoint: str, raw_value: bytes) -> bytes:
    """A valid body plus `"x": <raw_value>`, spliced in as bytes (so the value may be anything)."""
    return json.dumps(valid(endpoint)).encode()[:-1] + b', "x": ' + raw_value + b"}"


def assert_error_body(endpoint: str, response: httpx.Response) -> dict[str, Any]:
    """The error in the endpoint's own format, well formed; returns its inner object."""
    body = response.json()
    if endpoint.startswith("/v1/messages"):
        assert body["type"] == "error", body
        error = body["error"]
        assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["message"]
        return error
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"]
    return error


def post(gw: RunningGateway, endpoint: str, content: bytes, **headers: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {GLOBAL_KEY}", "content-type": "application/json", **headers}
    return httpx.post(gw.url + endpoint, content=content, headers=headers, timeout=TIMEOUT)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def five_hundreds(gw: RunningGateway) -> float:
    return sum(
        sample.value
        for metric in gw.gateway.metrics.registry.collect()
        if metric.name == "meridian_gateway_requests"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("status", "").startswith("5")
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(
    "raw",
    [b'"\xff\xfe"', b'"truncated \xe2\x98"'],
    ids=["invalid-start-bytes", "truncated-sequence"],
)
def test_invalid_utf8_is_a_400(gw: RunningGateway, endpoint: str, raw: bytes) -> None:
    response = post(gw, endpoint, with_field(endpoint, raw))
    assert response.status_code == 400
    assert "UTF-8" in assert_error_body(endpoint, response)["message"]


def test_invalid_utf8_inside_the_model_name_is_a_400(gw: RunningGateway) -> None:
    body = b'{"model": "meridian-sm\xe2\x98", "messages": [{"role": "user", "content": "hi"}]}'
    response = post(gw, "/v1/chat/completions", body)
    assert response.status_code == 400 and assert_error_body("/v1/chat/completions", response)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_deep_nesting_is_a_400(gw: RunningGateway, endpoint: str) -> None:
    response = post(gw, endpoint, with_field(endpoint, b"[" * 1000 + b"]" * 1000))
    assert response.status_code == 400
    assert "levels deep" in assert_error_body(endpoint, response)["message"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_11_mb_body_is_a_413(gw: RunningGateway, endpoint: str) -> None:
    huge = with_field(endpoint, json.dumps("a" * 11_000_000).encode())
    response = post(gw, endpoint, huge)
    assert response.status_code == 413
    assert "limit" in assert_error_body(endpoint, response)["message"]


def test_a_chunked_body_over_the_limit_is_a_413(gw: RunningGateway) -> None:
    def pieces() -> Iterator[bytes]:
        yield b'{"model": "meridian-small", "x": "'
        for _ in range(12):
            yield b"a" * 1_000_000
        yield b'"}'

    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    response = httpx.post(gw.url + "/v1/completions", content=pieces(), headers=headers, timeout=TIMEOUT)
    assert response.status_code == 413 and assert_error_body("/v1/completions", response)


def door(gw: RunningGateway, node: NodeProcess, server: str, endpoint: str) -> tuple[str, dict[str, str]]:
    """(url, auth headers) of `endpoint` on the gateway or the node."""
    if server == "node":
        return node.url + endpoint, AUTH
    return gw.url + endpoint, {"authorization": f"Bearer {GLOBAL_KEY}"}


DOORS = [("gateway", endpoint) for endpoint in ENDPOINTS] + [("node", "/v1/chat/completions")]


@pytest.mark.parametrize(("server", "endpoint"), DOORS)
def test_a_gzip_body_is_served_as_the_plain_one(
    gw: RunningGateway, node: NodeProcess, server: str, endpoint: str
) -> None:
    url, auth = door(gw, node, server, endpoint)
    plain = json.dumps(valid(endpoint)).encode()
    headers = {**auth, "content-type": "application/json"}
    expected = httpx.post(url, content=plain, headers=headers, timeout=TIMEOUT)
    coded = httpx.post(
        url, content=gzip.compress(plain), headers={**headers, "content-encoding": "gzip"}, timeout=TIMEOUT
    )
    assert coded.status_code == expected.status_code, coded.text
    assert expected.status_code in (200, 404)  # a batch naming no file: 404, either way


@pytest.mark.parametrize(("server", "endpoint"), DOORS)
def test_an_unknown_content_encoding_is_a_415_in_the_doors_format(
    gw: RunningGateway, node: NodeProcess, server: str, endpoint: str
) -> None:
    url, auth = door(gw, node, server, endpoint)
    headers = {**auth, "content-type": "application/json", "content-encoding": "br"}
    response = httpx.post(url, content=b"\x0b\x02\x80{}\x03", headers=headers, timeout=TIMEOUT)
    assert response.status_code == 415 and response.headers["accept-encoding"] == "gzip, deflate"
    assert "'br'" in assert_error_body(endpoint, response)["message"]


@pytest.mark.parametrize("server", ["gateway", "node"])
def test_a_gzip_bomb_is_a_413_not_an_inflated_body(
    gw: RunningGateway, node: NodeProcess, server: str
) -> None:
    url, auth = door(gw, node, server, "/v1/chat/completions")
    bomb = gzip.compress(with_field("/v1/chat/completions", b'"' + b"a" * 50_000_000 + b'"'))
    assert len(bomb) < 100_000
    headers = {**auth, "content-type": "application/json", "content-encoding": "gzip"}
    response = httpx.post(url, content=bomb, headers=headers, timeout=TIMEOUT)
    assert response.status_code == 413
    assert "decodes to more than" in assert_error_body("/v1/chat/completions", response)["message"]


@pytest.mark.parametrize("server", ["gateway", "node"])
def test_an_oversized_body_is_refused_by_its_declared_length_before_it_is_sent(
    gw: RunningGateway, node: NodeProcess, server: str
) -> None:
    url, key = (gw.url, GLOBAL_KEY) if server == "gateway" else (node.url, AUTH["authorization"][7:])
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: 11000000\r\n\r\n" % key.encode()
        )  # and not one byte of the body
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413")


def test_a_client_leaving_mid_upload_is_a_499_at_info(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    labels = {"tenant": "t-global", "model": "-", "region": "-", "status": "499"}
    before = gw.metric("meridian_gateway_requests_total", **labels)
    errors_before = five_hundreds(gw)
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", port_of(gw.url))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + GLOBAL_KEY.encode() + b'\r\ncontent-length: 5000\r\n\r\n{"model": '
        )
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while gw.metric("meridian_gateway_requests_total", **labels) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gw.metric("meridian_gateway_requests_total", **labels) == before + 1
    assert five_hundreds(gw) == errors_before
    gone = [r for r in caplog.records if "disconnected before sending" in r.getMessage()]
    assert gone and all(r.levelno == logging.INFO and r.exc_info is None for r in gone)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("gateway")]


def test_slow_clients_are_cut_off_by_the_read_timeouts(gw: RunningGateway) -> None:
    """The drill: slowloris connections (slow headers, slow bodies) and a request that declares
    500 bytes and sends 8. All are answered 408 and closed within the timeouts, bounded here."""
    port = port_of(gw.url)
    auth = b"authorization: Bearer " + GLOBAL_KEY.encode() + b"\r\n"
    starts = [b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"] * 10  # headers never finish
    starts += [
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n" + auth + b'content-length: 500\r\n\r\n{"model"'
    ] * 10
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in starts]
    started = time.monotonic()
    try:
        for sock, start in zip(sockets, starts, strict=True):
            sock.sendall(start)
        answers = []
        for sock in sockets:
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass
            answers.append(data)
    finally:
        for sock in sockets:
            sock.close()
    elapsed = time.monotonic() - started
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), answers
    # Closed by the server: header/body timeout (1 s) plus the 2 s linger at most, with slack.
    assert elapsed < 8


def test_a_body_that_is_not_json_is_a_400_without_a_traceback(gw: RunningGateway) -> None:
    response = post(gw, "/v1/chat/completions", b"\x00\x01\x02 not json")
    assert response.status_code == 400
    assert "Traceback" not in response.text


# -- fuzz -----------------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
small_int = st.integers(-3, 12)
messages = (
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "tool", "robot"]) | json_values},
            optional={
                "content": st.text(max_size=40)
                | st.lists(
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=20)}
                    ),
                    max_size=3,
                )
                | json_values
            },
        ),
        max_size=4,
    )
    | json_values
)
fields = {
    "model": st.sampled_from(["meridian-small", "meridian-large", "nope", ""]) | json_values,
    "max_tokens": small_int | json_values,
    "temperature": st.floats(-1, 3) | json_values,
    "top_p": st.floats(-1, 2) | json_values,
    "top_k": small_int | json_values,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=5) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "n": small_int | json_values,
    "seed": st.integers() | json_values,
    "logprobs": st.booleans() | small_int | json_values,
    "echo": st.booleans() | json_values,
    "return_token_ids": st.booleans() | json_values,
    "continuation_token_ids": st.lists(st.integers(-2, 70000), max_size=5) | json_values,
    "ignore_eos": st.booleans() | json_values,
    "user": json_values,
}
openai_bodies = st.fixed_dictionaries(
    {},
    optional={
        **fields,
        "messages": messages,
        "prompt": st.text(max_size=40) | st.lists(st.integers(-1, 70000), max_size=5) | json_values,
    },
)
responses_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": fields["model"],
        "input": st.text(max_size=30) | messages,
        "instructions": st.text(max_size=20) | json_values,
        "max_output_tokens": fields["max_tokens"],
        "temperature": fields["temperature"],
        "top_p": fields["top_p"],
        "stream": fields["stream"],
        "background": st.booleans() | json_values,
        "store": st.booleans() | json_values,
        "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3) | json_values,
        "text": st.fixed_dictionaries({"format": st.just({"type": "text"}) | json_values}) | json_values,
        "tools": st.just([]) | json_values,
    },
)
batch_bodies = st.fixed_dictionaries(
    {},
    optional={
        "input_file_id": st.text(max_size=12) | json_values,
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
        | json_values,
        "completion_window": st.sampled_from(["24h", "1h"]) | json_values,
        "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3) | json_values,
        "callback_url": st.sampled_from(["https://example.com/done", "ftp://x"]) | json_values,
    },
)
anthropic_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": fields["model"],
        "max_tokens": fields["max_tokens"],
        "messages": messages,
        "system": st.text(max_size=30) | json_values,
        "stop_sequences": st.lists(st.text(max_size=5), max_size=3) | json_values,
        "temperature": fields["temperature"],
        "top_k": fields["top_k"],
        "stream": fields["stream"],
        "metadata": json_values,
    },
)


@st.composite
def encoded(draw: st.DrawFn, endpoint: str) -> bytes:
    """A body as bytes: a valid request with fuzzed fields, fuzzed fields alone, JSON with bytes
    mutated (invalid UTF-8, truncation), deep nesting, another JSON type, or no JSON at all."""
    bodies = {
        "/v1/messages": anthropic_bodies,
        "/v1/messages/count_tokens": anthropic_bodies,
        "/v1/responses": responses_bodies,
        "/v1/responses/input_tokens": responses_bodies,
        "/v1/batches": batch_bodies,
    }.get(endpoint, openai_bodies)
    kind = draw(
        st.sampled_from(
            ["valid+", "valid+", "json", "mutated", "truncated", "nested", "other-json", "bytes", "big"]
        )
    )
    event(kind)
    if kind == "valid+":
        base = valid(endpoint)
        return json.dumps(
            {**base, **draw(bodies)} if draw(st.booleans()) else {**draw(bodies), **base}
        ).encode()
    if kind == "nested":
        depth = draw(st.integers(0, 3000))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        return b'{"model": "meridian-small", "x": ' + opener * depth + b"1" + closer * depth + b"}"
    if kind == "other-json":
        return json.dumps(draw(json_values)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    raw = json.dumps(draw(bodies), ensure_ascii=draw(st.booleans())).encode()
    if kind == "mutated":
        position = draw(st.integers(0, len(raw)))
        junk = draw(
            st.sampled_from([b"\xff", b"\xc0\xaf", b"\xe2\x98", b"\xed\xa0\x80", b"\x00", b"\\ud800"])
        )
        return raw[:position] + junk + raw[position:]
    if kind == "truncated":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    if kind == "big":
        return (
            raw[:-1] + b', "pad": "' + b"z" * draw(st.integers(0, 300_000)) + b'"}' if raw != b"{}" else raw
        )
    return raw


# Header values as httpx sends them: printable ASCII without surrounding whitespace.
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip)
request_headers = st.fixed_dictionaries(
    {},
    optional={
        "content-type": st.sampled_from(
            ["application/json", "text/plain", "application/json; charset=latin-1", ""]
        )
        | header_text,
        "x-meridian-client-region": header_text,
        "content-encoding": st.sampled_from(["gzip", "deflate", "br", "identity", "gzip, deflate", "GZIP"])
        | header_text,
        "accept": header_text,
        "x-request-id": header_text,
        "anthropic-version": header_text,
    },
)
# Mostly the right key, so most requests get past authentication to the body's checks.
keys = st.one_of(
    st.just(f"Bearer {SMALL_KEY}"),
    st.just(f"Bearer {SMALL_KEY}"),
    st.just(f"Bearer {SMALL_KEY}"),
    st.sampled_from(["Bearer nope", "", "Basic abc", "Bearer", f"bearer   {SMALL_KEY}"]) | header_text,
)


def coded(body: bytes, headers: dict[str, str], data: st.DataObject) -> bytes:
    """The body in the codings its Content-Encoding names, mostly (or sent as it is: a lie)."""
    if "content-encoding" in headers and data.draw(st.booleans(), label="coded as labelled"):
        for name in headers["content-encoding"].lower().split(","):
            if name.strip() in ("gzip", "deflate"):
                body = gzip.compress(body) if name.strip() == "gzip" else zlib.compress(body)
    return body


def check_response(endpoint: str, response: httpx.Response) -> None:
    event(f"status {response.status_code}")
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        assert_error_body(endpoint, response)
        return
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = response.text
        if endpoint == "/v1/messages":
            assert "event: message_stop" in text or "event: error" in text, text[-500:]
            assert '"api_error"' not in text or "overloaded" in text, text[-500:]
        elif endpoint == "/v1/responses":
            last = text.rstrip().rpartition("event: ")[2]
            assert last.startswith(("response.completed\n", "response.incomplete\n")), text[-500:]
        else:
            assert text.rstrip().endswith("data: [DONE]"), text[-500:]
            assert '"server_error"' not in text, text[-500:]
    else:
        assert isinstance(response.json(), dict)


FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@settings(FUZZ, max_examples=350)  # seven doors
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    data=st.data(),
    headers=request_headers,
    key=keys,
)
def test_fuzzed_requests_never_get_a_5xx_from_the_gateway(
    gw: RunningGateway, endpoint: str, data: st.DataObject, headers: dict[str, str], key: str
) -> None:
    body = coded(data.draw(encoded(endpoint)), headers, data)
    sent = {**headers, "authorization": key} if key else headers
    with httpx.Client(timeout=TIMEOUT) as client:
        response = client.post(gw.url + endpoint, content=body, headers=sent)
    check_response(endpoint, response)


@settings(FUZZ, max_examples=250)  # four doors
@given(endpoint=st.sampled_from(NODE_ENDPOINTS), data=st.data(), headers=request_headers)
def test_fuzzed_requests_never_get_a_5xx_from_the_node(
    node: NodeProcess, endpoint: str, data: st.DataObject, headers: dict[str, str]
) -> None:
    body = coded(data.draw(encoded(endpoint)), headers, data)
    with httpx.Client(timeout=TIMEOUT) as client:
        response = client.post(node.url + endpoint, content=body, headers={**headers, **AUTH})
    check_response(endpoint, response)


def test_nothing_is_left_held_after_the_fuzzing(gw: RunningGateway, node: NodeProcess) -> None:
    """Runs after the fuzz tests (same module, file order): no sequence, queue entry or KV block
    is left on the node."""
    deadline = time.monotonic() + 10
    while True:
        load = httpx.get(node.url + "/load", headers=AUTH, timeout=5).json()
        idle = load["num_running"] == 0 and load["num_waiting"] == 0 and load["kv_blocks_used"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert idle, load


AUTH_LINE = b"authorization: Bearer " + GLOBAL_KEY.encode() + b"\r\n"
EARLY_ANSWERS = [
    ("gateway", "/v1/chat/completions", b"", 401),  # no key
    ("gateway", "/v1/messages", b"x-api-key: wrong\r\n", 401),
    ("gateway", "/v1/no-such-door", AUTH_LINE, 404),
    ("gateway", "/health", AUTH_LINE, 405),
    ("node", "/v1/no-such-door", b"", 404),
]


@pytest.mark.parametrize(("server", "path", "headers", "status"), EARLY_ANSWERS)
def test_an_answer_before_the_body_closes_the_kept_alive_connection_cleanly(
    gw: RunningGateway, node: NodeProcess, server: str, path: str, headers: bytes, status: int
) -> None:
    """Issue 32: answered before its body was read, a kept-alive connection must not drop the
    client's next request silently. The answer says `connection: close` (a pooled client opens a
    new connection), and the connection then ends with EOF, never a reset."""
    port = port_of(gw.url if server == "gateway" else node.url)
    body = json.dumps(valid("/v1/chat/completions")).encode()
    head = b"POST %s HTTP/1.1\r\nhost: t\r\n%scontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head % (path.encode(), headers, len(body)))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        head_lines = data.partition(b"\r\n\r\n")[0].lower().split(b"\r\n")
        assert head_lines[0].startswith(b"http/1.1 %d" % status), head_lines
        assert b"connection: close" in head_lines, head_lines
        time.sleep(0.3)  # the outside tester's client: headers, a pause, the body, the next request
        sock.sendall(body + b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
        rest = b""
        while chunk := sock.recv(65536):  # a reset raises here: the test fails
            rest += chunk
    assert b"HTTP/1.1" not in rest  # only the first answer's body: the next request was never taken


# Query strings: each GET door's own parameters (and others), with values a parser trips on
# (digits int() refuses, like "²", or 5,000 of them; signs, exponents, empty; repeated names).
AWKWARD = [
    "",
    "0",
    "-1",
    "1e3",
    "20",
    "²",
    "٣",
    "9" * 5000,
    "9" * 19,  # past 64 bits as milliseconds (an end_time of 10**20 was a 500)
    "18446744073709551616",
    "1_000",
    "page_²",
    "page_" + "9" * 5000,
    "2026-13-01",
    "1d",
    "\x00",
]
QUERY_NAMES = {
    "/v1/usage": ["start_time", "end_time", "bucket_width", "group_by", "limit", "page", "date", "tenant"],
    "/v1/costs": ["start_time", "end_time", "bucket_width", "group_by", "limit", "page", "tenant"],
    "/v1/batches": ["limit", "after"],
    "/v1/files": ["limit", "order", "after", "purpose"],
    "/v1/responses/resp_x/input_items": ["limit", "order", "after"],
    "/v1/models/x": ["x"],
    "/v1/quota": ["tenant"],
    "/v1/models": ["x"],
    "/v1/responses/resp_x": ["stream"],
    "/v1/files/file-x": ["x"],
}


def test_each_query_parameter_with_each_awkward_value_is_never_a_5xx(gw: RunningGateway) -> None:
    """Query parameters are parsed by hand on several doors: each is a 400 naming it, or ignored.
    Every door's every parameter meets every awkward value ("²" passed isdigit() and failed
    int(): a 500 on /v1/batches and /v1/costs)."""
    with httpx.Client(timeout=TIMEOUT, headers={"authorization": f"Bearer {GLOBAL_KEY}"}) as client:
        for path, names in QUERY_NAMES.items():
            for name in names:
                for value in AWKWARD:
                    response = client.get(gw.url + path, params={name: value})
                    assert response.status_code < 500, (path, name, value[:20], response.text[:300])
                    if response.status_code >= 400:
                        assert_error_body(path, response)


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    path = draw(st.sampled_from(sorted(QUERY_NAMES)))
    names = st.sampled_from(QUERY_NAMES[path]) | st.text(max_size=6)
    return path, draw(st.lists(st.tuples(names, st.sampled_from(AWKWARD) | st.text(max_size=12)), max_size=4))


@settings(FUZZ, max_examples=150)
@given(queries())
def test_fuzzed_query_strings_never_get_a_5xx(
    gw: RunningGateway, query: tuple[str, list[tuple[str, str]]]
) -> None:
    """Several parameters at once, repeated, and names no door reads."""
    path, params = query
    with httpx.Client(timeout=TIMEOUT) as client:
        response = client.get(gw.url + path, params=params, headers={"authorization": f"Bearer {GLOBAL_KEY}"})
    check_response(path, response)


def test_the_nodes_load_query_with_awkward_values_is_never_a_5xx(node: NodeProcess) -> None:
    """`/load?prefixes=<epoch>.<version>`: a malformed value is answered in full ("e.²" was a 500)."""
    with httpx.Client(timeout=TIMEOUT, headers=AUTH) as client:
        for value in [*AWKWARD, "e.²", "e.٣", "e." + "9" * 5000, ".", "e.-1"]:
            response = client.get(node.url + "/load", params={"prefixes": value})
            assert response.status_code == 200, (value[:20], response.text[:300])

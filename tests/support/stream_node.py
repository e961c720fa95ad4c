"""Scripted stream nodes for gateway tests: an ASGI app on uvicorn in a thread of the test.

A test's app answers the gateway's probes with `answer_probe` (an idle node), and begins a chat
stream with `begin_stream` (the request body read, the SSE head sent); what it streams after that
(endless frames, a few then silence, ...) is the test's. `serve_node` runs it on a port of its own,
and `one_node_regions` writes the static regions file that names it as the one node of
`meridian-small`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.threaded_server import serve_in_thread

_IDLE_LOAD = b'{"kv_cache_usage": 0.0, "waiting_tokens": 0, "num_running": 0, "num_waiting": 0}'


async def answer_probe(scope: dict[str, Any], send: Any) -> bool:
    """Answer /ready and /load as an idle node; False for any other path."""
    if scope["path"] not in ("/ready", "/load"):
        return False
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": _IDLE_LOAD})
    return True


async def begin_stream(receive: Any, send: Any) -> None:
    """Read the request's body, then send an SSE response's head."""
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )


@contextlib.contextmanager
def serve_node(app: Any) -> Iterator[str]:
    """`app` on a loopback port of its own, in a thread of the test; yields its base URL."""
    with serve_in_thread(app) as port:
        yield f"http://127.0.0.1:{port}"


def one_node_regions(folder: Path, node_id: str, url: str) -> Path:
    """A regions file whose one node, `node_id` at `url` in eu-west, serves meridian-small."""
    node = {
        "node_id": node_id,
        "url": url,
        "region": "eu-west",
        "jurisdiction": "eu",
        "models": ["meridian-small"],
    }
    regions = folder / "regions.yaml"
    regions.write_text(yaml.safe_dump({"nodes": [node]}))
    return regions

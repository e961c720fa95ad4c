"""The load generator: a fixed number of chat requests, bounded in time, in a process of its own.

    python -m gateway_bench.load '<JSON list of LoadSpec>'    prints a JSON list of LoadResult

One spec: `concurrency` workers each own one keep-alive connection and take requests from a
shared count until `requests` are done or `deadline_s` passes (the result then says
`truncated`). Warm-up requests go first on the same connections and are not recorded.

Several specs (all at concurrency 1): one connection per spec; the specs take turns, each
sending BLOCK requests back to back, and who goes first rotates every turn. At concurrency 1 a
latency is a few milliseconds, and a burst of someone else's work on a shared machine would
otherwise land on whichever system happened to be measured at that moment. Each block starts
with one unrecorded request: a server that sat idle while the others had their turn answers its
first request slower (on the 2-core team machine Meridian's p50 was 3.8 ms after a 12 ms idle
gap against 2.2 ms back to back), and the gaps differ by system (a slow neighbour makes a long
gap), so recording that request would penalise whichever system shares the run with a slow one.

The process reports its own CPU use, so a reader can tell whether it was the bottleneck.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from urllib.parse import urlsplit

import msgspec

from gateway_bench.http_client import Connection, HttpProtocolError, Reply, build_request

PATH = "/v1/chat/completions"
PROMPT = [{"role": "user", "content": "Say hello to the benchmark."}]
MAX_ERROR_SAMPLES = 5
BLOCK = 20  # consecutive requests per turn when specs are interleaved
_FAILURES = (
    OSError,
    TimeoutError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ValueError,
    HttpProtocolError,
)


class LoadSpec(msgspec.Struct, kw_only=True, frozen=True):
    base_url: str  # http://127.0.0.1:PORT
    model: str
    api_key: str | None
    stream: bool
    concurrency: int
    requests: int
    warmup: int
    max_tokens: int = 16  # the fixed upstream streams this many content chunks
    request_timeout_s: float = 30.0
    deadline_s: float = 300.0


class LoadResult(msgspec.Struct, kw_only=True):
    latencies_s: list[float] = msgspec.field(default_factory=list)  # one per successful request
    ttfb_s: list[float] = msgspec.field(default_factory=list)  # same order; ~latency if not streamed
    ok: int = 0
    errors: int = 0
    error_samples: list[str] = msgspec.field(default_factory=list)  # warm-up errors included
    wall_s: float = 0.0  # measured span (interleaved: the sum of this spec's own request times)
    client_cpu_s: float = 0.0  # this process's CPU over the measured span
    truncated: bool = False  # the deadline stopped it before `requests` were done
    sent: int = 0  # every request sent, warm-up and unrecorded ones included (for CPU per request)


def request_bytes(spec: LoadSpec) -> tuple[str, int, bytes]:
    url = urlsplit(spec.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    body: dict[str, object] = {"model": spec.model, "messages": PROMPT, "max_tokens": spec.max_tokens}
    if spec.stream:
        body["stream"] = True
    headers = {"content-type": "application/json", "accept": "application/json"}
    if spec.api_key:
        headers["authorization"] = f"Bearer {spec.api_key}"
    return host, port, build_request(host, port, PATH, msgspec.json.encode(body), headers)


def check_reply(reply: Reply, *, stream: bool) -> str | None:
    """Why a reply does not count as a success, or None: a proxy that answers fast but wrong must
    not win a benchmark."""
    if reply.status != 200:
        return f"HTTP {reply.status}: {reply.body[:160]!r}"
    if stream:
        events = reply.body.count(b"data:")
        if not reply.body.rstrip().endswith(b"data: [DONE]") or events < 3:
            return f"incomplete stream ({events} events): {reply.body[-120:]!r}"
    elif b'"choices"' not in reply.body:
        return f"no choices in the answer: {reply.body[:160]!r}"
    return None


class _Target:
    """One spec's connection(s), its pre-built request and what it has measured so far."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        host, port, self.raw = request_bytes(spec)
        self.connections = [Connection(host, port) for _ in range(spec.concurrency)]
        self.result = LoadResult()

    async def send(self, connection: Connection, *, recording: bool) -> float:
        """One request; records it when `recording`. Returns its duration, failed or not."""
        started = time.perf_counter()
        self.result.sent += 1
        try:
            async with asyncio.timeout(self.spec.request_timeout_s):
                reply = await connection.request(self.raw)
        except _FAILURES as exc:
            self._failed(f"{type(exc).__name__}: {exc}", recording=recording)
            return time.perf_counter() - started
        problem = check_reply(reply, stream=self.spec.stream)
        if problem is not None:
            self._failed(problem, recording=recording)
        elif recording:
            self.result.ok += 1
            self.result.latencies_s.append(reply.latency_s)
            self.result.ttfb_s.append(reply.ttfb_s)
        return time.perf_counter() - started

    def _failed(self, message: str, *, recording: bool) -> None:
        if recording:
            self.result.errors += 1
        if len(self.result.error_samples) < MAX_ERROR_SAMPLES:
            self.result.error_samples.append(message)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


async def run_load(spec: LoadSpec) -> LoadResult:
    target = _Target(spec)
    deadline = time.monotonic() + spec.deadline_s

    async def drain(connection: Connection, left: list[int], recording: bool) -> None:
        while left[0] > 0:
            if time.monotonic() > deadline:
                target.result.truncated |= recording
                return
            left[0] -= 1
            await target.send(connection, recording=recording)

    async def workers(count: int, *, recording: bool) -> None:
        left = [count]  # shared by the workers: requests not yet taken
        await asyncio.gather(*(drain(c, left, recording) for c in target.connections))

    try:
        await workers(spec.warmup, recording=False)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await workers(spec.requests, recording=True)
        target.result.wall_s = time.perf_counter() - wall0
        target.result.client_cpu_s = time.process_time() - cpu0
    finally:
        target.close()
    return target.result


async def _take_turns(targets: list[_Target], counts: list[int], *, recording: bool, deadline: float) -> None:
    """Blocks of BLOCK consecutive requests per target, the targets taking turns (who goes first
    rotates). When recording, each block starts with one unrecorded request (see the docstring)."""
    done = [0] * len(targets)
    turn = 0
    while any(d < c for d, c in zip(done, counts, strict=True)):
        shift = turn % len(targets)
        for index in [*range(shift, len(targets)), *range(shift)]:
            target, todo = targets[index], min(BLOCK, counts[index] - done[index])
            if todo <= 0:
                continue
            done[index] += todo
            if time.monotonic() > deadline:
                target.result.truncated |= recording
                continue
            if recording:
                await target.send(target.connections[0], recording=False)
            for _ in range(todo):
                spent = await target.send(target.connections[0], recording=recording)
                if recording:
                    target.result.wall_s += spent
        turn += 1


async def run_interleaved(specs: list[LoadSpec]) -> list[LoadResult]:
    """Concurrency-1 specs taking turns in blocks (see the module docstring)."""
    assert all(spec.concurrency == 1 for spec in specs), "interleaving is for concurrency 1 only"
    targets = [_Target(spec) for spec in specs]
    deadline = time.monotonic() + max(spec.deadline_s for spec in specs)
    try:
        await _take_turns(targets, [s.warmup for s in specs], recording=False, deadline=deadline)
        cpu0 = time.process_time()
        await _take_turns(targets, [s.requests for s in specs], recording=True, deadline=deadline)
        cpu = time.process_time() - cpu0
    finally:
        for target in targets:
            target.close()
    # One process served them all: its CPU is shared out by each spec's share of the time.
    total = sum(t.result.wall_s for t in targets) or 1.0
    for target in targets:
        target.result.client_cpu_s = cpu * target.result.wall_s / total
    return [target.result for target in targets]


async def run_specs(specs: list[LoadSpec]) -> list[LoadResult]:
    if len(specs) == 1:
        return [await run_load(specs[0])]
    return await run_interleaved(specs)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    specs = msgspec.json.decode(args[0], type=list[LoadSpec])
    if importlib.util.find_spec("uvloop"):
        import uvloop

        results = uvloop.run(run_specs(specs))
    else:
        results = asyncio.run(run_specs(specs))
    # os.write in a loop, not sys.stdout: after the event loop ran, a write of megabytes into the
    # pipe came back short now and then without an error (a signal interrupting it mid-way), and
    # the parent got truncated JSON from a process that exited 0.
    left = memoryview(msgspec.json.encode(results) + b"\n")
    try:
        while left:
            left = left[os.write(sys.stdout.fileno(), left) :]
    except BrokenPipeError:
        return 1  # nobody reads the results: say so instead of pretending they were delivered
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cache-aware routing (issue 35). End to end: three real nodes behind a gateway; a tenant's
requests follow the node that holds its system prompt, the route header says what was cached, and
the gateway keeps what it routed in its overlay. And the overlay itself (gateway/health/probes.py):
what it keeps, for how long, for which nodes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.health.probes import Overlay
from protocol.prefix_cache import prefix_names
from router import Prefill
from router.cost import overlaid
from tests.gateway.conftest import GLOBAL_KEY, NodeProcess, RunningGateway, gateway_over, running_fleet

MODEL = "meridian-small"
HEADERS = {"authorization": f"Bearer {GLOBAL_KEY}"}


@pytest.fixture(scope="module")
def gateway(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    logs = tmp_path_factory.mktemp("cache-routing")
    placements = [(f"n{i}", "eu-west", "eu") for i in range(3)]
    fleet: list[NodeProcess]
    with (
        running_fleet(placements, {MODEL: (llama_checkpoint, "small")}, logs) as fleet,
        gateway_over(fleet, logs) as running,
    ):
        yield running


def _ask(client: httpx.Client, url: str, system: str, user: str) -> tuple[str, str]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 1,
    }
    response = client.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    return response.headers["x-meridian-node"], response.headers["x-meridian-route"]


def _wait_reported(gw: RunningGateway, system: str, node_id: str, answered_at: float) -> None:
    """Until the gateway holds a report of `node_id` asked after `answered_at` (so the node's
    queue and the gateway's overlay say it is idle) whose table holds the system prompt, computed.
    Without it, on a loaded machine, the holder could still look busy with the request just
    answered, and the cost router rightly sent the next one elsewhere."""
    name = prefix_names(MODEL, None, [("system", system)])[0]
    deadline = time.monotonic() + 30
    while True:
        nodes = {n.node_id: n for n in gw.gateway.fleet.snapshot().nodes}
        load = nodes[node_id].load
        if (
            load is not None
            and load.asked_at > answered_at
            and name in load.cached_prefixes
            and name not in load.computing_prefixes
        ):
            return
        assert time.monotonic() < deadline, "the gateway never saw the node publish the prompt"
        time.sleep(0.05)


@pytest.mark.slow
def test_each_tenants_requests_follow_the_node_holding_its_system_prompt(gateway: RunningGateway) -> None:
    with httpx.Client() as client:
        for tenant in range(6):
            system = f"Tenant {tenant} runs a shop of rare maps and old globes. " * 12
            first, _ = _ask(client, gateway.url, system, "hello")
            _wait_reported(gateway, system, first, time.monotonic())

            later = []
            for i in range(3):
                later.append(_ask(client, gateway.url, system, f"question {i}"))
                _wait_reported(gateway, system, later[-1][0], time.monotonic())

            assert {node for node, _ in later} == {first}
            for _, route in later:
                cached = int(route.split("cached=")[1].split(";")[0])
                assert cached > 0, route


@pytest.mark.slow
def test_the_gateway_keeps_each_request_it_routed_in_its_overlay(gateway: RunningGateway) -> None:
    system = "An overlay tenant keeps a ledger of lighthouse keepers. " * 12
    name = prefix_names(MODEL, None, [("system", system)])[0]
    before = time.monotonic()
    with httpx.Client() as client:
        node, _ = _ask(client, gateway.url, system, "hello")

    # Read as of just before it was sent, so a slow machine cannot have aged it out yet.
    result = gateway.gateway.fleet.prober.result(node, now=before)

    assert result is not None and result.load is not None
    assert result.load.overlay is not None and name in result.load.overlay.prefixes


def _stage_on(gw: RunningGateway, node: str, name: str, since: float) -> str:
    """The stage of the request naming prefix `name` that the gateway routed to `node`."""
    routed = [r for r in gw.gateway.fleet.prober.routed_lately(node, now=since) if name in r.prefill.prefixes]
    assert len(routed) == 1, routed
    return routed[0].stage


def _wait_stage(gw: RunningGateway, node: str, name: str, since: float, stage: str) -> None:
    deadline = time.monotonic() + 30
    while _stage_on(gw, node, name, since) != stage:
        assert time.monotonic() < deadline, f"the overlay never saw the request {stage}"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_streamed_request_counts_as_waiting_then_running_then_done_with_its_prefix_cached(
    gateway: RunningGateway,
) -> None:
    """The gateway's overlay follows each request it routed, before the node's next report can:
    waiting for its first token (a prompt in the node's queue), then one of the node's running
    sequences while it streams, then nothing but its prompt cached there (here the client leaves
    mid-stream, and the gateway closes the node's stream). So a node that has just answered does
    not look busy with a prompt it already computed, nor its prefix still in progress."""
    system = "A streaming tenant keeps lists of tide tables. " * 12
    names = prefix_names(MODEL, None, [("system", system), ("user", "hello")])
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}],
        # Long enough that it is still streaming when read, however slow the machine.
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    before = time.monotonic()
    with (
        httpx.Client() as client,
        client.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60
        ) as response,
    ):
        assert response.status_code == 200
        node = response.headers["x-meridian-node"]
        # Kept until the client leaves: closing the iterator closes the connection.
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the first chunk
        # Read as of just before it was sent, so a slow machine cannot have aged it out yet.
        assert _stage_on(gateway, node, names[0], before) == "running"
        overlay = gateway.gateway.fleet.prober.result(node, now=before)
        assert overlay is not None and overlay.load is not None and overlay.load.overlay is not None
        assert set(names) <= overlay.load.overlay.prefilled
        assert overlay.load.overlay.unreported == 0  # it waits for no prefill any more

    _wait_stage(gateway, node, names[0], before, "done")  # the client left: the stream was closed
    result = gateway.gateway.fleet.prober.result(node, now=before)
    assert result is not None and result.load is not None and result.load.overlay is not None
    sums = result.load.overlay
    assert set(names) <= sums.prefilled
    assert (sums.unreported, sums.unreported_tokens, sums.unreported_running) == (0, 0, 0)


@pytest.mark.slow
def test_a_non_streamed_answer_leaves_only_its_prompt_cached_in_the_overlay(gateway: RunningGateway) -> None:
    system = "A patient tenant keeps lists of tide tables. " * 12
    names = prefix_names(MODEL, None, [("system", system), ("user", "hello")])
    before = time.monotonic()
    with httpx.Client() as client:
        node, _ = _ask(client, gateway.url, system, "hello")

    assert _stage_on(gateway, node, names[0], before) == "done"
    result = gateway.gateway.fleet.prober.result(node, now=before)
    assert result is not None and result.load is not None and result.load.overlay is not None
    sums = result.load.overlay
    assert set(names) <= sums.prefilled
    assert (sums.unreported, sums.unreported_tokens, sums.unreported_running) == (0, 0, 0)


def _prefill(tokens: int) -> Prefill:
    return Prefill(prefixes={"p": tokens}, uncached_tokens=tokens)


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0.0, 10.0)), max_size=40), st.floats(0.0, 12.0)
)
def test_the_overlay_holds_exactly_the_requests_routed_within_its_window(
    sent: list[tuple[str, float]], now: float
) -> None:
    overlay = Overlay(kept_s=2.0)
    sent.sort(key=lambda s: s[1])  # the gateway notes requests as it routes them, in time order
    for i, (node_id, at) in enumerate(sent):
        overlay.note(node_id, _prefill(i + 1), at)

    for node_id in ("a", "b"):
        kept = overlay.recent(node_id, now)
        expected = [i + 1 for i, (n, at) in enumerate(sent) if n == node_id and now - at <= 2.0]
        assert [r.prefill.uncached_tokens for r in kept] == expected


def test_the_overlay_forgets_nodes_that_left_and_stays_bounded() -> None:
    overlay = Overlay(kept_s=2.0, max_per_node=4)
    for i in range(10):
        overlay.note("a", _prefill(i), 1.0)
        overlay.note("b", _prefill(i), 1.0)

    overlay.keep(["a"])

    assert [r.prefill.uncached_tokens for r in overlay.recent("a", 1.0)] == [6, 7, 8, 9]
    assert overlay.recent("b", 1.0) == ()


def test_an_answer_reaches_a_calls_later_routing_after_its_earlier_one_aged_out() -> None:
    # An escalated `auto` request routed twice to one node (small tier, then large): the first
    # entry ages out, and the node's answer to the second still counts.
    overlay = Overlay(kept_s=2.0)
    overlay.note("a", Prefill(prefixes={"small": 10}, uncached_tokens=10), 0.0, "r")
    overlay.note("a", Prefill(prefixes={"large": 20}, uncached_tokens=20), 1.5, "r")
    assert [r.prefill.uncached_tokens for r in overlay.recent("a", 2.5)] == [20]

    overlay.moved("a", "r", "running")

    sums = overlay.sums("a", 2.5, asked_at=0.0)
    assert sums is not None and (sums.unreported, sums.unreported_running) == (0, 1)
    assert sums.prefilled == {"large"}


def test_a_move_routing_can_see_changes_the_sums_and_one_it_cannot_keeps_them() -> None:
    """Read against one report, as routing does until the next: a request sent after its ask
    moves, and the next read says so; one the report already shows moves, and routing gets the
    same sums object (the fleet snapshot is then not rebuilt)."""
    overlay = Overlay(kept_s=2.0)
    overlay.note("a", Prefill(prefixes={"p": 5}, uncached_tokens=5), 0.5, "shown")
    overlay.note("a", Prefill(prefixes={"q": 7}, uncached_tokens=7), 1.0, "new")
    first = overlay.sums("a", 1.1, asked_at=0.8)
    assert first is not None and (first.unreported, first.unreported_running) == (1, 0)

    overlay.moved("a", "new", "running")
    running = overlay.sums("a", 1.2, asked_at=0.8)
    assert running is not None and (running.unreported, running.unreported_running) == (0, 1)
    assert running.prefilled == {"q"}
    overlay.moved("a", "new", "done")
    done = overlay.sums("a", 1.3, asked_at=0.8)
    assert done is not None and (done.unreported, done.unreported_running) == (0, 0)

    overlay.moved("a", "shown", "running")  # "p" becomes cached: routing must see that
    shown = overlay.sums("a", 1.4, asked_at=0.8)
    assert shown is not None and shown.prefilled == {"p", "q"}
    overlay.moved("a", "shown", "done")  # nothing routing reads changes
    assert overlay.sums("a", 1.5, asked_at=0.8) is shown
    assert shown == overlaid(overlay.recent("a", 1.5), 0.8)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            # a request routed `gap` s after the one before, naming some of three prefixes
            st.tuples(
                st.just("note"),
                st.floats(0.0, 1.5),
                st.dictionaries(st.sampled_from("pqr"), st.integers(1, 50), max_size=3),
                st.integers(1, 99),
            ),
            # routing reads the sums `gap` s later, against a report asked `back` s before then
            # (`same` 1: against the report read last time, as routing does until the next one)
            st.tuples(st.just("read"), st.floats(0.0, 1.5), st.floats(0.0, 3.0), st.integers(0, 1)),
            # the request noted `back` notes ago moves: its answer starts (running) or ends
            # (done), or it leaves unanswered (None); a move back, or of one aged out, changes nothing
            st.tuples(
                st.just("answer"),
                st.floats(0.0, 0.5),
                st.sampled_from([None, "running", "done"]),
                st.integers(0, 4),
            ),
        ),
        max_size=60,
    ),
    st.integers(1, 6),
    st.sampled_from([1, 2]),
)
def test_the_kept_sums_are_the_routers_sums_over_the_kept_requests(
    steps: list[tuple[str, float, object, int]], max_per_node: int, per_id: int
) -> None:
    """The prober keeps each node's overlay summed as requests are noted, answered and leave (by
    age, the bound, or unanswered), so routing never walks them; whenever read, the sums equal
    router.cost.overlaid over the requests kept, against any report's ask. `per_id` 2: each
    call is routed twice to the node (an escalated `auto` request whose tiers share a node)."""
    overlay = Overlay(kept_s=2.0, max_per_node=max_per_node)
    now = 0.0
    noted = 0
    last_asked: float | None = None
    for kind, gap, what, tokens in steps:
        now += gap
        if kind == "note":
            assert isinstance(what, dict)
            overlay.note("a", Prefill(prefixes=what, uncached_tokens=tokens), now, f"r{noted // per_id}")
            noted += 1
            continue
        if kind == "answer":
            assert what in (None, "running", "done")
            overlay.moved("a", f"r{(noted - 1 - tokens) // per_id}", what)  # type: ignore[arg-type]
            continue
        assert isinstance(what, float)
        asked_at = last_asked if tokens and last_asked is not None else now - what
        last_asked = asked_at
        sums = overlay.sums("a", now, asked_at)
        kept = overlay.recent("a", now)
        assert sums == (overlaid(kept, asked_at) if kept else None)

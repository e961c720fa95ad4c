"""What routing adds to the nodes' reports (issue 35's extra cold prefills): the gateway's overlay
of requests routed since a report, the request sized in the nodes' own tokens, and equal costs
ranked by the prefix most of the prompt shares."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from protocol.first_token import StepCost
from protocol.prefix_cache import prefix_names
from router import (
    ModelQueue,
    NodeInfo,
    NodeLoad,
    Prefill,
    Routed,
    RouteRequest,
    RoutingParams,
    rendezvous_rank,
    route,
)
from router.cost import overlaid
from tests.router.builders import ANYWHERE, LARGE, fleet, node

STEP = StepCost(base_s=0.01, per_token_s=0.001)  # ~1 ms a prompt token: 1,000 tokens ~ 1 s


def system(tenant: int) -> tuple[str, str]:
    return ("system", f"Tenant {tenant} sells rare maps and old globes. " * 90)  # ~4,000 bytes


def chat(tenant: int, turn: str = "What is VAT?") -> tuple[tuple[str, str], ...]:
    return (system(tenant), ("user", turn))


def ask(conversation: tuple[tuple[str, str], ...], tokens: int = 1000) -> RouteRequest:
    return RouteRequest(LARGE, home_region="eu-west", conversation=conversation, prompt_tokens=tokens)


def reported(
    node_id: str,
    *,
    waiting: int = 0,
    cached: dict[str, int] | None = None,
    routed: tuple[Routed, ...] = (),
    asked_at: float = 0.0,
) -> NodeInfo:
    queue = ModelQueue(
        waiting_tokens=waiting,
        waiting_tokens_by_tier={"interactive": waiting},
        waiting_requests_by_tier={"interactive": 1 if waiting else 0},
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        step_cost=STEP,
    )
    overlay = overlaid(routed, asked_at) if routed else None
    load = NodeLoad(models={LARGE: queue}, cached_prefixes=cached or {}, overlay=overlay, asked_at=asked_at)
    return dataclasses.replace(node(node_id), load=load)


def first(conversation: tuple[tuple[str, str], ...], *nodes: NodeInfo, tokens: int = 1000) -> str:
    return route(ask(conversation, tokens), ANYWHERE, fleet(*nodes)).targets[0].target_id


def ranked(tenant: int, ids: list[str]) -> tuple[str, ...]:
    """The rendezvous order equal costs fall back to for a tenant's chats (its system prompt)."""
    return rendezvous_rank(prefix_names(LARGE, None, chat(tenant))[0], ids)


def sent(tenant: int, at: float, ids: list[str] | None = None) -> Routed:
    """The overlay entry of a tenant's request routed at `at` to a node that held nothing."""
    decision = route(ask(chat(tenant)), ANYWHERE, fleet(*(reported(i) for i in ids or ["a", "b"])))
    assert decision.prefill is not None
    return Routed(decision.prefill, routed_at=at)


def test_a_decision_says_what_its_first_node_computes() -> None:
    name = prefix_names(LARGE, None, chat(0))[0]
    cold = route(ask(chat(0)), ANYWHERE, fleet(reported("a"), reported("b"))).prefill
    warm = route(ask(chat(0)), ANYWHERE, fleet(reported("a", cached={name: 990}))).prefill

    assert cold is not None and warm is not None
    assert cold.uncached_tokens == 1000 and set(cold.prefixes) == set(prefix_names(LARGE, None, chat(0)))
    assert warm.uncached_tokens == 10
    # A completion prompt names no prefixes: nothing for the overlay.
    assert (
        route(
            RouteRequest(LARGE, home_region="eu-west", affinity_key="x"), ANYWHERE, fleet(reported("a"))
        ).prefill
        is None
    )


def test_a_tenants_next_request_follows_its_first_before_the_node_publishes_it() -> None:
    # The rendezvous order would send tenant 0's cold requests to `b`; its first went to `a`.
    a, b = ranked(0, ["a", "b"])[::-1]
    in_flight = sent(0, at=1.0)

    # a's report (asked at 0) shows neither the request nor its prefix: the overlay does.
    decision = route(
        ask(chat(0, "And in Germany?")),
        ANYWHERE,
        fleet(reported(a, routed=(in_flight,), asked_at=0.0), reported(b, asked_at=0.0)),
    )

    assert decision.targets[0].target_id == a
    assert ";routed=1" in decision.targets[0].reason and ";cached=0;" not in decision.targets[0].reason


def test_a_request_the_node_answered_waits_no_more_and_its_prefix_is_ready_there() -> None:
    # Tenant 0's first request went to `a` after a's report, and `a` has answered it: while it
    # streams it is one of a's running sequences, then nothing; either way the next request is a
    # warm prompt there, not one queued behind that prefill.
    a, b = ranked(0, ["a", "b"])[::-1]
    waiting = sent(0, at=1.0)
    running = dataclasses.replace(waiting, stage="running")
    done = dataclasses.replace(waiting, stage="done")

    def reason(routed: Routed) -> str:
        nodes = fleet(reported(a, routed=(routed,), asked_at=0.0), reported(b, asked_at=0.0))
        return route(ask(chat(0, "And in Germany?")), ANYWHERE, nodes).targets[0].reason

    def cost(routed: Routed) -> float:
        return float(reason(routed).split("cost=")[1].split(";")[0])

    assert ";routed=1" in reason(waiting) and "running=" not in reason(waiting)
    assert "routed=" not in reason(running) and ";running=1" in reason(running)
    assert "routed=" not in reason(done) and "running=" not in reason(done)
    # Ready: prefilled at once, one short step (beside the running sequence's decode, if any).
    assert cost(done) < cost(running) < cost(waiting) / 5
    # A new tenant's cold prompt no longer avoids `a` as if a prefill were queued there.
    tenant = next(t for t in range(2, 50) if ranked(t, ["a", "b"])[0] == a)
    assert first(chat(tenant), reported(a, routed=(done,), asked_at=0.0), reported(b, asked_at=0.0)) == a


def test_a_burst_inside_one_probe_interval_spreads_over_idle_nodes() -> None:
    # Tenant 1's first request went to `a` after a's report: a new tenant's cold prompt would
    # queue behind it there, so it goes to the idle node even where rendezvous prefers `a`.
    tenant = next(t for t in range(2, 50) if ranked(t, ["a", "b"])[0] == "a")
    nodes = (reported("a", routed=(sent(1, at=1.0),), asked_at=0.0), reported("b", asked_at=0.0))

    assert first(chat(tenant), *nodes) == "b"


def test_a_request_the_report_already_shows_is_not_counted_twice() -> None:
    tenant = next(t for t in range(2, 50) if ranked(t, ["a", "b"])[0] == "a")
    # The node's report was asked after the request was sent: its queue (empty) is the truth.
    nodes = (reported("a", routed=(sent(1, at=1.0),), asked_at=2.0), reported("b", asked_at=2.0))

    decision = route(ask(chat(tenant)), ANYWHERE, fleet(*nodes))

    assert decision.targets[0].target_id == "a"
    assert "routed=" not in decision.targets[0].reason


def test_a_cold_prefill_elsewhere_is_costed_in_the_tokens_the_holder_published() -> None:
    # The gateway estimates 1,000 tokens; the holder's tokenizer made 2,000 of the system prompt
    # and it is 1,500 tokens into its queue. Costed at the estimate, a cold prefill elsewhere
    # (~1.0 s) would look cheaper than that queue (~1.5 s) and prefill the prompt a second time.
    name = prefix_names(LARGE, None, chat(0))[0]
    holder = reported("holder", waiting=1500, cached={name: 2000})

    decision = route(ask(chat(0)), ANYWHERE, fleet(holder, reported("idle")))

    assert decision.targets[0].target_id == "holder"
    idle_cost = float(decision.targets[1].reason.split("cost=")[1].split(";")[0])
    assert idle_cost >= 2.0


@given(
    tenant=st.integers(0, 1000),
    turns=st.lists(st.text(max_size=40), min_size=2, max_size=6),
    count=st.integers(2, 12),
    waiting=st.integers(0, 4000),
)
def test_two_replicas_send_every_request_of_a_prefix_to_one_node(
    tenant: int, turns: list[str], count: int, waiting: int
) -> None:
    """Stateless replicas (same published tables, no overlay) route every request sharing a
    tenant's system prompt, whatever its last turn, to the same node, and never to a costlier one."""
    ids = [f"n{i}" for i in range(count)]
    nodes = fleet(*(reported(i, waiting=waiting) for i in ids))

    firsts = {route(ask(chat(tenant, turn)), ANYWHERE, nodes).targets[0].target_id for turn in turns}

    assert firsts == {ranked(tenant, ids)[0]}


@given(tenant=st.integers(0, 1000), count=st.integers(3, 12), data=st.data())
def test_equal_cost_order_is_stable_when_another_node_leaves(
    tenant: int, count: int, data: st.DataObject
) -> None:
    ids = [f"n{i}" for i in range(count)]
    nodes = [reported(i) for i in ids]
    chosen = first(chat(tenant), *nodes)
    gone = data.draw(st.sampled_from([n for n in nodes if n.node_id != chosen]))

    assert first(chat(tenant), *(n for n in nodes if n is not gone)) == chosen


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 5.0)), max_size=6), st.floats(0.0, 5.0))
def test_the_overlay_only_adds_to_a_report(entries: list[tuple[int, float]], asked_at: float) -> None:
    """Whatever the overlay holds, a node's cost is never below its report's alone, and the
    cached tokens it counts are at least those its table publishes."""
    name = prefix_names(LARGE, None, chat(0))[0]
    routed = tuple(sent(t, at) for t, at in entries)
    plain = route(
        ask(chat(0)), ANYWHERE, fleet(reported("a", waiting=300, cached={name: 700}, asked_at=asked_at))
    )
    overlaid = route(
        ask(chat(0)),
        ANYWHERE,
        fleet(reported("a", waiting=300, cached={name: 700}, routed=routed, asked_at=asked_at)),
    )

    def parts(reason: str) -> tuple[float, int]:
        fields = dict(p.split("=", 1) for p in reason.split(";") if "=" in p)
        return float(fields["wait"]), int(fields["cached"])

    wait, cached = parts(plain.targets[0].reason)
    wait_overlaid, cached_overlaid = parts(overlaid.targets[0].reason)
    assert wait_overlaid >= wait and cached_overlaid >= cached >= 700


def test_prefill_names_each_prefix_with_its_share_of_the_prompt() -> None:
    prefill = route(ask(chat(0), tokens=1200), ANYWHERE, fleet(reported("a"))).prefill
    assert isinstance(prefill, Prefill)
    system_name, whole = prefix_names(LARGE, None, chat(0))
    # The system prompt is nearly all of the bytes; the whole conversation is the whole prompt.
    assert 1100 <= prefill.prefixes[system_name] < 1200 and prefill.prefixes[whole] == 1200


def test_a_cold_prompt_goes_where_it_holds_up_fewer_requests() -> None:
    # `a` was just sent a short warm request (tenant 1 holds its prompt there): a cold prefill
    # beside it would share its engine step and make it wait the whole prefill.
    name = prefix_names(LARGE, None, chat(1))[0]
    warm = route(ask(chat(1)), ANYWHERE, fleet(reported("a", cached={name: 990}))).prefill
    assert warm is not None and warm.uncached_tokens == 10
    tenant = next(t for t in range(2, 50) if ranked(t, ["a", "b"])[0] == "a")
    nodes = (reported("a", routed=(Routed(warm, 1.0),), asked_at=0.0), reported("b", asked_at=0.0))

    decision = route(ask(chat(tenant)), ANYWHERE, fleet(*nodes))

    assert decision.targets[0].target_id == "b"
    # Off, equal costs fall back to the anchor's rendezvous order.
    off = route(ask(chat(tenant)), ANYWHERE, fleet(*nodes), params=RoutingParams(queue_ahead_tiebreak=False))
    assert off.targets[0].target_id == "a"

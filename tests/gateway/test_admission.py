"""The admission controller (gateway/admission), on injected load snapshots and an injected clock.

Load is stated as waiting tokens on nodes whose steps cost 1 ms a token (and nothing else) and take
any number of tokens: 3000 waiting tokens are a 3 s estimate against the 1 s interactive target.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from gateway.admission import AdmissionController, Admitted, Overloaded
from gateway.config import AdmissionConfig
from gateway.metrics import GatewayMetrics
from protocol.first_token import StepCost
from protocol.prefix_cache import prefix_names
from router.types import (
    CatalogModel,
    FleetSnapshot,
    ModelQueue,
    NodeInfo,
    NodeLoad,
    Residency,
    TenantPolicy,
)

SMALL = CatalogModel("meridian-small", "small")
LARGE = CatalogModel("meridian-large", "large")
CATALOG = (SMALL, LARGE)


def tenant(
    tenant_id: str, *, tier: str = "interactive", degrade: bool = False, eu: bool = False
) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id,
        api_key_hashes=frozenset(),
        traffic_tier=tier,  # type: ignore[arg-type]
        allow_degrade=degrade,
        residency=Residency(jurisdictions=frozenset({"eu"})) if eu else Residency(),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """The fleet snapshot admission reads: one node per (model, region), waiting tokens settable."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, str], int] = {(LARGE.name, "eu-west"): 0, (SMALL.name, "eu-west"): 0}
        self.cost = StepCost(per_token_s=0.001)
        self.budget = 0  # max_num_batched_tokens; 0: a step takes every waiting token
        self.max_num_seqs: int | None = None
        self.threshold = 0  # long_prefill_token_threshold; 0: no partial prefills
        self.cached: dict[str, int] = {}  # the prefixes every node publishes, with their tokens

    def __call__(self) -> FleetSnapshot:
        nodes = []
        for (model, region), waiting in self.waiting.items():
            queue = ModelQueue(
                waiting_tokens=waiting,
                waiting_requests_by_tier={"interactive": 1 if waiting else 0},
                step_cost=self.cost,
                max_num_batched_tokens=self.budget,
                max_num_seqs=self.max_num_seqs,
                long_prefill_token_threshold=self.threshold,
            )
            load = NodeLoad(waiting_tokens=waiting, models={model: queue}, cached_prefixes=self.cached)
            jurisdiction = "eu" if region.startswith("eu") else "us"
            nodes.append(
                NodeInfo(f"{model}@{region}", "http://x", region, jurisdiction, frozenset({model}), load=load)
            )
        return FleetSnapshot(nodes=tuple(nodes))


@dataclass
class Setup:
    controller: AdmissionController
    clock: Clock
    fleet: Fleet
    metrics: GatewayMetrics

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def waiting(self, tier: str = "interactive") -> float:
        return self.metric("meridian_gateway_queue_length", tier=tier)


def setup(**config: Any) -> Setup:
    settings = {
        "interactive": {"target_ttft_s": 1.0, "queue_deadline_s": 2.0, "max_queue": 8},
        "batch": {"target_ttft_s": 60.0, "queue_deadline_s": 30.0, "max_queue": 8},
        "recheck_interval_s": 0.01,
        **config,
    }
    clock, fleet, metrics = Clock(), Fleet(), GatewayMetrics()
    controller = AdmissionController(
        msgspec.convert(settings, AdmissionConfig), fleet, CATALOG, metrics, clock=clock
    )
    return Setup(controller, clock, fleet, metrics)


async def queued(
    s: Setup, policy: TenantPolicy, model: CatalogModel = LARGE, tokens: int = 10
) -> asyncio.Task[Admitted]:
    """Start an admission that must wait; returns its task once it is in the queue."""
    task = asyncio.create_task(s.controller.admit(policy, model, tokens))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done(), "expected the request to wait in the queue"
    return task


async def test_admitted_while_the_estimate_is_within_the_target() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 990  # with its own 10 tokens, 1 s: at the target

    admitted = await s.controller.admit(tenant("a"), LARGE, 10)

    assert admitted.model == LARGE and admitted.degraded_from is None


async def test_over_target_an_allow_degrade_tenant_is_served_by_the_small_tier() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000

    admitted = await s.controller.admit(tenant("a", degrade=True), LARGE, 10)

    assert (admitted.model, admitted.degraded_from) == (SMALL, LARGE.name)
    assert s.metric("meridian_gateway_degraded_total", tenant="a", tier="interactive") == 1


async def test_degrade_only_to_a_small_pool_inside_the_residency_and_under_the_target() -> None:
    s = setup()
    s.fleet.waiting = {(LARGE.name, "eu-west"): 3000, (SMALL.name, "us-east"): 0}

    task = await queued(s, tenant("eu", degrade=True, eu=True))
    s.fleet.waiting[(LARGE.name, "eu-west")] = 0
    s.controller.pump()

    assert (await task).degraded_from is None


async def test_over_target_others_wait_and_are_admitted_when_the_estimate_drops() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000

    task = await queued(s, tenant("a"))
    assert s.waiting() == 1
    s.clock.now += 0.4
    s.fleet.waiting[(LARGE.name, "eu-west")] = 500  # 0.51 s: with the 0.4 s waited, within 1 s
    s.controller.pump()

    assert (await task).model == LARGE
    assert s.waiting() == 0
    assert s.metric("meridian_gateway_queue_wait_seconds_sum", tier="interactive", outcome="admitted") == (
        pytest.approx(0.4)
    )


async def test_past_the_deadline_a_waiter_is_refused_with_retry_after() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3500

    task = await queued(s, tenant("a"))
    s.clock.now += 2.0
    s.controller.pump()

    with pytest.raises(Overloaded) as refused:
        await task
    assert refused.value.reason == "deadline"
    assert refused.value.retry_after_s == 3  # ceil(3.501 s - 1 s target)
    assert s.metric("meridian_gateway_shed_total", tenant="a", tier="interactive", reason="deadline") == 1
    assert s.waiting() == 0


async def test_a_full_queue_refuses_at_once() -> None:
    s = setup(interactive={"target_ttft_s": 1.0, "queue_deadline_s": 2.0, "max_queue": 1})
    s.fleet.waiting[(LARGE.name, "eu-west")] = 2900
    first = await queued(s, tenant("a"))

    with pytest.raises(Overloaded) as refused:
        await s.controller.admit(tenant("b"), LARGE, 10)

    assert refused.value.reason == "queue_full" and refused.value.retry_after_s == 2
    assert not first.done()
    first.cancel()


async def test_a_tier_that_does_not_queue_refuses_at_once() -> None:
    s = setup(interactive={"target_ttft_s": 1.0, "queue_deadline_s": 0, "max_queue": 8})
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000

    with pytest.raises(Overloaded) as refused:
        await s.controller.admit(tenant("a"), LARGE, 10)

    assert refused.value.reason == "over_target"


async def test_tenants_take_turns_in_the_queue() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    greedy = [await queued(s, tenant("greedy"), tokens=400) for _ in range(3)]
    modest = await queued(s, tenant("modest"), tokens=400)

    # Idle again: room for two 400-token prompts under the 1 s target (pending tokens count).
    s.fleet.waiting[(LARGE.name, "eu-west")] = 0
    s.controller.pump()
    for _ in range(5):
        await asyncio.sleep(0)

    assert [t.done() for t in greedy] == [True, False, False]
    assert modest.done()
    for task in greedy[1:]:
        task.cancel()


async def test_admitted_tokens_count_until_the_first_token_then_free_the_queue() -> None:
    s = setup()
    first = await s.controller.admit(tenant("a"), LARGE, 1500)

    second = await queued(s, tenant("b"), tokens=10)  # 1500 pending tokens: 1.51 s
    first.ticket.started()

    assert (await second).model == LARGE


async def test_batch_is_held_back_while_interactive_requests_wait() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    interactive = await queued(s, tenant("i"))

    # The small pool is idle, but an interactive request waits in the gateway: batch waits too.
    batch = await queued(s, tenant("b", tier="batch"), SMALL)
    s.fleet.waiting[(LARGE.name, "eu-west")] = 0
    s.controller.pump()
    assert (await interactive).model == LARGE

    # Interactive had to wait: batch stays back for batch_holdoff_s (5 s by default) after that.
    s.clock.now += 4.9
    s.controller.pump()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not batch.done()
    s.clock.now += 0.2
    s.controller.pump()
    assert (await batch).model == SMALL


async def test_batch_is_held_back_after_interactive_requests_are_refused_anywhere() -> None:
    s = setup(batch_holdoff_s=2.0)
    # Every node refused an interactive request for capacity (the pipeline reports it).
    s.controller.interactive_pressed()
    batch = await queued(s, tenant("b", tier="batch"))
    s.clock.now += 2.5
    s.controller.pump()
    assert (await batch).model == LARGE
    # With no hold-off configured, only the estimates decide.
    s = setup(batch_holdoff_s=0)
    s.controller.interactive_pressed()
    assert (await s.controller.admit(tenant("b", tier="batch"), LARGE, 10)).model == LARGE


async def test_batch_waits_while_the_pool_is_over_the_interactive_target() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000  # 3 s: far under batch's 60 s target

    batch = await queued(s, tenant("b", tier="batch"))
    assert s.waiting("batch") == 1
    s.fleet.waiting[(LARGE.name, "eu-west")] = 0
    s.controller.pump()

    assert (await batch).model == LARGE


async def test_a_client_that_leaves_leaves_the_queue() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    task = await queued(s, tenant("a"))

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert s.waiting() == 0


async def test_no_pool_at_all_is_left_to_routing() -> None:
    s = setup()
    s.fleet.waiting = {}

    assert (await s.controller.admit(tenant("a"), LARGE, 10)).model == LARGE


async def test_a_request_no_node_can_serve_is_not_judged_by_the_nodes_load_nor_counted_on_them() -> None:
    # The pool is over the target; a request asking for tools goes to a provider (no node calls
    # tools): admitted at once, undegraded, and its prompt does not join the nodes' pending.
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    tools = frozenset({"tools"})

    admitted = await s.controller.admit(tenant("a", degrade=True), LARGE, 5000, needs=tools)

    assert admitted.model == LARGE and admitted.degraded_from is None
    s.fleet.waiting[(LARGE.name, "eu-west")] = 900  # 0.9 s + 10 tokens: within the target
    admitted = await asyncio.wait_for(s.controller.admit(tenant("b"), LARGE, 10), timeout=10)
    assert admitted.model == LARGE  # 5000 tokens pending would hold it back
    # A request asking what nodes do serve (logprobs) is judged by their pool as before.
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    await queued_with(s, tenant("c"), needs=frozenset({"logprobs"}))


async def queued_with(s: Setup, policy: TenantPolicy, *, needs: frozenset[str]) -> None:
    task = asyncio.create_task(s.controller.admit(policy, LARGE, 10, needs=needs))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done(), "expected the request to wait in the queue"
    task.cancel()


async def test_disabled_admission_admits_everything() -> None:
    s = setup(enabled=False)
    s.fleet.waiting[(LARGE.name, "eu-west")] = 10**9

    assert (await s.controller.admit(tenant("a"), LARGE, 10)).model == LARGE


async def test_the_pool_estimate_is_exported_per_model() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 2500

    assert s.metric("meridian_gateway_pool_queue_wait_seconds", model=LARGE.name, tier="interactive") == (
        pytest.approx(2.501)
    )


async def test_a_burst_of_up_to_max_num_seqs_to_an_idle_pool_is_admitted_whole() -> None:
    # A CPU node: 20 ms a step plus 0.2 ms a batched token, 16 slots, 512 tokens a step, idle.
    # Sixteen short prompts arrive at once: the node prefills them in two steps (about 250 ms),
    # within a 500 ms target, so none may wait or be refused. (Charged at a fixed 1,000 tokens a
    # second, as before, they were 0.96 s of work: most of the burst was refused.)
    s = setup(interactive={"target_ttft_s": 0.5, "queue_deadline_s": 0, "max_queue": 8})
    s.fleet.cost, s.fleet.budget, s.fleet.max_num_seqs = StepCost(base_s=0.02, per_token_s=0.0002), 512, 16

    burst = await asyncio.gather(*(s.controller.admit(tenant(f"t{i % 3}"), LARGE, 60) for i in range(16)))

    assert len(burst) == 16 and all(a.model == LARGE for a in burst)
    # The seventeenth waits for a slot: with no finish rate measured, unknown is not long either.
    assert (await s.controller.admit(tenant("t0"), LARGE, 60)).model == LARGE


async def test_each_first_token_records_how_far_it_was_from_the_estimate() -> None:
    s = setup()
    s.fleet.waiting[(LARGE.name, "eu-west")] = 490  # with its own 10 tokens: a 0.5 s estimate

    admitted = await s.controller.admit(tenant("a"), LARGE, 10)
    s.clock.now += 0.8  # the first token came 0.8 s after admission: 0.3 s later than estimated
    admitted.ticket.started()
    admitted.ticket.started()  # once only

    labels = {"model": LARGE.name, "tier": "interactive"}
    assert s.metric("meridian_gateway_admission_estimate_error_seconds_count", **labels) == 1
    # Signed buckets (Prometheus keeps no _sum for them): the 0.3 s error lies in (0.25, 0.5].
    bucket = "meridian_gateway_admission_estimate_error_seconds_bucket"
    assert (s.metric(bucket, le="0.25", **labels), s.metric(bucket, le="0.5", **labels)) == (0, 1)
    # A request that ends without a first token records nothing.
    other = await s.controller.admit(tenant("a"), LARGE, 10)
    other.ticket.release()
    assert s.metric("meridian_gateway_admission_estimate_error_seconds_count", **labels) == 1


async def test_a_waiter_is_admitted_only_while_it_can_still_start_within_its_target() -> None:
    s = setup(interactive={"target_ttft_s": 1.0, "queue_deadline_s": 5.0, "max_queue": 8})
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    task = await queued(s, tenant("a"))

    # After 0.6 s in the queue, a 0.5 s estimate would make its first token 1.1 s late: it waits.
    s.clock.now += 0.6
    s.fleet.waiting[(LARGE.name, "eu-west")] = 490
    s.controller.pump()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    # 0.3 s fits the 0.4 s it has left.
    s.fleet.waiting[(LARGE.name, "eu-west")] = 290
    s.controller.pump()
    assert (await task).model == LARGE


async def test_a_waiter_waits_no_longer_than_its_target_even_with_a_longer_deadline() -> None:
    s = setup(interactive={"target_ttft_s": 1.0, "queue_deadline_s": 5.0, "max_queue": 8})
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    task = await queued(s, tenant("a"))
    s.clock.now += 1.0
    s.controller.pump()
    with pytest.raises(Overloaded) as refused:
        await task
    assert refused.value.reason == "deadline"


async def test_estimates_that_ran_short_are_corrected_by_what_followed() -> None:
    s = setup(interactive={"target_ttft_s": 1.0, "queue_deadline_s": 0, "max_queue": 8})
    s.fleet.waiting[(LARGE.name, "eu-west")] = 390  # a 0.4 s estimate: admitted at a 1 s target
    # ... but the first tokens come 1.2 s after admission: the pool's estimates run 0.8 s short,
    # and after a few the same 0.4 s estimate counts as 1.2 s, over the target.
    round_ = [await s.controller.admit(tenant("a"), LARGE, 10) for _ in range(5)]
    s.clock.now += 1.2
    for admitted in round_:
        admitted.ticket.started()
    with pytest.raises(Overloaded) as refused:
        await s.controller.admit(tenant("b"), LARGE, 10)
    assert refused.value.reason == "over_target"
    # A quiet minute later the model is trusted again.
    s.clock.now += 60
    assert (await s.controller.admit(tenant("b"), LARGE, 10)).model == LARGE


async def test_a_prompt_the_node_holds_starts_beside_a_queue_that_holds_a_cold_one_back() -> None:
    """Admission counts only what a node would compute: on a node with partial prefills and 3,000
    tokens of cold prompts queued, a chat whose system prompt it holds starts in one step and is
    admitted at once; the same chat cold, or on a node without partial prefills, must wait."""
    s = setup()
    chat = (("system", "You answer questions about invoices. " * 120), ("user", "Is VAT due?"))
    tokens = sum(len(text) // 4 + 4 for _, text in chat)
    s.fleet.waiting[(LARGE.name, "eu-west")] = 3000
    s.fleet.budget, s.fleet.threshold = 2048, 256
    cold = asyncio.create_task(s.controller.admit(tenant("a"), LARGE, tokens, chat))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not cold.done()  # ~4.1 s of prompts ahead of it against a 1 s target

    s.fleet.cached = {prefix_names(LARGE.name, None, chat)[0]: 1136}
    warm = await asyncio.wait_for(s.controller.admit(tenant("b"), LARGE, tokens, chat), 5)
    assert warm.model == LARGE
    warm.ticket.release()

    s.fleet.threshold = 0  # one prompt after another: the cached chat waits behind the queue too
    await queued_chat(s, tenant("c"), chat, tokens)
    cold.cancel()


async def queued_chat(
    s: Setup, policy: TenantPolicy, chat: tuple[tuple[str, str], ...], tokens: int
) -> asyncio.Task[Admitted]:
    task = asyncio.create_task(s.controller.admit(policy, LARGE, tokens, chat))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done(), "expected the request to wait in the queue"
    task.cancel()
    return task

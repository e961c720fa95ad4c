"""Scheduling rules, driven without a model: a chunk that completes a sequence 'samples' token 7."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_node.engine.block_manager import BlockManager
from regional_node.engine.errors import RequestTooLargeError
from regional_node.engine.fairness import VirtualTokenCounter
from regional_node.engine.scheduler import Scheduler, SchedulerOutput
from regional_node.engine.sequence import Sequence, SequenceStatus

_ids = itertools.count()


def make_seq(
    prompt_len: int, max_tokens: int = 4, tenant: str = "default", priority: str = "interactive"
) -> Sequence:
    n = next(_ids)
    return Sequence(
        request_id=f"r{n}",
        token_ids=[(n * 31 + i) % 1000 for i in range(prompt_len)],
        num_prompt_tokens=prompt_len,
        max_tokens=max_tokens,
        tenant=tenant,
        priority=priority,  # type: ignore[arg-type]
        arrival=n,
    )


def make_scheduler(
    num_blocks: int = 64, block_size: int = 4, budget: int = 64, max_seqs: int = 16
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, block_size), max_num_seqs=max_seqs, max_num_batched_tokens=budget
    )


def fake_step(s: Scheduler, sampled: list[Sequence] | None = None) -> tuple[SchedulerOutput, list[Sequence]]:
    """One scheduled step with a stand-in model; returns the output and the sequences that finished.

    Sequences that got a token are appended to `sampled` when given."""
    out = s.schedule()
    s.step_done(out)
    finished = []
    for chunk in out.chunks:
        if chunk.completes:
            if sampled is not None:
                sampled.append(chunk.seq)
            chunk.seq.token_ids.append(7)
            if chunk.seq.num_output_tokens >= chunk.seq.max_tokens:
                s.finish(chunk.seq)
                finished.append(chunk.seq)
    return out, finished


def drive(
    s: Scheduler, pending: list[Sequence], arrive_every: int, finished: list[Sequence]
) -> Iterator[SchedulerOutput]:
    """Add `pending` one every `arrive_every` steps (0: one a step) and step until every request
    finished (appended to `finished`); yields each step's output. A request too large for the
    pool must be refused when added, and only such a one."""
    for step in range(20_000):
        if pending and (arrive_every == 0 or step % arrive_every == 0):
            seq = pending.pop(0)
            try:
                s.add(seq)
            except RequestTooLargeError:
                assert s.blocks.blocks_for(seq.max_total_tokens) > s.blocks.num_blocks
        if not pending and not s.has_unfinished():
            return
        out, done = fake_step(s)
        finished += done
        yield out
    raise AssertionError("did not drain")


def run_to_completion(s: Scheduler, max_steps: int = 10_000) -> int:
    for step in range(max_steps):
        if not s.has_unfinished():
            return step
        fake_step(s)
    raise AssertionError("scheduler did not drain: deadlock or starvation")


def test_request_that_can_never_fit_fails_when_added() -> None:
    s = make_scheduler(num_blocks=4, block_size=4)
    with pytest.raises(RequestTooLargeError, match="KV blocks"):
        s.add(make_seq(prompt_len=15, max_tokens=3))  # 17 tokens of KV > 16 slots
    s.add(make_seq(prompt_len=14, max_tokens=3))  # exactly 16: fits alone
    assert run_to_completion(s) > 0


def test_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    s = make_scheduler(budget=8)
    batch = make_seq(3, max_tokens=20, priority="batch")
    s.add(batch)
    fake_step(s)  # decoding from now on
    long = make_seq(30, priority="interactive")  # runs ahead of the batch sequence...
    s.add(long)
    starts = []
    for _ in range(5):
        out, _ = fake_step(s)
        assert out.num_batched_tokens <= 8
        assert any(c.seq is batch and c.num_tokens == 1 for c in out.chunks)  # ...which still decodes
        starts += [c.start for c in out.chunks if c.seq is long]
    assert starts == [0, 7, 14, 21, 28]


def test_interactive_admitted_before_batch() -> None:
    s = make_scheduler(max_seqs=1)
    batch = make_seq(4, tenant="a", priority="batch")
    inter = make_seq(4, tenant="b", priority="interactive")
    s.add(batch)
    s.add(inter)
    out, _ = fake_step(s)
    assert [c.seq for c in out.chunks] == [inter]


def test_preemption_takes_lowest_priority_most_recent_and_keeps_generated_tokens() -> None:
    s = make_scheduler(num_blocks=8, block_size=4, budget=64)
    old = make_seq(7, max_tokens=10, priority="batch")
    inter = make_seq(7, max_tokens=10, priority="interactive")
    new_batch = make_seq(3, max_tokens=10, priority="batch")
    s.add(old)
    fake_step(s)
    s.add(inter)
    fake_step(s)
    s.add(new_batch)
    fake_step(s)
    assert new_batch.status is SequenceStatus.RUNNING
    victims: list[Sequence] = []
    while not victims:
        out, _ = fake_step(s)
        victims = out.preempted
    assert victims[0] is new_batch
    assert new_batch.status is SequenceStatus.WAITING
    assert new_batch.num_output_tokens >= 1  # generated tokens are kept and recomputed
    assert s.stats.num_preemptions >= 1
    run_to_completion(s)
    assert s.blocks.num_used_blocks == 0


def test_heavy_tenant_cannot_starve_a_light_one() -> None:
    s = make_scheduler(num_blocks=400, budget=64, max_seqs=8)
    heavy = [make_seq(8, max_tokens=8, tenant="A") for _ in range(100)]
    for seq in heavy:
        s.add(seq)
    for _ in range(3):
        fake_step(s)
    light = [make_seq(8, max_tokens=8, tenant="B") for _ in range(5)]
    for seq in light:
        s.add(seq)
    heavy_done = 0
    first_token: set[str] = set()
    while len(first_token & {q.request_id for q in light}) < len(light):
        sampled: list[Sequence] = []
        _, finished = fake_step(s, sampled)
        first_token |= {q.request_id for q in sampled}
        heavy_done += sum(1 for q in finished if q.tenant == "A")
    assert heavy_done < 50


def test_returning_tenant_is_lifted_and_cannot_bank_credit() -> None:
    s = make_scheduler(num_blocks=400, budget=32, max_seqs=4)
    for _ in range(20):
        s.add(make_seq(8, tenant="A"))
    for _ in range(10):
        fake_step(s)
    s.add(make_seq(8, tenant="B"))
    assert s.fairness.counter("B") == s.fairness.counter("A")


def test_fairness_forgets_one_off_tenants() -> None:
    s = make_scheduler(num_blocks=400, budget=32, max_seqs=4)
    for i in range(500):
        s.add(make_seq(8, max_tokens=2, tenant=f"one-off-{i}"))
        run_to_completion(s)
    assert len(s.fairness._counters) <= 64 + 1


def test_fairness_forgets_idle_tenants_once_the_active_ones_pass_them() -> None:
    s = make_scheduler(num_blocks=400, budget=32, max_seqs=4)
    s.add(make_seq(8, max_tokens=1000, tenant="steady"))
    for i in range(300):
        s.add(make_seq(8, max_tokens=2, tenant=f"one-off-{i}"))
        for _ in range(3):
            fake_step(s)
    assert len(s.fairness._counters) <= 2 * 1 + 64 + 1


def test_forgetting_idle_tenants_keeps_a_heavy_tenants_debt() -> None:
    vtc = VirtualTokenCounter()
    vtc.arrive("heavy")
    vtc.arrive("light")
    vtc.charge("heavy", 1000, 0)
    vtc.depart("heavy")
    for i in range(200):
        vtc.arrive(f"one-off-{i}")
        vtc.depart(f"one-off-{i}")
    vtc.arrive("heavy")
    assert vtc.counter("heavy") == 1000


def test_aborting_waiting_and_running_frees_everything() -> None:
    s = make_scheduler()
    running, waiting = make_seq(9), make_seq(9)
    s.add(running)
    fake_step(s)
    s.add(waiting)
    s.finish(running)
    s.finish(waiting)
    assert not s.has_unfinished()
    assert s.blocks.num_used_blocks == 0
    assert len(s.waiting) == 0 and s.waiting.num_tokens == 0


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.integers(1, 40),
            st.integers(1, 12),
            st.sampled_from(["interactive", "batch"]),
            st.sampled_from("abc"),
        ),
        min_size=1,
        max_size=25,
    ),
    num_blocks=st.integers(13, 40),
    budget=st.integers(1, 48),
    max_seqs=st.integers(1, 8),
    arrive_every=st.integers(0, 3),
)
def test_budget_respected_no_deadlock_and_no_leak(
    requests: list[tuple[int, int, str, str]], num_blocks: int, budget: int, max_seqs: int, arrive_every: int
) -> None:
    s = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget, max_seqs=max_seqs)
    pending = [make_seq(p, m, tenant=t, priority=pr) for p, m, pr, t in requests]
    finished: list[Sequence] = []
    for out in drive(s, pending, arrive_every, finished):
        assert out.num_batched_tokens <= budget
        assert len(s.running) <= max_seqs
        assert len({c.seq.request_id for c in out.chunks}) == len(out.chunks)
        for seq in s.running:  # every running sequence's KV fits in its own block table
            assert len(seq.block_table) * 4 >= seq.num_computed_tokens
    assert all(q.num_output_tokens == q.max_tokens for q in finished)
    assert s.blocks.num_used_blocks == 0
    assert all(r == 0 for r in s.blocks.ref_counts)


def _threshold_scheduler(threshold: int, budget: int = 64, num_blocks: int = 128) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, 4, enable_prefix_caching=True),
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
    )


def test_a_cached_prompt_starts_beside_a_long_prefill_not_after_it() -> None:
    """Partial prefills: a request whose prompt is mostly cached gets its first token while
    another tenant's cold prompt is still being prefilled, where it used to wait for all of it."""
    s = _threshold_scheduler(threshold=16)
    warm_first = make_seq(40, max_tokens=1, tenant="warm")
    s.add(warm_first)
    run_to_completion(s)  # its 40 tokens are cached now (9 full blocks)
    cold = make_seq(120, max_tokens=1, tenant="cold")
    s.add(cold)
    out, _ = fake_step(s)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(cold, 16)]  # capped at the threshold
    warm = Sequence("w2", [*warm_first.token_ids[:40], 5, 6], 42, 1, tenant="warm", arrival=10_000)
    s.add(warm)
    sampled: list[Sequence] = []
    fake_step(s, sampled)
    assert warm in sampled  # its 6 uncached tokens went beside the cold chunk
    assert cold.num_uncomputed_tokens > 16


def test_one_long_prefill_at_a_time_and_the_next_starts_when_it_is_done() -> None:
    s = _threshold_scheduler(threshold=16)
    first, second = make_seq(60, max_tokens=1, tenant="a"), make_seq(60, max_tokens=1, tenant="b")
    s.add(first)
    s.add(second)
    steps_with_second = []
    for step in range(10):
        out, _ = fake_step(s)
        assert all(c.num_tokens <= 16 for c in out.chunks)
        assert sum(seq.num_uncomputed_tokens > 1 for seq in s.running) <= 1  # one prompt in progress
        if any(c.seq is second for c in out.chunks):
            steps_with_second.append(step)
    # first: 16 + 16 + 16 + 12 (steps 0-3; its last chunk leaves room, so second starts in step 3)
    assert steps_with_second[0] == 3


def test_without_a_threshold_a_prefill_takes_the_whole_budget() -> None:
    s = _threshold_scheduler(threshold=0)
    cold, short = make_seq(120, max_tokens=1, tenant="a"), make_seq(4, max_tokens=1, tenant="b")
    s.add(cold)
    s.add(short)
    out, _ = fake_step(s)
    assert [(c.seq, c.num_tokens) for c in out.chunks] == [(cold, 64)]


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 6), st.sampled_from("abc"), st.booleans()),
        min_size=1,
        max_size=20,
    ),
    threshold=st.integers(1, 24),
    budget=st.integers(1, 48),
    num_blocks=st.integers(20, 60),
)
def test_partial_prefills_respect_the_threshold_and_drain(
    requests: list[tuple[int, int, str, bool]], threshold: int, budget: int, num_blocks: int
) -> None:
    """Whatever arrives: no prefill chunk over the threshold, at most one sequence with more than
    a threshold of prompt left, every request finished, no block leaked (prefix hits included:
    `shared` requests start with one common 24-token prefix)."""
    s = Scheduler(
        BlockManager(num_blocks, 4, enable_prefix_caching=True),
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
    )
    common = [900 + i for i in range(24)]
    pending = []
    for i, (prompt, max_tokens, tenant, shared) in enumerate(requests):
        tokens = (common if shared else []) + [(i * 37 + j) % 800 for j in range(prompt)]
        pending.append(Sequence(f"p{i}", tokens, len(tokens), max_tokens, tenant=tenant, arrival=i))
    finished: list[Sequence] = []
    for out in drive(s, pending, 2, finished):
        assert out.num_batched_tokens <= budget
        assert all(c.num_tokens <= threshold for c in out.chunks)
        assert sum(seq.num_uncomputed_tokens > threshold for seq in s.running) <= 1
    assert all(q.num_output_tokens == q.max_tokens for q in finished)
    assert s.blocks.num_used_blocks == 0

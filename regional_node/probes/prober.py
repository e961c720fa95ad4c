"""Running a model's golden probes on its engine: once before the node is ready, then on a schedule.

Probes are ordinary engine requests at the lowest traffic tier ("batch", tenant `meridian-probe`),
so the scheduler never runs them ahead of a waiting interactive request, and a full batch queue
skips the round instead of displacing real work (a skipped round is neither a pass nor a
failure). Their cost is bounded: the next round starts no sooner than `interval_s` after the
last, and no sooner than its duration / `max_share`, so probing takes at most `max_share` of the
engine's time (1% by default) however slow the model is.

A failed round marks the model failing: the node refuses its requests (503) and reports it in
/ready, /load, Consul meta and metrics, and the gateway stops routing it there. The next round
that passes brings it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from regional_node.probes.golden import GoldenSet, ProbeOutput, Verdict, compare

if TYPE_CHECKING:
    from regional_node.server.node_engine import NodeEngine

logger = logging.getLogger(__name__)

PROBE_TENANT = "meridian-probe"
PROBE_TIER = "batch"

# none: no golden file (not probed); pending: the first round has not finished.
ProbeStatus = Literal["none", "pending", "passed", "failed"]


@dataclass
class ProbeState:
    status: ProbeStatus = "none"
    rounds: int = 0
    failures: int = 0  # failed rounds since the node started
    last_success: float | None = None  # Unix time of the last round that passed
    last_run: float | None = None
    detail: str = ""

    @property
    def failing(self) -> bool:
        return self.status == "failed"

    @property
    def serves(self) -> bool:
        """Passed its last round, or has no golden file: a model not yet verified does not serve."""
        return self.status in ("passed", "none")


async def answer_cases(
    engine: NodeEngine,
    prompts: list[tuple[str, list[int] | None]],
    max_tokens: list[int],
    *,
    concurrent: bool = True,
    tag: str = "probe",
) -> list[ProbeOutput]:
    """Greedy answers to `prompts` ((text, ids) pairs: ids win when given) of `max_tokens` each,
    at the lowest tier; all at once (one batch, as traffic runs) or one after another."""
    from regional_node.engine import SamplingParams

    tokenizer = engine.tokenizer

    async def one(index: int, text: str, ids: list[int] | None, tokens: int) -> ProbeOutput:
        prompt_ids = ids if ids is not None else (tokenizer.encode(text) if tokenizer is not None else [])
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, logprobs=True)
        token_ids: list[int] = []
        logprobs: list[float] = []
        stream = engine.generate(
            list(prompt_ids),
            params,
            request_id=f"meridian-{tag}-{index}-{time.monotonic_ns()}",
            tenant=PROBE_TENANT,
            priority=PROBE_TIER,
        )
        async for delta in stream:
            token_ids += delta.new_token_ids
            logprobs += delta.new_logprobs
        return ProbeOutput(list(prompt_ids), token_ids, logprobs)

    jobs = [one(i, text, ids, n) for i, ((text, ids), n) in enumerate(zip(prompts, max_tokens, strict=True))]
    if concurrent:
        return list(await asyncio.gather(*jobs))
    return [await job for job in jobs]


class ModelProber:
    """One model's golden probes and their latest result."""

    def __init__(self, model: str, golden: GoldenSet | None, *, interval_s: float, max_share: float) -> None:
        self.model = model
        self.golden = golden
        self.interval_s = interval_s
        self.max_share = max_share
        self.state = ProbeState(status="pending" if golden is not None else "none")
        self._last_duration_s = 0.0

    async def run(self, engine: NodeEngine) -> Verdict | None:
        """One round; None when it was skipped (the batch queue is full) or there is no golden."""
        from regional_node.engine.errors import QueueFullError

        golden = self.golden
        if golden is None:
            return None
        started = time.monotonic()
        cases = golden.cases
        try:
            outputs = await answer_cases(
                engine,
                [(case.prompt, case.prompt_token_ids if not case.prompt else None) for case in cases],
                [len(case.token_ids) for case in cases],
            )
        except QueueFullError:
            return None
        except Exception as exc:  # a failing engine fails its probe: that is what probes are for
            verdict = Verdict(False, f"probe request failed: {type(exc).__name__}: {exc}")
        else:
            verdict = compare(golden, outputs)
        self._last_duration_s = time.monotonic() - started
        self._record(verdict)
        return verdict

    @property
    def last_duration_s(self) -> float:
        """How long the last round took (0 before the first)."""
        return self._last_duration_s

    def next_delay_s(self) -> float:
        """Seconds until the next round: the interval, stretched so probes stay within max_share."""
        return max(self.interval_s, self._last_duration_s / self.max_share)

    async def schedule(self, engine: NodeEngine) -> None:
        """Rounds forever (cancel to stop); one that raises is logged and the schedule goes on."""
        if self.golden is None:
            return
        while True:
            await asyncio.sleep(self.next_delay_s())
            try:
                await self.run(engine)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("probe round for %s failed to run", self.model)

    def _record(self, verdict: Verdict) -> None:
        state = self.state
        state.rounds += 1
        state.last_run = time.time()
        state.detail = verdict.detail
        was = state.status
        if verdict.passed:
            state.status = "passed"
            state.last_success = state.last_run
        else:
            state.status = "failed"
            state.failures += 1
        if was != state.status:
            log = logger.info if verdict.passed else logger.error
            log("golden probe for %s %s: %s", self.model, state.status, verdict.detail)

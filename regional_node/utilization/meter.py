"""Per-model utilization, fed by the engine after every step (LLMEngine.step_observers).

`step_done` runs on the engine's step thread and does a few multiplications; readers (/metrics)
on other threads take a lock-protected summary. Utilization is over the steps of the last
`window_s` seconds, per phase: the phase's FLOPs / (peak FLOP/s x the phase's step time), and
its bytes moved / (peak bytes/s x the same time). A phase with no step in the window reads 0.
Running totals (time, tokens, FLOPs, bytes per phase) back counters, so dashboards can take
rates over any range.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from regional_node.utilization.peak import Peak
from regional_node.utilization.work import PHASES, Chunk, ModelShape, Phase, StepWork, step_work

WINDOW_S = 60.0


@dataclass
class PhaseTotals:
    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    bytes: float = 0.0

    def add(self, work: StepWork, seconds: float) -> None:
        self.seconds += seconds
        self.tokens += work.tokens
        self.flops += work.flops
        self.bytes += work.bytes


@dataclass(frozen=True)
class PhaseUtilization:
    mfu: float
    mbu: float


@dataclass
class UtilizationReport:
    peak: Peak
    utilization: dict[Phase, PhaseUtilization]
    totals: dict[Phase, PhaseTotals] = field(default_factory=dict)


def utilization(flops: float, moved: float, seconds: float, peak: Peak) -> PhaseUtilization:
    if seconds <= 0:
        return PhaseUtilization(0.0, 0.0)
    return PhaseUtilization(flops / (peak.flops_per_s * seconds), moved / (peak.bytes_per_s * seconds))


class UtilizationMeter:
    def __init__(self, shape: ModelShape, peak: Peak, *, window_s: float = WINDOW_S) -> None:
        self.shape = shape
        self.peak = peak
        self.window_s = window_s
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, StepWork, float]] = deque()  # (ended, work, seconds)
        self._totals = {phase: PhaseTotals() for phase in PHASES}

    def step_done(self, chunks: Iterable[Any], started: float, ended: float) -> None:
        """One engine step's scheduled chunks (ScheduledChunk) and its monotonic start and end."""
        work = step_work(
            self.shape,
            (
                Chunk(
                    start=c.start,
                    num_tokens=c.num_tokens,
                    sampled=c.completes,
                    decode=c.num_tokens == 1 and c.start >= c.seq.num_prompt_tokens,
                )
                for c in chunks
            ),
        )
        self.record(work, ended - started, ended)

    def record(self, work: StepWork, seconds: float, ended: float) -> None:
        with self._lock:
            self._recent.append((ended, work, seconds))
            self._totals[work.phase].add(work, seconds)
            self._prune(ended)

    def report(self, now: float | None = None) -> UtilizationReport:
        now = time.monotonic() if now is None else now
        window = {phase: PhaseTotals() for phase in PHASES}
        with self._lock:
            self._prune(now)
            for _, work, seconds in self._recent:
                window[work.phase].add(work, seconds)
            totals = {phase: PhaseTotals(**vars(t)) for phase, t in self._totals.items()}
        return UtilizationReport(
            peak=self.peak,
            utilization={p: utilization(w.flops, w.bytes, w.seconds, self.peak) for p, w in window.items()},
            totals=totals,
        )

    def _prune(self, now: float) -> None:
        recent = self._recent
        while recent and recent[0][0] < now - self.window_s:
            recent.popleft()

"""What one system's run produced: per-token times and the generated ids (for a cross-check)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_bench.timing import RunSummary, TokenTimes, summarise


@dataclass
class RunResult:
    timelines: list[TokenTimes]
    wall_s: float
    # CPU seconds of the whole process (all threads) over the same span: with one torch thread this
    # is the throughput measure least disturbed by other work on a shared machine.
    cpu_s: float
    output_ids: dict[str, list[int]]
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> RunSummary:
        return summarise(self.timelines, self.wall_s)

    def report(self) -> dict[str, Any]:
        tokens = sum(len(t.times) for t in self.timelines)
        return {
            **self.summary().as_dict(),
            "cpu_s": round(self.cpu_s, 6),
            "output_tokens_per_cpu_s": round(tokens / self.cpu_s, 3),
            "details": self.details,
        }


def token_agreement(a: RunResult, b: RunResult) -> float:
    """Fraction of requests whose greedy tokens are identical in both runs."""
    same = sum(a.output_ids[rid] == b.output_ids.get(rid) for rid in a.output_ids)
    return same / len(a.output_ids)

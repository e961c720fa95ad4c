"""Per-token timestamps of one run, and the throughput / TTFT / ITL summary built from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class TokenTimes:
    """When each output token of one request became available, in seconds since all requests arrived."""

    request_id: str
    times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.times[0]

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


@dataclass(frozen=True)
class RunSummary:
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            key: round(value, 6) if isinstance(value, float) else value for key, value in asdict(self).items()
        }


def summarise(timelines: list[TokenTimes], wall_s: float) -> RunSummary:
    """Percentiles over requests (TTFT) and over every inter-token gap of every request (ITL)."""
    assert timelines and all(t.times for t in timelines), "every request must have produced a token"
    ttfts = np.array([t.ttft for t in timelines])
    gaps = np.array([gap for t in timelines for gap in t.gaps()] or [0.0])
    tokens = sum(len(t.times) for t in timelines)
    return RunSummary(
        output_tokens=tokens,
        wall_s=wall_s,
        output_tokens_per_s=tokens / wall_s,
        ttft_p50_s=float(np.percentile(ttfts, 50)),
        ttft_p99_s=float(np.percentile(ttfts, 99)),
        itl_p50_s=float(np.percentile(gaps, 50)),
        itl_p99_s=float(np.percentile(gaps, 99)),
    )

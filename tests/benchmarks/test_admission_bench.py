"""benchmarks/admission.py's pure parts: arrivals, a run's summary, capacity from the sweep, the
estimate-error histogram's quantiles and the goals. (The benchmark itself runs for minutes on
real processes, so it is not run here.)"""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # The script imports its helpers as `gateway_bench.*`, as it does when run from benchmarks/.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import admission

    return admission


def test_poisson_arrivals_stay_in_the_window_in_order_at_about_the_rate(bench: ModuleType) -> None:
    times = bench.poisson_arrivals(50.0, 20.0, random.Random(1))
    assert times == sorted(times) and all(0 <= t < 20.0 for t in times)
    assert 900 <= len(times) <= 1100
    assert bench.poisson_arrivals(0.0, 20.0, random.Random(1)) == []


def test_summary_counts_goodput_within_target_and_sheds_apart_from_errors(bench: ModuleType) -> None:
    outcomes = [
        bench.Outcome("interactive", 0.0, 0.0, 200, "", 0.2),
        bench.Outcome("interactive", 0.1, 0.0, 200, "", 0.7),  # served, late: not goodput
        bench.Outcome("interactive", 0.2, 0.0, 429, "overloaded", None),
        bench.Outcome("interactive", 0.3, 0.0, 429, "upstream_capacity", None),
        bench.Outcome("interactive", 0.4, 0.0, 0, "timeout", None),
    ]
    row = bench.summarize(outcomes, duration_s=2.0, target_s=0.5)
    assert row["requests"] == 5 and row["served"] == 2
    assert row["offered_rps"] == 2.5 and row["goodput_rps"] == 0.5
    assert row["shed_share"] == 0.2
    assert row["errors"] == 2
    assert row["outcomes"] == {"0:timeout": 1, "429:overloaded": 1, "429:upstream_capacity": 1, "ok": 2}


def test_capacity_is_the_last_rate_before_the_first_miss(bench: ModuleType) -> None:
    def row(rate: float, p90: float | None, errors: int = 0) -> dict[str, object]:
        return {"rate_rps": rate, "ttft_p90_s": p90, "errors": errors, "served": 10, "requests": 10}

    assert bench.capacity_from_sweep([row(5, 0.1), row(8, 0.4), row(11, 0.6), row(14, 0.3)], 0.5) == 8
    assert bench.capacity_from_sweep([row(5, 0.1), row(8, 0.2, errors=1)], 0.5) == 5
    assert bench.capacity_from_sweep([row(5, 0.9)], 0.5) is None
    # A rate tried again after a miss holds if the second try does.
    assert (
        bench.capacity_from_sweep([row(5, 0.1), row(8, 0.9), row(8, 0.3), row(11, 0.7), row(11, 0.8)], 0.5)
        == 8
    )


def test_latency_quantiles_interpolate_from_zero(bench: ModuleType) -> None:
    q = bench.latency_quantiles({0.1: 50.0, 0.5: 100.0, math.inf: 100.0})
    assert q["count"] == 100 and q["p50_s"] == pytest.approx(0.1) and 0.49 < q["p99_s"] <= 0.5


METRICS = """\
# HELP meridian_gateway_admission_estimate_error_seconds Observed minus estimate.
# TYPE meridian_gateway_admission_estimate_error_seconds histogram
{buckets}
meridian_gateway_admission_estimate_error_seconds_count{{model="m",tier="interactive"}} 10.0
"""


def _metrics(counts: dict[str, float]) -> str:
    lines = [
        f'meridian_gateway_admission_estimate_error_seconds_bucket{{le="{le}",model="m",tier="interactive"}} {n}'
        for le, n in counts.items()
    ]
    lines.append(
        'meridian_gateway_admission_estimate_error_seconds_bucket{le="+Inf",model="m",tier="batch"} 3.0'
    )
    return METRICS.format(buckets="\n".join(lines))


def test_estimate_error_quantiles_from_signed_buckets(bench: ModuleType) -> None:
    # Ten errors: 4 in (-0.1, -0.05], 4 in (0, 0.01], 2 in (0.25, 0.5].
    cumulative = {"-0.5": 0, "-0.1": 0, "-0.05": 4, "0.0": 4, "0.01": 8, "0.05": 8, "0.1": 8, "0.25": 8}
    cumulative.update({"0.5": 10, "+Inf": 10})
    buckets = bench.histogram_buckets(
        _metrics(cumulative), bench.ESTIMATE_METRIC, {"model": "m", "tier": "interactive"}
    )
    assert buckets[math.inf] == 10 and buckets[-0.05] == 4
    before = {le: 0.0 for le in buckets}
    q = bench.error_quantiles(bench.bucket_delta(buckets, before))
    assert q["count"] == 10
    assert q["p50_s"] == pytest.approx(0.0025)  # the 5th of 10 is the first in (0, 0.01]
    assert 0.25 < q["p90_s"] <= 0.5
    # |error| <= 0.01: 4; <= 0.1: 8; <= 0.5: 10.
    assert 0.01 < q["abs_p50_s"] <= 0.1 and 0.25 < q["abs_p90_s"] <= 0.5
    assert q["share_over_estimate"] == pytest.approx(0.6)
    assert bench.error_quantiles({})["abs_p50_s"] is None


def test_goals_compare_goodput_at_twice_capacity_and_the_idle_burst(bench: ModuleType) -> None:
    def run(factor: float, admission: str, goodput: float, p99: float) -> dict[str, object]:
        return {
            "factor": factor,
            "admission": admission,
            "interactive": {"goodput_rps": goodput, "ttft_p99_s": p99},
        }

    report = {
        "capacity": {"rps": 10.0},
        "conditions": {"target_s": 0.5},
        "runs": [run(2.0, "off", 1.0, 9.0), run(2.0, "on", 9.5, 0.45)],
        "idle_burst": {"requests": 16, "served": 16},
    }
    goals = bench.goals(report)
    assert all(goal["holds"] for goal in goals.values())
    report["runs"][1] = run(2.0, "on", 8.0, 0.6)
    report["idle_burst"] = {"requests": 16, "served": 15}
    assert not any(goal["holds"] for goal in bench.goals(report).values())

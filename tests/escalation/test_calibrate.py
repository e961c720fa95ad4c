"""`meridian escalation calibrate`: the per-threshold replay (pure), and the tool against a real
federation (node processes and a gateway started here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from meridian.cli import main
from meridian.escalation.calibrate import (
    Answer,
    CalibrationError,
    Prices,
    PromptRun,
    load_prompts,
    threshold_rows,
)
from router.confidence import ConfidenceRule
from tests.gateway.conftest import EU_KEY, GLOBAL_KEY, RunningGateway, gateway_over, running_fleet

RULE = ConfidenceRule(k_tokens=4, window=2)
SURE = Answer("the cat sat", (-0.1, -0.2, -0.1, -0.3), prompt_tokens=10, completion_tokens=4)
UNSURE = Answer("cat the sat", (-4.0, -5.0, -3.0, -6.0), prompt_tokens=10, completion_tokens=4)
LARGE = Answer("the cat sat", (-0.1,) * 4, prompt_tokens=10, completion_tokens=4)
RUNS = [PromptRun("a", SURE, LARGE), PromptRun("b", UNSURE, LARGE)]


def test_a_threshold_below_every_score_keeps_everything_on_small() -> None:
    [row] = threshold_rows(RUNS, [-10.0], RULE, Prices())

    assert row.escalation_rate == 0.0
    assert row.served_matches_large == 0.5 and row.kept_small_matches_large == 0.5
    assert row.large_tokens == 0 and row.small_tokens_wasted == 0


def test_a_threshold_between_the_scores_escalates_only_the_unsure_prompt() -> None:
    [row] = threshold_rows(RUNS, [-2.0], RULE, Prices())

    assert row.escalation_rate == 0.5
    assert row.served_matches_large == 1.0 and row.kept_small_matches_large == 1.0
    assert row.large_tokens == 14 and row.small_tokens_wasted == 14


def test_in_tokens_escalation_only_wastes_and_with_prices_a_cheap_small_tier_saves() -> None:
    tokens, priced = (
        threshold_rows(RUNS, [-2.0], RULE, prices)[0] for prices in (Prices(), Prices(0.1, 0.1, 1.0, 1.0))
    )

    assert tokens.cost_saved == pytest.approx(-0.014)  # the unsure prompt's small tokens, wasted
    # Always large: 2 x 14 tokens at 1.0; the cascade: 14 small at 0.1, 14 wasted at 0.1, 14 large.
    assert priced.cost_saved == pytest.approx(0.028 - (0.0014 + 0.0014 + 0.014))
    assert priced.cost_saved_share > 0


def test_escalating_everything_serves_the_large_answers() -> None:
    [row] = threshold_rows(RUNS, [0.0], RULE, Prices())

    assert row.escalation_rate == 1.0 and row.served_matches_large == 1.0
    assert row.kept_small_matches_large is None


def test_the_prompts_file_takes_prompts_or_messages_and_names_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"id": "x", "prompt": "Hi", "max_tokens": 3}\n\n{"messages": [{"role": "user", "content": "Yo"}]}\n'
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Hi"}\n{"text": "no"}\n')

    prompts = load_prompts(good)
    assert [p.id for p in prompts] == ["x", "3"] and prompts[0].body == {"prompt": "Hi", "max_tokens": 3}
    with pytest.raises(
        CalibrationError, match=r"bad.jsonl:2: expected an object with either 'prompt' or 'messages'"
    ):
        load_prompts(bad)


def test_the_shipped_prompts_file_loads() -> None:
    shipped = Path(__file__).parents[2] / "benchmarks" / "data" / "escalation_prompts.jsonl"

    assert len(load_prompts(shipped)) >= 20


# -- against a real federation ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    models = {"meridian-small": (llama_checkpoint, "small"), "meridian-large": (qwen2_checkpoint, "large")}
    with running_fleet([("eu-west-1", "eu-west", "eu")], models, tmp_path_factory.mktemp("logs")) as nodes:
        with gateway_over(nodes, tmp_path_factory.mktemp("gw")) as running:
            yield running


def calibrate(gw: RunningGateway, tmp_path: Path, *thresholds: str) -> dict:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"id": "p1", "prompt": "The harbour at dawn"}\n'
        '{"id": "p2", "messages": [{"role": "user", "content": "Hello there"}]}\n'
        '{"id": "p3", "prompt": "Prove it step by step", "max_tokens": 5}\n'
    )
    report = tmp_path / "report.json"
    argv = ["escalation", "calibrate", "--prompts", str(prompts), "--small", "meridian-small"]
    argv += ["--large", "meridian-large", "--gateway", gw.url, "--api-key", GLOBAL_KEY, "--max-tokens", "8"]
    argv += ["--json", str(report), "--thresholds", *thresholds]
    assert main(argv) == 0
    return json.loads(report.read_text())


def test_calibration_runs_both_tiers_greedy_and_reports_every_threshold(
    gw: RunningGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = calibrate(gw, tmp_path, "-1000", "0")

    low, high = report["thresholds"]
    assert (low["threshold"], low["escalation_rate"]) == (-1000.0, 0.0)
    assert (high["escalation_rate"], high["served_matches_large"]) == (1.0, 1.0)
    assert high["large_tokens"] > 0 and high["small_tokens_wasted"] > 0
    assert report["cost_unit"] == "tokens" and len(report["prompts"]) == 3
    assert all(p["small"] and p["large"] and p["score"] < 0 for p in report["prompts"])
    assert "threshold" in capsys.readouterr().out


def test_calibration_replays_the_small_models_greedy_answer(gw: RunningGateway, tmp_path: Path) -> None:
    report = calibrate(gw, tmp_path, "-2")
    direct = httpx.post(
        gw.url + "/v1/completions",
        headers={"authorization": f"Bearer {GLOBAL_KEY}"},
        json={"model": "meridian-small", "prompt": "The harbour at dawn", "max_tokens": 8, "temperature": 0},
        timeout=30,
    ).json()

    assert report["prompts"][0]["small"] == direct["choices"][0]["text"]


def test_calibration_against_an_unknown_model_fails_with_the_gateways_answer(
    gw: RunningGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hi"}\n')
    argv = [
        "escalation",
        "calibrate",
        "--prompts",
        str(prompts),
        "--small",
        "nope",
        "--large",
        "meridian-large",
    ]

    assert main([*argv, "--gateway", gw.url, "--api-key", GLOBAL_KEY]) == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_auto_decisions_are_counted_by_start_tier_and_rule(gw: RunningGateway) -> None:
    before = gw.metric(
        "meridian_gateway_auto_decisions_total", tenant="t-global", start_tier="large", reason="classifier"
    )
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {GLOBAL_KEY}"},
        json={
            "model": "auto",
            "messages": [{"role": "user", "content": "Prove, step by step, that 3 * 5 = 15."}],
            "max_tokens": 4,
        },
        timeout=30,
    )

    assert response.status_code == 200 and response.headers["x-meridian-model"] == "meridian-large"
    assert response.headers["x-meridian-route"].startswith("auto:large;classifier=")
    after = gw.metric(
        "meridian_gateway_auto_decisions_total", tenant="t-global", start_tier="large", reason="classifier"
    )
    assert after == before + 1


def test_a_tenant_in_its_thrash_cool_down_starts_large_and_the_route_says_why(gw: RunningGateway) -> None:
    guard = gw.gateway.pipeline.escalations
    for _ in range(gw.gateway.config.auto.thrash.min_requests):
        guard.record("t-eu", "meridian-small", escalated=True)
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {EU_KEY}"},
        json={"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )

    assert response.headers["x-meridian-model"] == "meridian-large"
    assert response.headers["x-meridian-route"].startswith("auto:large;thrash_cooldown=rate:1.00;")
    assert (
        gw.metric(
            "meridian_gateway_auto_decisions_total",
            tenant="t-eu",
            start_tier="large",
            reason="thrash_cooldown",
        )
        == 1
    )

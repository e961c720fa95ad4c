"""Calibrating the confidence threshold for a model pair: what each threshold would have done.

Every prompt runs once on each tier of a running federation, through the gateway's OpenAI API
(greedy, logprobs on). Then, for each candidate threshold, the cascade's rule (router.confidence)
is replayed on the small model's first K logprobs, and the row says what that threshold costs and
buys over the prompt set:

- escalation_rate: the share of prompts that would have gone on to the large tier;
- served_matches_large: the share whose served answer equals the large model's (escalated ones
  do by construction; kept ones when the small answer is the same text);
- kept_small_matches_large: the same among the prompts the small tier kept (None: none kept);
- large_tokens / small_tokens_wasted: tokens the large tier serves, and tokens the small tier
  spends on requests it then gives up (prompt + the K judged tokens);
- cost_saved: against sending every prompt to the large tier, with per-token prices when given,
  else in tokens (which treats the tiers as equally priced: then it only counts what escalation
  wastes, and saving needs prices).

The replay is pure (`threshold_rows`), so it is tested without a federation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from router.confidence import ConfidenceRule, judge


class CalibrationError(Exception):
    """The prompts file or a tier's answers cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Prompt:
    id: str
    body: dict[str, Any]  # `messages` (chat) or `prompt` (completions), plus an optional max_tokens


@dataclass(frozen=True)
class Answer:
    text: str
    logprobs: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class PromptRun:
    id: str
    small: Answer
    large: Answer


@dataclass(frozen=True)
class Prices:
    """Per 1000 tokens, input and output, per tier; all 1.0 means "count tokens"."""

    small_in: float = 1.0
    small_out: float = 1.0
    large_in: float = 1.0
    large_out: float = 1.0

    @property
    def counts_tokens(self) -> bool:
        return self == Prices()


@dataclass(frozen=True)
class ThresholdRow:
    threshold: float
    escalation_rate: float
    served_matches_large: float
    kept_small_matches_large: float | None
    large_tokens: int
    small_tokens_wasted: int
    cost: float
    always_large_cost: float
    cost_saved: float  # always_large_cost - cost; negative: the cascade costs more
    cost_saved_share: float


@dataclass(frozen=True)
class Calibration:
    small: str
    large: str
    rule: ConfidenceRule
    prices: Prices
    rows: list[ThresholdRow]
    prompts: list[dict[str, Any]] = field(default_factory=list)  # per prompt: score, texts, match

    def to_json(self) -> dict[str, Any]:
        return {
            "small": self.small,
            "large": self.large,
            "rule": asdict(self.rule),
            "prices": None if self.prices.counts_tokens else asdict(self.prices),
            "cost_unit": "tokens" if self.prices.counts_tokens else "price units",
            "thresholds": [asdict(row) for row in self.rows],
            "prompts": self.prompts,
        }


def default_thresholds() -> list[float]:
    """-8.0 to 0.0 in steps of 0.5: from "escalate almost nothing" to "escalate everything"."""
    return [-8.0 + 0.5 * i for i in range(17)]


def load_prompts(path: Path) -> list[Prompt]:
    """JSONL, one object a line: {"prompt": "..."} or {"messages": [...]}, optionally "id" and
    "max_tokens". Blank lines are skipped."""
    prompts = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise CalibrationError(f"{path}:{number}: expected an object with either 'prompt' or 'messages'")
        body = {key: item[key] for key in ("prompt", "messages", "max_tokens") if key in item}
        prompts.append(Prompt(id=str(item.get("id", number)), body=body))
    if not prompts:
        raise CalibrationError(f"{path}: no prompts")
    return prompts


def threshold_rows(
    runs: Sequence[PromptRun], thresholds: Sequence[float], rule: ConfidenceRule, prices: Prices
) -> list[ThresholdRow]:
    """What each threshold would have done over `runs` (the module docstring defines each column)."""
    rows = []
    always_large = sum(_cost(r.large, prices.large_in, prices.large_out) for r in runs)
    for threshold in thresholds:
        at = replace(rule, threshold=threshold)
        escalated = kept_matching = matching = large_tokens = wasted = 0
        cost = 0.0
        for run in runs:
            small, large = run.small, run.large
            if judge(small.logprobs, at).escalate:
                escalated += 1
                matching += 1
                judged = min(at.k_tokens, small.completion_tokens)
                wasted += small.prompt_tokens + judged
                large_tokens += large.prompt_tokens + large.completion_tokens
                cost += (small.prompt_tokens * prices.small_in + judged * prices.small_out) / 1000
                cost += _cost(large, prices.large_in, prices.large_out)
            else:
                same = small.text.strip() == large.text.strip()
                matching += same
                kept_matching += same
                cost += _cost(small, prices.small_in, prices.small_out)
        n, kept = len(runs), len(runs) - escalated
        rows.append(
            ThresholdRow(
                threshold=threshold,
                escalation_rate=escalated / n if n else 0.0,
                served_matches_large=matching / n if n else 0.0,
                kept_small_matches_large=kept_matching / kept if kept else None,
                large_tokens=large_tokens,
                small_tokens_wasted=wasted,
                cost=round(cost, 6),
                always_large_cost=round(always_large, 6),
                cost_saved=round(always_large - cost, 6),
                cost_saved_share=(always_large - cost) / always_large if always_large else 0.0,
            )
        )
    return rows


def _cost(answer: Answer, price_in: float, price_out: float) -> float:
    return (answer.prompt_tokens * price_in + answer.completion_tokens * price_out) / 1000


def render_table(calibration: Calibration) -> str:
    rule = calibration.rule
    always = calibration.rows[0].always_large_cost if calibration.rows else 0.0
    unit = "thousand tokens" if calibration.prices.counts_tokens else "price units"
    lines = [
        f"{calibration.small} -> {calibration.large}: K={rule.k_tokens}, window={rule.window}, "
        f"mean_weight={rule.mean_weight}; always-large cost {always:.3f} ({unit})",
        f"{'threshold':>9}  {'escalate':>8}  {'= large':>7}  {'kept = large':>12}  "
        f"{'large tok':>9}  {'wasted tok':>10}  {'saved':>7}",
    ]
    for row in calibration.rows:
        kept = "-" if row.kept_small_matches_large is None else f"{row.kept_small_matches_large:.0%}"
        lines.append(
            f"{row.threshold:>9.2f}  {row.escalation_rate:>8.0%}  {row.served_matches_large:>7.0%}  "
            f"{kept:>12}  {row.large_tokens:>9}  {row.small_tokens_wasted:>10}  {row.cost_saved_share:>7.1%}"
        )
    return "\n".join(lines)


async def collect(
    gateway: str,
    api_key: str,
    prompts: Sequence[Prompt],
    *,
    small: str,
    large: str,
    max_tokens: int,
    concurrency: int = 4,
    timeout_s: float = 120.0,
) -> list[PromptRun]:
    """Each prompt on both tiers (greedy, logprobs on), `concurrency` requests at a time."""
    limit = asyncio.Semaphore(concurrency)
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=gateway.rstrip("/"), headers=headers, timeout=timeout_s) as client:

        async def ask(prompt: Prompt, model: str) -> Answer:
            async with limit:
                return await _ask(client, prompt, model, max_tokens)

        async def both(prompt: Prompt) -> PromptRun:
            small_answer, large_answer = await asyncio.gather(ask(prompt, small), ask(prompt, large))
            return PromptRun(prompt.id, small_answer, large_answer)

        return list(await asyncio.gather(*(both(p) for p in prompts)))


async def _ask(client: httpx.AsyncClient, prompt: Prompt, model: str, max_tokens: int) -> Answer:
    chat = "messages" in prompt.body
    body: dict[str, Any] = {"max_tokens": max_tokens, **prompt.body, "model": model, "temperature": 0}
    body["logprobs"] = True if chat else 0
    response = await client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    if response.status_code != 200:
        raise CalibrationError(
            f"prompt {prompt.id} on {model}: HTTP {response.status_code}: {response.text[:300]}"
        )
    data = response.json()
    choice, usage = data["choices"][0], data.get("usage") or {}
    if chat:
        text = choice["message"].get("content") or ""
        entries = (choice.get("logprobs") or {}).get("content") or []
        logprobs = tuple(float(e["logprob"]) for e in entries)
    else:
        text = choice.get("text") or ""
        logprobs = tuple(float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or [])
    if not logprobs and usage.get("completion_tokens"):
        raise CalibrationError(f"prompt {prompt.id} on {model}: the answer carries no logprobs")
    return Answer(text, logprobs, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))


def per_prompt(runs: Sequence[PromptRun], rule: ConfidenceRule) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        verdict = judge(run.small.logprobs, rule)
        out.append(
            {
                "id": run.id,
                "score": round(verdict.score, 4),
                "mean": round(verdict.mean, 4),
                "window_min": round(verdict.window_min, 4),
                "small_matches_large": run.small.text.strip() == run.large.text.strip(),
                "small": run.small.text,
                "large": run.large.text,
            }
        )
    return out

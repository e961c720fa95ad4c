"""Continuing a stream from any point: the client's text so far plus the continuation's text is
exactly the unbroken stream's, with the same token ids, finish reason and stop reason.

The breaks that matter are those where the node holds text back: the start of a possible stop
string, half a UTF-8 character (these random checkpoints produce many), and a break after the last
token but before its finish. Every chunk position of each stream is tried, all continuations in
one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from regional_node.engine import LLMEngine, RequestDelta, SamplingParams

PROMPT = "héllo wörld"
MAX_TOKENS = 40
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
# Prefixes the generated text is full of ("e", "s", U+FFFD for bytes that are no character), so
# text is held back at many chunk boundaries; the snowmen never come, so these never match.
NEVER_MATCHING = ["e☃☃", "s☃☃", "\ufffd☃"]


@dataclass
class Stream:
    deltas: list[RequestDelta]

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d.new_token_ids]

    @property
    def text(self) -> str:
        return "".join(d.new_text for d in self.deltas)

    @property
    def finish_reason(self) -> str | None:
        return self.deltas[-1].finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self.deltas[-1].stop_reason


def run(engine: LLMEngine, requests: dict[str, tuple[SamplingParams, list[int]]]) -> dict[str, Stream]:
    """Each request (params, continuation tokens) on PROMPT, batched, until all have finished."""
    for request_id, (params, carried) in requests.items():
        engine.add_request(request_id, PROMPT, params, continuation_token_ids=carried)
    streams = {request_id: Stream([]) for request_id in requests}
    for _ in range(10 * MAX_TOKENS):
        if not engine.has_unfinished_requests():
            break
        for delta in engine.step():
            streams[delta.request_id].deltas.append(delta)
    assert all(s.deltas and s.deltas[-1].finished for s in streams.values())
    stats = engine.stats()
    assert (stats["kv_blocks_used"], stats["num_running"], stats["num_waiting"]) == (0, 0, 0)
    return streams


def assert_continuable_at_every_chunk(engine: LLMEngine, params: SamplingParams) -> Stream:
    [whole] = run(engine, {"whole": (params, [])}).values()
    assert all(len(d.new_token_ids) == 1 for d in whole.deltas), "one token per chunk"
    n = len(whole.deltas)
    continued = run(
        engine,
        {
            str(k): (replace(params, max_tokens=params.max_tokens - k), whole.token_ids[:k])
            for k in range(1, n + 1)
        },
    )
    for k in range(1, n + 1):
        received = Stream(whole.deltas[:k])
        rest = continued[str(k)]
        assert received.text + rest.text == whole.text, f"broken after chunk {k} of {n}"
        assert received.token_ids + rest.token_ids == whole.token_ids, f"broken after chunk {k} of {n}"
        assert rest.finish_reason == whole.finish_reason, f"broken after chunk {k} of {n}"
        assert rest.stop_reason == whole.stop_reason, f"broken after chunk {k} of {n}"
        assert rest.deltas[0].prompt_tokens == whole.deltas[0].prompt_tokens + k
    return whole


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engine(request: pytest.FixtureRequest, llama_dir: Path, qwen2_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(llama_dir if request.param == "llama" else qwen2_dir)


def unbroken_text(engine: LLMEngine) -> tuple[str, list[int]]:
    [whole] = run(engine, {"plain": (GREEDY, [])}).values()
    return whole.text, whole.token_ids


def test_text_held_back_for_a_stop_string_start_comes_after_the_break(engine: LLMEngine) -> None:
    text, _ = unbroken_text(engine)
    assert sum(text.count(stop[0]) for stop in NEVER_MATCHING) >= 5, "the stops' starts are common"
    whole = assert_continuable_at_every_chunk(engine, replace(GREEDY, stop=NEVER_MATCHING))
    assert (whole.finish_reason, whole.stop_reason) == ("length", None)
    assert whole.text == text
    assert any(d.new_text == "" for d in whole.deltas), "text was held back at some chunk"


def test_a_stop_string_that_matches_ends_the_continuation_where_it_ended_the_stream(
    engine: LLMEngine,
) -> None:
    text, _ = unbroken_text(engine)
    # A stop string from the middle of the text, among stops whose starts are common.
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    whole = assert_continuable_at_every_chunk(engine, replace(GREEDY, stop=[*NEVER_MATCHING, stop]))
    assert (whole.finish_reason, whole.stop_reason) == ("stop", stop)
    assert whole.text == text[: text.index(stop)]


def test_a_carried_stop_token_ends_the_continuation_at_once(engine: LLMEngine) -> None:
    _, ids = unbroken_text(engine)
    stop_token = ids[MAX_TOKENS // 2]
    whole = assert_continuable_at_every_chunk(
        engine, replace(GREEDY, stop=NEVER_MATCHING, stop_token_ids=[stop_token])
    )
    assert (whole.finish_reason, whole.stop_reason) == ("stop", stop_token)
    assert whole.token_ids[-1] == stop_token


def test_without_budget_left_a_continuation_only_says_how_the_carried_tokens_end(
    engine: LLMEngine,
) -> None:
    _, ids = unbroken_text(engine)
    params = replace(GREEDY, max_tokens=0, stop=NEVER_MATCHING)
    [rest] = run(engine, {"spent": (params, ids)}).values()
    assert [(d.new_token_ids, d.new_text, d.finish_reason, d.stop_reason) for d in rest.deltas] == [
        ([], "", "length", None)
    ]
    with pytest.raises(Exception, match="max_tokens must be an integer >= 1"):
        engine.add_request("no-carried", PROMPT, params)

"""The Responses API end to end: real node processes, the official `openai` SDK (function tools,
which only providers serve, in tests/providers/test_responses_tools_e2e.py)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gateway.responses.run import Run
from gateway.responses.translate import ResponsesRequest
from protocol import NotFoundError
from tests.gateway.conftest import (
    AUTH,
    EU_KEY,
    GLOBAL_KEY,
    NodeProcess,
    RunningGateway,
    gateway_over,
    running_fleet,
)
from tests.support.checkpoints import endless_checkpoint
from tests.support.waiting import wait_for

LONG = 3000  # output tokens of a generation that is still running when the test cancels it


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    # A model that never ends its reply of itself: the cancel tests' LONG generations must still
    # run when the cancel comes (the plain tiny Llama's greedy "Go on and on" ends after ~200
    # tokens, in well under a second).
    models = {"meridian-small": (endless_checkpoint(tmp_path_factory.mktemp("checkpoints")), "small")}
    with running_fleet(
        [("eu-west-1", "eu-west", "eu")], models, tmp_path_factory.mktemp("node-logs")
    ) as fleet:
        yield fleet[0]


@pytest.fixture(scope="module")
def gw(node: NodeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway_over([node], tmp_path_factory.mktemp("gw")) as running:
        yield running


def sdk(gw: RunningGateway, key: str = GLOBAL_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)


def node_idle(node: NodeProcess) -> dict[str, Any]:
    """The node's /load once nothing runs and no KV block is held (bounded wait), else the last."""
    deadline = time.monotonic() + 15
    while True:
        load = httpx.get(node.url + "/load", headers=AUTH, timeout=5).json()
        if (load["num_running"] == 0 and load["kv_blocks_used"] == 0) or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def aborted(node: NodeProcess) -> float:
    """Chat requests the node aborted because their client (the gateway) went away."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(node.metrics())
        if family.name == "meridian_node_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == "disconnected"
    )


def busy(node: NodeProcess) -> bool:
    load = httpx.get(node.url + "/load", headers=AUTH, timeout=5).json()
    return bool(load["num_running"] == 1 and load["kv_blocks_used"] > 0)


def test_create_answers_a_chat_completions_greedy_text(gw: RunningGateway) -> None:
    client = sdk(gw)
    chat = client.chat.completions.create(
        model="meridian-small",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour"}],
        max_tokens=12,
        temperature=0,
    )
    response = client.responses.create(
        model="meridian-small",
        instructions="Be brief.",
        input="Name a colour",
        max_output_tokens=12,
        temperature=0,
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    # The same input as a list of messages with input_text parts.
    again = client.responses.create(
        model="meridian-small",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Name a colour"}]},
        ],
        max_output_tokens=12,
        temperature=0,
        metadata={"case": "parts"},
    )
    assert again.output_text == response.output_text and again.metadata == {"case": "parts"}
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_stream_sends_the_events_in_order_with_the_same_text(gw: RunningGateway) -> None:
    client = sdk(gw)
    plain = client.responses.create(
        model="meridian-small", input="Tell me a story", max_output_tokens=16, temperature=0
    )
    events = list(
        client.responses.create(
            model="meridian-small", input="Tell me a story", max_output_tokens=16, temperature=0, stream=True
        )
    )
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    ending = "response.completed" if plain.status == "completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        ending,
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == plain.output_text == events[-4].text  # output_text.done
    final = events[-1].response
    assert final.output_text == text and final.status == plain.status
    assert final.usage is not None and final.usage.output_tokens == plain.usage.output_tokens  # type: ignore[union-attr]


def test_logprobs_are_the_chat_doors_on_every_path_when_included(gw: RunningGateway) -> None:
    """`include: ["message.output_text.logprobs"]` fills each output_text's logprobs (with
    `top_logprobs` alternatives): the chat door's for the same greedy request, token for token,
    in the response, its streamed deltas (joined), its done event and the stored object."""
    client = sdk(gw)
    chat = client.chat.completions.create(
        model="meridian-small",
        messages=[{"role": "user", "content": "Name a colour"}],
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content
    expected = [
        (e.token, round(e.logprob, 4), [(t.token, round(t.logprob, 4)) for t in e.top_logprobs])
        for e in chat.choices[0].logprobs.content
    ]

    def seen(entries: list[Any]) -> list[Any]:
        return [
            (
                e["token"],
                round(e["logprob"], 4),
                [(t["token"], round(t["logprob"], 4)) for t in e["top_logprobs"]],
            )
            for e in entries
        ]

    asked = {
        "model": "meridian-small",
        "input": "Name a colour",
        "max_output_tokens": 10,
        "temperature": 0,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
    }
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    whole = httpx.post(gw.url + "/v1/responses", json=asked, headers=headers, timeout=60).json()
    [part] = whole["output"][0]["content"]
    assert part["text"] == chat.choices[0].message.content and seen(part["logprobs"]) == expected
    assert whole["top_logprobs"] == 3
    stored = httpx.get(f"{gw.url}/v1/responses/{whole['id']}", headers=headers, timeout=60).json()
    assert seen(stored["output"][0]["content"][0]["logprobs"]) == expected

    events = list(client.responses.create(**asked, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [entry.model_dump() for e in deltas for entry in e.logprobs]
    assert seen(streamed) == expected
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert seen([entry.model_dump() for entry in done.logprobs]) == expected
    assert [e["bytes"] for e in part["logprobs"]] == [e.bytes for e in chat.choices[0].logprobs.content]

    # Not included: none, as before; a value naming what Meridian never produces adds nothing.
    plain = client.responses.create(
        model="meridian-small",
        input="Name a colour",
        max_output_tokens=10,
        temperature=0,
        include=["reasoning.encrypted_content"],
    )
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]
    assert plain.output_text == part["text"]


def test_background_runs_detached_and_is_retrieved_when_done(gw: RunningGateway) -> None:
    client = sdk(gw)
    expected = client.responses.create(
        model="meridian-small", input="Count", max_output_tokens=24, temperature=0
    )
    started = client.responses.create(
        model="meridian-small", input="Count", max_output_tokens=24, temperature=0, background=True
    )
    assert started.status in ("queued", "in_progress") and started.background
    state: dict[str, Any] = {}

    def done() -> bool:
        state["r"] = client.responses.retrieve(started.id)
        return state["r"].status not in ("queued", "in_progress")

    wait_for(done, "the background response did not finish")
    assert state["r"].status == expected.status and state["r"].output_text == expected.output_text
    client.responses.delete(started.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(started.id)


def test_cancelling_a_response_that_already_ended_is_a_conflict(gw: RunningGateway) -> None:
    """A valid request the response's state does not allow: a 409 naming why (not a 400, which
    says the request is wrong); a response cancelled already answers as it is."""
    client = sdk(gw)
    ended = client.responses.create(model="meridian-small", input="Hi", max_output_tokens=2, temperature=0)
    assert ended.status in ("completed", "incomplete")
    with pytest.raises(openai.ConflictError) as refused:
        client.responses.cancel(ended.id)
    assert refused.value.code == "response_not_cancellable" and refused.value.param == "response_id"
    assert client.responses.retrieve(ended.id).status == ended.status


def test_cancel_a_background_run_aborts_the_node_request(gw: RunningGateway, node: NodeProcess) -> None:
    client = sdk(gw)
    started = client.responses.create(
        model="meridian-small", input="Go on and on", max_output_tokens=LONG, temperature=0, background=True
    )
    before = aborted(node)
    wait_for(lambda: client.responses.retrieve(started.id).output_text, "no output yet")
    assert busy(node)  # generating, its KV blocks held
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(started.id).status == "cancelled"
    load = node_idle(node)
    assert load["num_running"] == 0 and load["kv_blocks_used"] == 0, load
    assert aborted(node) == before + 1
    # A cancelled response stays cancelled: its generation did not run to the end.
    assert len(client.responses.retrieve(started.id).output_text) < LONG


def test_cancel_an_in_flight_foreground_request_by_its_id(gw: RunningGateway, node: NodeProcess) -> None:
    """A foreground stream's id is in its first event; a cancel from another connection ends it."""
    client = sdk(gw)
    events = client.responses.create(
        model="meridian-small", input="Go on and on", max_output_tokens=LONG, temperature=0, stream=True
    )
    before = aborted(node)
    seen = []
    for event in events:
        seen.append(event)
        if event.type == "response.created":  # sent once the first token is in
            assert sdk(gw).responses.cancel(seen[0].response.id).status == "cancelled"
    assert seen[0].type == "response.created"
    assert seen[-1].type == "response.failed" and seen[-1].response.status == "cancelled"
    assert sum(e.type == "response.output_text.delta" for e in seen) < LONG
    load = node_idle(node)
    assert load["num_running"] == 0 and load["kv_blocks_used"] == 0, load
    assert aborted(node) == before + 1


def test_another_tenants_response_is_not_found(gw: RunningGateway) -> None:
    response = sdk(gw).responses.create(model="meridian-small", input="Hi", max_output_tokens=4)
    other = sdk(gw, EU_KEY)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(response.id)
    assert sdk(gw).responses.retrieve(response.id).id == response.id


def test_a_response_lists_its_input_messages_as_sent_not_its_instructions(gw: RunningGateway) -> None:
    client = sdk(gw)
    given = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    response = client.responses.create(
        model="meridian-small", input=given, instructions="Answer in English.", max_output_tokens=1
    )
    oldest_first = list(client.responses.input_items.list(response.id, order="asc"))
    assert [(item.role, item.content[0].text) for item in oldest_first] == [  # type: ignore[union-attr]
        ("developer", "Be brief."),
        ("user", "Hi there"),
        ("assistant", "Hello."),
        ("user", "Again"),
    ]
    assert [item.content[0].type for item in oldest_first] == [  # type: ignore[union-attr]
        "input_text",
        "input_text",
        "output_text",
        "input_text",
    ]
    newest_first = list(client.responses.input_items.list(response.id))
    assert [item.id for item in newest_first] == [item.id for item in reversed(oldest_first)]
    assert len({item.id for item in newest_first}) == 4
    one = client.responses.create(model="meridian-small", input="Hi", max_output_tokens=1)
    [only] = client.responses.input_items.list(one.id)
    assert (only.role, only.content[0].text) == ("user", "Hi")  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        sdk(gw, EU_KEY).responses.input_items.list(response.id)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(response.id)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    count=st.integers(min_value=1, max_value=7),
    limit=st.integers(min_value=1, max_value=4),
    order=st.sampled_from(["asc", "desc"]),
)
def test_walking_the_input_item_pages_returns_each_message_once_in_order(
    gw: RunningGateway, count: int, limit: int, order: str
) -> None:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(count)]
    response = sdk(gw).responses.create(model="meridian-small", input=messages, max_output_tokens=1)
    http = httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=30)
    seen: list[str] = []
    after: str | None = None
    while True:
        params = {"limit": limit, "order": order, **({"after": after} if after else {})}
        page = http.get(f"/v1/responses/{response.id}/input_items", params=params).json()
        seen += [item["content"][0]["text"] for item in page["data"]]
        assert len(page["data"]) <= limit
        if not page["has_more"]:
            break
        assert len(page["data"]) == limit
        after = page["last_id"]
    expected = [m["content"] for m in messages]
    assert seen == (expected if order == "asc" else expected[::-1])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # Function tools are served by upstreams that call tools: this gateway has only a node.
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}
                ]
            },
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "{}"}]}, "input[0]"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"text": {"format": {"type": "json_object"}}}, "text"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"include": ["message.output_text.annotations"]}, "include[0]"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_unsupported_features_are_a_400_naming_the_param(
    gw: RunningGateway, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "meridian-small", "input": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(gw).responses.create(**body)
    assert raised.value.status_code == 400
    assert raised.value.param == param, raised.value.body  # type: ignore[attr-defined]


def test_a_previous_response_that_is_not_this_tenants_is_not_found(gw: RunningGateway) -> None:
    """As OpenAI's `previous_response_not_found`: unknown, deleted, unstored or another tenant's."""
    client = sdk(gw)
    unstored = client.responses.create(model="meridian-small", input="Hi", max_output_tokens=1, store=False)
    deleted = client.responses.create(model="meridian-small", input="Hi", max_output_tokens=1)
    client.responses.delete(deleted.id)
    mine = client.responses.create(model="meridian-small", input="Hi", max_output_tokens=1)
    for previous, key in (
        ("resp_x", GLOBAL_KEY),
        (unstored.id, GLOBAL_KEY),
        (deleted.id, GLOBAL_KEY),
        (mine.id, EU_KEY),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            sdk(gw, key).responses.create(
                model="meridian-small", input="Go on", previous_response_id=previous
            )
        assert missing.value.code == "previous_response_not_found"
        assert missing.value.param == "previous_response_id"  # type: ignore[attr-defined]


def test_a_follow_up_continues_the_previous_conversation_not_its_instructions(gw: RunningGateway) -> None:
    """The node reads the earlier input and output before the new input: the same prompt tokens as
    the whole conversation sent at once, without the earlier instructions."""
    client = sdk(gw)
    first = client.responses.create(
        model="meridian-small",
        instructions="Be brief.",
        input="Name a colour",
        max_output_tokens=4,
        temperature=0,
    )
    follow_up = client.responses.create(
        model="meridian-small", input="And another", previous_response_id=first.id, max_output_tokens=1
    )
    whole = client.responses.create(
        model="meridian-small",
        input=[
            {"role": "user", "content": "Name a colour"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another"},
        ],
        max_output_tokens=1,
    )
    assert follow_up.previous_response_id == first.id and follow_up.instructions is None
    assert follow_up.usage is not None and whole.usage is not None
    assert follow_up.usage.input_tokens == whole.usage.input_tokens
    [only] = client.responses.input_items.list(follow_up.id)
    assert (only.role, only.content[0].text) == ("user", "And another")  # type: ignore[union-attr]
    # A running response cannot be continued yet.
    running = client.responses.create(
        model="meridian-small", input="Go on and on", max_output_tokens=LONG, background=True
    )
    with pytest.raises(openai.ConflictError) as refused:
        client.responses.create(model="meridian-small", input="More", previous_response_id=running.id)
    assert refused.value.code == "previous_response_in_progress"
    client.responses.cancel(running.id)


@pytest.mark.parametrize("background", [True, False])
async def test_a_run_that_failed_to_open_leaves_no_lost_error_for_asyncio_to_log(background: bool) -> None:
    """A background run's opening is awaited by no one (nor a foreground one's whose client
    left): its failure is the stored response's `failed` status. asyncio logs an exception set on
    a future nobody retrieved ("Future exception was never retrieved") when the future is freed."""
    loop = asyncio.get_running_loop()
    lost: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: lost.append(context))
    try:
        request = ResponsesRequest(model="no-such-model", background=background)
        run = Run("resp_test", "acme", request, stream=False)
        error = NotFoundError("The model 'no-such-model' does not exist.", param="model")
        run.failed_to_open({"code": "not_found", "message": error.message}, error)
        await asyncio.sleep(0)  # the future's callbacks run
        assert run.status == "failed"
        del run
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert lost == []

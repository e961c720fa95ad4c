"""Function tools on the Responses door, pure: requests with function tools, tool_choice and
input items of function calls and their outputs into chat bodies (gateway/responses/translate.py,
items.py); the pipeline's answers with tool calls into function_call output items and the
Responses event stream (output.py, run.py), which the official `openai` SDK reads back whole
however the text and call pieces arrive (output safety may release a piece after the next call
began); a response's conversation carried to its follow-up (`previous_response_id`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.responses.items import FunctionCall, FunctionCallOutput, InputItem, InputMessage
from gateway.responses.items import listed as input_items_of
from gateway.responses.run import Run
from gateway.responses.translate import chat_request, parse_request
from protocol import InvalidRequestError
from protocol.chunk import chunk_from
from protocol.sse import encode_event
from tests.providers.tool_strategies import (
    delta_chunk,
    held_back,
    json_objects,
    names,
    streamed_answers,
    texts,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def parsed(**fields: Any) -> Any:
    return parse_request(json.dumps({"model": "m", "input": "Hi", **fields}).encode())


def chat_of(**fields: Any) -> dict[str, Any]:
    return chat_request(parsed(**fields)).body


# -- the request: examples -------------------------------------------------------------------------


def test_a_function_tool_becomes_a_chat_function_tool() -> None:
    body = chat_of(tools=[WEATHER, {"type": "function", "name": "now", "strict": False}])
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["parameters"],
            },
        },
        {"type": "function", "function": {"name": "now", "strict": False}},
    ]
    assert body["tool_choice"] == "auto" and "parallel_tool_calls" not in body


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_maps(choice: Any, expected: Any) -> None:
    body = chat_of(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False)
    assert body["tool_choice"] == expected and body["parallel_tool_calls"] is False


def test_without_tools_no_tool_field_is_sent() -> None:
    """Chat APIs refuse tool_choice and parallel_tool_calls without tools."""
    for fields in (
        {},
        {"tools": []},
        {"tool_choice": "none", "parallel_tool_calls": True},
        {"tool_choice": "auto"},
    ):
        body = chat_of(**fields)
        assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body), fields


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[1].type"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
        ({"tools": [{"type": "custom", "name": "x"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"tools": [{**WEATHER, "parameters": "{}"}]}, "tools[0].parameters"),
        ({"tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [], "tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"previous_response_id": 5}, "previous_response_id"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input[0].name"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "", "id": 1}]},
            "input[0].id",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "", "status": "x"}
                ]
            },
            "input[0].status",
        ),
        ({"input": [{"type": "function_call_output", "output": "ok"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
        (
            {
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "http://x/y.png"}],
                    }
                ]
            },
            "input[0].output[0]",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"input": [{"type": "item_reference", "id": "fc_1"}]}, "input[0]"),
    ],
)
def test_what_the_door_does_not_serve_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        parsed(**fields)
    assert refused.value.param == param, refused.value.message


def test_an_agent_loops_items_become_tool_calls_and_tool_messages() -> None:
    request = parsed(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "12 C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "3 "}, {"type": "input_text", "text": "C"}]},
            {"type": "function_call", "call_id": "c3", "name": "now", "arguments": "", "id": "fc_9", "status": "completed"},
            {"type": "function_call_output", "call_id": "c3", "output": "noon"},
        ],
        tools=[WEATHER],
    )  # fmt: skip
    chat = chat_request(request)

    def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    assert chat.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                call("c1", "get_weather", '{"city":"Paris"}'),
                call("c2", "get_weather", '{"city":"Oslo"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "3 C"},
        {"role": "assistant", "content": None, "tool_calls": [call("c3", "now", "")]},
        {"role": "tool", "tool_call_id": "c3", "content": "noon"},
    ]
    # A tool-calling error about a chat message names the item the client sent.
    assert chat.sources == (
        "instructions",
        "input[0]",
        "input[2]",
        "input[4]",
        "input[5]",
        "input[6]",
        "input[7]",
    )
    error = InvalidRequestError(
        "Tool calling (asked by `messages[3].role`) is not served.", param="messages[3].role"
    )
    renamed = chat.in_request_terms(error)
    assert (renamed.param, renamed.message) == (
        "input[4]",
        "Tool calling (asked by `input[4]`) is not served.",
    )
    assert chat.in_request_terms(InvalidRequestError("x", param="max_tokens")).param == "max_output_tokens"
    # Listed as given, each with an id (the client's own where it gave one).
    listed = input_items_of(request.input, "abc")
    assert [(item["type"], item["id"]) for item in listed] == [
        ("message", "msg_abc_in0"),
        ("message", "msg_abc_in1"),
        ("function_call", "fc_abc_in2"),
        ("function_call", "fc_abc_in3"),
        ("function_call_output", "fco_abc_in4"),
        ("function_call_output", "fco_abc_in5"),
        ("function_call", "fc_9"),
        ("function_call_output", "fco_abc_in7"),
    ]
    assert listed[5]["output"] == [{"type": "input_text", "text": "3 "}, {"type": "input_text", "text": "C"}]
    assert listed[4] == {
        "type": "function_call_output",
        "id": "fco_abc_in4",
        "call_id": "c1",
        "output": "12 C",
        "status": "completed",
    }


# -- the request: properties -----------------------------------------------------------------------


@st.composite
def tool_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Function tools, a tool_choice, and input items in any order: messages (string or text-part
    content), function calls (unique call ids) and outputs of the calls made so far."""
    tools = []
    for name in draw(st.lists(names, min_size=1, max_size=3, unique=True)):
        tool: dict[str, Any] = {"type": "function", "name": name}
        for key, values in (
            ("description", texts),
            ("parameters", st.just({"type": "object"}) | json_objects),
            ("strict", st.booleans()),
        ):
            if draw(st.booleans()):
                tool[key] = draw(values)
        tools.append(tool)
    items: list[dict[str, Any]] = []
    made: list[str] = []
    for k in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["message", "call", "output"] if made else ["message", "call"]))
        if kind == "message":
            text = draw(texts)
            content: Any = (
                text
                if draw(st.booleans())
                else [{"type": draw(st.sampled_from(["input_text", "output_text"])), "text": text}]
            )
            role = draw(st.sampled_from(["user", "assistant", "system", "developer"]))
            item = {"role": role, "content": content}
            if draw(st.booleans()):
                item["type"] = "message"
            items.append(item)
        elif kind == "call":
            made.append(f"call_{k}")
            arguments = json.dumps(draw(json_objects))
            items.append(
                {"type": "function_call", "call_id": made[-1], "name": draw(names), "arguments": arguments}
            )
        else:
            output = draw(
                texts | st.lists(texts.map(lambda t: {"type": "input_text", "text": t}), max_size=2)
            )
            items.append(
                {"type": "function_call_output", "call_id": draw(st.sampled_from(made)), "output": output}
            )
    body: dict[str, Any] = {"model": "m", "input": items, "tools": tools}
    choice = draw(
        st.none()
        | st.sampled_from(["auto", "none", "required"])
        | st.sampled_from([t["name"] for t in tools]).map(lambda n: {"type": "function", "name": n})
    )
    if choice is not None:
        body["tool_choice"] = choice
    parallel = draw(st.none() | st.booleans())
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if draw(st.booleans()):
        body["instructions"] = draw(texts)
    return body


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def canonical_items(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The items as chat says them: function calls and the assistant messages in a row with them
    one turn (its texts joined, its calls), roles as chat names them."""
    out: list[tuple[Any, ...]] = []
    run: list[dict[str, Any]] = []

    def end_run() -> None:
        if any(item.get("type") == "function_call" for item in run):
            text = "".join(
                text_of(item["content"]) for item in run if item.get("type", "message") == "message"
            )
            calls = [
                (c["call_id"], c["name"], c["arguments"]) for c in run if c.get("type") == "function_call"
            ]
            out.append(("turn", text, calls))
        else:
            out.extend(("message", "assistant", text_of(item["content"])) for item in run)
        run.clear()

    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call" or (kind == "message" and item["role"] == "assistant"):
            run.append(item)
            continue
        end_run()
        if kind == "function_call_output":
            out.append(("output", item["call_id"], text_of(item["output"])))
        else:
            out.append(
                ("message", {"developer": "system"}.get(item["role"], item["role"]), text_of(item["content"]))
            )
    end_run()
    return out


def flattened(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for message in messages:
        if message["role"] == "tool":
            out.append(("output", message["tool_call_id"], message["content"]))
        elif "tool_calls" in message:
            calls = [
                (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
            ]
            out.append(("turn", message["content"] or "", calls))
        else:
            out.append(("message", message["role"], message["content"]))
    return out


@settings(max_examples=300, deadline=None)
@given(tool_requests())
def test_a_tool_request_becomes_the_chat_request_that_says_the_same(body: dict[str, Any]) -> None:
    chat = chat_request(parse_request(json.dumps(body).encode()))
    sent = chat.body
    # Tools, each with the fields it was given; tool_choice and parallel_tool_calls as asked.
    assert sent["tools"] == [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in body["tools"]
    ]
    choice = body.get("tool_choice", "auto")
    assert sent["tool_choice"] == (
        {"type": "function", "function": {"name": choice["name"]}} if isinstance(choice, dict) else choice
    )
    assert sent.get("parallel_tool_calls") == body.get("parallel_tool_calls")
    # The conversation: every item in order, calls in a row (with the assistant text before them)
    # one assistant turn, each output a tool message.
    messages = sent["messages"]
    if "instructions" in body:
        assert messages[0] == {"role": "system", "content": body["instructions"]}
        messages = messages[1:]
    assert flattened(messages) == canonical_items(body["input"])
    for k, message in enumerate(messages):
        if "tool_calls" in message:
            # Nothing of the assistant's beside a calling turn: it would be part of it.
            assert message["role"] == "assistant" and message["tool_calls"] and message["content"] != ""
            neighbours = messages[max(k - 1, 0) : k] + messages[k + 1 : k + 2]
            assert all(m["role"] != "assistant" for m in neighbours)
    # Each chat message names the item it started from, in order.
    positions = [int(source[6:-1]) for source in chat.sources if source != "instructions"]
    assert positions == sorted(set(positions)) and len(chat.sources) == len(sent["messages"])


def test_the_earlier_conversation_comes_before_this_input_without_its_instructions() -> None:
    earlier: tuple[InputItem, ...] = (
        InputMessage("user", "Weather in Paris?"),
        FunctionCall("call_1", "get_weather", '{"city": "Paris"}', id="fc_1"),
    )
    request = parsed(
        instructions="Now.",
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}],
        tools=[WEATHER],
        previous_response_id="resp_1",
    )
    chat = chat_request(request, earlier)
    assert chat.body["messages"] == [
        {"role": "system", "content": "Now."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
    ]
    assert chat.sources == ("instructions", "previous_response_id", "previous_response_id", "input[0]")
    # An answer whose text safety held to its end lists its message after its calls: given back,
    # text and calls are still the one turn the call's result follows.
    late = (InputMessage("user", "Weather?"), earlier[1], InputMessage("assistant", "Checking."))
    messages = chat_request(request, late).body["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "Now."),
        ("user", "Weather?"),
        ("assistant", "Checking."),
        ("tool", "Sunny"),
    ]
    assert messages[2]["tool_calls"][0]["id"] == "call_1"


# -- the answer: the stream and the object -------------------------------------------------------------

RESPONSE_ID = "resp_0123"


async def run_of(chunks: list[dict[str, Any]], *, stream: bool) -> Run:
    request = parse_request(json.dumps({"model": "m", "input": "Hi", "tools": [WEATHER]}).encode())
    run = Run(RESPONSE_ID, "acme", request, stream=stream)
    await run.started("m")
    for chunk in chunks:
        await run.feed(chunk_from(chunk))
    run.ended()
    return run


async def events_of(run: Run) -> list[dict[str, Any]]:
    assert run.events is not None
    return [payload async for _, payload in run.events]


def check_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order a Responses client relies on, checked; the output items as the done events say
    them, by output_index: numbered events, each item added once (indices 0, 1, ... in turn)
    before its deltas and done once after them, with the text and arguments its deltas built."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed"
    added: dict[int, dict[str, Any]] = {}
    built: dict[int, str] = {}
    done: dict[int, dict[str, Any]] = {}
    for event in events[2:-1]:
        kind, index = event["type"], event.get("output_index")
        assert index is not None, event
        assert index not in done, f"{kind} after its item was done"
        if kind == "response.output_item.added":
            assert index == len(added)
            added[index] = event["item"]
            built[index] = ""
            assert event["item"]["status"] == "in_progress"
            continue
        item = added[index]
        if "item_id" in event:
            assert event["item_id"] == item["id"]
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            assert item["type"] == ("message" if kind == "response.output_text.delta" else "function_call")
            built[index] += event["delta"]
        elif kind == "response.output_text.done":
            assert event["text"] == built[index]
        elif kind == "response.function_call_arguments.done":
            assert event["arguments"] == built[index] and event["name"] == item["name"]
        elif kind == "response.output_item.done":
            final = event["item"]
            assert (final["type"], final["id"]) == (item["type"], item["id"])
            text = final["content"][0]["text"] if final["type"] == "message" else final["arguments"]
            assert text == built[index]
            if final["type"] == "function_call":
                assert (final["call_id"], final["name"]) == (item["call_id"], item["name"])
            done[index] = final
    assert sorted(done) == sorted(added) == list(range(len(added)))
    output = [done[index] for index in range(len(done))]
    assert events[-1]["response"]["output"] == output
    return output


def expected_output(text: str, calls: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    message = [("message", text)] if text or not calls else []
    return message + [
        ("function_call", c["id"], c["name"], json.loads(json.dumps(c["input"]))) for c in calls
    ]


def summary(output: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        ("message", item["content"][0]["text"])
        if item["type"] == "message"
        else ("function_call", item["call_id"], item["name"], json.loads(item["arguments"]))
        for item in output
    ]


def sdk_final(events: list[dict[str, Any]]) -> Any:
    """What the official SDK's `responses.stream(...)` makes of these events: its final response."""
    frames = b"".join(encode_event(event["type"], event) for event in events)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames)

    client = openai.OpenAI(
        api_key="k",
        base_url="http://test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    with client.responses.stream(model="m", input="Hi", tools=[WEATHER]) as stream:  # type: ignore[list-item]
        for _ in stream:
            pass
        return stream.get_final_response()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streamed_answers(), st.none() | st.integers(0, 40))
async def test_streamed_text_and_calls_make_valid_events_the_sdk_reads_whole(
    streamed: Any, hold: int | None
) -> None:
    """As they came, or as output safety releases them (each channel's last `hold` characters held
    until the finish): valid events, and the same output as the stored object, the non-streamed
    answer and the SDK's final response."""
    chunks, text, calls = streamed
    if hold is not None:
        chunks = held_back(chunks, hold)
    streamed_run = await run_of(chunks, stream=True)
    output = check_events(await events_of(streamed_run))
    whole = (await run_of(chunks, stream=False)).to_object()
    assert whole["output"] == output == streamed_run.to_object()["output"]
    assert whole["status"] == "completed" and whole["incomplete_details"] is None
    assert whole["usage"]["output_tokens"] == 7
    if hold is None:
        assert summary(output) == expected_output(text, calls)
    else:  # a message whose text was all held may come after the calls began
        assert sorted(summary(output), key=str) == sorted(expected_output(text, calls), key=str)
    for item in output:
        assert item["status"] == "completed"
        if item["type"] == "function_call":
            assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    final = sdk_final(await events_of(await run_of(chunks, stream=True)))
    assert [item.model_dump(exclude_none=True) for item in final.output] == output
    assert final.output_text == text


async def test_an_answer_of_calls_alone_has_no_message_item_and_nothing_at_all_an_empty_one() -> None:
    announce = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "now", "arguments": ""}}
    run = await run_of([delta_chunk({"tool_calls": [announce]}), delta_chunk({}, "tool_calls")], stream=False)
    assert run.to_object()["output"] == [
        {
            "type": "function_call",
            "id": "fc_0123_0",
            "call_id": "call_1",
            "name": "now",
            "arguments": "",
            "status": "completed",
        }
    ]
    empty = await run_of([delta_chunk({"role": "assistant"}), delta_chunk({}, "stop")], stream=True)
    output = check_events(await events_of(empty))
    assert [(item["type"], item["content"][0]["text"]) for item in output] == [("message", "")]


async def test_a_call_cut_short_is_incomplete_and_a_call_named_late_is_added_once_named() -> None:
    """An upstream may name a call after its first piece: its item is added when it is named,
    with the pieces so far."""
    chunks = [
        delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
        delta_chunk({"tool_calls": [{"index": 0, "id": "call_7", "function": {"name": "get_weather"}}]}),
        delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Par'}}]}),
        delta_chunk({}, "length"),
    ]
    run = await run_of(chunks, stream=True)
    events = await events_of(run)
    kinds = [e["type"] for e in events]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
    ]
    assert events[2]["item"]["call_id"] == "call_7" and events[3]["delta"] == '{"ci'
    final = run.to_object()
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete" and final["output"][0]["arguments"] == '{"city": "Par'
    assert kinds[-1] == "response.incomplete"


async def test_the_response_echoes_its_tools_and_carries_its_conversation() -> None:
    """What a follow-up with `previous_response_id` continues: the input, then the output as
    input items (the message, then each call with its id)."""
    arguments = json.dumps({"city": "Paris"})
    announce = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    run = await run_of([delta_chunk({"content": "Let me check."}), delta_chunk({"tool_calls": [announce]}), delta_chunk({}, "tool_calls")], stream=False)  # fmt: skip
    answer = run.to_object()
    assert answer["tools"] == [{**WEATHER, "strict": None}]
    assert (answer["tool_choice"], answer["parallel_tool_calls"], answer["previous_response_id"]) == (
        "auto",
        True,
        None,
    )
    assert run.conversation() == (
        InputMessage("user", "Hi"),
        InputMessage("assistant", "Let me check."),
        FunctionCall("call_1", "get_weather", arguments, id="fc_0123_1"),
    )
    follow_up = parsed(
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}],
        previous_response_id=RESPONSE_ID,
    )
    messages = chat_request(follow_up, run.conversation()).body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Let me check." and messages[1]["tool_calls"][0]["id"] == "call_1"
    assert FunctionCallOutput("call_1", ("a", "b")).text == "ab"

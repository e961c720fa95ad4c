"""The OpenAPI document at /openapi.json: served without a key, a valid OpenAPI 3.1 document
(openapi-spec-validator), self-contained (every $ref resolves), covering every public route and
nothing operator-only, and true to the live gateway: bodies its schemas accept are served, bodies
they reject are 400s, and schemathesis's generated requests get no server error, no answer
outside the document, no refusal of a request the document allows (its positive-data check) and
no acceptance of a body it forbids (its negative-data check). Its links (a created file, batch or
response, then the operations that act on it) name real operations and parameters, and
schemathesis's stateful scenarios that follow them find the same, a deleted object gone and a
created one there."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from litestar.routes import HTTPRoute
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    ensure_resource_availability,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    use_after_free,
)

from gateway.app import create_app
from tests.gateway.conftest import (
    GLOBAL_KEY,
    SMALL_KEY,
    TEST_TENANTS,
    RunningGateway,
    gateway_config,
    run_gateway,
    running_fleet,
    write_regions,
)
from tests.support.fake_providers import FakeProvider, running

OPERATOR_PATHS = {"/health", "/ready", "/metrics"}
ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "415", "429", "503")
REQUESTS = {
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/completions": "CompletionRequest",
    "/v1/messages": "MessagesRequest",
}
# Each schema's required fields, for a model the node serves, plus max_tokens to keep answers short.
MINIMAL = {
    "/v1/chat/completions": {
        "model": "meridian-small",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    },
    "/v1/completions": {"model": "meridian-small", "max_tokens": 4, "prompt": "Hi"},
    "/v1/messages": {
        "model": "meridian-small",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    },
}


# The tenants may fall back to a commercial provider: the document describes a gateway that serves
# every request it allows, and only a provider serves tool calling (nodes call no tools). The node
# stays preferred for everything else.
TENANTS = tuple(dataclasses.replace(tenant, allow_commercial=True) for tenant in TEST_TENANTS)


@pytest.fixture(scope="module")
def gw(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    models = {"meridian-small": (llama_checkpoint, "small")}
    with (
        running_fleet([("us-east-1", "us-east", "us")], models, tmp_path_factory.mktemp("logs")) as nodes,
        running(FakeProvider("openai", api_key="sk-openai-test")) as provider,
    ):
        regions = write_regions(tmp_path_factory.mktemp("gw") / "regions.yaml", nodes)
        entry = {
            "id": "openai-us",
            "kind": "openai",
            "base_url": provider.base_url,
            "api_key_env": "TEST_OPENAI_US_KEY",
            "region": "us-east",
            "jurisdiction": "us",
            "models": {"meridian-small": "openai-model-1"},
        }
        config = gateway_config(regions, providers={"endpoints": [entry]})
        with run_gateway(config, tenants=TENANTS, env={entry["api_key_env"]: provider.api_key}) as gateway:
            yield gateway


@pytest.fixture(scope="module")
def document(gw: RunningGateway) -> dict[str, Any]:
    response = httpx.get(gw.url + "/openapi.json", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref} points outside the document"
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def accepts(document: dict[str, Any], schema: dict[str, Any], value: Any) -> bool:
    """The JSON Schema keywords the document uses (no jsonschema package in the venv)."""
    if "$ref" in schema:
        return accepts(document, resolve(document, schema["$ref"]), value)
    if "anyOf" in schema and not any(accepts(document, s, value) for s in schema["anyOf"]):
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return False
    if isinstance(value, dict):
        if any(name not in value for name in schema.get("required", ())):
            return False
        properties = schema.get("properties", {})
        if not all(accepts(document, properties[k], v) for k, v in value.items() if k in properties):
            return False
    if isinstance(value, list) and "items" in schema:
        return all(accepts(document, schema["items"], item) for item in value)
    return True


def request_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def answer_schema(document: dict[str, Any], path: str, method: str, status: str) -> dict[str, Any]:
    return document["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


def test_document_is_openapi_3_1_served_without_a_key(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    assert document["info"] == {
        **document["info"],
        "title": "Meridian gateway",
        "version": version("meridian"),
    }


def test_document_is_a_valid_openapi_3_1_document(document: dict[str, Any]) -> None:
    validate(document)  # raises, naming the first violation


def test_every_path_parameter_is_declared_as_a_required_string(document: dict[str, Any]) -> None:
    templated = {path for path in document["paths"] if "{" in path}
    assert len(templated) == 8
    for path in templated:
        names = set(re.findall(r"{(\w+)}", path))
        for method, operation in document["paths"][path].items():
            declared = {p["name"]: p for p in operation.get("parameters", ()) if p.get("in") == "path"}
            assert set(declared) == names, (method, path)
            assert all(p["required"] and p["schema"] == {"type": "string"} for p in declared.values())


# Per operation; every operation of the document is fuzzed (19 today), so this bounds the test's
# requests to a few hundred, all answered quickly: the small tenant's max_tokens is 32.
FUZZ_EXAMPLES = 12


def test_fuzzed_requests_get_no_server_error_only_documented_answers_and_valid_ones_served(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    """Schema-valid requests to every operation must be served; schema-breaking bodies refused.
    Negative cases go to the operations with a body only: a query parameter the document does not
    name is ignored, as OpenAI's API ignores it, and the document cannot forbid one."""
    schema = schemathesis.openapi.from_dict(document)
    fuzzed = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        _fuzz(gw.url, operation, GenerationMode.POSITIVE, positive_data_acceptance)
        if operation.body:
            _fuzz(gw.url, operation, GenerationMode.NEGATIVE, negative_data_rejection)
        fuzzed += 1
    assert fuzzed == sum(len(item) for item in document["paths"].values())


def _fuzz(url: str, operation: Any, mode: GenerationMode, check: Any) -> None:
    checks = [not_a_server_error, response_schema_conformance, check]

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: Any) -> None:
        case.call_and_validate(
            base_url=url, headers={"authorization": f"Bearer {SMALL_KEY}"}, checks=checks, timeout=60
        )

    fuzz()


def operations_by_id(document: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return {
        op["operationId"]: (path, method, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
    }


def test_each_created_object_links_to_every_operation_on_it(document: dict[str, Any]) -> None:
    """A create (POST /v1/files) links each operation under its object's path (/v1/files/{file_id}
    ...) with that parameter taken from the answer's id; where nothing is created (the models),
    the list links to them with its first item's id."""
    by_id = operations_by_id(document)
    sources = {
        path: (item["post"], "$response.body#/id")
        if "post" in item
        else (item["get"], "$response.body#/data/0/id")
        for path, item in document["paths"].items()
    }
    expected = 0
    for path, item in document["paths"].items():
        found = re.match(r"^(/v1/\w+)/\{(\w+)\}", path)
        if found is None:
            continue
        collection, parameter = found.groups()
        source, value = sources[collection]
        links = source["responses"]["200"]["links"]
        for method, op in item.items():
            expected += 1
            linked = [link for link in links.values() if link["operationId"] == op["operationId"]]
            assert linked, f"{method} {path} is not linked from {collection}"
            assert linked[0]["parameters"] == {parameter: value}
    assert expected == 10  # files x3, batches x2, responses x4, models x1
    for path, _, op in by_id.values():
        for link in op["responses"]["200"].get("links", {}).values():
            assert link["operationId"] in by_id, link
            target = by_id[link["operationId"]][2]
            declared = {p["name"] for p in target.get("parameters", ()) if p.get("in") == "path"}
            assert set(link.get("parameters", {})) <= declared, (path, link)


def test_the_file_to_batch_link_makes_a_body_the_batch_schema_accepts(document: dict[str, Any]) -> None:
    by_id = operations_by_id(document)
    link = by_id["createFile"][2]["responses"]["200"]["links"]["CreateBatch"]
    assert link["operationId"] == "createBatch"
    body = {k: "file-abc" if v == "$response.body#/id" else v for k, v in link["requestBody"].items()}
    assert body["input_file_id"] == "file-abc"
    assert accepts(document, request_schema(document, "/v1/batches"), body)


# Scenarios of linked calls, each a create then up to a few calls its links allow: bounded as the
# fuzzing above (every call is a short answer or a 4xx). On a gateway with a state folder of its
# own (not the working directory's, which earlier tests had filled with files to list and read),
# the first 25 (derandomized) scenarios never followed a create to a read; 60 do, in a second more.
STATEFUL_SCENARIOS = 60


def test_scenarios_along_the_links_get_no_server_error_and_find_what_they_created(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    """schemathesis's stateful phase: a created file, batch or response, then its reads, downloads,
    cancels and deletes, in generated orders. Besides no server error and only documented answers:
    a deleted object is not found again (use-after-free), a created one is (availability)."""
    schema = schemathesis.openapi.from_dict(document)
    checks = [not_a_server_error, response_schema_conformance, use_after_free, ensure_resource_availability]
    answered: set[tuple[str, int]] = set()

    class Scenarios(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": gw.url, "headers": {"authorization": f"Bearer {SMALL_KEY}"}, "timeout": 60}

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            answered.add((case.operation.definition.raw["operationId"], response.status_code))
            case.validate_response(response, checks=checks, transport_kwargs=kwargs, recorder=self.recorder)

    Scenarios.run(
        settings=settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=4,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # The scenarios reached objects through the links: some read of a created one was served.
    reads = {"retrieveFile", "downloadFile", "getResponse", "retrieveBatch", "deleteFile", "deleteResponse"}
    assert {op for op, status in answered if status == 200} & reads, repr(sorted(answered))


def test_every_ref_resolves_within_the_document(document: dict[str, Any]) -> None:
    found = set(refs(document))
    assert "#/components/schemas/ChatCompletionRequest" in found
    for ref in found:
        resolve(document, ref)


def test_every_public_route_is_documented_and_operator_routes_are_not(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    app = create_app(gw.gateway.config, gateway=gw.gateway)
    served = {
        # Litestar's path parameters carry their type (`{id:str}`); OpenAPI's do not.
        (re.sub(r":\w+}", "}", route.path), method.lower())
        for route in app.routes
        if isinstance(route, HTTPRoute) and route.path not in OPERATOR_PATHS | {"/openapi.json"}
        for method in route.methods - {"OPTIONS", "HEAD"}
    }
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == served
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/models",
        "/v1/quota",
        "/v1/usage",
        "/v1/costs",
    } <= {path for path, _ in served}


def test_each_generation_route_names_its_request_errors_and_security(document: dict[str, Any]) -> None:
    for path, struct in REQUESTS.items():
        operation = document["paths"][path]["post"]
        assert request_schema(document, path) == {"$ref": f"#/components/schemas/{struct}"}
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        error = "AnthropicError" if path == "/v1/messages" else "ErrorResponse"
        for status in ERROR_STATUSES:
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{error}"}, (path, status)
        headers = [resolve(document, p["$ref"])["name"] for p in operation["parameters"]]
        assert "x-meridian-client-region" in headers
    assert document["security"] == [{"bearerAuth": []}]
    assert {"anthropicApiKey": []} in document["paths"]["/v1/messages"]["post"]["security"]
    assert document["components"]["securitySchemes"]["anthropicApiKey"]["name"] == "x-api-key"
    error = document["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"message", "type", "param", "code"}


def test_chat_schema_requires_model_and_messages_and_max_tokens_is_an_integer(
    document: dict[str, Any],
) -> None:
    chat = resolve(document, request_schema(document, "/v1/chat/completions")["$ref"])
    assert set(chat["required"]) == {"model", "messages"}
    max_tokens = chat["properties"]["max_tokens"]
    assert accepts(document, max_tokens, 16) and not accepts(document, max_tokens, "ten")
    assert not accepts(document, max_tokens, 1.5)
    assert "Meridian extension" in chat["properties"]["return_token_ids"]["description"]


@pytest.mark.parametrize("path", list(MINIMAL))
def test_a_body_the_schema_accepts_is_served(gw: RunningGateway, document: dict[str, Any], path: str) -> None:
    body = MINIMAL[path]
    assert accepts(document, request_schema(document, path), body)
    # /v1/messages takes the key as Anthropic's SDKs send it, the others as a bearer token.
    key = {"x-api-key": GLOBAL_KEY} if path == "/v1/messages" else {"authorization": f"Bearer {GLOBAL_KEY}"}
    headers = {**key, "x-meridian-client-region": "us-east"}
    response = httpx.post(gw.url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert accepts(document, answer_schema(document, path, "post", "200"), response.json())


@pytest.mark.parametrize("path", list(MINIMAL))
def test_a_body_the_schema_rejects_is_a_400(gw: RunningGateway, document: dict[str, Any], path: str) -> None:
    body = {k: v for k, v in MINIMAL[path].items() if k != "model"}
    assert not accepts(document, request_schema(document, path), body)
    response = httpx.post(
        gw.url + path, json=body, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert accepts(document, answer_schema(document, path, "post", "400"), response.json())


def test_optional_fields_sent_as_null_are_accepted_as_documented(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    # OpenAI clients send `null` for defaults; the gateway reads it as "not given".
    body = {**MINIMAL["/v1/chat/completions"], "stream": None, "n": None, "return_token_ids": None}
    assert accepts(document, request_schema(document, "/v1/chat/completions"), body)
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {GLOBAL_KEY}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/v1/models", "/v1/quota"])
def test_listings_answer_as_documented(gw: RunningGateway, document: dict[str, Any], path: str) -> None:
    response = httpx.get(gw.url + path, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=10)
    assert response.status_code == 200, response.text
    assert accepts(document, answer_schema(document, path, "get", "200"), response.json())
    denied = httpx.get(gw.url + path, timeout=10)
    assert denied.status_code == 401
    assert accepts(document, answer_schema(document, path, "get", "401"), denied.json())


def _validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A full JSON Schema 2020-12 validator (the document's dialect) for one of its schemas."""
    return Draft202012Validator({**schema, "components": document["components"]})


_BATCH = {"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
_RESPONSE = {"model": "meridian-small", "input": "Hi", "max_output_tokens": 4}
_FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
# An agent loop's second turn: the question, the model's call, the client's result of it.
_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "Sunny"}],
    },
]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages", {**MINIMAL["/v1/messages"], "max_tokens": 0}, "max_tokens"),
        # A choice that asks for a call, without tools to call, would be answered in text.
        (
            "/v1/chat/completions",
            {**MINIMAL["/v1/chat/completions"], "tool_choice": "required"},
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            {
                **MINIMAL["/v1/chat/completions"],
                "tools": [],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            {**MINIMAL["/v1/chat/completions"], "tool_choice": "sometimes"},
            "tool_choice",
        ),
        (
            "/v1/completions",
            {**MINIMAL["/v1/completions"], "tools": None, "tool_choice": "required"},
            "tool_choice",
        ),
        ("/v1/messages", {**MINIMAL["/v1/messages"], "messages": []}, "messages"),
        (
            "/v1/messages",
            {**MINIMAL["/v1/messages"], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "web_search_20250305",
        ),
        ("/v1/messages", {**MINIMAL["/v1/messages"], "tool_choice": {"type": "any"}}, "tool_choice"),
        (
            "/v1/messages",
            {**MINIMAL["/v1/messages"], "tools": [], "tool_choice": {"type": "tool", "name": "f"}},
            "tool_choice",
        ),
        (
            "/v1/messages",
            {**MINIMAL["/v1/messages"], "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking",
        ),
        ("/v1/responses", {**_RESPONSE, "model": ""}, "model"),
        ("/v1/responses", {**_RESPONSE, "input": []}, "input"),
        ("/v1/responses", {**_RESPONSE, "max_output_tokens": 0}, "max_output_tokens"),
        ("/v1/responses", {**_RESPONSE, "temperature": 3}, "temperature"),
        ("/v1/responses", {**_RESPONSE, "reasoning": {"effort": "high"}}, "reasoning"),
        ("/v1/responses", {**_RESPONSE, "background": True, "stream": True}, "stream"),
        ("/v1/responses", {**_RESPONSE, "background": True, "store": False}, "store"),
        ("/v1/responses", {**_RESPONSE, "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ("/v1/responses", {**_RESPONSE, "tools": [{**_FUNCTION, "defer_loading": True}]}, "defer_loading"),
        ("/v1/responses", {**_RESPONSE, "tool_choice": "required"}, "tool_choice"),
        (
            "/v1/responses",
            {**_RESPONSE, "tools": [_FUNCTION], "tool_choice": {"type": "file_search"}},
            "tool_choice",
        ),
        (
            "/v1/responses",
            {
                **_RESPONSE,
                "input": [
                    {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}
                ],
            },
            "input[0].output[0]",
        ),
        (
            "/v1/responses",
            {**_RESPONSE, "input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "arguments",
        ),
        (
            "/v1/messages",
            {**MINIMAL["/v1/messages"], "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "image",
        ),
        ("/v1/batches", {**_BATCH, "priority": "high"}, "priority"),
        ("/v1/batches", {**_BATCH, "callback_url": "ftp://example.com/done"}, "callback_url"),
        ("/v1/batches", {**_BATCH, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ("/v1/batches", {**_BATCH, "metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_what_a_door_refuses_its_schema_refuses_too(
    gw: RunningGateway, document: dict[str, Any], path: str, body: dict[str, Any], param: str
) -> None:
    """The document states the doors' own rules (schemathesis's positive-data check found the
    ones it did not): a body it allows is never refused as invalid, and one it refuses is a 400."""
    validator = _validator(document, request_schema(document, path))
    assert not validator.is_valid(body)
    response = httpx.post(
        gw.url + path, json=body, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert param in response.text


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/messages", {**MINIMAL["/v1/messages"], "max_tokens": 1}, 200),
        (
            "/v1/messages",
            {
                **MINIMAL["/v1/messages"],
                "tools": [],
                "tool_choice": {"type": "auto"},
                "thinking": {"type": "disabled"},
            },
            200,
        ),
        # Tool calling, served by the provider (the node calls no tools).
        (
            "/v1/messages",
            {
                **MINIMAL["/v1/messages"],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
            },
            200,
        ),
        # A whole number is an integer to JSON Schema (schemathesis sends 2.0 for one).
        ("/v1/messages", {**MINIMAL["/v1/messages"], "max_tokens": 2.0}, 200),
        ("/v1/chat/completions", {**MINIMAL["/v1/chat/completions"], "max_tokens": 2.0, "n": 1.0}, 200),
        # "none" and "auto" ask for no call: without tools they ask for nothing.
        ("/v1/chat/completions", {**MINIMAL["/v1/chat/completions"], "tool_choice": "none"}, 200),
        (
            "/v1/chat/completions",
            {**MINIMAL["/v1/chat/completions"], "tools": [], "tool_choice": "auto"},
            200,
        ),
        ("/v1/completions", {**MINIMAL["/v1/completions"], "max_tokens": 2.0}, 200),
        ("/v1/responses", {**_RESPONSE, "max_output_tokens": 4.0}, 200),
        ("/v1/responses", _RESPONSE, 200),
        ("/v1/responses", {**_RESPONSE, "input": [{"role": "developer", "content": "Be brief."}]}, 200),
        ("/v1/responses", {**_RESPONSE, "stream": False, "background": True, "store": True}, 200),
        # Function tools and a conversation of calls, served by the provider (the node calls none).
        (
            "/v1/responses",
            {
                **_RESPONSE,
                "tools": [_FUNCTION, {"type": "function", "name": "now", "strict": None}],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": False,
            },
            200,
        ),
        ("/v1/responses", {**_RESPONSE, "input": _CONVERSATION, "tools": [_FUNCTION]}, 200),
        ("/v1/responses", {**_RESPONSE, "tools": [_FUNCTION], "tool_choice": "none"}, 200),
        # A previous response this tenant does not have: not found, as a path id would be.
        ("/v1/responses", {**_RESPONSE, "previous_response_id": "resp_none"}, 404),
        ("/v1/batches", {**_BATCH, "callback_url": "https://example.com/done"}, 404),
        ("/v1/batches", {**_BATCH, "metadata": {f"k{i}": "v" * 512 for i in range(16)}}, 404),
    ],
)
def test_what_a_schema_allows_its_door_does_not_refuse_as_invalid(
    gw: RunningGateway, document: dict[str, Any], path: str, body: dict[str, Any], status: int
) -> None:
    """404: the batch names no file of this tenant, the refusal a valid body gets."""
    assert _validator(document, request_schema(document, path)).is_valid(body)
    response = httpx.post(
        gw.url + path, json=body, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=60
    )
    assert response.status_code == status, response.text


def test_a_function_call_and_its_conversation_answer_as_documented(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    """The answer with a function_call output item, its follow-up, and the input items of both
    (messages, calls, outputs) validate against the document's answer schemas."""
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    created = httpx.post(
        gw.url + "/v1/responses", json={**_RESPONSE, "tools": [_FUNCTION]}, headers=headers, timeout=60
    )
    assert created.status_code == 200, created.text
    answer = created.json()
    assert [item["type"] for item in answer["output"]] == ["function_call"]
    call = answer["output"][0]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny"}
    follow_up = httpx.post(
        gw.url + "/v1/responses",
        json={**_RESPONSE, "input": [result], "tools": [_FUNCTION], "previous_response_id": answer["id"]},
        headers=headers,
        timeout=60,
    )
    assert follow_up.status_code == 200, follow_up.text
    listed = httpx.post(
        gw.url + "/v1/responses",
        json={**_RESPONSE, "input": _CONVERSATION, "tools": [_FUNCTION]},
        headers=headers,
        timeout=60,
    ).json()
    listed_schema = answer_schema(document, "/v1/responses/{response_id}/input_items", "get", "200")
    for made in (answer, follow_up.json(), listed):
        assert _validator(document, answer_schema(document, "/v1/responses", "post", "200")).is_valid(made)
        url = f"{gw.url}/v1/responses/{made['id']}/input_items?order=asc"
        items = httpx.get(url, headers=headers, timeout=30)
        assert items.status_code == 200 and _validator(document, listed_schema).is_valid(items.json()), (
            items.text
        )
        if made is listed:
            kinds = [item["type"] for item in items.json()["data"]]
            assert kinds == ["message", "function_call", "function_call_output"]


def test_usage_and_costs_answer_with_no_parameters_as_the_document_allows(
    gw: RunningGateway, document: dict[str, Any]
) -> None:
    for path in ("/v1/usage", "/v1/costs"):
        parameters = document["paths"][path]["get"].get("parameters", [])
        assert not any(p.get("required") for p in parameters if "name" in p)
        response = httpx.get(gw.url + path, headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=30)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [*MINIMAL, "/v1/responses"])
def test_each_generation_door_answers_with_a_documented_media_type(
    gw: RunningGateway, document: dict[str, Any], path: str, stream: bool
) -> None:
    """A body in JSON with its length, a stream as server-sent events (the doors build their
    answers themselves: gateway/api/answer.py and sse.py)."""
    body = {**(MINIMAL.get(path) or _RESPONSE), "stream": stream}
    headers = {"authorization": f"Bearer {GLOBAL_KEY}", "x-meridian-client-region": "us-east"}
    with httpx.stream("POST", gw.url + path, json=body, headers=headers, timeout=60) as response:
        data = response.read()
    assert response.status_code == 200, data
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type == ("text/event-stream" if stream else "application/json")
    assert media_type in document["paths"][path]["post"]["responses"]["200"]["content"]
    assert response.headers["x-request-id"].startswith("req_")
    if stream:
        assert response.headers["cache-control"] == "no-cache" and data.startswith((b"data: ", b"event: "))
    else:
        assert int(response.headers["content-length"]) == len(data) and json.loads(data)


@pytest.mark.parametrize(
    ("template", "names"),
    [
        ("/v1/files", {"purpose", "limit", "order", "after"}),
        ("/v1/responses/{response_id}/input_items", {"limit", "order", "after"}),
    ],
)
def test_a_list_declares_the_query_parameters_its_door_reads(
    gw: RunningGateway, document: dict[str, Any], template: str, names: set[str]
) -> None:
    """A value its schema allows is served as documented; one it refuses is a 400 naming it."""
    operation = document["paths"][template]["get"]
    declared = {p["name"]: p["schema"] for p in operation["parameters"] if p["in"] == "query"}
    assert set(declared) == names
    most = declared["limit"]["maximum"]
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    created = httpx.post(gw.url + "/v1/responses", json=_RESPONSE, headers=headers, timeout=60).json()
    path = template.format(response_id=created["id"])
    for name, value in [("limit", 1), ("limit", most), ("order", "asc"), ("order", "desc"), ("after", "x")]:
        assert _validator(document, declared[name]).is_valid(value)
        response = httpx.get(gw.url + path, params={name: value}, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        assert _validator(document, answer_schema(document, template, "get", "200")).is_valid(response.json())
    for name, value in [("limit", 0), ("limit", most + 1), ("order", "newest")]:
        assert not _validator(document, declared[name]).is_valid(value)
        response = httpx.get(gw.url + path, params={name: value}, headers=headers, timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == name

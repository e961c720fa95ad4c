"""Planning a request: model resolution, tenant caps, token estimates, forwarded bodies."""

from __future__ import annotations

import pytest

from gateway.call.plan import estimate_prompt_tokens, plan_request
from gateway.config import TokenEstimateConfig
from protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ContextLengthError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    decode_request,
)
from router.types import CatalogModel, Target, TenantLimits, TenantPolicy

CATALOG = (CatalogModel("meridian-small", "small"), CatalogModel("meridian-large", "large"))
ESTIMATE = TokenEstimateConfig()
NODE = Target("node", "n1", "http://n1", "eu-west", "eu", "meridian-small", "test")


def chat(**body: object) -> tuple[ChatCompletionRequest, dict[str, object]]:
    body = {"model": "meridian-small", "messages": [{"role": "user", "content": "x" * 40}], **body}
    import json

    return decode_request(json.dumps(body).encode(), ChatCompletionRequest), body


def tenant(**limits: int) -> TenantPolicy:
    return TenantPolicy("t", frozenset(), models=frozenset({"meridian-small"}), limits=TenantLimits(**limits))


def test_prompt_estimate_is_bytes_over_four_plus_message_overhead() -> None:
    request, _ = chat()
    assert estimate_prompt_tokens(request, ESTIMATE) == 10 + 4
    tokens = CompletionRequest(model="m", prompt=[1, 2, 3, 4, 5])
    assert estimate_prompt_tokens(tokens, ESTIMATE) == 5


def test_unknown_model_is_404_and_disallowed_model_is_403() -> None:
    with pytest.raises(NotFoundError):
        plan_request("chat", *chat(model="nope"), tenant(), CATALOG, ESTIMATE)
    with pytest.raises(PermissionDeniedError):
        plan_request("chat", *chat(model="meridian-large"), tenant(), CATALOG, ESTIMATE)


def test_caps_reject_oversized_requests() -> None:
    with pytest.raises(InvalidRequestError, match="cap of 16"):
        plan_request("chat", *chat(max_tokens=17), tenant(max_tokens=16), CATALOG, ESTIMATE)
    with pytest.raises(ContextLengthError):
        plan_request("chat", *chat(max_tokens=10), tenant(context_tokens=20), CATALOG, ESTIMATE)


def test_missing_max_tokens_is_bounded_by_the_tenant_caps() -> None:
    assert plan_request("chat", *chat(), tenant(max_tokens=16), CATALOG, ESTIMATE).max_tokens == 16
    assert plan_request("chat", *chat(), tenant(context_tokens=100), CATALOG, ESTIMATE).max_tokens == 100 - 14


def test_streams_to_nodes_ask_for_usage_and_token_ids() -> None:
    plan = plan_request("chat", *chat(max_completion_tokens=9, stream=True), tenant(), CATALOG, ESTIMATE)
    body = plan.body(stream=True)
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True
    assert body["max_tokens"] == 9 and "max_completion_tokens" not in body
    assert not plan.include_usage and not plan.wants_token_ids
    assert plan.estimated_tokens == 14 + 9


def test_missing_max_tokens_fits_the_context_cap_when_the_max_tokens_cap_would_not() -> None:
    # Prompt ~14 tokens; the cap of 16 does not fit a 20-token context, but 6 does: no 400 for a
    # max_tokens the client never sent.
    plan = plan_request("chat", *chat(), tenant(max_tokens=16, context_tokens=20), CATALOG, ESTIMATE)
    assert plan.max_tokens == 20 - 14


def test_client_continuation_tokens_count_towards_the_prompt_estimate() -> None:
    request, body = chat(continuation_token_ids=list(range(100)))
    assert estimate_prompt_tokens(request, ESTIMATE) == 14 + 100
    with pytest.raises(ContextLengthError):
        plan_request("chat", request, body, tenant(context_tokens=50), CATALOG, ESTIMATE)


def test_route_notes_are_values_a_stage_returns_and_never_edits() -> None:
    """x-meridian-route's lead (`auto:small;classifier=…;`) is made of the notes each stage
    returned on its plan: adding one leaves the plan it was added to as it was."""
    plan = plan_request("chat", *chat(), tenant(), CATALOG, ESTIMATE)
    assert plan.route_notes == () and plan.route_prefix == ""
    auto = plan.noted("auto:small", "classifier=0.34<1.00")
    judged = auto.noted("confidence=0.91>=0.50")
    assert auto.route_prefix == "auto:small;classifier=0.34<1.00;"
    assert judged.route_prefix == "auto:small;classifier=0.34<1.00;confidence=0.91>=0.50;"
    assert plan.route_notes == () and len(auto.route_notes) == 2

"""From a parsed client request and its tenant's policy to what the gateway will forward.

Pure: resolves the model (including "auto"), applies the tenant's caps, estimates tokens, and
builds the body each target gets. Raises the OpenAI errors the client should see: 400 over a cap,
403 model not allowed, 404 unknown model.

Token estimate: the gateway has no tokenizer, so a prompt counts `ceil(utf-8 bytes /
bytes_per_token)` tokens (4 bytes per token by default, OpenAI's rule of thumb for English) plus 4
per chat message for the template's role markers; token-id prompts count exactly. It is only used
for quota reservations, "auto" tiering and the context cap; settlement uses the node's real usage.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.config import TokenEstimateConfig
from gateway.upstreams.base import Endpoint
from protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ContextLengthError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from protocol.capabilities import Capability, asked_capabilities
from protocol.prefix_cache import conversation_of
from router import (
    AUTO_MODEL,
    DEFAULT_AUTO,
    NO_HISTORY,
    AutoPolicy,
    EscalationHistory,
    ModelNotAllowedError,
    RequestFeatures,
    TierChoice,
    UnknownModelError,
    content_flags,
    resolve_model,
)
from router.confidence import ConfidenceRule
from router.types import CatalogModel, TenantPolicy

# Fields the gateway sets itself on every forwarded body (per attempt, per target kind).
_GATEWAY_FIELDS = ("model", "stream", "stream_options", "max_completion_tokens", "return_token_ids")
_MESSAGE_OVERHEAD_TOKENS = 4
# The prefix of the prompt that routing hashes for prefix-cache affinity: long enough to tell
# system prompts apart, short enough to hash per request for free.
_AFFINITY_CHARS = 512


@dataclass(frozen=True)
class RequestPlan:
    endpoint: Endpoint
    model: CatalogModel
    base_body: dict[str, Any]  # the client's body without the fields in _GATEWAY_FIELDS
    stream: bool
    max_tokens: int | None  # what is forwarded; None leaves it to the node
    prompt_tokens_estimate: int
    estimated_tokens: int  # prompt + completion, for the quota reservation
    include_usage: bool  # the client asked for a final usage chunk
    wants_token_ids: bool  # the client asked for token ids itself
    affinity_key: str
    n: int
    # What the request asks of its upstream beyond text (protocol/capabilities.py), each with the
    # field that asks it: routing and admission consider only the upstreams that serve them all.
    asks: Mapping[Capability, str] = dataclasses.field(default_factory=dict)
    # The model the client asked for when admission degraded the request to `model`, the small
    # tier (gateway/admission): routing marks its targets "degraded".
    degraded_from: str | None = None
    # How "auto" chose `model` (the classifier's tier and reason); None for a named model.
    auto: TierChoice | None = None
    # Set on an "auto" request that starts on the small tier and may escalate (the pipeline's
    # cascade stage): the rule that judges the small model's first tokens, and the large model.
    cascade: ConfidenceRule | None = None
    escalate_to: CatalogModel | None = None
    # What planning and the cascade decided, in order: they lead x-meridian-route and the usage
    # event's route reason (`auto:small;classifier=0.34<1.00;` ...). Each stage that decides
    # something returns the plan with its note added (`noted`); nothing edits a shared string.
    route_notes: tuple[str, ...] = ()

    def noted(self, *notes: str) -> RequestPlan:
        return dataclasses.replace(self, route_notes=(*self.route_notes, *notes))

    @functools.cached_property
    def conversation(self) -> tuple[tuple[str, str], ...]:
        """A chat's messages as (role, text): the names of the prefixes nodes cache (routing's
        cost and admission's estimate look them up); () for a completion prompt (whose body may
        carry any unknown field, `messages` included, unvalidated)."""
        return conversation_of(self.base_body.get("messages") or ()) if self.endpoint == "chat" else ()

    @functools.cached_property
    def needs(self) -> frozenset[str]:
        return frozenset(self.asks)

    @property
    def route_prefix(self) -> str:
        return "".join(f"{note};" for note in self.route_notes)

    @property
    def wants_logprobs(self) -> bool:
        """The client asked for logprobs itself (the cascade's own are not passed on)."""
        asked = self.base_body.get("logprobs")
        return asked is not None and asked is not False

    def body(self, *, stream: bool) -> dict[str, Any]:
        """The body every target gets; each is asked for the model it serves (the forwarder sets
        `model`: a degraded target serves the small tier). Streams always ask for usage and token
        ids: usage settles the quota, token ids let a broken stream continue elsewhere (upstreams
        that cannot report them drop the field, as commercial providers' adapters do)."""
        body = dict(self.base_body)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if stream:
            body["stream_options"] = {"include_usage": True}
        if stream or self.wants_token_ids:
            body["return_token_ids"] = True
        if self.cascade is not None and not self.wants_logprobs:
            # The small model's confidence is read from its own logprobs.
            body["logprobs"] = True if self.endpoint == "chat" else 0
        return body


def estimate_text_tokens(text: str, config: TokenEstimateConfig) -> int:
    return math.ceil(len(text.encode("utf-8")) / config.bytes_per_token)


def estimate_prompt_tokens(
    request: ChatCompletionRequest | CompletionRequest, config: TokenEstimateConfig
) -> int:
    # Tokens the client carries over from an earlier generation are prompt for the node.
    carried = len(request.continuation_token_ids or ())
    if isinstance(request, ChatCompletionRequest):
        text_tokens = sum(estimate_text_tokens(m.text(), config) for m in request.messages)
        return carried + text_tokens + _MESSAGE_OVERHEAD_TOKENS * len(request.messages)
    prompt = request.prompt
    if isinstance(prompt, str):
        return carried + estimate_text_tokens(prompt, config)
    # A list of strings, of token ids, or of token-id lists: token ids count exactly.
    total = carried
    for part in prompt:
        if isinstance(part, str):
            total += estimate_text_tokens(part, config)
        elif isinstance(part, list):
            total += len(part)
        else:
            total += 1
    return total


def affinity_key(request: ChatCompletionRequest | CompletionRequest) -> str:
    if isinstance(request, ChatCompletionRequest):
        # The leading messages (usually the system prompt) are what a prefix cache can share.
        text = "\x00".join(f"{m.role}:{m.text()}" for m in request.messages[:2])
    elif isinstance(request.prompt, str):
        text = request.prompt
    else:
        text = str(request.prompt[:64])
    return text[:_AFFINITY_CHARS]


def request_features(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    history: EscalationHistory,
) -> RequestFeatures:
    """What the "auto" classifier reads: the estimate already made, the conversation's shape, and
    flags from its text (router.content_flags scans only its end)."""
    if isinstance(request, ChatCompletionRequest):
        texts = [m.text() for m in request.messages]
        turns = sum(1 for m in request.messages if m.role == "user")
    else:
        texts = (
            [request.prompt]
            if isinstance(request.prompt, str)
            else [p for p in request.prompt if isinstance(p, str)]
        )
        turns = 1
    code, math_, reasoning = content_flags(texts)
    return RequestFeatures(
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        turns=max(turns, 1),
        has_code=code,
        has_math=math_,
        asks_reasoning=reasoning,
        history=history,
    )


def _check_caps(policy: TenantPolicy, prompt_tokens: int, requested: int | None) -> int | None:
    """The max_tokens to forward, or a 400 when the request is over the tenant's caps."""
    limits = policy.limits
    if requested is not None and requested < 1:
        raise InvalidRequestError("max_tokens must be at least 1.", param="max_tokens")
    if limits.max_tokens is not None and requested is not None and requested > limits.max_tokens:
        raise InvalidRequestError(
            f"max_tokens is {requested}, above this tenant's cap of {limits.max_tokens}.",
            param="max_tokens",
            code="max_tokens_exceeded",
        )
    max_tokens = requested if requested is not None else limits.max_tokens
    if limits.context_tokens is not None:
        if requested is None and max_tokens is not None:
            # The tenant's cap is only a default here: forward what fits the context cap.
            max_tokens = min(max_tokens, max(limits.context_tokens - prompt_tokens, 0)) or None
        total = prompt_tokens + (max_tokens or 0)
        if prompt_tokens >= limits.context_tokens or total > limits.context_tokens:
            raise ContextLengthError(
                f"This tenant's context is capped at {limits.context_tokens} tokens; the request "
                f"needs about {total} (an estimated {prompt_tokens} in the prompt plus "
                f"{max_tokens or 0} to generate).",
                param="messages" if max_tokens is None else "max_tokens",
            )
        if max_tokens is None:
            # Without a max_tokens the node would generate up to the model's context: bound it by
            # the tenant's instead.
            max_tokens = limits.context_tokens - prompt_tokens
    return max_tokens


def plan_request(
    endpoint: Endpoint,
    request: ChatCompletionRequest | CompletionRequest,
    body: dict[str, Any],
    policy: TenantPolicy,
    catalog: Sequence[CatalogModel],
    estimate: TokenEstimateConfig,
    auto: AutoPolicy = DEFAULT_AUTO,
    history: EscalationHistory = NO_HISTORY,
    *,
    caps: bool = True,
) -> RequestPlan:
    """`history` is the tenant's recent escalations of its "auto" family (the thrash guard's).
    `caps`: False for a token count, which generates nothing, so the tenant's max_tokens and
    context caps do not apply to it (a client counts to learn whether a prompt fits)."""
    prompt_tokens = estimate_prompt_tokens(request, estimate)
    requested = request.requested_max_tokens()
    # The model is checked before the caps, so an unknown model is a 404 whatever else is wrong.
    output_hint = requested if requested is not None else policy.limits.max_tokens
    features = (
        request_features(request, prompt_tokens=prompt_tokens, max_tokens=output_hint, history=history)
        if request.model == AUTO_MODEL
        else RequestFeatures(prompt_tokens=prompt_tokens, max_tokens=output_hint)
    )
    try:
        resolved = resolve_model(request.model, policy, catalog, features=features, auto=auto)
    except UnknownModelError as exc:
        raise NotFoundError(exc.message, param="model") from None
    except ModelNotAllowedError as exc:
        raise PermissionDeniedError(exc.message, param="model") from None
    max_tokens = _check_caps(policy, prompt_tokens, requested) if caps else None
    completion = max_tokens if max_tokens is not None else estimate.default_completion_tokens
    base_body = {key: value for key, value in body.items() if key not in _GATEWAY_FIELDS}
    return RequestPlan(
        endpoint=endpoint,
        model=resolved.model,
        base_body=base_body,
        stream=request.stream,
        max_tokens=max_tokens,
        prompt_tokens_estimate=prompt_tokens,
        estimated_tokens=prompt_tokens + completion * max(1, request.n),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        wants_token_ids=request.return_token_ids,
        affinity_key=affinity_key(request),
        n=request.n,
        asks=asked_capabilities(request),
        auto=resolved.auto,
    )

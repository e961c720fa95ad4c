"""The safety layer on the request path: `SafetyGuard` (one per gateway: classifier, audit log,
metrics) and `CallSafety` (one per call: the tenant's content policy and every decision made).

The pipeline calls, in order:

    screen_input(endpoint, body)      rules and blocklists, before anything else (cheap); returns
                                      the body with redactions, raises ContentBlocked
    while_checking_input(work)        the upstream work runs beside the input classifier; a block
                                      that arrives first cancels the work (freeing its KV blocks)
    input_verdict()                   the classifier's answer, before the first byte is sent
    check_output(result) / guard_stream(items)
                                      output checks over every text field (output.py), whole or
                                      held back on streams
    finish()                          records the sides that were never scanned as `unscanned`

`CallSafety.decisions` is the one place a call's checks (layer, name, action, score, latency)
can be read by tracing and the usage ledger; `blocked` and `flagged` summarise them.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from gateway.safety.audit import AuditLog, SafetyMetrics
from gateway.safety.classifier import Classifier, OnnxClassifier
from gateway.safety.config import SafetyConfig
from gateway.safety.errors import ClassifierError, ContentBlocked, SafetyUnavailable
from gateway.safety.output import Blocked, ChoiceChecks, Piece, texts_of, write
from gateway.safety.policy import Action, SafetyPolicy, Where, strongest
from gateway.safety.rules import BlocklistEntry, Finding, redact, scan
from protocol.chunk import Choice, Chunk, Completion, Message, Streamed, StreamFailed

T = TypeVar("T")


@dataclass(frozen=True)
class Decision:
    where: Where
    layer: str  # rules | blocklist | classifier | none
    name: str  # the rule or category; "-" for a whole layer
    action: str  # block | redact | flag | pass | unscanned | error
    score: float | None = None
    latency_s: float = 0.0
    decided_ns: int = 0  # wall clock (time.time_ns) when it was made: where a trace puts its span


class SafetyGuard:
    def __init__(self, config: SafetyConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = SafetyMetrics(registry)
        self.audit = AuditLog(config.audit_path, self.metrics)
        self.classifier: Classifier | None = (
            OnnxClassifier(config.classifier) if config.classifier is not None else None
        )

    @property
    def ready(self) -> bool:
        """False while a configured classifier is not yet loaded and warm (the gateway's /ready)."""
        return self.classifier is None or self.classifier.ready

    async def start(self) -> None:
        await self.audit.start()
        if self.classifier is not None:
            await self.classifier.start()

    async def stop(self) -> None:
        if self.classifier is not None:
            await self.classifier.stop()
        await self.audit.stop()

    def begin(self, request_id: str, tenant: str, policy: SafetyPolicy | None) -> CallSafety:
        return CallSafety(self, request_id, tenant, policy)


@dataclass
class CallSafety:
    guard: SafetyGuard
    request_id: str
    tenant: str
    policy: SafetyPolicy | None
    decisions: list[Decision] = field(default_factory=list)
    _classifying: asyncio.Task[Mapping[str, float]] | None = None
    _input_text: str = ""
    _scanned: set[Where] = field(default_factory=set)
    _input_started: float = 0.0

    @property
    def blocked(self) -> bool:
        return any(d.action == "block" for d in self.decisions)

    @property
    def flagged(self) -> bool:
        return any(d.action in ("flag", "redact", "block") for d in self.decisions)

    @property
    def changed(self) -> bool:
        """A check altered what was asked or answered (redacted or blocked): the usage event says so."""
        return any(d.action in ("redact", "block") for d in self.decisions)

    # -- input ------------------------------------------------------------------------------

    def screen_input(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """Rules and blocklists over every text of the request; the body, redacted where the
        policy says; starts the input classifier (if the policy has it on input)."""
        policy = self.policy
        if policy is None or not policy.input:
            return body
        self._scanned.add("input")
        texts = list(_request_texts(endpoint, body))
        self._input_text = "\n".join(text for _, text in texts)
        if "classifier" in policy.input:
            self._input_started = time.monotonic()
            self._classifying = asyncio.ensure_future(self._classify(self._input_text))
        rules, blocklist = self._layers("input")
        if not rules and not blocklist:
            return body
        started = time.monotonic()
        found = [(setter, text, scan(text, rules, blocklist)) for setter, text in texts]
        latency = time.monotonic() - started
        self._observe("rules", "input", latency)
        hits = [(f, policy.action_for(f)) for _, _, findings in found for f in findings]
        for finding, action in hits:
            self._decide("input", _layer_of(finding), finding.rule, action, None, latency, self._input_text)
        self._passes("input", rules, blocklist, hits, latency, self._input_text)
        blocked = next(((f, a) for f, a in hits if a == "block"), None)
        if blocked is not None:
            self._cancel_classifier()
            raise ContentBlocked("input", _layer_of(blocked[0]), blocked[0].rule)
        if any(a == "redact" for _, a in hits):
            body = _copy_body(body)
            for setter, text, findings in found:
                redacts = [f for f in findings if policy.action_for(f) == "redact"]
                if redacts:
                    setter(body, redact(text, redacts))
        return body

    async def while_checking_input(self, work: Awaitable[T]) -> T:
        """`work` (routing and the upstream call) beside the input classifier. A block that comes
        first cancels `work` and raises; otherwise `work`'s result, the verdict maybe pending."""
        if self._classifying is None:
            return await work
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, self._classifying}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                self._input_judgement()  # raises on a block or a fail-closed error
            return await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def input_verdict(self) -> None:
        """Raises ContentBlocked or SafetyUnavailable; returns once the input may be served."""
        if self._classifying is None:
            return
        await asyncio.wait({self._classifying})
        self._input_judgement()

    def _input_judgement(self) -> None:
        task, self._classifying = self._classifying, None
        assert task is not None and task.done()
        exc = task.exception()
        self._judge_scores(
            "input", None if exc else task.result(), exc, self._input_text, self._input_started
        )

    def _cancel_classifier(self) -> None:
        task, self._classifying = self._classifying, None
        if task is not None:
            task.cancel()

    # -- output -----------------------------------------------------------------------------

    async def check_output(self, result: Completion) -> Completion:
        """A whole (non-streamed) answer: every text field of each choice checked (output.py); a
        blocked choice keeps no model text and ends with finish_reason `content_filter`."""
        policy = self.policy
        if policy is None or not policy.output:
            return result
        self._scanned.add("output")
        rules, blocklist = self._layers("output")
        for choice in result.choices:
            checks = ChoiceChecks(policy, rules, blocklist)
            had_logprobs = choice.logprobs is not None
            started = time.monotonic()
            checked = checks.feed(choice, final=True)
            latency = time.monotonic() - started
            self._observe("rules", "output", latency)
            if isinstance(checked, Blocked):
                assert checked.finding is not None
                self._decide("output", _layer_of(checked.finding), checked.name, "block", None, latency, "")
                _filter(choice)
                continue
            text = texts_of(checked)
            for finding, action in checks.hits:
                self._decide("output", _layer_of(finding), finding.rule, action, None, latency, text)
            self._passes("output", rules, blocklist, checks.hits, latency, text)
            if "classifier" in policy.output and text:
                started = time.monotonic()
                scores, error = await self._scores(text)
                if self._judge_scores("output", scores, error, text, started, raise_block=False):
                    _filter(choice)
                    continue
            write(choice, checked, had_logprobs=had_logprobs)
        return result

    def guard_stream(
        self, endpoint: str, items: AsyncGenerator[Streamed, None]
    ) -> AsyncGenerator[Streamed, None]:
        """The client's chunks with every text field held back until checked (output.py); a
        block ends the stream with `content_filter` and an explicit error, and stops reading the
        upstream. However the stream ends, what is still held is checked as the last window and
        what passes is released before the end."""
        policy = self.policy
        if policy is None or not policy.output:
            return items
        self._scanned.add("output")
        return self._guarded(endpoint, items)

    async def _guarded(
        self, endpoint: str, items: AsyncGenerator[Streamed, None]
    ) -> AsyncGenerator[Streamed, None]:
        try:
            async for item in self._checked(endpoint, items):
                yield item
        finally:
            await items.aclose()

    async def _checked(self, endpoint: str, items: AsyncIterator[Streamed]) -> AsyncGenerator[Streamed, None]:
        assert self.policy is not None
        rules, blocklist = self._layers("output")
        streamed = _StreamState(self.policy, rules, blocklist, self.guard.config.classify_every_chars)
        last = Chunk(object="chat.completion.chunk" if endpoint == "chat" else "text_completion")
        ending: StreamFailed | None = None
        try:
            async for item in items:
                if isinstance(item, StreamFailed):
                    ending = item
                    break
                last = item
                blocked = await self._guard_chunk(item, streamed, final=False)
                if blocked is not None:
                    yield _content_filter_chunk(endpoint, item, streamed.indexes())
                    yield _blocked(blocked)
                    return
                if _has_content(item):
                    yield item
            # The stream is over: what is held is all the text there will ever be.
            rest = _flush_chunk(endpoint, last, streamed.held())
            if rest is not None:
                blocked = await self._guard_chunk(rest, streamed, final=True)
                if blocked is not None:
                    yield _content_filter_chunk(endpoint, last, streamed.indexes())
                    yield _blocked(blocked)
                    return
                if _has_content(rest):
                    yield rest
            if ending is not None:
                yield ending
        except SafetyUnavailable as exc:
            # Fail closed mid-stream: what is held was not checked, so it is not sent.
            yield StreamFailed(message=str(exc), code="safety_unavailable")
        finally:
            self._finish_stream(streamed)

    async def _guard_chunk(self, chunk: Chunk, streamed: _StreamState, *, final: bool) -> str | None:
        """Rewrites `chunk` to carry only checked text; the blocking rule's name, if any."""
        policy = self.policy
        assert policy is not None
        for choice in chunk.choices:
            state = streamed.state(choice.index)
            ends = final or choice.finish_reason is not None
            had_logprobs = choice.logprobs is not None or state.had_logprobs
            state.had_logprobs = had_logprobs
            started = time.monotonic()
            seen = len(state.checks.hits)
            checked = state.checks.feed(choice, final=ends)
            streamed.rules_s += time.monotonic() - started
            if isinstance(checked, Blocked):
                assert checked.finding is not None
                self._decide(
                    "output", _layer_of(checked.finding), checked.name, "block", None, streamed.rules_s, ""
                )
                return checked.name
            new_hits = state.checks.hits[seen:]
            streamed.hits.extend(new_hits)
            for finding, action in new_hits:
                self._decide("output", _layer_of(finding), finding.rule, action, None, 0.0, texts_of(checked))
            pieces = checked
            if "classifier" in policy.output:
                state.waiting += pieces
                pieces = []
                waiting = texts_of(state.waiting)
                if state.waiting and (ends or len(waiting) >= streamed.classify_every):
                    segment = state.context + waiting
                    started = time.monotonic()
                    scores, error = await self._scores(segment)
                    streamed.classified = True
                    if self._judge_scores("output", scores, error, segment, started, raise_block=False):
                        return "classifier"
                    pieces, state.waiting = state.waiting, []
                    state.context = waiting[-streamed.classify_every :]
            write(choice, pieces, had_logprobs=had_logprobs and bool(pieces or choice.logprobs))
        return None

    def _finish_stream(self, streamed: _StreamState) -> None:
        self._observe("rules", "output", streamed.rules_s)
        rules, blocklist = streamed.rules, streamed.blocklist
        self._passes("output", rules, blocklist, streamed.hits, streamed.rules_s, "")

    # -- the end ----------------------------------------------------------------------------

    def finish(self) -> None:
        """Sides this call never scanned are recorded `unscanned` (never `pass`); after a block
        on input there was no output to scan."""
        for where in ("input",) if self.blocked else ("input", "output"):
            if where not in self._scanned:
                self._scanned.add(where)  # type: ignore[arg-type]
                self._decide(where, "none", "-", "unscanned", None, 0.0, "")  # type: ignore[arg-type]
        self._cancel_classifier()

    # -- shared -----------------------------------------------------------------------------

    def _layers(self, where: Where) -> tuple[tuple[str, ...], tuple[BlocklistEntry, ...]]:
        policy = self.policy
        assert policy is not None
        layers = policy.layers(where)
        rules = tuple(policy.rules) if "rules" in layers else ()
        blocklist = policy.blocklist_entries() if "blocklist" in layers else ()
        return rules, blocklist

    async def _classify(self, text: str) -> Mapping[str, float]:
        classifier = self.guard.classifier
        if classifier is None:
            raise ClassifierError("no classifier is configured (safety.classifier)")
        return await classifier.classify(text)

    async def _scores(self, text: str) -> tuple[Mapping[str, float] | None, BaseException | None]:
        try:
            return await self._classify(text), None
        except ClassifierError as exc:
            return None, exc

    def _judge_scores(
        self,
        where: Where,
        scores: Mapping[str, float] | None,
        error: BaseException | None,
        text: str,
        started: float,
        *,
        raise_block: bool = True,
    ) -> bool:
        """Records the classifier's decisions; True (or ContentBlocked) when it blocks. A failed
        check fails open (`unscanned`) or closed (`error`, SafetyUnavailable)."""
        policy = self.policy
        assert policy is not None
        latency = time.monotonic() - started
        self._observe("classifier", where, latency)
        hits = []
        if error is None and scores is not None:
            try:
                hits = policy.scores_to_decisions(scores)
            except KeyError as missing:
                error = ClassifierError(f"the model has no category {missing}")
        if error is not None:
            why = getattr(error, "why", str(error))
            if policy.fail_mode == "closed":
                self._decide(where, "classifier", "-", "error", None, latency, text)
                raise SafetyUnavailable("classifier", why)
            self._decide(where, "classifier", "-", "unscanned", None, latency, text)
            return False
        for name, score, action in hits:
            self._decide(
                where, "classifier", name, "block" if action == "redact" else action, score, latency, text
            )
        if not hits:
            top = max(scores.values(), default=0.0) if scores else 0.0
            self._decide(where, "classifier", "-", "pass", top, latency, text)
        blocking = next((name for name, _, action in hits if action in ("block", "redact")), None)
        if blocking is not None and raise_block:
            raise ContentBlocked(where, "classifier", blocking)
        return blocking is not None

    def _passes(
        self,
        where: Where,
        rules: tuple[str, ...],
        blocklist: tuple[BlocklistEntry, ...],
        hits: list[tuple[Finding, Action]],
        latency: float,
        text: str,
    ) -> None:
        for layer, ran in (("rules", rules), ("blocklist", blocklist)):
            if ran and not any(_layer_of(f) == layer for f, _ in hits):
                self._decide(where, layer, "-", "pass", None, latency, text)

    def _decide(
        self, where: Where, layer: str, name: str, action: str, score: float | None, latency: float, text: str
    ) -> None:
        self.decisions.append(Decision(where, layer, name, action, score, latency, time.time_ns()))
        self.guard.audit.record(
            request_id=self.request_id,
            tenant=self.tenant,
            where=where,
            layer=layer,
            name=name,
            action=action,
            score=score,
            latency_s=latency,
            text=text,
            log_content=bool(self.policy and self.policy.log_content),
        )

    def _observe(self, layer: str, where: str, seconds: float) -> None:
        self.guard.metrics.check_seconds.labels(layer, where).observe(seconds)


@dataclass
class _ChoiceState:
    checks: ChoiceChecks
    waiting: list[Piece] = field(default_factory=list)  # released by the rules, awaiting the classifier
    context: str = ""  # the last classified text, scored again with the next segment
    had_logprobs: bool = False


@dataclass
class _StreamState:
    policy: SafetyPolicy
    rules: tuple[str, ...]
    blocklist: tuple[BlocklistEntry, ...]
    classify_every: int
    rules_s: float = 0.0
    classified: bool = False
    hits: list[tuple[Finding, Action]] = field(default_factory=list)
    _choices: dict[int, _ChoiceState] = field(default_factory=dict)

    def state(self, index: int) -> _ChoiceState:
        if index not in self._choices:
            self._choices[index] = _ChoiceState(ChoiceChecks(self.policy, self.rules, self.blocklist))
        return self._choices[index]

    def indexes(self) -> list[int]:
        return sorted(self._choices) or [0]

    def held(self) -> list[int]:
        """The choices that may still hold text (every one seen: their holds know)."""
        return sorted(self._choices)


# -- the wire shapes this module reads and writes (OpenAI chat and completions) --------------


def _layer_of(finding: Finding) -> str:
    return "blocklist" if finding.category == "blocklist" else "rules"


def _request_texts(endpoint: str, body: dict[str, Any]) -> list[tuple[Any, str]]:
    """(setter, text) for every text the client sent; a setter writes a redacted text back."""
    found: list[tuple[Any, str]] = []
    if endpoint == "chat":
        for i, message in enumerate(body.get("messages") or []):
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                found.append((_message_setter(i, None), content))
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        found.append((_message_setter(i, j), part["text"]))
            # An earlier tool call's arguments are the conversation's text too (a tool-calling
            # upstream reads them; they may carry what the caller was asked for).
            calls = message.get("tool_calls")
            for k, call in enumerate(calls if isinstance(calls, list) else ()):
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    found.append((_arguments_setter(i, k), function["arguments"]))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            found.append((_prompt_setter(None), prompt))
        elif isinstance(prompt, list):
            for i, item in enumerate(prompt):
                if isinstance(item, str):
                    found.append((_prompt_setter(i), item))
    return found


def _message_setter(i: int, j: int | None) -> Any:
    def put(body: dict[str, Any], text: str) -> None:
        if j is None:
            body["messages"][i]["content"] = text
        else:
            body["messages"][i]["content"][j]["text"] = text

    return put


def _arguments_setter(i: int, k: int) -> Any:
    def put(body: dict[str, Any], text: str) -> None:
        body["messages"][i]["tool_calls"][k]["function"]["arguments"] = text

    return put


def _prompt_setter(i: int | None) -> Any:
    def put(body: dict[str, Any], text: str) -> None:
        if i is None:
            body["prompt"] = text
        else:
            body["prompt"][i] = text

    return put


def _copy_body(body: dict[str, Any]) -> dict[str, Any]:
    """Deep enough to rewrite texts without touching the client's parsed body."""
    copied = dict(body)
    if isinstance(body.get("messages"), list):
        # Content parts and tool calls nest; only a redacting request pays for the deep copy.
        copied["messages"] = copy.deepcopy(body["messages"])
    if isinstance(body.get("prompt"), list):
        copied["prompt"] = list(body["prompt"])
    return copied


def _filter(choice: Choice) -> None:
    choice.drop_text()
    choice.finish_reason = "content_filter"


def _has_content(chunk: Chunk) -> bool:
    """A chunk left with nothing for the client (all its text held) is not sent."""
    if not chunk.choices:
        return True  # usage
    for choice in chunk.choices:
        if choice.announces or choice.channels() or choice.logprobs is not None:
            return True
    return False


def _flush_chunk(endpoint: str, last: Chunk, indexes: list[int]) -> Chunk | None:
    """An empty chunk for the last window of each choice: the checks fill it with what is held."""
    if not indexes:
        return None
    choices = [
        Choice(index=i, delta=Message()) if endpoint == "chat" else Choice(index=i, text="") for i in indexes
    ]
    return Chunk(id=last.id, object=last.object, created=last.created, model=last.model, choices=choices)


def _content_filter_chunk(endpoint: str, last: Chunk, indexes: list[int]) -> Chunk:
    choices = [
        Choice(index=i, delta=Message(), finish_reason="content_filter")
        if endpoint == "chat"
        else Choice(index=i, text="", finish_reason="content_filter")
        for i in indexes
    ]
    return Chunk(id=last.id, object=last.object, created=last.created, model=last.model, choices=choices)


def _blocked(name: str) -> StreamFailed:
    return StreamFailed(
        message=f"The response was stopped by the content policy ({name}).",
        code="content_policy_violation",
        kind="invalid_request_error",
    )


def strongest_action(decisions: list[Decision]) -> str | None:
    """The most severe action among a call's decisions (for the ledger's `safety` flag)."""
    return strongest(d.action for d in decisions if d.action in ("block", "redact", "flag"))  # type: ignore[misc]

"""Output checks over every field that carries model text, held and released together. Pure.

A choice's model text travels in several channels (gateway/call/chunk.py names them: content or
a completion's text, refusal, reasoning, each tool call's arguments), and its logprobs repeat the
text token by token (`token`, `bytes`, and `top_logprobs`' alternatives). The rule: **every such
field is under the tenant's output policy**:

- each channel has its own hold (stream.py), so a secret split across chunks is found in any of
  them; a block in any channel blocks the choice;
- a logprob entry belongs to the raw characters of its channel that its token covers; it is held
  until those characters are released, goes out with them, and is dropped with them on a block;
- where released text was redacted, the entries over the redacted characters are rewritten: the
  first carries the replacement, each keeps its characters outside the redaction, and none keeps
  its alternatives (so the tokens joined read as the redacted text);
- an alternative in `top_logprobs` is itself checked, and left out when any rule or blocklist
  entry finds something in it (an alternative is never released, so there is nothing to redact);
  so is a choice's `stop_reason` (vLLM's: the stop string the text matched), then null.

Streams feed each chunk's choices as they come; a whole answer is one final feed. When the
stream ends however it ends, `flush` checks every hold as its final window and releases what
passes (the text that passed is never dropped).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from gateway.safety.policy import Action, SafetyPolicy
from gateway.safety.rules import BlocklistEntry, Finding, scan
from gateway.safety.stream import Release, StreamHold
from protocol.chunk import (
    CONTENT,
    REASONING,
    REFUSAL,
    Choice,
    FunctionCall,
    Logprobs,
    Message,
    TokenLogprob,
    ToolCall,
)


@dataclass
class TextToken:
    """One entry of a completion's logprobs (its four parallel lists, taken apart)."""

    token: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int | None


Entry = TokenLogprob | TextToken


@dataclass
class Piece:
    """Text and entries released on one channel."""

    channel: str
    text: str = ""
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Blocked:
    finding: Finding | None  # None: the classifier blocked (see `name`)
    name: str


class _Channel:
    def __init__(self, hold: StreamHold) -> None:
        self.hold = hold
        self.entries: deque[tuple[int, int, Entry]] = deque()  # raw start, raw end, entry
        # Redactions released whose entries may still be held: [redaction, replacement written?]
        self.redactions: deque[list[Any]] = deque()

    def feed(self, text: str, entries: list[Entry], *, final: bool) -> tuple[Release, list[Entry]]:
        start = self.hold.fed
        end = start + len(text)
        at = start
        for position, entry in enumerate(entries):
            # The last entry of a piece reaches its end: token strings need not add up to it.
            stop = end if position == len(entries) - 1 else min(end, at + len(entry.token))
            self.entries.append((at, stop, entry))
            at = stop
        release = self.hold.feed(text, final=final)
        if release.blocked is not None:
            self.entries.clear()
            return release, []
        self.redactions.extend([redaction, False] for redaction in release.redactions)
        out: list[Entry] = []
        while self.entries and (final or self.entries[0][1] <= release.upto):
            first, last, entry = self.entries.popleft()
            overlapping = [
                pending
                for pending in self.redactions
                if first < pending[0].end and pending[0].start < max(last, first + 1)
            ]
            if overlapping:
                entry = _rewritten(entry, _redacted_token(entry.token, first, overlapping))
            out.append(entry)
        # A redaction is done with once no entry left can reach into it.
        reach = self.entries[0][0] if self.entries else release.upto
        while self.redactions and self.redactions[0][0].end <= reach:
            self.redactions.popleft()
        return release, out


class ChoiceChecks:
    """The output checks of one choice (rules and blocklists; the classifier is the caller's)."""

    def __init__(
        self, policy: SafetyPolicy, rules: tuple[str, ...], blocklist: tuple[BlocklistEntry, ...]
    ) -> None:
        self._policy = policy
        self._rules = rules
        self._blocklist = blocklist
        self._channels: dict[str, _Channel] = {}
        self.hits: list[tuple[Finding, Action]] = []

    def feed(self, choice: Choice, *, final: bool) -> list[Piece] | Blocked:
        """What may go out now of `choice`'s text (and everything held before it, when final)."""
        # vLLM's stop_reason names the stop string the model's text matched: model text, left
        # out (as an alternative is) when a rule or blocklist entry finds something in it.
        if isinstance(choice.stop_reason, str) and self._finds(choice.stop_reason):
            choice.stop_reason = None
        texts = choice.channels()
        names = list(texts)
        for channel in (CONTENT, REFUSAL):
            if choice.token_logprobs(channel) and channel not in texts:
                names.append(channel)
        if final:
            names += [name for name in self._channels if name not in names]
        pieces: list[Piece] = []
        for name in names:
            channel = self._channels.get(name)
            if channel is None:
                channel = self._channels[name] = _Channel(
                    StreamHold(self._policy, self._rules, self._blocklist)
                )
            release, entries = channel.feed(texts.get(name, ""), _entries(choice, name), final=final)
            if release.blocked is not None:
                return Blocked(release.blocked[0], release.blocked[0].rule)
            self.hits.extend(release.hits)
            if release.text or entries:
                pieces.append(Piece(name, release.text, [self._screened(e) for e in entries]))
        return pieces

    def _screened(self, entry: Entry) -> Entry:
        """The entry without any alternative in which a rule or blocklist entry finds something."""
        if not self._rules and not self._blocklist:
            return entry
        if isinstance(entry, TokenLogprob):
            if isinstance(entry.top_logprobs, list) and entry.top_logprobs:
                entry.top_logprobs = [t for t in entry.top_logprobs if not self._finds(t.token)]
        elif entry.top:
            entry.top = {token: value for token, value in entry.top.items() if not self._finds(token)}
        return entry

    def _finds(self, text: str) -> bool:
        return bool(text) and bool(scan(text, self._rules, self._blocklist))


def _redacted_token(token: str, first: int, overlapping: list[list[Any]]) -> str:
    """The entry's token with the redacted characters it covers replaced: the replacement goes
    with the first entry a redaction reaches, later ones keep only their characters outside it."""
    out: list[str] = []
    at = 0
    for pending in overlapping:
        redaction = pending[0]
        start, end = max(0, redaction.start - first), max(0, redaction.end - first)
        out.append(token[at:start])
        if not pending[1]:
            out.append(redaction.replacement)
            pending[1] = True
        at = max(at, end)
    out.append(token[at:])
    return "".join(out)


def _rewritten(entry: Entry, token: str) -> Entry:
    if isinstance(entry, TokenLogprob):
        return TokenLogprob(
            token=token,
            logprob=entry.logprob,
            bytes=list(token.encode()) if entry.bytes is not UNSET else UNSET,
            top_logprobs=[] if entry.top_logprobs is not UNSET else UNSET,
        )
    return TextToken(token, entry.logprob, {} if entry.top is not None else None, entry.offset)


def _entries(choice: Choice, channel: str) -> list[Entry]:
    found = choice.token_logprobs(channel)
    if not found:
        return []
    if isinstance(found[0], TokenLogprob):
        return list(found)
    logprobs = choice.logprobs
    assert logprobs is not None
    values = logprobs.token_logprobs if isinstance(logprobs.token_logprobs, list) else []
    tops = logprobs.top_logprobs if isinstance(logprobs.top_logprobs, list) else []
    offsets = logprobs.text_offset if isinstance(logprobs.text_offset, list) else []
    return [
        TextToken(
            token,
            values[i] if i < len(values) else None,
            tops[i] if i < len(tops) else None,
            offsets[i] if i < len(offsets) else None,
        )
        for i, token in enumerate(found)
    ]


def write(choice: Choice, pieces: list[Piece], *, had_logprobs: bool) -> None:
    """Rewrite `choice` to carry exactly `pieces`: every text channel it had is replaced (emptied
    when nothing of it may go out yet), and its logprobs are the released entries."""
    texts: dict[str, list[str]] = {}
    entries: dict[str, list[Entry]] = {}
    for piece in pieces:
        texts.setdefault(piece.channel, []).append(piece.text)
        entries.setdefault(piece.channel, []).extend(piece.entries)
    for channel in choice.channels():
        if channel not in texts:
            choice.set_channel(channel, "")
    body = choice.body
    for channel, parts in texts.items():
        text = "".join(parts)
        if body is not None and channel.startswith("tool:") and channel not in choice.channels():
            _ensure_tool_call(body, int(channel.removeprefix("tool:")))
        elif body is not None and channel == REFUSAL and not isinstance(body.refusal, str):
            body.refusal = ""
        elif body is not None and channel == REASONING and not isinstance(body.reasoning_content, str):
            body.reasoning_content = ""
        elif body is None and channel == CONTENT and not isinstance(choice.text, str):
            choice.text = ""
        choice.set_channel(channel, text)
    choice.token_ids = UNSET  # ids would carry held or redacted text
    if not had_logprobs:
        return
    content, refusal = entries.get(CONTENT, []), entries.get(REFUSAL, [])
    if body is None:
        tokens = [e for e in content if isinstance(e, TextToken)]
        choice.logprobs = Logprobs(
            tokens=[e.token for e in tokens],
            token_logprobs=[e.logprob for e in tokens],
            top_logprobs=[e.top for e in tokens],
            text_offset=[e.offset if e.offset is not None else 0 for e in tokens],
        )
    else:
        choice.logprobs = Logprobs(
            content=[e for e in content if isinstance(e, TokenLogprob)],
            refusal=[e for e in refusal if isinstance(e, TokenLogprob)] if refusal else UNSET,
        )


def _ensure_tool_call(body: Message, index: int) -> None:
    calls = body.tool_calls if isinstance(body.tool_calls, list) else []
    if not any(call.index == index for call in calls):
        calls.append(ToolCall(index=index, function=FunctionCall(arguments="")))
    body.tool_calls = calls
    for call in calls:
        if call.index == index and call.function is UNSET:
            call.function = FunctionCall(arguments="")


def texts_of(pieces: list[Piece]) -> str:
    return "".join(piece.text for piece in pieces)


def has_text(pieces: list[Piece]) -> bool:
    return any(piece.text or piece.entries for piece in pieces)


def entries_of(pieces: list[Piece]) -> list[Any]:
    return [entry for piece in pieces for entry in piece.entries]

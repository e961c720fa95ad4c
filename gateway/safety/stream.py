"""Holding back streamed output until it is checked: the pure part (rules and blocklists).

Text arrives in pieces; a secret may be split across two. `StreamHold` keeps the last
`hold_back` characters unreleased, and never releases part of a match: a finding that crosses
the release point, or a long match that has begun (a PEM key's BEGIN line), holds the cut at its
start. Released text is redacted where the policy says so; a blocking finding anywhere in the
held text stops the stream before any of it is released. At the end (`final`) everything left is
checked as one last window and released: a stream that ends, however it ends, loses no text that
passed.

Positions: the hold counts every character fed (`fed`) and released (`released`) in the raw
text, and reports each redaction as a raw span, so what travels with the text (its logprobs,
gateway/safety/output.py) is released and redacted with it.

The bound: a match longer than `hold_back` whose start is not recognisable on its own (an
e-mail address with a very long local part) can be partly released before it matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.safety.policy import Action, SafetyPolicy
from gateway.safety.rules import BlocklistEntry, Finding, held_from, open_span, scan


@dataclass(frozen=True)
class Redaction:
    start: int  # raw positions (since the stream began) of the replaced characters
    end: int
    replacement: str


@dataclass(frozen=True)
class Release:
    text: str  # safe to send (redacted)
    hits: list[tuple[Finding, Action]] = field(default_factory=list)  # findings in `text`
    blocked: tuple[Finding, Action] | None = None
    upto: int = 0  # the raw position released text reaches
    redactions: tuple[Redaction, ...] = ()


class StreamHold:
    def __init__(
        self, policy: SafetyPolicy, rules: tuple[str, ...], blocklist: tuple[BlocklistEntry, ...]
    ) -> None:
        self._policy = policy
        self._rules = rules
        self._blocklist = blocklist
        self._hold_back = policy.hold_back_chars
        self.pending = ""
        self.released = 0  # raw characters released so far: where `pending` starts

    @property
    def fed(self) -> int:
        return self.released + len(self.pending)

    def feed(self, text: str, *, final: bool = False) -> Release:
        pending = self.pending + text
        base = self.released
        findings = scan(pending, self._rules, self._blocklist) if pending else []
        actions = [(f, self._policy.action_for(f)) for f in findings]
        for finding, action in actions:
            if action == "block":
                self.pending = ""
                return Release("", blocked=(finding, action), upto=base)
        cut = len(pending)
        if not final:
            cut = held_from(pending, self._hold_back)  # counted on the normalised view
            opened = open_span(pending, self._rules)
            if opened is not None:
                cut = min(cut, opened)
            for finding in findings:
                if finding.start < cut < finding.end:
                    cut = finding.start
        released = [(f, a) for f, a in actions if f.end <= cut]
        self.pending = pending[cut:]
        self.released = base + cut
        redactions: list[Redaction] = []
        out: list[str] = []
        at = 0
        for finding in sorted((f for f, a in released if a == "redact"), key=lambda f: f.start):
            if finding.start < at:
                continue  # inside one already replaced
            replacement = f"[REDACTED:{finding.rule}]"
            out += (pending[at : finding.start], replacement)
            redactions.append(Redaction(base + finding.start, base + finding.end, replacement))
            at = finding.end
        out.append(pending[at:cut])
        return Release("".join(out), released, upto=base + cut, redactions=tuple(redactions))

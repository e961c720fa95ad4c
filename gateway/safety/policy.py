"""A tenant's content policy: which layers check input and output, the action for each rule and
classifier category, and what to do when a check cannot answer. Pure: findings and scores in,
decisions out. The YAML reader is gateway/policy/safety_schema.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gateway.safety.rules import BlocklistEntry, Finding

Action = Literal["block", "redact", "flag"]
Layer = Literal["rules", "blocklist", "classifier"]
Where = Literal["input", "output"]
FailMode = Literal["open", "closed"]

ACTIONS: tuple[Action, ...] = ("block", "redact", "flag")
LAYERS: tuple[Layer, ...] = ("rules", "blocklist", "classifier")
# The stream hold-back must cover the longest fixed-size match (an IBAN with spaces, a GitHub
# fine-grained token) so no part of one is released before it can be recognised.
MIN_HOLD_BACK_CHARS = 96
_SEVERITY = {"flag": 0, "redact": 1, "block": 2}


@dataclass(frozen=True)
class CategoryRule:
    """A classifier category: at or above `threshold`, take `action` (redact acts as block: a
    classifier scores the whole text and has no span to cut out)."""

    threshold: float
    action: Action


@dataclass(frozen=True)
class BlocklistRule:
    entry: BlocklistEntry
    action: Action


@dataclass(frozen=True)
class SafetyPolicy:
    input: frozenset[Layer] = frozenset({"rules", "blocklist"})
    output: frozenset[Layer] = frozenset({"rules", "blocklist"})
    rules: Mapping[str, Action] = field(default_factory=dict)  # detector name → action
    blocklist: tuple[BlocklistRule, ...] = ()
    categories: Mapping[str, CategoryRule] = field(default_factory=dict)
    fail_mode: FailMode = "open"  # when the classifier errs, times out or is not ready
    log_content: bool = False  # may the audit log keep (redacted) checked text?
    hold_back_chars: int = 128  # stream text held until checked

    def layers(self, where: Where) -> frozenset[Layer]:
        return self.input if where == "input" else self.output

    def action_for(self, finding: Finding) -> Action:
        if finding.category == "blocklist":
            return next(r.action for r in self.blocklist if r.entry.name == finding.rule)
        return self.rules[finding.rule]

    def blocklist_entries(self) -> tuple[BlocklistEntry, ...]:
        return tuple(r.entry for r in self.blocklist)

    def scores_to_decisions(self, scores: Mapping[str, float]) -> list[tuple[str, float, Action]]:
        """(category, score, action) for every category the policy names and the model scored at
        or over its threshold; a category the model lacks raises KeyError (a check error)."""
        hits = []
        for name, rule in self.categories.items():
            score = scores[name]
            if score >= rule.threshold:
                hits.append((name, score, rule.action))
        return hits


def strongest(actions: Iterable[Action]) -> Action | None:
    best: Action | None = None
    for action in actions:
        if best is None or _SEVERITY[action] > _SEVERITY[best]:
            best = action
    return best

"""A tenant's `safety:` section: typed structs (read by gateway/config_reader.py with the rest of
the policy file), then gateway.safety.policy.SafetyPolicy.

    safety:
      input: [rules, blocklist, classifier]   # layers checking the prompt (default: rules, blocklist,
      output: [rules, blocklist]              #   plus classifier when categories are set); output
      rules: {secrets: block, email: redact}  # rule or group (secrets, pii, national_id) → action
      blocklist:
        - {words: [foo, "bar baz"], action: block}
        - {regex: "ticket-[0-9]{6}", action: redact}
      classifier:
        categories: {injection: {threshold: 0.8, action: block}}
      fail_mode: open | closed   # default open: a classifier error or timeout lets the text through
      log_content: false         # default false: the audit log keeps a hash of the text, never it
      hold_back_chars: 128       # stream text held until checked (at least 96)

policies/README.md has the full reference.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args

import msgspec

from gateway.config_reader import Section, entries
from gateway.safety.policy import (
    MIN_HOLD_BACK_CHARS,
    Action,
    BlocklistRule,
    CategoryRule,
    FailMode,
    Layer,
    SafetyPolicy,
)
from gateway.safety.rules import BY_NAME, GROUPS, BlocklistEntry, compile_words

Word = Annotated[str, msgspec.Meta(min_length=1)]
_DEFAULT_LAYERS: frozenset[Layer] = frozenset({"rules", "blocklist"})


class BlocklistSection(Section):
    """Exactly one of `words` (whole words, case-insensitive) or `regex`."""

    action: Action
    words: Annotated[list[Word], msgspec.Meta(min_length=1)] | None = None
    regex: Word | None = None

    def __post_init__(self) -> None:
        if (self.words is None) == (self.regex is None):
            raise ValueError("expected exactly one of 'words' (a list) or 'regex' (a pattern)")
        if self.regex is not None:
            try:
                pattern = re.compile(self.regex, re.IGNORECASE)
            except re.error as exc:
                raise ValueError(f"regex: invalid regular expression: {exc}") from None
            if pattern.fullmatch(""):
                raise ValueError("regex: the pattern matches empty text")

    def pattern(self) -> re.Pattern[str]:
        return compile_words(self.words) if self.words else re.compile(self.regex or "", re.IGNORECASE)


class CategorySection(Section):
    threshold: Annotated[float, msgspec.Meta(gt=0, le=1)]
    action: Action


class ClassifierSection(Section):
    # Keyed by the operator's category names: read entry by entry so an error names the category.
    categories: dict[str, Any] = {}

    def __post_init__(self) -> None:
        entries(self.categories, CategorySection, "categories")

    def rules(self) -> dict[str, CategoryRule]:
        read = entries(self.categories, CategorySection, "categories")
        return {name: CategoryRule(entry.threshold, entry.action) for name, entry in read.items()}


class SafetySection(Section):
    input: list[Layer] | None = None
    output: list[Layer] | None = None
    # Rule and group names to actions, checked here so that an error names the rule.
    rules: dict[str, str] = {}
    blocklist: list[BlocklistSection] = []
    classifier: ClassifierSection = ClassifierSection()
    fail_mode: FailMode = SafetyPolicy.fail_mode
    log_content: bool = SafetyPolicy.log_content
    # The longest fixed-size match must fit in what a stream holds back.
    hold_back_chars: Annotated[int, msgspec.Meta(ge=MIN_HOLD_BACK_CHARS)] = SafetyPolicy.hold_back_chars

    def __post_init__(self) -> None:
        known = [*GROUPS, *BY_NAME]
        actions = get_args(Action)
        for name, action in self.rules.items():
            if name not in known:
                raise ValueError(f"rules.{name}: unknown rule; known rules and groups: {', '.join(known)}")
            if action not in actions:
                raise ValueError(f"rules.{name}: expected one of {', '.join(actions)}, got {action!r}")
        for side in ("input", "output"):
            if "classifier" in (getattr(self, side) or ()) and not self.classifier.categories:
                raise ValueError(
                    f"{side}: the classifier layer needs classifier.categories "
                    "(which scores act, at what threshold)"
                )

    def policy(self) -> SafetyPolicy:
        categories = self.classifier.rules()
        default_input = _DEFAULT_LAYERS | ({"classifier"} if categories else set())
        rules: dict[str, Action] = {}
        # Groups first, then single rules, so `{pii: redact, phone: flag}` means what it says.
        for key in sorted(self.rules, key=lambda k: k not in GROUPS):
            for name in GROUPS.get(key, (key,)):
                rules[name] = self.rules[key]  # type: ignore[assignment]  # checked in __post_init__
        return SafetyPolicy(
            input=default_input if self.input is None else frozenset(self.input),
            output=_DEFAULT_LAYERS if self.output is None else frozenset(self.output),
            rules=rules,
            blocklist=tuple(
                BlocklistRule(BlocklistEntry(f"blocklist[{i}]", entry.pattern()), entry.action)
                for i, entry in enumerate(self.blocklist)
            ),
            categories=categories,
            fail_mode=self.fail_mode,
            log_content=self.log_content,
            hold_back_chars=self.hold_back_chars,
        )

"""A tenant's `safety:` section → gateway.safety.policy.SafetyPolicy, every error naming its field.

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
from typing import Any, get_args

from gateway.policy.fields import Where, boolean, choice, mapping, shown, string, string_list
from gateway.safety.policy import (
    ACTIONS,
    LAYERS,
    MIN_HOLD_BACK_CHARS,
    BlocklistRule,
    CategoryRule,
    FailMode,
    Layer,
    SafetyPolicy,
)
from gateway.safety.rules import BY_NAME, GROUPS, BlocklistEntry, compile_words

SAFETY_FIELDS = (
    "input",
    "output",
    "rules",
    "blocklist",
    "classifier",
    "fail_mode",
    "log_content",
    "hold_back_chars",
)


def parse_safety(value: Any, where: Where) -> SafetyPolicy:
    fields = mapping(value, where, required=(), optional=SAFETY_FIELDS)
    categories = _classifier(fields.get("classifier", {}), where.key("classifier"))
    default_layers: frozenset[Layer] = frozenset({"rules", "blocklist"})
    default_input = default_layers | ({"classifier"} if categories else set())
    layers = {
        side: _layers(fields[side], where.key(side)) if side in fields else default
        for side, default in (("input", default_input), ("output", default_layers))
    }
    for side, chosen in layers.items():
        if "classifier" in chosen and not categories:
            raise where.key(side).error(
                "the classifier layer needs classifier.categories (which scores act, at what threshold)"
            )
    hold_back = fields.get("hold_back_chars", SafetyPolicy.hold_back_chars)
    if isinstance(hold_back, bool) or not isinstance(hold_back, int) or hold_back < MIN_HOLD_BACK_CHARS:
        raise where.key("hold_back_chars").error(
            f"expected an integer of at least {MIN_HOLD_BACK_CHARS} (the longest fixed-size match), "
            f"got {shown(hold_back)}"
        )
    return SafetyPolicy(
        input=layers["input"],
        output=layers["output"],
        rules=_rules(fields.get("rules", {}), where.key("rules")),
        blocklist=_blocklist(fields.get("blocklist", []), where.key("blocklist")),
        categories=categories,
        fail_mode=choice(fields.get("fail_mode", "open"), where.key("fail_mode"), get_args(FailMode)),  # type: ignore[arg-type]
        log_content=boolean(fields.get("log_content", False), where.key("log_content")),
        hold_back_chars=hold_back,
    )


def _layers(value: Any, where: Where) -> frozenset[Layer]:
    names = string_list(value, where) if value != [] else []
    for i, name in enumerate(names):
        choice(name, where.index(i), LAYERS)
    return frozenset(names)  # type: ignore[arg-type]


def _rules(value: Any, where: Where) -> dict[str, Any]:
    """Groups first, then single rules, so `{pii: redact, phone: flag}` means what it says."""
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping of rule or group name to action, got {shown(value)}")
    known = [*GROUPS, *BY_NAME]
    rules: dict[str, Any] = {}
    for key in sorted(value, key=lambda k: k not in GROUPS):
        at = where.key(str(key))
        if key not in known:
            raise at.error(f"unknown rule; known rules and groups: {', '.join(known)}")
        action = choice(value[key], at, ACTIONS)
        for name in GROUPS.get(key, (key,)):
            rules[name] = action
    return rules


def _blocklist(value: Any, where: Where) -> tuple[BlocklistRule, ...]:
    if not isinstance(value, list):
        raise where.error(
            f"expected a list of {{words: [...], action}} or {{regex: ..., action}}, got {shown(value)}"
        )
    entries = []
    for i, item in enumerate(value):
        at = where.index(i)
        fields = mapping(item, at, required=("action",), optional=("words", "regex"))
        if ("words" in fields) == ("regex" in fields):
            raise at.error("expected exactly one of 'words' (a list) or 'regex' (a pattern)")
        if "words" in fields:
            words = string_list(fields["words"], at.key("words"))
            if not words:
                raise at.key("words").error("expected at least one word")
            pattern = compile_words(words)
        else:
            source = string(fields["regex"], at.key("regex"))
            try:
                pattern = re.compile(source, re.IGNORECASE)
            except re.error as exc:
                raise at.key("regex").error(f"invalid regular expression: {exc}") from None
            if pattern.fullmatch(""):
                raise at.key("regex").error("the pattern matches empty text")
        action = choice(fields["action"], at.key("action"), ACTIONS)
        entries.append(BlocklistRule(BlocklistEntry(f"blocklist[{i}]", pattern), action))  # type: ignore[arg-type]
    return tuple(entries)


def _classifier(value: Any, where: Where) -> dict[str, CategoryRule]:
    fields = mapping(value, where, required=(), optional=("categories",))
    raw = fields.get("categories", {})
    if not isinstance(raw, dict):
        raise where.key("categories").error(
            f"expected a mapping of category to {{threshold, action}}, got {shown(raw)}"
        )
    categories = {}
    for name, rule in raw.items():
        at = where.key("categories").key(str(name))
        spec = mapping(rule, at, required=("threshold", "action"), optional=())
        threshold = spec["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
            raise at.key("threshold").error(f"expected a number in (0, 1], got {shown(threshold)}")
        action = choice(spec["action"], at.key("action"), ACTIONS)
        categories[str(name)] = CategoryRule(float(threshold), action)  # type: ignore[arg-type]
    return categories

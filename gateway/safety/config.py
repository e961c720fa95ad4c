"""`safety:` in the gateway config: where the audit log goes and which classifier model to load.
What each tenant checks is its policy's business (the `safety:` section of a tenant)."""

from __future__ import annotations

import msgspec

from gateway.safety.classifier import ClassifierConfig


class SafetyConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    # JSONL audit log of every decision; null: decisions are only counted in metrics.
    audit_path: str | None = None
    # The classifier layer's model; null: tenants that ask for it get their fail mode.
    classifier: ClassifierConfig | None = None
    # A stream's output is classified in segments of at least this many characters (each with the
    # previous segment as context) before they are released.
    classify_every_chars: int = 256

    def __post_init__(self) -> None:
        if self.classify_every_chars < 1:
            raise ValueError("classify_every_chars: must be at least 1")

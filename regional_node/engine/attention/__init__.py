"""Paged attention backends behind one interface: `torch` (plain PyTorch) and `triton` (our kernels)."""

from regional_node.engine.attention.base import AttentionBackend, PrefillSpan, StepLayout, create_backend

__all__ = ["AttentionBackend", "PrefillSpan", "StepLayout", "create_backend"]

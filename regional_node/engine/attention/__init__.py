"""Paged attention backends behind one interface (pure PyTorch now; GPU kernels later)."""

from regional_node.engine.attention.base import AttentionBackend, PrefillSpan, StepLayout, create_backend

__all__ = ["AttentionBackend", "PrefillSpan", "StepLayout", "create_backend"]

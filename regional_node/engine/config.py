"""Typed settings: `ModelConfig` parsed from a checkpoint's config.json, `EngineConfig` from the caller.

Both are built once at start-up and handed to every part of the engine (no globals).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from regional_node.engine.errors import CheckpointError, EngineConfigError, UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16", "auto")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "vllm")


@dataclass(frozen=True)
class ModelConfig:
    """The parts of config.json the model code needs, normalised across transformers versions."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    # {"rope_type": "default"|"linear"|"llama3", ...the type's own fields}
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str = "float32"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else str(raw.get("model_type", "<missing>"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"architecture {arch!r} in {source} is not supported; supported: "
                + ", ".join(SUPPORTED_ARCHITECTURES),
                architecture=arch,
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedArchitectureError(
                f"{arch} with hidden_act={raw['hidden_act']!r} is not supported (only silu)",
                architecture=arch,
            )
        if raw.get("use_sliding_window"):
            raise UnsupportedArchitectureError(
                f"{arch} with use_sliding_window=true is not supported", architecture=arch
            )
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            qwen2 = arch == "Qwen2ForCausalLM"
            rope_theta, rope_scaling = _rope(raw, arch)
            return cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases and no o_proj bias; Llama's switch covers all four.
                qkv_bias=True if qwen2 else bool(raw.get("attention_bias", False)),
                o_bias=False if qwen2 else bool(raw.get("attention_bias", False)),
                mlp_bias=False if qwen2 else bool(raw.get("mlp_bias", False)),
                rope_scaling=rope_scaling,
                eos_token_ids=_ids(raw.get("eos_token_id")),
                bos_token_id=raw.get("bos_token_id"),
                torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: missing or invalid field {exc}") from exc

    def __post_init__(self) -> None:
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        if not path.is_file():
            raise CheckpointError(f"no config.json in {path.parent}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(raw, str(path))


def _rope(raw: dict[str, Any], arch: str) -> tuple[float, dict[str, Any]]:
    # transformers >= 5 writes rope_parameters; older checkpoints have rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling")
    if scaling:
        params = {**dict(scaling), **params}
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitectureError(
            f"{arch} with rope scaling type {rope_type!r} is not supported; supported: "
            + ", ".join(SUPPORTED_ROPE_TYPES),
            architecture=arch,
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedArchitectureError(f"{arch} with partial_rotary_factor != 1 is not supported", arch)
    return theta, {"rope_type": rope_type, **params}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    return (int(value),)


SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (`speculative:` under a model's engine options; see speculative/).

    `ngram` proposes the continuation of the longest n-gram (prompt_lookup_min..max tokens) that
    ends the sequence and occurred earlier in its prompt or output. `draft` runs `draft_model`, a
    smaller checkpoint with the target's vocabulary (checked when it loads), for
    `num_speculative_tokens` autoregressive steps with its own paged KV cache. The back-off rules (measured
    on CPU, see regional_node/engine/README.md, "Speculative decoding"): no speculation in a step
    with more than `max_batch_size` decoding sequences (decode stops being memory-bound, and a
    verify pass costs more than the tokens it saves), and a sequence whose recent drafts were
    accepted less than `min_acceptance_rate` of the time stops proposing for a while.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # The draft checkpoint's folder (method "draft" only). A node config may name another of its
    # served models instead; the node resolves that to the model's folder.
    draft_model: str | None = None
    max_batch_size: int = 8
    min_acceptance_rate: float = 0.25

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise EngineConfigError(
                f"speculative.method must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}"
            )
        if self.method == "draft" and (not isinstance(self.draft_model, str) or not self.draft_model):
            raise EngineConfigError(
                "speculative.method draft needs speculative.draft_model (a checkpoint folder)"
            )
        if self.method != "draft" and self.draft_model is not None:
            raise EngineConfigError(
                f"speculative.draft_model is only used with method draft, not {self.method!r}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "max_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"speculative.{name} must be an integer >= 1, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise EngineConfigError(
                f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        rate = self.min_acceptance_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise EngineConfigError(f"speculative.min_acceptance_rate must be in [0, 1], got {rate!r}")

    @classmethod
    def from_value(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, or its fields as a mapping (the YAML form)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise EngineConfigError(f"speculative must be a mapping of options, got {value!r}")
        return _built(cls, value, "speculative")


@dataclass(frozen=True)
class EngineConfig:
    """Engine options; `LLMEngine.from_pretrained(path, **options)` takes any of these by name.

    KV pool sizing: `num_kv_blocks` wins when given. Otherwise the pool gets `kv_cache_memory_bytes`,
    or else `kv_cache_memory_fraction` of the device's free memory (CUDA, after weights) or of the
    host's available memory (CPU; default fraction 0.2 there, 0.85 on CUDA). It is never made larger
    than `max_num_seqs` full-length sequences need.
    """

    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # A prefill computes at most this many tokens per step, and at most one prompt with more
    # uncached tokens than that is prefilled at a time, so requests whose prompts are cached start
    # beside a cold one instead of after it (scheduler.py). 0: off.
    long_prefill_token_threshold: int = 256
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None
    kv_cache_memory_fraction: float | None = None
    max_model_len: int | None = None
    attention_backend: str = "torch"
    # Replay decode steps from CUDA graphs: only on CUDA, with a backend that supports it (triton).
    cuda_graphs: bool = True
    # As vLLM's option: no tokenizer, so token ids in and out only (no text, no stop strings), and
    # no detokenizing per token for callers that never read text.
    skip_tokenizer_init: bool = False
    # VTC fairness weights (Sheng et al. 2024): a served output token costs more than a prompt token.
    fairness_prompt_weight: float = 1.0
    fairness_output_weight: float = 2.0
    # Speculative decoding; None (the default) turns it off. A mapping is validated into a
    # SpeculativeConfig.
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative", SpeculativeConfig.from_value(self.speculative))
        positive = ("block_size", "max_num_seqs", "max_num_batched_tokens")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"{name} must be an integer >= 1, got {value!r}")
        threshold = self.long_prefill_token_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise EngineConfigError(
                f"long_prefill_token_threshold must be an integer >= 0, got {threshold!r}"
            )
        for name in ("num_kv_blocks", "kv_cache_memory_bytes", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise EngineConfigError(f"{name} must be a positive integer or None, got {value!r}")
        frac = self.kv_cache_memory_fraction
        if frac is not None and not 0.0 < frac <= 1.0:
            raise EngineConfigError(f"kv_cache_memory_fraction must be in (0, 1], got {frac!r}")
        if self.dtype not in DTYPES:
            raise EngineConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise EngineConfigError(
                f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                f"got {self.attention_backend!r}"
            )
        for name in ("cuda_graphs", "skip_tokenizer_init"):
            if not isinstance(getattr(self, name), bool):
                raise EngineConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_options(cls, **options: Any) -> EngineConfig:
        return _built(cls, options, "engine")


T = TypeVar("T")


def _built(cls: type[T], options: Mapping[str, Any], what: str) -> T:
    """`cls(**options)`, or EngineConfigError naming the options `cls` does not have."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - known)
    if unknown:
        raise EngineConfigError(
            f"unknown {what} option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**options)

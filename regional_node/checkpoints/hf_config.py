"""config.json and generation_config.json contents, laid out as Hugging Face writes them."""

from __future__ import annotations

from typing import Any

from regional_node.checkpoints.sizes import Arch, ModelShape

ARCHITECTURES: dict[Arch, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# The values the real families ship (Llama 3, Qwen2).
ROPE_THETA: dict[Arch, float] = {"llama": 500000.0, "qwen2": 1000000.0}
RMS_NORM_EPS: dict[Arch, float] = {"llama": 1e-5, "qwen2": 1e-6}


def model_config(
    shape: ModelShape, *, arch: Arch, tied: bool, bos_token_id: int, eos_token_id: int
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "rms_norm_eps": RMS_NORM_EPS[arch],
        "rope_theta": ROPE_THETA[arch],
        "rope_scaling": None,
        "max_position_embeddings": shape.max_position_embeddings,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": tied,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    if arch == "llama":
        config |= {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    else:
        # Qwen2 always has q/k/v biases (no config switch); sliding window is off, as released.
        config |= {
            "use_sliding_window": False,
            "sliding_window": shape.max_position_embeddings,
            "max_window_layers": shape.num_hidden_layers,
        }
    return dict(sorted(config.items()))


def generation_config(*, bos_token_id: int, eos_token_ids: list[int], pad_token_id: int) -> dict[str, Any]:
    # Greedy by default: a random model has nothing worth sampling, and tests compare greedy tokens.
    return {
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_ids,
        "pad_token_id": pad_token_id,
        "do_sample": False,
    }

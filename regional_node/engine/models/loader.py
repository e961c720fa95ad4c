"""Reads Hugging Face safetensors checkpoints (single file or sharded) into a LlamaModel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from regional_node.engine.config import ModelConfig
from regional_node.engine.errors import CheckpointError
from regional_node.engine.models.llama import DecoderLayerWeights, LlamaModel


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from model.safetensors.index.json or by listing every file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"cannot read {index}: {exc}") from exc
        return {name: path / file for name, file in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        hint = " (only .safetensors weights are supported)" if list(path.glob("*.bin")) else ""
        raise CheckpointError(f"no *.safetensors weights in {path}{hint}")
    names: dict[str, Path] = {}
    for file in files:
        with _open(file) as f:
            names.update(dict.fromkeys(f.keys(), file))
    return names


def _open(file: Path) -> Any:  # safetensors does not export its handle type
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read weights file {file}: {exc}") from exc


class _TensorSource:
    """Loads named tensors, converting dtype/device and checking shapes as it goes."""

    def __init__(self, files: dict[str, Path], dtype: torch.dtype, device: torch.device) -> None:
        self.files = files
        self.dtype = dtype
        self.device = device
        self._handles: dict[Path, Any] = {}
        # Checkpoints saved from the bare model have no "model." prefix.
        self.prefix = "model." if any(n.startswith("model.") for n in files) else ""

    def has(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        file = self.files.get(name)
        if file is None:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint")
        if file not in self._handles:
            if not file.is_file():
                raise CheckpointError(f"weights file {file} (listed in the index) does not exist")
            self._handles[file] = _open(file)
        try:
            tensor = self._handles[file].get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"cannot read tensor {name!r} from {file}: {exc}") from exc
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, config.json implies {shape}"
            )
        return tensor.to(device=self.device, dtype=self.dtype)

    def model(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.get(self.prefix + name, shape)

    def optional(self, name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return self.model(name, shape) if present else None

    def fused(self, parts: list[tuple[str, tuple[int, ...]]]) -> torch.Tensor:
        """Several tensors concatenated along dim 0 (q/k/v or gate/up), so one matmul computes them."""
        return torch.cat([self.model(name, shape) for name, shape in parts])


def load_model(
    path: Path, config: ModelConfig, *, dtype: torch.dtype, device: torch.device, max_positions: int
) -> LlamaModel:
    src = _TensorSource(weight_files(path), dtype, device)
    c = config
    h, inter = c.hidden_size, c.intermediate_size
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = []
    for i in range(c.num_layers):
        attn, mlp = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        qkv = [(attn + "q_proj", q_out), (attn + "k_proj", kv_out), (attn + "v_proj", kv_out)]
        gate_up = [(mlp + "gate_proj", inter), (mlp + "up_proj", inter)]
        layers.append(
            DecoderLayerWeights(
                input_norm=src.model(f"layers.{i}.input_layernorm.weight", (h,)),
                qkv=src.fused([(name + ".weight", (rows, h)) for name, rows in qkv]),
                qkv_bias=src.fused([(name + ".bias", (rows,)) for name, rows in qkv]) if c.qkv_bias else None,
                o=src.model(attn + "o_proj.weight", (h, q_out)),
                o_bias=src.optional(attn + "o_proj.bias", (h,), c.o_bias),
                post_attention_norm=src.model(f"layers.{i}.post_attention_layernorm.weight", (h,)),
                gate_up=src.fused([(name + ".weight", (rows, h)) for name, rows in gate_up]),
                gate_up_bias=src.fused([(name + ".bias", (rows,)) for name, rows in gate_up])
                if c.mlp_bias
                else None,
                down=src.model(mlp + "down_proj.weight", (h, inter)),
                down_bias=src.optional(mlp + "down_proj.bias", (h,), c.mlp_bias),
            )
        )
    embed = src.model("embed_tokens.weight", (c.vocab_size, h))
    if src.has("lm_head.weight") and not c.tie_word_embeddings:
        lm_head = src.get("lm_head.weight", (c.vocab_size, h))
    elif c.tie_word_embeddings:
        lm_head = embed
    else:
        raise CheckpointError("tensor 'lm_head.weight' is missing and tie_word_embeddings is false")
    norm = src.model("norm.weight", (h,))
    return LlamaModel(c, embed, layers, norm, lm_head, max_positions)

"""Writes a random-initialised checkpoint folder in the standard Hugging Face layout."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from regional_node.checkpoints.errors import CheckpointExistsError, VocabularyTooLargeError
from regional_node.checkpoints.hf_config import generation_config, model_config
from regional_node.checkpoints.sizes import Arch, ModelShape, shape_for, ties_embeddings
from regional_node.checkpoints.tokenizer import (
    END_OF_TEXT,
    IM_END,
    special_token_ids,
    tokenizer_config,
    train_tokenizer,
    training_text,
)
from regional_node.checkpoints.train import Progress, TrainingPlan, TrainingResult, train_weights
from regional_node.checkpoints.weights import random_state_dict

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# Written next to a trained checkpoint: the training plan and its losses.
TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class CheckpointSummary:
    path: Path
    arch: Arch
    size: str
    shape: ModelShape
    tied: bool
    parameters: int
    training: TrainingResult | None = None

    def line(self) -> str:
        s = self.shape
        trained = ""
        if self.training is not None:
            t = self.training
            trained = (
                f", trained: loss {t.first_loss:.2f} -> {t.final_train_loss:.2f}, held-out "
                f"{t.held_out_loss:.3f} ({t.held_out_bits_per_byte:.3f} bits/byte) in {t.seconds:.0f}s"
            )
        return (
            f"{self.arch}/{self.size}: {self.parameters / 1e6:.2f}M params, {s.num_hidden_layers} layers, "
            f"hidden {s.hidden_size}, {s.num_attention_heads} heads / {s.num_key_value_heads} kv, "
            f"vocab {s.vocab_size}, tied={str(self.tied).lower()}{trained} -> {self.path}"
        )


def init_checkpoint(
    out_dir: Path,
    *,
    arch: Arch,
    size: str,
    seed: int = 0,
    vocab_size: int | None = None,
    force: bool = False,
    **shape_overrides: int,
) -> Path:
    """Write config, weights, tokenizer and chat template for a random `arch` model of `size`.

    `shape_overrides` replaces fields of the named shape (e.g. num_key_value_heads=4 for plain
    multi-head attention). Refuses a non-empty `out_dir` unless `force`, which overwrites only
    the files written here. Returns `out_dir`.
    """
    return write_checkpoint(
        out_dir, arch=arch, size=size, seed=seed, vocab_size=vocab_size, force=force, **shape_overrides
    ).path


def write_checkpoint(
    out_dir: Path,
    *,
    arch: Arch,
    size: str,
    seed: int = 0,
    vocab_size: int | None = None,
    force: bool = False,
    training: TrainingPlan | None = None,
    progress: Progress | None = None,
    **shape_overrides: int,
) -> CheckpointSummary:
    """`init_checkpoint`, returning what was written. With `training`, the weights are trained
    on the corpus (regional_node/checkpoints/train.py) instead of random, and `training.json`
    records the plan and the losses."""
    out_dir = Path(out_dir)
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unknown arch {arch!r}; known: llama, qwen2")
    if vocab_size is not None:
        shape_overrides["vocab_size"] = vocab_size
    shape = shape_for(size, **shape_overrides)
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise CheckpointExistsError(f"{out_dir} is not empty; refusing to overwrite it")

    tokenizer = train_tokenizer(shape.vocab_size)
    if tokenizer.get_vocab_size() != shape.vocab_size:
        raise VocabularyTooLargeError(
            f"the corpus supports a vocabulary of {tokenizer.get_vocab_size()} tokens, "
            f"not {shape.vocab_size}; ask for a smaller vocab_size"
        )
    ids = special_token_ids(tokenizer)
    bos, eos = ids[END_OF_TEXT], ids[IM_END]
    tied = ties_embeddings(arch, size)

    result: TrainingResult | None = None
    if training is not None:
        text = training_text()
        tokens = tokenizer.encode(text).ids
        result = train_weights(
            shape,
            arch=arch,
            tied=tied,
            tokens=tokens,
            bytes_per_token=len(text.encode("utf-8")) / len(tokens),
            plan=training,
            progress=progress,
        )
        weights = result.weights
    else:
        weights = random_state_dict(shape, arch=arch, tied=tied, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Fixed metadata keeps the file byte-identical for a given seed.
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(
        out_dir / "config.json", model_config(shape, arch=arch, tied=tied, bos_token_id=bos, eos_token_id=eos)
    )
    _write_json(
        out_dir / "generation_config.json",
        generation_config(bos_token_id=bos, eos_token_ids=[eos, bos], pad_token_id=bos),
    )
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    _write_json(
        out_dir / "tokenizer_config.json", tokenizer_config(model_max_length=shape.max_position_embeddings)
    )
    if result is not None:
        _write_json(out_dir / TRAINING_FILE, result.record())
    parameters = sum(t.numel() for t in weights.values())
    return CheckpointSummary(out_dir, arch, size, shape, tied, parameters, result)


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

"""Builds an engine's parts from a Hugging Face checkpoint folder: config, weights, tokenizer, KV pool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from regional_node.engine.attention.base import AttentionBackend, create_backend
from regional_node.engine.config import EngineConfig, ModelConfig
from regional_node.engine.errors import CheckpointError, EngineConfigError
from regional_node.engine.kv_pool import plan_num_kv_blocks
from regional_node.engine.model_runner import ModelRunner
from regional_node.engine.models.llama import LlamaModel
from regional_node.engine.models.loader import load_model
from regional_node.engine.tokenizer import Tokenizer, checkpoint_eos_token_ids

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedCheckpoint:
    """Exactly LLMEngine's constructor arguments."""

    model_config: ModelConfig
    engine_config: EngineConfig
    runner: ModelRunner
    num_kv_blocks: int
    max_model_len: int
    tokenizer: Tokenizer | None
    eos_token_ids: tuple[int, ...]
    draft_runner: ModelRunner | None = None


def load_checkpoint(path: Path, config: EngineConfig) -> LoadedCheckpoint:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist")
    model_config = ModelConfig.from_file(path / "config.json")
    max_model_len = model_config.max_position_embeddings
    if config.max_model_len is not None:
        if config.max_model_len > max_model_len:
            raise EngineConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's max_position_embeddings {max_model_len}"
            )
        max_model_len = config.max_model_len
    dtype_name = config.dtype if config.dtype != "auto" else model_config.torch_dtype
    torch_dtype = _DTYPES.get(dtype_name, torch.float32)
    device = torch.device(config.device)
    tokenizer = None if config.skip_tokenizer_init else Tokenizer.from_pretrained(path)
    eos = tokenizer.eos_token_ids if tokenizer is not None else checkpoint_eos_token_ids(path)
    model, backend = _load(path, model_config, config, max_model_len, torch_dtype, device)
    spec = config.speculative
    draft = None
    if spec is not None and spec.method == "draft":
        assert spec.draft_model is not None
        draft_path = Path(spec.draft_model)
        draft_config = _check_draft(path, model_config, draft_path, max_model_len)
        draft = (draft_config, *_load(draft_path, draft_config, config, max_model_len, torch_dtype, device))
    # Planned once the weights are in (on CUDA the budget is the memory they leave). The draft's
    # pool gets as many blocks as the target's (each far smaller): a sequence never holds more
    # draft positions than target ones, plus the k - 1 it drafts.
    num_blocks = plan_num_kv_blocks(
        config,
        model_config,
        max_model_len=max_model_len,
        dtype=torch_dtype,
        device=device,
        draft=draft[0] if draft is not None else None,
    )
    runner = _runner(model, backend, model_config, config, num_blocks, torch_dtype, device)
    if config.cuda_graphs and device.type == "cuda" and backend.supports_cuda_graphs:
        runner.use_decode_graphs(
            max_num_seqs=config.max_num_seqs, max_blocks_per_seq=-(-max_model_len // config.block_size)
        )
    draft_runner = None
    if draft is not None:
        draft_config, draft_model, draft_backend = draft
        draft_runner = _runner(
            draft_model, draft_backend, draft_config, config, num_blocks, torch_dtype, device
        )
    return LoadedCheckpoint(
        model_config=model_config,
        engine_config=config,
        runner=runner,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        draft_runner=draft_runner,
    )


def _load(
    path: Path,
    model_config: ModelConfig,
    config: EngineConfig,
    max_model_len: int,
    torch_dtype: torch.dtype,
    device: torch.device,
) -> tuple[LlamaModel, AttentionBackend]:
    """A model's weights and its attention backend."""
    model = load_model(path, model_config, dtype=torch_dtype, device=device, max_positions=max_model_len)
    backend = create_backend(
        config.attention_backend,
        device,
        block_size=config.block_size,
        head_dim=model_config.head_dim,
    )
    if backend.name == "vllm":
        # vLLM's kernels for the rest of the model too, where its build has them (vllm_backend.py).
        from regional_node.engine.attention.vllm_backend import cpu_kernels

        kernels = cpu_kernels(device)
        if kernels is not None:
            model.use_kernels(kernels)
    return model, backend


def _runner(
    model: LlamaModel,
    backend: AttentionBackend,
    model_config: ModelConfig,
    config: EngineConfig,
    num_blocks: int,
    torch_dtype: torch.dtype,
    device: torch.device,
) -> ModelRunner:
    """The model with a KV pool of `num_blocks` blocks."""
    kv_caches = backend.allocate_kv_cache(
        num_layers=model_config.num_layers,
        num_blocks=num_blocks,
        block_size=config.block_size,
        num_kv_heads=model_config.num_kv_heads,
        head_dim=model_config.head_dim,
        dtype=torch_dtype,
        device=device,
    )
    return ModelRunner(model, backend, kv_caches, config.block_size)


def _check_draft(target_path: Path, target: ModelConfig, draft_path: Path, max_model_len: int) -> ModelConfig:
    """The draft checkpoint's config, once it is known to share the target's vocabulary: same
    vocab_size and, where the checkpoints ship tokenizers, the same token-to-id map. A draft that
    tokenizes differently would propose ids that mean other text."""
    where = f"speculative.draft_model {draft_path}"
    if not draft_path.is_dir():
        raise EngineConfigError(f"{where}: no such checkpoint folder")
    try:
        draft = ModelConfig.from_file(draft_path / "config.json")
    except CheckpointError as exc:
        raise EngineConfigError(f"{where}: {exc}") from exc
    if draft.vocab_size != target.vocab_size:
        raise EngineConfigError(
            f"{where} has vocab_size {draft.vocab_size}, the target {target_path} {target.vocab_size}: "
            "a draft model must use the target's tokenizer"
        )
    if draft.max_position_embeddings < max_model_len:
        raise EngineConfigError(
            f"{where} has max_position_embeddings {draft.max_position_embeddings}, below the target's "
            f"max_model_len {max_model_len}; set max_model_len to at most that"
        )
    target_vocab, draft_vocab = _vocabulary(target_path), _vocabulary(draft_path)
    if target_vocab != draft_vocab:
        which = "has no tokenizer.json" if draft_vocab is None else "has another tokenizer"
        if target_vocab is None:
            which = "ships a tokenizer.json and the target does not"
        raise EngineConfigError(
            f"{where} {which} than the target {target_path}: a draft model must use the target's tokenizer"
        )
    return draft


def _vocabulary(path: Path) -> dict[str, int] | None:
    """The token-to-id map of a checkpoint's tokenizer.json (None: the checkpoint has none)."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        return HFTokenizer.from_file(str(file)).get_vocab(with_added_tokens=True)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise CheckpointError(f"cannot read {file}: {exc}") from exc

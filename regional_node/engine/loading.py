"""Builds an engine's parts from a Hugging Face checkpoint folder: config, weights, tokenizer, KV pool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from regional_node.engine.attention.base import create_backend
from regional_node.engine.config import EngineConfig, ModelConfig
from regional_node.engine.errors import CheckpointError, EngineConfigError
from regional_node.engine.kv_pool import plan_num_kv_blocks
from regional_node.engine.model_runner import ModelRunner
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
    num_blocks = plan_num_kv_blocks(
        config, model_config, max_model_len=max_model_len, dtype=torch_dtype, device=device
    )
    kv_caches = backend.allocate_kv_cache(
        num_layers=model_config.num_layers,
        num_blocks=num_blocks,
        block_size=config.block_size,
        num_kv_heads=model_config.num_kv_heads,
        head_dim=model_config.head_dim,
        dtype=torch_dtype,
        device=device,
    )
    runner = ModelRunner(model, backend, kv_caches, config.block_size)
    if config.cuda_graphs and device.type == "cuda" and backend.supports_cuda_graphs:
        runner.use_decode_graphs(
            max_num_seqs=config.max_num_seqs, max_blocks_per_seq=-(-max_model_len // config.block_size)
        )
    return LoadedCheckpoint(
        model_config=model_config,
        engine_config=config,
        runner=runner,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        tokenizer=tokenizer,
        eos_token_ids=eos,
    )

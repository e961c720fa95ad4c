"""How many KV-cache blocks the pool gets (see EngineConfig for the options)."""

from __future__ import annotations

import os

import torch

from regional_node.engine.attention.base import kv_cache_bytes_per_block
from regional_node.engine.config import EngineConfig, ModelConfig
from regional_node.engine.errors import EngineConfigError

DEFAULT_FRACTION = {"cpu": 0.2, "cuda": 0.85}


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory (CUDA, after the weights are loaded) or the host's available memory."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def plan_num_kv_blocks(
    config: EngineConfig,
    model: ModelConfig,
    *,
    max_model_len: int,
    dtype: torch.dtype,
    device: torch.device,
    draft: ModelConfig | None = None,
) -> int:
    """`draft`: a draft model (speculative decoding) whose pool has as many blocks as the target's:
    a block then costs both models' bytes."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = sum(
        kv_cache_bytes_per_block(
            num_layers=m.num_layers,
            block_size=config.block_size,
            num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            dtype=dtype,
        )
        for m in (model, draft)
        if m is not None
    )
    if config.kv_cache_memory_bytes is not None:
        budget = config.kv_cache_memory_bytes
    else:
        fraction = config.kv_cache_memory_fraction or DEFAULT_FRACTION.get(device.type, 0.2)
        budget = int(available_memory_bytes(device) * fraction)
    # More than every sequence slot at full context could ever use is wasted memory.
    useful = -(-config.max_num_seqs * max_model_len // config.block_size)
    blocks = min(budget // per_block, useful)
    if blocks < 1:
        raise EngineConfigError(
            f"the KV-cache budget of {budget} bytes does not hold one block ({per_block} bytes)"
        )
    return blocks

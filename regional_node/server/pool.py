"""The models a node serves: one NodeEngine each (ours, or vLLM's with `engine: vllm`), loaded off
the event loop.

`ModelPool` owns the engines' lifecycle (load, warm up, shut down) and the node's readiness;
handlers only ever ask it for a ready model by name.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from protocol import NotFoundError, ServiceUnavailableError
from regional_node.cpu_share import CpuShare
from regional_node.server.config import EngineKind, ServedModel
from regional_node.server.node_engine import NodeEngine

if TYPE_CHECKING:
    from regional_node.engine import QueueLimits

logger = logging.getLogger(__name__)

PoolState = Literal["loading", "ready", "failed", "stopped"]
# Builds a model's engine, not yet started (in a worker thread: it reads the weights). Tests
# inject fakes.
EngineLoader = Callable[[ServedModel], NodeEngine]


def engine_loader(kind: EngineKind, share: CpuShare | None = None) -> EngineLoader:
    """The real loader for `engine: meridian` or `engine: vllm`, whose engines compute within
    `share` (None: unconfined). The engine (and torch, and vLLM) is imported only when a model
    loads, so the HTTP port opens first."""
    return functools.partial(load_vllm_engine if kind == "vllm" else load_engine, share=share)


def load_engine(model: ServedModel, share: CpuShare | None = None) -> NodeEngine:
    from regional_node.engine import AsyncEngine, LLMEngine

    engine = LLMEngine.from_pretrained(model.path, **model.engine.engine_kwargs())
    return AsyncEngine(engine, queue_limits(model), cpu_share=share)


def load_vllm_engine(model: ServedModel, share: CpuShare | None = None) -> NodeEngine:
    from regional_node.vllm_engine import VllmEngine

    return VllmEngine.from_settings(model.path, model.engine, queue_limits(model), cpu_share=share)


def queue_limits(model: ServedModel) -> QueueLimits:
    """The model's `queue` section, defaults resolved: both engines enforce it the same way."""
    from regional_node.engine import QueueLimits

    return QueueLimits(
        max_waiting_tokens=model.queue_bounds(),
        max_wait_s=model.queue.max_wait_s(),
        max_retry_after_s=model.queue.max_retry_after_s,
    )


@dataclass
class ServedModel:
    """A loaded model and what requests need to know about it."""

    config: ServedModel
    engine: NodeEngine
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tier(self) -> str:
        return self.config.tier

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus output tokens one request may reach: the context window, or the KV pool
        if that is smaller (the engine refuses a request that could never fit in its pool)."""
        pool_tokens = int(self.stats().get("kv_blocks_total", 0)) * int(self.engine.kv_block_size)
        # The last generated token never needs a KV slot, hence + 1.
        return min(self.max_model_len, pool_tokens + 1) if pool_tokens else self.max_model_len

    def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats())


class ModelPool:
    """Loads every configured model once; `get` hands out ready models by name."""

    def __init__(
        self,
        models: list[ServedModel],
        *,
        loader: EngineLoader = load_engine,
        warmup: bool = True,
    ) -> None:
        self._configs = list(models)
        self._loader = loader
        self._warmup = warmup
        self._models: dict[str, ServedModel] = {}
        self.state: PoolState = "loading"
        self.error: str | None = None

    @property
    def configs(self) -> list[ServedModel]:
        return list(self._configs)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def models(self) -> list[ServedModel]:
        return list(self._models.values())

    def get(self, name: str) -> ServedModel:
        """The ready model called `name`; 404 if the node does not serve it, 503 while loading."""
        if name not in {config.name for config in self._configs}:
            served = ", ".join(config.name for config in self._configs)
            raise NotFoundError(
                f"The model `{name}` does not exist on this node (it serves: {served}).", param="model"
            )
        model = self._models.get(name)
        if model is None or not self.ready:
            raise ServiceUnavailableError(
                f"The model `{name}` is still loading; retry when /ready answers 200.",
                code="model_loading",
                headers={"retry-after": "1"},
            )
        return model

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each loaded model's engine stats, by name."""
        return {name: model.stats() for name, model in self._models.items()}

    def cache_configs(self) -> dict[str, dict[str, str]]:
        """Each loaded model's KV-cache settings, as label values (vLLM's CacheConfig names)."""
        configs = {}
        for name, model in self._models.items():
            engine = model.config.engine
            stats = model.stats()
            # The engine's own block size: the config may leave it to the engine (None).
            block_size = engine.block_size if engine.block_size is not None else stats.get("block_size", "")
            configs[name] = {
                "block_size": str(block_size),
                "cache_dtype": "auto",  # the KV cache takes the model's dtype, as vLLM's "auto"
                "enable_prefix_caching": str(engine.enable_prefix_caching),
                "num_gpu_blocks": str(stats.get("kv_blocks_total", "")),
            }
        return configs

    async def load(self) -> None:
        """Load, start and warm every model in order; on failure the pool stays not-ready."""
        try:
            for config in self._configs:
                started = time.monotonic()
                engine = await asyncio.to_thread(self._loader, config)
                await engine.start()
                model = ServedModel(config=config, engine=engine)
                self._models[config.name] = model
                if self._warmup:
                    await _warm_up(model)
                logger.info(
                    "model %s (%s) ready in %.1fs", config.name, config.path, time.monotonic() - started
                )
        except asyncio.CancelledError:
            self.state = "stopped"
            raise
        except Exception as exc:
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("loading models failed: %s", self.error, exc_info=exc)
            return
        self.state = "ready"

    async def shutdown(self) -> None:
        """Stop every engine; in-flight requests end with finish_reason "abort"."""
        self.state = "stopped"
        for model in list(self._models.values()):
            try:
                await model.engine.shutdown()
            except Exception:
                logger.exception("engine for %s did not shut down cleanly", model.name)
        logger.info("engines stopped")


async def _warm_up(model: ServedModel) -> None:
    """One tiny greedy generation, so lazy initialisation is not paid by the first client."""
    from regional_node.engine import SamplingParams

    tokenizer = model.engine.tokenizer
    prompt: list[int] | str = tokenizer.encode("Hello") if tokenizer is not None else [1]
    if not prompt:
        prompt = [0]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    stream = model.engine.generate(
        prompt, params, request_id=f"warmup-{model.name}", tenant="meridian-warmup"
    )
    async for _ in stream:
        pass

"""The models a node serves: one NodeEngine each (ours, or vLLM's with `engine: vllm`), loaded off
the event loop.

`ModelPool` owns the engines' lifecycle (load, warm up, probe, shut down) and the node's
readiness; handlers only ever ask it for a ready model by name. A model with a golden file
(regional_node/probes) must pass its probes before it serves, and stops serving (503
`model_probe_failed`) while a scheduled round fails: the node is ready while any model serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from protocol import NotFoundError, ServiceUnavailableError
from regional_node.cpu_share import CpuShare
from regional_node.probes import GoldenSet, ModelProber, ProbeState, golden_path, read_golden
from regional_node.server.config import EngineKind, ServedModelConfig
from regional_node.server.node_engine import NodeEngine

if TYPE_CHECKING:
    from regional_node.engine import QueueLimits
    from regional_node.utilization import UtilizationMeter, UtilizationReport

logger = logging.getLogger(__name__)

PoolState = Literal["loading", "ready", "failed", "stopped"]
# Builds a model's engine, not yet started (in a worker thread: it reads the weights). Tests
# inject fakes.
EngineLoader = Callable[[ServedModelConfig], NodeEngine]


def engine_loader(kind: EngineKind, share: CpuShare | None = None) -> EngineLoader:
    """The real loader for `engine: meridian` or `engine: vllm`, whose engines compute within
    `share` (None: unconfined). The engine (and torch, and vLLM) is imported only when a model
    loads, so the HTTP port opens first."""
    return functools.partial(load_vllm_engine if kind == "vllm" else load_engine, share=share)


def load_engine(model: ServedModelConfig, share: CpuShare | None = None) -> NodeEngine:
    from regional_node.engine import AsyncEngine, LLMEngine

    engine = LLMEngine.from_pretrained(model.path, **model.engine.engine_kwargs())
    return AsyncEngine(engine, queue_limits(model), cpu_share=share)


def load_vllm_engine(model: ServedModelConfig, share: CpuShare | None = None) -> NodeEngine:
    from regional_node.vllm_engine import VllmEngine

    return VllmEngine.from_settings(model.path, model.engine, queue_limits(model), cpu_share=share)


def queue_limits(model: ServedModelConfig) -> QueueLimits:
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

    config: ServedModelConfig
    engine: NodeEngine
    created: int = field(default_factory=lambda: int(time.time()))
    utilization: UtilizationMeter | None = None

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


def attach_utilization(engine: NodeEngine) -> UtilizationMeter | None:
    """A utilization meter fed by our engine's steps (in a worker thread: it may measure the
    device's peak); None for an engine without per-step observers (vLLM's)."""
    from regional_node.utilization import ModelShape, UtilizationMeter, device_peak
    from regional_node.utilization.work import DTYPE_BYTES

    core = getattr(engine, "engine", None)
    observers = getattr(core, "step_observers", None)
    if core is None or observers is None:
        return None
    model, config = core.model_config, core.engine_config
    dtype = str(core.runner.model.dtype).removeprefix("torch.")
    shape = ModelShape(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        intermediate_size=model.intermediate_size,
        vocab_size=model.vocab_size,
        bytes_per_param=DTYPE_BYTES.get(dtype, 2),
    )
    meter = UtilizationMeter(shape, device_peak(config.device, dtype))
    observers.append(meter)
    return meter


class ModelPool:
    """Loads every configured model once; `get` hands out ready models by name."""

    def __init__(
        self,
        models: list[ServedModelConfig],
        *,
        loader: EngineLoader = load_engine,
        warmup: bool = True,
    ) -> None:
        self._configs = list(models)
        self._loader = loader
        self._warmup = warmup
        self._models: dict[str, ServedModel] = {}
        self._probers: dict[str, ModelProber] = {}
        self._probe_tasks: list[asyncio.Task[None]] = []
        self.state: PoolState = "loading"
        self.error: str | None = None

    @property
    def configs(self) -> list[ServedModelConfig]:
        return list(self._configs)

    @property
    def ready(self) -> bool:
        """Every model loaded, and at least one of them serving (not failing its probes)."""
        return self.state == "ready" and any(self.serving(config.name) for config in self._configs)

    def serving(self, name: str) -> bool:
        """`name` is loaded and not failing its golden probes."""
        prober = self._probers.get(name)
        return self.state == "ready" and name in self._models and (prober is None or prober.state.serves)

    def prober(self, name: str) -> ModelProber | None:
        return self._probers.get(name)

    def probe_states(self) -> dict[str, ProbeState]:
        """Each loaded model's probe result, by name (status "none": not probed)."""
        return {name: prober.state for name, prober in self._probers.items()}

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
        if model is None or self.state != "ready":
            raise ServiceUnavailableError(
                f"The model `{name}` is still loading; retry when /ready answers 200.",
                code="model_loading",
                headers={"retry-after": "1"},
            )
        prober = self._probers.get(name)
        if prober is not None and not prober.state.serves:
            # A model that answers its golden probes wrongly (or has not answered them yet) is not
            # served: a wrong answer is worse than none, and another node can serve it.
            raise ServiceUnavailableError(
                f"The model `{name}` has not passed its golden-output probes on this node "
                f"({prober.state.detail or 'not probed yet'}); it is not served here until a probe passes.",
                code="model_probe_failed",
                headers={"retry-after": str(int(prober.next_delay_s()))},
            )
        return model

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each loaded model's engine stats, by name."""
        return {name: model.stats() for name, model in self._models.items()}

    def utilization(self) -> dict[str, UtilizationReport]:
        """Each loaded model's utilization report (models on an engine without one: absent)."""
        return {
            name: model.utilization.report()
            for name, model in self._models.items()
            if model.utilization is not None
        }

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
                golden = await asyncio.to_thread(_golden, config)
                engine = await asyncio.to_thread(self._loader, config)
                _arm_test_fault(config.name, engine)
                meter = await asyncio.to_thread(attach_utilization, engine)
                await engine.start()
                model = ServedModel(config=config, engine=engine, utilization=meter)
                if self._warmup:
                    await _warm_up(model)
                prober = ModelProber(
                    config.name,
                    golden,
                    interval_s=config.probes.interval_s,
                    max_share=config.probes.max_share,
                )
                await prober.run(engine)  # before /ready: a wrong model never becomes ready
                self._probers[config.name] = prober
                self._models[config.name] = model
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
        self._probe_tasks = [
            asyncio.create_task(prober.schedule(self._models[name].engine), name=f"meridian-probe-{name}")
            for name, prober in self._probers.items()
            if prober.golden is not None
        ]

    async def shutdown(self) -> None:
        """Stop every engine; in-flight requests end with finish_reason "abort"."""
        self.state = "stopped"
        for task in self._probe_tasks:
            task.cancel()
        for task in self._probe_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for model in list(self._models.values()):
            try:
                await model.engine.shutdown()
            except Exception:
                logger.exception("engine for %s did not shut down cleanly", model.name)
        logger.info("engines stopped")


def _golden(config: ServedModelConfig) -> GoldenSet | None:
    """The model's golden set: the configured file (which must read), else the checkpoint's own
    if it has one, else None (not probed)."""
    path = golden_path(config.path, config.probes.golden)
    if config.probes.golden is None and not path.is_file():
        return None
    return read_golden(path)


def _arm_test_fault(name: str, engine: NodeEngine) -> None:
    # Test-only code, absent from production images (deploy/Dockerfile.dockerignore).
    try:
        from regional_node.probes.fault import install_test_fault
    except ImportError:
        return
    install_test_fault(name, engine)


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

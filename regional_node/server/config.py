"""A regional node's configuration: typed structs, loaded from YAML and/or command-line flags.

Validation happens once, at start-up, and every error names the file and the field
(`node.yaml: models[0].tier: Expected ...`), so a typo never surfaces as a failure mid-request.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml
from msgspec import UNSET, UnsetType

from http_server import ServerLimits
from regional_node.cpu_share import (
    CpuShare,
    available_cpus,
    default_engine_cpus,
    format_cpu_list,
    parse_cpu_list,
)
from regional_node.discovery.consul_registration import ConsulRegistrationConfig

Tier = Literal["small", "large"]
Dtype = Literal["float32", "float16", "bfloat16", "auto"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
# Which engine runs the node's models: ours (regional_node/engine) or vLLM's own (the V1 AsyncLLM,
# regional_node/vllm_engine; needs vLLM installed). The node's API is the same either way.
EngineKind = Literal["meridian", "vllm"]

TOKEN_ENV = "MERIDIAN_NODE_TOKEN"

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Name = Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
# Cores as taskset writes them: "0-2,5".
CpuList = Annotated[str, msgspec.Meta(pattern=r"^ *[0-9]+( *- *[0-9]+)?( *, *[0-9]+( *- *[0-9]+)?)* *$")]
Niceness = Annotated[int, msgspec.Meta(ge=0, le=19)]


class ConfigError(Exception):
    """The configuration is invalid; the message names the file (or flag) and the field."""


class SpeculativeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Speculative decoding for one model (regional_node/engine/README.md, "Speculative decoding");
    with `engine: vllm` the same keys become vLLM's `speculative_config`."""

    method: Literal["ngram", "draft"] = "ngram"
    num_speculative_tokens: PositiveInt = 4
    # method draft: the draft checkpoint's folder, or the name of another model this node serves
    # (validate_config puts that model's folder here). Ours only: vLLM's draft models are not wired.
    draft_model: str | None = None
    prompt_lookup_min: PositiveInt = 2
    prompt_lookup_max: PositiveInt = 4
    # Our engine's back-off (vLLM has its own rules): no speculation in a step with more decoding
    # sequences than this, and a sequence whose acceptance stays below the rate pauses.
    max_batch_size: PositiveInt = 8
    min_acceptance_rate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.25


class EngineSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Keyword arguments for `LLMEngine.from_pretrained` (or, with `engine: vllm`, vLLM's engine
    arguments: see regional_node/vllm_engine); the defaults suit CPU test checkpoints."""

    device: str = "cpu"
    dtype: Dtype = "float32"
    # None: the engine's own default (16 for ours; vLLM's, which is 32 on CPU, for engine: vllm).
    block_size: PositiveInt | None = None
    # None: the engine sizes the pool from the device's free memory.
    num_kv_blocks: PositiveInt | None = None
    max_num_seqs: PositiveInt = 64
    max_num_batched_tokens: PositiveInt = 2048
    enable_prefix_caching: bool = True
    # Any further `LLMEngine.from_pretrained` option (max_model_len, kv_cache_memory_fraction,
    # attention_backend, ...), passed through as is; the engine validates them when it loads.
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    # None: no speculative decoding.
    speculative: SpeculativeSettings | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        kwargs = msgspec.structs.asdict(self)
        options = kwargs.pop("options")
        if self.speculative is not None:
            spec = msgspec.structs.asdict(self.speculative)
            if spec["draft_model"] is None:
                del spec["draft_model"]  # the n-gram method's options stay as they were
            kwargs["speculative"] = spec
        return {**options, **{key: value for key, value in kwargs.items() if value is not None}}


# Default queue bounds, in engine steps' worth of prompt tokens (multiples of
# max_num_batched_tokens): an interactive request queues behind at most a few full prefill steps
# (well under a second on a GPU node), batch work behind many more.
INTERACTIVE_QUEUE_STEPS = 4
BATCH_QUEUE_STEPS = 64


class QueueSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-tier bounds on a model's waiting queue, checked when a request arrives: a request
    that would pass its tier's bound is refused at once with 503 `overloaded` and Retry-After.

    `*_max_waiting_tokens` bound the tier's waiting prompt tokens. Left out, they default to
    INTERACTIVE_QUEUE_STEPS / BATCH_QUEUE_STEPS times the engine's max_num_batched_tokens; null
    leaves the tier unbounded. `*_max_wait_s` (off by default) also refuse a request whose
    estimated wait before its first step (tokens ahead of it / the measured drain rate) is past
    the limit. `max_retry_after_s` caps the Retry-After, which is also the answer when the drain
    rate is not known yet.
    """

    interactive_max_waiting_tokens: PositiveInt | UnsetType | None = UNSET
    batch_max_waiting_tokens: PositiveInt | UnsetType | None = UNSET
    interactive_max_wait_s: PositiveFloat | None = None
    batch_max_wait_s: PositiveFloat | None = None
    max_retry_after_s: PositiveInt = 60

    def max_waiting_tokens(self, step_tokens: int) -> dict[str, int]:
        """Each bounded tier's bound; `step_tokens` is the engine's max_num_batched_tokens."""
        bounds = {
            "interactive": _bound(self.interactive_max_waiting_tokens, INTERACTIVE_QUEUE_STEPS * step_tokens),
            "batch": _bound(self.batch_max_waiting_tokens, BATCH_QUEUE_STEPS * step_tokens),
        }
        return {tier: bound for tier, bound in bounds.items() if bound is not None}

    def max_wait_s(self) -> dict[str, float]:
        waits = {"interactive": self.interactive_max_wait_s, "batch": self.batch_max_wait_s}
        return {tier: wait for tier, wait in waits.items() if wait is not None}


Share = Annotated[float, msgspec.Meta(gt=0, le=1)]


class ProbeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Golden-output probes (regional_node/probes): the model must answer the prompts recorded by
    `meridian model certify` as it did then, before /ready and every `interval_s` after."""

    # The golden file; null: `meridian-golden.json` in the checkpoint folder if there is one
    # (none: the model is not probed). A path given here must exist.
    golden: str | None = None
    interval_s: PositiveFloat = 300.0
    # The most of the engine's time probes may take: a round that took d seconds is followed by
    # the next no sooner than d / max_share seconds later.
    max_share: Share = 0.01


class ServedModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One served model: the name clients put in `model`, its checkpoint folder and its tier,
    how its engine is built (`engine`: LLMEngine options) and how much its queue may hold
    (`queue`: enforced by the node in front of the engine, not an engine option)."""

    name: Name
    path: str
    tier: Tier = "small"
    # The version of `name` this checkpoint is (e.g. "v2"), advertised in /load and Consul meta so
    # the gateway can route a rollout by it; None: unversioned (only served without a rollout).
    version: Name | None = None
    engine: EngineSettings = msgspec.field(default_factory=EngineSettings)
    queue: QueueSettings = msgspec.field(default_factory=QueueSettings)
    probes: ProbeSettings = msgspec.field(default_factory=ProbeSettings)

    def queue_bounds(self) -> dict[str, int]:
        """Each bounded tier's bound on waiting prompt tokens, defaults resolved."""
        return self.queue.max_waiting_tokens(self.engine.max_num_batched_tokens)


class CpuSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """The node's share of the machine: where and how hard its engines compute (see
    regional_node/cpu_share.py). The HTTP API is not confined: it may run on every core, at the
    node's own niceness, so it answers while the engines are saturated."""

    # The cores the engines' threads and processes may run on ("0-2,5"); null: every core this
    # process may use but the last, which is left to the API and the node's neighbours (the
    # gateway, other nodes); a 1-core machine's one core is shared.
    engine_cpus: CpuList | None = None
    # Compute threads per engine: torch's intra-op threads (ours), vLLM's OpenMP threads (one bound
    # to each of the first engine_threads engine cores); null: one per engine core, at most
    # OMP_NUM_THREADS where that is set.
    engine_threads: PositiveInt | None = None
    # How many levels nicer than the node the engines run: the API and the processes beside the
    # node get a core first whenever they need one. 0: the engines run level with the API.
    engine_nice: Niceness = 10

    def engine_cpu_set(self, available: frozenset[int]) -> frozenset[int]:
        return parse_cpu_list(self.engine_cpus) if self.engine_cpus else default_engine_cpus(available)

    def share(self, available: frozenset[int], max_threads: int | None = None) -> CpuShare:
        """The resolved share on a machine whose usable cores are `available`; `max_threads`
        (OMP_NUM_THREADS) caps the default thread count, never an explicit engine_threads."""
        cpus = self.engine_cpu_set(available)
        threads = self.engine_threads or min(len(cpus), max_threads or len(cpus))
        return CpuShare(cpus=cpus, threads=threads, nice=self.engine_nice)


class NodeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: Name = msgspec.field(default_factory=lambda: f"node-{socket.gethostname()}")
    engine: EngineKind = "meridian"
    region: Name = "local"
    jurisdiction: Name = "local"
    host: str = "127.0.0.1"
    port: Port = 8100
    models: list[ServedModelConfig] = msgspec.field(default_factory=list)
    # Prefer the MERIDIAN_NODE_TOKEN environment variable: it wins over this field.
    auth_token: str | None = None
    log_level: LogLevel = "info"
    # One tiny generation per model before /ready turns 200, so the first real request does
    # not pay for lazy initialisation.
    warmup: bool = True
    # Register in Consul (regional_node/discovery) while running; None: listed in a static file.
    consul: ConsulRegistrationConfig | None = None
    # What the node's HTTP server allows its clients (http_server/limits.py documents each).
    server: ServerLimits = msgspec.field(default_factory=ServerLimits)
    # The engines' share of the machine's cores (threads, affinity, niceness); see CpuSettings.
    # None (`cpu: null`): unconfined, as the process is (and vLLM binds its threads itself).
    cpu: CpuSettings | None = msgspec.field(default_factory=CpuSettings)

    def model_names(self) -> list[str]:
        return [model.name for model in self.models]


def load_config(path: Path) -> NodeConfig:
    """Read and validate a YAML node config. Relative model paths resolve against its folder."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    config = convert_config(raw, source=str(path))
    models = [
        msgspec.structs.replace(
            model,
            path=str(_resolve(path.parent, model.path)),
            engine=_resolve_draft_path(path.parent, model, {m.name for m in config.models}),
            probes=msgspec.structs.replace(
                model.probes,
                golden=str(_resolve(path.parent, model.probes.golden)) if model.probes.golden else None,
            ),
        )
        for model in config.models
    ]
    return msgspec.structs.replace(config, models=models)


def _resolve_draft_path(base: Path, model: ServedModelConfig, served: set[str]) -> EngineSettings:
    """A draft_model given as a relative folder resolves against the config's folder, as paths do
    (a served model's name is left for validate_config)."""
    spec = model.engine.speculative
    if spec is None or spec.draft_model is None or spec.draft_model in served:
        return model.engine
    draft = str(_resolve(base, spec.draft_model))
    return msgspec.structs.replace(model.engine, speculative=msgspec.structs.replace(spec, draft_model=draft))


def convert_config(raw: Any, *, source: str) -> NodeConfig:
    """Validate a decoded mapping into a NodeConfig; errors read `<source>: <field>: <problem>`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return msgspec.convert(raw, NodeConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_field_message(str(exc))}") from None


def validate_config(config: NodeConfig, *, source: str) -> NodeConfig:
    """Checks that span fields: at least one model, unique names, checkpoint folders that exist, an
    engine CPU share within the cores this process may use."""
    if config.cpu is not None:
        _check_cpu(config.cpu, available_cpus(), source=source)
    if not config.models:
        raise ConfigError(f"{source}: models: no models configured; add one (--model NAME=PATH[:TIER])")
    seen: set[str] = set()
    for index, model in enumerate(config.models):
        if model.name in seen:
            raise ConfigError(f"{source}: models[{index}].name: duplicate model name {model.name!r}")
        seen.add(model.name)
        if not (Path(model.path) / "config.json").is_file():
            raise ConfigError(
                f"{source}: models[{index}].path: {model.path!r} is not a checkpoint folder "
                "(no config.json); create one with `meridian model init`"
            )
        if model.probes.golden is not None and not Path(model.probes.golden).is_file():
            raise ConfigError(
                f"{source}: models[{index}].probes.golden: {model.probes.golden!r} does not exist; "
                f"write it with `meridian model certify {model.path}`"
            )
    models = [
        _resolve_draft(config, index, model, source=source) for index, model in enumerate(config.models)
    ]
    return msgspec.structs.replace(config, models=models)


def _resolve_draft(
    config: NodeConfig, index: int, model: ServedModelConfig, *, source: str
) -> ServedModelConfig:
    """A draft-model speculative config with its draft's folder: a served model's name becomes
    that model's path. The vocabulary check happens when the engine loads both."""
    spec = model.engine.speculative
    if spec is None or spec.method != "draft":
        if spec is not None and spec.draft_model is not None:
            raise ConfigError(
                f"{source}: models[{index}].engine.speculative.draft_model: only used with method draft"
            )
        return model
    where = f"{source}: models[{index}].engine.speculative"
    if config.engine == "vllm":
        raise ConfigError(f"{where}.method: draft runs on our engine only (engine: meridian); use ngram")
    served = {m.name: m.path for m in config.models}
    draft = served.get(spec.draft_model or "", spec.draft_model)
    if draft is None or not (Path(draft) / "config.json").is_file():
        raise ConfigError(
            f"{where}.draft_model: {spec.draft_model!r} is neither a model this node serves "
            f"({', '.join(served)}) nor a checkpoint folder"
        )
    if draft == model.path:
        raise ConfigError(f"{where}.draft_model: a model cannot draft for itself")
    engine = msgspec.structs.replace(
        model.engine, speculative=msgspec.structs.replace(spec, draft_model=draft)
    )
    return msgspec.structs.replace(model, engine=engine)


def _check_cpu(cpu: CpuSettings, available: frozenset[int], *, source: str) -> None:
    try:
        cpus = cpu.engine_cpu_set(available)
    except ValueError as exc:
        raise ConfigError(f"{source}: cpu.engine_cpus: {exc}") from None
    missing = cpus - available
    if missing:
        raise ConfigError(
            f"{source}: cpu.engine_cpus: core(s) {format_cpu_list(missing)} are not available to this "
            f"process (it may use {format_cpu_list(available)})"
        )
    if cpu.engine_threads is not None and cpu.engine_threads > len(cpus):
        raise ConfigError(
            f"{source}: cpu.engine_threads: {cpu.engine_threads} threads on {len(cpus)} engine core(s) "
            f"({format_cpu_list(cpus)}); at most one thread per core"
        )


def effective_token(config: NodeConfig) -> str | None:
    """The bearer token every call but /health must carry, or None for an open node."""
    # Stripped because tokens often come from files or secrets with a trailing newline; the
    # gateway strips the same way, so both sides agree.
    token = (os.environ.get(TOKEN_ENV) or config.auth_token or "").strip()
    return token or None


def _bound(configured: int | UnsetType | None, default: int) -> int | None:
    return default if isinstance(configured, UnsetType) else configured


def _resolve(base: Path, raw: str) -> Path:
    candidate = Path(raw).expanduser()
    return candidate if candidate.is_absolute() else (base / candidate)


def _field_message(message: str) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.models[0].engine.block_size`"; put the
    # field first, where a reader scanning for it looks.
    head, sep, where = message.rpartition(" - at `$")
    if not sep:
        return message
    field = where.rstrip("`").lstrip(".")
    return f"{field}: {head}"

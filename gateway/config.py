"""The gateway's YAML configuration, validated into typed structs at start-up.

Every section is a struct that rejects unknown keys, so a typo anywhere in the file stops start-up.
Errors name the file and the field (`gateway.yaml: $.timeouts.connect_s: Expected float`), read
by gateway/config_reader.py as policy files are; rules the types cannot express live in a
struct's `__post_init__`. Relative paths are resolved against the config file's folder, so a config can be
moved together with its policies and regions file.

`quota` and `providers` are defined next to the code that uses them (gateway/quota/config.py,
gateway/upstreams/providers/config.py). `directory` is defined here: the discovery package reports
regions-file mistakes as this module's ConfigError, so it imports this module, never the reverse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from gateway.batches.config import BatchesConfig
from gateway.config_reader import FieldError, Section, convert
from gateway.escalation.config import AutoConfig
from gateway.ledger.config import LedgerConfig, SqliteStoreConfig
from gateway.ledger.prices import ModelPrice
from gateway.quota.config import QuotaConfig
from gateway.responses.config import ResponsesConfig
from gateway.safety.config import SafetyConfig
from gateway.upstreams.providers.config import ProvidersConfig
from http_server import ServerLimits
from http_server.limits import KeepAliveSeconds
from protocol.consul.advertisement import SERVICE_NAME
from protocol.consul.client import ConsulConfig, resolve_tls_paths
from router import MAX_ATTEMPTS_BOUND
from router.types import CatalogModel, Rollout


class ConfigError(Exception):
    """The configuration is invalid; the message names the file and the field."""


class GatewayServerLimits(ServerLimits, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A node's limits, but idle client connections are kept 65 s rather than 5: clients that
    never expire idle connections themselves (python-requests, many SDKs) would otherwise race
    the close after any gap near 5 s, and a load balancer in front (AWS ALB: 60 s idle) needs its
    backend to keep connections longer than it does. The gateway's own client, towards nodes,
    honours their shorter `Keep-Alive: timeout`."""

    keep_alive_s: KeepAliveSeconds = 65


class ListenConfig(Section):
    host: str = "127.0.0.1"
    port: int = 8080


class AdminListenConfig(Section):
    """The operators' listener: `GET /metrics` (Prometheus), which names every tenant with its
    tokens and cost, so it is never served on the public `listen` port. Loopback by default; in
    a cluster, bind it wider and let only Prometheus reach it (deploy/k8s NetworkPolicy)."""

    host: str = "127.0.0.1"
    port: int = 9464  # the port the OpenTelemetry Prometheus exporters use for metrics


class RolloutConfig(Section):
    """`rollout: {versions: {v2: 10, v1: 90}}`: each request's sticky key draws a version by
    weight (router/rollout.py). The first version listed owns the bottom of the range, so put the
    canary first: growing its weight then only moves sessions onto it."""

    versions: dict[str, Annotated[int, msgspec.Meta(ge=0)]]

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError("versions: at least one version is required")
        if sum(self.versions.values()) <= 0:
            raise ValueError("versions: the weights must sum to more than 0")

    def to_rollout(self) -> Rollout:
        return Rollout(tuple(self.versions.items()))


class CatalogEntry(Section):
    name: str
    tier: Literal["small", "large"]
    description: str = ""
    # USD per million tokens (gateway/ledger/prices.py); unpriced models cost 0 in the ledger.
    price: ModelPrice | None = None
    # By the provider's model name (an endpoint's `models:` value) when a provider serves it.
    provider_prices: dict[str, ModelPrice] = msgspec.field(default_factory=dict)
    # The model's known versions (what nodes advertise: their `version:`); a rollout names only these.
    versions: list[str] = msgspec.field(default_factory=list)
    rollout: RolloutConfig | None = None

    def __post_init__(self) -> None:
        if self.rollout is not None:
            unknown = sorted(set(self.rollout.versions) - set(self.versions))
            if unknown:
                raise ValueError(f"rollout.versions: {unknown} not in the model's versions {self.versions}")

    def to_model(self) -> CatalogModel:
        return CatalogModel(name=self.name, tier=self.tier, description=self.description)


class NodeAuthConfig(Section):
    # The credential itself is a secret, so the config names the environment variable holding it.
    token_env: str = "MERIDIAN_NODE_TOKEN"


# Bounds checked at start, so a bad value is a ConfigError naming the field, not a failed request.
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class TimeoutsConfig(Section):
    connect_s: Positive = 2.0  # TCP connect to a node or provider
    read_s: Positive = 120.0  # a whole non-streaming response
    stream_idle_s: Positive = 30.0  # the longest gap between two streamed chunks (first one included)
    probe_s: Positive = 0.5  # one health probe (/ready, /load)
    # /ready probes in a row left unanswered within probe_s before a node that was ready leaves
    # routing: a busy node (its event loop starved on a loaded host) can miss one, and with one node
    # per model a single miss would refuse every request for a round. An answer other than 200, or
    # a connection the node refuses or breaks off, takes it out at once.
    probe_misses: Annotated[int, msgspec.Meta(ge=1)] = 2
    # Between probe rounds. Admission estimates from the nodes' last /load reports: at tens of
    # requests a second a report a second old has missed most of what finished since
    # (benchmarks/admission.py: at 2x capacity, goodput 45% of capacity with 1 s, 99% with 0.25 s).
    probe_interval_s: Positive = 0.25


class RetryConfig(Section):
    # Targets tried before the first byte, the first one included.
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=MAX_ATTEMPTS_BOUND)] = 3
    backoff_base_s: NonNegative = 0.02  # full-jitter back-off between attempts: U(0, base * 2^n)
    backoff_max_s: NonNegative = 0.25
    max_continuations: Annotated[int, msgspec.Meta(ge=0)] = (
        2  # how often one broken stream may be continued on another node
    )


class EjectionConfig(Section):
    # A node that fails a request is out for base_s, doubling with each further failure up to max_s;
    # then a single trial request decides whether it is back.
    base_s: Positive = 1.0
    max_s: Positive = 30.0

    def __post_init__(self) -> None:
        if self.max_s < self.base_s:
            raise ValueError("max_s: must be at least base_s")


class TokenEstimateConfig(Section):
    # The gateway has no tokenizer: ~4 bytes per token is OpenAI's rule of thumb for English and
    # over-counts for most other text, which is the safe side for quota reservations.
    bytes_per_token: float = 4.0
    # Reserved completion tokens when a request sets no max_tokens and its tenant has no cap.
    default_completion_tokens: int = 256

    def __post_init__(self) -> None:
        if self.bytes_per_token <= 0:
            raise ValueError("bytes_per_token: must be positive")


class TierAdmissionConfig(Section):
    """One traffic tier's admission: its target and its gateway queue (gateway/admission)."""

    # Admit while the pool's estimated queueing delay (router/overload.py) is at most this.
    target_ttft_s: Positive
    # Longest wait in the gateway queue before a 429 `overloaded`; 0: refuse at once, never queue.
    queue_deadline_s: NonNegative
    # Requests waiting in this tier's gateway queue (all tenants); one more is refused at once.
    max_queue: Annotated[int, msgspec.Meta(ge=0)]


class AdmissionConfig(Section):
    """Tier-aware admission against a time-to-first-token target (gateway/README.md, "Overload")."""

    enabled: bool = True
    # Interactive follows the design's SLO, time to first token under 1 s at p90: admitted while
    # the estimate (plus what the gateway queue already took) is within 0.5 s, leaving the rest of
    # the second for the gateway's hop and the estimate's misses. The queue smooths arrivals
    # between two /load probes, no more: a waiter admitted late is a slow first token, and under
    # overload a long queue turns every admission into one (benchmarks/admission.py: at 2x
    # capacity, goodput 20% of capacity with a 0.5 s deadline, 45% with 0.1 s, same probes).
    interactive: TierAdmissionConfig = msgspec.field(
        default_factory=lambda: TierAdmissionConfig(target_ttft_s=0.5, queue_deadline_s=0.1, max_queue=256)
    )
    batch: TierAdmissionConfig = msgspec.field(
        default_factory=lambda: TierAdmissionConfig(target_ttft_s=60.0, queue_deadline_s=30.0, max_queue=1024)
    )
    # How often a request in the gateway queue looks at the estimate again (nodes report once per
    # probe interval; a finished request also wakes the queue at once).
    recheck_interval_s: Positive = 0.05
    # Cap on the Retry-After a refusal carries (the estimated time until the pool is under target).
    max_retry_after_s: Annotated[int, msgspec.Meta(ge=1)] = 30
    # After an interactive request had to wait or was refused (interactive load fills the pool),
    # batch is not admitted for this long: batch work already running slows every step of the
    # engines it shares, so admitting more while interactive users are being turned away would
    # serve batch at their expense. 0: only the estimates decide.
    batch_holdoff_s: NonNegative = 5.0

    def __post_init__(self) -> None:
        if self.batch.target_ttft_s < self.interactive.target_ttft_s:
            raise ValueError("batch.target_ttft_s: must be at least interactive.target_ttft_s")

    def tier(self, tier: str) -> TierAdmissionConfig:
        return self.interactive if tier == "interactive" else self.batch


class StaticDirectoryConfig(Section, tag_field="type", tag="static"):
    """`directory: {type: static, file: regions.yaml}`: the fleet is the regions file's nodes."""

    file: str
    poll_interval_s: Positive = 2.0  # how often the file's modification time is checked


class ConsulDirectoryConfig(
    ConsulConfig, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="consul"
):
    """`directory: {type: consul, ...}`: the fleet is whatever Consul says is passing."""

    service: str = SERVICE_NAME
    # Floor between two queries of one watch: a flapping service cannot make us hammer Consul.
    min_interval_s: float = 0.1
    backoff_initial_s: float = 0.5  # first retry after an error; doubles up to backoff_max_s
    backoff_max_s: float = 10.0
    initial_sync_timeout_s: float = 3.0  # how long start() waits for a first membership

    def __post_init__(self) -> None:
        if not 0 < self.wait_s <= 600:
            raise ValueError("wait_s: must be in (0, 600] (Consul's cap is 10 minutes)")
        if (
            self.min_interval_s < 0
            or self.backoff_initial_s <= 0
            or self.backoff_max_s < self.backoff_initial_s
        ):
            raise ValueError("min_interval_s/backoff_*: need 0 <= min, 0 < initial <= max")


DirectoryConfig = StaticDirectoryConfig | ConsulDirectoryConfig


class GatewayConfig(Section):
    home_region: str
    catalog: list[CatalogEntry]
    policies: str  # folder of tenant policy YAML files
    directory: DirectoryConfig
    listen: ListenConfig = msgspec.field(default_factory=ListenConfig)
    admin: AdminListenConfig = msgspec.field(default_factory=AdminListenConfig)  # /metrics
    quota: QuotaConfig = msgspec.field(default_factory=QuotaConfig)  # defaults: the in-process store
    ledger: LedgerConfig = msgspec.field(default_factory=LedgerConfig)  # defaults: embedded, SQLite
    price_table_version: str = "unversioned"  # recorded with every usage event's cost
    providers: ProvidersConfig = msgspec.field(default_factory=ProvidersConfig)  # defaults: none
    node_auth: NodeAuthConfig = msgspec.field(default_factory=NodeAuthConfig)
    timeouts: TimeoutsConfig = msgspec.field(default_factory=TimeoutsConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    ejection: EjectionConfig = msgspec.field(default_factory=EjectionConfig)
    token_estimate: TokenEstimateConfig = msgspec.field(default_factory=TokenEstimateConfig)
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    # The safety layer's audit log and classifier model (gateway/safety/config.py); what each
    # tenant checks is in its policy.
    safety: SafetyConfig = msgspec.field(default_factory=SafetyConfig)
    # `model: "auto"`: the starting-tier rule, the confidence cascade's defaults, thrash protection.
    auto: AutoConfig = msgspec.field(default_factory=AutoConfig)
    # What the gateway's HTTP server allows its clients (http_server/limits.py documents each).
    server: GatewayServerLimits = msgspec.field(default_factory=GatewayServerLimits)
    # The Responses API's stored responses (in memory; gateway/responses/store.py).
    responses: ResponsesConfig = msgspec.field(default_factory=ResponsesConfig)
    # The Files and Batches APIs (gateway/batches/); their state is in the ledger's database.
    batches: BatchesConfig = msgspec.field(default_factory=BatchesConfig)
    # Where this config came from, for error messages and resolving relative paths; not in YAML.
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if not self.catalog:
            raise ValueError("catalog: at least one model is required")
        names = [entry.name for entry in self.catalog]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"catalog: duplicate model names {duplicates}")
        if self.ledger.worker == "external" and self.quota.redis_url is None:
            raise ValueError(
                "ledger.worker: 'external' needs quota.redis_url (the usage streams live in Redis)"
            )

    def catalog_models(self) -> tuple[CatalogModel, ...]:
        return tuple(entry.to_model() for entry in self.catalog)

    def rollouts(self) -> dict[str, Rollout]:
        """The rollout plan of each catalog model that has one."""
        return {entry.name: entry.rollout.to_rollout() for entry in self.catalog if entry.rollout is not None}


# Sections that were optional mappings before they had structs: null still means the defaults,
# and a non-mapping is told what it always was.
_NULLABLE_SECTIONS = {
    "quota": "expected a mapping",
    "providers": "expected a mapping with `endpoints:`",
    "ledger": "expected a mapping",
}


def _as_sections(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The document as the structs read it, with the mistakes they would word differently named
    the way they always were."""
    data = dict(data)
    for name, expected in _NULLABLE_SECTIONS.items():
        if name in data and data[name] is None:
            del data[name]
        elif name in data and not isinstance(data[name], dict):
            raise ConfigError(f"{source}: $.{name}: {expected}, got {type(data[name]).__name__}")
    ledger = data.get("ledger")
    if isinstance(ledger, dict) and isinstance(ledger.get("store"), dict):
        # Like the directory: a store without `type` is the embedded SQLite file.
        data["ledger"] = {**ledger, "store": {"type": "sqlite", **ledger["store"]}}
    directory = data.get("directory")
    if isinstance(directory, dict):
        # The tagged union needs `type`; a directory without one has always been static.
        kind = directory.get("type", "static")
        if kind not in ("static", "consul"):
            raise ConfigError(f"{source}: $.directory.type: expected 'static' or 'consul', got {kind!r}")
        if kind == "static" and not isinstance(directory.get("file"), str):
            raise ConfigError(f"{source}: $.directory.file: a static directory needs a regions file")
        data["directory"] = {**directory, "type": kind}
    return data


def _resolve_paths(config: GatewayConfig, base: Path) -> GatewayConfig:
    def resolve(path: str) -> str:
        return str((base / path).resolve()) if not Path(path).is_absolute() else path

    directory: DirectoryConfig = config.directory
    if isinstance(directory, StaticDirectoryConfig):
        directory = msgspec.structs.replace(directory, file=resolve(directory.file))
    else:
        directory = msgspec.structs.replace(directory, tls=resolve_tls_paths(directory.tls, base))
    safety = config.safety
    if safety.audit_path is not None:
        safety = msgspec.structs.replace(safety, audit_path=resolve(safety.audit_path))
    if safety.classifier is not None:
        classifier = msgspec.structs.replace(
            safety.classifier, model_dir=resolve(safety.classifier.model_dir)
        )
        safety = msgspec.structs.replace(safety, classifier=classifier)
    ledger = config.ledger
    if isinstance(ledger.store, SqliteStoreConfig):
        ledger = msgspec.structs.replace(
            ledger, store=msgspec.structs.replace(ledger.store, path=resolve(ledger.store.path))
        )
    batches = msgspec.structs.replace(config.batches, storage_dir=resolve(config.batches.storage_dir))
    return msgspec.structs.replace(
        config,
        policies=resolve(config.policies),
        directory=directory,
        safety=safety,
        ledger=ledger,
        batches=batches,
    )


def config_from_dict(data: Any, *, source: str = "<memory>", base_dir: Path | None = None) -> GatewayConfig:
    """Validate a parsed YAML document; relative paths resolve against `base_dir` (default: cwd)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if "source" in data:
        raise ConfigError(f"{source}: $.source: unknown field")
    try:
        config = convert({**_as_sections(data, source), "source": source}, GatewayConfig)
    except FieldError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return _resolve_paths(config, base_dir or Path.cwd())


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return config_from_dict(data, source=str(path), base_dir=path.resolve().parent)

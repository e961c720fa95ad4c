"""The gateway's YAML configuration, validated into typed structs at start-up.

Errors name the file and the field (`gateway.yaml: $.timeouts.connect_s: Expected float`).
Sections other engineers own (`quota`, `providers`, and the `directory` of `type: consul`) stay
raw dicts here and are validated by their own builders. Relative paths are resolved against the
config file's folder, so a config can be moved together with its policies and regions file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from gateway.config_fields import field_first
from router import MAX_ATTEMPTS_BOUND
from router.types import CatalogModel


class ConfigError(Exception):
    """The configuration is invalid; the message names the file and the field."""


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Sections reject unknown keys so a typo fails at start-up instead of being ignored."""


class ListenConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080


class CatalogEntry(_Section):
    name: str
    tier: Literal["small", "large"]
    description: str = ""

    def to_model(self) -> CatalogModel:
        return CatalogModel(name=self.name, tier=self.tier, description=self.description)


class NodeAuthConfig(_Section):
    # The credential itself is a secret, so the config names the environment variable holding it.
    token_env: str = "MERIDIAN_NODE_TOKEN"


# Bounds checked at start, so a bad value is a ConfigError naming the field, not a failed request.
Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class TimeoutsConfig(_Section):
    connect_s: Positive = 2.0  # TCP connect to a node or provider
    read_s: Positive = 120.0  # a whole non-streaming response
    stream_idle_s: Positive = 30.0  # the longest gap between two streamed chunks (first one included)
    probe_s: Positive = 0.5  # one health probe (/ready, /load)
    probe_interval_s: Positive = 1.0  # between probe rounds


class RetryConfig(_Section):
    # Targets tried before the first byte, the first one included.
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=MAX_ATTEMPTS_BOUND)] = 3
    backoff_base_s: NonNegative = 0.02  # full-jitter back-off between attempts: U(0, base * 2^n)
    backoff_max_s: NonNegative = 0.25
    max_continuations: Annotated[int, msgspec.Meta(ge=0)] = 2  # how often one broken stream may be continued on another node


class EjectionConfig(_Section):
    # A node that fails a request is out for base_s, doubling with each further failure up to max_s;
    # then a single trial request decides whether it is back.
    base_s: Positive = 1.0
    max_s: Positive = 30.0


class TokenEstimateConfig(_Section):
    # The gateway has no tokenizer: ~4 bytes per token is OpenAI's rule of thumb for English and
    # over-counts for most other text, which is the safe side for quota reservations.
    bytes_per_token: float = 4.0
    # Reserved completion tokens when a request sets no max_tokens and its tenant has no cap.
    default_completion_tokens: int = 256


class GatewayConfig(_Section):
    home_region: str
    catalog: list[CatalogEntry]
    policies: str  # folder of tenant policy YAML files
    directory: dict[str, Any]  # {type: static, file: ...} or {type: consul, ...}
    listen: ListenConfig = msgspec.field(default_factory=ListenConfig)
    quota: dict[str, Any] | None = None  # passed to gateway.quota's build_quota_gate
    providers: dict[str, Any] | None = None  # passed to gateway.upstreams.providers' builder
    node_auth: NodeAuthConfig = msgspec.field(default_factory=NodeAuthConfig)
    timeouts: TimeoutsConfig = msgspec.field(default_factory=TimeoutsConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    ejection: EjectionConfig = msgspec.field(default_factory=EjectionConfig)
    token_estimate: TokenEstimateConfig = msgspec.field(default_factory=TokenEstimateConfig)
    # Where this config came from, for error messages and resolving relative paths; not in YAML.
    source: str = "<memory>"

    def catalog_models(self) -> tuple[CatalogModel, ...]:
        return tuple(entry.to_model() for entry in self.catalog)

    def directory_type(self) -> str:
        return str(self.directory.get("type", "static"))


def _check(config: GatewayConfig) -> None:
    """Rules the struct types cannot express."""
    if not config.catalog:
        raise ConfigError(f"{config.source}: $.catalog: at least one model is required")
    names = [entry.name for entry in config.catalog]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"{config.source}: $.catalog: duplicate model names {duplicates}")
    if config.directory_type() not in ("static", "consul"):
        raise ConfigError(
            f"{config.source}: $.directory.type: expected 'static' or 'consul', "
            f"got {config.directory.get('type')!r}"
        )
    if config.directory_type() == "static" and not isinstance(config.directory.get("file"), str):
        raise ConfigError(f"{config.source}: $.directory.file: a static directory needs a regions file")
    if config.token_estimate.bytes_per_token <= 0:
        raise ConfigError(f"{config.source}: $.token_estimate.bytes_per_token: must be positive")
    if config.ejection.max_s < config.ejection.base_s:
        raise ConfigError(f"{config.source}: $.ejection.max_s: must be at least base_s")


def _resolve_paths(config: GatewayConfig, base: Path) -> GatewayConfig:
    def resolve(path: str) -> str:
        return str((base / path).resolve()) if not Path(path).is_absolute() else path

    directory = dict(config.directory)
    if isinstance(directory.get("file"), str):
        directory["file"] = resolve(directory["file"])
    return msgspec.structs.replace(config, policies=resolve(config.policies), directory=directory)


def config_from_dict(data: Any, *, source: str = "<memory>", base_dir: Path | None = None) -> GatewayConfig:
    """Validate a parsed YAML document; relative paths resolve against `base_dir` (default: cwd)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if "source" in data:
        raise ConfigError(f"{source}: $.source: unknown field")
    try:
        config = msgspec.convert({**data, "source": source}, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {field_first(str(exc))}") from None
    config = _resolve_paths(config, base_dir or Path.cwd())
    _check(config)
    return config


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

"""The regional node's HTTP server: OpenAI-compatible API over one AsyncEngine per served model."""

from regional_node.server.app import create_app
from regional_node.server.config import (
    ConfigError,
    EngineSettings,
    NodeConfig,
    ServedModelConfig,
    convert_config,
    effective_token,
    load_config,
    validate_config,
)

__all__ = [
    "ConfigError",
    "EngineSettings",
    "NodeConfig",
    "ServedModelConfig",
    "convert_config",
    "create_app",
    "effective_token",
    "load_config",
    "validate_config",
]

"""One base for the gateway's config sections (`gateway.config_reader.Section`): unknown keys are
errors and a validated config is frozen, in every module that defines sections; and one name per
meaning for a model's config (the node's served-model entry vs the engine's checkpoint shape)."""

from __future__ import annotations

import msgspec
import pytest

import gateway.config
import gateway.escalation.config
import gateway.ledger.config
import gateway.policy.safety_schema
import gateway.policy.schema
import regional_node.engine
import regional_node.server
from gateway.config_reader import FieldError, Section, convert

MODULES = (
    gateway.config,
    gateway.ledger.config,
    gateway.escalation.config,
    gateway.policy.schema,
    gateway.policy.safety_schema,
)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_section_derives_from_the_one_section_base(module: object) -> None:
    assert not hasattr(module, "_Section")
    sections = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, msgspec.Struct)
        and value.__module__ == module.__name__  # type: ignore[attr-defined]
        # Extensions of other packages' structs (http_server's limits, protocol's Consul config).
        and value.__name__ not in ("GatewayServerLimits", "ConsulDirectoryConfig")
    ]
    assert sections
    for section in sections:
        assert issubclass(section, Section), section
        assert section.__struct_config__.frozen and section.__struct_config__.forbid_unknown_fields


def test_a_section_rejects_unknown_keys_and_edits() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"host": "127.0.0.1", "prot": 1}, gateway.config.ListenConfig)
    listen = msgspec.convert({"port": 9000}, gateway.config.ListenConfig)
    with pytest.raises(AttributeError):
        listen.port = 1  # type: ignore[misc]


def test_the_node_and_the_engine_name_their_model_configs_by_meaning() -> None:
    assert not hasattr(regional_node.server, "ModelConfig")
    assert "checkpoint" in regional_node.server.ServedModelConfig.__doc__
    assert hasattr(regional_node.engine, "ModelConfig")


def test_a_typo_in_either_kind_of_file_gets_the_closest_known_name() -> None:
    with pytest.raises(FieldError) as config:
        convert({"home_region": "eu", "retry": {"max_atempts": 2}}, gateway.config.GatewayConfig)
    assert (config.value.path, config.value.message) == (
        "$.retry.max_atempts",
        "unknown field; did you mean 'max_attempts'?",
    )
    tenant = {"id": "acme", "api_keys": [], "limits": {"token_per_minute": 5}}
    with pytest.raises(FieldError) as policy:
        convert({"tenants": [tenant]}, gateway.policy.schema.PolicyFile)
    assert policy.value.path == "$.tenants[0].limits.token_per_minute"
    assert policy.value.message == "unknown field; did you mean 'tokens_per_minute'?"

"""Tracing settings from the standard OTEL_* environment: off unless asked for, and every value
we cannot use is an error naming its variable (never echoing a credential)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app import build_gateway
from gateway.call.pipeline import RequestPipeline
from gateway.observe import Observers
from telemetry import TracingError, TracingSettings, start_tracing
from tests.support.gateway_config import gateway_config


def settings(**env: str) -> TracingSettings | None:
    return TracingSettings.from_env(env, default_service="svc")


def test_tracing_is_off_by_default_and_builds_nothing() -> None:
    assert settings() is None
    assert start_tracing({}, default_service="svc") is None
    assert settings(OTEL_SERVICE_NAME="x", OTEL_TRACES_SAMPLER="always_on") is None


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"},
    ],
)
def test_an_exporter_or_an_endpoint_turns_it_on(env: dict[str, str]) -> None:
    assert settings(**env) is not None


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
    ],
)
def test_disabled_or_exporter_none_wins(env: dict[str, str]) -> None:
    assert settings(**env) is None


def test_endpoints_service_and_headers() -> None:
    base = settings(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318/", OTEL_SERVICE_NAME="gw-eu")
    assert base is not None and base.endpoint == "http://c:4318/v1/traces" and base.service_name == "gw-eu"
    full = settings(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://t:9999/custom",
        OTEL_EXPORTER_OTLP_HEADERS="api-key=a%20b, X-Team=core",
    )
    assert full is not None and full.endpoint == "http://t:9999/custom" and full.service_name == "svc"
    assert dict(full.headers) == {"api-key": "a b", "x-team": "core"}
    assert "a b" not in repr(full)  # headers may hold credentials
    default = settings(OTEL_TRACES_EXPORTER="otlp")
    assert default is not None and default.endpoint == "http://localhost:4318/v1/traces"


@pytest.mark.parametrize(
    ("sampler", "arg", "description"),
    [
        ("always_on", None, "AlwaysOnSampler"),
        ("always_off", None, "AlwaysOffSampler"),
        ("traceidratio", "0.25", "TraceIdRatioBased{0.25}"),
        ("parentbased_traceidratio", "0.5", "ParentBased{root:TraceIdRatioBased{0.5}"),
        ("parentbased_always_on", None, "ParentBased{root:AlwaysOnSampler"),
    ],
)
def test_samplers(sampler: str, arg: str | None, description: str) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": sampler}
    if arg is not None:
        env["OTEL_TRACES_SAMPLER_ARG"] = arg
    configured = settings(**env)
    assert configured is not None
    assert configured.build_sampler().get_description().startswith(description)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "2",
            },
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "soon"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
    ],
)
def test_unusable_values_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(TracingError, match=variable):
        settings(**env)


def test_a_malformed_headers_variable_never_echoes_its_value() -> None:
    with pytest.raises(TracingError, match="OTEL_EXPORTER_OTLP_HEADERS") as raised:
        settings(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_HEADERS="Bearer sk-very-secret")
    assert "sk-very-secret" not in str(raised.value)


def test_tracing_observes_the_one_request_path_when_it_is_on(tmp_path: Path) -> None:
    (tmp_path / "regions.yaml").write_text("nodes: []\n")
    (tmp_path / "policies").mkdir()
    config = gateway_config(base_dir=tmp_path)
    plain = build_gateway(config, env={})
    assert type(plain.pipeline) is RequestPipeline and plain.tracing is None
    assert not isinstance(plain.pipeline._observer, Observers)  # metrics alone
    traced = build_gateway(config, env={"OTEL_TRACES_EXPORTER": "console"})
    assert traced.tracing is not None
    try:
        # No subclass: the same pipeline, with tracing among its observers.
        assert type(traced.pipeline) is RequestPipeline
        assert isinstance(traced.pipeline._observer, Observers)
    finally:
        traced.tracing.shutdown()

"""Dashboards, alert rules and the KEDA trigger read only metrics the code exports, so a renamed
metric breaks this test instead of a dashboard at 3 a.m.

What "exported" means: the families in a built gateway's registry (with every optional part on: a
Consul directory, a Redis quota store, a commercial provider, so their metrics are registered
too) and in a started node's /metrics, plus the series Prometheus adds itself (`up`) and the
recording rules the PrometheusRule defines. The GPU kit (deploy/k8s/gpu-monitoring) and the
pod alerts also read other exporters' documented names: NVIDIA dcgm-exporter's fields that the
kit's counters.csv has it collect, and kube-state-metrics' pod series (tests/deploy/schemas).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import build_gateway
from gateway.config import config_from_dict
from tests.deploy.conftest import (
    DEPLOY,
    NODE_TOKEN,
    StartedNode,
    dcgm_collected,
    documented_names,
    find,
    render,
)
from tests.deploy.promql import SYNTHETIC, UnknownFunction, exported_series, grafana_query, metric_names
from tests.support.processes import REPO_ROOT

DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
GPU_KIT = DEPLOY / "k8s" / "gpu-monitoring"
# Other exporters' names: dcgm-exporter's fields the GPU kit collects (and NVIDIA documents), and
# kube-state-metrics' pod series.
EXTERNAL = dcgm_collected() | documented_names("kube-state-metrics-series.txt")


@pytest.fixture(scope="module")
def gateway_series() -> set[str]:
    config = config_from_dict(
        {
            "home_region": "eu-west",
            "policies": str(REPO_ROOT / "policies"),
            "catalog": [{"name": "meridian-small", "tier": "small"}],
            "directory": {"type": "consul", "address": "127.0.0.1:1"},
            "quota": {"redis_url": "redis://127.0.0.1:1/0"},
            "providers": {
                "endpoints": [
                    {
                        "id": "openai-us",
                        "kind": "openai",
                        "base_url": "https://api.openai.com/v1",
                        "api_key_env": "OPENAI_API_KEY",
                        "region": "us-east",
                        "jurisdiction": "us",
                        "serve_as": "fallback",
                        "models": {"meridian-small": "gpt-4o-mini"},
                    }
                ]
            },
        }
    )
    # Built, not started: every metric is registered when the parts are built, and starting would
    # need a Consul and a Redis.
    gateway = build_gateway(config, env={"OPENAI_API_KEY": "unused", "MERIDIAN_NODE_TOKEN": "unused"})
    return exported_series(gateway.metrics.registry.collect())


@pytest.fixture(scope="module")
def node_series(started_node: StartedNode) -> set[str]:
    response = httpx.get(
        f"{started_node.url}/metrics", headers={"authorization": f"Bearer {NODE_TOKEN}"}, timeout=10
    )
    response.raise_for_status()
    return exported_series(text_string_to_metric_families(response.text))


def dashboard_expressions(path: Path) -> list[tuple[str, str]]:
    board = json.loads(path.read_text(encoding="utf-8"))
    found: list[tuple[str, str]] = []

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            panels(panel.get("panels", []))
            for target in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']}", target["expr"]))

    panels(board["panels"])
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            found.append((f"{path.name}: variable {variable['name']}", grafana_query(query)))
    return found


def rule_expressions(objects: list[dict[str, Any]]) -> tuple[list[tuple[str, str]], set[str]]:
    rules = find(objects, "PrometheusRule", "meridian")
    found, recorded = [], set()
    for group in rules["spec"]["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            found.append((f"PrometheusRule {group['name']}/{name}", str(rule["expr"])))
            if "record" in rule:
                recorded.add(rule["record"])
    scaled = find(objects, "ScaledObject", "meridian-node")
    for trigger in scaled["spec"]["triggers"]:
        if trigger["type"] == "prometheus":
            found.append(("ScaledObject meridian-node", trigger["metadata"]["query"]))
    return found, recorded


def unknown_names(expressions: list[tuple[str, str]], known: set[str]) -> list[str]:
    return [
        f"{where}: {sorted(names - known)} in {expr!r}"
        for where, expr in expressions
        if (names := metric_names(expr)) - known
    ]


def test_dashboards_name_only_exported_metrics(gateway_series: set[str], node_series: set[str]) -> None:
    assert DASHBOARDS, "no dashboards in deploy/grafana"
    expressions = [expr for path in DASHBOARDS for expr in dashboard_expressions(path)]
    assert len(expressions) > 20
    assert unknown_names(expressions, gateway_series | node_series | SYNTHETIC | EXTERNAL) == []


def test_alert_rules_and_keda_trigger_name_only_exported_metrics(
    rendered: dict[str, list[dict[str, Any]]], gateway_series: set[str], node_series: set[str]
) -> None:
    for region, objects in rendered.items():
        expressions, recorded = rule_expressions(objects)
        known = gateway_series | node_series | SYNTHETIC | recorded | EXTERNAL
        assert unknown_names(expressions, known) == [], region


def test_gpu_alerts_name_only_dcgm_fields_it_collects_and_meridian_metrics(node_series: set[str]) -> None:
    rules = find(render(GPU_KIT), "PrometheusRule", "meridian-gpu")
    expressions = [
        (f"PrometheusRule {group['name']}/{rule['alert']}", str(rule["expr"]))
        for group in rules["spec"]["groups"]
        for rule in group["rules"]
    ]
    assert {"MeridianGPUXidError", "MeridianGPUUnderused", "MeridianGPUSaturated"} <= {
        where.rpartition("/")[2] for where, _ in expressions
    }
    assert unknown_names(expressions, node_series | SYNTHETIC | dcgm_collected()) == []
    # What a field the kit does not collect looks like: caught, not silently empty.
    assert unknown_names([("rule", "DCGM_FI_DEV_ENC_UTIL > 0")], node_series | dcgm_collected())


def test_a_renamed_metric_is_caught(gateway_series: set[str], node_series: set[str]) -> None:
    # What a dashboard written against an older name, or with a typo, looks like.
    stale = [
        ("panel", 'sum by (tenant) (rate(meridian_gateway_request_total{status="429"}[5m]))'),
        ("panel", "max(meridian_node_kv_cache_usage)"),
    ]
    problems = unknown_names(stale, gateway_series | node_series)
    assert len(problems) == 2
    assert "meridian_gateway_request_total" in problems[0]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (namespace) (rate(meridian_gateway_requests_total{status=~"5..|stream_error"}[5m]))',
            {"meridian_gateway_requests_total"},
        ),
        (
            'histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket{ns=~"$namespace"}[$__rate_interval])))',
            {"x_seconds_bucket"},
        ),
        (
            'max by (node_id) (ready) == 0 and on (node_id) label_replace(up{job="n"} == 1, "node_id", "$1", "pod", "(.*)")',
            {"ready", "up"},
        ),
        (
            "meridian:errors:ratio_rate1h > (14.4 * 0.001) and errors_rate5m offset 1d > 1e3",
            {
                "meridian:errors:ratio_rate1h",
                "errors_rate5m",
            },
        ),
        ("sum(a) / count without (pod) (b_total)", {"a", "b_total"}),
    ],
)
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_unknown_function_is_an_error_not_a_pass() -> None:
    with pytest.raises(UnknownFunction, match="rat"):
        metric_names("sum(rat(meridian_gateway_requests_total[5m]))")


def test_grafana_label_values_queries_read_their_series() -> None:
    assert metric_names(
        grafana_query('label_values(meridian_node_waiting_tokens{namespace="x"}, model)')
    ) == {"meridian_node_waiting_tokens"}

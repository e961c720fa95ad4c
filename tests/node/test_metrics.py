"""NodeMetrics on its own: series stay bounded whatever clients put in tenant hints."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from regional_node.server.metrics import MAX_TENANT_SERIES, NodeMetrics


def test_tenant_series_stay_bounded_however_many_users_call() -> None:
    metrics = NodeMetrics(lambda: {})
    for user in range(MAX_TENANT_SERIES * 5):
        metrics.observe_tokens("tiny", f"end-user-{user}", 3, 2)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    tenants = {s.labels["tenant"] for s in families["meridian_node_prompt_tokens"].samples}
    assert len(tenants) <= MAX_TENANT_SERIES + 1
    total = sum(s.value for s in families["meridian_node_prompt_tokens"].samples if s.name.endswith("_total"))
    assert total == 3 * MAX_TENANT_SERIES * 5

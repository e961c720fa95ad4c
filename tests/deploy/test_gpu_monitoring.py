"""deploy/k8s/gpu-monitoring: NVIDIA's dcgm-exporter on every GPU machine, scraped by Prometheus,
collecting only fields NVIDIA documents; it renders and validates on its own (issue 34)."""

from __future__ import annotations

from tests.deploy.conftest import DEPLOY, dcgm_collected, documented_names, find, render
from tests.deploy.test_manifests import validate

GPU_KIT = DEPLOY / "k8s" / "gpu-monitoring"


def test_the_kit_renders_and_every_object_validates() -> None:
    objects = render(GPU_KIT)
    for obj in objects:
        validate(obj)
    kinds = {obj["kind"] for obj in objects}
    assert {"DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Namespace"} <= kinds


def test_the_exporter_runs_on_gpu_machines_with_the_kits_counters() -> None:
    objects = render(GPU_KIT)
    daemonset = find(objects, "DaemonSet", "dcgm-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = pod["containers"]
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "nvcr.io/nvidia/k8s/dcgm-exporter" and tag and tag != "latest"
    assert "--collectors=/etc/dcgm-exporter/counters.csv" in container["args"]
    # It never requests a GPU, so it never takes one from a Meridian node.
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    counters = next(v for v in pod["volumes"] if v["name"] == "counters")["configMap"]["name"]
    assert find(objects, "ConfigMap", counters)["data"]["counters.csv"]
    monitor = find(objects, "ServiceMonitor", "dcgm-exporter")
    service = find(objects, "Service", "dcgm-exporter")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_the_exporter_collects_only_documented_fields() -> None:
    collected = dcgm_collected()
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"} <= collected
    assert collected <= documented_names("dcgm-exporter-fields.txt")


def test_region_namespaces_stay_restricted_only_the_gpu_kit_is_privileged() -> None:
    namespace = find(render(GPU_KIT), "Namespace", "meridian-gpu-monitoring")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

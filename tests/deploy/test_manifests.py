"""deploy/k8s: every overlay renders, every object validates against its API schema, pods meet
the restricted Pod Security Standard, and the config files in the ConfigMaps pass the real
gateway and node config validation.

Schemas: core kinds through `kubernetes-validate` (it ships the Kubernetes OpenAPI schemas, strict
variants reject unknown fields), for the oldest and the newest Kubernetes it knows of that we
support. KEDA's and the Prometheus Operator's kinds through the JSON schemas in schemas/, written
from their CRDs for the fields the kit uses (their sources are in each schema's $comment).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml

from gateway.app import build_gateway
from gateway.config import config_from_dict
from gateway.discovery import ConsulRegionDirectory
from gateway.ledger.config import PostgresStoreConfig
from regional_node.cli import build_parser as node_parser
from regional_node.server.config import convert_config
from tests.deploy.conftest import DEPLOY, OVERLAYS, REGIONS, find, render

KUBERNETES_VERSIONS = ("1.30", "1.37")
SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_prometheusrule.json",
}
# The Secrets the kit reads; the platform team creates them (deploy/README.md, "Secrets").
SECRETS = {
    "meridian-node-token": {"token"},
    "meridian-redis": {"password"},
    "meridian-consul-token": {"gateway", "node"},
    "meridian-ledger": {"dsn"},
}
# Volume types the restricted Pod Security Standard allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def validate(obj: dict[str, Any]) -> None:
    """Raise if `obj` does not validate against its kind's schema (and if there is none)."""
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is not None:
        schema = json.loads((SCHEMAS / crd).read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator(schema).validate(obj)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objects if o["kind"] == "Deployment"
    ]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def configmap_file(objects: list[dict[str, Any]], name: str, key: str) -> str:
    return find(objects, "ConfigMap", name)["data"][key]


@pytest.mark.parametrize("region", REGIONS)
def test_every_rendered_object_validates_against_its_schema(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    kinds = set()
    for obj in rendered[region]:
        validate(obj)  # SchemaNotFoundError for a kind nobody checks: that fails too
        kinds.add(obj["kind"])
    assert {"Deployment", "ScaledObject", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"} <= kinds


def test_base_renders_and_validates_on_its_own() -> None:
    for obj in render(DEPLOY / "k8s" / "base"):
        validate(obj)


@pytest.mark.parametrize(
    ("kind", "name", "break_it"),
    [
        # A field in the wrong place and a wrong type, in a core kind.
        (
            "Deployment",
            "meridian-node",
            lambda o: o["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}),
        ),
        (
            "Deployment",
            "meridian-gateway",
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="8080"),
        ),
        ("HorizontalPodAutoscaler", "meridian-gateway", lambda o: o["spec"].pop("maxReplicas")),
        # And in each custom resource.
        ("ScaledObject", "meridian-node", lambda o: o["spec"].update(minReplicaCount=-1)),
        ("ScaledObject", "meridian-node", lambda o: o["spec"]["triggers"][0]["metadata"].pop("threshold")),
        ("ServiceMonitor", "meridian-node", lambda o: o["spec"]["endpoints"][0].update(intervall="15s")),
        (
            "PrometheusRule",
            "meridian",
            lambda o: o["spec"]["groups"][0]["rules"][0].update({"for": "5 minutes"}),
        ),
    ],
)
def test_a_broken_manifest_fails_validation(
    rendered: dict[str, list[dict[str, Any]]], kind: str, name: str, break_it: Any
) -> None:
    obj = copy.deepcopy(find(rendered[REGIONS[0]], kind, name))
    validate(obj)
    break_it(obj)
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


@pytest.mark.parametrize("region", REGIONS)
def test_pods_meet_the_restricted_pod_security_standard(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    namespace = find(rendered[region], "Namespace", f"meridian-{region}")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, pod in pods(rendered[region]):
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")), name
        assert pod["automountServiceAccountToken"] is False, name
        for volume in pod["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, f"{name}: volume {volume}"
        for container in containers(pod):
            context = container["securityContext"]
            where = f"{name}/{container['name']}"
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"], where
            assert context["readOnlyRootFilesystem"] is True, where
            assert not context.get("privileged"), where


@pytest.mark.parametrize("region", REGIONS)
def test_no_secret_is_in_the_repo_only_references_to_documented_ones(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    objects = rendered[region]
    assert not [o for o in objects if o["kind"] == "Secret"]
    references = set()
    for _, pod in pods(objects):
        for container in containers(pod):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    references.add((ref["name"], ref["key"]))
    credentials = find(objects, "ServiceMonitor", "meridian-node")["spec"]["endpoints"][0]["authorization"]
    references.add((credentials["credentials"]["name"], credentials["credentials"]["key"]))
    assert references == {(name, key) for name, keys in SECRETS.items() for key in keys}
    gateway = yaml.safe_load(configmap_file(objects, "meridian-gateway-config", "gateway.yaml"))
    assert urlsplit(gateway["quota"]["redis_url"]).password == "${REDIS_PASSWORD}"


@pytest.mark.parametrize("region", REGIONS)
def test_images_are_pinned_tags(rendered: dict[str, list[dict[str, Any]]], region: str) -> None:
    for name, pod in pods(rendered[region]):
        for container in containers(pod):
            image = container["image"]
            repository, _, tag = image.rpartition(":")
            assert "@sha256:" in image or (repository and "/" not in tag and tag != "latest"), (
                f"{name}: {image}"
            )


@pytest.mark.parametrize("region", REGIONS)
def test_gateway_config_is_rendered_with_the_redis_password_and_builds_a_gateway(
    rendered: dict[str, list[dict[str, Any]]], region: str, tmp_path: Path
) -> None:
    objects = rendered[region]
    pod = find(objects, "Deployment", "meridian-gateway")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    template = tmp_path / "template.yaml"
    template.write_text(configmap_file(objects, "meridian-gateway-config", "gateway.yaml"), encoding="utf-8")
    target = tmp_path / "gateway.yaml"
    # The init container's own command, with its two paths pointed here.
    command = [sys.executable, *init["command"][1:-2], str(template), str(target)]
    password = "p@ss:w/rd%"
    subprocess.run(command, env={"REDIS_PASSWORD": password}, check=True, timeout=30)
    args = pod["containers"][0]["args"]
    assert args[args.index("--config") + 1] == init["command"][-1]

    config = config_from_dict(yaml.safe_load(target.read_text(encoding="utf-8")), source=str(target))
    assert config.home_region == region
    assert (
        config.quota.redis_url is not None
        and unquote(urlsplit(config.quota.redis_url).password or "") == password
    )
    # With the rendered tenant policies in place of the mounted ConfigMap: the gateway builds
    # (policies load and validate, the Consul directory, the Redis quota store and the PostgreSQL
    # ledger are built; nothing connects yet).
    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in find(objects, "ConfigMap", "meridian-policies")["data"].items():
        (policies / name).write_text(text, encoding="utf-8")
    gateway = build_gateway(
        msgspec.structs.replace(config, policies=str(policies)),
        env={"MERIDIAN_NODE_TOKEN": "t", "MERIDIAN_LEDGER_DSN": "postgresql://ledger.invalid/meridian"},
    )
    assert isinstance(gateway.directory, ConsulRegionDirectory)
    assert isinstance(config.ledger.store, PostgresStoreConfig) and gateway.ledger is not None
    assert {tenant.tenant_id for tenant in gateway.policies.current()} >= {"acme-eu", "initech-us"}


@pytest.mark.parametrize("region", REGIONS)
def test_node_config_and_flags_pass_the_node_validation(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    objects = rendered[region]
    pod = find(objects, "Deployment", "meridian-node")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:2] == ["meridian", "node"]
    flags = node_parser().parse_args(container["args"][2:])  # a flag the node lacks exits here
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(flags.config).parent == Path(mounts["config"])
    text = configmap_file(objects, "meridian-node-config", Path(flags.config).name)
    config = convert_config(yaml.safe_load(text), source=f"{region}/node.yaml")

    assert config.region == region
    assert config.consul is not None
    assert config.port == container["ports"][0]["containerPort"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MERIDIAN_NODE_URL"] == f"http://$(POD_IP):{config.port}"
    assert all(Path(model.path).is_relative_to(mounts["models"]) for model in config.models)
    assert {model.engine.device for model in config.models} == {"cuda"}
    # Every model the nodes serve is in the gateway's catalog, in the same tier.
    gateway = yaml.safe_load(configmap_file(objects, "meridian-gateway-config", "gateway.yaml"))
    catalog = {entry["name"]: entry["tier"] for entry in gateway["catalog"]}
    assert {model.name: model.tier for model in config.models}.items() <= catalog.items()


@pytest.mark.parametrize("region", REGIONS)
def test_region_settings_point_at_the_overlays_own_namespace(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    objects = rendered[region]
    namespace = f"meridian-{region}"
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {namespace}
    query = find(objects, "ScaledObject", "meridian-node")["spec"]["triggers"][0]["metadata"]["query"]
    assert f'namespace="{namespace}"' in query


@pytest.mark.parametrize("region", REGIONS)
def test_nodes_accept_traffic_only_from_gateways_and_prometheus(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    objects = rendered[region]
    deny = find(objects, "NetworkPolicy", "meridian-default-deny-ingress")["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    policy = find(objects, "NetworkPolicy", "meridian-node")["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "node"
    peers = [peer for rule in policy["ingress"] for peer in rule["from"]]
    components = [peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component") for peer in peers]
    assert components == ["gateway", None]  # the second: Prometheus's own pods
    assert peers[1]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"
    assert all("ipBlock" not in peer for peer in peers)


@pytest.mark.parametrize("region", REGIONS)
def test_node_pods_hold_a_gpu_and_drain_before_they_stop(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    deployment = find(rendered[region], "Deployment", "meridian-node")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    drain_timeout = float(drain[drain.index("--timeout-s") + 1])
    assert pod["terminationGracePeriodSeconds"] > drain_timeout
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # model loading
    assert container["readinessProbe"]["exec"]["command"][-1] == "ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_a_canary_node_set_runs_beside_the_stable_one(tmp_path: Path) -> None:
    """deploy/README.md's canary recipe, followed: a copy of the node Deployment with
    `track: canary` and its own node config, added to a copy of the eu-west overlay."""
    overlay = tmp_path / "eu-west"
    shutil.copytree(OVERLAYS / "eu-west", overlay)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text(encoding="utf-8"))
    # kustomize takes only relative paths to other kustomizations.
    kustomization["resources"] = [os.path.relpath(DEPLOY / "k8s" / "base", overlay), "node-canary.yaml"]
    kustomization["configMapGenerator"].append(
        {"name": "meridian-node-config-canary", "files": ["node.yaml=config/node-canary.yaml"]}
    )
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    canary = yaml.safe_load(
        (DEPLOY / "k8s" / "base" / "node" / "deployment.yaml").read_text(encoding="utf-8")
    )
    canary["metadata"]["name"] = "meridian-node-canary"
    canary["spec"]["replicas"] = 1
    canary["spec"]["selector"]["matchLabels"]["meridian.io/track"] = "canary"
    canary["spec"]["template"]["metadata"]["labels"]["meridian.io/track"] = "canary"
    (config_volume,) = [v for v in canary["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    config_volume["configMap"]["name"] = "meridian-node-config-canary"
    (overlay / "node-canary.yaml").write_text(yaml.safe_dump(canary), encoding="utf-8")
    node_config = yaml.safe_load((overlay / "config" / "node.yaml").read_text(encoding="utf-8"))
    node_config["models"][0]["path"] = "/models/meridian-small-v2"  # the new weights, same model name
    (overlay / "config" / "node-canary.yaml").write_text(yaml.safe_dump(node_config), encoding="utf-8")

    objects = render(overlay)
    for obj in objects:
        validate(obj)
    stable, canary = (
        find(objects, "Deployment", "meridian-node"),
        find(objects, "Deployment", "meridian-node-canary"),
    )
    stable_pod, canary_pod = (d["spec"]["template"] for d in (stable, canary))
    # Neither Deployment's selector matches the other's pods, or the two would fight over them.
    for deployment, other_pod in ((stable, canary_pod), (canary, stable_pod)):
        assert (
            not deployment["spec"]["selector"]["matchLabels"].items()
            <= other_pod["metadata"]["labels"].items()
        )
    assert canary_pod["spec"]["containers"][0]["image"] == stable_pod["spec"]["containers"][0]["image"]
    canary_config = find(objects, "ConfigMap", "meridian-node-config-canary")
    assert canary_pod["spec"]["volumes"][0]["configMap"]["name"] == canary_config["metadata"]["name"]
    assert convert_config(yaml.safe_load(canary_config["data"]["node.yaml"]), source="canary").models
    # Scraped, protected and disrupted like the stable nodes; scaled only through its own count.
    labels = canary_pod["metadata"]["labels"]
    for kind, name in (("Service", "meridian-node"), ("PodDisruptionBudget", "meridian-node")):
        selector = find(objects, kind, name)["spec"]["selector"]
        assert (selector.get("matchLabels", selector)).items() <= labels.items(), kind
    policy = find(objects, "NetworkPolicy", "meridian-node")["spec"]["podSelector"]["matchLabels"]
    assert policy.items() <= labels.items()
    assert find(objects, "ScaledObject", "meridian-node")["spec"]["scaleTargetRef"]["name"] == "meridian-node"


@pytest.mark.parametrize("region", REGIONS)
def test_gateway_metrics_are_scraped_on_the_admin_port_that_only_prometheus_reaches(
    rendered: dict[str, list[dict[str, Any]]], region: str
) -> None:
    """Issue 32: /metrics names every tenant, so it is served on the admin listener, not the
    public port. The config's `admin:` port is the container's `admin` port, the Service exposes
    it by that name, the ServiceMonitor scrapes it, and only Prometheus may connect to it."""
    objects = rendered[region]
    gateway = config_from_dict(
        yaml.safe_load(configmap_file(objects, "meridian-gateway-config", "gateway.yaml")),
        source="gateway.yaml",
    )
    pod = find(objects, "Deployment", "meridian-gateway")["spec"]["template"]["spec"]
    (container,) = (c for c in pod["containers"] if c["name"] == "gateway")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["admin"] == gateway.admin.port and ports["http"] == gateway.listen.port
    assert gateway.admin.port != gateway.listen.port and gateway.admin.host == "0.0.0.0"
    service_ports = {port["name"] for port in find(objects, "Service", "meridian-gateway")["spec"]["ports"]}
    assert service_ports == {"http", "admin"}
    (endpoint,) = find(objects, "ServiceMonitor", "meridian-gateway")["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    rules = find(objects, "NetworkPolicy", "meridian-gateway")["spec"]["ingress"]
    admitted = {port["port"]: rule.get("from") for rule in rules for port in rule["ports"]}
    assert admitted["http"] is None  # clients, from anywhere
    (peer,) = admitted["admin"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"

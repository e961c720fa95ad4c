"""What `meridian up` runs: which nodes, in which regions, serving which checkpoints, on which ports.

Pure data plus the files derived from it (the static regions file and the gateway config), so the
layout can be read (and tested) without starting anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from meridian.federation.process_group import free_port
from regional_node.cpu_share import available_cpus, format_cpu_list, split_engine_cpus


@dataclass(frozen=True)
class ModelSpec:
    name: str
    tier: Literal["small", "large"]
    size: str  # regional_node.checkpoints size name
    arch: str = "llama"
    train_steps: int = 0  # `meridian model init --train --steps N`; 0: random weights


# Sizes that keep a two-node federation responsive on a 2-core laptop and train, side by side,
# in about a minute on two idle cores (regional_node/checkpoints/README.md, "Training"): "tiny"
# (0.35M parameters) and "mini" (1.3M, four layers), which reaches a lower held-out loss.
# The two share a tokenizer (regional_node.checkpoints trains one from the corpus for every size),
# so meridian-small could draft for meridian-large (`speculative: {method: draft, draft_model:
# meridian-small}` under the large model's `engine:` in a node config; regional_node/engine/README.md,
# "Draft model"). It is not wired here on purpose: on CPU a `tiny` step costs a third to two
# thirds of a `mini` step and the trained pair agrees on 20-45% of drafted tokens, far below the
# break-even acceptance (~0.85 at k=4), so drafting made meridian-large decode slower (0.5-0.74x
# at batch 1-4, benchmarks/results/speculative-draft.json).
MODELS = (
    ModelSpec("meridian-small", "small", "tiny", train_steps=300),
    ModelSpec("meridian-large", "large", "mini", train_steps=200),
)
# Bumped whenever regional_node/checkpoints/train.py changes what a given plan produces, so
# cached checkpoints under the state dir are retrained rather than reused.
TRAINING_REVISION = 1


def corpus_digest() -> str:
    """The training text's hash (the tokenizer's corpus and the extra prose), read without
    importing the checkpoint package (and torch): `meridian up` runs the gateway in this process,
    which never loads torch."""
    spec = importlib.util.find_spec("regional_node")
    assert spec is not None and spec.origin is not None, "regional_node is not installed"
    folder = Path(spec.origin).parent / "checkpoints"
    digest = hashlib.sha256()
    for name in ("corpus.txt", "corpus_extra.txt"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:12]


# (region, jurisdiction): two jurisdictions, so residency can be seen at work.
REGIONS = (("us-east", "us"), ("eu-west", "eu"))


# Overload (gateway/README.md, "Overload"): the gateway's defaults, which follow the design's
# interactive SLO (time to first token under 1 s at p90): admit while the estimate is within
# 0.5 s, wait in the gateway at most 0.1 s for that. Each node refuses on its own past the SLO itself
# (what slips past the gateway between two probes, or comes from elsewhere).
NODE_INTERACTIVE_MAX_WAIT_S = 1.0


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    region: str
    jurisdiction: str
    host: str
    port: int
    # The cores this node's engines compute on (its `--engine-cpus`); empty: the node's default.
    engine_cpus: frozenset[int] = frozenset()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class FederationPlan:
    state_dir: Path
    host: str
    port: int
    policies: Path
    nodes: tuple[NodeSpec, ...]
    models: tuple[ModelSpec, ...] = MODELS
    trained: bool = True  # False: random checkpoints (`--checkpoints random`, tests)
    # The gateway's admin listener (/metrics: every tenant's tokens and cost), on loopback only.
    admin_port: int = 9464

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def regions_file(self) -> Path:
        return self.state_dir / "regions.yaml"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "gateway.yaml"

    @property
    def ledger_file(self) -> Path:
        return self.state_dir / "ledger.sqlite"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def run_file(self) -> Path:
        """The running federation's node processes, for drills (loadtests/failover_drill.py)."""
        return self.state_dir / "run.json"

    def checkpoint_dir(self, model: ModelSpec) -> Path:
        """Random checkpoints by name; trained ones by everything that decides their weights
        (size, steps, corpus, training code), so a rerun finds them and a changed corpus retrains."""
        if not self.trained or model.train_steps == 0:
            return self.state_dir / "models" / model.name
        key = f"{model.arch}-{model.size}-{model.train_steps}steps-{corpus_digest()}-r{TRAINING_REVISION}"
        return self.state_dir / "models" / f"{model.name}-{key}"

    def init_command(self, model: ModelSpec, out_dir: Path) -> list[str]:
        command = [sys.executable, "-m", "meridian.cli", "model", "init", str(out_dir)]
        command += ["--arch", model.arch, "--size", model.size, "--force"]
        if self.trained and model.train_steps:
            command += ["--train", "--steps", str(model.train_steps)]
        return command

    def node_command(self, node: NodeSpec) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "meridian.cli",
            "node",
            "--host",
            node.host,
            "--port",
            str(node.port),
        ]
        command += ["--node-id", node.node_id, "--region", node.region, "--jurisdiction", node.jurisdiction]
        for model in self.models:
            command += ["--model", f"{model.name}={self.checkpoint_dir(model)}:{model.tier}"]
        if node.engine_cpus:
            # Each node's engines on cores of their own, nicer than its API (the node's default
            # engine_nice); with more cores than nodes, the last is left to the gateway and APIs.
            command += ["--engine-cpus", format_cpu_list(node.engine_cpus)]
        # The node's hard bound on interactive time to first token (regional_node/engine/admission.py):
        # past it a request is refused (503 overloaded) instead of slowing every stream it joins.
        command += ["--interactive-max-wait-s", str(NODE_INTERACTIVE_MAX_WAIT_S)]
        return command

    def regions(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "node_id": node.node_id,
                    "url": node.url,
                    "region": node.region,
                    "jurisdiction": node.jurisdiction,
                    "models": [model.name for model in self.models],
                }
                for node in self.nodes
            ]
        }

    def gateway_config(self) -> dict[str, Any]:
        return {
            "home_region": self.nodes[0].region,
            "listen": {"host": self.host, "port": self.port},
            "admin": {"host": "127.0.0.1", "port": self.admin_port},
            "policies": str(self.policies),
            "catalog": [{"name": model.name, "tier": model.tier} for model in self.models],
            "directory": {"type": "static", "file": str(self.regions_file)},
            # Embedded defaults: an in-process quota store, no commercial providers, and the usage
            # ledger in a SQLite file beside this config, written by a task in the gateway.
            "quota": {},
            "ledger": {
                "worker": "embedded",
                "store": {"type": "sqlite", "path": str(self.ledger_file.resolve())},
            },
            # The Files and Batches APIs: batch state in the ledger's SQLite file, files beside it.
            "batches": {
                "enabled": True,
                "storage_dir": str((self.state_dir / "batch-files").resolve()),
                # A local federation's callback receivers run on this machine.
                "callback_allowed_networks": ["127.0.0.0/8", "::1/128"],
            },
            "node_auth": {"token_env": "MERIDIAN_NODE_TOKEN"},
            # CPU nodes can take a while for a first token when both tiers are busy.
            "timeouts": {"stream_idle_s": 60.0, "read_s": 300.0},
            # The gateway's default targets (the design's SLOs); a smaller interactive queue, for
            # a federation of two CPU nodes.
            "admission": {"interactive": {"target_ttft_s": 0.5, "queue_deadline_s": 0.1, "max_queue": 64}},
        }

    def write_files(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        header = "# Generated by `meridian up` on every start; edits are overwritten.\n"
        self.regions_file.write_text(
            header + yaml.safe_dump(self.regions(), sort_keys=False), encoding="utf-8"
        )
        self.config_file.write_text(
            header + yaml.safe_dump(self.gateway_config(), sort_keys=False), encoding="utf-8"
        )


def plan_federation(
    *,
    state_dir: Path,
    host: str,
    port: int,
    policies: Path,
    pick_port: Callable[[], int] = free_port,
    trained: bool = True,
    cpus: frozenset[int] | None = None,
    admin_port: int = 9464,
) -> FederationPlan:
    """`cpus`: the machine's cores (default: those this process may use), shared out as the
    nodes' engine cores by regional_node/cpu_share.py's split_engine_cpus."""
    engine_cpus = split_engine_cpus(available_cpus() if cpus is None else cpus, len(REGIONS))
    nodes = tuple(
        NodeSpec(
            node_id=f"{region}-1",
            region=region,
            jurisdiction=jurisdiction,
            host="127.0.0.1",
            port=pick_port(),
            engine_cpus=share,
        )
        for (region, jurisdiction), share in zip(REGIONS, engine_cpus, strict=True)
    )
    return FederationPlan(
        state_dir=state_dir,
        host=host,
        port=port,
        policies=policies,
        nodes=nodes,
        trained=trained,
        admin_port=admin_port,
    )

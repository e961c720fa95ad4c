"""`meridian up` shares the machine out: each node's engines compute on cores of their own, and
where there are more cores than nodes the last is left to the gateway (this process) and the
nodes' APIs."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.federation.plan import plan_federation


def _engine_cpus(command: list[str]) -> str | None:
    return command[command.index("--engine-cpus") + 1] if "--engine-cpus" in command else None


@pytest.mark.parametrize(
    ("cores", "expected"),
    [(range(2), ["0", "1"]), (range(4), ["0-1", "2"]), (range(16), ["0-7", "8-14"])],
)
def test_each_node_gets_engine_cores_of_its_own(tmp_path: Path, cores: range, expected: list[str]) -> None:
    plan = plan_federation(
        state_dir=tmp_path, host="127.0.0.1", port=8080, policies=tmp_path, cpus=frozenset(cores)
    )
    assert [_engine_cpus(plan.node_command(node)) for node in plan.nodes] == expected

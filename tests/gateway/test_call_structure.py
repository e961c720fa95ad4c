"""The request path's structure, as issue 31 set it: read from the source, so that a change that
brings back an old knot fails here and not in review.

- tracing and metrics observe the call (gateway/observe.py): nothing subclasses the pipeline, no
  context variable carries a span, and the call package counts nothing itself;
- the call's decisions are values a stage returns (RequestPlan.route_notes), not a string on the
  call context edited by several stages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.call.context import CallContext

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def _modules(folder: Path) -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(folder.rglob("*.py"))]


def test_nothing_subclasses_the_pipeline_and_no_context_variable_carries_a_span() -> None:
    for path, tree in _modules(GATEWAY):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                assert not bases & {"RequestPipeline", "Forwarder"}, f"{path}: {node.name} subclasses {bases}"
            if isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                assert name != "ContextVar", f"{path}:{node.lineno}: a ContextVar on the request path"


# rollouts.py is the rollout plans' watcher (reloaded from the config file on its own timer), whose
# drift gauge is about the config, not about a call.
CALL_PATH = sorted(p for p in (GATEWAY / "call").glob("*.py") if p.name != "rollouts.py")


@pytest.mark.parametrize("path", CALL_PATH, ids=lambda p: p.name)
def test_the_call_package_reports_to_its_observer_and_counts_nothing_itself(path: Path) -> None:
    """Metrics are an observer (gateway/metrics.py `_CallMetrics`): the call package tells the
    call's observer what happened and never reaches for a Prometheus metric."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"labelled", "labels", "inc", "observe"}:
            pytest.fail(f"{path.name}:{node.lineno}: `{ast.unparse(node)}` counts on the request path")


def test_route_decisions_are_plan_values_not_a_string_stages_edit() -> None:
    assert "route_prefix" not in CallContext.__dataclass_fields__
    pipeline = (GATEWAY / "call" / "pipeline.py").read_text()
    for node in ast.walk(ast.parse(pipeline)):
        if isinstance(node, ast.AugAssign):
            target = ast.unparse(node.target)
            assert not target.startswith("ctx."), f"pipeline.py:{node.lineno}: `{target} +=` edits the call"

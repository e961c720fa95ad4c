"""The request path's structure, as issue 31 set it: read from the source, so that a change that
brings back an old knot fails here and not in review.

- tracing and metrics observe the call (gateway/observe.py): nothing subclasses the pipeline, no
  context variable carries a span, and the call package counts nothing itself;
- the call's decisions are values a stage returns (RequestPlan.route_notes), not a string on the
  call context edited by several stages;
- the call context keeps only what the edge needs when a stage raises part-way; how a call ended
  (usage, finish reasons, a stream's error) is a value (`Outcome`) the ending stage hands on.
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


# The call context's fields a stage may set (each once, by the stage that learns it), and where.
# Everything else on it is fixed when the call starts, or is the answer's headers.
SET_ONCE = {
    ("call/pipeline.py", "tenant"),  # authentication
    ("call/pipeline.py", "api_key_id"),
    ("batches/runner.py", "tenant"),  # a batch line is the batch's tenant, at batch priority
    ("batches/runner.py", "api_key_id"),
    ("call/pipeline.py", "safety"),  # the content checks begin
    ("call/context.py", "served"),  # the failover's answer (`served_by`)
    ("call/pipeline.py", "escalation"),  # the cascade: small-tier tokens charged however it ends
    ("call/pipeline.py", "recorded"),  # the observers were told it ended
}


def test_the_call_context_keeps_what_the_edge_needs_and_each_stage_sets_its_own_field_once() -> None:
    assert set(CallContext.__dataclass_fields__) == {
        "request_id", "client_region", "session_key", "started", "observed", "latency", "headers",
        *{field for _, field in SET_ONCE},
    }  # fmt: skip
    written = [
        (str(path.relative_to(GATEWAY)), attr)
        for path, tree in _modules(GATEWAY)
        for owner, attr in _attributes_assigned(tree)
        if attr in CallContext.__dataclass_fields__
        and (owner in {"ctx", "call"} or (owner == "self" and path.name == "context.py"))
    ]
    assert sorted(set(written)) == sorted(SET_ONCE)
    # Once: one assignment per field and file (the batches runner's authentication is its own).
    assert len(written) == len(set(written)), sorted(written)


@pytest.mark.parametrize("name", sorted({field for _, field in SET_ONCE}))
def test_a_set_once_field_refuses_a_second_write(name: str) -> None:
    """The source has one assignment per field; at run time a second write (a stage setting what
    another already learned, or a retry setting it again) raises instead of overwriting."""
    ctx = CallContext(request_id="req_1", client_region=None)
    first, second = object(), object()
    setattr(ctx, name, first)
    assert getattr(ctx, name) is first
    with pytest.raises(AttributeError, match="set once"):
        setattr(ctx, name, second)
    assert getattr(ctx, name) is first
    ctx.session_key = "a"  # the fields fixed at the start are plain
    ctx.session_key = "b"


def _attributes_assigned(tree: ast.Module) -> list[tuple[str, str]]:
    """(owner, attribute) of every `owner.attribute = ...` (plain, augmented, annotated, unpacked)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(each, ast.Attribute):
                    found.append((ast.unparse(each.value), each.attr))
    return found


def test_the_pipeline_hands_the_layers_below_it_values_not_functions_to_call_back() -> None:
    """The forwarder gets the body as a value (each target is asked for its own model there),
    not a `body_for(target)` function that calls back into the plan. The only functions the
    pipeline makes are for `run_shielded`, which runs one at once, shielded from cancellation."""
    tree = ast.parse((GATEWAY / "call" / "pipeline.py").read_text())
    shielded = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "run_shielded"
        for arg in node.args
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda):
            assert id(node) in shielded, f"pipeline.py:{node.lineno}: `{ast.unparse(node)}` handed down"
    methods = {id(item) for cls in tree.body if isinstance(cls, ast.ClassDef) for item in cls.body} | {
        id(item) for item in tree.body
    }
    nested = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and id(node) not in methods
    ]
    # `_settle` names its shielded step; nothing else defines a function inside a method.
    assert [n.name for n in nested] == ["settle"]


@pytest.mark.parametrize("path", sorted((GATEWAY / "api").glob("*_routes.py")), ids=lambda p: p.name)
def test_a_door_handler_is_parse_pipeline_encode_with_no_function_of_its_own(path: Path) -> None:
    """Handlers call down (the pipeline, the batches service) and encode what comes back; none
    wraps its work in a function for a shared frame to call (the Files and Batches doors did, until
    their service became a dependency). A lambda may only be `run_shielded`'s, run at once."""
    tree = ast.parse(path.read_text())
    shielded = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "run_shielded"
        for arg in node.args
    }
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for handler in (m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)):
            for node in ast.walk(handler):
                if node is handler:
                    continue
                assert not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef), (
                    f"{path.name}:{node.lineno}: {cls.name}.{handler.name} defines {node.name}"
                )
                if isinstance(node, ast.Lambda):
                    assert id(node) in shielded, f"{path.name}:{node.lineno}: a lambda handed down"

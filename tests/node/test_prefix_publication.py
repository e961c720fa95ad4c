"""A real node publishes the message prefixes its KV cache holds in /load (issue 35): named as the
gateway names them, sent as changes after the first answer, withdrawn when evicted, and read the
same by two gateway replicas."""

from __future__ import annotations

import httpx

from gateway.health.probes import NodeProber
from gateway.http import ConnectionPool
from protocol.prefix_cache import prefix_names
from router import FleetSnapshot, NodeInfo, RouteRequest, route
from tests.node.conftest import CHAT_MODEL, SMALL_POOL_BLOCKS, SMALL_POOL_MODEL, Node
from tests.router.builders import ANYWHERE

SYSTEM = "You are the archivist of a very long and detailed catalogue. " * 6


def _chat(http: httpx.Client, model: str, system: str, user: str) -> None:
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 1,
        },
    )
    assert response.status_code == 200, response.text


def _prefixes(http: httpx.Client, since: str | None = None) -> dict:
    response = http.get("/load", params={"prefixes": since} if since else None)
    response.raise_for_status()
    return response.json()["prefix_cache"]


def test_a_served_system_prompt_is_published_under_the_gateways_name(http: httpx.Client) -> None:
    _chat(http, CHAT_MODEL, SYSTEM, "Where is volume one?")
    names = prefix_names(CHAT_MODEL, None, [("system", SYSTEM), ("user", "Where is volume one?")])

    table = _prefixes(http)

    published = dict(table["added"])
    assert table["full"] is True
    assert published.get(names[0], 0) > 0  # the system prompt alone
    assert published.get(names[1], 0) >= published[names[0]]  # with its first turn


def test_a_reader_up_to_date_gets_only_the_changes(http: httpx.Client) -> None:
    first = _prefixes(http)
    since = f"{first['epoch']}.{first['version']}"
    assert _prefixes(http, since)["added"] == [] and _prefixes(http, since)["full"] is False

    _chat(http, CHAT_MODEL, "A new system prompt about lighthouses. " * 8, "Hello")
    changes = _prefixes(http, since)

    assert changes["full"] is False and changes["version"] > first["version"]
    assert changes["added"] and not set(dict(changes["added"])) & set(dict(first["added"]))


def test_a_stale_epoch_is_answered_with_the_whole_table(http: httpx.Client) -> None:
    answer = _prefixes(http, "0123456789abcdef.3")

    assert answer["full"] is True


def test_an_evicted_prefix_is_withdrawn(http: httpx.Client) -> None:
    # The small pool holds one of these prompts at a time: serving the second evicts the first.
    first, second = "Alpha tells tales of old ships. " * 5, "Beta sings songs of new trains. " * 5
    _chat(http, SMALL_POOL_MODEL, first, "go")
    before = _prefixes(http)
    name = prefix_names(SMALL_POOL_MODEL, None, [("system", first)])[0]
    assert name in dict(before["added"])

    for _ in range(SMALL_POOL_BLOCKS):
        _chat(http, SMALL_POOL_MODEL, second, "go on")
    changes = _prefixes(http, f"{before['epoch']}.{before['version']}")

    assert name in changes["removed"]


async def test_two_gateway_replicas_read_the_same_table_and_route_alike(node: Node) -> None:
    system = "Replica agreement is checked with this system prompt. " * 5
    with node.http() as http:
        _chat(http, CHAT_MODEL, system, "hi")
    info = NodeInfo(
        node_id="test-node", url=node.url, region="eu-west", jurisdiction="eu", models=frozenset({CHAT_MODEL})
    )
    # A second node that holds nothing: the request's cached prefix must decide, on both replicas.
    cold = NodeInfo(
        node_id="cold", url="", region="eu-west", jurisdiction="eu", models=frozenset({CHAT_MODEL})
    )
    replicas = []
    for _ in range(2):
        prober = NodeProber(
            _Directory([info]),
            ConnectionPool(connect_timeout_s=5.0),
            interval_s=1.0,
            timeout_s=5.0,
            headers=node.headers,
        )
        await prober.probe_all()
        await prober.probe_all()  # the second answer is a change set applied to the first
        result = prober.result("test-node")
        assert result is not None and result.load is not None
        replicas.append(result.load)

    assert replicas[0].cached_prefixes == replicas[1].cached_prefixes
    request = RouteRequest(
        CHAT_MODEL, home_region="eu-west", conversation=(("system", system), ("user", "hi again"))
    )
    firsts = {
        route(
            request, ANYWHERE, FleetSnapshot(nodes=(cold, NodeInfo(**{**vars(info), "load": load})))
        ).targets[0]
        for load in replicas
    }
    assert len(firsts) == 1
    (first,) = firsts
    assert first.target_id == "test-node" and ";cached=0;" not in first.reason


class _Directory:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.nodes = nodes

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return tuple(self.nodes)

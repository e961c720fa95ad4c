"""Active health probes: every node's `/ready` and `/load`, four times a second by default, short timeouts.

Results feed NodeInfo.healthy and NodeInfo.load in the fleet snapshot. A node the prober has not
heard from yet counts as not ready, so a node added to the directory gets traffic only after
its first successful probe.

Each node's published prefix table (protocol/prefix_cache.py) is mirrored here from its `/load`
answers, asked for as changes since the version last applied; a node that leaves the directory is
forgotten, one that restarts answers in full under a new epoch. `NodeLoad.cached_prefixes` is the
mirror's table, so every replica that read the same version routes on the same table.

The gateway's overlay (router/cost.py): the requests this gateway routed to each node in the
last `routed_kept_s`, handed to routing with the node's report, summed (`NodeLoad.overlay`), by `result`.
The report is the source; the overlay only covers what it cannot show yet: a request sent after
the report was asked, whose prefill the node's queue did not hold and whose prefixes its table
did not name. It is this replica's alone, so it only ever adds to what every replica shares.
The pipeline says when a node answers a request it was routed (its first token, which nodes
send only once the prompt is computed) and when the answer ends: in between the request counts
as one of the node's running sequences, not as a waiting prompt, then as nothing, and from its
first token its prefixes are cached there. One that left the node unanswered (failed over,
abandoned) is dropped.

Probes go over their own pool of the gateway's HTTP/1.1 client (gateway/http/), so
they never queue behind traffic and get the same keep-alive rules: a probe never fails because
the node closed an idle connection just as it was reused, whatever the node's keep-alive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from gateway.discovery.interface import RegionDirectory
from gateway.http import ConnectionPool, Timeout, TransportError
from gateway.metrics import GatewayMetrics
from gateway.runtime.tasks import cancel_and_wait
from protocol.load import LoadReport
from protocol.prefix_cache import PrefixMirror
from router.types import ModelQueue, ModelVersion, NodeInfo, NodeLoad, Overlaid, Prefill, Routed, RoutedStage

logger = logging.getLogger(__name__)


# A ready node whose /load answer is missed (a busy node can miss the short probe timeout) keeps
# its last report for this many rounds, and at least this long: read as "no report" it would look
# idle, exactly when it is busiest, and admission would pour work into it.
_LOAD_KEPT_ROUNDS = 3
_LOAD_KEPT_MIN_S = 3.0

# How long a routed request stays in the overlay: the node publishes a request's prefixes from
# its arrival, so the report of the round after it was sent normally shows them; a few rounds
# more cover a busy node answering late. The bound caps a burst's memory per node and the sums'
# size (routing reads a fresh copy of a node's prefix sums after every request routed there):
# 64 cover the last probe interval (0.25 s) up to 256 requests/s to one node, beyond what one LLM
# node serves; the oldest go first, and they are the ones its reports already show.
_ROUTED_KEPT_ROUNDS = 8
_ROUTED_KEPT_MIN_S = 2.0
_ROUTED_MAX = 64


@dataclass(frozen=True)
class ProbeResult:
    ready: bool
    load: NodeLoad | None
    checked_at: float
    load_at: float | None = None  # when `load` was read (earlier than checked_at if carried over)
    missed: int = 0  # /ready probes in a row left unanswered within the probe's timeout


# A probe GET that got no answer within the timeout (a busy node can miss one), as opposed to one
# the node refused or broke off (None) or answered ((status, body)).
_LATE: Final = "late"
_Answer = tuple[int, bytes] | Literal["late"] | None


_load_decoder = msgspec.json.Decoder(LoadReport)


_ORDER: dict[RoutedStage, int] = {"waiting": 0, "running": 1, "done": 2}  # the order a request moves in


class _NodeOverlay:
    """One node's routed requests (oldest first) and their sums (`Overlaid`), kept as requests
    are noted, answered and leave, so routing never walks the requests: it reads the sums."""

    def __init__(self, max_requests: int) -> None:
        self.requests: deque[Routed] = deque()
        self._max = max_requests
        self._by_key: dict[str, Routed] = {}  # the live requests with a key, to name an answer
        # Prefix name -> the token counts the live requests gave it -> how many gave each.
        self._held: dict[str, Counter[int]] = {}
        # Prefix name -> how many answered requests named it (cached on the node).
        self._prefilled: Counter[str] = Counter()
        # The live requests waiting for their first token (and their uncached tokens), and
        # those answered and still generating.
        self._waiting = self._tokens = self._running = 0
        # The requests routed before `_asked_at`, the report's ask: a prefix of the deque, since
        # requests are noted in time order; and of those, the ones waiting (with their tokens)
        # and running.
        self._asked_at = -math.inf
        self._before = 0
        self._before_waiting = self._before_tokens = self._before_running = 0
        self._sums: Overlaid | None = None  # until something changes

    def add(self, routed: Routed) -> None:
        if len(self.requests) >= self._max:
            self._remove(0)
        self.requests.append(routed)
        if routed.key:
            self._by_key[routed.key] = routed
        self._count(routed, 1, before=False)
        self._sums = None
        for name, tokens in routed.prefill.prefixes.items():
            self._held.setdefault(name, Counter())[tokens] += 1

    def moved(self, key: str, stage: RoutedStage | None) -> None:
        """The request's answer started (`running`: its first token) or ended (`done`), or it
        left the node unanswered (None: its upstream failed, another served it, the client
        left). Only forward: an answer that ended does not start again."""
        routed = self._by_key.get(key)
        if routed is None or (stage is not None and _ORDER[stage] <= _ORDER[routed.stage]):
            return  # not routed here with a prefill, aged out, or already that far
        at = self.requests.index(routed)  # by identity (Routed)
        if stage is None:
            self._remove(at)
            return
        before = at < self._before
        moved = self.requests[at] = Routed(routed.prefill, routed.routed_at, routed.key, stage)
        if routed.stage == "waiting":
            # Both counts, whatever the first says: each keeps its own sums right.
            changed = self._count(routed, -1, before=before) | self._count(moved, 1, before=before)
        else:  # running -> done: its prefixes stay cached, one running sequence less
            self._running -= 1
            self._before_running -= 1 if before else 0
            changed = not before
        if changed:
            self._sums = None  # else routing gets the same sums: the snapshot is not rebuilt
        if stage == "done":
            del self._by_key[key]
        else:
            self._by_key[key] = moved

    def drop_oldest(self) -> None:
        self._remove(0)

    def _remove(self, at: int) -> None:
        routed = self.requests[at]
        del self.requests[at]
        if self._by_key.get(routed.key) is routed:  # one call may be routed twice (escalated)
            del self._by_key[routed.key]
        before = at < self._before
        if before:
            self._before -= 1
        self._count(routed, -1, before=before)
        self._sums = None
        for name, tokens in routed.prefill.prefixes.items():
            counts = self._held[name]
            counts[tokens] -= 1
            if not counts[tokens]:
                del counts[tokens]
                if not counts:
                    del self._held[name]

    def _count(self, routed: Routed, sign: int, *, before: bool) -> bool:
        """Add (1) or take away (-1) a request of its stage from the counts; whether the sums
        routing reads change (a request the report shows already changes no unreported count)."""
        if routed.stage == "waiting":
            tokens = sign * routed.prefill.uncached_tokens
            self._waiting += sign
            self._tokens += tokens
            if before:
                self._before_waiting += sign
                self._before_tokens += tokens
            return not before
        changed = routed.stage == "running" and not before
        if routed.stage == "running":
            self._running += sign
            self._before_running += sign if before else 0
        for name in routed.prefill.prefixes:
            count = self._prefilled[name] = self._prefilled[name] + sign
            if count == 0:
                del self._prefilled[name]
            changed = changed or count == (1 if sign > 0 else 0)  # a name cached, or no longer
        return changed

    def sums(self, asked_at: float) -> Overlaid:
        """router.cost.overlaid(self.requests, asked_at), from the kept sums."""
        if asked_at != self._asked_at:
            if asked_at < self._asked_at:  # an older report than last time: count afresh
                self._before = self._before_waiting = self._before_tokens = self._before_running = 0
            self._asked_at = asked_at
            requests = self.requests
            while self._before < len(requests) and requests[self._before].routed_at < asked_at:
                routed = requests[self._before]
                if routed.stage == "waiting":
                    self._before_waiting += 1
                    self._before_tokens += routed.prefill.uncached_tokens
                elif routed.stage == "running":
                    self._before_running += 1
                self._before += 1
            self._sums = None
        if self._sums is None:
            self._sums = Overlaid(
                prefixes={name: max(counts) for name, counts in self._held.items()},
                unreported=self._waiting - self._before_waiting,
                unreported_tokens=self._tokens - self._before_tokens,
                unreported_running=self._running - self._before_running,
                prefilled=frozenset(self._prefilled),
            )
        return self._sums


class Overlay:
    """The requests this gateway routed to each node lately, oldest first (module docstring):
    each kept for `kept_s`, at most `max_per_node` per node, with their sums kept as they come,
    are answered and go (routing reads the sums on every request)."""

    def __init__(self, *, kept_s: float, max_per_node: int = _ROUTED_MAX) -> None:
        self.kept_s = kept_s
        self._max = max_per_node
        self._nodes: dict[str, _NodeOverlay] = {}

    def note(self, node_id: str, prefill: Prefill, now: float, key: str = "") -> None:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _NodeOverlay(self._max)
        node.add(Routed(prefill, now, key))

    def moved(self, node_id: str, key: str, stage: RoutedStage | None) -> None:
        """`_NodeOverlay.moved` for the request noted on `node_id` under `key`."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.moved(key, stage)

    def _current(self, node_id: str, now: float) -> _NodeOverlay | None:
        node = self._nodes.get(node_id)
        if node is None:
            return None
        requests = node.requests
        while requests and now - requests[0].routed_at > self.kept_s:
            node.drop_oldest()
        return node if requests else None

    def recent(self, node_id: str, now: float) -> tuple[Routed, ...]:
        """The node's requests routed within `kept_s` of `now` (older ones are dropped)."""
        node = self._current(node_id, now)
        return tuple(node.requests) if node is not None else ()

    def sums(self, node_id: str, now: float, asked_at: float) -> Overlaid | None:
        """The node's recent requests summed for routing against a report asked at `asked_at`;
        None when there are none."""
        node = self._current(node_id, now)
        return node.sums(asked_at) if node is not None else None

    def keep(self, node_ids: Iterable[str]) -> None:
        """Forget the nodes not in `node_ids` (they left the directory)."""
        kept = set(node_ids)
        self._nodes = {n: o for n, o in self._nodes.items() if n in kept and o.requests}


class NodeProber:
    def __init__(
        self,
        directory: RegionDirectory,
        pool: ConnectionPool,
        *,
        interval_s: float,
        timeout_s: float,
        headers: dict[str, str],
        misses: int = 2,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """`misses`: unanswered /ready probes in a row that take a ready node out of routing
        (`timeouts.probe_misses`). `metrics`: told each node's probe (readiness, queue ages); None
        counts nothing."""
        self._directory = directory
        self._pool = pool
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._misses = misses
        self._headers = dict(headers)
        self._metrics = metrics
        self._results: dict[str, ProbeResult] = {}
        self._mirrors: dict[str, PrefixMirror] = {}
        self._overlay = Overlay(kept_s=max(_ROUTED_KEPT_ROUNDS * interval_s, _ROUTED_KEPT_MIN_S))
        # By node: (its last probe, the overlay tuple, the probe with that overlay) last handed out.
        self._overlaid: dict[str, tuple[ProbeResult, Overlaid, ProbeResult]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # One round before serving, so the first requests route on facts rather than guesses.
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="node-prober")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def result(self, node_id: str, *, now: float | None = None) -> ProbeResult | None:
        """The node's last probe, its load with the overlay's recent requests (`now`: the
        monotonic time they are counted back from)."""
        result = self._results.get(node_id)
        if result is None or result.load is None:
            return result
        sums = self._overlay.sums(node_id, time.monotonic() if now is None else now, result.load.asked_at)
        if sums is None:
            return result
        last = self._overlaid.get(node_id)
        if last is not None and last[0] is result and last[1] is sums:
            return last[2]  # the same report and overlay: the same object
        overlaid = dataclasses.replace(result, load=result.load.with_overlay(sums))
        self._overlaid[node_id] = (result, sums, overlaid)
        return overlaid

    def routed(self, node_id: str, prefill: Prefill, *, key: str = "", now: float | None = None) -> None:
        """Note that this gateway sent a request to the node (its route decision's `prefill`),
        named `key` for when the node answers it (`moved`)."""
        self._overlay.note(node_id, prefill, time.monotonic() if now is None else now, key)

    def routed_lately(self, node_id: str, *, now: float | None = None) -> tuple[Routed, ...]:
        """The requests this gateway routed to the node lately, oldest first: what its overlay holds."""
        return self._overlay.recent(node_id, time.monotonic() if now is None else now)

    def moved(self, node_id: str, key: str, stage: RoutedStage | None) -> None:
        """The node's answer to the request noted as `key` started (`running`) or ended
        (`done`), or the request left the node unanswered (None)."""
        self._overlay.moved(node_id, key, stage)

    async def probe_all(self) -> None:
        nodes = self._directory.snapshot()
        results = await asyncio.gather(*(self._probe(node) for node in nodes))
        # Nodes that left the directory are forgotten; a node that comes back starts unknown.
        self._results = {node.node_id: result for node, result in zip(nodes, results, strict=True)}
        self._mirrors = {n.node_id: m for n in nodes if (m := self._mirrors.get(n.node_id)) is not None}
        self._overlay.keep(n.node_id for n in nodes)
        self._overlaid = {n: o for n, o in self._overlaid.items() if n in self._results}
        if self._metrics is not None:
            for node, result in zip(nodes, results, strict=True):
                self._metrics.node_probed(
                    node.node_id, node.region, ready=result.ready, load=result.load, missed=result.missed > 0
                )

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.probe_all()
            except Exception:  # a probe round must never kill the prober
                logger.exception("health probe round failed")

    async def _probe(self, node: NodeInfo) -> ProbeResult:
        asked_at = time.monotonic()
        answer, load = await asyncio.gather(self._get(node, "/ready"), self._load(node, asked_at))
        now = time.monotonic()
        last = self._results.get(node.node_id)
        missed = 0
        if answer == _LATE:
            # Still ready through fewer than `misses` unanswered rounds, if it was ready: what a
            # node too busy to answer in time says is unknown, not "not ready".
            missed = (last.missed if last is not None else 0) + 1
            ready = last is not None and last.ready and missed < self._misses
        else:
            ready = isinstance(answer, tuple) and answer[0] == 200
        if load is not None:
            return ProbeResult(ready=ready, load=load, checked_at=now, load_at=now, missed=missed)
        if (
            ready
            and last is not None
            and last.load is not None
            and last.load_at is not None
            and now - last.load_at <= max(_LOAD_KEPT_ROUNDS * self._interval_s, _LOAD_KEPT_MIN_S)
        ):
            return ProbeResult(
                ready=ready, load=last.load, checked_at=now, load_at=last.load_at, missed=missed
            )
        return ProbeResult(ready=ready, load=None, checked_at=now, missed=missed)

    async def _get(self, node: NodeInfo, path: str) -> _Answer:
        """(status, body) of GET `path` on the node; `_LATE` if no answer came within the
        timeout; None if the node could not be asked (refused, a bad URL) or broke the answer off."""
        try:
            response = await self._pool.get(
                node.url.rstrip("/") + path, headers=self._headers, timeout_s=self._timeout_s
            )
        except Timeout:
            return _LATE
        except (ValueError, TransportError):  # a bad URL in the directory must not end the round
            return None
        return response.status, response.body

    async def _load(self, node: NodeInfo, asked_at: float) -> NodeLoad | None:
        mirror = self._mirrors.setdefault(node.node_id, PrefixMirror())
        since = mirror.since()
        answer = await self._get(node, "/load" + (f"?prefixes={since}" if since else ""))
        if not isinstance(answer, tuple) or answer[0] != 200:
            return None
        try:
            report = _load_decoder.decode(answer[1])
        except msgspec.DecodeError:
            return None
        if report.prefix_cache is not None:
            mirror.apply(report.prefix_cache)
        else:
            mirror.reset()  # a node that publishes no table (vLLM's engine, an older node)
        return NodeLoad(
            kv_cache_usage=report.kv_cache_usage,
            waiting_tokens=report.waiting_tokens,
            num_running=report.num_running,
            num_waiting=report.num_waiting,
            # Each model's queue, for admission's queueing-delay estimate (router/overload.py).
            models={
                name: ModelQueue(
                    waiting_tokens=m.waiting_tokens,
                    waiting_tokens_by_tier=m.waiting_tokens_by_tier,
                    queue_bound_tokens=m.queue_bound_tokens,
                    drain_tokens_per_s=m.drain_tokens_per_s,
                    first_token_s_by_tier=m.first_token_s_by_tier,
                    waiting_requests_by_tier=m.waiting_requests_by_tier,
                    num_running=m.num_running,
                    max_num_seqs=m.max_num_seqs,
                    max_num_batched_tokens=m.max_num_batched_tokens,
                    long_prefill_token_threshold=m.long_prefill_token_threshold,
                    step_cost=m.step_cost,
                    finish_rate=m.finish_rate,
                    queue_age_s_by_tier=m.queue_age_s_by_tier,
                )
                for name, m in report.per_model.items()
            },
            versions={
                name: ModelVersion(m.version, m.checkpoint)
                for name, m in report.per_model.items()
                if m.version
            },
            asked_at=asked_at,
            # "pending" too: the node does not serve a model before its first round passes.
            probe_failed=frozenset(
                name for name, m in report.per_model.items() if m.probe in ("pending", "failed")
            ),
            cached_prefixes=mirror.entries,
            computing_prefixes=mirror.computing,
        )

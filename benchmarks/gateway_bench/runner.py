"""Measuring every system in the same conditions: phases run in rounds, systems interleaved.

The machine's background load drifts (other engineers share its 2 cores), so no system may be
measured only in a quiet or only in a busy spell. Concurrency-1 phases interleave the systems
in blocks of requests in one client process (gateway_bench.load says how); the concurrency-32 phase cannot (the systems would
compete for the same cores), so it runs them back to back, in an order that rotates every round.
Each measurement is one load-generator process (gateway_bench.load); each system's CPU time is
read from /proc around it. A system may take part in some phases only (System.only_phases).
The RSS phase (measure_rss) runs on its own, after the others.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway_bench.load import LoadResult, LoadSpec
from gateway_bench.systems import REPO, System, python_env


@dataclass(frozen=True)
class Phase:
    name: str
    stream: bool
    concurrency: int
    requests: int  # per system, over all rounds
    warmup: int  # per measurement, on its fresh connections; not recorded
    max_tokens: int = 16  # streamed: the fixed upstream's content chunks per stream


@dataclass(frozen=True)
class Run:
    """One measurement of one phase on one system."""

    result: LoadResult
    proxy_cpu_s: float  # the system's own processes, over the whole client run (warm-up included)
    sent: int  # requests the client sent in that span (warm-up included)


RunTable = dict[str, dict[str, list[Run]]]  # system -> phase -> one Run per round


def run_client(specs: Sequence[LoadSpec]) -> list[LoadResult]:
    """One load-generator process; its deadline bounds it, and a margin bounds the process."""
    bound = max(spec.deadline_s for spec in specs)
    result = subprocess.run(
        [sys.executable, "-m", "gateway_bench.load", msgspec.json.encode(list(specs)).decode()],
        capture_output=True,
        env=python_env(),
        cwd=str(REPO),
        timeout=bound + 60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"load generator failed ({result.returncode}): {result.stderr.decode()[-2000:]}")
    try:
        return msgspec.json.decode(result.stdout, type=list[LoadResult])
    except msgspec.DecodeError as exc:
        raise RuntimeError(
            f"load generator exited 0 with unreadable output ({exc}; {len(result.stdout)} bytes, "
            f"ending {result.stdout[-120:]!r}): {result.stderr.decode()[-2000:]}"
        ) from None


def spec_for(system: System, phase: Phase, requests: int, deadline_s: float) -> LoadSpec:
    return LoadSpec(
        base_url=system.base_url,
        model=system.model,
        api_key=system.api_key,
        stream=phase.stream,
        concurrency=phase.concurrency,
        requests=requests,
        warmup=phase.warmup,
        max_tokens=phase.max_tokens,
        deadline_s=deadline_s,
    )


def warm_up(systems: Sequence[System], requests: int, deadline_s: float) -> None:
    """Unrecorded traffic first, streamed and not: lazy imports, caches and pools settle."""
    for system in systems:
        for stream in (False, True):
            phase = Phase("warmup", stream=stream, concurrency=8, requests=0, warmup=requests)
            run_client([spec_for(system, phase, 0, deadline_s)])


def split(total: int, parts: int, index: int) -> int:
    """`total` requests over `parts` rounds, as evenly as whole requests allow."""
    return total // parts + (1 if index < total % parts else 0)


def measured(systems: Sequence[System], specs: Sequence[LoadSpec]) -> list[Run]:
    """One client process for `specs` (one per system, same order), with each system's CPU."""
    before = [system.cpu_s() for system in systems]
    results = run_client(specs)
    everything = sum(result.sent for result in results)
    return [
        # The upstream also served every other system's requests in this batch, once each.
        Run(result, system.cpu_s() - cpu, everything if system.is_upstream else result.sent)
        for system, result, cpu in zip(systems, results, before, strict=True)
    ]


def measure(
    systems: Sequence[System],
    phases: Sequence[Phase],
    *,
    rounds: int,
    deadline_s: float,
    progress: bool = True,
) -> RunTable:
    """Concurrency-1 phases interleave the systems in blocks (one client process); others run the
    systems back to back, rotating who goes first each round."""
    table: RunTable = {s.name: {p.name: [] for p in phases if s.measures(p.name)} for s in systems}
    for index in range(rounds):
        for phase in phases:
            requests = split(phase.requests, rounds, index)
            taking_part = [s for s in systems if s.measures(phase.name)]
            shift = index % len(taking_part)
            order = [*taking_part[shift:], *taking_part[:shift]]
            if phase.concurrency == 1:
                batches = [order]
            else:
                batches = [[system] for system in order]
            for batch in batches:
                runs = measured(batch, [spec_for(s, phase, requests, deadline_s) for s in batch])
                for system, run in zip(batch, runs, strict=True):
                    table[system.name][phase.name].append(run)
                    if progress:
                        print(
                            f"  round {index + 1}/{rounds} {phase.name:<10} {system.name:<9} "
                            f"{run.result.ok} ok, {run.result.errors} errors, {run.result.wall_s:.2f}s",
                            flush=True,
                        )
    return table


def measure_rss(system: System, requests: int, deadline_s: float, concurrency: int = 32) -> dict[str, Any]:
    """Resident memory before and after two equal halves of `requests` non-streamed requests.

    A leak shows as growth in the second half: the first half may still grow caches, pools and
    allocator arenas to their working size, the second must not. Each half is bounded by
    `deadline_s` (`truncated` then says so).
    """
    half = requests // 2
    phase = Phase("rss", stream=False, concurrency=concurrency, requests=half, warmup=0)
    rss = [round(system.servers[0].rss_mb(), 1)]
    results = []
    for _ in range(2):
        results.append(run_client([spec_for(system, phase, half, deadline_s)])[0])
        rss.append(round(system.servers[0].rss_mb(), 1))
    wall = sum(r.wall_s for r in results)
    ok = sum(r.ok for r in results)
    return {
        "requests_per_half": half,
        "requests": ok,
        "errors": sum(r.errors for r in results),
        "truncated": any(r.truncated for r in results),
        "requests_per_s": round(ok / wall, 1) if wall > 0 else None,
        "rss_mb_start": rss[0],
        "rss_mb_after_first_half": rss[1],
        "rss_mb_after_second_half": rss[2],
        "rss_growth_mb_first_half": round(rss[1] - rss[0], 1),
        "rss_growth_mb_second_half": round(rss[2] - rss[1], 1),
    }

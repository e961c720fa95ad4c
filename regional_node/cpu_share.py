"""The share of the machine an engine computes in: which cores, how many compute threads, how nice.

An engine's step loop (ours: one thread; vLLM's: its engine-core and worker processes) runs flat
out while requests run, and vLLM's processes also spin between steps. Unconfined, on a small
machine, it takes every core from the node's HTTP API and from whatever shares the machine (the
gateway and the other node under `meridian up`, a test's client): a /load call once took 78 s on
a 2-core machine while one vLLM stream ran. A `CpuShare` confines the engine: its threads run only
on `cpus`, compute on `threads` threads, and run `nice` levels below the node's own process, so
the API and its neighbours win a core when they need one (regional_node/server/README.md, "CPU
share").

Affinity and niceness are inherited by the threads and processes a thread starts, and on Linux
both are per thread, so confining the engine's thread (`enter`) or its processes (`place`) leaves
the rest of the node as it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_NICE = 19


@dataclass(frozen=True)
class CpuShare:
    cpus: frozenset[int]
    threads: int
    # Levels below the node process's own niceness (capped at 19); 0 runs the engine level with it.
    nice: int = 10

    def __post_init__(self) -> None:
        assert self.cpus and min(self.cpus) >= 0, f"a CPU share needs cores, got {sorted(self.cpus)}"
        assert self.threads >= 1, f"a CPU share needs at least one thread, got {self.threads}"
        assert 0 <= self.nice <= MAX_NICE, f"niceness is 0..{MAX_NICE}, got {self.nice}"

    def enter(self) -> None:
        """Confine the calling thread, and every thread and process it starts from now on."""
        self._confine(0)

    def place(self, pid: int) -> None:
        """Confine every thread of process `pid` (one the engine started); gone threads are skipped."""
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    self._confine(int(tid))

    def _confine(self, tid: int) -> None:
        if hasattr(os, "sched_setaffinity"):
            current = os.sched_getaffinity(tid)
            # A thread already bound inside the share (vLLM binds its OpenMP threads to one core
            # each) keeps its binding.
            os.sched_setaffinity(tid, (current & self.cpus) or self.cpus)
        if sys.platform != "linux":
            return  # elsewhere a niceness is the whole process's: the API's too
        target = min(os.getpriority(os.PRIO_PROCESS, os.getpid()) + self.nice, MAX_NICE)
        # Only ever raised: lowering a niceness needs privileges, and placing twice is harmless.
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)


def available_cpus() -> frozenset[int]:
    """The cores this process may run on (all of the machine's where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def default_engine_cpus(available: frozenset[int]) -> frozenset[int]:
    """Every core but the last, which is left to the API and the processes beside the node; the one
    core of a 1-core machine is shared (the niceness still lets the API win it)."""
    ordered = sorted(available)
    return frozenset(ordered[:-1] if len(ordered) > 1 else ordered)


def split_engine_cpus(available: frozenset[int], nodes: int) -> list[frozenset[int]]:
    """Engine cores for `nodes` nodes on one machine, so that their engines never compete for a
    core: the default engine cores (all but the last, which is left to the gateway and the nodes'
    APIs) cut into one contiguous slice per node, earlier nodes taking the extra core. With no more
    cores than nodes, each node gets a core of its own (shared round the nodes where there are
    fewer) and nothing is held back: a node's niceness still puts its API before its engine."""
    assert nodes >= 1, nodes
    cores = sorted(available)
    if len(cores) <= nodes:
        return [frozenset({cores[index % len(cores)]}) for index in range(nodes)]
    engine_cores = sorted(default_engine_cpus(available))
    size, extra = divmod(len(engine_cores), nodes)
    slices, start = [], 0
    for index in range(nodes):
        end = start + size + (1 if index < extra else 0)
        slices.append(frozenset(engine_cores[start:end]))
        start = end
    return slices


def omp_num_threads() -> int | None:
    """OMP_NUM_THREADS as a positive count, or None where it is unset or not one."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def child_processes(pid: int) -> list[int]:
    """Every live descendant of process `pid` (children first), from /proc; [] where there is none."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    children = [int(c) for c in (task / "children").read_text().split()]
                    found += children
                    pending += children
    return found


def format_cpu_list(cpus: frozenset[int] | list[int]) -> str:
    """`{0, 1, 2, 5}` as `0-2,5` (the form taskset and VLLM_CPU_OMP_THREADS_BIND take)."""
    ordered = sorted(cpus)
    runs: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs)


def parse_cpu_list(text: str) -> frozenset[int]:
    """`0-2,5` as `{0, 1, 2, 5}`; ValueError for anything else (an empty list included)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list such as 0-2,5")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"{text!r}: the range {part} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)

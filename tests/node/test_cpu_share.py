"""The engines' share of the machine (regional_node/cpu_share.py): cores, compute threads and
niceness reach the engine's thread and processes, and nothing else of the node."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from regional_node.cpu_share import (
    CpuShare,
    available_cpus,
    child_processes,
    format_cpu_list,
    parse_cpu_list,
    split_engine_cpus,
)
from regional_node.engine import AsyncEngine, LLMEngine, SamplingParams

ONE_CORE = frozenset({min(available_cpus())})


def _nice(tid: int = 0) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.parametrize(
    ("text", "cpus"), [("0", {0}), ("0-2,5", {0, 1, 2, 5}), ("3, 1-2", {1, 2, 3}), ("7-7", {7})]
)
def test_cpu_lists_read_and_write_as_taskset_does(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(frozenset(cpus))) == cpus
    assert format_cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "1,,2"])
def test_a_malformed_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    ("cores", "nodes", "slices"),
    [
        (range(1), 2, [{0}, {0}]),
        (range(2), 2, [{0}, {1}]),  # a core each, none held back
        (range(3), 2, [{0}, {1}]),
        (range(4), 2, [{0, 1}, {2}]),
        (range(16), 2, [set(range(8)), set(range(8, 15))]),
        (range(8), 3, [{0, 1, 2}, {3, 4}, {5, 6}]),
    ],
)
def test_nodes_on_one_machine_get_engine_cores_of_their_own(
    cores: range, nodes: int, slices: list[set[int]]
) -> None:
    assert split_engine_cpus(frozenset(cores), nodes) == slices


def test_entering_a_share_confines_the_calling_thread_only() -> None:
    share = CpuShare(cpus=ONE_CORE, threads=1, nice=4)
    before = (os.sched_getaffinity(0), _nice())
    seen: dict[str, object] = {}

    def engine_thread() -> None:
        share.enter()
        seen["cpus"], seen["nice"] = os.sched_getaffinity(0), _nice()
        # What the thread starts next inherits the share.
        child = threading.Thread(target=lambda: seen.update(child=(os.sched_getaffinity(0), _nice())))
        child.start()
        child.join()

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    assert seen["cpus"] == ONE_CORE and seen["nice"] == before[1] + 4
    assert seen["child"] == (ONE_CORE, before[1] + 4)
    assert (os.sched_getaffinity(0), _nice()) == before


def test_placing_a_process_confines_every_thread_of_it() -> None:
    script = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert child.pid in child_processes(os.getpid())
        # Its second thread may not exist yet: wait until it does.
        tasks = Path(f"/proc/{child.pid}/task")
        while len(list(tasks.iterdir())) < 2:
            assert child.poll() is None
            time.sleep(0.01)
        share = CpuShare(cpus=ONE_CORE, threads=1, nice=7)
        share.place(child.pid)
        share.place(child.pid)  # twice is the same
        for task in tasks.iterdir():
            tid = int(task.name)
            assert os.sched_getaffinity(tid) == ONE_CORE
            assert _nice(tid) == min(_nice() + 7, 19)
    finally:
        child.kill()
        child.wait()


def test_our_engine_computes_within_its_share_and_the_loop_does_not(llama_checkpoint: Path) -> None:
    share = CpuShare(cpus=ONE_CORE, threads=1, nice=5)
    engine = AsyncEngine(LLMEngine.from_pretrained(llama_checkpoint), cpu_share=share)

    async def run() -> tuple[set[int], int]:
        await engine.start()
        try:
            stream = engine.generate(
                [1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            )
            async for _ in stream:
                pass
            assert engine._thread is not None and engine._thread.native_id is not None
            tid = engine._thread.native_id
            return os.sched_getaffinity(tid), _nice(tid)
        finally:
            await engine.shutdown()

    before = (os.sched_getaffinity(0), _nice())
    assert asyncio.run(run()) == (ONE_CORE, before[1] + 5)
    assert (os.sched_getaffinity(0), _nice()) == before

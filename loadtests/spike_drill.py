"""Overload drill (issue 14): a steady interactive + batch mix, then 20x the arrival rate, then back.

    make up                                   # terminal 1: the local federation
    make drill                                # terminal 2; or, with options:
    .venv/bin/python loadtests/spike_drill.py --host http://127.0.0.1:8080 --before 60 --spike 60 --after 60

Interactive users stream chat completions with the interactive key (default: the demo tenant's,
`$MERIDIAN_DEMO_API_KEY`), mostly to meridian-large; batch users send non-streamed completions
with the batch example tenant's key. Each user arrives as a Poisson process at a fixed mean rate
(shapes.poisson_throughput), so the spike's 20x users are 20x the arrival rate (as long as answers
come faster than the pace; shed ones do).
Every request is bounded by `--timeout`. The drill writes `drill.json` and `drill.png` to `--out`
and exits 0 only when every criterion in loadtests/drill_report.py holds. Needs the `loadtest`
extra (locust, matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from locust import HttpUser, task
from locust.env import Environment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.drill_report import Phases, Record, write
from loadtests.shapes import SpikeDrillShape, arrival_phase, poisson_throughput

RECORDS: list[Record] = []
STARTED = time.monotonic()
SETTINGS: dict[str, object] = {}
PROMPTS = [
    "Summarise the rules of chess in two sentences.",
    "Write a haiku about regional failover.",
    "Explain what a KV cache is to a new engineer.",
    "List three reasons to pin data to one jurisdiction.",
]
SYSTEM_PROMPT = "You are a concise assistant for a platform team. " * 4


def _record(started: float, tier: str, response: object, **fields: object) -> Record:
    status = getattr(response, "status_code", 0) or 0
    code = ""
    if status == 0 and getattr(response, "error", None) is not None:
        code = type(response.error).__name__  # type: ignore[attr-defined]
    elif status not in (0, 200):
        try:
            code = str(response.json()["error"].get("code") or "")  # type: ignore[attr-defined]
        except (ValueError, KeyError, TypeError, AttributeError):
            code = "?"
    headers = getattr(response, "headers", {}) or {}
    record = Record(
        started_s=started - STARTED,
        tier=tier,
        status=status,
        code=code,
        retry_after="retry-after" in {k.lower() for k in headers},
        degraded=str(headers.get("x-meridian-route", "")).startswith("degraded"),
        latency_s=time.monotonic() - started,
        **fields,  # type: ignore[arg-type]
    )
    RECORDS.append(record)
    return record


class InteractiveUser(HttpUser):
    weight = 4
    arrival_rate_per_s = 0.5
    wait_time = poisson_throughput(arrival_rate_per_s)

    def on_start(self) -> None:
        arrival_phase(self)

    @task
    def chat_stream(self) -> None:
        body = {
            "model": "meridian-large" if random.random() < 0.7 else "meridian-small",
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": random.choice(PROMPTS)},
            ],
            "max_tokens": random.randint(8, 24),
            "temperature": 0,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {SETTINGS['interactive_key']}"}
        started = time.monotonic()
        ttft: float | None = None
        done = False
        try:
            with self.client.post(
                "/v1/chat/completions",
                json=body,
                headers=headers,
                stream=True,
                timeout=SETTINGS["timeout"],
                name="interactive",
                catch_response=True,
            ) as response:
                if response.status_code == 200:
                    for line in response.iter_lines():
                        if line == b"data: [DONE]":
                            done = True
                            break
                        if line.startswith(b"data: ") and ttft is None:
                            event = json.loads(line[6:])
                            if "error" in event:
                                break
                            if event.get("choices"):
                                ttft = time.monotonic() - started
                response.success()  # the drill judges outcomes itself
                _record(started, "interactive", response, ttft_s=ttft, clean=done)
        except Exception as exc:  # a client timeout or a broken connection: a hang, for the drill
            _record(started, "interactive", None, clean=False, code=type(exc).__name__)


class BatchUser(HttpUser):
    weight = 1
    arrival_rate_per_s = 0.2
    wait_time = poisson_throughput(arrival_rate_per_s)

    def on_start(self) -> None:
        arrival_phase(self)

    @task
    def completion(self) -> None:
        body = {
            "model": "meridian-large",
            "prompt": random.choice(PROMPTS),
            "max_tokens": 32,
            "temperature": 0,
        }
        headers = {"authorization": f"Bearer {SETTINGS['batch_key']}"}
        started = time.monotonic()
        try:
            with self.client.post(
                "/v1/completions",
                json=body,
                headers=headers,
                timeout=SETTINGS["timeout"],
                name="batch",
                catch_response=True,
            ) as response:
                clean = response.status_code != 200 or bool(response.json().get("choices"))
                response.success()
                _record(started, "batch", response, clean=clean)
        except Exception as exc:
            _record(started, "batch", None, clean=False, code=type(exc).__name__)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default=f"http://127.0.0.1:{os.environ.get('MERIDIAN_PORT', '8080')}")
    parser.add_argument(
        "--baseline", type=int, default=5, help="users before and after the spike (x20 during)"
    )
    parser.add_argument("--before", type=float, default=60, help="seconds of steady load before the spike")
    parser.add_argument("--spike", type=float, default=60, help="seconds of 20x arrival rate")
    parser.add_argument("--after", type=float, default=60, help="seconds of steady load after the spike")
    parser.add_argument("--timeout", type=float, default=90, help="client timeout per request (a hang fails)")
    parser.add_argument("--out", type=Path, default=Path(".meridian/drill"))
    parser.add_argument(
        "--interactive-key",
        default=os.environ.get("MERIDIAN_API_KEY") or os.environ.get("MERIDIAN_DEMO_API_KEY", ""),
    )
    parser.add_argument(
        "--batch-key", default=os.environ.get("MERIDIAN_BATCH_API_KEY", "sk-meridian-batch-example")
    )
    args = parser.parse_args()
    if not args.interactive_key:
        parser.error("set --interactive-key or MERIDIAN_DEMO_API_KEY (the key `meridian up` prints)")
    SETTINGS.update(
        interactive_key=args.interactive_key,
        batch_key=args.batch_key,
        timeout=args.timeout,
    )
    shape = SpikeDrillShape(args.baseline, args.before, args.spike, args.after)
    # stop_timeout: when the shape ends, users finish the request they are in (the batch queue may
    # hold one for its deadline) rather than being killed mid-request and counted as hung.
    env = Environment(
        user_classes=[InteractiveUser, BatchUser],
        shape_class=shape,
        host=args.host,
        stop_timeout=args.timeout,
    )
    runner = env.create_local_runner()
    global STARTED
    STARTED = time.monotonic()
    runner.start_shape()
    assert runner.greenlet is not None
    # Bounded: the shape ends after before + spike + after; in-flight requests end by --timeout.
    runner.greenlet.join(timeout=shape.end_s + args.timeout + 30)
    runner.quit()
    phases = Phases(shape.spike_start_s, shape.spike_end_s, shape.end_s + args.timeout)
    settings = {k: v for k, v in vars(args).items() if not k.endswith("_key")} | {"out": str(args.out)}
    verdict = write(RECORDS, phases, args.out, settings)
    print(json.dumps(verdict, indent=1))
    print(f"drill: {len(RECORDS)} requests; {args.out / 'drill.json'} and {args.out / 'drill.png'}")
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

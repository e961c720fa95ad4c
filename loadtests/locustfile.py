"""Locust traffic against a Meridian gateway: mixed chat/completions, streaming and not.

Run against `make up` (see loadtests/README.md):
    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 --headless -u 16 -r 4 -t 60s
The spike shape in `shapes.py` is picked up automatically when `MERIDIAN_LOAD_SHAPE=spike`.
Streams record time-to-first-token as their own locust entry ("TTFT …") so the report shows it
next to end-to-end latency.
"""

from __future__ import annotations

import json
import os
import random
import time

from locust import HttpUser, between, events, task

API_KEY = os.environ.get("MERIDIAN_API_KEY") or os.environ.get("MERIDIAN_DEMO_API_KEY", "")
MODELS = os.environ.get("MERIDIAN_LOAD_MODELS", "meridian-small,meridian-large").split(",")
PROMPTS = [
    "Summarise the rules of chess in two sentences.",
    "Write a haiku about regional failover.",
    "Explain what a KV cache is to a new engineer.",
    "List three reasons to pin data to one jurisdiction.",
]
SYSTEM_PROMPT = "You are a concise assistant for a platform team. " * 8

if os.environ.get("MERIDIAN_LOAD_SHAPE") == "spike":
    # Locust runs the LoadTestShape subclass it finds in the locustfile's namespace.
    from loadtests.shapes import SpikeShape  # noqa: F401


class MeridianUser(HttpUser):
    wait_time = between(0.05, 0.5)

    def on_start(self) -> None:
        self.client.headers.update({"Authorization": f"Bearer {API_KEY}"})

    def _chat_body(self, *, stream: bool) -> dict:
        return {
            "model": random.choice(MODELS),
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": random.choice(PROMPTS)},
            ],
            "max_tokens": random.randint(8, 48),
            "temperature": 0,
            "stream": stream,
        }

    @task(3)
    def chat(self) -> None:
        with self.client.post(
            "/v1/chat/completions", json=self._chat_body(stream=False), name="chat", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")

    @task(3)
    def chat_stream(self) -> None:
        started = time.perf_counter()
        first_token_at: float | None = None
        ended_cleanly = False
        with self.client.post(
            "/v1/chat/completions",
            json=self._chat_body(stream=True),
            name="chat stream",
            stream=True,
            catch_response=True,
            timeout=60,
        ) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            for line in response.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: ") :]
                if data == b"[DONE]":
                    ended_cleanly = True
                    break
                payload = json.loads(data)
                if "error" in payload:
                    response.failure(f"stream error event: {payload['error'].get('message')}")
                    return
                if first_token_at is None and payload.get("choices"):
                    first_token_at = time.perf_counter()
            if not ended_cleanly:
                response.failure("stream ended without [DONE]")
        if first_token_at is not None:
            events.request.fire(
                request_type="SSE",
                name="TTFT chat stream",
                response_time=(first_token_at - started) * 1000,
                response_length=0,
                exception=None,
                context={},
            )

    @task(1)
    def completion(self) -> None:
        body = {
            "model": random.choice(MODELS),
            "prompt": random.choice(PROMPTS),
            "max_tokens": random.randint(8, 32),
            "temperature": 0,
        }
        with self.client.post(
            "/v1/completions", json=body, name="completion", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")

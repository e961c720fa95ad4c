"""`meridian up` as a user runs it: a local federation, the official SDK against it, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.processes import REPO_ROOT, free_port, python_command, wait_http_ok

DEMO_KEY = "sk-meridian-up-test"


def _pids_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                pass
    return pids


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_meridian_up_serves_the_sdk_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port, admin_port = free_port(), free_port()
    env = {**os.environ, "MERIDIAN_DEMO_API_KEY": DEMO_KEY, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            python_command(
                "-m",
                "meridian.cli",
                "up",
                "--port",
                str(port),
                "--admin-port",
                str(admin_port),
                "--state-dir",
                str(tmp_path / "state"),
                "--checkpoints",
                "random",  # trained ones take about a minute on first run
            ),
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    node_groups: list[int] = []
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", 180, process=up)
        deadline = time.monotonic() + 10
        while "Meridian is ready" not in log_path.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        banner = log_path.read_text()
        assert DEMO_KEY in banner and f"http://127.0.0.1:{port}/v1/chat/completions" in banner
        # /metrics names tenants: printed on, and served from, the admin listener only.
        assert f"http://127.0.0.1:{admin_port}/metrics" in banner
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=DEMO_KEY, max_retries=0, timeout=60
        )
        assert {m.id for m in client.models.list()} == {"meridian-small", "meridian-large"}
        reply = client.chat.completions.with_raw_response.create(
            model="meridian-small", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
        )
        # Sampled (temperature 1): the demo model may pick EOS before the limit.
        completion = reply.parse()
        choice, usage = completion.choices[0], completion.usage
        assert choice.finish_reason in ("length", "stop") and choice.message.content is not None
        assert 1 <= usage.completion_tokens <= 8
        assert choice.finish_reason == "stop" or usage.completion_tokens == 8
        assert reply.headers["x-meridian-region"] in ("us-east", "eu-west")
        stream = client.chat.completions.create(
            model="meridian-large",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # The usage ledger (SQLite under the state folder) says what the client was told.
        told = [reply.parse().usage, next(c.usage for c in chunks if c.usage)]
        today = time.strftime("%Y-%m-%d", time.gmtime())
        ledger = httpx.get(
            f"http://127.0.0.1:{port}/v1/usage",
            params={"date": today},
            headers={"authorization": f"Bearer {DEMO_KEY}"},
            timeout=10,
        ).json()
        assert (ledger["input_tokens"], ledger["output_tokens"], ledger["num_model_requests"]) == (
            sum(u.prompt_tokens for u in told),
            sum(u.completion_tokens for u in told),
            2,
        )
        assert (tmp_path / "state" / "ledger.sqlite").exists()
        metrics = httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=10).text
        assert "meridian_gateway_requests_total{" in metrics
        # The example EU tenant from policies/ is loaded too, and stays in the EU.
        eu = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-meridian-eu-example", max_retries=0
        )
        eu_reply = eu.chat.completions.with_raw_response.create(
            model="meridian-small", messages=[{"role": "user", "content": "Hallo"}], max_tokens=4
        )
        assert eu_reply.headers["x-meridian-region"] == "eu-west"

        node_groups = [
            int(line.split()[0])
            for line in subprocess.check_output(["pgrep", "-f", f"meridian.cli node.*{tmp_path}"])
            .decode()
            .splitlines()
        ]
        assert len(node_groups) == 2
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
        time.sleep(0.2)
        assert not [pid for pgid in node_groups for pid in _pids_in_group(pgid)], (
            "node processes outlived meridian up"
        )
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        for pgid in node_groups:
            for pid in _pids_in_group(pgid):
                os.kill(pid, signal.SIGKILL)

"""`pip install meridian` into a fresh virtual environment gives a gateway without torch, numpy or
tokenizers that serves a request: a chat completion through it to a real node (the node runs from
the test run's own environment, which has the `node` extra).

pip resolves the gateway's dependencies from its configured indexes and wheel folders (this
machine's pip.conf names local ones; elsewhere PyPI) and its own cache, so a second run is quick,
within the versions `make test` installs (constraints.txt), so that a new release elsewhere
cannot fail this test alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.policy.keys import hash_api_key
from tests.gateway.conftest import NODE_TOKEN, gateway_config, running_fleet, write_regions
from tests.support.processes import REPO_ROOT, free_port, start_process

KEY = "sk-test-lean-install"
# What [tool.setuptools.packages.find] installs, plus the files setuptools reads.
SOURCES = ("gateway", "http_server", "meridian", "protocol", "regional_node", "router", "telemetry")


def _install_gateway(venv: Path, work: Path) -> None:
    # A copy of the sources: building from the work tree would leave build/ and egg-info in it.
    source = work / "src"
    for name in SOURCES:
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pins = REPO_ROOT / "constraints.txt"
    # --no-compile: pip would compile every installed module to bytecode first (a fifth of the
    # install's time here); Python compiles what the gateway imports when it imports it.
    install = ["install", "--quiet", "--no-compile", str(source), "-c", str(pins)]
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *install],
        check=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_gateway_installed_alone_serves_a_chat_completion(llama_checkpoint: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _install_gateway(venv, tmp_path)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    names = {line.split("==")[0].replace("_", "-") for line in installed.splitlines()}
    assert names.isdisjoint({"torch", "numpy", "tokenizers", "safetensors", "jinja2"}), sorted(names)

    policies = tmp_path / "policies"
    policies.mkdir()
    tenant = {"tenants": [{"id": "t-lean", "api_keys": [hash_api_key(KEY)], "models": "*"}]}
    (policies / "lean.yaml").write_text(yaml.safe_dump(tenant), encoding="utf-8")
    models = {"meridian-small": (llama_checkpoint, "small")}
    with running_fleet([("us-east-1", "us-east", "us")], models, tmp_path) as nodes:
        config = gateway_config(write_regions(tmp_path / "regions.yaml", nodes), policies=str(policies))
        config_path = tmp_path / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        port = free_port()
        # Not the work tree's sources: no PYTHONPATH, and run from the temporary folder.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["MERIDIAN_NODE_TOKEN"] = NODE_TOKEN
        command = [str(venv / "bin" / "meridian"), "gateway", "--config", str(config_path)]
        # The admin listener (/metrics) on a free port too: 9464, its default, may be taken (a
        # `make up` running beside the tests holds it).
        command += ["--host", "127.0.0.1", "--port", str(port), "--admin-port", str(free_port())]
        url = f"http://127.0.0.1:{port}"
        with start_process(command, env=env, ready_url=url + "/ready", timeout=120, cwd=tmp_path) as gateway:
            answer = httpx.post(
                url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {KEY}"},
                json={
                    "model": "meridian-small",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "Hi"}],
                },
                timeout=60,
            )
            assert answer.status_code == 200, answer.text + gateway.log()[-3000:]
            assert answer.json()["choices"][0]["message"]["role"] == "assistant"
            where = subprocess.run(
                [str(python), "-c", "import gateway; print(gateway.__file__)"],
                capture_output=True,
                text=True,
                check=True,
                cwd=tmp_path,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            ).stdout
            assert where.startswith(str(venv)), where

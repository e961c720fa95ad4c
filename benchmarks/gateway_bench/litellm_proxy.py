"""LiteLLM's proxy as a system under test, in a throwaway venv of its own.

The venv (default /tmp/meridian-litellm-VERSION-venv) is made with `python -m venv` and gets
`pip install 'litellm[proxy]==VERSION' httptools`; it is reused when its `litellm` command exists
and its litellm is that version. VERSION is pinned (`LITELLM_VERSION`, the release issue 31's goals
are stated against), so a run next month measures the same peer as this one; a newer LiteLLM is
one flag away (gateway_overhead.py --litellm-version). httptools
is added so that LiteLLM's uvicorn parses HTTP with the same parser as Meridian's (without it
uvicorn falls back to the slower pure-Python h11, which would flatter Meridian).

The proxy runs as `litellm --config cfg.yaml --host 127.0.0.1 --port P --num_workers 1` (one
process, as Meridian's gateway is one), with the config LiteLLM's own benchmark page uses: one
model_list entry pointing at the upstream (`openai/bench-model`, api_base the upstream's /v1,
api_key dummy), no callbacks, no retries, a master key for auth. There is no DATABASE_URL, so no
spend logs, budgets or key tables; spend/error logging and telemetry are switched off as well,
and the model cost map is read from the package (no network at start-up).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from gateway_bench.processes import free_port, start_server, wait_until
from gateway_bench.systems import REPO, System, chat_answers
from gateway_bench.upstream import MODEL

# The peer the gateway's speed goals are ratios to (issue 31: LiteLLM's proxy 1.106.2).
LITELLM_VERSION = "1.106.2"
MASTER_KEY = "sk-litellm-bench"
INSTALL_TIMEOUT_S = 1800


def default_venv(version: str) -> Path:
    return Path(f"/tmp/meridian-litellm-{version}-venv")


def litellm_command(venv: Path) -> Path:
    return venv / "bin" / "litellm"


def _installed_version(venv: Path) -> str | None:
    """litellm's version as the venv's own interpreter sees it; None if it cannot say."""
    try:
        result = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def ensure_litellm(venv: Path, version: str, log_path: Path) -> Path:
    """The `litellm` command of LiteLLM `version` in `venv`, installing it first if needed (slow:
    minutes)."""
    command = litellm_command(venv)
    if command.exists():
        # A venv in /tmp can be half-made, rebuilt by someone else with another interpreter, or
        # hold another release: say so plainly instead of deleting a folder this run did not make.
        installed = _installed_version(venv)
        if installed is None:
            raise RuntimeError(
                f"{venv} has a litellm command but its interpreter cannot load it; remove the folder"
            )
        if installed != version:
            raise RuntimeError(
                f"{venv} holds litellm {installed}, not {version}; name another --litellm-venv"
            )
        return command
    packages = (f"litellm[proxy]=={version}", "httptools")
    print(f"installing {' '.join(packages)} into {venv} (log: {log_path}) ...", flush=True)
    with open(log_path, "wb") as log:
        # The base interpreter, not our venv's: the throwaway venv must not see Meridian's packages.
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, stdout=log, stderr=subprocess.STDOUT)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=INSTALL_TIMEOUT_S,
        )
    if not command.exists():
        raise RuntimeError(f"pip installed litellm but {command} is missing; see {log_path}")
    return command


def litellm_version(venv: Path) -> str:
    return _installed_version(venv) or "unknown"


def write_litellm_config(work: Path, upstream_url: str) -> Path:
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"{upstream_url}/v1",
                    "api_key": "dummy",
                },
            }
        ],
        "litellm_settings": {
            "callbacks": [],
            "success_callback": [],
            "failure_callback": [],
            "num_retries": 0,
            "request_timeout": 30,
            "telemetry": False,
            "set_verbose": False,
            "json_logs": False,
        },
        "general_settings": {
            "master_key": MASTER_KEY,
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
    }
    path = work / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def litellm_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        # Nothing of Meridian's venv or a stray database/Redis URL may leak into the proxy.
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL", "REDIS_URL", "REDIS_HOST")
    }
    env.update(
        {
            "LITELLM_LOG": "ERROR",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "TELEMETRY": "False",
            "DISABLE_ADMIN_UI": "True",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def start_litellm(work: Path, upstream_url: str, venv: Path, version: str) -> System:
    command = ensure_litellm(venv, version, work / "litellm-install.log")
    port = free_port()
    config = write_litellm_config(work, upstream_url)
    cmd = [
        str(command),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    server = start_server("litellm", cmd, log_dir=work, env=litellm_env(), cwd=REPO)
    system = System("litellm", f"http://127.0.0.1:{port}", MASTER_KEY, servers=[server])
    # Importing LiteLLM's proxy takes a while on a busy 2-core machine.
    wait_until(server, lambda: chat_answers(system, timeout_s=20), timeout_s=240)
    return system

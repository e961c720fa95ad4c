"""One real node process for the whole tests/node package (two tiny models, token auth on).

`tiny` (Qwen2, ChatML template, default KV pool) carries most tests; `tiny-llama` has an
8-block KV pool so "too large for the pool" can be provoked. Both come from a YAML config file,
so the config path is exercised too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.processes import RunningProcess, free_port, python_command, start_process

NODE_TOKEN = "node-test-token"
CHAT_MODEL = "tiny"
SMALL_POOL_MODEL = "tiny-llama"
SMALL_POOL_BLOCKS = 8


@dataclass
class Node:
    url: str
    token: str
    process: RunningProcess

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30.0)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.token, max_retries=0, timeout=60.0)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.token, max_retries=0, timeout=60.0)

    def load(self) -> dict:
        response = httpx.get(f"{self.url}/load", headers=self.headers, timeout=5.0)
        response.raise_for_status()
        return response.json()


def write_node_config(folder: Path, qwen2: Path, llama: Path, port: int) -> Path:
    config = folder / "node.yaml"
    config.write_text(
        f"""
node_id: test-node
region: eu-west
jurisdiction: eu
host: 127.0.0.1
port: {port}
models:
  - name: {CHAT_MODEL}
    path: {qwen2}
    tier: small
  - name: {SMALL_POOL_MODEL}
    path: {llama}
    tier: large
    engine:
      num_kv_blocks: {SMALL_POOL_BLOCKS}
      max_num_seqs: 4
""",
        encoding="utf-8",
    )
    return config


@pytest.fixture(scope="package")
def node(
    qwen2_checkpoint: Path, llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    port = free_port()
    config = write_node_config(tmp_path_factory.mktemp("node"), qwen2_checkpoint, llama_checkpoint, port)
    url = f"http://127.0.0.1:{port}"
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(config), "--log-level", "warning"),
        env={"MERIDIAN_NODE_TOKEN": NODE_TOKEN},
        ready_url=f"{url}/ready",
        ready_headers={"authorization": f"Bearer {NODE_TOKEN}"},
        timeout=90,
    ) as process:
        yield Node(url=url, token=NODE_TOKEN, process=process)


@pytest.fixture
def client(node: Node) -> Iterator[openai.OpenAI]:
    with node.client() as sdk:
        yield sdk


@pytest.fixture
def http(node: Node) -> Iterator[httpx.Client]:
    with node.http() as session:
        yield session

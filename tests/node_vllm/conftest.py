"""Two real node processes on one checkpoint: one on our engine, one with `engine: vllm` (vLLM's
AsyncLLM), token auth on both. The tests skip when vLLM is not installed.

The checkpoint is the tiny Llama with head_dim 32 (vLLM's CPU attention has no head size 16).
vLLM's engine runs eagerly (`enforce_eager`: no torch.compile warm-up, which adds half a minute to
start-up on this machine) on a KV pool just large enough for one sequence of MAX_MODEL_LEN tokens.
Both nodes take the default CPU share (regional_node/server/README.md, "CPU share"): their engines
compute on every core but the last, 10 levels nicer than the node, so the tests' own client and
the nodes' APIs keep a core while vLLM's engine is saturated.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.conftest import Node
from tests.support.checkpoints import make_checkpoint
from tests.support.processes import free_port, python_command, start_process

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="engine: vllm needs vLLM (the vllm extra; `make test` installs it)",
)

MODEL = "tiny"
TOKEN = "vllm-node-token"
BLOCK_SIZE = 32  # vLLM's CPU blocks hold 32 tokens here (its default block size is 128)
# vLLM's positions for the tiny Llama: room for test_vllm_node's long generations, which must
# outlast the tests' waits on a loaded machine (4096 positions did not: a 4000-token stream once
# ended before the test saw it running).
MAX_MODEL_LEN = 32768
NUM_KV_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + 8  # vLLM refuses a pool that cannot hold one whole sequence


@pytest.fixture(scope="package")
def checkpoint32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("checkpoints"),
        "llama",
        "tiny",
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
    )


def _config(folder: Path, checkpoint: Path, port: int, engine: str) -> Path:
    options = (
        f"{{enforce_eager: true, max_model_len: {MAX_MODEL_LEN}}}"
        if engine == "vllm"
        else "{max_model_len: 4096}"
    )
    config = folder / f"{engine}.yaml"
    config.write_text(
        f"""
node_id: {engine}-node
region: eu-west
jurisdiction: eu
port: {port}
engine: {engine}
models:
  - name: {MODEL}
    path: {checkpoint}
    engine:
      block_size: {BLOCK_SIZE}
      num_kv_blocks: {NUM_KV_BLOCKS}
      max_num_seqs: 8
      options: {options}
""",
        encoding="utf-8",
    )
    return config


def start_node(config: Path, port: int) -> Iterator[Node]:
    """Run a node process on `config` (which serves on `port`) with this package's token, until
    the caller's fixture ends."""
    url = f"http://127.0.0.1:{port}"
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(config), "--log-level", "warning"),
        env={"MERIDIAN_NODE_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"},
        ready_url=f"{url}/ready",
        ready_headers={"authorization": f"Bearer {TOKEN}"},
        timeout=300,
    ) as process:
        yield Node(url=url, token=TOKEN, process=process)


def _start(folder: Path, checkpoint: Path, engine: str) -> Iterator[Node]:
    port = free_port()
    yield from start_node(_config(folder, checkpoint, port, engine), port)


@pytest.fixture(scope="package")
def vllm_node(checkpoint32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    yield from _start(tmp_path_factory.mktemp("vllm-node"), checkpoint32, "vllm")


@pytest.fixture(scope="package")
def our_node(checkpoint32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    yield from _start(tmp_path_factory.mktemp("our-node"), checkpoint32, "meridian")

"""`engine: vllm` with `speculative:` live: the node hands the settings to vLLM's CPU build as its
`speculative_config` (ngram), greedy output is the tokens of decoding without speculation (our
engine's, which the other vLLM node tests tie to vLLM's), and vLLM's own spec-decode counters
reach the node's /metrics (vllm:spec_decode_*) and /load (acceptance rate), and the request's own
verify steps its Server-Timing (vLLM's per-request spec-decode metrics).

The checkpoint is conftest's head-dim-32 tiny Llama with every attention output projection zeroed,
so greedy text falls into a cycle that prompt lookup predicts (vLLM accepts long runs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from regional_node.engine import LLMEngine, SamplingParams
from tests.node.conftest import Node
from tests.node_vllm.conftest import BLOCK_SIZE, MODEL, needs_vllm, start_node
from tests.support.checkpoints import make_checkpoint, scale_attention_output
from tests.support.processes import free_port

pytestmark = [needs_vllm, pytest.mark.slow]

MAX_MODEL_LEN = 2048
PROMPT = list(range(5, 25))
MAX_TOKENS = 80
DESC = re.compile(r'decode;dur=[0-9.]+;desc="steps=(\d+) drafts=(\d+) draft_tokens=(\d+) accepted=(\d+)"')


@pytest.fixture(scope="module")
def cyclic32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_checkpoint(
        tmp_path_factory.mktemp("cyclic32"),
        "llama",
        "tiny",
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
    )
    return scale_attention_output(path, 0.0)


@pytest.fixture(scope="module")
def spec_node(cyclic32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    port = free_port()
    config = tmp_path_factory.mktemp("vllm-spec") / "node.yaml"
    config.write_text(
        f"""
node_id: vllm-spec-node
region: eu-west
jurisdiction: eu
host: 127.0.0.1
port: {port}
engine: vllm
models:
  - name: {MODEL}
    path: {cyclic32}
    engine:
      block_size: {BLOCK_SIZE}
      num_kv_blocks: {MAX_MODEL_LEN // BLOCK_SIZE + 8}
      max_num_seqs: 4
      speculative: {{num_speculative_tokens: 3, prompt_lookup_min: 2, prompt_lookup_max: 4}}
      options: {{enforce_eager: true, max_model_len: {MAX_MODEL_LEN}}}
""",
        encoding="utf-8",
    )
    yield from start_node(config, port)


def spec_counters(node: Node) -> dict[str, float]:
    with node.http() as http:
        text = http.get("/metrics").text
    return {
        sample.name.removeprefix("vllm:spec_decode_").removesuffix("_total"): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("vllm:spec_decode_num_") and "position" not in sample.labels
    }


def complete(node: Node, **fields: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    with node.http() as http:
        return http.post("/v1/completions", json={**body, **fields}, timeout=120.0)


def test_vllm_speculates_with_the_nodes_config_and_keeps_greedy_tokens(
    spec_node: Node, cyclic32: Path
) -> None:
    before = spec_counters(spec_node)
    assert before == {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    response = complete(spec_node)
    assert response.status_code == 200, response.text
    ids = response.json()["choices"][0]["token_ids"]
    # The request's own verify steps, as vLLM reported them, in Server-Timing's decode part.
    described = DESC.search(response.headers["server-timing"])
    assert described, response.headers["server-timing"]
    steps, drafts, draft_tokens, accepted = map(int, described.groups())

    # Speculation off: our engine on the same checkpoint (the other vLLM node tests show vLLM's
    # greedy tokens equal it).
    reference = LLMEngine.from_pretrained(cyclic32, num_kv_blocks=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    assert ids == reference.generate([PROMPT], params)[0].output_token_ids

    after = spec_counters(spec_node)
    assert after == {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted}
    assert drafts > 0 and 0 < accepted <= draft_tokens and drafts <= steps
    model = httpx.get(spec_node.url + "/load", headers=spec_node.headers).json()["per_model"][MODEL]
    rate = after["num_accepted_tokens"] / after["num_draft_tokens"]
    assert model["spec_decode_acceptance_rate"] == pytest.approx(rate)


def test_an_opt_out_is_served_with_the_same_tokens(spec_node: Node) -> None:
    """vLLM has no per-request switch: the request is served as any other (README, "engine: vllm"),
    with the same greedy tokens, and a non-boolean is refused as on our engine."""
    default, opted_out = complete(spec_node), complete(spec_node, speculative=False)
    assert opted_out.status_code == 200, opted_out.text
    assert opted_out.json()["choices"][0]["token_ids"] == default.json()["choices"][0]["token_ids"]
    refused = complete(spec_node, speculative="no")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "speculative"

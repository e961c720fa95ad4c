"""The node's side of speculative decoding: the typed `speculative:` config, its pass-through to
our engine and to vLLM, vLLM's spec_decode counters on /metrics and the acceptance rate in /load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from regional_node.engine import LLMEngine, SamplingParams
from regional_node.server import ConfigError, load_config
from regional_node.server.load import _model_load
from regional_node.server.vllm_metrics import VllmStatsCollector
from regional_node.vllm_engine.engine import engine_args

YAML = (
    "node_id: n1\nregion: eu-west\njurisdiction: eu\nmodels:\n  - name: small\n    path: ckpt\n"
    "    engine: {num_kv_blocks: 32, speculative: {num_speculative_tokens: 3, prompt_lookup_max: 5}}\n"
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_speculative_config_reaches_our_engine_and_vllm(tmp_path: Path, llama_dir: Path) -> None:
    settings = load_config(_write(tmp_path, YAML)).models[0].engine
    kwargs = settings.engine_kwargs()
    assert kwargs["speculative"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "max_batch_size": 8,
        "min_acceptance_rate": 0.25,
    }
    engine = LLMEngine.from_pretrained(llama_dir, **{**kwargs, "num_kv_blocks": 64})
    assert engine.engine_config.speculative is not None
    assert engine.engine_config.speculative.num_speculative_tokens == 3
    assert engine_args(str(llama_dir), settings)["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }


def test_without_speculative_nothing_is_passed(tmp_path: Path) -> None:
    settings = (
        load_config(
            _write(
                tmp_path, YAML.replace(", speculative: {num_speculative_tokens: 3, prompt_lookup_max: 5}", "")
            )
        )
        .models[0]
        .engine
    )
    assert "speculative" not in settings.engine_kwargs()
    assert "speculative_config" not in engine_args("ckpt", settings)


@pytest.mark.parametrize("bad", ["method: eagle", "num_speculative_tokens: 0", "lookahead: 2"])
def test_a_bad_speculative_config_is_refused_naming_the_field(tmp_path: Path, bad: str) -> None:
    text = YAML.replace("num_speculative_tokens: 3, prompt_lookup_max: 5", bad)
    with pytest.raises(ConfigError, match="speculative"):
        load_config(_write(tmp_path, text))


def test_metrics_and_load_report_the_acceptance(tmp_path: Path, llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(
        llama_dir, speculative={"prompt_lookup_min": 1, "max_batch_size": 64, "min_acceptance_rate": 0.0}
    )
    plain = LLMEngine.from_pretrained(llama_dir)
    prompt = list(range(3, 40)) * 2
    engine.generate([prompt], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 0

    registry = CollectorRegistry()
    registry.register(VllmStatsCollector(lambda: {"spec": stats, "plain": plain.stats()}, dict))
    text = generate_latest(registry).decode()
    drafts = f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="spec"}} {float(stats["spec_decode_num_drafts"])}'
    assert drafts in text
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="spec",position="0"}'
        in text
    )
    assert (
        'model_name="plain"' in text
        and 'spec_decode_num_drafts_total{engine="0",model_name="plain"' not in text
    )

    config = load_config(_write(tmp_path, YAML)).models[0]
    loaded = _model_load(config, stats, 512, None, time.monotonic())
    assert loaded.spec_decode_acceptance_rate == stats["spec_decode_acceptance_rate"]
    assert _model_load(config, plain.stats(), 512, None, time.monotonic()).spec_decode_acceptance_rate is None

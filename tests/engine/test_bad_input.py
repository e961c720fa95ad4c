"""Bad requests and bad checkpoints raise their own clear exception, and the engine keeps serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from regional_node.engine import (
    CheckpointError,
    ContextLengthExceededError,
    EngineConfigError,
    InvalidRequestError,
    LLMEngine,
    RequestTooLargeError,
    SamplingParams,
    StepFailedError,
    UnsupportedArchitectureError,
)
from tests.engine.checkpoints import write_checkpoint

OK = SamplingParams(max_tokens=3, temperature=0.0)


@pytest.fixture(scope="module")
def engine(llama_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(llama_dir, num_kv_blocks=40, block_size=4)


def assert_still_serving(engine: LLMEngine) -> None:
    result = engine.generate([[5, 6, 7]], OK)[0]
    assert len(result.output_token_ids) == 3
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("prompt", [[], ""])
def test_empty_prompt(engine: LLMEngine, prompt: list[int] | str) -> None:
    with pytest.raises(InvalidRequestError, match="empty") as err:
        engine.add_request("empty", prompt, OK)
    assert err.value.param == "prompt"
    assert_still_serving(engine)


def test_prompt_longer_than_context(engine: LLMEngine) -> None:
    with pytest.raises(ContextLengthExceededError, match="maximum context length is 512") as err:
        engine.add_request("long", [1] * 600, OK)
    assert isinstance(err.value, InvalidRequestError)
    assert err.value.param == "prompt"
    assert_still_serving(engine)


def test_prompt_plus_max_tokens_longer_than_context(engine: LLMEngine) -> None:
    with pytest.raises(ContextLengthExceededError):
        engine.add_request("long", [1] * 500, SamplingParams(max_tokens=20))
    assert_still_serving(engine)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(max_tokens=-3), "max_tokens"),
        (SamplingParams(temperature=-0.5), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(stop=[""]), "stop"),
        (SamplingParams(stop_token_ids=[-1]), "stop_token_ids"),
        (SamplingParams(seed=2**64), "seed"),
        (SamplingParams(seed=-(2**63) - 1), "seed"),
    ],
)
def test_bad_sampling_values_name_the_field(engine: LLMEngine, params: SamplingParams, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", [1, 2, 3], params)
    assert err.value.param == param
    assert_still_serving(engine)


def test_token_id_outside_vocabulary(engine: LLMEngine) -> None:
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        engine.add_request("oov", [1, 99999], OK)
    assert_still_serving(engine)


def test_request_that_can_never_fit_the_pool(engine: LLMEngine) -> None:
    with pytest.raises(RequestTooLargeError, match="pool"):
        engine.add_request("huge", [1] * 150, SamplingParams(max_tokens=20))  # 169 tokens > 160 slots
    assert_still_serving(engine)


def test_duplicate_request_id(engine: LLMEngine) -> None:
    engine.add_request("dup", [1, 2], OK)
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("dup", [1, 2], OK)
    engine.abort_request("dup")
    engine.step()
    assert_still_serving(engine)


def test_bad_request_inside_generate_leaves_nothing_behind(engine: LLMEngine) -> None:
    with pytest.raises(InvalidRequestError):
        engine.generate([[1, 2, 3], []], OK)
    assert not engine.has_unfinished_requests()
    assert_still_serving(engine)


def test_string_prompt_without_tokenizer(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, tokenizer=False)
    engine = LLMEngine.from_pretrained(path)
    assert engine.tokenizer is None
    with pytest.raises(InvalidRequestError, match="no tokenizer") as err:
        engine.add_request("s", "hello", OK)
    assert err.value.param == "prompt"
    result = engine.generate([[4, 5, 6]], OK)[0]
    assert len(result.output_token_ids) == 3 and result.text == ""


@pytest.fixture
def broken_dir(llama_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(llama_dir, target)
    return target


def test_missing_checkpoint_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        LLMEngine.from_pretrained(tmp_path / "nope")


def test_missing_config(broken_dir: Path) -> None:
    (broken_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        LLMEngine.from_pretrained(broken_dir)


def test_missing_weights(broken_dir: Path) -> None:
    (broken_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="safetensors"):
        LLMEngine.from_pretrained(broken_dir)


def test_corrupt_weights(broken_dir: Path) -> None:
    (broken_dir / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        LLMEngine.from_pretrained(broken_dir)


def test_missing_tensor_is_named(broken_dir: Path) -> None:
    tensors = load_file(broken_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, broken_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        LLMEngine.from_pretrained(broken_dir)


def test_wrong_tensor_shape(broken_dir: Path) -> None:
    config = json.loads((broken_dir / "config.json").read_text())
    config["intermediate_size"] = 96
    (broken_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="shape"):
        LLMEngine.from_pretrained(broken_dir)


def test_unsupported_architecture_is_named(broken_dir: Path) -> None:
    config = json.loads((broken_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (broken_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as err:
        LLMEngine.from_pretrained(broken_dir)
    assert err.value.architecture == "GPT2LMHeadModel"
    assert isinstance(err.value, CheckpointError)


def test_unsupported_rope_scaling_is_named(broken_dir: Path) -> None:
    config = json.loads((broken_dir / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (broken_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="yarn"):
        LLMEngine.from_pretrained(broken_dir)


def test_unknown_engine_option(llama_dir: Path) -> None:
    with pytest.raises(EngineConfigError, match="kv_blocks_please"):
        LLMEngine.from_pretrained(llama_dir, kv_blocks_please=3)


def test_pool_sized_from_memory_budget(llama_dir: Path) -> None:
    # 2 layers x 2 (K, V) x 16 slots x 2 heads x 16 dims x 4 bytes = 8 KiB per block.
    engine = LLMEngine.from_pretrained(llama_dir, kv_cache_memory_bytes=80 * 8192)
    assert engine.stats()["kv_blocks_total"] == 80
    assert_still_serving(engine)


def test_abort_notice_survives_a_failing_step(engine: LLMEngine) -> None:
    engine.add_request("aborted", [1, 2, 3], SamplingParams(max_tokens=20, temperature=0.0))
    engine.add_request("doomed", [4, 5, 6], SamplingParams(max_tokens=20, temperature=0.0))
    engine.step()
    engine.abort_request("aborted")
    runner = engine.runner
    original = runner.execute

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("device fell over")

    runner.execute = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(StepFailedError):
            engine.step()
    finally:
        runner.execute = original  # type: ignore[method-assign]
    assert engine.has_unfinished_requests()
    deltas = engine.step()
    assert [(d.request_id, d.finish_reason) for d in deltas] == [("aborted", "abort")]
    assert_still_serving(engine)


def test_abort_all_reports_requests_whose_abort_notice_is_pending(engine: LLMEngine) -> None:
    engine.add_request("pending-abort", [1, 2, 3], OK)
    engine.add_request("live", [4, 5, 6], OK)
    engine.abort_request("pending-abort")
    assert sorted(engine.abort_all()) == ["live", "pending-abort"]
    assert not engine.has_unfinished_requests()
    assert_still_serving(engine)

"""`meridian model init --train`: training lowers the loss, is reproducible, and what it writes is
a checkpoint our engine and transformers (the oracle) both load and agree on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from regional_node.checkpoints import write_checkpoint
from regional_node.checkpoints.cli import model_init_main
from regional_node.checkpoints.sizes import shape_for
from regional_node.checkpoints.tokenizer import train_tokenizer, training_text
from regional_node.checkpoints.train import CausalLM, TrainingPlan, train_weights
from regional_node.engine import LLMEngine, SamplingParams

# A few seconds on one core: enough steps to move well off the random start.
PLAN = TrainingPlan(steps=24, seq_len=32, batch_size=4, warmup_steps=4, learning_rate=1e-2, seed=3)
SHAPE = shape_for("tiny", num_hidden_layers=1)


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    return train_tokenizer(SHAPE.vocab_size).encode(training_text()).ids


def train(tokens: list[int], plan: TrainingPlan = PLAN, arch: str = "llama", tied: bool = False):
    return train_weights(SHAPE, arch=arch, tied=tied, tokens=tokens, bytes_per_token=3.0, plan=plan)  # type: ignore[arg-type]


def test_training_lowers_the_loss(tokens: list[int]) -> None:
    result = train(tokens)

    assert result.final_train_loss < result.first_loss - 0.3
    assert result.held_out_loss < result.first_loss


def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not(tokens: list[int]) -> None:
    first, second = train(tokens), train(tokens)
    other = train(tokens, TrainingPlan(**{**PLAN.__dict__, "seed": 4}))

    assert first.weights.keys() == second.weights.keys()
    assert all(torch.equal(first.weights[name], second.weights[name]) for name in first.weights)
    assert not torch.equal(first.weights["model.norm.weight"], other.weights["model.norm.weight"])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_training_model_computes_what_transformers_computes(tmp_path: Path, arch: str) -> None:
    # Otherwise training would optimise a function other than the one nodes serve.
    summary = write_checkpoint(tmp_path, arch=arch, size="tiny", training=PLAN, num_hidden_layers=1)  # type: ignore[arg-type]
    ours = CausalLM(summary.shape, arch=arch, tied=summary.tied)  # type: ignore[arg-type]
    ours.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=not summary.tied)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(3, SHAPE.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))

    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_trained_checkpoint_loads_in_the_engine_and_in_transformers_with_the_same_greedy_tokens(
    tmp_path: Path, arch: str
) -> None:
    write_checkpoint(tmp_path, arch=arch, size="tiny", training=PLAN, num_hidden_layers=1)  # type: ignore[arg-type]
    model, info = AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    prompt = train_tokenizer(SHAPE.vocab_size).encode("The harbour was already awake, and").ids

    with torch.no_grad():
        reference = model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    engine = LLMEngine.from_pretrained(tmp_path)
    [result] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))

    assert result.output_token_ids == reference


def test_the_cli_trains_and_records_the_losses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trained"

    assert model_init_main(["init", str(out), "--size", "tiny", "--train", "--steps", "3"]) == 0

    record = json.loads((out / "training.json").read_text())
    assert record["plan"]["steps"] == 3 and record["held_out_loss"] > 0
    assert "trained: loss" in capsys.readouterr().out
    assert model_init_main(["init", str(tmp_path / "x"), "--steps", "3"]) == 2

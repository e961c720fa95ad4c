"""A written checkpoint is a standard Hugging Face checkpoint: transformers loads every tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from regional_node.checkpoints import SIZES


def load(path: Path) -> tuple[torch.nn.Module, dict]:
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint"])
def test_transformers_loads_every_tensor_without_initialising_any(fixture: str, request) -> None:
    path: Path = request.getfixturevalue(fixture)
    model, info = load(path)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    written = load_file(path / "model.safetensors")
    loaded = model.state_dict()
    for name, tensor in written.items():
        assert torch.equal(loaded[name], tensor), name


def test_llama_config_has_the_tiny_shape_with_gqa_and_untied_head(llama_checkpoint: Path) -> None:
    model, _ = load(llama_checkpoint)
    config, shape = model.config, SIZES["tiny"]
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers) == (shape.hidden_size, shape.num_hidden_layers)
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.max_position_embeddings >= 2048
    assert not config.tie_word_embeddings
    assert "lm_head.weight" in load_file(llama_checkpoint / "model.safetensors")


def test_qwen2_has_qkv_biases_and_ties_lm_head_to_embeddings(qwen2_checkpoint: Path) -> None:
    model, _ = load(qwen2_checkpoint)
    written = load_file(qwen2_checkpoint / "model.safetensors")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert {"q", "k", "v"} == {
        name.split(".")[-2][0] for name in written if name.endswith("_proj.bias") and ".layers.0." in name
    }
    assert "lm_head.weight" not in written
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_config_records_rope_theta_and_special_token_ids(llama_checkpoint: Path) -> None:
    config = json.loads((llama_checkpoint / "config.json").read_text())
    generation = json.loads((llama_checkpoint / "generation_config.json").read_text())
    assert config["rope_theta"] == 500000.0
    assert config["torch_dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 2)
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|> and <|endoftext|>


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint"])
def test_greedy_choice_is_not_decided_by_near_ties(fixture: str, request) -> None:
    model, _ = load(request.getfixturevalue(fixture))
    ids = torch.randint(3, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        top2 = model(ids).logits.topk(2, dim=-1).values
    margins = top2[..., 0] - top2[..., 1]
    # Float32 reorderings move logits by ~1e-4; typical margins are whole logits.
    assert margins.median() > 0.5
    assert torch.quantile(margins.flatten(), 0.01) > 1e-3


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint"])
def test_greedy_generation_does_not_collapse_into_one_repeated_token(fixture: str, request) -> None:
    model, _ = load(request.getfixturevalue(fixture))
    prompt = torch.tensor([[10, 200, 33, 1500, 7, 91]])
    out = model.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert len(set(out[0, prompt.shape[1] :].tolist())) > 8

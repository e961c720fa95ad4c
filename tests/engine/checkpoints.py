"""Random Llama / Qwen2 checkpoints written by transformers itself (the standard layout), plus a
small byte-level BPE tokenizer, and transformers' own greedy generation as the reference.

Weights use a large init (initializer_range 0.3) so logits are peaky: with the default 0.02 a
random model's logits are nearly uniform and greedy choices flip on float rounding noise.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

VOCAB = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "héllo wörld, ça va? naïve café déjà vu",
    "日本語のテキストと中文文本 and emoji 🙂🚀 mixed in",
    "paged attention with block tables and prefix caching",
] * 20


def write_checkpoint(
    out: Path,
    *,
    arch: str = "llama",
    tied: bool = False,
    num_kv_heads: int = 2,
    max_positions: int = 512,
    shard_size: str | None = None,
    tokenizer: bool = True,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_positions,
        "initializer_range": 0.3,
        "tie_word_embeddings": tied,
        "bos_token_id": None,
        "eos_token_id": None,  # no EOS: reference and engine both run to max_tokens
        **overrides,
    }
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    model.eval()
    save: dict[str, Any] = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out, **save)
    if tokenizer:
        write_tokenizer(out)
    return out


@functools.cache
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok.to_str()


def write_tokenizer(out: Path, *, chat_template: str | None = CHAT_TEMPLATE) -> None:
    (out / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    config: dict[str, Any] = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


@functools.cache
def hf_model(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@functools.cache
def _hf_greedy(path: str, prompt: tuple[int, ...], max_new_tokens: int, stop_at_eos: bool) -> tuple[int, ...]:
    model = hf_model(path)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            min_new_tokens=None if stop_at_eos else max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return tuple(out[0, len(prompt) :].tolist())


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int, *, stop_at_eos: bool = False) -> list[int]:
    """transformers' greedy continuation of one prompt (no padding, no batching)."""
    return list(_hf_greedy(str(path), tuple(prompt), max_new_tokens, stop_at_eos))


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]

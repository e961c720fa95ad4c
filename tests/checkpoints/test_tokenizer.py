"""The shipped tokenizer.json is a real byte-level BPE that transformers reads identically."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from regional_node.checkpoints.tokenizer import train_tokenizer, trained_tokenizer_json

TEXTS = [
    "The harbour was already awake.",
    "Zoë ordered crème brûlée in Zürich for €12.50 — très bien!",
    "東京 is Tokyo; 京都 is Kyoto. 你好, 안녕하세요, мир.",
    "Deployment went well 🚀🎉, tests failed 😂🔥 ❤️",
    "def f(x):\n    return x ** 2  # 1234567890\n\n\tindented   spaces ",
    "<|im_start|>user\nhello<|im_end|>\n",
]


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint"])
@pytest.mark.parametrize("text", TEXTS)
def test_transformers_and_tokenizers_agree_and_round_trip(fixture: str, text: str, request) -> None:
    path: Path = request.getfixturevalue(fixture)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(path)
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    ids = raw.encode(text).ids
    assert auto.encode(text) == ids == fast.encode(text)
    assert raw.decode(ids, skip_special_tokens=False) == text
    assert auto.decode(ids) == text == fast.decode(ids)


def test_multibyte_characters_have_their_own_merges(llama_checkpoint: Path) -> None:
    raw = Tokenizer.from_file(str(llama_checkpoint / "tokenizer.json"))
    # Without merges each CJK character is three byte tokens.
    assert len(raw.encode("東京").ids) < 6


def test_special_tokens_are_single_ids_and_skippable(llama_checkpoint: Path) -> None:
    raw = Tokenizer.from_file(str(llama_checkpoint / "tokenizer.json"))
    assert [raw.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    ids = raw.encode("<|im_start|>assistant\nok<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2
    assert raw.decode(ids, skip_special_tokens=True) == "assistant\nok"


def test_chat_template_renders_chatml_with_generation_prompt(qwen2_checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen2_checkpoint)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 東京"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 東京<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_renders_text_parts_of_list_content(llama_checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(llama_checkpoint)
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\nab<|im_end|>\n"


def test_training_is_deterministic() -> None:
    # Bypass the in-process cache so both calls really train.
    assert trained_tokenizer_json.__wrapped__(1024) == trained_tokenizer_json.__wrapped__(1024)


def test_vocabulary_is_filled_exactly() -> None:
    assert train_tokenizer(2048).get_vocab_size() == 2048

"""Trains the byte-level BPE tokenizer that local checkpoints ship, and its tokenizer_config.json.

The tokenizer is real (GPT-2/Qwen2 style byte-level BPE), so multi-byte characters, merges and
special tokens behave as they do with production checkpoints; only the corpus is small.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
# More English prose for `--train` only: the tokenizer is trained on corpus.txt alone, so adding
# training text never changes a tokenizer (and every test's token ids) again.
EXTRA_CORPUS_PATH = Path(__file__).with_name("corpus_extra.txt")


def training_text() -> str:
    """What `--train` trains on: the tokenizer's corpus, then the extra prose."""
    return CORPUS_PATH.read_text(encoding="utf-8") + "\n\n" + EXTRA_CORPUS_PATH.read_text(encoding="utf-8")


END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Qwen2's split (GPT-4 style: digits one by one, words with their leading space). transformers'
# Qwen2Tokenizer rebuilds exactly this pipeline from our vocab and merges, so any other split would
# make AutoTokenizer and the `tokenizers` file disagree for qwen2 checkpoints.
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Order fixes the ids: 0, 1, 2 — before every byte and merge.
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)

# ChatML, as Qwen2 uses. Content may also be OpenAI-style parts; only text parts are rendered.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@functools.lru_cache(maxsize=8)
def trained_tokenizer_json(vocab_size: int) -> str:
    """The serialised tokenizer.json for a vocabulary of at most `vocab_size` entries.

    Cached because every checkpoint of a given vocabulary shares it and tests create many.
    Training is deterministic: the corpus is fixed and the trainer breaks count ties by pair id.
    """
    tokenizer = Tokenizer(models.BPE())
    # NFC, as Qwen2: decode(encode(text)) gives back NFC(text), which is text for composed input.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # The corpus is small: a pair seen once still earns a merge, or 8192 tokens are out of reach.
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = CORPUS_PATH.read_text(encoding="utf-8")
    # Whole text, not lines, so newline runs ("\n\n", newline + indent) get merges as in real vocabularies.
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer.to_str(pretty=True)


def train_tokenizer(vocab_size: int) -> Tokenizer:
    return Tokenizer.from_str(trained_tokenizer_json(vocab_size))


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    assert all(i is not None for i in ids.values()), "special tokens missing from the vocabulary"
    return ids  # type: ignore[return-value]


def tokenizer_config(*, model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json; PreTrainedTokenizerFast loads tokenizer.json as-is in v4 and v5."""
    added = {
        str(i): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, token in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        # ChatML checkpoints add no BOS: the template's first <|im_start|> marks the start.
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": END_OF_TEXT,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }

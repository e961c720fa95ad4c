"""Tokenizer, chat template, incremental detokenization and stop strings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from regional_node.engine import InvalidRequestError, LLMEngine, SamplingParams, Tokenizer
from regional_node.engine.detokenizer import IncrementalDetokenizer
from regional_node.engine.stop_strings import StopStringMatcher
from regional_node.engine.tokenizer import DEFAULT_CHAT_TEMPLATE
from tests.engine.checkpoints import write_tokenizer

MULTIBYTE = "naïve café 日本語 🙂🚀 done"


@pytest.fixture(scope="module")
def tokenizer(llama_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_pretrained(llama_dir)
    assert tok is not None
    return tok


def test_no_tokenizer_json_means_none(tmp_path: Path) -> None:
    assert Tokenizer.from_pretrained(tmp_path) is None


def test_encode_decode_round_trip(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE)
    assert tokenizer.decode(ids) == MULTIBYTE


def test_chat_template_from_tokenizer_config(tokenizer: Tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tokenizer.render_chat(messages)
    assert (
        text
        == "<|endoftext|><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert ids[:2] == [tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_start|>")]
    assert not tokenizer.render_chat(messages, add_generation_prompt=False).endswith("assistant\n")


def test_continue_final_message_stops_after_its_content(tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    text = tokenizer.render_chat(messages, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nOnce upon")


def test_default_template_is_chatml(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, chat_template=None)
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok is not None and tok.chat_template == DEFAULT_CHAT_TEMPLATE
    text = tok.render_chat([{"role": "user", "content": "hey"}])
    assert text == "<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n"


def test_template_raise_exception_is_an_invalid_request(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, chat_template="{{ raise_exception('roles must alternate') }}")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok is not None
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_eos_ids_prefer_generation_config(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok is not None and tok.eos_token_ids == (tok.token_to_id("<|im_end|>"),)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.from_pretrained(tmp_path).eos_token_ids == (7,)  # type: ignore[union-attr]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    assert Tokenizer.from_pretrained(tmp_path).eos_token_ids == (2, 9)  # type: ignore[union-attr]


def test_incremental_detokenizer_never_splits_a_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE)
    # Byte-level BPE splits the emoji into several byte tokens: some pieces must wait for the next.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    prompt = tokenizer.encode("prefix: ")
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == MULTIBYTE
    assert "" in pieces  # held back at least once


def test_stop_string_split_across_pieces_is_held_back_then_dropped() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("Hello S") == ("Hello ", None)
    assert matcher.feed("T") == ("", None)
    assert matcher.feed("OP and more") == ("", "STOP")


def test_false_alarm_is_released() -> None:
    matcher = StopStringMatcher(["STOP", "\n\n"])
    assert matcher.feed("a ST") == ("a ", None)
    assert matcher.feed("ART\n") == ("START", None)
    assert matcher.flush() == "\n"


def test_earliest_stop_string_wins() -> None:
    matcher = StopStringMatcher(["bb", "a"])
    assert matcher.feed("xxbba") == ("xx", "bb")


def test_at_the_same_start_the_first_listed_stop_string_wins() -> None:
    assert StopStringMatcher(["ab", "abc"]).feed("xabc") == ("x", "ab")
    assert StopStringMatcher(["abc", "ab"]).feed("xabc") == ("x", "abc")


def test_the_first_stop_string_completed_ends_the_text_even_if_a_longer_one_started_earlier() -> None:
    """Generation stops at the token that completes a stop string: a longer one starting earlier
    could only complete with text that is never generated."""
    matcher = StopStringMatcher(["abc", "b"])
    assert matcher.feed("xa") == ("x", None)
    assert matcher.feed("b") == ("a", "b")


def test_engine_text_and_stop_strings(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir)
    tok = engine.tokenizer
    assert tok is not None
    base = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    full = engine.generate(["héllo wörld"], base)[0]
    assert full.text == tok.decode(full.output_token_ids)
    assert len(full.text) > 6
    stop = full.text[3:6]
    cut = full.text.index(stop)
    engine.add_request(
        "s", "héllo wörld", SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
    )
    streamed: list[str] = []
    finish = None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            streamed.append(delta.new_text)
            finish = (delta.finish_reason, delta.stop_reason)
    assert "".join(streamed) == full.text[:cut]
    assert finish == ("stop", stop)
    assert full.stop_reason is None  # ignore_eos: it ended by length
    [stopped] = engine.generate(["héllo wörld"], replace(base, stop=[stop]))
    assert (stopped.text, stopped.finish_reason, stopped.stop_reason) == (full.text[:cut], "stop", stop)
    assert all(stop not in piece for piece in streamed)


def test_string_prompt_is_encoded_with_the_tokenizer(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir)
    tok = engine.tokenizer
    assert tok is not None
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    by_text, by_ids = engine.generate(["the quick brown fox", tok.encode("the quick brown fox")], params)
    assert by_text.output_token_ids == by_ids.output_token_ids
    assert by_text.prompt_tokens == len(tok.encode("the quick brown fox"))


def test_skip_tokenizer_init_serves_token_ids_only(llama_dir: Path) -> None:
    """vLLM's option: no tokenizer loaded, so no text out, and text in or stop strings are refused."""
    engine = LLMEngine.from_pretrained(llama_dir, skip_tokenizer_init=True)
    assert engine.tokenizer is None
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = [5, 9, 14, 3]
    result = engine.generate([prompt], params)[0]
    assert (
        result.output_token_ids
        == LLMEngine.from_pretrained(llama_dir).generate([prompt], params)[0].output_token_ids
    )
    assert result.text == ""
    with pytest.raises(InvalidRequestError, match="skip_tokenizer_init") as text_in:
        engine.add_request("t", "some text", params)
    assert text_in.value.param == "prompt"
    with pytest.raises(InvalidRequestError, match="skip_tokenizer_init") as stop:
        engine.add_request("s", prompt, SamplingParams(max_tokens=6, stop=["x"]))
    assert stop.value.param == "stop"
    assert engine.stats()["num_running"] == 0 and engine.stats()["num_waiting"] == 0

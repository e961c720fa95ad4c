"""A checkpoint's tokenizer (tokenizer.json via the `tokenizers` package) and its chat template.

The chat template comes from tokenizer_config.json and is rendered like transformers does: a
sandboxed jinja2 environment with trim_blocks/lstrip_blocks, `raise_exception`, `strftime_now`, a
`tojson` filter, and bos_token/eos_token in scope. A checkpoint without a template gets ChatML
(DEFAULT_CHAT_TEMPLATE), which is what Qwen2 uses.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from regional_node.engine.errors import CheckpointError, InvalidRequestError

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


class Tokenizer:
    def __init__(
        self, tokenizer: HFTokenizer, config: dict[str, Any], eos_token_ids: tuple[int, ...]
    ) -> None:
        self._tok = tokenizer
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self.chat_template: str = template if isinstance(template, str) else DEFAULT_CHAT_TEMPLATE
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer | None:
        """The checkpoint's tokenizer, or None when it ships no tokenizer.json."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            return None
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust library raises a bare Exception on malformed files
            raise CheckpointError(f"cannot load {file}: {exc}") from exc
        config = _read_json(path / "tokenizer_config.json")
        eos_text = _token_text(config.get("eos_token"))
        eos_id = tok.token_to_id(eos_text) if eos_text else None
        fallback = (eos_id,) if eos_id is not None else ()
        return cls(tok, config, checkpoint_eos_token_ids(path, fallback))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        # Continuing the final message means no new assistant turn, whatever add_generation_prompt says.
        add_generation_prompt = add_generation_prompt and not continue_final_message
        try:
            text = self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"chat template failed: {exc}", "messages") from exc
        if continue_final_message:
            # As transformers: cut everything the template adds after the final message's content.
            final = messages[-1].get("content") if messages else None
            if not isinstance(final, str) or final.strip() not in text:
                raise InvalidRequestError(
                    "continue_final_message needs a final message with text", "messages"
                )
            text = text[: text.rindex(final.strip()) + len(final.strip())]
        return text

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> list[int]:
        """Token ids of the rendered conversation (the template supplies any BOS itself)."""
        text = self.render_chat(messages, add_generation_prompt, continue_final_message, **extra)
        return self.encode(text, add_special_tokens=False)


def checkpoint_eos_token_ids(path: Path, fallback: tuple[int, ...] = ()) -> tuple[int, ...]:
    """End-of-sequence ids as transformers' generate() uses them: generation_config.json, else
    config.json, else the tokenizer's eos_token."""
    for name in ("generation_config.json", "config.json"):
        value = _read_json(path / name).get("eos_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, list) and value:
            return tuple(int(v) for v in value)
    return fallback

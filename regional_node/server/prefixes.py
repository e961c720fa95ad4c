"""What this node holds in its prefix cache, published for the gateways' routers
(protocol/prefix_cache.py has the names, the wire shape and why).

Each chat request records its canonical message prefixes (system; system + first turn; the
conversation before the last reply; the whole conversation), each with the tokens it covers in
whole KV blocks and the engine's name of its last whole block (its anchor). An entry is
published while the engine's cache holds its anchor: the engine evicts a sequence's tail blocks
first, so a held anchor means its whole prefix is held. Holding is read from the engine at each
`/load` (`refresh`), so evictions, and blocks not cached yet, show in the next answer; nothing in
the engine calls up here.

Memory is bounded on this side by `max_entries` (least recently recorded dropped first, with a
removal in the log) and the log by `log_size` (a reader further behind gets the whole table).
A new `epoch` at each start makes every reader replace what it held for this node.

A prefix is published from the moment its request arrives, for `pending_s`, before its blocks
are computed: the next request of a chat or tenant often arrives while the first is still
prefilling, and would otherwise be sent elsewhere to prefill the same prompt cold. An entry
whose anchor the engine never holds (the request failed or was refused) is withdrawn after it;
one it has held follows the engine from then on.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from protocol.prefix_cache import Conversation, PrefixCacheState, prefix_names


@runtime_checkable
class PrefixCacheView(Protocol):
    """The engine's prefix cache as publication reads it (our engine has it; vLLM's does not)."""

    def prefix_block_hashes(self, token_ids: list[int], cache_salt: str | None) -> list[bytes]: ...

    def holds_prefix_block(self, block_hash: bytes) -> bool: ...


@dataclass
class _Entry:
    model: str
    tokens: int
    anchor: bytes
    recorded_at: float
    held: bool = False
    computed: bool = False  # the engine has held its anchor since it was last recorded


class PrefixDirectory:
    def __init__(
        self,
        *,
        max_entries: int = 4096,
        log_size: int = 8192,
        pending_s: float = 5.0,
        epoch: str | None = None,
    ) -> None:
        assert max_entries > 0 and log_size > 0 and pending_s >= 0
        self._pending_s = pending_s
        self.epoch = epoch or secrets.token_hex(8)
        self.version = 0
        self._max_entries = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # (version, name, tokens) for an added entry, (version, name, None) for a removed one.
        self._log: deque[tuple[int, str, int | None]] = deque(maxlen=log_size)

    def __len__(self) -> int:
        return len(self._entries)

    def record(
        self, model: str, prefixes: Sequence[tuple[str, int, bytes]], *, now: float | None = None
    ) -> None:
        """Note a request's prefixes, (name, tokens, anchor) each: published at the next refresh."""
        now = time.monotonic() if now is None else now
        for name, tokens, anchor in prefixes:
            entry = self._entries.get(name)
            if entry is None or entry.anchor != anchor:
                if entry is not None and entry.held:
                    self._change(name, None)
                self._entries[name] = _Entry(model, tokens, anchor, now)
            elif not entry.held:  # evicted since: this request computes it again
                entry.recorded_at, entry.computed = now, False
            self._entries.move_to_end(name)
        while len(self._entries) > self._max_entries:
            name, dropped = self._entries.popitem(last=False)
            if dropped.held:
                self._change(name, None)

    def refresh(self, engines: dict[str, PrefixCacheView], *, now: float | None = None) -> None:
        """Publish the entries the engines now hold (or that a request is computing), withdraw
        the ones they no longer do."""
        now = time.monotonic() if now is None else now
        for name, entry in self._entries.items():
            engine = engines.get(entry.model)
            holds = engine is not None and engine.holds_prefix_block(entry.anchor)
            entry.computed = entry.computed or holds
            pending = engine is not None and not entry.computed and now - entry.recorded_at < self._pending_s
            held = holds or pending
            if held != entry.held:
                entry.held = held
                self._change(name, entry.tokens if held else None)

    def state(self, since: tuple[str, int] | None) -> PrefixCacheState:
        """The changes after `since`, or the whole published table when they cannot be told."""
        oldest = self._log[0][0] if self._log else self.version + 1
        if since is not None and since[0] == self.epoch and oldest - 1 <= since[1] <= self.version:
            added: dict[str, int] = {}
            removed: set[str] = set()
            for version, name, tokens in self._log:
                if version <= since[1]:
                    continue
                if tokens is None:
                    added.pop(name, None)
                    removed.add(name)
                else:
                    removed.discard(name)
                    added[name] = tokens
            return PrefixCacheState(
                epoch=self.epoch,
                version=self.version,
                full=False,
                added=list(added.items()),
                removed=sorted(removed),
                computing=self.computing(),
            )
        table = [(name, e.tokens) for name, e in self._entries.items() if e.held]
        return PrefixCacheState(
            epoch=self.epoch, version=self.version, full=True, added=table, computing=self.computing()
        )

    def computing(self) -> list[str]:
        """The published entries a request is still computing: the engine has not held them yet."""
        return [name for name, e in self._entries.items() if e.held and not e.computed]

    def published(self) -> dict[str, int]:
        return {name: e.tokens for name, e in self._entries.items() if e.held}

    def _change(self, name: str, tokens: int | None) -> None:
        self.version += 1
        self._log.append((self.version, name, tokens))


def chat_prefixes(
    engine: PrefixCacheView,
    tokenizer: Any,
    model: str,
    conversation: Conversation,
    prompt_ids: list[int],
    cache_salt: str | None,
    block_size: int,
) -> list[tuple[str, int, bytes]]:
    """(name, tokens, anchor) of the conversation's prefixes worth publishing: the first one and
    two messages (a system prompt shared across chats, and its first turn) and the last two (the
    growing prefix a chat's next turn continues). Each prefix is rendered alone through the chat
    template; its tokens are those it shares with the whole prompt, in whole blocks."""
    names = prefix_names(model, cache_salt, conversation)
    n = len(conversation)
    hashes = engine.prefix_block_hashes(prompt_ids, cache_salt)
    out = []
    for k in sorted({1, 2, n - 1, n} & set(range(1, n + 1))):
        try:
            ids = tokenizer.apply_chat_template(
                [{"role": r, "content": t} for r, t in conversation[:k]], add_generation_prompt=False
            )
        except Exception:  # a template that cannot render this prefix alone: nothing to publish
            continue
        shared = 0
        for a, b in zip(ids, prompt_ids, strict=False):
            if a != b:
                break
            shared += 1
        blocks = min(shared // block_size, len(hashes))
        if blocks:
            out.append((names[k - 1], blocks * block_size, hashes[blocks - 1]))
    return out

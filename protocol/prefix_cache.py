"""What a node holds in its prefix cache, as the gateway's router can read it without a tokenizer.

**Names.** A conversation's canonical message prefixes are named by a chained hash: prefix k
(its first k messages, each as (role, text), "developer" read as "system") hashes the model, the
cache salt (an isolated tenant's blocks are salted on the node and cannot serve another tenant),
and those k messages. Node and gateway compute the same names from the same request, so the
gateway never needs the node's tokenizer or block size.

**Publication.** A node keeps a bounded table of the prefixes whose KV blocks it holds, name →
tokens cached (whole blocks), and a change log numbered by `version`; `epoch` is drawn at start.
`/load?prefixes=<epoch>.<version>` answers with the changes since that version (`full=False`),
or the whole table (`full=True`) when the epoch is another (the node restarted), the version is
older than the log keeps, or nothing was asked. A reader applying the answers in order holds
exactly the node's table at `version` (`PrefixMirror`, tested as an invariant).

Why this and not block events (vLLM's KV events): block hashes name token blocks, and the
gateway has no tokenizer to name a request's blocks with; message-prefix names are what it can
compute. Why a versioned log rather than a full table every probe: every replica polls every
node four times a second, and a table of a few thousand names is ~100 kB; the log sends only
what changed, and its epoch makes a restarted node's empty cache replace the old table at once.
Why pulled with `/load` and not pushed: the load probe already runs on every replica, and a
reader that missed any number of answers recovers by asking again (no per-replica state on the
node, no broker). Every replica that has read the same (epoch, version) holds the same table,
so stateless replicas route a request alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from protocol.query import query_count

# Roles as a chat template reads them (regional_node/server/prompts.py renders the same).
_ROLES = {"developer": "system"}
# A hash name: 64 bits of BLAKE2b in hex. Collisions among a node's few thousand names: ~1e-12.
_DIGEST = 8

Conversation = tuple[tuple[str, str], ...]


def conversation_of(messages: Iterable[Mapping[str, object]]) -> Conversation:
    """(role, text) per message of an OpenAI body's `messages` (text parts joined, as the node's
    `Message.text()` does)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(str(part.get("text") or "") for part in content if isinstance(part, Mapping))
        else:
            text = content if isinstance(content, str) else ""
        role = str(message.get("role", ""))
        out.append((_ROLES.get(role, role), text))
    return tuple(out)


def prefix_names(model: str, salt: str | None, conversation: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The names of the conversation's prefixes: element k-1 names its first k messages."""
    h = hashlib.blake2b(digest_size=_DIGEST)
    # Length-prefixed fields: no text can be confused with another split of the same bytes.
    for part in (model, salt or ""):
        _feed(h, part)
    names = []
    for role, text in conversation:
        _feed(h, role)
        _feed(h, text)
        names.append(h.copy().hexdigest())
    return tuple(names)


def _feed(h: hashlib._Hash, text: str) -> None:  # type: ignore[name-defined]
    data = text.encode("utf-8", "surrogatepass")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


class PrefixCacheState(msgspec.Struct, kw_only=True, array_like=False):
    """A node's answer to `/load?prefixes=<epoch>.<version>`: the whole table or its changes."""

    epoch: str
    version: int
    full: bool
    # (name, tokens cached) added or re-sized, in order; names removed (evicted or dropped).
    added: list[tuple[str, int]] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)
    # The published names a request is still computing (not in the engine's cache yet), in full
    # on every answer: a request sharing one waits for that prefill before it can start short.
    computing: list[str] = msgspec.field(default_factory=list)


def since_param(epoch: str, version: int) -> str:
    """The `prefixes` query value that asks for changes after `version` of `epoch`."""
    return f"{epoch}.{version}"


def parse_since(value: str | None) -> tuple[str, int] | None:
    """`since_param`'s inverse; None for a missing or malformed value (answered in full)."""
    if not value:
        return None
    epoch, _, version = value.rpartition(".")
    count = query_count(version)
    if not epoch or count is None:
        return None
    return epoch, count


@dataclass
class PrefixMirror:
    """One node's published table as a reader holds it, kept by applying the node's answers.

    `entries` is replaced, never mutated, when it changes: a fleet snapshot taken earlier keeps
    the table it was taken with. `max_entries` bounds a reader against a node that misbehaves.
    """

    max_entries: int = 16_384
    epoch: str = ""
    version: int = 0
    entries: Mapping[str, int] = field(default_factory=dict)
    computing: frozenset[str] = frozenset()  # the node's latest answer's (replaced, never edited)

    def since(self) -> str | None:
        """The query value for the next ask; None before the first answer (asks in full)."""
        return since_param(self.epoch, self.version) if self.epoch else None

    def apply(self, state: PrefixCacheState) -> None:
        if not state.full and (state.epoch != self.epoch or state.version < self.version):
            return  # a delta against a table this mirror does not hold: the next ask resyncs
        table = {} if state.full else dict(self.entries)
        for name in state.removed:
            table.pop(name, None)
        for name, tokens in state.added:
            if name in table or len(table) < self.max_entries:
                table[name] = tokens
        self.entries = table
        self.epoch, self.version = state.epoch, state.version
        computing = frozenset(name for name in state.computing if name in table)
        if computing != self.computing:
            self.computing = computing

    def reset(self) -> None:
        """Forget the node (it left the directory or stopped answering): its next answer is full."""
        self.epoch, self.version, self.entries, self.computing = "", 0, {}, frozenset()


def cached_tokens(entries: Mapping[str, int], names: Sequence[str]) -> int:
    """Tokens of the longest named prefix the table holds (0: none)."""
    for name in reversed(names):
        tokens = entries.get(name)
        if tokens is not None:
            return tokens
    return 0

"""The prefix-cache exchange (protocol/prefix_cache.py, regional_node/server/prefixes.py): a node's
published table over its engine's real block manager, read by gateway replicas polling at their
own times, through evictions, restarts and a log shorter than the gap between polls."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.prefix_cache import PrefixMirror, cached_tokens, conversation_of, parse_since, prefix_names
from regional_node.engine.block_manager import BlockManager
from regional_node.server.prefixes import PrefixDirectory

BLOCKS = 6


class _Engine:
    """A node engine's prefix cache as publication reads it: a real BlockManager."""

    def __init__(self) -> None:
        self.blocks = BlockManager(num_blocks=BLOCKS, block_size=4)

    def cache(self, anchor: bytes) -> None:
        """A request computed a block named `anchor` and finished: cached, evictable."""
        if not self.blocks.holds(anchor) and self.blocks.num_free_blocks:
            (block,) = self.blocks.allocate(1)
            self.blocks.register(block, anchor)
            self.blocks.free([block])

    def pressure(self) -> None:
        """A big request takes every free block (evicting cached ones) and finishes."""
        taken = self.blocks.allocate(self.blocks.num_free_blocks)
        self.blocks.free(taken)

    def prefix_block_hashes(self, token_ids: list[int], cache_salt: str | None) -> list[bytes]:
        raise AssertionError("not used by the directory")

    def holds_prefix_block(self, block_hash: bytes) -> bool:
        return self.blocks.holds(block_hash)


def _anchor(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


_op = st.one_of(
    st.tuples(st.just("serve"), st.integers(0, 9)),  # a request with prefix i arrives and runs
    st.tuples(st.just("pressure"), st.just(0)),
    st.tuples(st.just("restart"), st.just(0)),
    st.tuples(st.just("poll"), st.integers(0, 1)),  # replica r asks the node
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, max_size=60), max_entries=st.integers(1, 8), log_size=st.integers(1, 6))
def test_every_replica_holds_exactly_the_nodes_table_at_the_version_it_read(
    ops: list[tuple[str, int]], max_entries: int, log_size: int
) -> None:
    engine = _Engine()
    directory = PrefixDirectory(max_entries=max_entries, log_size=log_size, pending_s=0.0)
    replicas = [PrefixMirror(max_entries=max_entries), PrefixMirror(max_entries=max_entries)]
    read: dict[tuple[str, int], dict[str, int]] = {}
    for op, arg in ops:
        if op == "serve":
            directory.record("m", [(f"p{arg}", 4 * (arg + 1), _anchor(arg))], now=0.0)
            engine.cache(_anchor(arg))
        elif op == "pressure":
            engine.pressure()
        elif op == "restart":  # a new process: empty cache, new epoch
            engine, directory = (
                _Engine(),
                PrefixDirectory(max_entries=max_entries, log_size=log_size, pending_s=0.0),
            )
        else:
            mirror = replicas[arg]
            directory.refresh({"m": engine}, now=0.0)
            mirror.apply(directory.state(parse_since(mirror.since())))
            assert dict(mirror.entries) == directory.published()
            assert len(mirror.entries) <= max_entries
            # Two replicas that read the same version of the same epoch hold the same table.
            seen = read.setdefault((mirror.epoch, mirror.version), dict(mirror.entries))
            assert seen == dict(mirror.entries)
            # Only what the engine holds is published.
            assert all(engine.holds_prefix_block(_anchor(int(n[1:]))) for n in mirror.entries)


def test_a_restarted_node_replaces_the_table_at_once() -> None:
    engine, directory, mirror = _Engine(), PrefixDirectory(pending_s=0.0), PrefixMirror()
    directory.record("m", [("a", 4, _anchor(1))], now=0.0)
    engine.cache(_anchor(1))
    directory.refresh({"m": engine}, now=0.0)
    mirror.apply(directory.state(None))
    assert dict(mirror.entries) == {"a": 4}

    restarted = PrefixDirectory(pending_s=0.0)
    answer = restarted.state(parse_since(mirror.since()))

    assert answer.full and answer.epoch != directory.epoch
    mirror.apply(answer)
    assert dict(mirror.entries) == {}


def test_a_prefix_is_published_while_its_first_request_computes_it() -> None:
    engine, directory = _Engine(), PrefixDirectory(pending_s=5.0)
    directory.record("m", [("a", 4, _anchor(1))], now=100.0)

    directory.refresh({"m": engine}, now=101.0)
    assert directory.published() == {"a": 4}
    directory.refresh({"m": engine}, now=106.0)  # never computed (refused, failed): withdrawn
    assert directory.published() == {}


def test_a_prefix_being_computed_is_marked_so_until_the_engine_holds_it() -> None:
    """Readers learn which published prefixes are still being computed (a request sharing one
    must wait for that prefill), on full answers and deltas alike, and when that ends."""
    engine, directory, mirror = _Engine(), PrefixDirectory(pending_s=5.0), PrefixMirror()
    directory.record("m", [("a", 4, _anchor(1))], now=100.0)
    directory.refresh({"m": engine}, now=100.1)
    mirror.apply(directory.state(None))
    assert dict(mirror.entries) == {"a": 4} and mirror.computing == {"a"}

    engine.cache(_anchor(1))  # its request computed it
    directory.refresh({"m": engine}, now=100.5)
    mirror.apply(directory.state(parse_since(mirror.since())))
    assert dict(mirror.entries) == {"a": 4} and mirror.computing == frozenset()

    directory.record("m", [("b", 8, _anchor(2))], now=101.0)
    directory.refresh({"m": engine}, now=101.0)
    answer = directory.state(parse_since(mirror.since()))
    assert not answer.full
    mirror.apply(answer)
    assert mirror.computing == {"b"}
    mirror.reset()
    assert mirror.computing == frozenset()


def test_the_gateway_and_the_node_name_a_conversation_alike() -> None:
    body_messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        },
        {"role": "user", "content": "hi"},
    ]
    conversation = conversation_of(body_messages)

    assert conversation == (("system", "Be brief."), ("user", "hi"))
    names = prefix_names("m", None, conversation)
    assert len(names) == 2 and names[0] != names[1]
    assert prefix_names("m", "tenant-1", conversation)[0] != names[0]  # salted: another table entry
    assert prefix_names("other-model", None, conversation)[0] != names[0]
    assert cached_tokens({names[0]: 16, names[1]: 32}, names) == 32


@given(st.text(max_size=12))
def test_any_since_value_is_read_or_answered_in_full(value: str) -> None:
    """A node's `/load?prefixes=` value from anyone: a version or None, never an exception
    (`"a.²"` passed isdigit() and failed int(), a 500 on the node)."""
    since = parse_since(value)
    if since is not None:
        epoch, _, version = value.rpartition(".")
        assert since == (epoch, int(version)) and version.isascii()
    assert (
        parse_since("e.²") is None and parse_since("e.٣") is None and parse_since("e." + "9" * 5000) is None
    )

"""Block accounting: reference counts, the chained prefix hash, LRU eviction, nothing leaked."""

from __future__ import annotations

from regional_node.engine.block_hash import extend_block_hashes, hash_block
from regional_node.engine.block_manager import BlockManager
from regional_node.engine.sequence import Sequence

BS = 4


def seq(tokens: list[int], salt: str | None = None, rid: str = "r") -> Sequence:
    return Sequence(
        request_id=rid, token_ids=list(tokens), num_prompt_tokens=len(tokens), max_tokens=8, cache_salt=salt
    )


def admit_and_compute(bm: BlockManager, s: Sequence) -> list[int]:
    """Admit s with whatever prefix hit it gets, then mark all its tokens computed and cached."""
    hit = bm.prefix_hit(s)
    bm.admit(s, hit)
    s.num_computed_tokens = s.num_tokens
    bm.cache_computed(s)
    return hit


def test_hash_chains_over_parent_so_equal_blocks_after_different_prefixes_differ() -> None:
    a = seq([1, 2, 3, 4, 9, 9, 9, 9])
    b = seq([5, 6, 7, 8, 9, 9, 9, 9])
    ha, hb = extend_block_hashes(a, BS), extend_block_hashes(b, BS)
    assert len(ha) == len(hb) == 2
    assert ha[1] != hb[1]
    assert ha[1] == hash_block(ha[0], [9, 9, 9, 9])


def test_only_full_blocks_are_hashed() -> None:
    assert len(extend_block_hashes(seq(list(range(7))), BS)) == 1
    assert len(extend_block_hashes(seq(list(range(8))), BS)) == 2


def test_salt_changes_every_block_hash() -> None:
    tokens = list(range(12))
    plain = extend_block_hashes(seq(tokens), BS)
    salted = extend_block_hashes(seq(tokens, salt="tenant-a"), BS)
    other = extend_block_hashes(seq(tokens, salt="tenant-b"), BS)
    assert not set(plain) & set(salted)
    assert not set(salted) & set(other)


def test_salted_request_gets_no_hit_on_unsalted_cache() -> None:
    bm = BlockManager(16, BS)
    admit_and_compute(bm, seq(list(range(12)), rid="a"))
    assert bm.prefix_hit(seq(list(range(12)), salt="t", rid="b")) == []
    assert len(bm.prefix_hit(seq(list(range(12)), rid="c"))) == 2


def test_prefix_hit_leaves_at_least_one_token_to_compute() -> None:
    bm = BlockManager(16, BS)
    admit_and_compute(bm, seq(list(range(8)), rid="a"))
    again = seq(list(range(8)), rid="b")
    hit = bm.prefix_hit(again)
    assert len(hit) == 1  # the second block would leave nothing to compute
    bm.admit(again, hit)
    assert again.num_computed_tokens == 4


def test_shared_blocks_are_reference_counted() -> None:
    bm = BlockManager(16, BS)
    a = seq(list(range(10)), rid="a")
    admit_and_compute(bm, a)
    b = seq([*range(9), 99], rid="b")
    hit = admit_and_compute(bm, b)
    assert hit == a.block_table[:2]
    assert [bm.ref_counts[x] for x in hit] == [2, 2]
    bm.release(a)
    assert [bm.ref_counts[x] for x in hit] == [1, 1]
    bm.release(b)
    assert all(r == 0 for r in bm.ref_counts)


def test_freed_blocks_keep_contents_and_can_be_hit_again() -> None:
    bm = BlockManager(16, BS)
    a = seq(list(range(12)), rid="a")
    admit_and_compute(bm, a)
    cached = a.block_table[:3]
    bm.release(a)
    assert bm.num_free_blocks == 16
    assert bm.num_cached_blocks == 3
    b = seq(list(range(13)), rid="b")
    assert bm.prefix_hit(b) == cached


def test_eviction_is_least_recently_used_and_tail_blocks_go_first() -> None:
    bm = BlockManager(6, BS)
    a = seq([*range(8), 0], rid="a")  # 3 blocks, 2 full
    b = seq([*range(100, 108), 0], rid="b")
    admit_and_compute(bm, a)
    admit_and_compute(bm, b)
    a_full, b_full = a.block_table[:2], b.block_table[:2]
    bm.release(a)  # freed first: least recently used
    bm.release(b)
    # Within a sequence, the tail is freed first so it is evicted before the shared head.
    assert bm.evictable_order() == [a_full[1], a_full[0], b_full[1], b_full[0]]
    # 2 empty blocks are used before any cached block is evicted.
    bm.allocate(2)
    assert bm.num_evictions == 0
    bm.allocate(1)
    assert bm.num_evictions == 1
    assert bm.prefix_hit(seq([*range(8), 0], rid="c")) == [a_full[0]]  # only a's tail was evicted
    assert len(bm.prefix_hit(seq([*range(100, 108), 0], rid="d"))) == 2


def test_hit_refreshes_recency() -> None:
    bm = BlockManager(4, BS)
    a = seq([*range(4), 0], rid="a")
    b = seq([*range(50, 54), 0], rid="b")
    admit_and_compute(bm, a)
    admit_and_compute(bm, b)
    a_head, b_head = a.block_table[0], b.block_table[0]
    bm.release(a)
    bm.release(b)
    c = seq([*range(4), 1], rid="c")
    admit_and_compute(bm, c)  # touches a's block
    bm.release(c)
    assert bm.evictable_order() == [b_head, a_head]


def test_every_block_free_after_all_sequences_release() -> None:
    bm = BlockManager(32, BS)
    seqs = [seq(list(range(i, i + 13)), rid=str(i)) for i in range(5)]
    for s in seqs:
        admit_and_compute(bm, s)
    for s in seqs:
        bm.release(s)
    assert bm.num_free_blocks == 32
    assert bm.num_used_blocks == 0
    assert all(r == 0 for r in bm.ref_counts)


def test_duplicate_registration_keeps_first_block() -> None:
    bm = BlockManager(16, BS)
    a, b = seq(list(range(9)), rid="a"), seq(list(range(9)), rid="b")
    bm.admit(a, [])
    bm.admit(b, [])  # admitted in the same step: neither hits
    for s in (a, b):
        s.num_computed_tokens = 9
        bm.cache_computed(s)
    assert bm.num_cached_blocks == 2
    bm.release(a)
    bm.release(b)
    assert bm.num_free_blocks == 16

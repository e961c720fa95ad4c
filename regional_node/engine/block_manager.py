"""KV-block accounting: reference counts, the prefix-cache index and LRU eviction. Pure Python.

Every block is in exactly one state:
  - held: ref_count > 0 (owned by one or more running sequences);
  - free and empty: ref_count == 0, no hash (`_empty`);
  - free but cached: ref_count == 0 with a registered hash (`_evictable`, least recently used first).
Free cached blocks still count as free: allocation takes empty blocks first and evicts the least
recently used cached block only when none is left.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from regional_node.engine.block_hash import extend_block_hashes
from regional_node.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self._empty: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[bytes, int] = {}
        self.num_evictions = 0

    # -- pool state ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._empty) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def evictable_order(self) -> list[int]:
        """Free cached blocks, the next one to be evicted first (for tests and debugging)."""
        return list(self._evictable)

    # -- low-level operations -------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        assert n <= self.num_free_blocks, "allocate() without a successful capacity check"
        out = []
        for _ in range(n):
            if self._empty:
                block = self._empty.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                old = self.block_hashes[block]
                assert old is not None and self._cached.get(old) == block
                del self._cached[old]
                self.block_hashes[block] = None
                self.num_evictions += 1
            assert self.ref_counts[block] == 0
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def acquire(self, blocks: list[int]) -> None:
        """Take another reference on cached blocks (a prefix-cache hit)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1

    def free(self, blocks: list[int]) -> None:
        # Tail first, so a sequence's last blocks are evicted before its (more shareable) head.
        for block in reversed(blocks):
            assert self.ref_counts[block] > 0, f"double free of block {block}"
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_hashes[block] is not None:
                    self._evictable[block] = None
                else:
                    self._empty.append(block)

    def register(self, block: int, block_hash: bytes) -> None:
        """Publish a full, computed block under its hash (first writer wins on duplicates)."""
        if not self.enable_prefix_caching or block_hash in self._cached:
            return
        assert self.block_hashes[block] is None and self.ref_counts[block] > 0
        self._cached[block_hash] = block
        self.block_hashes[block] = block_hash

    def holds(self, block_hash: bytes) -> bool:
        """Whether a block of this hash is cached (in use or evictable): one dict lookup, safe to
        call from another thread (the node's prefix publication reads it between steps)."""
        return block_hash in self._cached

    def match(self, hashes: list[bytes]) -> list[int]:
        """The blocks holding the longest cached prefix of `hashes`."""
        blocks = []
        for block_hash in hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_free_among(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    # -- sequence-level operations (what the scheduler calls) -----------------------------------
    def prefix_hit(self, seq: Sequence) -> list[int]:
        """Cached blocks seq can start from; always leaves at least one token to compute."""
        if not self.enable_prefix_caching:
            return []
        hashes = extend_block_hashes(seq, self.block_size)
        usable = (seq.num_tokens - 1) // self.block_size
        return self.match(hashes[:usable])

    def admission_cost(self, seq: Sequence, hit: list[int]) -> int:
        """Free blocks that admitting seq (all its current tokens) with `hit` would consume."""
        return self.blocks_for(seq.num_tokens) - len(hit) + self.num_free_among(hit)

    def admit(self, seq: Sequence, hit: list[int]) -> None:
        assert not seq.block_table and seq.num_computed_tokens == 0
        self.acquire(hit)
        seq.block_table = list(hit)
        seq.num_cached_blocks = len(hit)
        seq.num_computed_tokens = len(hit) * self.block_size
        self.grow(seq, seq.num_tokens)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Make seq's block table cover `num_tokens` tokens."""
        seq.block_table.extend(self.allocate(self.blocks_needed(seq, num_tokens)))

    def shrink(self, seq: Sequence, num_tokens: int) -> None:
        """Free the blocks past the first `num_tokens` tokens' (rejected speculative positions only:
        never registered in the prefix cache, since they lie past every computed token)."""
        keep = self.blocks_for(num_tokens)
        if keep < len(seq.block_table):
            assert keep >= seq.num_cached_blocks
            tail = seq.block_table[keep:]
            assert all(self.block_hashes[b] is None for b in tail)
            del seq.block_table[keep:]
            self.free(tail)

    def release(self, seq: Sequence) -> None:
        self.free(seq.block_table)
        seq.block_table = []
        seq.num_cached_blocks = 0
        seq.num_computed_tokens = 0

    def cache_computed(self, seq: Sequence) -> None:
        """Register seq's blocks that became full and computed this step."""
        if not self.enable_prefix_caching:
            return
        # Bounded by the known tokens: a verification's accepted proposals count as computed
        # before they are appended (the next step_done registers their block). So a block is
        # only ever hashed from tokens that are the sequence's own, never from unverified ones.
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        if full <= seq.num_cached_blocks:
            return
        hashes = extend_block_hashes(seq, self.block_size)
        for i in range(seq.num_cached_blocks, full):
            self.register(seq.block_table[i], hashes[i])
        seq.num_cached_blocks = full

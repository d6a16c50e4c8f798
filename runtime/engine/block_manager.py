"""Paged KV blocks with automatic prefix caching (pure Python, no torch).

A request owns a block table: block ids holding its tokens' k/v, block_size tokens
each. A full block whose k/v are computed is registered under a chained hash
(parent block's hash + this block's token ids, salted by e.g. a revision id), so a
later request with the same leading tokens reuses it instead of recomputing.
Blocks are reference-counted. A freed block that is registered stays cached and is
evicted, least recently freed first, only when a fresh block is needed and no
never-cached free block is left. Partial last blocks are never shared.

With a sliding window (every layer attends only to the last `sliding_window` positions),
a block whose positions every later query of its request is past is freed as soon as the
request's computed tokens move beyond it, and its table entry points to the null block:
block 0, reserved for that and never handed out. Tables keep their shape (position p
stays in entry p // block_size) and the attention kernels never read a null entry.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Optional, Sequence

NULL_BLOCK = 0          # with a sliding window: what the entries of freed blocks point to


def hash_block(parent: Optional[bytes], token_ids: Sequence[int], salt: Optional[str] = None) -> bytes:
    """Stable across processes (the pool uses it for prefix affinity), collision-resistant."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent if parent is not None else b"root:" + (salt or "").encode())
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def block_hashes(token_ids: Sequence[int], block_size: int, salt: Optional[str] = None,
                 max_blocks: Optional[int] = None) -> list[bytes]:
    """Chained hashes of the full blocks of token_ids (at most max_blocks of them)."""
    count = len(token_ids) // block_size
    if max_blocks is not None:
        count = min(count, max_blocks)
    hashes, parent = [], None
    for i in range(count):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], salt)
        hashes.append(parent)
    return hashes


class BlockManager:
    """num_blocks: the cache's blocks, ids 0..num_blocks-1 (with a sliding window block 0 is
    the null block, so requests can hold one fewer: the num_blocks attribute)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: Optional[int] = None):
        self.null_block = NULL_BLOCK if sliding_window is not None else None
        first = 0 if self.null_block is None else NULL_BLOCK + 1
        self.num_blocks = num_blocks - first                     # what requests can hold
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(first, num_blocks))  # never cached, or evicted
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached, LRU first
        self._cached: dict[bytes, int] = {}                      # hash -> block id
        self._block_hash: list[Optional[bytes]] = [None] * num_blocks
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}                # hashes of a request's full blocks
        self._salts: dict[str, Optional[str]] = {}

    # ---- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, token_ids: Sequence[int], salt: Optional[str] = None) -> list[int]:
        """Ids of the leading cached blocks; at least one token is left to compute."""
        if not self.enable_prefix_caching:
            return []
        found, parent = [], None
        for i in range((len(token_ids) - 1) // self.block_size):
            parent = hash_block(parent, token_ids[i * self.block_size:(i + 1) * self.block_size], salt)
            block = self._cached.get(parent)
            if block is None:
                break
            found.append(block)
        return found

    # ---- new requests
    def can_allocate(self, cached: list[int], num_tokens: int) -> bool:
        live = cached[self._num_dead(len(cached) * self.block_size):]
        revived = sum(1 for b in live if self._ref[b] == 0)     # leave the free pool when reused
        fresh = self.blocks_needed(num_tokens) - len(cached)
        return fresh <= self.num_free_blocks - revived

    def allocate(self, request_id: str, cached: list[int], num_tokens: int,
                 salt: Optional[str] = None) -> None:
        """cached: from cached_prefix; those already outside the window are not taken."""
        assert request_id not in self._tables, f"{request_id} already holds blocks"
        self._salts[request_id] = salt
        dead = self._num_dead(len(cached) * self.block_size)
        for block in cached[dead:]:
            self._take(block)
        self._tables[request_id] = [NULL_BLOCK] * dead + cached[dead:]
        self._hashes[request_id] = [self._hash_of(b) for b in cached]
        self.append_slot(request_id, num_tokens)

    # ---- running requests
    def can_append(self, request_id: str, num_tokens: int) -> bool:
        extra = self.blocks_needed(num_tokens) - len(self._tables[request_id])
        return extra <= self.num_free_blocks

    def append_slot(self, request_id: str, num_tokens: int) -> None:
        """Grow the request's table so it can hold num_tokens tokens."""
        table = self._tables[request_id]
        while len(table) < self.blocks_needed(num_tokens):
            table.append(self._fresh_block())

    def commit(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """The request's first num_computed tokens have their k/v in the cache: its full
        blocks join the prefix cache; with a sliding window, blocks no later query reads go."""
        if self.enable_prefix_caching:
            self._register(request_id, token_ids, num_computed)
        self._free_outside_window(request_id, num_computed)

    def _register(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        table, hashes, bs = self._tables[request_id], self._hashes[request_id], self.block_size
        salt = self._salts[request_id]
        for i in range(len(hashes), num_computed // bs):
            parent = hashes[-1] if hashes else None
            digest = hash_block(parent, token_ids[i * bs:(i + 1) * bs], salt)
            hashes.append(digest)
            if digest not in self._cached:    # a duplicate computed alongside stays private
                self._cached[digest] = table[i]
                self._block_hash[table[i]] = digest

    # ---- parallel samples (n > 1)
    def can_fork(self, num_tokens: int) -> bool:
        """A fork needs one fresh block, for its copy of a partial last block."""
        return num_tokens % self.block_size == 0 or self.num_free_blocks >= 1

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> Optional[tuple[int, int]]:
        """The child shares the parent's full blocks of its first num_tokens tokens (one more
        reference each); a partial last block is copied on write: the child gets a fresh
        block, and the (source, destination) pair is returned for the runner to copy."""
        full = num_tokens // self.block_size
        table = self._tables[parent_id][:full]
        for block in table:
            if block != self.null_block:
                self._take(block)
        copy = None
        if num_tokens % self.block_size:
            fresh = self._fresh_block()
            copy = (self._tables[parent_id][full], fresh)
            table.append(fresh)
        self._tables[child_id] = table
        self._hashes[child_id] = self._hashes[parent_id][:full]
        self._salts[child_id] = self._salts[parent_id]
        return copy

    def deallocate(self, request_id: str) -> None:
        """Release the request's blocks, tail first, so tails are evicted before shared heads."""
        table = self._tables.pop(request_id)
        self._hashes.pop(request_id)
        self._salts.pop(request_id)
        for block in reversed(table):
            if block != self.null_block:
                self._release(block)

    def drop_prefix_cache(self) -> int:
        """Forget every cached block (the KV cache they live in is being freed); only with no
        request holding blocks. Returns how many cached blocks were dropped."""
        if self._tables:
            raise RuntimeError(f"{len(self._tables)} request(s) still hold KV blocks")
        dropped = len(self._cached)
        for block in self._evictable:
            self._block_hash[block] = None
            self._free.append(block)
        self._evictable.clear()
        self._cached.clear()
        return dropped

    # ---- internals
    def _num_dead(self, num_computed: int) -> int:
        """Leading blocks that no query from position num_computed on reads (window only)."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed - self.sliding_window + 1) // self.block_size

    def _free_outside_window(self, request_id: str, num_computed: int) -> None:
        """Newly dead blocks are released tail first, as deallocate does."""
        table = self._tables[request_id]
        i = self._num_dead(num_computed) - 1
        while i >= 0 and table[i] != self.null_block:
            self._release(table[i])
            table[i] = NULL_BLOCK
            i -= 1

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        assert self._ref[block] >= 0, f"block {block} freed twice"
        if self._ref[block] == 0:
            if self._block_hash[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _take(self, block: int) -> None:
        if self._ref[block] == 0:
            self._evictable.pop(block)
        self._ref[block] += 1

    def _hash_of(self, block: int) -> bytes:
        """The hash of a block in the prefix cache (only cached blocks have one)."""
        block_hash = self._block_hash[block]
        assert block_hash is not None, f"block {block} is not in the prefix cache"
        return block_hash

    def _fresh_block(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._hash_of(block)]
            self._block_hash[block] = None
        self._ref[block] = 1
        return block

    def check_invariants(self) -> None:
        """For tests: every block is either referenced or free, never both, never lost; the
        null block is neither."""
        free = set(self._free) | set(self._evictable)
        assert len(free) == len(self._free) + len(self._evictable), "block listed free twice"
        blocks = [b for b in range(len(self._ref)) if b != self.null_block]
        assert self.null_block not in free and len(blocks) == self.num_blocks
        for block in blocks:
            assert (self._ref[block] == 0) == (block in free), f"block {block}: ref {self._ref[block]}"
        held: dict[int, int] = {}
        for table in self._tables.values():
            for block in table:
                held[block] = held.get(block, 0) + 1
        for block in blocks:
            assert held.get(block, 0) == self._ref[block], f"block {block}: ref count drift"
        for digest, block in self._cached.items():
            assert self._block_hash[block] == digest

"""Block manager alone: exact block ids, prefix hits, eviction order, salts, no leaks."""
from __future__ import annotations

from runtime.engine.block_manager import NULL_BLOCK, BlockManager, block_hashes

A = list(range(10))                 # two full blocks of 4 and a partial one


def test_allocate_grow_and_free_in_order():
    bm = BlockManager(num_blocks=5, block_size=4)
    bm.allocate("a", [], 5)
    assert bm.block_table("a") == [0, 1]
    assert bm.can_append("a", 12) and not bm.can_append("a", 21)
    bm.append_slot("a", 12)
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.num_free_blocks == 2
    bm.deallocate("a")
    assert bm.num_free_blocks == 5
    bm.check_invariants()


def test_prefix_hit_then_lru_eviction_of_tails_first():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.cached_prefix(A) == []
    bm.allocate("a", [], len(A))
    assert bm.block_table("a") == [0, 1, 2]
    bm.commit("a", A, len(A))                          # blocks 0 and 1 are full and computed

    b = A[:8] + [100, 101, 102]
    hit = bm.cached_prefix(b)
    assert hit == [0, 1]
    assert bm.can_allocate(hit, len(b))
    bm.allocate("b", hit, len(b))
    assert bm.block_table("b") == [0, 1, 3]            # partial last block never shared
    bm.deallocate("a")                                 # 2 (never cached) -> free list
    bm.deallocate("b")                                 # 3 free; 1 then 0 become evictable
    assert bm.num_free_blocks == 6
    assert bm.cached_prefix(A) == [0, 1]               # still cached after everyone left

    bm.allocate("c", [], 20)                           # needs 5: 4 free, then evict LRU (1)
    assert bm.block_table("c") == [4, 5, 2, 3, 1]
    assert bm.cached_prefix(A) == [0]                  # block 1 evicted, block 0 kept
    bm.allocate("d", [], 4)                            # evicts 0 last
    assert bm.block_table("d") == [0]
    assert bm.cached_prefix(A) == []
    bm.check_invariants()


def test_hit_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens = list(range(8))
    bm.allocate("a", [], 8)
    bm.commit("a", tokens, 8)
    assert bm.cached_prefix(tokens) == [0]             # the last block is recomputed for logits
    assert bm.cached_prefix(tokens + [9]) == [0, 1]


def test_revived_blocks_count_against_free_space():
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.allocate("a", [], 8)
    bm.commit("a", list(range(8)), 8)
    bm.deallocate("a")                                 # both blocks cached, evictable
    hit = bm.cached_prefix(list(range(9)))
    assert hit == [1, 0][::-1]                         # chained: block 0 then block 1
    assert bm.can_allocate(hit, 12)                    # 2 revived + 1 fresh = 3
    assert not bm.can_allocate(hit, 13)
    bm.allocate("b", hit, 12)
    assert bm.block_table("b") == [0, 1, 2]
    bm.check_invariants()


def test_salt_separates_caches_and_duplicates_stay_private():
    bm = BlockManager(num_blocks=6, block_size=4)
    tokens = list(range(9))
    bm.allocate("a", [], 9, salt="rev-1")
    bm.allocate("b", [], 9, salt="rev-1")             # same content computed alongside
    bm.commit("a", tokens, 9)
    bm.commit("b", tokens, 9)
    assert bm.cached_prefix(tokens, salt="rev-1") == [0, 1]
    assert bm.cached_prefix(tokens, salt="rev-2") == []
    assert bm.cached_prefix(tokens) == []
    bm.deallocate("b")                                 # b's duplicates were never registered
    assert list(bm._free) == [5, 4, 3]
    bm.deallocate("a")
    bm.check_invariants()


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    bm.allocate("a", [], 9)
    bm.commit("a", list(range(9)), 9)
    bm.deallocate("a")
    assert bm.cached_prefix(list(range(9))) == []


def test_hashes_are_chained_and_stable():
    h = block_hashes(list(range(12)), 4)
    assert len(h) == 3 and len(set(h)) == 3
    other = block_hashes([99] + list(range(1, 12)), 4)
    assert all(x != y for x, y in zip(h, other))        # a change in block 0 changes all
    assert block_hashes(list(range(12)), 4, max_blocks=2) == h[:2]
    assert block_hashes([1, 2], 4) == []


# ---- sliding window: block 0 is the null block; a block every later query is past goes

def test_sliding_window_frees_blocks_behind_the_window():
    bm = BlockManager(num_blocks=6, block_size=4, sliding_window=6)
    assert bm.num_blocks == 5 and bm.num_free_blocks == 5          # block 0 is never handed out
    bm.allocate("a", [], 10)
    assert bm.block_table("a") == [1, 2, 3]
    bm.commit("a", A, 9)                   # the next query (9) reads 4..9: block 1 (0..3) goes
    assert bm.block_table("a") == [NULL_BLOCK, 2, 3]
    assert bm.num_free_blocks == 3
    bm.append_slot("a", 13)
    assert bm.block_table("a") == [NULL_BLOCK, 2, 3, 4]
    bm.commit("a", A + [10, 11, 12], 12)   # reads 7..12: block 2 (4..7) is still read
    assert bm.block_table("a") == [NULL_BLOCK, 2, 3, 4]
    bm.commit("a", A + [10, 11, 12], 13)   # reads 8..13
    assert bm.block_table("a") == [NULL_BLOCK, NULL_BLOCK, 3, 4]
    assert bm.num_used_blocks == 2
    bm.check_invariants()
    bm.deallocate("a")
    assert bm.num_free_blocks == 5 and bm.num_used_blocks == 0
    bm.check_invariants()


def test_sliding_window_blocks_stay_cached_and_a_hit_takes_only_the_live_ones():
    bm = BlockManager(num_blocks=6, block_size=4, sliding_window=6)
    tokens = list(range(13))
    bm.allocate("a", [], 13)
    bm.commit("a", tokens, 13)              # blocks 1 and 2 freed but cached, 3 cached, 4 partial
    assert bm.block_table("a") == [NULL_BLOCK, NULL_BLOCK, 3, 4]
    hit = bm.cached_prefix(tokens)
    assert hit == [1, 2, 3]                 # the whole chain is still there
    assert bm.can_allocate(hit, 13)
    bm.allocate("b", hit, 13)               # the next query (12) reads 7..12: block 1 is dead
    assert bm.block_table("b") == [NULL_BLOCK, 2, 3, 5]
    assert bm.num_free_blocks == 1          # block 1, still cached
    bm.check_invariants()
    bm.deallocate("a")
    bm.deallocate("b")
    assert bm.cached_prefix(tokens) == [1, 2, 3]
    bm.check_invariants()


def test_sliding_window_revives_only_live_cached_blocks():
    bm = BlockManager(num_blocks=7, block_size=4, sliding_window=4)
    tokens = list(range(17))
    bm.allocate("a", [], 17)
    bm.commit("a", tokens, 16)              # reads 13..16 from now on: blocks 1, 2, 3 go
    assert bm.block_table("a") == [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 4, 5]
    bm.allocate("x", [], 4)
    assert bm.block_table("x") == [6] and bm.num_free_blocks == 3      # 1, 2, 3: cached
    hit = bm.cached_prefix(tokens[:16] + [99])
    assert hit == [1, 2, 3, 4]
    # its first query (16) reads 13..16: of the hit only block 4 is live (and a holds it),
    # so one fresh block is all it takes; reviving all four would not fit
    assert bm.can_allocate(hit, 17)
    bm.allocate("b", hit, 17)
    assert bm.block_table("b") == [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 4, 3]   # 3: least recently freed
    assert bm.cached_prefix(tokens) == [1, 2]
    bm.check_invariants()


def test_dropping_the_prefix_cache_frees_every_cached_block_and_forgets_their_hashes():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.allocate("a", [], len(A))
    bm.commit("a", A, len(A))
    try:
        bm.drop_prefix_cache()
        raise AssertionError("dropped while a request holds blocks")
    except RuntimeError as exc:
        assert "1 request(s)" in str(exc)
    bm.deallocate("a")
    assert bm.cached_prefix(A) == [0, 1]
    assert bm.drop_prefix_cache() == 2
    assert bm.cached_prefix(A) == [] and bm.num_free_blocks == 6
    bm.allocate("b", [], 24)                           # every block, none of them stale
    assert sorted(bm.block_table("b")) == list(range(6))
    bm.deallocate("b")
    bm.check_invariants()

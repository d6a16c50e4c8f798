"""Paged KV caches for decode-attention tests, shared by the Triton and the CPU kernel tests."""
from __future__ import annotations

import torch

# Slots no sequence owns hold this; a kernel that reads past a context shows it at once.
POISON = 1e4


def paged_case(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype=torch.float32, seed=0,
               device="cpu"):
    """Caches whose blocks are handed out in shuffled order, spare table entries pointing
    at real (but foreign) blocks, and poisoned slots beyond every context."""
    g = torch.Generator().manual_seed(seed)
    batch = len(context_lens)
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, POISON)
    v_cache = torch.full(shape, POISON)
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.empty(batch, max_blocks, dtype=torch.int32)
    used = 0
    for b, (n, nb) in enumerate(zip(context_lens, blocks_per_seq)):
        mine = order[used:used + nb]
        used += nb
        tables[b, :nb] = mine.int()
        tables[b, nb:] = order[-1].int()       # a spare entry: valid id, never to be read
        flat_k = k_cache[mine].view(-1, num_kv_heads, head_dim)
        flat_v = v_cache[mine].view(-1, num_kv_heads, head_dim)
        flat_k[:n] = torch.randn(n, num_kv_heads, head_dim, generator=g)
        flat_v[:n] = torch.randn(n, num_kv_heads, head_dim, generator=g)
        k_cache[mine] = flat_k.view(nb, block_size, num_kv_heads, head_dim)
        v_cache[mine] = flat_v.view(nb, block_size, num_kv_heads, head_dim)
    q = torch.randn(batch, num_heads, head_dim, generator=g)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    to = dict(device=device)
    return (q.to(dtype=dtype, **to), k_cache.to(dtype=dtype, **to), v_cache.to(dtype=dtype, **to),
            tables.to(**to), lens.to(**to), head_dim ** -0.5)


def drop_outside_window(tables, context_lens, window, block_size):
    """As the block manager does with a sliding window: the entries of blocks wholly before
    each sequence's window point elsewhere, here at the poisoned spare block."""
    tables = tables.clone()
    spare = tables[0, -1].item()
    for b, n in enumerate(context_lens.tolist()):
        tables[b, :max(0, n - window) // block_size] = spare
    return tables

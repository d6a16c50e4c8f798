"""Which tensor-parallel sizes a model's KV heads allow: plain arithmetic, shared by the
control plane's deploy check and the runtime's own (runtime/tensor_parallel/shards.py)."""
from __future__ import annotations

from typing import Optional


def kv_heads_refusal(num_kv_heads: int, size: int) -> Optional[str]:
    """Why `size` ranks cannot share num_kv_heads KV heads, or None: the ranks split them
    evenly, or replicate each on the same number of ranks; neither is possible unless one
    count divides the other."""
    if num_kv_heads % size == 0 or size % num_kv_heads == 0:
        return None
    return (f"{size} and the model's num_key_value_heads ({num_kv_heads}): neither divides the "
            "other; the ranks must split the KV heads evenly or each replicate one")

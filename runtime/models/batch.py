"""What a model reads about one step's batch: the ForwardBatch the model runner builds.

Tokens of all scheduled sequences are packed into one [T] row: prefill chunks first,
then one token per decoding sequence. Block tables index the paged KV cache
(kernels/attention.py has the layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class PrefillMeta:
    num_tokens: int
    query_lens: list[int]
    context_lens: list[int]
    block_tables: Optional[torch.Tensor]   # [S, max_blocks] int32; None: nothing cached yet


@dataclass
class DecodeMeta:
    block_tables: torch.Tensor             # [B, max_blocks] int32
    context_lens: torch.Tensor             # [B] int32, including the token being decoded


@dataclass
class ForwardBatch:
    positions: torch.Tensor                # [T] long
    slot_mapping: torch.Tensor             # [T] long, where each token's k/v is written
    logits_indices: torch.Tensor           # [N] long, rows whose next token is sampled
    prefill: Optional[PrefillMeta] = None  # rows [0, prefill.num_tokens)
    decode: Optional[DecodeMeta] = None    # the remaining rows, one per sequence
    lora_slots: Optional[torch.Tensor] = None   # [T] long, each row's adapter slot (-1: the base);
                                                # None: no row has an adapter

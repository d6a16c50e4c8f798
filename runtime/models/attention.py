"""Self-attention over the paged KV cache, the block every decoder layer shares.

q, k, v from one fused projection (optional bias: Qwen2); optional RMSNorm of each q and
k head (Qwen3, Gemma 3); rotary; k/v written to the layer's cache; then varlen attention
for the prefill rows and paged decode attention for the rest, each with the layer's
sliding window (None: full) and the model's score soft cap (Gemma 2); the output
projection, summed across tensor-parallel ranks.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from runtime.models.batch import ForwardBatch, PrefillMeta
from runtime.models.rope import Rotary
from runtime.load.quantization import linear
from runtime.lora.weights import LayerLora
from runtime.tensor_parallel.shards import TensorParallel

CosSin = tuple[torch.Tensor, torch.Tensor]      # [T, rotary_dim / 2] each, fp32


class Attention:
    """num_heads / num_kv_heads: this rank's share; scale: of the scores; softcap: c of
    c * tanh(score / c), or None."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 softcap: Optional[float], eps: float, ops: Any, tp: TensorParallel):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.softcap, self.eps = scale, softcap, eps
        self.ops, self.tp = ops, tp

    def __call__(self, x: torch.Tensor, layer: Any, rotary: Rotary, cos_sin: CosSin, window: Optional[int],
                 batch: ForwardBatch, kv_cache: tuple[torch.Tensor, torch.Tensor],
                 lora: Optional[LayerLora] = None) -> torch.Tensor:
        """x [T, H] -> [T, H]; layer: LayerWeights (qkv, qkv_bias, q_norm, k_norm, o);
        lora: the tokens' adapters on this layer's projections."""
        q, k, v = self._qkv(x, layer, rotary, cos_sin, lora)
        k_cache, v_cache = kv_cache
        self.ops.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        parts, n = [], 0
        if batch.prefill is not None:
            n = batch.prefill.num_tokens
            parts.append(self._prefill(q, k, v, batch.prefill, k_cache, v_cache, window))
        if batch.decode is not None:
            parts.append(self.ops.paged_decode_attention(
                q[n:], k_cache, v_cache, batch.decode.block_tables, batch.decode.context_lens,
                self.scale, window=window, softcap=self.softcap))
        out = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)).reshape(x.shape[0], -1)
        projected = linear(out, layer.o, None, self.ops)
        return self.tp.all_reduce(projected if lora is None else lora.add("o", projected, out))

    def _qkv(self, x, layer, rotary: Rotary, cos_sin: CosSin,
             lora: Optional[LayerLora]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> q [T, nh, D], k and v [T, nkv, D]; q and k normed and rotated."""
        t, nh, nkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = linear(x, layer.qkv, layer.qkv_bias, self.ops)
        if lora is not None:
            qkv = lora.add("qkv", qkv, x)
        q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
        q, k = q.view(t, nh, d), k.view(t, nkv, d)
        if layer.q_norm is not None:
            q, k = self._head_norm(q, layer.q_norm), self._head_norm(k, layer.k_norm)
        cos, sin = cos_sin
        return rotary.apply(self.ops, q, cos, sin), rotary.apply(self.ops, k, cos, sin), v.view(t, nkv, d)

    def _head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm over each head: x [T, n, D], weight [D]."""
        return self.ops.rms_norm(x.reshape(-1, x.shape[-1]), weight, self.eps).view(x.shape)

    def _prefill(self, q, k, v, meta: PrefillMeta, k_cache, v_cache, window: Optional[int]) -> torch.Tensor:
        n, opts = meta.num_tokens, dict(window=window, softcap=self.softcap)
        if meta.block_tables is None:
            # k/v as the cache holds them (bf16 with kv_cache_dtype="bfloat16"): a token's result
            # is then the same whether its prefix came fresh, from an earlier chunk or cached
            k, v = k[:n].to(k_cache.dtype), v[:n].to(v_cache.dtype)
            return self.ops.prefill_attention(q[:n], k, v, meta.query_lens, self.scale, **opts)
        return self.ops.paged_prefill_attention(q[:n], k_cache, v_cache, meta.block_tables,
                                                meta.query_lens, meta.context_lens, self.scale, **opts)

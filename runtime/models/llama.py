"""One decoder for LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM.

The three differ only in config: GQA, rope scaling (Llama 3), q/k/v bias and tied
embeddings (Qwen2). The model reads everything it needs about the batch from an
explicit ForwardBatch; attention runs over the paged KV cache through kernels/.
Tokens of all scheduled sequences are packed into one [T] row: prefill chunks
first, then one token per decoding sequence.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from kernels.attention import paged_prefill_attention, prefill_attention, write_kv
from kernels.dispatch import get_kernels
from kernels.rotary import rotary_cos_sin
from runtime.config import ModelConfig
from runtime.load_timings import LoadTimings
from runtime.loader import iter_weights
from runtime.quantization import Weight, WeightMemory, linear, pack_layer, quantize_layer, weight_memory
from runtime.tensor_parallel import TensorParallel


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


@dataclass
class LayerWeights:
    """The matmul weights are float tensors, or Int8Weight with quantization="int8"."""
    input_norm: torch.Tensor
    qkv: Weight                            # [(nh + 2*nkv) * D, H]
    qkv_bias: Optional[torch.Tensor]
    o: Weight
    post_norm: torch.Tensor
    gate_up: Weight                        # [2 * I, H]
    down: Weight


class LlamaModel:
    """With tensor parallelism (tp.size > 1) this is one rank's shard: its heads, MLP
    columns and vocabulary rows (runtime/tensor_parallel.py); every rank runs forward()
    on the same batch and all of them return the same full logits."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: str,
                 quantization: Optional[str] = None, tp: TensorParallel = TensorParallel()):
        self.config = config
        self.dtype = dtype
        self.device = device
        self.quantization = quantization       # None or "int8" (EngineConfig validated it)
        self.tp = tp
        self.num_heads = config.num_attention_heads // tp.size         # this rank's share
        self.num_kv_heads = config.num_key_value_heads // tp.size
        self.vocab_start, _, self.vocab_rows = tp.vocab_rows(config.vocab_size)
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        self.inv_freq = rope_inv_freq(config).to(device)
        self.ops = get_kernels(device)     # Triton on CUDA when available, else the references
        self.layers: list[LayerWeights] = []
        self.embed: Optional[torch.Tensor] = None
        self.norm: Optional[torch.Tensor] = None
        self.lm_head: Optional[torch.Tensor] = None

    def load(self, model_dir: str, timings: LoadTimings) -> None:
        since = time.perf_counter()
        # int8: read the floats into host memory so that the device only ever holds
        # one float matrix at a time, not the whole full-precision model
        where = "cpu" if self.quantization else self.device
        raw = dict(iter_weights(model_dir, self.dtype, where,
                                lambda name: self.tp.shard_of(name, self.config)))
        since = timings.record("read_weights", since)
        self._assemble(raw)
        timings.record("assemble", since)

    def _assemble(self, raw: dict[str, torch.Tensor]) -> None:
        cfg = self.config
        dev = self.device
        self.embed = self._vocab_padded(raw.pop("model.embed_tokens.weight")).to(dev)
        self.norm = raw.pop("model.norm.weight").to(dev)
        head = raw.pop("lm_head.weight", None)
        tied = cfg.tie_word_embeddings or head is None
        # a tied head stays the embedding itself: packing it would keep a second copy
        self.lm_head = self.embed if tied else self.ops.pack_linear(self._vocab_padded(head).to(dev))
        # quantized (or packed) layer by layer, so the float copies are freed as we go
        self.layers = [self._placed(self._layer(raw, f"model.layers.{i}."))
                       for i in range(cfg.num_hidden_layers)]

    def _placed(self, layer: LayerWeights) -> LayerWeights:
        """Float matmuls are packed for the kernels' linear; int8: the layer was read on the
        CPU, its matmuls are quantized and all of it moved to the device."""
        if self.quantization is None:
            return pack_layer(layer, self.ops.pack_linear)
        layer = quantize_layer(layer, self.device)
        return dataclasses.replace(layer, **{
            f.name: getattr(layer, f.name).to(self.device) for f in dataclasses.fields(layer)
            if isinstance(getattr(layer, f.name), torch.Tensor)})

    def _vocab_padded(self, rows: torch.Tensor) -> torch.Tensor:
        """The last rank's vocabulary slice grows zero rows up to the common slice size."""
        missing = self.vocab_rows - rows.shape[0]
        return F.pad(rows, (0, 0, 0, missing)) if missing else rows

    def weight_memory(self) -> WeightMemory:
        return weight_memory(self.layers, (self.embed, self.norm, self.lm_head))

    def _layer(self, raw: dict[str, torch.Tensor], p: str) -> LayerWeights:
        attn = p + "self_attn."
        bias = None
        if f"{attn}q_proj.bias" in raw:
            bias = torch.cat([raw.pop(f"{attn}{n}_proj.bias") for n in "qkv"])
        return LayerWeights(
            input_norm=raw.pop(p + "input_layernorm.weight"),
            qkv=torch.cat([raw.pop(f"{attn}{n}_proj.weight") for n in "qkv"]),
            qkv_bias=bias,
            o=raw.pop(attn + "o_proj.weight"),
            post_norm=raw.pop(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([raw.pop(p + "mlp.gate_proj.weight"), raw.pop(p + "mlp.up_proj.weight")]),
            down=raw.pop(p + "mlp.down_proj.weight"),
        )

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (self.config.num_hidden_layers, 2, num_blocks, block_size, self.num_kv_heads, self.head_dim)
        cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return [(cache[i, 0], cache[i, 1]) for i in range(shape[0])]

    def kv_bytes_per_token(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.config.num_hidden_layers * self.num_kv_heads * self.head_dim * elem

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """input_ids [T] -> final hidden states of the rows in batch.logits_indices [N, H]."""
        eps, ops = self.config.rms_norm_eps, self.ops
        cos, sin = rotary_cos_sin(batch.positions, self.inv_freq)
        hidden = self._embed(input_ids)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if residual is None:
                x, residual = ops.rms_norm(hidden, layer.input_norm, eps), hidden
            else:
                x, residual = ops.fused_add_rms_norm(hidden, residual, layer.input_norm, eps)
            hidden = self._attention(x, layer, cos, sin, batch, k_cache, v_cache)
            x, residual = ops.fused_add_rms_norm(hidden, residual, layer.post_norm, eps)
            hidden = self._mlp(x, layer)
        hidden = (hidden + residual).index_select(0, batch.logits_indices)
        return ops.rms_norm(hidden, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.ops.linear(hidden, self.lm_head).float()    # [N, V / tp]
        return self.tp.gather_columns(local, self.config.vocab_size)   # [N, V]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.embed)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        hidden = F.embedding(local.clamp(0, self.vocab_rows - 1), self.embed)
        return self.tp.all_reduce(hidden * mine.unsqueeze(-1).to(hidden.dtype))

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gated = self.ops.silu_and_mul(linear(x, layer.gate_up, None, self.ops))
        return self.tp.all_reduce(linear(gated, layer.down, None, self.ops))

    def _attention(self, x, layer, cos, sin, batch, k_cache, v_cache) -> torch.Tensor:
        t = x.shape[0]
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = linear(x, layer.qkv, layer.qkv_bias, self.ops)
        q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
        q = self.ops.apply_rotary(q.view(t, nh, d), cos, sin)
        k = self.ops.apply_rotary(k.view(t, nkv, d), cos, sin)
        v = v.view(t, nkv, d)
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        parts = []
        if batch.prefill is not None:
            parts.append(self._prefill_attention(q, k, v, batch.prefill, k_cache, v_cache))
        if batch.decode is not None:
            n = batch.prefill.num_tokens if batch.prefill is not None else 0
            parts.append(self.ops.paged_decode_attention(
                q[n:], k_cache, v_cache, batch.decode.block_tables, batch.decode.context_lens,
                self.scale))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return self.tp.all_reduce(linear(out.reshape(t, nh * d), layer.o, None, self.ops))

    def _prefill_attention(self, q, k, v, meta: PrefillMeta, k_cache, v_cache) -> torch.Tensor:
        n = meta.num_tokens
        if meta.block_tables is None:
            return prefill_attention(q[:n], k[:n], v[:n], meta.query_lens, self.scale)
        return paged_prefill_attention(q[:n], k_cache, v_cache, meta.block_tables,
                                       meta.query_lens, meta.context_lens, self.scale)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """[head_dim/2] fp32, computed exactly as transformers does (default, linear, llama3)."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    return _llama3(inv, s)


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    import math
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)

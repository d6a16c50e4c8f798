"""The decoder every served architecture shares, run over the paged KV cache.

One layer, on the residual stream h (the parts in brackets are optional):
    a = attention(rms_norm(h, attn_norm))     [a = rms_norm(a, attn_out_norm): Gemma]
    h = h + a
    m = mlp(rms_norm(h, mlp_norm))            [m = rms_norm(m, mlp_out_norm): Gemma]
    h = h + m
where the MLP is gated (SwiGLU or GeGLU) or a sparse mixture of experts (Mixtral,
Qwen3-MoE), and attention has optional q/k norms, a bias, a sliding window per layer and
a score cap (runtime/models/attention.py). The sum h is carried as (delta, residual) so
that every add fuses into the norm after it (fused_add_rms_norm).

The architectures differ in how a checkpoint names its weights, read into LayerWeights by
`_layer` of each model class (llama.py, gemma.py, phi3.py, mixtral.py), and in three
constants: the embedding scale, the RMSNorm weight offset (Gemma stores w - 1) and the
final logit cap. The model reads everything about the batch from an explicit ForwardBatch.
"""
from __future__ import annotations

import copy
import dataclasses
import mmap
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from kernels.cpu.linear import BATCH_HINT
from kernels.cpu.features import detect as detect_cpu
from kernels.dispatch import KernelSet, batch_invariant_kernels, every_channel_w8a8, get_kernels
from runtime.core.config import ModelConfig
from runtime.load.timings import LoadTimings
from runtime.models.kv_memory import zeros_untouched
from runtime.load.weights import read_weights
from runtime.models.attention import Attention
from runtime.load import smoothing
from runtime.models.batch import ForwardBatch, PrefillMeta
from runtime.models.mlp import GatedMLP, SparseMoE
from runtime.models.rope import Rotary, make_rotary
from runtime.load.packed_weights import PackedWeightCache, cache_key
from runtime.load.threads import in_background, parallel_map
from kernels.group_quant import GroupQuantized, dequantize_rows
from runtime.load.checkpoint_formats import checkpoint_format
from runtime.load.quantization import (Weight, WeightMemory, linear, map_weight, pack_layer, quantize_layer,
                                       stack_rows, weight_memory)
from runtime.tensor_parallel.shards import TensorParallel
from runtime.lora.weights import LayerLora, LoraWeights

KVCache = tuple[torch.Tensor, torch.Tensor]        # one layer's k_cache, v_cache
CosSinByRope = dict[Rotary, tuple[torch.Tensor, torch.Tensor]]   # [T, rotary_dim / 2] each


@dataclass
class LayerWeights:
    """One layer. Its matmuls (runtime/load/quantization.py's LINEAR_FIELDS) are float tensors
    packed for the kernels' linear, Int8Weight with quantization="int8", or a quantized
    checkpoint's weights as it stores them."""
    attn_norm: torch.Tensor                          # [H]
    qkv: Weight                                      # [(nh + 2*nkv) * D, H]
    o: Weight                                        # [H, nh * D]
    mlp_norm: torch.Tensor                           # [H]
    gate_up: Optional[Weight] = None                 # [2 * I, H]; None: the layer has experts
    down: Optional[Weight] = None                    # [H, I]
    qkv_bias: Optional[torch.Tensor] = None          # [(nh + 2*nkv) * D]
    q_norm: Optional[torch.Tensor] = None            # [D]
    k_norm: Optional[torch.Tensor] = None            # [D]
    attn_out_norm: Optional[torch.Tensor] = None     # [H]
    mlp_out_norm: Optional[torch.Tensor] = None      # [H]
    router: Optional[torch.Tensor] = None            # [E, H]
    experts_gate_up: Optional[torch.Tensor] = None   # [E, 2 * I, H]
    experts_down: Optional[torch.Tensor] = None      # [E, H, I]


class DecoderModel:
    """With tensor parallelism (tp.size > 1) this is one rank's shard: its heads, MLP
    columns and vocabulary rows (runtime/tensor_parallel/shards.py); every rank runs forward()
    on the same batch and all of them return the same full logits. context_len: the
    replica's max_model_len (it picks LongRoPE's factors, runtime/models/rope.py)."""

    scaled_embedding: bool = False         # Gemma: embeddings are scaled by sqrt(hidden_size)
    norm_offset: float = 0.0               # Gemma: RMSNorm weights are stored as w - 1

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: str,
                 quantization: Optional[str] = None, tp: Optional[TensorParallel] = None,
                 context_len: Optional[int] = None, batch_invariant: bool = False,
                 low_precision: bool = False):
        self.tp = tp = tp or TensorParallel()          # a single rank unless given
        self.config, self.dtype, self.device = config, dtype, device
        self.quantization = quantization       # None or "int8" (EngineConfig validated it)
        self.checkpoint = checkpoint_format(config.quantization_config)
        if self.checkpoint is not None:
            _refuse_with_quantized_checkpoint(self.checkpoint.name, quantization, tp, batch_invariant)
        kv_start, kv_stop = tp.kv_heads(config.num_key_value_heads)
        self.num_kv_heads = kv_stop - kv_start      # this rank's share, or its one replicated head
        self.vocab_start, _, self.vocab_rows = tp.vocab_rows(config.vocab_size)
        # Triton on CUDA when available, C on the CPU (bf16 / W8A8 GEMMs where the CPU has
        # them and low_precision asks), else references
        ops = get_kernels(device, features=detect_cpu() if low_precision else None)
        self.low_precision = low_precision
        if batch_invariant:
            if config.moe is not None or quantization is not None or dtype != torch.float32:
                raise ValueError("batch_invariant: float32 dense models only (no int8, no MoE)")
            ops = batch_invariant_kernels(ops)
        # int8 weights under W8A8 are smoothed at load and quantize every channel
        # (runtime/load/smoothing.py); dense single-rank models only: the calibration forward
        # runs on this rank alone
        smoothed = every_channel_w8a8(ops) if quantization == "int8" and tp.size == 1 and config.moe is None \
            else None
        self.smoothing = smoothed is not None
        self._use_kernels(smoothed or ops)
        self.moe = SparseMoE(config.moe) if config.moe is not None else None
        self.windows = config.layer_windows or (None,) * config.num_hidden_layers
        rotary = make_rotary(config, device, context_len)
        local = make_rotary(config, device, local=True) if config.local_rope_theta is not None else rotary
        self.rotaries = [rotary if w is None else local for w in self.windows]
        self.layers: list[LayerWeights] = []
        self.embed: Optional[Weight] = None
        self.norm: Optional[torch.Tensor] = None
        self.lm_head: Optional[Weight] = None
        self.packed_mapping: Optional[mmap.mmap] = None     # the cache file the layers live in
        self.packed_writer: Optional[Future[int]] = None    # the cache file being written
        self.lora: Optional[LoraWeights] = None             # the adapter slots, where the engine has some

    def _use_kernels(self, ops: KernelSet) -> None:
        """Run with `ops`: the blocks hold their kernels."""
        config = self.config
        self.ops = ops
        scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.attention = Attention(config.num_attention_heads // self.tp.size, self.num_kv_heads, config.head_dim,
                                   scale, config.attn_logit_softcap, config.rms_norm_eps, ops, self.tp)
        act = {"silu": ops.silu_and_mul, "gelu_tanh": ops.gelu_and_mul}[config.hidden_act]
        self.mlp = GatedMLP(act, ops, self.tp)

    # ---- loading

    def load(self, model_dir: str, timings: LoadTimings, packed: Optional[PackedWeightCache] = None) -> None:
        """packed: the node's cache of packed layers (CPU), read from and filled."""
        # int8: read the floats into host memory so that the device only ever holds
        # the float matrices of the layers being quantized, not the whole model
        where = "cpu" if self.quantization else self.device
        raw = read_weights(model_dir, self.dtype, where, timings,
                           lambda name: self.tp.shard_of(name, self.config),
                           keep=self.checkpoint.keep if self.checkpoint is not None else None)
        since = time.perf_counter()
        if self.checkpoint is not None:
            raw = self.checkpoint.gather(raw, self.dtype)
        self._assemble(raw)
        since = timings.record("assemble", since)
        key = cache_key(model_dir, self._packing_identity()) if packed is not None else None
        mapped = packed.load(key, LayerWeights) if packed is not None and key is not None else None
        if mapped is not None:
            self.layers, self.packed_mapping = mapped.layers, mapped.mapping
            timings.record("pack", since)
            return
        # layers are independent, and fusing, packing or quantizing one lets go of the
        # GIL: one thread per CPU; each layer's float copies are freed as it is placed
        if self.smoothing:
            floats: list[Optional[LayerWeights]] = [self._layer(raw, i)
                                                    for i in range(self.config.num_hidden_layers)]
            calibration = self._calibrate([layer for layer in floats if layer is not None])
            since = timings.record("calibrate", since)
            self.layers = self._smoothed(floats, calibration)
        else:
            self.layers = parallel_map(lambda i: self._placed(self._layer(raw, i)),
                                       range(self.config.num_hidden_layers))
        timings.record("pack", since)
        if packed is not None and key is not None:
            # written after the load, beside the first requests: a cold start never waits on it
            self.packed_writer = in_background(packed.store, key, list(self.layers))

    def _smoothed(self, floats: list[Optional[LayerWeights]],
                  calibration: smoothing.Calibration) -> list[LayerWeights]:
        """Every layer placed (quantized) with its smoothing folded in (runtime/load/smoothing.py).
        Each float layer is let go once placed, and two at most are folded at once, so the
        fold's float32 copies exist for two layers at a time."""
        heads = smoothing.Heads(self.config.num_attention_heads, self.num_kv_heads, self.config.head_dim)

        def place(i: int) -> LayerWeights:
            layer, floats[i] = floats[i], None
            assert layer is not None
            return self._placed(smoothing.fold(layer, calibration, heads))
        return parallel_map(place, range(len(floats)), workers=2)

    def _calibrate(self, layers: list[LayerWeights]) -> smoothing.Calibration:
        """max|x| per input channel of every matmul, over smoothing's calibration ids run
        through the float `layers` in one forward: sequences of at most CALIBRATION_WINDOW
        tokens (within the model's positions), each a fresh prefill, so that every weight
        is used, and packed for the kernels, once."""
        calibration = smoothing.Calibration(self.ops.pack_linear, self.ops.linear)
        view = copy.copy(self)              # this model over the float layers, recording
        view._use_kernels(dataclasses.replace(self.ops, linear=calibration.linear))
        view.layers = layers
        ids = smoothing.calibration_ids(self.config.vocab_size)
        window = min(smoothing.CALIBRATION_WINDOW, self.config.max_position_embeddings)
        lens = [min(window, len(ids) - begin) for begin in range(0, len(ids), window)]
        block = 16
        kv_caches = view.allocate_kv_cache(-(-len(ids) // block), block)
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        slots = torch.arange(len(ids), device=self.device)
        batch = ForwardBatch(positions=positions, slot_mapping=slots, logits_indices=slots[-1:],
                             prefill=PrefillMeta(num_tokens=len(ids), query_lens=lens, context_lens=lens,
                                                 block_tables=None))
        with torch.inference_mode():
            view.forward(torch.tensor(ids, device=self.device), batch, kv_caches)
        return calibration

    def _packing_identity(self) -> dict:
        """What, besides the weight files, the torch build and the CPU, decides the packed bytes."""
        return {"model": type(self).__name__, "dtype": str(self.dtype), "quantization": self.quantization,
                "rank": self.tp.rank, "ranks": self.tp.size, "kernels": self.ops.backend,
                "low_precision": self.low_precision,
                "smoothing": smoothing.identity() if self.smoothing else None,
                "batch_hint": BATCH_HINT}

    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        """Layer i's weights, popped from the checkpoint's tensors (per architecture)."""
        raise NotImplementedError

    def _assemble(self, raw: dict[str, Weight]) -> None:
        """Everything but the layers: embedding, final norm, head."""
        dev = self.device
        self.embed = map_weight(self._vocab_padded(raw.pop("model.embed_tokens.weight")), lambda t: t.to(dev))
        self.norm = self._norm(raw, "model.norm.weight").to(dev)
        head = raw.pop("lm_head.weight", None)
        tied = self.config.tie_word_embeddings or head is None
        if tied:
            self.lm_head = self._tied_head()
        elif isinstance(head, torch.Tensor):
            self.lm_head = self.ops.pack_linear(self._vocab_padded(head).to(dev))
        else:
            self.lm_head = map_weight(head, lambda t: t.to(dev))

    def _tied_head(self) -> Weight:
        """A tied head stays the embedding itself (packing it in the same precision would
        keep a second copy), unless the linears run in a lower precision: then the head,
        a small model's largest GEMM and a large share of a W8A8 engine's time in fp32,
        gets its own copy in that precision, half the embedding's bytes in bf16."""
        # one row asks the packer what it makes, before a copy of the whole is (a CPU
        # without bf16 GEMMs would pack the embedding again in fp32, to throw it away)
        assert self.embed is not None
        if (not isinstance(self.embed, torch.Tensor) or not self.low_precision
                or self.ops.pack_linear(self.embed[:1]).dtype == self.embed.dtype):
            return self.embed
        packed: torch.Tensor = self.ops.pack_linear(self.embed)
        return packed

    def _norm(self, raw: dict[str, Weight], name: str) -> torch.Tensor:
        weight = raw.pop(name)
        assert isinstance(weight, torch.Tensor), f"{name}: a norm is never quantized"
        return weight + self.norm_offset if self.norm_offset else weight

    def _placed(self, layer: LayerWeights) -> LayerWeights:
        """Float matmuls are packed for the kernels' linear; int8: the layer was read on the
        CPU, its matmuls are quantized and all of it moved to the device."""
        if self.quantization is None:
            packed = pack_layer(layer, self.ops.pack_linear)     # a checkpoint's quantized weights stay
            return dataclasses.replace(packed, **{
                f.name: map_weight(getattr(packed, f.name), lambda t: t.to(self.device))
                for f in dataclasses.fields(packed) if getattr(packed, f.name) is not None})
        layer = quantize_layer(layer, self.device)
        return dataclasses.replace(layer, **{
            f.name: getattr(layer, f.name).to(self.device) for f in dataclasses.fields(layer)
            if isinstance(getattr(layer, f.name), torch.Tensor)})

    def _vocab_padded(self, rows: Weight) -> Weight:
        """The last rank's vocabulary slice grows zero rows up to the common slice size."""
        if not isinstance(rows, torch.Tensor):
            return rows                    # quantized checkpoints run on one rank
        missing = self.vocab_rows - rows.shape[0]
        return F.pad(rows, (0, 0, 0, missing)) if missing else rows

    def weight_memory(self) -> WeightMemory:
        return weight_memory(self.layers, (self.embed, self.norm, self.lm_head))

    def move_weights(self, move: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every weight tensor t by move(t) (a sleeping replica's weights go to host
        memory and back); a tensor shared by two fields (a tied head) stays shared."""
        moved: dict[int, torch.Tensor] = {}

        def one(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in moved:
                moved[id(t)] = move(t)
            return moved[id(t)]

        def field(value):
            return value if value is None else map_weight(value, one)

        self.layers = [dataclasses.replace(layer, **{f.name: field(getattr(layer, f.name))
                                                     for f in dataclasses.fields(layer)})
                       for layer in self.layers]
        self.embed, self.norm, self.lm_head = (field(t) for t in (self.embed, self.norm, self.lm_head))

    # ---- the KV cache

    def allocate_kv_cache(self, num_blocks: int, block_size: int,
                          dtype: Optional[torch.dtype] = None) -> list[KVCache]:
        """dtype: the cache's (default: the model's; kernels/attention.py reads a narrower one)."""
        shape = (self.config.num_hidden_layers, 2, num_blocks, block_size, self.num_kv_heads,
                 self.config.head_dim)
        cache = zeros_untouched(shape, dtype or self.dtype, self.device)
        return [(cache[i, 0], cache[i, 1]) for i in range(shape[0])]

    def kv_bytes_per_token(self, dtype: Optional[torch.dtype] = None) -> int:
        elem = torch.tensor([], dtype=dtype or self.dtype).element_size()
        return 2 * self.config.num_hidden_layers * self.num_kv_heads * self.config.head_dim * elem

    # ---- forward

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, kv_caches: list[KVCache]) -> torch.Tensor:
        """input_ids [T] -> final hidden states of the rows in batch.logits_indices [N, H]."""
        hidden, cos_sin = self.layer_inputs(input_ids, batch)
        return self.final_hidden(*self.run_layers(hidden, cos_sin, batch, kv_caches), batch)

    # The forward's three parts, apart for runtime/engine/cpu_replay.py, which records the
    # layers' kernel calls once and replays them with new inputs.

    def layer_inputs(self, input_ids: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, CosSinByRope]:
        """The embedded rows [T, H], and cos and sin of the positions for each rope."""
        return self._embed(input_ids), {r: r.cos_sin(batch.positions) for r in set(self.rotaries)}

    def run_layers(self, hidden: torch.Tensor, cos_sin: CosSinByRope, batch: ForwardBatch,
                   kv_caches: list[KVCache]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer: the last one's output and the residual stream it adds to."""
        residual = hidden
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            rotary, lora = self.rotaries[i], self._lora(i, batch)
            x, residual = self._add_norm(hidden, residual if i else None, layer.attn_norm)
            hidden = self.attention(x, layer, rotary, cos_sin[rotary], self.windows[i], batch, kv_cache, lora)
            hidden = self._out_norm(hidden, layer.attn_out_norm)
            x, residual = self._add_norm(hidden, residual, layer.mlp_norm)
            hidden = self._out_norm(self._feed_forward(x, layer, lora), layer.mlp_out_norm)
        return hidden, residual

    def _lora(self, i: int, batch: ForwardBatch) -> Optional[LayerLora]:
        if self.lora is None or batch.lora_slots is None:
            return None
        return LayerLora(self.lora.layers[i], batch.lora_slots, self.ops.lora_delta)

    def final_hidden(self, hidden: torch.Tensor, residual: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        hidden = (hidden + residual).index_select(0, batch.logits_indices)
        return self.ops.rms_norm(hidden, self.norm, self.config.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.lm_head is not None
        local = linear(hidden, self.lm_head, None, self.ops).float()    # [N, V / tp]
        logits = self.tp.gather_columns(local, self.config.vocab_size)   # [N, V]
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _add_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                  weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual), x + residual); the first layer has no residual yet."""
        if residual is None:
            return self.ops.rms_norm(x, weight, self.config.rms_norm_eps), x
        return self.ops.fused_add_rms_norm(x, residual, weight, self.config.rms_norm_eps)

    def _out_norm(self, x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
        return x if weight is None else self.ops.rms_norm(x, weight, self.config.rms_norm_eps)

    def _feed_forward(self, x: torch.Tensor, layer: LayerWeights, lora: Optional[LayerLora]) -> torch.Tensor:
        if layer.router is None:
            return self.mlp(x, layer, lora)
        assert self.moe is not None
        return self.moe(x, layer)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self._embed_rows(input_ids)
        if not self.scaled_embedding:
            return hidden
        return hidden * torch.tensor(self.config.hidden_size ** 0.5, dtype=hidden.dtype)

    def _embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, GroupQuantized):
            return dequantize_rows(self.embed, input_ids).to(self.dtype)
        assert isinstance(self.embed, torch.Tensor)
        if self.tp.size == 1:
            return F.embedding(input_ids, self.embed)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        hidden = F.embedding(local.clamp(0, self.vocab_rows - 1), self.embed)
        return self.tp.all_reduce(hidden * mine.unsqueeze(-1).to(hidden.dtype))


def _refuse_with_quantized_checkpoint(name: str, quantization: Optional[str], tp: TensorParallel,
                                      batch_invariant: bool) -> None:
    """What a checkpoint stored quantized does not run with, named."""
    if quantization is not None:
        raise ValueError(f"quantization: the checkpoint is quantized already ({name}); leave quantization unset")
    if tp.size > 1:
        raise ValueError(f"tensor_parallel_size: a quantized checkpoint ({name}) runs on one rank")
    if batch_invariant:
        raise ValueError(f"batch_invariant: float32 dense models only, not a quantized checkpoint ({name})")


# ---- reading a checkpoint's layer (shared by the model classes)

Norm = Callable[[dict[str, torch.Tensor], str], torch.Tensor]


def pre_norms(raw: dict[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """Llama's two norms of layer prefix p: before attention and before the MLP."""
    return dict(attn_norm=raw.pop(p + "input_layernorm.weight"),
                mlp_norm=raw.pop(p + "post_attention_layernorm.weight"))


def split_attention(raw: dict[str, torch.Tensor], p: str, norm: Norm) -> dict[str, Optional[torch.Tensor]]:
    """LayerWeights' attention fields from separate q/k/v projections under prefix p
    (optional biases: Qwen2; optional q_norm/k_norm: Qwen3, Gemma 3)."""
    bias = None
    if f"{p}q_proj.bias" in raw:
        bias = torch.cat([raw.pop(f"{p}{n}_proj.bias") for n in "qkv"])
    has_norm = f"{p}q_norm.weight" in raw
    return dict(qkv=stack_rows([raw.pop(f"{p}{n}_proj.weight") for n in "qkv"]), qkv_bias=bias,
                o=raw.pop(p + "o_proj.weight"),
                q_norm=norm(raw, p + "q_norm.weight") if has_norm else None,
                k_norm=norm(raw, p + "k_norm.weight") if has_norm else None)


def split_mlp(raw: dict[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """LayerWeights' gated-MLP fields from gate_proj, up_proj, down_proj under prefix p."""
    return dict(gate_up=stack_rows([raw.pop(p + "gate_proj.weight"), raw.pop(p + "up_proj.weight")]),
                down=raw.pop(p + "down_proj.weight"))

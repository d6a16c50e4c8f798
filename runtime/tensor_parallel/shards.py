"""Tensor parallelism (Megatron style): which slice of each weight a rank holds, and
the collectives that put the slices back together. The slicing is plain arithmetic
(no torch); torch.distributed is imported only by the collectives.

Per decoder layer: q/k/v and gate/up are column-parallel (each rank holds a contiguous
group of heads, or of MLP columns, and computes them alone; with more ranks than KV
heads each rank keeps the one KV head its query heads read, as vLLM does); o and down are
row-parallel (each rank multiplies its slice of the input features, then one
all-reduce sums the partial outputs). The embedding and the lm head are split by
vocabulary rows: a rank embeds only the ids it holds (the rest are zero, the
all-reduce fills them in) and computes only its slice of the logits (an all-gather
joins them). Two all-reduces per layer, one all-gather per step.

A rank reads only its slices from the safetensors (`shard_of` gives the rows or
columns of a checkpoint tensor), so each holds about 1/N of the weights.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from runtime.core.config import ModelConfig
from spec.tensor_parallel import kv_heads_refusal

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Shard:
    """Rows (dim 0) or columns (dim 1) [start, stop) of a checkpoint tensor."""
    dim: int
    start: int
    stop: int


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    init_method: Optional[str] = None          # tcp://127.0.0.1:PORT when size > 1

    # -- which slice (pure arithmetic) --------------------------------------------

    def split(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share of n items; the first n % size ranks get one more."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """[start, stop) of the KV heads this rank holds: its share when they are at least as
        many as the ranks; else (MQA, or GQA with few KV heads) the one head that all of its
        query heads read, replicated on size // num_kv_heads ranks (check_divisible)."""
        if num_kv_heads >= self.size:
            return self.split(num_kv_heads)
        head = self.rank * num_kv_heads // self.size
        return head, head + 1

    def vocab_rows(self, vocab_size: int) -> tuple[int, int, int]:
        """(start, stop, padded): equal-sized vocab slices so that the logits all-gather
        is even; the last rank's slice is padded with zero rows past the vocabulary."""
        padded = -(-vocab_size // self.size)
        start = self.rank * padded
        return start, min(vocab_size, start + padded), padded

    def shard_of(self, name: str, config: ModelConfig) -> Optional[Shard]:
        """The slice of checkpoint tensor `name` this rank loads; None: the whole tensor."""
        if self.size == 1:
            return None
        d = config.head_dim
        kind = name.rsplit(".", 2)[-2]            # e.g. "q_proj" of "...self_attn.q_proj.weight"
        if kind == "q_proj":
            start, stop = self.split(config.num_attention_heads)
            return Shard(0, start * d, stop * d)
        if kind in ("k_proj", "v_proj"):
            start, stop = self.kv_heads(config.num_key_value_heads)
            return Shard(0, start * d, stop * d)
        if kind == "o_proj":
            start, stop = self.split(config.num_attention_heads)
            return Shard(1, start * d, stop * d)
        if kind in ("gate_proj", "up_proj"):
            return Shard(0, *self.split(config.intermediate_size))
        if kind == "down_proj":
            return Shard(1, *self.split(config.intermediate_size))
        if kind in ("embed_tokens", "lm_head"):
            start, stop, _ = self.vocab_rows(config.vocab_size)
            return Shard(0, start, stop)
        return None                                # norms: every rank holds them whole

    def device(self, device: str) -> str:
        """Rank r of a CUDA replica runs on the r-th visible GPU after the configured one."""
        if not device.startswith("cuda") or self.size == 1:
            return device
        base = int(device.split(":", 1)[1]) if ":" in device else 0
        return f"cuda:{base + self.rank}"

    # -- collectives (identity on one rank) ------------------------------------

    def connect(self, device: str, timeout_s: float = 600.0) -> None:
        """Join the group: NCCL between GPUs, gloo on the CPU. Blocks until every rank has;
        the timeout is generous because a rank may still be reading its shard."""
        if self.size == 1:
            return
        import torch.distributed as dist

        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            import torch
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend, init_method=self.init_method, rank=self.rank,
                                world_size=self.size, timeout=datetime.timedelta(seconds=timeout_s))

    def disconnect(self) -> None:
        import torch.distributed as dist

        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            import torch.distributed as dist
            dist.all_reduce(t)
        return t

    def gather_columns(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """[N, W/size] on every rank -> [N, W] (the first `width` columns) on every rank."""
        if self.size == 1:
            return t
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=-1)[:, :width]

    def min_int(self, value: int, device: str) -> int:
        """The smallest of every rank's value (e.g. how many KV blocks fit everywhere)."""
        if self.size == 1:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def check_divisible(config: ModelConfig, size: int) -> None:
    """Heads are split whole: refuse, by name, a model that does not divide."""
    if size == 1:
        return
    if config.num_attention_heads % size:
        raise ValueError(f"tensor_parallel_size: {size} does not divide the model's "
                         f"num_attention_heads ({config.num_attention_heads})")
    refusal = kv_heads_refusal(config.num_key_value_heads, size)
    if refusal is not None:
        raise ValueError(f"tensor_parallel_size: {refusal}")
    if config.intermediate_size < size:
        raise ValueError(f"tensor_parallel_size: {size} exceeds the model's intermediate_size "
                         f"({config.intermediate_size})")


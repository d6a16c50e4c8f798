"""Seconds per stage of loading a model; torch-free, so the engine imports it before torch.

The stages a replica records, in the order they run (a stage a load does not go
through is absent):

  process      the interpreter starting, up to the start of the load (0 for a standby:
               it started before the load was asked for)
  import       torch, the model code and the engine (~0 for a standby)
  config       config.json, and the eos ids from tokenizer.json's added tokens
  tp_connect   tensor parallelism only: every rank up and connected
  kernels      the compute kernels for the device, built or loaded (~0 for a standby)
  weights      the weight files mapped into memory, every page of them (`weight_bytes`)
  assemble     the model: embedding, final norm, head
  pack         each layer's matmul weights fused and packed for the kernels (or quantized)
  kv_cache     the paged KV cache allocated
  tokenizer    the server's wait for its tokenizer once the engine is loaded: it is
               parsed in the server's process while the engine-core process loads

There is no warm-up forward: the first request's own step is the only one, and its
first token is timed by whoever sends it (benchmarks/cold_start_stages.py).

`summary` turns them into the `/health` load_timings: `<stage>_s` each, `other_s` for the
part of the total no stage recorded, `weights_gbps` and `total_s`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

STAGES = ("process", "import", "config", "tp_connect", "kernels", "weights", "assemble", "calibrate", "pack",
          "kv_cache", "tokenizer")


@dataclass
class LoadTimings:
    stages: dict[str, float] = field(default_factory=dict)
    weight_bytes: int = 0            # bytes the weights stage brought into memory

    def record(self, stage: str, since: float) -> float:
        """Add the time since `since` to `stage`; returns now, the start of the next stage."""
        now = time.perf_counter()
        self.add(stage, now - since)
        return now

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = round(self.stages.get(stage, 0.0) + seconds, 6)

    def weights_gbps(self) -> Optional[float]:
        seconds = self.stages.get("weights")
        if not self.weight_bytes or not seconds:
            return None
        return self.weight_bytes / seconds / 1e9

    def summary(self, total_s: float) -> dict[str, float]:
        """`<stage>_s` of each recorded stage, `other_s` (the rest of total_s), the
        weights' GB/s when known, and `total_s`."""
        out = {f"{stage}_s": s for stage, s in self.stages.items()}
        out["other_s"] = round(max(0.0, total_s - sum(self.stages.values())), 6)
        gbps = self.weights_gbps()
        if gbps is not None:
            out["weights_gbps"] = round(gbps, 3)
        out["total_s"] = round(total_s, 6)
        return out


def process_age_s() -> float:
    """Seconds since this process was started (the kernel's record, 10 ms resolution);
    0.0 where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))

"""How long a replica takes to start and to serve, as functions of its weight bytes.

The simulator never runs a model: a replica is these formulas, with parameters
measured per machine kind (poolsim/params/*.json; `calibrate` measures them on
the machine at hand).

  cold start, by tier (each `fixed_s + bytes / GB/s`):
    s3        the weights downloaded into the node's cache, then a cache load
    cache     a fresh process loads them from the node's cache (process start,
              imports and device init are the fixed part)
    standby   a warm standby process loads them (no process start or imports)
    wake      a sleeping replica's weights back from host memory to the device
  sleep       device to host: how long falling asleep takes
  decode      one step of a batch of b sequences on g GPUs:
              weight_bytes / g / hbm_gbps + b * per_seq_s (bandwidth-bound,
              plus what each sequence adds: its KV reads and sampling)
  prefill     p prompt tokens: p * 2 * parameters / (g * prefill_tflops)
  overhead    what every first token waits for in front of the replica: the hops
              (request_overhead_s) and the control plane's own work for the request
              (gateway_s), one request at a time (its event loop), after the work of
              the requests before it
  contention  CPU slots (stream_s): each other request in flight on the node when one
              begins adds stream_s to its first token, the CPU the others' serving paths
              (client, gateway, Postgres, replica server, engine) take from its own on
              the node's few cores
  queueing    with prefill_step_tokens, a replica's prompts wait for its engine's
              prefill steps of that many tokens (poolsim/simulator.py); without, none

A GPU that several busy replicas share runs their steps in turn: each step takes
as long as the sum (poolsim/simulator.py counts them). CPU slots are no such
GPUs: every busy replica of a node shares its `node_cores` cores (one thread
each), so a step takes busy / node_cores times longer once they outnumber them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

GB = 1e9
PARAMS_DIR = Path(__file__).parent / "params"


@dataclass(frozen=True)
class Transfer:
    fixed_s: float
    gbps: float

    def seconds(self, nbytes: float) -> float:
        return self.fixed_s + nbytes / (self.gbps * GB)


@dataclass(frozen=True)
class ColdStarts:
    s3: Transfer
    cache: Transfer
    standby: Transfer
    wake: Transfer
    sleep: Transfer
    standby_refill_s: float          # a node's next standby is ready this long after one is taken


@dataclass(frozen=True)
class Throughput:
    hbm_gbps: float
    per_seq_s: float
    prefill_tflops: float
    max_batch: int = 256             # sequences one replica runs at once (the engine's max_num_seqs)
    node_cores: int = 0              # CPU slots: the cores a node's busy replicas share; 0: GPUs, per slot
    request_overhead_s: float = 0.0  # before prefill: the hops from the client to the replica
    gateway_s: float = 0.0           # and the gateway's work, one request at a time; 0: none that queues
    prefill_step_tokens: int = 0     # the engine's max_num_batched_tokens: prompts queue for steps; 0: never
    stream_s: float = 0.0            # CPU slots: a first token's delay per other request in flight on the node

    def step_s(self, weight_bytes: float, gpu_count: int, batch: int) -> float:
        return weight_bytes / gpu_count / (self.hbm_gbps * GB) + batch * self.per_seq_s

    def prefill_s(self, parameters: float, gpu_count: int, tokens: int) -> float:
        return tokens * 2.0 * parameters / (gpu_count * self.prefill_tflops * 1e12)


@dataclass(frozen=True)
class GpuKind:
    name: str
    memory_gb: float
    price_per_hour: float            # what one GPU of this kind costs the operator
    gpus_per_node: int
    cold_starts: ColdStarts
    throughput: Throughput
    source: str = ""                 # where the figures come from

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1024 ** 3)


def gpu_kind(name: str) -> GpuKind:
    """A kind from poolsim/params/<name>.json."""
    path = PARAMS_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PARAMS_DIR.glob("*.json")))
        raise ValueError(f"no parameters for GPU kind {name!r} (known: {known})")
    return from_json(json.loads(path.read_text()))


def from_json(raw: Mapping[str, Any]) -> GpuKind:
    starts = raw["cold_starts"]
    stages = {f.name: Transfer(**starts[f.name]) for f in fields(ColdStarts) if f.name != "standby_refill_s"}
    cold = ColdStarts(**stages, standby_refill_s=float(starts["standby_refill_s"]))
    return GpuKind(raw["name"], float(raw["memory_gb"]), float(raw["price_per_hour"]), int(raw["gpus_per_node"]),
                   cold, Throughput(**raw["throughput"]), raw.get("source", ""))


def to_json(kind: GpuKind) -> dict[str, Any]:
    def transfer(t: Transfer) -> dict[str, float]:
        return {"fixed_s": t.fixed_s, "gbps": t.gbps}
    c = kind.cold_starts
    return {"name": kind.name, "memory_gb": kind.memory_gb, "price_per_hour": kind.price_per_hour,
            "gpus_per_node": kind.gpus_per_node, "source": kind.source,
            "cold_starts": {"s3": transfer(c.s3), "cache": transfer(c.cache), "standby": transfer(c.standby),
                            "wake": transfer(c.wake), "sleep": transfer(c.sleep),
                            "standby_refill_s": c.standby_refill_s},
            "throughput": {"hbm_gbps": kind.throughput.hbm_gbps, "per_seq_s": kind.throughput.per_seq_s,
                           "prefill_tflops": kind.throughput.prefill_tflops,
                           "max_batch": kind.throughput.max_batch, "node_cores": kind.throughput.node_cores,
                           "request_overhead_s": kind.throughput.request_overhead_s,
                           "gateway_s": kind.throughput.gateway_s,
                           "prefill_step_tokens": kind.throughput.prefill_step_tokens,
                           "stream_s": kind.throughput.stream_s}}

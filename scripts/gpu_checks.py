"""The checks of scripts/gpu_check.py, each run in a child process of its own on a GPU.

Each takes the model folders (`Models`) and the device ("cuda"; "cpu" only to test
the checks themselves) and returns (passed, figures). They reuse what the CPU suite
already has: the Triton kernel tests (run with TRITON_INTERPRET=0, so on the GPU), the
exactness prompts and engine limits of tests/runtime/exactness.py, and the model and
workload of benchmarks/engine_throughput.py. Before any of them runs a kernel,
triton_compile runs those tests and a short generate of each engine configuration
(WARM_ENGINES) in processes of their own, all at once, so that Triton's compile cache
is warm and each later check's time is its run time.

The models: a trained one when there is one (SmolLM2-135M-Instruct once `make model`
has imported it, or --model), else random ones: a small Llama for exactness and int8
(4 layers, hidden 128: with random weights a wider or deeper one amplifies every
rounding, so that transformers' own bf16 error reaches 0.7 nats and tells nothing),
and the throughput benchmark's 50M Llama for speed. Tensor parallelism always runs the
small one (4 heads / 2 KV heads split over 2 ranks; SmolLM2's 9 / 3 do not).

Exactness in half precision is a tolerance, not token equality: the engine's logprob
of each token it chose, and that token's rank, are compared with transformers in
float32 on CUDA (teacher-forced on the engine's own tokens, so one early near-tie does
not derail the rest), against transformers' own error in the same half dtype: the
engine passes when its error is within twice transformers' (plus 0.01) and it never
chose a token fp32 ranks further than that below its best.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import subprocess
import sys
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
Outcome = tuple[bool, str]
Sequences = list[tuple[list[int], list[int]]]      # (prompt, generated) per request
SMALL_SPEC: dict[str, Any] = dict(arch="llama", hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, max_position_embeddings=1024)


@dataclass(frozen=True)
class Models:
    """Where the model folders are: random ones made under `folder`, or a trained `given` one."""
    folder: Path
    given: Optional[Path] = None

    @property
    def small(self) -> Path:          # exactness, int8
        return self.given or self.folder / "small"

    @property
    def bench(self) -> Path:          # throughput
        return self.given or self.folder / "bench"

    @property
    def tensor_parallel(self) -> Path:
        return self.folder / "small"


# ---------------------------------------------------------------- comparing logprobs

@dataclass(frozen=True)
class Agreement:
    """Chosen-token logprobs against a float32 reference, over every step of every request."""
    max_err: float          # max |ours - reference| of the chosen token's logprob
    mean_err: float
    worst_gap: float        # max (reference best - reference of the chosen token): 0 when greedy agrees
    argmax_steps: int       # steps where the chosen token is the reference's argmax
    steps: int


def agreement(chosen: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]],
              reference: Sequence[torch.Tensor]) -> Agreement:
    """chosen[r][t]: our logprob of tokens[r][t]; reference[r]: [T, V] float32 logprobs."""
    errs, gaps, argmax = [], [], 0
    for ours, ids, ref in zip(chosen, tokens, reference):
        index = torch.tensor(list(ids), dtype=torch.long)
        theirs = ref.gather(1, index[:, None])[:, 0]
        errs.append((torch.tensor(list(ours), dtype=torch.float32) - theirs).abs())
        gaps.append(ref.max(dim=1).values - theirs)
        argmax += int((ref.argmax(dim=1) == index).sum())
    err, gap = torch.cat(errs), torch.cat(gaps)
    return Agreement(float(err.max()), float(err.mean()), float(gap.max()), argmax, int(err.numel()))


def close_enough(ours: Agreement, peer: Agreement, floor: float = 0.01) -> tuple[bool, float]:
    """(passed, tolerance): ours within twice the peer's error in the same dtype, plus floor."""
    tolerance = 2 * peer.max_err + floor
    return ours.max_err <= tolerance and ours.worst_gap <= tolerance, tolerance


def describe(a: Agreement) -> str:
    return (f"max {a.max_err:.4f} mean {a.mean_err:.5f}, greedy = fp32 argmax {a.argmax_steps}/{a.steps}"
            f" (worst gap {a.worst_gap:.4f})")


# ---------------------------------------------------------------- helpers on the GPU

def hf_logprobs(model_dir: Path, device: str, dtype: torch.dtype, seqs: Sequences) -> list[torch.Tensor]:
    """transformers on the device, teacher-forced: [len(generated), V] float32 logprobs per request."""
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()
    out = []
    with torch.inference_mode():
        for prompt, generated in seqs:
            ids = torch.tensor([prompt + generated], device=device)
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
            out.append(torch.log_softmax(logits, dim=-1).cpu())
    del model
    _free(device)
    return out


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _llm(model_dir: Path, device: str, **engine: Any) -> Any:
    from runtime import LLM

    return LLM(str(model_dir), **{"device": device, "kv_cache_tokens": 4096, **engine})


def _greedy(max_tokens: int, logprobs: Optional[int] = None) -> Any:
    from runtime import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """fn(*args) and its seconds on the GPU's clock (synchronized before and after)."""
    _sync()
    started = time.perf_counter()
    value = fn(*args)
    _sync()
    return value, time.perf_counter() - started


# ---------------------------------------------------------------- the checks

def random_models(models: Models, device: str) -> Outcome:
    from benchmarks.engine_throughput import BENCH_SPEC
    from tests.support.model_factory import make_model

    made: dict[str, dict[str, Any]] = {"small": SMALL_SPEC}
    if not models.given:
        made["bench"] = BENCH_SPEC
    for name, spec in made.items():
        make_model(models.folder / name, **spec)
    sizes = [f"{name} {_parameters(models.folder / name) / 1e6:.1f}M parameters" for name in made]
    trained = f"; trained model {models.given}" if models.given else ""
    return True, f"random Llamas: {', '.join(sizes)}{trained}"


def _parameters(model_dir: Path) -> float:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 4      # float32


class _Tally:
    """A pytest plugin counting outcomes."""

    def __init__(self) -> None:
        self.passed, self.skipped = 0, 0
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.failed.append(report.nodeid.split("::", 1)[-1])
        elif report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.passed += 1


def triton_cache_dir() -> Path:
    """Where Triton keeps its compiled kernels (TRITON_CACHE_DIR, else its default)."""
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def compiled_kernels(cache: Path) -> set[str]:
    """The compiled kernels in Triton's cache: one folder with a cubin per compile."""
    return {p.parent.name for p in cache.glob("*/*.cubin")} if cache.is_dir() else set()


def triton_test_files() -> list[str]:
    from scripts.gpu_check import TRITON_TESTS

    return [str(REPO / "tests" / "kernels" / f"test_triton_{name}.py") for name in TRITON_TESTS]


def triton_compile(models: Models, device: str) -> Outcome:
    """Warm Triton's cache with what the later checks run: each kernel test file, and a
    short generate of each engine configuration, each a process of its own, all at once.
    Passes when every process did; its figures: the kernels compiled and their time."""
    cache = triton_cache_dir()
    before = compiled_kernels(cache)
    started = time.monotonic()
    took, failed = run_at_once(warm_jobs(models, device), models.folder, TRITON_INTERPRET="0")
    seconds, compiled, jobs = time.monotonic() - started, len(compiled_kernels(cache) - before), len(took)
    for name in failed:
        print(f"--- {name}: last lines of its output\n"
              + "\n".join((models.folder / f"warm-{name}.log").read_text(errors="replace").splitlines()[-15:]))
    return not failed, (f"{compiled} kernels compiled into {cache} in {seconds:.0f} s by {jobs} processes "
                        f"at once; {per_compile(took)}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))


def warm_jobs(models: Models, device: str) -> dict[str, list[str]]:
    """name -> argv of each process triton_compile runs: a kernel test file, or an engine."""
    jobs = {Path(f).stem: [sys.executable, "-m", "pytest", f, "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(models.folder / f"pytest-{Path(f).stem}")]
            for f in triton_test_files()}
    given = str(models.given) if models.given else None
    jobs.update({f"engine_{name}": [sys.executable, "-c", "from scripts import gpu_checks; gpu_checks.warm_engine("
                                    f"{str(models.folder)!r}, {given!r}, {device!r}, {name!r})"]
                 for name in WARM_ENGINES})
    jobs.update({f"check_{name}": [sys.executable, "-c", "from scripts import gpu_checks; gpu_checks.CHECKS["
                                   f"{name!r}](gpu_checks.Models({str(models.folder)!r}), {device!r})"]
                 for name in WARM_CHECKS})
    return jobs


def run_at_once(jobs: dict[str, list[str]], folder: Path, **env: str) -> tuple[dict[str, float], list[str]]:
    """Start every job (its output to folder/warm-<name>.log), wait for all; (seconds until
    each ended, the names of those that failed)."""
    took: dict[str, float] = {}
    failed: list[str] = []
    with contextlib.ExitStack() as logs:
        started = time.monotonic()
        running = {name: subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                          stdout=logs.enter_context(open(folder / f"warm-{name}.log", "wb")),
                                          stderr=subprocess.STDOUT)
                   for name, argv in jobs.items()}
        while len(took) < len(running):
            for name, process in running.items():
                if name not in took and process.poll() is not None:
                    took[name] = time.monotonic() - started
                    failed += [name] if process.returncode else []
            time.sleep(0.2)
    return took, failed


def per_compile(took: dict[str, float]) -> str:
    """Each process's seconds, and for a kernel test file its seconds per specialization
    (start-up included: an upper bound of one compile, to set COMPILE_S by)."""
    from scripts.gpu_check import TRITON_TESTS

    def one(name: str) -> str:
        count = TRITON_TESTS.get(name.removeprefix("test_triton_"))
        return f"{name} {took[name]:.0f} s" + (f" / {count} = {took[name] / count:.1f} s each" if count else "")
    return ", ".join(one(name) for name in sorted(took, key=lambda n: -took[n]))


# The engine configurations the later checks run, warmed by triton_compile: by check,
# the model and engine options it uses (a short generate compiles what it launches;
# cuda_graphs_decode runs exactness_bf16's kernels).
WARM_ENGINES: dict[str, tuple[str, dict[str, Any]]] = {
    "exactness_fp16": ("small", dict(dtype="float16", kv_cache_tokens=208, block_size=8,
                                     max_num_batched_tokens=24, max_num_seqs=4)),
    "exactness_bf16": ("small", dict(dtype="bfloat16", kv_cache_tokens=208, block_size=8,
                                     max_num_batched_tokens=24, max_num_seqs=4)),
    "int8_vs_bf16_batch1": ("small", dict(dtype="bfloat16", quantization="int8", enable_prefix_caching=False)),
    "throughput_vs_transformers": ("bench", dict(dtype="bfloat16", kv_cache_tokens=128 * 784)),
}


# Later checks that launch Triton kernels in shapes of their own (not the tests'), run
# whole by triton_compile: they take no model and a few seconds.
WARM_CHECKS = ("quantized_linears",)


def warm_engine(folder: str, given: Optional[str], device: str, name: str) -> None:
    """A short generate of WARM_ENGINES[name]: prompts of several lengths, a few tokens."""
    from tests.runtime.exactness import BATCH_LENGTHS, prompts

    models = Models(Path(folder), Path(given) if given else None)
    which, engine = WARM_ENGINES[name]
    model_dir = models.small if which == "small" else models.bench
    llm = _llm(model_dir, device, **engine)
    llm.generate(prompts(2, BATCH_LENGTHS), _greedy(4, logprobs=1))
    llm.generate(prompts(2, BATCH_LENGTHS[:1]), _greedy(4))            # batch 1


def triton_kernels(models: Models, device: str) -> Outcome:
    os.environ["TRITON_INTERPRET"] = "0"     # before kernels.triton is imported: compiled, on CUDA
    import pytest

    from kernels.dispatch import get_kernels

    cache = triton_cache_dir()
    before = compiled_kernels(cache)
    backend = get_kernels("cuda").backend
    tally = _Tally()
    started = time.monotonic()
    code = pytest.main([*triton_test_files(), "-q", "-p", "no:cacheprovider", "--basetemp",
                        str(models.folder / "pytest")], plugins=[tally])
    seconds, compiled = time.monotonic() - started, len(compiled_kernels(cache) - before)
    passed = code == 0 and not tally.failed and tally.passed > 0 and backend == "triton"
    failed = f" ({', '.join(tally.failed[:5])}{' ...' if len(tally.failed) > 5 else ''})" if tally.failed else ""
    return passed, (f"{tally.passed} passed, {len(tally.failed)} failed{failed}, {tally.skipped} skipped "
                    f"on {torch.cuda.get_device_name()} in {seconds:.0f} s, {compiled} kernels compiled "
                    f"(0: triton_compile warmed them all); the engine's kernels on CUDA: {backend}")


def exactness(models: Models, device: str, dtype: str) -> Outcome:
    from kernels.dispatch import get_kernels
    from tests.runtime.exactness import BATCH_LENGTHS, NEW_TOKENS, prompts

    model_dir, batch = models.small, prompts(2, BATCH_LENGTHS)
    batch[3][:24] = batch[1][:24]            # a shared prefix, for the prefix cache to find
    llm = _llm(model_dir, device, dtype=dtype, kv_cache_tokens=208, block_size=8, max_num_batched_tokens=24,
               max_num_seqs=4)
    outs = llm.generate(batch, _greedy(NEW_TOKENS, logprobs=1))
    stats, backend = llm.engine.stats(), get_kernels(device).backend
    del llm
    _free(device)
    seqs = [(p, o.token_ids) for p, o in zip(batch, outs)]
    tokens = [o.token_ids for o in outs]
    reference = hf_logprobs(model_dir, device, torch.float32, seqs)
    ours = agreement([[lp for lp, _ in o.logprobs] for o in outs], tokens, reference)
    peer_lps = hf_logprobs(model_dir, device, getattr(torch, dtype), seqs)
    peer = agreement([[float(r[t, i]) for t, i in enumerate(ids)] for r, ids in zip(peer_lps, tokens)],
                     tokens, reference)
    passed, tolerance = close_enough(ours, peer)
    return passed, (f"{model_dir.name} vs transformers fp32 on {device}: engine {dtype} {describe(ours)}; "
                    f"transformers {dtype} max {peer.max_err:.4f}; tolerance {tolerance:.4f}; {len(batch)} "
                    f"requests, {stats.num_preemptions} preemptions, {stats.prefix_cache_hits} prefix hits; "
                    f"kernels {backend}")


def int8_vs_bf16(models: Models, device: str) -> Outcome:
    from tests.runtime.exactness import prompts

    model_dir, prompt, new = models.small, prompts(3, [32])[0], 128
    runs = {}
    for quantization in (None, "int8"):
        llm = _llm(model_dir, device, dtype="bfloat16", quantization=quantization, enable_prefix_caching=False)
        llm.generate([prompt], _greedy(4))                    # warm-up: compiles the kernels
        (out,), seconds = _timed(llm.generate, [prompt], _greedy(new, logprobs=1))
        runs[quantization] = (out, new / seconds)
        del llm
        _free(device)
    (bf16, bf16_tps), (int8, int8_tps) = runs[None], runs["int8"]
    reference = hf_logprobs(model_dir, device, torch.float32, [(prompt, int8.token_ids)])
    quality = agreement([[lp for lp, _ in int8.logprobs]], [int8.token_ids], reference)
    same = next((i for i, (a, b) in enumerate(zip(bf16.token_ids, int8.token_ids)) if a != b), new)
    passed = quality.worst_gap <= 0.25 and quality.argmax_steps >= 0.9 * quality.steps
    return passed, (f"{model_dir.name}, batch 1, {new} tokens: int8 {int8_tps:.0f} tok/s vs bf16 "
                    f"{bf16_tps:.0f} tok/s = {int8_tps / bf16_tps:.2f}x; greedy equal to bf16 for the first "
                    f"{same}/{new} tokens; int8 vs transformers fp32: {describe(quality)} "
                    f"(pass: gap <= 0.25, argmax >= 90%)")


def tensor_parallel(models: Models, device: str) -> Outcome:
    from tests.runtime.exactness import prompts

    batch, new = prompts(4, [24] * 8), 64
    tokens, rates = {}, {}
    for size in (1, 2):   # float32 (no TF32 by default): the ranks' sums may differ only in order
        with _llm(models.tensor_parallel, device, dtype="float32", tensor_parallel_size=size,
                  enable_prefix_caching=False) as llm:
            llm.generate(batch[:1], _greedy(4))
            outs, seconds = _timed(llm.generate, batch, _greedy(new))
        tokens[size], rates[size] = [o.token_ids for o in outs], len(batch) * new / seconds
        _free(device)
    same = sum(a == b for x, y in zip(tokens[1], tokens[2]) for a, b in zip(x, y))
    total, backend = len(batch) * new, "NCCL" if device.startswith("cuda") else "gloo"
    return same == total, (f"{backend}, 2 ranks vs 1, float32: greedy tokens equal {same}/{total}; decode at "
                           f"batch {len(batch)} {rates[2]:.0f} vs {rates[1]:.0f} tok/s = {rates[2] / rates[1]:.2f}x")


def throughput(models: Models, device: str) -> Outcome:
    from benchmarks.engine_throughput import make_workload
    from runtime.core.config import ModelConfig

    model_dir = models.bench
    work = make_workload(Namespace(seed=0, num_requests=128, min_prompt=16, max_prompt=512,
                                   min_output=16, max_output=256))
    vocab = ModelConfig.from_dir(model_dir).vocab_size          # a --model may have a smaller one
    work.prompts = [[t % vocab for t in p] for p in work.prompts]
    llm = _llm(model_dir, device, dtype="bfloat16", kv_cache_tokens=128 * 784)
    llm.generate([work.prompts[0][:16]], _greedy(2))
    outs, ours_s = _timed(llm.generate, work.prompts, [_greedy(n) for n in work.output_lens])
    produced = sum(len(o.token_ids) for o in outs)
    del llm
    _free(device)
    theirs_s = transformers_static(model_dir, device, work.prompts, work.output_lens, batch_size=64)
    ours, theirs = produced / ours_s, work.output_tokens / theirs_s
    return produced == work.output_tokens, (
        f"{model_dir.name} bf16, {len(work.prompts)} requests, {work.output_tokens} output tokens: "
        f"thawpool {ours:.0f} tok/s, transformers (static batches of 64) {theirs:.0f} tok/s = {ours / theirs:.2f}x")


def transformers_static(model_dir: Path, device: str, prompts: list[list[int]], output_lens: list[int],
                        batch_size: int) -> float:
    """Seconds for transformers `generate` in bf16 on the device: requests sorted by length,
    left-padded into static batches, each generating to its longest output."""
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.to(device).eval()
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), output_lens[i]))
    batches = [order[b:b + batch_size] for b in range(0, len(order), batch_size)]

    def run(batch: list[int], new: int) -> None:
        width = max(len(prompts[i]) for i in batch)
        ids = torch.tensor([[0] * (width - len(prompts[i])) + prompts[i] for i in batch], device=device)
        mask = (torch.arange(width, device=device)[None, :] >= width - torch.tensor(
            [len(prompts[i]) for i in batch], device=device)[:, None]).long()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)

    def run_all() -> None:
        for batch in batches:
            run(batch, max(output_lens[i] for i in batch))

    run(batches[0][:2], 2)                    # warm-up
    return _timed(run_all)[1]


def weight_loader(models: Models, device: str) -> Outcome:
    """runtime/load/device.py (pinned staging, 4 threads) against safetensors' own read
    onto the device: the same bytes, and each one's GB/s."""
    from runtime.load.device import stream_to_device
    from runtime.load.weights import host_views, iter_weights

    model = models.bench
    reference, peer_s = _timed(lambda: dict(iter_weights(model, torch.float32, device)))
    (ours, moved), ours_s = _timed(lambda: stream_to_device(host_views(model)[0], device, torch.float32))
    equal = ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)
    return equal, (f"{moved / 1e6:.0f} MB: pinned staging {moved / ours_s / 1e9:.2f} GB/s, safetensors "
                   f"{moved / peer_s / 1e9:.2f} GB/s ({peer_s / ours_s:.2f}x); "
                   f"{'every tensor equal' if equal else 'TENSORS DIFFER'}")


# The quantized linears on the GPU: group-wise forms (tests/kernels/group_cases.py) with
# the activation dtype each runs in, and how close each output is to its definition
# (relative to the output's norm: fp32 summation order, or one rounding to the dtype).
QUANTIZED_FORMS = (("q4_k", "bfloat16"), ("awq", "float16"), ("q8_0", "bfloat16"))
REL_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def quantized_linears(models: Models, device: str) -> Outcome:
    """The Triton group_linear and the native fp8_linear against their references at a
    7B model's square layer, decode and prefill rows; their decode time beside a dense
    bf16 linear's."""
    return compare_quantized(device, n=4096, k=4096, rows=(1, 64))


def compare_quantized(device: str, n: int, k: int, rows: Sequence[int]) -> Outcome:
    """Each form at each row count: its worst relative error against the definition, and
    passed when every one is within REL_TOLERANCE. On the CPU (the check's own test) the
    Triton kernel runs in the interpreter and nothing is timed."""
    from kernels import fp8, group_quant
    from kernels.dispatch import get_kernels
    from kernels.triton.group_linear import group_linear
    from tests.kernels.group_cases import FORMS, random_weight

    errors: dict[str, tuple[float, float]] = {}          # case -> (relative error, tolerance)
    speed: list[str] = []
    g = torch.Generator().manual_seed(0)
    for form, dtype_name in QUANTIZED_FORMS:
        dtype = getattr(torch, dtype_name)
        w = random_weight(FORMS[form], n, k, device=device)
        for m in rows:
            x = torch.randn(m, k, generator=g).to(device, dtype)
            errors[f"{form} {dtype_name} x{m}"] = (_rel_err(group_linear(x, w), group_quant.linear_ref(x, w)),
                                                  REL_TOLERANCE[dtype])
        speed += _decode_speed(f"{form} {dtype_name}", functools.partial(group_linear, w=w), w.shape, dtype, device,
                               w.nbytes)
    native = device == "cpu" or fp8.native(device)       # the CPU's _scaled_mm runs it too
    for dtype_name, per_channel in (("bfloat16", True), ("float16", False)) if native else ():
        dtype = getattr(torch, dtype_name)
        values = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(fp8.E4M3)
        scale = torch.rand(n, generator=g) * 1e-3 + 1e-4 if per_channel else torch.tensor(3e-4)
        w8 = fp8.Fp8Weight(values, scale).map(lambda t: t.to(device))
        bias = torch.randn(n, generator=g).to(device, dtype)
        for m in rows:
            x = torch.randn(m, k, generator=g).to(device, dtype)
            q, x_scale = fp8.quantize_per_token(x)
            rounded = fp8.linear_ref(q.float() * x_scale, w8, bias).to(dtype)
            errors[f"fp8 {dtype_name} x{m}"] = (_rel_err(fp8.fp8_linear(x, w8, bias), rounded),
                                                REL_TOLERANCE[dtype])
        speed += _decode_speed(f"fp8 {dtype_name}", functools.partial(fp8.fp8_linear, w=w8), w8.shape, dtype, device,
                               w8.nbytes)
    failed = [f"{case} {err:.1e} > {tol:.0e}" for case, (err, tol) in errors.items() if err > tol]
    worst = max(errors, key=lambda c: errors[c][0] / errors[c][1])
    verdict = f"FAILED {'; '.join(failed)}" if failed else f"{len(errors)} cases within tolerance"
    notes = [f"[{n}, {k}] weights, rows {'/'.join(map(str, rows))}: {verdict} (closest to its limit: {worst} "
             f"{errors[worst][0]:.1e} of {errors[worst][1]:.0e})", f"kernels {get_kernels(device).backend}"]
    notes += [] if native else [f"fp8 not native on this GPU {torch.cuda.get_device_capability(device)}"]
    notes += [f"decode x1: {', '.join(speed)}"] if speed else []
    return not failed, "; ".join(notes)


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm().clamp(min=1e-30))


def _decode_speed(name: str, fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, int],
                  dtype: torch.dtype, device: str, nbytes: int, reps: int = 50) -> list[str]:
    """One row through fn, in microseconds per call and weight GB/s, beside a dense bf16
    linear of the same shape; nothing off CUDA."""
    if not device.startswith("cuda"):
        return []
    n, k = shape
    x = torch.randn(1, k, device=device, dtype=dtype)
    dense = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    xb = x.to(torch.bfloat16)

    def per_call(f: Callable[[], Any]) -> float:
        f()
        return _timed(lambda: [f() for _ in range(reps)])[1] / reps

    ours, theirs = per_call(lambda: fn(x)), per_call(lambda: torch.nn.functional.linear(xb, dense))
    return [f"{name} {ours * 1e6:.0f} us ({nbytes / ours / 1e9:.0f} GB/s) vs dense bf16 {theirs * 1e6:.0f} us"]


def cuda_graphs(models: Models, device: str) -> Outcome:
    """Decode through CUDA graphs against the same engine eager: the same greedy tokens,
    logprobs within bf16's noise (a padded graph batch may pick other GEMM kernels), and
    the decode speed of each at batch 1 and 16."""
    from tests.runtime.exactness import prompts

    model_dir, new = models.small, 64
    batch = prompts(4, [24] * 16)
    runs = {}
    for graphs in (False, True):
        llm = _llm(model_dir, device, dtype="bfloat16", cuda_graphs=graphs, max_num_seqs=16,
                   enable_prefix_caching=False)
        llm.generate([batch[0]], _greedy(4))                        # warm-up
        (one,), one_s = _timed(llm.generate, [batch[0]], _greedy(new, logprobs=1))
        many, many_s = _timed(llm.generate, batch, _greedy(new, logprobs=1))
        runs[graphs] = ([one, *many], new / one_s, 16 * new / many_s)
        del llm
        _free(device)
    (eager, e1, e16), (graphed, g1, g16) = runs[False], runs[True]
    same = sum(a.token_ids == b.token_ids for a, b in zip(eager, graphed))
    worst = max((abs(x[0] - y[0]) for a, b in zip(eager, graphed) if a.token_ids == b.token_ids
                 for x, y in zip(a.logprobs, b.logprobs)), default=float("inf"))   # none equal: fails
    passed = same >= len(eager) - 1 and worst <= 0.05
    return passed, (f"{model_dir.name} bf16, {new} tokens: greedy equal to eager for {same}/{len(eager)} "
                    f"requests, logprobs max diff {worst:.4f} (pass: all but one equal, diff <= 0.05); "
                    f"graphs / eager decode: {g1 / e1:.2f}x at batch 1 ({g1:.0f} vs {e1:.0f} tok/s), "
                    f"{g16 / e16:.2f}x at batch 16")


CHECKS: dict[str, Callable[[Models, str], Outcome]] = {
    "random_models": random_models,
    "weight_loader": weight_loader,
    "triton_compile": triton_compile,
    "triton_kernels": triton_kernels,
    "quantized_linears": quantized_linears,
    "exactness_fp16": lambda model, device: exactness(model, device, "float16"),
    "exactness_bf16": lambda model, device: exactness(model, device, "bfloat16"),
    "int8_vs_bf16_batch1": int8_vs_bf16,
    "throughput_vs_transformers": throughput,
    "cuda_graphs_decode": cuda_graphs,
    "tensor_parallel_nccl": tensor_parallel,
}

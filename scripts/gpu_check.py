"""`make gpu-check`: every CUDA path of thawpool, checked on a GPU in about 8 minutes.

    .venv/bin/python scripts/gpu_check.py [--model DIR | --random] [--total-s 485]

Checks, in order, each a child process of its own with a time limit (a hang, a crash
or a failure stops that check only) and one result line, PASS / FAIL / SKIP plus its
figures (the checks themselves are in scripts/gpu_checks.py):

- random_models:      the random Llamas the others run (see scripts/gpu_checks.py):
                      exactness, int8 and throughput run the trained SmolLM2 instead
                      when `make model` has imported it (or --model DIR; --random: never);
- weight_loader:      runtime/load/device.py (pinned staging, overlapped copies) against
                      safetensors' own read onto the GPU: equal tensors, and each GB/s;
- triton_compile:     Triton's compile cache warmed, its time apart from any check's run
                      time: every kernel test file and a short generate of each engine
                      configuration below, each a process of its own, all at once (one
                      compile is single-threaded, 1-5 s on a GPU host); prints how many
                      kernels it compiled and the seconds each. Its budget is derived
                      from the specializations (compiles) the busiest process launches
                      (TRITON_TESTS, counted on the CPU by tests/test_gpu_check.py);
- triton_kernels:     tests/kernels/test_triton_*.py run on the GPU, from the warm cache,
                      against the torch references, and the engine's dispatch picks them;
- quantized_linears:  the Triton group_linear (4- and 8-bit group-wise weights) and the
                      native FP8 fp8_linear (torch._scaled_mm) against their definitions
                      at a 4096 x 4096 layer, decode and prefill rows, with their decode
                      time beside a dense bf16 linear's (triton_compile runs it first);
- exactness_fp16/bf16: the engine on CUDA (continuous batching, chunked prefill,
                      preemption, prefix cache) against transformers on CUDA;
- int8_vs_bf16_batch1: weight-only int8 against bf16 at batch 1, quality and speed;
- throughput_vs_transformers: offline throughput against transformers `generate`
                      (figures only: it fails only if it does not run);
- tensor_parallel_nccl: 2 ranks over NCCL against 1 (SKIP with fewer than 2 GPUs);
- cuda_graphs_decode: the engine with `cuda_graphs=True` (runtime/engine/cuda_graphs.py: decode
                      steps replayed as graphs) against the same engine eager: greedy
                      tokens and logprobs, and the decode speedup at batch 1 and 16;

Each check's line gives the seconds it took and its budget (its time limit).
On a machine where torch sees no CUDA device (no GPU, or torch's CPU wheel) it says
which, and exits 0 having written nothing. On a GPU it prints the report and writes it,
under the machine header of benchmarks/results.py, to benchmarks/results/gpu_check.txt,
and exits 1 if any check failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
RESULTS_FILE = REPO / "benchmarks" / "results" / "gpu_check.txt"
RESULT_MARK = "GPU_CHECK_RESULT "         # the child's last word: this prefix, then JSON
TOTAL_S = 485.0                           # all checks together: a 10-minute call with start-up to spare

# The Triton kernel test files the GPU runs (tests/kernels/test_triton_<name>.py; not
# test_triton_compile.py, which compiles for sm_90 without a GPU and runs in the CPU
# suite), each with the number of kernel specializations its tests launch: one compile
# each on a cold cache. tests/test_gpu_check.py counts them through the interpreter.
TRITON_TESTS = {"activation": 6, "group_linear": 21, "int8_matmul": 16, "lora": 4, "paged_attention": 21,
                "rmsnorm": 21, "rotary": 10}
ENGINE_SPECIALIZATIONS = 12      # one engine configuration's kernels (the CPU count: 6-8)
COMPILE_S = 5.0                  # one cold Triton compile, at the slow end of 1-5 s
PROCESS_S = 15.0                 # a process's start: torch, a CUDA context, pytest or a model load


def compile_budget_s() -> float:
    """triton_compile's limit: its processes run at once, so the busiest one's compiles."""
    return PROCESS_S + COMPILE_S * max(*TRITON_TESTS.values(), ENGINE_SPECIALIZATIONS)


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    limit_s: float
    gpus: int = 1                 # fewer visible GPUs: SKIP
    needs_models: bool = True     # runs the random models (SKIP when they could not be made)


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    seconds: float = 0.0
    log_tail: str = ""            # a failed child's last output lines
    limit_s: float = 0.0          # its budget (0: it did not run)

    def line(self) -> str:
        budget = f" of {self.limit_s:3.0f} s" if self.limit_s else ""
        return f"{self.status.value}  {self.name:<28s} {self.seconds:6.1f} s{budget}  {self.detail}"


# On one GPU the limits add up to TOTAL_S; tensor parallelism (2+ GPUs) has what is left.
# The checks after triton_compile find its kernels compiled: their limits are run time.
CHECKS = (
    Check("random_models", 40, needs_models=False),
    Check("weight_loader", 25),
    Check("triton_compile", compile_budget_s()),
    Check("triton_kernels", 30),
    Check("quantized_linears", 20),
    Check("exactness_fp16", 45),
    Check("exactness_bf16", 45),
    Check("int8_vs_bf16_batch1", 45),
    Check("throughput_vs_transformers", 80),
    Check("cuda_graphs_decode", 35),
    Check("tensor_parallel_nccl", 75, gpus=2),
)


def no_cuda_reason(torch: Optional[ModuleType], gpu_visible: bool) -> Optional[str]:
    """Why no CUDA check can run here; None when one can. gpu_visible: the driver shows
    an NVIDIA device (so a CPU-only torch is the thing to fix)."""
    if torch is None:
        return "torch is not importable in this Python, so nothing CUDA can run"
    if torch.version.cuda is None:
        fix = ("; an NVIDIA GPU is visible: install a CUDA build of the same torch version "
               f"(.venv/bin/pip install --force-reinstall torch=={torch.__version__.split('+')[0]} "
               "--index-url https://download.pytorch.org/whl/cuXXX, XXX the CUDA the driver supports; "
               "nvidia-smi shows it) and run this again") if gpu_visible else ""
        return f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None){fix}"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU "
                "(no device, no driver, or CUDA_VISIBLE_DEVICES hides them)")
    return None


def gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def parse_child(name: str, output: str, returncode: Optional[int], seconds: float) -> Result:
    """A child's output as its result; returncode None: it ran out of time and was killed."""
    tail = "\n".join([line for line in output.rstrip().splitlines() if not line.startswith(RESULT_MARK)][-15:])
    if returncode is None:
        return Result(name, Status.FAIL, f"timed out after {seconds:.0f} s (killed)", seconds, tail)
    marked = [line for line in output.splitlines() if line.startswith(RESULT_MARK)]
    if not marked:
        return Result(name, Status.FAIL, f"exited {returncode} without a result line", seconds, tail)
    found = json.loads(marked[-1][len(RESULT_MARK):])
    status = Status(found["status"])
    return Result(name, status, found["detail"], seconds, tail if status is Status.FAIL else "")


def run_boxed(name: str, argv: Sequence[str], limit_s: float, log_path: Path) -> Result:
    """Run argv as a session of its own; past limit_s, SIGKILL the whole session."""
    started = time.monotonic()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(list(argv), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode: Optional[int] = child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            returncode = None
    output = log_path.read_text(errors="replace")
    return dataclasses.replace(parse_child(name, output, returncode, time.monotonic() - started), limit_s=limit_s)


def skip_reason(check: Check, gpus: int, have_models: bool, left_s: float) -> Optional[str]:
    if check.gpus > gpus:
        return f"needs {check.gpus} GPUs, {gpus} visible"
    if check.needs_models and not have_models:
        return "no model folders (random_models failed)"
    if left_s < 10:
        return "the time for all checks together (--total-s) is spent"
    return None


def run_all(work: Path, trained: Optional[Path], gpus: int, total_s: float = TOTAL_S) -> list[Result]:
    """Each check in its own child, limited to its own time and to what is left of total_s."""
    deadline = time.monotonic() + total_s
    results: list[Result] = []
    have_models = False
    for check in CHECKS:
        reason = skip_reason(check, gpus, have_models, deadline - time.monotonic())
        if reason is not None:
            results.append(Result(check.name, Status.SKIP, reason))
            continue
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", check.name, "--work", str(work)]
        argv += ["--model", str(trained)] if trained else []
        limit = min(check.limit_s, deadline - time.monotonic())
        result = run_boxed(check.name, argv, limit, work / f"{check.name}.log")
        have_models = have_models or (check.name == "random_models" and result.status is Status.PASS)
        print(result.line(), flush=True)
        results.append(result)
    return results


def report(results: Sequence[Result]) -> str:
    """The result lines, then each failure's last output lines, then the verdict."""
    lines = [r.line() for r in results]
    for r in results:
        if r.log_tail:
            lines += ["", f"--- {r.name}: last lines of its output", r.log_tail]
    failed = [r.name for r in results if r.status is Status.FAIL]
    counts = {s: sum(r.status is s for r in results) for s in Status}
    summary = ", ".join(f"{n} {s.value.lower()}" for s, n in counts.items())
    lines += ["", f"gpu-check: {summary}" + (f"; FAILED: {', '.join(failed)}" if failed else "")]
    return "\n".join(lines) + "\n"


def exit_code(results: Sequence[Result]) -> int:
    return 1 if any(r.status is Status.FAIL for r in results) else 0


def write_report(text: str, started_at: datetime, seconds: float, load_before: str, code: int,
                 path: Path = RESULTS_FILE) -> None:
    sys.path.insert(0, str(REPO))
    # mypy takes benchmarks/results/ (the reports folder) for this module
    from benchmarks.results import machine_header  # type: ignore[attr-defined]

    header = machine_header("gpu_check", started_at, seconds, load_before, code,
                            script="scripts/gpu_check.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + text)
    print(f"[report written to {path.relative_to(REPO) if path.is_relative_to(REPO) else path}]")


def child(name: str, work: Path, trained: Optional[Path]) -> int:
    """In the child: run one check, print its result line last."""
    sys.path.insert(0, str(REPO))
    from scripts import gpu_checks

    try:
        passed, detail = gpu_checks.CHECKS[name](gpu_checks.Models(work, trained), "cuda")
        status = Status.PASS if passed else Status.FAIL
    except Exception as exc:   # noqa: BLE001 - any error is this check's failure, reported
        import traceback

        traceback.print_exc()
        status, detail = Status.FAIL, f"{type(exc).__name__}: {str(exc)[:300]}"
    print(RESULT_MARK + json.dumps({"status": status.value, "detail": detail}), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None,
                    help="a trained model folder (default: SmolLM2 if `make model` imported it)")
    ap.add_argument("--random", action="store_true", help="random models only, even where SmolLM2 is")
    ap.add_argument("--total-s", type=float, default=TOTAL_S, help="time for all checks together")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(args.child, args.work, args.model)
    try:
        import torch
    except ImportError as exc:
        print(f"gpu-check: {no_cuda_reason(None, gpu_visible())} ({exc})")
        return 1
    reason = no_cuda_reason(torch, gpu_visible())
    if reason is not None:
        print(f"gpu-check: no GPU to check on: {reason}\ngpu-check: nothing ran, nothing written; exit 0")
        return 0
    return check_gpu(args, torch.cuda.device_count())


def check_gpu(args: argparse.Namespace, gpus: int) -> int:
    started_at, started, load_before = datetime.now(timezone.utc), time.monotonic(), _load()
    print(f"gpu-check: {gpus} GPU(s) visible; every check in its own process, {args.total_s:.0f} s in all")
    print(budgets())
    trained = None if args.random else (args.model or imported_smollm2())
    with tempfile.TemporaryDirectory(prefix="thawpool-gpu-check-") as work:
        results = run_all(Path(work), trained, gpus, args.total_s)
    text, code = report(results), exit_code(results)
    print(text, end="")
    write_report(text, started_at, time.monotonic() - started, load_before, code)
    return code


def budgets() -> str:
    """Each check's budget, and where triton_compile's comes from."""
    limits = ", ".join(f"{c.name} {c.limit_s:.0f} s" for c in CHECKS)
    busiest = max(*TRITON_TESTS.values(), ENGINE_SPECIALIZATIONS)
    return (f"gpu-check: budgets: {limits}; triton_compile = {PROCESS_S:.0f} s start + {busiest} compiles "
            f"x {COMPILE_S:.0f} s (the busiest of its processes, which run at once)")


def imported_smollm2() -> Optional[Path]:
    """The real model's folder, if `make model` imported it (never fetched here)."""
    sys.path.insert(0, str(REPO))
    from scripts.real_model import CACHE, FOLDER, imported

    folder = CACHE / FOLDER
    return folder if imported(folder) else None


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())

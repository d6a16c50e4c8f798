"""scripts/gpu_check.py off the GPU: it says there is none and exits 0 writing nothing;
its report, time limits and skips; the compile phase's budget, from the Triton
specializations the kernel tests launch (counted again here), and its parallel jobs;
the checks' logprob comparison; and two checks and an engine warm-up run on the CPU
with a tiny model, so that a change to the engine's API shows here and not first on a
GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scripts import gpu_check, gpu_checks
from scripts.gpu_check import RESULT_MARK, Check, Result, Status

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run")
def test_without_a_gpu_it_says_so_exits_0_and_writes_nothing():
    before = gpu_check.RESULTS_FILE.stat().st_mtime_ns if gpu_check.RESULTS_FILE.exists() else None
    run = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "no GPU to check on" in run.stdout and "nothing written" in run.stdout
    after = gpu_check.RESULTS_FILE.stat().st_mtime_ns if gpu_check.RESULTS_FILE.exists() else None
    assert after == before


def _torch(version: str, cuda: str | None, available: bool) -> SimpleNamespace:
    return SimpleNamespace(__version__=version, version=SimpleNamespace(cuda=cuda),
                           cuda=SimpleNamespace(is_available=lambda: available))


def test_no_cuda_reasons():
    cpu_wheel = _torch("2.13.0+cpu", None, False)
    assert "CPU-only build" in gpu_check.no_cuda_reason(cpu_wheel, gpu_visible=False)
    fix = gpu_check.no_cuda_reason(cpu_wheel, gpu_visible=True)
    assert "NVIDIA GPU is visible" in fix and "torch==2.13.0 " in fix
    assert "sees no GPU" in gpu_check.no_cuda_reason(_torch("2.13.0", "12.8", False), gpu_visible=False)
    assert gpu_check.no_cuda_reason(_torch("2.13.0", "12.8", True), gpu_visible=True) is None
    assert "not importable" in gpu_check.no_cuda_reason(None, gpu_visible=True)


def test_a_child_result_line_is_read_and_a_failure_keeps_its_output():
    ok = gpu_check.parse_child("a", f"noise\n{RESULT_MARK}" '{"status": "PASS", "detail": "3 passed"}\n', 0, 1.5)
    assert ok == Result("a", Status.PASS, "3 passed", 1.5)
    failed = gpu_check.parse_child("b", f"Traceback\nboom\n{RESULT_MARK}"
                                   '{"status": "FAIL", "detail": "ValueError: x"}\n', 0, 2.0)
    assert failed.status is Status.FAIL and failed.log_tail == "Traceback\nboom"
    crashed = gpu_check.parse_child("c", "Segmentation fault\n", -11, 0.5)
    assert crashed.status is Status.FAIL and "without a result line" in crashed.detail
    assert "Segmentation fault" in crashed.log_tail


def test_a_check_past_its_limit_is_killed_with_its_children(tmp_path):
    # the child starts a grandchild in its session; both go at the limit
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);" \
           " print('started', flush=True); time.sleep(60)"
    started = time.monotonic()
    result = gpu_check.run_boxed("slow", [sys.executable, "-c", code], 1.5, tmp_path / "slow.log")
    assert time.monotonic() - started < 10
    assert result.status is Status.FAIL and result.detail.startswith("timed out after")
    assert "started" in result.log_tail


def test_a_check_that_prints_its_result_passes(tmp_path):
    code = f"print({RESULT_MARK!r} + '{{\"status\": \"PASS\", \"detail\": \"fine\"}}')"
    result = gpu_check.run_boxed("quick", [sys.executable, "-c", code], 30, tmp_path / "quick.log")
    assert (result.status, result.detail) == (Status.PASS, "fine")


def test_skips():
    tp = Check("tensor_parallel_nccl", 75, gpus=2)
    assert gpu_check.skip_reason(tp, gpus=1, have_models=True, left_s=300) == "needs 2 GPUs, 1 visible"
    assert gpu_check.skip_reason(tp, gpus=2, have_models=True, left_s=300) is None
    assert "random_models failed" in gpu_check.skip_reason(Check("x", 60), 1, have_models=False, left_s=300)
    assert gpu_check.skip_reason(Check("random_models", 60, needs_models=False), 1, False, 300) is None
    assert "is spent" in gpu_check.skip_reason(Check("x", 60), 1, True, left_s=5)


def test_report_and_exit_code():
    results = [Result("triton_kernels", Status.PASS, "120 passed", 40.0, limit_s=30.0),
               Result("tensor_parallel_nccl", Status.SKIP, "needs 2 GPUs, 1 visible"),
               Result("exactness_bf16", Status.FAIL, "max 0.9", 12.0, "Traceback ...")]
    text = gpu_check.report(results)
    assert text.splitlines()[0] == "PASS  triton_kernels                 40.0 s of  30 s  120 passed"
    assert text.splitlines()[1] == "SKIP  tensor_parallel_nccl            0.0 s  needs 2 GPUs, 1 visible"
    assert "--- exactness_bf16: last lines of its output\nTraceback ..." in text
    assert text.rstrip().endswith("gpu-check: 1 pass, 1 fail, 1 skip; FAILED: exactness_bf16")
    assert gpu_check.exit_code(results) == 1
    assert gpu_check.exit_code(results[:2]) == 0


def test_the_driver_and_the_checks_name_the_same_checks():
    assert [c.name for c in gpu_check.CHECKS] == list(gpu_checks.CHECKS)
    # every check's budget holds within the total, and the total within a 10-minute call
    assert sum(c.limit_s for c in gpu_check.CHECKS if c.gpus == 1) <= gpu_check.TOTAL_S <= 490
    names = [c.name for c in gpu_check.CHECKS]
    assert names.index("triton_compile") < min(names.index(n) for n in [*gpu_checks.WARM_ENGINES, "triton_kernels",
                                                                         *gpu_checks.WARM_CHECKS])


def test_the_compile_budget_is_the_busiest_process_compiles():
    busiest = max(*gpu_check.TRITON_TESTS.values(), gpu_check.ENGINE_SPECIALIZATIONS)
    limit = next(c.limit_s for c in gpu_check.CHECKS if c.name == "triton_compile")
    assert limit == gpu_check.PROCESS_S + busiest * gpu_check.COMPILE_S == gpu_check.compile_budget_s()
    assert f"{busiest} compiles x {gpu_check.COMPILE_S:.0f} s" in gpu_check.budgets()
    assert "triton_compile 120 s" in gpu_check.budgets()


def test_the_gpu_runs_every_triton_kernel_test_file_but_the_compile_only_one():
    files = sorted(p.stem.removeprefix("test_triton_") for p in (REPO / "tests" / "kernels").glob("test_triton_*.py"))
    assert sorted(gpu_check.TRITON_TESTS) == [f for f in files if f != "compile"]
    assert gpu_checks.triton_test_files() == [str(REPO / "tests" / "kernels" / f"test_triton_{f}.py")
                                              for f in gpu_check.TRITON_TESTS]


def test_the_budgeted_specializations_are_those_the_tests_launch(tmp_path):
    """TRITON_TESTS, counted again through the interpreter: a test that launches a kernel
    in a new specialization must raise its file's count (and so the compile budget)."""
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                          str(tmp_path), "-p", "tests.support.triton_specializations",
                          *gpu_checks.triton_test_files()],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    mark = "TRITON_SPECIALIZATIONS "      # the plugin's line (importing it here would hook this process)
    counted = json.loads(next(line for line in run.stdout.splitlines() if line.startswith(mark))[len(mark):])
    assert counted == {f"test_triton_{name}": n for name, n in gpu_check.TRITON_TESTS.items()}


def test_compiled_kernels_are_the_cache_folders_with_a_cubin(tmp_path):
    for name, files in {"a": ["k.cubin", "k.json"], "b": ["k.json"], "c": ["k.cubin"]}.items():
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("")
    assert gpu_checks.compiled_kernels(tmp_path) == {"a", "c"}
    assert gpu_checks.compiled_kernels(tmp_path / "none") == set()


def test_warm_jobs_run_at_once_and_each_reports(tmp_path):
    code = "import sys, time; time.sleep(float(sys.argv[1])); sys.exit(int(sys.argv[2]))"
    jobs = {"slow": [sys.executable, "-c", code, "1.0", "0"], "broken": [sys.executable, "-c", code, "0.1", "3"]}
    started = time.monotonic()
    took, failed = gpu_checks.run_at_once(jobs, tmp_path, WARM_TEST="1")
    assert time.monotonic() - started < 5 and failed == ["broken"]
    assert took["broken"] < took["slow"] and (tmp_path / "warm-slow.log").exists()
    line = gpu_checks.per_compile({"test_triton_rmsnorm": 42.0, "engine_int8_vs_bf16_batch1": 50.0})
    rmsnorm = gpu_check.TRITON_TESTS["rmsnorm"]
    assert line == f"engine_int8_vs_bf16_batch1 50 s, test_triton_rmsnorm 42 s / {rmsnorm} = {42 / rmsnorm:.1f} s each"


def test_the_engine_warm_up_job_runs_on_the_cpu(model_factory, tmp_path):
    """The command line triton_compile starts for an engine, run here with a tiny model."""
    models = gpu_checks.Models(tmp_path, given=model_factory(max_position_embeddings=1024))
    jobs = gpu_checks.warm_jobs(models, "cpu")
    assert set(jobs) == {*(Path(f).stem for f in gpu_checks.triton_test_files()),
                         *(f"engine_{name}" for name in gpu_checks.WARM_ENGINES),
                         *(f"check_{name}" for name in gpu_checks.WARM_CHECKS)}
    run = subprocess.run(jobs["engine_exactness_bf16"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_agreement_and_tolerance():
    # two steps over a vocabulary of 3; the reference picks token 0 then token 2
    reference = [torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 1.05]]), dim=-1)]
    exact = [reference[0][0, 0].item(), reference[0][1, 1].item()]
    a = gpu_checks.agreement([exact], [[0, 1]], reference)       # step 2 chose a near-tie
    assert a.max_err == pytest.approx(0.0, abs=1e-6) and a.steps == 2 and a.argmax_steps == 1
    assert a.worst_gap == pytest.approx(0.05, abs=1e-5)
    off = gpu_checks.agreement([[exact[0] + 0.03, exact[1]]], [[0, 1]], reference)
    assert off.max_err == pytest.approx(0.03, abs=1e-5)
    peer = gpu_checks.Agreement(0.02, 0.01, 0.0, 2, 2)
    assert gpu_checks.close_enough(off, peer) == (True, pytest.approx(0.05))
    assert not gpu_checks.close_enough(off, gpu_checks.Agreement(0.005, 0.0, 0.0, 2, 2))[0]


@pytest.fixture(scope="module")
def tiny(model_factory):
    return gpu_checks.Models(Path("/nonexistent"), given=model_factory(max_position_embeddings=1024))


def test_exactness_check_runs_on_the_cpu(tiny):
    passed, detail = gpu_checks.exactness(tiny, "cpu", "bfloat16")
    assert passed, detail
    assert "vs transformers fp32 on cpu: engine bfloat16" in detail and "preemptions" in detail


def test_int8_check_runs_on_the_cpu(tiny):
    passed, detail = gpu_checks.int8_vs_bf16(tiny, "cpu")
    assert passed, detail
    assert "int8 vs transformers fp32" in detail


def test_quantized_linears_check_runs_on_the_cpu():
    """Its comparisons at a small layer, the Triton kernel in the interpreter (a process of
    its own: the interpreter is chosen when kernels.triton is first imported)."""
    pytest.importorskip("triton")
    code = ("import json; from scripts import gpu_checks; "
            "print(json.dumps(gpu_checks.compare_quantized('cpu', 64, 256, (1, 33))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    passed, detail = json.loads(run.stdout.strip().splitlines()[-1])
    assert passed, detail
    assert "10 cases within tolerance" in detail   # 3 group forms and 2 fp8 ones, 2 row counts each

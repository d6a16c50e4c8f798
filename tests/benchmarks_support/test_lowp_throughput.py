"""benchmarks/lowp_throughput.py's report: each low-precision form against fp32, judged
only where the CPU has the instructions."""
from benchmarks import lowp_throughput
from kernels.cpu.features import CpuFeatures

TOK_S = {"fp32": 200.0, "bf16 (fp32 model, cpu_low_precision)": 340.0, "int8 weight-only": 190.0,
         "int8 W8A8 (cpu_low_precision)": 250.0}


def test_the_forms_are_judged_against_fp32_where_the_cpu_has_the_instructions():
    lines = lowp_throughput.report(TOK_S, CpuFeatures(amx_bf16=True, amx_int8=True))
    assert any(line.startswith("bf16 (fp32 model, cpu_low_precision) / fp32: 1.70x (target >= 1.5x: met)")
               for line in lines)
    assert any(line.startswith("int8 W8A8 (cpu_low_precision) / fp32: 1.25x (target >= 1.5x: NOT met)")
               for line in lines)
    assert any("int8 weight-only" in line and "0.95x" in line for line in lines)


def test_without_the_instructions_no_target_is_claimed():
    lines = lowp_throughput.report(TOK_S, CpuFeatures())
    judged = [line for line in lines if " / fp32: " in line]
    assert len(judged) == 2 and all("lacks the instructions" in line and "met" not in line for line in judged)

"""Each Triton kernel compiles for a real GPU (sm_90: ttir -> ttgir -> ptx -> cubin).

The interpreter runs kernels as numpy and accepts code the compiler refuses, so
the CPU tests alone would not show that a kernel builds for CUDA. Compiling
needs triton's bundled ptxas, not a GPU. It runs in a child process without
TRITON_INTERPRET: under the interpreter triton's own library is not compilable.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton not installed")

PAGED_SIGNATURE = {"out_ptr": "*bf16", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16",
                   "tables_ptr": "*i32", "lens_ptr": "*i32", "qk_scale": "fp32", "window": "i32",
                   "softcap": "fp32", **{s: "i64" for s in ("q_s0", "q_s1", "o_s0", "o_s1", "k_s0", "k_s1",
                                                            "k_s2", "v_s0", "v_s1", "v_s2", "tables_s0")}}

# name -> (module, kernel, signature without constexprs, constexprs): realistic shapes.
KERNELS = {
    "rms_norm": ("rmsnorm", "_rms_norm_kernel",
                 {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
                  "res_out_ptr": "*bf16", "x_stride": "i64", "res_stride": "i64", "out_stride": "i64",
                  "res_out_stride": "i64", "H": "i32", "eps": "fp32"},
                 {"HAS_RESIDUAL": True, "BLOCK_H": 4096}),
    "rotary": ("rotary", "_rotary_kernel",
               {"x_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*bf16",
                "x_s0": "i64", "x_s1": "i64", "cos_s0": "i64", "sin_s0": "i64", "out_s0": "i64",
                "out_s1": "i64"},
               {"HALF": 40, "BLOCK": 64}),
    "lora_delta": ("lora", "_lora_delta_kernel",
                   {"x_ptr": "*bf16", "a_ptr": "*fp32", "b_ptr": "*fp32", "slots_ptr": "*i64", "out_ptr": "*fp32",
                    "x_s0": "i64", "K": "i32", "R": "i32", "N": "i32"},
                   {"BLOCK_R": 64, "BLOCK_K": 64, "BLOCK_N": 128}),
    "silu_and_mul": ("activation", "_silu_and_mul_kernel",
                     {"x_ptr": "*bf16", "out_ptr": "*bf16", "x_s0": "i64", "out_s0": "i64", "WIDTH": "i32"},
                     {"BLOCK": 1024}),
    "paged_decode_attention": ("paged_attention", "_paged_decode_kernel", PAGED_SIGNATURE,
                               {"GROUP": 4, "BLOCK_SIZE": 16, "HEAD_DIM": 80, "BLOCK_T": 16, "BLOCK_D": 128,
                                "WINDOWED": False, "SOFTCAP": False}),
    # Gemma 2's sliding layers: a window and soft-capped scores
    "paged_decode_attention_windowed_softcap": (
        "paged_attention", "_paged_decode_kernel", PAGED_SIGNATURE,
        {"GROUP": 2, "BLOCK_SIZE": 16, "HEAD_DIM": 256, "BLOCK_T": 16, "BLOCK_D": 256,
         "WINDOWED": True, "SOFTCAP": True}),
    **{f"int8_matmul_{dt}": (
        "int8_matmul", "_int8_matmul_kernel",
        {"x_ptr": f"*{dt}", "w_ptr": "*i8", "scale_ptr": "*fp32", "bias_ptr": "*fp32",
         "out_ptr": f"*{dt}", "T": "i32", "N": "i32", "K": "i32",
         "x_s0": "i64", "w_s0": "i64", "out_s0": "i64"},
        {"HAS_BIAS": True, "IEEE": dt == "fp32", "DOT_FP32": False, **tiles})
        # Both tile configurations the wrapper picks: decode (few rows) and prefill.
        for dt, tiles in (("bf16", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128}),
                          ("fp16", {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}),
                          ("fp32", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128}))},
    **{f"group_linear_{name}": (
        "group_linear", "_group_linear_kernel",
        {"x_ptr": f"*{x}", "codes_ptr": "*u8" if bits == 4 else "*i8", "scales_ptr": f"*{scales}",
         "offsets_ptr": f"*{scales}", "scale_super_ptr": "*fp16", "offset_super_ptr": "*fp16",
         "bias_ptr": f"*{x}", "out_ptr": f"*{out}", "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32",
         **{s: "i64" for s in ("x_s0", "codes_s0", "scales_s0", "offsets_s0", "scale_super_s0",
                               "offset_super_s0", "out_s0", "out_split_s")}},
        {"BITS": bits, "GROUP": group, "SUPER_EVERY": every, "HAS_OFFSETS": offsets,
         "HAS_SCALE_SUPER": every > 1, "HAS_OFFSET_SUPER": offsets and every > 1, "HAS_BIAS": out == x,
         "IEEE": x == "fp32", "DOT_FP32": False, **tiles})
        # GGUF's K-quants at decode (K split: fp32 partials), AWQ at prefill, Q6_K and Q8_0
        for name, x, out, bits, group, every, scales, offsets, tiles in (
            ("q4_k_bf16_decode", "bf16", "fp32", 4, 32, 8, "fp16", True,
             {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),
            ("awq_fp16_prefill", "fp16", "fp16", 4, 128, 1, "fp32", True,
             {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128}),
            ("q6_k_fp32_decode", "fp32", "fp32", 8, 16, 16, "fp16", False,
             {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
            ("q8_0_bf16_prefill", "bf16", "bf16", 8, 32, 1, "fp16", False,
             {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}))},
}


def compile_all() -> None:
    """Run in the child: print {name: "ok" or the error} as JSON."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = {}
    for name, (module, kernel, signature, constexprs) in KERNELS.items():
        fn = getattr(importlib.import_module(f"kernels.triton.{module}"), kernel)
        src = ASTSource(fn=fn, signature={**signature, **{c: "constexpr" for c in constexprs}},
                        constexprs=constexprs)
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            results[name] = "ok" if compiled.asm.get("cubin") else "no cubin"
        except Exception as exc:   # reported per kernel by the parent
            results[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(results))


@pytest.fixture(scope="module")
def compiled():
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton's nvidia backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # triton 3.9 warns when unset
    code = "from tests.kernels.test_triton_compile import compile_all; compile_all()"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(KERNELS))
def test_compiles_for_sm90(name, compiled):
    assert compiled[name] == "ok", compiled[name]

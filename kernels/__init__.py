"""Compute kernels. Each module holds a pure-torch reference (the oracle):

- attention.py: write_kv, paged_decode_attention, paged_prefill_attention, prefill_attention
- rmsnorm.py:   rms_norm, fused_add_rms_norm
- rotary.py:    rotary_cos_sin, apply_rotary
- int8.py:      weight-only int8 matmul
- activation.py: silu_and_mul (SwiGLU), gelu_and_mul (GeGLU)
- moe.py:       route, moe_experts (sparse mixture of experts, tokens grouped by expert)

Triton versions live in kernels/triton/ (chosen by kernels/dispatch.py on CUDA), C
versions for the CPU in kernels/cpu/ (chosen on the CPU where a C compiler is found).
Nothing here imports from runtime/.
"""

"""C kernels for the CPU, each with the signature of its pure-torch reference in kernels/:

- paged_attention.py: paged_decode_attention, paged_prefill_attention, prefill_attention
                      (kernels/attention.py), the paged cache read in place, sliding window and
                      soft cap included; prefill flash-style (key tiles, online softmax)
- rmsnorm.py:         rms_norm, fused_add_rms_norm (kernels/rmsnorm.py)
- rotary.py:          apply_rotary              (kernels/rotary.py)
- activation.py:      silu_and_mul              (kernels/activation.py)
- int8_matmul.py:     int8_linear               (kernels/int8.py), fp32 activations
- group_linear.py:    group_linear              (kernels/group_quant.py), fp32 activations, and
                      w4a8_linear               (kernels/w4a8.py), int8 activations

Each wraps the .c file of its name; fp32 runs in C, other dtypes go to the reference.
build.py compiles a .c with the system compiler on first use and caches the library;
kernels/dispatch.py picks these on a CPU device when that works.
"""

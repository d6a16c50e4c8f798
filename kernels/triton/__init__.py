"""Triton versions of the kernels in kernels/, one kernel per module, each with
the signature of its pure-torch reference:

- rmsnorm.py:         rms_norm, fused_add_rms_norm   (kernels/rmsnorm.py)
- rotary.py:          apply_rotary                   (kernels/rotary.py)
- paged_attention.py: paged_decode_attention         (kernels/attention.py)
- int8_matmul.py:     int8_linear                    (kernels/int8.py)
- group_linear.py:    group_linear                   (kernels/group_quant.py: linear_ref)
- activation.py:      silu_and_mul                   (kernels/activation.py)

Importing this package imports no triton; each module does. kernels/dispatch.py
picks these on a CUDA device. Tests run them on the CPU with TRITON_INTERPRET=1.
"""

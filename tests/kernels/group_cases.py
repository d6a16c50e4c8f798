"""Random group-wise quantized weights (kernels/group_quant.py) in each form the checkpoints
give, for the kernel tests and scripts/gpu_checks.py: codes over their whole range, and
scales and offsets shaped like the format's own (the K-quants' small integers under a
float16 super level, AWQ's float zero points, GPTQ's act-order permutation)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels import group_quant
from kernels.group_quant import GroupQuantized


@dataclass(frozen=True)
class Form:
    bits: int
    group: int
    scales: torch.dtype = torch.float16
    offsets: Optional[torch.dtype] = torch.float16
    super_every: int = 0              # 0: no super level
    ordered: bool = False             # an input_order (GPTQ act_order)


FORMS = {
    "q4_0": Form(4, 32),                                        # GGUF Q4_0/Q4_1: d, -8d or m
    "q4_k": Form(4, 32, super_every=8),                         # both levels, offsets too
    "awq": Form(4, 128, torch.float32, torch.float32),          # float32 scales and zero points
    "gptq_act_order": Form(4, 64, offsets=torch.float32, ordered=True),
    "w4_symmetric": Form(4, 128, offsets=None),
    "q8_0": Form(8, 32, offsets=None),
    "q6_k": Form(8, 16, offsets=None, super_every=16),
}


def random_weight(form: Form, n: int, k: int, seed: int = 0, device: str = "cpu") -> GroupQuantized:
    g = torch.Generator().manual_seed(seed)
    groups = k // form.group
    if form.bits == 4:
        codes = group_quant.pack_nibbles(torch.randint(0, 16, (n, k), generator=g))
    else:
        codes = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    fields: dict[str, Optional[torch.Tensor]] = {}
    if form.super_every:
        supers = groups // form.super_every
        fields["scales"] = torch.randint(0, 64, (n, groups), generator=g).to(form.scales)
        fields["scale_super"] = (torch.rand(n, supers, generator=g) * 4e-4 + 1e-4).half()
        if form.offsets is not None:
            fields["offsets"] = torch.randint(0, 64, (n, groups), generator=g).to(form.offsets)
            fields["offset_super"] = -(torch.rand(n, supers, generator=g) * 4e-4).half()
    else:
        scale = torch.rand(n, groups, generator=g) * 0.02 + 0.002
        fields["scales"] = scale.to(form.scales)
        if form.offsets is not None:        # -scale * a zero point among the codes
            low, high = (0, 16) if form.bits == 4 else (-8, 8)
            zero = torch.randint(low, high, (n, groups), generator=g)
            fields["offsets"] = (-scale * zero).to(form.offsets)
    order = torch.randperm(k, generator=g) if form.ordered else None
    w = GroupQuantized(codes=codes, bits=form.bits, group=form.group, super_every=max(1, form.super_every),
                       input_order=order, **fields)   # type: ignore[arg-type]
    group_quant.check(w)
    return w.map(lambda t: t.to(device))

"""Which checkpoint tensors take the engine's dtype as they load, and which keep their own.

A float tensor is converted to the engine's dtype. The parts of a quantized weight are
not: integer codes and FP8 values are not numbers of that dtype, and the float16 scales
of a group-wise weight are kept as stored, so that its values stay bit for bit what the
file defines and its bytes what the file holds (kernels/group_quant.py reads float16 or
float32 scales alike). `keep(name)` names those scales for the checkpoint's format.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

KeepDtype = Callable[[str], bool]


def converted(name: str, tensor: torch.Tensor, dtype: torch.dtype, keep: Optional[KeepDtype]) -> torch.Tensor:
    if not tensor.is_floating_point() or tensor.element_size() == 1 or (keep is not None and keep(name)):
        return tensor
    return tensor.to(dtype=dtype)

"""kernels/cpu/tape.py: a recorded C kernel call, made again, computes on what its
tensors hold then; calls outside a recording are not noted."""
from __future__ import annotations

import torch

from kernels.cpu import rmsnorm
from kernels.cpu.tape import Tape, recording


def test_a_recorded_call_made_again_computes_on_what_its_pointers_hold_now():
    x, weight = torch.randn(3, 64), torch.rand(64)
    tape = Tape()
    with recording(tape):
        out = rmsnorm.rms_norm(x, weight, 1e-6)
    assert [c.fn.__name__ for c in tape.calls] == ["rms_norm_f32"] and tape.kept[0] is x
    rmsnorm.rms_norm(x, weight, 1e-6)                     # outside: not recorded
    assert len(tape.calls) == 1
    x.copy_(torch.randn(3, 64))
    tape.calls[0]()
    assert torch.equal(out, rmsnorm.rms_norm(x, weight, 1e-6))

"""kernels/triton/group_linear.py against kernels/group_quant.py's definition (interpreter on
the CPU), over every form of the layout (tests/kernels/group_cases.py)."""
from dataclasses import replace

import pytest
import torch

from tests.kernels.group_cases import FORMS, random_weight
from tests.kernels.triton_support import DEVICE, assert_close

from kernels import group_quant as ref
from kernels.triton import group_linear as tri

N, K = 48, 256          # N: ragged against both column tiles; K: 8 groups of 32, 2 of 128


def _x(rows, dtype=torch.float32, k=K, seed=1):
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def _bias(n=N):
    return torch.randn(n, generator=torch.Generator().manual_seed(2)).to(DEVICE)


# 1 row: decode, K split over several programs (bias added after the split's sum);
# 33 rows: prefill tiles, one program per tile's K (bias in the kernel).
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_fp32(form, rows):
    w = random_weight(FORMS[form], N, K, device=DEVICE)
    x, bias = _x(rows), _bias()
    assert_close(tri.group_linear(x, w, bias), ref.linear_ref(x, w, bias))


# each dtype at decode and prefill, 4- and 8-bit
@pytest.mark.parametrize("dtype,form,rows,bias", [(torch.float16, "q4_k", 3, False),
                                                  (torch.float16, "q8_0", 20, True),
                                                  (torch.bfloat16, "q6_k", 3, False),
                                                  (torch.bfloat16, "awq", 20, True)])
def test_half_precision(form, rows, bias, dtype):
    w = random_weight(FORMS[form], N, K, seed=3, device=DEVICE)
    x, b = _x(rows, dtype), _bias() if bias else None
    assert_close(tri.group_linear(x, w, b), ref.linear_ref(x, w, b))


@pytest.mark.parametrize("splits", [1, 3])
def test_any_k_split_gives_the_same(splits):
    # 3 does not divide the 8 steps: the last split is short; 1: the bias in the kernel
    w = random_weight(FORMS["q4_0"], N, K, seed=4, device=DEVICE)
    x, bias = _x(1), _bias()
    assert_close(tri.group_linear(x, w, bias, splits=splits), ref.linear_ref(x, w, bias))


def test_leading_dims_and_strided_rows():
    w = random_weight(FORMS["q4_0"], N, K, seed=5, device=DEVICE)
    x = _x(33).reshape(3, 11, K)
    out = tri.group_linear(x, w, _bias())
    assert out.shape == (3, 11, N)
    assert_close(out, ref.linear_ref(x, w, _bias()))
    wide = _x(33, k=K + 40)[:, 8:K + 8]
    assert_close(tri.group_linear(wide, w, _bias()), ref.linear_ref(wide, w, _bias()))


def test_row_slices_of_a_weight():
    # tensor parallelism's shard: rows 16..48 of the codes and scales, as views
    w = random_weight(FORMS["q4_k"], N, K, device=DEVICE)
    part, x = w.rows(16, 48), _x(1)
    assert_close(tri.group_linear(x, part), ref.linear_ref(x, w)[:, 16:48])


def test_no_rows():
    w = random_weight(FORMS["q8_0"], N, K, device=DEVICE)
    assert tri.group_linear(_x(0), w).shape == (0, N)


def test_refusals():
    w = random_weight(FORMS["q8_0"], N, K, device=DEVICE)
    with pytest.raises(ValueError, match="features"):
        tri.group_linear(_x(2, k=128), w)
    odd = random_weight(FORMS["q8_0"], 8, 96, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of 16"):
        tri.group_linear(_x(2, k=96), replace(odd, group=24, scales=odd.scales.repeat(1, 2)[:, :4]))


def test_k_splits_fill_the_gpu_while_tiles_are_few():
    assert tri.k_splits(1, 4096, 4096, 128, 4) == 4        # 128 column tiles x 4 = 512 programs
    assert tri.k_splits(1, 64, 256, 32, 4) == 8            # no more than the 8 steps
    assert tri.k_splits(32, 4096, 4096, 128, 4) == 8       # 64 tiles; partials 4 MB of 8 MB codes
    assert tri.k_splits(64, 4096, 4096, 128, 8) == 8
    assert tri.k_splits(64, 4096, 4096, 128, 4) == 4       # partials at most half the codes
    assert tri.k_splits(512, 4096, 4096, 128, 4) == 1      # prefill: 512 tiles

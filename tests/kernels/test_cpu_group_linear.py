"""kernels/cpu/group_linear.py (C) against the definitions: kernels/group_quant.py:linear_ref
for W4A16, kernels/w4a8.py:w4a8_linear_ref for W4A8."""
import dataclasses

import pytest
import torch

from tests.kernels.cpu_support import assert_matmul_close, threads

from kernels import group_quant, w4a8
from kernels.cpu import group_linear as cpu
from kernels.group_quant import GroupQuantized


@dataclasses.dataclass(frozen=True)
class Variant:
    bits: int
    group: int
    k: int
    scale_dtype: torch.dtype = torch.float16
    offsets: bool = True
    super_every: int = 0          # 0: no super level
    ordered: bool = False         # an input_order


def _weight(v: Variant, n: int, seed: int = 0) -> GroupQuantized:
    g = torch.Generator().manual_seed(seed)
    groups = v.k // v.group
    if v.bits == 4:
        codes = group_quant.pack_nibbles(torch.randint(0, 16, (n, v.k), generator=g))
    else:
        codes = torch.randint(-128, 128, (n, v.k), generator=g).to(torch.int8)
    # scales over three decades across channels, so a wrong channel or group shows
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 1e-3) * torch.logspace(-1, 1, n)[:, None]
    offsets = torch.randn(n, groups, generator=g) * 0.05 if v.offsets else None
    extra: dict = {}
    if v.super_every:
        supers = groups // v.super_every
        extra = dict(super_every=v.super_every,
                     scale_super=(torch.rand(n, supers, generator=g) + 0.5).half(),
                     offset_super=(torch.rand(n, supers, generator=g) + 0.5).half() if v.offsets else None)
    w = GroupQuantized(codes=codes, scales=scales.to(v.scale_dtype), bits=v.bits, group=v.group,
                       offsets=None if offsets is None else offsets.to(v.scale_dtype),
                       input_order=torch.randperm(v.k, generator=g) if v.ordered else None, **extra)
    group_quant.check(w)
    return w


def _x(rows: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))


VARIANTS = [
    Variant(4, 32, 576),                                             # Q4_1-like: fp16 scale and min
    Variant(4, 32, 96, offsets=False),                               # Q4_0-like, K = 3 blocks
    Variant(4, 64, 576, scale_dtype=torch.float32, ordered=True),    # GPTQ act_order
    Variant(4, 128, 1536, scale_dtype=torch.float32, offsets=False),
    Variant(4, 32, 768, super_every=8),                              # Q4_K-like two levels
    Variant(4, 32, 768, super_every=8, offsets=False, ordered=True),
    Variant(8, 16, 272, super_every=17),                             # Q6_K-like, 17 groups
    Variant(8, 16, 96, scale_dtype=torch.float32, offsets=False),
    Variant(8, 32, 576, offsets=False),                              # Q8_0-like
    Variant(8, 64, 192, scale_dtype=torch.float32, ordered=True),
    Variant(8, 128, 384),
]
ROWS = [1, 3, 8, 17, 64]


def _name(v: Variant) -> str:
    return (f"{v.bits}b-g{v.group}-k{v.k}-{str(v.scale_dtype)[6:]}" + ("-off" if v.offsets else "")
            + (f"-super{v.super_every}" if v.super_every else "") + ("-ordered" if v.ordered else ""))


def _exact_input(x: torch.Tensor, w: GroupQuantized) -> torch.Tensor:
    return group_quant.order_input(x, w)


# 1 row takes the one-row kernel, 8 channels at a time; more rows tiles of 8 rows by 2
# channels, then of 4, 2 and 1 rows (3 and 17 rows), N = 37 leaving a partial tile of
# channels (AVX-512's tiles; AVX2's are smaller); W4A8 takes 4 x 4 tiles. 64 rows take
# the widened weight and torch's GEMM (test_the_decoding_kernel_over_many_rows runs the
# tiles there). The definition dequantizes in fp32 as the kernel does: only the order of
# fp32 sums differs.
@pytest.mark.parametrize("variant", VARIANTS, ids=_name)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_w4a16_matches_the_definition(variant, rows, with_bias):
    w = _weight(variant, 37)
    x, bias = _x(rows, variant.k), (torch.randn(37) if with_bias else None)
    with threads(2):
        out = cpu.group_linear(x, w, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 37)
    assert_matmul_close(out, _exact_input(x, w), group_quant.dequantize(w), bias)
    torch.testing.assert_close(out, group_quant.linear_ref(x, w, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.bits == 4], ids=_name)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_w4a8_matches_its_definition(variant, rows, with_bias):
    """The int8 activations are the same integers as the reference's (the quantization is
    exact), each group's dot product is exact: what differs is the order of fp32 sums over
    the groups, so against the quantized activations the fp32 rounding bound holds; and
    the whole is near the W4A16 definition, off by the activations' 8 bits."""
    w = _weight(variant, 37)
    x, bias = _x(rows, variant.k), (torch.randn(37) if with_bias else None)
    with threads(2):
        out = cpu.w4a8_linear(x, w, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 37)
    xq, xscale = w4a8.quantize_per_token_symmetric(_exact_input(x, w))
    assert_matmul_close(out, xq.double() * xscale.double()[:, None], group_quant.dequantize(w), bias)
    torch.testing.assert_close(out, w4a8.w4a8_linear_ref(x, w, bias), rtol=1e-4, atol=1e-4)
    want = group_quant.linear_ref(x, w, bias)
    assert ((out - want).norm() / want.norm()).item() < 0.02


@pytest.mark.parametrize("variant", [Variant(4, 32, 576, super_every=3), Variant(8, 16, 96)], ids=_name)
def test_the_decoding_kernel_over_many_rows(variant):
    assert cpu.GEMM_MIN_ROWS <= 64
    w = _weight(variant, 37)
    x, bias = _x(64, variant.k), torch.randn(37)
    with threads(2):
        out = cpu.decoded_linear(group_quant.order_input(x, w), w, bias)
    assert_matmul_close(out, group_quant.order_input(x, w), group_quant.dequantize(w), bias)


def test_8_bit_codes_under_w4a8_take_the_weight_only_kernel():
    w = _weight(Variant(8, 32, 576), 24)
    x = _x(8, 576)
    assert cpu.w4a8_linear(x, w).equal(cpu.group_linear(x, w))


def test_w4a8_quantizes_exactly_as_its_definition():
    """Values on the rounding boundary, zeros and a zero row: the same integers and scales."""
    x = _x(6, 200) * 3
    x[1] = 0
    x[2, :7] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 127.0, -127.0])
    x[2, 7:] = 0
    k_pad = 256
    xq, xscale, xsum = torch.empty(6, k_pad, dtype=torch.int8), torch.empty(6), torch.empty(6, k_pad // 32)
    cpu._quantize_x(x.data_ptr(), x.stride(0), 6, 200, xq.data_ptr(), xscale.data_ptr(), xsum.data_ptr(), 2)
    want, want_scale = w4a8.quantize_per_token_symmetric(x)
    i = torch.arange(k_pad)
    quarter = i // 16 % 4
    position = i // 64 * 64 + torch.where(quarter == 1, 2, torch.where(quarter == 2, 1, quarter)) * 16 + i % 16
    in_order = xq[:, position]
    assert in_order[:, :200].equal(want) and not in_order[:, 200:].any()
    assert xscale.equal(want_scale)
    assert xsum.equal(in_order.float().reshape(6, -1, 32).sum(-1))


def test_leading_dims_a_row_strided_view_and_half_activations():
    w = _weight(Variant(4, 32, 64), 24)
    wide = _x(6, 96)
    x = wide[:, :64]
    assert not x.is_contiguous()
    assert_matmul_close(cpu.group_linear(x, w), x, group_quant.dequantize(w))
    x3 = _x(6, 64).view(2, 3, 64)
    assert cpu.group_linear(x3, w).shape == (2, 3, 24) and cpu.w4a8_linear(x3, w).shape == (2, 3, 24)
    out = cpu.group_linear(x3.to(torch.bfloat16), w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, group_quant.linear_ref(x3.to(torch.bfloat16), w))


def test_zero_rows():
    w = _weight(Variant(4, 32, 64), 24)
    assert cpu.group_linear(torch.empty(0, 64), w).shape == (0, 24)
    assert cpu.w4a8_linear(torch.empty(0, 64), w).shape == (0, 24)


def test_8_bit_groups_the_vector_loops_do_not_step_go_to_torch():
    w = _weight(Variant(8, 24, 96), 8)
    x = _x(3, 96)
    assert cpu.group_linear(x, w).equal(group_quant.linear(x, w))


def test_the_widened_gemm_in_slices_matches(monkeypatch):
    """An lm head's widened weight never exists whole: slices of channels at a time."""
    w = _weight(Variant(4, 32, 128), 300)
    x = _x(cpu.GEMM_MIN_ROWS, 128)
    monkeypatch.setattr(cpu, "WIDEN_VALUES", 128 * 40)
    assert_matmul_close(cpu.group_linear(x, w), x, group_quant.dequantize(w))


@pytest.mark.parametrize("thread_count", [1, 3])
def test_any_thread_count(thread_count):
    w = _weight(Variant(4, 64, 256, super_every=2), 45)
    x = _x(5, 256)
    with threads(thread_count):
        out, out8 = cpu.group_linear(x, w), cpu.w4a8_linear(x, w)
    assert_matmul_close(out, x, group_quant.dequantize(w))
    torch.testing.assert_close(out8, w4a8.w4a8_linear_ref(x, w), rtol=1e-4, atol=1e-4)


def test_the_c_view_is_made_once_and_a_copy_makes_its_own():
    """The kernel keeps its view of a weight's tensors with the weight; a weight derived
    from it (rows, a move) is other tensors and must not reuse that view."""
    w = _weight(VARIANTS[0], 37)
    x = _x(3, VARIANTS[0].k)
    first = cpu.group_linear(x, w)
    view = w.derived["cpu"]
    assert torch.equal(cpu.group_linear(x, w), first) and w.derived["cpu"] is view
    part = w.rows(0, 16)
    assert part.derived == {}
    torch.testing.assert_close(cpu.group_linear(x, part), first[:, :16], rtol=0, atol=0)
    assert part.derived["cpu"] is not view
    assert w == dataclasses.replace(w) and dataclasses.replace(w).derived == {}

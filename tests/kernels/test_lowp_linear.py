"""kernels/cpu/w8a8_linear.py and kernels/cpu/bf16_linear.py against their definitions.

Both run here forced on, whatever this CPU has: oneDNN and torch emulate int8 and bf16
GEMMs where the instructions are missing (slowly), so the numbers are checked anywhere.
"""
import pytest
import torch

from tests.kernels.cpu_support import assert_matmul_close

from kernels import int8
from kernels.cpu import bf16_linear, features, int8_matmul, w8a8_linear
from kernels.cpu import linear as fp32_linear
from kernels.dispatch import RowSplit

EPS32 = torch.finfo(torch.float32).eps
BF16_UNIT = 2.0 ** -8          # bf16 keeps 8 significant bits: relative rounding at most 2^-8 / 2 ... 2^-8

pytestmark = pytest.mark.skipif(not w8a8_linear.available(), reason="this torch has no torch._int_mm")


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _weight(n, k, seed=0):
    # rows of very different magnitudes, as real layers have
    return _randn(n, k, seed=seed) * torch.logspace(-3, 0, n)[:, None]


def _x(tokens, k, seed=1):
    # tokens of very different magnitudes too: each must get its own scale
    return _randn(tokens, k, seed=seed) * torch.logspace(0, 2, tokens)[:, None]


# ---- W8A8: the definition


def test_the_definition_is_within_the_quantization_error_of_fp32():
    n, k, t = 40, 256, 9
    w, x, bias = _weight(n, k), _x(t, k), _randn(n, seed=2)
    qweight, wscale = int8.quantize_per_channel(w)
    _, xscale, _ = int8.quantize_per_token(x)     # with no channel set apart: a looser bound
    out = int8.w8a8_linear_ref(x, qweight, wscale, bias).double()
    truth = x.double() @ w.double().T + bias.double()
    # each x_k is off by at most xscale/2 and each w_k by at most wscale/2
    x64, w64 = x.double().abs(), w.double().abs()
    bound = (x64 @ torch.ones(k, n, dtype=torch.float64) * wscale.double() / 2
             + xscale.double()[:, None] / 2 * (w64.sum(dim=1) + k * wscale.double() / 2))
    err = (out - truth).abs()
    assert (err <= bound * (1 + 1e-9)).all()
    assert err.max() > 0, "activations are quantized, not kept in fp32"


def test_outlier_channels_stay_in_fp32():
    n, k, t = 64, 256, 12
    w, x = _weight(n, k), _randn(t, k, seed=1)
    x[:, [5, 77]] *= 40                          # two channels large in every token, as in a real model
    qweight, wscale = int8.quantize_per_channel(w)
    assert set(int8.outlier_channels(x, 2).tolist()) == {5, 77}
    truth = x.double() @ int8.dequantize(qweight, wscale).double().T
    err = {c: (int8.w8a8_linear_ref(x, qweight, wscale, outliers=c).double() - truth).norm() / truth.norm()
           for c in (0, 2, 16)}
    # with them quantized the other channels keep about 3 bits; set apart, all of them about 8
    # (setting apart 14 ordinary channels more changes little either way)
    assert err[2] < err[0] / 8 and err[16] <= err[2] * 1.1
    assert int8.outlier_channels(x[:, :10], 16).numel() == 10
    assert int8.outlier_channels(x[:0], 16).numel() == 0


def test_each_token_gets_its_own_steps_and_zero_point():
    x = torch.tensor([[1.0, -0.5, 0.25, 0.0], [100.0, 3.0, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.5, 0.0]])
    xq, scale, zero = int8.quantize_per_token(x)
    torch.testing.assert_close(scale, torch.tensor([1.5 / 255, 102 / 255, 1.0, 2 / 255]))
    assert xq.dtype == torch.int8 and zero.dtype == torch.int32
    # each token's min and max land on the ends of the int8 range (0 counts: the last
    # token is all positive) and every value within half a step
    assert xq[[0, 1, 3]].amin(dim=1).tolist() == [-128, -128, -128]
    assert xq[[0, 1, 3]].amax(dim=1).tolist() == [127, 127, 127]
    back = (xq.float() - zero[:, None].float()) * scale[:, None]
    assert ((back - x).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all()
    # zero stays exactly zero (a channel set apart is a zeroed column)
    assert (back[:, 3] == 0).all() and (back[2] == 0).all()


# ---- W8A8: the kernel against the definition


def assert_w8a8_close(out, x, qweight, scale, bias=None, outliers=int8.W8A8_OUTLIERS):
    """The int32 sums are exact in both; the kernel rounds them to fp32 and scales in fp32
    (a few roundings of the result), and sums the outlier channels in fp32; the definition
    does all of it in float64."""
    x2 = x.reshape(-1, x.shape[-1])
    ref = int8.w8a8_linear_ref(x2.double(), qweight, scale, outliers=outliers).reshape(out.shape)
    cols = int8.outlier_channels(x2, outliers)
    outlying = (x2[:, cols].double().abs() @ qweight[:, cols].double().abs().T * scale.double()).reshape(out.shape)
    bound = 4 * EPS32 * ref.abs() + (len(cols) + 4) * EPS32 * outlying
    if bias is not None:
        ref = ref + bias.double()
        bound = bound + 4 * EPS32 * (ref.abs() + bias.double().abs())
    err = (out.double() - ref).abs()
    assert (err <= bound + 1e-30).all(), f"off by {(err / (bound + 1e-30)).max():.2f}x the rounding bound"


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("n,k", [(1, 16), (13, 100), (512, 256), (96, 1536)])
def test_w8a8_matches_the_definition(tokens, n, k):
    qweight, scale = int8.quantize_per_channel(_weight(n, k))
    x, bias = _x(tokens, k), _randn(n, seed=2)
    out = w8a8_linear.w8a8_linear(x, qweight, scale, bias)
    assert out.dtype == torch.float32 and out.shape == (tokens, n)
    assert_w8a8_close(out, x, qweight, scale, bias)
    assert_w8a8_close(w8a8_linear.w8a8_linear(x, qweight, scale), x, qweight, scale)


@pytest.mark.parametrize("tokens", [1, 64])
def test_w8a8_with_no_channel_apart_matches_the_definition(tokens):
    """outliers=0, for weights smoothed at load (runtime/load/smoothing.py): every channel
    quantized, and the result differs from the split's on the same input."""
    qweight, scale = int8.quantize_per_channel(_weight(96, 1536))
    x, bias = _x(tokens, 1536), _randn(96, seed=2)
    x[:, 7] *= 30                                # an outlier channel, which the split would keep apart
    out = w8a8_linear.w8a8_linear(x, qweight, scale, bias, outliers=0)
    assert_w8a8_close(out, x, qweight, scale, bias, outliers=0)
    assert not torch.allclose(out, w8a8_linear.w8a8_linear(x, qweight, scale, bias))


def test_w8a8_edges_no_rows_a_zero_token_leading_dims_and_bf16():
    qweight, scale = int8.quantize_per_channel(_weight(24, 64))
    bias = _randn(24, seed=3)
    assert w8a8_linear.w8a8_linear(torch.empty(0, 64), qweight, scale, bias).shape == (0, 24)
    x = _x(4, 64)
    x[2] = 0                                     # scale 1, all-zero int8 row: only the bias
    out = w8a8_linear.w8a8_linear(x, qweight, scale, bias)
    assert torch.equal(out[2], bias)
    x3 = _x(6, 64).view(2, 3, 64)
    out3 = w8a8_linear.w8a8_linear(x3, qweight, scale)
    assert out3.shape == (2, 3, 24)
    assert_w8a8_close(out3.reshape(6, 24), x3.reshape(6, 64), qweight, scale)
    xb = x3.to(torch.bfloat16)
    assert w8a8_linear.w8a8_linear(xb, qweight, scale).dtype == torch.bfloat16


def test_row_split_sends_few_rows_to_the_weight_only_kernel_and_many_to_w8a8():
    qweight, scale = int8.quantize_per_channel(_weight(48, 256))
    split = RowSplit(few=int8_matmul.int8_linear, many=w8a8_linear.w8a8_linear,
                     min_rows=features.W8A8_MIN_ROWS)
    few, many = _x(features.W8A8_MIN_ROWS - 1, 256), _x(features.W8A8_MIN_ROWS, 256)
    assert torch.equal(split(few, qweight, scale), int8_matmul.int8_linear(few, qweight, scale))
    assert torch.equal(split(many, qweight, scale), w8a8_linear.w8a8_linear(many, qweight, scale))
    # rows are counted over the leading dims: 2 x 4 is 8 rows
    many3 = many.view(2, features.W8A8_MIN_ROWS // 2, 256)
    assert torch.equal(split(many3, qweight, scale), w8a8_linear.w8a8_linear(many3, qweight, scale))
    # the two really differ here, so the checks above tell them apart
    assert not torch.equal(int8_matmul.int8_linear(many, qweight, scale), w8a8_linear.w8a8_linear(many, qweight, scale))


# ---- bf16


def assert_bf16_close(out, x, weight, bias=None):
    """The definition: x and weight rounded to bf16, summed in fp32, the result rounded to
    bf16, the bias added in fp32."""
    xb, wb = x.to(torch.bfloat16).double(), weight.to(torch.bfloat16).double()
    exact = xb.reshape(-1, x.shape[-1]) @ wb.T
    terms = xb.abs().reshape(-1, x.shape[-1]) @ wb.abs().T
    bound = BF16_UNIT * exact.abs() + 8 * x.shape[-1] ** 0.5 * EPS32 * terms + 1e-30
    if bias is not None:
        exact = exact + bias.double()
        bound = bound + 2 * EPS32 * exact.abs()
    err = (out.double().reshape(exact.shape) - exact).abs()
    assert (err <= bound).all(), f"off by {(err / bound).max():.2f}x the bf16 bound"


@pytest.mark.parametrize("tokens", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("n,k", [(1, 16), (13, 100), (512, 256), (96, 1536)])
def test_bf16_unblocked_matches_the_definition(tokens, n, k):
    weight, bias, x = _randn(n, k), _randn(n, seed=1), _randn(tokens, k, seed=2)
    packed = bf16_linear.pack_unblocked(weight)
    assert packed.dtype == torch.bfloat16 and not packed.is_mkldnn
    out = bf16_linear.linear(x, packed, bias)
    assert out.dtype == torch.float32 and out.shape == (tokens, n)
    assert_bf16_close(out, x, weight, bias)
    assert_bf16_close(bf16_linear.linear(x, packed), x, weight)


@pytest.mark.skipif(not features.detect().bf16_packable,
                    reason="this CPU has neither avx512bw/vl/dq nor avx_ne_convert: oneDNN cannot block bf16")
@pytest.mark.parametrize("tokens", [1, 64, 300])
def test_bf16_onednn_packed_matches_the_definition(tokens):
    weight, bias, x = _randn(96, 256), _randn(96, seed=1), _randn(tokens, 256, seed=2)
    packed = bf16_linear.pack(weight)
    assert packed.is_mkldnn and packed.dtype == torch.bfloat16
    assert_bf16_close(bf16_linear.linear(x, packed, bias), x, weight, bias)


def test_bf16_keeps_the_bias_in_fp32_and_leading_dims():
    weight = bf16_linear.pack_unblocked(_randn(8, 32))
    bias = torch.full((8,), 1000.37)             # bf16 would make it 1000.0
    assert torch.equal(bf16_linear.linear(torch.zeros(3, 32), weight, bias), bias.expand(3, 8))
    assert bf16_linear.linear(_randn(2, 3, 32), weight).shape == (2, 3, 8)


def test_a_weight_left_in_fp32_takes_the_fp32_path():
    # a tied lm head is the fp32 embedding itself, never packed
    weight, x = _randn(40, 64), _randn(5, 64, seed=1)
    assert_matmul_close(bf16_linear.linear(x, weight), x, weight)
    half = weight.half()
    assert bf16_linear.pack(half) is half and bf16_linear.pack_unblocked(half) is half
    assert torch.equal(bf16_linear.linear(x.half(), half), fp32_linear.linear(x.half(), half))


def test_bf16_is_close_to_fp32():
    # what the model sees: within a few bf16 roundings of the fp32 product
    weight, x = _randn(256, 512), _randn(32, 512, seed=1)
    out = bf16_linear.linear(x, bf16_linear.pack_unblocked(weight))
    truth = x.double() @ weight.double().T
    rel = ((out.double() - truth).norm() / truth.norm()).item()
    assert 0 < rel < 4 * BF16_UNIT

/* SwiGLU's gate, fp32: out = silu(x[:, :I]) * x[:, I:], silu(a) = a / (1 + exp(-a)).
 *
 * The contract of kernels/activation.py:silu_and_mul, its reference:
 *   x [T, 2I] (the fused gate_up projection) -> out [T, I]
 * One pass over x instead of silu's and the product's temporaries. Rows are spread
 * over OpenMP threads (torch's libgomp).
 */
#include <math.h>
#include <stdint.h>

void silu_and_mul_f32(const float *x, float *out, int64_t rows, int64_t width,
                      int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * width >= 32768)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gate = x + r * 2 * width, *up = gate + width;
        float *o = out + r * width;
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

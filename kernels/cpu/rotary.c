/* Rotary position embedding, HF rotate_half convention, fp32.
 *
 * The contract of kernels/rotary.py:apply_rotary, its reference:
 *   x [T, n, D] (token stride x_stride floats, heads contiguous), cos/sin [T, D/2]
 *   out[..., :D/2] = x1*cos - x2*sin ; out[..., D/2:] = x2*cos + x1*sin   -> out [T, n, D]
 * x is read where it lies (a q or k slice of the fused qkv projection) and out is
 * contiguous. Tokens are spread over OpenMP threads (torch's libgomp).
 */
#include <stdint.h>

void apply_rotary_f32(const float *x, int64_t x_stride, const float *cos, const float *sin,
                      float *out, int64_t tokens, int64_t heads, int64_t dim,
                      int num_threads) {
    const int64_t half = dim / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens * heads * dim >= 32768)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; ++h) {
            const float *x1 = x + t * x_stride + h * dim, *x2 = x1 + half;
            float *o1 = out + (t * heads + h) * dim, *o2 = o1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                o1[i] = x1[i] * c[i] - x2[i] * s[i];
                o2[i] = x2[i] * c[i] + x1[i] * s[i];
            }
        }
    }
}

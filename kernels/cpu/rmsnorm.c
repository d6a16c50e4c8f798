/* RMSNorm, optionally fused with the residual add, fp32; one row at a time.
 *
 * The contract of kernels/rmsnorm.py, its reference:
 *   rms_norm:           out = weight * (x * rsqrt(mean(x^2) + eps))
 *   fused_add_rms_norm: residual_out = x + residual; out = rms_norm(residual_out)
 * Rows are spread over OpenMP threads (torch's libgomp) when there are enough of them.
 * residual may be NULL (then residual_out is unused). Row strides are in floats.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

void rms_norm_f32(const float *x, int64_t x_stride, const float *residual,
                  int64_t residual_stride, const float *weight, float *out,
                  float *residual_out, int64_t rows, int64_t hidden, float eps,
                  int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * hidden >= 32768)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_stride;
        float *o = out + r * hidden;
        if (residual != NULL) {
            const float *res = residual + r * residual_stride;
            float *ro = residual_out + r * hidden;
#pragma omp simd
            for (int64_t i = 0; i < hidden; ++i) ro[i] = xr[i] + res[i];
            xr = ro;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; ++i) sum += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) o[i] = weight[i] * (xr[i] * inv);
    }
}

/* The gathered LoRA delta (Punica's BGMV), kernels/lora.py's contract:
 *
 *   out[t, :] = b[s] @ (a[s] @ x[t, :])     s = slots[t]; zeros where s < 0 (the base)
 *
 * x [T, K] fp32 (rows x_stride floats apart), a [L, R, K], b [L, N, R] fp32 contiguous
 * (an adapter of a smaller rank zero-padded to R, its scaling folded into b), slots [T]
 * int64, out [T, N] fp32. Each row is shrunk to its R values once, then expanded: R dot
 * products of length K, then N of length R, every one summed in fp32. With several rows
 * the rows are split over the OpenMP threads (torch's libgomp); one row splits its
 * output columns instead. Returns 0, or -1 (nothing written) when a slot is L or more:
 * the caller built the slots, but C trusts no index it reads memory with.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define MAX_RANK 1024   /* the widest stacked rank (parts * max_lora_rank) a row holds on the stack */

static float dot(const float *p, const float *q, int64_t n) {
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += p[i] * q[i];
    return total;
}

static void shrink(const float *x, const float *a, int64_t r, int64_t k, float *h) {
    for (int64_t j = 0; j < r; ++j) h[j] = dot(a + j * k, x, k);
}

int lora_delta_f32(const float *x, int64_t x_stride, const float *a, const float *b, const int64_t *slots,
                   float *out, int64_t rows, int64_t k, int64_t r, int64_t n, int64_t num_slots, int num_threads) {
    if (r > MAX_RANK) return -1;
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] >= num_slots) return -1;
    if (rows == 1) {
        const int64_t s = slots[0];
        if (s < 0) {
            memset(out, 0, sizeof(float) * (size_t)n);
            return 0;
        }
        float h[MAX_RANK];
        shrink(x, a + s * r * k, r, k, h);
        const float *bs = b + s * n * r;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n * r >= 65536)
        for (int64_t c = 0; c < n; ++c) out[c] = dot(bs + c * r, h, r);
        return 0;
    }
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * n * r >= 65536)
    for (int64_t t = 0; t < rows; ++t) {
        const int64_t s = slots[t];
        float *o = out + t * n;
        if (s < 0) {
            memset(o, 0, sizeof(float) * (size_t)n);
            continue;
        }
        float h[MAX_RANK];
        shrink(x + t * x_stride, a + s * r * k, r, k, h);
        const float *bs = b + s * n * r;
        for (int64_t c = 0; c < n; ++c) o[c] = dot(bs + c * r, h, r);
    }
    return 0;
}

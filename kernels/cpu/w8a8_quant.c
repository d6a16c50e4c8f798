/* W8A8's steps around the int8 GEMM (torch._int_mm), each one pass in C
 * (kernels/cpu/w8a8_linear.py): in torch they were some twenty small ops per linear
 * layer, 150-250 us on SmolLM2's shapes where the GEMM itself takes 20-70 us.
 *
 * w8a8_quantize: kernels/int8.py's split_outliers and quantize_per_token in one:
 *   the `c` channels with the largest max|x| over the rows (ties: the lower index) are
 *   copied to `outlying` [T, c] and count as 0 in xq; every row t gets its own steps:
 *   lo = min(0, min x_t), hi = max(0, max x_t), scale = (hi - lo) / 255 (1 if 0),
 *   zero = round(-lo / scale) - 128, xq = clamp(round(x * (1 / scale)) + zero, -128, 127);
 *   row T of xq is all ones, so that the GEMM also sums each weight row (the zero
 *   points need those sums). Same fp32 operations as the torch definition, so the same
 *   integers: this file is built without fast-math and without contraction (an FMA of
 *   x * (1 / scale) with round_even's addition moved a value that sat on .5 across the
 *   rounding boundary).
 * w8a8_epilogue: out[t, n] = ((acc[t, n] - zero[t] * acc[T, n]) * xscale[t]
 *                             + sum_c outlying[t, c] * qweight[n, cols[c]]) * wscale[n] + bias[n]
 */
#pragma GCC optimize("no-fast-math", "fp-contract=off")
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void outlier_columns(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                            int64_t c, float *colmax, int64_t *cols) {
    for (int64_t j = 0; j < k; ++j) colmax[j] = 0.0f;
    for (int64_t t = 0; t < rows; ++t) {
        const float *xr = x + t * x_stride;
#pragma omp simd
        for (int64_t j = 0; j < k; ++j) {
            const float a = fabsf(xr[j]);
            colmax[j] = a > colmax[j] ? a : colmax[j];
        }
    }
    /* c passes of a max search (c is 16, k a few thousand): the largest value first,
     * then its lowest index */
    for (int64_t i = 0; i < c; ++i) {
        float top = -1.0f;
#pragma omp simd reduction(max : top)
        for (int64_t j = 0; j < k; ++j) top = colmax[j] > top ? colmax[j] : top;
        int64_t best = 0;
        while (colmax[best] != top) ++best;
        cols[i] = best;
        colmax[best] = -1.0f;                  /* taken */
    }
}

/* round half to even of |v| < 2^22, as torch.round and nearbyintf: adding and taking away
 * 1.5 * 2^23 leaves no bits below the unit. Exact under the default rounding mode (this
 * file keeps IEEE arithmetic), and it vectorizes, where a nearbyintf call per value does
 * not. */
static inline float round_even(float v) {
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

/* Returns 0, or -1 when there is no memory for the per-column scratch. */
int w8a8_quantize(const float *x, int64_t x_stride, int64_t rows, int64_t k, int64_t c,
                  int8_t *xq, float *scale, int32_t *zero, float *outlying, int64_t *cols,
                  int num_threads) {
    float *colmax = malloc(sizeof(float) * (size_t)k);
    if (colmax == NULL) return -1;
    if (c > 0) {
        outlier_columns(x, x_stride, rows, k, c, colmax, cols);
    } else {                                   /* smoothed weights: no pass over x for maxima */
        for (int64_t j = 0; j < k; ++j) colmax[j] = 0.0f;
    }
    /* colmax < 0 now marks exactly the outlier columns: a mask of 0 there, 1 elsewhere */
    for (int64_t j = 0; j < k; ++j) colmax[j] = colmax[j] < 0.0f ? 0.0f : 1.0f;
    const float *keep = colmax;
#pragma omp parallel for num_threads(num_threads) if (rows * k >= 65536)
    for (int64_t t = 0; t < rows; ++t) {
        const float *xr = x + t * x_stride;
        float lo = 0.0f, hi = 0.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi)
        for (int64_t j = 0; j < k; ++j) {
            float v = xr[j] * keep[j];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        float step = (hi - lo) / 255.0f;
        float s = step > 0.0f ? step : 1.0f;
        float z = round_even(-lo / s) - 128.0f;
        float inv = 1.0f / s;                  /* a product per value, not a division */
        int8_t *q = xq + t * k;
#pragma omp simd
        for (int64_t j = 0; j < k; ++j) {
            float r = round_even(xr[j] * keep[j] * inv) + z;
            r = r < -128.0f ? -128.0f : r;
            q[j] = (int8_t)(r > 127.0f ? 127.0f : r);
        }
        for (int64_t i = 0; i < c; ++i) outlying[t * c + i] = xr[cols[i]];
        scale[t] = s;
        zero[t] = (int32_t)z;
    }
    for (int64_t j = 0; j < k; ++j) xq[rows * k + j] = 1;
    free(colmax);
    return 0;
}

/* Rows [t0, t0 + rb) x columns [j0, j0 + width) of the epilogue; inlined with rb 4 and
 * width 16, so that the 4 x 16 results stay in registers over the c outlier channels:
 * each outlier weight vector is loaded once for 4 rows, and 8 independent chains of
 * multiply-adds hide their latency (one row at a time was latency-bound). */
static inline __attribute__((always_inline)) void epilogue_block(
        const int32_t *acc, const int32_t *zero, const float *xscale, const float *outlying,
        const float *wc, int64_t n, int64_t c, const float *wscale, const float *bias, float *out,
        int64_t rows, int64_t t0, int64_t rb, int64_t j0, int64_t width) {
    float v[4][16];
    for (int64_t r = 0; r < rb; ++r) {
        const int64_t t = t0 + r;
        const float st = xscale[t];
        const int32_t zt = zero[t], *a = acc + t * n + j0, *wsum = acc + rows * n + j0;
#pragma omp simd
        for (int64_t jj = 0; jj < width; ++jj) v[r][jj] = (float)(a[jj] - zt * wsum[jj]) * st;
    }
    for (int64_t i = 0; i < c; ++i) {
        const float *w = wc + i * n + j0;
        for (int64_t r = 0; r < rb; ++r) {
            const float xi = outlying[(t0 + r) * c + i];
#pragma omp simd
            for (int64_t jj = 0; jj < width; ++jj) v[r][jj] += xi * w[jj];
        }
    }
    for (int64_t r = 0; r < rb; ++r) {
        float *o = out + (t0 + r) * n + j0;
#pragma omp simd
        for (int64_t jj = 0; jj < width; ++jj)
            o[jj] = v[r][jj] * wscale[j0 + jj] + (bias != NULL ? bias[j0 + jj] : 0.0f);
    }
}

/* acc: [T + 1, N] int32, torch._int_mm's (row T: each weight row's sum). Returns 0, or
 * -1 when there is no memory for the gathered outlier weights. */
int w8a8_epilogue(const int32_t *acc, int64_t rows, int64_t n, const int32_t *zero,
                  const float *xscale, const float *wscale, const float *bias,
                  const float *outlying, const int8_t *qweight, int64_t k, const int64_t *cols,
                  int64_t c, float *out, int num_threads) {
    /* the outlier channels' int8 weights as floats, [c, n]: read along n below */
    float *wc = malloc(sizeof(float) * (size_t)(c > 0 ? c * n : 1));
    if (wc == NULL) return -1;
    for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < n; ++j) wc[i * n + j] = (float)qweight[j * k + cols[i]];
#pragma omp parallel for num_threads(num_threads) if (rows * n * (c + 4) >= 262144)
    for (int64_t t0 = 0; t0 < rows; t0 += 4) {
        const int64_t rb = rows - t0 < 4 ? rows - t0 : 4;
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const int64_t width = n - j0 < 16 ? n - j0 : 16;
            if (rb == 4 && width == 16)
                epilogue_block(acc, zero, xscale, outlying, wc, n, c, wscale, bias, out, rows, t0, 4,
                               j0, 16);
            else
                epilogue_block(acc, zero, xscale, outlying, wc, n, c, wscale, bias, out, rows, t0, rb,
                               j0, width);
        }
    }
    free(wc);
    return 0;
}

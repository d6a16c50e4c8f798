/* W8A8's steps around the int8 GEMM, each one pass in C (kernels/cpu/w8a8_linear.py):
 * in torch they were some twenty small ops per linear layer, 150-250 us on SmolLM2's
 * shapes where the GEMM itself takes 20-70 us.
 *
 * w8a8_quantize: kernels/int8.py's split_outliers and quantize_per_token in one:
 *   the `c` channels with the largest max|x| over the rows (ties: the lower index) are
 *   copied to `outlying` [T, c] and count as 0 in xq; every row t gets its own steps:
 *   lo = min(0, min x_t), hi = max(0, max x_t), scale = (hi - lo) / 255 (1 if 0),
 *   zero = round(-lo / scale) - 128, xq = clamp(round(x / scale) + zero, -128, 127);
 *   row T of xq is all ones, so that the GEMM also sums each weight row (the zero
 *   points need those sums). Same fp32 operations as the torch definition, so the same
 *   integers: this file is built without fast-math (a reciprocal for x / scale would
 *   move a value across a rounding boundary now and then).
 * w8a8_epilogue: out[t, n] = ((acc[t, n] - zero[t] * acc[T, n]) * xscale[t]
 *                             + sum_c outlying[t, c] * qweight[n, cols[c]]) * wscale[n] + bias[n]
 */
#pragma GCC optimize("no-fast-math")
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void outlier_columns(const float *x, int64_t x_stride, int64_t rows, int64_t k,
                            int64_t c, float *colmax, int64_t *cols) {
    for (int64_t j = 0; j < k; ++j) colmax[j] = 0.0f;
    for (int64_t t = 0; t < rows; ++t) {
        const float *xr = x + t * x_stride;
        for (int64_t j = 0; j < k; ++j) colmax[j] = fmaxf(colmax[j], fabsf(xr[j]));
    }
    /* c passes of a max search: c is 16 and k a few thousand */
    for (int64_t i = 0; i < c; ++i) {
        int64_t best = -1;
        for (int64_t j = 0; j < k; ++j)
            if (colmax[j] >= 0.0f && (best < 0 || colmax[j] > colmax[best])) best = j;
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
    outlier_columns(x, x_stride, rows, k, c, colmax, cols);
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
        int8_t *q = xq + t * k;
#pragma omp simd
        for (int64_t j = 0; j < k; ++j) {
            float r = round_even(xr[j] * keep[j] / s) + z;
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

/* Columns [j0, j0 + width) of one row of the epilogue; inlined with width 16, so that the
 * 16 sums stay in registers over the c outlier channels. */
static inline __attribute__((always_inline)) void epilogue_cols(
        const int32_t *a, const int32_t *wsum, int32_t zt, float st, const float *xo,
        const float *wc, int64_t n, int64_t c, const float *wscale, const float *bias,
        float *o, int64_t j0, int64_t width) {
    float v[16];
#pragma omp simd
    for (int64_t jj = 0; jj < width; ++jj) v[jj] = (float)(a[j0 + jj] - zt * wsum[j0 + jj]) * st;
    for (int64_t i = 0; i < c; ++i) {
        const float xi = xo[i];
        const float *w = wc + i * n + j0;
#pragma omp simd
        for (int64_t jj = 0; jj < width; ++jj) v[jj] += xi * w[jj];
    }
#pragma omp simd
    for (int64_t jj = 0; jj < width; ++jj)
        o[j0 + jj] = v[jj] * wscale[j0 + jj] + (bias != NULL ? bias[j0 + jj] : 0.0f);
}

/* Returns 0, or -1 when there is no memory for the gathered outlier weights. */
int w8a8_epilogue(const int32_t *acc, int64_t rows, int64_t n, const int32_t *zero,
                  const float *xscale, const float *wscale, const float *bias,
                  const float *outlying, const int8_t *qweight, int64_t k, const int64_t *cols,
                  int64_t c, float *out, int num_threads) {
    /* the outlier channels' int8 weights as floats, [c, n]: read along n below */
    float *wc = malloc(sizeof(float) * (size_t)(c > 0 ? c * n : 1));
    if (wc == NULL) return -1;
    for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j < n; ++j) wc[i * n + j] = (float)qweight[j * k + cols[i]];
    const int32_t *wsum = acc + rows * n;
#pragma omp parallel for num_threads(num_threads) if (rows * n * (c + 4) >= 262144)
    for (int64_t t = 0; t < rows; ++t) {
        const int32_t *a = acc + t * n;
        const float *xo = outlying + t * c;
        float *o = out + t * n;
        int64_t j0 = 0;
        for (; j0 + 16 <= n; j0 += 16)
            epilogue_cols(a, wsum, zero[t], xscale[t], xo, wc, n, c, wscale, bias, o, j0, 16);
        if (j0 < n)
            epilogue_cols(a, wsum, zero[t], xscale[t], xo, wc, n, c, wscale, bias, o, j0, n - j0);
    }
    free(wc);
    return 0;
}

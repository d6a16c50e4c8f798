/* Batch-invariant fp32 linear: out[m, n] = sum_k x[m, k] * w[n, k] + bias[n]
 *
 * The contract of kernels/linear.py:linear (x [M, K] with row stride x_stride floats,
 * w [N, K] contiguous, bias [N] or NULL, out [M, N] contiguous), with one more promise:
 * every output element is computed by the same sequence of floating-point operations
 * whatever M is, wherever its row sits among the others, and however many threads run.
 * A library GEMM picks its blocking, its micro-kernel and its split of K by the shape, so
 * one row's sums come out in a different order (a different last bit) in a batch of 7
 * than alone; that is what the engine's batch-invariant mode cannot have.
 *
 * The fixed order: 8 lanes, lane j summing x[k] * w[k] for k = j, j + 8, ... in turn with
 * one fused multiply-add each (a K that is not a multiple of 8 ends with a zero-padded
 * step), then the lanes added in one fixed tree, then the bias. Tiles of up to MR rows by
 * NR output channels share their loads (each loaded x vector feeds NR sums, each w vector
 * MR) but never their sums, so a row computed in a full tile, a tail tile or alone gives
 * the same bits. Threads split the output channels into fixed panels; a thread's share
 * changes nothing in any one sum.
 *
 * The file is compiled with -ffast-math like the other kernels: reassociation is turned off
 * here, as it would let the compiler split a lane's sum differently in different tiles.
 */
#pragma GCC optimize("no-associative-math", "no-reciprocal-math", "fp-contract=off")

#include <omp.h>
#include <stdint.h>
#include <string.h>

#define MR 3           /* rows of x per tile */
#define NR 4           /* output channels per tile */
#define PANEL 64       /* output channels per unit of thread work: 64 rows of w stay in L2 */
#define ROW_BLOCK 48   /* rows of x at a time (a multiple of MR: only the last block has a tail) */

typedef float vf8 __attribute__((vector_size(32), aligned(4)));

#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
static inline __attribute__((always_inline)) vf8 madd(vf8 a, vf8 b, vf8 c) {
    return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
static inline __attribute__((always_inline)) vf8 load8(const float *p) {
    return (vf8)_mm256_loadu_ps(p);
}
#else
static inline __attribute__((always_inline)) vf8 madd(vf8 a, vf8 b, vf8 c) { return a * b + c; }
static inline __attribute__((always_inline)) vf8 load8(const float *p) {
    vf8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
#endif

/* The 8 floats at p, only the first n < 8 of them real, the rest zero. */
static inline vf8 load_tail(const float *p, int64_t n) {
    float buf[8] = {0};
    memcpy(buf, p, sizeof(float) * n);
    return load8(buf);
}

/* The one order every sum's lanes are added in. */
static inline float lanes_sum(vf8 a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* A tile of mr rows (x rows) by nr channels (w rows), mr <= MR and nr <= NR compile-time
   constants at each call, so the sums stay in registers. */
static inline __attribute__((always_inline)) void tile(
        const float *x, int64_t x_stride, const float *w, int64_t k_len, const float *bias,
        float *out, int64_t n_total, const int mr, const int nr) {
    vf8 acc[MR][NR];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < mr; ++i)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < nr; ++j) acc[i][j] = (vf8){0};
    int64_t k = 0;
    for (; k + 8 <= k_len; k += 8) {
        vf8 xv[MR];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < mr; ++i) xv[i] = load8(x + i * x_stride + k);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < nr; ++j) {
            const vf8 wv = load8(w + j * k_len + k);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < mr; ++i) acc[i][j] = madd(xv[i], wv, acc[i][j]);
        }
    }
    if (k < k_len) {
        vf8 xv[MR];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < mr; ++i) xv[i] = load_tail(x + i * x_stride + k, k_len - k);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < nr; ++j) {
            const vf8 wv = load_tail(w + j * k_len + k, k_len - k);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < mr; ++i) acc[i][j] = madd(xv[i], wv, acc[i][j]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < mr; ++i)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < nr; ++j)
            out[i * n_total + j] = lanes_sum(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

/* Rows 0 .. rows - 1 of a tile of NRC channels: MR at a time, then the 1 or 2 left. */
#define ROWS_OF_TILE(NRC)                                                                   \
    do {                                                                                    \
        int64_t m = 0;                                                                      \
        for (; m + MR <= rows; m += MR)                                                     \
            tile(x + m * x_stride, x_stride, wn, k_len, bn, out + m * n_total + n, n_total, \
                 MR, NRC);                                                                  \
        if (rows - m == 2)                                                                  \
            tile(x + m * x_stride, x_stride, wn, k_len, bn, out + m * n_total + n, n_total, \
                 2, NRC);                                                                   \
        else if (rows - m == 1)                                                             \
            tile(x + m * x_stride, x_stride, wn, k_len, bn, out + m * n_total + n, n_total, \
                 1, NRC);                                                                   \
    } while (0)

/* Channels n0 .. n1 - 1 of `rows` rows. */
static void block(const float *x, int64_t x_stride, const float *w, const float *bias,
                  float *out, int64_t rows, int64_t n0, int64_t n1, int64_t n_total, int64_t k_len) {
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) {
        const float *wn = w + n * k_len, *bn = bias ? bias + n : NULL;
        ROWS_OF_TILE(NR);
    }
    for (; n < n1; ++n) {
        const float *wn = w + n * k_len, *bn = bias ? bias + n : NULL;
        ROWS_OF_TILE(1);
    }
}

/* Channels n0 .. n1 - 1 of every row, ROW_BLOCK rows at a time: the block's x rows and
   the panel's w rows both stay in L2 while every tile of the block reads them. */
static void panel(const float *x, int64_t x_stride, const float *w, const float *bias,
                  float *out, int64_t rows, int64_t n0, int64_t n1, int64_t n_total, int64_t k_len) {
    for (int64_t m = 0; m < rows; m += ROW_BLOCK)
        block(x + m * x_stride, x_stride, w, bias, out + m * n_total,
              rows - m < ROW_BLOCK ? rows - m : ROW_BLOCK, n0, n1, n_total, k_len);
}

void invariant_linear_f32(const float *x, int64_t x_stride, const float *w, const float *bias,
                          float *out, int64_t rows, int64_t n_total, int64_t k_len,
                          int num_threads) {
    const int64_t panels = (n_total + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t p = 0; p < panels; ++p) {
        const int64_t n0 = p * PANEL, n1 = n0 + PANEL < n_total ? n0 + PANEL : n_total;
        panel(x, x_stride, w, bias, out, rows, n0, n1, n_total, k_len);
    }
}

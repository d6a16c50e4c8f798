/* Weight-only int8 matmul with fp32 activations: out = x @ (qweight * scale[:, None]).T
 *
 * The contract of kernels/int8.py:int8_linear_ref, its reference (the definition):
 *   x [T, K] fp32 (row stride x_stride floats), qweight [N, K] int8, scale [N] fp32,
 *   out [T, N] fp32 (contiguous)
 * Activations stay fp32 (torch's own CPU int8 GEMV rounds them to bf16). Output channels
 * are split over OpenMP threads (torch's libgomp) in contiguous ranges, so each thread
 * streams its rows of qweight once, 1 byte per weight: at few rows of x, where a matmul
 * is bound by reading its weights, that is the 4x over fp32 weights that int8 is for.
 *
 * A tile is R rows of x by C output channels: each weight, widened to fp32 in a
 * register, meets R rows, each x value C channels, and the R*C sums stay in vector
 * registers until the end (1 x 8 for a single row, 4 x 4 otherwise). Rows or channels
 * short of a whole tile repeat the last one and are not stored. With AVX-512 the tiles
 * are written with intrinsics (the compiler's own vectorization spilled accumulators);
 * elsewhere a plain loop does the same sums.
 */
#include <stdint.h>

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

static inline __m512 widen(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

#define DEFINE_TILE(R, C)                                                                   \
    static void tile_##R##_##C(const float *const *x, const int8_t *const *q, int64_t k,    \
                               float *s /* [R][C] */) {                                     \
        __m512 acc[R][C];                                                                   \
        for (int r = 0; r < R; ++r)                                                         \
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();                    \
        for (int64_t i = 0; i < k; i += 16) {                                               \
            const __mmask16 m = k - i >= 16 ? 0xffff : (__mmask16)((1u << (k - i)) - 1);    \
            __m512 w[C];                                                                    \
            for (int c = 0; c < C; ++c) w[c] = widen(q[c] + i, m);                          \
            for (int r = 0; r < R; ++r) {                                                   \
                const __m512 xv = _mm512_maskz_loadu_ps(m, x[r] + i);                       \
                for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]); \
            }                                                                               \
        }                                                                                   \
        for (int r = 0; r < R; ++r)                                                         \
            for (int c = 0; c < C; ++c) s[r * C + c] = _mm512_reduce_add_ps(acc[r][c]);     \
    }

#else

#define DEFINE_TILE(R, C)                                                                   \
    static void tile_##R##_##C(const float *const *x, const int8_t *const *q, int64_t k,    \
                               float *s /* [R][C] */) {                                     \
        for (int r = 0; r < R; ++r)                                                         \
            for (int c = 0; c < C; ++c) {                                                   \
                const float *xr = x[r];                                                     \
                const int8_t *qc = q[c];                                                    \
                float sum = 0.0f;                                                           \
                _Pragma("omp simd reduction(+ : sum)")                                      \
                for (int64_t i = 0; i < k; ++i) sum += xr[i] * (float)qc[i];                \
                s[r * C + c] = sum;                                                         \
            }                                                                               \
    }

#endif

DEFINE_TILE(1, 8)
DEFINE_TILE(4, 4)

/* out[t0 .. t0+R, n0 .. n0+C] through the R x C tile `run` */
static void tile_at(void (*run)(const float *const *, const int8_t *const *, int64_t, float *),
                    int R, int C, const float *x, int64_t x_stride, const int8_t *qweight,
                    const float *scale, float *out, int64_t tokens, int64_t n, int64_t k,
                    int64_t t0, int64_t n0) {
    const int64_t rows = min64(tokens - t0, R), channels = min64(n - n0, C);
    const float *xs[4];
    const int8_t *qs[8];
    float s[32];
    for (int r = 0; r < R; ++r) xs[r] = x + (t0 + min64(r, rows - 1)) * x_stride;
    for (int c = 0; c < C; ++c) qs[c] = qweight + (n0 + min64(c, channels - 1)) * k;
    run(xs, qs, k, s);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < channels; ++c) out[(t0 + r) * n + n0 + c] = s[r * C + c] * scale[n0 + c];
}

void int8_linear_f32(const float *x, int64_t x_stride, const int8_t *qweight, const float *scale,
                     float *out, int64_t tokens, int64_t n, int64_t k, int num_threads) {
    const int single = tokens == 1;
    const int R = single ? 1 : 4, C = single ? 8 : 4;
    void (*run)(const float *const *, const int8_t *const *, int64_t, float *) =
        single ? tile_1_8 : tile_4_4;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t n0 = 0; n0 < n; n0 += C)
        for (int64_t t0 = 0; t0 < tokens; t0 += R)
            tile_at(run, R, C, x, x_stride, qweight, scale, out, tokens, n, k, t0, n0);
}

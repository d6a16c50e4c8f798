/* Linear layers over group-wise quantized weights, the layout of kernels/group_quant.py:
 *
 *   w[n, k] = scale[n, g] * code[n, k] + offset[n, g]      g = k / group
 *   scale[n, g] = scales[n, g] * scale_super[n, g / super_every]   (likewise offset)
 *
 * - group_linear_f32 (W4A16, weight-only): out = x @ w.T (+ bias), x fp32, sums in fp32.
 *   Output channels are split over OpenMP threads (torch's libgomp) in tiles of C channels;
 *   a tile's per-group scales and offsets are widened to fp32 once (both levels
 *   multiplied), then each group's codes are decoded in registers (a 16-byte load, a mask
 *   and a shift give 32 4-bit values) into fp32 weights, scale * code + offset, that R
 *   rows of x multiply while they sit in registers: decoded once per R rows, not per row.
 * - group_dequantize: rows of w widened to fp32, for torch's GEMM over many rows of x.
 * - group_quantize_x + group_linear_a8 (W4A8, bits 4 only): x quantized per token to
 *   int8 (kernels/w4a8.py, the definition), then per group an exact integer dot product
 *   of the int8 activations with the 4-bit codes (AVX512-VNNI or AVX-VNNI vpdpbusd, else
 *   AVX2 maddubs), combined in fp32 as llama.cpp does:
 *       out[t, n] = xscale[t] * sum_g (scale[n, g] * sum_{k in g} xq q + offset[n, g] * sum_{k in g} xq)
 *   The activations are stored for that dot product: each 64 values (two 32-value
 *   blocks of codes) in the order of their 16-value quarters 0, 2, 1, 3, because a 32-byte
 *   load of two blocks' codes gives, masked, values 0-15 of both blocks and, shifted,
 *   values 16-31 of both: the int8 products then pair up with no shuffle of the codes.
 *
 * Vector paths for AVX-512, AVX2 with FMA, else plain loops (the build is -march=native).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define UNROLLED _Pragma("GCC unroll 16")
#define BLOCK 32                                  /* values per 16 bytes of 4-bit codes */

typedef struct {
    const void *codes;                            /* bits 4: uint8 [n, k/2]; bits 8: int8 [n, k] */
    const void *scales;                           /* [n, groups], fp16 or fp32 */
    const void *offsets;                          /* [n, groups], fp16 or fp32; NULL: none */
    const uint16_t *scale_super;                  /* fp16 [n, groups / super_every]; NULL: none */
    const uint16_t *offset_super;
    int64_t n, k, group, super_every;
    int32_t bits, half_scales, half_offsets;
} gq_weight;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- per-group parameters ---------------------------------------------------------- */

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {                                      /* zero or subnormal: man * 2^-24 exactly */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
#endif
}

static void to_float(const void *src, int half, int64_t count, float *dst) {
    if (!half) {
        memcpy(dst, src, sizeof(float) * (size_t)count);
        return;
    }
    const uint16_t *s = src;
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < count; ++i) dst[i] = half_to_float(s[i]);
}

/* values [count * groups] of per-group parameter `lower` of channels c .. c + count,
 * times `upper` if given; tmp: count * groups floats */
static void level(const void *lower, int half, const uint16_t *upper, int64_t every, int64_t groups,
                  int64_t c, int64_t count, float *out, float *tmp) {
    to_float((const char *)lower + c * groups * (half ? 2 : 4), half, count * groups, out);
    if (upper == NULL) return;
    const int64_t supers = groups / every;
    to_float(upper + c * supers, 1, count * supers, tmp);
    for (int64_t u = 0; u < count * supers; ++u)
        for (int64_t g = u * every; g < (u + 1) * every; ++g) out[g] *= tmp[u];
}

/* scale[count * groups] and offset[count * groups] (0 without offsets) of channels
 * c .. c + count, converted in one pass each (a tile's rows are contiguous) */
static void group_params(const gq_weight *w, int64_t c, int64_t count, float *scale, float *offset,
                         float *tmp) {
    const int64_t groups = w->k / w->group;
    level(w->scales, w->half_scales, w->scale_super, w->super_every, groups, c, count, scale, tmp);
    if (w->offsets != NULL)
        level(w->offsets, w->half_offsets, w->offset_super, w->super_every, groups, c, count, offset, tmp);
    else
        memset(offset, 0, sizeof(float) * (size_t)(count * groups));
}

/* group_params of the C channels of a tile from n0; channels past n repeat the last */
static void tile_params(const gq_weight *w, int64_t n0, int64_t C, float *scale, float *offset, float *tmp) {
    const int64_t groups = w->k / w->group;
    if (n0 + C <= w->n) {
        group_params(w, n0, C, scale, offset, tmp);
        return;
    }
    for (int64_t c = 0; c < C; ++c)
        group_params(w, min64(n0 + c, w->n - 1), 1, scale + c * groups, offset + c * groups, tmp);
}

static inline const uint8_t *code_row(const gq_weight *w, int64_t c) {
    return (const uint8_t *)w->codes + c * (w->bits == 4 ? w->k / 2 : w->k);
}

/* the codes of the tile after this one (channels from n0), asked of the memory while this
   tile computes: the channels' rows are one run of bytes, which a decode step streams
   once per layer from beyond the caches */
static inline void prefetch_tile(const gq_weight *w, int64_t n0, int64_t C) {
#if defined(__SSE2__)
    if (n0 >= w->n) return;
    const char *start = (const char *)code_row(w, n0), *end = (const char *)code_row(w, min64(n0 + C, w->n));
    for (const char *p = start; p < end; p += 64) _mm_prefetch(p, _MM_HINT_T0);
#else
    (void)w; (void)n0; (void)C;
#endif
}

/* ---- 16 bytes of codes, 16 floats --------------------------------------------------- */

#if defined(__SSE2__)
typedef __m128i b16;
static inline b16 b16_load(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline b16 b16_low(b16 b) { return _mm_and_si128(b, _mm_set1_epi8(0x0f)); }
static inline b16 b16_high(b16 b) { return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f)); }
#else
typedef struct { uint8_t b[16]; } b16;
static inline b16 b16_load(const uint8_t *p) { b16 r; memcpy(r.b, p, 16); return r; }
static inline b16 b16_low(b16 v) { for (int i = 0; i < 16; ++i) v.b[i] &= 0x0f; return v; }
static inline b16 b16_high(b16 v) { for (int i = 0; i < 16; ++i) v.b[i] >>= 4; return v; }
#endif

#if defined(__AVX512F__)
#define TILE_R 8                                  /* rows of x per tile, more than one row */
#define TILE_C 2                                  /* channels per tile, more than one row */
#define ONE_ROW_C 8                               /* channels per tile, one row */
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float a) { return _mm512_set1_ps(a); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vf_sum(vf a) { return _mm512_reduce_add_ps(a); }
static inline vf vf_u8(b16 b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
static inline vf vf_i8(b16 b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
/* the 32 values of a block of 4-bit codes: the 16 bytes widened to 32 bits once, then
   each nibble looked up as a float in a register of 0..15 (a permute reads only the low
   4 bits of its index: no mask, and no conversion on the port the multiply-adds share) */
static inline void vf_nibbles(const uint8_t *p, vf *lo, vf *hi) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_permutexvar_ps(b, codes);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), codes);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define TILE_R 2
#define TILE_C 2
#define ONE_ROW_C 4
typedef struct { __m256 lo, hi; } vf;
static inline vf vf_zero(void) { vf r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline vf vf_load(const float *p) { vf r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline vf vf_set1(float a) { vf r = {_mm256_set1_ps(a), _mm256_set1_ps(a)}; return r; }
static inline vf vf_fma(vf a, vf b, vf c) {
    vf r = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    return r;
}
static inline float vf_sum(vf a) {
    __m256 s = _mm256_add_ps(a.lo, a.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline vf vf_u8(b16 b) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
    return r;
}
static inline vf vf_i8(b16 b) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
    return r;
}
#else
#define TILE_R 2
#define TILE_C 2
#define ONE_ROW_C 4
typedef struct { float v[16]; } vf;
static inline vf vf_zero(void) { vf r = {{0}}; return r; }
static inline vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void vf_store(float *p, vf v) { memcpy(p, v.v, sizeof v.v); }
static inline vf vf_set1(float a) { vf r; for (int i = 0; i < 16; ++i) r.v[i] = a; return r; }
static inline vf vf_fma(vf a, vf b, vf c) { for (int i = 0; i < 16; ++i) c.v[i] += a.v[i] * b.v[i]; return c; }
static inline float vf_sum(vf a) { float s = 0; for (int i = 0; i < 16; ++i) s += a.v[i]; return s; }
static inline vf vf_u8(b16 b) {
    vf r;
    uint8_t u[16];
    memcpy(u, &b, 16);
    for (int i = 0; i < 16; ++i) r.v[i] = (float)u[i];
    return r;
}
static inline vf vf_i8(b16 b) {
    vf r;
    int8_t s[16];
    memcpy(s, &b, 16);
    for (int i = 0; i < 16; ++i) r.v[i] = (float)s[i];
    return r;
}
#endif

#if !defined(__AVX512F__)
static inline void vf_nibbles(const uint8_t *p, vf *lo, vf *hi) {
    const b16 bytes = b16_load(p);
    *lo = vf_u8(b16_low(bytes));
    *hi = vf_u8(b16_high(bytes));
}
#endif

/* ---- W4A16 ------------------------------------------------------------------------- */

/* sums[r * C + c] = x_r . w_c over all of K, for R rows of x and C channels whose codes
 * start at q[c] and whose group parameters are scale/offset[c * groups ..]. bits, R and C
 * are constants where this is inlined, so the loops below unroll into registers. */
static inline __attribute__((always_inline)) void tile_f32(
        const float *const *xs, const uint8_t *const *q, const float *scale, const float *offset,
        int64_t groups, int64_t group, float *sums, const int bits, const int R, const int C) {
    vf acc[TILE_R][TILE_C];
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = vf_zero();
    for (int64_t g = 0; g < groups; ++g) {
        vf s[TILE_C], o[TILE_C];
        UNROLLED for (int c = 0; c < C; ++c) {
            s[c] = vf_set1(scale[c * groups + g]);
            o[c] = vf_set1(offset[c * groups + g]);
        }
        const int64_t end = (g + 1) * group;
        if (bits == 4) {
            for (int64_t i = g * group; i < end; i += BLOCK) {
                vf wv[TILE_C], high[TILE_C];
                UNROLLED for (int c = 0; c < C; ++c) {
                    vf low;
                    vf_nibbles(q[c] + i / 2, &low, &high[c]);
                    wv[c] = vf_fma(low, s[c], o[c]);
                }
                UNROLLED for (int r = 0; r < R; ++r) {
                    const vf xv = vf_load(xs[r] + i);
                    UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = vf_fma(xv, wv[c], acc[r][c]);
                }
                UNROLLED for (int c = 0; c < C; ++c) wv[c] = vf_fma(high[c], s[c], o[c]);
                UNROLLED for (int r = 0; r < R; ++r) {
                    const vf xv = vf_load(xs[r] + i + 16);
                    UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = vf_fma(xv, wv[c], acc[r][c]);
                }
            }
        } else {
            for (int64_t i = g * group; i < end; i += 16) {
                vf wv[TILE_C];
                UNROLLED for (int c = 0; c < C; ++c) wv[c] = vf_fma(vf_i8(b16_load(q[c] + i)), s[c], o[c]);
                UNROLLED for (int r = 0; r < R; ++r) {
                    const vf xv = vf_load(xs[r] + i);
                    UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = vf_fma(xv, wv[c], acc[r][c]);
                }
            }
        }
    }
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) sums[r * C + c] = vf_sum(acc[r][c]);
}

/* One row of x by C channels: a row shares no decoded weight, so rather than widening
 * each weight (scale * code + offset, an operation per weight) the products of x with
 * the codes are summed per group and scaled once per group, and the offsets meet the
 * group sums of x (xg) at the end: sums[c] = sum_g scale_g x_g . code_g + offset_g xg_g. */
static inline __attribute__((always_inline)) void row_f32(
        const float *x, const float *xg, const uint8_t *const *q, const float *scale, const float *offset,
        int64_t groups, int64_t group, float *sums, const int bits) {
    vf acc[ONE_ROW_C];
    UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) acc[c] = vf_zero();
    for (int64_t g = 0; g < groups; ++g) {
        vf part[ONE_ROW_C];
        UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) part[c] = vf_zero();
        const int64_t end = (g + 1) * group;
        if (bits == 4) {
            for (int64_t i = g * group; i < end; i += BLOCK) {
                const vf lo = vf_load(x + i), hi = vf_load(x + i + 16);
                UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) {
                    vf qlo, qhi;
                    vf_nibbles(q[c] + i / 2, &qlo, &qhi);
                    part[c] = vf_fma(lo, qlo, part[c]);
                    part[c] = vf_fma(hi, qhi, part[c]);
                }
            }
        } else {
            for (int64_t i = g * group; i < end; i += 16) {
                const vf xv = vf_load(x + i);
                UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) part[c] = vf_fma(xv, vf_i8(b16_load(q[c] + i)), part[c]);
            }
        }
        UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) acc[c] = vf_fma(part[c], vf_set1(scale[c * groups + g]), acc[c]);
    }
    UNROLLED for (int c = 0; c < ONE_ROW_C; ++c) {
        float off = 0.0f;
        for (int64_t g = 0; g < groups; ++g) off += offset[c * groups + g] * xg[g];
        sums[c] = vf_sum(acc[c]) + off;
    }
}

#define TILE_OF(R)                                                                      \
    do {                                                                                \
        if (bits == 4 && group == 32) tile_f32(xs, q, scale, offset, groups, 32, sums, 4, R, TILE_C); \
        else if (bits == 4) tile_f32(xs, q, scale, offset, groups, group, sums, 4, R, TILE_C);    \
        else tile_f32(xs, q, scale, offset, groups, group, sums, 8, R, TILE_C);                   \
    } while (0)

/* the height of the next tile of rows, `left` of them to go: TILE_R, else the largest
   power of two below (no row is computed twice) */
static inline int tile_height(int64_t left) {
    int h = TILE_R;
    while (h > left) h /= 2;
    return h;
}

/* height: rows of the tile (tile_height), 0 for the one-row kernel (ONE_ROW_C channels) */
static void tile_f32_of(const float *const *xs, const float *xg, const uint8_t *const *q, const float *scale,
                        const float *offset, int64_t groups, int64_t group, float *sums, int bits, int height) {
    if (height == 0) {
        /* the common group sizes as constants: their inner loops unroll whole */
        if (bits == 4 && group == 32) row_f32(xs[0], xg, q, scale, offset, groups, 32, sums, 4);
        else if (bits == 4) row_f32(xs[0], xg, q, scale, offset, groups, group, sums, 4);
        else if (group == 16) row_f32(xs[0], xg, q, scale, offset, groups, 16, sums, 8);
        else if (group == 32) row_f32(xs[0], xg, q, scale, offset, groups, 32, sums, 8);
        else row_f32(xs[0], xg, q, scale, offset, groups, group, sums, 8);
    } else if (height == TILE_R) {
        TILE_OF(TILE_R);
#if TILE_R > 4
    } else if (height >= 4) {
        TILE_OF(4);
#endif
#if TILE_R > 2
    } else if (height >= 2) {
        TILE_OF(2);
#endif
    } else {
        TILE_OF(1);
    }
}

/* x [rows, k] fp32 (rows x_stride floats apart), out [rows, n] fp32, bias [n] or NULL.
 * K a multiple of 16 for bits 8 (the Python side sends other groups to torch).
 * Returns 0, or -1 when there is no memory for the per-thread scratch. */
int group_linear_f32(const float *x, int64_t x_stride, const gq_weight *w, const float *bias,
                     float *out, int64_t rows, int num_threads) {
    const int64_t n = w->n, groups = w->k / w->group;
    const int one_row = rows == 1;
    const int C = one_row ? ONE_ROW_C : TILE_C;
    const int64_t per_thread = 3 * C * groups;
    /* one row: its group sums (row_f32), after the threads' scratch */
    float *scratch = malloc(sizeof(float) * (size_t)(per_thread * num_threads + groups));
    if (scratch == NULL) return -1;
    float *xg = scratch + per_thread * num_threads;
    if (one_row)
        for (int64_t g = 0; g < groups; ++g) {
            float total = 0.0f;
            for (int64_t i = g * w->group; i < (g + 1) * w->group; ++i) total += x[i];
            xg[g] = total;
        }
#pragma omp parallel num_threads(num_threads)
    {
        float *scale = scratch + per_thread * omp_get_thread_num();
        float *offset = scale + C * groups, *tmp = offset + C * groups;
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += C) {
            const uint8_t *q[ONE_ROW_C > TILE_C ? ONE_ROW_C : TILE_C];
            for (int c = 0; c < C; ++c) q[c] = code_row(w, min64(n0 + c, n - 1));   /* past n: unstored */
            prefetch_tile(w, n0 + 2 * C, C);
            tile_params(w, n0, C, scale, offset, tmp);
            for (int64_t t0 = 0; t0 < rows;) {
                const int height = one_row ? 0 : tile_height(rows - t0), R = one_row ? 1 : height;
                const float *xs[TILE_R];
                for (int r = 0; r < R; ++r) xs[r] = x + (t0 + r) * x_stride;
                float sums[TILE_R * (ONE_ROW_C > TILE_C ? ONE_ROW_C : TILE_C)];
                tile_f32_of(xs, xg, q, scale, offset, groups, w->group, sums, w->bits, height);
                for (int64_t r = 0; r < R; ++r)
                    for (int64_t c = 0; c < min64(C, n - n0); ++c)
                        out[(t0 + r) * n + n0 + c] = sums[r * C + c] + (bias != NULL ? bias[n0 + c] : 0.0f);
                t0 += R;
            }
        }
    }
    free(scratch);
    return 0;
}

/* channels [n0, n1) of w as fp32, out [n1 - n0, k]. Returns 0, or -1 without scratch. */
int group_dequantize(const gq_weight *w, int64_t n0, int64_t n1, float *out, int num_threads) {
    const int64_t k = w->k, group = w->group, groups = k / group;
    float *scratch = malloc(sizeof(float) * (size_t)(3 * groups * num_threads));
    if (scratch == NULL) return -1;
#pragma omp parallel num_threads(num_threads)
    {
        float *scale = scratch + 3 * groups * omp_get_thread_num(), *offset = scale + groups,
              *tmp = offset + groups;
#pragma omp for schedule(static)
        for (int64_t c = n0; c < n1; ++c) {
            group_params(w, c, 1, scale, offset, tmp);
            const uint8_t *q = code_row(w, c);
            float *o = out + (c - n0) * k;
            for (int64_t g = 0; g < groups; ++g) {
                const vf s = vf_set1(scale[g]), off = vf_set1(offset[g]);
                if (w->bits == 4) {
                    for (int64_t i = g * group; i < (g + 1) * group; i += BLOCK) {
                        vf low, high;
                        vf_nibbles(q + i / 2, &low, &high);
                        vf_store(o + i, vf_fma(low, s, off));
                        vf_store(o + i + 16, vf_fma(high, s, off));
                    }
                } else {
                    for (int64_t i = g * group; i < (g + 1) * group; i += 16)
                        vf_store(o + i, vf_fma(vf_i8(b16_load(q + i)), s, off));
                }
            }
        }
    }
    free(scratch);
    return 0;
}

/* ---- W4A8 -------------------------------------------------------------------------- */

/* where value i of a row sits in the quantized activations: quarters 0, 2, 1, 3 of 64 */
static inline int64_t a8_position(int64_t i) {
    const int64_t quarter = (i >> 4) & 3, swapped = quarter == 1 ? 2 : quarter == 2 ? 1 : quarter;
    return (i & ~(int64_t)63) | (swapped << 4) | (i & 15);
}

/* kernels/w4a8.py:quantize_per_token_symmetric for each row of x [rows, k]:
 *   xscale = max|x_t| * (1/127 in fp32) (1 if 0), xq = clamp(round_half_even(x * (1 / xscale)), -127, 127)
 * into xq [rows, k_pad] (k_pad: k rounded up to 64, zeros past k) in the order above, and
 * xsum [rows, k_pad / 32]: each 32-value block's sum of xq, as a float. The same fp32
 * operations as the torch definition, so the same integers: without fast-math, which
 * rewrote 1 / (amax * c) as (1 / amax) * 127 and moved a value near .5 across the rounding
 * boundary. */
__attribute__((optimize("no-fast-math", "fp-contract=off")))
void group_quantize_x(const float *x, int64_t x_stride, int64_t rows, int64_t k, int8_t *xq,
                      float *xscale, float *xsum, int num_threads) {
    const int64_t k_pad = (k + 63) / 64 * 64;
#pragma omp parallel for num_threads(num_threads) if (rows * k >= 65536)
    for (int64_t t = 0; t < rows; ++t) {
        const float *xr = x + t * x_stride;
        float amax = 0.0f;
#pragma omp simd reduction(max : amax)
        for (int64_t j = 0; j < k; ++j) amax = fabsf(xr[j]) > amax ? fabsf(xr[j]) : amax;
        const float s = amax > 0.0f ? amax * (1.0f / 127.0f) : 1.0f;
        const float inv = 1.0f / s;
        /* adding and taking away 1.5 * 2^23 rounds |v| < 2^22 half to even, as torch.round,
           in IEEE arithmetic (kept here), and it vectorizes where nearbyintf does not */
        const float magic = 12582912.0f;
        int8_t *q = xq + t * k_pad;
        float *sums = xsum + t * (k_pad / BLOCK);
        for (int64_t b = 0; b < k_pad / BLOCK; ++b) sums[b] = 0.0f;
        for (int64_t j0 = 0; j0 < k_pad; j0 += 16) {        /* 16 values: a quarter of 64 */
            int8_t *dst = q + a8_position(j0);
            int32_t total = 0;
            if (j0 + 16 <= k) {
#if defined(__AVX512F__)
                const __m512 r = _mm512_sub_ps(
                    _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + j0), _mm512_set1_ps(inv)),
                                  _mm512_set1_ps(magic)), _mm512_set1_ps(magic));
                const __m512i v = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvttps_epi32(r), _mm512_set1_epi32(127)),
                                                   _mm512_set1_epi32(-127));
                _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(v));
                total = _mm512_reduce_add_epi32(v);
#else
#pragma omp simd reduction(+ : total)
                for (int64_t i = 0; i < 16; ++i) {
                    int32_t v = (int32_t)((xr[j0 + i] * inv + magic) - magic);
                    v = v < -127 ? -127 : v > 127 ? 127 : v;
                    dst[i] = (int8_t)v;
                    total += v;
                }
#endif
            } else {
                for (int64_t i = 0; i < 16; ++i) {
                    int32_t v = j0 + i < k ? (int32_t)((xr[j0 + i] * inv + magic) - magic) : 0;
                    v = v < -127 ? -127 : v > 127 ? 127 : v;
                    dst[i] = (int8_t)v;
                    total += v;
                }
            }
            sums[j0 / BLOCK] += (float)total;
        }
        xscale[t] = s;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define A8_R 4
#define A8_C 4
/* lanes 0-3 and 8-11 hold the first block's products, 4-7 and 12-15 the second's */
static inline __m512 a8_scales(const float *s) {
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)s))));
}
static inline __m512i a8_codes(const uint8_t *p, int two) {
    const __m256i v = two ? _mm256_loadu_si256((const __m256i *)p)
                          : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i m = _mm256_set1_epi8(0x0f);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1);
}

/* sums[r * C + c] = xq_r . codes_c scaled per block, for R rows and C channels. The
 * integer sums of `span` steps of 64 values (two blocks) share one conversion to fp32 and
 * one multiply-add by their scales: 1 for groups of 32 (each step has two scales), more
 * where a group spans whole steps. */
static inline __attribute__((always_inline)) void a8_tile(
        const int8_t *const *xs, const uint8_t *const *q, const float *const *bscale, int64_t steps,
        int64_t nblocks, float *sums, const int R, const int C, const int64_t span) {
    __m512 acc[A8_R][A8_C];
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < steps; j0 += span) {
        __m512i d[A8_R][A8_C];
        UNROLLED for (int r = 0; r < R; ++r)
            UNROLLED for (int c = 0; c < C; ++c) d[r][c] = _mm512_setzero_si512();
        for (int64_t j = j0; j < j0 + span; ++j) {
            const int two = 2 * j + 1 < nblocks;
            __m512i wv[A8_C];
            UNROLLED for (int c = 0; c < C; ++c) wv[c] = a8_codes(q[c] + j * 32, two);
            UNROLLED for (int r = 0; r < R; ++r) {
                const __m512i xv = _mm512_loadu_si512(xs[r] + j * 64);
                UNROLLED for (int c = 0; c < C; ++c) d[r][c] = _mm512_dpbusd_epi32(d[r][c], wv[c], xv);
            }
        }
        UNROLLED for (int c = 0; c < C; ++c) {
            const __m512 sv = a8_scales(bscale[c] + 2 * j0);
            UNROLLED for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][c]), sv, acc[r][c]);
        }
    }
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) sums[r * C + c] = _mm512_reduce_add_ps(acc[r][c]);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define A8_R 2
#define A8_C 2
static inline __m256 a8_scales(const float *s) {
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)s))),
                                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}
/* 4 int32 lanes of each block's sum of products, codes u (unsigned) by activations x */
static inline __m256i a8_dot(__m256i u, __m256i x) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#else
    /* products of codes <= 15 and |x| <= 127: no pair of them saturates int16 */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

static inline __attribute__((always_inline)) void a8_tile(
        const int8_t *const *xs, const uint8_t *const *q, const float *const *bscale, int64_t steps,
        int64_t nblocks, float *sums, const int R, const int C, const int64_t span) {
    __m256 acc[A8_R][A8_C];
    const __m256i m = _mm256_set1_epi8(0x0f);
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < steps; j0 += span) {
        __m256i d[A8_R][A8_C];
        UNROLLED for (int r = 0; r < R; ++r)
            UNROLLED for (int c = 0; c < C; ++c) d[r][c] = _mm256_setzero_si256();
        for (int64_t j = j0; j < j0 + span; ++j) {
            const int two = 2 * j + 1 < nblocks;
            __m256i lo[A8_C], hi[A8_C];
            UNROLLED for (int c = 0; c < C; ++c) {
                const __m256i v = two ? _mm256_loadu_si256((const __m256i *)(q[c] + j * 32))
                                      : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(q[c] + j * 32)));
                lo[c] = _mm256_and_si256(v, m);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            }
            UNROLLED for (int r = 0; r < R; ++r) {
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xs[r] + j * 64));
                const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xs[r] + j * 64 + 32));
                UNROLLED for (int c = 0; c < C; ++c)
                    d[r][c] = _mm256_add_epi32(d[r][c], _mm256_add_epi32(a8_dot(lo[c], x0), a8_dot(hi[c], x1)));
            }
        }
        UNROLLED for (int c = 0; c < C; ++c) {
            const __m256 sv = a8_scales(bscale[c] + 2 * j0);
            UNROLLED for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][c]), sv, acc[r][c]);
        }
    }
    UNROLLED for (int r = 0; r < R; ++r)
        UNROLLED for (int c = 0; c < C; ++c) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r][c]), _mm256_extractf128_ps(acc[r][c], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            sums[r * C + c] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
}
#else
#define A8_R 1
#define A8_C 1
static inline void a8_tile(const int8_t *const *xs, const uint8_t *const *q, const float *const *bscale,
                           int64_t steps, int64_t nblocks, float *sums, const int R, const int C,
                           const int64_t span) {
    (void)steps;
    (void)span;
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float total = 0.0f;
            for (int64_t b = 0; b < nblocks; ++b) {
                int32_t dot = 0;
                for (int64_t i = 0; i < BLOCK; ++i) {
                    const uint8_t byte = q[c][b * 16 + (i & 15)];
                    const int32_t code = i < 16 ? byte & 0x0f : byte >> 4;
                    dot += code * xs[r][a8_position(b * BLOCK + i)];
                }
                total += (float)dot * bscale[c][b];
            }
            sums[r * C + c] = total;
        }
}
#endif

/* span: steps of 64 values under one scale (group / 64 where 64 divides the group), else 1 */
static void a8_tile_of(const int8_t *const *xs, const uint8_t *const *q, const float *const *bscale,
                       int64_t steps, int64_t nblocks, float *sums, int rows, int64_t span) {
    if (span == 1) {
        if (rows > 1) a8_tile(xs, q, bscale, steps, nblocks, sums, A8_R, A8_C, 1);
        else a8_tile(xs, q, bscale, steps, nblocks, sums, 1, A8_C, 1);
    } else {
        if (rows > 1) a8_tile(xs, q, bscale, steps, nblocks, sums, A8_R, A8_C, span);
        else a8_tile(xs, q, bscale, steps, nblocks, sums, 1, A8_C, span);
    }
}

/* out [rows, n] = group_quantize_x's xq, xscale and xsum times w (bits 4), + bias [n] or
 * NULL. Returns 0, or -1 when there is no memory for the per-thread scratch. */
int group_linear_a8(const int8_t *xq, const float *xscale, const float *xsum, const gq_weight *w,
                    const float *bias, float *out, int64_t rows, int num_threads) {
    const int64_t n = w->n, k = w->k, groups = k / w->group, k_pad = (k + 63) / 64 * 64;
    const int64_t nblocks = k / BLOCK, padded = k_pad / BLOCK, steps = k_pad / 64;
    const int64_t per_group = w->group / BLOCK;
    /* per channel: a scale and an offset per block (two past the end: a step may cover
       one block), and scratch for the per-group ones */
    const int64_t per_thread = A8_C * 2 * (padded + 2) + 3 * groups;
    float *scratch = malloc(sizeof(float) * (size_t)(per_thread * num_threads));
    if (scratch == NULL) return -1;
#pragma omp parallel num_threads(num_threads)
    {
        float *mine = scratch + per_thread * omp_get_thread_num();
        float *gscale = mine + A8_C * 2 * (padded + 2), *goffset = gscale + groups, *tmp = goffset + groups;
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += A8_C) {
            const uint8_t *q[A8_C];
            const float *bscale[A8_C];
            const float *boffset[A8_C];
            for (int c = 0; c < A8_C; ++c) {
                const int64_t ch = min64(n0 + c, n - 1);
                float *bs = mine + c * 2 * (padded + 2), *bo = bs + padded + 2;
                q[c] = code_row(w, ch);
                group_params(w, ch, 1, gscale, goffset, tmp);
                for (int64_t g = 0; g < groups; ++g)
                    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
                        bs[b] = gscale[g];
                        bo[b] = goffset[g];
                    }
                for (int64_t b = nblocks; b < padded + 2; ++b) bs[b] = bo[b] = 0.0f;
                bscale[c] = bs;
                boffset[c] = bo;
            }
            for (int64_t t0 = 0; t0 < rows;) {
                /* a last row alone takes a one-row tile; other partial tiles repeat their
                   last row, unstored */
                const int R = rows - t0 == 1 ? 1 : A8_R;
                const int8_t *xs[A8_R];
                for (int r = 0; r < R; ++r) xs[r] = xq + min64(t0 + r, rows - 1) * k_pad;
                float sums[A8_R * A8_C];
                a8_tile_of(xs, q, bscale, steps, nblocks, sums, R, w->group % 64 == 0 ? w->group / 64 : 1);
                for (int64_t t = t0; t < min64(t0 + R, rows); ++t) {
                    const float *block_sums = xsum + t * padded;
                    for (int64_t c = 0; c < min64(A8_C, n - n0); ++c) {
                        float off = 0.0f;
                        if (w->offsets != NULL)
                            for (int64_t b = 0; b < nblocks; ++b) off += boffset[c][b] * block_sums[b];
                        out[t * n + n0 + c] = (sums[(t - t0) * A8_C + c] + off) * xscale[t]
                                              + (bias != NULL ? bias[n0 + c] : 0.0f);
                    }
                }
                t0 += R;
            }
        }
    }
    free(scratch);
    return 0;
}

/* Decode attention over the paged KV cache, read in place (no gather), fp32 arithmetic
 * over an fp32 cache or a bf16 one (the *_bf16kv entry points: half the bytes to read).
 *
 * The same contract as kernels/attention.py:paged_decode_attention, its reference:
 *   q            [B, nh, D]
 *   k/v_cache    [num_blocks, block_size, nkv, D]
 *   block_tables [B, max_blocks] int32; entries past a sequence's last block are never read
 *   context_lens [B] int32, including the token being decoded
 *   out          [B, nh, D]
 *   window       > 0: the query sees only the last `window` positions (sliding window),
 *                and table entries of blocks wholly before them are never read; 0: all
 *   softcap      > 0: scores become softcap * tanh(score / softcap) (Gemma 2); 0: no cap
 * Work items are a sequence's kv heads, all of them when the batch has enough sequences
 * to keep every thread busy (then each token's k and v rows are read whole and in order,
 * which streams best), one each otherwise. Items are spread over OpenMP threads (the
 * process's libgomp, which is torch's: no second thread pool). An item makes two passes
 * over its context: scores q.k for every token and query head, then softmax and the
 * weighted sum of v. The g = nh / nkv query heads sharing a kv head are done together,
 * so every k and v row is read from memory once. Accumulation is fp32, as in the reference.
 *
 * Head dims of 32, 64 and 128 get loops over 16-float vectors of a size the compiler
 * knows, so they unroll into whole-register FMAs; any other head dim takes plain loops.
 *
 * A bf16 cache element is the top half of an fp32's bits: each k or v row is widened as it
 * is loaded (zero-extend to 32 bits, shift left 16; vpmovzxwd + vpslld on AVX2), and from
 * there the arithmetic is the fp32 path's. Every function that touches the cache takes a
 * `bf16` flag that is a constant wherever it is inlined, so each path is compiled on its
 * own and the fp32 one is the same code as before the bf16 one existed.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 16 floats; aligned(4) so that loads from any float address are allowed */
typedef float vf16 __attribute__((vector_size(64), aligned(4)));
typedef float vf8 __attribute__((vector_size(32), aligned(4)));
typedef uint16_t vh16 __attribute__((vector_size(32), aligned(2)));   /* 16 bf16 */
typedef uint16_t vh8 __attribute__((vector_size(16), aligned(2)));    /* 8 bf16 */
typedef uint32_t vw16 __attribute__((vector_size(64)));
typedef uint32_t vw8 __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

/* Where cache element i (counted from `base`) is. */
INLINE const void *element(const void *base, int64_t i, const int bf16) {
    return (const char *)base + i * (bf16 ? 2 : 4);
}

/* Cache element i (counted from `base`), or it and the 15 or 7 after it, as fp32. */
INLINE float load1(const void *base, int64_t i, const int bf16) {
    if (!bf16) return ((const float *)base)[i];
    union { uint32_t u; float f; } x = {.u = (uint32_t)((const uint16_t *)base)[i] << 16};
    return x.f;
}

INLINE vf16 load16(const void *base, int64_t i, const int bf16) {
    if (!bf16) return *(const vf16 *)((const float *)base + i);
    return (vf16)(__builtin_convertvector(*(const vh16 *)((const uint16_t *)base + i), vw16) << 16);
}

INLINE vf8 load8(const void *base, int64_t i, const int bf16) {
    if (!bf16) return *(const vf8 *)((const float *)base + i);
    return (vf8)(__builtin_convertvector(*(const vh8 *)((const uint16_t *)base + i), vw8) << 16);
}

/* Rows this many tokens ahead are asked for early: blocks are scattered, so the
   hardware prefetcher loses the stream at every block boundary. */
#define PREFETCH 4

struct item {
    const float *q;          /* [heads * g, D]: the query rows of the item's kv heads */
    const void *k, *v;       /* k_cache / v_cache (fp32 or bf16) offset to the item's first kv head */
    const int64_t *slots;    /* [ctx] offset (in elements) of attended token t's row in either cache */
    float *out;              /* [heads * g, D] */
    float *scores;           /* scratch [heads * g, ctx] */
    int64_t ctx, heads, g, dim;  /* ctx: the number of attended tokens */
    float scale, softcap;
};

static inline float hsum(vf16 v) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += v[i];
    return s;
}

/* the n elements from element i of base on */
INLINE void prefetch(const void *base, int64_t i, int64_t n, const int bf16) {
    const char *p = (const char *)base + i * (bf16 ? 2 : 4);
    for (int64_t b = 0; b < n * (bf16 ? 2 : 4); b += 64) __builtin_prefetch(p + b);
}

/* slots[t - first] = offset (in elements) of token t's row in a cache, for first <= t < ctx,
   from the block table; block by block, so no division per token */
static void slot_offsets(const int32_t *table, int64_t first, int64_t ctx, int64_t block_size,
                         int64_t token_stride, int64_t *slots) {
    for (int64_t blk = first / block_size, t = first; t < ctx; ++blk) {
        const int64_t base = ((int64_t)table[blk] - blk) * block_size;   /* token t's slot: base + t */
        const int64_t end = (blk + 1) * block_size < ctx ? (blk + 1) * block_size : ctx;
        for (; t < end; ++t) slots[t - first] = (base + t) * token_stride;
    }
}

/* scores [rows, ctx] -> softcap * tanh(scores / softcap), in place */
static void softcap_rows(float *scores, int64_t n, float softcap) {
    const float inv = 1.0f / softcap;
    for (int64_t i = 0; i < n; ++i) scores[i] = softcap * tanhf(scores[i] * inv);
}

/* softmax of each of the rows of scores [rows, ctx], in place */
static void softmax_rows(float *scores, int64_t rows, int64_t ctx) {
    for (int64_t r = 0; r < rows; ++r) {
        float *x = scores + r * ctx;
        float m = x[0];
        for (int64_t t = 1; t < ctx; ++t) m = x[t] > m ? x[t] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < ctx; ++t) {
            x[t] = expf(x[t] - m);
            sum += x[t];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < ctx; ++t) x[t] *= inv;
    }
}

/* One item with head dim nv * 16 (a constant at each call: the loops over j unroll). Query
   row i = h * g + gi belongs to kv head h. */
INLINE void item_fixed(const struct item *it, const int nv, const int bf16) {
    const int64_t ctx = it->ctx, rows = it->heads * it->g, span = it->heads * nv * 16;
    float *scores = it->scores;
    for (int64_t t = 0; t < ctx; ++t) {
        const int64_t r = it->slots[t];
        if (t + PREFETCH < ctx) prefetch(it->k, it->slots[t + PREFETCH], span, bf16);
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            const int64_t k = r + h * nv * 16;
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                const vf16 *q = (const vf16 *)(it->q + i * nv * 16);
                vf16 acc = q[0] * load16(it->k, k, bf16);
                for (int j = 1; j < nv; ++j) acc += q[j] * load16(it->k, k + 16 * j, bf16);
                scores[i * ctx + t] = hsum(acc) * it->scale;
            }
        }
    }
    if (it->softcap > 0.0f) softcap_rows(scores, rows * ctx, it->softcap);
    softmax_rows(scores, rows, ctx);
    memset(it->out, 0, sizeof(float) * rows * nv * 16);
    for (int64_t t = 0; t < ctx; ++t) {
        const int64_t r = it->slots[t];
        if (t + PREFETCH < ctx) prefetch(it->v, it->slots[t + PREFETCH], span, bf16);
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            const int64_t v = r + h * nv * 16;
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                vf16 *o = (vf16 *)(it->out + i * nv * 16);
                const float w = scores[i * ctx + t];
                for (int j = 0; j < nv; ++j) o[j] += w * load16(it->v, v + 16 * j, bf16);
            }
        }
    }
}

/* Any head dim. */
INLINE void item_any(const struct item *it, const int bf16) {
    const int64_t ctx = it->ctx, rows = it->heads * it->g, dim = it->dim;
    float *scores = it->scores;
    for (int64_t t = 0; t < ctx; ++t) {
        const int64_t r = it->slots[t];
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                const void *k = element(it->k, r + h * dim, bf16);
                const float *q = it->q + i * dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < dim; ++d) s += q[d] * load1(k, d, bf16);
                scores[i * ctx + t] = s * it->scale;
            }
        }
    }
    if (it->softcap > 0.0f) softcap_rows(scores, rows * ctx, it->softcap);
    softmax_rows(scores, rows, ctx);
    memset(it->out, 0, sizeof(float) * rows * dim);
    for (int64_t t = 0; t < ctx; ++t) {
        const int64_t r = it->slots[t];
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                const void *v = element(it->v, r + h * dim, bf16);
                const float w = scores[i * ctx + t];
                float *o = it->out + i * dim;
#pragma omp simd
                for (int64_t d = 0; d < dim; ++d) o[d] += w * load1(v, d, bf16);
            }
        }
    }
}

typedef void (*item_fn)(const struct item *);

/* item_<head dim>_<cache element>: each path compiled on its own */
#define DEFINE_ITEMS(NAME, BODY)                                         \
    static void NAME##_f32(const struct item *it) { BODY(it, 0); }       \
    static void NAME##_bf16(const struct item *it) { BODY(it, 1); }
#define ITEM_32(it, bf16) item_fixed(it, 2, bf16)
#define ITEM_64(it, bf16) item_fixed(it, 4, bf16)
#define ITEM_128(it, bf16) item_fixed(it, 8, bf16)
DEFINE_ITEMS(item_32, ITEM_32)
DEFINE_ITEMS(item_64, ITEM_64)
DEFINE_ITEMS(item_128, ITEM_128)
DEFINE_ITEMS(item_other, item_any)

static item_fn item_for(int64_t dim, int bf16) {
    switch (dim) {
        case 32: return bf16 ? item_32_bf16 : item_32_f32;
        case 64: return bf16 ? item_64_bf16 : item_64_f32;
        case 128: return bf16 ? item_128_bf16 : item_128_f32;
        default: return bf16 ? item_other_bf16 : item_other_f32;
    }
}

/* Returns 0, or -1 when the scratch memory (per thread: the scores and slot offsets of
   one item at the longest context) is not there. elem: the bytes of a cache element. */
static int decode(const float *q, const char *k_cache, const char *v_cache,
                  const int32_t *block_tables, const int32_t *context_lens, float *out,
                  int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t dim,
                  int64_t block_size, int64_t max_blocks, float scale, int64_t window,
                  float softcap, int num_threads, int bf16) {
    const int64_t g = num_heads / num_kv_heads, elem = bf16 ? 2 : 4;
    const int64_t heads = batch >= 2 * num_threads ? num_kv_heads : 1;   /* per item */
    const int64_t items_per_seq = num_kv_heads / heads;
    const item_fn run = item_for(dim, bf16);
    int64_t max_ctx = 1;
    for (int64_t b = 0; b < batch; ++b)
        if (context_lens[b] > max_ctx) max_ctx = context_lens[b];
    const int64_t per_thread = (sizeof(float) * heads * g + sizeof(int64_t)) * max_ctx;
    char *scratch = malloc(per_thread * num_threads);
    if (scratch == NULL) return -1;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t *slots = (int64_t *)(scratch + per_thread * omp_get_thread_num());
        float *scores = (float *)(slots + max_ctx);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < batch * items_per_seq; ++i) {
            const int64_t b = i / items_per_seq, h = (i % items_per_seq) * heads;
            const int64_t ctx = context_lens[b];
            const int64_t first = window > 0 && ctx > window ? ctx - window : 0;
            slot_offsets(block_tables + b * max_blocks, first, ctx, block_size,
                         num_kv_heads * dim, slots);
            const struct item it = {
                .q = q + (b * num_heads + h * g) * dim,
                .k = k_cache + h * dim * elem,
                .v = v_cache + h * dim * elem,
                .slots = slots,
                .out = out + (b * num_heads + h * g) * dim,
                .scores = scores,
                .ctx = ctx - first, .heads = heads, .g = g, .dim = dim, .scale = scale,
                .softcap = softcap,
            };
            run(&it);
        }
    }
    free(scratch);
    return 0;
}

/* paged_decode_attention_f32 over fp32 caches, paged_decode_attention_bf16kv over bf16 ones
   (uint16_t: the bf16 bits); q and out are fp32 with both. */
#define DECODE_ENTRY(NAME, ELEM, BF16)                                                        \
    int NAME(const float *q, const ELEM *k_cache, const ELEM *v_cache,                        \
             const int32_t *block_tables, const int32_t *context_lens, float *out,            \
             int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t dim,             \
             int64_t block_size, int64_t max_blocks, float scale, int64_t window,             \
             float softcap, int num_threads) {                                                \
        return decode(q, (const char *)k_cache, (const char *)v_cache, block_tables,          \
                      context_lens, out, batch, num_heads, num_kv_heads, dim, block_size,     \
                      max_blocks, scale, window, softcap, num_threads, BF16);                 \
    }
DECODE_ENTRY(paged_decode_attention_f32, float, 0)
DECODE_ENTRY(paged_decode_attention_bf16kv, uint16_t, 1)

/* ---- Prefill: chunked, causal attention of many query tokens, flash-style ----
 *
 * The contract of kernels/attention.py:paged_prefill_attention:
 *   q             [T, nh, D]: sequence s owns rows query_starts[s] .. query_starts[s + 1] - 1,
 *                 the last tokens of its context of context_lens[s] (cached prefix + this chunk,
 *                 all already written to the cache)
 *   out           [T, nh, D]
 *   block_tables, k/v_cache, window, softcap: as for decode above
 * Work items are (sequence, kv head, tile of QT query tokens), the g query heads of the kv
 * head riding along as rows, spread over OpenMP threads dynamically, the costliest (the
 * last tiles of each sequence: they see the most keys) first. An item walks its visible
 * keys KT at a time with an online softmax: scores of all rows against the tile's keys
 * (k rows transposed into a [D, KT] scratch so each score row is a vector FMA chain over d,
 * no horizontal sums), then per row the running max and sum are updated, and the fp32
 * output rows rescaled and the tile's v rows added. Key tiles start at the multiple of KT
 * at or before where the item's first query's window does, so blocks wholly before every
 * window are never read.
 *
 * Rows go two at a time through the score and the v loops, so every k or v vector loaded
 * feeds two FMAs, their sums held in registers: 8-float vectors (one AVX2 register; 16-float
 * ones were lowered through the stack here). An odd row count gets a padding row of zeros.
 * A bf16 cache's k rows are widened as they are transposed, its v rows as they are loaded.
 */
#define QT 16      /* query tokens per item */
#define KT 32      /* keys per tile: four 8-float score vectors per row */
#define NO_SCORE -1e30f   /* the running max before any key; finite: -ffast-math has no inf */

struct prefill_item {
    const float *q;          /* the item's first query token, first query head of its kv head */
    const void *k, *v;       /* k_cache / v_cache offset to the item's kv head */
    int bf16;                /* the caches' elements: 0 fp32, 1 bf16 */
    float *out;              /* same layout as q */
    int64_t q_stride;        /* floats between consecutive tokens' rows of q and out: nh * D */
    int64_t nq, g, dim;      /* query tokens, query heads per kv head, head dim */
    int64_t pos0;            /* position of the first query token */
    int64_t kfirst;          /* first key position any row of the item sees */
    int64_t window;          /* 0: none */
    float scale, softcap;
};

struct prefill_scratch {     /* per thread; rows = QT * g rounded up to even */
    int64_t *slots;          /* [max_ctx] */
    float *qs, *o;           /* [rows, D]: scaled queries, unnormalized outputs */
    float *s;                /* [rows, KT] scores, then weights */
    float *m, *l, *alpha;    /* [rows] running max and sum; this tile's rescale of o */
    float *kt;               /* [D, KT]: the tile's keys, transposed */
};

/* kt[d, c] = k rows of keys 0..n-1 at dim d, zero past n: the tile's keys transposed */
INLINE void transpose_keys_of(const void *k, const int64_t *slots, int64_t n, int64_t dim,
                              float *dst, const int bf16) {
    for (int64_t c = 0; c < KT; ++c) {
        if (c < n)
            for (int64_t d = 0; d < dim; ++d) dst[d * KT + c] = load1(k, slots[c] + d, bf16);
        else
            for (int64_t d = 0; d < dim; ++d) dst[d * KT + c] = 0.0f;
    }
}

static void transpose_keys(const void *k, const int64_t *slots, int64_t n, int64_t dim,
                           float *dst, int bf16) {
    if (bf16) transpose_keys_of(k, slots, n, dim, dst, 1);
    else transpose_keys_of(k, slots, n, dim, dst, 0);
}

/* s[r, 0..KT) and s[r + 1, 0..KT) = the two rows' scores against the tile's keys */
static void pair_scores(const float *q0, const float *q1, const float *kt, float *s, int64_t dim) {
    vf8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    for (int64_t d = 0; d < dim; ++d) {
        const vf8 *k = (const vf8 *)(kt + d * KT);
        const float x = q0[d], y = q1[d];
        a0 += x * k[0]; a1 += x * k[1]; a2 += x * k[2]; a3 += x * k[3];
        b0 += y * k[0]; b1 += y * k[1]; b2 += y * k[2]; b3 += y * k[3];
    }
    vf8 *out = (vf8 *)s;
    out[0] = a0; out[1] = a1; out[2] = a2; out[3] = a3;
    out[4] = b0; out[5] = b1; out[6] = b2; out[7] = b3;
}

/* The online-softmax step of one row whose visible keys are c0..c1-1 of the tile: s becomes
   the weights (zero outside), and the factor its earlier output is to be scaled by. */
static float row_weights(float *s, float *m, float *l, int64_t c0, int64_t c1, float softcap) {
    if (c0 >= c1) {
        memset(s, 0, sizeof(float) * KT);
        return 1.0f;
    }
    if (softcap > 0.0f) softcap_rows(s + c0, c1 - c0, softcap);
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int64_t c = c0; c < c1; ++c) mx = s[c] > mx ? s[c] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < KT; ++c) {
        s[c] = c >= c0 && c < c1 ? expf(s[c] - mx) : 0.0f;
        sum += s[c];
    }
    const float alpha = expf(*m - mx);
    *m = mx;
    *l = *l * alpha + sum;
    return alpha;
}

/* o0/o1[d0 .. d0 + 8 * NV) = alpha * o + sum_t w[t] * v row t, for two rows; NV is a
   constant at each call, so the sums stay in registers */
INLINE void pair_values(float *o0, float *o1, float al0, float al1, const float *w0,
                        const float *w1, const void *v, const int64_t *slots, int64_t n,
                        int64_t d0, const int nv, const int bf16) {
    vf8 a[4], b[4];
    for (int i = 0; i < nv; ++i) {
        a[i] = al0 * *(const vf8 *)(o0 + d0 + 8 * i);
        b[i] = al1 * *(const vf8 *)(o1 + d0 + 8 * i);
    }
    for (int64_t t = 0; t < n; ++t) {
        const float x = w0[t], y = w1[t];
        for (int i = 0; i < nv; ++i) {
            const vf8 vt = load8(v, slots[t] + d0 + 8 * i, bf16);
            a[i] += x * vt;
            b[i] += y * vt;
        }
    }
    for (int i = 0; i < nv; ++i) {
        *(vf8 *)(o0 + d0 + 8 * i) = a[i];
        *(vf8 *)(o1 + d0 + 8 * i) = b[i];
    }
}

/* The same over every column: 32 at a time, then 8, then one (head dims not a multiple of 8) */
INLINE void pair_all_values_of(float *o0, float *o1, float al0, float al1, const float *w0,
                               const float *w1, const void *v, const int64_t *slots, int64_t n,
                               int64_t dim, const int bf16) {
    int64_t d = 0;
    for (; d + 32 <= dim; d += 32) pair_values(o0, o1, al0, al1, w0, w1, v, slots, n, d, 4, bf16);
    for (; d + 8 <= dim; d += 8) pair_values(o0, o1, al0, al1, w0, w1, v, slots, n, d, 1, bf16);
    for (; d < dim; ++d) {
        float x = al0 * o0[d], y = al1 * o1[d];
        for (int64_t t = 0; t < n; ++t) {
            const float vt = load1(v, slots[t] + d, bf16);
            x += w0[t] * vt;
            y += w1[t] * vt;
        }
        o0[d] = x;
        o1[d] = y;
    }
}

static void pair_all_values(float *o0, float *o1, float al0, float al1, const float *w0,
                            const float *w1, const void *v, const int64_t *slots, int64_t n,
                            int64_t dim, int bf16) {
    if (bf16) pair_all_values_of(o0, o1, al0, al1, w0, w1, v, slots, n, dim, 1);
    else pair_all_values_of(o0, o1, al0, al1, w0, w1, v, slots, n, dim, 0);
}

/* One key tile of n keys at position k0 for all rows. */
static void prefill_tile(const struct prefill_item *it, const struct prefill_scratch *sc,
                         int64_t rows, const int64_t *slots, int64_t k0, int64_t n) {
    const int64_t dim = it->dim, real = it->nq * it->g;
    transpose_keys(it->k, slots, n, dim, sc->kt, it->bf16);
    for (int64_t r = 0; r < rows; r += 2)
        pair_scores(sc->qs + r * dim, sc->qs + (r + 1) * dim, sc->kt, sc->s + r * KT, dim);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t pos = it->pos0 + r / it->g;
        int64_t lo = it->window > 0 ? pos - it->window + 1 : 0, hi = pos + 1;
        lo = lo > k0 ? lo : k0;
        hi = hi < k0 + n ? hi : k0 + n;
        if (r >= real) hi = lo;                   /* the padding row sees nothing */
        sc->alpha[r] = row_weights(sc->s + r * KT, sc->m + r, sc->l + r, lo - k0, hi - k0, it->softcap);
    }
    for (int64_t r = 0; r < rows; r += 2)
        pair_all_values(sc->o + r * dim, sc->o + (r + 1) * dim, sc->alpha[r], sc->alpha[r + 1],
                        sc->s + r * KT, sc->s + (r + 1) * KT, it->v, slots, n, dim, it->bf16);
}

/* Scaled query rows in (zeros for the padding row), running state reset. Row r is query
   token r / g, head r % g. */
static void prefill_start(const struct prefill_item *it, const struct prefill_scratch *sc, int64_t rows) {
    const int64_t real = it->nq * it->g, dim = it->dim;
    for (int64_t r = 0; r < rows; ++r) {
        if (r < real) {
            const float *src = it->q + (r / it->g) * it->q_stride + (r % it->g) * dim;
            for (int64_t d = 0; d < dim; ++d) sc->qs[r * dim + d] = src[d] * it->scale;
        } else {
            memset(sc->qs + r * dim, 0, sizeof(float) * dim);
        }
        sc->m[r] = NO_SCORE;
        sc->l[r] = 0.0f;
    }
    memset(sc->o, 0, sizeof(float) * rows * dim);
}

static void prefill_finish(const struct prefill_item *it, const struct prefill_scratch *sc) {
    const int64_t dim = it->dim;
    for (int64_t r = 0; r < it->nq * it->g; ++r) {
        float *dst = it->out + (r / it->g) * it->q_stride + (r % it->g) * dim;
        const float inv = 1.0f / sc->l[r];   /* every row sees at least its own key */
        for (int64_t d = 0; d < dim; ++d) dst[d] = sc->o[r * dim + d] * inv;
    }
}

/* Keys kfirst .. pos0 + nq - 1, sc->slots[t - kfirst] their rows. */
static void prefill_run(const struct prefill_item *it, const struct prefill_scratch *sc) {
    const int64_t rows = (it->nq * it->g + 1) / 2 * 2, kend = it->pos0 + it->nq;
    prefill_start(it, sc, rows);
    for (int64_t k0 = it->kfirst; k0 < kend; k0 += KT)
        prefill_tile(it, sc, rows, sc->slots + (k0 - it->kfirst), k0, kend - k0 < KT ? kend - k0 : KT);
    prefill_finish(it, sc);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Per-thread scratch: slots, then the floats of struct prefill_scratch, rows rows. */
static int64_t prefill_scratch_bytes(int64_t max_ctx, int64_t rows, int64_t dim) {
    const int64_t floats = 2 * rows * dim + rows * KT + 3 * rows + dim * KT;
    /* rounded to a cache line: every thread's scratch starts aligned, none shares a line */
    return ceil_div(sizeof(int64_t) * max_ctx + sizeof(float) * floats, 64) * 64;
}

static struct prefill_scratch prefill_scratch_at(char *mine, int64_t max_ctx, int64_t rows, int64_t dim) {
    struct prefill_scratch sc = {.slots = (int64_t *)mine};
    sc.qs = (float *)(sc.slots + max_ctx);
    sc.o = sc.qs + rows * dim;
    sc.s = sc.o + rows * dim;
    sc.m = sc.s + rows * KT;
    sc.l = sc.m + rows;
    sc.alpha = sc.l + rows;
    sc.kt = sc.alpha + rows;
    return sc;
}

/* Returns 0, or -1 when the scratch memory is not there. */
static int prefill(const float *q, const char *k_cache, const char *v_cache,
                   const int32_t *block_tables, const int32_t *query_starts,
                   const int32_t *context_lens, float *out, int64_t num_seqs, int64_t num_heads,
                   int64_t num_kv_heads, int64_t dim, int64_t block_size, int64_t max_blocks,
                   float scale, int64_t window, float softcap, int num_threads, int bf16) {
    const int64_t g = num_heads / num_kv_heads, rows = (QT * g + 1) / 2 * 2, elem = bf16 ? 2 : 4;
    int64_t max_ctx = 1, tiles = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
        max_ctx = context_lens[s] > max_ctx ? context_lens[s] : max_ctx;
        tiles += ceil_div(query_starts[s + 1] - query_starts[s], QT);
    }
    /* tile_seq[i], tile_first[i]: the sequence and first query row of tile i */
    int64_t *tile_seq = malloc(sizeof(int64_t) * 2 * (tiles + 1));
    const int64_t per_thread = prefill_scratch_bytes(max_ctx, rows, dim);
    char *scratch = malloc(per_thread * num_threads);
    if (tile_seq == NULL || scratch == NULL) {
        free(tile_seq);
        free(scratch);
        return -1;
    }
    int64_t *tile_first = tile_seq + tiles + 1;
    for (int64_t s = 0, i = 0; s < num_seqs; ++s)
        for (int64_t first = 0; first < query_starts[s + 1] - query_starts[s]; first += QT, ++i) {
            tile_seq[i] = s;
            tile_first[i] = first;
        }
#pragma omp parallel num_threads(num_threads)
    {
        const struct prefill_scratch sc =
            prefill_scratch_at(scratch + per_thread * omp_get_thread_num(), max_ctx, rows, dim);
#pragma omp for schedule(dynamic, 1)
        for (int64_t j = 0; j < tiles * num_kv_heads; ++j) {
            const int64_t i = tiles - 1 - j / num_kv_heads, h = j % num_kv_heads;  /* costliest first */
            const int64_t s = tile_seq[i], qlen = query_starts[s + 1] - query_starts[s];
            const int64_t nq = qlen - tile_first[i] < QT ? qlen - tile_first[i] : QT;
            const int64_t pos0 = context_lens[s] - qlen + tile_first[i];
            /* key tiles start at multiples of KT, wherever the item's queries start: a row's
               sums then run over the same tiles however its sequence was chunked, which the
               batch-invariant mode needs (rows mask the keys left of their window) */
            const int64_t kfirst = window > 0 && pos0 >= window ? (pos0 - window + 1) / KT * KT : 0;
            slot_offsets(block_tables + s * max_blocks, kfirst, pos0 + nq, block_size,
                         num_kv_heads * dim, sc.slots);
            const int64_t row0 = (query_starts[s] + tile_first[i]) * num_heads + h * g;
            const struct prefill_item it = {
                .q = q + row0 * dim, .k = k_cache + h * dim * elem, .v = v_cache + h * dim * elem,
                .bf16 = bf16, .out = out + row0 * dim, .q_stride = num_heads * dim, .nq = nq, .g = g,
                .dim = dim, .pos0 = pos0, .kfirst = kfirst, .window = window, .scale = scale,
                .softcap = softcap,
            };
            prefill_run(&it, &sc);
        }
    }
    free(tile_seq);
    free(scratch);
    return 0;
}

/* paged_prefill_attention_f32 over fp32 caches, paged_prefill_attention_bf16kv over bf16
   ones (uint16_t: the bf16 bits); q and out are fp32 with both. */
#define PREFILL_ENTRY(NAME, ELEM, BF16)                                                       \
    int NAME(const float *q, const ELEM *k_cache, const ELEM *v_cache,                        \
             const int32_t *block_tables, const int32_t *query_starts,                        \
             const int32_t *context_lens, float *out, int64_t num_seqs, int64_t num_heads,    \
             int64_t num_kv_heads, int64_t dim, int64_t block_size, int64_t max_blocks,       \
             float scale, int64_t window, float softcap, int num_threads) {                   \
        return prefill(q, (const char *)k_cache, (const char *)v_cache, block_tables,         \
                       query_starts, context_lens, out, num_seqs, num_heads, num_kv_heads,    \
                       dim, block_size, max_blocks, scale, window, softcap, num_threads, BF16); \
    }
PREFILL_ENTRY(paged_prefill_attention_f32, float, 0)
PREFILL_ENTRY(paged_prefill_attention_bf16kv, uint16_t, 1)

/* kernels/attention.py:write_kv for fp32 k, v and caches: token t's k row (nkv * D
 * floats, k_stride floats after token t - 1's; likewise v) into row slots[t] of k_cache
 * (rows of nkv * D floats, num_slots of them), and its v row into v_cache. Returns 0, or
 * -1 having written nothing when a slot is outside [0, num_slots): a replayed step has
 * no Python in front of it to check them. */
int write_kv_f32(const float *k, int64_t k_stride, const float *v, int64_t v_stride, float *k_cache,
                 float *v_cache, const int64_t *slots, int64_t tokens, int64_t width, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] < 0 || slots[t] >= num_slots) return -1;
    for (int64_t t = 0; t < tokens; ++t) {
        memcpy(k_cache + slots[t] * width, k + t * k_stride, sizeof(float) * (size_t)width);
        memcpy(v_cache + slots[t] * width, v + t * v_stride, sizeof(float) * (size_t)width);
    }
    return 0;
}

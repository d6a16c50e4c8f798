/* Decode attention over the paged KV cache, read in place (no gather), fp32.
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
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 16 floats; aligned(4) so that loads from any float address are allowed */
typedef float vf16 __attribute__((vector_size(64), aligned(4)));

/* Rows this many tokens ahead are asked for early: blocks are scattered, so the
   hardware prefetcher loses the stream at every block boundary. */
#define PREFETCH 4

struct item {
    const float *q;          /* [heads * g, D]: the query rows of the item's kv heads */
    const float *k, *v;      /* k_cache / v_cache offset to the item's first kv head */
    const int64_t *slots;    /* [ctx] offset of attended token t's row in either cache */
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

static inline void prefetch(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

/* slots[t - first] = offset (in floats) of token t's row in a cache, for first <= t < ctx,
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

/* One item with head dim NV * 16. Query row i = h * g + gi belongs to kv head h. */
#define DEFINE_ITEM(NV)                                                                   \
    static void item_##NV(const struct item *it) {                                        \
        const int64_t ctx = it->ctx, rows = it->heads * it->g, span = it->heads * NV * 16; \
        float *scores = it->scores;                                                       \
        for (int64_t t = 0; t < ctx; ++t) {                                               \
            const float *r = it->k + it->slots[t];                                        \
            if (t + PREFETCH < ctx) prefetch(it->k + it->slots[t + PREFETCH], span);     \
            for (int64_t h = 0, i = 0; h < it->heads; ++h) {                              \
                const vf16 *k = (const vf16 *)(r + h * NV * 16);                          \
                for (int64_t gi = 0; gi < it->g; ++gi, ++i) {                             \
                    const vf16 *q = (const vf16 *)(it->q + i * NV * 16);                  \
                    vf16 acc = q[0] * k[0];                                               \
                    for (int j = 1; j < NV; ++j) acc += q[j] * k[j];                      \
                    scores[i * ctx + t] = hsum(acc) * it->scale;                          \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        if (it->softcap > 0.0f) softcap_rows(scores, rows * ctx, it->softcap);            \
        softmax_rows(scores, rows, ctx);                                                  \
        memset(it->out, 0, sizeof(float) * rows * NV * 16);                               \
        for (int64_t t = 0; t < ctx; ++t) {                                               \
            const float *r = it->v + it->slots[t];                                        \
            if (t + PREFETCH < ctx) prefetch(it->v + it->slots[t + PREFETCH], span);     \
            for (int64_t h = 0, i = 0; h < it->heads; ++h) {                              \
                const vf16 *v = (const vf16 *)(r + h * NV * 16);                          \
                for (int64_t gi = 0; gi < it->g; ++gi, ++i) {                             \
                    vf16 *o = (vf16 *)(it->out + i * NV * 16);                            \
                    const float w = scores[i * ctx + t];                                  \
                    for (int j = 0; j < NV; ++j) o[j] += w * v[j];                        \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }

DEFINE_ITEM(2)
DEFINE_ITEM(4)
DEFINE_ITEM(8)

/* Any head dim. */
static void item_any(const struct item *it) {
    const int64_t ctx = it->ctx, rows = it->heads * it->g, dim = it->dim;
    float *scores = it->scores;
    for (int64_t t = 0; t < ctx; ++t) {
        const float *r = it->k + it->slots[t];
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                const float *k = r + h * dim, *q = it->q + i * dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < dim; ++d) s += q[d] * k[d];
                scores[i * ctx + t] = s * it->scale;
            }
        }
    }
    if (it->softcap > 0.0f) softcap_rows(scores, rows * ctx, it->softcap);
    softmax_rows(scores, rows, ctx);
    memset(it->out, 0, sizeof(float) * rows * dim);
    for (int64_t t = 0; t < ctx; ++t) {
        const float *r = it->v + it->slots[t];
        for (int64_t h = 0, i = 0; h < it->heads; ++h) {
            for (int64_t gi = 0; gi < it->g; ++gi, ++i) {
                const float *v = r + h * dim, w = scores[i * ctx + t];
                float *o = it->out + i * dim;
#pragma omp simd
                for (int64_t d = 0; d < dim; ++d) o[d] += w * v[d];
            }
        }
    }
}

typedef void (*item_fn)(const struct item *);

static item_fn item_for(int64_t dim) {
    switch (dim) {
        case 32: return item_2;
        case 64: return item_4;
        case 128: return item_8;
        default: return item_any;
    }
}

/* Returns 0, or -1 when the scratch memory (per thread: the scores and slot offsets of
   one item at the longest context) is not there. */
int paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens,
                               float *out, int64_t batch, int64_t num_heads,
                               int64_t num_kv_heads, int64_t dim, int64_t block_size,
                               int64_t max_blocks, float scale, int64_t window, float softcap,
                               int num_threads) {
    const int64_t g = num_heads / num_kv_heads;
    const int64_t heads = batch >= 2 * num_threads ? num_kv_heads : 1;   /* per item */
    const int64_t items_per_seq = num_kv_heads / heads;
    const item_fn run = item_for(dim);
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
                .k = k_cache + h * dim,
                .v = v_cache + h * dim,
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

/* The gathered LoRA delta, kernels/lora.py's contract:
 *
 *   out[t, :] = (a[s] @ x[t, :]) @ b[s]     s = slots[t]; zeros where s < 0 (the base)
 *
 * x [T, K] fp32 (rows x_stride floats apart), a [L, R, K], b [L, R, N] fp32 contiguous
 * (an adapter of a smaller rank zero-padded to R, its scaling folded into b), slots [T]
 * int64, out [T, N] fp32.
 *
 * Rows are taken adapter by adapter (Punica's SGMV: a segment per adapter rather than a
 * gather per row): each adapter's rows are shrunk to R values each, every row of a[s]
 * read once for all of them, then expanded a block of 64 output columns at a time: the
 * block's R rows of b[s] stay in L1 while each of the adapter's rows adds h_j times them
 * (contiguous multiply-adds, where a dot product of length R, 16 to 48, vectorizes
 * poorly). A fused projection's parts (q, k, v; gate, up) end at ends[0..parts-1] of N
 * and own R / parts rows of b each: a column takes only its part's rows (the others
 * are zeros there). With at least two adapters per thread each thread takes whole
 * adapters; with fewer, each adapter's R shrink rows and then its column blocks are split
 * over the OpenMP threads (torch's libgomp). Sums are fp32. Returns 0,
 * or -1 (nothing written) when a slot is L or more, or without memory for the scratch.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define COLUMNS 64    /* output columns per expand block */

static float dot(const float *p, const float *q, int64_t n) {
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += p[i] * q[i];
    return total;
}

/* h[t, j] for every row t of slot s: row j of its A times the row */
static void shrink_rows(const float *x, int64_t x_stride, const float *a, const int64_t *order,
                        const int64_t *start, int64_t s, int64_t j, int64_t r, int64_t k, float *h) {
    const float *aj = a + (s * r + j) * k;
    for (int64_t i = start[s]; i < start[s + 1]; ++i) h[order[i] * r + j] = dot(aj, x + order[i] * x_stride, k);
}

/* columns c0 .. c0 + COLUMNS of every row of slot s: the block's columns part by part,
   each from its own part's rows of b */
static void expand_block(const float *b, const int64_t *ends, const int64_t *order, const int64_t *start,
                         int64_t s, int64_t c0, int64_t r, int64_t rp, int64_t n, const float *h, float *out) {
    const int64_t c1 = n - c0 < COLUMNS ? n : c0 + COLUMNS;
    const float *bs = b + s * r * n;
    int64_t first_part = 0;
    while (ends[first_part] <= c0) ++first_part;
    for (int64_t i = start[s]; i < start[s + 1]; ++i) {
        float *o = out + order[i] * n;
        const float *hi = h + order[i] * r;
        memset(o + c0, 0, sizeof(float) * (size_t)(c1 - c0));
        for (int64_t p = first_part, lo = c0; lo < c1; ++p) {
            const int64_t hi_c = ends[p] < c1 ? ends[p] : c1;
            for (int64_t j = p * rp; j < (p + 1) * rp; ++j) {
                const float hv = hi[j], *bj = bs + j * n;
#pragma omp simd
                for (int64_t c = lo; c < hi_c; ++c) o[c] += hv * bj[c];
            }
            lo = hi_c;
        }
    }
}

int lora_delta_f32(const float *x, int64_t x_stride, const float *a, const float *b, const int64_t *slots,
                   float *out, int64_t rows, int64_t k, int64_t r, int64_t n, int64_t num_slots,
                   const int64_t *ends, int64_t parts, int num_threads) {
    const int64_t rp = r / parts;
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] >= num_slots) return -1;
    /* order[]: the rows grouped by slot (a counting sort), start[s] .. start[s + 1] slot
       s's of them, fill[] the sort's cursors; h: each row's R shrunk values */
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(rows + 2 * (num_slots + 1)));
    float *h = malloc(sizeof(float) * (size_t)(rows * r));
    if (order == NULL || h == NULL) {
        free(order);
        free(h);
        return -1;
    }
    int64_t *start = order + rows, *fill = start + num_slots + 1;
    memset(start, 0, sizeof(int64_t) * (size_t)(num_slots + 1));
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] >= 0) start[slots[t] + 1]++;
    for (int64_t s = 0; s < num_slots; ++s) start[s + 1] += start[s];
    memcpy(fill, start, sizeof(int64_t) * (size_t)(num_slots + 1));
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] >= 0) order[fill[slots[t]]++] = t;
    for (int64_t t = 0; t < rows; ++t)
        if (slots[t] < 0) memset(out + t * n, 0, sizeof(float) * (size_t)n);
    const int parallel = (start[num_slots] * n * r >= 65536);
    int64_t used = 0;
    for (int64_t s = 0; s < num_slots; ++s) used += start[s + 1] > start[s];
    if (used >= 2 * num_threads) {
        /* many adapters: each thread takes whole adapters (no barrier between them) */
#pragma omp parallel for num_threads(num_threads) schedule(dynamic) if (parallel)
        for (int64_t s = 0; s < num_slots; ++s)
            if (start[s + 1] > start[s]) {
                for (int64_t j = 0; j < r; ++j) shrink_rows(x, x_stride, a, order, start, s, j, r, k, h);
                for (int64_t c0 = 0; c0 < n; c0 += COLUMNS) expand_block(b, ends, order, start, s, c0, r, rp, n, h, out);
            }
    } else {
        /* few adapters: each one's shrink rows, then its column blocks, split over the threads */
#pragma omp parallel num_threads(num_threads) if (parallel)
        for (int64_t s = 0; s < num_slots; ++s) {
            if (start[s + 1] == start[s]) continue;
#pragma omp for schedule(static)
            for (int64_t j = 0; j < r; ++j) shrink_rows(x, x_stride, a, order, start, s, j, r, k, h);
#pragma omp for schedule(static)
            for (int64_t c0 = 0; c0 < n; c0 += COLUMNS) expand_block(b, ends, order, start, s, c0, r, rp, n, h, out);
        }
    }
    free(order);
    free(h);
    return 0;
}

/*
 * Histogram of |x| with bins of width 2**e starting at 0 (see calib/histogram.py for why the width is
 * a power of two). One pass, threads count into private histograms that are summed at the end.
 * NaN and infinite values are counted and left out; zeros can be skipped.
 *
 * The same pass tracks the largest finite |x|, so the caller needs no separate max pass: when that
 * max lies beyond the bins (the range grew), nothing is added and the caller widens the bins and
 * calls again; otherwise the counts are added. The max is kept as the bit pattern of a non-negative
 * float, which orders like the value itself: an integer max that compilers vectorise (a float max
 * reduction is not vectorised without -ffast-math).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "kernels.h"

/* Work in blocks: first the bin index of every value (a branch-free loop the compiler vectorises),
 * then the counting. Counting into one array stalls when consecutive values land in the same bin
 * (each increment waits for the previous one: ReLU zeros all go to bin 0), so values are counted
 * into SUB interleaved copies. NaN and infinities go to an extra slot. */
#define BLOCK 512
#define SUB 4
/* Below this, a second thread's start-up and its private histograms cost more than they save. */
#define PARALLEL_MIN_VALUES (1 << 20)

typedef struct {
    const void *x;
    int dtype, use_avx2;
    float scale; /* 2**-e: multiplying by it is exact */
    int64_t bins;
    uint32_t *local; /* per worker: SUB x (bins + 1) counts; the extra slot counts NaN/Inf */
    int64_t zeros[WB_MAX_THREADS];
    uint32_t top_bits[WB_MAX_THREADS]; /* largest finite |x| per worker, as float bits */
} hist_job_t;

#define INDEX_LOOP(LOAD)                                                        \
    for (int64_t i = 0; i < m; ++i) {                                           \
        float v = fabsf(LOAD);                                                  \
        float position = v * scale;                                             \
        int32_t bin = position < limit ? (int32_t)position : (int32_t)last_bin; \
        bin = v <= 3.402823466e38f ? bin : (int32_t)bins; /* NaN, infinity */    \
        zeros += v == 0.0f;                                                     \
        index[i] = bin;                                                         \
        uint32_t v_bits;                                                        \
        memcpy(&v_bits, &v, sizeof v_bits);                                     \
        v_bits = v_bits < 0x7f800000u ? v_bits : 0u; /* finite values only */   \
        top = v_bits > top ? v_bits : top;                                      \
    }

static int64_t block_index_portable(const hist_job_t *job, int64_t start, int64_t m, int32_t *index,
                                    uint32_t *top_bits) {
    const float scale = job->scale, limit = (float)job->bins;
    const int64_t bins = job->bins, last_bin = bins - 1;
    int64_t zeros = 0;
    uint32_t top = *top_bits;
    if (job->dtype == WB_DT_F32) {
        const float *x = (const float *)job->x + start;
        INDEX_LOOP(x[i])
    } else if (job->dtype == WB_DT_F16) {
        const uint16_t *x = (const uint16_t *)job->x + start;
        INDEX_LOOP(f16_to_f32(x[i]))
    } else {
        const uint16_t *x = (const uint16_t *)job->x + start;
        INDEX_LOOP(bf16_to_f32(x[i]))
    }
    *top_bits = top;
    return zeros;
}

#if WB_HAVE_X86_AVX2
/* the same loop compiled for AVX2 (float32 inputs; the 16-bit types stay on the portable loop) */
WB_AVX2_TARGET static int64_t block_index_avx2(const hist_job_t *job, int64_t start, int64_t m, int32_t *index,
                                                uint32_t *top_bits) {
    const float scale = job->scale, limit = (float)job->bins;
    const int64_t bins = job->bins, last_bin = bins - 1;
    int64_t zeros = 0;
    uint32_t top = *top_bits;
    const float *x = (const float *)job->x + start;
    INDEX_LOOP(x[i])
    *top_bits = top;
    return zeros;
}
#endif

static void hist_range(void *ctx, int64_t begin, int64_t end, int worker) {
    hist_job_t *job = (hist_job_t *)ctx;
    const int64_t stride = job->bins + 1;
    uint32_t *counts = job->local + (int64_t)worker * SUB * stride;
    int32_t index[BLOCK];
    int64_t zeros = 0;
    uint32_t top = 0;
    for (int64_t start = begin; start < end; start += BLOCK) {
        int64_t m = end - start < BLOCK ? end - start : BLOCK;
#if WB_HAVE_X86_AVX2
        if (job->use_avx2 && job->dtype == WB_DT_F32)
            zeros += block_index_avx2(job, start, m, index, &top);
        else
#endif
            zeros += block_index_portable(job, start, m, index, &top);
        int64_t i = 0;
        for (; i + SUB <= m; i += SUB) {
            counts[index[i]]++;
            counts[stride + index[i + 1]]++;
            counts[2 * stride + index[i + 2]]++;
            counts[3 * stride + index[i + 3]]++;
        }
        for (; i < m; ++i) counts[index[i]]++;
    }
    job->zeros[worker] = zeros;
    job->top_bits[worker] = top;
}

int wb_histogram(const void *x, int dtype, int64_t n, int width_exponent, int64_t bins, int skip_zeros,
                 int64_t *counts, int64_t *nonfinite, float *max_abs, int nthreads) {
    if (nthreads < 1 || n < PARALLEL_MIN_VALUES) nthreads = 1;
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    const int64_t stride = bins + 1;
    const size_t local_count = (size_t)nthreads * SUB * (size_t)stride;
    /* 32-bit private counts: half the cache footprint of 64-bit ones (2048 bins x 4 copies = 64 KB, also
     * below malloc's mmap threshold, so no page faults per call). A segment of at most 2**31 values cannot
     * overflow them; segments are summed into 64-bit totals, which go into counts only if the range held. */
    uint32_t *local = (uint32_t *)calloc(local_count, sizeof(uint32_t));
    int64_t *total = (int64_t *)calloc((size_t)stride, sizeof(int64_t));
    if (local == NULL || total == NULL) {
        free(local);
        free(total);
        return -1;
    }
    hist_job_t job;
    memset(&job, 0, sizeof job);
    job.x = x;
    job.dtype = dtype;
    job.use_avx2 = wb_use_avx2();
    job.scale = ldexpf(1.0f, -width_exponent);
    job.bins = bins;
    job.local = local;
    const size_t width = dtype == WB_DT_F32 ? 4 : 2;
    const int64_t segment = (int64_t)1 << 31;
    int64_t zeros = 0;
    uint32_t top = 0;
    for (int64_t first = 0; first < n; first += segment) {
        int64_t m = n - first < segment ? n - first : segment;
        job.x = (const char *)x + (size_t)first * width;
        if (first > 0) memset(local, 0, local_count * sizeof(uint32_t));
        wb_parallel_for(m, nthreads, PARALLEL_MIN_VALUES, BLOCK, hist_range, &job);
        for (int t = 0; t < nthreads; ++t) {
            zeros += job.zeros[t];
            top = job.top_bits[t] > top ? job.top_bits[t] : top;
        }
        for (size_t part = 0; part < (size_t)nthreads * SUB; ++part) {
            const uint32_t *sub = local + part * (size_t)stride;
            for (int64_t b = 0; b <= bins; ++b) total[b] += sub[b];
        }
    }
    free(local);
    memcpy(max_abs, &top, sizeof top);
    /* beyond the bins (clamped into the last one): add nothing, the caller re-bins at a wider width */
    if (!(*max_abs * job.scale < (float)bins)) {
        free(total);
        return 1;
    }
    for (int64_t b = 0; b < bins; ++b) counts[b] += total[b];
    *nonfinite += total[bins];
    if (skip_zeros) counts[0] -= zeros;
    free(total);
    return 0;
}

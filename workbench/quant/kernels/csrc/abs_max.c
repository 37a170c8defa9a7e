/*
 * Largest finite |x| and the number of NaN/Inf values in one pass (the per-tensor max calibrator's
 * statistic), and the same per row of a contiguous matrix (a weight's output channels). torch needs two reductions for it (amax and amin, each read back) and a third pass when
 * either is not finite. The values are rows of row_length contiguous values, row_step apart, as for
 * the histogram kernel. The max is kept as the bit pattern of a non-negative float, which orders like
 * the value itself.
 */
#include <math.h>
#include <string.h>

#include "half.h"
#include "avx2_load.h"
#include "kernels.h"

#if WB_HAVE_X86_AVX2
#include <immintrin.h>
#endif

#define FINITE_LIMIT_BITS 0x7f800000u
#define PARALLEL_MIN_VALUES (1 << 20)

typedef struct {
    const char *x;
    size_t item;
    int dtype, use_avx2;
    int64_t row_length, row_step;
    uint32_t top_bits[WB_MAX_THREADS];
    int64_t nonfinite[WB_MAX_THREADS];
} max_job_t;

#define MAX_LOOP(LOAD)                                                     \
    for (int64_t i = 0; i < m; ++i) {                                      \
        float v = fabsf(LOAD(i));                                          \
        uint32_t bits;                                                     \
        memcpy(&bits, &v, sizeof bits);                                    \
        int finite = bits < FINITE_LIMIT_BITS;                             \
        bad += !finite;                                                    \
        bits = finite ? bits : 0u;                                         \
        top = bits > top ? bits : top;                                     \
    }

static void run_portable(const max_job_t *job, const char *data, int64_t m, uint32_t *top_bits, int64_t *nonfinite) {
    uint32_t top = *top_bits;
    int64_t bad = 0;
    WB_EACH_DTYPE(job->dtype, MAX_LOOP)
    *top_bits = top;
    *nonfinite += bad;
}

#if WB_HAVE_X86_AVX2
WB_AVX2_TARGET static void run_avx2(const max_job_t *job, const char *data, int64_t m, uint32_t *top_bits,
                                    int64_t *nonfinite) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf_bits = _mm256_set1_epi32((int)FINITE_LIMIT_BITS);
    __m256i top = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
    int64_t i = 0;
    /* per-lane NaN/Inf counters are 32-bit: rows are cut into pieces of at most 2**30 values by the caller */
    for (; i + 8 <= m; i += 8) {
        __m256i bits = _mm256_and_si256(wb_load8_f32_bits(job->dtype, data, i), abs_mask);
        __m256i finite = _mm256_cmpgt_epi32(inf_bits, bits); /* signed compare: the sign bit is clear */
        bad = _mm256_sub_epi32(bad, _mm256_cmpeq_epi32(finite, _mm256_setzero_si256()));
        top = _mm256_max_epu32(top, _mm256_and_si256(bits, finite));
    }
    uint32_t lane_top[8];
    int32_t lane_bad[8];
    _mm256_storeu_si256((__m256i *)lane_top, top);
    _mm256_storeu_si256((__m256i *)lane_bad, bad);
    uint32_t top_value = *top_bits;
    for (int k = 0; k < 8; ++k) {
        top_value = lane_top[k] > top_value ? lane_top[k] : top_value;
        *nonfinite += lane_bad[k];
    }
    *top_bits = top_value;
    if (i < m) run_portable(job, data + (size_t)i * job->item, m - i, top_bits, nonfinite);
}
#endif

static void max_range(void *ctx, int64_t begin, int64_t end, int worker) {
    max_job_t *job = (max_job_t *)ctx;
    uint32_t top = 0;
    int64_t bad = 0;
    const int64_t piece = (int64_t)1 << 30;
    for (int64_t start = begin; start < end;) {
        const int64_t row = start / job->row_length, column = start % job->row_length;
        int64_t m = end - start < piece ? end - start : piece;
        m = job->row_length - column < m ? job->row_length - column : m;
        const char *data = job->x + (size_t)(row * job->row_step + column) * job->item;
        start += m;
#if WB_HAVE_X86_AVX2
        if (job->use_avx2) {
            run_avx2(job, data, m, &top, &bad);
            continue;
        }
#endif
        run_portable(job, data, m, &top, &bad);
    }
    job->top_bits[worker] = top;
    job->nonfinite[worker] = bad;
}

void wb_abs_max(const void *x, int dtype, int64_t n, int64_t row_length, int64_t row_step, float *max_abs,
                int64_t *nonfinite, int nthreads) {
    if (nthreads < 1 || n < PARALLEL_MIN_VALUES) nthreads = 1;
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    if (row_length < 1 || row_length > n) row_length = n > 0 ? n : 1;
    max_job_t job;
    memset(&job, 0, sizeof job);
    job.x = (const char *)x;
    job.item = dtype == WB_DT_F32 ? 4 : 2;
    job.dtype = dtype;
    job.use_avx2 = wb_use_avx2();
    job.row_length = row_length;
    job.row_step = row_step;
    wb_parallel_for(n, nthreads, PARALLEL_MIN_VALUES, 64, max_range, &job);
    uint32_t top = 0;
    *nonfinite = 0;
    for (int t = 0; t < nthreads; ++t) {
        top = job.top_bits[t] > top ? job.top_bits[t] : top;
        *nonfinite += job.nonfinite[t];
    }
    memcpy(max_abs, &top, sizeof top);
}

/* Per row: rows are a contiguous weight's output channels (axis 0), each row_length values long. torch
 * needs about seven operations for this (amax and amin per row, their absolute values, the larger, a
 * finiteness check read back), each costing more than the pass itself on a layer's weight. */
typedef struct {
    max_job_t base;
    float *max_abs;
    int64_t nonfinite[WB_MAX_THREADS];
} rows_job_t;

static void rows_range(void *ctx, int64_t begin, int64_t end, int worker) {
    rows_job_t *job = (rows_job_t *)ctx;
    const max_job_t *base = &job->base;
    const int64_t piece = (int64_t)1 << 30; /* the AVX2 loop's 32-bit NaN/Inf counters */
    int64_t bad = 0;
    for (int64_t r = begin; r < end; ++r) {
        uint32_t top = 0;
        const char *row = base->x + (size_t)(r * base->row_length) * base->item;
        for (int64_t start = 0; start < base->row_length; start += piece) {
            int64_t m = base->row_length - start < piece ? base->row_length - start : piece;
            const char *data = row + (size_t)start * base->item;
#if WB_HAVE_X86_AVX2
            if (base->use_avx2) {
                run_avx2(base, data, m, &top, &bad);
                continue;
            }
#endif
            run_portable(base, data, m, &top, &bad);
        }
        memcpy(job->max_abs + r, &top, sizeof top);
    }
    job->nonfinite[worker] = bad;
}

void wb_abs_max_rows(const void *x, int dtype, int64_t rows, int64_t row_length, float *max_abs,
                     int64_t *nonfinite, int nthreads) {
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    rows_job_t job;
    memset(&job, 0, sizeof job);
    job.base.x = (const char *)x;
    job.base.item = dtype == WB_DT_F32 ? 4 : 2;
    job.base.dtype = dtype;
    job.base.use_avx2 = wb_use_avx2();
    job.base.row_length = row_length > 0 ? row_length : 1;
    job.max_abs = max_abs;
    /* threads only when there are enough values: the threshold counted in rows */
    int64_t min_rows = PARALLEL_MIN_VALUES / job.base.row_length + 1;
    wb_parallel_for(rows, nthreads, min_rows, 1, rows_range, &job);
    *nonfinite = 0;
    for (int t = 0; t < WB_MAX_THREADS; ++t) *nonfinite += job.nonfinite[t];
}

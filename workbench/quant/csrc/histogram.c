/*
 * Histogram of |x| with bins of width 2**e starting at 0 (see calib/histogram.py for why the width is
 * a power of two). One pass, threads count into private histograms that are summed at the end.
 * NaN and infinite values are counted and left out; zeros can be skipped.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "kernels.h"

typedef struct {
    const void *x;
    int dtype, skip_zeros;
    float scale; /* 2**-e: multiplying by it is exact */
    int64_t bins;
    int64_t *local; /* WB_MAX_THREADS private histograms */
    int64_t nonfinite[WB_MAX_THREADS];
} hist_job_t;

/* The loop body. Zeros (half of a ReLU output) are counted into bin 0 like any value and, with
 * skip_zeros, subtracted at the end: a branch on zero would mispredict on every other value. */
#define HIST_LOOP(LOAD)                                                                   \
    for (int64_t i = begin; i < end; ++i) {                                               \
        float v = fabsf(LOAD);                                                            \
        if (!(v <= 3.402823466e38f)) { /* NaN or infinity: rare, so the branch is cheap */ \
            nonfinite++;                                                                  \
            continue;                                                                     \
        }                                                                                 \
        zeros += v == 0.0f;                                                               \
        float position = v * scale;                                                       \
        counts[position < limit ? (int64_t)position : last_bin]++;                        \
    }

static void hist_range(void *ctx, int64_t begin, int64_t end, int worker) {
    hist_job_t *job = (hist_job_t *)ctx;
    int64_t *counts = job->local + (int64_t)worker * job->bins;
    const float scale = job->scale, limit = (float)job->bins;
    const int64_t last_bin = job->bins - 1;
    int64_t nonfinite = 0, zeros = 0;
    if (job->dtype == WB_DT_F32) {
        const float *x = (const float *)job->x;
        HIST_LOOP(x[i])
    } else if (job->dtype == WB_DT_F16) {
        const uint16_t *x = (const uint16_t *)job->x;
        HIST_LOOP(f16_to_f32(x[i]))
    } else {
        const uint16_t *x = (const uint16_t *)job->x;
        HIST_LOOP(bf16_to_f32(x[i]))
    }
    if (job->skip_zeros) counts[0] -= zeros;
    job->nonfinite[worker] = nonfinite;
}

int wb_histogram(const void *x, int dtype, int64_t n, int width_exponent, int64_t bins, int skip_zeros,
                 int64_t *counts, int64_t *nonfinite, int nthreads) {
    if (nthreads < 1) nthreads = 1;
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    int64_t *local = (int64_t *)calloc((size_t)nthreads * (size_t)bins, sizeof(int64_t));
    if (local == NULL) return -1;
    hist_job_t job;
    memset(&job, 0, sizeof job);
    job.x = x;
    job.dtype = dtype;
    job.skip_zeros = skip_zeros;
    job.scale = ldexpf(1.0f, -width_exponent);
    job.bins = bins;
    job.local = local;
    wb_parallel_for(n, nthreads, 1 << 16, 64, hist_range, &job);
    for (int t = 0; t < nthreads; ++t) {
        const int64_t *part = local + (int64_t)t * bins;
        for (int64_t b = 0; b < bins; ++b) counts[b] += part[b];
    }
    for (int t = 0; t < nthreads; ++t) *nonfinite += job.nonfinite[t];
    free(local);
    return 0;
}

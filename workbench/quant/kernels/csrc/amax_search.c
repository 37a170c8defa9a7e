/*
 * The amax searches of the histogram calibrator, evaluated for every candidate at once.
 *
 * Both searches are sums over bins that decompose into a few sums over contiguous runs of bins, so
 * with prefix sums each candidate costs O(groups) instead of O(bins). Candidates are split across
 * threads. The Python side (calib/histogram.py) prepares the inputs, picks the winner among the
 * returned values and holds an equivalent numpy implementation for builds without this extension.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

int64_t wb_candidate_count(int64_t first, int64_t last_inclusive, int64_t stride) {
    if (stride < 1 || last_inclusive < first) return 0;
    return (last_inclusive - first) / stride + 1;
}

/* ---------- entropy (KL divergence, TensorRT's calibration) ---------- */

typedef struct {
    const double *bins, *prefix_sum, *prefix_count, *prefix_blogb;
    int64_t n, groups, group_shift, start, stride;
    double total, log_total;
    double *out;
} entropy_job_t;

static int log2_exact(int64_t value) {
    int shift = 0;
    while (((int64_t)1 << shift) < value) shift++;
    return ((int64_t)1 << shift) == value ? shift : -1;
}

static void entropy_range(void *ctx, int64_t begin, int64_t end, int worker) {
    entropy_job_t *job = (entropy_job_t *)ctx;
    (void)worker;
    const double *S = job->prefix_sum, *C = job->prefix_count;
    const int64_t G = job->groups, shift = job->group_shift;
    for (int64_t c = begin; c < end; ++c) {
        const int64_t i = job->start + c * job->stride;
        const double in_range = S[i];
        if (!(in_range > 0)) {
            job->out[c] = INFINITY;
            continue;
        }
        const int64_t last = i - 1;
        double sum_b_log_avg = 0.0, avg_last = 0.0;
        int64_t lo = 0;
        for (int64_t k = 0; k < G; ++k) {
            /* group k holds bins [ceil(k * i / G), ceil((k + 1) * i / G)) */
            int64_t hi = shift >= 0 ? (((k + 1) * i + G - 1) >> shift) : (((k + 1) * i + G - 1) / G);
            double count = C[hi] - C[lo];
            if (count > 0) {
                double group_sum = S[hi] - S[lo];
                double average = group_sum / count;
                sum_b_log_avg += group_sum * log(average);
                if (lo <= last && last < hi) avg_last = average;
            }
            lo = hi;
        }
        const double b_last = job->bins[last];
        const double tail = job->total - in_range;
        const double head_mass = S[last];
        /* bins before the last: sum p log(p / q) with p = b / total and q = avg / in_range */
        double head = job->prefix_blogb[last] - head_mass * job->log_total + head_mass * log(in_range)
                      - (sum_b_log_avg - (b_last > 0 ? b_last * log(avg_last) : 0.0));
        head /= job->total;
        /* the last bin also carries everything beyond the candidate */
        double p_last = (b_last + tail) / job->total, last_term = 0.0;
        if (p_last > 0) {
            if (b_last > 0) {
                double q_last = avg_last / in_range;
                last_term = p_last * (log(p_last) - log(q_last));
            } else {
                last_term = INFINITY;
            }
        }
        double divergence = head + last_term;
        job->out[c] = isnan(divergence) ? INFINITY : divergence;
    }
}

void wb_entropy_divergences(const double *bins, int64_t n, int64_t groups, int64_t start, int64_t stride,
                            double *out, int nthreads) {
    int64_t count = wb_candidate_count(start, n, stride);
    if (count <= 0 || n <= 0) return;
    double *prefix = (double *)malloc(sizeof(double) * 3 * (size_t)(n + 1));
    if (prefix == NULL) {
        for (int64_t c = 0; c < count; ++c) out[c] = NAN; /* the caller treats NaN as a failure */
        return;
    }
    double *S = prefix, *C = prefix + (n + 1), *L = prefix + 2 * (n + 1);
    S[0] = C[0] = L[0] = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        double b = bins[j];
        S[j + 1] = S[j] + b;
        C[j + 1] = C[j] + (b > 0 ? 1.0 : 0.0);
        L[j + 1] = L[j] + (b > 0 ? b * log(b) : 0.0);
    }
    entropy_job_t job = {bins, S, C, L, n, groups, log2_exact(groups), start, stride, S[n], log(S[n]), out};
    wb_parallel_for(count, nthreads, 64, 1, entropy_range, &job);
    free(prefix);
}

/* ---------- mse of fake-quantized bin centers ---------- */

typedef struct {
    const double *centers, *P0, *P1;
    int64_t n, start, stride, levels;
    double P2_total, max_bound, first_center, inv_width;
    int uniform; /* centers are (j + 1/2) * width: boundaries follow from integer arithmetic */
    double *out;
} mse_job_t;

/* First bin whose center is >= threshold (centers ascending, nearly uniform): an arithmetic guess,
 * corrected against the actual centers so that rounding in the guess never changes the answer. */
static inline int64_t first_at_least(const mse_job_t *job, double threshold) {
    double position = (threshold - job->first_center) * job->inv_width;
    int64_t j;
    if (position <= 0) {
        j = 0;
    } else if (position >= (double)job->n) {
        j = job->n;
    } else {
        j = (int64_t)position; /* truncation, then up: ceil() for positive values without a libm call */
        j += (double)j < position;
    }
    while (j > 0 && job->centers[j - 1] >= threshold) j--;
    while (j < job->n && job->centers[j] < threshold) j++;
    return j;
}

static void mse_range(void *ctx, int64_t begin, int64_t end, int worker) {
    mse_job_t *job = (mse_job_t *)ctx;
    (void)worker;
    const double P0n = job->P0[job->n], P1n = job->P1[job->n];
    const double M = job->max_bound;
    for (int64_t c = begin; c < end; ++c) {
        const int64_t i = job->start + c * job->stride;
        const double step = job->centers[i] / M;
        /* level k takes centers in [(k - 1/2) step, (k + 1/2) step); B_k starts level k (k >= 1).
         * sum_k k S1_k = M P1[n] - sum_k P1[B_k],  sum_k k^2 S0_k = M^2 P0[n] - sum_k (2k - 1) P0[B_k] */
        double sum_p1 = 0.0, sum_p0 = 0.0;
        if (job->uniform) {
            /* b_k = ceil(((k - 1/2)(i + 1/2) / M) - 1/2) = ceil(num_k / D), num_k = (2k - 1)(2i + 1) - 2M,
             * D = 4M; num grows by 2(2i + 1) per level, so quotient and remainder are carried along
             * instead of dividing at every level. */
            const int64_t M_int = job->levels, D = 4 * M_int, delta = 2 * (2 * i + 1);
            const int64_t delta_q = delta / D, delta_r = delta % D;
            int64_t k = 1, num = (2 * i + 1) - 2 * M_int;
            for (; k <= M_int && num <= 0; ++k, num += delta) {
                sum_p1 += job->P1[0];
                sum_p0 += (2.0 * (double)k - 1.0) * job->P0[0];
            }
            int64_t q = num / D, r = num % D;
            for (; k <= M_int; ++k) {
                int64_t b = q + (r > 0);
                if (b > job->n) b = job->n;
                sum_p1 += job->P1[b];
                sum_p0 += (2.0 * (double)k - 1.0) * job->P0[b];
                q += delta_q;
                r += delta_r;
                if (r >= D) {
                    r -= D;
                    q += 1;
                }
            }
        } else {
            for (int64_t k = 1; k <= job->levels; ++k) {
                int64_t b = first_at_least(job, ((double)k - 0.5) * step);
                sum_p1 += job->P1[b];
                sum_p0 += (2.0 * (double)k - 1.0) * job->P0[b];
            }
        }
        double first = M * P1n - sum_p1;
        double second = M * M * P0n - sum_p0;
        double error = job->P2_total - 2.0 * step * first + step * step * second;
        job->out[c] = error < 0 ? 0.0 : error;
    }
}

void wb_mse_errors(const double *counts, const double *centers, int64_t n, double max_bound, int64_t start,
                   int64_t stride, int uniform, double *out, int nthreads) {
    int64_t count = wb_candidate_count(start, n - 1, stride);
    if (count <= 0 || n <= 0) return;
    double *prefix = (double *)malloc(sizeof(double) * 2 * (size_t)(n + 1));
    if (prefix == NULL) {
        for (int64_t c = 0; c < count; ++c) out[c] = NAN;
        return;
    }
    double *P0 = prefix, *P1 = prefix + (n + 1), P2 = 0.0;
    P0[0] = P1[0] = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        P0[j + 1] = P0[j] + counts[j];
        P1[j + 1] = P1[j] + counts[j] * centers[j];
        P2 += counts[j] * centers[j] * centers[j];
    }
    double width = n > 1 ? centers[1] - centers[0] : 0.0;
    mse_job_t job = {centers, P0, P1, n, start, stride, (int64_t)max_bound, P2, max_bound, centers[0],
                     width > 0 ? 1.0 / width : 0.0, uniform, out};
    wb_parallel_for(count, nthreads, 64, 1, mse_range, &job);
    free(prefix);
}

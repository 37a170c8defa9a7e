/* Plain-C CPU kernels of workbench.quant; Python bindings live in module.c. */
#ifndef WB_KERNELS_H
#define WB_KERNELS_H

#include <stdint.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define WB_HAVE_X86_AVX2 1
#define WB_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#else
#define WB_HAVE_X86_AVX2 0
#define WB_AVX2_TARGET
#endif

/* cpu.c: use the AVX2 paths? (false when the CPU lacks them, or tests force the portable loops) */
int wb_use_avx2(void);
const char *wb_isa(void);
void wb_force_portable(int flag);

enum { WB_DT_F32 = 0, WB_DT_F16 = 1, WB_DT_BF16 = 2 };
enum { WB_MODE_MUL_DIV = 0, WB_MODE_DIV_MUL = 1 };

/* Runs fn(ctx, begin, end) over [0, total) split into up to nthreads contiguous chunks (multiples of
 * `align`), on the calling thread plus started threads. Runs on the caller alone below min_total. */
typedef void (*wb_range_fn)(void *ctx, int64_t begin, int64_t end, int worker);
void wb_parallel_for(int64_t total, int nthreads, int64_t min_total, int64_t align, wb_range_fn fn, void *ctx);
#define WB_MAX_THREADS 64

/* fake_quant.c */
typedef struct {
    float a; /* scale (MUL_DIV) or step (DIV_MUL) */
    float b; /* divisor (MUL_DIV) or multiplier (DIV_MUL) for dequantization */
} wb_qparam_t;

/* Returns 1 when an input was negative. See fake_quant.c for the formulas. */
int wb_fake_quant(const void *x, void *y, int dtype, int64_t outer, int64_t channels, int64_t inner,
                  const wb_qparam_t *params, float lo, float hi, int mode, int dequant, int nthreads);

/* The (a, b) pair of every amax (see kernels.host_params for the formulas). Returns the smallest amax
 * (NaN ignored; +inf when there is none) so that the caller can refuse a negative one. */
float wb_quant_params(const float *amax, int64_t n, float max_bound, int mode, wb_qparam_t *out);

/* ste_grad.c: grad_in = |x| <= thresholds[channel] ? grad_out : 0 (x, grad_out, grad_in of one dtype) */
void wb_ste_grad(const void *x, const void *grad_out, void *grad_in, int dtype, int64_t outer, int64_t channels,
                 int64_t inner, const float *thresholds, int nthreads);

/* amax_search.c: one value per candidate, written to out[0 .. count) */
int64_t wb_candidate_count(int64_t first, int64_t last_inclusive, int64_t stride);
void wb_entropy_divergences(const double *bins, int64_t n, int64_t groups, int64_t start, int64_t stride,
                            double *out, int nthreads);
/* uniform: centers[j] == (j + 1/2) * width (histograms from 0 with equal bins) */
void wb_mse_errors(const double *counts, const double *centers, int64_t n, double max_bound, int64_t start,
                   int64_t stride, int uniform, double *out, int nthreads);

/* histogram.c: adds |x| counts into counts[0 .. bins) (bins of width 2**(*width_exponent) from 0) and the
 * number of NaN/Inf values into *nonfinite, and writes the largest finite |x| (0 if none) to *max_abs.
 * When values lie beyond the bins, the width grows to the narrowest power of two (exponent at least
 * min_exponent) whose bins hold them, counts already there are merged to it, and *width_exponent is
 * updated: one pass over x in every case. The n values are rows of row_length contiguous values whose
 * starts are row_step values apart (row_length = n: one contiguous block). Returns 0, or -1 when memory
 * ran out (counts untouched). */
int wb_histogram(const void *x, int dtype, int64_t n, int64_t row_length, int64_t row_step, int *width_exponent,
                 int min_exponent, int64_t bins, int skip_zeros, int64_t *counts, int64_t *nonfinite, float *max_abs,
                 int nthreads);

/* abs_max.c: the largest finite |x| (0 if none) and the number of NaN/Inf values, in one pass over n values
 * laid out as for wb_histogram. */
void wb_abs_max(const void *x, int dtype, int64_t n, int64_t row_length, int64_t row_step, float *max_abs,
                int64_t *nonfinite, int nthreads);
/* The same per row of a contiguous rows x row_length matrix: max_abs[r] for each row, the NaN/Inf total. */
void wb_abs_max_rows(const void *x, int dtype, int64_t rows, int64_t row_length, float *max_abs,
                     int64_t *nonfinite, int nthreads);

#endif

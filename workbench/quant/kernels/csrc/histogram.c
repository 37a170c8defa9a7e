/*
 * Histogram of |x| with bins of width 2**e starting at 0 (see calib/histogram.py for why the width is
 * a power of two). One pass over the data, which also tracks the largest finite |x| and widens the bins
 * when a value lies beyond them. NaN and infinite values are counted and left out; zeros can be skipped.
 *
 * Why widening needs no second pass: with power-of-two widths, floor(|x| / 2**(e+k)) equals
 * floor(floor(|x| / 2**e) / 2**k), so counts at width 2**e merged 2**k bins at a time are exactly the
 * counts at width 2**(e+k). The data is read in blocks; a block's indices and max are computed first,
 * and when the max lies beyond the bins, the counts so far are merged to the narrowest width that holds
 * it and the block's indices are computed again at that width, before anything of it is counted.
 * The result is the histogram that taking the max first would give, whatever the order of the values.
 *
 * The max is kept as the bit pattern of a non-negative float, which orders like the value itself.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "avx2_load.h"
#include "kernels.h"

#if WB_HAVE_X86_AVX2
#include <immintrin.h>
#endif

/* Work in blocks of at most BLOCK values. A first look at a block finds its largest |x| (as bits; NaN
 * and infinities have larger bit patterns than any finite value); when that lies within the bins, the
 * block is counted straight away, no value needing a check, and when it lies beyond them, the bins are
 * widened first. A block that holds NaN or Inf takes a careful path that indexes every value first
 * (non-finite ones go to an extra slot after the bins).
 * Counting into one array stalls when nearby values land in the same bin (each increment waits for the
 * previous one: ReLU zeros all go to bin 0), so values are counted into SUB interleaved copies. */
#define BLOCK 512
#define SUB 4 /* the counting loops and the final sum are written out for 4 */
/* Below this, a second thread's start-up and its private histograms cost more than they save. */
#define PARALLEL_MIN_VALUES (1 << 20)
#define FINITE_LIMIT_BITS 0x7f800000u /* bits of +inf: finite |x| have smaller bit patterns */

typedef struct {
    const char *x;
    size_t item; /* bytes per value */
    int64_t base;                 /* logical index of this segment's first value */
    int64_t row_length, row_step; /* values are rows of row_length contiguous values, row_step apart */
    int dtype, use_avx2, skip_zeros;
    int first_exponent, min_exponent;
    int64_t bins;
    uint32_t *local; /* per worker: SUB x (bins + 1) counts; the extra slot counts NaN/Inf */
    int64_t zeros[WB_MAX_THREADS];
    uint32_t top_bits[WB_MAX_THREADS];  /* largest finite |x| per worker, as float bits */
    int exponent[WB_MAX_THREADS];       /* each worker's width exponent at the end of its range */
} hist_job_t;

/* Bit pattern of bins * 2**e as a float (+inf bits when it overflows): |x| fits the bins iff its bits are
 * below this. */
static uint32_t limit_bits(int64_t bins, int e) {
    double limit = ldexp((double)bins, e);
    if (!(limit < 3.4028234663852886e38)) return FINITE_LIMIT_BITS;
    float f = (float)limit; /* bins < 2**24 times a power of two: exact */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* The smallest e >= max(current, min_exponent) with bins * 2**e > value (value finite, >= 0). */
static int covering_exponent(float value, int64_t bins, int current, int min_exponent) {
    int e = current > min_exponent ? current : min_exponent;
    if (!(value > 0.0f)) return e;
    int exponent;
    frexp((double)value / (double)bins, &exponent); /* value / bins < 2**exponent */
    if (exponent > e) e = exponent;
    while (e > current && e > min_exponent && ldexp((double)bins, e - 1) > (double)value) e--;
    while (!(ldexp((double)bins, e) > (double)value)) e++;
    return e;
}

/* Counts of h[0 .. bins) re-binned 2**shift bins at a time, in place (bin j reads bins >= j, so going up
 * never reads a bin already written). The slot after the bins (NaN/Inf) is left alone. */
#define MERGE_BINS(TYPE, NAME)                                                    \
    static void NAME(TYPE *h, int64_t bins, int shift) {                          \
        if (shift <= 0) return;                                                   \
        if (shift >= 62 || ((int64_t)1 << shift) >= bins) {                       \
            TYPE total = 0;                                                       \
            for (int64_t b = 0; b < bins; ++b) total += h[b];                     \
            memset(h, 0, (size_t)bins * sizeof(TYPE));                            \
            h[0] = total;                                                         \
            return;                                                               \
        }                                                                         \
        const int64_t factor = (int64_t)1 << shift;                               \
        const int64_t coarse = (bins + factor - 1) / factor;                      \
        for (int64_t j = 0; j < coarse; ++j) {                                    \
            TYPE total = 0;                                                       \
            int64_t end = (j + 1) * factor < bins ? (j + 1) * factor : bins;      \
            for (int64_t b = j * factor; b < end; ++b) total += h[b];             \
            h[j] = total;                                                         \
        }                                                                         \
        memset(h + coarse, 0, (size_t)(bins - coarse) * sizeof(TYPE));            \
    }
MERGE_BINS(uint32_t, merge_u32)
MERGE_BINS(int64_t, merge_i64)

/* ----- the first look: largest |x| bits of a block (NaN/Inf included), and its zeros when asked ----- */

#define SCAN_LOOP(LOAD)                                           \
    for (int64_t i = 0; i < m; ++i) {                             \
        float v = fabsf(LOAD(i));                                 \
        uint32_t v_bits;                                          \
        memcpy(&v_bits, &v, sizeof v_bits);                       \
        top = v_bits > top ? v_bits : top;                        \
        zeros += v_bits == 0u;                                    \
    }

static uint32_t block_scan_portable(const hist_job_t *job, const char *data, int64_t m, int64_t *block_zeros) {
    uint32_t top = 0;
    int64_t zeros = 0;
    WB_EACH_DTYPE(job->dtype, SCAN_LOOP)
    *block_zeros = zeros;
    return top;
}

/* ----- counting a block whose values are all finite and within the bins: no checks per value ----- */

#define COUNT_LOOP(LOAD)                                                          \
    for (; i + SUB <= m; i += SUB) {                                              \
        c0[(int32_t)(fabsf(LOAD(i)) * scale)]++;                                  \
        c1[(int32_t)(fabsf(LOAD(i + 1)) * scale)]++;                              \
        c2[(int32_t)(fabsf(LOAD(i + 2)) * scale)]++;                              \
        c3[(int32_t)(fabsf(LOAD(i + 3)) * scale)]++;                              \
    }                                                                             \
    for (; i < m; ++i) c0[(int32_t)(fabsf(LOAD(i)) * scale)]++;


/* |x| * 2**-e is exact (a power of two; no overflow, as |x| < bins * 2**e) and below bins, so truncating
 * it gives floor(|x| / 2**e): the bin. */
static void block_count_portable(const hist_job_t *job, const char *data, int64_t i, int64_t m, float scale,
                                 uint32_t *counts, int64_t stride) {
    uint32_t *c0 = counts, *c1 = counts + stride, *c2 = counts + 2 * stride, *c3 = counts + 3 * stride;
    WB_EACH_DTYPE(job->dtype, COUNT_LOOP)
}

#if WB_HAVE_X86_AVX2
/* Counting from bins computed beforehand (the AVX2 path). */
static void count_indexed(const int32_t *index, int64_t m, uint32_t *counts, int64_t stride) {
    uint32_t *c0 = counts, *c1 = counts + stride, *c2 = counts + 2 * stride, *c3 = counts + 3 * stride;
    int64_t i = 0;
    for (; i + SUB <= m; i += SUB) {
        c0[index[i]]++;
        c1[index[i + 1]]++;
        c2[index[i + 2]]++;
        c3[index[i + 3]]++;
    }
    for (; i < m; ++i) c0[index[i]]++;
}

/* The AVX2 path looks and indexes in one go, 8 values at a time (compilers do not vectorise the loops
 * above: the float-to-int conversion and the bit casts stop them): every value's bin at the current width
 * goes to index[], and the block's largest |x| bits come back. The indices are counted when that lies
 * within the bins (the usual case), and computed again after widening otherwise; values beyond the bins
 * or NaN/Inf get meaningless indices, never counted. Counting from index[] in a loop of its own is faster
 * than incrementing straight from the vector register or from a small array per vector (measured on the
 * ViT's activations, Zen 4: 0.38 ns per value against 0.49 and 0.59). The values are read by wb_load8_f32_bits (avx2_load.h); the
 * dtype is a local, so that the compiler keeps its test out of the loop (the stores to index[] might, for
 * all it knows, change job->dtype). */
#define INDEX8_LOOP(ZEROS)                                                                                   \
    for (; i + 8 <= m; i += 8) {                                                                             \
        __m256i bits = _mm256_and_si256(wb_load8_f32_bits(dtype, data, i), abs_mask);                       \
        __m256i bin = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(bits), scale));                  \
        _mm256_storeu_si256((__m256i *)(index + i), bin);                                                    \
        top = _mm256_max_epu32(top, bits);                                                                   \
        ZEROS;                                                                                               \
    }

#define TAIL_INDEX_LOOP(LOAD)                                                           \
    for (; i < m; ++i) {                                                                \
        float position = fabsf(LOAD(i)) * scale_value;                                  \
        index[i] = (int32_t)(position < last ? position : last); /* NaN: last */        \
    }

WB_AVX2_TARGET static uint32_t block_index_avx2(const hist_job_t *job, const char *data, int64_t m,
                                                float scale_value, int32_t *index, int64_t *block_zeros) {
    const __m256 scale = _mm256_set1_ps(scale_value);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), zero = _mm256_setzero_si256();
    const int dtype = job->dtype;
    __m256i top = zero, zeros = zero;
    int64_t i = 0;
    if (job->skip_zeros) {
        INDEX8_LOOP(zeros = _mm256_sub_epi32(zeros, _mm256_cmpeq_epi32(bits, zero)))
    } else {
        INDEX8_LOOP((void)0)
    }
    uint32_t lane_top[8];
    int32_t lane_zeros[8];
    _mm256_storeu_si256((__m256i *)lane_top, top);
    _mm256_storeu_si256((__m256i *)lane_zeros, zeros);
    int64_t total_zeros = 0;
    uint32_t top_value = 0;
    if (i < m) { /* the last few: their bins, clamped (converting a float beyond int32 is undefined in C) */
        top_value = block_scan_portable(job, data + (size_t)i * job->item, m - i, &total_zeros);
        const float last = (float)(job->bins - 1);
        WB_EACH_DTYPE(dtype, TAIL_INDEX_LOOP)
    }
    for (int k = 0; k < 8; ++k) {
        top_value = lane_top[k] > top_value ? lane_top[k] : top_value;
        total_zeros += lane_zeros[k];
    }
    *block_zeros = total_zeros;
    return top_value;
}
#endif

/* Counts a block whose values are all finite and within the bins at this scale. */
static void block_count(const hist_job_t *job, const char *data, int64_t m, float scale, uint32_t *counts,
                        int64_t stride, int32_t *index) {
#if WB_HAVE_X86_AVX2
    if (job->use_avx2) {
        int64_t zeros; /* counted already */
        block_index_avx2(job, data, m, scale, index, &zeros);
        count_indexed(index, m, counts, stride);
        return;
    }
#endif
    (void)index;
    block_count_portable(job, data, 0, m, scale, counts, stride);
}

/* ----- the careful path, for a block that holds NaN or Inf ----- */

/* Index of every value of a block at width 2**e: bins - 1 for values beyond the bins (the caller widens
 * before counting them), bins for NaN/Inf. Raises *top_bits with the largest finite |x|. */
#define INDEX_LOOP(LOAD)                                                                        \
    for (int64_t i = 0; i < m; ++i) {                                                           \
        float v = fabsf(LOAD(i));                                                               \
        uint32_t v_bits;                                                                        \
        memcpy(&v_bits, &v, sizeof v_bits);                                                     \
        float position = v * scale;                                                             \
        position = position < last ? position : last; /* also NaN: its index is replaced */     \
        int32_t bin = (int32_t)position;                                                        \
        int finite = v_bits < FINITE_LIMIT_BITS;                                                \
        index[i] = finite ? bin : (int32_t)bins;                                                \
        v_bits = finite ? v_bits : 0u;                                                          \
        top = v_bits > top ? v_bits : top;                                                      \
    }

static void block_index(const hist_job_t *job, const char *data, int64_t m, int e, int32_t *index,
                        uint32_t *top_bits) {
    const float scale = ldexpf(1.0f, -e), last = (float)(job->bins - 1);
    const int64_t bins = job->bins;
    uint32_t top = 0;
    WB_EACH_DTYPE(job->dtype, INDEX_LOOP)
    *top_bits = top;
}

/* ----- one worker's range ----- */

/* Make the bins (width 2**e) hold a finite |x| with these bits: the counts so far merged to the
 * narrowest power of two that does. */
static void widen(const hist_job_t *job, uint32_t *counts, int64_t stride, int counted, uint32_t bits, int *e,
                  uint32_t *limit) {
    float value;
    memcpy(&value, &bits, sizeof value);
    int wider = covering_exponent(value, job->bins, *e, job->min_exponent);
    if (counted) /* not before the range's first block (the usual first batch): nothing to merge */
        for (int s = 0; s < SUB; ++s) merge_u32(counts + s * stride, job->bins, wider - *e);
    *e = wider;
    *limit = limit_bits(job->bins, wider);
}

static void hist_range(void *ctx, int64_t begin, int64_t end, int worker) {
    hist_job_t *job = (hist_job_t *)ctx;
    const int64_t stride = job->bins + 1;
    uint32_t *counts = job->local + (int64_t)worker * SUB * stride;
    int32_t index[BLOCK];
    int64_t zeros = 0;
    uint32_t top = 0;
    int e = job->first_exponent;
    uint32_t limit = limit_bits(job->bins, e);
    float scale = ldexpf(1.0f, -e); /* exact: e lies within float's normal exponents */
    for (int64_t start = begin; start < end;) {
        /* a block ends at BLOCK values, at the end of the range, or at the end of a row */
        const int64_t logical = job->base + start, row = logical / job->row_length, column = logical % job->row_length;
        int64_t m = end - start < BLOCK ? end - start : BLOCK;
        m = job->row_length - column < m ? job->row_length - column : m;
        const char *data = job->x + (size_t)(row * job->row_step + column) * job->item;
        const int counted = start > begin;
        start += m;
        int64_t block_zeros = 0; /* counted only when skip_zeros asks for them */
        uint32_t block_top;
#if WB_HAVE_X86_AVX2
        if (job->use_avx2) {
            block_top = block_index_avx2(job, data, m, scale, index, &block_zeros);
            zeros += block_zeros;
            if (block_top < limit) { /* finite and within the bins: the indices hold */
                count_indexed(index, m, counts, stride);
                top = block_top > top ? block_top : top;
                continue;
            }
        } else
#endif
        {
            block_top = block_scan_portable(job, data, m, &block_zeros);
            zeros += block_zeros;
        }
        if (block_top < FINITE_LIMIT_BITS) {
            if (block_top >= limit) {
                widen(job, counts, stride, counted, block_top, &e, &limit);
                scale = ldexpf(1.0f, -e);
            }
            block_count(job, data, m, scale, counts, stride, index);
        } else { /* NaN or Inf in the block */
            block_index(job, data, m, e, index, &block_top);
            if (block_top >= limit) {
                widen(job, counts, stride, counted, block_top, &e, &limit);
                scale = ldexpf(1.0f, -e);
                block_index(job, data, m, e, index, &block_top);
            }
            for (int64_t i = 0; i < m; ++i) counts[index[i]]++;
        }
        top = block_top > top ? block_top : top;
    }
    job->zeros[worker] = zeros;
    job->top_bits[worker] = top;
    job->exponent[worker] = e;
}

/* The one-thread case's private counts live on between calls (one buffer per calling thread): a fresh
 * 64 KB allocation per call costs more than counting a small tensor (page faults when the heap was
 * trimmed in between). Every call leaves the buffer all zero again. */
#if defined(_MSC_VER)
#define WB_THREAD_LOCAL __declspec(thread)
#else
#define WB_THREAD_LOCAL _Thread_local
#endif
static WB_THREAD_LOCAL uint32_t *scratch = NULL;
static WB_THREAD_LOCAL size_t scratch_count = 0;

static uint32_t *zeroed_counts(size_t count, int *owned) {
    *owned = 0;
    if (count <= scratch_count) return scratch;
    uint32_t *buffer = (uint32_t *)calloc(count, sizeof(uint32_t));
    if (buffer == NULL) return NULL;
    if (count <= (size_t)SUB * ((1u << 16) + 1)) { /* keep up to 65536 bins; larger ones are freed after use */
        free(scratch);
        scratch = buffer;
        scratch_count = count;
    } else {
        *owned = 1;
    }
    return buffer;
}

int wb_histogram(const void *x, int dtype, int64_t n, int64_t row_length, int64_t row_step, int *width_exponent,
                 int min_exponent, int64_t bins, int skip_zeros, int64_t *counts, int64_t *nonfinite, float *max_abs,
                 int nthreads) {
    if (nthreads < 1 || n < PARALLEL_MIN_VALUES) nthreads = 1;
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    if (row_length < 1 || row_length > n) row_length = n > 0 ? n : 1; /* one row: contiguous */
    const int64_t stride = bins + 1;
    const size_t local_count = (size_t)nthreads * SUB * (size_t)stride;
    /* 32-bit private counts: half the cache footprint of 64-bit ones (4096 bins x 4 copies = 64 KB). A
     * segment of at most 2**31 values cannot overflow them; each segment's counts go into the 64-bit
     * totals before the next. Several threads: fresh buffers (a large tensor, where this costs nothing). */
    int owned = 1;
    uint32_t *local = nthreads == 1 ? zeroed_counts(local_count, &owned)
                                    : (uint32_t *)calloc(local_count, sizeof(uint32_t));
    if (local == NULL) return -1;
    hist_job_t job;
    memset(&job, 0, sizeof job);
    job.x = (const char *)x;
    job.item = dtype == WB_DT_F32 ? 4 : 2;
    job.row_length = row_length;
    job.row_step = row_step;
    job.dtype = dtype;
    job.use_avx2 = wb_use_avx2();
    job.skip_zeros = skip_zeros;
    job.min_exponent = min_exponent;
    job.bins = bins;
    job.local = local;
    const int64_t segment = (int64_t)1 << 31;
    int64_t zeros = 0;
    uint32_t top = 0;
    int e = *width_exponent > min_exponent ? *width_exponent : min_exponent;
    for (int64_t first = 0; first < n; first += segment) {
        int64_t m = n - first < segment ? n - first : segment;
        job.base = first;
        job.first_exponent = e;
        for (int t = 0; t < nthreads; ++t) { /* as left for workers that get no range */
            job.exponent[t] = e;
            job.zeros[t] = 0;
            job.top_bits[t] = 0;
        }
        wb_parallel_for(m, nthreads, PARALLEL_MIN_VALUES, BLOCK, hist_range, &job);
        int widest = e;
        for (int t = 0; t < nthreads; ++t) {
            zeros += job.zeros[t];
            top = job.top_bits[t] > top ? job.top_bits[t] : top;
            widest = job.exponent[t] > widest ? job.exponent[t] : widest;
        }
        /* every worker's counts, and the totals so far, at the widest width any worker reached */
        merge_i64(counts, bins, widest - e);
        e = widest;
        float top_value;
        memcpy(&top_value, &top, sizeof top_value);
        /* no bin above the max's holds anything: add (and zero again) only up to it, and the NaN/Inf slot */
        int64_t used = (int64_t)((double)top_value * ldexp(1.0, -e)) + 1;
        used = used < bins ? used : bins;
        for (int t = 0; t < nthreads; ++t) {
            uint32_t *sub[SUB];
            for (int s = 0; s < SUB; ++s) {
                sub[s] = local + ((size_t)t * SUB + (size_t)s) * (size_t)stride;
                merge_u32(sub[s], bins, e - job.exponent[t]);
                *nonfinite += sub[s][bins];
                sub[s][bins] = 0;
            }
            for (int64_t b = 0; b < used; ++b) /* one pass over the totals (SUB = 4) */
                counts[b] += (int64_t)sub[0][b] + (int64_t)sub[1][b] + (int64_t)sub[2][b] + (int64_t)sub[3][b];
            for (int s = 0; s < SUB; ++s) memset(sub[s], 0, (size_t)used * sizeof(uint32_t));
        }
    }
    if (owned) free(local);
    memcpy(max_abs, &top, sizeof top);
    if (skip_zeros) counts[0] -= zeros;
    *width_exponent = e;
    return 0;
}

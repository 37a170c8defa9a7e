/*
 * Fused straight-through-estimator backward for CPU tensors.
 *
 * grad_in[i] = |x[i]| <= t[channel] ? grad_out[i] : +0
 *
 * One pass: read x and grad_out, write grad_in. torch's version (abs, <=, where) makes about four
 * passes over memory and allocates a bool mask; quantization-aware training pays it on every
 * quantized tensor, every step. NaN x compares false (gradient 0), as in torch. A passed gradient is
 * copied bit for bit (NaN, -0 included), so the result is identical to the torch formula.
 *
 * t is the threshold already rounded by the caller to the dtype torch would compare in (for a 0-dim
 * float32 amax against a float16 x, torch compares in float16), then widened to float32 exactly,
 * so comparing in float32 here gives torch's answer. x and grad_out share one dtype and layout
 * [outer, channels, inner].
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "kernels.h"

#if WB_HAVE_X86_AVX2
#include <immintrin.h>
#endif

#define PARALLEL_MIN_ELEMENTS (1 << 17)

static inline float load_as_f32(const void *x, int64_t i, int dtype) {
    if (dtype == WB_DT_F32) return ((const float *)x)[i];
    if (dtype == WB_DT_F16) return f16_to_f32(((const uint16_t *)x)[i]);
    return bf16_to_f32(((const uint16_t *)x)[i]);
}

static void run_portable(const void *xv, const void *gv, void *yv, int64_t n, int dtype, float t) {
    if (dtype == WB_DT_F32) {
        const float *x = (const float *)xv;
        const uint32_t *g = (const uint32_t *)gv;
        uint32_t *y = (uint32_t *)yv;
        for (int64_t i = 0; i < n; ++i) y[i] = fabsf(x[i]) <= t ? g[i] : 0u;
    } else {
        const uint16_t *g = (const uint16_t *)gv;
        uint16_t *y = (uint16_t *)yv;
        for (int64_t i = 0; i < n; ++i) y[i] = fabsf(load_as_f32(xv, i, dtype)) <= t ? g[i] : (uint16_t)0;
    }
}

#if WB_HAVE_X86_AVX2
#define AVX2_TARGET WB_AVX2_TARGET

AVX2_TARGET static inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

AVX2_TARGET static inline __m256 half8_to_f32(const uint16_t *p, int dtype) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    if (dtype == WB_DT_F16) return _mm256_cvtph_ps(raw);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

AVX2_TARGET static void run_avx2(const void *xv, const void *gv, void *yv, int64_t n, int dtype, float t_s) {
    const __m256 t = _mm256_set1_ps(t_s);
    int64_t i = 0;
    if (dtype == WB_DT_F32) {
        const float *x = (const float *)xv;
        const float *g = (const float *)gv;
        float *y = (float *)yv;
        for (; i + 8 <= n; i += 8) {
            /* ordered compare: NaN gives false, i.e. a zero gradient */
            __m256 keep = _mm256_cmp_ps(abs8(_mm256_loadu_ps(x + i)), t, _CMP_LE_OQ);
            _mm256_storeu_ps(y + i, _mm256_and_ps(keep, _mm256_loadu_ps(g + i)));
        }
    } else {
        const uint16_t *x = (const uint16_t *)xv;
        const uint16_t *g = (const uint16_t *)gv;
        uint16_t *y = (uint16_t *)yv;
        for (; i + 8 <= n; i += 8) {
            __m256i keep = _mm256_castps_si256(_mm256_cmp_ps(abs8(half8_to_f32(x + i, dtype)), t, _CMP_LE_OQ));
            /* 8 x (0 or -1) int32 -> 8 x (0 or 0xffff) int16: signed saturation keeps -1 */
            __m128i mask = _mm_packs_epi32(_mm256_castsi256_si128(keep), _mm256_extracti128_si256(keep, 1));
            __m128i grad = _mm_loadu_si128((const __m128i *)(g + i));
            _mm_storeu_si128((__m128i *)(y + i), _mm_and_si128(mask, grad));
        }
    }
    if (i < n) {
        /* the last 1-7 values through the same vector code via padded buffers (no AVX-SSE transition) */
        float xs[8] = {0}, gs[8] = {0}, ys[8];
        uint16_t gh[8];
        int64_t rest = n - i;
        for (int64_t k = 0; k < rest; ++k) {
            xs[k] = load_as_f32(xv, i + k, dtype);
            if (dtype == WB_DT_F32) memcpy(&gs[k], (const float *)gv + i + k, 4);
            else gh[k] = ((const uint16_t *)gv)[i + k];
        }
        __m256 keep = _mm256_cmp_ps(abs8(_mm256_loadu_ps(xs)), t, _CMP_LE_OQ);
        _mm256_storeu_ps(ys, _mm256_and_ps(keep, _mm256_loadu_ps(gs)));
        int keep_bits = _mm256_movemask_ps(keep);
        for (int64_t k = 0; k < rest; ++k) {
            if (dtype == WB_DT_F32) memcpy((float *)yv + i + k, &ys[k], 4);
            else ((uint16_t *)yv)[i + k] = (keep_bits >> k) & 1 ? gh[k] : (uint16_t)0;
        }
    }
}
#endif

typedef struct {
    const char *x, *g;
    char *y;
    size_t width;
    int dtype, use_avx2;
    int64_t channels, inner;
    const float *thresholds;
} job_t;

static void run_range(void *ctx, int64_t begin, int64_t end, int worker) {
    job_t *job = (job_t *)ctx;
    (void)worker;
    int64_t i = begin;
    while (i < end) {
        int64_t row = i / job->inner;
        int64_t row_end = (row + 1) * job->inner;
        int64_t stop = row_end < end ? row_end : end;
        float t = job->thresholds[row % job->channels];
        size_t offset = (size_t)i * job->width;
#if WB_HAVE_X86_AVX2
        if (job->use_avx2)
            run_avx2(job->x + offset, job->g + offset, job->y + offset, stop - i, job->dtype, t);
        else
#endif
            run_portable(job->x + offset, job->g + offset, job->y + offset, stop - i, job->dtype, t);
        i = stop;
    }
}

void wb_ste_grad(const void *x, const void *grad_out, void *grad_in, int dtype, int64_t outer, int64_t channels,
                 int64_t inner, const float *thresholds, int nthreads) {
    job_t job;
    memset(&job, 0, sizeof job);
    job.x = (const char *)x;
    job.g = (const char *)grad_out;
    job.y = (char *)grad_in;
    job.width = dtype == WB_DT_F32 ? 4 : 2;
    job.dtype = dtype;
    job.channels = channels;
    job.inner = inner;
    job.thresholds = thresholds;
#if WB_HAVE_X86_AVX2
    job.use_avx2 = wb_use_avx2();
#endif
    wb_parallel_for(outer * channels * inner, nthreads, PARALLEL_MIN_ELEMENTS, 64, run_range, &job);
}

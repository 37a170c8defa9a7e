/*
 * Fused fake-quantization kernels for CPU tensors.
 *
 * One pass over the data per call: read x, quantize to the integer grid, clamp, optionally
 * dequantize, write y. torch's own fake-quantize operators make several passes (and build a
 * mask), which is why this exists; see bench/fake_quant.py for the measured difference.
 *
 * Two rounding conventions are supported because both are in use:
 *   MODE_MUL_DIV  q = rint(x * scale),  y = q / scale      (pytorch-quantization, scale = max_bound / amax)
 *   MODE_DIV_MUL  q = rint(x / step),   y = q * step       (ONNX QuantizeLinear/DequantizeLinear, step = amax / max_bound)
 * rint rounds half to even, like torch.round and ONNX. Clamping keeps NaN as NaN, like torch.clamp.
 *
 * The parameters are per channel: the tensor is seen as [outer, channels, inner] (per-tensor is
 * outer = channels = 1), and a channel whose amax is zero gets parameters that map every finite
 * value to 0 (chosen by the Python caller).
 *
 * Half and bfloat16 inputs are computed in float32 and written back in their own type.
 * This file is plain C; the Python bindings are in module.c.
 * The x86 AVX2 path uses intrinsics behind a runtime CPU check so one binary runs everywhere;
 * other machines get the portable loops, which compilers auto-vectorize.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "kernels.h"

#if WB_HAVE_X86_AVX2
#include <immintrin.h>
#endif

#define DT_F32 WB_DT_F32
#define DT_F16 WB_DT_F16
#define DT_BF16 WB_DT_BF16
#define MODE_MUL_DIV WB_MODE_MUL_DIV
#define MODE_DIV_MUL WB_MODE_DIV_MUL
/* Below this many elements, starting threads costs more than it saves. */
#define PARALLEL_MIN_ELEMENTS (1 << 17)

/* ---------- one contiguous run with one set of parameters ---------- */

typedef wb_qparam_t qparam_t;

static inline float quant_one(float x, qparam_t p, float lo, float hi, int mode, int dequant) {
    float q = mode == MODE_MUL_DIV ? rintf(x * p.a) : rintf(x / p.a);
    /* written so that a NaN q falls through both tests and stays NaN */
    q = q < lo ? lo : q;
    q = q > hi ? hi : q;
    if (!dequant) return q;
    return mode == MODE_MUL_DIV ? q / p.b : q * p.b;
}

static void run_portable(const void *xv, void *yv, int64_t n, int dtype, qparam_t p, float lo, float hi,
                         int mode, int dequant, int *negative) {
    int neg = 0;
    if (dtype == DT_F32) {
        const float *x = (const float *)xv;
        float *y = (float *)yv;
        for (int64_t i = 0; i < n; ++i) {
            neg |= x[i] < 0.0f;
            y[i] = quant_one(x[i], p, lo, hi, mode, dequant);
        }
    } else if (dtype == DT_F16) {
        const uint16_t *x = (const uint16_t *)xv;
        uint16_t *y = (uint16_t *)yv;
        for (int64_t i = 0; i < n; ++i) {
            float v = f16_to_f32(x[i]);
            neg |= v < 0.0f;
            y[i] = f32_to_f16(quant_one(v, p, lo, hi, mode, dequant));
        }
    } else {
        const uint16_t *x = (const uint16_t *)xv;
        uint16_t *y = (uint16_t *)yv;
        for (int64_t i = 0; i < n; ++i) {
            float v = bf16_to_f32(x[i]);
            neg |= v < 0.0f;
            y[i] = f32_to_bf16(quant_one(v, p, lo, hi, mode, dequant));
        }
    }
    if (neg) *negative = 1;
}

#if WB_HAVE_X86_AVX2
#define AVX2_TARGET WB_AVX2_TARGET

AVX2_TARGET static inline __m256 quant8(__m256 x, __m256 a, __m256 b, __m256 lo, __m256 hi, int mode, int dequant) {
    __m256 q = mode == MODE_MUL_DIV ? _mm256_mul_ps(x, a) : _mm256_div_ps(x, a);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* max/min return their second operand when either is NaN: NaN stays NaN */
    q = _mm256_max_ps(lo, q);
    q = _mm256_min_ps(hi, q);
    if (!dequant) return q;
    return mode == MODE_MUL_DIV ? _mm256_div_ps(q, b) : _mm256_mul_ps(q, b);
}

AVX2_TARGET static inline __m256 bf16x8_to_f32(__m128i v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

AVX2_TARGET static inline __m128i f32x8_to_bf16(__m256 f) {
    __m256i x = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
    __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, isnan), 16);
    /* pack 8 x u32 (each < 65536) into 8 x u16 */
    __m128i lo = _mm256_castsi256_si128(r);
    __m128i hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

AVX2_TARGET static void run_avx2(const void *xv, void *yv, int64_t n, int dtype, qparam_t p, float lo_s,
                                 float hi_s, int mode, int dequant, int *negative) {
    const __m256 a = _mm256_set1_ps(p.a), b = _mm256_set1_ps(p.b);
    const __m256 lo = _mm256_set1_ps(lo_s), hi = _mm256_set1_ps(hi_s), zero = _mm256_setzero_ps();
    __m256 negmask = _mm256_setzero_ps();
    int64_t i = 0;
    if (dtype == DT_F32) {
        const float *x = (const float *)xv;
        float *y = (float *)yv;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            negmask = _mm256_or_ps(negmask, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
            _mm256_storeu_ps(y + i, quant8(v, a, b, lo, hi, mode, dequant));
        }
    } else if (dtype == DT_F16) {
        const uint16_t *x = (const uint16_t *)xv;
        uint16_t *y = (uint16_t *)yv;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
            negmask = _mm256_or_ps(negmask, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
            __m256 r = quant8(v, a, b, lo, hi, mode, dequant);
            _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
        }
    } else {
        const uint16_t *x = (const uint16_t *)xv;
        uint16_t *y = (uint16_t *)yv;
        for (; i + 8 <= n; i += 8) {
            __m256 v = bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(x + i)));
            negmask = _mm256_or_ps(negmask, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
            __m256 r = quant8(v, a, b, lo, hi, mode, dequant);
            _mm_storeu_si128((__m128i *)(y + i), f32x8_to_bf16(r));
        }
    }
    if (i < n) {
        /* The last 1-7 values go through the same vector code via a zero-padded buffer: handing them to
         * run_portable (SSE code) after AVX code cost a state-transition stall of ~200 ns per row, which
         * dominated small per-channel weights (e.g. 64 rows of 3x3x3). Zeros are not negative. */
        float xs[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, ys[8];
        int64_t rest = n - i;
        for (int64_t k = 0; k < rest; ++k) {
            if (dtype == DT_F32) xs[k] = ((const float *)xv)[i + k];
            else if (dtype == DT_F16) xs[k] = f16_to_f32(((const uint16_t *)xv)[i + k]);
            else xs[k] = bf16_to_f32(((const uint16_t *)xv)[i + k]);
        }
        __m256 v = _mm256_loadu_ps(xs);
        negmask = _mm256_or_ps(negmask, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
        _mm256_storeu_ps(ys, quant8(v, a, b, lo, hi, mode, dequant));
        for (int64_t k = 0; k < rest; ++k) {
            if (dtype == DT_F32) ((float *)yv)[i + k] = ys[k];
            else if (dtype == DT_F16) ((uint16_t *)yv)[i + k] = f32_to_f16(ys[k]);
            else ((uint16_t *)yv)[i + k] = f32_to_bf16(ys[k]);
        }
    }
    if (_mm256_movemask_ps(negmask)) *negative = 1;
}

#endif

/* ---------- work splitting ---------- */

typedef struct {
    const char *x;
    char *y;
    size_t width;
    int dtype, mode, dequant, use_avx2;
    int64_t channels, inner;
    const qparam_t *params;
    float lo, hi;
    int negative[WB_MAX_THREADS];
} job_t;

static void run_range(void *ctx, int64_t begin, int64_t end, int worker) {
    job_t *job = (job_t *)ctx;
    int negative = 0;
    int64_t i = begin;
    while (i < end) {
        int64_t row = i / job->inner;
        int64_t row_end = (row + 1) * job->inner;
        int64_t stop = row_end < end ? row_end : end;
        qparam_t p = job->params[row % job->channels];
        const void *x = job->x + i * job->width;
        void *y = job->y + i * job->width;
#if WB_HAVE_X86_AVX2
        if (job->use_avx2)
            run_avx2(x, y, stop - i, job->dtype, p, job->lo, job->hi, job->mode, job->dequant, &negative);
        else
#endif
            run_portable(x, y, stop - i, job->dtype, p, job->lo, job->hi, job->mode, job->dequant, &negative);
        i = stop;
    }
    job->negative[worker] = negative;
}

float wb_quant_params(const float *amax, int64_t n, float max_bound, int mode, wb_qparam_t *out) {
    const float tiny = 1.0f / 16777216.0f; /* 2**-24, kernels.TINY_AMAX */
    float smallest = INFINITY;
    for (int64_t i = 0; i < n; ++i) {
        float value = amax[i];
        if (value < smallest) smallest = value;
        if (value <= tiny) {
            out[i].a = mode == MODE_MUL_DIV ? 0.0f : INFINITY;
            out[i].b = mode == MODE_MUL_DIV ? 1.0f : 0.0f;
        } else {
            /* one float32 division, as numpy and torch compute it */
            out[i].a = out[i].b = mode == MODE_MUL_DIV ? max_bound / value : value / max_bound;
        }
    }
    return smallest;
}

int wb_fake_quant(const void *x, void *y, int dtype, int64_t outer, int64_t channels, int64_t inner,
                  const wb_qparam_t *params, float lo, float hi, int mode, int dequant, int nthreads) {
    job_t job;
    memset(&job, 0, sizeof job);
    job.x = (const char *)x;
    job.y = (char *)y;
    job.width = dtype == DT_F32 ? 4 : 2;
    job.dtype = dtype;
    job.mode = mode;
    job.dequant = dequant;
    job.channels = channels;
    job.inner = inner;
    job.params = params;
    job.lo = lo;
    job.hi = hi;
#if WB_HAVE_X86_AVX2
    job.use_avx2 = wb_use_avx2();
#endif
    /* chunks are multiples of 64 elements so workers never share a cache line of output */
    wb_parallel_for(outer * channels * inner, nthreads, PARALLEL_MIN_ELEMENTS, 64, run_range, &job);
    int negative = 0;
    for (int t = 0; t < WB_MAX_THREADS; ++t) negative |= job.negative[t];
    return negative;
}


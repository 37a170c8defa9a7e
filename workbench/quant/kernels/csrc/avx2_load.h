/* Eight float32 / float16 / bfloat16 values as float32 bit patterns, for the AVX2 loops that read any of
 * the three (float16 through F16C; bfloat16 is its float32's upper half). */
#ifndef WB_AVX2_LOAD_H
#define WB_AVX2_LOAD_H

#include <stdint.h>

#include "kernels.h"

#if WB_HAVE_X86_AVX2
#include <immintrin.h>

WB_AVX2_TARGET static inline __m256i wb_load8_f32_bits(int dtype, const char *data, int64_t i) {
    if (dtype == WB_DT_F32) return _mm256_loadu_si256((const __m256i *)((const float *)data + i));
    __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)data + i));
    return dtype == WB_DT_F16 ? _mm256_castps_si256(_mm256_cvtph_ps(half))
                              : _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16);
}
#endif

#endif

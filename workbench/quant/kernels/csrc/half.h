/* float16 / bfloat16 <-> float32 conversions in plain C (round to nearest even, NaN kept). */
#ifndef WB_HALF_H
#define WB_HALF_H

#include <stdint.h>
#include <string.h>

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* below half of smallest subnormal */
        uint32_t man = (absx & 0x7fffffu) | 0x800000u;
        int shift = 113 - (int)(absx >> 23) + 13; /* 126 - exp + 14 - 1 ... */
        uint32_t half_man = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_man & 1u))) half_man++;
        return (uint16_t)(sign | half_man);
    }
    /* normal: rebias exponent, round mantissa to nearest even */
    uint32_t r = absx + 0xc8000fffu + ((absx >> 13) & 1u); /* -(112<<23) + 0xfff + lsb */
    return (uint16_t)(sign | (r >> 13));
}

static inline float bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Element k of `data` (the kernel's current pointer) as float, for each element type a kernel reads, and one
 * loop body run for the type of `dtype` (WB_DT_* of kernels.h): WB_EACH_DTYPE(dtype, LOOP) expands LOOP(LOAD)
 * three times, LOAD being one of these. */
#define WB_LOAD_F32(k) (((const float *)data)[k])
#define WB_LOAD_F16(k) f16_to_f32(((const uint16_t *)data)[k])
#define WB_LOAD_BF16(k) bf16_to_f32(((const uint16_t *)data)[k])
#define WB_EACH_DTYPE(dtype, LOOP)         \
    if ((dtype) == WB_DT_F32) {            \
        LOOP(WB_LOAD_F32)                  \
    } else if ((dtype) == WB_DT_F16) {     \
        LOOP(WB_LOAD_F16)                  \
    } else {                               \
        LOOP(WB_LOAD_BF16)                 \
    }

#endif

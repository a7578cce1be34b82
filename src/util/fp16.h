/* fp16 / bf16 <-> f32 conversions, scalar and exact (IEEE round-to-nearest-even).
 * These are the reference conversions; SIMD code may use F16C but must agree
 * bit for bit (F16C's vcvtps2ph with rounding mode 0 is RNE, so it does). */
#ifndef STRATA_FP16_H
#define STRATA_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fp32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while ((man & 0x400) == 0);
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return fp32_from_bits(u);
}

static inline uint16_t fp32_to_fp16(float f)
{
    uint32_t x = fp32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) ... result = m >> (shift) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t base = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (base & 1))) base++;
    return (uint16_t)(sign | base);
}

static inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits((uint32_t)h << 16); }

/* As ggml: round to nearest even; NaN is quieted (not flushed). */
static inline uint16_t fp32_to_bf16(float f)
{
    uint32_t u = fp32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif

/* quant_ref: the scalar reference for every block format strata supports.
 *
 * What it owns: dequantize, quantize and dot kernels written in plain C,
 * one function per (operation, type), with llama.cpp's exact arithmetic:
 *   - dequant_*  == ggml's dequantize_row_* (bit-exact; same float ops in the
 *                   same order);
 *   - quant_*    == ggml's quantize_row_*_ref (the algorithms llama-quantize
 *                   uses without an importance matrix: make_qx_quants,
 *                   make_q3_quants, make_qkx2_quants; bit-exact, including
 *                   the truncating casts and the 1.5*2^23 rounding trick);
 *   - act_quant_q8_0 / q8_1 == ggml-cpu's SIMD quantize_row_q8_0 / q8_1, the
 *                   activation quantizers llama.cpp actually runs;
 *   - dot_*      == ggml's *_generic vec_dot (same integer sums, same float
 *                   scale arithmetic, same 8-lane partial sums for K-quants).
 * The AVX2 kernels (quant_avx2.c) are checked against these in tests.
 *
 * What it does not do: choose kernels (quant.c), validate shapes (callers
 * pass whole blocks), allocate, or touch global state. Everything here is
 * reentrant. This file must build as baseline x86-64: no FMA contraction can
 * happen, so float results do not depend on the compiler.
 *
 * Notation in the diagrams: one row per field in byte order; bNN = byte NN of
 * the block; q[i] = quant of element i of the block; f16 = IEEE half. */
#include "quant/quant_impl.h"

#include <float.h>
#include <math.h>
#include "util/fp16.h"

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
/* Branch-free half -> float (ggml's generic conversion): exact for every
 * non-NaN half, like fp16_to_fp32, but without the subnormal loop, which
 * matters in the F16 dot. NaNs come out quieted. */
static inline float h2f(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = fp32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = fp32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t r = two_w < (1u << 27) ? fp32_bits(denormalized) : fp32_bits(normalized);
    return fp32_from_bits(sign | r);
}
static inline uint16_t f2h(float f) { return fp32_to_fp16(f); }

/* ==== F32 / F16 / BF16 ==== */

void quant_ref_dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
void quant_ref_quant_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

void quant_ref_dequant_f16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = h2f(h[i]);
}

void quant_ref_quant_f16(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = fp32_to_fp16(src[i]);
}

void quant_ref_dequant_bf16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(h[i]);
}

void quant_ref_quant_bf16(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = fp32_to_bf16(src[i]);
}

/* ggml_vec_dot_f32 without SIMD: float products summed in double. */
float quant_ref_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}

/* ggml_vec_dot_f16 without SIMD. The float product of two halves is exact. */
float quant_ref_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(h2f(x[i]) * h2f(y[i]));
    return (float)s;
}

float quant_ref_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
    return (float)s;
}

/* ==== Q4_0: 32 weights, 18 bytes ====
 *   b0..b1    f16 d
 *   b2..b17   qs[j] = q[j] | q[j+16] << 4        (j = 0..15)
 *   x[j] = d * (q[j] - 8),  q in 0..15
 * quantize: d = max / -8 where max is the signed value of largest |x|,
 * q = min(15, trunc(x/d + 8.5)). */

void quant_ref_quant_q4_0(const float *x, void *vy, int64_t n)
{
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK4_0 / 2] * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 8.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void quant_ref_dequant_q4_0(const void *vx, float *y, int64_t n)
{
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

float quant_ref_dot_q4_0(int64_t n, const void *vw, const void *va)
{
    const block_q4_0 *x = vw;
    const block_q8_0 *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int s0 = 0, s1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            s0 += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            s1 += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK8_0 / 2];
        }
        sumf += (s0 + s1) * h2f(x[i].d) * h2f(y[i].d);
    }
    return sumf;
}

/* ==== Q4_1: 32 weights, 20 bytes ====
 *   b0..b1    f16 d
 *   b2..b3    f16 m
 *   b4..b19   qs[j] = q[j] | q[j+16] << 4
 *   x[j] = d * q[j] + m,  q in 0..15
 * quantize: m = min, d = (max - min) / 15, q = min(15, trunc((x - m)/d + 0.5)). */

void quant_ref_quant_q4_1(const float *x, void *vy, int64_t n)
{
    block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK4_1 / 2] - min) * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 0.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void quant_ref_dequant_q4_1(const void *vx, float *y, int64_t n)
{
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

float quant_ref_dot_q4_1(int64_t n, const void *vw, const void *va)
{
    const block_q4_1 *x = vw;
    const block_q8_1 *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        int s0 = 0, s1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            s0 += (x[i].qs[j] & 0x0F) * y[i].qs[j];
            s1 += (x[i].qs[j] >> 4) * y[i].qs[j + QK8_1 / 2];
        }
        sumf += (h2f(x[i].d) * h2f(y[i].d)) * (s0 + s1) + h2f(x[i].m) * h2f(y[i].s);
    }
    return sumf;
}

/* ==== Q5_0: 32 weights, 22 bytes ====
 *   b0..b1    f16 d
 *   b2..b5    u32 qh: bit j = bit 4 of q[j]            (j = 0..31)
 *   b6..b21   qs[j] = (q[j] & 15) | (q[j+16] & 15) << 4
 *   x[j] = d * (q[j] - 16),  q in 0..31
 * quantize: d = max / -16, q = min(31, trunc(x/d + 16.5)). */

void quant_ref_quant_q5_0(const float *x, void *vy, int64_t n)
{
    block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK5_0 / 2] * id;
            const uint8_t q0 = (uint8_t)imin(31, (int8_t)(x0 + 16.5f));
            const uint8_t q1 = (uint8_t)imin(31, (int8_t)(x1 + 16.5f));
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

void quant_ref_dequant_q5_0(const void *vx, float *y, int64_t n)
{
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const float d = h2f(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + QK5_0 / 2] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

float quant_ref_dot_q5_0(int64_t n, const void *vw, const void *va)
{
    const block_q5_0 *x = vw;
    const block_q8_0 *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10;
            const int h1 = (qh >> (j + 12)) & 0x10;
            s0 += (((x[i].qs[j] & 0x0F) | h0) - 16) * y[i].qs[j];
            s1 += (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + QK8_0 / 2];
        }
        sumf += (h2f(x[i].d) * h2f(y[i].d)) * (s0 + s1);
    }
    return sumf;
}

/* ==== Q5_1: 32 weights, 24 bytes ====
 *   b0..b1    f16 d
 *   b2..b3    f16 m
 *   b4..b7    u32 qh: bit j = bit 4 of q[j]
 *   b8..b23   qs[j] = (q[j] & 15) | (q[j+16] & 15) << 4
 *   x[j] = d * q[j] + m,  q in 0..31
 * quantize: m = min, d = (max - min) / 31, q = trunc((x - m)/d + 0.5). */

void quant_ref_quant_q5_1(const float *x, void *vy, int64_t n)
{
    block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK5_1 / 2] - min) * id;
            const uint8_t q0 = (uint8_t)(x0 + 0.5f);
            const uint8_t q1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

void quant_ref_dequant_q5_1(const void *vx, float *y, int64_t n)
{
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + QK5_1 / 2] = ((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

float quant_ref_dot_q5_1(int64_t n, const void *vw, const void *va)
{
    const block_q5_1 *x = vw;
    const block_q8_1 *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10;
            const int h1 = (qh >> (j + 12)) & 0x10;
            s0 += ((x[i].qs[j] & 0x0F) | h0) * y[i].qs[j];
            s1 += ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + QK8_1 / 2];
        }
        sumf += (h2f(x[i].d) * h2f(y[i].d)) * (s0 + s1) + h2f(x[i].m) * h2f(y[i].s);
    }
    return sumf;
}

/* ==== Q8_0: 32 weights, 34 bytes ====
 *   b0..b1    f16 d
 *   b2..b33   i8 q[0..31]
 *   x[j] = d * q[j]
 * quantize: d = amax / 127 (stored as f16), q = roundf(x * (1/d)) where 1/d is
 * taken from the float d before it is rounded to f16 (as ggml does). roundf
 * rounds halves away from zero. When 1/d overflows (amax < 127/FLT_MAX)
 * x * id is +-inf or NaN and ggml's (int8_t)roundf() is undefined; x86 builds
 * convert through cvttss2si (INT32_MIN) and keep the low byte: 0. ref_i8
 * spells that out. */

static inline int8_t ref_i8(float v)
{
    const float r = roundf(v);
    return isfinite(r) ? (int8_t)r : 0;
}

void quant_ref_quant_q8_0(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = ref_i8(x[j] * id);
    }
}

void quant_ref_dequant_q8_0(const void *vx, float *y, int64_t n)
{
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

float quant_ref_dot_q8_0(int64_t n, const void *vw, const void *va)
{
    const block_q8_0 *x = vw, *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int s = 0;
        for (int j = 0; j < QK8_0; j++) s += x[i].qs[j] * y[i].qs[j];
        sumf += s * (h2f(x[i].d) * h2f(y[i].d));
    }
    return sumf;
}

/* ==== Q8_1: 32 weights, 36 bytes (activations for Q4_1 / Q5_1) ====
 *   b0..b1    f16 d
 *   b2..b3    f16 s = d * sum(q)      (lets Q4_1/Q5_1 add m * sum(a) cheaply)
 *   b4..b35   i8 q[0..31]
 *   x[j] = d * q[j]; quantized like Q8_0. */

void quant_ref_quant_q8_1(const float *x, void *vy, int64_t n)
{
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        int sum = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            y[i].qs[j] = ref_i8(x[j] * id);
            y[i].qs[j + QK8_1 / 2] = ref_i8(x[j + QK8_1 / 2] * id);
            sum += y[i].qs[j] + y[i].qs[j + QK8_1 / 2];
        }
        y[i].s = f2h(sum * d);
    }
}

void quant_ref_dequant_q8_1(const void *vx, float *y, int64_t n)
{
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < n / QK8_1; i++, y += QK8_1) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = x[i].qs[j] * d;
    }
}

/* Q8_1 . Q8_1 (no ggml counterpart; Q8_1 is an activation format). */
float quant_ref_dot_q8_1(int64_t n, const void *vw, const void *va)
{
    const block_q8_1 *x = vw, *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        int s = 0;
        for (int j = 0; j < QK8_1; j++) s += x[i].qs[j] * y[i].qs[j];
        sumf += s * (h2f(x[i].d) * h2f(y[i].d));
    }
    return sumf;
}

/* ==== Activation quantizers Q8_0 / Q8_1 (ggml-cpu from_float) ====
 * What llama.cpp's CPU backend applies to activations (ggml-cpu
 * arch/x86/quants.c quantize_row_q8_0 / q8_1 in AVX/AVX2/AVX-512 builds):
 * the block layout and d are as above, but
 *   q = round-half-even(x * id),  id = amax != 0 ? 127 / amax : 0
 * (a vector multiply by 127/amax, then _mm256_round_ps to nearest). That
 * multiplier is not always the float 1 / (amax / 127) of the reference, and
 * ties go to even, so a few blocks in 10^4 differ from quant_ref_quant_q8_0.
 * quant_nearest_int is exactly round-half-even here (|x * id| <= 127.0001).
 * One corner is kept bit-exact too: when 127 / amax overflows (amax <
 * 127 / FLT_MAX, a block of tiny values) x * id is +-inf or NaN, which the
 * SIMD conversion turns into INT32_MIN and the packs into -128 (d is 0
 * then, so the block still contributes 0). Finite input only. */

static inline int32_t act_cvt(float v)   /* _mm256_round_ps + _mm256_cvtps_epi32 */
{
    return isfinite(v) ? quant_nearest_int(v) : INT32_MIN;
}

static inline int8_t sat_i8(int32_t v)   /* the saturating packs */
{
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
}

void quant_ref_act_quant_q8_0(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = f2h(amax / 127.f);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = sat_i8(act_cvt(x[j] * id));
    }
}

void quant_ref_act_quant_q8_1(const float *x, void *vy, int64_t n)
{
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = f2h(d);
        uint32_t sum = 0;   /* ggml sums the int32 conversions, wrapping */
        for (int j = 0; j < QK8_1; j++) {
            const int32_t q = act_cvt(x[j] * id);
            y[i].qs[j] = sat_i8(q);
            sum += (uint32_t)q;
        }
        y[i].s = f2h(d * (float)(int32_t)sum);
    }
}

/* ==== K-quant helpers (ggml-quants.c) ==== */

/* Symmetric quants in [-nmax, nmax-1] for n values, minimising the
 * x^2-weighted squared error over 19 candidate scales. L gets q + nmax.
 * Returns the scale (negative when the largest |x| is positive). This is
 * make_qx_quants with rmse_type 1 and no importance weights. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = quant_nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = quant_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric quants in [-nmax, nmax-1] refined by coordinate descent on the
 * x^2-weighted error (make_q3_quants with do_rmse). L gets q + nmax. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = quant_nearest_int(x[i] * sl2 / slx);
                new_l = imax(-nmax, imin(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quants in [0, nmax] with scale and min (x ~ scale * L - min),
 * minimising the weighted (squared or absolute) error over nstep+1 candidate
 * scales (make_qkx2_quants). *the_min gets the (non-negative) min. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights,
                              uint8_t *L, float *the_min, uint8_t *Laux,
                              float rmin, float rdelta, int nstep, int use_mad)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = quant_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = quant_nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ==== Q2_K: 256 weights, 84 bytes ====
 *   b0..b15    scales[s] = sc[s] | mn[s] << 4   (s = sub-block of 16, 4 bits each)
 *   b16..b79   qs: 2-bit quants, for half h (0,1) and l (0..31):
 *                qs[32h + l] = q[128h+l] | q[128h+32+l] << 2 | q[128h+64+l] << 4 | q[128h+96+l] << 6
 *   b80..b81   f16 d      (scale of the sub-block scales)
 *   b82..b83   f16 dmin   (scale of the sub-block mins)
 *   x[i] = d * sc[i/16] * q[i] - dmin * mn[i/16],  q in 0..3 */

void quant_ref_quant_q2_K(const float *x, void *vy, int64_t n)
{
    block_q2_K *y = vy;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)quant_nearest_int(iscale * scales[j]);
            y[i].d = f2h(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
            y[i].d = f2h(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(quant_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f2h(max_min / q4scale);
        } else {
            y[i].dmin = f2h(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = h2f(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = h2f(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = quant_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
    }
}

void quant_ref_dequant_q2_K(const void *vx, float *y, int64_t n)
{
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int h = 0; h < QK_K; h += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l] >> shift) & 3) - ml;
                sc = x[i].scales[is++];
                dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 16; l < 32; l++) *y++ = dl * ((q[l] >> shift) & 3) - ml;
            }
        }
    }
}

float quant_ref_dot_q2_K(int64_t n, const void *vw, const void *va)
{
    const block_q2_K *x = vw;
    const block_q8_K *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q2 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const uint8_t *sc = x[i].scales;
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += y[i].bsums[j] * (sc[j] >> 4);
        const float dall = y[i].d * h2f(x[i].d);
        const float dmin = y[i].d * h2f(x[i].dmin);
        int isum = 0, is = 0;
        for (int k = 0; k < QK_K / 128; k++, q2 += 32) {
            for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
                int d = sc[is++] & 0xF, isuml = 0;
                for (int l = 0; l < 16; l++) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
                d = sc[is++] & 0xF;
                isuml = 0;
                for (int l = 16; l < 32; l++) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
            }
        }
        sumf += dall * isum - dmin * summs;
    }
    return sumf;
}

/* ==== Q3_K: 256 weights, 110 bytes ====
 *   b0..b31    hmask: bit b of hmask[l] = bit 2 of q[32b + l]   (l = 0..31, b = 0..7)
 *   b32..b95   qs: low 2 bits, packed like Q2_K's qs
 *   b96..b107  scales: 16 6-bit values sc[s] (+32 bias):
 *                low 4 bits:  s < 8: scales[s] & 15;   s >= 8: scales[s-8] >> 4
 *                high 2 bits: (scales[8 + s%4] >> 2*(s/4)) & 3
 *   b108..b109 f16 d
 *   x[i] = d * (sc[i/16] - 32) * (q[i] - 4),  q in 0..7 (the stored high bit
 *   is SET for q >= 4, i.e. a clear hmask bit subtracts 4) */

void quant_ref_quant_q3_K(const float *x, void *vy, int64_t n)
{
    block_q3_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int8_t l = (int8_t)quant_nearest_int(iscale * scales[j]);
                l = (int8_t)(imax(-32, imin(31, l)) + 32);
                if (j < 8) y[i].scales[j] = l & 0xF;
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = f2h(1 / iscale);
        } else {
            y[i].d = f2h(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int8_t sc = (int8_t)(j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4);
            sc = (int8_t)((sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
            const float d = h2f(y[i].d) * sc;
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = quant_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
            }
        }
        memset(y[i].hmask, 0, QK_K / 8);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == QK_K / 8) { m = 0; hm <<= 1; }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
    }
}

void quant_ref_dequant_q3_K(const void *vx, float *y, int64_t n)
{
    const block_q3_K *x = vx;
    int8_t scales[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d_all = h2f(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        quant_q3k_scales(x[i].scales, scales);
        int is = 0;
        for (int h = 0; h < QK_K; h += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                float dl = d_all * (scales[is++] - 32);
                for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * (scales[is++] - 32);
                for (int l = 16; l < 32; l++) *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
        }
    }
}

/* The K-quant generic dots keep 8 int32 partial sums, lane = element % 8,
 * and 8 float partial sums across blocks; the order of float operations
 * below is exactly ggml's. */
float quant_ref_dot_q3_K(int64_t n, const void *vw, const void *va)
{
    const block_q3_K *x = vw;
    const block_q8_K *y = va;
    int8_t scales[16], aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask;
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int h = 0; h < QK_K; h += 128, q3 += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1, a += 32)
                for (int l = 0; l < 32; l++) a[l] = (int8_t)(((q3[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        quant_q3k_scales(x[i].scales, scales);
        int32_t aux32[8] = {0};
        const int8_t *q8 = y[i].qs;
        a = aux8;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int half = 0; half < 2; half++, q8 += 8, a += 8) {
                for (int l = 0; l < 8; l++) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; l++) aux32[l] += (scales[j] - 32) * aux16[l];
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * aux32[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

/* ==== Q4_K: 256 weights, 144 bytes ====
 *   b0..b1     f16 d      (scale of the sub-block scales)
 *   b2..b3     f16 dmin   (scale of the sub-block mins)
 *   b4..b15    scales: 8 (sc, mn) pairs of 6 bits (quant_scale_min_k4):
 *                byte  0..3 : sc[0..3] (bits 0-5) | sc[4..7] bits 4-5 (bits 6-7)
 *                byte  4..7 : mn[0..3] (bits 0-5) | mn[4..7] bits 4-5 (bits 6-7)
 *                byte  8..11: sc[4..7] bits 0-3 (low nibble) | mn[4..7] bits 0-3 (high nibble)
 *   b16..b143  qs: for group g = 0..3 (64 weights) and l = 0..31:
 *                qs[32g + l] = q[64g + l] | q[64g + 32 + l] << 4
 *   x[i] = d * sc[i/32] * q[i] - dmin * mn[i/32],  q in 0..15 */

static void pack_scale_min_k4(uint8_t *s, int j, uint8_t ls, uint8_t lm)
{
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): sub-block scales and mins of
 * one super-block, quantized to 6 bits; then the final quants, re-derived
 * from the rounded scales. */
static void quant_k4_block(const float *x, uint8_t *s12, uint16_t *dh, uint16_t *dminh,
                           uint8_t *L, int nmax, float rmin, float rdelta, int nstep)
{
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, rdelta, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)quant_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)quant_nearest_int(inv_min * mins[j]);
        ls = (uint8_t)imin(63, ls);
        lm = (uint8_t)imin(63, lm);
        pack_scale_min_k4(s12, j, ls, lm);
    }
    *dh = f2h(max_scale / 63.f);
    *dminh = f2h(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        quant_scale_min_k4(j, s12, &sc, &m);
        const float d = h2f(*dh) * sc;
        if (!d) continue;
        const float dm = h2f(*dminh) * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = quant_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

void quant_ref_quant_q4_K(const float *x, void *vy, int64_t n)
{
    block_q4_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        memset(y[i].scales, 0, 12);
        quant_k4_block(x, y[i].scales, &y[i].d, &y[i].dmin, L, 15, -1.f, 0.1f, 20);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

void quant_ref_dequant_q4_K(const void *vx, float *y, int64_t n)
{
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, q += 32, is += 2) {
            uint8_t sc, m;
            quant_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            quant_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Unpack the 8 scales and 8 mins of a Q4_K/Q5_K block. */
static void k4_scales_mins(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 8; j++) quant_scale_min_k4(j, s12, &sc[j], &mn[j]);
}

/* The common tail of the Q4_K/Q5_K dots: aux8 holds the 256 quants. */
static void k4_dot_block(const int8_t *aux8, const block_q8_K *y, const uint8_t *s12,
                         uint16_t dh, uint16_t dminh, float sums[8], float *sumf)
{
    uint8_t sc[8], mn[8];
    k4_scales_mins(s12, sc, mn);
    int sumi = 0;
    for (int j = 0; j < QK_K / 16; j++) sumi += y->bsums[j] * mn[j / 2];
    int32_t aux32[8] = {0};
    int16_t aux16[8];
    const int8_t *q8 = y->qs, *a = aux8;
    for (int j = 0; j < QK_K / 32; j++) {
        const int32_t scale = sc[j];
        for (int k = 0; k < 4; k++, q8 += 8, a += 8) {
            for (int l = 0; l < 8; l++) aux16[l] = (int16_t)(q8[l] * a[l]);
            for (int l = 0; l < 8; l++) aux32[l] += scale * aux16[l];
        }
    }
    const float d = h2f(dh) * y->d;
    for (int l = 0; l < 8; l++) sums[l] += d * aux32[l];
    const float dmin = h2f(dminh) * y->d;
    *sumf -= dmin * sumi;
}

float quant_ref_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    const block_q4_K *x = vw;
    const block_q8_K *y = va;
    int8_t aux8[QK_K];
    float sums[8] = {0}, sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q4 = x[i].qs;
        int8_t *a = aux8;
        for (int j = 0; j < QK_K / 64; j++, q4 += 32) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] & 0xF);
            a += 32;
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] >> 4);
            a += 32;
        }
        k4_dot_block(aux8, &y[i], x[i].scales, x[i].d, x[i].dmin, sums, &sumf);
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

/* ==== Q5_K: 256 weights, 176 bytes ====
 *   b0..b3     f16 d, f16 dmin
 *   b4..b15    scales: as Q4_K
 *   b16..b47   qh: bit b of qh[l] = bit 4 of q[32b + l]       (l = 0..31, b = 0..7)
 *   b48..b175  qs: low 4 bits, packed as Q4_K's qs
 *   x[i] = d * sc[i/32] * q[i] - dmin * mn[i/32],  q in 0..31 */

void quant_ref_quant_q5_K(const float *x, void *vy, int64_t n)
{
    block_q5_K *y = vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        memset(y[i].scales, 0, 12);
        quant_k4_block(x, y[i].scales, &y[i].d, &y[i].dmin, L, 31, -0.5f, 0.1f, 15);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int g = 0; g < QK_K; g += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[g + j], l2 = L[g + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | l2 << 4);
            }
        }
    }
}

void quant_ref_dequant_q5_K(const void *vx, float *y, int64_t n)
{
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < QK_K; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            quant_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            quant_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

float quant_ref_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    const block_q5_K *x = vw;
    const block_q8_K *y = va;
    int8_t aux8[QK_K];
    float sums[8] = {0}, sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q4 = x[i].qs, *hm = x[i].qh;
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int j = 0; j < QK_K / 64; j++, q4 += 32) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] & 0xF) + (hm[l] & m ? 16 : 0));
            a += 32; m <<= 1;
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] >> 4) + (hm[l] & m ? 16 : 0));
            a += 32; m <<= 1;
        }
        k4_dot_block(aux8, &y[i], x[i].scales, x[i].d, x[i].dmin, sums, &sumf);
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

/* ==== Q6_K: 256 weights, 210 bytes ====
 *   b0..b127    ql: low 4 bits. For half h (0,1), l = 0..31:
 *                 ql[64h + l]      = q[128h + l] & 15      | (q[128h + 64 + l] & 15) << 4
 *                 ql[64h + 32 + l] = q[128h + 32 + l] & 15 | (q[128h + 96 + l] & 15) << 4
 *   b128..b191  qh: high 2 bits. qh[32h + l] = q[128h+l] >> 4 | (q[128h+32+l] >> 4) << 2
 *                                              | (q[128h+64+l] >> 4) << 4 | (q[128h+96+l] >> 4) << 6
 *   b192..b207  i8 scales[16]  (one per 16 weights)
 *   b208..b209  f16 d          (last!)
 *   x[i] = d * scales[i/16] * (q[i] - 32),  q in 0..63 */

void quant_ref_quant_q6_K(const float *x, void *vy, int64_t n)
{
    block_q6_K *y = vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scale; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            y[i].d = f2h(0.f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = f2h(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t)imin(127, quant_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = h2f(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = quant_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | q3 << 4);
                ql[l + 32] = (uint8_t)(q2 | q4 << 4);
                qh[l] = (uint8_t)((L[j + l] >> 4) | (L[j + l + 32] >> 4) << 2 |
                                  (L[j + l + 64] >> 4) << 4 | (L[j + l + 96] >> 4) << 6);
            }
        }
    }
}

void quant_ref_dequant_q6_K(const void *vx, float *y, int64_t n)
{
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int h = 0; h < QK_K; h += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

float quant_ref_dot_q6_K(int64_t n, const void *vw, const void *va)
{
    const block_q6_K *x = vw;
    const block_q8_K *y = va;
    int8_t aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        int8_t *a = aux8;
        for (int h = 0; h < QK_K; h += 128, a += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                a[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                a[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                a[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                a[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int32_t aux32[8] = {0};
        const int8_t *q8 = y[i].qs;
        a = aux8;
        for (int j = 0; j < QK_K / 16; j++) {
            const int scale = x[i].scales[j];
            for (int half = 0; half < 2; half++, q8 += 8, a += 8) {
                for (int l = 0; l < 8; l++) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; l++) aux32[l] += scale * aux16[l];
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * aux32[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}

/* ==== Q8_K: 256 values, 292 bytes (activations for the K-quants) ====
 *   b0..b3      f32 d        (a float, not a half)
 *   b4..b259    i8 q[0..255]
 *   b260..b291  i16 bsums[16]: bsums[g] = sum of q[16g .. 16g+15]
 *   x[i] = d * q[i]
 * quantize: d = max / -127 where max is the signed value of the first
 * largest |x|; q = min(127, nearest_int(x / d)) (ties to even). */

void quant_ref_quant_q8_K(const float *x, void *vy, int64_t n)
{
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            /* ggml leaves bsums untouched here; zero them so the block is
             * deterministic (they are multiplied by d == 0 anyway). */
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)imin(127, quant_nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void quant_ref_dequant_q8_K(const void *vx, float *y, int64_t n)
{
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

/* Q8_K . Q8_K: int8 x int8 per block (no ggml counterpart). */
float quant_ref_dot_q8_K(int64_t n, const void *vw, const void *va)
{
    const block_q8_K *x = vw, *y = va;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int s = 0;
        for (int j = 0; j < QK_K; j++) s += x[i].qs[j] * y[i].qs[j];
        sumf += (x[i].d * y[i].d) * s;
    }
    return sumf;
}

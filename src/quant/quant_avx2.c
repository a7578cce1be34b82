/* quant_avx2: AVX2 + FMA + F16C versions of the hot kernels. Compiled with
 * -mavx2 -mfma -mf16c (the Makefile's rule for *_avx2.c); quant.c hands
 * these out only when cpu_detect() reports all three features.
 *
 * What it owns: the int8 dot products of every weight format against its
 * activation format (maddubs-based, one pass per block, in the shape of
 * ggml's ggml-cpu/arch/x86/quants.c), the F32/F16/BF16 dots, the
 * quantizers Q8_0 (reference rounding) and Q8_K, ggml-cpu's activation
 * quantizers Q8_0 / Q8_1, and F16/BF16 row conversion.
 *
 * Contracts against the scalar reference (quant_ref.c), checked by tests:
 *   - quant_q8_0, quant_q8_K, act_quant_q8_0, act_quant_q8_1, quant_f16,
 *     quant_bf16, dequant_f16, dequant_bf16: bit-identical (same rounding:
 *     roundf's half-away-from-zero for quant_q8_0, ties-to-even for Q8_K and
 *     the act_quant pair, same scale arithmetic).
 *   - dots: the per-block integer sums are identical; only the order in
 *     which the float per-block terms are added differs (8 SIMD lanes
 *     instead of ggml's generic 8 partial sums / one running sum). Bound:
 *     |avx2 - scalar| <= (L + 16) * 2^-22 * sum_i |w_i * a_i|, L = float
 *     terms per lane (blocks, or n/32 for the float dots).
 * Against llama.cpp: every dot here follows ggml's x86 AVX2 kernel operation
 * for operation, including where GCC fuses ggml's scalar lines with -mfma
 * (noted in place); Q4_K and Q5_K keep ggml's float operations and rearrange
 * only the exact integer work (see their sections; AVX-VNNI used when
 * present). Checked on 2025 ggml (the libggml-cpu-haswell.so of
 * node-llama-cpp 3.22.1): all 13 dots returned the same bits on random rows.
 * Kernels do not allocate and keep no state. */
#include "quant/quant_impl.h"

#include <immintrin.h>

#include "quant/quant_avx2_common.h"
#include "util/fp16.h"

#if defined(__clang__)
/* Keep scalar expressions unfused so scale arithmetic matches quant_ref.c
 * (GCC in ISO C mode never contracts). */
#pragma STDC FP_CONTRACT OFF
#endif

/* ==== Helpers ==== */

/* sum of u8 x s8 products, 4 at a time, as 8 floats. */
static inline __m256 mul_sum_us8_pairs_float(__m256i ax, __m256i sy)
{
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}

/* s8 x s8 via |x| * sign(y, x). x (weights) may be -128: |x| = 128 is a valid
 * u8. y (activations) must not be -128, or sign(y, x) would overflow; the
 * Q8_0/Q8_1/Q8_K quantizers only produce -127..127. */
static inline __m256 mul_sum_i8_pairs_float(__m256i x, __m256i y)
{
    return mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Shuffle mask for Q6_K's scales (q3k's is in quant_avx2_common.h;
 * 128-bit: entry i gives bytes 2i x8, 2i+1 x8). */
static const uint8_t k_shuffle_q6k[128] = {
     0, 0, 0, 0, 0, 0, 0, 0,  1, 1, 1, 1, 1, 1, 1, 1,   2, 2, 2, 2, 2, 2, 2, 2,  3, 3, 3, 3, 3, 3, 3, 3,
     4, 4, 4, 4, 4, 4, 4, 4,  5, 5, 5, 5, 5, 5, 5, 5,   6, 6, 6, 6, 6, 6, 6, 6,  7, 7, 7, 7, 7, 7, 7, 7,
     8, 8, 8, 8, 8, 8, 8, 8,  9, 9, 9, 9, 9, 9, 9, 9,  10,10,10,10,10,10,10,10, 11,11,11,11,11,11,11,11,
    12,12,12,12,12,12,12,12, 13,13,13,13,13,13,13,13,  14,14,14,14,14,14,14,14, 15,15,15,15,15,15,15,15,
};
static inline __m128i shuffle_q6k(int i) { return _mm_loadu_si128((const __m128i *)k_shuffle_q6k + i); }

/* Q4_K/Q5_K: 12 scale bytes -> utmp[0..1] = 8 scales, utmp[2..3] = 8 mins.
 * ggml's scalar unpack, no longer called by a kernel here: kept as the
 * reference for the layout q4k_unpack (and quant_gemm_k_avx2.c) build in SIMD. */
__attribute__((unused)) static inline void k4_unpack(const uint8_t *s12, uint32_t utmp[4])
{
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, s12, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

/* ==== F16 / BF16 conversion ==== */

void quant_avx2_dequant_f16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8))));
    }
    for (; i < n; i++) dst[i] = fp16_to_fp32(h[i]);
}

void quant_avx2_dequant_bf16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) dst[i] = bf16_to_fp32(h[i]);
}

void quant_avx2_quant_f16(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = fp32_to_fp16(src[i]);
}

/* Round to nearest even on the top 16 bits; NaN keeps its top bits and is
 * quieted (| 64), as fp32_to_bf16. */
static inline __m256i bf16_round_8(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    return _mm256_blendv_epi8(r, q, nan);
}

void quant_avx2_quant_bf16(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i a = bf16_round_8(_mm256_loadu_ps(src + i));
        const __m256i b = bf16_round_8(_mm256_loadu_ps(src + i + 8));
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(h + i), p);
    }
    for (; i < n; i++) h[i] = fp32_to_bf16(src[i]);
}

/* ==== Activation quantizers ==== */

/* int32 x 4 (32 values in order) -> 32 int8 in order, saturating. */
static inline __m256i pack_i32x4_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    i0 = _mm256_packs_epi32(i0, i1);   /* 0-3 8-11 | 4-7 12-15 */
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);   /* 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31 */
    return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* roundf(): round half away from zero. trunc(v) and v - trunc(v) are exact,
 * so this equals the C library's roundf bit for bit. */
static inline __m256 roundf_8(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(ge, one));
}

/* _mm256_cvttps_epi32, but 0 where the value does not convert (+-inf, NaN:
 * INT32_MIN): what the scalar reference's int8 conversions give there (a
 * block so tiny that its inverse scale overflows; see quant_ref.c ref_i8). */
static inline __m256i cvtt_or_zero(__m256 v)
{
    const __m256i i = _mm256_cvttps_epi32(v);
    return _mm256_andnot_si256(_mm256_cmpeq_epi32(i, _mm256_set1_epi32(INT32_MIN)), i);
}

static inline float hmax_f32_8(__m256 m)
{
    __m128 r = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

void quant_avx2_quant_q8_0(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
        m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        const float amax = hmax_f32_8(m);
        /* Same scalar arithmetic as quant_ref_quant_q8_0. */
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        const __m256 mul = _mm256_set1_ps(id);
        v0 = roundf_8(_mm256_mul_ps(v0, mul));
        v1 = roundf_8(_mm256_mul_ps(v1, mul));
        v2 = roundf_8(_mm256_mul_ps(v2, mul));
        v3 = roundf_8(_mm256_mul_ps(v3, mul));
        const __m256i q = pack_i32x4_to_i8(cvtt_or_zero(v0), cvtt_or_zero(v1), cvtt_or_zero(v2), cvtt_or_zero(v3));
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
    }
}

/* ggml-cpu's activation quantizers (quant_ref.c act_quant_q8_0 / q8_1):
 * q = round-half-even(x * (127 / amax)), the arithmetic of ggml's x86
 * quantize_row_q8_0 / q8_1 operation for operation. 32 values -> 4 vectors
 * of int32 in *q (element order). Returns d. */
static inline float act_q8_block(const float *x, __m256i q[4])
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const float amax = hmax_f32_8(m);
    const __m256 mul = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], mul),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return amax / 127.f;
}

void quant_avx2_act_quant_q8_0(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256i q[4];
        y[i].d = fp32_to_fp16(act_q8_block(x, q));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x4_to_i8(q[0], q[1], q[2], q[3]));
    }
}

void quant_avx2_act_quant_q8_1(const float *x, void *vy, int64_t n)
{
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        __m256i q[4];
        const float d = act_q8_block(x, q);
        y[i].d = fp32_to_fp16(d);
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        y[i].s = fp32_to_fp16(d * (float)_mm_cvtsi128_si32(s4));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x4_to_i8(q[0], q[1], q[2], q[3]));
    }
}

void quant_avx2_quant_q8_K(const float *x, void *vy, int64_t n)
{
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i max127 = _mm256_set1_epi32(127);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) {
            m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
            m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 8)));
        }
        const float amax = hmax_f32_8(_mm256_max_ps(m0, m1));
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* The reference keeps the signed value of the FIRST element with
         * |x| == amax; find that index. */
        const __m256 va = _mm256_set1_ps(amax);
        float max = amax;
        for (int j = 0; j < QK_K; j += 8) {
            const int mask = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
            if (mask) { max = x[j + __builtin_ctz((unsigned)mask)]; break; }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        __m256i s[8];   /* per 32 values: 8 int32 sums of 4 quants */
        for (int g = 0; g < 8; g++) {
            __m256i q32[4];
            for (int k = 0; k < 4; k++) {
                /* nearest_int == round to nearest even for |v| <= 2^22. */
                const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * k), mul),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q32[k] = _mm256_min_epi32(cvtt_or_zero(v), max127);
            }
            const __m256i q = pack_i32x4_to_i8(q32[0], q32[1], q32[2], q32[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), q);
            s[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        }
        /* Two hadd rounds turn the sums of 4 into sums of 16: per 128-bit
         * half, lane k = group (4 * pair + k) low (half 0) / high (half 1)
         * 16 values; permute to bsums order and narrow to int16. */
        __m256i b[2];
        for (int h = 0; h < 2; h++) {
            const __m256i t01 = _mm256_hadd_epi32(s[4 * h + 0], s[4 * h + 1]);
            const __m256i t23 = _mm256_hadd_epi32(s[4 * h + 2], s[4 * h + 3]);
            b[h] = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(t01, t23),
                                               _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        }
        const __m256i bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(b[0], b[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)y[i].bsums, bs);
        y[i].d = 1 / iscale;
    }
}

/* ==== Float dots ====
 * Shaped like ggml's AVX2 ggml_vec_dot_f32/f16/bf16 so the results are the
 * same bits: four 8-lane accumulators over the largest multiple of 32, the
 * reduction (a0 + a2) + (a1 + a3), then the tail one element at a time. */

float quant_avx2_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    /* The tail, as GCC compiles ggml's `sumf += x[i]*y[i]` loop with -O3
     * -mfma: a float sum; products of whole groups of 4 are vectorized
     * (not fused), the last n % 4 are fused multiply-adds. In order. */
    float sum = reduce4_hadd(s0, s1, s2, s3);
    const int64_t nu = np + ((n - np) & ~(int64_t)3);
    int64_t i = np;
    for (; i < nu; i++) sum += x[i] * y[i];
    for (; i < n; i++) sum = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(x[i]), _mm_set_ss(y[i]), _mm_set_ss(sum)));
    return sum;
}

float quant_avx2_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
#define LD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32) {
        s0 = _mm256_fmadd_ps(LD(x + i), LD(y + i), s0);
        s1 = _mm256_fmadd_ps(LD(x + i + 8), LD(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(LD(x + i + 16), LD(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(LD(x + i + 24), LD(y + i + 24), s3);
    }
#undef LD
    double sum = reduce4_hadd(s0, s1, s2, s3);
    for (int64_t i = np; i < n; i++) sum += (double)(h2f(x[i]) * h2f(y[i]));
    return (float)sum;
}

float quant_avx2_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
#define LD(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    /* bf16 x bf16 products are exact in float, so FMA == mul + add here. */
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(LD(x + i), LD(y + i), s0);
        s1 = _mm256_fmadd_ps(LD(x + i + 8), LD(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(LD(x + i + 16), LD(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(LD(x + i + 24), LD(y + i + 24), s3);
    }
#undef LD
    double sum = hsum_f32_8(_mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3)));
    for (; i < n; i++) sum += (double)(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
    return (float)sum;
}

/* ==== 32-element block dots ==== */

float quant_avx2_dot_q4_0(int64_t n, const void *vw, const void *va)
{
    const block_q4_0 *x = vw;
    const block_q8_0 *y = va;
    const __m256i off = _mm256_set1_epi8(8);
    /* One accumulator, one block per step, as ggml: the result is then bit
     * for bit ggml's AVX2 result. (Two interleaved accumulators measured ~5%
     * faster here and ~15% for Q8_0, but change the bits; a speed pass may
     * decide that trade.) */
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i qx = _mm256_sub_epi8(bytes_from_nibbles_32(x[i].qs), off);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc);
    }
    return hsum_f32_8(acc);
}

float quant_avx2_dot_q4_1(int64_t n, const void *vw, const void *va)
{
    const block_q4_1 *x = vw;
    const block_q8_1 *y = va;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        summs += h2f(x[i].m) * h2f(y[i].s);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256i qx = bytes_from_nibbles_32(x[i].qs);
        const __m256 xy = mul_sum_us8_pairs_float(qx, _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(d, xy, acc);
    }
    return hsum_f32_8(acc) + summs;
}

float quant_avx2_dot_q5_0(int64_t n, const void *vw, const void *va)
{
    const block_q5_0 *x = vw;
    const block_q8_0 *y = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        /* q - 16 as a signed byte: the nibble, with 0xF0 or'd in where the
         * fifth bit is clear. */
        __m256i qx = bytes_from_nibbles_32(x[i].qs);
        const __m256i hi = _mm256_andnot_si256(bytes_from_bits_32(x[i].qh), _mm256_set1_epi8((char)0xF0));
        qx = _mm256_or_si256(qx, hi);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc);
    }
    return hsum_f32_8(acc);
}

float quant_avx2_dot_q5_1(int64_t n, const void *vw, const void *va)
{
    const block_q5_1 *x = vw;
    const block_q8_1 *y = va;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        summs += h2f(x[i].m) * h2f(y[i].s);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        __m256i qx = bytes_from_nibbles_32(x[i].qs);
        qx = _mm256_or_si256(qx, _mm256_and_si256(bytes_from_bits_32(x[i].qh), _mm256_set1_epi8(0x10)));
        acc = _mm256_fmadd_ps(d, mul_sum_us8_pairs_float(qx, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc);
    }
    return hsum_f32_8(acc) + summs;
}

float quant_avx2_dot_q8_0(int64_t n, const void *vw, const void *va)
{
    const block_q8_0 *x = vw, *y = va;
    __m256 acc = _mm256_setzero_ps();   /* one accumulator: bit for bit ggml's AVX2 */
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256 q = mul_sum_i8_pairs_float(_mm256_loadu_si256((const __m256i *)x[i].qs),
                                                _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    return hsum_f32_8(acc);
}

/* ==== K-quant dots (activations in Q8_K) ==== */

float quant_avx2_dot_q2_K(int64_t n, const void *vw, const void *va)
{
    const block_q2_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * h2f(x[i].d);
        const float dmin = -y[i].d * h2f(x[i].dmin);
        const uint8_t *q2 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        /* mins: dmin * sum_s mn[s] * bsums[s] */
        const __m128i ms = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m128i sc8 = _mm_and_si128(ms, m4);
        const __m128i mn8 = _mm_and_si128(_mm_srli_epi16(ms, 4), m4);
        const __m256i prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mn8), _mm256_loadu_si256((const __m256i *)y[i].bsums));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        const __m256i all = _mm256_cvtepi8_epi16(sc8);
        const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
        const __m256i scales[2] = { _mm256_setr_m128i(lo, lo), _mm256_setr_m128i(hi, hi) };
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; j++, q2 += 32, q8 += 128) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q2);
            const __m256i q0 = _mm256_and_si256(bits, m3);
            const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3);
            const __m256i q2v = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3);
            const __m256i q3 = _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3);
            __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)(q8 + 0)));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            __m256i p2 = _mm256_maddubs_epi16(q2v, _mm256_loadu_si256((const __m256i *)(q8 + 64)));
            __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(q8 + 96)));
            p0 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffle_q3k(0)), p0);
            p1 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffle_q3k(1)), p1);
            p2 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffle_q3k(2)), p2);
            p3 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffle_q3k(3)), p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32_8(acc);
}

float quant_avx2_dot_q3_K(int64_t n, const void *vw, const void *va)
{
    const block_q3_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m3 = _mm256_set1_epi8(3), mone = _mm256_set1_epi8(1);
    const __m128i m32 = _mm_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * h2f(x[i].d);
        const uint8_t *q3 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int8_t sc[16];
        quant_q3k_scales(x[i].scales, sc);
        const __m128i sc128 = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)sc), m32);
        const __m256i all = _mm256_cvtepi8_epi16(sc128);
        const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
        const __m256i scales[2] = { _mm256_setr_m128i(lo, lo), _mm256_setr_m128i(hi, hi) };
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        int bit = 0;
        for (int j = 0; j < QK_K / 128; j++, q3 += 32) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q3);
            __m256i p[4];
            for (int k = 0; k < 4; k++, bit++, q8 += 32) {
                /* low 2 bits times q8, minus 4 * q8 where the high bit is clear */
                const __m256i ql = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
                const __m256i qh = _mm256_slli_epi16(
                    _mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
                const __m256i y8 = _mm256_loadu_si256((const __m256i *)q8);
                const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, y8), _mm256_maddubs_epi16(qh, y8));
                p[k] = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffle_q3k(k)), p16);
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32_8(acc);
}

/* ==== Q4_K ====
 * Per super-block, what the dot computes (the float operations of ggml's
 * AVX2 kernel, which this one keeps, in block order, with the same operands):
 *   acc   = fmadd(set1(d), cvt(sumi), acc)        sumi lane k = sum over the
 *           8 sub-blocks s of sc_s * (q4 . q8 over bytes 4k..4k+3 of s)
 *   acc_m = fmadd(set1(dmin), cvt(prod), acc_m)    prod_t = m_2t * ps_2t +
 *           m_2t+1 * ps_2t+1, ps_k = bsums[2k] + bsums[2k+1]  (4 lanes)
 *   result hsum_f32_8(acc) + hsum_f32_4(acc_m).
 * The integer work (exact) is arranged for fewer instructions than ggml's:
 *   - scales and mins unpacked in SIMD from one 16-byte load (q4k_unpack),
 *     d and dmin converted and scaled together (q4k_dm);
 *   - the sub-block scales stored once and read back with vpbroadcastd (a
 *     load, not a shuffle per use);
 *   - acc_m is kept in the odd lanes of an 8-lane vector (lane 2t+1 is ggml's
 *     lane t; even lanes are never read), next to -dmin in q4k_dm's odd lanes:
 *     fmadd(dmin, p, acc) is fnmadd(-dmin, p, acc), the same rounding;
 *   - with AVX-VNNI (quant_avxvnni_dot_q4_K): madd + add fused into vpdpwssd (the
 *     same int32 sums, no saturation), and two super-blocks per iteration
 *     share one 256-bit scale unpack and one mins product (still one float
 *     FMA per block, in block order). */

/* 16-byte heads (d, dmin, scales[12]) of one block per 128-bit half ->
 * bytes 0..7: sc0..7, bytes 8..15: m0..7 (k4_unpack's utmp) per half. */
static inline __m256i q4k_unpack(__m256i head)
{
    const __m256i ia = _mm256_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15,
                                        4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i ib = _mm256_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11,
                                        -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11);
    const __m256i mlo = _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0,
                                         63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    const __m256i mnib = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    const __m256i a = _mm256_shuffle_epi8(head, ia), b = _mm256_shuffle_epi8(head, ib);
    const __m256i lo = _mm256_and_si256(a, mlo);
    const __m256i nib = _mm256_and_si256(_mm256_srli_epi16(a, 4), mnib);
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(b, 2), _mm256_set1_epi8(0x30));
    return _mm256_or_si256(_mm256_or_si256(lo, nib), top);
}

/* Q4_K and Q5_K blocks begin with the fp16 pair (d, dmin): dm points at it.
 * Lanes 2l: d = y.d * h(d); lanes 2l+1: y.d * h(dmin) = -dmin. */
static inline __m256 kq_dm(const void *dm, const block_q8_K *y)
{
    float dd;   /* the fp16 pair d, dmin, moved as 4 bytes (a vbroadcastss load) */
    memcpy(&dd, dm, 4);
    const __m128i h = _mm_castps_si128(_mm_set1_ps(dd));
    return _mm256_mul_ps(_mm256_set1_ps(y->d), _mm256_cvtph_ps(h));
}
#define q4k_dm(x, y) kq_dm(&(x)->d, (y))

/* One block's mins times the sub-block sums of the activations (from a
 * broadcast q4k_unpack): int32 lane 2t+1 holds m_t * (bsums[2t] + bsums[2t+1])
 * split over lanes 2t, 2t+1 (madd pairs). */
static inline __m256i kq_mins_madd(__m256i sm, const block_q8_K *y)
{
    const __m256i mdup = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1,   /* m_k x2 */
                                          12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
    return _mm256_madd_epi16(_mm256_shuffle_epi8(sm, mdup), _mm256_loadu_si256((const __m256i *)y->bsums));
}

/* One block's prod (from a broadcast q4k_unpack) as floats in lanes 2t+1. */
static inline __m256 q4k_mins1(__m256i sm, const block_q8_K *y)
{
    const __m256i p = kq_mins_madd(sm, y);
    return _mm256_cvtepi32_ps(_mm256_add_epi32(p, _mm256_slli_epi64(p, 32)));
}

/* sb[s] = sc_s | sc_s << 16 for one block (a broadcast q4k_unpack). */
static inline void q4k_scales1(__m256i sm, int32_t sb[8])
{
    const __m256i sc32 = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                          4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    _mm256_store_si256((__m256i *)(void *)sb, _mm256_shuffle_epi8(sm, sc32));
}

#if defined(__GNUC__)
#define Q4K_FORGET(b) __asm__("" : "+m"(b))   /* keep the scale reads loads */
#else
#define Q4K_FORGET(b) ((void)0)
#endif

/* The K-quant sums' int32 step s + madd(scale16, prods16): vpmaddwd +
 * vpaddd, or AVX-VNNI's vpdpwssd (the same int32 sums, no saturation; only
 * inside Q4K_TARGET_VNNI functions). */
#define KQ_ACC_MADD(s, a, b) _mm256_add_epi32(s, _mm256_madd_epi16(a, b))
#define KQ_ACC_VNNI(s, a, b) _mm256_dpwssd_avx_epi32(s, a, b)
#define KQ_ACC_EVEX(s, a, b) _mm256_dpwssd_epi32(s, a, b)   /* the same, EVEX-encoded (Q4K_TARGET_EVEX) */

/* sumi of one block; scales s = 0..3 at lo[s], 4..7 at hi[s - 4]. Two
 * accumulators (even and odd sub-blocks), added at the end: exact. ACC is
 * KQ_ACC_MADD or KQ_ACC_VNNI. */
#define Q4K_SUMI_BODY(ACC)                                                                                      \
    const __m256i m4 = _mm256_set1_epi8(0xF);                                                                   \
    __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();                                           \
    _Pragma("GCC unroll 4")                                                                                     \
    for (int j = 0; j < QK_K / 64; j++, q4 += 32, q8 += 64) {                                                   \
        const int32_t *sc = j < 2 ? lo + 2 * j : hi + 2 * j - 4;                                                \
        const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);                                           \
        const __m256i q4l = _mm256_and_si256(bits, m4);                                                        \
        const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);                                  \
        const __m256i pl = _mm256_maddubs_epi16(q4l, _mm256_loadu_si256((const __m256i *)q8));                  \
        const __m256i ph = _mm256_maddubs_epi16(q4h, _mm256_loadu_si256((const __m256i *)(q8 + 32)));           \
        sl = ACC(sl, _mm256_set1_epi32(sc[0]), pl);                                                             \
        sh = ACC(sh, _mm256_set1_epi32(sc[1]), ph);                                                             \
    }                                                                                                           \
    return _mm256_add_epi32(sl, sh)

static inline __m256i q4k_sumi_avx2(const uint8_t *q4, const int8_t *q8, const int32_t *lo, const int32_t *hi)
{
    Q4K_SUMI_BODY(KQ_ACC_MADD);
}

/* One super-block: acc and acc_m updated with block xb, yb. */
#define Q4K_BLOCK1(SUMI, xb, yb)                                                                                 \
    do {                                                                                                         \
        const __m256 dm_ = q4k_dm(xb, yb);                                                                       \
        const __m256i sm_ = q4k_unpack(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xb)))); \
        q4k_scales1(sm_, sb);                                                                                    \
        Q4K_FORGET(sb);                                                                                          \
        acc_m = _mm256_fnmadd_ps(dm_, q4k_mins1(sm_, yb), acc_m);                                                \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm_), _mm256_cvtepi32_ps(SUMI((xb)->qs, (yb)->qs, sb, sb + 4)), acc); \
    } while (0)

/* hsum_f32_8(acc) + hsum_f32_4(ggml's acc_m = odd lanes of acc_m). */
static inline float q4k_result(__m256 acc, __m256 acc_m)
{
    const __m128 lo = _mm256_castps256_ps128(acc_m), hi = _mm256_extractf128_ps(acc_m, 1);
    return hsum_f32_8(acc) + hsum_f32_4(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

float quant_avx2_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    const block_q4_K *x = vw;
    const block_q8_K *y = va;
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    _Alignas(32) int32_t sb[8];
    for (int64_t i = 0; i < n / QK_K; i++) Q4K_BLOCK1(q4k_sumi_avx2, x + i, y + i);
    return q4k_result(acc, acc_m);
}

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 11))
#define Q4K_HAVE_AVXVNNI 1
#define Q4K_TARGET_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define Q4K_TARGET_EVEX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* q4k_sumi_avx2 with madd + add as one vpdpwssd. */
Q4K_TARGET_VNNI static inline __m256i q4k_sumi_vnni(const uint8_t *q4, const int8_t *q8, const int32_t *lo,
                                                    const int32_t *hi)
{
    Q4K_SUMI_BODY(KQ_ACC_VNNI);
}

/* The shuffles of the two-super-block K-quant dots (Q4K_DOT2_BODY,
 * Q5K_DOT_BODY): sclo / schi spread the scale bytes 0-3 / 4-7 of an
 * unpacked head to 16-bit pairs (both 128-bit halves: one block each),
 * mins16 the 8 mins to 16-bit lanes. */
#define KQ2_SHUFFLES                                                                                            \
    const __m256i sclo = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,              \
                                          0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1);             \
    const __m256i schi = _mm256_setr_epi8(4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1,              \
                                          4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);             \
    const __m256i mins16 = _mm256_setr_epi8(0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1,            \
                                            0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1)

/* The heads of super-blocks x0 and x1 (y0, y1 their activation blocks) in
 * the two 128-bit halves of one q4k_unpack: their scales stored to sa
 * (sub-blocks 0..3) and sb (4..7), x0 in dwords 0..3 and x1 in 4..7; m =
 * [m(x0) 0..3, m(x1) 0..3 | m(x0) 4..7, m(x1) 4..7] as 16-bit lanes and
 * q8s the pair sums of both blocks' bsums (hadd), for one madd of the
 * mins. Needs KQ2_SHUFFLES and int32 sa[8], sb[8] (32-byte aligned). */
#define KQ2_HEADS(x0, x1, y0, y1)                                                                               \
    const __m256i sm = q4k_unpack(_mm256_inserti128_si256(                                                      \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(x0))),                          \
        _mm_loadu_si128((const __m128i *)(const void *)(x1)), 1));                                             \
    _mm256_store_si256((__m256i *)(void *)sa, _mm256_shuffle_epi8(sm, sclo));                                   \
    _mm256_store_si256((__m256i *)(void *)sb, _mm256_shuffle_epi8(sm, schi));                                   \
    Q4K_FORGET(sa);                                                                                             \
    Q4K_FORGET(sb);                                                                                             \
    const __m256i m = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sm, _mm256_setr_epi32(2, 6, 2, 6, 3, 7, 3, 7)), \
                                          mins16);                                                              \
    const __m256i q8s = _mm256_hadd_epi16(_mm256_loadu_si256((const __m256i *)(y0)->bsums),                    \
                                          _mm256_loadu_si256((const __m256i *)(y1)->bsums))

/* Two super-blocks per iteration, their heads from KQ2_HEADS; the mins'
 * prods from one madd of m with q8s give [i t0 t1, i+1 t0 t1 | i t2 t3,
 * i+1 t2 t3], each moved to lanes 2t+1. */
#define Q4K_DOT2_BODY(SUMI)                                                                                          \
    const block_q4_K *x = vw;                                                                                        \
    const block_q8_K *y = va;                                                                                        \
    const int64_t nb = n / QK_K;                                                                                     \
    KQ2_SHUFFLES;                                                                                                    \
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();                                                   \
    _Alignas(32) int32_t sa[8], sb[8];                                                                               \
    int64_t i = 0;                                                                                                   \
    for (; i + 1 < nb; i += 2) {                                                                                     \
        const block_q4_K *x0 = x + i, *x1 = x + i + 1;                                                               \
        const block_q8_K *y0 = y + i, *y1 = y + i + 1;                                                               \
        const __m256 dm0 = q4k_dm(x0, y0), dm1 = q4k_dm(x1, y1);                                                     \
        KQ2_HEADS(x0, x1, y0, y1);                                                                                   \
        const __m256 prod = _mm256_cvtepi32_ps(_mm256_madd_epi16(m, q8s));                                           \
        const __m256i s0 = SUMI(x0->qs, y0->qs, sa, sb), s1 = SUMI(x1->qs, y1->qs, sa + 4, sb + 4);                  \
        acc_m = _mm256_fnmadd_ps(dm0, _mm256_permute_ps(prod, _MM_SHUFFLE(1, 1, 0, 0)), acc_m);                      \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm0), _mm256_cvtepi32_ps(s0), acc);                                 \
        acc_m = _mm256_fnmadd_ps(dm1, _mm256_permute_ps(prod, _MM_SHUFFLE(3, 3, 2, 2)), acc_m);                      \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm1), _mm256_cvtepi32_ps(s1), acc);                                 \
    }                                                                                                                \
    if (i < nb) Q4K_BLOCK1(SUMI, x + i, y + i);                                                                      \
    return q4k_result(acc, acc_m)

Q4K_TARGET_VNNI float quant_avxvnni_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    Q4K_DOT2_BODY(q4k_sumi_vnni);
}

/* The same in the AVX512-VNNI encoding (CPU_ISA_AVX512: also the CPUs with
 * AVX-512 but no AVX-VNNI). */
Q4K_TARGET_EVEX static inline __m256i q4k_sumi_evex(const uint8_t *q4, const int8_t *q8, const int32_t *lo,
                                                    const int32_t *hi)
{
    Q4K_SUMI_BODY(KQ_ACC_EVEX);
}

Q4K_TARGET_EVEX float quant_avx512_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    Q4K_DOT2_BODY(q4k_sumi_evex);
}

#endif

#ifndef Q4K_HAVE_AVXVNNI
/* A compiler without -mavxvnni support: the AVX-VNNI entry runs the plain
 * AVX2 kernel (the same results). */
float quant_avxvnni_dot_q4_K(int64_t n, const void *vw, const void *va) { return quant_avx2_dot_q4_K(n, vw, va); }
float quant_avx512_dot_q4_K(int64_t n, const void *vw, const void *va) { return quant_avx2_dot_q4_K(n, vw, va); }
#endif

/* ==== Q5_K ====
 * The float operations of ggml's AVX2 kernel, kept in block order with the
 * same operands:
 *   acc   = fmadd(set1(d), cvt(sumi), acc)        (as Q4_K, q5 = q4 | 16 * h)
 *   summs = fmadd_ss(dmin, (float)m . ps, summs)  m . ps = sum over k of
 *           m_k * (bsums[2k] + bsums[2k+1]), an int32 (one scalar per block)
 *   result hsum_f32_8(acc) + summs.
 * The integer work (exact) is arranged as in Q4_K (q4k_unpack, scale dwords
 * stored once and read back with vpbroadcastd, two super-blocks per
 * iteration sharing one 256-bit unpack and one mins madd, as
 * quant_avxvnni_dot_q4_K), and:
 *   - the 5th bits put in place with one shift and one and per 32 quants
 *     (bit b of each qh byte moved to bit 4: a 16-bit shift by 4 - b keeps
 *     it inside its byte) instead of ggml's and + two shifts + a mask shift;
 *   - m . ps of both blocks from one madd and an int32 horizontal sum;
 *   - summs kept in lane 1 of a vector, next to q5k_dm's lane 1 = -dmin:
 *     fmadd(dmin, p, s) is fnmadd(-dmin, p, s), the same rounding (the other
 *     lanes are never read);
 *   - with AVX-VNNI (quant_avxvnni_dot_q5_K): madd + add as one vpdpwssd. */

#define q5k_dm(x, y) kq_dm(&(x)->d, (y))   /* the same layout as Q4_K's head */

/* m . ps of one block (from a broadcast q4k_unpack), as a float in all 4 lanes. */
static inline __m128 q5k_mins1(__m256i sm, const block_q8_K *y)
{
    const __m256i p = kq_mins_madd(sm, y);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtepi32_ps(s);
}

/* 5th bits of 32 quants at bit 4 of each byte: bit b of each qh byte moved
 * by a 16-bit shift of 4 - b (b = 0..7, a constant). */
#define Q5K_HBIT(hb, b)                                                                                         \
    _mm256_and_si256((b) < 4 ? _mm256_slli_epi16(hb, (4 - (b)) & 7) : _mm256_srli_epi16(hb, ((b) - 4) & 7), \
                     _mm256_set1_epi8(0x10))

/* Body of a sumi function for one block (q5, qh, q8; scales s = 0..3 at
 * lo[s], 4..7 at hi[s - 4]): ACC(s, scale, p) adds madd(scale, p) to s. Two
 * accumulators (even and odd sub-blocks), added at the end: exact. */
#define Q5K_STEP(ACC, j)                                                                                        \
    do {                                                                                                        \
        const int32_t *sc = (j) < 2 ? lo + 2 * (j) : hi + 2 * (j) - 4;                                         \
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(q5 + 32 * (j)));                             \
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(bits, m4), Q5K_HBIT(hb, 2 * (j)));                 \
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), Q5K_HBIT(hb, 2 * (j) + 1)); \
        const __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)(q8 + 64 * (j))));     \
        const __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 64 * (j) + 32))); \
        sl = ACC(sl, _mm256_set1_epi32(sc[0]), p0);                                                            \
        sh = ACC(sh, _mm256_set1_epi32(sc[1]), p1);                                                            \
    } while (0)
#define Q5K_SUMI_BODY(ACC)                                                                                      \
    const __m256i m4 = _mm256_set1_epi8(0xF);                                                                   \
    const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);                                                 \
    __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();                                           \
    Q5K_STEP(ACC, 0);                                                                                           \
    Q5K_STEP(ACC, 1);                                                                                           \
    Q5K_STEP(ACC, 2);                                                                                           \
    Q5K_STEP(ACC, 3);                                                                                           \
    return _mm256_add_epi32(sl, sh)

static inline __m256i q5k_sumi_avx2(const uint8_t *q5, const uint8_t *qh, const int8_t *q8, const int32_t *lo,
                                    const int32_t *hi)
{
    Q5K_SUMI_BODY(KQ_ACC_MADD);
}

/* One super-block: acc and summs updated with block xb, yb. */
#define Q5K_BLOCK1(SUMI, xb, yb)                                                                                \
    do {                                                                                                        \
        const __m256 dm_ = q5k_dm(xb, yb);                                                                      \
        const __m256i sm_ = q4k_unpack(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xb)))); \
        q4k_scales1(sm_, sb);                                                                                   \
        Q4K_FORGET(sb);                                                                                         \
        summs = _mm_fnmadd_ps(_mm256_castps256_ps128(dm_), q5k_mins1(sm_, yb), summs);                          \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm_), _mm256_cvtepi32_ps(SUMI((xb)->qs, (xb)->qh, (yb)->qs, sb, sb + 4)), acc); \
    } while (0)

/* Body of a Q5_K dot, two super-blocks per iteration (see
 * quant_avxvnni_dot_q4_K for the shared unpack and the mins madd, which
 * here gives [i a, i b, i+1 a, i+1 b] once the halves are added, a + b =
 * m . ps), then a last single block. */
#define Q5K_DOT_BODY(SUMI)                                                                                      \
    const block_q5_K *x = vw;                                                                                   \
    const block_q8_K *y = va;                                                                                   \
    const int64_t nb = n / QK_K;                                                                                \
    KQ2_SHUFFLES;                                                                                               \
    __m256 acc = _mm256_setzero_ps();                                                                           \
    __m128 summs = _mm_setzero_ps();   /* lane 1: ggml's scalar summs */                                       \
    _Alignas(32) int32_t sa[8], sb[8];                                                                          \
    int64_t i = 0;                                                                                              \
    for (; i + 1 < nb; i += 2) {                                                                                \
        const block_q5_K *x0 = x + i, *x1 = x + i + 1;                                                          \
        const block_q8_K *y0 = y + i, *y1 = y + i + 1;                                                          \
        const __m256 dm0 = q5k_dm(x0, y0), dm1 = q5k_dm(x1, y1);                                                \
        KQ2_HEADS(x0, x1, y0, y1);                                                                              \
        const __m256i p = _mm256_madd_epi16(m, q8s);                                                            \
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));                  \
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));                                    \
        const __m128 mp = _mm_cvtepi32_ps(s);   /* block i in lanes 0, 1; i+1 in 2, 3 */                       \
        const __m256i s0 = SUMI(x0->qs, x0->qh, y0->qs, sa, sb), s1 = SUMI(x1->qs, x1->qh, y1->qs, sa + 4, sb + 4); \
        summs = _mm_fnmadd_ps(_mm256_castps256_ps128(dm0), mp, summs);                                          \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm0), _mm256_cvtepi32_ps(s0), acc);                            \
        summs = _mm_fnmadd_ps(_mm256_castps256_ps128(dm1), _mm_movehl_ps(mp, mp), summs);                       \
        acc = _mm256_fmadd_ps(_mm256_moveldup_ps(dm1), _mm256_cvtepi32_ps(s1), acc);                            \
    }                                                                                                           \
    if (i < nb) Q5K_BLOCK1(SUMI, x + i, y + i);                                                                 \
    return hsum_f32_8(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs))

float quant_avx2_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    Q5K_DOT_BODY(q5k_sumi_avx2);
}

#ifdef Q4K_HAVE_AVXVNNI

/* q5k_sumi_avx2 with madd + add as one vpdpwssd (the same int32 sums). */
Q4K_TARGET_VNNI static inline __m256i q5k_sumi_vnni(const uint8_t *q5, const uint8_t *qh, const int8_t *q8,
                                                    const int32_t *lo, const int32_t *hi)
{
    Q5K_SUMI_BODY(KQ_ACC_VNNI);
}

Q4K_TARGET_VNNI float quant_avxvnni_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    Q5K_DOT_BODY(q5k_sumi_vnni);
}

/* The same in the AVX512-VNNI encoding (CPU_ISA_AVX512). */
Q4K_TARGET_EVEX static inline __m256i q5k_sumi_evex(const uint8_t *q5, const uint8_t *qh, const int8_t *q8,
                                                    const int32_t *lo, const int32_t *hi)
{
    Q5K_SUMI_BODY(KQ_ACC_EVEX);
}

Q4K_TARGET_EVEX float quant_avx512_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    Q5K_DOT_BODY(q5k_sumi_evex);
}
#else
/* A compiler without -mavxvnni support: the plain AVX2 kernel (the same results). */
float quant_avxvnni_dot_q5_K(int64_t n, const void *vw, const void *va) { return quant_avx2_dot_q5_K(n, vw, va); }
float quant_avx512_dot_q5_K(int64_t n, const void *vw, const void *va) { return quant_avx2_dot_q5_K(n, vw, va); }
#endif

float quant_avx2_dot_q6_K(int64_t n, const void *vw, const void *va)
{
    const block_q6_K *x = vw;
    const block_q8_K *y = va;
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * h2f(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        /* The -32 offset: 32 * sum_g scale[g] * bsums[g], per lane pair. */
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)), 5);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0, is = 0; j < QK_K / 128; j++, is += 4, ql += 64, qh += 32, q8 += 128) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m3), 4));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m3), 4));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m3), 4));
            __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)q8));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(q8 + 64)));
            __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(q8 + 96)));
            p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle_q6k(is + 0))), p0);
            p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle_q6k(is + 1))), p1);
            p2 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle_q6k(is + 2))), p2);
            p3 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle_q6k(is + 3))), p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p2, p3));
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32_8(acc);
}

float quant_avx2_dot_q8_K(int64_t n, const void *vw, const void *va)
{
    const block_q8_K *x = vw, *y = va;
    __m256 acc = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K; j += 32) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(x[i].qs + j));
            const __m256i b = _mm256_loadu_si256((const __m256i *)(y[i].qs + j));
            /* |a| * sign(b, a): a == -128 cannot come out of the Q8_K quantizer */
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, ones));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32_8(acc);
}

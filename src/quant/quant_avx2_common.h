/* quant_avx2_common: private to src/quant. The AVX2 helpers that the
 * single-row dots (quant_avx2.c) and the blocked kernels
 * (quant_gemm_avx2.c, quant_gemm_k_avx2.c) share. The gemm kernels must
 * give the dots' bits, so they use these very functions rather than
 * copies: one definition of every reduction order and unpacking.
 * Include only from *_avx2.c files (compiled with -mavx2 -mfma -mf16c). */
#ifndef STRATA_QUANT_AVX2_COMMON_H
#define STRATA_QUANT_AVX2_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
/* Keep scalar expressions unfused so scale arithmetic matches quant_ref.c
 * (GCC in ISO C mode never contracts). */
#pragma STDC FP_CONTRACT OFF
#endif

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }   /* exact, like fp16_to_fp32 */

/* AVX-VNNI kernels are built only where the compiler knows the
 * instructions (gcc >= 11, clang); quant.c hands them out only for
 * CPU_ISA_AVXVNNI. GEMM_TARGET_VNNI marks a function compiled for it. */
#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 11))
#define GEMM_HAVE_AVXVNNI 1
#define GEMM_TARGET_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
/* AVX-512 kernels (quant.c hands them out only for CPU_ISA_AVX512):
 * 512-bit maddubs and vpdpwssd where a type has such a kernel, and
 * otherwise the 256-bit VNNI kernels in their AVX512-VNNI + VL (EVEX)
 * encoding. GEMM_TARGET_AVX512 marks a function compiled for it; it does
 * not include avxvnni, so nothing in it can be VEX-encoded VNNI, which
 * CPUs with AVX-512 but no AVX-VNNI (AMD Zen 4) do not run. */
#define GEMM_HAVE_AVX512 1
#define GEMM_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
/* vpdpbusd: acc + the int32 sums of 4 u8 x s8 products a lane; equal to
 * madd(maddubs(u, s), 1) whenever maddubs does not saturate (|u| <= 128,
 * as every sign-trick or 5-bit operand here). dp8_vnni is the AVX-VNNI
 * encoding, dp8_evex the AVX512-VNNI one (the same instruction). Not
 * always_inline: each is inlined where the caller has its target (see
 * dp16_vnni). */
GEMM_TARGET_VNNI static inline __m256i dp8_vnni(__m256i acc, __m256i u8, __m256i s8)
{
    return _mm256_dpbusd_avx_epi32(acc, u8, s8);
}
GEMM_TARGET_AVX512 static inline __m256i dp8_evex(__m256i acc, __m256i u8, __m256i s8)
{
    return _mm256_dpbusd_epi32(acc, u8, s8);
}
#endif

/* Which form a kernel body written once (with a constant `vnni` argument)
 * is instantiated in: plain AVX2 (maddubs -> madd -> add), AVX-VNNI
 * (GEMM_TARGET_VNNI functions) or the EVEX encoding of the same 256-bit
 * VNNI instructions (GEMM_TARGET_AVX512 functions). All three give the
 * same int32 sums, so the same bits. */
enum { VNNI_NONE = 0, VNNI_VEX = 1, VNNI_EVEX = 2 };

/* Sum of 8 lanes: halves added, then movehl, then movehdup. */
static inline float hsum_f32_8(__m256 x)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hsum_f32_4(__m128 r)
{
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* GGML_F32x8_REDUCE: (a0 + a2) + (a1 + a3), halves added, then two hadds
 * (the F32 / F16 / BF16 dots). */
static inline float reduce4_hadd(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    const __m256 x = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

/* 16 packed nibbles -> 32 bytes: low nibbles in bytes 0..15, high in 16..31
 * (the Q4/Q5 "j, j+16" element order). */
static inline __m256i bytes_from_nibbles_32(const uint8_t *p)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes of 0x00 / 0xFF (bit j -> byte j). */
static inline __m256i bytes_from_bits_32(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* Q3_K scale broadcast: entry i puts int16 scale 2i in the low 128-bit half
 * and 2i+1 in the high half. */
static const uint8_t k_shuffle_q3k[128] = {
     0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,   2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
     4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,   6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
     8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,  10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,
    12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,  14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,
};
static inline __m256i shuffle_q3k(int i) { return _mm256_loadu_si256((const __m256i *)k_shuffle_q3k + i); }

#endif

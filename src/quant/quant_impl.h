/* quant_impl: private to src/quant. The ggml block structs (byte-exact with
 * ggml/src/ggml-common.h, checked by _Static_assert), the shared scalar
 * helpers, and the declarations of every reference (quant_ref.c) and AVX2
 * (quant_avx2.c) kernel that quant.c binds into a quant_ops table.
 *
 * Nothing outside src/quant includes this header: other modules go through
 * quant_ops_get() (quant.h).
 *
 * Halves are stored as uint16_t bit patterns and converted with util/fp16.h
 * (exact IEEE round-to-nearest-even, like ggml's GGML_FP32_TO_FP16).
 * Every multi-byte field is little-endian, as on x86-64 and in GGUF files. */
#ifndef STRATA_QUANT_IMPL_H
#define STRATA_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K  256

/* ==== Block layouts (ggml-common.h) ==== */

typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1;   /* s = d * sum(qs) */

typedef struct {
    uint8_t  scales[QK_K / 16];   /* low nibble: scale, high nibble: min (4 bits each) */
    uint8_t  qs[QK_K / 4];        /* 2-bit quants */
    uint16_t d, dmin;             /* super-block scale for scales / for mins */
} block_q2_K;

typedef struct {
    uint8_t  hmask[QK_K / 8];     /* high bit of each quant */
    uint8_t  qs[QK_K / 4];        /* low 2 bits */
    uint8_t  scales[12];          /* 16 scales of 6 bits */
    uint16_t d;
} block_q3_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t  scales[12];          /* 8 (scale, min) pairs of 6 bits */
    uint8_t  qs[QK_K / 2];
} block_q4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t  scales[12];
    uint8_t  qh[QK_K / 8];        /* 5th bit of each quant */
    uint8_t  qs[QK_K / 2];        /* low 4 bits */
} block_q5_K;

typedef struct {
    uint8_t  ql[QK_K / 2];        /* low 4 bits */
    uint8_t  qh[QK_K / 4];        /* high 2 bits */
    int8_t   scales[QK_K / 16];   /* 8-bit signed scales */
    uint16_t d;
} block_q6_K;

typedef struct {
    float   d;                    /* plain float, not a half */
    int8_t  qs[QK_K];
    int16_t bsums[QK_K / 16];     /* sum of each group of 16 quants */
} block_q8_K;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 size");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1 size");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K size");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K size");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K size");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K size");

/* ==== Shared scalar helpers ==== */

/* ggml's nearest_int: round to nearest, ties to even, by adding 1.5 * 2^23
 * (valid for |f| <= 2^22; the quantizers never exceed that). Kept bit-exact
 * rather than lrintf() so results never depend on the FP environment. */
static inline int quant_nearest_int(float f)
{
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Q4_K / Q5_K packed 6-bit (scale, min) of sub-block j (0..7):
 *   j < 4:  sc = s[j] & 63,                      m = s[j+4] & 63
 *   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,  m = (s[j+4] >> 4) | (s[j] >> 6) << 4 */
static inline void quant_scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q3_K: unpack the 12 scale bytes into 16 signed 6-bit scales (still biased
 * by +32, exactly as ggml's kmask1/kmask2 shuffle produces them). */
static inline void quant_q3k_scales(const uint8_t *s12, int8_t out[16])
{
    uint32_t aux[4];
    memcpy(aux, s12, 12);
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(out, aux, 16);
}

/* ==== Reference kernels (quant_ref.c) ==== */

#define QREF_DECL(t) \
    void quant_ref_dequant_##t(const void *src, float *dst, int64_t n); \
    void quant_ref_quant_##t(const float *src, void *dst, int64_t n);
QREF_DECL(f32)
QREF_DECL(f16)
QREF_DECL(bf16)
QREF_DECL(q4_0)
QREF_DECL(q4_1)
QREF_DECL(q5_0)
QREF_DECL(q5_1)
QREF_DECL(q8_0)
QREF_DECL(q8_1)
QREF_DECL(q2_K)
QREF_DECL(q3_K)
QREF_DECL(q4_K)
QREF_DECL(q5_K)
QREF_DECL(q6_K)
QREF_DECL(q8_K)
#undef QREF_DECL

/* ggml-cpu's activation quantizers for Q8_0 / Q8_1 (see quant.h act_quant). */
void quant_ref_act_quant_q8_0(const float *src, void *dst, int64_t n);
void quant_ref_act_quant_q8_1(const float *src, void *dst, int64_t n);

float quant_ref_dot_f32(int64_t n, const void *w, const void *a);
float quant_ref_dot_f16(int64_t n, const void *w, const void *a);
float quant_ref_dot_bf16(int64_t n, const void *w, const void *a);
float quant_ref_dot_q4_0(int64_t n, const void *w, const void *a);   /* a: q8_0 */
float quant_ref_dot_q4_1(int64_t n, const void *w, const void *a);   /* a: q8_1 */
float quant_ref_dot_q5_0(int64_t n, const void *w, const void *a);   /* a: q8_0 */
float quant_ref_dot_q5_1(int64_t n, const void *w, const void *a);   /* a: q8_1 */
float quant_ref_dot_q8_0(int64_t n, const void *w, const void *a);   /* a: q8_0 */
float quant_ref_dot_q8_1(int64_t n, const void *w, const void *a);   /* a: q8_1 */
float quant_ref_dot_q2_K(int64_t n, const void *w, const void *a);   /* a: q8_K */
float quant_ref_dot_q3_K(int64_t n, const void *w, const void *a);
float quant_ref_dot_q4_K(int64_t n, const void *w, const void *a);
float quant_ref_dot_q5_K(int64_t n, const void *w, const void *a);
float quant_ref_dot_q6_K(int64_t n, const void *w, const void *a);
float quant_ref_dot_q8_K(int64_t n, const void *w, const void *a);   /* a: q8_K */

/* ==== AVX2 + FMA + F16C kernels (quant_avx2.c) ====
 * Call only when cpu_detect() reports avx2, fma and f16c. */

void quant_avx2_dequant_f16(const void *src, float *dst, int64_t n);
void quant_avx2_dequant_bf16(const void *src, float *dst, int64_t n);
void quant_avx2_quant_f16(const float *src, void *dst, int64_t n);
void quant_avx2_quant_bf16(const float *src, void *dst, int64_t n);
void quant_avx2_quant_q8_0(const float *src, void *dst, int64_t n);
void quant_avx2_quant_q8_K(const float *src, void *dst, int64_t n);
void quant_avx2_act_quant_q8_0(const float *src, void *dst, int64_t n);
void quant_avx2_act_quant_q8_1(const float *src, void *dst, int64_t n);

float quant_avx2_dot_f32(int64_t n, const void *w, const void *a);
float quant_avx2_dot_f16(int64_t n, const void *w, const void *a);
float quant_avx2_dot_bf16(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q4_0(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q4_1(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q5_0(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q5_1(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q8_0(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q2_K(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q3_K(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q4_K(int64_t n, const void *w, const void *a);
/* The same dot with AVX-VNNI (vpdpwssd), bit-identical; only for
 * CPU_ISA_AVXVNNI (quant_ops_get checks the CPU). */
float quant_avxvnni_dot_q4_K(int64_t n, const void *w, const void *a);
float quant_avxvnni_dot_q5_K(int64_t n, const void *w, const void *a);
/* The same two in the AVX512-VNNI (EVEX) encoding, for CPU_ISA_AVX512. */
float quant_avx512_dot_q4_K(int64_t n, const void *w, const void *a);
float quant_avx512_dot_q5_K(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q5_K(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q6_K(int64_t n, const void *w, const void *a);
float quant_avx2_dot_q8_K(int64_t n, const void *w, const void *a);

/* ==== Blocked AVX2 kernels (quant.h quant_gemm_fn), each bit-identical to
 * the same type's quant_avx2_dot per (weight row, activation row) pair.
 * A type whose kernel is not written yet maps to NULL (quant_gemm loops
 * dot); the file that implements one defines its macro to the function. */
#define QUANT_GEMM_DECL(t) void quant_avx2_gemm_##t(int64_t n, const void *w, size_t wstride, int nw, \
                                                    const void *a, size_t astride, int na, float *y, size_t ldy)
/* quant_gemm_avx2.c: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 */
QUANT_GEMM_DECL(f32);
#define QUANT_GEMM_AVX2_F32  quant_avx2_gemm_f32
QUANT_GEMM_DECL(f16);
#define QUANT_GEMM_AVX2_F16  quant_avx2_gemm_f16
QUANT_GEMM_DECL(bf16);
#define QUANT_GEMM_AVX2_BF16 quant_avx2_gemm_bf16
QUANT_GEMM_DECL(q4_0);
#define QUANT_GEMM_AVX2_Q4_0 quant_avx2_gemm_q4_0
QUANT_GEMM_DECL(q4_1);
#define QUANT_GEMM_AVX2_Q4_1 quant_avx2_gemm_q4_1
QUANT_GEMM_DECL(q5_0);
#define QUANT_GEMM_AVX2_Q5_0 quant_avx2_gemm_q5_0
QUANT_GEMM_DECL(q5_1);
#define QUANT_GEMM_AVX2_Q5_1 quant_avx2_gemm_q5_1
QUANT_GEMM_DECL(q8_0);
#define QUANT_GEMM_AVX2_Q8_0 quant_avx2_gemm_q8_0
/* quant_gemm_k_avx2.c: Q2_K Q3_K Q4_K Q5_K Q6_K */
QUANT_GEMM_DECL(q2_K);
#define QUANT_GEMM_AVX2_Q2_K quant_avx2_gemm_q2_K
QUANT_GEMM_DECL(q3_K);
#define QUANT_GEMM_AVX2_Q3_K quant_avx2_gemm_q3_K
QUANT_GEMM_DECL(q4_K);
#define QUANT_GEMM_AVX2_Q4_K quant_avx2_gemm_q4_K
QUANT_GEMM_DECL(q5_K);
#define QUANT_GEMM_AVX2_Q5_K quant_avx2_gemm_q5_K
QUANT_GEMM_DECL(q6_K);
#define QUANT_GEMM_AVX2_Q6_K quant_avx2_gemm_q6_K

/* The same kernels with AVX-VNNI (K-quants: vpdpwssd for madd + add; the
 * 32-element block types: vpdpbusd for maddubs + madd; the same int32
 * sums), bit-identical to the AVX2 ones; only for CPU_ISA_AVXVNNI
 * (quant_ops_get checks the CPU). quant_gemm_k_avx2.c; a compiler without
 * AVX-VNNI support builds them as the AVX2 kernels. */
#define QUANT_GEMM_DECL_AVXVNNI(t) void quant_avxvnni_gemm_##t(int64_t n, const void *w, size_t wstride, int nw, \
                                                           const void *a, size_t astride, int na, float *y, size_t ldy)
QUANT_GEMM_DECL_AVXVNNI(q2_K);
QUANT_GEMM_DECL_AVXVNNI(q3_K);
QUANT_GEMM_DECL_AVXVNNI(q4_K);
QUANT_GEMM_DECL_AVXVNNI(q5_K);
QUANT_GEMM_DECL_AVXVNNI(q6_K);
/* quant_gemm_avx2.c: the 32-element block types (vpdpbusd for maddubs + madd) */
QUANT_GEMM_DECL_AVXVNNI(q8_0);
QUANT_GEMM_DECL_AVXVNNI(q4_0);
QUANT_GEMM_DECL_AVXVNNI(q5_0);
QUANT_GEMM_DECL_AVXVNNI(q4_1);
QUANT_GEMM_DECL_AVXVNNI(q5_1);
/* The CPU_ISA_AVX512 kernels (quant_ops_get checks the CPU: AVX-512
 * F/BW/VL/VNNI, AVX-VNNI not needed), bit-identical to the AVX2 ones:
 * 512-bit kernels for Q4_K (quant_gemm_k_avx2.c) and Q8_0
 * (quant_gemm_avx2.c), the AVX-VNNI kernels in their EVEX encoding for the
 * other types and for what the 512-bit kernels hand on (short activation
 * tiles, long rows). A compiler without the instructions builds them as
 * the AVX2 kernels. */
#define QUANT_GEMM_DECL_AVX512(t) void quant_avx512_gemm_##t(int64_t n, const void *w, size_t wstride, int nw, \
                                                         const void *a, size_t astride, int na, float *y, size_t ldy)
QUANT_GEMM_DECL_AVX512(q2_K);
QUANT_GEMM_DECL_AVX512(q3_K);
QUANT_GEMM_DECL_AVX512(q4_K);
QUANT_GEMM_DECL_AVX512(q5_K);
QUANT_GEMM_DECL_AVX512(q6_K);
QUANT_GEMM_DECL_AVX512(q8_0);
QUANT_GEMM_DECL_AVX512(q4_0);
QUANT_GEMM_DECL_AVX512(q5_0);
QUANT_GEMM_DECL_AVX512(q4_1);
QUANT_GEMM_DECL_AVX512(q5_1);

#endif

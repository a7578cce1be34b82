/* quant_gemm_k_avx2: blocked AVX2 matmul kernels (quant.h quant_gemm_fn) for
 * the K-quants Q2_K Q3_K Q4_K Q5_K Q6_K against Q8_K activation rows.
 * Compiled with -mavx2 -mfma -mf16c (the Makefile's rule for *_avx2.c);
 * quant.c hands them out only when cpu_detect() reports all three.
 *
 * Contract (quant.h): y[c * ldy + r] = dot(n, w + r * wstride, a + c * astride)
 * for r < nw, c < na, every output BIT-IDENTICAL to the same type's
 * quant_avx2_dot_* (quant_avx2.c) on that pair. How that holds:
 *   - the float arithmetic of a pair is the dot's, operation for operation
 *     and in the same order: per super-block the same scalar products
 *     (d = y.d * h2f(x.d), dmin = -y.d * h2f(x.dmin)), the same FMAs into
 *     the same accumulator vectors, block after block in order, and the
 *     same horizontal sums at the end;
 *   - the int32 per-lane block sums (sumi) are the dot's lane for lane: the
 *     same maddubs/madd pairs land in the same 32-bit lanes. Only the order
 *     of the int32 additions inside a lane may differ, which is exact (the
 *     sums are far from overflow: |lane| < 2^24 for every type), and no
 *     int16 step saturates (bounds per type below), as in the dot.
 * What changes is the loop structure:
 *   - register blocking: a weight super-block's quants and scales are
 *     unpacked once and applied to NA_BLK activation rows, each with its
 *     own accumulators (1 weight row x up to 4 activation rows);
 *   - cache blocking: a chunk of weight rows (about WCHUNK_BYTES) is run
 *     against every group of activation rows before moving on, so the
 *     chunk stays in L2 while each group of NA_BLK activation rows (NA_BLK
 *     x n/256 x 292 bytes: 9.3 KB at n = 2048) stays in L1.
 * The single-row dots are the reference; tests/unit/test_gemm_k.c checks
 * every output bitwise against them. No allocation, no state. */
#include "quant/quant_impl.h"

#include <immintrin.h>

#if defined(__clang__)
/* Keep scalar expressions unfused, as quant_avx2.c does (GCC in ISO C mode
 * never contracts), so the scale arithmetic is the dot's. */
#pragma STDC FP_CONTRACT OFF
#endif

#define NA_BLK 4                    /* activation rows per register block */
#define WCHUNK_BYTES (128 * 1024)   /* weight bytes per cache block (L2) */

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* ==== Helpers: copies of quant_avx2.c's (must stay identical to them) ==== */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

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

/* Broadcast masks (see quant_avx2.c): q3k entry i puts int16 scale 2i in the
 * low 128-bit half and 2i+1 in the high half; k4 entry i puts int16 scale i
 * everywhere; q6k (128-bit) entry i gives bytes 2i x8 then 2i+1 x8. */
static const uint8_t k_shuffle_q3k[128] = {
     0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,   2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
     4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,   6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
     8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,  10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,
    12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,  14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,
};
static const uint8_t k_shuffle_k4[256] = {
     0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
     2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
     4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
     6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
     8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,
    10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,
    12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,
    14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,
};
static const uint8_t k_shuffle_q6k[128] = {
     0, 0, 0, 0, 0, 0, 0, 0,  1, 1, 1, 1, 1, 1, 1, 1,   2, 2, 2, 2, 2, 2, 2, 2,  3, 3, 3, 3, 3, 3, 3, 3,
     4, 4, 4, 4, 4, 4, 4, 4,  5, 5, 5, 5, 5, 5, 5, 5,   6, 6, 6, 6, 6, 6, 6, 6,  7, 7, 7, 7, 7, 7, 7, 7,
     8, 8, 8, 8, 8, 8, 8, 8,  9, 9, 9, 9, 9, 9, 9, 9,  10,10,10,10,10,10,10,10, 11,11,11,11,11,11,11,11,
    12,12,12,12,12,12,12,12, 13,13,13,13,13,13,13,13,  14,14,14,14,14,14,14,14, 15,15,15,15,15,15,15,15,
};
static inline __m256i shuffle_q3k(int i) { return _mm256_loadu_si256((const __m256i *)k_shuffle_q3k + i); }
static inline __m256i shuffle_k4(int i) { return _mm256_loadu_si256((const __m256i *)k_shuffle_k4 + i); }
static inline __m128i shuffle_q6k(int i) { return _mm_loadu_si128((const __m128i *)k_shuffle_q6k + i); }

/* Q4_K/Q5_K: 12 scale bytes -> utmp[0..1] = 8 scales, utmp[2..3] = 8 mins. */
static inline void k4_unpack(const uint8_t *s12, uint32_t utmp[4])
{
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, s12, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ==== Driver ====
 * A row kernel computes one weight row against nc (1..NA_BLK) activation
 * rows: y[c * ldy] = dot(w, a + c * astride), c < nc. */
typedef void (*rows_fn)(int64_t nb, const void *w, const uint8_t *a, size_t astride, int nc, float *y, size_t ldy);

/* Cache blocking around a row kernel (see the file comment). wblock: bytes
 * of one weight super-block; every (r, c) pair is computed exactly once. */
static void gemm_blocked(int64_t n, const void *w, size_t wstride, int nw, const void *a, size_t astride, int na,
                         float *y, size_t ldy, size_t wblock, rows_fn fn)
{
    const int64_t nb = n / QK_K;
    const size_t wbytes = (size_t)nb * wblock;
    int chunk = wbytes ? (int)(WCHUNK_BYTES / wbytes) : nw;
    if (chunk < 1) chunk = 1;
    const uint8_t *wb = w, *ab = a;
    for (int r0 = 0; r0 < nw; r0 += chunk) {
        const int r1 = nw - r0 < chunk ? nw : r0 + chunk;
        for (int c0 = 0; c0 < na; c0 += NA_BLK) {
            const int nc = na - c0 < NA_BLK ? na - c0 : NA_BLK;
            const uint8_t *ac = ab + (size_t)c0 * astride;
            float *yc = y + (size_t)c0 * ldy;
            for (int r = r0; r < r1; r++) fn(nb, wb + (size_t)r * wstride, ac, astride, nc, yc + r, ldy);
        }
    }
}

/* Instantiate a row kernel body (static ALWAYS_INLINE t##_k(..., nc)) for
 * each constant nc, so the per-row arrays below become registers. */
#define ROWS_DISPATCH(t) \
    static void t##_rows(int64_t nb, const void *w, const uint8_t *a, size_t astride, int nc, float *y, size_t ldy) \
    { \
        switch (nc) { \
        case 4: t##_k(nb, w, a, astride, 4, y, ldy); break; \
        case 3: t##_k(nb, w, a, astride, 3, y, ldy); break; \
        case 2: t##_k(nb, w, a, astride, 2, y, ldy); break; \
        default: t##_k(nb, w, a, astride, 1, y, ldy); break; \
        } \
    }

#define YBLK(c) ((const block_q8_K *)(a + (size_t)(c) * astride))

/* ==== Q4_K ====
 * Dot (quant_avx2_dot_q4_K): per block, acc_m += dmin * (mins . pairwise
 * bsums) (4 lanes), sumi = sum_j scale * maddubs(q4, q8) (8 lanes),
 * acc += d * sumi. int16: 2 * 15 * 127 = 3810, no saturation. */
static ALWAYS_INLINE void q4_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy)
{
    const block_q4_K *x = vw;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[NA_BLK];
    __m128 acc_m[NA_BLK];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) { acc[c] = _mm256_setzero_ps(); acc_m[c] = _mm_setzero_ps(); }
    for (int64_t i = 0; i < nb; i++) {
        const float xd = h2f(x[i].d), xdmin = h2f(x[i].dmin);
        uint32_t utmp[4];
        k4_unpack(x[i].scales, utmp);
        const __m256i mins_scales = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
        const __m128i mins = _mm256_extracti128_si256(mins_scales, 1);
        const __m128i sc128 = _mm256_castsi256_si128(mins_scales);
        const __m256i scales = _mm256_setr_m128i(sc128, sc128);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const block_q8_K *yb = YBLK(c) + i;
            const float dmin = -yb->d * xdmin;
            const __m256i q8sums = load256(yb->bsums);
            const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
            const __m128i prod = _mm_madd_epi16(mins, q8s);
            acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
        }
        __m256i sumi[NA_BLK];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
        const uint8_t *q4 = x[i].qs;
#pragma GCC unroll 4
        for (int j = 0; j < QK_K / 64; j++, q4 += 32) {
            const __m256i scale_l = _mm256_shuffle_epi8(scales, shuffle_k4(2 * j));
            const __m256i scale_h = _mm256_shuffle_epi8(scales, shuffle_k4(2 * j + 1));
            const __m256i bits = load256(q4);
            const __m256i q4l = _mm256_and_si256(bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = YBLK(c)[i].qs + 64 * j;
                const __m256i pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(q8)));
                const __m256i ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(q8 + 32)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const float d = YBLK(c)[i].d * xd;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) y[(size_t)c * ldy] = hsum_f32_8(acc[c]) + hsum_f32_4(acc_m[c]);
}
ROWS_DISPATCH(q4_K)

void quant_avx2_gemm_q4_K(int64_t n, const void *w, size_t wstride, int nw, const void *a, size_t astride, int na,
                          float *y, size_t ldy)
{
    gemm_blocked(n, w, wstride, nw, a, astride, na, y, ldy, sizeof(block_q4_K), q4_K_rows);
}

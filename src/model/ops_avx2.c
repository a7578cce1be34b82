/* ops_avx2: AVX2 + F16C versions of the attention kernels of ops.c, built
 * with -mavx2 -mfma -mf16c and called only after run-time detection
 * (ops_kernels_get). They return exactly the scalar reference's bits: the
 * 8 accumulators are the 8 lanes of one vector, products and sums are
 * separate instructions (never fused: an FMA rounds once where the scalar
 * code rounds twice), the tail and the final lane tree are the scalar
 * code's, and F16C's half->float conversion is exact like the table. */
#include "model/ops.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "util/fp16.h"

/* clang contracts a * b + c into an FMA by default when FMA is enabled (this
 * file is built with -mfma); the scalar twin rounds twice, so forbid it.
 * gcc does not contract in ISO C mode (-std=c11). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The scalar tree: ((0+4)+(2+6)) + ((1+5)+(3+7)). */
static inline float lanes_sum(const float *a)
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

float ops_avx2_dot_f32(const float *a, const float *b, int n)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int k = 0; i < n; i++, k++) l[k] += a[i] * b[i];
    return lanes_sum(l);
}

float ops_avx2_dot_f16(const uint16_t *a, const float *b, int n)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 av = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(av, _mm256_loadu_ps(b + i)));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int k = 0; i < n; i++, k++) l[k] += fp16_to_fp32(a[i]) * b[i];
    return lanes_sum(l);
}

void ops_avx2_attention(float *out, const float *q, const void *k, int k_f16, const void *v, int v_f16,
                        int64_t stride, int d, int n_kv, float scale, float *scores, const float *f16_tab)
{
    (void)f16_tab;
    float max = -INFINITY;
    for (int j = 0; j < n_kv; j++) {
        float s = k_f16 ? ops_avx2_dot_f16((const uint16_t *)k + j * stride, q, d)
                        : ops_avx2_dot_f32((const float *)k + j * stride, q, d);
        s *= scale;
        scores[j] = s;
        max = s > max ? s : max;
    }
    double sum = 0.0;
    for (int j = 0; j < n_kv; j++) {
        const float p = expf(scores[j] - max);
        sum += (double)p;
        scores[j] = p;
    }
    const float inv = (float)(1.0 / sum);
    memset(out, 0, sizeof(float) * (size_t)d);
    for (int j = 0; j < n_kv; j++) {
        const float p = scores[j] * inv;
        const __m256 vp = _mm256_set1_ps(p);
        int i = 0;
        if (v_f16) {
            const uint16_t *vr = (const uint16_t *)v + j * stride;
            for (; i + 8 <= d; i += 8) {
                __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + i)));
                _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(vp, vv)));
            }
            for (; i < d; i++) out[i] += p * fp16_to_fp32(vr[i]);
        } else {
            const float *vr = (const float *)v + j * stride;
            for (; i + 8 <= d; i += 8)
                _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i),
                                                        _mm256_mul_ps(vp, _mm256_loadu_ps(vr + i))));
            for (; i < d; i++) out[i] += p * vr[i];
        }
    }
}

/* ==== Tiled causal attention (ops.h: ops_attention_rows) ====
 * Per row, the same float operations in the same order as
 * ops_avx2_attention (hence as the scalar ops_attention); the tile only
 * changes which row is worked on when, so loads are shared:
 *
 *   dots     a micro-kernel takes R query rows x P consecutive K rows and
 *            keeps R*P (<= 8) independent 8-lane accumulators in
 *            registers: each K chunk is loaded (and widened) once for the R
 *            rows, and the R*P add chains overlap instead of one dot's
 *            chain waiting on the add latency (what bounds the per-row
 *            path). Each accumulator is still exactly one (row, position)
 *            dot: lanes = index mod 8, then the scalar lane tree (for the
 *            R*P == 8 kernels, all 8 trees at once: lanes_sum8).
 *   softmax  per row, positions in order (the running max is taken in the
 *            dot pass, also in position order for each row).
 *   values   V rows 0..pos0 (seen by every row): a micro-kernel keeps an
 *            R rows x CB chunks block of the outputs in registers and
 *            walks j = 0..pos0 in order, each V chunk loaded once for the R
 *            rows: out = ((0 + p_0 v_0) + p_1 v_1) + ..., the per-row sum,
 *            with no store/reload of out per position. Then V rows
 *            pos0+1 .. pos0+nq-1 (the tile's own, each seen by a suffix of
 *            the rows) are added in order into the stored outputs.
 *
 * Everything assumes d % 8 == 0 (no tails); ops_avx2_attention_rows
 * checks it and otherwise runs ops_avx2_attention row by row. */

/* 8 elements of a K/V row at element offset i, widened to float. */
#define LD_F32(base, i) _mm256_loadu_ps((const float *)(base) + (i))
#define LD_F16(base, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(base) + (i))))

/* The lane tree of 8 accumulators at once, exactly the scalar lanes_sum of
 * each: for b = (a0, a4, a1, a5, a2, a6, a3, a7) the result is
 * [tree(a0), .., tree(a7)]. Step 1 adds the 128-bit halves (lanes 0+4,
 * 1+5, 2+6, 3+7), step 2 pairs (0+4)+(2+6) and (1+5)+(3+7), step 3 adds
 * those two: ((0+4)+(2+6)) + ((1+5)+(3+7)), with the scalar operand order. */
static inline __m256 lanes_sum8(__m256 b0, __m256 b1, __m256 b2, __m256 b3, __m256 b4, __m256 b5, __m256 b6,
                                __m256 b7)
{
    const __m256 x01 = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
    const __m256 x23 = _mm256_add_ps(_mm256_permute2f128_ps(b2, b3, 0x20), _mm256_permute2f128_ps(b2, b3, 0x31));
    const __m256 x45 = _mm256_add_ps(_mm256_permute2f128_ps(b4, b5, 0x20), _mm256_permute2f128_ps(b4, b5, 0x31));
    const __m256 x67 = _mm256_add_ps(_mm256_permute2f128_ps(b6, b7, 0x20), _mm256_permute2f128_ps(b6, b7, 0x31));
    const __m256 y0 = _mm256_add_ps(_mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 y1 = _mm256_add_ps(_mm256_shuffle_ps(x45, x67, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(x45, x67, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Dots of R query rows (q, q_stride apart) with K rows j0 .. j0+P-1:
 * scores[r * n_kv + j] = dot * scale, and max[r] updated in position order.
 * k: this head's position-0 row of the cache. */
#define DEF_DOTS(NAME, R, P, LD, ELEM)                                                                          \
    static void NAME(const float *q, size_t q_stride, const void *k, int64_t stride, int j0, int d,            \
                     float scale, float *scores, size_t n_kv, float *max)                                      \
    {                                                                                                          \
        const ELEM *kr = (const ELEM *)k + (int64_t)j0 * stride;                                              \
        __m256 acc[R][P];                                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                    \
            _Pragma("GCC unroll 8") for (int p = 0; p < P; p++) acc[r][p] = _mm256_setzero_ps();               \
        for (int i = 0; i < d; i += 8) {                                                                       \
            __m256 kv[P];                                                                                      \
            _Pragma("GCC unroll 8") for (int p = 0; p < P; p++) kv[p] = LD(kr + p * stride, i);               \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                              \
                const __m256 qv = _mm256_loadu_ps(q + (size_t)r * q_stride + i);                               \
                _Pragma("GCC unroll 8") for (int p = 0; p < P; p++)                                            \
                    acc[r][p] = _mm256_add_ps(acc[r][p], _mm256_mul_ps(kv[p], qv));                            \
            }                                                                                                  \
        }                                                                                                      \
        if (R * P == 8) { /* all 8 trees at once; t[r * P + p] */                                              \
            const __m256 *a = &acc[0][0];                                                                      \
            float t[8];                                                                                        \
            _mm256_storeu_ps(t, _mm256_mul_ps(lanes_sum8(a[0], a[4], a[1], a[5], a[2], a[6], a[3], a[7]),      \
                                              _mm256_set1_ps(scale)));                                         \
            for (int r = 0; r < R; r++)                                                                        \
                for (int p = 0; p < P; p++) {                                                                  \
                    const float s = t[r * P + p];                                                              \
                    scores[(size_t)r * n_kv + (size_t)(j0 + p)] = s;                                           \
                    max[r] = s > max[r] ? s : max[r];                                                          \
                }                                                                                              \
            return;                                                                                            \
        }                                                                                                      \
        for (int r = 0; r < R; r++)                                                                            \
            for (int p = 0; p < P; p++) {                                                                      \
                float l[8];                                                                                    \
                _mm256_storeu_ps(l, acc[r][p]);                                                                \
                const float s = lanes_sum(l) * scale;                                                          \
                scores[(size_t)r * n_kv + (size_t)(j0 + p)] = s;                                               \
                max[r] = s > max[r] ? s : max[r];                                                              \
            }                                                                                                  \
    }

#define DEF_DOTS_BOTH(R, P)                                          \
    DEF_DOTS(dots_f32_##R##x##P, R, P, LD_F32, float)                \
    DEF_DOTS(dots_f16_##R##x##P, R, P, LD_F16, uint16_t)
DEF_DOTS_BOTH(1, 1)
DEF_DOTS_BOTH(2, 1)
DEF_DOTS_BOTH(3, 1)
DEF_DOTS_BOTH(4, 1)
DEF_DOTS_BOTH(5, 1)
DEF_DOTS_BOTH(6, 1)
DEF_DOTS_BOTH(7, 1)
DEF_DOTS_BOTH(8, 1)
DEF_DOTS_BOTH(3, 2)
DEF_DOTS_BOTH(4, 2)
DEF_DOTS_BOTH(2, 4)
DEF_DOTS_BOTH(1, 8)

typedef void (*dots_fn)(const float *q, size_t q_stride, const void *k, int64_t stride, int j0, int d,
                        float scale, float *scores, size_t n_kv, float *max);

/* One K row against R (1..8) rows: [f16][R - 1]. */
static const dots_fn dots_col[2][8] = {
    { dots_f32_1x1, dots_f32_2x1, dots_f32_3x1, dots_f32_4x1, dots_f32_5x1, dots_f32_6x1, dots_f32_7x1,
      dots_f32_8x1 },
    { dots_f16_1x1, dots_f16_2x1, dots_f16_3x1, dots_f16_4x1, dots_f16_5x1, dots_f16_6x1, dots_f16_7x1,
      dots_f16_8x1 },
};
/* The block for K rows seen by all R rows: P = 8 / R positions at a time
 * (at most 8 accumulators: 16 ymm registers hold them, the P K chunks and
 * a q chunk). [f16][R - 1]; P is blk_p[R - 1]. */
static const dots_fn dots_blk[2][8] = {
    { dots_f32_1x8, dots_f32_2x4, dots_f32_3x2, dots_f32_4x2, dots_f32_5x1, dots_f32_6x1, dots_f32_7x1,
      dots_f32_8x1 },
    { dots_f16_1x8, dots_f16_2x4, dots_f16_3x2, dots_f16_4x2, dots_f16_5x1, dots_f16_6x1, dots_f16_7x1,
      dots_f16_8x1 },
};
static const int blk_p[8] = { 8, 4, 2, 2, 1, 1, 1, 1 };

/* out[r][0..d) += p_r * v_row for rows r0..nq-1, p_r = scores[r * n_kv + j]. */
#define DEF_VACC(NAME, LD, ELEM)                                                                                \
    static void NAME(float *out, size_t out_stride, const ELEM *vr, int d, int r0, int nq, const float *scores, \
                     size_t n_kv, int j)                                                                       \
    {                                                                                                          \
        for (int i = 0; i < d; i += 8) {                                                                       \
            const __m256 vv = LD(vr, i);                                                                       \
            for (int r = r0; r < nq; r++) {                                                                    \
                float *o = out + (size_t)r * out_stride + i;                                                   \
                const __m256 vp = _mm256_broadcast_ss(scores + (size_t)r * n_kv + (size_t)j);                  \
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_mul_ps(vp, vv)));                 \
            }                                                                                                  \
        }                                                                                                      \
    }
DEF_VACC(vacc_f32, LD_F32, float)
DEF_VACC(vacc_f16, LD_F16, uint16_t)

/* out[r][c0 .. c0 + 8*CB) = sum over j = 0..n_j-1 (in order) of p_rj * v_j,
 * starting from 0 like ops_avx2_attention's memset, for R rows. R*CB
 * accumulators + CB V chunks + a broadcast fit the 16 ymm registers. */
#define DEF_VBLK(NAME, R, CB, LD, ELEM)                                                                         \
    static void NAME(float *out, size_t out_stride, const void *v, int64_t stride, int n_j, int c0,            \
                     const float *scores, size_t n_kv)                                                         \
    {                                                                                                          \
        __m256 acc[R][CB];                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                    \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) acc[r][c] = _mm256_setzero_ps();              \
        const ELEM *vr = (const ELEM *)v + c0;                                                         \
        for (int j = 0; j < n_j; j++, vr += stride) {                                                          \
            __m256 vv[CB];                                                                                     \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) vv[c] = LD(vr, 8 * c);                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                              \
                const __m256 vp = _mm256_broadcast_ss(scores + (size_t)r * n_kv + (size_t)j);                  \
                _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                                           \
                    acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(vp, vv[c]));                            \
            }                                                                                                  \
        }                                                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                    \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                                               \
                _mm256_storeu_ps(out + (size_t)r * out_stride + (size_t)(c0 + 8 * c), acc[r][c]);              \
    }
#define DEF_VBLK_BOTH(R, CB)                                         \
    DEF_VBLK(vblk_f32_##R##x##CB, R, CB, LD_F32, float)              \
    DEF_VBLK(vblk_f16_##R##x##CB, R, CB, LD_F16, uint16_t)
DEF_VBLK_BOTH(1, 1)
DEF_VBLK_BOTH(2, 1)
DEF_VBLK_BOTH(3, 1)
DEF_VBLK_BOTH(4, 1)
DEF_VBLK_BOTH(5, 1)
DEF_VBLK_BOTH(6, 1)
DEF_VBLK_BOTH(7, 1)
DEF_VBLK_BOTH(8, 1)
DEF_VBLK_BOTH(1, 8)
DEF_VBLK_BOTH(2, 4)
DEF_VBLK_BOTH(3, 2)
DEF_VBLK_BOTH(4, 2)

typedef void (*vblk_fn)(float *out, size_t out_stride, const void *v, int64_t stride, int n_j, int c0,
                        const float *scores, size_t n_kv);
/* CB chunks at a time for R rows: [f16][R - 1], CB = vblk_cb[R - 1]; the
 * chunks left over (d not a multiple of 8 * CB) go one at a time. */
static const vblk_fn vblk_wide[2][8] = {
    { vblk_f32_1x8, vblk_f32_2x4, vblk_f32_3x2, vblk_f32_4x2, vblk_f32_5x1, vblk_f32_6x1, vblk_f32_7x1,
      vblk_f32_8x1 },
    { vblk_f16_1x8, vblk_f16_2x4, vblk_f16_3x2, vblk_f16_4x2, vblk_f16_5x1, vblk_f16_6x1, vblk_f16_7x1,
      vblk_f16_8x1 },
};
static const vblk_fn vblk_one[2][8] = {
    { vblk_f32_1x1, vblk_f32_2x1, vblk_f32_3x1, vblk_f32_4x1, vblk_f32_5x1, vblk_f32_6x1, vblk_f32_7x1,
      vblk_f32_8x1 },
    { vblk_f16_1x1, vblk_f16_2x1, vblk_f16_3x1, vblk_f16_4x1, vblk_f16_5x1, vblk_f16_6x1, vblk_f16_7x1,
      vblk_f16_8x1 },
};
static const int vblk_cb[8] = { 8, 4, 2, 2, 1, 1, 1, 1 };

void ops_avx2_attention_rows(float *out, size_t out_stride, const float *q, size_t q_stride, int nq,
                             const void *k, int k_f16, const void *v, int v_f16, int64_t stride,
                             int d, int pos0, float scale, float *scores, const float *f16_tab)
{
    if (d % 8 != 0) {   /* not a real head size: the per-row kernel, same bits */
        for (int r = 0; r < nq; r++)
            ops_avx2_attention(out + (size_t)r * out_stride, q + (size_t)r * q_stride, k, k_f16, v, v_f16,
                               stride, d, pos0 + r + 1, scale, scores, f16_tab);
        return;
    }
    for (; nq > OPS_ATTN_TILE; nq -= OPS_ATTN_TILE, pos0 += OPS_ATTN_TILE) {   /* see ops_attention_rows */
        ops_avx2_attention_rows(out, out_stride, q, q_stride, OPS_ATTN_TILE, k, k_f16, v, v_f16, stride, d,
                                pos0, scale, scores, f16_tab);
        out += OPS_ATTN_TILE * out_stride;
        q += OPS_ATTN_TILE * q_stride;
    }
    const size_t n_kv = (size_t)pos0 + (size_t)nq;   /* n_kv_max */
    const int f16 = k_f16 != 0;
    float max[OPS_ATTN_TILE];
    for (int r = 0; r < nq; r++) max[r] = -INFINITY;

    /* K rows 0..pos0 are seen by every row: groups of up to 8 rows, each
     * walking the positions in blocks of P then singly. */
    for (int g = 0; g < nq; g += 8) {
        const int R = nq - g < 8 ? nq - g : 8, P = blk_p[R - 1];
        const float *qg = q + (size_t)g * q_stride;
        float *sg = scores + (size_t)g * n_kv;
        int j = 0;
        for (; j + P <= pos0 + 1; j += P)
            dots_blk[f16][R - 1](qg, q_stride, k, stride, j, d, scale, sg, n_kv, max + g);
        for (; j <= pos0; j++) dots_col[f16][R - 1](qg, q_stride, k, stride, j, d, scale, sg, n_kv, max + g);
    }
    /* K rows pos0+1 .. pos0+nq-1 (this tile's own): rows j - pos0 .. nq-1. */
    for (int j = pos0 + 1; j < (int)n_kv; j++)
        for (int g = j - pos0; g < nq; g += 8) {
            const int R = nq - g < 8 ? nq - g : 8;
            dots_col[f16][R - 1](q + (size_t)g * q_stride, q_stride, k, stride, j, d, scale,
                                 scores + (size_t)g * n_kv, n_kv, max + g);
        }

    for (int r = 0; r < nq; r++) {
        float *sr = scores + (size_t)r * n_kv;
        const int n = pos0 + r + 1;
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            const float p = expf(sr[j] - max[r]);
            sum += (double)p;
            sr[j] = p;
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++) sr[j] *= inv;   /* ops_avx2_attention's p = scores[j] * inv */
    }

    /* V rows 0..pos0 into registers, then stored: every out element is
     * written here (this replaces the memset of the per-row kernel). */
    const int vf = v_f16 != 0;
    for (int g = 0; g < nq; g += 8) {
        const int R = nq - g < 8 ? nq - g : 8, CB = vblk_cb[R - 1];
        float *og = out + (size_t)g * out_stride;
        const float *sg = scores + (size_t)g * n_kv;
        int c0 = 0;
        for (; c0 + 8 * CB <= d; c0 += 8 * CB)
            vblk_wide[vf][R - 1](og, out_stride, v, stride, pos0 + 1, c0, sg, n_kv);
        for (; c0 < d; c0 += 8) vblk_one[vf][R - 1](og, out_stride, v, stride, pos0 + 1, c0, sg, n_kv);
    }
    /* V rows pos0+1 .. pos0+nq-1, in order, into rows j - pos0 .. nq-1. */
    for (int j = pos0 + 1; j < (int)n_kv; j++) {
        const int r0 = j - pos0;
        if (v_f16) vacc_f16(out, out_stride, (const uint16_t *)v + j * stride, d, r0, nq, scores, n_kv, j);
        else       vacc_f32(out, out_stride, (const float *)v + j * stride, d, r0, nq, scores, n_kv, j);
    }
}

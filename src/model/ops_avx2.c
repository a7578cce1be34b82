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

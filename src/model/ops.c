/* ops: see ops.h for the numerics each helper follows. */
#include "model/ops.h"

#include <math.h>
#include <string.h>

#include "util/cpu.h"
#include "util/fp16.h"

void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void ops_rope_cache(float *cache, int n_rot, int32_t pos, float freq_base, float freq_scale)
{
    const float theta_scale = powf(freq_base, -2.0f / n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        const float t = freq_scale * theta;
        cache[2 * i + 0] = cosf(t);
        cache[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

void ops_rope_neox(float *x, int n_rot, const float *cache)
{
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const float c = cache[2 * i], s = cache[2 * i + 1];
        const float x0 = x[i], x1 = x[i + half];
        x[i]        = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

void ops_softmax(float *x, int n)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        x[i] = v;
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

float ops_silu(float x)
{
    return x / (1.0f + expf(-x));
}

void ops_swiglu(float *h, const float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) h[i] = ops_silu(g[i]) * u[i];
}

void ops_topk(const float *x, int n, int k, int32_t *ids)
{
    /* Insertion into a descending list of at most k: a new value goes after
     * every kept value >= it, so among equal values the lower index stays
     * first. O(n k), and k is small (experts used per token). */
    int m = 0;
    for (int i = 0; i < n; i++) {
        const float v = x[i];
        if (m == k && !(v > x[ids[k - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > x[ids[j - 1]]) { ids[j] = ids[j - 1]; j--; }
        ids[j] = i;
    }
}

/* Combine the 8 lanes in a fixed tree: ((0+4)+(2+6)) + ((1+5)+(3+7)). */
static inline float lanes_sum(const float *a)
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

float ops_dot_f32(const float *a, const float *b, int n)
{
    float acc[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return lanes_sum(acc);
}

float ops_dot_f16(const uint16_t *a, const float *b, int n, const float *tab)
{
    float acc[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += tab[a[i + l]] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += tab[a[i]] * b[i];
    return lanes_sum(acc);
}

void ops_f16_table_init(float *tab)
{
    for (uint32_t h = 0; h < 65536; h++) tab[h] = fp16_to_fp32((uint16_t)h);
}

void ops_attention(float *out, const float *q, const void *k, int k_f16, const void *v, int v_f16,
                   int64_t stride, int d, int n_kv, float scale, float *scores, const float *tab)
{
    float max = -INFINITY;
    for (int j = 0; j < n_kv; j++) {
        float s = k_f16 ? ops_dot_f16((const uint16_t *)k + j * stride, q, d, tab)
                        : ops_dot_f32((const float *)k + j * stride, q, d);
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
        if (v_f16) {
            const uint16_t *vr = (const uint16_t *)v + j * stride;
            for (int i = 0; i < d; i++) out[i] += p * tab[vr[i]];
        } else {
            const float *vr = (const float *)v + j * stride;
            for (int i = 0; i < d; i++) out[i] += p * vr[i];
        }
    }
}

/* The reference tile (see ops.h): the same dots, softmax and position-order
 * sums as ops_attention, visited K-row-major / V-row-major across the rows
 * of the tile. Per row, every float operation and its order is
 * ops_attention's: dots in position order (the running max too), then the
 * softmax, then out += p_j * v_j for j = 0, 1, ... . */
void ops_attention_rows(float *out, size_t out_stride, const float *q, size_t q_stride, int nq,
                        const void *k, int k_f16, const void *v, int v_f16, int64_t stride,
                        int d, int pos0, float scale, float *scores, const float *tab)
{
    /* Longer runs are consecutive tiles; each needs at most the scratch
     * of the last one (its n_kv_max is the largest). */
    for (; nq > OPS_ATTN_TILE; nq -= OPS_ATTN_TILE, pos0 += OPS_ATTN_TILE) {
        ops_attention_rows(out, out_stride, q, q_stride, OPS_ATTN_TILE, k, k_f16, v, v_f16, stride, d, pos0,
                           scale, scores, tab);
        out += OPS_ATTN_TILE * out_stride;
        q += OPS_ATTN_TILE * q_stride;
    }
    const int n_kv = pos0 + nq;   /* n_kv_max: row r sees pos0 + r + 1 positions */
    float max[OPS_ATTN_TILE];
    for (int r = 0; r < nq; r++) max[r] = -INFINITY;
    for (int j = 0; j < n_kv; j++) {
        const int r0 = j > pos0 ? j - pos0 : 0;   /* first row that sees j */
        for (int r = r0; r < nq; r++) {
            const float *qr = q + (size_t)r * q_stride;
            float s = k_f16 ? ops_dot_f16((const uint16_t *)k + j * stride, qr, d, tab)
                            : ops_dot_f32((const float *)k + j * stride, qr, d);
            s *= scale;
            scores[(size_t)r * n_kv + j] = s;
            max[r] = s > max[r] ? s : max[r];
        }
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
        for (int j = 0; j < n; j++) sr[j] *= inv;
        memset(out + (size_t)r * out_stride, 0, sizeof(float) * (size_t)d);
    }
    for (int j = 0; j < n_kv; j++) {
        const int r0 = j > pos0 ? j - pos0 : 0;
        for (int r = r0; r < nq; r++) {
            const float p = scores[(size_t)r * n_kv + j];
            float *o = out + (size_t)r * out_stride;
            if (v_f16) {
                const uint16_t *vr = (const uint16_t *)v + j * stride;
                for (int i = 0; i < d; i++) o[i] += p * tab[vr[i]];
            } else {
                const float *vr = (const float *)v + j * stride;
                for (int i = 0; i < d; i++) o[i] += p * vr[i];
            }
        }
    }
}

void ops_kernels_get(int isa, ops_kernels *out)
{
    const int avx2 = isa >= CPU_ISA_AVX2;
    out->attention      = avx2 ? ops_avx2_attention : ops_attention;
    out->attention_rows = avx2 ? ops_avx2_attention_rows : ops_attention_rows;
}

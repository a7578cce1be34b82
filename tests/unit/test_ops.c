/* test_ops: the forward pass's scalar helpers (model/ops.h) against naive
 * float64 versions, plus the ggml-specific details they promise (RoPE's
 * iterative theta, softmax's double sum, top-k tie order). */
#include "testhelp.h"

#include <stdint.h>

#include "model/ops.h"
#include "util/cpu.h"
#include "util/fp16.h"

static uint64_t rng_state = 88172645463325252ull;
static double urand(void)   /* xorshift64: [0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float frand(float a) { return (float)((urand() * 2.0 - 1.0) * a); }

TEST(rmsnorm_matches_f64)
{
    for (int n = 1; n <= 4096; n *= 4) {
        float x[4096], w[4096], y[4096];
        for (int i = 0; i < n; i++) { x[i] = frand(3.0f); w[i] = 1.0f + frand(0.2f); }
        ops_rmsnorm(y, x, w, n, 1e-6f);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double inv = 1.0 / sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++) CHECK_NEAR(y[i], x[i] * inv * w[i], 1e-5 * fabs(x[i] * inv * w[i]) + 1e-7);
        ops_rmsnorm(x, x, w, n, 1e-6f);   /* in place gives the same */
        for (int i = 0; i < n; i++) CHECK(x[i] == y[i]);
    }
}

TEST(rope_cache_matches_f64)
{
    /* ggml multiplies theta by theta_scale in float; the error grows with the
     * position and the pair index, so the tolerance scales with pos. */
    const int n_rot = 128;
    float cache[128];
    const int pos_list[] = { 0, 1, 7, 100, 1000, 4095 };
    for (size_t k = 0; k < sizeof pos_list / sizeof pos_list[0]; k++) {
        int pos = pos_list[k];
        ops_rope_cache(cache, n_rot, pos, 1000000.0f, 0.5f);
        for (int i = 0; i < n_rot / 2; i++) {
            double th = 0.5 * pos * pow(1000000.0, -2.0 * i / n_rot);
            CHECK_NEAR(cache[2 * i], cos(th), 2e-6 * (1 + pos));
            CHECK_NEAR(cache[2 * i + 1], sin(th), 2e-6 * (1 + pos));
        }
    }
    ops_rope_cache(cache, n_rot, 0, 10000.0f, 1.0f);
    for (int i = 0; i < n_rot / 2; i++) { CHECK(cache[2 * i] == 1.0f); CHECK(cache[2 * i + 1] == 0.0f); }
}

TEST(rope_neox_rotates_pairs)
{
    const int n = 16;
    float x[16], y[16], cache[16];
    for (int i = 0; i < n; i++) x[i] = y[i] = frand(1.0f);
    ops_rope_cache(cache, n, 37, 10000.0f, 1.0f);
    ops_rope_neox(y, n, cache);
    for (int i = 0; i < n / 2; i++) {
        double c = cache[2 * i], s = cache[2 * i + 1];
        CHECK_NEAR(y[i], x[i] * c - x[i + n / 2] * s, 1e-6);
        CHECK_NEAR(y[i + n / 2], x[i] * s + x[i + n / 2] * c, 1e-6);
        /* a rotation keeps each pair's length */
        CHECK_NEAR(hypot(y[i], y[i + n / 2]), hypot(x[i], x[i + n / 2]), 1e-6);
    }
}

TEST(softmax_matches_f64)
{
    float x[300];
    double ref[300];
    for (int n = 1; n <= 300; n += 37) {
        for (int i = 0; i < n; i++) x[i] = frand(20.0f);
        double mx = -1e300, sum = 0;
        for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int i = 0; i < n; i++) { ref[i] = exp(x[i] - mx); sum += ref[i]; }
        ops_softmax(x, n);
        double tot = 0;
        for (int i = 0; i < n; i++) { CHECK_NEAR(x[i], ref[i] / sum, 1e-6 * ref[i] / sum + 1e-12); tot += x[i]; }
        CHECK_NEAR(tot, 1.0, 1e-5);
    }
    float big[3] = { 1000.0f, 999.0f, -1000.0f };   /* max subtraction: no overflow */
    ops_softmax(big, 3);
    CHECK_NEAR(big[0], 1.0 / (1.0 + exp(-1.0)), 1e-6);
    CHECK(big[2] == 0.0f);
}

TEST(silu_swiglu)
{
    float g[64], u[64], h[64];
    for (int i = 0; i < 64; i++) { g[i] = frand(8.0f); u[i] = frand(2.0f); }
    ops_swiglu(h, g, u, 64);
    for (int i = 0; i < 64; i++) {
        double s = g[i] / (1.0 + exp(-(double)g[i]));
        CHECK_NEAR(h[i], s * u[i], 1e-6 * fabs(s * u[i]) + 1e-7);
    }
    CHECK(ops_silu(0.0f) == 0.0f);
}

TEST(topk_order_and_ties)
{
    const float x[8] = { 0.1f, 0.5f, 0.3f, 0.5f, 0.9f, 0.3f, 0.0f, 0.5f };
    int32_t ids[8];
    ops_topk(x, 8, 4, ids);
    CHECK_EQ_INT(ids[0], 4);
    CHECK_EQ_INT(ids[1], 1);   /* three 0.5s: lower index first */
    CHECK_EQ_INT(ids[2], 3);
    CHECK_EQ_INT(ids[3], 7);
    ops_topk(x, 8, 8, ids);
    const int32_t want[8] = { 4, 1, 3, 7, 2, 5, 0, 6 };
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(ids[i], want[i]);
    ops_topk(x, 8, 1, ids);
    CHECK_EQ_INT(ids[0], 4);
}

TEST(dots_match_f64)
{
    static float tab[65536];
    ops_f16_table_init(tab);
    for (int h = 0; h < 65536; h += 97) {
        float f = fp16_to_fp32((uint16_t)h);
        CHECK((f != f && tab[h] != tab[h]) || tab[h] == f);
    }
    for (int n = 1; n <= 200; n += 13) {
        float a[200], b[200];
        uint16_t ah[200];
        double ref = 0, refh = 0, mag = 0;
        for (int i = 0; i < n; i++) {
            a[i] = frand(2.0f); b[i] = frand(2.0f);
            ah[i] = fp32_to_fp16(a[i]);
            ref += (double)a[i] * b[i];
            refh += (double)fp16_to_fp32(ah[i]) * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        CHECK_NEAR(ops_dot_f32(a, b, n), ref, 1e-6 * mag + 1e-7);
        CHECK_NEAR(ops_dot_f16(ah, b, n, tab), refh, 1e-6 * mag + 1e-7);
    }
}

static void attention_case(int f16, int d, int n_kv, int stride)
{
    static float tab[65536];
    static int init;
    if (!init) { ops_f16_table_init(tab); init = 1; }
    float q[128], out[128], scores[512];
    static float kf[512 * 160], vf[512 * 160];
    static uint16_t kh[512 * 160], vh[512 * 160];
    for (int i = 0; i < d; i++) q[i] = frand(1.0f);
    for (int j = 0; j < n_kv * stride; j++) {
        kf[j] = frand(1.0f); vf[j] = frand(1.0f);
        kh[j] = fp32_to_fp16(kf[j]); vh[j] = fp32_to_fp16(vf[j]);
        if (f16) { kf[j] = fp16_to_fp32(kh[j]); vf[j] = fp16_to_fp32(vh[j]); }
    }
    const float scale = 1.0f / sqrtf((float)d);
    ops_attention(out, q, f16 ? (const void *)kh : (const void *)kf, f16,
                  f16 ? (const void *)vh : (const void *)vf, f16, stride, d, n_kv, scale, scores, tab);
    double s[512], mx = -1e300, sum = 0;
    for (int j = 0; j < n_kv; j++) {
        double t = 0;
        for (int i = 0; i < d; i++) t += (double)q[i] * kf[j * stride + i];
        s[j] = t / sqrt((double)d);
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j < n_kv; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
    for (int i = 0; i < d; i++) {
        double o = 0;
        for (int j = 0; j < n_kv; j++) o += s[j] / sum * vf[j * stride + i];
        CHECK_NEAR(out[i], o, 2e-6);
    }
}

TEST(attention_matches_f64)
{
    attention_case(0, 16, 1, 16);
    attention_case(0, 128, 300, 160);
    attention_case(1, 128, 300, 128);
    attention_case(1, 64, 512, 160);
    attention_case(0, 12, 7, 24);   /* head size not a multiple of 8 */
}

/* The AVX2 kernels return the scalar reference's exact bits. */
TEST(avx2_matches_scalar_bits)
{
    if (cpu_best_isa() < CPU_ISA_AVX2) return;   /* nothing to compare on this CPU */
    static float tab[65536];
    ops_f16_table_init(tab);
    static float kf[300 * 136], vf[300 * 136];
    static uint16_t kh[300 * 136], vh[300 * 136];
    float q[136], o1[136], o2[136], s1[300], s2[300];
    const int dims[] = { 8, 12, 64, 128, 136 };
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        const int d = dims[t], n_kv = 300, stride = 136;
        for (int i = 0; i < d; i++) q[i] = frand(1.0f);
        for (int j = 0; j < n_kv * stride; j++) {
            kf[j] = frand(1.0f); vf[j] = frand(1.0f);
            kh[j] = fp32_to_fp16(kf[j]); vh[j] = fp32_to_fp16(vf[j]);
        }
        CHECK(ops_dot_f32(kf, q, d) == ops_avx2_dot_f32(kf, q, d));
        CHECK(ops_dot_f16(kh, q, d, tab) == ops_avx2_dot_f16(kh, q, d));
        for (int mode = 0; mode < 4; mode++) {
            const int k16 = mode & 1, v16 = mode >> 1;
            const void *k = k16 ? (const void *)kh : (const void *)kf, *v = v16 ? (const void *)vh : (const void *)vf;
            ops_attention(o1, q, k, k16, v, v16, stride, d, n_kv, 0.125f, s1, tab);
            ops_avx2_attention(o2, q, k, k16, v, v16, stride, d, n_kv, 0.125f, s2, tab);
            CHECK(memcmp(o1, o2, sizeof(float) * (size_t)d) == 0);
        }
    }
}

/* ops_attention_rows (and its AVX2 twin): row i of a tile at pos0 is
 * memcmp-identical to ops_attention over pos0 + i + 1 positions, for every
 * tile size, head size and K/V type; the AVX2 tile equals the scalar one.
 * Rows are laid out with gaps (q_stride, out_stride > d) whose sentinels
 * must survive, and the KV rows are strided like a cache with 2 KV heads
 * (this head is the second). */
#define AR_MAXPOS 340
#define AR_MAXD   256
#define AR_STRIDE (2 * AR_MAXD)
static int rows_case(ops_attention_rows_fn fn, int f16, int d, int pos0, int nq, const float *tab)
{
    static float kf[AR_MAXPOS * AR_STRIDE], vf[AR_MAXPOS * AR_STRIDE];
    static uint16_t kh[AR_MAXPOS * AR_STRIDE], vh[AR_MAXPOS * AR_STRIDE];
    static float q[3 * OPS_ATTN_TILE * (AR_MAXD + 8)], out[3 * OPS_ATTN_TILE * (AR_MAXD + 8)], ref[AR_MAXD];
    static float scores[OPS_ATTN_TILE * AR_MAXPOS], s1[AR_MAXPOS];
    const size_t qs = (size_t)d + 5, os = (size_t)d + 3;   /* odd row gaps */
    const int n_kv = pos0 + nq, stride = AR_STRIDE, off = d;
    if (n_kv > AR_MAXPOS || d > AR_MAXD || nq > 3 * OPS_ATTN_TILE) return 0;
    /* non-trivial magnitudes: |q.k| * scale reaches several units, so the
     * softmax is neither flat nor one-hot */
    for (int j = 0; j < n_kv * stride; j++) {
        kf[j] = frand(2.5f); vf[j] = frand(4.0f);
        kh[j] = fp32_to_fp16(kf[j]); vh[j] = fp32_to_fp16(vf[j]);
    }
    for (size_t i = 0; i < (size_t)nq * qs; i++) q[i] = frand(2.5f);
    for (size_t i = 0; i < (size_t)nq * os; i++) out[i] = 12345.0f;
    const void *k = f16 ? (const void *)(kh + off) : (const void *)(kf + off);
    const void *v = f16 ? (const void *)(vh + off) : (const void *)(vf + off);
    const float scale = 1.0f / sqrtf((float)d);
    fn(out, os, q, qs, nq, k, f16, v, f16, stride, d, pos0, scale, scores, tab);
    int bad = 0;
    for (int i = 0; i < nq; i++) {
        ops_attention(ref, q + (size_t)i * qs, k, f16, v, f16, stride, d, pos0 + i + 1, scale, s1, tab);
        bad += memcmp(ref, out + (size_t)i * os, sizeof(float) * (size_t)d) != 0;
        for (size_t g = (size_t)d; g < os; g++) bad += out[(size_t)i * os + g] != 12345.0f;
        /* a convex mix of |v| <= 4 (f16 may round to 4.0) */
        for (int t = 0; t < d; t++) bad += !(fabsf(ref[t]) <= 4.001f);
    }
    return bad;
}

TEST(attention_rows_match_per_row_bits)
{
    static float tab[65536];
    ops_f16_table_init(tab);
    ops_attention_rows_fn fns[2] = { ops_attention_rows, NULL };
    if (cpu_best_isa() >= CPU_ISA_AVX2) fns[1] = ops_avx2_attention_rows;
    const int dims[] = { 64, 128, 256 }, pos_list[] = { 0, 1, 37, 300 };
    int cases = 0;
    for (int impl = 0; impl < 2; impl++) {
        if (!fns[impl]) continue;
        for (int f16 = 0; f16 < 2; f16++)
            for (size_t t = 0; t < 3; t++)
                for (size_t pi = 0; pi < 4; pi++)
                    for (int nq = 1; nq <= OPS_ATTN_TILE; nq++) {
                        int bad = rows_case(fns[impl], f16, dims[t], pos_list[pi], nq, tab);
                        CHECK_MSG(bad == 0, "impl %d f16 %d d %d pos0 %d nq %d: %d bad", impl, f16, dims[t],
                                  pos_list[pi], nq, bad);
                        cases++;
                    }
        /* beyond the contract's shapes: d not a multiple of 8, and nq over
         * the tile (run as consecutive tiles) */
        for (int f16 = 0; f16 < 2; f16++) {
            CHECK(rows_case(fns[impl], f16, 12, 37, 3, tab) == 0);
            CHECK(rows_case(fns[impl], f16, 64, 5, 2 * OPS_ATTN_TILE + 3, tab) == 0);
        }
    }
    CHECK(cases >= 2 * 3 * 4 * OPS_ATTN_TILE);
    ops_kernels kern;
    ops_kernels_get(cpu_best_isa(), &kern);
    CHECK(kern.attention_rows == (cpu_best_isa() >= CPU_ISA_AVX2 ? ops_avx2_attention_rows : ops_attention_rows));
    ops_kernels_get(CPU_ISA_SCALAR, &kern);
    CHECK(kern.attention_rows == ops_attention_rows);
}

/* The AVX2 tile returns the scalar tile's bits (mixed K/V types too). */
TEST(avx2_rows_match_scalar_bits)
{
    if (cpu_best_isa() < CPU_ISA_AVX2) return;
    static float tab[65536];
    ops_f16_table_init(tab);
    static float kf[80 * 128], vf[80 * 128];
    static uint16_t kh[80 * 128], vh[80 * 128];
    static float q[OPS_ATTN_TILE * 128], o1[OPS_ATTN_TILE * 128], o2[OPS_ATTN_TILE * 128];
    static float s1[OPS_ATTN_TILE * 80], s2[OPS_ATTN_TILE * 80];
    const int d = 128, pos0 = 70;
    for (int j = 0; j < 80 * 128; j++) {
        kf[j] = frand(3.0f); vf[j] = frand(3.0f);
        kh[j] = fp32_to_fp16(kf[j]); vh[j] = fp32_to_fp16(vf[j]);
    }
    for (int i = 0; i < OPS_ATTN_TILE * d; i++) q[i] = frand(3.0f);
    for (int mode = 0; mode < 4; mode++) {
        const int k16 = mode & 1, v16 = mode >> 1;
        const void *k = k16 ? (const void *)kh : (const void *)kf, *v = v16 ? (const void *)vh : (const void *)vf;
        for (int nq = 1; nq <= OPS_ATTN_TILE; nq++) {
            ops_attention_rows(o1, (size_t)d, q, (size_t)d, nq, k, k16, v, v16, d, d, pos0, 0.09f, s1, tab);
            ops_avx2_attention_rows(o2, (size_t)d, q, (size_t)d, nq, k, k16, v, v16, d, d, pos0, 0.09f, s2, tab);
            CHECK_MSG(memcmp(o1, o2, sizeof(float) * (size_t)(nq * d)) == 0, "mode %d nq %d", mode, nq);
        }
    }
}

int main(void)
{
    RUN(rmsnorm_matches_f64);
    RUN(rope_cache_matches_f64);
    RUN(rope_neox_rotates_pairs);
    RUN(softmax_matches_f64);
    RUN(silu_swiglu);
    RUN(topk_order_and_ties);
    RUN(dots_match_f64);
    RUN(attention_matches_f64);
    RUN(avx2_matches_scalar_bits);
    RUN(attention_rows_match_per_row_bits);
    RUN(avx2_rows_match_scalar_bits);
    return test_summary("ops");
}

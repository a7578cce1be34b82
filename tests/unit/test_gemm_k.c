/* Unit tests for the blocked AVX2 K-quant matmul kernels
 * (src/quant/quant_gemm_k_avx2.c, quant.h quant_gemm_fn).
 *
 * What is checked, and against what: for each K-quant type (Q2_K Q3_K Q4_K
 * Q5_K Q6_K) whose AVX2 quant_ops has a gemm kernel, every output
 *   y[c * ldy + r] = gemm(w, a)
 * must equal, bit for bit (memcmp of the floats), the AVX2 single-row dot
 * ops.dot(n, w + r * wstride, a + c * astride), and quant_gemm with the
 * kernel removed (.gemm = NULL, the plain dot loop: the scalar reference of
 * every gemm kernel) must give the same bits. Outputs outside the nw x na
 * block (the ldy padding) must stay untouched.
 *
 * Inputs: weights quantized from random floats with ops.quant (what files
 * hold) and, in half the rows, random block bytes with sane fp16 scales
 * (every quant and sub-block scale value, including the extremes the
 * quantizers rarely produce); Q8_K activations from random floats with the
 * dot type's act_quant. Shapes: nw and na over 1 2 3 4 5 7 8 9 13 17 (every
 * remainder of the 4-row activation blocks), n in 256 512 768 2048 4096, with
 * padded strides (wstride > row bytes, astride > activation row bytes,
 * ldy > nw); plus, for n = 256, 768 and 4096, shapes with more weight rows
 * than one cache chunk (the kernels take a chunk's rows in one call) and
 * ragged activation groups, and rows of 128 and 129 super-blocks (the
 * kernels' table limit).
 *
 * Without AVX2 + FMA + F16C the kernels cannot run: each case passes with a
 * note. A type without a kernel yet is noted and skipped. */
#include "testhelp.h"

#include <stdint.h>
#include "quant/quant.h"

typedef struct rng { uint64_t s; } rng;

static uint64_t rng_u64(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(rng *r) { return (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
static double rng_gauss(rng *r)
{
    double u = rng_unif(r), v = rng_unif(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Gaussian values whose scale changes every 32, with rare outliers. */
static void gen_floats(rng *r, float *x, int64_t n)
{
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = exp(rng_gauss(r) * 1.5);
        double v = rng_gauss(r) * scale;
        if (rng_unif(r) < 0.01) v *= 8;
        x[i] = (float)v;
    }
}

static const int k_types[] = { QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_Q5_K, QTYPE_Q2_K, QTYPE_Q3_K };
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
static const int k_sizes[] = { 1, 2, 3, 4, 5, 7, 8, 9, 13, 17 };
#define N_SIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))
/* 256 512 768: the MoE down projections' short rows (expert hidden sizes:
 * one to three super-blocks, where the kernels' per-row fixed work is
 * largest); 2048 4096: long rows. */
static const int64_t k_ns[] = { 256, 512, 768, 2048, 4096 };
#define N_NS ((int)(sizeof k_ns / sizeof k_ns[0]))

static int have_avx2(void)
{
    cpu_features f = cpu_detect();
    return f.avx2 && f.fma && f.f16c;
}

static size_t row_bytes(int t, int64_t n) { return (size_t)(n / qtype_get(t)->blck) * (size_t)qtype_get(t)->type_size; }

/* Offsets of the fp16 super-block scales in each block (little-endian). */
static void put_scales(rng *r, int t, uint8_t *b)
{
    static const uint16_t h[] = { 0x3C00, 0xBC00, 0x2E66, 0x1A00, 0x3555, 0x0000, 0x2000 };
    int off[2] = { -1, -1 };
    switch (t) {
    case QTYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case QTYPE_Q3_K: off[0] = 108; break;
    case QTYPE_Q4_K: case QTYPE_Q5_K: off[0] = 0; off[1] = 2; break;
    case QTYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
    for (int k = 0; k < 2; k++) {
        if (off[k] < 0) continue;
        const uint16_t v = h[rng_u64(r) % (sizeof h / sizeof h[0])];
        b[off[k]] = (uint8_t)v;
        b[off[k] + 1] = (uint8_t)(v >> 8);
    }
}

/* Weight rows: quantized from random floats (even rows) or random bytes with
 * sane scales (odd rows). */
static void make_weights(rng *r, const quant_ops *ops, int64_t n, int nw, uint8_t *w, size_t wstride, float *tmp)
{
    const int t = ops->type, sz = qtype_get(t)->type_size;
    memset(w, 0xA5, wstride * (size_t)nw);
    for (int k = 0; k < nw; k++) {
        uint8_t *row = w + (size_t)k * wstride;
        if (k % 2 == 0) {
            gen_floats(r, tmp, n);
            ops->quant(tmp, row, n);
        } else {
            for (size_t i = 0; i < row_bytes(t, n); i++) row[i] = (uint8_t)rng_u64(r);
            for (int64_t b = 0; b < n / 256; b++) put_scales(r, t, row + b * sz);
        }
    }
}

static void make_acts(rng *r, const quant_ops *aops, int64_t n, int na, uint8_t *a, size_t astride, float *tmp)
{
    memset(a, 0x5A, astride * (size_t)na);
    for (int c = 0; c < na; c++) {
        gen_floats(r, tmp, n);
        aops->act_quant(tmp, a + (size_t)c * astride, n);
    }
}

/* Runs one shape; returns the number of mismatching outputs (0 = pass). */
static int check_shape(const quant_ops *ops, const uint8_t *w, size_t wstride, int nw, const uint8_t *a,
                       size_t astride, int na, int64_t n, float *y, float *y2, size_t ldy)
{
    const float sentinel = -12345.678f;
    for (size_t i = 0; i < (size_t)na * ldy; i++) y[i] = y2[i] = sentinel;
    quant_gemm(ops, n, w, wstride, nw, a, astride, na, y, ldy);
    quant_ops loop = *ops;
    loop.gemm = NULL;
    quant_gemm(&loop, n, w, wstride, nw, a, astride, na, y2, ldy);
    int bad = 0;
    for (int c = 0; c < na; c++)
        for (size_t r = 0; r < ldy; r++) {
            const size_t o = (size_t)c * ldy + r;
            if ((int)r >= nw) {
                if (memcmp(&y[o], &sentinel, 4) || memcmp(&y2[o], &sentinel, 4)) bad++;
                continue;
            }
            const float want = ops->dot(n, w + r * wstride, a + (size_t)c * astride);
            if (memcmp(&y[o], &want, 4) || memcmp(&y2[o], &want, 4)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s n=%lld nw=%d na=%d r=%zu c=%d: gemm %.9g loop %.9g dot %.9g\n",
                            qtype_name(ops->type), (long long)n, nw, na, r, c, y[o], y2[o], want);
            }
        }
    return bad;
}

static int g_have_avx2;

static void run_type(int t, cpu_isa isa)
{
    quant_ops ops, aops;
    if (!g_have_avx2) {
        fprintf(stderr, "  note: no AVX2+FMA+F16C on this CPU: %s gemm not run\n", qtype_name(t));
        return;
    }
    CHECK(quant_ops_get(t, isa, &ops, NULL) == 0);
    CHECK(quant_ops_get(ops.dot_type, isa, &aops, NULL) == 0);
    if (!ops.gemm) {
        fprintf(stderr, "  note: %s has no AVX2 gemm kernel yet: skipped\n", qtype_name(t));
        return;
    }
    rng r = { 0x1234u + (uint64_t)t };
    const int maxr = 17;
    const int64_t maxn = 4096;
    /* Padded strides, kept multiples of 4 so every block struct stays
     * naturally aligned (the dots read fields through the structs). */
    const size_t wstride = row_bytes(t, maxn) + 36, astride = row_bytes(ops.dot_type, maxn) + 68;
    const size_t ldy = (size_t)maxr + 3;
    uint8_t *w = malloc(wstride * maxr), *a = malloc(astride * maxr);
    float *tmp = malloc(sizeof(float) * maxn);
    float *y = malloc(sizeof(float) * ldy * maxr), *y2 = malloc(sizeof(float) * ldy * maxr);
    CHECK(w && a && tmp && y && y2);
    if (!(w && a && tmp && y && y2)) goto done;
    for (int in = 0; in < N_NS; in++) {
        const int64_t n = k_ns[in];
        make_weights(&r, &ops, n, maxr, w, wstride, tmp);
        make_acts(&r, &aops, n, maxr, a, astride, tmp);
        for (int iw = 0; iw < N_SIZES; iw++)
            for (int ia = 0; ia < N_SIZES; ia++) {
                const int nw = k_sizes[iw], na = k_sizes[ia];
                /* ldy varies too: tight (nw) or padded (nw + 3). */
                const size_t ld = (iw + ia) % 2 ? (size_t)nw : (size_t)nw + 3;
                const int bad = check_shape(&ops, w, wstride, nw, a, astride, na, n, y, y2, ld);
                CHECK_MSG(bad == 0, "%s n=%lld nw=%d na=%d ldy=%zu: %d outputs differ", qtype_name(t),
                          (long long)n, nw, na, ld, bad);
            }
    }
done:
    free(w); free(a); free(tmp); free(y); free(y2);
}

/* More weight rows than one cache chunk (several chunks, ragged last one:
 * a chunk is about 128 KB of weights, so at n = 256 even Q2_K's 84-byte
 * rows need > 1560 rows), and many activation rows (several 8-row groups,
 * then a 4 and a ragged rest). */
static void run_type_big(int t, cpu_isa isa)
{
    quant_ops ops, aops;
    if (!g_have_avx2) return;
    CHECK(quant_ops_get(t, isa, &ops, NULL) == 0);
    CHECK(quant_ops_get(ops.dot_type, isa, &aops, NULL) == 0);
    if (!ops.gemm) return;
    static const struct { int64_t n; int nw, na; } shapes[] = { { 256, 1701, 23 }, { 768, 601, 15 }, { 4096, 203, 23 } };
    for (int k = 0; k < 3; k++) {
        rng r = { 0x777u + (uint64_t)t + 1000u * (uint64_t)k };
        const int64_t n = shapes[k].n;
        const int nw = shapes[k].nw, na = shapes[k].na;
        const size_t wstride = row_bytes(t, n) + 4, astride = row_bytes(ops.dot_type, n) + 4, ldy = (size_t)nw + 1;
        uint8_t *w = malloc(wstride * nw), *a = malloc(astride * na);
        float *tmp = malloc(sizeof(float) * n);
        float *y = malloc(sizeof(float) * ldy * na), *y2 = malloc(sizeof(float) * ldy * na);
        CHECK(w && a && tmp && y && y2);
        if (w && a && tmp && y && y2) {
            make_weights(&r, &ops, n, nw, w, wstride, tmp);
            make_acts(&r, &aops, n, na, a, astride, tmp);
            const int bad = check_shape(&ops, w, wstride, nw, a, astride, na, n, y, y2, ldy);
            CHECK_MSG(bad == 0, "%s n=%lld nw=%d na=%d: %d outputs differ", qtype_name(t), (long long)n, nw, na, bad);
        }
        free(w); free(a); free(tmp); free(y); free(y2);
    }
}

/* Rows longer than the kernels' per-group tables (n > 32768: they fall back
 * to the dot loop) and exactly at the limit. */
static void run_type_long(int t, cpu_isa isa)
{
    quant_ops ops, aops;
    if (!g_have_avx2) return;
    CHECK(quant_ops_get(t, isa, &ops, NULL) == 0);
    CHECK(quant_ops_get(ops.dot_type, isa, &aops, NULL) == 0);
    if (!ops.gemm) return;
    rng r = { 0x999u + (uint64_t)t };
    static const int64_t ns[] = { 256 * 128, 256 * 129 };
    const int nw = 3, na = 9;
    for (int k = 0; k < 2; k++) {
        const int64_t n = ns[k];
        const size_t wstride = row_bytes(t, n), astride = row_bytes(ops.dot_type, n), ldy = (size_t)nw;
        uint8_t *w = malloc(wstride * nw), *a = malloc(astride * na);
        float *tmp = malloc(sizeof(float) * n);
        float *y = malloc(sizeof(float) * ldy * na), *y2 = malloc(sizeof(float) * ldy * na);
        CHECK(w && a && tmp && y && y2);
        if (w && a && tmp && y && y2) {
            make_weights(&r, &ops, n, nw, w, wstride, tmp);
            make_acts(&r, &aops, n, na, a, astride, tmp);
            const int bad = check_shape(&ops, w, wstride, nw, a, astride, na, n, y, y2, ldy);
            CHECK_MSG(bad == 0, "%s n=%lld: %d outputs differ", qtype_name(t), (long long)n, bad);
        }
        free(w); free(a); free(tmp); free(y); free(y2);
    }
}

/* Each type on the AVX2 kernels, the AVX-VNNI ones and the AVX-512 ones
 * (on a CPU without them quant_ops_get hands out the next lower level
 * again: a repeat). */
static void gemm_both(int t)
{
    for (int v = 0; v < 3; v++) {
        const cpu_isa isa = v == 2 ? CPU_ISA_AVX512 : v ? CPU_ISA_AVXVNNI : CPU_ISA_AVX2;
        run_type(t, isa);
        run_type_big(t, isa);
        run_type_long(t, isa);
    }
}

TEST(test_gemm_q4_K) { gemm_both(QTYPE_Q4_K); }
TEST(test_gemm_q6_K) { gemm_both(QTYPE_Q6_K); }
TEST(test_gemm_q5_K) { gemm_both(QTYPE_Q5_K); }
TEST(test_gemm_q2_K) { gemm_both(QTYPE_Q2_K); }
TEST(test_gemm_q3_K) { gemm_both(QTYPE_Q3_K); }

/* The dispatch itself: every K-quant's AVX2 ops carries a gemm kernel (this
 * file's subject) and the scalar ops carries none. */
TEST(test_gemm_dispatch)
{
    for (int i = 0; i < N_TYPES; i++) {
        quant_ops ops;
        CHECK(quant_ops_get(k_types[i], CPU_ISA_SCALAR, &ops, NULL) == 0);
        CHECK_MSG(ops.gemm == NULL, "%s: scalar ops has a gemm", qtype_name(k_types[i]));
        if (!g_have_avx2) continue;
        CHECK(quant_ops_get(k_types[i], CPU_ISA_AVX2, &ops, NULL) == 0);
        if (!ops.gemm) fprintf(stderr, "  note: %s: no AVX2 gemm kernel\n", qtype_name(k_types[i]));
        quant_ops v;
        CHECK(quant_ops_get(k_types[i], CPU_ISA_AVXVNNI, &v, NULL) == 0);
        CHECK_MSG(v.gemm != NULL, "%s: AVX-VNNI ops has no gemm", qtype_name(k_types[i]));
        CHECK(quant_ops_get(k_types[i], CPU_ISA_AVX512, &v, NULL) == 0);
        CHECK_MSG(v.gemm != NULL, "%s: AVX-512 ops has no gemm", qtype_name(k_types[i]));
    }
}

int main(void)
{
    g_have_avx2 = have_avx2();
    RUN(test_gemm_dispatch);
    RUN(test_gemm_q4_K);
    RUN(test_gemm_q6_K);
    RUN(test_gemm_q5_K);
    RUN(test_gemm_q2_K);
    RUN(test_gemm_q3_K);
    return test_summary("gemm_k");
}

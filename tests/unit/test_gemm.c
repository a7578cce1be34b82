/* Unit tests for the blocked AVX2 matmul kernels (quant_ops.gemm,
 * src/quant/quant_gemm_avx2.c) of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0.
 *
 * Contract checked (quant.h quant_gemm_fn): for r < nw, c < na
 *   y[c * ldy + r] == ops.dot(n, w + r * wstride, a + c * astride)
 * BIT FOR BIT (memcmp of the floats), where ops = quant_ops_get(type,
 * CPU_ISA_AVX2), and quant_gemm() with gemm = NULL (the plain dot loop) gives
 * the same bits. Shapes: nw, na over awkward sizes (tile remainders), several
 * n (block multiples, plus ragged n for the float types, whose dots have a
 * scalar tail), padded strides (wstride/astride larger than a row, ldy larger
 * than nw), and outputs outside the written area must stay untouched.
 * Weights: random floats quantized with ops.quant (F32: the floats), some
 * rows scaled to large magnitudes (1e4 times, clamped to 6e4) or small (1e-3); activations with
 * the dot type's act_quant. Skipped (counted as passed, with a note) when the
 * CPU lacks AVX2/FMA/F16C. */
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

/* Gaussian row; the scale changes every 32 values, outliers now and then;
 * `mag` scales the whole row. Values are clamped to +-6e4 so every format
 * stays finite (F16 tops out at 65504; the block scales d = amax / 127,
 * amax / 8, ... are halves too). */
static void gen_row(rng *r, float *x, int64_t n, double mag)
{
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = exp(rng_gauss(r) * 1.0);
        double v = rng_gauss(r) * scale * mag;
        if (rng_unif(r) < 0.01) v *= 8;
        if (v > 6e4) v = 6e4;
        if (v < -6e4) v = -6e4;
        x[i] = (float)v;
    }
}

static int have_avx2(void)
{
    cpu_features f = cpu_detect();
    return f.avx2 && f.fma && f.f16c;
}

static size_t row_bytes(int t, int64_t n) { return (size_t)(n / qtype_get(t)->blck) * (size_t)qtype_get(t)->type_size; }

static const int k_types[] = { QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_F16, QTYPE_BF16, QTYPE_F32, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1 };
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
static const int k_sizes[] = { 1, 2, 3, 4, 5, 7, 8, 9, 13, 17 };
#define N_SIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))

#define MAXR 17
/* Extra bytes per row in the padded strides: not multiples of 32 (rows start
 * off any vector alignment) but of 4, so float rows keep their element
 * alignment (as any real F32/F16/BF16 tensor does). */
#define PAD 40

/* Sentinel: a NaN payload no kernel produces, to catch stray writes. */
static const uint32_t k_sentinel = 0x7fc0dead;

/* One type, one n: build MAXR weight and MAXR activation rows, then check
 * every (nw, na) from k_sizes (and both padded and tight strides). Returns
 * the number of mismatching outputs. */
static int check_type_n(int t, int64_t n, rng *g, int padded, cpu_isa isa)
{
    quant_ops ops, ops_loop;
    err e;
    if (quant_ops_get(t, isa, &ops, &e)) return 1;
    ops_loop = ops;
    ops_loop.gemm = NULL;
    const int dt = ops.dot_type;
    quant_ops dops;
    if (quant_ops_get(dt, isa, &dops, &e)) return 1;
    const size_t wrow = row_bytes(t, n), arow = row_bytes(dt, n);
    const size_t wstride = wrow + (padded ? PAD : 0), astride = arow + (padded ? PAD + 4 : 0);
    uint8_t *w = calloc(MAXR, wstride), *a = calloc(MAXR, astride);
    float *x = malloc((size_t)n * sizeof *x);
    const size_t ldy = MAXR + (padded ? 5 : 0);
    float *y = malloc(MAXR * ldy * sizeof *y), *yl = malloc(MAXR * ldy * sizeof *yl);
    int bad = 0;
    if (!w || !a || !x || !y || !yl) { bad = 1; goto out; }
    for (int r = 0; r < MAXR; r++) {
        /* Large magnitudes on some rows; F16 must stay below 65504. */
        const double mag = r % 5 == 1 ? 1e4 : r % 5 == 3 ? 1e-3 : 1.0;
        gen_row(g, x, n, mag);
        ops.quant(x, w + (size_t)r * wstride, n);
        gen_row(g, x, n, r % 4 == 2 ? 1e3 : 1.0);
        dops.act_quant(x, a + (size_t)r * astride, n);
    }
    for (int iw = 0; iw < N_SIZES; iw++) {
        for (int ia = 0; ia < N_SIZES; ia++) {
            const int nw = k_sizes[iw], na = k_sizes[ia];
            const size_t ld = padded ? ldy : (size_t)nw;
            for (size_t i = 0; i < MAXR * ldy; i++) { memcpy(&y[i], &k_sentinel, 4); memcpy(&yl[i], &k_sentinel, 4); }
            quant_gemm(&ops, n, w, wstride, nw, a, astride, na, y, ld);
            quant_gemm(&ops_loop, n, w, wstride, nw, a, astride, na, yl, ld);
            for (int c = 0; c < na; c++) {
                for (int r = 0; r < nw; r++) {
                    const float ref = ops.dot(n, w + (size_t)r * wstride, a + (size_t)c * astride);
                    const size_t k = (size_t)c * ld + (size_t)r;
                    if (memcmp(&y[k], &ref, 4) || memcmp(&yl[k], &ref, 4)) {
                        if (bad++ < 5)
                            fprintf(stderr, "  %s n=%lld nw=%d na=%d r=%d c=%d: gemm %.9g loop %.9g dot %.9g\n",
                                    qtype_get(t)->name, (long long)n, nw, na, r, c, y[k], yl[k], ref);
                    }
                }
            }
            /* Nothing outside the nw x na block may be written. */
            for (size_t i = 0; i < MAXR * ldy; i++) {
                const size_t c = i / ld, r = i % ld;
                if (c < (size_t)na && r < (size_t)nw) continue;
                if (memcmp(&y[i], &k_sentinel, 4)) {
                    if (bad++ < 5) fprintf(stderr, "  %s n=%lld nw=%d na=%d: stray write at %zu\n",
                                           qtype_get(t)->name, (long long)n, nw, na, i);
                }
            }
        }
    }
out:
    free(w); free(a); free(x); free(y); free(yl);
    return bad;
}

static void run_type(int t)
{
    if (!have_avx2()) return;
    quant_ops ops;
    err e;
    CHECK(quant_ops_get(t, CPU_ISA_AVX2, &ops, &e) == 0);
    CHECK_MSG(ops.gemm != NULL, "%s has no AVX2 gemm kernel", qtype_get(t)->name);
    static const int64_t ns[] = { 32, 64, 256, 2048, 4096 };
    /* Float types have no blocks: ragged n exercises the dots' scalar tails. */
    static const int64_t ns_float[] = { 1, 5, 35, 1000, 1027 };
    /* the AVX2 kernels, then the AVX-VNNI ones (the block types), then the
     * AVX-512 ones (Q8_0; on a CPU without an ISA quant_ops_get hands out
     * the next lower one again: a repeat) */
    for (int v = 0; v < 3; v++) {
        const cpu_isa isa = v == 2 ? CPU_ISA_AVX512 : v ? CPU_ISA_AVXVNNI : CPU_ISA_AVX2;
        rng g = { 0x1234u + (uint64_t)t * 7919u };
        for (int i = 0; i < 5; i++) {
            CHECK_EQ_INT(check_type_n(t, ns[i], &g, i % 2, isa), 0);
            CHECK_EQ_INT(check_type_n(t, ns[i], &g, !(i % 2), isa), 0);
        }
        if (qtype_get(t)->blck == 1)
            for (int i = 0; i < 5; i++) CHECK_EQ_INT(check_type_n(t, ns_float[i], &g, 1, isa), 0);
    }
}

TEST(test_gemm_q8_0) { run_type(QTYPE_Q8_0); }
TEST(test_gemm_q4_0) { run_type(QTYPE_Q4_0); }
TEST(test_gemm_f16) { run_type(QTYPE_F16); }
TEST(test_gemm_bf16) { run_type(QTYPE_BF16); }
TEST(test_gemm_f32) { run_type(QTYPE_F32); }
TEST(test_gemm_q4_1) { run_type(QTYPE_Q4_1); }
TEST(test_gemm_q5_0) { run_type(QTYPE_Q5_0); }
TEST(test_gemm_q5_1) { run_type(QTYPE_Q5_1); }

/* A long row with several chunks (the float kernels split K at 2048) and a
 * weight group boundary (32 rows for the float kernels, 256 KiB of weights
 * for the block types): one pass per type at nw = 70, na = 4. */
TEST(test_gemm_groups)
{
    if (!have_avx2()) return;
    const int64_t n = 8192 + 32;
    const int nw = 70, na = 4;
    rng g = { 99 };
    float *x = malloc((size_t)n * sizeof *x);
    for (int it = 0; it < N_TYPES; it++) {
        const int t = k_types[it];
        quant_ops ops, dops;
        err e;
        CHECK(quant_ops_get(t, CPU_ISA_AVX2, &ops, &e) == 0);
        CHECK(quant_ops_get(ops.dot_type, CPU_ISA_AVX2, &dops, &e) == 0);
        const size_t ws = row_bytes(t, n), as = row_bytes(ops.dot_type, n);
        uint8_t *w = malloc((size_t)nw * ws), *a = malloc((size_t)na * as);
        float *y = malloc((size_t)nw * na * sizeof *y);
        for (int r = 0; r < nw; r++) { gen_row(&g, x, n, 1.0); ops.quant(x, w + (size_t)r * ws, n); }
        for (int c = 0; c < na; c++) { gen_row(&g, x, n, 1.0); dops.act_quant(x, a + (size_t)c * as, n); }
        quant_gemm(&ops, n, w, ws, nw, a, as, na, y, (size_t)nw);
        int bad = 0;
        for (int c = 0; c < na; c++)
            for (int r = 0; r < nw; r++) {
                const float ref = ops.dot(n, w + (size_t)r * ws, a + (size_t)c * as);
                bad += memcmp(&y[(size_t)c * nw + r], &ref, 4) != 0;
            }
        CHECK_MSG(bad == 0, "%s: %d mismatches", qtype_get(t)->name, bad);
        free(w); free(a); free(y);
    }
    free(x);
}

int main(void)
{
    if (!have_avx2())
        printf("gemm: CPU lacks AVX2/FMA/F16C: AVX2 gemm checks skipped (counted as passed)\n");
    RUN(test_gemm_q8_0);
    RUN(test_gemm_q4_0);
    RUN(test_gemm_f16);
    RUN(test_gemm_bf16);
    RUN(test_gemm_f32);
    RUN(test_gemm_q4_1);
    RUN(test_gemm_q5_0);
    RUN(test_gemm_q5_1);
    RUN(test_gemm_groups);
    return test_summary("gemm");
}

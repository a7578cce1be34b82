/* Unit tests for src/quant: every block format's dequantize, quantize and
 * dot kernels, scalar and AVX2.
 *
 * What is checked, and against what:
 *  1. Layout: dequant of random blocks (random quant bytes, scale fields from
 *     a set of exactly representable values) equals, bit for bit, a decoder
 *     written here from the layout description in FORMATS.md section 4, one
 *     element at a time. Plus hand-built blocks with hand-computed values.
 *  2. Round trip: dequant(quant(x)) against the float64 original, per block,
 *     within a bound derived from the format (see roundtrip_bound()); for the
 *     K-quants every value must be the nearest point of its sub-block's grid
 *     (the final step of ggml's quantizers), and the RMS error must stay under
 *     a per-type guard.
 *  3. Scalar dot == float64 dot of dequant(w) and dequant(quant_dot_type(x))
 *     within 1e-5 * sum|w_i * a_i| (plus, for Q4_1/Q5_1, the fp16 rounding of
 *     Q8_1's stored s = d * sum(q), which the dot uses as ggml does).
 *  4. AVX2 dots == scalar dots up to float summation order:
 *     |avx2 - scalar| <= (L + 16) * 2^-22 * sum|w_i * a_i|, L = number of
 *     float terms one SIMD lane accumulates (blocks, or n/32 for float dots).
 *     AVX2 quantizers (Q8_0, Q8_K, F16, BF16) and F16/BF16 dequant must be
 *     bit-identical to scalar.
 *  5. fp16/bf16 conversions: exhaustive over all 65536 halves.
 * QUANT_BENCH=1 in the environment also prints AVX2-vs-scalar dot timings. */
#include "testhelp.h"

#include <stdint.h>
#include <time.h>
#include "quant/quant.h"
#include "util/fp16.h"

/* ==== Test data ==== */

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

/* Gaussian rows with a scale that changes every 32 values (so blocks see
 * different d), occasional outliers, and an all-zero 32-value run now and
 * then (zero scales are a separate code path in every quantizer). */
static void gen_row(rng *r, float *x, int64_t n)
{
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = exp(rng_gauss(r) * 1.5);
        double v = rng_gauss(r) * scale;
        if (rng_unif(r) < 0.01) v *= 8;
        x[i] = (float)v;
    }
    if (n >= 128 && rng_unif(r) < 0.5) {
        int64_t z = (int64_t)(rng_u64(r) % (uint64_t)(n / 32)) * 32;
        for (int i = 0; i < 32; i++) x[z + i] = 0;
    }
}

static const int k_types[] = {
    QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q8_1, QTYPE_Q4_0, QTYPE_Q4_1,
    QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_K,
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))

static int is_k(int t) { return qtype_get(t)->blck == 256 && t != QTYPE_Q8_K; }
static size_t row_bytes(int t, int64_t n) { return (size_t)(n / qtype_get(t)->blck) * (size_t)qtype_get(t)->type_size; }

static int have_avx2(void)
{
    cpu_features f = cpu_detect();
    return f.avx2 && f.fma && f.f16c;
}

/* ==== An independent decoder (FORMATS.md section 4) ====
 * For element e of a block: y = step * q + off with q in [qlo, qhi]. Scales
 * are computed in double; with the exactly representable scales used in the
 * layout test the result is exact, so it must equal ggml's float dequant. */

typedef struct elem { double step, off; int q, qlo, qhi; } elem;

static double rd_f16(const uint8_t *p) { return fp16_to_fp32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t rd_u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else { *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}

static elem decode(int t, const uint8_t *b, int e)
{
    elem r = {0, 0, 0, 0, 0};
    switch (t) {
    case QTYPE_Q4_0:
        r.step = rd_f16(b); r.q = (e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4) - 8; r.qlo = -8; r.qhi = 7;
        break;
    case QTYPE_Q4_1:
        r.step = rd_f16(b); r.off = rd_f16(b + 2); r.q = e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4; r.qhi = 15;
        break;
    case QTYPE_Q5_0:
        r.step = rd_f16(b);
        r.q = ((e < 16 ? b[6 + e] & 15 : b[6 + e - 16] >> 4) | (int)((rd_u32(b + 2) >> e) & 1) << 4) - 16;
        r.qlo = -16; r.qhi = 15;
        break;
    case QTYPE_Q5_1:
        r.step = rd_f16(b); r.off = rd_f16(b + 2);
        r.q = (e < 16 ? b[8 + e] & 15 : b[8 + e - 16] >> 4) | (int)((rd_u32(b + 4) >> e) & 1) << 4;
        r.qhi = 31;
        break;
    case QTYPE_Q8_0: r.step = rd_f16(b); r.q = (int8_t)b[2 + e]; r.qlo = -128; r.qhi = 127; break;
    case QTYPE_Q8_1: r.step = rd_f16(b); r.q = (int8_t)b[4 + e]; r.qlo = -128; r.qhi = 127; break;
    case QTYPE_Q8_K: {
        float d; memcpy(&d, b, 4);
        r.step = d; r.q = (int8_t)b[4 + e]; r.qlo = -128; r.qhi = 127;
        break;
    }
    case QTYPE_Q2_K: {
        const uint8_t *sc = b, *qs = b + 16;
        const int h = e / 128, k = (e % 128) / 32, l = e % 32, s = e / 16;
        r.q = (qs[32 * h + l] >> (2 * k)) & 3; r.qhi = 3;
        r.step = rd_f16(b + 80) * (sc[s] & 15);
        r.off = -rd_f16(b + 82) * (sc[s] >> 4);
        break;
    }
    case QTYPE_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        const int h = e / 128, k = (e % 128) / 32, l = e % 32, s = e / 16;
        const int low = (qs[32 * h + l] >> (2 * k)) & 3, hbit = (hm[e % 32] >> (e / 32)) & 1;
        r.q = low + 4 * hbit - 4; r.qlo = -4; r.qhi = 3;
        const int lo4 = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
        const int hi2 = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        r.step = rd_f16(b + 108) * ((lo4 | hi2 << 4) - 32);
        break;
    }
    case QTYPE_Q4_K:
    case QTYPE_Q5_K: {
        const int q5 = t == QTYPE_Q5_K;
        const uint8_t *qs = b + (q5 ? 48 : 16);
        const int g = e / 64, l = e % 32;
        r.q = (e % 64) < 32 ? qs[32 * g + l] & 15 : qs[32 * g + l] >> 4;
        if (q5) r.q |= ((b[16 + l] >> (e / 32)) & 1) << 4;
        r.qhi = q5 ? 31 : 15;
        int sc, m;
        k4_scale_min(b + 4, e / 32, &sc, &m);
        r.step = rd_f16(b) * sc;
        r.off = -rd_f16(b + 2) * m;
        break;
    }
    case QTYPE_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int low = k == 0 ? ql[64 * h + l] & 15 : k == 1 ? ql[64 * h + 32 + l] & 15
                      : k == 2 ? ql[64 * h + l] >> 4 : ql[64 * h + 32 + l] >> 4;
        r.q = (low | ((qh[32 * h + l] >> (2 * k)) & 3) << 4) - 32; r.qlo = -32; r.qhi = 31;
        r.step = rd_f16(b + 208) * (int8_t)b[192 + e / 16];
        break;
    }
    default: break;
    }
    return r;
}

/* Fill a random but valid block: random bytes, then scale fields replaced by
 * values from `scales` (fp16 bit patterns), so no NaN/Inf appears. */
static void random_block(rng *r, int t, uint8_t *b, const uint16_t *scales, int n_scales)
{
    const int sz = qtype_get(t)->type_size;
    for (int i = 0; i < sz; i++) b[i] = (uint8_t)rng_u64(r);
#define PUT16(off) do { uint16_t h_ = scales[rng_u64(r) % (uint64_t)n_scales]; b[off] = (uint8_t)h_; b[(off) + 1] = (uint8_t)(h_ >> 8); } while (0)
    switch (t) {
    case QTYPE_Q4_0: case QTYPE_Q5_0: case QTYPE_Q8_0: PUT16(0); break;
    case QTYPE_Q4_1: case QTYPE_Q5_1: case QTYPE_Q8_1: PUT16(0); PUT16(2); break;
    case QTYPE_Q2_K: PUT16(80); PUT16(82); break;
    case QTYPE_Q3_K: PUT16(108); break;
    case QTYPE_Q4_K: case QTYPE_Q5_K: PUT16(0); PUT16(2); break;
    case QTYPE_Q6_K: PUT16(208); break;
    case QTYPE_Q8_K: {
        float d = fp16_to_fp32(scales[rng_u64(r) % (uint64_t)n_scales]);
        memcpy(b, &d, 4);
        break;
    }
    default: break;
    }
#undef PUT16
}

/* Exactly representable scales: every product step * q stays exact in float. */
static const uint16_t k_exact_scales[] = { 0x3C00, 0xBC00, 0x3800, 0xB800, 0x4000, 0x3400, 0x2C00, 0x0000 };

TEST(test_layout_random_blocks)
{
    rng r = { 1 };
    static const int types[] = { QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q8_0, QTYPE_Q8_1,
                                 QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_K };
    uint8_t blk[4 * 292];
    float y[4 * 256];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti], bl = qtype_get(t)->blck, sz = qtype_get(t)->type_size;
        for (int it = 0; it < 200; it++) {
            for (int k = 0; k < 4; k++)
                random_block(&r, t, blk + k * sz, k_exact_scales, (int)(sizeof k_exact_scales / 2));
            err e; err_clear(&e);
            CHECK(quant_dequantize(t, blk, y, 4 * bl, &e) == 0);
            for (int k = 0; k < 4; k++)
                for (int i = 0; i < bl; i++) {
                    const elem d = decode(t, blk + k * sz, i);
                    const double want = d.step * d.q + d.off;
                    CHECK_MSG((double)y[k * bl + i] == want, "%s block %d elem %d: %.9g != %.9g",
                              qtype_name(t), k, i, y[k * bl + i], want);
                }
        }
    }
}

/* Hand-built blocks whose values were worked out by hand from the layout. */
TEST(test_layout_known_answers)
{
    float y[256];
    /* Q4_0: d = 0.5 (0x3800); qs[j] = j | (15 - j) << 4
     * -> x[j] = 0.5 * (j - 8), x[16 + j] = 0.5 * (7 - j). */
    uint8_t q40[18] = { 0x00, 0x38 };
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK(quant_dequantize(QTYPE_Q4_0, q40, y, 32, NULL) == 0);
    CHECK(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f);

    /* Q5_1: d = 0.25 (0x3400), m = -1 (0xBC00), qh = 0x80000001 (bits 0, 31),
     * qs[0] = 0x21: x[0] = 0.25 * (1 | 16) - 1 = 3.25; x[16] = 0.25 * 2 - 1 = -0.5;
     * qs[15] = 0xF0: x[31] = 0.25 * (15 | 16) - 1 = 6.75. */
    uint8_t q51[24] = { 0x00, 0x34, 0x00, 0xBC, 0x01, 0x00, 0x00, 0x80 };
    q51[8 + 0] = 0x21; q51[8 + 15] = 0xF0;
    CHECK(quant_dequantize(QTYPE_Q5_1, q51, y, 32, NULL) == 0);
    CHECK(y[0] == 3.25f && y[16] == -0.5f && y[31] == 6.75f && y[1] == -1.0f);

    /* Q4_K: d = 1 (0x3C00), dmin = 0.5 (0x3800); sub-block (sc, m):
     * j0 (1, 0), j1 (5, 3), j4 (33, 62), j7 (63, 17). Packing:
     *   s[0] = 1,  s[1] = 5,  s[4] = 0,  s[5] = 3       (j < 4: 6 bits each)
     *   j4: s[8]  = (33 & 15) | (62 & 15) << 4 = 0xE1; s[0] |= (33 >> 4) << 6; s[4] |= (62 >> 4) << 6
     *   j7: s[11] = (63 & 15) | (17 & 15) << 4 = 0x1F; s[3] |= (63 >> 4) << 6; s[7] |= (17 >> 4) << 6
     * qs[0] = 0x9A: x[0] = 1*1*10 - 0 = 10, x[32] = 1*5*9 - 0.5*3 = 43.5
     * qs[64] = 0x07 (group 2): x[128] = 33*7 - 0.5*62 = 200
     * qs[127] = 0xF0 (group 3, l 31): x[255] = 63*15 - 0.5*17 = 936.5 */
    uint8_t q4k[144] = { 0x00, 0x3C, 0x00, 0x38 };
    uint8_t *s = q4k + 4, *qs = q4k + 16;
    s[0] = 1 | (33 >> 4) << 6; s[1] = 5; s[4] = 0 | (62 >> 4) << 6; s[5] = 3;
    s[8] = 0xE1; s[11] = 0x1F; s[3] = (63 >> 4) << 6; s[7] = (17 >> 4) << 6;
    qs[0] = 0x9A; qs[64] = 0x07; qs[127] = 0xF0;
    CHECK(quant_dequantize(QTYPE_Q4_K, q4k, y, 256, NULL) == 0);
    CHECK_NEAR(y[0], 10.0, 0); CHECK_NEAR(y[32], 43.5, 0);
    CHECK_NEAR(y[128], 200.0, 0); CHECK_NEAR(y[255], 936.5, 0);

    /* Q6_K: d = 0.5 (0x3800) at byte 208; scales[0] = -3, scales[15] = 100.
     * ql[0] = 0x4F, qh[0] = 0b00000010: x[0] = 0.5*-3*((15 | 2<<4) - 32) = -22.5,
     * x[64] (ql high nibble, qh bits 4-5 = 0) = 0.5*scales[4]*(4 - 32);
     * element 255: h 1, k 3, l 31 -> ql[64+32+31] >> 4, qh[32+31] >> 6. */
    uint8_t q6k[210] = {0};
    q6k[208] = 0x00; q6k[209] = 0x38;
    q6k[192] = (uint8_t)-3; q6k[192 + 4] = 2; q6k[192 + 15] = 100;
    q6k[0] = 0x4F; q6k[128] = 0x02;
    q6k[127] = 0xA0; q6k[128 + 63] = 0xC0;   /* x[255] = 0.5*100*((10 | 3<<4) - 32) = 50*26 = 1300 */
    CHECK(quant_dequantize(QTYPE_Q6_K, q6k, y, 256, NULL) == 0);
    CHECK_NEAR(y[0], -22.5, 0); CHECK_NEAR(y[64], 0.5 * 2 * (4 - 32), 0); CHECK_NEAR(y[255], 1300.0, 0);

    /* Q3_K: d = 2 (0x4000); scale s0 = 40 (lo4 8 in s[0], hi2 2 in s[8] bits 0-1),
     * s15 = 1 (lo4 1 in s[7] high nibble, hi2 0 in s[11] bits 6-7).
     * x[0]: qs[0] bits 0-1 = 3, hmask[0] bit 0 set -> q = 3: 2 * (40-32) * 3 = 48.
     * x[255]: h 1, k 3, l 31: qs[32+31] bits 6-7 = 1, hmask[31] bit 7 clear
     *   -> q = 1 - 4 = -3: 2 * (1-32) * -3 = 186. */
    uint8_t q3k[110] = {0};
    q3k[108] = 0x00; q3k[109] = 0x40;
    q3k[96 + 0] = 8; q3k[96 + 8] = 2; q3k[96 + 7] = 1 << 4;
    q3k[32 + 0] = 3; q3k[0] = 1; q3k[32 + 63] = 1 << 6;
    CHECK(quant_dequantize(QTYPE_Q3_K, q3k, y, 256, NULL) == 0);
    CHECK_NEAR(y[0], 48.0, 0); CHECK_NEAR(y[255], 186.0, 0);

    /* Q2_K: scales[0] = 0x21 (sc 1, mn 2), scales[15] = 0xF3 (sc 3, mn 15);
     * d = 1, dmin = 0.25 (0x3400); qs[0] = 0b11 -> x[0] = 1*1*3 - 0.25*2 = 2.5;
     * x[255]: h 1, k 3, l 31 -> qs[16+32+31] >> 6 = 2: 3*2 - 0.25*15 = 2.25. */
    uint8_t q2k[84] = {0};
    q2k[0] = 0x21; q2k[15] = 0xF3; q2k[16] = 3; q2k[16 + 63] = 2 << 6;
    q2k[80] = 0x00; q2k[81] = 0x3C; q2k[82] = 0x00; q2k[83] = 0x34;
    CHECK(quant_dequantize(QTYPE_Q2_K, q2k, y, 256, NULL) == 0);
    CHECK_NEAR(y[0], 2.5, 0); CHECK_NEAR(y[255], 2.25, 0);
}

/* ==== Round trip ==== */

/* Per-value bound for the 32-value block formats and Q8_K, from the format:
 * the value is rounded to the nearest multiple of d (error <= d/2), or for
 * Q4_0/Q5_0 clamped by one step at the top (error <= d); d and m are stored
 * as f16 (relative error <= 2^-11) while the quants were computed with the
 * unrounded d, adding qmax * |d - f16(d)| + |m - f16(m)|. */
static double roundtrip_bound(int t, const float *x, int bl)
{
    double amax = 0, max = 0, mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < bl; i++) {
        if (fabs(x[i]) > amax) { amax = fabs(x[i]); max = x[i]; }
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    const double h = 1.0 / 2048, slack = 1 + 1e-5;
    switch (t) {
    case QTYPE_Q8_0: case QTYPE_Q8_1: { double d = amax / 127; return (0.5 + 127 * h) * d * slack; }
    case QTYPE_Q4_0: { double d = fabs(max) / 8; return (1.0 + 16 * h) * d * slack; }
    case QTYPE_Q5_0: { double d = fabs(max) / 16; return (1.0 + 32 * h) * d * slack; }
    case QTYPE_Q4_1: { double d = (mx - mn) / 15; return ((0.5 + 15 * h) * d + h * fabs(mn)) * slack; }
    case QTYPE_Q5_1: { double d = (mx - mn) / 31; return ((0.5 + 31 * h) * d + h * fabs(mn)) * slack; }
    case QTYPE_Q8_K: { double d = amax / 127; return 0.5 * d * slack + amax * 1e-7; }
    default: return 0;
    }
}

/* RMS(error) / RMS(x) guards on this data (regression guards, measured: the
 * K-quant scale searches have no closed-form bound). */
static double rms_guard(int t)
{
    switch (t) {
    case QTYPE_F32: return 0;
    case QTYPE_F16: return 5e-4;
    case QTYPE_BF16: return 4e-3;
    case QTYPE_Q8_0: case QTYPE_Q8_1: return 0.016;
    case QTYPE_Q8_K: case QTYPE_Q6_K: return 0.04;
    case QTYPE_Q5_1: case QTYPE_Q5_K: return 0.07;
    case QTYPE_Q5_0: return 0.12;
    case QTYPE_Q4_1: case QTYPE_Q4_K: return 0.15;
    case QTYPE_Q4_0: return 0.24;
    case QTYPE_Q3_K: return 0.33;
    case QTYPE_Q2_K: return 0.6;
    default: return 0;
    }
}

static void check_roundtrip(int t, const float *x, int64_t n)
{
    const int bl = qtype_get(t)->blck, sz = qtype_get(t)->type_size;
    uint8_t *q = malloc(row_bytes(t, n));
    float *y = malloc((size_t)n * sizeof *y);
    CHECK(quant_quantize(t, x, q, n, NULL) == 0);
    CHECK(quant_dequantize(t, q, y, n, NULL) == 0);
    double se = 0, sx = 0;
    int reported = 0;
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)y[i] - x[i]);
        se += err * err;
        sx += (double)x[i] * x[i];
        double bound;
        if (t == QTYPE_F32) bound = 0;
        else if (t == QTYPE_F16) bound = fmax(fabs(x[i]) / 2048, 1.0 / (1 << 25));
        else if (t == QTYPE_BF16) bound = fabs(x[i]) / 256;
        else if (is_k(t)) {
            /* The value must be the grid point nearest x (ties either way). */
            const elem d = decode(t, q + (i / bl) * sz, (int)(i % bl));
            double best = INFINITY;
            for (int k = d.qlo; k <= d.qhi; k++) best = fmin(best, fabs(d.step * k + d.off - x[i]));
            bound = best + 1e-5 * (fabs(d.step) * (d.qhi - d.qlo) + fabs(d.off)) + 1e-30;
        } else {
            bound = roundtrip_bound(t, x + (i / bl) * bl, bl);
        }
        if (err > bound && reported++ < 3)
            CHECK_MSG(err <= bound, "%s n=%lld i=%lld: x=%.9g y=%.9g err=%.3g > bound %.3g",
                      qtype_name(t), (long long)n, (long long)i, x[i], y[i], err, bound);
    }
    const double rel = sx > 0 ? sqrt(se / sx) : 0;
    CHECK_MSG(rel <= rms_guard(t), "%s n=%lld: relative RMS error %.4g > %.4g",
              qtype_name(t), (long long)n, rel, rms_guard(t));
    free(q);
    free(y);
}

TEST(test_roundtrip_all_types)
{
    static const int64_t lens[] = { 256, 768, 4096 };
    float *x = malloc(4096 * sizeof *x);
    for (int seed = 1; seed <= 3; seed++)
        for (size_t li = 0; li < 3; li++)
            for (int ti = 0; ti < N_TYPES; ti++) {
                rng r = { (uint64_t)seed * 7919 + li };
                gen_row(&r, x, lens[li]);
                check_roundtrip(k_types[ti], x, lens[li]);
            }
    /* Short rows for the 32-value formats. */
    for (int ti = 0; ti < N_TYPES; ti++) {
        if (qtype_get(k_types[ti])->blck != 32) continue;
        rng r = { 99 };
        gen_row(&r, x, 96);
        check_roundtrip(k_types[ti], x, 32);
        check_roundtrip(k_types[ti], x, 96);
    }
    free(x);
}

/* Edge cases: all zero, constant, one spike, tiny values, exact ties. */
TEST(test_roundtrip_edge_blocks)
{
    float x[256];
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int t = k_types[ti];
        const int64_t n = 256;
        uint8_t q[1024];   /* F32 rows of 256 are the largest */
        float y[256];
        memset(x, 0, sizeof x);
        CHECK(quant_quantize(t, x, q, n, NULL) == 0);
        CHECK(quant_dequantize(t, q, y, n, NULL) == 0);
        for (int i = 0; i < n; i++) CHECK_MSG(y[i] == 0, "%s zero block -> %g", qtype_name(t), y[i]);
        for (int i = 0; i < n; i++) x[i] = 0.75f;
        CHECK(quant_quantize(t, x, q, n, NULL) == 0);
        CHECK(quant_dequantize(t, q, y, n, NULL) == 0);
        for (int i = 0; i < n; i++) CHECK_MSG(fabs(y[i] - 0.75) < 0.75 * 0.07, "%s const -> %g", qtype_name(t), y[i]);
        memset(x, 0, sizeof x);
        x[77] = -3.0f;
        CHECK(quant_quantize(t, x, q, n, NULL) == 0);
        CHECK(quant_dequantize(t, q, y, n, NULL) == 0);
        CHECK_MSG(fabs(y[77] + 3.0) < 3.0 * 0.02, "%s spike -> %g", qtype_name(t), y[77]);
    }
    /* Q8_0 uses roundf (halves away from zero): amax 127 gives d = 1, so
     * x * (1/d) is exact. */
    float t8[32] = { 127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f };
    uint8_t q8[36];
    CHECK(quant_quantize(QTYPE_Q8_0, t8, q8, 32, NULL) == 0);
    CHECK(q8[0] == 0x00 && q8[1] == 0x3C);   /* d = 1.0 */
    const int8_t *qs = (const int8_t *)q8 + 2;
    CHECK(qs[0] == 127 && qs[1] == 1 && qs[2] == 2 && qs[3] == 3 && qs[4] == -1 && qs[5] == -2 && qs[6] == -3 && qs[7] == 3);
    /* Q8_K uses nearest_int (ties to even); max = -127 gives iscale = 1. */
    float tk[256] = { -127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f };
    uint8_t qk[292];
    CHECK(quant_quantize(QTYPE_Q8_K, tk, qk, 256, NULL) == 0);
    const int8_t *ks = (const int8_t *)qk + 4;
    float dk;
    memcpy(&dk, qk, 4);
    CHECK(dk == 1.0f);
    CHECK(ks[0] == -127 && ks[1] == 0 && ks[2] == 2 && ks[3] == 2 && ks[4] == 0 && ks[5] == -2 && ks[6] == -2);
    int16_t bs0;
    memcpy(&bs0, qk + 260, 2);
    CHECK_EQ_INT(bs0, -127 + 0 + 2 + 2 + 0 - 2 - 2);
}

/* ==== Dots ==== */

/* Everything one dot test needs: weights of type t (from a float row, or
 * random valid blocks), activations quantized to the dot type. */
typedef struct dot_case {
    int t, dt;
    int64_t n;
    uint8_t *w, *a;
    float *wd, *ad;     /* dequantized */
    double ref, mag;    /* float64 reference and sum |w_i a_i| */
} dot_case;

static void dot_case_init(dot_case *c, int t, int64_t n, rng *r, int random_weights)
{
    quant_ops ops;
    CHECK(quant_ops_get(t, CPU_ISA_SCALAR, &ops, NULL) == 0);
    c->t = t;
    c->dt = ops.dot_type;
    c->n = n;
    c->w = malloc(row_bytes(t, n));
    c->a = malloc(row_bytes(c->dt, n));
    c->wd = malloc((size_t)n * sizeof(float));
    c->ad = malloc((size_t)n * sizeof(float));
    float *x = malloc((size_t)n * sizeof(float));
    const int bl = qtype_get(t)->blck, sz = qtype_get(t)->type_size;
    if (random_weights && bl > 1) {
        static const uint16_t sc[] = { 0x3C00, 0xB800, 0x2E66, 0x1A00, 0x3555, 0xA9F0, 0x0000 };
        for (int64_t b = 0; b < n / bl; b++) random_block(r, t, c->w + b * sz, sc, 7);
    } else {
        gen_row(r, x, n);
        CHECK(quant_quantize(t, x, c->w, n, NULL) == 0);
    }
    gen_row(r, x, n);
    CHECK(quant_quantize(c->dt, x, c->a, n, NULL) == 0);
    CHECK(quant_dequantize(t, c->w, c->wd, n, NULL) == 0);
    CHECK(quant_dequantize(c->dt, c->a, c->ad, n, NULL) == 0);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)c->wd[i] * c->ad[i];
        mag += fabs((double)c->wd[i] * c->ad[i]);
    }
    if (t == QTYPE_Q4_1 || t == QTYPE_Q5_1) {
        /* ggml adds m * s with Q8_1's stored s = f16(d * sum(q)), not the
         * exact d * sum(q) that dequant(a) implies. */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *wb = c->w + b * sz, *ab = c->a + b * 36;
            double sumq = 0;
            for (int j = 0; j < 32; j++) sumq += (int8_t)ab[4 + j];
            const double m = rd_f16(wb + 2), d = rd_f16(ab), s = rd_f16(ab + 2);
            ref += m * (s - d * sumq);
            mag += fabs(m * s);
        }
    }
    c->ref = ref;
    c->mag = mag;
    free(x);
}

static void dot_case_free(dot_case *c)
{
    free(c->w); free(c->a); free(c->wd); free(c->ad);
}

/* Float terms one SIMD lane accumulates in the AVX2 kernel. */
static double lanes_terms(const dot_case *c)
{
    const int bl = qtype_get(c->t)->blck;
    return bl == 1 ? (double)c->n / 32 : (double)(c->n / bl);
}

TEST(test_dots_scalar_and_avx2)
{
    static const int64_t lens[] = { 256, 1024, 4096 };
    const int avx = have_avx2();
    if (!avx) fprintf(stderr, "  (no AVX2 on this CPU: AVX2 dot checks skipped)\n");
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int t = k_types[ti];
        quant_ops sops, aops;
        CHECK(quant_ops_get(t, CPU_ISA_SCALAR, &sops, NULL) == 0);
        CHECK(quant_ops_get(t, CPU_ISA_AVX2, &aops, NULL) == 0);
        for (int seed = 1; seed <= 3; seed++)
            for (size_t li = 0; li < 3; li++)
                for (int rw = 0; rw < 2; rw++) {
                    rng r = { (uint64_t)seed * 104729 + li * 31 + (uint64_t)rw };
                    dot_case c;
                    dot_case_init(&c, t, lens[li], &r, rw);
                    const float s = sops.dot(c.n, c.w, c.a);
                    const double tol = 1e-5 * c.mag + 1e-30;
                    CHECK_MSG(fabs(s - c.ref) <= tol, "%s n=%lld rw=%d scalar %.9g vs f64 %.9g (tol %.3g)",
                              qtype_name(t), (long long)c.n, rw, s, c.ref, tol);
                    if (avx) {
                        const float v = aops.dot(c.n, c.w, c.a);
                        const double atol = (lanes_terms(&c) + 16) * ldexp(1.0, -22) * c.mag + 1e-30;
                        CHECK_MSG(fabs(v - s) <= atol, "%s n=%lld rw=%d avx2 %.9g vs scalar %.9g (tol %.3g)",
                                  qtype_name(t), (long long)c.n, rw, v, s, atol);
                    }
                    dot_case_free(&c);
                }
    }
    /* The AVX-VNNI and AVX-512 (EVEX VNNI) dots are bit-identical to the
     * AVX2 ones (each checked where the CPU has it; elsewhere quant_ops_get
     * hands out another kernel), every length from 1 to 12 blocks, random
     * and extreme blocks */
    const cpu_features cf = cpu_detect();
    static const struct { cpu_isa isa; const char *name; } vi[] = { { CPU_ISA_AVXVNNI, "avxvnni" },
                                                                      { CPU_ISA_AVX512, "avx512" } };
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? cf.avxvnni : cf.avx512)) {
            fprintf(stderr, "  (no %s on this CPU: its dot checks skipped)\n", vi[k].name);
            continue;
        }
        static const int vt[] = { QTYPE_Q4_K, QTYPE_Q5_K };
        for (int ti = 0; ti < 2; ti++) {
            quant_ops vops, aops;
            CHECK(quant_ops_get(vt[ti], vi[k].isa, &vops, NULL) == 0);
            CHECK(quant_ops_get(vt[ti], CPU_ISA_AVX2, &aops, NULL) == 0);
            CHECK(vops.dot != aops.dot);
            int bad = 0, n_cases = 0;
            for (int nb = 1; nb <= 12; nb++)
                for (int rw = 0; rw < 2; rw++) {
                    rng r = { (uint64_t)nb * 7919 + (uint64_t)rw + 100 * (uint64_t)ti };
                    dot_case c;
                    dot_case_init(&c, vt[ti], (int64_t)nb * 256, &r, rw);
                    const float a = aops.dot(c.n, c.w, c.a), v = vops.dot(c.n, c.w, c.a);
                    bad += memcmp(&a, &v, sizeof a) != 0;
                    n_cases++;
                    dot_case_free(&c);
                }
            CHECK_MSG(bad == 0, "%s %s dot differs from avx2 in %d of %d cases", qtype_name(vt[ti]), vi[k].name,
                      bad, n_cases);
        }
    }
    /* Float dots with a length that is not a multiple of 8 or 32 (tails). */
    for (int ti = 0; ti < 3; ti++) {
        const int t = k_types[ti];
        quant_ops sops, aops;
        CHECK(quant_ops_get(t, CPU_ISA_SCALAR, &sops, NULL) == 0);
        CHECK(quant_ops_get(t, CPU_ISA_AVX2, &aops, NULL) == 0);
        for (int64_t n = 1; n < 80; n += 7) {
            rng r = { (uint64_t)n };
            dot_case c;
            dot_case_init(&c, t, n, &r, 0);
            const float s = sops.dot(n, c.w, c.a);
            CHECK(fabs(s - c.ref) <= 1e-5 * c.mag + 1e-30);
            if (avx) CHECK(fabs(aops.dot(n, c.w, c.a) - s) <= 20 * ldexp(1.0, -22) * c.mag + 1e-30);
            dot_case_free(&c);
        }
    }
}

TEST(test_avx2_quantizers_bit_identical)
{
    if (!have_avx2()) { fprintf(stderr, "  (no AVX2: skipped)\n"); return; }
    static const int types[] = { QTYPE_Q8_0, QTYPE_Q8_K, QTYPE_F16, QTYPE_BF16 };
    const int64_t n = 4096;
    float *x = malloc(n * sizeof *x), *y1 = malloc(n * sizeof *y1), *y2 = malloc(n * sizeof *y2);
    uint8_t *q1 = malloc(2 * n * 2), *q2 = malloc(2 * n * 2);
    for (size_t ti = 0; ti < 4; ti++) {
        const int t = types[ti];
        quant_ops s, a;
        CHECK(quant_ops_get(t, CPU_ISA_SCALAR, &s, NULL) == 0);
        CHECK(quant_ops_get(t, CPU_ISA_AVX2, &a, NULL) == 0);
        CHECK(a.quant != s.quant);
        for (int seed = 0; seed < 8; seed++) {
            rng r = { (uint64_t)seed + 500 };
            gen_row(&r, x, n);
            if (seed == 1) for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(rng_u64(&r) % 255) - 127) * 0.5f;
            if (seed == 2) for (int64_t i = 0; i < n; i += 2) x[i] = -x[i + 1];  /* |x| ties of both signs */
            if (seed == 3) for (int64_t i = 0; i < n; i++) x[i] = (float)ldexp(rng_gauss(&r), -20);  /* f16 subnormals */
            memset(q1, 0xAA, row_bytes(t, n));
            memset(q2, 0x55, row_bytes(t, n));
            s.quant(x, q1, n);
            a.quant(x, q2, n);
            CHECK_MSG(memcmp(q1, q2, row_bytes(t, n)) == 0, "%s seed %d: avx2 quant differs", qtype_name(t), seed);
            s.dequant(q1, y1, n);
            a.dequant(q1, y2, n);
            CHECK_MSG(memcmp(y1, y2, n * sizeof *y1) == 0, "%s seed %d: avx2 dequant differs", qtype_name(t), seed);
        }
    }
    /* F16/BF16 tails (n not a multiple of 8 or 16). */
    for (int64_t n2 = 1; n2 < 40; n2 += 3)
        for (size_t ti = 2; ti < 4; ti++) {
            quant_ops s, a;
            quant_ops_get(types[ti], CPU_ISA_SCALAR, &s, NULL);
            quant_ops_get(types[ti], CPU_ISA_AVX2, &a, NULL);
            rng r = { (uint64_t)n2 };
            gen_row(&r, x, n2);
            s.quant(x, q1, n2);
            a.quant(x, q2, n2);
            CHECK(memcmp(q1, q2, (size_t)n2 * 2) == 0);
            s.dequant(q1, y1, n2);
            a.dequant(q1, y2, n2);
            CHECK(memcmp(y1, y2, (size_t)n2 * 4) == 0);
        }
    free(x); free(y1); free(y2); free(q1); free(q2);
}

/* ==== Activation quantizers (ggml-cpu from_float) ==== */

/* Known answers from ggml itself: quantize_row_q8_0 / q8_1 of
 * libggml-cpu-haswell.so (node-llama-cpp 3.22.1's llama.cpp build) and
 * quantize_row_q8_0_ref of its libggml-base.so, on two blocks:
 *   a: amax 127 (so x * 127 / amax = x): exact halves, where ggml-cpu rounds
 *      to even and the reference away from zero;
 *   b: amax = 0x3f81ce07 and x = amax / 2: x * (127 / amax) = 63.4999962
 *      but x * (1 / (amax / 127)) = 63.5000038, so 63 against 64 with no tie. */
TEST(test_act_quant_ggml_known_answers)
{
    float a[32] = { 127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f };
    float b[32] = { 0 };
    const uint32_t ub = 0x3f81ce07u, uh = 0x3f01ce07u;
    memcpy(&b[0], &ub, 4);
    memcpy(&b[1], &uh, 4);
    b[2] = -b[1];
    static const int8_t a_act[9] = { 127, 0, 2, 2, 0, -2, -2, 126, -126 };
    static const int8_t a_ref[9] = { 127, 1, 2, 3, -1, -2, -3, 127, -127 };
    static const int8_t b_act[3] = { 127, 63, -63 }, b_ref[3] = { 127, 64, -64 };
    uint8_t q[36];
    for (int isa = 0; isa < 2; isa++) {
        if (isa && !have_avx2()) break;
        quant_ops o0, o1;
        CHECK(quant_ops_get(QTYPE_Q8_0, isa ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, &o0, NULL) == 0);
        CHECK(quant_ops_get(QTYPE_Q8_1, isa ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, &o1, NULL) == 0);
        o0.act_quant(a, q, 32);
        CHECK(q[0] == 0x00 && q[1] == 0x3c && memcmp(q + 2, a_act, 9) == 0);
        o0.quant(a, q, 32);
        CHECK(q[0] == 0x00 && q[1] == 0x3c && memcmp(q + 2, a_ref, 9) == 0);
        o1.act_quant(a, q, 32);   /* d 0x3c00, s = fp16(1 * sum) 0x57f0 */
        CHECK(q[0] == 0x00 && q[1] == 0x3c && q[2] == 0xf0 && q[3] == 0x57 && memcmp(q + 4, a_act, 9) == 0);
        o0.act_quant(b, q, 32);
        CHECK(q[0] == 0x17 && q[1] == 0x20 && memcmp(q + 2, b_act, 3) == 0);
        o0.quant(b, q, 32);
        CHECK(q[0] == 0x17 && q[1] == 0x20 && memcmp(q + 2, b_ref, 3) == 0);
        o1.act_quant(b, q, 32);
        CHECK(q[0] == 0x17 && q[1] == 0x20 && q[2] == 0x0e && q[3] == 0x3c && memcmp(q + 4, b_act, 3) == 0);
    }
    /* the convenience wrapper is the scalar act_quant */
    CHECK(quant_act_quantize(QTYPE_Q8_0, b, q, 32, NULL) == 0 && memcmp(q + 2, b_act, 3) == 0);
    CHECK(quant_act_quantize(QTYPE_Q8_0, b, q, 31, NULL) == ERR_FORMAT);
    /* all-zero block: d = 0, every q = 0 */
    float z[64] = { 0 };
    CHECK(quant_act_quantize(QTYPE_Q8_1, z, q, 32, NULL) == 0);
    for (int i = 0; i < 36; i++) CHECK(q[i] == 0);
}

/* act_quant scalar == AVX2, bit for bit, on data that exercises both
 * rounding differences from the reference (halves, 127/amax != 1/d) and
 * blocks so tiny that the inverse scale overflows (quant too). */
TEST(test_act_quant_avx2_bit_identical)
{
    if (!have_avx2()) { fprintf(stderr, "  (no AVX2: skipped)\n"); return; }
    static const int types[] = { QTYPE_Q8_0, QTYPE_Q8_1, QTYPE_Q8_K, QTYPE_F16, QTYPE_BF16 };
    const int64_t n = 4096;
    float *x = malloc(n * sizeof *x);
    uint8_t *q1 = malloc(2 * n * 2), *q2 = malloc(2 * n * 2), *q3 = malloc(2 * n * 2);
    long differs_from_ref = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        quant_ops s, a;
        CHECK(quant_ops_get(t, CPU_ISA_SCALAR, &s, NULL) == 0);
        CHECK(quant_ops_get(t, CPU_ISA_AVX2, &a, NULL) == 0);
        CHECK(s.act_quant && a.act_quant);
        if (t != QTYPE_Q8_0 && t != QTYPE_Q8_1) CHECK(s.act_quant == s.quant && a.act_quant == a.quant);
        for (int seed = 0; seed < 12; seed++) {
            rng r = { (uint64_t)seed + 900 };
            gen_row(&r, x, n);
            if (seed % 3 == 1)   /* exact halves of amax / 127 in every block */
                for (int64_t b = 0; b < n; b += 32) {
                    const float amax = (float)(0.5 + rng_u64(&r) % 1000 / 100.0);
                    for (int j = 0; j < 32; j++)
                        x[b + j] = (float)(((int)(rng_u64(&r) % 254) - 127 + 0.5) * amax / 127);
                    x[b + rng_u64(&r) % 32] = amax;
                }
            if (seed % 3 == 2)   /* x = amax / 2: 127/amax vs 1/d decides */
                for (int64_t b = 0; b < n; b += 32) {
                    const float amax = 1.0f + (float)(rng_u64(&r) % 100000) * 1e-4f;
                    for (int j = 0; j < 32; j++) x[b + j] = (j & 1 ? -0.5f : 0.5f) * amax;
                    x[b] = amax;
                }
            if (seed >= 9)   /* tiny blocks: 127/amax and 1/d overflow; zero blocks */
                for (int64_t i = 0; i < n; i++) x[i] = (i / 32) % 4 ? x[i] * (float)ldexp(1.0, -125 - seed) : 0.0f;
            const size_t rb = row_bytes(t, n);
            memset(q1, 0xAA, rb);
            memset(q2, 0x55, rb);
            s.act_quant(x, q1, n);
            a.act_quant(x, q2, n);
            CHECK_MSG(memcmp(q1, q2, rb) == 0, "%s seed %d: avx2 act_quant differs", qtype_name(t), seed);
            s.quant(x, q3, n);
            differs_from_ref += memcmp(q1, q3, rb) != 0;
            a.quant(x, q2, n);   /* the weight quantizers, on the same data */
            CHECK_MSG(memcmp(q3, q2, rb) == 0, "%s seed %d: avx2 quant differs", qtype_name(t), seed);
        }
    }
    CHECK(differs_from_ref > 0);   /* the data does tell the two roundings apart */
    free(x); free(q1); free(q2); free(q3);
}

/* ==== fp16 / bf16 ==== */

static int f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

TEST(test_fp16_exhaustive)
{
    uint16_t *h = malloc(65536 * 2), *h2 = malloc(65536 * 2);
    float *f = malloc(65536 * 4), *f2 = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        const float v = fp16_to_fp32(h[i]);
        f[i] = v;
        /* Independent value: sign * mantissa * 2^exp, in double. */
        const int e = (i >> 10) & 31, m = i & 1023;
        double want = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
        if (i & 0x8000) want = -want;
        if (f16_is_nan(h[i])) { if (!isnan(v)) bad++; continue; }
        if ((double)v != want || !signbit(v) != !signbit(want)) bad++;
        if (fp32_to_fp16(v) != h[i]) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* bf16: f32 = bits << 16, and back is exact for every non-NaN. */
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        const uint16_t b = (uint16_t)i;
        const float v = bf16_to_fp32(b);
        if (fp32_bits(v) != (uint32_t)b << 16) bad++;
        if (!isnan(v) && fp32_to_bf16(v) != b) bad++;
        if (isnan(v) && !isnan(bf16_to_fp32(fp32_to_bf16(v)))) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    if (have_avx2()) {
        /* F16C (vcvtph2ps / vcvtps2ph) agrees with util/fp16.h. */
        quant_ops a;
        CHECK(quant_ops_get(QTYPE_F16, CPU_ISA_AVX2, &a, NULL) == 0);
        a.dequant(h, f2, 65536);
        bad = 0;
        for (int i = 0; i < 65536; i++) {
            if (f16_is_nan(h[i])) { if (!isnan(f2[i])) bad++; continue; }
            if (fp32_bits(f[i]) != fp32_bits(f2[i])) bad++;
        }
        CHECK_EQ_INT(bad, 0);
        /* f32 -> f16 over a stride of all 2^32 patterns plus the neighbours of
         * every half-way point between halves (where RNE matters). */
        const int64_t chunk = 65536;
        float *src = malloc(chunk * 4);
        bad = 0;
        for (uint64_t base = 0; base < (1ull << 32); base += chunk * 4099ull) {
            for (int64_t k = 0; k < chunk; k++) src[k] = fp32_from_bits((uint32_t)(base + (uint64_t)k * 4099u));
            a.quant(src, h2, chunk);
            for (int64_t k = 0; k < chunk; k++) {
                const uint16_t want = fp32_to_fp16(src[k]);
                if (isnan(src[k]) ? !f16_is_nan(h2[k]) : h2[k] != want) bad++;
            }
        }
        for (int i = 0; i < 0x7c00; i += 1) {
            const uint32_t mid = (fp32_bits(fp16_to_fp32((uint16_t)i)) + fp32_bits(fp16_to_fp32((uint16_t)(i + 1)))) / 2;
            for (int k = 0; k < 3; k++) src[3 * (i % 20000) + k] = fp32_from_bits(mid - 1 + (uint32_t)k);
            if (i % 20000 == 19999 || i == 0x7bff) {
                const int64_t m = 3 * (i % 20000 + 1);
                a.quant(src, h2, m);
                for (int64_t k = 0; k < m; k++) if (h2[k] != fp32_to_fp16(src[k])) bad++;
            }
        }
        CHECK_EQ_INT(bad, 0);
        free(src);
    }
    free(h); free(h2); free(f); free(f2);
}

/* ==== API ==== */

TEST(test_ops_table)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        quant_ops o;
        err e; err_clear(&e);
        CHECK(quant_ops_get(k_types[ti], CPU_ISA_SCALAR, &o, &e) == 0);
        CHECK(o.type == (qtype)k_types[ti] && o.dot_type == qtype_get(k_types[ti])->dot_type);
        CHECK(o.dequant && o.quant && o.dot && o.act_quant);
    }
    quant_ops o;
    CHECK(quant_ops_get(QTYPE_Q4_1, CPU_ISA_SCALAR, &o, NULL) == 0 && o.dot_type == QTYPE_Q8_1);
    CHECK(quant_ops_get(QTYPE_Q4_K, CPU_ISA_SCALAR, &o, NULL) == 0 && o.dot_type == QTYPE_Q8_K);
    CHECK(quant_ops_get(QTYPE_Q5_0, CPU_ISA_SCALAR, &o, NULL) == 0 && o.dot_type == QTYPE_Q8_0);
    err e; err_clear(&e);
    CHECK_EQ_INT(quant_ops_get(16, CPU_ISA_SCALAR, &o, &e), ERR_UNSUPPORTED);   /* iq2_xxs */
    CHECK(strstr(e.msg, "iq2_xxs") != NULL);
    CHECK_EQ_INT(quant_ops_get(63, CPU_ISA_AVX2, &o, NULL), ERR_UNSUPPORTED);
    float x[64] = {0};
    uint8_t q[64];
    err_clear(&e);
    CHECK_EQ_INT(quant_quantize(QTYPE_Q4_0, x, q, 48, &e), ERR_FORMAT);
    CHECK_EQ_INT(quant_dequantize(QTYPE_Q4_K, q, x, 32, NULL), ERR_FORMAT);
}

/* ==== Benchmark (QUANT_BENCH=1) ==== */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(void)
{
    static const int types[] = { QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q2_K,
                                 QTYPE_Q3_K, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_F16, QTYPE_BF16, QTYPE_F32 };
    const int64_t n = 4096, rows = 256;
    printf("dot of %lld rows x %lld, best of 7 passes (ns per row; GB/s of weights)\n", (long long)rows, (long long)n);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        quant_ops s, a;
        quant_ops_get(t, CPU_ISA_SCALAR, &s, NULL);
        quant_ops_get(t, CPU_ISA_AVX2, &a, NULL);
        const size_t rb = row_bytes(t, n);
        uint8_t *w = malloc(rb * rows), *act = malloc(row_bytes(s.dot_type, n));
        float *x = malloc(n * sizeof *x);
        rng r = { 5 };
        for (int64_t i = 0; i < rows; i++) { gen_row(&r, x, n); s.quant(x, w + i * rb, n); }
        gen_row(&r, x, n);
        quant_ops d;
        quant_ops_get(s.dot_type, CPU_ISA_SCALAR, &d, NULL);
        d.quant(x, act, n);
        double ts[2];
        volatile float sink = 0;
        /* Best of 7 trials of one pass over the rows: the machine is shared,
         * and the minimum is the least disturbed estimate. */
        for (int k = 0; k < 2; k++) {
            quant_dot_fn f = k ? a.dot : s.dot;
            ts[k] = 1e30;
            for (int trial = 0; trial < 7; trial++) {
                const double t0 = now_s();
                for (int64_t i = 0; i < rows; i++) sink += f(n, w + i * rb, act);
                const double dt = (now_s() - t0) / (double)rows;
                if (dt < ts[k]) ts[k] = dt;
            }
        }
        printf("  %-5s scalar %8.0f ns  avx2 %7.0f ns  speedup %5.1fx  (%.1f GB/s)\n", qtype_name(t),
               ts[0] * 1e9, ts[1] * 1e9, ts[0] / ts[1], rb / ts[1] / 1e9);
        (void)sink;
        free(w); free(act); free(x);
    }
}

int main(void)
{
    RUN(test_layout_random_blocks);
    RUN(test_layout_known_answers);
    RUN(test_roundtrip_all_types);
    RUN(test_roundtrip_edge_blocks);
    RUN(test_dots_scalar_and_avx2);
    RUN(test_avx2_quantizers_bit_identical);
    RUN(test_act_quant_ggml_known_answers);
    RUN(test_act_quant_avx2_bit_identical);
    RUN(test_fp16_exhaustive);
    RUN(test_ops_table);
    if (getenv("QUANT_BENCH")) bench();
    return test_summary("quant");
}

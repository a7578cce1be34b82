/* randw: random valid quantized rows (see randw.h for the contract).
 *
 * For every format the dequantized value is scale * (q - centre) with q
 * uniform random bits, so the std of a block is d * rms(sub-scale) * rms(q -
 * centre). Each generator picks its sub-block scales from a fixed range,
 * computes d = std * jitter / (rms(scale) * rms(q)) and, for the formats with
 * a min (q4_1, q5_1, q2_K, q4_K, q5_K), sets the min so the block is centred.
 * The rms constants are computed from the ranges, not typed in.
 *
 * Layouts (ggml-common.h; all little-endian, fp16 = IEEE half):
 *   q4_0  | d f16 | qs[16] |                 x = d*(nibble - 8)   (d of random sign)
 *   q4_1  | d | m | qs[16] |                 x = d*nibble + m
 *   q5_0  | d | qh[4] | qs[16] |             x = d*(5-bit - 16)   (d of random sign)
 *   q5_1  | d | m | qh[4] | qs[16] |         x = d*q5 + m
 *   q8_0  | d | qs[32] i8 |                  x = d*q
 *   q2_K  | scales[16] (lo 4: sc, hi 4: m) | qs[64] | d | dmin |   x = d*sc*q2 - dmin*m
 *   q3_K  | hmask[32] | qs[64] | scales[12] (16 x 6 bit) | d |      x = d*(sc-32)*(q3 - 4*!hbit)
 *   q4_K  | d | dmin | scales[12] (8 sc + 8 m, 6 bit) | qs[128] | x = d*sc*q4 - dmin*m
 *   q5_K  | d | dmin | scales[12] | qh[32] | qs[128] |            x = d*sc*q5 - dmin*m
 *   q6_K  | ql[128] | qh[64] | scales[16] i8 | d |                x = d*sc*(q6 - 32) */
#include "mkmodel/randw.h"

#include <math.h>
#include <string.h>

#include "quant/qtype.h"
#include "util/fp16.h"

/* ==== Helpers ==== */

/* Mean of k^2 for integers k in [lo, hi]. */
static float mean_sq(int lo, int hi)
{
    double s = 0;
    for (int k = lo; k <= hi; k++) s += (double)k * k;
    return (float)(s / (hi - lo + 1));
}

/* rms of (q - c) for q uniform in [0, n). */
static float rms_centred(int n, float c)
{
    double s = 0;
    for (int q = 0; q < n; q++) s += ((double)q - c) * ((double)q - c);
    return (float)sqrt(s / n);
}

/* Block-scale jitter in [0.75, 1.25), normalised so E[jitter^2] = 1. */
static float jitter(randw_rng *r)
{
    return (0.75f + 0.5f * randw_uniform(r)) * 0.98974332f; /* 1/sqrt(1 + 0.25^2/3) */
}

/* The same with a random sign: q4_0, q5_0 and q6_K centre their quants at
 * -0.5 (q - 8 in [-8, 7]), so half the blocks (or sub-blocks) get a negative
 * scale to cancel the mean, as ggml's own quantizers produce too. */
static float signed_jitter(randw_rng *r)
{
    uint64_t x = randw_next(r);
    float j = (0.75f + 0.5f * (float)(x >> 40) * (1.0f / 16777216.0f)) * 0.98974332f;
    return (x & 1) ? -j : j;
}

static void rand_bytes(randw_rng *r, uint8_t *dst, int n)
{
    while (n >= 8) {
        uint64_t x = randw_next(r);
        memcpy(dst, &x, 8);
        dst += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t x = randw_next(r);
        memcpy(dst, &x, (size_t)n);
    }
}

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

static float f16_round(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

/* 16-bit draws for block scales, four per 64-bit draw. */
typedef struct bits16 {
    uint64_t x;
    int left;
} bits16;

static uint32_t next16(randw_rng *r, bits16 *b)
{
    if (b->left == 0) { b->x = randw_next(r); b->left = 4; }
    b->left--;
    return (uint32_t)(b->x >> (16 * b->left)) & 0xffff;
}

/* Uniform integer in [lo, hi] (multiply-shift of 16 bits: bias < range/65536). */
static int pick(randw_rng *r, bits16 *b, int lo, int hi)
{
    return lo + (int)((next16(r, b) * (uint32_t)(hi - lo + 1)) >> 16);
}

/* Pack 8 six-bit scales and 8 six-bit mins as ggml's get_scale_min_k4 reads them:
 * j < 4: sc = s[j] & 63, m = s[j+4] & 63;
 * j >= 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m = (s[j+4] >> 4) | ((s[j] >> 6) << 4). */
static void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t s[12])
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

/* ==== Per-format generators: nb blocks each ==== */

static void gen_q4_0(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / rms_centred(16, 8.0f);
    for (int64_t i = 0; i < nb; i++, p += 18) {
        put_f16(p, base * signed_jitter(r));
        rand_bytes(r, p + 2, 16);
    }
}

static void gen_q4_1(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / rms_centred(16, 7.5f);
    for (int64_t i = 0; i < nb; i++, p += 20) {
        float d = f16_round(base * jitter(r));
        put_f16(p, d);
        put_f16(p + 2, -7.5f * d);
        rand_bytes(r, p + 4, 16);
    }
}

static void gen_q5_0(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / rms_centred(32, 16.0f);
    for (int64_t i = 0; i < nb; i++, p += 22) {
        put_f16(p, base * signed_jitter(r));
        rand_bytes(r, p + 2, 20);
    }
}

static void gen_q5_1(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / rms_centred(32, 15.5f);
    for (int64_t i = 0; i < nb; i++, p += 24) {
        float d = f16_round(base * jitter(r));
        put_f16(p, d);
        put_f16(p + 2, -15.5f * d);
        rand_bytes(r, p + 4, 20);
    }
}

static void gen_q8_0(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / sqrtf(mean_sq(-127, 127));
    for (int64_t i = 0; i < nb; i++, p += 34) {
        put_f16(p, base * jitter(r));
        for (int j = 0; j < 32; j += 4) {
            uint64_t x = randw_next(r);
            for (int k = 0; k < 4; k++) {
                uint32_t u16 = (uint32_t)(x >> (16 * k)) & 0xffff;
                p[2 + j + k] = (uint8_t)(int8_t)((int)((u16 * 255u) >> 16) - 127);
            }
        }
    }
}

/* q2_K: sc in [8, 15], dmin ~ 1.5 d so m ~ sc centres q2 in [0, 3] at 1.5. */
static void gen_q2_K(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / (sqrtf(mean_sq(8, 15)) * rms_centred(4, 1.5f));
    for (int64_t i = 0; i < nb; i++, p += 84) {
        float d = f16_round(base * jitter(r));
        float dmin = f16_round(1.5f * d);
        bits16 bb = {0, 0};
        for (int j = 0; j < 16; j++) {
            int sc = pick(r, &bb, 8, 15);
            int m = dmin > 0 ? (int)(sc * 1.5f * d / dmin + 0.5f) : 0;
            if (m > 15) m = 15;
            p[j] = (uint8_t)(sc | (m << 4));
        }
        rand_bytes(r, p + 16, 64);
        put_f16(p + 80, d);
        put_f16(p + 82, dmin);
    }
}

/* q3_K: signed sub-scales sc-32 = +-[16, 31]; q3 - 4 in [-4, 3] from random bits. */
static void gen_q3_K(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / (sqrtf(mean_sq(16, 31)) * rms_centred(8, 4.0f));
    for (int64_t i = 0; i < nb; i++, p += 110) {
        rand_bytes(r, p, 32 + 64);            /* hmask, qs */
        bits16 bb = {0, 0};
        uint8_t *s = p + 96;
        memset(s, 0, 12);
        for (int j = 0; j < 16; j++) {
            int k = pick(r, &bb, 16, 31);
            int l = (next16(r, &bb) & 1) ? 32 + k : 32 - k;   /* 1..16 or 48..63 */
            if (j < 8) s[j] = (uint8_t)(l & 0xf);
            else s[j - 8] |= (uint8_t)((l & 0xf) << 4);
            s[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        put_f16(p + 108, base * jitter(r));
    }
}

/* q4_K / q5_K: sc in [32, 63]; dmin = 8 d (q4) or 16 d (q5) keeps m <= 61. */
static void gen_q45_K(randw_rng *r, float std, uint8_t *p, int64_t nb, int five)
{
    const float centre = five ? 15.5f : 7.5f, dmin_mul = five ? 16.0f : 8.0f;
    const int bsize = five ? 176 : 144;
    const float base = std / (sqrtf(mean_sq(32, 63)) * rms_centred(five ? 32 : 16, centre));
    for (int64_t i = 0; i < nb; i++, p += bsize) {
        float d = f16_round(base * jitter(r));
        float dmin = f16_round(dmin_mul * d);
        bits16 bb = {0, 0};
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = (uint8_t)pick(r, &bb, 32, 63);
            int mm = dmin > 0 ? (int)(sc[j] * centre * d / dmin + 0.5f) : 0;
            m[j] = (uint8_t)(mm > 63 ? 63 : mm);
        }
        put_f16(p, d);
        put_f16(p + 2, dmin);
        pack_k4_scales(sc, m, p + 4);
        rand_bytes(r, p + 16, bsize - 16);    /* (qh and) qs */
    }
}

/* q6_K: sc = +-[16, 63] (int8); q6 - 32 in [-32, 31]. */
static void gen_q6_K(randw_rng *r, float std, uint8_t *p, int64_t nb)
{
    const float base = std / (sqrtf(mean_sq(16, 63)) * rms_centred(64, 32.0f));
    for (int64_t i = 0; i < nb; i++, p += 210) {
        rand_bytes(r, p, 128 + 64);           /* ql, qh */
        bits16 bb = {0, 0};
        for (int j = 0; j < 16; j++) {
            int sc = pick(r, &bb, 16, 63);
            p[192 + j] = (uint8_t)(int8_t)((next16(r, &bb) & 1) ? -sc : sc);
        }
        put_f16(p + 208, base * jitter(r));
    }
}

/* ==== Public ==== */

int randw_quant_supported(int type)
{
    switch (type) {
    case QTYPE_Q4_0: case QTYPE_Q4_1: case QTYPE_Q5_0: case QTYPE_Q5_1: case QTYPE_Q8_0:
    case QTYPE_Q2_K: case QTYPE_Q3_K: case QTYPE_Q4_K: case QTYPE_Q5_K: case QTYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

int randw_quant_row(int type, randw_rng *r, float std, void *dst, int64_t n, err *e)
{
    if (!randw_quant_supported(type))
        return err_setf(e, ERR_UNSUPPORTED, "cannot generate random %s blocks", qtype_name(type));
    const qtype_info *qi = qtype_get(type);
    if (n < 0 || n % qi->blck)
        return err_setf(e, ERR_FORMAT, "row of %lld elements is not a multiple of %s's block size %d",
                        (long long)n, qi->name, qi->blck);
    int64_t nb = n / qi->blck;
    uint8_t *p = dst;
    switch (type) {
    case QTYPE_Q4_0: gen_q4_0(r, std, p, nb); break;
    case QTYPE_Q4_1: gen_q4_1(r, std, p, nb); break;
    case QTYPE_Q5_0: gen_q5_0(r, std, p, nb); break;
    case QTYPE_Q5_1: gen_q5_1(r, std, p, nb); break;
    case QTYPE_Q8_0: gen_q8_0(r, std, p, nb); break;
    case QTYPE_Q2_K: gen_q2_K(r, std, p, nb); break;
    case QTYPE_Q3_K: gen_q3_K(r, std, p, nb); break;
    case QTYPE_Q4_K: gen_q45_K(r, std, p, nb, 0); break;
    case QTYPE_Q5_K: gen_q45_K(r, std, p, nb, 1); break;
    case QTYPE_Q6_K: gen_q6_K(r, std, p, nb); break;
    default: break;
    }
    return 0;
}

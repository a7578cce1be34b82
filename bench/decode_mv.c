/* decode_mv: one thread's decode matvec rate for one weight type, compute
 * against memory, in one run (issue 5).
 *
 *   decode_mv [TYPE] [MB]     (default q4_K, 512 MB of weight rows)
 *
 * Rows are 2048 wide (an expert's gate/up input). Prints GB/s of weight
 * bytes for:
 *   l2        ops.dot over 64 rows re-read from cache (the compute limit)
 *   dram      ops.dot streaming MB of rows once (no software prefetch)
 *   dram+pfN  the same with each row prefetching row r+N (N = 4: the
 *             engine's QUANT_PF_ROWS via quant_gemm, forced here even
 *             where the engine turns it off (AMD: ops.pf_rows = 0); 8, 16)
 *   read      one 8-byte load per 64-byte line over the same bytes (the
 *             memory limit of one thread)
 * three rounds, wall time. A decode loop can at best reach min(l2, read);
 * where l2 is close to read the two do not overlap and the loop lands
 * near their harmonic mean.
 * For q4_K and q5_K each round also times the previous dot (old_dot_q4_K /
 * old_dot_q5_K below, copies of quant_avx2_dot_q4_K / _q5_K before their
 * reworks) on the same rows,
 * printed as "old l2 / old dram", and checks that both give the same bits;
 * "l2 pairs" then times 4000 alternating old/new passes over the 64 rows
 * (about 5 us each) and prints the median of each, which a shared machine's
 * slow spells (tens of ms) disturb far less than the long runs above. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/cpu.h"
#include "util/err.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ==== The previous Q4_K x Q8_K dot, kept for the A/B (bench-only copy;
 * the block layouts are llama.cpp's, as in src/quant/quant_impl.h). ==== */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } old_block_q4_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } old_block_q8_K;
_Static_assert(sizeof(old_block_q4_K) == 144, "q4_K size");
_Static_assert(sizeof(old_block_q8_K) == 292, "q8_K size");

static const uint8_t old_shuffle_k4[256] = {
     0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
     2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
     4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
     6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
     8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,
    10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,10,11,
    12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,12,13,
    14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,14,15,
};

static inline float old_hsum_f32_8(__m256 x)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float old_hsum_f32_4(__m128 r)
{
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* The Q4_K / Q5_K block's 6-bit scales and mins widened to int16 (scales
 * low half, mins high half), and the mins dotted with the pairwise-added
 * Q8_K bsums (*prod): the step both old dots share. */
static inline __m256i old_mins_scales(const uint8_t scales[12], const int16_t bsums[16], __m128i *prod)
{
    uint32_t utmp[4];
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    const __m256i mins_scales = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
    const __m256i q8sums = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
    *prod = _mm_madd_epi16(_mm256_extracti128_si256(mins_scales, 1), q8s);
    return mins_scales;
}

static float old_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    const old_block_q4_K *x = vw;
    const old_block_q8_K *y = va;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        __m128i prod;
        const __m256i mins_scales = old_mins_scales(x[i].scales, y[i].bsums, &prod);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        const __m128i sc128 = _mm256_castsi256_si128(mins_scales);
        const __m256i scales = _mm256_setr_m128i(sc128, sc128);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            const __m256i scale_l = _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)old_shuffle_k4 + 2 * j));
            const __m256i scale_h = _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)old_shuffle_k4 + 2 * j + 1));
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);
            const __m256i q4l = _mm256_and_si256(bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            __m256i pl = _mm256_maddubs_epi16(q4l, _mm256_loadu_si256((const __m256i *)q8));
            __m256i ph = _mm256_maddubs_epi16(q4h, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            pl = _mm256_madd_epi16(scale_l, pl);
            ph = _mm256_madd_epi16(scale_h, ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return old_hsum_f32_8(acc) + old_hsum_f32_4(acc_m);
}

/* The previous Q5_K x Q8_K dot (quant_avx2_dot_q5_K before its rework, in
 * the shape of ggml's AVX2 Q5_K), kept for the q5_K A/B. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } old_block_q5_K;
_Static_assert(sizeof(old_block_q5_K) == 176, "q5_K size");

static float old_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    const old_block_q5_K *x = vw;
    const old_block_q8_K *y = va;
    const __m256i m4 = _mm256_set1_epi8(0xF), mone = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 256; i++) {
        const float d = y[i].d * _cvtsh_ss(x[i].d);
        const float dmin = -y[i].d * _cvtsh_ss(x[i].dmin);
        __m128i prod;
        const __m256i mins_scales = old_mins_scales(x[i].scales, y[i].bsums, &prod);
        const __m128i hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, _mm_setzero_si128()), _mm_setzero_si128());
        summs = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(dmin), _mm_set_ss((float)_mm_cvtsi128_si32(hsum)), _mm_set_ss(summs)));
        const __m128i sc128 = _mm256_castsi256_si128(mins_scales);
        const __m256i scales = _mm256_setr_m128i(sc128, sc128);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i hmask = mone;
        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        int bit = 0;
        for (int j = 0; j < 4; j++, q5 += 32, q8 += 64) {
            const __m256i scale_0 = _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)old_shuffle_k4 + 2 * j));
            const __m256i scale_1 = _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)old_shuffle_k4 + 2 * j + 1));
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q5);
            const __m256i h0 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            hmask = _mm256_slli_epi16(hmask, 1);
            const __m256i h1 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            hmask = _mm256_slli_epi16(hmask, 1);
            const __m256i q0 = _mm256_add_epi8(_mm256_and_si256(bits, m4), h0);
            const __m256i q1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)q8));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            p0 = _mm256_madd_epi16(scale_0, p0);
            p1 = _mm256_madd_epi16(scale_1, p1);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return old_hsum_f32_8(acc) + summs;
}

typedef float (*dot_fn)(int64_t n, const void *w, const void *a);

/* GB/s of weight bytes: 64 rows re-read (l2) and all nw rows once (dram). */
static double time_l2(dot_fn dot, int64_t K, const unsigned char *w, size_t rs, const void *a, float *y, double bytes)
{
    const double t0 = now_s();
    const int it = (int)(bytes / (64.0 * (double)rs));
    for (int i = 0; i < it; i++)
        for (int r = 0; r < 64; r++) y[r] = dot(K, w + (size_t)r * rs, a);
    return (double)it * 64.0 * (double)rs / (now_s() - t0) / 1e9;
}

static double time_dram(dot_fn dot, int64_t K, const unsigned char *w, size_t rs, int nw, const void *a, float *y)
{
    const double t0 = now_s();
    for (int r = 0; r < nw; r++) y[r] = dot(K, w + (size_t)r * rs, a);
    return (double)nw * (double)rs / (now_s() - t0) / 1e9;
}

static int cmp_dbl(const void *p, const void *q)
{
    const double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

/* Median GB/s of np alternating passes of dot a, dot b over 64 rows. */
static void l2_pairs(dot_fn da, dot_fn db, int64_t K, const unsigned char *w, size_t rs, const void *a, float *y,
                     int np, double *ga, double *gb)
{
    double *t = malloc(sizeof(double) * 2 * (size_t)np);
    if (!t) { *ga = *gb = 0; return; }
    for (int i = 0; i < np; i++)
        for (int k = 0; k < 2; k++) {
            const dot_fn f = k ? db : da;
            const double t0 = now_s();
            for (int r = 0; r < 64; r++) y[r] = f(K, w + (size_t)r * rs, a);
            t[(size_t)k * (size_t)np + (size_t)i] = now_s() - t0;
        }
    qsort(t, (size_t)np, sizeof(double), cmp_dbl);
    qsort(t + np, (size_t)np, sizeof(double), cmp_dbl);
    *ga = 64.0 * (double)rs / t[np / 2] / 1e9;
    *gb = 64.0 * (double)rs / t[np + np / 2] / 1e9;
    free(t);
}

int main(int argc, char **argv)
{
    const char *tname = argc > 1 ? argv[1] : "q4_K";
    const long mb = argc > 2 ? atol(argv[2]) : 512;
    const int type = qtype_from_name(tname);
    const int64_t K = 2048;
    err e;
    err_clear(&e);
    quant_ops ops, aops;
    uint64_t rs, as;
    if (type < 0 || mb < 1 || quant_ops_get(type, cpu_best_isa(), &ops, &e) ||
        quant_ops_get(ops.dot_type, cpu_best_isa(), &aops, &e) || qtype_row_bytes(type, K, &rs, &e) ||
        qtype_row_bytes(ops.dot_type, K, &as, &e)) {
        fprintf(stderr, "decode_mv: bad type '%s' or size (%s)\n", tname, e.msg);
        return 2;
    }
    const int nw = (int)(((uint64_t)mb << 20) / rs);
    unsigned char *w = malloc((size_t)nw * rs), *a = malloc(as);
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * (size_t)nw);
    if (!w || !a || !x || !y) { fprintf(stderr, "decode_mv: out of memory\n"); return 1; }
    for (int64_t i = 0; i < K; i++) x[i] = (float)((i * 7) % 17 - 8) * 0.1f;
    for (int r = 0; r < nw; r++) ops.quant(x, w + (size_t)r * rs, K);
    aops.act_quant(x, a, K);
    const double bytes = (double)nw * (double)rs;
    printf("decode_mv: %s, %d rows x %lld, %.0f MB, 1 thread, isa %s\n", qtype_name(type), nw, (long long)K,
           bytes / 1e6, cpu_isa_name(cpu_best_isa()));
    const int ab = (type == QTYPE_Q4_K || type == QTYPE_Q5_K) && cpu_best_isa() >= CPU_ISA_AVX2;
    const dot_fn old_dot = type == QTYPE_Q5_K ? old_dot_q5_K : old_dot_q4_K;
    float *yo = ab ? malloc(sizeof(float) * (size_t)nw) : NULL;
    if (ab && !yo) { fprintf(stderr, "decode_mv: out of memory\n"); return 1; }
    for (int round = 1; round <= 3; round++) {
        /* old and new alternate which runs first (round 2: old first) */
        double ol2 = 0, odram = 0, l2 = 0, dram = 0;
        for (int k = 0; k < 2; k++) {
            if (ab && k == (round & 1)) ol2 = time_l2(old_dot, K, w, rs, a, yo, bytes);
            else if (k == 0 || ab) l2 = time_l2(ops.dot, K, w, rs, a, y, bytes);
        }
        for (int k = 0; k < 2; k++) {
            if (ab && k == (round & 1)) odram = time_dram(old_dot, K, w, rs, nw, a, yo);
            else if (k == 0 || ab) dram = time_dram(ops.dot, K, w, rs, nw, a, y);
        }
        if (ab && memcmp(y, yo, sizeof(float) * (size_t)nw)) { fprintf(stderr, "decode_mv: old and new %s dots differ\n", qtype_name(type)); return 1; }
        double t0 = now_s();
        quant_ops pf_ops = ops;
        pf_ops.pf_rows = QUANT_PF_ROWS;
        quant_gemm(&pf_ops, K, w, rs, nw, a, 0, 1, y, 1);
        const double pf4 = bytes / (now_s() - t0) / 1e9;
        double pf[2];
        for (int k = 0; k < 2; k++) {
            const int d = k ? 16 : 8;
            t0 = now_s();
            for (int r = 0; r < nw; r++) {
                if (r + d < nw)
                    for (size_t o = 0; o < rs; o += 64) __builtin_prefetch(w + (size_t)(r + d) * rs + o, 0, 1);
                y[r] = ops.dot(K, w + (size_t)r * rs, a);
            }
            pf[k] = bytes / (now_s() - t0) / 1e9;
        }
        t0 = now_s();
        uint64_t acc = 0;
        for (size_t i = 0; i + 8 <= (size_t)bytes; i += 64) { uint64_t v; memcpy(&v, w + i, 8); acc += v; }
        const double rd = bytes / (now_s() - t0) / 1e9;
        printf("round %d: l2 %.2f  dram %.2f  dram+pf4 %.2f  dram+pf8 %.2f  dram+pf16 %.2f  read %.2f GB/s%s\n",
               round, l2, dram, pf4, pf[0], pf[1], rd, acc == 42 ? " " : "");
        if (ab) {
            double po, pn;
            l2_pairs(old_dot, ops.dot, K, w, rs, a, y, 4000, &po, &pn);
            printf("         old l2 %.2f  old dram %.2f GB/s (new/old: l2 %.2fx, dram %.2fx); l2 pairs: old %.2f new %.2f "
                   "GB/s (%.2fx)\n", ol2, odram, l2 / ol2, dram / odram, po, pn, pn / po);
        }
    }
    free(yo);
    free(w); free(a); free(x); free(y);
    return 0;
}

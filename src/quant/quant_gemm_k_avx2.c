/* quant_gemm_k_avx2: blocked AVX2 matmul kernels (quant.h quant_gemm_fn) for
 * the K-quants Q2_K Q3_K Q4_K Q5_K Q6_K against Q8_K activation rows.
 * Compiled with -mavx2 -mfma -mf16c (the Makefile's rule for *_avx2.c);
 * quant.c hands them out only when cpu_detect() reports all three.
 *
 * Contract (quant.h): y[c * ldy + r] = dot(n, w + r * wstride, a + c * astride)
 * for r < nw, c < na, every output BIT-IDENTICAL to the same type's
 * quant_avx2_dot_* (quant_avx2.c) on that pair. How that holds:
 *   - every float operation of a pair is the dot's, in the same order: per
 *     super-block the same products d = y.d * h2f(x.d) and dmin = -y.d *
 *     h2f(x.dmin) (computed for 8 rows in one vector multiply: lane c is
 *     the same IEEE product), the same FMAs into the same accumulator lanes
 *     block after block, and the same tree of adds in the final horizontal
 *     sums (done for 8 rows at once, in "pair order"; see hsum8_rows);
 *   - the int32 per-lane block sums (sumi) are the dot's lane for lane: the
 *     same maddubs/madd pairs land in the same 32-bit lanes; only the order
 *     of the int32 additions inside a lane differs, which is exact (wrapping
 *     int32 addition is associative; the true sums are far below 2^31), and
 *     the int16 maddubs steps see the same byte pairs as in the dot (where
 *     the quant bytes are built with fewer instructions, they are the same
 *     bytes), so they saturate never (bounds per type below) and identically.
 * What changes is the loop structure:
 *   - register blocking: a weight super-block's quants and scales are
 *     unpacked once and applied to up to NA_BLK = 8 activation rows, each
 *     with its own accumulators (1 weight row x 8 activation rows; then 4,
 *     then 2..3 for the rest of na; a single row is the dot itself);
 *   - work shared across weight rows: per activation group the values that
 *     depend only on the activations (sub-block sums of bsums, y.d, -y.d)
 *     are computed once (blk_aux) instead of once per weight row;
 *   - cache blocking: a chunk of weight rows (about WCHUNK_BYTES) is run
 *     against every group of activation rows before moving on, so the
 *     chunk stays in L2 while each group of 8 activation rows (8 x n/256 x
 *     292 bytes: 18.7 KB at n = 2048) stays in L1.
 * Short rows (the MoE down projections: n = 256..768, 1..3 super-blocks)
 * are where fixed costs show; the kernels are issue-bound (the int8 chain
 * of the peak is maddubs + madd on ports 0/1, an add anywhere, and every
 * other vector uop competes for the same three ports), so the work outside
 * the maddubs/madd/add core is kept small:
 *   - the weight-row loop runs inside the kernel (rows_fn takes a chunk's
 *     rows), so constants and the stack frame are set up once per chunk and
 *     group, not per row (at n = 256 that setup was about a third of a row);
 *   - values the inner loops broadcast (per-sub-block scales as int16 pairs,
 *     each row's d) are stored once per super-block and re-read with
 *     vpbroadcastd / vbroadcastss, pure load uops, instead of a vpshufb or
 *     vpermps each (bcast_buf);
 *   - Q4_K/Q5_K scale unpacking is done in SIMD (k4_scales_mins) from one
 *     16-byte load that also yields d and dmin (vcvtph2ps), instead of the
 *     scalar k4_unpack plus inserts;
 *   - Q6_K's -32 offset is one madd with -32 * scale per row (exact);
 *   - the final horizontal sums come out in pair order, which needs no
 *     cross-lane permutes for the two-rows-per-vector mins accumulators, and
 *     are stored with scalar moves (no vextractps).
 * Measured (bench/gemm.c): Q4_K at n = 256 went from about 42% to 55-60%
 * of the int8 peak, at n = 768 from 59% to 68%.
 * Rows longer than AUX_BLOCKS super-blocks (n > 32768) take the dot loop.
 * The single-row dots are the reference; tests/unit/test_gemm_k.c checks
 * every output bitwise against them (bench/gemm.c measures the speed). No
 * allocation (24 KB of stack, 40 KB with Q4_K's packed activations,
 * q4_K_kx), no state. */
#include "quant/quant_impl.h"

#include <immintrin.h>

#include "quant/quant_avx2_common.h"

#if defined(__clang__)
/* Keep scalar expressions unfused, as quant_avx2.c does (GCC in ISO C mode
 * never contracts), so the scale arithmetic is the dot's. */
#pragma STDC FP_CONTRACT OFF
#endif

#define NA_BLK 8                    /* activation rows per register block */
#define WCHUNK_BYTES (128 * 1024)   /* weight bytes per cache block (L2) */

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* ==== Helpers (the shared ones are in quant_avx2_common.h) ==== */

/* quant_avx2.c's k4_unpack in SIMD, for Q4_K/Q5_K blocks: head = the block's first 16
 * bytes (d, dmin, scales[12]); returns, in both 128-bit halves, the bytes
 * sc0..sc7 m0..m7 that k4_unpack writes to utmp (the same bit selections:
 * j < 4: low 6 bits of scales[j] / scales[j + 4]; j >= 4: low / high
 * nibble of scales[j + 4] plus the top 2 bits of scales[j - 4] / scales[j]
 * as bits 4..5). 16-bit shifts only move bits within a word and the masks
 * keep only the wanted ones. */
static inline __m256i k4_scales_mins(__m128i head)
{
    const __m128i a = _mm_shuffle_epi8(head, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i b = _mm_shuffle_epi8(head, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i lo = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i nib = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));
    return _mm256_broadcastsi128_si256(_mm_or_si128(_mm_or_si128(lo, nib), top));
}
/* pshufb masks on k4_scales_mins: k4_sc32 gives dword s = (sc_s, sc_s) as
 * two int16 (the value every int16 of shuffle_k4(s) holds: broadcast as a
 * dword it is that whole vector); k4_mins16 gives m0..m7 as int16 in both
 * halves (the dot's mins half of cvtepu8_epi16, twice). */
static inline __m256i k4_sc32(void)
{
    return _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                            4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
}
static inline __m256i k4_mins16(void)
{
    return _mm256_setr_epi8(8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1,
                            8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1);
}

/* Per-super-block values that the inner loops broadcast: stored once, then
 * read back with vpbroadcastd / vbroadcastss from memory, which on x86 are
 * pure load uops (no shuffle port), where a register broadcast (vpermps,
 * vpshufb) costs one ALU uop per use. BCAST_BARRIER makes the compiler
 * forget the stored values, so that it emits those loads instead of turning
 * them back into register shuffles. */
typedef struct bcast_buf {
    _Alignas(32) int32_t i[8];
    _Alignas(32) float f[8];
} bcast_buf;
#if defined(__GNUC__)
#define BCAST_BARRIER(b) __asm__("" : "+m"(b))
#else
#define BCAST_BARRIER(b) ((void)0)
#endif

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Register barrier: the compiler must materialize v here and forget what it
 * knows about it. Used on the int32 block accumulators so that GCC does not
 * reassociate a whole block's maddubs/madd products into one late add tree
 * (which keeps every product live and spills them); the sums are exact, so
 * the barrier changes no result, only the schedule. Emits no instruction. */
#if defined(__GNUC__)
#define KEEP(v) __asm__("" : "+x"(v))
#else
#define KEEP(v) ((void)0)
#endif

/* ==== AVX-VNNI ====
 * The blocked loops' int32 step "acc + madd(scale16, prods16)" is exactly
 * AVX-VNNI's vpdpwssd (each int32 lane += the sum of its two int16
 * products; no saturation, wrapping add like vpaddd), so with it the same
 * int32 sums come out of one instruction instead of two: bit-identical
 * results, one uop less per maddubs. The row kernels below are written
 * once, with a constant `vnni` argument that picks dp16's form; the
 * AVX-VNNI instances (t##_rows_vnni, built with the avxvnni target
 * attribute, as quant_avx2.c's quant_avxvnni_dot_q4_K) are compiled only
 * where the compiler knows the instruction (gcc >= 11, clang), and
 * quant.c hands them out only for CPU_ISA_AVXVNNI (quant_ops_get checks
 * the CPU). Everything else, the float operations included, is the same
 * code in both instances. On CPU_ISA_AVX512 the same bodies run as
 * t##_rows_evex instances (GEMM_TARGET_AVX512, dp16_evex: the EVEX
 * encoding of vpdpwssd, for CPUs with AVX-512 but no AVX-VNNI).
 * dp16_vnni is not always_inline on purpose: the
 * shared kernel body that calls it is compiled for plain AVX2 (where the
 * call is dead code for vnni = 0) and inlined into the AVX-VNNI rows
 * functions, where the call is then inlined (checked in the object code:
 * no calls in the *_rows_vnni functions). */
#ifdef GEMM_HAVE_AVXVNNI   /* quant_avx2_common.h */
GEMM_TARGET_VNNI static inline __m256i dp16_vnni(__m256i acc, __m256i s16, __m256i p16)
{
    return _mm256_dpwssd_avx_epi32(acc, s16, p16);
}
GEMM_TARGET_AVX512 static inline __m256i dp16_evex(__m256i acc, __m256i s16, __m256i p16)
{
    return _mm256_dpwssd_epi32(acc, s16, p16);
}
#endif
/* acc + madd(s16, p16) in int32 lanes: vpmaddwd + vpaddd, or one vpdpwssd
 * (vnni: VNNI_NONE, VNNI_VEX or VNNI_EVEX) */
static ALWAYS_INLINE __m256i dp16(const int vnni, __m256i acc, __m256i s16, __m256i p16)
{
#ifdef GEMM_HAVE_AVXVNNI
    if (vnni == VNNI_VEX) return dp16_vnni(acc, s16, p16);
    if (vnni == VNNI_EVEX) return dp16_evex(acc, s16, p16);
#else
    (void)vnni;
#endif
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s16, p16));
}

/* ==== Driver ==== */

/* Per (super-block, activation group) values that every weight row of a
 * chunk would otherwise recompute, filled once per group and chunk:
 *   q8s[c]:     the eight 32-value sub-block sums of row c (the Q4_K/Q5_K
 *               dots' _mm_hadd_epi16 of bsums; |sum| <= 4064 fits int16);
 *   yd[c], nyd[c]: y.d and -y.d of row c, so that one vector multiply by
 *               broadcast h2f(x.d) gives all rows' d = y.d * h2f(x.d) (and
 *               dmin = -y.d * h2f(x.dmin)), lane c the same IEEE product as
 *               the dot's scalar one.
 * Rows c >= nc are zero (their lanes are computed and discarded). */
typedef struct blk_aux {
    __m128i q8s[NA_BLK];
    float   yd[NA_BLK], nyd[NA_BLK];
} blk_aux;
#define AUX_BLOCKS 128   /* n <= 32768 (24 KB of stack); longer rows take the dot loop */

/* A rows kernel: nr weight rows (wstride bytes apart) against nc (2, 3, 4 or
 * 8) activation rows, y[c * ldy + r] = dot(w + r * wstride, a + c * astride)
 * for r < nr, c < nc; aux[i] for super-block i. The row loop lives inside
 * the kernel so that its constants (shuffle masks, permute indices) and
 * stack frame are set up once per (chunk, group), not once per weight row:
 * with short rows (n = 256: one super-block) that setup cost as much as a
 * third of the work. */
typedef void (*rows_fn)(int64_t nb, const void *w, size_t wstride, int nr, const uint8_t *a, size_t astride, int nc,
                        float *y, size_t ldy, const blk_aux *aux);
typedef float (*dot_fn)(int64_t n, const void *w, const void *a);

#define YBLK(c) ((const block_q8_K *)(a + (size_t)(c) * astride))

/* Always inlined: GCC 12.2 at -O2 was seen to delete out-of-line calls of
 * this function (as if its stores to aux were dead, though the row kernel
 * called next reads them) once it had two call sites; inlined, its stores
 * are ordinary stores and stay. */
static ALWAYS_INLINE void aux_fill(int64_t nb, const uint8_t *a, size_t astride, int nc, blk_aux *aux)
{
    for (int64_t i = 0; i < nb; i++) {
        blk_aux *x = aux + i;
        for (int c = 0; c < NA_BLK; c++) {
            if (c < nc) {
                const block_q8_K *yb = YBLK(c) + i;
                const __m256i q8sums = load256(yb->bsums);
                x->q8s[c] = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
                x->yd[c] = yb->d;
                x->nyd[c] = -yb->d;
            } else {
                x->q8s[c] = _mm_setzero_si128();
                x->yd[c] = x->nyd[c] = 0.0f;
            }
        }
    }
}

/* Cache blocking around a row kernel (see the file comment): for each chunk
 * of weight rows (about WCHUNK_BYTES), for each group of activation rows (8
 * at a time, then a 4 and the 1..3 rest; a group of 1 is the plain dot),
 * every row of the chunk. wblock:
 * bytes of one weight super-block; dot: the type's single-row dot, used
 * for rows longer than AUX_BLOCKS super-blocks. Every (r, c) pair is
 * computed exactly once. */
static void gemm_blocked_k(int64_t n, const void *w, size_t wstride, int nw, const void *a, size_t astride, int na,
                           float *y, size_t ldy, size_t wblock, rows_fn fn, dot_fn dot)
{
    const int64_t nb = n / QK_K;
    const uint8_t *wb = w, *ab = a;
    if (nb > AUX_BLOCKS) {
        for (int r = 0; r < nw; r++)
            for (int c = 0; c < na; c++)
                y[(size_t)c * ldy + (size_t)r] = dot(n, wb + (size_t)r * wstride, ab + (size_t)c * astride);
        return;
    }
    blk_aux aux[AUX_BLOCKS];
    const size_t wbytes = (size_t)nb * wblock;
    int chunk = wbytes ? (int)(WCHUNK_BYTES / wbytes) : nw;
    if (chunk < 1) chunk = 1;
    for (int r0 = 0; r0 < nw; r0 += chunk) {
        const int r1 = nw - r0 < chunk ? nw : r0 + chunk;
        for (int c0 = 0; c0 < na;) {
            const int left = na - c0, nc = left >= NA_BLK ? NA_BLK : left >= 4 ? 4 : left;
            const uint8_t *ac = ab + (size_t)c0 * astride;
            float *yc = y + (size_t)c0 * ldy;
            if (nc == 1) {   /* nothing to share: the dot itself is the fastest kernel */
                for (int r = r0; r < r1; r++) yc[r] = dot(n, wb + (size_t)r * wstride, ac);
            } else {
                aux_fill(nb, ac, astride, nc, aux);
                fn(nb, wb + (size_t)r0 * wstride, wstride, r1 - r0, ac, astride, nc, yc + r0, ldy, aux);
            }
            c0 += nc;
        }
    }
}

/* One activation row (decode: quant_gemm calls the kernel once per weight
 * row, nw = na = 1) is the dot loop; taken here, before gemm_blocked_k's
 * 24 KB frame and chunk set-up, which cost about as much as a whole
 * 256-wide dot. */
static inline void gemm_blocked(int64_t n, const void *w, size_t wstride, int nw, const void *a, size_t astride,
                                int na, float *y, size_t ldy, size_t wblock, rows_fn fn, dot_fn dot)
{
    if (na == 1) {
        const uint8_t *wb = w;
        for (int r = 0; r < nw; r++) y[r] = dot(n, wb + (size_t)r * wstride, a);
        return;
    }
    gemm_blocked_k(n, w, wstride, nw, a, astride, na, y, ldy, wblock, fn, dot);
}

/* Instantiate a row kernel body (static ALWAYS_INLINE t##_k(..., nc, ...))
 * for each constant nc the driver uses, so that the per-row arrays in the
 * body become registers. */
#define ROWS_LOOP(t, NC, VNNI) \
    for (int r = 0; r < nr; r++) \
        t##_k(nb, (const uint8_t *)w + (size_t)r * wstride, a, astride, NC, y + r, ldy, aux, VNNI)
#define ROWS_FN(t, name, attr, VNNI) \
    attr static void name(int64_t nb, const void *w, size_t wstride, int nr, const uint8_t *a, size_t astride, \
                          int nc, float *y, size_t ldy, const blk_aux *aux) \
    { \
        switch (nc) { \
        case 8: ROWS_LOOP(t, 8, VNNI); break; \
        case 4: ROWS_LOOP(t, 4, VNNI); break; \
        case 3: ROWS_LOOP(t, 3, VNNI); break; \
        default: ROWS_LOOP(t, 2, VNNI); break; \
        } \
    }
/* t##_rows: plain AVX2; t##_rows_vnni and t##_rows_evex: the same body
 * with vpdpwssd, AVX-VNNI and AVX512-VNNI encoded */
#ifdef GEMM_HAVE_AVXVNNI
#define ROWS_DISPATCH(t) \
    ROWS_FN(t, t##_rows, , VNNI_NONE) ROWS_FN(t, t##_rows_vnni, GEMM_TARGET_VNNI, VNNI_VEX) \
    ROWS_FN(t, t##_rows_evex, GEMM_TARGET_AVX512, VNNI_EVEX)
#else
#define ROWS_DISPATCH(t) ROWS_FN(t, t##_rows, , 0)
#endif
_Static_assert(NA_BLK == 8, "ROWS_DISPATCH, gemm_blocked and the lane tables assume groups of 8");

/* vpermps indices: broadcast lane c; lanes (2p, 2p+1) to the two halves. */
static inline __m256 lane_bcast(__m256 v, int c) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(c)); }
static inline __m256 lane_pair(__m256 v, int p)
{
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1));
}

/* Horizontal sums of 8 rows at once, each bit-identical to the single-row
 * helpers (same tree of float adds per row, only packed):
 *   hsum_f32_8(x) = ((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7))
 *   hsum_f32_4(r) = (r0+r2) + (r1+r3)
 * Results come in "pair order": lanes 0..3 hold rows 0 2 4 6, lanes 4..7
 * rows 1 3 5 7 (PAIR_ROW(l)). That is the order in which rows packed two
 * per vector (row 2p low half, 2p+1 high half) come out of one sum4_step
 * with no cross-lane permutes first; store_rows puts each lane in its row
 * for free (scalar stores).
 * sum4_step: from S[k] = [row 2k | row 2k+1] (4 lanes each), lane l of the
 * result is hsum_f32_4 of row PAIR_ROW(l). */
#define PAIR_ROW(l) ((l) < 4 ? 2 * (l) : 2 * ((l) - 4) + 1)
static inline __m256 sum4_step(__m256 s0, __m256 s1, __m256 s2, __m256 s3)
{
    const __m256 r1 = _mm256_add_ps(_mm256_shuffle_ps(s0, s1, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s0, s1, _MM_SHUFFLE(3, 2, 3, 2)));   /* a0+a2 a1+a3 b0+b2 b1+b3 */
    const __m256 r2 = _mm256_add_ps(_mm256_shuffle_ps(s2, s3, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s2, s3, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(r1, r2, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(r1, r2, _MM_SHUFFLE(3, 1, 3, 1)));
}
/* lane l = hsum_f32_8(v[PAIR_ROW(l)]) */
static inline __m256 hsum8_rows(const __m256 v[NA_BLK])
{
    __m256 s[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        s[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20));
    return sum4_step(s[0], s[1], s[2], s[3]);
}
/* lane l = hsum_f32_4(row PAIR_ROW(l)), rows packed in pairs: m[p] = [row 2p | row 2p+1] */
static inline __m256 hsum4_pairs(const __m256 m[NA_BLK / 2]) { return sum4_step(m[0], m[1], m[2], m[3]); }
/* y[PAIR_ROW(l) * ldy] = lane l of v, for the rows < nc. Through memory and
 * scalar moves (load and store ports) rather than vextractps (a shuffle uop
 * per row): the shuffle ports are the kernels' bottleneck. */
static inline void store_rows(__m256 v, int nc, float *y, size_t ldy)
{
    bcast_buf t;
    _mm256_store_ps(t.f, v);
    BCAST_BARRIER(t);
#pragma GCC unroll 8
    for (int l = 0; l < NA_BLK; l++)
        if (PAIR_ROW(l) < nc) y[(size_t)PAIR_ROW(l) * ldy] = t.f[l];
}

/* quant_avx2_gemm_t and quant_avxvnni_gemm_t (vdot: the single-row dot
 * the AVX-VNNI ops use, bit-identical to quant_avx2_dot_t); without
 * compiler support for AVX-VNNI the latter is the AVX2 kernel. GEMM_SIG:
 * the signature every quant_<isa>_gemm_<t> shares (quant_impl.h). */
#define GEMM_SIG(isa, t) \
    void quant_##isa##_gemm_##t(int64_t n, const void *w, size_t wstride, int nw, const void *a, size_t astride, \
                                int na, float *y, size_t ldy)
#define DEFINE_GEMM_AVX2(t) \
    GEMM_SIG(avx2, t) \
    { \
        gemm_blocked(n, w, wstride, nw, a, astride, na, y, ldy, sizeof(block_##t), t##_rows, quant_avx2_dot_##t); \
    }
#ifdef GEMM_HAVE_AVXVNNI
#define DEFINE_GEMM(t, vdot) \
    DEFINE_GEMM_AVX2(t) \
    GEMM_SIG(avxvnni, t) \
    { \
        gemm_blocked(n, w, wstride, nw, a, astride, na, y, ldy, sizeof(block_##t), t##_rows_vnni, vdot); \
    }
#else
#define DEFINE_GEMM(t, vdot) \
    DEFINE_GEMM_AVX2(t) \
    GEMM_SIG(avxvnni, t) { quant_avx2_gemm_##t(n, w, wstride, nw, a, astride, na, y, ldy); }
#endif
/* quant_avx512_gemm_t for the types without a 512-bit kernel: the
 * t##_rows_evex instance (zdot: the single-row dot for long rows) */
#ifdef GEMM_HAVE_AVX512
#define DEFINE_GEMM_EVEX(t, zdot) \
    GEMM_SIG(avx512, t) \
    { \
        gemm_blocked(n, w, wstride, nw, a, astride, na, y, ldy, sizeof(block_##t), t##_rows_evex, zdot); \
    }
#else
#define DEFINE_GEMM_EVEX(t, zdot) \
    GEMM_SIG(avx512, t) { quant_avx2_gemm_##t(n, w, wstride, nw, a, astride, na, y, ldy); }
#endif

/* ==== Q4_K ====
 * Dot (quant_avx2_dot_q4_K), per super-block: acc_m += dmin * (mins . q8s)
 * (4 lanes), sumi = sum_j scale * maddubs(q4, q8) (8 lanes), acc += d * sumi;
 * result hsum(acc) + hsum(acc_m). int16: 2 * 15 * 127 = 3810, no saturation.
 * Here two rows' 4-lane acc_m share one vector (row 2p low half, 2p+1 high
 * half: the same lane operations, half the instructions). */
/* The Q4_K kernel of nc activation rows for one weight row. The
 * activations come either from the rows themselves (a, astride) or, when
 * q8x is given, from the packed copy described below (q4_K_kx); the
 * arithmetic is the same, operation for operation. Each block's first
 * step is the madd itself (0 + madd: exact), so no zeroed register is
 * copied per row and block. */
/* Per super-block x of the Q4_K row kernels: the mins term of every row
 * pair into acc_m, and the rows' d (vd8 lane c = y.d * h2f(x.d)) and the
 * scale dwords (s[2j] low nibbles, s[2j+1] high nibbles of step j). */
static ALWAYS_INLINE void q4_K_head(const block_q4_K *x, const blk_aux *ax, const int np, __m256 *acc_m, __m256 *vd8,
                                    __m256i *scales)
{
    const __m128i head = _mm_loadu_si128((const __m128i *)x);   /* d, dmin, scales[12] */
    const __m128 dh = _mm_cvtph_ps(head);                       /* h2f(x.d), h2f(x.dmin), . . */
    *vd8 = _mm256_mul_ps(_mm256_loadu_ps(ax->yd), _mm256_broadcastss_ps(dh));
    const __m256 vdmin8 = _mm256_mul_ps(_mm256_loadu_ps(ax->nyd), _mm256_broadcastss_ps(_mm_movehdup_ps(dh)));
    const __m256i sm = k4_scales_mins(head);
    const __m256i mins2 = _mm256_shuffle_epi8(sm, k4_mins16());
    *scales = _mm256_shuffle_epi8(sm, k4_sc32());
#pragma GCC unroll 4
    for (int p = 0; p < np; p++) {
        const __m256i prod = _mm256_madd_epi16(mins2, load256(&ax->q8s[2 * p]));
        acc_m[p] = _mm256_fmadd_ps(lane_pair(vdmin8, p), _mm256_cvtepi32_ps(prod), acc_m[p]);
    }
}

/* The Q4_K row kernels' accumulators: nc rows, (nc + 1) / 2 row pairs. */
static ALWAYS_INLINE void q4_K_zero(__m256 *acc, __m256 *acc_m, const int nc)
{
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int p = 0; p < (nc + 1) / 2; p++) acc_m[p] = _mm256_setzero_ps();
}

/* y = hsum_f32_8(acc) + hsum_f32_4(acc_m), all nc rows at once */
static ALWAYS_INLINE void q4_K_store(const __m256 *acc, const __m256 *acc_m, const int nc, float *y, size_t ldy)
{
    const int np = (nc + 1) / 2;
    __m256 v[NA_BLK], m[NA_BLK / 2];
#pragma GCC unroll 8
    for (int c = 0; c < NA_BLK; c++) v[c] = c < nc ? acc[c] : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int p = 0; p < NA_BLK / 2; p++) m[p] = p < np ? acc_m[p] : _mm256_setzero_ps();
    store_rows(_mm256_add_ps(hsum8_rows(v), hsum4_pairs(m)), nc, y, ldy);
}

static ALWAYS_INLINE void q4_K_core(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int8_t *q8x,
                                    const int nc, float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    const block_q4_K *x = vw;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const int np = (nc + 1) / 2;
    __m256 acc[NA_BLK], acc_m[NA_BLK / 2];
    q4_K_zero(acc, acc_m, nc);
    for (int64_t i = 0; i < nb; i++) {
        __m256 vd8;
        __m256i scales;
        q4_K_head(&x[i], aux + i, np, acc_m, &vd8, &scales);
        bcast_buf sb;
        _mm256_store_si256((__m256i *)sb.i, scales);
        _mm256_store_ps(sb.f, vd8);
        BCAST_BARRIER(sb);
        __m256i sumi[NA_BLK];   /* set by j = 0 */
        const uint8_t *q4 = x[i].qs;
#pragma GCC unroll 4
        for (int j = 0; j < QK_K / 64; j++, q4 += 32) {
            const __m256i scale_l = _mm256_set1_epi32(sb.i[2 * j]);
            const __m256i scale_h = _mm256_set1_epi32(sb.i[2 * j + 1]);
            const __m256i bits = load256(q4);
            const __m256i q4l = _mm256_and_si256(bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = q8x ? q8x + ((size_t)i * NA_BLK + (size_t)c) * QK_K + 64 * j
                                       : YBLK(c)[i].qs + 64 * j;
                const __m256i p0 = _mm256_maddubs_epi16(q4l, load256(q8));
                sumi[c] = j == 0 ? _mm256_madd_epi16(scale_l, p0) : dp16(vnni, sumi[c], scale_l, p0);
                sumi[c] = dp16(vnni, sumi[c], scale_h, _mm256_maddubs_epi16(q4h, load256(q8 + 32)));
                KEEP(sumi[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb.f[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    q4_K_store(acc, acc_m, nc, y, ldy);
}

static ALWAYS_INLINE void q4_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    q4_K_core(nb, vw, a, astride, NULL, nc, y, ldy, aux, vnni);
}

/* Packed-activation form of q4_K_k, for rows of at most Q4X_BLOCKS
 * super-blocks (n <= 2048: the MoE shapes). The rows function copies the
 * group's quants once into q8x (super-block i of row c at (i * NA_BLK + c) *
 * QK_K), so that every activation load of the inner loop is one base
 * pointer plus a constant displacement: no per-row pointer set-up (8
 * pointers, and their spills, per weight row) and no per-row pointer
 * increments per super-block, which at n = 256..768 was a large share of
 * the fixed work. The arithmetic is q4_K_core's. */
#define Q4X_BLOCKS 8
static ALWAYS_INLINE void q4_K_kx(int64_t nb, const void *vw, const int8_t *q8x, const int nc, float *y, size_t ldy,
                                  const blk_aux *aux, const int vnni)
{
    q4_K_core(nb, vw, NULL, 0, q8x, nc, y, ldy, aux, vnni);
}
/* Copy nc activation rows' quants of nb super-blocks into a packed
 * buffer: super-block i of row c at dst + (i * NA_BLK + c) * QK_K, its
 * 32-byte piece k taken from byte off[k] of the row's quants (q4x_off:
 * as they are, for q4_K_kx; q4z_off: in step pairs, for q4_K_kz). */
static const int q4x_off[8] = { 0, 32, 64, 96, 128, 160, 192, 224 };
static ALWAYS_INLINE void q4_K_pack(int64_t nb, const uint8_t *a, size_t astride, int nc, int8_t *dst, const int *off)
{
    for (int64_t i = 0; i < nb; i++)
        for (int c = 0; c < nc; c++) {
            const int8_t *src = YBLK(c)[i].qs;
            int8_t *d = dst + ((size_t)i * NA_BLK + (size_t)c) * QK_K;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) _mm256_store_si256((__m256i *)(d + 32 * k), load256(src + off[k]));
        }
}
#define Q4_ROWS_LOOPX(NC, VNNI) \
    for (int r = 0; r < nr; r++) q4_K_kx(nb, (const uint8_t *)w + (size_t)r * wstride, q8x, NC, y + r, ldy, aux, VNNI)
#define Q4_ROWS_FN(name, attr, VNNI) \
    attr static void name(int64_t nb, const void *w, size_t wstride, int nr, const uint8_t *a, size_t astride, \
                          int nc, float *y, size_t ldy, const blk_aux *aux) \
    { \
        if (nb > Q4X_BLOCKS) { \
            switch (nc) { \
            case 8: ROWS_LOOP(q4_K, 8, VNNI); break; \
            case 4: ROWS_LOOP(q4_K, 4, VNNI); break; \
            case 3: ROWS_LOOP(q4_K, 3, VNNI); break; \
            default: ROWS_LOOP(q4_K, 2, VNNI); break; \
            } \
            return; \
        } \
        _Alignas(32) int8_t q8x[Q4X_BLOCKS * NA_BLK * QK_K]; \
        q4_K_pack(nb, a, astride, nc, q8x, q4x_off); \
        switch (nc) { \
        case 8: Q4_ROWS_LOOPX(8, VNNI); break; \
        case 4: Q4_ROWS_LOOPX(4, VNNI); break; \
        case 3: Q4_ROWS_LOOPX(3, VNNI); break; \
        default: Q4_ROWS_LOOPX(2, VNNI); break; \
        } \
    }
Q4_ROWS_FN(q4_K_rows, , VNNI_NONE)
#ifdef GEMM_HAVE_AVXVNNI
Q4_ROWS_FN(q4_K_rows_vnni, GEMM_TARGET_VNNI, VNNI_VEX)
Q4_ROWS_FN(q4_K_rows_evex, GEMM_TARGET_AVX512, VNNI_EVEX)
#endif
DEFINE_GEMM(q4_K, quant_avxvnni_dot_q4_K)

#ifdef GEMM_HAVE_AVX512
/* ==== Q4_K, AVX-512 (512-bit maddubs and vpdpwssd) ====
 * q4_K_kx's arithmetic with two of the four 64-weight steps j in one
 * 512-bit register: a 64-byte load of qs holds steps 2P (low half) and
 * 2P+1 (high half), the packed activations (q8z below) are laid out to
 * match, and each half is multiplied by its own step's scales. Lane l of
 * the low half then accumulates steps 0 and 2, of the high half steps 1
 * and 3; adding the halves gives the int32 sums q4_K_core's lane l holds
 * (the same products in the same int16 pairs, exact integer sums), and
 * the float part is q4_K_core's, operation for operation: bit-identical. */
/* Activations of super-block i, row c at q8z + (i * NA_BLK + c) * QK_K, in
 * the order [0..32 | 64..96] [32..64 | 96..128] [128..160 | 192..224]
 * [160..192 | 224..256]: register 2P + h holds the quants that multiply
 * the low (h = 0) or high (h = 1) nibbles of qs[64P .. 64P + 64). */
GEMM_TARGET_AVX512 static ALWAYS_INLINE void q4_K_kz(int64_t nb, const void *vw, const int8_t *q8z, const int nc,
                                                      float *y, size_t ldy, const blk_aux *aux)
{
    const block_q4_K *x = vw;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i sel0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i sel1 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m512i four = _mm512_set1_epi32(4);
    const int np = (nc + 1) / 2;
    __m256 acc[NA_BLK], acc_m[NA_BLK / 2];
    q4_K_zero(acc, acc_m, nc);
    for (int64_t i = 0; i < nb; i++) {
        __m256 vd8;
        __m256i scales;
        q4_K_head(&x[i], aux + i, np, acc_m, &vd8, &scales);
        bcast_buf sb;
        _mm256_store_ps(sb.f, vd8);
        BCAST_BARRIER(sb);
        const __m512i sc = _mm512_castsi256_si512(scales);
        const __m512i sl0 = _mm512_permutexvar_epi32(sel0, sc), sh0 = _mm512_permutexvar_epi32(sel1, sc);
        const __m512i sl1 = _mm512_permutexvar_epi32(_mm512_add_epi32(sel0, four), sc);
        const __m512i sh1 = _mm512_permutexvar_epi32(_mm512_add_epi32(sel1, four), sc);
        const __m512i b0 = _mm512_loadu_si512((const void *)x[i].qs);
        const __m512i b1 = _mm512_loadu_si512((const void *)(x[i].qs + 64));
        const __m512i l0 = _mm512_and_si512(b0, m4), h0 = _mm512_and_si512(_mm512_srli_epi16(b0, 4), m4);
        const __m512i l1 = _mm512_and_si512(b1, m4), h1 = _mm512_and_si512(_mm512_srli_epi16(b1, 4), m4);
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) {
            const int8_t *q8 = q8z + ((size_t)i * NA_BLK + (size_t)c) * QK_K;
            __m512i s = _mm512_madd_epi16(sl0, _mm512_maddubs_epi16(l0, _mm512_load_si512((const void *)q8)));
            s = _mm512_dpwssd_epi32(s, sh0, _mm512_maddubs_epi16(h0, _mm512_load_si512((const void *)(q8 + 64))));
            s = _mm512_dpwssd_epi32(s, sl1, _mm512_maddubs_epi16(l1, _mm512_load_si512((const void *)(q8 + 128))));
            s = _mm512_dpwssd_epi32(s, sh1, _mm512_maddubs_epi16(h1, _mm512_load_si512((const void *)(q8 + 192))));
            const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb.f[c]), _mm256_cvtepi32_ps(sumi), acc[c]);
        }
    }
    q4_K_store(acc, acc_m, nc, y, ldy);
}
/* ==== Q4_K, AVX-512, two activation rows a register (groups of 4 and 8) ====
 * A 512-bit register holds the same 32-byte piece of two activation rows
 * (row 2p low half, row 2p + 1 high half), and each step's 32 bytes of qs
 * are broadcast to both halves. Lane l of each half then accumulates
 * q4_K_core's lane l of its own row exactly (the same maddubs int16 pairs,
 * the same vpdpwssd int32 sums, the same scale per step), and the float
 * FMA per lane is q4_K_core's, so the halves are q4_K_core's acc[2p] and
 * acc[2p + 1]: bit-identical. Against q4_K_kz this drops the per-row fold
 * of the two 256-bit halves (an extract and an add a row and super-block)
 * and converts and scales two rows with one instruction each, for four
 * more nibble unpacks a weight row and super-block (shared by all pairs),
 * so it is taken for 4 and 8 rows, where the pairs are full. */
/* Activations of super-block i, row pair p at q8p + (i * NA_BLK + 2p) *
 * QK_K: 8 pieces of 64 bytes, piece k = [row 2p quants 32k .. 32k + 32 |
 * row 2p + 1 quants 32k .. 32k + 32]. */
static ALWAYS_INLINE void q4_K_pack_pairs(int64_t nb, const uint8_t *a, size_t astride, int nc, int8_t *dst)
{
    for (int64_t i = 0; i < nb; i++)
        for (int c = 0; c < nc; c++) {
            const int8_t *src = YBLK(c)[i].qs;
            int8_t *d = dst + ((size_t)i * NA_BLK + (size_t)(c & ~1)) * QK_K + 32 * (c & 1);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) _mm256_store_si256((__m256i *)(d + 64 * k), load256(src + 32 * k));
        }
}
GEMM_TARGET_AVX512 static ALWAYS_INLINE void q4_K_kp(int64_t nb, const void *vw, const int8_t *q8p, const int nc,
                                                      float *y, size_t ldy, const blk_aux *aux)
{
    const block_q4_K *x = vw;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const int np = nc / 2;
    __m256 acc[NA_BLK], acc_m[NA_BLK / 2];
    __m512 accp[NA_BLK / 2];
    q4_K_zero(acc, acc_m, nc);
#pragma GCC unroll 4
    for (int p = 0; p < np; p++) accp[p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 vd8;
        __m256i scales;
        q4_K_head(&x[i], aux + i, np, acc_m, &vd8, &scales);
        bcast_buf sb;
        _mm256_store_si256((__m256i *)sb.i, scales);
        BCAST_BARRIER(sb);
        __m512i sumi[NA_BLK / 2];   /* set by j = 0 */
#pragma GCC unroll 4
        for (int j = 0; j < QK_K / 64; j++) {
            const __m512i bits = _mm512_broadcast_i64x4(load256(x[i].qs + 32 * j));
            const __m512i lo = _mm512_and_si512(bits, m4), hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
            const __m512i sc_l = _mm512_set1_epi32(sb.i[2 * j]), sc_h = _mm512_set1_epi32(sb.i[2 * j + 1]);
#pragma GCC unroll 4
            for (int p = 0; p < np; p++) {
                const int8_t *q8 = q8p + ((size_t)i * NA_BLK + 2 * (size_t)p) * QK_K + 128 * j;
                const __m512i p0 = _mm512_maddubs_epi16(lo, _mm512_load_si512((const void *)q8));
                sumi[p] = j == 0 ? _mm512_madd_epi16(p0, sc_l) : _mm512_dpwssd_epi32(sumi[p], p0, sc_l);
                sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(hi, _mm512_load_si512((const void *)(q8 + 64))),
                                              sc_h);
            }
        }
        const __m512 vd = _mm512_castps256_ps512(vd8);
#pragma GCC unroll 4
        for (int p = 0; p < np; p++) {
            const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
            accp[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sel, vd), _mm512_cvtepi32_ps(sumi[p]), accp[p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < np; p++) {
        acc[2 * p] = _mm512_castps512_ps256(accp[p]);
        acc[2 * p + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(accp[p]), 1));
    }
    q4_K_store(acc, acc_m, nc, y, ldy);
}
#define Q4_ROWS_LOOPZ(K, NC) \
    for (int r = 0; r < nr; r++) K(nb, (const uint8_t *)w + (size_t)r * wstride, q8z, NC, y + r, ldy, aux)
GEMM_TARGET_AVX512 static void q4_K_rows_z(int64_t nb, const void *w, size_t wstride, int nr, const uint8_t *a,
                                          size_t astride, int nc, float *y, size_t ldy, const blk_aux *aux)
{
    if (nb > Q4X_BLOCKS) {   /* long rows: the 256-bit VNNI kernel */
        q4_K_rows_evex(nb, w, wstride, nr, a, astride, nc, y, ldy, aux);
        return;
    }
    _Alignas(64) int8_t q8z[Q4X_BLOCKS * NA_BLK * QK_K];
    if (nc == 8 || nc == 4) {   /* full row pairs */
        q4_K_pack_pairs(nb, a, astride, nc, q8z);
        if (nc == 8) Q4_ROWS_LOOPZ(q4_K_kp, 8);
        else Q4_ROWS_LOOPZ(q4_K_kp, 4);
        return;
    }
    static const int q4z_off[8] = { 0, 64, 32, 96, 128, 192, 160, 224 };
    q4_K_pack(nb, a, astride, nc, q8z, q4z_off);
    if (nc == 3) Q4_ROWS_LOOPZ(q4_K_kz, 3);
    else Q4_ROWS_LOOPZ(q4_K_kz, 2);
}
GEMM_SIG(avx512, q4_K)
{
    gemm_blocked(n, w, wstride, nw, a, astride, na, y, ldy, sizeof(block_q4_K), q4_K_rows_z, quant_avx512_dot_q4_K);
}
#else
GEMM_SIG(avx512, q4_K) { quant_avx2_gemm_q4_K(n, w, wstride, nw, a, astride, na, y, ldy); }
#endif

/* ==== Q5_K ====
 * Dot (quant_avx2_dot_q5_K), per super-block: summs += dmin * hsum(mins .
 * q8s) as one scalar FMA (fused as GCC contracts ggml's line), sumi =
 * sum_j scale * maddubs(q5, q8), acc += d * sumi; result hsum(acc) + summs.
 * int16: 2 * 31 * 127 = 7874. Here the eight rows' scalar summs live in one
 * vector, lanes in row order 0 2 4 6 1 3 5 7 (what two rounds of hadd give),
 * each lane the dot's scalar FMA. The fifth bit of each quant is moved into
 * place as 0x10 with one shift and one AND (the same bytes as the dot's
 * and/shift/shift). */
static inline __m256i q5_hbit(__m256i hbits, int k)   /* bit k of each byte -> 0x10 */
{
    const __m256i t = k <= 4 ? _mm256_slli_epi16(hbits, 4 - k) : _mm256_srli_epi16(hbits, k - 4);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x10));
}

static ALWAYS_INLINE void q5_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    const block_q5_K *x = vw;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const int np = (nc + 1) / 2;
    __m256 acc[NA_BLK], summs = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const blk_aux *ax = aux + i;
        const __m128i head = _mm_loadu_si128((const __m128i *)&x[i]);   /* d, dmin, scales[12] */
        const __m128 dh = _mm_cvtph_ps(head);                            /* h2f(x.d), h2f(x.dmin), . . */
        const __m256 vd8 = _mm256_mul_ps(_mm256_loadu_ps(ax->yd), _mm256_broadcastss_ps(dh));
        const __m256 vdmin8 = _mm256_mul_ps(_mm256_loadu_ps(ax->nyd), _mm256_broadcastss_ps(_mm_movehdup_ps(dh)));
        const __m256i sm = k4_scales_mins(head);
        const __m256i scales = _mm256_shuffle_epi8(sm, k4_sc32()), mins2 = _mm256_shuffle_epi8(sm, k4_mins16());
        bcast_buf sb;
        _mm256_store_si256((__m256i *)sb.i, scales);
        _mm256_store_ps(sb.f, vd8);
        BCAST_BARRIER(sb);
        __m256i prod[NA_BLK / 2];
#pragma GCC unroll 4
        for (int p = 0; p < NA_BLK / 2; p++)
            prod[p] = p < np ? _mm256_madd_epi16(mins2, load256(&ax->q8s[2 * p])) : _mm256_setzero_si256();
        /* lanes: rows 0 2 4 6 | 1 3 5 7, each the sum of the row's 4 products */
        const __m256i hs = _mm256_hadd_epi32(_mm256_hadd_epi32(prod[0], prod[1]), _mm256_hadd_epi32(prod[2], prod[3]));
        const __m256 vdm = _mm256_permutevar8x32_ps(vdmin8, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        summs = _mm256_fmadd_ps(vdm, _mm256_cvtepi32_ps(hs), summs);
        const __m256i hbits = load256(x[i].qh);
        __m256i sumi[NA_BLK];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
        const uint8_t *q5 = x[i].qs;
#pragma GCC unroll 4
        for (int j = 0; j < QK_K / 64; j++, q5 += 32) {
            const __m256i scale_0 = _mm256_set1_epi32(sb.i[2 * j]);
            const __m256i scale_1 = _mm256_set1_epi32(sb.i[2 * j + 1]);
            const __m256i bits = load256(q5);
            const __m256i q0 = _mm256_add_epi8(_mm256_and_si256(bits, m4), q5_hbit(hbits, 2 * j));
            const __m256i q1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), q5_hbit(hbits, 2 * j + 1));
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = YBLK(c)[i].qs + 64 * j;
                sumi[c] = dp16(vnni, sumi[c], scale_0, _mm256_maddubs_epi16(q0, load256(q8)));
                sumi[c] = dp16(vnni, sumi[c], scale_1, _mm256_maddubs_epi16(q1, load256(q8 + 32)));
                KEEP(sumi[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb.f[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    /* y = hsum_f32_8(acc) + summs, all rows at once */
    __m256 v[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < NA_BLK; c++) v[c] = c < nc ? acc[c] : _mm256_setzero_ps();
    store_rows(_mm256_add_ps(hsum8_rows(v), summs), nc, y, ldy);   /* both in pair order */
}
ROWS_DISPATCH(q5_K)
DEFINE_GEMM(q5_K, quant_avxvnni_dot_q5_K)
DEFINE_GEMM_EVEX(q5_K, quant_avx512_dot_q5_K)

/* ==== Q6_K ====
 * Dot (quant_avx2_dot_q6_K), per super-block: sumi = sum scale * maddubs(q6,
 * q8) - 32 * (bsums . scales) (the -32 offset), acc += d * sumi. q6 is
 * unsigned 0..63: int16 2 * 63 * 127 = 16002, no saturation. The two high
 * bits go into place with one shift and one AND per quarter (same bytes as
 * the dot's and/shift). */
static inline __m256i q6_hbits(__m256i bh, int k)   /* bits 2k, 2k+1 of each byte -> bits 4, 5 */
{
    const __m256i t = k <= 2 ? _mm256_slli_epi16(bh, 4 - 2 * k) : _mm256_srli_epi16(bh, 2 * k - 4);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x30));
}

/* pshufb on a broadcast dword (int16 pair lo, hi): lo in every int16 of
 * the low 128-bit half, hi in every int16 of the high half */
static inline __m256i q6_sc_split(void)
{
    return _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
}

static ALWAYS_INLINE void q6_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    const block_q6_K *x = vw;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const blk_aux *ax = aux + i;
        const __m256 vd8 = _mm256_mul_ps(_mm256_loadu_ps(ax->yd), _mm256_set1_ps(h2f(x[i].d)));
        const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        /* -32 * scale as int16 (|.| <= 4096): madd with it is the dot's
         * -(madd(bsums, scales) << 5) exactly (|bsums| <= 16 * 127, so every
         * product and pair sum is far inside int32) in one instruction */
        const __m256i nscales32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales16, 5));
        bcast_buf sb;   /* sb.i[g] = int16 scales 2g, 2g+1 */
        _mm256_store_si256((__m256i *)sb.i, scales16);
        _mm256_store_ps(sb.f, vd8);
        BCAST_BARRIER(sb);
        __m256i sumi[NA_BLK];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)   /* -32 * sum_g scale[g] * bsums[g], per lane pair */
            sumi[c] = _mm256_madd_epi16(load256(YBLK(c)[i].bsums), nscales32);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
#pragma GCC unroll 2
        for (int j = 0; j < QK_K / 128; j++, ql += 64, qh += 32) {
            const __m256i b1 = load256(ql), b2 = load256(ql + 32), bh = load256(qh);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i lo = k == 0 ? _mm256_and_si256(b1, m4)
                                 : k == 1 ? _mm256_and_si256(b2, m4)
                                 : k == 2 ? _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4)
                                          : _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4);
                const __m256i q = _mm256_or_si256(lo, q6_hbits(bh, k));
                /* int16 scale 2g in the low half, 2g+1 in the high half (g = 4j + k):
                 * what cvtepi8_epi16(pshufb(scales, shuffle_q6k(g))) gives */
                const __m256i sc = _mm256_shuffle_epi8(_mm256_set1_epi32(sb.i[4 * j + k]), q6_sc_split());
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++) {
                    const int8_t *q8 = YBLK(c)[i].qs + 128 * j + 32 * k;
                    sumi[c] = dp16(vnni, sumi[c], sc, _mm256_maddubs_epi16(q, load256(q8)));
                    KEEP(sumi[c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb.f[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    __m256 v[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < NA_BLK; c++) v[c] = c < nc ? acc[c] : _mm256_setzero_ps();
    store_rows(hsum8_rows(v), nc, y, ldy);
}
ROWS_DISPATCH(q6_K)
DEFINE_GEMM(q6_K, quant_avx2_dot_q6_K)
DEFINE_GEMM_EVEX(q6_K, quant_avx2_dot_q6_K)

/* ==== Q2_K ====
 * Dot (quant_avx2_dot_q2_K), per super-block: acc += dmin * (mins . bsums)
 * first, then sumi = sum scale * maddubs(q2, q8), acc += d * sumi (one
 * accumulator, that order). int16: 2 * 3 * 127, no saturation. */
static ALWAYS_INLINE void q2_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    const block_q2_K *x = vw;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const blk_aux *ax = aux + i;
        const __m256 vd8 = _mm256_mul_ps(_mm256_loadu_ps(ax->yd), _mm256_set1_ps(h2f(x[i].d)));
        const __m256 vdmin8 = _mm256_mul_ps(_mm256_loadu_ps(ax->nyd), _mm256_set1_ps(h2f(x[i].dmin)));
        const __m128i ms = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m128i sc8 = _mm_and_si128(ms, m4);
        const __m256i mn16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) {
            const __m256i prod = _mm256_madd_epi16(mn16, load256(YBLK(c)[i].bsums));
            acc[c] = _mm256_fmadd_ps(lane_bcast(vdmin8, c), _mm256_cvtepi32_ps(prod), acc[c]);
        }
        const __m256i all = _mm256_cvtepi8_epi16(sc8);
        const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
        const __m256i scales[2] = { _mm256_setr_m128i(lo, lo), _mm256_setr_m128i(hi, hi) };
        __m256i sumi[NA_BLK];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
        const uint8_t *q2 = x[i].qs;
#pragma GCC unroll 2
        for (int j = 0; j < QK_K / 128; j++, q2 += 32) {
            const __m256i bits = load256(q2);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
                const __m256i sc = _mm256_shuffle_epi8(scales[j], shuffle_q3k(k));
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++) {
                    const int8_t *q8 = YBLK(c)[i].qs + 128 * j + 32 * k;
                    sumi[c] = dp16(vnni, sumi[c], sc, _mm256_maddubs_epi16(q, load256(q8)));
                    KEEP(sumi[c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(lane_bcast(vd8, c), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    __m256 v[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < NA_BLK; c++) v[c] = c < nc ? acc[c] : _mm256_setzero_ps();
    store_rows(hsum8_rows(v), nc, y, ldy);
}
ROWS_DISPATCH(q2_K)
DEFINE_GEMM(q2_K, quant_avx2_dot_q2_K)
DEFINE_GEMM_EVEX(q2_K, quant_avx2_dot_q2_K)

/* ==== Q3_K ====
 * Dot (quant_avx2_dot_q3_K), per super-block: sumi = sum scale *
 * (maddubs(low2, q8) - maddubs(4 * !hbit, q8)), acc += d * sumi. The int16
 * difference is exact (|.| <= 2 * 4 * 127). The "4 where the high bit is
 * clear" bytes come from one ANDNOT and one shift (same bytes as the dot's
 * andnot/shift/shift). */
static ALWAYS_INLINE void q3_K_k(int64_t nb, const void *vw, const uint8_t *a, size_t astride, const int nc,
                                 float *y, size_t ldy, const blk_aux *aux, const int vnni)
{
    const block_q3_K *x = vw;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m32 = _mm_set1_epi8(32);
    __m256 acc[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const blk_aux *ax = aux + i;
        const __m256 vd8 = _mm256_mul_ps(_mm256_loadu_ps(ax->yd), _mm256_set1_ps(h2f(x[i].d)));
        int8_t sc[16];
        quant_q3k_scales(x[i].scales, sc);
        const __m256i all = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_loadu_si128((const __m128i *)sc), m32));
        const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
        const __m256i scales[2] = { _mm256_setr_m128i(lo, lo), _mm256_setr_m128i(hi, hi) };
        const __m256i hbits = load256(x[i].hmask);
        __m256i sumi[NA_BLK];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
        const uint8_t *q3 = x[i].qs;
#pragma GCC unroll 2
        for (int j = 0; j < QK_K / 128; j++, q3 += 32) {
            const __m256i bits = load256(q3);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int bit = 4 * j + k;
                const __m256i ql = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
                const __m256i nh = _mm256_andnot_si256(hbits, _mm256_set1_epi8((char)(1 << bit)));
                const __m256i qh = bit <= 2 ? _mm256_slli_epi16(nh, 2 - bit) : _mm256_srli_epi16(nh, bit - 2);
                const __m256i sck = _mm256_shuffle_epi8(scales[j], shuffle_q3k(k));
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++) {
                    const __m256i y8 = load256(YBLK(c)[i].qs + 128 * j + 32 * k);
                    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, y8), _mm256_maddubs_epi16(qh, y8));
                    sumi[c] = dp16(vnni, sumi[c], sck, p16);
                    KEEP(sumi[c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(lane_bcast(vd8, c), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    __m256 v[NA_BLK];
#pragma GCC unroll 8
    for (int c = 0; c < NA_BLK; c++) v[c] = c < nc ? acc[c] : _mm256_setzero_ps();
    store_rows(hsum8_rows(v), nc, y, ldy);
}
ROWS_DISPATCH(q3_K)
DEFINE_GEMM(q3_K, quant_avx2_dot_q3_K)
DEFINE_GEMM_EVEX(q3_K, quant_avx2_dot_q3_K)

/* quant_gemm_avx2: blocked AVX2 matmul kernels (quant.h quant_gemm_fn) for
 * the non-K formats: Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 (int8 dots against Q8_0 /
 * Q8_1 activations) and F32, F16, BF16 (float dots against the same type).
 *
 * Contract: y[c * ldy + r] = quant_avx2_dot_<t>(n, w + r * wstride,
 * a + c * astride), BIT-IDENTICAL, for r < nw, c < na (nw, na >= 1, any
 * strides). Each (weight row, activation row) pair keeps the single-row
 * dot's arithmetic and accumulation order exactly (quant_avx2.c):
 *   - 32-element block types: one 8-lane float accumulator per pair,
 *     acc = fma(d, float(int sums of 4), acc) block after block, with
 *     d = h2f(w.d) * h2f(a.d) rounded to float; Q4_1/Q5_1 add a per-pair
 *     float running sum of h2f(w.m) * h2f(a.s); hsum_f32_8 at the end.
 *   - F32/F16/BF16: four 8-lane accumulators per pair over 32-element steps,
 *     the dot's reduction, then the dot's scalar tail.
 * What changes is only which pairs run when:
 *   - register blocking: a weight block is loaded and unpacked once and used
 *     for up to 8 activation rows (RW weight rows x RA activation rows per
 *     tile, RW * RA <= 8 pairs for the block types, every pair with its own
 *     accumulator, so 8 independent FMA chains hide the FMA latency that
 *     bounds the single-accumulator dot);
 *   - cache blocking: a group of weight rows that fits in L2 (~256 KiB of
 *     blocks; 32 rows for the float types) meets every activation tile
 *     before the next group; the float kernels also split K into chunks of
 *     2048 so one activation tile stays in L1, parking each pair's
 *     accumulators (exactly, as vectors) between chunks.
 * Per-block scale products are computed for all pairs of a tile with one
 * vector multiply (each lane is the same IEEE float product as the dot's
 * scalar one) and broadcast from a small stack buffer.
 *
 * Compiled with -mavx2 -mfma -mf16c; quant.c hands these out only when
 * cpu_detect() reports all three. No allocation (fixed-size stack buffers,
 * < 40 KiB in the float kernels), no state.
 *
 * Speed notes (single thread, AVX2 only): the int8 pair step is sign ->
 * maddubs -> madd -> cvt -> fma (no sign for Q4_1/Q5_1), 5 vector ops per
 * 32 multiply-adds, which
 * bounds the block kernels well below the bare maddubs->madd peak on cores
 * with two vector-integer ports; the dot's FMA latency chain is gone. The
 * float kernels are load-bound on unaligned rows (a 32-byte load that
 * straddles a cache line costs two): give them 32-byte aligned rows. */
#include "quant/quant_impl.h"

#include <immintrin.h>

#include "quant/quant_avx2_common.h"
#include "util/fp16.h"

#if defined(__clang__)
/* Keep scalar and vector mul/add unfused, as in quant_avx2.c (GCC in ISO C
 * mode never contracts). */
#pragma STDC FP_CONTRACT OFF
#define GEMM_UNROLL _Pragma("unroll")
#else
#define GEMM_UNROLL _Pragma("GCC unroll 16")
#endif
#define GEMM_INLINE static inline __attribute__((always_inline))

/* ==== Helpers (the shared ones are in quant_avx2_common.h) ==== */

static inline uint16_t rd16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* ==== 32-element block formats ==== */

enum { K_Q8_0, K_Q4_0, K_Q5_0, K_Q4_1, K_Q5_1 };

/* Bytes per weight block, per activation block (Q8_0 or Q8_1), and the
 * offset of the 32 int8 quants inside the activation block. Every block
 * starts with its half d; Q4_1/Q5_1 have m at byte 2, Q8_1 has s at byte 2. */
GEMM_INLINE size_t qb_wsize(const int T)
{
    return T == K_Q8_0 ? sizeof(block_q8_0) : T == K_Q4_0 ? sizeof(block_q4_0)
         : T == K_Q5_0 ? sizeof(block_q5_0) : T == K_Q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
}
GEMM_INLINE int qb_has_min(const int T) { return T == K_Q4_1 || T == K_Q5_1; }
GEMM_INLINE size_t qb_asize(const int T) { return qb_has_min(T) ? sizeof(block_q8_1) : sizeof(block_q8_0); }
GEMM_INLINE size_t qb_aqs(const int T) { return qb_has_min(T) ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs); }

/* The weight block's 32 quants as the dot feeds them to the int8 product:
 * signed bytes (Q8_0, Q4_0 - 8, Q5_0 - 16) for mul_sum_i8_pairs, unsigned
 * (Q4_1, Q5_1) for mul_sum_us8_pairs. Same operations as quant_avx2.c. */
GEMM_INLINE __m256i qb_unpack(const int T, const uint8_t *b)
{
    switch (T) {
    case K_Q8_0:
        return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)b)->qs);
    case K_Q4_0:
        return _mm256_sub_epi8(bytes_from_nibbles_32(((const block_q4_0 *)b)->qs), _mm256_set1_epi8(8));
    case K_Q5_0: {
        const block_q5_0 *x = (const block_q5_0 *)b;
        const __m256i hi = _mm256_andnot_si256(bytes_from_bits_32(x->qh), _mm256_set1_epi8((char)0xF0));
        return _mm256_or_si256(bytes_from_nibbles_32(x->qs), hi);
    }
    case K_Q4_1:
        return bytes_from_nibbles_32(((const block_q4_1 *)b)->qs);
    default: {
        const block_q5_1 *x = (const block_q5_1 *)b;
        return _mm256_or_si256(bytes_from_nibbles_32(x->qs),
                               _mm256_and_si256(bytes_from_bits_32(x->qh), _mm256_set1_epi8(0x10)));
    }
    }
}

/* Per-pair products p(r, c) = h2f(xh[r]) * h2f(yh[c]) in lane r * RA + c
 * (RW * RA <= 8; unused lanes hold junk). Each lane is the same single
 * float multiply as the dot's scalar h2f(x.d) * h2f(y.d). */
GEMM_INLINE __m256 pair_products(const int RW, const int RA, const uint16_t *xh, const uint16_t *yh)
{
    if (RW == 1) {
        const __m128i h = _mm_setr_epi16((short)yh[0], (short)(RA > 1 ? yh[1] : 0), (short)(RA > 2 ? yh[2] : 0),
                                         (short)(RA > 3 ? yh[3] : 0), (short)(RA > 4 ? yh[4] : 0),
                                         (short)(RA > 5 ? yh[5] : 0), (short)(RA > 6 ? yh[6] : 0),
                                         (short)(RA > 7 ? yh[7] : 0));
        return _mm256_mul_ps(_mm256_set1_ps(h2f(xh[0])), _mm256_cvtph_ps(h));
    }
    if (RA == 1) {
        const __m128i h = _mm_setr_epi16((short)xh[0], (short)(RW > 1 ? xh[1] : 0), (short)(RW > 2 ? xh[2] : 0),
                                         (short)(RW > 3 ? xh[3] : 0), (short)(RW > 4 ? xh[4] : 0),
                                         (short)(RW > 5 ? xh[5] : 0), (short)(RW > 6 ? xh[6] : 0),
                                         (short)(RW > 7 ? xh[7] : 0));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(h2f(yh[0])));
    }
    /* RW + RA <= 8: convert all halves at once, then spread to pair lanes. */
    uint16_t h[8] = { 0 };
    for (int r = 0; r < RW; r++) h[r] = xh[r];
    for (int c = 0; c < RA; c++) h[RW + c] = yh[c];
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                                    (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
    int ix[8] = { 0 }, iy[8] = { 0 };
    for (int p = 0; p < RW * RA; p++) { ix[p] = p / RA; iy[p] = RW + p % RA; }
    const __m256i vx = _mm256_setr_epi32(ix[0], ix[1], ix[2], ix[3], ix[4], ix[5], ix[6], ix[7]);
    const __m256i vy = _mm256_setr_epi32(iy[0], iy[1], iy[2], iy[3], iy[4], iy[5], iy[6], iy[7]);
    return _mm256_mul_ps(_mm256_permutevar8x32_ps(f, vx), _mm256_permutevar8x32_ps(f, vy));
}

/* The int32 sums of one 32-byte block pair as the dot forms them:
 * madd(maddubs(u, s), 1), or (vnni: VNNI_VEX, VNNI_EVEX) vpdpbusd from
 * zero -- the same sums:
 * the operands never make maddubs saturate (u <= 128: |q| by the sign
 * trick, or 5-bit unsigned quants). */
GEMM_INLINE __m256i qb_sum(const int vnni, __m256i u, __m256i s)
{
#ifdef GEMM_HAVE_AVXVNNI
    if (vnni == VNNI_VEX) return dp8_vnni(_mm256_setzero_si256(), u, s);
    if (vnni == VNNI_EVEX) return dp8_evex(_mm256_setzero_si256(), u, s);
#else
    (void)vnni;
#endif
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* One tile: RW weight rows (w, wstride apart) x RA activation rows (a,
 * astride apart), nb blocks each; y[c * ldy + r] for the tile's pairs.
 * RW * RA <= 8. Per block: each weight block unpacked once, then per pair
 * exactly the dot's maddubs -> madd -> cvt -> fma into that pair's acc. */
GEMM_INLINE void qb_tile(const int T, const int vnni, const int RW, const int RA, int64_t nb,
                         const uint8_t *w, size_t wstride, const uint8_t *a, size_t astride, const float *ya,
                         float *y, size_t ldy)
{
    const size_t wsz = qb_wsize(T), asz = qb_asize(T), aqs = qb_aqs(T);
    const int mins = qb_has_min(T), sgn = !mins;
    _Alignas(32) float dbuf[8];
    __m256 acc[8];
    __m256 summs = _mm256_setzero_ps();   /* Q4_1/Q5_1: pair lanes, as dbuf */
    GEMM_UNROLL
    for (int p = 0; p < RW * RA; p++) acc[p] = _mm256_setzero_ps();

    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * wsz, *ab = a + (size_t)i * asz;
        uint16_t xh[8], yh[8];
        GEMM_UNROLL
        for (int r = 0; r < RW; r++) xh[r] = rd16(wb + (size_t)r * wstride);
        if (RW == 1 && ya) {   /* the activation scales already as floats: the same products */
            _mm256_store_ps(dbuf, _mm256_mul_ps(_mm256_set1_ps(h2f(xh[0])), _mm256_load_ps(ya + (size_t)i * 8)));
        } else {
            GEMM_UNROLL
            for (int c = 0; c < RA; c++) yh[c] = rd16(ab + (size_t)c * astride);
            _mm256_store_ps(dbuf, pair_products(RW, RA, xh, yh));
        }
        if (mins) {
            /* summs += h2f(x.m) * h2f(y.s), per pair, in float (mul, add). */
            GEMM_UNROLL
            for (int r = 0; r < RW; r++) xh[r] = rd16(wb + (size_t)r * wstride + 2);
            GEMM_UNROLL
            for (int c = 0; c < RA; c++) yh[c] = rd16(ab + (size_t)c * astride + 2);
            summs = _mm256_add_ps(summs, pair_products(RW, RA, xh, yh));
        }
        __m256i qx[8], ax[8];
        GEMM_UNROLL
        for (int r = 0; r < RW; r++) {
            qx[r] = qb_unpack(T, wb + (size_t)r * wstride);
            ax[r] = sgn ? _mm256_sign_epi8(qx[r], qx[r]) : qx[r];
        }
        GEMM_UNROLL
        for (int c = 0; c < RA; c++) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(ab + (size_t)c * astride + aqs));
            GEMM_UNROLL
            for (int r = 0; r < RW; r++) {
                const __m256i sy = sgn ? _mm256_sign_epi8(qy, qx[r]) : qy;
                const __m256 q = _mm256_cvtepi32_ps(qb_sum(vnni, ax[r], sy));
                acc[r * RA + c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dbuf[r * RA + c]), q, acc[r * RA + c]);
            }
        }
    }
    _mm256_store_ps(dbuf, summs);
    GEMM_UNROLL
    for (int r = 0; r < RW; r++) {
        GEMM_UNROLL
        for (int c = 0; c < RA; c++) {
            const float s = hsum_f32_8(acc[r * RA + c]);
            y[(size_t)c * ldy + (size_t)r] = mins ? s + dbuf[r * RA + c] : s;
        }
    }
}

/* g weight rows against one tile of RA activation rows: tiles of RW rows
 * (RW * RA <= 8, RW chosen so small RA still gets several FMA chains),
 * the leftover rows one by one. */
GEMM_INLINE void qb_rows(const int T, const int vnni, const int RA, int64_t nb, const uint8_t *w, size_t wstride,
                         int g, const uint8_t *a, size_t astride, const float *ya, float *y, size_t ldy)
{
    const int RW = RA == 1 ? 4 : RA <= 4 ? 2 : 1;
    int r = 0;
    for (; r + RW <= g; r += RW)
        qb_tile(T, vnni, RW, RA, nb, w + (size_t)r * wstride, wstride, a, astride, RW == 1 ? ya : NULL, y + r, ldy);
    for (; r < g; r++) qb_tile(T, vnni, 1, RA, nb, w + (size_t)r * wstride, wstride, a, astride, ya, y + r, ldy);
}

#ifdef GEMM_HAVE_AVX512
/* ==== Q8_0 with 512-bit registers (CPU_ISA_AVX512) ====
 * A tile of up to 8 activation rows as 4 row pairs, one pair a 512-bit
 * register (row 2p in lanes 0-7, 2p+1 in lanes 8-15), against g weight
 * rows, for rows of at most QZ_BLOCKS blocks. The activations are stored
 * made unsigned (a + 128, xor 0x80); per weight block x, per pair:
 *   corr = -128 * (each lane's 4 weight bytes summed), once per weight
 *          block for all pairs (the weights are broadcast to both halves);
 *   s    = vpdpbusd(corr, a + 128, x): sum (a + 128) * x - 128 * sum x,
 *          the dot's int32 lane sum exactly (no saturation: vpdpbusd);
 *   acc  = fma(h2f(x.d) * ya, cvt(s), acc)   ya the row's h2f(y.d): the
 *          dot's single float product, its convert and FMA, lane for lane.
 * Each half's 8 lanes then go through hsum_f32_8: the dot's result bit
 * for bit. Every ALU operation here is one 512-bit uop doing two rows'
 * work; the 256-bit kernel's sign, dot, convert and FMA all compete for
 * the same two ports (p0, p1), which bounds it near half the int8 peak.
 *
 * Blocking. Two weight rows share each packed-tile load (8 accumulators).
 * The packed tile is 512 bytes a block (32 KB at K = 2048, 64 KB at 4096:
 * more than L1), so K is cut into chunks of QZ_KC blocks (an 8 KB slice of
 * the tile) and the weight rows into sub-groups of QZ_SR: a sub-group runs
 * chunk after chunk, its rows' accumulators parked (exactly, as vectors)
 * between chunks, so each lane still sees its blocks' FMAs in block order
 * and the tile slice in use stays in L1 while QZ_SR rows pass over it. */
#define QZ_BLOCKS 128   /* rows up to 4096 values; the packed tile is nb * 512 bytes of stack */
#define QZ_KC 16        /* blocks per K chunk */
#define QZ_SR 16        /* weight rows per sub-group (the parked accumulators: 4 KB) */
typedef struct qz_tile {
    _Alignas(64) uint8_t q8u[QZ_BLOCKS * 4 * 64]; /* [i][p]: row 2p's 32 quants + 128, row 2p+1's */
    _Alignas(64) float ya[QZ_BLOCKS * 4 * 16];    /* [i][p]: h2f(y.d) of row 2p x8, of 2p+1 x8 */
    _Alignas(64) float park[QZ_SR * 4 * 16];      /* [r][p]: a sub-group's accumulators between chunks */
} qz_tile;

/* Pack ra (<= 8) activation rows of nb Q8_0 blocks; rows >= ra are zero. */
GEMM_TARGET_AVX512 static void qz_pack(qz_tile *t, int64_t nb, const uint8_t *a, size_t astride, int ra)
{
    const __m512i u128 = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < nb; i++)
        for (int p = 0; p < 4; p++) {
            __m256i q[2];
            float d[2];
            for (int h = 0; h < 2; h++) {
                const int c = 2 * p + h;
                const block_q8_0 *b = (const block_q8_0 *)(a + (size_t)c * astride) + i;
                q[h] = c < ra ? _mm256_loadu_si256((const __m256i *)b->qs) : _mm256_setzero_si256();
                d[h] = c < ra ? h2f(b->d) : 0.0f;
            }
            const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
            const size_t o = (size_t)i * 4 + (size_t)p;
            _mm512_store_si512((void *)(t->q8u + o * 64), _mm512_xor_si512(qq, u128));
            _mm512_store_ps(t->ya + o * 16, _mm512_castsi512_ps(_mm512_inserti64x4(
                                                _mm512_castps_si512(_mm512_set1_ps(d[0])),
                                                _mm256_castps_si256(_mm256_set1_ps(d[1])), 1)));
        }
}

/* RW (1 or 2) weight rows x (x[r], blocks i0..i1) against the tile's np
 * pairs: acc[r * 4 + p] as above. */
GEMM_TARGET_AVX512 static inline __attribute__((always_inline)) void
qz_run(const int RW, int np, int64_t i0, int64_t i1, const block_q8_0 *const *x, const qz_tile *t, __m512 *acc)
{
    const __m512i u128 = _mm512_set1_epi8((char)0x80);
    for (int64_t i = i0; i < i1; i++) {
        __m512 xd[2];
        __m512i wq[2], corr[2];
        for (int r = 0; r < RW; r++) {
            xd[r] = _mm512_set1_ps(h2f(x[r][i].d));
            wq[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[r][i].qs));
            corr[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, wq[r]));
        }
        const size_t o = (size_t)i * 4;
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            if (p >= np) break;
            const __m512i q = _mm512_load_si512((const void *)(t->q8u + (o + p) * 64));
            const __m512 ya = _mm512_load_ps(t->ya + (o + p) * 16);
            for (int r = 0; r < RW; r++) {
                const __m512 d = _mm512_mul_ps(xd[r], ya);
                const __m512i s = _mm512_dpbusd_epi32(corr[r], q, wq[r]);
                acc[r * 4 + p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[r * 4 + p]);
            }
        }
    }
}

/* g weight rows (w, wstride apart) against a packed tile of ra rows:
 * y[c * ldy + r]. */
GEMM_TARGET_AVX512 static void qz_rows(int64_t nb, const uint8_t *w, size_t wstride, int g, qz_tile *t, int ra,
                                       float *y, size_t ldy)
{
    const int np = (ra + 1) / 2;
    for (int s0 = 0; s0 < g; s0 += QZ_SR) {
        const int sr = g - s0 < QZ_SR ? g - s0 : QZ_SR;
        for (int64_t k0 = 0; k0 < nb; k0 += QZ_KC) {
            const int64_t k1 = nb - k0 < QZ_KC ? nb : k0 + QZ_KC;
            for (int r = 0; r < sr; r += 2) {
                const int rw = sr - r >= 2 ? 2 : 1;
                const block_q8_0 *x[2];
                __m512 acc[8];
                for (int h = 0; h < rw; h++) x[h] = (const block_q8_0 *)(w + (size_t)(s0 + r + h) * wstride);
                for (int j = 0; j < 4 * rw; j++)
                    acc[j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(t->park + ((size_t)r * 4 + j) * 16);
                if (rw == 2) qz_run(2, np, k0, k1, x, t, acc);
                else qz_run(1, np, k0, k1, x, t, acc);
                if (k1 < nb) {
                    for (int j = 0; j < 4 * rw; j++) _mm512_store_ps(t->park + ((size_t)r * 4 + j) * 16, acc[j]);
                    continue;
                }
                for (int h = 0; h < rw; h++)
                    for (int c = 0; c < ra; c++) {
                        const __m512 v = acc[h * 4 + c / 2];
                        const __m256 hv = _mm256_castsi256_ps(c & 1 ? _mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)
                                                                     : _mm512_castsi512_si256(_mm512_castps_si512(v)));
                        y[(size_t)c * ldy + (size_t)(s0 + r + h)] = hsum_f32_8(hv);
                    }
            }
        }
    }
}
#endif

/* Tuning knobs (overridable with -D for experiments; any value is correct). */
#ifndef QB_L2_BYTES
#define QB_L2_BYTES (256 * 1024)   /* weight bytes per cache group */
#endif
#ifndef QB_RA
#define QB_RA 8                    /* activation rows per tile */
#endif
/* Activation tiles of RA > 4 rows (one weight row a tile) take their block
 * scales as floats, converted once per tile instead of once per weight
 * row: ya[i * 8 + c] = h2f(d of block i of row c), up to QB_YA_BLOCKS
 * blocks (rows of up to 32768 values; longer rows convert per pair). */
#define QB_YA_BLOCKS 1024

/* Cache blocking: groups of weight rows of ~QB_L2_BYTES stay in L2 while
 * every activation tile (QB_RA rows, L1/L2) passes over them. zt: NULL,
 * or (Q8_0 on CPU_ISA_AVX512) a qz_tile for the 512-bit tiles of 5-8 rows. */
GEMM_INLINE void qb_gemm(const int T, const int vnni, int64_t n, const void *vw, size_t wstride, int nw,
                         const void *va, size_t astride, int na, float *y, size_t ldy, void *zt)
{
    const uint8_t *w = vw, *a = va;
    const int64_t nb = n / 32;
    const size_t rowb = (size_t)nb * qb_wsize(T);
    _Alignas(32) float yabuf[QB_YA_BLOCKS * 8];   /* 32 KB of stack: qb_tile's ya */
    int G = rowb ? (int)(QB_L2_BYTES / rowb) : nw;
    if (G < 4) G = 4;
    for (int r0 = 0; r0 < nw; r0 += G) {
        const int g = nw - r0 < G ? nw - r0 : G;
        const uint8_t *wg = w + (size_t)r0 * wstride;
        for (int c0 = 0; c0 < na; c0 += QB_RA) {
            const int ra = na - c0 < QB_RA ? na - c0 : QB_RA;
            const uint8_t *at = a + (size_t)c0 * astride;
            float *yt = y + (size_t)c0 * ldy + (size_t)r0;
#ifdef GEMM_HAVE_AVX512
            if (zt && T == K_Q8_0 && ra > 4 && nb <= QZ_BLOCKS) {   /* the tile packed once per weight group */
                qz_pack((qz_tile *)zt, nb, at, astride, ra);
                qz_rows(nb, wg, wstride, g, (qz_tile *)zt, ra, yt, ldy);
                continue;
            }
#else
            (void)zt;
#endif
            const float *ya = NULL;
            if (ra > 4 && nb <= QB_YA_BLOCKS) {
                for (int64_t i = 0; i < nb; i++)
                    for (int c = 0; c < 8; c++)
                        yabuf[i * 8 + c] =
                            c < ra ? h2f(rd16(at + (size_t)c * astride + (size_t)i * qb_asize(T))) : 0.0f;
                ya = yabuf;
            }
            switch (ra) {
            case 1: qb_rows(T, vnni, 1, nb, wg, wstride, g, at, astride, NULL, yt, ldy); break;
            case 2: qb_rows(T, vnni, 2, nb, wg, wstride, g, at, astride, NULL, yt, ldy); break;
            case 3: qb_rows(T, vnni, 3, nb, wg, wstride, g, at, astride, NULL, yt, ldy); break;
            case 4: qb_rows(T, vnni, 4, nb, wg, wstride, g, at, astride, NULL, yt, ldy); break;
            case 5: qb_rows(T, vnni, 5, nb, wg, wstride, g, at, astride, ya, yt, ldy); break;
            case 6: qb_rows(T, vnni, 6, nb, wg, wstride, g, at, astride, ya, yt, ldy); break;
            case 7: qb_rows(T, vnni, 7, nb, wg, wstride, g, at, astride, ya, yt, ldy); break;
            default: qb_rows(T, vnni, 8, nb, wg, wstride, g, at, astride, ya, yt, ldy); break;
            }
        }
    }
}

QUANT_GEMM_DECL(q8_0) { qb_gemm(K_Q8_0, VNNI_NONE, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
QUANT_GEMM_DECL(q4_0) { qb_gemm(K_Q4_0, VNNI_NONE, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
QUANT_GEMM_DECL(q5_0) { qb_gemm(K_Q5_0, VNNI_NONE, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
QUANT_GEMM_DECL(q4_1) { qb_gemm(K_Q4_1, VNNI_NONE, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
QUANT_GEMM_DECL(q5_1) { qb_gemm(K_Q5_1, VNNI_NONE, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }

/* The same with vpdpbusd for maddubs + madd (bit-identical); without
 * compiler support for AVX-VNNI, the AVX2 kernels. */
#ifdef GEMM_HAVE_AVXVNNI
#define QB_VNNI(t, K) \
    GEMM_TARGET_VNNI QUANT_GEMM_DECL_AVXVNNI(t) { qb_gemm(K, VNNI_VEX, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
#else
#define QB_VNNI(t, K) QUANT_GEMM_DECL_AVXVNNI(t) { quant_avx2_gemm_##t(n, w, wstride, nw, a, astride, na, y, ldy); }
#endif
QB_VNNI(q8_0, K_Q8_0)
QB_VNNI(q4_0, K_Q4_0)
QB_VNNI(q5_0, K_Q5_0)
QB_VNNI(q4_1, K_Q4_1)
QB_VNNI(q5_1, K_Q5_1)

/* CPU_ISA_AVX512: Q8_0 with the 512-bit tiles of 5-8 activation rows
 * (qz_rows; smaller tiles and longer rows: the 256-bit VNNI tiles), the
 * other types with the 256-bit VNNI tiles; all EVEX-encoded, bit-identical. */
#ifdef GEMM_HAVE_AVX512
GEMM_TARGET_AVX512 QUANT_GEMM_DECL_AVX512(q8_0)
{
    qz_tile t;   /* 68 KB of stack */
    qb_gemm(K_Q8_0, VNNI_EVEX, n, w, wstride, nw, a, astride, na, y, ldy, &t);
}
#define QB_EVEX(t, K) \
    GEMM_TARGET_AVX512 QUANT_GEMM_DECL_AVX512(t) { qb_gemm(K, VNNI_EVEX, n, w, wstride, nw, a, astride, na, y, ldy, NULL); }
#else
#define QB_EVEX(t, K) QUANT_GEMM_DECL_AVX512(t) { quant_avx2_gemm_##t(n, w, wstride, nw, a, astride, na, y, ldy); }
QB_EVEX(q8_0, K_Q8_0)
#endif
QB_EVEX(q4_0, K_Q4_0)
QB_EVEX(q5_0, K_Q5_0)
QB_EVEX(q4_1, K_Q4_1)
QB_EVEX(q5_1, K_Q5_1)

/* ==== F32 / F16 / BF16 ====
 * Per pair, as the dots: s0..s3 += x[i + 8k] * y[i + 8k] (fused) over the
 * largest multiple of 32 (np), then the type's reduction and scalar tail.
 * Tiles are 1 weight row x FL_RA activation rows (4 accumulators a pair:
 * 12 of the 16 registers). K is cut into chunks of FL_KC elements so the
 * activation tile's chunk stays in L1 while a group of FL_G weight rows
 * passes; between chunks each pair's four accumulators are parked in a
 * stack buffer (a store and a reload change no bits). F16/BF16 activation
 * chunks are widened to float once per tile (exact) and shared by the
 * group's rows; weight rows are widened on the fly (exact, as the dot). */

enum { K_F32, K_F16, K_BF16 };

#define FL_RA 3
#define FL_KC 2048   /* multiple of 32 */
#define FL_G 32

GEMM_INLINE __m256 fl_load(const int T, const void *p, int64_t i)
{
    if (T == K_F32) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == K_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The dot's reduction of s[0..3] and its scalar tail over [np, n). */
GEMM_INLINE float fl_finish(const int T, const __m256 *s, int64_t np, int64_t n, const void *w, const void *a)
{
    if (T == K_F32) {
        const float *x = w, *y = a;
        float sum = reduce4_hadd(s[0], s[1], s[2], s[3]);
        const int64_t nu = np + ((n - np) & ~(int64_t)3);
        int64_t i = np;
        for (; i < nu; i++) sum += x[i] * y[i];
        for (; i < n; i++) sum = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(x[i]), _mm_set_ss(y[i]), _mm_set_ss(sum)));
        return sum;
    }
    const uint16_t *x = w, *y = a;
    if (T == K_F16) {
        double sum = reduce4_hadd(s[0], s[1], s[2], s[3]);
        for (int64_t i = np; i < n; i++) sum += (double)(h2f(x[i]) * h2f(y[i]));
        return (float)sum;
    }
    double sum = hsum_f32_8(_mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3])));
    for (int64_t i = np; i < n; i++) sum += (double)(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
    return (float)sum;
}

/* One weight row chunk (type T, wr at the chunk's first element) against
 * RA activation chunks already in float (af[c]), len elements (a multiple
 * of 32); s[4 * c + k] is pair c's accumulator k. */
GEMM_INLINE void fl_chunk(const int T, const int RA, const uint8_t *wr, const float *const *af,
                          int64_t len, __m256 *s)
{
    for (int64_t i = 0; i < len; i += 32) {
        GEMM_UNROLL
        for (int k = 0; k < 4; k++) {
            const __m256 x = fl_load(T, wr, i + 8 * k);
            GEMM_UNROLL
            for (int c = 0; c < RA; c++)
                s[4 * c + k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(af[c] + i + 8 * k), s[4 * c + k]);
        }
    }
}

/* g weight rows (wstride apart) x RA activation rows ar[c], every chunk. */
GEMM_INLINE void fl_rows(const int T, const int RA, int64_t n, const uint8_t *w, size_t wstride, int g,
                         const uint8_t *const *ar, float *y, size_t ldy)
{
    const size_t esz = T == K_F32 ? 4 : 2;
    const int64_t np = n & ~(int64_t)31;
    _Alignas(32) float conv[FL_RA][FL_KC];   /* F16/BF16 activation chunk as float */
    __m256 park[FL_G][4 * FL_RA];            /* accumulators between chunks */
    /* np == 0 still makes one (empty) pass, which writes the results. */
    for (int64_t k0 = 0;; k0 += FL_KC) {
        const int64_t len = np - k0 < FL_KC ? np - k0 : FL_KC;
        const int first = k0 == 0, last = k0 + len == np;
        const float *af[FL_RA];
        GEMM_UNROLL
        for (int c = 0; c < RA; c++) {
            if (T == K_F32) {
                af[c] = (const float *)ar[c] + k0;
            } else {
                for (int64_t i = 0; i < len; i += 8)
                    _mm256_store_ps(&conv[c][i], fl_load(T, ar[c], k0 + i));
                af[c] = conv[c];
            }
        }
        for (int r = 0; r < g; r++) {
            const uint8_t *wr = w + (size_t)r * wstride;
            __m256 s[4 * FL_RA];
            GEMM_UNROLL
            for (int j = 0; j < 4 * RA; j++) s[j] = first ? _mm256_setzero_ps() : park[r][j];
            fl_chunk(T, RA, wr + (size_t)k0 * esz, af, len, s);
            if (last) {
                GEMM_UNROLL
                for (int c = 0; c < RA; c++)
                    y[(size_t)c * ldy + (size_t)r] = fl_finish(T, s + 4 * c, np, n, wr, ar[c]);
            } else {
                GEMM_UNROLL
                for (int j = 0; j < 4 * RA; j++) park[r][j] = s[j];
            }
        }
        if (last) break;
    }
}

GEMM_INLINE void fl_gemm(const int T, int64_t n, const void *vw, size_t wstride, int nw,
                         const void *va, size_t astride, int na, float *y, size_t ldy)
{
    const uint8_t *w = vw, *a = va;
    for (int r0 = 0; r0 < nw; r0 += FL_G) {
        const int g = nw - r0 < FL_G ? nw - r0 : FL_G;
        for (int c0 = 0; c0 < na; c0 += FL_RA) {
            const int ra = na - c0 < FL_RA ? na - c0 : FL_RA;
            const uint8_t *ar[FL_RA];
            for (int c = 0; c < ra; c++) ar[c] = a + (size_t)(c0 + c) * astride;
            float *yt = y + (size_t)c0 * ldy + (size_t)r0;
            const uint8_t *wg = w + (size_t)r0 * wstride;
            switch (ra) {
            case 1: fl_rows(T, 1, n, wg, wstride, g, ar, yt, ldy); break;
            case 2: fl_rows(T, 2, n, wg, wstride, g, ar, yt, ldy); break;
            default: fl_rows(T, 3, n, wg, wstride, g, ar, yt, ldy); break;
            }
        }
    }
}

QUANT_GEMM_DECL(f32) { fl_gemm(K_F32, n, w, wstride, nw, a, astride, na, y, ldy); }
QUANT_GEMM_DECL(f16) { fl_gemm(K_F16, n, w, wstride, nw, a, astride, na, y, ldy); }
QUANT_GEMM_DECL(bf16) { fl_gemm(K_BF16, n, w, wstride, nw, a, astride, na, y, ldy); }

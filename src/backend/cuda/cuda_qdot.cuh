/* cuda_qdot.cuh: the per-item arithmetic of the quantized matvec, written
 * __host__ __device__ so that tests/cuda/test_cuda_emu.cu can run the very
 * same index math on the CPU (no GPU needed) against quant_ref dots.
 *
 * The matvec kernels (cuda_matvec.cu) read the weight rows from a staged
 * shared-memory tile (k_matvec) or straight from global memory
 * (k_matvec_direct, short rows), and the quantized activation row from
 * shared memory, UNPACKED from its ggml blocks into three aligned arrays:
 *   xq[k]     int8 quants (16-byte aligned; Q8_K: QD_Q8K_XB bytes a block,
 *             the quants at qd_q8k_off, see there; mv_xq_bytes)
 *   xd[nb]    float block scales (Q8_K: d; Q8_0 / Q8_1: the f16 d widened)
 *   xbs[k/16] int16 sums of 16 quants (Q8_K bsums; unused for Q8_0; Q8_1:
 *             the same bytes hold float s[nb], the f16 s widened)
 * A row of nb weight blocks is cut into ITEMS; the lanes of a row take
 * items it = lane, lane + 32, ... (k_matvec_direct: groups of S lanes, step
 * S) and each item returns one float partial:
 *   Q4_K: 1 item a block (qd_block_q4_K): the 8 sub-blocks' integer dots
 *         and their activation sums scaled by the block's 6-bit scales
 *         and mins; returns d*dx * isum - dmin*dx * msum
 *   Q6_K: 8 items a block: (hh = 128-weight half, l = 8 * 0..3): 8 weights
 *         at each of l, l+32, l+64, l+96 of the half; returns
 *         d*dx * sum_k scale_k * dot8(q_k - 32, x_k)
 *   Q5_K: 1 item a block (qd_block_q5_K), as Q4_K with the 5th bits of
 *         the quants from qh
 *   Q8_0: 2 items a block: (h = 16-quant half); returns d*dx * dot16
 *         (split rows, cuda_repack_q8_0: the same items, 16-byte loads)
 *   Q4_0: 2 items a block: (h = 8-byte half of qs): low nibbles of qs[8h..]
 *         are quants 8h.., high nibbles 16 + 8h..; returns d*dx * dot16 of
 *         (q - 8) with the Q8_0 activation
 *   Q5_0: 2 items a block, as Q4_0, the 5th bits from the u32 qh (bit j:
 *         quant j), q - 16; Q8_0 activation
 *   Q4_1 / Q5_1: 2 items a block, as Q4_0 / Q5_0 with unsigned q, Q8_1
 *         activation; item 0 adds the block's m * s (Q8_1's f16 s, kept
 *         as a float in the xbs slot)
 * Every integer partial is exact (as the CPU's int32 sums are); only the
 * float products and the order of the float sum differ from quant_ref_dot_*
 * (which sums per block into 8 float lanes): the results agree to float
 * rounding, not bitwise.
 *
 * F32 / F16 / BF16 weights dot with an activation of the same type (the
 * CPU's dot_type: F16 weights take f16-rounded activations, as ggml). These
 * items read the activation row RAW, straight from global memory (no
 * unpack: it is already float-sized, and every warp of a CTA reads the
 * same row, so it is an L1/L2 hit); an item is 16 bytes of weights (4 f32
 * or 8 f16/bf16) and the matching 16 bytes of activation, and returns the
 * sum of the float products. f16*f16 and bf16*bf16 products are exact in
 * float (as the CPU's), f32*f32 rounds once (as the CPU's); the CPU sums
 * in double, here in float per lane, then the shuffle tree. */
#ifndef STRATA_CUDA_QDOT_CUH
#define STRATA_CUDA_QDOT_CUH

#include <stdint.h>
#include <string.h>
#include <cuda_fp16.h>
#ifndef __CUDA_ARCH__
extern "C" {
#include "util/fp16.h"
}
#endif

#define QD_HD __host__ __device__ __forceinline__

/* 4 bytes at a 4-aligned address. */
QD_HD uint32_t qd_ld32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

/* 4 bytes at a 2-aligned address (Q6_K and Q8_0 blocks are 210 and 34
 * bytes, so every other block starts at 2 mod 4): two aligned words and a
 * funnel shift. Reads the aligned words that hold [p, p + 4), plus the next
 * word when p is aligned: the staging buffers are padded for that, and
 * qd_item_q6_K's reads stay inside its block (see there). */
QD_HD uint32_t qd_ld32_a2(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    const unsigned sh = (unsigned)((uintptr_t)p & 3);
    const uint32_t *w = (const uint32_t *)(p - sh);
    return __funnelshift_r(w[0], w[1], sh * 8);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

QD_HD uint16_t qd_ld16(const uint8_t *p)   /* 2-aligned */
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

/* 4 bytes at a 2-aligned address as two halfword loads: reads exactly
 * [p, p + 4), so it is safe on a weight row read straight from global
 * memory, up to the allocation's last byte (Q8_0). */
QD_HD uint32_t qd_ld32_h2(const uint8_t *p)
{
    return (uint32_t)qd_ld16(p) | (uint32_t)qd_ld16(p + 2) << 16;
}

QD_HD float qd_u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

QD_HD uint32_t qd_f2u(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

QD_HD float qd_h2f(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return fp16_to_fp32(h);
#endif
}

/* sum of the 4 signed byte products, plus c */
QD_HD int qd_dp4a(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; i++) c += (int8_t)(a >> (8 * i)) * (int8_t)(b >> (8 * i));
    return c;
#endif
}

/* per-byte a - b, modulo 256 */
QD_HD uint32_t qd_vsub4(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xff) - ((b >> (8 * i)) & 0xff)) & 0xff) << (8 * i);
    return r;
#endif
}

#define QD_Q6K_ITEMS 8
#define QD_Q80_ITEMS 2
#define QD_Q40_ITEMS 2
#define QD_Q5K_BYTES 176   /* f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128] */
#define QD_Q40_BYTES 18    /* f16 d, u8 qs[16] */
#define QD_Q50_ITEMS 2
#define QD_Q41_ITEMS 2
#define QD_Q51_ITEMS 2
#define QD_Q50_BYTES 22    /* f16 d, u8 qh[4], u8 qs[16] */
#define QD_Q41_BYTES 20    /* f16 d, f16 m, u8 qs[16] */
#define QD_Q51_BYTES 24    /* f16 d, f16 m, u8 qh[4], u8 qs[16] */
#define QD_Q81_BYTES 36    /* f16 d, f16 s, i8 qs[32] */

/* 16 bytes at a 16-aligned address, as four little-endian words */
struct qd_u4 { uint32_t x, y, z, w; };
QD_HD qd_u4 qd_ld128(const uint8_t *p)
{
    qd_u4 r;
#ifdef __CUDA_ARCH__
    const uint4 v = *(const uint4 *)p;
    r.x = v.x; r.y = v.y; r.z = v.z; r.w = v.w;
#else
    memcpy(&r, p, 16);
#endif
    return r;
}


/* The unpacked Q8_K row's layout: block blk's 256 quants at xq +
 * QD_Q8K_XB blk (288: 32 bytes of padding a block), logical byte o at
 * qd_q8k_off(o), its second 128-byte half's 16-byte chunks rotated by 4
 * (o ^ 64 for o >= 128). So that the lanes of one shared-memory load
 * meet different bank groups (16-byte units mod 8) where the row's
 * readers took one (bytes 256 apart are one group; 128 apart too):
 *   - Q4_K / Q5_K block items (16-byte loads, 8 lanes a phase): a phase's
 *     lanes read one logical chunk of 8 / rpw consecutive blocks (rpw rows
 *     of a block are a broadcast); 18 units a block step the groups by 2,
 *     so 4 (rpw = 2, K = 4096: 4-way before) or 2 (rpw = 4, K = 2048:
 *     2-way before) blocks meet distinct groups; 8 (rpw = 1, K >= 8192)
 *     are 2-way (8-way before).
 *   - Q6_K items (32-bit loads, one phase): item (blk, hh, l) reads chunk
 *     8 hh + 2 m + l / 16, word (l & 8) / 4 + h; rotated, hh moves it by 4
 *     groups, l / 16 by 1, the block by 2: a K = 2048 warp's 16 items
 *     (blocks 2p, 2p + 1) meet 16 banks (4-way before), K = 768's 8
 *     items of one block 8 (2-way before).
 * All the readers' offsets stay compile-time constants from the block's
 * (Q6_K: two) base pointers: no registers for the layout. test_cuda_emu
 * checks the placement and those phases' banks. */
#define QD_Q8K_XB 288
QD_HD int qd_q8k_off(int o) { return o ^ ((o >> 7) << 6); }

/* A whole Q4_K block as one item (the direct kernels' Q4_K items since
 * session 11): the header is loaded and its 6-bit (scale, min) pairs
 * decoded once for 256 weights, instead of once per 32 as 32-weight items
 * (Q5_K's, and Q4_K's before) do, and the integer sums of the 8 sub-blocks meet in one int before
 * the two float products of the block:
 *   d*dx * sum_s sc_s * dot32_s  -  dmin*dx * sum_s m_s * bsum32_s
 * (quant_ref_dot_q4_K's per-block form; exact integers, so only the float
 * rounding of the two products and the lanes' sum differ from it). The
 * scales of sub-blocks 0..3 are the low 6 bits of scales[0..3], the mins
 * of scales[4..7]; of 4..7, the low / high nibbles of scales[8..11] with
 * the top 2 bits of scales[0..3] / scales[4..7] above them
 * (quant_scale_min_k4), four bytes at a time. wrow 16-byte aligned, xq
 * 16-aligned; blk: the block. */
/* The block item of Q4_K (Q5 = 0: 144-byte blocks) and Q5_K (Q5 = 1:
 * 176-byte blocks, qh[32] between the scales and qs: the 5th bit of the
 * low nibbles of qs[32 j + 16 h + t] is bit 2j of qh[16 h + t], of the high
 * ones bit 2j + 1; quants 0..31, valid signed dp4a operands). */
/* The block's bytes as a lane holds them between its loads and its dot
 * (qd_k45_load, qd_k45_dot): the direct matvec issues the loads of its
 * first items before the activation unpack (cuda_matvec.cu, mv_w). Q4_K
 * leaves h0 / h1 unused. */
template <int Q5> struct qd_k45_w { qd_u4 hd, h0, h1, q[8]; };

template <int Q5>
QD_HD qd_k45_w<Q5> qd_k45_load(const uint8_t *wrow, int blk)
{
    const uint8_t *bp = wrow + blk * (Q5 ? QD_Q5K_BYTES : 144);
    const uint8_t *qs = bp + (Q5 ? 48 : 16);
    qd_k45_w<Q5> w;
    w.hd = qd_ld128(bp);
    w.h0 = w.h1 = qd_u4{ 0, 0, 0, 0 };
    if (Q5) { w.h0 = qd_ld128(bp + 16); w.h1 = qd_ld128(bp + 32); }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int j = 0; j < 8; j++) w.q[j] = qd_ld128(qs + 16 * j);
    return w;
}

template <int Q5>
QD_HD float qd_k45_dot(const qd_k45_w<Q5> &w, const int8_t *xq, const float *xd, const int16_t *xbs, int blk)
{
    const qd_u4 hd = w.hd, h0 = w.h0, h1 = w.h1;
    const uint32_t sc[2] = { hd.y & 0x3f3f3f3fu, (hd.w & 0x0f0f0f0fu) | ((hd.y >> 2) & 0x30303030u) };
    const uint32_t mn[2] = { hd.z & 0x3f3f3f3fu, ((hd.w >> 4) & 0x0f0f0f0fu) | ((hd.z >> 2) & 0x30303030u) };
    const uint8_t *xs = (const uint8_t *)xq + blk * QD_Q8K_XB;
    int isum = 0, msum = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int j = 0; j < 4; j++) {   /* 64 weights: qs[32 j .. 32 j + 32), sub-blocks 2j (low) and 2j + 1 (high) */
        const qd_u4 q0 = w.q[2 * j], q1 = w.q[2 * j + 1];
        const qd_u4 a0 = qd_ld128(xs + qd_q8k_off(64 * j)), a1 = qd_ld128(xs + qd_q8k_off(64 * j + 16));
        const qd_u4 b0 = qd_ld128(xs + qd_q8k_off(64 * j + 32)), b1 = qd_ld128(xs + qd_q8k_off(64 * j + 48));
        const int s0 = 2 * j, s1 = 2 * j + 1;   /* sub-blocks: byte s & 3 of word s >> 2 */
#define QD_LO(q, hb) (((q) & 0x0f0f0f0fu) | (Q5 ? (((hb) >> s0) & 0x01010101u) << 4 : 0u))
#define QD_HI(q, hb) ((((q) >> 4) & 0x0f0f0f0fu) | (Q5 ? (((hb) >> s1) & 0x01010101u) << 4 : 0u))
        int lo = qd_dp4a(QD_LO(q0.x, h0.x), a0.x, 0);
        lo = qd_dp4a(QD_LO(q0.y, h0.y), a0.y, lo);
        lo = qd_dp4a(QD_LO(q0.z, h0.z), a0.z, lo);
        lo = qd_dp4a(QD_LO(q0.w, h0.w), a0.w, lo);
        lo = qd_dp4a(QD_LO(q1.x, h1.x), a1.x, lo);
        lo = qd_dp4a(QD_LO(q1.y, h1.y), a1.y, lo);
        lo = qd_dp4a(QD_LO(q1.z, h1.z), a1.z, lo);
        lo = qd_dp4a(QD_LO(q1.w, h1.w), a1.w, lo);
        int hi = qd_dp4a(QD_HI(q0.x, h0.x), b0.x, 0);
        hi = qd_dp4a(QD_HI(q0.y, h0.y), b0.y, hi);
        hi = qd_dp4a(QD_HI(q0.z, h0.z), b0.z, hi);
        hi = qd_dp4a(QD_HI(q0.w, h0.w), b0.w, hi);
        hi = qd_dp4a(QD_HI(q1.x, h1.x), b1.x, hi);
        hi = qd_dp4a(QD_HI(q1.y, h1.y), b1.y, hi);
        hi = qd_dp4a(QD_HI(q1.z, h1.z), b1.z, hi);
        hi = qd_dp4a(QD_HI(q1.w, h1.w), b1.w, hi);
#undef QD_LO
#undef QD_HI
        isum += (int)((sc[s0 >> 2] >> (8 * (s0 & 3))) & 0xffu) * lo + (int)((sc[s1 >> 2] >> (8 * (s1 & 3))) & 0xffu) * hi;
        /* the sub-blocks' activation sums: two 16-value bsums each */
        const int bs0 = xbs[blk * 16 + 4 * j] + xbs[blk * 16 + 4 * j + 1];
        const int bs1 = xbs[blk * 16 + 4 * j + 2] + xbs[blk * 16 + 4 * j + 3];
        msum += (int)((mn[s0 >> 2] >> (8 * (s0 & 3))) & 0xffu) * bs0 + (int)((mn[s1 >> 2] >> (8 * (s1 & 3))) & 0xffu) * bs1;
    }
    const float dx = xd[blk];
    const float d = qd_h2f((uint16_t)(hd.x & 0xffffu)) * dx, dm = qd_h2f((uint16_t)(hd.x >> 16)) * dx;
    return d * (float)isum - dm * (float)msum;
}

template <int Q5>
QD_HD float qd_block_k45(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int blk)
{
    return qd_k45_dot<Q5>(qd_k45_load<Q5>(wrow, blk), xq, xd, xbs, blk);
}

QD_HD float qd_block_q4_K(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int blk)
{
    return qd_block_k45<0>(wrow, xq, xd, xbs, blk);
}

QD_HD float qd_block_q5_K(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int blk)
{
    return qd_block_k45<1>(wrow, xq, xd, xbs, blk);
}

/* 8 bytes at a 2-aligned address: the three aligned words from p's own
 * (p - (p & 3) .. p - (p & 3) + 11), two funnel shifts. Before p it reads
 * only inside p's word (as qd_ld32_a2); past p + 8 at most 4 bytes (p
 * aligned: the third word is wholly past, and unused). */
QD_HD void qd_ld64_a2(const uint8_t *p, uint32_t *lo, uint32_t *hi)
{
#ifdef __CUDA_ARCH__
    const unsigned sh = (unsigned)((uintptr_t)p & 3);
    const uint32_t *w = (const uint32_t *)(p - sh);
    const uint32_t a = w[0], b = w[1], c = w[2];
    *lo = __funnelshift_r(a, b, sh * 8);
    *hi = __funnelshift_r(b, c, sh * 8);
#else
    memcpy(lo, p, 4);
    memcpy(hi, p + 4, 4);
#endif
}

/* wrow: 2-byte aligned. xq 16-aligned. Item it: block it / 8, half hh,
 * l = 8 * (it % 4): 8 weights at each of l, l+32, l+64, l+96 of the half
 * (one 16-weight scale each: l..l+7 share l >> 4). The a2 loads read whole
 * aligned words, at most bytes bp - 2 .. bp + 195 of a 210-byte block:
 * never past the row's last block, and before the block only inside the
 * word that holds its first byte (so never outside the allocation). */
QD_HD float qd_item_q6_K(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    (void)xbs;
    const int blk = it >> 3, hh = (it >> 2) & 1, l = (it & 3) * 8;
    const uint8_t *bp = wrow + blk * 210;
    uint32_t ql0[2], ql1[2], qh[2];
    qd_ld64_a2(bp + 64 * hh + l, &ql0[0], &ql0[1]);
    qd_ld64_a2(bp + 64 * hh + 32 + l, &ql1[0], &ql1[1]);
    qd_ld64_a2(bp + 128 + 32 * hh + l, &qh[0], &qh[1]);
    const uint32_t k32 = 0x20202020u;
    /* logical activation bytes 128 hh + l + 32 m + 4 h (m = 0..3, h = 0..1)
     * at qd_q8k_off: bit 6 (m's high bit) flips where hh = 1, so m = 0, 1
     * read at x01 + 32 m + 4 h, m = 2, 3 at x23 + 32 (m - 2) + 4 h */
    const uint8_t *xb = (const uint8_t *)xq + blk * QD_Q8K_XB + l;
    const uint8_t *x01 = xb + 192 * hh, *x23 = xb + 64 + 64 * hh;
    const int8_t *sc = (const int8_t *)(bp + 192) + 8 * hh + (l >> 4);
    int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    for (int h = 0; h < 2; h++) {
        const uint32_t a = ql0[h], b = ql1[h], q = qh[h];
        d0 = qd_dp4a(qd_vsub4((a & 0x0f0f0f0fu) | ((q & 0x03030303u) << 4), k32), qd_ld32(x01 + 4 * h), d0);
        d1 = qd_dp4a(qd_vsub4((b & 0x0f0f0f0fu) | (((q >> 2) & 0x03030303u) << 4), k32), qd_ld32(x01 + 32 + 4 * h), d1);
        d2 = qd_dp4a(qd_vsub4(((a >> 4) & 0x0f0f0f0fu) | (((q >> 4) & 0x03030303u) << 4), k32), qd_ld32(x23 + 4 * h), d2);
        d3 = qd_dp4a(qd_vsub4(((b >> 4) & 0x0f0f0f0fu) | (((q >> 6) & 0x03030303u) << 4), k32), qd_ld32(x23 + 32 + 4 * h), d3);
    }
    const int isum = sc[0] * d0 + sc[2] * d1 + sc[4] * d2 + sc[6] * d3;
    const float d = qd_h2f(qd_ld16(bp + 208)) * xd[blk];
    return d * (float)isum;
}

/* wrow: 2-byte aligned. xq 16-aligned. Reads only the item's own bytes
 * (halfword loads), never past the block. */
QD_HD float qd_item_q8_0(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    (void)xbs;
    const int blk = it >> 1, h = it & 1;
    const uint8_t *bp = wrow + blk * 34;
    const uint8_t *q = bp + 2 + 16 * h;
    const uint8_t *xs = (const uint8_t *)xq + blk * 32 + 16 * h;
    /* the 16 activation bytes in one 16-byte load (four word loads of
     * neighbouring lanes hit one shared-memory bank 4 ways) */
    const qd_u4 xa = qd_ld128(xs);
    int s = qd_dp4a(qd_ld32_h2(q), xa.x, 0);
    s = qd_dp4a(qd_ld32_h2(q + 4), xa.y, s);
    s = qd_dp4a(qd_ld32_h2(q + 8), xa.z, s);
    s = qd_dp4a(qd_ld32_h2(q + 12), xa.w, s);
    const float d = qd_h2f(qd_ld16(bp)) * xd[blk];
    return d * (float)s;
}

/* Q8_0 in split rows (cuda_repack_q8_0): a row of nb blocks holds its
 * 32 nb int8 quants, then its nb f16 scales (the same 34 nb bytes). wrow
 * 16-byte aligned (34 nb % 16 == 0: nb a multiple of 8), xq 16-aligned.
 * Item it is quants 16 it .. 16 it + 15 in one 16-byte load, instead of the
 * 8 halfword loads a 34-byte block's 2-byte alignment costs
 * qd_item_q8_0; the same integer dot and float products, so the same
 * value bit for bit. */
struct qd_q80s_w { qd_u4 q; uint16_t d; };   /* an item's quants and its block's scale (qd_q80s_load) */

QD_HD qd_q80s_w qd_q80s_load(const uint8_t *wrow, int nb, int it)
{
    qd_q80s_w w;
    w.q = qd_ld128(wrow + 16 * it);
    w.d = qd_ld16(wrow + 32 * nb + 2 * (it >> 1));
    return w;
}

QD_HD float qd_q80s_dot(const qd_q80s_w &w, const int8_t *xq, const float *xd, int it)
{
    const qd_u4 qv = w.q, xa = qd_ld128((const uint8_t *)xq + 16 * it);
    int s = qd_dp4a(qv.x, xa.x, 0);
    s = qd_dp4a(qv.y, xa.y, s);
    s = qd_dp4a(qv.z, xa.z, s);
    s = qd_dp4a(qv.w, xa.w, s);
    const float d = qd_h2f(w.d) * xd[it >> 1];
    return d * (float)s;
}

QD_HD float qd_item_q8_0s(const uint8_t *wrow, const int8_t *xq, const float *xd, int nb, int it)
{
    return qd_q80s_dot(qd_q80s_load(wrow, nb, it), xq, xd, it);
}

/* wrow: 2-byte aligned (18-byte blocks). xq 16-aligned. Reads only the
 * item's own bytes (halfword loads), never past the block. */
QD_HD float qd_item_q4_0(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    (void)xbs;
    const int blk = it >> 1, h = it & 1;
    const uint8_t *bp = wrow + blk * QD_Q40_BYTES;
    const uint8_t *q = bp + 2 + 8 * h;
    const uint8_t *xs = (const uint8_t *)xq + blk * 32 + 8 * h;
    const uint32_t k8 = 0x08080808u;
    int s = 0;
    for (int t = 0; t < 2; t++) {
        const uint32_t qw = qd_ld32_h2(q + 4 * t);
        s = qd_dp4a(qd_vsub4(qw & 0x0f0f0f0fu, k8), qd_ld32(xs + 4 * t), s);
        s = qd_dp4a(qd_vsub4((qw >> 4) & 0x0f0f0f0fu, k8), qd_ld32(xs + 16 + 4 * t), s);
    }
    const float d = qd_h2f(qd_ld16(bp)) * xd[blk];
    return d * (float)s;
}

/* The 5th bits of 4 consecutive quants: bits 0..3 of b (b < 16) to bit 4
 * of bytes 0..3 (the four shifted copies of b do not overlap, so the
 * product is their OR). */
QD_HD uint32_t qd_hbits4(uint32_t b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }

/* Q5_0 / Q5_1 / Q4_1 item h of a block (the 8-byte half h of qs, as
 * Q4_0): integer dot of quants 8h..8h+7 (low nibbles, 5th bits from qh bits
 * 8h..) and 16+8h.. (high nibbles, qh bits 16+8h..) with the activation
 * quants; the weight quants are 0..15 / 0..31 (unsigned bytes, valid
 * signed dp4a operands), less 16 (Q5_0: signed -16..15) when sub16. qs
 * and qh are 2-byte aligned; halfword loads read only the block's bytes. */
QD_HD int qd_dot_q5_half(const uint8_t *qs, uint32_t qh, const uint8_t *xs, int h, int has_qh, int sub16)
{
    const uint32_t k16 = 0x10101010u;
    int s = 0;
    for (int t = 0; t < 2; t++) {
        const uint32_t qw = qd_ld32_h2(qs + 8 * h + 4 * t);
        uint32_t lo = qw & 0x0f0f0f0fu, hi = (qw >> 4) & 0x0f0f0f0fu;
        if (has_qh) {
            lo |= qd_hbits4((qh >> (8 * h + 4 * t)) & 0xf);
            hi |= qd_hbits4((qh >> (16 + 8 * h + 4 * t)) & 0xf);
        }
        if (sub16) {
            lo = qd_vsub4(lo, k16);
            hi = qd_vsub4(hi, k16);
        }
        s = qd_dp4a(lo, qd_ld32(xs + 8 * h + 4 * t), s);
        s = qd_dp4a(hi, qd_ld32(xs + 16 + 8 * h + 4 * t), s);
    }
    return s;
}

/* Q5_0 (Q8_0 activation): wrow 2-byte aligned (22-byte blocks). Returns
 * d*dx * dot16 of (q - 16), as Q4_0. */
QD_HD float qd_item_q5_0(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    (void)xbs;
    const int blk = it >> 1, h = it & 1;
    const uint8_t *bp = wrow + blk * QD_Q50_BYTES;
    const uint32_t qh = qd_ld32_h2(bp + 2);
    const int s = qd_dot_q5_half(bp + 6, qh, (const uint8_t *)xq + blk * 32, h, 1, 1);
    const float d = qd_h2f(qd_ld16(bp)) * xd[blk];
    return d * (float)s;
}

/* Q4_1 / Q5_1 (Q8_1 activation): the unpacked Q8_1 row keeps d in xd[blk]
 * and the f16 s (= d * sum of the block's quants) widened to float in the
 * xbs slot read as floats, xs[blk] (qd_unpack_q8_1). Item h returns
 * d*dx * dot16, and item 0 of a block adds the block's m * s (the CPU:
 * (d*dx) * (s0 + s1) + m * s a block). wrow 2-byte aligned. */
QD_HD float qd_item_q4_1(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    const int blk = it >> 1, h = it & 1;
    const uint8_t *bp = wrow + blk * QD_Q41_BYTES;
    const int s = qd_dot_q5_half(bp + 4, 0, (const uint8_t *)xq + blk * 32, h, 0, 0);
    const float d = qd_h2f(qd_ld16(bp)) * xd[blk];
    const float ms = h ? 0.f : qd_h2f(qd_ld16(bp + 2)) * ((const float *)xbs)[blk];
    return d * (float)s + ms;
}

QD_HD float qd_item_q5_1(const uint8_t *wrow, const int8_t *xq, const float *xd, const int16_t *xbs, int it)
{
    const int blk = it >> 1, h = it & 1;
    const uint8_t *bp = wrow + blk * QD_Q51_BYTES;
    const uint32_t qh = qd_ld32_h2(bp + 4);
    const int s = qd_dot_q5_half(bp + 8, qh, (const uint8_t *)xq + blk * 32, h, 1, 0);
    const float d = qd_h2f(qd_ld16(bp)) * xd[blk];
    const float ms = h ? 0.f : qd_h2f(qd_ld16(bp + 2)) * ((const float *)xbs)[blk];
    return d * (float)s + ms;
}

/* ---- float weights: items of 16 bytes, wrow and xr 16-byte aligned ---- */
#define QD_F32_PER_ITEM 4
#define QD_F16_PER_ITEM 8

QD_HD float qd_bf2f(uint32_t h) { return qd_u2f(h << 16); }

QD_HD float qd_item_f32(const uint8_t *wrow, const uint8_t *xr, int it)
{
    const qd_u4 w = qd_ld128(wrow + 16 * (size_t)it), x = qd_ld128(xr + 16 * (size_t)it);
    float s = qd_u2f(w.x) * qd_u2f(x.x);
    s += qd_u2f(w.y) * qd_u2f(x.y);
    s += qd_u2f(w.z) * qd_u2f(x.z);
    s += qd_u2f(w.w) * qd_u2f(x.w);
    return s;
}

/* f16: the products of two halves are exact in float (22 significant bits),
 * so contraction into FMA cannot change a bit of the sum. */
QD_HD float qd_dot_f16x2(uint32_t w, uint32_t x, float s)
{
    s += qd_h2f((uint16_t)w) * qd_h2f((uint16_t)x);
    return s + qd_h2f((uint16_t)(w >> 16)) * qd_h2f((uint16_t)(x >> 16));
}

QD_HD float qd_item_f16(const uint8_t *wrow, const uint8_t *xr, int it)
{
    const qd_u4 w = qd_ld128(wrow + 16 * (size_t)it), x = qd_ld128(xr + 16 * (size_t)it);
    return qd_dot_f16x2(w.w, x.w, qd_dot_f16x2(w.z, x.z, qd_dot_f16x2(w.y, x.y, qd_dot_f16x2(w.x, x.x, 0.f))));
}

/* bf16: products of two bf16 are exact in float (16 significant bits). */
QD_HD float qd_dot_bf16x2(uint32_t w, uint32_t x, float s)
{
    s += qd_bf2f(w & 0xffffu) * qd_bf2f(x & 0xffffu);
    return s + qd_u2f(w & 0xffff0000u) * qd_u2f(x & 0xffff0000u);
}

QD_HD float qd_item_bf16(const uint8_t *wrow, const uint8_t *xr, int it)
{
    const qd_u4 w = qd_ld128(wrow + 16 * (size_t)it), x = qd_ld128(xr + 16 * (size_t)it);
    return qd_dot_bf16x2(w.w, x.w, qd_dot_bf16x2(w.z, x.z, qd_dot_bf16x2(w.y, x.y, qd_dot_bf16x2(w.x, x.x, 0.f))));
}

/* ---- activation conversions for F16 / BF16 weights ----
 * Integer ports of util/fp16.h's fp32_to_fp16 and fp32_to_bf16 (the CPU
 * act_quant of those dot types), so host and device run the same code and
 * test_cuda_emu checks it against fp16.h bit for bit. */
QD_HD uint16_t qd_f2h(float f)
{
    const uint32_t x = qd_f2u(f);
    const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)   /* inf or NaN (quieted, top mantissa bits kept) */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);   /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {   /* subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000, shift = 126 - e;
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    const uint32_t r = ax - 0x38000000u;
    uint32_t base = r >> 13;
    const uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (base & 1))) base++;
    return (uint16_t)(sign | base);
}

QD_HD uint16_t qd_f2bf(float f)
{
    const uint32_t u = qd_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

QD_HD void qd_st32(uint8_t *p, uint32_t v)   /* 4-aligned */
{
#ifdef __CUDA_ARCH__
    *(uint32_t *)p = v;
#else
    memcpy(p, &v, 4);
#endif
}

QD_HD void qd_st16(uint8_t *p, uint16_t v)   /* 2-aligned */
{
#ifdef __CUDA_ARCH__
    *(uint16_t *)p = v;
#else
    memcpy(p, &v, 2);
#endif
}

/* Unpack word/halfword w of a quantized activation row (ggml blocks at gx)
 * into the shared-memory arrays. Q8_K: 73 32-bit words a block (d, 64 of
 * qs, 8 of bsums; the qs at QD_Q8K_XB blk + qd_q8k_off); Q8_0: 17 16-bit
 * halfwords a block (d, 16 of qs). */
/* qd_unpack_q8_K's store of word w (value v, loaded from gx + 4 w): the
 * unpack split in two so a loop can issue several loads before any store */
QD_HD void qd_put_q8_K(uint32_t v, int w, int8_t *xq, float *xd, int16_t *xbs)
{
    const int blk = w / 73, o = w - blk * 73;
    if (o == 0) qd_st32((uint8_t *)xd + 4 * (size_t)blk, v);
    else if (o <= 64) qd_st32((uint8_t *)xq + (size_t)blk * QD_Q8K_XB + qd_q8k_off(4 * (o - 1)), v);
    else qd_st32((uint8_t *)xbs + (size_t)blk * 32 + 4 * (o - 65), v);
}
QD_HD void qd_unpack_q8_K(const uint8_t *gx, int w, int8_t *xq, float *xd, int16_t *xbs)
{
    qd_put_q8_K(qd_ld32(gx + 4 * (size_t)w), w, xq, xd, xbs);
}

/* qd_unpack_q8_0's store of halfword w (value v, from gx + 2 w) */
QD_HD void qd_put_q8_0(uint16_t v, int w, int8_t *xq, float *xd)
{
    const int blk = w / 17, o = w - blk * 17;
    if (o == 0) xd[blk] = qd_h2f(v);
    else qd_st16((uint8_t *)xq + (size_t)blk * 32 + 2 * (o - 1), v);
}
QD_HD void qd_unpack_q8_0(const uint8_t *gx, int w, int8_t *xq, float *xd)
{
    qd_put_q8_0(qd_ld16(gx + 2 * (size_t)w), w, xq, xd);
}

/* Q8_1: 18 halfwords a block (d, s, 16 of qs); s widened to float into the
 * xbs slot (k / 16 int16 = one float a 32-quant block), read as floats. */
QD_HD void qd_put_q8_1(uint16_t v, int w, int8_t *xq, float *xd, int16_t *xbs)
{
    const int blk = w / 18, o = w - blk * 18;
    if (o == 0) xd[blk] = qd_h2f(v);
    else if (o == 1) ((float *)xbs)[blk] = qd_h2f(v);
    else qd_st16((uint8_t *)xq + (size_t)blk * 32 + 2 * (o - 2), v);
}
QD_HD void qd_unpack_q8_1(const uint8_t *gx, int w, int8_t *xq, float *xd, int16_t *xbs)
{
    qd_put_q8_1(qd_ld16(gx + 2 * (size_t)w), w, xq, xd, xbs);
}

/* ==== The coalesced copy's layout (cuda_matvec.cu, mvd_co) ====
 * A warp copies its rpw rows of whole-block items (rb bytes a row, rb / 16
 * = cpr chunks) to shared memory chunk by chunk; chunk c of the warp's
 * contiguous rows lands at 16-byte unit qd_co_unit(c): row c / cpr at
 * rs16 units a row, chunk c % cpr in it. The lane of row r and place sl
 * (lane = sl * rpw + r) then reads its block, item sl of row r, at unit
 * r * rs16 + sl * (block bytes / 16). rs16 = cpr plus the padding that
 * puts the 8 lanes of a 16-byte load phase on 8 different 16-byte bank
 * groups (unit mod 8): rpw >= 8 (eight rows of one sl): an odd stride;
 * rpw = 4 or 2: 8 / rpw (mod 8), so the rows step past the sl's blocks
 * (9 or 11 chunks for Q4_K or Q5_K: 1 or 3 mod 8); rpw = 1: any.
 * test_cuda_emu checks both properties for every row length to 32 blocks. */
QD_HD int qd_co_rs16(int rb, int rpw)
{
    const int want = rpw >= 8 ? 1 : rpw == 1 ? (rb / 16) & 7 : 8 / rpw;
    return rb / 16 + ((want - rb / 16) & 7);
}
/* rcp for qd_co_unit: floor((2^32 - 1) / cpr) + 1, so the multiply-high
 * (c rcp) >> 32 is floor(c / cpr) exactly while c cpr < 2^32 */
QD_HD unsigned qd_co_rcp(unsigned cpr) { return 0xffffffffu / cpr + 1u; }
QD_HD size_t qd_co_unit(unsigned c, unsigned cpr, unsigned rcp, int rs16)
{
#ifdef __CUDA_ARCH__
    const unsigned row = __umulhi(c, rcp);
#else
    const unsigned row = (unsigned)(((uint64_t)c * rcp) >> 32);
#endif
    return (size_t)row * (unsigned)rs16 + (c - row * cpr);
}

/* The summation order of the tensor-core matmul (cuda_mmq.cu). The direct
 * kernels sum a row's items over S = 2^LG lanes: lane sl adds its items
 * sl, sl + S, ... in turn from 0.f, then the shuffle tree adds lane sl ^ o
 * to lane sl for o = S/2 .. 1. The same sum, one output in one thread:
 * the lanes in the order p = 0 .. S - 1, lane qd_mmq_rev(p, LG) (the
 * tree's leaves left to right), each lane's sum pushed by qd_mmq_push<p>,
 * which merges as a binary counter carries: after the push, as many times
 * as p has trailing ones, the top two entries (lane sums of equal subtrees)
 * meet. Every addition has the tree's operands (float addition commutes
 * bit for bit), so the result, stk[0] after the last push, is the shuffle
 * tree's lane 0. test_cuda_emu (test_emu_mmq_order) checks it against a
 * lane-by-lane emulation of the tree. qd_mmq_for<0, S>(f) unrolls the lanes
 * at compile time (f(qd_mmq_ic<p>)), so the stack's indices are constants:
 * registers, not local memory. */
#define QD_MMQ_LG_MAX 4
QD_HD constexpr int qd_mmq_rev(int p, int lg) { return lg == 0 ? 0 : ((p & 1) << (lg - 1)) | qd_mmq_rev(p >> 1, lg - 1); }
QD_HD constexpr int qd_mmq_pop(int p) { return p ? (p & 1) + qd_mmq_pop(p >> 1) : 0; }
template <int P> QD_HD void qd_mmq_push(float (&stk)[QD_MMQ_LG_MAX + 1], float v)
{
    constexpr int d = qd_mmq_pop(P);
    static_assert(d <= QD_MMQ_LG_MAX, "qd_mmq_push: more lanes than QD_MMQ_LG_MAX allows");
    stk[d] = v;
    if constexpr ((P & 1) != 0) stk[d - 1] = stk[d - 1] + stk[d];
    if constexpr ((P & 3) == 3) stk[d - 2] = stk[d - 2] + stk[d - 1];
    if constexpr ((P & 7) == 7) stk[d - 3] = stk[d - 3] + stk[d - 2];
    if constexpr ((P & 15) == 15) stk[d - 4] = stk[d - 4] + stk[d - 3];
}
template <int P> struct qd_mmq_ic { static constexpr int value = P; };
/* (a host or device functor: the pragma lets the host test pass a host
 * lambda to this __host__ __device__ template) */
#pragma nv_exec_check_disable
template <int P, int N, typename F> QD_HD void qd_mmq_for(F &&f)
{
    if constexpr (P < N) {
        f(qd_mmq_ic<P>{});
        qd_mmq_for<P + 1, N>(f);
    }
}

#endif

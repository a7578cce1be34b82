/* cuda_mmq.cu: the grouped matmul of prompt chunks (cuda_matmul) for Q4_K,
 * Q5_K, Q6_K and split Q8_0 rows on the tensor cores: int8 mma.sync
 * (m16n8k32, m16n8k16) takes the integer dots that the direct kernel
 * (cuda_matvec.cu, k_matmul_direct) makes with dp4a, and the outputs stay
 * bit for bit the direct kernel's. (Q6_K and Q8_0 in split rows: below,
 * k_mmq_q6k and k_mmq_q80s.)
 *
 * Why the same bits: a Q4_K / Q5_K item is a whole 256-weight block
 * (qd_k45_dot): eight 32-weight sub-block dots, each an exact integer,
 * meet in two exact integers (isum: scales times dots; msum: mins times
 * the activation's sub-block sums) before the block's float value
 *     v = (d(w) * dx) * isum - (dmin(w) * dx) * msum.
 * A 32-deep mma of one sub-block gives the same exact dot for 16 rows x 8
 * activation rows, so every block's v is computed here from the same
 * integers by the same float operations (-fmad=false: no contraction).
 * The direct kernel then sums a row's blocks in its lanes' order: S =
 * 2^lg_s lanes a row (mvd_geometry), lane sl adds blocks sl, sl + S, ...
 * in turn from 0.f, then a shuffle tree pairs lane sl with sl ^ o for o =
 * S/2 .. 1. Here each output takes the lanes in bit-reversed order (0, S/2,
 * S/4, 3S/4, ... for the tree's leaves), each lane's blocks in turn from
 * 0.f, and merges the partial sums as a binary counter merges its carries:
 * the same additions of the same operands (float addition commutes bit for
 * bit), so the same result. tests/cuda/test_cuda.c (test_matmul) checks
 * every output against the matvec, memcmp.
 *
 * Shape: a CTA is 4 warps, 64 weight rows (warp w: rows 16 w .. 16 w + 15)
 * by one item's 8 activation rows (the mma's n = CUDA_MM_NB). Shared
 * memory: the 8 activation rows' quants (k + 16 bytes apart: ldmatrix's 8
 * row addresses meet 8 distinct 16-byte bank groups), their block scales
 * and sub-block sums (int32 pairs of Q8_K's bsums), and a ring of
 * MMQ_NST block columns of the 64 weight rows (144 / 176 bytes a row,
 * again 8 distinct bank groups for 8 rows), filled by cp.async in the order
 * the blocks are summed, MMQ_NST - 1 columns ahead. A warp's block, for
 * each pair of sub-blocks (64 weights): one ldmatrix.x4 of weights (16
 * rows x 32 bytes of qs, both nibbles; Q5_K: one more a block for qh),
 * one of activations (8 rows x 64 bytes), two mma; then the integer and
 * float epilogue for its 16 x 8 outputs (4 a lane).
 *
 * Used for lg_s <= MMQ_LG_MAX (k <= 4096), 16-byte aligned stacks (Q6_K:
 * lg_s <= 3, k <= 1024; split Q8_0: lg_s 4 or 5, k >= 768); other shapes
 * take the direct kernel (cuda_mmq_ok). */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_qdot.cuh"

#define MMQ_WARPS 4
#define MMQ_ROWS (16 * MMQ_WARPS)   /* weight rows a CTA */
#define MMQ_NST 4                    /* weight block columns in the ring */
#define MMQ_LG_MAX QD_MMQ_LG_MAX      /* up to 16 lanes a row: 16 blocks, k = 4096 */
#define MMQ_ORD 64                   /* room for the block order (>= 2^MMQ_LG_MAX) */

template <int Q5> struct mmq_t {
    enum { BB = Q5 ? QD_Q5K_BYTES : CQ4_K_BYTES, QS = Q5 ? 48 : 16 };   /* block bytes; offset of qs */
};

/* Shared-memory layout (host and device agree through it): the quants
 * [8][xs], then float d[8][nb], int32 sub-block sums [8][nb][8], the block
 * order [MMQ_ORD], the weight ring [MMQ_NST][MMQ_ROWS][BB]. */
struct mmq_lay {
    int xs;                        /* an activation row's quant bytes: k + 16 */
    int o_d, o_bs, o_ord, o_ring;  /* offsets */
    int bytes;
};
__host__ __device__ __forceinline__ mmq_lay mmq_layout(int k, int bb)
{
    const int nb = k / 256;
    mmq_lay l;
    l.xs = k + 16;
    l.o_d = CUDA_MM_NB * l.xs;
    l.o_bs = l.o_d + 4 * CUDA_MM_NB * nb;
    l.o_ord = l.o_bs + 32 * CUDA_MM_NB * nb;
    l.o_ring = (l.o_ord + 4 * MMQ_ORD + 15) & ~15;
    l.bytes = l.o_ring + MMQ_NST * MMQ_ROWS * bb;
    return l;
}

template <int N> __device__ __forceinline__ void mmq_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* four 8x8 b16 matrices: thread t gives the row address of matrix t / 8,
 * row t % 8, and gets 32 bits of each (row t / 4, bytes 4 (t % 4)..) */
__device__ __forceinline__ void mmq_ldm4(uint32_t r[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* d = A (16 x 32 s8, row) * B (32 x 8 s8, col), exact int32 (registers
 * only: not volatile, so the compiler may schedule it) */
__device__ __forceinline__ void mmq_mma(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

/* Copy block column blk of the CTA's 64 rows into ring slot s (rows past
 * the matrix read its last row: outputs never stored). */
template <int Q5>
__device__ __forceinline__ void mmq_fill(uint8_t *slot, const uint8_t *g, int rb, int nr, int blk)
{
    constexpr int BB = mmq_t<Q5>::BB, CPR = BB / 16;
    for (int c = threadIdx.x; c < MMQ_ROWS * CPR; c += 32 * MMQ_WARPS) {
        const int i = c / CPR, ch = c - i * CPR;
        cp_async16(slot + i * BB + 16 * ch, g + (size_t)min(i, nr - 1) * rb + (size_t)blk * BB + 16 * ch);
    }
}

/* An item's 8 activation rows, n words W each (uint32_t: Q8_K's 73 a
 * block; uint16_t: Q8_0's 17), into shared memory by put(v, j, w) (row j,
 * word w); a missing row (-1 in xr_list) as zeros. Every thread of the CTA
 * calls it. */
template <typename W, typename Put>
__device__ __forceinline__ void mmq_unpack(const uint8_t *xq, size_t x_stride, const int32_t *xr_list, int n, Put put)
{
    for (int j = 0; j < CUDA_MM_NB; j++) {
        const int xr = xr_list[j];
        const uint8_t *gx = xq + (size_t)(xr < 0 ? 0 : xr) * x_stride;
        for (int w = threadIdx.x; w < n; w += 32 * MMQ_WARPS) {
            W v = 0;
            if (xr >= 0) {
                if constexpr (sizeof(W) == 4) v = qd_ld32(gx + 4 * (size_t)w);
                else v = qd_ld16(gx + 2 * (size_t)w);
            }
            put(v, j, w);
        }
    }
}

/* Q8_K rows (f32 d, 256 i8, 16 i16 bsums: 73 words a block): quants at
 * sq + j xs + 256 blk (plain, not qd_q8k_off's rotation: ldmatrix reads
 * them), scales sd[j nb + blk], and (BS) the sub-block sums
 * sbs[(j nb + blk) 8 + s] = bsums 2s + 2s+1. */
template <bool BS>
__device__ __forceinline__ void mmq_unpack_q8k(const uint8_t *xq, size_t x_stride, const int32_t *xr_list, int nb,
                                               int8_t *sq, int xs, float *sd, int *sbs)
{
    mmq_unpack<uint32_t>(xq, x_stride, xr_list, nb * 73, [&](uint32_t v, int j, int w) {
        const int blk = w / 73, o = w - blk * 73;
        if (o == 0) sd[j * nb + blk] = __uint_as_float(v);
        else if (o <= 64) *(uint32_t *)(sq + j * xs + blk * 256 + 4 * (o - 1)) = v;
        else if (BS) sbs[(j * nb + blk) * 8 + (o - 65)] = (int)(int16_t)(v & 0xffffu) + (int)(int16_t)(v >> 16);
    });
}

/* A lane's 4 outputs of the m16n8 C fragment, each its tree's sum
 * (stk[e][0]): rows r0 + gr + 8 (e / 2) of the CTA's (gr: the warp's row
 * base plus lane / 4), activation rows t0 + e % 2; only rows < nr and
 * activation rows the item names. */
__device__ __forceinline__ void mmq_store(float *y, const int64_t *yoff, const int32_t *xr_list,
                                          const float (&stk)[4][QD_MMQ_LG_MAX + 1], int r0, int gr, int t0, int nr)
{
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int r = gr + 8 * (e >> 1), t = t0 + (e & 1);
        if (r < nr && xr_list[t] >= 0) y[yoff[t] + r0 + r] = stk[e][0];
    }
}

template <int Q5, int LG>
__global__ void __launch_bounds__(32 * MMQ_WARPS, 3)
k_mmq_k45(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k,
          const uint8_t *__restrict__ xq, size_t x_stride, const int32_t *__restrict__ xrow,
          const int64_t *__restrict__ yoff, float *y)
{
    pdl_enter();
    constexpr int BB = mmq_t<Q5>::BB, S = 1 << LG;
    extern __shared__ __align__(16) uint8_t smem[];
    const int nb = k / 256, rb = nb * BB;
    const mmq_lay L = mmq_layout(k, BB);
    int8_t *sq = (int8_t *)smem;
    float *sd = (float *)(smem + L.o_d);
    int *sbs = (int *)(smem + L.o_bs);
    int *ord = (int *)(smem + L.o_ord);
    uint8_t *ring = smem + L.o_ring;
    const int b = blockIdx.y, r0 = blockIdx.x * MMQ_ROWS, nr = min(MMQ_ROWS, rows - r0);
    const uint8_t *g = W + (size_t)(ids ? ids[b] : 0) * w_stride + (size_t)r0 * rb;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* the blocks in the order they are summed: lane rev(p)'s blocks in turn */
    if (tid == 0) {
        int q = 0;
        for (int p = 0; p < S; p++)
            for (int it = qd_mmq_rev(p, LG); it < nb; it += S) ord[q++] = it;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < MMQ_NST - 1; q++) {
        if (q < nb) mmq_fill<Q5>(ring + q * MMQ_ROWS * BB, g, rb, nr, ord[q]);
        cp_async_commit();
    }
    mmq_unpack_q8k<true>(xq, x_stride, xrow + b * CUDA_MM_NB, nb, sq, L.xs, sd, sbs);

    /* this lane's outputs: rows gr, gr + 8 of the warp's 16; activation
     * rows t0, t0 + 1 (the mma's C fragment) */
    const int gr = lane >> 2, t0 = 2 * (lane & 3);
    /* ldmatrix row addresses: weights (rows lane % 8 + 8 ((lane / 8) % 2),
     * bytes + 16 (lane / 16)), activations (row lane % 8, bytes + 16 (lane / 8)) */
    const int wa = (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * BB + 16 * (lane >> 4);
    const int xa = (lane & 7) * L.xs + 16 * (lane >> 3);
    float stk[4][QD_MMQ_LG_MAX + 1];
    int q = 0;   /* blocks summed so far: the ring's position */
    qd_mmq_for<0, S>([&](auto P) {
        constexpr int p = decltype(P)::value;
        float acc[4] = { 0.f, 0.f, 0.f, 0.f };
        for (int it = qd_mmq_rev(p, LG); it < nb; it += S, q++) {
            __syncthreads();   /* slot (q - 1) % MMQ_NST free */
            if (q + MMQ_NST - 1 < nb) mmq_fill<Q5>(ring + ((q + MMQ_NST - 1) % MMQ_NST) * MMQ_ROWS * BB, g, rb, nr, ord[q + MMQ_NST - 1]);
            cp_async_commit();
            mmq_wait<MMQ_NST - 1>();
            __syncthreads();
            const uint8_t *slot = ring + (q % MMQ_NST) * MMQ_ROWS * BB;
            /* the two rows' headers: d, dmin, the 6-bit scales and mins */
            const qd_u4 ha = qd_ld128(slot + (16 * warp + gr) * BB), hb = qd_ld128(slot + (16 * warp + gr + 8) * BB);
            const uint32_t sc[2][2] = { { ha.y & 0x3f3f3f3fu, (ha.w & 0x0f0f0f0fu) | ((ha.y >> 2) & 0x30303030u) },
                                        { hb.y & 0x3f3f3f3fu, (hb.w & 0x0f0f0f0fu) | ((hb.y >> 2) & 0x30303030u) } };
            const uint32_t mn[2][2] = { { ha.z & 0x3f3f3f3fu, ((ha.w >> 4) & 0x0f0f0f0fu) | ((ha.z >> 2) & 0x30303030u) },
                                        { hb.z & 0x3f3f3f3fu, ((hb.w >> 4) & 0x0f0f0f0fu) | ((hb.z >> 2) & 0x30303030u) } };
            uint32_t qh[4] = { 0u, 0u, 0u, 0u };
            if (Q5) mmq_ldm4(qh, slot + wa + 16);   /* qh[32] at bytes 16..47, as qs's 32 bytes */
            const int *bs0 = sbs + (t0 * nb + it) * 8, *bs1 = sbs + ((t0 + 1) * nb + it) * 8;
            int isum[4] = { 0, 0, 0, 0 }, msum[4] = { 0, 0, 0, 0 };
#pragma unroll
            for (int j = 0; j < 4; j++) {   /* sub-blocks 2j (low nibbles of qs[32 j ..]) and 2j + 1 (high) */
                uint32_t a[4], lo[4], hi[4], x[4];
                mmq_ldm4(a, slot + wa + mmq_t<Q5>::QS + 32 * j);
                mmq_ldm4(x, sq + xa + it * 256 + 64 * j);
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    lo[r] = a[r] & 0x0f0f0f0fu;
                    hi[r] = (a[r] >> 4) & 0x0f0f0f0fu;
                    if (Q5) {
                        lo[r] |= ((qh[r] >> (2 * j)) & 0x01010101u) << 4;
                        hi[r] |= ((qh[r] >> (2 * j + 1)) & 0x01010101u) << 4;
                    }
                }
                int dl[4], dh[4];
                mmq_mma(dl, lo, x[0], x[1]);
                mmq_mma(dh, hi, x[2], x[3]);
                const int s0 = 2 * j, s1 = 2 * j + 1;
#pragma unroll
                for (int e = 0; e < 4; e++) {   /* e: (row gr + 8 (e / 2), activation row t0 + e % 2) */
                    const int h = e >> 1;
                    const int *bs = (e & 1) ? bs1 : bs0;
                    isum[e] += (int)((sc[h][s0 >> 2] >> (8 * (s0 & 3))) & 0xffu) * dl[e] +
                               (int)((sc[h][s1 >> 2] >> (8 * (s1 & 3))) & 0xffu) * dh[e];
                    msum[e] += (int)((mn[h][s0 >> 2] >> (8 * (s0 & 3))) & 0xffu) * bs[s0] +
                               (int)((mn[h][s1 >> 2] >> (8 * (s1 & 3))) & 0xffu) * bs[s1];
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {   /* qd_k45_dot's float products */
                const uint32_t hx = (e >> 1) ? hb.x : ha.x;
                const float dx = sd[(t0 + (e & 1)) * nb + it];
                const float d = qd_h2f((uint16_t)(hx & 0xffffu)) * dx, dm = qd_h2f((uint16_t)(hx >> 16)) * dx;
                acc[e] += d * (float)isum[e] - dm * (float)msum[e];
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) qd_mmq_push<p>(stk[e], acc[e]);
    });
    mmq_store(y, yoff + b * CUDA_MM_NB, xrow + b * CUDA_MM_NB, stk, r0, 16 * warp + gr, t0, nr);
}

/* ==== Q8_0 in split rows (cuda_repack_q8_0) ====
 * An item is 16 quants: v = (d(w) * dx) * dot16 (qd_q80s_dot), and m16n8k16
 * gives dot16 exactly. The direct kernel's lanes here are S = 2^LG >= 16
 * a row (U = 4 items a lane a pass, mvd_geometry): lane sl sums items sl,
 * sl + S, ... So a CTA is 16 weight rows by one item's 8 activation rows,
 * and its 4 warps split the lanes, warp w taking lanes w + 4 i (items
 * it = w mod 4), each lane's sum in a register (S / 4 of them), in turn.
 * The shuffle tree's levels o = S/2 .. 4 pair lanes of one warp (their
 * sums meet in registers, in the tree's order), o = 2 and 1 pair the warps:
 * out = (P0 + P2) + (P1 + P3) through shared memory, as the tree's lane 0.
 * The CTA's 16 rows (quants, then scales) are staged whole, each row
 * padded so that ldmatrix's 8 rows meet 8 distinct 16-byte bank groups;
 * the activations unpacked from Q8_0 blocks (f16 d as float, as
 * qd_put_q8_0). */
#define MMQ8_ROWS 16
struct mmq8_lay {
    int ws, xs;                    /* a staged weight row's bytes; an activation row's quants */
    int o_q, o_d, o_p;             /* offsets: quants, scales, the warps' partial sums */
    int bytes;
};
__host__ __device__ __forceinline__ mmq8_lay mmq8_layout(int k)
{
    const int nb = k / 32;
    int ws16 = 34 * nb / 16;   /* nb % 8 == 0: whole 16-byte units */
    ws16 += (1 - ws16) & 7;    /* = 1 mod 8 */
    mmq8_lay l;
    l.ws = 16 * ws16;
    l.xs = k + 16;
    l.o_q = MMQ8_ROWS * l.ws;
    l.o_d = l.o_q + CUDA_MM_NB * l.xs;
    l.o_p = l.o_d + 4 * CUDA_MM_NB * nb;
    l.bytes = l.o_p + 4 * MMQ_WARPS * 16 * CUDA_MM_NB;
    return l;
}

/* d = A (16 x 16 s8, row) * B (16 x 8 s8, col), exact int32 */
__device__ __forceinline__ void mmq_mma16(int d[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <int LG>
__global__ void __launch_bounds__(32 * MMQ_WARPS, 4)
k_mmq_q80s(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k,
           const uint8_t *__restrict__ xq, size_t x_stride, const int32_t *__restrict__ xrow,
           const int64_t *__restrict__ yoff, float *y)
{
    pdl_enter();
    constexpr int S = 1 << LG, NL = S / 4;   /* lanes a warp */
    static_assert(NL >= 4, "k_mmq_q80s: four items an ldmatrix");
    extern __shared__ __align__(16) uint8_t smem[];
    const int nb = k / 32, nit = 2 * nb, rb = 34 * nb;
    const mmq8_lay L = mmq8_layout(k);
    uint8_t *sw = smem;
    int8_t *sq = (int8_t *)(smem + L.o_q);
    float *sd = (float *)(smem + L.o_d);
    float *part = (float *)(smem + L.o_p);
    const int b = blockIdx.y, r0 = blockIdx.x * MMQ8_ROWS, nr = min(MMQ8_ROWS, rows - r0);
    const uint8_t *g = W + (size_t)(ids ? ids[b] : 0) * w_stride + (size_t)r0 * rb;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    const int cpr = rb / 16;   /* the 16 rows whole (rows past the matrix: its last) */
    for (int c = tid; c < MMQ8_ROWS * cpr; c += 32 * MMQ_WARPS) {
        const int i = c / cpr, ch = c - i * cpr;
        cp_async16(sw + i * L.ws + 16 * ch, g + (size_t)min(i, nr - 1) * rb + 16 * ch);
    }
    cp_async_commit();
    mmq_unpack<uint16_t>(xq, x_stride, xrow + b * CUDA_MM_NB, nb * 17, [&](uint16_t v, int j, int w) {
        qd_put_q8_0(v, w, sq + j * L.xs, sd + j * nb);   /* Q8_0 blocks: f16 d, 16 halfwords of quants */
    });
    cp_async_wait_all();
    __syncthreads();

    const int gr = lane >> 2, t0 = 2 * (lane & 3);
    /* ldmatrix rows: weights (rows lane % 8 + 8 ((lane / 8) % 2), item + 4 (lane / 16)),
     * activations (row lane % 8, item + 4 (lane / 8)) */
    const int wa = ((lane & 7) + 8 * ((lane >> 3) & 1)) * L.ws + 64 * (lane >> 4);
    const int xa = (lane & 7) * L.xs + 64 * (lane >> 3);
    const uint8_t *wsa = sw + gr * L.ws + 32 * nb, *wsb = wsa + 8 * L.ws;   /* the two rows' scales */
    float acc[NL][4];
#pragma unroll
    for (int i = 0; i < NL; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.f;
    for (int c = 0; c < nit; c += S) {
#pragma unroll
        for (int i0 = 0; i0 < NL; i0 += 4) {
            if (c + 4 * i0 >= nit) break;   /* nit % 16 == 0: the group is whole or absent */
            const int it0 = c + 4 * i0 + warp;   /* items it0 + 4 j: lanes warp + 4 (i0 + j) */
            uint32_t a01[4], a23[4], x[4];
            mmq_ldm4(a01, sw + wa + 16 * it0);
            mmq_ldm4(a23, sw + wa + 16 * (it0 + 8));
            mmq_ldm4(x, sq + xa + 16 * it0);
            int d[4][4];
            mmq_mma16(d[0], a01[0], a01[1], x[0]);
            mmq_mma16(d[1], a01[2], a01[3], x[1]);
            mmq_mma16(d[2], a23[0], a23[1], x[2]);
            mmq_mma16(d[3], a23[2], a23[3], x[3]);
#pragma unroll
            for (int j = 0; j < 4; j++) {   /* qd_q80s_dot's float products */
                const int blk = (it0 + 4 * j) >> 1;
                const float wd[2] = { qd_h2f(qd_ld16(wsa + 2 * blk)), qd_h2f(qd_ld16(wsb + 2 * blk)) };
                const float dx[2] = { sd[t0 * nb + blk], sd[(t0 + 1) * nb + blk] };
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float dd = wd[e >> 1] * dx[e & 1];
                    acc[i0 + j][e] += dd * (float)d[j][e];
                }
            }
        }
    }
    /* the tree's levels o = S/2 .. 4: lanes of this warp */
#pragma unroll
    for (int o = NL / 2; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < o; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][e] = acc[i][e] + acc[i + o][e];
#pragma unroll
    for (int e = 0; e < 4; e++) part[warp * 128 + (gr + 8 * (e >> 1)) * CUDA_MM_NB + t0 + (e & 1)] = acc[0][e];
    __syncthreads();
    {   /* o = 2, 1: lane 0 = (P0 + P2) + (P1 + P3); thread tid: output (row tid / 8, activation row tid % 8) */
        const float v = (part[tid] + part[256 + tid]) + (part[128 + tid] + part[384 + tid]);
        const int r = tid >> 3, t = tid & 7;
        if (r < nr && xrow[b * CUDA_MM_NB + t] >= 0) y[yoff[b * CUDA_MM_NB + t] + r0 + r] = v;
    }
}

/* ==== Q6_K ====
 * An item (qd_item_q6_K) is 8 weights at each of l, l + 32, l + 64, l + 96
 * of a block's half hh, each 8 under its own 16-weight scale:
 *     v = (d(w) * dx) * (sc0 dot8_0 + sc2 dot8_1 + sc4 dot8_2 + sc6 dot8_3).
 * So an item takes four m16n8k16 mma, one a group of 8 (k = 0..7: the
 * fragments of lanes with lane % 4 = 0, 1; lanes 2, 3 give zeros), each
 * the exact dot8 of the dp4a kernel; the integers meet in isum as there,
 * then the same float products. The lanes' order and tree as the Q4_K
 * kernel's (qd_mmq_push; U = 4 items a lane a pass: lane sl sums items sl,
 * sl + S, ... in turn). A CTA: 64 rows (16 a warp) by 8 activation rows;
 * the rows' contiguous span staged whole (stage_tile: 210-byte blocks, the
 * span at its own offset mod 16), read by 2-aligned word loads
 * (qd_ld32_a2); the activations as the Q4_K kernel's (plain 256-byte
 * blocks, scales as floats). lg_s <= 3 (k <= 1024: the experts' down
 * projections of 30b-a3b and 80b-a3b shapes). */
#define MMQ6_LG_MAX 3
struct mmq6_lay {
    int xs, o_d, o_w, bytes;
};
__host__ __device__ __forceinline__ mmq6_lay mmq6_layout(int k)
{
    const int nb = k / 256;
    mmq6_lay l;
    l.xs = k + 16;
    l.o_d = CUDA_MM_NB * l.xs;
    l.o_w = (l.o_d + 4 * CUDA_MM_NB * nb + 15) & ~15;
    l.bytes = l.o_w + MMQ_ROWS * nb * CQ6_K_BYTES + 32;   /* + the span's shift and the a2 loads' last word */
    return l;
}

template <int LG>
__global__ void __launch_bounds__(32 * MMQ_WARPS, 3)
k_mmq_q6k(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k,
          const uint8_t *__restrict__ xq, size_t x_stride, const int32_t *__restrict__ xrow,
          const int64_t *__restrict__ yoff, float *y)
{
    pdl_enter();
    constexpr int S = 1 << LG;
    extern __shared__ __align__(16) uint8_t smem[];
    const int nb = k / 256, nit = 8 * nb, rb = nb * CQ6_K_BYTES;
    const mmq6_lay L = mmq6_layout(k);
    int8_t *sq = (int8_t *)smem;
    float *sd = (float *)(smem + L.o_d);
    const int b = blockIdx.y, r0 = blockIdx.x * MMQ_ROWS, nr = min(MMQ_ROWS, rows - r0);
    const uint8_t *g = W + (size_t)(ids ? ids[b] : 0) * w_stride + (size_t)r0 * rb;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int shift = stage_tile(smem + L.o_w, g, (size_t)nr * rb);
    mmq_unpack_q8k<false>(xq, x_stride, xrow + b * CUDA_MM_NB, nb, sq, L.xs, sd, nullptr);
    cp_async_wait_all();
    __syncthreads();

    const int gr = lane >> 2, t = lane & 3, t0 = 2 * t;
    const uint8_t *sw = smem + L.o_w + shift;
    const uint8_t *wr[2] = { sw + (size_t)min(16 * warp + gr, nr - 1) * rb, sw + (size_t)min(16 * warp + gr + 8, nr - 1) * rb };
    const int8_t *xg = sq + gr * L.xs + 4 * (t & 1);   /* this lane's B: activation row gr, bytes 4 (t % 2) .. */
    const uint32_t k32 = 0x20202020u;
    float stk[4][QD_MMQ_LG_MAX + 1];
    qd_mmq_for<0, S>([&](auto P) {
        constexpr int p = decltype(P)::value;
        float acc[4] = { 0.f, 0.f, 0.f, 0.f };
        for (int it = qd_mmq_rev(p, LG); it < nit; it += S) {
            const int blk = it >> 3, hh = (it >> 2) & 1, l = (it & 3) * 8;
            /* A: 4 weights (k = 4t..) of each group m for rows gr and gr + 8; lanes t >= 2 zeros */
            uint32_t wq[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t *bp = wr[h] + blk * CQ6_K_BYTES;
                const int o = 64 * hh + l + 4 * (t & 1);
                const uint32_t a = qd_ld32_a2(bp + o), bq = qd_ld32_a2(bp + o + 32);
                const uint32_t q = qd_ld32_a2(bp + 128 + 32 * hh + l + 4 * (t & 1));
                wq[h][0] = qd_vsub4((a & 0x0f0f0f0fu) | ((q & 0x03030303u) << 4), k32);
                wq[h][1] = qd_vsub4((bq & 0x0f0f0f0fu) | (((q >> 2) & 0x03030303u) << 4), k32);
                wq[h][2] = qd_vsub4(((a >> 4) & 0x0f0f0f0fu) | (((q >> 4) & 0x03030303u) << 4), k32);
                wq[h][3] = qd_vsub4(((bq >> 4) & 0x0f0f0f0fu) | (((q >> 6) & 0x03030303u) << 4), k32);
                if (t >= 2) wq[h][0] = wq[h][1] = wq[h][2] = wq[h][3] = 0u;
            }
            const int8_t *xb = xg + blk * 256 + 128 * hh + l;
            int isum[4] = { 0, 0, 0, 0 };
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const uint32_t bx = t < 2 ? *(const uint32_t *)(xb + 32 * m) : 0u;
                int dm[4];
                mmq_mma16(dm, wq[0][m], wq[1][m], bx);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    isum[e] += (int)((const int8_t *)(wr[e >> 1] + blk * CQ6_K_BYTES + 192))[8 * hh + (l >> 4) + 2 * m] * dm[e];
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {   /* qd_item_q6_K's float products */
                const float d = qd_h2f(qd_ld16(wr[e >> 1] + blk * CQ6_K_BYTES + 208)) * sd[(t0 + (e & 1)) * nb + blk];
                acc[e] += d * (float)isum[e];
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) qd_mmq_push<p>(stk[e], acc[e]);
    });
    mmq_store(y, yoff + b * CUDA_MM_NB, xrow + b * CUDA_MM_NB, stk, r0, 16 * warp + gr, t0, nr);
}

typedef void (*mmq_fn)(const uint8_t *, size_t, const int32_t *, int, int, const uint8_t *, size_t, const int32_t *,
                       const int64_t *, float *);

/* The kernels by type and lanes a row (lg_s) */
static const mmq_fn mmq_k45[2][MMQ_LG_MAX + 1] = {
    { k_mmq_k45<0, 0>, k_mmq_k45<0, 1>, k_mmq_k45<0, 2>, k_mmq_k45<0, 3>, k_mmq_k45<0, 4> },
    { k_mmq_k45<1, 0>, k_mmq_k45<1, 1>, k_mmq_k45<1, 2>, k_mmq_k45<1, 3>, k_mmq_k45<1, 4> },
};
static const mmq_fn mmq_q6k[MMQ6_LG_MAX + 1] = { k_mmq_q6k<0>, k_mmq_q6k<1>, k_mmq_q6k<2>, k_mmq_q6k<3> };
static const mmq_fn mmq_q80s[2] = { k_mmq_q80s<4>, k_mmq_q80s<5> };   /* lg_s 4, 5 */

/* A launch's kernel (NULL: none takes it; then the direct kernel), weight
 * rows a CTA and dynamic shared memory: by type, lg_s, k, the stack's
 * alignment (Q6_K rows 2-aligned, the others 16), the device (sm_80+) and
 * its shared memory. */
struct mmq_plan {
    mmq_fn fn;
    int    rows;
    size_t smem;
};
static mmq_plan mmq_plan_of(const cuda_ctx *c, const cuda_matmul_args *a, int lg_s)
{
    mmq_plan p = { NULL, MMQ_ROWS, 0 };
    if (c->info.cc_major < 8 || lg_s < 0 || a->k % 256) return p;
    const int k = (int)a->k;
    uintptr_t al = 15;
    switch (a->wtype) {
    case QTYPE_Q4_K:
    case QTYPE_Q5_K: {
        const int q5 = a->wtype == QTYPE_Q5_K;
        if (lg_s > MMQ_LG_MAX || a->k > 256 * MMQ_ORD) return p;
        p.fn = mmq_k45[q5][lg_s];
        p.smem = (size_t)mmq_layout(k, q5 ? QD_Q5K_BYTES : CQ4_K_BYTES).bytes;
        break;
    }
    case QTYPE_Q6_K:
        if (lg_s > MMQ6_LG_MAX) return p;
        al = 1;
        p.fn = mmq_q6k[lg_s];
        p.smem = (size_t)mmq6_layout(k).bytes;
        break;
    case CUDA_Q8_0_SPLIT:   /* k % 256 == 0 and aligned stacks: cuda_repack_q8_0's contract */
        if (lg_s < 4 || lg_s > 5) return p;
        p.fn = mmq_q80s[lg_s - 4];
        p.rows = MMQ8_ROWS;
        p.smem = (size_t)mmq8_layout(k).bytes;
        break;
    default:
        return p;
    }
    if (((uintptr_t)a->w & al) || (a->ids && (a->w_stride & al)) || p.smem > c->info.smem_per_block_optin)
        p.fn = NULL;
    return p;
}

int cuda_mmq_ok(const cuda_ctx *c, const cuda_matmul_args *a, int lg_s) { return mmq_plan_of(c, a, lg_s).fn != NULL; }

int cuda_mmq_run(cuda_ctx *c, const cuda_matmul_args *a, int lg_s, err *e)
{
    const mmq_plan p = mmq_plan_of(c, a, lg_s);
    if (!p.fn) return err_setf(e, ERR_USAGE, "cuda_mmq_run: no tensor-core kernel for this launch (cuda_mmq_ok)");
    const int rows = (int)a->rows;
    const dim3 grid((unsigned)((rows + p.rows - 1) / p.rows), (unsigned)a->n_items);
    return cuda_launch(c, p.fn, grid, 32 * MMQ_WARPS, p.smem, e, "matmul mma", (const uint8_t *)a->w, a->w_stride,
                       a->ids, rows, (int)a->k, (const uint8_t *)a->xq, a->x_stride, a->xrow, a->yoff, a->y);
}

/* The kernels' dynamic shared-memory limit, once per context. */
int cuda_mmq_init(cuda_ctx *c, err *e)
{
    const int lim = (int)c->info.smem_per_block_optin;
    const mmq_fn *sets[3] = { &mmq_k45[0][0], mmq_q6k, mmq_q80s };
    const int n[3] = { 2 * (MMQ_LG_MAX + 1), MMQ6_LG_MAX + 1, 2 };
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n[s]; i++)
            if (cuda_fail(e, cudaFuncSetAttribute(sets[s][i], cudaFuncAttributeMaxDynamicSharedMemorySize, lim),
                          "cuda_mmq_init"))
                return -1;
    return 0;
}

CUDA_TRACE_BIND(mmq)

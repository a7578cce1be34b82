/* test_cuda_emu: runs the matvec kernels' per-item arithmetic
 * (src/backend/cuda/cuda_qdot.cuh, the same __host__ __device__ functions
 * the GPU runs) on the CPU, in the kernel's lane order, against quant_ops
 * dot (Q4_K Q5_K Q6_K Q8_0 Q4_0 Q5_0 Q4_1 Q5_1 F32 F16 BF16). Needs no GPU, so CI checks the block/scale index math of every
 * matvec type on every run; test_cuda checks the real device.
 *
 * The emulation: the activation row (CPU act_quant, which the device
 * reproduces bit for bit) is unpacked with qd_unpack_* exactly as the
 * kernel unpacks it into shared memory (F32/F16/BF16: read raw, as the
 * kernel does); lane l sums items l, l + 32, ... and the 32 lane sums are
 * added as the shuffle tree does. Tolerance as in test_cuda: NMSE < 1e-10
 * (integer sums are exact; only float rounding order differs).
 *
 * test_emu_half_conv checks the device's f16 / bf16 activation conversions
 * (qd_f2h, qd_f2bf: the code cuda_act_quant runs) against util/fp16.h's
 * fp32_to_fp16 / fp32_to_bf16 bit for bit: a stride over all 2^32 float
 * bit patterns plus every f16 rounding tie and its neighbours. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

extern "C" {
#include "testhelp.h"
#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/cpu.h"
#include "util/fp16.h"
}
#include "backend/cuda/cuda_qdot.cuh"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

typedef float (*item_fn)(const uint8_t *, const int8_t *, const float *, const int16_t *, int);

/* float weights: the raw activation row is passed as xq */
static float item_f32(const uint8_t *w, const int8_t *x, const float *, const int16_t *, int it)
{
    return qd_item_f32(w, (const uint8_t *)x, it);
}
static float item_f16(const uint8_t *w, const int8_t *x, const float *, const int16_t *, int it)
{
    return qd_item_f16(w, (const uint8_t *)x, it);
}
static float item_bf16(const uint8_t *w, const int8_t *x, const float *, const int16_t *, int it)
{
    return qd_item_bf16(w, (const uint8_t *)x, it);
}

static void check(int wtype, int rows, int k)
{
    const qtype_info *qi = qtype_get(wtype);
    const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
    const int nb = k / qi->blck;
    item_fn item;
    int nit;   /* items a row */
    switch (wtype) {
    case QTYPE_Q4_K: item = qd_block_q4_K; nit = nb; break;   /* a block an item */
    case QTYPE_Q5_K: item = qd_block_q5_K; nit = nb; break;
    case QTYPE_Q6_K: item = qd_item_q6_K; nit = nb * QD_Q6K_ITEMS; break;
    case QTYPE_Q4_0: item = qd_item_q4_0; nit = nb * QD_Q40_ITEMS; break;
    case QTYPE_Q5_0: item = qd_item_q5_0; nit = nb * QD_Q50_ITEMS; break;
    case QTYPE_Q4_1: item = qd_item_q4_1; nit = nb * QD_Q41_ITEMS; break;
    case QTYPE_Q5_1: item = qd_item_q5_1; nit = nb * QD_Q51_ITEMS; break;
    case QTYPE_F32: item = item_f32; nit = k / QD_F32_PER_ITEM; break;
    case QTYPE_F16: item = item_f16; nit = k / QD_F16_PER_ITEM; break;
    case QTYPE_BF16: item = item_bf16; nit = k / QD_F16_PER_ITEM; break;
    default: item = qd_item_q8_0; nit = nb * QD_Q80_ITEMS; break;
    }
    uint8_t *w = (uint8_t *)malloc(rb * rows);
    float *f = (float *)malloc(sizeof(float) * k);
    err e = {0, {0}};
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < k; i++) f[i] = frand() * 0.05f;
        CHECK(quant_quantize(wtype, f, w + r * rb, k, &e) == 0);
    }
    for (int i = 0; i < k; i++) f[i] = frand() * 2.0f;
    quant_ops ops;
    CHECK(quant_ops_get(wtype, CPU_ISA_SCALAR, &ops, &e) == 0);
    const int dt = ops.dot_type;
    const size_t ab = (size_t)(k / qtype_get(dt)->blck) * qtype_get(dt)->type_size;
    uint8_t *xq = (uint8_t *)malloc(ab);
    CHECK(quant_act_quantize(dt, f, xq, k, &e) == 0);

    /* the kernel's shared-memory arrays */
    int8_t *sxq = (int8_t *)malloc(dt == QTYPE_Q8_K ? (size_t)nb * QD_Q8K_XB : (size_t)k);
    float *sxd = (float *)malloc(sizeof(float) * (k / 32));
    int16_t *sxbs = (int16_t *)malloc(sizeof(int16_t) * (k / 16));
    const int8_t *xs = sxq;
    if (dt == QTYPE_Q8_K)
        for (int i = 0; i < nb * 73; i++) qd_unpack_q8_K(xq, i, sxq, sxd, sxbs);
    else if (dt == QTYPE_Q8_0)
        for (int i = 0; i < nb * 17; i++) qd_unpack_q8_0(xq, i, sxq, sxd);
    else if (dt == QTYPE_Q8_1)   /* float s in the xbs bytes, as the kernel's shared memory */
        for (int i = 0; i < nb * 18; i++) qd_unpack_q8_1(xq, i, sxq, sxd, sxbs);
    else
        xs = (const int8_t *)xq;   /* F32 / F16 / BF16: the kernel reads the row raw */

    double num = 0, den = 0;
    for (int r = 0; r < rows; r++) {
        float lane_acc[32];
        for (int l = 0; l < 32; l++) {
            float a = 0.f;
            for (int it = l; it < nit; it += 32) a += item(w + r * rb, xs, sxd, sxbs, it);
            lane_acc[l] = a;
        }
        for (int o = 16; o > 0; o >>= 1)   /* __shfl_xor tree: lane l gets l + (l ^ o) */
            for (int l = 0; l < 32; l++)
                if (l < o) lane_acc[l] = lane_acc[l] + lane_acc[l + o];
        const float ref = ops.dot(k, w + r * rb, xq);
        num += ((double)lane_acc[0] - ref) * ((double)lane_acc[0] - ref);
        den += (double)ref * ref;
    }
    if (wtype == QTYPE_Q8_0 && k % 256 == 0) {   /* split rows (cuda_repack_q8_0's layout): the same items bit for bit */
        uint8_t *sw = (uint8_t *)malloc(rb);
        int bad = 0;
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w + r * rb;
            for (int b = 0; b < nb; b++) {
                memcpy(sw + 32 * b, row + 34 * b + 2, 32);
                memcpy(sw + 32 * nb + 2 * b, row + 34 * b, 2);
            }
            for (int it = 0; it < nit; it++) {
                const float a = qd_item_q8_0(row, xs, sxd, sxbs, it), b = qd_item_q8_0s(sw, xs, sxd, nb, it);
                bad += memcmp(&a, &b, sizeof a) != 0;
            }
        }
        printf("  emu q8_0 split rows %d x %d: %d items differ\n", rows, k, bad);
        CHECK_MSG(bad == 0, "q8_0 split rows: %d items differ from q8_0's", bad);
        free(sw);
    }
    const double nm = num / den;
    printf("  emu %-4s %4d x %-5d NMSE %.3g\n", qtype_name(wtype), rows, k, nm);
    CHECK_MSG(nm < 1e-10, "%s %dx%d NMSE %.3g", qtype_name(wtype), rows, k, nm);
    free(w); free(f); free(xq); free(sxq); free(sxd); free(sxbs);
}

TEST(test_emu_q4_K) { check(QTYPE_Q4_K, 24, 2048); check(QTYPE_Q4_K, 24, 768); check(QTYPE_Q4_K, 8, 4096); }
TEST(test_emu_q5_K) { check(QTYPE_Q5_K, 24, 2048); check(QTYPE_Q5_K, 24, 768); check(QTYPE_Q5_K, 8, 4096); }
TEST(test_emu_q6_K) { check(QTYPE_Q6_K, 24, 2048); check(QTYPE_Q6_K, 24, 768); check(QTYPE_Q6_K, 8, 4096); }
TEST(test_emu_q8_0) { check(QTYPE_Q8_0, 24, 2048); check(QTYPE_Q8_0, 24, 768); }
TEST(test_emu_q4_0) { check(QTYPE_Q4_0, 24, 2048); check(QTYPE_Q4_0, 24, 768); }
TEST(test_emu_q5_0) { check(QTYPE_Q5_0, 24, 2048); check(QTYPE_Q5_0, 24, 768); check(QTYPE_Q5_0, 24, 256); }
TEST(test_emu_q4_1) { check(QTYPE_Q4_1, 24, 2048); check(QTYPE_Q4_1, 24, 768); check(QTYPE_Q4_1, 24, 256); }
TEST(test_emu_q5_1) { check(QTYPE_Q5_1, 24, 2048); check(QTYPE_Q5_1, 24, 768); check(QTYPE_Q5_1, 24, 256); }

/* The coalesced copy's layout (qd_co_*: the direct matvec's and grouped
 * matmul's Q4_K path, 144-byte blocks, and 176-byte Q5_K blocks), for every
 * row length of 1..32 blocks and every count of rows a warp copies: the
 * warp's chunks (lane l: chunks l + 32 j, j < block bytes / 16) land on
 * distinct units inside its buffer, each lane then finds its own block
 * there byte for byte, and the 8 lanes of each 16-byte load phase read 8
 * different bank groups. */
TEST(test_emu_co_layout)
{
    static const int bbs[2] = { 144, 176 };
    int bad_place = 0, bad_bank = 0, layouts = 0;
    for (int t = 0; t < 2; t++) {
        const int bb = bbs[t], nch_b = bb / 16;
        for (int nit = 1; nit <= 32; nit++) {
            int lg = 0;
            while ((1 << lg) < nit) lg++;
            const int rpw = 32 >> lg, rb = nit * bb, cpr = rb / 16;
            const int rs16 = qd_co_rs16(rb, rpw);
            const unsigned rcp = qd_co_rcp((unsigned)cpr);
            CHECK(rs16 >= cpr && rs16 < cpr + 8);
            for (int nrw = 1; nrw <= rpw; nrw++) {
                const int nch = nrw * cpr;
                CHECK(nch <= 32 * nch_b);   /* every chunk has a lane */
                int *owner = (int *)malloc(sizeof(int) * (size_t)rpw * rs16);
                for (int u = 0; u < rpw * rs16; u++) owner[u] = -1;
                for (int lane = 0; lane < 32; lane++)
                    for (int j = 0; j < nch_b; j++) {
                        const unsigned c = (unsigned)(lane + 32 * j);
                        if ((int)c >= nch) continue;
                        const size_t u = qd_co_unit(c, (unsigned)cpr, rcp, rs16);
                        if (u >= (size_t)rpw * rs16 || owner[u] >= 0) { bad_place++; continue; }
                        owner[u] = (int)c;
                    }
                /* lane (row r, place sl): its block's chunks are the row's
                 * chunks sl * nch_b .. + nch_b, at r * rs16 + sl * nch_b .. */
                for (int lane = 0; lane < 32; lane++) {
                    const int r = lane & (rpw - 1), sl = lane >> (5 - lg);
                    if (r >= nrw || sl >= nit) continue;
                    for (int q = 0; q < nch_b; q++)
                        if (owner[r * rs16 + sl * nch_b + q] != r * cpr + sl * nch_b + q) bad_place++;
                }
                if (nrw == rpw)
                    for (int ph = 0; ph < 4; ph++)
                        for (int q = 0; q < nch_b; q++) {
                            int seen = 0, n = 0;
                            for (int lane = 8 * ph; lane < 8 * ph + 8; lane++) {
                                const int r = lane & (rpw - 1), sl = lane >> (5 - lg);
                                if (sl >= nit) continue;
                                seen |= 1 << ((r * rs16 + sl * nch_b + q) & 7);
                                n++;
                            }
                            if (__builtin_popcount((unsigned)seen) != n) bad_bank++;
                        }
                free(owner);
                layouts++;
            }
        }
    }
    printf("  emu co layout: %d layouts, %d misplaced chunks, %d bank-conflicted phases\n", layouts, bad_place,
           bad_bank);
    CHECK_MSG(bad_place == 0, "%d chunks misplaced", bad_place);
    CHECK_MSG(bad_bank == 0, "%d load phases share a bank group", bad_bank);
}

/* The unpacked Q8_K row's layout (QD_Q8K_XB bytes a block, quants at
 * qd_q8k_off): each block's 256 bytes land on distinct places inside its
 * own 256 of them, 16-byte chunks whole; and the direct kernels' readers
 * (lane = sl * rpw + row) meet distinct banks wherever the comment in
 * cuda_qdot.cuh says: Q4_K / Q5_K block items, a 16-byte load of logical
 * chunk q by 8 lanes a phase (blocks c0 + sl, c0 a multiple of S = 32 /
 * rpw), conflict-free for rpw >= 2 and at most 2-way at rpw = 1; Q6_K
 * items, a 32-bit load by the whole warp (items c0 + sl + S u, 8 a
 * block), conflict-free at S = 8 (K = 768) and 16 (K = 2048). */
static int phase_ways(const int *addr, int n, int unit, int nbank)
{
    int ways = 0;
    for (int b = 0; b < nbank; b++) {
        int distinct = 0;
        for (int i = 0; i < n; i++) {
            if ((addr[i] / unit) % nbank != b) continue;
            int first = 1;
            for (int j = 0; j < i; j++) first &= addr[j] != addr[i];
            distinct += first;
        }
        if (distinct > ways) ways = distinct;
    }
    return ways;
}
TEST(test_emu_q8k_layout)
{
    int bad_place = 0, bad_q4 = 0, bad_q6 = 0, phases = 0, worst_rpw1 = 0;
    for (int c = 0; c < 16; c++) {
        const int o0 = qd_q8k_off(16 * c);
        if (o0 % 16 || o0 < 0 || o0 >= 256) bad_place++;
        for (int b = 1; b < 16; b++) bad_place += qd_q8k_off(16 * c + b) != o0 + b;
        for (int c2 = 0; c2 < c; c2++) bad_place += qd_q8k_off(16 * c2) == o0;
    }
    CHECK(QD_Q8K_XB >= 256 && QD_Q8K_XB % 16 == 0);
    for (int lg = 0; lg <= 5; lg++) {
        const int S = 1 << lg, rpw = 32 >> lg;
        for (int c0 = 0; c0 < 64; c0 += S)
            for (int q = 0; q < 16; q++)
                for (int ph = 0; ph < 4; ph++) {
                    int addr[8];
                    for (int i = 0; i < 8; i++) {
                        const int blk = c0 + ((8 * ph + i) >> (5 - lg));
                        addr[i] = QD_Q8K_XB * blk + qd_q8k_off(16 * q);
                    }
                    const int w = phase_ways(addr, 8, 16, 8);
                    if (rpw == 1) worst_rpw1 = w > worst_rpw1 ? w : worst_rpw1;
                    if (w > (rpw == 1 ? 2 : 1)) bad_q4++;
                    phases++;
                }
    }
    for (int lg = 3; lg <= 4; lg++) {
        const int S = 1 << lg;
        for (int c0 = 0; c0 < 128; c0 += S)
            for (int m = 0; m < 4; m++)
                for (int h = 0; h < 2; h++) {
                    int addr[32];
                    for (int lane = 0; lane < 32; lane++) {
                        const int it = c0 + (lane >> (5 - lg));
                        const int blk = it >> 3, hh = (it >> 2) & 1, l = (it & 3) * 8;
                        addr[lane] = QD_Q8K_XB * blk + qd_q8k_off(128 * hh + l + 32 * m + 4 * h);
                    }
                    if (phase_ways(addr, 32, 4, 32) > 1) bad_q6++;
                    phases++;
                }
    }
    printf("  emu q8_K layout: %d misplaced; %d phases, %d Q4_K/Q5_K (rpw 1: %d-way) and %d Q6_K conflicted\n",
           bad_place, phases, bad_q4, worst_rpw1, bad_q6);
    CHECK_MSG(bad_place == 0, "qd_q8k_off: %d bytes misplaced", bad_place);
    CHECK_MSG(bad_q4 == 0 && bad_q6 == 0, "%d Q4_K and %d Q6_K load phases bank-conflicted", bad_q4, bad_q6);
}

/* The tensor-core matmul's order (qd_mmq_rev, qd_mmq_push): bit for bit the
 * direct kernels' lanes and shuffle tree, for every lane count it takes and
 * every block count that gives it (mvd_geometry: S the least power of two
 * >= the blocks), on values of mixed magnitude; the plain left-to-right sum
 * is counted too, to show the values tell orders apart. */
template <int LG> static void mmq_order_case(int nb, const float *v, int *bad, int *seq_differ)
{
    constexpr int S = 1 << LG;
    float lane[S];
    for (int sl = 0; sl < S; sl++) {
        lane[sl] = 0.f;
        for (int it = sl; it < nb; it += S) lane[sl] += v[it];
    }
    for (int o = S >> 1; o > 0; o >>= 1) {   /* __shfl_xor_sync: every lane at once */
        float nx[S];
        for (int sl = 0; sl < S; sl++) nx[sl] = lane[sl] + lane[sl ^ o];
        memcpy(lane, nx, sizeof lane);
    }
    float stk[QD_MMQ_LG_MAX + 1];
    qd_mmq_for<0, S>([&](auto P) {
        constexpr int p = decltype(P)::value;
        float a = 0.f;
        for (int it = qd_mmq_rev(p, LG); it < nb; it += S) a += v[it];
        qd_mmq_push<p>(stk, a);
    });
    float seq = 0.f;
    for (int it = 0; it < nb; it++) seq += v[it];
    *bad += memcmp(&stk[0], &lane[0], 4) != 0;
    *seq_differ += memcmp(&seq, &lane[0], 4) != 0;
}
TEST(test_emu_mmq_order)
{
    int bad = 0, seq_differ = 0, cases = 0;
    float v[1 << QD_MMQ_LG_MAX];
    for (int round = 0; round < 2000; round++)
        for (int nb = 1; nb <= (1 << QD_MMQ_LG_MAX); nb++, cases++) {
            for (int i = 0; i < nb; i++) v[i] = (frand() - 0.5f) * ldexpf(1.f, (int)(frand() * 24.f) - 12);
            if (nb == 1) mmq_order_case<0>(nb, v, &bad, &seq_differ);
            else if (nb == 2) mmq_order_case<1>(nb, v, &bad, &seq_differ);
            else if (nb <= 4) mmq_order_case<2>(nb, v, &bad, &seq_differ);
            else if (nb <= 8) mmq_order_case<3>(nb, v, &bad, &seq_differ);
            else mmq_order_case<4>(nb, v, &bad, &seq_differ);
        }
    printf("  emu mmq order: %d sums of 1..%d blocks, %d differ from the lanes' tree (a plain left-to-right sum: %d)\n",
           cases, 1 << QD_MMQ_LG_MAX, bad, seq_differ);
    CHECK_MSG(bad == 0, "qd_mmq_push: %d of %d sums differ from the shuffle tree", bad, cases);
    CHECK_MSG(seq_differ > 0, "the values never tell the tree from a plain sum: the check cannot fail");
}

/* qd_hbits4: the 5th-bit spread of Q5_0 / Q5_1, every input. */
TEST(test_emu_hbits4)
{
    for (uint32_t b = 0; b < 16; b++) {
        uint32_t r = 0;
        for (int i = 0; i < 4; i++) r |= ((b >> i) & 1u) << (8 * i + 4);
        CHECK_MSG(qd_hbits4(b) == r, "hbits4(%u) = %08x, want %08x", b, qd_hbits4(b), r);
    }
}
TEST(test_emu_float)
{
    check(QTYPE_F32, 24, 2048);
    check(QTYPE_F32, 24, 68);   /* 17 items: the direct kernel's short rows */
    check(QTYPE_F16, 24, 2048);
    check(QTYPE_F16, 24, 136);
    check(QTYPE_BF16, 24, 2048);
    check(QTYPE_BF16, 24, 136);
}

static int g_conv_bad;
static void conv_one(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    if (qd_f2h(f) != fp32_to_fp16(f) || qd_f2bf(f) != fp32_to_bf16(f)) {
        if (g_conv_bad++ < 5)
            fprintf(stderr, "  conv %08x: f16 %04x vs %04x, bf16 %04x vs %04x\n", u, qd_f2h(f), fp32_to_fp16(f),
                    qd_f2bf(f), fp32_to_bf16(f));
    }
}

TEST(test_emu_half_conv)
{
    g_conv_bad = 0;
    uint64_t n = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 997, n++) conv_one((uint32_t)u);
    /* every f16 value h: the float halfway to h + 1 (a tie) and its two
     * float neighbours, both signs; normal, subnormal and overflow ranges */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        const float lo = fp16_to_fp32((uint16_t)h), hi = h + 1 < 0x7c00 ? fp16_to_fp32((uint16_t)(h + 1)) : 65536.f;
        const float mid = lo + (hi - lo) * 0.5f;
        uint32_t m;
        memcpy(&m, &mid, 4);
        for (uint32_t d = 0; d < 3; d++)
            for (uint32_t s = 0; s < 2; s++, n++) conv_one(((m + d - 1) & 0x7fffffffu) | s << 31);
    }
    const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa5a5a5u, 0x00000001u, 0x80000000u};
    for (unsigned i = 0; i < sizeof sp / sizeof sp[0]; i++, n++) conv_one(sp[i]);
    printf("  emu f16/bf16 conversions: %llu values, %d differ\n", (unsigned long long)n, g_conv_bad);
    CHECK_MSG(g_conv_bad == 0, "%d conversions differ from util/fp16.h", g_conv_bad);
}

int main(void)
{
    RUN(test_emu_q4_K);
    RUN(test_emu_q5_K);
    RUN(test_emu_q6_K);
    RUN(test_emu_q8_0);
    RUN(test_emu_q4_0);
    RUN(test_emu_q5_0);
    RUN(test_emu_q4_1);
    RUN(test_emu_q5_1);
    RUN(test_emu_co_layout);
    RUN(test_emu_q8k_layout);
    RUN(test_emu_mmq_order);
    RUN(test_emu_hbits4);
    RUN(test_emu_float);
    RUN(test_emu_half_conv);
    return test_summary("cuda_emu");
}

/* test_cuda_emu: runs the matvec kernels' per-item arithmetic
 * (src/backend/cuda/cuda_qdot.cuh, the same __host__ __device__ functions
 * the GPU runs) on the CPU, in the kernel's lane order, against quant_ops
 * dot. Needs no GPU, so CI checks the block/scale index math of every
 * matvec type on every run; test_cuda checks the real device.
 *
 * The emulation: the activation row (CPU act_quant, which the device
 * reproduces bit for bit) is unpacked with qd_unpack_* exactly as the
 * kernel unpacks it into shared memory; lane l sums items l, l + 32, ...
 * and the 32 lane sums are added as the shuffle tree does. Tolerance as in
 * test_cuda: NMSE < 1e-10 (integer sums are exact; only float rounding
 * order differs). */
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

static void check(int wtype, int rows, int k)
{
    const qtype_info *qi = qtype_get(wtype);
    const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
    const int nb = k / qi->blck;
    item_fn item = wtype == QTYPE_Q4_K ? qd_item_q4_K : wtype == QTYPE_Q6_K ? qd_item_q6_K : qd_item_q8_0;
    const int ipb = wtype == QTYPE_Q4_K ? QD_Q4K_ITEMS : wtype == QTYPE_Q6_K ? QD_Q6K_ITEMS : QD_Q80_ITEMS;
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
    int8_t *sxq = (int8_t *)malloc(k);
    float *sxd = (float *)malloc(sizeof(float) * (k / 32));
    int16_t *sxbs = (int16_t *)malloc(sizeof(int16_t) * (k / 16));
    if (dt == QTYPE_Q8_K)
        for (int i = 0; i < nb * 73; i++) qd_unpack_q8_K(xq, i, sxq, sxd, sxbs);
    else
        for (int i = 0; i < nb * 17; i++) qd_unpack_q8_0(xq, i, sxq, sxd);

    double num = 0, den = 0;
    for (int r = 0; r < rows; r++) {
        float lane_acc[32];
        for (int l = 0; l < 32; l++) {
            float a = 0.f;
            for (int it = l; it < nb * ipb; it += 32) a += item(w + r * rb, sxq, sxd, sxbs, it);
            lane_acc[l] = a;
        }
        for (int o = 16; o > 0; o >>= 1)   /* __shfl_xor tree: lane l gets l + (l ^ o) */
            for (int l = 0; l < 32; l++)
                if (l < o) lane_acc[l] = lane_acc[l] + lane_acc[l + o];
        const float ref = ops.dot(k, w + r * rb, xq);
        num += ((double)lane_acc[0] - ref) * ((double)lane_acc[0] - ref);
        den += (double)ref * ref;
    }
    const double nm = num / den;
    printf("  emu %-4s %4d x %-5d NMSE %.3g\n", qtype_name(wtype), rows, k, nm);
    CHECK_MSG(nm < 1e-10, "%s %dx%d NMSE %.3g", qtype_name(wtype), rows, k, nm);
    free(w); free(f); free(xq); free(sxq); free(sxd); free(sxbs);
}

TEST(test_emu_q4_K) { check(QTYPE_Q4_K, 24, 2048); check(QTYPE_Q4_K, 24, 768); }
TEST(test_emu_q6_K) { check(QTYPE_Q6_K, 24, 2048); check(QTYPE_Q6_K, 24, 768); }
TEST(test_emu_q8_0) { check(QTYPE_Q8_0, 24, 2048); check(QTYPE_Q8_0, 24, 768); }

int main(void)
{
    RUN(test_emu_q4_K);
    RUN(test_emu_q6_K);
    RUN(test_emu_q8_0);
    return test_summary("cuda_emu");
}

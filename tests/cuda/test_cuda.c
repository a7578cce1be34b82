/* test_cuda: the CUDA backend's kernels against the CPU path, and (with
 * --bench) the decode matvec bandwidth benchmark.
 *
 * Without a usable GPU (no driver, no device: this machine and CI) cuda_open
 * answers ERR_UNSUPPORTED; the suite prints a skip note and counts the skip
 * as one passed case, so `cuda: 1 passed, 0 failed`, exit 0. Any other
 * cuda_open error (a GPU that fails to set up) is a failure.
 *
 * With a GPU, every check draws fresh random inputs and poisons outputs
 * (NaN) before the kernel runs:
 *   act_quant  device Q8_K / Q8_0 / Q8_1 / f16 / bf16 / f32 bytes == the CPU's
 *              act_quant bytes (memcmp, Q8_1's s included), including an all-zero block, a
 *              block whose first largest |x| has a later equal-magnitude
 *              twin of the other sign, (Q8_0/Q8_1) a block of subnormals
 *              (127/amax overflows), and (f16/bf16) rounding ties, f16
 *              subnormals, overflow to inf, inf and NaN;
 *   matvec     Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, F32, F16, BF16 weights
 *              quantized on the CPU (quant_ops quant; the 151936-row Q6_K
 *              head uses random block bytes with sane scales instead:
 *              quantizing 311M weights would take minutes of the device
 *              lease), GPU y vs the CPU's quant_ops dot over the CPU
 *              act_quant'ed x. TOLERANCE: NMSE < 1e-10 (float weights: the
 *              same bound; their products are the CPU's, exact for
 *              f16/bf16, and the CPU sums in double, the GPU in float).
 *              Both sides compute identical integer block sums from
 *              identical quantized inputs (act_quant is bit-exact, checked
 *              above); only the float scaling products and the order of the
 *              float sum over blocks differ, each float op off by at most
 *              half an ulp (6e-8 relative), so the error is ~1e-7 of the sum
 *              of |block partials|, and NMSE ~1e-14..1e-13 for random data
 *              (~1e-3 cancellation). A single flipped quant or a wrong
 *              block/scale gives NMSE > 1e-8, so 1e-10 separates the cases;
 *   batch/ids  matvec over a batch with an id array, per-item inputs and a
 *              padded output stride;
 *   rmsnorm    vs ops_rmsnorm (rel 1e-6: double sums in another order can
 *              move the float mean by 1 ulp), in place too;
 *   swiglu     vs ops_swiglu (rel 2e-6: CUDA expf is within 2 ulp);
 *   router     vs ops_softmax + ops_topk + qwen3moe's renormalisation: ids
 *              exactly (ties to the lower index), weights rel 2e-6.
 *
 * --info: open the device, print its name, exit 0 (3 when there is none).
 * --bench: GB/s of the decode matvec on expert-shaped batches and the head
 * vs the device's measured read and copy bandwidth (see print_bench).
 * --bench-chain: a decode layer's four big matvecs as a chain of dependent
 * launches against dependent reads of the same bytes (see bench_chain). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "testhelp.h"
#define CUDATEST_SEED 0x9E3779B97F4A7C15ull
#include "cudatest.h"
#include "backend/cuda/cuda_backend.h"
#include "model/ops.h"
#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/cpu.h"
#include "util/fp16.h"


static double max_rel(const float *a, const float *r, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = fabs((double)a[i] - r[i]) / (fabs((double)r[i]) + 1e-30);
        if (d > m) m = d;
    }
    return m;
}

static int dot_type_of(int wtype) { return qtype_get(wtype)->dot_type; }

/* ==== act quant ==== */

static int is_float_type(int t) { return t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16; }

static void check_act_quant(int wtype, int64_t n, int rows)
{
    float *x = xmalloc(sizeof(float) * (size_t)(n * rows));
    for (int64_t i = 0; i < n * rows; i++) x[i] = frand() * 3.0f;
    if (is_float_type(wtype)) {
        /* rounding ties and their neighbours (f16: 1 + 2^-11, bf16: 1 + 2^-8),
         * f16 subnormals and their ties, the f16 overflow edge, inf, NaN */
        static const float sp[] = {1.00048828125f, 1.00146484375f, 1.00390625f, 1.01171875f, -1.00048828125f,
                                   0x1p-25f, 0x1.8p-24f, 0x1p-24f, 0x1.8p-23f, 1e-8f, -3e-6f, 65504.f,
                                   65519.99f, 65520.f, -70000.f, 1e30f, 0x1p-130f, INFINITY, -INFINITY, NAN};
        for (size_t i = 0; i < sizeof sp / sizeof sp[0] && (int64_t)i < n; i++) x[i] = sp[i];
    } else {
        const int be = qtype_get(wtype)->blck == 32 ? 32 : 256;
        /* block 1: all zero; block 2: the largest |x| twice, + first then - */
        for (int i = 0; i < be; i++) x[be + i] = 0.0f;
        x[2 * be + 5] = 7.5f;
        x[2 * be + 9] = -7.5f;
        if (be == 32)   /* block 3: subnormals, 127/amax overflows to inf */
            for (int i = 0; i < be; i++) x[3 * be + i] = (i & 1 ? -1.0f : 1.0f) * 1e-39f * (float)(i % 5);
    }
    const size_t ab = cuda_act_bytes(wtype, n);
    uint8_t *cpu = xmalloc(ab * rows), *gpu = xmalloc(ab * rows);
    err e = {0};
    for (int r = 0; r < rows; r++)
        CHECK(quant_act_quantize(dot_type_of(wtype), x + r * n, cpu + r * ab, n, &e) == 0);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * rows));
    void *dq = dev_alloc(ab * rows);
    CHECK(cuda_memset(g_cu, dq, 0xA5, ab * rows, &e) == 0);
    CHECK_MSG(cuda_act_quant(g_cu, wtype, dx, dq, n, rows, &e) == 0, "%s", e.msg);
    CHECK_MSG(cuda_download(g_cu, gpu, dq, ab * rows, &e) == 0, "%s", e.msg);
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < ab * rows; i++)
        if (cpu[i] != gpu[i]) { bad++; if (first == (size_t)-1) first = i; }
    CHECK_MSG(bad == 0, "%s act quant: %zu of %zu bytes differ, first at %zu (cpu %02x gpu %02x)",
              qtype_name(dot_type_of(wtype)), bad, ab * rows, first, bad ? cpu[first] : 0, bad ? gpu[first] : 0);
    printf("  act_quant %-4s n=%lld rows=%d: %s\n", qtype_name(dot_type_of(wtype)), (long long)n, rows,
           bad ? "DIFFERS" : "bit-identical");
    cuda_free(g_cu, dx);
    cuda_free(g_cu, dq);
    free(x); free(cpu); free(gpu);
}

TEST(test_act_quant)
{
    check_act_quant(QTYPE_Q4_K, 2048, 3);
    check_act_quant(QTYPE_Q8_0, 2048, 3);
    check_act_quant(QTYPE_Q4_K, 768, 1);
    check_act_quant(QTYPE_Q8_0, 768, 1);
    check_act_quant(QTYPE_Q5_K, 768, 2);   /* Q8_K, through the Q5_K entry */
    check_act_quant(QTYPE_Q4_0, 768, 2);   /* Q8_0, through the Q4_0 entry */
    check_act_quant(QTYPE_Q5_0, 768, 2);   /* Q8_0, through the Q5_0 entry */
    check_act_quant(QTYPE_Q4_1, 2048, 3);  /* Q8_1 (d, s, qs) */
    check_act_quant(QTYPE_Q5_1, 768, 2);   /* Q8_1, through the Q5_1 entry */
    check_act_quant(QTYPE_F16, 2048, 3);
    check_act_quant(QTYPE_BF16, 2048, 3);
    check_act_quant(QTYPE_F32, 2048, 3);
    check_act_quant(QTYPE_F16, 37, 3);     /* odd n: rows back to back */
    check_act_quant(QTYPE_BF16, 37, 3);
}

/* ==== matvec ==== */

/* Random but valid blocks: random bytes, then every f16 scale set to a
 * small positive half (so no inf/NaN), for the big head and the bench;
 * float types: random values in [-0.05, 0.05). */
static void random_blocks(int wtype, uint8_t *w, size_t nblocks)
{
    const int bb = qtype_get(wtype)->type_size;
    if (is_float_type(wtype)) {
        for (size_t i = 0; i < nblocks; i++) {
            const float v = frand() * 0.05f;
            const uint16_t h = wtype == QTYPE_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
            if (wtype == QTYPE_F32) memcpy(w + 4 * i, &v, 4);
            else memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < nblocks * bb; i += 8) {
        const uint64_t r = rng_next();
        memcpy(w + i, &r, i + 8 <= nblocks * bb ? 8 : nblocks * bb - i);
    }
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *p = w + b * bb;
        const uint16_t d = fp32_to_fp16(1e-3f * (1.0f + (float)(rng_next() % 100) / 100.0f));
        if (wtype == QTYPE_Q4_K || wtype == QTYPE_Q5_K || wtype == QTYPE_Q4_1 || wtype == QTYPE_Q5_1) {   /* d, dmin / m */
            memcpy(p, &d, 2);
            memcpy(p + 2, &d, 2);
        } else if (wtype == QTYPE_Q6_K) {
            memcpy(p + 208, &d, 2);
        } else {
            memcpy(p, &d, 2);
        }
    }
}

static double check_matvec(int wtype, int64_t rows, int64_t k, int real_quant)
{
    const qtype_info *qi = qtype_get(wtype);
    const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
    uint8_t *w = xmalloc(rb * rows);
    float *x = xmalloc(sizeof(float) * k);
    err e = {0};
    if (real_quant) {
        float *wf = xmalloc(sizeof(float) * k);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < k; i++) wf[i] = frand() * 0.05f;
            quant_quantize(wtype, wf, w + r * rb, k, &e);
        }
        free(wf);
    } else {
        random_blocks(wtype, w, (size_t)(k / qi->blck) * rows);
    }
    for (int64_t i = 0; i < k; i++) x[i] = frand() * 2.0f;

    quant_ops ops;
    CHECK(quant_ops_get(wtype, cpu_best_isa(), &ops, &e) == 0);
    quant_ops aops;
    CHECK(quant_ops_get(ops.dot_type, cpu_best_isa(), &aops, &e) == 0);
    const size_t ab = cuda_act_bytes(wtype, k);
    uint8_t *xq = xmalloc(ab);
    aops.act_quant(x, xq, k);
    float *ref = xmalloc(sizeof(float) * rows), *y = xmalloc(sizeof(float) * rows);
    for (int64_t r = 0; r < rows; r++) ref[r] = ops.dot(k, w + r * rb, xq);

    uint8_t *dw = dev_from(w, rb * rows);
    float *dx = dev_from(x, sizeof(float) * k);
    void *dxq = dev_alloc(ab);
    float *dy = dev_alloc(sizeof(float) * rows);
    CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows, &e) == 0);   /* NaN poison */
    CHECK_MSG(cuda_act_quant(g_cu, wtype, dx, dxq, k, 1, &e) == 0, "%s", e.msg);
    CHECK_MSG(cuda_matvec(g_cu, wtype, dw, rows, k, dxq, dy, &e) == 0, "%s", e.msg);
    CHECK_MSG(cuda_download(g_cu, y, dy, sizeof(float) * rows, &e) == 0, "%s", e.msg);
    const double nm = nmse(y, ref, rows);
    printf("  matvec %-4s %6lld x %-5lld %s: NMSE %.3g, max rel %.3g\n", qtype_name(wtype), (long long)rows,
           (long long)k, real_quant ? "quantized " : "random blk", nm, max_rel(y, ref, rows));
    CHECK_MSG(nm < 1e-10, "%s %lldx%lld: NMSE %.3g", qtype_name(wtype), (long long)rows, (long long)k, nm);
    if (wtype == QTYPE_Q8_0 && k % 256 == 0) {   /* split rows: the Q8_0 matvec's outputs bit for bit */
        float *ys = xmalloc(sizeof(float) * rows);
        uint8_t *dws = dev_from(w, rb * rows);
        CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows, &e) == 0);
        CHECK_MSG(cuda_repack_q8_0(g_cu, dws, rows, k, &e) == 0, "%s", e.msg);
        CHECK_MSG(cuda_matvec(g_cu, CUDA_Q8_0_SPLIT, dws, rows, k, dxq, dy, &e) == 0, "%s", e.msg);
        CHECK_MSG(cuda_download(g_cu, ys, dy, sizeof(float) * rows, &e) == 0, "%s", e.msg);
        const int same = memcmp(ys, y, sizeof(float) * rows) == 0;
        printf("  matvec q8_0 split rows %6lld x %-5lld: %s\n", (long long)rows, (long long)k,
               same ? "bit-identical to q8_0" : "DIFFERS");
        CHECK_MSG(same, "q8_0 split %lldx%lld differs from q8_0", (long long)rows, (long long)k);
        cuda_free(g_cu, dws);
        free(ys);
    }
    cuda_free(g_cu, dw); cuda_free(g_cu, dx); cuda_free(g_cu, dxq); cuda_free(g_cu, dy);
    free(w); free(x); free(xq); free(ref); free(y);
    return nm;
}

/* Every shape on both kernels: the direct one (the default) and the tile
 * one (cuda_matvec_force 1, the benchmark's comparison). */
TEST(test_matvec)
{
    static const int types[] = {QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0,
                                QTYPE_Q4_1, QTYPE_Q5_1, QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    for (int mode = 0; mode <= 1; mode++) {
        cuda_matvec_force(g_cu, mode);
        printf("  (%s kernel)\n", mode ? "tile" : "direct");
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            check_matvec(types[t], 768, 2048, 1);    /* expert gate/up */
            check_matvec(types[t], 2048, 768, 1);    /* expert down */
            check_matvec(types[t], 4096, 2048, 1);   /* attention q */
            check_matvec(types[t], 37, 2048, 1);     /* partial tile; 1-row tiles (short grid) */
            check_matvec(types[t], 5, 768, 1);       /* fewer rows than warps */
        }
        check_matvec(QTYPE_F32, 128, 2048, 1);       /* the MoE router */
        check_matvec(QTYPE_F32, 300, 64, 1);         /* 16 items a row: the direct kernel */
        check_matvec(QTYPE_F16, 300, 136, 1);        /* 17 items a row */
        check_matvec(QTYPE_F16, 301, 2048, 1);       /* 2-row tiles, the last one partial */
        check_matvec(QTYPE_Q4_0, 300, 256, 1);       /* 16 items a row: the direct kernel */
        check_matvec(QTYPE_Q8_0, 300, 256, 1);
        check_matvec(QTYPE_Q5_0, 300, 256, 1);       /* 16 items a row: the direct kernel */
        check_matvec(QTYPE_Q4_1, 300, 256, 1);
        check_matvec(QTYPE_Q5_1, 300, 256, 1);
        check_matvec(QTYPE_Q5_0, 301, 96, 1);        /* 6 items a row (direct kernel), odd rows */
        check_matvec(QTYPE_Q5_1, 2048, 2048, 0);     /* random blocks (random qh bits) */
        check_matvec(QTYPE_BF16, 2048, 2048, 0);
        check_matvec(QTYPE_Q6_K, 151936, 2048, 0);   /* the output head */
        check_matvec(QTYPE_Q4_K, 40, 8192, 1);       /* 32 blocks a row: coalesced loads (one row a warp) */
        check_matvec(QTYPE_Q4_K, 40, 8448, 1);       /* 33: past them, two passes of block loads */
    }
    cuda_matvec_force(g_cu, 0);
}

/* Batch with ids, per-item inputs, padded output rows. */
TEST(test_matvec_batch)
{
    static const int types[] = {QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0,
                                QTYPE_Q4_1, QTYPE_Q5_1, QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int wtype = types[t];
        const qtype_info *qi = qtype_get(wtype);
        const int64_t rows = 96, k = 768;
        const int nmat = 5, nb = 6;
        const int32_t ids[6] = {3, 0, 4, 3, 1, 2};
        const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
        const size_t ms = rb * rows;   /* a multiple of 16 for every type here */
        uint8_t *w = xmalloc(ms * nmat);
        float *wf = xmalloc(sizeof(float) * k);
        err e = {0};
        for (int64_t r = 0; r < rows * nmat; r++) {
            for (int64_t i = 0; i < k; i++) wf[i] = frand() * 0.05f;
            quant_quantize(wtype, wf, w + r * rb, k, &e);
        }
        const size_t ab = cuda_act_bytes(wtype, k);
        const size_t xs = (ab + 15) & ~(size_t)15;
        float *x = xmalloc(sizeof(float) * k * nb);
        for (int64_t i = 0; i < k * nb; i++) x[i] = frand();
        uint8_t *xq = xmalloc(xs * nb);
        quant_ops ops, aops;
        CHECK(quant_ops_get(wtype, cpu_best_isa(), &ops, &e) == 0);
        CHECK(quant_ops_get(ops.dot_type, cpu_best_isa(), &aops, &e) == 0);
        for (int b = 0; b < nb; b++) aops.act_quant(x + b * k, xq + b * xs, k);
        const size_t ys = rows + 5;
        float *ref = xmalloc(sizeof(float) * ys * nb), *y = xmalloc(sizeof(float) * ys * nb);
        for (int b = 0; b < nb; b++)
            for (int64_t r = 0; r < rows; r++) ref[b * ys + r] = ops.dot(k, w + ids[b] * ms + r * rb, xq + b * xs);

        uint8_t *dw = dev_from(w, ms * nmat);
        uint8_t *dxq = dev_from(xq, xs * nb);
        int32_t *dids = dev_from(ids, sizeof ids);
        float *dy = dev_alloc(sizeof(float) * ys * nb);
        CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * ys * nb, &e) == 0);
        cuda_matvec_args a = {
            .wtype = wtype, .w = dw, .w_stride = ms, .ids = dids, .rows = rows, .k = k, .n_batch = nb,
            .xq = dxq, .x_stride = xs, .y = dy, .y_stride = ys,
        };
        CHECK_MSG(cuda_matvec_batch(g_cu, &a, &e) == 0, "%s", e.msg);
        CHECK_MSG(cuda_download(g_cu, y, dy, sizeof(float) * ys * nb, &e) == 0, "%s", e.msg);
        double worst = 0;
        for (int b = 0; b < nb; b++) {
            const double nm = nmse(y + b * ys, ref + b * ys, rows);
            if (nm > worst) worst = nm;
            for (size_t r = rows; r < ys; r++) {   /* the padding is untouched (still NaN) */
                uint32_t u;
                memcpy(&u, &y[b * ys + r], 4);
                CHECK_MSG(u == 0xFFFFFFFFu, "batch %d row %zu written", b, r);
            }
        }
        printf("  batch  %-4s %d items (ids) of %lld x %lld: worst NMSE %.3g\n", qtype_name(wtype), nb,
               (long long)rows, (long long)k, worst);
        CHECK_MSG(worst < 1e-10, "%s batch NMSE %.3g", qtype_name(wtype), worst);

        /* add: the same launch with a residual is the plain result plus
         * it, bit for bit (also in place: add == y) */
        float *res = xmalloc(sizeof(float) * ys * nb), *y3 = xmalloc(sizeof(float) * ys * nb);
        for (size_t i = 0; i < ys * nb; i++) res[i] = frand();
        float *dres = dev_from(res, sizeof(float) * ys * nb);
        cuda_matvec_args aa = a;
        aa.y = dres;
        aa.add = dres;
        CHECK_MSG(cuda_matvec_batch(g_cu, &aa, &e) == 0, "%s", e.msg);
        CHECK(cuda_download(g_cu, y3, dres, sizeof(float) * ys * nb, &e) == 0);
        int bad = 0;
        for (int b = 0; b < nb; b++)
            for (int64_t r = 0; r < rows; r++) {
                const float want = y[b * ys + r] + res[b * ys + r];
                bad += memcmp(&want, &y3[b * ys + r], 4) != 0;
            }
        CHECK_MSG(bad == 0, "%s matvec + add: %d outputs differ from dot + add", qtype_name(wtype), bad);

        /* w2: a second stack (w2 = the same bytes shifted by one matrix,
         * so its matrix m is w's m + 1) in the same launch */
        float *dy2 = dev_alloc(sizeof(float) * ys * nb);
        cuda_matvec_args ap = a;
        int32_t ids2[6];
        for (int b = 0; b < nb; b++) ids2[b] = ids[b] < nmat - 1 ? ids[b] : 0;
        int32_t *dids2 = dev_from(ids2, sizeof ids2);
        ap.ids = dids2;
        ap.w2 = dw + ms;
        ap.y2 = dy2;
        CHECK_MSG(cuda_matvec_batch(g_cu, &ap, &e) == 0, "%s", e.msg);
        CHECK(cuda_download(g_cu, y, dy, sizeof(float) * ys * nb, &e) == 0);
        CHECK(cuda_download(g_cu, y3, dy2, sizeof(float) * ys * nb, &e) == 0);
        double worst2 = 0;
        for (int b = 0; b < nb; b++) {
            for (int64_t r = 0; r < rows; r++) {
                ref[b * ys + r] = ops.dot(k, w + ids2[b] * ms + r * rb, xq + b * xs);
                res[b * ys + r] = ops.dot(k, w + (ids2[b] + 1) * ms + r * rb, xq + b * xs);
            }
            const double n1 = nmse(y + b * ys, ref + b * ys, rows), n2 = nmse(y3 + b * ys, res + b * ys, rows);
            worst2 = n1 > worst2 ? n1 : worst2;
            worst2 = n2 > worst2 ? n2 : worst2;
        }
        CHECK_MSG(worst2 < 1e-10, "%s paired (w2) batch NMSE %.3g", qtype_name(wtype), worst2);
        cuda_free(g_cu, dres); cuda_free(g_cu, dy2); cuda_free(g_cu, dids2);
        free(res); free(y3);
        cuda_free(g_cu, dw); cuda_free(g_cu, dxq); cuda_free(g_cu, dids); cuda_free(g_cu, dy);
        free(w); free(wf); free(x); free(xq); free(ref); free(y);
    }
}

/* nmat random matrices of rows x k quantized to wtype (weights of +-0.05),
 * back to back at *ms bytes (the row bytes rounded up to 16) */
static uint8_t *quant_stack(int wtype, int64_t rows, int64_t k, int nmat, size_t *ms)
{
    const qtype_info *qi = qtype_get(wtype);
    const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
    *ms = (rb * rows + 15) & ~(size_t)15;
    uint8_t *w = xmalloc(*ms * nmat);
    float *wf = xmalloc(sizeof(float) * k);
    err e = {0};
    for (int mi = 0; mi < nmat; mi++)
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < k; i++) wf[i] = frand() * 0.05f;
            CHECK_MSG(quant_quantize(wtype, wf, w + mi * *ms + r * rb, k, &e) == 0, "%s", e.msg);
        }
    free(wf);
    return w;
}

/* cuda_matvec_pair: two matrices of two types in one launch give each
 * matrix's own cuda_matvec outputs bit for bit (NaN-poisoned outputs, so a
 * row left unwritten fails): the pairs a Q4_K_M / Q5_K_M file's q+k and
 * v take, rows that end mid-CTA, k = 2048 (the first matrix on the
 * coalesced path) and k = 8448 (33 blocks a row: not), and the tile kernel
 * forced (two launches then). A pair without a kernel is refused. */
TEST(test_matvec_pair)
{
    static const int pairs[][2] = {{QTYPE_Q4_K, QTYPE_Q6_K}, {QTYPE_Q5_K, QTYPE_Q6_K}};
    static const int64_t shapes[][3] = {{2048, 4608, 512}, {2048, 300, 70}, {8448, 40, 24}};   /* k, rows a, rows b */
    err e = {0};
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int ta = pairs[pi][0], tb = pairs[pi][1];
            const int64_t k = shapes[si][0], ra = shapes[si][1], rbw = shapes[si][2];
            CHECK(cuda_matvec_pair_ok(ta, tb));
            size_t msa, msb;
            uint8_t *wa = quant_stack(ta, ra, k, 1, &msa), *wb = quant_stack(tb, rbw, k, 1, &msb);
            float *x = xmalloc(sizeof(float) * k);
            for (int64_t i = 0; i < k; i++) x[i] = frand() * 2.0f;
            const size_t ab = cuda_act_bytes(ta, k);
            CHECK(ab == cuda_act_bytes(tb, k));
            uint8_t *dwa = dev_from(wa, msa), *dwb = dev_from(wb, msb), *dq = dev_alloc(ab);
            float *dx = dev_from(x, sizeof(float) * k), *dy = dev_alloc(sizeof(float) * (ra + rbw));
            float *ref = xmalloc(sizeof(float) * (ra + rbw)), *got = xmalloc(sizeof(float) * (ra + rbw));
            CHECK_MSG(cuda_act_quant(g_cu, ta, dx, dq, k, 1, &e) == 0, "%s", e.msg);
            for (int force = 0; force < 2; force++) {
                cuda_matvec_force(g_cu, force ? 1 : 0);
                CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * (ra + rbw), &e) == 0);
                CHECK_MSG(cuda_matvec(g_cu, ta, dwa, ra, k, dq, dy, &e) == 0, "%s", e.msg);
                CHECK_MSG(cuda_matvec(g_cu, tb, dwb, rbw, k, dq, dy + ra, &e) == 0, "%s", e.msg);
                CHECK(cuda_download(g_cu, ref, dy, sizeof(float) * (ra + rbw), &e) == 0);
                CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * (ra + rbw), &e) == 0);
                const cuda_matvec_seg sg[2] = {{ta, dwa, ra, dy}, {tb, dwb, rbw, dy + ra}};
                CHECK_MSG(cuda_matvec_pair(g_cu, sg, k, dq, &e) == 0, "%s", e.msg);
                CHECK(cuda_download(g_cu, got, dy, sizeof(float) * (ra + rbw), &e) == 0);
                int bad = 0, nan = 0;
                for (int64_t i = 0; i < ra + rbw; i++) {
                    bad += memcmp(&ref[i], &got[i], 4) != 0;
                    nan += got[i] != got[i];
                }
                CHECK_MSG(bad == 0 && nan == 0, "pair %s %lld + %s %lld, k=%lld (%s kernel): %d outputs differ, %d NaN",
                          qtype_name(ta), (long long)ra, qtype_name(tb), (long long)rbw, (long long)k,
                          force ? "tile" : "direct", bad, nan);
            }
            cuda_matvec_force(g_cu, 0);
            printf("  matvec pair %s %lld + %s %lld rows, k=%lld: bit-identical to two launches (direct, tile)\n",
                   qtype_name(ta), (long long)ra, qtype_name(tb), (long long)rbw, (long long)k);
            cuda_free(g_cu, dwa); cuda_free(g_cu, dwb); cuda_free(g_cu, dq); cuda_free(g_cu, dx); cuda_free(g_cu, dy);
            free(wa); free(wb); free(x); free(ref); free(got);
        }
    CHECK(!cuda_matvec_pair_ok(QTYPE_Q6_K, QTYPE_Q4_K) && !cuda_matvec_pair_ok(QTYPE_Q4_K, QTYPE_Q8_0));
    const cuda_matvec_seg no[2] = {{QTYPE_Q4_K, NULL, 8, NULL}, {QTYPE_Q8_0, NULL, 8, NULL}};
    CHECK(cuda_matvec_pair(g_cu, no, 256, NULL, &e) == ERR_UNSUPPORTED);
    CHECK_MSG(strstr(e.msg, "q8_0") != NULL, "%s", e.msg);
    err_clear(&e);
    const cuda_matvec_seg bad_k[2] = {{QTYPE_Q4_K, NULL, 8, NULL}, {QTYPE_Q6_K, NULL, 8, NULL}};
    CHECK(cuda_matvec_pair(g_cu, bad_k, 100, NULL, &e) == ERR_USAGE);
    err_clear(&e);
}

/* Q6_K rows copied by 16-byte spans (mvd_cos: a warp's rows whole in
 * one pass, weights 16-aligned) give bit for bit what the 2-byte-aligned
 * global loads give: the same matrices at w and at w + 2 (which cannot
 * take the copies), batches with ids and a second stack (w2, as gate and
 * up), shapes of 8, 24 (an expert's down at k = 768) and 64 (k = 2048)
 * items a row, rows ending mid-CTA, one whose bytes are not a multiple
 * of 16 (37 x 630: no copies) and one too long for a pass (k = 8448): the
 * global path either way for the last two. */
TEST(test_matvec_q6k_span)
{
    static const int64_t shapes[][2] = {{2048, 768}, {512, 2048}, {40, 2048}, {96, 256}, {37, 768}, {48, 8448}};   /* rows, k */
    const int nmat = 4, nb = 3;
    const int32_t ids[3] = {2, 0, 1};   /* w2 (= w + one matrix) takes matrix id + 1 <= 3 */
    err e = {0};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], k = shapes[si][1];
        size_t ms;
        uint8_t *w = quant_stack(QTYPE_Q6_K, rows, k, nmat, &ms);
        float *x = xmalloc(sizeof(float) * k * nb);
        for (int64_t i = 0; i < k * nb; i++) x[i] = frand() * 2.0f;
        const size_t ab = cuda_act_bytes(QTYPE_Q6_K, k), ny = (size_t)rows * nb;
        uint8_t *dal = dev_alloc(ms * nmat + 16), *dun = dev_alloc(ms * nmat + 16), *dq = dev_alloc(ab * nb);
        CHECK(cuda_upload(g_cu, dal, w, ms * nmat, &e) == 0);
        CHECK(cuda_upload(g_cu, dun + 2, w, ms * nmat, &e) == 0);   /* 2 mod 16: no span copies */
        float *dx = dev_from(x, sizeof(float) * k * nb);
        int32_t *dids = dev_from(ids, sizeof ids);
        float *dy = dev_alloc(sizeof(float) * ny * 2);
        float *y[2] = {xmalloc(sizeof(float) * ny * 2), xmalloc(sizeof(float) * ny * 2)};
        CHECK_MSG(cuda_act_quant(g_cu, QTYPE_Q6_K, dx, dq, k, nb, &e) == 0, "%s", e.msg);
        for (int mode = 0; mode < 3; mode++) {   /* one matrix; a batch with ids; the batch and w2 */
            for (int a = 0; a < 2; a++) {
                const uint8_t *dw = a ? dun + 2 : dal;
                cuda_matvec_args ar = {
                    .wtype = QTYPE_Q6_K, .w = dw, .w_stride = ms, .ids = mode ? dids : NULL, .rows = rows, .k = k,
                    .n_batch = mode ? nb : 1, .xq = dq, .x_stride = mode ? ab : 0, .y = dy, .y_stride = (size_t)rows,
                    .w2 = mode == 2 ? dw + ms : NULL, .y2 = mode == 2 ? dy + ny : NULL,
                };
                CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * ny * 2, &e) == 0);
                CHECK_MSG(cuda_matvec_batch(g_cu, &ar, &e) == 0, "%s", e.msg);
                CHECK(cuda_download(g_cu, y[a], dy, sizeof(float) * ny * 2, &e) == 0);
            }
            const size_t n = mode == 0 ? (size_t)rows : mode == 1 ? ny : 2 * ny;
            int bad = 0, nan = 0;
            for (size_t i = 0; i < n; i++) {
                bad += memcmp(&y[0][i], &y[1][i], 4) != 0;
                nan += y[0][i] != y[0][i];
            }
            CHECK_MSG(bad == 0 && nan == 0, "q6_K %lldx%lld mode %d: %d of %zu outputs differ between 16- and 2-aligned "
                      "weights, %d NaN", (long long)rows, (long long)k, mode, bad, n, nan);
        }
        printf("  q6_K spans %5lld x %-5lld: 16-aligned weights bit-identical to 2-aligned (matrix, ids, w2)\n",
               (long long)rows, (long long)k);
        cuda_free(g_cu, dal); cuda_free(g_cu, dun); cuda_free(g_cu, dq); cuda_free(g_cu, dx); cuda_free(g_cu, dids);
        cuda_free(g_cu, dy);
        free(w); free(x); free(y[0]); free(y[1]);
    }
}

/* xquant: the matvec quantizing its f32 rows itself (CUDA_XQ_F32) or
 * swiglu(g, u) (CUDA_XQ_SWIGLU) gives bit for bit what cuda_act_quant (or
 * cuda_act_quant_swiglu) then the plain matvec give (and norming one,
 * CUDA_XQ_NORM, what cuda_rmsnorm_quant then the matvec give): every type with a
 * Q8_K or Q8_0 dot type, both kernels (direct and tile), rows with an
 * all-zero block, a max tie of opposite signs, several blocks a warp
 * (Q8_K) and more blocks than one pass of the CTA (Q8_0). */
TEST(test_matvec_xquant)
{
    static const int types[] = {QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0};
    static const int64_t ks[] = {768, 4352};
    const int nmat = 5, nb = 6;
    const int32_t ids[6] = {3, 0, 4, 3, 1, 2};
    err e = {0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ki = 0; ki < 2; ki++) {
            const int wtype = types[t];
            const int64_t rows = 40, k = ks[ki];
            size_t ms;
            uint8_t *w = quant_stack(wtype, rows, k, nmat, &ms);
            float *g = xmalloc(sizeof(float) * k * nb), *u = xmalloc(sizeof(float) * k * nb);
            for (int64_t i = 0; i < k * nb; i++) { g[i] = frand() * 6.0f; u[i] = frand() * 2.0f; }
            for (int i = 0; i < 256; i++) { g[k + i] = 0.f; u[k + i] = 0.f; }   /* row 1: an all-zero block */
            g[2 * k + 5] = 9.f; g[2 * k + 9] = -9.f;                            /* row 2: a tie, + first */
            u[2 * k + 5] = 1.f; u[2 * k + 9] = -1.f;
            g[3 * k + 40] = -9.f; g[3 * k + 70] = 9.f;                          /* row 3: a tie, - first */
            const size_t ab = cuda_act_bytes(wtype, k);
            float *dg = dev_from(g, sizeof(float) * k * nb), *du = dev_from(u, sizeof(float) * k * nb);
            uint8_t *dw = dev_from(w, ms * nmat), *dq = dev_alloc(ab * nb);
            int32_t *dids = dev_from(ids, sizeof ids);
            float *dy = dev_alloc(sizeof(float) * rows * nb);
            float *y1 = xmalloc(sizeof(float) * rows * nb), *y2 = xmalloc(sizeof(float) * rows * nb);
            for (int mode = 0; mode < 2; mode++)
                for (int force = 0; force < 2; force++) {
                    cuda_matvec_force(g_cu, force ? 1 : 0);
                    const int swi = mode == 1;
                    if (swi) CHECK_MSG(cuda_act_quant_swiglu(g_cu, wtype, dg, du, dq, k, nb, &e) == 0, "%s", e.msg);
                    else CHECK_MSG(cuda_act_quant(g_cu, wtype, dg, dq, k, nb, &e) == 0, "%s", e.msg);
                    cuda_matvec_args a = {
                        .wtype = wtype, .w = dw, .w_stride = ms, .ids = dids, .rows = rows, .k = k, .n_batch = nb,
                        .xq = dq, .x_stride = ab, .y = dy, .y_stride = (size_t)rows,
                    };
                    CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows * nb, &e) == 0);
                    CHECK_MSG(cuda_matvec_batch(g_cu, &a, &e) == 0, "%s", e.msg);
                    CHECK(cuda_download(g_cu, y1, dy, sizeof(float) * rows * nb, &e) == 0);
                    a.xq = dg;
                    a.x_stride = sizeof(float) * (size_t)k;
                    a.xquant = swi ? CUDA_XQ_SWIGLU : CUDA_XQ_F32;
                    a.xu = swi ? du : NULL;
                    CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows * nb, &e) == 0);
                    CHECK_MSG(cuda_matvec_batch(g_cu, &a, &e) == 0, "%s", e.msg);
                    CHECK(cuda_download(g_cu, y2, dy, sizeof(float) * rows * nb, &e) == 0);
                    int bad = 0;
                    for (int64_t i = 0; i < rows * nb; i++) bad += memcmp(&y1[i], &y2[i], 4) != 0;
                    CHECK_MSG(bad == 0, "%s k=%lld %s (%s kernel): %d of %lld outputs differ from quantize + matvec",
                              qtype_name(wtype), (long long)k, swi ? "swiglu" : "f32", force ? "tile" : "direct", bad,
                              (long long)(rows * nb));
                }
            cuda_matvec_force(g_cu, 0);
            printf("  xquant %-4s k=%lld: f32 and swiglu rows, direct and tile kernels: checked\n", qtype_name(wtype),
                   (long long)k);
            cuda_free(g_cu, dg); cuda_free(g_cu, du); cuda_free(g_cu, dw); cuda_free(g_cu, dq);
            cuda_free(g_cu, dids); cuda_free(g_cu, dy);
            free(w); free(g); free(u); free(y1); free(y2);
        }
    /* CUDA_XQ_NORM: the matvec norming (and quantizing) one shared row
     * itself, after or before its wait, is bit for bit cuda_rmsnorm_quant
     * (F32 weights: cuda_rmsnorm) then the plain matvec; the tile kernel
     * forced, the launch still takes the direct one */
    static const int ntypes[] = {QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_F32};
    static const int64_t nks[] = {2048, 768};
    for (size_t t = 0; t < sizeof ntypes / sizeof ntypes[0]; t++)
        for (size_t ki = 0; ki < 2; ki++) {
            const int wtype = ntypes[t];
            const int64_t rows = 40, k = nks[ki];
            size_t ms;
            uint8_t *w = quant_stack(wtype, rows, k, nmat, &ms);
            float *x = xmalloc(sizeof(float) * k), *nw = xmalloc(sizeof(float) * k);
            for (int64_t i = 0; i < k; i++) { x[i] = frand() * 3.0f; nw[i] = 0.5f + frand(); }
            const size_t ab = wtype == QTYPE_F32 ? sizeof(float) * k : cuda_act_bytes(wtype, k);
            float *dx = dev_from(x, sizeof(float) * k), *dnw = dev_from(nw, sizeof(float) * k);
            float *dxn = dev_alloc(sizeof(float) * k);
            uint8_t *dw = dev_from(w, ms * nmat), *dq = dev_alloc(ab);
            int32_t *dids = dev_from(ids, sizeof ids);
            float *dy = dev_alloc(sizeof(float) * rows * nb);
            float *y1 = xmalloc(sizeof(float) * rows * nb), *y2 = xmalloc(sizeof(float) * rows * nb);
            if (wtype == QTYPE_F32) CHECK_MSG(cuda_rmsnorm(g_cu, dxn, dx, dnw, (int)k, 1, 1e-6f, &e) == 0, "%s", e.msg);
            else CHECK_MSG(cuda_rmsnorm_quant(g_cu, wtype, dxn, dq, dx, dnw, (int)k, 1e-6f, &e) == 0, "%s", e.msg);
            cuda_matvec_args a = {
                .wtype = wtype, .w = dw, .w_stride = ms, .ids = dids, .rows = rows, .k = k, .n_batch = nb,
                .xq = wtype == QTYPE_F32 ? (const void *)dxn : (const void *)dq, .y = dy, .y_stride = (size_t)rows,
            };
            CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows * nb, &e) == 0);
            CHECK_MSG(cuda_matvec_batch(g_cu, &a, &e) == 0, "%s", e.msg);
            CHECK(cuda_download(g_cu, y1, dy, sizeof(float) * rows * nb, &e) == 0);
            if (wtype != QTYPE_F32) {   /* the plain row unpacked before the wait (x_early) */
                cuda_matvec_args ae = a;
                ae.x_early = 1;
                CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows * nb, &e) == 0);
                CHECK_MSG(cuda_matvec_batch(g_cu, &ae, &e) == 0, "%s", e.msg);
                CHECK(cuda_download(g_cu, y2, dy, sizeof(float) * rows * nb, &e) == 0);
                CHECK_MSG(memcmp(y1, y2, sizeof(float) * rows * nb) == 0, "%s k=%lld: x_early unpack differs",
                          qtype_name(wtype), (long long)k);
            }
            /* nq_out: the normed row's quantization for another type (F32: Q4_K's) */
            const int qt2 = wtype == QTYPE_F32 ? QTYPE_Q4_K : wtype;
            const size_t ab2 = cuda_act_bytes(qt2, k);
            uint8_t *dqr = dev_alloc(ab2), *dq2 = dev_alloc(ab2);
            uint8_t *hq1 = xmalloc(ab2), *hq2 = xmalloc(ab2);
            CHECK_MSG(cuda_rmsnorm_quant(g_cu, qt2, dxn, dqr, dx, dnw, (int)k, 1e-6f, &e) == 0, "%s", e.msg);
            CHECK(cuda_download(g_cu, hq1, dqr, ab2, &e) == 0);
            for (int early = 0; early < 2; early++)
                for (int force = 0; force < 2; force++) {
                    cuda_matvec_force(g_cu, force ? 1 : 0);
                    cuda_matvec_args an = a;
                    an.xq = dx;
                    an.xquant = CUDA_XQ_NORM;
                    an.xnw = dnw;
                    an.eps = 1e-6f;
                    an.x_early = early;
                    an.nq_out = force ? dq2 : NULL;
                    an.nq_type = qt2;
                    CHECK(cuda_memset(g_cu, dq2, 0xA5, ab2, &e) == 0);
                    CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * rows * nb, &e) == 0);
                    CHECK_MSG(cuda_matvec_batch(g_cu, &an, &e) == 0, "%s", e.msg);
                    CHECK(cuda_download(g_cu, y2, dy, sizeof(float) * rows * nb, &e) == 0);
                    if (force) {
                        CHECK(cuda_download(g_cu, hq2, dq2, ab2, &e) == 0);
                        CHECK_MSG(memcmp(hq1, hq2, ab2) == 0, "%s k=%lld: nq_out (%s) differs from cuda_rmsnorm_quant's",
                                  qtype_name(wtype), (long long)k, qtype_name(qt2));
                    }
                    int bad = 0;
                    for (int64_t i = 0; i < rows * nb; i++) bad += memcmp(&y1[i], &y2[i], 4) != 0;
                    CHECK_MSG(bad == 0, "%s k=%lld norm (early %d, force %d): %d of %lld outputs differ from norm + matvec",
                              qtype_name(wtype), (long long)k, early, force, bad, (long long)(rows * nb));
                }
            cuda_matvec_force(g_cu, 0);
            printf("  xquant norm %-4s k=%lld: after and before the wait, its %s quantization: checked\n",
                   qtype_name(wtype), (long long)k, qtype_name(qt2));
            cuda_free(g_cu, dqr); cuda_free(g_cu, dq2);
            free(hq1); free(hq2);
            cuda_free(g_cu, dx); cuda_free(g_cu, dnw); cuda_free(g_cu, dxn); cuda_free(g_cu, dw); cuda_free(g_cu, dq);
            cuda_free(g_cu, dids); cuda_free(g_cu, dy);
            free(w); free(x); free(nw); free(y1); free(y2);
        }

    /* refusals: a float dot type, swiglu without u, a misaligned row */
    float *dx = dev_alloc(sizeof(float) * 256 * 2);
    float *dy = dev_alloc(sizeof(float) * 16);
    uint8_t *dw = dev_alloc(4096);
    cuda_matvec_args a = {
        .wtype = QTYPE_F32, .w = dw, .rows = 4, .k = 256, .n_batch = 1, .xq = dx, .y = dy, .xquant = CUDA_XQ_F32,
    };
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.wtype = QTYPE_Q4_K;
    a.xquant = CUDA_XQ_SWIGLU;
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.xquant = CUDA_XQ_F32;
    a.xq = dx + 1;
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.xq = dx;
    a.xquant = 4;
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.xquant = CUDA_XQ_NORM;   /* no norm weights */
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.xnw = dx;
    a.x_stride = 1024;   /* a norm takes one shared row */
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.wtype = QTYPE_F16;
    a.x_stride = 0;
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    CHECK(cuda_matvec_xquant_ok(QTYPE_Q4_K) && cuda_matvec_xquant_ok(CUDA_Q8_0_SPLIT) &&
          !cuda_matvec_xquant_ok(QTYPE_Q4_1) && !cuda_matvec_xquant_ok(QTYPE_F16) && !cuda_matvec_xquant_ok(QTYPE_F32));
    CHECK(cuda_matvec_xnorm_ok(QTYPE_F32) && cuda_matvec_xnorm_ok(QTYPE_Q6_K) && !cuda_matvec_xnorm_ok(QTYPE_BF16));
    a.wtype = QTYPE_Q4_K;
    a.xquant = 0;
    a.nq_out = dw;   /* nq_out without a norm */
    a.nq_type = QTYPE_Q4_K;
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    a.xquant = CUDA_XQ_NORM;
    a.nq_type = QTYPE_Q4_1;   /* a Q8_1 dot type */
    CHECK(cuda_matvec_batch(g_cu, &a, &e) == ERR_USAGE);
    cuda_free(g_cu, dx); cuda_free(g_cu, dy); cuda_free(g_cu, dw);
}

/* Grouped matmul: every output bit-identical to the matvec of the same
 * matrix and activation row; outputs not named by an item untouched. */
TEST(test_matmul)
{
    static const int types[] = {QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q5_0,
                                QTYPE_Q4_1, QTYPE_Q5_1, QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    /* k = 4096, 1536 and 512: the tensor-core kernel's 16, 8 (two lanes
     * without a block) and 2 lanes a row (cuda_mmq.cu), rows not a
     * multiple of its 64 */
    static const int64_t shapes[][2] = {{96, 768}, {512, 2048}, {2048, 768}, {37, 256}, {160, 4096}, {70, 1536},
                                        {64, 512}};
    enum { NMAT = 5, NX = 13, NIT = 6 };
    /* item: matrix, rows (ends at -1) */
    static const int32_t iid[NIT] = {3, 0, 4, 3, 1, 2};
    static const int32_t irow[NIT][CUDA_MM_NB] = {
        {0, 5, 7, 12, 1, 2, 3, 4}, {6, -1, -1, -1, -1, -1, -1, -1}, {11, 10, 9, -1, -1, -1, -1, -1},
        {8, 9, -1, -1, -1, -1, -1, -1}, {1, 3, 5, 7, 9, 11, -1, -1}, {12, 0, 4, 6, 2, 8, 10, -1},
    };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const int wtype = types[t];
            const qtype_info *qi = qtype_get(wtype);
            const int64_t rows = shapes[sh][0], k = shapes[sh][1];
            if (k % qi->blck) continue;
            const size_t rb = (size_t)(k / qi->blck) * qi->type_size;
            const size_t ms = (rb * rows + 15) & ~(size_t)15;
            uint8_t *w = xmalloc(ms * NMAT);
            float *wf = xmalloc(sizeof(float) * k);
            err e = {0};
            for (int m = 0; m < NMAT; m++)
                for (int64_t r = 0; r < rows; r++) {
                    for (int64_t i = 0; i < k; i++) wf[i] = frand() * 0.05f;
                    quant_quantize(wtype, wf, w + m * ms + r * rb, k, &e);
                }
            const size_t ab = cuda_act_bytes(wtype, k);
            const size_t xs = (ab + 15) & ~(size_t)15;
            float *x = xmalloc(sizeof(float) * k * NX);
            for (int64_t i = 0; i < k * NX; i++) x[i] = frand();
            uint8_t *dw = dev_from(w, ms * NMAT);
            float *dx = dev_from(x, sizeof(float) * k * NX);
            uint8_t *dxq = dev_alloc(xs * NX);
            for (int j = 0; j < NX; j++)
                CHECK_MSG(cuda_act_quant(g_cu, wtype, dx + j * k, dxq + j * xs, k, 1, &e) == 0, "%s", e.msg);
            /* outputs: item b, slot j at (b * CUDA_MM_NB + j) * ys; one spare row between */
            const size_t ys = (size_t)rows + 3, ny = ys * NIT * CUDA_MM_NB;
            int64_t yoff[NIT * CUDA_MM_NB];
            for (int i = 0; i < NIT * CUDA_MM_NB; i++) yoff[i] = (int64_t)i * (int64_t)ys;
            int32_t *dids = dev_from(iid, sizeof iid);
            int32_t *drow = dev_from(irow, sizeof irow);
            int64_t *doff = dev_from(yoff, sizeof yoff);
            float *dy = dev_alloc(sizeof(float) * ny), *dr = dev_alloc(sizeof(float) * rows);
            CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * ny, &e) == 0);
            cuda_matmul_args a = {
                .wtype = wtype, .w = dw, .w_stride = ms, .ids = dids, .rows = rows, .k = k, .n_items = NIT,
                .xq = dxq, .x_stride = xs, .xrow = drow, .yoff = doff, .y = dy,
            };
            CHECK_MSG(cuda_matmul(g_cu, &a, &e) == 0, "%s", e.msg);
            float *y = xmalloc(sizeof(float) * ny), *ref = xmalloc(sizeof(float) * rows);
            CHECK(cuda_download(g_cu, y, dy, sizeof(float) * ny, &e) == 0);
            int bad = 0, touched = 0;
            for (int b = 0; b < NIT; b++)
                for (int j = 0; j < CUDA_MM_NB; j++) {
                    const float *yo = y + (size_t)(b * CUDA_MM_NB + j) * ys;
                    if (irow[b][j] < 0) {   /* not an output: untouched */
                        for (int64_t r = 0; r < rows; r++) { uint32_t u; memcpy(&u, yo + r, 4); touched += u != 0xFFFFFFFFu; }
                        continue;
                    }
                    cuda_matvec_args mv = {
                        .wtype = wtype, .w = dw + (size_t)iid[b] * ms, .rows = rows, .k = k, .n_batch = 1,
                        .xq = dxq + (size_t)irow[b][j] * xs, .y = dr,
                    };
                    CHECK_MSG(cuda_matvec_batch(g_cu, &mv, &e) == 0, "%s", e.msg);
                    CHECK(cuda_download(g_cu, ref, dr, sizeof(float) * rows, &e) == 0);
                    bad += memcmp(yo, ref, sizeof(float) * rows) != 0;
                    for (int64_t r = rows; r < (int64_t)ys; r++) { uint32_t u; memcpy(&u, yo + r, 4); touched += u != 0xFFFFFFFFu; }
                }
            printf("  matmul %-4s %d items of %lld x %lld (1-8 rows each): %s\n", qtype_name(wtype), NIT,
                   (long long)rows, (long long)k, bad || touched ? "DIFFERS" : "bit-identical to the matvec");
            CHECK_MSG(bad == 0 && touched == 0, "%s matmul %lldx%lld: %d outputs differ from the matvec, %d stray writes",
                      qtype_name(wtype), (long long)rows, (long long)k, bad, touched);
            if (wtype == QTYPE_Q8_0 && k % 256 == 0) {   /* split rows (a stack of whole rows: ms = rb * rows) */
                uint8_t *dws = dev_from(w, ms * NMAT);
                float *ys = xmalloc(sizeof(float) * ny);
                CHECK_MSG(cuda_repack_q8_0(g_cu, dws, rows * NMAT, k, &e) == 0, "%s", e.msg);
                CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * ny, &e) == 0);
                a.wtype = CUDA_Q8_0_SPLIT;
                a.w = dws;
                CHECK_MSG(cuda_matmul(g_cu, &a, &e) == 0, "%s", e.msg);
                CHECK(cuda_download(g_cu, ys, dy, sizeof(float) * ny, &e) == 0);
                const int same = memcmp(ys, y, sizeof(float) * ny) == 0;
                printf("  matmul q8_0 split rows %lld x %lld: %s\n", (long long)rows, (long long)k,
                       same ? "bit-identical to q8_0" : "DIFFERS");
                CHECK_MSG(same, "q8_0 split matmul %lldx%lld differs from q8_0", (long long)rows, (long long)k);
                cuda_free(g_cu, dws);
                free(ys);
            }
            cuda_free(g_cu, dw); cuda_free(g_cu, dx); cuda_free(g_cu, dxq); cuda_free(g_cu, dids);
            cuda_free(g_cu, drow); cuda_free(g_cu, doff); cuda_free(g_cu, dy); cuda_free(g_cu, dr);
            free(w); free(wf); free(x); free(y); free(ref);
        }
}

/* ==== float ops ==== */

TEST(test_rmsnorm)
{
    static const int shapes[2][2] = {{2048, 3}, {128, 32}};
    for (int s = 0; s < 2; s++) {
        const int n = shapes[s][0], rows = shapes[s][1];
        const size_t nn = (size_t)n * rows;
        float *x = xmalloc(sizeof(float) * nn), *w = xmalloc(sizeof(float) * n);
        float *ref = xmalloc(sizeof(float) * nn), *y = xmalloc(sizeof(float) * nn);
        for (size_t i = 0; i < nn; i++) x[i] = frand() * 4.0f;
        for (int i = 0; i < n; i++) w[i] = 0.5f + frand();
        for (int r = 0; r < rows; r++) ops_rmsnorm(ref + (size_t)r * n, x + (size_t)r * n, w, n, 1e-6f);
        float *dx = dev_from(x, sizeof(float) * nn), *dw = dev_from(w, sizeof(float) * n);
        float *dy = dev_alloc(sizeof(float) * nn);
        err e = {0};
        CHECK_MSG(cuda_rmsnorm(g_cu, dy, dx, dw, n, rows, 1e-6f, &e) == 0, "%s", e.msg);
        CHECK(cuda_download(g_cu, y, dy, sizeof(float) * nn, &e) == 0);
        const double m1 = max_rel(y, ref, nn);
        CHECK_MSG(m1 <= 1e-6, "rmsnorm n=%d max rel %.3g", n, m1);
        CHECK_MSG(cuda_rmsnorm(g_cu, dx, dx, dw, n, rows, 1e-6f, &e) == 0, "%s", e.msg);   /* in place */
        CHECK(cuda_download(g_cu, y, dx, sizeof(float) * nn, &e) == 0);
        const double m2 = max_rel(y, ref, nn);
        CHECK_MSG(m2 <= 1e-6, "rmsnorm in place n=%d max rel %.3g", n, m2);
        /* the fused norm + quantization == cuda_rmsnorm then cuda_act_quant,
         * byte for byte (y and xq), per Q8 activation format */
        static const int qt[] = {QTYPE_Q4_K, QTYPE_Q8_0, QTYPE_Q4_1};
        for (size_t t = 0; s == 0 && t < sizeof qt / sizeof qt[0]; t++) {
            const size_t ab = cuda_act_bytes(qt[t], n);
            uint8_t *q1 = xmalloc(ab), *q2 = xmalloc(ab);
            float *y2 = xmalloc(sizeof(float) * n);
            void *dq = dev_alloc(ab);
            float *dx0 = dev_from(x, sizeof(float) * n);
            CHECK(cuda_rmsnorm(g_cu, dy, dx0, dw, n, 1, 1e-6f, &e) == 0);
            CHECK(cuda_act_quant(g_cu, qt[t], dy, dq, n, 1, &e) == 0);
            CHECK(cuda_download(g_cu, y, dy, sizeof(float) * n, &e) == 0);
            CHECK(cuda_download(g_cu, q1, dq, ab, &e) == 0);
            CHECK(cuda_memset(g_cu, dq, 0, ab, &e) == 0);
            CHECK_MSG(cuda_rmsnorm_quant(g_cu, qt[t], dx0, dq, dx0, dw, n, 1e-6f, &e) == 0, "%s", e.msg);   /* in place */
            CHECK(cuda_download(g_cu, y2, dx0, sizeof(float) * n, &e) == 0);
            CHECK(cuda_download(g_cu, q2, dq, ab, &e) == 0);
            const int same = memcmp(y, y2, sizeof(float) * n) == 0 && memcmp(q1, q2, ab) == 0;
            CHECK_MSG(same, "rmsnorm_quant %s differs from rmsnorm then act_quant", qtype_name(qt[t]));
            printf("  rmsnorm_quant %s n=%d: %s\n", qtype_name(qt[t]), n, same ? "bit-identical" : "DIFFERS");
            cuda_free(g_cu, dq); cuda_free(g_cu, dx0);
            free(q1); free(q2); free(y2);
        }
        CHECK(cuda_rmsnorm_quant(g_cu, QTYPE_F32, dy, dy, dx, dw, n, 1e-6f, &e) == ERR_UNSUPPORTED);
        /* rows longer than the shared-memory stage: refused before any launch */
        CHECK(cuda_rmsnorm_quant(g_cu, QTYPE_Q8_0, dy, dy, dx, dw, CUDA_RMSQ_MAXN + 32, 1e-6f, &e) ==
              ERR_UNSUPPORTED);
        printf("  rmsnorm n=%d rows=%d: max rel %.3g (in place %.3g)\n", n, rows, m1, m2);
        cuda_free(g_cu, dx); cuda_free(g_cu, dw); cuda_free(g_cu, dy);
        free(x); free(w); free(ref); free(y);
    }
}

/* The fused norm + quantization against the two calls, byte for byte, for
 * Q8_0 / Q8_1 rows whose block count is not a multiple of the 32 blocks a
 * CTA quantizes a round (four a warp), and a Q8_K row. */
TEST(test_rmsnorm_quant_shapes)
{
    static const int ns[] = { 736, 4192, 8192, 4096 };
    static const int qt[] = { QTYPE_Q8_0, QTYPE_Q4_1, QTYPE_Q4_K };
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const int n = ns[i];
        float *x = xmalloc(sizeof(float) * n), *w = xmalloc(sizeof(float) * n);
        float *y1 = xmalloc(sizeof(float) * n), *y2 = xmalloc(sizeof(float) * n);
        for (int j = 0; j < n; j++) { x[j] = frand() * 4.0f; w[j] = 0.5f + frand(); }
        for (int j = 0; j < 32; j++) x[j] = 0.f;   /* an all-zero block */
        float *dx = dev_from(x, sizeof(float) * n), *dw = dev_from(w, sizeof(float) * n);
        float *dy = dev_alloc(sizeof(float) * n);
        err e = {0};
        for (size_t t = 0; t < sizeof qt / sizeof qt[0]; t++) {
            const size_t ab = cuda_act_bytes(qt[t], n);
            if (!ab) continue;   /* Q8_K needs n % 256 == 0 */
            uint8_t *q1 = xmalloc(ab), *q2 = xmalloc(ab);
            void *dq = dev_alloc(ab);
            CHECK(cuda_rmsnorm(g_cu, dy, dx, dw, n, 1, 1e-6f, &e) == 0);
            CHECK(cuda_act_quant(g_cu, qt[t], dy, dq, n, 1, &e) == 0);
            CHECK(cuda_download(g_cu, y1, dy, sizeof(float) * n, &e) == 0);
            CHECK(cuda_download(g_cu, q1, dq, ab, &e) == 0);
            CHECK(cuda_memset(g_cu, dq, 0xA5, ab, &e) == 0);
            CHECK(cuda_memset(g_cu, dy, 0xFF, sizeof(float) * n, &e) == 0);
            CHECK_MSG(cuda_rmsnorm_quant(g_cu, qt[t], dy, dq, dx, dw, n, 1e-6f, &e) == 0, "%s", e.msg);
            CHECK(cuda_download(g_cu, y2, dy, sizeof(float) * n, &e) == 0);
            CHECK(cuda_download(g_cu, q2, dq, ab, &e) == 0);
            const int same = !memcmp(y1, y2, sizeof(float) * n) && !memcmp(q1, q2, ab);
            CHECK_MSG(same, "rmsnorm_quant %s n=%d differs from rmsnorm then act_quant", qtype_name(qt[t]), n);
            printf("  rmsnorm_quant %s n=%d (%d blocks): %s\n", qtype_name(qt[t]), n,
                   (int)(n / qtype_get(qtype_get(qt[t])->dot_type)->blck), same ? "bit-identical" : "DIFFERS");
            cuda_free(g_cu, dq);
            free(q1); free(q2);
        }
        cuda_free(g_cu, dx); cuda_free(g_cu, dw); cuda_free(g_cu, dy);
        free(x); free(w); free(y1); free(y2);
    }
}

TEST(test_swiglu)
{
    const int n = 6144;
    float *g = xmalloc(sizeof(float) * n), *u = xmalloc(sizeof(float) * n);
    float *ref = xmalloc(sizeof(float) * n), *h = xmalloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) { g[i] = frand() * 12.0f; u[i] = frand() * 3.0f; }
    ops_swiglu(ref, g, u, n);
    float *dg = dev_from(g, sizeof(float) * n), *du = dev_from(u, sizeof(float) * n);
    float *dh = dev_alloc(sizeof(float) * n);
    err e = {0};
    CHECK_MSG(cuda_swiglu(g_cu, dh, dg, du, n, &e) == 0, "%s", e.msg);
    CHECK(cuda_download(g_cu, h, dh, sizeof(float) * n, &e) == 0);
    const double m = max_rel(h, ref, n);
    printf("  swiglu n=%d: max rel %.3g\n", n, m);
    CHECK_MSG(m <= 2e-6, "swiglu max rel %.3g", m);
    /* the fused down-projection input: act_quant(swiglu(g, u)) in one
     * launch is act_quant of cuda_swiglu's h, byte for byte (3 rows) */
    static const int qt[] = {QTYPE_Q4_K, QTYPE_Q8_0, QTYPE_Q4_1};
    const int64_t kk = 2048;
    for (size_t t = 0; t < sizeof qt / sizeof qt[0]; t++) {
        const size_t ab = cuda_act_bytes(qt[t], kk) * 3;
        uint8_t *q1 = xmalloc(ab), *q2 = xmalloc(ab);
        void *dq = dev_alloc(ab);
        CHECK_MSG(cuda_act_quant(g_cu, qt[t], dh, dq, kk, 3, &e) == 0, "%s", e.msg);
        CHECK(cuda_download(g_cu, q1, dq, ab, &e) == 0);
        CHECK_MSG(cuda_act_quant_swiglu(g_cu, qt[t], dg, du, dq, kk, 3, &e) == 0, "%s", e.msg);
        CHECK(cuda_download(g_cu, q2, dq, ab, &e) == 0);
        CHECK_MSG(memcmp(q1, q2, ab) == 0, "act_quant_swiglu %s differs from swiglu then act_quant",
                  qtype_name(qt[t]));
        printf("  act_quant_swiglu %s n=%lld rows=3: %s\n", qtype_name(qt[t]), (long long)kk,
               memcmp(q1, q2, ab) ? "DIFFERS" : "bit-identical");
        cuda_free(g_cu, dq);
        free(q1); free(q2);
    }
    CHECK(cuda_act_quant_swiglu(g_cu, QTYPE_F16, dg, du, dh, kk, 1, &e) == ERR_UNSUPPORTED);
    cuda_free(g_cu, dg); cuda_free(g_cu, du); cuda_free(g_cu, dh);
    free(g); free(u); free(ref); free(h);
}

/* n <= 128 runs the register kernel, larger n the shared-memory one */
static void check_router(int n, int k, int rows)
{
    float *lg = xmalloc(sizeof(float) * n * rows), *p = xmalloc(sizeof(float) * n);
    for (int i = 0; i < n * rows; i++) lg[i] = frand() * 4.0f;
    for (int i = 0; i < n; i++) lg[i] = 0.25f;                        /* row 0: all tied */
    for (int i = 0; i < n; i++) lg[n + i] = (float)(i % 7) * 0.5f;     /* row 1: groups of ties */
    if (rows > 2) lg[2 * n + n / 3] = NAN;   /* row 2: a NaN logit makes every p NaN: ids 0..k-1 as ops_topk */
    int32_t *ids_ref = xmalloc(sizeof(int32_t) * k * rows), *ids = xmalloc(sizeof(int32_t) * k * rows);
    float *w_ref = xmalloc(sizeof(float) * k * rows), *w = xmalloc(sizeof(float) * k * rows);
    for (int r = 0; r < rows; r++) {
        memcpy(p, lg + r * n, sizeof(float) * n);
        ops_softmax(p, n);
        ops_topk(p, n, k, ids_ref + r * k);
        double sum = 0;
        for (int t = 0; t < k; t++) { w_ref[r * k + t] = p[ids_ref[r * k + t]]; sum += (double)w_ref[r * k + t]; }
        float fs = (float)sum;
        if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;
        for (int t = 0; t < k; t++) w_ref[r * k + t] /= fs;
    }
    float *dl = dev_from(lg, sizeof(float) * n * rows), *dw = dev_alloc(sizeof(float) * k * rows);
    int32_t *di = dev_alloc(sizeof(int32_t) * k * rows);
    err e = {0};
    CHECK_MSG(cuda_router_topk(g_cu, dl, n, k, rows, di, dw, &e) == 0, "%s", e.msg);
    CHECK(cuda_download(g_cu, ids, di, sizeof(int32_t) * k * rows, &e) == 0);
    CHECK(cuda_download(g_cu, w, dw, sizeof(float) * k * rows, &e) == 0);
    int id_bad = 0, nan_bad = 0;
    for (int i = 0; i < k * rows; i++) id_bad += ids[i] != ids_ref[i];
    if (rows > 2) {   /* the NaN row's weights are NaN on both sides; the rest compare */
        for (int t = 0; t < k; t++) nan_bad += !isnan(w[2 * k + t]) || !isnan(w_ref[2 * k + t]) || ids_ref[2 * k + t] != t;
        for (int t = 0; t < k; t++) w[2 * k + t] = w_ref[2 * k + t] = 1.0f;
    }
    CHECK_MSG(nan_bad == 0, "router: the NaN row gives %d weights or ids unlike the CPU's", nan_bad);
    const double m = max_rel(w, w_ref, (size_t)k * rows);
    printf("  router n=%d k=%d rows=%d: %d ids differ, weights max rel %.3g\n", n, k, rows, id_bad, m);
    CHECK_MSG(id_bad == 0, "%d router ids differ (row 0: gpu %d %d %d, cpu %d %d %d)", id_bad, ids[0], ids[1], ids[2],
              ids_ref[0], ids_ref[1], ids_ref[2]);
    CHECK_MSG(m <= 2e-6, "router weights max rel %.3g", m);
    cuda_free(g_cu, dl); cuda_free(g_cu, dw); cuda_free(g_cu, di);
    free(lg); free(p); free(ids_ref); free(ids); free(w_ref); free(w);
}

TEST(test_router)
{
    check_router(128, 8, 19);   /* Qwen3-30B-A3B */
    check_router(100, 6, 5);    /* entries past n in the registers */
    check_router(512, 10, 7);   /* Qwen3-Next: the shared-memory kernel */
    check_router(60, 4, 3);
}

/* ids_early on a real programmatic-dependent chain: the router's top-k
 * writes the ids, a quantizer runs, then the batched matvec reads the ids
 * before its dependency wait (two launches back). Rounds with new logits
 * each, so an id read too early (the last round's) would pick other
 * matrices: every round's outputs must equal the same launch with
 * ids_early = 0, bit for bit. */
TEST(test_ids_early)
{
    enum { NE = 64, K = 8, ROWS = 96, KW = 512, ROUNDS = 6 };
    const qtype_info *qi = qtype_get(QTYPE_Q4_K);
    const size_t rb = (size_t)(KW / qi->blck) * qi->type_size, ms = rb * ROWS;
    uint8_t *w = xmalloc(ms * NE);
    float *wf = xmalloc(sizeof(float) * KW), *x = xmalloc(sizeof(float) * KW), *lg = xmalloc(sizeof(float) * NE);
    err e = {0};
    for (int r = 0; r < ROWS * NE; r++) {
        for (int i = 0; i < KW; i++) wf[i] = frand() * 0.05f;
        quant_quantize(QTYPE_Q4_K, wf, w + (size_t)r * rb, KW, &e);
    }
    for (int i = 0; i < KW; i++) x[i] = frand();
    uint8_t *dw = dev_from(w, ms * NE);
    float *dx = dev_from(x, sizeof(float) * KW), *dlg = dev_alloc(sizeof(float) * NE);
    void *dxq = dev_alloc(cuda_act_bytes(QTYPE_Q4_K, KW));
    int32_t *dids = dev_alloc(sizeof(int32_t) * K);
    float *dwt = dev_alloc(sizeof(float) * K), *dy[2] = { dev_alloc(sizeof(float) * ROWS * K), dev_alloc(sizeof(float) * ROWS * K) };
    float *y[2] = { xmalloc(sizeof(float) * ROWS * K), xmalloc(sizeof(float) * ROWS * K) };
    int bad = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < NE; i++) lg[i] = frand() * 4.0f;
        CHECK(cuda_upload(g_cu, dlg, lg, sizeof(float) * NE, &e) == 0);
        for (int early = 1; early >= 0; early--) {
            CHECK_MSG(cuda_router_topk(g_cu, dlg, NE, K, 1, dids, dwt, &e) == 0, "%s", e.msg);
            CHECK_MSG(cuda_act_quant(g_cu, QTYPE_Q4_K, dx, dxq, KW, 1, &e) == 0, "%s", e.msg);
            const cuda_matvec_args a = {
                .wtype = QTYPE_Q4_K, .w = dw, .w_stride = ms, .ids = dids, .rows = ROWS, .k = KW, .n_batch = K,
                .xq = dxq, .y = dy[early], .y_stride = ROWS, .ids_early = early,
            };
            CHECK_MSG(cuda_matvec_batch(g_cu, &a, &e) == 0, "%s", e.msg);
        }
        for (int i = 0; i < 2; i++) CHECK(cuda_download(g_cu, y[i], dy[i], sizeof(float) * ROWS * K, &e) == 0);
        bad += memcmp(y[0], y[1], sizeof(float) * ROWS * K) != 0;
    }
    printf("  ids_early after top-k and a quantizer: %d of %d rounds differ\n", bad, ROUNDS);
    CHECK_MSG(bad == 0, "ids_early: %d of %d rounds differ from the launch that waits", bad, ROUNDS);
    cuda_free(g_cu, dw); cuda_free(g_cu, dx); cuda_free(g_cu, dlg); cuda_free(g_cu, dxq); cuda_free(g_cu, dids);
    cuda_free(g_cu, dwt); cuda_free(g_cu, dy[0]); cuda_free(g_cu, dy[1]);
    free(w); free(wf); free(x); free(lg); free(y[0]); free(y[1]);
}

TEST(test_errors)
{
    err e = {0};
    CHECK(cuda_matvec(g_cu, QTYPE_Q2_K, NULL, 8, 256, NULL, NULL, &e) == ERR_UNSUPPORTED);
    err_clear(&e);
    CHECK(cuda_matvec(g_cu, QTYPE_Q4_K, NULL, 8, 100, NULL, NULL, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_matvec(g_cu, QTYPE_F16, NULL, 8, 100, NULL, NULL, &e) == ERR_USAGE);   /* k % 8 */
    err_clear(&e);
    CHECK(cuda_matvec(g_cu, QTYPE_F32, (const void *)(uintptr_t)4, 8, 64, NULL, NULL, &e) == ERR_USAGE);   /* align */
    err_clear(&e);
    CHECK(cuda_act_quant(g_cu, QTYPE_Q3_K, NULL, NULL, 256, 1, &e) == ERR_UNSUPPORTED);
    CHECK(cuda_act_bytes(QTYPE_Q4_K, 100) == 0);
    /* the read probe: an unaligned size, and nothing to read */
    err_clear(&e);
    CHECK(cuda_read_probe(g_cu, (const void *)(uintptr_t)256, 24, NULL, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_read_probe(g_cu, (const void *)(uintptr_t)256, 0, NULL, &e) == ERR_USAGE);
    CHECK_MSG(strstr(e.msg, "0 bytes") != NULL, "%s", e.msg);
    /* split Q8_0 rows: k a multiple of 256, 16-byte aligned weights */
    CHECK(cuda_repack_q8_0(g_cu, (void *)(uintptr_t)256, 4, 288, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_repack_q8_0(g_cu, (void *)(uintptr_t)258, 4, 256, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_matvec(g_cu, CUDA_Q8_0_SPLIT, (const void *)(uintptr_t)256, 8, 288, NULL, NULL, &e) == ERR_USAGE);
    err_clear(&e);
    /* the step probe: a bad count, and a persistent grid that cannot be resident */
    float us = -1.f;
    CHECK(cuda_step_probe(g_cu, 0, 0, 10, &us, &e) == ERR_USAGE && us == 0.f);
    err_clear(&e);
    CHECK(cuda_step_probe(g_cu, 4, 0, 0, &us, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_step_probe(g_cu, 1 << 20, 1, 10, &us, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_step_probe(g_cu, 4, 3, 10, &us, &e) == ERR_USAGE);   /* no mode 3 */
    err_clear(&e);
    /* the ticket chain runs to its end (a lost ticket would hang here),
     * also with links of more CTAs than fit at once with their neighbours */
    CHECK_MSG(cuda_step_probe(g_cu, 8, 2, 50, &us, &e) == 0 && us > 0.f, "ticket step probe: %s", e.msg);
    CHECK_MSG(cuda_step_probe(g_cu, 4 * cuda_get_info(g_cu)->sm_count, 2, 50, &us, &e) == 0 && us > 0.f,
              "ticket step probe: %s", e.msg);
    /* the chain trace: reset and read before a begin; begin names the
     * build option when the library was built without it (the test is
     * plain C: which build it links is known only by asking), and in a
     * trace build refuses a bad room */
    uint64_t t0[1], t1[1];
    const char *const *tn = NULL;
    int nr = -1, nn = -1;
    CHECK(cuda_trace_reset(g_cu, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_trace_read(g_cu, t0, t1, 1, &nr, &tn, &nn, &e) == ERR_USAGE && nr == 0 && nn == 0 && !tn);
    err_clear(&e);
    const int trc = cuda_trace_begin(g_cu, 16, &e);
    if (trc == 0) {
        CHECK(cuda_trace_reset(g_cu, &e) == 0);
        CHECK(cuda_trace_read(g_cu, t0, t1, 1, &nr, &tn, &nn, &e) == 0 && nr == 0 && nn == 0);
        CHECK(cuda_trace_begin(g_cu, 0, &e) == ERR_USAGE);   /* and the trace it replaced is ended */
        err_clear(&e);
        CHECK(cuda_trace_reset(g_cu, &e) == ERR_USAGE);
    } else {
        CHECK_MSG(trc == ERR_UNSUPPORTED && strstr(e.msg, "CUDA_TRACE=1"), "%s", e.msg);
    }
    err_clear(&e);
    cuda_trace_end(g_cu);   /* nothing begun: a no-op */
    CHECK(cuda_act_bytes(QTYPE_Q4_K, 512) == 2 * 292);
    CHECK(cuda_act_bytes(QTYPE_Q5_K, 512) == 2 * 292);
    CHECK(cuda_act_bytes(QTYPE_Q8_0, 64) == 2 * 34);
    CHECK(cuda_act_bytes(QTYPE_Q4_0, 64) == 2 * 34);
    CHECK(cuda_act_bytes(QTYPE_Q4_0, 48) == 0);
    CHECK(cuda_act_bytes(QTYPE_Q5_0, 64) == 2 * 34);
    CHECK(cuda_act_bytes(QTYPE_Q4_1, 64) == 2 * 36);
    CHECK(cuda_act_bytes(QTYPE_Q5_1, 64) == 2 * 36);
    CHECK(cuda_act_bytes(QTYPE_Q5_1, 48) == 0);
    CHECK(cuda_act_bytes(QTYPE_F32, 10) == 40);
    CHECK(cuda_act_bytes(QTYPE_F16, 10) == 20);
    CHECK(cuda_act_bytes(QTYPE_BF16, 10) == 20);
}

/* ==== bench ==== */

#define BENCH_REPS 20

/* median ms of BENCH_REPS timed runs after 3 warm-ups */
typedef int (*bench_fn)(void *arg);
static float bench_median(bench_fn fn, void *arg)
{
    float t[BENCH_REPS];
    err e = {0};
    for (int i = 0; i < 3; i++) fn(arg);
    for (int i = 0; i < BENCH_REPS; i++) {
        cuda_timer_begin(g_cu, &e);
        fn(arg);
        if (cuda_timer_end(g_cu, &t[i], &e)) { fprintf(stderr, "bench: %s\n", e.msg); exit(2); }
    }
    return median_float(t, BENCH_REPS);
}

typedef struct { const void *buf; size_t bytes; uint32_t *sink; void *dst; } bw_arg;
static int run_read(void *a)
{
    bw_arg *b = a;
    return cuda_read_probe(g_cu, b->buf, b->bytes, b->sink, NULL);
}
static int run_copy(void *a)
{
    bw_arg *b = a;
    return cuda_copy_d2d(g_cu, b->dst, b->buf, b->bytes, NULL);
}
static int run_mv(void *a)
{
    err e = {0};
    int r = cuda_matvec_batch(g_cu, a, &e);
    if (r) { fprintf(stderr, "bench matvec: %s\n", e.msg); exit(2); }
    return r;
}

typedef struct {
    const char *name;
    int wtype;
    int64_t rows, k;
    int n_mat, n_batch;   /* n_batch < n_mat: pick n_batch matrices by id */
} mv_case;

static void bench(void)
{
    const cuda_info *ci = cuda_get_info(g_cu);
    printf("bench: %s, %d SMs, %.1f GiB, L2 %.0f MiB, runtime %d, driver %d\n", ci->name, ci->sm_count,
           ci->global_mem / 1073741824.0, ci->l2_bytes / 1048576.0, ci->runtime_version, ci->driver_version);
    /* device bandwidth: 4 GiB read-only probe; 2 GiB -> 2 GiB copy counted as read + write */
    const size_t big = (size_t)4 << 30, half = (size_t)2 << 30;
    uint8_t *buf = dev_alloc(big);
    uint32_t *sink = dev_alloc(4);
    err e = {0};
    cuda_memset(g_cu, buf, 0x5A, big, &e);
    bw_arg ra = {buf, big, sink, NULL};
    const float t_read = bench_median(run_read, &ra);
    const double bw_read = big / (t_read * 1e-3) / 1e9;
    bw_arg ca = {buf, half, sink, buf + half};
    const float t_copy = bench_median(run_copy, &ca);
    const double bw_copy = 2.0 * half / (t_copy * 1e-3) / 1e9;
    printf("bench: read probe %.0f GB/s (4 GiB, %.3f ms); d2d copy %.0f GB/s (2 GiB read + 2 GiB written, %.3f ms)\n",
           bw_read, t_read, bw_copy, t_copy);
    cuda_free(g_cu, buf);

    static const mv_case cases[] = {
        {"experts gate/up Q4_K 768x2048, 128 matrices", QTYPE_Q4_K, 768, 2048, 128, 128},
        {"experts down Q4_K 2048x768, 128 matrices", QTYPE_Q4_K, 2048, 768, 128, 128},
        {"decode: 8 of 128 experts Q4_K 768x2048 (ids)", QTYPE_Q4_K, 768, 2048, 128, 8},
        {"decode: 8 of 128 experts Q5_K 768x2048 (ids)", QTYPE_Q5_K, 768, 2048, 128, 8},
        {"head Q6_K 151936x2048", QTYPE_Q6_K, 151936, 2048, 1, 1},
        {"attention Q8_0 4096x2048, 32 matrices", QTYPE_Q8_0, 4096, 2048, 32, 32},
        {"experts gate/up Q5_K 768x2048, 128 matrices", QTYPE_Q5_K, 768, 2048, 128, 128},
        {"experts down Q5_K 2048x768, 128 matrices", QTYPE_Q5_K, 2048, 768, 128, 128},
        {"experts gate/up Q4_0 768x2048, 128 matrices", QTYPE_Q4_0, 768, 2048, 128, 128},
        {"experts down Q4_0 2048x768, 128 matrices", QTYPE_Q4_0, 2048, 768, 128, 128},
        {"router F32 128x2048, 1 matrix (L2-resident: latency)", QTYPE_F32, 128, 2048, 1, 1},
        {"router F32 128x2048, 64 matrices", QTYPE_F32, 128, 2048, 64, 64},
        {"F16 2048x2048, 32 matrices", QTYPE_F16, 2048, 2048, 32, 32},
        {"BF16 2048x2048, 32 matrices", QTYPE_BF16, 2048, 2048, 32, 32},
        /* the other tensors of a Q4_K_M file (llama.cpp's mix: Q6_K for
         * attn_v and half the ffn_down, Q4_K for the rest of attention) */
        {"experts down Q6_K 2048x768, 128 matrices", QTYPE_Q6_K, 2048, 768, 128, 128},
        {"experts gate/up Q6_K 768x2048, 128 matrices", QTYPE_Q6_K, 768, 2048, 128, 128},
        {"Wo Q4_K 2048x4096, 32 matrices", QTYPE_Q4_K, 2048, 4096, 32, 32},
        {"q Q4_K 4096x2048, 32 matrices", QTYPE_Q4_K, 4096, 2048, 32, 32},
        {"v Q6_K 512x2048, 64 matrices", QTYPE_Q6_K, 512, 2048, 64, 64},
    };
    printf("\n| case | weight MB read | median us | GB/s | of read probe | of copy |\n|---|---|---|---|---|---|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const mv_case *m = &cases[c];
        const qtype_info *qi = qtype_get(m->wtype);
        const size_t rb = (size_t)(m->k / qi->blck) * qi->type_size, ms = rb * m->rows;
        uint8_t *hw = xmalloc(ms);
        random_blocks(m->wtype, hw, (size_t)(m->k / qi->blck) * m->rows);
        uint8_t *dw = dev_alloc(ms * m->n_mat);
        for (int i = 0; i < m->n_mat; i++) cuda_upload(g_cu, dw + ms * i, hw, ms, &e);
        float *x = xmalloc(sizeof(float) * m->k);
        for (int64_t i = 0; i < m->k; i++) x[i] = frand();
        float *dx = dev_from(x, sizeof(float) * m->k);
        void *dxq = dev_alloc(cuda_act_bytes(m->wtype, m->k));
        cuda_act_quant(g_cu, m->wtype, dx, dxq, m->k, 1, &e);
        float *dy = dev_alloc(sizeof(float) * m->rows * m->n_batch);
        int32_t ids[128];
        for (int i = 0; i < m->n_batch; i++) ids[i] = (int32_t)((i * 37 + 11) % m->n_mat);   /* distinct */
        int32_t *dids = m->n_batch < m->n_mat ? dev_from(ids, sizeof(int32_t) * m->n_batch) : NULL;
        cuda_matvec_args a = {
            .wtype = m->wtype, .w = dw, .w_stride = ms, .ids = dids, .rows = m->rows, .k = m->k,
            .n_batch = m->n_batch, .xq = dxq, .y = dy, .y_stride = (size_t)m->rows,
        };
        const float t = bench_median(run_mv, &a);
        const double bytes = (double)ms * m->n_batch;
        const double gbs = bytes / (t * 1e-3) / 1e9;
        printf("| %s | %.1f | %.1f | %.0f | %.0f%% | %.0f%% |\n", m->name, bytes / 1e6, t * 1e3, gbs,
               100.0 * gbs / bw_read, 100.0 * gbs / bw_copy);
        fflush(stdout);
        cuda_free(g_cu, dw); cuda_free(g_cu, dx); cuda_free(g_cu, dxq); cuda_free(g_cu, dy); cuda_free(g_cu, dids);
        free(hw); free(x);
    }
    if (cuda_sync(g_cu, &e)) fprintf(stderr, "bench: %s\n", e.msg);
}

/* ---- --bench-chain: a decode layer's matvecs as a dependent chain ----
 * A token is a chain of dependent kernels, so what bounds a matvec there is
 * not its bandwidth alone but its cost as one link: launch, dependency
 * wait, prologue, then the bytes. Here 48 "layers" of the 30b-a3b shape's
 * four big matvecs (q/k/v split Q8_0 5120x2048, Wo split Q8_0 2048x4096
 * with the residual add, gate+up 8 of Q4_K 768x2048 by ids, down 8 of Q4_K
 * 2048x768 by early ids), every layer its own weights (2 GB: cold, as in
 * a token), are captured as one graph of PDL-chained launches and timed
 * against the same chain of plain reads of the same bytes (cuda_read_step,
 * with and without an L2 prefetch before the wait): how far the matvecs
 * are from what a dependent read of each size reaches, and how far that is
 * from the read probe. Weights are random bytes: the work, not the values,
 * is what is timed. */
enum { CH_LAYERS = 48, CH_MATS = 4, CH_KINDS = 6 };   /* kinds 4, 5: gate+up variants on kind 2's bytes */
typedef struct {
    uint8_t *pool;
    size_t layer_bytes, off[CH_KINDS], bytes[CH_KINDS];
    int32_t *ids;
    void *xq_q8k_2048, *xq_q8k_768x8, *xq_q80_2048, *xq_q80_4096;
    float *y, *y2, *x;
    uint32_t *sink;
    int which;      /* one matvec kind (0..5), or -1: the four (0..3) in layer order */
    int read;       /* 0 matvecs, 1 reads, 2 reads with the L2 prefetch */
} chain_arg;
static const char *const ch_name[CH_KINDS] = {
    "q/k/v split Q8_0 5120x2048", "Wo split Q8_0 2048x4096 (+add)", "gate+up 2x8 Q4_K 768x2048 (ids)",
    "down 8 Q4_K 2048x768 (early ids)", "gate+up 2x8 Q4_K 768x2048 (batch index: no ids)",
    "gate 8 Q4_K 768x2048 (ids, no up)"};

static int chain_link(chain_arg *c, int l, int m, err *e)
{
    const uint8_t *w = c->pool + (size_t)l * c->layer_bytes + c->off[m];
    if (c->read) return cuda_read_step(g_cu, w, c->bytes[m], c->sink, c->read == 2, e);
    const size_t gu = (size_t)768 * (2048 / 256) * 144;   /* one Q4_K 768x2048 (or 2048x768) matrix */
    cuda_matvec_args a = {.n_batch = 1};
    switch (m) {
    case 0:
        a = (cuda_matvec_args){.wtype = CUDA_Q8_0_SPLIT, .w = w, .rows = 5120, .k = 2048, .n_batch = 1,
                               .xq = c->xq_q80_2048, .y = c->y};
        break;
    case 1:
        a = (cuda_matvec_args){.wtype = CUDA_Q8_0_SPLIT, .w = w, .rows = 2048, .k = 4096, .n_batch = 1,
                               .xq = c->xq_q80_4096, .y = c->x, .add = c->x};
        break;
    case 2:
        a = (cuda_matvec_args){.wtype = QTYPE_Q4_K, .w = w, .w_stride = gu, .ids = c->ids, .rows = 768, .k = 2048,
                               .n_batch = 8, .xq = c->xq_q8k_2048, .y = c->y, .y_stride = 768, .w2 = w + 8 * gu,
                               .y2 = c->y2};
        break;
    case 4:
    case 5:
        a = (cuda_matvec_args){.wtype = QTYPE_Q4_K, .w = w, .w_stride = gu, .ids = m == 4 ? NULL : c->ids,
                               .rows = 768, .k = 2048, .n_batch = 8, .xq = c->xq_q8k_2048, .y = c->y,
                               .y_stride = 768, .w2 = m == 4 ? w + 8 * gu : NULL, .y2 = m == 4 ? c->y2 : NULL};
        break;
    default:
        a = (cuda_matvec_args){.wtype = QTYPE_Q4_K, .w = w, .w_stride = gu, .ids = c->ids, .ids_early = 1,
                               .rows = 2048, .k = 768, .n_batch = 8, .xq = c->xq_q8k_768x8,
                               .x_stride = cuda_act_bytes(QTYPE_Q4_K, 768), .y = c->y, .y_stride = 2048};
        break;
    }
    return cuda_matvec_batch(g_cu, &a, e);
}

static cuda_graph *g_chain;
static int run_chain(void *a)
{
    (void)a;
    return cuda_graph_launch(g_cu, g_chain, NULL);
}

/* ms of one replay of the chain c describes (median, bench_median) */
static float chain_ms(chain_arg *c)
{
    err e = {0};
    int rc = cuda_graph_begin(g_cu, &e);
    if (rc) { fprintf(stderr, "bench-chain: %s\n", e.msg); exit(2); }
    for (int l = 0; !rc && l < CH_LAYERS; l++) {
        if (c->which >= 0) rc = chain_link(c, l, c->which, &e);
        for (int m = 0; !rc && c->which < 0 && m < CH_MATS; m++) rc = chain_link(c, l, m, &e);
    }
    cuda_graph *g = NULL;
    const int rc2 = cuda_graph_end(g_cu, &g, rc ? NULL : &e);
    if (rc || rc2) { fprintf(stderr, "bench-chain: %s\n", e.msg); exit(2); }
    g_chain = g;
    const float ms = bench_median(run_chain, NULL);
    cuda_sync(g_cu, NULL);
    cuda_graph_free(g);
    g_chain = NULL;
    return ms;
}

static void bench_chain(void)
{
    err e = {0};
    const size_t big = (size_t)4 << 30;
    uint8_t *buf = dev_alloc(big);
    uint32_t *sink = dev_alloc(4);
    cuda_memset(g_cu, buf, 0x5A, big, &e);
    bw_arg ra = {buf, big, sink, NULL};
    const double probe = big / (bench_median(run_read, &ra) * 1e-3) / 1e9;
    cuda_free(g_cu, buf);

    chain_arg c = {.sink = sink};
    const size_t gu = (size_t)768 * 8 * 144;
    c.bytes[0] = (size_t)5120 * 64 * 34;
    c.bytes[1] = (size_t)2048 * 128 * 34;
    c.bytes[2] = 16 * gu;
    c.bytes[3] = 8 * gu;
    size_t o = 0;
    for (int m = 0; m < CH_MATS; m++) { c.off[m] = o; o += (c.bytes[m] + 255) & ~(size_t)255; }
    c.layer_bytes = o;
    c.off[4] = c.off[5] = c.off[2];
    c.bytes[4] = c.bytes[2];
    c.bytes[5] = 8 * gu;
    c.pool = dev_alloc(c.layer_bytes * CH_LAYERS);
    /* bytes that decode to finite scales (f16 0x1111 ~ 5e-4), so no inf/NaN work */
    CHECK(cuda_memset(g_cu, c.pool, 0x11, c.layer_bytes * CH_LAYERS, &e) == 0);
    const int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    c.ids = dev_from(ids, sizeof ids);
    float *xf = xmalloc(sizeof(float) * 4096 * 8);
    for (int i = 0; i < 4096 * 8; i++) xf[i] = frand();
    float *dx = dev_from(xf, sizeof(float) * 4096 * 8);
    c.xq_q8k_2048 = dev_alloc(cuda_act_bytes(QTYPE_Q4_K, 2048));
    c.xq_q8k_768x8 = dev_alloc(8 * cuda_act_bytes(QTYPE_Q4_K, 768));
    c.xq_q80_2048 = dev_alloc(cuda_act_bytes(QTYPE_Q8_0, 2048));
    c.xq_q80_4096 = dev_alloc(cuda_act_bytes(QTYPE_Q8_0, 4096));
    CHECK(cuda_act_quant(g_cu, QTYPE_Q4_K, dx, c.xq_q8k_2048, 2048, 1, &e) == 0);
    CHECK(cuda_act_quant(g_cu, QTYPE_Q4_K, dx, c.xq_q8k_768x8, 768, 8, &e) == 0);
    CHECK(cuda_act_quant(g_cu, QTYPE_Q8_0, dx, c.xq_q80_2048, 2048, 1, &e) == 0);
    CHECK(cuda_act_quant(g_cu, QTYPE_Q8_0, dx, c.xq_q80_4096, 4096, 1, &e) == 0);
    c.y = dev_alloc(sizeof(float) * 16384);
    c.y2 = dev_alloc(sizeof(float) * 8192);
    c.x = dev_alloc(sizeof(float) * 2048);
    CHECK(cuda_memset(g_cu, c.x, 0, sizeof(float) * 2048, &e) == 0);

    printf("bench-chain: %s, read probe %.0f GB/s; %d layers of cold weights (%.0f MB), each link a PDL dependent\n",
           cuda_device_name(g_cu), probe, CH_LAYERS, c.layer_bytes * CH_LAYERS / 1e6);
    printf("| chain | MB a link | matvec us | read us | read+prefetch us | matvec of probe | read of probe | "
           "read+pf of probe |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int m = -1; m < CH_KINDS; m++) {
        c.which = m;
        const int links = m < 0 ? CH_LAYERS * CH_MATS : CH_LAYERS;
        const double mb = (m < 0 ? (double)(c.bytes[0] + c.bytes[1] + c.bytes[2] + c.bytes[3]) / CH_MATS
                                 : (double)c.bytes[m]) / 1e6;
        float t[3];
        for (int r = 0; r < 3; r++) { c.read = r; t[r] = chain_ms(&c); }
        printf("| %s | %.2f | %.2f | %.2f | %.2f |", m < 0 ? "the four in layer order" : ch_name[m], mb,
               1e3 * t[0] / links, 1e3 * t[1] / links, 1e3 * t[2] / links);
        for (int r = 0; r < 3; r++) printf(" %.3f |", mb * links / 1e3 / (t[r] * 1e-3) / probe);
        printf("\n");
        fflush(stdout);
    }
    cuda_free(g_cu, c.pool); cuda_free(g_cu, c.ids); cuda_free(g_cu, dx); cuda_free(g_cu, c.xq_q8k_2048);
    cuda_free(g_cu, c.xq_q8k_768x8); cuda_free(g_cu, c.xq_q80_2048); cuda_free(g_cu, c.xq_q80_4096);
    cuda_free(g_cu, c.y); cuda_free(g_cu, c.y2); cuda_free(g_cu, c.x); cuda_free(g_cu, sink);
    free(xf);
}

int main(int argc, char **argv)
{
    const int do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    const int do_info = argc > 1 && strcmp(argv[1], "--info") == 0;
    err e = {0};
    const int orc = cuda_open(&g_cu, 0, &e);
    if (orc != 0 && orc != ERR_UNSUPPORTED) {   /* a GPU that fails to set up is a failure, not a skip */
        fprintf(stderr, "cuda: cuda_open failed: %s\n", e.msg);
        test_g.failed++;
        return test_summary("cuda");
    }
    if (orc != 0) {
        printf("cuda: skipped: %s\n", e.msg);
        if (do_info) return 3;
        test_g.passed++;   /* the skip counts as passed: no GPU is not a failure */
        return test_summary("cuda");
    }
    printf("cuda: device %s\n", cuda_device_name(g_cu));
    if (do_info) {
        cuda_close(g_cu);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--bench-chain") == 0) {
        bench_chain();
        cuda_close(g_cu);
        return test_g.failed ? 1 : 0;
    }
    if (do_bench) {
        bench();
        cuda_close(g_cu);
        return 0;
    }
    RUN(test_errors);
    RUN(test_act_quant);
    RUN(test_matvec);
    RUN(test_matvec_pair);
    RUN(test_matvec_q6k_span);
    RUN(test_matvec_batch);
    RUN(test_matvec_xquant);
    RUN(test_matmul);
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_quant_shapes);
    RUN(test_swiglu);
    RUN(test_router);
    RUN(test_ids_early);
    if (cuda_sync(g_cu, &e)) { fprintf(stderr, "cuda: %s\n", e.msg); test_g.failed++; }
    cuda_close(g_cu);
    return test_summary("cuda");
}

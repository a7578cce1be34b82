/* test_cuda_layer: the rest of the decode token path (cuda_layer.cu)
 * against the CPU functions it mirrors; --bench times them.
 *
 * Without a usable GPU (this machine and CI) cuda_open answers
 * ERR_UNSUPPORTED; the suite prints a skip note and counts the skip as one
 * passed case: `cuda_layer: 1 passed, 0 failed`, exit 0. `test_cuda_layer
 * attention` runs the attention checks alone (for compute-sanitizer);
 * `--bench-rows` times a prompt chunk's attention (bench_rows).
 *
 * With a GPU (fresh random inputs, outputs poisoned before each kernel):
 *   get_rows   every supported type (rows quantized by the CPU's reference
 *              quantizer, plus NaN / inf / subnormal halves in the F16
 *              table) vs quant_dequantize: bytes equal (memcmp); ids out
 *              of range give zero rows and set the bad flag, valid ids
 *              leave it 0; a padded row stride;
 *   rope       vs ops_rope_cache + ops_rope_neox, positions 0, 1, 2999,
 *              40000, full and partial n_rot: |gpu - cpu| <= 2.5e-7 *
 *              (|x0| + |x1|) per pair (cos/sin may differ by 1 ulp: the
 *              device rounds a double sincos, glibc's cosf/sinf are within
 *              0.56 ulp), dims past n_rot untouched; the share of
 *              bit-identical values is printed;
 *   kv_store   f16 bytes == fp32_to_fp16 (ties, subnormals, overflow, NaN
 *              payloads) and f32 bytes, rows pos..pos+rows-1 only;
 *   attention  vs ops_attention per (row, head): Qwen3-30B-A3B's shape
 *              (32 q heads, 4 kv heads, d 128) at positions 0, 1, 700..704,
 *              2999, f16 / f32 / mixed caches, plus d 64 / 80 / 256, no
 *              GQA, a 16-head group, out == q in place, and rows
 *              510..512 and 1022..1024 (one to two tiles a CTA; the
 *              kernel's switch from all warps on each tile to per-warp
 *              tiles). TOLERANCE
 *              |gpu - cpu| <= 1e-5 * sum_j p_j |v_j[d]| per element (the
 *              scale of the terms summed: an output may cancel to ~0, so
 *              plain relative error is meaningless there); and
 *              cuda_attention_rows bit for bit the one-row calls
 *              (check_attention_rows: k_attn_rows across the buckets'
 *              ends and the spread / per-warp tiles switch, d 64 / 128,
 *              f16 / f32, groups of 1, 4, 8; the shapes it leaves to
 *              one-row launches);
 *   attention_fused  cuda_attention_decode_fused vs cuda_qk_norm_rope_store
 *              + cuda_attention_decode: output and both caches bit for bit,
 *              positions 0..3000 (the row's position in the first or a
 *              later tile, spread and per-warp tiles, cluster sizes 1 to
 *              16, 1 to 8 heads a CTA), d 64 / 80 / 128 / 256, partial
 *              rotation, f16 / f32 caches;
 *   combine    vs qwen3moe.c's sum (y_t = e_t * w_t, ((y0 + y1) + ...) +
 *              x): bytes equal;
 *   combine_norm  cuda_moe_combine_rmsnorm_quant vs cuda_moe_combine then
 *              cuda_rmsnorm_quant on the same inputs, for weights of each
 *              Q8 activation format (Q8_0, Q8_1, Q8_K): x, y and xq bytes
 *              equal; k from 1 to 17 (past the 8 expert loads a thread
 *              issues at once), n from 736 to CUDA_RMSQ_MAXN, an all-zero
 *              block, y == x in place;
 *   add        bytes equal, in place;
 *   argmax     vs sampler_sample with temp 0: vocab 151936 and 32768,
 *              ties, NaNs, NaN at 0, all -inf, the last index, all equal,
 *              maxima at the cluster slice edges. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "testhelp.h"
#define CUDATEST_SEED 0x2545F4914F6CDD1Dull
#include "cudatest.h"
#include "backend/cuda/cuda_backend.h"
#include "engine.h"
#include "model/ops.h"
#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/fp16.h"

static float *g_tab;   /* f16 -> f32, 65536 entries (ops_attention) */

static void dev_poison(void *p, size_t n)
{
    err e = {0};
    if (cuda_memset(g_cu, p, 0xFF, n, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }   /* NaN floats */
}

static void download(void *h, const void *d, size_t n)
{
    err e = {0};
    if (cuda_download(g_cu, h, d, n, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }
}

/* first differing byte, or -1 */
static long long first_diff(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return (long long)i;
    return -1;
}

/* ==== errors ==== */

TEST(test_errors)
{
    err e = {0};
    int32_t *ids = dev_alloc(4);
    float *f = dev_alloc(4096);
    CHECK(cuda_get_rows(g_cu, QTYPE_Q8_K, f, 292, 1, 256, ids, 1, f, NULL, &e) == ERR_UNSUPPORTED);
    err_clear(&e);
    CHECK(cuda_get_rows(g_cu, QTYPE_Q4_K, f, 144, 1, 100, ids, 1, f, NULL, &e) == ERR_USAGE);   /* n % 256 */
    err_clear(&e);
    CHECK(cuda_get_rows(g_cu, QTYPE_Q4_K, f, 143, 1, 256, ids, 1, f, NULL, &e) == ERR_USAGE);   /* row_bytes */
    err_clear(&e);
    CHECK(cuda_attention_decode(g_cu, f, f, 1, 32, 4, 100, f, 1, f, 1, ids, 1, 0.1f, &e) == ERR_USAGE);   /* d % 8 */
    err_clear(&e);
    CHECK(cuda_attention_decode(g_cu, f, f, 1, 32, 5, 128, f, 1, f, 1, ids, 1, 0.1f, &e) == ERR_USAGE);   /* 32 % 5 */
    err_clear(&e);
    CHECK(cuda_attention_decode(g_cu, f, f, 1, 8, 2, 264, f, 1, f, 1, ids, 1, 0.1f, &e) == ERR_USAGE);    /* d > 256 */
    err_clear(&e);
    CHECK(cuda_attention_rows(g_cu, f, f, 2, 32, 4, 128, f, 1, f, 1, ids, -1, 0.1f, &e) == ERR_USAGE);   /* pos0 < 0 */
    CHECK(strstr(e.msg, "position -1") != NULL);
    err_clear(&e);
    CHECK(cuda_attention_rows(g_cu, f, f, 0, 32, 4, 128, f, 1, f, 1, ids, 0, 0.1f, &e) == ERR_USAGE);    /* no rows */
    err_clear(&e);
    CHECK(cuda_rope_neox(g_cu, f, 1, 4, 128, 129, ids, 1e6f, 1.0f, &e) == ERR_USAGE);   /* odd n_rot */
    err_clear(&e);
    CHECK(cuda_rope_neox(g_cu, f, 1, 4, 64, 128, ids, 1e6f, 1.0f, &e) == ERR_USAGE);    /* n_rot > head_dim */
    err_clear(&e);
    CHECK(cuda_argmax(g_cu, ids, f, 0, 10, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_moe_combine(g_cu, f, f, f, 1, 0, 10, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_Q8_0, f, f, f, 0, f, f, f, 256, 1e-6f, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_Q8_0, f + 1, f, f, 8, f, f, f, 256, 1e-6f, &e) == ERR_USAGE);
    err_clear(&e);   /* x not 16-byte aligned */
    CHECK(cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_F32, f, f, f, 8, f, f, f, 256, 1e-6f, &e) == ERR_UNSUPPORTED);
    err_clear(&e);
    CHECK(cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_Q4_K, f, f, f, 8, f, f, f, 736, 1e-6f, &e) == ERR_UNSUPPORTED);
    err_clear(&e);   /* 736 is no whole number of Q8_K blocks */
    CHECK(cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_Q8_0, f, f, f, 8, f, f, f, CUDA_RMSQ_MAXN + 32, 1e-6f, &e) ==
          ERR_UNSUPPORTED);
    err_clear(&e);
    CHECK(cuda_add(g_cu, f, f, f, 0, &e) == ERR_USAGE);
    err_clear(&e);
    CHECK(cuda_kv_store(g_cu, f, 1, f, 0, 10, ids, &e) == ERR_USAGE);
    cuda_free(g_cu, ids);
    cuda_free(g_cu, f);
}

/* ==== get_rows ==== */

static void check_get_rows(int type, int64_t n, int64_t n_rows_w, size_t pad)
{
    uint64_t rb0 = 0;
    err e = {0};
    CHECK(qtype_row_bytes(type, n, &rb0, &e) == 0);
    const size_t rb = (size_t)rb0 + pad;
    uint8_t *w = xmalloc(rb * (size_t)n_rows_w);
    memset(w, 0x5A, rb * (size_t)n_rows_w);
    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t r = 0; r < n_rows_w; r++) {
        const float amp = 0.1f + 3.0f * (float)(r % 7);
        for (int64_t i = 0; i < n; i++) x[i] = frand() * amp;
        CHECK_MSG(quant_quantize(type, x, w + (size_t)r * rb, n, &e) == 0, "%s", e.msg);
    }
    if (type == QTYPE_F16) {   /* the specials h2f handles: NaNs (signalling, quiet, signed), inf, subnormals, -0 */
        static const uint16_t sp[] = { 0x7c01, 0x7e00, 0xfd55, 0x7c00, 0xfc00, 0x0001, 0x83ff, 0x8000, 0x03ff, 0x0400 };
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) memcpy(w + rb * 3 + 2 * (i * 7), &sp[i], 2);
    }
    const int rows = 7;
    const int32_t ids_bad[7] = { 0, (int32_t)(n_rows_w - 1), 3, -1, (int32_t)n_rows_w, 3, (int32_t)(n_rows_w / 2) };
    const int32_t ids_ok[7] = { 3, 1, 0, (int32_t)(n_rows_w - 1), 2, (int32_t)(n_rows_w / 3), 3 };
    float *ref = xmalloc(sizeof(float) * (size_t)n * rows), *got = xmalloc(sizeof(float) * (size_t)n * rows);
    void *dw = dev_from(w, rb * (size_t)n_rows_w);
    float *dout = dev_alloc(sizeof(float) * (size_t)n * rows);
    int32_t *dids = dev_alloc(sizeof ids_bad), *dbad = dev_alloc(sizeof(int32_t));
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? ids_ok : ids_bad;
        for (int r = 0; r < rows; r++) {
            float *o = ref + (size_t)r * n;
            if (ids[r] < 0 || ids[r] >= n_rows_w) memset(o, 0, sizeof(float) * (size_t)n);
            else CHECK(quant_dequantize(type, w + (size_t)ids[r] * rb, o, n, &e) == 0);
        }
        CHECK(cuda_upload(g_cu, dids, ids, sizeof ids_bad, &e) == 0);
        CHECK(cuda_memset(g_cu, dbad, 0, sizeof(int32_t), &e) == 0);
        dev_poison(dout, sizeof(float) * (size_t)n * rows);
        CHECK_MSG(cuda_get_rows(g_cu, type, dw, rb, n_rows_w, n, dids, rows, dout, dbad, &e) == 0, "%s", e.msg);
        download(got, dout, sizeof(float) * (size_t)n * rows);
        int32_t bad = -1;
        download(&bad, dbad, sizeof bad);
        const long long d = first_diff(ref, got, sizeof(float) * (size_t)n * rows);
        CHECK_MSG(d < 0, "get_rows %s n=%lld pass %d: first difference at float %lld (cpu %08x gpu %08x)",
                  qtype_name(type), (long long)n, pass, d / 4, d < 0 ? 0 : fp32_bits(ref[d / 4]),
                  d < 0 ? 0 : fp32_bits(got[d / 4]));
        CHECK_MSG(bad == (pass ? 0 : 1), "get_rows %s: bad flag %d in pass %d", qtype_name(type), bad, pass);
    }
    /* bad may be NULL */
    CHECK_MSG(cuda_get_rows(g_cu, type, dw, rb, n_rows_w, n, dids, 1, dout, NULL, &e) == 0, "%s", e.msg);
    printf("  get_rows %-5s n=%lld rows_w=%lld pad=%zu: bit-identical%s\n", qtype_name(type), (long long)n,
           (long long)n_rows_w, pad, test_g.case_failed ? " (NOT: see above)" : "");
    cuda_free(g_cu, dw); cuda_free(g_cu, dout); cuda_free(g_cu, dids); cuda_free(g_cu, dbad);
    free(w); free(x); free(ref); free(got);
}

TEST(test_get_rows)
{
    static const int types[] = { QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0,
                                 QTYPE_Q5_1, QTYPE_Q8_0, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_get_rows(types[i], 2048, 40, 0);
    check_get_rows(QTYPE_Q6_K, 4096, 300, 0);
    check_get_rows(QTYPE_Q4_K, 1024, 9, 6);   /* padded stride */
    check_get_rows(QTYPE_F16, 2048, 5, 2);
}

/* ==== RoPE ==== */

static void check_rope(int rows, const int32_t *pos, int n_head, int head_dim, int n_rot, float base, float fscale)
{
    const size_t n = (size_t)rows * n_head * head_dim;
    float *x = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n), *got = xmalloc(sizeof(float) * n);
    float *cache = xmalloc(sizeof(float) * (size_t)n_rot);
    for (size_t i = 0; i < n; i++) x[i] = frand() * 4.0f;
    memcpy(ref, x, sizeof(float) * n);
    for (int r = 0; r < rows; r++) {
        ops_rope_cache(cache, n_rot, pos[r], base, fscale);
        for (int h = 0; h < n_head; h++) ops_rope_neox(ref + ((size_t)r * n_head + h) * head_dim, n_rot, cache);
    }
    float *dx = dev_from(x, sizeof(float) * n);
    int32_t *dpos = dev_from(pos, sizeof(int32_t) * (size_t)rows);
    err e = {0};
    CHECK_MSG(cuda_rope_neox(g_cu, dx, rows, n_head, head_dim, n_rot, dpos, base, fscale, &e) == 0, "%s", e.msg);
    download(got, dx, sizeof(float) * n);
    size_t exact = 0, over = 0, untouched_bad = 0;
    double worst = 0;
    const int half = n_rot / 2;
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_head; h++) {
            const size_t o = ((size_t)r * n_head + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const double mag = fabs(x[o + i]) + fabs(x[o + i + half]);
                for (int t = 0; t < 2; t++) {
                    const size_t k = o + i + (size_t)t * half;
                    exact += fp32_bits(got[k]) == fp32_bits(ref[k]);
                    const double err = fabs((double)got[k] - ref[k]) / (mag + 1e-30);
                    if (!(err <= 2.5e-7)) over++;
                    if (err > worst || isnan(err)) worst = err;
                }
            }
            for (int i = n_rot; i < head_dim; i++) untouched_bad += fp32_bits(got[o + i]) != fp32_bits(x[o + i]);
        }
    CHECK_MSG(over == 0, "rope: %zu values beyond 2.5e-7 * (|x0|+|x1|), worst %.3g", over, worst);
    CHECK_MSG(untouched_bad == 0, "rope: %zu dims past n_rot changed", untouched_bad);
    printf("  rope rows=%d heads=%d d=%d n_rot=%d base=%g: %.2f%% bit-identical, worst %.3g of |x0|+|x1|\n", rows,
           n_head, head_dim, n_rot, (double)base, 100.0 * exact / (double)(rows * n_head * n_rot), worst);
    cuda_free(g_cu, dx); cuda_free(g_cu, dpos);
    free(x); free(ref); free(got); free(cache);
}

TEST(test_rope)
{
    const int32_t p1[4] = { 0, 1, 2999, 777 };
    check_rope(4, p1, 32, 128, 128, 1e6f, 1.0f);   /* Qwen3 q */
    check_rope(4, p1, 4, 128, 128, 1e6f, 1.0f);    /* Qwen3 k */
    const int32_t p2[2] = { 5, 40000 };
    check_rope(2, p2, 4, 128, 64, 10000.0f, 0.25f);   /* partial rotation, scaled */
    const int32_t p3[1] = { 123 };
    check_rope(1, p3, 3, 64, 64, 500000.0f, 1.0f);
}

/* ==== KV store ==== */

static void check_kv_store(int f16)
{
    const int64_t kvd = 512;
    const int n_ctx = 16, rows = 3, pos0 = 5;
    const size_t es = f16 ? 2 : 4, cbytes = (size_t)n_ctx * kvd * es;
    float *src = xmalloc(sizeof(float) * (size_t)rows * kvd);
    for (int64_t i = 0; i < rows * kvd; i++) src[i] = frand() * (i % 3 == 0 ? 70000.0f : i % 3 == 1 ? 1.0f : 1e-5f);
    static const uint32_t sp[] = {
        0x477ff000u, 0x477fefffu, 0x477fe000u, 0xc77ff000u, /* 65520 -> inf, just below, 65504 */
        0x33000000u, 0x33000001u, 0x33400000u, 0x38800000u, 0x387fffffu, /* 2^-25 tie, subnormal edges */
        0x3f801000u, 0x3f803000u, 0x3f801001u, /* mantissa ties to even, above */
        0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f812345u, 0xffa00000u, 0x80000000u, 0x00000001u };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) src[kvd + 3 * i] = fp32_from_bits(sp[i]);
    uint8_t *ref = xmalloc(cbytes), *got = xmalloc(cbytes);
    memset(ref, 0xA5, cbytes);
    for (int r = 0; r < rows; r++)
        for (int64_t d = 0; d < kvd; d++) {
            const size_t k = (size_t)(pos0 + r) * kvd + d;
            const float v = src[r * kvd + d];
            if (f16) { const uint16_t h = fp32_to_fp16(v); memcpy(ref + 2 * k, &h, 2); }
            else memcpy(ref + 4 * k, &v, 4);
        }
    void *dc = dev_alloc(cbytes);
    err e = {0};
    CHECK(cuda_memset(g_cu, dc, 0xA5, cbytes, &e) == 0);
    float *ds = dev_from(src, sizeof(float) * (size_t)rows * kvd);
    const int32_t p = pos0;
    int32_t *dp = dev_from(&p, sizeof p);
    CHECK_MSG(cuda_kv_store(g_cu, dc, f16, ds, rows, kvd, dp, &e) == 0, "%s", e.msg);
    download(got, dc, cbytes);
    const long long d = first_diff(ref, got, cbytes);
    CHECK_MSG(d < 0, "kv_store %s: first difference at byte %lld", f16 ? "f16" : "f32", d);
    printf("  kv_store %s: %s\n", f16 ? "f16" : "f32", d < 0 ? "bit-identical" : "DIFFERS");
    cuda_free(g_cu, dc); cuda_free(g_cu, ds); cuda_free(g_cu, dp);
    free(src); free(ref); free(got);
}

TEST(test_kv_store)
{
    check_kv_store(1);
    check_kv_store(0);
}

/* ==== fused attention prologue ====
 * cuda_qk_norm_rope_store == cuda_rmsnorm (q, k per head) + cuda_rope_neox
 * (q and k) + cuda_kv_store (k, v), bit for bit: q, k and both caches. */
static void check_qk_fused(int n_head, int n_head_kv, int head_dim, int n_rot, int f16)
{
    const int n_ctx = 8, p = 6;
    const size_t qn = (size_t)n_head * head_dim, kvd = (size_t)n_head_kv * head_dim;
    const size_t es = f16 ? 2 : 4, cb = (size_t)n_ctx * kvd * es;
    float *h = xmalloc(sizeof(float) * (qn + 2 * kvd)), *w = xmalloc(sizeof(float) * 2 * head_dim);
    for (size_t i = 0; i < qn + 2 * kvd; i++) h[i] = frand() * 3.0f;
    for (int i = 0; i < 2 * head_dim; i++) w[i] = 0.5f + frand();
    err e = {0};
    /* reference: the separate kernels on buffers A; the fused one on B */
    float *qa = dev_from(h, sizeof(float) * (qn + 2 * kvd)), *qb = dev_from(h, sizeof(float) * (qn + 2 * kvd));
    float *dw = dev_from(w, sizeof(float) * 2 * head_dim);
    void *kca = dev_alloc(cb), *vca = dev_alloc(cb), *kcb = dev_alloc(cb), *vcb = dev_alloc(cb);
    CHECK(cuda_memset(g_cu, kca, 0x5A, cb, &e) == 0 && cuda_memset(g_cu, vca, 0x5A, cb, &e) == 0);
    CHECK(cuda_memset(g_cu, kcb, 0x5A, cb, &e) == 0 && cuda_memset(g_cu, vcb, 0x5A, cb, &e) == 0);
    int32_t *dp = dev_from(&p, sizeof p);
    CHECK(cuda_rmsnorm(g_cu, qa, qa, dw, head_dim, n_head, 1e-6f, &e) == 0);
    CHECK(cuda_rmsnorm(g_cu, qa + qn, qa + qn, dw + head_dim, head_dim, n_head_kv, 1e-6f, &e) == 0);
    CHECK(cuda_rope_neox(g_cu, qa, 1, n_head + n_head_kv, head_dim, n_rot, dp, 1e6f, 1.0f, &e) == 0);
    CHECK(cuda_kv_store(g_cu, kca, f16, qa + qn, 1, (int64_t)kvd, dp, &e) == 0);
    CHECK(cuda_kv_store(g_cu, vca, f16, qa + qn + kvd, 1, (int64_t)kvd, dp, &e) == 0);
    CHECK_MSG(cuda_qk_norm_rope_store(g_cu, qb, qb + qn, qb + qn + kvd, dw, dw + head_dim, n_head, n_head_kv, head_dim,
                                      n_rot, dp, 1e6f, 1.0f, 1e-6f, kcb, vcb, f16, &e) == 0,
              "%s", e.msg);
    const size_t hb = sizeof(float) * (qn + kvd);
    uint8_t *a = xmalloc(hb + 2 * cb), *b = xmalloc(hb + 2 * cb);
    download(a, qa, hb); download(a + hb, kca, cb); download(a + hb + cb, vca, cb);
    download(b, qb, hb); download(b + hb, kcb, cb); download(b + hb + cb, vcb, cb);
    const long long d = first_diff(a, b, hb + 2 * cb);
    CHECK_MSG(d < 0, "qk_norm_rope_store heads %d/%d d=%d n_rot=%d %s: first difference at byte %lld", n_head,
              n_head_kv, head_dim, n_rot, f16 ? "f16" : "f32", d);
    printf("  qk_norm_rope_store heads %d/%d d=%d n_rot=%d %s: %s\n", n_head, n_head_kv, head_dim, n_rot,
           f16 ? "f16" : "f32", d < 0 ? "bit-identical to the separate kernels" : "DIFFERS");
    cuda_free(g_cu, qa); cuda_free(g_cu, qb); cuda_free(g_cu, dw); cuda_free(g_cu, dp);
    cuda_free(g_cu, kca); cuda_free(g_cu, vca); cuda_free(g_cu, kcb); cuda_free(g_cu, vcb);
    free(h); free(w); free(a); free(b);
}

TEST(test_qk_fused)
{
    check_qk_fused(32, 4, 128, 128, 1);   /* Qwen3-30B-A3B */
    check_qk_fused(16, 16, 64, 32, 0);    /* MHA, partial rotation, f32 cache */
    err e = {0};
    CHECK(cuda_qk_norm_rope_store(g_cu, NULL, NULL, NULL, NULL, NULL, 4, 4, 64, 65, NULL, 1e6f, 1.0f, 1e-6f, NULL,
                                  NULL, 1, &e) == ERR_USAGE);
}

/* ==== attention ==== */

typedef struct attn_case {
    int n_q, n_head, n_head_kv, d, pos0, k_f16, v_f16, in_place;
    float q_amp;   /* q values in [-q_amp, q_amp): larger = peakier softmax */
} attn_case;

static void check_attention(const attn_case *t)
{
    const int D = t->d, H = t->n_head, Hkv = t->n_head_kv, G = H / Hkv;
    const int n_ctx = t->pos0 + t->n_q;
    const size_t QD = (size_t)H * D, rs = (size_t)Hkv * D;
    float *q = xmalloc(sizeof(float) * QD * t->n_q);
    for (size_t i = 0; i < QD * t->n_q; i++) q[i] = frand() * t->q_amp;
    /* caches: float values, stored as f16 or f32; kf/vf hold what the cache holds, as floats */
    float *kf = xmalloc(sizeof(float) * rs * n_ctx), *vf = xmalloc(sizeof(float) * rs * n_ctx);
    const size_t kes = t->k_f16 ? 2 : 4, ves = t->v_f16 ? 2 : 4;
    uint8_t *kc = xmalloc(kes * rs * n_ctx), *vc = xmalloc(ves * rs * n_ctx);
    for (size_t i = 0; i < rs * n_ctx; i++) {
        float a = frand(), b = frand();
        if (t->k_f16) { const uint16_t h = fp32_to_fp16(a); memcpy(kc + 2 * i, &h, 2); a = fp16_to_fp32(h); }
        else memcpy(kc + 4 * i, &a, 4);
        if (t->v_f16) { const uint16_t h = fp32_to_fp16(b); memcpy(vc + 2 * i, &h, 2); b = fp16_to_fp32(h); }
        else memcpy(vc + 4 * i, &b, 4);
        kf[i] = a; vf[i] = b;
    }
    const float scale = 1.0f / sqrtf((float)D);
    float *ref = xmalloc(sizeof(float) * QD * t->n_q), *got = xmalloc(sizeof(float) * QD * t->n_q);
    float *scores = xmalloc(sizeof(float) * (size_t)n_ctx);
    double *p = xmalloc(sizeof(double) * (size_t)n_ctx), *bound = xmalloc(sizeof(double) * QD * t->n_q);
    for (int i = 0; i < t->n_q; i++)
        for (int h = 0; h < H; h++) {
            const int hk = h / G, n_kv = t->pos0 + i + 1;
            const float *qh = q + (size_t)i * QD + (size_t)h * D;
            ops_attention(ref + (size_t)i * QD + (size_t)h * D, qh, kc + kes * (size_t)hk * D, t->k_f16,
                          vc + ves * (size_t)hk * D, t->v_f16, (int64_t)rs, D, n_kv, scale, scores, g_tab);
            /* the error scale: sum_j p_j |v_j[d]|, p in double */
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n_kv; j++) {
                double s = 0;
                for (int c = 0; c < D; c++) s += (double)qh[c] * kf[(size_t)j * rs + (size_t)hk * D + c];
                p[j] = s * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int j = 0; j < n_kv; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
            double *b = bound + (size_t)i * QD + (size_t)h * D;
            for (int c = 0; c < D; c++) b[c] = 0;
            for (int j = 0; j < n_kv; j++)
                for (int c = 0; c < D; c++) b[c] += p[j] / sum * fabs(vf[(size_t)j * rs + (size_t)hk * D + c]);
        }
    float *dq = dev_from(q, sizeof(float) * QD * t->n_q);
    float *dout = t->in_place ? dq : dev_alloc(sizeof(float) * QD * t->n_q);
    if (!t->in_place) dev_poison(dout, sizeof(float) * QD * t->n_q);
    void *dk = dev_from(kc, kes * rs * n_ctx), *dv = dev_from(vc, ves * rs * n_ctx);
    int32_t *dp = dev_from(&t->pos0, sizeof(int32_t));
    err e = {0};
    CHECK_MSG(cuda_attention_decode(g_cu, dout, dq, t->n_q, H, Hkv, D, dk, t->k_f16, dv, t->v_f16, dp,
                                    t->pos0 + t->n_q, scale, &e) == 0,
              "%s", e.msg);
    download(got, dout, sizeof(float) * QD * t->n_q);
    double worst = 0;
    size_t over = 0;
    for (size_t i = 0; i < QD * t->n_q; i++) {
        const double r = fabs((double)got[i] - ref[i]) / (bound[i] + 1e-30);
        if (!(r <= 1e-5)) over++;
        if (r > worst || isnan(r)) worst = r;
    }
    CHECK_MSG(over == 0, "attention n_q=%d heads %d/%d d=%d pos0=%d k%s v%s: %zu outputs off, worst %.3g of the scale",
              t->n_q, H, Hkv, D, t->pos0, t->k_f16 ? "f16" : "f32", t->v_f16 ? "f16" : "f32", over, worst);
    printf("  attention n_q=%d heads %d/%d d=%d pos0=%d k %s v %s%s: worst |gpu-cpu| %.3g of sum p|v|\n", t->n_q, H,
           Hkv, D, t->pos0, t->k_f16 ? "f16" : "f32", t->v_f16 ? "f16" : "f32", t->in_place ? " in place" : "",
           worst);
    cuda_free(g_cu, dq);
    if (!t->in_place) cuda_free(g_cu, dout);
    cuda_free(g_cu, dk); cuda_free(g_cu, dv); cuda_free(g_cu, dp);
    free(q); free(kf); free(vf); free(kc); free(vc); free(ref); free(got); free(scores); free(p); free(bound);
}

/* cuda_attention_rows == one-row calls (each with its own context as the
 * bound), bit for bit, for NQ rows from P0 (H query heads, HKV KV heads,
 * head_dim D, caches f16 or f32): across the ends of the launch shape's
 * buckets (contexts 128 | 129 and 2048 | 2049: one launch per bucket, the
 * cluster 4 | 8 | 16) and across a switch between k_attn's paths (with
 * 8-CTA clusters, all warps on each tile up to context 512, per-warp tiles
 * beyond), by k_attn_rows (head_dim 64 / 128, groups of up to 8 heads) or,
 * where the shape has none, by one-row launches; one_row: by one-row
 * launches always (cuda_attention_force_one_row). */
static void check_attention_rows(int H, int HKV, int D, int f16, int P0, int NQ, int one_row)
{
    const size_t QD = (size_t)H * D, rs = (size_t)HKV * D, n_ctx = (size_t)P0 + NQ, es = f16 ? 2 : 4;
    float *q = xmalloc(sizeof(float) * QD * NQ);
    uint8_t *kc = xmalloc(es * rs * n_ctx), *vc = xmalloc(es * rs * n_ctx);
    for (size_t i = 0; i < QD * NQ; i++) q[i] = frand() * 2.0f;
    for (size_t i = 0; i < rs * n_ctx; i++) {
        const float a = frand(), b = frand();
        if (f16) { ((uint16_t *)kc)[i] = fp32_to_fp16(a); ((uint16_t *)vc)[i] = fp32_to_fp16(b); }
        else { ((float *)kc)[i] = a; ((float *)vc)[i] = b; }
    }
    float *dq = dev_from(q, sizeof(float) * QD * NQ), *drows = dev_alloc(sizeof(float) * QD * NQ);
    float *done = dev_alloc(sizeof(float) * QD);
    void *dk = dev_from(kc, es * rs * n_ctx), *dv = dev_from(vc, es * rs * n_ctx);
    int32_t *dp = dev_alloc(sizeof(int32_t));
    float *rows = xmalloc(sizeof(float) * QD * NQ), *one = xmalloc(sizeof(float) * QD);
    const float scale = 1.0f / sqrtf((float)D);
    err e = {0};
    const int32_t p0 = P0;
    cuda_upload(g_cu, dp, &p0, sizeof p0, &e);
    cuda_attention_force_one_row(g_cu, one_row);
    CHECK_MSG(cuda_attention_rows(g_cu, drows, dq, NQ, H, HKV, D, dk, f16, dv, f16, dp, P0, scale, &e) == 0, "%s",
              e.msg);
    cuda_attention_force_one_row(g_cu, 0);
    download(rows, drows, sizeof(float) * QD * NQ);
    int differ = 0;
    for (int i = 0; i < NQ; i++) {
        const int32_t p = P0 + i;
        cuda_upload(g_cu, dp, &p, sizeof p, &e);
        CHECK_MSG(cuda_attention_decode(g_cu, done, dq + (size_t)i * QD, 1, H, HKV, D, dk, f16, dv, f16, dp, p + 1,
                                        scale, &e) == 0,
                  "%s", e.msg);
        download(one, done, sizeof(float) * QD);
        if (memcmp(one, rows + (size_t)i * QD, sizeof(float) * QD) && differ++ == 0)
            for (size_t j = 0; j < QD; j++)
                if (memcmp(&one[j], &rows[(size_t)i * QD + j], sizeof(float))) {   /* the first, for the log */
                    printf("  first difference: row %d (position %d) head %zu dim %zu: one-row %a, rows %a\n", i,
                           P0 + i, j / (size_t)D, j % (size_t)D, one[j], rows[(size_t)i * QD + j]);
                    break;
                }
    }
    CHECK_MSG(differ == 0, "attention rows %d..%d heads %d/%d d=%d %s%s: %d rows differ from one-row calls", P0,
              P0 + NQ - 1, H, HKV, D, f16 ? "f16" : "f32", one_row ? " (one-row launches)" : "", differ);
    printf("  attention rows %d..%d heads %d/%d d=%d %s%s == one-row calls: %s\n", P0, P0 + NQ - 1, H, HKV, D,
           f16 ? "f16" : "f32", one_row ? " (one-row launches)" : "", differ ? "NO" : "bit-identical");
    cuda_free(g_cu, dq); cuda_free(g_cu, drows); cuda_free(g_cu, done); cuda_free(g_cu, dk); cuda_free(g_cu, dv);
    cuda_free(g_cu, dp);
    free(q); free(kc); free(vc); free(rows); free(one);
}

TEST(test_attention)
{
    static const attn_case cases[] = {
        /* n_q  H  Hkv  d   pos0 kf16 vf16 inplace amp */
        { 1, 32, 4, 128, 2999, 1, 1, 0, 1.0f },
        { 1, 32, 4, 128, 0,    1, 1, 0, 1.0f },
        { 1, 32, 4, 128, 1,    1, 0, 0, 4.0f },
        { 5, 32, 4, 128, 700,  0, 0, 0, 4.0f },
        { 1, 32, 4, 128, 2999, 0, 0, 0, 8.0f },   /* peaky softmax */
        { 1, 32, 4, 128, 33,   0, 1, 0, 1.0f },
        { 2, 32, 4, 128, 1500, 1, 1, 1, 2.0f },   /* out == q */
        { 1, 64, 4, 128, 2000, 1, 1, 0, 1.0f },   /* group of 16 */
        { 1, 16, 16, 64, 300,  1, 1, 0, 2.0f },   /* no GQA */
        { 1, 16, 2, 256, 100,  0, 0, 0, 1.0f },
        { 3, 8, 2, 80, 513,    1, 1, 0, 2.0f },   /* generic d */
        { 1, 8, 8, 96, 64,     0, 1, 0, 2.0f },
        { 3, 32, 4, 128, 510,  1, 1, 0, 2.0f },   /* rows across one and two tiles a CTA (511 | 512) */
        { 3, 32, 4, 128, 1022, 0, 1, 0, 2.0f },   /* rows across the all-warps/per-warp switch (1023 | 1024) */
        { 1, 16, 2, 256, 31,   1, 0, 0, 4.0f },   /* spread, d 256, one partial tile */
        { 1, 64, 8, 64, 200,   0, 1, 0, 2.0f },   /* spread, d 64 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention(&cases[i]);
    /* Qwen3-30B-A3B's shape, f16 caches (the engine's) */
    check_attention_rows(32, 4, 128, 1, 0, 40, 0);      /* contexts 1..40: empty slices */
    check_attention_rows(32, 4, 128, 1, 100, 40, 0);    /* 101..140: buckets 0 and 1 */
    check_attention_rows(32, 4, 128, 1, 490, 40, 0);    /* 491..530: 8-CTA clusters, spread | per-warp tiles */
    check_attention_rows(32, 4, 128, 1, 2030, 40, 0);   /* 2031..2070: buckets 1 and 2 */
    check_attention_rows(32, 4, 128, 1, 100, 40, 1);    /* the one-row launches themselves */
    /* f32 caches; d 64 (gpt-oss: 64 / 8 heads); no GQA; a group of 4 */
    check_attention_rows(32, 4, 128, 0, 490, 40, 0);
    check_attention_rows(64, 8, 64, 1, 0, 140, 0);
    check_attention_rows(64, 8, 64, 0, 2040, 16, 0);
    check_attention_rows(16, 16, 64, 1, 495, 24, 0);
    check_attention_rows(8, 2, 128, 1, 1000, 24, 0);
    /* shapes k_attn_rows leaves to one-row launches: a group of 16, d 256 */
    check_attention_rows(64, 4, 128, 1, 120, 16, 0);
    check_attention_rows(16, 2, 256, 1, 120, 16, 0);
}

/* cuda_attention_decode_fused == cuda_qk_norm_rope_store +
 * cuda_attention_decode, bit for bit: the output and both caches (every
 * byte, the untouched positions included). The caches hold random rows
 * below p and poison from p on; `cl` caps the cluster size (0: the
 * device's), `gb` forces the heads a CTA (0: the heuristic), so the row's
 * position lands in the first or a later tile of its slice, in the spread
 * and the per-warp-tile paths, with one or several head groups a KV head
 * (one of them stores). */
static void check_attention_fused(int H, int Hkv, int D, int n_rot, int f16, int p, int cl, int gb)
{
    const int n_ctx = p + 1;
    const size_t qn = (size_t)H * D, kvd = (size_t)Hkv * D, es = f16 ? 2 : 4, cb = (size_t)n_ctx * kvd * es;
    float *h = xmalloc(sizeof(float) * (qn + 2 * kvd)), *w = xmalloc(sizeof(float) * 2 * D);
    for (size_t i = 0; i < qn + 2 * kvd; i++) h[i] = frand() * 3.0f;
    for (int i = 0; i < 2 * D; i++) w[i] = 0.5f + frand();
    uint8_t *cache = xmalloc(cb);
    memset(cache, 0x5A, cb);
    for (size_t i = 0; i < (size_t)p * kvd; i++) {
        const float x = frand();
        if (f16) { const uint16_t v = fp32_to_fp16(x); memcpy(cache + 2 * i, &v, 2); }
        else memcpy(cache + 4 * i, &x, 4);
    }
    err e = {0};
    float *qa = dev_from(h, sizeof(float) * (qn + 2 * kvd)), *qb = dev_from(h, sizeof(float) * (qn + 2 * kvd));
    float *dw = dev_from(w, sizeof(float) * 2 * D);
    void *kca = dev_from(cache, cb), *vca = dev_from(cache, cb), *kcb = dev_from(cache, cb), *vcb = dev_from(cache, cb);
    float *oa = dev_alloc(sizeof(float) * qn), *ob = dev_alloc(sizeof(float) * qn);
    dev_poison(oa, sizeof(float) * qn);
    dev_poison(ob, sizeof(float) * qn);
    int32_t *dp = dev_from(&p, sizeof p);
    const float scale = 1.0f / sqrtf((float)D);
    cuda_attention_force_cluster(g_cu, cl);
    cuda_attention_force_heads(g_cu, gb);
    CHECK_MSG(cuda_qk_norm_rope_store(g_cu, qa, qa + qn, qa + qn + kvd, dw, dw + D, H, Hkv, D, n_rot, dp, 1e6f, 1.0f,
                                      1e-6f, kca, vca, f16, &e) == 0 &&
                  cuda_attention_decode(g_cu, oa, qa, 1, H, Hkv, D, kca, f16, vca, f16, dp, p + 1, scale, &e) == 0,
              "%s", e.msg);
    CHECK_MSG(cuda_attention_decode_fused(g_cu, ob, qb, qb + qn, qb + qn + kvd, dw, dw + D, H, Hkv, D, n_rot, dp, 1e6f,
                                          1.0f, 1e-6f, kcb, vcb, f16, p + 1, scale, &e) == 0,
              "%s", e.msg);
    cuda_attention_force_cluster(g_cu, 0);
    cuda_attention_force_heads(g_cu, 0);
    const size_t ob_n = sizeof(float) * qn, tot = ob_n + 2 * cb;
    uint8_t *a = xmalloc(tot), *b = xmalloc(tot);
    download(a, oa, ob_n); download(a + ob_n, kca, cb); download(a + ob_n + cb, vca, cb);
    download(b, ob, ob_n); download(b + ob_n, kcb, cb); download(b + ob_n + cb, vcb, cb);
    const long long d = first_diff(a, b, tot);
    const char *where = d < 0 ? "" : d < (long long)ob_n ? "output" : d < (long long)(ob_n + cb) ? "K cache" : "V cache";
    CHECK_MSG(d < 0, "attention fused heads %d/%d d=%d n_rot=%d %s pos %d cluster %d heads %d: first difference at "
              "byte %lld (%s)", H, Hkv, D, n_rot, f16 ? "f16" : "f32", p, cl, gb, d, where);
    printf("  attention fused heads %d/%d d=%d n_rot=%d %s pos %d cluster %d heads %d: %s\n", H, Hkv, D, n_rot,
           f16 ? "f16" : "f32", p, cl, gb, d < 0 ? "bit-identical to the two launches" : "DIFFERS");
    cuda_free(g_cu, qa); cuda_free(g_cu, qb); cuda_free(g_cu, dw); cuda_free(g_cu, dp);
    cuda_free(g_cu, kca); cuda_free(g_cu, vca); cuda_free(g_cu, kcb); cuda_free(g_cu, vcb);
    cuda_free(g_cu, oa); cuda_free(g_cu, ob);
    free(h); free(w); free(cache); free(a); free(b);
}

TEST(test_attention_fused)
{
    /* Qwen3-30B-A3B: spread (first tile, second tile, cluster ranks > 0),
     * then per-warp tiles past 1024 positions */
    static const int pos[] = { 0, 5, 31, 32, 40, 63, 64, 100, 700, 1023, 1024, 1500, 3000 };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        check_attention_fused(32, 4, 128, 128, 1, pos[i], 0, 0);
        check_attention_fused(32, 4, 128, 128, 0, pos[i], 1, 0);   /* one CTA: 64 positions spread, then tiles */
    }
    check_attention_fused(32, 4, 128, 128, 1, 45, 2, 1);   /* eight head groups a KV head */
    check_attention_fused(32, 4, 128, 128, 1, 45, 4, 8);   /* one: all 8 warps on q heads, K on warp 0 */
    check_attention_fused(32, 4, 128, 128, 0, 1800, 0, 2);
    check_attention_fused(16, 16, 64, 32, 0, 40, 0, 0);    /* MHA, partial rotation, f32 */
    check_attention_fused(16, 16, 64, 32, 1, 2000, 0, 0);
    check_attention_fused(8, 2, 80, 64, 1, 70, 0, 0);      /* generic d (per-warp tiles only) */
    check_attention_fused(8, 2, 80, 80, 0, 1, 1, 0);
    check_attention_fused(16, 2, 256, 256, 0, 33, 0, 0);   /* d 256 */
    check_attention_fused(16, 2, 256, 192, 1, 1300, 0, 0);
    err e = {0};
    float x = 0;
    CHECK(cuda_attention_decode_fused(g_cu, &x, &x, &x, &x, &x, &x, 4, 4, 64, 65, NULL, 1e6f, 1.0f, 1e-6f, &x, &x, 1,
                                      1, 0.1f, &e) == ERR_USAGE);   /* odd n_rot */
    CHECK(cuda_attention_decode_fused(g_cu, &x, &x, &x, &x, &x, &x, 4, 4, 64, 64, NULL, 1e6f, 1.0f, 1e-6f, &x, &x, 1,
                                      1, 0.1f, &e) == ERR_USAGE);   /* out == q */
}

/* ==== combine, add ==== */

static void check_combine(int rows, int k, int64_t n)
{
    float *x = xmalloc(sizeof(float) * (size_t)(rows * n)), *ref = xmalloc(sizeof(float) * (size_t)(rows * n));
    float *got = xmalloc(sizeof(float) * (size_t)(rows * n));
    float *eo = xmalloc(sizeof(float) * (size_t)(rows * k * n)), *w = xmalloc(sizeof(float) * (size_t)(rows * k));
    for (int64_t i = 0; i < rows * n; i++) x[i] = frand() * 10.0f;
    for (int64_t i = 0; i < rows * k * n; i++) eo[i] = frand() * 3.0f;
    for (int i = 0; i < rows * k; i++) w[i] = (frand() + 1.0f) * 0.2f;
    /* qwen3moe.c: moe_down_item scales y = y * w, moe_sum_row adds (((y0 + y1) + y2) + ...) + x */
    for (int r = 0; r < rows; r++)
        for (int64_t c = 0; c < n; c++) {
            float acc = eo[((size_t)r * k) * n + c] * w[r * k];
            for (int s = 1; s < k; s++) {
                const float y = eo[((size_t)r * k + s) * n + c] * w[r * k + s];
                acc += y;
            }
            ref[r * n + c] = acc + x[r * n + c];
        }
    float *dx = dev_from(x, sizeof(float) * (size_t)(rows * n));
    float *de = dev_from(eo, sizeof(float) * (size_t)(rows * k * n)), *dw = dev_from(w, sizeof(float) * (size_t)(rows * k));
    err e = {0};
    CHECK_MSG(cuda_moe_combine(g_cu, dx, de, dw, rows, k, n, &e) == 0, "%s", e.msg);
    download(got, dx, sizeof(float) * (size_t)(rows * n));
    const long long d = first_diff(ref, got, sizeof(float) * (size_t)(rows * n));
    CHECK_MSG(d < 0, "moe_combine rows=%d k=%d: first difference at float %lld", rows, k, d / 4);
    printf("  moe_combine rows=%d k=%d n=%lld: %s\n", rows, k, (long long)n, d < 0 ? "bit-identical" : "DIFFERS");
    cuda_free(g_cu, dx); cuda_free(g_cu, de); cuda_free(g_cu, dw);
    free(x); free(ref); free(got); free(eo); free(w);
}

TEST(test_combine)
{
    check_combine(1, 8, 2048);
    check_combine(3, 8, 2048);
    check_combine(2, 1, 100);
}

/* The fused combine + norm + quantization against the two calls it
 * replaces in the decode (cuda_moe_combine, then cuda_rmsnorm_quant), on
 * the same inputs: x, y and xq byte for byte. The row's first 32 values
 * combine to zeros (an all-zero block). alias: y = x (in place). */
static void check_combine_norm(int wtype, int k, int n, int alias)
{
    const size_t ab = cuda_act_bytes(wtype, n), xb = sizeof(float) * (size_t)n;
    float *x = xmalloc(xb), *w = xmalloc(xb), *eo = xmalloc(xb * (size_t)k), *wt = xmalloc(sizeof(float) * (size_t)k);
    for (int i = 0; i < n; i++) { x[i] = frand() * 10.0f; w[i] = 0.5f + frand(); }
    for (size_t i = 0; i < (size_t)k * n; i++) eo[i] = frand() * 3.0f;
    for (int t = 0; t < k; t++) wt[t] = (frand() + 1.0f) * 0.2f;
    for (int j = 0; j < 32; j++) {
        x[j] = 0.f;
        for (int t = 0; t < k; t++) eo[(size_t)t * n + j] = 0.f;
    }
    float *x1 = xmalloc(xb), *x2 = xmalloc(xb), *y1 = xmalloc(xb), *y2 = xmalloc(xb);
    uint8_t *q1 = xmalloc(ab), *q2 = xmalloc(ab);
    float *dx = dev_from(x, xb), *de = dev_from(eo, xb * (size_t)k), *dwt = dev_from(wt, sizeof(float) * (size_t)k);
    float *dw = dev_from(w, xb), *dy = dev_alloc(xb);
    void *dq = dev_alloc(ab);
    float *ydst = alias ? dx : dy;
    err e = {0};
    /* the two calls */
    dev_poison(dy, xb);
    dev_poison(dq, ab);
    CHECK_MSG(cuda_moe_combine(g_cu, dx, de, dwt, 1, k, n, &e) == 0, "%s", e.msg);
    CHECK_MSG(cuda_rmsnorm_quant(g_cu, wtype, ydst, dq, dx, dw, n, 1e-6f, &e) == 0, "%s", e.msg);
    download(x1, dx, xb);
    download(y1, ydst, xb);
    download(q1, dq, ab);
    /* the fused launch on the same inputs */
    CHECK(cuda_upload(g_cu, dx, x, xb, &e) == 0);
    dev_poison(dy, xb);
    dev_poison(dq, ab);
    CHECK_MSG(cuda_moe_combine_rmsnorm_quant(g_cu, wtype, dx, de, dwt, k, ydst, dq, dw, n, 1e-6f, &e) == 0, "%s",
              e.msg);
    download(x2, dx, xb);
    download(y2, ydst, xb);
    download(q2, dq, ab);
    const long long dx_ = first_diff(x1, x2, xb), dy_ = first_diff(y1, y2, xb), dq_ = first_diff(q1, q2, ab);
    CHECK_MSG(dx_ < 0 && dy_ < 0 && dq_ < 0, "combine_rmsnorm_quant %s k=%d n=%d%s: first difference in x at float "
              "%lld, y at float %lld, xq at byte %lld", qtype_name(wtype), k, n, alias ? " (y = x)" : "", dx_ / 4,
              dy_ / 4, dq_);
    printf("  moe_combine_rmsnorm_quant %s k=%d n=%d%s: x, y, xq %s\n", qtype_name(wtype), k, n,
           alias ? " (y = x)" : "", dx_ < 0 && dy_ < 0 && dq_ < 0 ? "bit-identical" : "DIFFER");
    cuda_free(g_cu, dx); cuda_free(g_cu, de); cuda_free(g_cu, dwt); cuda_free(g_cu, dw); cuda_free(g_cu, dy);
    cuda_free(g_cu, dq);
    free(x); free(w); free(eo); free(wt); free(x1); free(x2); free(y1); free(y2); free(q1); free(q2);
}

TEST(test_combine_norm)
{
    /* weights whose activations are Q8_0, Q8_1, Q8_K blocks */
    static const int qt[] = { QTYPE_Q8_0, QTYPE_Q4_1, QTYPE_Q4_K };
    static const int shapes[][2] = { {8, 2048}, {1, 4096}, {9, 1024}, {17, 736}, {3, CUDA_RMSQ_MAXN} };
    for (size_t t = 0; t < sizeof qt / sizeof qt[0]; t++) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (!cuda_act_bytes(qt[t], shapes[i][1])) continue;   /* Q8_K: n % 256 */
            check_combine_norm(qt[t], shapes[i][0], shapes[i][1], 0);
        }
        check_combine_norm(qt[t], 8, 2048, 1);
    }
}

TEST(test_add)
{
    const int64_t n = 3 * 2048 + 5;
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n);
    float *got = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) { a[i] = frand() * 100.0f; b[i] = frand(); ref[i] = a[i] + b[i]; }
    float *da = dev_from(a, sizeof(float) * n), *db = dev_from(b, sizeof(float) * n);
    err e = {0};
    CHECK_MSG(cuda_add(g_cu, da, da, db, n, &e) == 0, "%s", e.msg);   /* y = a in place */
    download(got, da, sizeof(float) * n);
    CHECK(first_diff(ref, got, sizeof(float) * n) < 0);
    cuda_free(g_cu, da); cuda_free(g_cu, db);
    free(a); free(b); free(ref); free(got);
}

/* ==== argmax ==== */

static void check_argmax(int64_t n)
{
    enum { R = 9 };
    float *x = xmalloc(sizeof(float) * (size_t)(R * n));
    for (int64_t i = 0; i < R * n; i++) x[i] = frand() * 20.0f;
    float *r;
    const int64_t a1 = n / 3 + 1, a2 = n / 2;   /* inside the row for every n >= 16 */
    r = x + 1 * n; r[a1] = 50.0f; r[n - 7] = 50.0f;               /* tie: lower index */
    r = x + 2 * n; r[5] = NAN; r[a2] = 60.0f; r[a2 - 1] = NAN; r[a2 + 1] = NAN; r[n - 1] = NAN;   /* NaNs never win */
    r = x + 3 * n; r[0] = NAN; r[a1] = 70.0f;                     /* NaN at 0: the CPU keeps 0 */
    r = x + 4 * n; for (int64_t i = 0; i < n; i++) r[i] = -INFINITY;
    r = x + 5 * n; r[n - 1] = 80.0f;                              /* last index */
    r = x + 6 * n; for (int64_t i = 0; i < n; i++) r[i] = 1.5f;   /* all equal */
    r = x + 7 * n;   /* equal maxima on both sides of the device's slice edges (16 slices, multiples of 4) */
    const int64_t per = ((n + 15) / 16 + 3) / 4 * 4;
    for (int64_t s = 1; s < 16 && s * per < n; s++) { r[s * per - 1] = 90.0f; r[s * per] = 90.0f; }
    r[per] = 95.0f; r[per - 1] = 95.0f; r[n / 2 + 1] = 95.0f;
    r = x + 8 * n; for (int64_t i = 1; i < n; i++) r[i] = NAN; r[0] = -3.0f;   /* all NaN but 0 */
    sampler_opts o = sampler_default_opts();
    o.temp = 0.0f;
    o.repeat_last_n = 0;
    o.repeat_penalty = 1.0f;
    sampler *sm = NULL;
    err e = {0};
    CHECK_MSG(sampler_open(&sm, &o, (int32_t)n, &e) == 0, "%s", e.msg);
    int32_t ref[R], got[R];
    for (int i = 0; i < R; i++) ref[i] = sampler_sample(sm, x + (size_t)i * n);
    float *dx = dev_from(x, sizeof(float) * (size_t)(R * n));
    int32_t *dout = dev_alloc(sizeof got);
    dev_poison(dout, sizeof got);
    CHECK_MSG(cuda_argmax(g_cu, dout, dx, R, n, &e) == 0, "%s", e.msg);
    download(got, dout, sizeof got);
    for (int i = 0; i < R; i++) CHECK_MSG(got[i] == ref[i], "argmax n=%lld row %d: gpu %d cpu %d", (long long)n, i, got[i], ref[i]);
    CHECK_EQ_INT(ref[1], a1);
    CHECK_EQ_INT(ref[2], a2);
    CHECK_EQ_INT(ref[3], 0);
    CHECK_EQ_INT(ref[4], 0);
    CHECK_EQ_INT(ref[5], n - 1);
    CHECK_EQ_INT(ref[6], 0);
    CHECK_EQ_INT(ref[8], 0);
    CHECK_EQ_INT(ref[7], per - 1);
    /* one row alone */
    CHECK_MSG(cuda_argmax(g_cu, dout, dx + 2 * n, 1, n, &e) == 0, "%s", e.msg);
    download(got, dout, sizeof(int32_t));
    CHECK_EQ_INT(got[0], ref[2]);
    printf("  argmax n=%lld x %d rows: %s\n", (long long)n, R, test_g.case_failed ? "DIFFERS" : "identical");
    sampler_close(sm);
    cuda_free(g_cu, dx); cuda_free(g_cu, dout);
    free(x);
}

TEST(test_argmax)
{
    check_argmax(151936);
    check_argmax(32768);
    check_argmax(37);
}

/* ==== bench ==== */

static float time_ms(int (*fn)(void *), void *arg, int iters)
{
    err e = {0};
    fn(arg);
    cuda_timer_begin(g_cu, &e);
    for (int i = 0; i < iters; i++) fn(arg);
    float ms = 0;
    if (cuda_timer_end(g_cu, &ms, &e)) { fprintf(stderr, "bench: %s\n", e.msg); exit(2); }
    return ms / iters;
}

/* Microseconds a call of fn when `calls` calls are captured in one graph
 * and the graph is replayed `reps` times (after one warm-up replay). */
static float graph_us(int (*fn)(void *), void *arg, int calls, int reps)
{
    err e = {0};
    cuda_graph *g = NULL;
    int rc = cuda_graph_begin(g_cu, &e);
    for (int i = 0; !rc && i < calls; i++) rc = fn(arg);
    if (cuda_graph_end(g_cu, &g, &e) || rc) { fprintf(stderr, "bench: graph: %s\n", e.msg); exit(2); }
    float ms = 0;
    if (cuda_graph_launch(g_cu, g, &e) || cuda_timer_begin(g_cu, &e)) { fprintf(stderr, "bench: %s\n", e.msg); exit(2); }
    for (int r = 0; r < reps; r++) cuda_graph_launch(g_cu, g, &e);
    if (cuda_timer_end(g_cu, &ms, &e)) { fprintf(stderr, "bench: %s\n", e.msg); exit(2); }
    cuda_graph_free(g);
    return ms * 1e3f / (float)(calls * reps);
}

typedef struct attn_bench { float *out, *q; void *k, *v; int32_t *pos; int f16, n_kv; } attn_bench;
static int run_attn(void *p)
{
    attn_bench *a = p;
    return cuda_attention_decode(g_cu, a->out, a->q, 1, 32, 4, 128, a->k, a->f16, a->v, a->f16, a->pos, a->n_kv,
                                 0.08838834764831845f, NULL);
}
typedef struct am_bench { int32_t *out; float *x; int64_t n; } am_bench;
static int run_argmax(void *p) { am_bench *a = p; return cuda_argmax(g_cu, a->out, a->x, 1, a->n, NULL); }
typedef struct gr_bench { void *w; int32_t *ids; float *out; } gr_bench;
static int run_get_rows(void *p)
{
    gr_bench *a = p;
    return cuda_get_rows(g_cu, QTYPE_Q6_K, a->w, 2048 / 256 * 210, 1000, 2048, a->ids, 1, a->out, NULL, NULL);
}
typedef struct rope_bench { float *x; int32_t *pos; } rope_bench;
static int run_rope(void *p) { rope_bench *a = p; return cuda_rope_neox(g_cu, a->x, 1, 32, 128, 128, a->pos, 1e6f, 1.0f, NULL); }
static int run_combine(void *p) { float **a = p; return cuda_moe_combine(g_cu, a[0], a[1], a[2], 1, 8, 2048, NULL); }
/* a decode layer's end and the next one's start: a[0] x, a[1] eout, a[2]
 * weights and norm, a[3] y, a[4] xq (Q8_0 weights, n 2048, k 8) */
static int run_combine_then_norm(void *p)
{
    float **a = p;
    const int rc = cuda_moe_combine(g_cu, a[0], a[1], a[2], 1, 8, 2048, NULL);
    return rc ? rc : cuda_rmsnorm_quant(g_cu, QTYPE_Q8_0, a[3], a[4], a[0], a[2], 2048, 1e-6f, NULL);
}
static int run_norm_quant(void *p)
{
    float **a = p;
    return cuda_rmsnorm_quant(g_cu, QTYPE_Q8_0, a[3], a[4], a[0], a[2], 2048, 1e-6f, NULL);
}
static int run_combine_norm(void *p)
{
    float **a = p;
    return cuda_moe_combine_rmsnorm_quant(g_cu, QTYPE_Q8_0, a[0], a[1], a[2], 8, a[3], a[4], a[2], 2048, 1e-6f, NULL);
}

/* --bench-rows: a prompt chunk's attention (Qwen3-30B-A3B's shape: 32 / 4
 * heads, d 128, f16 caches), cuda_attention_rows by k_attn_rows against
 * the one-row launches it replaced (cuda_attention_force_one_row), for
 * chunks at several positions: 5 alternating rounds of 10 calls each,
 * medians; the two outputs compared by memcmp. `--bench-rows P0 NQ`: only
 * rows P0 .. P0 + NQ - 1 (P0 + NQ <= 4096, NQ <= 256; e.g. under ncu). */
typedef struct rows_bench { float *out, *q; void *k, *v; int32_t *pos; int n_q, p0; } rows_bench;
static int run_rows(void *p)
{
    rows_bench *a = p;
    return cuda_attention_rows(g_cu, a->out, a->q, a->n_q, 32, 4, 128, a->k, 1, a->v, 1, a->pos, a->p0,
                               1.0f / sqrtf(128.0f), NULL);
}
static void bench_rows(int p0, int nq)
{
    static const int all[][2] = { { 0, 192 }, { 0, 256 }, { 192, 192 }, { 512, 256 }, { 1856, 256 }, { 3840, 256 } };
    const int one[1][2] = { { p0, nq } };
    const int (*cases)[2] = nq > 0 ? one : all;
    const size_t n_cases = nq > 0 ? 1 : sizeof all / sizeof all[0];
    enum { QD = 32 * 128, KVD = 4 * 128, NCTX = 4096, ROUNDS = 5 };
    err e = {0};
    float *q = xmalloc(sizeof(float) * QD * 256);
    uint16_t *kv = xmalloc(2 * (size_t)KVD * NCTX);
    for (size_t i = 0; i < (size_t)QD * 256; i++) q[i] = frand() * 2.0f;
    for (size_t i = 0; i < (size_t)KVD * NCTX; i++) kv[i] = fp32_to_fp16(frand());
    rows_bench a = { dev_alloc(sizeof(float) * QD * 256), dev_from(q, sizeof(float) * QD * 256),
                     dev_from(kv, 2 * (size_t)KVD * NCTX), NULL, dev_alloc(sizeof(int32_t)), 0, 0 };
    for (size_t i = 0; i < (size_t)KVD * NCTX; i++) kv[i] = fp32_to_fp16(frand());
    a.v = dev_from(kv, 2 * (size_t)KVD * NCTX);
    float *o1 = xmalloc(sizeof(float) * QD * 256), *o2 = xmalloc(sizeof(float) * QD * 256);
    for (size_t c = 0; c < n_cases; c++) {
        a.p0 = cases[c][0];
        a.n_q = cases[c][1];
        cuda_upload(g_cu, a.pos, &a.p0, sizeof a.p0, &e);
        float tr[ROUNDS], to[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            cuda_attention_force_one_row(g_cu, 1);
            to[r] = time_ms(run_rows, &a, 10) * 1e3f;
            cuda_attention_force_one_row(g_cu, 0);
            tr[r] = time_ms(run_rows, &a, 10) * 1e3f;
        }
        run_rows(&a);
        download(o1, a.out, sizeof(float) * QD * a.n_q);
        cuda_attention_force_one_row(g_cu, 1);
        run_rows(&a);
        cuda_attention_force_one_row(g_cu, 0);
        download(o2, a.out, sizeof(float) * QD * a.n_q);
        const float mo = median_float(to, ROUNDS), mr = median_float(tr, ROUNDS);
        printf("bench: attention rows %d..%d (32/4 heads, d 128, f16): one-row launches %.1f us, k_attn_rows %.1f us: "
               "%.2fx; outputs %s\n", a.p0, a.p0 + a.n_q - 1, mo, mr, mo / mr,
               memcmp(o1, o2, sizeof(float) * QD * a.n_q) ? "DIFFER" : "bit-identical");
    }
    if (cuda_sync(g_cu, &e)) fprintf(stderr, "bench: %s\n", e.msg);
    cuda_free(g_cu, a.out); cuda_free(g_cu, a.q); cuda_free(g_cu, a.k); cuda_free(g_cu, a.v); cuda_free(g_cu, a.pos);
    free(q); free(kv); free(o1); free(o2);
}

static void bench(void)
{
    const int n_ctx = 32768;
    const size_t rs = 4 * 128;
    attn_bench a;
    a.q = dev_alloc(sizeof(float) * 32 * 128);
    a.out = dev_alloc(sizeof(float) * 32 * 128);
    a.k = dev_alloc(4 * rs * n_ctx);
    a.v = dev_alloc(4 * rs * n_ctx);
    a.pos = dev_alloc(sizeof(int32_t));
    err e = {0};
    cuda_memset(g_cu, a.q, 0, sizeof(float) * 32 * 128, &e);
    cuda_memset(g_cu, a.k, 0x11, 4 * rs * n_ctx, &e);
    cuda_memset(g_cu, a.v, 0x11, 4 * rs * n_ctx, &e);
    static const int ps[] = { 0, 150, 511, 1023, 2047, 2999, 8191, 32767 };
    for (int f16 = 1; f16 >= 0; f16--)
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
            a.f16 = f16;
            cuda_upload(g_cu, a.pos, &ps[i], sizeof(int32_t), &e);
            a.n_kv = ps[i] + 1;
            const float ms = time_ms(run_attn, &a, 50);
            const double bytes = 2.0 * (ps[i] + 1) * rs * (f16 ? 2 : 4);
            printf("bench: attention 32/4 heads d=128 %s pos %5d: %7.2f us (%.0f GB/s of K+V)\n", f16 ? "f16" : "f32",
                   ps[i], ms * 1e3, bytes / (ms * 1e-3) / 1e9);
        }
    /* as the decode graph runs it: 20 calls captured in a graph (each a
     * programmatic dependent of the one before), replayed 10 times */
    a.f16 = 1;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        cuda_upload(g_cu, a.pos, &ps[i], sizeof(int32_t), &e);
        a.n_kv = ps[i] + 1;
        printf("bench: attention 32/4 heads d=128 f16 pos %5d, graph of 20: %7.2f us a call\n", ps[i],
               graph_us(run_attn, &a, 20, 10));
    }
    /* the cluster size: capped at 1, 2, 4, 8 against the default */
    static const int pc[] = { 0, 150, 2999 };
    for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++) {
        a.f16 = 1;
        cuda_upload(g_cu, a.pos, &pc[i], sizeof(int32_t), &e);
        a.n_kv = pc[i] + 1;
        printf("bench: attention f16 pos %5d by cluster cap:", pc[i]);
        for (int cap = 1; cap <= 16; cap *= 2) {
            cuda_attention_force_cluster(g_cu, cap == 16 ? 0 : cap);
            if (cap == 16) printf(" default");
            else printf(" %d", cap);
            printf(" %.2f us", time_ms(run_attn, &a, 50) * 1e3);
        }
        printf("\n");
    }
    cuda_attention_force_cluster(g_cu, 0);
    /* query heads a CTA: 1, 2, 4, 8 against the heuristic (4 on this shape) */
    static const int ph[] = { 0, 150, 511, 2999, 8191 };
    for (size_t i = 0; i < sizeof ph / sizeof ph[0]; i++) {
        a.f16 = 1;
        cuda_upload(g_cu, a.pos, &ph[i], sizeof(int32_t), &e);
        a.n_kv = ph[i] + 1;
        printf("bench: attention f16 pos %5d by heads a CTA:", ph[i]);
        for (int gb = 1; gb <= 8; gb *= 2) {
            cuda_attention_force_heads(g_cu, gb);
            printf(" %d %.2f us", gb, time_ms(run_attn, &a, 50) * 1e3);
        }
        cuda_attention_force_heads(g_cu, 0);
        printf(" default %.2f us\n", time_ms(run_attn, &a, 50) * 1e3);
    }
    am_bench am = { a.pos, a.k, 151936 };
    printf("bench: argmax 151936: %.2f us\n", time_ms(run_argmax, &am, 100) * 1e3);
    int32_t *ids = dev_alloc(sizeof(int32_t));
    cuda_memset(g_cu, ids, 0, sizeof(int32_t), &e);
    gr_bench gr = { a.k, ids, a.out };
    printf("bench: get_rows q6_K 2048: %.2f us\n", time_ms(run_get_rows, &gr, 100) * 1e3);
    rope_bench rp = { a.q, ids };
    printf("bench: rope 32 heads: %.2f us\n", time_ms(run_rope, &rp, 100) * 1e3);
    float *cb[3] = { a.out, a.k, a.v };
    printf("bench: moe_combine k=8 n=2048: %.2f us\n", time_ms(run_combine, cb, 100) * 1e3);
    /* as the decode graph chains them (each a programmatic dependent of
     * the one before): combine then rmsnorm_quant, against the fused launch */
    {
        float *y = dev_alloc(sizeof(float) * 2048), *xq = dev_alloc(4096);
        cuda_memset(g_cu, a.k, 0, 4 * 8 * 2048, &e);   /* finite inputs (0x11 bytes are tiny floats too) */
        float *cn[5] = { a.out, a.k, a.v, y, xq };
        const float two = graph_us(run_combine_then_norm, cn, 20, 10), one = graph_us(run_combine_norm, cn, 20, 10);
        const float c1 = graph_us(run_combine, cn, 20, 10), n1 = graph_us(run_norm_quant, cn, 20, 10);
        printf("bench: graphs of 20 dependent calls, k=8 n=2048 Q8_0: moe_combine %.2f us, rmsnorm_quant %.2f us, "
               "the two %.2f us a pair, moe_combine_rmsnorm_quant %.2f us\n", c1, n1, two, one);
        cuda_free(g_cu, y); cuda_free(g_cu, xq);
    }
    if (cuda_sync(g_cu, &e)) fprintf(stderr, "bench: %s\n", e.msg);
    cuda_free(g_cu, a.q); cuda_free(g_cu, a.out); cuda_free(g_cu, a.k); cuda_free(g_cu, a.v);
    cuda_free(g_cu, a.pos); cuda_free(g_cu, ids);
}

int main(int argc, char **argv)
{
    const int do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    const int do_rows = argc > 1 && strcmp(argv[1], "--bench-rows") == 0;
    const int only_attn = argc > 1 && strcmp(argv[1], "attention") == 0;   /* e.g. under compute-sanitizer */
    err e = {0};
    if (cuda_open(&g_cu, 0, &e) != 0) {
        printf("cuda_layer: skipped: %s\n", e.msg);
        test_g.passed++;   /* the skip counts as passed: no GPU is not a failure */
        return test_summary("cuda_layer");
    }
    printf("cuda_layer: device %s\n", cuda_device_name(g_cu));
    if (do_bench || do_rows) {
        if (do_rows) {
            const int p0 = argc > 3 ? atoi(argv[2]) : 0, nq = argc > 3 ? atoi(argv[3]) : 0;
            if (argc > 3 && (p0 < 0 || nq < 1 || nq > 256 || p0 + nq > 4096)) {
                fprintf(stderr, "cuda_layer: --bench-rows P0 NQ: rows %s..%s outside 0..4095 or more than 256\n",
                        argv[2], argv[3]);
                cuda_close(g_cu);
                return 2;
            }
            bench_rows(p0, nq);
        }
        else bench();
        cuda_close(g_cu);
        return 0;
    }
    g_tab = xmalloc(sizeof(float) * 65536);
    ops_f16_table_init(g_tab);
    if (only_attn) {
        RUN(test_attention);
        RUN(test_attention_fused);
        cuda_close(g_cu);
        free(g_tab);
        return test_summary("cuda_layer");
    }
    RUN(test_errors);
    RUN(test_get_rows);
    RUN(test_rope);
    RUN(test_kv_store);
    RUN(test_qk_fused);
    RUN(test_attention);
    RUN(test_attention_fused);
    RUN(test_combine);
    RUN(test_combine_norm);
    RUN(test_add);
    RUN(test_argmax);
    if (cuda_sync(g_cu, &e)) { fprintf(stderr, "cuda_layer: %s\n", e.msg); test_g.failed++; }
    cuda_close(g_cu);
    free(g_tab);
    return test_summary("cuda_layer");
}

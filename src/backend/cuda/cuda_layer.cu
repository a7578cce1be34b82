/* cuda_layer.cu: the rest of the decode token path -- embedding rows,
 * RoPE, the KV store, decode attention, the MoE combine, the residual add
 * and the greedy argmax (contracts in cuda_backend.h).
 *
 * Where the CPU's result is a fixed sequence of float operations (dequant,
 * RoPE rotation, f16 rounding, the combine) the kernels repeat it with
 * explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fsub_rn) so that
 * nvcc cannot contract a product and a sum into an FMA: those results are
 * bit-identical. Attention and argmax are reductions spread over many
 * threads; attention agrees within a stated tolerance, argmax exactly.
 *
 * Attention and argmax use thread block clusters (sm_90): the CTAs of one
 * cluster split the positions (or the row) and merge their partial results
 * through distributed shared memory, so neither needs global scratch nor a
 * second launch. The cluster size is the largest the device grants (up to
 * 16), found once per kernel and device, capped for the decode attention
 * by its context's bucket (cuda_attention_bucket: 4, 8 or 16); a launch the
 * driver refuses with clusters runs again with clusters of one CTA (the
 * same kernel, slower). */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_qdot.cuh"   /* qd_f2h: fp32_to_fp16 on the device */
#include "backend/cuda/cuda_rows.cuh"

namespace cg = cooperative_groups;

/* ==== Exact conversions (util/fp16.h, quant_ref.c h2f) ==== */

/* quant_ref.c h2f (ggml's branch-free half -> float), integer-only: exact
 * for every half; a NaN comes out quieted with its payload kept, as the
 * x86 multiply in h2f leaves it. */
__device__ __forceinline__ float dev_h2f(uint32_t h)
{
    const uint32_t sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (ex == 0x1f) u = 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u);
    else if (ex == 0) return __uint_as_float(sign | __float_as_uint((float)man * 0x1.0p-24f));   /* exact */
    else u = ((ex + 112) << 23) | (man << 13);
    return __uint_as_float(sign | u);
}

/* Little-endian loads from byte addresses (blocks of 18, 22, 210 bytes ...
 * are not aligned for wider loads). */
__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return ld16(p) | (ld16(p + 2) << 16); }

/* ==== Cluster launches ====
 * cluster_size: the largest cluster (<= 16) the device grants `fn` at
 * `threads` threads a CTA, 1 where none; asked once per (kernel, device)
 * and remembered (a few entries; a lock keeps concurrent contexts apart). */
#define CL_MAX 16
#define CL_CACHE 64
static struct { const void *fn; int device, size; } g_cl[CL_CACHE];
static int g_cl_n;
static pthread_mutex_t g_cl_lock = PTHREAD_MUTEX_INITIALIZER;

static int cluster_size(const void *fn, int device, unsigned threads)
{
    pthread_mutex_lock(&g_cl_lock);
    for (int i = 0; i < g_cl_n; i++)
        if (g_cl[i].fn == fn && g_cl[i].device == device) {
            const int s = g_cl[i].size;
            pthread_mutex_unlock(&g_cl_lock);
            return s;
        }
    int n = 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(CL_MAX, 1, 1);
    cfg.blockDim = dim3(threads, 1, 1);
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaOccupancyMaxPotentialClusterSize(&n, fn, &cfg) != cudaSuccess) {
        cudaGetLastError();   /* not sticky: clear it */
        n = 8;                /* the portable size; the launch falls back to 1 if refused */
    }
    n = n > CL_MAX ? CL_MAX : n < 1 ? 1 : n;
    if (g_cl_n < CL_CACHE) g_cl[g_cl_n++] = { fn, device, n };
    pthread_mutex_unlock(&g_cl_lock);
    return n;
}

static void cluster_forget_to_one(const void *fn, int device)
{
    pthread_mutex_lock(&g_cl_lock);
    for (int i = 0; i < g_cl_n; i++)
        if (g_cl[i].fn == fn && g_cl[i].device == device) g_cl[i].size = 1;
    pthread_mutex_unlock(&g_cl_lock);
}

/* Launch fn on grid (cl, gy, gz) in clusters of (cl, 1, 1): the CTAs of a
 * cluster are blockIdx.x = 0..cl-1 of one (y, z); cl is the largest size
 * the device allows (at most CL_MAX), capped at cap when cap > 0. */
template <typename... KArgs, typename... Args>
static int launch_clustered(cuda_ctx *c, void (*fn)(KArgs...), unsigned gy, unsigned gz, unsigned threads, int cap,
                            err *e, const char *what, Args... args)
{
    const void *key = (const void *)fn;
    int cl = cluster_size(key, c->info.device, threads);
    if (cap > 0 && cap < cl) cl = cap;
    cuda_trace_name(c, what);
    for (;;) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)cl, gy, gz);
        cfg.blockDim = dim3(threads, 1, 1);
        cfg.stream = c->stream;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)cl;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;   /* cuda_launch's, when c->pdl */
        at[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = c->pdl ? 2 : 1;
        const cudaError_t rc = cudaLaunchKernelEx(&cfg, fn, args...);
        if (rc == cudaSuccess) return cuda_launch_check(e, what);
        cudaGetLastError();
        if (cl == 1) return cuda_fail(e, rc, what);
        cluster_forget_to_one(key, c->info.device);
        cl = 1;
    }
}

/* ==== get_rows: embedding rows, dequantized as quant_ref.c ====
 * One thread per output element; each reads the bytes of its block it
 * needs (cached) and repeats the reference's float operations for that
 * element in the same order. */
template <int T>
__device__ __forceinline__ float deq_elem(const uint8_t *row, int64_t e)
{
    if constexpr (T == QTYPE_F32) {
        return __uint_as_float(ld32(row + 4 * e));
    } else if constexpr (T == QTYPE_F16) {
        return dev_h2f(ld16(row + 2 * e));
    } else if constexpr (T == QTYPE_BF16) {
        return __uint_as_float(ld16(row + 2 * e) << 16);
    } else if constexpr (T == QTYPE_Q4_0) {   /* 18 B: d, qs[16] */
        const uint8_t *b = row + (e >> 5) * 18;
        const int j = (int)(e & 31);
        const int q = (j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4)) - 8;
        return __fmul_rn((float)q, dev_h2f(ld16(b)));
    } else if constexpr (T == QTYPE_Q4_1) {   /* 20 B: d, m, qs[16] */
        const uint8_t *b = row + (e >> 5) * 20;
        const int j = (int)(e & 31);
        const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, dev_h2f(ld16(b))), dev_h2f(ld16(b + 2)));
    } else if constexpr (T == QTYPE_Q5_0) {   /* 22 B: d, qh[4], qs[16] */
        const uint8_t *b = row + (e >> 5) * 22;
        const int j = (int)(e & 31);
        const uint32_t qh = ld32(b + 2);
        int q;
        if (j < 16) q = (int)((b[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
        else q = (int)((b[6 + j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10)) - 16;
        return __fmul_rn((float)q, dev_h2f(ld16(b)));
    } else if constexpr (T == QTYPE_Q5_1) {   /* 24 B: d, m, qh[4], qs[16] */
        const uint8_t *b = row + (e >> 5) * 24;
        const int j = (int)(e & 31);
        const uint32_t qh = ld32(b + 4);
        int q;
        if (j < 16) q = (int)((b[8 + j] & 0xF) | (((qh >> j) << 4) & 0x10));
        else q = (int)((b[8 + j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10));
        return __fadd_rn(__fmul_rn((float)q, dev_h2f(ld16(b))), dev_h2f(ld16(b + 2)));
    } else if constexpr (T == QTYPE_Q8_0) {   /* 34 B: d, qs[32] */
        const uint8_t *b = row + (e >> 5) * 34;
        return __fmul_rn((float)(int8_t)b[2 + (e & 31)], dev_h2f(ld16(b)));
    } else if constexpr (T == QTYPE_Q2_K) {   /* 84 B: scales[16], qs[64], d, dmin */
        const uint8_t *b = row + (e >> 8) * 84;
        const int j = (int)(e & 255), h = j >> 7, si = (j >> 5) & 3, l = j & 31;
        const int sc = b[h * 8 + si * 2 + (l >= 16)];
        const float dl = __fmul_rn(dev_h2f(ld16(b + 80)), (float)(sc & 0xF));
        const float ml = __fmul_rn(dev_h2f(ld16(b + 82)), (float)(sc >> 4));
        const int q = (b[16 + h * 32 + l] >> (2 * si)) & 3;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    } else if constexpr (T == QTYPE_Q3_K) {   /* 110 B: hmask[32], qs[64], scales[12], d */
        const uint8_t *b = row + (e >> 8) * 110;
        const int j = (int)(e & 255), h = j >> 7, si = (j >> 5) & 3, l = j & 31;
        const int is = h * 8 + si * 2 + (l >= 16);   /* quant_q3k_scales, one entry */
        const int a = is & 3, quarter = is >> 2;
        const uint8_t *s = b + 96;
        const int lo = quarter == 0 ? (s[a] & 0xF) : quarter == 1 ? (s[4 + a] & 0xF)
                     : quarter == 2 ? (s[a] >> 4) : (s[4 + a] >> 4);
        const int sc = lo | (((s[8 + a] >> (2 * quarter)) & 3) << 4);
        const float dl = __fmul_rn(dev_h2f(ld16(b + 108)), (float)(sc - 32));
        const int m = 1 << (h * 4 + si);
        const int q = ((b[32 + h * 32 + l] >> (2 * si)) & 3) - ((b[l] & m) ? 0 : 4);
        return __fmul_rn(dl, (float)q);
    } else if constexpr (T == QTYPE_Q4_K || T == QTYPE_Q5_K) {
        /* Q4_K 144 B: d, dmin, scales[12], qs[128]; Q5_K 176 B: the same
         * with qh[32] before qs */
        const int bytes = T == QTYPE_Q4_K ? 144 : 176, qs0 = T == QTYPE_Q4_K ? 16 : 48;
        const uint8_t *b = row + (e >> 8) * bytes;
        const int j = (int)(e & 255), g = j >> 6, hi = (j >> 5) & 1, l = j & 31, is = 2 * g + hi;
        const uint8_t *s = b + 4;
        int sc, mn;
        if (is < 4) { sc = s[is] & 63; mn = s[is + 4] & 63; }
        else { sc = (s[is + 4] & 0xF) | ((s[is - 4] >> 6) << 4); mn = (s[is + 4] >> 4) | ((s[is] >> 6) << 4); }
        const float d1 = __fmul_rn(dev_h2f(ld16(b)), (float)sc);
        const float m1 = __fmul_rn(dev_h2f(ld16(b + 2)), (float)mn);
        const int qb = b[qs0 + g * 32 + l];
        int q = hi ? qb >> 4 : qb & 0xF;
        if constexpr (T == QTYPE_Q5_K) q += (b[16 + l] & (1 << is)) ? 16 : 0;
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    } else {                                  /* Q6_K 210 B: ql[128], qh[64], scales[16], d */
        static_assert(T == QTYPE_Q6_K, "deq_elem: type");
        const uint8_t *b = row + (e >> 8) * 210;
        const int j = (int)(e & 255), h = j >> 7, k = j & 127, qq = k >> 5, l = k & 31;
        const uint8_t *ql = b + h * 64, *qh = b + 128 + h * 32;
        const int8_t *sc = (const int8_t *)(b + 192 + h * 8);
        const int lo = (qq & 1) ? ql[l + 32] : ql[l];
        const int q = (int)(int8_t)(((qq & 2) ? lo >> 4 : lo & 0xF) | (((qh[l] >> (2 * qq)) & 3) << 4)) - 32;
        return __fmul_rn(__fmul_rn(dev_h2f(ld16(b + 208)), (float)sc[(l >> 4) + 2 * qq]), (float)q);
    }
}

#define GR_THREADS 256
template <int T>
__global__ void __launch_bounds__(GR_THREADS)
k_get_rows(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows_w, int64_t n,
           const int32_t *__restrict__ ids, float *__restrict__ out, int32_t *bad)
{
    pdl_enter();
    const int r = blockIdx.y;
    const int32_t id = ids[r];
    const int ok = id >= 0 && (int64_t)id < n_rows_w;
    float *o = out + (size_t)r * n;
    const int64_t step = (int64_t)gridDim.x * GR_THREADS;
    int64_t i = (int64_t)blockIdx.x * GR_THREADS + threadIdx.x;
    if (!ok) {
        if (bad && i == 0) *bad = 1;
        for (; i < n; i += step) o[i] = 0.0f;
        return;
    }
    const uint8_t *row = w + (size_t)id * row_bytes;
    for (; i < n; i += step) o[i] = deq_elem<T>(row, i);
}

extern "C" int cuda_get_rows(cuda_ctx *c, int wtype, const void *w, size_t row_bytes, int64_t n_rows_w, int64_t n,
                             const int32_t *ids, int rows, float *out, int32_t *bad, err *e)
{
    uint64_t rb = 0;
    if (rows <= 0 || rows > 65535 || n <= 0 || n_rows_w <= 0 || qtype_row_bytes(wtype, n, &rb, NULL) || row_bytes < rb)
        return err_setf(e, ERR_USAGE, "cuda_get_rows: type %s n=%lld rows=%d n_rows_w=%lld row_bytes=%zu",
                        qtype_name(wtype), (long long)n, rows, (long long)n_rows_w, row_bytes);
    const int64_t chunks = (n + GR_THREADS * 4 - 1) / (GR_THREADS * 4);
    const dim3 grid((unsigned)(chunks > 1024 ? 1024 : chunks), (unsigned)rows);
    const uint8_t *wb = (const uint8_t *)w;
#define GR_CASE(T) \
    case T:                                                                                                       \
        return cuda_launch(c, k_get_rows<T>, grid, GR_THREADS, 0, e, "get_rows", wb, row_bytes, n_rows_w, n, ids, \
                           out, bad);
    switch (wtype) {
    GR_CASE(QTYPE_F32) GR_CASE(QTYPE_F16) GR_CASE(QTYPE_BF16)
    GR_CASE(QTYPE_Q4_0) GR_CASE(QTYPE_Q4_1) GR_CASE(QTYPE_Q5_0) GR_CASE(QTYPE_Q5_1) GR_CASE(QTYPE_Q8_0)
    GR_CASE(QTYPE_Q2_K) GR_CASE(QTYPE_Q3_K) GR_CASE(QTYPE_Q4_K) GR_CASE(QTYPE_Q5_K) GR_CASE(QTYPE_Q6_K)
    default:
        return err_setf(e, ERR_UNSUPPORTED, "cuda_get_rows: type %s has no device dequant", qtype_name(wtype));
    }
#undef GR_CASE
}

/* ==== RoPE (NeoX pairs), one CTA per row ====
 * theta_scale comes from the host's powf (the CPU's, bit for bit); each
 * pair's theta is the CPU's chain of float products; cos/sin are computed
 * in double and rounded once (correctly rounded floats; glibc's cosf/sinf
 * are within 1 ulp of that); the rotation repeats ops_rope_neox's rounded
 * products and sums. */
#define RP_THREADS 256
#define RP_MAXHALF 512
__global__ void __launch_bounds__(RP_THREADS)
k_rope(float *x, int n_head, int head_dim, int n_rot, const int32_t *__restrict__ pos, float theta_scale,
       float freq_scale)
{
    pdl_enter();
    __shared__ float cs[RP_MAXHALF], sn[RP_MAXHALF];
    const int half = n_rot / 2;
    float *xr = x + (size_t)blockIdx.x * n_head * head_dim;
    rope_table(cs, sn, half, pos[blockIdx.x], theta_scale, freq_scale, threadIdx.x, RP_THREADS);
    __syncthreads();
    for (int it = threadIdx.x; it < n_head * half; it += RP_THREADS) {
        const int h = it / half, i = it - h * half;
        rope_pair(xr + (size_t)h * head_dim, i, half, cs[i], sn[i]);
    }
}

/* ==== Fused: per-head Q/K RMSNorm, NeoX RoPE of q and k, K/V store ====
 * One CTA per head: blocks [0, n_head) the query heads, [n_head, n_head +
 * n_head_kv) the key heads (normed, rotated, stored), then n_head_kv value
 * heads (stored). Each CTA builds the RoPE table of its position itself
 * (recomputed per head: cheaper than a second launch). The same device
 * functions as k_rmsnorm, k_rope and k_kv_store, in the same order. */
__global__ void __launch_bounds__(RMS_THREADS)
k_qk_norm_rope_store(float *q, float *k, const float *__restrict__ v, const float *__restrict__ qw,
                     const float *__restrict__ kw, int n_head, int n_head_kv, int head_dim, int n_rot,
                     const int32_t *__restrict__ pos, float theta_scale, float freq_scale, float eps, void *kc,
                     void *vc, int f16, size_t q_stride, size_t kv_stride)
{
    pdl_enter();
    __shared__ double part[RMS_THREADS / 32];
    __shared__ float cs[RP_MAXHALF], sn[RP_MAXHALF];
    /* row blockIdx.y of a chunk: its q, k, v rows and its position */
    q += (size_t)blockIdx.y * q_stride;
    k += (size_t)blockIdx.y * kv_stride;
    v += (size_t)blockIdx.y * kv_stride;
    const int hb = blockIdx.x, half = n_rot / 2, p = pos[blockIdx.y];
    const size_t kvd = (size_t)n_head_kv * head_dim;
    if (hb >= n_head + n_head_kv) {   /* a value head: the store only */
        const int h = hb - n_head - n_head_kv;
        for (int i = threadIdx.x; i < head_dim; i += RMS_THREADS) {
            const size_t o = (size_t)p * kvd + (size_t)h * head_dim + i;
            const float x = v[(size_t)h * head_dim + i];
            if (f16) ((uint16_t *)vc)[o] = qd_f2h(x);
            else ((float *)vc)[o] = x;
        }
        return;
    }
    const int is_k = hb >= n_head, h = is_k ? hb - n_head : hb;
    float *row = (is_k ? k : q) + (size_t)h * head_dim;
    rms_row(row, row, is_k ? kw : qw, head_dim, eps, part);
    rope_table(cs, sn, half, p, theta_scale, freq_scale, threadIdx.x, RMS_THREADS);
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += RMS_THREADS) rope_pair(row, i, half, cs[i], sn[i]);
    if (!is_k) return;
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += RMS_THREADS) {
        const size_t o = (size_t)p * kvd + (size_t)h * head_dim + i;
        if (f16) ((uint16_t *)kc)[o] = qd_f2h(row[i]);
        else ((float *)kc)[o] = row[i];
    }
}

extern "C" int cuda_qk_norm_rope_store_rows(cuda_ctx *c, float *q, float *k, const float *v, int rows,
                                            const float *q_norm, const float *k_norm, int n_head, int n_head_kv,
                                            int head_dim, int n_rot, const int32_t *pos, float freq_base,
                                            float freq_scale, float eps, void *k_cache, void *v_cache, int f16,
                                            err *e)
{
    if (n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_rot <= 0 || (n_rot & 1) || n_rot > head_dim ||
        n_rot / 2 > RP_MAXHALF || rows <= 0 || rows > 65535)
        return err_setf(e, ERR_USAGE, "cuda_qk_norm_rope_store: n_head=%d n_head_kv=%d head_dim=%d n_rot=%d rows=%d",
                        n_head, n_head_kv, head_dim, n_rot, rows);
    const float theta_scale = powf(freq_base, -2.0f / n_rot);   /* host libm, as cuda_rope_neox */
    const dim3 grid((unsigned)(n_head + 2 * n_head_kv), (unsigned)rows);
    return cuda_launch(c, k_qk_norm_rope_store, grid, RMS_THREADS, 0, e, "qk_norm_rope_store", q, k, v, q_norm,
                       k_norm, n_head, n_head_kv, head_dim, n_rot, pos, theta_scale, freq_scale, eps, k_cache, v_cache,
                       f16, (size_t)n_head * head_dim, (size_t)n_head_kv * head_dim);
}

extern "C" int cuda_qk_norm_rope_store(cuda_ctx *c, float *q, float *k, const float *v, const float *q_norm,
                                       const float *k_norm, int n_head, int n_head_kv, int head_dim, int n_rot,
                                       const int32_t *pos, float freq_base, float freq_scale, float eps,
                                       void *k_cache, void *v_cache, int f16, err *e)
{
    return cuda_qk_norm_rope_store_rows(c, q, k, v, 1, q_norm, k_norm, n_head, n_head_kv, head_dim, n_rot, pos,
                                        freq_base, freq_scale, eps, k_cache, v_cache, f16, e);
}

extern "C" int cuda_rope_neox(cuda_ctx *c, float *x, int rows, int n_head, int head_dim, int n_rot,
                              const int32_t *pos, float freq_base, float freq_scale, err *e)
{
    if (rows <= 0 || n_head <= 0 || head_dim <= 0 || n_rot <= 0 || (n_rot & 1) || n_rot > head_dim ||
        n_rot / 2 > RP_MAXHALF)
        return err_setf(e, ERR_USAGE, "cuda_rope_neox: rows=%d n_head=%d head_dim=%d n_rot=%d", rows, n_head,
                        head_dim, n_rot);
    const float theta_scale = powf(freq_base, -2.0f / n_rot);   /* host libm: ops_rope_cache's value */
    return cuda_launch(c, k_rope, rows, RP_THREADS, 0, e, "rope_neox", x, n_head, head_dim, n_rot, pos, theta_scale,
                       freq_scale);
}

/* ==== KV store ==== */
__global__ void k_kv_store(void *cache, int f16, const float *__restrict__ src, int64_t total, int64_t kvd,
                           const int32_t *__restrict__ pos)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t o = (size_t)pos[0] * (size_t)kvd + (size_t)i;
    if (f16) ((uint16_t *)cache)[o] = qd_f2h(src[i]);
    else ((float *)cache)[o] = src[i];
}

extern "C" int cuda_kv_store(cuda_ctx *c, void *cache, int f16, const float *src, int rows, int64_t kvd,
                             const int32_t *pos, err *e)
{
    if (rows <= 0 || kvd <= 0) return err_setf(e, ERR_USAGE, "cuda_kv_store: rows=%d kvd=%lld", rows, (long long)kvd);
    const int64_t total = (int64_t)rows * kvd;
    return cuda_launch(c, k_kv_store, (unsigned)((total + 255) / 256), 256, 0, e, "kv_store", cache, f16, src, total,
                       kvd, pos);
}

/* ==== Decode attention ====
 * Grid (cluster, head group, query row). A head group is GB query heads of
 * one KV head (GQA: each K/V row is loaded once for all GB heads). The cl
 * CTAs of a cluster split the row's visible positions 0..pos+i into slices
 * (multiples of 32). A CTA works its slice one of two ways (chosen by the
 * slice length alone, so the same for every CTA of a row):
 *   per-warp tiles (slices longer than AT_SPREAD): warp w takes the
 *     32-position tiles w, w+8, ... of its slice. Per tile:
 *       scores   lane t holds position t: GB dot products of its K row
 *                (16-byte loads) with the queries in shared memory, times
 *                scale;
 *       softmax  online per head: running max m, sum l and accumulator are
 *                rescaled by expf(m_old - m_new); p = expf(s - m_new);
 *       values   lane = dims: out_acc[g][d] += p[g][t] * v[t][d].
 *     Then the warps merge in warp order (each rescaled to the CTA's max);
 *   all warps on each tile (short slices, attn_spread): warp w owns an
 *     eighth of the dims for the scores and the values, so one tile's
 *     dependent chain is an eighth as long (at a short context the per-warp
 *     tiles leave 7 of 8 warps idle).
 * Then the cluster's CTAs merge in rank order (attn_combine: each CTA
 * stores its partial results into the owners' shared memory, one cluster
 * barrier, the owners combine locally); out = acc / l.
 *
 * Numerics vs ops_attention: the same scores up to the dot's summation
 * order (float, fmaf), exp of score - running max times exp of the max
 * differences instead of exp of score - final max, float sums in another
 * order: a few ulp per term, no cancellation beyond what the output itself
 * has (see the header's tolerance). */
#define AT_WARPS 8
#define AT_THREADS (32 * AT_WARPS)
#define AT_DMAX 256
#define AT_PROBES 7   /* the attention probe's stamps (trace builds) */

__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Prefetch `bytes` from p into L2, 128-byte lines. */
__device__ __forceinline__ void prefetch_span(const void *p, int bytes)
{
    const uintptr_t a = (uintptr_t)p, end = a + (uintptr_t)bytes;
    for (uintptr_t l = a & ~(uintptr_t)127; l < end; l += 128) prefetch_l2((const void *)l);
}

/* U consecutive elements (f16 or f32) at base[off..off+U) as floats; off
 * a multiple of U, base 16-byte aligned. */
template <int U>
__device__ __forceinline__ void ld_vec(float *f, const void *base, size_t off, int f16)
{
    if (f16) {
        const __half2 *p = (const __half2 *)((const uint16_t *)base + off);
        if constexpr (U == 2) {
            const float2 a = __half22float2(p[0]);
            f[0] = a.x; f[1] = a.y;
        } else if constexpr (U == 4) {
            const uint2 raw = *(const uint2 *)p;
            const float2 a = __half22float2(*(const __half2 *)&raw.x), b = __half22float2(*(const __half2 *)&raw.y);
            f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
        } else {
            static_assert(U == 8, "ld_vec");
            const uint4 raw = *(const uint4 *)p;
            const uint32_t w[4] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float2 a = __half22float2(*(const __half2 *)&w[t]);
                f[2 * t] = a.x; f[2 * t + 1] = a.y;
            }
        }
    } else {
        const float *p = (const float *)base + off;
        if constexpr (U == 2) {
            const float2 a = *(const float2 *)p;
            f[0] = a.x; f[1] = a.y;
        } else {
#pragma unroll
            for (int t = 0; t < U; t += 4) {
                const float4 a = *(const float4 *)(p + t);
                f[t] = a.x; f[t + 1] = a.y; f[t + 2] = a.z; f[t + 3] = a.w;
            }
        }
    }
}

/* What a CTA works on: its slice [j0, j1) of the row's positions in the
 * K and V caches (f16 when kf16 / vf16, else f32) of its KV head (element
 * offset hoff, row stride rs), head_dim D, and the score scale. pn: the
 * position whose K and V rows are read from shared memory (snk, snv: what
 * the caches will hold there, as floats) instead of the caches: the row's
 * own position in the fused prologue's CTA that holds it, else -1. */
struct at_slice {
    const void *kc, *vc;
    int kf16, vf16;
    size_t rs, hoff;
    int j0, j1, D;
    float scale;
    int pn;
    const float *snk, *snv;
};

/* The fused prologue (cuda_attention_decode_fused): q, k, v are the raw
 * q/k/v matvec rows of the one query row (the kernel's q argument is q);
 * qw, kw the per-head norm weights; kcw, vcw the caches, written at the
 * row's position; k == NULL: no prologue (q is ready, the caches hold the
 * row). */
struct at_pro {
    const float *k, *v, *qw, *kw;
    void *kcw, *vcw;
    int n_rot;
    float theta_scale, freq_scale, eps;
};

/* The new K or V row (D floats of src) as the cache holds it: stored at
 * element offset off of cache (f16 when f16; cache NULL: not stored by
 * this CTA) and kept in dst as floats (f16-rounded when f16). dst may be
 * src: each thread reads and writes only its own elements. */
__device__ __forceinline__ void at_new_row(float *dst, const float *src, void *cache, size_t off, int D, int f16)
{
    for (int t = threadIdx.x; t < D; t += AT_THREADS) {
        const float x = src[t];
        const uint16_t h = qd_f2h(x);
        if (cache) {
            if (f16) ((uint16_t *)cache)[off + t] = h;
            else ((float *)cache)[off + t] = x;
        }
        dst[t] = f16 ? dev_h2f(h) : x;
    }
}

/* What k_qk_norm_rope_store does for one row, for the heads of one CTA:
 * its GB query heads normed and rotated into sq (row stride DM), and, when
 * the CTA's slice holds the row's position (has_new), its KV head's key
 * normed and rotated into snk and the value row copied to snv, both as the
 * caches will hold them (f16-rounded when f16); the CTA that `writes`
 * stores them to the caches at element offset off. The same device
 * functions as k_qk_norm_rope_store in the same order (warp_rms is
 * rms_row's sum), so the bits are its. The RoPE table of the row's
 * position (cs, sn) is the caller's: k_attn builds it before its
 * dependency wait (it depends on the position alone), by its last threads
 * (its entries are long serial chains); the first barrier here orders it
 * before its use. Ends with a barrier. */
template <int GB, int DM>
__device__ __forceinline__ void at_prologue(const at_pro &pro, const float *qr, float *sq, float *snk, float *snv,
                                            const float *cs, const float *sn, int D, int hk, int has_new, int writes,
                                            size_t off, int f16)
{
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, half = pro.n_rot / 2;
    for (int j = warp; j < GB + has_new; j += AT_WARPS)
        warp_rms(j < GB ? sq + j * DM : snk, j < GB ? qr + (size_t)j * D : pro.k + (size_t)hk * D,
                 j < GB ? pro.qw : pro.kw, D, pro.eps, lane);
    if (has_new) at_new_row(snv, pro.v + (size_t)hk * D, writes ? pro.vcw : NULL, off, D, f16);
    __syncthreads();
    for (int it = tid; it < (GB + has_new) * half; it += AT_THREADS) {
        const int j = it / half, i = it - j * half;
        rope_pair(j < GB ? sq + j * DM : snk, i, half, cs[i], sn[i]);
    }
    if (has_new) {
        __syncthreads();
        at_new_row(snk, snk, writes ? pro.kcw : NULL, off, D, f16);
    }
    __syncthreads();
}

/* The cluster merge, by sending: output element t = g*D + d of the CTA's
 * GB heads is owned by rank (t/256) % ncl, at index i = (t/(256 ncl))*256 +
 * t%256 of that rank's receive rows (nown = ceil(GB*D / (256 ncl)) * 256
 * elements a row; ncl rows fit AT_XMAX floats: nown*ncl <= 4096 for GB*D
 * <= 2048). A rank owning at least one element is an owner. Every CTA
 * stores its accumulator of every t (rescaled to its own max M; zeros for
 * an empty slice, whose M = -inf keeps its row unread) into row `rank` of
 * t's owner, and its (M, L) into every owner's rM/rL[rank], all by
 * st.async: each store counts its bytes on the owner's mbarrier, which
 * its thread 0 armed at the kernel's start with every byte it will
 * receive (at_mbar_init). The owner waits on its own mbarrier (no
 * cluster-wide barrier: a release of every CTA's writes at cluster scope
 * cost 0.55 µs a launch, bench/RESULTS.md session 21) and combines its
 * outputs from its own shared memory, in rank order: num = sum_r acc_r *
 * expf(M_r - M), den = sum_r L_r * expf(M_r - M), out = num / den. A
 * non-owner is done once it has sent; an owner's shared memory outlives
 * every store into it (it waits for all their bytes). A CTA's shared
 * memory may be written by another only once it has started (its
 * mbarrier initialized): every thread arrives (relaxed) on the cluster
 * barrier first thing (at_started_arrive, after thread 0's mbarrier
 * init and its fence) and waits on it (at_started_wait) before its first
 * store into another CTA; by then the others have long arrived, so the
 * wait costs ~nothing. A launch of one-CTA clusters (a device without
 * clusters, or a test's forced size) stores into its own shared memory
 * and waits on __syncthreads: st.async needs a cluster of 2 CTAs or more. */
#define AT_XMAX (CL_MAX * 256)
__device__ __forceinline__ void at_started_arrive() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void at_started_wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }
__device__ __forceinline__ unsigned at_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
/* The elements rank o owns of tot = GB*D. */
__device__ __forceinline__ int at_owned(int o, int ncl, int tot)
{
    int n = 0;
    for (int b = o; 256 * b < tot; b += ncl) n += min(256, tot - 256 * b);
    return n;
}
/* Thread 0, first thing: the mbarrier armed for one arrival (its own) and
 * the bytes this rank will receive as an owner: ncl rows of its elements
 * and ncl (M, L) pairs a head; a non-owner arms nothing and never waits. */
__device__ __forceinline__ void at_mbar_init(uint64_t *bar, int rank, int ncl, int tot, int gb)
{
    const int own = at_owned(rank, ncl, tot);
    if (!own || ncl == 1) return;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(at_smem(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned bytes = (unsigned)(ncl * (own + 2 * gb) * 4);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(at_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void at_mbar_wait(uint64_t *bar)
{
    asm volatile("{\n\t.reg .pred p;\n"
                 "AT_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], 0;\n\t"
                 "@!p bra AT_WAIT_%=;\n}" ::"r"(at_smem(bar)) : "memory");
}
template <int GB>
struct at_xfer {
    int rank, ncl, nown, D;
    float *sx;                        /* receive rows [ncl][nown] */
    float (*rM)[GB], (*rL)[GB];       /* received (M, L) [CL_MAX][GB] */
    uint64_t *bar;                    /* the owners' mbarrier */
    /* 4 accumulators t..t+3 (t a multiple of 4, D a multiple of 8: one
     * head, one owner) */
    __device__ __forceinline__ void send4(int t, float4 v) const
    {
        const int b = t >> 8, owner = b % ncl;
        float *dst = sx + rank * nown + (b / ncl) * 256 + (t & 255);
        if (ncl == 1) { *(float4 *)dst = v; return; }   /* no cluster: st.async needs 2 CTAs or more */
        const unsigned la = at_smem(dst);
        unsigned ra, rb;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(la), "r"(owner));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(at_smem(bar)), "r"(owner));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                     ::"r"(ra), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rb) : "memory");
    }
    /* (M, L) of head g to rank r, if r owns anything */
    __device__ __forceinline__ void send_ml(int r, int g, float M, float L) const
    {
        if (!at_owned(r, ncl, GB * D)) return;
        if (ncl == 1) { rM[rank][g] = M; rL[rank][g] = L; return; }
        unsigned rm, rl, rb;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rm) : "r"(at_smem(&rM[rank][g])), "r"(r));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rl) : "r"(at_smem(&rL[rank][g])), "r"(r));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(at_smem(bar)), "r"(r));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                     ::"r"(rm), "f"(M), "r"(rb) : "memory");
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                     ::"r"(rl), "f"(L), "r"(rb) : "memory");
    }
};

/* The attention probe (trace builds only, bench/cuda/trace.sh): thread 0
 * of CTA (0, 0, 0) stamps %globaltimer at the kernel's entry, its wait's
 * return, the prologue's end (q normed and rotated, the new K/V row
 * stored), the end of the spread path's tile loop, its sends to the
 * cluster, the return of its wait for the merge (mbarrier), and the output's store; a launch
 * that took the spread path adds the differences to g_atp_sum
 * (cuda_attention_probe reads and clears them). Its stores and atomics
 * come after the last stamp but before the CTA exits: read the phases, not
 * the total. */
#ifdef STRATA_CUDA_TRACE
__device__ unsigned long long g_atp_t[AT_PROBES];
__device__ unsigned long long g_atp_sum[AT_PROBES];
__device__ unsigned int g_atp_n;
__device__ __forceinline__ bool at_probe_thread() { return (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0; }
#define AT_PROBE(i) do { if (at_probe_thread()) g_atp_t[i] = ct_now(); } while (0)
__device__ __forceinline__ void at_probe_end()
{
    if (!at_probe_thread()) return;
    g_atp_t[AT_PROBES - 1] = ct_now();
    for (int i = 1; i < AT_PROBES; i++) atomicAdd(&g_atp_sum[i], g_atp_t[i] - g_atp_t[i - 1]);
    atomicAdd(&g_atp_n, 1u);
}
#else
#define AT_PROBE(i) do { } while (0)
__device__ __forceinline__ void at_probe_end() {}
#endif

template <int GB>
__device__ __forceinline__ void attn_combine(const at_xfer<GB> &x, float *orow)
{
    const int tot = GB * x.D;
    if (x.ncl == 1) __syncthreads();   /* one CTA: its own stores (at_xfer) */
    else {
        if (!at_owned(x.rank, x.ncl, tot)) return;
        at_mbar_wait(x.bar);
    }
    AT_PROBE(5);
    for (int t = x.rank * AT_THREADS + (int)threadIdx.x, k = 0; t < tot; t += x.ncl * AT_THREADS, k++) {
        const int g = t / x.D, i = k * AT_THREADS + (int)threadIdx.x;
        float M = -INFINITY;
        for (int r = 0; r < x.ncl; r++) M = fmaxf(M, x.rM[r][g]);
        float num = 0.0f, den = 0.0f;
        for (int r = 0; r < x.ncl; r++) {
            if (x.rM[r][g] == -INFINITY) continue;
            const float fr = expf(x.rM[r][g] - M);
            num = fmaf(x.sx[r * x.nown + i], fr, num);
            den = fmaf(x.rL[r][g], fr, den);
        }
        orow[t] = num / den;
    }
}

/* One tile's online-softmax step of k_attn (and k_attn_rows) (lane = position):
 * the lane's scaled score (-inf past the slice), the tile's max by xor
 * shuffles, the new running max m, the factor corr the running sums take,
 * l updated by the tile's sum (xor shuffles); returns the lane's p. */
__device__ __forceinline__ float ar_softmax(float s, bool valid, float scale, float &m, float &l, float &corr)
{
    const float sv = valid ? s * scale : -INFINITY;
    float tm = sv;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
    const float mn = fmaxf(m, tm);
    corr = m == -INFINITY ? 0.0f : expf(m - mn);
    const float p = valid ? expf(sv - mn) : 0.0f;
    float ps = p;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * corr + ps;
    m = mn;
    return p;
}

/* The positions of a context of n_kv a cluster of ncl CTAs gives each
 * (its slices: a multiple of 32, the last ones short or empty); k_attn's
 * and k_attn_rows' slicing, and the host's bound on it. */
__host__ __device__ __forceinline__ int at_per(int n_kv, int ncl) { return ((n_kv + ncl - 1) / ncl + 31) & ~31; }

/* AT_SPREAD: slices of at most this many positions (a multiple of 32) take
 * attn_spread, longer ones the per-warp tiles. With the buckets' clusters
 * (4 CTAs up to 128 positions, 8 up to 2048, 16 beyond) a row takes the
 * spread path up to 512 positions and the tiles beyond (a 16-CTA slice
 * past 2048 positions is over 128); the value is what measured best on the
 * H200 with 16-CTA clusters
 * (bench/RESULTS.md, session 9: two tiles spread beat the tiles, four did
 * not). A -D for benchmarks only. */
#ifndef AT_SPREAD
#define AT_SPREAD 64
#endif

/* The spread path (short slices, at most AT_SPREAD positions): every warp
 * works on every 32-position tile. At a short context the per-warp tiles
 * leave 7 of 8 warps idle and the kernel's time is one warp's dependent
 * chain (a D-long FMA chain per head, then 32 V rows in two round trips);
 * here each step is an eighth of that. Warp w owns the C = DT/8 dims
 * [w*C, w*C + C):
 *   scores   lane = position: GB partial dots over the warp's C dims,
 *            stored to sp[buf][w]; after one barrier every warp sums the 8
 *            partials in warp order (the same floats in every warp) and
 *            runs the same online softmax, so m, l and the rescale factors
 *            are equal in all warps and the warps need no merge;
 *   values   lane = (group pg, quad dq), lane = pg*NQ + dq: NQ = C/4 quads
 *            of 4 dims, NG = 32/NQ groups; a lane accumulates p * v over
 *            positions pg, pg+NG, ... of each tile for its 4 dims; the
 *            groups are summed by xor shuffles once, after the last tile.
 * One barrier a tile (sp double-buffered: a warp writing sp[buf] of tile
 * t+2 has passed tile t+1's barrier, which every warp reaches only after
 * reading tile t). Loads: the first tile's K chunk and V quads are issued
 * before the q copy's barrier (one round trip for q, K and V), the next
 * tile's K once the scores are taken and its V once the values are. Sends
 * each warp's dims of the accumulators and (m, l) to their owners (x). */
template <int GB, int DT, typename Fill>
__device__ __forceinline__ void attn_spread(const at_slice &a, const at_xfer<GB> &x, Fill fill, const float *sq,
                                            float (*sp)[AT_WARPS][GB][32])
{
    static_assert(DT == 64 || DT == 128 || DT == 256, "attn_spread: head_dim 64, 128 or 256");
    constexpr int C = DT / 8, NQ = C / 4, NG = 32 / NQ;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int pg = lane / NQ, dq = lane - pg * NQ;
    const int j0 = a.j0, j1 = a.j1;
    const size_t kd = a.hoff + (size_t)warp * C;   /* this warp's K dims */
    const size_t vd = kd + (size_t)dq * 4;         /* this lane's V dims */
    float kf[C], vv[NQ][4];
    /* K: this lane's position of tile tb, the warp's C dims (16/32-byte
     * loads, aligned: offsets are multiples of 8 elements); V: the lane's
     * NQ positions, 4 dims each. Positions past j1 read nothing (0);
     * position a.pn reads snk / snv once `ready` (the first tile's loads
     * go out before the prologue has filled them: patched after it). */
    const int kl = warp * C, vl = kl + dq * 4;     /* their offsets in snk / snv */
    auto load_k = [&](int tb, bool ready) {
        const int j = tb + lane;
#pragma unroll
        for (int c8 = 0; c8 < C / 8; c8++) {
            if (j < j1 && j != a.pn) ld_vec<8>(kf + 8 * c8, a.kc, (size_t)j * a.rs + kd + (size_t)c8 * 8, a.kf16);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) kf[8 * c8 + e] = j == a.pn && ready ? a.snk[kl + 8 * c8 + e] : 0.0f;
        }
    };
    auto load_v = [&](int tb, bool ready) {
#pragma unroll
        for (int i = 0; i < NQ; i++) {
            const int j = tb + pg + NG * i;
            if (j < j1 && j != a.pn) ld_vec<4>(vv[i], a.vc, (size_t)j * a.rs + vd, a.vf16);
            else
#pragma unroll
                for (int u = 0; u < 4; u++) vv[i][u] = j == a.pn && ready ? a.snv[vl + u] : 0.0f;
        }
    };
    if (j0 < j1) { load_k(j0, false); load_v(j0, false); }
    fill();   /* the queries into shared memory (and snk / snv); ends with a barrier */
    AT_PROBE(2);
    if (a.pn >= j0 && a.pn < j0 + 32) {   /* the new row in the first tile */
        if (lane == a.pn - j0)
#pragma unroll
            for (int e = 0; e < C; e++) kf[e] = a.snk[kl + e];
#pragma unroll
        for (int i = 0; i < NQ; i++)
            if (j0 + pg + NG * i == a.pn)
#pragma unroll
                for (int u = 0; u < 4; u++) vv[i][u] = a.snv[vl + u];
    }

    float m[GB], l[GB], acc[GB][4];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; u++) acc[g][u] = 0.0f;
    }
    int buf = 0;
    for (int tb = j0; tb < j1; tb += 32, buf ^= 1) {
        const int valid = tb + lane < j1;
        /* partial scores over this warp's dims (queries broadcast from
         * shared memory) */
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float *qg = sq + g * DT + warp * C;
            float t = 0.0f;
#pragma unroll
            for (int e = 0; e < C; e += 4) {
                const float4 q4 = *(const float4 *)(qg + e);
                t = fmaf(kf[e], q4.x, t); t = fmaf(kf[e + 1], q4.y, t);
                t = fmaf(kf[e + 2], q4.z, t); t = fmaf(kf[e + 3], q4.w, t);
            }
            sp[buf][warp][g][lane] = t;
        }
        if (tb + 32 < j1) load_k(tb + 32, true);
        __syncthreads();
        /* the tile's scores (partials in warp order) and online softmax,
         * the same in every warp; lane = position */
        float p[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float s = sp[buf][0][g][lane];
#pragma unroll
            for (int w = 1; w < AT_WARPS; w++) s += sp[buf][w][g][lane];
            float corr;   /* the new max is finite: lane 0 is valid */
            p[g] = ar_softmax(s, valid, a.scale, m[g], l[g], corr);
#pragma unroll
            for (int u = 0; u < 4; u++) acc[g][u] *= corr;
        }
        /* values: p of position pg + NG*i is lane (pg + NG*i)'s; positions
         * past j1 add fmaf(0, 0, a) = a */
#pragma unroll
        for (int i = 0; i < NQ; i++)
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float pi = __shfl_sync(0xffffffffu, p[g], pg + NG * i);
#pragma unroll
                for (int u = 0; u < 4; u++) acc[g][u] = fmaf(pi, vv[i][u], acc[g][u]);
            }
        if (tb + 32 < j1) load_v(tb + 32, true);
    }
    /* sum the NG position groups (xor butterfly: every lane ends with the
     * same bits); lanes of group 0 send the warp's dims to their owners,
     * lane r of warp 0 sends (m, l) to rank r (every CTA has started) */
    AT_PROBE(3);
    at_started_wait();
#pragma unroll
    for (int o = NQ; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GB; g++)
#pragma unroll
            for (int u = 0; u < 4; u++) acc[g][u] += __shfl_xor_sync(0xffffffffu, acc[g][u], o);
    if (pg == 0)   /* an empty slice's accumulators are 0 */
#pragma unroll
        for (int g = 0; g < GB; g++)
            x.send4(g * DT + warp * C + dq * 4, make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));
    if (warp == 0 && lane < x.ncl)
#pragma unroll
        for (int g = 0; g < GB; g++) x.send_ml(lane, g, m[g], l[g]);
    AT_PROBE(4);
}

/* GB query heads per CTA (1, 2, 4, 8); DT: head_dim when it is 64, 128 or
 * 256 (loops fully unrolled, lanes own U = DT/32 consecutive dims), 0 for
 * any other multiple of 8 up to 256 (lanes own dims lane + 32u; always the
 * per-warp tiles). */
template <int GB, int DT>
__global__ void __launch_bounds__(AT_THREADS)
k_attn(float *out, const float *q, int n_head, int n_head_kv, int d_rt, const void *__restrict__ kc, int kf16,
       const void *__restrict__ vc, int vf16, const int32_t *__restrict__ pos, int row0, float scale, at_pro pro)
{
    constexpr int DM = DT ? DT : AT_DMAX;
    constexpr int UM = DM / 32;   /* dims per lane (most) */
    static_assert(AT_THREADS == 256 && GB * DM <= 2048, "attn: the merge's layout");
    __shared__ __align__(16) float sq[GB * DM];
    /* the spread path's score partials [2][AT_WARPS][GB][32]; the tiles
     * path's merged accumulators sacc[GB*DM] once its loop is done */
    __shared__ __align__(16) float sbuf[2 * AT_WARPS * GB * 32];
    __shared__ __align__(16) float sx[AT_XMAX];
    __shared__ float rM[CL_MAX][GB], rL[CL_MAX][GB];
    __shared__ float swm[AT_WARPS][GB], swl[AT_WARPS][GB];
    __shared__ __align__(8) uint64_t sbar;   /* the merge's mbarrier (owners) */
    /* the fused prologue's new K and V rows and RoPE table */
    __shared__ __align__(16) float snk[AT_DMAX], snv[AT_DMAX], scs[AT_DMAX / 2], ssn[AT_DMAX / 2];

    AT_PROBE(0);
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), ncl = (int)cl.num_blocks();
    const int D = DT ? DT : d_rt;
    if (threadIdx.x == 0) at_mbar_init(&sbar, rank, ncl, GB * D, GB);
    at_started_arrive();   /* see at_xfer */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = n_head / n_head_kv;
    const int h0 = blockIdx.y * GB, hk = h0 / G, row = blockIdx.z;
    /* Before the wait on the previous kernel (it writes q and the newest
     * K/V row): the K and V rows of this CTA's slice are prefetched into
     * L2, so their DRAM latency overlaps the previous kernel instead of
     * opening this one. Only the position is read here: it was written
     * by a kernel at least two launches back (the step kernel of the last
     * token, or a copy), complete before this grid can start (see
     * pdl_enter), and read from L2 (__ldcg); prefetches return nothing.
     * The RoPE table is built from it here too (shared memory only). */
    const int n_kv = __ldcg(pos) + row0 + row + 1, pnew = n_kv - 1;   /* pnew: the row's own position */
    const size_t rs = (size_t)n_head_kv * D;   /* cache row stride, elements */
    const size_t hoff = (size_t)hk * D;
    const int kes = kf16 ? 2 : 4, ves = vf16 ? 2 : 4;

    const int per = at_per(n_kv, ncl);
    const int j0 = min(rank * per, n_kv), j1 = min(j0 + per, n_kv);
    for (int j = j0 + tid; j < j1; j += AT_THREADS) {
        prefetch_span((const char *)kc + ((size_t)j * rs + hoff) * kes, D * kes);
        prefetch_span((const char *)vc + ((size_t)j * rs + hoff) * ves, D * ves);
    }
    if (pro.k && tid < 2) prefetch_span(tid ? pro.kw : pro.qw, D * (int)sizeof(float));   /* the norms' weights */
    /* the fused prologue's RoPE table (the row's position alone), so its
     * serial chains are off the path after the wait (decode 1.007x on the
     * H100, bench/RESULTS.md session 20) */
    if (pro.k)
        rope_table(scs, ssn, pro.n_rot / 2, pnew, pro.theta_scale, pro.freq_scale, AT_THREADS - 1 - tid, AT_THREADS);
    pdl_wait();   /* no launch_dependents: the next grid launches as this one's CTAs exit (pdl_wait) */
    AT_PROBE(1);

    const float *qr = q + (size_t)row * n_head * D + (size_t)h0 * D;
    float *orow = out + (size_t)row * n_head * D + (size_t)h0 * D;
    const int nown = (GB * D + AT_THREADS * ncl - 1) / (AT_THREADS * ncl) * AT_THREADS;
    const at_xfer<GB> x = { rank, ncl, nown, D, sx, rM, rL, &sbar };
    /* the fused prologue (one query row): the row's position n_kv - 1 is
     * new; the CTA whose slice holds it builds its K/V rows, and the first
     * head group of its KV head stores them */
    const int has_new = pro.k && j0 <= pnew && pnew < j1;
    const at_slice a = { kc, vc, kf16, vf16, rs, hoff, j0, j1, D, scale, has_new ? pnew : -1, snk, snv };
    auto fill = [&]() {
        if (pro.k) {
            at_prologue<GB, DM>(pro, qr, sq, snk, snv, scs, ssn, D, hk, has_new, has_new && h0 % G == 0,
                                (size_t)pnew * rs + hoff, kf16);
        } else {
            for (int t = tid; t < GB * D; t += AT_THREADS) sq[(t / D) * DM + t % D] = qr[t];
            __syncthreads();
        }
    };
    /* per is the same in every CTA of the cluster (and depends only on the
     * row's position and the cluster size), so a row's path is the same
     * in a one-row call and in cuda_attention_rows */
    if constexpr (DT != 0) {
        if (per <= AT_SPREAD) {
            attn_spread<GB, DT>(a, x, fill, sq, (float (*)[AT_WARPS][GB][32])sbuf);
            attn_combine<GB>(x, orow);
            at_probe_end();
            return;
        }
    }

    /* the per-warp tiles (longer slices) */
    float (*sp)[GB][32] = (float (*)[GB][32])sbuf;
    float *sacc = sbuf;   /* after the loop */
    fill();

    float m[GB], l[GB], acc[GB][UM];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int u = 0; u < UM; u++) acc[g][u] = 0.0f;
    }

    for (int tb = j0 + warp * 32; tb < j1; tb += AT_WARPS * 32) {
        const int j = tb + lane;
        const int valid = j < j1;
        /* scores: lane = position */
        float s[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) s[g] = 0.0f;
        if (valid) {
            const size_t ko = (size_t)j * rs + hoff;
#pragma unroll(DT ? DT / 8 : 4)
            for (int c8 = 0; c8 < D / 8; c8++) {
                float kf[8];
                if (j == a.pn)
#pragma unroll
                    for (int e = 0; e < 8; e++) kf[e] = snk[c8 * 8 + e];
                else
                    ld_vec<8>(kf, kc, ko + (size_t)c8 * 8, kf16);
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    const float4 a = *(const float4 *)(sq + g * DM + c8 * 8);
                    const float4 b = *(const float4 *)(sq + g * DM + c8 * 8 + 4);
                    float t = s[g];
                    t = fmaf(kf[0], a.x, t); t = fmaf(kf[1], a.y, t); t = fmaf(kf[2], a.z, t); t = fmaf(kf[3], a.w, t);
                    t = fmaf(kf[4], b.x, t); t = fmaf(kf[5], b.y, t); t = fmaf(kf[6], b.z, t); t = fmaf(kf[7], b.w, t);
                    s[g] = t;
                }
            }
        }
        /* online softmax per head */
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float corr;   /* the new max is finite: lane 0 is valid */
            const float p = ar_softmax(s[g], valid, scale, m[g], l[g], corr);
#pragma unroll
            for (int u = 0; u < UM; u++) acc[g][u] *= corr;
            sp[warp][g][lane] = p;
        }
        __syncwarp();
        /* values: lane = dims. PVB rows are loaded before any is used
         * (one round trip per batch, not per row); rows past the tile's
         * end read nothing and add 0 * 0 (their p is 0) */
        const int nv = min(32, j1 - tb);
        constexpr int PVB = UM <= 4 ? 16 : 8;
        for (int t0 = 0; t0 < nv; t0 += PVB) {
            float vv[PVB][UM];
#pragma unroll
            for (int b = 0; b < PVB; b++) {
                const size_t vo = (size_t)(tb + t0 + b) * rs + hoff;
                if (t0 + b >= nv) {
#pragma unroll
                    for (int u = 0; u < UM; u++) vv[b][u] = 0.0f;
                } else if (tb + t0 + b == a.pn) {
#pragma unroll
                    for (int u = 0; u < UM; u++) {
                        const int d = DT ? lane * UM + u : lane + 32 * u;
                        vv[b][u] = d < D ? snv[d] : 0.0f;
                    }
                } else if constexpr (DT != 0) {
                    ld_vec<UM>(vv[b], vc, vo + (size_t)lane * UM, vf16);
                } else {
#pragma unroll
                    for (int u = 0; u < UM; u++) {
                        const int d = lane + 32 * u;
                        vv[b][u] = d < D ? (vf16 ? dev_h2f(((const uint16_t *)vc)[vo + d]) : ((const float *)vc)[vo + d])
                                         : 0.0f;
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < PVB; b++)
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    const float p = sp[warp][g][t0 + b];
#pragma unroll
                    for (int u = 0; u < UM; u++) acc[g][u] = fmaf(p, vv[b][u], acc[g][u]);
                }
        }
        __syncwarp();
    }

    /* merge the warps (in warp order) at the CTA's max. Warps past the
     * slice's last tile hold m = -inf (factor 0): their terms would add
     * fmaf(0, 0, a) = a, so the loop stops at the last warp with a tile
     * (the same sums; at a short context 1 of 8 barriers) */
    const int wused = min(AT_WARPS, (j1 - j0 + 31) / 32);
    at_started_wait();   /* before send_ml below */
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < GB; g++) { swm[warp][g] = m[g]; swl[warp][g] = l[g]; }
    __syncthreads();
    float f[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float M = -INFINITY;
        for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, swm[w][g]);
        f[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - M);
        if (tid == g) {
            float L = 0.0f;
            for (int w = 0; w < AT_WARPS; w++) L += swm[w][g] == -INFINITY ? 0.0f : swl[w][g] * expf(swm[w][g] - M);
            for (int r = 0; r < ncl; r++) x.send_ml(r, g, M, L);
        }
    }
    for (int w = 0; w < wused; w++) {
        if (warp == w) {
#pragma unroll
            for (int g = 0; g < GB; g++)
#pragma unroll
                for (int u = 0; u < UM; u++) {
                    const int d = DT ? lane * UM + u : lane + 32 * u;
                    if (d < D) {
                        float *a = &sacc[g * DM + d];
                        *a = w == 0 ? acc[g][u] * f[g] : fmaf(acc[g][u], f[g], *a);
                    }
                }
        }
        __syncthreads();
    }
    /* send the merged accumulators to their owners (4 consecutive
     * elements of one head: D is a multiple of 8) */
    for (int t = 4 * tid; t < GB * D; t += 4 * AT_THREADS) {   /* an empty slice sends zeros (unread: M = -inf) */
        const int g = t / D, d = t - g * D;
        x.send4(t, j0 < j1 ? *(const float4 *)(sacc + g * DM + d) : make_float4(0.f, 0.f, 0.f, 0.f));
    }
    attn_combine<GB>(x, orow);
}

/* ==== A prompt chunk's attention: k_attn's arithmetic, a CTA per (row, KV head) ====
 * cuda_attention_rows must give each row what a one-row k_attn launch
 * gives: ncl CTAs (a cluster) each over a slice of `per` positions, by the
 * spread path (per <= AT_SPREAD) or the per-warp tiles, merged in rank
 * order (attn_combine). Launched row by row that is ncl x heads / GB CTAs
 * of 256 threads for a few dozen positions each: a 192-row chunk's
 * attention was 26-29% of the chunk (bench/RESULTS.md, session 25).
 * k_attn_rows computes the same floats by the same operations in the same
 * order, laid out for many rows: a CTA per (row, KV head), a warp per query
 * head of the group (G <= 8), the K/V rows staged 32 positions (a tile) at
 * a time in shared memory, once for the group's heads (cp.async, two
 * buffers), and each warp walking its row's slices in rank order:
 *   spread slice: a tile's score is 8 partial chains over C = D/8 dims
 *     (k_attn's warp w: dims [wC, wC + C)) summed in w order; the softmax
 *     as attn_spread's (lane = position: the same shuffles); the values:
 *     lane owns dims [lane*U, lane*U + U) (U = D/32) in each of the NG =
 *     32/U position groups (positions g, g + NG, ...: attn_spread's lane
 *     (pg, dq) chains), the groups summed at the slice's end in its xor
 *     tree's order;
 *   tiles slice: tile i of the slice is k_attn's warp i % 8's, whose (m, l)
 *     and accumulators (lane = its U dims) stay in shared memory between
 *     its tiles; the score one chain over the D dims; the values position
 *     by position, PVB a batch (a batch's padding adds fmaf(0, 0, a) as
 *     there); the 8 merged at the slice's end as k_attn merges its warps;
 *   the slices' (m, l, acc) kept in shared memory and combined after the
 *     last as attn_combine does (rank order, empty slices skipped).
 * ncl is the cluster the one-row launch gets (attn_cluster). D = 64 or
 * 128 with both caches f16 or both f32; other shapes keep the one-row
 * launches (cuda_attention_rows). */
#define AR_VW AT_WARPS   /* k_attn's warps: the tiles path's virtual warps, the spread path's partial chains */
static_assert(AR_VW == 8, "k_attn_rows: attn_spread's C = D / 8 dims a warp");

/* Shared memory of a k_attn_rows CTA (bytes): the tiles (2 buffers of K
 * and V, 32 rows of D elements padded by 16 bytes: conflict-free 16-byte
 * reads of a column), then floats: q [G][D], the slices' accumulators
 * [G][ncl][D], the tiles path's [G][8][D] (vw: when a row of the launch
 * may take it), the slices' (m, l) [G][ncl][2], the tiles path's [G][8][2]. */
__host__ __device__ constexpr int ar_row_bytes(int D, int es) { return D * es + 16; }
__host__ __device__ inline size_t ar_smem(int D, int es, int G, int ncl, int vw)
{
    return (size_t)4 * 32 * ar_row_bytes(D, es) +
           sizeof(float) * ((size_t)G * D * (1 + ncl + (vw ? AR_VW : 0)) + (size_t)G * 2 * (ncl + (vw ? AR_VW : 0)));
}

__device__ __forceinline__ void cp_async_wait_one(void) { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

template <int D, bool F16>
__global__ void __launch_bounds__(256)
k_attn_rows(float *out, const float *q, int n_head, int n_head_kv, const void *__restrict__ kc,
            const void *__restrict__ vc, const int32_t *pos, int row0, float scale, int ncl, int vw)
{
    pdl_enter();
    constexpr int U = D / 32, C = D / 8, NG = 32 / U, PVB = U <= 4 ? 16 : 8;
    constexpr int ES = F16 ? 2 : 4, SR = ar_row_bytes(D, ES), CPR = D * ES / 16;
    static_assert(D == 64 || D == 128, "k_attn_rows: head_dim 64 or 128");
    extern __shared__ __align__(16) uint8_t ar_sm[];
    const int G = (int)(blockDim.x >> 5), tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int hk = (int)blockIdx.x, row = (int)blockIdx.y, h = hk * G + warp;
    const int n_kv = __ldcg(pos) + row0 + row + 1;
    const int per = at_per(n_kv, ncl);
    const bool spread = per <= AT_SPREAD;
    const size_t rs = (size_t)n_head_kv * D, hoff = (size_t)hk * D;
    const int nvw = vw ? AR_VW : 0;
    float *sq = (float *)(ar_sm + 4 * 32 * SR);
    float *sres = sq + G * D, *svw = sres + G * ncl * D, *sml = svw + G * nvw * D, *svml = sml + G * ncl * 2;
    float *myq = sq + warp * D, *myres = sres + warp * ncl * D, *myvw = svw + warp * nvw * D;
    float *myml = sml + warp * ncl * 2, *myvml = svml + warp * nvw * 2;

    /* tile t (positions 32t ..) into buffer b; rows past the context are
     * not read (their scores are masked, their values replaced by 0) */
    auto stage = [&](int t, int b) {
        for (int i = tid; i < 2 * 32 * CPR; i += (int)blockDim.x) {
            const int kv = i / (32 * CPR), rem = i - kv * 32 * CPR, r = rem / CPR, c = rem - r * CPR;
            const int j = 32 * t + r;
            if (j < n_kv)
                cp_async16(ar_sm + ((2 * b + kv) * 32 + r) * SR + 16 * c,
                           (const uint8_t *)(kv ? vc : kc) + ((size_t)j * rs + hoff) * ES + 16 * c);
        }
        cp_async_commit();
    };
    const int T = (n_kv + 31) / 32;
    stage(0, 0);
    for (int i = lane; i < D; i += 32) myq[i] = q[(size_t)row * n_head * D + (size_t)h * D + i];

    float m = -INFINITY, l = 0.0f, acc[NG][U];
    for (int t = 0; t < T; t++) {
        const int b = t & 1;
        if (t + 1 < T) { stage(t + 1, b ^ 1); cp_async_wait_one(); }
        else cp_async_wait_all();
        __syncthreads();
        const uint8_t *kt = ar_sm + (2 * b) * 32 * SR, *vt = kt + 32 * SR;
        const int tb = 32 * t, r = tb / per, j0 = r * per, j1 = min(j0 + per, n_kv);
        const bool last = tb + 32 >= j1;
        const bool valid = tb + lane < j1;
        if (spread) {
            if (tb == j0) {
                m = -INFINITY;
                l = 0.0f;
#pragma unroll
                for (int g = 0; g < NG; g++)
#pragma unroll
                    for (int u = 0; u < U; u++) acc[g][u] = 0.0f;
            }
            /* k_attn's 8 warps' partial scores, summed in warp order */
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < AR_VW; w++) {
                float pt = 0.0f;
#pragma unroll
                for (int e = 0; e < C; e += 8) {
                    float kf[8], qf[8];
                    ld_vec<8>(kf, kt + lane * SR, w * C + e, F16);
                    ld_vec<8>(qf, myq, w * C + e, 0);
#pragma unroll
                    for (int x = 0; x < 8; x++) pt = fmaf(kf[x], qf[x], pt);
                }
                s = w == 0 ? pt : s + pt;
            }
            float corr;
            const float p = ar_softmax(s, valid, scale, m, l, corr);
#pragma unroll
            for (int g = 0; g < NG; g++)
#pragma unroll
                for (int u = 0; u < U; u++) acc[g][u] *= corr;
            /* group g: positions g + NG*i, i in order (attn_spread's lane
             * (g, dq) over its NQ = U positions) */
#pragma unroll
            for (int g = 0; g < NG; g++)
#pragma unroll
                for (int i = 0; i < U; i++) {
                    const int pp = g + NG * i;
                    const float pi = __shfl_sync(0xffffffffu, p, pp);
                    float vv[U];
                    if (tb + pp < j1) ld_vec<U>(vv, vt + pp * SR, lane * U, F16);
                    else
#pragma unroll
                        for (int u = 0; u < U; u++) vv[u] = 0.0f;
#pragma unroll
                    for (int u = 0; u < U; u++) acc[g][u] = fmaf(pi, vv[u], acc[g][u]);
                }
            if (last) {   /* the xor tree over the groups (partner g ^ s) */
#pragma unroll
                for (int s2 = 1; s2 < NG; s2 <<= 1)
#pragma unroll
                    for (int g = 0; g < NG; g += 2 * s2)
#pragma unroll
                        for (int u = 0; u < U; u++) acc[g][u] += acc[g + s2][u];
#pragma unroll
                for (int u = 0; u < U; u++) myres[r * D + lane * U + u] = acc[0][u];
                if (lane == 0) { myml[2 * r] = m; myml[2 * r + 1] = l; }
            }
        } else {
            const int vi = ((tb - j0) >> 5) % AR_VW;
            if (tb == j0) {
                for (int i = lane; i < AR_VW * D; i += 32) myvw[i] = 0.0f;
                if (lane < AR_VW) { myvml[2 * lane] = -INFINITY; myvml[2 * lane + 1] = 0.0f; }
                __syncwarp();
            }
            float mv = myvml[2 * vi], lv = myvml[2 * vi + 1], a[U];
#pragma unroll
            for (int u = 0; u < U; u++) a[u] = myvw[vi * D + lane * U + u];
            float s = 0.0f;
            if (valid) {
#pragma unroll
                for (int c8 = 0; c8 < D / 8; c8++) {
                    float kf[8], qf[8];
                    ld_vec<8>(kf, kt + lane * SR, c8 * 8, F16);
                    ld_vec<8>(qf, myq, c8 * 8, 0);
#pragma unroll
                    for (int x = 0; x < 8; x++) s = fmaf(kf[x], qf[x], s);
                }
            }
            float corr;
            const float p = ar_softmax(s, valid, scale, mv, lv, corr);
#pragma unroll
            for (int u = 0; u < U; u++) a[u] *= corr;
            const int nv = min(32, j1 - tb);
            for (int t0 = 0; t0 < nv; t0 += PVB)
#pragma unroll
                for (int bb = 0; bb < PVB; bb++) {
                    const float pb = __shfl_sync(0xffffffffu, p, t0 + bb);
                    float vv[U];
                    if (t0 + bb < nv) ld_vec<U>(vv, vt + (t0 + bb) * SR, lane * U, F16);
                    else
#pragma unroll
                        for (int u = 0; u < U; u++) vv[u] = 0.0f;
#pragma unroll
                    for (int u = 0; u < U; u++) a[u] = fmaf(pb, vv[u], a[u]);
                }
#pragma unroll
            for (int u = 0; u < U; u++) myvw[vi * D + lane * U + u] = a[u];
            __syncwarp();
            if (lane == 0) { myvml[2 * vi] = mv; myvml[2 * vi + 1] = lv; }
            __syncwarp();
            if (last) {   /* k_attn's merge of its warps */
                const int wused = min(AR_VW, (j1 - j0 + 31) / 32);
                float M = -INFINITY, L = 0.0f;
                for (int w = 0; w < AR_VW; w++) M = fmaxf(M, myvml[2 * w]);
                for (int w = 0; w < AR_VW; w++)
                    L += myvml[2 * w] == -INFINITY ? 0.0f : myvml[2 * w + 1] * expf(myvml[2 * w] - M);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    float sa = 0.0f;
                    for (int w = 0; w < wused; w++) {
                        const float f = myvml[2 * w] == -INFINITY ? 0.0f : expf(myvml[2 * w] - M);
                        const float x = myvw[w * D + lane * U + u];
                        sa = w == 0 ? x * f : fmaf(x, f, sa);
                    }
                    myres[r * D + lane * U + u] = sa;
                }
                if (lane == 0) { myml[2 * r] = M; myml[2 * r + 1] = L; }
            }
        }
        __syncthreads();   /* buffer b is restaged at t + 2 */
    }
    /* attn_combine: the slices in rank order (past the last non-empty one,
     * k_attn's slices are empty: m = -inf, skipped) */
    __syncwarp();
    const int nr = (n_kv + per - 1) / per;
    float M = -INFINITY;
    for (int r = 0; r < nr; r++) M = fmaxf(M, myml[2 * r]);
    float *orow = out + (size_t)row * n_head * D + (size_t)h * D;
#pragma unroll
    for (int u = 0; u < U; u++) {
        float num = 0.0f, den = 0.0f;
        for (int r = 0; r < nr; r++) {
            if (myml[2 * r] == -INFINITY) continue;
            const float fr = expf(myml[2 * r] - M);
            num = fmaf(myres[r * D + lane * U + u], fr, num);
            den = fmaf(myml[2 * r + 1], fr, den);
        }
        orow[lane * U + u] = num / den;
    }
}

template <int GB>
static int attn_launch(cuda_ctx *c, int D, unsigned gy, unsigned gz, int cap, err *e, float *out, const float *q,
                       int n_head, int n_head_kv, const void *k, int kf16, const void *v, int vf16, const int32_t *pos,
                       int row0, float scale, const at_pro &pro)
{
    switch (D) {
    case 64:
        return launch_clustered(c, k_attn<GB, 64>, gy, gz, AT_THREADS, cap, e, "attention_decode", out, q, n_head,
                                n_head_kv, D, k, kf16, v, vf16, pos, row0, scale, pro);
    case 128:
        return launch_clustered(c, k_attn<GB, 128>, gy, gz, AT_THREADS, cap, e, "attention_decode", out, q, n_head,
                                n_head_kv, D, k, kf16, v, vf16, pos, row0, scale, pro);
    case 256:
        return launch_clustered(c, k_attn<GB, 256>, gy, gz, AT_THREADS, cap, e, "attention_decode", out, q, n_head,
                                n_head_kv, D, k, kf16, v, vf16, pos, row0, scale, pro);
    default:
        return launch_clustered(c, k_attn<GB, 0>, gy, gz, AT_THREADS, cap, e, "attention_decode", out, q, n_head,
                                n_head_kv, D, k, kf16, v, vf16, pos, row0, scale, pro);
    }
}

/* The launch shape follows the context (bench/RESULTS.md, session 17: the
 * whole decode chain timed per shape on an H100): the cluster is capped at
 * 4 CTAs while a row sees at most AT_CTX4 positions, at 8 up to AT_CTX8,
 * else 16 (CL_MAX); the heads a CTA then keep the grid near one CTA an SM
 * (4 / 8 / 16 CTAs a cluster: 1 / 2 / 4 of 32 query heads). Smaller
 * clusters start sooner behind the q/k/v matvec and merge over fewer
 * ranks; past AT_CTX8 the 16-way split of the positions wins. The bucket
 * decides the arithmetic (a row's slices follow the cluster size), so
 * every call that must agree bit for bit with another passes a context
 * bound of the same bucket (cuda_attention_bucket). */
#define AT_CTX4 128
#define AT_CTX8 2048

extern "C" int cuda_attention_bucket(int n_kv) { return n_kv <= AT_CTX4 ? 0 : n_kv <= AT_CTX8 ? 1 : 2; }

extern "C" int cuda_attention_bucket_end(int b) { return b <= 0 ? AT_CTX4 : b == 1 ? AT_CTX8 : INT_MAX; }

/* The cluster cap of a launch for contexts up to n_kv_max (its bucket's,
 * unless cuda_attention_force_cluster set one). */
static int attn_cap(const cuda_ctx *c, int n_kv_max)
{
    static const int caps[CUDA_ATTN_BUCKETS] = { 4, 8, CL_MAX };
    return c->at_cluster > 0 ? c->at_cluster : caps[cuda_attention_bucket(n_kv_max)];
}

/* Heads per CTA: the largest of 8, 4, 2, 1 dividing the group, halved
 * while the grid (at cap-CTA clusters) fills less than ~3/4 of the SMs
 * twice over: more CTAs beat loading each K/V row once per group. */
static int attn_gb(const cuda_ctx *c, int cap, int n_head, int n_head_kv, int n_q_grid)
{
    const int G = n_head / n_head_kv;
    int gb = 8;
    while (G % gb) gb /= 2;
    const int64_t sms = c->info.sm_count > 0 ? c->info.sm_count : 132;
    while (gb > 1 && (int64_t)cap * (n_head / gb) * n_q_grid * 2 <= sms * 3 / 2) gb /= 2;
    if (c->at_heads > 0 && c->at_heads <= 8 && G % c->at_heads == 0) gb = c->at_heads;
    return gb;
}

/* The cluster size a k_attn launch of gb heads a CTA and head_dim D gets
 * (launch_clustered's: the device's largest for that kernel, capped). */
template <int GB>
static const void *attn_key_gb(int D)
{
    return D == 64 ? (const void *)k_attn<GB, 64> : D == 128 ? (const void *)k_attn<GB, 128>
         : D == 256 ? (const void *)k_attn<GB, 256> : (const void *)k_attn<GB, 0>;
}
static int attn_cluster(const cuda_ctx *c, int gb, int D, int cap)
{
    const void *key = gb == 8 ? attn_key_gb<8>(D) : gb == 4 ? attn_key_gb<4>(D) : gb == 2 ? attn_key_gb<2>(D)
                    : attn_key_gb<1>(D);
    const int cl = cluster_size(key, c->info.device, AT_THREADS);
    return cap > 0 && cap < cl ? cap : cl;
}

/* n_q_grid: the query rows the launch shape is chosen for (heads per CTA,
 * hence the kernel and its cluster); n_q rows are computed, row i at
 * position pos[0] + row0 + i; n_kv_max: the context bound whose bucket
 * picks the cluster cap (unless cuda_attention_force_cluster set one). */
static int attn_run(cuda_ctx *c, float *out, const float *q, int n_q, int n_q_grid, int n_head, int n_head_kv,
                    int head_dim, const void *k, int k_f16, const void *v, int v_f16, const int32_t *pos, int row0,
                    int n_kv_max, float scale, const at_pro &pro, err *e)
{
    if (n_q <= 0 || n_q > 65535 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 ||
        head_dim > AT_DMAX || head_dim % 8)
        return err_setf(e, ERR_USAGE,
                        "cuda_attention_decode: n_q=%d n_head=%d n_head_kv=%d head_dim=%d "
                        "(n_head a multiple of n_head_kv, head_dim a multiple of 8 <= %d)",
                        n_q, n_head, n_head_kv, head_dim, AT_DMAX);
    const int cap = attn_cap(c, n_kv_max), gb = attn_gb(c, cap, n_head, n_head_kv, n_q_grid);
    const unsigned gy = (unsigned)(n_head / gb), gz = (unsigned)n_q;
    switch (gb) {
    case 8:
        return attn_launch<8>(c, head_dim, gy, gz, cap, e, out, q, n_head, n_head_kv, k, k_f16, v, v_f16, pos, row0,
                              scale, pro);
    case 4:
        return attn_launch<4>(c, head_dim, gy, gz, cap, e, out, q, n_head, n_head_kv, k, k_f16, v, v_f16, pos, row0,
                              scale, pro);
    case 2:
        return attn_launch<2>(c, head_dim, gy, gz, cap, e, out, q, n_head, n_head_kv, k, k_f16, v, v_f16, pos, row0,
                              scale, pro);
    default:
        return attn_launch<1>(c, head_dim, gy, gz, cap, e, out, q, n_head, n_head_kv, k, k_f16, v, v_f16, pos, row0,
                              scale, pro);
    }
}

extern "C" void cuda_attention_force_cluster(cuda_ctx *c, int n) { c->at_cluster = n > 0 ? n : 0; }
extern "C" void cuda_attention_force_heads(cuda_ctx *c, int gb) { c->at_heads = gb > 0 ? gb : 0; }

extern "C" int cuda_attention_decode(cuda_ctx *c, float *out, const float *q, int n_q, int n_head, int n_head_kv,
                                     int head_dim, const void *k, int k_f16, const void *v, int v_f16,
                                     const int32_t *pos, int n_kv_max, float scale, err *e)
{
    return attn_run(c, out, q, n_q, n_q, n_head, n_head_kv, head_dim, k, k_f16, v, v_f16, pos, 0, n_kv_max, scale,
                    at_pro{}, e);
}

/* k_attn_rows by head_dim (64, 128) and caches (f32, f16): one launch
 * signature, one table for the launch and for the init */
typedef void (*ar_fn)(float *, const float *, int, int, const void *, const void *, const int32_t *, int, float, int,
                      int);
static const ar_fn ar_kernels[2][2] = {
    { k_attn_rows<64, false>, k_attn_rows<64, true> },
    { k_attn_rows<128, false>, k_attn_rows<128, true> },
};

/* The rows of one bucket by k_attn_rows (*done = 1), when the shape has
 * it (head_dim 64 or 128, both caches f16 or both f32, a group of at most
 * 8 heads, its shared memory within the device's) and
 * cuda_attention_force_one_row is off; else *done = 0 and nothing is
 * launched. ncl: the cluster of the one-row launch (n_q_grid 1) for the
 * bucket's bound n_kv_max. */
static int attn_rows_run(cuda_ctx *c, float *out, const float *q, int nr, int n_head, int n_head_kv, int D,
                         const void *k, int k_f16, const void *v, int v_f16, const int32_t *pos, int row0,
                         int n_kv_max, float scale, int *done, err *e)
{
    *done = 0;
    if (c->at_one_row || (D != 64 && D != 128) || !k_f16 != !v_f16 || n_head <= 0 || n_head_kv <= 0 ||
        n_head % n_head_kv || n_head / n_head_kv > 8)
        return 0;
    const int G = n_head / n_head_kv, cap = attn_cap(c, n_kv_max);
    const int ncl = attn_cluster(c, attn_gb(c, cap, n_head, n_head_kv, 1), D, cap);
    const int vw = at_per(n_kv_max, ncl) > AT_SPREAD;   /* the slice grows with the context */
    const size_t smem = ar_smem(D, k_f16 ? 2 : 4, G, ncl, vw);
    if (smem > c->info.smem_per_block_optin) return 0;
    *done = 1;
    return cuda_launch(c, ar_kernels[D == 128][k_f16 != 0], dim3((unsigned)n_head_kv, (unsigned)nr),
                       dim3(32u * (unsigned)G), smem, e, "attention_rows", out, q, n_head, n_head_kv, k, v, pos, row0,
                       scale, ncl, vw);
}

/* k_attn_rows' shared-memory limit, once per context (cuda_open). */
int cuda_attention_init(cuda_ctx *c, err *e)
{
    const int lim = (int)c->info.smem_per_block_optin;
    for (int i = 0; i < 4; i++)
        if (cuda_fail(e, cudaFuncSetAttribute(ar_kernels[i / 2][i % 2], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              lim),
                      "cuda_attention_init"))
            return -1;
    return 0;
}

extern "C" void cuda_attention_force_one_row(cuda_ctx *c, int on) { c->at_one_row = on != 0; }

/* The rows split where their context crosses a bucket's end: each part one
 * launch with the one-row shape of its bucket. */
extern "C" int cuda_attention_rows(cuda_ctx *c, float *out, const float *q, int n_q, int n_head, int n_head_kv,
                                   int head_dim, const void *k, int k_f16, const void *v, int v_f16,
                                   const int32_t *pos, int pos0, float scale, err *e)
{
    if (pos0 < 0 || n_q <= 0 || n_q > 65535)
        return err_setf(e, ERR_USAGE, "cuda_attention_rows: n_q=%d at position %d", n_q, pos0);
    const size_t qd = (size_t)n_head * (head_dim > 0 ? head_dim : 0);
    for (int r0 = 0; r0 < n_q;) {
        const int b = cuda_attention_bucket(pos0 + r0 + 1);
        const int64_t end = cuda_attention_bucket_end(b);   /* the last n_kv of the bucket */
        const int nr = (int)(end - (pos0 + r0) < n_q - r0 ? end - (pos0 + r0) : n_q - r0);
        int done = 0;
        int rc = attn_rows_run(c, out + r0 * qd, q + r0 * qd, nr, n_head, n_head_kv, head_dim, k, k_f16, v, v_f16, pos,
                               r0, pos0 + r0 + nr, scale, &done, e);
        if (!rc && !done)
            rc = attn_run(c, out + r0 * qd, q + r0 * qd, nr, 1, n_head, n_head_kv, head_dim, k, k_f16, v, v_f16, pos,
                          r0, pos0 + r0 + nr, scale, at_pro{}, e);
        if (rc) return rc;
        r0 += nr;
    }
    return 0;
}

/* One query row: the prologue's arguments checked as cuda_qk_norm_rope_store
 * checks them, then the attention launch with the prologue (n_rot / 2 <=
 * AT_DMAX / 2 follows from n_rot <= head_dim). */
extern "C" int cuda_attention_decode_fused(cuda_ctx *c, float *out, const float *q, const float *k, const float *v,
                                           const float *q_norm, const float *k_norm, int n_head, int n_head_kv,
                                           int head_dim, int n_rot, const int32_t *pos, float freq_base,
                                           float freq_scale, float eps, void *k_cache, void *v_cache, int f16,
                                           int n_kv_max, float scale, err *e)
{
    if (n_rot <= 0 || (n_rot & 1) || n_rot > head_dim || !k || !v || !q_norm || !k_norm || !k_cache || !v_cache)
        return err_setf(e, ERR_USAGE, "cuda_attention_decode_fused: head_dim=%d n_rot=%d (even, <= head_dim), "
                        "k, v, norms and caches needed", head_dim, n_rot);
    if (out == q) return err_setf(e, ERR_USAGE, "cuda_attention_decode_fused: out must not be q");
    /* theta_scale by the host's libm, as cuda_rope_neox */
    const at_pro pro = { k, v, q_norm, k_norm, k_cache, v_cache, n_rot, powf(freq_base, -2.0f / n_rot),
                         freq_scale, eps };
    return attn_run(c, out, q, 1, 1, n_head, n_head_kv, head_dim, k_cache, f16, v_cache, f16, pos, 0, n_kv_max, scale,
                    pro, e);
}

/* ==== MoE combine: x += ((w0*e0 + w1*e1) + ...), qwen3moe.c's order ====
 * (cuda_moe_combine_rmsnorm_quant, in cuda_matvec.cu, is this kernel's
 * arithmetic (moe_term) fused with the next norm, for one decode row.) */
__global__ void k_moe_combine(float *x, const float *__restrict__ eout, const float *__restrict__ wts, int k,
                              int64_t n, int64_t total)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int64_t r = i / n, c = i - r * n;
    const float *er = eout + (size_t)r * k * n + c;
    const float *wr = wts + (size_t)r * k;
    float acc = moe_term(0.f, er[0], wr[0], 0);
    for (int t = 1; t < k; t++) acc = moe_term(acc, er[(size_t)t * n], wr[t], t);
    x[i] = __fadd_rn(acc, x[i]);
}

extern "C" int cuda_moe_combine(cuda_ctx *c, float *x, const float *eout, const float *wts, int rows, int k,
                                int64_t n, err *e)
{
    if (rows <= 0 || k <= 0 || n <= 0)
        return err_setf(e, ERR_USAGE, "cuda_moe_combine: rows=%d k=%d n=%lld", rows, k, (long long)n);
    const int64_t total = (int64_t)rows * n;
    return cuda_launch(c, k_moe_combine, (unsigned)((total + 255) / 256), 256, 0, e, "moe_combine", x, eout, wts, k,
                       n, total);
}

/* ==== y = a + b ==== */
__global__ void k_add(float *y, const float *a, const float *b, int64_t n)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(a[i], b[i]);
}

extern "C" int cuda_add(cuda_ctx *c, float *y, const float *a, const float *b, int64_t n, err *e)
{
    if (n <= 0) return err_setf(e, ERR_USAGE, "cuda_add: n=%lld", (long long)n);
    return cuda_launch(c, k_add, (unsigned)((n + 255) / 256), 256, 0, e, "add", y, a, b, n);
}

/* ==== Greedy argmax: a cluster per row ====
 * The CPU scan (sampler_sample, temp <= 0) keeps best = 0 and moves to i
 * when x[i] > x[best]. So: the lowest index of the largest non-NaN value,
 * except that a NaN at index 0 is never left (nothing compares greater),
 * and a row of NaNs answers 0. Each CTA reduces a slice with the order
 * "larger, then lower index" (NaN never taken), the cluster merges in rank
 * order, and rank 0 applies the x[0] rule. */
#define AM_THREADS 1024
__device__ __forceinline__ void am_better(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

__global__ void __launch_bounds__(AM_THREADS)
k_argmax(int32_t *out, const float *__restrict__ x, int64_t n)
{
    pdl_enter();
    __shared__ float wv[AM_THREADS / 32];
    __shared__ int wi[AM_THREADS / 32];
    __shared__ float cv;
    __shared__ int ci;
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), ncl = (int)cl.num_blocks();
    const float *xr = x + (size_t)blockIdx.y * (size_t)n;
    int64_t per = (n + ncl - 1) / ncl;
    per = (per + 3) & ~(int64_t)3;
    const int64_t i0 = rank * per < n ? rank * per : n, i1 = i0 + per < n ? i0 + per : n;
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll 4
    for (int64_t i = i0 + threadIdx.x; i < i1; i += AM_THREADS) am_better(bv, bi, xr[i], (int)i);
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_better(bv, bi, ov, oi);
    }
    /* am_better treats an (ov, oi) pair with ov NaN as worse; a NaN bv
     * never occurs (only numbers are taken) */
    if ((threadIdx.x & 31) == 0) { wv[threadIdx.x >> 5] = bv; wi[threadIdx.x >> 5] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = wv[0];
        int ix = wi[0];
        for (int w = 1; w < AM_THREADS / 32; w++) am_better(v, ix, wv[w], wi[w]);
        cv = v;
        ci = ix;
    }
    cl.sync();
    if (rank == 0 && threadIdx.x == 0) {
        float v = cv;
        int ix = ci;
        for (int r = 1; r < ncl; r++) am_better(v, ix, *cl.map_shared_rank(&cv, r), *cl.map_shared_rank(&ci, r));
        if (ix == INT_MAX || isnan(xr[0])) ix = 0;
        out[blockIdx.y] = ix;
    }
    cl.sync();
}

extern "C" int cuda_argmax(cuda_ctx *c, int32_t *out, const float *x, int rows, int64_t n, err *e)
{
    if (rows <= 0 || rows > 65535 || n <= 0 || n >= INT_MAX)
        return err_setf(e, ERR_USAGE, "cuda_argmax: rows=%d n=%lld", rows, (long long)n);
    return launch_clustered(c, k_argmax, (unsigned)rows, 1u, AM_THREADS, 0, e, "argmax", out, x, n);
}

/* The attention probe's mean phases (µs) since the last call, and the
 * launches they cover; cleared. Trace builds only (else ERR_UNSUPPORTED). */
extern "C" int cuda_attention_probe(cuda_ctx *c, double us[6], unsigned *n, err *e)
{
    (void)c;
#ifdef STRATA_CUDA_TRACE
    unsigned long long sum[AT_PROBES] = {0};
    unsigned cnt = 0;
    int r = cuda_fail(e, cudaMemcpyFromSymbol(sum, g_atp_sum, sizeof sum), "cuda_attention_probe: reading the sums");
    if (!r) r = cuda_fail(e, cudaMemcpyFromSymbol(&cnt, g_atp_n, sizeof cnt), "cuda_attention_probe: reading the count");
    if (r) return r;
    for (int i = 1; i < AT_PROBES; i++) us[i - 1] = cnt ? (double)sum[i] / cnt / 1e3 : 0.0;
    *n = cnt;
    const unsigned long long z[AT_PROBES] = {0};
    const unsigned zn = 0;
    r = cuda_fail(e, cudaMemcpyToSymbol(g_atp_sum, z, sizeof z), "cuda_attention_probe: clearing the sums");
    return r ? r : cuda_fail(e, cudaMemcpyToSymbol(g_atp_n, &zn, sizeof zn), "cuda_attention_probe: clearing the count");
#else
    (void)us, (void)n;
    return err_setf(e, ERR_UNSUPPORTED, "cuda_attention_probe: a CUDA_TRACE=1 build only");
#endif
}

CUDA_TRACE_BIND(layer)

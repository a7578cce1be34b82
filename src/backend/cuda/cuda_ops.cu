/* cuda_ops.cu: the float row ops of decode, with model/ops.c numerics where
 * the device can match them (see cuda_backend.h for each contract).
 * Multiplications that the CPU rounds separately are written __fmul_rn so
 * that nvcc cannot contract them into FMAs. */
#include <limits.h>
#include <math.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_rows.cuh"

/* ==== RMSNorm: one CTA (256 threads) per row ====
 * sum of float products in double (ops_rmsnorm), reduced as a tree; then
 * mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps) (IEEE division
 * and square root: nvcc's defaults), y = (x * scale) * w. */
__global__ void __launch_bounds__(RMS_THREADS)
k_rmsnorm(float *y, const float *x, const float *__restrict__ w, int n, float eps)
{
    pdl_enter();
    __shared__ double part[RMS_THREADS / 32];
    rms_row(y + (size_t)blockIdx.x * n, x + (size_t)blockIdx.x * n, w, n, eps, part);
}

extern "C" int cuda_rmsnorm(cuda_ctx *c, float *y, const float *x, const float *w, int n, int rows, float eps, err *e)
{
    if (n <= 0 || rows <= 0) return err_setf(e, ERR_USAGE, "cuda_rmsnorm: n=%d rows=%d", n, rows);
    return cuda_launch(c, k_rmsnorm, rows, RMS_THREADS, 0, e, "rmsnorm", y, x, w, n, eps);
}

/* ==== SwiGLU: h = silu(g) * u, silu(v) = v / (1 + expf(-v)) ==== */
__global__ void k_swiglu(float *h, const float *g, const float *u, int64_t n)
{
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[i] = swiglu1(g[i], u[i]);
}

extern "C" int cuda_swiglu(cuda_ctx *c, float *h, const float *g, const float *u, int64_t n, err *e)
{
    if (n <= 0) return err_setf(e, ERR_USAGE, "cuda_swiglu: n=%lld", (long long)n);
    return cuda_launch(c, k_swiglu, (unsigned)((n + 255) / 256), 256, 0, e, "swiglu", h, g, u, n);
}

/* ==== Router: softmax, top-k, renormalised weights; one warp per row ====
 * Probabilities live in shared memory (n <= 1024 per warp). top-k runs k
 * warp-wide argmax rounds; "better" = larger p, or equal p and lower index
 * (ops_topk's order). The rounds compare KEYS (rt_key): a probability
 * p >= 0 orders as its bits + 2; a NaN (any NaN or infinite logit makes
 * every p of the row NaN, as on the CPU) is key 1, so it is still chosen,
 * lowest index first, as ops_topk picks the first k of an all-NaN row; a
 * chosen entry, or one past n, is key 0. So an id is always one of the
 * row's n (a broken model's NaN logits give NaN weights, never an
 * expert id outside the stack). */
#define RT_WARPS 4
#define RT_MAXN 1024

__device__ __forceinline__ unsigned rt_key(float p) { return p >= 0.f ? __float_as_uint(p) + 2u : p != p ? 1u : 0u; }
__device__ __forceinline__ float rt_val(unsigned key) { return key >= 2u ? __uint_as_float(key - 2u) : __int_as_float(0x7fc00000); }

/* Round t of the top-k, across the warp: the largest of the lanes' best
 * keys bk (at index bi), then the lowest index among the lanes holding it
 * (k <= n: some entry is still unchosen, key >= 1, so the index is < n);
 * lane t keeps its value and index. Returns the index chosen. */
__device__ __forceinline__ int rt_round(unsigned bk, int bi, int t, float *selv, int *seli)
{
    const unsigned km = __reduce_max_sync(0xffffffffu, bk);
    bi = (int)__reduce_min_sync(0xffffffffu, bk == km ? (unsigned)bi : (unsigned)INT_MAX);
    if ((int)(threadIdx.x & 31) == t) { *selv = rt_val(km); *seli = bi; }
    return bi;
}

/* The k chosen (lane t < k holds the t-th): weights renormalised by their
 * sum in selection order in double (route()), stored with the ids. */
__device__ __forceinline__ void rt_store(float selv, int seli, int k, int32_t *ids, float *wout)
{
    double ws = 0.0;
    for (int t = 0; t < k; t++) ws += (double)__shfl_sync(0xffffffffu, selv, t);
    float fs = (float)ws;
    if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;
    const int lane = threadIdx.x & 31;
    if (lane < k) {
        ids[lane] = seli;
        wout[lane] = selv / fs;
    }
}
__global__ void __launch_bounds__(32 * RT_WARPS)
k_router(const float *__restrict__ logits, int n, int k, int rows, int32_t *ids, float *wout)
{
    pdl_enter();
    __shared__ float ps[RT_WARPS][RT_MAXN];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * RT_WARPS + warp;
    if (row >= rows) return;
    const float *lr = logits + (size_t)row * n;
    float *p = ps[warp];
    float mx = -INFINITY;
    for (int i = lane; i < n; i += 32) {
        const float v = lr[i];
        p[i] = v;
        mx = v > mx ? v : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = om > mx ? om : mx;
    }
    double sum = 0.0;
    for (int i = lane; i < n; i += 32) {
        const float v = expf(p[i] - mx);
        p[i] = v;
        sum += (double)v;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
    unsigned *pk = (unsigned *)p;   /* each lane rewrites only its own entries */
    for (int i = lane; i < n; i += 32) pk[i] = rt_key(__fmul_rn(p[i], inv));
    __syncwarp();

    float selv = 0.f;   /* lane t < k keeps the t-th chosen value */
    int seli = 0;
    for (int t = 0; t < k; t++) {
        unsigned bk = 0u;
        int bi = INT_MAX;
        for (int i = lane; i < n; i += 32) {
            const unsigned v = pk[i];
            if (v > bk) { bk = v; bi = i; }   /* i ascends: strict > keeps the lower index */
        }
        bi = rt_round(bk, bi, t, &selv, &seli);
        __syncwarp();
        if (lane == 0) pk[bi] = 0u;
        __syncwarp();
    }
    rt_store(selv, seli, k, ids + (size_t)row * k, wout + (size_t)row * k);
}

/* k_router with a row's probabilities in registers (n <= 32 VPL: lane l
 * holds entries l, l + 32, ...): the same operations in the same order
 * (entries past n take no part: -inf for the max, left out of the sum, key
 * 0 for the selection, as the smem loop never visits them), but a round of
 * the top-k is three compares, two reductions and a predicated move of
 * the winner's lane, with no shared-memory stores and no warp barriers. */
template <int VPL>
__global__ void __launch_bounds__(32 * RT_WARPS)
k_router_reg(const float *__restrict__ logits, int n, int k, int rows, int32_t *ids, float *wout)
{
    pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * RT_WARPS + warp;
    if (row >= rows) return;
    const float *lr = logits + (size_t)row * n;
    float p[VPL];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < VPL; s++) {
        const int i = lane + 32 * s;
        p[s] = i < n ? lr[i] : -INFINITY;
        if (i < n) mx = p[s] > mx ? p[s] : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = om > mx ? om : mx;
    }
    double sum = 0.0;
#pragma unroll
    for (int s = 0; s < VPL; s++) {
        if (lane + 32 * s < n) {
            p[s] = expf(p[s] - mx);
            sum += (double)p[s];
        }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
    unsigned pk[VPL];
#pragma unroll
    for (int s = 0; s < VPL; s++) pk[s] = lane + 32 * s < n ? rt_key(__fmul_rn(p[s], inv)) : 0u;

    float selv = 0.f;
    int seli = 0;
    for (int t = 0; t < k; t++) {
        unsigned bk = 0u;
        int bi = INT_MAX;
#pragma unroll
        for (int s = 0; s < VPL; s++)
            if (pk[s] > bk) { bk = pk[s]; bi = lane + 32 * s; }   /* s ascends: the lower index on ties */
        bi = rt_round(bk, bi, t, &selv, &seli);
#pragma unroll
        for (int s = 0; s < VPL; s++)
            if (lane + 32 * s == bi) pk[s] = 0u;
    }
    rt_store(selv, seli, k, ids + (size_t)row * k, wout + (size_t)row * k);
}

extern "C" int cuda_router_topk(cuda_ctx *c, const float *logits, int n, int k, int rows, int32_t *ids, float *w,
                                err *e)
{
    if (n <= 0 || n > RT_MAXN || k < 1 || k > 32 || k > n || rows <= 0)
        return err_setf(e, ERR_USAGE, "cuda_router_topk: n_expert=%d k=%d rows=%d (n_expert <= %d, k <= 32)", n, k,
                        rows, RT_MAXN);
    if (n <= 128)   /* the MoE routers of the Qwen3 shapes: 128 experts */
        return cuda_launch(c, k_router_reg<4>, (rows + RT_WARPS - 1) / RT_WARPS, 32 * RT_WARPS, 0, e, "router", logits,
                           n, k, rows, ids, w);
    return cuda_launch(c, k_router, (rows + RT_WARPS - 1) / RT_WARPS, 32 * RT_WARPS, 0, e, "router", logits, n, k,
                       rows, ids, w);
}

CUDA_TRACE_BIND(ops)

/* cuda_rows.cuh: device functions of one float row, shared by the
 * stand-alone kernels (k_rmsnorm, k_rope, k_swiglu, the activation
 * quantizers, k_moe_combine) and the fused ones built from them, so a
 * fused kernel gives the stand-alone sequence's results bit for bit (the
 * same operations in the same order; cuda_backend.h states each against
 * the CPU). */
#ifndef STRATA_CUDA_ROWS_CUH
#define STRATA_CUDA_ROWS_CUH

#include <math.h>

/* L2 prefetch of the 128-byte lines holding [p, p + bytes), spread over
 * the nthr threads of a CTA (this one: tid). A kernel issues it before its
 * dependency wait for bytes written at load (norm weights; the direct
 * matvec's rows, mvd_prefetch_l2): a prefetch
 * reads nothing into the program (cuda_internal.h, pdl_enter), and the
 * loads after the wait then hit L2 instead of paying HBM's latency on the
 * kernel's critical path (a layer's norm weights are evicted by the
 * ~2 GB a token streams between two uses). */
__device__ __forceinline__ void cta_prefetch_l2(const void *p, size_t bytes, int tid, int nthr)
{
    const uintptr_t a0 = (uintptr_t)p & ~(uintptr_t)127, a1 = (uintptr_t)p + bytes;
    for (uintptr_t a = a0 + 128 * (uintptr_t)tid; a < a1; a += 128 * (uintptr_t)nthr)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a < (uintptr_t)p ? (uintptr_t)p : a));
}

/* RMSNorm of one row by a CTA of RMS_THREADS threads (all of them call
 * it): the sum of float products in double (ops_rmsnorm), reduced as a
 * tree (per thread, then warp shuffles, then the warps' parts in order);
 * mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps), y = (x *
 * scale) * w. y may alias x. `part` is RMS_THREADS / 32 doubles of shared
 * memory. Ends without a barrier: the caller syncs before reading y
 * written by other threads. */
#define RMS_THREADS 256
#define RMS_WREG 8
__device__ __forceinline__ void rms_row(float *y, const float *x, const float *__restrict__ w, int n, float eps,
                                        double *part)
{
    /* the thread's first RMS_WREG weights loaded with x, before the sum,
     * so the scaling after the barrier waits on no global load (n <= 2048:
     * all of them) */
    float wr[RMS_WREG];
#pragma unroll
    for (int j = 0; j < RMS_WREG; j++) {
        const int i = threadIdx.x + j * RMS_THREADS;
        wr[j] = i < n ? w[i] : 0.0f;
    }
    double s = 0.0;
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += RMS_THREADS) {
        const float v = x[i];
        s += (double)__fmul_rn(v, v);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();   /* also: every read of x is done before any write of y (y may alias x) */
    double t = 0.0;
    for (int i = 0; i < RMS_THREADS / 32; i++) t += part[i];
    const float mean = (float)(t / n);
    const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < RMS_WREG; j++) {
        const int i = threadIdx.x + j * RMS_THREADS;
        if (i < n) y[i] = __fmul_rn(__fmul_rn(x[i], scale), wr[j]);
    }
    for (int i = threadIdx.x + RMS_WREG * RMS_THREADS; i < n; i += RMS_THREADS)
        y[i] = __fmul_rn(__fmul_rn(x[i], scale), w[i]);
}

/* One term of the MoE combine (cuda_moe_combine's order, qwen3moe.c's):
 * acc after expert t of k, given acc after t - 1: the rounded product
 * e * w, added to acc from t = 1 on (t = 0 starts the sum: no 0 + p, which
 * would turn a -0 product into +0). The combine is then x + acc, rounded:
 * __fadd_rn(acc, x). No FMA contraction anywhere. */
__device__ __forceinline__ float moe_term(float acc, float e, float w, int t)
{
    const float p = __fmul_rn(e, w);
    return t ? __fadd_rn(acc, p) : p;
}

/* NeoX RoPE tables of one position, by a CTA of `nthr` threads, this one
 * thread `tid` of them (entries tid, tid + nthr, ...): cs[i], sn[i] for
 * i < n_rot / 2, theta = the CPU's chain of float products p *
 * theta_scale^i (ops_rope_cache), cos/sin of freq_scale * theta in double,
 * rounded once. Ends without a barrier. */
__device__ __forceinline__ void rope_table(float *cs, float *sn, int half, int p, float theta_scale,
                                           float freq_scale, int tid, int nthr)
{
    for (int i = tid; i < half; i += nthr) {
        float theta = (float)p;
        for (int t = 0; t < i; t++) theta = __fmul_rn(theta, theta_scale);
        const double a = (double)__fmul_rn(freq_scale, theta);
        double s, co;
        sincos(a, &s, &co);
        cs[i] = (float)co;
        sn[i] = (float)s;
    }
}

/* One head's RMSNorm (n <= RMS_THREADS floats) by one warp, bit for bit
 * what rms_row over a CTA of RMS_THREADS threads gives: there thread t
 * squares element t, each warp sums its 32 squares by an xor butterfly
 * (every lane ends with the same bits) and the warps' sums are added in
 * warp order from 0.0; here lane l plays thread 32 v + l of each warp v in
 * turn. Warps past the row's end would add 0.0 (exact), so they are
 * skipped. y may alias x (each lane reads its elements before writing
 * them). */
__device__ __forceinline__ void warp_rms(float *y, const float *x, const float *__restrict__ w, int n, float eps,
                                         int lane)
{
    /* the lane's x and w loaded together first (n <= 256: one round trip,
     * not one for x and another for w after the sum) */
    float xv[RMS_THREADS / 32], wv[RMS_THREADS / 32];
#pragma unroll
    for (int v = 0; v < RMS_THREADS / 32; v++) {
        const int i = 32 * v + lane;
        xv[v] = i < n ? x[i] : 0.0f;
        wv[v] = i < n ? w[i] : 0.0f;
    }
    double t = 0.0;
#pragma unroll
    for (int v = 0; v < RMS_THREADS / 32; v++) {
        if (32 * v >= n) break;
        const int i = 32 * v + lane;
        double s = i < n ? (double)__fmul_rn(xv[v], xv[v]) : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        t += s;
    }
    const float mean = (float)(t / n);
    const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int v = 0; v < RMS_THREADS / 32; v++) {
        const int i = 32 * v + lane;
        if (i < n) y[i] = __fmul_rn(__fmul_rn(xv[v], scale), wv[v]);
    }
}

/* Rotate pair i of one head in place (ops_rope_neox's rounded products
 * and sums). */
__device__ __forceinline__ void rope_pair(float *head, int i, int half, float c, float s)
{
    const float x0 = head[i], x1 = head[i + half];
    head[i]        = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    head[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* silu(g) * u as ops_swiglu: g / (1 + expf(-g)), then the rounded product
 * (CUDA's expf is within 2 ulp of glibc's). */
__device__ __forceinline__ float swiglu1(float g, float u)
{
    const float s = g / (1.0f + expf(-g));
    return __fmul_rn(s, u);
}

#endif

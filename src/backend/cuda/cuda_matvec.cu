/* cuda_matvec.cu: activation quantization (Q8_K, Q8_0, Q8_1, f16, bf16,
 * f32) and the decode matvec for Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / Q5_0 /
 * Q4_1 / Q5_1 / F32 / F16 / BF16 weights.
 *
 * Matvec design (bandwidth-bound: every weight byte is read once, ~0.56 B
 * per weight for Q4_K, so the kernel must keep HBM busy, not the ALUs):
 *   - one CTA = 4 warps = a tile of R consecutive rows of one matrix
 *     (R = 4..64, chosen so the tile is <= 32 KB; smaller when the grid
 *     would not fill the GPU twice). The tile's bytes are contiguous, so
 *     the CTA copies them to shared memory with 16-byte cp.async (LDGSTS,
 *     coalesced, all in flight at once, no registers held), byte copies
 *     only for the unaligned ends;
 *   - meanwhile it unpacks the quantized activation row (L2-resident: all
 *     CTAs read it) into shared memory as aligned int8/float/int16 arrays;
 *   - warp w computes rows w, w + 4, ...: lanes take the row's items
 *     (cuda_qdot.cuh), integer dot products with dp4a, float scaling per
 *     item, then a shuffle reduction.
 * Several CTAs per SM (~20-30 KB of shared memory each) keep ~100+ KB of
 * loads in flight per SM, what HBM3e needs at this latency.
 * A second, direct kernel (k_matvec_direct, below) takes rows of fewer
 * than 32 items (Q4_K K = 768), where a warp per row idles lanes; the
 * H200 A/B (bench/RESULTS.md, issue 9) chose the kernel per shape.
 * Float weights (F32/F16/BF16) use the same two kernels with 16-byte items
 * and read their (float-sized) activation row straight from global memory
 * instead of unpacking it; short grids (the F32 router, 128 rows) get
 * tiles of 1 or 2 rows whose items the CTA's warps split.
 * Instead of unpacking a quantized row, the direct kernel's CTAs may make
 * it themselves from f32 (cuda_matvec_args.xquant: mv_act): quantize the
 * row or swiglu(g, u), or norm it first, so the decode chain needs no
 * quantizer or norm launch before Wo, the down projection and the router. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_qdot.cuh"
#include "backend/cuda/cuda_rows.cuh"

#define TRY_MV(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

/* ==== Activation quantization ==== */

/* One warp per 256-value block, 8 values a lane (lane l: 8l .. 8l+7),
 * quant_ref_quant_q8_K bit for bit: the FIRST largest |x| (lowest index on
 * ties) gives max; iscale = -127/max; q = min(127, nearest-even(iscale*x))
 * (no FMA: __fmul_rn); bsums of 16; d = 1/iscale; an all-zero block is
 * all zeros. */
/* A lane's 8 quants of a Q8_K block at iscale = -127/max: packed into pk,
 * and their sum returned (the bsums' part). quant_q8_K_warp and
 * quant_q8_K_sm share it. */
__device__ __forceinline__ int q8K_quants(const float v[8], float iscale, uint32_t pk[2])
{
    int s = 0;
    pk[0] = pk[1] = 0;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        int q = __float2int_rn(__fmul_rn(iscale, v[t]));
        q = q < 127 ? q : 127;
        s += q;
        pk[t >> 2] |= (uint32_t)(q & 0xff) << (8 * (t & 3));
    }
    return s;
}

template <int SWI>
__device__ __forceinline__ void quant_q8_K_warp(const float *x, const float *u, uint8_t *out, int64_t gb)
{
    const int lane = threadIdx.x & 31;
    const float *xb = x + gb * 256, *ub = SWI ? u + gb * 256 : NULL;
    float v[8];
    float am = 0.f;
    int idx = INT_MAX;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        v[t] = SWI ? swiglu1(xb[lane * 8 + t], ub[lane * 8 + t]) : xb[lane * 8 + t];
        const float ax = fabsf(v[t]);
        if (ax > am) { am = ax; idx = lane * 8 + t; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, o);
        const int oidx = __shfl_xor_sync(0xffffffffu, idx, o);
        if (oam > am || (oam == am && oidx < idx)) { am = oam; idx = oidx; }
    }
    uint8_t *ob = out + gb * CQ8_K_BYTES;
    if (am == 0.f) {
        /* d = 0, qs = 0, bsums = 0 (as quant_ref_quant_q8_K's memset) */
        qd_st32(ob + 4 + 8 * lane, 0);
        qd_st32(ob + 8 + 8 * lane, 0);
        if (lane < 8) qd_st32(ob + 260 + 4 * lane, 0);
        if (lane == 0) qd_st32(ob, 0);
        return;
    }
    const float mx = SWI ? swiglu1(xb[idx], ub[idx]) : xb[idx];
    const float iscale = -127.f / mx;
    uint32_t pk[2];
    const int s = q8K_quants(v, iscale, pk);
    qd_st32(ob + 4 + 8 * lane, pk[0]);
    qd_st32(ob + 8 + 8 * lane, pk[1]);
    const int s2 = s + __shfl_down_sync(0xffffffffu, s, 1);   /* lanes 2g, 2g+1 hold group g */
    if ((lane & 1) == 0) qd_st16(ob + 260 + lane, (uint16_t)(int16_t)s2);
    if (lane == 0) {
        const float d = 1.f / iscale;
        qd_st32(ob, __float_as_uint(d));
    }
}

template <int SWI>
__global__ void k_quant_q8_K(const float *__restrict__ x, const float *__restrict__ u, uint8_t *__restrict__ out,
                             int64_t nblocks)
{
    pdl_enter();
    const int64_t gb = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (gb < nblocks) quant_q8_K_warp<SWI>(x, u, out, gb);
}

/* One value of a Q8_0 / Q8_1 block: round-half-even of v * id, a
 * non-finite product INT_MIN; unsaturated (Q8_1's sum takes it so). */
__device__ __forceinline__ int q8_conv(float v, float id)
{
    const float t = __fmul_rn(v, id);
    return isfinite(t) ? __float2int_rn(t) : INT_MIN;
}
__device__ __forceinline__ int q8_sat(int q) { return q < -128 ? -128 : q > 127 ? 127 : q; }

/* A block's header at ob: d = half(amax / 127); Q81 also s = half(d * sum). */
template <int Q81>
__device__ __forceinline__ void q8_head(uint8_t *ob, float am, uint32_t sum)
{
    const float d = am / 127.f;
    qd_st16(ob, __half_as_ushort(__float2half_rn(d)));
    if (Q81) qd_st16(ob + 2, __half_as_ushort(__float2half_rn(__fmul_rn(d, (float)(int32_t)sum))));
}

/* One warp per 32-value block, lane = element: quant_ref_act_quant_q8_0
 * bit for bit: amax; id = amax ? 127/amax : 0; d = half(amax/127) (RNE);
 * q = saturate(round-half-even(x*id)), a non-finite product -> INT_MIN ->
 * -128 (only when 127/amax overflows). Q81: quant_ref_act_quant_q8_1, the
 * same d and q after a second f16, s = half(d * (float)sum), sum the
 * wrapping int32 sum of the UNSATURATED conversions (as ggml's). */
template <int Q81, int SWI>
__device__ __forceinline__ void quant_q8_0_warp(const float *x, const float *u, uint8_t *out, int64_t gb)
{
    const int lane = threadIdx.x & 31;
    const float v = SWI ? swiglu1(x[gb * 32 + lane], u[gb * 32 + lane]) : x[gb * 32 + lane];
    float am = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    const float id = am != 0.f ? 127.f / am : 0.f;
    const int q = q8_conv(v, id);
    uint32_t sum = (uint32_t)q;
    if (Q81) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    uint8_t *ob = out + gb * (Q81 ? QD_Q81_BYTES : CQ8_0_BYTES);
    ob[(Q81 ? 4 : 2) + lane] = (uint8_t)(int8_t)q8_sat(q);
    if (lane == 0) q8_head<Q81>(ob, am, sum);
}

/* quant_q8_0_warp's blocks, four a warp: the 8 lanes of group g = lane / 8
 * take block `b` (their own; lanes past nb pass b = nb - 1 and store
 * nothing), 4 values a lane (lane l8 = lane % 8: values 4 l8 .. 4 l8 + 3)
 * from shared memory. The same values (the block's max is order-free, the
 * Q8_1 sum is a wrapping integer sum) in a quarter of the rounds: the
 * fused norm's quantization of a 2048-value row takes 2 rounds a warp
 * instead of 8. Every lane of the warp calls it. */
/* The 8-lane core of quant_q8_0_oct (and quant_q8_0_sm): a lane's 4
 * values of its block v; *am the block's max |v| (over the 8 lanes), the
 * lane's 4 saturated quants packed and returned; Q81: *sum the block's
 * wrapping sum of the unsaturated conversions. Every lane of the warp
 * calls it. */
template <int Q81>
__device__ __forceinline__ uint32_t q8_0_oct_quants(const float v[4], float *am_out, uint32_t *sum_out)
{
    float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    const float id = am != 0.f ? 127.f / am : 0.f;
    int q[4];
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        q[i] = q8_conv(v[i], id);
        sum += (uint32_t)q[i];
        q[i] = q8_sat(q[i]);
    }
    uint32_t pk = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) pk |= (uint32_t)(q[i] & 0xff) << (8 * i);
    if (Q81) {
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    *am_out = am;
    *sum_out = sum;
    return pk;
}

template <int Q81>
__device__ __forceinline__ void quant_q8_0_oct(const float *x, uint8_t *out, int b, bool store)
{
    const int l8 = threadIdx.x & 7;
    const float4 v4 = *(const float4 *)(x + (size_t)b * 32 + 4 * l8);
    const float v[4] = { v4.x, v4.y, v4.z, v4.w };
    float am;
    uint32_t sum;
    const uint32_t pk = q8_0_oct_quants<Q81>(v, &am, &sum);
    if (!store) return;
    uint8_t *ob = out + (size_t)b * (Q81 ? QD_Q81_BYTES : CQ8_0_BYTES);
    uint8_t *oq = ob + (Q81 ? 4 : 2) + 4 * l8;
    qd_st16(oq, (uint16_t)(pk & 0xffffu));
    qd_st16(oq + 2, (uint16_t)(pk >> 16));
    if (l8 == 0) q8_head<Q81>(ob, am, sum);
}

template <int Q81, int SWI>
__global__ void k_quant_q8_0(const float *__restrict__ x, const float *__restrict__ u, uint8_t *__restrict__ out,
                             int64_t nblocks)
{
    pdl_enter();
    const int64_t gb = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (gb < nblocks) quant_q8_0_warp<Q81, SWI>(x, u, out, gb);
}

/* RMSNorm of one row (rms_row, cuda_rmsnorm's numerics) and its
 * quantization to the dot type DT (0 Q8_0, 1 Q8_1, 2 Q8_K) by one CTA of
 * RMS_THREADS (all of them call it): the normed row goes to shared memory
 * sy (n <= CUDA_RMSQ_MAXN floats, 16-byte aligned), then to y (global)
 * while the warps quantize it from shared memory (the blocks' loads are
 * shared-memory latency, not a global round trip each): Q8_K blocks w,
 * w + 8, ... a warp; Q8_0 / Q8_1 blocks four a warp at once
 * (quant_q8_0_oct), so the rounds a warp runs one after the other, the
 * kernel's critical path, are a quarter as many. x may be sy itself (a
 * row the caller staged there; rms_row allows y == x) or global memory,
 * and y may alias x. `part`: RMS_THREADS / 32 doubles of shared memory.
 * The body of k_rmsnorm_quant and k_combine_rmsnorm_quant. */
template <int DT>
__device__ __forceinline__ void rmsnorm_quant_row(float *y, uint8_t *xq, const float *x, const float *__restrict__ w,
                                                  int n, float eps, double *part, float *sy)
{
    rms_row(sy, x, w, n, eps, part);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += RMS_THREADS) y[i] = sy[i];
    const int warp = threadIdx.x >> 5, nw = RMS_THREADS / 32;
    const int nb = DT == 2 ? n / CQK_K : n / CQK8_0;
    if (DT == 2) {
        for (int b = warp; b < nb; b += nw) quant_q8_K_warp<0>(sy, NULL, xq, b);
    } else {
        for (int base = 4 * warp; base < nb; base += 4 * nw) {   /* warp-uniform */
            const int b = base + ((threadIdx.x & 31) >> 3);
            quant_q8_0_oct<DT>(sy, xq, b < nb ? b : nb - 1, b < nb);
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(RMS_THREADS)
k_rmsnorm_quant(float *y, uint8_t *xq, const float *x, const float *__restrict__ w, int n, float eps)
{
    cta_prefetch_l2(w, sizeof(float) * (size_t)n, threadIdx.x, RMS_THREADS);   /* weights: before the wait */
    pdl_enter();
    __shared__ double part[RMS_THREADS / 32];
    __shared__ __align__(16) float sy[CUDA_RMSQ_MAXN];   /* 16: quant_q8_0_oct reads float4 */
    rmsnorm_quant_row<DT>(y, xq, x, w, n, eps, part, sy);
}

/* The MoE combine of one decode row followed by the next RMSNorm and its
 * quantization, one CTA of RMS_THREADS: x[i] = __fadd_rn(acc_i, x[i]),
 * acc_i = the moe_term sum over t = 0..k-1 of eout[t * n + i] * wts[t]
 * (k_moe_combine's operations in its order: x bit for bit), stored to x
 * and staged in sy; then rmsnorm_quant_row on sy (k_rmsnorm_quant's body:
 * y and xq bit for bit, since sy holds exactly the x it would read).
 * One CTA reads the k x n outputs (64 KB for k = 8, n = 2048, in L2: the
 * down matvec just wrote them), so the loads are float4s and a thread
 * issues CMB_T experts' loads before it sums any: they are in flight
 * together, not one L2 round trip an expert. The elements of a float4 are
 * summed separately, each in k_moe_combine's order. n a multiple of 4; x
 * and eout 16-byte aligned (the host checks both). */
#define CMB_T 8
template <int DT>
__global__ void __launch_bounds__(RMS_THREADS)
k_combine_rmsnorm_quant(float *x, const float *__restrict__ eout, const float *__restrict__ wts, int k, float *y,
                        uint8_t *xq, const float *__restrict__ w, int n, float eps)
{
    cta_prefetch_l2(w, sizeof(float) * (size_t)n, threadIdx.x, RMS_THREADS);   /* weights: before the wait */
    pdl_enter();
    __shared__ double part[RMS_THREADS / 32];
    __shared__ __align__(16) float sy[CUDA_RMSQ_MAXN];
    const int n4 = n >> 2;
    /* two float4s a thread a round (g and g + RMS_THREADS: n = 2048 is one
     * round), all their loads issued before the first sum */
    for (int g0 = threadIdx.x; g0 < n4; g0 += 2 * RMS_THREADS) {
        const int g1 = g0 + RMS_THREADS, two = g1 < n4;
        float4 xv[2], acc[2];
        xv[0] = ((const float4 *)x)[g0];
        xv[1] = two ? ((const float4 *)x)[g1] : make_float4(0.f, 0.f, 0.f, 0.f);
        acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int t0 = 0; t0 < k; t0 += CMB_T) {
            float4 ev[2][CMB_T];
#pragma unroll
            for (int u = 0; u < CMB_T; u++)
                if (t0 + u < k) {
                    const float4 *er = (const float4 *)(eout + (size_t)(t0 + u) * n);
                    ev[0][u] = er[g0];
                    ev[1][u] = two ? er[g1] : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
            for (int u = 0; u < CMB_T; u++) {
                const int t = t0 + u;
                if (t < k) {
                    const float wt = wts[t];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        acc[h].x = moe_term(acc[h].x, ev[h][u].x, wt, t);
                        acc[h].y = moe_term(acc[h].y, ev[h][u].y, wt, t);
                        acc[h].z = moe_term(acc[h].z, ev[h][u].z, wt, t);
                        acc[h].w = moe_term(acc[h].w, ev[h][u].w, wt, t);
                    }
                }
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h && !two) break;
            const float4 o = make_float4(__fadd_rn(acc[h].x, xv[h].x), __fadd_rn(acc[h].y, xv[h].y),
                                         __fadd_rn(acc[h].z, xv[h].z), __fadd_rn(acc[h].w, xv[h].w));
            ((float4 *)x)[h ? g1 : g0] = o;
            ((float4 *)sy)[h ? g1 : g0] = o;
        }
    }
    __syncthreads();   /* rms_row reads sy in another thread-to-element order */
    rmsnorm_quant_row<DT>(y, xq, sy, w, n, eps, part, sy);
}

/* f16 / bf16 activations (F16 / BF16 weights): one value a thread,
 * grid-stride, qd_f2h / qd_f2bf = fp32_to_fp16 / fp32_to_bf16 bit for bit
 * (round to nearest even; NaN quieted as the CPU does). */
template <int BF>
__global__ void k_quant_half(const float *__restrict__ x, uint16_t *__restrict__ out, int64_t n)
{
    pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = BF ? qd_f2bf(x[i]) : qd_f2h(x[i]);
}

/* The block quantizers by dot type (8 warps, one block each, a CTA);
 * SWI: the input is swiglu1(x, u) instead of x. */
template <int SWI>
static int launch_quant(cuda_ctx *c, int wtype, const float *x, const float *u, uint8_t *xq, int64_t n, int rows,
                        err *e)
{
    const int wpb = 8;
    const char *what = SWI ? "act quant swiglu" : "act quant";
    if (wtype == QTYPE_Q8_0 || wtype == QTYPE_Q4_0 || wtype == QTYPE_Q5_0) {
        const int64_t nb = n / CQK8_0 * rows;
        return cuda_launch(c, k_quant_q8_0<0, SWI>, (unsigned)((nb + wpb - 1) / wpb), 32 * wpb, 0, e, what, x, u, xq,
                           nb);
    }
    if (wtype == QTYPE_Q4_1 || wtype == QTYPE_Q5_1) {
        const int64_t nb = n / CQK8_0 * rows;
        return cuda_launch(c, k_quant_q8_0<1, SWI>, (unsigned)((nb + wpb - 1) / wpb), 32 * wpb, 0, e, what, x, u, xq,
                           nb);
    }
    const int64_t nb = n / CQK_K * rows;
    return cuda_launch(c, k_quant_q8_K<SWI>, (unsigned)((nb + wpb - 1) / wpb), 32 * wpb, 0, e, what, x, u, xq, nb);
}

extern "C" size_t cuda_act_bytes(int wtype, int64_t n)
{
    if (n <= 0 || n > ((int64_t)1 << 40)) return 0;
    switch (wtype) {
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q6_K: return n % CQK_K ? 0 : (size_t)(n / CQK_K) * CQ8_K_BYTES;
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q5_0: return n % CQK8_0 ? 0 : (size_t)(n / CQK8_0) * CQ8_0_BYTES;
    case QTYPE_Q4_1:
    case QTYPE_Q5_1: return n % CQK8_0 ? 0 : (size_t)(n / CQK8_0) * QD_Q81_BYTES;
    case QTYPE_F32: return (size_t)n * 4;
    case QTYPE_F16:
    case QTYPE_BF16: return (size_t)n * 2;
    default: return 0;
    }
}

extern "C" int cuda_act_quant(cuda_ctx *c, int wtype, const float *x, void *xq, int64_t n, int rows, err *e)
{
    if (!cuda_act_bytes(wtype, n) || rows <= 0)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_act_quant: weight type %s with n=%lld rows=%d", qtype_name(wtype),
                        (long long)n, rows);
    if (wtype == QTYPE_F32) {   /* the CPU's quant_f32 is a copy */
        if ((const void *)x == xq) return 0;
        return cuda_fail(e, cudaMemcpyAsync(xq, x, (size_t)n * rows * 4, cudaMemcpyDeviceToDevice, c->stream),
                         "act quant f32 copy");
    }
    if (wtype == QTYPE_F16 || wtype == QTYPE_BF16) {
        const int64_t nn = n * rows, nblk = (nn + 255) / 256;
        const unsigned grid = (unsigned)(nblk < 65536 ? nblk : 65536);
        return cuda_launch(c, wtype == QTYPE_F16 ? k_quant_half<0> : k_quant_half<1>, grid, 256, 0, e, "act quant", x,
                           (uint16_t *)xq, nn);
    }
    return launch_quant<0>(c, wtype, x, NULL, (uint8_t *)xq, n, rows, e);
}

/* The fused norms' DT (0 Q8_0, 1 Q8_1, 2 Q8_K) for weight type wtype and
 * rows of n, or ERR_UNSUPPORTED (`who` names the caller): a quantized dot
 * type whose blocks divide n, n <= CUDA_RMSQ_MAXN. */
static int rmsq_dt(const char *who, int wtype, int n, int *dt, err *e)
{
    if (!cuda_act_bytes(wtype, n) || wtype == QTYPE_F32 || wtype == QTYPE_F16 || wtype == QTYPE_BF16 ||
        n > CUDA_RMSQ_MAXN)
        return err_setf(e, ERR_UNSUPPORTED, "%s: weight type %s with n=%d (n <= %d)", who, qtype_name(wtype), n,
                        CUDA_RMSQ_MAXN);
    const int dot = qtype_get(wtype)->dot_type;
    *dt = dot == QTYPE_Q8_K ? 2 : dot == QTYPE_Q8_1 ? 1 : 0;
    return 0;
}

extern "C" int cuda_rmsnorm_quant(cuda_ctx *c, int wtype, float *y, void *xq, const float *x, const float *w,
                                  int n, float eps, err *e)
{
    int dt;
    TRY_MV(rmsq_dt("cuda_rmsnorm_quant", wtype, n, &dt, e));
    return cuda_launch(c, dt == 2 ? k_rmsnorm_quant<2> : dt == 1 ? k_rmsnorm_quant<1> : k_rmsnorm_quant<0>, 1,
                       RMS_THREADS, 0, e, "rmsnorm quant", y, (uint8_t *)xq, x, w, n, eps);
}

extern "C" int cuda_moe_combine_rmsnorm_quant(cuda_ctx *c, int wtype, float *x, const float *eout, const float *wts,
                                              int k, float *y, void *xq, const float *w, int n, float eps, err *e)
{
    if (k <= 0 || n <= 0)
        return err_setf(e, ERR_USAGE, "cuda_moe_combine_rmsnorm_quant: k=%d n=%d", k, n);
    int dt;
    TRY_MV(rmsq_dt("cuda_moe_combine_rmsnorm_quant", wtype, n, &dt, e));
    /* n is a whole number of Q8 blocks (32 or 256 values), so a multiple of 4 */
    if (((uintptr_t)x | (uintptr_t)eout) & 15)
        return err_setf(e, ERR_USAGE, "cuda_moe_combine_rmsnorm_quant: x and eout need 16-byte alignment");
    return cuda_launch(c,
                       dt == 2   ? k_combine_rmsnorm_quant<2>
                       : dt == 1 ? k_combine_rmsnorm_quant<1>
                                 : k_combine_rmsnorm_quant<0>,
                       1, RMS_THREADS, 0, e, "moe combine rmsnorm quant", x, eout, wts, k, y, (uint8_t *)xq, w, n, eps);
}

extern "C" int cuda_act_quant_swiglu(cuda_ctx *c, int wtype, const float *g, const float *u, void *xq, int64_t n,
                                     int rows, err *e)
{
    if (!cuda_act_bytes(wtype, n) || rows <= 0 || wtype == QTYPE_F32 || wtype == QTYPE_F16 || wtype == QTYPE_BF16)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_act_quant_swiglu: weight type %s with n=%lld rows=%d",
                        qtype_name(wtype), (long long)n, rows);
    return launch_quant<1>(c, wtype, g, u, (uint8_t *)xq, n, rows, e);
}

/* ==== Q8_0 split rows ====
 * In place, a CTA a row at a time: the row's 34 nb bytes to shared memory,
 * then its quants (block b's 32 at 32 b) and its scales (block b's f16 at
 * 32 nb + 2 b) back. Why: a Q8_0 row's blocks are 34 bytes, so half of
 * them start at 2 mod 4 and qd_item_q8_0 reads its 16 quants as 8
 * halfwords; split, an item is one 16-byte load (qd_item_q8_0s). */
__global__ void k_pdl_fence() { pdl_enter(); }

__global__ void k_repack_q8_0(uint8_t *w, int64_t rows, int nb)
{
    pdl_enter();
    extern __shared__ __align__(16) uint8_t srow[];
    const int rb = nb * CQ8_0_BYTES;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        uint8_t *row = w + (size_t)r * rb;
        for (int i = threadIdx.x; i < rb; i += blockDim.x) srow[i] = row[i];
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * nb; i += blockDim.x) row[i] = srow[CQ8_0_BYTES * (i >> 5) + 2 + (i & 31)];
        for (int i = threadIdx.x; i < 2 * nb; i += blockDim.x) row[32 * nb + i] = srow[CQ8_0_BYTES * (i >> 1) + (i & 1)];
        __syncthreads();
    }
}

extern "C" int cuda_repack_q8_0(cuda_ctx *c, void *w, int64_t rows, int64_t k, err *e)
{
    const int64_t rb = k / 32 * CQ8_0_BYTES;
    if (!w || rows <= 0 || rows > INT_MAX || k <= 0 || k % 256 || ((uintptr_t)w & 15))
        return err_setf(e, ERR_USAGE, "cuda_repack_q8_0: rows=%lld k=%lld (k a multiple of 256, 16-byte aligned "
                        "weights)", (long long)rows, (long long)k);
    if (rb > 48 * 1024)   /* the dynamic shared memory a launch has without opting in */
        return err_setf(e, ERR_UNSUPPORTED, "cuda_repack_q8_0: k=%lld: a row of %lld bytes exceeds 48 KB of shared memory",
                        (long long)k, (long long)rb);
    const unsigned grid = (unsigned)(rows < 4096 ? rows : 4096);
    TRY_MV(cuda_launch(c, k_repack_q8_0, grid, 256, (size_t)rb, e, "repack q8_0", (uint8_t *)w, rows, (int)(k / 32)));
    /* The direct matvec loads a known matrix's first rows before its
     * dependency wait, which pdl_enter's contract allows only for data
     * written two or more launches back: a matvec launched right after
     * this repack would read the rows half rewritten (seen on the H200 in
     * session 13: split rows differing from Q8_0's at 4096 x 2048). One
     * empty launch puts the repack two back for whatever comes next. */
    return cuda_launch(c, k_pdl_fence, 1, 32, 0, e, "repack q8_0 fence");
}

/* ==== Matvec ==== */

#define MV_WARPS 4

/* Per weight type: BE weights per block (float types: per 16-byte item),
 * BB bytes per block, IPB items per block, ACT how the activation row is
 * read (unpacked from Q8_K, Q8_0 or Q8_1 blocks into shared memory, or RAW
 * from global memory), WAL / XAL the alignment weights / activation rows
 * need. */
/* U: the items a lane of the direct kernels has in flight (unrolled) per
 * pass, MVD_U, or 1 where an item is a whole Q4_K / Q5_K block (144 / 176
 * bytes). */
#define MVD_U 4
enum { MV_ACT_Q8K, MV_ACT_Q80, MV_ACT_Q81, MV_ACT_RAW };
template <int QT> struct mv_traits;
template <> struct mv_traits<QTYPE_Q4_K> {
    enum { BE = 256, BB = CQ4_K_BYTES, IPB = 1, ACT = MV_ACT_Q8K, WAL = 16, XAL = 4, U = 1 };   /* qd_block_q4_K */
};
template <> struct mv_traits<QTYPE_Q5_K> {
    enum { BE = 256, BB = QD_Q5K_BYTES, IPB = 1, ACT = MV_ACT_Q8K, WAL = 16, XAL = 4, U = 1 };   /* qd_block_q5_K */
};
template <> struct mv_traits<QTYPE_Q6_K> {
    enum { BE = 256, BB = CQ6_K_BYTES, IPB = QD_Q6K_ITEMS, ACT = MV_ACT_Q8K, WAL = 2, XAL = 4, U = MVD_U };
};
template <> struct mv_traits<QTYPE_Q8_0> {
    enum { BE = 32, BB = CQ8_0_BYTES, IPB = QD_Q80_ITEMS, ACT = MV_ACT_Q80, WAL = 2, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<CUDA_Q8_0_SPLIT> {   /* rows 16-byte aligned: k a multiple of 256 */
    enum { BE = 32, BB = CQ8_0_BYTES, IPB = QD_Q80_ITEMS, ACT = MV_ACT_Q80, WAL = 16, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<QTYPE_Q4_0> {
    enum { BE = 32, BB = QD_Q40_BYTES, IPB = QD_Q40_ITEMS, ACT = MV_ACT_Q80, WAL = 2, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<QTYPE_Q5_0> {
    enum { BE = 32, BB = QD_Q50_BYTES, IPB = QD_Q50_ITEMS, ACT = MV_ACT_Q80, WAL = 2, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<QTYPE_Q4_1> {
    enum { BE = 32, BB = QD_Q41_BYTES, IPB = QD_Q41_ITEMS, ACT = MV_ACT_Q81, WAL = 2, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<QTYPE_Q5_1> {
    enum { BE = 32, BB = QD_Q51_BYTES, IPB = QD_Q51_ITEMS, ACT = MV_ACT_Q81, WAL = 2, XAL = 2, U = MVD_U };
};
template <> struct mv_traits<QTYPE_F32> {
    enum { BE = QD_F32_PER_ITEM, BB = 16, IPB = 1, ACT = MV_ACT_RAW, WAL = 16, XAL = 16, U = MVD_U };
};
template <> struct mv_traits<QTYPE_F16> {
    enum { BE = QD_F16_PER_ITEM, BB = 16, IPB = 1, ACT = MV_ACT_RAW, WAL = 16, XAL = 16, U = MVD_U };
};
template <> struct mv_traits<QTYPE_BF16> {
    enum { BE = QD_F16_PER_ITEM, BB = 16, IPB = 1, ACT = MV_ACT_RAW, WAL = 16, XAL = 16, U = MVD_U };
};

/* xq: the unpacked int8 quants in shared memory, or (RAW) the activation
 * row in global memory; nb: the row's blocks (split rows find their scales
 * with it) */
template <int QT>
__device__ __forceinline__ float mv_item(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xbs, int it,
                                         int nb)
{
    if (QT == CUDA_Q8_0_SPLIT) return qd_item_q8_0s(w, xq, xd, nb, it);
    if (QT == QTYPE_Q4_K) return qd_block_q4_K(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q5_K) return qd_block_q5_K(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q6_K) return qd_item_q6_K(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q4_0) return qd_item_q4_0(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q5_0) return qd_item_q5_0(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q4_1) return qd_item_q4_1(w, xq, xd, xbs, it);
    if (QT == QTYPE_Q5_1) return qd_item_q5_1(w, xq, xd, xbs, it);
    if (QT == QTYPE_F32) return qd_item_f32(w, (const uint8_t *)xq, it);
    if (QT == QTYPE_F16) return qd_item_f16(w, (const uint8_t *)xq, it);
    if (QT == QTYPE_BF16) return qd_item_bf16(w, (const uint8_t *)xq, it);
    return qd_item_q8_0(w, xq, xd, xbs, it);
}

/* An item's weights between the direct kernel's load and dot. H = 1: in
 * registers, and the lane's first pass is loaded ahead of the activation
 * unpack (and, when the matrix is known before the dependency wait, ahead
 * of the wait: then the bytes arrive while the previous kernel runs):
 * Q4_K and split Q8_0, the decode model's matrices. H = 0: the row
 * pointer, the item loading inside the dot as before (hoisted, Q5_K's
 * 176-byte blocks spill 32 bytes at 64 registers and F32 / BF16 16).
 * mv_dot(mv_load(w, it)) is mv_item(w, it) bit for bit. */
template <int QT> struct mv_w { enum { H = 0 }; const uint8_t *w; };
template <> struct mv_w<QTYPE_Q4_K> { enum { H = 1 }; qd_k45_w<0> v; };
template <> struct mv_w<CUDA_Q8_0_SPLIT> { enum { H = 1 }; qd_q80s_w v; };

template <int QT> __device__ __forceinline__ void mv_load(mv_w<QT> &r, const uint8_t *w, int it, int nb)
{
    (void)it; (void)nb;
    r.w = w;
}
template <> __device__ __forceinline__ void mv_load<QTYPE_Q4_K>(mv_w<QTYPE_Q4_K> &r, const uint8_t *w, int it, int nb)
{
    (void)nb;
    r.v = qd_k45_load<0>(w, it);
}
template <>
__device__ __forceinline__ void mv_load<CUDA_Q8_0_SPLIT>(mv_w<CUDA_Q8_0_SPLIT> &r, const uint8_t *w, int it, int nb)
{
    r.v = qd_q80s_load(w, nb, it);
}

template <int QT>
__device__ __forceinline__ float mv_dot(const mv_w<QT> &r, const int8_t *xq, const float *xd, const int16_t *xbs, int it,
                                        int nb)
{
    return mv_item<QT>(r.w, xq, xd, xbs, it, nb);
}
template <>
__device__ __forceinline__ float mv_dot<QTYPE_Q4_K>(const mv_w<QTYPE_Q4_K> &r, const int8_t *xq, const float *xd,
                                                    const int16_t *xbs, int it, int nb)
{
    (void)nb;
    return qd_k45_dot<0>(r.v, xq, xd, xbs, it);
}
template <>
__device__ __forceinline__ float mv_dot<CUDA_Q8_0_SPLIT>(const mv_w<CUDA_Q8_0_SPLIT> &r, const int8_t *xq,
                                                         const float *xd, const int16_t *xbs, int it, int nb)
{
    (void)xbs; (void)nb;
    return qd_q80s_dot(r.v, xq, xd, it);
}

/* Shared-memory layout of one CTA (host and device agree through these). */
__host__ __device__ __forceinline__ size_t mv_tile_bytes(int R, int rb) { return ((size_t)R * rb + 32 + 15) & ~(size_t)15; }
/* the unpacked quants' bytes (Q8_K: QD_Q8K_XB a block, cuda_qdot.cuh) */
__host__ __device__ __forceinline__ size_t mv_xq_bytes(int act, int k)
{
    return act == MV_ACT_Q8K ? (size_t)(k / 256) * QD_Q8K_XB : (size_t)k;
}
__host__ __device__ __forceinline__ size_t mv_act_bytes(int act, int k, int be)
{
    if (act == MV_ACT_RAW) return 0;
    return mv_xq_bytes(act, k) + 4 * (size_t)(k / be) + 2 * (size_t)(k / 16) + 16;
}

/* The CTA unpacks the activation row gx into shared memory at s (int8
 * quants, then float scales, then int16 bsums, as cuda_qdot.cuh describes)
 * and returns what the items read as xq: the unpacked quants, or gx itself
 * for RAW rows. */
#define MV_UB 4
/* The loop of mv_unpack over a row of n words W (uint32_t: Q8_K's, uint16_t:
 * Q8_0's and Q8_1's 2-aligned blocks), each put to shared memory by put(v,
 * word index): MV_UB loads a thread in flight before their stores. */
template <typename W, typename Put>
__device__ __forceinline__ void mv_unpack_words(const uint8_t *gx, int n, Put put)
{
    for (int w0 = threadIdx.x; w0 < n; w0 += MV_UB * blockDim.x) {
        W v[MV_UB];
#pragma unroll
        for (int u = 0; u < MV_UB; u++) {
            const uint8_t *p = gx + sizeof(W) * (size_t)min(w0 + u * (int)blockDim.x, n - 1);
            if constexpr (sizeof(W) == 4) v[u] = qd_ld32(p);
            else v[u] = qd_ld16(p);
        }
#pragma unroll
        for (int u = 0; u < MV_UB; u++)
            if (w0 + u * (int)blockDim.x < n) put(v[u], w0 + u * blockDim.x);
    }
}
template <int QT>
__device__ __forceinline__ const int8_t *mv_unpack(const uint8_t *gx, uint8_t *s, int k, float **sxd, int16_t **sxbs)
{
    typedef mv_traits<QT> T;
    const int nb = k / T::BE;
    int8_t *sxq = (int8_t *)s;
    *sxd = (float *)(s + mv_xq_bytes(T::ACT, k));
    *sxbs = (int16_t *)((uint8_t *)*sxd + 4 * nb);
    /* MV_UB loads of a thread issued before their stores: the row was just
     * written by the previous kernel, each load is an L2 round trip, and a
     * loop of load-then-store turns had them one after another (8.5 turns
     * for a K = 4096 Q8_0 row). A thread past the row's end loads its last
     * word again and stores nothing. */
    const int n = T::ACT == MV_ACT_Q8K ? nb * 73 : T::ACT == MV_ACT_Q80 ? nb * 17 : nb * 18;
    if (T::ACT == MV_ACT_Q8K)
        mv_unpack_words<uint32_t>(gx, n, [&](uint32_t v, int w) { qd_put_q8_K(v, w, sxq, *sxd, *sxbs); });
    else if (T::ACT == MV_ACT_Q80)
        mv_unpack_words<uint16_t>(gx, n, [&](uint16_t v, int w) { qd_put_q8_0(v, w, sxq, *sxd); });
    else if (T::ACT == MV_ACT_Q81)
        mv_unpack_words<uint16_t>(gx, n, [&](uint16_t v, int w) { qd_put_q8_1(v, w, sxq, *sxd, *sxbs); });
    else
        return (const int8_t *)gx;
    return sxq;
}

/* The optional parts of a launch (cuda_matvec_args): a second matrix set
 * (W2, y2: blockIdx.y >= n_batch takes matrix b - n_batch of it), a
 * residual added to each output (y[o] = dot + add[o], add may alias y:
 * each element is read and written by the one thread that owns it),
 * ids_early (the ids may be read before the dependency wait), and xquant /
 * xu (the CTA quantizes its f32 activation row itself: mv_act). */
struct mv_ext {
    const uint8_t *W2;
    float         *y2;
    const float   *add;
    int            ids_early;
    int            xquant;
    const float   *xu;
    const float   *xnw;      /* CUDA_XQ_NORM: the norm's weights, epsilon, */
    float          eps;
    int            x_early;  /* unpack / norm before the dependency wait, */
    int            nrm_off;  /* and the normed row's shared-memory offset (then RMS_THREADS / 32 doubles) */
    uint8_t       *nq_out;   /* the normed row quantized there too: */
    int            nq_dt;    /* 2 Q8_K, 0 Q8_0 (rmsnorm_quant_row's DT) */
};

/* ==== The activation quantized inside the matvec (xquant) ====
 * What cuda_act_quant (or cuda_act_quant_swiglu) would write and the
 * unpack would then read, written straight into the unpacked shared-memory
 * layout (int8 quants, float scales, int16 bsums: mv_unpack), so the
 * matvec needs no quantizer launch before it. Bit for bit the quantizers'
 * values (test_cuda's test_matvec_xquant): the same per-block arithmetic;
 * only where the values go differs. */

/* quant_q8_K_warp's block (256 values at xb, or swiglu(xb, ub)) into q
 * (256 int8 at qd_q8k_off), d (its float scale) and bs (16 int16 sums). The first
 * largest |v| is found as there; its signed value rides along the
 * reduction instead of being read again. Every lane of the warp calls it;
 * xb and ub 16-byte aligned. */
__device__ __forceinline__ void quant_q8_K_sm(const float *xb, const float *ub, int8_t *q, float *d, int16_t *bs)
{
    const int lane = threadIdx.x & 31;
    const float4 a0 = *(const float4 *)(xb + lane * 8), a1 = *(const float4 *)(xb + lane * 8 + 4);
    float v[8] = { a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w };
    if (ub) {
        const float4 c0 = *(const float4 *)(ub + lane * 8), c1 = *(const float4 *)(ub + lane * 8 + 4);
        const float uu[8] = { c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w };
#pragma unroll
        for (int t = 0; t < 8; t++) v[t] = swiglu1(v[t], uu[t]);
    }
    float am = 0.f, mx = 0.f;
    int idx = INT_MAX;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        const float ax = fabsf(v[t]);
        if (ax > am) { am = ax; idx = lane * 8 + t; mx = v[t]; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oam = __shfl_xor_sync(0xffffffffu, am, o);
        const int oidx = __shfl_xor_sync(0xffffffffu, idx, o);
        const float omx = __shfl_xor_sync(0xffffffffu, mx, o);
        if (oam > am || (oam == am && oidx < idx)) { am = oam; idx = oidx; mx = omx; }
    }
    if (am == 0.f) {   /* d = 0, qs = 0, bsums = 0, as quant_q8_K_warp */
        *(uint2 *)(q + qd_q8k_off(8 * lane)) = make_uint2(0u, 0u);
        if (lane < 8) ((uint32_t *)bs)[lane] = 0u;
        if (lane == 0) *d = 0.f;
        return;
    }
    const float iscale = -127.f / mx;
    uint32_t pk[2];
    const int s = q8K_quants(v, iscale, pk);
    *(uint2 *)(q + qd_q8k_off(8 * lane)) = make_uint2(pk[0], pk[1]);
    const int s2 = s + __shfl_down_sync(0xffffffffu, s, 1);   /* lanes 2g, 2g+1 hold group g */
    if ((lane & 1) == 0) bs[lane >> 1] = (int16_t)s2;
    if (lane == 0) *d = 1.f / iscale;
}

/* quant_q8_0_oct's blocks (nb of 32 values at x, or swiglu(x, u)) into q
 * (32 int8 a block) and d (each block's scale as the unpack widens it:
 * float(half(amax / 127))): 8 lanes a block, every group of 8 threads of
 * the CTA a block, four rounds' loads issued before the first's
 * arithmetic. Every thread of the CTA calls it (the loop bound is
 * uniform); x and u 16-byte aligned. */
template <int SWI>
__device__ __forceinline__ void quant_q8_0_sm(const float *x, const float *u, int nb, int8_t *q, float *d)
{
    const int grp = threadIdx.x >> 3, ng = blockDim.x >> 3, l8 = threadIdx.x & 7;
    for (int b0 = 0; b0 < nb; b0 += 4 * ng) {
        float4 xv[4], uv[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (b0 + r * ng >= nb) break;   /* a round no group has a block of (uniform) */
            const int b = min(b0 + grp + r * ng, nb - 1);
            xv[r] = *(const float4 *)(x + (size_t)b * 32 + 4 * l8);
            if (SWI) uv[r] = *(const float4 *)(u + (size_t)b * 32 + 4 * l8);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (b0 + r * ng >= nb) break;
            float v[4] = { xv[r].x, xv[r].y, xv[r].z, xv[r].w };
            if (SWI) {
                v[0] = swiglu1(v[0], uv[r].x);
                v[1] = swiglu1(v[1], uv[r].y);
                v[2] = swiglu1(v[2], uv[r].z);
                v[3] = swiglu1(v[3], uv[r].w);
            }
            float am;
            uint32_t sum;
            const uint32_t pk = q8_0_oct_quants<0>(v, &am, &sum);
            const int b = b0 + grp + r * ng;
            if (b < nb) {
                *(uint32_t *)(q + (size_t)b * 32 + 4 * l8) = pk;
                if (l8 == 0) d[b] = __half2float(__float2half_rn(am / 127.f));
            }
        }
    }
}

/* Which input paths a kernel instance compiles (its template XQ): the
 * plain unpack only (the instances most launches take, so they keep their
 * registers), also the f32 / swiglu quantization, or also the norm. */
enum { MV_XQ_NONE, MV_XQ_QUANT, MV_XQ_NORM };
/* The paths a type takes: Q8 (its dot type Q8_K or Q8_0) the quantization,
 * NORM (those and F32) the norm. */
template <int QT> struct mvd_xq {
    static constexpr bool Q8 = (int)mv_traits<QT>::ACT == MV_ACT_Q8K || (int)mv_traits<QT>::ACT == MV_ACT_Q80;
    static constexpr bool NORM = Q8 || QT == QTYPE_F32;
};

/* The CTA's activation row (bytes off past xq) into shared memory at s:
 * unpacked (mv_unpack), or, with ex.xquant, quantized from f32 there
 * (CUDA_XQ_NORM: normed first, by rms_row into the row at base +
 * ex.nrm_off: every thread of a CTA of RMS_THREADS calls it then; an F32
 * weight's dots read that row). Returns what the items read as xq. */
template <int QT, int XQ>
__device__ __forceinline__ const int8_t *mv_act(const uint8_t *xq, const mv_ext &ex, size_t off, uint8_t *s, int k,
                                                float **sxd, int16_t **sxbs, uint8_t *base)
{
    typedef mv_traits<QT> T;
    const float *sy = NULL;
    if constexpr (XQ == MV_XQ_NORM && mvd_xq<QT>::NORM) {
        if (ex.xquant == CUDA_XQ_NORM) {
            float *ny = (float *)(base + ex.nrm_off);
            rms_row(ny, (const float *)(xq + off), ex.xnw, k, ex.eps, (double *)(ny + k));
            __syncthreads();
            if (ex.nq_out) {   /* block g by warp g of the grid's (rmsnorm_quant_row's arithmetic) */
                const int nw = blockDim.x >> 5, gw = (int)blockIdx.x * nw + (threadIdx.x >> 5);
                const int step = (int)gridDim.x * nw;
                if (ex.nq_dt == 2) {
                    for (int g = gw; g < k / CQK_K; g += step) quant_q8_K_warp<0>(ny, NULL, ex.nq_out, g);
                } else {
                    for (int g = gw; g < k / CQK8_0; g += step) quant_q8_0_warp<0, 0>(ny, NULL, ex.nq_out, g);
                }
            }
            if (QT == QTYPE_F32) return (const int8_t *)ny;
            sy = ny;
        }
    }
    if constexpr (XQ != MV_XQ_NONE && mvd_xq<QT>::Q8) {
        if (ex.xquant) {
            const int nb = k / T::BE;
            int8_t *sxq = (int8_t *)s;
            *sxd = (float *)(s + mv_xq_bytes(T::ACT, k));
            *sxbs = (int16_t *)((uint8_t *)*sxd + 4 * nb);
            const float *x = sy ? sy : (const float *)(xq + off);
            const float *u = ex.xquant == CUDA_XQ_SWIGLU ? (const float *)((const uint8_t *)ex.xu + off) : NULL;
            if (T::ACT == MV_ACT_Q8K) {
                for (int blk = threadIdx.x >> 5; blk < nb; blk += blockDim.x >> 5)
                    quant_q8_K_sm(x + (size_t)blk * 256, u ? u + (size_t)blk * 256 : NULL, sxq + (size_t)blk * QD_Q8K_XB,
                                  *sxd + blk, *sxbs + (size_t)blk * 16);
            } else if (QT != CUDA_Q8_0_SPLIT && u) {   /* split rows are dense matrices: never swiglu (the host checks) */
                quant_q8_0_sm<1>(x, u, nb, sxq, *sxd);
            } else {
                quant_q8_0_sm<0>(x, NULL, nb, sxq, *sxd);
            }
            return sxq;
        }
    }
    return mv_unpack<QT>(xq + off, s, k, sxd, sxbs);
}

__device__ __forceinline__ int mv_pick(const mv_ext &ex, const uint8_t *__restrict__ *W, float **y)
{
    const int b = blockIdx.y, nb = (int)(gridDim.y >> 1);
    if (ex.W2 && b >= nb) {
        *W = ex.W2;
        *y = ex.y2;
        return b - nb;
    }
    return b;
}

__device__ __forceinline__ void mv_store(const mv_ext &ex, float *y, size_t o, float v)
{
    y[o] = ex.add ? __fadd_rn(v, ex.add[o]) : v;
}

/* grid: (ceil(rows / R), n_batch); block: 32 * MV_WARPS threads.
 * R >= MV_WARPS: warp w computes rows w, w + MV_WARPS, ...; R = 1 or 2 (a
 * grid too short to fill the GPU): the MV_WARPS / R warps of a row split
 * its items (warp part p takes items lane + 32 p, step 32 MV_WARPS / R) and
 * their sums meet in shared memory, added in part order (deterministic). */
template <int QT>
__global__ void __launch_bounds__(32 * MV_WARPS)
k_matvec(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k, int R,
         const uint8_t *__restrict__ xq, size_t x_stride, float *y, size_t y_stride, mv_ext ex)
{
    pdl_enter();
    typedef mv_traits<QT> T;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float red[MV_WARPS];
    const int nb = k / T::BE, rb = nb * T::BB;
    const int b = mv_pick(ex, &W, &y);
    const int mat = ids ? ids[b] : b;
    const int r0 = blockIdx.x * R;
    const int nr = min(R, rows - r0);

    const uint8_t *g = W + (size_t)mat * w_stride + (size_t)r0 * rb;
    uint8_t *tile = smem;
    const size_t tb = mv_tile_bytes(R, rb);

    const int shift = stage_tile(tile, g, (size_t)nr * rb);

    float *sxd;
    int16_t *sxbs;
    const int8_t *xs = mv_act<QT, MV_XQ_QUANT>(xq, ex, (size_t)b * x_stride, smem + tb, k, &sxd, &sxbs, smem);
    cp_async_wait_all();
    __syncthreads();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nit = nb * T::IPB;
    if (R >= MV_WARPS) {
        for (int i = warp; i < nr; i += MV_WARPS) {
            const uint8_t *wrow = tile + shift + (size_t)i * rb;
            float acc = 0.f;
            for (int it = lane; it < nit; it += 32) acc += mv_item<QT>(wrow, xs, sxd, sxbs, it, nb);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) mv_store(ex, y, (size_t)b * y_stride + r0 + i, acc);
        }
        return;
    }
    const int wpr = MV_WARPS / R, i = warp % R, part = warp / R;
    float acc = 0.f;
    if (i < nr) {   /* warp-uniform */
        const uint8_t *wrow = tile + shift + (size_t)i * rb;
        for (int it = lane + 32 * part; it < nit; it += 32 * wpr) acc += mv_item<QT>(wrow, xs, sxd, sxbs, it, nb);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if ((int)threadIdx.x < nr) {
        float s = red[threadIdx.x];
        for (int p = 1; p < wpr; p++) s += red[threadIdx.x + R * p];
        mv_store(ex, y, (size_t)b * y_stride + r0 + threadIdx.x, s);
    }
}

/* ---- direct matvec (the default) ----
 * No tile staging: the tile kernel above waits for its whole tile before
 * computing. Here the lanes load their items straight from global memory,
 * except Q4_K and Q5_K rows of at most 32 blocks, which a warp copies to its own
 * shared memory in contiguous 16-byte chunks first (mvd_co, below: a lane
 * takes a whole 144-byte block, and 32 lanes' blocks 144 bytes apart read
 * 1.26x slower than contiguous loads, session 18).
 *   - a row is taken by S = 2^lg_s lanes (the smallest S with S * MVD_U >=
 *     items per row, at most 32), so a warp computes 32 / S rows at once:
 *     K = 768 Q4_K rows (24 items) use 8 lanes, 4 rows a warp, instead of
 *     leaving a quarter of the warp idle; the reduction is lg_s shuffles
 *     inside each group of S lanes;
 *   - each lane's MVD_U items of a pass are unrolled, so their loads are
 *     all issued before the first dp4a (up to 64 bytes a lane in flight);
 *   - CTAs of MVD_WARPS warps, a few KB of shared memory (the unpacked
 *     activation row only), so up to 4 CTAs (32 warps) per SM keep ~64 KB
 *     of loads in flight per SM;
 *   - before unpacking the activation, the CTA asks L2 to prefetch its
 *     row tile (one prefetch.global.L2 per 128-byte line, no registers), so
 *     HBM is busy during the unpack and __syncthreads.
 * Measured on the H200 it beats the tile kernel on Q4_K K = 768 rows
 * (44% vs 35% of the read probe) but loses on K = 2048 Q4_K (46% vs 48%),
 * the Q6_K head (42% vs 50%) and Q8_0 (60% vs 63%) -- but those
 * single-matrix timings re-read matrices that fit in the 50 MB L2. In the
 * whole model, where every weight comes cold from HBM, the direct kernel
 * for every matvec decodes 279.9 tok/s against 244.0 with the tile kernel
 * for every one and 251.3 with the earlier split by shape (30b-a3b shape,
 * test_cuda_model --bench, one run), so it is the default for all shapes.
 * A variant with 8 items a lane (2 CTAs an SM) and one without the
 * prefetch were slower still. 
 * Item order and float sums per lane are fixed (u ascending, then the
 * shuffle tree): results are deterministic run to run. */
#define MVD_WARPS 8
static_assert(32 * MVD_WARPS == RMS_THREADS, "CUDA_XQ_NORM: the direct kernel's CTA runs rms_row");

/* L2 prefetch of a CTA's rows [g, g + n): cta_prefetch_l2 over all its
 * threads. */
__device__ __forceinline__ void mvd_prefetch_l2(const uint8_t *g, size_t n)
{
    cta_prefetch_l2(g, n, threadIdx.x, blockDim.x);
}

/* The direct kernels' geometry: lg_s (2^lg_s lanes a row: the smallest
 * with 2^lg_s * MVD_U >= the row's items; the per-row arithmetic depends on
 * it) and R (one CTA pass of rows, doubled while the tile stays <= 32 KB,
 * amortizing the activation unpack, and the grid still has >= 4 CTAs per
 * SM). */
static void mvd_geometry(const cuda_ctx *c, int64_t nit, int u, int rows, int rb, int64_t nbat, int *lg_s, int *R)
{
    int s = 0;
    while (s < 5 && ((int64_t)u << s) < nit) s++;
    int r = MVD_WARPS * (32 >> s);
    while (r < 256 && (int64_t)2 * r * rb <= 32768 &&
           (int64_t)((rows + 2 * r - 1) / (2 * r)) * nbat >= 4 * (int64_t)c->info.sm_count)
        r *= 2;
    *lg_s = s;
    *R = r;
}

/* The direct kernels' lanes: S = 2^lg_s lanes a row, rpw = 32 / S rows a
 * warp, and the lanes of one row rpw apart (lane = sl * rpw + row, sl the
 * lane's place in its row). So the 8 lanes of a quarter-warp (one phase
 * of a 16-byte shared-memory load) are rpw rows reading the same
 * activation bytes (a broadcast) at 8 / rpw items, where 8 lanes of one
 * row read 8 items whose 16-byte chunks fall in the same banks (Q4_K:
 * 3.8-way conflicts, ncu, session 10). A warp's global loads are the same
 * set of addresses either way. mvd_reduce's shuffles pair the same sl as
 * the row-major mapping's (xor o * rpw on the lane is xor o on sl), so the
 * sums are unchanged bit for bit. Float weights (RAW activations, read from
 * global memory, no banks) keep the row-major lanes (lane = row * S + sl):
 * transposed, the F32 kernel spills. TR: transposed. */
template <int QT> struct mvd_tr { enum { TR = mv_traits<QT>::ACT != MV_ACT_RAW }; };
template <int QT> __device__ __forceinline__ float mvd_reduce(float acc, int S, int lg_s)
{
    for (int o = S >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, mvd_tr<QT>::TR ? o << (5 - lg_s) : o);
    return acc;
}

/* A matvec weight type's name for messages (the split Q8_0 layout is not
 * a ggml type). */
static const char *mv_type_name(int wtype) { return wtype == CUDA_Q8_0_SPLIT ? "q8_0 (split rows)" : qtype_name(wtype); }

/* The shape and alignment every matvec/matmul launch needs (name: the
 * caller's, for the message; n: its batch or item count). */
template <int QT>
static int mv_check(const char *name, int64_t rows, int64_t k, int n, const void *w, size_t w_stride, const void *xq,
                    size_t x_stride, err *e)
{
    typedef mv_traits<QT> T;
    const int kal = QT == CUDA_Q8_0_SPLIT ? 256 : (int)T::BE;   /* split rows: 16-byte aligned */
    if (k <= 0 || k % kal || k > INT_MAX / 8 || rows <= 0 || rows > INT_MAX || n <= 0 || n > 65535)
        return err_setf(e, ERR_USAGE, "%s: bad shape rows=%lld k=%lld batch=%d (%s: k a multiple of %d)", name,
                        (long long)rows, (long long)k, n, mv_type_name(QT), kal);
    const uintptr_t wal = T::WAL - 1, xal = T::XAL - 1;
    if ((((uintptr_t)w | (uintptr_t)w_stride) & wal) || (((uintptr_t)xq | (uintptr_t)x_stride) & xal))
        return err_setf(e, ERR_USAGE, "%s: %s weights need %d-byte and activations %d-byte alignment", name,
                        mv_type_name(QT), (int)T::WAL, (int)T::XAL);
    return 0;
}

/* ---- coalesced Q4_K / Q5_K loads (co) ----
 * (Q5_K since session 19's rebase of wip/q5k-co.patch; Q4_K's figures:)
 * A Q4_K lane loads its whole block (144 bytes: nine 16-byte loads), so a
 * warp's load instruction touches 32 blocks 144 bytes apart: 32 sectors
 * of as many lines. Measured on the H100 (session 18, a kernel that only
 * loads): 14.2 MB in this pattern take 6.56 us cold, in 512 contiguous
 * bytes an instruction 5.22 (1.26x). When one pass of a warp holds its rows
 * whole (nit <= S: K <= 32 blocks; the host then launches CO = true), the
 * warp's rows are rpw * rb contiguous bytes: it copies them to its own
 * shared memory as contiguous 16-byte chunks (cp.async, lane l chunks l +
 * 32 j: no registers held while they fly, where the block loads held 36),
 * a row at 16 rs16 bytes (padded so the 8 lanes of a 16-byte load phase
 * read 8 different bank groups), and each lane's dot reads its block from
 * there (mv_item: the same bytes and operations as mv_dot(mv_load), so
 * every sum is unchanged bit for bit). Decode 1.015x on the H100, 1.023x
 * on the H200; the grouped matmul (k_matmul_direct) reads the copied rows
 * for all its activation rows, prefill 1.121x on the H100 (bench/RESULTS.md,
 * session 18). The host launches CO only where mvd_co_ok holds: every
 * row of the CTA in its warps' first pass, so a warp copies once. */
/* The types with whole-block items that take the co path, and a block's
 * 16-byte chunks: Q4_K 144 bytes (9), Q5_K 176 (11; the padding rule of
 * qd_co_rs16 holds for both, test_cuda_emu). A warp's pass holds rpw * nit
 * <= 32 blocks, so a lane copies at most NCH chunks. */
__host__ __device__ constexpr bool mvd_co_type(int qt) { return qt == QTYPE_Q4_K || qt == QTYPE_Q5_K; }
template <int QT> struct mvd_co_t {
    static constexpr bool OK = mvd_co_type(QT);
    static constexpr int NCH = mv_traits<QT>::BB / 16;
};

/* Whether a launch of this geometry takes the co path: Q4_K / Q5_K rows of at
 * most S blocks (a lane's one item a row), and R (mvd_geometry) one pass
 * of the warps, MVD_WARPS * rpw rows (it always is then: R rb >= 8 * 16
 * blocks of 144 bytes > 16 KB stops the doubling; checked, not assumed). */
static bool mvd_co_ok(int qt, int64_t nit, int lg_s, int R)
{
    return mvd_co_type(qt) && nit <= (1 << lg_s) && R == MVD_WARPS * (32 >> lg_s);
}

/* ---- span copies for Q6_K (cos) ----
 * Q6_K blocks are 210 bytes, so rows are only 2-byte aligned, and a lane's
 * item of 32 weights reads nine 4-byte words (qd_ld64_a2), four scale
 * bytes and the scale d from global memory: ~14 load instructions where
 * a 16-byte load would take two. When a warp's pass holds its rows whole
 * (rpw rows of nit <= S U items), the warp copies the 16-byte chunks that
 * cover its rows' bytes [p, p + n) -- from p rounded down to 16 up to p + n
 * rounded up -- to its buffer by cp.async (lane l chunks l + 32 j), so each
 * row lands at its own offset mod 16 (p & 15 + its place): the items read
 * the same bytes at the same alignment from shared memory, and every sum is
 * the global path's bit for bit. The covering chunks stay inside the
 * matrix where its start, stride and size are multiples of 16 (the host
 * checks: mvd_cos_ok). NCH: a lane's chunks at most (rpw rb <= 32 U / IPB
 * blocks of BB bytes, + 2 partial chunks). */
__host__ __device__ constexpr bool mvd_cos_type(int qt) { return qt == QTYPE_Q6_K; }
template <int QT> struct mvd_cos_t {
    static constexpr bool OK = mvd_cos_type(QT);
    static constexpr int NCH = (32 * mv_traits<QT>::U / mv_traits<QT>::IPB * mv_traits<QT>::BB / 16 + 2 + 31) / 32;
};
/* the instances with a coalesced path of either kind */
template <int QT> struct mvd_co_any { static constexpr bool OK = mvd_co_t<QT>::OK || mvd_cos_t<QT>::OK; };
template <int QT>
static bool mvd_cos_ok(int64_t nit, int lg_s, int R, const void *w, size_t w_stride, const void *w2, int64_t rows, int rb)
{
    return mvd_cos_type(QT) && nit <= ((int64_t)mv_traits<QT>::U << lg_s) && R == MVD_WARPS * (32 >> lg_s) &&
           !(((uintptr_t)w | (uintptr_t)w2 | w_stride | ((size_t)rows * (size_t)rb)) & 15);
}

/* A warp's buffer after the activation (16-aligned): co, its rows at the
 * stride qd_co_rs16 (cuda_qdot.cuh, checked on the CPU by test_cuda_emu);
 * cos, its rows' covering chunks (<= rpw rb + 30 bytes). */
__host__ __device__ __forceinline__ size_t mvd_co_wbytes(int qt, int rb, int rpw)
{
    return mvd_cos_type(qt) ? (((size_t)rpw * rb + 15) & ~(size_t)15) + 32 : (size_t)rpw * 16 * qd_co_rs16(rb, rpw);
}
/* the co buffers of all warps */
static size_t mvd_co_bytes(int qt, int rb, int lg_s) { return (size_t)MVD_WARPS * mvd_co_wbytes(qt, rb, 32 >> lg_s); }

/* The warp's nch chunks at src copied to its buffer ws by 16-byte cp.async
 * (lane: chunks lane + 32 j; no registers held while they are in flight),
 * chunk c at qd_co_unit (its row's stride rs16, the quotient by cpr a
 * multiply-high by rcp = qd_co_rcp(cpr)). Once a launch (mvd_co_ok): the
 * buffer holds nothing before. */
template <int NCH>
__device__ __forceinline__ void co_issue(uint8_t *ws, const uint8_t *src, int nch, unsigned cpr, unsigned rcp, int rs16,
                                         int lane)
{
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const unsigned c = (unsigned)(lane + 32 * j);
        if ((int)c < nch) cp_async16(ws + 16 * qd_co_unit(c, cpr, rcp, rs16), src + 16 * (size_t)c);
    }
    cp_async_commit();
}
/* the copies landed and are visible to the warp */
__device__ __forceinline__ void co_place(void)
{
    cp_async_wait_all();
    __syncwarp();
}

/* cos: the 16-byte chunks covering [src, src + n) to ws (chunk c at 16 c,
 * so byte src + j lands at ws + (src & 15) + j); at most 32 NCH chunks. */
template <int NCH>
__device__ __forceinline__ void cos_issue(uint8_t *ws, const uint8_t *src, int n, int lane)
{
    const uintptr_t a0 = (uintptr_t)src & ~(uintptr_t)15;
    const int nch = (int)(((uintptr_t)src + (unsigned)n + 15 - a0) >> 4);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c = lane + 32 * j;
        if (c < nch) cp_async16(ws + 16 * c, (const uint8_t *)a0 + 16 * (size_t)c);
    }
    cp_async_commit();
}

/* The direct kernel's CTA: rows [blk R, blk R + R) of its matrix (blk is
 * blockIdx.x in k_matvec_direct; k_matvec_pair passes each CTA's place in
 * its own matrix). R is a multiple of MVD_WARPS * (32 >> lg_s) (rows of
 * one pass of the CTA). */
template <int QT, bool CO, int XQ>
__device__ __forceinline__ void mvd_cta(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids,
                                        int rows, int k, int R, int lg_s, const uint8_t *__restrict__ xq,
                                        size_t x_stride, float *y, size_t y_stride, const mv_ext &ex, int blk)
{
    typedef mv_traits<QT> T;
    extern __shared__ __align__(16) uint8_t smem[];
    const int nb = k / T::BE, rb = nb * T::BB, nit = nb * T::IPB;
    const int b = mv_pick(ex, &W, &y);   /* kernel arguments only */
    const int r0 = blk * R;
    const int nr = min(R, rows - r0);
    /* A matrix chosen by the batch index alone (no ids), or by ids written
     * two or more launches back (ex.ids_early: the down projection's, by
     * the router's top-k before gate+up and the SwiGLU quantizer), is known
     * before the wait on the previous kernel: its rows are prefetched into
     * L2 first, so their HBM latency overlaps that kernel's run (a prefetch
     * reads nothing into the program: see pdl_enter's contract; the early
     * ids load is __ldcg, from L2, where the completed grid that wrote
     * them left them). */
    const bool early = !ids || ex.ids_early;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int S = 1 << lg_s, rpw = 32 >> lg_s;
    const int sl = mvd_tr<QT>::TR ? lane >> (5 - lg_s) : lane & (S - 1);
    const int base0 = warp * rpw;
    /* the lane's row in a group of rpw rows starting at base */
#define MVD_ROW(base) ((base) + (mvd_tr<QT>::TR ? lane & (rpw - 1) : lane >> lg_s))
    /* one pass of MVD_U items of the lane's row (branch-free: a lane past
     * the last row or item loads a valid one, row nr - 1, item nit - 1:
     * lines other lanes load anyway, and adds 0 for it) */
#define MVD_LOAD(wr, g, base, c)                                                        \
    do {                                                                                \
        const uint8_t *wrow_ = (g) + (size_t)min(MVD_ROW(base), nr - 1) * rb;           \
        _Pragma("unroll") for (int u = 0; u < T::U; u++)                                \
            mv_load<QT>((wr)[u], wrow_, min((c) + sl + S * u, nit - 1), nb);           \
    } while (0)
    mv_w<QT> wr[T::U];
    /* a CTA whose rows are one pass of its lanes has all its bytes in
     * flight from the hoisted loads: no L2 prefetch then */
    /* coalesced loads (Q4_K, Q5_K, a warp's pass holds whole rows: see mvd_co;
     * Q6_K the same by span copies: mvd_cos) */
    constexpr bool co = mvd_co_t<QT>::OK && CO;     /* the host's choice: mvd_co_ok */
    constexpr bool span = mvd_cos_t<QT>::OK && CO;   /* mvd_cos_ok */
    const bool pf = !(mv_w<QT>::H || co || span) || nr > MVD_WARPS * rpw || nit > S * T::U;
    const int cpr = rb / 16, rs16 = qd_co_rs16(rb, rpw);
    uint8_t *ws = smem + ((mv_act_bytes(T::ACT, k, T::BE) + 15) & ~(size_t)15) + (size_t)warp * mvd_co_wbytes(QT, rb, rpw);
    const unsigned rcp = qd_co_rcp((unsigned)cpr);
#define MVD_ISSUE(base)                                                                                        \
    do {                                                                                                       \
        const uint8_t *src_ = g + (size_t)(base) * rb;                                                         \
        const int nrw_ = min(rpw, nr - (base));                                                                \
        if constexpr (span) cos_issue<mvd_cos_t<QT>::NCH>(ws, src_, nrw_ * rb, lane);                          \
        else co_issue<mvd_co_t<QT>::NCH>(ws, src_, nrw_ * cpr, (unsigned)cpr, rcp, rs16, lane);                \
    } while (0)
    int mat = b;
    const uint8_t *g = NULL;
    if (early) {
        if (ids) mat = __ldcg(ids + b);
        g = W + (size_t)mat * w_stride + (size_t)r0 * rb;
        if ((mv_w<QT>::H || co || span) && base0 < nr) {   /* the first pass, before the wait */
            if (co || span) MVD_ISSUE(base0);
            else MVD_LOAD(wr, g, base0, 0);
        }
        if (pf) mvd_prefetch_l2(g, (size_t)nr * rb);
    }
    /* a normed input written two or more launches back: normed (and
     * quantized) before the wait, off the chain (cuda_matvec_args.x_early) */
    float *sxd;
    int16_t *sxbs;
    const int8_t *xs = NULL;
    if (XQ != MV_XQ_NONE && ex.x_early) xs = mv_act<QT, XQ>(xq, ex, (size_t)b * x_stride, smem, k, &sxd, &sxbs, smem);
    else if (XQ == MV_XQ_NORM) cta_prefetch_l2(ex.xnw, sizeof(float) * (size_t)k, threadIdx.x, blockDim.x);   /* at load */
    pdl_enter();
    if (!early) {
        mat = ids[b];
        g = W + (size_t)mat * w_stride + (size_t)r0 * rb;
        if ((mv_w<QT>::H || co || span) && base0 < nr) {   /* the first pass, before the unpack */
            if (co || span) MVD_ISSUE(base0);
            else MVD_LOAD(wr, g, base0, 0);
        }
        if (pf) mvd_prefetch_l2(g, (size_t)nr * rb);
    }

    if (XQ == MV_XQ_NONE || !ex.x_early) xs = mv_act<QT, XQ>(xq, ex, (size_t)b * x_stride, smem, k, &sxd, &sxbs, smem);
    __syncthreads();

    /* the loop bound is warp-uniform (base), so every lane reaches the shuffles */
    for (int base = base0; base < nr; base += MVD_WARPS * rpw) {
        const int i = MVD_ROW(base);
        float acc = 0.f;
        if (co) {   /* one pass (base == base0) holds the row; the lane's block from the warp's buffer */
            const int nrw = min(rpw, nr - base);
            co_place();
            const float v = mv_item<QT>(ws + (size_t)16 * rs16 * min(i - base, nrw - 1), xs, sxd, sxbs,
                                        min(sl, nit - 1), nb);
            acc += sl < nit ? v : 0.f;
        }
        if (span) {   /* one pass holds the rows: the lane's U items from the warp's copy, in the loop's order */
            const int nrw = min(rpw, nr - base);
            co_place();
            const uint8_t *wrow =
                ws + ((uintptr_t)(g + (size_t)base * rb) & 15) + (size_t)rb * min(i - base, nrw - 1);
#pragma unroll
            for (int u = 0; u < T::U; u++) {
                const int it = sl + S * u;
                const float v = mv_item<QT>(wrow, xs, sxd, sxbs, min(it, nit - 1), nb);
                acc += it < nit ? v : 0.f;
            }
        }
        for (int c = 0; c < (co || span ? 0 : nit); c += S * T::U) {
            if (!co && (!mv_w<QT>::H || base != base0 || c != 0)) MVD_LOAD(wr, g, base, c);
#pragma unroll
            for (int u = 0; u < T::U; u++) {
                const int it = c + sl + S * u;
                const float v = mv_dot<QT>(wr[u], xs, sxd, sxbs, min(it, nit - 1), nb);
                acc += it < nit ? v : 0.f;
            }
        }
        acc = mvd_reduce<QT>(acc, S, lg_s);
        if (i < nr && sl == 0) mv_store(ex, y, (size_t)b * y_stride + r0 + i, acc);
    }
#undef MVD_ISSUE
#undef MVD_LOAD
#undef MVD_ROW
}

/* grid: (ceil(rows / R), n_batch); block: 32 * MVD_WARPS threads. */
template <int QT, bool CO = false, int XQ = MV_XQ_NONE>
__global__ void __launch_bounds__(32 * MVD_WARPS, QT == CUDA_Q8_0_SPLIT ? 5 : 4)
k_matvec_direct(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k,
                int R, int lg_s, const uint8_t *__restrict__ xq, size_t x_stride, float *y, size_t y_stride,
                mv_ext ex)
{
    mvd_cta<QT, CO, XQ>(W, w_stride, ids, rows, k, R, lg_s, xq, x_stride, y, y_stride, ex, blockIdx.x);
}

/* ---- two matrices of two types in one launch (cuda_matvec_pair) ----
 * One dependent phase where two launches made two: a Q4_K_M file's q+k
 * (Q4_K) and its Q6_K v in half of its layers. Each matrix keeps the
 * geometry its own launch would take (mvd_plan_of: lanes a row, R, co), so
 * every output is its own launch's bit for bit; CTAs [0, nblk_a) take
 * matrix a, the rest matrix b. Both types unpack the activation row the
 * same way (mv_traits ACT), so one xq serves both. */
struct mvd_seg {
    const uint8_t *W;
    float *y;
    int rows, R, lg_s;
};
template <int QA, bool COA, int QB, bool COB>
__global__ void __launch_bounds__(32 * MVD_WARPS, 4)
k_matvec_pair(mvd_seg a, mvd_seg b, int k, const uint8_t *__restrict__ xq, int nblk_a, mv_ext ex)
{
    static_assert((int)mv_traits<QA>::ACT == (int)mv_traits<QB>::ACT, "one activation row for both matrices");
    if ((int)blockIdx.x < nblk_a)
        mvd_cta<QA, COA, MV_XQ_NONE>(a.W, 0, NULL, a.rows, k, a.R, a.lg_s, xq, 0, a.y, 0, ex, blockIdx.x);
    else
        mvd_cta<QB, COB, MV_XQ_NONE>(b.W, 0, NULL, b.rows, k, b.R, b.lg_s, xq, 0, b.y, 0, ex, blockIdx.x - nblk_a);
}

/* ---- grouped matmul (prompt chunks) ----
 * k_matvec_direct with up to CUDA_MM_NB activation rows per item: the CTA
 * unpacks them side by side in shared memory (act_al bytes each), and each
 * lane, for each of its weight items, adds the item's dot with every row to
 * that row's accumulator: per row exactly the direct kernel's sequence of
 * additions and shuffles, so every output is the matvec's bit for bit,
 * while the weight bytes are loaded once for all rows. grid: (ceil(rows /
 * R), n_items). */
/* 4 CTAs an SM (64 registers), F32 2: left at 2, ptxas gives split Q8_0
 * rows 81 registers (88 allocated: 2 CTAs an SM, against 4 for Q8_0's
 * 56; the prefill measured 0.945x the Q8_0 rows', session 11), Q4_K's and
 * Q5_K's block items 128, Q6_K, Q4_1 and Q5_1 72 (3 CTAs); capped, none
 * spills (F32 would: 96). */
template <int QT, bool CO = false>
__global__ void __launch_bounds__(32 * MVD_WARPS, QT == QTYPE_F32 ? 2 : 4)
k_matmul_direct(const uint8_t *__restrict__ W, size_t w_stride, const int32_t *__restrict__ ids, int rows, int k,
                int R, int lg_s, const uint8_t *__restrict__ xq, size_t x_stride, const int32_t *__restrict__ xrow,
                const int64_t *__restrict__ yoff, float *y, int act_al)
{
    pdl_enter();
    typedef mv_traits<QT> T;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ const int8_t *s_xs[CUDA_MM_NB];
    __shared__ const float *s_xd[CUDA_MM_NB];
    __shared__ const int16_t *s_xbs[CUDA_MM_NB];
    const int nb = k / T::BE, rb = nb * T::BB, nit = nb * T::IPB;
    const int b = blockIdx.y;
    const int mat = ids ? ids[b] : 0;
    const int r0 = blockIdx.x * R;
    const int nr = min(R, rows - r0);
    const uint8_t *g = W + (size_t)mat * w_stride + (size_t)r0 * rb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int S = 1 << lg_s, rpw = 32 >> lg_s;
    /* coalesced Q4_K / Q5_K loads (mvd_co; the host's choice: mvd_co_ok), or
     * Q6_K span copies (mvd_cos, mvd_cos_ok): the warp's rows copied once to
     * its buffer after the activations, each row's items read there by all
     * its rows' dots */
    constexpr bool co = mvd_co_t<QT>::OK && CO;
    constexpr bool span = mvd_cos_t<QT>::OK && CO;
    const int rs16 = qd_co_rs16(rb, rpw);
    uint8_t *ws = smem + (size_t)act_al * CUDA_MM_NB + (size_t)warp * mvd_co_wbytes(QT, rb, rpw);
    if (span) {
        if (warp * rpw < nr)
            cos_issue<mvd_cos_t<QT>::NCH>(ws, g + (size_t)warp * rpw * rb, min(rpw, nr - warp * rpw) * rb, lane);
    } else if (co) {
        const int cpr = rb / 16;
        if (warp * rpw < nr)
            co_issue<mvd_co_t<QT>::NCH>(ws, g + (size_t)warp * rpw * rb, min(rpw, nr - warp * rpw) * cpr,
                                        (unsigned)cpr, qd_co_rcp((unsigned)cpr), rs16, lane);
    } else {
        mvd_prefetch_l2(g, (size_t)nr * rb);
    }
    int nv = 0;
    for (int j = 0; j < CUDA_MM_NB; j++) {
        const int xr = xrow[(size_t)b * CUDA_MM_NB + j];
        if (xr < 0) break;
        float *sxd;
        int16_t *sxbs;
        const int8_t *xs = mv_unpack<QT>(xq + (size_t)xr * x_stride, smem + (size_t)j * act_al, k, &sxd, &sxbs);
        if (threadIdx.x == 0) { s_xs[j] = xs; s_xd[j] = sxd; s_xbs[j] = sxbs; }
        nv++;
    }
    __syncthreads();

    const int sl = mvd_tr<QT>::TR ? lane >> (5 - lg_s) : lane & (S - 1);
    for (int base = warp * rpw; base < nr; base += MVD_WARPS * rpw) {
        const int i = base + (mvd_tr<QT>::TR ? lane & (rpw - 1) : lane >> lg_s);
        const bool ok = i < nr;
        const uint8_t *wrow = g + (size_t)min(i, nr - 1) * rb;
        if (co) {   /* one pass (mvd_co_ok): base is the warp's first */
            co_place();
            wrow = ws + (size_t)16 * rs16 * (min(i, nr - 1) - base);
        }
        if (span) {   /* one pass (mvd_cos_ok): the row at its own offset mod 16 in the copy */
            co_place();
            wrow = ws + ((uintptr_t)(g + (size_t)base * rb) & 15) + (size_t)rb * (min(i, nr - 1) - base);
        }
        float acc[CUDA_MM_NB];
#pragma unroll
        for (int j = 0; j < CUDA_MM_NB; j++) acc[j] = 0.f;
        for (int c = 0; c < nit; c += S * T::U) {
#pragma unroll
            for (int u = 0; u < T::U; u++) {
                const int it = c + sl + S * u, itc = min(it, nit - 1);
#pragma unroll
                for (int j = 0; j < CUDA_MM_NB; j++) {
                    if (j < nv) {   /* uniform */
                        const float v = mv_item<QT>(wrow, s_xs[j], (float *)s_xd[j], (int16_t *)s_xbs[j], itc, nb);
                        acc[j] += it < nit ? v : 0.f;
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < CUDA_MM_NB; j++) {
            if (j >= nv) break;
            const float a = mvd_reduce<QT>(acc[j], S, lg_s);
            if (ok && sl == 0) y[yoff[(size_t)b * CUDA_MM_NB + j] + r0 + i] = a;
        }
    }
}

/* Dynamic shared memory may use the opt-in limit less the kernel's static
 * shared memory (k_matvec's reduction array): MV_SMEM_STATIC bytes, which
 * mv_run keeps free as well. */
#define MV_SMEM_STATIC 64

/* The direct kernel's instances of one type and co choice: the input
 * paths its type takes (XQ: MV_XQ_QUANT for Q8_K / Q8_0 dot types,
 * MV_XQ_NORM those and F32), each made only where a launch can ask for
 * it. mvd_pick returns the one cuda_matvec_args asks for. */
typedef void (*mvd_fn)(const uint8_t *, size_t, const int32_t *, int, int, int, int, const uint8_t *, size_t, float *,
                       size_t, mv_ext);
template <int QT, bool CO>
static mvd_fn mvd_pick(int xquant, int x_early)
{
    if constexpr (mvd_xq<QT>::NORM)
        if (xquant == CUDA_XQ_NORM) return k_matvec_direct<QT, CO, MV_XQ_NORM>;
    if constexpr (mvd_xq<QT>::Q8)
        if (xquant || x_early) return k_matvec_direct<QT, CO, MV_XQ_QUANT>;
    return k_matvec_direct<QT, CO, MV_XQ_NONE>;
}
/* The dynamic shared-memory limit of every instance mvd_pick may return. */
template <int QT, bool CO>
static int mvd_attr(int lim, err *e)
{
    static const int modes[] = {0, CUDA_XQ_F32, CUDA_XQ_NORM};
    for (int i = 0; i < 3; i++) {
        const int r = cuda_fail(e, cudaFuncSetAttribute(mvd_pick<QT, CO>(modes[i], 0),
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        lim - MV_SMEM_STATIC),
                                "matvec smem attribute");
        if (r) return r;
    }
    return 0;
}

template <int QT>
static int mv_attr(int lim, err *e)
{
    static_assert(sizeof(float) * MV_WARPS <= MV_SMEM_STATIC, "k_matvec static shared memory");
    int r = cuda_fail(e, cudaFuncSetAttribute(k_matvec<QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              lim - MV_SMEM_STATIC),
                      "matvec smem attribute");
    if (!r) r = mvd_attr<QT, false>(lim, e);
    if constexpr (mvd_co_any<QT>::OK)   /* the coalesced instances exist for Q4_K, Q5_K and Q6_K only */
        if (!r) r = mvd_attr<QT, true>(lim, e);
    if (!r)
        r = cuda_fail(e, cudaFuncSetAttribute(k_matmul_direct<QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              lim - MV_SMEM_STATIC - 3 * 8 * CUDA_MM_NB),
                      "matmul smem attribute");
    if constexpr (mvd_co_any<QT>::OK)
        if (!r)
            r = cuda_fail(e, cudaFuncSetAttribute(k_matmul_direct<QT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  lim - MV_SMEM_STATIC - 3 * 8 * CUDA_MM_NB),
                          "matmul smem attribute");
    return r;
}

/* The pair kernel's instance for q+k's type QA and v's QB, each on its
 * coalesced path or not (mvd_plan_of). */
typedef void (*mvp_fn)(mvd_seg, mvd_seg, int, const uint8_t *, int, mv_ext);
template <int QA, int QB>
static mvp_fn mvp_pick(bool coa, bool cob)
{
    if (coa) return cob ? k_matvec_pair<QA, true, QB, true> : k_matvec_pair<QA, true, QB, false>;
    return cob ? k_matvec_pair<QA, false, QB, true> : k_matvec_pair<QA, false, QB, false>;
}
template <int QA, int QB>
static int mvp_attr(int lim, err *e)
{
    for (int i = 0; i < 4; i++) {
        const int r = cuda_fail(e, cudaFuncSetAttribute(mvp_pick<QA, QB>(i & 1, i >> 1),
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        lim - MV_SMEM_STATIC),
                                "matvec pair smem attribute");
        if (r) return r;
    }
    return 0;
}

int cuda_matvec_init(cuda_ctx *c, err *e)
{
    const int lim = (int)c->info.smem_per_block_optin;
    int r = 0;
    if ((r = mv_attr<QTYPE_Q4_K>(lim, e)) || (r = mv_attr<QTYPE_Q5_K>(lim, e)) || (r = mv_attr<QTYPE_Q6_K>(lim, e)) ||
        (r = mv_attr<QTYPE_Q8_0>(lim, e)) || (r = mv_attr<CUDA_Q8_0_SPLIT>(lim, e)) || (r = mv_attr<QTYPE_Q4_0>(lim, e)) || (r = mv_attr<QTYPE_Q5_0>(lim, e)) ||
        (r = mv_attr<QTYPE_Q4_1>(lim, e)) || (r = mv_attr<QTYPE_Q5_1>(lim, e)) || (r = mv_attr<QTYPE_F32>(lim, e)) ||
        (r = mv_attr<QTYPE_F16>(lim, e)) || (r = mv_attr<QTYPE_BF16>(lim, e)) ||
        (r = mvp_attr<QTYPE_Q4_K, QTYPE_Q6_K>(lim, e)) || (r = mvp_attr<QTYPE_Q5_K, QTYPE_Q6_K>(lim, e)))
        return r;
    return cuda_mmq_init(c, e);
}

/* A direct launch's geometry for one matrix of rows x k, nbat matrices
 * (mvd_geometry; co: mvd_co_ok or, for Q6_K, mvd_cos_ok on the weights w,
 * w2 and their stride), its CTAs a matrix (nblk) and its dynamic shared
 * memory: the activation, + the co buffers (mv_run adds the norm's row
 * where it applies). */
struct mvd_plan {
    int lg_s, R;
    bool co;
    size_t dsm;
    unsigned nblk;
};
template <int QT>
static mvd_plan mvd_plan_of(const cuda_ctx *c, int rows, int k, int64_t nbat, const void *w, size_t w_stride,
                            const void *w2)
{
    typedef mv_traits<QT> T;
    const int rb = k / T::BE * T::BB;
    const size_t act = mv_act_bytes(T::ACT, k, T::BE);
    const int64_t nit = (int64_t)(k / T::BE) * T::IPB;
    mvd_plan p;
    mvd_geometry(c, nit, T::U, rows, rb, nbat, &p.lg_s, &p.R);
    p.co = mvd_co_ok(QT, nit, p.lg_s, p.R) || mvd_cos_ok<QT>(nit, p.lg_s, p.R, w, w_stride, w2, rows, rb);
    p.dsm = p.co ? ((act + 15) & ~(size_t)15) + mvd_co_bytes(QT, rb, p.lg_s) : act;
    p.nblk = (unsigned)((rows + p.R - 1) / p.R);
    return p;
}

/* cuda_matvec_batch launches the direct kernel (what measured faster on
 * the whole model, above); the tile kernel only when cuda_matvec_force
 * asks for it (the benchmark's comparison). */
template <int QT>
static int mv_run(cuda_ctx *c, const cuda_matvec_args *a, err *e)
{
    typedef mv_traits<QT> T;
    TRY_MV(mv_check<QT>("cuda_matvec", a->rows, a->k, a->n_batch, a->w, a->w_stride, a->xq, a->x_stride, e));
    const uintptr_t wal = T::WAL - 1;
    const int k = (int)a->k, rows = (int)a->rows;
    const int rb = k / T::BE * T::BB;   /* <= 4 k: k <= INT_MAX / 8 */
    const size_t act = mv_act_bytes(T::ACT, k, T::BE);
    const uint8_t *w = (const uint8_t *)a->w, *xq = (const uint8_t *)a->xq;
    if (a->w2 && ((uintptr_t)a->w2 & wal))
        return err_setf(e, ERR_USAGE, "cuda_matvec: %s weights need %d-byte alignment", mv_type_name(a->wtype),
                        (int)T::WAL);
    if (a->w2 && (!a->y2 || a->add || a->n_batch > 65535 / 2))
        return err_setf(e, ERR_USAGE, "cuda_matvec: a second matrix set needs y2, no add, n_batch <= %d", 65535 / 2);
    if (a->xquant) {
        const uintptr_t al = (uintptr_t)a->xq | (uintptr_t)a->x_stride | (a->xquant == CUDA_XQ_SWIGLU ? (uintptr_t)a->xu : 0);
        if (!mvd_xq<QT>::Q8 && !(mvd_xq<QT>::NORM && a->xquant == CUDA_XQ_NORM))
            return err_setf(e, ERR_USAGE, "cuda_matvec: xquant needs a Q8_K or Q8_0 dot type (or F32 weights for a norm), not %s's",
                            mv_type_name(a->wtype));
        if ((a->xquant != CUDA_XQ_F32 && a->xquant != CUDA_XQ_SWIGLU && a->xquant != CUDA_XQ_NORM) ||
            (a->xquant == CUDA_XQ_SWIGLU && !a->xu) || (a->xquant == CUDA_XQ_SWIGLU && QT == CUDA_Q8_0_SPLIT) ||
            (a->xquant == CUDA_XQ_NORM && (!a->xnw || a->x_stride)) || (al & 15))
            return err_setf(e, ERR_USAGE, "cuda_matvec: xquant %d needs f32 rows 16-byte aligned (swiglu: and xu, not "
                            "with split q8_0 rows; norm: xnw and one shared row)",
                            a->xquant);
    }
    /* x_early: a norm, or a plain row of a Q8 dot type (the instances that have the early path) */
    const int xe = a->x_early && (a->xquant == CUDA_XQ_NORM || (!a->xquant && mvd_xq<QT>::Q8));
    int nq_dt = 0;
    if (a->nq_out) {
        const int dt = qtype_get(a->nq_type) ? qtype_get(a->nq_type)->dot_type : -1;
        if (a->xquant != CUDA_XQ_NORM || !cuda_matvec_xquant_ok(a->nq_type) || (dt != QTYPE_Q8_K && dt != QTYPE_Q8_0) ||
            ((uintptr_t)a->nq_out & 3))
            return err_setf(e, ERR_USAGE, "cuda_matvec: nq_out needs a norm and a Q8_K or Q8_0 dot type (4-byte aligned)");
        nq_dt = dt == QTYPE_Q8_K ? 2 : 0;
    }
    mv_ext ex = { (const uint8_t *)a->w2, a->y2, a->add, a->ids_early, a->xquant, a->xu, a->xnw, a->eps, xe, 0,
                  (uint8_t *)a->nq_out, nq_dt };
    /* the launch's matrices: both sets when there are two */
    const int64_t nbat = a->w2 ? 2 * (int64_t)a->n_batch : a->n_batch;
    if (c->mv_force != 1 || a->xquant == CUDA_XQ_NORM) {
        const mvd_plan p = mvd_plan_of<QT>(c, rows, k, nbat, a->w, a->w_stride, a->w2);
        const int lg_s = p.lg_s, R = p.R;
        const bool co = p.co;
        size_t dsm = p.dsm;
        if (a->xquant == CUDA_XQ_NORM) {   /* + the normed row and the norm's RMS_THREADS / 32 partial sums */
            dsm = (dsm + 15) & ~(size_t)15;
            ex.nrm_off = (int)dsm;
            dsm += sizeof(float) * (size_t)k + sizeof(double) * (RMS_THREADS / 32);
        }
        if (dsm + MV_SMEM_STATIC > c->info.smem_per_block_optin)
            return err_setf(e, ERR_UNSUPPORTED, "cuda_matvec: k=%d too large (%zu bytes of shared memory)", k, dsm);
        const dim3 grid(p.nblk, (unsigned)nbat);
        mvd_fn fn = mvd_pick<QT, false>(a->xquant, ex.x_early);
        if constexpr (mvd_co_any<QT>::OK)
            if (co) fn = mvd_pick<QT, true>(a->xquant, ex.x_early);
        return cuda_launch(c, fn, grid, 32 * MVD_WARPS, dsm, e, "matvec", w, a->w_stride, a->ids, rows, k, R, lg_s, xq,
                           a->x_stride, a->y, a->y_stride, ex);
    }
    /* R: tiles <= 32 KB (or down to 1 row when even 4 rows exceed 64 KB);
     * halved while the grid would not fill the GPU twice (down to 4 rows),
     * and below 4 rows only while it would not fill it once (the warps then
     * split rows: the 128-row F32 router gets 128 one-row CTAs) */
    const int sms = c->info.sm_count;
    int R = 64;
    while (R > 4 && mv_tile_bytes(R, rb) > 32768) R >>= 1;
    while (R > 1 && mv_tile_bytes(R, rb) > 65536) R >>= 1;
    while (R > 4 && (int64_t)((rows + R - 1) / R) * nbat < 2 * (int64_t)sms) R >>= 1;
    while (R > 1 && R <= 4 && (int64_t)((rows + R - 1) / R) * nbat < (int64_t)sms) R >>= 1;
    const size_t smem = mv_tile_bytes(R, rb) + act;
    if (smem + MV_SMEM_STATIC > c->info.smem_per_block_optin)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_matvec: k=%d too large for one tile (%zu bytes of shared memory)", k,
                        smem);
    const dim3 grid((unsigned)((rows + R - 1) / R), (unsigned)nbat);
    return cuda_launch(c, k_matvec<QT>, grid, 32 * MV_WARPS, smem, e, "matvec", w, a->w_stride, a->ids, rows, k, R, xq,
                       a->x_stride, a->y, a->y_stride, ex);
}

template <int QT>
static int mm_run(cuda_ctx *c, const cuda_matmul_args *a, err *e)
{
    typedef mv_traits<QT> T;
    TRY_MV(mv_check<QT>("cuda_matmul", a->rows, a->k, a->n_items, a->w, a->w_stride, a->xq, a->x_stride, e));
    if (!a->xrow || !a->yoff) return err_setf(e, ERR_USAGE, "cuda_matmul: no item lists (xrow, yoff)");
    const int k = (int)a->k, rows = (int)a->rows;
    const int rb = k / T::BE * T::BB;
    const int act_al = (int)((mv_act_bytes(T::ACT, k, T::BE) + 15) & ~(size_t)15);
    const size_t smem = (size_t)act_al * CUDA_MM_NB;
    if (smem + MV_SMEM_STATIC + 3 * 8 * CUDA_MM_NB > c->info.smem_per_block_optin)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_matmul: k=%d too large (%zu bytes of shared memory)", k, smem);
    /* the direct kernel's geometry and copy path: the same lanes per row, so the same sums */
    const mvd_plan p = mvd_plan_of<QT>(c, rows, k, a->n_items, a->w, a->w_stride, NULL);
    const int lg_s = p.lg_s, R = p.R;
    /* Q4_K / Q5_K / Q6_K / split Q8_0 on the tensor cores (cuda_mmq.cu): the same outputs;
     * cuda_matvec_force's direct mode keeps the dp4a kernel (the
     * benchmark's comparison) */
    if constexpr (QT == QTYPE_Q4_K || QT == QTYPE_Q5_K || QT == QTYPE_Q6_K || QT == CUDA_Q8_0_SPLIT)
        if (c->mv_force != 2 && cuda_mmq_ok(c, a, lg_s)) return cuda_mmq_run(c, a, lg_s, e);
    const dim3 grid(p.nblk, (unsigned)a->n_items);
    if constexpr (mvd_co_any<QT>::OK)
        if (p.co) {   /* coalesced loads or span copies: the warps' row buffers after the activations */
            const size_t csm = smem + mvd_co_bytes(QT, rb, lg_s);
            if (csm + MV_SMEM_STATIC + 3 * 8 * CUDA_MM_NB <= c->info.smem_per_block_optin)
                return cuda_launch(c, k_matmul_direct<QT, true>, grid, 32 * MVD_WARPS, csm, e, "matmul",
                                   (const uint8_t *)a->w, a->w_stride, a->ids, rows, k, R, lg_s,
                                   (const uint8_t *)a->xq, a->x_stride, a->xrow, a->yoff, a->y, act_al);
        }
    return cuda_launch(c, k_matmul_direct<QT>, grid, 32 * MVD_WARPS, smem, e, "matmul", (const uint8_t *)a->w,
                       a->w_stride, a->ids, rows, k, R, lg_s, (const uint8_t *)a->xq, a->x_stride, a->xrow, a->yoff,
                       a->y, act_al);
}

extern "C" int cuda_matmul(cuda_ctx *c, const cuda_matmul_args *a, err *e)
{
    switch (a->wtype) {
    case QTYPE_Q4_K: return mm_run<QTYPE_Q4_K>(c, a, e);
    case QTYPE_Q5_K: return mm_run<QTYPE_Q5_K>(c, a, e);
    case QTYPE_Q6_K: return mm_run<QTYPE_Q6_K>(c, a, e);
    case QTYPE_Q8_0: return mm_run<QTYPE_Q8_0>(c, a, e);
    case CUDA_Q8_0_SPLIT: return mm_run<CUDA_Q8_0_SPLIT>(c, a, e);
    case QTYPE_Q4_0: return mm_run<QTYPE_Q4_0>(c, a, e);
    case QTYPE_Q5_0: return mm_run<QTYPE_Q5_0>(c, a, e);
    case QTYPE_Q4_1: return mm_run<QTYPE_Q4_1>(c, a, e);
    case QTYPE_Q5_1: return mm_run<QTYPE_Q5_1>(c, a, e);
    case QTYPE_F32: return mm_run<QTYPE_F32>(c, a, e);
    case QTYPE_F16: return mm_run<QTYPE_F16>(c, a, e);
    case QTYPE_BF16: return mm_run<QTYPE_BF16>(c, a, e);
    default:
        return err_setf(e, ERR_UNSUPPORTED, "cuda_matmul: weight type %s has no CUDA kernel yet", mv_type_name(a->wtype));
    }
}

extern "C" int cuda_matvec_xquant_ok(int wtype)
{
    switch (wtype) {
    case QTYPE_Q4_K: case QTYPE_Q5_K: case QTYPE_Q6_K: case QTYPE_Q8_0: case CUDA_Q8_0_SPLIT: case QTYPE_Q4_0:
    case QTYPE_Q5_0:
        return 1;
    default:
        return 0;
    }
}

extern "C" int cuda_matvec_xnorm_ok(int wtype) { return wtype == QTYPE_F32 || cuda_matvec_xquant_ok(wtype); }

extern "C" void cuda_matvec_force(cuda_ctx *c, int mode) { c->mv_force = mode == 1 || mode == 2 ? mode : 0; }

extern "C" int cuda_matvec_batch(cuda_ctx *c, const cuda_matvec_args *a, err *e)
{
    switch (a->wtype) {
    case QTYPE_Q4_K: return mv_run<QTYPE_Q4_K>(c, a, e);
    case QTYPE_Q5_K: return mv_run<QTYPE_Q5_K>(c, a, e);
    case QTYPE_Q6_K: return mv_run<QTYPE_Q6_K>(c, a, e);
    case QTYPE_Q8_0: return mv_run<QTYPE_Q8_0>(c, a, e);
    case CUDA_Q8_0_SPLIT: return mv_run<CUDA_Q8_0_SPLIT>(c, a, e);
    case QTYPE_Q4_0: return mv_run<QTYPE_Q4_0>(c, a, e);
    case QTYPE_Q5_0: return mv_run<QTYPE_Q5_0>(c, a, e);
    case QTYPE_Q4_1: return mv_run<QTYPE_Q4_1>(c, a, e);
    case QTYPE_Q5_1: return mv_run<QTYPE_Q5_1>(c, a, e);
    case QTYPE_F32: return mv_run<QTYPE_F32>(c, a, e);
    case QTYPE_F16: return mv_run<QTYPE_F16>(c, a, e);
    case QTYPE_BF16: return mv_run<QTYPE_BF16>(c, a, e);
    default:
        return err_setf(e, ERR_UNSUPPORTED, "cuda_matvec: weight type %s has no CUDA kernel yet", mv_type_name(a->wtype));
    }
}

extern "C" int cuda_matvec(cuda_ctx *c, int wtype, const void *w, int64_t rows, int64_t k, const void *xq, float *y,
                           err *e)
{
    cuda_matvec_args a;
    memset(&a, 0, sizeof a);
    a.wtype = wtype;
    a.w = w;
    a.rows = rows;
    a.k = k;
    a.n_batch = 1;
    a.xq = xq;
    a.y = y;
    return cuda_matvec_batch(c, &a, e);
}

template <int QA, int QB>
static int mvp_run(cuda_ctx *c, const cuda_matvec_seg *s, int64_t k, const void *xq, err *e)
{
    TRY_MV(mv_check<QA>("cuda_matvec_pair", s[0].rows, k, 1, s[0].w, 0, xq, 0, e));
    TRY_MV(mv_check<QB>("cuda_matvec_pair", s[1].rows, k, 1, s[1].w, 0, xq, 0, e));
    if (c->mv_force == 1) {   /* the tile kernel asked for: two launches of it */
        TRY_MV(cuda_matvec(c, s[0].wtype, s[0].w, s[0].rows, k, xq, s[0].y, e));
        return cuda_matvec(c, s[1].wtype, s[1].w, s[1].rows, k, xq, s[1].y, e);
    }
    const mvd_plan pa = mvd_plan_of<QA>(c, (int)s[0].rows, (int)k, 1, s[0].w, 0, NULL);
    const mvd_plan pb = mvd_plan_of<QB>(c, (int)s[1].rows, (int)k, 1, s[1].w, 0, NULL);
    const size_t dsm = pa.dsm > pb.dsm ? pa.dsm : pb.dsm;
    if (dsm + MV_SMEM_STATIC > c->info.smem_per_block_optin)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_matvec_pair: k=%lld too large (%zu bytes of shared memory)",
                        (long long)k, dsm);
    const mvd_seg sa = {(const uint8_t *)s[0].w, s[0].y, (int)s[0].rows, pa.R, pa.lg_s};
    const mvd_seg sb = {(const uint8_t *)s[1].w, s[1].y, (int)s[1].rows, pb.R, pb.lg_s};
    mv_ext ex;
    memset(&ex, 0, sizeof ex);
    const dim3 grid(pa.nblk + pb.nblk);
    return cuda_launch(c, mvp_pick<QA, QB>(pa.co, pb.co), grid, 32 * MVD_WARPS, dsm, e, "matvec pair", sa, sb, (int)k,
                       (const uint8_t *)xq, (int)pa.nblk, ex);
}

extern "C" int cuda_matvec_pair_ok(int wtype_a, int wtype_b)
{
    return (wtype_a == QTYPE_Q4_K || wtype_a == QTYPE_Q5_K) && wtype_b == QTYPE_Q6_K;
}

extern "C" int cuda_matvec_pair(cuda_ctx *c, const cuda_matvec_seg s[2], int64_t k, const void *xq, err *e)
{
    if (s[0].wtype == QTYPE_Q4_K && s[1].wtype == QTYPE_Q6_K) return mvp_run<QTYPE_Q4_K, QTYPE_Q6_K>(c, s, k, xq, e);
    if (s[0].wtype == QTYPE_Q5_K && s[1].wtype == QTYPE_Q6_K) return mvp_run<QTYPE_Q5_K, QTYPE_Q6_K>(c, s, k, xq, e);
    return err_setf(e, ERR_UNSUPPORTED, "cuda_matvec_pair: no kernel for %s then %s (cuda_matvec_pair_ok)",
                    mv_type_name(s[0].wtype), mv_type_name(s[1].wtype));
}

CUDA_TRACE_BIND(matvec)

/* cuda_internal: private to src/backend/cuda (.cu files only). The context
 * struct, the error helper, and the ggml block constants the kernels use.
 * Block layouts are ggml's (src/quant/quant_impl.h, byte-exact):
 *   Q8_0  34 B: f16 d, i8 qs[32]
 *   Q8_K 292 B: f32 d, i8 qs[256], i16 bsums[16]
 *   Q4_K 144 B: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *   Q6_K 210 B: u8 ql[128], u8 qh[64], i8 scales[16], f16 d */
#ifndef STRATA_CUDA_INTERNAL_H
#define STRATA_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "quant/qtype.h"
}

#define CQK_K 256
#define CQK8_0 32
#define CQ8_0_BYTES 34
#define CQ8_K_BYTES 292
#define CQ4_K_BYTES 144
#define CQ6_K_BYTES 210

struct cuda_ctx {
    cuda_info    info;
    cudaStream_t stream;
    cudaStream_t copy;       /* host -> device copies (cuda_copy_h2d) */
    cudaEvent_t  ev0, ev1;
    cudaEvent_t  ev_copy;    /* cuda_copy_fence: the copies so far */
    int          mv_force;   /* cuda_matvec_force: 0 by shape, 1 tile, 2 direct */
    int          pdl;        /* cuda_set_pdl: kernels launched as programmatic dependents */
    int          at_cluster; /* cuda_attention_force_cluster: cap on the attention's cluster, 0 none */
    int          at_heads;   /* cuda_attention_force_heads: query heads a CTA (1, 2, 4, 8), 0 the heuristic */
};

/* Record a failed CUDA call as ERR_INTERNAL ("what: cudaErrorX: text").
 * Returns 0 when rc is cudaSuccess. */
static inline int cuda_fail(err *e, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess) return 0;
    return err_setf(e, rc == cudaErrorMemoryAllocation ? ERR_NOMEM : ERR_INTERNAL, "cuda: %s: %s: %s", what,
                    cudaGetErrorName(rc), cudaGetErrorString(rc));
}

/* After a launch: the launch error (bad configuration, no kernel image). */
static inline int cuda_launch_check(err *e, const char *what)
{
    return cuda_fail(e, cudaGetLastError(), what);
}

/* ==== Programmatic dependent launch (Hopper) ====
 * A kernel launched by cuda_launch (or launch_clustered) may begin while
 * the kernel before it on the stream is still finishing: its CTAs are
 * scheduled once every CTA of the previous grid has passed pdl_enter, so
 * the launch latency and the previous grid's tail overlap. Contract for
 * every kernel of this folder: pdl_enter() is its first statement, before
 * any global memory access, L2 prefetches aside (k_rmsnorm_quant,
 * k_combine_rmsnorm_quant and k_attn prefetch their norm weights first).
 * Two exceptions: k_attn reads the position,
 * written two or more launches back, and issues L2 prefetches first;
 * k_matvec_direct, for a matrix chosen by its arguments alone (no ids) or
 * by ids written two or more launches back (cuda_matvec_args.ids_early),
 * loads the first rows of that matrix (its weights: written at load, or by
 * cuda_repack_q8_0, which ends with an empty launch for this) and
 * prefetches the rest into L2 first. Reading data written two
 * or more launches back before the wait is safe: this grid launched only
 * after every CTA of the previous grid had passed its own wait, so the
 * grid before that had completed and its writes were visible. A prefetch reads nothing
 * into the program, so it cannot observe a write it should have waited for.
 * griddepcontrol.wait returns once the previous grid has completed and its
 * writes are visible (transitively: that grid itself waited for its
 * predecessor before completing); launch_dependents then lets the next grid
 * start launching. Launched the ordinary way (or after a copy or an event
 * wait) both are no-ops. */
__device__ __forceinline__ void pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launch fn<<<grid, block, smem, c->stream>>>(args...) as a programmatic
 * dependent of the stream's previous kernel when c->pdl, then check the
 * launch (cuda_launch_check). */
template <typename... KArgs, typename... Args>
static inline int cuda_launch(cuda_ctx *c, void (*fn)(KArgs...), dim3 grid, dim3 block, size_t smem, err *e,
                              const char *what, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    const cudaError_t rc = cudaLaunchKernelEx(&cfg, fn, ((KArgs)args)...);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(e, rc, what);
    }
    return cuda_launch_check(e, what);
}

/* Defined in cuda_matvec.cu: raise the dynamic shared-memory limit of the
 * matvec kernels once per context (called by cuda_open). */
int cuda_matvec_init(cuda_ctx *c, err *e);

#endif

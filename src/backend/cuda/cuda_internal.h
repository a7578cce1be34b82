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
    int          at_one_row; /* cuda_attention_force_one_row: cuda_attention_rows by one-row launches */
    /* the chain trace (cuda_trace_begin; builds with STRATA_CUDA_TRACE) */
    struct cuda_trace_buf *tr_dev;   /* device records, NULL when off */
    int          tr_cap;     /* records (and launch names) it holds */
    const char **tr_names;   /* host: the `what` of each launch since begin */
    int          tr_nn;      /* names recorded (may exceed tr_cap: counted) */
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

/* ==== The chain trace (bench/cuda/trace.sh) ====
 * Built only with -DSTRATA_CUDA_TRACE (make cuda CUDA_TRACE=1); the
 * release build's pdl_enter has no trace code. In a trace build the first
 * thread of CTA (0, 0, 0) of every kernel reads %globaltimer when it
 * enters pdl_enter and when its griddepcontrol.wait returns, then takes
 * the next record by an atomic increment. The records are in launch order:
 * CTA 0 of kernel n + 1 passes its wait only after kernel n has completed,
 * CTA 0 of kernel n included. So t_wait[n + 1] - t_wait[n] is kernel n's
 * share of the dependent chain as it runs (overlap included, nothing left
 * out), and t_wait[n] - t_enter[n] how long CTA 0 waited resident for its
 * predecessor (its early-start window). Without -rdc every .cu file has
 * its own copy of the device pointer ct_buf: each binds it by its
 * CUDA_TRACE_BIND function, all called by cuda_trace_begin/end. */
struct cuda_trace_rec { unsigned long long t_enter, t_wait; };
struct cuda_trace_buf {
    unsigned int seq, cap;   /* records taken (may pass cap: counted), room */
    unsigned int pad[2];
    struct cuda_trace_rec rec[1];   /* [cap] */
};
#ifdef STRATA_CUDA_TRACE
static __device__ struct cuda_trace_buf *ct_buf;   /* one per .cu file */
#define CUDA_TRACE_BIND(tu) \
    extern "C" int cuda_trace_bind_##tu(void *p) { return cudaMemcpyToSymbol(ct_buf, &p, sizeof p) != cudaSuccess; }
/* a stamp the compiler keeps in place among the memory operations (the
 * chain trace's and cuda_layer.cu's attention probe's) */
__device__ __forceinline__ unsigned long long ct_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#else
#define CUDA_TRACE_BIND(tu)
#endif

/* ==== Programmatic dependent launch (Hopper) ====
 * A kernel launched by cuda_launch (or launch_clustered) may begin while
 * the kernel before it on the stream is still finishing: its CTAs are
 * scheduled once every CTA of the previous grid has passed pdl_enter (or
 * exited: k_attn waits by pdl_wait, below), so the launch latency and the
 * previous grid's tail overlap. Contract for every kernel of this folder:
 * pdl_enter() (k_attn: pdl_wait()) is its first statement, before
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
/* pdl_wait: griddepcontrol.wait alone (and the trace's stamps), without
 * launch_dependents: the next grid then launches only as this grid's CTAs
 * exit. k_attn waits so: its successor, the Wo matvec quantizing the
 * attention's output itself, streams its weights before its own wait, and
 * resident beside the attention (launched at its start) or beside its
 * cluster merge (launched before it) it made the token 0.978x / 0.982x
 * slower; launched at the exit, 1.006x faster than with a quantizer
 * launch between the two (bench/RESULTS.md, session 19). */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef STRATA_CUDA_TRACE
    const unsigned long long t0 = ct_now();
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef STRATA_CUDA_TRACE
    const unsigned long long t1 = ct_now();
    if (ct_buf && (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0) {
        const unsigned int n = atomicAdd(&ct_buf->seq, 1u);
        if (n < ct_buf->cap) { ct_buf->rec[n].t_enter = t0; ct_buf->rec[n].t_wait = t1; }
    }
#endif
#endif
}
__device__ __forceinline__ void pdl_enter()
{
    pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* A launch's name into the trace's list (cuda_trace_begin), in launch
 * order; the host side of the records above. */
static inline void cuda_trace_name(cuda_ctx *c, const char *what)
{
    if (!c->tr_dev) return;
    if (c->tr_nn < c->tr_cap) c->tr_names[c->tr_nn] = what;
    c->tr_nn++;
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
    cuda_trace_name(c, what);
    const cudaError_t rc = cudaLaunchKernelEx(&cfg, fn, ((KArgs)args)...);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(e, rc, what);
    }
    return cuda_launch_check(e, what);
}

/* ==== cp.async (sm_80+) ==== 16-byte global -> shared copies that hold no
 * registers; commit closes a group, wait_all waits for every group. */
__device__ __forceinline__ void cp_async16(void *s, const void *g)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* Copy g[0..n) to s[shift .. shift + n), shift = g mod 16 (s 16-aligned),
 * so 16-byte chunks of global memory land 16-aligned in shared memory.
 * Only bytes of [g, g + n) are read. The CTA's threads share the work. */
__device__ __forceinline__ int stage_tile(uint8_t *s, const uint8_t *g, size_t n)
{
    const uintptr_t ga = (uintptr_t)g;
    const int shift = (int)(ga & 15);
    const uintptr_t a0 = (ga + 15) & ~(uintptr_t)15, a1 = (ga + n) & ~(uintptr_t)15;
    const unsigned tid = threadIdx.x;
    if (a1 > a0) {
        const size_t nch = (a1 - a0) / 16;
        const uint8_t *gs = g + (a0 - ga);
        uint8_t *ss = s + shift + (a0 - ga);
        for (size_t i = tid; i < nch; i += blockDim.x) cp_async16(ss + 16 * i, gs + 16 * i);
        const unsigned nh = (unsigned)(a0 - ga), nt = (unsigned)(ga + n - a1);
        if (tid < nh) s[shift + tid] = g[tid];
        else if (tid >= 32 && tid - 32 < nt) s[shift + (a1 - ga) + (tid - 32)] = g[(a1 - ga) + (tid - 32)];
    } else {
        for (size_t i = tid; i < n; i += blockDim.x) s[shift + i] = g[i];
    }
    cp_async_commit();
    return shift;
}

/* Defined in cuda_matvec.cu: raise the dynamic shared-memory limit of the
 * matvec kernels once per context (called by cuda_open). */
int cuda_matvec_init(cuda_ctx *c, err *e);

/* Defined in cuda_mmq.cu: cuda_matmul's tensor-core kernels for Q4_K, Q5_K,
 * Q6_K and split Q8_0 rows, bit for bit the direct kernel's outputs for the same lg_s (its
 * lanes a row, mvd_geometry). cuda_mmq_ok: the launch can take it (type,
 * lg_s, alignment, shared memory, an sm_80+ device); cuda_mmq_run
 * enqueues it; cuda_mmq_init raises its shared-memory limit (from
 * cuda_matvec_init). */
int cuda_mmq_init(cuda_ctx *c, err *e);
int cuda_mmq_ok(const cuda_ctx *c, const cuda_matmul_args *a, int lg_s);
int cuda_mmq_run(cuda_ctx *c, const cuda_matmul_args *a, int lg_s, err *e);

/* Defined in cuda_layer.cu: raise k_attn_rows' dynamic shared-memory
 * limit once per context (called by cuda_open). */
int cuda_attention_init(cuda_ctx *c, err *e);

#endif

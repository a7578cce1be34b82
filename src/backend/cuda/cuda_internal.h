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

/* Defined in cuda_matvec.cu: raise the dynamic shared-memory limit of the
 * matvec kernels once per context (called by cuda_open). */
int cuda_matvec_init(cuda_ctx *c, err *e);

#endif

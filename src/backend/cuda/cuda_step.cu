/* cuda_step.cu: the per-step bookkeeping of graph-replayed rows
 * (cuda_backend.h, cuda_step_advance, cuda_step_next). */
#include "backend/cuda/cuda_internal.h"

__global__ void k_step_advance(int32_t *tok_slot, int32_t *pos_slot, int32_t *tok_hist)
{
    pdl_enter();
    const int32_t p = *pos_slot;
    tok_hist[p + 1] = *tok_slot;
    *pos_slot = p + 1;
}

extern "C" int cuda_step_advance(cuda_ctx *c, int32_t *tok_slot, int32_t *pos_slot, int32_t *tok_hist, err *e)
{
    return cuda_launch(c, k_step_advance, 1, 1, 0, e, "step advance", tok_slot, pos_slot, tok_hist);
}

__global__ void k_step_next(int32_t *tok_slot, int32_t *pos_slot, const int32_t *tok_hist)
{
    pdl_enter();
    const int32_t p = *pos_slot + 1;
    *pos_slot = p;
    *tok_slot = tok_hist[p];
}

extern "C" int cuda_step_next(cuda_ctx *c, int32_t *tok_slot, int32_t *pos_slot, const int32_t *tok_hist, err *e)
{
    return cuda_launch(c, k_step_next, 1, 1, 0, e, "step next", tok_slot, pos_slot, tok_hist);
}

CUDA_TRACE_BIND(step)

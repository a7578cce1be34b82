/* cuda_iface: the CUDA backend as the engine sees it (backend/backend.h):
 * the table of cuda_model functions that build/cuda/strata passes in
 * engine_opts.backend. */
#include "backend/cuda/cuda_iface.h"

#include <stdio.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_model.h"

static int be_open(backend_model **out, const hparams *hp, const weights *w, int n_ctx, int kv_f16,
                   uint64_t arena_bytes, err *e)
{
    const cuda_model_opts o = { .device = 0, .n_ctx = n_ctx, .kv_f16 = kv_f16, .arena_bytes = arena_bytes };
    cuda_model *m = NULL;
    const int rc = cuda_model_open(&m, hp, w, &o, e);
    *out = (backend_model *)m;
    return rc;
}

static int be_eval(backend_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e)
{
    return cuda_model_eval((cuda_model *)m, ids, n, pos0, logits, e);
}

static void be_close(backend_model *m) { cuda_model_close((cuda_model *)m); }

static void be_describe(const backend_model *m, char *buf, size_t cap)
{
    const cuda_model *cm = (const cuda_model *)m;
    cuda_arena_stats st;
    cuda_model_arena_stats(cm, &st);
    if (st.n_slots)
        snprintf(buf, cap, "%s, %.2f GB of VRAM (weights, expert arena of %d experts, KV cache, scratch)",
                 cuda_model_device_name(cm), (double)cuda_model_vram_bytes(cm) / 1e9, st.n_slots);
    else
        snprintf(buf, cap, "%s, %.2f GB of VRAM (weights, KV cache, scratch)", cuda_model_device_name(cm),
                 (double)cuda_model_vram_bytes(cm) / 1e9);
}

static const backend_iface k_cuda = { "CUDA", be_open, be_eval, be_close, be_describe };

const backend_iface *cuda_backend_iface(void) { return &k_cuda; }

/* cuda_iface: the CUDA backend as the engine sees it (backend/backend.h):
 * the table of cuda_model functions that build/cuda/strata passes in
 * engine_opts.backend. */
#include "backend/cuda/cuda_iface.h"

#include <stdio.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_model.h"

static int be_open(backend_model **out, const hparams *hp, const weights *w, const backend_open_opts *bo, err *e)
{
    const cuda_model_opts o = {
        .device = 0, .n_ctx = bo->n_ctx, .kv_f16 = bo->kv_f16, .arena_bytes = bo->arena_bytes,
        .read_ahead = bo->read_ahead, .host = bo->host, .host_mem = bo->host_mem, .host_mem_bytes = bo->host_mem_bytes,
    };
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
        snprintf(buf, cap, "%s, %.2f GB of VRAM (weights, expert arena of %d experts, KV cache, scratch); misses "
                 "copied from %s memory", cuda_model_device_name(cm), (double)cuda_model_vram_bytes(cm) / 1e9,
                 st.n_slots, st.pinned_bytes ? "page-locked" : "pageable");
    else
        snprintf(buf, cap, "%s, %.2f GB of VRAM (weights, KV cache, scratch)", cuda_model_device_name(cm),
                 (double)cuda_model_vram_bytes(cm) / 1e9);
}

static void be_stats(const backend_model *m, backend_stats *out)
{
    cuda_arena_stats st;
    cuda_model_arena_stats((const cuda_model *)m, &st);
    *out = (backend_stats){
        .n_slots = st.n_slots, .hits = st.hits, .misses = st.misses, .bytes_h2d = st.bytes_h2d,
        .prefetched = st.prefetched, .prefetch_used = st.prefetch_used, .pinned_bytes = st.pinned_bytes,
    };
}

static const backend_iface k_cuda = { "CUDA", be_open, be_eval, be_close, be_describe, be_stats };

const backend_iface *cuda_backend_iface(void) { return &k_cuda; }

/* expert_src: the all-resident implementation. Expert e of a 3-D tensor is
 * the contiguous slab at data + e * nb[2], nb[2] = ne[1] * row_bytes (GGUF
 * stores experts as stacked per-expert matrices). Nothing to load or pin. */
#include "model/expert_src.h"

#include <stdlib.h>

typedef struct mmap_src {
    expert_src     base;   /* first member */
    const weights *w;      /* borrowed */
} mmap_src;

static const void *mmap_get(expert_src *s, int layer, int expert, int which)
{
    const layer_weights *lw = &((mmap_src *)s)->w->layers[layer];
    const wtensor *t = which == EXPERT_GATE ? &lw->gate_exps : which == EXPERT_UP ? &lw->up_exps : &lw->down_exps;
    return t->data + (uint64_t)expert * (uint64_t)t->ne[1] * t->row_bytes;
}

static void mmap_close(expert_src *s)
{
    free(s);
}

static const expert_src_vtable k_mmap_vt = {
    .get = mmap_get,
    .close = mmap_close,
};

int expert_src_open_mmap(expert_src **out, const weights *w, err *e)
{
    *out = NULL;
    if (!w->map) return err_setf(e, ERR_USAGE, "the experts are not mapped (weights opened without them)");
    mmap_src *m = calloc(1, sizeof *m);
    if (!m) return err_setf(e, ERR_NOMEM, "out of memory");
    m->base.vt = &k_mmap_vt;
    m->w = w;
    *out = &m->base;
    return 0;
}

/* expert_src: where the forward pass gets routed-expert weights from.
 *
 * Every access to ffn_{gate,up,down}_exps goes through this interface, so
 * the all-resident mode (pointers into the mapped GGUF, expert_src_open_mmap)
 * and a streaming store (experts read from disk into a fixed arena) are
 * interchangeable without touching the forward.
 *
 * Protocol, per layer of a chunk:
 *   expert_src_begin_layer(s, layer, experts, n)   the distinct experts the
 *       chunk routes to in this layer (ascending ids); a store makes them
 *       resident (and pins them) before it returns
 *   expert_src_get(s, layer, expert, which)        any number of times, from
 *       any thread, for experts of that set
 *   expert_src_end_layer(s, layer)                 unpins; pointers from get
 *       are invalid afterwards
 * The mmap implementation ignores begin/end and never fails.
 *
 * get() returns expert `expert`'s contiguous slab of the chosen tensor:
 * EXPERT_GATE / EXPERT_UP: n_ff_exp rows of row_bytes(n_embd), i.e.
 * (n_ff_exp, n_embd); EXPERT_DOWN: n_embd rows of row_bytes(n_ff_exp), i.e.
 * (n_embd, n_ff_exp). Types and row sizes are those of the layer's wtensor
 * in weights.h. */
#ifndef STRATA_EXPERT_SRC_H
#define STRATA_EXPERT_SRC_H

#include <stdint.h>

#include "model/weights.h"
#include "util/err.h"

enum expert_part { EXPERT_GATE = 0, EXPERT_UP = 1, EXPERT_DOWN = 2 };

typedef struct expert_src expert_src;

/* The implementation interface: a store fills a vtable and embeds
 * `expert_src` as its first member. */
typedef struct expert_src_vtable {
    int         (*begin_layer)(expert_src *s, int layer, const int32_t *experts, int n, err *e);
    const void *(*get)(expert_src *s, int layer, int expert, int which);
    void        (*end_layer)(expert_src *s, int layer);
    void        (*close)(expert_src *s);
} expert_src_vtable;

struct expert_src {
    const expert_src_vtable *vt;
};

/* All-resident source: pointers into w's mapping (w must outlive it). */
int  expert_src_open_mmap(expert_src **out, const weights *w, err *e);

static inline int expert_src_begin_layer(expert_src *s, int layer, const int32_t *experts, int n, err *e)
{
    return s->vt->begin_layer ? s->vt->begin_layer(s, layer, experts, n, e) : 0;
}
/* Thread-safe between begin_layer and end_layer. Never NULL for an expert of
 * the begun set. */
static inline const void *expert_src_get(expert_src *s, int layer, int expert, int which)
{
    return s->vt->get(s, layer, expert, which);
}
static inline void expert_src_end_layer(expert_src *s, int layer)
{
    if (s->vt->end_layer) s->vt->end_layer(s, layer);
}
static inline void expert_src_close(expert_src *s)   /* NULL is a no-op */
{
    if (s) s->vt->close(s);
}

#endif

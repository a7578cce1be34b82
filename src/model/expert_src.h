/* expert_src: where the forward pass gets routed-expert weights from.
 *
 * Every access to ffn_{gate,up,down}_exps goes through this interface, so
 * the all-resident mode (pointers into the mapped GGUF, expert_src_open_mmap)
 * and a streaming store (experts read from disk into a fixed arena) are
 * interchangeable without touching the forward.
 *
 * Protocol, per layer of a chunk (qwen3moe.c's moe()):
 *   k = expert_src_begin_layer(s, layer, experts, n)   the distinct experts
 *       the chunk routes to in this layer. The source pins what it has,
 *       starts reading the rest and returns k >= 1: experts[0..k) is the
 *       wave to compute now (the source may reorder experts[0..n), e.g.
 *       resident ones first). k < n only when the set does not fit in the
 *       source's memory; the caller then computes the wave, ends the layer
 *       and calls begin_layer(layer, experts + k, n - k) for the rest.
 *       Negative: an error (the set is not pinned).
 *   expert_src_prefetch(s, layer + 1, guess, m)    optional, any time before
 *       the next layer begins: a guess at the next layer's experts, most
 *       wanted first; it costs reads, never correctness, and never waits.
 *   expert_src_wait_layer(s, layer)               blocks until the wave is
 *       resident; an I/O error ends the wave (nothing stays pinned) and is
 *       returned with a message naming the layer, expert and file offset.
 *   expert_src_wait_expert(s, layer, i)           instead of wait_layer: blocks
 *       until experts[i] of the wave is resident, so the caller can compute
 *       the wave's experts in order while the later ones are still being
 *       read (begin_layer queues the reads in wave order). Thread-safe; any
 *       number of calls per expert. An I/O error is returned (naming layer,
 *       expert and offset) but the wave stays pinned: the caller stops using
 *       the wave and calls end_layer, which unpins it.
 *   expert_src_get(s, layer, expert, which)        any number of times, from
 *       any thread, for experts of the wave
 *   expert_src_end_layer(s, layer)                 unpins; pointers from get
 *       are invalid afterwards
 * The mmap implementation returns k = n, ignores the rest and never fails.
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
    int         (*begin_layer)(expert_src *s, int layer, int32_t *experts, int n, err *e);
    int         (*wait_layer)(expert_src *s, int layer, err *e);                      /* optional */
    int         (*wait_expert)(expert_src *s, int layer, int i, err *e);              /* optional */
    void        (*prefetch)(expert_src *s, int layer, const int32_t *experts, int n); /* optional */
    const void *(*get)(expert_src *s, int layer, int expert, int which);
    void        (*end_layer)(expert_src *s, int layer);                               /* optional */
    void        (*resident_mask)(expert_src *s, int layer, uint8_t *mask);            /* optional */
    void        (*close)(expert_src *s);
} expert_src_vtable;

struct expert_src {
    const expert_src_vtable *vt;
};

/* All-resident source: pointers into w's mapping (w must outlive it). */
int  expert_src_open_mmap(expert_src **out, const weights *w, err *e);

/* Returns the wave size k (1..n) or a negative ERR_*; see the protocol. */
static inline int expert_src_begin_layer(expert_src *s, int layer, int32_t *experts, int n, err *e)
{
    return s->vt->begin_layer ? s->vt->begin_layer(s, layer, experts, n, e) : n;
}
static inline int expert_src_wait_layer(expert_src *s, int layer, err *e)
{
    return s->vt->wait_layer ? s->vt->wait_layer(s, layer, e) : 0;
}
static inline int expert_src_can_wait_expert(const expert_src *s) { return s->vt->wait_expert != NULL; }
/* i: index into the wave returned by begin_layer. Without a wait_expert
 * the source's experts are resident once begin_layer returns. */
static inline int expert_src_wait_expert(expert_src *s, int layer, int i, err *e)
{
    return s->vt->wait_expert ? s->vt->wait_expert(s, layer, i, e) : 0;
}
static inline void expert_src_prefetch(expert_src *s, int layer, const int32_t *experts, int n)
{
    if (s->vt->prefetch) s->vt->prefetch(s, layer, experts, n);
}
static inline int expert_src_can_prefetch(const expert_src *s) { return s->vt->prefetch != NULL; }
/* Thread-safe between wait_layer and end_layer. Never NULL for an expert of
 * the wave. */
static inline const void *expert_src_get(expert_src *s, int layer, int expert, int which)
{
    return s->vt->get(s, layer, expert, which);
}
static inline void expert_src_end_layer(expert_src *s, int layer)
{
    if (s->vt->end_layer) s->vt->end_layer(s, layer);
}
/* mask[e] (n_expert bytes) = 1 if expert e of `layer` is in memory or on its
 * way (always 1 for the mmap source). For residency-aware routing. */
static inline void expert_src_resident_mask(expert_src *s, int layer, uint8_t *mask, int n_expert)
{
    if (s->vt->resident_mask) { s->vt->resident_mask(s, layer, mask); return; }
    for (int i = 0; i < n_expert; i++) mask[i] = 1;
}
static inline void expert_src_close(expert_src *s)   /* NULL is a no-op */
{
    if (s) s->vt->close(s);
}

#endif

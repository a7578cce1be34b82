/* session: one timeline of an engine: its KV cache, its forward scratch and
 * the count of cached positions. The public functions (session_create,
 * session_eval, ...) are declared in engine.h and defined in session.c.
 *
 * Allocation points (the only ones): session_create allocates the KV cache
 * (n_layer x 2 x n_ctx x n_head_kv*head_dim elements of the chosen types)
 * and the forward scratch (qwen3moe_scratch_open, sized for n_batch rows,
 * n_ctx positions and the pool's threads). session_eval, the decode loop,
 * allocates nothing.
 *
 * This header is the contract between engine.c and session.c: what a
 * session needs from its engine. */
#ifndef STRATA_SESSION_H
#define STRATA_SESSION_H

#include <stdint.h>

#include "engine.h"
#include "expert/xstore.h"
#include "model/qwen3moe.h"
#include "model/weights.h"

typedef struct session_env {
    qwen3moe       model;     /* forward inputs (borrowed from the engine) */
    const weights *w;         /* for the file-changed check */
    xstore        *store;     /* the expert store when streaming, else NULL (chunk counters) */
    int            n_ctx;
    int            n_batch;
    int            k_f16, v_f16;
    int32_t        n_vocab;
    const struct backend_iface *be;   /* device backend (backend/backend.h) or NULL: */
    struct backend_model       *bm;   /* then every forward runs there, see engine_opts */
} session_env;

/* Defined in engine.c: the engine's environment for its sessions (borrowed;
 * valid until engine_close). */
const session_env *engine_session_env(const engine *eng);
/* Defined in engine.c: a session takes (+1) or gives back (-1) the device
 * timeline of an engine with a backend; ERR_USAGE when it is taken. */
int engine_backend_claim(engine *eng, int delta, err *e);

#endif

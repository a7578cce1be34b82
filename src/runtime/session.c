/* session: see session.h. A session owns its KV cache and scratch; the
 * engine it was created from must outlive it. Evaluation splits the tokens
 * into chunks of at most n_batch rows and runs the forward on each; only the
 * chunks whose logits are wanted run the head. */
#include "runtime/session.h"

#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

struct session {
    engine            *eng;     /* borrowed: the device timeline's owner */
    const session_env *env;     /* borrowed from the engine */
    int                on_device; /* env->be: the KV cache lives in the backend */
    int                n_past;
    kv_cache_view      kv;      /* k/v arrays and their buffers are owned */
    qwen3moe_scratch  *scratch; /* owned */
    uint64_t           kv_bytes;
};

int session_create(session **out, engine *eng, err *e)
{
    *out = NULL;
    const session_env *env = engine_session_env(eng);
    const hparams *hp = env->model.hp;
    session *s = calloc(1, sizeof *s);
    if (!s) return err_setf(e, ERR_NOMEM, "out of memory");
    s->eng = eng;
    s->env = env;
    if (env->be) {   /* the backend holds the KV cache and the scratch */
        int rc = engine_backend_claim(eng, +1, e);
        if (rc) { free(s); return rc; }
        s->on_device = 1;
        *out = s;
        return 0;
    }
    s->kv.n_ctx = env->n_ctx;
    s->kv.k_f16 = env->k_f16;
    s->kv.v_f16 = env->v_f16;
    s->kv.k = calloc((size_t)hp->n_layer, sizeof *s->kv.k);
    s->kv.v = calloc((size_t)hp->n_layer, sizeof *s->kv.v);
    int rc = 0;
    if (!s->kv.k || !s->kv.v) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
    const size_t row = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    const size_t kb = (size_t)env->n_ctx * row * (env->k_f16 ? 2 : 4);
    const size_t vb = (size_t)env->n_ctx * row * (env->v_f16 ? 2 : 4);
    for (int l = 0; l < hp->n_layer; l++) {
        s->kv.k[l] = malloc(kb);
        s->kv.v[l] = malloc(vb);
        if (!s->kv.k[l] || !s->kv.v[l]) {
            rc = err_setf(e, ERR_NOMEM, "cannot allocate the KV cache (%.1f MB for %d positions)",
                          (double)(kb + vb) * hp->n_layer / 1e6, env->n_ctx);
            goto fail;
        }
        s->kv_bytes += kb + vb;
    }
    if ((rc = qwen3moe_scratch_open(&s->scratch, &env->model, env->n_batch, env->n_ctx, e))) goto fail;
    *out = s;
    return 0;
fail:
    session_free(s);
    return rc;
}

void session_free(session *s)
{
    if (!s) return;
    if (s->on_device) engine_backend_claim(s->eng, -1, NULL);
    const int L = s->env->model.hp->n_layer;
    for (int l = 0; l < L; l++) {
        if (s->kv.k) free(s->kv.k[l]);
        if (s->kv.v) free(s->kv.v[l]);
    }
    free(s->kv.k);
    free(s->kv.v);
    qwen3moe_scratch_close(s->scratch);
    free(s);
}

int session_n_past(const session *s) { return s->n_past; }

void session_truncate(session *s, int n_keep)
{
    if (n_keep < 0) n_keep = 0;
    if (n_keep < s->n_past) s->n_past = n_keep;
}

void session_stats_get(const session *s, int phase, session_stats *out)
{
    qwen3moe_stats st;
    memset(&st, 0, sizeof st);
    if (s->scratch) qwen3moe_scratch_stats(s->scratch, phase, &st);
    out->chunks = st.chunks;
    out->rows = st.rows;
    out->moe_layers = st.moe_layers;
    out->expert_slots = st.expert_slots;
    out->expert_lookups = st.expert_lookups;
    out->expert_lookups_uniform = st.expert_lookups_uniform;
    out->expert_bytes = st.expert_bytes;
    out->dense_bytes = st.dense_bytes;
    out->expert_ms = st.expert_ms;
}

uint64_t session_bytes(const session *s)
{
    return s->kv_bytes + (s->scratch ? qwen3moe_scratch_bytes(s->scratch) : 0);
}

int session_eval(session *s, const int32_t *ids, int n, float *logits_out, float *all_logits, err *e)
{
    const session_env *env = s->env;
    if (n <= 0) return err_setf(e, ERR_USAGE, "session_eval: no tokens");
    if (n > env->n_ctx - s->n_past)
        return err_setf(e, ERR_RANGE, "context full: %d cached + %d new tokens > context size %d",
                        s->n_past, n, env->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= env->n_vocab)
            return err_setf(e, ERR_RANGE, "token id %d (at index %d) out of range [0, %d)", ids[i], i, env->n_vocab);
    int rc = weights_check_file(env->w, e);
    if (rc) return rc;
    if (s->on_device) {
        if (all_logits)
            return err_setf(e, ERR_UNSUPPORTED, "logits of every row (tfdump, perplexity) are not available "
                            "on the %s backend yet", env->be->name);
        /* the host tier under the device arena (--host-cache) counts per
         * phase: the whole evaluation is one chunk of it */
        if (env->store) xstore_chunk_begin_at(env->store, n > 1 ? XSTORE_PROMPT : XSTORE_DECODE, 0, n);
        rc = env->be->eval(env->bm, ids, n, s->n_past, logits_out, e);
        if (env->store) xstore_chunk_end(env->store);
        if (rc) return rc;
        s->n_past += n;
        return 0;
    }

    const size_t V = (size_t)env->n_vocab;
    /* several tokens are a prompt, one is a decode step (stream counters) */
    const int phase = n > 1 ? XSTORE_PROMPT : XSTORE_DECODE;
    int pos = s->n_past;
    for (int off = 0; off < n; off += env->n_batch) {
        const int nb = n - off < env->n_batch ? n - off : env->n_batch;
        const int last = off + nb == n;
        int n_out = 0;
        float *dst = NULL;
        if (all_logits) { n_out = nb; dst = all_logits + (size_t)off * V; }
        else if (logits_out && last) { n_out = 1; dst = logits_out; }
        const qwen3moe_chunk ck = { phase, off / env->n_batch, n - off - nb };
        qwen3moe_scratch_set_chunk(s->scratch, &ck);
        /* the chunk's index gives the store its routing arm (per-arm counters) */
        if (env->store) xstore_chunk_begin_at(env->store, phase, ck.index, nb);
        rc = qwen3moe_forward(&env->model, &s->kv, s->scratch, ids + off, nb, pos, n_out, dst, e);
        if (env->store) xstore_chunk_end(env->store);
        if (rc) return rc;   /* n_past unchanged: the partial chunks are simply not counted */
        pos += nb;
    }
    if (all_logits && logits_out) memcpy(logits_out, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
    s->n_past = pos;
    return 0;
}

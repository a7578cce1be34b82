/* cuda_model: the qwen3moe decode forward on the GPU, every weight resident
 * in VRAM (see cuda_model.h for the contract, model/qwen3moe.h for the math).
 *
 * Plain C host code: it only enqueues kernels of cuda_backend.h on the
 * context's one stream, in the order model/qwen3moe.c computes, and never
 * waits for them except where the caller asks for something on the host
 * (logits, greedy ids, layer outputs) or hands it something (the prompt ids:
 * one synchronous upload per cuda_model_eval call).
 *
 * VRAM layout, all allocated at open (nothing is allocated per token):
 *   weights  one allocation holding every tensor at a 256-byte aligned
 *            offset (the matvec wants 16-byte aligned Q4_K rows), uploaded
 *            once from the WEIGHTS_MAP_ALL mapping; a tied head shares
 *            token_embd's copy; norms are the f32 vectors of weights.h;
 *   kv       n_layer x (K, V) caches of (n_ctx, n_head_kv*head_dim) f16/f32;
 *   scratch  the buffers of one row (below), the token id of every position
 *            (tok[p], n_ctx + 1 entries: greedy's argmax of position p is
 *            written to tok[p + 1], where the next step's get_rows reads
 *            it) and the constant array pos[p] = p, so a step's position is
 *            a device pointer (pos + p) and no step uploads anything;
 *            and two slots, the current token and position (step[0],
 *            step[1]), that a graph-replayed greedy step reads instead.
 *
 * Activation rows: each matvec input is quantized by cuda_act_quant to the
 * weight's dot type into the one buffer xq, right before its matvec (or in
 * the launch of the op that makes it: the norm's, cuda_rmsnorm_quant, or
 * for a layer's attention input and the head's the previous combine's,
 * cuda_moe_combine_rmsnorm_quant); the stream runs in call order, so
 * reusing xq for the next tensor is safe. Two inputs are never written
 * quantized where the dot type is Q8_K or Q8_0: Wo's (the attention's
 * output) and the down projection's (swiglu(g, u)); their matvecs read the
 * float rows and each CTA quantizes them itself, bit for bit
 * (cuda_matvec_args.xquant: two dependent launches a layer fewer).
 * An F32 weight's dot type is F32: its input is the float row itself, as on
 * the CPU (no copy).
 *
 * Rows are evaluated one at a time. For a prompt of n rows the last layer's
 * attention and MoE (which only feed logits) run only for the last row, as
 * the CPU does with n_out = 1; every row's K/V goes to the cache.
 *
 * Rows replay captured CUDA graphs (captured at first use, kept until
 * close), one replay per row: a prompt row without logits, a row with
 * logits, a greedy step. Each reads its token and position from the
 * device slots step[0..1]; the prompt-row graph ends with
 * cuda_step_next (the next row's slots from tok[]), the greedy one with
 * the argmax to step[0] and cuda_step_advance (tok[pos + 1] = it, pos +=
 * 1), so one graph serves every row and position of a context bucket:
 * the attention's launch shape follows the context
 * (cuda_attention_bucket), so each kind of graph is captured once per
 * bucket and a row replays the one of the bucket of its position + 1,
 * which the plain path and the prompt chunks pass too. The plain path (one
 * enqueued kernel at a time, pointers tok + p / pos + p) is kept as the
 * reference (cuda_model_set_graph(m, 0)) and records layer outputs. */
#include "backend/cuda/cuda_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "quant/qtype.h"

#define TRY(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

/* Most rows of a prompt chunk with an arena (each row's k experts must fit
 * in the arena at once: the chunk is also at most n_slots / k rows). */
#define CHUNK_MAX 256

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Bytes of the dense lists for nc rows (chunk_dense_items' layout). */
static size_t chunk_dense_bytes(int nc)
{
    const size_t n = (size_t)((nc + CUDA_MM_NB - 1) / CUDA_MM_NB) * CUDA_MM_NB;
    return align8(sizeof(int32_t) * n) + sizeof(int64_t) * (4 * n + CUDA_MM_NB) + sizeof(int32_t) * CUDA_MM_NB;
}

/* Bytes of the expert item lists for `items` items: ids, then the gate/up
 * and down input rows, then (8-aligned) the gate/up and down offsets. */
static size_t chunk_item_bytes(size_t items)
{
    return align8(sizeof(int32_t) * (items + 2 * items * CUDA_MM_NB)) + sizeof(int64_t) * 2 * items * CUDA_MM_NB;
}

/* ==== Types ==== */

/* A weight matrix (or a stack of expert matrices) in VRAM. */
typedef struct dmat {
    const uint8_t *d;        /* device */
    int      type;           /* ggml type id */
    int      mvtype;         /* the matvec's wtype: type, or CUDA_Q8_0_SPLIT once repacked */
    int64_t  rows, k;        /* one matrix: rows of k weights */
    size_t   row_bytes;
    size_t   stride;         /* bytes from matrix m to m + 1 (experts) */
    size_t   act_bytes;      /* one input row in the dot type (cuda_act_bytes) */
    int      act_f32;        /* dot type F32: the input is the float row */
} dmat;

typedef struct dlayer {
    const float *attn_norm;  /* (n_embd) */
    dmat wq, wk, wv;         /* (n_head*head_dim | n_head_kv*head_dim, n_embd) */
    const float *q_norm;     /* (head_dim) */
    const float *k_norm;     /* (head_dim) */
    dmat wo;                 /* (n_embd, n_head*head_dim) */
    const float *ffn_norm;   /* (n_embd) */
    dmat gate_inp;           /* (n_expert, n_embd) router */
    dmat gate_exps, up_exps; /* (n_expert, n_ff_exp, n_embd) */
    dmat down_exps;          /* (n_expert, n_embd, n_ff_exp) */
    void *k_cache, *v_cache; /* (n_ctx, n_head_kv*head_dim), f16 or f32 */
} dlayer;

struct cuda_model {
    cuda_ctx *cu;            /* owned */
    hparams   hp;            /* a copy */
    int       n_ctx, kv_f16;
    dlayer   *layers;        /* owned: n_layer */
    dmat      tok_embd;      /* (n_vocab, n_embd) */
    dmat      output;        /* (n_vocab, n_embd); tok_embd's copy when tied */
    const float *output_norm;/* (n_embd) */
    uint8_t  *wpool;         /* device: every weight */
    uint8_t  *kvpool;        /* device: every cache */
    uint8_t  *spool;         /* device: scratch */
    uint64_t  wbytes, kvbytes, sbytes;
    /* scratch (device), one row */
    float    *x;             /* (n_embd) residual */
    float    *xn;            /* (n_embd) normed row */
    float    *q, *k, *v;     /* (n_head*head_dim), (n_head_kv*head_dim) x 2 */
    float    *att;           /* (n_head*head_dim) */
    uint8_t  *xq;            /* the widest quantized input (k rows for down) */
    float    *router;        /* (n_expert) logits */
    int32_t  *sel;           /* (n_expert_used) experts, top-k order */
    float    *selw;          /* (n_expert_used) their weights */
    float    *g, *u;         /* (n_expert_used, n_ff_exp) gate (then hidden), up */
    float    *eout;          /* (n_expert_used, n_embd) down outputs */
    float    *logits;        /* (n_vocab) */
    float    *layer_out;     /* (n_layer, n_embd) residual after each layer */
    int32_t  *layer_sel;     /* (n_layer, n_expert_used) experts chosen in each layer */
    int32_t  *tok;           /* (n_ctx + 1) token of each position */
    int32_t  *pos;           /* (n_ctx) pos[p] = p */
    int32_t  *step;          /* (2) graph steps: [0] token, [1] position */
    int       have_layer_out;
    int       use_graph;     /* rows replay graphs (default 1) */
    int       record;        /* eval records layer outputs (plain path) */
    /* per attention bucket (cuda_attention_bucket), NULL until first use: */
    cuda_graph *graph[CUDA_ATTN_BUCKETS];      /* one greedy step */
    cuda_graph *graph_row[CUDA_ATTN_BUCKETS];  /* one prompt row without logits, then step_next */
    cuda_graph *graph_head[CUDA_ATTN_BUCKETS]; /* one row with logits */
    /* the VRAM expert arena (opts.arena_bytes > 0); the layers' expert
     * dmats then point at the slot arrays, stride one slot */
    int       arena;
    const weights *w;        /* borrowed: the host copies misses come from */
    uint8_t  *apool;         /* device: gate, up and down slot arrays */
    uint64_t  abytes;
    size_t   *xbytes;        /* (n_layer, 3) one expert's gate, up, down bytes (host strides) */
    int32_t  *slot_of;       /* host (n_layer * n_expert): slot or -1 */
    int32_t  *slot_key;      /* host (n_slots): layer * n_expert + expert, or -1 */
    uint64_t *slot_used;     /* host (n_slots): tick of the last use */
    int32_t  *lru_prev, *lru_next;   /* host (n_slots): slots by last use, least recent at lru_head */
    int32_t   lru_head, lru_tail;
    uint64_t  tick;
    int32_t  *slot_ids;      /* device (n_expert_used): this layer's experts' slots */
    uint8_t  *slot_pf;       /* host (n_slots): filled by a prefetch, not looked up since */
    expert_src *host;        /* borrowed: the host tier, or NULL (copies from w's mapping) */
    const void *pinned;      /* the host memory as registered (cuda_host_register), or NULL */
    int       ra;            /* read-ahead: top-N of the next layer's router (0: off) */
    float    *pxn;           /* device (n_embd): the next layer's normed input (read-ahead) */
    float    *prouter;       /* device (n_expert): its router logits */
    int32_t  *psel;          /* device (ra): its top experts = sel + n_expert_used (one download) */
    float    *pselw;         /* device (ra): their weights (unused) */
    /* prompt chunks (chunk_rows): nc rows at a time */
    int       nc;            /* rows a chunk (CHUNK_MAX, with an arena at most n_slots / k); < 2: rows one by one */
    int       skip;          /* cuda_model_set_skip's stage (0: none) */
    int       nc_set;        /* cuda_model_set_chunk's cap (0: none) */
    size_t    nc_items;      /* most expert items of a chunk: nc * k */
    float    *cx, *cxn;      /* device (nc, n_embd): the chunk's residual rows, their norms */
    uint8_t  *cxq, *cxq2;    /* device: the rows quantized (the widest dot type), for up (cxq2) */
    float    *cqkv;          /* device: q (nc, n_head*head_dim), then k and v (nc, n_head_kv*head_dim) each */
    float    *catt;          /* device (nc, n_head * head_dim) */
    float    *crouter;       /* device (nc, n_expert) */
    int32_t  *csel;          /* device (nc, k) */
    float    *cselw;         /* device (nc, k) */
    float    *cg, *cup;      /* device (nc, k, n_ff_exp) gate (then hidden), up */
    uint8_t  *cxqd;          /* device (nc, k) down inputs */
    float    *ceout;         /* device (nc, k, n_embd) down outputs; (nc, n_embd) Wo outputs */
    uint8_t  *cdense, *hdense;   /* device / host: the dense item lists (chunk_dense_items) */
    const int32_t *cd_xrow, *cd_last;
    const int64_t *cd_yq, *cd_ykv, *cd_ye, *cd_yr, *cd_zero;
    int       cd_items;
    uint8_t  *citem;         /* device: the expert item lists (chunk_route) */
    int32_t  *hitem;         /* host: the same, built there (chunk_item_bytes(nc_items)) */
    const int32_t *ci_ids, *ci_xg, *ci_xd;
    const int64_t *ci_yg, *ci_yd;
    int       cx_items;
    int32_t  *hsel, *hslot, *hmiss;          /* host (nc * k) */
    int32_t  *hgrp, *hgmat, *hgcnt;          /* host: matrix -> group, group -> matrix, counts */
    int32_t   pf_ids[32];    /* host tier: layer l + 1's predicted experts, waiting for */
    int       pf_n;          /* arena_prefetch_host after layer l's kernels */
    uint64_t  pf_tick;       /* layer l's tick */
    int       host_open;     /* layer of the host tier's wave still open (copies in flight), or -1 */
    cuda_arena_stats ast;
};

/* ==== Open: carve, upload ==== */

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Carving a pool: the same walk runs twice, first with base == NULL to
 * count the bytes, then with the allocation to hand out pointers (and
 * upload each region's host source, if any). */
typedef struct carver {
    cuda_ctx *cu;
    uint8_t  *base;          /* NULL: counting */
    size_t    off;
    int       rc;            /* the first upload error */
    err      *e;
} carver;

static void *carve(carver *c, const void *src, size_t bytes)
{
    uint8_t *d = c->base ? c->base + c->off : NULL;
    c->off += align256(bytes);
    if (d && src && bytes && !c->rc) c->rc = cuda_upload(c->cu, d, src, bytes, c->e);
    return d;
}

/* Run walk(m, ctx, c) to count, allocate, run it again to place; *pool and
 * *bytes get the allocation. */
typedef void (*carve_fn)(cuda_model *m, const void *ctx, carver *c);

static int carve_pool(cuda_model *m, carve_fn walk, const void *ctx, const char *what, uint8_t **pool,
                      uint64_t *bytes, err *e)
{
    carver c = { m->cu, NULL, 0, 0, e };
    walk(m, ctx, &c);
    void *base = NULL;
    err sub;
    err_clear(&sub);
    if (cuda_alloc(m->cu, &base, c.off, &sub)) {
        const cuda_info *ci = cuda_get_info(m->cu);
        return err_setf(e, ERR_NOMEM, "cuda_model: %s need %llu bytes of VRAM (%s has %llu in all, "
                        "%llu held already): %s", what, (unsigned long long)c.off, ci->name,
                        (unsigned long long)ci->global_mem,
                        (unsigned long long)(m->wbytes + m->kvbytes + m->sbytes), sub.msg);
    }
    *pool = base;
    *bytes = c.off;
    c.base = base;
    c.off = 0;
    walk(m, ctx, &c);
    return c.rc;
}

/* A matrix of `t` for the GPU: shape, strides and kernel support. `name`
 * names it in errors. Rows of a stack: ne[1] per matrix, ne[2] matrices. */
static int dmat_init(dmat *d, const wtensor *t, const char *name, int layer, err *e)
{
    memset(d, 0, sizeof *d);
    d->type = d->mvtype = t->type;
    d->k = t->ne[0];
    d->rows = t->ne[1];
    d->row_bytes = (size_t)t->row_bytes;
    d->stride = d->row_bytes * (size_t)d->rows;
    const qtype_info *qi = qtype_get(t->type);
    d->act_f32 = qi && qi->dot_type == QTYPE_F32;
    d->act_bytes = cuda_act_bytes(t->type, d->k);
    if (!d->act_bytes) {
        if (layer >= 0)
            return err_setf(e, ERR_UNSUPPORTED, "cuda_model: tensor blk.%d.%s: type %s has no CUDA matvec",
                            layer, name, qtype_name(t->type));
        return err_setf(e, ERR_UNSUPPORTED, "cuda_model: tensor %s: type %s has no CUDA matvec", name,
                        qtype_name(t->type));
    }
    return 0;
}

static size_t dmat_bytes(const wtensor *t, int stacked)
{
    const int64_t n = stacked ? (t->ne[2] > 0 ? t->ne[2] : 1) : 1;
    return (size_t)t->row_bytes * (size_t)t->ne[1] * (size_t)n;
}

static int check_shape(const hparams *hp, const cuda_model_opts *o, err *e)
{
    if (o->n_ctx < 1) return err_setf(e, ERR_USAGE, "cuda_model: n_ctx %d < 1", o->n_ctx);
    if (hp->head_dim > 256)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_model: head_dim %d > 256 (attention kernel)", hp->head_dim);
    if (hp->n_expert > 1024 || hp->n_expert_used < 1 || hp->n_expert_used > 32 || hp->n_expert_used > hp->n_expert)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_model: %d of %d experts (router kernel: <= 32 of <= 1024)",
                        hp->n_expert_used, hp->n_expert);
    if (hp->n_head % hp->n_head_kv)
        return err_setf(e, ERR_FORMAT, "cuda_model: n_head %d not a multiple of n_head_kv %d", hp->n_head,
                        hp->n_head_kv);
    return 0;
}

/* A dense Q8_0 matrix that only the matvecs read (not the embedding,
 * which get_rows reads, nor a head tied to it), in rows of a multiple of
 * 256 weights: rewritten in place as split rows (cuda_repack_q8_0), its
 * matvecs then one 16-byte load an item instead of eight 2-byte ones.
 * Experts are never repacked: the arena's copies come raw from the host. */
static int repack_one(cuda_model *m, dmat *d, err *e)
{
    if (d->type != QTYPE_Q8_0 || d->k % 256) return 0;
    TRY(cuda_repack_q8_0(m->cu, (void *)d->d, d->rows, d->k, e));
    d->mvtype = CUDA_Q8_0_SPLIT;
    return 0;
}

static int repack_dense(cuda_model *m, const weights *w, err *e)
{
    for (int l = 0; l < m->hp.n_layer; l++) {
        dlayer *dl = &m->layers[l];
        TRY(repack_one(m, &dl->wq, e));
        TRY(repack_one(m, &dl->wk, e));
        TRY(repack_one(m, &dl->wv, e));
        TRY(repack_one(m, &dl->wo, e));
        TRY(repack_one(m, &dl->gate_inp, e));
    }
    if (w->output.data != w->tok_embd.data) TRY(repack_one(m, &m->output, e));
    return 0;
}

/* ---- the three pools ---- */

static void walk_weights(cuda_model *m, const void *ctx, carver *c)
{
    const weights *w = ctx;
    const size_t E = (size_t)m->hp.n_embd, D = (size_t)m->hp.head_dim;
    m->tok_embd.d = carve(c, w->tok_embd.data, dmat_bytes(&w->tok_embd, 0));
    /* a tied head (output.data == token_embd's) shares the embedding's copy */
    m->output.d = w->output.data == w->tok_embd.data ? m->tok_embd.d
                : carve(c, w->output.data, dmat_bytes(&w->output, 0));
    m->output_norm = carve(c, w->output_norm, sizeof(float) * E);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        dlayer *dl = &m->layers[l];
        dl->attn_norm = carve(c, lw->attn_norm, sizeof(float) * E);
        dl->q_norm = carve(c, lw->q_norm, sizeof(float) * D);
        dl->k_norm = carve(c, lw->k_norm, sizeof(float) * D);
        dl->ffn_norm = carve(c, lw->ffn_norm, sizeof(float) * E);
        dl->wq.d = carve(c, lw->wq.data, dmat_bytes(&lw->wq, 0));
        dl->wk.d = carve(c, lw->wk.data, dmat_bytes(&lw->wk, 0));
        dl->wv.d = carve(c, lw->wv.data, dmat_bytes(&lw->wv, 0));
        dl->wo.d = carve(c, lw->wo.data, dmat_bytes(&lw->wo, 0));
        dl->gate_inp.d = carve(c, lw->gate_inp.data, dmat_bytes(&lw->gate_inp, 0));
        if (m->arena) continue;   /* the experts live in the arena's slots */
        dl->gate_exps.d = carve(c, lw->gate_exps.data, dmat_bytes(&lw->gate_exps, 1));
        dl->up_exps.d = carve(c, lw->up_exps.data, dmat_bytes(&lw->up_exps, 1));
        dl->down_exps.d = carve(c, lw->down_exps.data, dmat_bytes(&lw->down_exps, 1));
    }
}

/* The arena: n_slots slots of each of gate, up, down (slot stride = the
 * layers' dmat stride, set at open); every layer's expert dmats point at
 * the same arrays. */
static void walk_arena(cuda_model *m, const void *ctx, carver *c)
{
    (void)ctx;
    const dlayer *d0 = &m->layers[0];
    uint8_t *g = carve(c, NULL, d0->gate_exps.stride * (size_t)m->ast.n_slots);
    uint8_t *u = carve(c, NULL, d0->up_exps.stride * (size_t)m->ast.n_slots);
    uint8_t *dn = carve(c, NULL, d0->down_exps.stride * (size_t)m->ast.n_slots);
    for (int l = 0; l < m->hp.n_layer; l++) {
        m->layers[l].gate_exps.d = g;
        m->layers[l].up_exps.d = u;
        m->layers[l].down_exps.d = dn;
    }
}

/* Arena mode at open: a slot holds one expert's gate, up and down of any
 * layer (layers may differ in type: each kind's slot stride is the largest
 * over the layers, 256-byte aligned); the slot count from the bytes; the
 * host maps. */
static int arena_setup(cuda_model *m, const cuda_model_opts *o, err *e)
{
    const hparams *hp = &m->hp;
    size_t st[3] = { 0, 0, 0 };
    m->xbytes = malloc(sizeof(size_t) * 3 * (size_t)hp->n_layer);
    if (!m->xbytes) return err_setf(e, ERR_NOMEM, "cuda_model: out of memory");
    for (int l = 0; l < hp->n_layer; l++) {
        const dlayer *dl = &m->layers[l];
        const size_t b[3] = { dl->gate_exps.stride, dl->up_exps.stride, dl->down_exps.stride };
        for (int k = 0; k < 3; k++) {
            m->xbytes[3 * l + k] = b[k];
            if (align256(b[k]) > st[k]) st[k] = align256(b[k]);
        }
    }
    const size_t slot = st[0] + st[1] + st[2];
    const int64_t all = (int64_t)hp->n_layer * hp->n_expert;
    int64_t n = (int64_t)(o->arena_bytes / slot);
    if (n < hp->n_expert_used)
        return err_setf(e, ERR_USAGE, "cuda_model: a GPU arena of %llu bytes holds %lld experts of %zu bytes; a "
                        "layer routes %d at once, so at least %llu bytes", (unsigned long long)o->arena_bytes,
                        (long long)n, slot, hp->n_expert_used, (unsigned long long)slot * hp->n_expert_used);
    if (n > all) n = all;
    m->ast.n_slots = (int)n;
    m->ra = o->read_ahead < 0 ? 0 : o->read_ahead > 32 ? 32 : o->read_ahead;
    if (m->ra > hp->n_expert) m->ra = hp->n_expert;
    m->host = o->host;
    for (int l = 0; l < hp->n_layer; l++) {
        m->layers[l].gate_exps.stride = st[0];
        m->layers[l].up_exps.stride = st[1];
        m->layers[l].down_exps.stride = st[2];
    }
    m->slot_of = malloc(sizeof(int32_t) * (size_t)all);
    m->slot_key = malloc(sizeof(int32_t) * (size_t)n);
    m->slot_used = calloc((size_t)n, sizeof(uint64_t));
    m->slot_pf = calloc((size_t)n, 1);
    m->lru_prev = malloc(sizeof(int32_t) * (size_t)n);
    m->lru_next = malloc(sizeof(int32_t) * (size_t)n);
    if (!m->slot_of || !m->slot_key || !m->slot_used || !m->slot_pf || !m->lru_prev || !m->lru_next)
        return err_setf(e, ERR_NOMEM, "cuda_model: out of memory");
    for (int64_t i = 0; i < n; i++) {
        m->lru_prev[i] = (int32_t)i - 1;
        m->lru_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    m->lru_head = 0;
    m->lru_tail = (int32_t)n - 1;
    for (int64_t i = 0; i < all; i++) m->slot_of[i] = -1;
    for (int64_t i = 0; i < n; i++) m->slot_key[i] = -1;
    m->arena = 1;
    m->use_graph = 0;
    return 0;
}

/* ---- the arena at run time ----
 * Slots carry the tick of the layer that last used them (m->tick counts
 * layers as they resolve). Copies into a slot are enqueued on the copy
 * stream only after the compute stream was synchronized (the ids download
 * of arena_resolve), so no kernel of an earlier layer can still read the
 * slot; slots of the current tick (this layer's experts and the prefetches
 * made beside them) are never taken. */

/* The recency list: every use moves a slot to the tail (lru_use), an
 * emptied slot goes to the head (lru_drop), so the head is the least
 * recently used and the slots of the current tick sit at the tail. */
static void lru_unlink(cuda_model *m, int s)
{
    const int p = m->lru_prev[s], n = m->lru_next[s];
    if (p >= 0) m->lru_next[p] = n; else m->lru_head = n;
    if (n >= 0) m->lru_prev[n] = p; else m->lru_tail = p;
}

static void lru_use(cuda_model *m, int s, uint64_t now)
{
    m->slot_used[s] = now;
    if (m->lru_tail == s) return;
    lru_unlink(m, s);
    m->lru_prev[s] = m->lru_tail;
    m->lru_next[s] = -1;
    m->lru_next[m->lru_tail] = s;
    m->lru_tail = s;
}

static void lru_drop(cuda_model *m, int s)
{
    m->slot_used[s] = 0;
    if (m->lru_head == s) return;
    lru_unlink(m, s);
    m->lru_prev[s] = -1;
    m->lru_next[s] = m->lru_head;
    m->lru_prev[m->lru_head] = s;
    m->lru_head = s;
}

/* The least recently used slot not used at tick `now`, emptied; -1 when
 * every slot is in use at `now` (only a prefetch can meet that). O(slots of
 * this tick): they are at the tail, the walk from the head meets them last. */
static int arena_take(cuda_model *m, uint64_t now)
{
    int s = m->lru_head;
    while (s >= 0 && m->slot_used[s] == now) s = m->lru_next[s];
    if (s >= 0 && m->slot_key[s] >= 0) {
        m->slot_of[m->slot_key[s]] = -1;
        m->slot_key[s] = -1;
    }
    if (s >= 0) m->slot_pf[s] = 0;
    return s;
}

/* Expert x of layer l into the least recently used slot not used at tick
 * now, recorded and marked used at now; -1 when every slot serves the
 * tick. */
static int arena_claim(cuda_model *m, int l, int x, uint64_t now)
{
    const int s = arena_take(m, now);
    if (s < 0) return -1;
    const int32_t key = l * m->hp.n_expert + x;
    m->slot_key[s] = key;
    m->slot_of[key] = s;
    lru_use(m, s, now);
    return s;
}

/* The slots claimed for experts xs[0..n) of layer l hold nothing (a copy
 * into them failed): unmapped, first in line for reuse. */
static void arena_unclaim(cuda_model *m, int l, const int32_t *xs, int n)
{
    for (int i = 0; i < n; i++) {
        const int32_t key = l * m->hp.n_expert + xs[i];
        const int s = m->slot_of[key];
        if (s < 0) continue;
        m->slot_of[key] = -1;
        m->slot_key[s] = -1;
        m->slot_pf[s] = 0;
        lru_drop(m, s);
    }
}

/* Routed expert ids from the device are checked before use. */
static int check_ids(int l, const int32_t *ids, int n, int n_expert, err *e)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_expert)
            return err_setf(e, ERR_INTERNAL, "cuda_model: layer %d routed expert id %d (n_expert %d)", l,
                            (int)ids[i], n_expert);
    return 0;
}

/* Layer l's routed ids[0..n) (repeats allowed) at tick now: the first
 * lookup of an expert in the tick counts a hit (refreshing its slot) or a
 * miss (claiming one, listed once in miss); slots[b] = ids[b]'s slot.
 * n <= n_slots, so every claim succeeds. Returns the number of misses. */
static int arena_lookup(cuda_model *m, int l, const int32_t *ids, int n, uint64_t now, int32_t *slots,
                        int32_t *miss)
{
    int nm = 0;
    for (int b = 0; b < n; b++) {
        int s = m->slot_of[l * m->hp.n_expert + ids[b]];
        if (s >= 0) {
            if (m->slot_used[s] != now) {
                m->ast.hits++;
                if (m->slot_pf[s]) { m->ast.prefetch_used++; m->slot_pf[s] = 0; }
                lru_use(m, s, now);
            }
        } else {
            s = arena_claim(m, l, ids[b], now);
            m->ast.misses++;
            miss[nm++] = ids[b];
        }
        slots[b] = s;
    }
    return nm;
}

/* Enqueue expert x of layer l into slot s from the file mapping. */
static int arena_copy_map(cuda_model *m, int l, int x, int s, err *e)
{
    const layer_weights *lw = &m->w->layers[l];
    const uint8_t *src[3] = { lw->gate_exps.data, lw->up_exps.data, lw->down_exps.data };
    const dlayer *dl = &m->layers[l];
    uint8_t *dst[3] = { (uint8_t *)dl->gate_exps.d, (uint8_t *)dl->up_exps.d, (uint8_t *)dl->down_exps.d };
    const size_t sstride[3] = { dl->gate_exps.stride, dl->up_exps.stride, dl->down_exps.stride };
    const size_t *xb = m->xbytes + 3 * (size_t)l;
    for (int k = 0; k < 3; k++)
        TRY(cuda_copy_h2d(m->cu, dst[k] + (size_t)s * sstride[k], src[k] + (size_t)x * xb[k], xb[k], e));
    m->ast.bytes_h2d += xb[0] + xb[1] + xb[2];
    return 0;
}

/* The host tier's wave left open by arena_copy_host: wait for the copies
 * out of its slots, then end it (the store may reuse the slots after). */
static int host_flush(cuda_model *m, err *e)
{
    if (m->host_open < 0) return 0;
    const int rw = cuda_copy_wait(m->cu, e);
    expert_src_end_layer(m->host, m->host_open);
    m->host_open = -1;
    return rw;
}

/* The misses xs[0..n) of layer l (each already given its slot in
 * m->slot_of) through the host tier: begin (it may take them in waves and
 * reorders each wave), wait, copy each from get(); a wave before the last
 * waits for its copies and ends; the last stays open (m->host_open) until
 * the next use of the store or the end of the call (host_flush), so the
 * host goes on enqueueing while the copies run. */
static int arena_copy_host(cuda_model *m, int l, int32_t *xs, int n, err *e)
{
    TRY(host_flush(m, e));
    const int NE = m->hp.n_expert;
    const dlayer *dl = &m->layers[l];
    uint8_t *dst[3] = { (uint8_t *)dl->gate_exps.d, (uint8_t *)dl->up_exps.d, (uint8_t *)dl->down_exps.d };
    const size_t sstride[3] = { dl->gate_exps.stride, dl->up_exps.stride, dl->down_exps.stride };
    const size_t *xb = m->xbytes + 3 * (size_t)l;
    for (int done = 0; done < n;) {
        const int k = expert_src_begin_layer(m->host, l, xs + done, n - done, e);
        if (k < 0) return k;
        int rc = 0;
        if (k == 0 || k > n - done)
            rc = err_setf(e, ERR_INTERNAL, "cuda_model: the host tier returned a wave of %d of %d experts", k,
                          n - done);
        if (!rc) rc = expert_src_wait_layer(m->host, l, e);
        for (int i = 0; i < k && !rc; i++) {
            const int x = xs[done + i], s = m->slot_of[l * NE + x];
            for (int part = 0; part < 3 && !rc; part++) {
                const void *p = expert_src_get(m->host, l, x, part);
                rc = p ? cuda_copy_h2d(m->cu, dst[part] + (size_t)s * sstride[part], p, xb[part], e)
                       : err_setf(e, ERR_INTERNAL, "cuda_model: the host tier has no data for layer %d expert %d",
                                  l, x);
            }
            if (!rc) m->ast.bytes_h2d += xb[0] + xb[1] + xb[2];
        }
        /* the host slots stay pinned until the copies out of them are done */
        if (!rc && done + k == n) {   /* the last wave: left open */
            m->host_open = l;
            return 0;
        }
        const int rw = cuda_copy_wait(m->cu, rc ? NULL : e);
        expert_src_end_layer(m->host, l);
        if (rc) return rc;
        if (rw) return rw;
        done += k;
    }
    return 0;
}

/* Layer l's misses into their slots (through the host tier, or from the
 * mapping) and the compute stream fenced behind the copies; on failure
 * those slots hold nothing. */
static int arena_fill(cuda_model *m, int l, int32_t *miss, int nm, err *e)
{
    int rc = 0;
    if (m->host) rc = arena_copy_host(m, l, miss, nm, e);
    else
        for (int i = 0; i < nm && !rc; i++)
            rc = arena_copy_map(m, l, miss[i], m->slot_of[l * m->hp.n_expert + miss[i]], e);
    if (rc) {
        arena_unclaim(m, l, miss, nm);
        return rc;
    }
    return cuda_copy_fence(m->cu, e);
}

/* Layer l's routed experts (m->sel, on the device) into arena slots: the
 * ids (and, with read-ahead, layer l + 1's predicted ones) come to the
 * host; a hit refreshes its slot, a miss takes the least recently used
 * slot not used by this layer's row; the misses are copied on the copy
 * stream (from the mapping or through the host tier) and the compute
 * stream is fenced behind them; the slots go to m->slot_ids for the expert
 * matvecs. Then the read-ahead: without a host tier the predicted experts
 * not in the arena are copied behind the fence (no kernel waits for them
 * before the next layer's fence); with one they are the host tier's
 * prefetch. A failed copy leaves the slots it was filling empty. */
static int arena_resolve(cuda_model *m, int l, err *e)
{
    const int K = m->hp.n_expert_used, NE = m->hp.n_expert;
    const int ra = m->ra && l + 1 < m->hp.n_layer ? m->ra : 0;
    int32_t sel[64], slots[32], miss[32];   /* K, ra <= 32 */
    TRY(cuda_download(m->cu, sel, m->sel, sizeof(int32_t) * (size_t)(K + ra), e));
    TRY(check_ids(l, sel, K, NE, e));
    TRY(check_ids(l + 1, sel + K, ra, NE, e));
    const uint64_t now = ++m->tick;
    const int nm = arena_lookup(m, l, sel, K, now, slots, miss);
    /* the compute stream is idle (the download): this upload waits for nothing */
    TRY(cuda_upload(m->cu, m->slot_ids, slots, sizeof(int32_t) * (size_t)K, e));
    TRY(arena_fill(m, l, miss, nm, e));
    if (!ra) return 0;
    if (m->host) {   /* after this layer's kernels are enqueued: arena_prefetch_host */
        memcpy(m->pf_ids, sel + K, sizeof(int32_t) * (size_t)ra);
        m->pf_n = ra;
        m->pf_tick = now;
        return 0;
    }
    for (int t = K; t < K + ra; t++) {
        if (m->slot_of[(l + 1) * NE + sel[t]] >= 0) continue;
        const int s = arena_claim(m, l + 1, sel[t], now);
        if (s < 0) break;   /* every slot serves this layer */
        const int rc = arena_copy_map(m, l + 1, sel[t], s, e);
        if (rc) { arena_unclaim(m, l + 1, sel + t, 1); return rc; }
        m->slot_pf[s] = 1;
        m->ast.prefetched++;
    }
    return 0;
}

/* The host tier's read-ahead, called once layer l's kernels are enqueued:
 * layer l + 1's predicted experts (arena_resolve kept them) that the
 * device arena lacks go through the host tier (begin, wait, copy, end, as
 * misses) into slots not used by layer l, while the GPU computes layer l.
 * The host blocks on the reads and copies here, which it would do at layer
 * l + 1's download anyway. A failure only drops the guesses (the demand at
 * layer l + 1 reads them again and reports what fails then). */
static void arena_prefetch_host(cuda_model *m, int l)
{
    const int NE = m->hp.n_expert, n = m->pf_n;
    m->pf_n = 0;
    if (!n || l + 1 >= m->hp.n_layer) return;
    int32_t xs[32];
    int np = 0;
    for (int t = 0; t < n; t++) {
        if (m->slot_of[(l + 1) * NE + m->pf_ids[t]] >= 0) continue;
        const int s = arena_claim(m, l + 1, m->pf_ids[t], m->pf_tick);
        if (s < 0) break;   /* every slot serves layer l */
        m->slot_pf[s] = 1;
        xs[np++] = m->pf_ids[t];
    }
    if (!np) return;
    /* (the host tier may reorder xs: the same set) */
    if (arena_copy_host(m, l + 1, xs, np, NULL)) {
        arena_unclaim(m, l + 1, xs, np);
        return;
    }
    m->ast.prefetched += (uint64_t)np;
}

static void walk_kv(cuda_model *m, const void *ctx, carver *c)
{
    (void)ctx;
    const size_t kvd = (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim;
    const size_t bytes = (size_t)m->n_ctx * kvd * (m->kv_f16 ? 2 : 4);
    for (int l = 0; l < m->hp.n_layer; l++) {
        m->layers[l].k_cache = carve(c, NULL, bytes);
        m->layers[l].v_cache = carve(c, NULL, bytes);
    }
}

static void walk_scratch(cuda_model *m, const void *ctx, carver *c)
{
    (void)ctx;
    const hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, K = (size_t)hp->n_expert_used, F = (size_t)hp->n_ff_exp;
    const size_t qd = (size_t)hp->n_head * (size_t)hp->head_dim, kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    /* the widest quantized input any matvec takes (down: k rows) */
    size_t xqb = m->output.act_bytes;
    for (int l = 0; l < hp->n_layer; l++) {
        const dlayer *dl = &m->layers[l];
        const size_t one[] = { dl->wq.act_bytes, dl->wk.act_bytes, dl->wv.act_bytes, dl->wo.act_bytes,
                               dl->gate_inp.act_bytes, dl->gate_exps.act_bytes, dl->up_exps.act_bytes,
                               K * dl->down_exps.act_bytes };
        for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) if (one[i] > xqb) xqb = one[i];
    }
    m->x = carve(c, NULL, sizeof(float) * E);
    m->xn = carve(c, NULL, sizeof(float) * E);
    /* q, k and v back to back: one matvec can fill all three (mv_qkv) */
    m->q = carve(c, NULL, sizeof(float) * (qd + 2 * kvd));
    m->k = m->q ? m->q + qd : NULL;
    m->v = m->q ? m->k + kvd : NULL;
    m->att = carve(c, NULL, sizeof(float) * qd);
    m->xq = carve(c, NULL, xqb);
    m->router = carve(c, NULL, sizeof(float) * (size_t)hp->n_expert);
    /* sel and psel back to back: one download brings both to the host */
    m->sel = carve(c, NULL, sizeof(int32_t) * (K + (size_t)m->ra));
    m->psel = m->sel ? m->sel + K : NULL;
    m->selw = carve(c, NULL, sizeof(float) * K);
    if (m->nc >= 2) {
        const size_t nc = (size_t)m->nc;
        size_t aq = 0, aq2 = 0, ad = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            const dlayer *dl = &m->layers[l];
            const size_t one[] = { dl->wq.act_bytes, dl->wk.act_bytes, dl->wv.act_bytes, dl->wo.act_bytes,
                                   dl->gate_inp.act_bytes, dl->gate_exps.act_bytes };
            for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) if (one[i] > aq) aq = one[i];
            if (dl->up_exps.act_bytes > aq2) aq2 = dl->up_exps.act_bytes;
            if (dl->down_exps.act_bytes > ad) ad = dl->down_exps.act_bytes;
        }
        m->cx = carve(c, NULL, sizeof(float) * nc * E);
        m->cxn = carve(c, NULL, sizeof(float) * nc * E);
        m->cxq = carve(c, NULL, nc * aq);
        m->cxq2 = carve(c, NULL, nc * aq2);
        m->cqkv = carve(c, NULL, sizeof(float) * nc * (qd + 2 * kvd));
        m->catt = carve(c, NULL, sizeof(float) * nc * qd);
        m->crouter = carve(c, NULL, sizeof(float) * nc * (size_t)hp->n_expert);
        m->csel = carve(c, NULL, sizeof(int32_t) * nc * K);
        m->cselw = carve(c, NULL, sizeof(float) * nc * K);
        m->cg = carve(c, NULL, sizeof(float) * nc * K * F);
        m->cup = carve(c, NULL, sizeof(float) * nc * K * F);
        m->cxqd = carve(c, NULL, nc * K * ad);
        m->ceout = carve(c, NULL, sizeof(float) * nc * K * E);
        m->cdense = carve(c, NULL, chunk_dense_bytes(m->nc));
        m->citem = carve(c, NULL, chunk_item_bytes(m->nc_items));
    }
    if (m->ra) {
        m->pxn = carve(c, NULL, sizeof(float) * E);
        m->prouter = carve(c, NULL, sizeof(float) * (size_t)hp->n_expert);
        m->pselw = carve(c, NULL, sizeof(float) * (size_t)m->ra);
    }
    m->slot_ids = carve(c, NULL, sizeof(int32_t) * K);
    m->g = carve(c, NULL, sizeof(float) * K * F);
    m->u = carve(c, NULL, sizeof(float) * K * F);
    m->eout = carve(c, NULL, sizeof(float) * K * E);
    m->logits = carve(c, NULL, sizeof(float) * (size_t)hp->n_vocab);
    m->layer_out = carve(c, NULL, sizeof(float) * (size_t)hp->n_layer * E);
    m->layer_sel = carve(c, NULL, sizeof(int32_t) * (size_t)hp->n_layer * (size_t)hp->n_expert_used);
    m->tok = carve(c, NULL, sizeof(int32_t) * ((size_t)m->n_ctx + 1));
    m->pos = carve(c, NULL, sizeof(int32_t) * (size_t)m->n_ctx);
    m->step = carve(c, NULL, sizeof(int32_t) * 2);
}

/* Prompt chunks: the chunk size (with an arena every row's experts of a
 * chunk must fit in it at once) and the host lists. */
static int chunk_setup(cuda_model *m, err *e)
{
    const hparams *hp = &m->hp;
    m->nc = CHUNK_MAX;
    if (m->arena && m->ast.n_slots / hp->n_expert_used < m->nc) m->nc = m->ast.n_slots / hp->n_expert_used;
    if (m->nc < 2) { m->nc = 0; return 0; }
    const size_t nk = (size_t)m->nc * (size_t)hp->n_expert_used;
    const size_t nmat = m->arena && (size_t)m->ast.n_slots > (size_t)hp->n_expert ? (size_t)m->ast.n_slots
                      : (size_t)hp->n_expert;
    m->nc_items = nk;
    m->hsel = malloc(sizeof(int32_t) * nk);
    m->hslot = malloc(sizeof(int32_t) * nk);
    m->hmiss = malloc(sizeof(int32_t) * nk);
    m->hgrp = malloc(sizeof(int32_t) * nmat);
    m->hgmat = malloc(sizeof(int32_t) * nk);
    m->hgcnt = malloc(sizeof(int32_t) * nk);
    m->hitem = malloc(chunk_item_bytes(nk));
    m->hdense = malloc(chunk_dense_bytes(m->nc));
    if (!m->hsel || !m->hslot || !m->hmiss || !m->hgrp || !m->hgmat || !m->hgcnt || !m->hitem || !m->hdense)
        return err_setf(e, ERR_NOMEM, "cuda_model: out of memory");
    for (size_t i = 0; i < nmat; i++) m->hgrp[i] = -1;
    return 0;
}

/* Page-lock the memory the arena's misses copy from, when the system
 * allows (else they copy from pageable memory: the same bytes, slower): the
 * host tier's slots, or the file mapping read-only when it is at most half
 * of the machine's RAM (pinning keeps all of it resident). */
static void pin_host(cuda_model *m, const cuda_model_opts *o, const weights *w)
{
    const void *p = o->host ? o->host_mem : w->map;
    const uint64_t n = o->host ? o->host_mem_bytes : w->map_bytes;
    if (!p || !n) return;
    if (!o->host) {
        const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || psz <= 0 || n > (uint64_t)pages * (uint64_t)psz / 2) return;
    }
    if (cuda_host_register(m->cu, p, (size_t)n, !o->host, NULL)) return;
    m->pinned = p;
    m->ast.pinned_bytes = n;
}

int cuda_model_open(cuda_model **out, const hparams *hp, const weights *w, const cuda_model_opts *o, err *e)
{
    *out = NULL;
    TRY(check_shape(hp, o, e));
    if (w->mode != WEIGHTS_MAP_ALL && !o->host)
        return err_setf(e, ERR_USAGE, "cuda_model: the weights must be opened WEIGHTS_MAP_ALL (experts are "
                        "uploaded from the mapping) unless a host tier serves them");
    if ((o->host || o->read_ahead) && !o->arena_bytes)
        return err_setf(e, ERR_USAGE, "cuda_model: a host tier and read-ahead feed the GPU's expert arena: they "
                        "need arena_bytes (--gpu-arena)");
    if (o->read_ahead < 0) return err_setf(e, ERR_USAGE, "cuda_model: read-ahead %d is negative", o->read_ahead);
    const int t_embd = w->tok_embd.type;
    if (!cuda_act_bytes(t_embd, hp->n_embd) && t_embd != QTYPE_F32 && t_embd != QTYPE_F16 && t_embd != QTYPE_BF16)
        return err_setf(e, ERR_UNSUPPORTED, "cuda_model: tensor token_embd.weight: type %s has no CUDA get_rows",
                        qtype_name(t_embd));

    cuda_model *m = calloc(1, sizeof *m);
    if (!m) return err_setf(e, ERR_NOMEM, "cuda_model: out of memory");
    m->hp = *hp;
    m->n_ctx = o->n_ctx;
    m->kv_f16 = o->kv_f16 != 0;
    m->use_graph = 1;
    m->host_open = -1;
    int rc = 0;
    int32_t *pos = NULL;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) { rc = err_setf(e, ERR_NOMEM, "cuda_model: out of memory"); goto fail; }

    /* shapes and kernel support, before the GPU is touched */
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        dlayer *dl = &m->layers[l];
        if ((rc = dmat_init(&dl->wq, &lw->wq, "attn_q", l, e)) || (rc = dmat_init(&dl->wk, &lw->wk, "attn_k", l, e)) ||
            (rc = dmat_init(&dl->wv, &lw->wv, "attn_v", l, e)) ||
            (rc = dmat_init(&dl->wo, &lw->wo, "attn_output", l, e)) ||
            (rc = dmat_init(&dl->gate_inp, &lw->gate_inp, "ffn_gate_inp", l, e)) ||
            (rc = dmat_init(&dl->gate_exps, &lw->gate_exps, "ffn_gate_exps", l, e)) ||
            (rc = dmat_init(&dl->up_exps, &lw->up_exps, "ffn_up_exps", l, e)) ||
            (rc = dmat_init(&dl->down_exps, &lw->down_exps, "ffn_down_exps", l, e)))
            goto fail;
    }
    if ((rc = dmat_init(&m->output, &w->output, w->output_tied ? "token_embd.weight (tied head)" : "output.weight",
                        -1, e)))
        goto fail;
    m->tok_embd.type = t_embd;
    m->tok_embd.k = hp->n_embd;
    m->tok_embd.rows = w->tok_embd.ne[1];
    m->tok_embd.row_bytes = (size_t)w->tok_embd.row_bytes;

    if (o->arena_bytes) {
        m->w = w;
        if ((rc = arena_setup(m, o, e))) goto fail;
    }
    if ((rc = chunk_setup(m, e))) goto fail;
    if ((rc = cuda_open(&m->cu, o->device, e))) goto fail;
    if ((rc = carve_pool(m, walk_weights, w, "the weights", &m->wpool, &m->wbytes, e))) goto fail;
    if ((rc = repack_dense(m, w, e))) goto fail;
    if (m->arena && (rc = carve_pool(m, walk_arena, NULL, "the expert arena", &m->apool, &m->abytes, e))) goto fail;
    if (m->arena) pin_host(m, o, w);
    if ((rc = carve_pool(m, walk_kv, NULL, "the KV cache", &m->kvpool, &m->kvbytes, e))) goto fail;
    if ((rc = carve_pool(m, walk_scratch, NULL, "the scratch", &m->spool, &m->sbytes, e))) goto fail;
    pos = malloc(sizeof(int32_t) * (size_t)m->n_ctx);
    if (!pos) { rc = err_setf(e, ERR_NOMEM, "cuda_model: out of memory"); goto fail; }
    for (int i = 0; i < m->n_ctx; i++) pos[i] = i;
    if ((rc = cuda_upload(m->cu, m->pos, pos, sizeof(int32_t) * (size_t)m->n_ctx, e))) goto fail;
    if ((rc = cuda_memset(m->cu, m->tok, 0, sizeof(int32_t) * ((size_t)m->n_ctx + 1), e))) goto fail;
    if ((rc = cuda_sync(m->cu, e))) goto fail;
    free(pos);
    *out = m;
    return 0;
fail:
    free(pos);
    cuda_model_close(m);
    return rc;
}

/* The captured graphs freed (at close, or when a launch setting changes:
 * recaptured at next use). */
static void drop_graphs(cuda_model *m)
{
    for (int b = 0; b < CUDA_ATTN_BUCKETS; b++) {
        cuda_graph_free(m->graph[b]);
        cuda_graph_free(m->graph_row[b]);
        cuda_graph_free(m->graph_head[b]);
        m->graph[b] = m->graph_row[b] = m->graph_head[b] = NULL;
    }
}

void cuda_model_close(cuda_model *m)
{
    if (!m) return;
    if (m->cu) {
        cuda_sync(m->cu, NULL);
        host_flush(m, NULL);
        cuda_copy_wait(m->cu, NULL);   /* no copy still writes the arena or reads pinned memory */
        drop_graphs(m);
        cuda_free(m->cu, m->spool);
        cuda_free(m->cu, m->kvpool);
        cuda_free(m->cu, m->wpool);
        cuda_free(m->cu, m->apool);
        if (m->pinned) cuda_host_unregister(m->cu, m->pinned);
        cuda_close(m->cu);
    }
    free(m->xbytes);
    free(m->slot_of);
    free(m->slot_key);
    free(m->slot_used);
    free(m->slot_pf);
    free(m->lru_prev);
    free(m->lru_next);
    free(m->hsel);
    free(m->hslot);
    free(m->hmiss);
    free(m->hgrp);
    free(m->hgmat);
    free(m->hgcnt);
    free(m->hitem);
    free(m->hdense);
    free(m->layers);
    free(m);
}

uint64_t cuda_model_vram_bytes(const cuda_model *m) { return m ? m->wbytes + m->abytes + m->kvbytes + m->sbytes : 0; }

void cuda_model_arena_stats(const cuda_model *m, cuda_arena_stats *out) { *out = m->ast; }

const char *cuda_model_device_name(const cuda_model *m) { return m && m->cu ? cuda_device_name(m->cu) : "none"; }

/* ==== The forward of one row ==== */

/* A row-path kernel call of stage s (CUDA_STAGE_*): left out when
 * cuda_model_set_skip names s. */
#define STAGE(s, call) do { if (m->skip != (s)) TRY(call); } while (0)

/* The input row x (rows of n floats, back to back) in w's dot type: xq, or
 * x itself for an F32 weight. */
static int act_in(cuda_model *m, const dmat *w, const float *x, int rows, const void **xq, err *e)
{
    if (w->act_f32) { *xq = x; return 0; }
    TRY(cuda_act_quant(m->cu, w->type, x, m->xq, w->k, rows, e));
    *xq = m->xq;
    return 0;
}

/* y = W xq for one matrix, xq from act_in. */
static int mvq(cuda_model *m, const dmat *w, const void *xq, float *y, err *e)
{
    return cuda_matvec(m->cu, w->mvtype, w->d, w->rows, w->k, xq, y, e);
}

/* y = W x for one matrix, quantizing x first. */
static int mv(cuda_model *m, const dmat *w, const float *x, float *y, err *e)
{
    const void *xq;
    TRY(act_in(m, w, x, 1, &xq, e));
    return mvq(m, w, xq, y, e);
}

/* Matrix b continues matrix a: one type and row size, b's rows right after
 * a's in VRAM (carved sizes are multiples of 256 bytes) and b's outputs
 * right after a's (ya, yb). */
static int mat_continues(const dmat *a, const float *ya, const dmat *b, const float *yb)
{
    return a->type == b->type && a->mvtype == b->mvtype && a->row_bytes == b->row_bytes && a->k == b->k &&
           (const char *)b->d == (const char *)a->d + (size_t)a->rows * a->row_bytes && yb == ya + a->rows;
}

/* q, k and v = wq, wk, wv times the one quantized row xq, in as few matvec
 * launches as their storage and types allow: each run of consecutive
 * matrices that continue one another (mat_continues) is one matrix. One
 * launch when all three share a type (then they are n_head + 2 n_head_kv
 * heads' rows); a Q4_K_M file's layers with a Q6_K attn_v (llama-quantize
 * gives attn_v more bits in half the layers) have two runs, q+k then v,
 * which cuda_matvec_pair takes in one launch as well (cuda_matvec_pair_ok);
 * an 8-expert file's Q8_0 attn_k/attn_v: q, then k+v, two launches (their
 * activations differ: Q8_K and Q8_0 blocks, one row xq cannot serve both).
 * Each row's dot is the same whatever matrix or launch it is in. */
static int mv_qkv(cuda_model *m, const dlayer *dl, const void *xq, err *e)
{
    const dmat *w[3] = { &dl->wq, &dl->wk, &dl->wv };
    float *y[3] = { m->q, m->k, m->v };
    int first[4], nrun = 0;   /* run r: matrices first[r] .. first[r + 1] - 1 */
    int64_t rows[3];
    for (int i = 0; i < 3;) {
        int j = i + 1;
        rows[nrun] = w[i]->rows;
        while (j < 3 && mat_continues(w[j - 1], y[j - 1], w[j], y[j])) rows[nrun] += w[j++]->rows;
        first[nrun++] = i;
        i = j;
    }
    first[nrun] = 3;
    int r = 0;
    if (nrun >= 2 && w[first[0]]->k == w[first[1]]->k &&
        cuda_matvec_pair_ok(w[first[0]]->mvtype, w[first[1]]->mvtype)) {
        const cuda_matvec_seg s[2] = {
            { w[first[0]]->mvtype, w[first[0]]->d, rows[0], y[first[0]] },
            { w[first[1]]->mvtype, w[first[1]]->d, rows[1], y[first[1]] },
        };
        STAGE(CUDA_STAGE_QKV, cuda_matvec_pair(m->cu, s, w[0]->k, xq, e));
        r = 2;
    }
    for (; r < nrun; r++) {
        const dmat *a = w[first[r]];
        STAGE(CUDA_STAGE_QKV, cuda_matvec(m->cu, a->mvtype, a->d, rows[r], a->k, xq, y[first[r]], e));
    }
    return 0;
}

/* w's activations are Q8 blocks (Q8_K, Q8_0 or Q8_1) and its rows at most
 * CUDA_RMSQ_MAXN long: the fused norm/swiglu quantizers apply */
static int q8_dot(const dmat *w)
{
    const int dot = qtype_get(w->type)->dot_type;
    return (dot == QTYPE_Q8_K || dot == QTYPE_Q8_0 || dot == QTYPE_Q8_1) && w->k <= CUDA_RMSQ_MAXN;
}

static int same_dot(const dmat *a, const dmat *b)
{
    return qtype_get(a->type)->dot_type == qtype_get(b->type)->dot_type;
}

/* layer_attn's input is one launch's work: the attention norm and one
 * quantization for q, k and v (cuda_rmsnorm_quant for wq's type). Then
 * the previous layer's combine can run it in its own launch
 * (cuda_moe_combine_rmsnorm_quant; row() decides, layer_attn skips it). */
static int attn_norm_q8(const dlayer *dl)
{
    return same_dot(&dl->wq, &dl->wk) && same_dot(&dl->wq, &dl->wv) && q8_dot(&dl->wq);
}

/* The k routed experts of stack w (ids m->sel) on input rows xq (x_stride
 * 0: shared), outputs at y + b * y_stride. ids_early: the ids were written
 * two or more launches before (cuda_matvec_args). */
static int mv_experts(cuda_model *m, const dmat *w, const void *xq, size_t x_stride, float *y, size_t y_stride,
                      int ids_early, err *e)
{
    cuda_matvec_args a = {
        .wtype = w->mvtype, .w = w->d, .w_stride = w->stride, .ids = m->arena ? m->slot_ids : m->sel,
        .rows = w->rows, .k = w->k,
        .n_batch = m->hp.n_expert_used, .xq = xq, .x_stride = x_stride, .y = y, .y_stride = y_stride,
        .ids_early = ids_early,
    };
    return cuda_matvec_batch(m->cu, &a, e);
}

/* Attention half of layer l for the row in m->x at position *pos (device;
 * pos + 1 <= n_kv_max, whose attention bucket picks the launch shape):
 * writes its K/V to the cache; when `full`, also x = Wo . attn + x.
 * `normed`: m->xn and m->xq already hold x's attention norm, quantized for
 * wq (the previous layer's combine ran it: only when attn_norm_q8). */
static int layer_attn(cuda_model *m, int l, const int32_t *pos, int n_kv_max, int full, int normed, err *e)
{
    const hparams *hp = &m->hp;
    const dlayer *dl = &m->layers[l];
    const int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    cuda_ctx *cu = m->cu;

    if (same_dot(&dl->wq, &dl->wk) && same_dot(&dl->wq, &dl->wv)) {   /* one quantization for the three */
        const void *xq;
        if (q8_dot(&dl->wq)) {   /* the norm and the quantization in one launch (attn_norm_q8) */
            if (!normed)
                TRY(cuda_rmsnorm_quant(cu, dl->wq.type, m->xn, m->xq, m->x, dl->attn_norm, E, hp->rms_eps, e));
            xq = m->xq;
        } else {
            TRY(cuda_rmsnorm(cu, m->xn, m->x, dl->attn_norm, E, 1, hp->rms_eps, e));
            TRY(act_in(m, &dl->wq, m->xn, 1, &xq, e));
        }
        TRY(mv_qkv(m, dl, xq, e));
    } else {
        TRY(cuda_rmsnorm(cu, m->xn, m->x, dl->attn_norm, E, 1, hp->rms_eps, e));
        TRY(mv(m, &dl->wq, m->xn, m->q, e));
        TRY(mv(m, &dl->wk, m->xn, m->k, e));
        TRY(mv(m, &dl->wv, m->xn, m->v, e));
    }
    if (!full) {   /* per-head Q/K RMSNorm, RoPE of q and k, the K/V store: one launch */
        STAGE(CUDA_STAGE_ROPE, cuda_qk_norm_rope_store(cu, m->q, m->k, m->v, dl->q_norm, dl->k_norm, H, Hkv, D,
                                                       hp->n_rot, pos, hp->rope_freq_base, hp->rope_freq_scale,
                                                       hp->rms_eps, dl->k_cache, dl->v_cache, m->kv_f16, e));
        return 0;
    }
    /* the same prologue inside the attention's launch (one dependent
     * kernel fewer: bench/RESULTS.md, session 13) */
    const float scale = 1.0f / sqrtf((float)D);
    STAGE(CUDA_STAGE_ATTN, cuda_attention_decode_fused(cu, m->att, m->q, m->k, m->v, dl->q_norm, dl->k_norm, H, Hkv, D,
                                                       hp->n_rot, pos, hp->rope_freq_base, hp->rope_freq_scale,
                                                       hp->rms_eps, dl->k_cache, dl->v_cache, m->kv_f16, n_kv_max, scale, e));
    /* x = Wo . att + x: the residual is added in the matvec's store; a Q8
     * dot type's CTAs quantize att themselves (xquant: no quantizer launch) */
    cuda_matvec_args a = {
        .wtype = dl->wo.mvtype, .w = dl->wo.d, .rows = dl->wo.rows, .k = dl->wo.k, .n_batch = 1, .xq = m->att,
        .y = m->x, .add = m->x,
    };
    if (cuda_matvec_xquant_ok(dl->wo.mvtype)) a.xquant = CUDA_XQ_F32;
    else STAGE(CUDA_STAGE_WO_QUANT, act_in(m, &dl->wo, m->att, 1, &a.xq, e));
    STAGE(CUDA_STAGE_WO, cuda_matvec_batch(cu, &a, e));
    return 0;
}

/* MoE half of layer l: x = x + sum_t w_t down_t(silu(gate_t xn) * up_t xn),
 * xn = rms(x) * ffn_norm, the k experts and weights from the router.
 * next_norm (NULL: none): the norm that follows, run in the combine's
 * launch (one dependent kernel fewer on the token's path): xn = rms(x) *
 * next_norm and xq = xn quantized for next_w's type (a Q8 dot type,
 * q8_dot), bit for bit what cuda_rmsnorm_quant after the combine gives. */
static int layer_moe(cuda_model *m, int l, const float *next_norm, const dmat *next_w, err *e)
{
    const hparams *hp = &m->hp;
    const dlayer *dl = &m->layers[l];
    const int E = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
    cuda_ctx *cu = m->cu;
    const void *xq;

    /* read-ahead first (its router input may take m->xq, which this layer
     * fills below): layer l + 1's ffn_norm and router on the same residual,
     * its top m->ra experts to m->psel for arena_resolve's download */
    if (m->ra && l + 1 < hp->n_layer) {
        const dlayer *dn = &m->layers[l + 1];
        TRY(cuda_rmsnorm(cu, m->pxn, m->x, dn->ffn_norm, E, 1, hp->rms_eps, e));
        TRY(mv(m, &dn->gate_inp, m->pxn, m->prouter, e));
        TRY(cuda_router_topk(cu, m->prouter, hp->n_expert, m->ra, 1, m->psel, m->pselw, e));
    }
    /* gate and up share the input row (x_stride 0); one launch when they
     * are stacks of one type and layout */
    const int gate_up_one = dl->up_exps.type == dl->gate_exps.type && dl->up_exps.stride == dl->gate_exps.stride &&
                            dl->up_exps.rows == dl->gate_exps.rows;
    /* The ffn norm without a launch of its own (CUDA_XQ_NORM): the router's
     * CTAs norm x after their wait (Wo wrote it) and their warps write its
     * quantization for gate+up to m->xq (nq_out), which gate+up's CTAs
     * unpack before their wait (two launches back then: x_early); bit for
     * bit the norm kernel's xn and xq */
    const int own_norm = gate_up_one && cuda_matvec_xnorm_ok(dl->gate_inp.mvtype) &&
                         cuda_matvec_xquant_ok(dl->gate_exps.mvtype);
    const int fused = dl->gate_inp.act_f32 && q8_dot(&dl->gate_exps);
    if (own_norm) {
        cuda_matvec_args r = {
            .wtype = dl->gate_inp.mvtype, .w = dl->gate_inp.d, .rows = dl->gate_inp.rows, .k = E, .n_batch = 1,
            .xq = m->x, .y = m->router, .xquant = CUDA_XQ_NORM, .xnw = dl->ffn_norm, .eps = hp->rms_eps,
            .nq_out = m->xq, .nq_type = dl->gate_exps.type,
        };
        STAGE(CUDA_STAGE_ROUTER, cuda_matvec_batch(cu, &r, e));
    } else {   /* xn = rms(x) for the router (as floats for an F32 router), quantized for the experts in
                * the same launch when the router needs no quantization of its own (it would reuse m->xq) */
        if (fused) STAGE(CUDA_STAGE_FFN_NORM, cuda_rmsnorm_quant(cu, dl->gate_exps.type, m->xn, m->xq, m->x,
                                                                 dl->ffn_norm, E, hp->rms_eps, e));
        else STAGE(CUDA_STAGE_FFN_NORM, cuda_rmsnorm(cu, m->xn, m->x, dl->ffn_norm, E, 1, hp->rms_eps, e));
        STAGE(CUDA_STAGE_ROUTER, mv(m, &dl->gate_inp, m->xn, m->router, e));
    }
    STAGE(CUDA_STAGE_TOPK, cuda_router_topk(cu, m->router, hp->n_expert, K, 1, m->sel, m->selw, e));
    if (m->arena) TRY(arena_resolve(m, l, e));
    if (own_norm || fused) xq = m->xq;
    else TRY(act_in(m, &dl->gate_exps, m->xn, 1, &xq, e));
    if (gate_up_one) {
        cuda_matvec_args a = {
            .wtype = dl->gate_exps.mvtype, .w = dl->gate_exps.d, .w_stride = dl->gate_exps.stride,
            .ids = m->arena ? m->slot_ids : m->sel,
            .rows = F, .k = E, .n_batch = K, .xq = xq, .y = m->g, .y_stride = (size_t)F,
            .w2 = dl->up_exps.d, .y2 = m->u,
        };
        a.x_early = own_norm;   /* xq: written by the router, before the top-k */
        STAGE(CUDA_STAGE_GATE_UP, cuda_matvec_batch(cu, &a, e));
    } else {
        STAGE(CUDA_STAGE_GATE_UP, mv_experts(m, &dl->gate_exps, xq, 0, m->g, (size_t)F, 0, e));
        if (!same_dot(&dl->up_exps, &dl->gate_exps)) TRY(act_in(m, &dl->up_exps, m->xn, 1, &xq, e));
        STAGE(CUDA_STAGE_GATE_UP, mv_experts(m, &dl->up_exps, xq, 0, m->u, (size_t)F, 1, e));   /* ids: 2+ back */
    }
    /* down: each expert its own hidden row h = swiglu(g, u); for a Q8_K or
     * Q8_0 dot type the matvec's CTAs compute and quantize it (xquant), for
     * Q8_1 the quantizer's launch does */
    if (cuda_matvec_xquant_ok(dl->down_exps.mvtype)) {
        cuda_matvec_args a = {
            .wtype = dl->down_exps.mvtype, .w = dl->down_exps.d, .w_stride = dl->down_exps.stride,
            .ids = m->arena ? m->slot_ids : m->sel, .rows = dl->down_exps.rows, .k = dl->down_exps.k,
            .n_batch = K, .xq = m->g, .x_stride = sizeof(float) * (size_t)F, .y = m->eout, .y_stride = (size_t)E,
            .ids_early = 1, .xquant = CUDA_XQ_SWIGLU, .xu = m->u,   /* ids: written before gate+up */
        };
        STAGE(CUDA_STAGE_DOWN, cuda_matvec_batch(cu, &a, e));
    } else {
        if (q8_dot(&dl->down_exps)) {
            STAGE(CUDA_STAGE_DOWN_QUANT, cuda_act_quant_swiglu(cu, dl->down_exps.type, m->g, m->u, m->xq, F, K, e));
            xq = m->xq;
        } else {
            STAGE(CUDA_STAGE_DOWN_QUANT, cuda_swiglu(cu, m->g, m->g, m->u, (int64_t)K * F, e));
            xq = m->xq;
            STAGE(CUDA_STAGE_DOWN_QUANT, act_in(m, &dl->down_exps, m->g, K, &xq, e));
        }
        const size_t hstride = dl->down_exps.act_f32 ? sizeof(float) * (size_t)F : dl->down_exps.act_bytes;
        /* the ids were written before gate+up and the quantizer: 2+ launches back */
        STAGE(CUDA_STAGE_DOWN, mv_experts(m, &dl->down_exps, xq, hstride, m->eout, (size_t)E, 1, e));
    }
    /* everything of this layer that reads m->xn or m->xq is enqueued
     * above, so the next norm may overwrite them here */
    if (next_norm)
        STAGE(CUDA_STAGE_COMBINE, cuda_moe_combine_rmsnorm_quant(cu, next_w->type, m->x, m->eout, m->selw, K, m->xn,
                                                                 m->xq, next_norm, E, hp->rms_eps, e));
    else STAGE(CUDA_STAGE_COMBINE, cuda_moe_combine(cu, m->x, m->eout, m->selw, 1, K, E, e));
    if (m->pf_n) arena_prefetch_host(m, l);   /* host side: copies expert weights, never xn / xq */
    return 0;
}

/* ==== Prompt chunks ====
 * Row at a time, every row reads every weight it uses again (and, with an
 * arena, every routed expert of every row is a lookup and a miss is copied
 * for that row alone). A chunk of nr rows instead runs layer by layer: the
 * dense projections as grouped matmuls (cuda_matmul: the weights read once
 * per 8 rows), the rows' Q/K norm + RoPE + KV store in one launch, then
 * the chunk's attention in one launch (row i over positions 0..p0 + i, with a one-row
 * call's launch shape: cuda_attention_rows), then the MoE:
 * all rows routed, one ids download, one lookup and one copy per distinct
 * expert (arena), the rows routed to each expert multiplied by it in
 * groups of 8. Per row the arithmetic is the row path's, kernel for kernel
 * (cuda_matmul is bit-identical to the matvec; norms, quantization, top-k,
 * combine per row; the residual add of Wo as its own add, which is what the
 * fused store computes), so results are bit-identical to rows one at a
 * time. */

/* The chunk's dense item lists for nr rows: groups of CUDA_MM_NB
 * consecutive rows (xrow = the row, -1 past nr) and their output offsets
 * for row strides q, k/v, n_embd and n_expert; uploaded once a chunk. */
static int chunk_dense_items(cuda_model *m, int nr, err *e)
{
    const int NB = CUDA_MM_NB, ni = (nr + NB - 1) / NB;
    const size_t n = (size_t)ni * NB, oy = align8(sizeof(int32_t) * n);
    const int64_t qd = (int64_t)m->hp.n_head * m->hp.head_dim, kvd = (int64_t)m->hp.n_head_kv * m->hp.head_dim;
    int32_t *xr = (int32_t *)m->hdense;
    int64_t *yo = (int64_t *)(m->hdense + oy);
    for (size_t g = 0; g < n; g++) {
        const int r = g < (size_t)nr ? (int)g : -1;
        xr[g] = r;
        yo[g] = r < 0 ? 0 : r * qd;
        yo[n + g] = r < 0 ? 0 : r * kvd;
        yo[2 * n + g] = r < 0 ? 0 : (int64_t)r * m->hp.n_embd;
        yo[3 * n + g] = r < 0 ? 0 : (int64_t)r * m->hp.n_expert;
    }
    /* one item of row 0 alone (the last layer's MoE for the head row) */
    int64_t *oney = yo + 4 * n;
    int32_t *onex = (int32_t *)(oney + NB);
    for (int j = 0; j < NB; j++) { oney[j] = 0; onex[j] = j ? -1 : 0; }
    const size_t bytes = oy + sizeof(int64_t) * (4 * n + NB) + sizeof(int32_t) * NB;
    m->cd_xrow = (int32_t *)m->cdense;
    m->cd_yq = (int64_t *)(m->cdense + oy);
    m->cd_ykv = m->cd_yq + n;
    m->cd_ye = m->cd_ykv + n;
    m->cd_yr = m->cd_ye + n;
    m->cd_zero = m->cd_yr + n;
    m->cd_last = (int32_t *)(m->cd_zero + NB);
    m->cd_items = ni;
    return cuda_upload(m->cu, m->cdense, m->hdense, bytes, e);
}

/* y = W x for the chunk's rows (xq rows of x_stride bytes), the rows'
 * outputs at yoff (one of the cd_y* lists) plus base. */
static int mm_dense(cuda_model *m, const dmat *w, const void *xq, size_t x_stride, const int64_t *yoff, float *y,
                    err *e)
{
    cuda_matmul_args a = {
        .wtype = w->mvtype, .w = w->d, .rows = w->rows, .k = w->k, .n_items = m->cd_items, .xq = xq,
        .x_stride = x_stride, .xrow = m->cd_xrow, .yoff = yoff, .y = y,
    };
    return cuda_matmul(m->cu, &a, e);
}

/* The chunk's rows quantized for w (or the floats themselves): *xq, *xs. */
static int chunk_act(cuda_model *m, const dmat *w, const float *x, int nr, uint8_t *buf, const void **xq, size_t *xs,
                     err *e)
{
    if (w->act_f32) { *xq = x; *xs = sizeof(float) * (size_t)w->k; return 0; }
    TRY(cuda_act_quant(m->cu, w->type, x, buf, w->k, nr, e));
    *xq = buf;
    *xs = w->act_bytes;
    return 0;
}

/* Attention half of layer l for the chunk's rows at positions p0..: `full`
 * rows get Wo and the residual (all, or none: the last layer of a chunk
 * without logits stores its K/V only; with logits it runs whole, the row
 * path's last row plus harmless work for the others). */
static int layer_attn_chunk(cuda_model *m, int l, int p0, int nr, int full, err *e)
{
    const hparams *hp = &m->hp;
    const dlayer *dl = &m->layers[l];
    const int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const size_t qd = (size_t)H * D, kvd = (size_t)Hkv * D;
    cuda_ctx *cu = m->cu;
    float *cq = m->cqkv, *ck = cq + (size_t)m->nc * qd, *cv = ck + (size_t)m->nc * kvd;
    TRY(cuda_rmsnorm(cu, m->cxn, m->cx, dl->attn_norm, E, nr, hp->rms_eps, e));
    /* q, k and v each as rows of their own buffer (the attention reads q
     * rows of n_head * head_dim) */
    const void *xq;
    size_t xs;
    TRY(chunk_act(m, &dl->wq, m->cxn, nr, m->cxq, &xq, &xs, e));
    TRY(mm_dense(m, &dl->wq, xq, xs, m->cd_yq, cq, e));
    if (!same_dot(&dl->wk, &dl->wq)) TRY(chunk_act(m, &dl->wk, m->cxn, nr, m->cxq, &xq, &xs, e));
    TRY(mm_dense(m, &dl->wk, xq, xs, m->cd_ykv, ck, e));
    if (!same_dot(&dl->wv, &dl->wk)) TRY(chunk_act(m, &dl->wv, m->cxn, nr, m->cxq, &xq, &xs, e));
    TRY(mm_dense(m, &dl->wv, xq, xs, m->cd_ykv, cv, e));
    TRY(cuda_qk_norm_rope_store_rows(cu, cq, ck, cv, nr, dl->q_norm, dl->k_norm, H, Hkv, D, hp->n_rot, m->pos + p0,
                                     hp->rope_freq_base, hp->rope_freq_scale, hp->rms_eps, dl->k_cache, dl->v_cache,
                                     m->kv_f16, e));
    if (!full) return 0;
    /* every row's K/V is stored: the chunk's attention in one launch, each
     * row over positions 0..p0 + i, as a one-row call would compute it */
    TRY(cuda_attention_rows(cu, m->catt, cq, nr, H, Hkv, D, dl->k_cache, m->kv_f16, dl->v_cache, m->kv_f16,
                            m->pos + p0, p0, 1.0f / sqrtf((float)D), e));
    /* x = x + Wo . att (the row path adds inside the matvec's store: the same sum) */
    TRY(chunk_act(m, &dl->wo, m->catt, nr, m->cxq, &xq, &xs, e));
    TRY(mm_dense(m, &dl->wo, xq, xs, m->cd_ye, m->ceout, e));
    return cuda_add(cu, m->cx, m->cx, m->ceout, (int64_t)nr * E, e);
}

/* The chunk's routing of layer l (m->csel, nr x k, on the device) to the
 * host; with the arena each distinct expert gets a slot (one lookup, a
 * miss copied once; nr * k <= n_slots, so they all fit at once), else the
 * matrices are the expert ids. Then the expert items: the rows routed to
 * each matrix in groups of CUDA_MM_NB (first-seen order), uploaded. */
static int chunk_route(cuda_model *m, int l, int nr, err *e)
{
    const int K = m->hp.n_expert_used, NE = m->hp.n_expert, nk = nr * K, NB = CUDA_MM_NB;
    TRY(cuda_download(m->cu, m->hsel, m->csel, sizeof(int32_t) * (size_t)nk, e));
    TRY(check_ids(l, m->hsel, nk, NE, e));
    if (m->arena) {   /* nk <= n_slots: every expert of the chunk fits at once */
        const int nm = arena_lookup(m, l, m->hsel, nk, ++m->tick, m->hslot, m->hmiss);
        TRY(arena_fill(m, l, m->hmiss, nm, e));
    } else {
        memcpy(m->hslot, m->hsel, sizeof(int32_t) * (size_t)nk);
    }
    /* group (row, t) by matrix (first-seen order): counts, then each
     * group's items of up to CUDA_MM_NB members */
    int ng = 0;
    for (int b = 0; b < nk; b++) {
        const int mat = m->hslot[b];
        if (m->hgrp[mat] < 0) { m->hgrp[mat] = ng; m->hgmat[ng] = mat; m->hgcnt[ng] = 0; ng++; }
        m->hgcnt[m->hgrp[mat]]++;
    }
    size_t items = 0;
    for (int g = 0; g < ng; g++) {
        const int c = m->hgcnt[g], ni = (c + NB - 1) / NB;
        m->hgcnt[g] = (int)(items * NB);   /* next free member of group g */
        for (int i = 0; i < ni; i++) m->hitem[items + i] = m->hgmat[g];
        items += (size_t)ni;
    }
    int32_t *xg = m->hitem + items, *xd = xg + items * NB;
    const size_t oy = align8(sizeof(int32_t) * (items + 2 * items * NB));
    int64_t *yg = (int64_t *)((uint8_t *)m->hitem + oy), *yd = yg + items * NB;
    for (size_t i = 0; i < items * NB; i++) { xg[i] = -1; xd[i] = -1; yg[i] = 0; yd[i] = 0; }
    for (int b = 0; b < nk; b++) {
        const int g = m->hgrp[m->hslot[b]], o = m->hgcnt[g]++;
        xg[o] = b / K;                                   /* the row's gate/up input */
        xd[o] = b;                                       /* its hidden row (row * k + t) */
        yg[o] = (int64_t)b * m->hp.n_ff_exp;
        yd[o] = (int64_t)b * m->hp.n_embd;
    }
    for (int g = 0; g < ng; g++) m->hgrp[m->hgmat[g]] = -1;
    m->cx_items = (int)items;
    TRY(cuda_upload(m->cu, m->citem, m->hitem, chunk_item_bytes(items), e));
    m->ci_ids = (const int32_t *)m->citem;
    m->ci_xg = m->ci_ids + items;
    m->ci_xd = m->ci_xg + items * NB;
    m->ci_yg = (const int64_t *)(m->citem + oy);
    m->ci_yd = m->ci_yg + items * NB;
    return 0;
}

/* One expert stack over the chunk's expert items. */
static int mm_experts(cuda_model *m, const dmat *w, const void *xq, size_t x_stride, const int32_t *xrow,
                      const int64_t *yoff, float *y, err *e)
{
    cuda_matmul_args a = {
        .wtype = w->mvtype, .w = w->d, .w_stride = w->stride, .ids = m->ci_ids, .rows = w->rows, .k = w->k,
        .n_items = m->cx_items, .xq = xq, .x_stride = x_stride, .xrow = xrow, .yoff = yoff, .y = y,
    };
    return cuda_matmul(m->cu, &a, e);
}

/* MoE half of layer l for the chunk's rows r0..r0+nr-1 (the last layer of a
 * chunk with logits: only its last row). */
static int layer_moe_chunk(cuda_model *m, int l, int r0, int nr, err *e)
{
    const hparams *hp = &m->hp;
    const dlayer *dl = &m->layers[l];
    const int E = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
    cuda_ctx *cu = m->cu;
    float *x = m->cx + (size_t)r0 * E;
    TRY(cuda_rmsnorm(cu, m->cxn, x, dl->ffn_norm, E, nr, hp->rms_eps, e));
    const void *xq;
    size_t xs;
    TRY(chunk_act(m, &dl->gate_inp, m->cxn, nr, m->cxq, &xq, &xs, e));
    {
        cuda_matmul_args a = {
            .wtype = dl->gate_inp.mvtype, .w = dl->gate_inp.d, .rows = dl->gate_inp.rows, .k = dl->gate_inp.k,
            .n_items = (nr + CUDA_MM_NB - 1) / CUDA_MM_NB, .xq = xq, .x_stride = xs, .xrow = m->cd_xrow,
            .yoff = m->cd_yr, .y = m->crouter,
        };
        /* rows r0.. of the dense lists: r0 is 0 or the last row alone */
        if (r0) {
            a.n_items = 1;
            a.xrow = m->cd_last;
            a.yoff = m->cd_zero;
        }
        TRY(cuda_matmul(cu, &a, e));
    }
    TRY(cuda_router_topk(cu, m->crouter, hp->n_expert, K, nr, m->csel, m->cselw, e));
    TRY(chunk_route(m, l, nr, e));
    const void *xg, *xu;
    size_t sg, su;
    TRY(chunk_act(m, &dl->gate_exps, m->cxn, nr, m->cxq, &xg, &sg, e));
    if (same_dot(&dl->up_exps, &dl->gate_exps)) { xu = xg; su = sg; }
    else TRY(chunk_act(m, &dl->up_exps, m->cxn, nr, m->cxq2, &xu, &su, e));
    TRY(mm_experts(m, &dl->gate_exps, xg, sg, m->ci_xg, m->ci_yg, m->cg, e));
    TRY(mm_experts(m, &dl->up_exps, xu, su, m->ci_xg, m->ci_yg, m->cup, e));
    /* down: item (i, t)'s hidden row h = swiglu(g, u) at i * k + t */
    const void *xd;
    size_t sd;
    if (q8_dot(&dl->down_exps)) {
        TRY(cuda_act_quant_swiglu(cu, dl->down_exps.type, m->cg, m->cup, m->cxqd, F, nr * K, e));
        xd = m->cxqd;
        sd = dl->down_exps.act_bytes;
    } else {
        TRY(cuda_swiglu(cu, m->cg, m->cg, m->cup, (int64_t)nr * K * F, e));
        TRY(chunk_act(m, &dl->down_exps, m->cg, nr * K, m->cxqd, &xd, &sd, e));
    }
    TRY(mm_experts(m, &dl->down_exps, xd, sd, m->ci_xd, m->ci_yd, m->ceout, e));
    return cuda_moe_combine(cu, x, m->ceout, m->cselw, nr, K, E, e);
}

/* nr prompt rows (tokens tok[0..nr) on the device, positions p0..) layer
 * by layer. As row(): the last layer runs completely only when the chunk's
 * last row's logits are wanted (`head`), and its MoE only for that row. */
static int chunk_rows(cuda_model *m, const int32_t *tok, int p0, int nr, int head, err *e)
{
    const hparams *hp = &m->hp;
    const int E = hp->n_embd, L = hp->n_layer;
    TRY(chunk_dense_items(m, nr, e));
    TRY(cuda_get_rows(m->cu, m->tok_embd.type, m->tok_embd.d, m->tok_embd.row_bytes, m->tok_embd.rows, E, tok, nr,
                      m->cx, NULL, e));
    for (int l = 0; l < L; l++) {
        const int last = l == L - 1;
        TRY(layer_attn_chunk(m, l, p0, nr, !last || head, e));
        if (!last) TRY(layer_moe_chunk(m, l, 0, nr, e));
        else if (head) TRY(layer_moe_chunk(m, l, nr - 1, 1, e));
    }
    if (!head) return 0;
    TRY(cuda_rmsnorm(m->cu, m->xn, m->cx + (size_t)(nr - 1) * E, m->output_norm, E, 1, hp->rms_eps, e));
    return mv(m, &m->output, m->xn, m->logits, e);
}

/* One row: the token at *tok, position *pos (device pointers). `record` copies the residual
 * after each layer to m->layer_out (and runs the last layer completely);
 * `head` writes the logits to m->logits. Without either, the last layer
 * stops after its K/V store: nothing else of it feeds the cache.
 * Each layer's combine also runs the norm that follows it when that norm
 * is a cuda_rmsnorm_quant (the next layer's attention norm, attn_norm_q8;
 * the output norm when the head's input is Q8 blocks): `normed` carries
 * that to the next step, which then starts at its matvec. The graphs
 * capture this same sequence. */
static int row(cuda_model *m, const int32_t *tok, const int32_t *pos, int n_kv_max, int record, int head, err *e)
{
    const hparams *hp = &m->hp;
    const int E = hp->n_embd, L = hp->n_layer;
    TRY(cuda_get_rows(m->cu, m->tok_embd.type, m->tok_embd.d, m->tok_embd.row_bytes, m->tok_embd.rows, E, tok, 1,
                      m->x, NULL, e));
    int normed = 0;   /* m->xn / m->xq hold the norm of m->x that comes next */
    for (int l = 0; l < L; l++) {
        const int full = l < L - 1 || record || head;
        TRY(layer_attn(m, l, pos, n_kv_max, full, normed, e));
        if (!full) break;
        const float *nn = NULL;
        const dmat *nw = NULL;
        if (l + 1 < L && attn_norm_q8(&m->layers[l + 1])) {
            nn = m->layers[l + 1].attn_norm;
            nw = &m->layers[l + 1].wq;
        } else if (l + 1 == L && head && q8_dot(&m->output)) {
            nn = m->output_norm;
            nw = &m->output;
        }
        TRY(layer_moe(m, l, nn, nw, e));
        normed = nn != NULL;
        if (record) {   /* x is the combine's output either way */
            const size_t K = (size_t)hp->n_expert_used;
            TRY(cuda_copy_d2d(m->cu, m->layer_out + (size_t)l * E, m->x, sizeof(float) * (size_t)E, e));
            TRY(cuda_copy_d2d(m->cu, m->layer_sel + (size_t)l * K, m->sel, sizeof(int32_t) * K, e));
        }
    }
    if (!head) return 0;
    /* the output norm: in the last combine's launch, or here */
    if (normed) return mvq(m, &m->output, m->xq, m->logits, e);
    TRY(cuda_rmsnorm(m->cu, m->xn, m->x, m->output_norm, E, 1, hp->rms_eps, e));
    return mv(m, &m->output, m->xn, m->logits, e);
}

static int capture(cuda_model *m, int kind, int bucket, cuda_graph **g, err *e);

/* Replay the graph of `kind` (capture's) for the row at position p: the
 * one of its attention bucket (context p + 1) in graphs[], captured first
 * if missing. */
static int replay(cuda_model *m, int kind, cuda_graph **graphs, int p, err *e)
{
    const int b = cuda_attention_bucket(p + 1);
    if (!graphs[b]) TRY(capture(m, kind, b, &graphs[b], e));
    return cuda_graph_launch(m->cu, graphs[b], e);
}

/* Rows of a prompt chunk (< 2: row at a time). */
static int chunk_cap(const cuda_model *m) { return m->nc_set && m->nc_set < m->nc ? m->nc_set : m->nc; }

int cuda_model_eval(cuda_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e)
{
    if (n < 1 || pos0 < 0 || pos0 > m->n_ctx - n)
        return err_setf(e, ERR_RANGE, "cuda_model_eval: %d rows at position %d do not fit n_ctx %d", n, pos0,
                        m->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->hp.n_vocab)
            return err_setf(e, ERR_RANGE, "cuda_model_eval: token id %d out of range (n_vocab %d)", (int)ids[i],
                            m->hp.n_vocab);
    TRY(cuda_upload(m->cu, m->tok + pos0, ids, sizeof(int32_t) * (size_t)n, e));
    m->have_layer_out = 0;
    if (n > 1 && !m->record && chunk_cap(m) >= 2) {   /* a prompt: chunks */
        const int nc = chunk_cap(m);
        for (int off = 0; off < n; off += nc) {
            const int nr = n - off < nc ? n - off : nc;
            TRY(chunk_rows(m, m->tok + pos0 + off, pos0 + off, nr, off + nr == n && logits, e));
        }
    } else if (m->use_graph && !m->record) {
        const int32_t slots[2] = { ids[0], pos0 };
        TRY(cuda_upload(m->cu, m->step, slots, sizeof slots, e));
        for (int i = 0; i < (logits ? n - 1 : n); i++) TRY(replay(m, 0, m->graph_row, pos0 + i, e));
        if (logits) TRY(replay(m, 1, m->graph_head, pos0 + n - 1, e));
    } else {
        for (int i = 0; i < n; i++) {
            const int last = i == n - 1;
            TRY(row(m, m->tok + pos0 + i, m->pos + pos0 + i, pos0 + i + 1, last && m->record, last && logits, e));
        }
        m->have_layer_out = m->record;
    }
    TRY(host_flush(m, e));
    if (logits) TRY(cuda_download(m->cu, logits, m->logits, sizeof(float) * (size_t)m->hp.n_vocab, e));
    else TRY(cuda_sync(m->cu, e));
    return 0;
}

/* Capture into *g one row at token step[0] and position step[1] (whose
 * attention bucket, position + 1, is `bucket`):
 *   kind 0  a prompt row without logits, then step_next (the next row's
 *           token and position into the slots);
 *   kind 1  a row with logits (m->logits);
 *   kind 2  a greedy step: logits, their argmax to step[0], then
 *           tok[step[1] + 1] = step[0] and step[1] += 1. */
static int capture(cuda_model *m, int kind, int bucket, cuda_graph **g, err *e)
{
    TRY(cuda_graph_begin(m->cu, e));
    int rc = row(m, m->step, m->step + 1, cuda_attention_bucket_end(bucket), 0, kind > 0, e);
    if (!rc && kind == 0) rc = cuda_step_next(m->cu, m->step, m->step + 1, m->tok, e);
    if (!rc && kind == 2) rc = cuda_argmax(m->cu, m->step, m->logits, 1, m->hp.n_vocab, e);
    if (!rc && kind == 2) rc = cuda_step_advance(m->cu, m->step, m->step + 1, m->tok, e);
    if (rc) {
        cuda_graph *dead = NULL;
        cuda_graph_end(m->cu, &dead, NULL);   /* ends the capture; the first error stays in e */
        cuda_graph_free(dead);
        return rc;
    }
    return cuda_graph_end(m->cu, g, e);
}

int cuda_model_greedy(cuda_model *m, int32_t first, int pos0, int n_steps, int32_t *out_ids, err *e)
{
    if (n_steps < 1 || pos0 < 0 || pos0 > m->n_ctx - n_steps)
        return err_setf(e, ERR_RANGE, "cuda_model_greedy: %d steps at position %d do not fit n_ctx %d", n_steps,
                        pos0, m->n_ctx);
    if (first < 0 || first >= m->hp.n_vocab)
        return err_setf(e, ERR_RANGE, "cuda_model_greedy: token id %d out of range (n_vocab %d)", (int)first,
                        m->hp.n_vocab);
    m->have_layer_out = 0;   /* the steps below do not record them */
    if (m->use_graph) {
        const int32_t slots[2] = { first, pos0 };
        TRY(cuda_upload(m->cu, m->step, slots, sizeof slots, e));
        for (int i = 0; i < n_steps; i++) TRY(replay(m, 2, m->graph, pos0 + i, e));
    } else {
        TRY(cuda_upload(m->cu, m->tok + pos0, &first, sizeof first, e));
        for (int i = 0; i < n_steps; i++) {
            const int p = pos0 + i;
            TRY(row(m, m->tok + p, m->pos + p, p + 1, 0, 1, e));
            /* the argmax is the next position's token (tok has n_ctx + 1 entries) */
            TRY(cuda_argmax(m->cu, m->tok + p + 1, m->logits, 1, m->hp.n_vocab, e));
        }
    }
    TRY(host_flush(m, e));
    return cuda_download(m->cu, out_ids, m->tok + pos0 + 1, sizeof(int32_t) * (size_t)n_steps, e);
}

void cuda_model_set_graph(cuda_model *m, int on) { m->use_graph = on != 0 && !m->arena; }

void cuda_model_set_record(cuda_model *m, int on) { m->record = on != 0; }

int cuda_model_graph_kernels(const cuda_model *m)
{
    for (int b = 0; b < CUDA_ATTN_BUCKETS; b++)
        if (m->graph[b]) return cuda_graph_kernels(m->graph[b]);
    return -1;
}

void cuda_model_set_chunk(cuda_model *m, int rows) { m->nc_set = rows > 0 ? rows : 0; }

void cuda_model_set_matvec(cuda_model *m, int mode)
{
    cuda_sync(m->cu, NULL);
    cuda_matvec_force(m->cu, mode);
    drop_graphs(m);
}

void cuda_model_set_skip(cuda_model *m, int stage)
{
    cuda_sync(m->cu, NULL);
    m->skip = stage > CUDA_STAGE_NONE && stage < CUDA_STAGE_COUNT ? stage : CUDA_STAGE_NONE;
    drop_graphs(m);
}

const char *cuda_model_stage_name(int stage)
{
    static const char *const names[CUDA_STAGE_COUNT] = {
        "none", "qkv", "rope", "attn", "wo_quant", "wo", "ffn_norm", "router", "topk", "gate_up", "down_quant",
        "down", "combine",
    };
    return stage >= 0 && stage < CUDA_STAGE_COUNT ? names[stage] : "?";
}

cuda_ctx *cuda_model_cuda(cuda_model *m) { return m->cu; }

void cuda_model_set_pdl(cuda_model *m, int on)
{
    cuda_sync(m->cu, NULL);
    cuda_set_pdl(m->cu, on);
    drop_graphs(m);
}

void cuda_model_set_attention(cuda_model *m, int cluster, int heads)
{
    cuda_sync(m->cu, NULL);
    cuda_attention_force_cluster(m->cu, cluster);
    cuda_attention_force_heads(m->cu, heads);
    drop_graphs(m);
}

int cuda_model_layer_outputs(cuda_model *m, float *out, err *e)
{
    if (!m->have_layer_out)
        return err_setf(e, ERR_USAGE, "cuda_model_layer_outputs: no cuda_model_eval since open or the last greedy");
    return cuda_download(m->cu, out, m->layer_out, sizeof(float) * (size_t)m->hp.n_layer * (size_t)m->hp.n_embd, e);
}

int cuda_model_layer_experts(cuda_model *m, int32_t *out, err *e)
{
    if (!m->have_layer_out)
        return err_setf(e, ERR_USAGE, "cuda_model_layer_experts: no recorded eval (cuda_model_set_record)");
    return cuda_download(m->cu, out, m->layer_sel,
                         sizeof(int32_t) * (size_t)m->hp.n_layer * (size_t)m->hp.n_expert_used, e);
}

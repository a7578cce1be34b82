/* qwen3moe: the forward pass (see qwen3moe.h for the model and numerics).
 *
 * Structure: qwen3moe_forward walks the layers and calls small stages; each
 * stage that is worth splitting runs as one thread-pool job whose context
 * struct names its inputs and outputs. Row-major buffers everywhere: row i of
 * the chunk is buf + i * width. Rows [r0, n) are the ones whose output is
 * still needed; r0 > 0 only in the last layer, whose attention output and
 * MoE matter only for the rows that produce logits (llama.cpp drops the
 * other rows there too, with inp_out_ids).
 *
 * Matmuls: each thread takes a contiguous range of a weight's output rows
 * and runs quant_gemm over it and every input row: the kernel blocks for
 * registers and cache, and each output stays one dot of one weight row with
 * one quantized input row (bit-identical to the plain dot). */
#include "model/qwen3moe.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops.h"
#include "util/fp16.h"
#include "util/timer.h"

/* ==== Scratch ==== */

/* Quantized input rows: row i at base + i * stride. */
typedef struct act_rows { const uint8_t *base; size_t stride; } act_rows;

/* Weight rows per MoE queue item (moe_fn): gate+up items of 128 rows, down
 * items of 256 (an expert of the 30b-a3b shape is then 6 + 8 items, still
 * several per thread). Longer items are longer sequential weight streams
 * (the hardware prefetchers ramp up once per item) and fewer hand-offs:
 * against 32 / 64 rows, Zen 4, 30b-a3b cut to 16 layers, 3 alternating
 * rounds, tg64 2 threads 37.5 -> 41.6 tok/s, pp512 126.3 -> 134.8; 1 thread
 * +1-2%; 256 / 512 rows measured the same as 128 / 256. */
enum { MOE_GU_ROWS = 128, MOE_DN_ROWS = 256 };

typedef struct moe_job {
    const qwen3moe *m; const layer_weights *lw; qwen3moe_scratch *s;
    int layer;
    const int32_t *ex; int n_ex;    /* the wave, in the source's order */
    act_rows xg, xu;                /* gathered inputs for gate / up */
    int down_f32;
    int n_gu, n_dn;                 /* items per expert */
    long n_items;
    atomic_int next;                /* the next item to take */
    atomic_int failed;              /* set once by the first failing thread */
    int fail_rc;
    err fail_err;
} moe_job;


struct qwen3moe_scratch {
    int      n_batch, n_ctx, n_threads;
    float   *x;        /* (n_batch, n_embd) residual stream */
    float   *xn;       /* (n_batch, n_embd) normed rows / matmul outputs */
    float   *q;        /* (n_batch, n_head*head_dim) */
    float   *k;        /* (n_batch, n_head_kv*head_dim) */
    float   *v;        /* (n_batch, n_head_kv*head_dim) */
    float   *att;      /* (n_batch, n_head*head_dim) attention output */
    uint8_t *qa;       /* (n_batch, 4*max(n_embd, n_head*head_dim)) bytes: quantized inputs */
    uint8_t *qb;       /* same size: a second input quantization (up vs gate) */
    float   *router;   /* (n_batch, n_expert) logits, then probabilities */
    int32_t *sel;      /* (n_batch, n_expert_used) chosen experts, top-k order */
    float   *selw;     /* (n_batch, n_expert_used) their weights */
    int32_t *cnt;      /* (n_expert + 1) rows per expert, then offsets */
    int32_t *fill;     /* (n_expert) fill cursors */
    int32_t *used;     /* (n_expert) distinct experts of the chunk, ascending */
    int32_t *list;     /* (n_batch*n_expert_used) row-slots r = i*k + s grouped by expert */
    int32_t *pos;      /* (n_batch*n_expert_used) row-slot -> its list position */
    uint8_t *xgg;      /* (n_batch*n_expert_used) gate inputs in list order (gate act_bytes each) */
    uint8_t *xug;      /* same for up, when up's dot type differs from gate's */
    float   *h;        /* (n_batch*n_expert_used, n_ff_exp) gate outputs, then hidden rows, list order */
    float   *u;        /* (n_batch*n_expert_used, n_ff_exp) up outputs, list order */
    uint8_t *hq;       /* (n_batch*n_expert_used) h quantized for down (down act_bytes each) */
    float   *eout;     /* (n_batch*n_expert_used, n_embd) weighted expert outputs, list order */
    atomic_int *xres;  /* (n_expert) wave entry i known resident */
    atomic_int *xleft; /* (n_expert) its gate/up items not yet done */
    atomic_int *xready;/* (n_expert) its hidden rows ready for down */
    moe_job  moe;      /* the MoE job (holds atomics) */
    float   *scores;   /* (n_threads, OPS_ATTN_TILE * n_ctx) attention scores */
    float   *rope;     /* (n_threads, head_dim) RoPE cos/sin */
    float   *pxn;      /* (n_batch, n_embd) read-ahead: rows normed for the next layer */
    uint8_t *pqa;      /* (n_batch, 4*n_embd) bytes: them quantized for its router */
    float   *pred;     /* (n_batch, n_expert) its router logits */
    int32_t *ptop;     /* (n_expert) one row's top-N */
    int32_t *pvotes;   /* (n_expert) rows choosing each expert */
    int32_t *pset;     /* (n_expert) the guess, most voted first */
    qwen3moe_chunk chunk;     /* where the current chunk sits (set_chunk) */
    qwen3moe_stats stats[2];  /* per phase */
    int      planning; /* scratch_alloc only counts (qwen3moe_scratch_plan) */
    uint64_t bytes;
    route_work rw;     /* routing policy buffers (route.h): logit, exact, mask, seen (n_expert each), key (k) */
    qwen3moe_layer_fn on_layer;   /* optional observer (qwen3moe_scratch_set_on_layer) */
    void    *on_layer_ctx;
};

static void *scratch_alloc(qwen3moe_scratch *s, size_t n, int *fail)
{
    if (n == 0) n = 1;
    s->bytes += n;
    if (s->planning) return NULL;
    void *p = malloc(n);
    if (!p) *fail = 1;
    return p;
}

/* Every buffer, in one place, for both allocating and planning. */
static void scratch_carve(qwen3moe_scratch *s, const qwen3moe *m, int n_batch, int n_ctx, int *fail)
{
    const hparams *hp = m->hp;
    const size_t B = (size_t)n_batch, E = (size_t)hp->n_embd, D = (size_t)hp->head_dim;
    const size_t QD = (size_t)hp->n_head * D, KVD = (size_t)hp->n_head_kv * D;
    const size_t X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, F = (size_t)hp->n_ff_exp;
    const size_t T = (size_t)tpool_size(m->pool);
    const size_t wide = E > QD ? E : QD;
    s->n_batch = n_batch;
    s->n_ctx = n_ctx;
    s->n_threads = (int)T;
    s->x      = scratch_alloc(s, sizeof(float) * B * E, fail);
    s->xn     = scratch_alloc(s, sizeof(float) * B * E, fail);
    s->q      = scratch_alloc(s, sizeof(float) * B * QD, fail);
    s->k      = scratch_alloc(s, sizeof(float) * B * KVD, fail);
    s->v      = scratch_alloc(s, sizeof(float) * B * KVD, fail);
    s->att    = scratch_alloc(s, sizeof(float) * B * QD, fail);
    s->qa     = scratch_alloc(s, 4 * B * wide, fail);
    s->qb     = scratch_alloc(s, 4 * B * wide, fail);
    s->router = scratch_alloc(s, sizeof(float) * B * X, fail);
    s->sel    = scratch_alloc(s, sizeof(int32_t) * B * K, fail);
    s->selw   = scratch_alloc(s, sizeof(float) * B * K, fail);
    s->cnt    = scratch_alloc(s, sizeof(int32_t) * (X + 1), fail);
    s->fill   = scratch_alloc(s, sizeof(int32_t) * X, fail);
    s->used   = scratch_alloc(s, sizeof(int32_t) * X, fail);
    s->list   = scratch_alloc(s, sizeof(int32_t) * B * K, fail);
    /* the widest activation rows any layer's experts take */
    size_t gact = 1, uact = 1, dact = 1;
    int split_gu = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_weights *lw = &m->w->layers[l];
        if (lw->gate_exps.act_bytes > gact) gact = lw->gate_exps.act_bytes;
        if (lw->up_exps.act_bytes > uact) uact = lw->up_exps.act_bytes;
        if (lw->down_exps.act_bytes > dact) dact = lw->down_exps.act_bytes;
        if (lw->up_exps.ops.dot_type != lw->gate_exps.ops.dot_type) split_gu = 1;
    }
    s->pos    = scratch_alloc(s, sizeof(int32_t) * B * K, fail);
    s->xgg    = scratch_alloc(s, gact * B * K, fail);
    s->xug    = split_gu ? scratch_alloc(s, uact * B * K, fail) : NULL;
    s->h      = scratch_alloc(s, sizeof(float) * B * K * F, fail);
    s->u      = scratch_alloc(s, sizeof(float) * B * K * F, fail);
    s->hq     = scratch_alloc(s, dact * B * K, fail);
    s->eout   = scratch_alloc(s, sizeof(float) * B * K * E, fail);
    s->xres   = scratch_alloc(s, sizeof(atomic_int) * X, fail);
    s->xleft  = scratch_alloc(s, sizeof(atomic_int) * X, fail);
    s->xready = scratch_alloc(s, sizeof(atomic_int) * X, fail);
    s->scores = scratch_alloc(s, sizeof(float) * T * OPS_ATTN_TILE * (size_t)n_ctx, fail);
    s->rope   = scratch_alloc(s, sizeof(float) * T * D, fail);
    if (m->read_ahead > 0) {
        s->pxn    = scratch_alloc(s, sizeof(float) * B * E, fail);
        s->pqa    = scratch_alloc(s, 4 * B * E, fail);
        s->pred   = scratch_alloc(s, sizeof(float) * B * X, fail);
        s->ptop   = scratch_alloc(s, sizeof(int32_t) * X, fail);
        s->pvotes = scratch_alloc(s, sizeof(int32_t) * X, fail);
        s->pset   = scratch_alloc(s, sizeof(int32_t) * X, fail);
    }
    s->rw.logit      = scratch_alloc(s, sizeof(float) * X, fail);
    s->rw.key        = scratch_alloc(s, sizeof(double) * K, fail);
    s->rw.exact      = scratch_alloc(s, sizeof(int32_t) * K, fail);
    s->rw.mask       = scratch_alloc(s, X, fail);
    s->rw.seen       = scratch_alloc(s, X, fail);
    s->rw.seen_exact = scratch_alloc(s, X, fail);
}

int qwen3moe_scratch_open(qwen3moe_scratch **out, const qwen3moe *m, int n_batch, int n_ctx, err *e)
{
    *out = NULL;
    qwen3moe_scratch *s = calloc(1, sizeof *s);
    if (!s) return err_setf(e, ERR_NOMEM, "out of memory");
    int fail = 0;
    scratch_carve(s, m, n_batch, n_ctx, &fail);
    if (fail) {
        uint64_t want = s->bytes;
        qwen3moe_scratch_close(s);
        return err_setf(e, ERR_NOMEM, "cannot allocate %.1f MB of forward scratch (n_batch %d, n_ctx %d)",
                        (double)want / 1e6, n_batch, n_ctx);
    }
    *out = s;
    return 0;
}

uint64_t qwen3moe_scratch_plan(const qwen3moe *m, int n_batch, int n_ctx)
{
    qwen3moe_scratch s;
    memset(&s, 0, sizeof s);
    s.planning = 1;
    int fail = 0;
    scratch_carve(&s, m, n_batch, n_ctx, &fail);
    return s.bytes;
}

void qwen3moe_scratch_close(qwen3moe_scratch *s)
{
    if (!s) return;
    free(s->x); free(s->xn); free(s->q); free(s->k); free(s->v); free(s->att);
    free(s->qa); free(s->qb); free(s->router); free(s->sel); free(s->selw);
    free(s->cnt); free(s->fill); free(s->used); free(s->list);
    free(s->pos); free(s->xgg); free(s->xug); free(s->u); free(s->xres); free(s->xleft); free(s->xready);
    free(s->h); free(s->hq); free(s->eout); free(s->scores); free(s->rope);
    free(s->pxn); free(s->pqa); free(s->pred); free(s->ptop); free(s->pvotes); free(s->pset);
    free(s->rw.logit); free(s->rw.key); free(s->rw.exact); free(s->rw.mask); free(s->rw.seen); free(s->rw.seen_exact);
    free(s);
}

uint64_t qwen3moe_scratch_bytes(const qwen3moe_scratch *s) { return s ? s->bytes : 0; }

void qwen3moe_scratch_set_chunk(qwen3moe_scratch *s, const qwen3moe_chunk *c) { s->chunk = *c; }

void qwen3moe_scratch_set_on_layer(qwen3moe_scratch *s, qwen3moe_layer_fn fn, void *ctx)
{
    s->on_layer = fn;
    s->on_layer_ctx = ctx;
}

void qwen3moe_scratch_stats(const qwen3moe_scratch *s, int phase, qwen3moe_stats *out)
{
    memset(out, 0, sizeof *out);
    if (phase == 0 || phase == 1) *out = s->stats[phase];
}

/* ==== Parallel helpers ==== */

/* Run fn(ctx, i, ith) for i in [0, n): serially for tiny n (a pool wake-up
 * costs more than the work), else split in contiguous ranges. */
typedef void (*row_fn)(void *ctx, int i, int ith);
typedef struct rows_job { row_fn fn; void *ctx; int n; } rows_job;

static void rows_job_fn(void *p, int ith, int nth)
{
    rows_job *j = p;
    long lo, hi;
    tpool_split(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->fn(j->ctx, (int)i, ith);
}

static void run_rows(tpool *pool, int n, row_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (n < 4 || tpool_size(pool) == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    rows_job j = { fn, ctx, n };
    tpool_run(pool, rows_job_fn, &j);
}


typedef struct quant_job {
    const quant_ops *act; int64_t K;
    const float *x; size_t ldx;     /* floats between input rows */
    uint8_t *dst; size_t stride;    /* bytes between output rows */
} quant_job;

static void quant_row(void *p, int i, int ith)
{
    (void)ith;
    quant_job *j = p;
    j->act->quant(j->x + (size_t)i * j->ldx, j->dst + (size_t)i * j->stride, j->K);
}

/* Rows x[0..n) (ldx floats apart, K wide) in w's dot type. f32 dot types use
 * x in place; others are quantized into buf. */
static act_rows quantize_for(tpool *pool, const wtensor *w, const float *x, size_t ldx, int n, uint8_t *buf)
{
    act_rows a;
    if (w->ops.dot_type == QTYPE_F32) {
        a.base = (const uint8_t *)x;
        a.stride = ldx * sizeof(float);
        return a;
    }
    quant_job j = { &w->act, w->ne[0], x, ldx, buf, (size_t)w->act_bytes };
    run_rows(pool, n, quant_row, &j);
    a.base = buf;
    a.stride = (size_t)w->act_bytes;
    return a;
}

/* ==== Matmul: y[i][r] = dot(W row r, input row i) for several weights that
 * share one quantized input. ==== */

typedef struct mm_out { const wtensor *w; float *y; size_t ldy; } mm_out;

typedef struct mm_job {
    const mm_out *outs; int n_outs;
    act_rows in; int n_rows;
    long total;             /* sum of the weights' output rows */
} mm_job;

static void mm_fn(void *p, int ith, int nth)
{
    mm_job *j = p;
    long lo, hi;
    tpool_split(j->total, ith, nth, &lo, &hi);
    long base = 0;
    for (int t = 0; t < j->n_outs && base < hi; t++) {
        const mm_out *o = &j->outs[t];
        const wtensor *w = o->w;
        const long rows = (long)w->ne[1];
        long a = lo > base ? lo - base : 0, b = hi - base < rows ? hi - base : rows;
        if (a < b)
            quant_gemm(&w->ops, w->ne[0], w->data + (uint64_t)a * w->row_bytes, w->row_bytes, (int)(b - a),
                       j->in.base, j->in.stride, j->n_rows, o->y + a, o->ldy);
        base += rows;
    }
}

static void matmul(tpool *pool, const mm_out *outs, int n_outs, act_rows in, int n_rows)
{
    mm_job j = { outs, n_outs, in, n_rows, 0 };
    for (int t = 0; t < n_outs; t++) j.total += (long)outs[t].w->ne[1];
    if (n_rows == 1 && j.total < 64) { mm_fn(&j, 0, 1); return; }
    tpool_run(pool, mm_fn, &j);
}

/* ==== Stages ==== */

typedef struct norm_job { const float *x; float *y; const float *w; int n; float eps; } norm_job;

static void norm_row(void *p, int i, int ith)
{
    (void)ith;
    norm_job *j = p;
    ops_rmsnorm(j->y + (size_t)i * j->n, j->x + (size_t)i * j->n, j->w, j->n, j->eps);
}

/* Per-head q/k norms, RoPE and the K/V store for one row. */
typedef struct qk_job {
    const qwen3moe *m; const layer_weights *lw; const kv_cache_view *kv; qwen3moe_scratch *s;
    int layer, pos0;
} qk_job;

static void qk_row(void *p, int i, int ith)
{
    qk_job *j = p;
    const hparams *hp = j->m->hp;
    const int D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const size_t QD = (size_t)H * D, KVD = (size_t)Hkv * D;
    const int pos = j->pos0 + i;
    float *cache = j->s->rope + (size_t)ith * D;
    ops_rope_cache(cache, hp->n_rot, pos, hp->rope_freq_base, hp->rope_freq_scale);
    float *q = j->s->q + (size_t)i * QD;
    for (int h = 0; h < H; h++) {
        ops_rmsnorm(q + h * D, q + h * D, j->lw->q_norm, D, hp->rms_eps);
        ops_rope_neox(q + h * D, hp->n_rot, cache);
    }
    float *k = j->s->k + (size_t)i * KVD;
    for (int h = 0; h < Hkv; h++) {
        ops_rmsnorm(k + h * D, k + h * D, j->lw->k_norm, D, hp->rms_eps);
        ops_rope_neox(k + h * D, hp->n_rot, cache);
    }
    const float *v = j->s->v + (size_t)i * KVD;
    const kv_cache_view *kv = j->kv;
    if (kv->k_f16) {
        uint16_t *dk = (uint16_t *)kv->k[j->layer] + (size_t)pos * KVD;
        for (size_t d = 0; d < KVD; d++) dk[d] = fp32_to_fp16(k[d]);
    } else {
        memcpy((float *)kv->k[j->layer] + (size_t)pos * KVD, k, KVD * sizeof(float));
    }
    if (kv->v_f16) {
        uint16_t *dv = (uint16_t *)kv->v[j->layer] + (size_t)pos * KVD;
        for (size_t d = 0; d < KVD; d++) dv[d] = fp32_to_fp16(v[d]);
    } else {
        memcpy((float *)kv->v[j->layer] + (size_t)pos * KVD, v, KVD * sizeof(float));
    }
}

/* Attention of rows [r0, n) in (tile, head) items: a tile is up to
 * OPS_ATTN_TILE consecutive rows of one head, run by the tiled causal
 * kernel (each K/V row loaded once per tile, every output bit-identical to
 * the one-row kernel). Items are dealt round-robin (thread ith takes items
 * ith, ith + nth, ...): with a causal mask later tiles cost more, so
 * contiguous ranges would give the last thread most of the work. */
typedef struct attn_job {
    const qwen3moe *m; const kv_cache_view *kv; qwen3moe_scratch *s;
    int layer, pos0, r0, n; float scale;
} attn_job;

static void attn_item(attn_job *j, int idx, int ith)
{
    const hparams *hp = j->m->hp;
    const int D = hp->head_dim, H = hp->n_head, group = hp->n_head / hp->n_head_kv;
    const size_t QD = (size_t)H * D, KVD = (size_t)hp->n_head_kv * D;
    const int i = j->r0 + (idx / H) * OPS_ATTN_TILE, h = idx % H, kvh = h / group;
    const int nq = j->n - i < OPS_ATTN_TILE ? j->n - i : OPS_ATTN_TILE;
    const kv_cache_view *kv = j->kv;
    const size_t ko = (size_t)kvh * D;
    const void *k = kv->k_f16 ? (const void *)((const uint16_t *)kv->k[j->layer] + ko)
                              : (const void *)((const float *)kv->k[j->layer] + ko);
    const void *v = kv->v_f16 ? (const void *)((const uint16_t *)kv->v[j->layer] + ko)
                              : (const void *)((const float *)kv->v[j->layer] + ko);
    float *out = j->s->att + (size_t)i * QD + (size_t)h * D;
    const float *q = j->s->q + (size_t)i * QD + (size_t)h * D;
    float *scores = j->s->scores + (size_t)ith * OPS_ATTN_TILE * (size_t)j->s->n_ctx;
    j->m->kern.attention_rows(out, QD, q, QD, nq, k, kv->k_f16, v, kv->v_f16, (int64_t)KVD, D, j->pos0 + i,
                              j->scale, scores, j->m->f16_tab);
}

static void attn_fn(void *p, int ith, int nth)
{
    attn_job *j = p;
    const int H = j->m->hp->n_head;
    const int items = (j->n - j->r0 + OPS_ATTN_TILE - 1) / OPS_ATTN_TILE * H;
    for (int idx = ith; idx < items; idx += nth) attn_item(j, idx, ith);
}

/* x[i] = y[i] + x[i] for rows [r0, n). */
typedef struct add_job { float *x; const float *y; int r0; int n; } add_job;

static void add_row(void *p, int idx, int ith)
{
    (void)ith;
    add_job *j = p;
    const size_t o = (size_t)(j->r0 + idx) * (size_t)j->n;
    for (int c = 0; c < j->n; c++) j->x[o + c] = j->y[o + c] + j->x[o + c];
}

/* ==== MoE: one grouped matmul per expert, pipelined over the wave ====
 *
 * The row-slots routed to expert e are list[cnt[e] .. cnt[e+1]) ("list
 * positions" t). Their inputs are gathered into contiguous rows (xgg: list
 * position t at t * stride), so each expert is a plain matmul of its
 * weights by its m rows (quant_gemm). Every per-slot buffer below is
 * indexed by list position: g/h (F floats), u (F floats), hq (h quantized
 * for down), eout (E floats, already weighted).
 *
 * One pool job runs the wave as a queue of items taken in order by every
 * thread (atomic counter): G(i, c) = gate and up of wave expert i for
 * weight rows [c*GU, (c+1)*GU), D(i, c) = down rows [c*DN, (c+1)*DN). The
 * order is G0, G1, D0, G2, D1, ..., D(n-1): a thread reaching expert i's
 * first item waits for that expert alone (expert_src_wait_expert), so the
 * computation of one expert overlaps the reads of the ones behind it (the
 * source queued them in this order). The thread finishing the last G item
 * of an expert quantizes its hidden rows for down and marks it ready; D
 * items of that expert wait (spin, then yield) for the mark. A failed read
 * stops every thread; the wave is then ended by the caller. */

static void moe_fail(moe_job *j, int rc, const err *e)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&j->failed, &expect, 1)) {
        j->fail_rc = rc;
        j->fail_err = *e;
    }
}

/* Wait for flag (set with release) unless the job failed. The producer is
 * another thread already running an earlier item, so the wait is short. */
static int moe_wait_flag(moe_job *j, atomic_int *flag)
{
    for (unsigned n = 0; !atomic_load_explicit(flag, memory_order_acquire); n++) {
        if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return -1;
        if (n >= 256) sched_yield();
    }
    return 0;
}

/* Gate and up of wave expert i, weight rows [f0, f1), for all its rows. */
static int moe_gu_item(moe_job *j, int i, int f0, int f1)
{
    const hparams *hp = j->m->hp;
    qwen3moe_scratch *s = j->s;
    const int e = j->ex[i], F = hp->n_ff_exp;
    const int64_t E = hp->n_embd;
    if (!atomic_load_explicit(&s->xres[i], memory_order_acquire)) {
        err le;
        err_clear(&le);
        const int rc = expert_src_wait_expert(j->m->xs, j->layer, i, &le);
        if (rc) { moe_fail(j, rc, &le); return rc; }
        atomic_store_explicit(&s->xres[i], 1, memory_order_release);
    }
    const wtensor *gt = &j->lw->gate_exps, *ut = &j->lw->up_exps;
    const uint8_t *gw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_GATE) + (uint64_t)f0 * gt->row_bytes;
    const uint8_t *uw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_UP) + (uint64_t)f0 * ut->row_bytes;
    const int t0 = s->cnt[e], m = s->cnt[e + 1] - t0;
    float *g = s->h + (size_t)t0 * F + f0, *u = s->u + (size_t)t0 * F + f0;
    quant_gemm(&gt->ops, E, gw, gt->row_bytes, f1 - f0, j->xg.base + (size_t)t0 * j->xg.stride, j->xg.stride, m,
               g, (size_t)F);
    quant_gemm(&ut->ops, E, uw, ut->row_bytes, f1 - f0, j->xu.base + (size_t)t0 * j->xu.stride, j->xu.stride, m,
               u, (size_t)F);
    for (int t = 0; t < m; t++)
        for (int f = 0; f < f1 - f0; f++) {
            const size_t o = (size_t)t * F + (size_t)f;
            g[o] = ops_silu(g[o]) * u[o];   /* h = silu(g) * u */
        }
    /* the last G item of the expert readies its rows for down */
    if (atomic_fetch_sub_explicit(&s->xleft[i], 1, memory_order_acq_rel) == 1) {
        if (!j->down_f32) {
            const wtensor *dt = &j->lw->down_exps;
            for (int t = t0; t < t0 + m; t++)
                dt->act.quant(s->h + (size_t)t * F, s->hq + (size_t)t * dt->act_bytes, F);
        }
        atomic_store_explicit(&s->xready[i], 1, memory_order_release);
    }
    return 0;
}

/* Down of wave expert i, output rows [r0, r1), weighted by the routing
 * weight of each row-slot. */
static int moe_down_item(moe_job *j, int i, int r0, int r1)
{
    const hparams *hp = j->m->hp;
    qwen3moe_scratch *s = j->s;
    const int e = j->ex[i], E = hp->n_embd;
    const int64_t F = hp->n_ff_exp;
    if (moe_wait_flag(j, &s->xready[i])) return -1;
    const wtensor *dt = &j->lw->down_exps;
    const uint8_t *dw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_DOWN) + (uint64_t)r0 * dt->row_bytes;
    const int t0 = s->cnt[e], m = s->cnt[e + 1] - t0;
    const uint8_t *hin;
    size_t hstride;
    if (j->down_f32) { hin = (const uint8_t *)(s->h + (size_t)t0 * F); hstride = (size_t)F * sizeof(float); }
    else { hin = s->hq + (size_t)t0 * dt->act_bytes; hstride = dt->act_bytes; }
    float *y = s->eout + (size_t)t0 * E + r0;
    quant_gemm(&dt->ops, F, dw, dt->row_bytes, r1 - r0, hin, hstride, m, y, (size_t)E);
    for (int t = 0; t < m; t++) {
        const float w = s->selw[s->list[t0 + t]];
        for (int r = 0; r < r1 - r0; r++) y[(size_t)t * E + r] = y[(size_t)t * E + r] * w;
    }
    return 0;
}

static void moe_fn(void *p, int ith, int nth)
{
    (void)ith; (void)nth;
    moe_job *j = p;
    const int F = j->m->hp->n_ff_exp, E = j->m->hp->n_embd;
    const long blk = (long)j->n_gu + j->n_dn;
    for (;;) {
        if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return;
        const long it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items) return;
        /* G0 | G1 D0 | G2 D1 | ... | D(n-1) */
        int gi = -1, di = -1, c;
        if (it < j->n_gu) { gi = 0; c = (int)it; }
        else {
            const long r = it - j->n_gu, q = 1 + r / blk, rem = r % blk;
            if (q >= j->n_ex) { di = j->n_ex - 1; c = (int)rem; }
            else if (rem < j->n_gu) { gi = (int)q; c = (int)rem; }
            else { di = (int)q - 1; c = (int)(rem - j->n_gu); }
        }
        if (gi >= 0) {
            const int f0 = c * MOE_GU_ROWS, f1 = f0 + MOE_GU_ROWS < F ? f0 + MOE_GU_ROWS : F;
            if (moe_gu_item(j, gi, f0, f1)) return;
        } else {
            const int r0 = c * MOE_DN_ROWS, r1 = r0 + MOE_DN_ROWS < E ? r0 + MOE_DN_ROWS : E;
            if (moe_down_item(j, di, r0, r1)) return;
        }
    }
}

/* Copy quantized input rows into list order: position t gets the row of
 * row-slot list[t] (its token row i = list[t] / k, relative to r0). */
typedef struct gather_job {
    const qwen3moe_scratch *s; int K, r0;
    act_rows src; uint8_t *dst; size_t bytes;
} gather_job;

static void gather_row(void *p, int t, int ith)
{
    (void)ith;
    gather_job *j = p;
    const int i = j->s->list[t] / j->K - j->r0;
    memcpy(j->dst + (size_t)t * j->bytes, j->src.base + (size_t)i * j->src.stride, j->bytes);
}

static act_rows gather(tpool *pool, const qwen3moe_scratch *s, int K, int r0, int n_slots, act_rows src,
                       size_t bytes, uint8_t *dst)
{
    gather_job j = { s, K, r0, src, dst, bytes };
    run_rows(pool, n_slots, gather_row, &j);
    act_rows a = { dst, bytes };
    return a;
}

/* x[i] = (((e0 + e1) + e2) + ...) + x[i]: ggml's order of the expert adds,
 * then the residual. */
typedef struct moe_sum_job { qwen3moe_scratch *s; int r0, E, K; } moe_sum_job;

static void moe_sum_row(void *p, int idx, int ith)
{
    (void)ith;
    moe_sum_job *j = p;
    const int i = j->r0 + idx, E = j->E, K = j->K;
    const int32_t *pos = j->s->pos + (size_t)i * K;   /* row-slot -> list position */
    float *x = j->s->x + (size_t)i * E;
    for (int c = 0; c < E; c++) {
        float acc = j->s->eout[(size_t)pos[0] * E + c];
        for (int s = 1; s < K; s++) acc += j->s->eout[(size_t)pos[s] * E + c];
        x[c] = acc + x[c];
    }
}

/* The residency of one layer for a biased routing arm (route_mask_fn). */
typedef struct route_mask_ctx { expert_src *xs; int layer, n_expert; } route_mask_ctx;

static void route_mask(void *ctx, uint8_t *mask)
{
    const route_mask_ctx *c = ctx;
    expert_src_resident_mask(c->xs, c->layer, mask, c->n_expert);
}

/* Router logits -> chosen experts and weights for rows [r0, n) of layer
 * `layer`. An arm that may read residency goes through route_block
 * (route.h); otherwise (no policy, exact arm, bias with no bonus) the
 * architecture's routing below runs unchanged, then is only counted. */
static void route(const qwen3moe *m, const hparams *hp, qwen3moe_scratch *s, int layer, int r0, int n)
{
    const int X = hp->n_expert, K = hp->n_expert_used;
    const int arm = m->route ? route_arm_for(s->chunk.phase, s->chunk.index) : -1;
    route_counters *ctr = arm >= 0 && m->route_ctr ? &m->route_ctr[arm] : NULL;
    if (arm >= 0 && route_arm_reads_residency(route_policy_arm(m->route, arm), K)) {
        route_mask_ctx mc = { m->xs, layer, X };
        route_block(route_policy_arm(m->route, arm), s->chunk.phase, s->chunk.rows_after, s->router, n - r0, X, K,
                    s->sel + (size_t)r0 * K, s->selw + (size_t)r0 * K, &s->rw, route_mask, &mc, ctr);
        return;
    }
    for (int i = r0; i < n; i++) {
        float *p = s->router + (size_t)(i - r0) * X;
        ops_softmax(p, X);
        int32_t *sel = s->sel + (size_t)i * K;
        float *w = s->selw + (size_t)i * K;
        ops_topk(p, X, K, sel);
        double sum = 0.0;
        for (int t = 0; t < K; t++) { w[t] = p[sel[t]]; sum += (double)w[t]; }
        float fs = (float)sum;
        if (fs < 6.103515625e-5f) fs = 6.103515625e-5f;   /* ggml_clamp(sum, 2^-14, inf) */
        for (int t = 0; t < K; t++) w[t] = w[t] / fs;
    }
    route_count_exact(ctr, s->sel + (size_t)r0 * K, n - r0, X, K, s->rw.seen);
}

/* Group the row-slots of rows [r0, n) by expert: used[] ascending,
 * cnt[e]..cnt[e+1] their range in list[]. Returns the number of experts. */
static int group_by_expert(const hparams *hp, qwen3moe_scratch *s, int r0, int n)
{
    const int X = hp->n_expert, K = hp->n_expert_used;
    memset(s->fill, 0, sizeof(int32_t) * (size_t)X);
    for (int i = r0; i < n; i++)
        for (int t = 0; t < K; t++) s->fill[s->sel[(size_t)i * K + t]]++;
    int n_used = 0, off = 0;
    for (int e = 0; e < X; e++) {
        s->cnt[e] = off;
        off += s->fill[e];
        if (s->fill[e]) s->used[n_used++] = e;
        s->fill[e] = s->cnt[e];
    }
    s->cnt[X] = off;
    for (int i = r0; i < n; i++)
        for (int t = 0; t < K; t++) {
            const int r = i * K + t;
            s->pos[r] = s->fill[s->sel[r]];
            s->list[s->fill[s->sel[r]]++] = r;
        }
    return n_used;
}

/* ==== Read-ahead ==== */

/* Guess layer L's experts from the current residual rows (s->x) and hand
 * them to the source: the rows that layer's MoE will process are normed
 * with its ffn_norm, run through its router, and each row's top N experts
 * vote; the guess is every voted expert, most votes first (ties: lower id
 * first). Nothing here feeds the result. */
static void read_ahead(const qwen3moe *m, qwen3moe_scratch *s, int L, int n, int n_out)
{
    const hparams *hp = m->hp;
    if (m->read_ahead <= 0 || L >= hp->n_layer || !expert_src_can_prefetch(m->xs)) return;
    const int r0 = L == hp->n_layer - 1 ? n - n_out : 0;
    if (r0 >= n) return;   /* that layer's MoE will not run */
    const int nr = n - r0, E = hp->n_embd, X = hp->n_expert;
    const int N = m->read_ahead < X ? m->read_ahead : X;
    const layer_weights *lw = &m->w->layers[L];
    tpool *pool = m->pool;
    norm_job nj = { s->x + (size_t)r0 * E, s->pxn, lw->ffn_norm, E, hp->rms_eps };
    run_rows(pool, nr, norm_row, &nj);
    act_rows a = quantize_for(pool, &lw->gate_inp, s->pxn, (size_t)E, nr, s->pqa);
    mm_out o = { &lw->gate_inp, s->pred, (size_t)X };
    matmul(pool, &o, 1, a, nr);
    memset(s->pvotes, 0, sizeof(int32_t) * (size_t)X);
    for (int i = 0; i < nr; i++) {
        ops_topk(s->pred + (size_t)i * X, X, N, s->ptop);
        for (int t = 0; t < N; t++) s->pvotes[s->ptop[t]]++;
    }
    /* insertion sort by votes, descending; stable, so ties keep id order */
    int cnt = 0;
    for (int x = 0; x < X; x++) {
        if (!s->pvotes[x]) continue;
        int j = cnt++;
        while (j > 0 && s->pvotes[s->pset[j - 1]] < s->pvotes[x]) { s->pset[j] = s->pset[j - 1]; j--; }
        s->pset[j] = x;
    }
    expert_src_prefetch(m->xs, L, s->pset, cnt);
}

/* ==== Stats ==== */

static uint64_t wbytes(const wtensor *w) { return w->row_bytes * (uint64_t)w->ne[1]; }

/* One MoE block of nr rows that looked up n_used distinct experts. */
static void stats_moe(const qwen3moe *m, const layer_weights *lw, qwen3moe_stats *st, int nr, int n_used)
{
    const hparams *hp = m->hp;
    const double N = hp->n_expert, k = hp->n_expert_used;
    st->moe_layers++;
    st->expert_slots += (uint64_t)nr * (uint64_t)hp->n_expert_used;
    st->expert_lookups += (uint64_t)n_used;
    st->expert_lookups_uniform += N * (1.0 - pow(1.0 - k / N, nr));
    st->expert_bytes += (uint64_t)n_used * (wbytes(&lw->gate_exps) + wbytes(&lw->up_exps) + wbytes(&lw->down_exps));
    st->dense_bytes += wbytes(&lw->gate_inp) + sizeof(float) * (uint64_t)hp->n_embd;
}

/* ==== The forward ==== */

static int moe(const qwen3moe *m, const layer_weights *lw, qwen3moe_scratch *s, int layer, int r0, int n,
               int n_out, err *e)
{
    const hparams *hp = m->hp;
    const int E = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
    const int nr = n - r0;
    tpool *pool = m->pool;

    /* ffn norm, router */
    norm_job nj = { s->x + (size_t)r0 * E, s->xn + (size_t)r0 * E, lw->ffn_norm, E, hp->rms_eps };
    run_rows(pool, nr, norm_row, &nj);
    const float *xn = s->xn + (size_t)r0 * E;
    act_rows xr = quantize_for(pool, &lw->gate_inp, xn, (size_t)E, nr, s->qa);
    mm_out ro = { &lw->gate_inp, s->router, (size_t)hp->n_expert };
    matmul(pool, &ro, 1, xr, nr);
    route(m, hp, s, layer, r0, n);
    if (m->on_route) m->on_route(m->on_route_ctx, layer, s->sel + (size_t)r0 * K, nr, K);
    const int n_used = group_by_expert(hp, s, r0, n);
    stats_moe(m, lw, &s->stats[s->chunk.phase & 1], nr, n_used);

    /* gate and up inputs, quantized once per chunk (they share one
     * quantization when their dot types agree) and gathered into list order */
    const int n_slots = nr * K;
    act_rows xg = quantize_for(pool, &lw->gate_exps, xn, (size_t)E, nr, s->qa);
    act_rows xu = lw->up_exps.ops.dot_type == lw->gate_exps.ops.dot_type ? xg
                : quantize_for(pool, &lw->up_exps, xn, (size_t)E, nr, s->qb);
    const act_rows xgg = gather(pool, s, K, r0, n_slots, xg, (size_t)lw->gate_exps.act_bytes, s->xgg);
    const act_rows xug = xu.base == xg.base ? xgg
                       : gather(pool, s, K, r0, n_slots, xu, (size_t)lw->up_exps.act_bytes, s->xug);
    const int down_f32 = lw->down_exps.ops.dot_type == QTYPE_F32;
    const int n_gu = (F + MOE_GU_ROWS - 1) / MOE_GU_ROWS, n_dn = (E + MOE_DN_ROWS - 1) / MOE_DN_ROWS;

    for (int done = 0; done < n_used;) {
        int32_t *ex = s->used + done;
        const int k = expert_src_begin_layer(m->xs, layer, ex, n_used - done, e);
        if (k < 0) return k;
        if (k == 0 || k > n_used - done) {
            expert_src_end_layer(m->xs, layer);
            return err_setf(e, ERR_INTERNAL, "expert source returned a wave of %d of %d experts", k, n_used - done);
        }
        /* the demand reads are queued: guess the next layer behind them */
        if (done == 0 && m->ra_from == QWEN3MOE_RA_ATTN) read_ahead(m, s, layer + 1, n, n_out);
        const int per_expert = expert_src_can_wait_expert(m->xs);
        if (!per_expert) {
            int rc = expert_src_wait_layer(m->xs, layer, e);
            if (rc) return rc;
        }
        for (int i = 0; i < k; i++) {
            atomic_store_explicit(&s->xres[i], !per_expert, memory_order_relaxed);
            atomic_store_explicit(&s->xleft[i], n_gu, memory_order_relaxed);
            atomic_store_explicit(&s->xready[i], 0, memory_order_relaxed);
        }
        moe_job *j = &s->moe;   /* in the scratch: holds atomics, nothing allocated per chunk */
        j->m = m; j->lw = lw; j->s = s; j->layer = layer;
        j->ex = ex; j->n_ex = k; j->xg = xgg; j->xu = xug; j->down_f32 = down_f32;
        j->n_gu = n_gu; j->n_dn = n_dn; j->n_items = (long)k * (n_gu + n_dn);
        atomic_store_explicit(&j->next, 0, memory_order_relaxed);
        atomic_store_explicit(&j->failed, 0, memory_order_relaxed);
        const double t0 = timer_ms();
        tpool_run(pool, moe_fn, j);
        s->stats[s->chunk.phase & 1].expert_ms += timer_ms() - t0;
        expert_src_end_layer(m->xs, layer);
        if (atomic_load(&j->failed)) {
            err_setf(e, j->fail_rc, "%s", j->fail_err.msg);
            return j->fail_rc;
        }
        done += k;
    }

    moe_sum_job sj = { s, r0, E, K };
    run_rows(pool, nr, moe_sum_row, &sj);
    return 0;
}

int qwen3moe_forward(const qwen3moe *m, const kv_cache_view *kv, qwen3moe_scratch *s,
                     const int32_t *ids, int n, int pos0, int n_out, float *logits, err *e)
{
    const hparams *hp = m->hp;
    const weights *w = m->w;
    tpool *pool = m->pool;
    const int E = hp->n_embd, D = hp->head_dim, H = hp->n_head;
    const size_t QD = (size_t)H * D, KVD = (size_t)hp->n_head_kv * D;
    const float kq_scale = 1.0f / sqrtf((float)D);
    if (n < 1 || n > s->n_batch || pos0 < 0 || pos0 + n > kv->n_ctx || n_out < 0 || n_out > n)
        return err_setf(e, ERR_INTERNAL, "forward: bad chunk (n %d, pos0 %d, n_out %d)", n, pos0, n_out);
    qwen3moe_stats *st = &s->stats[s->chunk.phase & 1];
    st->chunks++;
    st->rows += (uint64_t)n;
    st->dense_bytes += (uint64_t)n * w->tok_embd.row_bytes;
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        st->dense_bytes += wbytes(&lw->wq) + wbytes(&lw->wk) + wbytes(&lw->wv) + sizeof(float) * (uint64_t)(E + 2 * D);
        if (l < hp->n_layer - 1 || n_out > 0) st->dense_bytes += wbytes(&lw->wo);
    }
    if (n_out > 0) st->dense_bytes += wbytes(&w->output) + sizeof(float) * (uint64_t)E;

    /* token embeddings: dequantized rows of token_embd */
    for (int i = 0; i < n; i++)
        w->tok_embd.ops.dequant(w->tok_embd.data + (uint64_t)ids[i] * w->tok_embd.row_bytes,
                                s->x + (size_t)i * E, E);

    for (int l = 0; l < hp->n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        const int r0 = l == hp->n_layer - 1 ? n - n_out : 0;
        if (m->ra_from == QWEN3MOE_RA_INPUT) read_ahead(m, s, l + 1, n, n_out);

        /* attention input norm and the Q, K, V projections (all rows: every
         * row's K and V go to the cache) */
        norm_job nj = { s->x, s->xn, lw->attn_norm, E, hp->rms_eps };
        run_rows(pool, n, norm_row, &nj);
        if (lw->wq.ops.dot_type == lw->wk.ops.dot_type && lw->wq.ops.dot_type == lw->wv.ops.dot_type) {
            act_rows a = quantize_for(pool, &lw->wq, s->xn, (size_t)E, n, s->qa);
            mm_out o[3] = { { &lw->wq, s->q, QD }, { &lw->wk, s->k, KVD }, { &lw->wv, s->v, KVD } };
            matmul(pool, o, 3, a, n);
        } else {
            const wtensor *ts[3] = { &lw->wq, &lw->wk, &lw->wv };
            float *ys[3] = { s->q, s->k, s->v };
            size_t ld[3] = { QD, KVD, KVD };
            for (int t = 0; t < 3; t++) {
                act_rows a = quantize_for(pool, ts[t], s->xn, (size_t)E, n, s->qa);
                mm_out o = { ts[t], ys[t], ld[t] };
                matmul(pool, &o, 1, a, n);
            }
        }
        qk_job qj = { m, lw, kv, s, l, pos0 };
        run_rows(pool, n, qk_row, &qj);
        if (r0 == n) continue;   /* last layer, no logits wanted: nothing below feeds the cache */

        attn_job aj = { m, kv, s, l, pos0, r0, n, kq_scale };
        tpool_run(pool, attn_fn, &aj);

        /* output projection and the first residual: x = Wo . att + x */
        act_rows a = quantize_for(pool, &lw->wo, s->att + (size_t)r0 * QD, QD, n - r0, s->qa);
        mm_out o = { &lw->wo, s->xn + (size_t)r0 * E, (size_t)E };
        matmul(pool, &o, 1, a, n - r0);
        add_job adj = { s->x, s->xn, r0, E };
        run_rows(pool, n - r0, add_row, &adj);

        int rc = moe(m, lw, s, l, r0, n, n_out, e);
        if (rc) return rc;
        if (s->on_layer) s->on_layer(s->on_layer_ctx, l, s->x + (size_t)r0 * E, n - r0, (int64_t)E);
    }
    if (n_out == 0) return 0;

    /* output norm and head for the last n_out rows */
    const int r0 = n - n_out;
    norm_job nj = { s->x + (size_t)r0 * E, s->xn + (size_t)r0 * E, w->output_norm, E, hp->rms_eps };
    run_rows(pool, n_out, norm_row, &nj);
    act_rows a = quantize_for(pool, &w->output, s->xn + (size_t)r0 * E, (size_t)E, n_out, s->qa);
    mm_out o = { &w->output, logits, (size_t)hp->n_vocab };
    matmul(pool, &o, 1, a, n_out);
    return 0;
}

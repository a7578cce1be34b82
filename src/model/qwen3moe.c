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
 * Matmul loop order: thread -> output rows of the weight -> input rows, so a
 * weight row is read once per chunk and stays in L1 while every input row
 * uses it. A later speed pass can block this; the numerics would not change
 * (each output is one dot of one weight row with one quantized input row). */
#include "model/qwen3moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops.h"
#include "util/fp16.h"

/* ==== Scratch ==== */

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
    float   *h;        /* (n_batch*n_expert_used, n_ff_exp) expert hidden rows */
    uint8_t *hq;       /* (n_batch*n_expert_used, 4*n_ff_exp) bytes: h quantized for down */
    float   *eout;     /* (n_batch*n_expert_used, n_embd) weighted expert outputs */
    float   *scores;   /* (n_threads, n_ctx) attention scores */
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
    s->h      = scratch_alloc(s, sizeof(float) * B * K * F, fail);
    s->hq     = scratch_alloc(s, 4 * B * K * F, fail);
    s->eout   = scratch_alloc(s, sizeof(float) * B * K * E, fail);
    s->scores = scratch_alloc(s, sizeof(float) * T * (size_t)n_ctx, fail);
    s->rope   = scratch_alloc(s, sizeof(float) * T * D, fail);
    if (m->read_ahead > 0) {
        s->pxn    = scratch_alloc(s, sizeof(float) * B * E, fail);
        s->pqa    = scratch_alloc(s, 4 * B * E, fail);
        s->pred   = scratch_alloc(s, sizeof(float) * B * X, fail);
        s->ptop   = scratch_alloc(s, sizeof(int32_t) * X, fail);
        s->pvotes = scratch_alloc(s, sizeof(int32_t) * X, fail);
        s->pset   = scratch_alloc(s, sizeof(int32_t) * X, fail);
    }
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
    free(s->h); free(s->hq); free(s->eout); free(s->scores); free(s->rope);
    free(s->pxn); free(s->pqa); free(s->pred); free(s->ptop); free(s->pvotes); free(s->pset);
    free(s);
}

uint64_t qwen3moe_scratch_bytes(const qwen3moe_scratch *s) { return s ? s->bytes : 0; }

void qwen3moe_scratch_set_chunk(qwen3moe_scratch *s, const qwen3moe_chunk *c) { s->chunk = *c; }

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

/* Quantized input rows: row i at base + i * stride. */
typedef struct act_rows { const uint8_t *base; size_t stride; } act_rows;

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
        const int64_t K = w->ne[0];
        const quant_dot_fn dot = w->ops.dot;
        for (long r = a; r < b; r++) {
            const uint8_t *wr = w->data + (uint64_t)r * w->row_bytes;
            for (int i = 0; i < j->n_rows; i++)
                o->y[(size_t)i * o->ldy + (size_t)r] = dot(K, wr, j->in.base + (size_t)i * j->in.stride);
        }
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

/* Attention for (row, head) pairs of rows [r0, n). */
typedef struct attn_job {
    const qwen3moe *m; const kv_cache_view *kv; qwen3moe_scratch *s;
    int layer, pos0, r0; float scale;
} attn_job;

static void attn_item(void *p, int idx, int ith)
{
    attn_job *j = p;
    const hparams *hp = j->m->hp;
    const int D = hp->head_dim, H = hp->n_head, group = hp->n_head / hp->n_head_kv;
    const size_t QD = (size_t)H * D, KVD = (size_t)hp->n_head_kv * D;
    const int i = j->r0 + idx / H, h = idx % H, kvh = h / group;
    const kv_cache_view *kv = j->kv;
    const size_t ko = (size_t)kvh * D;
    const void *k = kv->k_f16 ? (const void *)((const uint16_t *)kv->k[j->layer] + ko)
                              : (const void *)((const float *)kv->k[j->layer] + ko);
    const void *v = kv->v_f16 ? (const void *)((const uint16_t *)kv->v[j->layer] + ko)
                              : (const void *)((const float *)kv->v[j->layer] + ko);
    float *out = j->s->att + (size_t)i * QD + (size_t)h * D;
    const float *q = j->s->q + (size_t)i * QD + (size_t)h * D;
    float *scores = j->s->scores + (size_t)ith * j->s->n_ctx;
    j->m->kern.attention(out, q, k, kv->k_f16, v, kv->v_f16, (int64_t)KVD, D, j->pos0 + i + 1, j->scale, scores,
                         j->m->f16_tab);
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

/* Gate and up for (expert, hidden row f) items; h = silu(g) * u. */
typedef struct gu_job {
    const qwen3moe *m; const layer_weights *lw; qwen3moe_scratch *s;
    int layer, r0;
    const int32_t *ex; int n_ex;   /* the wave's experts */
    act_rows xg, xu;        /* ffn input rows r0.. quantized for gate / up */
} gu_job;

static void gu_fn(void *p, int ith, int nth)
{
    gu_job *j = p;
    const hparams *hp = j->m->hp;
    const int F = hp->n_ff_exp, K = hp->n_expert_used;
    const int64_t E = hp->n_embd;
    const wtensor *gt = &j->lw->gate_exps, *ut = &j->lw->up_exps;
    long lo, hi;
    tpool_split((long)j->n_ex * F, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        const int e = j->ex[it / F], f = (int)(it % F);
        const uint8_t *gw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_GATE) + (uint64_t)f * gt->row_bytes;
        const uint8_t *uw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_UP) + (uint64_t)f * ut->row_bytes;
        for (int t = j->s->cnt[e]; t < j->s->cnt[e + 1]; t++) {
            const int r = j->s->list[t], i = r / K - j->r0;
            const float g = gt->ops.dot(E, gw, j->xg.base + (size_t)i * j->xg.stride);
            const float u = ut->ops.dot(E, uw, j->xu.base + (size_t)i * j->xu.stride);
            j->s->h[(size_t)r * F + f] = ops_silu(g) * u;
        }
    }
}

/* Down for (expert, output row m) items, weighted by the routing weight. */
typedef struct down_job {
    const qwen3moe *m; const layer_weights *lw; qwen3moe_scratch *s;
    int layer;
    const int32_t *ex; int n_ex;   /* the wave's experts */
    act_rows hin;           /* hidden rows: row-slot r at base + (r - r_base) * stride */
    int r_base;
} down_job;

static void down_fn(void *p, int ith, int nth)
{
    down_job *j = p;
    const hparams *hp = j->m->hp;
    const int E = hp->n_embd;
    const int64_t F = hp->n_ff_exp;
    const wtensor *dt = &j->lw->down_exps;
    long lo, hi;
    tpool_split((long)j->n_ex * E, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        const int e = j->ex[it / E], mr = (int)(it % E);
        const uint8_t *dw = (const uint8_t *)expert_src_get(j->m->xs, j->layer, e, EXPERT_DOWN) + (uint64_t)mr * dt->row_bytes;
        for (int t = j->s->cnt[e]; t < j->s->cnt[e + 1]; t++) {
            const int r = j->s->list[t];
            const float d = dt->ops.dot(F, dw, j->hin.base + (size_t)(r - j->r_base) * j->hin.stride);
            j->s->eout[(size_t)r * E + mr] = d * j->s->selw[r];
        }
    }
}

/* x[i] = (((e0 + e1) + e2) + ...) + x[i]: ggml's order of the expert adds,
 * then the residual. */
typedef struct moe_sum_job { qwen3moe_scratch *s; int r0, E, K; } moe_sum_job;

static void moe_sum_row(void *p, int idx, int ith)
{
    (void)ith;
    moe_sum_job *j = p;
    const int i = j->r0 + idx, E = j->E, K = j->K;
    const float *eo = j->s->eout + (size_t)i * K * E;
    float *x = j->s->x + (size_t)i * E;
    for (int c = 0; c < E; c++) {
        float acc = eo[c];
        for (int s = 1; s < K; s++) acc += eo[(size_t)s * E + c];
        x[c] = acc + x[c];
    }
}

/* Router probabilities -> chosen experts and weights for rows [r0, n). */
static void route(const hparams *hp, qwen3moe_scratch *s, int r0, int n)
{
    const int X = hp->n_expert, K = hp->n_expert_used;
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
            s->list[s->fill[s->sel[r]]++] = r;
        }
    return n_used;
}

/* Quantize the hidden rows of the wave's row-slots for down: item i is
 * expert ex[i], whose row-slots are list[cnt[e] .. cnt[e+1]). Row-slot r
 * goes to dst + (r - r_base) * stride, as one quantization of all rows
 * would put it (the result of quantizing a row depends only on the row). */
typedef struct hq_job {
    const quant_ops *act; int64_t F;
    qwen3moe_scratch *s; const int32_t *ex;
    int r_base; size_t stride;
} hq_job;

static void hq_expert(void *p, int i, int ith)
{
    (void)ith;
    hq_job *j = p;
    const int e = j->ex[i];
    for (int t = j->s->cnt[e]; t < j->s->cnt[e + 1]; t++) {
        const int r = j->s->list[t];
        j->act->quant(j->s->h + (size_t)r * (size_t)j->F, j->s->hq + (size_t)(r - j->r_base) * j->stride, j->F);
    }
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
    route(hp, s, r0, n);
    if (m->on_route) m->on_route(m->on_route_ctx, layer, s->sel + (size_t)r0 * K, nr, K);
    const int n_used = group_by_expert(hp, s, r0, n);
    stats_moe(m, lw, &s->stats[s->chunk.phase & 1], nr, n_used);

    /* gate and up inputs, for every wave; they share one quantization when
     * their dot types agree */
    act_rows xg = quantize_for(pool, &lw->gate_exps, xn, (size_t)E, nr, s->qa);
    act_rows xu = lw->up_exps.ops.dot_type == lw->gate_exps.ops.dot_type ? xg
                : quantize_for(pool, &lw->up_exps, xn, (size_t)E, nr, s->qb);
    const int down_f32 = lw->down_exps.ops.dot_type == QTYPE_F32;

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
        int rc = expert_src_wait_layer(m->xs, layer, e);
        if (rc) return rc;

        gu_job gj = { m, lw, s, layer, r0, ex, k, xg, xu };
        tpool_run(pool, gu_fn, &gj);

        /* the wave's hidden rows in down's dot type */
        down_job dj = { m, lw, s, layer, ex, k, { 0 }, r0 * K };
        if (down_f32) {
            dj.hin.base = (const uint8_t *)(s->h + (size_t)r0 * K * F);
            dj.hin.stride = (size_t)F * sizeof(float);
        } else {
            hq_job hj = { &lw->down_exps.act, F, s, ex, r0 * K, (size_t)lw->down_exps.act_bytes };
            run_rows(pool, k, hq_expert, &hj);
            dj.hin.base = s->hq;
            dj.hin.stride = (size_t)lw->down_exps.act_bytes;
        }
        tpool_run(pool, down_fn, &dj);
        expert_src_end_layer(m->xs, layer);
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

        attn_job aj = { m, kv, s, l, pos0, r0, kq_scale };
        run_rows(pool, (n - r0) * H, attn_item, &aj);

        /* output projection and the first residual: x = Wo . att + x */
        act_rows a = quantize_for(pool, &lw->wo, s->att + (size_t)r0 * QD, QD, n - r0, s->qa);
        mm_out o = { &lw->wo, s->xn + (size_t)r0 * E, (size_t)E };
        matmul(pool, &o, 1, a, n - r0);
        add_job adj = { s->x, s->xn, r0, E };
        run_rows(pool, n - r0, add_row, &adj);

        int rc = moe(m, lw, s, l, r0, n, n_out, e);
        if (rc) return rc;
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

/* qwen3moe: the CPU forward pass of a qwen3moe model (llama.cpp
 * src/models/qwen3moe.cpp + llama-graph.cpp build_moe_ffn), over one chunk
 * of consecutive tokens.
 *
 * Per layer: h = x + Wo . attn(rope(rms(Wq n)), rope(rms(Wk n)), Wv n) with
 * n = rms(x) * attn_norm; x' = h + MoE(rms(h) * ffn_norm). MoE: router
 * logits -> softmax -> top-k (descending) -> the k probabilities divided by
 * max(their sum, 6.103515625e-5); each distinct expert of the chunk is run
 * once for all rows routed to it: down(silu(gate . x) * (up . x)); row
 * outputs are weighted and summed in top-k order (((e0 + e1) + e2) + ...),
 * as ggml adds the expert views.
 *
 * Matmul numerics follow ggml-cpu: each input row is quantized once to the
 * weight's vec_dot_type (quant_ops act.quant), then each output is
 * ops.dot(weight row, quantized row); f32 weights take f32 inputs as they
 * are. The expert hidden row is re-quantized for down's dot type. See ops.h
 * for norms, RoPE, softmax and attention.
 *
 * Work is split over the thread pool by output rows (matmuls, experts x
 * rows), by (row, head) pairs (attention) and by rows (norms, RoPE).
 * Nothing here allocates: all buffers live in a qwen3moe_scratch sized at
 * session creation for n_batch rows and n_ctx positions. */
#ifndef STRATA_QWEN3MOE_H
#define STRATA_QWEN3MOE_H

#include <stdint.h>

#include "model/expert_src.h"
#include "model/hparams.h"
#include "model/ops.h"
#include "model/weights.h"
#include "route/route.h"
#include "util/err.h"
#include "util/threadpool.h"

/* Where read-ahead takes the hidden state it runs layer L+1's router on,
 * while layer L computes (see "Read-ahead" below). */
enum qwen3moe_ra_from {
    QWEN3MOE_RA_ATTN  = 0,   /* layer L's residual after its attention (default) */
    QWEN3MOE_RA_INPUT = 1,   /* layer L's input, before its attention */
};

/* A routing observer: layer `layer` routed rows to experts (n_rows x k,
 * row-major, top-k order). Called on the coordinating thread. */
typedef void (*qwen3moe_route_fn)(void *ctx, int layer, const int32_t *experts, int n_rows, int k);

/* A layer observer (tests: per-layer comparison with another backend):
 * layer `layer` is done; x holds the residual rows it computed, n_rows rows
 * of n_embd floats, the chunk's LAST n_rows rows. Every layer but the last
 * passes all n rows; the last passes only the n_out rows that produce
 * logits, and is not reported at all when n_out = 0 (its attention output
 * and MoE are skipped then). Called on the coordinating thread. */
typedef void (*qwen3moe_layer_fn)(void *ctx, int layer, const float *x, int n_rows, int64_t n_embd);

/* What the forward reads: all borrowed from the engine. */
typedef struct qwen3moe {
    const hparams *hp;
    const weights *w;
    expert_src    *xs;
    tpool         *pool;
    const float   *f16_tab;   /* ops_f16_table_init */
    ops_kernels    kern;      /* ops_kernels_get(isa) */
    int            read_ahead;   /* top-N per row prefetched for the next layer; 0: off */
    int            ra_from;      /* enum qwen3moe_ra_from */
    qwen3moe_route_fn on_route;  /* optional */
    void          *on_route_ctx;
    /* Routing policy (route/route.h; NULL or an exact arm: the exact routing
     * described above, unchanged). Which arm routes a chunk comes from its
     * qwen3moe_chunk; a biased arm reads xs's residency (see route.h). */
    const route_policy *route;
    route_counters     *route_ctr;   /* ROUTE_N_ARMS counters, or NULL; written by the
                                        forward (sessions of one engine never run at once) */
} qwen3moe;

/* The KV cache the forward appends to (owned by a session). Layer l's K rows
 * are k[l]: (n_ctx, n_head_kv*head_dim) in f16 (k_f16) or f32; V alike. */
typedef struct kv_cache_view {
    int       n_ctx;
    int       k_f16, v_f16;
    uint8_t **k;              /* n_layer pointers */
    uint8_t **v;
} kv_cache_view;

typedef struct qwen3moe_scratch qwen3moe_scratch;

/* Where the next chunk sits in its request, set by the session before each
 * forward (qwen3moe_scratch_set_chunk): routing policies choose their arm by
 * it and the stats are kept per phase. */
typedef struct qwen3moe_chunk {
    int phase;        /* 0: prompt (a session_eval of several tokens), 1: decode (one token) */
    int index;        /* chunk number within its session_eval call, 0 = first */
    int rows_after;   /* rows of that call that come after this chunk */
} qwen3moe_chunk;

/* What the forward did, summed over the chunks of one phase. */
typedef struct qwen3moe_stats {
    uint64_t chunks, rows;        /* forward calls, rows evaluated */
    uint64_t moe_layers;          /* (chunk, layer) MoE blocks run */
    uint64_t expert_slots;        /* routed row-slots (rows x k), summed */
    uint64_t expert_lookups;      /* distinct experts per (chunk, layer), summed */
    double   expert_lookups_uniform; /* the same if routing were uniform:
                                      sum of N * (1 - (1 - k/N)^rows) */
    uint64_t expert_bytes;        /* lookups x that layer's gate+up+down bytes per expert */
    uint64_t dense_bytes;         /* other weight bytes read: attention, router, norms,
                                     embedding rows, the head where it ran */
    double   expert_ms;           /* wall time of the routed-expert jobs (gather, gate/up,
                                     SwiGLU, down; waits for expert reads included) */
} qwen3moe_stats;

/* Buffers for chunks of up to n_batch rows with up to n_ctx positions on a
 * pool of n_threads. *out owned by the caller. */
int  qwen3moe_scratch_open(qwen3moe_scratch **out, const qwen3moe *m, int n_batch, int n_ctx, err *e);
/* The bytes qwen3moe_scratch_open would allocate (for memory plans). */
uint64_t qwen3moe_scratch_plan(const qwen3moe *m, int n_batch, int n_ctx);
void qwen3moe_scratch_close(qwen3moe_scratch *s);   /* NULL is a no-op */
uint64_t qwen3moe_scratch_bytes(const qwen3moe_scratch *s);
/* Set before each forward; the default is {prompt, 0, 0}. */
void qwen3moe_scratch_set_chunk(qwen3moe_scratch *s, const qwen3moe_chunk *c);
/* Install (fn != NULL) or remove a layer observer for the forwards that use
 * this scratch (on the scratch, not on struct qwen3moe, so that positional
 * initialisers of that struct stay complete). */
void qwen3moe_scratch_set_on_layer(qwen3moe_scratch *s, qwen3moe_layer_fn fn, void *ctx);
/* The stats of phase 0 or 1 (zeros for another value). */
void qwen3moe_scratch_stats(const qwen3moe_scratch *s, int phase, qwen3moe_stats *out);

/* Evaluate tokens ids[0..n) at positions pos0..pos0+n-1 (1 <= n <= n_batch,
 * pos0 + n <= n_ctx, ids already range-checked): writes their K/V into the
 * cache and, if n_out > 0, the logits of the last n_out rows to
 * logits[n_out][n_vocab] (row j = after token n - n_out + j). n_out = 0
 * skips the head (and the last layer's MoE, which only feeds it). Errors
 * come only from the expert source (an I/O error names the layer, expert
 * and offset); the KV rows already written for this chunk are then simply
 * not counted by the caller.
 *
 * Waves: when the expert source cannot hold a layer's whole set at once,
 * the layer's experts are computed in waves (expert_src.h). Each expert
 * writes only the hidden and output rows of the row-slots routed to it,
 * and the rows are summed after the last wave, so the result is the same
 * bytes whatever the waves.
 *
 * Read-ahead (read_ahead = N > 0 and a source that can prefetch): in layer
 * L, once its demand reads are queued, the hidden state chosen by ra_from is
 * normed with layer L+1's ffn_norm and run through layer L+1's router; the
 * top N experts of every row (distinct, most-voted first) are handed to
 * expert_src_prefetch. It changes what is read when, never the result. */
int qwen3moe_forward(const qwen3moe *m, const kv_cache_view *kv, qwen3moe_scratch *s,
                     const int32_t *ids, int n, int pos0, int n_out, float *logits, err *e);

#endif

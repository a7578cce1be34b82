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
#include "util/err.h"
#include "util/threadpool.h"

/* What the forward reads: all borrowed from the engine. */
typedef struct qwen3moe {
    const hparams *hp;
    const weights *w;
    expert_src    *xs;
    tpool         *pool;
    const float   *f16_tab;   /* ops_f16_table_init */
    ops_kernels    kern;      /* ops_kernels_get(isa) */
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

/* Buffers for chunks of up to n_batch rows with up to n_ctx positions on a
 * pool of n_threads. *out owned by the caller. */
int  qwen3moe_scratch_open(qwen3moe_scratch **out, const qwen3moe *m, int n_batch, int n_ctx, err *e);
void qwen3moe_scratch_close(qwen3moe_scratch *s);   /* NULL is a no-op */
uint64_t qwen3moe_scratch_bytes(const qwen3moe_scratch *s);

/* Evaluate tokens ids[0..n) at positions pos0..pos0+n-1 (1 <= n <= n_batch,
 * pos0 + n <= n_ctx, ids already range-checked): writes their K/V into the
 * cache and, if n_out > 0, the logits of the last n_out rows to
 * logits[n_out][n_vocab] (row j = after token n - n_out + j). n_out = 0
 * skips the head (and the last layer's MoE, which only feeds it). Errors
 * come only from the expert source. */
int qwen3moe_forward(const qwen3moe *m, const kv_cache_view *kv, qwen3moe_scratch *s,
                     const int32_t *ids, int n, int pos0, int n_out, float *logits, err *e);

#endif

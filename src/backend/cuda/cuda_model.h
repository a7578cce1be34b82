/* cuda_model: the qwen3moe forward pass on the GPU with every weight
 * resident in VRAM (issue 9, second slice). Plain C host code over the
 * kernels of cuda_backend.h; built into libstrata_cuda.a by `make cuda`.
 *
 * Per token the same graph as model/qwen3moe.c (see qwen3moe.h for the
 * math): embedding row (cuda_get_rows), per layer RMSNorm -> Q/K/V matvecs
 * -> per-head Q/K RMSNorm -> NeoX RoPE -> KV store -> attention -> Wo ->
 * residual add -> RMSNorm -> router matvec -> softmax/top-k -> gate/up of
 * the k experts picked by the device id array -> SwiGLU -> re-quantize ->
 * down -> weighted combine into the residual; output RMSNorm -> head ->
 * logits (or argmax on the device). Nothing of a token goes through host
 * memory except what the caller asks for (logits, ids): with every expert
 * resident the expert ids never leave the GPU; with the expert arena
 * (arena_bytes) each layer's ids come to the host to place misses.
 *
 * Numerics: each kernel states its agreement with the CPU function it
 * mirrors (cuda_backend.h); float summation orders differ, so the logits
 * agree with the CPU engine within a tolerance (tests/cuda/test_cuda_model.c
 * states it: NMSE of every layer's output and of the logits) and greedy
 * tokens agree unless two logits are closer than that noise.
 *
 * Decode rows are evaluated one at a time (matvec kernels); a prompt runs
 * in chunks (cuda_model_set_chunk): grouped matmuls for the projections and
 * the experts, attention still row by row. */
#ifndef STRATA_CUDA_MODEL_H
#define STRATA_CUDA_MODEL_H

#include <stdint.h>

#include "model/expert_src.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "util/err.h"

typedef struct cuda_model cuda_model;   /* opaque */

typedef struct cuda_model_opts {
    int device;     /* CUDA ordinal, 0 = first */
    int n_ctx;      /* KV cache positions (>= 1) */
    int kv_f16;     /* 1: K/V cache in f16 (the CPU engine's default), 0: f32 */
    /* 0: every expert resident in VRAM. > 0: the VRAM expert arena: the
     * routed experts live in slots of one (gate, up, down) each, this many
     * bytes in all (at least n_expert_used slots), shared by all layers
     * and replaced least recently used. Each layer's expert ids go to the
     * host (one synchronous download a layer), so rows run the plain path,
     * not graphs. A miss is copied on the copy stream (cuda_copy_h2d) from
     * the host tier: `host` when set, else the file mapping of `w` (which
     * must then outlive the model; it is page-locked read-only when it is
     * at most half of the machine's RAM, else copied from pageable memory). */
    uint64_t arena_bytes;
    /* With an arena: before layer l's own routing, layer l+1's ffn_norm and
     * router run on the same residual (as the CPU engine's read-ahead from
     * attn) and its top read_ahead experts (at most 32) come down with
     * layer l's ids. Without `host` those not in the arena are copied
     * into it on the copy stream behind layer l's misses, overlapping layer
     * l's expert compute and layer l+1's attention; with `host` they go
     * through the host tier (begun, waited, copied, ended as layer l + 1's
     * demands there) once layer l's kernels are enqueued, so the GPU
     * computes layer l meanwhile. Never changes results. 0: off. */
    int read_ahead;
    /* The host tier (borrowed, must outlive the model), NULL: the mapping.
     * A layer's misses are begun in it (waves when they do not fit), waited,
     * copied from its get() pointers, and ended after the copies finished.
     * `w` may then be WEIGHTS_RESIDENT_ONLY. host_mem/host_mem_bytes: its
     * slot memory, page-locked at open when the system allows (NULL: none). */
    expert_src *host;
    void       *host_mem;
    uint64_t    host_mem_bytes;
} cuda_model_opts;

/* Counters of the VRAM expert arena since open (zeros without one). */
typedef struct cuda_arena_stats {
    int      n_slots;       /* experts the arena holds */
    uint64_t hits, misses;  /* expert lookups: one per routed expert per layer per row; in a prompt
                               chunk one per distinct expert per layer per chunk */
    uint64_t bytes_h2d;     /* expert bytes copied host -> device (misses and prefetches) */
    uint64_t prefetched;    /* experts copied ahead by read-ahead (no host tier) */
    uint64_t prefetch_used; /* of them, looked up by their layer before eviction (counted as hits) */
    uint64_t pinned_bytes;  /* host memory page-locked for the copies (0: pageable) */
} cuda_arena_stats;

/* Open the GPU, upload every tensor of `w` (WEIGHTS_MAP_ALL: the expert
 * tensors are read from its mapping; with o->host it may be
 * WEIGHTS_RESIDENT_ONLY), allocate the KV cache and the scratch for one
 * row. ERR_UNSUPPORTED without a GPU (callers skip), ERR_NOMEM when VRAM is
 * short (the message names the bytes needed and free), ERR_USAGE for a host
 * tier or read-ahead without an arena, ERR_UNSUPPORTED for a tensor type
 * without a kernel (named). hp and w are borrowed only during the call
 * (but see arena_bytes). */
int  cuda_model_open(cuda_model **out, const hparams *hp, const weights *w, const cuda_model_opts *o, err *e);
void cuda_model_close(cuda_model *m);   /* NULL is a no-op */

/* Evaluate ids[0..n) at positions pos0..pos0+n-1 (0 <= pos0,
 * pos0 + n <= n_ctx, every id < n_vocab: checked on the host, ERR_RANGE)
 * and, when logits != NULL, copy the last row's n_vocab logits to the host.
 * One upload of the ids (and of the two step slots), then every row is
 * enqueued -- with graphs on, as one replay of a captured graph per row
 * (one for the rows without logits, one for the row with them); returns
 * after the device is done. */
int  cuda_model_eval(cuda_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e);

/* Greedy decode on the device: feed `first` at position pos0, then each
 * step's argmax at the next position, n_steps times in all; out_ids[i] is
 * the argmax after step i. The ids stay on the device until the end (one
 * download of n_steps ids). pos0 + n_steps <= n_ctx. */
int  cuda_model_greedy(cuda_model *m, int32_t first, int pos0, int n_steps, int32_t *out_ids, err *e);

/* Execution of eval and greedy rows: on (the default), each row is one
 * replay of a CUDA graph captured at its first use (the token and position
 * live in device slots); off, each row enqueues its ~12 kernels a layer
 * one by one (the reference path). Both give the same results, bit for
 * bit. */
void cuda_model_set_graph(cuda_model *m, int on);

/* Record the residual stream after each layer in cuda_model_eval (for
 * cuda_model_layer_outputs; off by default: it costs a copy a layer and
 * runs the plain path). */
void cuda_model_set_record(cuda_model *m, int on);

/* A prompt of several rows runs in chunks of up to 256 rows (with an
 * arena at most n_slots / n_expert_used): layer by layer, the dense
 * projections as grouped matmuls over the chunk's rows, each row's
 * attention in order, then the chunk's MoE with the rows routed to each
 * expert multiplied together (and, with an arena, one lookup and one copy
 * per distinct expert): bit-identical to rows one at a time. This caps the
 * chunk at `rows` (1: rows one at a time, by graphs unless the arena or
 * recording is on; 0: no cap); for tests and benchmarks. */
void cuda_model_set_chunk(cuda_model *m, int rows);
/* Kernels a greedy step launches (the nodes of its graph: the token's
 * chain of dependent steps); -1 before the first graph greedy. */
int  cuda_model_graph_kernels(const cuda_model *m);

/* The matvec kernel choice (cuda_matvec_force: 0 by shape, 1 tile, 2
 * direct) for a benchmark; drops the captured graphs (recaptured at next
 * use with the new choice). */
void cuda_model_set_matvec(cuda_model *m, int mode);
/* Programmatic dependent launch on (the default) or off (cuda_set_pdl),
 * for a benchmark's A/B; drops the captured graphs likewise. */
void cuda_model_set_pdl(cuda_model *m, int on);
/* The decode attention's launch shape for a benchmark: the cluster cap and
 * the query heads a CTA (cuda_attention_force_cluster / _heads; 0: the
 * defaults); results differ only in summation order. Drops the captured
 * graphs likewise. */
void cuda_model_set_attention(cuda_model *m, int cluster, int heads);

/* The decode row's kernels of a layer, in order, for cuda_model_set_skip.
 * CUDA_STAGE_COMBINE is the MoE combine with the next norm + quantization
 * when they share its launch; CUDA_STAGE_ATTN the attention with the Q/K
 * norm, RoPE and K/V store (cuda_attention_decode_fused), so
 * CUDA_STAGE_ROPE has a kernel only in a layer that stops after its K/V
 * store. CUDA_STAGE_WO_QUANT and CUDA_STAGE_DOWN_QUANT have kernels only
 * where Wo's or down's dot type is not Q8_K / Q8_0: otherwise the matvec
 * quantizes its own input (cuda_matvec_args.xquant). */
enum {
    CUDA_STAGE_NONE, CUDA_STAGE_QKV, CUDA_STAGE_ROPE, CUDA_STAGE_ATTN, CUDA_STAGE_WO_QUANT, CUDA_STAGE_WO,
    CUDA_STAGE_FFN_NORM, CUDA_STAGE_ROUTER, CUDA_STAGE_TOPK, CUDA_STAGE_GATE_UP, CUDA_STAGE_DOWN_QUANT,
    CUDA_STAGE_DOWN, CUDA_STAGE_COMBINE, CUDA_STAGE_COUNT
};
/* A benchmark's instrument: every layer of the row path leaves out the
 * kernels of `stage` (CUDA_STAGE_NONE: none), so the token time saved is
 * that stage's share of the dependent chain, overlap included. The
 * results are then wrong (later kernels read stale buffers) while the
 * work of the others is the same. Drops the captured graphs likewise. */
void cuda_model_set_skip(cuda_model *m, int stage);
/* The model's device context, for a benchmark's instruments that work on
 * it directly (cuda_trace_*); the model keeps owning it. */
struct cuda_ctx *cuda_model_cuda(cuda_model *m);
/* "qkv", "rope", ... ("?" out of range) */
const char *cuda_model_stage_name(int stage);

/* The residual stream after each layer for the last row of the latest
 * cuda_model_eval: out[l * n_embd + i], n_layer rows (for per-layer NMSE
 * against the CPU). ERR_USAGE when there is none (recording off, no eval
 * yet, or a cuda_model_greedy ran since: its steps do not record them). */
int  cuda_model_layer_outputs(cuda_model *m, float *out, err *e);
/* The experts each layer chose for that row: out[l * n_expert_used + t],
 * in the router's order (same conditions as cuda_model_layer_outputs). */
int  cuda_model_layer_experts(cuda_model *m, int32_t *out, err *e);

void cuda_model_arena_stats(const cuda_model *m, cuda_arena_stats *out);

/* Bytes of VRAM the model holds (weights + KV + scratch), and the device
 * name. */
uint64_t    cuda_model_vram_bytes(const cuda_model *m);
const char *cuda_model_device_name(const cuda_model *m);

#endif

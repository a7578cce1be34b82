/* backend: the interface through which the engine runs the forward pass on
 * a device other than the CPU (issue 9). The CPU forward (model/qwen3moe.c,
 * driven by runtime/session.c) is the reference every backend is tested
 * against; a backend computes the same function of (tokens, positions) ->
 * logits on its own memory: its own copy of the weights and its own KV
 * cache.
 *
 * The library (libstrata.a) knows backends only through this table, so it
 * never links a device runtime: a program built with one (build/cuda/strata,
 * `make cuda`) passes its table in engine_opts.backend.
 *
 * Contract of the functions:
 *   open   upload / prepare everything for the model of hp and w (w is
 *          WEIGHTS_MAP_ALL, or WEIGHTS_RESIDENT_ONLY when o->host is set)
 *          as o says (backend_open_opts). Errors: ERR_* code plus message,
 *          e.g. ERR_UNSUPPORTED without a device, ERR_USAGE for options that
 *          do not go together (a host tier without a device arena).
 *   eval   evaluate ids[0..n) at positions pos0..pos0+n-1 (checked by the
 *          caller: 1 <= n, pos0 + n <= n_ctx, ids < n_vocab); positions from
 *          pos0 on are overwritten in the backend's KV cache (so rewinding a
 *          timeline is just evaluating at an earlier pos0). When logits is
 *          not NULL it receives the last row's n_vocab logits.
 *   close  free everything (NULL is a no-op).
 *   describe  one line for the load summary: device, memory held.
 *   stats  the device arena's counters (backend_stats). */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include <stdint.h>

#include "model/expert_src.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "util/err.h"

typedef struct backend_model backend_model;   /* opaque, the backend's own */

/* How a backend opens a model: its KV cache and where its routed experts
 * live (issue 9's tiers: device arena, host RAM, SSD). */
typedef struct backend_open_opts {
    int      n_ctx;         /* KV cache positions */
    int      kv_f16;        /* 1: f16 K/V cache, 0: f32 */
    /* 0: every weight on the device (w borrowed during open only). > 0: the
     * routed experts live in a device arena of that many bytes, filled on a
     * miss from the host tier below (w must outlive the model; the engine
     * keeps it). */
    uint64_t arena_bytes;
    /* With an arena: after routing layer l, run layer l+1's router on the
     * same residual and prefetch its top read_ahead experts per row into
     * the device arena (host = NULL) or the host tier (host set). Never
     * changes results; 0: off. */
    int      read_ahead;
    /* The host tier, NULL: misses copy from w's file mapping (page-locked
     * when the system allows). Else the engine's expert store (xstore over
     * the SSD, `--host-cache SIZE`): a miss is begun, waited and got
     * through it (expert_src protocol, one layer at a time), copied, and
     * ended once the copy is done. Borrowed; must outlive the model. */
    expert_src *host;
    /* The host tier's memory (its slot arena), page-locked by the backend
     * for fast copies when the system allows; NULL / 0: none. */
    void    *host_mem;
    uint64_t host_mem_bytes;
} backend_open_opts;

/* Counters of a backend's device expert arena since open (zeros without
 * one). */
typedef struct backend_stats {
    int      n_slots;           /* experts the device arena holds */
    uint64_t hits, misses;      /* lookups: one per routed expert per layer per row */
    uint64_t bytes_h2d;         /* expert bytes copied host -> device (misses and prefetches) */
    uint64_t prefetched;        /* experts copied ahead by read-ahead */
    uint64_t prefetch_used;     /* of them, looked up by their layer before eviction */
    uint64_t pinned_bytes;      /* host memory page-locked for the copies (0: pageable) */
} backend_stats;

typedef struct backend_iface {
    const char *name;   /* "CUDA" */
    int  (*open)(backend_model **out, const hparams *hp, const weights *w, const backend_open_opts *o, err *e);
    int  (*eval)(backend_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e);
    void (*close)(backend_model *m);
    void (*describe)(const backend_model *m, char *buf, size_t cap);
    void (*stats)(const backend_model *m, backend_stats *out);
} backend_iface;

#endif

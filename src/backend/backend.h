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
 *          WEIGHTS_MAP_ALL) with a KV cache of n_ctx positions (f16 when
 *          kv_f16, else f32). arena_bytes 0: every weight on the device (w
 *          borrowed during the call only); > 0: the routed experts live in
 *          a device arena of that many bytes, filled from w's mapping on a
 *          miss (w must outlive the model; the engine keeps it). Errors:
 *          ERR_* code plus message, e.g. ERR_UNSUPPORTED without a device.
 *   eval   evaluate ids[0..n) at positions pos0..pos0+n-1 (checked by the
 *          caller: 1 <= n, pos0 + n <= n_ctx, ids < n_vocab); positions from
 *          pos0 on are overwritten in the backend's KV cache (so rewinding a
 *          timeline is just evaluating at an earlier pos0). When logits is
 *          not NULL it receives the last row's n_vocab logits.
 *   close  free everything (NULL is a no-op).
 *   describe  one line for the load summary: device, memory held. */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include <stdint.h>

#include "model/hparams.h"
#include "model/weights.h"
#include "util/err.h"

typedef struct backend_model backend_model;   /* opaque, the backend's own */

typedef struct backend_iface {
    const char *name;   /* "cuda" */
    int  (*open)(backend_model **out, const hparams *hp, const weights *w, int n_ctx, int kv_f16,
                 uint64_t arena_bytes, err *e);
    int  (*eval)(backend_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e);
    void (*close)(backend_model *m);
    void (*describe)(const backend_model *m, char *buf, size_t cap);
} backend_iface;

#endif

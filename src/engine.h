/* engine: strata's public C API. The CLI, the server, the eval tools and the
 * benches include this header and nothing below src/ (make check-includes).
 *
 * An `engine` is a loaded model (weights, tokenizer, kernels, thread pool);
 * a `session` is one timeline owning a KV cache. One engine may have several
 * sessions, but sessions of one engine must not evaluate concurrently (they
 * share the thread pool and scratch).
 *
 * Errors: 0 or a negative ERR_* code plus a message in `err` (util/err.h).
 * The library never exits and never prints except through the log callback
 * in the options (progress and load summaries go to stderr by default). */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

typedef struct engine  engine;
typedef struct session session;

typedef struct engine_opts {
    const char *model_path;   /* GGUF file (required) */
    int   n_threads;          /* <= 0: all online CPUs */
    int   n_ctx;              /* <= 0: min(model context length, 4096) */
    int   n_batch;            /* prompt chunk; <= 0: 2048 */
    int   type_k, type_v;     /* KV cache types: QTYPE_F16 (default when 0... see below) or QTYPE_F32 */
    int   kv_types_set;       /* nonzero when type_k/type_v were given; else F16 */
    int   verbose;            /* print the load summary to `log` */
    FILE *log;                /* NULL: stderr */
} engine_opts;

int  engine_open(engine **out, const engine_opts *o, err *e);
void engine_close(engine *eng);          /* NULL is a no-op */

/* Model facts. */
int32_t     engine_n_vocab(const engine *eng);
int         engine_n_ctx(const engine *eng);
const char *engine_arch(const engine *eng);       /* "qwen3moe" */
const char *engine_model_desc(const engine *eng); /* one line: arch, size, type mix */
uint64_t    engine_model_bytes(const engine *eng);
uint64_t    engine_model_params(const engine *eng);
const char *engine_chat_template(const engine *eng); /* tokenizer.chat_template or NULL */
double      engine_load_ms(const engine *eng);

/* Tokenizer (see tokenizer.h for semantics). */
int engine_tokenize(const engine *eng, const char *text, size_t len, int add_bos,
                    int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e);
int engine_token_piece(const engine *eng, int32_t id, int special, char *buf, size_t cap);
int engine_token_is_eog(const engine *eng, int32_t id);
int engine_add_bos(const engine *eng);
int32_t engine_token_bos(const engine *eng);
int32_t engine_token_find(const engine *eng, const char *text);

/* ==== Sessions ==== */
int  session_create(session **out, engine *eng, err *e);
void session_free(session *s);           /* NULL is a no-op */
int  session_n_past(const session *s);   /* tokens in the KV cache */
/* Drop cached tokens from position n_keep on (0 clears). */
void session_truncate(session *s, int n_keep);

/* Append n tokens at positions n_past..n_past+n-1 (split into n_batch chunks
 * internally) and compute. If logits_out is not NULL it receives the logits
 * of the LAST token (n_vocab floats). If all_logits is not NULL it receives
 * n x n_vocab floats (row i = logits after token i). ERR_RANGE when the
 * context would overflow or an id is out of the vocabulary. */
int session_eval(session *s, const int32_t *ids, int n, float *logits_out,
                 float *all_logits, err *e);

/* ==== Sampling (llama.cpp's sampler chain semantics) ==== */
typedef struct sampler_opts {
    float    temp;            /* <= 0: greedy (argmax, first max wins) */
    int      top_k;           /* <= 0: off; llama.cpp default 40 */
    float    top_p;           /* >= 1: off; default 0.95 */
    float    min_p;           /* <= 0: off; default 0.05 */
    float    repeat_penalty;  /* 1: off */
    int      repeat_last_n;   /* default 64 */
    uint64_t seed;
} sampler_opts;

typedef struct sampler sampler;
/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat 1.0/64, seed random. */
sampler_opts sampler_default_opts(void);
int  sampler_open(sampler **out, const sampler_opts *o, int32_t n_vocab, err *e);
void sampler_close(sampler *sm);
/* Remember an accepted token (for the repeat penalty). */
void sampler_accept(sampler *sm, int32_t id);
/* Pick the next token from n_vocab logits (logits may be modified). */
int32_t sampler_sample(sampler *sm, float *logits);

#endif

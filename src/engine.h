/* engine: strata's public C API. The CLI, the server, the eval tools and the
 * benches include this header and nothing below src/ (make check-includes).
 *
 * An `engine` is a loaded model (weights, tokenizer, kernels, thread pool);
 * a `session` is one timeline owning a KV cache and its forward scratch.
 * One engine may have several sessions, but sessions of one engine must not
 * evaluate concurrently (they share the thread pool).
 *
 * Errors: 0 or a negative ERR_* code plus a message in `err` (util/err.h).
 * The library never exits and never prints, except the load summary that
 * engine_open writes to opts.log when opts.verbose is set. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

typedef struct engine  engine;
typedef struct session session;

/* KV cache element types; the zero value is llama.cpp's default (f16). */
enum engine_kv_type { ENGINE_KV_F16 = 0, ENGINE_KV_F32 = 1 };

typedef struct engine_opts {
    const char *model_path;   /* GGUF file (required) */
    int   n_threads;          /* <= 0: all online CPUs */
    int   n_ctx;              /* 0: min(model context length, 4096);
                                 ENGINE_CTX_TRAIN: the model's context length */
    int   n_batch;            /* rows per forward chunk (llama.cpp's physical batch,
                                 -ub); <= 0: 512. Clamped to n_ctx. */
    int   kv_type_k, kv_type_v; /* enum engine_kv_type */
    int   verbose;            /* print the load summary to `log` */
    FILE *log;                /* NULL: stderr */
} engine_opts;

#define ENGINE_CTX_TRAIN (-1)

/* Open a model: parse the GGUF, check the architecture (qwen3moe; others are
 * ERR_UNSUPPORTED naming it), bind and validate every tensor, map the file,
 * build the tokenizer, start the thread pool. *out owned by the caller. */
int  engine_open(engine **out, const engine_opts *o, err *e);
void engine_close(engine *eng);          /* NULL is a no-op */

/* Model facts. Strings are owned by the engine. */
int32_t     engine_n_vocab(const engine *eng);
int         engine_n_ctx(const engine *eng);        /* sessions' context size */
int         engine_n_ctx_train(const engine *eng);
int         engine_n_batch(const engine *eng);
int         engine_n_threads(const engine *eng);
const char *engine_arch(const engine *eng);         /* "qwen3moe" */
const char *engine_model_desc(const engine *eng);   /* one line: arch, shape, size, type mix */
uint64_t    engine_model_bytes(const engine *eng);  /* bytes of all tensors */
uint64_t    engine_model_params(const engine *eng);
const char *engine_chat_template(const engine *eng); /* tokenizer.chat_template or NULL */
double      engine_load_ms(const engine *eng);

/* Tokenizer (see tokenizer.h for semantics). */
int engine_tokenize(const engine *eng, const char *text, size_t len, int add_bos,
                    int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e);
/* Bytes of a token's text (CONTROL tokens only with special != 0); returns
 * the piece length (may exceed cap: truncated) or ERR_RANGE. */
int engine_token_piece(const engine *eng, int32_t id, int special, char *buf, size_t cap);
int engine_token_is_eog(const engine *eng, int32_t id);
int engine_add_bos(const engine *eng);
int32_t engine_token_bos(const engine *eng);          /* -1 if none */
int32_t engine_token_find(const engine *eng, const char *text);   /* exact token text, or -1 */

/* ==== Chat templates ==== */
typedef struct engine_chat_msg {
    const char *role;         /* "system", "user", "assistant" */
    const char *content;
} engine_chat_msg;

/* Format a conversation with a chat template: `name` selects a built-in
 * template by name (NULL: detect it from the model's tokenizer.chat_template).
 * add_assistant appends the assistant turn's opening. Writes at most cap
 * bytes (NUL-terminated when cap > 0) and returns the full length, or a
 * negative ERR_* (ERR_UNSUPPORTED: no template known for this model). */
int engine_chat_apply(const engine *eng, const char *name, const engine_chat_msg *msgs, size_t n_msgs,
                      int add_assistant, char *buf, size_t cap, err *e);

/* ==== Sessions ==== */

/* Allocates the KV cache (n_ctx positions) and the forward scratch (n_batch
 * rows): everything a session will ever use. *out owned by the caller. */
int  session_create(session **out, engine *eng, err *e);
void session_free(session *s);           /* NULL is a no-op */
int  session_n_past(const session *s);   /* tokens in the KV cache */
/* Drop cached tokens from position n_keep on (0 clears). */
void session_truncate(session *s, int n_keep);
/* Bytes the session holds (KV cache + scratch). */
uint64_t session_bytes(const session *s);

/* Append n tokens at positions n_past..n_past+n-1 (split into n_batch chunks
 * internally) and compute. If logits_out is not NULL it receives the logits
 * of the LAST token (n_vocab floats). If all_logits is not NULL it receives
 * n x n_vocab floats (row i = logits after token i). ERR_RANGE when the
 * context would overflow or an id is out of the vocabulary; ERR_IO when the
 * model file changed on disk. On error n_past is unchanged. Allocates
 * nothing. */
int session_eval(session *s, const int32_t *ids, int n, float *logits_out,
                 float *all_logits, err *e);

/* ==== Sampling (llama.cpp's sampler chain semantics) ====
 * The chain is llama.cpp's default for llama-cli / llama-completion:
 * penalties -> top_k -> top_p -> min_p -> temperature -> dist, each stage
 * as in src/llama-sampling.cpp (same candidate order, float/double sums).
 * dist draws from std::mt19937 seeded with `seed` and a uniform double in
 * [0, 1) made from two 32-bit outputs (libstdc++ generate_canonical), so
 * the same seed and logits give llama.cpp's token. temp <= 0 is greedy:
 * argmax after the penalties, the lowest id winning ties. */
typedef struct sampler_opts {
    float    temp;            /* <= 0: greedy; default 0.8 */
    int      top_k;           /* <= 0: off; default 40 */
    float    top_p;           /* >= 1: off; default 0.95 */
    float    min_p;           /* <= 0: off; default 0.05 */
    float    repeat_penalty;  /* 1: off (default) */
    int      repeat_last_n;   /* tokens the penalty looks back; 0: off; default 64 */
    uint32_t seed;
} sampler_opts;

typedef struct sampler sampler;
/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat
 * 1.0 over 64; seed 0 (callers pick a random seed when the user gives none). */
sampler_opts sampler_default_opts(void);
/* Allocates the candidate array and the penalty window (n_vocab entries). */
int  sampler_open(sampler **out, const sampler_opts *o, int32_t n_vocab, err *e);
void sampler_close(sampler *sm);          /* NULL is a no-op */
/* Remember an accepted token (prompt tokens too, as llama.cpp does): the
 * repeat penalty counts the last repeat_last_n accepted tokens. */
void sampler_accept(sampler *sm, int32_t id);
/* Pick the next token from n_vocab logits (not modified). Allocates nothing. */
int32_t sampler_sample(sampler *sm, const float *logits);

#endif

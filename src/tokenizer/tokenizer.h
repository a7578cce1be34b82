/* tokenizer: llama.cpp-compatible tokenization from GGUF metadata.
 *
 * Supports tokenizer.ggml.model = "gpt2" (byte-level BPE) with the
 * pre-tokenizers qwen2, llama-bpe, deepseek-v3, gpt-4o (regexes run by PCRE2
 * with Unicode properties), and "llama" (SentencePiece, e.g. Mixtral).
 * Special tokens (CONTROL / USER_DEFINED / UNKNOWN) are matched as llama.cpp
 * does (longest first; with parse_special=0 only USER_DEFINED match).
 * An unknown pre-tokenizer or model is ERR_UNSUPPORTED, naming it.
 *
 * Thread-safety: a tokenizer is immutable after open; encode/decode may run
 * concurrently from several threads (they use only caller-provided buffers
 * plus internal per-call scratch). */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "util/err.h"
#include "gguf/gguf.h"

typedef struct tokenizer tokenizer;

enum tok_attr {          /* tokenizer.ggml.token_type values */
    TOK_NORMAL       = 1,
    TOK_UNKNOWN      = 2,
    TOK_CONTROL      = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED       = 5,
    TOK_BYTE         = 6,
};

/* Build from the file's tokenizer.* keys (copies what it needs; the gguf_file
 * may be closed afterwards). *out owned by caller. */
int  tokenizer_open(tokenizer **out, const gguf_file *f, err *e);
void tokenizer_close(tokenizer *t);

int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);      /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t);      /* -1 if none */
int     tokenizer_add_bos(const tokenizer *t);  /* tokenizer.ggml.add_bos_token (or model default) */
int     tokenizer_is_eog(const tokenizer *t, int32_t id);
int     tokenizer_attr(const tokenizer *t, int32_t id);  /* TOK_* */
const char *tokenizer_model_name(const tokenizer *t);    /* "gpt2" / "llama" */
const char *tokenizer_pre_name(const tokenizer *t);      /* "qwen2", ... */
/* Token id of an exact token text, or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len);

/* Encode text (UTF-8, len bytes; need not be NUL-terminated). Writes at most
 * cap ids; *n_out receives the total count (which may exceed cap: then
 * ERR_RANGE is returned and the caller retries with a bigger buffer).
 * add_bos: prepend BOS if the model has one and add_bos is nonzero.
 * parse_special: recognise CONTROL tokens' text in the input. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                     int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e);

/* Bytes of token id's piece (after reversing the byte-level map). CONTROL
 * tokens render as their text only when special != 0, else empty.
 * Returns the number of bytes the piece has (may exceed cap: output is then
 * truncated), or a negative ERR_RANGE for an invalid id. */
int tokenizer_piece(const tokenizer *t, int32_t id, int special, char *buf, size_t cap);

#endif

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
 * plus internal per-call scratch).
 *
 * Checked by: tests/unit/test_tokenizer.c, the golden ids of
 * tests/golden/ (an independent Python reference, itself cross-checked
 * against HuggingFace tokenizers) and tests/fuzz/fuzz_tokenizer.c. */
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
 * may be closed afterwards). *out owned by caller. Errors: ERR_NOTFOUND (no
 * tokenizer.ggml.model / tokens / merges), ERR_UNSUPPORTED (model or
 * pre-tokenizer we do not run, named in the message), ERR_FORMAT (wrong key
 * types, arrays shorter than the vocabulary, duplicate tokens, add_bos
 * without a BOS id), ERR_NOMEM. */
int  tokenizer_open(tokenizer **out, const gguf_file *f, err *e);
void tokenizer_close(tokenizer *t);   /* NULL is a no-op */

int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);      /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t);      /* -1 if none */
int32_t tokenizer_eot(const tokenizer *t);      /* end of turn (key or auto-detected), -1 if none */
int     tokenizer_add_bos(const tokenizer *t);  /* tokenizer.ggml.add_bos_token (or model default) */
int     tokenizer_add_eos(const tokenizer *t);  /* tokenizer.ggml.add_eos_token (default 0) */
/* End of generation: eos, eot, eom and the tokens llama.cpp recognises by
 * text (<|im_end|>, <|endoftext|>, <|eot_id|>, <|return|>, <|call|>, ...,
 * fim pad/repo/sep), with its gpt-oss and gemma exceptions. */
int     tokenizer_is_eog(const tokenizer *t, int32_t id);
/* TOK_* of id after llama.cpp's overrides (EOG/FIM-looking tokens forced to
 * CONTROL, gpt-oss <|channel|> etc. to USER_DEFINED); 0 for an undefined
 * type or an invalid id. */
int     tokenizer_attr(const tokenizer *t, int32_t id);
const char *tokenizer_model_name(const tokenizer *t);    /* "gpt2" / "llama" */
const char *tokenizer_pre_name(const tokenizer *t);      /* "qwen2", ..., "default" */
/* The first load warning ("" if none): a missing tokenizer.ggml.pre (then
 * the "default" pre-tokenizer is used, as llama.cpp does), an out-of-range
 * special token id, an empty token. The library never prints it. */
const char *tokenizer_warning(const tokenizer *t);
/* Token id of an exact token text, or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len);
/* The stored text of token id (borrowed, valid until close; not
 * NUL-terminated), or NULL for an invalid id. */
const char *tokenizer_text(const tokenizer *t, int32_t id, size_t *len);

/* Encode text (bytes; need not be NUL-terminated or valid UTF-8). Writes at
 * most cap ids; *n_out receives the total count (which may exceed cap: then
 * ERR_RANGE is returned, with a message in e, and the caller retries with a
 * bigger buffer; ids may be NULL with cap 0 to count).
 * Speed: the encoding is O(n log n); repeated words are looked up in a
 * per-call cache, so passing a whole corpus at once is the fast way.
 * add_bos is llama_tokenize's add_special: BOS is prepended when add_bos and
 * the model's add_bos flag (tokenizer_add_bos) are both set, and EOS appended
 * when add_bos and the model's add_eos flag are. So a caller passes 1 unless
 * it wants no special tokens (llama-tokenize --no-bos passes 0).
 * parse_special: recognise CONTROL/UNKNOWN tokens' text in the input
 * (USER_DEFINED tokens are always recognised).
 * Invalid UTF-8 is read as llama.cpp reads it (U+FFFD per bad byte) for BPE
 * models; SPM models fall back to byte tokens. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                     int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e);

/* Bytes of token id's piece (llama_token_to_piece): byte-level BPE texts are
 * mapped back to bytes, SPM U+2581 becomes a space, byte tokens their byte.
 * CONTROL and UNKNOWN tokens render as their text only when special != 0,
 * else empty; USER_DEFINED always render. Returns the number of bytes the
 * piece has (may exceed cap: output is then truncated), or a negative
 * ERR_RANGE for an invalid id. buf may be NULL when cap is 0. */
int tokenizer_piece(const tokenizer *t, int32_t id, int special, char *buf, size_t cap);

/* ==== Building blocks shared with vocabulary training (mkmodel) ==== */

/* Split text with the named pre-tokenizer's regex ("qwen2", "llama-bpe",
 * "deepseek-v3", "gpt-4o", any tokenizer.ggml.pre value tokenizer_open
 * accepts, or "default"); cb receives each piece in order. Pieces cover the
 * text exactly after llama.cpp's UTF-8 reading (identical to the input for
 * valid UTF-8; invalid bytes become U+FFFD). They are raw text, not yet
 * byte-mapped (see tokenizer_byte_to_utf8). ERR_UNSUPPORTED for an unknown
 * name. Compiles the regexes on each call: split a whole corpus at once. */
typedef void (*tokenizer_piece_cb)(void *ctx, const char *piece, size_t n);
int tokenizer_pre_split(const char *pre, const char *text, size_t len,
                        tokenizer_piece_cb cb, void *ctx, err *e);

/* GPT-2 byte-level map: the UTF-8 encoding (1-2 bytes) of the code point
 * that stands for byte b. Returns the number of bytes written to out. */
int tokenizer_byte_to_utf8(uint8_t b, char out[4]);

#endif

/* tok_pre: the text side of byte-level BPE, private to the tokenizer:
 * llama.cpp's UTF-8 canonicalisation, the GPT-2 byte<->code point map and the
 * pre-tokenizers (regex splitting with PCRE2).
 *
 * What llama.cpp does, and what this module reproduces:
 *  - unicode_cpts_from_utf8 decodes leniently: a byte that does not start a
 *    complete sequence becomes U+FFFD (one byte consumed), overlong forms
 *    decode to their value and are re-encoded in the shortest form, surrogates
 *    pass through. Code points above U+10FFFF (F4 90.. and F5..F7 leads) make
 *    llama.cpp throw; here the whole 4-byte sequence becomes one U+FFFD.
 *    tok_utf8_canon() produces that canonical text.
 *  - unicode_regex_split applies a list of regexes in turn; each splits every
 *    piece of the previous one, and text between matches stays a piece of its
 *    own, so pieces always cover the text. For qwen2 / llama3 / gpt2 llama.cpp
 *    runs hand-written splitters that are equivalent to the regex; for the
 *    others it runs std::regex on a "collapsed" text (one byte per code point,
 *    chosen by Unicode category). We run every regex with PCRE2 (UTF + UCP),
 *    with `\s` spelled as the explicit class llama.cpp uses (Python `regex`
 *    \s, i.e. Unicode White_Space including U+0085), and we reproduce the one
 *    visible quirk of the collapsed path that our families hit: its ASCII
 *    \p{S} lacks '~' (deepseek-v3).
 *  - Category tables: PCRE2's Unicode version stands in for llama.cpp's
 *    generated tables; they differ only for code points assigned in between.
 *
 * Thread-safety: a tok_pre is immutable after open; tok_pre_split uses only
 * the caller's scratch. */
#ifndef STRATA_TOK_PRE_H
#define STRATA_TOK_PRE_H

#include <stddef.h>
#include <stdint.h>
#include "util/err.h"

enum tok_pre_kind {
    TOK_PRE_DEFAULT = 0,   /* llama.cpp's fallback when tokenizer.ggml.pre is missing */
    TOK_PRE_QWEN2,
    TOK_PRE_QWEN35,
    TOK_PRE_LLAMA3,
    TOK_PRE_DEEPSEEK3,
    TOK_PRE_GPT4O,
};

typedef struct tok_pre_info {
    const char *name;       /* the tokenizer.ggml.pre value */
    int kind;               /* TOK_PRE_* */
    int ignore_merges;      /* llama.cpp sets ignore_merges for this name */
    int add_bos;            /* llama.cpp's add_bos default for this name */
} tok_pre_info;

/* The entry for a tokenizer.ggml.pre value, or NULL when unknown. */
const tok_pre_info *tok_pre_lookup(const char *name, size_t len);

typedef struct tok_pre tok_pre;

/* Compile the regex list of `kind` (once, with JIT when available). */
int  tok_pre_open(tok_pre **out, int kind, err *e);
void tok_pre_close(tok_pre *p);   /* NULL is a no-op */

typedef struct tok_span { size_t off, len; } tok_span;

/* Per-call scratch for tok_pre_split; zero-initialise, reuse across calls of
 * one thread, free with tok_pre_scratch_free. */
typedef struct tok_pre_scratch {
    tok_span *a, *b;          /* growable span arrays (ping-pong between regexes) */
    size_t    cap_a, cap_b;
    char     *alt;            /* surrogate-free copy of the text for PCRE2 */
    size_t    alt_cap;
} tok_pre_scratch;
void tok_pre_scratch_free(tok_pre_scratch *s);

/* Split canonical text (output of tok_utf8_canon) into pieces. *spans points
 * into the scratch (valid until the next call); offsets are into `text`.
 * Returns 0, ERR_NOMEM, or ERR_INTERNAL if PCRE2 gives up (match limits). */
int tok_pre_split(const tok_pre *p, const char *text, size_t len, tok_pre_scratch *s,
                  const tok_span **spans, size_t *n_spans, err *e);

/* Canonicalise UTF-8 as described above. `out` must hold 3*n bytes. Returns
 * the output length; *has_surrogates is set when the output contains encoded
 * surrogates (ED A0..BF ..), which PCRE2 cannot take as they are. */
size_t tok_utf8_canon(const char *in, size_t n, char *out, int *has_surrogates);

/* Decode one code point from in[0..n) (n >= 1) as llama.cpp's
 * unicode_cpt_from_utf8 + its error handling: *used bytes consumed; U+FFFD
 * for an invalid or truncated sequence (1 byte) or a code point beyond
 * U+10FFFF (4 bytes). */
uint32_t tok_utf8_next(const char *in, size_t n, size_t *used);

/* True when tok_utf8_canon would return the input unchanged (valid UTF-8
 * with shortest forms; surrogates allowed): lets callers skip the copy. */
int tok_utf8_is_canon(const char *in, size_t n);

/* GPT-2 byte map: code point for byte b, and the byte for a code point (-1
 * when the code point stands for no byte). */
uint32_t tok_byte_to_cpt(uint8_t b);
int      tok_cpt_to_byte(uint32_t cpt);

/* Length of the UTF-8 sequence that lead byte c announces, as llama.cpp's
 * unicode_len_utf8 (continuation bytes count as 1). */
static inline size_t tok_utf8_len(uint8_t c)
{
    static const uint8_t k_len[16] = { 1,1,1,1,1,1,1,1,1,1,1,1,2,2,3,4 };
    return k_len[c >> 4];
}

/* Encode code point cpt (<= 0x10FFFF) as UTF-8 into out; returns bytes. */
int tok_utf8_put(uint32_t cpt, char *out);

#endif

/* bpe_train: learn a byte-level BPE vocabulary (GPT-2 / Qwen2 style) from text.
 *
 * What it owns: the training procedure and the vocabulary it produces, in the
 * exact form GGUF "gpt2" tokenizers store: token texts in the GPT-2
 * byte-to-unicode mapping, token types, and merges "A B" whose index is the
 * rank. It does not write files (mkmodel does) and does not tokenize (the
 * tokenizer module does, with the merges learned here).
 *
 * Procedure: the text is pre-split with the named pre-tokenizer regex
 * (tokenizer_pre_split, "qwen2"); identical pieces are counted once with
 * their multiplicity; every piece starts as its byte symbols; then the most
 * frequent adjacent pair over all pieces is merged, again and again, until the
 * vocabulary has the requested size. Ties are broken by the smaller left id,
 * then the smaller right id, so the result is a pure function of the text and
 * the options. Pair counts are updated incrementally (only the pieces that
 * contain the merged pair are touched) and the best pair comes from a heap
 * with lazy deletion, so 30k merges over a few hundred KB take about a second.
 *
 * Token order: the 256 byte tokens in GPT-2 order (by mapped code point: "!"
 * is 0, as in GPT-2 and Qwen2 vocabularies), then the learned tokens in the
 * order they were created, then the special tokens, then "[PAD<id>]" tokens
 * (type UNUSED, as llama.cpp's converter pads Qwen vocabularies) if the text
 * ran out of pairs before the requested size was reached. A merge whose
 * result text already exists reuses that token (texts stay unique), so there
 * can be more merges than learned tokens. */
#ifndef STRATA_BPE_TRAIN_H
#define STRATA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include "util/err.h"

typedef struct bpe_opts {
    const char *pre;               /* pre-tokenizer name for tokenizer_pre_split ("qwen2") */
    int32_t n_vocab;               /* total tokens: 256 bytes + learned + specials + padding */
    const char *const *specials;   /* n_specials texts, appended after the learned tokens */
    const int32_t *special_types;  /* TOK_CONTROL / TOK_USER_DEFINED, one per special */
    int32_t n_specials;
} bpe_opts;

typedef struct bpe_vocab {
    int32_t n_tokens;
    const char **tokens;   /* n_tokens NUL-terminated texts (byte-mapped UTF-8); owned */
    int32_t *types;        /* n_tokens tokenizer.ggml.token_type values; owned */
    int64_t n_merges;
    const char **merges;   /* n_merges "A B" strings, rank = index; owned */
    int32_t n_learned;     /* tokens created by merges */
    int32_t n_pad;         /* "[PAD<id>]" tokens added because the text ran out of pairs */
    char *text_mem;        /* internal: the arena the strings point into */
} bpe_vocab;

/* Train on text[0..len). On success *out is filled (free with
 * bpe_vocab_free). ERR_USAGE when n_vocab < 256 + n_specials + 1,
 * ERR_UNSUPPORTED for an unknown pre-tokenizer, ERR_NOMEM. */
int bpe_train(const char *text, size_t len, const bpe_opts *o, bpe_vocab *out, err *e);

/* Release a vocabulary (a zeroed struct is fine); leaves it zeroed. */
void bpe_vocab_free(bpe_vocab *v);

#endif

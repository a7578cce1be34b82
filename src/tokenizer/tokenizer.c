/* tokenizer: llama.cpp-compatible tokenization built from GGUF metadata.
 *
 * Owns the vocabulary (texts, scores, attributes), the lookup maps (text ->
 * id, BPE merge -> rank), the special-token list, the end-of-generation set,
 * the compiled pre-tokenizer and a cache of every token's rendered piece.
 * Everything is built once in tokenizer_open; afterwards the handle is
 * immutable and encode/decode only use per-call scratch.
 *
 * The behaviour is llama.cpp's (src/llama-vocab.cpp), carried over fact by
 * fact, including its quirks: special tokens are partitioned one token at a
 * time, longest text first; BPE merges the lowest-rank pair (leftmost on
 * ties) with a priority queue; a final BPE symbol that is not a token falls
 * back to single raw bytes looked up as tokens (and is dropped when those
 * are absent); SPM merges by highest score and falls back to <0xXX>; invalid
 * UTF-8 becomes U+FFFD before byte-level BPE (see tok_pre.h). Deliberate
 * departures, where llama.cpp would throw or abort: a code point above
 * U+10FFFF becomes U+FFFD; an SPM byte without a <0xXX> token becomes UNK (or
 * is dropped when there is no UNK).
 *
 * Speed (for perplexity over megabytes): lookups are hash maps built at
 * open, merging is O(n log n) with a binary heap, a per-call cache skips
 * words already seen (BPE of a word depends on nothing else), and SPM text is
 * cut into words where that provably changes nothing (spm_fragment). About
 * 5 MB/s for byte-level BPE and 14 MB/s for SPM on one core of this machine.
 *
 * Not done here: the per-model LSTRIP/RSTRIP attributes (phi-3, jina, BERT
 * families) and the tokenizer types we do not run (WPM, UGM, RWKV...). */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_map.h"
#include "tokenizer/tok_pre.h"

enum { VOCAB_BPE = 1, VOCAB_SPM = 2 };

/* llama.cpp's llama_token_attr bits; forced overrides OR them together */
enum {
    ATTR_UNKNOWN      = 1 << 0,
    ATTR_UNUSED       = 1 << 1,
    ATTR_NORMAL       = 1 << 2,
    ATTR_CONTROL      = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE         = 1 << 5,
};

struct tokenizer {
    int      vocab;                 /* VOCAB_BPE / VOCAB_SPM */
    char     model[16];             /* "gpt2" / "llama" */
    char     pre[48];               /* tokenizer.ggml.pre, or "default" */
    char     warn[320];             /* first load warning, "" if none */
    int32_t  n_vocab;

    char     *text;                 /* owned: all token texts, back to back */
    uint64_t *text_off;             /* (n_vocab) */
    uint32_t *text_len;             /* (n_vocab) */
    float    *score;                /* (n_vocab) */
    uint16_t *attr;                 /* (n_vocab) ATTR_* bits after llama.cpp's overrides */
    uint8_t  *eog;                  /* (n_vocab) 1 = ends generation */

    tok_map   tok;                  /* text -> id */
    tok_map   merges;               /* (left, right) -> rank, BPE only */

    int32_t bos, eos, eot, eom, unk, sep, pad;
    int     add_bos, add_eos, add_space_prefix, ignore_merges;
    int     spm_split;              /* SPM: no token has U+2581 after another character */
    int32_t byte_tok[256];          /* SPM: id of <0xXX> per byte, -1 if none */

    int32_t *special;               /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    size_t   n_special;

    tok_pre *pre_re;                /* BPE: compiled pre-tokenizer */

    char     *piece;                /* owned: rendered pieces (special = 1) */
    uint64_t *piece_off;            /* (n_vocab) */
    uint32_t *piece_len;            /* (n_vocab) */
};

/* ==== Small helpers ==== */

static void add_warning(tokenizer *t, const char *fmt, const char *a, long long v)
{
    if (t->warn[0]) return;   /* keep the first, like err */
    snprintf(t->warn, sizeof t->warn, fmt, a, v);
}

static const char *tok_text(const tokenizer *t, int32_t id, size_t *len)
{
    *len = t->text_len[id];
    return t->text + t->text_off[id];
}

static int text_is(const tokenizer *t, int32_t id, const char *s)
{
    size_t n;
    const char *p = tok_text(t, id, &n);
    return n == strlen(s) && memcmp(p, s, n) == 0;
}

static int32_t find_cstr(const tokenizer *t, const char *s)
{
    return tok_map_get(&t->tok, s, strlen(s), 0);
}

/* The lowest id among the texts that exist (llama.cpp takes whichever its
 * unordered_map yields first; the lowest id is our deterministic choice). */
static int32_t find_any(const tokenizer *t, const char *const *texts)
{
    int32_t best = -1;
    for (size_t i = 0; texts[i]; i++) {
        int32_t id = find_cstr(t, texts[i]);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

/* ==== Reading the GGUF keys ==== */

/* A string array key: index or -1; ERR_FORMAT if present with another type. */
static int str_array_key(const gguf_file *f, const char *key, int64_t *idx, err *e)
{
    *idx = gguf_find_key(f, key);
    if (*idx < 0) return 0;
    if (gguf_kv_type(f, *idx) != GGUF_TYPE_ARRAY || gguf_kv_arr_type(f, *idx) != GGUF_TYPE_STRING)
        return err_setf(e, ERR_FORMAT, "invalid gguf type for %s: %s, want array of string", key,
                        gguf_type_name(gguf_kv_type(f, *idx)));
    return 0;
}

/* Optional bool key: *out unchanged when absent. */
static int opt_bool(const gguf_file *f, const char *key, int *out, err *e)
{
    int v = 0;
    err e2 = { 0 };
    int rc = gguf_get_bool(f, key, &v, &e2);
    if (rc == ERR_NOTFOUND) return 0;
    if (rc) return err_setf(e, rc, "%s", e2.msg);
    *out = v != 0;
    return 0;
}

/* Optional special-token id key, as llama.cpp's loader treats it: an
 * out-of-range value is a warning and the default stays. */
static int opt_id(tokenizer *t, const gguf_file *f, const char *key, int32_t *id, err *e)
{
    if (*id >= t->n_vocab) {
        add_warning(t, "default special token '%s' = %lld out of vocab range, disabling", key, *id);
        *id = -1;
    }
    if (gguf_find_key(f, key) < 0) return 0;
    int64_t v = 0;
    err e2 = { 0 };
    int rc = gguf_get_i64(f, key, &v, &e2);
    if (rc) return err_setf(e, rc, "%s", e2.msg);
    if (v < 0 || v >= t->n_vocab) {
        add_warning(t, "bad special token: '%s' = %lld, using the default id", key, (long long)v);
        return 0;
    }
    *id = (int32_t)v;
    return 0;
}

static int read_vocab(tokenizer *t, const gguf_file *f, err *e)
{
    int64_t kt;
    int rc = str_array_key(f, "tokenizer.ggml.tokens", &kt, e);
    if (rc) return rc;
    if (kt < 0) return err_setf(e, ERR_NOTFOUND, "cannot find tokenizer vocab in model file (tokenizer.ggml.tokens)");
    uint64_t n = gguf_kv_arr_n(f, kt);
    if (n == 0) return err_setf(e, ERR_FORMAT, "tokenizer.ggml.tokens is empty");
    if (n > INT32_MAX) return err_setf(e, ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries, over the int32 id range",
                                       (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    /* scores: f32 or i32 array, at least n entries (optional) */
    const void *scores = NULL;
    int score_i32 = 0;
    int64_t ks = gguf_find_key(f, "tokenizer.ggml.scores");
    if (ks >= 0) {
        int at = gguf_kv_type(f, ks) == GGUF_TYPE_ARRAY ? gguf_kv_arr_type(f, ks) : -1;
        if (at != GGUF_TYPE_FLOAT32 && at != GGUF_TYPE_INT32)
            return err_setf(e, ERR_FORMAT, "invalid gguf type for tokenizer.ggml.scores (want f32 or i32 array)");
        if (gguf_kv_arr_n(f, ks) < n)
            return err_setf(e, ERR_FORMAT, "index out of array bounds for scores (%llu < %llu)",
                            (unsigned long long)gguf_kv_arr_n(f, ks), (unsigned long long)n);
        scores = gguf_kv_data(f, ks);
        score_i32 = at == GGUF_TYPE_INT32;
    }
    /* token types: i32 array, at least n entries (optional) */
    const void *types = NULL;
    int64_t ky = gguf_find_key(f, "tokenizer.ggml.token_type");
    if (ky >= 0) {
        if (gguf_kv_type(f, ky) != GGUF_TYPE_ARRAY || gguf_kv_arr_type(f, ky) != GGUF_TYPE_INT32)
            return err_setf(e, ERR_FORMAT, "invalid gguf type for tokenizer.ggml.token_type (want i32 array)");
        if (gguf_kv_arr_n(f, ky) < n)
            return err_setf(e, ERR_FORMAT, "index out of array bounds for toktypes (%llu < %llu)",
                            (unsigned long long)gguf_kv_arr_n(f, ky), (unsigned long long)n);
        types = gguf_kv_data(f, ky);
    }
    if ((ks >= 0 && !scores) || (ky >= 0 && !types))
        return err_setf(e, ERR_FORMAT, "tokenizer arrays unreadable");

    /* texts: sum the sizes first (empty tokens become "[EMPTY_<id>]") */
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_kv_arr_str(f, kt, i);
        if (s.n > UINT32_MAX) return err_setf(e, ERR_FORMAT, "token %llu is %llu bytes long",
                                             (unsigned long long)i, (unsigned long long)s.n);
        total += s.n ? s.n : 20;
    }
    t->text = malloc(total ? total : 1);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->score = malloc(n * sizeof *t->score);
    t->attr = malloc(n * sizeof *t->attr);
    t->eog = calloc(n, 1);
    if (!t->text || !t->text_off || !t->text_len || !t->score || !t->attr || !t->eog)
        return err_setf(e, ERR_NOMEM, "out of memory for a vocabulary of %llu tokens", (unsigned long long)n);
    if (tok_map_init(&t->tok, n)) return err_setf(e, ERR_NOMEM, "out of memory for the token map");

    uint64_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_kv_arr_str(f, kt, i);
        char *dst = t->text + off;
        size_t len = (size_t)s.n;
        if (len) memcpy(dst, s.p, len);
        else {
            add_warning(t, "empty token at index %s%lld", "", (long long)i);
            len = (size_t)snprintf(dst, 20, "[EMPTY_%llu]", (unsigned long long)i);
        }
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)len;
        off += len;
        int existed = 0;
        if (tok_map_put(&t->tok, dst, len, 0, (int32_t)i, &existed))
            return err_setf(e, ERR_NOMEM, "out of memory for the token map");
        if (existed)
            return err_setf(e, ERR_FORMAT, "duplicate token in vocabulary: '%.*s' has ids %d and %llu",
                            (int)(len < 64 ? len : 64), dst, tok_map_get(&t->tok, dst, len, 0),
                            (unsigned long long)i);
        if (scores) {
            if (score_i32) { int32_t v; memcpy(&v, (const char *)scores + i * 4, 4); t->score[i] = (float)v; }
            else memcpy(&t->score[i], (const char *)scores + i * 4, 4);
        } else {
            t->score[i] = 0.0f;
        }
        uint16_t a = ATTR_NORMAL;
        if (types) {
            int32_t ty;
            memcpy(&ty, (const char *)types + i * 4, 4);
            switch (ty) {
            case TOK_NORMAL:       a = ATTR_NORMAL; break;
            case TOK_UNKNOWN:      a = ATTR_UNKNOWN; break;
            case TOK_CONTROL:      a = ATTR_CONTROL; break;
            case TOK_USER_DEFINED: a = ATTR_USER_DEFINED; break;
            case TOK_UNUSED:       a = ATTR_UNUSED; break;
            case TOK_BYTE:         a = ATTR_BYTE; break;
            default:               a = 0; break;   /* undefined */
            }
        }
        t->attr[i] = a;
    }
    return 0;
}

/* "A B" lines, split at the first space after position 0; rank = index.
 * A line without such a space is kept by llama.cpp as the pair ("", "") and
 * can never match, so it is skipped. The first of duplicate lines wins. */
static int read_merges(tokenizer *t, const gguf_file *f, err *e)
{
    int64_t km;
    int rc = str_array_key(f, "tokenizer.ggml.merges", &km, e);
    if (rc) return rc;
    if (km < 0) return err_setf(e, ERR_NOTFOUND, "cannot find tokenizer merges in model file (tokenizer.ggml.merges)");
    uint64_t n = gguf_kv_arr_n(f, km);
    if (n > INT32_MAX) return err_setf(e, ERR_FORMAT, "tokenizer.ggml.merges has too many entries");
    if (tok_map_init(&t->merges, n)) return err_setf(e, ERR_NOMEM, "out of memory for the merge map");
    char *buf = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_kv_arr_str(f, km, i);
        const char *sp = s.n > 1 ? memchr(s.p + 1, ' ', (size_t)s.n - 1) : NULL;
        if (!sp) continue;
        size_t nl = (size_t)(sp - s.p), nr = (size_t)s.n - nl - 1;
        if (nl + nr > cap) {
            cap = (nl + nr) * 2 + 64;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); return err_setf(e, ERR_NOMEM, "out of memory reading merges"); }
            buf = nb;
        }
        memcpy(buf, s.p, nl);
        memcpy(buf + nl, sp + 1, nr);
        if (tok_map_put(&t->merges, buf, nl + nr, (uint32_t)nl, (int32_t)i, NULL)) {
            free(buf);
            return err_setf(e, ERR_NOMEM, "out of memory reading merges");
        }
    }
    free(buf);
    return 0;
}

/* ==== Special tokens, EOG ==== */

static void force_control(tokenizer *t, int32_t id)
{
    if (id >= 0) t->attr[id] |= ATTR_CONTROL;
}

typedef struct len_id { uint32_t len; int32_t id; } len_id;

static int cmp_len_id(const void *a, const void *b)
{
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int setup_specials(tokenizer *t, const gguf_file *f, err *e)
{
    int32_t mask = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
    t->eot = t->eom = t->sep = t->pad = -1;
    int rc = 0;
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.bos_token_id", &t->bos, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.eos_token_id", &t->eos, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.eot_token_id", &t->eot, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.eom_token_id", &t->eom, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.unknown_token_id", &t->unk, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.seperator_token_id", &t->sep, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.padding_token_id", &t->pad, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.mask_token_id", &mask, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_pre_token_id", &fim_pre, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_suf_token_id", &fim_suf, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_mid_token_id", &fim_mid, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_pad_token_id", &fim_pad, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_rep_token_id", &fim_rep, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.fim_sep_token_id", &fim_sep, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.prefix_token_id", &fim_pre, e);   /* deprecated names */
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.suffix_token_id", &fim_suf, e);
    rc = rc ? rc : opt_id(t, f, "tokenizer.ggml.middle_token_id", &fim_mid, e);
    rc = rc ? rc : opt_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, e);
    rc = rc ? rc : opt_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, e);
    if (rc) return rc;
    if (t->add_bos && t->bos < 0)
        return err_setf(e, ERR_FORMAT, "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
    if (t->add_eos && t->eos < 0)
        return err_setf(e, ERR_FORMAT, "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");

    /* auto-detect by text; each detected token is forced to CONTROL */
    static const char *const k_eot[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<end_of_utterance>", NULL };
    static const char *const k_eom[] = { "<|eom_id|>", NULL };
    static const char *const k_fim_pre[] = { "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL };
    static const char *const k_fim_suf[] = { "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL };
    static const char *const k_fim_mid[] = { "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL };
    static const char *const k_fim_pad[] = { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL };
    static const char *const k_fim_rep[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL };
    static const char *const k_fim_sep[] = { "<|file_sep|>", NULL };
    if (t->eot < 0)   { t->eot = find_any(t, k_eot);     force_control(t, t->eot); }
    if (t->eom < 0)   { t->eom = find_any(t, k_eom);     force_control(t, t->eom); }
    if (fim_pre < 0)  { fim_pre = find_any(t, k_fim_pre); force_control(t, fim_pre); }
    if (fim_suf < 0)  { fim_suf = find_any(t, k_fim_suf); force_control(t, fim_suf); }
    if (fim_mid < 0)  { fim_mid = find_any(t, k_fim_mid); force_control(t, fim_mid); }
    if (fim_pad < 0)  { fim_pad = find_any(t, k_fim_pad); force_control(t, fim_pad); }
    if (fim_rep < 0)  { fim_rep = find_any(t, k_fim_rep); force_control(t, fim_rep); }
    if (fim_sep < 0)  { fim_sep = find_any(t, k_fim_sep); force_control(t, fim_sep); }

    /* control tokens named "unused..." are marked UNUSED (still control) */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!(t->attr[i] & ATTR_CONTROL)) continue;
        size_t n;
        const char *p = tok_text(t, i, &n);
        if (memmem(p, n, "unused", 6)) t->attr[i] |= ATTR_UNUSED;
    }

    /* the end-of-generation set */
    if (fim_pad >= 0) t->eog[fim_pad] = 1;
    if (fim_rep >= 0) t->eog[fim_rep] = 1;
    if (fim_sep >= 0) t->eog[fim_sep] = 1;
    static const char *const k_eog[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
        "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL };
    for (size_t i = 0; k_eog[i]; i++) {
        int32_t id = find_cstr(t, k_eog[i]);
        if (id < 0) continue;
        t->eog[id] = 1;
        force_control(t, id);
    }
    /* gpt-oss: these are always rendered (llama.cpp replaces their attributes) */
    static const char *const k_oss_user[] = { "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL };
    for (size_t i = 0; k_oss_user[i]; i++) {
        int32_t id = find_cstr(t, k_oss_user[i]);
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* o200k_harmony / solar-open: <|end|> is not EOG when <|return|> and
     * <|call|> (or <|calls|> and <|flush|>) are */
    int has_return = 0, has_call = 0, has_flush = 0;
    int32_t end_id = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->eog[i]) continue;
        if (text_is(t, i, "<|return|>")) has_return = 1;
        else if (text_is(t, i, "<|call|>") || text_is(t, i, "<|calls|>")) has_call = 1;
        else if (text_is(t, i, "<|flush|>")) has_flush = 1;
        else if (text_is(t, i, "<|end|>")) end_id = i;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        t->eog[end_id] = 0;
        t->attr[end_id] = ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: </s> is not EOG next to <|tool_response> */
    int32_t tr = find_cstr(t, "<|tool_response>"), s_id = find_cstr(t, "</s>");
    if (tr >= 0 && t->eog[tr] && s_id >= 0 && t->eog[s_id]) {
        t->eog[s_id] = 0;
        t->attr[s_id] = ATTR_NORMAL;
    }

    /* the special-token cache, longest text first (ties: lower id first;
     * llama.cpp's std::sort leaves ties in an unspecified order) */
    size_t ns = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) ns++;
    t->special = malloc((ns ? ns : 1) * sizeof *t->special);
    len_id *tmp = malloc((ns ? ns : 1) * sizeof *tmp);
    if (!t->special || !tmp) { free(tmp); return err_setf(e, ERR_NOMEM, "out of memory for special tokens"); }
    ns = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) {
            tmp[ns].len = t->text_len[i];
            tmp[ns].id = i;
            ns++;
        }
    qsort(tmp, ns, sizeof *tmp, cmp_len_id);
    for (size_t i = 0; i < ns; i++) t->special[i] = tmp[i].id;
    free(tmp);
    t->n_special = ns;
    return 0;
}

/* ==== Pieces (decoding) ==== */

/* llama.cpp's llama_decode_text: each code point of a byte-level token maps
 * back to one byte; one that maps to none renders as
 * "[UNK_BYTE_0x<hex of its UTF-8><whole token text>]". With out == NULL only
 * the length is computed. */
static uint64_t decode_bpe_text(const char *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    uint64_t o = 0;
    size_t i = 0;
    while (i < n) {
        size_t used;
        uint32_t cp = tok_utf8_next(p + i, n - i, &used);
        i += used;
        int b = tok_cpt_to_byte(cp);
        if (b >= 0) {
            if (out) out[o] = (char)b;
            o++;
            continue;
        }
        char u[4];
        int ul = tok_utf8_put(cp, u);
        if (out) {
            memcpy(out + o, "[UNK_BYTE_0x", 12);
            for (int k = 0; k < ul; k++) {
                out[o + 12 + 2 * k] = hx[(uint8_t)u[k] >> 4];
                out[o + 13 + 2 * k] = hx[(uint8_t)u[k] & 15];
            }
            memcpy(out + o + 12 + 2 * ul, p, n);
            out[o + 12 + 2 * ul + n] = ']';
        }
        o += 12 + 2 * (uint64_t)ul + n + 1;
    }
    return o;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* llama.cpp's token_to_byte: strtol of the two characters after "<0x". */
static uint8_t byte_token_value(const char *p, size_t n)
{
    int v = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
        int h = hexval(p[i]);
        if (h < 0) break;
        v = v * 16 + h;
    }
    return (uint8_t)v;
}

/* Render token id as llama.cpp's token_to_piece(special = true) into out
 * (NULL: just measure). Returns the length. */
static uint64_t render_piece(const tokenizer *t, int32_t id, char *out)
{
    size_t n;
    const char *p = tok_text(t, id, &n);
    uint16_t a = t->attr[id];
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        if (out) memcpy(out, p, n);
        return n;
    }
    if (a & ATTR_NORMAL) {
        if (t->vocab == VOCAB_BPE) return decode_bpe_text(p, n, out);
        /* SPM: U+2581 stands for a space */
        uint64_t o = 0;
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(p + i, "\xe2\x96\x81", 3) == 0) { if (out) out[o] = ' '; o++; i += 3; }
            else { if (out) out[o] = p[i]; o++; i++; }
        }
        return o;
    }
    if (a & ATTR_BYTE) {
        if (out) out[0] = (char)byte_token_value(p, n);
        return 1;
    }
    return 0;   /* unused / undefined tokens render as nothing */
}

/* The piece cache (llama.cpp builds the same one): measure, then render. A
 * byte-level "token" full of characters outside the byte map renders to
 * about its length squared, so the total is capped. */
static int build_pieces(tokenizer *t, err *e)
{
    const uint64_t max_total = (uint64_t)1 << 30;
    uint64_t total = 0;
    t->piece_off = malloc((size_t)t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)t->n_vocab * sizeof *t->piece_len);
    if (!t->piece_off || !t->piece_len) return err_setf(e, ERR_NOMEM, "out of memory for pieces");
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint64_t n = render_piece(t, i, NULL);
        if (n > INT32_MAX || n > max_total - total)
            return err_setf(e, ERR_FORMAT, "token %d's text renders to %llu bytes (over %llu in all)", i,
                            (unsigned long long)n, (unsigned long long)max_total);
        t->piece_off[i] = total;
        t->piece_len[i] = (uint32_t)n;
        total += n;
    }
    t->piece = malloc(total ? (size_t)total : 1);
    if (!t->piece) return err_setf(e, ERR_NOMEM, "out of memory for pieces (%llu bytes)", (unsigned long long)total);
    for (int32_t i = 0; i < t->n_vocab; i++) render_piece(t, i, t->piece + t->piece_off[i]);
    return 0;
}

/* ==== Open / close ==== */

void tokenizer_close(tokenizer *t)
{
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->score);
    free(t->attr);
    free(t->eog);
    tok_map_free(&t->tok);
    tok_map_free(&t->merges);
    free(t->special);
    tok_pre_close(t->pre_re);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t);
}

int tokenizer_open(tokenizer **out, const gguf_file *f, err *e)
{
    *out = NULL;
    gguf_str model;
    err e2 = { 0 };
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, &e2);
    if (rc == ERR_NOTFOUND) return err_setf(e, ERR_NOTFOUND, "tokenizer.ggml.model is missing: the file has no tokenizer");
    if (rc) return err_setf(e, rc, "%s", e2.msg);

    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return err_setf(e, ERR_NOMEM, "out of memory");
    if (gguf_str_eq(model, "gpt2")) {
        t->vocab = VOCAB_BPE;
        t->bos = t->eos = 11;   /* llama.cpp's BPE defaults */
        t->unk = -1;
    } else if (gguf_str_eq(model, "llama")) {
        t->vocab = VOCAB_SPM;
        t->bos = 1; t->eos = 2; t->unk = 0;
        t->add_bos = 1;
        t->add_space_prefix = 1;
    } else {
        rc = err_setf(e, ERR_UNSUPPORTED, "tokenizer model '%.*s' is not supported (gpt2, llama)",
                      (int)(model.n < 64 ? model.n : 64), model.p);
        goto fail;
    }
    snprintf(t->model, sizeof t->model, "%s", t->vocab == VOCAB_BPE ? "gpt2" : "llama");

    const tok_pre_info *pre = NULL;
    if (t->vocab == VOCAB_BPE) {
        gguf_str ps;
        err e3 = { 0 };
        int prc = gguf_get_str(f, "tokenizer.ggml.pre", &ps, &e3);
        if (prc == ERR_NOTFOUND) {
            pre = tok_pre_lookup("default", 7);
            snprintf(t->warn, sizeof t->warn,
                     "missing pre-tokenizer type (tokenizer.ggml.pre), using 'default': generation quality will be degraded");
        } else if (prc) {
            rc = err_setf(e, prc, "%s", e3.msg);
            goto fail;
        } else {
            pre = tok_pre_lookup(ps.p, (size_t)ps.n);
            if (!pre) {
                rc = err_setf(e, ERR_UNSUPPORTED, "unknown pre-tokenizer type: '%.*s'",
                              (int)(ps.n < 64 ? ps.n : 64), ps.p);
                goto fail;
            }
        }
        snprintf(t->pre, sizeof t->pre, "%s", pre->name);
        t->ignore_merges = pre->ignore_merges;
        t->add_bos = pre->add_bos;
        if ((rc = read_merges(t, f, e))) goto fail;
    } else {
        snprintf(t->pre, sizeof t->pre, "default");
    }
    if ((rc = opt_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, e))) goto fail;
    if ((rc = read_vocab(t, f, e))) goto fail;
    if ((rc = setup_specials(t, f, e))) goto fail;
    if ((rc = build_pieces(t, e))) goto fail;

    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = find_cstr(t, hex);
        if (id < 0) { char c = (char)b; id = tok_map_get(&t->tok, &c, 1, 0); }
        t->byte_tok[b] = id;
    }
    if (t->vocab == VOCAB_BPE && (rc = tok_pre_open(&t->pre_re, pre->kind, e))) goto fail;
    if (t->vocab == VOCAB_SPM) {
        /* SentencePiece vocabularies cut at spaces: a piece is "▁▁..." then
         * text without ▁ (real ones have "▁▁▁▁" but no "a▁b"). When that
         * holds, spm_fragment may encode word by word (see there). */
        t->spm_split = 1;
        for (int32_t i = 0; i < t->n_vocab && t->spm_split; i++) {
            size_t n;
            const char *p = tok_text(t, i, &n);
            size_t k = 0;
            while (k + 3 <= n && memcmp(p + k, "\xe2\x96\x81", 3) == 0) k += 3;
            if (n > k && memmem(p + k, n - k, "\xe2\x96\x81", 3)) t->spm_split = 0;
        }
    }
    *out = t;
    return 0;
fail:
    tokenizer_close(t);
    return rc;
}

/* ==== Queries ==== */

int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }
int     tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
int     tokenizer_add_eos(const tokenizer *t) { return t->add_eos; }
const char *tokenizer_model_name(const tokenizer *t) { return t->model; }
const char *tokenizer_pre_name(const tokenizer *t) { return t->pre; }
const char *tokenizer_warning(const tokenizer *t) { return t->warn; }

int tokenizer_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int tokenizer_attr(const tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return 0;
    uint16_t a = t->attr[id];
    if (a & ATTR_CONTROL) return TOK_CONTROL;
    if (a & ATTR_USER_DEFINED) return TOK_USER_DEFINED;
    if (a & ATTR_UNKNOWN) return TOK_UNKNOWN;
    if (a & ATTR_BYTE) return TOK_BYTE;
    if (a & ATTR_UNUSED) return TOK_UNUSED;
    if (a & ATTR_NORMAL) return TOK_NORMAL;
    return 0;
}

int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len)
{
    return tok_map_get(&t->tok, text, len, 0);
}

const char *tokenizer_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) { if (len) *len = 0; return NULL; }
    size_t n;
    const char *p = tok_text(t, id, &n);
    if (len) *len = n;
    return p;
}

int tokenizer_piece(const tokenizer *t, int32_t id, int special, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return ERR_RANGE;
    if (!special && (t->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
    size_t n = t->piece_len[id];
    if (buf && cap) memcpy(buf, t->piece + t->piece_off[id], n < cap ? n : cap);
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* ==== Encoding ==== */

typedef struct sym { int32_t prev, next; uint32_t off, n; } sym;   /* a symbol of a word, linked */
typedef struct bigram { float score; int32_t rank; int32_t left, right; uint32_t size; } bigram;

/* A word's ids in the per-call cache: pool[off .. off + n). */
typedef struct cache_ent { uint32_t off, n; } cache_ent;

/* Per-call state: output and scratch (nothing here outlives the call). */
typedef struct enc {
    const tokenizer *t;
    int32_t *ids; size_t cap, n;   /* output: ids[0..cap) written, n counts all */
    sym     *syms;  size_t syms_cap;
    bigram  *heap;  size_t heap_n, heap_cap;
    char    *word;  size_t word_cap;
    char    *canon; size_t canon_cap;
    tok_pre_scratch pre;
    /* BPE of a word depends on nothing else, so repeated words (most of any
     * text) are looked up instead of merged again: word -> cache_ent */
    tok_map    cache;
    cache_ent *ents;  size_t n_ents, ents_cap;
    int32_t   *pool;  size_t n_pool, pool_cap;
    int      oom;
} enc;

enum { CACHE_MAX_WORD = 64, CACHE_MAX_ENTS = 1 << 20 };

static void emit(enc *s, int32_t id)
{
    if (s->n < s->cap) s->ids[s->n] = id;
    s->n++;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (*cap >= need) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

/* heap order: BPE lowest rank first, SPM highest score first; ties leftmost */
static int heap_before(int spm, const bigram *a, const bigram *b)
{
    if (spm) {
        if (a->score != b->score) return a->score > b->score;
    } else if (a->rank != b->rank) {
        return a->rank < b->rank;
    }
    return a->left < b->left;
}

static void heap_push(enc *s, int spm, bigram b)
{
    if (grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap)) { s->oom = 1; return; }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(spm, &b, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
}

static bigram heap_pop(enc *s, int spm)
{
    bigram top = s->heap[0];
    bigram last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(spm, &s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_before(spm, &s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Split word w into one symbol per UTF-8 character (llama.cpp's
 * unicode_len_utf8, clipped at the end). Returns the count, 0 on OOM. */
static size_t make_symbols(enc *s, const char *w, size_t n)
{
    if (grow((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms)) { s->oom = 1; return 0; }
    size_t k = 0, off = 0;
    while (off < n) {
        size_t l = tok_utf8_len((uint8_t)w[off]);
        if (l > n - off) l = n - off;
        s->syms[k].prev = (int32_t)k - 1;
        s->syms[k].off = (uint32_t)off;
        s->syms[k].n = (uint32_t)l;
        off += l;
        s->syms[k].next = off == n ? -1 : (int32_t)k + 1;
        k++;
    }
    return k;
}

static void add_bigram(enc *s, const char *w, int spm, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return;
    const sym *L = &s->syms[l], *R = &s->syms[r];
    bigram b = { 0.0f, 0, l, r, L->n + R->n };
    if (spm) {
        int32_t id = tok_map_get(&s->t->tok, w + L->off, b.size, 0);
        if (id < 0) return;
        b.score = s->t->score[id];
    } else {
        b.rank = tok_map_get(&s->t->merges, w + L->off, b.size, L->n);
        if (b.rank < 0) return;
    }
    heap_push(s, spm, b);
}

/* Merge symbols of word w until the queue is empty (both BPE and SPM; they
 * differ only in what makes a pair mergeable and in the queue order). */
static void merge_word(enc *s, const char *w, size_t n_sym, int spm)
{
    s->heap_n = 0;
    for (size_t i = 1; i < n_sym; i++) add_bigram(s, w, spm, (int32_t)i - 1, (int32_t)i);
    while (s->heap_n && !s->oom) {
        bigram b = heap_pop(s, spm);
        sym *L = &s->syms[b.left], *R = &s->syms[b.right];
        /* stale: one side was merged away, or the right side grew */
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) s->syms[R->next].prev = b.left;
        add_bigram(s, w, spm, L->prev, b.left);
        add_bigram(s, w, spm, b.left, L->next);
    }
}

/* Emit an id of the current word, keeping a copy for the cache. */
static void word_emit(enc *s, int32_t id)
{
    emit(s, id);
    if (grow((void **)&s->pool, &s->pool_cap, s->n_pool + 1, sizeof *s->pool)) { s->oom = 1; return; }
    s->pool[s->n_pool++] = id;
}

/* Encode one word from scratch: BPE (spm = 0) or SentencePiece (spm = 1). */
static void word_merge(enc *s, const char *w, size_t n, int spm)
{
    const tokenizer *t = s->t;
    if (!spm && t->ignore_merges) {
        int32_t id = tok_map_get(&t->tok, w, n, 0);
        if (id >= 0) { word_emit(s, id); return; }
    }
    size_t n_sym = make_symbols(s, w, n);
    if (!n_sym) return;
    merge_word(s, w, n_sym, spm);
    for (int32_t i = 0; i != -1; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        if (!y->n) continue;
        int32_t id = tok_map_get(&t->tok, w + y->off, y->n, 0);
        if (id >= 0) { word_emit(s, id); continue; }
        for (uint32_t k = 0; k < y->n; k++) {
            int32_t bid;
            if (spm) {
                bid = t->byte_tok[(uint8_t)w[y->off + k]];
                if (bid < 0) bid = t->unk;   /* llama.cpp throws here */
            } else {
                /* llama.cpp looks up each raw byte of the symbol as a token
                 * and silently drops the ones that are not */
                bid = tok_map_get(&t->tok, w + y->off + k, 1, 0);
            }
            if (bid >= 0) word_emit(s, bid);
        }
    }
}

/* Encode one word, through the per-call cache when it is short enough. */
static void word_encode(enc *s, const char *w, size_t n, int spm)
{
    int cacheable = n <= CACHE_MAX_WORD;
    if (cacheable && s->n_ents) {
        int32_t ci = tok_map_get(&s->cache, w, n, 0);
        if (ci >= 0) {
            const cache_ent *ce = &s->ents[ci];
            for (uint32_t k = 0; k < ce->n; k++) emit(s, s->pool[ce->off + k]);
            return;
        }
    }
    size_t start = s->n_pool;
    word_merge(s, w, n, spm);
    if (!cacheable || s->oom || s->n_ents >= CACHE_MAX_ENTS || s->n_pool - start > UINT32_MAX) {
        s->n_pool = start;   /* not kept: the pool only holds cached words */
        return;
    }
    if ((!s->cache.cap && tok_map_init(&s->cache, 4096)) ||
        grow((void **)&s->ents, &s->ents_cap, s->n_ents + 1, sizeof *s->ents) ||
        tok_map_put(&s->cache, w, n, 0, (int32_t)s->n_ents, NULL)) {
        s->oom = 1;
        return;
    }
    s->ents[s->n_ents].off = (uint32_t)start;
    s->ents[s->n_ents].n = (uint32_t)(s->n_pool - start);
    s->n_ents++;
}

/* One raw fragment of a BPE model: canonicalise, pre-split, byte-encode
 * each piece and run BPE on it. */
static int bpe_fragment(enc *s, const char *text, size_t len, err *e)
{
    const char *canon = text;
    size_t n = len;
    if (!tok_utf8_is_canon(text, len)) {
        if (len > (SIZE_MAX - 1) / 3 || grow((void **)&s->canon, &s->canon_cap, len * 3 + 1, 1))
            return err_setf(e, ERR_NOMEM, "out of memory encoding %zu bytes", len);
        n = tok_utf8_canon(text, len, s->canon, NULL);
        canon = s->canon;
    }
    const tok_span *sp = NULL;
    size_t n_sp = 0;
    int rc = tok_pre_split(s->t->pre_re, canon, n, &s->pre, &sp, &n_sp, e);
    if (rc) return rc;
    for (size_t i = 0; i < n_sp && !s->oom; i++) {
        const uint8_t *p = (const uint8_t *)canon + sp[i].off;
        size_t pl = sp[i].len;
        if (grow((void **)&s->word, &s->word_cap, pl * 2 + 1, 1)) { s->oom = 1; break; }
        size_t wn = 0;
        for (size_t k = 0; k < pl; k++) wn += (size_t)tok_utf8_put(tok_byte_to_cpt(p[k]), s->word + wn);
        word_encode(s, s->word, wn, 0);
    }
    return s->oom ? err_setf(e, ERR_NOMEM, "out of memory encoding %zu bytes", len) : 0;
}

/* One raw fragment of an SPM model (the caller has added the leading space
 * when due): spaces become U+2581, then bigram merges by score. */
static int spm_fragment(enc *s, const char *text, size_t len, int prefix_space, err *e)
{
    const tokenizer *t = s->t;
    size_t spaces = prefix_space ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t need = len + spaces * 2 + (prefix_space ? 1 : 0);
    if (grow((void **)&s->word, &s->word_cap, need + 1, 1))
        return err_setf(e, ERR_NOMEM, "out of memory encoding %zu bytes", len);
    size_t wn = 0;
    if (prefix_space) { memcpy(s->word, "\xe2\x96\x81", 3); wn = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s->word + wn, "\xe2\x96\x81", 3); wn += 3; }
        else s->word[wn++] = text[i];
    }
    const char *w = s->word;
    if (!t->spm_split) {
        word_encode(s, w, wn, 1);
        return s->oom ? err_setf(e, ERR_NOMEM, "out of memory encoding %zu bytes", len) : 0;
    }
    /* Cut before every U+2581 symbol that follows a non-U+2581 symbol and
     * encode the words apart. Exact, because no pair across such a cut can
     * ever merge: its text would hold U+2581 after another character, which
     * no token does (t->spm_split), and merges inside a word happen in the
     * same relative order as in one big queue (ties go leftmost). */
    size_t off = 0, word_off = 0;
    int prev_sp = 0;
    while (off < wn && !s->oom) {
        size_t l = tok_utf8_len((uint8_t)w[off]);
        if (l > wn - off) l = wn - off;
        int sp = l == 3 && memcmp(w + off, "\xe2\x96\x81", 3) == 0;
        if (sp && !prev_sp && off > word_off) {
            word_encode(s, w + word_off, off - word_off, 1);
            word_off = off;
        }
        prev_sp = sp;
        off += l;
    }
    if (word_off < wn) word_encode(s, w + word_off, wn - word_off, 1);
    return s->oom ? err_setf(e, ERR_NOMEM, "out of memory encoding %zu bytes", len) : 0;
}

/* A fragment of the input: raw text (id < 0) or one special token. */
typedef struct frag { int32_t id; size_t off, len; } frag;

static int frag_push(frag **a, size_t *cap, size_t *n, int32_t id, size_t off, size_t len)
{
    if (grow((void **)a, cap, *n + 1, sizeof **a)) return -1;
    (*a)[*n].id = id;
    (*a)[*n].off = off;
    (*a)[*n].len = len;
    (*n)++;
    return 0;
}

/* llama.cpp's tokenizer_st_partition: for each special token in order
 * (longest first), cut every raw fragment at each leftmost non-overlapping
 * occurrence. With parse_special = 0, CONTROL and UNKNOWN tokens are skipped
 * (USER_DEFINED still match). */
static int partition(const tokenizer *t, const char *text, size_t len, int parse_special,
                     frag **out, size_t *n_out)
{
    frag *cur = NULL, *nxt = NULL;
    size_t cap_c = 0, cap_n = 0, n_c = 0;
    if (len && frag_push(&cur, &cap_c, &n_c, -1, 0, len)) goto oom;
    for (size_t k = 0; k < t->n_special && n_c; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        size_t tl;
        const char *tx = tok_text(t, id, &tl);
        if (!tl || !memmem(text, len, tx, tl)) continue;   /* cheap test on the whole text first */
        size_t n_n = 0;
        for (size_t i = 0; i < n_c; i++) {
            if (cur[i].id >= 0) {
                if (frag_push(&nxt, &cap_n, &n_n, cur[i].id, cur[i].off, cur[i].len)) goto oom;
                continue;
            }
            size_t pos = cur[i].off, end = cur[i].off + cur[i].len;
            while (pos < end) {
                const char *m = memmem(text + pos, end - pos, tx, tl);
                if (!m) break;
                size_t mo = (size_t)(m - text);
                if (mo > pos && frag_push(&nxt, &cap_n, &n_n, -1, pos, mo - pos)) goto oom;
                if (frag_push(&nxt, &cap_n, &n_n, id, mo, tl)) goto oom;
                pos = mo + tl;
            }
            if (pos < end && frag_push(&nxt, &cap_n, &n_n, -1, pos, end - pos)) goto oom;
        }
        frag *tf = cur; cur = nxt; nxt = tf;
        size_t tc = cap_c; cap_c = cap_n; cap_n = tc;
        n_c = n_n;
    }
    free(nxt);
    *out = cur;
    *n_out = n_c;
    return 0;
oom:
    free(cur);
    free(nxt);
    return ERR_NOMEM;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                     int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e)
{
    if (n_out) *n_out = 0;
    if (!text && len) return err_setf(e, ERR_USAGE, "tokenizer_encode: NULL text");
    enc s = { 0 };
    s.t = t;
    s.ids = ids;
    s.cap = ids ? cap : 0;

    frag *fr = NULL;
    size_t n_fr = 0;
    if (partition(t, text, len, parse_special, &fr, &n_fr))
        return err_setf(e, ERR_NOMEM, "out of memory partitioning %zu bytes", len);

    int rc = 0;
    if (add_bos && t->add_bos) emit(&s, t->bos);
    int prev_special = 1;   /* SPM: a leading space before the first fragment and after specials */
    for (size_t i = 0; i < n_fr && !rc; i++) {
        if (fr[i].id >= 0) { emit(&s, fr[i].id); prev_special = 1; continue; }
        if (t->vocab == VOCAB_BPE) rc = bpe_fragment(&s, text + fr[i].off, fr[i].len, e);
        else rc = spm_fragment(&s, text + fr[i].off, fr[i].len, t->add_space_prefix && prev_special, e);
        prev_special = 0;
    }
    if (!rc && add_bos && t->add_eos) emit(&s, t->eos);

    free(fr);
    free(s.syms);
    free(s.heap);
    free(s.word);
    free(s.canon);
    tok_pre_scratch_free(&s.pre);
    tok_map_free(&s.cache);
    free(s.ents);
    free(s.pool);
    if (rc) return rc;
    if (n_out) *n_out = s.n;
    if (s.n > s.cap)
        return err_setf(e, ERR_RANGE, "%zu tokens do not fit in a buffer of %zu", s.n, s.cap);
    return 0;
}

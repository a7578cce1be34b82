/* tok_pre: UTF-8 canonicalisation, the GPT-2 byte map and regex
 * pre-tokenizers (see tok_pre.h for what is reproduced from llama.cpp and
 * why). Also implements the two public building blocks declared at the end
 * of tokenizer.h: tokenizer_pre_split and tokenizer_byte_to_utf8. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_pre.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* ==== The regexes ==== */

/* llama.cpp's whitespace set (unicode_set_whitespace, generated from Python
 * `regex` \s): Unicode White_Space. PCRE2's own \s (UCP) lacks U+0085, so the
 * class is spelled out everywhere a regex says \s or \S. */
#define WS  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define SP  "[" WS "]"
#define NSP "[^" WS "]"
/* (?i:'s|'t|'re|'ve|'m|'ll|'d) as llama.cpp adapts it (ASCII case only) */
#define CONTR "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* \s*[\r\n]+|\s+(?!\S)|\s+ */
#define WS_TAIL "|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"

static const char k_re_qwen2[] =
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;

static const char k_re_qwen35[] =
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" WS_TAIL;

static const char k_re_llama3[] =
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;

/* llama.cpp's adaptation of the o200k regex: "upper" = a letter that is not
 * a-z, "lower" = a letter that is not A-Z. */
#define UPC "(?:(?=\\p{L})[^a-z])"
#define LOC "(?:(?=\\p{L})[^A-Z])"
static const char k_re_gpt4o[] =
    "[^\\r\\n\\p{L}\\p{N}]?" UPC "*" LOC "+" CONTR "?"
    "|[^\\r\\n\\p{L}\\p{N}]?" UPC "+" LOC "*" CONTR "?"
    "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*" WS_TAIL;

/* deepseek-v3: three regexes. The third runs on llama.cpp's collapsed text,
 * whose ASCII \p{S} is "$+<=>^`|" (no '~'), so '~' is neither P nor S there. */
static const char k_re_ds3_num[] = "\\p{N}{1,3}";
static const char k_re_ds3_cjk[] = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
#define DS_PS   "(?:(?!~)[\\p{P}\\p{S}])"
#define DS_NLPS "(?:~|[^\\r\\n\\p{L}\\p{P}\\p{S}])"
static const char k_re_ds3_main[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|" DS_NLPS "?[\\p{L}\\p{M}]+| ?" DS_PS "+[\\r\\n]*" WS_TAIL;

/* default: what llama.cpp uses when tokenizer.ggml.pre is missing. The second
 * regex is GPT-2's (llama.cpp's custom gpt2 splitter also takes a lone
 * whitespace, which the gap rule gives us anyway). */
static const char k_re_def_punct[] = "[\\p{P}$+<=>^~|]+";
static const char k_re_def_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SP "+(?!" NSP ")";
static const char k_re_def_num[] = "\\p{N}+";
static const char k_re_def_3dig[] = "[0-9][0-9][0-9]";

#define MAX_RE 4

static int kind_regexes(int kind, const char *re[MAX_RE])
{
    switch (kind) {
    case TOK_PRE_QWEN2:  re[0] = k_re_qwen2;  return 1;
    case TOK_PRE_QWEN35: re[0] = k_re_qwen35; return 1;
    case TOK_PRE_LLAMA3: re[0] = k_re_llama3; return 1;
    case TOK_PRE_GPT4O:  re[0] = k_re_gpt4o;  return 1;
    case TOK_PRE_DEEPSEEK3:
        re[0] = k_re_ds3_num; re[1] = k_re_ds3_cjk; re[2] = k_re_ds3_main;
        return 3;
    case TOK_PRE_DEFAULT:
        re[0] = k_re_def_punct; re[1] = k_re_def_gpt2; re[2] = k_re_def_num; re[3] = k_re_def_3dig;
        return 4;
    default: return 0;
    }
}

/* tokenizer.ggml.pre values, as llama-vocab.cpp maps them (the families we
 * run; others are ERR_UNSUPPORTED). */
static const tok_pre_info k_pre_names[] = {
    { "default",          TOK_PRE_DEFAULT,   0, 0 },
    { "qwen2",            TOK_PRE_QWEN2,     0, 0 },
    { "deepseek-r1-qwen", TOK_PRE_QWEN2,     0, 0 },
    { "kormo",            TOK_PRE_QWEN2,     0, 0 },
    { "f2llmv2",          TOK_PRE_QWEN2,     0, 0 },
    { "megrez",           TOK_PRE_QWEN2,     0, 0 },
    { "stablelm2",        TOK_PRE_QWEN2,     0, 0 },
    { "hunyuan",          TOK_PRE_QWEN2,     0, 0 },
    { "solar-open",       TOK_PRE_QWEN2,     0, 0 },
    { "qwen35",           TOK_PRE_QWEN35,    0, 0 },
    { "llama3",           TOK_PRE_LLAMA3,    1, 1 },
    { "llama-v3",         TOK_PRE_LLAMA3,    1, 1 },
    { "llama-bpe",        TOK_PRE_LLAMA3,    1, 1 },
    { "falcon3",          TOK_PRE_LLAMA3,    1, 1 },
    { "falcon-h1",        TOK_PRE_LLAMA3,    1, 1 },
    { "pixtral",          TOK_PRE_LLAMA3,    1, 1 },
    { "midm-2.0",         TOK_PRE_LLAMA3,    1, 1 },
    { "lfm2",             TOK_PRE_LLAMA3,    1, 1 },
    { "jina-v5-nano",     TOK_PRE_LLAMA3,    1, 1 },
    { "dbrx",             TOK_PRE_LLAMA3,    0, 0 },
    { "smaug-bpe",        TOK_PRE_LLAMA3,    0, 0 },
    { "deepseek-v3",      TOK_PRE_DEEPSEEK3, 0, 0 },
    { "hunyuan-dense",    TOK_PRE_DEEPSEEK3, 0, 0 },
    { "joyai-llm",        TOK_PRE_DEEPSEEK3, 0, 0 },
    { "hy_v4",            TOK_PRE_DEEPSEEK3, 0, 0 },
    { "gpt-4o",           TOK_PRE_GPT4O,     0, 0 },
    { "llama4",           TOK_PRE_GPT4O,     0, 0 },
    { "kanana2",          TOK_PRE_GPT4O,     0, 0 },
    { "talkie",           TOK_PRE_GPT4O,     0, 0 },
    { "minimax-m2",       TOK_PRE_GPT4O,     0, 0 },
};

const tok_pre_info *tok_pre_lookup(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof k_pre_names / sizeof k_pre_names[0]; i++)
        if (strlen(k_pre_names[i].name) == len && memcmp(k_pre_names[i].name, name, len) == 0)
            return &k_pre_names[i];
    return NULL;
}

/* ==== Compiled pre-tokenizer ==== */

struct tok_pre {
    int          n_re;
    pcre2_code  *re[MAX_RE];   /* owned; JIT-compiled when the platform allows */
};

void tok_pre_close(tok_pre *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

int tok_pre_open(tok_pre **out, int kind, err *e)
{
    *out = NULL;
    const char *src[MAX_RE];
    int n = kind_regexes(kind, src);
    if (!n) return err_setf(e, ERR_UNSUPPORTED, "unknown pre-tokenizer kind %d", kind);
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) return err_setf(e, ERR_NOMEM, "out of memory compiling the pre-tokenizer");
    for (int i = 0; i < n; i++) {
        int ec = 0;
        PCRE2_SIZE eo = 0;
        p->re[i] = pcre2_compile((PCRE2_SPTR)src[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &ec, &eo, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            tok_pre_close(p);
            return err_setf(e, ERR_INTERNAL, "pre-tokenizer regex %d does not compile at %zu: %s",
                            i, (size_t)eo, (const char *)msg);
        }
        p->n_re = i + 1;
        /* JIT is an optimisation only: without it pcre2_match interprets */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return 0;
}

void tok_pre_scratch_free(tok_pre_scratch *s)
{
    if (!s) return;
    free(s->a);
    free(s->b);
    free(s->alt);
    memset(s, 0, sizeof *s);
}

/* Append a span to a growable array (capacity doubles). */
static int span_push(tok_span **arr, size_t *cap, size_t *n, size_t off, size_t len)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        tok_span *na = realloc(*arr, nc * sizeof *na);
        if (!na) return ERR_NOMEM;
        *arr = na;
        *cap = nc;
    }
    (*arr)[*n].off = off;
    (*arr)[*n].len = len;
    (*n)++;
    return 0;
}

int tok_pre_split(const tok_pre *p, const char *text, size_t len, tok_pre_scratch *s,
                  const tok_span **spans, size_t *n_spans, err *e)
{
    *spans = NULL;
    *n_spans = 0;
    if (len == 0) return 0;

    /* PCRE2 refuses encoded surrogates, which llama.cpp lets through. Every
     * regex here sees a surrogate only as "not L/N/P/S/M/space", exactly like
     * U+E000 (private use, same 3-byte length), so match on a copy with that
     * substitution and cut the original at the same offsets. */
    const char *subj = text;
    for (size_t i = 0; i + 1 < len; i++) {
        if ((uint8_t)text[i] == 0xED && (uint8_t)text[i + 1] >= 0xA0) {
            if (s->alt_cap < len) {
                char *alt = realloc(s->alt, len);
                if (!alt) return err_setf(e, ERR_NOMEM, "out of memory splitting %zu bytes", len);
                s->alt = alt;
                s->alt_cap = len;
            }
            memcpy(s->alt, text, len);
            for (size_t j = i; j + 2 < len; j++) {   /* canonical text: a lead ED is followed by 2 bytes */
                if ((uint8_t)s->alt[j] == 0xED && (uint8_t)s->alt[j + 1] >= 0xA0) {
                    s->alt[j] = (char)0xEE; s->alt[j + 1] = (char)0x80; s->alt[j + 2] = (char)0x80;
                    j += 2;
                }
            }
            subj = s->alt;
            break;
        }
    }

    /* ping-pong between the two arrays: cur holds the pieces of the previous
     * regex, nxt receives the pieces of this one */
    tok_span **cur = &s->a, **nxt = &s->b;
    size_t *cur_cap = &s->cap_a, *nxt_cap = &s->cap_b;
    size_t n_cur = 0;
    if (span_push(cur, cur_cap, &n_cur, 0, len)) goto oom;

    for (int r = 0; r < p->n_re; r++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md) goto oom;
        size_t n_nxt = 0;
        for (size_t k = 0; k < n_cur; k++) {
            const size_t seg_off = (*cur)[k].off, seg_len = (*cur)[k].len;
            const PCRE2_SPTR seg = (PCRE2_SPTR)(subj + seg_off);
            size_t start = 0, prev = 0;
            /* the segment is the whole subject, so lookaheads stop at its end,
             * as std::regex_iterator over [begin, end) does in llama.cpp */
            while (start < seg_len) {
                int rc = pcre2_match(p->re[r], seg, seg_len, start, PCRE2_NO_UTF_CHECK, md, NULL);
                if (rc == PCRE2_ERROR_JIT_STACKLIMIT)   /* deep backtracking: interpret instead */
                    rc = pcre2_match(p->re[r], seg, seg_len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[160];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    pcre2_match_data_free(md);
                    return err_setf(e, ERR_INTERNAL, "pre-tokenizer regex %d failed at byte %zu: %s",
                                    r, seg_off + start, (const char *)msg);
                }
                const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = (size_t)ov[0], me = (size_t)ov[1];
                if (me <= ms) {   /* an empty match (none of our regexes has one): step one character */
                    start = ms + tok_utf8_len((uint8_t)seg[ms]);
                    continue;
                }
                if (ms > prev && span_push(nxt, nxt_cap, &n_nxt, seg_off + prev, ms - prev)) { pcre2_match_data_free(md); goto oom; }
                if (span_push(nxt, nxt_cap, &n_nxt, seg_off + ms, me - ms)) { pcre2_match_data_free(md); goto oom; }
                prev = start = me;
            }
            if (prev < seg_len && span_push(nxt, nxt_cap, &n_nxt, seg_off + prev, seg_len - prev)) {
                pcre2_match_data_free(md);
                goto oom;
            }
        }
        pcre2_match_data_free(md);
        tok_span **t = cur; cur = nxt; nxt = t;
        size_t *tc = cur_cap; cur_cap = nxt_cap; nxt_cap = tc;
        n_cur = n_nxt;
    }
    *spans = *cur;
    *n_spans = n_cur;
    return 0;
oom:
    return err_setf(e, ERR_NOMEM, "out of memory splitting %zu bytes", len);
}

/* ==== UTF-8 ==== */

int tok_utf8_put(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

uint32_t tok_utf8_next(const char *in, size_t n, size_t *used)
{
    const uint8_t *s = (const uint8_t *)in;
    uint8_t c = s[0];
    if (c < 0x80) { *used = 1; return c; }
    if (!(c & 0x40)) { *used = 1; return 0xFFFD; }                 /* stray continuation byte */
    if (!(c & 0x20)) {                                             /* 110xxxxx */
        if (n > 1 && is_cont(s[1])) { *used = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); }
    } else if (!(c & 0x10)) {                                      /* 1110xxxx */
        if (n > 2 && is_cont(s[1]) && is_cont(s[2])) {
            *used = 3;
            return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        }
    } else if (!(c & 0x08)) {                                      /* 11110xxx */
        if (n > 3 && is_cont(s[1]) && is_cont(s[2]) && is_cont(s[3])) {
            *used = 4;
            uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
            return cp > 0x10FFFF ? 0xFFFD : cp;                    /* llama.cpp throws here */
        }
    }
    *used = 1;                                                     /* truncated sequence, or F8..FF */
    return 0xFFFD;
}

size_t tok_utf8_canon(const char *in, size_t n, char *out, int *has_surrogates)
{
    size_t i = 0, o = 0;
    int sur = 0;
    while (i < n) {
        if ((uint8_t)in[i] < 0x80) { out[o++] = in[i++]; continue; }
        size_t used;
        uint32_t cp = tok_utf8_next(in + i, n - i, &used);
        i += used;
        if (cp >= 0xD800 && cp <= 0xDFFF) sur = 1;
        o += (size_t)tok_utf8_put(cp, out + o);
    }
    if (has_surrogates) *has_surrogates = sur;
    return o;
}

int tok_utf8_is_canon(const char *in, size_t n)
{
    const uint8_t *s = (const uint8_t *)in;
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c < 0xC2 || c > 0xF4) return 0;   /* continuation, overlong C0/C1, F5.. */
        size_t l = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if (!is_cont(s[i + k])) return 0;
        if (c == 0xE0 && s[i + 1] < 0xA0) return 0;   /* overlong 3-byte */
        if (c == 0xF0 && s[i + 1] < 0x90) return 0;   /* overlong 4-byte */
        if (c == 0xF4 && s[i + 1] > 0x8F) return 0;   /* above U+10FFFF */
        i += l;
    }
    return 1;
}

/* ==== GPT-2 byte map ====
 * Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) map in order to U+0100..U+0143. */

uint32_t tok_byte_to_cpt(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (uint32_t)(b - 0x7F);
    return 256u + 67u;   /* 0xAD */
}

int tok_cpt_to_byte(uint32_t c)
{
    if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) return (int)c;
    if (c < 256 || c >= 256 + 68) return -1;
    uint32_t n = c - 256;
    if (n < 33) return (int)n;
    if (n < 67) return (int)(0x7F + n - 33);
    return 0xAD;
}

int tokenizer_byte_to_utf8(uint8_t b, char out[4])
{
    return tok_utf8_put(tok_byte_to_cpt(b), out);
}

/* ==== Public split for vocabulary training ==== */

int tokenizer_pre_split(const char *pre, const char *text, size_t len,
                        tokenizer_piece_cb cb, void *ctx, err *e)
{
    const tok_pre_info *info = pre ? tok_pre_lookup(pre, strlen(pre)) : NULL;
    if (!info) return err_setf(e, ERR_UNSUPPORTED, "unknown pre-tokenizer '%s'", pre ? pre : "(null)");
    if (len > SIZE_MAX / 3) return err_setf(e, ERR_NOMEM, "text of %zu bytes is too large", len);
    tok_pre *p = NULL;
    int rc = tok_pre_open(&p, info->kind, e);
    if (rc) return rc;
    char *canon = malloc(len * 3 + 1);
    if (!canon) { tok_pre_close(p); return err_setf(e, ERR_NOMEM, "out of memory splitting %zu bytes", len); }
    size_t n = tok_utf8_canon(text, len, canon, NULL);
    tok_pre_scratch s = { 0 };
    const tok_span *sp = NULL;
    size_t n_sp = 0;
    rc = tok_pre_split(p, canon, n, &s, &sp, &n_sp, e);
    if (!rc)
        for (size_t i = 0; i < n_sp; i++) cb(ctx, canon + sp[i].off, sp[i].len);
    tok_pre_scratch_free(&s);
    free(canon);
    tok_pre_close(p);
    return rc;
}

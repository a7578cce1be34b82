/* Unit tests for src/tokenizer: BPE merge order on hand-made vocabularies,
 * special-token partition, EOG detection, round trips over random UTF-8 and
 * random bytes (BPE and SPM), long pieces (no quadratic blow-up), the
 * pre-tokenizer building blocks, load errors, and the chat templates against
 * llama.cpp's expected strings. Vocabularies are written with gguf_writer
 * into a temporary directory and read back with gguf_open. */
#include "testhelp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

static char g_dir[96];

/* ==== Building vocabularies ==== */

typedef struct vspec {
    const char *model;           /* NULL: omit tokenizer.ggml.model */
    const char *pre;             /* NULL: omit tokenizer.ggml.pre */
    const char *const *tokens;   /* NULL: omit */
    int n_tokens;
    const int32_t *types;        /* NULL: omit */
    int n_types;
    const float *scores;         /* NULL: omit */
    int n_scores;
    const char *const *merges;   /* NULL: omit */
    int n_merges;
    int64_t bos, eos;            /* < 0: omit */
    int add_bos;                 /* < 0: omit */
    int types_f32;               /* write token_type as f32 (a type error) */
} vspec;

static int open_spec(const vspec *v, tokenizer **out, err *e)
{
    static int n;
    char path[160];
    snprintf(path, sizeof path, "%s/v%d.gguf", g_dir, n++);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    if (v->model) gguf_writer_set_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (v->tokens) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, NULL, (uint64_t)v->n_tokens);
    if (v->types) {
        if (v->types_f32) {
            float *f = malloc((size_t)v->n_types * sizeof *f);
            for (int i = 0; i < v->n_types; i++) f[i] = (float)v->types[i];
            gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_FLOAT32, f, (uint64_t)v->n_types);
            free(f);
        } else {
            gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n_types);
        }
    }
    if (v->scores) gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->scores, (uint64_t)v->n_scores);
    if (v->merges) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, NULL, (uint64_t)v->n_merges);
    if (v->bos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->eos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->add_bos >= 0) gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    err we = { 0 };
    int rc = gguf_writer_begin(w, path, &we);
    if (!rc) rc = gguf_writer_finish(w, &we);
    gguf_writer_free(w);
    if (rc) { fprintf(stderr, "writing %s: %s\n", path, we.msg); return rc; }
    gguf_file *f = NULL;
    err ge = { 0 };
    if ((rc = gguf_open(&f, path, &ge))) { fprintf(stderr, "reading %s: %s\n", path, ge.msg); return rc; }
    rc = tokenizer_open(out, f, e);
    gguf_close(f);
    unlink(path);
    return rc;
}

/* A byte-level vocabulary: the 256 byte symbols (ids 0..255 in byte order),
 * then `extra` tokens; types NORMAL except where listed in `special`. */
typedef struct bpe_voc {
    char *toks[600];
    int32_t types[600];
    int n;
    char bytes[256][4];
} bpe_voc;

static void bv_init(bpe_voc *b)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++) {
        int l = tokenizer_byte_to_utf8((uint8_t)i, b->bytes[i]);
        b->bytes[i][l] = 0;
        b->toks[b->n] = b->bytes[i];
        b->types[b->n++] = TOK_NORMAL;
    }
}

static int32_t bv_add(bpe_voc *b, const char *text, int type)
{
    b->toks[b->n] = (char *)text;
    b->types[b->n] = type;
    return b->n++;
}

static tokenizer *open_bpe(bpe_voc *b, const char *pre, const char *const *merges, int n_merges)
{
    static const char *const no_merges[1] = { "" };
    if (!merges) merges = no_merges;   /* an empty merges array: merges are required for gpt2 */
    vspec v = { .model = "gpt2", .pre = pre, .tokens = (const char *const *)b->toks, .n_tokens = b->n,
                .types = b->types, .n_types = b->n, .merges = merges, .n_merges = n_merges,
                .bos = -1, .eos = -1, .add_bos = -1 };
    tokenizer *t = NULL;
    err e = { 0 };
    if (open_spec(&v, &t, &e)) fprintf(stderr, "open_bpe: %s\n", e.msg);
    return t;
}

/* Encode and compare with an expected id list (terminated by -1). */
static int enc_is(const tokenizer *t, const char *text, int parse_special, const int32_t *want)
{
    int32_t ids[256];
    size_t n = 0;
    err e = { 0 };
    int rc = tokenizer_encode(t, text, strlen(text), 0, parse_special, ids, 256, &n, &e);
    if (rc) { fprintf(stderr, "  encode '%s': %s\n", text, e.msg); return 0; }
    size_t k = 0;
    while (want[k] >= 0) k++;
    int ok = k == n;
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  encode '%s': got [", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, i ? ", %d" : "%d", ids[i]);
        fprintf(stderr, "], want [");
        for (size_t i = 0; i < k; i++) fprintf(stderr, i ? ", %d" : "%d", want[i]);
        fprintf(stderr, "]\n");
    }
    return ok;
}

/* ==== BPE ==== */

TEST(test_bpe_merge_order)
{
    bpe_voc b;
    bv_init(&b);
    int32_t ab = bv_add(&b, "ab", TOK_NORMAL);
    int32_t bc = bv_add(&b, "bc", TOK_NORMAL);
    int32_t abc = bv_add(&b, "abc", TOK_NORMAL);
    int32_t cd = bv_add(&b, "cd", TOK_NORMAL);
    int32_t aa = bv_add(&b, "aa", TOK_NORMAL);
    int32_t gab = bv_add(&b, "\xc4\xa0" "ab", TOK_NORMAL);   /* "Ġab" = " ab" */
    const char *merges[] = { "b c", "a b", "c d", "ab c", "a a", "\xc4\xa0 ab", "x y" };
    tokenizer *t = open_bpe(&b, "qwen2", merges, 7);
    CHECK(t != NULL);
    if (!t) return;
    /* rank beats position: "b c" (0) before "a b" (1) */
    CHECK(enc_is(t, "abc", 1, (int32_t[]){ 'a', bc, -1 }));
    /* "b c" (0) first leaves a, bc, d: nothing merges them further */
    CHECK(enc_is(t, "abcd", 1, (int32_t[]){ 'a', bc, 'd', -1 }));
    CHECK(enc_is(t, "abd", 1, (int32_t[]){ ab, 'd', -1 }));
    CHECK(enc_is(t, "cdab", 1, (int32_t[]){ cd, ab, -1 }));
    /* equal ranks: leftmost first */
    CHECK(enc_is(t, "aaa", 1, (int32_t[]){ aa, 'a', -1 }));
    CHECK(enc_is(t, "aaaa", 1, (int32_t[]){ aa, aa, -1 }));
    /* the byte map: a space is "Ġ" and merges with what follows */
    CHECK(enc_is(t, " ab", 1, (int32_t[]){ gab, -1 }));
    /* "x y" merges to "xy", which is not a token: falls back to the raw bytes */
    CHECK(enc_is(t, "xy", 1, (int32_t[]){ 'x', 'y', -1 }));
    (void)abc;
    CHECK(strcmp(tokenizer_model_name(t), "gpt2") == 0);
    CHECK(strcmp(tokenizer_pre_name(t), "qwen2") == 0);
    CHECK(tokenizer_find(t, "abc", 3) == abc);
    CHECK(tokenizer_find(t, "zzz", 3) == -1);
    tokenizer_close(t);
}

TEST(test_bpe_ignore_merges)
{
    bpe_voc b;
    bv_init(&b);
    int32_t ab = bv_add(&b, "ab", TOK_NORMAL);
    int32_t abcd = bv_add(&b, "abcd", TOK_NORMAL);   /* no merge builds it */
    const char *merges[] = { "a b" };
    tokenizer *q = open_bpe(&b, "qwen2", merges, 1);
    tokenizer *l = open_bpe(&b, "llama-bpe", merges, 1);
    CHECK(q && l);
    if (q && l) {
        CHECK(enc_is(q, "abcd", 1, (int32_t[]){ ab, 'c', 'd', -1 }));
        CHECK(enc_is(l, "abcd", 1, (int32_t[]){ abcd, -1 }));
        CHECK(enc_is(l, "abc", 1, (int32_t[]){ ab, 'c', -1 }));
        CHECK_EQ_INT(tokenizer_add_bos(q), 0);
        /* llama-bpe defaults add_bos to true; BOS defaults to id 11 */
        CHECK_EQ_INT(tokenizer_add_bos(l), 1);
        CHECK_EQ_INT(tokenizer_bos(l), 11);
        int32_t ids[4];
        size_t n = 0;
        CHECK_EQ_INT(tokenizer_encode(l, "ab", 2, 1, 1, ids, 4, &n, NULL), 0);
        CHECK_EQ_INT(n, 2);
        CHECK_EQ_INT(ids[0], 11);
        CHECK_EQ_INT(ids[1], ab);
        CHECK_EQ_INT(tokenizer_encode(l, "ab", 2, 0, 1, ids, 4, &n, NULL), 0);
        CHECK_EQ_INT(n, 1);
    }
    tokenizer_close(q);
    tokenizer_close(l);
}

TEST(test_bpe_pretokenizer_digits)
{
    bpe_voc b;
    bv_init(&b);
    int32_t d12 = bv_add(&b, "12", TOK_NORMAL);
    int32_t d123 = bv_add(&b, "123", TOK_NORMAL);
    const char *merges[] = { "1 2", "12 3" };
    tokenizer *q = open_bpe(&b, "qwen2", merges, 2);
    tokenizer *l = open_bpe(&b, "llama-bpe", merges, 2);
    CHECK(q && l);
    if (q && l) {
        /* qwen2 splits digits one by one, llama3 in threes */
        CHECK(enc_is(q, "1234", 1, (int32_t[]){ '1', '2', '3', '4', -1 }));
        CHECK(enc_is(l, "1234", 1, (int32_t[]){ d123, '4', -1 }));
        CHECK(enc_is(l, "12", 1, (int32_t[]){ d12, -1 }));
    }
    tokenizer_close(q);
    tokenizer_close(l);
}

/* ==== Special tokens ==== */

TEST(test_special_partition)
{
    bpe_voc b;
    bv_init(&b);
    int32_t x = bv_add(&b, "<|x|>", TOK_CONTROL);
    int32_t xy = bv_add(&b, "<|xy|>", TOK_CONTROL);
    int32_t u = bv_add(&b, "<u>", TOK_USER_DEFINED);
    int32_t bcd = bv_add(&b, "bcd", TOK_CONTROL);
    int32_t ab = bv_add(&b, "ab", TOK_CONTROL);
    tokenizer *t = open_bpe(&b, "qwen2", NULL, 0);
    CHECK(t != NULL);
    if (!t) return;
    CHECK(enc_is(t, "<|xy|><|x|><u>", 1, (int32_t[]){ xy, x, u, -1 }));
    /* parse_special = 0: control tokens are text, user-defined still match */
    CHECK(enc_is(t, "<|x|><u>", 0, (int32_t[]){ '<', '|', 'x', '|', '>', u, -1 }));
    /* one token at a time, longest first: "bcd" wins over the earlier "ab" */
    CHECK(enc_is(t, "abcd", 1, (int32_t[]){ 'a', bcd, -1 }));
    CHECK(enc_is(t, "abab", 1, (int32_t[]){ ab, ab, -1 }));
    /* special text inside words, partial texts stay text */
    CHECK(enc_is(t, "q<|x|>r<|x", 1, (int32_t[]){ 'q', x, 'r', '<', '|', 'x', -1 }));
    CHECK_EQ_INT(tokenizer_attr(t, x), TOK_CONTROL);
    CHECK_EQ_INT(tokenizer_attr(t, u), TOK_USER_DEFINED);
    CHECK_EQ_INT(tokenizer_attr(t, 'a'), TOK_NORMAL);
    /* pieces: control only with special, user-defined always */
    char buf[16];
    CHECK_EQ_INT(tokenizer_piece(t, x, 0, buf, sizeof buf), 0);
    CHECK_EQ_INT(tokenizer_piece(t, x, 1, buf, sizeof buf), 5);
    CHECK(memcmp(buf, "<|x|>", 5) == 0);
    CHECK_EQ_INT(tokenizer_piece(t, u, 0, buf, sizeof buf), 3);
    CHECK_EQ_INT(tokenizer_piece(t, 256 + 100, 1, buf, sizeof buf), ERR_RANGE);
    CHECK_EQ_INT(tokenizer_piece(t, -1, 1, buf, sizeof buf), ERR_RANGE);
    /* a space byte renders as a space */
    CHECK_EQ_INT(tokenizer_piece(t, ' ', 1, buf, sizeof buf), 1);
    CHECK(buf[0] == ' ');
    tokenizer_close(t);
}

TEST(test_piece_unmapped)
{
    /* a NORMAL byte-level token holding characters outside the byte map
     * renders as llama.cpp's llama_decode_text does */
    bpe_voc b;
    bv_init(&b);
    int32_t odd = bv_add(&b, "\xc3\xa9\xe2\x82\xac", TOK_NORMAL);   /* "é€": é is byte 0xE9, € maps to no byte */
    tokenizer *t = open_bpe(&b, "qwen2", NULL, 0);
    CHECK(t != NULL);
    if (!t) return;
    char buf[64];
    const char want[] = "\xe9[UNK_BYTE_0xe282ac\xc3\xa9\xe2\x82\xac]";
    int n = tokenizer_piece(t, odd, 0, buf, sizeof buf);
    CHECK_EQ_INT(n, (int)strlen(want));
    CHECK(n > 0 && memcmp(buf, want, (size_t)n) == 0);
    /* truncated output still reports the full length */
    CHECK_EQ_INT(tokenizer_piece(t, odd, 0, buf, 4), n);
    size_t tl = 0;
    CHECK(tokenizer_text(t, odd, &tl) != NULL && tl == 5);
    CHECK(tokenizer_text(t, -3, &tl) == NULL);
    tokenizer_close(t);
}

/* ==== EOG ==== */

TEST(test_eog_detection)
{
    bpe_voc b;
    bv_init(&b);
    int32_t im_end = bv_add(&b, "<|im_end|>", TOK_NORMAL);     /* forced to CONTROL */
    int32_t eot = bv_add(&b, "<|endoftext|>", TOK_CONTROL);
    int32_t fim = bv_add(&b, "<|fim_pad|>", TOK_NORMAL);
    int32_t start = bv_add(&b, "<|im_start|>", TOK_CONTROL);
    int32_t unused = bv_add(&b, "<|unused_3|>", TOK_CONTROL);
    tokenizer *t = open_bpe(&b, "qwen2", NULL, 0);
    CHECK(t != NULL);
    if (!t) return;
    CHECK(tokenizer_is_eog(t, im_end));
    CHECK(tokenizer_is_eog(t, eot));
    CHECK(tokenizer_is_eog(t, fim));
    CHECK(!tokenizer_is_eog(t, start));
    CHECK(!tokenizer_is_eog(t, unused));
    CHECK(!tokenizer_is_eog(t, 'a'));
    CHECK(!tokenizer_is_eog(t, -1));
    CHECK(!tokenizer_is_eog(t, 100000));
    CHECK_EQ_INT(tokenizer_attr(t, im_end), TOK_CONTROL);
    CHECK_EQ_INT(tokenizer_attr(t, unused), TOK_CONTROL);
    /* eot auto-detected: the lowest id among the known texts */
    CHECK_EQ_INT(tokenizer_eot(t), im_end);
    /* BPE default BOS/EOS = 11 (a byte token here) and EOS is EOG */
    CHECK_EQ_INT(tokenizer_eos(t), 11);
    CHECK(tokenizer_is_eog(t, 11));
    tokenizer_close(t);

    /* gpt-oss: <|end|> is not EOG next to <|return|> and <|call|>; the
     * harmony structure tokens are always rendered */
    bv_init(&b);
    int32_t ret = bv_add(&b, "<|return|>", TOK_CONTROL);
    int32_t call = bv_add(&b, "<|call|>", TOK_CONTROL);
    int32_t end = bv_add(&b, "<|end|>", TOK_CONTROL);
    int32_t chan = bv_add(&b, "<|channel|>", TOK_CONTROL);
    t = open_bpe(&b, "gpt-4o", NULL, 0);
    CHECK(t != NULL);
    if (!t) return;
    CHECK(tokenizer_is_eog(t, ret));
    CHECK(tokenizer_is_eog(t, call));
    CHECK(!tokenizer_is_eog(t, end));
    CHECK_EQ_INT(tokenizer_attr(t, end), TOK_USER_DEFINED);
    CHECK_EQ_INT(tokenizer_attr(t, chan), TOK_USER_DEFINED);
    char buf[16];
    CHECK_EQ_INT(tokenizer_piece(t, chan, 0, buf, sizeof buf), 11);
    /* user-defined: matched even without parse_special */
    CHECK(enc_is(t, "<|channel|>", 0, (int32_t[]){ chan, -1 }));
    tokenizer_close(t);

    /* without <|call|>, <|end|> stays EOG */
    bv_init(&b);
    end = bv_add(&b, "<|end|>", TOK_CONTROL);
    bv_add(&b, "<|return|>", TOK_CONTROL);
    t = open_bpe(&b, "qwen2", NULL, 0);
    CHECK(t && tokenizer_is_eog(t, end));
    tokenizer_close(t);
}

/* ==== Round trips ==== */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static size_t put_utf8(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) { o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 63)); o[2] = (char)(0x80 | (c & 63)); return 3; }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 63));
    o[2] = (char)(0x80 | ((c >> 6) & 63)); o[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* Random valid UTF-8 mixing the scripts and whitespace the regexes care about. */
static size_t random_utf8(uint64_t *s, char *out, size_t max_cp)
{
    static const uint32_t ranges[][2] = {
        { 'a', 'z' }, { 'A', 'Z' }, { '0', '9' }, { ' ', ' ' }, { '\n', '\n' }, { '\t', '\r' },
        { '!', '/' }, { 0xA0, 0xFF }, { 0x391, 0x3C9 }, { 0x410, 0x44F }, { 0x300, 0x36F },
        { 0x4E00, 0x4E80 }, { 0x3040, 0x30FF }, { 0xAC00, 0xAC40 }, { 0x2000, 0x206F },
        { 0x1F300, 0x1F64F }, { 0x85, 0x85 }, { 0x3000, 0x3000 }, { 0x660, 0x669 }, { 0xFF10, 0xFF19 },
    };
    size_t n = (size_t)(rng_next(s) % max_cp), o = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *r = ranges[rng_next(s) % (sizeof ranges / sizeof ranges[0])];
        uint32_t c = r[0] + (uint32_t)(rng_next(s) % (r[1] - r[0] + 1));
        o += put_utf8(c, out + o);
    }
    return o;
}

/* llama.cpp's reading of arbitrary bytes, written out again independently of
 * src/tokenizer: bad bytes -> U+FFFD, shortest forms, surrogates kept,
 * > U+10FFFF -> U+FFFD (our choice; llama.cpp throws). */
static size_t llama_sanitize(const uint8_t *s, size_t n, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t need = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
        int ok = need > 0 && i + need <= n;
        for (size_t k = 1; ok && k < need; k++) ok = (s[i + k] & 0xC0) == 0x80;
        if (!ok) { o += put_utf8(0xFFFD, out + o); i++; continue; }
        uint32_t cp = need == 1 ? c : need == 2 ? (uint32_t)(c & 0x1F) : need == 3 ? (uint32_t)(c & 0x0F) : (uint32_t)(c & 0x07);
        for (size_t k = 1; k < need; k++) cp = (cp << 6) | (s[i + k] & 0x3F);
        if (cp > 0x10FFFF) cp = 0xFFFD;
        o += put_utf8(cp, out + o);
        i += need;
    }
    return o;
}

static size_t decode_all(const tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int l = tokenizer_piece(t, ids[i], 1, out + o, cap - o);
        if (l < 0 || (size_t)l > cap - o) return (size_t)-1;
        o += (size_t)l;
    }
    return o;
}

TEST(test_roundtrip_bpe)
{
    bpe_voc b;
    bv_init(&b);
    bv_add(&b, "\xc4\xa0t", TOK_NORMAL);
    bv_add(&b, "he", TOK_NORMAL);
    bv_add(&b, "\xc4\xa0the", TOK_NORMAL);
    bv_add(&b, "<|im_end|>", TOK_CONTROL);
    const char *merges[] = { "\xc4\xa0 t", "h e", "\xc4\xa0t he" };
    const char *pres[] = { "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o" };
    uint64_t s = 0x9E3779B97F4A7C15ull;
    enum { MAXB = 4096 };
    char *text = malloc(MAXB), *dec = malloc(MAXB * 4), *want = malloc(MAXB * 4);
    int32_t *ids = malloc(MAXB * 4 * sizeof *ids);
    for (size_t p = 0; p < 4; p++) {
        tokenizer *t = open_bpe(&b, pres[p], merges, 3);
        CHECK(t != NULL);
        if (!t) continue;
        int bad = 0;
        for (int iter = 0; iter < 300 && !bad; iter++) {
            size_t n = random_utf8(&s, text, 200), n_ids = 0;
            int rc = tokenizer_encode(t, text, n, 0, iter & 1, ids, MAXB * 4, &n_ids, NULL);
            size_t dn = rc ? (size_t)-1 : decode_all(t, ids, n_ids, dec, MAXB * 4);
            if (dn != n || memcmp(dec, text, n) != 0) {
                bad = 1;
                CHECK_MSG(0, "pre %s: valid UTF-8 round trip %d failed (%zu bytes)", pres[p], iter, n);
            }
        }
        for (int iter = 0; iter < 300 && !bad; iter++) {
            size_t n = (size_t)(rng_next(&s) % 64), n_ids = 0;
            for (size_t i = 0; i < n; i++) {
                /* bias towards UTF-8 lead and continuation bytes */
                uint64_t r = rng_next(&s);
                text[i] = (char)(r & 1 ? 0x80 | (r >> 8) : r >> 8);
            }
            size_t wn = llama_sanitize((const uint8_t *)text, n, want);
            int rc = tokenizer_encode(t, text, n, 0, 1, ids, MAXB * 4, &n_ids, NULL);
            size_t dn = rc ? (size_t)-1 : decode_all(t, ids, n_ids, dec, MAXB * 4);
            if (dn != wn || memcmp(dec, want, wn) != 0) {
                bad = 1;
                CHECK_MSG(0, "pre %s: random bytes round trip %d failed", pres[p], iter);
            }
        }
        /* specific invalid forms */
        static const struct { const char *in; size_t n; const char *out; size_t on; } cases[] = {
            { "a\x80z", 3, "a\xef\xbf\xbdz", 5 },
            { "\xc0\x80", 2, "\0", 1 },
            { "\xe0\x80\x80", 3, "\0", 1 },
            { "\xed\xa0\x80", 3, "\xed\xa0\x80", 3 },
            { "\xf4\x90\x80\x80", 4, "\xef\xbf\xbd", 3 },
            { "\xe4\xb8", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6 },
            { "\xff", 1, "\xef\xbf\xbd", 3 },
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            size_t n_ids = 0;
            CHECK_EQ_INT(tokenizer_encode(t, cases[c].in, cases[c].n, 0, 1, ids, 64, &n_ids, NULL), 0);
            size_t dn = decode_all(t, ids, n_ids, dec, 64);
            CHECK_MSG(dn == cases[c].on && memcmp(dec, cases[c].out, dn) == 0, "invalid case %zu (%s)", c, pres[p]);
        }
        tokenizer_close(t);
    }
    free(text); free(dec); free(want); free(ids);
}

/* SPM with U+2581 runs ("▁▁", as real vocabularies have for indentation)
 * and with a U+2581 inside a token (which turns off the word split). */
TEST(test_spm_space_runs)
{
    static char names[256][8];
    for (int variant = 0; variant < 2; variant++) {
        const char *toks[300];
        int32_t types[300];
        float scores[300];
        int n = 0;
        toks[n] = "<unk>"; types[n] = TOK_UNKNOWN; scores[n++] = 0;
        toks[n] = "<s>"; types[n] = TOK_CONTROL; scores[n++] = 0;
        toks[n] = "</s>"; types[n] = TOK_CONTROL; scores[n++] = 0;
        for (int i = 0; i < 256; i++) {
            snprintf(names[i], sizeof names[i], "<0x%02X>", i);
            toks[n] = names[i]; types[n] = TOK_BYTE; scores[n++] = 0;
        }
        int32_t sp = n;  toks[n] = "\xe2\x96\x81"; types[n] = TOK_NORMAL; scores[n++] = -5;
        int32_t sp2 = n; toks[n] = "\xe2\x96\x81\xe2\x96\x81"; types[n] = TOK_NORMAL; scores[n++] = -1;
        int32_t a = n;   toks[n] = "a"; types[n] = TOK_NORMAL; scores[n++] = -9;
        int32_t b = n;   toks[n] = "b"; types[n] = TOK_NORMAL; scores[n++] = -9;
        int32_t ua = n;  toks[n] = "\xe2\x96\x81" "a"; types[n] = TOK_NORMAL; scores[n++] = -2;
        int32_t aub = -1;
        if (variant) {   /* "a▁" then "a▁b": a merge across the space */
            toks[n] = "a\xe2\x96\x81"; types[n] = TOK_NORMAL; scores[n++] = -3;
            aub = n; toks[n] = "a\xe2\x96\x81" "b"; types[n] = TOK_NORMAL; scores[n++] = 0;
        }
        vspec v = { .model = "llama", .tokens = toks, .n_tokens = n, .types = types, .n_types = n,
                    .scores = scores, .n_scores = n, .bos = -1, .eos = -1, .add_bos = -1 };
        tokenizer *t = NULL;
        err e = { 0 };
        CHECK_EQ_INT(open_spec(&v, &t, &e), 0);
        if (!t) continue;
        /* "▁a▁▁▁b": the run of three merges "▁▁" first (leftmost), then "▁b" has no token */
        CHECK(enc_is(t, "a   b", 1, (int32_t[]){ ua, sp2, sp, b, -1 }));
        CHECK(enc_is(t, "  a", 1, (int32_t[]){ sp2, ua, -1 }));
        if (variant) CHECK(enc_is(t, "xa b", 1, (int32_t[]){ sp, 3 + 'x', aub, -1 }));
        else CHECK(enc_is(t, "xa b", 1, (int32_t[]){ sp, 3 + 'x', a, sp, b, -1 }));
        (void)a;
        tokenizer_close(t);
    }
}

TEST(test_roundtrip_spm)
{
    static char names[256][8];
    const char *toks[300];
    int32_t types[300];
    float scores[300];
    int n = 0;
    toks[n] = "<unk>"; types[n] = TOK_UNKNOWN; scores[n++] = 0;
    toks[n] = "<s>"; types[n] = TOK_CONTROL; scores[n++] = 0;
    toks[n] = "</s>"; types[n] = TOK_CONTROL; scores[n++] = 0;
    for (int i = 0; i < 256; i++) {
        snprintf(names[i], sizeof names[i], "<0x%02X>", i);
        toks[n] = names[i]; types[n] = TOK_BYTE; scores[n++] = 0;
    }
    int32_t u_a = n;
    toks[n] = "\xe2\x96\x81" "a"; types[n] = TOK_NORMAL; scores[n++] = -1;   /* "▁a" */
    int32_t ab = n;
    toks[n] = "ab"; types[n] = TOK_NORMAL; scores[n++] = -2;
    int32_t u_ab = n;
    toks[n] = "\xe2\x96\x81" "ab"; types[n] = TOK_NORMAL; scores[n++] = -0.5f;
    int32_t a = n;
    toks[n] = "a"; types[n] = TOK_NORMAL; scores[n++] = -10;
    int32_t bb = n;
    toks[n] = "b"; types[n] = TOK_NORMAL; scores[n++] = -10;
    int32_t sp = n;
    toks[n] = "\xe2\x96\x81"; types[n] = TOK_NORMAL; scores[n++] = -10;
    vspec v = { .model = "llama", .tokens = toks, .n_tokens = n, .types = types, .n_types = n,
                .scores = scores, .n_scores = n, .bos = -1, .eos = -1, .add_bos = -1 };
    tokenizer *t = NULL;
    err e = { 0 };
    CHECK_EQ_INT(open_spec(&v, &t, &e), 0);
    if (!t) return;
    CHECK_EQ_INT(tokenizer_bos(t), 1);
    CHECK_EQ_INT(tokenizer_add_bos(t), 1);
    /* merges by score: "▁ab" (-0.5) beats "▁a" (-1) */
    CHECK(enc_is(t, "ab", 1, (int32_t[]){ u_ab, -1 }));
    CHECK(enc_is(t, "a", 1, (int32_t[]){ u_a, -1 }));
    CHECK(enc_is(t, "b ab", 1, (int32_t[]){ sp, bb, u_ab, -1 }));
    CHECK(enc_is(t, "bab", 1, (int32_t[]){ sp, bb, ab, -1 }));
    /* byte fallback: 'z' has no token */
    CHECK(enc_is(t, "z", 1, (int32_t[]){ sp, 3 + 'z', -1 }));
    /* a leading space again after a special token */
    CHECK(enc_is(t, "a</s>a", 1, (int32_t[]){ u_a, 2, u_a, -1 }));
    CHECK(enc_is(t, "a</s>a", 0, (int32_t[]){ u_a, 3 + '<', 3 + '/', 3 + 's', 3 + '>', a, -1 }));
    int32_t ids[8];
    size_t ni = 0;
    CHECK_EQ_INT(tokenizer_encode(t, "a", 1, 1, 1, ids, 8, &ni, NULL), 0);
    CHECK_EQ_INT(ni, 2);
    CHECK_EQ_INT(ids[0], 1);
    char buf[8];
    CHECK_EQ_INT(tokenizer_piece(t, u_ab, 0, buf, sizeof buf), 3);
    CHECK(memcmp(buf, " ab", 3) == 0);
    CHECK_EQ_INT(tokenizer_piece(t, 3 + 0x41, 0, buf, sizeof buf), 1);
    CHECK(buf[0] == 'A');

    /* random bytes survive (plus the leading space), except that a space
     * swallowed by a truncated UTF-8 sequence before it stays "\xe2\x96\x81":
     * llama.cpp cuts symbols by lead byte after escaping spaces. */
    uint64_t s = 12345;
    char text[256], dec[1024], esc[1024], want[1024];
    int32_t many[1024];
    int bad = 0;
    for (int iter = 0; iter < 500 && !bad; iter++) {
        size_t len = (size_t)(rng_next(&s) % 100), n_ids = 0;
        for (size_t i = 0; i < len; i++) {
            uint8_t c = (uint8_t)(rng_next(&s) >> 11);
            text[i] = (char)(c == 0xE2 ? 'a' : c);   /* no accidental U+2581 */
        }
        size_t en = 0, wn = 0;
        memcpy(esc, "\xe2\x96\x81", 3);
        en = len ? 3 : 0;   /* empty text: no fragment, no leading space */
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') { memcpy(esc + en, "\xe2\x96\x81", 3); en += 3; }
            else esc[en++] = text[i];
        }
        for (size_t i = 0; i < en;) {
            uint8_t c = (uint8_t)esc[i];
            size_t l = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if (l > en - i) l = en - i;
            if (l == 3 && memcmp(esc + i, "\xe2\x96\x81", 3) == 0) want[wn++] = ' ';
            else { memcpy(want + wn, esc + i, l); wn += l; }
            i += l;
        }
        int rc = tokenizer_encode(t, text, len, 0, 0, many, 1024, &n_ids, NULL);
        size_t dn = rc ? (size_t)-1 : decode_all(t, many, n_ids, dec, sizeof dec);
        if (dn != wn || memcmp(dec, want, wn) != 0) {
            bad = 1;
            CHECK_MSG(0, "SPM random bytes round trip %d failed: rc %d, %zu bytes -> %zu ids -> %zu bytes", iter, rc, len, n_ids, dn);
            for (size_t i = 0; i < len; i++) fprintf(stderr, "%02x ", (uint8_t)text[i]);
            fprintf(stderr, "\n");
        }
    }
    tokenizer_close(t);
}

/* ==== Long input: no quadratic behaviour ==== */

TEST(test_long_pieces)
{
    bpe_voc b;
    bv_init(&b);
    int32_t aa = bv_add(&b, "aa", TOK_NORMAL);
    int32_t a4 = bv_add(&b, "aaaa", TOK_NORMAL);
    int32_t sp2 = bv_add(&b, "\xc4\xa0\xc4\xa0", TOK_NORMAL);
    const char *merges[] = { "a a", "aa aa", "\xc4\xa0 \xc4\xa0" };
    tokenizer *t = open_bpe(&b, "qwen2", merges, 3);
    CHECK(t != NULL);
    if (!t) return;
    size_t n = 400000;
    char *text = malloc(n + 1);
    int32_t *ids = malloc(n * sizeof *ids);
    memset(text, 'a', n);
    size_t n_ids = 0;
    CHECK_EQ_INT(tokenizer_encode(t, text, n, 0, 1, ids, n, &n_ids, NULL), 0);
    CHECK_EQ_INT(n_ids, n / 4);
    CHECK(ids[0] == a4 && ids[n_ids - 1] == a4);
    /* one huge whitespace piece */
    memset(text, ' ', n);
    text[n - 1] = 'x';
    CHECK_EQ_INT(tokenizer_encode(t, text, n, 0, 1, ids, n, &n_ids, NULL), 0);
    CHECK(n_ids > 0 && ids[0] == sp2);
    /* count only, then a too small buffer */
    size_t want = n_ids;
    CHECK_EQ_INT(tokenizer_encode(t, text, n, 0, 1, NULL, 0, &n_ids, NULL), ERR_RANGE);
    CHECK_EQ_INT(n_ids, want);
    err e = { 0 };
    CHECK_EQ_INT(tokenizer_encode(t, text, n, 0, 1, ids, 3, &n_ids, &e), ERR_RANGE);
    CHECK_EQ_INT(n_ids, want);
    CHECK(ids[0] == sp2);
    (void)aa;
    free(text);
    free(ids);
    tokenizer_close(t);
}

/* ==== Building blocks for vocabulary training ==== */

typedef struct pieces { char buf[8192]; size_t n; char raw[8192]; size_t n_raw; } pieces;

/* Collect pieces: buf has a '|' after each, raw is their concatenation. */
static void collect(void *ctx, const char *p, size_t n)
{
    pieces *c = ctx;
    if (c->n + n + 1 < sizeof c->buf) {
        memcpy(c->buf + c->n, p, n);
        c->n += n;
        c->buf[c->n++] = '|';
    }
    if (c->n_raw + n < sizeof c->raw) {
        memcpy(c->raw + c->n_raw, p, n);
        c->n_raw += n;
    }
}

TEST(test_pre_split)
{
    static pieces c;
    const char *s = "Hello world's 1234  x\n\n";
    CHECK_EQ_INT(tokenizer_pre_split("qwen2", s, strlen(s), collect, &c, NULL), 0);
    c.buf[c.n] = 0;
    CHECK_MSG(strcmp(c.buf, "Hello| world|'s| |1|2|3|4| | x|\n\n|") == 0, "got %s", c.buf);
    c.n = 0;
    CHECK_EQ_INT(tokenizer_pre_split("llama-bpe", s, strlen(s), collect, &c, NULL), 0);
    c.buf[c.n] = 0;
    CHECK_MSG(strcmp(c.buf, "Hello| world|'s| |123|4| | x|\n\n|") == 0, "got %s", c.buf);
    /* U+0085 is whitespace for llama.cpp (PCRE2's own \s would miss it) */
    c.n = 0;
    const char *nel = "a\xc2\x85\xc2\x85" "b";
    CHECK_EQ_INT(tokenizer_pre_split("qwen2", nel, strlen(nel), collect, &c, NULL), 0);
    c.buf[c.n] = 0;
    CHECK_MSG(strcmp(c.buf, "a|\xc2\x85|\xc2\x85" "b|") == 0, "got %s", c.buf);
    err e = { 0 };
    CHECK_EQ_INT(tokenizer_pre_split("nope", s, strlen(s), collect, &c, &e), ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "nope") != NULL);

    /* pieces cover the text, for every pre-tokenizer */
    const char *pres[] = { "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o", "default", "qwen35" };
    uint64_t st = 777;
    char text[2048];
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        for (int iter = 0; iter < 50; iter++) {
            size_t n = random_utf8(&st, text, 100);
            c.n = c.n_raw = 0;
            CHECK_EQ_INT(tokenizer_pre_split(pres[p], text, n, collect, &c, NULL), 0);
            CHECK_MSG(c.n_raw == n && memcmp(c.raw, text, n) == 0, "%s: pieces do not cover the text", pres[p]);
        }
    }
}

TEST(test_byte_map)
{
    char o[4];
    CHECK_EQ_INT(tokenizer_byte_to_utf8('A', o), 1);
    CHECK(o[0] == 'A');
    CHECK_EQ_INT(tokenizer_byte_to_utf8(' ', o), 2);
    CHECK(memcmp(o, "\xc4\xa0", 2) == 0);          /* U+0120 'Ġ' */
    CHECK_EQ_INT(tokenizer_byte_to_utf8('\n', o), 2);
    CHECK(memcmp(o, "\xc4\x8a", 2) == 0);          /* U+010A 'Ċ' */
    CHECK_EQ_INT(tokenizer_byte_to_utf8(0xAD, o), 2);
    CHECK(memcmp(o, "\xc5\x83", 2) == 0);          /* U+0143 */
    CHECK_EQ_INT(tokenizer_byte_to_utf8(0xE9, o), 2);
    CHECK(memcmp(o, "\xc3\xa9", 2) == 0);          /* U+00E9 stands for itself */
}

/* ==== Load errors ==== */

TEST(test_load_errors)
{
    const char *toks[] = { "a", "b", "c", "a b" };
    int32_t types[] = { 1, 1, 1, 1 };
    float scores[] = { 0, 0, 0, 0 };
    const char *merges[] = { "a b" };
    tokenizer *t = NULL;
    err e;

    vspec v = { .model = "gpt2", .pre = "foo-pre", .tokens = toks, .n_tokens = 3, .types = types, .n_types = 3,
                .merges = merges, .n_merges = 1, .bos = -1, .eos = -1, .add_bos = -1 };
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "foo-pre") != NULL);

    v.pre = "qwen2";
    v.model = "bert";
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "bert") != NULL);

    v.model = NULL;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_NOTFOUND);

    v.model = "gpt2";
    v.merges = NULL;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_NOTFOUND);
    CHECK(strstr(e.msg, "merges") != NULL);

    v.merges = merges;
    v.n_types = 2;   /* shorter than the vocabulary */
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "toktypes") != NULL, "%s", e.msg);

    v.n_types = 3;
    v.types_f32 = 1;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_FORMAT);
    v.types_f32 = 0;

    v.scores = scores;
    v.n_scores = 2;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_FORMAT);
    v.scores = NULL;

    const char *dup[] = { "a", "b", "a" };
    v.tokens = dup;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "duplicate") != NULL, "%s", e.msg);
    v.tokens = toks;

    v.tokens = NULL;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_NOTFOUND);
    v.tokens = toks;

    /* add_bos without a BOS: the default id 11 is outside a 3-token vocabulary */
    v.add_bos = 1;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), ERR_FORMAT);
    CHECK_MSG(strstr(e.msg, "bos") != NULL, "%s", e.msg);
    v.add_bos = -1;

    /* an out-of-range special id is a warning, as in llama.cpp */
    v.bos = 99999;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), 0);
    if (t) {
        CHECK_EQ_INT(tokenizer_bos(t), -1);
        CHECK(strstr(tokenizer_warning(t), "bos_token_id") != NULL);
        CHECK_EQ_INT(tokenizer_n_vocab(t), 3);
        tokenizer_close(t);
        t = NULL;
    }
    v.bos = -1;

    /* a missing pre-tokenizer falls back to "default", with a warning */
    v.pre = NULL;
    memset(&e, 0, sizeof e);
    CHECK_EQ_INT(open_spec(&v, &t, &e), 0);
    if (t) {
        CHECK(strcmp(tokenizer_pre_name(t), "default") == 0);
        CHECK(strstr(tokenizer_warning(t), "pre-tokenizer") != NULL);
        tokenizer_close(t);
        t = NULL;
    }
    tokenizer_close(NULL);
}

/* ==== Chat templates ==== */

static const chat_msg k_conv[] = {
    { "system", "You are a helpful assistant" },
    { "user", "Hello" },
    { "assistant", "Hi there" },
    { "user", "Who are you" },
    { "assistant", "   I am an assistant   " },
    { "user", "Another question" },
};

static int chat_is(int tmpl, int add_ass, const char *want)
{
    char buf[2048];
    size_t n = 0;
    err e = { 0 };
    int rc = chat_apply(tmpl, k_conv, 6, add_ass, buf, sizeof buf, &n, &e);
    if (rc || strcmp(buf, want) != 0) {
        fprintf(stderr, "  %s: rc %d\n  got  \"%s\"\n  want \"%s\"\n", chat_template_name(tmpl), rc, rc ? e.msg : buf, want);
        return 0;
    }
    return n == strlen(want);
}

TEST(test_chat_apply)
{
    /* expected strings from llama.cpp's tests/test-chat-template.cpp */
    CHECK(chat_is(CHAT_TMPL_CHATML, 1,
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
        "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
        "<|im_start|>assistant\n"));
    CHECK(chat_is(CHAT_TMPL_LLAMA2, 1,
        "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   "
        "</s>[INST] Another question [/INST]"));
    CHECK(chat_is(CHAT_TMPL_LLAMA2_SYS_BOS, 1,
        "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]"
        "   I am an assistant   </s><s>[INST] Another question [/INST]"));
    CHECK(chat_is(CHAT_TMPL_LLAMA2_SYS_STRIP, 1,
        "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
        "I am an assistant</s>[INST] Another question [/INST]"));
    CHECK(chat_is(CHAT_TMPL_MISTRAL_V1, 1,
        " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant"
        "   </s> [INST] Another question [/INST]"));
    CHECK(chat_is(CHAT_TMPL_MISTRAL_V3, 1,
        "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
        "[INST] Another question[/INST]"));
    CHECK(chat_is(CHAT_TMPL_MISTRAL_V3_TEKKEN, 1,
        "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>"
        "[INST]Another question[/INST]"));
    CHECK(chat_is(CHAT_TMPL_MISTRAL_V7, 1,
        "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you"
        "[/INST]    I am an assistant   </s>[INST] Another question[/INST]"));
    CHECK(chat_is(CHAT_TMPL_LLAMA3, 1,
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    CHECK(chat_is(CHAT_TMPL_DEEPSEEK2, 1,
        "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
        "sentence\xef\xbd\x9c>User: Who are you\n\nAssistant:    I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of"
        "\xe2\x96\x81sentence\xef\xbd\x9c>User: Another question\n\nAssistant:"));
    CHECK(chat_is(CHAT_TMPL_DEEPSEEK3, 1,
        "You are a helpful assistant\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>Hello<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Hi there"
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Who are you"
        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>   I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
        "sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Another question<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"));
    CHECK(chat_is(CHAT_TMPL_GPT_OSS, 1,
        "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello<|end|><|start|>"
        "assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you<|end|><|start|>assistant<|message|>"
        "   I am an assistant   <|return|><|start|>user<|message|>Another question<|end|><|start|>assistant"));
    /* without the generation prompt */
    CHECK(chat_is(CHAT_TMPL_GPT_OSS, 0,
        "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello<|end|><|start|>"
        "assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you<|end|><|start|>assistant<|message|>"
        "   I am an assistant   <|return|><|start|>user<|message|>Another question<|end|>"));

    /* sizing: exact length reported, ERR_RANGE when it does not fit */
    char small[10];
    size_t n = 0;
    CHECK_EQ_INT(chat_apply(CHAT_TMPL_CHATML, k_conv, 1, 0, small, sizeof small, &n, NULL), ERR_RANGE);
    CHECK_EQ_INT(n, strlen("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"));
    CHECK(small[9] == 0);
    CHECK_EQ_INT(chat_apply(CHAT_TMPL_CHATML, k_conv, 1, 0, NULL, 0, &n, NULL), ERR_RANGE);
    CHECK_EQ_INT(chat_apply(CHAT_TMPL_COUNT, k_conv, 1, 0, small, sizeof small, &n, NULL), ERR_USAGE);
    chat_msg bad = { "user", NULL };
    CHECK_EQ_INT(chat_apply(CHAT_TMPL_CHATML, &bad, 1, 0, small, sizeof small, &n, NULL), ERR_USAGE);
}

TEST(test_chat_detect)
{
    CHECK_EQ_INT(chat_template_detect(
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n' }}{%- endfor %}"), CHAT_TMPL_CHATML);
    CHECK_EQ_INT(chat_template_detect(
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
        "message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}"),
        CHAT_TMPL_LLAMA2);
    CHECK_EQ_INT(chat_template_detect("... '<<SYS>>\\n' ... '[INST] ' ..."), CHAT_TMPL_LLAMA2_SYS);
    CHECK_EQ_INT(chat_template_detect("[INST] ... content.strip() ..."), CHAT_TMPL_LLAMA2_SYS_STRIP);
    CHECK_EQ_INT(chat_template_detect("... bos_token + '[INST] ' ..."), CHAT_TMPL_LLAMA2_SYS_BOS);
    CHECK_EQ_INT(chat_template_detect("[SYSTEM_PROMPT] [INST]"), CHAT_TMPL_MISTRAL_V7);
    CHECK_EQ_INT(chat_template_detect("{{- ' [INST] ' + system_message }}"), CHAT_TMPL_MISTRAL_V1);
    CHECK_EQ_INT(chat_template_detect("{{- \"[AVAILABLE_TOOLS] [\" }} {{- \"[INST] \" }}"), CHAT_TMPL_MISTRAL_V3);
    CHECK_EQ_INT(chat_template_detect("{{- \"[AVAILABLE_TOOLS][\" }} {{- \"[INST]\" }}"), CHAT_TMPL_MISTRAL_V3_TEKKEN);
    CHECK_EQ_INT(chat_template_detect("mistral-whatever"), CHAT_TMPL_LLAMA2);
    CHECK_EQ_INT(chat_template_detect("<|start_header_id|>x<|end_header_id|>"), CHAT_TMPL_LLAMA3);
    CHECK_EQ_INT(chat_template_detect("<|header_start|>x<|header_end|>"), CHAT_TMPL_LLAMA4);
    CHECK_EQ_INT(chat_template_detect(
        "{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}} {{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>'}} "
        "{{'<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}"), CHAT_TMPL_DEEPSEEK3);
    CHECK_EQ_INT(chat_template_detect("{{ 'Assistant: ' + message['content'] + eos_token }}"), CHAT_TMPL_DEEPSEEK2);
    CHECK_EQ_INT(chat_template_detect("<|start|>{{ role }}<|channel|>analysis<|message|>"), CHAT_TMPL_GPT_OSS);
    /* names, NULL default, and families llama.cpp knows but we do not render */
    CHECK_EQ_INT(chat_template_detect("deepseek3"), CHAT_TMPL_DEEPSEEK3);
    CHECK_EQ_INT(chat_template_detect(NULL), CHAT_TMPL_CHATML);
    CHECK_EQ_INT(chat_template_detect("<|im_start|>system<|im_sep|>"), ERR_UNSUPPORTED);
    CHECK(strcmp(chat_template_detect_family("<|im_start|>system<|im_sep|>"), "phi4") == 0);
    CHECK_EQ_INT(chat_template_detect("<start_of_turn>user"), ERR_UNSUPPORTED);
    CHECK_EQ_INT(chat_template_detect("gemma"), ERR_UNSUPPORTED);
    CHECK_EQ_INT(chat_template_detect("just some text"), ERR_NOTFOUND);
    CHECK(chat_template_detect_family("just some text") == NULL);
    CHECK_EQ_INT(chat_template_from_name("gpt-oss"), CHAT_TMPL_GPT_OSS);
    CHECK_EQ_INT(chat_template_from_name("chatml"), CHAT_TMPL_CHATML);
    CHECK_EQ_INT(chat_template_from_name("nope"), ERR_NOTFOUND);
    CHECK_EQ_INT(chat_template_from_name(NULL), ERR_NOTFOUND);
    for (int i = 0; i < CHAT_TMPL_COUNT; i++) CHECK_EQ_INT(chat_template_from_name(chat_template_name(i)), i);
    CHECK(chat_template_name(-1) == NULL);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/strata_tok_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_bpe_merge_order);
    RUN(test_bpe_ignore_merges);
    RUN(test_bpe_pretokenizer_digits);
    RUN(test_special_partition);
    RUN(test_piece_unmapped);
    RUN(test_eog_detection);
    RUN(test_roundtrip_bpe);
    RUN(test_spm_space_runs);
    RUN(test_roundtrip_spm);
    RUN(test_long_pieces);
    RUN(test_pre_split);
    RUN(test_byte_map);
    RUN(test_load_errors);
    RUN(test_chat_apply);
    RUN(test_chat_detect);
    rmdir(g_dir);
    return test_summary("tokenizer");
}

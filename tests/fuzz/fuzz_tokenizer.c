/* fuzz_tokenizer: libFuzzer target for src/tokenizer.
 *
 * The first input byte picks one of four tokenizers built once in-process
 * (byte-level BPE with the qwen2, gpt-4o and deepseek-v3 pre-tokenizers, and
 * a SentencePiece vocabulary with byte fallback); the rest is the text. For
 * each input it encodes with parse_special 0 and 1, decodes every id back and
 * checks that nothing crashes, that the count-only call agrees, and that
 * decode(encode(x)) is x after llama.cpp's UTF-8 reading for BPE (x itself
 * for valid UTF-8), and x up to spaces / U+2581 for SPM. It also runs the public
 * pre-tokenizer split (pieces must cover the text) and the chat-template
 * detection and rendering on the input.
 *
 * The vocabularies are written with gguf_writer to a temporary file and read
 * back at the first call; the static pointers are the harness's only state.
 * Build: make fuzz (or clang -fsanitize=fuzzer,address,undefined ...). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

static tokenizer *g_tok[4];   /* set once at the first call */

static const char *const k_words[] = {
    "the", "The", " the", " and", " of", "ing", "er", " to", " a", "in", " is", "12", "123", "  ",
    "\n\n", ".\n", " (", "()", "<|", "|>", "\xe4\xbd\xa0\xe5\xa5\xbd", "\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80", "'s",
};
static const char *const k_special[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>" };
static const int32_t k_special_type[] = { 3, 3, 3, 4, 4 };

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, msg);
    abort();
}

/* Byte-mapped form of s (GPT-2 byte table). */
static char *mapped(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n * 2 + 1), *p = o;
    for (size_t i = 0; i < n; i++) p += tokenizer_byte_to_utf8((uint8_t)s[i], p);
    *p = 0;
    return o;
}

static tokenizer *open_written(gguf_writer *w, const char *tag)
{
    char path[256];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/fuzz_tokenizer_%s_%d.gguf", dir && *dir ? dir : "/tmp", tag, (int)getpid());
    err e = { 0 };
    if (gguf_writer_begin(w, path, &e) || gguf_writer_finish(w, &e)) die("writing the vocabulary", e.msg);
    gguf_writer_free(w);
    gguf_file *f = NULL;
    tokenizer *t = NULL;
    if (gguf_open(&f, path, &e) || tokenizer_open(&t, f, &e)) die("opening the vocabulary", e.msg);
    gguf_close(f);
    unlink(path);
    return t;
}

static tokenizer *build_bpe(const char *pre)
{
    enum { NW = sizeof k_words / sizeof k_words[0], NS = 5, MAXT = 256 + NW * 8 };
    const char *toks[MAXT + NS];
    char *owned[MAXT];
    int32_t types[MAXT + NS];
    const char *merges[NW * 8];
    int n = 0, nm = 0, no = 0;
    for (int b = 0; b < 256; b++) {
        char *one = calloc(1, 4);
        tokenizer_byte_to_utf8((uint8_t)b, one);
        owned[no++] = one;
        toks[n] = one;
        types[n++] = 1;
    }
    /* each word w becomes a token, built by merging its mapped form
     * character by character, left to right */
    for (int i = 0; i < NW; i++) {
        char *m = mapped(k_words[i]);
        /* mapped characters are U+0021..U+0143: 1 or 2 bytes */
        size_t len = strlen(m), cut = ((uint8_t)m[0] & 0x80) ? 2 : 1;
        while (cut < len) {
            size_t next = cut + (((uint8_t)m[cut] & 0x80) ? 2 : 1);
            char *left = malloc(cut + 1), *right = malloc(next - cut + 1), *line = malloc(next + 2), *tok = malloc(next + 1);
            memcpy(left, m, cut); left[cut] = 0;
            memcpy(right, m + cut, next - cut); right[next - cut] = 0;
            snprintf(line, next + 2, "%s %s", left, right);
            memcpy(tok, m, next); tok[next] = 0;
            int dup = 0;
            for (int k = 0; k < n; k++) dup |= strcmp(toks[k], tok) == 0;
            if (!dup && n < MAXT) { toks[n] = tok; types[n++] = 1; owned[no++] = tok; } else free(tok);
            if (nm < NW * 8) merges[nm++] = line; else free(line);
            free(left);
            free(right);
            cut = next;
        }
        free(m);
    }
    for (int i = 0; i < NS; i++) { toks[n] = k_special[i]; types[n++] = k_special_type[i]; }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, (uint64_t)nm);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 3));
    tokenizer *t = open_written(w, pre);
    for (int i = 0; i < no; i++) free(owned[i]);
    for (int i = 0; i < nm; i++) free((void *)merges[i]);
    return t;
}

static tokenizer *build_spm(void)
{
    static char bytes[256][8];
    const char *toks[512];
    int32_t types[512];
    float scores[512];
    int n = 0;
    toks[n] = "<unk>"; types[n] = 2; scores[n++] = 0;
    toks[n] = "<s>"; types[n] = 3; scores[n++] = 0;
    toks[n] = "</s>"; types[n] = 3; scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b]; types[n] = 6; scores[n++] = 0;
    }
    static const char *const pieces[] = {
        "\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81", "\xe2\x96\x81t", "\xe2\x96\x81th", "\xe2\x96\x81the", "he", "th",
        "in", "ing", "\xe2\x96\x81" "a", "an", "and", "\xe2\x96\x81" "and", "e", "t", "h", "a", "n", "d", "i", "g",
        "\xe4\xbd\xa0", "\xe4\xbd\xa0\xe5\xa5\xbd", "\xe5\xa5\xbd",
    };
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        toks[n] = pieces[i]; types[n] = 1; scores[n++] = -(float)i;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)n);
    return open_written(w, "spm");
}

/* llama.cpp's reading of bytes (independent of src/tokenizer). */
static size_t sanitize(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t need = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
        int ok = need > 0 && i + need <= n;
        for (size_t k = 1; ok && k < need; k++) ok = (s[i + k] & 0xC0) == 0x80;
        uint32_t cp = 0xFFFD;
        if (ok) {
            cp = need == 1 ? c : need == 2 ? (uint32_t)(c & 0x1F) : need == 3 ? (uint32_t)(c & 0x0F) : (uint32_t)(c & 7);
            for (size_t k = 1; k < need; k++) cp = (cp << 6) | (s[i + k] & 0x3F);
            if (cp > 0x10FFFF) cp = 0xFFFD;
            i += need;
        } else {
            i++;
        }
        if (cp < 0x80) out[o++] = (uint8_t)cp;
        else if (cp < 0x800) { out[o++] = (uint8_t)(0xC0 | (cp >> 6)); out[o++] = (uint8_t)(0x80 | (cp & 63)); }
        else if (cp < 0x10000) {
            out[o++] = (uint8_t)(0xE0 | (cp >> 12)); out[o++] = (uint8_t)(0x80 | ((cp >> 6) & 63));
            out[o++] = (uint8_t)(0x80 | (cp & 63));
        } else {
            out[o++] = (uint8_t)(0xF0 | (cp >> 18)); out[o++] = (uint8_t)(0x80 | ((cp >> 12) & 63));
            out[o++] = (uint8_t)(0x80 | ((cp >> 6) & 63)); out[o++] = (uint8_t)(0x80 | (cp & 63));
        }
    }
    return o;
}

/* SPM normal form: U+2581 -> space, then spaces dropped. SPM encoding turns
 * spaces into U+2581 and decoding turns U+2581 pieces back into spaces (a
 * U+2581 that a broken UTF-8 sequence swallowed stays raw), so x and
 * decode(encode(x)) agree in this form. */
static size_t spm_norm(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == ' ') { i++; continue; }
        if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { i += 3; continue; }
        out[o++] = s[i++];
    }
    return o;
}

typedef struct cover { uint8_t *buf; size_t n, cap; } cover;

static void on_piece(void *ctx, const char *p, size_t n)
{
    cover *c = ctx;
    if (n == 0) die("pre_split", "empty piece");
    if (c->n + n > c->cap) die("pre_split", "pieces longer than the text");
    memcpy(c->buf + c->n, p, n);
    c->n += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok[0]) {
        g_tok[0] = build_bpe("qwen2");
        g_tok[1] = build_bpe("gpt-4o");
        g_tok[2] = build_bpe("deepseek-v3");
        g_tok[3] = build_spm();
    }
    if (size == 0 || size > 1 << 16) return 0;
    const tokenizer *t = g_tok[data[0] & 3];
    int spm = (data[0] & 3) == 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    size_t cap = len * 3 + 8, n = 0, n_count = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    uint8_t *dec = malloc(cap * 64 + 64), *want = malloc(len * 3 + 4);
    char *piece = malloc(1 << 16);
    err e = { 0 };
    for (int ps = 0; ps <= 1; ps++) {
        if (tokenizer_encode(t, text, len, ps, ps, ids, cap, &n, &e)) die("encode", e.msg);
        if (tokenizer_encode(t, text, len, ps, ps, NULL, 0, &n_count, NULL) != (n ? ERR_RANGE : 0) || n_count != n)
            die("encode", "count-only call disagrees");
        size_t dn = 0;
        /* BOS (SPM adds it when add_bos is on) is not part of the text */
        size_t first = ps && tokenizer_add_bos(t) ? 1 : 0;
        if (first && (n == 0 || ids[0] != tokenizer_bos(t))) die("encode", "BOS missing");
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) die("encode", "id out of range");
            int l = tokenizer_piece(t, ids[i], 1, piece, 1 << 16);
            if (l < 0 || l > 1 << 16) die("piece", "bad length");
            if (i < first) continue;
            memcpy(dec + dn, piece, (size_t)l);
            dn += (size_t)l;
            (void)tokenizer_is_eog(t, ids[i]);
            (void)tokenizer_attr(t, ids[i]);
        }
        if (!spm) {
            size_t wn = sanitize((const uint8_t *)text, len, want);
            if (dn != wn || memcmp(dec, want, wn) != 0) die("round trip", "decode(encode(x)) != x (as llama.cpp reads x)");
        } else {
            size_t a = spm_norm((const uint8_t *)text, len, want);
            size_t b = spm_norm(dec, dn, dec);
            if (a != b || memcmp(want, dec, a) != 0) die("round trip", "SPM decode(encode(x)) != x up to spaces");
        }
    }

    /* the public split: pieces cover the canonical text */
    static const char *const pres[] = { "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o", "default" };
    cover c = { malloc(len * 3 + 4), 0, len * 3 + 4 };
    size_t wn = sanitize((const uint8_t *)text, len, want);
    const char *pre = pres[(len ? (uint8_t)text[0] : 0) % 5];
    if (tokenizer_pre_split(pre, text, len, on_piece, &c, &e)) die("pre_split", e.msg);
    if (c.n != wn || memcmp(c.buf, want, wn) != 0) die("pre_split", "pieces do not cover the text");
    free(c.buf);

    /* chat templates: detection on the input as a template, rendering with it as content */
    char *z = malloc(len + 1);
    memcpy(z, text, len);
    z[len] = 0;
    (void)chat_template_detect(z);
    (void)chat_template_detect_family(z);
    chat_msg msgs[3] = { { "system", z }, { "user", z }, { "assistant", z } };
    size_t cn = 0;
    int tmpl = (int)(len % CHAT_TMPL_COUNT);
    if (chat_apply(tmpl, msgs, 3, 1, NULL, 0, &cn, NULL) != ERR_RANGE) die("chat", "sizing call");
    char *out = malloc(cn + 1);
    if (chat_apply(tmpl, msgs, 3, 1, out, cn + 1, &cn, NULL) != 0) die("chat", "apply");
    free(out);
    free(z);

    free(ids);
    free(dec);
    free(want);
    free(piece);
    return 0;
}

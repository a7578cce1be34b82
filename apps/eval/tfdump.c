/* tfdump: `strata tfdump -m MODEL -f CORPUS -o DUMP [--eval N]`, a
 * teacher-forced logit dump: the corpus's prompt and evaluation tokens are
 * fed as given (the targets are forced, never sampled) and the logits that
 * predict each target are written, the first of them from the prompt's
 * last row. `strata kld` compares two dumps of the same corpus.
 *
 * Corpus (docs/EVAL.md): a text file with a "### prompt" section and then
 * a "### eval" section (marker lines exactly so, at the start of a line);
 * "### prompt ids" / "### eval ids" take token ids instead of text. Text
 * before the first marker is a free description. A section's text runs
 * from the line after its marker to the newline before the next marker
 * (that newline is not part of it), or to the end of the file (less one
 * final newline). The prompt text is tokenized with the model's BOS, the
 * evaluation text on its own without BOS; special tokens are parsed in
 * both (as llama-cli does a prompt; --no-parse-special turns it off). Ids
 * are used as given, BOS included or not.
 *
 * Evaluation: one session from position 0; the prompt less its last token
 * without logits, then that token and every target but the last with all
 * rows' logits: row i predicts target i (--decode: that token and the
 * targets one call of one token each, the decode phase; the same positions
 * and logits up to the decode path's rounding). The dump layout is in eval.h.
 * The routing configuration recorded is the engine's effective policy
 * (engine_route_describe: "exact" by default, --route / STRATA_ROUTE
 * otherwise), marked " (reads residency)" when its results depend on the
 * arena. Note for exact-last: the two evaluations above are two calls, so
 * "the last N prompt rows" are counted in each (docs/ROUTING.md). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "eval.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

static const char *k_cmd = "tfdump";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata tfdump -m MODEL -f CORPUS -o DUMP [--eval N] [options]\n"
            "\n"
            "Teacher-forced logit dump: feed the corpus's prompt and evaluation tokens and write\n"
            "the logits that predict each evaluation token (corpus format: docs/EVAL.md).\n"
            "Compare two dumps with strata kld.\n"
            "\n"
            "  -m, --model FILE          GGUF model\n"
            "  -f, --file CORPUS         corpus: '### prompt' and '### eval' sections (or '... ids')\n"
            "  -o, --output DUMP         dump to write\n"
            "  --eval N                  use only the first N evaluation tokens\n"
            "  --no-parse-special        treat special-token text in the corpus as plain text\n"
            "  --decode                  feed the last prompt token and the targets one token at a\n"
            "                            time (the decode phase and its routing arm), not in one call\n"
            "  -c, --ctx-size N          context size (default: the corpus's length)\n"
            "  -h, --help                this help\n");
    eval_engine_flags_help(out);
}

/* ==== Corpus ==== */

typedef struct section {
    const char *p;
    size_t n;
    int ids;          /* "### ... ids" */
    int present;
} section;

/* 1 and *kind/ids when the line [p, p+n) (no newline) is a marker. */
static int is_marker(const char *p, size_t n, int *kind, int *ids)
{
    while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    static const struct { const char *s; int kind, ids; } k_markers[] = {
        { "### prompt", 0, 0 }, { "### prompt ids", 0, 1 }, { "### eval", 1, 0 }, { "### eval ids", 1, 1 },
    };
    for (size_t i = 0; i < sizeof k_markers / sizeof k_markers[0]; i++)
        if (n == strlen(k_markers[i].s) && !memcmp(p, k_markers[i].s, n)) {
            *kind = k_markers[i].kind;
            *ids = k_markers[i].ids;
            return 1;
        }
    return 0;
}

/* Split the corpus into its two sections; a one-line error on failure. */
static int parse_corpus(const char *path, const char *buf, size_t len, section sec[2])
{
    memset(sec, 0, 2 * sizeof *sec);
    int cur = -1;
    size_t line = 0, lineno = 0;
    while (line <= len) {
        const char *nl = memchr(buf + line, '\n', len - line);
        const size_t end = nl ? (size_t)(nl - buf) : len;
        lineno++;
        int kind, ids;
        if (is_marker(buf + line, end - line, &kind, &ids)) {
            if (cur >= 0) {   /* close the open section before this marker's newline */
                size_t stop = line;
                if (stop > 0 && buf[stop - 1] == '\n') stop--;
                if (stop > 0 && buf[stop - 1] == '\r') stop--;
                sec[cur].n = stop >= (size_t)(sec[cur].p - buf) ? stop - (size_t)(sec[cur].p - buf) : 0;
            }
            if (sec[kind].present)
                return cli_fail(k_cmd, CLI_ERR, "%s:%zu: a second '### %s' section", path, lineno, kind ? "eval" : "prompt");
            if (kind == 0 && sec[1].present)
                return cli_fail(k_cmd, CLI_ERR, "%s:%zu: the prompt section must come before the eval section", path, lineno);
            sec[kind].present = 1;
            sec[kind].ids = ids;
            sec[kind].p = buf + (nl ? end + 1 : end);
            cur = kind;
        }
        if (!nl) break;
        line = end + 1;
    }
    if (cur >= 0) {   /* the last section runs to the end, less one final newline */
        size_t stop = len;
        if (stop > 0 && buf[stop - 1] == '\n') stop--;
        if (stop > 0 && buf[stop - 1] == '\r') stop--;
        const size_t from = (size_t)(sec[cur].p - buf);
        sec[cur].n = stop >= from ? stop - from : 0;
    }
    if (!sec[0].present) return cli_fail(k_cmd, CLI_ERR, "%s: no '### prompt' section (see docs/EVAL.md)", path);
    if (!sec[1].present) return cli_fail(k_cmd, CLI_ERR, "%s: no '### eval' section (see docs/EVAL.md)", path);
    return 0;
}

typedef struct tokvec { int32_t *v; size_t n, cap; } tokvec;

static int tv_push(tokvec *t, int32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        int32_t *nv = realloc(t->v, sizeof *nv * cap);
        if (!nv) return -1;
        t->v = nv;
        t->cap = cap;
    }
    t->v[t->n++] = id;
    return 0;
}

/* Append a section's tokens: ids as written (separated by blanks or
 * commas, optionally inside [ ]), or its text tokenized. */
static int section_tokens(const tokenizer *t, const char *path, const section *s, int add_bos, int parse_special,
                          tokvec *out)
{
    if (s->ids) {
        const int32_t n_vocab = tokenizer_n_vocab(t);
        size_t i = 0;
        while (i < s->n) {
            const char c = s->p[i];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']') { i++; continue; }
            char num[24];
            size_t k = 0;
            while (i < s->n && k + 1 < sizeof num && s->p[i] != ' ' && s->p[i] != '\t' && s->p[i] != '\n' &&
                   s->p[i] != '\r' && s->p[i] != ',' && s->p[i] != ']')
                num[k++] = s->p[i++];
            num[k] = '\0';
            long long v;
            if (cli_parse_int(num, 0, INT32_MAX, &v))
                return cli_fail(k_cmd, CLI_ERR, "%s: '%s' is not a token id", path, num);
            if (v >= n_vocab)
                return cli_fail(k_cmd, CLI_ERR, "%s: token id %lld is outside the vocabulary (%d tokens)", path, v, n_vocab);
            if (tv_push(out, (int32_t)v)) return cli_fail(k_cmd, CLI_ERR, "out of memory");
        }
        return 0;
    }
    err e;
    err_clear(&e);
    size_t cap = s->n + 16, n = 0;
    int32_t *ids = malloc(sizeof *ids * cap);
    int rc = ids ? tokenizer_encode(t, s->p, s->n, add_bos, parse_special, ids, cap, &n, &e) : ERR_NOMEM;
    if (rc == ERR_RANGE) {
        free(ids);
        cap = n;
        ids = malloc(sizeof *ids * cap);
        err_clear(&e);
        rc = ids ? tokenizer_encode(t, s->p, s->n, add_bos, parse_special, ids, cap, &n, &e) : ERR_NOMEM;
    }
    if (rc) {
        free(ids);
        return cli_fail(k_cmd, CLI_ERR, "tokenizing %s: %s", path, e.msg[0] ? e.msg : "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        if (tv_push(out, ids[i])) { free(ids); return cli_fail(k_cmd, CLI_ERR, "out of memory"); }
    free(ids);
    return 0;
}

/* ==== Dump ==== */

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }
static int put_u32(FILE *f, uint32_t v) { return put(f, &v, 4); }

/* -log softmax(l)[tok] in double */
static double nll_of(const float *l, int n, int tok)
{
    double m = l[0], s = 0;
    for (int i = 1; i < n; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - m);
    return -((double)l[tok] - m - log(s));
}

int cmd_tfdump(int argc, char **argv)
{
    engine_opts eo;
    memset(&eo, 0, sizeof eo);
    const char *model = NULL, *corpus = NULL, *outp = NULL;
    long long n_eval_max = -1, n_ctx_arg = 0;
    int parse_special = 1, decode = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        int r = eval_engine_flag(k_cmd, argc, argv, &i, &eo);
        if (r < 0) return CLI_USAGE;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--no-parse-special")) parse_special = 0;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(model = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { if (!(corpus = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { if (!(outp = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--eval") || !strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            long long n;
            if (cli_parse_int(v, 1, 1 << 24, &n))
                return cli_fail(k_cmd, CLI_USAGE, "%s needs a whole number from 1 to %d, got '%s'", a, 1 << 24, v);
            if (!strcmp(a, "--eval")) n_eval_max = n; else n_ctx_arg = n;
        } else {
            return cli_fail(k_cmd, CLI_USAGE, "unknown option '%s' (see strata tfdump --help)", a);
        }
    }
    if (!model) return cli_fail(k_cmd, CLI_USAGE, "a model is required (-m FILE)");
    if (!corpus) return cli_fail(k_cmd, CLI_USAGE, "a corpus is required (-f FILE)");
    if (!outp) return cli_fail(k_cmd, CLI_USAGE, "an output file is required (-o DUMP)");

    size_t len = 0;
    char *text = cli_read_file(k_cmd, corpus, &len);
    if (!text) return CLI_ERR;
    section sec[2];
    if (parse_corpus(corpus, text, len, sec)) { free(text); return CLI_ERR; }

    /* Tokenize first, from the GGUF's tokenizer alone (engine_tokenize runs
     * the same tokenizer), so that the engine opens once, with the context
     * the corpus needs. */
    int rc = CLI_ERR;
    engine *eng = NULL;
    session *s = NULL;
    gguf_file *g = NULL;
    tokenizer *tk = NULL;
    tokvec tok = { 0 };
    float *logits = NULL;
    FILE *f = NULL;
    err e;
    err_clear(&e);
    if (gguf_open(&g, model, &e) || tokenizer_open(&tk, g, &e)) { cli_fail(k_cmd, CLI_ERR, "%s", e.msg); goto done; }
    gguf_close(g);
    g = NULL;
    if (section_tokens(tk, corpus, &sec[0], 1, parse_special, &tok)) goto done;
    const size_t n_prompt = tok.n;
    if (section_tokens(tk, corpus, &sec[1], 0, parse_special, &tok)) goto done;
    size_t n_eval = tok.n - n_prompt;
    if (n_prompt == 0) {
        cli_fail(k_cmd, CLI_ERR, "%s: the prompt has no tokens: at least one must precede the first target", corpus);
        goto done;
    }
    if (n_eval == 0) { cli_fail(k_cmd, CLI_ERR, "%s: the eval section has no tokens", corpus); goto done; }
    if (n_eval_max > 0) {
        if ((size_t)n_eval_max > n_eval) {
            cli_fail(k_cmd, CLI_ERR, "--eval %lld: %s has only %zu evaluation tokens", n_eval_max, corpus, n_eval);
            goto done;
        }
        n_eval = (size_t)n_eval_max;
        tok.n = n_prompt + n_eval;
    }
    const size_t n_fed = tok.n - 1;   /* the last target is never fed */
    if (n_fed > (size_t)(1 << 24)) { cli_fail(k_cmd, CLI_ERR, "%s: %zu tokens is too many", corpus, tok.n); goto done; }
    if (n_ctx_arg > 0 && (size_t)n_ctx_arg < n_fed) {
        cli_fail(k_cmd, CLI_ERR, "-c %lld is smaller than the %zu tokens to evaluate", n_ctx_arg, n_fed);
        goto done;
    }
    eo.model_path = model;
    eo.n_ctx = n_ctx_arg > 0 ? (int)n_ctx_arg : (int)n_fed;
    eo.verbose = 1;
    eo.log = stderr;
    if (engine_open(&eng, &eo, &e)) { cli_fail(k_cmd, CLI_ERR, "%s", e.msg); goto done; }
    if (session_create(&s, eng, &e)) { cli_fail(k_cmd, CLI_ERR, "%s", e.msg); goto done; }
    const int32_t n_vocab = engine_n_vocab(eng);
    logits = malloc(sizeof *logits * n_eval * (size_t)n_vocab);
    if (!logits) { cli_fail(k_cmd, CLI_ERR, "out of memory"); goto done; }
    /* --decode: the same positions, one session_eval of one token each (the
     * decode phase: what a decode routing arm sees under teacher forcing) */
    int ev = n_prompt > 1 ? session_eval(s, tok.v, (int)(n_prompt - 1), NULL, NULL, &e) : 0;
    if (!ev && !decode) ev = session_eval(s, tok.v + n_prompt - 1, (int)n_eval, NULL, logits, &e);
    for (size_t i = 0; !ev && decode && i < n_eval; i++)
        ev = session_eval(s, tok.v + n_prompt - 1 + i, 1, logits + i * (size_t)n_vocab, NULL, &e);
    if (ev) {
        cli_fail(k_cmd, CLI_ERR, "evaluation failed: %s", e.msg);
        goto done;
    }
    double nll = 0;
    for (size_t i = 0; i < n_eval; i++) {
        const float *l = logits + i * (size_t)n_vocab;
        for (int32_t j = 0; j < n_vocab; j++)
            if (!isfinite(l[j])) {
                cli_fail(k_cmd, CLI_ERR, "non-finite logit at evaluation position %zu (id %d)", i, j);
                goto done;
            }
        nll += nll_of(l, n_vocab, tok.v[n_prompt + i]);
    }

    /* vocabulary section: measure, then write */
    char small[256];
    uint64_t vocab_bytes = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        int pl = engine_token_piece(eng, id, 1, small, sizeof small);
        if (pl < 0) { cli_fail(k_cmd, CLI_ERR, "token %d has no text", id); goto done; }
        vocab_bytes += 4 + (uint64_t)pl;
    }
    char routing[1100];
    engine_route_describe(eng, routing, 1024);
    if (engine_route_reads_residency(eng)) strcat(routing, " (reads residency)");
    const char *desc = engine_model_desc(eng);
    const uint64_t header = EVAL_DUMP_FIXED + strlen(routing) + strlen(desc) + 4 * (uint64_t)tok.n + 4 * (uint64_t)n_eval +
                            vocab_bytes;
    if (header > UINT32_MAX || vocab_bytes > UINT32_MAX) { cli_fail(k_cmd, CLI_ERR, "dump header too large"); goto done; }
    f = fopen(outp, "wb");
    if (!f) { cli_fail(k_cmd, CLI_ERR, "cannot create %s: %s", outp, strerror(errno)); goto done; }
    const uint64_t fp = engine_model_fingerprint(eng);
    const int32_t counts[4] = { n_vocab, (int32_t)tok.n, (int32_t)n_prompt, (int32_t)n_eval };
    int bad = put(f, EVAL_DUMP_MAGIC, 8) || put_u32(f, EVAL_DUMP_VERSION) || put_u32(f, (uint32_t)header) ||
              put(f, &fp, 8) || put(f, counts, sizeof counts) || put_u32(f, (uint32_t)strlen(routing)) ||
              put_u32(f, (uint32_t)strlen(desc)) || put_u32(f, (uint32_t)vocab_bytes) ||
              put(f, routing, strlen(routing)) || put(f, desc, strlen(desc)) || put(f, tok.v, 4 * tok.n);
    for (size_t i = 0; i < n_eval && !bad; i++) bad = put_u32(f, (uint32_t)(n_prompt + i));
    for (int32_t id = 0; id < n_vocab && !bad; id++) {
        int pl = engine_token_piece(eng, id, 1, small, sizeof small);
        char *big = NULL;
        if (pl > (int)sizeof small) {
            if (!(big = malloc((size_t)pl))) { bad = 1; break; }
            engine_token_piece(eng, id, 1, big, (size_t)pl);
        }
        bad = put_u32(f, (uint32_t)pl) || put(f, big ? big : small, (size_t)pl);
        free(big);
    }
    if (!bad) bad = put(f, logits, sizeof *logits * n_eval * (size_t)n_vocab);
    if (fclose(f) != 0) bad = 1;
    f = NULL;
    if (bad) { unlink(outp); cli_fail(k_cmd, CLI_ERR, "cannot write %s", outp); goto done; }
    printf("tfdump: wrote %s: %zu prompt tokens + %zu targets, n_vocab %d, %llu bytes; model %016" PRIx64
           ", routing %s; target PPL %.4f\n",
           outp, n_prompt, n_eval, n_vocab, (unsigned long long)(header + sizeof *logits * n_eval * (size_t)n_vocab), fp,
           routing, exp(nll / (double)n_eval));
    rc = fflush(stdout) == 0 ? CLI_OK : cli_fail(k_cmd, CLI_ERR, "cannot write the output");
done:
    if (f) { fclose(f); unlink(outp); }
    free(logits);
    free(tok.v);
    free(text);
    tokenizer_close(tk);
    gguf_close(g);
    session_free(s);
    engine_close(eng);
    return rc;
}

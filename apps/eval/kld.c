/* kld: `strata kld REF CAND [--json FILE] [--html FILE] [--top N]`, two teacher-forced
 * dumps of the same corpus (strata tfdump) compared position by position.
 *
 * Per evaluation position i, with float64 log-softmax over the full
 * vocabulary, lr = log softmax(ref logits), lc = log softmax(cand logits):
 *   KL_i  = sum_v exp(lr_v) * (lr_v - lc_v)      (KL(ref||cand), nats; terms
 *           with exp(lr_v) == 0 in float64 contribute 0)
 *   NLL_i = -l_target for each side; PPL = exp(mean NLL) over the targets
 *   flip  = argmax(ref) != argmax(cand)            (lowest id wins ties)
 * Summary: mean, median, p90, p99 (linear interpolation between the order
 * statistics at fraction*(n-1)) and max KL; top-1 agreement n of N; the
 * share of the total KL carried by the 4 and the 8 largest positions.
 *
 * KL(ref||cand) measures how far the candidate's distribution moved from
 * the reference's, not correctness: the corpus target is not the reference
 * distribution (a candidate can have a lower target PPL and a higher KL),
 * and a flip is a disagreement with the reference, not an error. The
 * output says so.
 *
 * The dumps must agree on the vocabulary (size and every piece), the token
 * ids (prompt and targets) and the positions; the first mismatch is named.
 * Model fingerprints and routing configurations may differ (that is what
 * is being compared); they are reported. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "eval.h"
#include "report_html.h"

static const char *k_cmd = "kld";

static const char k_note[] =
    "KL(ref||cand) measures how far the candidate's next-token distribution moved from the reference's, "
    "not correctness: the corpus target is not the reference distribution, and a flip is a disagreement "
    "with the reference, not an error.";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata kld REF CAND [--json FILE] [--html FILE] [--top N]\n"
            "\n"
            "Compare two teacher-forced dumps of one corpus (strata tfdump): target PPL of both,\n"
            "KL(ref||cand) over the full vocabulary per position (mean, median, p90, p99, max),\n"
            "top-1 agreement, and a per-position table.\n"
            "\n"
            "  --json FILE    also write the figures and every position as JSON\n"
            "  --html FILE    also write a self-contained HTML page: KL per position, flips marked\n"
            "  --top N        the table lists the N positions of largest KL (default: all, in order)\n"
            "  -h, --help     this help\n");
}

/* ==== Reading a dump ==== */

typedef struct dump {
    const char *path;
    unsigned char *buf;         /* the whole file (owned) */
    size_t size;
    uint64_t fp;
    int32_t n_vocab, n_tokens, n_prompt, n_eval;
    const char *routing, *desc;
    uint32_t routing_n, desc_n;
    const unsigned char *tokens, *positions, *vocab;
    uint32_t vocab_bytes;
    const unsigned char *logits;
    uint32_t *piece_off;        /* n_vocab + 1 offsets into vocab (owned) */
} dump;

static uint32_t rd_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int32_t rd_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }
static float rd_f32(const unsigned char *p) { float v; memcpy(&v, p, 4); return v; }

static void dump_free(dump *d)
{
    free(d->buf);
    free(d->piece_off);
}

/* Read and check a dump: every length against the file size (a truncated
 * file is named as such), positions inside the tokens, ids inside the
 * vocabulary, logits finite. */
static int dump_load(const char *path, dump *d)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    FILE *f = fopen(path, "rb");
    if (!f) return cli_fail(k_cmd, CLI_ERR, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fclose(f); return cli_fail(k_cmd, CLI_ERR, "cannot stat %s", path); }
    d->size = (size_t)st.st_size;
    d->buf = malloc(d->size ? d->size : 1);
    if (!d->buf) { fclose(f); return cli_fail(k_cmd, CLI_ERR, "out of memory reading %s", path); }
    const size_t got = fread(d->buf, 1, d->size, f);
    fclose(f);
    if (got != d->size) return cli_fail(k_cmd, CLI_ERR, "cannot read %s", path);
    const unsigned char *b = d->buf;
    if (d->size < 8 || memcmp(b, EVAL_DUMP_MAGIC, 8) != 0)
        return cli_fail(k_cmd, CLI_ERR, "%s is not a strata tfdump file (no %s magic)", path, EVAL_DUMP_MAGIC);
    if (d->size < EVAL_DUMP_FIXED)
        return cli_fail(k_cmd, CLI_ERR, "%s is truncated: %zu bytes, shorter than the %u-byte header", path, d->size,
                        EVAL_DUMP_FIXED);
    const uint32_t version = rd_u32(b + 8), header = rd_u32(b + 12);
    if (version != EVAL_DUMP_VERSION)
        return cli_fail(k_cmd, CLI_ERR, "%s: dump version %u, this strata reads version %u", path, version, EVAL_DUMP_VERSION);
    memcpy(&d->fp, b + 16, 8);
    d->n_vocab = rd_i32(b + 24);
    d->n_tokens = rd_i32(b + 28);
    d->n_prompt = rd_i32(b + 32);
    d->n_eval = rd_i32(b + 36);
    d->routing_n = rd_u32(b + 40);
    d->desc_n = rd_u32(b + 44);
    d->vocab_bytes = rd_u32(b + 48);
    if (d->n_vocab < 1 || d->n_tokens < 2 || d->n_prompt < 1 || d->n_eval < 1 || d->n_tokens > (1 << 24) ||
        d->n_vocab > (1 << 24) || d->n_eval > d->n_tokens || d->n_prompt > d->n_tokens)
        return cli_fail(k_cmd, CLI_ERR, "%s: bad header (n_vocab %d, n_tokens %d, n_prompt %d, n_eval %d)", path,
                        d->n_vocab, d->n_tokens, d->n_prompt, d->n_eval);
    const uint64_t want_header = (uint64_t)EVAL_DUMP_FIXED + d->routing_n + d->desc_n + 4ull * (uint64_t)d->n_tokens +
                                 4ull * (uint64_t)d->n_eval + d->vocab_bytes;
    if (want_header != header)
        return cli_fail(k_cmd, CLI_ERR, "%s: header_bytes %u, but its lengths add up to %llu", path, header,
                        (unsigned long long)want_header);
    const uint64_t want = want_header + 4ull * (uint64_t)d->n_eval * (uint64_t)d->n_vocab;
    if ((uint64_t)d->size < want)
        return cli_fail(k_cmd, CLI_ERR, "%s is truncated: %zu bytes, its header describes %llu", path, d->size,
                        (unsigned long long)want);
    if ((uint64_t)d->size > want)
        return cli_fail(k_cmd, CLI_ERR, "%s has %llu bytes after its logits (its header describes %llu)", path,
                        (unsigned long long)((uint64_t)d->size - want), (unsigned long long)want);
    const unsigned char *p = b + EVAL_DUMP_FIXED;
    d->routing = (const char *)p;
    p += d->routing_n;
    d->desc = (const char *)p;
    p += d->desc_n;
    d->tokens = p;
    p += 4 * (size_t)d->n_tokens;
    d->positions = p;
    p += 4 * (size_t)d->n_eval;
    d->vocab = p;
    d->logits = b + header;
    for (int32_t i = 0; i < d->n_tokens; i++) {
        const int32_t t = rd_i32(d->tokens + 4 * (size_t)i);
        if (t < 0 || t >= d->n_vocab)
            return cli_fail(k_cmd, CLI_ERR, "%s: token %d is %d, outside the vocabulary (%d)", path, i, t, d->n_vocab);
    }
    for (int32_t i = 0; i < d->n_eval; i++) {
        const int32_t q = rd_i32(d->positions + 4 * (size_t)i);
        if (q < 1 || q >= d->n_tokens)
            return cli_fail(k_cmd, CLI_ERR, "%s: evaluation position %d is %d, outside 1..%d", path, i, q, d->n_tokens - 1);
    }
    d->piece_off = malloc(sizeof *d->piece_off * ((size_t)d->n_vocab + 1));
    if (!d->piece_off) return cli_fail(k_cmd, CLI_ERR, "out of memory reading %s", path);
    uint64_t off = 0;
    for (int32_t id = 0; id < d->n_vocab; id++) {
        if (off + 4 > d->vocab_bytes) return cli_fail(k_cmd, CLI_ERR, "%s: the vocabulary section ends at id %d", path, id);
        const uint32_t n = rd_u32(d->vocab + off);
        if (off + 4 + n > d->vocab_bytes) return cli_fail(k_cmd, CLI_ERR, "%s: the vocabulary section ends at id %d", path, id);
        d->piece_off[id] = (uint32_t)(off + 4);
        off += 4 + (uint64_t)n;
    }
    if (off != d->vocab_bytes)
        return cli_fail(k_cmd, CLI_ERR, "%s: %llu bytes after the vocabulary's last piece", path,
                        (unsigned long long)(d->vocab_bytes - off));
    d->piece_off[d->n_vocab] = (uint32_t)(off + 4);   /* so that piece length = off[i+1] - off[i] - 4 */
    for (size_t i = 0; i < (size_t)d->n_eval * (size_t)d->n_vocab; i++)
        if (!isfinite(rd_f32(d->logits + 4 * i)))
            return cli_fail(k_cmd, CLI_ERR, "%s: non-finite logit at evaluation position %zu, id %zu", path,
                            i / (size_t)d->n_vocab, i % (size_t)d->n_vocab);
    return 0;
}

static const char *piece(const dump *d, int32_t id, size_t *n)
{
    *n = d->piece_off[id + 1] - d->piece_off[id] - 4;
    return (const char *)d->vocab + d->piece_off[id];
}

static int32_t token_at(const dump *d, int32_t i) { return rd_i32(d->tokens + 4 * (size_t)i); }
static int32_t position_at(const dump *d, int32_t i) { return rd_i32(d->positions + 4 * (size_t)i); }

/* Name the first difference that makes two dumps incomparable. */
static int check_same_corpus(const dump *r, const dump *c)
{
    if (r->n_vocab != c->n_vocab)
        return cli_fail(k_cmd, CLI_ERR, "vocabularies differ: %s has %d tokens, %s %d", r->path, r->n_vocab, c->path,
                        c->n_vocab);
    for (int32_t id = 0; id < r->n_vocab; id++) {
        size_t na, nb;
        const char *a = piece(r, id, &na), *b = piece(c, id, &nb);
        if (na != nb || memcmp(a, b, na) != 0) {
            char ea[64], eb[64];
            eval_escape(a, na, ea, sizeof ea);
            eval_escape(b, nb, eb, sizeof eb);
            return cli_fail(k_cmd, CLI_ERR, "vocabularies differ at id %d: '%s' in %s, '%s' in %s", id, ea, r->path, eb,
                            c->path);
        }
    }
    if (r->n_tokens != c->n_tokens || r->n_prompt != c->n_prompt)
        return cli_fail(k_cmd, CLI_ERR, "token ids differ: %s has %d prompt + %d tokens, %s %d + %d", r->path, r->n_prompt,
                        r->n_tokens - r->n_prompt, c->path, c->n_prompt, c->n_tokens - c->n_prompt);
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (token_at(r, i) != token_at(c, i))
            return cli_fail(k_cmd, CLI_ERR, "token ids differ at index %d: %d in %s, %d in %s", i, token_at(r, i), r->path,
                            token_at(c, i), c->path);
    if (r->n_eval != c->n_eval)
        return cli_fail(k_cmd, CLI_ERR, "positions differ: %s has %d evaluation positions, %s %d", r->path, r->n_eval,
                        c->path, c->n_eval);
    for (int32_t i = 0; i < r->n_eval; i++)
        if (position_at(r, i) != position_at(c, i))
            return cli_fail(k_cmd, CLI_ERR, "positions differ at evaluation %d: %d in %s, %d in %s", i, position_at(r, i),
                            r->path, position_at(c, i), c->path);
    return 0;
}

/* ==== Figures ==== */

typedef struct pos_stat {
    int32_t i, pos, target, ref_top, cand_top;
    double kl, nll_ref, nll_cand;
} pos_stat;

/* log-softmax of one row in float64 into out; returns the argmax (first) */
static int32_t log_softmax(const unsigned char *row, int32_t n, double *out)
{
    double m = rd_f32(row);
    int32_t am = 0;
    for (int32_t v = 0; v < n; v++) {
        out[v] = rd_f32(row + 4 * (size_t)v);
        if (out[v] > m) { m = out[v]; am = v; }
    }
    double s = 0;
    for (int32_t v = 0; v < n; v++) s += exp(out[v] - m);
    const double lse = m + log(s);
    for (int32_t v = 0; v < n; v++) out[v] -= lse;
    return am;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_kl_desc(const void *a, const void *b)
{
    const pos_stat *x = a, *y = b;
    if (x->kl != y->kl) return x->kl < y->kl ? 1 : -1;
    return x->i - y->i;
}

/* order statistic at fraction*(n-1), interpolated; sorted ascending */
static double quantile(const double *v, size_t n, double fraction)
{
    const double p = fraction * (double)(n - 1);
    const size_t ip = (size_t)p;
    if (ip + 1 >= n) return v[n - 1];
    return v[ip] + (p - (double)ip) * (v[ip + 1] - v[ip]);
}

typedef struct summary {
    double ppl_ref, ppl_cand, mean, median, p90, p99, max, total, share4, share8;
    int32_t max_i, agree, n;
} summary;

static void cell(const dump *d, int32_t id, char *out, size_t cap)
{
    size_t n;
    const char *p = piece(d, id, &n);
    char tmp[96];
    eval_escape(p, n, tmp, sizeof tmp);
    snprintf(out, cap, "'%s'", tmp);
}

static void print_text(const dump *r, const dump *c, const pos_stat *ps, const summary *s, long long top)
{
    printf("strata kld: REF %s vs CAND %s\n", r->path, c->path);
    printf("  ref : model %016" PRIx64 ", routing %.*s (%.*s)\n", r->fp, (int)r->routing_n, r->routing, (int)r->desc_n, r->desc);
    printf("  cand: model %016" PRIx64 ", routing %.*s (%.*s)\n", c->fp, (int)c->routing_n, c->routing, (int)c->desc_n, c->desc);
    printf("  corpus: %d prompt tokens + %d evaluation positions, vocabulary %d\n", r->n_prompt, s->n, r->n_vocab);
    if (r->fp == c->fp && r->routing_n == c->routing_n && !memcmp(r->routing, c->routing, r->routing_n))
        printf("  (same model file and routing configuration)\n");
    printf("\n");
    printf("PPL on the corpus targets: ref %.4f, cand %.4f\n", s->ppl_ref, s->ppl_cand);
    printf("KL(ref||cand), nats, full vocabulary, float64 log-softmax, %d positions:\n", s->n);
    printf("  mean %.6f  median %.6f  p90 %.6f  p99 %.6f  max %.6f (position %d)\n", s->mean, s->median, s->p90, s->p99,
           s->max, ps[s->max_i].pos);
    printf("top-1 agreement: %d/%d (%d flips)\n", s->agree, s->n, s->n - s->agree);
    if (s->total > 0)
        printf("share of total KL: top 4 positions %.2f%%, top 8 positions %.2f%%\n", 100.0 * s->share4, 100.0 * s->share8);
    else
        printf("share of total KL: n/a (total KL is 0)\n");
    printf("\n");

    const pos_stat *rows = ps;
    pos_stat *sorted = NULL;
    int32_t n_rows = s->n;
    if (top > 0) {
        sorted = malloc(sizeof *sorted * (size_t)s->n);
        if (sorted) {
            memcpy(sorted, ps, sizeof *sorted * (size_t)s->n);
            qsort(sorted, (size_t)s->n, sizeof *sorted, cmp_kl_desc);
            rows = sorted;
            if (top < n_rows) n_rows = (int32_t)top;
            printf("the %d positions of largest KL:\n", n_rows);
        }
    }
    printf("%5s %6s  %-16s %-16s %-16s %10s  %s\n", "i", "pos", "target", "ref argmax", "cand argmax", "KL", "flip");
    for (int32_t k = 0; k < n_rows; k++) {
        const pos_stat *p = &rows[k];
        char t[112], a[112], b[112];
        cell(r, p->target, t, sizeof t);
        cell(r, p->ref_top, a, sizeof a);
        cell(r, p->cand_top, b, sizeof b);
        printf("%5d %6d  %-16s %-16s %-16s %10.6f%s\n", p->i, p->pos, t, a, b, p->kl, p->ref_top != p->cand_top ? "  FLIP" : "");
    }
    free(sorted);
    printf("\nnote: %s\n", k_note);
}

static int write_json(const char *path, const dump *r, const dump *c, const pos_stat *ps, const summary *s)
{
    FILE *f = fopen(path, "w");
    if (!f) return cli_fail(k_cmd, CLI_ERR, "cannot create %s: %s", path, strerror(errno));
    fprintf(f, "{\n  \"strata_kld\": 1,\n  \"ref\": {\"path\": ");
    eval_json_bytes(f, r->path, strlen(r->path));
    fprintf(f, ", \"model_fingerprint\": \"%016" PRIx64 "\", \"routing\": ", r->fp);
    eval_json_bytes(f, r->routing, r->routing_n);
    fprintf(f, ", \"model\": ");
    eval_json_bytes(f, r->desc, r->desc_n);
    fprintf(f, "},\n  \"cand\": {\"path\": ");
    eval_json_bytes(f, c->path, strlen(c->path));
    fprintf(f, ", \"model_fingerprint\": \"%016" PRIx64 "\", \"routing\": ", c->fp);
    eval_json_bytes(f, c->routing, c->routing_n);
    fprintf(f, ", \"model\": ");
    eval_json_bytes(f, c->desc, c->desc_n);
    fprintf(f, "},\n  \"n_vocab\": %d, \"n_prompt\": %d, \"n_eval\": %d,\n", r->n_vocab, r->n_prompt, s->n);
    fprintf(f, "  \"ppl_ref\": %.17g, \"ppl_cand\": %.17g,\n", s->ppl_ref, s->ppl_cand);
    fprintf(f, "  \"kl\": {\"mean\": %.17g, \"median\": %.17g, \"p90\": %.17g, \"p99\": %.17g, \"max\": %.17g, "
               "\"max_position\": %d, \"total\": %.17g},\n",
            s->mean, s->median, s->p90, s->p99, s->max, ps[s->max_i].pos, s->total);
    fprintf(f, "  \"top1_agree\": %d, \"top1_n\": %d,\n", s->agree, s->n);
    if (s->total > 0) fprintf(f, "  \"top4_share\": %.17g, \"top8_share\": %.17g,\n", s->share4, s->share8);
    else fprintf(f, "  \"top4_share\": null, \"top8_share\": null,\n");
    fprintf(f, "  \"note\": ");
    eval_json_bytes(f, k_note, strlen(k_note));
    fprintf(f, ",\n  \"positions\": [");
    for (int32_t k = 0; k < s->n; k++) {
        const pos_stat *p = &ps[k];
        size_t n;
        const char *t;
        fprintf(f, "%s\n    {\"i\": %d, \"pos\": %d, \"target_id\": %d, \"target\": ", k ? "," : "", p->i, p->pos, p->target);
        t = piece(r, p->target, &n);
        eval_json_bytes(f, t, n);
        fprintf(f, ", \"ref_argmax_id\": %d, \"ref_argmax\": ", p->ref_top);
        t = piece(r, p->ref_top, &n);
        eval_json_bytes(f, t, n);
        fprintf(f, ", \"cand_argmax_id\": %d, \"cand_argmax\": ", p->cand_top);
        t = piece(r, p->cand_top, &n);
        eval_json_bytes(f, t, n);
        fprintf(f, ", \"kl\": %.17g, \"nll_ref\": %.17g, \"nll_cand\": %.17g, \"flip\": %s}", p->kl, p->nll_ref, p->nll_cand,
                p->ref_top != p->cand_top ? "true" : "false");
    }
    fprintf(f, "\n  ]\n}\n");
    if (fclose(f) != 0) return cli_fail(k_cmd, CLI_ERR, "cannot write %s", path);
    return 0;
}

/* KL per position as a chart, flips in the alert colour, the mean as a
 * dashed line; then the summary and the caveat. */
static int write_html(const char *path, const dump *r, const dump *c, const pos_stat *ps, const summary *s)
{
    FILE *f = fopen(path, "w");
    if (!f) return cli_fail(k_cmd, CLI_ERR, "cannot create %s: %s", path, strerror(errno));
    double *y = malloc(sizeof *y * (size_t)s->n);
    int *flag = malloc(sizeof *flag * (size_t)s->n);
    char **names = malloc(sizeof *names * (size_t)s->n);
    char *name_buf = malloc(12 * (size_t)s->n);
    if (!y || !flag || !names || !name_buf) {
        free(y); free(flag); free(names); free(name_buf);
        fclose(f);
        return cli_fail(k_cmd, CLI_ERR, "out of memory");
    }
    for (int32_t k = 0; k < s->n; k++) {
        y[k] = ps[k].kl;
        flag[k] = ps[k].ref_top != ps[k].cand_top;
        names[k] = name_buf + 12 * (size_t)k;
        snprintf(names[k], 12, "%d", ps[k].pos);
    }
    char title[512], para[1024];
    snprintf(title, sizeof title, "strata kld: %s vs %s", r->path, c->path);
    report_html_begin(f, title);
    snprintf(para, sizeof para,
             "ref model %016" PRIx64 ", routing %.*s; cand model %016" PRIx64 ", routing %.*s. "
             "%d prompt tokens + %d evaluation positions. Target PPL: ref %.4f, cand %.4f. "
             "KL(ref||cand) mean %.6f, median %.6f, p90 %.6f, p99 %.6f, max %.6f. Top-1 agreement %d/%d.",
             r->fp, (int)r->routing_n, r->routing, c->fp, (int)c->routing_n, c->routing, r->n_prompt, s->n,
             s->ppl_ref, s->ppl_cand, s->mean, s->median, s->p90, s->p99, s->max, s->agree, s->n);
    report_html_para(f, para);
    const report_line mean_line = { s->mean, "mean", 1 };
    const report_chart ch = {
        .title = "KL(ref||cand) per evaluation position", .x_label = "position (token index)",
        .y_label = "KL, nats", .y = y, .n = s->n, .flag = flag, .flag_label = "top-1 flip",
        .bars = 1, .lines = &mean_line, .n_lines = 1, .x_names = (const char *const *)names,
    };
    report_html_chart(f, &ch);
    report_html_para(f, k_note);
    int bad = report_html_end(f) != 0;
    if (fclose(f) != 0) bad = 1;
    free(y); free(flag); free(names); free(name_buf);
    return bad ? cli_fail(k_cmd, CLI_ERR, "cannot write %s", path) : 0;
}

int cmd_kld(int argc, char **argv)
{
    const char *paths[2] = { 0 }, *json = NULL, *html = NULL;
    int n_paths = 0;
    long long top = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--json")) { if (!(json = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--html")) { if (!(html = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--top")) {
            if (!(v = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 1, 1 << 30, &top))
                return cli_fail(k_cmd, CLI_USAGE, "--top needs a positive whole number, got '%s'", v);
        } else if (a[0] == '-' && a[1]) {
            return cli_fail(k_cmd, CLI_USAGE, "unknown option '%s' (see strata kld --help)", a);
        } else if (n_paths < 2) {
            paths[n_paths++] = a;
        } else {
            return cli_fail(k_cmd, CLI_USAGE, "unexpected argument '%s': give two dumps, REF and CAND", a);
        }
    }
    if (n_paths != 2) return cli_fail(k_cmd, CLI_USAGE, "two dumps are needed: strata kld REF CAND");

    dump r, c;
    memset(&c, 0, sizeof c);
    int rc = CLI_ERR;
    pos_stat *ps = NULL;
    double *lr = NULL, *lc = NULL, *kls = NULL;
    if (dump_load(paths[0], &r) || dump_load(paths[1], &c) || check_same_corpus(&r, &c)) goto done;
    const int32_t V = r.n_vocab, n = r.n_eval;
    ps = malloc(sizeof *ps * (size_t)n);
    lr = malloc(sizeof *lr * (size_t)V);
    lc = malloc(sizeof *lc * (size_t)V);
    kls = malloc(sizeof *kls * (size_t)n);
    if (!ps || !lr || !lc || !kls) { cli_fail(k_cmd, CLI_ERR, "out of memory"); goto done; }

    summary s;
    memset(&s, 0, sizeof s);
    s.n = n;
    double nll_r = 0, nll_c = 0;
    for (int32_t i = 0; i < n; i++) {
        pos_stat *p = &ps[i];
        p->i = i;
        p->pos = position_at(&r, i);
        p->target = token_at(&r, p->pos);
        p->ref_top = log_softmax(r.logits + 4 * (size_t)i * (size_t)V, V, lr);
        p->cand_top = log_softmax(c.logits + 4 * (size_t)i * (size_t)V, V, lc);
        double kl = 0;
        for (int32_t v = 0; v < V; v++) {
            const double pr = exp(lr[v]);
            if (pr > 0) kl += pr * (lr[v] - lc[v]);
        }
        p->kl = kl;
        p->nll_ref = -lr[p->target];
        p->nll_cand = -lc[p->target];
        nll_r += p->nll_ref;
        nll_c += p->nll_cand;
        kls[i] = kl;
        s.total += kl;
        if (i == 0 || kl > s.max) { s.max = kl; s.max_i = i; }
        s.agree += p->ref_top == p->cand_top;
    }
    s.ppl_ref = exp(nll_r / n);
    s.ppl_cand = exp(nll_c / n);
    s.mean = s.total / n;
    qsort(kls, (size_t)n, sizeof *kls, cmp_double);
    s.median = n % 2 ? kls[n / 2] : 0.5 * (kls[n / 2 - 1] + kls[n / 2]);
    s.p90 = quantile(kls, (size_t)n, 0.90);
    s.p99 = quantile(kls, (size_t)n, 0.99);
    double top4 = 0, top8 = 0;
    for (int32_t k = 0; k < n && k < 8; k++) {
        const double v = kls[n - 1 - k];
        if (k < 4) top4 += v;
        top8 += v;
    }
    if (s.total > 0) { s.share4 = top4 / s.total; s.share8 = top8 / s.total; }

    print_text(&r, &c, ps, &s, top);
    if (json && write_json(json, &r, &c, ps, &s)) goto done;
    if (html && write_html(html, &r, &c, ps, &s)) goto done;
    rc = fflush(stdout) == 0 ? CLI_OK : cli_fail(k_cmd, CLI_ERR, "cannot write the output");
done:
    free(kls);
    free(lc);
    free(lr);
    free(ps);
    dump_free(&r);
    dump_free(&c);
    return rc;
}

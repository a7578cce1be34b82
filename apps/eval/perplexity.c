/* perplexity: `strata perplexity`, llama-perplexity's perplexity and
 * KL-divergence modes (tools/perplexity/perplexity.cpp: perplexity() and
 * kl_divergence()), carried over fact by fact so that the figures, the
 * printed layout and the base file are llama.cpp's:
 *
 *   strata perplexity -m MODEL -f TEXT [-c N] [--chunks N] [--kl-divergence-base FILE]
 *   strata perplexity -m MODEL --kl-divergence-base FILE --kl-divergence [-c N] [--chunks N]
 *
 * Chunking. TEXT is tokenized with the model's BOS and parse_special off
 * (llama.cpp sets escape off too: the file is taken byte for byte), then
 * cut into n_chunk = floor(n_tokens / n_ctx) windows (at least two are
 * needed). Each window starts from an empty KV cache; when the model adds
 * BOS the window's first token is replaced by BOS for the evaluation only.
 * The positions first = n_ctx/2 .. n_ctx-2 are scored, each predicting the
 * next token: n_ctx - 1 - n_ctx/2 per window. Rows before `first` are
 * evaluated without logits, and the last token is not evaluated at all:
 * nothing reads its row (the model is causal, and strata's logits do not
 * depend on how the rows are split into calls).
 *
 * Base file (--kl-divergence-base FILE without --kl-divergence): "_logits_",
 * int32 n_ctx, int32 n_vocab, int32 n_chunk, int32 tokens[n_ctx*n_chunk]
 * (the original tokens, not the BOS replacements), then per scored position
 * nv = 2*ceil(n_vocab/2) + 4 uint16: float scale, float min_log_prob in the
 * first 8 bytes, n_vocab quantized log-probs, a zero pad when n_vocab is
 * odd. Encoding as llama.cpp's log_softmax (see encode_record).
 *
 * Arithmetic. Where llama.cpp computes in float we compute in float, and
 * where in double in double, term by term, so printed figures agree to the
 * last digit; llama.cpp sums across worker threads in a varying order,
 * we sum in position order (differences far below the printed precision).
 *
 * Output: the running "[1]p,[2]p,..." line and "Final estimate: PPL = p +/- u"
 * on stdout (llama.cpp sends the latter to its log on stderr; here stdout
 * carries every result); the load summary and progress on stderr. The KLD
 * mode prints llama.cpp's chunk table and, with at least 100 scored tokens,
 * its three statistics blocks, all on stdout. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "eval.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

static const char *k_cmd = "perplexity";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata perplexity -m MODEL -f TEXT [-c N] [--chunks N] [--kl-divergence-base FILE]\n"
            "       strata perplexity -m MODEL --kl-divergence-base FILE --kl-divergence [-c N]\n"
            "\n"
            "llama-perplexity: perplexity over n_ctx-token chunks of TEXT (the second half of each\n"
            "chunk is scored), and llama.cpp's KL-divergence against a base file. Base files are\n"
            "interchangeable with llama-perplexity's.\n"
            "\n"
            "  -m, --model FILE          GGUF model\n"
            "  -f, --file TEXT           text to score (read byte for byte; not needed with --kl-divergence)\n"
            "  -c, --ctx-size N          chunk length (default 512; with --kl-divergence the base file's)\n"
            "  --chunks N                score at most N chunks (default: all)\n"
            "  --kl-divergence-base FILE without --kl-divergence: write the base file (llama.cpp's\n"
            "                            format) while computing the perplexity\n"
            "  --kl-divergence           score the model against FILE: PPL(Q), PPL(base), KLD, Δp, top p\n"
            "  -h, --help                this help\n");
    eval_engine_flags_help(out);
}

/* ==== llama.cpp's per-token arithmetic ==== */

/* Largest logit, the first one on ties (std::max from logits[0]). */
static float max_of(const float *l, int n)
{
    float m = l[0];
    for (int i = 1; i < n; i++) m = l[i] > m ? l[i] : m;
    return m;
}

/* sum of expf(l_i - max) in double, in index order */
static double sum_exp(const float *l, int n, float m)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) s += expf(l[i] - m);
    return s;
}

/* -log p(tok), perplexity() without a base file: the log-softmax of the
 * token in double (log_softmax's results.log_softmax). */
static double nll_plain(const float *l, int n, int tok)
{
    const float m = max_of(l, n);
    const double s = sum_exp(l, n, m);
    return -((double)(l[tok] - m) - log(s));
}

/* llama.cpp's nearest_int: round half to even through the float mantissa
 * (exact for |x| < 2^22; here 0 <= x <= 65535.x). */
static int nearest_int(float x)
{
    float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* One base-file record for a row of logits: rec[0..1] the floats scale and
 * min_log_prob, rec[2..] n_vocab uint16 with log p_i ~ scale*q_i +
 * min_log_prob: m = max logit, lo = max(min logit, m - 16), scale =
 * (m - lo)/65535, min_log_prob = lo - m - log(sum exp(l - m)), q_i =
 * round((l_i - lo)/scale), 0 when l_i <= lo (or all logits equal). The pad
 * slot (odd n_vocab) is left as the caller zeroed it. Returns -log p(tok)
 * as llama.cpp does on this path: in float. */
static double encode_record(const float *l, int n, int tok, uint16_t *rec)
{
    float mx = l[0], mn = l[0];
    for (int i = 1; i < n; i++) {
        mx = l[i] > mx ? l[i] : mx;
        mn = l[i] < mn ? l[i] : mn;
    }
    mn = mn > mx - 16 ? mn : mx - 16;
    const double s = sum_exp(l, n, mx);
    const float log_sum_exp = (float)log(s);
    const float min_log_prob = mn - mx - log_sum_exp;
    const float scale = (mx - mn) / 65535.f;
    memcpy(rec, &scale, 4);
    memcpy(rec + 2, &min_log_prob, 4);
    uint16_t *q = rec + 4;
    if (scale != 0.f) {
        const float inv_scale = 1 / scale;
        for (int i = 0; i < n; i++) q[i] = (uint16_t)(l[i] > mn ? nearest_int(inv_scale * (l[i] - mn)) : 0);
    } else {
        memset(q, 0, (size_t)n * sizeof *q);
    }
    const float nll = mx + log_sum_exp - l[tok];
    return nll;
}

/* kl_divergence_result: running sums over every scored token so far. */
typedef struct kld_sums {
    double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
    size_t n_same_top, count;
} kld_sums;

/* One scored token against its base record (llama.cpp's log_softmax with a
 * kl_divergence_result): accumulates into *k; *kld_out = KL(base||Q) over
 * the ids whose base log-prob exceeds -16, *p_diff_out = p_Q(tok) -
 * p_base(tok). Same top: argmax of Q (first max) == argmax of the decoded
 * base log-probs (first max). */
static void kld_token(const float *l, int n, const uint16_t *rec, int tok, kld_sums *k,
                      float *kld_out, float *p_diff_out)
{
    float max_logit = l[0];
    int imax = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > max_logit) { max_logit = l[i]; imax = i; }
    const double s = sum_exp(l, n, max_logit);
    const float log_sum_exp = (float)log(s);
    float scale, min_log_prob;
    memcpy(&scale, rec, 4);
    memcpy(&min_log_prob, rec + 2, 4);
    const uint16_t *q = rec + 4;

    const float nll = max_logit + log_sum_exp - l[tok];
    k->sum_nll += nll;
    k->sum_nll2 += nll * nll;
    const float nll_base = -(scale * q[tok] + min_log_prob);
    k->sum_nll_base += nll_base;
    k->sum_nll_base2 += nll_base * nll_base;
    k->sum_nll_nll_base += nll * nll_base;

    max_logit += log_sum_exp;
    double sum = 0;
    int imax_base = -1;
    float p_log_base_max = 0;
    for (int i = 0; i < n; i++) {
        const float p_log_base = scale * q[i] + min_log_prob;
        if (i == 0 || p_log_base > p_log_base_max) { p_log_base_max = p_log_base; imax_base = i; }
        if (p_log_base > -16.f) {
            const float p_base = expf(p_log_base);
            sum += p_base * (p_log_base - l[i] + max_logit);
        }
    }
    k->sum_kld += sum;
    k->sum_kld2 += sum * sum;
    k->count++;
    if (imax == imax_base) k->n_same_top++;

    const float p_base = expf(-nll_base);
    const float p = expf(-nll);
    const float p_diff = p - p_base;
    k->sum_p_diff += p_diff;
    const double p_diff2 = p_diff * p_diff;
    k->sum_p_diff2 += p_diff2;
    k->sum_p_diff4 += p_diff2 * p_diff2;
    *kld_out = (float)sum;
    *p_diff_out = p_diff;
}

/* ==== llama.cpp's statistics ==== */

typedef struct mu { double val, unc; } mu;

/* mean, and its standard error sqrt((<x^2> - <x>^2)/(n-1)); 0 when n <= 10 */
static mu mean_unc(double sum, double sum2, size_t count)
{
    if (count < 1) return (mu){ 0, 0 };
    const double f = sum / (double)count;
    double df = sum2 / (double)count - f * f;
    df = df > 0 && count > 10 ? sqrt(df / (double)(count - 1)) : 0.;
    return (mu){ f, df };
}

static double covariance(double suma, double sumb, double sumab, size_t count)
{
    if (count < 10) return 0.0;
    double var = sumab / (double)count - (suma / (double)count) * (sumb / (double)count);
    var /= (double)(count - 1);
    return var;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation on sorted values, in float as llama.cpp does. */
static float percentile(const float *v, size_t n, float fraction)
{
    if (fraction <= 0) return v[0];
    if (fraction >= 1) return v[n - 1];
    float p = fraction * (float)(n - 1);
    const size_t ip = (size_t)p;
    p -= (float)ip;
    return (1 - p) * v[ip] + p * v[ip + 1 < n - 1 ? ip + 1 : n - 1];
}

static float median_of(const float *v, size_t n)
{
    return n % 2 == 0 ? 0.5f * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

/* One line of the chunk table (cumulative figures). */
static void print_chunk_row(int chunk, const kld_sums *k)
{
    printf("%4d", chunk);
    const mu log_ppl = mean_unc(k->sum_nll, k->sum_nll2, k->count);
    const double ppl_val = exp(log_ppl.val);
    printf("    %9.4lf ± %9.4lf", ppl_val, ppl_val * log_ppl.unc);
    const mu log_ppl_base = mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count);
    const double cov = covariance(k->sum_nll, k->sum_nll_base, k->sum_nll_nll_base, k->count);
    const double ratio_val = log_ppl.val - log_ppl_base.val;
    const double ratio_unc = sqrt(log_ppl.unc * log_ppl.unc + log_ppl_base.unc * log_ppl_base.unc - 2.0 * cov);
    printf("    %10.5lf ± %10.5lf", ratio_val, ratio_unc);
    const mu kl = mean_unc(k->sum_kld, k->sum_kld2, k->count);
    printf("    %10.5lf ± %10.5lf", kl.val, kl.unc);
    const mu mse = mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count);
    const double rms = sqrt(mse.val);
    printf("    %6.3lf ± %6.3lf %%", 100.0 * rms, 100.0 * (0.5 / rms * mse.unc));
    const double top = 1. * (double)k->n_same_top / (double)k->count;
    printf("    %6.3lf ± %6.3lf %%", 100.0 * top, 100.0 * sqrt(top * (1 - top) / (double)(k->count - 1)));
    printf("\n");
}

/* The closing blocks; kld and p_diff are sorted in place. */
static void print_kld_summary(const kld_sums *k, float *kld, float *p_diff, size_t n)
{
    qsort(kld, n, sizeof *kld, cmp_float);
    qsort(p_diff, n, sizeof *p_diff, cmp_float);

    printf("====== Perplexity statistics ======\n");
    const mu log_ppl = mean_unc(k->sum_nll, k->sum_nll2, k->count);
    const double ppl_val = exp(log_ppl.val), ppl_unc = ppl_val * log_ppl.unc;
    printf("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", ppl_val, ppl_unc);
    const mu log_ppl_base = mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count);
    const double ppl_base_val = exp(log_ppl_base.val), ppl_base_unc = ppl_base_val * log_ppl_base.unc;
    printf("Mean PPL(base)                : %10.6lf ± %10.6lf\n", ppl_base_val, ppl_base_unc);
    const double cov = covariance(k->sum_nll, k->sum_nll_base, k->sum_nll_nll_base, k->count);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100.0 * cov / (log_ppl.unc * log_ppl_base.unc));
    const double ratio_val = log_ppl.val - log_ppl_base.val;
    const double ratio_unc = sqrt(log_ppl.unc * log_ppl.unc + log_ppl_base.unc * log_ppl_base.unc - 2.0 * cov);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", ratio_val, ratio_unc);
    const double pr_val = exp(ratio_val);
    printf("Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", pr_val, pr_val * ratio_unc);
    const double ppl_cov = ppl_val * ppl_base_val * cov;
    printf("Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", ppl_val - ppl_base_val,
           sqrt(ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov));
    printf("\n");

    printf("====== KL divergence statistics ======\n");
    const mu kl = mean_unc(k->sum_kld, k->sum_kld2, k->count);
    printf("Mean    KLD: %10.6lf ± %10.6lf\n", kl.val, kl.unc);
    printf("Maximum KLD: %10.6f\n", (double)kld[n - 1]);
    printf("99.9%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.999f));
    printf("99.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.990f));
    printf("95.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.950f));
    printf("90.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.900f));
    printf("Median  KLD: %10.6f\n", (double)median_of(kld, n));
    printf("10.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.100f));
    printf(" 5.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.050f));
    printf(" 1.0%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.010f));
    printf(" 0.1%%   KLD: %10.6f\n", (double)percentile(kld, n, 0.001f));
    printf("Minimum KLD: %10.6f\n", (double)kld[0]);
    printf("\n");

    printf("====== Token probability statistics ======\n");
    const mu pd = mean_unc(k->sum_p_diff, k->sum_p_diff2, k->count);
    printf("Mean    Δp: %6.3lf ± %5.3lf %%\n", 100.0 * pd.val, 100.0 * pd.unc);
    printf("Maximum Δp: %6.3lf%%\n", 100.0 * p_diff[n - 1]);
    printf("99.9%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.999f));
    printf("99.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.990f));
    printf("95.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.950f));
    printf("90.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.900f));
    printf("75.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.750f));
    printf("Median  Δp: %6.3lf%%\n", 100.0 * median_of(p_diff, n));
    printf("25.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.250f));
    printf("10.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.100f));
    printf(" 5.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.050f));
    printf(" 1.0%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.010f));
    printf(" 0.1%%   Δp: %6.3lf%%\n", 100.0 * percentile(p_diff, n, 0.001f));
    printf("Minimum Δp: %6.3lf%%\n", 100.0 * p_diff[0]);
    const mu mse = mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count);
    const double rms = sqrt(mse.val);
    printf("RMS Δp    : %6.3lf ± %5.3lf %%\n", 100.0 * rms, 100.0 * (0.5 / rms * mse.unc));
    const double same = 1.0 * (double)k->n_same_top / (double)k->count;
    printf("Same top p: %6.3lf ± %5.3lf %%\n", 100.0 * same,
           100.0 * sqrt(same * (1.0 - same) / (double)(k->count - 1)));
}

/* ==== Shared setup ==== */

typedef struct ppl_args {
    engine_opts eo;
    const char *model, *text, *base;
    int n_ctx;            /* -c; 0 when not given */
    long long n_chunks;   /* --chunks; -1: all */
    int kld;              /* --kl-divergence */
} ppl_args;

enum { HELP_SHOWN = 100 };

static int parse_args(int argc, char **argv, ppl_args *a)
{
    memset(a, 0, sizeof *a);
    a->n_chunks = -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *v;
        long long n;
        int r = eval_engine_flag(k_cmd, argc, argv, &i, &a->eo);
        if (r < 0) return CLI_USAGE;
        if (r > 0) continue;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); return HELP_SHOWN; }
        else if (!strcmp(s, "--kl-divergence")) a->kld = 1;
        else if (!strcmp(s, "-m") || !strcmp(s, "--model") || !strcmp(s, "-f") || !strcmp(s, "--file") ||
                 !strcmp(s, "--kl-divergence-base")) {
            if (!(v = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            if (s[1] == 'm' || !strcmp(s, "--model")) a->model = v;
            else if (s[1] == 'f' || !strcmp(s, "--file")) a->text = v;
            else a->base = v;
        } else if (!strcmp(s, "-c") || !strcmp(s, "--ctx-size")) {
            if (!(v = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 3, 1 << 24, &n))
                return cli_fail(k_cmd, CLI_USAGE, "%s needs a whole number from 3 to %d, got '%s'", s, 1 << 24, v);
            a->n_ctx = (int)n;
        } else if (!strcmp(s, "--chunks")) {
            if (!(v = cli_value(k_cmd, argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, -1, 1 << 30, &n) || n == 0)
                return cli_fail(k_cmd, CLI_USAGE, "--chunks needs a positive whole number (or -1: all), got '%s'", v);
            a->n_chunks = n;
        } else {
            return cli_fail(k_cmd, CLI_USAGE, "unknown option '%s' (see strata perplexity --help)", s);
        }
    }
    if (!a->model) return cli_fail(k_cmd, CLI_USAGE, "a model is required (-m FILE)");
    if (a->kld && !a->base)
        return cli_fail(k_cmd, CLI_USAGE, "--kl-divergence needs --kl-divergence-base FILE (the base model's log-probabilities)");
    if (!a->kld && !a->text) return cli_fail(k_cmd, CLI_USAGE, "a text to score is required (-f FILE)");
    return 0;
}

/* The model's tokenizer alone (no weights): the checks that need only the
 * vocabulary run before a large model is loaded, so that a wrong input
 * fails fast and with one line. llama-perplexity asserts add_eos is off. */
static int open_tokenizer(const char *model, tokenizer **tk)
{
    err e;
    err_clear(&e);
    gguf_file *g = NULL;
    *tk = NULL;
    if (gguf_open(&g, model, &e) || tokenizer_open(tk, g, &e)) {
        gguf_close(g);
        return cli_fail(k_cmd, CLI_ERR, "%s", e.msg);
    }
    gguf_close(g);
    if (tokenizer_add_eos(*tk)) {
        tokenizer_close(*tk);
        *tk = NULL;
        return cli_fail(k_cmd, CLI_ERR, "the model's tokenizer appends EOS (add_eos_token); llama-perplexity refuses such models");
    }
    return 0;
}

static int open_model(const ppl_args *a, int n_ctx, engine **eng, session **s)
{
    engine_opts o = a->eo;
    o.model_path = a->model;
    o.n_ctx = n_ctx;
    o.verbose = 1;
    o.log = stderr;
    err e;
    err_clear(&e);
    if (engine_open(eng, &o, &e)) return cli_fail(k_cmd, CLI_ERR, "%s", e.msg);
    if (session_create(s, *eng, &e)) {
        engine_close(*eng);
        *eng = NULL;
        return cli_fail(k_cmd, CLI_ERR, "%s", e.msg);
    }
    if (n_ctx > engine_n_ctx_train(*eng))
        fprintf(stderr, "strata perplexity: warning: the model was trained on only %d context tokens (%d specified)\n",
                engine_n_ctx_train(*eng), n_ctx);
    return 0;
}

/* Evaluate one chunk (tokens[0..n_ctx), first token replaced by BOS when
 * the model adds one) from an empty cache; rows receives the logits of
 * positions first .. n_ctx-2 ((n_ctx - 1 - first) x n_vocab). */
static int eval_chunk(engine *eng, session *s, const int32_t *tokens, int n_ctx, int32_t *buf, float *rows)
{
    const int first = n_ctx / 2;
    memcpy(buf, tokens, sizeof *buf * (size_t)n_ctx);
    if (engine_add_bos(eng) && engine_token_bos(eng) >= 0) buf[0] = engine_token_bos(eng);
    session_truncate(s, 0);
    err e;
    err_clear(&e);
    if (session_eval(s, buf, first, NULL, NULL, &e) ||
        session_eval(s, buf + first, n_ctx - 1 - first, NULL, rows, &e))
        return cli_fail(k_cmd, CLI_ERR, "evaluation failed: %s", e.msg);
    return 0;
}

static void report_pass(const char *what, double t0, int n_chunk)
{
    const double t = now_s() - t0;
    int total = (int)(t * n_chunk);
    fprintf(stderr, "%s: %.2f seconds per pass - ETA ", what, t);
    if (total >= 60 * 60) {
        fprintf(stderr, "%d hours ", total / (60 * 60));
        total %= 60 * 60;
    }
    fprintf(stderr, "%.2f minutes\n", total / 60.0);
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* ==== Perplexity (and writing the base file) ==== */

static int run_perplexity(const ppl_args *a)
{
    const int n_ctx = a->n_ctx ? a->n_ctx : 512;
    size_t len = 0;
    char *text = cli_read_file(k_cmd, a->text, &len);
    if (!text) return CLI_ERR;
    tokenizer *tk = NULL;
    if (open_tokenizer(a->model, &tk)) { free(text); return CLI_ERR; }
    engine *eng = NULL;
    session *s = NULL;
    int rc = CLI_ERR;
    int32_t *tokens = NULL, *buf = NULL;
    float *rows = NULL;
    uint16_t *recs = NULL;
    FILE *bf = NULL;
    err e;
    err_clear(&e);
    size_t cap = len + 16, n_tok = 0;
    tokens = malloc(sizeof *tokens * cap);
    int trc = tokens ? tokenizer_encode(tk, text, len, 1, 0, tokens, cap, &n_tok, &e) : ERR_NOMEM;
    if (trc == ERR_RANGE) {   /* more tokens than bytes: byte fallback of invalid UTF-8 */
        free(tokens);
        cap = n_tok;
        tokens = malloc(sizeof *tokens * cap);
        err_clear(&e);
        trc = tokens ? tokenizer_encode(tk, text, len, 1, 0, tokens, cap, &n_tok, &e) : ERR_NOMEM;
    }
    free(text);
    tokenizer_close(tk);
    if (trc) { cli_fail(k_cmd, CLI_ERR, "tokenizing %s: %s", a->text, e.msg[0] ? e.msg : "out of memory"); goto done; }
    if (n_tok < 2 * (size_t)n_ctx) {
        cli_fail(k_cmd, CLI_ERR, "%s tokenizes to only %zu tokens; a context of %d needs at least %d", a->text, n_tok,
                 n_ctx, 2 * n_ctx);
        goto done;
    }
    if (open_model(a, n_ctx, &eng, &s)) goto done;
    const int n_chunk_max = (int)(n_tok / (size_t)n_ctx);
    const int n_chunk = a->n_chunks < 0 || a->n_chunks > n_chunk_max ? n_chunk_max : (int)a->n_chunks;
    const int32_t n_vocab = engine_n_vocab(eng);
    const int first = n_ctx / 2, n_scored = n_ctx - 1 - first;
    const size_t nv = 2 * (((size_t)n_vocab + 1) / 2) + 4;
    buf = malloc(sizeof *buf * (size_t)n_ctx);
    rows = malloc(sizeof *rows * (size_t)n_scored * (size_t)n_vocab);
    if (a->base) recs = calloc((size_t)n_scored * nv, sizeof *recs);
    if (!buf || !rows || (a->base && !recs)) { cli_fail(k_cmd, CLI_ERR, "out of memory"); goto done; }

    if (a->base) {
        bf = fopen(a->base, "wb");
        if (!bf) { cli_fail(k_cmd, CLI_ERR, "cannot create %s: %s", a->base, strerror(errno)); goto done; }
        const int32_t hdr[3] = { n_ctx, n_vocab, n_chunk };
        if (write_all(bf, "_logits_", 8) || write_all(bf, hdr, sizeof hdr) ||
            write_all(bf, tokens, sizeof *tokens * (size_t)n_chunk * (size_t)n_ctx)) {
            cli_fail(k_cmd, CLI_ERR, "cannot write %s", a->base);
            goto done;
        }
        fprintf(stderr, "perplexity: saving all logits to %s\n", a->base);
    }
    fprintf(stderr, "perplexity: tokenized %s: %zu tokens\n", a->text, n_tok);
    fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, n_seq=1\n", n_chunk,
            n_ctx, engine_n_batch(eng));

    double nll = 0, nll2 = 0;
    long count = 0;
    for (int c = 0; c < n_chunk; c++) {
        const double t0 = now_s();
        if (eval_chunk(eng, s, tokens + (size_t)c * (size_t)n_ctx, n_ctx, buf, rows)) goto done;
        if (c == 0) report_pass("perplexity", t0, n_chunk);
        const int32_t *tgt = tokens + (size_t)c * (size_t)n_ctx + first + 1;
        for (int r = 0; r < n_scored; r++) {
            const float *l = rows + (size_t)r * (size_t)n_vocab;
            const double v = a->base ? encode_record(l, n_vocab, tgt[r], recs + (size_t)r * nv)
                                     : nll_plain(l, n_vocab, tgt[r]);
            nll += v;
            nll2 += v * v;
        }
        if (a->base && write_all(bf, recs, sizeof *recs * nv * (size_t)n_scored)) {
            cli_fail(k_cmd, CLI_ERR, "cannot write %s", a->base);
            goto done;
        }
        count += n_scored;
        printf("[%d]%.4lf,", c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    if (bf) {
        const int bad = fclose(bf) != 0;
        bf = NULL;
        if (bad) { cli_fail(k_cmd, CLI_ERR, "cannot write %s", a->base); goto done; }
    }
    nll2 /= (double)count;
    nll /= (double)count;
    const double ppl = exp(nll);
    nll2 -= nll * nll;
    if (nll2 > 0) {
        nll2 = sqrt(nll2 / (double)(count - 1));
        printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, nll2 * ppl);
    } else {
        fprintf(stderr, "strata perplexity: unexpected negative standard deviation of log(prob)\n");
    }
    rc = fflush(stdout) == 0 ? CLI_OK : cli_fail(k_cmd, CLI_ERR, "cannot write the output");
done:
    if (bf) { fclose(bf); unlink(a->base); }   /* no half-written base file */
    free(recs);
    free(rows);
    free(buf);
    free(tokens);
    session_free(s);
    engine_close(eng);
    return rc;
}

/* ==== KL divergence against a base file ==== */

typedef struct base_file {
    FILE *f;
    uint32_t n_ctx;
    int32_t n_vocab, n_chunk;
} base_file;

/* Open and check a base file's header against its size: the layout fixes
 * the size exactly, so a truncated (or padded) file is refused before any
 * evaluation. */
static int base_open(const char *path, base_file *b)
{
    memset(b, 0, sizeof *b);
    b->f = fopen(path, "rb");
    if (!b->f) return cli_fail(k_cmd, CLI_ERR, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    char magic[8];
    unsigned char hdr[12];
    if (fstat(fileno(b->f), &st) != 0) return cli_fail(k_cmd, CLI_ERR, "cannot stat %s: %s", path, strerror(errno));
    if (fread(magic, 1, 8, b->f) != 8 || memcmp(magic, "_logits_", 8) != 0)
        return cli_fail(k_cmd, CLI_ERR, "%s is not a KL-divergence base file (no \"_logits_\" magic)", path);
    if (fread(hdr, 1, sizeof hdr, b->f) != sizeof hdr)
        return cli_fail(k_cmd, CLI_ERR, "%s is truncated: %lld bytes, shorter than its 20-byte header", path,
                        (long long)st.st_size);
    memcpy(&b->n_ctx, hdr, 4);
    memcpy(&b->n_vocab, hdr + 4, 4);
    memcpy(&b->n_chunk, hdr + 8, 4);
    if (b->n_ctx < 3 || b->n_ctx > (1u << 24))
        return cli_fail(k_cmd, CLI_ERR, "%s: context %u out of range (3 to %d)", path, b->n_ctx, 1 << 24);
    if (b->n_vocab < 1 || b->n_vocab > (1 << 24))
        return cli_fail(k_cmd, CLI_ERR, "%s: vocabulary size %d out of range", path, b->n_vocab);
    if (b->n_chunk < 1 || b->n_chunk > (1 << 24))
        return cli_fail(k_cmd, CLI_ERR, "%s: chunk count %d out of range", path, b->n_chunk);
    const uint64_t n_scored = b->n_ctx - 1 - b->n_ctx / 2;
    const uint64_t nv = 2 * (((uint64_t)b->n_vocab + 1) / 2) + 4;
    const uint64_t want = 20 + 4ull * b->n_ctx * (uint64_t)b->n_chunk + 2ull * nv * n_scored * (uint64_t)b->n_chunk;
    if ((uint64_t)st.st_size < want)
        return cli_fail(k_cmd, CLI_ERR, "%s is truncated: %lld bytes, but n_ctx %u, n_vocab %d and %d chunks make %llu",
                        path, (long long)st.st_size, b->n_ctx, b->n_vocab, b->n_chunk, (unsigned long long)want);
    if ((uint64_t)st.st_size > want)
        return cli_fail(k_cmd, CLI_ERR, "%s has %llu bytes after its last record (n_ctx %u, n_vocab %d, %d chunks make %llu)",
                        path, (unsigned long long)((uint64_t)st.st_size - want), b->n_ctx, b->n_vocab, b->n_chunk,
                        (unsigned long long)want);
    return 0;
}

static int run_kld(const ppl_args *a)
{
    base_file b;
    if (base_open(a->base, &b)) { if (b.f) fclose(b.f); return CLI_ERR; }
    if (a->text) fprintf(stderr, "strata perplexity: note: -f %s is not read: the tokens come from the base file\n", a->text);
    const int n_ctx = (int)b.n_ctx;
    if (a->n_ctx && a->n_ctx < n_ctx) {
        fclose(b.f);
        return cli_fail(k_cmd, CLI_ERR, "%s was computed with a context of %d, larger than -c %d: use -c %d", a->base,
                        n_ctx, a->n_ctx, n_ctx);
    }
    tokenizer *tk = NULL;
    if (open_tokenizer(a->model, &tk)) { fclose(b.f); return CLI_ERR; }
    const int32_t tk_vocab = tokenizer_n_vocab(tk);
    tokenizer_close(tk);
    if (b.n_vocab != tk_vocab) {
        fclose(b.f);
        return cli_fail(k_cmd, CLI_ERR, "%s has a vocabulary of %d tokens, the model %d: it was computed with another model",
                        a->base, b.n_vocab, tk_vocab);
    }
    engine *eng = NULL;
    session *s = NULL;
    int rc = CLI_ERR;
    const int32_t n_vocab = tk_vocab;
    const int n_chunk = a->n_chunks < 0 || a->n_chunks > b.n_chunk ? b.n_chunk : (int)a->n_chunks;
    const int first = n_ctx / 2, n_scored = n_ctx - 1 - first;
    const size_t nv = 2 * (((size_t)n_vocab + 1) / 2) + 4;
    int32_t *tokens = NULL, *buf = NULL;
    float *rows = NULL, *kld_vals = NULL, *pd_vals = NULL;
    uint16_t *recs = NULL;
    const size_t n_tok = (size_t)n_ctx * (size_t)b.n_chunk;
    tokens = malloc(sizeof *tokens * n_tok);
    buf = malloc(sizeof *buf * (size_t)n_ctx);
    rows = malloc(sizeof *rows * (size_t)n_scored * (size_t)n_vocab);
    recs = malloc(sizeof *recs * nv * (size_t)n_scored);
    kld_vals = malloc(sizeof *kld_vals * (size_t)n_scored * (size_t)n_chunk);
    pd_vals = malloc(sizeof *pd_vals * (size_t)n_scored * (size_t)n_chunk);
    if (!tokens || !buf || !rows || !recs || !kld_vals || !pd_vals) { cli_fail(k_cmd, CLI_ERR, "out of memory"); goto done; }
    if (fread(tokens, sizeof *tokens, n_tok, b.f) != n_tok) {
        cli_fail(k_cmd, CLI_ERR, "cannot read the tokens of %s", a->base);
        goto done;
    }
    for (size_t i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            cli_fail(k_cmd, CLI_ERR, "%s: token %zu is %d, outside the vocabulary (%d tokens)", a->base, i, tokens[i], n_vocab);
            goto done;
        }
    if (open_model(a, a->n_ctx ? a->n_ctx : n_ctx, &eng, &s)) goto done;
    fprintf(stderr, "kl_divergence: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=1\n", n_chunk, n_ctx,
            engine_n_batch(eng));

    kld_sums k;
    memset(&k, 0, sizeof k);
    size_t n_vals = 0;
    for (int c = 0; c < n_chunk; c++) {
        const double t0 = now_s();
        if (fread(recs, sizeof *recs * nv, (size_t)n_scored, b.f) != (size_t)n_scored) {
            cli_fail(k_cmd, CLI_ERR, "cannot read the log-probs of chunk %d of %s", c + 1, a->base);
            goto done;
        }
        for (int r = 0; r < n_scored; r++) {
            float scale, min_lp;
            memcpy(&scale, recs + (size_t)r * nv, 4);
            memcpy(&min_lp, recs + (size_t)r * nv + 2, 4);
            if (!isfinite(scale) || scale < 0 || !isfinite(min_lp)) {
                cli_fail(k_cmd, CLI_ERR, "%s: chunk %d, position %d: bad record (scale %g, min_log_prob %g)", a->base,
                         c + 1, first + r, (double)scale, (double)min_lp);
                goto done;
            }
        }
        if (eval_chunk(eng, s, tokens + (size_t)c * (size_t)n_ctx, n_ctx, buf, rows)) goto done;
        if (c == 0) {
            report_pass("kl_divergence", t0, n_chunk);
            printf("\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n");
        }
        const int32_t *tgt = tokens + (size_t)c * (size_t)n_ctx + first + 1;
        for (int r = 0; r < n_scored; r++, n_vals++)
            kld_token(rows + (size_t)r * (size_t)n_vocab, n_vocab, recs + (size_t)r * nv, tgt[r], &k,
                      &kld_vals[n_vals], &pd_vals[n_vals]);
        print_chunk_row(c + 1, &k);
        fflush(stdout);
    }
    printf("\n");
    if (k.count >= 100) print_kld_summary(&k, kld_vals, pd_vals, n_vals);
    else fprintf(stderr, "strata perplexity: %zu scored tokens: no summary statistics under 100 (as llama-perplexity)\n",
                 k.count);
    rc = fflush(stdout) == 0 ? CLI_OK : cli_fail(k_cmd, CLI_ERR, "cannot write the output");
done:
    free(pd_vals);
    free(kld_vals);
    free(recs);
    free(rows);
    free(buf);
    free(tokens);
    fclose(b.f);
    session_free(s);
    engine_close(eng);
    return rc;
}

int cmd_perplexity(int argc, char **argv)
{
    ppl_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == HELP_SHOWN) return CLI_OK;
    if (rc) return rc;
    return a.kld ? run_kld(&a) : run_perplexity(&a);
}

/* abbench: `strata bench-ab`, the paired A/B benchmark.
 *
 *   strata bench-ab -o DIR [--arm-a ARGS] [--arm-b ARGS] [--env-a K=V]... [--env-b K=V]...
 *                   [--warmup N] [--pairs N] [--order alternate|ab] [--html FILE] -- run -m MODEL -p ...
 *
 * Two arms, A the baseline and B the candidate, are each a full process:
 * the common command after `--` (a strata subcommand and its arguments),
 * then the arm's own arguments, then `--report-json FILE`, run with the
 * arm's environment. Warm-up rounds (A then B) are run and discarded; then
 * N pairs. Order: A,B in odd pairs and B,A in even pairs (--order alternate,
 * the default), so a fixed advantage of running second (a page cache or
 * CPU frequency state left by the run before) and a linear drift over the
 * block fall on both arms equally; --order ab keeps A,B in every pair.
 *
 * Per run it takes, from the run's --report-json: end-to-end prefill ms
 * excluding init (timings.prompt_ms, the whole prompt's session_eval),
 * prompt tok/s, decode tok/s, and when the run streams experts, the
 * chunk-only ms (stream.phases.prompt.host_ms, wall time inside the
 * forward chunks) and the prompt bytes read (stream.phases.prompt.bytes);
 * "n/a" otherwise. Without a report (--no-report-json) the timing line of
 * `strata run` on stderr is parsed instead. Each pair gives the ratios B/A;
 * the summary is the median ratio and the observed min..max, called a
 * range: with a handful of pairs it is a description, not a confidence
 * interval. Generated output is compared per pair: the reports'
 * "generated_ids" when both have them, else the stdout bytes.
 *
 * Every run's exit status is kept; a run that fails (non-zero exit, killed,
 * no timing) fails the benchmark at once, and its logs stay in DIR with the
 * rest: RUN.stdout, RUN.stderr, RUN.report.json per run, report.md (what
 * stdout showed) and results.json (provenance, every run, the pairs and the
 * summary). --html FILE adds a self-contained HTML/SVG picture.
 *
 * Exit codes: 0 all runs succeeded, 1 a run failed or I/O error, 2 usage. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "report_html.h"

#define CMD "bench-ab"

/* ==== SHA-256 (FIPS 180-4) ==== */

typedef struct sha256 {
    uint32_t h[8];
    uint64_t n;             /* bytes hashed */
    uint8_t  blk[64];
    size_t   fill;
} sha256;

static const uint32_t k_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void sha_block(sha256 *s, const uint8_t *p)
{
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = a[7] + (ror(a[4], 6) ^ ror(a[4], 11) ^ ror(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) +
                      k_sha_k[i] + w[i];
        uint32_t t2 = (ror(a[0], 2) ^ ror(a[0], 13) ^ ror(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += a[i];
}

static void sha_init(sha256 *s)
{
    static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memset(s, 0, sizeof *s);
    memcpy(s->h, h0, sizeof h0);
}

static void sha_update(sha256 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->n += n;
    while (n) {
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->blk + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) { sha_block(s, s->blk); s->fill = 0; }
    }
}

/* Finish and write 64 hex digits + NUL to hex. */
static void sha_hex(sha256 *s, char hex[65])
{
    const uint64_t bits = s->n * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    sha_update(s, &pad, 1);
    while (s->fill != 56) sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, len, 8);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", s->h[i]);
}

/* SHA-256 of the first `limit` bytes of a file (UINT64_MAX: all of it).
 * Returns 0, or -1 with errno set. *size gets the file's size. */
static int sha_file(const char *path, uint64_t limit, char hex[65], uint64_t *size, uint64_t *hashed)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fclose(f); return -1; }
    sha256 s;
    sha_init(&s);
    static const size_t k_chunk = 1 << 16;
    uint8_t *b = malloc(k_chunk);
    uint64_t done = 0;
    int rc = b ? 0 : -1;
    while (b && done < limit) {
        size_t want = limit - done < k_chunk ? (size_t)(limit - done) : k_chunk;
        size_t got = fread(b, 1, want, f);
        sha_update(&s, b, got);
        done += got;
        if (got < want) { if (ferror(f)) rc = -1; break; }
    }
    free(b);
    fclose(f);
    if (rc) return rc;
    sha_hex(&s, hex);
    *size = (uint64_t)st.st_size;
    if (hashed) *hashed = done;
    return 0;
}

/* ==== Options ==== */

enum { ARM_A = 0, ARM_B = 1 };
static const char k_arm_letter[2] = { 'A', 'B' };

typedef struct arm {
    const char *name;       /* label in the tables */
    const char *args_text;  /* --arm-x as given */
    char      **args;       /* owned: split args_text (strings owned) */
    int         n_args;
    const char *env[64];    /* borrowed "K=V" from argv: --env then --env-x (later wins) */
    int         n_env;
    const char *bin;        /* binary to run */
    char        bin_sha[65];
    char      **argv;       /* owned array (strings borrowed) for execve, NULL-terminated */
    char      **envp;       /* owned array (strings borrowed) for execve */
} arm;

typedef struct opts {
    arm         arms[2];
    int         warmup, pairs, alternate, report_json, timeout_s;
    const char *out_dir, *html;
    char      **common;     /* borrowed: argv after "--" */
    int         n_common;
} opts;

/* Split s like a POSIX shell splits words (no expansion): blanks separate,
 * '...' is literal, "..." allows \" \\ \$ \`, a backslash outside quotes
 * escapes the next character. Returns 0 or -1 (unterminated quote, OOM). */
static int split_words(const char *s, char ***out, int *n_out)
{
    char **v = NULL;
    int n = 0;
    size_t len = strlen(s);
    char *w = malloc(len + 1);
    if (!w) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        size_t k = 0;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
            if (*p == '\'') {
                const char *q = strchr(p + 1, '\'');
                if (!q) goto bad;
                memcpy(w + k, p + 1, (size_t)(q - p - 1));
                k += (size_t)(q - p - 1);
                p = q + 1;
            } else if (*p == '"') {
                p++;
                while (*p && *p != '"') {
                    if (*p == '\\' && p[1] && strchr("\"\\$`", p[1])) p++;
                    w[k++] = *p++;
                }
                if (*p != '"') goto bad;
                p++;
            } else if (*p == '\\' && p[1]) {
                w[k++] = p[1];
                p += 2;
            } else {
                w[k++] = *p++;
            }
        }
        char **nv = realloc(v, sizeof *nv * (size_t)(n + 1));
        if (!nv) goto bad;
        v = nv;
        if (!(v[n] = malloc(k + 1))) goto bad;
        memcpy(v[n], w, k);
        v[n++][k] = '\0';
    }
    free(w);
    *out = v;
    *n_out = n;
    return 0;
bad:
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    free(w);
    return -1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata bench-ab -o DIR [options] -- COMMAND [ARGS...]\n\n"
            "Paired A/B benchmark: each run is `strata COMMAND ARGS... ARM-ARGS --report-json FILE`\n"
            "with the arm's environment; warm-ups discarded, then N pairs of A (baseline) and B\n"
            "(candidate). Example:\n"
            "  strata bench-ab -o ab --arm-a '--arena 1G' --arm-b '--arena 1G --read-ahead 2' \\\n"
            "      --pairs 5 -- run -m model.gguf -f prompt.txt -n 8 --temp 0\n\n"
            "  -o, --out DIR        output directory (created): logs, report.md, results.json\n"
            "  --arm-a ARGS         arguments appended for arm A, shell-quoted (default none)\n"
            "  --arm-b ARGS         arguments appended for arm B\n"
            "  --name-a NAME        arm A's label (default: its ARGS, or A)\n"
            "  --name-b NAME        arm B's label\n"
            "  --env K=V            environment for both arms (repeatable)\n"
            "  --env-a K=V          environment for arm A only (repeatable; wins over --env)\n"
            "  --env-b K=V          environment for arm B only\n"
            "  --bin PATH           strata binary for both arms (default: this one)\n"
            "  --bin-a/--bin-b PATH binary for one arm (comparing two builds)\n"
            "  --warmup N           warm-up rounds (A then B) run and discarded (default 1)\n"
            "  --pairs N            measured pairs (default 5)\n"
            "  --order alternate|ab A,B in odd and B,A in even pairs (default), or A,B always\n"
            "  --timeout SEC        kill a run after SEC seconds (default 0: no limit)\n"
            "  --no-report-json     do not add --report-json; parse the timing line on stderr\n"
            "  --html FILE          also write a self-contained HTML/SVG picture of the ratios\n"
            "  -h, --help           this help\n");
}

static int add_env(const char *v, arm *a, int n_arms)
{
    const char *eq = strchr(v, '=');
    if (!eq || eq == v) return cli_fail(CMD, CLI_USAGE, "environment settings are K=V, got '%s'", v);
    for (int k = 0; k < n_arms; k++) {
        if (a[k].n_env == (int)(sizeof a[k].env / sizeof a[k].env[0]))
            return cli_fail(CMD, CLI_USAGE, "too many environment settings");
        a[k].env[a[k].n_env++] = v;
    }
    return 0;
}

enum { HELP_SHOWN = 100 };

static int parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->warmup = 1;
    o->pairs = 5;
    o->alternate = 1;
    o->report_json = 1;
    const char *bin = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(CMD, argc, argv, &i))) return CLI_USAGE; } while (0)
#define INT(lo, hi, dst) do { VALUE(); if (cli_parse_int(v, lo, hi, &n)) \
        return cli_fail(CMD, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                        (long long)(lo), (long long)(hi), v); dst = (int)n; } while (0)
        if (IS("--")) { o->common = argv + i + 1; o->n_common = argc - i - 1; break; }
        else if (IS("-h") || IS("--help")) { usage(stdout); return HELP_SHOWN; }
        else if (IS("-o") || IS("--out")) { VALUE(); o->out_dir = v; }
        else if (IS("--arm-a")) { VALUE(); o->arms[ARM_A].args_text = v; }
        else if (IS("--arm-b")) { VALUE(); o->arms[ARM_B].args_text = v; }
        else if (IS("--name-a")) { VALUE(); o->arms[ARM_A].name = v; }
        else if (IS("--name-b")) { VALUE(); o->arms[ARM_B].name = v; }
        else if (IS("--env")) { VALUE(); if (add_env(v, o->arms, 2)) return CLI_USAGE; }
        else if (IS("--env-a")) { VALUE(); if (add_env(v, &o->arms[ARM_A], 1)) return CLI_USAGE; }
        else if (IS("--env-b")) { VALUE(); if (add_env(v, &o->arms[ARM_B], 1)) return CLI_USAGE; }
        else if (IS("--bin")) { VALUE(); bin = v; }
        else if (IS("--bin-a")) { VALUE(); o->arms[ARM_A].bin = v; }
        else if (IS("--bin-b")) { VALUE(); o->arms[ARM_B].bin = v; }
        else if (IS("--warmup")) INT(0, 1000, o->warmup);
        else if (IS("--pairs")) INT(1, 100000, o->pairs);
        else if (IS("--timeout")) INT(0, 1000000, o->timeout_s);
        else if (IS("--order")) {
            VALUE();
            if (!strcmp(v, "alternate")) o->alternate = 1;
            else if (!strcmp(v, "ab")) o->alternate = 0;
            else return cli_fail(CMD, CLI_USAGE, "--order must be alternate or ab, got '%s'", v);
        }
        else if (IS("--no-report-json")) o->report_json = 0;
        else if (IS("--html")) { VALUE(); o->html = v; }
        else return cli_fail(CMD, CLI_USAGE, "unknown option '%s' (see strata bench-ab --help)", a);
#undef IS
#undef VALUE
#undef INT
    }
    if (!o->out_dir) return cli_fail(CMD, CLI_USAGE, "no output directory given (-o DIR)");
    if (!o->common || o->n_common == 0)
        return cli_fail(CMD, CLI_USAGE, "no command given: put the common strata command after --, e.g. -- run -m MODEL -p TEXT");
    const char *c0 = o->common[0], *base = strrchr(c0, '/');
    if (!strcmp(base ? base + 1 : c0, "strata"))
        return cli_fail(CMD, CLI_USAGE, "after -- comes the strata subcommand (run ...), not the binary; "
                                        "--bin PATH picks another binary");
    for (int k = 0; k < 2; k++) {
        arm *r = &o->arms[k];
        if (!r->bin) r->bin = bin;
        if (!r->args_text) r->args_text = "";
        if (split_words(r->args_text, &r->args, &r->n_args) != 0)
            return cli_fail(CMD, CLI_USAGE, "--arm-%c: unterminated quote in '%s'", k ? 'b' : 'a', r->args_text);
        if (!r->name) r->name = r->args_text[0] ? r->args_text : (k ? "B" : "A");
    }
    return 0;
}

/* ==== Running ==== */

/* Build arm a's argv (bin, common, arm args, [--report-json FILE]) with the
 * report path left as the last slot to fill per run, and its envp: the
 * inherited environment with the arm's settings replacing same-name ones. */
static int arm_prepare(const opts *o, arm *a, char *self)
{
    extern char **environ;
    if (!a->bin) a->bin = self;
    const int n = 1 + o->n_common + a->n_args + 2 + 1;
    a->argv = calloc((size_t)n, sizeof *a->argv);
    int ne = 0;
    for (char **e = environ; e && *e; e++) ne++;
    a->envp = calloc((size_t)(ne + a->n_env + 1), sizeof *a->envp);
    if (!a->argv || !a->envp) return -1;
    int k = 0;
    a->argv[k++] = (char *)a->bin;
    for (int i = 0; i < o->n_common; i++) a->argv[k++] = o->common[i];
    for (int i = 0; i < a->n_args; i++) a->argv[k++] = a->args[i];
    if (o->report_json) { a->argv[k++] = "--report-json"; a->argv[k++] = NULL; /* filled per run */ }
    k = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t kl = eq ? (size_t)(eq - *e) : strlen(*e);
        int over = 0;
        for (int i = 0; i < a->n_env && !over; i++) over = !strncmp(a->env[i], *e, kl) && a->env[i][kl] == '=';
        if (!over) a->envp[k++] = *e;
    }
    for (int i = 0; i < a->n_env; i++) {
        /* a later setting of the same name wins: drop earlier ones */
        const size_t kl = (size_t)(strchr(a->env[i], '=') - a->env[i]);
        int later = 0;
        for (int j = i + 1; j < a->n_env && !later; j++) later = !strncmp(a->env[j], a->env[i], kl + 1);
        if (!later) a->envp[k++] = (char *)a->env[i];
    }
    return 0;
}

typedef struct metrics {
    int    ok;                      /* timings found */
    double load_ms, prefill_ms, prompt_tok_s, gen_tok_s, chunk_ms, bytes;   /* NaN: n/a */
    int    prompt_tokens, gen_tokens;
    cJSON *gen_ids;                 /* owned copy of "generated_ids", or NULL */
} metrics;

typedef struct run_rec {
    char    label[32];              /* "pair3-B", "warmup1-A" */
    int     warmup;                 /* 1 for a warm-up run */
    int     index;                  /* pair or warm-up round, 1-based */
    int     arm;                    /* ARM_A / ARM_B */
    int     position;               /* 1: first in its pair, 2: second */
    char    out_path[PATH_MAX], err_path[PATH_MAX], rep_path[PATH_MAX];
    int     started, exited, exit_code, signal;
    double  wall_ms;
    metrics m;
} run_rec;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int run_process(const opts *o, arm *a, run_rec *r)
{
    if (o->report_json) {
        a->argv[1 + o->n_common + a->n_args + 1] = r->rep_path;
        unlink(r->rep_path);
    }
    fflush(stdout);
    fflush(stderr);
    const double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) return cli_fail(CMD, CLI_ERR, "fork: %s", strerror(errno));
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open(r->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int er = open(r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || er < 0) _exit(126);
        dup2(in, 0);
        dup2(out, 1);
        dup2(er, 2);
        if (o->timeout_s > 0) alarm((unsigned)o->timeout_s);   /* SIGALRM's default action ends the run */
        execve(a->bin, a->argv, a->envp);
        dprintf(2, "strata bench-ab: cannot run %s: %s\n", a->bin, strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return cli_fail(CMD, CLI_ERR, "waitpid: %s", strerror(errno));
    r->wall_ms = now_ms() - t0;
    r->started = 1;
    if (WIFEXITED(st)) { r->exited = 1; r->exit_code = WEXITSTATUS(st); }
    else if (WIFSIGNALED(st)) { r->exit_code = -1; r->signal = WTERMSIG(st); }
    return 0;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (b) { b[n] = '\0'; if (len) *len = n; }
    return b;
}

static double num_at(const cJSON *o, const char *a, const char *b, const char *c)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    if (c) v = cJSON_GetObjectItemCaseSensitive(v, c);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Timings of a finished run: its report JSON, else `strata run`'s timing line. */
static void read_metrics(const opts *o, run_rec *r)
{
    metrics *m = &r->m;
    memset(m, 0, sizeof *m);
    m->load_ms = m->prefill_ms = m->prompt_tok_s = m->gen_tok_s = m->chunk_ms = m->bytes = NAN;
    char *text = o->report_json ? read_all(r->rep_path, NULL) : NULL;
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (j) {
        m->load_ms = num_at(j, "timings", "load_ms", NULL);
        m->prefill_ms = num_at(j, "timings", "prompt_ms", NULL);
        m->prompt_tok_s = num_at(j, "timings", "prompt_tok_s", NULL);
        m->gen_tok_s = num_at(j, "timings", "gen_tok_s", NULL);
        double pt = num_at(j, "timings", "prompt_tokens", NULL), gt = num_at(j, "timings", "generated_tokens", NULL);
        m->prompt_tokens = isfinite(pt) ? (int)pt : 0;
        m->gen_tokens = isfinite(gt) ? (int)gt : 0;
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "stream"), "phases"), "prompt");
        if (cJSON_IsObject(ph)) {
            m->chunk_ms = num_at(ph, "host_ms", NULL, NULL);
            m->bytes = num_at(ph, "bytes", NULL, NULL);
        }
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "generated_ids");
        if (cJSON_IsArray(ids)) m->gen_ids = cJSON_Duplicate(ids, 1);
        m->ok = isfinite(m->prefill_ms);
        cJSON_Delete(j);
        if (m->ok) return;
    }
    /* "strata run: load X ms, prompt N tokens in X ms (X tok/s), generated N tokens in X ms (X tok/s)" */
    text = read_all(r->err_path, NULL);
    for (char *p = text; p && (p = strstr(p, ": load ")) != NULL; p++) {
        double load, pms, pts, gms, gts;
        int pn, gn;
        if (sscanf(p, ": load %lf ms, prompt %d tokens in %lf ms (%lf tok/s), generated %d tokens in %lf ms (%lf tok/s)",
                   &load, &pn, &pms, &pts, &gn, &gms, &gts) == 7) {
            m->load_ms = load;
            m->prefill_ms = pms;
            m->prompt_tok_s = pts;
            m->gen_tok_s = gts;
            m->prompt_tokens = pn;
            m->gen_tokens = gn;
            m->ok = 1;
        }
    }
    free(text);
}

/* ==== Statistics ==== */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct summary {
    int    n;                    /* finite values */
    double median, min, max;
} summary;

/* Median (the mean of the middle two for even n), min and max of the
 * finite values; n = 0 when there are none. */
static summary summarize(const double *v, int n)
{
    summary s = { 0, NAN, NAN, NAN };
    double *t = malloc(sizeof *t * (size_t)(n ? n : 1));
    if (!t) return s;
    for (int i = 0; i < n; i++) if (isfinite(v[i])) t[s.n++] = v[i];
    if (s.n) {
        qsort(t, (size_t)s.n, sizeof *t, cmp_double);
        s.median = s.n % 2 ? t[s.n / 2] : 0.5 * (t[s.n / 2 - 1] + t[s.n / 2]);
        s.min = t[0];
        s.max = t[s.n - 1];
    }
    free(t);
    return s;
}

/* ==== Provenance ==== */

/* First line of a command's stdout (stderr discarded), or "" on failure. */
static void capture(char *const argv[], char *out, size_t cap)
{
    out[0] = '\0';
    int fd[2];
    if (pipe(fd) != 0) return;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { close(fd[0]); close(fd[1]); return; }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 2);
        dup2(fd[1], 1);
        close(fd[0]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t got;
    char tmp[256];
    while ((got = read(fd[0], tmp, sizeof tmp)) > 0)
        for (ssize_t i = 0; i < got; i++)
            if (n + 1 < cap) out[n++] = tmp[i];
    close(fd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    out[n] = '\0';
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { out[0] = '\0'; return; }
    char *nl = strchr(out, '\n');
    if (nl) *nl = '\0';
}

static void cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *c = strchr(line, ':');
        if (!c) continue;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = '\0';
        snprintf(out, cap, "%s", c);
        break;
    }
    fclose(f);
}

static void iso_now(char *out, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void add_strata_env(cJSON *obj, char *const *envp)
{
    for (char *const *e = envp; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || strncmp(*e, "STRATA_", 7)) continue;
        char key[160];
        snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
        cJSON_AddStringToObject(obj, key, eq + 1);
    }
}

/* Header region hashed for the model fingerprint: the GGUF header, metadata
 * (tokenizer included) and tensor directory fit in it for every model we
 * run; hashing whole 50 GB files per benchmark would cost minutes. */
#define MODEL_HASH_BYTES (16u << 20)

static void add_model(cJSON *models, const char *path)
{
    for (const cJSON *m = models->child; m; m = m->next)
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(m, "path")->valuestring, path)) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", path);
    char hex[65];
    uint64_t size = 0, hashed = 0;
    if (sha_file(path, MODEL_HASH_BYTES, hex, &size, &hashed) == 0) {
        cJSON_AddNumberToObject(o, "size", (double)size);
        cJSON_AddStringToObject(o, "header_sha256", hex);
        cJSON_AddNumberToObject(o, "header_bytes", (double)hashed);
    } else {
        cJSON_AddStringToObject(o, "error", strerror(errno));
    }
    cJSON_AddItemToArray(models, o);
}

static cJSON *provenance(const opts *o, int argc, char **argv, const char *date)
{
    extern char **environ;
    cJSON *p = cJSON_CreateObject();
    cJSON *av = cJSON_AddArrayToObject(p, "argv");
    cJSON_AddItemToArray(av, cJSON_CreateString("strata"));
    for (int i = 0; i < argc; i++) cJSON_AddItemToArray(av, cJSON_CreateString(argv[i]));
    char cwd[PATH_MAX];
    cJSON_AddStringToObject(p, "cwd", getcwd(cwd, sizeof cwd) ? cwd : "");
    add_strata_env(cJSON_AddObjectToObject(p, "env"), environ);
    cJSON *arms = cJSON_AddObjectToObject(p, "arms");
    cJSON *models = cJSON_AddArrayToObject(p, "models");
    for (int k = 0; k < 2; k++) {
        const arm *a = &o->arms[k];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", a->name);
        cJSON_AddStringToObject(x, "role", k == ARM_A ? "baseline" : "candidate");
        cJSON *cmd = cJSON_AddArrayToObject(x, "command");
        for (int i = 0; a->argv[i] || (o->report_json && i == 1 + o->n_common + a->n_args + 1); i++)
            cJSON_AddItemToArray(cmd, cJSON_CreateString(a->argv[i] ? a->argv[i] : "FILE"));
        cJSON *env = cJSON_AddObjectToObject(x, "env_set");
        for (int i = 0; i < a->n_env; i++) {
            const char *eq = strchr(a->env[i], '=');
            char key[160];
            snprintf(key, sizeof key, "%.*s", (int)(eq - a->env[i]), a->env[i]);
            cJSON_DeleteItemFromObjectCaseSensitive(env, key);
            cJSON_AddStringToObject(env, key, eq + 1);
        }
        add_strata_env(cJSON_AddObjectToObject(x, "strata_env"), a->envp);
        cJSON_AddStringToObject(x, "binary", a->bin);
        cJSON_AddStringToObject(x, "binary_sha256", a->bin_sha);
        cJSON_AddItemToObject(arms, k == ARM_A ? "A" : "B", x);
        /* model fingerprints: every -m/--model value the arm passes */
        for (int i = 1; a->argv[i]; i++)
            if ((!strcmp(a->argv[i], "-m") || !strcmp(a->argv[i], "--model")) && a->argv[i + 1])
                add_model(models, a->argv[i + 1]);
    }
    char buf[512], dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", o->arms[ARM_A].bin);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
    char *git_head[] = { "git", "-C", dir, "rev-parse", "HEAD", NULL };
    capture(git_head, buf, sizeof buf);
    cJSON *git = cJSON_AddObjectToObject(p, "git");
    if (buf[0]) {
        cJSON_AddStringToObject(git, "commit", buf);
        char *git_dirty[] = { "git", "-C", dir, "status", "--porcelain", "--untracked-files=no", NULL };
        capture(git_dirty, buf, sizeof buf);
        cJSON_AddBoolToObject(git, "dirty", buf[0] != '\0');
    } else {
        cJSON_AddNullToObject(git, "commit");
    }
    cpu_model(buf, sizeof buf);
    cJSON_AddStringToObject(p, "cpu", buf);
    cJSON_AddNumberToObject(p, "cpus_online", (double)sysconf(_SC_NPROCESSORS_ONLN));
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(buf, sizeof buf, "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
        cJSON_AddStringToObject(p, "kernel", buf);
        cJSON_AddStringToObject(p, "host", u.nodename);
    }
    cJSON_AddStringToObject(p, "date", date);
    return p;
}

/* ==== Report ==== */

static void fmt_num(char *out, size_t cap, double v, const char *fmt)
{
    if (isfinite(v)) snprintf(out, cap, fmt, v);
    else snprintf(out, cap, "n/a");
}

static double ratio(double b, double a) { return isfinite(a) && isfinite(b) && a > 0 ? b / a : NAN; }

/* Where two byte strings or id lists first differ; -1 when equal. */
static long first_diff_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++) if (a[i] != b[i]) return (long)i;
    return na == nb ? -1 : (long)n;
}

static long first_diff_ids(const cJSON *a, const cJSON *b)
{
    long i = 0;
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next, i++)
        if (!cJSON_IsNumber(x) || !cJSON_IsNumber(y) || x->valuedouble != y->valuedouble) return i;
    return (x || y) ? i : -1;
}

typedef struct pair_res {
    double e2e, chunk, bytes, decode;   /* B/A ratios (NaN: n/a) */
    int    out_equal;                   /* 1 equal, 0 differ, -1 unknown */
    long   first_diff;
    int    by_ids;                      /* compared generated_ids (else stdout bytes) */
} pair_res;

static void compare_outputs(const run_rec *ra, const run_rec *rb, pair_res *p)
{
    p->out_equal = -1;
    p->first_diff = -1;
    if (ra->m.gen_ids && rb->m.gen_ids) {
        p->by_ids = 1;
        p->first_diff = first_diff_ids(ra->m.gen_ids, rb->m.gen_ids);
        p->out_equal = p->first_diff < 0;
        return;
    }
    size_t na, nb;
    char *a = read_all(ra->out_path, &na), *b = read_all(rb->out_path, &nb);
    if (a && b) {
        p->first_diff = first_diff_bytes(a, na, b, nb);
        p->out_equal = p->first_diff < 0;
    }
    free(a);
    free(b);
}

/* "all 5 pairs faster" / "3 of 5 pairs faster, 2 slower" for ratios where
 * below 1 is better. */
static void direction(char *out, size_t cap, const double *r, int n, const char *better, const char *worse)
{
    int lo = 0, hi = 0, eq = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(r[i])) continue;
        m++;
        if (r[i] < 1) lo++; else if (r[i] > 1) hi++; else eq++;
    }
    if (eq == m) snprintf(out, cap, "all %d pairs equal", m);
    else if (lo == m) snprintf(out, cap, "all %d pairs %s", m, better);
    else if (hi == m) snprintf(out, cap, "all %d pairs %s", m, worse);
    else snprintf(out, cap, "%d of %d pairs %s, %d %s, %d equal", lo, m, better, hi, worse, eq);
}

/* s as one shell word: bare when it has only safe characters, else in
 * single quotes (so the printed command can be pasted back). */
static void put_word(FILE *f, const char *s)
{
    int safe = *s != '\0';
    for (const char *p = s; *p && safe; p++)
        safe = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("-_./=:,+@%", *p);
    if (safe) { fputs(s, f); return; }
    fputc('\'', f);
    for (const char *p = s; *p; p++) {
        if (*p == '\'') fputs("'\\''", f);
        else fputc(*p, f);
    }
    fputc('\'', f);
}

/* The tables and summary (stdout and report.md get the same text). */
static void write_report(FILE *f, const opts *o, const run_rec *runs, const pair_res *pr, const summary *se,
                         const summary *sc, const summary *sb, const summary *sd)
{
    const arm *A = &o->arms[ARM_A], *B = &o->arms[ARM_B];
    fprintf(f, "paired A/B: baseline A = %s, candidate B = %s\n", A->name, B->name);
    fprintf(f, "command: strata");
    for (int i = 0; i < o->n_common; i++) { fputc(' ', f); put_word(f, o->common[i]); }
    fprintf(f, "\narm A adds: %s", A->args_text[0] ? A->args_text : "(nothing)");
    for (int i = 0; i < A->n_env; i++) { fputs(i ? " " : "; env ", f); put_word(f, A->env[i]); }
    fprintf(f, "\narm B adds: %s", B->args_text[0] ? B->args_text : "(nothing)");
    for (int i = 0; i < B->n_env; i++) { fputs(i ? " " : "; env ", f); put_word(f, B->env[i]); }
    fprintf(f, "\n%d warm-up round%s (A then B) discarded; %d pairs, order %s. every run exited 0.\n", o->warmup,
            o->warmup == 1 ? "" : "s", o->pairs,
            o->alternate ? "A,B in odd pairs and B,A in even pairs (a fixed advantage of running second and a "
                           "linear drift fall on both arms)"
                         : "A,B in every pair");
    fprintf(f, "prefill_ms is end-to-end prefill excluding init (the whole prompt's evaluation, from the run's "
               "report); tok/s is prompt tokens per second; chunk-only ms and prompt bytes read come from the "
               "expert-stream counters (n/a when the run does not stream).\n\n");
    fprintf(f, "| pair | arm | ran | end-to-end prefill excluding init ms | tok/s | candidate/baseline end-to-end "
               "ratio | chunk-only ms | candidate/baseline chunk-only ratio | prompt bytes read | "
               "candidate/baseline bytes ratio |\n|---|---|---|---|---|---|---|---|---|---|\n");
    const int first = o->warmup * 2;
    for (int p = 0; p < o->pairs; p++) {
        for (int k = 0; k < 2; k++) {
            const run_rec *r = NULL;
            for (int i = 0; i < 2; i++)
                if (runs[first + 2 * p + i].arm == k) r = &runs[first + 2 * p + i];
            char e2e[32], tps[32], rat[32], ch[32], chr[32], by[32], byr[32];
            fmt_num(e2e, sizeof e2e, r->m.prefill_ms, "%.2f");
            fmt_num(tps, sizeof tps, r->m.prompt_tok_s, "%.2f");
            fmt_num(ch, sizeof ch, r->m.chunk_ms, "%.2f");
            fmt_num(by, sizeof by, r->m.bytes, "%.0f");
            if (k == ARM_A) {
                snprintf(rat, sizeof rat, "—");
                snprintf(chr, sizeof chr, "—");
                snprintf(byr, sizeof byr, "—");
            } else {
                fmt_num(rat, sizeof rat, pr[p].e2e, "%.6f");
                fmt_num(chr, sizeof chr, pr[p].chunk, "%.6f");
                fmt_num(byr, sizeof byr, pr[p].bytes, "%.6f");
            }
            fprintf(f, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p + 1, o->arms[k].name,
                    r->position == 1 ? "1st" : "2nd", e2e, tps, rat, ch, chr, by, byr);
        }
    }
    double *r = malloc(sizeof *r * (size_t)o->pairs);
    char dir[96];
    if (r) {
        for (int p = 0; p < o->pairs; p++) r[p] = pr[p].e2e;
        direction(dir, sizeof dir, r, o->pairs, "faster", "slower");
    } else {
        snprintf(dir, sizeof dir, "(out of memory)");
    }
    if (se->n)
        fprintf(f, "median paired end-to-end prefill excluding init ratio = %.6f (%+.2f%% latency); observed range "
                   "%.6f..%.6f.", se->median, (se->median - 1) * 100, se->min, se->max);
    else
        fprintf(f, "end-to-end prefill ratio n/a (a baseline run reported 0 ms).");
    if (sc->n) fprintf(f, " median paired chunk-only ratio = %.6f; observed range %.6f..%.6f.", sc->median, sc->min, sc->max);
    else fprintf(f, " chunk-only ratio n/a (no stream counters).");
    fprintf(f, " %s. ranges are descriptive min..max, not a 95%% confidence interval; n=%d does not support a "
               "strong CI claim.%s\n", dir, o->pairs,
            o->pairs % 2 ? "" : " with an even number of pairs the median is the mean of the middle two.");
    if (sb->n) {
        if (r) {
            for (int p = 0; p < o->pairs; p++) r[p] = pr[p].bytes;
            direction(dir, sizeof dir, r, o->pairs, "read less", "read more");
        }
        fprintf(f, "median paired prompt bytes ratio = %.6f (%+.2f%%); observed range %.6f..%.6f; %s.\n", sb->median,
                (sb->median - 1) * 100, sb->min, sb->max, dir);
    } else {
        fprintf(f, "prompt bytes ratio n/a: the runs report no expert-stream counters (not streaming).\n");
    }
    if (sd->n)
        fprintf(f, "median paired decode tok/s ratio = %.6f (%+.2f%% throughput); observed range %.6f..%.6f.\n",
                sd->median, (sd->median - 1) * 100, sd->min, sd->max);
    free(r);
    int eq = 0, known = 0, by_ids = 1;
    for (int p = 0; p < o->pairs; p++) {
        if (pr[p].out_equal < 0) continue;
        known++;
        eq += pr[p].out_equal;
        by_ids &= pr[p].by_ids;
    }
    if (!known) {
        fprintf(f, "generated output: not compared (stdout unreadable).\n");
    } else if (eq == known) {
        fprintf(f, "generated %s: A and B equal in %d/%d pairs.\n", by_ids ? "ids" : "output (stdout bytes)", eq, known);
    } else {
        fprintf(f, "generated %s: A and B equal in %d/%d pairs; first difference at", by_ids ? "ids" : "output (stdout bytes)",
                eq, known);
        int firstp = 1;
        for (int p = 0; p < o->pairs; p++)
            if (pr[p].out_equal == 0) {
                fprintf(f, "%s %s %ld in pair %d", firstp ? "" : ";", pr[p].by_ids ? "generated position" : "byte",
                        pr[p].first_diff, p + 1);
                firstp = 0;
            }
        fprintf(f, " (0-based). a difference is divergence, not by itself better or worse output.\n");
    }
}

static cJSON *metrics_json(const metrics *m)
{
    cJSON *o = cJSON_CreateObject();
#define NUM(k, v) do { if (isfinite(v)) cJSON_AddNumberToObject(o, k, v); else cJSON_AddNullToObject(o, k); } while (0)
    NUM("load_ms", m->load_ms);
    NUM("prefill_ms", m->prefill_ms);
    NUM("prompt_tok_s", m->prompt_tok_s);
    NUM("gen_tok_s", m->gen_tok_s);
    NUM("chunk_ms", m->chunk_ms);
    NUM("prompt_bytes", m->bytes);
    cJSON_AddNumberToObject(o, "prompt_tokens", m->prompt_tokens);
    cJSON_AddNumberToObject(o, "generated_tokens", m->gen_tokens);
#undef NUM
    return o;
}

static cJSON *summary_json(const summary *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", s->n);
    if (s->n) {
        cJSON_AddNumberToObject(o, "median", s->median);
        cJSON_AddNumberToObject(o, "min", s->min);
        cJSON_AddNumberToObject(o, "max", s->max);
    }
    return o;
}

static int write_text_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

static int write_results(const char *dir, cJSON *root)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.json", dir);
    char *text = cJSON_Print(root);
    if (!text) return cli_fail(CMD, CLI_ERR, "out of memory");
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) { text = t2; text[n] = '\n'; text[n + 1] = '\0'; }
    int rc = write_text_file(path, text);
    free(text);
    if (rc) return cli_fail(CMD, CLI_ERR, "cannot write %s", path);
    return 0;
}

static cJSON *run_json(const opts *o, const run_rec *r)
{
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "run", r->label);
    cJSON_AddStringToObject(x, "phase", r->warmup ? "warmup" : "pair");
    cJSON_AddNumberToObject(x, "index", r->index);
    cJSON_AddStringToObject(x, "arm", r->arm == ARM_A ? "A" : "B");
    cJSON_AddNumberToObject(x, "position", r->position);
    if (r->exited) cJSON_AddNumberToObject(x, "exit_code", r->exit_code);
    else cJSON_AddNullToObject(x, "exit_code");
    if (r->signal) cJSON_AddNumberToObject(x, "signal", r->signal);
    cJSON_AddNumberToObject(x, "wall_ms", r->wall_ms);
    cJSON_AddStringToObject(x, "stdout", r->out_path);
    cJSON_AddStringToObject(x, "stderr", r->err_path);
    if (o->report_json) cJSON_AddStringToObject(x, "report", r->rep_path);
    cJSON_AddItemToObject(x, "metrics", metrics_json(&r->m));
    return x;
}

static int write_html(const opts *o, const char *report_text, const pair_res *pr, const summary *se,
                      const summary *sc, const summary *sb, const char *prov_text)
{
    FILE *f = fopen(o->html, "w");
    if (!f) return cli_fail(CMD, CLI_ERR, "cannot write %s: %s", o->html, strerror(errno));
    char title[256];
    snprintf(title, sizeof title, "paired A/B: %s vs %s", o->arms[ARM_B].name, o->arms[ARM_A].name);
    report_html_begin(f, title);
    report_html_para(f, "Per-pair candidate/baseline ratios (below 1: the candidate took less). The green line is "
                        "the median; the observed min..max is a descriptive range, not a confidence interval.");
    double *v = malloc(sizeof *v * (size_t)o->pairs);
    if (!v) { fclose(f); return cli_fail(CMD, CLI_ERR, "out of memory"); }
    const char *titles[3] = { "end-to-end prefill excluding init: B/A", "chunk-only ms: B/A", "prompt bytes read: B/A" };
    const summary *ss[3] = { se, sc, sb };
    for (int c = 0; c < 3; c++) {
        if (!ss[c]->n) continue;
        for (int p = 0; p < o->pairs; p++) v[p] = c == 0 ? pr[p].e2e : c == 1 ? pr[p].chunk : pr[p].bytes;
        char mlab[64], rlab[64];
        snprintf(mlab, sizeof mlab, "median %.4f", ss[c]->median);
        snprintf(rlab, sizeof rlab, "1 (no change)");
        report_line lines[2] = { { ss[c]->median, mlab, 0 }, { 1.0, rlab, 1 } };
        report_chart ch = { .title = titles[c], .x_label = "pair", .y_label = "candidate/baseline", .y = v,
                            .n = o->pairs, .lines = lines, .n_lines = 2 };
        report_html_chart(f, &ch);
    }
    free(v);
    report_html_pre(f, report_text);
    report_html_pre(f, prov_text);
    int bad = report_html_end(f);
    bad |= fclose(f) != 0;
    if (bad) return cli_fail(CMD, CLI_ERR, "cannot write %s", o->html);
    return 0;
}

/* ==== Command ==== */

int cmd_bench_ab(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == HELP_SHOWN) return CLI_OK;
    const int n_runs = 2 * (o.warmup + o.pairs);
    run_rec *runs = NULL;
    pair_res *pr = NULL;
    cJSON *root = NULL;
    char *report_text = NULL;
    size_t report_len = 0;
    char self[PATH_MAX];
    if (rc) goto done;
    rc = CLI_ERR;
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) { cli_fail(CMD, CLI_ERR, "cannot find this binary (/proc/self/exe)"); goto done; }
    self[sl] = '\0';
    if (mkdir(o.out_dir, 0755) != 0 && errno != EEXIST) {
        cli_fail(CMD, CLI_ERR, "cannot create %s: %s", o.out_dir, strerror(errno));
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        arm *a = &o.arms[k];
        if (arm_prepare(&o, a, self) != 0) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
        uint64_t size;
        if (sha_file(a->bin, UINT64_MAX, a->bin_sha, &size, NULL) != 0) {
            cli_fail(CMD, CLI_ERR, "cannot read the binary %s: %s", a->bin, strerror(errno));
            goto done;
        }
    }
    runs = calloc((size_t)n_runs, sizeof *runs);
    pr = calloc((size_t)o.pairs, sizeof *pr);
    if (!runs || !pr) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    char date[32];
    iso_now(date, sizeof date);
    root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "bench_ab", 1);
    cJSON_AddItemToObject(root, "provenance", provenance(&o, argc, argv, date));
    cJSON_AddNumberToObject(root, "warmup", o.warmup);
    cJSON_AddNumberToObject(root, "pairs", o.pairs);
    cJSON_AddStringToObject(root, "order", o.alternate ? "alternate" : "ab");
    cJSON *runs_json = cJSON_AddArrayToObject(root, "runs");

    /* the schedule: warm-ups A,B; then pairs A,B / B,A */
    for (int i = 0; i < n_runs; i++) {
        run_rec *r = &runs[i];
        const int warm = i < 2 * o.warmup;
        const int idx = warm ? i / 2 + 1 : (i - 2 * o.warmup) / 2 + 1;
        const int pos = i % 2;
        const int swap = !warm && o.alternate && idx % 2 == 0;
        r->warmup = warm;
        r->index = idx;
        r->arm = swap ? 1 - pos : pos;
        r->position = pos + 1;
        snprintf(r->label, sizeof r->label, "%s%d-%c", warm ? "warmup" : "pair", idx, k_arm_letter[r->arm]);
        snprintf(r->out_path, sizeof r->out_path, "%s/%s.stdout", o.out_dir, r->label);
        snprintf(r->err_path, sizeof r->err_path, "%s/%s.stderr", o.out_dir, r->label);
        snprintf(r->rep_path, sizeof r->rep_path, "%s/%s.report.json", o.out_dir, r->label);
    }
    for (int i = 0; i < n_runs; i++) {
        run_rec *r = &runs[i];
        if (run_process(&o, &o.arms[r->arm], r) != 0) goto done;
        read_metrics(&o, r);
        cJSON_AddItemToArray(runs_json, run_json(&o, r));
        const char *why = NULL;
        char whybuf[96];
        if (!r->exited && r->signal == SIGALRM && o.timeout_s > 0) {
            snprintf(whybuf, sizeof whybuf, "ran past --timeout %d s (killed by SIGALRM)", o.timeout_s);
            why = whybuf;
        } else if (!r->exited) {
            snprintf(whybuf, sizeof whybuf, "was killed by signal %d (%s)", r->signal, strsignal(r->signal));
            why = whybuf;
        }
        else if (r->exit_code) { snprintf(whybuf, sizeof whybuf, "exited with status %d", r->exit_code); why = whybuf; }
        else if (!r->m.ok) why = "reported no prefill timing (no --report-json timings, no timing line)";
        if (why) {
            cJSON_AddFalseToObject(root, "ok");
            cJSON *fail = cJSON_AddObjectToObject(root, "failed_run");
            cJSON_AddStringToObject(fail, "run", r->label);
            cJSON_AddStringToObject(fail, "reason", why);
            cJSON_AddStringToObject(fail, "stderr", r->err_path);
            write_results(o.out_dir, root);
            cli_fail(CMD, CLI_ERR, "%s (arm %s) %s; logs kept in %s and %s", r->label, o.arms[r->arm].name, why,
                     r->err_path, r->out_path);
            goto done;
        }
        fprintf(stderr, "strata bench-ab: %s: prefill %.2f ms\n", r->label, r->m.prefill_ms);
    }

    /* pairs */
    double *e2e = calloc((size_t)o.pairs * 4, sizeof *e2e);
    if (!e2e) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    double *chunk = e2e + o.pairs, *bytes = chunk + o.pairs, *dec = bytes + o.pairs;
    cJSON *pairs_json = cJSON_AddArrayToObject(root, "pair_results");
    const int first = 2 * o.warmup;
    for (int p = 0; p < o.pairs; p++) {
        const run_rec *ra = &runs[first + 2 * p], *rb = &runs[first + 2 * p + 1];
        if (ra->arm != ARM_A) { const run_rec *t = ra; ra = rb; rb = t; }
        pr[p].e2e = e2e[p] = ratio(rb->m.prefill_ms, ra->m.prefill_ms);
        pr[p].chunk = chunk[p] = ratio(rb->m.chunk_ms, ra->m.chunk_ms);
        pr[p].bytes = bytes[p] = ratio(rb->m.bytes, ra->m.bytes);
        pr[p].decode = dec[p] = ra->m.gen_tokens > 0 && rb->m.gen_tokens > 0 ? ratio(rb->m.gen_tok_s, ra->m.gen_tok_s) : NAN;
        compare_outputs(ra, rb, &pr[p]);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "pair", p + 1);
        cJSON_AddStringToObject(x, "order", ra->position == 1 ? "A,B" : "B,A");
#define NUM(k, v) do { if (isfinite(v)) cJSON_AddNumberToObject(x, k, v); else cJSON_AddNullToObject(x, k); } while (0)
        NUM("prefill_ratio", pr[p].e2e);
        NUM("chunk_ratio", pr[p].chunk);
        NUM("bytes_ratio", pr[p].bytes);
        NUM("decode_tok_s_ratio", pr[p].decode);
#undef NUM
        if (pr[p].out_equal < 0) cJSON_AddNullToObject(x, "output_equal");
        else cJSON_AddBoolToObject(x, "output_equal", pr[p].out_equal);
        cJSON_AddStringToObject(x, "output_compared", pr[p].by_ids ? "generated_ids" : "stdout");
        if (pr[p].out_equal == 0) cJSON_AddNumberToObject(x, "first_difference", (double)pr[p].first_diff);
        cJSON_AddItemToArray(pairs_json, x);
    }
    summary se = summarize(e2e, o.pairs), sc = summarize(chunk, o.pairs), sb = summarize(bytes, o.pairs),
            sd = summarize(dec, o.pairs);
    int faster = 0, slower = 0;
    for (int p = 0; p < o.pairs; p++) { faster += e2e[p] < 1; slower += e2e[p] > 1; }
    free(e2e);
    cJSON *sum = cJSON_AddObjectToObject(root, "summary");
    cJSON_AddItemToObject(sum, "prefill_ratio", summary_json(&se));
    cJSON_AddItemToObject(sum, "chunk_ratio", summary_json(&sc));
    cJSON_AddItemToObject(sum, "bytes_ratio", summary_json(&sb));
    cJSON_AddItemToObject(sum, "decode_tok_s_ratio", summary_json(&sd));
    cJSON_AddNumberToObject(sum, "pairs_faster", faster);
    cJSON_AddNumberToObject(sum, "pairs_slower", slower);
    cJSON_AddNumberToObject(sum, "pairs_equal", o.pairs - faster - slower);
    cJSON_AddStringToObject(sum, "ranges", "observed min..max over the pairs; descriptive, not a confidence interval");
    cJSON_AddTrueToObject(root, "ok");

    FILE *mem = open_memstream(&report_text, &report_len);
    if (!mem) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    write_report(mem, &o, runs, pr, &se, &sc, &sb, &sd);
    if (fclose(mem) != 0 || !report_text) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    fputs(report_text, stdout);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/report.md", o.out_dir);
    if (write_text_file(path, report_text) != 0) { cli_fail(CMD, CLI_ERR, "cannot write %s", path); goto done; }
    if (write_results(o.out_dir, root) != 0) goto done;
    if (o.html) {
        char *prov = cJSON_Print(cJSON_GetObjectItemCaseSensitive(root, "provenance"));
        int hr = write_html(&o, report_text, pr, &se, &sc, &sb, prov ? prov : "");
        free(prov);
        if (hr) goto done;
    }
    printf("logs, report.md and results.json (provenance) in %s\n", o.out_dir);
    rc = CLI_OK;
done:
    for (int i = 0; runs && i < n_runs; i++) cJSON_Delete(runs[i].m.gen_ids);
    free(runs);
    free(pr);
    cJSON_Delete(root);
    free(report_text);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < o.arms[k].n_args; i++) free(o.arms[k].args[i]);
        free(o.arms[k].args);
        free(o.arms[k].argv);
        free(o.arms[k].envp);
    }
    return rc;
}

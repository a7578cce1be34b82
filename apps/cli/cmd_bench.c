/* cmd_bench: `strata bench`, prompt processing and generation speed in the
 * manner of llama-bench (tools/llama-bench in llama.cpp).
 *
 * Tests, as llama-bench runs them:
 *   ppN  a fresh context evaluates N token ids as one prompt (session_eval of
 *        N ids, cut into -b chunks by the engine); the ids are random but
 *        seeded (not from the tokenizer), the first one BOS when the model
 *        adds one. The logits of the last row are computed, as llama.cpp does.
 *   tgN  N single-token decode steps from an empty context (the first token
 *        BOS when the model adds one, then random ids); each step computes
 *        the logits.
 * Each repetition (-r) starts from session_truncate(s, 0); its timing covers
 * only the evaluation. With warm-up on (the default, as llama-bench) each
 * test runs once untimed first: ppN a whole ppN, tgN one decode step.
 * Every combination of model, -b and -t opens the engine once and runs every
 * pp then every tg test on one session.
 *
 * Columns: llama-bench's where they mean the same (model, size, params,
 * backend, threads, n_batch, test, t/s = mean ± sample stddev of the
 * repetitions' tokens per second), and strata's own:
 *   arena   "resident" (the file mapped) or the expert arena's size (--arena);
 *           "gpu SIZE" with --gpu-arena, "gpu SIZE + host SIZE" with
 *           --host-cache too (the host tier's arena as allocated)
 *   GB/s    weight bytes the forward touched (session_stats: expert_bytes +
 *           dense_bytes of the phase, summed over the timed repetitions)
 *           per second of evaluation
 *   MB/tok  bytes read from disk per token while streaming (the CPU's arena
 *           or the host tier under the GPU's; engine_stream_counters: bytes
 *           / rows of the phase); "-" resident
 *   lookups distinct layer-experts per prompt chunk, summed over layers, and
 *           its ratio to the expectation under uniform routing
 *           (session_stats expert_lookups / expert_lookups_uniform); pp only
 * -o json and -o csv also carry the samples, the bytes per token, the routed
 * expert matmul rate (2 x 3 x n_embd x n_ff_exp ops per routed row-slot,
 * whatever the weight type) over the whole evaluation (expert_gops) and over
 * the routed-expert jobs alone (expert_matmul_gops, with their share of the
 * time in expert_time_fraction), the stream counters, and with --gpu-arena
 * the GPU arena's: bytes copied host -> device per token and per second,
 * hits, misses, read-ahead copies and how many were used (gpu_*; null
 * without a GPU arena).
 *
 * Exit codes: 0 ok, 1 runtime error (model, evaluation), 2 usage. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "engine.h"
#include "gguf/gguf.h"
#include "quant/qtype.h"
#include "util/err.h"

#define CMD "bench"
#define MAX_LIST 64
#define MAX_REPS 1000
#define DEFAULT_MODEL "models/strata-ops-moe.gguf"

enum { OUT_MD = 0, OUT_JSON = 1, OUT_CSV = 2, OUT_NONE = 3 };

typedef struct int_list { int v[MAX_LIST]; int n; } int_list;

typedef struct bench_opts {
    const char *models[MAX_LIST];
    int         n_models;
    int_list    pp, tg, threads, batch;
    int         reps;
    int         out;         /* -o: stdout */
    int         out_err;     /* -oe: stderr (OUT_NONE: nothing) */
    int         warmup;
    int         verbose;
    uint64_t    seed;
    engine_opts st;          /* the expert-streaming flags */
} bench_opts;

/* What one model's header says (read with gguf, before any engine opens). */
typedef struct model_info {
    char     type[96];       /* "qwen3moe 16L 128x8 q4_K" */
    int64_t  n_embd, n_ff_exp;
} model_info;

/* One finished test: a row of every output format. */
typedef struct row {
    const char *path;
    const model_info *mi;
    uint64_t model_size, model_params;
    int      threads, n_batch, n_ubatch;
    int      streaming;
    const char *backend;   /* "CPU" or the device backend's name */
    uint64_t arena_bytes;
    uint64_t gpu_arena_bytes;   /* --gpu-arena (the device's expert arena), 0: none */
    int      n_prompt, n_gen;
    char     test[32];
    int      reps;
    double   samples_ns[MAX_REPS];
    double   avg_ts, stddev_ts, avg_ns, stddev_ns;
    double   total_s;
    session_stats st;                 /* summed over the timed repetitions */
    engine_stream_counters sc;        /* the same, streaming only */
    engine_gpu_stats gs;              /* the GPU arena's counters over the timed repetitions
                                         (gpu_arena_bytes > 0 only) */
    char     time_iso[32];
} row;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)   /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: strata bench [options]\n"
        "\n"
        "Prompt processing (ppN) and generation (tgN) speed, as llama-bench measures it.\n"
        "-m, -p, -n, -t and -b take a comma list or may be repeated;\n"
        "every combination of model, -b and -t runs every pp and tg test.\n"
        "\n"
        "  -m, --model FILE          GGUF model (default " DEFAULT_MODEL ")\n"
        "  -p, --n-prompt N          prompt test ppN: N random token ids as one prompt (default 512; 0: none)\n"
        "  -n, --n-gen N             generation test tgN: N single-token steps from an empty\n"
        "                            context (default 128; 0: none)\n"
        "  -r, --repetitions N       timed runs of each test (default 5)\n"
        "  -t, --threads N           threads (default: all online CPUs)\n"
        "  -b, --batch-size N        prompt chunk: rows per forward pass (default 2048, as\n"
        "                            llama.cpp's n_batch; at most the context, max of -p and -n)\n"
        "  -o, --output md|json|csv  output format on stdout (default md)\n"
        "  -oe, --output-err F       also print the results to stderr in format F (md, json,\n"
        "                            csv; default none), as llama-bench's -oe\n"
        "  --warmup / --no-warmup    one untimed run of each test first (default on)\n"
        "  --seed N                  seed of the random token ids (default 1)\n"
        "  -v, --verbose             the engine's load summary on stderr\n"
        "  -h, --help                this help\n"
        "\n"
        "Expert streaming (default: every expert resident, the file mapped):\n"
        "  --arena SIZE|auto|0       stream the routed experts through an arena of SIZE\n"
        "  --evict lru|lfu  --io auto|uring|pread  --io-threads N  --io-depth N\n"
        "  --read-ahead N  --read-ahead-from attn|input  --no-direct\n"
        "  --sidecar FILE  --no-sidecar  --profile FILE\n"
        "  --gpu, -ngl N  --gpu-arena SIZE  --host-cache SIZE\n"
        "                            as for strata run (see strata run --help)\n"
        "\n"
        "Columns: model size params backend threads n_batch arena test t/s (mean ± stddev),\n"
        "GB/s (weight bytes touched per second), MB/tok (read from disk per token when\n"
        "streaming), lookups (distinct layer-experts per prompt chunk, and its ratio to\n"
        "uniform routing's expectation).\n");
}

/* Append a comma list of whole numbers in [lo, hi] to l. */
static int parse_list(const char *flag, const char *v, long long lo, long long hi, int_list *l)
{
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char buf[32];
        long long x;
        if (len == 0 || len >= sizeof buf) goto bad;
        memcpy(buf, p, len);
        buf[len] = 0;
        if (cli_parse_int(buf, lo, hi, &x)) goto bad;
        if (l->n >= MAX_LIST) return cli_fail(CMD, CLI_USAGE, "%s: more than %d values", flag, MAX_LIST);
        l->v[l->n++] = (int)x;
        if (!c) return 0;
        p = c + 1;
    }
bad:
    return cli_fail(CMD, CLI_USAGE, "%s needs whole numbers from %lld to %lld (a comma list), got '%s'", flag, lo,
                    hi, v);
}

/* Returns 0, -1 after --help, or a CLI exit code. */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->reps = 5;
    o->out_err = OUT_NONE;
    o->warmup = 1;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_stream_flag(CMD, argc, argv, &i, &o->st);
        if (r < 0) return CLI_USAGE;
        if (r > 0) continue;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(CMD, argc, argv, &i))) return CLI_USAGE; } while (0)
        if (IS("-h") || IS("--help")) { usage(stdout); return -1; }
        else if (IS("-m") || IS("--model")) {
            VALUE();
            /* a comma list too (paths with commas: give -m once per file) */
            char *dup = strdup(v);
            if (!dup) return cli_fail(CMD, CLI_ERR, "out of memory");
            for (char *p = dup;;) {
                char *c = strchr(p, ',');
                if (c) *c = 0;
                if (!*p) return cli_fail(CMD, CLI_USAGE, "%s: empty model path in '%s'", a, v);
                if (o->n_models >= MAX_LIST) return cli_fail(CMD, CLI_USAGE, "more than %d models", MAX_LIST);
                o->models[o->n_models++] = p;   /* dup lives until exit */
                if (!c) break;
                p = c + 1;
            }
        } else if (IS("-p") || IS("--n-prompt")) {
            VALUE();
            if (parse_list(a, v, 0, 1 << 20, &o->pp)) return CLI_USAGE;
        } else if (IS("-n") || IS("--n-gen")) {
            VALUE();
            if (parse_list(a, v, 0, 1 << 20, &o->tg)) return CLI_USAGE;
        } else if (IS("-t") || IS("--threads")) {
            VALUE();
            if (parse_list(a, v, 1, 1024, &o->threads)) return CLI_USAGE;
        } else if (IS("-b") || IS("--batch-size")) {
            VALUE();
            if (parse_list(a, v, 1, 1 << 20, &o->batch)) return CLI_USAGE;
        } else if (IS("-r") || IS("--repetitions")) {
            long long x;
            VALUE();
            if (cli_parse_int(v, 1, MAX_REPS, &x))
                return cli_fail(CMD, CLI_USAGE, "%s needs a whole number from 1 to %d, got '%s'", a, MAX_REPS, v);
            o->reps = (int)x;
        } else if (IS("-o") || IS("--output") || IS("-oe") || IS("--output-err")) {
            const int err_out = IS("-oe") || IS("--output-err");
            int *dst = err_out ? &o->out_err : &o->out;
            VALUE();
            if (!strcmp(v, "md")) *dst = OUT_MD;
            else if (!strcmp(v, "json")) *dst = OUT_JSON;
            else if (!strcmp(v, "csv")) *dst = OUT_CSV;
            else if (err_out && !strcmp(v, "none")) *dst = OUT_NONE;
            else return cli_fail(CMD, CLI_USAGE, "%s must be md, json or csv%s, got '%s'", a, err_out ? " or none" : "", v);
        } else if (IS("--seed")) {
            long long x;
            VALUE();
            if (cli_parse_int(v, 0, (long long)UINT32_MAX, &x))
                return cli_fail(CMD, CLI_USAGE, "%s needs a whole number from 0 to %u, got '%s'", a, UINT32_MAX, v);
            o->seed = (uint64_t)x;
        } else if (IS("--warmup")) o->warmup = 1;
        else if (IS("--no-warmup")) o->warmup = 0;
        else if (IS("-v") || IS("--verbose")) o->verbose = 1;
        else {
            fprintf(stderr, "run 'strata bench --help' for the options\n");
            return cli_fail(CMD, CLI_USAGE, "unknown option '%s'", a);
        }
#undef IS
#undef VALUE
    }
    if (cli_stream_check(CMD, &o->st)) return CLI_USAGE;
    if (!o->n_models) o->models[o->n_models++] = DEFAULT_MODEL;
    if (!o->pp.n) o->pp.v[o->pp.n++] = 512;
    if (!o->tg.n) o->tg.v[o->tg.n++] = 128;
    if (!o->threads.n) o->threads.v[o->threads.n++] = 0;   /* the engine's default: all CPUs */
    if (!o->batch.n) o->batch.v[o->batch.n++] = 2048;
    int any = 0;
    for (int i = 0; i < o->pp.n; i++) any |= o->pp.v[i] > 0;
    for (int i = 0; i < o->tg.n; i++) any |= o->tg.v[i] > 0;
    if (!any) return cli_fail(CMD, CLI_USAGE, "nothing to run: every -p and -n is 0");
    return 0;
}

/* ---- model facts from the GGUF header ---- */

static int read_model_info(const char *path, model_info *mi)
{
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    memset(mi, 0, sizeof *mi);
    if (gguf_open(&f, path, &e)) return cli_fail(CMD, CLI_ERR, "%s", e.msg);
    gguf_str arch = { "?", 1 };
    gguf_get_str(f, "general.architecture", &arch, NULL);
    char a[32];
    snprintf(a, sizeof a, "%.*s", (int)(arch.n < 31 ? arch.n : 31), arch.p);
    char key[96];
    uint32_t n_layer = 0, n_exp = 0, n_used = 0;
    snprintf(key, sizeof key, "%s.block_count", a);
    gguf_get_u32(f, key, &n_layer, NULL);
    snprintf(key, sizeof key, "%s.expert_count", a);
    gguf_get_u32(f, key, &n_exp, NULL);
    snprintf(key, sizeof key, "%s.expert_used_count", a);
    gguf_get_u32(f, key, &n_used, NULL);
    const char *xt = "?";
    int64_t t = gguf_find_tensor(f, "blk.0.ffn_gate_exps.weight");
    if (t >= 0) {
        const gguf_tensor_info *ti = gguf_tensor(f, t);
        xt = qtype_name(ti->type);
        if (!xt) xt = "?";
        mi->n_embd = ti->ne[0];
        mi->n_ff_exp = ti->ne[1];
    }
    snprintf(mi->type, sizeof mi->type, "%s %uL %ux%u %s", a, n_layer, n_exp, n_used, xt);
    gguf_close(f);
    return 0;
}

/* ---- formatting ---- */

static void fmt_size(char *b, size_t cap, uint64_t bytes)
{
    const double x = (double)bytes;
    if (x >= 1024.0 * 1024 * 1024) snprintf(b, cap, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else snprintf(b, cap, "%.2f MiB", x / (1024.0 * 1024));
}

static void fmt_params(char *b, size_t cap, uint64_t n)
{
    const double x = (double)n;
    if (x >= 1e9) snprintf(b, cap, "%.2f B", x / 1e9);
    else snprintf(b, cap, "%.2f M", x / 1e6);
}

static void fmt_arena(char *b, size_t cap, const row *r)
{
    if (r->gpu_arena_bytes) {   /* "gpu SIZE": the device's expert arena; "+ host SIZE": the tier under it */
        char sz[32], hz[32];
        fmt_size(sz, sizeof sz, r->gpu_arena_bytes);
        if (r->streaming) {
            fmt_size(hz, sizeof hz, r->arena_bytes);
            snprintf(b, cap, "gpu %s + host %s", sz, hz);
        } else
            snprintf(b, cap, "gpu %s", sz);
    } else if (!r->streaming) snprintf(b, cap, "resident");
    else if (!r->arena_bytes) snprintf(b, cap, "0");
    else fmt_size(b, cap, r->arena_bytes);
}

static double weight_bytes(const row *r) { return (double)(r->st.expert_bytes + r->st.dense_bytes); }
static double ratio(double a, double b) { return b > 0 ? a / b : 0; }
static double expert_ops(const row *r)
{
    return 2.0 * 3.0 * (double)r->mi->n_embd * (double)r->mi->n_ff_exp * (double)r->st.expert_slots;
}

static const char *md_cols[] = { "model", "size", "params", "backend", "threads", "n_batch", "arena", "test",
                                 "t/s", "GB/s", "MB/tok", "lookups" };
static const int md_width[] = { 28, 10, 10, 7, 7, 7, 10, 7, 18, 7, 7, 16 };
static const int md_right[] = { 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1 };
#define N_MD (int)(sizeof md_cols / sizeof md_cols[0])

static void md_header(FILE *f)
{
    for (int c = 0; c < N_MD; c++) fprintf(f, "| %-*s ", md_width[c], md_cols[c]);
    fprintf(f, "|\n");
    for (int c = 0; c < N_MD; c++) {
        fprintf(f, "| ");
        for (int k = 0; k < md_width[c] - 1; k++) fputc('-', f);
        fputc(md_right[c] ? ':' : '-', f);
        fputc(' ', f);
    }
    fprintf(f, "|\n");
}

static void md_row(FILE *f, const row *r)
{
    char v[N_MD][128];
    snprintf(v[0], 128, "%s", r->mi->type);
    fmt_size(v[1], 128, r->model_size);
    fmt_params(v[2], 128, r->model_params);
    snprintf(v[3], 128, "%s", r->backend);
    snprintf(v[4], 128, "%d", r->threads);
    snprintf(v[5], 128, "%d", r->n_batch);
    fmt_arena(v[6], 128, r);
    snprintf(v[7], 128, "%s", r->test);
    snprintf(v[8], 128, "%.2f ± %.2f", r->avg_ts, r->stddev_ts);
    snprintf(v[9], 128, "%.2f", ratio(weight_bytes(r), r->total_s) / 1e9);
    if (r->streaming) snprintf(v[10], 128, "%.2f", ratio((double)r->sc.bytes, (double)r->sc.rows) / 1e6);
    else snprintf(v[10], 128, "-");
    if (r->n_prompt > 0 && r->st.chunks)
        snprintf(v[11], 128, "%.0f (%.2fx)", ratio((double)r->st.expert_lookups, (double)r->st.chunks),
                 ratio((double)r->st.expert_lookups, r->st.expert_lookups_uniform));
    else snprintf(v[11], 128, "-");
    for (int c = 0; c < N_MD; c++) {
        /* width in characters: "±" is two bytes */
        int w = md_width[c] + (strstr(v[c], "±") ? 1 : 0);
        if (md_right[c]) fprintf(f, "| %*s ", w, v[c]);
        else fprintf(f, "| %-*s ", w, v[c]);
    }
    fprintf(f, "|\n");
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* The fields of json and csv, in order. kind: 's' string, 'i' integer,
 * 'f' real, 'n' real or null. */
typedef struct field { const char *name; char kind; } field;
static const field k_fields[] = {
    { "model_filename", 's' }, { "model_type", 's' }, { "model_size", 'i' }, { "model_n_params", 'i' },
    { "backends", 's' }, { "n_batch", 'i' }, { "n_ubatch", 'i' }, { "n_threads", 'i' },
    { "arena", 's' }, { "arena_bytes", 'i' }, { "n_prompt", 'i' }, { "n_gen", 'i' }, { "test", 's' },
    { "test_time", 's' }, { "repetitions", 'i' },
    { "avg_ns", 'i' }, { "stddev_ns", 'i' }, { "avg_ts", 'f' }, { "stddev_ts", 'f' },
    { "weight_bytes_per_token", 'f' }, { "weight_gbs", 'f' },
    { "expert_bytes_per_token", 'f' }, { "dense_bytes_per_token", 'f' },
    { "chunks", 'i' }, { "expert_lookups_per_chunk", 'f' }, { "expert_lookups_uniform_per_chunk", 'f' },
    { "expert_lookups_ratio", 'f' }, { "expert_ops_per_token", 'f' }, { "expert_gops", 'f' },
    { "expert_time_fraction", 'f' }, { "expert_matmul_gops", 'f' },
    { "stream_bytes_per_token", 'n' }, { "stream_mb_per_token", 'n' }, { "stream_hits", 'n' },
    { "stream_misses", 'n' }, { "stream_ahead", 'n' }, { "stream_wait_ms", 'n' },
    { "gpu_h2d_bytes_per_token", 'n' }, { "gpu_h2d_gbs", 'n' }, { "gpu_arena_hits", 'n' },
    { "gpu_arena_misses", 'n' }, { "gpu_prefetched", 'n' }, { "gpu_prefetch_used", 'n' },
};
#define N_FIELDS (int)(sizeof k_fields / sizeof k_fields[0])

/* Tokens evaluated over the timed repetitions (prompt and generated). */
static int64_t n_tok_all(const row *r) { return (int64_t)(r->n_prompt + r->n_gen) * r->reps; }

/* Value of field i of r, as text (strings unquoted). Returns 0 for a null. */
static int field_value(const row *r, int i, char *b, size_t cap)
{
    const char *n = k_fields[i].name;
    const double rows = (double)r->st.rows, chunks = (double)r->st.chunks;
#define S(x) do { snprintf(b, cap, "%s", x); return 1; } while (0)
#define I(x) do { snprintf(b, cap, "%llu", (unsigned long long)(x)); return 1; } while (0)
#define F(x) do { snprintf(b, cap, "%.6f", (double)(x)); return 1; } while (0)
#define STREAM_F(x) do { if (!r->streaming) return 0; F(x); } while (0)
#define STREAM_I(x) do { if (!r->streaming) return 0; I(x); } while (0)
    if (!strcmp(n, "model_filename")) S(r->path);
    if (!strcmp(n, "model_type")) S(r->mi->type);
    if (!strcmp(n, "model_size")) I(r->model_size);
    if (!strcmp(n, "model_n_params")) I(r->model_params);
    if (!strcmp(n, "backends")) S(r->backend);
    if (!strcmp(n, "n_batch")) I(r->n_batch);
    if (!strcmp(n, "n_ubatch")) I(r->n_ubatch);
    if (!strcmp(n, "n_threads")) I(r->threads);
    if (!strcmp(n, "arena")) { fmt_arena(b, cap, r); return 1; }
    if (!strcmp(n, "arena_bytes")) I(r->arena_bytes);
    if (!strcmp(n, "n_prompt")) I(r->n_prompt);
    if (!strcmp(n, "n_gen")) I(r->n_gen);
    if (!strcmp(n, "test")) S(r->test);
    if (!strcmp(n, "test_time")) S(r->time_iso);
    if (!strcmp(n, "repetitions")) I(r->reps);
    if (!strcmp(n, "avg_ns")) I(llround(r->avg_ns));
    if (!strcmp(n, "stddev_ns")) I(llround(r->stddev_ns));
    if (!strcmp(n, "avg_ts")) F(r->avg_ts);
    if (!strcmp(n, "stddev_ts")) F(r->stddev_ts);
    if (!strcmp(n, "weight_bytes_per_token")) F(ratio(weight_bytes(r), rows));
    if (!strcmp(n, "weight_gbs")) F(ratio(weight_bytes(r), r->total_s) / 1e9);
    if (!strcmp(n, "expert_bytes_per_token")) F(ratio((double)r->st.expert_bytes, rows));
    if (!strcmp(n, "dense_bytes_per_token")) F(ratio((double)r->st.dense_bytes, rows));
    if (!strcmp(n, "chunks")) I(r->st.chunks / (uint64_t)(r->reps > 0 ? r->reps : 1));   /* per repetition */
    if (!strcmp(n, "expert_lookups_per_chunk")) F(ratio((double)r->st.expert_lookups, chunks));
    if (!strcmp(n, "expert_lookups_uniform_per_chunk")) F(ratio(r->st.expert_lookups_uniform, chunks));
    if (!strcmp(n, "expert_lookups_ratio")) F(ratio((double)r->st.expert_lookups, r->st.expert_lookups_uniform));
    if (!strcmp(n, "expert_ops_per_token")) F(ratio(expert_ops(r), rows));
    if (!strcmp(n, "expert_gops")) F(ratio(expert_ops(r), r->total_s) / 1e9);
    /* the routed-expert jobs alone: their share of the time and their rate */
    if (!strcmp(n, "expert_time_fraction")) F(ratio(r->st.expert_ms / 1e3, r->total_s));
    if (!strcmp(n, "expert_matmul_gops")) F(ratio(expert_ops(r), r->st.expert_ms / 1e3) / 1e9);
    if (!strcmp(n, "stream_bytes_per_token")) STREAM_F(ratio((double)r->sc.bytes, (double)r->sc.rows));
    if (!strcmp(n, "stream_mb_per_token")) STREAM_F(ratio((double)r->sc.bytes, (double)r->sc.rows) / 1e6);
    if (!strcmp(n, "stream_hits")) STREAM_I(r->sc.hits);
    if (!strcmp(n, "stream_misses")) STREAM_I(r->sc.misses);
    if (!strcmp(n, "stream_ahead")) STREAM_I(r->sc.ahead);
    if (!strcmp(n, "stream_wait_ms")) STREAM_F(r->sc.wait_ms);
#define GPU_F(x) do { if (!r->gpu_arena_bytes) return 0; F(x); } while (0)
#define GPU_I(x) do { if (!r->gpu_arena_bytes) return 0; I(x); } while (0)
    if (!strcmp(n, "gpu_h2d_bytes_per_token")) GPU_F(ratio((double)r->gs.bytes_h2d, (double)n_tok_all(r)));
    if (!strcmp(n, "gpu_h2d_gbs")) GPU_F(ratio((double)r->gs.bytes_h2d, r->total_s) / 1e9);
    if (!strcmp(n, "gpu_arena_hits")) GPU_I(r->gs.hits);
    if (!strcmp(n, "gpu_arena_misses")) GPU_I(r->gs.misses);
    if (!strcmp(n, "gpu_prefetched")) GPU_I(r->gs.prefetched);
    if (!strcmp(n, "gpu_prefetch_used")) GPU_I(r->gs.prefetch_used);
#undef GPU_F
#undef GPU_I
#undef S
#undef I
#undef F
#undef STREAM_F
#undef STREAM_I
    return 0;
}

static void json_row(FILE *f, const row *r, int first)
{
    fprintf(f, "%s  {\n", first ? "" : ",\n");
    char b[512];
    for (int i = 0; i < N_FIELDS; i++) {
        fprintf(f, "    \"%s\": ", k_fields[i].name);
        if (!field_value(r, i, b, sizeof b)) fprintf(f, "null");
        else if (k_fields[i].kind == 's') json_str(f, b);
        else fprintf(f, "%s", b);
        fprintf(f, ",\n");
    }
    fprintf(f, "    \"samples_ns\": [");
    for (int k = 0; k < r->reps; k++) fprintf(f, "%s%.0f", k ? ", " : " ", r->samples_ns[k]);
    fprintf(f, " ],\n    \"samples_ts\": [");
    const int n_tok = r->n_prompt + r->n_gen;
    for (int k = 0; k < r->reps; k++) fprintf(f, "%s%.6g", k ? ", " : " ", n_tok / (r->samples_ns[k] * 1e-9));
    fprintf(f, " ]\n  }");
}

static void csv_header(FILE *f)
{
    for (int i = 0; i < N_FIELDS; i++) fprintf(f, "%s%s", i ? "," : "", k_fields[i].name);
    fprintf(f, "\n");
}

static void csv_row(FILE *f, const row *r)
{
    char b[512];
    for (int i = 0; i < N_FIELDS; i++) {
        if (i) fputc(',', f);
        if (!field_value(r, i, b, sizeof b)) continue;   /* null: empty */
        fputc('"', f);
        for (const char *p = b; *p; p++) {
            if (*p == '"') fputc('"', f);
            fputc(*p, f);
        }
        fputc('"', f);
    }
    fprintf(f, "\n");
}

/* ---- running ---- */

static void stats_sub(session_stats *acc, const session_stats *a, const session_stats *b)
{
    acc->chunks += a->chunks - b->chunks;
    acc->rows += a->rows - b->rows;
    acc->moe_layers += a->moe_layers - b->moe_layers;
    acc->expert_slots += a->expert_slots - b->expert_slots;
    acc->expert_lookups += a->expert_lookups - b->expert_lookups;
    acc->expert_lookups_uniform += a->expert_lookups_uniform - b->expert_lookups_uniform;
    acc->expert_bytes += a->expert_bytes - b->expert_bytes;
    acc->dense_bytes += a->dense_bytes - b->dense_bytes;
    acc->expert_ms += a->expert_ms - b->expert_ms;
}

static void counters_sub(engine_stream_counters *acc, const engine_stream_counters *a,
                         const engine_stream_counters *b)
{
    acc->chunks += a->chunks - b->chunks;
    acc->rows += a->rows - b->rows;
    acc->lookups += a->lookups - b->lookups;
    acc->hits += a->hits - b->hits;
    acc->ahead += a->ahead - b->ahead;
    acc->misses += a->misses - b->misses;
    acc->streamed_in += a->streamed_in - b->streamed_in;
    acc->bytes += a->bytes - b->bytes;
    acc->host_ms += a->host_ms - b->host_ms;
    acc->wait_ms += a->wait_ms - b->wait_ms;
}

typedef struct ctx {
    engine  *eng;
    session *s;
    int32_t *ids;      /* max(pp) ids */
    float   *logits;   /* n_vocab */
    int32_t  n_vocab;
    int      bos;      /* first id, or -1 for a random one */
} ctx;

static void fill_ids(ctx *c, int32_t *ids, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(rng) % (uint64_t)c->n_vocab);
    if (n > 0 && c->bos >= 0) ids[0] = c->bos;
}

/* One run of a test: pp (n_prompt ids as one prompt) or tg (n_gen single
 * steps), from an empty context. *sec gets the evaluation's time. */
static int run_once(ctx *c, int n_prompt, int n_gen, uint64_t *rng, double *sec, err *e)
{
    session_truncate(c->s, 0);
    if (n_prompt > 0) {
        fill_ids(c, c->ids, n_prompt, rng);
        const double t0 = now_s();
        int r = session_eval(c->s, c->ids, n_prompt, c->logits, NULL, e);
        *sec = now_s() - t0;
        return r;
    }
    int32_t tok;
    fill_ids(c, &tok, 1, rng);
    const double t0 = now_s();
    for (int i = 0; i < n_gen; i++) {
        int r = session_eval(c->s, &tok, 1, c->logits, NULL, e);
        if (r) return r;
        tok = (int32_t)(rng_next(rng) % (uint64_t)c->n_vocab);
    }
    *sec = now_s() - t0;
    return 0;
}

static int run_test(ctx *c, const bench_opts *o, row *r, err *e)
{
    const int phase = r->n_prompt > 1 ? ENGINE_PHASE_PROMPT : ENGINE_PHASE_DECODE;
    uint64_t rng = o->seed * 0x2545F4914F6CDD1Dull + (uint64_t)r->n_prompt * 7919u + (uint64_t)r->n_gen;
    double sec;
    if (o->warmup) {
        int rc = run_once(c, r->n_prompt, r->n_prompt > 0 ? 0 : 1, &rng, &sec, e);
        if (rc) return rc;
    }
    memset(&r->st, 0, sizeof r->st);
    memset(&r->sc, 0, sizeof r->sc);
    memset(&r->gs, 0, sizeof r->gs);
    r->total_s = 0;
    double sum_ts = 0, sum_ns = 0;
    const int n_tok = r->n_prompt + r->n_gen;
    for (int k = 0; k < r->reps; k++) {
        session_stats s0, s1;
        engine_stream_counters c0, c1;
        engine_gpu_stats g0, g1;
        session_stats_get(c->s, phase, &s0);
        if (r->streaming) engine_stream_counters_get(c->eng, phase, &c0);
        if (r->gpu_arena_bytes) engine_backend_stats(c->eng, &g0);
        int rc = run_once(c, r->n_prompt, r->n_gen, &rng, &sec, e);
        if (rc) return rc;
        session_stats_get(c->s, phase, &s1);
        stats_sub(&r->st, &s1, &s0);
        if (r->streaming) {
            engine_stream_counters_get(c->eng, phase, &c1);
            counters_sub(&r->sc, &c1, &c0);
        }
        if (r->gpu_arena_bytes && engine_backend_stats(c->eng, &g1) == 0) {
            r->gs.hits += g1.hits - g0.hits;
            r->gs.misses += g1.misses - g0.misses;
            r->gs.bytes_h2d += g1.bytes_h2d - g0.bytes_h2d;
            r->gs.prefetched += g1.prefetched - g0.prefetched;
            r->gs.prefetch_used += g1.prefetch_used - g0.prefetch_used;
        }
        if (sec <= 0) sec = 1e-9;
        r->samples_ns[k] = sec * 1e9;
        r->total_s += sec;
        sum_ts += n_tok / sec;
        sum_ns += sec * 1e9;
    }
    const int n = r->reps;
    r->avg_ts = sum_ts / n;
    r->avg_ns = sum_ns / n;
    double v_ts = 0, v_ns = 0;
    for (int k = 0; k < n; k++) {
        const double ts = n_tok / (r->samples_ns[k] * 1e-9);
        v_ts += (ts - r->avg_ts) * (ts - r->avg_ts);
        v_ns += (r->samples_ns[k] - r->avg_ns) * (r->samples_ns[k] - r->avg_ns);
    }
    r->stddev_ts = n > 1 ? sqrt(v_ts / (n - 1)) : 0;
    r->stddev_ns = n > 1 ? sqrt(v_ns / (n - 1)) : 0;
    return 0;
}

static void iso_now(char *b, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(b, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Rows written to stdout (-o) and to stderr (-oe). */
static int n_rows_out, n_rows_err;

static void emit_to(FILE *f, int fmt, int *n, const row *r)
{
    if (fmt == OUT_MD) {
        if (!*n) md_header(f);
        md_row(f, r);
    } else if (fmt == OUT_JSON) {
        if (!*n) fprintf(f, "[\n");
        json_row(f, r, !*n);
    } else if (fmt == OUT_CSV) {
        if (!*n) csv_header(f);
        csv_row(f, r);
    }
    (*n)++;
    fflush(f);
}

static void emit(const bench_opts *o, const row *r)
{
    emit_to(stdout, o->out, &n_rows_out, r);
    if (o->out_err != OUT_NONE) emit_to(stderr, o->out_err, &n_rows_err, r);
}

/* One engine (model, batch, threads): every pp test, then every tg test. */
static int run_instance(const bench_opts *o, const char *path, const model_info *mi, int batch, int threads,
                        int n_ctx, row *r)
{
    err e;
    err_clear(&e);
    engine_opts eo = o->st;
    eo.model_path = path;
    eo.n_threads = threads;
    eo.n_ctx = n_ctx;
    eo.n_batch = batch;
    eo.verbose = o->verbose;
    ctx c = { 0 };
    int code = CLI_OK;
    int max_pp = 1;
    for (int i = 0; i < o->pp.n; i++) if (o->pp.v[i] > max_pp) max_pp = o->pp.v[i];
    if (engine_open(&c.eng, &eo, &e) || session_create(&c.s, c.eng, &e)) {
        code = cli_fail(CMD, CLI_ERR, "%s: %s", path, e.msg);
        goto done;
    }
    if (!o->verbose && engine_route_reads_residency(c.eng)) {   /* -v prints it in the load summary */
        char pol[512];
        engine_route_describe(c.eng, pol, sizeof pol);
        fprintf(stderr, "strata bench: routing %s depends on expert residency (the arena's state and I/O "
                "timing): its figures are not reproducible bit for bit\n", pol);
    }
    c.n_vocab = engine_n_vocab(c.eng);
    c.bos = engine_add_bos(c.eng) ? engine_token_bos(c.eng) : -1;
    c.ids = malloc((size_t)max_pp * sizeof *c.ids);
    c.logits = malloc((size_t)c.n_vocab * sizeof *c.logits);
    if (!c.ids || !c.logits || c.n_vocab <= 0) { code = cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }

    engine_memory mem;
    engine_memory_plan(c.eng, &mem);
    memset(r, 0, sizeof *r);
    r->path = path;
    r->mi = mi;
    r->model_size = engine_model_bytes(c.eng);
    r->model_params = engine_model_params(c.eng);
    r->threads = engine_n_threads(c.eng);
    r->n_batch = batch;
    r->n_ubatch = engine_n_batch(c.eng);
    r->streaming = engine_streaming(c.eng);
    r->backend = engine_backend_name(c.eng);
    r->arena_bytes = r->streaming ? mem.arena : 0;
    r->gpu_arena_bytes = o->st.gpu_arena_bytes;
    r->reps = o->reps;
    for (int kind = 0; kind < 2 && code == CLI_OK; kind++) {
        const int_list *l = kind == 0 ? &o->pp : &o->tg;
        for (int i = 0; i < l->n && code == CLI_OK; i++) {
            if (l->v[i] <= 0) continue;
            r->n_prompt = kind == 0 ? l->v[i] : 0;
            r->n_gen = kind == 1 ? l->v[i] : 0;
            snprintf(r->test, sizeof r->test, "%s%d", kind == 0 ? "pp" : "tg", l->v[i]);
            iso_now(r->time_iso, sizeof r->time_iso);
            if (run_test(&c, o, r, &e)) code = cli_fail(CMD, CLI_ERR, "%s %s: %s", path, r->test, e.msg);
            else emit(o, r);
        }
    }
done:
    free(c.ids);
    free(c.logits);
    session_free(c.s);
    engine_close(c.eng);
    return code;
}

int cmd_bench(int argc, char **argv);

int cmd_bench(int argc, char **argv)
{
    static bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) return CLI_OK;
    if (rc) return rc;

    /* every model's header first: a missing or broken file fails before any output */
    static model_info mi[MAX_LIST];
    for (int m = 0; m < o.n_models; m++)
        if (read_model_info(o.models[m], &mi[m])) return CLI_ERR;

    int n_ctx = 1;
    for (int i = 0; i < o.pp.n; i++) if (o.pp.v[i] > n_ctx) n_ctx = o.pp.v[i];
    for (int i = 0; i < o.tg.n; i++) if (o.tg.v[i] > n_ctx) n_ctx = o.tg.v[i];

    row *r = malloc(sizeof *r);
    if (!r) return cli_fail(CMD, CLI_ERR, "out of memory");
    int code = CLI_OK;
    for (int m = 0; m < o.n_models && code == CLI_OK; m++)
        for (int b = 0; b < o.batch.n && code == CLI_OK; b++)
            for (int t = 0; t < o.threads.n && code == CLI_OK; t++)
                code = run_instance(&o, o.models[m], &mi[m], o.batch.v[b], o.threads.v[t], n_ctx, r);
    free(r);
    if (o.out == OUT_JSON && n_rows_out) printf("\n]\n");
    if (o.out_err == OUT_JSON && n_rows_err) fprintf(stderr, "\n]\n");
    return code;
}

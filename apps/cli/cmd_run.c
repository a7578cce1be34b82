/* cmd_run: `strata run -m MODEL -p PROMPT [options]`, text generation as
 * llama-completion does it, and the option handling and setup that
 * `strata chat` shares (gen_main; cmd_chat.c supplies the chat loop).
 *
 * Output contract: stdout carries only the generated text, streamed token by
 * token (bytes as they come: a UTF-8 character split over two tokens is
 * written in two pieces); stderr gets the load summary, the sampler line and
 * one closing timing line. The prompt is tokenized with the model's add_bos
 * and with special tokens parsed, after llama.cpp's escape processing
 * (\n \r \t \' \" \\ \xNN; --no-escape turns it off).
 *
 * Stops at an end-of-generation token (unless --ignore-eos, which, like
 * llama.cpp, makes those tokens impossible), after -n tokens, or when the
 * context is full (llama.cpp stops once n_past + 1 reaches n_ctx and refuses
 * prompts longer than n_ctx - 4). Exit codes: 0 ok, 1 runtime error
 * (model, I/O, context), 2 usage.
 *
 * Expert streaming (--arena and friends, or --host-cache under --gpu
 * --gpu-arena) is an engine mode: the output is the same tokens; --trace (or
 * STRATA_TRACE=1) adds the expert-stream counters per phase to stderr at the
 * end (and the GPU arena's line), --report-json FILE writes them with the
 * timings, the memory plan, the peak RSS, the configuration and the GPU
 * arena's counters ("gpu", null on the CPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "util/err.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}


typedef struct gen_opts {
    const char  *model;
    const char  *prompt;        /* -p */
    const char  *prompt_file;   /* -f */
    int          n_predict;     /* -1: until EOG or the context is full */
    int          n_ctx, n_batch, n_threads;
    int          kv_k, kv_v;
    int          seed_set;
    sampler_opts so;
    int          ignore_eos;
    int          escape;
    const char  *chat_template; /* chat only */
    const char  *system_prompt; /* chat only */
    /* expert streaming */
    engine_opts  st;            /* the expert-streaming flags (cli_stream_flag) */
    const char  *arena_arg;     /* --arena as given, for the report */
    const char  *host_cache_arg;/* --host-cache as given, for the report */
    int          trace;
    const char  *report_json;
} gen_opts;

/* What run measured (for --report-json); chat leaves it zero. */
typedef struct gen_timing {
    size_t prompt_tokens;
    double prompt_ms;
    int    gen_tokens;
    double gen_ms;
} gen_timing;

static void usage(const char *cmd, FILE *out)
{
    int chat = !strcmp(cmd, "chat");
    if (chat)
        fprintf(out, "usage: strata chat -m MODEL [--chat-template NAME] [-sys TEXT] [-n N] [options]\n\n"
                     "Chat with the model on stdin (one line per user turn; EOF ends). The KV cache\n"
                     "is kept between turns: only the new part of the conversation is evaluated.\n\n");
    else
        fprintf(out, "usage: strata run -m MODEL (-p PROMPT | -f FILE) [-n N] [options]\n\n"
                     "Generate text; stdout gets only the generated text.\n\n");
    fprintf(out, "  -m, --model FILE          GGUF model\n");
    if (chat)
        fprintf(out, "  --chat-template NAME      use a built-in chat template instead of the model's\n"
                     "  -sys, --system-prompt T   system message\n"
                     "  -n, --n-predict N         tokens per reply (default -1: until end of turn)\n");
    else
        fprintf(out, "  -p, --prompt TEXT         prompt\n"
                     "  -f, --file FILE           read the prompt from FILE\n"
                     "  -n, --n-predict N         tokens to generate (default -1: until EOG or the context is full)\n"
                     "  --ignore-eos              never generate end-of-generation tokens\n"
                     "  -e, --escape / --no-escape  process \\n \\t \\xNN... in the prompt (default on)\n");
    fprintf(out, "  -c, --ctx-size N          context size (default 4096 or the model's if smaller; 0: the model's)\n"
                 "  -b, --batch-size N        prompt chunk, rows per forward pass (default 2048)\n"
                 "  -t, --threads N           threads (default: all CPUs)\n"
                 "  -s, --seed N              sampling seed (default: random)\n"
                 "  --temp F                  temperature (default 0.8; 0 = greedy)\n"
                 "  --top-k N                 top-k (default 40; 0 = off)\n"
                 "  --top-p F                 top-p (default 0.95; 1 = off)\n"
                 "  --min-p F                 min-p (default 0.05; 0 = off)\n"
                 "  --repeat-penalty F        repeat penalty (default 1.0 = off)\n"
                 "  --repeat-last-n N         tokens the penalty looks back (default 64; 0 off; -1 ctx)\n"
                 "  -ctk, --cache-type-k T    KV cache type for K: f16 (default) or f32\n"
                 "  -ctv, --cache-type-v T    KV cache type for V: f16 (default) or f32\n"
                 "  -h, --help                this help\n\n"
                 "Expert streaming (without --arena every expert stays resident: the file is mapped):\n"
                 "  --arena SIZE              stream the routed experts from disk through an arena of SIZE\n"
                 "                            (K/M/G suffixes); auto: 75%% of the available memory less the\n"
                 "                            resident part; 0: stream every lookup (I/O buffers only)\n"
                 "  --evict lru|lfu           eviction policy (default lru; lfu: frequency with aging)\n"
                 "  --io auto|uring|pread     I/O engine (default auto: io_uring when the kernel has it)\n"
                 "  --io-threads N            pread worker threads (default 4)\n"
                 "  --io-depth N              io_uring reads in flight (default 4)\n"
                 "  --read-ahead N            prefetch the next layer's top N experts per row (default 0: off);\n"
                 "                            with --gpu --gpu-arena: into the GPU's arena (through the host\n"
                 "                            cache when --host-cache is given)\n"
                 "  --read-ahead-from W       hidden state the next layer's router runs on: attn (after this\n"
                 "                            layer's attention, default) or input (this layer's input)\n"
                 "  --no-direct               buffered reads instead of O_DIRECT\n"
                 "  --sidecar FILE            expert sidecar (default MODEL.experts when present)\n"
                 "  --no-sidecar              read the experts from the GGUF even if a sidecar exists\n"
                 "  --profile FILE            fill the arena from a profile's top (strata profile) at start\n"
                 "  --gpu, -ngl N             run the forward on GPU 0 (build/cuda/strata; -ngl 0: the CPU)\n"
                 "  --gpu-arena SIZE          with --gpu: keep only SIZE of routed experts in VRAM, the rest\n"
                 "                            copied from host memory on a miss (default: all in VRAM)\n"
                 "  --host-cache SIZE         with --gpu --gpu-arena: a pinned host-RAM tier of SIZE between the\n"
                 "                            GPU arena and the SSD, filled by the expert I/O engine (--io,\n"
                 "                            --evict, --sidecar, --profile ... apply; default: misses copy\n"
                 "                            from the mapped file)\n"
                 "  --trace                   expert-stream counters per phase on stderr (or STRATA_TRACE=1)\n"
                 "  --report-json FILE        counters, timings, memory and configuration as JSON\n\n"
                 "Routing (docs/ROUTING.md; default exact, or STRATA_ROUTE):\n"
                 "  --route SPEC              e.g. 'prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,\n"
                 "                            exact-last=32); decode=exact'; a bias arm makes routing\n"
                 "                            depend on expert residency (not reproducible bit for bit)\n");
}

static int parse_kv_type(const char *cmd, const char *flag, const char *v, int *out)
{
    if (!strcmp(v, "f16")) { *out = ENGINE_KV_F16; return 0; }
    if (!strcmp(v, "f32")) { *out = ENGINE_KV_F32; return 0; }
    return cli_fail(cmd, CLI_USAGE, "%s must be f16 or f32, got '%s'", flag, v);
}

enum { HELP_SHOWN = 100 };

/* Returns 0, HELP_SHOWN, or a CLI exit code to stop with. */
static int parse_args(const char *cmd, int argc, char **argv, gen_opts *o)
{
    const int chat = !strcmp(cmd, "chat");
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->so = sampler_default_opts();
    o->escape = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        const char *v = NULL;
        long long n;
        double d;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(cmd, argc, argv, &i))) return CLI_USAGE; } while (0)
#define INT(lo, hi, dst) do { VALUE(); if (cli_parse_int(v, lo, hi, &n)) \
        return cli_fail(cmd, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                        (long long)(lo), (long long)(hi), v); dst = (int)n; } while (0)
#define FLT(lo, hi, dst) do { VALUE(); if (cli_parse_float(v, &d) || d < (lo) || d > (hi)) \
        return cli_fail(cmd, CLI_USAGE, "%s needs a number from %g to %g, got '%s'", a, \
                        (double)(lo), (double)(hi), v); dst = (float)d; } while (0)
        if (IS("-h") || IS("--help")) { usage(cmd, stdout); return HELP_SHOWN; }
        else if (IS("-m") || IS("--model")) { VALUE(); o->model = v; }
        else if (!chat && (IS("-p") || IS("--prompt"))) { VALUE(); o->prompt = v; }
        else if (!chat && (IS("-f") || IS("--file"))) { VALUE(); o->prompt_file = v; }
        else if (IS("-n") || IS("--n-predict") || IS("--predict")) INT(-2, 1000000000, o->n_predict);
        else if (IS("-c") || IS("--ctx-size")) {
            INT(0, 1 << 24, o->n_ctx);
            if (o->n_ctx == 0) o->n_ctx = ENGINE_CTX_TRAIN;   /* -c 0: the model's context, as llama.cpp */
        }
        else if (IS("-b") || IS("--batch-size") || IS("-ub") || IS("--ubatch-size")) INT(1, 1 << 20, o->n_batch);
        else if (IS("-t") || IS("--threads")) INT(1, 1024, o->n_threads);
        else if (IS("-s") || IS("--seed")) {
            VALUE();
            if (cli_parse_int(v, -1, 4294967295LL, &n))
                return cli_fail(cmd, CLI_USAGE, "%s needs a whole number from -1 to 4294967295, got '%s'", a, v);
            if (n >= 0 && n != 4294967295LL) { o->so.seed = (uint32_t)n; o->seed_set = 1; }  /* -1 = random, as llama.cpp */
        }
        else if (IS("--temp")) FLT(-1e9, 1e9, o->so.temp);
        else if (IS("--top-k")) INT(-1, 1 << 30, o->so.top_k);
        else if (IS("--top-p")) FLT(0.0, 1.0, o->so.top_p);
        else if (IS("--min-p")) FLT(0.0, 1.0, o->so.min_p);
        else if (IS("--repeat-penalty")) FLT(1e-6, 1e9, o->so.repeat_penalty);
        else if (IS("--repeat-last-n")) INT(-1, 1 << 30, o->so.repeat_last_n);
        else if (!chat && IS("--ignore-eos")) o->ignore_eos = 1;
        else if (!chat && (IS("-e") || IS("--escape"))) o->escape = 1;
        else if (!chat && IS("--no-escape")) o->escape = 0;
        else if (IS("-ctk") || IS("--cache-type-k")) { VALUE(); if (parse_kv_type(cmd, a, v, &o->kv_k)) return CLI_USAGE; }
        else if (IS("-ctv") || IS("--cache-type-v")) { VALUE(); if (parse_kv_type(cmd, a, v, &o->kv_v)) return CLI_USAGE; }
        else if ((r = cli_stream_flag(cmd, argc, argv, &i, &o->st)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!strcmp(a, "--arena")) o->arena_arg = argv[i];
            if (!strcmp(a, "--host-cache")) o->host_cache_arg = argv[i];
        }
        else if (IS("--trace")) o->trace = 1;
        else if (IS("--report-json")) { VALUE(); o->report_json = v; }
        else if (chat && IS("--chat-template")) { VALUE(); o->chat_template = v; }
        else if (chat && (IS("-sys") || IS("--system-prompt"))) { VALUE(); o->system_prompt = v; }
        else return cli_fail(cmd, CLI_USAGE, "unknown option '%s' (see strata %s --help)", a, cmd);
#undef IS
#undef VALUE
#undef INT
#undef FLT
    }
    if (!o->model) return cli_fail(cmd, CLI_USAGE, "no model given (-m MODEL)");
    if (!chat && !o->prompt && !o->prompt_file) return cli_fail(cmd, CLI_USAGE, "no prompt given (-p TEXT or -f FILE)");
    if (!chat && o->prompt && o->prompt_file) return cli_fail(cmd, CLI_USAGE, "give -p or -f, not both");
    if (cli_stream_check(cmd, &o->st)) return CLI_USAGE;
    const char *env_trace = getenv("STRATA_TRACE");
    if (env_trace && *env_trace && strcmp(env_trace, "0") != 0) o->trace = 1;
    return 0;
}

/* llama.cpp's string_process_escapes, in place. */
static void process_escapes(char *s)
{
    size_t o = 0, n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            switch (c) {
            case 'n':  s[o++] = '\n'; break;
            case 'r':  s[o++] = '\r'; break;
            case 't':  s[o++] = '\t'; break;
            case '\'': s[o++] = '\''; break;
            case '"':  s[o++] = '"'; break;
            case '\\': s[o++] = '\\'; break;
            case 'x':
                if (i + 2 < n) {
                    char hx[3] = { s[i + 1], s[i + 2], 0 }, *end;
                    long val = strtol(hx, &end, 16);
                    if (end == hx + 2) { i += 2; s[o++] = (char)val; break; }
                }
                /* fall through */
            default:   s[o++] = '\\'; s[o++] = c; break;
            }
        } else {
            s[o++] = s[i];
        }
    }
    s[o] = '\0';
}

/* Generate after the prompt for `strata run`. */
static int run_generate(const char *cmd, engine *eng, session *s, sampler *sm, const gen_opts *o, char *text,
                        gen_timing *tm)
{
    err e;
    err_clear(&e);
    const int n_ctx = engine_n_ctx(eng);
    const int32_t V = engine_n_vocab(eng);
    int rc = CLI_ERR;
    int32_t *ids = NULL, *eog = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (o->escape) process_escapes(text);
    size_t len = strlen(text), n_ids = 0;
    size_t cap = len + 8;
    ids = malloc(sizeof(int32_t) * cap);
    if (!logits || !ids) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
    if (engine_tokenize(eng, text, len, engine_add_bos(eng), 1, ids, cap, &n_ids, &e) != 0) {
        cli_fail(cmd, CLI_ERR, "tokenizing the prompt: %s", e.msg);
        goto done;
    }
    if (n_ids == 0) {
        if (engine_token_bos(eng) < 0) { cli_fail(cmd, CLI_ERR, "the prompt is empty"); goto done; }
        ids[n_ids++] = engine_token_bos(eng);   /* llama.cpp starts an empty prompt from BOS */
    }
    if ((long)n_ids > n_ctx - 4) {
        cli_fail(cmd, CLI_ERR, "prompt is too long (%zu tokens, the context of %d allows %d)", n_ids, n_ctx, n_ctx - 4);
        goto done;
    }
    /* --ignore-eos: llama.cpp biases every end-of-generation token to -inf */
    int n_eog = 0;
    if (o->ignore_eos) {
        eog = malloc(sizeof(int32_t) * (size_t)V);
        if (!eog) { cli_fail(cmd, CLI_ERR, "out of memory"); goto done; }
        for (int32_t t = 0; t < V; t++) if (engine_token_is_eog(eng, t)) eog[n_eog++] = t;
    }

    for (size_t i = 0; i < n_ids; i++) sampler_accept(sm, ids[i]);
    const double t0 = now_ms();
    if (session_eval(s, ids, (int)n_ids, logits, NULL, &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
    const double t1 = now_ms();

    int n_gen = 0, ctx_full = 0;
    char piece[256];
    while (o->n_predict < 0 || n_gen < o->n_predict) {
        for (int k = 0; k < n_eog; k++) logits[eog[k]] = -INFINITY;
        int32_t id = sampler_sample(sm, logits);
        sampler_accept(sm, id);
        if (engine_token_is_eog(eng, id)) break;
        int np = engine_token_piece(eng, id, 0, piece, sizeof piece);
        if (np > (int)sizeof piece) np = (int)sizeof piece;
        if (np > 0) fwrite(piece, 1, (size_t)np, stdout);
        fflush(stdout);
        n_gen++;
        if (o->n_predict >= 0 && n_gen >= o->n_predict) break;
        if (session_n_past(s) + 1 >= n_ctx) { ctx_full = 1; break; }
        if (session_eval(s, &id, 1, logits, NULL, &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
    }
    const double t2 = now_ms();
    fflush(stdout);
    *tm = (gen_timing){ n_ids, t1 - t0, n_gen, t2 - t1 };
    /* The generated text ends without a newline (stdout carries only the
     * model's bytes); on a terminal, start the timing line on its own line. */
    if (n_gen > 0 && isatty(STDOUT_FILENO)) fputc('\n', stderr);
    if (ctx_full) fprintf(stderr, "\nstrata %s: context full (%d tokens), stopping\n", cmd, n_ctx);
    fprintf(stderr, "strata %s: load %.1f ms, prompt %zu tokens in %.1f ms (%.2f tok/s), "
            "generated %d tokens in %.1f ms (%.2f tok/s)\n", cmd, engine_load_ms(eng), n_ids, t1 - t0,
            t1 > t0 ? 1e3 * (double)n_ids / (t1 - t0) : 0.0, n_gen, t2 - t1,
            t2 > t1 ? 1e3 * n_gen / (t2 - t1) : 0.0);
    rc = CLI_OK;
done:
    free(logits);
    free(ids);
    free(eog);
    return rc;
}

/* ==== --report-json ==== */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* VmHWM / VmRSS of this process in bytes (0 when unknown). */
static uint64_t proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') { sscanf(line + n + 1, "%llu", &kb); break; }
    fclose(f);
    return (uint64_t)kb * 1024;
}

static int write_report(const char *cmd, const char *path, int argc, char **argv, engine *eng, const gen_opts *o,
                        const gen_timing *tm, int ok)
{
    FILE *f = fopen(path, "w");
    if (!f) return cli_fail(cmd, CLI_ERR, "cannot write %s", path);
    engine_memory m;
    engine_memory_plan(eng, &m);
    fprintf(f, "{\n  \"strata_report\": 1,\n  \"command\": ");
    json_str(f, cmd);
    fprintf(f, ",\n  \"argv\": [");
    for (int i = 0; i < argc; i++) { if (i) fputs(", ", f); json_str(f, argv[i]); }
    fprintf(f, "],\n  \"ok\": %s,\n  \"model\": ", ok ? "true" : "false");
    json_str(f, o->model);
    fprintf(f, ",\n  \"model_desc\": ");
    json_str(f, engine_model_desc(eng));
    fprintf(f, ",\n  \"config\": {\"threads\": %d, \"ctx\": %d, \"batch\": %d, \"streaming\": %s, \"arena\": ",
            engine_n_threads(eng), engine_n_ctx(eng), engine_n_batch(eng), m.streaming ? "true" : "false");
    json_str(f, o->arena_arg ? o->arena_arg : "resident");
    fprintf(f, ", \"read_ahead_from\": \"%s\", \"backend\": ", o->st.read_ahead_from == ENGINE_RA_INPUT ? "input" : "attn");
    json_str(f, engine_backend_name(eng));
    fprintf(f, ", \"gpu_arena_bytes\": %llu, \"host_cache\": ", (unsigned long long)o->st.gpu_arena_bytes);
    if (o->host_cache_arg) json_str(f, o->host_cache_arg);
    else fputs("null", f);
    fputs("},\n", f);
    fprintf(f, "  \"timings\": {\"load_ms\": %.3f, \"prompt_tokens\": %zu, \"prompt_ms\": %.3f, \"prompt_tok_s\": %.4f, "
            "\"generated_tokens\": %d, \"gen_ms\": %.3f, \"gen_tok_s\": %.4f},\n", engine_load_ms(eng),
            tm->prompt_tokens, tm->prompt_ms, tm->prompt_ms > 0 ? 1e3 * (double)tm->prompt_tokens / tm->prompt_ms : 0.0,
            tm->gen_tokens, tm->gen_ms, tm->gen_ms > 0 ? 1e3 * tm->gen_tokens / tm->gen_ms : 0.0);
    fprintf(f, "  \"memory\": {\"weights\": %llu, \"arena\": %llu, \"kv\": %llu, \"scratch\": %llu, "
            "\"planned_total\": %llu, \"rss_peak\": %llu, \"rss\": %llu},\n",
            (unsigned long long)m.weights, (unsigned long long)m.arena, (unsigned long long)m.kv,
            (unsigned long long)m.scratch, (unsigned long long)m.total,
            (unsigned long long)proc_status_kb("VmHWM"), (unsigned long long)proc_status_kb("VmRSS"));
    fprintf(f, "  \"route\": ");
    engine_route_report_json(eng, f, "  ");
    fprintf(f, ",\n  \"stream\": ");
    engine_stream_report_json(eng, f, "  ");
    engine_gpu_stats gs;   /* the device's expert arena, null on the CPU */
    if (engine_backend_stats(eng, &gs) == 0)
        fprintf(f, ",\n  \"gpu\": {\"slots\": %d, \"hits\": %llu, \"misses\": %llu, \"bytes_h2d\": %llu, "
                "\"prefetched\": %llu, \"prefetch_used\": %llu, \"pinned_bytes\": %llu}",
                gs.n_slots, (unsigned long long)gs.hits, (unsigned long long)gs.misses,
                (unsigned long long)gs.bytes_h2d, (unsigned long long)gs.prefetched,
                (unsigned long long)gs.prefetch_used, (unsigned long long)gs.pinned_bytes);
    else
        fputs(",\n  \"gpu\": null", f);
    fprintf(f, "\n}\n");
    if (fclose(f) != 0) return cli_fail(cmd, CLI_ERR, "cannot write %s", path);
    return CLI_OK;
}

int gen_main(const char *cmd, int argc, char **argv)
{
    gen_opts o;
    int rc = parse_args(cmd, argc, argv, &o);
    if (rc == HELP_SHOWN) return CLI_OK;
    if (rc) return rc;

    char *text = NULL;
    if (o.prompt_file) {
        if (!(text = cli_read_file(cmd, o.prompt_file, NULL))) return CLI_ERR;
    } else if (o.prompt) {
        if (!(text = strdup(o.prompt))) return cli_fail(cmd, CLI_ERR, "out of memory");
    }

    err e;
    err_clear(&e);
    engine_opts eo = o.st;   /* the streaming options, then the rest */
    eo.model_path = o.model;
    eo.n_threads = o.n_threads;
    eo.n_ctx = o.n_ctx;
    eo.n_batch = o.n_batch;
    eo.kv_type_k = o.kv_k;
    eo.kv_type_v = o.kv_v;
    eo.verbose = 1;
    eo.log = stderr;
    gen_timing tm = { 0 };
    engine *eng = NULL;
    session *s = NULL;
    sampler *sm = NULL;
    rc = CLI_ERR;
    if (engine_open(&eng, &eo, &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
    if (session_create(&s, eng, &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
    fprintf(stderr, "strata %s: session holds %.1f MB (KV cache and forward scratch, allocated once)\n", cmd,
            (double)session_bytes(s) / 1e6);
    if (!o.seed_set) o.so.seed = (uint32_t)time(NULL) ^ (uint32_t)getpid() * 2654435761u;
    if (o.so.repeat_last_n < 0) o.so.repeat_last_n = engine_n_ctx(eng);   /* -1: the whole context */
    if (sampler_open(&sm, &o.so, engine_n_vocab(eng), &e) != 0) { cli_fail(cmd, CLI_ERR, "%s", e.msg); goto done; }
    if (o.so.temp <= 0.0f)
        fprintf(stderr, "strata %s: sampling greedy (temp %.2f), repeat penalty %.2f over %d\n", cmd,
                (double)o.so.temp, (double)o.so.repeat_penalty, o.so.repeat_last_n);
    else
        fprintf(stderr, "strata %s: sampling seed %u, temp %.2f, top-k %d, top-p %.2f, min-p %.2f, "
                "repeat penalty %.2f over %d\n", cmd, o.so.seed, (double)o.so.temp, o.so.top_k,
                (double)o.so.top_p, (double)o.so.min_p, (double)o.so.repeat_penalty, o.so.repeat_last_n);
    if (!strcmp(cmd, "chat"))
        rc = chat_loop(eng, s, sm, o.chat_template, o.system_prompt, o.n_predict);
    else
        rc = run_generate(cmd, eng, s, sm, &o, text, &tm);
    if (o.trace) { engine_stream_trace(eng, stderr); engine_route_trace(eng, stderr); }
    if (o.report_json) {
        int wr = write_report(cmd, o.report_json, argc, argv, eng, &o, &tm, rc == CLI_OK);
        if (rc == CLI_OK) rc = wr;
    }
done:
    sampler_close(sm);
    session_free(s);
    engine_close(eng);
    free(text);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    return gen_main("run", argc, argv);
}

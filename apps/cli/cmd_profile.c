/* cmd_profile: `strata profile -m MODEL -f CORPUS -o PROFILE [-n N] [-c N]`,
 * count which layer-experts a model routes to on a corpus, prompt and
 * decode apart, and write the ranked profile (format: src/expert/profile.h)
 * that `--profile` warms the expert arena from.
 *
 * How: the corpus is tokenized once and cut into prompts of -c tokens (a BOS
 * first when the model wants one). Each prompt is evaluated in a fresh
 * context (phase "prompt"), then -n tokens are decoded greedily from it
 * (phase "decode"). The engine's routing observer (engine_opts.on_route)
 * reports every layer's choices to a profile_counts.
 *
 * Prompts are evaluated asking for every row's logits (all_logits), so
 * that the forward routes every row in every layer (with only the last
 * row's logits wanted it skips the last layer's MoE for the other rows).
 * The profile is thus a property of the model and the corpus, not of the
 * engine's chunking, and its totals are exact: prompt lookups = prompt
 * tokens x n_layer x k, the same for decode. The price is the output head
 * for every prompt row (about n_vocab*n_embd multiply-adds a row). Rows go
 * in slices of PROMPT_SLICE to keep the logits buffer small.
 *
 * --arena streams the experts while profiling (a model larger than memory);
 * routing, and so the profile, is the same byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "expert/profile.h"
#include "gguf/gguf.h"

int cmd_profile(int argc, char **argv);

#define PROMPT_SLICE 32

static void usage(FILE *f)
{
    fprintf(f,
        "usage: strata profile -m MODEL -f CORPUS -o PROFILE [options]\n"
        "\n"
        "Count layer-expert use on a text corpus, prompt and decode kept apart, and write\n"
        "a ranked profile for `--profile` (arena warm fill).\n"
        "\n"
        "  -m, --model PATH     GGUF model (required)\n"
        "  -f, --file PATH      corpus text (required)\n"
        "  -o, --output PATH    profile to write (required)\n"
        "  -c, --ctx-size N     prompt tokens per prompt (default 256)\n"
        "  -n, --n-predict N    tokens decoded greedily after each prompt (default 16; 0: none)\n"
        "  --max-prompts N      stop after N prompts (default: the whole corpus)\n"
        "  -t, --threads N      compute threads (default: all CPUs)\n"
        "  --arena SIZE|auto    stream the routed experts through an arena of SIZE (K/M/G) or\n"
        "                       auto, for models larger than memory (default: all resident)\n"
        "  -q, --quiet          no progress bar, no summary\n");
}



/* The observer's context: the counters and the phase being evaluated (set
 * by the loop below before each session_eval; the engine does not know
 * phases). */
typedef struct route_ctx {
    profile_counts *pc;
    int             phase;
} route_ctx;

static void on_route(void *ctx, int layer, const int32_t *experts, int n_rows, int k)
{
    route_ctx *r = (route_ctx *)ctx;
    profile_counts_route(r->pc, r->phase, layer, experts, n_rows, k);
}

static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One prompt and its decode. logits: PROMPT_SLICE x n_vocab floats. */
static int profile_one(session *s, route_ctx *rc, const int32_t *ids, int n, int n_predict, float *logits,
                       int32_t n_vocab, err *e)
{
    session_truncate(s, 0);
    rc->phase = PROFILE_PROMPT;
    int last_rows = 0;
    for (int i = 0; i < n; i += PROMPT_SLICE) {
        const int m = n - i < PROMPT_SLICE ? n - i : PROMPT_SLICE;
        int r = session_eval(s, ids + i, m, NULL, logits, e);
        if (r) return r;
        last_rows = m;
    }
    profile_counts_tokens(rc->pc, PROFILE_PROMPT, (uint64_t)n);
    const float *lg = logits + (size_t)(last_rows - 1) * (size_t)n_vocab;
    rc->phase = PROFILE_DECODE;
    for (int t = 0; t < n_predict; t++) {
        int32_t next = argmax(lg, n_vocab);
        int r = session_eval(s, &next, 1, logits, NULL, e);
        if (r) return r;
        lg = logits;
        profile_counts_tokens(rc->pc, PROFILE_DECODE, 1);
    }
    return 0;
}

static int run_profile(const char *model, const char *corpus, const char *outp, int n_ctx_prompt, int n_predict,
                       long long max_prompts, int n_threads, const char *arena, int quiet)
{
    const double t0 = now_s();
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    profile_counts *pc = NULL;
    if (gguf_open(&f, model, &e) || profile_counts_open(&pc, f, &e)) {
        gguf_close(f);
        return cli_fail("profile", CLI_ERR, "%s", e.msg);
    }
    gguf_close(f);

    size_t text_len = 0;
    char *text = cli_read_file("profile", corpus, &text_len);
    if (!text) { profile_counts_close(pc); return CLI_ERR; }

    route_ctx rc = { pc, PROFILE_PROMPT };
    engine_opts eo = {
        .model_path = model,
        .n_threads = n_threads,
        .n_ctx = n_ctx_prompt + n_predict,
        .on_route = on_route,
        .on_route_ctx = &rc,
    };
    if (arena) {   /* validated by cmd_profile */
        eo.stream = 1;
        if (!strcmp(arena, "auto")) eo.arena_auto = 1;
        else cli_parse_size(arena, &eo.arena_bytes);
    }
    engine *eng = NULL;
    session *s = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int code = CLI_OK;
    if (engine_open(&eng, &eo, &e) || session_create(&s, eng, &e)) { code = cli_fail("profile", CLI_ERR, "%s", e.msg); goto done; }

    /* Tokenize the whole corpus once, without BOS (each prompt gets its own). */
    const size_t cap = text_len + 16;
    size_t n_ids = 0;
    ids = malloc(cap * sizeof *ids);
    const int32_t n_vocab = engine_n_vocab(eng);
    logits = malloc((size_t)PROMPT_SLICE * (size_t)n_vocab * sizeof *logits);
    if (!ids || !logits) { code = cli_fail("profile", CLI_ERR, "out of memory"); goto done; }
    if (engine_tokenize(eng, text, text_len, 0, 0, ids, cap, &n_ids, &e)) {
        code = cli_fail("profile", CLI_ERR, "%s: %s", corpus, e.msg);
        goto done;
    }
    if (n_ids == 0) { code = cli_fail("profile", CLI_ERR, "%s: no tokens", corpus); goto done; }

    const int bos = engine_add_bos(eng) && engine_token_bos(eng) >= 0;
    const int per = n_ctx_prompt - bos;   /* corpus tokens per prompt */
    if (per < 1) { code = cli_fail("profile", CLI_USAGE, "-c %d leaves no room after BOS", n_ctx_prompt); goto done; }
    int32_t *prompt = malloc((size_t)n_ctx_prompt * sizeof *prompt);
    if (!prompt) { code = cli_fail("profile", CLI_ERR, "out of memory"); goto done; }
    long long n_prompts = 0;
    const int show = !quiet && isatty(2);   /* a status line on a terminal only */
    for (size_t off = 0; off < n_ids && (max_prompts <= 0 || n_prompts < max_prompts); off += (size_t)per) {
        const int take = n_ids - off < (size_t)per ? (int)(n_ids - off) : per;
        int n = 0;
        if (bos) prompt[n++] = engine_token_bos(eng);
        memcpy(prompt + n, ids + off, (size_t)take * sizeof *prompt);
        n += take;
        if (profile_one(s, &rc, prompt, n, n_predict, logits, n_vocab, &e)) {
            code = cli_fail("profile", CLI_ERR, "%s", e.msg);
            break;
        }
        n_prompts++;
        if (show)
            fprintf(stderr, "\rprofile: %lld prompts, %zu/%zu corpus tokens", n_prompts, off + (size_t)take, n_ids);
    }
    if (show) fputc('\n', stderr);
    free(prompt);
    if (code == CLI_OK && profile_write(pc, outp, &e)) code = cli_fail("profile", CLI_ERR, "%s", e.msg);
    if (code == CLI_OK && !quiet)
        printf("profile: %lld prompts, %llu prompt + %llu decoded tokens, %llu + %llu layer-expert lookups "
               "-> '%s' in %.2f s\n", n_prompts, (unsigned long long)profile_counts_n_tokens(pc, PROFILE_PROMPT),
               (unsigned long long)profile_counts_n_tokens(pc, PROFILE_DECODE),
               (unsigned long long)profile_counts_lookups(pc, PROFILE_PROMPT),
               (unsigned long long)profile_counts_lookups(pc, PROFILE_DECODE), outp, now_s() - t0);
done:
    free(ids);
    free(logits);
    free(text);
    session_free(s);
    engine_close(eng);
    profile_counts_close(pc);
    return code;
}


int cmd_profile(int argc, char **argv)
{
    const char *model = NULL, *corpus = NULL, *outp = NULL, *arena = NULL;
    long long c = 256, n = 16, max_prompts = 0, threads = 0;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { quiet = 1; continue; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(corpus = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(outp = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 2, 1 << 20, &c))
                return cli_fail("profile", CLI_USAGE, "%s needs an integer in [2, %d], got '%s'", a, 1 << 20, v);
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 0, 1 << 20, &n))
                return cli_fail("profile", CLI_USAGE, "%s needs an integer in [0, %d], got '%s'", a, 1 << 20, v);
        } else if (!strcmp(a, "--max-prompts")) {
            if (!(v = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 1, 1ll << 40, &max_prompts))
                return cli_fail("profile", CLI_USAGE, "%s needs a positive integer, got '%s'", a, v);
        } else if (!strcmp(a, "--arena")) {
            uint64_t sz;
            if (!(arena = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
            if (strcmp(arena, "auto") && cli_parse_size(arena, &sz))
                return cli_fail("profile", CLI_USAGE, "--arena needs a size (K/M/G suffixes), 0 or auto, got '%s'",
                                arena);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value("profile", argc, argv, &i))) return CLI_USAGE;
            if (cli_parse_int(v, 1, 1024, &threads))
                return cli_fail("profile", CLI_USAGE, "%s needs an integer in [1, 1024], got '%s'", a, v);
        } else {
            usage(stderr);
            return cli_fail("profile", CLI_USAGE, "unknown option '%s'", a);
        }
    }
    if (!model || !corpus || !outp) {
        usage(stderr);
        return cli_fail("profile", CLI_USAGE, "-m MODEL, -f CORPUS and -o PROFILE are required");
    }
    return run_profile(model, corpus, outp, (int)c, (int)n, max_prompts, (int)threads, arena, quiet);
}

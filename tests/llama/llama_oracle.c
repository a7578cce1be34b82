/* llama_oracle: runs the real llama.cpp (the prebuilt shared libraries of the
 * npm package @node-llama-cpp/linux-x64@3.22.1, pinned in package-lock.json)
 * on the same inputs strata gets, for tests/cli/test_llama_parity.sh.
 *
 *   llama_oracle [--lib DIR] [--cpu VARIANT|auto] [--no-repack] [--dump DIR] [-v]
 *                COMMAND ...
 *     --lib DIR      the package's bins/linux-x64 folder (or $LLAMA_ORACLE_LIB)
 *     --no-repack    use_extra_bufts = false: no weight repacking (diagnostic)
 *     --dump DIR     write every F32 tensor of the graph as DIR/NAME.f32
 *                    (int64 ne[4], then the floats; chunks append): a
 *                    cb_eval hook, to compare llama.cpp's intermediates with
 *                    strata's kernels (diagnostic)
 *     -v             llama.cpp's log on stderr
 *     info                        llama.cpp version, CPU variant, devices
 *     tokenize VOCAB.gguf         stdin: lines IN<TAB>PARSE_SPECIAL<TAB>OUT;
 *                                 writes OUT.ids ("[1, 2]\n", add_special on:
 *                                 BOS/EOS per the model, as llama-tokenize) and
 *                                 OUT.p1 / OUT.p0 (the ids' pieces with
 *                                 special tokens shown / hidden, concatenated)
 *     pieces VOCAB.gguf OUT       every id's piece: per id "ID<TAB>hex(special
 *                                 shown)<TAB>hex(hidden)<TAB>is_eog\n"
 *     logits MODEL OUT.bin IDS [-t N] [-b N] [-ctk f16|f32] [-ctv f16|f32]
 *                                 [--fa auto|on|off]
 *                                 every position's logits, written as
 *                                 tests/tools/dump_logits writes them
 *     greedy MODEL PROMPT_FILE N [-t N]
 *                                 llama-completion --temp 0: tokenize the
 *                                 prompt (add_special, parse_special),
 *                                 decode it, then N greedy tokens (stopping
 *                                 at end-of-generation); prints "prompt [..]",
 *                                 "gen [..]", "margin m0 m1 ..." (top-1 minus
 *                                 top-2 logit per step) and "text HEX" (the
 *                                 generated pieces, as llama-completion
 *                                 prints them)
 *
 * Why C and dlopen: the package ships libllama with its C API but no headers;
 * node-llama-cpp's JS API exposes no raw logits. The structs declared below
 * are transcribed from include/llama.h of the commit the package was built
 * from (LLAMA_COMMIT "0ad4a86" in libllama-common.so; ggml 0.5.0): model
 * params 80 bytes with load_mode / lazy_mode, context params 160 bytes with
 * n_outputs_max_per_seq and ctx_other. `info` re-checks both layouts against
 * the library's own default values before anything relies on them; every
 * command does the same check and refuses to run on a mismatch (a wrong
 * layout would silently give garbage).
 *
 * Determinism: CPU only, one ggml-cpu variant chosen explicitly (default
 * haswell: AVX2+FMA+F16C, the ISA strata's SIMD kernels target, and what
 * ggml's own scoring picks on an AVX2 CPU without AVX-512 or AVX-VNNI, such
 * as Zen 2/3), a fixed thread
 * count (default 2), mmap'd weights with llama.cpp's default weight
 * repacking, lazy tensor reads off. `--cpu auto` reproduces ggml's own
 * choice (highest ggml_backend_score among the variants).
 *
 * Exit 0 on success, 1 on a llama.cpp error, 2 on usage, 3 when the library
 * cannot be loaded or its ABI does not match (the test script skips then). */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== The C API of llama.cpp at the pinned build (include/llama.h) ==== */

typedef int32_t llama_token;
typedef int32_t llama_pos;
typedef int32_t llama_seq_id;
struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_sampler;

struct llama_model_params {
    void  *devices;                   /* ggml_backend_dev_t *, NULL-terminated */
    const void *tensor_buft_overrides;
    int32_t n_gpu_layers;
    int32_t split_mode;               /* enum llama_split_mode */
    int32_t load_mode;                /* enum llama_load_mode: AUTO -1, NONE 0, MMAP 1, ... */
    int32_t lazy_mode;                /* enum llama_lazy_mode: OFF 0, AUTO 1, ON 2 */
    int32_t main_gpu;
    const float *tensor_split;
    void  *progress_callback;
    void  *progress_callback_user_data;
    const void *kv_overrides;
    bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

struct llama_context_params {
    uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
    int32_t  n_threads, n_threads_batch;
    int32_t  ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
    float    rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float    defrag_thold;
    void    *cb_eval, *cb_eval_user_data;
    int32_t  type_k, type_v;          /* enum ggml_type: F32 0, F16 1 */
    void    *abort_callback, *abort_callback_data;
    bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
    void    *samplers;
    size_t   n_samplers;
    void    *ctx_other;
};

struct llama_batch {
    int32_t n_tokens;
    llama_token *token;
    float *embd;
    llama_pos *pos;
    int32_t *n_seq_id;
    llama_seq_id **seq_id;
    int8_t *logits;
};

_Static_assert(sizeof(struct llama_model_params) == 80, "llama_model_params layout");
_Static_assert(offsetof(struct llama_model_params, tensor_split) == 40, "llama_model_params layout");
_Static_assert(offsetof(struct llama_model_params, vocab_only) == 72, "llama_model_params layout");
_Static_assert(sizeof(struct llama_context_params) == 160, "llama_context_params layout");
_Static_assert(offsetof(struct llama_context_params, type_k) == 104, "llama_context_params layout");
_Static_assert(offsetof(struct llama_context_params, embeddings) == 128, "llama_context_params layout");
_Static_assert(sizeof(struct llama_batch) == 56, "llama_batch layout");

typedef void (*log_cb)(int level, const char *text, void *ud);

static struct {
    void (*log_set)(log_cb, void *);
    void (*backend_init)(void);
    struct llama_model_params (*model_default_params)(void);
    struct llama_context_params (*context_default_params)(void);
    struct llama_model *(*model_load_from_file)(const char *, struct llama_model_params);
    void (*model_free)(struct llama_model *);
    struct llama_context *(*init_from_model)(struct llama_model *, struct llama_context_params);
    void (*free)(struct llama_context *);
    const struct llama_vocab *(*model_get_vocab)(const struct llama_model *);
    int32_t (*vocab_n_tokens)(const struct llama_vocab *);
    bool (*vocab_is_eog)(const struct llama_vocab *, llama_token);
    int32_t (*tokenize)(const struct llama_vocab *, const char *, int32_t, llama_token *, int32_t, bool, bool);
    int32_t (*token_to_piece)(const struct llama_vocab *, llama_token, char *, int32_t, int32_t, bool);
    int32_t (*decode)(struct llama_context *, struct llama_batch);
    float *(*get_logits_ith)(struct llama_context *, int32_t);
    struct llama_sampler *(*sampler_init_greedy)(void);
    llama_token (*sampler_sample)(struct llama_sampler *, struct llama_context *, int32_t);
    void (*sampler_free)(struct llama_sampler *);
    const char *(*print_system_info)(void);
    const char *(*version)(void);
    void *(*backend_load)(const char *path);          /* ggml_backend_reg_t */
    const char *(*tensor_name)(const void *t);        /* ggml_get_name */
    size_t (*tensor_nbytes)(const void *t);
    void (*tensor_get)(const void *t, void *data, size_t offset, size_t size);
    size_t (*dev_count)(void);
    void *(*dev_get)(size_t);
    const char *(*dev_name)(void *);
    const char *(*dev_description)(void *);
} L;

static int g_verbose;
static int g_no_repack;   /* --no-repack: use_extra_bufts = false (diagnostic) */
static const char *g_dump_dir; /* --dump DIR: write every F32 graph tensor (diagnostic) */
static char g_variant[64] = "haswell";
static char g_libdir[4096];

static void quiet_log(int level, const char *text, void *ud)
{
    (void)ud;
    if (g_verbose || level == 4 /* GGML_LOG_LEVEL_ERROR */) fputs(text, stderr);
}

static int fail_load(const char *what)
{
    fprintf(stderr, "llama_oracle: cannot load llama.cpp: %s\n", what);
    return 3;
}

#define SYM(field, name) do { \
        *(void **)&L.field = dlsym(h, name); \
        if (!L.field) return fail_load("missing symbol " name); \
    } while (0)

/* The best variant by ggml's own rule: highest ggml_backend_score(). */
static int pick_auto_variant(void)
{
    DIR *d = opendir(g_libdir);
    if (!d) return fail_load("cannot list the library folder");
    int best = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (strncmp(n, "libggml-cpu-", 12) || len < 16 || strcmp(n + len - 3, ".so")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", g_libdir, n);
        void *v = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!v) continue;
        int (*score)(void) = (int (*)(void))dlsym(v, "ggml_backend_score");
        int s = score ? score() : 0;
        if (g_verbose) fprintf(stderr, "variant %.*s score %d\n", (int)(len - 15), n + 12, s);
        if (s > best) {
            best = s;
            snprintf(g_variant, sizeof g_variant, "%.*s", (int)(len - 15), n + 12);
        }
        dlclose(v);
    }
    closedir(d);
    return best > 0 ? 0 : fail_load("no ggml-cpu variant runs on this CPU");
}

/* The library's default params, checked field by field against the values
 * llama.h documents: the proof that the transcribed layout is this build's. */
static int check_abi(void)
{
    struct llama_model_params mp = L.model_default_params();
    struct llama_context_params cp = L.context_default_params();
    const int ok_m = mp.devices == NULL && mp.n_gpu_layers == -1 && mp.split_mode == 1 && mp.load_mode == -1 &&
                     mp.lazy_mode == 1 && mp.main_gpu == 0 && mp.tensor_split == NULL && mp.kv_overrides == NULL &&
                     !mp.vocab_only && !mp.check_tensors && mp.use_extra_bufts && !mp.no_host && !mp.no_alloc &&
                     !mp.load_mtp;
    const int ok_c = cp.n_ctx == 512 && cp.n_batch == 2048 && cp.n_ubatch == 512 && cp.n_seq_max == 1 &&
                     cp.n_threads == 4 && cp.n_threads_batch == 4 && cp.rope_scaling_type == -1 &&
                     cp.pooling_type == -1 && cp.attention_type == -1 && cp.flash_attn_type == -1 &&
                     cp.yarn_ext_factor == -1.0f && cp.defrag_thold == -1.0f && cp.type_k == 1 && cp.type_v == 1 &&
                     !cp.embeddings && cp.offload_kqv && cp.no_perf && cp.op_offload && cp.swa_full &&
                     !cp.kv_unified && cp.samplers == NULL && cp.n_samplers == 0 && cp.ctx_other == NULL;
    if (!ok_m || !ok_c) return fail_load(!ok_m ? "llama_model_params defaults do not match the transcribed layout"
                                               : "llama_context_params defaults do not match the transcribed layout");
    return 0;
}

static int load_llama(void)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/libllama.v0.5.0.so", g_libdir);
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) return fail_load(dlerror());
    SYM(log_set, "llama_log_set");
    SYM(backend_init, "llama_backend_init");
    SYM(model_default_params, "llama_model_default_params");
    SYM(context_default_params, "llama_context_default_params");
    SYM(model_load_from_file, "llama_model_load_from_file");
    SYM(model_free, "llama_model_free");
    SYM(init_from_model, "llama_init_from_model");
    SYM(free, "llama_free");
    SYM(model_get_vocab, "llama_model_get_vocab");
    SYM(vocab_n_tokens, "llama_vocab_n_tokens");
    SYM(vocab_is_eog, "llama_vocab_is_eog");
    SYM(tokenize, "llama_tokenize");
    SYM(token_to_piece, "llama_token_to_piece");
    SYM(decode, "llama_decode");
    SYM(get_logits_ith, "llama_get_logits_ith");
    SYM(sampler_init_greedy, "llama_sampler_init_greedy");
    SYM(sampler_sample, "llama_sampler_sample");
    SYM(sampler_free, "llama_sampler_free");
    SYM(print_system_info, "llama_print_system_info");
    SYM(version, "llama_version");
    SYM(backend_load, "ggml_backend_load");
    SYM(dev_count, "ggml_backend_dev_count");
    SYM(tensor_name, "ggml_get_name");
    SYM(tensor_nbytes, "ggml_nbytes");
    SYM(tensor_get, "ggml_backend_tensor_get");
    SYM(dev_get, "ggml_backend_dev_get");
    SYM(dev_name, "ggml_backend_dev_name");
    SYM(dev_description, "ggml_backend_dev_description");
    int rc = check_abi();
    if (rc) return rc;
    L.log_set(quiet_log, NULL);
    L.backend_init();
    if (!strcmp(g_variant, "auto") && (rc = pick_auto_variant())) return rc;
    snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", g_libdir, g_variant);
    if (!L.backend_load(path)) return fail_load("ggml_backend_load refused the CPU variant (unsupported CPU?)");
    if (L.dev_count() != 1) return fail_load("expected exactly one device (the CPU)");
    return 0;
}

/* ==== Helpers ==== */

static struct llama_model *open_model(const char *path, int vocab_only)
{
    struct llama_model_params mp = L.model_default_params();
    mp.vocab_only = vocab_only;
    mp.load_mode = 1;    /* LLAMA_LOAD_MODE_MMAP */
    mp.lazy_mode = 0;    /* LLAMA_LAZY_MODE_OFF */
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = !g_no_repack;
    struct llama_model *m = L.model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "llama_oracle: llama.cpp could not load %s\n", path);
    return m;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* Tokenize like llama-tokenize / common_tokenize (grow on a negative count). */
static llama_token *tokenize(const struct llama_vocab *v, const char *text, size_t len, bool add_special,
                             bool parse_special, int *n_out)
{
    int cap = (int)len + 8;
    llama_token *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? L.tokenize(v, text, (int32_t)len, ids, cap, add_special, parse_special) : 0;
    if (ids && n < 0) {
        cap = -n;
        llama_token *t = realloc(ids, (size_t)cap * sizeof *ids);
        if (!t) { free(ids); return NULL; }
        ids = t;
        n = L.tokenize(v, text, (int32_t)len, ids, cap, add_special, parse_special);
    }
    if (!ids || n < 0) { free(ids); return NULL; }
    *n_out = n;
    return ids;
}

/* One token's piece (common_token_to_piece: lstrip 0). Returns the length. */
static int piece(const struct llama_vocab *v, llama_token id, bool special, char *buf, int cap)
{
    int n = L.token_to_piece(v, id, buf, cap, 0, special);
    return n < 0 ? -1 : n;
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static void print_ids(FILE *f, const llama_token *ids, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", ids[i]);
    fputc(']', f);
}

static void print_hex(FILE *f, const char *p, int n)
{
    for (int i = 0; i < n; i++) fprintf(f, "%02x", (unsigned char)p[i]);
}

static int parse_ids(const char *s, llama_token **out, int *n_out)
{
    int cap = 16, n = 0;
    llama_token *ids = malloc((size_t)cap * sizeof *ids);
    while (ids && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) { free(ids); return -1; }
        if (n == cap) {
            llama_token *t = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!t) { free(ids); return -1; }
            ids = t;
        }
        ids[n++] = (llama_token)v;
        s = end;
        if (*s == ',') s++;
    }
    if (!ids || n == 0) { free(ids); return -1; }
    *out = ids;
    *n_out = n;
    return 0;
}

/* ==== Commands ==== */

static int cmd_info(void)
{
    /* build facts live in libllama-common (LLAMA_COMMIT, LLAMA_BUILD_NUMBER) */
    char path[4400];
    snprintf(path, sizeof path, "%s/libllama-common.so", g_libdir);
    void *common = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    const char *const *commit = common ? dlsym(common, "LLAMA_COMMIT") : NULL;
    printf("llama.cpp %s (commit %s), ggml-cpu variant %s\n", L.version(), commit ? *commit : "?", g_variant);
    for (size_t i = 0; i < L.dev_count(); i++) {
        void *d = L.dev_get(i);
        printf("device %zu: %s (%s)\n", i, L.dev_name(d), L.dev_description(d));
    }
    printf("system: %s\n", L.print_system_info());
    return 0;
}

static int cmd_tokenize(const char *vocab_path)
{
    struct llama_model *m = open_model(vocab_path, 1);
    if (!m) return 1;
    const struct llama_vocab *v = L.model_get_vocab(m);
    char line[8192], buf[4096];
    int rc = 0;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *in = strtok(line, "\t"), *ps = strtok(NULL, "\t"), *out = strtok(NULL, "\t");
        if (!in || !ps || !out) { fprintf(stderr, "llama_oracle: bad input line\n"); rc = 2; break; }
        size_t len;
        char *text = read_file(in, &len);
        int n = 0;
        /* add_special = true, as llama-tokenize without --no-bos: BOS/EOS per the model */
        llama_token *ids = text ? tokenize(v, text, len, true, atoi(ps) != 0, &n) : NULL;
        free(text);
        if (!ids) { fprintf(stderr, "llama_oracle: cannot tokenize %s\n", in); rc = 1; continue; }
        char path[8300];
        snprintf(path, sizeof path, "%s.ids", out);
        FILE *f = fopen(path, "w");
        if (f) { print_ids(f, ids, n); fputc('\n', f); fclose(f); }
        for (int special = 0; special < 2; special++) {
            size_t cap = 256, used = 0;
            char *all = malloc(cap);
            for (int i = 0; all && i < n; i++) {
                int pl = piece(v, ids[i], special, buf, sizeof buf);
                if (pl < 0) pl = 0;
                if (used + (size_t)pl > cap) {
                    char *t = realloc(all, cap = 2 * (used + (size_t)pl));
                    if (!t) { free(all); all = NULL; break; }
                    all = t;
                }
                memcpy(all + used, buf, (size_t)pl);
                used += (size_t)pl;
            }
            snprintf(path, sizeof path, "%s.p%d", out, special);
            if (!all || write_bytes(path, all, used)) rc = 1;
            free(all);
        }
        free(ids);
    }
    L.model_free(m);
    return rc;
}

static int cmd_pieces(const char *vocab_path, const char *out_path)
{
    struct llama_model *m = open_model(vocab_path, 1);
    if (!m) return 1;
    const struct llama_vocab *v = L.model_get_vocab(m);
    FILE *f = fopen(out_path, "w");
    if (!f) { L.model_free(m); return 1; }
    char buf[4096];
    const int nv = L.vocab_n_tokens(v);
    for (int id = 0; id < nv; id++) {
        fprintf(f, "%d\t", id);
        print_hex(f, buf, piece(v, id, true, buf, sizeof buf));
        fputc('\t', f);
        print_hex(f, buf, piece(v, id, false, buf, sizeof buf));
        fprintf(f, "\t%d\n", L.vocab_is_eog(v, id) ? 1 : 0);
    }
    int rc = fclose(f) ? 1 : 0;
    L.model_free(m);
    return rc;
}

typedef struct run_opts { int threads, batch, type_k, type_v, fa; } run_opts;

static int parse_run_opts(int argc, char **argv, run_opts *o)
{
    *o = (run_opts){ .threads = 2, .batch = 512, .type_k = 1, .type_v = 1, .fa = -1 };
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) return -1;
        i++;
        if (!strcmp(a, "-t")) o->threads = atoi(val);
        else if (!strcmp(a, "-b")) o->batch = atoi(val);
        else if (!strcmp(a, "-ctk") || !strcmp(a, "-ctv")) {
            int t = !strcmp(val, "f16") ? 1 : !strcmp(val, "f32") ? 0 : -1;
            if (t < 0) return -1;
            *(a[3] == 'k' ? &o->type_k : &o->type_v) = t;
        } else if (!strcmp(a, "--fa")) {
            o->fa = !strcmp(val, "on") ? 1 : !strcmp(val, "off") ? 0 : !strcmp(val, "auto") ? -1 : -2;
            if (o->fa == -2) return -1;
        } else return -1;
    }
    return o->threads > 0 && o->batch > 0 ? 0 : -1;
}

/* --dump: ggml_backend_sched_eval_callback writing each F32 result as
 * DIR/NAME.f32 (int64 ne[4], then the floats; a later chunk appends). Reads
 * `type` (offset 0) and `ne` (offset 16) of struct ggml_tensor, which have
 * stood there since ggml's first backend release. */
static bool dump_cb(void *t, bool ask, void *ud)
{
    (void)ud;
    if (ask) return *(const int32_t *)t == 0;   /* GGML_TYPE_F32 */
    const char *name = L.tensor_name(t);
    char path[4400], clean[128];
    snprintf(clean, sizeof clean, "%s", name);
    for (char *c = clean; *c; c++) if (*c == '/' || *c == ' ' || *c == '(' || *c == ')') *c = '_';
    snprintf(path, sizeof path, "%s/%s.f32", g_dump_dir, clean);
    const size_t nb = L.tensor_nbytes(t);
    void *buf = malloc(nb);
    FILE *f = buf ? fopen(path, "ab") : NULL;
    if (f) {
        L.tensor_get(t, buf, 0, nb);
        fwrite((const char *)t + 16, 8, 4, f);
        fwrite(buf, 1, nb, f);
        fclose(f);
    }
    free(buf);
    return true;
}

static struct llama_context *open_ctx(struct llama_model *m, int n_ctx, const run_opts *o)
{
    struct llama_context_params cp = L.context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)o->batch;
    cp.n_threads = cp.n_threads_batch = o->threads;
    cp.type_k = o->type_k;
    cp.type_v = o->type_v;
    cp.flash_attn_type = o->fa;
    if (g_dump_dir) cp.cb_eval = (void *)dump_cb;
    struct llama_context *c = L.init_from_model(m, cp);
    if (!c) fprintf(stderr, "llama_oracle: llama_init_from_model failed\n");
    return c;
}

/* Decode ids[0..n) at positions pos0.., in chunks of `batch`; outputs for
 * every token when all_out, else only for the last. */
static int decode(struct llama_context *c, const llama_token *ids, int n, int pos0, int batch, int all_out)
{
    llama_pos *pos = malloc((size_t)batch * sizeof *pos);
    int32_t *nseq = malloc((size_t)batch * sizeof *nseq);
    llama_seq_id seq0 = 0, **seq = malloc((size_t)batch * sizeof *seq);
    int8_t *out = malloc((size_t)batch);
    int rc = !pos || !nseq || !seq || !out;
    for (int i0 = 0; !rc && i0 < n; i0 += batch) {
        const int m = n - i0 < batch ? n - i0 : batch;
        for (int i = 0; i < m; i++) {
            pos[i] = pos0 + i0 + i;
            nseq[i] = 1;
            seq[i] = &seq0;
            out[i] = (int8_t)(all_out || i0 + i == n - 1);
        }
        struct llama_batch b = { m, (llama_token *)ids + i0, NULL, pos, nseq, seq, out };
        int r = L.decode(c, b);
        if (r != 0) { fprintf(stderr, "llama_oracle: llama_decode returned %d\n", r); rc = 1; }
    }
    free(pos); free(nseq); free(seq); free(out);
    return rc;
}

static int cmd_logits(const char *model, const char *out_path, const char *ids_s, const run_opts *o)
{
    llama_token *ids;
    int n;
    if (parse_ids(ids_s, &ids, &n)) { fprintf(stderr, "llama_oracle: bad ids\n"); return 2; }
    struct llama_model *m = open_model(model, 0);
    if (!m) { free(ids); return 1; }
    const int nv = L.vocab_n_tokens(L.model_get_vocab(m));
    struct llama_context *c = open_ctx(m, n, o);
    FILE *f = c ? fopen(out_path, "wb") : NULL;
    int rc = !f;
    if (f) {
        int32_t hdr[2] = { n, nv };
        fwrite(hdr, 4, 2, f);
    }
    /* one llama_decode per -b chunk; the logits of a chunk live until the next decode */
    for (int i0 = 0; !rc && i0 < n; i0 += o->batch) {
        const int cnt = n - i0 < o->batch ? n - i0 : o->batch;
        rc = decode(c, ids + i0, cnt, i0, o->batch, 1);
        for (int i = 0; !rc && i < cnt; i++) {
            const float *row = L.get_logits_ith(c, i);
            if (!row) rc = 1;
            else fwrite(row, 4, (size_t)nv, f);
        }
    }
    if (f && fclose(f)) rc = 1;
    if (c) L.free(c);
    L.model_free(m);
    free(ids);
    return rc;
}

static int cmd_greedy(const char *model, const char *prompt_file, int n_gen, const run_opts *o)
{
    size_t len;
    char *text = read_file(prompt_file, &len);
    if (!text) { fprintf(stderr, "llama_oracle: cannot read %s\n", prompt_file); return 1; }
    struct llama_model *m = open_model(model, 0);
    if (!m) { free(text); return 1; }
    const struct llama_vocab *v = L.model_get_vocab(m);
    const int nv = L.vocab_n_tokens(v);
    int n = 0;
    llama_token *prompt = tokenize(v, text, len, true, true, &n);   /* as llama-completion */
    free(text);
    llama_token *gen = calloc((size_t)n_gen + 1, sizeof *gen);
    float *margin = malloc((size_t)(n_gen + 1) * sizeof *margin);
    struct llama_context *c = prompt && n > 0 && gen && margin ? open_ctx(m, n + n_gen + 1, o) : NULL;
    struct llama_sampler *greedy = L.sampler_init_greedy();
    int rc = !c || !greedy || decode(c, prompt, n, 0, o->batch, 0);
    int n_out = 0;
    char piece_buf[4096];
    char *out_text = malloc((size_t)(n_gen + 1) * sizeof piece_buf);
    size_t text_len = 0;
    while (!rc && out_text && n_out < n_gen) {
        const float *row = L.get_logits_ith(c, -1);
        llama_token id = L.sampler_sample(greedy, c, -1);
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < nv; i++) {
            if (row[i] > b1) { b2 = b1; b1 = row[i]; }
            else if (row[i] > b2) b2 = row[i];
        }
        margin[n_out] = b1 - b2;
        gen[n_out++] = id;
        if (L.vocab_is_eog(v, id)) break;   /* llama-completion stops here and prints nothing for it */
        int pl = piece(v, id, false, piece_buf, sizeof piece_buf);
        if (pl > 0) { memcpy(out_text + text_len, piece_buf, (size_t)pl); text_len += (size_t)pl; }
        if (n_out < n_gen) rc = decode(c, &id, 1, n + n_out - 1, o->batch, 1);
    }
    if (!rc) {
        printf("prompt ");
        print_ids(stdout, prompt, n);
        printf("\ngen ");
        print_ids(stdout, gen, n_out);
        printf("\nmargin");
        for (int i = 0; i < n_out; i++) printf(" %.6g", margin[i]);
        printf("\ntext ");
        print_hex(stdout, out_text, (int)text_len);
        printf("\n");
    }
    if (greedy) L.sampler_free(greedy);
    if (c) L.free(c);
    L.model_free(m);
    free(prompt); free(gen); free(margin); free(out_text);
    return rc;
}

static int usage(void)
{
    fprintf(stderr, "usage: llama_oracle [--lib DIR] [--cpu VARIANT|auto] [--no-repack] [--dump DIR] [-v] "
                    "info | tokenize VOCAB | pieces VOCAB OUT | logits MODEL OUT IDS [opts] | "
                    "greedy MODEL PROMPT_FILE N [opts]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int i = 1;
    const char *lib = getenv("LLAMA_ORACLE_LIB");
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--lib") && i + 1 < argc) lib = argv[++i];
        else if (!strcmp(argv[i], "--cpu") && i + 1 < argc) snprintf(g_variant, sizeof g_variant, "%s", argv[++i]);
        else if (!strcmp(argv[i], "-v")) g_verbose = 1;
        else if (!strcmp(argv[i], "--no-repack")) g_no_repack = 1;
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) g_dump_dir = argv[++i];
        else return usage();
    }
    if (i >= argc || !lib) return usage();
    snprintf(g_libdir, sizeof g_libdir, "%s", lib);
    const char *cmd = argv[i++];
    const int rest = argc - i;
    char **a = argv + i;
    int rc = load_llama();
    if (rc) return rc;
    run_opts o;
    if (!strcmp(cmd, "info") && rest == 0) return cmd_info();
    if (!strcmp(cmd, "tokenize") && rest == 1) return cmd_tokenize(a[0]);
    if (!strcmp(cmd, "pieces") && rest == 2) return cmd_pieces(a[0], a[1]);
    if (!strcmp(cmd, "logits") && rest >= 3 && !parse_run_opts(rest - 3, a + 3, &o))
        return cmd_logits(a[0], a[1], a[2], &o);
    if (!strcmp(cmd, "greedy") && rest >= 3 && !parse_run_opts(rest - 3, a + 3, &o))
        return cmd_greedy(a[0], a[1], atoi(a[2]), &o);
    return usage();
}

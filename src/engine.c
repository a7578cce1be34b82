/* engine: the public API's model half (engine_open and the model facts,
 * tokenizer and chat-template wrappers). Sessions live in
 * runtime/session.c, the sampler in runtime/sampler.c.
 *
 * What an engine owns: the parsed GGUF header (kept open: its fd backs the
 * mapping's file-changed check), the tokenizer, the hyper-parameters, the
 * weights (mapped, or the non-expert part read into memory when
 * streaming), the expert source (the mapping's, or the expert store with its
 * layout and I/O engine: the CPU's streaming arena, or the host tier under a
 * device backend's arena), the device backend's model, the thread pool, the
 * f16->f32 table of the attention kernels and a copy of the chat template.
 * All of it is built in engine_open; afterwards only the store's residency
 * and counters (and the backend's arena) change. */
#include "engine.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "expert/profile.h"
#include "expert/xlayout.h"
#include "expert/xstore.h"
#include "gguf/gguf.h"
#include "model/expert_src.h"
#include "model/hparams.h"
#include "model/ops.h"
#include "model/weights.h"
#include "quant/qtype.h"
#include "route/route.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/cpu.h"
#include "util/threadpool.h"
#include "util/timer.h"

struct engine {
    gguf_file   *f;
    tokenizer   *tok;
    hparams      hp;
    weights     *w;
    expert_src  *xs;             /* owned when all resident; the store's view when streaming */
    xlayout     *xl;             /* streaming: where the experts are */
    xstore      *store;          /* streaming: the arena */
    char         src_desc[512];  /* streaming: "sidecar PATH" / "GGUF PATH" */
    engine_memory mem;
    tpool       *pool;
    float       *f16_tab;        /* 65536 floats */
    session_env  env;
    cpu_isa      isa;
    int          n_threads;
    char        *chat_template;  /* owned copy of tokenizer.chat_template, or NULL */
    char         desc[512];
    double       load_ms;
    route_policy *route;         /* the routing policy (immutable) */
    char         route_desc[1024]; /* its canonical string */
    route_counters route_ctr[ROUTE_N_ARMS]; /* written by the forward */
    const backend_iface *be;     /* device backend, or NULL (the CPU) */
    backend_model *bm;           /* its model (owned) */
    char           be_desc[256]; /* its describe() line */
    int            be_sessions;  /* sessions holding the device timeline (0 or 1) */
    uint64_t       gpu_arena_bytes; /* the device's expert arena as asked (0: all on the device) */
};

/* "1.23 GB" / "45.6 MB" / "789 kB" (decimal units). */
static const char *human_bytes(char *buf, size_t cap, double b)
{
    if (b >= 1e9) snprintf(buf, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, cap, "%.1f MB", b / 1e6);
    else snprintf(buf, cap, "%.0f kB", b / 1e3);
    return buf;
}

static void describe(engine *eng)
{
    const hparams *hp = &eng->hp;
    const weights *w = eng->w;
    char sz[32];
    size_t o = (size_t)snprintf(eng->desc, sizeof eng->desc,
                                "%s %dL %dx%d experts, n_embd %d, %s (", hp->arch, hp->n_layer, hp->n_expert,
                                hp->n_expert_used, hp->n_embd, human_bytes(sz, sizeof sz, (double)w->n_bytes));
    /* type mix, largest share first */
    int done[QTYPE_MAX_ID] = { 0 };
    for (int k = 0; k < QTYPE_MAX_ID && o < sizeof eng->desc; k++) {
        int best = -1;
        for (int t = 0; t < QTYPE_MAX_ID; t++)
            if (!done[t] && w->bytes_by_type[t] && (best < 0 || w->bytes_by_type[t] > w->bytes_by_type[best])) best = t;
        if (best < 0) break;
        done[best] = 1;
        o += (size_t)snprintf(eng->desc + o, sizeof eng->desc - o, "%s%s %.1f%%", k ? ", " : "",
                              qtype_name(best), 100.0 * (double)w->bytes_by_type[best] / (double)w->n_bytes);
    }
    if (o < sizeof eng->desc) snprintf(eng->desc + o, sizeof eng->desc - o, ")");
}

/* The backend's arena counters (zeros without a backend, or one without
 * stats). */
static void backend_stats_of(const engine *eng, backend_stats *out)
{
    memset(out, 0, sizeof *out);
    if (eng->be && eng->be->stats) eng->be->stats(eng->bm, out);
}

/* How the host tier's memory is held for the device's copies: "pinned",
 * "pageable" (the system refused to page-lock it), or "N GB of it pinned". */
static const char *host_tier_pinning(const engine *eng, char *buf, size_t cap)
{
    backend_stats st;
    backend_stats_of(eng, &st);
    char b[32];
    if (st.pinned_bytes >= eng->mem.arena) snprintf(buf, cap, "pinned");
    else if (st.pinned_bytes == 0) snprintf(buf, cap, "pageable");
    else snprintf(buf, cap, "%s of it pinned", human_bytes(b, sizeof b, (double)st.pinned_bytes));
    return buf;
}

static void print_summary(const engine *eng, const char *path, FILE *log)
{
    const hparams *hp = &eng->hp;
    const weights *w = eng->w;
    const session_env *env = &eng->env;
    const engine_memory *m = &eng->mem;
    fprintf(log, "strata: model %s (%.1f ms to load)\n", path, eng->load_ms);
    fprintf(log, "strata: %s: %d layers, %d experts (%d used, ff %d), n_embd %d, heads %d/%d x %d, "
            "vocab %d, trained ctx %d\n", hp->arch, hp->n_layer, hp->n_expert, hp->n_expert_used,
            hp->n_ff_exp, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab, hp->n_ctx_train);
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    const double np = (double)w->n_params;
    if (eng->store && eng->be)
        fprintf(log, "strata: %s; %.2f %s params, routed experts %s, streamed from the %s through the host cache "
                "into the GPU's expert arena%s\n",
                eng->desc, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? "B" : "M",
                human_bytes(b1, sizeof b1, (double)w->expert_bytes), eng->src_desc,
                w->output_tied ? ", head tied to token_embd" : "");
    else if (eng->store)
        fprintf(log, "strata: %s; %.2f %s params, routed experts %s, streamed from the %s%s\n",
                eng->desc, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? "B" : "M",
                human_bytes(b1, sizeof b1, (double)w->expert_bytes), eng->src_desc,
                w->output_tied ? ", head tied to token_embd" : "");
    else
        fprintf(log, "strata: %s; %.2f %s params, routed experts %s, all resident (mapped read-only)%s\n",
                eng->desc, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? "B" : "M",
                human_bytes(b1, sizeof b1, (double)w->expert_bytes),
                w->output_tied ? ", head tied to token_embd" : "");
    if (eng->be) fprintf(log, "strata: backend %s: %s\n", eng->be->name, eng->be_desc);
    fprintf(log, "strata: %d threads, isa %s, ctx %d, batch %d, KV cache %s/%s (%s per session)\n",
            eng->n_threads, cpu_isa_name(eng->isa), env->n_ctx, env->n_batch, env->k_f16 ? "f16" : "f32",
            env->v_f16 ? "f16" : "f32", human_bytes(b2, sizeof b2, (double)m->kv));
    if (eng->store && eng->be) {   /* the host tier under the device's arena; KV cache and scratch on the device */
        char pin[64];
        fprintf(log, "strata: host memory: non-expert weights %s (read into memory), host cache %s (%s) under "
                "the GPU's expert arena of %s\n",
                human_bytes(b1, sizeof b1, (double)m->weights), human_bytes(b2, sizeof b2, (double)m->arena),
                host_tier_pinning(eng, pin, sizeof pin), human_bytes(b3, sizeof b3, (double)eng->gpu_arena_bytes));
        char line[768];
        xstore_init_line(eng->store, line, sizeof line);
        fprintf(log, "strata: host cache: %s\n", line);
    } else if (eng->store) {
        fprintf(log, "strata: memory: non-expert weights %s (read into memory), expert arena %s, KV cache %s "
                "and forward scratch %s per session: %s with one session\n",
                human_bytes(b1, sizeof b1, (double)m->weights), human_bytes(b2, sizeof b2, (double)m->arena),
                human_bytes(b3, sizeof b3, (double)m->kv), human_bytes(b4, sizeof b4, (double)m->scratch),
                human_bytes(b5, sizeof b5, (double)m->total));
        char line[768];
        xstore_init_line(eng->store, line, sizeof line);
        fprintf(log, "strata: %s\n", line);
    }
    if (route_policy_reads_residency(eng->route, hp->n_expert_used))
        fprintf(log, "strata: routing %s; it depends on expert residency (the arena's state and I/O timing): "
                "results are not reproducible bit for bit\n", eng->route_desc);
    else
        fprintf(log, "strata: routing %s (never reads residency: reproducible)\n", eng->route_desc);
}

/* Bytes of memory this process may use for the arena: MemAvailable, or the
 * memory cgroup's limit when it is lower (cgroup v1 memory.limit_in_bytes
 * or v2 memory.max of the cgroup named in /proc/self/cgroup). 0 if unknown. */
static uint64_t available_memory(void)
{
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (uint64_t)kb * 1024; break; }
        fclose(f);
    }
    f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            char path[1200];
            *c2 = '\0';
            const char *ctrl = c1 + 1, *cg = c2 + 1;
            if (!strcmp(ctrl, "memory"))
                snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", cg);
            else if (!strcmp(ctrl, "") && !strcmp(line, "0"))
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", cg);
            else
                continue;
            FILE *g = fopen(path, "r");
            unsigned long long lim;
            if (g) {
                if (fscanf(g, "%llu", &lim) == 1 && lim > 0 && (avail == 0 || lim < avail)) avail = lim;
                fclose(g);
            }
        }
        fclose(f);
    }
    return avail;
}

/* The options of the expert tiers (engine_opts: streaming, the device
 * backend, its arena and the host tier under it), checked against each
 * other and against the model's layer count before anything is loaded.
 * ERR_USAGE with a message naming the CLI flags. */
static int check_tier_opts(const engine_opts *o, int n_layer, err *e)
{
    if (o->read_ahead < 0) return err_setf(e, ERR_USAGE, "read-ahead %d is negative", o->read_ahead);
    if (o->stream && o->arena_auto && o->arena_bytes)
        return err_setf(e, ERR_USAGE, "give an arena size or auto, not both");
    if (o->gpu_arena_bytes && !o->backend)
        return err_setf(e, ERR_USAGE, "--gpu-arena sizes the GPU's expert arena: it needs --gpu (build/cuda/strata)");
    if (o->host_cache_bytes && !o->backend)
        return err_setf(e, ERR_USAGE, "--host-cache is the host tier under the GPU's expert arena: it needs --gpu "
                        "(build/cuda/strata) and --gpu-arena SIZE");
    if (!o->backend) {
        if (!o->stream && (o->arena_bytes || o->arena_auto || o->read_ahead || o->profile_path))
            return err_setf(e, ERR_USAGE, "arena, read-ahead and profile options need expert streaming");
        return 0;
    }
    const char *name = o->backend->name;
    const int arena = o->stream || o->arena_bytes || o->arena_auto;   /* --arena given */
    if (arena && o->host_cache_bytes)
        return err_setf(e, ERR_USAGE, "--arena and --host-cache both size the expert store: on the GPU it is "
                        "sized by --host-cache SIZE alone");
    if (arena)
        return err_setf(e, ERR_USAGE, "the %s backend does not stream through --arena: the host-RAM tier under "
                        "the GPU's expert arena is --host-cache SIZE (with --gpu-arena SIZE)", name);
    if (o->host_cache_bytes && !o->gpu_arena_bytes)
        return err_setf(e, ERR_USAGE, "--host-cache is the host tier under the GPU's expert arena: it needs "
                        "--gpu-arena SIZE");
    if (o->read_ahead && !o->gpu_arena_bytes)
        return err_setf(e, ERR_USAGE, "read-ahead on the %s backend prefetches into its expert arena: it needs "
                        "--gpu-arena SIZE", name);
    if (o->read_ahead && o->read_ahead_from == ENGINE_RA_INPUT)
        return err_setf(e, ERR_USAGE, "the %s backend's read-ahead runs the next layer's router on this layer's "
                        "post-attention residual: --read-ahead-from input is not available on it", name);
    if (o->profile_path && !o->host_cache_bytes)
        return err_setf(e, ERR_USAGE, "a profile fills the expert store: with the %s backend it needs "
                        "--host-cache SIZE", name);
    if (o->gpu_layers > 0 && o->gpu_layers < n_layer)
        return err_setf(e, ERR_USAGE, "the %s backend takes every layer: %d GPU layers of %d (partial "
                        "offload) is not supported; use -ngl %d or more (or -ngl 0 for the CPU)",
                        name, o->gpu_layers, n_layer, n_layer);
    if (o->kv_type_k != o->kv_type_v)
        return err_setf(e, ERR_USAGE, "the %s backend needs one KV cache type for K and V", name);
    return 0;
}

/* The expert store: the layout, the arena size (arena_bytes, or auto), the
 * store, the warm fill. The CPU's streaming store, or the host tier under a
 * backend's device arena (the same store, sized by host_cache_bytes). */
static int open_store(engine *eng, const engine_opts *o, uint64_t arena_bytes, err *e)
{
    xlayout_opts xo = { .sidecar_path = o->sidecar_path, .no_sidecar = o->no_sidecar, .direct = !o->no_direct };
    int rc = xlayout_open(&eng->xl, eng->f, &eng->hp, &xo, e);
    if (rc) return rc;
    snprintf(eng->src_desc, sizeof eng->src_desc, "%s %s (%s reads)", xlayout_has_sidecar(eng->xl) ? "sidecar" : "GGUF",
             xlayout_path(eng->xl), xlayout_direct(eng->xl) ? "O_DIRECT" : "buffered");
    xstore_layout lay;
    xstore_layout_from_xlayout(&lay, eng->xl);
    lay.desc = eng->src_desc;
    xstore_opts so = {
        .arena_bytes = arena_bytes, .evict = o->evict == ENGINE_EVICT_LFU ? XSTORE_EVICT_LFU : XSTORE_EVICT_LRU,
        .io_mode = o->io_mode == ENGINE_IO_URING ? XIO_URING : o->io_mode == ENGINE_IO_PREAD ? XIO_PREAD : XIO_AUTO,
        .io_threads = o->io_threads, .io_depth = o->io_depth, .n_expert_used = eng->hp.n_expert_used,
        .read_ahead = o->read_ahead, .n_compute = eng->n_threads,
    };
    if (o->arena_auto) {
        const uint64_t avail = available_memory();
        const uint64_t resident = eng->mem.weights + eng->mem.kv + eng->mem.scratch;
        const double want = ENGINE_ARENA_AUTO_FRACTION * (double)avail - (double)resident;
        if (avail == 0 || want < 1.0)
            return err_setf(e, ERR_USAGE, "--arena auto: %.0f%% of the available memory (%.2f GB) does not cover the "
                            "resident part (%.2f GB); give --arena SIZE, or 0 to stream every lookup",
                            100 * ENGINE_ARENA_AUTO_FRACTION, (double)avail / 1e9, (double)resident / 1e9);
        so.arena_bytes = (uint64_t)want;
        uint64_t planned;
        err tmp = { 0 };
        if (xstore_plan(&lay, &so, &planned, &tmp) != 0)
            return err_setf(e, ERR_USAGE, "--arena auto: %s", tmp.msg);
    }
    if ((rc = xstore_open(&eng->store, &lay, &so, e))) return rc;
    eng->xs = xstore_src(eng->store);
    eng->mem.arena = xstore_arena_bytes(eng->store);
    if (o->profile_path) {
        profile *p = NULL;
        if ((rc = profile_load(&p, o->profile_path, gguf_fingerprint(eng->f), gguf_file_size(eng->f),
                               eng->hp.n_layer, eng->hp.n_expert, e)))
            return rc;
        const uint64_t n = profile_n(p);
        int32_t *pairs = malloc(sizeof(int32_t) * 2 * (size_t)(n ? n : 1));
        if (!pairs) { profile_close(p); return err_setf(e, ERR_NOMEM, "out of memory"); }
        const profile_entry *pe = profile_entries(p);
        for (uint64_t i = 0; i < n; i++) { pairs[2 * i] = pe[i].layer; pairs[2 * i + 1] = pe[i].expert; }
        rc = xstore_warm(eng->store, pairs, n, e);
        free(pairs);
        profile_close(p);
        if (rc) return rc;
    }
    return 0;
}

int engine_open(engine **out, const engine_opts *o, err *e)
{
    *out = NULL;
    const double t0 = timer_ms();
    if (!o || !o->model_path) return err_setf(e, ERR_USAGE, "no model path");
    if (o->n_ctx < ENGINE_CTX_TRAIN) return err_setf(e, ERR_USAGE, "context size %d is negative", o->n_ctx);
    if ((o->kv_type_k != ENGINE_KV_F16 && o->kv_type_k != ENGINE_KV_F32) ||
        (o->kv_type_v != ENGINE_KV_F16 && o->kv_type_v != ENGINE_KV_F32))
        return err_setf(e, ERR_USAGE, "KV cache types must be f16 or f32");
    engine *eng = calloc(1, sizeof *eng);
    if (!eng) return err_setf(e, ERR_NOMEM, "out of memory");
    int rc;
    /* the routing policy first: a bad spec costs no loading. The option
     * beats the environment, which beats exact. */
    {
        const char *env = getenv("STRATA_ROUTE");
        const int from_env = !o->route_spec && env && *env;
        const char *spec = o->route_spec ? o->route_spec : from_env ? env : "exact";
        err pe;
        err_clear(&pe);
        if ((rc = route_policy_parse(&eng->route, spec, &pe))) {
            if (from_env) err_prefix(&pe, "STRATA_ROUTE");
            err_setf(e, rc, "%s", pe.msg);
            goto fail;
        }
        route_policy_describe(eng->route, eng->route_desc, sizeof eng->route_desc);
    }
    /* Each step reports into a fresh err, copied out only when the step
     * fails: a module that records a message and then succeeds (an optional
     * key it did not find) must not hide the real error of a later step. */
    err sub;
#define STEP(call) do { err_clear(&sub); if ((rc = (call)) != 0) { err_setf(e, rc, "%s", sub.msg); goto fail; } } while (0)
    STEP(gguf_open(&eng->f, o->model_path, &sub));
    STEP(hparams_load(&eng->hp, eng->f, &sub));
    STEP(route_policy_check(eng->route, eng->hp.n_expert, eng->hp.n_expert_used, &sub));
    STEP(tokenizer_open(&eng->tok, eng->f, &sub));
    eng->isa = cpu_best_isa();
    /* the expert store: the CPU's arena (stream), or the host tier under a
     * backend's device arena (host_cache_bytes); checked before anything
     * is loaded */
    if ((rc = check_tier_opts(o, eng->hp.n_layer, e))) goto fail;
    const int host_tier = o->backend && o->host_cache_bytes;
    const int streamed = o->stream || host_tier;
    STEP(weights_open(&eng->w, eng->f, &eng->hp, eng->isa, streamed ? WEIGHTS_RESIDENT_ONLY : WEIGHTS_MAP_ALL, &sub));
    if (tokenizer_n_vocab(eng->tok) != eng->hp.n_vocab) {
        rc = err_setf(e, ERR_FORMAT, "tensor token_embd.weight: shape [%d, %d] but expected [%d, %d] "
                      "(the tokenizer has %d tokens)", eng->hp.n_embd, eng->hp.n_vocab, eng->hp.n_embd,
                      (int)tokenizer_n_vocab(eng->tok), (int)tokenizer_n_vocab(eng->tok));
        goto fail;
    }
    eng->n_threads = o->n_threads > 0 ? o->n_threads : cpu_count();
    STEP(tpool_open(&eng->pool, eng->n_threads, &sub));
    eng->f16_tab = malloc(sizeof(float) * 65536);
    if (!eng->f16_tab) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
    ops_f16_table_init(eng->f16_tab);

    if (gguf_find_key(eng->f, "tokenizer.chat_template") >= 0) {
        gguf_str t;
        if (gguf_get_str(eng->f, "tokenizer.chat_template", &t, NULL) == 0) {
            eng->chat_template = malloc((size_t)t.n + 1);
            if (!eng->chat_template) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
            memcpy(eng->chat_template, t.p, (size_t)t.n);
            eng->chat_template[t.n] = '\0';
        }
    }

    int n_ctx = o->n_ctx == 0 ? (eng->hp.n_ctx_train < 4096 ? eng->hp.n_ctx_train : 4096)
              : o->n_ctx == ENGINE_CTX_TRAIN ? eng->hp.n_ctx_train : o->n_ctx;
    int n_batch = o->n_batch > 0 ? o->n_batch : 2048;   /* llama.cpp's n_batch */
    if (n_batch > n_ctx) n_batch = n_ctx;
    eng->env = (session_env){
        .model = { &eng->hp, eng->w, NULL, eng->pool, eng->f16_tab, { 0 }, o->stream ? o->read_ahead : 0,
                   o->read_ahead_from == ENGINE_RA_INPUT ? QWEN3MOE_RA_INPUT : QWEN3MOE_RA_ATTN,
                   o->on_route, o->on_route_ctx, eng->route, eng->route_ctr },
        .w = eng->w,
        .n_ctx = n_ctx,
        .n_batch = n_batch,
        .k_f16 = o->kv_type_k == ENGINE_KV_F16,
        .v_f16 = o->kv_type_v == ENGINE_KV_F16,
        .n_vocab = eng->hp.n_vocab,
    };
    /* the memory plan: weights, one session's KV cache and scratch, the arena
     * (the CPU's, or the host tier under the device's) */
    eng->mem.streaming = streamed;
    eng->mem.weights = weights_resident_bytes(eng->w);
    eng->mem.kv = (uint64_t)eng->hp.n_layer * (uint64_t)n_ctx * (uint64_t)eng->hp.n_head_kv *
                  (uint64_t)eng->hp.head_dim * (uint64_t)((eng->env.k_f16 ? 2 : 4) + (eng->env.v_f16 ? 2 : 4));
    eng->mem.scratch = qwen3moe_scratch_plan(&eng->env.model, n_batch, n_ctx);
    if (streamed) STEP(open_store(eng, o, host_tier ? o->host_cache_bytes : o->arena_bytes, &sub));
    else STEP(expert_src_open_mmap(&eng->xs, eng->w, &sub));
    eng->mem.total = eng->mem.weights + eng->mem.arena + eng->mem.kv + eng->mem.scratch;
    eng->env.model.xs = eng->xs;
    eng->env.store = eng->store;
    if (o->backend) {
        backend_open_opts bo = {
            .n_ctx = n_ctx, .kv_f16 = eng->env.k_f16, .arena_bytes = o->gpu_arena_bytes,
            .read_ahead = o->read_ahead,
        };
        if (host_tier) {   /* the store under the device arena, and its slots to page-lock */
            bo.host = eng->xs;
            xstore_arena_span(eng->store, &bo.host_mem, &bo.host_mem_bytes);
        }
        STEP(o->backend->open(&eng->bm, &eng->hp, eng->w, &bo, &sub));
        eng->be = o->backend;
        eng->gpu_arena_bytes = o->gpu_arena_bytes;
        eng->be->describe(eng->bm, eng->be_desc, sizeof eng->be_desc);
        eng->env.be = eng->be;
        eng->env.bm = eng->bm;
    }
#undef STEP
    ops_kernels_get(eng->isa, &eng->env.model.kern);
    describe(eng);
    eng->load_ms = timer_ms() - t0;
    if (o->verbose) print_summary(eng, o->model_path, o->log ? o->log : stderr);
    *out = eng;
    return 0;
fail:
    engine_close(eng);
    return rc;
}

void engine_close(engine *eng)
{
    if (!eng) return;
    if (eng->be) eng->be->close(eng->bm);
    tpool_close(eng->pool);
    if (eng->store) xstore_close(eng->store);   /* eng->xs is its view */
    else expert_src_close(eng->xs);
    xlayout_close(eng->xl);
    weights_close(eng->w);
    tokenizer_close(eng->tok);
    gguf_close(eng->f);
    free(eng->f16_tab);
    free(eng->chat_template);
    route_policy_free(eng->route);
    free(eng);
}

const session_env *engine_session_env(const engine *eng) { return &eng->env; }

int32_t     engine_n_vocab(const engine *eng)      { return eng->hp.n_vocab; }
int         engine_n_ctx(const engine *eng)        { return eng->env.n_ctx; }
int         engine_n_ctx_train(const engine *eng)  { return eng->hp.n_ctx_train; }
int         engine_n_batch(const engine *eng)      { return eng->env.n_batch; }
int         engine_n_threads(const engine *eng)    { return eng->n_threads; }
const char *engine_arch(const engine *eng)         { return eng->hp.arch; }
const char *engine_model_desc(const engine *eng)   { return eng->desc; }
const char *engine_backend_name(const engine *eng) { return eng->be ? eng->be->name : "CPU"; }

int engine_backend_claim(engine *eng, int delta, err *e)
{
    if (!eng->be) return 0;
    if (delta > 0 && eng->be_sessions > 0)
        return err_setf(e, ERR_USAGE, "the %s backend has one device timeline: one session at a time",
                        eng->be->name);
    eng->be_sessions += delta;
    return 0;
}
uint64_t    engine_model_bytes(const engine *eng)  { return eng->w->n_bytes; }
uint64_t    engine_model_params(const engine *eng) { return eng->w->n_params; }
const char *engine_chat_template(const engine *eng) { return eng->chat_template; }
double      engine_load_ms(const engine *eng)      { return eng->load_ms; }

int engine_tokenize(const engine *eng, const char *text, size_t len, int add_bos,
                    int parse_special, int32_t *ids, size_t cap, size_t *n_out, err *e)
{
    return tokenizer_encode(eng->tok, text, len, add_bos, parse_special, ids, cap, n_out, e);
}

int engine_token_piece(const engine *eng, int32_t id, int special, char *buf, size_t cap)
{
    return tokenizer_piece(eng->tok, id, special, buf, cap);
}

int engine_token_is_eog(const engine *eng, int32_t id) { return tokenizer_is_eog(eng->tok, id); }
int engine_add_bos(const engine *eng)                 { return tokenizer_add_bos(eng->tok); }
int32_t engine_token_bos(const engine *eng)           { return tokenizer_bos(eng->tok); }
int32_t engine_token_find(const engine *eng, const char *text)
{
    return tokenizer_find(eng->tok, text, strlen(text));
}

/* ==== Chat templates ==== */

int engine_chat_apply(const engine *eng, const char *name, const engine_chat_msg *msgs, size_t n_msgs,
                      int add_assistant, char *buf, size_t cap, err *e)
{
    int t;
    if (name) {
        t = chat_template_from_name(name);
        if (t < 0) return err_setf(e, ERR_USAGE, "unknown chat template '%s'", name);
    } else {
        t = chat_template_detect(eng->chat_template);
        if (t == ERR_UNSUPPORTED) {
            const char *fam = chat_template_detect_family(eng->chat_template);
            return err_setf(e, ERR_UNSUPPORTED, "the model's chat template (%s) is not supported; "
                            "choose one with --chat-template", fam ? fam : "unknown family");
        }
        if (t < 0)
            return err_setf(e, ERR_UNSUPPORTED, "the model's chat template is not recognised; "
                            "choose one with --chat-template");
    }
    chat_msg *cm = malloc(sizeof *cm * (n_msgs ? n_msgs : 1));
    if (!cm) return err_setf(e, ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_msgs; i++) cm[i] = (chat_msg){ msgs[i].role, msgs[i].content };
    size_t n_out = 0;
    err tmp;
    err_clear(&tmp);
    int rc = chat_apply(t, cm, n_msgs, add_assistant, buf, cap, &n_out, &tmp);
    free(cm);
    if (rc == ERR_RANGE) rc = 0;   /* truncated: the caller retries with the full length */
    if (rc) return err_setf(e, rc, "%s", tmp.msg);
    if (n_out > (size_t)INT32_MAX) return err_setf(e, ERR_RANGE, "formatted conversation too long");
    return (int)n_out;
}

/* ==== Memory and expert streaming ==== */

void engine_memory_plan(const engine *eng, engine_memory *out) { *out = eng->mem; }

int engine_streaming(const engine *eng) { return eng->store != NULL; }

int engine_stream_warm(engine *eng, const int32_t *pairs, uint64_t n, err *e)
{
    if (!eng->store) return err_setf(e, ERR_USAGE, "the experts are not streamed (no arena to fill)");
    return xstore_warm(eng->store, pairs, n, e);
}

int engine_stream_init_line(const engine *eng, char *buf, size_t cap)
{
    if (!eng->store) { if (cap) buf[0] = '\0'; return 0; }
    return xstore_init_line(eng->store, buf, cap);
}

int engine_stream_occupancy(engine *eng, int *n_slots, int *n_filled)
{
    *n_slots = *n_filled = 0;
    if (!eng->store) return ERR_USAGE;
    *n_slots = xstore_n_slots(eng->store);
    *n_filled = xstore_n_filled(eng->store);
    return 0;
}

static void stream_counters_from(engine_stream_counters *out, const xstore_counters *cp)
{
    const xstore_counters c = *cp;
    *out = (engine_stream_counters){
        .chunks = c.chunks, .rows = c.rows, .lookups = c.lookups, .hits = c.hits, .ahead = c.ahead,
        .misses = c.misses, .streamed_in = c.loads, .streamed_in_prefetch = c.loads_prefetch,
        .submissions = c.submissions, .reads = c.reads, .bytes = c.bytes, .predicted = c.predicted,
        .predicted_used = c.predicted_used, .lookups_predicted = c.lookups_predicted,
        .prefetch_wasted = c.prefetch_wasted, .extra_waves = c.waves, .io_errors = c.io_errors,
        .host_ms = c.host_ms, .wait_ms = c.wait_ms,
    };
}

int engine_stream_counters_get(const engine *eng, int phase, engine_stream_counters *out)
{
    memset(out, 0, sizeof *out);
    if (!eng->store) return ERR_USAGE;
    if (phase != ENGINE_PHASE_PROMPT && phase != ENGINE_PHASE_DECODE) return ERR_RANGE;
    xstore_counters c;
    xstore_phase_counters(eng->store, phase == ENGINE_PHASE_PROMPT ? XSTORE_PROMPT : XSTORE_DECODE, &c);
    stream_counters_from(out, &c);
    return 0;
}

void engine_stream_trace(const engine *eng, FILE *out)
{
    if (eng->store) xstore_trace(eng->store, out);
    backend_stats st;
    backend_stats_of(eng, &st);
    if (st.n_slots > 0) {
        char b1[32], b2[32];
        const uint64_t lookups = st.hits + st.misses;
        fprintf(out, "gpu arena: %d slots, %llu lookups, hit rate %.2f, %s copied (prefetched %llu, used %llu), ",
                st.n_slots, (unsigned long long)lookups, lookups ? (double)st.hits / (double)lookups : 0.0,
                human_bytes(b1, sizeof b1, (double)st.bytes_h2d), (unsigned long long)st.prefetched,
                (unsigned long long)st.prefetch_used);
        if (st.pinned_bytes) fprintf(out, "host memory pinned %s\n", human_bytes(b2, sizeof b2, (double)st.pinned_bytes));
        else fprintf(out, "host memory pageable\n");
    }
}

int engine_backend_stats(const engine *eng, engine_gpu_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!eng->be) return ERR_USAGE;
    backend_stats st;
    backend_stats_of(eng, &st);
    *out = (engine_gpu_stats){
        .n_slots = st.n_slots, .hits = st.hits, .misses = st.misses, .bytes_h2d = st.bytes_h2d,
        .prefetched = st.prefetched, .prefetch_used = st.prefetch_used, .pinned_bytes = st.pinned_bytes,
    };
    return 0;
}

void engine_stream_report_json(const engine *eng, FILE *out, const char *indent)
{
    if (eng->store) xstore_report_json(eng->store, out, indent);
    else fputs("null", out);
}

int engine_stream_fault(engine *eng, const char *spec, err *e)
{
    if (!eng->store) return err_setf(e, ERR_USAGE, "fault injection needs expert streaming");
    xio_fault f;
    memset(&f, 0, sizeof f);
    if (spec) {
        int rc = xio_fault_parse(spec, &f, e);
        if (rc) return rc;
    }
    xstore_set_fault(eng->store, &f);
    return 0;
}

uint64_t engine_model_fingerprint(const engine *eng) { return gguf_fingerprint(eng->f); }

/* ==== Routing policy ==== */

int engine_route_describe(const engine *eng, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s", eng->route_desc);
}

int engine_route_spec_check(const char *spec, char *desc, size_t cap, err *e)
{
    route_policy *p = NULL;
    int rc = route_policy_parse(&p, spec, e);
    if (rc) return rc;
    if (desc) route_policy_describe(p, desc, cap);
    route_policy_free(p);
    return 0;
}

int engine_route_reads_residency(const engine *eng)
{
    return route_policy_reads_residency(eng->route, eng->hp.n_expert_used);
}

int engine_route_counters_get(const engine *eng, int arm, engine_route_counters *out)
{
    memset(out, 0, sizeof *out);
    if (arm < 0 || arm >= ROUTE_N_ARMS) return ERR_USAGE;
    const route_counters *c = &eng->route_ctr[arm];
    *out = (engine_route_counters){
        .blocks = c->blocks, .rows = c->rows, .rows_biased = c->rows_biased,
        .slots_changed = c->slots_changed, .slots_changed_resident = c->slots_changed_resident,
        .lookups = c->lookups, .lookups_exact = c->lookups_exact, .masked_blocks = c->masked_blocks,
        .masked_lookups = c->masked_lookups, .masked_resident = c->masked_resident,
        .masked_lookups_exact = c->masked_lookups_exact, .masked_resident_exact = c->masked_resident_exact,
    };
    return 0;
}

/* The xstore arms are numbered as the route arms (xstore.h, route.h). */
_Static_assert((int)XSTORE_ARM_CHUNK0 == (int)ROUTE_ARM_CHUNK0 && (int)XSTORE_ARM_PROMPT == (int)ROUTE_ARM_PROMPT &&
               (int)XSTORE_ARM_DECODE == (int)ROUTE_ARM_DECODE && (int)XSTORE_N_ARMS == (int)ROUTE_N_ARMS,
               "xstore and route arms differ");

int engine_route_stream_counters_get(const engine *eng, int arm, engine_stream_counters *out)
{
    memset(out, 0, sizeof *out);
    if (!eng->store || arm < 0 || arm >= ROUTE_N_ARMS) return ERR_USAGE;
    xstore_counters c;
    xstore_arm_counters(eng->store, arm, &c);
    stream_counters_from(out, &c);
    return 0;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

void engine_route_trace(const engine *eng, FILE *out)
{
    const int k = eng->hp.n_expert_used;
    for (int id = 0; id < ROUTE_N_ARMS; id++) {
        const route_counters *c = &eng->route_ctr[id];
        if (!c->blocks) continue;
        char arm[256];
        route_arm_describe(route_policy_arm(eng->route, id), arm, sizeof arm);
        fprintf(out, "route %s=%s: %llu rows over %llu layer blocks, %llu biased; distinct lookups %llu "
                "(exact routing: %llu, ratio %.4f); slots changed %llu of %llu (%.4f), of them resident %llu",
                route_arm_name(id), arm, (unsigned long long)c->rows, (unsigned long long)c->blocks,
                (unsigned long long)c->rows_biased, (unsigned long long)c->lookups,
                (unsigned long long)c->lookups_exact, ratio(c->lookups, c->lookups_exact),
                (unsigned long long)c->slots_changed, (unsigned long long)(c->rows * (uint64_t)k),
                ratio(c->slots_changed, c->rows * (uint64_t)k), (unsigned long long)c->slots_changed_resident);
        if (c->masked_blocks)
            fprintf(out, "; resident at routing time %.4f of lookups (exact routing: %.4f) in %llu blocks",
                    ratio(c->masked_resident, c->masked_lookups), ratio(c->masked_resident_exact, c->masked_lookups_exact),
                    (unsigned long long)c->masked_blocks);
        engine_stream_counters sc;
        if (engine_route_stream_counters_get(eng, id, &sc) == 0)
            fprintf(out, "; store: %llu chunks, %llu lookups, in the arena %llu, streamed ahead %llu, missed %llu, "
                    "%llu reads, %.3f MB read",
                    (unsigned long long)sc.chunks, (unsigned long long)sc.lookups, (unsigned long long)sc.hits,
                    (unsigned long long)sc.ahead, (unsigned long long)sc.misses, (unsigned long long)sc.reads,
                    (double)sc.bytes / 1e6);
        fputc('\n', out);
    }
}

void engine_route_report_json(const engine *eng, FILE *out, const char *indent)
{
    fprintf(out, "{\"policy\": \"");
    for (const char *p = eng->route_desc; *p; p++) {   /* the spec alphabet needs no escapes but quotes */
        if (*p == '"' || *p == '\\') fputc('\\', out);
        fputc(*p, out);
    }
    fprintf(out, "\", \"reads_residency\": %s, \"arms\": {", engine_route_reads_residency(eng) ? "true" : "false");
    for (int id = 0; id < ROUTE_N_ARMS; id++) {
        const route_counters *c = &eng->route_ctr[id];
        char arm[256];
        route_arm_describe(route_policy_arm(eng->route, id), arm, sizeof arm);
        fprintf(out, "%s\n%s  \"%s\": {\"arm\": \"%s\", \"blocks\": %llu, \"rows\": %llu, \"rows_biased\": %llu, "
                "\"slots_changed\": %llu, \"slots_changed_resident\": %llu, \"lookups\": %llu, \"lookups_exact\": %llu, "
                "\"masked_blocks\": %llu, \"masked_lookups\": %llu, \"masked_resident\": %llu, "
                "\"masked_lookups_exact\": %llu, \"masked_resident_exact\": %llu, \"stream\": ",
                id ? "," : "", indent, route_arm_name(id), arm, (unsigned long long)c->blocks,
                (unsigned long long)c->rows, (unsigned long long)c->rows_biased, (unsigned long long)c->slots_changed,
                (unsigned long long)c->slots_changed_resident, (unsigned long long)c->lookups,
                (unsigned long long)c->lookups_exact, (unsigned long long)c->masked_blocks,
                (unsigned long long)c->masked_lookups, (unsigned long long)c->masked_resident,
                (unsigned long long)c->masked_lookups_exact, (unsigned long long)c->masked_resident_exact);
        engine_stream_counters sc;
        if (engine_route_stream_counters_get(eng, id, &sc) == 0)
            fprintf(out, "{\"chunks\": %llu, \"rows\": %llu, \"lookups\": %llu, \"hits\": %llu, \"ahead\": %llu, "
                    "\"misses\": %llu, \"streamed_in\": %llu, \"reads\": %llu, \"bytes\": %llu, "
                    "\"host_ms\": %.3f, \"wait_ms\": %.3f}}",
                    (unsigned long long)sc.chunks, (unsigned long long)sc.rows, (unsigned long long)sc.lookups,
                    (unsigned long long)sc.hits, (unsigned long long)sc.ahead, (unsigned long long)sc.misses,
                    (unsigned long long)sc.streamed_in, (unsigned long long)sc.reads, (unsigned long long)sc.bytes,
                    sc.host_ms, sc.wait_ms);
        else
            fputs("null}", out);
    }
    fprintf(out, "\n%s}}", indent);
}

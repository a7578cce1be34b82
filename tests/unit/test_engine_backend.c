/* test_engine_backend: the engine's side of the device-backend interface
 * (backend/backend.h), with a fake backend that runs on the CPU, so it
 * needs no GPU: the backend_open_opts the engine builds (KV cache, device
 * arena, read-ahead, and with host_cache_bytes the host tier: the expert
 * store and its arena's span), the weights mode (resident-only under a host
 * tier), the host tier's per-phase counters (session_eval brackets the
 * device evaluation as one chunk), engine_backend_stats, the --trace line
 * and the load summary, and the option errors of engine_open.
 *
 * The fake's eval looks up two experts per layer through the host tier
 * (the expert_src protocol a real backend follows on a miss) and checks
 * that every pointer it gets lies inside the span the engine passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine.h"
#include "mkmodel/mkmodel.h"
#include "testhelp.h"

static char g_model[64];

/* What the fake's open saw, for the checks. */
static struct {
    int               opened;
    backend_open_opts o;
    int               w_mode;
    int               n_layer;
    uint64_t          host_gets, outside;   /* host-tier pointers got; of them outside the span */
} g_seen;

struct backend_model {
    backend_open_opts o;
    int      n_layer, n_expert, n_vocab;
    uint64_t hits, misses;
};

static int fake_open(backend_model **out, const hparams *hp, const weights *w, const backend_open_opts *o, err *e)
{
    *out = NULL;
    g_seen.opened = 1;
    g_seen.o = *o;
    g_seen.w_mode = w->mode;
    g_seen.n_layer = hp->n_layer;
    if (o->host && !o->arena_bytes) return err_setf(e, ERR_USAGE, "fake: a host tier without a device arena");
    backend_model *m = calloc(1, sizeof *m);
    if (!m) return err_setf(e, ERR_NOMEM, "out of memory");
    m->o = *o;
    m->n_layer = hp->n_layer;
    m->n_expert = hp->n_expert;
    m->n_vocab = hp->n_vocab;
    *out = m;
    return 0;
}

/* Two experts per layer from the first id: a miss the first time an
 * expert is seen in a layer, a hit after (the fake's device arena never
 * evicts). Through the host tier when there is one. */
static int fake_eval(backend_model *m, const int32_t *ids, int n, int pos0, float *logits, err *e)
{
    (void)pos0;
    for (int l = 0; l < m->n_layer; l++) {
        int32_t ex[2] = { ids[0] % m->n_expert, (ids[n - 1] + 1) % m->n_expert };
        if (ex[0] == ex[1]) ex[1] = (ex[0] + 1) % m->n_expert;
        if (m->o.host) {
            int k = expert_src_begin_layer(m->o.host, l, ex, 2, e);
            if (k < 0) return k;
            int rc = expert_src_wait_layer(m->o.host, l, e);
            if (rc) return rc;
            const uint8_t *b0 = m->o.host_mem, *b1 = b0 + m->o.host_mem_bytes;
            for (int i = 0; i < k; i++)
                for (int w = 0; w < 3; w++) {
                    const uint8_t *p = expert_src_get(m->o.host, l, ex[i], w);
                    g_seen.host_gets++;
                    if (!p || p < b0 || p >= b1) g_seen.outside++;
                }
            expert_src_end_layer(m->o.host, l);
        }
        m->misses += 2;
    }
    if (logits) memset(logits, 0, sizeof(float) * (size_t)m->n_vocab);
    return 0;
}

static void fake_close(backend_model *m) { free(m); }

static void fake_describe(const backend_model *m, char *buf, size_t cap)
{
    snprintf(buf, cap, "fake device, arena %llu bytes", (unsigned long long)m->o.arena_bytes);
}

static void fake_stats(const backend_model *m, backend_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!m->o.arena_bytes) return;
    *out = (backend_stats){ .n_slots = 7, .hits = m->hits, .misses = m->misses, .bytes_h2d = m->misses * 1000,
                            .prefetched = 3, .prefetch_used = 2, .pinned_bytes = m->o.host_mem_bytes };
}

static const backend_iface k_fake = { "FAKE", fake_open, fake_eval, fake_close, fake_describe, fake_stats };

static engine_opts base_opts(void)
{
    return (engine_opts){ .model_path = g_model, .n_threads = 1, .n_ctx = 64, .no_direct = 1 };
}

/* A file's text (at most cap - 1 bytes) for the message checks. */
static const char *slurp(FILE *f, char *buf, size_t cap)
{
    fflush(f);
    rewind(f);
    const size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    return buf;
}

/* --gpu-arena with --host-cache: the store under the device arena. */
TEST(test_host_tier)
{
    memset(&g_seen, 0, sizeof g_seen);
    engine_opts o = base_opts();
    o.backend = &k_fake;
    o.gpu_arena_bytes = 1 << 20;
    o.host_cache_bytes = 64 << 20;   /* more than every expert: capped at all of them */
    o.read_ahead = 2;
    FILE *log = tmpfile();
    o.verbose = 1;
    o.log = log;
    engine *eng = NULL;
    err e;
    err_clear(&e);
    CHECK_MSG(engine_open(&eng, &o, &e) == 0, "%s", e.msg);
    if (!eng) { fclose(log); return; }
    engine_memory mem;
    engine_memory_plan(eng, &mem);
    CHECK(g_seen.opened);
    CHECK(g_seen.o.host != NULL);
    CHECK(g_seen.o.host_mem != NULL);
    CHECK(mem.arena > 0);
    CHECK_EQ_INT(g_seen.o.host_mem_bytes, mem.arena);
    CHECK_EQ_INT(g_seen.o.arena_bytes, 1 << 20);
    CHECK_EQ_INT(g_seen.o.read_ahead, 2);
    CHECK_EQ_INT(g_seen.o.n_ctx, engine_n_ctx(eng));
    CHECK_EQ_INT(g_seen.o.kv_f16, 1);
    CHECK_EQ_INT(g_seen.w_mode, WEIGHTS_RESIDENT_ONLY);
    CHECK(engine_streaming(eng));
    CHECK(mem.streaming);
    CHECK(!strcmp(engine_backend_name(eng), "FAKE"));
    char text[4096];
    slurp(log, text, sizeof text);
    CHECK_MSG(strstr(text, "through the host cache into the GPU's expert arena") != NULL, "%s", text);
    CHECK_MSG(strstr(text, "host cache") && strstr(text, "(pinned) under the GPU's expert arena of 1.0 MB"),
              "%s", text);
    CHECK_MSG(strstr(text, "strata: host cache: expert arena ") != NULL, "%s", text);
    fclose(log);

    session *s = NULL;
    CHECK_MSG(session_create(&s, eng, &e) == 0, "%s", e.msg);
    if (s) {
        const int32_t prompt[5] = { 1, 2, 3, 4, 5 };
        float *logits = malloc(sizeof(float) * (size_t)engine_n_vocab(eng));
        CHECK_MSG(session_eval(s, prompt, 5, logits, NULL, &e) == 0, "%s", e.msg);
        const int32_t t1 = 9, t2 = 10;
        CHECK_MSG(session_eval(s, &t1, 1, logits, NULL, &e) == 0, "%s", e.msg);
        CHECK_MSG(session_eval(s, &t2, 1, logits, NULL, &e) == 0, "%s", e.msg);
        free(logits);
        CHECK_EQ_INT(session_n_past(s), 7);
        /* the host tier's counters, one chunk per evaluation, by phase */
        engine_stream_counters p, d;
        CHECK(engine_stream_counters_get(eng, ENGINE_PHASE_PROMPT, &p) == 0);
        CHECK(engine_stream_counters_get(eng, ENGINE_PHASE_DECODE, &d) == 0);
        CHECK_EQ_INT(p.chunks, 1);
        CHECK_EQ_INT(p.rows, 5);
        CHECK_EQ_INT(p.lookups, 2 * g_seen.n_layer);
        CHECK_EQ_INT(p.misses, 2 * g_seen.n_layer);   /* a cold store */
        CHECK(p.bytes > 0);
        CHECK_EQ_INT(d.chunks, 2);
        CHECK_EQ_INT(d.rows, 2);
        CHECK_EQ_INT(d.lookups, 4 * g_seen.n_layer);
        engine_gpu_stats gs;
        CHECK(engine_backend_stats(eng, &gs) == 0);
        CHECK_EQ_INT(gs.n_slots, 7);
        CHECK_EQ_INT(gs.misses, 6 * g_seen.n_layer);
        CHECK_EQ_INT(gs.bytes_h2d, gs.misses * 1000);
        CHECK_EQ_INT(gs.prefetched, 3);
        CHECK_EQ_INT(gs.prefetch_used, 2);
        CHECK_EQ_INT(gs.pinned_bytes, mem.arena);
        FILE *tr = tmpfile();
        engine_stream_trace(eng, tr);
        slurp(tr, text, sizeof text);
        fclose(tr);
        CHECK_MSG(strstr(text, "expert stream prompt") != NULL, "%s", text);
        char want[160];
        snprintf(want, sizeof want, "gpu arena: 7 slots, %d lookups, hit rate 0.00, ", 6 * g_seen.n_layer);
        CHECK_MSG(strstr(text, want) != NULL, "%s", text);
        CHECK_MSG(strstr(text, "copied (prefetched 3, used 2), host memory pinned ") != NULL, "%s", text);
        /* every host pointer the fake got was inside the span it was given */
        CHECK_EQ_INT(g_seen.host_gets, 3 * 6 * g_seen.n_layer);
        CHECK_EQ_INT(g_seen.outside, 0);
    }
    session_free(s);
    engine_close(eng);
}

/* --gpu-arena alone: misses copy from the mapped file, no store. */
TEST(test_device_arena_only)
{
    memset(&g_seen, 0, sizeof g_seen);
    engine_opts o = base_opts();
    o.backend = &k_fake;
    o.gpu_arena_bytes = 1 << 20;
    o.read_ahead = 4;
    engine *eng = NULL;
    err e;
    err_clear(&e);
    CHECK_MSG(engine_open(&eng, &o, &e) == 0, "%s", e.msg);
    if (!eng) return;
    CHECK(g_seen.o.host == NULL && g_seen.o.host_mem == NULL && g_seen.o.host_mem_bytes == 0);
    CHECK_EQ_INT(g_seen.o.read_ahead, 4);
    CHECK_EQ_INT(g_seen.w_mode, WEIGHTS_MAP_ALL);
    CHECK(!engine_streaming(eng));
    engine_stream_counters c;
    CHECK(engine_stream_counters_get(eng, ENGINE_PHASE_DECODE, &c) == ERR_USAGE);
    session *s = NULL;
    CHECK_MSG(session_create(&s, eng, &e) == 0, "%s", e.msg);
    if (s) {
        const int32_t t = 3;
        CHECK_MSG(session_eval(s, &t, 1, NULL, NULL, &e) == 0, "%s", e.msg);
    }
    char text[2048];
    FILE *tr = tmpfile();
    engine_stream_trace(eng, tr);
    slurp(tr, text, sizeof text);
    fclose(tr);
    CHECK_MSG(!strncmp(text, "gpu arena: 7 slots, ", 20) && strstr(text, "host memory pageable\n"), "%s", text);
    session_free(s);
    engine_close(eng);

    /* every expert on the device: no arena line */
    o.gpu_arena_bytes = 0;
    o.read_ahead = 0;
    CHECK_MSG(engine_open(&eng, &o, &e) == 0, "%s", e.msg);
    if (!eng) return;
    tr = tmpfile();
    engine_stream_trace(eng, tr);
    slurp(tr, text, sizeof text);
    fclose(tr);
    CHECK_MSG(text[0] == '\0', "%s", text);
    engine_gpu_stats gs;
    CHECK(engine_backend_stats(eng, &gs) == 0 && gs.n_slots == 0);
    engine_close(eng);
}

/* An option error of engine_open: ERR_USAGE, a message naming `want`, no
 * backend opened. */
static void expect_usage(const engine_opts *o, const char *want, int line)
{
    memset(&g_seen, 0, sizeof g_seen);
    engine *eng = NULL;
    err e;
    err_clear(&e);
    const int rc = engine_open(&eng, o, &e);
    CHECK_MSG(rc == ERR_USAGE && strstr(e.msg, want) && !g_seen.opened && !eng, "line %d: rc %d, '%s'", line, rc,
              e.msg);
    engine_close(eng);
}

TEST(test_option_errors)
{
    engine_opts o = base_opts();
    o.host_cache_bytes = 1 << 30;   /* no backend */
    expect_usage(&o, "--host-cache is the host tier under the GPU's expert arena: it needs --gpu", __LINE__);
    o.backend = &k_fake;   /* no device arena */
    expect_usage(&o, "it needs --gpu-arena SIZE", __LINE__);
    o.gpu_arena_bytes = 1 << 20;
    o.stream = 1;
    o.arena_bytes = 1 << 20;
    expect_usage(&o, "on the GPU it is sized by --host-cache SIZE alone", __LINE__);
    o.host_cache_bytes = 0;
    expect_usage(&o, "--host-cache SIZE", __LINE__);
    o.stream = 0;
    o.arena_bytes = 0;
    o.gpu_arena_bytes = 0;
    o.read_ahead = 2;
    expect_usage(&o, "read-ahead on the FAKE backend prefetches into its expert arena", __LINE__);
    o.gpu_arena_bytes = 1 << 20;
    o.read_ahead_from = ENGINE_RA_INPUT;
    expect_usage(&o, "--read-ahead-from input is not available", __LINE__);
    o.read_ahead = 0;
    o.read_ahead_from = 0;
    o.profile_path = "/nonexistent.prof";
    expect_usage(&o, "it needs --host-cache SIZE", __LINE__);

    /* engine_backend_stats on the CPU */
    o = base_opts();
    engine *eng = NULL;
    err e;
    err_clear(&e);
    CHECK_MSG(engine_open(&eng, &o, &e) == 0, "%s", e.msg);
    if (eng) {
        engine_gpu_stats gs;
        CHECK(engine_backend_stats(eng, &gs) == ERR_USAGE && gs.n_slots == 0);
        engine_close(eng);
    }
}

int main(void)
{
    snprintf(g_model, sizeof g_model, "/tmp/strata_engine_backend_%d.gguf", (int)getpid());
    mkmodel_opts mo = { .path = g_model, .seed = 3, .n_threads = 1 };
    err e;
    err_clear(&e);
    if (strata_mkmodel(&mo, NULL, &e)) {
        fprintf(stderr, "mkmodel: %s\n", e.msg);
        printf("engine_backend: 0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_host_tier);
    RUN(test_device_arena_only);
    RUN(test_option_errors);
    unlink(g_model);
    return test_summary("engine_backend");
}

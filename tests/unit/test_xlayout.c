/* test_xlayout: the expert layout gives reads that fill a slot with exactly
 * the GGUF's expert slabs, for every layer-expert, in all four modes
 * (GGUF or sidecar, buffered or O_DIRECT), on an f32 model (tiny preset)
 * and a q4_K one with 16 experts. Also: direct-mode alignment, the EOF rule
 * (a slab that ends in the file's last block), discovery, and out-of-range
 * queries. Reads are issued exactly as xlayout.h's slot contract says, so
 * this is also the reference a store's I/O path can be checked against. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testhelp.h"
#include "engine.h"
#include "expert/sidecar.h"
#include "expert/xlayout.h"
#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "mkmodel/mkmodel.h"
#include "model/expert_src.h"
#include "model/hparams.h"
#include "quant/qtype.h"

static char g_dir[256];
static char g_tiny[300], g_q4[300];

/* ==== Helpers ==== */

/* Fill a slot per the contract; returns 0 or -1 (with a message). */
static int fill_slot(const xlayout *x, int layer, int expert, uint8_t *slot)
{
    xread r[XLAYOUT_MAX_READS];
    const int n = xlayout_reads(x, layer, expert, r);
    if (n < 1) return -1;
    for (int i = 0; i < n; i++) {
        uint64_t done = 0;
        while (done < r[i].bytes) {
            ssize_t got = pread(xlayout_fd(x), slot + r[i].slot_off + done, (size_t)(r[i].bytes - done),
                                (off_t)(r[i].file_off + done));
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) { fprintf(stderr, "pread: %s\n", strerror(errno)); return -1; }
            if (got == 0) break;
            done += (uint64_t)got;
        }
        if (done < r[i].need) { fprintf(stderr, "read %d: %llu of %llu needed\n", i,
                                        (unsigned long long)done, (unsigned long long)r[i].need); return -1; }
    }
    return 0;
}

/* Check one layout against the GGUF: every expert's parts, the read
 * geometry, and the direct-mode alignment. Returns the number of experts
 * that matched. */
static int check_layout(const xlayout *x, const gguf_file *f, int want_sidecar, int want_direct)
{
    CHECK_EQ_INT(xlayout_has_sidecar(x), want_sidecar);
    if (want_direct >= 0) CHECK_EQ_INT(xlayout_direct(x), want_direct);
    const int L = xlayout_n_layer(x), X = xlayout_n_expert(x);
    static const char *const names[3] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };
    uint64_t max_slot = 0;
    for (int l = 0; l < L; l++)
        if (xlayout_slot_bytes(x, l) > max_slot) max_slot = xlayout_slot_bytes(x, l);
    uint8_t *slot = NULL, *want = NULL;
    CHECK(posix_memalign((void **)&slot, XLAYOUT_ALIGN, max_slot) == 0);
    int matched = 0;
    for (int l = 0; l < L; l++) {
        const uint64_t sb = xlayout_slot_bytes(x, l);
        CHECK_EQ_INT(sb % XLAYOUT_ALIGN, 0);
        uint64_t sum = 0;
        int64_t ti[3];
        for (int w = 0; w < 3; w++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[w]);
            ti[w] = gguf_find_tensor(f, name);
            CHECK(ti[w] >= 0);
            CHECK_EQ_INT(xlayout_part_bytes(x, l, w), gguf_tensor(f, ti[w])->nb[2]);
            CHECK_EQ_INT(xlayout_part_type(x, l, w), gguf_tensor(f, ti[w])->type);
            sum += gguf_tensor(f, ti[w])->nb[2];
        }
        CHECK_EQ_INT(xlayout_blob_bytes(x, l), sum);
        for (int e = 0; e < X; e++) {
            xread r[XLAYOUT_MAX_READS];
            const int n = xlayout_reads(x, l, e, r);
            CHECK_EQ_INT(n, want_sidecar ? 1 : 3);
            uint64_t rb = 0;
            for (int i = 0; i < n; i++) {
                CHECK(r[i].need <= r[i].bytes && r[i].need > 0);
                CHECK(r[i].slot_off + r[i].bytes <= sb);
                for (int j = 0; j < i; j++)   /* no two reads overlap in the slot */
                    CHECK(r[i].slot_off >= r[j].slot_off + r[j].bytes || r[j].slot_off >= r[i].slot_off + r[i].bytes);
                if (xlayout_direct(x) || want_sidecar)
                    CHECK(r[i].file_off % XLAYOUT_ALIGN == 0 && r[i].bytes % XLAYOUT_ALIGN == 0 &&
                          r[i].slot_off % XLAYOUT_ALIGN == 0);
                rb += r[i].bytes;
            }
            CHECK_EQ_INT(xlayout_read_bytes(x, l, e), rb);
            memset(slot, 0xa5, sb);
            if (fill_slot(x, l, e, slot)) { CHECK_MSG(0, "layer %d expert %d: reads failed", l, e); continue; }
            int ok = 1;
            for (int w = 0; w < 3; w++) {
                const uint64_t pb = xlayout_part_bytes(x, l, w), po = xlayout_part_off(x, l, e, w);
                CHECK(po + pb <= sb);
                if (!xlayout_direct(x) || want_sidecar) CHECK_EQ_INT(po % 64, 0);
                want = realloc(want, pb);
                CHECK(gguf_read_tensor(f, ti[w], (uint64_t)e * pb, want, pb, NULL) == 0);
                if (memcmp(slot + po, want, pb) != 0) {
                    ok = 0;
                    CHECK_MSG(0, "layer %d expert %d part %d differs from the GGUF", l, e, w);
                }
            }
            matched += ok;
        }
    }
    free(slot);
    free(want);
    return matched;
}

static void open_model(const char *path, gguf_file **f, hparams *hp)
{
    *f = NULL;
    CHECK(gguf_open(f, path, NULL) == 0);
    if (*f) CHECK(hparams_load(hp, *f, NULL) == 0);
}

/* ==== Tests ==== */

TEST(gguf_buffered)
{
    const char *models[2] = { g_tiny, g_q4 };
    for (int m = 0; m < 2; m++) {
        gguf_file *f; hparams hp;
        open_model(models[m], &f, &hp);
        xlayout *x = NULL;
        xlayout_opts o = { .no_sidecar = 1 };
        err e; err_clear(&e);
        CHECK_MSG(xlayout_open(&x, f, &hp, &o, &e) == 0, "%s", e.msg);
        if (x) {
            CHECK_EQ_INT(check_layout(x, f, 0, 0), hp.n_layer * hp.n_expert);
            CHECK(strcmp(xlayout_path(x), models[m]) == 0);
            CHECK(xlayout_fingerprint(x) == gguf_fingerprint(f));
        }
        xlayout_close(x);
        gguf_close(f);
    }
}

TEST(gguf_direct)
{
    const char *models[2] = { g_tiny, g_q4 };
    for (int m = 0; m < 2; m++) {
        gguf_file *f; hparams hp;
        open_model(models[m], &f, &hp);
        xlayout *x = NULL;
        xlayout_opts o = { .no_sidecar = 1, .direct = 1 };
        err e; err_clear(&e);
        CHECK_MSG(xlayout_open(&x, f, &hp, &o, &e) == 0, "%s", e.msg);
        if (x) {
            if (!xlayout_direct(x)) fprintf(stderr, "  note: O_DIRECT refused here; checked buffered fallback\n");
            CHECK_EQ_INT(check_layout(x, f, 0, -1), hp.n_layer * hp.n_expert);
            /* Worst-case slot: each part's aligned region is round_up + 4096. */
            if (xlayout_direct(x))
                for (int l = 0; l < hp.n_layer; l++) {
                    uint64_t want = 0;
                    for (int w = 0; w < 3; w++)
                        want += (xlayout_part_bytes(x, l, w) + 4095) / 4096 * 4096 + 4096;
                    CHECK_EQ_INT(xlayout_slot_bytes(x, l), want);
                }
        }
        xlayout_close(x);
        gguf_close(f);
    }
}

TEST(sidecar_both_modes)
{
    const char *models[2] = { g_tiny, g_q4 };
    for (int m = 0; m < 2; m++) {
        sidecar_write_opts wo = { .model_path = models[m] };
        err e; err_clear(&e);
        CHECK_MSG(sidecar_write(&wo, NULL, &e) == 0, "%s", e.msg);
        gguf_file *f; hparams hp;
        open_model(models[m], &f, &hp);
        for (int direct = 0; direct < 2; direct++) {
            xlayout *x = NULL;
            xlayout_opts o = { .direct = direct };   /* auto-discovery */
            err_clear(&e);
            CHECK_MSG(xlayout_open(&x, f, &hp, &o, &e) == 0, "%s", e.msg);
            if (!x) continue;
            CHECK_EQ_INT(check_layout(x, f, 1, -1), hp.n_layer * hp.n_expert);
            char want[512];
            snprintf(want, sizeof want, "%s.experts", models[m]);
            CHECK(strcmp(xlayout_path(x), want) == 0);
            for (int l = 0; l < hp.n_layer; l++) {   /* one aligned read of the padded blob */
                uint64_t pb[3], po[3], blob = 0;
                for (int w = 0; w < 3; w++) pb[w] = xlayout_part_bytes(x, l, w);
                CHECK(sidecar_blob_layout(pb, po, &blob) == 0);
                CHECK_EQ_INT(xlayout_slot_bytes(x, l), (blob + 4095) / 4096 * 4096);
                for (int w = 0; w < 3; w++) CHECK_EQ_INT(xlayout_part_off(x, l, 1, w), po[w]);
            }
            xlayout_close(x);
        }
        /* no_sidecar overrides discovery */
        xlayout *x = NULL;
        xlayout_opts o = { .no_sidecar = 1 };
        CHECK(xlayout_open(&x, f, &hp, &o, NULL) == 0);
        if (x) CHECK_EQ_INT(xlayout_has_sidecar(x), 0);
        xlayout_close(x);
        gguf_close(f);
    }
}

TEST(explicit_sidecar_path)
{
    char side[512];
    snprintf(side, sizeof side, "%s/elsewhere.bin", g_dir);
    sidecar_write_opts wo = { .model_path = g_q4, .out_path = side };
    sidecar_write_stats st;
    err e; err_clear(&e);
    CHECK_MSG(sidecar_write(&wo, &st, &e) == 0, "%s", e.msg);
    CHECK(strcmp(st.out_path, side) == 0);
    CHECK_EQ_INT(st.n_blobs, 2 * 16);
    gguf_file *f; hparams hp;
    open_model(g_q4, &f, &hp);
    xlayout *x = NULL;
    xlayout_opts o = { .sidecar_path = side, .direct = 1 };
    CHECK(xlayout_open(&x, f, &hp, &o, NULL) == 0);
    if (x) CHECK_EQ_INT(check_layout(x, f, 1, -1), hp.n_layer * hp.n_expert);
    xlayout_close(x);
    /* an explicit path that does not exist is an error, not a fallback */
    char missing[512];
    snprintf(missing, sizeof missing, "%s/nope.experts", g_dir);
    xlayout_opts o2 = { .sidecar_path = missing };
    err_clear(&e);
    x = NULL;
    CHECK_EQ_INT(xlayout_open(&x, f, &hp, &o2, &e), ERR_NOTFOUND);
    CHECK(x == NULL);
    CHECK(strstr(e.msg, "nope.experts") != NULL);
    gguf_close(f);
}

/* A GGUF whose last tensor is an expert tensor with odd-sized slabs: the
 * last slab ends inside the file's last 4096-byte block, so the direct read
 * covering it runs past EOF and may come back short (r.need < r.bytes). */
TEST(direct_eof_rule)
{
    char path[512];
    snprintf(path, sizeof path, "%s/eof.gguf", g_dir);
    gguf_writer *w = gguf_writer_new();
    err e; err_clear(&e);
    CHECK(w != NULL);
    if (!w) return;
    const int X = 3;
    /* ne {in, out, experts}: f32 slabs of 40*7*4 = 1120 bytes (not aligned) */
    int64_t ne_gu[3] = { 40, 7, X }, ne_d[3] = { 7, 40, X };
    CHECK(gguf_writer_add_tensor(w, "blk.0.ffn_gate_exps.weight", QTYPE_F32, 3, ne_gu, &e) == 0);
    CHECK(gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", QTYPE_F32, 3, ne_gu, &e) == 0);
    CHECK(gguf_writer_add_tensor(w, "blk.0.ffn_down_exps.weight", QTYPE_F32, 3, ne_d, &e) == 0);
    CHECK_MSG(gguf_writer_begin(w, path, &e) == 0, "%s", e.msg);
    const uint64_t total = 3ull * 40 * 7 * X * 4;
    uint8_t *data = malloc(total);
    for (uint64_t i = 0; i < total; i++) data[i] = (uint8_t)(i * 131 + 7);
    CHECK(gguf_writer_write(w, data, total, &e) == 0);
    CHECK_MSG(gguf_writer_finish(w, &e) == 0, "%s", e.msg);
    gguf_writer_free(w);
    free(data);

    gguf_file *f = NULL;
    CHECK(gguf_open(&f, path, NULL) == 0);
    if (!f) return;
    hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = 1;
    hp.n_expert = X;
    xlayout *x = NULL;
    xlayout_opts o = { .direct = 1 };
    CHECK(xlayout_open(&x, f, &hp, &o, &e) == 0);
    if (x && xlayout_direct(x)) {
        xread r[XLAYOUT_MAX_READS];
        CHECK_EQ_INT(xlayout_reads(x, 0, X - 1, r), 3);
        CHECK(r[2].file_off + r[2].bytes > gguf_file_size(f));   /* runs past EOF ... */
        CHECK(r[2].need < r[2].bytes);                           /* ... and says so */
        CHECK(r[2].file_off + r[2].need <= gguf_file_size(f));
        CHECK_EQ_INT(check_layout(x, f, 0, 1), X);
    } else {
        fprintf(stderr, "  note: O_DIRECT refused here; EOF rule not exercised\n");
    }
    xlayout_close(x);
    /* not a MoE model: a missing expert tensor is named */
    hp.n_layer = 2;
    x = NULL;
    err_clear(&e);
    CHECK_EQ_INT(xlayout_open(&x, f, &hp, NULL, &e), ERR_NOTFOUND);
    CHECK(strstr(e.msg, "blk.1.ffn_gate_exps.weight") != NULL);
    /* wrong expert count */
    hp.n_layer = 1;
    hp.n_expert = 4;
    err_clear(&e);
    CHECK_EQ_INT(xlayout_open(&x, f, &hp, NULL, &e), ERR_FORMAT);
    gguf_close(f);
}

TEST(out_of_range_queries)
{
    gguf_file *f; hparams hp;
    open_model(g_tiny, &f, &hp);
    xlayout *x = NULL;
    xlayout_opts o = { .no_sidecar = 1 };
    CHECK(xlayout_open(&x, f, &hp, &o, NULL) == 0);
    if (x) {
        xread r[XLAYOUT_MAX_READS];
        CHECK_EQ_INT(xlayout_reads(x, -1, 0, r), -1);
        CHECK_EQ_INT(xlayout_reads(x, hp.n_layer, 0, r), -1);
        CHECK_EQ_INT(xlayout_reads(x, 0, hp.n_expert, r), -1);
        CHECK_EQ_INT(xlayout_reads(x, 0, -1, r), -1);
        CHECK_EQ_INT(xlayout_slot_bytes(x, hp.n_layer), 0);
        CHECK_EQ_INT(xlayout_blob_bytes(x, -1), 0);
        CHECK_EQ_INT(xlayout_part_bytes(x, 0, 3), 0);
        CHECK_EQ_INT(xlayout_part_off(x, 0, 0, -1), 0);
        CHECK_EQ_INT(xlayout_read_bytes(x, 0, hp.n_expert), 0);
        CHECK_EQ_INT(xlayout_n_layer(x), hp.n_layer);
        CHECK_EQ_INT(xlayout_n_expert(x), hp.n_expert);
    }
    xlayout_close(x);
    xlayout_close(NULL);
    char buf[8];
    CHECK_EQ_INT(xlayout_default_sidecar_path("model.gguf", buf, sizeof buf), ERR_RANGE);
    char ok[64];
    CHECK(xlayout_default_sidecar_path("m.gguf", ok, sizeof ok) == 0 && !strcmp(ok, "m.gguf.experts"));
    gguf_close(f);
}

/* ==== Through the engine ==== */

/* Prompt of 12 tokens (every row's logits) then 3 decoded tokens (greedy),
 * into out[15][n_vocab]. Returns 0 or the engine's error code. */
static int run_logits(const engine_opts *o, float **out, int32_t *n_vocab, uint64_t *reads_per_expert, err *e)
{
    engine *eng = NULL;
    session *s = NULL;
    *out = NULL;
    int rc = engine_open(&eng, o, e);
    if (!rc) rc = session_create(&s, eng, e);
    if (!rc) {
        const int32_t V = engine_n_vocab(eng);
        *n_vocab = V;
        float *lg = malloc(sizeof(float) * 15 * (size_t)V);
        int32_t ids[12];
        for (int i = 0; i < 12; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
        rc = lg ? session_eval(s, ids, 12, NULL, lg, e) : ERR_NOMEM;
        for (int t = 0; !rc && t < 3; t++) {
            const float *prev = lg + (size_t)(11 + t) * (size_t)V;
            int32_t next = 0;
            for (int32_t v = 1; v < V; v++) if (prev[v] > prev[next]) next = v;
            rc = session_eval(s, &next, 1, lg + (size_t)(12 + t) * (size_t)V, NULL, e);
        }
        *out = lg;
    }
    if (!rc && o->stream) {   /* which path was used: 1 read per expert (sidecar) or 3 (GGUF) */
        uint64_t reads = 0, experts = 0;
        for (int ph = 0; ph < 2; ph++) {
            engine_stream_counters c;
            if (engine_stream_counters_get(eng, ph, &c) == 0) { reads += c.reads; experts += c.streamed_in; }
        }
        *reads_per_expert = experts ? reads / experts : 0;
        if (experts && reads % experts) *reads_per_expert = 0;
    }
    session_free(s);
    engine_close(eng);
    return rc;
}

/* Issue 3 item 3: both paths give identical logits. With the sidecar
 * (found by itself) and from the GGUF, O_DIRECT and buffered, streaming
 * every lookup (--arena 0): byte-identical to the all-resident run. */
TEST(engine_logits_sidecar_vs_gguf)
{
    const char *models[2] = { g_tiny, g_q4 };
    for (int m = 0; m < 2; m++) {
        sidecar_write_opts wo = { .model_path = models[m] };
        CHECK(sidecar_write(&wo, NULL, NULL) == 0);
        engine_opts base = { .model_path = models[m], .n_threads = 2, .n_ctx = 32 };
        float *ref = NULL;
        int32_t V = 0;
        err e; err_clear(&e);
        uint64_t rpe = 0;
        CHECK_MSG(run_logits(&base, &ref, &V, &rpe, &e) == 0, "resident: %s", e.msg);
        for (int mode = 0; mode < 4; mode++) {
            engine_opts o = base;
            o.stream = 1;
            o.arena_bytes = 0;              /* every lookup is a read */
            o.no_sidecar = mode & 1;        /* GGUF path on odd modes */
            o.no_direct = mode >> 1;        /* buffered on modes 2, 3 */
            float *got = NULL;
            int32_t V2 = 0;
            err_clear(&e);
            const int rc = run_logits(&o, &got, &V2, &rpe, &e);
            CHECK_MSG(rc == 0, "model %d mode %d: %s", m, mode, e.msg);
            CHECK_MSG(rpe == (o.no_sidecar ? 3u : 1u), "model %d mode %d: %llu reads per expert", m, mode,
                      (unsigned long long)rpe);
            if (!rc && ref)
                CHECK_MSG(V2 == V && memcmp(got, ref, sizeof(float) * 15 * (size_t)V) == 0,
                          "model %d: %s %s logits differ from the resident run", m,
                          o.no_sidecar ? "GGUF" : "sidecar", o.no_direct ? "buffered" : "direct");
            free(got);
        }
        free(ref);
    }
    /* a sidecar of another model, named explicitly: refused with the hint */
    char tiny_side[400];
    snprintf(tiny_side, sizeof tiny_side, "%s.experts", g_tiny);
    engine_opts o = { .model_path = g_q4, .n_threads = 2, .n_ctx = 32, .stream = 1, .sidecar_path = tiny_side };
    engine *eng = NULL;
    err e; err_clear(&e);
    CHECK(engine_open(&eng, &o, &e) != 0);
    CHECK(eng == NULL);
    CHECK_MSG(strstr(e.msg, "is stale") && strstr(e.msg, "to rebuild it"), "%s", e.msg);
    engine_close(eng);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/strata-xlayout-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    snprintf(g_tiny, sizeof g_tiny, "%s/tiny.gguf", g_dir);
    snprintf(g_q4, sizeof g_q4, "%s/q4.gguf", g_dir);
    mkmodel_opts a = { .path = g_tiny, .preset = "tiny", .n_threads = 2 };
    mkmodel_opts b = { .path = g_q4, .preset = "tiny", .n_expert = 16, .type_experts = "q4_K", .n_embd = 256,
                       .n_threads = 2 };
    err e; err_clear(&e);
    if (strata_mkmodel(&a, NULL, &e) || strata_mkmodel(&b, NULL, &e)) {
        fprintf(stderr, "mkmodel: %s\n", e.msg);
        return 1;
    }
    RUN(gguf_buffered);
    RUN(gguf_direct);
    RUN(sidecar_both_modes);
    RUN(explicit_sidecar_path);
    RUN(direct_eof_rule);
    RUN(out_of_range_queries);
    RUN(engine_logits_sidecar_vs_gguf);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_summary("xlayout");
}

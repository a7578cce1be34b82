/* test_sidecar: the expert store's two on-disk files.
 *
 * Sidecar (expert/sidecar.h): repack output checked independently of
 * xlayout (header fields by hand, every blob's bytes against the GGUF
 * slices, zero padding, no temporary left behind), then every refusal:
 * stale (other model; same header but other weights), foreign (bad magic,
 * version, a random file), truncated (at every length of the header and
 * index, and a cut data section), corrupt index (checksum; structural
 * errors with a recomputed checksum: misaligned, overlapping, beyond the
 * file, part sizes that disagree with the GGUF). Each refusal must name the
 * rebuild command.
 *
 * Profile (expert/profile.h): counts -> write -> load round trip with the
 * documented ranking, refusal for another model, malformed files, and a
 * routing observer that reports nonsense. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testhelp.h"
#include "engine.h"
#include "expert/profile.h"
#include "expert/sidecar.h"
#include "expert/xlayout.h"
#include "gguf/gguf.h"
#include "mkmodel/mkmodel.h"
#include "model/hparams.h"

static char g_dir[256];
static char g_a[300], g_b[300];   /* two tiny models (seeds 0 and 1); g_b is q4_K with 16 experts */

/* ==== Helpers ==== */

static uint8_t *slurp(const char *path, uint64_t *n)
{
    FILE *in = fopen(path, "rb");
    if (!in) return NULL;
    fseek(in, 0, SEEK_END);
    long len = ftell(in);
    fseek(in, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, in) != (size_t)len) { free(buf); buf = NULL; }
    fclose(in);
    *n = (uint64_t)len;
    return buf;
}

static int spit(const char *path, const void *buf, uint64_t n)
{
    FILE *out = fopen(path, "wb");
    if (!out) return -1;
    int bad = fwrite(buf, 1, (size_t)n, out) != (size_t)n;
    bad |= fclose(out) != 0;
    return bad ? -1 : 0;
}

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* The format's meta hash, written out again from sidecar.h's description. */
static uint64_t meta_hash(const uint8_t *b, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= (i >= 72 && i < 80) ? 0 : b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
static void rehash(uint8_t *b)
{
    const uint64_t end = rd64(b + 40) + rd64(b + 48);
    wr64(b + 72, meta_hash(b, end));
}

/* Open model `model` with sidecar bytes sc[0..n) installed as its default
 * sidecar; returns xlayout_open's code and the message in e. */
static int open_with(const char *model, const uint8_t *sc, uint64_t n, err *e)
{
    char side[512];
    snprintf(side, sizeof side, "%s.experts", model);
    if (sc && spit(side, sc, n)) return -100;
    gguf_file *f = NULL;
    hparams hp;
    if (gguf_open(&f, model, NULL) || hparams_load(&hp, f, NULL)) { gguf_close(f); return -101; }
    xlayout *x = NULL;
    err_clear(e);
    int rc = xlayout_open(&x, f, &hp, NULL, e);
    xlayout_close(x);
    gguf_close(f);
    return rc;
}

/* Expect a refusal naming the rebuild command and `what`. */
#define CHECK_REFUSED(rc, e, model, what) do { \
    char hint_[600]; snprintf(hint_, sizeof hint_, "run 'strata repack %s' to rebuild it", (model)); \
    CHECK_MSG((rc) == ERR_FORMAT, "rc %d: %s", (rc), (e).msg); \
    CHECK_MSG(strstr((e).msg, hint_) != NULL, "no rebuild hint: %s", (e).msg); \
    CHECK_MSG(strstr((e).msg, (what)) != NULL, "expected '%s' in: %s", (what), (e).msg); \
    CHECK_MSG(strchr((e).msg, '\n') == NULL, "not one line: %s", (e).msg); \
} while (0)

static uint8_t *g_good;   /* model A's valid sidecar */
static uint64_t g_good_n;

/* ==== Sidecar ==== */

TEST(repack_bytes)
{
    const char *models[2] = { g_a, g_b };
    for (int m = 0; m < 2; m++) {
        sidecar_write_opts o = { .model_path = models[m], .chunk_bytes = 4096 };   /* many chunks */
        sidecar_write_stats st;
        err e; err_clear(&e);
        CHECK_MSG(sidecar_write(&o, &st, &e) == 0, "%s", e.msg);
        char side[512], tmp[520];
        snprintf(side, sizeof side, "%s.experts", models[m]);
        snprintf(tmp, sizeof tmp, "%s.tmp", side);
        CHECK(strcmp(st.out_path, side) == 0);
        CHECK(access(tmp, F_OK) != 0);   /* renamed, nothing left behind */
        uint64_t n = 0;
        uint8_t *b = slurp(side, &n);
        CHECK(b != NULL);
        if (!b) continue;
        gguf_file *f = NULL;
        hparams hp;
        CHECK(gguf_open(&f, models[m], NULL) == 0 && hparams_load(&hp, f, NULL) == 0);
        /* header, by hand */
        CHECK(memcmp(b, "STRATAXP", 8) == 0);
        CHECK_EQ_INT(rd32(b + 8), 1);
        CHECK_EQ_INT(rd32(b + 12), 4096);
        CHECK(rd64(b + 16) == gguf_file_size(f));
        CHECK(rd64(b + 24) == gguf_fingerprint(f));
        CHECK_EQ_INT(rd32(b + 32), hp.n_layer);
        CHECK_EQ_INT(rd32(b + 36), hp.n_expert);
        CHECK_EQ_INT(rd64(b + 40), 128);
        CHECK_EQ_INT(rd64(b + 48), hp.n_layer * 48 + hp.n_layer * hp.n_expert * 40);
        CHECK_EQ_INT(rd64(b + 56) % 4096, 0);
        CHECK_EQ_INT(rd64(b + 64), n);
        CHECK_EQ_INT(n % 4096, 0);
        CHECK(rd64(b + 72) == meta_hash(b, 128 + rd64(b + 48)));
        CHECK_EQ_INT(st.file_bytes, n);
        CHECK_EQ_INT(st.n_blobs, hp.n_layer * hp.n_expert);
        /* every blob, by hand: parts equal the GGUF slices, padding zero */
        static const char *const names[3] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };
        uint64_t expect_off = rd64(b + 56), bytes_in = 0;
        int good = 0;
        for (int l = 0; l < hp.n_layer; l++) {
            const uint8_t *lt = b + 128 + (uint64_t)l * 48;
            int64_t ti[3];
            for (int w = 0; w < 3; w++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[w]);
                ti[w] = gguf_find_tensor(f, name);
                CHECK_EQ_INT(rd32(lt + 16 * w), gguf_tensor(f, ti[w])->type);
                CHECK(rd64(lt + 16 * w + 8) == gguf_tensor(f, ti[w])->nb[2]);
            }
            for (int x = 0; x < hp.n_expert; x++) {
                const uint8_t *ent = b + 128 + (uint64_t)hp.n_layer * 48 + ((uint64_t)l * hp.n_expert + x) * 40;
                const uint64_t off = rd64(ent), bb = rd64(ent + 8);
                CHECK(off == expect_off);
                int ok = off + bb <= n;
                uint64_t prev_end = 0;
                for (int w = 0; w < 3 && ok; w++) {
                    const uint64_t po = rd64(ent + 16 + 8 * w), pb = gguf_tensor(f, ti[w])->nb[2];
                    CHECK_EQ_INT(po % 64, 0);
                    CHECK(po >= prev_end && po - prev_end < 64);
                    for (uint64_t i = prev_end; i < po; i++) ok &= b[off + i] == 0;
                    uint8_t *want = malloc(pb);
                    CHECK(gguf_read_tensor(f, ti[w], (uint64_t)x * pb, want, pb, NULL) == 0);
                    ok &= memcmp(b + off + po, want, pb) == 0;
                    free(want);
                    prev_end = po + pb;
                    bytes_in += pb;
                }
                CHECK(bb == prev_end);
                const uint64_t next = (off + bb + 4095) / 4096 * 4096;
                for (uint64_t i = off + bb; i < next && ok; i++) ok &= b[i] == 0;
                expect_off = next;
                good += ok;
            }
        }
        CHECK_EQ_INT(good, hp.n_layer * hp.n_expert);
        CHECK_EQ_INT(expect_off, n);
        CHECK_EQ_INT(st.bytes_read, bytes_in);
        /* the parser accepts it and agrees */
        sidecar_index ix;
        err_clear(&e);
        CHECK_MSG(sidecar_parse(&ix, b, n, n, &e) == 0, "%s", e.msg);
        CHECK_EQ_INT(ix.n_layer, hp.n_layer);
        sidecar_index_free(&ix);
        if (m == 0) { g_good = b; g_good_n = n; } else free(b);
        gguf_close(f);
    }
    /* same bytes whatever the chunk size */
    char other[512];
    snprintf(other, sizeof other, "%s/a-bigchunks.experts", g_dir);
    sidecar_write_opts o = { .model_path = g_a, .out_path = other };
    CHECK(sidecar_write(&o, NULL, NULL) == 0);
    uint64_t n2 = 0;
    uint8_t *b2 = slurp(other, &n2);
    CHECK(b2 && g_good && n2 == g_good_n && memcmp(b2, g_good, n2) == 0);
    free(b2);
}

TEST(stale)
{
    if (!g_good) return;
    err e;
    /* A's sidecar next to B: other fingerprint and size */
    int rc = open_with(g_b, g_good, g_good_n, &e);
    CHECK_REFUSED(rc, e, g_b, "is stale");
    /* A copy of A with one expert weight changed in place: same header,
     * same size, same fingerprint; caught by the data sample. */
    char a2[512];
    snprintf(a2, sizeof a2, "%s/a2.gguf", g_dir);
    uint64_t n = 0;
    uint8_t *g = slurp(g_a, &n);
    CHECK(g != NULL);
    if (!g) return;
    gguf_file *f = NULL;
    CHECK(gguf_open(&f, g_a, NULL) == 0);
    const gguf_tensor_info *t = gguf_tensor(f, gguf_find_tensor(f, "blk.1.ffn_up_exps.weight"));
    g[t->file_off + 5] ^= 0x40;
    gguf_close(f);
    CHECK(spit(a2, g, n) == 0);
    free(g);
    rc = open_with(a2, g_good, g_good_n, &e);
    CHECK_REFUSED(rc, e, a2, "other expert weights");
    /* and the fresh one for A itself opens */
    CHECK_EQ_INT(open_with(g_a, g_good, g_good_n, &e), 0);
}

TEST(foreign)
{
    if (!g_good) return;
    err e;
    uint8_t *b = malloc(g_good_n);
    memcpy(b, g_good, g_good_n);
    memcpy(b, "GGUF\3\0\0\0", 8);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "not a strata expert sidecar");
    memcpy(b, g_good, g_good_n);
    wr32(b + 8, 2);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "version 2");
    /* random bytes, and an empty file */
    for (uint64_t i = 0; i < g_good_n; i++) b[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "not a strata expert sidecar");
    CHECK_REFUSED(open_with(g_a, b, 0, &e), e, g_a, "truncated");
    /* n_layer changed (hash recomputed): the shape no longer matches */
    memcpy(b, g_good, g_good_n);
    wr32(b + 36, rd32(b + 36) + 1);
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "sidecar");
    free(b);
}

TEST(truncated)
{
    if (!g_good) return;
    err e;
    const uint64_t meta_end = rd64(g_good + 40) + rd64(g_good + 48);
    /* at a sample of lengths through header and index, then data cut short */
    const uint64_t cuts[] = { 1, 8, 12, 31, 32, 100, 127, 128, 129, 200, meta_end - 1, meta_end, 4096,
                              g_good_n - 4096, g_good_n - 1 };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        int rc = open_with(g_a, g_good, cuts[i], &e);
        CHECK_REFUSED(rc, e, g_a, "sidecar");
    }
    /* padded copy (bytes appended) */
    uint8_t *b = calloc(1, g_good_n + 4096);
    memcpy(b, g_good, g_good_n);
    CHECK_REFUSED(open_with(g_a, b, g_good_n + 4096, &e), e, g_a, "header says");
    free(b);
    /* the parser, at EVERY length of the metadata: fails cleanly, never reads past */
    for (uint64_t n = 0; n < meta_end; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, g_good, n);
        sidecar_index ix;
        err_clear(&e);
        CHECK_MSG(sidecar_parse(&ix, p, n, g_good_n, &e) == ERR_FORMAT, "length %llu accepted", (unsigned long long)n);
        CHECK(ix.layers == NULL && ix.blob_off == NULL);
        free(p);
    }
}

TEST(corrupt_index)
{
    if (!g_good) return;
    err e;
    uint8_t *b = malloc(g_good_n);
    const uint64_t L = rd32(g_good + 32), X = rd32(g_good + 36);
    const uint64_t ent0 = 128 + L * 48;   /* first entry */
    const uint64_t entl = ent0 + (L * X - 1) * 40;   /* last entry */

    memcpy(b, g_good, g_good_n);
    b[ent0 + 3] ^= 1;   /* any flipped byte: checksum */
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "checksum");

    memcpy(b, g_good, g_good_n);
    wr64(b + ent0, rd64(b + ent0) + 64);   /* misaligned */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "misaligned");

    memcpy(b, g_good, g_good_n);
    wr64(b + entl, g_good_n);   /* last blob beyond the file */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "beyond the file");

    memcpy(b, g_good, g_good_n);
    wr64(b + ent0 + 40, rd64(b + ent0));   /* second blob on top of the first */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "overlaps");

    memcpy(b, g_good, g_good_n);
    wr64(b + ent0 + 8, rd64(b + ent0 + 8) + 1);   /* blob size off the canonical layout */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "layer 0 expert 0");

    memcpy(b, g_good, g_good_n);
    wr64(b + ent0 + 24, rd64(b + ent0 + 24) + 64);   /* up part moved */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "parts at");

    /* a layer's part size that disagrees with the GGUF, made self-consistent:
     * shrink layer 0's down part by 4 bytes and every entry's blob bytes */
    memcpy(b, g_good, g_good_n);
    wr64(b + 128 + 32 + 8, rd64(b + 128 + 32 + 8) - 4);
    for (uint64_t x = 0; x < X; x++) wr64(b + ent0 + x * 40 + 8, rd64(b + ent0 + x * 40 + 8) - 4);
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "ffn_down_exps is type");

    memcpy(b, g_good, g_good_n);
    wr32(b + 128, 1);   /* layer 0 gate type f32 -> f16 */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "ffn_gate_exps is type 1");

    memcpy(b, g_good, g_good_n);
    b[100] = 1;   /* reserved */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "reserved");

    memcpy(b, g_good, g_good_n);
    wr64(b + 56, 4096 * 1000);   /* data beyond the file */
    rehash(b);
    CHECK_REFUSED(open_with(g_a, b, g_good_n, &e), e, g_a, "data at");
    /* random byte flips anywhere in the metadata never crash the parser */
    uint64_t seed = 12345;
    const uint64_t meta_end = rd64(g_good + 40) + rd64(g_good + 48);
    for (int it = 0; it < 2000; it++) {
        memcpy(b, g_good, (size_t)meta_end);
        for (int k = 0; k < 3; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            b[(seed >> 33) % meta_end] ^= (uint8_t)(1u << ((seed >> 20) & 7));
        }
        if (it & 1) wr64(b + 72, meta_hash(b, meta_end));   /* past the checksum, into the checks */
        sidecar_index ix;
        if (sidecar_parse(&ix, b, meta_end, g_good_n, NULL) == 0) sidecar_index_free(&ix);
    }
    free(b);
    /* restore A's good sidecar */
    CHECK_EQ_INT(open_with(g_a, g_good, g_good_n, &e), 0);
}

TEST(write_errors)
{
    err e; err_clear(&e);
    char bad[512];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.experts", g_dir);
    sidecar_write_opts o = { .model_path = g_a, .out_path = bad };
    CHECK_EQ_INT(sidecar_write(&o, NULL, &e), ERR_IO);
    CHECK(strstr(e.msg, "no/such/dir") != NULL);
    sidecar_write_opts o2 = { .model_path = bad };
    err_clear(&e);
    CHECK(sidecar_write(&o2, NULL, &e) != 0);
}

/* ==== Profile ==== */

static void model_facts(const char *path, uint64_t *fp, uint64_t *size, hparams *hp)
{
    gguf_file *f = NULL;
    CHECK(gguf_open(&f, path, NULL) == 0);
    CHECK(hparams_load(hp, f, NULL) == 0);
    *fp = gguf_fingerprint(f);
    *size = gguf_file_size(f);
    gguf_close(f);
}

static int make_profile(const char *model, const char *out, int bad_route)
{
    gguf_file *f = NULL;
    if (gguf_open(&f, model, NULL)) return -1;
    profile_counts *c = NULL;
    int rc = profile_counts_open(&c, f, NULL);
    gguf_close(f);
    if (rc) return rc;
    /* tiny: 2 layers, 8 experts, k = 2. Prompt: 3 rows per layer routed to
     * (l+1, 7), (l+1, 5), (3, 6); decode: 1 row (5, 3) per layer. */
    for (int l = 0; l < 2; l++) {
        const int32_t p[6] = { l + 1, 7, l + 1, 5, 3, 6 };
        profile_counts_route(c, PROFILE_PROMPT, l, p, 3, 2);
        const int32_t d[2] = { 5, 3 };
        profile_counts_route(c, PROFILE_DECODE, l, d, 1, 2);
    }
    profile_counts_tokens(c, PROFILE_PROMPT, 3);
    profile_counts_tokens(c, PROFILE_DECODE, 1);
    if (bad_route) {
        const int32_t x[2] = { 0, 8 };
        profile_counts_route(c, PROFILE_DECODE, 0, x, 1, 2);
    }
    rc = profile_write(c, out, NULL);
    profile_counts_close(c);
    return rc;
}

TEST(profile_roundtrip)
{
    char path[512];
    snprintf(path, sizeof path, "%s/a.profile", g_dir);
    CHECK(make_profile(g_a, path, 0) == 0);
    uint64_t fp, size;
    hparams hp;
    model_facts(g_a, &fp, &size, &hp);
    profile *p = NULL;
    err e; err_clear(&e);
    CHECK_MSG(profile_load(&p, path, fp, size, hp.n_layer, hp.n_expert, &e) == 0, "%s", e.msg);
    if (!p) return;
    CHECK_EQ_INT(profile_n(p), hp.n_layer * hp.n_expert);
    CHECK_EQ_INT(profile_lookups(p, PROFILE_PROMPT), 2 * 3 * 2);
    CHECK_EQ_INT(profile_lookups(p, PROFILE_DECODE), 2 * 1 * 2);
    CHECK_EQ_INT(profile_n_tokens(p, PROFILE_PROMPT), 3);
    CHECK_EQ_INT(profile_n_tokens(p, PROFILE_DECODE), 1);
    const profile_entry *r = profile_entries(p);
    /* Scores (prompt/12 + decode/4): layer l: e(l+1) 2/12, e6 and e7 1/12,
     * e3 and e5 1/12+1/4. So: the four 1/3s in (layer, expert) order, then
     * (0,1) and (1,2) at 2/12, then (0,6), (0,7), (1,6), (1,7) at 1/12, then
     * the unused ones from (0,0). */
    CHECK(r[0].layer == 0 && r[0].expert == 3 && r[0].prompt == 1 && r[0].decode == 1);
    CHECK(r[1].layer == 0 && r[1].expert == 5);
    CHECK(r[2].layer == 1 && r[2].expert == 3);
    CHECK(r[3].layer == 1 && r[3].expert == 5);
    CHECK(r[4].layer == 0 && r[4].expert == 1 && r[4].prompt == 2 && r[4].decode == 0);
    CHECK(r[5].layer == 1 && r[5].expert == 2 && r[5].prompt == 2);
    CHECK(r[6].layer == 0 && r[6].expert == 6 && r[6].prompt == 1);
    CHECK(r[7].layer == 0 && r[7].expert == 7);
    CHECK(r[8].layer == 1 && r[8].expert == 6);
    CHECK(r[9].layer == 1 && r[9].expert == 7);
    CHECK(r[10].layer == 0 && r[10].expert == 0 && r[10].prompt == 0 && r[10].decode == 0);
    uint64_t sp = 0, sd = 0;
    for (uint64_t i = 0; i < profile_n(p); i++) { sp += r[i].prompt; sd += r[i].decode; }
    CHECK_EQ_INT(sp, 12);
    CHECK_EQ_INT(sd, 4);
    profile_close(p);
    profile_close(NULL);
}

TEST(profile_other_model)
{
    char path[512];
    snprintf(path, sizeof path, "%s/a.profile", g_dir);
    uint64_t fp, size;
    hparams hp;
    model_facts(g_b, &fp, &size, &hp);
    profile *p = NULL;
    err e; err_clear(&e);
    CHECK_EQ_INT(profile_load(&p, path, fp, size, hp.n_layer, hp.n_expert, &e), ERR_FORMAT);
    CHECK(p == NULL);
    CHECK_MSG(strstr(e.msg, "different model") && strstr(e.msg, "strata profile -m"), "%s", e.msg);
    /* same fingerprint, other shape: refused too */
    model_facts(g_a, &fp, &size, &hp);
    err_clear(&e);
    CHECK_EQ_INT(profile_load(&p, path, fp, size, hp.n_layer, hp.n_expert + 1, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(profile_load(&p, path, fp ^ 1, size, hp.n_layer, hp.n_expert, &e), ERR_FORMAT);
    snprintf(path, sizeof path, "%s/none.profile", g_dir);
    err_clear(&e);
    CHECK_EQ_INT(profile_load(&p, path, fp, size, hp.n_layer, hp.n_expert, &e), ERR_NOTFOUND);
}

/* Replace the first occurrence of `from` by `to` in the good profile and try
 * to load the result; returns the code, message in e. */
static int load_edited(const char *from, const char *to, err *e)
{
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/a.profile", g_dir);
    snprintf(out, sizeof out, "%s/edit.profile", g_dir);
    uint64_t n = 0;
    uint8_t *b = slurp(path, &n);
    if (!b) return -100;
    b[n] = 0;
    char *hit = strstr((char *)b, from);
    if (!hit) { free(b); return -101; }
    const size_t pre = (size_t)(hit - (char *)b), fl = strlen(from), tl = strlen(to);
    char *nb = malloc(n + tl + 1);
    memcpy(nb, b, pre);
    memcpy(nb + pre, to, tl);
    memcpy(nb + pre + tl, hit + fl, n - pre - fl);
    const uint64_t nn = n - fl + tl;
    free(b);
    int rc = spit(out, nb, nn);
    free(nb);
    if (rc) return -102;
    uint64_t fp, size;
    hparams hp;
    model_facts(g_a, &fp, &size, &hp);
    profile *p = NULL;
    err_clear(e);
    rc = profile_load(&p, out, fp, size, hp.n_layer, hp.n_expert, e);
    profile_close(p);
    return rc;
}

TEST(profile_malformed)
{
    err e;
    CHECK_EQ_INT(load_edited("# rank", "# rank", &e), 0);   /* unedited loads */
    CHECK_EQ_INT(load_edited("strata-profile 1 ", "strata-profile 2 ", &e), ERR_UNSUPPORTED);
    CHECK_EQ_INT(load_edited("strata-profile", "strata-profiles", &e), ERR_FORMAT);
    CHECK_EQ_INT(load_edited(" k=2", " k=-2", &e), ERR_FORMAT);
    CHECK_EQ_INT(load_edited("prompt_lookups=12", "prompt_lookups=13", &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "sum") != NULL);
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n0 0 3 1 1 \n", &e), ERR_FORMAT);   /* trailing blank */
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n0 0 3 +1 1\n", &e), ERR_FORMAT);
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n0 0 9 1 1\n", &e), ERR_FORMAT);   /* expert range */
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n0 2 3 1 1\n", &e), ERR_FORMAT);   /* layer range */
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n1 0 3 1 1\n", &e), ERR_FORMAT);   /* rank order */
    CHECK_EQ_INT(load_edited("\n1 0 5 1 1\n", "\n1 0 3 1 1\n", &e), ERR_FORMAT);   /* twice */
    CHECK(strstr(e.msg, "twice") != NULL);
    CHECK_EQ_INT(load_edited("\n0 0 3 1 1\n", "\n0 0 3 99999999999999999999 1\n", &e), ERR_FORMAT);
    CHECK_EQ_INT(load_edited("\n15 ", "\n#15 ", &e), ERR_FORMAT);   /* one missing */
    CHECK(strstr(e.msg, "listed") != NULL);
    CHECK_EQ_INT(load_edited("fp=", "fp=x", &e), ERR_FORMAT);
    /* truncated: no final newline */
    char path[512];
    snprintf(path, sizeof path, "%s/a.profile", g_dir);
    uint64_t n = 0;
    uint8_t *b = slurp(path, &n);
    char cut[512];
    snprintf(cut, sizeof cut, "%s/cut.profile", g_dir);
    uint64_t fp, size;
    hparams hp;
    model_facts(g_a, &fp, &size, &hp);
    for (uint64_t k = 0; b && k < n; k += 7) {   /* every 7th length: refused, never crashes */
        CHECK(spit(cut, b, k) == 0);
        profile *p = NULL;
        CHECK_MSG(profile_load(&p, cut, fp, size, hp.n_layer, hp.n_expert, NULL) != 0, "length %llu",
                  (unsigned long long)k);
        profile_close(p);
    }
    free(b);
}

TEST(profile_bad_observer)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bad.profile", g_dir);
    CHECK_EQ_INT(make_profile(g_a, path, 1), ERR_INTERNAL);
    CHECK(access(path, F_OK) != 0);
}

/* Through the engine's routing observer: exact totals (rows x n_layer x k
 * per phase, every row of every layer routed when all logits are asked
 * for), a round trip, and the profile used for a warm fill: accepted for
 * its model, refused for another. */
typedef struct obs { profile_counts *c; int phase; } obs;
static void observe(void *ctx, int layer, const int32_t *experts, int n_rows, int k)
{
    obs *o = (obs *)ctx;
    profile_counts_route(o->c, o->phase, layer, experts, n_rows, k);
}

TEST(profile_engine)
{
    gguf_file *f = NULL;
    profile_counts *c = NULL;
    CHECK(gguf_open(&f, g_a, NULL) == 0 && profile_counts_open(&c, f, NULL) == 0);
    gguf_close(f);
    if (!c) return;
    obs ob = { c, PROFILE_PROMPT };
    engine_opts eo = { .model_path = g_a, .n_threads = 2, .n_ctx = 64, .on_route = observe, .on_route_ctx = &ob };
    engine *eng = NULL;
    session *s = NULL;
    err e; err_clear(&e);
    CHECK_MSG(engine_open(&eng, &eo, &e) == 0 && session_create(&s, eng, &e) == 0, "%s", e.msg);
    if (!s) { engine_close(eng); profile_counts_close(c); return; }
    hparams hp;
    uint64_t fp, size;
    model_facts(g_a, &fp, &size, &hp);
    const int32_t V = engine_n_vocab(eng);
    float *lg = malloc(sizeof(float) * 20 * (size_t)V);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (int32_t)((i * 7 + 3) % V);
    CHECK(session_eval(s, ids, 20, NULL, lg, &e) == 0);
    profile_counts_tokens(c, PROFILE_PROMPT, 20);
    ob.phase = PROFILE_DECODE;
    for (int t = 0; t < 5; t++) {
        CHECK(session_eval(s, &ids[t], 1, lg, NULL, &e) == 0);
        profile_counts_tokens(c, PROFILE_DECODE, 1);
    }
    CHECK_EQ_INT(profile_counts_lookups(c, PROFILE_PROMPT), 20 * hp.n_layer * hp.n_expert_used);
    CHECK_EQ_INT(profile_counts_lookups(c, PROFILE_DECODE), 5 * hp.n_layer * hp.n_expert_used);
    free(lg);
    session_free(s);
    engine_close(eng);
    char path[512];
    snprintf(path, sizeof path, "%s/engine.profile", g_dir);
    CHECK(profile_write(c, path, &e) == 0);
    profile_counts_close(c);
    profile *p = NULL;
    CHECK(profile_load(&p, path, fp, size, hp.n_layer, hp.n_expert, &e) == 0);
    if (p) {
        CHECK_EQ_INT(profile_n_tokens(p, PROFILE_PROMPT), 20);
        CHECK_EQ_INT(profile_n_tokens(p, PROFILE_DECODE), 5);
        CHECK(profile_entries(p)[0].prompt + profile_entries(p)[0].decode > 0);
    }
    profile_close(p);
    /* warm fill from it: fine for A, refused for B */
    engine_opts wa = { .model_path = g_a, .n_threads = 2, .n_ctx = 32, .stream = 1, .arena_bytes = 64ull << 20,
                       .no_sidecar = 1, .profile_path = path };
    eng = NULL;
    err_clear(&e);
    CHECK_MSG(engine_open(&eng, &wa, &e) == 0, "%s", e.msg);
    engine_close(eng);
    engine_opts wb = wa;
    wb.model_path = g_b;
    eng = NULL;
    err_clear(&e);
    CHECK(engine_open(&eng, &wb, &e) != 0);
    CHECK_MSG(strstr(e.msg, "different model") != NULL, "%s", e.msg);
    engine_close(eng);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/strata-sidecar-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    snprintf(g_a, sizeof g_a, "%s/a.gguf", g_dir);
    snprintf(g_b, sizeof g_b, "%s/b.gguf", g_dir);
    mkmodel_opts a = { .path = g_a, .preset = "tiny", .n_threads = 2 };
    mkmodel_opts b = { .path = g_b, .preset = "tiny", .seed = 1, .n_expert = 16, .type_experts = "q4_K",
                       .n_embd = 256, .n_threads = 2 };
    err e; err_clear(&e);
    if (strata_mkmodel(&a, NULL, &e) || strata_mkmodel(&b, NULL, &e)) {
        fprintf(stderr, "mkmodel: %s\n", e.msg);
        return 1;
    }
    RUN(repack_bytes);
    RUN(stale);
    RUN(foreign);
    RUN(truncated);
    RUN(corrupt_index);
    RUN(write_errors);
    RUN(profile_roundtrip);
    RUN(profile_other_model);
    RUN(profile_malformed);
    RUN(profile_bad_observer);
    RUN(profile_engine);
    free(g_good);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_summary("sidecar");
}

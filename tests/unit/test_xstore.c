/* test_xstore: the expert store over a synthetic layout on a temporary
 * file: size classes and the arena plan, every part's bytes through get(),
 * lookups/hits/misses, waves when a layer's set does not fit, LRU and LFU
 * choices, prefetch (ahead, accuracy, wasted guesses, promotion), the
 * streaming mode (arena 0), the warm fill, chunk and phase counters, and
 * injected I/O faults (clean error naming layer/expert/offset, then a
 * correct re-read). Both I/O backends; buffered and O_DIRECT fds.
 *
 * Layout: layer l has parts of P(l) bytes; expert (l, x) is a blob at
 * blob_off(l, x) (4096-aligned). Odd layers read the blob in one aligned
 * read (a sidecar); even layers read the three parts exactly, unaligned (the
 * GGUF, buffered). Two part sizes, so two size classes. Byte o of the file
 * is pattern(o), so a part is checked against the file offset it came from. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert/xstore.h"
#include "testhelp.h"

#define NL 4
#define NX 16

static char g_path[64];
static int  g_aligned_only;   /* every layer uses the one-read blob (O_DIRECT runs) */

static uint8_t pattern(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 11) ^ (uint8_t)(i >> 20); }

static uint64_t part_bytes(int l)  { return l % 2 ? 5000 : 3000; }
static uint64_t up4k(uint64_t n)    { return (n + 4095) & ~(uint64_t)4095; }
static uint64_t up64(uint64_t n)    { return (n + 63) & ~(uint64_t)63; }
static uint64_t blob_bytes(int l)  { return up4k(3 * part_bytes(l)); }
static uint64_t blob_off(int l, int x)
{
    uint64_t off = 0;
    for (int i = 0; i < l; i++) off += (uint64_t)NX * blob_bytes(i);
    return off + (uint64_t)x * blob_bytes(l);
}
static uint64_t file_bytes(void) { return blob_off(NL, 0); }
static int one_read(int l) { return g_aligned_only || l % 2; }

static uint64_t lay_slot_bytes(const void *ctx, int l)
{
    (void)ctx;
    return one_read(l) ? blob_bytes(l) : up4k(3 * up64(part_bytes(l)));
}

static int lay_reads(const void *ctx, int l, int x, xread r[XLAYOUT_MAX_READS])
{
    (void)ctx;
    if (one_read(l)) {
        r[0] = (xread){ blob_off(l, x), blob_bytes(l), 0, blob_bytes(l) };
        return 1;
    }
    for (int w = 0; w < 3; w++) {
        const uint64_t p = part_bytes(l);
        r[w] = (xread){ blob_off(l, x) + (uint64_t)w * p, p, (uint64_t)w * up64(p), p };
    }
    return 3;
}

static uint64_t lay_part_off(const void *ctx, int l, int x, int w)
{
    (void)ctx; (void)x;
    return one_read(l) ? (uint64_t)w * part_bytes(l) : (uint64_t)w * up64(part_bytes(l));
}

/* The file offset part w of (l, x) came from. */
static uint64_t part_file_off(int l, int x, int w) { return blob_off(l, x) + (uint64_t)w * part_bytes(l); }

static int part_ok(expert_src *src, int l, int x)
{
    for (int w = 0; w < 3; w++) {
        const uint8_t *p = expert_src_get(src, l, x, w);
        if (!p) return 0;
        const uint64_t o = part_file_off(l, x, w);
        for (uint64_t i = 0; i < part_bytes(l); i++) if (p[i] != pattern(o + i)) return 0;
    }
    return 1;
}

typedef struct fixture {
    int            fd;
    xstore_layout  lay;
    xstore        *s;
    expert_src    *src;
} fixture;

static int fx_open(fixture *f, uint64_t arena, int evict, int io_mode, int direct, int read_ahead)
{
    memset(f, 0, sizeof *f);
    f->fd = open(g_path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (f->fd < 0) { direct = 0; f->fd = open(g_path, O_RDONLY); }
    f->lay = (xstore_layout){ NL, NX, f->fd, direct, "test file", NULL, lay_slot_bytes, lay_reads, lay_part_off };
    xstore_opts o = { .arena_bytes = arena, .evict = evict, .io_mode = io_mode, .io_threads = 3, .io_depth = 3,
                      .n_expert_used = 2, .read_ahead = read_ahead };
    err e;
    err_clear(&e);
    int rc = xstore_open(&f->s, &f->lay, &o, &e);
    if (rc) { fprintf(stderr, "xstore_open: %s\n", e.msg); return rc; }
    f->src = xstore_src(f->s);
    return 0;
}

static void fx_close(fixture *f)
{
    xstore_close(f->s);
    if (f->fd >= 0) close(f->fd);
}

/* Run one layer the way the forward does: waves until the set is done,
 * checking every expert's bytes. Returns the number of waves, or -1. */
static int run_layer(fixture *f, int l, const int32_t *set, int n)
{
    int32_t ex[NX];
    memcpy(ex, set, sizeof *ex * (size_t)n);
    int waves = 0, seen[NX] = { 0 };
    for (int done = 0; done < n;) {
        err e;
        err_clear(&e);
        const int k = expert_src_begin_layer(f->src, l, ex + done, n - done, &e);
        if (k < 1 || k > n - done) { fprintf(stderr, "begin_layer: %d %s\n", k, e.msg); return -1; }
        if (expert_src_wait_layer(f->src, l, &e)) { fprintf(stderr, "wait_layer: %s\n", e.msg); return -1; }
        for (int i = done; i < done + k; i++) {
            if (!part_ok(f->src, l, ex[i])) { fprintf(stderr, "bad bytes: layer %d expert %d\n", l, ex[i]); return -1; }
            seen[ex[i]]++;
        }
        expert_src_end_layer(f->src, l);
        done += k;
        waves++;
    }
    for (int i = 0; i < n; i++) if (seen[set[i]] != 1) return -1;
    return waves;
}

static int check_ok(fixture *f)
{
    err e;
    err_clear(&e);
    int rc = xstore_check(f->s, &e);
    if (rc) fprintf(stderr, "xstore_check: %s\n", e.msg);
    return rc == 0;
}

static const int k_io[2] = { XIO_URING, XIO_PREAD };

/* Classes, proportional split, the minimum, arena 0 buffers. */
TEST(test_plan)
{
    fixture f;
    uint64_t total_all = 0;
    for (int l = 0; l < NL; l++) total_all += (uint64_t)NX * lay_slot_bytes(NULL, l);
    CHECK(fx_open(&f, 64 << 20, XSTORE_EVICT_LRU, XIO_PREAD, 0, 0) == 0);
    CHECK_EQ_INT(xstore_n_classes(f.s), 2);
    CHECK_EQ_INT(xstore_n_slots(f.s), NL * NX);   /* everything fits: capped at all experts */
    CHECK_EQ_INT(xstore_arena_bytes(f.s), total_all);
    fx_close(&f);

    CHECK(fx_open(&f, total_all / 2, XSTORE_EVICT_LRU, XIO_PREAD, 0, 0) == 0);
    CHECK(xstore_arena_bytes(f.s) <= total_all / 2);
    CHECK(xstore_arena_bytes(f.s) > total_all / 2 - 2 * 16384);
    CHECK(xstore_n_slots(f.s) >= NL * NX / 2 - 2 && xstore_n_slots(f.s) <= NL * NX / 2 + 2);
    char line[512];
    xstore_init_line(f.s, line, sizeof line);
    CHECK_MSG(strstr(line, "slots in 2 size classes") && strstr(line, "no warm fill"), "%s", line);
    fx_close(&f);

    /* below the minimum: 2 slots of each class */
    xstore_layout lay = { NL, NX, 0, 0, "t", NULL, lay_slot_bytes, lay_reads, lay_part_off };
    xstore_opts o = { .arena_bytes = 20000 };
    uint64_t b;
    err e;
    err_clear(&e);
    CHECK(xstore_plan(&lay, &o, &b, &e) == ERR_USAGE);
    CHECK_MSG(strstr(e.msg, "below the minimum") != NULL, "%s", e.msg);
    o.arena_bytes = 2 * lay_slot_bytes(NULL, 0) + 2 * lay_slot_bytes(NULL, 1);
    CHECK(xstore_plan(&lay, &o, &b, NULL) == 0 && b == o.arena_bytes);
    o.arena_bytes = 0;
    o.n_expert_used = 3;
    CHECK(xstore_plan(&lay, &o, &b, NULL) == 0 && b == 6 * lay_slot_bytes(NULL, 0) + 6 * lay_slot_bytes(NULL, 1));
}

/* The arena's span: one page-aligned mapping of xstore_arena_bytes that
 * holds every part expert_src_get returns (what a device backend
 * page-locks), with an arena and in the streaming mode. */
TEST(test_arena_span)
{
    uint64_t total_all = 0;
    for (int l = 0; l < NL; l++) total_all += (uint64_t)NX * lay_slot_bytes(NULL, l);
    const uint64_t arenas[2] = { total_all / 2, 0 };
    for (int a = 0; a < 2; a++) {
        fixture f;
        CHECK(fx_open(&f, arenas[a], XSTORE_EVICT_LRU, XIO_PREAD, 0, 0) == 0);
        if (!f.s) continue;
        void *base = NULL;
        uint64_t bytes = 0;
        xstore_arena_span(f.s, &base, &bytes);
        CHECK(base != NULL);
        CHECK_EQ_INT(bytes, xstore_arena_bytes(f.s));
        CHECK(bytes > 0);
        CHECK_EQ_INT((uintptr_t)base % 4096, 0);
        const uint8_t *b0 = base, *b1 = b0 + bytes;
        int32_t set[2] = { 1, 6 };
        for (int l = 0; l < NL; l++) {
            err e;
            err_clear(&e);
            int32_t ex[2] = { set[0], set[1] };
            const int k = expert_src_begin_layer(f.src, l, ex, 2, &e);
            CHECK_MSG(k == 2, "begin_layer: %d %s", k, e.msg);
            CHECK(expert_src_wait_layer(f.src, l, &e) == 0);
            for (int i = 0; i < k; i++)
                for (int w = 0; w < 3; w++) {
                    const uint8_t *p = expert_src_get(f.src, l, ex[i], w);
                    CHECK_MSG(p && p >= b0 && p + part_bytes(l) <= b1, "layer %d expert %d part %d outside the span",
                              l, ex[i], w);
                }
            expert_src_end_layer(f.src, l);
        }
        fx_close(&f);
    }
}

/* Random sets over several chunks: bytes, counters, invariants. */
TEST(test_lookups_and_counters)
{
    for (int m = 0; m < 2; m++)
        for (int pol = 0; pol < 2; pol++) {
            fixture f;
            CHECK(fx_open(&f, 20 * 16384, pol, k_io[m], 0, 0) == 0);
            if (!f.s) continue;
            uint64_t seed = 11 + (uint64_t)pol;
            uint64_t lookups = 0;
            for (int chunk = 0; chunk < 12; chunk++) {
                xstore_chunk_begin(f.s, chunk < 4 ? XSTORE_PROMPT : XSTORE_DECODE, 1);
                for (int l = 0; l < NL; l++) {
                    int32_t set[NX];
                    int n = 0;
                    for (int x = 0; x < NX; x++) {
                        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                        if ((seed >> 60) < (chunk < 4 ? 8u : 3u)) set[n++] = x;   /* popular low ids */
                    }
                    if (!n) set[n++] = (int32_t)(seed % NX);
                    CHECK(run_layer(&f, l, set, n) >= 1);
                    lookups += (uint64_t)n;
                }
                xstore_chunk_end(f.s);
                CHECK(check_ok(&f));
            }
            xstore_counters p, d, c;
            xstore_phase_counters(f.s, XSTORE_PROMPT, &p);
            xstore_phase_counters(f.s, XSTORE_DECODE, &d);
            CHECK_EQ_INT(p.chunks, 4);
            CHECK_EQ_INT(d.chunks, 8);
            CHECK_EQ_INT(p.lookups + d.lookups, lookups);
            CHECK_EQ_INT(p.hits + p.ahead + p.misses, p.lookups);
            CHECK_EQ_INT(d.hits + d.ahead + d.misses, d.lookups);
            CHECK(d.hits > 0);                       /* the arena keeps popular experts */
            CHECK_EQ_INT(p.loads + d.loads, p.misses + d.misses);   /* no read-ahead: loads are misses */
            CHECK(p.bytes > 0 && p.reads >= p.loads);
            uint64_t sum_l = 0;
            const uint64_t *ll = xstore_phase_layer_lookups(f.s, XSTORE_PROMPT);
            for (int l = 0; l < NL; l++) sum_l += ll[l];
            CHECK_EQ_INT(sum_l, p.lookups);
            CHECK_EQ_INT(xstore_n_chunks(f.s), 12);
            uint64_t sum = 0;
            for (int i = 0; i < 12; i++) {
                int ph;
                CHECK(xstore_chunk(f.s, i, &ph, &c) == 0);
                CHECK_EQ_INT(ph, i < 4 ? XSTORE_PROMPT : XSTORE_DECODE);
                if (ph == XSTORE_DECODE) sum += c.lookups;
            }
            CHECK_EQ_INT(sum, d.lookups);
            fx_close(&f);
        }
}

/* The smallest arena (2 slots per class): a set of 12 runs in waves. */
TEST(test_waves)
{
    for (int m = 0; m < 2; m++) {
        fixture f;
        const uint64_t min = 2 * lay_slot_bytes(NULL, 0) + 2 * lay_slot_bytes(NULL, 1);
        CHECK(fx_open(&f, min, XSTORE_EVICT_LRU, k_io[m], 0, 0) == 0);
        if (!f.s) continue;
        int32_t set[12];
        for (int i = 0; i < 12; i++) set[i] = (int32_t)(15 - i);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 12);
        for (int l = 0; l < NL; l++) {
            const int waves = run_layer(&f, l, set, 12);
            CHECK_MSG(waves >= 6, "layer %d: %d waves", l, waves);
        }
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));
        xstore_counters p;
        xstore_phase_counters(f.s, XSTORE_PROMPT, &p);
        CHECK_EQ_INT(p.lookups, 48);
        CHECK_EQ_INT(p.misses, 48);
        CHECK(p.waves > 0);
        fx_close(&f);
    }
}

static int resident(fixture *f, int l, int x)
{
    uint8_t mask[NX];
    xstore_resident_mask(f->s, l, mask);
    return mask[x];
}

/* LRU evicts the least recent, LFU the least used (A used often, then
 * B, C, D; E needs a slot: LRU drops A, LFU drops B). Layer 0's class has
 * exactly 4 slots. */
TEST(test_policies)
{
    const double s0 = (double)lay_slot_bytes(NULL, 0), s1 = (double)lay_slot_bytes(NULL, 1);
    /* classes get slots in proportion to their bytes: ask for what gives 4
     * slots to class 0 (layers 0 and 2) */
    const uint64_t arena = (uint64_t)(4.5 * s0 * (s0 + s1) / s0);
    for (int pol = 0; pol < 2; pol++) {
        fixture f;
        CHECK(fx_open(&f, arena, pol, XIO_PREAD, 0, 0) == 0);
        if (!f.s) continue;
        int32_t one[1];
        const int seq[] = { 0, 0, 0, 0, 0, 1, 2, 3 };
        for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
            one[0] = seq[i];
            xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
            CHECK(run_layer(&f, 0, one, 1) == 1);
            xstore_chunk_end(f.s);
        }
        for (int x = 0; x < 4; x++) CHECK(resident(&f, 0, x));
        one[0] = 4;
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        CHECK(run_layer(&f, 0, one, 1) == 1);
        xstore_chunk_end(f.s);
        CHECK(resident(&f, 0, 4));
        if (pol == XSTORE_EVICT_LRU) { CHECK(!resident(&f, 0, 0)); CHECK(resident(&f, 0, 1)); }
        else { CHECK(resident(&f, 0, 0)); CHECK(!resident(&f, 0, 1)); }
        CHECK(check_ok(&f));
        fx_close(&f);
    }
}

/* Prefetch: guesses are read ahead, count as "ahead", the accuracy is
 * measured, wrong guesses are wasted; a guess never takes a pinned slot. */
TEST(test_prefetch)
{
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 40 * 16384, XSTORE_EVICT_LRU, k_io[m], 0, 4) == 0);
        if (!f.s) continue;
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        int32_t set0[3] = { 1, 2, 3 };
        CHECK(run_layer(&f, 0, set0, 3) == 1);
        const int32_t guess[4] = { 5, 6, 7, 8 };
        expert_src_prefetch(f.src, 1, guess, 4);
        int32_t set1[3] = { 5, 6, 9 };
        CHECK(run_layer(&f, 1, set1, 3) == 1);
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));
        xstore_counters d;
        xstore_phase_counters(f.s, XSTORE_DECODE, &d);
        CHECK_EQ_INT(d.lookups, 6);
        CHECK_EQ_INT(d.ahead, 2);
        CHECK_EQ_INT(d.misses, 4);
        CHECK_EQ_INT(d.predicted, 4);
        CHECK_EQ_INT(d.predicted_used, 2);
        CHECK_EQ_INT(d.lookups_predicted, 3);
        CHECK_EQ_INT(d.prefetch_wasted, 2);
        CHECK_EQ_INT(d.loads, 8);
        CHECK_EQ_INT(d.loads_prefetch, 4);
        /* the wrong guesses stay resident, as ordinary (cold) experts: hits later */
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        int32_t set2[1] = { 7 };
        CHECK(run_layer(&f, 1, set2, 1) == 1);
        xstore_chunk_end(f.s);
        xstore_phase_counters(f.s, XSTORE_DECODE, &d);
        CHECK_EQ_INT(d.hits, 1);
        CHECK(check_ok(&f));
        fx_close(&f);
    }
    /* a guess still in flight when its layer wants it is awaited, never
     * read twice (its reads are promoted to demand priority) */
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 40 * 16384, XSTORE_EVICT_LRU, k_io[m], 0, 4) == 0);
        if (!f.s) continue;
        xio_fault late = { .kind = XIO_FAULT_LATE, .nth = 1, .count = 1, .late_ms = 150, .only = 2 };
        xstore_set_fault(f.s, &late);
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        const int32_t guess[2] = { 5, 6 };
        expert_src_prefetch(f.src, 1, guess, 2);
        int32_t set1[2] = { 5, 6 };
        CHECK(run_layer(&f, 1, set1, 2) == 1);
        xstore_chunk_end(f.s);
        xstore_counters d;
        xstore_phase_counters(f.s, XSTORE_DECODE, &d);
        CHECK_EQ_INT(d.ahead, 2);
        CHECK_EQ_INT(d.loads, 2);
        CHECK(d.wait_ms > 0);
        CHECK(check_ok(&f));
        fx_close(&f);
    }
    /* a full class: guesses find no unpinned, unprotected slot and are skipped */
    fixture f;
    const uint64_t min = 2 * lay_slot_bytes(NULL, 0) + 2 * lay_slot_bytes(NULL, 1);
    CHECK(fx_open(&f, min, XSTORE_EVICT_LRU, XIO_PREAD, 0, 4) == 0);
    if (f.s) {
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        int32_t ex[2] = { 1, 2 };
        err e;
        err_clear(&e);
        CHECK_EQ_INT(expert_src_begin_layer(f.src, 0, ex, 2, &e), 2);
        const int32_t g[3] = { 4, 5, 6 };
        expert_src_prefetch(f.src, 2, g, 3);   /* layer 2 shares layer 0's class: both slots pinned */
        CHECK(expert_src_wait_layer(f.src, 0, &e) == 0);
        CHECK(part_ok(f.src, 0, 1) && part_ok(f.src, 0, 2));
        expert_src_end_layer(f.src, 0);
        xstore_chunk_end(f.s);
        xstore_counters d;
        xstore_phase_counters(f.s, XSTORE_DECODE, &d);
        CHECK_EQ_INT(d.loads_prefetch, 0);
        CHECK(check_ok(&f));
        fx_close(&f);
    }
}

/* Arena 0: every lookup is read, chunk after chunk. */
TEST(test_stream_mode)
{
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 0, XSTORE_EVICT_LRU, k_io[m], 0, 2) == 0);
        if (!f.s) continue;
        char line[512];
        xstore_init_line(f.s, line, sizeof line);
        CHECK_MSG(strstr(line, "stream every lookup") != NULL, "%s", line);
        int32_t set[6] = { 0, 3, 5, 7, 9, 11 };
        for (int chunk = 0; chunk < 3; chunk++) {
            xstore_chunk_begin(f.s, XSTORE_PROMPT, 2);
            for (int l = 0; l < NL; l++) {
                CHECK(run_layer(&f, l, set, 6) >= 2);   /* 4 buffer slots per class: waves */
                if (l + 1 < NL) expert_src_prefetch(f.src, l + 1, set, 2);
            }
            xstore_chunk_end(f.s);
            CHECK(check_ok(&f));
        }
        xstore_counters p;
        xstore_phase_counters(f.s, XSTORE_PROMPT, &p);
        CHECK_EQ_INT(p.hits, 0);
        CHECK_EQ_INT(p.lookups, 3 * NL * 6);
        CHECK_EQ_INT(p.loads, p.lookups);
        fx_close(&f);
    }
}

/* Warm fill from a ranked list; warmed experts are "in the arena". */
TEST(test_warm)
{
    fixture f;
    CHECK(fx_open(&f, 6 * lay_slot_bytes(NULL, 0) + 6 * lay_slot_bytes(NULL, 1), XSTORE_EVICT_LRU, XIO_URING, 0, 0) == 0);
    if (!f.s) return;
    int32_t pairs[2 * NL * NX];
    int n = 0;
    for (int x = 0; x < NX; x++)
        for (int l = 0; l < NL; l++) { pairs[2 * n] = l; pairs[2 * n + 1] = x; n++; }
    err e;
    err_clear(&e);
    CHECK(xstore_warm(f.s, pairs, (uint64_t)n, &e) == 0);
    CHECK(check_ok(&f));
    char line[512];
    xstore_init_line(f.s, line, sizeof line);
    CHECK_MSG(strstr(line, "experts read from the profile's top (64 ranked)") != NULL, "%s", line);
    xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
    int32_t set[1] = { 0 };
    for (int l = 0; l < NL; l++) CHECK(run_layer(&f, l, set, 1) == 1);
    xstore_chunk_end(f.s);
    xstore_counters p;
    xstore_phase_counters(f.s, XSTORE_PROMPT, &p);
    CHECK_EQ_INT(p.hits, NL);
    CHECK_EQ_INT(p.reads, 0);
    pairs[0] = NL;
    CHECK(xstore_warm(f.s, pairs, 1, &e) == ERR_RANGE);
    fx_close(&f);
}

/* Faults: a demand read that fails ends the wave with a message naming the
 * layer, expert and offset, leaves nothing pinned, and the next lookup
 * reads it again, correctly. A failed prefetch costs nothing but time. */
TEST(test_faults)
{
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 40 * 16384, XSTORE_EVICT_LRU, k_io[m], 0, 2) == 0);
        if (!f.s) continue;
        xio_fault flt = { .kind = XIO_FAULT_EIO, .nth = 2 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t ex[2] = { 4, 5 };
        err e;
        err_clear(&e);
        const int k = expert_src_begin_layer(f.src, 1, ex, 2, &e);
        CHECK_EQ_INT(k, 2);
        CHECK(expert_src_wait_layer(f.src, 1, &e) == ERR_IO);
        CHECK_MSG(strstr(e.msg, "of layer 1") && strstr(e.msg, "expert 5") && strstr(e.msg, "file offset") &&
                  strstr(e.msg, "Input/output error"), "%s", e.msg);
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t set[2] = { 4, 5 };
        CHECK(run_layer(&f, 1, set, 2) == 1);
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));
        xstore_counters p;
        xstore_phase_counters(f.s, XSTORE_PROMPT, &p);
        CHECK_EQ_INT(p.io_errors, 1);

        /* short reads and late completions: correct bytes */
        flt = (xio_fault){ .kind = XIO_FAULT_SHORT, .nth = 1, .every = 1 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t s2[3] = { 10, 11, 12 };
        CHECK(run_layer(&f, 2, s2, 3) == 1);
        CHECK(run_layer(&f, 3, s2, 3) == 1);
        xstore_chunk_end(f.s);
        flt = (xio_fault){ .kind = XIO_FAULT_LATE, .nth = 1, .count = 2, .late_ms = 50 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t s3[2] = { 13, 14 };
        CHECK(run_layer(&f, 0, s3, 2) == 1);
        xstore_chunk_end(f.s);

        /* every prefetch fails: the demand reads them again */
        flt = (xio_fault){ .kind = XIO_FAULT_EIO, .nth = 1, .every = 1, .only = 2 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        const int32_t g[2] = { 7, 8 };
        expert_src_prefetch(f.src, 2, g, 2);
        int32_t s4[2] = { 7, 8 };
        CHECK(run_layer(&f, 2, s4, 2) == 1);
        xstore_chunk_end(f.s);
        xstore_set_fault(f.s, NULL);
        CHECK(check_ok(&f));
        fx_close(&f);
    }
}

/* Per-expert waiting (the forward's pipelined path): experts become usable
 * one by one; a failed read is returned for its own entry only, the wave
 * stays pinned until end_layer, and the store is consistent afterwards; a
 * failed guess is read again as a demand. */
static int run_layer_each(fixture *f, int l, int32_t *ex, int n, err *e)
{
    const int k = expert_src_begin_layer(f->src, l, ex, n, e);
    if (k != n) return k < 0 ? k : -100;
    int rc = 0;
    for (int i = 0; i < k && rc == 0; i++) {
        rc = expert_src_wait_expert(f->src, l, i, e);
        if (rc == 0 && !part_ok(f->src, l, ex[i])) rc = -101;
    }
    expert_src_end_layer(f->src, l);
    return rc;
}

TEST(test_wait_expert)
{
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 40 * 16384, XSTORE_EVICT_LRU, k_io[m], 0, 2) == 0);
        if (!f.s) continue;
        CHECK(expert_src_can_wait_expert(f.src));
        err e;
        err_clear(&e);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t a[4] = { 1, 2, 3, 9 };
        CHECK_EQ_INT(run_layer_each(&f, 0, a, 4, &e), 0);
        int32_t b[3] = { 2, 9, 6 };   /* two resident, one read */
        CHECK_EQ_INT(run_layer_each(&f, 0, b, 3, &e), 0);
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));

        /* the second read fails: entry 0 is fine, entry 1 is the error */
        xio_fault flt = { .kind = XIO_FAULT_EIO, .nth = 2 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t c[2] = { 4, 5 };
        CHECK_EQ_INT(expert_src_begin_layer(f.src, 1, c, 2, &e), 2);
        CHECK_EQ_INT(expert_src_wait_expert(f.src, 1, 0, &e), 0);
        CHECK(part_ok(f.src, 1, c[0]));
        CHECK(expert_src_wait_expert(f.src, 1, 1, &e) == ERR_IO);
        CHECK_MSG(strstr(e.msg, "of layer 1") && strstr(e.msg, "file offset"), "%s", e.msg);
        CHECK(expert_src_wait_expert(f.src, 1, 2, &e) == ERR_INTERNAL);   /* no such entry */
        expert_src_end_layer(f.src, 1);
        xstore_chunk_end(f.s);
        CHECK(check_ok(&f));
        /* asked again, it is read again and is right */
        xstore_chunk_begin(f.s, XSTORE_PROMPT, 1);
        int32_t c2[2] = { 4, 5 };
        CHECK_EQ_INT(run_layer_each(&f, 1, c2, 2, &e), 0);
        xstore_chunk_end(f.s);

        /* a failed prefetch is read again by the demand */
        flt = (xio_fault){ .kind = XIO_FAULT_EIO, .nth = 1, .every = 1, .only = 2 };
        xstore_set_fault(f.s, &flt);
        xstore_chunk_begin(f.s, XSTORE_DECODE, 1);
        const int32_t g[2] = { 11, 12 };
        expert_src_prefetch(f.src, 3, g, 2);
        int32_t d[2] = { 11, 12 };
        CHECK_EQ_INT(run_layer_each(&f, 3, d, 2, &e), 0);
        xstore_chunk_end(f.s);
        xstore_set_fault(f.s, NULL);
        CHECK(check_ok(&f));
        fx_close(&f);
    }
}

/* O_DIRECT with an all-aligned layout (both backends). */
TEST(test_direct)
{
    g_aligned_only = 1;
    for (int m = 0; m < 2; m++) {
        fixture f;
        CHECK(fx_open(&f, 24 * 16384, XSTORE_EVICT_LFU, k_io[m], 1, 2) == 0);
        if (!f.s) continue;
        for (int chunk = 0; chunk < 4; chunk++) {
            xstore_chunk_begin(f.s, XSTORE_PROMPT, 4);
            int32_t set[8];
            for (int i = 0; i < 8; i++) set[i] = (int32_t)((i * 3 + chunk) % NX);
            for (int l = 0; l < NL; l++) {
                CHECK(run_layer(&f, l, set, 8) >= 1);
                if (l + 1 < NL) expert_src_prefetch(f.src, l + 1, set, 4);
            }
            xstore_chunk_end(f.s);
        }
        CHECK(check_ok(&f));
        FILE *j = fopen("/dev/null", "w");
        xstore_report_json(f.s, j, "  ");
        xstore_trace(f.s, j);
        fclose(j);
        fx_close(&f);
    }
    g_aligned_only = 0;
}

int main(void)
{
    snprintf(g_path, sizeof g_path, "/tmp/strata_xstore_%d.bin", (int)getpid());
    FILE *fp = fopen(g_path, "wb");
    if (!fp) { fprintf(stderr, "cannot create %s\n", g_path); return 1; }
    const uint64_t n = file_bytes();
    uint8_t *b = malloc((size_t)n);
    for (uint64_t i = 0; i < n; i++) b[i] = pattern(i);
    fwrite(b, 1, (size_t)n, fp);
    fclose(fp);
    free(b);
    RUN(test_plan);
    RUN(test_arena_span);
    RUN(test_lookups_and_counters);
    RUN(test_waves);
    RUN(test_policies);
    RUN(test_prefetch);
    RUN(test_stream_mode);
    RUN(test_warm);
    RUN(test_faults);
    RUN(test_wait_expert);
    RUN(test_direct);
    unlink(g_path);
    return test_summary("xstore");
}

/* dump_logits: evaluate token ids from position 0 and write every row's
 * logits, for the float64 oracle (tests/ref) and the chunking tests.
 *
 *   dump_logits MODEL OUT.bin IDS [-t N] [-ctk f32|f16] [-ctv f32|f16] [-b N]
 *               [--split K] [--check-alloc] [--decode]
 *               [--arena SIZE|0] [--evict lru|lfu] [--io auto|uring|pread]
 *               [--io-threads N] [--io-depth N] [--read-ahead N]
 *               [--read-ahead-from attn|input] [--no-direct] [--no-sidecar]
 *               [--fault SPEC [--retry]] [--trace]
 *
 * IDS: comma-separated token ids (no BOS is added). OUT.bin: int32 n_tokens,
 * int32 n_vocab, then float32 logits[n_tokens][n_vocab], row i = the logits
 * after token i, little-endian. The context is exactly n_tokens (at least
 * 1); -b sets the forward chunk (default 512). Exit 0 ok, 1 on any error.
 *
 * --split K: evaluate the first K ids with one session_eval call and the
 * rest with a second one (the output must equal the single call's).
 *
 * --check-alloc: after the dump, also run a fresh session one token at a
 * time and fail (exit 1) if any malloc/calloc/realloc happened inside those
 * session_eval calls: the decode loop must not allocate. The counting
 * wrappers below forward to glibc's allocator (__libc_malloc and friends);
 * the counter only runs while armed, and only this test binary has them.
 *
 * --decode: evaluate the first id as a prompt, then every other id alone
 * (the decode phase), writing every row's logits as before.
 *
 * Streaming: --arena and the options after it are engine_opts' expert
 * streaming (see `strata run --help`); --trace prints the stream counters.
 * --fault SPEC arms an injected I/O fault (engine_stream_fault) before the
 * evaluation; an evaluation that fails then exits 1 with its message, or,
 * with --retry, is reported on stderr ("dump_logits: eval failed: ...") and
 * repeated once on the same session (the fault spec's count is used up),
 * which must then succeed. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* ==== Allocation guard (glibc: interpose the allocator, count when armed) ====
 * Not under AddressSanitizer, which owns malloc itself: there the check is
 * skipped (and says so). */

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_GUARD 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOC_GUARD 0
#endif
#endif
#ifndef ALLOC_GUARD
#define ALLOC_GUARD 1
#endif

static atomic_int g_armed;     /* test binary only: the guard's switch */
static atomic_long g_allocs;

#if ALLOC_GUARD
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);

void *malloc(size_t n)
{
    if (atomic_load_explicit(&g_armed, memory_order_relaxed)) atomic_fetch_add(&g_allocs, 1);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    if (atomic_load_explicit(&g_armed, memory_order_relaxed)) atomic_fetch_add(&g_allocs, 1);
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    if (atomic_load_explicit(&g_armed, memory_order_relaxed)) atomic_fetch_add(&g_allocs, 1);
    return __libc_realloc(p, n);
}
#endif

/* ==== Tool ==== */

static int fail(const char *fmt, const char *a)
{
    fprintf(stderr, "dump_logits: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 1;
}

static int parse_ids(const char *s, int32_t **out, int *n_out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) { free(ids); return -1; }
        if (n == cap) {
            cap *= 2;
            int32_t *t = realloc(ids, sizeof *ids * (size_t)cap);
            if (!t) { free(ids); return -1; }
            ids = t;
        }
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) { free(ids); return -1; }
    }
    if (n == 0) { free(ids); return -1; }
    *out = ids;
    *n_out = n;
    return 0;
}

int main(int argc, char **argv)
{
    const char *pos[3] = { 0 };
    int n_pos = 0, check_alloc = 0, decode = 0, retry = 0, trace = 0;
    long split = 0;
    const char *fault = NULL;
    engine_opts o = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has_val = i + 1 < argc;
        if (!strcmp(a, "--arena") && has_val) {
            const char *v = argv[++i];
            char *end;
            const double d = strtod(v, &end);
            double mul = 1.0;
            if (end != v && *end == 'K') { mul = 1024.0; end++; }
            else if (end != v && *end == 'M') { mul = 1048576.0; end++; }
            else if (end != v && *end == 'G') { mul = 1073741824.0; end++; }
            if (end == v || d < 0 || *end) return fail("bad arena size '%s'", v);
            o.stream = 1;
            o.arena_bytes = (uint64_t)(d * mul);
            continue;
        }
        if (!strcmp(a, "--evict") && has_val) { o.evict = !strcmp(argv[++i], "lfu") ? ENGINE_EVICT_LFU : ENGINE_EVICT_LRU; continue; }
        if (!strcmp(a, "--io") && has_val) {
            const char *v = argv[++i];
            o.io_mode = !strcmp(v, "uring") ? ENGINE_IO_URING : !strcmp(v, "pread") ? ENGINE_IO_PREAD : ENGINE_IO_AUTO;
            continue;
        }
        if (!strcmp(a, "--io-threads") && has_val) { o.io_threads = atoi(argv[++i]); continue; }
        if (!strcmp(a, "--io-depth") && has_val) { o.io_depth = atoi(argv[++i]); continue; }
        if (!strcmp(a, "--read-ahead") && has_val) { o.read_ahead = atoi(argv[++i]); continue; }
        if (!strcmp(a, "--read-ahead-from") && has_val) {
            o.read_ahead_from = !strcmp(argv[++i], "input") ? ENGINE_RA_INPUT : ENGINE_RA_ATTN;
            continue;
        }
        if (!strcmp(a, "--no-direct")) { o.no_direct = 1; continue; }
        if (!strcmp(a, "--no-sidecar")) { o.no_sidecar = 1; continue; }
        if (!strcmp(a, "--fault") && has_val) { fault = argv[++i]; continue; }
        if (!strcmp(a, "--retry")) { retry = 1; continue; }
        if (!strcmp(a, "--trace")) { trace = 1; continue; }
        if (!strcmp(a, "--decode")) { decode = 1; continue; }
        if (!strcmp(a, "-t") || !strcmp(a, "-b") || !strcmp(a, "-ctk") || !strcmp(a, "-ctv")) {
            if (i + 1 >= argc) return fail("%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "-t") || !strcmp(a, "-b")) {
                char *end;
                long n = strtol(v, &end, 10);
                if (*end || n < 1 || n > 1 << 20) return fail("bad number '%s'", v);
                if (!strcmp(a, "-t")) o.n_threads = (int)n; else o.n_batch = (int)n;
            } else {
                int t = !strcmp(v, "f16") ? ENGINE_KV_F16 : !strcmp(v, "f32") ? ENGINE_KV_F32 : -1;
                if (t < 0) return fail("KV type must be f16 or f32, got '%s'", v);
                if (!strcmp(a, "-ctk")) o.kv_type_k = t; else o.kv_type_v = t;
            }
        } else if (!strcmp(a, "--split")) {
            char *end;
            if (i + 1 >= argc) return fail("%s needs a value", a);
            split = strtol(argv[++i], &end, 10);
            if (*end || split < 0) return fail("bad number '%s'", argv[i]);
        } else if (!strcmp(a, "--check-alloc")) {
            check_alloc = 1;
        } else if (a[0] == '-' && a[1]) {
            return fail("unknown option '%s' (usage: dump_logits MODEL OUT.bin IDS [-t N] [-ctk f32|f16] "
                        "[-ctv f32|f16] [-b N])", a);
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            return fail("unexpected argument '%s'", a);
        }
    }
    if (n_pos != 3) return fail("%s", "usage: dump_logits MODEL OUT.bin IDS [-t N] [-ctk f32|f16] [-ctv f32|f16] [-b N]");
    int32_t *ids;
    int n;
    if (parse_ids(pos[2], &ids, &n)) return fail("bad token id list '%s'", pos[2]);

    err e;
    err_clear(&e);
    o.model_path = pos[0];
    o.n_ctx = n;
    engine *eng = NULL;
    session *s = NULL;
    if (engine_open(&eng, &o, &e) || session_create(&s, eng, &e)) return fail("%s", e.msg);
    if (fault && engine_stream_fault(eng, fault, &e)) return fail("%s", e.msg);
    const int32_t V = engine_n_vocab(eng);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
    if (!logits) return fail("%s", "out of memory");
    /* the evaluation as a list of pieces: [0, split) [split, n), or the
     * first id then one id at a time (--decode) */
    long cuts[3] = { 0, n, n };
    int n_cuts = 1;
    if (split > 0 && split < n) { cuts[1] = split; cuts[2] = n; n_cuts = 2; }
    for (long c0 = 0, piece = 0; c0 < n; piece++) {
        const long c1 = decode ? c0 + 1 : piece < n_cuts ? cuts[piece + 1] : n;
        int rc = session_eval(s, ids + c0, (int)(c1 - c0), NULL, logits + (size_t)c0 * (size_t)V, &e);
        if (rc && retry) {
            fprintf(stderr, "dump_logits: eval failed: %s\n", e.msg);
            err_clear(&e);
            retry = 0;
            rc = session_eval(s, ids + c0, (int)(c1 - c0), NULL, logits + (size_t)c0 * (size_t)V, &e);
        }
        if (rc) {
            if (trace) engine_stream_trace(eng, stderr);
            fprintf(stderr, "dump_logits: %s\n", e.msg);
            free(logits);
            free(ids);
            session_free(s);
            engine_close(eng);
            return 1;
        }
        c0 = c1;
    }
    if (trace) engine_stream_trace(eng, stderr);

    FILE *f = fopen(pos[1], "wb");
    if (!f) return fail("cannot open '%s' for writing", pos[1]);
    int32_t hdr[2] = { n, V };
    int bad = fwrite(hdr, sizeof hdr, 1, f) != 1 ||
              fwrite(logits, sizeof(float) * (size_t)V, (size_t)n, f) != (size_t)n;
    if (fclose(f) != 0 || bad) return fail("cannot write '%s'", pos[1]);

    if (check_alloc) {
        session *s2 = NULL;
        if (session_create(&s2, eng, &e)) return fail("%s", e.msg);
        atomic_store(&g_allocs, 0);
        atomic_store(&g_armed, 1);
        int rc = 0;
        for (int i = 0; i < n && rc == 0; i++) rc = session_eval(s2, &ids[i], 1, logits, NULL, &e);
        atomic_store(&g_armed, 0);
        if (rc) return fail("%s", e.msg);
        long allocs = atomic_load(&g_allocs);
        if (allocs != 0) {
            fprintf(stderr, "dump_logits: %ld allocations during %d single-token evaluations\n", allocs, n);
            return 1;
        }
        if (ALLOC_GUARD)
            fprintf(stderr, "dump_logits: no allocations during %d single-token evaluations\n", n);
        else
            fprintf(stderr, "dump_logits: allocation check skipped (sanitizer build)\n");
        session_free(s2);
    }
    free(logits);
    free(ids);
    session_free(s);
    engine_close(eng);
    return 0;
}

/* dump_logits: evaluate token ids from position 0 and write every row's
 * logits, for the float64 oracle (tests/ref) and the chunking tests.
 *
 *   dump_logits MODEL OUT.bin IDS [-t N] [-ctk f32|f16] [-ctv f32|f16] [-b N]
 *               [--split K] [--check-alloc]
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
 * the counter only runs while armed, and only this test binary has them. */
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
    int n_pos = 0, check_alloc = 0;
    long split = 0;
    engine_opts o = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
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
    const int32_t V = engine_n_vocab(eng);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
    if (!logits) return fail("%s", "out of memory");
    if (split > 0 && split < n) {
        if (session_eval(s, ids, (int)split, NULL, logits, &e) ||
            session_eval(s, ids + split, n - (int)split, NULL, logits + (size_t)split * (size_t)V, &e))
            return fail("%s", e.msg);
    } else if (session_eval(s, ids, n, NULL, logits, &e)) {
        return fail("%s", e.msg);
    }

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

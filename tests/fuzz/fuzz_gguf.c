/* fuzz_gguf: libFuzzer harness for the GGUF header parser (src/gguf/gguf.c).
 *
 * Each input is parsed twice with gguf_parse: as a whole file (file_size =
 * size) and as the first bytes of a larger file (file_size = 2 * size + 64,
 * which exercises the "window smaller than the file" paths). A successful
 * parse is then walked completely: every KV through the raw accessors, the
 * typed getters and gguf_print_kv (to /dev/null), every tensor through
 * gguf_tensor/gguf_find_tensor, and the invariants gguf.h promises are
 * checked (abort() on a violation, so libFuzzer reports it). ASan/UBSan
 * catch out-of-bounds reads, leaks and undefined behaviour.
 *
 * Build: make fuzz (clang -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/qtype.h"
#include "util/err.h"

/* The sink for gguf_print_kv. Opened once: libFuzzer calls the target
 * millions of times and fopen per call would dominate. (Harness-only state.) */
static FILE *devnull(void)
{
    static FILE *f;
    if (!f) f = fopen("/dev/null", "w");
    if (!f) abort();
    return f;
}

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

static volatile uint64_t g_sink;   /* keeps reads from being optimised away */

static void touch(const void *p, uint64_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += b[i];
    g_sink += s;
}

static uint64_t elem_size(int t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static void walk(const gguf_file *f, uint64_t file_size)
{
    FILE *out = devnull();
    REQUIRE(gguf_file_size(f) == file_size);
    uint32_t al = gguf_alignment(f);
    REQUIRE(al != 0 && (al & (al - 1)) == 0);
    REQUIRE(gguf_header_bytes(f) <= gguf_data_off(f));
    REQUIRE(gguf_data_off(f) <= file_size);
    REQUIRE(gguf_version(f) == 2 || gguf_version(f) == 3);
    g_sink += gguf_fingerprint(f);

    int64_t n_kv = gguf_n_kv(f);
    for (int64_t i = 0; i < n_kv; i++) {
        gguf_str k = gguf_kv_key(f, i);
        REQUIRE(k.n > 0);
        touch(k.p, k.n);
        int type = gguf_kv_type(f, i), et = gguf_kv_arr_type(f, i);
        uint64_t n = gguf_kv_arr_n(f, i);
        REQUIRE(type >= 0 && type < GGUF_TYPE_COUNT);
        REQUIRE(et >= 0 && et < GGUF_TYPE_COUNT && et != GGUF_TYPE_ARRAY);
        REQUIRE(type == GGUF_TYPE_ARRAY || (et == type && n == 1));
        if (et == GGUF_TYPE_STRING) {
            REQUIRE(gguf_kv_data(f, i) == NULL);
            for (uint64_t j = 0; j < n; j++) { gguf_str s = gguf_kv_arr_str(f, i, j); touch(s.p, s.n); }
        } else {
            const void *d = gguf_kv_data(f, i);
            REQUIRE(d != NULL && ((uintptr_t)d & 7) == 0);
            touch(d, n * elem_size(et));
        }
        /* integer access through the array getter, bounded per key */
        err e;
        err_clear(&e);
        int64_t v;
        for (uint64_t j = 0; j < n && j < 64; j++) {
            int rc = gguf_get_arr_i64(f, i, j, &v, &e);
            REQUIRE(rc == 0 || e.msg[0]);
            err_clear(&e);
        }
        gguf_print_kv(out, f, i, (int)(i % 5) * 3);
        fputc('\n', out);
        /* typed getters by key (keys with a NUL inside cannot be named in C) */
        if (!memchr(k.p, '\0', k.n) && k.n < 256) {
            char key[256];
            memcpy(key, k.p, k.n);
            key[k.n] = '\0';
            REQUIRE(gguf_find_key(f, key) == i);   /* keys are unique */
            uint32_t u32; float f32; int b; gguf_str s;
            err_clear(&e); if (gguf_get_i64(f, key, &v, &e) != 0) REQUIRE(e.msg[0]);
            err_clear(&e); if (gguf_get_u32(f, key, &u32, &e) != 0) REQUIRE(e.msg[0]);
            err_clear(&e); if (gguf_get_f32(f, key, &f32, &e) != 0) REQUIRE(e.msg[0]);
            err_clear(&e); if (gguf_get_bool(f, key, &b, &e) != 0) REQUIRE(e.msg[0]);
            err_clear(&e);
            if (gguf_get_str(f, key, &s, &e) == 0) touch(s.p, s.n); else REQUIRE(e.msg[0]);
        }
    }

    int64_t n_t = gguf_n_tensors(f);
    uint64_t expect = 0;
    for (int64_t i = 0; i < n_t; i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        REQUIRE(t != NULL);
        touch(t->name.p, t->name.n);
        REQUIRE(t->name.n < 64);
        REQUIRE(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
        const qtype_info *q = qtype_get(t->type);
        REQUIRE(q != NULL);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            REQUIRE(t->ne[d] >= 0);
            REQUIRE(d < t->n_dims || t->ne[d] == 1);
            nel *= (uint64_t)t->ne[d];   /* cannot overflow: checked by the parser */
        }
        REQUIRE(t->ne[0] % q->blck == 0);
        REQUIRE(t->bytes == nel / (uint64_t)q->blck * (uint64_t)q->type_size);
        REQUIRE(t->nb[0] == (uint64_t)q->type_size);
        REQUIRE(t->off == expect);
        REQUIRE(t->off % al == 0);
        REQUIRE(t->file_off == gguf_data_off(f) + t->off);
        REQUIRE(t->file_off + t->bytes <= file_size);
        expect += (t->bytes + al - 1) / al * al;
        if (!memchr(t->name.p, '\0', t->name.n)) {
            char name[64];
            memcpy(name, t->name.p, t->name.n);
            name[t->name.n] = '\0';
            REQUIRE(gguf_find_tensor(f, name) == i);
        }
        uint8_t b;
        err e;
        err_clear(&e);
        REQUIRE(gguf_read_tensor(f, i, 0, &b, t->bytes ? 1 : 0, &e) != 0);   /* memory parse: no file */
    }
    REQUIRE(gguf_tensor(f, n_t) == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t sizes[2] = { size, 2 * (uint64_t)size + 64 };
    for (int k = 0; k < 2; k++) {
        gguf_file *f = NULL;
        err e;
        err_clear(&e);
        int rc = gguf_parse(&f, data, size, sizes[k], &e);
        if (rc == 0) {
            REQUIRE(f != NULL && e.code == 0);
            walk(f, sizes[k]);
        } else {
            REQUIRE(f == NULL);
            REQUIRE(e.code == rc && e.msg[0] != '\0' && strchr(e.msg, '\n') == NULL);
        }
        gguf_close(f);
    }
    return 0;
}

/* Unit tests for src/gguf: writer -> reader round trips of every value type,
 * alignment, llama.cpp's byte layout, getters' type errors, the fingerprint,
 * printing, and parsing of truncated and byte-mutated headers (every prefix
 * of a small valid file must fail cleanly, never crash). */
#include "testhelp.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "quant/qtype.h"
#include "util/err.h"

static char g_dir[64];   /* temp directory for this run */

/* A path in the temp directory; valid until the 8th next call (a ring of buffers). */
static const char *tmp_path(const char *name)
{
    static char buf[8][160];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static uint8_t *slurp(const char *path, uint64_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    *n = (uint64_t)sz;
    return b;
}

/* ==== A file with every value type ==== */

static const uint8_t  k_u8s[]  = { 0, 1, 255 };
static const int8_t   k_i8s[]  = { -128, 0, 127 };
static const uint16_t k_u16s[] = { 0, 65535 };
static const int16_t  k_i16s[] = { -32768, 32767 };
static const uint32_t k_u32s[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
static const int32_t  k_i32s[] = { -1, 2147483647 };
static const float    k_f32s[] = { 1.5f, -0.25f, 1e-6f };
static const uint64_t k_u64s[] = { UINT64_MAX, 0 };
static const int64_t  k_i64s[] = { INT64_MIN, INT64_MAX };
static const double   k_f64s[] = { 3.141592653589793, -1e300 };
static const uint8_t  k_bools[] = { 1, 0, 1 };

/* Writes the test file; tensor data is a byte pattern. Returns 0 on success. */
static int write_all_types(const char *path, uint32_t align)
{
    err e;
    err_clear(&e);
    gguf_writer *w = gguf_writer_new();
    if (!w) return -1;
    int rc = 0;
    rc |= gguf_writer_set_str(w, "general.architecture", "qwen3moe");
    rc |= gguf_writer_set_u32(w, "t.replaced", 1);   /* replaced by a string below */
    if (align) rc |= gguf_writer_set_u32(w, "general.alignment", align);
    rc |= gguf_writer_set_u8(w, "t.u8", 200);
    rc |= gguf_writer_set_i8(w, "t.i8", -100);
    rc |= gguf_writer_set_u16(w, "t.u16", 60000);
    rc |= gguf_writer_set_i16(w, "t.i16", -30000);
    rc |= gguf_writer_set_u32(w, "t.u32", 4000000000u);
    rc |= gguf_writer_set_i32(w, "t.i32", -2000000000);
    rc |= gguf_writer_set_f32(w, "t.f32", 0.125f);
    rc |= gguf_writer_set_bool(w, "t.bool", 1);
    rc |= gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull);
    rc |= gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll);
    rc |= gguf_writer_set_f64(w, "t.f64", 2.718281828459045);
    rc |= gguf_writer_set_strn(w, "t.strn", "a\0b\n\"c", 6);
    rc |= gguf_writer_set_str(w, "t.empty", "");
    rc |= gguf_writer_set_arr(w, "a.u8", GGUF_TYPE_UINT8, k_u8s, 3);
    rc |= gguf_writer_set_arr(w, "a.i8", GGUF_TYPE_INT8, k_i8s, 3);
    rc |= gguf_writer_set_arr(w, "a.u16", GGUF_TYPE_UINT16, k_u16s, 2);
    rc |= gguf_writer_set_arr(w, "a.i16", GGUF_TYPE_INT16, k_i16s, 2);
    rc |= gguf_writer_set_arr(w, "a.u32", GGUF_TYPE_UINT32, k_u32s, 10);
    rc |= gguf_writer_set_arr(w, "a.i32", GGUF_TYPE_INT32, k_i32s, 2);
    rc |= gguf_writer_set_arr(w, "a.f32", GGUF_TYPE_FLOAT32, k_f32s, 3);
    rc |= gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, k_u64s, 2);
    rc |= gguf_writer_set_arr(w, "a.i64", GGUF_TYPE_INT64, k_i64s, 2);
    rc |= gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, k_f64s, 2);
    rc |= gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, k_bools, 3);
    rc |= gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_INT32, NULL, 0);
    const char *strs[] = { "hello", "", "w\xc3\xb6rld" };
    rc |= gguf_writer_set_arr_str(w, "a.str", strs, NULL, 3);
    rc |= gguf_writer_set_arr_str(w, "a.str_empty", NULL, NULL, 0);
    /* set twice: value replaced in place */
    rc |= gguf_writer_set_str(w, "t.replaced", "second");
    rc |= gguf_writer_set_u32(w, "t.removed", 1);
    gguf_writer_remove_key(w, "t.removed");
    int64_t ne0[] = { 3 }, ne1[] = { 256, 2 }, ne2[] = { 32, 4, 3 }, ne3[] = { 0, 5 };
    rc |= gguf_writer_add_tensor(w, "f32.weight", QTYPE_F32, 1, ne0, &e);
    rc |= gguf_writer_add_tensor(w, "q4k.weight", QTYPE_Q4_K, 2, ne1, &e);
    rc |= gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", QTYPE_Q8_0, 3, ne2, &e);
    rc |= gguf_writer_add_tensor(w, "empty.weight", QTYPE_F16, 2, ne3, &e);
    rc |= gguf_writer_begin(w, path, &e);
    /* data: byte pattern written in odd-sized pieces across tensor boundaries */
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_writer_n_tensors(w); i++) total += gguf_writer_tensor_bytes(w, i);
    uint8_t piece[37];
    for (uint64_t done = 0; rc == 0 && done < total;) {
        uint64_t k = total - done < sizeof piece ? total - done : sizeof piece;
        for (uint64_t j = 0; j < k; j++) piece[j] = (uint8_t)((done + j) * 7 + 1);
        rc |= gguf_writer_write(w, piece, k, &e);
        done += k;
    }
    if (rc == 0) rc = gguf_writer_finish(w, &e);
    if (rc) fprintf(stderr, "write_all_types: %s\n", e.msg);
    gguf_writer_free(w);
    return rc;
}

TEST(test_roundtrip_values)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    CHECK(!file_exists(tmp_path("all.gguf.tmp")));
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, path, &e), 0);
    if (!f) { fprintf(stderr, "%s\n", e.msg); return; }
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_alignment(f), 32);
    CHECK(gguf_path(f) && strcmp(gguf_path(f), path) == 0);
    CHECK(gguf_fd(f) >= 0);

    gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "general.architecture", &s, &e), 0);
    CHECK(gguf_str_eq(s, "qwen3moe"));
    int64_t iv;
    uint32_t uv;
    float fv;
    int bv;
    CHECK_EQ_INT(gguf_get_i64(f, "t.u8", &iv, &e), 0);  CHECK_EQ_INT(iv, 200);
    CHECK_EQ_INT(gguf_get_i64(f, "t.i8", &iv, &e), 0);  CHECK_EQ_INT(iv, -100);
    CHECK_EQ_INT(gguf_get_i64(f, "t.u16", &iv, &e), 0); CHECK_EQ_INT(iv, 60000);
    CHECK_EQ_INT(gguf_get_i64(f, "t.i16", &iv, &e), 0); CHECK_EQ_INT(iv, -30000);
    CHECK_EQ_INT(gguf_get_u32(f, "t.u32", &uv, &e), 0); CHECK(uv == 4000000000u);
    CHECK_EQ_INT(gguf_get_i64(f, "t.i32", &iv, &e), 0); CHECK_EQ_INT(iv, -2000000000);
    CHECK_EQ_INT(gguf_get_i64(f, "t.i64", &iv, &e), 0); CHECK(iv == -9000000000000000000ll);
    CHECK_EQ_INT(gguf_get_f32(f, "t.f32", &fv, &e), 0); CHECK(fv == 0.125f);
    CHECK_EQ_INT(gguf_get_f32(f, "t.f64", &fv, &e), 0); CHECK(fv == (float)2.718281828459045);
    CHECK_EQ_INT(gguf_get_f32(f, "t.u16", &fv, &e), 0); CHECK(fv == 60000.0f);
    CHECK_EQ_INT(gguf_get_bool(f, "t.bool", &bv, &e), 0); CHECK_EQ_INT(bv, 1);
    CHECK_EQ_INT(e.code, 0);

    int64_t k = gguf_find_key(f, "t.u64");
    CHECK(k >= 0);
    CHECK_EQ_INT(gguf_kv_type(f, k), GGUF_TYPE_UINT64);
    uint64_t u64;
    memcpy(&u64, gguf_kv_data(f, k), 8);
    CHECK(u64 == 18000000000000000000ull);
    k = gguf_find_key(f, "t.f64");
    double d;
    memcpy(&d, gguf_kv_data(f, k), 8);
    CHECK(d == 2.718281828459045);
    k = gguf_find_key(f, "t.strn");
    CHECK_EQ_INT(gguf_kv_type(f, k), GGUF_TYPE_STRING);
    CHECK_EQ_INT(gguf_kv_arr_n(f, k), 1);
    s = gguf_kv_arr_str(f, k, 0);
    CHECK(s.n == 6 && memcmp(s.p, "a\0b\n\"c", 6) == 0);
    CHECK(gguf_kv_data(f, k) == NULL);
    CHECK_EQ_INT(gguf_get_str(f, "t.empty", &s, &e), 0);
    CHECK_EQ_INT(s.n, 0);
    CHECK_EQ_INT(gguf_get_str(f, "t.replaced", &s, &e), 0);
    CHECK(gguf_str_eq(s, "second"));
    CHECK(gguf_find_key(f, "t.removed") < 0);
    /* "t.replaced" kept its position: right after general.architecture */
    CHECK_EQ_INT(gguf_find_key(f, "t.replaced"), 1);

    struct { const char *key; int type; const void *data; uint64_t n, sz; } arrs[] = {
        { "a.u8", GGUF_TYPE_UINT8, k_u8s, 3, 1 },     { "a.i8", GGUF_TYPE_INT8, k_i8s, 3, 1 },
        { "a.u16", GGUF_TYPE_UINT16, k_u16s, 2, 2 },  { "a.i16", GGUF_TYPE_INT16, k_i16s, 2, 2 },
        { "a.u32", GGUF_TYPE_UINT32, k_u32s, 10, 4 }, { "a.i32", GGUF_TYPE_INT32, k_i32s, 2, 4 },
        { "a.f32", GGUF_TYPE_FLOAT32, k_f32s, 3, 4 }, { "a.u64", GGUF_TYPE_UINT64, k_u64s, 2, 8 },
        { "a.i64", GGUF_TYPE_INT64, k_i64s, 2, 8 },   { "a.f64", GGUF_TYPE_FLOAT64, k_f64s, 2, 8 },
        { "a.bool", GGUF_TYPE_BOOL, k_bools, 3, 1 },  { "a.empty", GGUF_TYPE_INT32, NULL, 0, 4 },
    };
    for (size_t a = 0; a < sizeof arrs / sizeof arrs[0]; a++) {
        k = gguf_find_key(f, arrs[a].key);
        CHECK_MSG(k >= 0, "%s", arrs[a].key);
        if (k < 0) continue;
        CHECK_EQ_INT(gguf_kv_type(f, k), GGUF_TYPE_ARRAY);
        CHECK_EQ_INT(gguf_kv_arr_type(f, k), arrs[a].type);
        CHECK_EQ_INT(gguf_kv_arr_n(f, k), arrs[a].n);
        const void *p = gguf_kv_data(f, k);
        CHECK(p != NULL);
        CHECK(((uintptr_t)p & 7) == 0);
        if (arrs[a].n) CHECK_MSG(memcmp(p, arrs[a].data, arrs[a].n * arrs[a].sz) == 0, "%s", arrs[a].key);
    }
    k = gguf_find_key(f, "a.i32");
    CHECK_EQ_INT(gguf_get_arr_i64(f, k, 1, &iv, &e), 0);
    CHECK_EQ_INT(iv, 2147483647);
    k = gguf_find_key(f, "a.str");
    CHECK_EQ_INT(gguf_kv_arr_type(f, k), GGUF_TYPE_STRING);
    CHECK_EQ_INT(gguf_kv_arr_n(f, k), 3);
    CHECK(gguf_str_eq(gguf_kv_arr_str(f, k, 0), "hello"));
    CHECK(gguf_str_eq(gguf_kv_arr_str(f, k, 1), ""));
    CHECK(gguf_str_eq(gguf_kv_arr_str(f, k, 2), "w\xc3\xb6rld"));
    CHECK_EQ_INT(gguf_kv_arr_str(f, k, 3).n, 0);   /* out of range: empty */
    CHECK(gguf_kv_data(f, k) == NULL);
    k = gguf_find_key(f, "a.str_empty");
    CHECK_EQ_INT(gguf_kv_arr_n(f, k), 0);
    CHECK_EQ_INT(gguf_kv_type(f, -1), -1);
    CHECK_EQ_INT(gguf_kv_type(f, gguf_n_kv(f)), -1);
    gguf_close(f);
}

TEST(test_roundtrip_tensors)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, path, &e), 0);
    if (!f) return;
    CHECK_EQ_INT(gguf_n_tensors(f), 4);
    CHECK_EQ_INT(gguf_data_off(f) % 32, 0);
    CHECK(gguf_data_off(f) >= gguf_header_bytes(f));
    CHECK(gguf_data_off(f) - gguf_header_bytes(f) < 32);
    uint64_t expect_off = 0, pattern_pos = 0;
    uint64_t want_bytes[] = { 12, 2 * 144, 4 * 3 * 34, 0 };
    for (int64_t i = 0; i < 4; i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        CHECK_EQ_INT(t->bytes, want_bytes[i]);
        CHECK_EQ_INT(t->off, expect_off);
        CHECK_EQ_INT(t->file_off, gguf_data_off(f) + expect_off);
        CHECK_EQ_INT(t->off % 32, 0);
        expect_off += (t->bytes + 31) / 32 * 32;
        uint8_t buf[512];
        if (t->bytes) {
            CHECK_EQ_INT(gguf_read_tensor(f, i, 0, buf, t->bytes, &e), 0);
            int same = 1;
            for (uint64_t j = 0; j < t->bytes; j++) same &= buf[j] == (uint8_t)((pattern_pos + j) * 7 + 1);
            CHECK_MSG(same, "tensor %lld data", (long long)i);
        }
        pattern_pos += t->bytes;
    }
    CHECK_EQ_INT(gguf_file_size(f), gguf_data_off(f) + expect_off);
    int64_t i = gguf_find_tensor(f, "blk.0.ffn_up_exps.weight");
    CHECK_EQ_INT(i, 2);
    const gguf_tensor_info *t = gguf_tensor(f, i);
    CHECK_EQ_INT(t->n_dims, 3);
    CHECK_EQ_INT(t->type, QTYPE_Q8_0);
    CHECK(t->ne[0] == 32 && t->ne[1] == 4 && t->ne[2] == 3 && t->ne[3] == 1);
    CHECK(t->nb[0] == 34 && t->nb[1] == 34 && t->nb[2] == 136 && t->nb[3] == 408);
    CHECK(gguf_str_eq(t->name, "blk.0.ffn_up_exps.weight"));
    t = gguf_tensor(f, 3);
    CHECK_EQ_INT(t->n_dims, 2);
    CHECK(t->ne[0] == 0 && t->ne[1] == 5);
    CHECK(gguf_find_tensor(f, "nope") < 0);
    CHECK(gguf_tensor(f, 4) == NULL);
    /* read bounds */
    uint8_t b[16];
    err_clear(&e);
    CHECK_EQ_INT(gguf_read_tensor(f, 0, 8, b, 4, &e), 0);
    CHECK_EQ_INT(gguf_read_tensor(f, 0, 8, b, 5, &e), ERR_RANGE);
    CHECK(strstr(e.msg, "f32.weight") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_read_tensor(f, 0, UINT64_MAX, b, 2, &e), ERR_RANGE);
    err_clear(&e);
    CHECK_EQ_INT(gguf_read_tensor(f, 9, 0, b, 1, &e), ERR_RANGE);
    gguf_close(f);
}

TEST(test_alignment)
{
    uint32_t aligns[] = { 1, 8, 64, 4096 };
    for (size_t a = 0; a < 4; a++) {
        const char *path = tmp_path("align.gguf");
        CHECK(write_all_types(path, aligns[a]) == 0);
        err e;
        err_clear(&e);
        gguf_file *f = NULL;
        CHECK_EQ_INT(gguf_open(&f, path, &e), 0);
        if (!f) { fprintf(stderr, "%s\n", e.msg); continue; }
        uint32_t al = aligns[a];
        CHECK_EQ_INT(gguf_alignment(f), al);
        CHECK_EQ_INT(gguf_data_off(f) % al, 0);
        CHECK(gguf_data_off(f) - gguf_header_bytes(f) < al);
        uint64_t off = 0;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor_info *t = gguf_tensor(f, i);
            CHECK_EQ_INT(t->off, off);
            off += (t->bytes + al - 1) / al * al;
        }
        CHECK_EQ_INT(gguf_file_size(f), gguf_data_off(f) + off);
        gguf_close(f);
    }
    /* the writer refuses a bad general.alignment */
    gguf_writer *w = gguf_writer_new();
    err e;
    err_clear(&e);
    gguf_writer_set_u32(w, "general.alignment", 24);
    CHECK_EQ_INT(gguf_writer_begin(w, tmp_path("bad.gguf"), &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "power of two") != NULL);
    err_clear(&e);
    gguf_writer_set_u32(w, "general.alignment", 0);
    CHECK_EQ_INT(gguf_writer_begin(w, tmp_path("bad.gguf"), &e), ERR_FORMAT);
    err_clear(&e);
    gguf_writer_set_u64(w, "general.alignment", 32);
    CHECK_EQ_INT(gguf_writer_begin(w, tmp_path("bad.gguf"), &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "u32") != NULL);
    gguf_writer_free(w);
    CHECK(!file_exists(tmp_path("bad.gguf")));
    CHECK(!file_exists(tmp_path("bad.gguf.tmp")));
}

/* ==== Byte layout: the writer's output equals a hand-built llama.cpp file ==== */

typedef struct bytes { uint8_t b[1024]; size_t n; } bytes;
static void put(bytes *o, const void *p, size_t n) { memcpy(o->b + o->n, p, n); o->n += n; }
static void put_u32(bytes *o, uint32_t v) { put(o, &v, 4); }
static void put_i32(bytes *o, int32_t v) { put(o, &v, 4); }
static void put_u64(bytes *o, uint64_t v) { put(o, &v, 8); }
static void put_s(bytes *o, const char *s) { put_u64(o, strlen(s)); put(o, s, strlen(s)); }
static void put_zeros(bytes *o, size_t n) { memset(o->b + o->n, 0, n); o->n += n; }

TEST(test_layout_matches_llama_cpp)
{
    /* Expected bytes, following gguf.cpp gguf_write_out(): kv "a" = u32 7,
     * bool array, tensor t0 f32 [3] (12 B), t1 q8_0 [32, 1, 1] stored 1-D (34 B). */
    bytes x = { .n = 0 };
    put(&x, "GGUF", 4);
    put_u32(&x, 3);
    put_u64(&x, 2);          /* n_tensors */
    put_u64(&x, 2);          /* n_kv */
    put_s(&x, "a"); put_i32(&x, GGUF_TYPE_UINT32); put_u32(&x, 7);
    put_s(&x, "b"); put_i32(&x, GGUF_TYPE_ARRAY); put_i32(&x, GGUF_TYPE_BOOL); put_u64(&x, 2);
    uint8_t bools[2] = { 1, 0 };
    put(&x, bools, 2);
    put_s(&x, "t0"); put_u32(&x, 1); put_u64(&x, 3); put_i32(&x, 0); put_u64(&x, 0);
    put_s(&x, "t1"); put_u32(&x, 1); put_u64(&x, 32); put_i32(&x, 8); put_u64(&x, 32);
    size_t header_end = x.n;
    put_zeros(&x, (32 - x.n % 32) % 32);
    uint8_t d0[12], d1[34];
    for (int i = 0; i < 12; i++) d0[i] = (uint8_t)(i + 1);
    for (int i = 0; i < 34; i++) d1[i] = (uint8_t)(100 + i);
    put(&x, d0, 12); put_zeros(&x, 20);
    put(&x, d1, 34); put_zeros(&x, 30);

    gguf_writer *w = gguf_writer_new();
    err e;
    err_clear(&e);
    uint8_t wb[2] = { 7, 0 };   /* nonzero bool is written as 1 */
    CHECK_EQ_INT(gguf_writer_set_u32(w, "a", 7), 0);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "b", GGUF_TYPE_BOOL, wb, 2), 0);
    int64_t ne0[] = { 3 }, ne1[] = { 32, 1, 1 };
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t0", QTYPE_F32, 1, ne0, &e), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t1", QTYPE_Q8_0, 3, ne1, &e), 0);
    const char *path = tmp_path("layout.gguf");
    CHECK_EQ_INT(gguf_writer_begin(w, path, &e), 0);
    CHECK(file_exists(tmp_path("layout.gguf.tmp")));
    CHECK(!file_exists(path));
    CHECK_EQ_INT(gguf_writer_write(w, d0, 5, &e), 0);
    CHECK_EQ_INT(gguf_writer_write(w, d0 + 5, 7, &e), 0);
    CHECK_EQ_INT(gguf_writer_write(w, d1, 34, &e), 0);
    CHECK_EQ_INT(gguf_writer_finish(w, &e), 0);
    gguf_writer_free(w);
    CHECK(!file_exists(tmp_path("layout.gguf.tmp")));
    uint64_t n = 0;
    uint8_t *got = slurp(path, &n);
    CHECK(got != NULL);
    CHECK_EQ_INT(n, x.n);
    CHECK(got && n == x.n && memcmp(got, x.b, n) == 0);
    /* and the reader sees t1 as 1-D, the same as llama.cpp would */
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_parse(&f, got, n, n, &e), 0);
    if (f) {
        CHECK_EQ_INT(gguf_tensor(f, 1)->n_dims, 1);
        CHECK_EQ_INT(gguf_header_bytes(f), header_end);
        CHECK_EQ_INT(gguf_data_off(f), (header_end + 31) / 32 * 32);
        gguf_close(f);
    }
    free(got);
}

TEST(test_copy_kv_identical)
{
    const char *src = tmp_path("all.gguf");
    CHECK(write_all_types(src, 0) == 0);
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, src, &e), 0);
    if (!f) return;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_kv_key(f, i);
        CHECK_MSG(gguf_writer_copy_kv(w, f, i) == 0, "%.*s", (int)k.n, k.p);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        char name[80];
        snprintf(name, sizeof name, "%.*s", (int)t->name.n, t->name.p);
        CHECK_EQ_INT(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, &e), 0);
    }
    const char *dst = tmp_path("copy.gguf");
    CHECK_EQ_INT(gguf_writer_begin(w, dst, &e), 0);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        uint8_t buf[512];
        CHECK_EQ_INT(gguf_read_tensor(f, i, 0, buf, t->bytes, &e), 0);
        CHECK_EQ_INT(gguf_writer_write(w, buf, t->bytes, &e), 0);
    }
    CHECK_EQ_INT(gguf_writer_finish(w, &e), 0);
    gguf_writer_free(w);
    uint64_t na, nb;
    uint8_t *a = slurp(src, &na), *b = slurp(dst, &nb);
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
    gguf_file *g = NULL;
    CHECK_EQ_INT(gguf_open(&g, dst, &e), 0);
    if (g) CHECK(gguf_fingerprint(f) == gguf_fingerprint(g));
    gguf_close(g);
    gguf_close(f);
}

TEST(test_getter_errors)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, path, &e), 0);
    if (!f) return;
    uint32_t u;
    int64_t i;
    float fl;
    int b;
    gguf_str s;
    CHECK_EQ_INT(gguf_get_u32(f, "general.architecture", &u, &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "'general.architecture'") && strstr(e.msg, "expected") && strstr(e.msg, "got string"));
    CHECK(strstr(e.msg, "byte offset") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_u32(f, "missing.key", &u, &e), ERR_NOTFOUND);
    CHECK(strstr(e.msg, "missing.key") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_u32(f, "t.i8", &u, &e), ERR_FORMAT);    /* negative */
    CHECK(strstr(e.msg, "-100") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_u32(f, "t.u64", &u, &e), ERR_FORMAT);   /* too large */
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_i64(f, "t.u64", &i, &e), ERR_FORMAT);   /* > INT64_MAX */
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_i64(f, "t.f32", &i, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_i64(f, "a.u32", &i, &e), ERR_FORMAT);   /* array, not a scalar */
    CHECK(strstr(e.msg, "array of u32") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_f32(f, "t.strn", &fl, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_bool(f, "t.u8", &b, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_str(f, "t.u8", &s, &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "expected string, got u8") != NULL);
    err_clear(&e);
    int64_t k = gguf_find_key(f, "a.u32");
    CHECK_EQ_INT(gguf_get_arr_i64(f, k, 10, &i, &e), ERR_RANGE);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_arr_i64(f, k, 9, &i, &e), 0);
    CHECK_EQ_INT(i, 10);
    CHECK_EQ_INT(gguf_get_arr_i64(f, gguf_find_key(f, "a.str"), 0, &i, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_arr_i64(f, gguf_find_key(f, "a.f32"), 0, &i, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_arr_i64(f, gguf_find_key(f, "a.u64"), 0, &i, &e), ERR_FORMAT); /* UINT64_MAX */
    err_clear(&e);
    CHECK_EQ_INT(gguf_get_arr_i64(f, gguf_find_key(f, "t.u16"), 0, &i, &e), 0);         /* scalar, j = 0 */
    CHECK_EQ_INT(i, 60000);
    CHECK_EQ_INT(gguf_get_arr_i64(f, -1, 0, &i, &e), ERR_RANGE);
    CHECK_EQ_INT(gguf_get_u32(f, "t.u8", &u, NULL), 0);   /* NULL err is allowed */
    CHECK_EQ_INT(u, 200);
    gguf_close(f);
}

TEST(test_writer_errors)
{
    err e;
    err_clear(&e);
    gguf_writer *w = gguf_writer_new();
    int64_t bad[] = { 100, 2 }, ok[] = { 4 }, neg[] = { -1 };
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "q", QTYPE_Q4_K, 2, bad, &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "block size") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "n", QTYPE_F32, 1, neg, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "u", 77, 1, ok, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "x", QTYPE_F32, 5, ok, &e), ERR_FORMAT);
    err_clear(&e);
    char longname[80];
    memset(longname, 'a', 64);
    longname[64] = '\0';
    CHECK_EQ_INT(gguf_writer_add_tensor(w, longname, QTYPE_F32, 1, ok, &e), ERR_FORMAT);
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", QTYPE_F32, 1, ok, &e), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", QTYPE_F32, 1, ok, &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "duplicate") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "", 1), ERR_USAGE);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "k", GGUF_TYPE_STRING, "x", 1), ERR_USAGE);
    CHECK_EQ_INT(gguf_writer_write(w, "x", 1, &e), ERR_USAGE);   /* before begin */
    err_clear(&e);
    const char *path = tmp_path("over.gguf");
    CHECK_EQ_INT(gguf_writer_begin(w, path, &e), 0);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "late", 1), ERR_USAGE);
    uint8_t data[17] = { 0 };
    CHECK_EQ_INT(gguf_writer_write(w, data, 17, &e), ERR_USAGE);   /* 16 declared */
    CHECK(strstr(e.msg, "more data") != NULL);
    CHECK(!file_exists(tmp_path("over.gguf.tmp")));
    err_clear(&e);
    CHECK(gguf_writer_finish(w, &e) != 0);
    gguf_writer_free(w);
    CHECK(!file_exists(path));

    /* too few bytes: finish fails and removes the temp */
    w = gguf_writer_new();
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", QTYPE_F32, 1, ok, &e), 0);
    path = tmp_path("under.gguf");
    CHECK_EQ_INT(gguf_writer_begin(w, path, &e), 0);
    CHECK_EQ_INT(gguf_writer_write(w, data, 15, &e), 0);
    CHECK(gguf_writer_finish(w, &e) != 0);
    CHECK(strstr(e.msg, "missing 1 data bytes") != NULL);
    CHECK(!file_exists(tmp_path("under.gguf.tmp")));
    CHECK(!file_exists(path));
    gguf_writer_free(w);

    /* free without finish removes the temp */
    w = gguf_writer_new();
    err_clear(&e);
    path = tmp_path("abandon.gguf");
    CHECK_EQ_INT(gguf_writer_begin(w, path, &e), 0);
    CHECK(file_exists(tmp_path("abandon.gguf.tmp")));
    gguf_writer_free(w);
    CHECK(!file_exists(tmp_path("abandon.gguf.tmp")));
    CHECK(!file_exists(path));

    /* a directory that does not exist */
    w = gguf_writer_new();
    err_clear(&e);
    CHECK_EQ_INT(gguf_writer_begin(w, tmp_path("no/such/dir.gguf"), &e), ERR_IO);
    CHECK(strstr(e.msg, "cannot create") != NULL);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
}

TEST(test_fingerprint)
{
    gguf_writer *w = gguf_writer_new();
    err e;
    err_clear(&e);
    gguf_writer_set_u32(w, "k", 1);
    gguf_writer_begin(w, tmp_path("fp1.gguf"), &e);
    gguf_writer_finish(w, &e);
    gguf_writer_free(w);
    w = gguf_writer_new();
    gguf_writer_set_u32(w, "k", 2);
    gguf_writer_begin(w, tmp_path("fp2.gguf"), &e);
    gguf_writer_finish(w, &e);
    gguf_writer_free(w);
    CHECK_EQ_INT(e.code, 0);
    gguf_file *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ_INT(gguf_open(&a, tmp_path("fp1.gguf"), &e), 0);
    CHECK_EQ_INT(gguf_open(&b, tmp_path("fp1.gguf"), &e), 0);
    CHECK_EQ_INT(gguf_open(&c, tmp_path("fp2.gguf"), &e), 0);
    if (a && b && c) {
        CHECK(gguf_fingerprint(a) == gguf_fingerprint(b));
        CHECK(gguf_fingerprint(a) != gguf_fingerprint(c));
        /* FNV-1a over the header, then the file size (8 LE bytes) */
        uint64_t n;
        uint8_t *bytes = slurp(tmp_path("fp1.gguf"), &n);
        uint64_t h = 0xcbf29ce484222325ull;
        for (uint64_t j = 0; j < gguf_header_bytes(a); j++) { h ^= bytes[j]; h *= 0x100000001b3ull; }
        for (int j = 0; j < 8; j++) { h ^= (uint8_t)(n >> (8 * j)); h *= 0x100000001b3ull; }
        CHECK(h == gguf_fingerprint(a));
        /* same header, different size: different fingerprint */
        gguf_file *d = NULL;
        CHECK_EQ_INT(gguf_parse(&d, bytes, n, n + 64, &e), 0);
        if (d) CHECK(gguf_fingerprint(d) != gguf_fingerprint(a));
        gguf_close(d);
        free(bytes);
    }
    gguf_close(a);
    gguf_close(b);
    gguf_close(c);
}

TEST(test_print_kv)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    err e;
    err_clear(&e);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, path, &e), 0);
    if (!f) return;
    struct { const char *key; int max; const char *want; } cases[] = {
        { "a.u32", 3, "[1, 2, 3, ... (10 total)]" },
        { "a.u32", 10, "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" },
        { "a.u32", 0, "[... (10 total)]" },
        { "a.str", 8, "[\"hello\", \"\", \"w\xc3\xb6rld\"]" },
        { "a.bool", 8, "[true, false, true]" },
        { "a.f32", 8, "[1.5, -0.25, 1e-06]" },
        { "a.i64", 8, "[-9223372036854775808, 9223372036854775807]" },
        { "a.empty", 8, "[]" },
        { "t.strn", 8, "\"a\\x00b\\n\\\"c\"" },
        { "t.f64", 8, "2.718281828459045" },
        { "t.i8", 8, "-100" },
        { "t.bool", 8, "true" },
        { "general.architecture", 8, "\"qwen3moe\"" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        gguf_print_kv(m, f, gguf_find_key(f, cases[c].key), cases[c].max);
        fclose(m);
        CHECK_MSG(strcmp(buf, cases[c].want) == 0, "%s: got '%s' want '%s'", cases[c].key, buf, cases[c].want);
        free(buf);
    }
    gguf_close(f);
}

/* ==== Corruption: truncation at every byte, single-byte mutations ==== */

/* Check the invariants gguf.h promises for a successfully parsed file. */
static int invariants_hold(const gguf_file *f)
{
    uint64_t size = gguf_file_size(f), expect = 0, al = gguf_alignment(f);
    if (al == 0 || (al & (al - 1))) return 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        if (t->n_dims < 1 || t->n_dims > 4) return 0;
        if (t->off != expect || t->file_off + t->bytes > size || t->file_off < gguf_data_off(f)) return 0;
        expect += (t->bytes + al - 1) / al * al;
        const qtype_info *q = qtype_get(t->type);
        if (!q || t->ne[0] % q->blck) return 0;
    }
    return 1;
}

TEST(test_truncated_every_byte)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    uint64_t n;
    uint8_t *full = slurp(path, &n);
    CHECK(full != NULL);
    if (!full) return;
    err e;
    gguf_file *f = NULL;
    err_clear(&e);
    CHECK_EQ_INT(gguf_parse(&f, full, n, n, &e), 0);
    uint64_t hdr = f ? gguf_header_bytes(f) : 0;
    uint64_t data_end = 0;
    for (int64_t i = 0; f && i < gguf_n_tensors(f); i++) {   /* the zero-byte last tensor sits at a padded offset */
        const gguf_tensor_info *t = gguf_tensor(f, i);
        if (t->file_off + t->bytes > data_end) data_end = t->file_off + t->bytes;
    }
    gguf_close(f);
    int bad_fail = 0, bad_msg = 0, bad_ok = 0;
    for (uint64_t k = 0; k < n; k++) {
        /* a file that really ends at k: fails while it cuts the header or any tensor's data */
        uint8_t *copy = malloc(k ? k : 1);   /* exact size so ASan sees any overread */
        memcpy(copy, full, k);
        err_clear(&e);
        f = NULL;
        int rc = gguf_parse(&f, copy, k, k, &e);
        if (k < data_end) {
            if (rc != ERR_FORMAT || f) bad_fail++;
            if (!e.msg[0] || strchr(e.msg, '\n')) bad_msg++;
        } else if (rc != 0 || !invariants_hold(f)) {
            bad_ok++;
        }
        gguf_close(f);
        /* only the first k bytes of a complete file: fine once the header is in */
        err_clear(&e);
        f = NULL;
        rc = gguf_parse(&f, copy, k, n, &e);
        if ((k >= hdr) != (rc == 0)) bad_ok++;
        if (rc != 0 && !e.msg[0]) bad_msg++;
        gguf_close(f);
        free(copy);
    }
    CHECK_EQ_INT(bad_fail, 0);
    CHECK_EQ_INT(bad_msg, 0);
    CHECK_EQ_INT(bad_ok, 0);
    free(full);
}

TEST(test_mutated_bytes)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    uint64_t n;
    uint8_t *full = slurp(path, &n);
    if (!full) { CHECK(0); return; }
    gguf_file *f = NULL;
    err e;
    err_clear(&e);
    gguf_parse(&f, full, n, n, &e);
    uint64_t hdr = f ? gguf_header_bytes(f) : n;
    gguf_close(f);
    static const uint8_t vals[] = { 0x00, 0x01, 0x7f, 0x80, 0xff, 0x40 };
    int broken = 0, ok = 0, fail = 0;
    uint8_t *copy = malloc(n);
    for (uint64_t k = 0; k < hdr; k++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(copy, full, n);
            copy[k] = vals[v];
            err_clear(&e);
            f = NULL;
            int rc = gguf_parse(&f, copy, n, n, &e);
            if (rc == 0) {
                ok++;
                if (!invariants_hold(f)) broken++;
            } else {
                fail++;
                if (!e.msg[0] || strchr(e.msg, '\n')) broken++;
            }
            gguf_close(f);
        }
    }
    free(copy);
    free(full);
    CHECK_EQ_INT(broken, 0);
    CHECK(ok > 0 && fail > 0);
}

TEST(test_versions_and_open_errors)
{
    const char *path = tmp_path("all.gguf");
    CHECK(write_all_types(path, 0) == 0);
    uint64_t n;
    uint8_t *b = slurp(path, &n);
    if (!b) { CHECK(0); return; }
    err e;
    gguf_file *f = NULL;
    uint32_t v = 2;
    memcpy(b + 4, &v, 4);
    err_clear(&e);
    CHECK_EQ_INT(gguf_parse(&f, b, n, n, &e), 0);
    if (f) CHECK_EQ_INT(gguf_version(f), 2);
    CHECK(f && gguf_path(f) == NULL && gguf_fd(f) == -1);
    uint8_t x[4];
    if (f) CHECK_EQ_INT(gguf_read_tensor(f, 0, 0, x, 4, &e), ERR_UNSUPPORTED);
    gguf_close(f);
    struct { uint32_t v; const char *want; } bad[] = {
        { 1, "version 1" }, { 4, "version 4" }, { 0x03000000, "byte order" }, { 0, "version 0" },
    };
    for (size_t i = 0; i < 4; i++) {
        memcpy(b + 4, &bad[i].v, 4);
        err_clear(&e);
        f = NULL;
        CHECK(gguf_parse(&f, b, n, n, &e) != 0);
        CHECK_MSG(strstr(e.msg, bad[i].want) != NULL, "%s", e.msg);
        CHECK(f == NULL);
    }
    free(b);
    err_clear(&e);
    CHECK_EQ_INT(gguf_open(&f, tmp_path("does-not-exist.gguf"), &e), ERR_NOTFOUND);
    CHECK(strstr(e.msg, "does-not-exist.gguf") != NULL);
    err_clear(&e);
    CHECK_EQ_INT(gguf_open(&f, g_dir, &e), ERR_IO);
    CHECK(strstr(e.msg, "not a regular file") != NULL);
    /* an empty file */
    FILE *fp = fopen(tmp_path("empty.gguf"), "wb");
    fclose(fp);
    err_clear(&e);
    CHECK_EQ_INT(gguf_open(&f, tmp_path("empty.gguf"), &e), ERR_FORMAT);
    CHECK(strstr(e.msg, "truncated") && strstr(e.msg, "magic") && strstr(e.msg, "empty.gguf"));
    gguf_close(NULL);
}

/* A header bigger than gguf_open's first 1 MiB window: the window grows. */
TEST(test_big_header)
{
    gguf_writer *w = gguf_writer_new();
    err e;
    err_clear(&e);
    enum { N = 150000 };
    char **strs = malloc(N * sizeof *strs);
    char (*store)[16] = malloc(N * sizeof *store);
    for (int i = 0; i < N; i++) {
        snprintf(store[i], sizeof store[i], "tok%d", i);
        strs[i] = store[i];
    }
    CHECK_EQ_INT(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)strs, NULL, N), 0);
    int64_t ne[] = { 32 };
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", QTYPE_F32, 1, ne, &e), 0);
    CHECK_EQ_INT(gguf_writer_begin(w, tmp_path("big.gguf"), &e), 0);
    CHECK_EQ_INT(gguf_writer_write(w, NULL, 128, &e), 0);
    CHECK_EQ_INT(gguf_writer_finish(w, &e), 0);
    gguf_writer_free(w);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(&f, tmp_path("big.gguf"), &e), 0);
    if (f) {
        CHECK(gguf_header_bytes(f) > (1u << 20));
        int64_t k = gguf_find_key(f, "tokenizer.ggml.tokens");
        CHECK_EQ_INT(gguf_kv_arr_n(f, k), N);
        CHECK(gguf_str_eq(gguf_kv_arr_str(f, k, N - 1), "tok149999"));
        CHECK(gguf_find_tensor(f, "t") == 0);
    }
    gguf_close(f);
    free(strs);
    free(store);
}

static void cleanup_dir(void)
{
    const char *names[] = { "all.gguf", "align.gguf", "layout.gguf", "copy.gguf", "fp1.gguf", "fp2.gguf",
                            "empty.gguf", "big.gguf", "under.gguf", "over.gguf" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp_path(names[i]));
    rmdir(g_dir);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/strata_test_gguf_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_roundtrip_values);
    RUN(test_roundtrip_tensors);
    RUN(test_alignment);
    RUN(test_layout_matches_llama_cpp);
    RUN(test_copy_kv_identical);
    RUN(test_getter_errors);
    RUN(test_writer_errors);
    RUN(test_fingerprint);
    RUN(test_print_kv);
    RUN(test_truncated_every_byte);
    RUN(test_mutated_bytes);
    RUN(test_versions_and_open_errors);
    RUN(test_big_header);
    cleanup_dir();
    return test_summary("gguf");
}

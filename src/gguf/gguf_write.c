/* gguf_write: GGUF v3 writer with llama.cpp's layout (see gguf_write.h).
 *
 * What this file owns: the metadata and tensor declarations of a file being
 * built, the temporary file "<path>.tmp" while it is written, and its rename
 * (or removal) at the end. Tensor data is streamed through a small buffer,
 * never held whole.
 *
 * Layout, byte for byte as llama.cpp's gguf_write_out(): "GGUF", u32 3,
 * i64 n_tensors, i64 n_kv; each KV as key string, i32 type, value (arrays:
 * i32 element type, u64 count, elements; bools one byte 0/1); each tensor as
 * name string, u32 n_dims, i64 ne[n_dims], i32 type, u64 offset; zeros up to
 * the alignment; then each tensor's bytes followed by zeros up to the
 * alignment (the last tensor too). Offsets are sum_{j<i} PAD(bytes_j, align).
 * n_dims is written as ggml_n_dims() computes it: trailing dimensions of
 * size 1 are dropped (at least 1 dim remains), so a declared [64, 32, 1]
 * tensor is stored as 2-D, exactly as llama.cpp stores it.
 *
 * Each KV is serialised when it is set (type id + value bytes), so writing
 * the header is a copy, and gguf_writer_copy_kv() works for any type.
 * Setting a key twice replaces the value in place (llama.cpp instead moves
 * the key to the end; our header promises the position is kept).
 *
 * A writer is single-threaded. After an I/O error it is "failed": every
 * later call returns an error and the temporary file is already removed. */
#include "gguf/gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/qtype.h"
#include "util/cursor.h"

#define GGUF_MAX_NAME 64              /* llama.cpp's GGML_MAX_NAME: names are shorter */
#define WBUF_BYTES    (1u << 20)      /* write-behind buffer */

typedef struct wkv {
    char    *key;        /* owned, NUL-terminated */
    uint8_t *val;        /* owned: i32 type id + value bytes, as stored in the file */
    uint64_t val_n;
} wkv;

typedef struct wtensor {
    char    *name;       /* owned */
    int      type;
    int      n_dims;     /* as declared */
    int64_t  ne[GGUF_MAX_DIMS];
    uint64_t bytes;      /* exact data bytes */
    uint64_t off;        /* relative offset, set by begin */
} wtensor;

enum wstate { W_BUILDING, W_WRITING, W_DONE, W_FAILED };

struct gguf_writer {
    wkv     *kv;         /* owned, n_kv used of cap_kv */
    int64_t  n_kv, cap_kv;
    wtensor *t;          /* owned */
    int64_t  n_t, cap_t;
    enum wstate state;
    char    *path;       /* owned: final path */
    char    *tmp;        /* owned: "<path>.tmp" */
    int      fd;         /* open while writing; -1 otherwise */
    uint64_t align;
    uint8_t *buf;        /* owned write buffer, WBUF_BYTES */
    uint64_t buf_n;
    uint64_t file_pos;   /* bytes handed to the file so far (buffered included) */
    int64_t  cur;        /* tensor being written */
    uint64_t cur_left;   /* its bytes still expected */
};

gguf_writer *gguf_writer_new(void)
{
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->fd = -1;
    w->align = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

static void drop_tmp(gguf_writer *w)
{
    if (w->fd >= 0) { close(w->fd); w->fd = -1; }
    if (w->tmp && (w->state == W_WRITING || w->state == W_FAILED)) unlink(w->tmp);
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    drop_tmp(w);
    for (int64_t i = 0; i < w->n_kv; i++) { free(w->kv[i].key); free(w->kv[i].val); }
    free(w->kv);
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->path);
    free(w->tmp);
    free(w->buf);
    free(w);
}

/* ==== Metadata ==== */

static int64_t find_key(const gguf_writer *w, const char *key)
{
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return i;
    return -1;
}

/* Store `val` (owned by the callee from now on) as the serialised value of key. */
static int put_kv(gguf_writer *w, const char *key, uint8_t *val, uint64_t val_n)
{
    if (w->state != W_BUILDING || !key || !*key) { free(val); return ERR_USAGE; }
    int64_t i = find_key(w, key);
    if (i >= 0) {
        free(w->kv[i].val);
        w->kv[i].val = val;
        w->kv[i].val_n = val_n;
        return 0;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = realloc(w->kv, (size_t)cap * sizeof *nk);
        if (!nk) { free(val); return ERR_NOMEM; }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) { free(val); return ERR_NOMEM; }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].val = val;
    w->kv[w->n_kv].val_n = val_n;
    w->n_kv++;
    return 0;
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

static void put_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static int set_scalar(gguf_writer *w, const char *key, int type, const void *v)
{
    uint64_t sz = elem_size(type);
    uint8_t *val = malloc(4 + sz);
    if (!val) return ERR_NOMEM;
    put_i32(val, type);
    memcpy(val + 4, v, sz);
    if (type == GGUF_TYPE_BOOL) val[4] = val[4] ? 1 : 0;   /* llama.cpp writes bools as 0/1 */
    return put_kv(w, key, val, 4 + sz);
}

int gguf_writer_set_u8 (gguf_writer *w, const char *key, uint8_t v)  { return set_scalar(w, key, GGUF_TYPE_UINT8, &v); }
int gguf_writer_set_i8 (gguf_writer *w, const char *key, int8_t v)   { return set_scalar(w, key, GGUF_TYPE_INT8, &v); }
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_TYPE_UINT16, &v); }
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v)  { return set_scalar(w, key, GGUF_TYPE_INT16, &v); }
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_TYPE_UINT32, &v); }
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)  { return set_scalar(w, key, GGUF_TYPE_INT32, &v); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_TYPE_UINT64, &v); }
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v)  { return set_scalar(w, key, GGUF_TYPE_INT64, &v); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)    { return set_scalar(w, key, GGUF_TYPE_FLOAT32, &v); }
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v)   { return set_scalar(w, key, GGUF_TYPE_FLOAT64, &v); }

int gguf_writer_set_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t n)
{
    uint64_t total;
    if (size_add_ok(n, 12, &total) != 0 || total > SIZE_MAX) return ERR_NOMEM;
    uint8_t *val = malloc((size_t)total);
    if (!val) return ERR_NOMEM;
    put_i32(val, GGUF_TYPE_STRING);
    put_u64(val + 4, n);
    if (n) memcpy(val + 12, v, (size_t)n);
    return put_kv(w, key, val, total);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    return gguf_writer_set_strn(w, key, v, strlen(v));
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n)
{
    uint64_t sz = elem_size(elem_type), bytes, total;
    if (sz == 0) return ERR_USAGE;   /* strings go through set_arr_str; no nested arrays */
    if (size_mul_ok(n, sz, &bytes) != 0 || size_add_ok(bytes, 16, &total) != 0 || total > SIZE_MAX) return ERR_NOMEM;
    uint8_t *val = malloc((size_t)total);
    if (!val) return ERR_NOMEM;
    put_i32(val, GGUF_TYPE_ARRAY);
    put_i32(val + 4, elem_type);
    put_u64(val + 8, n);
    if (bytes) memcpy(val + 16, data, (size_t)bytes);
    if (elem_type == GGUF_TYPE_BOOL)   /* llama.cpp writes bools as 0/1 */
        for (uint64_t j = 0; j < n; j++) val[16 + j] = val[16 + j] ? 1 : 0;
    return put_kv(w, key, val, total);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n)
{
    uint64_t total = 16;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t len = lens ? lens[j] : strlen(strs[j]);
        if (size_add_ok(total, 8, &total) != 0 || size_add_ok(total, len, &total) != 0) return ERR_NOMEM;
    }
    if (total > SIZE_MAX) return ERR_NOMEM;
    uint8_t *val = malloc((size_t)total);
    if (!val) return ERR_NOMEM;
    put_i32(val, GGUF_TYPE_ARRAY);
    put_i32(val + 4, GGUF_TYPE_STRING);
    put_u64(val + 8, n);
    uint64_t o = 16;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t len = lens ? lens[j] : strlen(strs[j]);
        put_u64(val + o, len);
        if (len) memcpy(val + o + 8, strs[j], (size_t)len);
        o += 8 + len;
    }
    return put_kv(w, key, val, total);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i)
{
    if (i < 0 || i >= gguf_n_kv(src)) return ERR_USAGE;
    gguf_str k = gguf_kv_key(src, i);
    /* Keys with embedded NULs cannot be C strings; refuse rather than truncate. */
    if (memchr(k.p, '\0', (size_t)k.n)) return ERR_USAGE;
    char *key = malloc((size_t)k.n + 1);
    if (!key) return ERR_NOMEM;
    memcpy(key, k.p, (size_t)k.n);
    key[k.n] = '\0';
    int rc, type = gguf_kv_type(src, i), et = gguf_kv_arr_type(src, i);
    uint64_t n = gguf_kv_arr_n(src, i);
    if (type == GGUF_TYPE_STRING) {
        gguf_str s = gguf_kv_arr_str(src, i, 0);
        rc = gguf_writer_set_strn(w, key, s.p, s.n);
    } else if (type == GGUF_TYPE_ARRAY && et == GGUF_TYPE_STRING) {
        const char **ps = malloc((n ? n : 1) * sizeof *ps);
        uint64_t *ls = malloc((n ? n : 1) * sizeof *ls);
        rc = ERR_NOMEM;
        if (ps && ls) {
            for (uint64_t j = 0; j < n; j++) {
                gguf_str s = gguf_kv_arr_str(src, i, j);
                ps[j] = s.p;
                ls[j] = s.n;
            }
            rc = gguf_writer_set_arr_str(w, key, ps, ls, n);
        }
        free(ps);
        free(ls);
    } else if (type == GGUF_TYPE_ARRAY) {
        rc = gguf_writer_set_arr(w, key, et, gguf_kv_data(src, i), n);
    } else {
        rc = set_scalar(w, key, type, gguf_kv_data(src, i));
    }
    free(key);
    return rc;
}

void gguf_writer_remove_key(gguf_writer *w, const char *key)
{
    if (w->state != W_BUILDING) return;
    int64_t i = find_key(w, key);
    if (i < 0) return;
    free(w->kv[i].key);
    free(w->kv[i].val);
    memmove(&w->kv[i], &w->kv[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kv);
    w->n_kv--;
}

/* ==== Tensors ==== */

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims,
                           const int64_t *ne, err *e)
{
    if (w->state != W_BUILDING) return err_setf(e, ERR_USAGE, "gguf_writer: tensor '%s' added after begin", name);
    size_t len = strlen(name);
    if (len >= GGUF_MAX_NAME)
        return err_setf(e, ERR_FORMAT, "tensor '%s': name of %zu bytes is too long (llama.cpp's limit is %d)",
                        name, len, GGUF_MAX_NAME - 1);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_setf(e, ERR_FORMAT, "tensor '%s': n_dims %d is not in 1..%d", name, n_dims, GGUF_MAX_DIMS);
    const qtype_info *q = qtype_get(type);
    if (!q) return err_setf(e, ERR_FORMAT, "tensor '%s': unknown ggml type id %d", name, type);
    uint64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 0) return err_setf(e, ERR_FORMAT, "tensor '%s': ne[%d] = %" PRId64 " is negative", name, d, ne[d]);
        if (size_mul_ok(nel, (uint64_t)ne[d], &nel) != 0 || nel > (uint64_t)INT64_MAX)
            return err_setf(e, ERR_FORMAT, "tensor '%s': element count overflows int64", name);
    }
    if (ne[0] % q->blck != 0)
        return err_setf(e, ERR_FORMAT, "tensor '%s': ne[0] = %" PRId64 " is not a multiple of %s's block size %d",
                        name, ne[0], q->name, q->blck);
    uint64_t bytes;
    if (size_mul_ok(nel / (uint64_t)q->blck, (uint64_t)q->type_size, &bytes) != 0)
        return err_setf(e, ERR_FORMAT, "tensor '%s': byte size overflows", name);
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return err_setf(e, ERR_FORMAT, "duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return err_setf(e, ERR_NOMEM, "out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return err_setf(e, ERR_NOMEM, "out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->bytes = bytes;
    w->n_t++;
    return 0;
}

uint64_t gguf_writer_tensor_bytes(const gguf_writer *w, int64_t i)
{
    return (i >= 0 && i < w->n_t) ? w->t[i].bytes : 0;
}

int64_t gguf_writer_n_tensors(const gguf_writer *w) { return w->n_t; }

/* ==== Output ==== */

static int fail(gguf_writer *w, int code, err *e, const char *what, int en)
{
    err_setf(e, code, "writing '%s': %s%s%s", w->path ? w->path : "?", what, en ? ": " : "", en ? strerror(en) : "");
    drop_tmp(w);
    w->state = W_FAILED;
    return code;
}

static int flush_buf(gguf_writer *w, err *e)
{
    uint64_t done = 0;
    while (done < w->buf_n) {
        ssize_t r = write(w->fd, w->buf + done, (size_t)(w->buf_n - done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return fail(w, ERR_IO, e, "write failed", errno);
        }
        if (r == 0) return fail(w, ERR_IO, e, "write made no progress", 0);
        done += (uint64_t)r;
    }
    w->buf_n = 0;
    return 0;
}

static int out_bytes(gguf_writer *w, const void *p, uint64_t n, err *e)
{
    const uint8_t *s = (const uint8_t *)p;
    while (n) {
        uint64_t room = WBUF_BYTES - w->buf_n;
        uint64_t k = n < room ? n : room;
        if (s) memcpy(w->buf + w->buf_n, s, (size_t)k);
        else memset(w->buf + w->buf_n, 0, (size_t)k);   /* NULL source: zeros */
        w->buf_n += k;
        w->file_pos += k;
        n -= k;
        if (s) s += k;
        if (w->buf_n == WBUF_BYTES && flush_buf(w, e) != 0) return ERR_IO;
    }
    return 0;
}

static int out_str(gguf_writer *w, const char *s, uint64_t n, err *e)
{
    if (out_bytes(w, &n, 8, e) != 0) return ERR_IO;
    return out_bytes(w, s, n, e);
}

static uint64_t pad_to(uint64_t x, uint64_t align) { return (x + align - 1) & ~(align - 1); }

static int pad_out(gguf_writer *w, err *e)
{
    return out_bytes(w, NULL, pad_to(w->file_pos, w->align) - w->file_pos, e);
}

/* ggml_n_dims(): the number of dims up to the last one larger than 1. */
static int n_dims_stored(const wtensor *t)
{
    for (int d = GGUF_MAX_DIMS - 1; d >= 1; d--)
        if (t->ne[d] > 1) return d + 1;
    return 1;
}

/* Advance past tensors whose bytes are all written, padding after each. */
static int next_tensors(gguf_writer *w, err *e)
{
    while (w->cur < w->n_t && w->cur_left == 0) {
        if (pad_out(w, e) != 0) return ERR_IO;
        w->cur++;
        if (w->cur < w->n_t) w->cur_left = w->t[w->cur].bytes;
    }
    return 0;
}

int gguf_writer_begin(gguf_writer *w, const char *path, err *e)
{
    if (w->state != W_BUILDING) return err_setf(e, ERR_USAGE, "gguf_writer_begin: called twice");
    /* general.alignment: must be a u32 power of two, as llama.cpp asserts. */
    w->align = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = find_key(w, "general.alignment");
    if (ai >= 0) {
        const wkv *kv = &w->kv[ai];
        int32_t type;
        memcpy(&type, kv->val, 4);
        uint32_t a = 0;
        if (type == GGUF_TYPE_UINT32) memcpy(&a, kv->val + 4, 4);
        if (type != GGUF_TYPE_UINT32 || a == 0 || (a & (a - 1)) != 0)
            return err_setf(e, ERR_FORMAT, "general.alignment must be a u32 power of two (got %s %" PRIu32 ")",
                            gguf_type_name(type), a);
        w->align = a;
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        w->t[i].off = off;
        uint64_t padded;
        if (size_add_ok(w->t[i].bytes, w->align - 1, &padded) != 0 ||
            size_add_ok(off, padded & ~(w->align - 1), &off) != 0)
            return err_setf(e, ERR_FORMAT, "total tensor data size overflows");
    }
    size_t plen = strlen(path);
    free(w->path);
    free(w->tmp);
    free(w->buf);
    w->path = strdup(path);
    w->tmp = malloc(plen + 5);
    w->buf = malloc(WBUF_BYTES);
    if (!w->path || !w->tmp || !w->buf) return err_setf(e, ERR_NOMEM, "out of memory");
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmp", 5);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int en = errno;
        return err_setf(e, ERR_IO, "cannot create '%s': %s", w->tmp, strerror(en));
    }
    w->state = W_WRITING;

    uint32_t version = 3;
    int64_t n_t = w->n_t, n_kv = w->n_kv;
    if (out_bytes(w, "GGUF", 4, e) || out_bytes(w, &version, 4, e) ||
        out_bytes(w, &n_t, 8, e) || out_bytes(w, &n_kv, 8, e))
        return ERR_IO;
    for (int64_t i = 0; i < w->n_kv; i++)
        if (out_str(w, w->kv[i].key, strlen(w->kv[i].key), e) || out_bytes(w, w->kv[i].val, w->kv[i].val_n, e))
            return ERR_IO;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint32_t nd = (uint32_t)n_dims_stored(t);
        int32_t type = t->type;
        if (out_str(w, t->name, strlen(t->name), e) || out_bytes(w, &nd, 4, e) ||
            out_bytes(w, t->ne, 8ull * nd, e) || out_bytes(w, &type, 4, e) || out_bytes(w, &t->off, 8, e))
            return ERR_IO;
    }
    if (pad_out(w, e) != 0) return ERR_IO;
    w->cur = 0;
    w->cur_left = w->n_t ? w->t[0].bytes : 0;
    return next_tensors(w, e);   /* skips leading zero-byte tensors */
}

int gguf_writer_write(gguf_writer *w, const void *data, uint64_t n, err *e)
{
    if (w->state != W_WRITING)
        return err_setf(e, ERR_USAGE, "gguf_writer_write: writer is not writing (begin not called, finished or failed)");
    const uint8_t *p = (const uint8_t *)data;
    while (n) {
        if (w->cur >= w->n_t)
            return fail(w, ERR_USAGE, e, "more data bytes written than the tensors declare", 0);
        uint64_t k = n < w->cur_left ? n : w->cur_left;
        if (out_bytes(w, p, k, e) != 0) return ERR_IO;
        if (p) p += k;   /* NULL means zeros */
        n -= k;
        w->cur_left -= k;
        if (next_tensors(w, e) != 0) return ERR_IO;
    }
    return 0;
}

int gguf_writer_finish(gguf_writer *w, err *e)
{
    if (w->state != W_WRITING)
        return err_setf(e, ERR_USAGE, "gguf_writer_finish: writer is not writing (begin not called, finished or failed)");
    if (w->cur < w->n_t) {
        char what[200];
        snprintf(what, sizeof what, "tensor '%s' (#%" PRId64 ") is missing %" PRIu64 " data bytes",
                 w->t[w->cur].name, w->cur, w->cur_left);
        return fail(w, ERR_USAGE, e, what, 0);
    }
    if (flush_buf(w, e) != 0) return ERR_IO;
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) return fail(w, ERR_IO, e, "close failed", errno);
    if (rename(w->tmp, w->path) != 0) return fail(w, ERR_IO, e, "rename of the temporary file failed", errno);
    w->state = W_DONE;
    return 0;
}

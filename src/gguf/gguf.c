/* gguf: the bounds-checked GGUF v2/v3 header reader (see gguf.h).
 *
 * What this file owns: parsing the header (magic, version, counts, KV pairs,
 * tensor table) into an immutable gguf_file, lookups by key and tensor name,
 * typed getters, the file fingerprint, a pread helper for tensor bytes and a
 * human-readable printer for values. It never maps or reads tensor data
 * wholesale.
 *
 * How a parse works: the whole parse runs over one in-memory window of the
 * file (gguf_open fills it with pread; gguf_parse gets it from the caller).
 * Every read goes through util/cursor.h. Every count that decides an
 * allocation (n_kv, n_tensors, array lengths, string lengths) is first
 * checked against the bytes left in the FILE (too many for the file: the
 * file is corrupt, say so) and then against the bytes left in the WINDOW
 * (too many for the window but not for the file: the window is too small,
 * gguf_open grows it and parses again). So an absurd count fails before any
 * allocation, and every allocation is bounded by a small multiple of the
 * header's real size.
 *
 * Pointers made during the parse point into the window; on success the
 * header bytes are copied into memory owned by the gguf_file and every
 * pointer is rebased onto that copy (so the caller's buffer, or gguf_open's
 * pread window, can be freed).
 *
 * Error messages are one line: "<where>: <what> at byte offset N". <where>
 * is "header", "kv #3 'general.alignment'" or "tensor 'blk.0.x' (#12)".
 *
 * Facts carried over from llama.cpp (ggml/src/gguf.cpp): v1 is rejected, a
 * version whose low 16 bits are zero means the file has the other byte
 * order, keys must be non-empty and unique, tensor names unique and shorter
 * than GGML_MAX_NAME (64), string and array lengths at most 2^30,
 * general.alignment must be a u32 power of two, the data section starts at
 * PAD(end of tensor table, alignment) when there is at least one tensor, and
 * tensor i's offset must equal sum_{j<i} PAD(bytes_j, alignment). */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/qtype.h"
#include "util/cursor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "strata's GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAGIC_U32        0x46554747u   /* "GGUF" read as little-endian u32 */
#define GGUF_MAX_STRING       (1ull << 30)  /* llama.cpp GGUF_MAX_STRING_LENGTH */
#define GGUF_MAX_ARRAY        (1ull << 30)  /* llama.cpp GGUF_MAX_ARRAY_ELEMENTS */
#define GGUF_MAX_NAME         64            /* llama.cpp GGML_MAX_NAME: names must be shorter */
#define GGUF_FIRST_WINDOW     (1ull << 20)  /* gguf_open's first pread window */
/* gguf_open refuses headers larger than this. Real headers are a few MB (a
 * 256k-token vocabulary with merges is ~10 MB); the cap bounds what a hostile
 * file can make us read and allocate. */
#define GGUF_MAX_HEADER_BYTES (256ull << 20)

/* Smallest encodings, used to bound counts by the bytes left:
 * a kv is key length (8) + at least 1 key byte + type (4) + at least 1 value byte;
 * a tensor info is name length (8) + n_dims (4) + one ne (8) + type (4) + offset (8). */
#define KV_MIN_BYTES     14u
#define TENSOR_MIN_BYTES 32u

/* ==== The parsed file ==== */

typedef struct kv_entry {
    gguf_str key;        /* borrowed from hdr */
    int      type;       /* GGUF_TYPE_*; GGUF_TYPE_ARRAY for arrays */
    int      arr_type;   /* element type for arrays; == type for scalars */
    uint64_t n;          /* elements: 1 for scalars */
    uint64_t val_off;    /* file offset of the value (after the type id) */
    union { uint64_t u64; int64_t i64; double f64; uint8_t b[8]; } scalar; /* numeric scalars, LE */
    gguf_str  str;       /* string scalars; borrowed from hdr */
    void     *arr;       /* owned: numeric array elements, 8-byte aligned copy (NULL if n == 0) */
    gguf_str *strs;      /* owned: string array elements (borrowed bytes in hdr) */
} kv_entry;

/* Open-addressing hash set of indices into kv[] or ti[], keyed by name. */
typedef struct name_index {
    int64_t *slot;       /* owned; -1 = empty */
    uint64_t mask;       /* capacity - 1 (capacity a power of two) */
} name_index;

struct gguf_file {
    uint8_t *hdr;               /* owned: bytes [0, header_end) of the file */
    uint64_t header_end;        /* end of the tensor table */
    uint64_t file_size;
    uint64_t data_off;
    uint32_t version;
    uint32_t alignment;
    int64_t  n_kv;
    int64_t  n_tensors;
    kv_entry *kv;               /* owned, n_kv */
    gguf_tensor_info *ti;       /* owned, n_tensors */
    name_index kv_index;
    name_index ti_index;
    uint64_t fingerprint;
    char    *path;              /* owned; NULL when parsed from memory */
    int      fd;                /* owned; -1 when parsed from memory */
};

/* ==== Small helpers ==== */

static uint64_t fnv1a(uint64_t h, const void *p, uint64_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    for (uint64_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull

static int type_valid(int t) { return t >= 0 && t < GGUF_TYPE_COUNT; }

/* Bytes of one element of a fixed-size type; 0 for string/array. */
static uint64_t type_size(int t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static int type_is_int(int t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
        return 1;
    default:
        return 0;
    }
}

const char *gguf_type_name(int t)
{
    static const char *const names[GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return type_valid(t) ? names[t] : "unknown";
}

int gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.n == n && (n == 0 || memcmp(s.p, c, n) == 0);
}

/* Copy a name into buf for an error message: at most 64 bytes, unprintable
 * bytes (and quotes) as '?', "..." when cut. */
static const char *safe_name(char *buf, size_t cap, const char *p, uint64_t n)
{
    /* cap must be at least 8: room for some bytes, "..." and the NUL */
    size_t o = 0, lim = cap - 4;
    if (lim > 64) lim = 64;
    for (uint64_t i = 0; i < n && o < lim; i++) {
        unsigned char ch = (unsigned char)p[i];
        buf[o++] = (ch < 0x20 || ch >= 0x7f || ch == '\'') ? '?' : (char)ch;
    }
    if (n > o) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = '\0';
    return buf;
}

/* Load the little-endian integer of type t at p. *s and *u both get the value
 * where it fits (clamped otherwise); *is_neg says it is negative. */
static void load_int(int t, const void *p, int64_t *s, uint64_t *u, int *is_neg)
{
    int64_t sv = 0; uint64_t uv = 0; int neg = 0;
    switch (t) {
    case GGUF_TYPE_UINT8:  { uint8_t v;  memcpy(&v, p, 1); uv = v; break; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); uv = v; break; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); uv = v; break; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); uv = v; break; }
    case GGUF_TYPE_INT8:   { int8_t v;   memcpy(&v, p, 1); sv = v; neg = 1; break; }
    case GGUF_TYPE_INT16:  { int16_t v;  memcpy(&v, p, 2); sv = v; neg = 1; break; }
    case GGUF_TYPE_INT32:  { int32_t v;  memcpy(&v, p, 4); sv = v; neg = 1; break; }
    case GGUF_TYPE_INT64:  { int64_t v;  memcpy(&v, p, 8); sv = v; neg = 1; break; }
    default: break;
    }
    if (neg) { *s = sv; *u = sv < 0 ? 0 : (uint64_t)sv; *is_neg = sv < 0; }
    else     { *u = uv; *s = uv > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)uv; *is_neg = 0; }
}

/* ==== Name index ==== */

static int index_init(name_index *x, int64_t n)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;   /* n is bounded by the header size */
    x->slot = malloc(cap * sizeof *x->slot);
    if (!x->slot) return ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) x->slot[i] = -1;
    x->mask = cap - 1;
    return 0;
}

/* Find `name` among names[] through the index. `get` maps an index to its name. */
typedef gguf_str (*name_of_fn)(const void *tab, int64_t i);
static gguf_str kv_name_of(const void *tab, int64_t i) { return ((const kv_entry *)tab)[i].key; }
static gguf_str ti_name_of(const void *tab, int64_t i) { return ((const gguf_tensor_info *)tab)[i].name; }

static int64_t index_find(const name_index *x, const void *tab, name_of_fn get, const char *p, uint64_t n)
{
    if (!x->slot) return -1;
    for (uint64_t h = fnv1a(FNV_OFFSET, p, n) & x->mask;; h = (h + 1) & x->mask) {
        int64_t i = x->slot[h];
        if (i < 0) return -1;
        gguf_str s = get(tab, i);
        if (s.n == n && (n == 0 || memcmp(s.p, p, n) == 0)) return i;
    }
}

/* Insert index i (its name must not be present yet). The table is at most
 * half full by construction, so probing terminates. */
static void index_put(name_index *x, const char *p, uint64_t n, int64_t i)
{
    uint64_t h = fnv1a(FNV_OFFSET, p, n) & x->mask;
    while (x->slot[h] >= 0) h = (h + 1) & x->mask;
    x->slot[h] = i;
}

/* ==== Parser ==== */

typedef struct parser {
    cursor   c;            /* over the window; base_off = 0 (window starts at file offset 0) */
    uint64_t file_size;
    int      need_more;    /* failed only because the window ended before the file did */
    int      code;         /* first error code (0 = none) */
    err     *e;
    char     where[200];   /* context for messages: "kv #3 'key'" */
    gguf_file *f;          /* being built */
} parser;

static int perr(parser *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *p, int code, const char *fmt, ...)
{
    char msg[sizeof p->e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->c.failed = 1;
    if (!p->code) p->code = code;
    if (p->where[0]) return err_setf(p->e, code, "%s: %s", p->where, msg);
    return err_setf(p->e, code, "%s", msg);
}

static uint64_t left_in_file(const parser *p)
{
    uint64_t off = cursor_off(&p->c);
    return off <= p->file_size ? p->file_size - off : 0;
}

/* Make sure `n` bytes of `field` can be read at the cursor. */
static int need(parser *p, uint64_t n, const char *field)
{
    if (p->c.failed) return ERR_FORMAT;
    if (cursor_has(&p->c, n)) return 0;
    if (n <= left_in_file(p)) {
        p->need_more = 1;
        return perr(p, ERR_FORMAT, "%s at byte offset %" PRIu64 " lies beyond the %" PRIu64
                    " header bytes available", field, cursor_off(&p->c), p->c.size);
    }
    return perr(p, ERR_FORMAT, "truncated: %s needs %" PRIu64 " bytes at byte offset %" PRIu64
                ", only %" PRIu64 " left in the file (%" PRIu64 " bytes)",
                field, n, cursor_off(&p->c), left_in_file(p), p->file_size);
}

/* Check that `count` items of at least `each` bytes can fit in what is left.
 * `off` is the file offset where the count was stored. Called before any
 * allocation sized by `count`. */
static int check_count(parser *p, uint64_t count, uint64_t each, uint64_t limit, const char *field, uint64_t off)
{
    if (count > limit)
        return perr(p, ERR_FORMAT, "%s %" PRIu64 " at byte offset %" PRIu64 " exceeds the limit of %" PRIu64,
                    field, count, off, limit);
    uint64_t total;
    if (size_mul_ok(count, each, &total) != 0)
        return perr(p, ERR_FORMAT, "%s %" PRIu64 " at byte offset %" PRIu64 " cannot fit: needs more than 2^64 bytes,"
                    " only %" PRIu64 " left in the file (corrupt count)", field, count, off, left_in_file(p));
    if (total > left_in_file(p))
        return perr(p, ERR_FORMAT, "%s %" PRIu64 " at byte offset %" PRIu64 " cannot fit: needs at least %" PRIu64
                    " bytes, only %" PRIu64 " left in the file (truncated, or a corrupt count)",
                    field, count, off, total, left_in_file(p));
    return need(p, total, field);
}

#define READ_FIELD(T, name) \
    static T name(parser *p, const char *field) \
    { if (need(p, sizeof(T), field) != 0) return 0; T v; cursor_read(&p->c, &v, sizeof v, field); return v; }
READ_FIELD(uint32_t, rd_u32)
READ_FIELD(int32_t,  rd_i32)
READ_FIELD(uint64_t, rd_u64)
READ_FIELD(int64_t,  rd_i64)
#undef READ_FIELD

/* Read a string (u64 length + bytes) in place. */
static int rd_str(parser *p, gguf_str *out, const char *field)
{
    out->p = ""; out->n = 0;
    uint64_t off = cursor_off(&p->c);
    char lenfield[96];
    snprintf(lenfield, sizeof lenfield, "%s length", field);
    uint64_t n = rd_u64(p, lenfield);
    if (p->c.failed) return ERR_FORMAT;
    if (n > GGUF_MAX_STRING)
        return perr(p, ERR_FORMAT, "%s length %" PRIu64 " at byte offset %" PRIu64 " exceeds the limit of %llu"
                    " (%" PRIu64 " bytes left in the file)", field, n, off, GGUF_MAX_STRING, left_in_file(p));
    if (need(p, n, field) != 0) return ERR_FORMAT;
    out->p = (const char *)cursor_take(&p->c, n, field);
    out->n = n;
    return 0;
}

static void set_where_kv(parser *p, int64_t i, const gguf_str *key)
{
    char nm[80];
    if (key) snprintf(p->where, sizeof p->where, "kv #%" PRId64 " '%s'", i, safe_name(nm, sizeof nm, key->p, key->n));
    else     snprintf(p->where, sizeof p->where, "kv #%" PRId64, i);
}

static void set_where_tensor(parser *p, int64_t i, const gguf_str *name)
{
    char nm[80];
    if (name) snprintf(p->where, sizeof p->where, "tensor '%s' (#%" PRId64 ")", safe_name(nm, sizeof nm, name->p, name->n), i);
    else      snprintf(p->where, sizeof p->where, "tensor #%" PRId64, i);
}

/* Parse KV pair i (key, type, value) into p->f->kv[i]; arrays are bounded by
 * the bytes left before their elements are allocated. */
static int parse_kv(parser *p, int64_t i)
{
    kv_entry *kv = &p->f->kv[i];
    set_where_kv(p, i, NULL);
    if (rd_str(p, &kv->key, "key") != 0) return ERR_FORMAT;
    set_where_kv(p, i, &kv->key);
    if (kv->key.n == 0) return perr(p, ERR_FORMAT, "empty key at byte offset %" PRIu64, cursor_off(&p->c) - 8);
    int64_t dup = index_find(&p->f->kv_index, p->f->kv, kv_name_of, kv->key.p, kv->key.n);
    if (dup >= 0) return perr(p, ERR_FORMAT, "duplicate key (first defined as kv #%" PRId64 ") at byte offset %"
                              PRIu64, dup, cursor_off(&p->c) - kv->key.n);
    uint64_t toff = cursor_off(&p->c);
    int32_t t = rd_i32(p, "value type");
    if (p->c.failed) return ERR_FORMAT;
    if (!type_valid(t))
        return perr(p, ERR_FORMAT, "unknown value type %" PRId32 " at byte offset %" PRIu64, t, toff);
    kv->type = t;
    kv->arr_type = t;
    kv->n = 1;
    if (t == GGUF_TYPE_ARRAY) {
        uint64_t eoff = cursor_off(&p->c);
        int32_t et = rd_i32(p, "array element type");
        if (p->c.failed) return ERR_FORMAT;
        if (et == GGUF_TYPE_ARRAY)
            return perr(p, ERR_FORMAT, "nested array (array of arrays) at byte offset %" PRIu64
                        ": nested arrays are not allowed", eoff);
        if (!type_valid(et))
            return perr(p, ERR_FORMAT, "unknown array element type %" PRId32 " at byte offset %" PRIu64, et, eoff);
        kv->arr_type = et;
        uint64_t noff = cursor_off(&p->c);
        kv->n = rd_u64(p, "array length");
        if (p->c.failed) return ERR_FORMAT;
        /* A string element is at least its 8-byte length. */
        uint64_t each = et == GGUF_TYPE_STRING ? 8 : type_size(et);
        char field[64];
        snprintf(field, sizeof field, "array of %s: length", gguf_type_name(et));
        if (check_count(p, kv->n, each, GGUF_MAX_ARRAY, field, noff) != 0) return ERR_FORMAT;
    }
    kv->val_off = cursor_off(&p->c);
    int et = kv->arr_type;
    if (t != GGUF_TYPE_ARRAY) {
        if (et == GGUF_TYPE_STRING) return rd_str(p, &kv->str, "value");
        uint64_t sz = type_size(et);
        if (need(p, sz, "value") != 0) return ERR_FORMAT;
        cursor_read(&p->c, kv->scalar.b, sz, "value");
        return 0;
    }
    if (et == GGUF_TYPE_STRING) {
        /* n * 8 <= bytes left was checked, so this allocation is bounded. */
        if (kv->n) {
            kv->strs = malloc(kv->n * sizeof *kv->strs);
            if (!kv->strs) return perr(p, ERR_NOMEM, "out of memory for %" PRIu64 " strings", kv->n);
        }
        for (uint64_t j = 0; j < kv->n; j++) {
            char field[64];
            snprintf(field, sizeof field, "element %" PRIu64, j);
            if (rd_str(p, &kv->strs[j], field) != 0) return ERR_FORMAT;
        }
        return 0;
    }
    uint64_t bytes = kv->n * type_size(et);   /* checked by check_count */
    if (bytes) {
        kv->arr = malloc(bytes);
        if (!kv->arr) return perr(p, ERR_NOMEM, "out of memory for %" PRIu64 " array bytes", bytes);
        cursor_read(&p->c, kv->arr, bytes, "array elements");
    }
    return 0;
}

static int parse_tensor(parser *p, int64_t i, uint64_t *info_off)
{
    gguf_tensor_info *t = &p->f->ti[i];
    set_where_tensor(p, i, NULL);
    *info_off = cursor_off(&p->c);
    if (rd_str(p, &t->name, "name") != 0) return ERR_FORMAT;
    set_where_tensor(p, i, &t->name);
    if (t->name.n >= GGUF_MAX_NAME)
        return perr(p, ERR_FORMAT, "name of %" PRIu64 " bytes at byte offset %" PRIu64
                    " is too long (llama.cpp's limit is %d)", t->name.n, *info_off, GGUF_MAX_NAME - 1);
    int64_t dup = index_find(&p->f->ti_index, p->f->ti, ti_name_of, t->name.p, t->name.n);
    if (dup >= 0) return perr(p, ERR_FORMAT, "duplicate tensor name (first defined as tensor #%" PRId64
                              ") at byte offset %" PRIu64, dup, *info_off);
    uint64_t doff = cursor_off(&p->c);
    uint32_t n_dims = rd_u32(p, "n_dims");
    if (p->c.failed) return ERR_FORMAT;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return perr(p, ERR_FORMAT, "n_dims %" PRIu32 " at byte offset %" PRIu64 " is not in 1..%d",
                    n_dims, doff, GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t off = cursor_off(&p->c);
        t->ne[d] = rd_i64(p, "ne");
        if (p->c.failed) return ERR_FORMAT;
        if (t->ne[d] < 0)
            return perr(p, ERR_FORMAT, "ne[%" PRIu32 "] = %" PRId64 " at byte offset %" PRIu64 " is negative",
                        d, t->ne[d], off);
    }
    uint64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (size_mul_ok(nel, (uint64_t)t->ne[d], &nel) != 0 || nel > (uint64_t)INT64_MAX)
            return perr(p, ERR_FORMAT, "element count of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                        "] overflows int64 (shape at byte offset %" PRIu64 ")",
                        t->ne[0], t->ne[1], t->ne[2], t->ne[3], doff + 4);
    }
    uint64_t toff = cursor_off(&p->c);
    t->type = rd_i32(p, "ggml type");
    if (p->c.failed) return ERR_FORMAT;
    const qtype_info *q = qtype_get(t->type);
    if (!q) return perr(p, ERR_FORMAT, "unknown ggml type id %d at byte offset %" PRIu64, t->type, toff);
    if (t->ne[0] % q->blck != 0)
        return perr(p, ERR_FORMAT, "ne[0] = %" PRId64 " is not a multiple of %s's block size %d (shape at byte offset %"
                    PRIu64 ")", t->ne[0], q->name, q->blck, doff + 4);
    /* nb[0] = type_size, nb[1] = nb[0] * ne[0] / blck, nb[d] = nb[d-1] * ne[d-1].
     * bytes = (nel / blck) * type_size; it bounds every nb[d] (when nel > 0), so
     * checking it is enough; zero-element tensors still get finite strides. */
    uint64_t bytes;
    if (size_mul_ok(nel / (uint64_t)q->blck, (uint64_t)q->type_size, &bytes) != 0)
        return perr(p, ERR_FORMAT, "byte size of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                    "] overflows (shape at byte offset %" PRIu64 ")", t->ne[0], t->ne[1], t->ne[2], t->ne[3], doff + 4);
    t->bytes = bytes;
    t->nb[0] = (uint64_t)q->type_size;
    int ok = size_mul_ok(t->nb[0], (uint64_t)(t->ne[0] / q->blck), &t->nb[1]) == 0;
    for (int d = 2; d < GGUF_MAX_DIMS; d++)
        ok = ok && size_mul_ok(t->nb[d - 1], (uint64_t)t->ne[d - 1], &t->nb[d]) == 0;
    if (!ok)   /* only reachable for zero-element shapes with huge other dims */
        return perr(p, ERR_FORMAT, "strides of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                    "] overflow (shape at byte offset %" PRIu64 ")", t->ne[0], t->ne[1], t->ne[2], t->ne[3], doff + 4);
    t->off = rd_u64(p, "data offset");
    if (p->c.failed) return ERR_FORMAT;
    return 0;
}

/* general.alignment: checked after the KV pairs, before the tensor table, as
 * llama.cpp does. */
static int check_alignment(parser *p)
{
    gguf_file *f = p->f;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = index_find(&f->kv_index, f->kv, kv_name_of, "general.alignment", 17);
    if (ai >= 0) {
        const kv_entry *kv = &f->kv[ai];
        set_where_kv(p, ai, &kv->key);
        if (kv->type != GGUF_TYPE_UINT32)
            return perr(p, ERR_FORMAT, "expected u32, got %s%s%s at byte offset %" PRIu64, gguf_type_name(kv->type),
                        kv->type == GGUF_TYPE_ARRAY ? " of " : "",
                        kv->type == GGUF_TYPE_ARRAY ? gguf_type_name(kv->arr_type) : "", kv->val_off);
        uint32_t a;
        memcpy(&a, kv->scalar.b, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return perr(p, ERR_FORMAT, "alignment %" PRIu32 " at byte offset %" PRIu64
                        " is not a power of two", a, kv->val_off);
        f->alignment = a;
    }
    p->where[0] = '\0';
    return 0;
}

/* Check the data section and the tensors' data ranges once the table is parsed. */
static int check_layout(parser *p, const uint64_t *info_off)
{
    gguf_file *f = p->f;
    uint64_t align = f->alignment;
    f->data_off = f->header_end;
    if (f->n_tensors > 0) {
        uint64_t padded;
        if (size_add_ok(f->header_end, align - 1, &padded) != 0) padded = UINT64_MAX;
        else padded &= ~(align - 1);
        if (padded > p->file_size)
            return perr(p, ERR_FORMAT, "data section at byte offset %" PRIu64 " (tensor table ends at %" PRIu64
                        ", alignment %" PRIu64 ") is beyond end of file (%" PRIu64 " bytes)",
                        padded, f->header_end, align, p->file_size);
        f->data_off = padded;
    }
    uint64_t expect = 0;   /* sum of PAD(bytes_j, align) for j < i */
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor_info *t = &f->ti[i];
        set_where_tensor(p, i, &t->name);
        uint64_t end;
        if (size_add_ok(f->data_off, t->off, &t->file_off) != 0)
            return perr(p, ERR_FORMAT, "data [off %" PRIu64 " + %" PRIu64 " overflows, %" PRIu64 " bytes] beyond end"
                        " of file (%" PRIu64 " bytes); offset stored in the tensor info at byte offset %" PRIu64,
                        f->data_off, t->off, t->bytes, p->file_size, info_off[i]);
        if (size_add_ok(t->file_off, t->bytes, &end) != 0 || end > p->file_size)
            return perr(p, ERR_FORMAT, "data [off %" PRIu64 ", %" PRIu64 " bytes] beyond end of file (%" PRIu64
                        " bytes); offset stored in the tensor info at byte offset %" PRIu64,
                        t->file_off, t->bytes, p->file_size, info_off[i]);
        if (t->off % align != 0)
            return perr(p, ERR_FORMAT, "data offset %" PRIu64 " is misaligned (not a multiple of alignment %" PRIu64
                        "); tensor info at byte offset %" PRIu64, t->off, align, info_off[i]);
        if (t->off != expect)
            return perr(p, ERR_FORMAT, "data offset %" PRIu64 " breaks the padding rule: expected %" PRIu64
                        " (the padded sizes of the tensors before it); tensor info at byte offset %" PRIu64,
                        t->off, expect, info_off[i]);
        uint64_t padded;
        if (size_add_ok(t->bytes, align - 1, &padded) != 0 || size_add_ok(expect, padded & ~(align - 1), &expect) != 0)
            return perr(p, ERR_FORMAT, "data size overflows");   /* unreachable: end <= file_size */
    }
    p->where[0] = '\0';
    return 0;
}

static void file_free_tables(gguf_file *f)
{
    if (f->kv) {
        for (int64_t i = 0; i < f->n_kv; i++) { free(f->kv[i].arr); free(f->kv[i].strs); }
        free(f->kv);
    }
    free(f->ti);
    free(f->kv_index.slot);
    free(f->ti_index.slot);
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    file_free_tables(f);
    free(f->hdr);
    free(f->path);
    if (f->fd >= 0) close(f->fd);
    free(f);
}

/* Parse the window buf[0, n) of a file of file_size bytes. On success
 * *out is a gguf_file whose pointers still point into buf (rebase next).
 * *need_more is set when the window was too small. */
static int parse_window(gguf_file **out, const uint8_t *buf, uint64_t n, uint64_t file_size,
                        int *need_more, err *e)
{
    *out = NULL;
    *need_more = 0;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return err_setf(e, ERR_NOMEM, "out of memory");
    f->fd = -1;
    f->file_size = file_size;
    parser p;
    memset(&p, 0, sizeof p);
    cursor_init(&p.c, buf, n, 0, NULL);   /* messages come from perr(), with context */
    p.file_size = file_size;
    p.e = e;
    p.f = f;
    uint64_t *info_off = NULL;
    int rc = 0;

    snprintf(p.where, sizeof p.where, "header");
    if (need(&p, 4, "magic") != 0) goto fail;
    uint32_t magic;
    cursor_read(&p.c, &magic, 4, "magic");
    if (magic != GGUF_MAGIC_U32) {
        char m[8];
        safe_name(m, sizeof m, (const char *)buf, 4);
        perr(&p, ERR_FORMAT, "bad magic '%s' at byte offset 0: not a GGUF file (expected 'GGUF')", m);
        goto fail;
    }
    f->version = rd_u32(&p, "version");
    if (p.c.failed) goto fail;
    if (f->version == 0) { perr(&p, ERR_FORMAT, "version 0 at byte offset 4 is invalid"); goto fail; }
    if ((f->version & 0xffffu) == 0) {
        perr(&p, ERR_FORMAT, "version 0x%08" PRIx32 " at byte offset 4: byte order mismatch "
             "(the file is big-endian or byte-swapped; strata reads little-endian GGUF)", f->version);
        goto fail;
    }
    if (f->version == 1) {
        perr(&p, ERR_UNSUPPORTED, "version 1 at byte offset 4: GGUF v1 is not supported (v2 and v3 are)");
        goto fail;
    }
    if (f->version > 3) {
        perr(&p, ERR_UNSUPPORTED, "version %" PRIu32 " at byte offset 4 is newer than supported (v2 and v3)", f->version);
        goto fail;
    }
    int64_t n_tensors = rd_i64(&p, "n_tensors");
    int64_t n_kv = rd_i64(&p, "n_kv");
    if (p.c.failed) goto fail;
    if (n_tensors < 0) { perr(&p, ERR_FORMAT, "n_tensors %" PRId64 " at byte offset 8 is negative", n_tensors); goto fail; }
    if (n_kv < 0) { perr(&p, ERR_FORMAT, "n_kv %" PRId64 " at byte offset 16 is negative", n_kv); goto fail; }
    /* Both tables follow; bound each by the bytes left before allocating. */
    if (check_count(&p, (uint64_t)n_tensors, TENSOR_MIN_BYTES, UINT64_MAX, "n_tensors", 8) != 0) goto fail;
    if (check_count(&p, (uint64_t)n_kv, KV_MIN_BYTES, UINT64_MAX, "n_kv", 16) != 0) goto fail;
    if ((n_kv && !(f->kv = calloc((size_t)n_kv, sizeof *f->kv))) ||
        (n_tensors && !(f->ti = calloc((size_t)n_tensors, sizeof *f->ti))) ||
        (n_tensors && !(info_off = calloc((size_t)n_tensors, sizeof *info_off))) ||
        index_init(&f->kv_index, n_kv) != 0 || index_init(&f->ti_index, n_tensors) != 0) {
        perr(&p, ERR_NOMEM, "out of memory for %" PRId64 " kv pairs and %" PRId64 " tensors", n_kv, n_tensors);
        goto fail;
    }

    for (int64_t i = 0; i < n_kv; i++) {
        f->n_kv = i + 1;   /* so file_free_tables frees what kv i allocated */
        if (parse_kv(&p, i) != 0) goto fail;
        index_put(&f->kv_index, f->kv[i].key.p, f->kv[i].key.n, i);
    }
    f->n_kv = n_kv;
    if (check_alignment(&p) != 0) goto fail;
    for (int64_t i = 0; i < n_tensors; i++) {
        if (parse_tensor(&p, i, &info_off[i]) != 0) goto fail;
        index_put(&f->ti_index, f->ti[i].name.p, f->ti[i].name.n, i);
    }
    f->n_tensors = n_tensors;
    f->header_end = cursor_off(&p.c);
    if (check_layout(&p, info_off) != 0) goto fail;
    free(info_off);
    *out = f;
    return 0;

fail:
    rc = p.code ? p.code : ERR_FORMAT;
    *need_more = p.need_more;
    free(info_off);
    gguf_close(f);
    return rc;
}

/* Copy the header into owned memory and move every pointer onto the copy. */
static int rebase(gguf_file *f, const uint8_t *src, err *e)
{
    f->hdr = malloc(f->header_end ? f->header_end : 1);
    if (!f->hdr) return err_setf(e, ERR_NOMEM, "out of memory for a %" PRIu64 "-byte header", f->header_end);
    memcpy(f->hdr, src, f->header_end);
#define MOVE(s) do { if ((s).n) (s).p = (const char *)f->hdr + ((const uint8_t *)(s).p - src); else (s).p = ""; } while (0)
    for (int64_t i = 0; i < f->n_kv; i++) {
        kv_entry *kv = &f->kv[i];
        MOVE(kv->key);
        MOVE(kv->str);
        if (kv->strs) for (uint64_t j = 0; j < kv->n; j++) MOVE(kv->strs[j]);
    }
    for (int64_t i = 0; i < f->n_tensors; i++) MOVE(f->ti[i].name);
#undef MOVE
    uint64_t h = fnv1a(FNV_OFFSET, f->hdr, f->header_end);
    uint8_t sz[8];
    for (int b = 0; b < 8; b++) sz[b] = (uint8_t)(f->file_size >> (8 * b));
    f->fingerprint = fnv1a(h, sz, 8);
    return 0;
}

int gguf_parse(gguf_file **out, const void *buf, uint64_t n, uint64_t file_size, err *e)
{
    *out = NULL;
    if (n > file_size) return err_setf(e, ERR_USAGE, "gguf_parse: %" PRIu64 " bytes given for a %" PRIu64 "-byte file",
                                       n, file_size);
    if (!buf && n) return err_setf(e, ERR_USAGE, "gguf_parse: NULL buffer");
    gguf_file *f;
    int more;
    int rc = parse_window(&f, buf ? buf : "", n, file_size, &more, e);
    if (rc != 0) return rc;
    rc = rebase(f, buf ? buf : (const void *)"", e);
    if (rc != 0) { gguf_close(f); return rc; }
    *out = f;
    return 0;
}

/* ==== gguf_open ==== */

/* pread exactly n bytes at off; retries short reads and EINTR. */
static int pread_full(int fd, void *dst, uint64_t n, uint64_t off, uint64_t *got)
{
    uint8_t *d = (uint8_t *)dst;
    uint64_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : (size_t)(n - done);
        ssize_t r = pread(fd, d + done, chunk, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return -errno;
        }
        if (r == 0) break;
        done += (uint64_t)r;
    }
    *got = done;
    return 0;
}

int gguf_open(gguf_file **out, const char *path, err *e)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int en = errno;
        return err_setf(e, en == ENOENT ? ERR_NOTFOUND : ERR_IO, "cannot open '%s': %s", path, strerror(en));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int en = errno;
        close(fd);
        return err_setf(e, ERR_IO, "cannot stat '%s': %s", path, strerror(en));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_setf(e, ERR_IO, "'%s' is not a regular file", path);
    }
    uint64_t file_size = (uint64_t)st.st_size;
    uint64_t win = file_size < GGUF_FIRST_WINDOW ? file_size : GGUF_FIRST_WINDOW;
    uint8_t *buf = NULL;
    uint64_t have = 0;   /* bytes of the file already in buf */
    gguf_file *f = NULL;
    int rc;
    for (;;) {
        uint8_t *nb = realloc(buf, win ? win : 1);
        if (!nb) { rc = err_setf(e, ERR_NOMEM, "'%s': out of memory for a %" PRIu64 "-byte header window", path, win); break; }
        buf = nb;
        uint64_t got;
        int r = pread_full(fd, buf + have, win - have, have, &got);
        if (r != 0 || got != win - have) {
            rc = r != 0 ? err_setf(e, ERR_IO, "'%s': read failed at byte offset %" PRIu64 ": %s", path, have + got, strerror(-r))
                        : err_setf(e, ERR_IO, "'%s': file shrank while reading (short read at byte offset %" PRIu64 ")",
                                   path, have + got);
            break;
        }
        have = win;
        err pe;
        err_clear(&pe);
        int more;
        rc = parse_window(&f, buf, win, file_size, &more, &pe);
        if (rc == 0) break;
        if (more && win < file_size && win < GGUF_MAX_HEADER_BYTES) {
            win = win > file_size / 2 ? file_size : win * 2;
            if (win > GGUF_MAX_HEADER_BYTES) win = GGUF_MAX_HEADER_BYTES;
            continue;
        }
        if (more)
            rc = err_setf(e, ERR_UNSUPPORTED, "'%s': header larger than the %llu MiB limit (%s)", path,
                          GGUF_MAX_HEADER_BYTES >> 20, pe.msg);
        else
            rc = err_setf(e, pe.code, "'%s': %s", path, pe.msg);
        break;
    }
    if (rc == 0) {
        rc = rebase(f, buf, e);
        if (rc == 0) {
            f->path = strdup(path);
            if (!f->path) rc = err_setf(e, ERR_NOMEM, "out of memory");
        }
        if (rc == 0) {
            f->fd = fd;
            fd = -1;
            *out = f;
            f = NULL;
        }
    }
    gguf_close(f);
    free(buf);
    if (fd >= 0) close(fd);
    return rc;
}

/* ==== File-level facts ==== */

uint32_t    gguf_version(const gguf_file *f)      { return f->version; }
uint64_t    gguf_file_size(const gguf_file *f)    { return f->file_size; }
uint64_t    gguf_data_off(const gguf_file *f)     { return f->data_off; }
uint32_t    gguf_alignment(const gguf_file *f)    { return f->alignment; }
uint64_t    gguf_header_bytes(const gguf_file *f) { return f->header_end; }
const char *gguf_path(const gguf_file *f)         { return f->path; }
int         gguf_fd(const gguf_file *f)           { return f->fd; }
uint64_t    gguf_fingerprint(const gguf_file *f)  { return f->fingerprint; }

/* ==== Metadata ==== */

static const kv_entry *kv_at(const gguf_file *f, int64_t i)
{
    return (i >= 0 && i < f->n_kv) ? &f->kv[i] : NULL;
}

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

int64_t gguf_find_key(const gguf_file *f, const char *key)
{
    return index_find(&f->kv_index, f->kv, kv_name_of, key, strlen(key));
}

gguf_str gguf_kv_key(const gguf_file *f, int64_t i)
{
    const kv_entry *kv = kv_at(f, i);
    gguf_str s = { "", 0 };
    return kv ? kv->key : s;
}

int gguf_kv_type(const gguf_file *f, int64_t i)      { const kv_entry *kv = kv_at(f, i); return kv ? kv->type : -1; }
int gguf_kv_arr_type(const gguf_file *f, int64_t i)  { const kv_entry *kv = kv_at(f, i); return kv ? kv->arr_type : -1; }
uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i) { const kv_entry *kv = kv_at(f, i); return kv ? kv->n : 0; }

const void *gguf_kv_data(const gguf_file *f, int64_t i)
{
    const kv_entry *kv = kv_at(f, i);
    if (!kv || kv->arr_type == GGUF_TYPE_STRING) return NULL;
    if (kv->type != GGUF_TYPE_ARRAY) return kv->scalar.b;
    return kv->arr ? kv->arr : (const void *)kv->scalar.b;   /* empty array: a valid pointer to nothing */
}

gguf_str gguf_kv_arr_str(const gguf_file *f, int64_t i, uint64_t j)
{
    const kv_entry *kv = kv_at(f, i);
    gguf_str s = { "", 0 };
    if (!kv || kv->arr_type != GGUF_TYPE_STRING || j >= kv->n) return s;
    return kv->type == GGUF_TYPE_ARRAY ? kv->strs[j] : kv->str;
}

/* Describe a kv's type for messages: "string", "array of u32". */
static const char *kv_type_desc(const kv_entry *kv, char *buf, size_t cap)
{
    if (kv->type == GGUF_TYPE_ARRAY) snprintf(buf, cap, "array of %s", gguf_type_name(kv->arr_type));
    else snprintf(buf, cap, "%s", gguf_type_name(kv->type));
    return buf;
}

static int type_error(const gguf_file *f, int64_t i, const char *want, err *e)
{
    const kv_entry *kv = &f->kv[i];
    char nm[80], ty[40];
    return err_setf(e, ERR_FORMAT, "kv #%" PRId64 " '%s': expected %s, got %s at byte offset %" PRIu64, i,
                    safe_name(nm, sizeof nm, kv->key.p, kv->key.n), want, kv_type_desc(kv, ty, sizeof ty), kv->val_off);
}

static int64_t find_or_err(const gguf_file *f, const char *key, err *e)
{
    int64_t i = gguf_find_key(f, key);
    if (i < 0) err_setf(e, ERR_NOTFOUND, "key '%s' not found", key);
    return i;
}

/* Integer element j of kv i (scalar when j == 0). */
static int int_at(const gguf_file *f, int64_t i, uint64_t j, int64_t *s, uint64_t *u, int *neg, err *e)
{
    const kv_entry *kv = &f->kv[i];
    if (!type_is_int(kv->arr_type)) return type_error(f, i, kv->type == GGUF_TYPE_ARRAY ? "an integer array" : "an integer", e);
    if (j >= kv->n) {
        char nm[80];
        return err_setf(e, ERR_RANGE, "kv #%" PRId64 " '%s': index %" PRIu64 " out of range (%" PRIu64 " elements)",
                        i, safe_name(nm, sizeof nm, kv->key.p, kv->key.n), j, kv->n);
    }
    const uint8_t *p = kv->type == GGUF_TYPE_ARRAY ? (const uint8_t *)kv->arr + j * type_size(kv->arr_type) : kv->scalar.b;
    load_int(kv->arr_type, p, s, u, neg);
    return 0;
}

static int range_error(const gguf_file *f, int64_t i, const char *want, const char *val, err *e)
{
    const kv_entry *kv = &f->kv[i];
    char nm[80];
    return err_setf(e, ERR_FORMAT, "kv #%" PRId64 " '%s': value %s does not fit %s (byte offset %" PRIu64 ")", i,
                    safe_name(nm, sizeof nm, kv->key.p, kv->key.n), val, want, kv->val_off);
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, err *e)
{
    int64_t i = find_or_err(f, key, e);
    if (i < 0) return ERR_NOTFOUND;
    if (f->kv[i].type == GGUF_TYPE_ARRAY) return type_error(f, i, "an integer", e);
    int64_t s; uint64_t u; int neg;
    int rc = int_at(f, i, 0, &s, &u, &neg, e);
    if (rc != 0) return rc;
    if (!neg && u > (uint64_t)INT64_MAX) {
        char v[32];
        snprintf(v, sizeof v, "%" PRIu64, u);
        return range_error(f, i, "i64", v, e);
    }
    *out = s;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, err *e)
{
    int64_t i = find_or_err(f, key, e);
    if (i < 0) return ERR_NOTFOUND;
    if (f->kv[i].type == GGUF_TYPE_ARRAY) return type_error(f, i, "an integer", e);
    int64_t s; uint64_t u; int neg;
    int rc = int_at(f, i, 0, &s, &u, &neg, e);
    if (rc != 0) return rc;
    if (neg || u > UINT32_MAX) {
        char v[32];
        if (neg) snprintf(v, sizeof v, "%" PRId64, s); else snprintf(v, sizeof v, "%" PRIu64, u);
        return range_error(f, i, "u32", v, e);
    }
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, err *e)
{
    int64_t i = find_or_err(f, key, e);
    if (i < 0) return ERR_NOTFOUND;
    const kv_entry *kv = &f->kv[i];
    if (kv->type == GGUF_TYPE_FLOAT32) { memcpy(out, kv->scalar.b, 4); return 0; }
    if (kv->type == GGUF_TYPE_FLOAT64) { double d; memcpy(&d, kv->scalar.b, 8); *out = (float)d; return 0; }
    if (!type_is_int(kv->type)) return type_error(f, i, "a number", e);
    int64_t s; uint64_t u; int neg;
    load_int(kv->type, kv->scalar.b, &s, &u, &neg);
    *out = neg ? (float)s : (float)u;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, err *e)
{
    int64_t i = find_or_err(f, key, e);
    if (i < 0) return ERR_NOTFOUND;
    if (f->kv[i].type != GGUF_TYPE_BOOL) return type_error(f, i, "bool", e);
    *out = f->kv[i].scalar.b[0] != 0;   /* llama.cpp reads any nonzero byte as true */
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, err *e)
{
    int64_t i = find_or_err(f, key, e);
    if (i < 0) return ERR_NOTFOUND;
    if (f->kv[i].type != GGUF_TYPE_STRING) return type_error(f, i, "string", e);
    *out = f->kv[i].str;
    return 0;
}

int gguf_get_arr_i64(const gguf_file *f, int64_t i, uint64_t j, int64_t *out, err *e)
{
    if (!kv_at(f, i)) return err_setf(e, ERR_RANGE, "kv index %" PRId64 " out of range (%" PRId64 " keys)", i, f->n_kv);
    int64_t s; uint64_t u; int neg;
    int rc = int_at(f, i, j, &s, &u, &neg, e);
    if (rc != 0) return rc;
    if (!neg && u > (uint64_t)INT64_MAX) {
        char v[32];
        snprintf(v, sizeof v, "%" PRIu64, u);
        return range_error(f, i, "i64", v, e);
    }
    *out = s;
    return 0;
}

/* ==== Tensors ==== */

int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

int64_t gguf_find_tensor(const gguf_file *f, const char *name)
{
    return index_find(&f->ti_index, f->ti, ti_name_of, name, strlen(name));
}

const gguf_tensor_info *gguf_tensor(const gguf_file *f, int64_t i)
{
    return (i >= 0 && i < f->n_tensors) ? &f->ti[i] : NULL;
}

int gguf_read_tensor(const gguf_file *f, int64_t i, uint64_t off, void *dst, uint64_t n, err *e)
{
    const gguf_tensor_info *t = gguf_tensor(f, i);
    if (!t) return err_setf(e, ERR_RANGE, "tensor index %" PRId64 " out of range (%" PRId64 " tensors)", i, f->n_tensors);
    char nm[80];
    safe_name(nm, sizeof nm, t->name.p, t->name.n);
    if (off > t->bytes || n > t->bytes - off)
        return err_setf(e, ERR_RANGE, "tensor '%s': read [%" PRIu64 ", +%" PRIu64 ") outside its %" PRIu64 " bytes",
                        nm, off, n, t->bytes);
    if (f->fd < 0) return err_setf(e, ERR_UNSUPPORTED, "tensor '%s': header was parsed from memory, no file to read", nm);
    uint64_t got;
    int r = pread_full(f->fd, dst, n, t->file_off + off, &got);
    if (r != 0)
        return err_setf(e, ERR_IO, "tensor '%s': read of %" PRIu64 " bytes at byte offset %" PRIu64 " failed: %s",
                        nm, n, t->file_off + off, strerror(-r));
    if (got != n)
        return err_setf(e, ERR_IO, "tensor '%s': short read at byte offset %" PRIu64 " (%" PRIu64 " of %" PRIu64
                        " bytes; file truncated?)", nm, t->file_off + off + got, got, n);
    return 0;
}

/* ==== Printing ==== */

#define PRINT_STR_MAX 160   /* longer strings are cut, with their length */

static void print_str(FILE *out, gguf_str s)
{
    fputc('"', out);
    uint64_t lim = s.n > PRINT_STR_MAX ? PRINT_STR_MAX - 40 : s.n;
    for (uint64_t i = 0; i < lim; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        switch (ch) {
        case '"':  fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (ch < 0x20 || ch == 0x7f) fprintf(out, "\\x%02x", ch);
            else fputc(ch, out);   /* UTF-8 bytes pass through */
        }
    }
    fputc('"', out);
    if (lim < s.n) fprintf(out, "... (%" PRIu64 " bytes)", s.n);
}

/* Shortest %g that reads back as the same value. */
static void print_float(FILE *out, double v, int is_f32)
{
    if (isnan(v)) { fputs("nan", out); return; }
    if (isinf(v)) { fputs(v < 0 ? "-inf" : "inf", out); return; }
    char buf[64];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    fputs(buf, out);
}

static void print_elem(FILE *out, int t, const uint8_t *p)
{
    switch (t) {
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); print_float(out, v, 1); break; }
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); print_float(out, v, 0); break; }
    case GGUF_TYPE_BOOL: fputs(p[0] ? "true" : "false", out); break;
    default: {
        int64_t s; uint64_t u; int neg;
        load_int(t, p, &s, &u, &neg);
        if (neg) fprintf(out, "%" PRId64, s); else fprintf(out, "%" PRIu64, u);
    }
    }
}

void gguf_print_kv(FILE *out, const gguf_file *f, int64_t i, int max_arr)
{
    const kv_entry *kv = kv_at(f, i);
    if (!kv) return;
    if (kv->type == GGUF_TYPE_STRING) { print_str(out, kv->str); return; }
    if (kv->type != GGUF_TYPE_ARRAY) { print_elem(out, kv->type, kv->scalar.b); return; }
    uint64_t show = max_arr < 0 ? 0 : (uint64_t)max_arr;
    if (show > kv->n) show = kv->n;
    fputc('[', out);
    for (uint64_t j = 0; j < show; j++) {
        if (j) fputs(", ", out);
        if (kv->arr_type == GGUF_TYPE_STRING) print_str(out, kv->strs[j]);
        else print_elem(out, kv->arr_type, (const uint8_t *)kv->arr + j * type_size(kv->arr_type));
    }
    if (show < kv->n) fprintf(out, "%s... (%" PRIu64 " total)", show ? ", " : "", kv->n);
    fputc(']', out);
}

/* gguf: bounds-checked reader for GGUF v2 and v3 files, as llama.cpp writes them.
 *
 * Layout (little-endian): "GGUF" | u32 version | i64 n_tensors | i64 n_kv |
 * n_kv x (string key, i32 type, value) | n_tensors x (string name, u32 n_dims,
 * i64 ne[n_dims], i32 ggml_type, u64 offset) | zero padding to alignment | data.
 * (v2 uses the same 64-bit counts; v1 with 32-bit counts is rejected.)
 *
 * What this module owns: the parsed header (metadata and tensor table) held
 * in memory. It does NOT map or read tensor data wholesale: callers read the
 * byte ranges they need (gguf_tensor(f, i)->file_off and ->bytes) through
 * their own I/O path (mmap for resident weights, the expert store for routed
 * experts), or with gguf_read_tensor().
 *
 * Invariants after a successful open/parse: every key and tensor name is
 * unique; keys are non-empty; tensor names are shorter than 64 bytes
 * (llama.cpp's GGML_MAX_NAME); every tensor has 1..4 dims, each ne >= 0 (0 as
 * llama.cpp allows: a tensor with no elements), the element count fits int64,
 * ne[0] is a multiple of the type's block size, its byte size fits, and its
 * data range [file_off, file_off + bytes) lies inside the file; offsets
 * follow llama.cpp's rule offset[i] == sum_{j<i} PAD(bytes_j, align).
 * Errors are one line naming the field and the byte offset.
 *
 * Thread-safety: a gguf_file is immutable after open; any number of threads
 * may read it concurrently. */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

enum gguf_type {
    GGUF_TYPE_UINT8   = 0,
    GGUF_TYPE_INT8    = 1,
    GGUF_TYPE_UINT16  = 2,
    GGUF_TYPE_INT16   = 3,
    GGUF_TYPE_UINT32  = 4,
    GGUF_TYPE_INT32   = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL    = 7,
    GGUF_TYPE_STRING  = 8,
    GGUF_TYPE_ARRAY   = 9,
    GGUF_TYPE_UINT64  = 10,
    GGUF_TYPE_INT64   = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* A string inside the header buffer: NOT NUL-terminated. Borrowed; valid until gguf_close(). */
typedef struct gguf_str {
    const char *p;
    uint64_t    n;
} gguf_str;

typedef struct gguf_file gguf_file;

typedef struct gguf_tensor_info {
    gguf_str name;                 /* borrowed */
    int      n_dims;               /* 1..4 */
    int64_t  ne[GGUF_MAX_DIMS];    /* ne[0] innermost; unused dims are 1 */
    int      type;                 /* ggml type id (see quant/qtype.h) */
    uint64_t off;                  /* offset relative to the data section */
    uint64_t file_off;             /* absolute file offset = data_off + off */
    uint64_t bytes;                /* exact size of the data (no padding) */
    uint64_t nb[GGUF_MAX_DIMS];    /* strides in bytes: nb[0]=type_size, nb[1]=row bytes, ... */
} gguf_tensor_info;

/* ==== Open / close ==== */

/* Open and parse `path`. Reads only the header (with pread, into a window
 * that starts at 1 MiB and doubles while the header needs more; headers over
 * 256 MiB are refused), never the tensor data. Keeps the fd open for
 * gguf_read_tensor(). Error messages start with "'<path>': ". *out owned by
 * the caller; free with gguf_close(). */
int gguf_open(gguf_file **out, const char *path, err *e);

/* Parse a header from memory: `buf` holds the first `n` bytes of a file of
 * `file_size` bytes (n <= file_size). The buffer is copied. Used by the
 * fuzzer and tests. Returns ERR_FORMAT for a header that does not fit in n. */
int gguf_parse(gguf_file **out, const void *buf, uint64_t n, uint64_t file_size, err *e);

void gguf_close(gguf_file *f);   /* NULL is a no-op */

/* ==== File-level facts ==== */
uint32_t    gguf_version(const gguf_file *f);
uint64_t    gguf_file_size(const gguf_file *f);
uint64_t    gguf_data_off(const gguf_file *f);     /* absolute offset of the data section */
uint32_t    gguf_alignment(const gguf_file *f);
/* Bytes from the start of the file to the end of the tensor table (magic,
 * counts, KV pairs and tensor infos; the padding before the data is not
 * counted). */
uint64_t    gguf_header_bytes(const gguf_file *f);
const char *gguf_path(const gguf_file *f);         /* NULL when parsed from memory */
/* An open read-only fd for the file (borrowed; -1 when parsed from memory). */
int         gguf_fd(const gguf_file *f);

/* ==== Metadata ==== */
int64_t  gguf_n_kv(const gguf_file *f);
int64_t  gguf_find_key(const gguf_file *f, const char *key);   /* index or -1 */
gguf_str gguf_kv_key(const gguf_file *f, int64_t i);
int      gguf_kv_type(const gguf_file *f, int64_t i);           /* GGUF_TYPE_* */
/* For arrays: element type and count. For scalars: type and 1. */
int      gguf_kv_arr_type(const gguf_file *f, int64_t i);
uint64_t gguf_kv_arr_n(const gguf_file *f, int64_t i);
/* Borrowed pointer to the packed little-endian elements of a numeric array
 * (or the scalar value); valid until gguf_close(). The copy is 8-byte
 * aligned, so it may be cast to the element type. Bools are one byte each
 * (nonzero = true). NULL for strings / string arrays and bad indices. */
const void *gguf_kv_data(const gguf_file *f, int64_t i);
/* Element j of a string array (or the string itself when j == 0 and the kv
 * is a string); an empty string for other types and out-of-range j. */
gguf_str gguf_kv_arr_str(const gguf_file *f, int64_t i, uint64_t j);

/* Typed getters by key. Return 0 on success, ERR_NOTFOUND when the key is
 * absent, ERR_FORMAT when it has an incompatible type (message names the key,
 * its type and the wanted type). Integer getters accept any integer type
 * whose value fits; float getters accept f32/f64 (and integers). */
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, err *e);
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, err *e);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, err *e);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, err *e);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, err *e);
/* Integer value j of an integer array, or of a scalar integer (j == 0). */
int gguf_get_arr_i64(const gguf_file *f, int64_t kv, uint64_t j, int64_t *out, err *e);

/* Compare a gguf_str with a C string. */
int gguf_str_eq(gguf_str s, const char *c);

const char *gguf_type_name(int gguf_type);   /* "u32", "string", ... */

/* ==== Tensors ==== */
int64_t gguf_n_tensors(const gguf_file *f);
int64_t gguf_find_tensor(const gguf_file *f, const char *name);  /* index or -1 */
const gguf_tensor_info *gguf_tensor(const gguf_file *f, int64_t i);  /* borrowed */

/* Read `n` bytes at `off` within tensor i into dst (bounds-checked against the
 * tensor; pread, retries short reads). */
int gguf_read_tensor(const gguf_file *f, int64_t i, uint64_t off, void *dst, uint64_t n, err *e);

/* A 64-bit fingerprint of the file: FNV-1a 64 over the header bytes
 * [0, gguf_header_bytes()), continued over the file size as 8 little-endian
 * bytes. Stable across runs and machines; changes when the metadata, the
 * tensor table or the file size changes (not when only tensor data does). */
uint64_t gguf_fingerprint(const gguf_file *f);

/* ==== Printing ==== */
/* Print one value human-readably on one line: numbers, true/false, strings
 * quoted with C escapes (strings over 160 bytes are cut: "...\"... (N bytes)").
 * Arrays of more than `max_arr` elements show the first max_arr and then
 * "... (N total)": "[a, b, c, ... (N total)]". */
void gguf_print_kv(FILE *out, const gguf_file *f, int64_t i, int max_arr);

#endif

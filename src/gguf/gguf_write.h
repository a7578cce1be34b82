/* gguf_write: write GGUF v3 files the way llama.cpp writes them (gguf.cpp
 * gguf_write_to_file): header, KV pairs in insertion order, tensor infos in
 * insertion order with offsets sum(PAD(bytes, align)), zero padding, data,
 * each tensor zero-padded to the alignment.
 *
 * Streaming: tensor data is appended after the header is written, in tensor
 * order, in pieces of any size, so files of tens of GB are written without
 * holding them in memory. The file is written to "<path>.tmp" and renamed on
 * gguf_writer_finish(); on failure or gguf_writer_free() without finish the
 * temporary is removed.
 *
 * Typical use:
 *   gguf_writer *w = gguf_writer_new();
 *   gguf_writer_set_str(w, "general.architecture", "qwen3moe");
 *   gguf_writer_add_tensor(w, "token_embd.weight", QTYPE_F32, 2, ne);
 *   gguf_writer_begin(w, path, &e);           // writes header + padding
 *   gguf_writer_write(w, data, nbytes, &e);   // tensor 0, then tensor 1, ...
 *   gguf_writer_finish(w, &e);                // checks every byte was written, renames
 *   gguf_writer_free(w);
 */
#ifndef STRATA_GGUF_WRITE_H
#define STRATA_GGUF_WRITE_H

#include <stdint.h>
#include "util/err.h"
#include "gguf/gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);          /* NULL on OOM */
void gguf_writer_free(gguf_writer *w);       /* NULL no-op; removes an unfinished temp file */

/* Metadata setters: a key set twice replaces its value in place (keeps its
 * position). Strings are copied. Return 0, ERR_NOMEM, or ERR_USAGE for an
 * empty key or a call after gguf_writer_begin(). general.alignment must be
 * set as a u32 power of two (checked by begin). */
int gguf_writer_set_u8 (gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8 (gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t n);
/* Numeric array: elem_type is a scalar GGUF_TYPE_*, data holds n packed elements. */
int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n);
/* String array: n strings, lens[i] bytes each (lens may be NULL for NUL-terminated). */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n);
/* Copy KV pair i of an open file (any type, arrays included). ERR_USAGE for
 * a bad index or a key with an embedded NUL. */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i);
/* Remove a key if present. */
void gguf_writer_remove_key(gguf_writer *w, const char *key);

/* Declare a tensor (order = file order). ne[0] must be a multiple of the
 * type's block size; the name must be shorter than 64 bytes (llama.cpp's
 * limit). Returns 0, ERR_FORMAT (bad shape, type, name, duplicate name) or
 * ERR_NOMEM. Like llama.cpp, the file stores ggml_n_dims() dimensions:
 * trailing dimensions of size 1 are dropped ([64, 8, 1] is stored as 2-D). */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims,
                           const int64_t *ne, err *e);

/* Exact data bytes of tensor i (no padding). */
uint64_t gguf_writer_tensor_bytes(const gguf_writer *w, int64_t i);
int64_t  gguf_writer_n_tensors(const gguf_writer *w);

/* Create "<path>.tmp", write the header, tensor table and padding. After this
 * no metadata or tensor may be added. */
int gguf_writer_begin(gguf_writer *w, const char *path, err *e);
/* Append n data bytes (data == NULL appends n zero bytes); crosses tensor
 * boundaries automatically, inserting each tensor's zero padding. Writing
 * more bytes than declared is ERR_USAGE. Any error leaves the writer failed
 * (the temporary file is removed; later calls return errors). */
int gguf_writer_write(gguf_writer *w, const void *data, uint64_t n, err *e);
/* Check all declared bytes were written, fsync-free close, rename to path. */
int gguf_writer_finish(gguf_writer *w, err *e);

#endif

/* sidecar: the expert sidecar file that `strata repack` writes next to a
 * GGUF, one 4096-aligned blob per layer-expert (gate|up|down together), so
 * that the expert store reads each expert with ONE aligned read (O_DIRECT)
 * instead of three unaligned ones from the GGUF.
 *
 * What it owns: the file format (below), writing it (sidecar_write) and
 * parsing + validating it against its GGUF (sidecar_load). It does not do
 * the store's I/O; xlayout.h turns a loaded index into reads.
 *
 * Default name: "<gguf path>.experts" (model.gguf -> model.gguf.experts),
 * found automatically by xlayout_open.
 *
 * ==== File format, version 1 (all integers little-endian) ====
 *
 *   offset        bytes  field
 *   0             8      magic "STRATAXP"
 *   8             4      u32 version = 1
 *   12            4      u32 align = 4096: blob offsets / lengths granule
 *   16            8      u64 gguf_size: byte size of the GGUF it was made from
 *   24            8      u64 gguf_fp: gguf_fingerprint() of that GGUF
 *   32            4      u32 n_layer
 *   36            4      u32 n_expert
 *   40            8      u64 index_off = 128 (layer table, then entry index)
 *   48            8      u64 index_bytes = n_layer*48 + n_layer*n_expert*40
 *   56            8      u64 data_off: first blob; multiple of align,
 *                         >= index_off + index_bytes
 *   64            8      u64 file_bytes: the sidecar's size; multiple of align
 *   72            8      u64 meta_hash: FNV-1a 64 of bytes
 *                         [0, index_off + index_bytes) with this field as 0
 *   80            8      u64 sample_hash: FNV-1a 64 of GGUF expert data
 *                         samples: for each layer, for gate, up, down: the
 *                         first and the last min(4096, bytes) bytes of the
 *                         tensor (see "Staleness" below)
 *   88            40     reserved, zero
 *   128                  layer table, n_layer x 48 bytes, for layer L:
 *                          3 x { u32 ggml type, u32 zero, u64 part_bytes }
 *                          (gate, up, down: the GGUF slab sizes nb[2])
 *   128 + 48*n_layer     entry index, n_layer*n_expert x 40 bytes, layer-major
 *                        (entry L*n_expert + e):
 *                          u64 blob_off     absolute, multiple of align
 *                          u64 blob_bytes   useful bytes of the blob (below)
 *                          u64 part_off[3]  gate, up, down within the blob
 *   data_off             blobs, in entry order, back to back, each padded with
 *                        zeros to a multiple of align:
 *
 *     blob_off                                              next blob_off
 *     |gate (part_bytes[0])|pad|up (part_bytes[1])|pad|down|pad..4096|
 *     ^ part_off[0] = 0        ^ part_off[1]          ^ part_off[2]
 *
 *     part_off[0] = 0, part_off[w] = round_up(part_off[w-1] +
 *     part_bytes[w-1], 64); blob_bytes = part_off[2] + part_bytes[2]. The
 *     64-byte padding keeps each part cache-line aligned in a slot. Each
 *     part's bytes are exactly the GGUF slab (tensor file_off + e*nb[2]).
 *
 * Staleness: gguf_fingerprint() covers the GGUF's header, tensor table and
 * size, not its data; sample_hash adds 6 x n_layer small reads at load
 * (a few ms) so that a GGUF rewritten in place with the same header but
 * other weights is caught too. A change elsewhere in the expert data goes
 * unnoticed: hashing it all would mean reading the whole model at start.
 *
 * Every field is checked on load: magic ("not a strata expert sidecar"),
 * version, align == 4096, the GGUF's size, fingerprint and data sample
 * ("stale"),
 * n_layer/n_expert against the model, index_off/index_bytes exact, the
 * meta_hash, part types and sizes against the GGUF's tensors, blob_bytes
 * and part_off[] against the canonical layout, every blob_off aligned, in order, not
 * overlapping the previous blob, and blob_off + round_up(blob_bytes) <=
 * file_bytes == the sidecar's actual size. Blob contents are not hashed
 * (that would mean reading the whole file at open); the GGUF fingerprint
 * and the size check catch the usual accidents (a rebuilt model, a copy cut
 * short). Every refusal is one line ending in
 *   "; run 'strata repack MODEL' to rebuild it".
 *
 * Thread-safety: functions are reentrant; a sidecar_index is immutable
 * after load. */
#ifndef STRATA_SIDECAR_H
#define STRATA_SIDECAR_H

#include <stdint.h>
#include <stdio.h>

#include "gguf/gguf.h"
#include "util/err.h"

#define SIDECAR_MAGIC       "STRATAXP"
#define SIDECAR_VERSION     1u
#define SIDECAR_ALIGN       4096u
#define SIDECAR_PART_ALIGN  64u
#define SIDECAR_HEADER_BYTES 128u
#define SIDECAR_LAYER_BYTES  48u
#define SIDECAR_ENTRY_BYTES  40u
#define SIDECAR_SUFFIX      ".experts"

/* Where one layer's expert tensors are in the GGUF. Expert e of part w is
 * the slab [file_off[w] + e*slab_bytes[w], + slab_bytes[w]). */
typedef struct sidecar_src_layer {
    int64_t  tensor[3];      /* gguf tensor index: gate, up, down */
    int      type[3];        /* ggml type id */
    uint64_t file_off[3];    /* absolute offset of expert 0's slab */
    uint64_t slab_bytes[3];  /* nb[2]: one expert's slab */
} sidecar_src_layer;

/* Find blk.L.ffn_{gate,up,down}_exps.weight for L < n_layer in f and check
 * them: 3-D, ne[2] == n_expert, nb[2] > 0, bytes == n_expert*nb[2].
 * layers: caller's array of n_layer. ERR_NOTFOUND naming a missing tensor,
 * ERR_FORMAT naming a bad one. */
int sidecar_src_layers(const gguf_file *f, int n_layer, int n_expert, sidecar_src_layer *layers, err *e);

/* The canonical blob layout for part sizes p[3]: part offsets and useful
 * blob bytes (see the diagram). Returns -1 on overflow, else 0. */
int sidecar_blob_layout(const uint64_t p[3], uint64_t part_off[3], uint64_t *blob_bytes);

/* ==== Reading ==== */

typedef struct sidecar_layer {
    int      type[3];
    uint64_t part_bytes[3];
    uint64_t part_off[3];    /* within the blob (canonical layout) */
    uint64_t blob_bytes;     /* useful bytes */
    uint64_t read_bytes;     /* blob_bytes rounded up to SIDECAR_ALIGN */
} sidecar_layer;

typedef struct sidecar_index {
    uint32_t       version;
    uint64_t       gguf_size, gguf_fp;
    int            n_layer, n_expert;
    uint64_t       data_off, file_bytes;
    sidecar_layer *layers;   /* owned: n_layer */
    uint64_t      *blob_off; /* owned: n_layer*n_expert, entry L*n_expert + e */
} sidecar_index;

/* Parse a sidecar's header and index from memory: buf holds the file's first
 * n bytes (at least index_off + index_bytes for success), file_size is the
 * whole file's size. Checks the format itself (magic, version, align,
 * offsets, hash, alignment, order, bounds, canonical blob sizes) but not the
 * GGUF. Fills *ix (free with sidecar_index_free). ERR_FORMAT, ERR_NOMEM.
 * Messages do not carry the rebuild hint; sidecar_load adds it. */
int sidecar_parse(sidecar_index *ix, const void *buf, uint64_t n, uint64_t file_size, err *e);

/* Read and validate the sidecar open on fd (path for messages) against its
 * GGUF f (model_path names it in the hint): everything sidecar_parse
 * checks, plus gguf size/fingerprint, n_layer/n_expert, every layer's part
 * types and sizes against src[n_layer] (from sidecar_src_layers), and the
 * data sample. Reads with pread: the 128-byte header, then the table and
 * index in one read; the sample is 6 x n_layer reads of at most 4 KiB from
 * the GGUF (gguf_read_tensor).
 * ERR_FORMAT (stale/foreign/corrupt, message ends with the rebuild hint),
 * ERR_IO, ERR_NOMEM. */
int sidecar_load(sidecar_index *ix, int fd, const char *path, const gguf_file *f, const char *model_path,
                 int n_layer, int n_expert, const sidecar_src_layer *src, err *e);
void sidecar_index_free(sidecar_index *ix);   /* frees the arrays; NULL ok */

/* ==== Writing ==== */

typedef struct sidecar_write_opts {
    const char *model_path;  /* the GGUF (required) */
    const char *out_path;    /* NULL: "<model_path>.experts" */
    FILE       *progress;    /* progress bar here when it is a TTY; NULL: none */
    uint64_t    chunk_bytes; /* read buffer per part; 0: 32 MiB */
} sidecar_write_opts;

typedef struct sidecar_write_stats {
    int      n_layer, n_expert;
    uint64_t n_blobs;
    uint64_t bytes_read;     /* expert bytes read from the GGUF */
    uint64_t file_bytes;     /* size of the sidecar written */
    double   seconds;
    char     out_path[4096];
} sidecar_write_stats;

/* Write the sidecar for a qwen3moe GGUF: to "<out>.tmp" first, fdatasync,
 * then rename over <out> (a reader never sees a half-written sidecar; a
 * failure removes the temporary file). Reads the expert tensors with large
 * sequential preads (chunk_bytes per part), never maps the file, and tells
 * the kernel it will not need the read ranges again (posix_fadvise
 * DONTNEED), so repacking a model larger than RAM does not flush the page
 * cache's other users. st may be NULL. ERR_IO, ERR_FORMAT, ERR_NOMEM,
 * ERR_UNSUPPORTED (not a MoE model). */
int sidecar_write(const sidecar_write_opts *o, sidecar_write_stats *st, err *e);

#endif

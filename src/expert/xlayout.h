/* xlayout: where each routed expert lies on disk and how to read it into an
 * arena slot. The expert store (xstore/xio) asks this module "which reads
 * fill a slot with expert (layer, e), and where does each part start in the
 * slot?" and never looks at GGUF tensors or sidecar indices itself.
 *
 * Two sources, chosen at open:
 *   - a sidecar (see sidecar.h; `strata repack MODEL` writes MODEL.experts):
 *     ONE read per layer-expert of the whole gate|up|down blob, 4096-aligned
 *     in offset and length, so it suits O_DIRECT;
 *   - the GGUF itself (no sidecar): THREE reads per layer-expert, one per
 *     part. Expert e of ffn_{gate,up,down}_exps is the contiguous slab at
 *     tensor file_off + e*nb[2], nb[2] bytes (reference/FORMATS.md sec. 3).
 *     In direct mode each read covers the 4096-aligned range around the
 *     slab, and the part lies inside it at a non-zero offset.
 *
 * Discovery (xlayout_opts.sidecar_path == NULL and !no_sidecar): the file
 * "<gguf path>.experts" next to the GGUF is used if it exists. A sidecar that
 * exists but is stale (its GGUF fingerprint or size differs), foreign or
 * corrupt (magic, version, checksum, truncated index, offsets beyond the
 * file, part sizes/types that disagree with the GGUF's tensors) makes open
 * fail with ERR_FORMAT and a one-line message ending in
 *   "run 'strata repack MODEL' to rebuild it"
 * (MODEL being the GGUF path); it is never silently ignored. An explicit
 * sidecar_path that does not exist is ERR_NOTFOUND.
 *
 * The slot contract (what a store must provide, per layer L):
 *   - a buffer of at least xlayout_slot_bytes(x, L) bytes; in direct mode
 *     (xlayout_direct(x) == 1) its address must be XLAYOUT_ALIGN-aligned;
 *   - issue every read r of xlayout_reads(): pread(xlayout_fd(x),
 *     slot + r.slot_off, r.bytes, r.file_off). Retry short reads for the
 *     rest. A read that hits end-of-file (returns 0) after at least r.need
 *     bytes arrived is complete; before r.need it is an I/O error. (Only a
 *     direct GGUF read of the file's last slab can end early: its aligned
 *     length runs past EOF. r.need == r.bytes in every other case.)
 *   - after the reads, part `which` (EXPERT_GATE/UP/DOWN, model/expert_src.h)
 *     starts at slot + xlayout_part_off(x, L, e, which) and is exactly
 *     xlayout_part_bytes(x, L, which) bytes: the same bytes as the GGUF
 *     slab, with the row layout expert_src.h describes. Part offsets are
 *     multiples of 64 in the sidecar and buffered-GGUF layouts; in the direct
 *     GGUF layout they are wherever the slab lies within its aligned range
 *     (GGUF data is only guaranteed 32-byte aligned anyway).
 * In direct mode every file_off, bytes and slot_off is a multiple of
 * XLAYOUT_ALIGN. In buffered mode the sidecar reads are the same aligned
 * reads (the padding is in the file) and the GGUF reads are the exact slabs.
 *
 * O_DIRECT (opts.direct): 1 opens the data file a second time with O_DIRECT;
 * if the file system refuses (EINVAL: tmpfs, some overlays) the file is
 * opened buffered instead and xlayout_direct() returns 0 — the caller
 * reports which mode it got. 0 always opens buffered.
 *
 * Ownership: the xlayout owns its fd(s) and the parsed index; it borrows
 * nothing from the gguf_file after open (the GGUF may be closed first).
 * Thread-safety: immutable after open; every query is a pure lookup and may
 * be called from any thread. The fd is shared: use pread, never read/lseek.
 * Queries with out-of-range layer/expert/which return 0 (or -1 for
 * xlayout_reads), never crash. */
#ifndef STRATA_XLAYOUT_H
#define STRATA_XLAYOUT_H

#include <stdint.h>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "util/err.h"

#define XLAYOUT_ALIGN     4096u   /* O_DIRECT granule and sidecar blob alignment */
#define XLAYOUT_MAX_READS 3       /* reads per layer-expert (GGUF: 3, sidecar: 1) */

typedef struct xlayout xlayout;

typedef struct xlayout_opts {
    const char *sidecar_path; /* NULL: auto-discover "<gguf path>.experts" */
    int         no_sidecar;   /* 1: ignore any sidecar, read the GGUF */
    int         direct;       /* 1: O_DIRECT if the file system allows it */
} xlayout_opts;

/* One read that (part of) a slot needs. */
typedef struct xread {
    uint64_t file_off;   /* absolute offset in xlayout_fd's file */
    uint64_t bytes;      /* length to request */
    uint64_t slot_off;   /* destination offset within the slot */
    uint64_t need;       /* bytes that must arrive (<= bytes; see the EOF rule) */
} xread;

/* Open the layout of `f`'s routed experts. `f` must have been opened from a
 * path (gguf_open); hp from hparams_load(f). o may be NULL (auto-discover,
 * buffered). Checks that every layer has the three expert tensors as 3-D
 * tensors with ne[2] == hp->n_expert and a slab size nb[2] > 0. Errors:
 * ERR_NOTFOUND (missing tensor, explicit sidecar absent), ERR_FORMAT (bad
 * sidecar: see above; bad tensor shape), ERR_IO, ERR_NOMEM.
 * *out owned by the caller; free with xlayout_close(). */
int  xlayout_open(xlayout **out, const gguf_file *f, const hparams *hp, const xlayout_opts *o, err *e);
void xlayout_close(xlayout *x);    /* NULL is a no-op; closes the fd(s) */

/* ==== Source facts ==== */
int         xlayout_fd(const xlayout *x);          /* borrowed fd the reads go to */
int         xlayout_direct(const xlayout *x);      /* 1 when that fd is O_DIRECT */
int         xlayout_has_sidecar(const xlayout *x); /* 1: sidecar, 0: GGUF */
const char *xlayout_path(const xlayout *x);        /* file the reads go to (owned) */
int         xlayout_n_layer(const xlayout *x);
int         xlayout_n_expert(const xlayout *x);
/* The GGUF fingerprint the layout was built for (gguf_fingerprint()). */
uint64_t    xlayout_fingerprint(const xlayout *x);

/* ==== Per layer ==== */
/* Bytes a slot must have to hold any expert of `layer` under this layout,
 * alignment slack included; a multiple of XLAYOUT_ALIGN. Layers whose
 * experts have the same types share a value, so a store can derive its size
 * classes from the distinct values. */
uint64_t xlayout_slot_bytes(const xlayout *x, int layer);
/* Useful bytes of one expert of `layer`: the sum of its three part sizes. */
uint64_t xlayout_blob_bytes(const xlayout *x, int layer);
/* Size and ggml type of one part (identical for every expert of the layer). */
uint64_t xlayout_part_bytes(const xlayout *x, int layer, int which);
int      xlayout_part_type(const xlayout *x, int layer, int which);

/* ==== Per layer-expert ==== */
/* Fill reads[0..n) for expert (layer, expert); returns n (1 for a sidecar,
 * 3 for the GGUF), or -1 for an out-of-range layer/expert. The reads do not
 * overlap in the slot and all end within xlayout_slot_bytes(x, layer). */
int      xlayout_reads(const xlayout *x, int layer, int expert, xread reads[XLAYOUT_MAX_READS]);
/* Offset of part `which`'s first byte in the slot after the reads. */
uint64_t xlayout_part_off(const xlayout *x, int layer, int expert, int which);
/* Total bytes xlayout_reads requests for one expert of `layer` (what a
 * store counts as "bytes read"). */
uint64_t xlayout_read_bytes(const xlayout *x, int layer, int expert);

/* The default sidecar path for a GGUF path: "<gguf_path>.experts". Writes at
 * most cap bytes (NUL-terminated); returns 0 or ERR_RANGE if it does not fit. */
int xlayout_default_sidecar_path(const char *gguf_path, char *buf, uint64_t cap);

#endif

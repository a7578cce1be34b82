/* inspect: a human-readable report on a GGUF file, for `strata inspect`.
 *
 * Prints the file facts (version, size, alignment, data offset, header size,
 * fingerprint), every metadata key with its type and value (long arrays
 * abbreviated), every tensor (name, type, shape, bytes, file offset), and an
 * MoE summary: architecture, layers (<arch>.block_count), experts and
 * experts used, bytes in routed experts (blk.N.ffn_{gate,up,down,gate_up}_exps.weight)
 * versus everything else, and the largest and smallest expert blob (one
 * layer-expert's slices: nb[2] of each 3-D routed tensor of the layer, summed).
 *
 * Reads only the header (gguf_open), never tensor data. Nothing is printed
 * when the file cannot be opened: the caller gets the error instead. */
#ifndef STRATA_INSPECT_H
#define STRATA_INSPECT_H

#include <stdio.h>
#include "util/err.h"

typedef struct inspect_opts {
    int no_tensors;   /* nonzero: skip the tensor list (the summary still counts them) */
    int max_array;    /* array elements shown per key; <= 0 means the default, 8 */
} inspect_opts;

/* Write the report for the GGUF file at `path` to `out`. `o` may be NULL
 * (defaults). Returns 0, or the gguf_open error (ERR_FORMAT, ERR_IO, ...),
 * or ERR_IO when writing to `out` failed. */
int strata_inspect(const char *path, FILE *out, const inspect_opts *o, err *e);

#endif

/* qtype: the table of ggml tensor types: ids, names, block sizes, byte sizes.
 * Ids are ggml's (ggml/include/ggml.h) because they are stored in GGUF files. */
#ifndef STRATA_QTYPE_H
#define STRATA_QTYPE_H

#include <stdint.h>
#include "util/err.h"

typedef enum qtype {
    QTYPE_F32  = 0,
    QTYPE_F16  = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,
    QTYPE_I8   = 24,
    QTYPE_I16  = 25,
    QTYPE_I32  = 26,
    QTYPE_I64  = 27,
    QTYPE_F64  = 28,
    QTYPE_BF16 = 30,
    QTYPE_MXFP4 = 39,
    QTYPE_MAX_ID = 64,      /* ids >= this are unknown */
} qtype;

typedef struct qtype_info {
    const char *name;       /* "q4_K", as ggml names it */
    int blck;               /* elements per block */
    int type_size;          /* bytes per block */
    int supported;          /* 1 when strata has dequant/quant/dot kernels */
    qtype dot_type;         /* activation format for the dot (llama.cpp vec_dot_type) */
} qtype_info;

/* Info for a ggml type id, or NULL if strata does not know the id at all.
 * Known-but-unsupported types (IQ*, TQ*, ...) return info with supported=0,
 * so tools can still print names and sizes. */
const qtype_info *qtype_get(int id);

/* Name for an id ("q4_K"), or "unknown". Never NULL. */
const char *qtype_name(int id);

/* Look up an id by (case-insensitive) name; -1 if none. */
int qtype_from_name(const char *name);

/* Bytes of a row of n elements; ERR_FORMAT if n is not a multiple of the
 * block size or the type is unknown. */
int qtype_row_bytes(int id, int64_t n, uint64_t *out, err *e);

#endif

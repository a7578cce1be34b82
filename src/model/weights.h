/* weights: binds a qwen3moe GGUF's tensors to the forward pass.
 *
 * What it owns, in one of two modes:
 *   WEIGHTS_MAP_ALL       one read-only private mapping of the whole file
 *                         (mmap PROT_READ, MAP_PRIVATE): the all-resident
 *                         mode, experts included;
 *   WEIGHTS_RESIDENT_ONLY one buffer holding every tensor except the routed
 *                         experts, read once with pread at open (and dropped
 *                         from the page cache afterwards). Nothing of the
 *                         file is mapped, so the experts can only come
 *                         through the expert store: their wtensors carry
 *                         type and shape, and data == NULL.
 * plus the table of bound tensors with their kernels, and small float
 * copies of the norm vectors. Every weight pointer is a borrowed view into
 * the mapping or the buffer, valid until weights_close().
 *
 * Validation at open: every required tensor is present, has a type strata
 * has kernels for (quant_ops_get), and has exactly the shape the hyper-
 * parameters imply. Errors are one line naming the tensor:
 *   "missing tensor blk.3.attn_k_norm.weight"
 *   "tensor blk.0.attn_q.weight: shape [64, 32] but expected [64, 64]"
 * output.weight is optional (absent: the head is tied to token_embd).
 * attn_q/k/v may instead be one fused attn_qkv (rows q | k | v). Like
 * llama.cpp, a tensor the architecture does not use is an error.
 *
 * Routed experts (ffn_{gate,up,down}_exps) are bound and validated here but
 * the forward must read them only through expert_src.h, so that a streaming
 * store can replace the mapping for them.
 *
 * Shapes below are C order (slowest first): a GGUF tensor with
 * ne = {in, out} is (out, in), so row r is output r's weights. */
#ifndef STRATA_WEIGHTS_H
#define STRATA_WEIGHTS_H

#include <stdint.h>
#include <time.h>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "quant/quant.h"
#include "util/err.h"

typedef struct wtensor {
    const uint8_t *data;      /* borrowed: into the mapping */
    int            type;      /* ggml type id */
    int64_t        ne[4];     /* GGUF order: ne[0] = row length (inputs) */
    uint64_t       row_bytes; /* bytes of one row of ne[0] elements */
    uint64_t       act_bytes; /* bytes of one activation row in ops.dot_type */
    quant_ops      ops;       /* kernels for `type` */
    quant_ops      act;       /* kernels for ops.dot_type: act.quant quantizes inputs */
} wtensor;

typedef struct layer_weights {
    const float *attn_norm;   /* (n_embd) */
    wtensor wq;               /* (n_head*head_dim, n_embd) */
    wtensor wk;               /* (n_head_kv*head_dim, n_embd) */
    wtensor wv;               /* (n_head_kv*head_dim, n_embd) */
    const float *q_norm;      /* (head_dim) */
    const float *k_norm;      /* (head_dim) */
    wtensor wo;               /* (n_embd, n_head*head_dim) */
    const float *ffn_norm;    /* (n_embd) */
    wtensor gate_inp;         /* (n_expert, n_embd) router */
    wtensor gate_exps;        /* (n_expert, n_ff_exp, n_embd): through expert_src only */
    wtensor up_exps;          /* (n_expert, n_ff_exp, n_embd): through expert_src only */
    wtensor down_exps;        /* (n_expert, n_embd, n_ff_exp): through expert_src only */
} layer_weights;

enum weights_mode { WEIGHTS_MAP_ALL = 0, WEIGHTS_RESIDENT_ONLY = 1 };

typedef struct weights {
    int            mode;      /* enum weights_mode */
    const uint8_t *map;       /* owned mapping of the whole file (WEIGHTS_MAP_ALL), else NULL */
    uint64_t       map_bytes;
    uint8_t       *resident;  /* owned buffer of the non-expert tensors (WEIGHTS_RESIDENT_ONLY) */
    uint64_t       resident_bytes;
    int            fd;        /* borrowed from the gguf_file (for the size check) */
    uint64_t       file_size; /* size at open */
    struct timespec mtime;    /* modification time at open */
    wtensor        tok_embd;  /* (n_vocab, n_embd) */
    const float   *output_norm; /* (n_embd) */
    wtensor        output;    /* (n_vocab, n_embd); a copy of tok_embd when tied */
    int            output_tied;
    layer_weights *layers;    /* owned: n_layer */
    float         *norms;     /* owned: every norm vector, dequantized to f32 */
    uint64_t       n_params;  /* elements of all bound tensors */
    uint64_t       n_bytes;   /* bytes of all bound tensors */
    uint64_t       expert_bytes; /* bytes of the routed-expert tensors */
    uint64_t       bytes_by_type[QTYPE_MAX_ID];
} weights;

/* Map (or, WEIGHTS_RESIDENT_ONLY, read the non-expert part of) `f`'s file
 * and bind every qwen3moe tensor; sets hp->n_vocab from token_embd. `isa`
 * picks the kernels. *out owned by the caller. */
int  weights_open(weights **out, const gguf_file *f, hparams *hp, cpu_isa isa, int mode, err *e);
void weights_close(weights *w);   /* NULL is a no-op; unmaps / frees */
/* Bytes the weights hold in memory: the whole mapping (WEIGHTS_MAP_ALL) or
 * the non-expert buffer. */
uint64_t weights_resident_bytes(const weights *w);

/* ERR_IO if the file changed size or modification time since open (a
 * truncated mapping would fault; a rewritten one would give wrong output).
 * One fstat: cheap enough to call before every evaluation. */
int  weights_check_file(const weights *w, err *e);

#endif

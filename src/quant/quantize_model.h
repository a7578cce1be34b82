/* quantize_model: strata's llama-quantize. Reads a GGUF (F32/F16/BF16, or
 * already quantized with allow_requantize), writes a new GGUF whose tensors
 * are quantized with llama.cpp's per-tensor rules for the chosen file type
 * (llama_tensor_get_type in src/llama-quant.cpp, without importance matrix):
 *
 *   - only tensors with 2+ dimensions whose names end in "weight" are
 *     quantized; norms, ffn_gate_inp (the MoE router) and llama.cpp's other
 *     exclusions keep their type; 3-D expert tensors are quantized row by row;
 *   - output.weight (and token_embd.weight when there is no output.weight)
 *     become Q6_K (Q8_0 if the row length is not a multiple of the type's
 *     block size, or when the base type is Q8_0);
 *   - the *_S / *_M / *_L mixes give attn_v, ffn_down, attn_output (and
 *     attn_qkv) more bits on the layers llama.cpp picks ("use_more_bits");
 *   - rows not divisible by 256 fall back Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0,
 *     Q5_K -> Q5_1, Q6_K -> Q8_0 (then F16 if still not divisible);
 *   - pure: every quantizable tensor gets the base type (fallbacks still apply).
 * All KV pairs are copied in order; general.quantization_version = 2 and
 * general.file_type = the llama_ftype of the type are (re)set at the end, as
 * llama.cpp's gguf_set_val moves them; tensors are written in llama.cpp's
 * order (non-layer tensors by name, then by layer, then by name). The output
 * is byte-for-byte llama-quantize's (checked against llama.cpp's own
 * llama_model_quantize for every type here on synthetic qwen3moe files; see
 * tests/cli/test_quantize.sh, LLAMA_LIBDIR).
 *
 * Memory: tensors are streamed in chunks of rows (about 16 MiB per buffer),
 * never held whole; rows are quantized in parallel on a thread pool. The
 * result is identical for any number of threads.
 *
 * The library prints nothing unless asked: `progress` gets a progress bar (on
 * a TTY only), `log` one line per tensor. */
#ifndef STRATA_QUANTIZE_MODEL_H
#define STRATA_QUANTIZE_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

typedef struct quantize_result {
    int64_t  n_tensors;      /* tensors written */
    int64_t  n_converted;    /* tensors whose type changed */
    int64_t  n_fallback;     /* tensors that needed a fallback type */
    uint64_t bytes_in;       /* tensor data bytes read */
    uint64_t bytes_out;      /* tensor data bytes written */
    uint64_t n_elements;     /* total elements (for bits per weight) */
    uint32_t ftype;          /* llama_ftype written to general.file_type */
    int      n_threads;      /* threads used */
    double   seconds;        /* wall time of the whole job */
} quantize_result;

typedef struct quantize_opts {
    const char *in_path;           /* input GGUF (borrowed) */
    const char *out_path;          /* output GGUF; written as "<out>.tmp" then renamed */
    const char *type;              /* llama-quantize type name, case-insensitive ("Q4_K_M") */
    int pure;                      /* 1: no per-tensor mix rules */
    int allow_requantize;          /* 1: quantized inputs are dequantized and requantized */
    int n_threads;                 /* <= 0: all CPUs */
    FILE *progress;                /* progress bar target (drawn on a TTY only); NULL: none */
    FILE *log;                     /* one line per tensor; NULL: silent */
    quantize_result *result;       /* OUT (optional) */
} quantize_opts;

/* Quantize o->in_path into o->out_path. Returns 0, or ERR_USAGE (unknown type,
 * output path == input path), ERR_NOTFOUND/ERR_IO (files), ERR_FORMAT (bad
 * input), ERR_UNSUPPORTED (a tensor strata cannot convert, requantizing
 * without allow_requantize, a shape llama.cpp has no fallback for), ERR_NOMEM.
 * On error no output file is left behind. */
int strata_quantize(const quantize_opts *o, err *e);

/* llama_ftype of a type name (case-insensitive; "Q4_K" and "Q5_K" are
 * llama-quantize's aliases for the _M mixes, "Q3_K" for Q3_K_M), or -1. */
int quantize_ftype_from_name(const char *name);

/* Canonical name of a llama_ftype this module writes ("Q4_K_M"), or "?". */
const char *quantize_ftype_name(int ftype);

/* "Q4_0, Q4_1, ..., F32": the valid type names, for usage messages. */
const char *quantize_type_names(void);

/* The picker: strata_quantize's choice of each tensor's type for a model
 * that is not in a file yet (strata mkmodel --ftype writes its tensors in
 * the types llama-quantize would give them). Feed the tensors in llama.cpp's
 * order -- those outside the layers first, then layer by layer (the mixes
 * count attn_v and ffn_down tensors as they come). */
typedef struct quantize_model_info {
    const char *arch;          /* general.architecture, e.g. "qwen3moe" */
    int n_layer, n_expert;     /* block_count, expert_count (0: dense) */
    int n_head, n_head_kv;
    int tied_embeddings;       /* 1: the model has no output.weight */
    int n_attention_wv;        /* attn_v (attn_qkv, attn_kv_b) tensors it has */
} quantize_model_info;

typedef struct quantize_picker quantize_picker;

/* type: a name quantize_ftype_from_name knows. ERR_USAGE, ERR_NOMEM. */
int  quantize_picker_open(quantize_picker **p, const char *type, const quantize_model_info *m, err *e);
/* The type of tensor `name` (n_dims dimensions, rows of ne0 values, given
 * in in_type): >= 0, or a negative error code (a layer tensor whose name
 * has no valid "blk.N.", a row length with no fallback). */
int  quantize_picker_type(quantize_picker *p, const char *name, int n_dims, int64_t ne0, int in_type, err *e);
void quantize_picker_close(quantize_picker *p);

#endif

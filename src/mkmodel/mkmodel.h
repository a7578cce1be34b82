/* mkmodel: deterministic synthetic qwen3moe GGUF files that llama.cpp loads.
 *
 * What it owns: the shape presets, the tensor plan (names, shapes, types and
 * order exactly as llama.cpp's qwen3moe loader expects), the metadata (arch
 * keys, a real byte-level BPE vocabulary learned from a bundled text, the
 * Qwen3 chat template), and streaming the random weights to disk.
 *
 * Determinism: the file is a pure function of the options (seed included);
 * thread count, chunking and machine do not change a byte. Every row of every
 * tensor comes from its own counter-based random stream (tensor name, row).
 *
 * Weights: matrices are N(0, 1/fan_in) (uniform-in-block for directly
 * generated quantized rows; see randw.h); token embeddings N(0, 1), or
 * N(0, 1/n_embd) when tied to the head; the two projections that write into
 * the residual stream (attn_output, ffn_down_exps) are further scaled by the
 * embedding std and 1/sqrt(n_layer), so the residual stream's rms stays within
 * ~1.5x of the embeddings' at every depth; norm weights are 1 + N(0, 0.05^2).
 * Activations stay O(1), logits are O(1) and differ between tokens. The text
 * the model writes is gibberish.
 *
 * Router skew (route_skew S > 0): expert popularity follows a Zipf-like law
 * with exponent S; see the "Router skew" section of mkmodel.c for the
 * mechanism and its limits.
 *
 * Thread-safety: strata_mkmodel may run concurrently with itself on
 * different output paths; it uses its own thread pool. */
#ifndef STRATA_MKMODEL_H
#define STRATA_MKMODEL_H

#include <stdint.h>
#include <stdio.h>
#include "util/err.h"

/* Options. Zero / NULL fields take the preset's value, so a designated
 * initialiser with only .path set gives the "tiny" preset with seed 0. */
typedef struct mkmodel_opts {
    const char *path;          /* output GGUF (written to path.tmp, then renamed) */
    const char *preset;        /* "tiny" (default), "small", "30b-a3b", "80b-a3b" */
    uint64_t seed;
    /* shape overrides (0 = preset) */
    int n_layer, n_expert, n_expert_used, n_embd, n_ff_exp;
    int n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    /* ggml type names (case-insensitive; NULL = preset). `type` sets every
     * weight matrix except the router (llama-quantize keeps ffn_gate_inp in
     * f32 too); the specific ones override it. Norms are always f32. A type
     * whose block does not divide a tensor's rows falls back the way
     * llama-quantize does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0,
     * q2_K/q3_K -> q4_0), and the report says so. */
    const char *type, *type_experts, *type_attn, *type_embd, *type_output, *type_router;
    /* A llama-quantize file type (any name quantize_ftype_from_name knows:
     * "Q4_K_M", "q5_k_m", "Q3_K_L", "Q8_0", ...; NULL = none): every matrix
     * in the type llama-quantize gives it in a qwen3moe model of this shape
     * (quantize_picker: for Q4_K_M, q4_K with attn_v and ffn_down_exps q6_K
     * in the use_more_bits layers and output q6_K; with exactly 8 experts
     * attn_k and attn_v q8_0 and attn_output q5_K). Excludes type,
     * type_experts, type_attn, type_embd and type_output; type_router still
     * applies (llama-quantize keeps the router as it is). */
    const char *ftype;
    int tied;                  /* 1: no output.weight (the head reuses token_embd) */
    double route_skew;         /* Zipf exponent of expert popularity; 0 = none */
    int n_threads;             /* 0 = all online CPUs */
    int progress;              /* 1: progress bar on stderr (drawn only if stderr is a TTY) */
} mkmodel_opts;

/* Write the model. Prints a short report to `report` (NULL: silent): file
 * size, tensor count, bytes in experts, time, GB/s written, vocabulary, and
 * the layer-0 routing popularity estimate. Returns 0, ERR_USAGE for bad
 * options (unknown preset or type, inconsistent shape), ERR_IO, ERR_NOMEM. */
int strata_mkmodel(const mkmodel_opts *o, FILE *report, err *e);

/* The bundled vocabulary training text (data/corpus.txt, compiled in).
 * Borrowed static storage; *len receives its length. */
const char *mkmodel_corpus(size_t *len);

#endif

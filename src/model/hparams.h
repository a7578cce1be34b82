/* hparams: the hyper-parameters of a qwen3moe model, read from its GGUF keys
 * with llama.cpp's defaults (src/llama-model.cpp, src/models/qwen3moe.cpp).
 *
 * What it owns: a plain value struct, filled once at load. It reads only
 * metadata; tensor shapes are checked against it by weights.c, which also
 * fills n_vocab from token_embd.
 *
 * Keys (prefix "<arch>."): block_count, embedding_length, context_length,
 * attention.head_count (+ head_count_kv; either may be a per-layer array, but
 * qwen3moe's graph uses one value for every layer, so the values must agree),
 * attention.key_length / value_length (default n_embd / n_head; must be
 * equal), attention.layer_norm_rms_epsilon (required), rope.freq_base
 * (default 10000), rope.dimension_count (default key_length; llama.cpp
 * asserts it equals the head size for qwen3moe), rope.scaling.type/factor
 * (linear: freq_scale = 1/factor; YaRN and longrope are ERR_UNSUPPORTED),
 * expert_count, expert_used_count (both required, > 0),
 * expert_feed_forward_length (fallback feed_forward_length / expert_used_count).
 * Errors name the key: "missing key qwen3moe.block_count". */
#ifndef STRATA_HPARAMS_H
#define STRATA_HPARAMS_H

#include "gguf/gguf.h"
#include "util/err.h"

typedef struct hparams {
    char  arch[32];         /* general.architecture ("qwen3moe") */
    int   n_layer;
    int   n_embd;
    int   n_head;           /* query heads */
    int   n_head_kv;        /* key/value heads (GQA: n_head % n_head_kv == 0) */
    int   head_dim;         /* key_length == value_length */
    int   n_rot;            /* rotated dims per head (== head_dim for qwen3moe) */
    float rope_freq_base;
    float rope_freq_scale;  /* 1 / linear scaling factor */
    float rms_eps;
    int   n_expert;
    int   n_expert_used;
    int   n_ff_exp;         /* expert hidden width */
    int   n_ctx_train;
    int   n_vocab;          /* token_embd rows; set by weights_open */
} hparams;

/* Read the hyper-parameters of a qwen3moe file. ERR_UNSUPPORTED for another
 * architecture (naming it) or an unsupported feature (YaRN), ERR_NOTFOUND for
 * a missing required key, ERR_FORMAT for values out of range. */
int hparams_load(hparams *hp, const gguf_file *f, err *e);

#endif

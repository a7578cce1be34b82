/* mkmodel: synthetic qwen3moe GGUF files (see mkmodel.h for the contract).
 *
 * What it owns: presets and option resolution, the tensor plan, the GGUF
 * metadata, the router-skew mechanism, and the generation pipeline:
 *
 *   thread pool (n threads) fills chunk A with rows  --->  writer thread
 *   while the writer thread appends chunk B to the file   (gguf_writer_write)
 *
 * Chunks are up to 32 MiB of consecutive tensor data (small tensors share a
 * chunk; the writer inserts each tensor's alignment padding). Every row is a
 * pure function of (seed, tensor name, row index), so the split of rows among
 * threads never changes the bytes.
 *
 * What it does not do: quantize real weights (that is `strata quantize`), or
 * check that the model says anything sensible (it cannot: weights are random). */
#include "mkmodel/mkmodel.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf/gguf_write.h"
#include "mkmodel/bpe_train.h"
#include "mkmodel/randw.h"
#include "mkmodel/skew.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"
#include "quant/qtype.h"
#include "tokenizer/tokenizer.h"
#include "util/cpu.h"
#include "util/fp16.h"
#include "util/progress.h"
#include "util/threadpool.h"
#include "util/timer.h"

#define MK_ARCH "qwen3moe"
#define MK_CHUNK_BYTES (32u << 20)
#define MK_NORM_NOISE 0.05f
#define MK_STATES_REPORT 4096           /* states routed for the estimate (fewer for huge X) */
#define MK_STATES_FIT 2048              /* states the skew fit sees */
#define MK_ROUTE_MAX_FLOATS (1 << 27)   /* cap on n_embd * n_expert for the estimate (512 MB) */

/* ==== Presets ==== */

typedef struct mk_cfg {
    const char *preset;
    uint64_t seed;
    int n_layer, n_expert, n_used, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    int t_exp, t_attn, t_embd, t_out, t_router;   /* ggml type ids */
    int tied;
    double skew;
    int skew_dims;                                /* s: the skew channel's width; 0 without skew */
    int mix;                                      /* -1, or the llama_ftype whose types llama-quantize picks */
} mk_cfg;

/* tiny: unit tests and the float64 oracle, f32 everywhere, ~0.5 MB.
 * small: a few hundred MB, many experts, for streaming tests.
 * 30b-a3b: Qwen3-30B-A3B's shape (vocabulary kept at 32k: learned, not 151k).
 * 80b-a3b: Qwen3-Next-80B-A3B's MoE shape (512 experts, top-10, 16 q / 2 kv
 *   heads of 256, expert ff 512, ctx 262144) on qwen3moe's plain attention
 *   (qwen3next's linear-attention layers are another architecture). */
static const mk_cfg k_presets[] = {
    { "tiny",    0, 2,  8,   2,  64,   32,  4,  2, 16,  512,   256,
      QTYPE_F32, QTYPE_F32, QTYPE_F32, QTYPE_F32, QTYPE_F32, 0, 0, 0, 0 },
    { "small",   0, 8,  128, 8,  512,  256, 8,  2, 64,  8192,  4096,
      QTYPE_Q4_K, QTYPE_Q8_0, QTYPE_Q6_K, QTYPE_Q6_K, QTYPE_F32, 0, 0, 0, 0 },
    { "30b-a3b", 0, 48, 128, 8,  2048, 768, 32, 4, 128, 32768, 40960,
      QTYPE_Q4_K, QTYPE_Q8_0, QTYPE_Q6_K, QTYPE_Q6_K, QTYPE_F32, 0, 0, 0, 0 },
    { "80b-a3b", 0, 48, 512, 10, 2048, 512, 16, 2, 256, 32768, 262144,
      QTYPE_Q4_K, QTYPE_Q8_0, QTYPE_Q6_K, QTYPE_Q6_K, QTYPE_F32, 0, 0, 0, 0 },
};

/* strata's own ChatML chat template (Jinja, as tokenizer.chat_template
 * holds it). It renders the ChatML turns Qwen-family models use
 * (<|im_start|>role\n...<|im_end|>\n), a tools block in the system turn and
 * <tool_call>/<tool_response> wrapping, so template detection and tool-call
 * parsing see the format real Qwen3 GGUFs carry. Written for strata; not a
 * copy of any model's template text. */
static const char k_chat_template[] =
    "{#- strata ChatML template -#}\n"
    "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}\n"
    "{%- if tools or sys is not none -%}\n"
    "{{- '<|im_start|>system\\n' -}}\n"
    "{%- if sys is not none %}{{- sys -}}{% endif -%}\n"
    "{%- if tools -%}\n"
    "{%- if sys is not none %}{{- '\\n\\n' -}}{% endif -%}\n"
    "{{- 'Available tools (JSON schemas), one per line:\\n<tools>' -}}\n"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) -}}{% endfor -%}\n"
    "{{- '\\n</tools>\\nTo call a tool, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.' -}}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'system' and loop.first -%}\n"
    "{%- elif m.role == 'tool' -%}\n"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') -}}\n"
    "{%- for c in (m.tool_calls or []) -%}\n"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' -}}{% endif -%}\n";

/* Special tokens in Qwen3's order (ids 151643.. there; right after the
 * learned tokens here). CONTROL ones are the turn markers; the USER_DEFINED
 * ones are matched in plain text too, as in Qwen3's GGUFs. */
static const char *const k_specials[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
};
static const int32_t k_special_types[] = {
    TOK_CONTROL, TOK_CONTROL, TOK_CONTROL,
    TOK_USER_DEFINED, TOK_USER_DEFINED, TOK_USER_DEFINED, TOK_USER_DEFINED,
    TOK_USER_DEFINED, TOK_USER_DEFINED,
};
#define MK_N_SPECIALS ((int)(sizeof k_specials / sizeof k_specials[0]))
#define MK_MIN_VOCAB (256 + MK_N_SPECIALS + 1)

static int parse_type(const char *name, const char *what, int *out, err *e)
{
    if (!name) return 0;
    int t = qtype_from_name(name);
    const qtype_info *qi = qtype_get(t);
    int ok = qi && (t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16 || randw_quant_supported(t));
    if (!ok)
        return err_setf(e, ERR_USAGE, "%s type '%s' is not one of f32, f16, bf16, q8_0, q4_0, q4_1, "
                        "q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K", what, name);
    *out = t;
    return 0;
}

static int resolve(const mkmodel_opts *o, mk_cfg *c, err *e)
{
    const char *pname = o->preset ? o->preset : "tiny";
    const mk_cfg *p = NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcasecmp(pname, k_presets[i].preset)) p = &k_presets[i];
    if (!p) return err_setf(e, ERR_USAGE, "unknown preset '%s' (tiny, small, 30b-a3b, 80b-a3b)", pname);
    *c = *p;
    c->seed = o->seed;
#define OVR(f, v) do { if ((v) < 0) return err_setf(e, ERR_USAGE, "%s must be positive", #v); \
                       if ((v) > 0) c->f = (v); } while (0)
    OVR(n_layer, o->n_layer);
    OVR(n_expert, o->n_expert);
    OVR(n_used, o->n_expert_used);
    OVR(n_embd, o->n_embd);
    OVR(n_ff, o->n_ff_exp);
    OVR(n_head, o->n_head);
    OVR(n_head_kv, o->n_head_kv);
    OVR(head_dim, o->head_dim);
    OVR(n_vocab, o->n_vocab);
    OVR(n_ctx, o->n_ctx);
#undef OVR
    int rc = 0;
    int all = -1;
    rc |= parse_type(o->type, "--type", &all, e);
    if (all >= 0) c->t_exp = c->t_attn = c->t_embd = c->t_out = all;
    rc |= parse_type(o->type_experts, "--type-experts", &c->t_exp, e);
    rc |= parse_type(o->type_attn, "--type-attn", &c->t_attn, e);
    rc |= parse_type(o->type_embd, "--type-embd", &c->t_embd, e);
    rc |= parse_type(o->type_output, "--type-output", &c->t_out, e);
    rc |= parse_type(o->type_router, "--type-router", &c->t_router, e);
    if (rc) return ERR_USAGE;
    c->mix = -1;
    if (o->ftype) {
        if (o->type || o->type_experts || o->type_attn || o->type_embd || o->type_output)
            return err_setf(e, ERR_USAGE, "--ftype %s picks the matrices' types: drop --type, --type-experts, "
                            "--type-attn, --type-embd and --type-output (--type-router still applies)", o->ftype);
        if ((c->mix = quantize_ftype_from_name(o->ftype)) < 0)
            return err_setf(e, ERR_USAGE, "--ftype '%s' is not one of %s", o->ftype, quantize_type_names());
    }
    c->tied = o->tied ? 1 : 0;
    c->skew = o->route_skew;

    if (c->n_layer > 4096) return err_setf(e, ERR_USAGE, "--layers %d is more than 4096", c->n_layer);
    if (c->n_expert > 65536) return err_setf(e, ERR_USAGE, "--experts %d is more than 65536", c->n_expert);
    if (c->n_used > c->n_expert)
        return err_setf(e, ERR_USAGE, "--experts-used %d is more than --experts %d", c->n_used, c->n_expert);
    if (c->n_embd > 65536 || c->n_ff > 262144 || c->head_dim > 4096 || c->n_head > 1024)
        return err_setf(e, ERR_USAGE, "shape too large (n_embd %d, ff %d, heads %d x %d)",
                        c->n_embd, c->n_ff, c->n_head, c->head_dim);
    if (c->n_head % c->n_head_kv)
        return err_setf(e, ERR_USAGE, "--heads %d is not a multiple of --heads-kv %d", c->n_head, c->n_head_kv);
    if (c->head_dim % 2) return err_setf(e, ERR_USAGE, "--head-dim %d must be even (RoPE rotates pairs)", c->head_dim);
    if (c->n_vocab < MK_MIN_VOCAB || c->n_vocab > (1 << 22))
        return err_setf(e, ERR_USAGE, "--vocab %d out of range [%d, %d]", c->n_vocab, MK_MIN_VOCAB, 1 << 22);
    if (!(c->skew >= 0 && c->skew <= 8)) return err_setf(e, ERR_USAGE, "--route-skew must be in [0, 8]");
    if (c->skew > 0) {
        if (c->n_embd < 4) return err_setf(e, ERR_USAGE, "--route-skew needs --embd >= 4");
        c->skew_dims = c->n_embd / 64 > 1 ? c->n_embd / 64 : 1;
    }
    return 0;
}

/* llama_ftype for general.file_type (cosmetic in llama.cpp): named after the
 * expert type, the "_M" variant when other matrices differ from it. */
static uint32_t ftype_of(const mk_cfg *c)
{
    if (c->mix >= 0) return (uint32_t)c->mix;
    int mixed = c->t_attn != c->t_exp || c->t_embd != c->t_exp || c->t_out != c->t_exp;
    switch (c->t_exp) {
    case QTYPE_F32:  return 0;
    case QTYPE_F16:  return 1;
    case QTYPE_Q4_0: return 2;
    case QTYPE_Q4_1: return 3;
    case QTYPE_Q8_0: return 7;
    case QTYPE_Q5_0: return 8;
    case QTYPE_Q5_1: return 9;
    case QTYPE_Q2_K: return 10;
    case QTYPE_Q3_K: return mixed ? 12 : 11;
    case QTYPE_Q4_K: return mixed ? 15 : 14;
    case QTYPE_Q5_K: return mixed ? 17 : 16;
    case QTYPE_Q6_K: return 18;
    case QTYPE_BF16: return 32;
    default:         return 0;
    }
}

static int is_float_type(int t) { return t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16; }

/* ==== Tensor plan ==== */

enum mk_kind {
    MK_EMBD,      /* token_embd: rows are token vectors */
    MK_NORM,      /* 1-D norm weights, f32 */
    MK_MAT,       /* plain matrix: attn_q/k/v, output */
    MK_MAT_RES,   /* writes into the residual stream: attn_output */
    MK_ROUTER,    /* ffn_gate_inp */
    MK_EXP,       /* ffn_gate_exps, ffn_up_exps */
    MK_EXP_RES,   /* ffn_down_exps (writes into the residual stream) */
};

typedef struct mk_tensor {
    char name[64];
    int kind, type, layer;
    int n_dims;
    int64_t ne[3];
    int64_t n_rows;        /* ne[1] * ne[2] */
    uint64_t row_bytes, bytes;
    uint64_t key;          /* random stream key: hash(seed, name) */
    float std;
    int want_type;         /* the type asked for (differs after a fallback) */
} mk_tensor;

typedef struct mk_plan {
    mk_cfg c;
    mk_tensor *t;
    int n_t;
    int64_t max_ne0;
    uint64_t total_bytes, expert_bytes;
    /* router skew */
    float *router_off;     /* [n_layer * n_expert]: offset of each router row along the channel */
    float channel_mean;    /* c: mean of (n . u) over the fit sample */
} mk_plan;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Type for a matrix whose rows have ne0 elements: the wanted type, or
 * llama-quantize's fallback when the block size does not divide ne0. */
static int fit_type(int want, int64_t ne0)
{
    int t = want;
    for (int i = 0; i < 3; i++) {
        const qtype_info *qi = qtype_get(t);
        if (ne0 % qi->blck == 0) return t;
        switch (t) {
        case QTYPE_Q4_K: t = QTYPE_Q5_0; break;
        case QTYPE_Q5_K: t = QTYPE_Q5_1; break;
        case QTYPE_Q6_K: t = QTYPE_Q8_0; break;
        case QTYPE_Q2_K: case QTYPE_Q3_K: t = QTYPE_Q4_0; break;
        default: t = QTYPE_F16; break;
        }
    }
    return QTYPE_F16;
}

/* A matrix's type: with --ftype, llama-quantize's choice (quantize_picker:
 * strata quantize's rules; the plan's layer-by-layer order gives its
 * attn_v and ffn_down counters llama.cpp's values); the router and norms
 * keep theirs (llama-quantize never quantizes them). Negative: an error. */
static int plan_type(quantize_picker *pk, int kind, int want, const char *name, int n_dims, int64_t ne0, err *e)
{
    if (!pk || kind == MK_NORM || kind == MK_ROUTER) return want;
    return quantize_picker_type(pk, name, n_dims, ne0, QTYPE_F32, e);
}

static int plan_add(mk_plan *p, int cap, int kind, int type, int layer, float std, int n_dims,
                    int64_t ne0, int64_t ne1, int64_t ne2, const char *name, err *e)
{
    if (p->n_t >= cap) return err_setf(e, ERR_INTERNAL, "mkmodel: tensor plan overflow");
    mk_tensor *t = &p->t[p->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->want_type = type;
    t->type = kind == MK_NORM ? QTYPE_F32 : fit_type(type, ne0);
    t->layer = layer;
    t->std = std;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->n_rows = ne1 * ne2;
    int rc = qtype_row_bytes(t->type, ne0, &t->row_bytes, e);
    if (rc) return rc;
    t->bytes = t->row_bytes * (uint64_t)t->n_rows;
    t->key = randw_mix(p->c.seed ^ randw_mix(hash_str(t->name)));
    if (ne0 > p->max_ne0) p->max_ne0 = ne0;
    p->total_bytes += t->bytes;
    if (kind == MK_EXP || kind == MK_EXP_RES) p->expert_bytes += t->bytes;
    return 0;
}

/* The tensors in llama.cpp's qwen3moe order. Shapes are ggml ne (ne[0] =
 * the contiguous input dimension): token_embd {E,V}; attn_q {E,H*Dh};
 * attn_k/v {E,Hkv*Dh}; attn_output {H*Dh,E}; q/k norms {Dh}; router {E,X};
 * gate/up exps {E,F,X}; down exps {F,E,X}; output {E,V}. */
static int plan_build(mk_plan *p, err *e)
{
    const mk_cfg *c = &p->c;
    const int64_t E = c->n_embd, V = c->n_vocab, Dh = c->head_dim, X = c->n_expert, F = c->n_ff;
    const int64_t Q = (int64_t)c->n_head * Dh, KV = (int64_t)c->n_head_kv * Dh;
    const int cap = 3 + 12 * c->n_layer;
    p->t = calloc((size_t)cap, sizeof *p->t);
    if (!p->t) return err_setf(e, ERR_NOMEM, "mkmodel: out of memory");
    /* The residual stream's scale is the embeddings' (1, or 1/sqrt(E) when
     * the head reuses them, so tied logits are O(1) for other tokens and
     * ~sqrt(E) for the current one); the two branches that write into it are
     * scaled to match and by 1/sqrt(n_layer), so the stream's rms grows by
     * only ~1.5x over all layers (RMSNorm makes everything else
     * scale-free). */
    const float embd_std = c->tied ? 1.0f / sqrtf((float)E) : 1.0f;
    const float res = embd_std / sqrtf((float)c->n_layer);
    const float in_e = 1.0f / sqrtf((float)E);
    char nm[64];
    quantize_picker *pk = NULL;
    if (c->mix >= 0) {
        const quantize_model_info mi = { MK_ARCH, c->n_layer, c->n_expert, c->n_head, c->n_head_kv, c->tied,
                                         c->n_layer };
        const int r = quantize_picker_open(&pk, quantize_ftype_name(c->mix), &mi, e);
        if (r) return r;
    }
    int rc = 0, ty;
    /* one tensor: name nm (fmt with layer l), its type, then the plan */
#define ADD_NAMED(kind, type, l, std, nd, a, b, d) do { if (rc == 0) { \
        ty = plan_type(pk, kind, type, nm, nd, a, e); \
        rc = ty < 0 ? ty : plan_add(p, cap, kind, ty, l, std, nd, a, b, d, nm, e); } } while (0)
#define ADD(kind, type, std, nd, a, b, d, fmt) do { \
        snprintf(nm, sizeof nm, fmt, l); \
        ADD_NAMED(kind, type, l, std, nd, a, b, d); } while (0)
    snprintf(nm, sizeof nm, "token_embd.weight");
    ADD_NAMED(MK_EMBD, c->t_embd, -1, embd_std, 2, E, V, 1);
    for (int l = 0; rc == 0 && l < c->n_layer; l++) {
        ADD(MK_NORM, QTYPE_F32, 1, 1, E, 1, 1, "blk.%d.attn_norm.weight");
        ADD(MK_MAT, c->t_attn, in_e, 2, E, Q, 1, "blk.%d.attn_q.weight");
        ADD(MK_MAT, c->t_attn, in_e, 2, E, KV, 1, "blk.%d.attn_k.weight");
        ADD(MK_MAT, c->t_attn, in_e, 2, E, KV, 1, "blk.%d.attn_v.weight");
        ADD(MK_MAT_RES, c->t_attn, res / sqrtf((float)Q), 2, Q, E, 1, "blk.%d.attn_output.weight");
        ADD(MK_NORM, QTYPE_F32, 1, 1, Dh, 1, 1, "blk.%d.attn_q_norm.weight");
        ADD(MK_NORM, QTYPE_F32, 1, 1, Dh, 1, 1, "blk.%d.attn_k_norm.weight");
        ADD(MK_NORM, QTYPE_F32, 1, 1, E, 1, 1, "blk.%d.ffn_norm.weight");
        ADD(MK_ROUTER, c->t_router, in_e, 2, E, X, 1, "blk.%d.ffn_gate_inp.weight");
        ADD(MK_EXP, c->t_exp, in_e, 3, E, F, X, "blk.%d.ffn_gate_exps.weight");
        ADD(MK_EXP, c->t_exp, in_e, 3, E, F, X, "blk.%d.ffn_up_exps.weight");
        ADD(MK_EXP_RES, c->t_exp, res / sqrtf((float)F), 3, F, E, X, "blk.%d.ffn_down_exps.weight");
    }
    snprintf(nm, sizeof nm, "output_norm.weight");
    ADD_NAMED(MK_NORM, QTYPE_F32, -1, 1, 1, E, 1, 1);
    snprintf(nm, sizeof nm, "output.weight");
    if (!c->tied) ADD_NAMED(MK_MAT, c->t_out, -1, in_e, 2, E, V, 1);
#undef ADD
#undef ADD_NAMED
    quantize_picker_close(pk);
    return rc;
}

/* ==== Row generation ==== */

/* Is output row `row` of a residual-writing tensor in the skew channel
 * (the last skew_dims coordinates of n_embd)? Those rows are zero. */
static int in_channel(const mk_cfg *c, int64_t dim)
{
    return c->skew_dims > 0 && dim >= c->n_embd - c->skew_dims;
}

/* The float values of one row of a float-generated tensor (embeddings,
 * routers, norms, and any matrix stored as f32/f16/bf16). */
static void float_row(const mk_plan *p, const mk_tensor *t, int64_t row, float *out)
{
    const mk_cfg *c = &p->c;
    randw_rng r = randw_stream(t->key, (uint64_t)row);
    const int64_t n = t->ne[0];
    if (t->kind == MK_NORM) {
        for (int64_t j = 0; j < n; j++) out[j] = 1.0f + MK_NORM_NOISE * randw_normal(&r);
        return;
    }
    if ((t->kind == MK_MAT_RES || t->kind == MK_EXP_RES) && in_channel(c, row % c->n_embd)) {
        memset(out, 0, (size_t)n * sizeof *out);
        return;
    }
    for (int64_t j = 0; j < n; j++) out[j] = t->std * randw_normal(&r);
    if (t->kind == MK_EMBD && c->skew_dims > 0)
        for (int64_t j = n - c->skew_dims; j < n; j++) out[j] = t->std;   /* the shared channel */
    if (t->kind == MK_ROUTER && p->router_off) {
        float a = p->router_off[(int64_t)t->layer * c->n_expert + row] /
                  (p->channel_mean * sqrtf((float)c->skew_dims));
        for (int64_t j = n - c->skew_dims; j < n; j++) out[j] += a;
    }
}

/* Convert a float row to `type`. Quantized types go through quant_quantize
 * (reference rounding); its errors were ruled out by a probe before. */
static void float_to_type(int type, const float *src, void *dst, int64_t n)
{
    if (type == QTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof *src);
    } else if (type == QTYPE_F16) {
        uint16_t *d = dst;
        for (int64_t j = 0; j < n; j++) d[j] = fp32_to_fp16(src[j]);
    } else if (type == QTYPE_BF16) {
        uint16_t *d = dst;
        for (int64_t j = 0; j < n; j++) d[j] = fp32_to_bf16(src[j]);
    } else {
        quant_quantize(type, src, dst, n, NULL);
    }
}

/* Whether a tensor's rows are generated as floats (then converted) or as
 * random quant blocks directly. Directly generated rows cannot carry the
 * structure of the embeddings' skew channel or the router offsets. */
static int needs_floats(const mk_plan *p, const mk_tensor *t)
{
    if (is_float_type(t->type) || t->kind == MK_NORM || t->kind == MK_ROUTER) return 1;
    return t->kind == MK_EMBD && p->c.skew_dims > 0;
}

/* Row `row` of tensor t into dst (row_bytes). scratch holds max_ne0 floats. */
static void gen_row(const mk_plan *p, const mk_tensor *t, int64_t row, uint8_t *dst, float *scratch)
{
    if (needs_floats(p, t)) {
        float_row(p, t, row, scratch);
        float_to_type(t->type, scratch, dst, t->ne[0]);
        return;
    }
    if ((t->kind == MK_MAT_RES || t->kind == MK_EXP_RES) && in_channel(&p->c, row % p->c.n_embd)) {
        memset(dst, 0, t->row_bytes);   /* all-zero blocks dequantize to 0 in every format */
        return;
    }
    randw_rng r = randw_stream(t->key, (uint64_t)row);
    randw_quant_row(t->type, &r, t->std, dst, t->ne[0], NULL);
}

/* Row `row` as the forward sees it (dequantized). */
static int row_values(const mk_plan *p, const mk_tensor *t, int64_t row, uint8_t *bytes, float *out, err *e)
{
    gen_row(p, t, row, bytes, out);
    if (t->type == QTYPE_F32) { memcpy(out, bytes, (size_t)t->ne[0] * sizeof *out); return 0; }
    return quant_dequantize(t->type, bytes, out, t->ne[0], e);
}

/* ==== Router skew ====
 *
 * Mechanism. A Zipf law needs a per-expert logit offset that every token
 * sees, and a linear router can only add a constant through a direction that
 * all hidden states share. mkmodel builds one: the last s = n_embd/64
 * coordinates of every token embedding are the constant embd_std (the "skew
 * channel", unit vector u), and the residual-writing projections
 * (attn_output, ffn_down_exps) have zero rows there, so the residual stream
 * keeps exactly that value at every layer, for every token. After RMSNorm *
 * ffn_norm every hidden state n has n.u ~ sqrt(s) * embd_std / rms(h). Router
 * row e gets + o_e / (c sqrt(s)) on the channel (c = mean n.u over a sample),
 * so its logit is (random part) + o_e * (n.u)/c ~ z_e + o_e. The offsets o
 * are fitted by rank on a sample of layer-0 states (skew_fit) and each layer
 * assigns the ranks to experts by its own random permutation, so the popular
 * experts differ between layers as in real models.
 *
 * Limits. (1) Deeper layers: rms(h) grows as blocks add to the residual
 * stream, which shrinks n.u and with it the offsets; the residual-branch
 * scaling (1/sqrt(n_layer)) keeps the growth to about 1.5x at the last layer.
 * Measured with the float64 reference forward (tests/ref/qwen3moe_ref.py) on
 * a 12-layer, 64-expert top-4 model with S = 1 over 1024 random tokens: the
 * per-layer fitted exponents were 0.99..1.31 for a layer-0 estimate of 1.11,
 * top-1% shares 17-21% for an estimate of 20%: the skew holds at depth. (2) The
 * fit sees states built from embeddings alone (RMSNorm * ffn_norm of random
 * token embeddings); layer 0's attention adds a little. (3) An expert can be
 * chosen at most once per token, so a share above 1/k of all selections is
 * impossible: large exponents with few experts saturate (the target is
 * capped at 1/k, and the report shows the law actually reached). (4) The
 * estimate is of popularity over independent tokens; real text also has
 * temporal locality, which this does not model. (5) With quantized
 * embeddings the channel value is quantized too (the estimate uses the
 * dequantized rows, so it accounts for that). */

typedef struct states_job {
    const mk_plan *p;
    const mk_tensor *embd, *ffn_norm;
    const float *rt;       /* router random part, transposed: [E][X] */
    const float *norm;     /* ffn_norm weights [E] */
    int n_states;
    uint64_t key;
    float *z;              /* [n_states][X] */
    float *chan;           /* [n_states]: n . u */
    uint8_t *bytes;        /* per thread: row_bytes of token_embd */
    float *rows;           /* per thread: (MK_TILE + 1) * E floats */
    int rc;
    err e;
    pthread_mutex_t mu;
} states_job;

/* States are processed in tiles of MK_TILE so each row of the transposed
 * router (X floats) is loaded once per tile rather than once per state: the
 * router of an 80b-a3b layer is 4 MB, far beyond the caches. Each z[i][e]
 * still sums over k in order, so the result does not depend on the tiling. */
#define MK_TILE 16

/* y[i] += a[i] * x for i < n: a multiply then an add per element, in the
 * same order whether done 8 at a time or one at a time, so the result is
 * bit-identical to the scalar loop (-O2 does not vectorize it by itself). */
static void axpy(float *y, const float *a, float x, int64_t n)
{
    int64_t i = 0;
#if defined(__GNUC__)
    typedef float v8 __attribute__((vector_size(32)));
    const v8 xv = { x, x, x, x, x, x, x, x };
    for (; i + 8 <= n; i += 8) {
        v8 yv, av;
        memcpy(&yv, y + i, sizeof yv);
        memcpy(&av, a + i, sizeof av);
        yv += av * xv;
        memcpy(y + i, &yv, sizeof yv);
    }
#endif
    for (; i < n; i++) y[i] += a[i] * x;
}

static void states_worker(void *ctx, int ith, int nth)
{
    states_job *j = ctx;
    const mk_cfg *c = &j->p->c;
    const int64_t E = c->n_embd, X = c->n_expert;
    long lo, hi;
    tpool_split(j->n_states, ith, nth, &lo, &hi);
    uint8_t *bytes = j->bytes + (size_t)ith * j->embd->row_bytes;
    float *xs = j->rows + (size_t)ith * (MK_TILE + 1) * (size_t)E;   /* MK_TILE states + scratch */
    for (long i0 = lo; i0 < hi; i0 += MK_TILE) {
        int nt = hi - i0 < MK_TILE ? (int)(hi - i0) : MK_TILE;
        for (int s = 0; s < nt; s++) {
            long i = i0 + s;
            float *x = xs + (size_t)s * (size_t)E, *tmp = xs + (size_t)MK_TILE * (size_t)E;
            randw_rng r = randw_stream(j->key, (uint64_t)i);
            int64_t tok = (int64_t)(randw_next(&r) % (uint64_t)c->n_vocab);
            err e = {0};
            if (row_values(j->p, j->embd, tok, bytes, tmp, &e)) {
                pthread_mutex_lock(&j->mu);
                if (!j->rc) { j->rc = e.code; j->e = e; }
                pthread_mutex_unlock(&j->mu);
                return;
            }
            double ss = 0;
            for (int64_t k = 0; k < E; k++) ss += (double)tmp[k] * tmp[k];
            float scale = (float)(1.0 / sqrt(ss / E + 1e-6));   /* RMSNorm, eps 1e-6 */
            for (int64_t k = 0; k < E; k++) x[k] = tmp[k] * scale * j->norm[k];
            float ch = 0;
            for (int64_t k = E - c->skew_dims; k < E; k++) ch += x[k];
            j->chan[i] = c->skew_dims ? ch / sqrtf((float)c->skew_dims) : 0;
            memset(j->z + (size_t)i * (size_t)X, 0, (size_t)X * sizeof *j->z);
        }
        for (int64_t k = 0; k < E; k++) {
            const float *rk = j->rt + (size_t)k * (size_t)X;
            for (int s = 0; s < nt; s++)
                axpy(j->z + (size_t)(i0 + s) * (size_t)X, rk, xs[(size_t)s * (size_t)E + (size_t)k], X);
        }
    }
}

/* Layer-0 router logits (random part only) for n synthetic hidden states. */
static int sample_states(const mk_plan *p, tpool *pool, const float *rt, const float *norm, int n, uint64_t key,
                         float *z, float *chan, err *e)
{
    int nth = tpool_size(pool);
    states_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.embd = &p->t[0];
    j.rt = rt;
    j.norm = norm;
    j.n_states = n;
    j.key = key;
    j.z = z;
    j.chan = chan;
    j.bytes = malloc((size_t)nth * j.embd->row_bytes);
    j.rows = malloc((size_t)nth * (MK_TILE + 1) * (size_t)p->c.n_embd * sizeof *j.rows);
    pthread_mutex_init(&j.mu, NULL);
    int rc = 0;
    if (!j.bytes || !j.rows) rc = err_setf(e, ERR_NOMEM, "mkmodel: out of memory");
    else {
        tpool_run(pool, states_worker, &j);
        if (j.rc) rc = err_setf(e, j.rc, "routing estimate: %s", j.e.msg);
    }
    pthread_mutex_destroy(&j.mu);
    free(j.bytes);
    free(j.rows);
    return rc;
}

static const mk_tensor *find_tensor(const mk_plan *p, const char *name)
{
    for (int i = 0; i < p->n_t; i++)
        if (!strcmp(p->t[i].name, name)) return &p->t[i];
    return NULL;
}

/* Fit the router offsets (route_skew > 0) and estimate layer 0's popularity. */
static int route_setup(mk_plan *p, tpool *pool, skew_pop *pop, err *e)
{
    const mk_cfg *c = &p->c;
    const int64_t E = c->n_embd, X = c->n_expert;
    if (E * X > MK_ROUTE_MAX_FLOATS) {   /* the router sample would not fit comfortably */
        if (c->skew > 0)
            return err_setf(e, ERR_USAGE, "--route-skew supports n_embd x n_expert up to %d (got %lld)",
                            MK_ROUTE_MAX_FLOATS, (long long)(E * X));
        return 0;   /* no estimate: pop stays zeroed, n_states 0 */
    }
    const mk_tensor *router = find_tensor(p, "blk.0.ffn_gate_inp.weight");
    const mk_tensor *fnorm = find_tensor(p, "blk.0.ffn_norm.weight");
    float *rt = malloc((size_t)E * (size_t)X * sizeof *rt);
    float *row = malloc((size_t)E * sizeof *row);
    float *norm = malloc((size_t)E * sizeof *norm);
    /* Keep the logit sample under 64 MB: 4096 states up to 4096 experts. */
    const int n_rep = X > 4096 ? (int)((1 << 24) / X > 256 ? (1 << 24) / X : 256) : MK_STATES_REPORT;
    const int n_fit = n_rep < MK_STATES_FIT ? n_rep : MK_STATES_FIT;
    float *z = malloc((size_t)n_rep * (size_t)X * sizeof *z);
    float *chan = malloc((size_t)n_rep * sizeof *chan);
    float *off0 = malloc((size_t)X * sizeof *off0);
    float *by_rank = malloc((size_t)X * sizeof *by_rank);
    int32_t *rank = malloc((size_t)X * sizeof *rank);
    int rc = 0;
    if (!rt || !row || !norm || !z || !chan || !off0 || !by_rank || !rank || !router || !fnorm) {
        rc = err_setf(e, ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    for (int64_t x = 0; x < X; x++) {        /* random part: router_off is still NULL */
        float_row(p, router, x, row);
        for (int64_t k = 0; k < E; k++) rt[(size_t)k * (size_t)X + (size_t)x] = row[k];
    }
    float_row(p, fnorm, 0, norm);
    const uint64_t skey = randw_mix(c->seed ^ 0x5eed5747e5ull);
    if (c->skew > 0) {
        p->router_off = calloc((size_t)c->n_layer * (size_t)X, sizeof *p->router_off);
        if (!p->router_off) { rc = err_setf(e, ERR_NOMEM, "mkmodel: out of memory"); goto done; }
        rc = sample_states(p, pool, rt, norm, n_fit, skey, z, chan, e);
        if (rc) goto done;
        double cm = 0;
        for (int i = 0; i < n_fit; i++) cm += chan[i];
        p->channel_mean = (float)(cm / n_fit);
        if (!(p->channel_mean > 0)) { rc = err_setf(e, ERR_INTERNAL, "route skew: no channel signal"); goto done; }
        for (int i = 0; i < n_fit; i++) chan[i] /= p->channel_mean;
        /* Each layer ranks its experts by its own permutation. */
        for (int l = 0; l < c->n_layer; l++) {
            randw_rng r = randw_stream(randw_mix(c->seed ^ 0x7a9f3e11ull), (uint64_t)l);
            for (int64_t x = 0; x < X; x++) rank[x] = (int32_t)x;
            for (int64_t x = X - 1; x > 0; x--) {
                int64_t y = (int64_t)(randw_next(&r) % (uint64_t)(x + 1));
                int32_t tmp = rank[x]; rank[x] = rank[y]; rank[y] = tmp;
            }
            if (l == 0) {
                rc = skew_fit(z, chan, n_fit, (int)X, c->n_used, c->skew, rank, off0, e);
                if (rc) goto done;
                /* off0 by expert -> by rank (into by_rank), on a 1/256 grid
                 * so libm's last bits never reach the file. */
                for (int64_t x = 0; x < X; x++) by_rank[rank[x]] = floorf(off0[x] * 256.0f + 0.5f) / 256.0f;
            }
            float *ol = p->router_off + (size_t)l * (size_t)X;
            for (int64_t x = 0; x < X; x++) ol[x] = by_rank[rank[x]];
        }
    }
    /* The estimate: an independent sample, routed with layer 0's final router. */
    rc = sample_states(p, pool, rt, norm, n_rep, randw_mix(skey + 1), z, chan, e);
    if (rc) goto done;
    if (p->router_off) {
        for (int i = 0; i < n_rep; i++) chan[i] /= p->channel_mean;
        rc = skew_measure(z, chan, n_rep, (int)X, c->n_used, p->router_off, pop, e);
    } else {
        rc = skew_measure(z, NULL, n_rep, (int)X, c->n_used, NULL, pop, e);
    }
done:
    free(rt); free(row); free(norm); free(z); free(chan); free(off0); free(by_rank); free(rank);
    return rc;
}

/* ==== Metadata ==== */

static int write_metadata(gguf_writer *w, const mk_plan *p, const bpe_vocab *v, err *e)
{
    const mk_cfg *c = &p->c;
    int quantized = 0;
    for (int i = 0; i < p->n_t; i++) quantized |= !is_float_type(p->t[i].type);
    char name[96];
    snprintf(name, sizeof name, "strata synthetic %s (seed %llu)", c->preset, (unsigned long long)c->seed);
    int32_t bos = v->n_tokens - v->n_pad - MK_N_SPECIALS;   /* <|endoftext|> */
    int32_t eos = bos + 2;                                 /* <|im_end|> */
    int rc = 0;
    rc |= gguf_writer_set_str(w, "general.architecture", MK_ARCH);
    rc |= gguf_writer_set_str(w, "general.type", "model");
    rc |= gguf_writer_set_str(w, "general.name", name);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".block_count", (uint32_t)c->n_layer);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".context_length", (uint32_t)c->n_ctx);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".embedding_length", (uint32_t)c->n_embd);
    /* The dense FFN width a same-size dense model would have (Qwen3-30B-A3B: 6144 = 768 x 8). */
    rc |= gguf_writer_set_u32(w, MK_ARCH ".feed_forward_length", (uint32_t)c->n_ff * (uint32_t)c->n_used);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".attention.head_count", (uint32_t)c->n_head);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".attention.head_count_kv", (uint32_t)c->n_head_kv);
    rc |= gguf_writer_set_f32(w, MK_ARCH ".rope.freq_base", 1000000.0f);
    rc |= gguf_writer_set_f32(w, MK_ARCH ".attention.layer_norm_rms_epsilon", 1e-6f);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".expert_used_count", (uint32_t)c->n_used);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".attention.key_length", (uint32_t)c->head_dim);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".attention.value_length", (uint32_t)c->head_dim);
    rc |= gguf_writer_set_u32(w, "general.file_type", ftype_of(c));
    rc |= gguf_writer_set_u32(w, MK_ARCH ".expert_count", (uint32_t)c->n_expert);
    rc |= gguf_writer_set_u32(w, MK_ARCH ".expert_feed_forward_length", (uint32_t)c->n_ff);
    if (quantized) rc |= gguf_writer_set_u32(w, "general.quantization_version", 2);
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, NULL, (uint64_t)v->n_tokens);
    rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n_tokens);
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, NULL, (uint64_t)v->n_merges);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)bos);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
    rc |= gguf_writer_set_str(w, "tokenizer.chat_template", k_chat_template);
    /* Provenance (llama.cpp ignores keys it does not know). */
    rc |= gguf_writer_set_str(w, "strata.mkmodel.preset", c->preset);
    rc |= gguf_writer_set_u64(w, "strata.mkmodel.seed", c->seed);
    rc |= gguf_writer_set_f32(w, "strata.mkmodel.route_skew", (float)c->skew);
    if (rc) return err_setf(e, ERR_NOMEM, "mkmodel: out of memory setting metadata");
    for (int i = 0; i < p->n_t; i++) {
        const mk_tensor *t = &p->t[i];
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, e);
        if (rc) return rc;
    }
    return 0;
}

/* ==== Streaming ==== */

/* The writer thread appends one chunk at a time while the pool fills the next. */
typedef struct wstream {
    gguf_writer *w;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const uint8_t *job;
    uint64_t job_n;
    int busy, quit, rc;
    err e;
} wstream;

static void *writer_main(void *arg)
{
    wstream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->busy && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->busy && s->quit) break;
        const uint8_t *p = s->job;
        uint64_t n = s->job_n;
        int failed = s->rc;
        pthread_mutex_unlock(&s->mu);
        int rc = failed ? 0 : gguf_writer_write(s->w, p, n, &s->e);
        pthread_mutex_lock(&s->mu);
        if (rc && !s->rc) s->rc = rc;
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Wait until the writer is idle; returns its first error. */
static int ws_wait(wstream *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->cv, &s->mu);
    int rc = s->rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void ws_submit(wstream *s, const uint8_t *p, uint64_t n)
{
    pthread_mutex_lock(&s->mu);
    s->job = p;
    s->job_n = n;
    s->busy = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

typedef struct gen_job {
    const mk_plan *p;
    const mk_tensor *t;
    int64_t row0, n_rows;
    uint8_t *dst;
    float *scratch;        /* nth * max_ne0 floats */
} gen_job;

static void gen_worker(void *ctx, int ith, int nth)
{
    gen_job *j = ctx;
    long lo, hi;
    tpool_split((long)j->n_rows, ith, nth, &lo, &hi);
    float *scratch = j->scratch + (size_t)ith * (size_t)j->p->max_ne0;
    for (long r = lo; r < hi; r++)
        gen_row(j->p, j->t, j->row0 + r, j->dst + (uint64_t)r * j->t->row_bytes, scratch);
}

static int stream_data(const mk_plan *p, gguf_writer *w, tpool *pool, int show_progress, err *e)
{
    const int nth = tpool_size(pool);
    uint64_t max_row = 0;
    for (int i = 0; i < p->n_t; i++)
        if (p->t[i].row_bytes > max_row) max_row = p->t[i].row_bytes;
    uint64_t cap = p->total_bytes < MK_CHUNK_BYTES ? p->total_bytes : MK_CHUNK_BYTES;
    if (cap < max_row) cap = max_row;
    uint8_t *buf[2] = { malloc(cap), malloc(cap) };
    float *scratch = malloc((size_t)nth * (size_t)p->max_ne0 * sizeof *scratch);
    wstream ws;
    memset(&ws, 0, sizeof ws);
    ws.w = w;
    pthread_mutex_init(&ws.mu, NULL);
    pthread_cond_init(&ws.cv, NULL);
    int rc = 0, started = 0;
    if (!buf[0] || !buf[1] || !scratch) rc = err_setf(e, ERR_NOMEM, "mkmodel: out of memory for %llu-byte chunks",
                                                      (unsigned long long)cap);
    else if (pthread_create(&ws.th, NULL, writer_main, &ws)) rc = err_setf(e, ERR_NOMEM, "mkmodel: cannot start the writer thread");
    else started = 1;
    progress *bar = NULL;
    if (rc == 0 && show_progress && progress_open(&bar, "mkmodel", p->total_bytes, stderr))
        bar = NULL;   /* no memory for a progress bar: go on without one */
    uint64_t done = 0;
    int cur = 0, ti = 0;
    int64_t row = 0;
    while (rc == 0 && ti < p->n_t) {
        uint64_t fill = 0;
        while (ti < p->n_t) {      /* fill one chunk with whole rows of consecutive tensors */
            const mk_tensor *t = &p->t[ti];
            if (row == t->n_rows) { ti++; row = 0; continue; }
            int64_t fit = (int64_t)((cap - fill) / t->row_bytes);
            if (fit == 0) break;
            int64_t n = t->n_rows - row < fit ? t->n_rows - row : fit;
            gen_job j = { p, t, row, n, buf[cur] + fill, scratch };
            if ((uint64_t)n * t->row_bytes < (64u << 10)) gen_worker(&j, 0, 1);
            else tpool_run(pool, gen_worker, &j);
            fill += (uint64_t)n * t->row_bytes;
            row += n;
        }
        if (fill == 0) continue;
        rc = ws_wait(&ws);
        if (rc) break;
        ws_submit(&ws, buf[cur], fill);
        cur ^= 1;
        done += fill;
        if (bar) {
            progress_set_label(bar, p->t[ti < p->n_t ? ti : p->n_t - 1].name);
            progress_update(bar, done);
        }
    }
    if (started) {
        int wrc = ws_wait(&ws);
        pthread_mutex_lock(&ws.mu);
        ws.quit = 1;
        pthread_cond_broadcast(&ws.cv);
        pthread_mutex_unlock(&ws.mu);
        pthread_join(ws.th, NULL);
        if (!rc && wrc) rc = err_setf(e, wrc, "%s", ws.e.msg);
    }
    if (bar && rc == 0) progress_set_label(bar, "mkmodel");
    progress_close(bar);
    pthread_mutex_destroy(&ws.mu);
    pthread_cond_destroy(&ws.cv);
    free(buf[0]);
    free(buf[1]);
    free(scratch);
    return rc;
}

/* ==== Entry point ==== */

/* Quantized float rows go through quant_quantize: make sure it works for
 * every such type before the workers rely on it. */
static int probe_types(const mk_plan *p, err *e)
{
    float *x = calloc((size_t)p->max_ne0, sizeof *x);
    uint8_t *y = malloc((size_t)p->max_ne0 * 4 + 64);
    int rc = (!x || !y) ? err_setf(e, ERR_NOMEM, "mkmodel: out of memory") : 0;
    for (int i = 0; rc == 0 && i < p->n_t; i++) {
        const mk_tensor *t = &p->t[i];
        if (needs_floats(p, t) && !is_float_type(t->type))
            rc = quant_quantize(t->type, x, y, t->ne[0], e);
    }
    free(x);
    free(y);
    return rc;
}

static void report_types(FILE *f, const mk_plan *p)
{
    const mk_cfg *c = &p->c;
    if (c->mix >= 0) {
        /* matrices by type, in qtype id order */
        fprintf(f, "  types    %s as llama-quantize picks them:", quantize_ftype_name(c->mix));
        const char *sep = " ";
        for (int t = 0; t < QTYPE_MAX_ID; t++) {
            int n = 0;
            for (int i = 0; i < p->n_t; i++)
                n += p->t[i].type == t && p->t[i].kind != MK_NORM && p->t[i].kind != MK_ROUTER;
            if (n) fprintf(f, "%s%s %d", sep, qtype_name(t), n);
            if (n) sep = ", ";
        }
        fprintf(f, " matrices; router %s, norms f32\n", qtype_name(c->t_router));
    } else
        fprintf(f, "  types    experts %s, attention %s, embeddings %s, output %s, router %s, norms f32\n",
                qtype_name(c->t_exp), qtype_name(c->t_attn), qtype_name(c->t_embd),
                c->tied ? "(tied)" : qtype_name(c->t_out), qtype_name(c->t_router));
    /* Fallbacks, grouped by (wanted, got, row length). */
    for (int i = 0; i < p->n_t; i++) {
        const mk_tensor *t = &p->t[i];
        if (t->type == t->want_type || t->kind == MK_NORM) continue;
        int seen = 0, count = 0;
        for (int k = 0; k < p->n_t; k++) {
            const mk_tensor *u = &p->t[k];
            if (u->kind == MK_NORM || u->type == u->want_type) continue;
            if (u->want_type == t->want_type && u->type == t->type && u->ne[0] == t->ne[0]) {
                if (k < i) seen = 1;
                count++;
            }
        }
        if (!seen)
            fprintf(f, "  fallback %d tensors with rows of %lld: %s -> %s (as llama-quantize does), e.g. %s\n",
                    count, (long long)t->ne[0], qtype_name(t->want_type), qtype_name(t->type), t->name);
    }
}

int strata_mkmodel(const mkmodel_opts *o, FILE *report, err *e)
{
    if (!o || !o->path || !*o->path) return err_setf(e, ERR_USAGE, "no output path");
    mk_plan p;
    memset(&p, 0, sizeof p);
    int rc = resolve(o, &p.c, e);
    if (rc) return rc;
    const double t0 = timer_ms();
    bpe_vocab v;
    memset(&v, 0, sizeof v);
    gguf_writer *w = NULL;
    tpool *pool = NULL;
    skew_pop pop;
    memset(&pop, 0, sizeof pop);

    size_t corpus_len = 0;
    const char *corpus = mkmodel_corpus(&corpus_len);
    bpe_opts bo = { .pre = "qwen2", .n_vocab = p.c.n_vocab, .specials = k_specials,
                    .special_types = k_special_types, .n_specials = MK_N_SPECIALS };
    rc = bpe_train(corpus, corpus_len, &bo, &v, e);
    if (rc) { err_prefix(e, "vocabulary: "); goto done; }
    const double t_vocab = timer_ms();

    rc = plan_build(&p, e);
    if (rc == 0) rc = probe_types(&p, e);
    int nth = o->n_threads > 0 ? o->n_threads : cpu_count();
    if (rc == 0) rc = tpool_open(&pool, nth, e);
    if (rc == 0) rc = route_setup(&p, pool, &pop, e);
    const double t_route = timer_ms();
    if (rc == 0 && !(w = gguf_writer_new())) rc = err_setf(e, ERR_NOMEM, "mkmodel: out of memory");
    if (rc == 0) rc = write_metadata(w, &p, &v, e);
    if (rc == 0) rc = gguf_writer_begin(w, o->path, e);
    const double t_data = timer_ms();
    if (rc == 0) rc = stream_data(&p, w, pool, o->progress, e);
    if (rc == 0) rc = gguf_writer_finish(w, e);
    const double t_end = timer_ms();

    if (rc == 0 && report) {
        const mk_cfg *c = &p.c;
        uint64_t file_bytes = 0;
        FILE *f = fopen(o->path, "rb");
        if (f && fseek(f, 0, SEEK_END) == 0) file_bytes = (uint64_t)ftell(f);
        if (f) fclose(f);
        double secs = (t_end - t0) / 1e3;
        fprintf(report, "mkmodel: wrote %s (%s, preset %s, seed %llu)\n", o->path, MK_ARCH, c->preset,
                (unsigned long long)c->seed);
        fprintf(report, "  shape    %d layers, %d experts (top-%d), n_embd %d, %d/%d heads x %d, expert ff %d, "
                "ctx %d%s\n", c->n_layer, c->n_expert, c->n_used, c->n_embd, c->n_head, c->n_head_kv,
                c->head_dim, c->n_ff, c->n_ctx, c->tied ? ", tied embeddings" : "");
        fprintf(report, "  vocab    %d tokens: 256 bytes + %d learned + %d special + %d padding; %lld merges "
                "(%.2f s)\n", v.n_tokens, v.n_learned, MK_N_SPECIALS, v.n_pad, (long long)v.n_merges,
                (t_vocab - t0) / 1e3);
        report_types(report, &p);
        fprintf(report, "  size     %.3f GB in %d tensors; experts %.3f GB (%.1f%%)\n", file_bytes / 1e9, p.n_t,
                p.expert_bytes / 1e9, file_bytes ? 100.0 * p.expert_bytes / file_bytes : 0.0);
        fprintf(report, "  time     %.2f s total, data %.2f s (%.2f GB/s written, %d threads)\n", secs,
                (t_end - t_data) / 1e3, t_end > t_data ? file_bytes / 1e9 / ((t_end - t_data) / 1e3) : 0.0, nth);
        if (pop.n_states == 0) {
            fprintf(report, "  routing  no estimate (n_embd x n_expert too large to sample)\n");
        } else {
            fprintf(report, "  routing  layer 0, %d synthetic states%s: top 1%% of experts (%d) get %.1f%% of "
                    "selections, top 10%% (%d) %.1f%%, top 50%% (%d) %.1f%%; fitted Zipf exponent %.2f "
                    "(asked %.2f); most popular expert in %.1f%% of tokens (%.2f s)\n",
                    pop.n_states, c->skew > 0 ? "" : ", no skew", pop.n_top1, 100 * pop.share_top1, pop.n_top10,
                    100 * pop.share_top10, pop.n_top50, 100 * pop.share_top50, pop.exponent, c->skew,
                    100 * pop.max_token_frac, (t_route - t_vocab) / 1e3);
        }
    }
done:
    gguf_writer_free(w);
    tpool_close(pool);
    bpe_vocab_free(&v);
    free(p.t);
    free(p.router_off);
    return rc;
}

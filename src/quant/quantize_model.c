/* quantize_model: the `strata quantize` job (see quantize_model.h).
 *
 * What it owns: the choice of each tensor's output type (a C transcription
 * of llama.cpp's tensor_allows_quantization, llama_tensor_get_type_impl and
 * tensor_type_fallback, restricted to the file types strata writes and to
 * quantizing without an importance matrix), and the streaming conversion:
 * read a chunk of rows, convert them to f32 if needed, quantize them in
 * parallel, append them to the writer.
 *
 * It does not parse or write GGUF itself (gguf.h, gguf_write.h) and holds at
 * most one chunk of one tensor in memory (input and output buffers of about
 * 16 MiB each, plus one f32 row per thread). The quantizers are per-row pure
 * functions, so the output does not depend on the thread count or the
 * chunking. */
#include "quant/quantize_model.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf/gguf.h"
#include "gguf/gguf_write.h"
#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/cpu.h"
#include "util/progress.h"
#include "util/threadpool.h"
#include "util/timer.h"

/* ==== File types (llama.h llama_ftype) ==== */

enum {
    FT_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9,
    FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15,
    FT_Q5_K_S = 16, FT_Q5_K_M = 17, FT_Q6_K = 18, FT_BF16 = 32,
};

typedef struct ftype_info {
    const char *name;
    int ftype;
    int base;      /* default tensor type (llama_ftype_get_default_type) */
} ftype_info;

/* In llama-quantize's listing order; aliases after the canonical names. */
static const ftype_info k_ftypes[] = {
    { "Q4_0", FT_Q4_0, QTYPE_Q4_0 },     { "Q4_1", FT_Q4_1, QTYPE_Q4_1 },
    { "Q5_0", FT_Q5_0, QTYPE_Q5_0 },     { "Q5_1", FT_Q5_1, QTYPE_Q5_1 },
    { "Q2_K", FT_Q2_K, QTYPE_Q2_K },
    { "Q3_K_S", FT_Q3_K_S, QTYPE_Q3_K }, { "Q3_K_M", FT_Q3_K_M, QTYPE_Q3_K }, { "Q3_K_L", FT_Q3_K_L, QTYPE_Q3_K },
    { "Q4_K_S", FT_Q4_K_S, QTYPE_Q4_K }, { "Q4_K_M", FT_Q4_K_M, QTYPE_Q4_K },
    { "Q5_K_S", FT_Q5_K_S, QTYPE_Q5_K }, { "Q5_K_M", FT_Q5_K_M, QTYPE_Q5_K },
    { "Q6_K", FT_Q6_K, QTYPE_Q6_K },     { "Q8_0", FT_Q8_0, QTYPE_Q8_0 },
    { "F16", FT_F16, QTYPE_F16 },        { "BF16", FT_BF16, QTYPE_BF16 }, { "F32", FT_F32, QTYPE_F32 },
    /* aliases, as llama-quantize accepts them */
    { "Q3_K", FT_Q3_K_M, QTYPE_Q3_K },   { "Q4_K", FT_Q4_K_M, QTYPE_Q4_K }, { "Q5_K", FT_Q5_K_M, QTYPE_Q5_K },
};
#define N_FTYPES ((int)(sizeof k_ftypes / sizeof k_ftypes[0]))
#define N_CANONICAL 17

static const ftype_info *ftype_by_name(const char *name)
{
    for (int i = 0; name && i < N_FTYPES; i++)
        if (strcasecmp(k_ftypes[i].name, name) == 0) return &k_ftypes[i];
    return NULL;
}

int quantize_ftype_from_name(const char *name)
{
    const ftype_info *f = ftype_by_name(name);
    return f ? f->ftype : -1;
}

const char *quantize_ftype_name(int ftype)
{
    for (int i = 0; i < N_CANONICAL; i++)
        if (k_ftypes[i].ftype == ftype) return k_ftypes[i].name;
    return "?";
}

const char *quantize_type_names(void)
{
    return "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, "
           "Q5_K_S, Q5_K_M, Q6_K, Q8_0, F16, BF16, F32";
}

/* ==== Tensor categories (llama-quant.cpp tensor_get_category) ==== */

enum category {
    CAT_TOKEN_EMBD, CAT_ATTN_Q, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_QKV, CAT_ATTN_KV_B,
    CAT_ATTN_OUTPUT, CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN, CAT_OUTPUT, CAT_OTHER,
};

static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static int is_token_embd(const char *n)
{
    return !strcmp(n, "token_embd.weight") || !strcmp(n, "per_layer_token_embd.weight");
}

static enum category category_of(const char *n)
{
    if (!strcmp(n, "output.weight")) return CAT_OUTPUT;
    if (is_token_embd(n)) return CAT_TOKEN_EMBD;
    if (has(n, "attn_qkv.weight")) return CAT_ATTN_QKV;
    if (has(n, "attn_kv_b.weight")) return CAT_ATTN_KV_B;
    if (has(n, "attn_v.weight")) return CAT_ATTN_V;
    if (has(n, "attn_k.weight")) return CAT_ATTN_K;
    if (has(n, "attn_q.weight")) return CAT_ATTN_Q;
    if (has(n, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (has(n, "ffn_up")) return CAT_FFN_UP;
    if (has(n, "ffn_gate")) return CAT_FFN_GATE;
    if (has(n, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

static int is_attn_v_like(enum category c)
{
    return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B;
}

/* tensor_allows_quantization (quantize_output_tensor = true, no only_copy). */
static int allows_quantization(const char *n, int n_dims)
{
    if (n_dims < 2) return 0;
    const size_t len = strlen(n);
    if (len < 6 || strcmp(n + len - 6, "weight") != 0) return 0;
    static const char *const k_never[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
        "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
        "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
        "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
        "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
        "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
        "mm.a.code_embd",
    };
    for (size_t i = 0; i < sizeof k_never / sizeof k_never[0]; i++)
        if (has(n, k_never[i])) return 0;
    if (!strcmp(n, "position_embd.weight") || !strcmp(n, "token_types.weight")) return 0;
    return 1;
}

/* ==== Type selection (llama_tensor_get_type) ==== */

typedef struct model_facts {
    char     arch[64];
    int      n_layer;          /* {arch}.block_count */
    int      n_expert;         /* {arch}.expert_count, 0 if absent */
    int      n_gqa;            /* n_head / n_head_kv of layer 0, 0 if unknown */
    int      is_falcon;
    int      is_70b;           /* llama arch, 80 layers, GQA: llama.cpp's LLM_TYPE_70B */
    int      tied_embeddings;  /* no output.weight tensor */
    int      n_attention_wv;   /* attn_v-like tensors in the file */
} model_facts;

typedef struct select_state {
    int i_attention_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
    int n_fallback;
} select_state;

static int use_more_bits(int i_layer, int n_layers)
{
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

/* "blk.%d." as sscanf reads it: 1 and *layer on a match. */
static int parse_layer(const char *n, int *layer)
{
    if (strncmp(n, "blk.", 4) != 0) return 0;
    char *end;
    long v = strtol(n + 4, &end, 10);
    if (end == n + 4 || v < INT32_MIN || v > INT32_MAX) return 0;
    *layer = (int)v;
    return 1;
}

/* layer_info: for MoE models the layer comes from the name (experts may be
 * stored in any order); otherwise it is the running counter. */
static int layer_info(const model_facts *m, int counter, const char *name, int *i_layer, int *n_layer, err *e)
{
    *i_layer = counter;
    *n_layer = m->n_layer;
    if (m->n_expert > 1) {
        if (!parse_layer(name, i_layer))
            return err_setf(e, ERR_FORMAT, "tensor %s: cannot determine its layer (expected blk.N.)", name);
        if (*i_layer < 0 || *i_layer >= m->n_layer)
            return err_setf(e, ERR_FORMAT, "tensor %s: layer %d outside [0, %d)", name, *i_layer, m->n_layer);
    }
    return 0;
}

/* llama_tensor_get_type_impl for the non-IQ file types. */
static int mix_type(const model_facts *m, select_state *s, int ftype, int new_type, const char *name,
                    int64_t ne0, enum category cat, err *e)
{
    int i_layer, n_layer, rc;
    if (cat == CAT_OUTPUT || (m->tied_embeddings && cat == CAT_TOKEN_EMBD)) {
        if (m->is_falcon || ne0 % qtype_get(new_type)->blck != 0) new_type = QTYPE_Q8_0;
        else if (new_type != QTYPE_Q8_0) new_type = QTYPE_Q6_K;
    } else if (cat == CAT_TOKEN_EMBD) {
        /* only the IQ / TQ file types change token_embd */
    } else if (is_attn_v_like(cat)) {
        if (ftype == FT_Q2_K) new_type = m->n_gqa >= 4 ? QTYPE_Q4_K : QTYPE_Q3_K;
        else if (ftype == FT_Q3_K_M) new_type = s->i_attention_wv < 2 ? QTYPE_Q5_K : QTYPE_Q4_K;
        else if (ftype == FT_Q3_K_L) new_type = QTYPE_Q5_K;
        else if ((ftype == FT_Q4_K_M || ftype == FT_Q5_K_M) && use_more_bits(s->i_attention_wv, m->n_attention_wv))
            new_type = QTYPE_Q6_K;
        else if (ftype == FT_Q4_K_S && s->i_attention_wv < 4) new_type = QTYPE_Q5_K;
        if (m->is_70b && (new_type == QTYPE_Q3_K || new_type == QTYPE_Q4_K)) new_type = QTYPE_Q5_K;
        if (m->n_expert == 8) new_type = QTYPE_Q8_0;
        s->i_attention_wv++;
    } else if (cat == CAT_ATTN_K) {
        if (m->n_expert == 8) new_type = QTYPE_Q8_0;
    } else if (cat == CAT_ATTN_Q) {
        /* only IQ3_XS / IQ3_XXS */
    } else if (cat == CAT_FFN_DOWN) {
        if ((rc = layer_info(m, s->i_ffn_down, name, &i_layer, &n_layer, e))) return rc;
        if (ftype == FT_Q2_K) new_type = QTYPE_Q3_K;
        else if (ftype == FT_Q3_K_M)
            new_type = i_layer < n_layer / 16 ? QTYPE_Q5_K
                     : !m->is_falcon || use_more_bits(i_layer, n_layer) ? QTYPE_Q4_K : QTYPE_Q3_K;
        else if (ftype == FT_Q3_K_L) new_type = m->is_falcon ? QTYPE_Q4_K : QTYPE_Q5_K;
        else if (ftype == FT_Q4_K_M) {
            if (m->is_falcon)
                new_type = i_layer < n_layer / 16 ? QTYPE_Q6_K : use_more_bits(i_layer, n_layer) ? QTYPE_Q5_K : QTYPE_Q4_K;
            else if (use_more_bits(i_layer, n_layer)) new_type = QTYPE_Q6_K;
        } else if (ftype == FT_Q5_K_M && use_more_bits(i_layer, n_layer)) new_type = QTYPE_Q6_K;
        else if (ftype == FT_Q4_K_S && !m->is_falcon && i_layer < n_layer / 8) new_type = QTYPE_Q5_K;
        s->i_ffn_down++;
    } else if (cat == CAT_ATTN_OUTPUT) {
        if (!m->is_falcon) {
            if (m->n_expert == 8) {
                if (ftype == FT_Q2_K || ftype == FT_Q3_K_S || ftype == FT_Q3_K_M || ftype == FT_Q4_K_S || ftype == FT_Q4_K_M)
                    new_type = QTYPE_Q5_K;
            } else {
                if (ftype == FT_Q2_K) new_type = QTYPE_Q3_K;
                else if (ftype == FT_Q3_K_M) new_type = QTYPE_Q4_K;
                else if (ftype == FT_Q3_K_L) new_type = QTYPE_Q5_K;
            }
        } else if (ftype == FT_Q3_K_L) {
            new_type = QTYPE_Q4_K;
        }
    } else if (cat == CAT_ATTN_QKV) {
        /* unreachable (attn_v-like above), kept as llama.cpp has it */
        if (ftype == FT_Q3_K_M || ftype == FT_Q3_K_L) new_type = QTYPE_Q4_K;
        else if (ftype == FT_Q4_K_M) new_type = QTYPE_Q5_K;
        else if (ftype == FT_Q5_K_M) new_type = QTYPE_Q6_K;
    } else if (cat == CAT_FFN_GATE) {
        /* only IQ3_XS changes gates, but the layer lookup can still fail */
        if ((rc = layer_info(m, s->i_ffn_gate, name, &i_layer, &n_layer, e))) return rc;
        s->i_ffn_gate++;
    } else if (cat == CAT_FFN_UP) {
        if ((rc = layer_info(m, s->i_ffn_up, name, &i_layer, &n_layer, e))) return rc;
        s->i_ffn_up++;
    }
    return new_type;
}

static int is_quantized(int t)
{
    return t != QTYPE_F32 && t != QTYPE_F16 && t != QTYPE_BF16 && qtype_get(t) && qtype_get(t)->blck > 1;
}

/* tensor_type_fallback: rows that do not split into whole blocks. */
static int fallback_type(select_state *s, const char *name, int64_t ne0, int t, err *e)
{
    if (ne0 % qtype_get(t)->blck == 0) return t;
    s->n_fallback++;
    int r;
    switch (t) {
    case QTYPE_Q2_K: case QTYPE_Q3_K: r = QTYPE_Q4_0; break;
    case QTYPE_Q4_K: r = QTYPE_Q5_0; break;
    case QTYPE_Q5_K: r = QTYPE_Q5_1; break;
    case QTYPE_Q6_K: r = QTYPE_Q8_0; break;
    default:
        return err_setf(e, ERR_UNSUPPORTED, "tensor %s: %" PRId64 " columns are not a multiple of %s's block of %d "
                        "and llama.cpp defines no fallback for %s", name, ne0, qtype_name(t), qtype_get(t)->blck,
                        qtype_name(t));
    }
    if (ne0 % qtype_get(r)->blck != 0) r = QTYPE_F16;
    return r;
}

/* The output type of one tensor (n_dims dimensions, rows of ne0, stored as
 * in_type): the input type when it is not quantized. */
static int select_type(const model_facts *m, select_state *s, int ftype, int base, int pure,
                       const char *name, int n_dims, int64_t ne0, int in_type, err *e)
{
    if (!allows_quantization(name, n_dims)) return in_type;
    int t = base;
    if (is_quantized(base)) {
        if (!pure) {
            t = mix_type(m, s, ftype, t, name, ne0, category_of(name), e);
            if (t < 0) return t;
        }
        t = fallback_type(s, name, ne0, t, e);
    }
    return t;
}

/* The facts that follow from the architecture and head counts. */
static void facts_finish(model_facts *m, int64_t n_head, int64_t n_head_kv)
{
    m->n_gqa = n_head_kv > 0 ? (int)(n_head / n_head_kv) : 0;
    m->is_falcon = !strcmp(m->arch, "falcon");
    m->is_70b = !strcmp(m->arch, "llama") && m->n_layer == 80 && n_head != n_head_kv;
}

/* ==== The picker: the same choice for a model not in a file yet ==== */

struct quantize_picker {
    model_facts m;
    select_state s;
    const ftype_info *ft;
};

int quantize_picker_open(quantize_picker **out, const char *type, const quantize_model_info *mi, err *e)
{
    *out = NULL;
    const ftype_info *ft = ftype_by_name(type);
    if (!ft) return err_setf(e, ERR_USAGE, "unknown file type '%s' (%s)", type ? type : "(null)", quantize_type_names());
    if (!mi->arch || mi->n_layer < 0 || mi->n_expert < 0 || mi->n_head < 0 || mi->n_head_kv < 0 ||
        mi->n_attention_wv < 0)
        return err_setf(e, ERR_USAGE, "quantize_picker_open: incomplete model description");
    quantize_picker *p = calloc(1, sizeof *p);
    if (!p) return err_setf(e, ERR_NOMEM, "quantize_picker_open: out of memory");
    snprintf(p->m.arch, sizeof p->m.arch, "%s", mi->arch);
    p->m.n_layer = mi->n_layer;
    p->m.n_expert = mi->n_expert;
    p->m.tied_embeddings = mi->tied_embeddings ? 1 : 0;
    p->m.n_attention_wv = mi->n_attention_wv;
    facts_finish(&p->m, mi->n_head, mi->n_head_kv);
    p->ft = ft;
    *out = p;
    return 0;
}

int quantize_picker_type(quantize_picker *p, const char *name, int n_dims, int64_t ne0, int in_type, err *e)
{
    return select_type(&p->m, &p->s, p->ft->ftype, p->ft->base, 0, name, n_dims, ne0, in_type, e);
}

void quantize_picker_close(quantize_picker *p) { free(p); }

/* ==== Reading the input ==== */

typedef struct tensor_job {
    int64_t idx;          /* index in the input file */
    char    name[64];
    int     in_type, out_type;
} tensor_job;

static void read_facts(const gguf_file *f, const tensor_job *jobs, int64_t n, model_facts *m)
{
    memset(m, 0, sizeof *m);
    gguf_str a;
    if (gguf_get_str(f, "general.architecture", &a, NULL) == 0) {
        size_t len = a.n < sizeof m->arch - 1 ? (size_t)a.n : sizeof m->arch - 1;
        memcpy(m->arch, a.p, len);
    }
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, "%s.block_count", m->arch);
    if (gguf_get_u32(f, key, &v, NULL) == 0) m->n_layer = (int)v;
    snprintf(key, sizeof key, "%s.expert_count", m->arch);
    if (gguf_get_u32(f, key, &v, NULL) == 0) m->n_expert = (int)v;
    int64_t n_head = 0, n_head_kv = -1, k;
    snprintf(key, sizeof key, "%s.attention.head_count", m->arch);
    if ((k = gguf_find_key(f, key)) >= 0 && gguf_get_arr_i64(f, k, 0, &n_head, NULL) != 0) n_head = 0;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", m->arch);
    if ((k = gguf_find_key(f, key)) < 0 || gguf_get_arr_i64(f, k, 0, &n_head_kv, NULL) != 0) n_head_kv = n_head;
    facts_finish(m, n_head, n_head_kv);
    m->tied_embeddings = 1;
    for (int64_t i = 0; i < n; i++) {
        const enum category c = category_of(jobs[i].name);
        if (is_attn_v_like(c)) m->n_attention_wv++;
        if (c == CAT_OUTPUT) m->tied_embeddings = 0;
    }
}

/* llama_model_loader's weight_name_comparer: tensors outside layers first,
 * then by layer number, then by name. */
static int job_cmp(const void *pa, const void *pb)
{
    const tensor_job *a = pa, *b = pb;
    int la = -1, lb = -1;
    parse_layer(a->name, &la);
    parse_layer(b->name, &lb);
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* ==== Parallel conversion of one chunk of rows ==== */

typedef struct chunk_ctx {
    const uint8_t *in;          /* rows of the input type */
    uint8_t       *out;         /* rows of the output type */
    float         *scratch;     /* n_threads rows of ne0 floats */
    int64_t        n_rows, ne0;
    size_t         in_row, out_row;
    int            in_f32;      /* quantize straight from the input */
    quant_dequant_fn dequant;
    quant_quant_fn   quant;
} chunk_ctx;

static void convert_rows(void *p, int ith, int nth)
{
    chunk_ctx *c = p;
    long lo, hi;
    tpool_split((long)c->n_rows, ith, nth, &lo, &hi);
    float *row = c->scratch + (size_t)ith * (size_t)c->ne0;
    for (long r = lo; r < hi; r++) {
        const uint8_t *src = c->in + (size_t)r * c->in_row;
        const float *x = (const float *)(const void *)src;
        if (!c->in_f32) {
            c->dequant(src, row, c->ne0);
            x = row;
        }
        c->quant(x, c->out + (size_t)r * c->out_row, c->ne0);
    }
}

/* ==== The job ==== */

#define CHUNK_BYTES (16u << 20)

typedef struct qjob {
    const quantize_opts *o;
    gguf_file   *in;
    gguf_writer *w;
    tpool       *pool;
    progress    *bar;
    tensor_job  *jobs;
    int64_t      n;
    uint8_t     *in_buf, *out_buf;
    float       *scratch;
    size_t       in_cap, out_cap, scratch_cap;
    uint64_t     done_bytes;
} qjob;

static int grow(void **p, size_t *cap, size_t need, err *e)
{
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return err_setf(e, ERR_NOMEM, "out of memory allocating %zu bytes", need);
    *p = q;
    *cap = need;
    return 0;
}

static void log_tensor(const qjob *j, int64_t k, const gguf_tensor_info *ti, uint64_t out_bytes)
{
    FILE *lg = j->o->log;
    if (!lg) return;
    char shape[96];
    int len = 0;
    for (int d = 0; d < ti->n_dims; d++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%" PRId64, d ? ", " : "", ti->ne[d]);
    const tensor_job *t = &j->jobs[k];
    fprintf(lg, "[%4" PRId64 "/%4" PRId64 "] %-36s [%s] %s -> %s, %.2f MiB -> %.2f MiB\n", k + 1, j->n, t->name,
            shape, qtype_name(t->in_type), qtype_name(t->out_type), ti->bytes / 1048576.0, out_bytes / 1048576.0);
}

/* Copy or convert tensor k into the writer. */
static int write_tensor(qjob *j, int64_t k, err *e)
{
    const tensor_job *t = &j->jobs[k];
    const gguf_tensor_info *ti = gguf_tensor(j->in, t->idx);
    const uint64_t out_bytes = gguf_writer_tensor_bytes(j->w, k);
    int rc;
    log_tensor(j, k, ti, out_bytes);

    if (t->in_type == t->out_type) {   /* llama.cpp copies such tensors byte for byte */
        for (uint64_t off = 0; off < ti->bytes;) {
            const uint64_t n = ti->bytes - off < CHUNK_BYTES ? ti->bytes - off : CHUNK_BYTES;
            if ((rc = grow((void **)&j->in_buf, &j->in_cap, (size_t)n, e))) return rc;
            if ((rc = gguf_read_tensor(j->in, t->idx, off, j->in_buf, n, e))) return rc;
            if ((rc = gguf_writer_write(j->w, j->in_buf, n, e))) return rc;
            off += n;
            progress_update(j->bar, j->done_bytes + off);
        }
        j->done_bytes += ti->bytes;
        return 0;
    }

    quant_ops qin, qout;
    const cpu_isa isa = cpu_best_isa();
    if ((rc = quant_ops_get(t->in_type, isa, &qin, e)) || (rc = quant_ops_get(t->out_type, isa, &qout, e))) {
        err_prefix(e, "tensor %s", t->name);
        return rc;
    }

    const int64_t ne0 = ti->ne[0];
    const int64_t n_rows = ti->ne[1] * ti->ne[2] * ti->ne[3];
    const size_t in_row = (size_t)ti->nb[1];
    uint64_t out_row64;
    if ((rc = qtype_row_bytes(t->out_type, ne0, &out_row64, e))) {
        err_prefix(e, "tensor %s", t->name);
        return rc;
    }
    const size_t out_row = (size_t)out_row64;
    const size_t widest = in_row > out_row ? in_row : out_row;
    int64_t rows_per_chunk = (int64_t)(CHUNK_BYTES / (widest ? widest : 1));
    if (rows_per_chunk < tpool_size(j->pool)) rows_per_chunk = tpool_size(j->pool);
    if (rows_per_chunk > n_rows) rows_per_chunk = n_rows;
    if ((rc = grow((void **)&j->in_buf, &j->in_cap, (size_t)rows_per_chunk * in_row, e))) return rc;
    if ((rc = grow((void **)&j->out_buf, &j->out_cap, (size_t)rows_per_chunk * out_row, e))) return rc;
    if ((rc = grow((void **)&j->scratch, &j->scratch_cap, (size_t)tpool_size(j->pool) * (size_t)ne0 * sizeof(float), e)))
        return rc;

    chunk_ctx c = {
        .in = j->in_buf, .out = j->out_buf, .scratch = j->scratch, .ne0 = ne0,
        .in_row = in_row, .out_row = out_row, .in_f32 = t->in_type == QTYPE_F32,
        .dequant = qin.dequant, .quant = qout.quant,
    };
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
        const int64_t nr = n_rows - r0 < rows_per_chunk ? n_rows - r0 : rows_per_chunk;
        if ((rc = gguf_read_tensor(j->in, t->idx, (uint64_t)r0 * in_row, j->in_buf, (uint64_t)nr * in_row, e)))
            return rc;
        c.n_rows = nr;
        tpool_run(j->pool, convert_rows, &c);
        if ((rc = gguf_writer_write(j->w, j->out_buf, (uint64_t)nr * out_row, e))) return rc;
        progress_update(j->bar, j->done_bytes + (uint64_t)(r0 + nr) * in_row);
    }
    j->done_bytes += ti->bytes;
    return 0;
}

/* Decide every tensor's type, in llama.cpp's order (the mix counters depend
 * on it), and declare them to the writer. */
static int plan(qjob *j, const ftype_info *ft, quantize_result *res, err *e)
{
    const quantize_opts *o = j->o;
    model_facts m;
    read_facts(j->in, j->jobs, j->n, &m);
    select_state s = {0};
    for (int64_t k = 0; k < j->n; k++) {
        tensor_job *t = &j->jobs[k];
        const gguf_tensor_info *ti = gguf_tensor(j->in, t->idx);
        const int out = select_type(&m, &s, ft->ftype, ft->base, o->pure, t->name, ti->n_dims, ti->ne[0], ti->type, e);
        if (out < 0) return out;
        t->out_type = out;
        if (out != t->in_type) {
            const qtype_info *in = qtype_get(t->in_type);
            if (is_quantized(t->in_type) && !o->allow_requantize)
                return err_setf(e, ERR_UNSUPPORTED, "tensor %s is %s: requantizing needs --allow-requantize",
                                t->name, in ? in->name : "unknown");
            if (!in || !in->supported)
                return err_setf(e, ERR_UNSUPPORTED, "tensor %s: cannot convert type %s", t->name, qtype_name(t->in_type));
            res->n_converted++;
        }
        int rc = gguf_writer_add_tensor(j->w, t->name, out, ti->n_dims, ti->ne, e);
        if (rc) return rc;
    }
    res->n_fallback = s.n_fallback;
    return 0;
}

static int run(qjob *j, const ftype_info *ft, quantize_result *res, err *e)
{
    const quantize_opts *o = j->o;
    int rc = gguf_open(&j->in, o->in_path, e);
    if (rc) return rc;
    j->n = gguf_n_tensors(j->in);
    j->jobs = calloc(j->n ? (size_t)j->n : 1, sizeof *j->jobs);
    if (!j->jobs) return err_setf(e, ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < j->n; i++) {
        const gguf_tensor_info *ti = gguf_tensor(j->in, i);
        tensor_job *t = &j->jobs[i];
        t->idx = i;
        const size_t len = ti->name.n < sizeof t->name - 1 ? (size_t)ti->name.n : sizeof t->name - 1;
        memcpy(t->name, ti->name.p, len);
        t->in_type = ti->type;
        res->bytes_in += ti->bytes;
        res->n_elements += (uint64_t)(ti->ne[0] * ti->ne[1] * ti->ne[2] * ti->ne[3]);
    }
    qsort(j->jobs, (size_t)j->n, sizeof *j->jobs, job_cmp);

    if (!(j->w = gguf_writer_new())) return err_setf(e, ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < gguf_n_kv(j->in); i++)
        if ((rc = gguf_writer_copy_kv(j->w, j->in, i)))
            return err_setf(e, rc, "copying metadata key %" PRId64 " failed", i);
    /* llama.cpp's gguf_set_val moves an existing key to the end; removing
     * first gives the same key order, so the header matches byte for byte. */
    gguf_writer_remove_key(j->w, "general.quantization_version");
    gguf_writer_remove_key(j->w, "general.file_type");
    if (gguf_writer_set_u32(j->w, "general.quantization_version", 2) ||
        gguf_writer_set_u32(j->w, "general.file_type", (uint32_t)ft->ftype))
        return err_setf(e, ERR_NOMEM, "out of memory");
    gguf_writer_remove_key(j->w, "split.no");
    gguf_writer_remove_key(j->w, "split.count");
    gguf_writer_remove_key(j->w, "split.tensors.count");
    if ((rc = plan(j, ft, res, e))) return rc;

    int nt = o->n_threads > 0 ? o->n_threads : cpu_count();
    if ((rc = tpool_open(&j->pool, nt, e))) return rc;
    res->n_threads = nt;
    if ((rc = progress_open(&j->bar, "quantize", res->bytes_in, o->progress)))
        return err_setf(e, rc, "out of memory");
    if ((rc = gguf_writer_begin(j->w, o->out_path, e))) return rc;
    for (int64_t k = 0; k < j->n; k++) {
        if ((rc = write_tensor(j, k, e))) return rc;
        res->bytes_out += gguf_writer_tensor_bytes(j->w, k);
    }
    res->n_tensors = j->n;
    return gguf_writer_finish(j->w, e);
}

int strata_quantize(const quantize_opts *o, err *e)
{
    const double t0 = timer_ms();
    if (!o || !o->in_path || !o->out_path)
        return err_setf(e, ERR_USAGE, "quantize needs an input and an output path");
    const ftype_info *ft = ftype_by_name(o->type);
    if (!ft)
        return err_setf(e, ERR_USAGE, "unknown type '%s'; valid types: %s", o->type ? o->type : "",
                        quantize_type_names());
    if (!strcmp(o->in_path, o->out_path))
        return err_setf(e, ERR_USAGE, "the output path is the input path: refusing to overwrite %s", o->in_path);

    quantize_result res = { .ftype = (uint32_t)ft->ftype };
    qjob j = { .o = o };
    int rc = run(&j, ft, &res, e);
    progress_close(j.bar);
    gguf_writer_free(j.w);   /* removes the temporary file after an error */
    tpool_close(j.pool);
    gguf_close(j.in);
    free(j.jobs);
    free(j.in_buf);
    free(j.out_buf);
    free(j.scratch);
    res.seconds = (timer_ms() - t0) / 1000.0;
    if (o->result) *o->result = res;
    return rc;
}

/* test_mkmodel: synthetic model generation (mkmodel, bpe_train, randw, skew).
 *
 * - BPE: known merges on a small text (worked out by hand, and equal to a
 *   naive Python trainer with the same tie rule), token order and types,
 *   padding, errors.
 * - randw: random quant rows of every format dequantize (through the quant
 *   module) to finite values with the intended mean and std; q8_0 never -128.
 * - mkmodel: same options => same bytes (any thread count), another seed =>
 *   other bytes; the GGUF has llama.cpp's qwen3moe keys, tensor names, order,
 *   shapes and types; the tokenizer module opens it and round-trips text;
 *   type fallbacks; --ftype gives every tensor the type strata quantize
 *   (llama-quantize) gives the same model; the skew channel's structure;
 *   option errors.
 * - skew: the fit reaches the asked Zipf exponent on a synthetic sample.
 * - the compiled-in corpus equals data/corpus.txt. */
#include "testhelp.h"

#include <stdint.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "mkmodel/bpe_train.h"
#include "mkmodel/mkmodel.h"
#include "mkmodel/randw.h"
#include "mkmodel/skew.h"
#include "quant/quant.h"
#include "quant/qtype.h"
#include "quant/quantize_model.h"
#include "tokenizer/tokenizer.h"

/* ==== Helpers ==== */

static char g_dir[64];   /* scratch directory for this run */

static const char *tmp_path(const char *name)
{
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static uint64_t file_hash(const char *path, uint64_t *size)
{
    FILE *f = fopen(path, "rb");
    uint64_t h = 1469598103934665603ull, n = 0;
    if (!f) return 0;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
        n += got;
    }
    fclose(f);
    if (size) *size = n;
    return h;
}

static int make(mkmodel_opts o, const char *name, err *e)
{
    o.path = tmp_path(name);
    return strata_mkmodel(&o, NULL, e);
}

/* ==== BPE ==== */

static const char *const k_sp[] = { "<|endoftext|>", "<think>" };
static const int32_t k_sp_types[] = { TOK_CONTROL, TOK_USER_DEFINED };

TEST(bpe_known_merges)
{
    /* Pieces: "low" " lower" " lowest" " newer" " newest" " wider" " low" x2.
     * (l,o) and (o,w) both occur 5 times; the smaller left id wins. Then
     * (lo,w) 5, (Ġ,low) 4, (e,r) 3, then the count-2 pairs by left id:
     * (e,s), (e,w), then (n,ew), (Ġ,new), (es,t); then count-1 pairs, the
     * smallest left id being 'd'. */
    const char *text = "low lower lowest newer newest wider low low";
    const char *want[] = { "l o", "lo w", "\xc4\xa0 low", "e r", "e s", "e w", "n ew", "\xc4\xa0 new",
                           "es t", "d er" };
    bpe_opts o = { .pre = "qwen2", .n_vocab = 256 + 10 + 2, .specials = k_sp, .special_types = k_sp_types,
                   .n_specials = 2 };
    bpe_vocab v;
    err e = {0};
    int rc = bpe_train(text, strlen(text), &o, &v, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    CHECK_EQ_INT(v.n_tokens, 268);
    CHECK_EQ_INT(v.n_learned, 10);
    CHECK_EQ_INT(v.n_merges, 10);
    CHECK_EQ_INT(v.n_pad, 0);
    for (int i = 0; i < 10 && i < v.n_merges; i++)
        CHECK_MSG(!strcmp(v.merges[i], want[i]), "merge %d: '%s', want '%s'", i, v.merges[i], want[i]);
    /* GPT-2 byte order: '!' first, the space's stand-in U+0120 at 220. */
    CHECK(!strcmp(v.tokens[0], "!"));
    CHECK(!strcmp(v.tokens[220], "\xc4\xa0"));
    CHECK(!strcmp(v.tokens[256], "lo"));
    CHECK(!strcmp(v.tokens[258], "\xc4\xa0low"));
    CHECK(!strcmp(v.tokens[266], "<|endoftext|>"));
    CHECK_EQ_INT(v.types[266], TOK_CONTROL);
    CHECK(!strcmp(v.tokens[267], "<think>"));
    CHECK_EQ_INT(v.types[267], TOK_USER_DEFINED);
    CHECK_EQ_INT(v.types[0], TOK_NORMAL);
    CHECK_EQ_INT(v.types[260], TOK_NORMAL);
    bpe_vocab_free(&v);
    CHECK(v.tokens == NULL);
}

TEST(bpe_padding_and_errors)
{
    /* "abab": only (a,b) then (ab,ab) can be learned; the rest is padding. */
    const char *text = "abab";
    bpe_opts o = { .pre = "qwen2", .n_vocab = 300, .specials = k_sp, .special_types = k_sp_types,
                   .n_specials = 2 };
    bpe_vocab v;
    err e = {0};
    CHECK(bpe_train(text, strlen(text), &o, &v, &e) == 0);
    CHECK_EQ_INT(v.n_tokens, 300);
    CHECK_EQ_INT(v.n_learned, 2);
    CHECK_EQ_INT(v.n_pad, 300 - 256 - 2 - 2);
    CHECK(!strcmp(v.merges[0], "a b") && !strcmp(v.merges[1], "ab ab"));
    CHECK(!strcmp(v.tokens[258], "<|endoftext|>"));
    CHECK(!strcmp(v.tokens[260], "[PAD260]"));
    CHECK_EQ_INT(v.types[299], TOK_UNUSED);
    bpe_vocab_free(&v);

    o.n_vocab = 256 + 2;   /* no room for a merge */
    err_clear(&e);
    CHECK_EQ_INT(bpe_train(text, strlen(text), &o, &v, &e), ERR_USAGE);
    o.n_vocab = 300;
    o.pre = "no-such-pre";
    err_clear(&e);
    CHECK(bpe_train(text, strlen(text), &o, &v, &e) != 0);
}

TEST(bpe_corpus_is_fast_and_deterministic)
{
    size_t n;
    const char *text = mkmodel_corpus(&n);
    CHECK(n > 100000);
    bpe_opts o = { .pre = "qwen2", .n_vocab = 32768, .specials = k_sp, .special_types = k_sp_types,
                   .n_specials = 2 };
    bpe_vocab a, b;
    err e = {0};
    CHECK(bpe_train(text, n, &o, &a, &e) == 0);
    CHECK(bpe_train(text, n, &o, &b, &e) == 0);
    CHECK_EQ_INT(a.n_learned, 32768 - 256 - 2);   /* the corpus supports a 32k vocabulary */
    CHECK_EQ_INT(a.n_merges, b.n_merges);
    int same = a.n_merges == b.n_merges;
    for (int64_t i = 0; same && i < a.n_merges; i++) same = !strcmp(a.merges[i], b.merges[i]);
    CHECK(same);
    /* texts are unique */
    int dup = 0;
    for (int32_t i = 256; i < a.n_tokens && !dup; i++)
        dup = !strcmp(a.tokens[i], a.tokens[i - 1]);
    CHECK(!dup);
    bpe_vocab_free(&a);
    bpe_vocab_free(&b);
}

TEST(corpus_matches_data_file)
{
    size_t n;
    const char *text = mkmodel_corpus(&n);
    FILE *f = fopen("data/corpus.txt", "rb");
    CHECK_MSG(f != NULL, "%s", "run from the repository root");
    if (!f) return;
    char *buf = malloc(n + 1);
    size_t got = fread(buf, 1, n + 1, f);
    fclose(f);
    CHECK_EQ_INT(got, n);
    CHECK(got == n && memcmp(buf, text, n) == 0);
    free(buf);
}

/* ==== Random quantized rows ==== */

TEST(randw_rows_have_intended_std)
{
    const int types[] = { QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q8_0,
                          QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K };
    const int64_t n = 1024, rows = 256;
    const float std = 0.02f;
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *q = malloc((size_t)n * 2);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        int t = types[k];
        uint64_t rb;
        qtype_row_bytes(t, n, &rb, NULL);
        double s = 0, ss = 0;
        int finite = 1, min128 = 0;
        err e = {0};
        for (int64_t r = 0; r < rows; r++) {
            randw_rng g = randw_stream(77, (uint64_t)r);
            CHECK(randw_quant_row(t, &g, std, q, n, &e) == 0);
            if (t == QTYPE_Q8_0)
                for (int64_t b = 0; b < n / 32; b++)
                    for (int j = 0; j < 32; j++) min128 |= (int8_t)q[b * 34 + 2 + j] == -128;
            if (quant_dequantize(t, q, x, n, &e)) { CHECK_MSG(0, "%s", e.msg); break; }
            for (int64_t i = 0; i < n; i++) {
                finite &= isfinite(x[i]) != 0;
                s += x[i];
                ss += (double)x[i] * x[i];
            }
        }
        double mean = s / (n * rows), sd = sqrt(ss / (n * rows) - mean * mean);
        CHECK_MSG(finite, "%s: non-finite values", qtype_name(t));
        CHECK_MSG(fabs(mean) < 0.03 * std, "%s: mean %g", qtype_name(t), mean);
        CHECK_MSG(fabs(sd / std - 1) < 0.04, "%s: std %g, want %g", qtype_name(t), sd, std);
        CHECK_MSG(!min128, "%s: q8_0 quant -128", qtype_name(t));
    }
    randw_rng g = randw_stream(1, 1);
    err e = {0};
    CHECK_EQ_INT(randw_quant_row(QTYPE_Q4_K, &g, 1, q, 100, &e), ERR_FORMAT);
    CHECK_EQ_INT(randw_quant_row(QTYPE_F32, &g, 1, q, 256, &e), ERR_UNSUPPORTED);
    free(x);
    free(q);
}

TEST(randw_streams_are_counter_based)
{
    randw_rng a = randw_stream(5, 9), b = randw_stream(5, 9), c = randw_stream(5, 10);
    uint64_t xa = randw_next(&a), xb = randw_next(&b), xc = randw_next(&c);
    CHECK(xa == xb);
    CHECK(xa != xc);
    /* the normal variate has mean ~0 and std ~1 */
    double s = 0, ss = 0;
    randw_rng r = randw_stream(3, 0);
    for (int i = 0; i < 100000; i++) {
        double v = randw_normal(&r);
        s += v;
        ss += v * v;
    }
    CHECK_NEAR(s / 1e5, 0, 0.02);
    CHECK_NEAR(sqrt(ss / 1e5), 1, 0.02);
}

/* ==== mkmodel ==== */

TEST(mkmodel_deterministic)
{
    err e = {0};
    mkmodel_opts o = { .seed = 7 };
    uint64_t s1, s2, s3;
    CHECK_MSG(make(o, "a.gguf", &e) == 0, "%s", e.msg);
    o.n_threads = 1;
    CHECK_MSG(make(o, "b.gguf", &e) == 0, "%s", e.msg);
    o.seed = 8;
    o.n_threads = 2;
    CHECK_MSG(make(o, "c.gguf", &e) == 0, "%s", e.msg);
    uint64_t ha = file_hash(tmp_path("a.gguf"), &s1), hb = file_hash(tmp_path("b.gguf"), &s2),
             hc = file_hash(tmp_path("c.gguf"), &s3);
    CHECK(ha != 0 && ha == hb);
    CHECK(ha != hc);
    CHECK(s1 == s3);
    CHECK_MSG(s1 < 1000000, "tiny is %llu bytes", (unsigned long long)s1);
    /* quantized, skewed: also independent of the thread count */
    mkmodel_opts q = { .seed = 3, .n_embd = 256, .n_ff_exp = 256, .n_expert = 16, .n_expert_used = 4,
                       .type = "q4_K", .type_attn = "q8_0", .route_skew = 1.0, .n_threads = 1 };
    CHECK_MSG(make(q, "q1.gguf", &e) == 0, "%s", e.msg);
    q.n_threads = 3;
    CHECK_MSG(make(q, "q2.gguf", &e) == 0, "%s", e.msg);
    CHECK(file_hash(tmp_path("q1.gguf"), NULL) == file_hash(tmp_path("q2.gguf"), NULL));
    unlink(tmp_path("a.gguf"));
    unlink(tmp_path("b.gguf"));
    unlink(tmp_path("c.gguf"));
    unlink(tmp_path("q2.gguf"));
}

static int64_t key_i64(const gguf_file *f, const char *k)
{
    int64_t v = -1;
    gguf_get_i64(f, k, &v, NULL);
    return v;
}

static const gguf_tensor_info *tensor(const gguf_file *f, const char *name)
{
    int64_t i = gguf_find_tensor(f, name);
    return i < 0 ? NULL : gguf_tensor(f, i);
}

static int shape_is(const gguf_tensor_info *t, int n_dims, int64_t a, int64_t b, int64_t c)
{
    return t && t->n_dims == n_dims && t->ne[0] == a && (n_dims < 2 || t->ne[1] == b) && (n_dims < 3 || t->ne[2] == c);
}

TEST(mkmodel_layout_matches_llama_cpp)
{
    err e = {0};
    mkmodel_opts o = { .seed = 1, .n_layer = 3 };
    CHECK_MSG(make(o, "l.gguf", &e) == 0, "%s", e.msg);
    gguf_file *f = NULL;
    CHECK_MSG(gguf_open(&f, tmp_path("l.gguf"), &e) == 0, "%s", e.msg);
    if (!f) return;
    gguf_str s;
    CHECK(gguf_get_str(f, "general.architecture", &s, NULL) == 0 && gguf_str_eq(s, "qwen3moe"));
    CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s, NULL) == 0 && gguf_str_eq(s, "gpt2"));
    CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s, NULL) == 0 && gguf_str_eq(s, "qwen2"));
    CHECK(gguf_get_str(f, "tokenizer.chat_template", &s, NULL) == 0 && s.n > 1000);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.block_count"), 3);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.embedding_length"), 64);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.expert_count"), 8);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.expert_used_count"), 2);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.expert_feed_forward_length"), 32);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.attention.head_count"), 4);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.attention.head_count_kv"), 2);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.attention.key_length"), 16);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.attention.value_length"), 16);
    CHECK_EQ_INT(key_i64(f, "qwen3moe.context_length"), 256);
    CHECK_EQ_INT(key_i64(f, "general.file_type"), 0);
    CHECK(gguf_find_key(f, "general.quantization_version") < 0);   /* all f32 */
    float eps = 0, base = 0;
    CHECK(gguf_get_f32(f, "qwen3moe.attention.layer_norm_rms_epsilon", &eps, NULL) == 0 && eps == 1e-6f);
    CHECK(gguf_get_f32(f, "qwen3moe.rope.freq_base", &base, NULL) == 0 && base == 1e6f);
    int add_bos = 1;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, NULL) == 0 && add_bos == 0);
    int64_t kt = gguf_find_key(f, "tokenizer.ggml.tokens");
    CHECK(kt >= 0 && gguf_kv_arr_n(f, kt) == 512);
    int64_t km = gguf_find_key(f, "tokenizer.ggml.merges");
    CHECK(km >= 0 && gguf_kv_arr_n(f, km) > 200);
    int64_t bos = key_i64(f, "tokenizer.ggml.bos_token_id"), eos = key_i64(f, "tokenizer.ggml.eos_token_id");
    CHECK(gguf_str_eq(gguf_kv_arr_str(f, kt, (uint64_t)bos), "<|endoftext|>"));
    CHECK(gguf_str_eq(gguf_kv_arr_str(f, kt, (uint64_t)eos), "<|im_end|>"));
    CHECK_EQ_INT(key_i64(f, "tokenizer.ggml.padding_token_id"), bos);
    int64_t ktt = gguf_find_key(f, "tokenizer.ggml.token_type");
    int64_t ty = 0;
    CHECK(gguf_get_arr_i64(f, ktt, (uint64_t)eos, &ty, NULL) == 0 && ty == TOK_CONTROL);

    /* names, order, shapes */
    static const char *const per_layer[] = { "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
        "attn_q_norm", "attn_k_norm", "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
        "ffn_down_exps" };
    CHECK_EQ_INT(gguf_n_tensors(f), 1 + 3 * 12 + 2);
    CHECK(gguf_str_eq(gguf_tensor(f, 0)->name, "token_embd.weight"));
    for (int l = 0; l < 3; l++)
        for (int k = 0; k < 12; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, per_layer[k]);
            CHECK_MSG(gguf_str_eq(gguf_tensor(f, 1 + 12 * l + k)->name, nm), "tensor %d is not %s", 1 + 12 * l + k, nm);
        }
    CHECK(gguf_str_eq(gguf_tensor(f, 37)->name, "output_norm.weight"));
    CHECK(gguf_str_eq(gguf_tensor(f, 38)->name, "output.weight"));
    CHECK(shape_is(tensor(f, "token_embd.weight"), 2, 64, 512, 1));
    CHECK(shape_is(tensor(f, "blk.2.attn_q.weight"), 2, 64, 64, 1));
    CHECK(shape_is(tensor(f, "blk.2.attn_k.weight"), 2, 64, 32, 1));
    CHECK(shape_is(tensor(f, "blk.2.attn_v.weight"), 2, 64, 32, 1));
    CHECK(shape_is(tensor(f, "blk.2.attn_output.weight"), 2, 64, 64, 1));
    CHECK(shape_is(tensor(f, "blk.2.attn_q_norm.weight"), 1, 16, 1, 1));
    CHECK(shape_is(tensor(f, "blk.2.ffn_gate_inp.weight"), 2, 64, 8, 1));
    CHECK(shape_is(tensor(f, "blk.2.ffn_gate_exps.weight"), 3, 64, 32, 8));
    CHECK(shape_is(tensor(f, "blk.2.ffn_up_exps.weight"), 3, 64, 32, 8));
    CHECK(shape_is(tensor(f, "blk.2.ffn_down_exps.weight"), 3, 32, 64, 8));
    CHECK(shape_is(tensor(f, "output.weight"), 2, 64, 512, 1));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) CHECK(gguf_tensor(f, i)->type == QTYPE_F32);

    /* values: norms near 1, matrices zero-mean with std 1/sqrt(fan_in) */
    float norm[64], q[64 * 64];
    CHECK(gguf_read_tensor(f, gguf_find_tensor(f, "blk.1.ffn_norm.weight"), 0, norm, sizeof norm, &e) == 0);
    double mn = 0;
    for (int i = 0; i < 64; i++) mn += norm[i] / 64;
    CHECK_NEAR(mn, 1.0, 0.05);
    CHECK(gguf_read_tensor(f, gguf_find_tensor(f, "blk.1.attn_q.weight"), 0, q, sizeof q, &e) == 0);
    double ss = 0;
    for (int i = 0; i < 64 * 64; i++) ss += (double)q[i] * q[i];
    CHECK_NEAR(sqrt(ss / (64 * 64)), 1 / 8.0, 0.01);
    gguf_close(f);

    /* the tokenizer module reads the vocabulary and round-trips text */
    f = NULL;
    tokenizer *tok = NULL;
    CHECK(gguf_open(&f, tmp_path("l.gguf"), &e) == 0);
    CHECK_MSG(f && tokenizer_open(&tok, f, &e) == 0, "%s", e.msg);
    gguf_close(f);
    if (tok) {
        const char *text = "In the beginning, {\"name\": \"x\"} \xe4\xb8\xad\xe6\x96\x87 <think>ok</think>";
        int32_t ids[256];
        size_t n = 0;
        CHECK(tokenizer_encode(tok, text, strlen(text), 0, 1, ids, 256, &n, &e) == 0);
        CHECK(n > 5 && n < strlen(text));
        char out[512];
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            int k = tokenizer_piece(tok, ids[i], 1, out + m, sizeof out - m);
            if (k > 0) m += (size_t)k;
        }
        CHECK(m == strlen(text) && !memcmp(out, text, m));
        CHECK(tokenizer_find(tok, "<think>", 7) >= 0);
        CHECK(tokenizer_attr(tok, tokenizer_find(tok, "<think>", 7)) == TOK_USER_DEFINED);
        CHECK(tokenizer_is_eog(tok, tokenizer_find(tok, "<|im_end|>", 10)));
        tokenizer_close(tok);
    }
    unlink(tmp_path("l.gguf"));
}

TEST(mkmodel_types_and_fallbacks)
{
    err e = {0};
    /* tiny with q4_K: rows of 64 and 32 cannot hold 256-blocks: q5_0 as llama-quantize */
    mkmodel_opts o = { .type = "Q4_K", .tied = 1 };
    CHECK_MSG(make(o, "t.gguf", &e) == 0, "%s", e.msg);
    gguf_file *f = NULL;
    CHECK(gguf_open(&f, tmp_path("t.gguf"), &e) == 0);
    if (!f) return;
    CHECK(tensor(f, "output.weight") == NULL);
    CHECK(tensor(f, "blk.0.ffn_gate_exps.weight")->type == QTYPE_Q5_0);
    CHECK(tensor(f, "blk.0.ffn_gate_inp.weight")->type == QTYPE_F32);   /* router stays f32 */
    CHECK(tensor(f, "blk.0.ffn_norm.weight")->type == QTYPE_F32);
    CHECK_EQ_INT(key_i64(f, "general.quantization_version"), 2);
    gguf_close(f);

    /* explicit per-group types at a shape that fits K-quant blocks */
    mkmodel_opts k = { .n_embd = 256, .n_ff_exp = 256, .head_dim = 64, .n_layer = 1, .type_experts = "q2_K",
                       .type_attn = "q6_K", .type_embd = "bf16", .type_output = "q8_0", .type_router = "f16" };
    CHECK_MSG(make(k, "k.gguf", &e) == 0, "%s", e.msg);
    CHECK(gguf_open(&f, tmp_path("k.gguf"), &e) == 0);
    if (!f) return;
    CHECK(tensor(f, "blk.0.ffn_down_exps.weight")->type == QTYPE_Q2_K);
    CHECK(tensor(f, "blk.0.attn_output.weight")->type == QTYPE_Q6_K);
    CHECK(tensor(f, "token_embd.weight")->type == QTYPE_BF16);
    CHECK(tensor(f, "output.weight")->type == QTYPE_Q8_0);
    CHECK(tensor(f, "blk.0.ffn_gate_inp.weight")->type == QTYPE_F16);
    CHECK_EQ_INT(key_i64(f, "general.file_type"), 10);
    gguf_close(f);
    unlink(tmp_path("t.gguf"));
    unlink(tmp_path("k.gguf"));
}

/* --ftype against strata quantize (whose output is llama-quantize's byte for
 * byte, tests/cli/test_quantize.sh): an f32 model quantized to FT, and the
 * same model written by mkmodel with --ftype FT, hold the same types tensor
 * by tensor. 16 layers, so use_more_bits gives attn_v and ffn_down_exps
 * more bits on layers 0, 1, 4, 7, 10, 13, 14 and 15; 8 experts switch on
 * the 8-expert rules (attn_k / attn_v q8_0, Q4_K_M's attn_output q5_K). */
static void ftype_case(const char *ft, int n_expert, int tied, uint32_t want_ftype)
{
    err e = {0};
    mkmodel_opts base = { .n_embd = 256, .n_ff_exp = 256, .head_dim = 64, .n_layer = 16, .n_expert = n_expert,
                          .n_expert_used = 2, .tied = tied, .type = "f32" };
    CHECK_MSG(make(base, "f32.gguf", &e) == 0, "%s", e.msg);
    quantize_opts qo = { .in_path = tmp_path("f32.gguf"), .out_path = tmp_path("q.gguf"), .type = ft };
    CHECK_MSG(strata_quantize(&qo, &e) == 0, "%s: quantize: %s", ft, e.msg);
    mkmodel_opts mo = base;
    mo.type = NULL;
    mo.ftype = ft;
    CHECK_MSG(make(mo, "m.gguf", &e) == 0, "%s: mkmodel: %s", ft, e.msg);
    gguf_file *q = NULL, *m = NULL;
    CHECK(gguf_open(&q, tmp_path("q.gguf"), &e) == 0);
    CHECK(gguf_open(&m, tmp_path("m.gguf"), &e) == 0);
    if (q && m) {
        CHECK_EQ_INT(gguf_n_tensors(m), gguf_n_tensors(q));
        int differ = 0, more = 0;
        for (int64_t i = 0; i < gguf_n_tensors(m); i++) {
            const gguf_tensor_info *tm = gguf_tensor(m, i);
            char name[96];
            snprintf(name, sizeof name, "%.*s", (int)tm->name.n, tm->name.p);
            const gguf_tensor_info *tq = tensor(q, name);
            if (!tq || tq->type != tm->type) {
                if (differ++ < 3)
                    fprintf(stderr, "  %s %s: mkmodel %s, quantize %s\n", ft, name, qtype_name(tm->type),
                            tq ? qtype_name(tq->type) : "(missing)");
            }
            if (strstr(name, ".attn_v.") && tm->type == QTYPE_Q6_K) more++;
        }
        CHECK_EQ_INT(differ, 0);
        CHECK_EQ_INT(key_i64(m, "general.file_type"), want_ftype);
        CHECK_EQ_INT(key_i64(q, "general.file_type"), want_ftype);
        if (!strcmp(ft, "Q4_K_M") && n_expert != 8) {
            CHECK_EQ_INT(more, 8);
            CHECK(tensor(m, "blk.4.ffn_down_exps.weight")->type == QTYPE_Q6_K);
            CHECK(tensor(m, "blk.5.ffn_down_exps.weight")->type == QTYPE_Q4_K);
            CHECK(tensor(m, "blk.5.attn_v.weight")->type == QTYPE_Q4_K);
            CHECK(tensor(m, "blk.5.ffn_gate_inp.weight")->type == QTYPE_F32);
        }
    }
    gguf_close(q);
    gguf_close(m);
    unlink(tmp_path("f32.gguf"));
    unlink(tmp_path("q.gguf"));
    unlink(tmp_path("m.gguf"));
}

TEST(mkmodel_ftype_matches_quantize)
{
    ftype_case("Q4_K_M", 16, 0, 15);
    ftype_case("Q4_K_M", 8, 0, 15);
    ftype_case("q5_k_m", 16, 1, 17);
    ftype_case("Q3_K_L", 16, 0, 13);
    ftype_case("Q8_0", 16, 0, 7);
}

TEST(mkmodel_skew_channel)
{
    /* With skew, the last n_embd/64 embedding coordinates are one constant,
     * and the residual-writing rows there are zero. */
    err e = {0};
    mkmodel_opts o = { .n_embd = 128, .n_expert = 16, .n_expert_used = 2, .route_skew = 1.2 };
    CHECK_MSG(make(o, "s.gguf", &e) == 0, "%s", e.msg);
    gguf_file *f = NULL;
    CHECK(gguf_open(&f, tmp_path("s.gguf"), &e) == 0);
    if (!f) return;
    float row[128];
    int64_t te = gguf_find_tensor(f, "token_embd.weight");
    for (int tok = 0; tok < 3; tok++) {
        CHECK(gguf_read_tensor(f, te, (uint64_t)tok * sizeof row, row, sizeof row, &e) == 0);
        CHECK(row[126] == 1.0f && row[127] == 1.0f && row[125] != 1.0f);
    }
    int64_t to = gguf_find_tensor(f, "blk.1.attn_output.weight");
    float orow[64];
    CHECK(gguf_read_tensor(f, to, 127 * sizeof orow, orow, sizeof orow, &e) == 0);
    int zero = 1;
    for (int i = 0; i < 64; i++) zero &= orow[i] == 0.0f;
    CHECK(zero);
    CHECK(gguf_read_tensor(f, to, 125 * sizeof orow, orow, sizeof orow, &e) == 0);
    CHECK(orow[0] != 0.0f);
    int64_t td = gguf_find_tensor(f, "blk.0.ffn_down_exps.weight");
    float drow[32];
    /* expert 3, output row 126 */
    CHECK(gguf_read_tensor(f, td, (uint64_t)(3 * 128 + 126) * sizeof drow, drow, sizeof drow, &e) == 0);
    zero = 1;
    for (int i = 0; i < 32; i++) zero &= drow[i] == 0.0f;
    CHECK(zero);
    float k = 0;
    CHECK(gguf_get_f32(f, "strata.mkmodel.route_skew", &k, NULL) == 0 && fabsf(k - 1.2f) < 1e-6f);
    gguf_close(f);
    unlink(tmp_path("s.gguf"));
}

TEST(mkmodel_option_errors)
{
    err e = {0};
    mkmodel_opts o = { .preset = "huge" };
    CHECK_EQ_INT(make(o, "x.gguf", &e), ERR_USAGE);
    CHECK(strstr(e.msg, "huge") != NULL);
    mkmodel_opts o2 = { .n_expert = 4, .n_expert_used = 5 };
    err_clear(&e);
    CHECK_EQ_INT(make(o2, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o3 = { .type = "q9_K" };
    err_clear(&e);
    CHECK_EQ_INT(make(o3, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o4 = { .type_experts = "iq2_xxs" };
    err_clear(&e);
    CHECK_EQ_INT(make(o4, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o5 = { .n_head = 5 };
    err_clear(&e);
    CHECK_EQ_INT(make(o5, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o6 = { .n_vocab = 100 };
    err_clear(&e);
    CHECK_EQ_INT(make(o6, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o7 = { .route_skew = -1 };
    err_clear(&e);
    CHECK_EQ_INT(make(o7, "x.gguf", &e), ERR_USAGE);
    mkmodel_opts o9 = { .ftype = "Q4_K_M", .type_attn = "q8_0" };   /* --ftype picks every matrix's type */
    err_clear(&e);
    CHECK_EQ_INT(make(o9, "x.gguf", &e), ERR_USAGE);
    CHECK(strstr(e.msg, "--type-attn") != NULL);
    mkmodel_opts o10 = { .ftype = "Q7_K" };
    err_clear(&e);
    CHECK_EQ_INT(make(o10, "x.gguf", &e), ERR_USAGE);
    CHECK(strstr(e.msg, "Q7_K") != NULL);
    mkmodel_opts o8 = { .path = "/nonexistent-dir/x.gguf" };
    err_clear(&e);
    CHECK_EQ_INT(strata_mkmodel(&o8, NULL, &e), ERR_IO);
    CHECK(access(tmp_path("x.gguf"), F_OK) != 0);
}

/* ==== Skew fit ==== */

TEST(skew_fit_reaches_exponent)
{
    const int n = 2048, X = 64, k = 4;
    float *z = malloc((size_t)n * X * sizeof *z), *q = malloc((size_t)n * sizeof *q), off[64];
    int32_t rank[64];
    randw_rng r = randw_stream(11, 0);
    for (int i = 0; i < n * X; i++) z[i] = randw_normal(&r);
    for (int i = 0; i < n; i++) q[i] = 1.0f + 0.05f * randw_normal(&r);
    for (int x = 0; x < X; x++) rank[x] = (x * 37) % X;   /* a permutation */
    err e = {0};
    skew_pop none, fit;
    CHECK(skew_measure(z, q, n, X, k, NULL, &none, &e) == 0);
    CHECK(none.exponent < 0.2);
    CHECK_NEAR(none.share_top50, 0.5, 0.08);
    CHECK(skew_fit(z, q, n, X, k, 0.8, rank, off, &e) == 0);
    CHECK(off[0] > off[1]);                 /* rank 0 (expert 0) is the most popular */
    CHECK(skew_measure(z, q, n, X, k, off, &fit, &e) == 0);
    CHECK_NEAR(fit.exponent, 0.8, 0.1);
    CHECK(fit.share_top10 > 0.25);
    CHECK(skew_fit(z, q, n, X, k, 0, rank, off, &e) == 0);
    CHECK(off[5] == 0.0f);
    free(z);
    free(q);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/strata-test-mkmodel-XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(bpe_known_merges);
    RUN(bpe_padding_and_errors);
    RUN(bpe_corpus_is_fast_and_deterministic);
    RUN(corpus_matches_data_file);
    RUN(randw_rows_have_intended_std);
    RUN(randw_streams_are_counter_based);
    RUN(mkmodel_deterministic);
    RUN(mkmodel_layout_matches_llama_cpp);
    RUN(mkmodel_types_and_fallbacks);
    RUN(mkmodel_ftype_matches_quantize);
    RUN(mkmodel_skew_channel);
    RUN(mkmodel_option_errors);
    RUN(skew_fit_reaches_exponent);
    unlink(tmp_path("q1.gguf"));
    rmdir(g_dir);
    return test_summary("mkmodel");
}

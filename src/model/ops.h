/* ops: the per-row float helpers of the forward pass (norms, RoPE, softmax,
 * SwiGLU, top-k, one attention head), scalar C written so that compilers can
 * vectorise it, with ggml-cpu's numerics where they are defined:
 *
 *   rmsnorm  sum of x*x (each product in float) accumulated in double,
 *            mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps),
 *            y = (x * scale) * w                      (ops.cpp rms_norm + mul)
 *   rope     theta_scale = powf(base, -2.0f / n_rot); theta starts at
 *            (float)pos and is multiplied by theta_scale after each pair;
 *            cos/sin of freq_scale * theta in float   (ops.cpp rope_cache_init)
 *            NEOX pairs (x[i], x[i + n_rot/2]).
 *   softmax  max subtraction, expf in float, sum in double, then every value
 *            times (float)(1.0 / sum)                 (ops.cpp soft_max)
 *   silu     x / (1.0f + expf(-x)); swiglu = silu(g) * u
 *   top-k    descending; ties go to the lower index (ggml sorts with
 *            std::sort, whose tie order is the index order for n <= 16 and
 *            unspecified beyond; lower index is the float64 oracle's rule)
 *
 * Dot products in attention use 8 float accumulators (lane = index mod 8)
 * combined in a fixed tree, so a SIMD version can reproduce them bit for bit.
 *
 * Attention numerics (one query row, one head): s_j = dot(q, k_j) * scale
 * for the visible positions j, softmax as above, out = sum_j p_j * v_j in
 * float, in position order. K and V are read from the cache in its own type
 * (f16 rows are widened exactly). This is llama.cpp's non-flash path with an
 * f32 probability row; llama.cpp's flash-attention kernels differ from it by
 * float rounding only.
 *
 * No function allocates; none keeps state. */
#ifndef STRATA_OPS_H
#define STRATA_OPS_H

#include <stddef.h>
#include <stdint.h>

/* y[i] = x[i] / rms(x) * w[i] over n elements; y may alias x. */
void  ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* cache[2i] = cos, cache[2i+1] = sin of pair i < n_rot/2 at position pos. */
void  ops_rope_cache(float *cache, int n_rot, int32_t pos, float freq_base, float freq_scale);
/* Rotate x's first n_rot dims in NEOX pairs (x[i], x[i + n_rot/2]). */
void  ops_rope_neox(float *x, int n_rot, const float *cache);

/* In-place softmax of n values (n >= 1). */
void  ops_softmax(float *x, int n);

float ops_silu(float x);
/* h[i] = silu(g[i]) * u[i]; h may alias g or u. */
void  ops_swiglu(float *h, const float *g, const float *u, int n);

/* The k largest of x[0..n) in descending order (ties: lower index first). */
void  ops_topk(const float *x, int n, int k, int32_t *ids);

/* 8-lane dot products (see above). */
float ops_dot_f32(const float *a, const float *b, int n);
float ops_dot_f16(const uint16_t *a, const float *b, int n, const float *f16_tab);

/* The 65536-entry table of every half's float value (exact), for f16 KV
 * rows. tab: 65536 floats, caller-owned. */
void  ops_f16_table_init(float *tab);

/* One attention head for one query: out[0..d) = softmax(scale * q.K^T) V
 * over positions 0..n_kv-1. k and v point at position 0 of this head's
 * rows; consecutive positions are `stride` elements apart; k_f16 / v_f16
 * select f16 (else f32) rows. scores: n_kv floats of scratch. f16_tab: see
 * above (the AVX2 version converts with F16C instead, exactly). */
typedef void (*ops_attention_fn)(float *out, const float *q, const void *k, int k_f16, const void *v, int v_f16,
                                 int64_t stride, int d, int n_kv, float scale, float *scores, const float *f16_tab);

void  ops_attention(float *out, const float *q, const void *k, int k_f16, const void *v, int v_f16,
                    int64_t stride, int d, int n_kv, float scale, float *scores, const float *f16_tab);

/* ==== Tiled causal attention (several query rows of one head) ====
 * Query rows q[0..nq) of one head, each d floats, q_stride floats apart, at
 * positions pos0 .. pos0+nq-1; row i attends causally to positions
 * 0 .. pos0+i. out row i (out_stride floats apart) is BIT-IDENTICAL to
 *   ops_attention(out_i, q_i, k, k_f16, v, v_f16, stride, d, pos0 + i + 1,
 *                 scale, .., f16_tab)
 * (same numerics as above, row by row). The tile only shares loads: each
 * K row is read once for all the tile's rows that can see it, then every
 * row gets its own softmax, then each V row is read once and added into
 * every row that can see it. Positions j > pos0 + i do not exist for row i
 * (causal by construction, no -inf masking arithmetic).
 *
 * Shapes: 1 <= nq <= OPS_ATTN_TILE, pos0 >= 0, n_kv_max = pos0 + nq.
 * scores: scratch of at least OPS_ATTN_TILE * n_kv_max floats (row i uses
 * scores[i * n_kv_max ..]). d: the real head sizes are 64, 128 and 256, and
 * the fast paths assume d % 8 == 0; any other d is still correct (the AVX2
 * version then falls back to ops_avx2_attention row by row). out rows must
 * not overlap q rows, k, v or scores. No allocation.
 *
 * OPS_ATTN_TILE = 8, from a measurement (AVX2 kernel, one thread, Xeon
 * with 2 MiB L2, d = 128, f16 K/V in a 4-KV-head cache, time per head for
 * 512 query rows, best of 30):
 *     rows at pos0 = 0      tile 4: 2.19 ms  tile 8: 2.17 ms  tile 16: 2.33 ms
 *     rows at pos0 = 3584   tile 4: 51.8 ms  tile 8: 49.5 ms  tile 16: 56.1 ms
 * Short contexts are compute bound (4 and 8 tie); long ones gain from 8
 * rows sharing each K/V load; 16 loses (the micro-kernels hold at most 8
 * rows, so 16 is two passes plus twice the scores scratch). 8 rows x 1 K
 * row is also exactly the 8 accumulators the AVX2 dot kernel keeps in
 * registers. The caller needs OPS_ATTN_TILE * n_ctx floats of scores
 * scratch per thread. */
#define OPS_ATTN_TILE 8

typedef void (*ops_attention_rows_fn)(float *out, size_t out_stride, const float *q, size_t q_stride, int nq,
                                      const void *k, int k_f16, const void *v, int v_f16, int64_t stride,
                                      int d, int pos0, float scale, float *scores, const float *f16_tab);

void  ops_attention_rows(float *out, size_t out_stride, const float *q, size_t q_stride, int nq,
                         const void *k, int k_f16, const void *v, int v_f16, int64_t stride,
                         int d, int pos0, float scale, float *scores, const float *f16_tab);

/* ==== ISA-selected kernels ====
 * The AVX2 versions (ops_avx2.c) keep the scalar lane structure and use
 * separate multiplies and adds (no FMA), so they return the same bits as
 * the scalar reference; test_ops checks that. */
typedef struct ops_kernels {
    ops_attention_fn      attention;
    ops_attention_rows_fn attention_rows;
} ops_kernels;

/* Kernels for `isa` (cpu_best_isa()); scalar where there is no SIMD version. */
void  ops_kernels_get(int isa, ops_kernels *out);

/* The AVX2 kernels; call only when cpu_best_isa() reports AVX2. */
float ops_avx2_dot_f32(const float *a, const float *b, int n);
float ops_avx2_dot_f16(const uint16_t *a, const float *b, int n);
void  ops_avx2_attention(float *out, const float *q, const void *k, int k_f16, const void *v, int v_f16,
                         int64_t stride, int d, int n_kv, float scale, float *scores, const float *f16_tab);
void  ops_avx2_attention_rows(float *out, size_t out_stride, const float *q, size_t q_stride, int nq,
                              const void *k, int k_f16, const void *v, int v_f16, int64_t stride,
                              int d, int pos0, float scale, float *scores, const float *f16_tab);

#endif

/* quant: dequantize, quantize and dot-product kernels for every supported
 * ggml block format, with the exact block layouts and numerics of llama.cpp.
 *
 * Numerics contract (matches ggml-cpu): a dot of a weight row of type T with
 * activations first quantizes the activations to qtype_get(T)->dot_type
 * (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F16
 * for F16, BF16 for BF16, F32 for F32) with the dot type's act_quant, and
 * then computes the integer/half dot block by block with the same per-block
 * scale arithmetic as ggml's reference (_generic) vec_dot.
 *
 * Two quantizers per type, because ggml has two:
 *   quant      == ggml's quantize_row_*_ref: what llama-quantize writes into
 *                 files (weights). Q8_0/Q8_1: q = roundf(x * (1 / d)),
 *                 d = amax / 127 (halves rounded away from zero).
 *   act_quant  == ggml-cpu's from_float, what llama.cpp applies to
 *                 activations at run time. Differs from `quant` only for
 *                 Q8_0/Q8_1, whose SIMD from_float on x86 (AVX/AVX2/AVX-512
 *                 builds, arch/x86/quants.c; ARM NEON is the same) computes
 *                 q = round-half-even(x * (127 / amax)): a different
 *                 multiplier (127/amax is not 1/(amax/127) in float) and a
 *                 different tie rule, so about 1 block in 10^4 comes out
 *                 different from quantize_row_q8_0_ref. Same d, same s.
 *                 Input must be finite.
 * Both exist in scalar and AVX2 form; each pair is bit-identical.
 *
 * Every kernel exists in a scalar reference version (quant_ref.c) and, where
 * it matters, an AVX2 version (quant_avx2.c). quant_ops_get() picks one by
 * ISA; tests check AVX2 against scalar and both against float64.
 *
 * All functions take whole blocks: n must be a multiple of the block size
 * (callers validate shapes once at load, never per call). No allocation. */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "quant/qtype.h"
#include "util/cpu.h"

typedef void  (*quant_dequant_fn)(const void *src, float *dst, int64_t n);
typedef void  (*quant_quant_fn)(const float *src, void *dst, int64_t n);
/* Dot of n elements: w in the weight format, a in the dot_type format. */
typedef float (*quant_dot_fn)(int64_t n, const void *w, const void *a);
/* A block of dots (the matmul kernel): for r in [0, nw), c in [0, na)
 *   y[c * ldy + r] = dot(n, w + r * wstride, a + c * astride)
 * i.e. nw weight rows (wstride bytes apart) against na activation rows in
 * the dot type (astride bytes apart), output row c holding the nw results
 * of activation row c. Every output is BIT-IDENTICAL to the same quant_ops'
 * dot() on that pair: a gemm kernel only reorders which pairs run when
 * (register blocking: unpack a weight block once, use it for several
 * activation rows; cache blocking: keep a group of weight rows in L1/L2
 * while every activation row passes), never the arithmetic inside a pair.
 * nw >= 1, na >= 1, any sizes; y must not alias w or a. No allocation. */
typedef void (*quant_gemm_fn)(int64_t n, const void *w, size_t wstride, int nw,
                              const void *a, size_t astride, int na, float *y, size_t ldy);

typedef struct quant_ops {
    qtype            type;
    qtype            dot_type;  /* format `a` must be in for dot() */
    quant_dequant_fn dequant;   /* row of `type` -> f32 */
    quant_quant_fn   quant;     /* f32 -> row of `type` (reference rounding, as
                                   ggml's quantize_row_*_ref; used for weights
                                   without an importance matrix) */
    quant_quant_fn   act_quant; /* f32 -> row of `type` as ggml-cpu quantizes
                                   activations (its from_float); == quant except
                                   for Q8_0 / Q8_1 (see above) */
    quant_dot_fn     dot;       /* row of `type` . row of `dot_type` */
    quant_gemm_fn    gemm;      /* blocks of dots (see quant_gemm_fn); NULL when
                                   the ISA has no blocked kernel for the type:
                                   call quant_gemm(), which then loops dot() */
    int              pf_rows;   /* weight rows a one-row product (quant_gemm)
                                   prefetches ahead; 0: none (see QUANT_PF_ROWS) */
} quant_ops;

/* y[c * ldy + r] = ops->dot(n, w + r * wstride, a + c * astride) for
 * r < nw, c < na: ops->gemm when there is one, else the plain loop (the
 * scalar reference of every gemm kernel). */
static inline void quant_gemm_block(const quant_ops *ops, int64_t n, const void *w, size_t wstride, int nw,
                                    const void *a, size_t astride, int na, float *y, size_t ldy)
{
    if (ops->gemm) { ops->gemm(n, w, wstride, nw, a, astride, na, y, ldy); return; }
    for (int r = 0; r < nw; r++) {
        const void *wr = (const unsigned char *)w + (size_t)r * wstride;
        for (int c = 0; c < na; c++)
            y[(size_t)c * ldy + (size_t)r] = ops->dot(n, wr, (const unsigned char *)a + (size_t)c * astride);
    }
}

/* How far ahead (in weight rows) a one-row product (decode) prefetches on
 * Intel cores (quant_ops.pf_rows): the kernels compute faster than DRAM
 * delivers a single stream, and a row of a few KB is too short for the
 * hardware prefetcher to run ahead across rows (it stops at 4 KB pages);
 * each row prefetches the row QUANT_PF_ROWS ahead into L2 (locality hint
 * 1) before it is computed. Measured on one thread (Xeon): 4.4-5.4 ->
 * 7.1-7.8 GB/s (Q4_K, 2048-wide rows, 512 MB streamed from DRAM; hint 3,
 * into L1: 6.5-7.2). In the engine (30b-a3b shape cut to 16 layers, tg16,
 * 2 threads, 4 interleaved rounds) the per-row spread beat prefetching 4
 * rows in one burst per 4-row block: median 11.4 vs 9.6 tok/s, no prefetch
 * 8.6. On AMD Zen 4 the hardware prefetchers keep up by themselves and the
 * software prefetches only cost (tg64 on the same model, 1 / 2 threads:
 * none 25.9 / 37.0 tok/s, 2 rows 20.1 / 31.1, 4 rows 23.0 / 34.2, 8 rows
 * 23.0 / 34.5): quant_ops_get sets pf_rows = 0 on AMD CPUs. */
#define QUANT_PF_ROWS 4

/* quant_gemm_block, except with one activation row (decode: the product
 * is a stream over the weights): then the dot kernel row by row (a gemm
 * kernel's blocking set-up per row cost 5-50% over the dot, which it
 * equals bit for bit), with software prefetch of the weights ops->pf_rows
 * rows ahead spread between the rows' computation. */
static inline void quant_gemm(const quant_ops *ops, int64_t n, const void *w, size_t wstride, int nw,
                              const void *a, size_t astride, int na, float *y, size_t ldy)
{
    if (na > 1) { quant_gemm_block(ops, n, w, wstride, nw, a, astride, na, y, ldy); return; }
    const unsigned char *wb = (const unsigned char *)w;
    const int pf = ops->pf_rows;
    for (int r = 0; r < nw; r++) {
        if (pf > 0 && r + pf < nw) {
            const unsigned char *p = wb + (size_t)(r + pf) * wstride;
            for (size_t o = 0; o < wstride; o += 64) __builtin_prefetch(p + o, 0, 1);
        }
        y[r] = ops->dot(n, wb + (size_t)r * wstride, a);
    }
}

/* Fill *out with the kernels for `type` on `isa` (falls back to scalar for
 * kernels without a SIMD version). ERR_UNSUPPORTED for types without kernels. */
int quant_ops_get(int type, cpu_isa isa, quant_ops *out, err *e);

/* Convenience wrappers through the scalar reference (tests, tools):
 * quant_quantize uses `quant` (weights), quant_act_quantize `act_quant`. */
int quant_dequantize(int type, const void *src, float *dst, int64_t n, err *e);
int quant_quantize(int type, const float *src, void *dst, int64_t n, err *e);
int quant_act_quantize(int type, const float *src, void *dst, int64_t n, err *e);

#endif

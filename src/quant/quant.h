/* quant: dequantize, quantize and dot-product kernels for every supported
 * ggml block format, with the exact block layouts and numerics of llama.cpp.
 *
 * Numerics contract (matches ggml-cpu): a dot of a weight row of type T with
 * activations first quantizes the activations to qtype_get(T)->dot_type
 * (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F16
 * for F16, BF16 for BF16, F32 for F32) and then computes the integer/half dot
 * block by block with the same per-block scale arithmetic as ggml's reference
 * (_generic) vec_dot.
 *
 * Every kernel exists in a scalar reference version (quant_ref.c) and, where
 * it matters, an AVX2 version (quant_avx2.c). quant_ops_get() picks one by
 * ISA; tests check AVX2 against scalar and both against float64.
 *
 * All functions take whole blocks: n must be a multiple of the block size
 * (callers validate shapes once at load, never per call). No allocation. */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stdint.h>
#include "quant/qtype.h"
#include "util/cpu.h"

typedef void  (*quant_dequant_fn)(const void *src, float *dst, int64_t n);
typedef void  (*quant_quant_fn)(const float *src, void *dst, int64_t n);
/* Dot of n elements: w in the weight format, a in the dot_type format. */
typedef float (*quant_dot_fn)(int64_t n, const void *w, const void *a);

typedef struct quant_ops {
    qtype            type;
    qtype            dot_type;  /* format `a` must be in for dot() */
    quant_dequant_fn dequant;   /* row of `type` -> f32 */
    quant_quant_fn   quant;     /* f32 -> row of `type` (reference rounding, as
                                   ggml's quantize_row_*_ref; used for weights
                                   without an importance matrix, and for
                                   activations when `type` is a dot_type) */
    quant_dot_fn     dot;       /* row of `type` . row of `dot_type` */
} quant_ops;

/* Fill *out with the kernels for `type` on `isa` (falls back to scalar for
 * kernels without a SIMD version). ERR_UNSUPPORTED for types without kernels. */
int quant_ops_get(int type, cpu_isa isa, quant_ops *out, err *e);

/* Convenience wrappers through the scalar reference (tests, tools). */
int quant_dequantize(int type, const void *src, float *dst, int64_t n, err *e);
int quant_quantize(int type, const float *src, void *dst, int64_t n, err *e);

#endif

/* quant: binds the kernels of quant_ref.c and quant_avx2.c into quant_ops
 * tables (see quant.h).
 *
 * What it owns: the one static table that says, per ggml type, which scalar
 * kernel and which AVX2 kernel (if any) implements each operation (the
 * activation quantizer defaults to the weight quantizer; only Q8_0 / Q8_1
 * have their own), and the choice between them. A kernel without an AVX2
 * version falls back to its scalar reference individually, so an ops table
 * may mix the two.
 *
 * It does not check shapes per call (see quant.h) and keeps no state: the
 * table is static const, quant_ops_get is reentrant. */
#include "quant/quant.h"

#include "quant/quant_impl.h"

typedef struct kernel_row {
    quant_dequant_fn dequant, dequant_avx2;
    quant_quant_fn   quant, quant_avx2;
    quant_dot_fn     dot, dot_avx2;
    quant_quant_fn   act, act_avx2;   /* NULL: same as quant / quant_avx2 */
} kernel_row;

#define REF(t) quant_ref_dequant_##t, NULL, quant_ref_quant_##t, NULL, quant_ref_dot_##t
static const kernel_row k_kernels[QTYPE_MAX_ID] = {
    [QTYPE_F32]  = { quant_ref_dequant_f32, NULL, quant_ref_quant_f32, NULL, quant_ref_dot_f32, quant_avx2_dot_f32, NULL, NULL },
    [QTYPE_F16]  = { quant_ref_dequant_f16, quant_avx2_dequant_f16, quant_ref_quant_f16, quant_avx2_quant_f16,
                     quant_ref_dot_f16, quant_avx2_dot_f16, NULL, NULL },
    [QTYPE_BF16] = { quant_ref_dequant_bf16, quant_avx2_dequant_bf16, quant_ref_quant_bf16, quant_avx2_quant_bf16,
                     quant_ref_dot_bf16, quant_avx2_dot_bf16, NULL, NULL },
    [QTYPE_Q4_0] = { REF(q4_0), quant_avx2_dot_q4_0, NULL, NULL },
    [QTYPE_Q4_1] = { REF(q4_1), quant_avx2_dot_q4_1, NULL, NULL },
    [QTYPE_Q5_0] = { REF(q5_0), quant_avx2_dot_q5_0, NULL, NULL },
    [QTYPE_Q5_1] = { REF(q5_1), quant_avx2_dot_q5_1, NULL, NULL },
    [QTYPE_Q8_0] = { quant_ref_dequant_q8_0, NULL, quant_ref_quant_q8_0, quant_avx2_quant_q8_0,
                     quant_ref_dot_q8_0, quant_avx2_dot_q8_0,
                     quant_ref_act_quant_q8_0, quant_avx2_act_quant_q8_0 },
    [QTYPE_Q8_1] = { REF(q8_1), NULL, quant_ref_act_quant_q8_1, quant_avx2_act_quant_q8_1 },
    [QTYPE_Q2_K] = { REF(q2_K), quant_avx2_dot_q2_K, NULL, NULL },
    [QTYPE_Q3_K] = { REF(q3_K), quant_avx2_dot_q3_K, NULL, NULL },
    [QTYPE_Q4_K] = { REF(q4_K), quant_avx2_dot_q4_K, NULL, NULL },
    [QTYPE_Q5_K] = { REF(q5_K), quant_avx2_dot_q5_K, NULL, NULL },
    [QTYPE_Q6_K] = { REF(q6_K), quant_avx2_dot_q6_K, NULL, NULL },
    [QTYPE_Q8_K] = { quant_ref_dequant_q8_K, NULL, quant_ref_quant_q8_K, quant_avx2_quant_q8_K,
                     quant_ref_dot_q8_K, quant_avx2_dot_q8_K, NULL, NULL },
};
#undef REF

/* The blocked AVX2 kernels (quant_gemm_avx2.c, quant_gemm_k_avx2.c), by type;
 * kept apart from k_kernels so each file's owner adds one line here. */
static const quant_gemm_fn k_gemm_avx2[QTYPE_MAX_ID] = {
    [QTYPE_F32]  = QUANT_GEMM_AVX2_F32,
    [QTYPE_F16]  = QUANT_GEMM_AVX2_F16,
    [QTYPE_BF16] = QUANT_GEMM_AVX2_BF16,
    [QTYPE_Q4_0] = QUANT_GEMM_AVX2_Q4_0,
    [QTYPE_Q4_1] = QUANT_GEMM_AVX2_Q4_1,
    [QTYPE_Q5_0] = QUANT_GEMM_AVX2_Q5_0,
    [QTYPE_Q5_1] = QUANT_GEMM_AVX2_Q5_1,
    [QTYPE_Q8_0] = QUANT_GEMM_AVX2_Q8_0,
    [QTYPE_Q2_K] = QUANT_GEMM_AVX2_Q2_K,
    [QTYPE_Q3_K] = QUANT_GEMM_AVX2_Q3_K,
    [QTYPE_Q4_K] = QUANT_GEMM_AVX2_Q4_K,
    [QTYPE_Q5_K] = QUANT_GEMM_AVX2_Q5_K,
    [QTYPE_Q6_K] = QUANT_GEMM_AVX2_Q6_K,
};

/* AVX-VNNI gemm kernels (bit-identical to the AVX2 ones), for
 * CPU_ISA_AVXVNNI; a type without one keeps its AVX2 kernel. */
static const quant_gemm_fn k_gemm_avxvnni[QTYPE_MAX_ID] = {
    [QTYPE_Q2_K] = quant_avxvnni_gemm_q2_K,
    [QTYPE_Q3_K] = quant_avxvnni_gemm_q3_K,
    [QTYPE_Q4_K] = quant_avxvnni_gemm_q4_K,
    [QTYPE_Q5_K] = quant_avxvnni_gemm_q5_K,
    [QTYPE_Q6_K] = quant_avxvnni_gemm_q6_K,
    [QTYPE_Q8_0] = quant_avxvnni_gemm_q8_0,
    [QTYPE_Q4_0] = quant_avxvnni_gemm_q4_0,
    [QTYPE_Q5_0] = quant_avxvnni_gemm_q5_0,
    [QTYPE_Q4_1] = quant_avxvnni_gemm_q4_1,
    [QTYPE_Q5_1] = quant_avxvnni_gemm_q5_1,
};

/* CPU_ISA_AVX512 gemm kernels (bit-identical to the AVX2 ones): 512-bit
 * for Q4_K (the experts of Q4_K files) and Q8_0 (bench/RESULTS.md, session
 * 7; a 512-bit Q6_K was measured without a gain), the AVX-VNNI kernels in
 * their EVEX encoding for the rest, so that a CPU with AVX-512 VNNI but no
 * AVX-VNNI (AMD Zen 4) runs them too. */
static const quant_gemm_fn k_gemm_avx512[QTYPE_MAX_ID] = {
    [QTYPE_Q2_K] = quant_avx512_gemm_q2_K,
    [QTYPE_Q3_K] = quant_avx512_gemm_q3_K,
    [QTYPE_Q4_K] = quant_avx512_gemm_q4_K,
    [QTYPE_Q5_K] = quant_avx512_gemm_q5_K,
    [QTYPE_Q6_K] = quant_avx512_gemm_q6_K,
    [QTYPE_Q8_0] = quant_avx512_gemm_q8_0,
    [QTYPE_Q4_0] = quant_avx512_gemm_q4_0,
    [QTYPE_Q5_0] = quant_avx512_gemm_q5_0,
    [QTYPE_Q4_1] = quant_avx512_gemm_q4_1,
    [QTYPE_Q5_1] = quant_avx512_gemm_q5_1,
};

static const kernel_row *row_for(int type, err *e)
{
    const qtype_info *t = qtype_get(type);
    if (!t) {
        err_setf(e, ERR_UNSUPPORTED, "unknown ggml type id %d", type);
        return NULL;
    }
    if (!t->supported || !k_kernels[type].dot) {
        err_setf(e, ERR_UNSUPPORTED, "no kernels for type %s", t->name);
        return NULL;
    }
    return &k_kernels[type];
}

int quant_ops_get(int type, cpu_isa isa, quant_ops *out, err *e)
{
    const kernel_row *k = row_for(type, e);
    if (!k) return ERR_UNSUPPORTED;
    /* Asking for AVX2 on a CPU without it would end in SIGILL: degrade to the
     * scalar reference instead (same results up to float summation order). */
    const cpu_features f = cpu_detect();
    if (isa >= CPU_ISA_AVX2) {
        if (!(f.avx2 && f.fma && f.f16c)) isa = CPU_ISA_SCALAR;
        else {
            if (isa == CPU_ISA_AVX512 && !f.avx512) isa = CPU_ISA_AVXVNNI;
            if (isa == CPU_ISA_AVXVNNI && !f.avxvnni) isa = CPU_ISA_AVX2;
        }
    }
    const int simd = isa >= CPU_ISA_AVX2;
    out->type = (qtype)type;
    out->dot_type = qtype_get(type)->dot_type;
    out->dequant = simd && k->dequant_avx2 ? k->dequant_avx2 : k->dequant;
    out->quant = simd && k->quant_avx2 ? k->quant_avx2 : k->quant;
    out->dot = simd && k->dot_avx2 ? k->dot_avx2 : k->dot;
    if (k->act) out->act_quant = simd && k->act_avx2 ? k->act_avx2 : k->act;
    else out->act_quant = out->quant;
    out->gemm = simd ? k_gemm_avx2[type] : NULL;
    out->pf_rows = f.amd ? 0 : QUANT_PF_ROWS;   /* see QUANT_PF_ROWS */
    /* AVX-VNNI kernels (bit-identical to the AVX2 ones they replace) */
    if (isa == CPU_ISA_AVXVNNI && type == QTYPE_Q4_K) out->dot = quant_avxvnni_dot_q4_K;
    if (isa == CPU_ISA_AVXVNNI && type == QTYPE_Q5_K) out->dot = quant_avxvnni_dot_q5_K;
    if (isa == CPU_ISA_AVXVNNI && k_gemm_avxvnni[type]) out->gemm = k_gemm_avxvnni[type];
    /* AVX-512 kernels (bit-identical to the AVX2 ones they replace; no
     * AVX-VNNI instruction in them) */
    if (isa == CPU_ISA_AVX512 && type == QTYPE_Q4_K) out->dot = quant_avx512_dot_q4_K;
    if (isa == CPU_ISA_AVX512 && type == QTYPE_Q5_K) out->dot = quant_avx512_dot_q5_K;
    if (isa == CPU_ISA_AVX512 && k_gemm_avx512[type]) out->gemm = k_gemm_avx512[type];
    return 0;
}

static int check_n(int type, int64_t n, err *e)
{
    const qtype_info *t = qtype_get(type);
    if (n < 0 || n % t->blck != 0)
        return err_setf(e, ERR_FORMAT, "%lld elements is not a multiple of %s's block size %d",
                        (long long)n, t->name, t->blck);
    return 0;
}

int quant_dequantize(int type, const void *src, float *dst, int64_t n, err *e)
{
    const kernel_row *k = row_for(type, e);
    if (!k) return ERR_UNSUPPORTED;
    int rc = check_n(type, n, e);
    if (rc) return rc;
    k->dequant(src, dst, n);
    return 0;
}

int quant_quantize(int type, const float *src, void *dst, int64_t n, err *e)
{
    const kernel_row *k = row_for(type, e);
    if (!k) return ERR_UNSUPPORTED;
    int rc = check_n(type, n, e);
    if (rc) return rc;
    k->quant(src, dst, n);
    return 0;
}

int quant_act_quantize(int type, const float *src, void *dst, int64_t n, err *e)
{
    const kernel_row *k = row_for(type, e);
    if (!k) return ERR_UNSUPPORTED;
    int rc = check_n(type, n, e);
    if (rc) return rc;
    (k->act ? k->act : k->quant)(src, dst, n);
    return 0;
}

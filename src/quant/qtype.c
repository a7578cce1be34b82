/* qtype: see qtype.h. Sizes are ggml's (ggml/src/ggml.c type_traits). */
#include "quant/qtype.h"

#include <stdio.h>
#include <strings.h>

#define T(id, nm, b, sz, sup, dt) [id] = { nm, b, sz, sup, dt }
static const qtype_info k_types[QTYPE_MAX_ID] = {
    T(QTYPE_F32,  "f32",  1,   4,   1, QTYPE_F32),
    T(QTYPE_F16,  "f16",  1,   2,   1, QTYPE_F16),
    T(QTYPE_Q4_0, "q4_0", 32,  18,  1, QTYPE_Q8_0),
    T(QTYPE_Q4_1, "q4_1", 32,  20,  1, QTYPE_Q8_1),
    T(QTYPE_Q5_0, "q5_0", 32,  22,  1, QTYPE_Q8_0),
    T(QTYPE_Q5_1, "q5_1", 32,  24,  1, QTYPE_Q8_1),
    T(QTYPE_Q8_0, "q8_0", 32,  34,  1, QTYPE_Q8_0),
    T(QTYPE_Q8_1, "q8_1", 32,  36,  1, QTYPE_Q8_1),
    T(QTYPE_Q2_K, "q2_K", 256, 84,  1, QTYPE_Q8_K),
    T(QTYPE_Q3_K, "q3_K", 256, 110, 1, QTYPE_Q8_K),
    T(QTYPE_Q4_K, "q4_K", 256, 144, 1, QTYPE_Q8_K),
    T(QTYPE_Q5_K, "q5_K", 256, 176, 1, QTYPE_Q8_K),
    T(QTYPE_Q6_K, "q6_K", 256, 210, 1, QTYPE_Q8_K),
    T(QTYPE_Q8_K, "q8_K", 256, 292, 1, QTYPE_Q8_K),
    T(16, "iq2_xxs", 256, 66,  0, QTYPE_Q8_K),
    T(17, "iq2_xs",  256, 74,  0, QTYPE_Q8_K),
    T(18, "iq3_xxs", 256, 98,  0, QTYPE_Q8_K),
    T(19, "iq1_s",   256, 50,  0, QTYPE_Q8_K),
    T(20, "iq4_nl",  32,  18,  0, QTYPE_Q8_0),
    T(21, "iq3_s",   256, 110, 0, QTYPE_Q8_K),
    T(22, "iq2_s",   256, 82,  0, QTYPE_Q8_K),
    T(23, "iq4_xs",  256, 136, 0, QTYPE_Q8_K),
    T(QTYPE_I8,   "i8",   1, 1, 0, QTYPE_I8),
    T(QTYPE_I16,  "i16",  1, 2, 0, QTYPE_I16),
    T(QTYPE_I32,  "i32",  1, 4, 0, QTYPE_I32),
    T(QTYPE_I64,  "i64",  1, 8, 0, QTYPE_I64),
    T(QTYPE_F64,  "f64",  1, 8, 0, QTYPE_F64),
    T(29, "iq1_m",   256, 56,  0, QTYPE_Q8_K),
    T(QTYPE_BF16, "bf16", 1, 2, 1, QTYPE_BF16),
    T(34, "tq1_0",   256, 54,  0, QTYPE_Q8_K),
    T(35, "tq2_0",   256, 66,  0, QTYPE_Q8_K),
    T(QTYPE_MXFP4, "mxfp4", 32, 17, 0, QTYPE_Q8_0),
};
#undef T

const qtype_info *qtype_get(int id)
{
    if (id < 0 || id >= QTYPE_MAX_ID || !k_types[id].name) return NULL;
    return &k_types[id];
}

const char *qtype_name(int id)
{
    const qtype_info *t = qtype_get(id);
    if (t) return t->name;
    /* A per-thread buffer would be a mutable global; unknown ids are rare
     * enough that a fixed word is fine. */
    return "unknown";
}

int qtype_from_name(const char *name)
{
    for (int i = 0; i < QTYPE_MAX_ID; i++)
        if (k_types[i].name && strcasecmp(k_types[i].name, name) == 0) return i;
    return -1;
}

int qtype_row_bytes(int id, int64_t n, uint64_t *out, err *e)
{
    const qtype_info *t = qtype_get(id);
    if (!t) return err_setf(e, ERR_UNSUPPORTED, "unknown ggml type id %d", id);
    if (n < 0 || n % t->blck != 0)
        return err_setf(e, ERR_FORMAT, "row of %lld elements is not a multiple of %s's block size %d",
                        (long long)n, t->name, t->blck);
    *out = (uint64_t)(n / t->blck) * (uint64_t)t->type_size;
    return 0;
}

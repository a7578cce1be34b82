/* hparams: see hparams.h. Every getter first looks the key up, so an
 * optional key that is absent never touches the caller's err (the gguf
 * getters record "not found" messages, which would win over the real
 * error later). */
#include "model/hparams.h"

#include <stdio.h>
#include <string.h>

/* Integer key "<arch>.<name>": scalar, or a per-layer array whose values must
 * all be equal (qwen3moe's graph uses one value for every layer). */
static int get_int(const gguf_file *f, const hparams *hp, const char *name, int required,
                   int64_t def, int64_t lo, int64_t hi, int *out, err *e)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", hp->arch, name);
    int64_t kv = gguf_find_key(f, key);
    if (kv < 0) {
        if (required) return err_setf(e, ERR_NOTFOUND, "missing key %s", key);
        *out = (int)def;
        return 0;
    }
    int64_t v;
    if (gguf_kv_type(f, kv) == GGUF_TYPE_ARRAY) {
        uint64_t n = gguf_kv_arr_n(f, kv);
        if (n == 0) return err_setf(e, ERR_FORMAT, "key %s: empty per-layer array", key);
        if (hp->n_layer > 0 && n != (uint64_t)hp->n_layer)
            return err_setf(e, ERR_FORMAT, "key %s: per-layer array has %llu values for %d layers",
                            key, (unsigned long long)n, hp->n_layer);
        int rc = gguf_get_arr_i64(f, kv, 0, &v, e);
        if (rc) return rc;
        for (uint64_t j = 1; j < n; j++) {
            int64_t vj;
            rc = gguf_get_arr_i64(f, kv, j, &vj, e);
            if (rc) return rc;
            if (vj != v)
                return err_setf(e, ERR_UNSUPPORTED, "key %s: per-layer values differ (layer 0: %lld, layer %llu: %lld); "
                                "qwen3moe uses one value for all layers", key, (long long)v,
                                (unsigned long long)j, (long long)vj);
        }
    } else {
        int rc = gguf_get_i64(f, key, &v, e);
        if (rc) return rc;
    }
    if (v < lo || v > hi)
        return err_setf(e, ERR_FORMAT, "key %s: value %lld out of range [%lld, %lld]", key,
                        (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int get_float(const gguf_file *f, const hparams *hp, const char *name, int required,
                     float def, float *out, err *e)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", hp->arch, name);
    if (gguf_find_key(f, key) < 0) {
        if (required) return err_setf(e, ERR_NOTFOUND, "missing key %s", key);
        *out = def;
        return 0;
    }
    return gguf_get_f32(f, key, out, e);
}

int hparams_load(hparams *hp, const gguf_file *f, err *e)
{
    memset(hp, 0, sizeof *hp);
    if (gguf_find_key(f, "general.architecture") < 0)
        return err_setf(e, ERR_FORMAT, "missing key general.architecture");
    gguf_str arch;
    int rc = gguf_get_str(f, "general.architecture", &arch, e);
    if (rc) return rc;
    if (arch.n >= sizeof hp->arch || !gguf_str_eq(arch, "qwen3moe")) {
        char name[64];
        size_t n = arch.n < sizeof name - 1 ? (size_t)arch.n : sizeof name - 1;
        memcpy(name, arch.p, n);
        name[n] = '\0';
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)name[i] < 32 || (unsigned char)name[i] > 126) name[i] = '?';
        return err_setf(e, ERR_UNSUPPORTED, "unsupported architecture '%s' (strata runs qwen3moe)", name);
    }
    memcpy(hp->arch, arch.p, (size_t)arch.n);
    hp->arch[arch.n] = '\0';

    const int64_t big = 1 << 24;
    if ((rc = get_int(f, hp, "block_count", 1, 0, 1, 4096, &hp->n_layer, e))) return rc;
    if ((rc = get_int(f, hp, "embedding_length", 1, 0, 1, big, &hp->n_embd, e))) return rc;
    if ((rc = get_int(f, hp, "context_length", 1, 0, 1, INT32_MAX, &hp->n_ctx_train, e))) return rc;
    if ((rc = get_int(f, hp, "attention.head_count", 1, 0, 1, 65536, &hp->n_head, e))) return rc;
    if ((rc = get_int(f, hp, "attention.head_count_kv", 0, hp->n_head, 1, 65536, &hp->n_head_kv, e))) return rc;
    if (hp->n_head % hp->n_head_kv != 0)
        return err_setf(e, ERR_FORMAT, "key %s.attention.head_count %d is not a multiple of head_count_kv %d",
                        hp->arch, hp->n_head, hp->n_head_kv);
    int dk, dv;
    if ((rc = get_int(f, hp, "attention.key_length", 0, hp->n_embd / hp->n_head, 1, 65536, &dk, e))) return rc;
    if ((rc = get_int(f, hp, "attention.value_length", 0, hp->n_embd / hp->n_head, 1, 65536, &dv, e))) return rc;
    if (dk != dv)
        return err_setf(e, ERR_UNSUPPORTED, "key_length %d != value_length %d (qwen3moe needs equal head sizes)", dk, dv);
    if (dk % 2)
        return err_setf(e, ERR_FORMAT, "head size %d is odd (RoPE rotates pairs)", dk);
    hp->head_dim = dk;
    if ((rc = get_float(f, hp, "attention.layer_norm_rms_epsilon", 1, 0.0f, &hp->rms_eps, e))) return rc;
    if (!(hp->rms_eps >= 0.0f))
        return err_setf(e, ERR_FORMAT, "key %s.attention.layer_norm_rms_epsilon is negative", hp->arch);
    if ((rc = get_float(f, hp, "rope.freq_base", 0, 10000.0f, &hp->rope_freq_base, e))) return rc;
    if (!(hp->rope_freq_base > 0.0f))
        return err_setf(e, ERR_FORMAT, "key %s.rope.freq_base must be positive", hp->arch);
    if ((rc = get_int(f, hp, "rope.dimension_count", 0, hp->head_dim, 2, 65536, &hp->n_rot, e))) return rc;
    if (hp->n_rot != hp->head_dim)
        return err_setf(e, ERR_UNSUPPORTED, "rope.dimension_count %d != head size %d (llama.cpp requires them "
                        "equal for qwen3moe)", hp->n_rot, hp->head_dim);

    /* RoPE scaling: absent type means "linear" in llama.cpp; the factor
     * (or the older rope.scale_linear key) sets freq_scale = 1/factor. */
    char tkey[128];
    snprintf(tkey, sizeof tkey, "%s.rope.scaling.type", hp->arch);
    if (gguf_find_key(f, tkey) >= 0) {
        gguf_str t;
        if ((rc = gguf_get_str(f, tkey, &t, e))) return rc;
        if (gguf_str_eq(t, "yarn") || gguf_str_eq(t, "longrope")) {
            return err_setf(e, ERR_UNSUPPORTED, "rope scaling type '%s' is not supported yet (only none/linear)",
                            gguf_str_eq(t, "yarn") ? "yarn" : "longrope");
        }
        if (!gguf_str_eq(t, "none") && !gguf_str_eq(t, "linear"))
            return err_setf(e, ERR_UNSUPPORTED, "unknown rope scaling type in %s", tkey);
    }
    float factor = 0.0f;
    if ((rc = get_float(f, hp, "rope.scaling.factor", 0, 0.0f, &factor, e))) return rc;
    if (factor == 0.0f && (rc = get_float(f, hp, "rope.scale_linear", 0, 0.0f, &factor, e))) return rc;
    if (factor < 0.0f) return err_setf(e, ERR_FORMAT, "rope scaling factor %g is negative", (double)factor);
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;

    if ((rc = get_int(f, hp, "expert_count", 1, 0, 1, 65536, &hp->n_expert, e))) return rc;
    if ((rc = get_int(f, hp, "expert_used_count", 1, 0, 1, 65536, &hp->n_expert_used, e))) return rc;
    if (hp->n_expert_used > hp->n_expert)
        return err_setf(e, ERR_FORMAT, "expert_used_count %d > expert_count %d", hp->n_expert_used, hp->n_expert);
    int n_ff = 0;
    if ((rc = get_int(f, hp, "feed_forward_length", 0, 0, 0, big, &n_ff, e))) return rc;
    if ((rc = get_int(f, hp, "expert_feed_forward_length", 0, 0, 0, big, &hp->n_ff_exp, e))) return rc;
    if (hp->n_ff_exp == 0) hp->n_ff_exp = n_ff / hp->n_expert_used;
    if (hp->n_ff_exp <= 0)
        return err_setf(e, ERR_NOTFOUND, "missing key %s.expert_feed_forward_length", hp->arch);
    return 0;
}

/* weights: see weights.h.
 *
 * Binding order follows llama.cpp's qwen3moe loader: token_embd,
 * output_norm, output (optional), then per layer attn_norm, q/k/v (or fused
 * qkv), attn_output, attn_k_norm, attn_q_norm, ffn_norm, ffn_gate_inp and the
 * three expert tensors. The first problem found is reported. */
#include "model/weights.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct binder {
    const gguf_file *f;
    weights         *w;
    cpu_isa          isa;
    uint8_t         *used;   /* n_tensors flags: bound tensors */
    uint8_t        **tdata;  /* n_tensors: where each tensor's bytes are in memory (NULL: not there) */
} binder;

static void fmt_shape(char *buf, size_t cap, const int64_t *ne, int n_dims)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Bind tensor `name` with exactly the shape ne[0..n_dims) (unused dims 1).
 * Returns 0, 1 when absent and optional, or an error. */
static int bind(binder *b, const char *name, int n_dims, const int64_t *ne, int required,
                wtensor *out, err *e)
{
    int64_t idx = gguf_find_tensor(b->f, name);
    if (idx < 0) {
        if (required) return err_setf(e, ERR_NOTFOUND, "missing tensor %s", name);
        return 1;
    }
    const gguf_tensor_info *ti = gguf_tensor(b->f, idx);
    int64_t want[4] = { 1, 1, 1, 1 };
    for (int i = 0; i < n_dims; i++) want[i] = ne[i];
    for (int i = 0; i < 4; i++) {
        if (ti->ne[i] != want[i]) {
            char got[96], exp[96];
            fmt_shape(got, sizeof got, ti->ne, ti->n_dims);
            fmt_shape(exp, sizeof exp, want, n_dims);
            return err_setf(e, ERR_FORMAT, "tensor %s: shape %s but expected %s", name, got, exp);
        }
    }
    const qtype_info *qi = qtype_get(ti->type);
    if (!qi || !qi->supported)
        return err_setf(e, ERR_UNSUPPORTED, "tensor %s: type %s is not supported", name, qtype_name(ti->type));
    memset(out, 0, sizeof *out);
    err tmp = { 0 };
    if (quant_ops_get(ti->type, b->isa, &out->ops, &tmp) != 0 ||
        quant_ops_get(out->ops.dot_type, b->isa, &out->act, &tmp) != 0)
        return err_setf(e, ERR_UNSUPPORTED, "tensor %s: type %s is not supported (%s)", name,
                        qtype_name(ti->type), tmp.msg);
    out->act.quant = out->act.act_quant;   /* inputs: ggml-cpu's rounding, not the weights' (quant.h) */
    uint64_t act_bytes;
    if (qtype_row_bytes(out->ops.dot_type, ti->ne[0], &act_bytes, &tmp) != 0)
        return err_setf(e, ERR_UNSUPPORTED, "tensor %s: rows of %lld do not fit activation type %s", name,
                        (long long)ti->ne[0], qtype_name(out->ops.dot_type));
    out->data = b->tdata[idx];
    out->type = ti->type;
    for (int i = 0; i < 4; i++) out->ne[i] = ti->ne[i];
    out->row_bytes = ti->nb[1];
    out->act_bytes = act_bytes;
    if (!b->used[idx]) {
        b->used[idx] = 1;
        uint64_t n = (uint64_t)ti->ne[0] * (uint64_t)ti->ne[1] * (uint64_t)ti->ne[2] * (uint64_t)ti->ne[3];
        b->w->n_params += n;
        b->w->n_bytes += ti->bytes;
        b->w->bytes_by_type[ti->type] += ti->bytes;
    }
    return 0;
}

/* Bind a 1-D norm vector of n elements and dequantize it to *dst (n floats). */
static int bind_norm(binder *b, const char *name, int64_t n, float *dst, err *e)
{
    wtensor t;
    int rc = bind(b, name, 1, &n, 1, &t, e);
    if (rc) return rc;
    t.ops.dequant(t.data, dst, n);
    return 0;
}

/* A routed-expert tensor ("blk.N.ffn_{gate,up,down}_exps.weight"): never
 * read in WEIGHTS_RESIDENT_ONLY. */
static int is_expert_tensor(gguf_str name)
{
    static const char *suffix = "_exps.weight";
    const uint64_t n = 12;
    return name.n > n && !memcmp(name.p + name.n - n, suffix, n);
}

/* WEIGHTS_RESIDENT_ONLY: read every non-expert tensor into one buffer
 * (each at a 64-byte aligned offset) and point tdata at them. */
static int read_resident(const gguf_file *f, weights *w, uint8_t **tdata, err *e)
{
    const int64_t n = gguf_n_tensors(f);
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_info *ti = gguf_tensor(f, i);
        if (is_expert_tensor(ti->name)) continue;
        total = (total + 63) & ~(uint64_t)63;
        total += ti->bytes;
    }
    w->resident = malloc(total ? (size_t)total : 1);
    if (!w->resident)
        return err_setf(e, ERR_NOMEM, "cannot allocate %.1f MB for the non-expert weights", (double)total / 1e6);
    w->resident_bytes = total;
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_info *ti = gguf_tensor(f, i);
        if (is_expert_tensor(ti->name)) continue;
        off = (off + 63) & ~(uint64_t)63;
        tdata[i] = w->resident + off;
        if (ti->bytes) {
            int rc = gguf_read_tensor(f, i, 0, tdata[i], ti->bytes, e);
            if (rc) return rc;
        }
        off += ti->bytes;
    }
    /* The file's pages these reads left in the page cache are clean: the
     * kernel reclaims them under memory pressure (a memory cgroup's too),
     * and while they last the next start reads from RAM. */
    return 0;
}

int weights_open(weights **out, const gguf_file *f, hparams *hp, cpu_isa isa, int mode, err *e)
{
    *out = NULL;
    int fd = gguf_fd(f);
    if (fd < 0) return err_setf(e, ERR_USAGE, "weights need a GGUF opened from a file");
    weights *w = calloc(1, sizeof *w);
    if (!w) return err_setf(e, ERR_NOMEM, "out of memory");
    w->fd = fd;
    w->file_size = gguf_file_size(f);
    w->mode = mode == WEIGHTS_RESIDENT_ONLY ? WEIGHTS_RESIDENT_ONLY : WEIGHTS_MAP_ALL;
    int rc = 0;
    uint8_t *used = NULL;
    uint8_t **tdata = NULL;

    struct stat st;
    if (fstat(fd, &st) != 0) { rc = err_setf(e, ERR_IO, "cannot stat model file: %s", strerror(errno)); goto fail; }
    if ((uint64_t)st.st_size != w->file_size) {
        rc = err_setf(e, ERR_IO, "model file changed size while loading (%llu, now %llu bytes)",
                      (unsigned long long)w->file_size, (unsigned long long)st.st_size);
        goto fail;
    }
    w->mtime = st.st_mtim;

    int64_t n_tensors = gguf_n_tensors(f);
    tdata = calloc((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof *tdata);
    if (!tdata) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
    if (w->mode == WEIGHTS_MAP_ALL) {
        /* Populate the mapping up front when the file fits in memory, as
         * llama.cpp does (its mmap prefetch): otherwise every first touch of
         * a 4 KB page costs a page fault inside the forward pass, and decode
         * over randomly routed experts faults for many tokens (tg32 on a
         * 5.9 GB file: 1.4 then 4.6 then 7.6 tok/s in consecutive runs).
         * A file larger than 3/4 of the physical memory is mapped lazily:
         * populating it would only evict its own pages. */
        int flags = MAP_PRIVATE;
        const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0 && w->file_size <= (uint64_t)pages / 4 * 3 * (uint64_t)psz) flags |= MAP_POPULATE;
        void *m = mmap(NULL, (size_t)w->file_size, PROT_READ, flags, fd, 0);
        if (m == MAP_FAILED) { rc = err_setf(e, ERR_IO, "cannot map model file: %s", strerror(errno)); goto fail; }
        w->map = m;
        w->map_bytes = w->file_size;
        for (int64_t i = 0; i < n_tensors; i++) tdata[i] = (uint8_t *)w->map + gguf_tensor(f, i)->file_off;
    } else if ((rc = read_resident(f, w, tdata, e))) {
        goto fail;
    }

    used = calloc((size_t)(n_tensors > 0 ? n_tensors : 1), 1);
    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    const int64_t E = hp->n_embd, D = hp->head_dim, L = hp->n_layer;
    w->norms = malloc(sizeof(float) * (size_t)(E + L * (2 * E + 2 * D)));
    if (!used || !w->layers || !w->norms) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
    binder b = { f, w, isa, used, tdata };

    /* token_embd fixes n_vocab (checked against the tokenizer by the engine). */
    int64_t idx = gguf_find_tensor(f, "token_embd.weight");
    if (idx < 0) { rc = err_setf(e, ERR_NOTFOUND, "missing tensor token_embd.weight"); goto fail; }
    const gguf_tensor_info *te = gguf_tensor(f, idx);
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > INT32_MAX) {
        int64_t want[2] = { E, te->ne[1] };
        char got[96], exp[96];
        fmt_shape(got, sizeof got, te->ne, te->n_dims);
        fmt_shape(exp, sizeof exp, want, 2);
        rc = err_setf(e, ERR_FORMAT, "tensor token_embd.weight: shape %s but expected %s", got, exp);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    const int64_t V = hp->n_vocab;
    { int64_t ne[2] = { E, V }; if ((rc = bind(&b, "token_embd.weight", 2, ne, 1, &w->tok_embd, e))) goto fail; }

    float *np = w->norms;
    if ((rc = bind_norm(&b, "output_norm.weight", E, np, e))) goto fail;
    w->output_norm = np; np += E;
    {
        int64_t ne[2] = { E, V };
        rc = bind(&b, "output.weight", 2, ne, 0, &w->output, e);
        if (rc < 0) goto fail;
        if (rc == 1) { w->output = w->tok_embd; w->output_tied = 1; }
        rc = 0;
    }

    const int64_t QD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_head_kv * D;
    const int64_t F = hp->n_ff_exp, X = hp->n_expert;
    for (int l = 0; l < L; l++) {
        layer_weights *lw = &w->layers[l];
        char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        if ((rc = bind_norm(&b, NAME("attn_norm.weight"), E, np, e))) goto fail;
        lw->attn_norm = np; np += E;

        /* Q, K, V: separate, or one fused tensor whose rows are q | k | v. */
        if (gguf_find_tensor(f, NAME("attn_q.weight")) < 0 && gguf_find_tensor(f, NAME("attn_qkv.weight")) >= 0) {
            wtensor qkv;
            int64_t ne[2] = { E, QD + 2 * KVD };
            if ((rc = bind(&b, NAME("attn_qkv.weight"), 2, ne, 1, &qkv, e))) goto fail;
            lw->wq = lw->wk = lw->wv = qkv;
            lw->wq.ne[1] = QD;
            lw->wk.ne[1] = KVD;
            lw->wk.data = qkv.data + (uint64_t)QD * qkv.row_bytes;
            lw->wv.ne[1] = KVD;
            lw->wv.data = qkv.data + (uint64_t)(QD + KVD) * qkv.row_bytes;
        } else {
            int64_t nq[2] = { E, QD }, nkv[2] = { E, KVD };
            if ((rc = bind(&b, NAME("attn_q.weight"), 2, nq, 1, &lw->wq, e))) goto fail;
            if ((rc = bind(&b, NAME("attn_k.weight"), 2, nkv, 1, &lw->wk, e))) goto fail;
            if ((rc = bind(&b, NAME("attn_v.weight"), 2, nkv, 1, &lw->wv, e))) goto fail;
        }
        { int64_t ne[2] = { QD, E }; if ((rc = bind(&b, NAME("attn_output.weight"), 2, ne, 1, &lw->wo, e))) goto fail; }
        if ((rc = bind_norm(&b, NAME("attn_k_norm.weight"), D, np, e))) goto fail;
        lw->k_norm = np; np += D;
        if ((rc = bind_norm(&b, NAME("attn_q_norm.weight"), D, np, e))) goto fail;
        lw->q_norm = np; np += D;
        if ((rc = bind_norm(&b, NAME("ffn_norm.weight"), E, np, e))) goto fail;
        lw->ffn_norm = np; np += E;
        { int64_t ne[2] = { E, X }; if ((rc = bind(&b, NAME("ffn_gate_inp.weight"), 2, ne, 1, &lw->gate_inp, e))) goto fail; }
        {
            int64_t gu[3] = { E, F, X }, dn[3] = { F, E, X };
            if ((rc = bind(&b, NAME("ffn_gate_exps.weight"), 3, gu, 1, &lw->gate_exps, e))) goto fail;
            if ((rc = bind(&b, NAME("ffn_down_exps.weight"), 3, dn, 1, &lw->down_exps, e))) goto fail;
            if ((rc = bind(&b, NAME("ffn_up_exps.weight"), 3, gu, 1, &lw->up_exps, e))) goto fail;
            w->expert_bytes += (uint64_t)X * F * (lw->gate_exps.row_bytes + lw->up_exps.row_bytes)
                             + (uint64_t)X * E * lw->down_exps.row_bytes;
        }
#undef NAME
    }

    /* llama.cpp refuses files with tensors the architecture does not use. */
    for (int64_t i = 0; i < n_tensors; i++) {
        if (used[i]) continue;
        const gguf_tensor_info *ti = gguf_tensor(f, i);
        int n = ti->name.n < 80 ? (int)ti->name.n : 80;
        rc = err_setf(e, ERR_FORMAT, "unexpected tensor %.*s (qwen3moe does not use it)", n, ti->name.p);
        goto fail;
    }
    free(used);
    free(tdata);
    *out = w;
    return 0;

fail:
    free(used);
    free(tdata);
    weights_close(w);
    return rc ? rc : ERR_INTERNAL;
}

void weights_close(weights *w)
{
    if (!w) return;
    if (w->map) munmap((void *)w->map, (size_t)w->map_bytes);
    free(w->resident);
    free(w->layers);
    free(w->norms);
    free(w);
}

int weights_check_file(const weights *w, err *e)
{
    struct stat st;
    if (fstat(w->fd, &st) != 0) return err_setf(e, ERR_IO, "cannot stat model file: %s", strerror(errno));
    if ((uint64_t)st.st_size != w->file_size)
        return err_setf(e, ERR_IO, "model file changed size since it was opened (%llu, now %llu bytes)",
                        (unsigned long long)w->file_size, (unsigned long long)st.st_size);
    if (st.st_mtim.tv_sec != w->mtime.tv_sec || st.st_mtim.tv_nsec != w->mtime.tv_nsec)
        return err_setf(e, ERR_IO, "model file was modified since it was opened");
    return 0;
}

uint64_t weights_resident_bytes(const weights *w)
{
    return w->mode == WEIGHTS_MAP_ALL ? w->map_bytes : w->resident_bytes;
}

/* quant_tool: exposes strata's quant kernels to the Python oracle tests
 * (tests/ref/test_dequant.py). A test tool, not a front end.
 *
 *   quant_tool dequant  TYPE IN.bin OUT.f32          raw blocks -> float32
 *   quant_tool quantize TYPE IN.f32 OUT.bin          float32 -> raw blocks (weights)
 *   quant_tool actquant TYPE IN.f32 OUT.bin [scalar|best]
 *                                                    float32 -> raw blocks as
 *                                                    activations (act_quant)
 *   quant_tool matmul   TYPE K W.bin X.f32 OUT.f32 [scalar|best]
 *        W: M rows of K elements of TYPE; X: N vectors of K floats.
 *        Each x is first quantized to TYPE's dot_type with that type's
 *        act_quant (as ggml-cpu does), then OUT[n][m] = dot(W[m], q(x[n])).
 *
 * TYPE is a ggml type name ("q4_K") or id. dequant/quantize go through the
 * scalar reference wrappers quant_dequantize/quant_quantize; actquant and
 * matmul through quant_ops_get() on the chosen ISA (default: best). Exit 0 on
 * success; on error one line on stderr and exit 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/qtype.h"
#include "quant/quant.h"
#include "util/err.h"

static int die(const char *msg, const char *arg)
{
    fprintf(stderr, "quant_tool: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    return 1;
}

/* Read a whole file into a malloc'd buffer; NULL on error. */
static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    void *buf = malloc(sz > 0 ? (size_t)sz : 1);
    if (buf && sz > 0 && fread(buf, 1, (size_t)sz, f) != (size_t)sz) { free(buf); buf = NULL; }
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

static int write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(buf, 1, n, f);
    int rc = fclose(f);
    return (w == n && rc == 0) ? 0 : -1;
}

static int parse_type(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && *end == '\0') return qtype_get((int)v) ? (int)v : -1;
    return qtype_from_name(s);
}

static int cmd_dequant(int type, const char *in, const char *out)
{
    const qtype_info *ti = qtype_get(type);
    size_t n;
    uint8_t *src = read_file(in, &n);
    if (!src) return die("cannot read", in);
    if (n % (size_t)ti->type_size) { free(src); return die("input is not whole blocks", in); }
    int64_t ne = (int64_t)(n / (size_t)ti->type_size) * ti->blck;
    float *dst = malloc((size_t)(ne ? ne : 1) * sizeof(float));
    err e = {0};
    int rc = dst ? quant_dequantize(type, src, dst, ne, &e) : ERR_NOMEM;
    if (rc == 0 && write_file(out, dst, (size_t)ne * sizeof(float)) != 0) rc = die("cannot write", out);
    else if (rc != 0) fprintf(stderr, "quant_tool: dequant %s: %s\n", ti->name, e.msg);
    free(src);
    free(dst);
    return rc ? 1 : 0;
}

static int cmd_quantize(int type, const char *in, const char *out)
{
    const qtype_info *ti = qtype_get(type);
    size_t n;
    float *src = read_file(in, &n);
    if (!src) return die("cannot read", in);
    int64_t ne = (int64_t)(n / sizeof(float));
    if (n % sizeof(float) || ne % ti->blck) { free(src); return die("input is not whole blocks of floats", in); }
    size_t ob = (size_t)(ne / ti->blck) * (size_t)ti->type_size;
    uint8_t *dst = malloc(ob ? ob : 1);
    err e = {0};
    int rc = dst ? quant_quantize(type, src, dst, ne, &e) : ERR_NOMEM;
    if (rc == 0 && write_file(out, dst, ob) != 0) rc = die("cannot write", out);
    else if (rc != 0) fprintf(stderr, "quant_tool: quantize %s: %s\n", ti->name, e.msg);
    free(src);
    free(dst);
    return rc ? 1 : 0;
}

static int cmd_matmul(int type, int64_t k, const char *wpath, const char *xpath, const char *out,
                      const char *isa_name)
{
    cpu_isa isa = cpu_best_isa();
    if (isa_name && strcmp(isa_name, "scalar") == 0) isa = CPU_ISA_SCALAR;
    else if (isa_name && strcmp(isa_name, "best") != 0) return die("isa must be scalar or best", isa_name);

    err e = {0};
    quant_ops wops, aops;
    if (quant_ops_get(type, isa, &wops, &e) != 0) return die("quant_ops_get", e.msg);
    const qtype_info *wt = qtype_get(type), *at = qtype_get(wops.dot_type);
    if (!wt || !at || k <= 0 || k % wt->blck || k % at->blck) return die("bad K for the type", NULL);
    int a_is_f32 = wops.dot_type == QTYPE_F32;
    if (!a_is_f32 && quant_ops_get(wops.dot_type, isa, &aops, &e) != 0) return die("quant_ops_get(dot_type)", e.msg);

    size_t wn, xn;
    uint8_t *w = read_file(wpath, &wn);
    float *x = read_file(xpath, &xn);
    size_t wrow = (size_t)(k / wt->blck) * (size_t)wt->type_size;
    size_t arow = (size_t)(k / at->blck) * (size_t)at->type_size;
    if (!w || !x || wn % wrow || xn % ((size_t)k * sizeof(float))) {
        free(w); free(x);
        return die("bad input sizes", NULL);
    }
    int64_t m = (int64_t)(wn / wrow), nv = (int64_t)(xn / ((size_t)k * sizeof(float)));
    uint8_t *a = malloc(arow);
    float *o = malloc((size_t)(m * nv > 0 ? m * nv : 1) * sizeof(float));
    if (!a || !o) { free(w); free(x); free(a); free(o); return die("out of memory", NULL); }
    for (int64_t j = 0; j < nv; j++) {
        const float *xj = x + j * k;
        const void *aj = xj;
        if (!a_is_f32) { aops.act_quant(xj, a, k); aj = a; }
        for (int64_t i = 0; i < m; i++) o[j * m + i] = wops.dot(k, w + (size_t)i * wrow, aj);
    }
    int rc = write_file(out, o, (size_t)(m * nv) * sizeof(float)) == 0 ? 0 : die("cannot write", out);
    free(w); free(x); free(a); free(o);
    return rc;
}

static int cmd_actquant(int type, const char *in, const char *out, const char *isa_name)
{
    cpu_isa isa = cpu_best_isa();
    if (isa_name && strcmp(isa_name, "scalar") == 0) isa = CPU_ISA_SCALAR;
    else if (isa_name && strcmp(isa_name, "best") != 0) return die("isa must be scalar or best", isa_name);
    err e = {0};
    quant_ops ops;
    if (quant_ops_get(type, isa, &ops, &e) != 0) return die("quant_ops_get", e.msg);
    if (!ops.act_quant) return die("no act_quant for this type", NULL);
    const qtype_info *ti = qtype_get(type);
    size_t n;
    float *src = read_file(in, &n);
    if (!src) return die("cannot read", in);
    int64_t ne = (int64_t)(n / sizeof(float));
    if (n % sizeof(float) || ne % ti->blck) { free(src); return die("input is not whole blocks of floats", in); }
    size_t ob = (size_t)(ne / ti->blck) * (size_t)ti->type_size;
    uint8_t *dst = malloc(ob ? ob : 1);
    if (!dst) { free(src); return die("out of memory", NULL); }
    ops.act_quant(src, dst, ne);
    int rc = write_file(out, dst, ob) == 0 ? 0 : die("cannot write", out);
    free(src);
    free(dst);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: quant_tool dequant|quantize TYPE IN OUT\n"
                        "       quant_tool actquant TYPE IN.f32 OUT.bin [scalar|best]\n"
                        "       quant_tool matmul TYPE K W.bin X.f32 OUT.f32 [scalar|best]\n");
        return 2;
    }
    int type = parse_type(argv[2]);
    if (type < 0) return die("unknown type", argv[2]);
    if (strcmp(argv[1], "dequant") == 0) return cmd_dequant(type, argv[3], argv[4]);
    if (strcmp(argv[1], "quantize") == 0) return cmd_quantize(type, argv[3], argv[4]);
    if (strcmp(argv[1], "actquant") == 0) return cmd_actquant(type, argv[3], argv[4], argc > 5 ? argv[5] : NULL);
    if (strcmp(argv[1], "matmul") == 0 && argc >= 7)
        return cmd_matmul(type, strtoll(argv[3], NULL, 10), argv[4], argv[5], argv[6], argc > 7 ? argv[7] : NULL);
    return die("unknown command", argv[1]);
}

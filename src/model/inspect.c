/* inspect: the report behind `strata inspect` (see inspect.h).
 *
 * Owns nothing beyond one call: opens the file with gguf_open (header only),
 * prints, closes. The MoE summary recognises routed-expert tensors by name,
 * as llama.cpp names them: blk.<layer>.ffn_{gate,up,down,gate_up}_exps.weight,
 * 3-D with ne[2] = n_expert, so one expert's slice of each is nb[2] bytes at
 * offset e * nb[2]. A layer's "expert blob" is the sum of those slices: what
 * the expert store reads for one layer-expert. Layer numbers come from
 * untrusted names, so they are never used to size an allocation: the
 * per-layer sums are built by sorting (layer, bytes) pairs. */
#include "model/inspect.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/qtype.h"

#define INSPECT_DEFAULT_MAX_ARRAY 8

/* "1.57 MB": decimal units, like the seed report. */
static const char *human(char *buf, size_t cap, uint64_t b)
{
    static const char *const units[] = { "B", "kB", "MB", "GB", "TB", "PB" };
    double v = (double)b;
    int u = 0;
    while (v >= 1000.0 && u < 5) { v /= 1000.0; u++; }
    if (u == 0) snprintf(buf, cap, "%" PRIu64 " B", b);
    else snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

/* Is `name` a routed-expert tensor? Sets *layer (from the digits). */
static int expert_tensor(gguf_str name, long *layer)
{
    static const char *const suffixes[] = {
        ".ffn_gate_exps.weight", ".ffn_up_exps.weight", ".ffn_down_exps.weight", ".ffn_gate_up_exps.weight",
    };
    if (name.n < 5 || memcmp(name.p, "blk.", 4) != 0) return 0;
    uint64_t i = 4;
    long l = 0;
    while (i < name.n && name.p[i] >= '0' && name.p[i] <= '9' && i < 13) l = l * 10 + (name.p[i++] - '0');
    if (i == 4 || i >= name.n || (name.p[i] >= '0' && name.p[i] <= '9')) return 0;
    for (size_t s = 0; s < sizeof suffixes / sizeof suffixes[0]; s++) {
        size_t n = strlen(suffixes[s]);
        if (name.n - i == n && memcmp(name.p + i, suffixes[s], n) == 0) { *layer = l; return 1; }
    }
    return 0;
}

typedef struct layer_part { long layer; uint64_t bytes; } layer_part;

static int cmp_part(const void *a, const void *b)
{
    const layer_part *x = a, *y = b;
    return (x->layer > y->layer) - (x->layer < y->layer);
}

/* A kv's type as a column: "u32", "string", "u32[10]". */
static const char *type_col(const gguf_file *f, int64_t i, char *buf, size_t cap)
{
    if (gguf_kv_type(f, i) == GGUF_TYPE_ARRAY)
        snprintf(buf, cap, "%s[%" PRIu64 "]", gguf_type_name(gguf_kv_arr_type(f, i)), gguf_kv_arr_n(f, i));
    else
        snprintf(buf, cap, "%s", gguf_type_name(gguf_kv_type(f, i)));
    return buf;
}

/* Print a name (key or tensor) safely: control bytes as '?'. */
static void put_name(FILE *out, gguf_str s, int width)
{
    for (uint64_t j = 0; j < s.n; j++) {
        unsigned char c = (unsigned char)s.p[j];
        fputc(c < 0x20 || c == 0x7f ? '?' : c, out);
    }
    for (int pad = width - (int)(s.n > (uint64_t)width ? (uint64_t)width : s.n); pad > 0; pad--) fputc(' ', out);
}

/* "[32, 32, 4]" into buf; returns its length. */
static int shape_str(const gguf_tensor_info *t, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    if ((size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "]");
    return n;
}

static void print_summary(FILE *out, const gguf_file *f, layer_part *parts, int64_t n_parts,
                          uint64_t expert_bytes, int64_t n_expert_tensors, uint64_t other_bytes)
{
    char h1[32], h2[32];
    fprintf(out, "\nsummary:\n");
    gguf_str arch = { "", 0 };
    char key[160];
    if (gguf_get_str(f, "general.architecture", &arch, NULL) == 0) {
        fprintf(out, "  architecture         ");
        put_name(out, arch, 0);
        fputc('\n', out);
    } else {
        fprintf(out, "  architecture         (no general.architecture key)\n");
    }
    int have_arch = arch.n > 0 && arch.n < 100;
    int64_t v;
    snprintf(key, sizeof key, "%.*s.block_count", (int)(have_arch ? arch.n : 0), arch.p);
    if (have_arch && gguf_get_i64(f, key, &v, NULL) == 0) fprintf(out, "  layers               %" PRId64 "\n", v);
    else fprintf(out, "  layers               (no %s key)\n", have_arch ? key : "<arch>.block_count");
    int64_t n_exp = -1, n_used = -1;
    snprintf(key, sizeof key, "%.*s.expert_count", (int)(have_arch ? arch.n : 0), arch.p);
    if (have_arch) gguf_get_i64(f, key, &n_exp, NULL);
    snprintf(key, sizeof key, "%.*s.expert_used_count", (int)(have_arch ? arch.n : 0), arch.p);
    if (have_arch) gguf_get_i64(f, key, &n_used, NULL);
    if (n_exp >= 0 && n_used >= 0)
        fprintf(out, "  experts              %" PRId64 " per layer, %" PRId64 " used per token\n", n_exp, n_used);
    else if (n_exp >= 0)
        fprintf(out, "  experts              %" PRId64 " per layer (no expert_used_count key)\n", n_exp);
    else
        fprintf(out, "  experts              none (no <arch>.expert_count key)\n");

    uint64_t total = expert_bytes + other_bytes;
    double pct = total ? 100.0 * (double)expert_bytes / (double)total : 0.0;
    fprintf(out, "  routed expert bytes  %" PRIu64 " (%s, %.1f%%) in %" PRId64 " tensors\n",
            expert_bytes, human(h1, sizeof h1, expert_bytes), pct, n_expert_tensors);
    fprintf(out, "  other bytes          %" PRIu64 " (%s, %.1f%%)\n", other_bytes, human(h2, sizeof h2, other_bytes),
            total ? 100.0 - pct : 0.0);

    /* Per-layer blob = sum of nb[2] over the layer's 3-D routed tensors. */
    qsort(parts, (size_t)n_parts, sizeof *parts, cmp_part);
    int64_t n_layers = 0;
    long big_l = -1, small_l = -1;
    uint64_t big = 0, small = 0;
    for (int64_t i = 0; i < n_parts;) {
        long l = parts[i].layer;
        uint64_t sum = 0;
        for (; i < n_parts && parts[i].layer == l; i++) sum += parts[i].bytes;
        n_layers++;
        if (big_l < 0 || sum > big) { big = sum; big_l = l; }
        if (small_l < 0 || sum < small) { small = sum; small_l = l; }
    }
    if (n_layers == 0) {
        fprintf(out, "  expert blob          none (no 3-D blk.N.ffn_*_exps.weight tensors)\n");
        return;
    }
    fprintf(out, "  expert layers        %" PRId64 "\n", n_layers);
    fprintf(out, "  expert blob largest  %" PRIu64 " bytes (%s, layer %ld)\n", big, human(h1, sizeof h1, big), big_l);
    fprintf(out, "  expert blob smallest %" PRIu64 " bytes (%s, layer %ld)\n", small, human(h2, sizeof h2, small), small_l);
}

int strata_inspect(const char *path, FILE *out, const inspect_opts *o, err *e)
{
    inspect_opts dflt = { 0 };
    if (!o) o = &dflt;
    int max_arr = o->max_array > 0 ? o->max_array : INSPECT_DEFAULT_MAX_ARRAY;
    gguf_file *f = NULL;
    int rc = gguf_open(&f, path, e);
    if (rc != 0) return rc;
    int64_t n_kv = gguf_n_kv(f), n_t = gguf_n_tensors(f);
    layer_part *parts = malloc((size_t)(n_t ? n_t : 1) * sizeof *parts);
    if (!parts) { gguf_close(f); return err_setf(e, ERR_NOMEM, "out of memory"); }
    char h[32];

    fprintf(out, "file                 %s\n", path);
    fprintf(out, "version              %" PRIu32 "\n", gguf_version(f));
    fprintf(out, "size                 %" PRIu64 " bytes (%s)\n", gguf_file_size(f), human(h, sizeof h, gguf_file_size(f)));
    fprintf(out, "alignment            %" PRIu32 "\n", gguf_alignment(f));
    fprintf(out, "header               %" PRIu64 " bytes\n", gguf_header_bytes(f));
    fprintf(out, "data offset          %" PRIu64 "\n", gguf_data_off(f));
    fprintf(out, "fingerprint          %016" PRIx64 "\n", gguf_fingerprint(f));

    int kw = 8;
    for (int64_t i = 0; i < n_kv; i++) {
        uint64_t n = gguf_kv_key(f, i).n;
        if (n > (uint64_t)kw) kw = n > 48 ? 48 : (int)n;
    }
    fprintf(out, "\nmetadata (%" PRId64 " keys):\n", n_kv);
    for (int64_t i = 0; i < n_kv; i++) {
        char tc[48];
        fprintf(out, "  ");
        put_name(out, gguf_kv_key(f, i), kw);
        fprintf(out, "  %-14s ", type_col(f, i, tc, sizeof tc));
        gguf_print_kv(out, f, i, max_arr);
        fputc('\n', out);
    }

    int tw = 4, sw = 5;
    char shape[128];
    for (int64_t i = 0; i < n_t; i++) {
        uint64_t n = gguf_tensor(f, i)->name.n;
        if (n > (uint64_t)tw) tw = (int)n;   /* names are < 64 bytes */
        int k = shape_str(gguf_tensor(f, i), shape, sizeof shape);
        if (k > sw) sw = k;
    }
    uint64_t expert_bytes = 0, other_bytes = 0;
    int64_t n_parts = 0, n_expert_tensors = 0;
    if (!o->no_tensors) {
        fprintf(out, "\ntensors (%" PRId64 "):\n", n_t);
        fprintf(out, "  %-5s %-*s  %-7s %-*s %14s %14s\n", "#", tw, "name", "type", sw, "shape", "bytes", "offset");
    }
    for (int64_t i = 0; i < n_t; i++) {
        const gguf_tensor_info *t = gguf_tensor(f, i);
        long layer;
        if (expert_tensor(t->name, &layer)) {
            expert_bytes += t->bytes;
            n_expert_tensors++;
            if (t->n_dims == 3) { parts[n_parts].layer = layer; parts[n_parts].bytes = t->nb[2]; n_parts++; }
        } else {
            other_bytes += t->bytes;
        }
        if (o->no_tensors) continue;
        fprintf(out, "  %-5" PRId64 " ", i);
        put_name(out, t->name, tw);
        fprintf(out, "  %-7s ", qtype_name(t->type));
        shape_str(t, shape, sizeof shape);
        fprintf(out, "%-*s", sw, shape);
        fprintf(out, " %14" PRIu64 " %14" PRIu64 "\n", t->bytes, t->file_off);
    }
    if (o->no_tensors) fprintf(out, "\ntensors              %" PRId64 " (list skipped)\n", n_t);

    print_summary(out, f, parts, n_parts, expert_bytes, n_expert_tensors, other_bytes);
    free(parts);
    gguf_close(f);
    if (fflush(out) != 0 || ferror(out)) return err_setf(e, ERR_IO, "writing the report failed");
    return 0;
}

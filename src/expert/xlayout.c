/* xlayout: see xlayout.h. Owns one fd on the file experts are read from (the
 * sidecar or the GGUF, opened again so that O_DIRECT does not affect the
 * gguf_file's own fd), a per-layer table and, with a sidecar, the blob
 * offsets. Every query is arithmetic on those tables: no I/O after open. */
#include "expert/xlayout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "expert/sidecar.h"
#include "model/expert_src.h"
#include "util/cursor.h"

/* Part indices here are expert_src.h's `which`. */
_Static_assert(EXPERT_GATE == 0 && EXPERT_UP == 1 && EXPERT_DOWN == 2, "part order");

typedef struct xl_layer {
    int      type[3];
    uint64_t part_bytes[3];  /* one expert's slab of each part */
    uint64_t src_off[3];     /* GGUF: expert 0's slab of each part */
    uint64_t part_off[3];    /* sidecar and buffered GGUF: part offsets in the slot */
    uint64_t region_off[3];  /* direct GGUF: each part's aligned region in the slot */
    uint64_t blob_bytes;     /* sum of part_bytes */
    uint64_t read_bytes;     /* sidecar: one blob read (aligned) */
    uint64_t slot_bytes;
} xl_layer;

struct xlayout {
    int       fd;
    int       direct;
    int       sidecar;
    char     *path;          /* owned */
    int       n_layer, n_expert;
    uint64_t  fp;
    uint64_t  file_size;     /* of the file the reads go to */
    xl_layer *layers;        /* owned: n_layer */
    uint64_t *blob_off;      /* owned, sidecar only: n_layer*n_expert */
};

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ==== Opening the data file ==== */

/* Open `path` read-only; with want_direct, try O_DIRECT and check that an
 * aligned read works (some file systems accept the flag at open and refuse
 * the reads), else fall back to a buffered fd. */
static int open_data(const char *path, int want_direct, int *fd_out, int *direct_out, err *e)
{
    *fd_out = -1;
    *direct_out = 0;
    if (want_direct) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd >= 0) {
            void *probe = NULL;
            int ok = 0;
            if (posix_memalign(&probe, XLAYOUT_ALIGN, XLAYOUT_ALIGN) == 0) {
                ssize_t r = pread(fd, probe, XLAYOUT_ALIGN, 0);
                ok = r >= 0;
                free(probe);
            }
            if (ok) { *fd_out = fd; *direct_out = 1; return 0; }
            close(fd);
        } else if (errno != EINVAL) {
            return err_setf(e, errno == ENOENT ? ERR_NOTFOUND : ERR_IO, "'%s': %s", path, strerror(errno));
        }
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_setf(e, errno == ENOENT ? ERR_NOTFOUND : ERR_IO, "'%s': %s", path, strerror(errno));
    *fd_out = fd;
    return 0;
}

static int file_size_of(int fd, const char *path, uint64_t *out, err *e)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return err_setf(e, ERR_IO, "'%s': %s", path, strerror(errno));
    *out = (uint64_t)st.st_size;
    return 0;
}

/* ==== Layouts ==== */

/* GGUF source: slot regions and part offsets per layer. Direct mode gives
 * each part a region of round_up(bytes) + ALIGN: the slab can start anywhere
 * within its first aligned block, so its covering range is at most that. */
static int layout_gguf(xlayout *x, const sidecar_src_layer *src)
{
    for (int l = 0; l < x->n_layer; l++) {
        xl_layer *L = &x->layers[l];
        uint64_t region = 0, blob = 0;
        for (int w = 0; w < 3; w++) {
            L->type[w] = src[l].type[w];
            L->part_bytes[w] = src[l].slab_bytes[w];
            L->src_off[w] = src[l].file_off[w];
            L->region_off[w] = region;
            uint64_t rb = round_up(L->part_bytes[w], XLAYOUT_ALIGN) + XLAYOUT_ALIGN;
            if (rb < L->part_bytes[w] || size_add_ok(region, rb, &region)) return -1;
            if (size_add_ok(blob, L->part_bytes[w], &blob)) return -1;
        }
        L->blob_bytes = blob;
        uint64_t canon_blob = 0;
        if (sidecar_blob_layout(L->part_bytes, L->part_off, &canon_blob)) return -1;
        L->slot_bytes = x->direct ? region : round_up(canon_blob, XLAYOUT_ALIGN);
        L->read_bytes = 0;
    }
    return 0;
}

static void layout_sidecar(xlayout *x, const sidecar_index *ix)
{
    for (int l = 0; l < x->n_layer; l++) {
        xl_layer *L = &x->layers[l];
        const sidecar_layer *S = &ix->layers[l];
        uint64_t blob = 0;
        for (int w = 0; w < 3; w++) {
            L->type[w] = S->type[w];
            L->part_bytes[w] = S->part_bytes[w];
            L->part_off[w] = S->part_off[w];
            blob += S->part_bytes[w];   /* <= blob_bytes, checked by sidecar_parse */
        }
        L->blob_bytes = blob;
        L->read_bytes = S->read_bytes;
        L->slot_bytes = S->read_bytes;
    }
}

/* ==== Open / close ==== */

int xlayout_default_sidecar_path(const char *gguf_path, char *buf, uint64_t cap)
{
    int n = snprintf(buf, cap, "%s%s", gguf_path, SIDECAR_SUFFIX);
    if (n < 0 || (uint64_t)n >= cap) return ERR_RANGE;
    return 0;
}

int xlayout_open(xlayout **out, const gguf_file *f, const hparams *hp, const xlayout_opts *o, err *e)
{
    static const xlayout_opts k_default = { 0 };
    if (!o) o = &k_default;
    *out = NULL;
    const char *model = gguf_path(f);
    if (!model) return err_setf(e, ERR_USAGE, "xlayout: the GGUF must be opened from a file");
    if (hp->n_layer <= 0 || hp->n_expert <= 0)
        return err_setf(e, ERR_FORMAT, "'%s': not a mixture-of-experts model (n_layer %d, n_expert %d)",
                        model, hp->n_layer, hp->n_expert);

    xlayout *x = calloc(1, sizeof *x);
    sidecar_src_layer *src = calloc((size_t)hp->n_layer, sizeof *src);
    if (!x || !src) { free(x); free(src); return err_setf(e, ERR_NOMEM, "out of memory"); }
    x->fd = -1;
    x->n_layer = hp->n_layer;
    x->n_expert = hp->n_expert;
    x->fp = gguf_fingerprint(f);
    x->layers = calloc((size_t)hp->n_layer, sizeof *x->layers);
    int rc = x->layers ? 0 : err_setf(e, ERR_NOMEM, "out of memory");
    if (!rc) rc = sidecar_src_layers(f, hp->n_layer, hp->n_expert, src, e);

    /* Which file: an explicit sidecar must exist; the default one may not. */
    char defpath[4096];
    const char *scpath = NULL;
    if (!rc && !o->no_sidecar) {
        if (o->sidecar_path) {
            scpath = o->sidecar_path;
        } else if (xlayout_default_sidecar_path(model, defpath, sizeof defpath) == 0) {
            struct stat st;
            if (stat(defpath, &st) == 0) scpath = defpath;
            else if (errno != ENOENT)
                rc = err_setf(e, ERR_IO, "sidecar '%s': %s", defpath, strerror(errno));
        }
    }

    if (!rc && scpath) {
        /* Validate through a buffered fd (the header reads are not aligned),
         * then open the data fd as asked. */
        int vfd = open(scpath, O_RDONLY | O_CLOEXEC);
        if (vfd < 0) {
            rc = err_setf(e, errno == ENOENT ? ERR_NOTFOUND : ERR_IO, "sidecar '%s': %s", scpath, strerror(errno));
        } else {
            sidecar_index ix;
            memset(&ix, 0, sizeof ix);
            rc = sidecar_load(&ix, vfd, scpath, f, model, hp->n_layer, hp->n_expert, src, e);
            close(vfd);
            if (!rc) {
                x->sidecar = 1;
                layout_sidecar(x, &ix);
                x->blob_off = ix.blob_off;   /* take ownership */
                ix.blob_off = NULL;
                x->file_size = ix.file_bytes;
            }
            sidecar_index_free(&ix);
        }
        if (!rc) rc = open_data(scpath, o->direct, &x->fd, &x->direct, e);
        if (!rc) {
            /* The file may have been replaced between the two opens. */
            uint64_t sz = 0;
            rc = file_size_of(x->fd, scpath, &sz, e);
            if (!rc && sz != x->file_size)
                rc = err_setf(e, ERR_FORMAT, "sidecar '%s' changed while opening (%llu bytes, expected %llu); "
                              "run 'strata repack %s' to rebuild it", scpath, (unsigned long long)sz,
                              (unsigned long long)x->file_size, model);
        }
        if (!rc) x->path = strdup(scpath);
    } else if (!rc) {
        rc = open_data(model, o->direct, &x->fd, &x->direct, e);
        if (!rc) rc = file_size_of(x->fd, model, &x->file_size, e);
        if (!rc && x->file_size != gguf_file_size(f))
            rc = err_setf(e, ERR_IO, "'%s' changed size since it was opened (%llu bytes, was %llu)", model,
                          (unsigned long long)x->file_size, (unsigned long long)gguf_file_size(f));
        if (!rc && layout_gguf(x, src))
            rc = err_setf(e, ERR_FORMAT, "'%s': expert slab sizes overflow", model);
        if (!rc) x->path = strdup(model);
    }
    if (!rc && !x->path) rc = err_setf(e, ERR_NOMEM, "out of memory");
    free(src);
    if (rc) { xlayout_close(x); return rc; }
    *out = x;
    return 0;
}

void xlayout_close(xlayout *x)
{
    if (!x) return;
    if (x->fd >= 0) close(x->fd);
    free(x->path);
    free(x->layers);
    free(x->blob_off);
    free(x);
}

/* ==== Queries ==== */

int         xlayout_fd(const xlayout *x) { return x->fd; }
int         xlayout_direct(const xlayout *x) { return x->direct; }
int         xlayout_has_sidecar(const xlayout *x) { return x->sidecar; }
const char *xlayout_path(const xlayout *x) { return x->path; }
int         xlayout_n_layer(const xlayout *x) { return x->n_layer; }
int         xlayout_n_expert(const xlayout *x) { return x->n_expert; }
uint64_t    xlayout_fingerprint(const xlayout *x) { return x->fp; }

static const xl_layer *layer_of(const xlayout *x, int layer)
{
    return layer >= 0 && layer < x->n_layer ? &x->layers[layer] : NULL;
}

uint64_t xlayout_slot_bytes(const xlayout *x, int layer)
{
    const xl_layer *L = layer_of(x, layer);
    return L ? L->slot_bytes : 0;
}

uint64_t xlayout_blob_bytes(const xlayout *x, int layer)
{
    const xl_layer *L = layer_of(x, layer);
    return L ? L->blob_bytes : 0;
}

uint64_t xlayout_part_bytes(const xlayout *x, int layer, int which)
{
    const xl_layer *L = layer_of(x, layer);
    return L && which >= 0 && which < 3 ? L->part_bytes[which] : 0;
}

int xlayout_part_type(const xlayout *x, int layer, int which)
{
    const xl_layer *L = layer_of(x, layer);
    return L && which >= 0 && which < 3 ? L->type[which] : 0;
}

/* Direct GGUF read of part w of expert e: the aligned range covering the
 * slab. Slab offsets cannot overflow: sidecar_src_layers checked that the
 * whole tensor lies inside the file. */
static xread direct_gguf_read(const xlayout *x, const xl_layer *L, int expert, int w)
{
    const uint64_t off = L->src_off[w] + (uint64_t)expert * L->part_bytes[w];
    const uint64_t end = off + L->part_bytes[w];
    const uint64_t a = off / XLAYOUT_ALIGN * XLAYOUT_ALIGN;
    const uint64_t b = round_up(end, XLAYOUT_ALIGN);
    xread r = { a, b - a, L->region_off[w], b - a };
    /* The aligned end may run past EOF (the last slab of the file): pread
     * then returns the bytes up to EOF, which must include the slab. */
    if (b > x->file_size) r.need = end - a;
    return r;
}

int xlayout_reads(const xlayout *x, int layer, int expert, xread reads[XLAYOUT_MAX_READS])
{
    const xl_layer *L = layer_of(x, layer);
    if (!L || expert < 0 || expert >= x->n_expert) return -1;
    if (x->sidecar) {
        const uint64_t off = x->blob_off[(size_t)layer * (size_t)x->n_expert + (size_t)expert];
        reads[0] = (xread){ off, L->read_bytes, 0, L->read_bytes };
        return 1;
    }
    for (int w = 0; w < 3; w++) {
        if (x->direct) {
            reads[w] = direct_gguf_read(x, L, expert, w);
        } else {
            const uint64_t off = L->src_off[w] + (uint64_t)expert * L->part_bytes[w];
            reads[w] = (xread){ off, L->part_bytes[w], L->part_off[w], L->part_bytes[w] };
        }
    }
    return 3;
}

uint64_t xlayout_part_off(const xlayout *x, int layer, int expert, int which)
{
    const xl_layer *L = layer_of(x, layer);
    if (!L || expert < 0 || expert >= x->n_expert || which < 0 || which > 2) return 0;
    if (x->sidecar || !x->direct) return L->part_off[which];
    const uint64_t off = L->src_off[which] + (uint64_t)expert * L->part_bytes[which];
    return L->region_off[which] + off % XLAYOUT_ALIGN;
}

uint64_t xlayout_read_bytes(const xlayout *x, int layer, int expert)
{
    xread r[XLAYOUT_MAX_READS];
    const int n = xlayout_reads(x, layer, expert, r);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += r[i].bytes;
    return sum;
}

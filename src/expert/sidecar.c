/* sidecar: see sidecar.h for the format. This file owns the parse (every
 * field through util/cursor.h, every size through the overflow-checked
 * helpers), the validation against the GGUF, and the writer.
 *
 * The writer reads each layer's three expert tensors in chunks of whole
 * experts (one large sequential pread per part per chunk), interleaves them
 * into blobs in memory and writes the chunk's blobs with one pwrite. It
 * never maps the GGUF: a model larger than RAM must not fault its way
 * through the page cache. */
#include "expert/sidecar.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/hparams.h"
#include "util/cursor.h"
#include "util/progress.h"
#include "util/timer.h"

#define REBUILD "; run 'strata repack %s' to rebuild it"

/* Upper bounds far beyond any real model; they keep index sizes sane before
 * anything is allocated. */
#define MAX_LAYERS  65536
#define MAX_EXPERTS 65536

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static uint64_t fnv1a(uint64_t h, const void *p, uint64_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    for (uint64_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull
#define HASH_FIELD_OFF 72u
#define SAMPLE_FIELD_OFF 80u
#define RESERVED_OFF 88u
#define SAMPLE_BYTES 4096u

/* Hash of the metadata [0, n) with the 8 hash bytes taken as zero. */
static uint64_t meta_hash(const uint8_t *buf, uint64_t n)
{
    static const uint8_t zero[8] = { 0 };
    uint64_t h = fnv1a(FNV_OFFSET, buf, HASH_FIELD_OFF);
    h = fnv1a(h, zero, 8);
    return fnv1a(h, buf + HASH_FIELD_OFF + 8, n - HASH_FIELD_OFF - 8);
}

/* ==== The GGUF side ==== */

static const char *const k_part_name[3] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };

int sidecar_src_layers(const gguf_file *f, int n_layer, int n_expert, sidecar_src_layer *layers, err *e)
{
    for (int l = 0; l < n_layer; l++) {
        for (int w = 0; w < 3; w++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, k_part_name[w]);
            const int64_t ti = gguf_find_tensor(f, name);
            if (ti < 0) return err_setf(e, ERR_NOTFOUND, "missing tensor %s", name);
            const gguf_tensor_info *t = gguf_tensor(f, ti);
            uint64_t total = 0;
            if (t->n_dims != 3 || t->ne[2] != n_expert)
                return err_setf(e, ERR_FORMAT, "tensor %s: %d dims with ne[2] = %lld, expected 3 dims with %d experts",
                                name, t->n_dims, (long long)t->ne[2], n_expert);
            if (t->nb[2] == 0 || size_mul_ok(t->nb[2], (uint64_t)n_expert, &total) || total != t->bytes)
                return err_setf(e, ERR_FORMAT, "tensor %s: expert slab of %llu bytes does not tile its %llu bytes",
                                name, (unsigned long long)t->nb[2], (unsigned long long)t->bytes);
            layers[l].tensor[w] = ti;
            layers[l].type[w] = t->type;
            layers[l].file_off[w] = t->file_off;
            layers[l].slab_bytes[w] = t->nb[2];
        }
    }
    return 0;
}

/* The data sample hash (sidecar.h, "Staleness"): the first and last
 * min(4096, bytes) bytes of every expert tensor, layer by layer. */
static int sample_hash(const gguf_file *f, const sidecar_src_layer *src, int n_layer, uint64_t *out, err *e)
{
    uint8_t buf[SAMPLE_BYTES];
    uint64_t h = FNV_OFFSET;
    for (int l = 0; l < n_layer; l++)
        for (int w = 0; w < 3; w++) {
            const uint64_t bytes = gguf_tensor(f, src[l].tensor[w])->bytes;
            const uint64_t n = bytes < SAMPLE_BYTES ? bytes : SAMPLE_BYTES;
            int rc = gguf_read_tensor(f, src[l].tensor[w], 0, buf, n, e);
            if (!rc) { h = fnv1a(h, buf, n); rc = gguf_read_tensor(f, src[l].tensor[w], bytes - n, buf, n, e); }
            if (rc) return rc;
            h = fnv1a(h, buf, n);
        }
    *out = h;
    return 0;
}

int sidecar_blob_layout(const uint64_t p[3], uint64_t part_off[3], uint64_t *blob_bytes)
{
    uint64_t off = 0;
    for (int w = 0; w < 3; w++) {
        if (off > UINT64_MAX - SIDECAR_PART_ALIGN) return -1;
        off = round_up(off, SIDECAR_PART_ALIGN);
        part_off[w] = off;
        if (size_add_ok(off, p[w], &off)) return -1;
    }
    if (off > UINT64_MAX - SIDECAR_ALIGN) return -1;   /* read_bytes must not overflow */
    *blob_bytes = off;
    return 0;
}

/* ==== Parsing ==== */

void sidecar_index_free(sidecar_index *ix)
{
    if (!ix) return;
    free(ix->layers);
    free(ix->blob_off);
    ix->layers = NULL;
    ix->blob_off = NULL;
}

/* Header fields, read by parse_header (shared by sidecar_load, which needs
 * the sizes before it has read the index). */
typedef struct sc_header {
    uint32_t version, align, n_layer, n_expert;
    uint64_t gguf_size, gguf_fp, index_off, index_bytes, data_off, file_bytes, hash, sample;
} sc_header;

/* Magic, version and every size/offset of the 128-byte header, against the
 * file's real size. */
static int parse_header(sc_header *h, const uint8_t *buf, uint64_t n, uint64_t file_size, err *e)
{
    cursor c;
    cursor_init(&c, buf, n, 0, e);
    uint8_t magic[8];
    if (cursor_read(&c, magic, 8, "magic")) return ERR_FORMAT;
    if (memcmp(magic, SIDECAR_MAGIC, 8) != 0)
        return err_setf(e, ERR_FORMAT, "not a strata expert sidecar (bad magic)");
    h->version = cursor_u32(&c, "version");
    if (c.failed) return ERR_FORMAT;
    if (h->version != SIDECAR_VERSION)
        return err_setf(e, ERR_FORMAT, "sidecar format version %u, this strata reads version %u", h->version,
                        SIDECAR_VERSION);
    h->align = cursor_u32(&c, "align");
    h->gguf_size = cursor_u64(&c, "gguf_size");
    h->gguf_fp = cursor_u64(&c, "gguf_fp");
    h->n_layer = cursor_u32(&c, "n_layer");
    h->n_expert = cursor_u32(&c, "n_expert");
    h->index_off = cursor_u64(&c, "index_off");
    h->index_bytes = cursor_u64(&c, "index_bytes");
    h->data_off = cursor_u64(&c, "data_off");
    h->file_bytes = cursor_u64(&c, "file_bytes");
    h->hash = cursor_u64(&c, "meta_hash");
    h->sample = cursor_u64(&c, "sample_hash");
    const uint8_t *rsv = cursor_take(&c, SIDECAR_HEADER_BYTES - RESERVED_OFF, "reserved");
    if (c.failed) return ERR_FORMAT;
    for (unsigned i = 0; i < SIDECAR_HEADER_BYTES - RESERVED_OFF; i++)
        if (rsv[i]) return err_setf(e, ERR_FORMAT, "reserved header byte %u is not zero", RESERVED_OFF + i);
    if (h->align != SIDECAR_ALIGN) return err_setf(e, ERR_FORMAT, "alignment %u, expected %u", h->align, SIDECAR_ALIGN);
    if (h->n_layer < 1 || h->n_layer > MAX_LAYERS || h->n_expert < 1 || h->n_expert > MAX_EXPERTS)
        return err_setf(e, ERR_FORMAT, "bad shape: %u layers x %u experts", h->n_layer, h->n_expert);
    /* Cannot overflow: both factors are bounded above. */
    const uint64_t want_index = (uint64_t)h->n_layer * SIDECAR_LAYER_BYTES +
                                (uint64_t)h->n_layer * h->n_expert * SIDECAR_ENTRY_BYTES;
    if (h->index_off != SIDECAR_HEADER_BYTES || h->index_bytes != want_index)
        return err_setf(e, ERR_FORMAT, "index at %llu of %llu bytes, expected at %u of %llu bytes",
                        (unsigned long long)h->index_off, (unsigned long long)h->index_bytes,
                        SIDECAR_HEADER_BYTES, (unsigned long long)want_index);
    if (h->file_bytes != file_size)
        return err_setf(e, ERR_FORMAT, "file is %llu bytes but its header says %llu (truncated or padded copy?)",
                        (unsigned long long)file_size, (unsigned long long)h->file_bytes);
    if (h->file_bytes % SIDECAR_ALIGN || h->data_off % SIDECAR_ALIGN ||
        h->data_off < h->index_off + h->index_bytes || h->data_off > h->file_bytes)
        return err_setf(e, ERR_FORMAT, "data at %llu in a file of %llu bytes: misaligned or overlapping the index",
                        (unsigned long long)h->data_off, (unsigned long long)h->file_bytes);
    return 0;
}

int sidecar_parse(sidecar_index *ix, const void *buf, uint64_t n, uint64_t file_size, err *e)
{
    memset(ix, 0, sizeof *ix);
    const uint8_t *b = (const uint8_t *)buf;
    sc_header h;
    int rc = parse_header(&h, b, n, file_size, e);
    if (rc) return rc;
    const uint64_t meta_end = h.index_off + h.index_bytes;
    if (n < meta_end)
        return err_setf(e, ERR_FORMAT, "truncated: the index needs %llu bytes, only %llu present",
                        (unsigned long long)meta_end, (unsigned long long)n);
    if (meta_hash(b, meta_end) != h.hash) return err_setf(e, ERR_FORMAT, "header/index checksum mismatch");

    ix->version = h.version;
    ix->gguf_size = h.gguf_size;
    ix->gguf_fp = h.gguf_fp;
    ix->n_layer = (int)h.n_layer;
    ix->n_expert = (int)h.n_expert;
    ix->data_off = h.data_off;
    ix->file_bytes = h.file_bytes;
    const size_t n_entries = (size_t)h.n_layer * h.n_expert;
    ix->layers = calloc(h.n_layer, sizeof *ix->layers);
    ix->blob_off = malloc(n_entries * sizeof *ix->blob_off);
    if (!ix->layers || !ix->blob_off) { sidecar_index_free(ix); return err_setf(e, ERR_NOMEM, "out of memory"); }

    cursor c;
    cursor_init(&c, b, meta_end, 0, e);
    c.pos = h.index_off;
    for (uint32_t l = 0; l < h.n_layer; l++) {
        sidecar_layer *L = &ix->layers[l];
        for (int w = 0; w < 3; w++) {
            const uint32_t type = cursor_u32(&c, "part type");
            const uint32_t zero = cursor_u32(&c, "part reserved");
            L->part_bytes[w] = cursor_u64(&c, "part bytes");
            if (c.failed) break;
            if (zero || type > 0xffff || L->part_bytes[w] == 0) {
                rc = err_setf(e, ERR_FORMAT, "layer %u part %d: type %u, reserved %u, %llu bytes", l, w, type, zero,
                              (unsigned long long)L->part_bytes[w]);
                break;
            }
            L->type[w] = (int)type;
        }
        if (rc || c.failed) break;
        if (sidecar_blob_layout(L->part_bytes, L->part_off, &L->blob_bytes)) {
            rc = err_setf(e, ERR_FORMAT, "layer %u: part sizes overflow", l);
            break;
        }
        L->read_bytes = round_up(L->blob_bytes, SIDECAR_ALIGN);
    }
    /* Entries: aligned, canonical, in file order, inside the file. */
    uint64_t prev_end = h.data_off;
    for (size_t i = 0; !rc && !c.failed && i < n_entries; i++) {
        const uint32_t l = (uint32_t)(i / h.n_expert), x = (uint32_t)(i % h.n_expert);
        const sidecar_layer *L = &ix->layers[l];
        const uint64_t off = cursor_u64(&c, "blob offset");
        const uint64_t bytes = cursor_u64(&c, "blob bytes");
        uint64_t po[3];
        for (int w = 0; w < 3; w++) po[w] = cursor_u64(&c, "part offset");
        if (c.failed) break;
        if (bytes != L->blob_bytes || po[0] != L->part_off[0] || po[1] != L->part_off[1] || po[2] != L->part_off[2]) {
            rc = err_setf(e, ERR_FORMAT, "layer %u expert %u: blob of %llu bytes with parts at %llu/%llu/%llu, "
                          "expected %llu bytes at %llu/%llu/%llu", l, x, (unsigned long long)bytes,
                          (unsigned long long)po[0], (unsigned long long)po[1], (unsigned long long)po[2],
                          (unsigned long long)L->blob_bytes, (unsigned long long)L->part_off[0],
                          (unsigned long long)L->part_off[1], (unsigned long long)L->part_off[2]);
            break;
        }
        uint64_t end = 0;
        if (off % SIDECAR_ALIGN || off < prev_end || size_add_ok(off, L->read_bytes, &end) || end > h.file_bytes) {
            rc = err_setf(e, ERR_FORMAT, "layer %u expert %u: blob at %llu (+%llu) is misaligned, overlaps the "
                          "previous one or ends beyond the file (%llu bytes)", l, x, (unsigned long long)off,
                          (unsigned long long)L->read_bytes, (unsigned long long)h.file_bytes);
            break;
        }
        ix->blob_off[i] = off;
        prev_end = end;
    }
    if (!rc && c.failed) rc = ERR_FORMAT;
    if (rc) sidecar_index_free(ix);
    return rc;
}

/* ==== Loading ==== */

static int pread_full(int fd, void *buf, uint64_t n, uint64_t off, uint64_t *got)
{
    uint8_t *p = (uint8_t *)buf;
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, (size_t)(n - done), (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return -1;
        }
        if (r == 0) break;
        done += (uint64_t)r;
    }
    *got = done;
    return 0;
}

int sidecar_load(sidecar_index *ix, int fd, const char *path, const gguf_file *f, const char *model_path,
                 int n_layer, int n_expert, const sidecar_src_layer *src, err *e)
{
    memset(ix, 0, sizeof *ix);
    struct stat st;
    if (fstat(fd, &st) != 0) return err_setf(e, ERR_IO, "sidecar '%s': %s", path, strerror(errno));
    const uint64_t file_size = (uint64_t)st.st_size;

    uint8_t head[SIDECAR_HEADER_BYTES];
    uint64_t got = 0;
    if (pread_full(fd, head, sizeof head, 0, &got))
        return err_setf(e, ERR_IO, "sidecar '%s': %s", path, strerror(errno));

    /* The checks that give the clearest message go first: what it is, which
     * GGUF it belongs to, then its structure. */
    err sub;
    err_clear(&sub);
    sc_header h;
    int rc = parse_header(&h, head, got, file_size, &sub);
    /* A stale sidecar is reported as stale even if its structure is also off
     * (a different model means a different index). */
    if (got >= 32 && !memcmp(head, SIDECAR_MAGIC, 8)) {
        uint64_t gsize, gfp;
        memcpy(&gsize, head + 16, 8);   /* little-endian host (x86-64, aarch64) */
        memcpy(&gfp, head + 24, 8);
        uint32_t ver;
        memcpy(&ver, head + 8, 4);
        if (ver == SIDECAR_VERSION && (gsize != gguf_file_size(f) || gfp != gguf_fingerprint(f)))
            return err_setf(e, ERR_FORMAT,
                            "sidecar '%s' is stale: made for a GGUF of %llu bytes with fingerprint %016llx, "
                            "but '%s' is %llu bytes with fingerprint %016llx" REBUILD,
                            path, (unsigned long long)gsize, (unsigned long long)gfp, model_path,
                            (unsigned long long)gguf_file_size(f), (unsigned long long)gguf_fingerprint(f),
                            model_path);
    }
    if (rc) return err_setf(e, rc, "sidecar '%s': %s" REBUILD, path, sub.msg, model_path);
    if ((int)h.n_layer != n_layer || (int)h.n_expert != n_expert)
        return err_setf(e, ERR_FORMAT, "sidecar '%s' has %u layers x %u experts, the model %d x %d" REBUILD, path,
                        h.n_layer, h.n_expert, n_layer, n_expert, model_path);

    const uint64_t meta_end = h.index_off + h.index_bytes;   /* <= data_off <= file size: checked */
    uint8_t *buf = malloc((size_t)meta_end);
    if (!buf) return err_setf(e, ERR_NOMEM, "sidecar '%s': out of memory for a %llu-byte index", path,
                              (unsigned long long)meta_end);
    if (pread_full(fd, buf, meta_end, 0, &got)) {
        free(buf);
        return err_setf(e, ERR_IO, "sidecar '%s': %s", path, strerror(errno));
    }
    rc = sidecar_parse(ix, buf, got, file_size, &sub);
    free(buf);
    if (rc) return err_setf(e, rc, "sidecar '%s': %s" REBUILD, path, sub.msg, model_path);

    for (int l = 0; l < n_layer; l++)
        for (int w = 0; w < 3; w++)
            if (ix->layers[l].type[w] != src[l].type[w] || ix->layers[l].part_bytes[w] != src[l].slab_bytes[w]) {
                const int t = ix->layers[l].type[w];
                const uint64_t b = ix->layers[l].part_bytes[w];
                sidecar_index_free(ix);
                return err_setf(e, ERR_FORMAT, "sidecar '%s': layer %d %s is type %d, %llu bytes per expert, "
                                "but the GGUF's is type %d, %llu bytes" REBUILD, path, l, k_part_name[w], t,
                                (unsigned long long)b, src[l].type[w], (unsigned long long)src[l].slab_bytes[w],
                                model_path);
            }
    uint64_t sample = 0;
    err_clear(&sub);
    rc = sample_hash(f, src, n_layer, &sample, &sub);
    if (rc) { sidecar_index_free(ix); return err_setf(e, rc, "checking sidecar '%s': %s", path, sub.msg); }
    if (sample != h.sample) {
        sidecar_index_free(ix);
        return err_setf(e, ERR_FORMAT, "sidecar '%s' is stale: '%s' has the same header but other expert "
                        "weights" REBUILD, path, model_path, model_path);
    }
    return 0;
}

/* ==== Writing ==== */

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }   /* little-endian host */
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static int pwrite_full(int fd, const void *buf, uint64_t n, uint64_t off)
{
    const uint8_t *p = (const uint8_t *)buf;
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(fd, p + done, (size_t)(n - done), (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (uint64_t)r;
    }
    return 0;
}

/* The writer's state: its plan (the same numbers the index records) and
 * buffers. */
typedef struct sc_writer {
    int                n_layer, n_expert;
    sidecar_src_layer *src;      /* owned: n_layer */
    sidecar_layer     *lay;      /* owned: n_layer */
    uint64_t          *blob_off; /* owned: n_layer*n_expert */
    uint64_t           meta_end, data_off, file_bytes;
    uint8_t           *in[3];    /* owned: one chunk of each part */
    uint8_t           *outbuf;   /* owned: one chunk of blobs */
    uint64_t           prev_off, prev_len;   /* the chunk written before the current one */
} sc_writer;

static void writer_free(sc_writer *w)
{
    free(w->src);
    free(w->lay);
    free(w->blob_off);
    for (int i = 0; i < 3; i++) free(w->in[i]);
    free(w->outbuf);
}

/* Header + layer table + index, hashed. buf has meta_end bytes, zeroed. */
static void write_meta(const sc_writer *w, uint8_t *buf, uint64_t gguf_size, uint64_t gguf_fp, uint64_t sample)
{
    memcpy(buf, SIDECAR_MAGIC, 8);
    put_u32(buf + 8, SIDECAR_VERSION);
    put_u32(buf + 12, SIDECAR_ALIGN);
    put_u64(buf + 16, gguf_size);
    put_u64(buf + 24, gguf_fp);
    put_u32(buf + 32, (uint32_t)w->n_layer);
    put_u32(buf + 36, (uint32_t)w->n_expert);
    put_u64(buf + 40, SIDECAR_HEADER_BYTES);
    put_u64(buf + 48, w->meta_end - SIDECAR_HEADER_BYTES);
    put_u64(buf + 56, w->data_off);
    put_u64(buf + 64, w->file_bytes);
    put_u64(buf + SAMPLE_FIELD_OFF, sample);
    uint8_t *p = buf + SIDECAR_HEADER_BYTES;
    for (int l = 0; l < w->n_layer; l++)
        for (int k = 0; k < 3; k++, p += 16) {
            put_u32(p, (uint32_t)w->lay[l].type[k]);
            put_u64(p + 8, w->lay[l].part_bytes[k]);
        }
    for (int l = 0; l < w->n_layer; l++)
        for (int x = 0; x < w->n_expert; x++, p += SIDECAR_ENTRY_BYTES) {
            put_u64(p, w->blob_off[(size_t)l * (size_t)w->n_expert + (size_t)x]);
            put_u64(p + 8, w->lay[l].blob_bytes);
            for (int k = 0; k < 3; k++) put_u64(p + 16 + 8 * k, w->lay[l].part_off[k]);
        }
    put_u64(buf + HASH_FIELD_OFF, meta_hash(buf, w->meta_end));
}

/* Plan every offset; fails only on absurd sizes. */
static int writer_plan(sc_writer *w, err *e)
{
    const size_t n_entries = (size_t)w->n_layer * (size_t)w->n_expert;
    w->lay = calloc((size_t)w->n_layer, sizeof *w->lay);
    w->blob_off = malloc(n_entries * sizeof *w->blob_off);
    if (!w->lay || !w->blob_off) return err_setf(e, ERR_NOMEM, "out of memory");
    w->meta_end = SIDECAR_HEADER_BYTES + (uint64_t)w->n_layer * SIDECAR_LAYER_BYTES +
                  (uint64_t)n_entries * SIDECAR_ENTRY_BYTES;
    w->data_off = round_up(w->meta_end, SIDECAR_ALIGN);
    uint64_t off = w->data_off;
    for (int l = 0; l < w->n_layer; l++) {
        sidecar_layer *L = &w->lay[l];
        for (int k = 0; k < 3; k++) {
            L->type[k] = w->src[l].type[k];
            L->part_bytes[k] = w->src[l].slab_bytes[k];
        }
        if (sidecar_blob_layout(L->part_bytes, L->part_off, &L->blob_bytes))
            return err_setf(e, ERR_FORMAT, "layer %d: expert sizes overflow", l);
        L->read_bytes = round_up(L->blob_bytes, SIDECAR_ALIGN);
        for (int x = 0; x < w->n_expert; x++) {
            w->blob_off[(size_t)l * (size_t)w->n_expert + (size_t)x] = off;
            if (size_add_ok(off, L->read_bytes, &off)) return err_setf(e, ERR_FORMAT, "sidecar size overflows");
        }
    }
    w->file_bytes = off;
    return 0;
}

/* Copy one layer's experts [x0, x0+n) from the GGUF into blobs at their
 * planned offsets: one pread per part, one pwrite for the chunk. */
static int write_chunk(sc_writer *w, int gfd, int ofd, const char *model, const char *tmp, int l, int x0, int n,
                       uint64_t *bytes_read, err *e)
{
    const sidecar_layer *L = &w->lay[l];
    const sidecar_src_layer *S = &w->src[l];
    for (int k = 0; k < 3; k++) {
        const uint64_t off = S->file_off[k] + (uint64_t)x0 * S->slab_bytes[k];
        const uint64_t len = (uint64_t)n * S->slab_bytes[k];
        uint64_t got = 0;
        const int failed = pread_full(gfd, w->in[k], len, off, &got);
        if (failed || got != len)
            return err_setf(e, ERR_IO, "'%s': reading layer %d %s experts %d..%d at offset %llu: %s", model, l,
                            k_part_name[k], x0, x0 + n - 1, (unsigned long long)off,
                            failed ? strerror(errno) : "unexpected end of file");
        /* Read once, never again: keep the page cache for others. */
        posix_fadvise(gfd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
        *bytes_read += len;
    }
    memset(w->outbuf, 0, (size_t)((uint64_t)n * L->read_bytes));
    for (int i = 0; i < n; i++) {
        uint8_t *blob = w->outbuf + (uint64_t)i * L->read_bytes;
        for (int k = 0; k < 3; k++)
            memcpy(blob + L->part_off[k], w->in[k] + (uint64_t)i * S->slab_bytes[k], (size_t)S->slab_bytes[k]);
    }
    const uint64_t dst = w->blob_off[(size_t)l * (size_t)w->n_expert + (size_t)x0];
    const uint64_t len = (uint64_t)n * L->read_bytes;
    if (pwrite_full(ofd, w->outbuf, len, dst))
        return err_setf(e, ERR_IO, "'%s': write at offset %llu: %s", tmp, (unsigned long long)dst, strerror(errno));
    /* Streaming write that leaves the page cache alone: start this chunk's
     * writeback now, wait for the previous chunk's (which overlapped the
     * reads of this one) and drop its pages. At most two chunks are dirty
     * or cached at a time, however large the model. */
    sync_file_range(ofd, (off_t)dst, (off_t)len, SYNC_FILE_RANGE_WRITE);
    if (w->prev_len) {
        if (sync_file_range(ofd, (off_t)w->prev_off, (off_t)w->prev_len,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
            return err_setf(e, ERR_IO, "'%s': write at offset %llu: %s", tmp, (unsigned long long)w->prev_off,
                            strerror(errno));
        posix_fadvise(ofd, (off_t)w->prev_off, (off_t)w->prev_len, POSIX_FADV_DONTNEED);
    }
    w->prev_off = dst;
    w->prev_len = len;
    return 0;
}

int sidecar_write(const sidecar_write_opts *o, sidecar_write_stats *st, err *e)
{
    sidecar_write_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!o || !o->model_path) return err_setf(e, ERR_USAGE, "repack: no model path");
    const double t0 = timer_ms();

    if (o->out_path) snprintf(st->out_path, sizeof st->out_path, "%s", o->out_path);
    else if ((size_t)snprintf(st->out_path, sizeof st->out_path, "%s%s", o->model_path, SIDECAR_SUFFIX) >=
             sizeof st->out_path)
        return err_setf(e, ERR_USAGE, "'%s': path too long", o->model_path);
    char tmp[4096 + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", st->out_path);

    gguf_file *f = NULL;
    int rc = gguf_open(&f, o->model_path, e);
    if (rc) return rc;
    hparams hp;
    rc = hparams_load(&hp, f, e);
    if (rc) { gguf_close(f); return rc; }

    sc_writer w;
    memset(&w, 0, sizeof w);
    w.n_layer = hp.n_layer;
    w.n_expert = hp.n_expert;
    w.src = calloc((size_t)hp.n_layer, sizeof *w.src);
    if (!w.src) rc = err_setf(e, ERR_NOMEM, "out of memory");
    if (!rc) rc = sidecar_src_layers(f, hp.n_layer, hp.n_expert, w.src, e);
    if (!rc) rc = writer_plan(&w, e);

    /* Chunk: as many whole experts as fit chunk_bytes for the largest part
     * of any layer (at least one). */
    const uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : (32ull << 20);
    uint64_t max_slab = 0, max_blob = 0;
    for (int l = 0; !rc && l < hp.n_layer; l++) {
        for (int k = 0; k < 3; k++)
            if (w.src[l].slab_bytes[k] > max_slab) max_slab = w.src[l].slab_bytes[k];
        if (w.lay[l].read_bytes > max_blob) max_blob = w.lay[l].read_bytes;
    }
    uint64_t per = 1;
    if (!rc) {
        per = chunk / max_slab;
        if (per < 1) per = 1;
        if (per > (uint64_t)hp.n_expert) per = (uint64_t)hp.n_expert;
        for (int k = 0; k < 3; k++)
            if (!(w.in[k] = malloc((size_t)(per * max_slab)))) rc = err_setf(e, ERR_NOMEM, "out of memory");
        if (!rc && !(w.outbuf = malloc((size_t)(per * max_blob)))) rc = err_setf(e, ERR_NOMEM, "out of memory");
    }

    int ofd = -1;
    if (!rc) {
        ofd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (ofd < 0) rc = err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno));
    }
    uint64_t sample = 0;
    if (!rc) rc = sample_hash(f, w.src, hp.n_layer, &sample, e);
    if (!rc) {
        uint8_t *meta = calloc(1, (size_t)w.data_off);
        if (!meta) rc = err_setf(e, ERR_NOMEM, "out of memory");
        else {
            write_meta(&w, meta, gguf_file_size(f), gguf_fingerprint(f), sample);
            if (pwrite_full(ofd, meta, w.data_off, 0)) rc = err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno));
            free(meta);
        }
    }

    const int gfd = gguf_fd(f);
    posix_fadvise(gfd, 0, 0, POSIX_FADV_SEQUENTIAL);
    progress *bar = NULL;
    uint64_t total_in = 0;
    for (int l = 0; l < hp.n_layer; l++)
        for (int k = 0; k < 3; k++) total_in += w.src[l].slab_bytes[k] * (uint64_t)hp.n_expert;
    if (!rc && o->progress) progress_open(&bar, "repack", total_in, o->progress);
    for (int l = 0; !rc && l < hp.n_layer; l++) {
        for (int x0 = 0; !rc && x0 < hp.n_expert; x0 += (int)per) {
            const int n = hp.n_expert - x0 < (int)per ? hp.n_expert - x0 : (int)per;
            rc = write_chunk(&w, gfd, ofd, o->model_path, tmp, l, x0, n, &st->bytes_read, e);
            if (bar) progress_update(bar, st->bytes_read);
        }
    }
    progress_close(bar);

    if (!rc && ftruncate(ofd, (off_t)w.file_bytes) != 0) rc = err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno));
    if (!rc && fdatasync(ofd) != 0) rc = err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno));
    if (!rc) posix_fadvise(ofd, 0, 0, POSIX_FADV_DONTNEED);   /* the last chunk and the index */
    if (ofd >= 0 && close(ofd) != 0 && !rc) rc = err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno));
    if (!rc && rename(tmp, st->out_path) != 0)
        rc = err_setf(e, ERR_IO, "rename '%s' -> '%s': %s", tmp, st->out_path, strerror(errno));
    if (rc && ofd >= 0) unlink(tmp);

    st->n_layer = hp.n_layer;
    st->n_expert = hp.n_expert;
    st->n_blobs = (uint64_t)hp.n_layer * (uint64_t)hp.n_expert;
    st->file_bytes = w.file_bytes;
    st->seconds = (timer_ms() - t0) / 1000.0;
    writer_free(&w);
    gguf_close(f);
    return rc;
}

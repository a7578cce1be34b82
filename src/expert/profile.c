/* profile: see profile.h for the file format. Counting is two arrays of
 * n_layer*n_expert u64 (prompt, decode); writing ranks a copy; loading
 * parses the text with a bounds-checked line scanner (every number through
 * parse_u64, which refuses signs, blanks, overflow and missing digits). */
#include "expert/profile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/hparams.h"
#include "util/cursor.h"

#define PROFILE_MAX_FILE_BYTES (512ull << 20)
#define REMAKE "; run 'strata profile -m MODEL -f CORPUS -o PROFILE' to make one for this model"

struct profile_counts {
    uint64_t  fp, gguf_size;
    int       n_layer, n_expert, k;
    uint64_t *count[2];      /* owned: [phase][layer*n_expert + expert] */
    uint64_t  tokens[2], lookups[2];
    uint64_t  bad;           /* observations out of range */
};

struct profile {
    uint64_t       n;
    profile_entry *ent;      /* owned: n, ranked */
    uint64_t       tokens[2], lookups[2];
};

/* ==== Counting ==== */

int profile_counts_open(profile_counts **out, const gguf_file *f, err *e)
{
    *out = NULL;
    hparams hp;
    int rc = hparams_load(&hp, f, e);
    if (rc) return rc;
    profile_counts *c = calloc(1, sizeof *c);
    if (!c) return err_setf(e, ERR_NOMEM, "out of memory");
    c->fp = gguf_fingerprint(f);
    c->gguf_size = gguf_file_size(f);
    c->n_layer = hp.n_layer;
    c->n_expert = hp.n_expert;
    c->k = hp.n_expert_used;
    const size_t n = (size_t)hp.n_layer * (size_t)hp.n_expert;
    c->count[0] = calloc(n, sizeof(uint64_t));
    c->count[1] = calloc(n, sizeof(uint64_t));
    if (!c->count[0] || !c->count[1]) { profile_counts_close(c); return err_setf(e, ERR_NOMEM, "out of memory"); }
    *out = c;
    return 0;
}

void profile_counts_close(profile_counts *c)
{
    if (!c) return;
    free(c->count[0]);
    free(c->count[1]);
    free(c);
}

void profile_counts_route(profile_counts *c, int phase, int layer, const int32_t *experts, int n_rows, int k)
{
    if (phase != PROFILE_PROMPT && phase != PROFILE_DECODE) { c->bad++; return; }
    if (layer < 0 || layer >= c->n_layer || n_rows < 0 || k != c->k) { c->bad++; return; }
    uint64_t *row = c->count[phase] + (size_t)layer * (size_t)c->n_expert;
    for (int64_t i = 0; i < (int64_t)n_rows * k; i++) {
        const int32_t x = experts[i];
        if (x < 0 || x >= c->n_expert) { c->bad++; continue; }
        row[x]++;
        c->lookups[phase]++;
    }
}

void profile_counts_tokens(profile_counts *c, int phase, uint64_t n)
{
    if (phase == PROFILE_PROMPT || phase == PROFILE_DECODE) c->tokens[phase] += n;
    else c->bad++;
}

uint64_t profile_counts_lookups(const profile_counts *c, int phase)
{
    return phase == PROFILE_PROMPT || phase == PROFILE_DECODE ? c->lookups[phase] : 0;
}

uint64_t profile_counts_n_tokens(const profile_counts *c, int phase)
{
    return phase == PROFILE_PROMPT || phase == PROFILE_DECODE ? c->tokens[phase] : 0;
}

/* ==== Writing ==== */

typedef struct rank_ent {
    double        score;
    profile_entry e;
} rank_ent;

static int by_rank(const void *a, const void *b)
{
    const rank_ent *x = (const rank_ent *)a, *y = (const rank_ent *)b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->e.layer != y->e.layer) return x->e.layer < y->e.layer ? -1 : 1;
    return x->e.expert < y->e.expert ? -1 : x->e.expert > y->e.expert;
}

int profile_write(const profile_counts *c, const char *path, err *e)
{
    if (c->bad)
        return err_setf(e, ERR_INTERNAL, "profile: the routing observer reported %llu out-of-range lookups; "
                        "not writing '%s'", (unsigned long long)c->bad, path);
    const size_t n = (size_t)c->n_layer * (size_t)c->n_expert;
    rank_ent *r = malloc(n * sizeof *r);
    if (!r) return err_setf(e, ERR_NOMEM, "out of memory");
    const double P = (double)c->lookups[0], D = (double)c->lookups[1];
    for (size_t i = 0; i < n; i++) {
        rank_ent *x = &r[i];
        x->e.layer = (int32_t)(i / (size_t)c->n_expert);
        x->e.expert = (int32_t)(i % (size_t)c->n_expert);
        x->e.prompt = c->count[0][i];
        x->e.decode = c->count[1][i];
        x->score = (P > 0 ? (double)x->e.prompt / P : 0.0) + (D > 0 ? (double)x->e.decode / D : 0.0);
    }
    qsort(r, n, sizeof *r, by_rank);

    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        free(r);
        return err_setf(e, ERR_USAGE, "'%s': path too long", path);
    }
    FILE *out = fopen(tmp, "w");
    if (!out) { free(r); return err_setf(e, ERR_IO, "'%s': %s", tmp, strerror(errno)); }
    fprintf(out, "# strata expert profile: layer-expert lookups on a corpus, prompt and decode apart;\n"
                 "# ranked by prompt_count/prompt_lookups + decode_count/decode_lookups (see src/expert/profile.h)\n");
    fprintf(out, "strata-profile %d fp=%016llx gguf_size=%llu n_layer=%d n_expert=%d k=%d prompt_tokens=%llu "
                 "decode_tokens=%llu prompt_lookups=%llu decode_lookups=%llu\n",
            PROFILE_VERSION, (unsigned long long)c->fp, (unsigned long long)c->gguf_size, c->n_layer, c->n_expert,
            c->k, (unsigned long long)c->tokens[0], (unsigned long long)c->tokens[1],
            (unsigned long long)c->lookups[0], (unsigned long long)c->lookups[1]);
    fprintf(out, "# rank layer expert prompt_count decode_count\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%zu %d %d %llu %llu\n", i, r[i].e.layer, r[i].e.expert, (unsigned long long)r[i].e.prompt,
                (unsigned long long)r[i].e.decode);
    free(r);
    int bad = ferror(out);
    bad |= fclose(out) != 0;
    if (bad) { remove(tmp); return err_setf(e, ERR_IO, "'%s': write failed", tmp); }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return err_setf(e, ERR_IO, "rename '%s' -> '%s': %s", tmp, path, strerror(errno));
    }
    return 0;
}

/* ==== Loading ==== */

/* A scanner over one line [p, end) (no '\n' inside). */
typedef struct scan {
    const char *p, *end;
} scan;

/* Decimal u64: at least one digit, no sign, no overflow. */
static int parse_u64(scan *s, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s->p;
    if (p >= s->end || *p < '0' || *p > '9') return -1;
    for (; p < s->end && *p >= '0' && *p <= '9'; p++) {
        const uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    s->p = p;
    *out = v;
    return 0;
}

static int parse_hex64(scan *s, uint64_t *out)
{
    uint64_t v = 0;
    int n = 0;
    for (; s->p < s->end && n < 17; s->p++, n++) {
        const char ch = *s->p;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) break;
        v = v << 4 | (uint64_t)d;
    }
    if (n != 16) return -1;
    *out = v;
    return 0;
}

/* Exact literal. */
static int expect(scan *s, const char *lit)
{
    const size_t n = strlen(lit);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return -1;
    s->p += n;
    return 0;
}

static int at_end(const scan *s) { return s->p == s->end; }

typedef struct prof_header {
    uint64_t version, fp, size, n_layer, n_expert, k, tokens[2], lookups[2];
} prof_header;

static int parse_header_line(scan *s, prof_header *h)
{
    if (expect(s, "strata-profile ") || parse_u64(s, &h->version)) return -1;
    if (h->version != PROFILE_VERSION) return -2;
    if (expect(s, " fp=") || parse_hex64(s, &h->fp)) return -1;
    if (expect(s, " gguf_size=") || parse_u64(s, &h->size)) return -1;
    if (expect(s, " n_layer=") || parse_u64(s, &h->n_layer)) return -1;
    if (expect(s, " n_expert=") || parse_u64(s, &h->n_expert)) return -1;
    if (expect(s, " k=") || parse_u64(s, &h->k)) return -1;
    if (expect(s, " prompt_tokens=") || parse_u64(s, &h->tokens[0])) return -1;
    if (expect(s, " decode_tokens=") || parse_u64(s, &h->tokens[1])) return -1;
    if (expect(s, " prompt_lookups=") || parse_u64(s, &h->lookups[0])) return -1;
    if (expect(s, " decode_lookups=") || parse_u64(s, &h->lookups[1])) return -1;
    return at_end(s) ? 0 : -1;
}

static char *read_small_file(const char *path, uint64_t *len, err *e)
{
    FILE *in = fopen(path, "rb");
    if (!in) {
        err_setf(e, errno == ENOENT ? ERR_NOTFOUND : ERR_IO, "profile '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(in), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > PROFILE_MAX_FILE_BYTES) {
        fclose(in);
        err_setf(e, ERR_FORMAT, "profile '%s': not a regular file of at most %llu bytes", path,
                 (unsigned long long)PROFILE_MAX_FILE_BYTES);
        return NULL;
    }
    const uint64_t n = (uint64_t)st.st_size;
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(in); err_setf(e, ERR_NOMEM, "out of memory"); return NULL; }
    const size_t got = fread(buf, 1, (size_t)n, in);
    fclose(in);
    if (got != n) { free(buf); err_setf(e, ERR_IO, "profile '%s': short read", path); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int profile_load(profile **out, const char *path, uint64_t fingerprint, uint64_t gguf_size, int n_layer,
                 int n_expert, err *e)
{
    *out = NULL;
    if (n_layer <= 0 || n_expert <= 0) return err_setf(e, ERR_USAGE, "profile: bad model shape");
    uint64_t len = 0;
    char *buf = read_small_file(path, &len, e);
    if (!buf) return e ? e->code : ERR_IO;

    const uint64_t n_all = (uint64_t)n_layer * (uint64_t)n_expert;
    profile *p = calloc(1, sizeof *p);
    uint8_t *seen = calloc((size_t)n_all, 1);
    if (p) p->ent = malloc((size_t)n_all * sizeof *p->ent);
    int rc = 0;
    if (!p || !seen || !p->ent) rc = err_setf(e, ERR_NOMEM, "out of memory");

    prof_header h;
    memset(&h, 0, sizeof h);
    int have_header = 0;
    uint64_t line_no = 0, sum[2] = { 0, 0 };
    const char *cur = buf, *const buf_end = buf + len;
    while (!rc && cur < buf_end) {
        const char *nl = memchr(cur, '\n', (size_t)(buf_end - cur));
        if (!nl) { rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: no newline at the end (truncated?)",
                                 path, (unsigned long long)line_no + 1); break; }
        scan s = { cur, nl };
        cur = nl + 1;
        line_no++;
        if (s.p < s.end && *s.p == '#') continue;
        if (!have_header) {
            const int hr = parse_header_line(&s, &h);
            if (hr == -2) { rc = err_setf(e, ERR_UNSUPPORTED, "profile '%s': format version %llu, this strata "
                                          "reads version %d", path, (unsigned long long)h.version, PROFILE_VERSION);
                            break; }
            if (hr) { rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: not a strata profile header", path,
                                    (unsigned long long)line_no); break; }
            if (h.fp != fingerprint || h.size != gguf_size || h.n_layer != (uint64_t)n_layer ||
                h.n_expert != (uint64_t)n_expert) {
                rc = err_setf(e, ERR_FORMAT, "profile '%s' was made for a different model (fingerprint %016llx, "
                              "%llu bytes, %llu x %llu experts; this model %016llx, %llu bytes, %d x %d)" REMAKE,
                              path, (unsigned long long)h.fp, (unsigned long long)h.size,
                              (unsigned long long)h.n_layer, (unsigned long long)h.n_expert,
                              (unsigned long long)fingerprint, (unsigned long long)gguf_size, n_layer, n_expert);
                break;
            }
            have_header = 1;
            continue;
        }
        uint64_t rank, layer, expert, pc, dc;
        if (parse_u64(&s, &rank) || expect(&s, " ") || parse_u64(&s, &layer) || expect(&s, " ") ||
            parse_u64(&s, &expert) || expect(&s, " ") || parse_u64(&s, &pc) || expect(&s, " ") ||
            parse_u64(&s, &dc) || !at_end(&s)) {
            rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: expected 'rank layer expert prompt_count "
                          "decode_count'", path, (unsigned long long)line_no);
            break;
        }
        if (rank != p->n || layer >= (uint64_t)n_layer || expert >= (uint64_t)n_expert) {
            rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: rank %llu (expected %llu), layer %llu, expert "
                          "%llu out of range (%d layers x %d experts)", path, (unsigned long long)line_no,
                          (unsigned long long)rank, (unsigned long long)p->n, (unsigned long long)layer,
                          (unsigned long long)expert, n_layer, n_expert);
            break;
        }
        const uint64_t id = layer * (uint64_t)n_expert + expert;
        if (seen[id]) {
            rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: layer %llu expert %llu listed twice", path,
                          (unsigned long long)line_no, (unsigned long long)layer, (unsigned long long)expert);
            break;
        }
        seen[id] = 1;
        if (size_add_ok(sum[0], pc, &sum[0]) || size_add_ok(sum[1], dc, &sum[1])) {
            rc = err_setf(e, ERR_FORMAT, "profile '%s' line %llu: counts overflow", path,
                          (unsigned long long)line_no);
            break;
        }
        p->ent[p->n++] = (profile_entry){ (int32_t)layer, (int32_t)expert, pc, dc };
    }
    if (!rc && !have_header) rc = err_setf(e, ERR_FORMAT, "profile '%s': no 'strata-profile' header line", path);
    if (!rc && p->n != n_all)
        rc = err_setf(e, ERR_FORMAT, "profile '%s': %llu layer-experts listed, the model has %llu (truncated?)",
                      path, (unsigned long long)p->n, (unsigned long long)n_all);
    if (!rc && (sum[0] != h.lookups[0] || sum[1] != h.lookups[1]))
        rc = err_setf(e, ERR_FORMAT, "profile '%s': counts sum to %llu prompt / %llu decode lookups, the header "
                      "says %llu / %llu", path, (unsigned long long)sum[0], (unsigned long long)sum[1],
                      (unsigned long long)h.lookups[0], (unsigned long long)h.lookups[1]);
    free(buf);
    free(seen);
    if (rc) { profile_close(p); return rc; }
    p->tokens[0] = h.tokens[0];
    p->tokens[1] = h.tokens[1];
    p->lookups[0] = h.lookups[0];
    p->lookups[1] = h.lookups[1];
    *out = p;
    return 0;
}

void profile_close(profile *p)
{
    if (!p) return;
    free(p->ent);
    free(p);
}

uint64_t             profile_n(const profile *p) { return p->n; }
const profile_entry *profile_entries(const profile *p) { return p->ent; }

uint64_t profile_lookups(const profile *p, int phase)
{
    return phase == PROFILE_PROMPT || phase == PROFILE_DECODE ? p->lookups[phase] : 0;
}

uint64_t profile_n_tokens(const profile *p, int phase)
{
    return phase == PROFILE_PROMPT || phase == PROFILE_DECODE ? p->tokens[phase] : 0;
}

/* bpe_train: byte-level BPE training (see bpe_train.h for the contract).
 *
 * Data layout while training:
 *   - pieces: each distinct pre-split piece ("word") once, with its count and
 *     its current symbols (token ids) in one shared int32 pool; merging only
 *     shortens a word in place;
 *   - pairs: an open-addressing map (a,b) -> pair slot holding the summed
 *     count over all words and a posting list of words that contained the
 *     pair at some point (it may hold stale words; they are re-checked);
 *   - a max-heap of (count, a, b) snapshots with lazy deletion: an entry is
 *     acted on only if its count equals the pair's current count. Invariant:
 *     every pair with count > 0 has an entry with its current count (a pair's
 *     count only grows when it involves the token just created, and those
 *     pairs are pushed after each merge; a popped stale entry with a higher
 *     count is re-pushed at the current count). So the popped valid entry is
 *     always the true maximum under (count desc, a asc, b asc), whatever the
 *     heap's internal order: the result is deterministic.
 *   - tokens: texts in one arena, a map text -> id.
 * Nothing here is global; all memory is released before bpe_train returns,
 * except the vocabulary handed to the caller. */
#include "mkmodel/bpe_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* ==== Small containers ==== */

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static int sb_put(strbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* ==== Training state ==== */

typedef struct pair_slot {
    int32_t a, b;
    int64_t count;
    int32_t *post;          /* word indices (may repeat or be stale) */
    int32_t n_post, cap_post;
    int32_t touched;        /* merge number that last pushed it */
    int merged;             /* already emitted as a merge */
} pair_slot;

typedef struct heap_ent {
    int64_t count;
    int32_t a, b;
} heap_ent;

typedef struct trainer {
    err *e;
    /* pieces counted during pre-split: map bytes -> word index */
    strbuf piece_text;          /* raw bytes of each distinct piece */
    size_t *piece_off;          /* [n_words] offset in piece_text */
    int32_t *piece_len;         /* [n_words] */
    size_t cap_words;
    int32_t *wmap;              /* open addressing: word index + 1, 0 = empty */
    size_t wmap_cap;
    int32_t n_words;
    int64_t *wcount;            /* [n_words] */
    int oom;
    /* words as symbols */
    int32_t *sym;               /* pool */
    size_t *wsym_off;           /* [n_words] */
    int32_t *wsym_len;          /* [n_words] current length */
    int32_t *wmark;             /* [n_words] last merge that processed the word */
    /* tokens */
    strbuf tok_text;
    size_t *tok_off;            /* [n_tok] */
    int32_t *tok_len;
    size_t cap_tok;
    int32_t n_tok;
    int32_t *tmap;              /* token id + 1, 0 = empty */
    size_t tmap_cap;
    int32_t byte_tok[256];
    /* pairs */
    pair_slot *pairs;
    size_t n_pairs, cap_pairs;
    int32_t *pmap;              /* pair index + 1 */
    size_t pmap_cap;
    /* heap */
    heap_ent *heap;
    size_t n_heap, cap_heap;
    /* merges, as offsets into merge_text */
    strbuf merge_text;
    size_t *merge_off;
    size_t n_merges, cap_merges;
} trainer;

/* ---- pieces ---- */

static int wmap_rehash(trainer *t, size_t ncap)
{
    int32_t *nm = calloc(ncap, sizeof *nm);
    if (!nm) return -1;
    for (int32_t w = 0; w < t->n_words; w++) {
        size_t i = fnv1a(t->piece_text.p + t->piece_off[w], (size_t)t->piece_len[w]) & (ncap - 1);
        while (nm[i]) i = (i + 1) & (ncap - 1);
        nm[i] = w + 1;
    }
    free(t->wmap);
    t->wmap = nm;
    t->wmap_cap = ncap;
    return 0;
}

static void on_piece(void *ctx, const char *piece, size_t n)
{
    trainer *t = ctx;
    if (t->oom || n == 0) return;
    if ((size_t)t->n_words * 2 + 2 > t->wmap_cap && wmap_rehash(t, t->wmap_cap ? t->wmap_cap * 2 : 4096)) {
        t->oom = 1;
        return;
    }
    size_t i = fnv1a(piece, n) & (t->wmap_cap - 1);
    while (t->wmap[i]) {
        int32_t w = t->wmap[i] - 1;
        if ((size_t)t->piece_len[w] == n && !memcmp(t->piece_text.p + t->piece_off[w], piece, n)) {
            t->wcount[w]++;
            return;
        }
        i = (i + 1) & (t->wmap_cap - 1);
    }
    size_t cw = t->cap_words;
    if (grow((void **)&t->piece_off, &cw, (size_t)t->n_words + 1, sizeof *t->piece_off)) { t->oom = 1; return; }
    cw = t->cap_words;
    if (grow((void **)&t->piece_len, &cw, (size_t)t->n_words + 1, sizeof *t->piece_len)) { t->oom = 1; return; }
    cw = t->cap_words;
    if (grow((void **)&t->wcount, &cw, (size_t)t->n_words + 1, sizeof *t->wcount)) { t->oom = 1; return; }
    t->cap_words = cw;
    if (n > INT32_MAX / 4) { t->oom = 1; return; }
    t->piece_off[t->n_words] = t->piece_text.n;
    t->piece_len[t->n_words] = (int32_t)n;
    t->wcount[t->n_words] = 1;
    if (sb_put(&t->piece_text, piece, n)) { t->oom = 1; return; }
    t->wmap[i] = ++t->n_words;
}

/* ---- tokens ---- */

static int32_t tok_find(const trainer *t, const char *s, size_t n)
{
    if (!t->tmap_cap) return -1;
    size_t i = fnv1a(s, n) & (t->tmap_cap - 1);
    while (t->tmap[i]) {
        int32_t id = t->tmap[i] - 1;
        if ((size_t)t->tok_len[id] == n && !memcmp(t->tok_text.p + t->tok_off[id], s, n)) return id;
        i = (i + 1) & (t->tmap_cap - 1);
    }
    return -1;
}

static int tmap_insert(int32_t *m, size_t cap, const trainer *t, int32_t id)
{
    size_t i = fnv1a(t->tok_text.p + t->tok_off[id], (size_t)t->tok_len[id]) & (cap - 1);
    while (m[i]) i = (i + 1) & (cap - 1);
    m[i] = id + 1;
    return 0;
}

/* Append a token text (must not exist yet); returns its id or -1 on OOM.
 * Texts are stored NUL-terminated so the final arena can be handed out. */
static int32_t tok_add(trainer *t, const char *s, size_t n)
{
    if ((size_t)t->n_tok * 2 + 2 > t->tmap_cap) {
        size_t nc = t->tmap_cap ? t->tmap_cap * 2 : 1024;
        int32_t *nm = calloc(nc, sizeof *nm);
        if (!nm) return -1;
        for (int32_t id = 0; id < t->n_tok; id++) tmap_insert(nm, nc, t, id);
        free(t->tmap);
        t->tmap = nm;
        t->tmap_cap = nc;
    }
    size_t c1 = t->cap_tok;
    if (grow((void **)&t->tok_off, &c1, (size_t)t->n_tok + 1, sizeof *t->tok_off)) return -1;
    c1 = t->cap_tok;
    if (grow((void **)&t->tok_len, &c1, (size_t)t->n_tok + 1, sizeof *t->tok_len)) return -1;
    t->cap_tok = c1;
    t->tok_off[t->n_tok] = t->tok_text.n;
    t->tok_len[t->n_tok] = (int32_t)n;
    if (sb_put(&t->tok_text, s, n) || sb_put(&t->tok_text, "", 1)) return -1;
    int32_t id = t->n_tok++;
    tmap_insert(t->tmap, t->tmap_cap, t, id);
    return id;
}

/* ---- pairs ---- */

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static int64_t pair_find(const trainer *t, int32_t a, int32_t b)
{
    if (!t->pmap_cap) return -1;
    size_t i = mix64(pair_key(a, b)) & (t->pmap_cap - 1);
    while (t->pmap[i]) {
        const pair_slot *p = &t->pairs[t->pmap[i] - 1];
        if (p->a == a && p->b == b) return t->pmap[i] - 1;
        i = (i + 1) & (t->pmap_cap - 1);
    }
    return -1;
}

/* Index of pair (a,b), created with count 0 if absent; -1 on OOM. */
static int64_t pair_get(trainer *t, int32_t a, int32_t b)
{
    int64_t f = pair_find(t, a, b);
    if (f >= 0) return f;
    if (t->n_pairs * 2 + 2 > t->pmap_cap) {
        size_t nc = t->pmap_cap ? t->pmap_cap * 2 : 4096;
        int32_t *nm = calloc(nc, sizeof *nm);
        if (!nm) return -1;
        for (size_t k = 0; k < t->n_pairs; k++) {
            size_t i = mix64(pair_key(t->pairs[k].a, t->pairs[k].b)) & (nc - 1);
            while (nm[i]) i = (i + 1) & (nc - 1);
            nm[i] = (int32_t)k + 1;
        }
        free(t->pmap);
        t->pmap = nm;
        t->pmap_cap = nc;
    }
    if (t->n_pairs >= INT32_MAX - 1) return -1;
    if (grow((void **)&t->pairs, &t->cap_pairs, t->n_pairs + 1, sizeof *t->pairs)) return -1;
    pair_slot *p = &t->pairs[t->n_pairs];
    memset(p, 0, sizeof *p);
    p->a = a;
    p->b = b;
    p->touched = -1;
    size_t i = mix64(pair_key(a, b)) & (t->pmap_cap - 1);
    while (t->pmap[i]) i = (i + 1) & (t->pmap_cap - 1);
    t->pmap[i] = (int32_t)t->n_pairs + 1;
    return (int64_t)t->n_pairs++;
}

static int post_add(pair_slot *p, int32_t w)
{
    if (p->n_post && p->post[p->n_post - 1] == w) return 0;
    size_t cap = (size_t)p->cap_post;
    if (grow((void **)&p->post, &cap, (size_t)p->n_post + 1, sizeof *p->post)) return -1;
    p->cap_post = (int32_t)cap;
    p->post[p->n_post++] = w;
    return 0;
}

/* ---- heap: max by count, then min a, then min b ---- */

static int heap_less(const heap_ent *x, const heap_ent *y) /* x has lower priority than y */
{
    if (x->count != y->count) return x->count < y->count;
    if (x->a != y->a) return x->a > y->a;
    return x->b > y->b;
}

static int heap_push(trainer *t, int64_t count, int32_t a, int32_t b)
{
    if (grow((void **)&t->heap, &t->cap_heap, t->n_heap + 1, sizeof *t->heap)) return -1;
    size_t i = t->n_heap++;
    heap_ent v = { count, a, b };
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!heap_less(&t->heap[up], &v)) break;
        t->heap[i] = t->heap[up];
        i = up;
    }
    t->heap[i] = v;
    return 0;
}

static heap_ent heap_pop(trainer *t)
{
    heap_ent top = t->heap[0];
    heap_ent v = t->heap[--t->n_heap];
    size_t i = 0, n = t->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        heap_ent bv = v;
        if (l < n && heap_less(&bv, &t->heap[l])) { best = l; bv = t->heap[l]; }
        if (l + 1 < n && heap_less(&bv, &t->heap[l + 1])) best = l + 1;
        if (best == i) break;
        t->heap[i] = t->heap[best];
        i = best;
    }
    if (n) t->heap[i] = v;
    return top;
}

/* ==== Training ==== */

static int byte_order_cmp(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;   /* (code point << 8) | byte */
    return *a < *b ? -1 : *a > *b;
}

static uint32_t utf8_cp(const char *s, int n)
{
    const uint8_t *u = (const uint8_t *)s;
    if (n == 1) return u[0];
    if (n == 2) return ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
    if (n == 3) return ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) |
           ((uint32_t)(u[2] & 0x3f) << 6) | (u[3] & 0x3f);
}

/* The 256 byte tokens in GPT-2 order: sorted by the code point each byte maps to. */
static int add_byte_tokens(trainer *t)
{
    uint32_t order[256];
    char map[256][4];
    int mlen[256];
    for (int b = 0; b < 256; b++) {
        mlen[b] = tokenizer_byte_to_utf8((uint8_t)b, map[b]);
        if (mlen[b] < 1 || mlen[b] > 4) return err_setf(t->e, ERR_INTERNAL, "byte map of %d has %d bytes", b, mlen[b]);
        order[b] = (utf8_cp(map[b], mlen[b]) << 8) | (uint32_t)b;
    }
    qsort(order, 256, sizeof order[0], byte_order_cmp);
    for (int k = 0; k < 256; k++) {
        int b = (int)(order[k] & 0xff);
        if (tok_find(t, map[b], (size_t)mlen[b]) >= 0)
            return err_setf(t->e, ERR_INTERNAL, "byte map is not one-to-one at byte %d", b);
        int32_t id = tok_add(t, map[b], (size_t)mlen[b]);
        if (id < 0) return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
        t->byte_tok[b] = id;
    }
    return 0;
}

static int build_words(trainer *t)
{
    size_t total = 0;
    for (int32_t w = 0; w < t->n_words; w++) total += (size_t)t->piece_len[w];
    t->sym = malloc((total ? total : 1) * sizeof *t->sym);
    t->wsym_off = malloc(((size_t)t->n_words + 1) * sizeof *t->wsym_off);
    t->wsym_len = malloc(((size_t)t->n_words + 1) * sizeof *t->wsym_len);
    t->wmark = malloc(((size_t)t->n_words + 1) * sizeof *t->wmark);
    if (!t->sym || !t->wsym_off || !t->wsym_len || !t->wmark) return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
    size_t off = 0;
    for (int32_t w = 0; w < t->n_words; w++) {
        const uint8_t *p = (const uint8_t *)t->piece_text.p + t->piece_off[w];
        t->wsym_off[w] = off;
        t->wsym_len[w] = t->piece_len[w];
        t->wmark[w] = -1;
        for (int32_t i = 0; i < t->piece_len[w]; i++) t->sym[off + (size_t)i] = t->byte_tok[p[i]];
        off += (size_t)t->piece_len[w];
    }
    /* initial pair counts and postings */
    for (int32_t w = 0; w < t->n_words; w++) {
        const int32_t *s = t->sym + t->wsym_off[w];
        for (int32_t i = 0; i + 1 < t->wsym_len[w]; i++) {
            int64_t p = pair_get(t, s[i], s[i + 1]);
            if (p < 0 || post_add(&t->pairs[p], w)) return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
            t->pairs[p].count += t->wcount[w];
        }
    }
    for (size_t p = 0; p < t->n_pairs; p++)
        if (heap_push(t, t->pairs[p].count, t->pairs[p].a, t->pairs[p].b))
            return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
    return 0;
}

static int add_merge_text(trainer *t, int32_t a, int32_t b)
{
    if (grow((void **)&t->merge_off, &t->cap_merges, t->n_merges + 1, sizeof *t->merge_off)) return -1;
    t->merge_off[t->n_merges++] = t->merge_text.n;
    if (sb_put(&t->merge_text, t->tok_text.p + t->tok_off[a], (size_t)t->tok_len[a]) ||
        sb_put(&t->merge_text, " ", 1) ||
        sb_put(&t->merge_text, t->tok_text.p + t->tok_off[b], (size_t)t->tok_len[b]) ||
        sb_put(&t->merge_text, "", 1))
        return -1;
    return 0;
}

/* Merge pair slot pi (a,b) into token c in every word that contains it.
 * `merge_no` identifies this merge for the per-word and per-pair marks. */
static int apply_merge(trainer *t, int64_t pi, int32_t c, int32_t merge_no)
{
    int32_t a = t->pairs[pi].a, b = t->pairs[pi].b;
    /* The posting list of (a,b) cannot grow during this merge (every pair
     * created here contains c, and c differs from a and b), so iterate by index. */
    int32_t n_post = t->pairs[pi].n_post;
    int64_t *touched = NULL;
    size_t n_touched = 0, cap_touched = 0;
    for (int32_t k = 0; k < n_post; k++) {
        int32_t w = t->pairs[pi].post[k];
        if (t->wmark[w] == merge_no) continue;
        t->wmark[w] = merge_no;
        int32_t *s = t->sym + t->wsym_off[w];
        int32_t n = t->wsym_len[w];
        int has = 0;
        for (int32_t i = 0; i + 1 < n && !has; i++) has = s[i] == a && s[i + 1] == b;
        if (!has) continue;
        int64_t cnt = t->wcount[w];
        for (int32_t i = 0; i + 1 < n; i++) t->pairs[pair_find(t, s[i], s[i + 1])].count -= cnt;
        int32_t j = 0;
        for (int32_t i = 0; i < n;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) { s[j++] = c; i += 2; }
            else s[j++] = s[i++];
        }
        t->wsym_len[w] = n = j;
        for (int32_t i = 0; i + 1 < n; i++) {
            int64_t p = pair_get(t, s[i], s[i + 1]);
            if (p < 0) goto oom;
            t->pairs[p].count += cnt;
            if (s[i] == c || s[i + 1] == c) {
                if (post_add(&t->pairs[p], w)) goto oom;
                if (t->pairs[p].touched != merge_no) {
                    t->pairs[p].touched = merge_no;
                    if (grow((void **)&touched, &cap_touched, n_touched + 1, sizeof *touched)) goto oom;
                    touched[n_touched++] = p;
                }
            }
        }
    }
    for (size_t k = 0; k < n_touched; k++) {
        pair_slot *p = &t->pairs[touched[k]];
        if (p->count > 0 && heap_push(t, p->count, p->a, p->b)) goto oom;
    }
    free(touched);
    return 0;
oom:
    free(touched);
    return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
}

static void trainer_free(trainer *t)
{
    free(t->piece_text.p);
    free(t->piece_off);
    free(t->piece_len);
    free(t->wmap);
    free(t->wcount);
    free(t->sym);
    free(t->wsym_off);
    free(t->wsym_len);
    free(t->wmark);
    free(t->tok_text.p);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tmap);
    for (size_t i = 0; i < t->n_pairs; i++) free(t->pairs[i].post);
    free(t->pairs);
    free(t->pmap);
    free(t->heap);
    free(t->merge_text.p);
    free(t->merge_off);
}

/* Hand the tokens and merges to the caller in one arena. */
static int export_vocab(trainer *t, int32_t n_learned, int32_t n_pad, const bpe_opts *o, bpe_vocab *out)
{
    size_t tok_bytes = t->tok_text.n, merge_bytes = t->merge_text.n;
    out->text_mem = malloc(tok_bytes + merge_bytes + 1);
    out->tokens = malloc((size_t)t->n_tok * sizeof *out->tokens);
    out->types = malloc((size_t)t->n_tok * sizeof *out->types);
    out->merges = malloc((t->n_merges ? t->n_merges : 1) * sizeof *out->merges);
    if (!out->text_mem || !out->tokens || !out->types || !out->merges) {
        bpe_vocab_free(out);
        return err_setf(t->e, ERR_NOMEM, "bpe_train: out of memory");
    }
    memcpy(out->text_mem, t->tok_text.p, tok_bytes);
    if (merge_bytes) memcpy(out->text_mem + tok_bytes, t->merge_text.p, merge_bytes);
    int32_t first_special = t->n_tok - n_pad - o->n_specials;
    for (int32_t i = 0; i < t->n_tok; i++) {
        out->tokens[i] = out->text_mem + t->tok_off[i];
        if (i < first_special) out->types[i] = TOK_NORMAL;
        else if (i < first_special + o->n_specials) out->types[i] = o->special_types[i - first_special];
        else out->types[i] = TOK_UNUSED;
    }
    for (size_t m = 0; m < t->n_merges; m++) out->merges[m] = out->text_mem + tok_bytes + t->merge_off[m];
    out->n_tokens = t->n_tok;
    out->n_merges = (int64_t)t->n_merges;
    out->n_learned = n_learned;
    out->n_pad = n_pad;
    return 0;
}

int bpe_train(const char *text, size_t len, const bpe_opts *o, bpe_vocab *out, err *e)
{
    memset(out, 0, sizeof *out);
    if (o->n_specials < 0 || o->n_vocab < 256 + o->n_specials + 1)
        return err_setf(e, ERR_USAGE, "vocabulary of %d tokens is too small: it needs 256 byte tokens, "
                        "%d special tokens and at least one merge", o->n_vocab, o->n_specials);
    trainer t;
    memset(&t, 0, sizeof t);
    t.e = e;
    int rc = tokenizer_pre_split(o->pre, text, len, on_piece, &t, e);
    if (rc == 0 && t.oom) rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory while counting pieces");
    if (rc == 0) rc = add_byte_tokens(&t);
    if (rc == 0) rc = build_words(&t);
    int32_t target = o->n_vocab - o->n_specials - 256, n_learned = 0;
    int32_t merge_no = 0;
    while (rc == 0 && n_learned < target && t.n_heap > 0) {
        heap_ent h = heap_pop(&t);
        int64_t pi = pair_find(&t, h.a, h.b);
        int64_t cur = pi >= 0 ? t.pairs[pi].count : 0;
        if (cur != h.count) {
            /* Stale: re-queue at the lower current count (a higher current
             * count already has its own entry). */
            if (cur > 0 && cur < h.count && heap_push(&t, cur, h.a, h.b))
                rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory");
            continue;
        }
        if (cur <= 0) continue;
        size_t la = (size_t)t.tok_len[h.a], lb = (size_t)t.tok_len[h.b];
        char stackbuf[256];
        char *cat = la + lb <= sizeof stackbuf ? stackbuf : malloc(la + lb);
        if (!cat) { rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory"); break; }
        memcpy(cat, t.tok_text.p + t.tok_off[h.a], la);
        memcpy(cat + la, t.tok_text.p + t.tok_off[h.b], lb);
        int32_t c = tok_find(&t, cat, la + lb);
        if (c < 0) {
            c = tok_add(&t, cat, la + lb);
            if (c >= 0) n_learned++;
        }
        if (cat != stackbuf) free(cat);
        if (c < 0) { rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory"); break; }
        /* A pair that re-forms after its merge (possible only when a merge
         * reused an existing text) is merged again but not listed twice:
         * llama.cpp would ignore the second rank anyway. */
        if (!t.pairs[pi].merged) {
            if (add_merge_text(&t, h.a, h.b)) { rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory"); break; }
            t.pairs[pi].merged = 1;
        }
        rc = apply_merge(&t, pi, c, merge_no++);
    }
    int32_t n_pad = 0;
    for (int32_t i = 0; rc == 0 && i < o->n_specials; i++) {
        const char *s = o->specials[i];
        if (tok_find(&t, s, strlen(s)) >= 0) { rc = err_setf(e, ERR_USAGE, "special token '%s' is also a learned token", s); break; }
        if (tok_add(&t, s, strlen(s)) < 0) rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory");
    }
    while (rc == 0 && t.n_tok < o->n_vocab) {
        char pad[32];
        int n = snprintf(pad, sizeof pad, "[PAD%d]", t.n_tok);
        if (tok_add(&t, pad, (size_t)n) < 0) rc = err_setf(e, ERR_NOMEM, "bpe_train: out of memory");
        n_pad++;
    }
    if (rc == 0) rc = export_vocab(&t, n_learned, n_pad, o, out);
    trainer_free(&t);
    return rc;
}

void bpe_vocab_free(bpe_vocab *v)
{
    if (!v) return;
    free(v->text_mem);
    free((void *)v->tokens);
    free(v->types);
    free((void *)v->merges);
    memset(v, 0, sizeof *v);
}

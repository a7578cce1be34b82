/* xstore: see xstore.h for the model (arena, slots, waves, eviction,
 * counters).
 *
 * Concurrency: the coordinating thread holds `mu` for the whole of every
 * store operation except while it sleeps on `cv`; xio completion callbacks
 * take `mu` to finish a slot (LOADING -> RESIDENT or FAILED) and broadcast.
 * The key -> slot map and the slots' part pointers change only under `mu`
 * on the coordinating thread, and never while a layer's wave is being
 * computed, so expert_src_get reads them without a lock (the thread pool's
 * job hand-off orders those reads after the writes).
 *
 * Lock order: store mu -> xio's lock (xio_submit, xio_promote under mu);
 * xio never holds its lock while it calls back into the store.
 *
 * Memory: everything is allocated in xstore_open (slots, map, lists, the
 * arena, the chunk records, the I/O request table); no store operation
 * allocates. */
#include "expert/xstore.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/timer.h"

enum { S_EMPTY = 0, S_LOADING = 1, S_RESIDENT = 2, S_FAILED = 3 };
enum { ORIGIN_DEMAND = 0, ORIGIN_PREFETCH = 1, ORIGIN_WARM = 2 };

#define IOV_MAX_BYTES (1ull << 30)   /* io_uring's limit for one registered buffer */

typedef struct slot {
    uint8_t       *base;          /* into the arena: slot_bytes of its class */
    int32_t        key;           /* layer * n_expert + expert, or -1 */
    int            cls;
    int            state;         /* S_* */
    int            pending;       /* reads in flight */
    int            pins;
    int            prio;          /* XIO_* priority of the load in flight */
    int            first_prio;    /* the priority the load was submitted with */
    uint64_t       load_visit;    /* the layer visit during which it was submitted */
    int            origin;        /* ORIGIN_*: a prefetch stays ORIGIN_PREFETCH until used */
    int            protect;       /* holds a guess for an upcoming layer or wave */
    int            handle[XLAYOUT_MAX_READS];  /* xio handles while loading, -1 otherwise */
    uint64_t       last_use;      /* policy tick */
    int            prev, next;    /* LRU list of the class (mapped slots) */
    int            fail_status;   /* negative errno of the first failed read */
    uint64_t       fail_off;      /* where it failed */
    const uint8_t *part[3];       /* gate, up, down inside base (valid when mapped) */
} slot;

typedef struct sclass {
    uint64_t slot_bytes;
    int      first, n;            /* slots [first, first + n) */
    int      n_layers;
    uint64_t weight;              /* n_layers * n_expert * slot_bytes */
    int      head, tail;          /* LRU: head most recent */
    int      n_free;              /* free stack: free_stack[first .. first + n_free) */
} sclass;

typedef struct chunk_rec {
    int             phase;
    int             index;        /* within its evaluation call */
    int             arm;          /* enum xstore_arm */
    xstore_counters c;
} chunk_rec;

typedef struct policy {
    const char *name;
    void (*insert)(xstore *s, int v);   /* became mapped */
    void (*use)(xstore *s, int v);      /* a demand uses it */
    void (*cold)(xstore *s, int v);     /* a wrong guess: first to go */
    void (*remove)(xstore *s, int v);   /* unmapped */
    int  (*victim)(xstore *s, int c, int allow_protected);
} policy;

struct xstore {
    expert_src      base;         /* first member: the expert_src view */
    xstore_layout   lay;
    xstore_opts     o;
    int             n_layer, n_expert;
    int             retain;       /* 0: streaming buffers (arena 0) */
    int            *layer_cls;    /* n_layer */
    sclass         *cls;
    int             n_cls;
    slot           *slots;
    int             n_slots;
    int32_t        *map;          /* n_layer * n_expert: slot or -1 */
    int            *free_stack;   /* per class, see sclass.n_free */
    uint8_t        *arena;
    uint64_t        arena_bytes;
    const policy   *pol;
    uint32_t       *freq;         /* LFU: n_layer * n_expert lookup counts */
    uint64_t        age_lookups, age_period, tick;
    xio            *io;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    /* the layer being computed */
    int             visit_layer, visit_remaining;
    uint64_t        visit_seq;    /* counts layer visits */
    int            *wave;         /* slots of the current wave (n_expert) */
    int             n_wave;
    int             n_compute;    /* threads that may block in wait_expert */
    int             n_blocked;    /* of them, blocked now */
    double          all_blocked_t0; /* when the last of them blocked */
    uint8_t        *mark;         /* n_expert scratch flags */
    int            *order;        /* n_slots scratch */
    int32_t        *tmp;          /* n_expert scratch */
    /* outstanding predictions: at most two (read-ahead from a layer's input
     * guesses layer L+2 before layer L+1 is looked up) */
    struct {
        int      layer;           /* -1: unused */
        int32_t *ex;              /* n_expert */
        int      n;
    } pred[2];
    /* counters */
    int             in_chunk, cur_phase, cur_rows, cur_index, cur_arm;
    double          chunk_t0;
    xio_stats       io0;
    xstore_counters cur;
    xstore_counters phase[XSTORE_N_PHASES];
    xstore_counters arm[XSTORE_N_ARMS];
    uint64_t       *layer_lookups[XSTORE_N_PHASES];
    chunk_rec      *chunks;
    int             n_chunks, max_chunks;
    uint64_t        chunks_dropped;
    /* warm fill */
    int             warmed;
    uint64_t        warm_n, warm_ranked, warm_bytes;
    double          warm_ms;
};

/* ==== Small helpers ==== */

static int key_layer(const xstore *s, int32_t key)  { return key / s->n_expert; }
static int key_expert(const xstore *s, int32_t key) { return key % s->n_expert; }
static int busy(const slot *sl)                     { return sl->pins > 0 || sl->state == S_LOADING; }

static const char *fmt_bytes(char *buf, size_t cap, double b)
{
    if (b >= 1e9) snprintf(buf, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, cap, "%.1f MB", b / 1e6);
    else snprintf(buf, cap, "%.0f kB", b / 1e3);
    return buf;
}

/* ==== LRU ==== */

static void lru_unlink(xstore *s, int v)
{
    slot *sl = &s->slots[v];
    sclass *c = &s->cls[sl->cls];
    if (sl->prev >= 0) s->slots[sl->prev].next = sl->next; else c->head = sl->next;
    if (sl->next >= 0) s->slots[sl->next].prev = sl->prev; else c->tail = sl->prev;
    sl->prev = sl->next = -1;
}

static void lru_push_front(xstore *s, int v)
{
    slot *sl = &s->slots[v];
    sclass *c = &s->cls[sl->cls];
    sl->prev = -1;
    sl->next = c->head;
    if (c->head >= 0) s->slots[c->head].prev = v; else c->tail = v;
    c->head = v;
}

static void lru_push_back(xstore *s, int v)
{
    slot *sl = &s->slots[v];
    sclass *c = &s->cls[sl->cls];
    sl->next = -1;
    sl->prev = c->tail;
    if (c->tail >= 0) s->slots[c->tail].next = v; else c->head = v;
    c->tail = v;
}

static void lru_insert(xstore *s, int v) { lru_push_front(s, v); }
static void lru_use(xstore *s, int v)    { lru_unlink(s, v); lru_push_front(s, v); }
static void lru_cold(xstore *s, int v)   { lru_unlink(s, v); lru_push_back(s, v); }
static void lru_remove(xstore *s, int v) { lru_unlink(s, v); }

/* Least recent evictable slot; protected ones only if allowed and nothing
 * else is evictable. */
static int lru_victim(xstore *s, int c, int allow_protected)
{
    int fallback = -1;
    for (int v = s->cls[c].tail; v >= 0; v = s->slots[v].prev) {
        const slot *sl = &s->slots[v];
        if (busy(sl)) continue;
        if (!sl->protect) return v;
        if (fallback < 0) fallback = v;
    }
    return allow_protected ? fallback : -1;
}

static const policy k_lru = { "lru", lru_insert, lru_use, lru_cold, lru_remove, lru_victim };

/* ==== LFU with aging ==== */

static void lfu_insert(xstore *s, int v) { s->slots[v].last_use = ++s->tick; lru_push_front(s, v); }
static void lfu_use(xstore *s, int v)    { s->slots[v].last_use = ++s->tick; }
static void lfu_cold(xstore *s, int v)   { s->slots[v].last_use = 0; }
static void lfu_remove(xstore *s, int v) { lru_unlink(s, v); }

/* Lowest (protected, count, last use) among evictable mapped slots. The
 * scan is O(slots of the class) per eviction: at most a few thousand
 * compares, small next to reading the expert it makes room for. */
static int lfu_victim(xstore *s, int c, int allow_protected)
{
    int best = -1;
    uint32_t bf = 0;
    uint64_t bt = 0;
    int bp = 0;
    for (int v = s->cls[c].head; v >= 0; v = s->slots[v].next) {
        const slot *sl = &s->slots[v];
        if (busy(sl) || (sl->protect && !allow_protected)) continue;
        const uint32_t f = s->freq[sl->key];
        if (best < 0 || sl->protect < bp || (sl->protect == bp && (f < bf || (f == bf && sl->last_use < bt)))) {
            best = v; bf = f; bt = sl->last_use; bp = sl->protect;
        }
    }
    return best;
}

static const policy k_lfu = { "lfu", lfu_insert, lfu_use, lfu_cold, lfu_remove, lfu_victim };

/* Count a lookup of key for LFU, halving every count each age_period
 * lookups so that old popularity fades (age_period: see xstore.h). */
static void freq_count(xstore *s, int32_t key)
{
    if (!s->freq) return;
    if (s->freq[key] < UINT32_MAX) s->freq[key]++;
    if (++s->age_lookups >= s->age_period) {
        const size_t n = (size_t)s->n_layer * (size_t)s->n_expert;
        for (size_t i = 0; i < n; i++) s->freq[i] >>= 1;
        s->age_lookups = 0;
    }
}

/* ==== Slots (under mu) ==== */

static void free_push(xstore *s, int v)
{
    sclass *c = &s->cls[s->slots[v].cls];
    s->free_stack[c->first + c->n_free++] = v;
}

/* Unmap v (must not be busy). A prefetched expert never used is a waste. */
static void unmap(xstore *s, int v)
{
    slot *sl = &s->slots[v];
    if (sl->key >= 0) {
        if (sl->origin == ORIGIN_PREFETCH) s->cur.prefetch_wasted++;
        s->map[sl->key] = -1;
        s->pol->remove(s, v);
    }
    sl->key = -1;
    sl->state = S_EMPTY;
    sl->origin = ORIGIN_DEMAND;
    sl->protect = 0;
    sl->fail_status = 0;
}

/* Unmap v and return it to the free stack. */
static void release(xstore *s, int v)
{
    unmap(s, v);
    free_push(s, v);
}

/* A slot of class c to load into: a free one, else the policy's victim
 * (unmapped here). -1 when every slot is busy (or protected, unless
 * allowed). */
static int take_slot(xstore *s, int c, int allow_protected)
{
    sclass *cl = &s->cls[c];
    if (cl->n_free > 0) return s->free_stack[cl->first + --cl->n_free];
    const int v = s->pol->victim(s, c, allow_protected);
    if (v >= 0) unmap(s, v);
    return v;
}

/* Fill slot v with expert `key`: submit its reads at `prio`. v is unmapped
 * (from take_slot) or already holds key (a reload after a failure). */
static int load(xstore *s, int v, int32_t key, int prio, int origin, err *e)
{
    slot *sl = &s->slots[v];
    const int layer = key_layer(s, key), expert = key_expert(s, key);
    xread r[XLAYOUT_MAX_READS];
    const int n = s->lay.reads(s->lay.ctx, layer, expert, r);
    const uint64_t cap = s->cls[sl->cls].slot_bytes;
    if (n < 1 || n > XLAYOUT_MAX_READS)
        return err_setf(e, ERR_INTERNAL, "expert %d of layer %d: the layout gives %d reads", expert, layer, n);
    for (int i = 0; i < n; i++)
        if (r[i].bytes == 0 || r[i].slot_off > cap || r[i].bytes > cap - r[i].slot_off)
            return err_setf(e, ERR_INTERNAL, "expert %d of layer %d: read %d does not fit its %" PRIu64 "-byte slot",
                            expert, layer, i, cap);
    const int fresh = sl->key != key;
    if (fresh) {
        sl->key = key;
        s->map[key] = v;
        for (int w = 0; w < 3; w++) sl->part[w] = sl->base + s->lay.part_off(s->lay.ctx, layer, expert, w);
        s->pol->insert(s, v);
    }
    sl->origin = origin;
    sl->prio = prio;
    sl->first_prio = prio;
    sl->load_visit = s->visit_seq;
    sl->fail_status = 0;
    sl->state = S_LOADING;
    sl->pending = n;
    for (int i = 0; i < XLAYOUT_MAX_READS; i++) sl->handle[i] = -1;
    s->cur.loads++;
    if (prio == XIO_PREFETCH) s->cur.loads_prefetch++;
    for (int i = 0; i < n; i++) {
        const uint64_t tag = (uint64_t)v * 4 + (uint64_t)i;
        int rc = xio_submit(s->io, r[i].file_off, r[i].bytes, r[i].need, sl->base + r[i].slot_off, prio, tag,
                            &sl->handle[i], e);
        if (rc) {
            /* cannot happen (the request table holds 3 reads per slot):
             * the reads not submitted will never complete */
            sl->pending -= n - i;
            if (sl->pending == 0) sl->state = S_FAILED;
            sl->fail_status = -EIO;
            return rc;
        }
        s->cur.submissions++;
    }
    return 0;
}

/* An xio completion (I/O thread). */
static void on_read(void *ctx, uint64_t tag, const xio_result *r)
{
    xstore *s = ctx;
    const int v = (int)(tag / 4), i = (int)(tag % 4);
    pthread_mutex_lock(&s->mu);
    slot *sl = &s->slots[v];
    sl->handle[i] = -1;
    if (r->status && !sl->fail_status) {
        sl->fail_status = r->status;
        sl->fail_off = r->fail_off;
    }
    if (--sl->pending == 0) {
        sl->state = sl->fail_status ? S_FAILED : S_RESIDENT;
        if (sl->fail_status) s->cur.io_errors++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* The error of failed slot v. */
static int read_error(const xstore *s, const slot *sl, err *e)
{
    const int st = sl->fail_status;
    return err_setf(e, ERR_IO, "cannot read expert %d of layer %d from %s: %s at file offset %" PRIu64,
                    key_expert(s, sl->key), key_layer(s, sl->key), s->lay.desc ? s->lay.desc : "the model",
                    st == -ENODATA ? "unexpected end of file" : strerror(st < 0 ? -st : EIO), sl->fail_off);
}

/* Pin v for the current wave: a prefetch in flight becomes a demand (it is
 * never read twice); a failed slot is read again, unless it is a demand
 * read of this very layer visit (the next wave's, read ahead by the
 * previous one): that failure is the request's error. */
static int pin(xstore *s, int v, err *e)
{
    slot *sl = &s->slots[v];
    if (sl->state == S_FAILED && sl->first_prio == XIO_DEMAND && sl->load_visit == s->visit_seq)
        return read_error(s, sl, e);
    if (sl->state == S_FAILED) {
        int rc = load(s, v, sl->key, XIO_DEMAND, ORIGIN_DEMAND, e);
        if (rc) return rc;
    } else if (sl->state == S_LOADING && sl->prio == XIO_PREFETCH) {
        for (int i = 0; i < XLAYOUT_MAX_READS; i++)
            if (sl->handle[i] >= 0) xio_promote(s->io, sl->handle[i]);
        sl->prio = XIO_DEMAND;
    }
    sl->pins++;
    sl->protect = 0;
    if (sl->origin == ORIGIN_PREFETCH || sl->origin == ORIGIN_WARM) sl->origin = ORIGIN_DEMAND;
    s->pol->use(s, v);
    s->wave[s->n_wave++] = v;
    return 0;
}

/* Forget prediction p: unprotect its slots; guesses not in `used` (NULL:
 * none used) are counted as wasted and go to the cold end (or are freed in
 * streaming mode). */
static void drop_prediction(xstore *s, int p, const uint8_t *used)
{
    const int layer = s->pred[p].layer;
    if (layer < 0) return;
    for (int i = 0; i < s->pred[p].n; i++) {
        const int32_t x = s->pred[p].ex[i];
        const int v = s->map[layer * s->n_expert + x];
        if (v < 0) continue;
        slot *sl = &s->slots[v];
        if (sl->pins) continue;
        sl->protect = 0;
        if (used && used[x]) continue;
        if (sl->origin == ORIGIN_PREFETCH) {
            /* a wrong guess: counted once, then an ordinary (cold) resident */
            s->cur.prefetch_wasted++;
            sl->origin = ORIGIN_DEMAND;
            if (!s->retain && sl->state != S_LOADING) release(s, v);
            else s->pol->cold(s, v);
        }
    }
    s->pred[p].layer = -1;
    s->pred[p].n = 0;
}

static void drop_predictions(xstore *s)
{
    drop_prediction(s, 0, NULL);
    drop_prediction(s, 1, NULL);
}

/* First call of a layer visit: count the lookups and judge the prediction. */
static void classify(xstore *s, int layer, const int32_t *ex, int n)
{
    xstore_counters *c = &s->cur;
    c->lookups += (uint64_t)n;
    s->layer_lookups[s->cur_phase][layer] += (uint64_t)n;
    memset(s->mark, 0, (size_t)s->n_expert);
    for (int i = 0; i < n; i++) {
        const int32_t key = layer * s->n_expert + ex[i];
        s->mark[ex[i]] = 1;
        freq_count(s, key);
        const int v = s->map[key];
        if (v < 0 || s->slots[v].state == S_FAILED) c->misses++;
        else if (s->slots[v].origin == ORIGIN_PREFETCH) c->ahead++;
        else c->hits++;
    }
    for (int p = 0; p < 2; p++) {
        if (s->pred[p].layer == layer) {
            c->predicted += (uint64_t)s->pred[p].n;
            c->lookups_predicted += (uint64_t)n;
            for (int i = 0; i < s->pred[p].n; i++) if (s->mark[s->pred[p].ex[i]]) c->predicted_used++;
            drop_prediction(s, p, s->mark);
        } else if (s->pred[p].layer >= 0 && s->pred[p].layer < layer) {
            drop_prediction(s, p, NULL);   /* predicted, but its layer was skipped */
        }
    }
}

/* Sleep (mu held) until a read completes: called when every slot a demand
 * could take is loading, so a completion is on its way. */
static void wait_any_load(xstore *s)
{
    const double t0 = timer_ms();
    pthread_cond_wait(&s->cv, &s->mu);
    s->cur.wait_ms += timer_ms() - t0;
}

/* ==== expert_src implementation ==== */

static int st_begin(expert_src *src, int layer, int32_t *ex, int n, err *e)
{
    xstore *s = (xstore *)src;
    if (layer < 0 || layer >= s->n_layer || n < 1 || n > s->n_expert)
        return err_setf(e, ERR_INTERNAL, "expert store: bad layer %d or set of %d", layer, n);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->n_wave) {   /* the caller skipped end_layer: unpin */
        for (int i = 0; i < s->n_wave; i++) s->slots[s->wave[i]].pins--;
        s->n_wave = 0;
    }
    if (!(layer == s->visit_layer && n == s->visit_remaining)) {
        s->visit_seq++;
        classify(s, layer, ex, n);
        s->visit_layer = layer;
    }
    const int c = s->layer_cls[layer];
    const sclass *cl = &s->cls[c];

    /* mapped experts first, then the ones without a slot (both in order) */
    int nm = 0, nt = 0;
    for (int i = 0; i < n; i++) {
        if (s->map[layer * s->n_expert + ex[i]] >= 0) ex[nm++] = ex[i];
        else s->tmp[nt++] = ex[i];
    }
    memcpy(ex + nm, s->tmp, sizeof *ex * (size_t)nt);
    const int nu = n - nm;

    /* slots a demand may take: free, or mapped to nothing of this set and
     * neither pinned nor loading */
    int avail;
    for (;;) {
        memset(s->mark, 0, (size_t)s->n_expert);
        for (int i = 0; i < n; i++) s->mark[ex[i]] = 1;
        /* counted only as far as the decision needs: every miss fits
         * (avail >= nu) or the exact count for the waves; stopping early
         * keeps begin_layer O(k) with a large arena (a GPU host tier asks
         * twice a layer per token) */
        avail = cl->n_free;
        for (int v = cl->first; v < cl->first + cl->n && avail < nu; v++) {
            const slot *sl = &s->slots[v];
            if (sl->key < 0 || busy(sl)) continue;
            if (key_layer(s, sl->key) == layer && s->mark[key_expert(s, sl->key)]) continue;
            avail++;
        }
        if (nu == 0 || avail > 0 || nm > 0) break;
        wait_any_load(s);   /* every slot of the class is loading */
    }
    int w, extra;
    if (nu <= avail) {
        w = nu;
        extra = 0;
    } else {
        w = avail >= 2 ? avail / 2 : avail;
        extra = avail - w < nu - w ? avail - w : nu - w;
        s->cur.waves++;
    }
    const int k = nm + w;

    for (int i = 0; i < nm && rc == 0; i++) rc = pin(s, s->map[layer * s->n_expert + ex[i]], e);
    for (int i = nm; i < k && rc == 0; i++) {
        const int v = take_slot(s, c, 1);
        if (v < 0) { rc = err_setf(e, ERR_INTERNAL, "expert store: no slot for layer %d", layer); break; }
        rc = load(s, v, layer * s->n_expert + ex[i], XIO_DEMAND, ORIGIN_DEMAND, e);
        if (rc == 0) rc = pin(s, v, e);
    }
    /* double buffering: read the next wave now, into the other half */
    for (int i = k; i < k + extra && rc == 0; i++) {
        const int v = take_slot(s, c, 1);
        if (v < 0) break;
        rc = load(s, v, layer * s->n_expert + ex[i], XIO_DEMAND, ORIGIN_DEMAND, e);
        s->slots[v].protect = 1;
    }
    if (rc) {
        for (int i = 0; i < s->n_wave; i++) s->slots[s->wave[i]].pins--;
        s->n_wave = 0;
        s->visit_remaining = 0;
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    s->visit_remaining = n - k;
    pthread_mutex_unlock(&s->mu);
    return k;
}

static int st_wait(expert_src *src, int layer, err *e)
{
    (void)layer;
    xstore *s = (xstore *)src;
    pthread_mutex_lock(&s->mu);
    double t0 = 0;
    int waited = 0, rc = 0;
    for (int again = 1; again && rc == 0;) {
        for (int i = 0; i < s->n_wave; i++)
            while (s->slots[s->wave[i]].state == S_LOADING) {
                if (!waited) { t0 = timer_ms(); waited = 1; }
                pthread_cond_wait(&s->cv, &s->mu);
            }
        /* a guess that failed is read again, now as a demand: a prefetch
         * never decides the outcome */
        again = 0;
        for (int i = 0; i < s->n_wave && rc == 0; i++) {
            slot *sl = &s->slots[s->wave[i]];
            if (sl->state == S_FAILED && sl->first_prio == XIO_PREFETCH) {
                rc = load(s, s->wave[i], sl->key, XIO_DEMAND, ORIGIN_DEMAND, e);
                again = 1;
            }
        }
    }
    if (waited) s->cur.wait_ms += timer_ms() - t0;
    for (int i = 0; i < s->n_wave && rc == 0; i++) {
        const slot *sl = &s->slots[s->wave[i]];
        if (sl->state != S_FAILED) continue;
        rc = read_error(s, sl, e);
        break;
    }
    if (rc) {   /* end the wave: nothing stays pinned; failed slots are read again when wanted */
        for (int i = 0; i < s->n_wave; i++) s->slots[s->wave[i]].pins--;
        s->n_wave = 0;
        s->visit_remaining = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* A compute thread blocks on the store's condition variable (mu held).
 * wait_ms counts the wall time during which every compute thread was
 * blocked: the time reads cost the host, not the sum over threads. */
static void blocked_wait(xstore *s)
{
    if (++s->n_blocked >= s->n_compute) s->all_blocked_t0 = timer_ms();
    pthread_cond_wait(&s->cv, &s->mu);
    if (s->n_blocked >= s->n_compute) s->cur.wait_ms += timer_ms() - s->all_blocked_t0;
    s->n_blocked--;
}

/* Wave entry i: until it is resident; a failed guess is read again as a
 * demand (a prefetch never decides the outcome); a failed demand is the
 * error. The wave stays pinned either way (see expert_src.h). */
static int st_wait_expert(expert_src *src, int layer, int i, err *e)
{
    (void)layer;
    xstore *s = (xstore *)src;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (i < 0 || i >= s->n_wave) {
        rc = err_setf(e, ERR_INTERNAL, "expert store: wave entry %d of %d", i, s->n_wave);
    } else {
        const int v = s->wave[i];
        for (;;) {
            slot *sl = &s->slots[v];
            if (sl->state == S_LOADING) { blocked_wait(s); continue; }
            if (sl->state == S_FAILED && sl->first_prio == XIO_PREFETCH) {
                if ((rc = load(s, v, sl->key, XIO_DEMAND, ORIGIN_DEMAND, e)) != 0) break;
                continue;
            }
            if (sl->state == S_FAILED) rc = read_error(s, sl, e);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void st_prefetch(expert_src *src, int layer, const int32_t *ex, int n)
{
    xstore *s = (xstore *)src;
    if (layer < 0 || layer >= s->n_layer || n < 1) return;
    if (n > s->n_expert) n = s->n_expert;
    pthread_mutex_lock(&s->mu);
    /* a new guess for a layer replaces the old one; else take a free entry,
     * or the one for the lower layer */
    int p = s->pred[0].layer == layer ? 0 : s->pred[1].layer == layer ? 1 : s->pred[0].layer < 0 ? 0
          : s->pred[1].layer < 0 ? 1 : s->pred[0].layer < s->pred[1].layer ? 0 : 1;
    drop_prediction(s, p, NULL);
    s->pred[p].layer = layer;
    const int c = s->layer_cls[layer];
    int room = 1;
    for (int i = 0; i < n; i++) {
        if (ex[i] < 0 || ex[i] >= s->n_expert) continue;
        s->pred[p].ex[s->pred[p].n++] = ex[i];
        const int32_t key = layer * s->n_expert + ex[i];
        int v = s->map[key];
        if (v >= 0) {
            slot *sl = &s->slots[v];
            if (sl->state == S_FAILED && !busy(sl)) {
                if (load(s, v, key, XIO_PREFETCH, ORIGIN_PREFETCH, NULL) != 0) continue;
            }
            sl->protect = 1;
            continue;
        }
        if (!room) continue;
        v = take_slot(s, c, 0);
        if (v < 0) { room = 0; continue; }   /* no room: the rest stay guesses without reads */
        if (load(s, v, key, XIO_PREFETCH, ORIGIN_PREFETCH, NULL) != 0) { release(s, v); room = 0; continue; }
        s->slots[v].protect = 1;
    }
    pthread_mutex_unlock(&s->mu);
}

static const void *st_get(expert_src *src, int layer, int expert, int which)
{
    xstore *s = (xstore *)src;
    const int v = s->map[layer * s->n_expert + expert];
    return v >= 0 ? s->slots[v].part[which] : NULL;
}

static void st_end(expert_src *src, int layer)
{
    (void)layer;
    xstore *s = (xstore *)src;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_wave; i++) {
        const int v = s->wave[i];
        slot *sl = &s->slots[v];
        sl->pins--;
        if (!s->retain && sl->pins == 0 && !sl->protect && sl->state != S_LOADING) release(s, v);
    }
    s->n_wave = 0;
    pthread_mutex_unlock(&s->mu);
}

static void st_mask(expert_src *src, int layer, uint8_t *mask)
{
    xstore_resident_mask((xstore *)src, layer, mask);
}

static void st_close(expert_src *src)
{
    (void)src;   /* the store is closed by its owner (xstore_close) */
}

static const expert_src_vtable k_store_vt = {
    .begin_layer = st_begin,
    .wait_layer = st_wait,
    .wait_expert = st_wait_expert,
    .prefetch = st_prefetch,
    .get = st_get,
    .end_layer = st_end,
    .resident_mask = st_mask,
    .close = st_close,
};

/* ==== Planning ==== */

typedef struct plan {
    int      n_cls;
    uint64_t slot_bytes[64];
    int      n_layers[64];
    int      n_slots[64];
    uint64_t total;   /* arena bytes */
} plan;

static int make_plan(const xstore_layout *lay, const xstore_opts *o, plan *p, int *layer_cls, err *e)
{
    memset(p, 0, sizeof *p);
    if (lay->n_layer < 1 || lay->n_expert < 1 || lay->n_expert > 65536)
        return err_setf(e, ERR_USAGE, "expert store: %d layers of %d experts", lay->n_layer, lay->n_expert);
    for (int l = 0; l < lay->n_layer; l++) {
        const uint64_t b = lay->slot_bytes(lay->ctx, l);
        if (b == 0 || b % 4096) return err_setf(e, ERR_INTERNAL, "layer %d: slot size %" PRIu64 " not a multiple of 4096", l, b);
        int c = 0;
        while (c < p->n_cls && p->slot_bytes[c] != b) c++;
        if (c == p->n_cls) {
            if (p->n_cls == 64) return err_setf(e, ERR_UNSUPPORTED, "more than 64 expert sizes");
            p->slot_bytes[p->n_cls++] = b;
        }
        p->n_layers[c]++;
        if (layer_cls) layer_cls[l] = c;
    }
    const int X = lay->n_expert;
    if (o->arena_bytes == 0) {
        int per = o->n_expert_used > o->read_ahead ? o->n_expert_used : o->read_ahead;
        if (per < 1) per = 1;
        for (int c = 0; c < p->n_cls; c++) {
            long n = 2L * per, most = (long)p->n_layers[c] * X;
            p->n_slots[c] = (int)(n < most ? n : most);
            if (p->n_slots[c] < XSTORE_MIN_SLOTS) p->n_slots[c] = XSTORE_MIN_SLOTS;
            p->total += (uint64_t)p->n_slots[c] * p->slot_bytes[c];
        }
        return 0;
    }
    double weight_sum = 0;
    uint64_t all = 0, min = 0;
    for (int c = 0; c < p->n_cls; c++) {
        weight_sum += (double)p->n_layers[c] * X * (double)p->slot_bytes[c];
        all += (uint64_t)p->n_layers[c] * (uint64_t)X * p->slot_bytes[c];
        min += XSTORE_MIN_SLOTS * p->slot_bytes[c];
    }
    if (o->arena_bytes < min) {
        char a[32], m[32];
        return err_setf(e, ERR_USAGE, "arena %s is below the minimum %s (%d slots of each of %d expert size%s; "
                        "use --arena 0 to stream every lookup)", fmt_bytes(a, sizeof a, (double)o->arena_bytes),
                        fmt_bytes(m, sizeof m, (double)min), XSTORE_MIN_SLOTS, p->n_cls, p->n_cls == 1 ? "" : "s");
    }
    const uint64_t budget = o->arena_bytes < all ? o->arena_bytes : all;
    for (int c = 0; c < p->n_cls; c++) {
        const double share = (double)p->n_layers[c] * X * (double)p->slot_bytes[c] / weight_sum;
        long n = (long)((double)budget * share / (double)p->slot_bytes[c]);
        const long most = (long)p->n_layers[c] * X;
        if (n > most) n = most;
        if (n < XSTORE_MIN_SLOTS) n = XSTORE_MIN_SLOTS;
        p->n_slots[c] = (int)n;
        p->total += (uint64_t)n * p->slot_bytes[c];
    }
    return 0;
}

int xstore_plan(const xstore_layout *lay, const xstore_opts *o, uint64_t *arena_bytes, err *e)
{
    plan p;
    int rc = make_plan(lay, o, &p, NULL, e);
    *arena_bytes = rc ? 0 : p.total;
    return rc;
}

/* ==== Open / close ==== */

int xstore_open(xstore **out, const xstore_layout *lay, const xstore_opts *o, err *e)
{
    *out = NULL;
    if (o->evict != XSTORE_EVICT_LRU && o->evict != XSTORE_EVICT_LFU)
        return err_setf(e, ERR_USAGE, "unknown eviction policy %d", o->evict);
    xstore *s = calloc(1, sizeof *s);
    if (!s) return err_setf(e, ERR_NOMEM, "out of memory");
    s->base.vt = &k_store_vt;
    s->lay = *lay;
    s->o = *o;
    s->n_compute = o->n_compute > 0 ? o->n_compute : 1;
    s->n_layer = lay->n_layer;
    s->n_expert = lay->n_expert;
    s->retain = o->arena_bytes > 0;
    s->pol = o->evict == XSTORE_EVICT_LFU ? &k_lfu : &k_lru;
    s->visit_layer = -1;
    s->pred[0].layer = s->pred[1].layer = -1;
    s->arena = MAP_FAILED;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc;
    plan p;
    s->layer_cls = calloc((size_t)(lay->n_layer > 0 ? lay->n_layer : 1), sizeof *s->layer_cls);
    if (!s->layer_cls) { rc = err_setf(e, ERR_NOMEM, "out of memory"); goto fail; }
    if ((rc = make_plan(lay, o, &p, s->layer_cls, e))) goto fail;

    const size_t K = (size_t)s->n_layer * (size_t)s->n_expert;
    s->n_cls = p.n_cls;
    for (int c = 0; c < p.n_cls; c++) s->n_slots += p.n_slots[c];
    s->cls = calloc((size_t)s->n_cls, sizeof *s->cls);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->free_stack = calloc((size_t)s->n_slots, sizeof *s->free_stack);
    s->order = calloc((size_t)s->n_slots, sizeof *s->order);
    s->map = malloc(sizeof *s->map * K);
    s->wave = calloc((size_t)s->n_expert, sizeof *s->wave);
    s->mark = calloc((size_t)s->n_expert, 1);
    s->tmp = calloc((size_t)s->n_expert, sizeof *s->tmp);
    for (int p = 0; p < 2; p++) s->pred[p].ex = calloc((size_t)s->n_expert, sizeof(int32_t));
    s->max_chunks = o->max_chunks > 0 ? o->max_chunks : 4096;
    s->chunks = calloc((size_t)s->max_chunks, sizeof *s->chunks);
    for (int ph = 0; ph < XSTORE_N_PHASES; ph++) s->layer_lookups[ph] = calloc((size_t)s->n_layer, sizeof(uint64_t));
    if (o->evict == XSTORE_EVICT_LFU) s->freq = calloc(K, sizeof *s->freq);
    if (!s->cls || !s->slots || !s->free_stack || !s->order || !s->map || !s->wave || !s->mark || !s->tmp || !s->pred[0].ex || !s->pred[1].ex ||
        !s->chunks || !s->layer_lookups[0] || !s->layer_lookups[1] || (o->evict == XSTORE_EVICT_LFU && !s->freq)) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < K; i++) s->map[i] = -1;
    s->age_period = 16 * (uint64_t)(s->n_slots > 64 ? s->n_slots : 64);

    /* the arena: one mapping, classes one after the other */
    s->arena_bytes = p.total;
    s->arena = mmap(NULL, (size_t)s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->arena == MAP_FAILED) {
        char b[32];
        rc = err_setf(e, ERR_NOMEM, "cannot allocate the expert arena (%s): %s",
                      fmt_bytes(b, sizeof b, (double)s->arena_bytes), strerror(errno));
        goto fail;
    }
    struct iovec iov[256];
    int n_iov = 0;
    uint64_t off = 0;
    int first = 0;
    for (int c = 0; c < s->n_cls; c++) {
        sclass *cl = &s->cls[c];
        cl->slot_bytes = p.slot_bytes[c];
        cl->first = first;
        cl->n = p.n_slots[c];
        cl->n_layers = p.n_layers[c];
        cl->weight = (uint64_t)cl->n_layers * (uint64_t)s->n_expert * cl->slot_bytes;
        cl->head = cl->tail = -1;
        for (int i = 0; i < cl->n; i++) {
            slot *sl = &s->slots[first + i];
            sl->base = s->arena + off + (uint64_t)i * cl->slot_bytes;
            sl->key = -1;
            sl->cls = c;
            sl->prev = sl->next = -1;
            for (int h = 0; h < XLAYOUT_MAX_READS; h++) sl->handle[h] = -1;
        }
        for (int i = cl->n - 1; i >= 0; i--) s->free_stack[cl->first + cl->n_free++] = first + i;
        /* registered buffers of whole slots, at most 1 GiB each */
        const int per_iov = (int)(IOV_MAX_BYTES / cl->slot_bytes) > 0 ? (int)(IOV_MAX_BYTES / cl->slot_bytes) : 1;
        for (int i = 0; i < cl->n && n_iov < 256; i += per_iov) {
            const int m = cl->n - i < per_iov ? cl->n - i : per_iov;
            iov[n_iov].iov_base = s->arena + off + (uint64_t)i * cl->slot_bytes;
            iov[n_iov].iov_len = (size_t)m * cl->slot_bytes;
            n_iov++;
        }
        off += (uint64_t)cl->n * cl->slot_bytes;
        first += cl->n;
    }
    xio_opts xo = {
        .mode = o->io_mode, .fd = lay->fd, .direct = lay->direct, .n_threads = o->io_threads,
        .depth = o->io_depth, .max_requests = s->n_slots * XLAYOUT_MAX_READS + 16,
        .bufs = o->no_register ? NULL : iov, .n_bufs = o->no_register ? 0 : n_iov,
        .done = on_read, .done_ctx = s,
    };
    if ((rc = xio_open(&s->io, &xo, e))) goto fail;
    *out = s;
    return 0;
fail:
    xstore_close(s);
    return rc;
}

void xstore_close(xstore *s)
{
    if (!s) return;
    xio_close(s->io);   /* no callbacks after this */
    if (s->arena != MAP_FAILED && s->arena) munmap(s->arena, (size_t)s->arena_bytes);
    for (int ph = 0; ph < XSTORE_N_PHASES; ph++) free(s->layer_lookups[ph]);
    free(s->layer_cls);
    free(s->cls);
    free(s->slots);
    free(s->free_stack);
    free(s->order);
    free(s->map);
    free(s->wave);
    free(s->mark);
    free(s->tmp);
    free(s->pred[0].ex);
    free(s->pred[1].ex);
    free(s->chunks);
    free(s->freq);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

expert_src *xstore_src(xstore *s) { return &s->base; }

/* ==== Chunks ==== */

static void add_counters(xstore_counters *a, const xstore_counters *b)
{
    a->chunks += b->chunks; a->rows += b->rows;
    a->lookups += b->lookups; a->hits += b->hits; a->ahead += b->ahead; a->misses += b->misses;
    a->loads += b->loads; a->loads_prefetch += b->loads_prefetch; a->submissions += b->submissions;
    a->reads += b->reads; a->bytes += b->bytes;
    a->predicted += b->predicted; a->predicted_used += b->predicted_used;
    a->lookups_predicted += b->lookups_predicted; a->prefetch_wasted += b->prefetch_wasted;
    a->waves += b->waves; a->io_errors += b->io_errors;
    a->host_ms += b->host_ms; a->wait_ms += b->wait_ms;
}

const char *xstore_arm_name(int arm)
{
    switch (arm) {
    case XSTORE_ARM_CHUNK0: return "prompt.chunk0";
    case XSTORE_ARM_PROMPT: return "prompt";
    case XSTORE_ARM_DECODE: return "decode";
    default: return "?";
    }
}

void xstore_chunk_begin(xstore *s, int phase, int n_rows)
{
    xstore_chunk_begin_at(s, phase, 0, n_rows);
}

void xstore_chunk_begin_at(xstore *s, int phase, int index, int n_rows)
{
    if (s->in_chunk) xstore_chunk_end(s);
    pthread_mutex_lock(&s->mu);
    memset(&s->cur, 0, sizeof s->cur);
    s->cur_phase = phase == XSTORE_DECODE ? XSTORE_DECODE : XSTORE_PROMPT;
    s->cur_index = index > 0 ? index : 0;
    s->cur_arm = s->cur_phase == XSTORE_DECODE ? XSTORE_ARM_DECODE
               : s->cur_index == 0             ? XSTORE_ARM_CHUNK0 : XSTORE_ARM_PROMPT;
    s->cur_rows = n_rows;
    s->in_chunk = 1;
    s->visit_layer = -1;
    s->visit_remaining = 0;
    xio_get_stats(s->io, &s->io0);
    s->chunk_t0 = timer_ms();
    pthread_mutex_unlock(&s->mu);
}

void xstore_chunk_end(xstore *s)
{
    if (!s->in_chunk) return;
    pthread_mutex_lock(&s->mu);
    if (s->n_wave) {   /* an error path that skipped end_layer */
        for (int i = 0; i < s->n_wave; i++) s->slots[s->wave[i]].pins--;
        s->n_wave = 0;
    }
    drop_predictions(s);
    if (!s->retain) {
        /* streaming mode: nothing survives the chunk */
        for (int v = 0; v < s->n_slots; v++)
            while (s->slots[v].state == S_LOADING) pthread_cond_wait(&s->cv, &s->mu);
        for (int v = 0; v < s->n_slots; v++)
            if (s->slots[v].key >= 0 && s->slots[v].pins == 0) release(s, v);
    }
    for (int v = 0; v < s->n_slots; v++) s->slots[v].protect = 0;
    xio_stats now;
    xio_get_stats(s->io, &now);
    s->cur.reads = now.ops - s->io0.ops;
    s->cur.bytes = now.bytes - s->io0.bytes;
    s->cur.host_ms = timer_ms() - s->chunk_t0;
    s->cur.chunks = 1;
    s->cur.rows = (uint64_t)s->cur_rows;
    add_counters(&s->phase[s->cur_phase], &s->cur);
    add_counters(&s->arm[s->cur_arm], &s->cur);
    if (s->n_chunks < s->max_chunks)
        s->chunks[s->n_chunks++] = (chunk_rec){ s->cur_phase, s->cur_index, s->cur_arm, s->cur };
    else s->chunks_dropped++;
    s->in_chunk = 0;
    s->visit_layer = -1;
    s->visit_remaining = 0;
    pthread_mutex_unlock(&s->mu);
}

/* ==== Warm fill ==== */

int xstore_warm(xstore *s, const int32_t *pairs, uint64_t n, err *e)
{
    for (uint64_t i = 0; i < n; i++) {
        const int32_t L = pairs[2 * i], x = pairs[2 * i + 1];
        if (L < 0 || L >= s->n_layer || x < 0 || x >= s->n_expert)
            return err_setf(e, ERR_RANGE, "warm fill: entry %" PRIu64 " (layer %d, expert %d) out of range", i, L, x);
    }
    pthread_mutex_lock(&s->mu);
    const double t0 = timer_ms();
    int rc = 0, n_loaded = 0, open_classes = 0;
    uint64_t bytes = 0;
    for (int c = 0; c < s->n_cls; c++) open_classes += s->cls[c].n_free > 0;
    for (uint64_t i = 0; i < n && open_classes > 0 && rc == 0; i++) {
        const int32_t L = pairs[2 * i], x = pairs[2 * i + 1];
        const int c = s->layer_cls[L];
        const int32_t key = L * s->n_expert + x;
        if (s->cls[c].n_free == 0 || s->map[key] >= 0) continue;
        const int v = take_slot(s, c, 0);
        rc = load(s, v, key, XIO_DEMAND, ORIGIN_WARM, e);
        if (rc) break;
        s->order[n_loaded++] = v;
        xread r[XLAYOUT_MAX_READS];
        const int nr = s->lay.reads(s->lay.ctx, L, x, r);
        for (int j = 0; j < nr; j++) bytes += r[j].bytes;
        if (s->cls[c].n_free == 0) open_classes--;
    }
    for (int i = 0; i < n_loaded; i++)
        while (s->slots[s->order[i]].state == S_LOADING) pthread_cond_wait(&s->cv, &s->mu);
    for (int i = 0; i < n_loaded && rc == 0; i++) {
        const slot *sl = &s->slots[s->order[i]];
        if (sl->state == S_FAILED) {
            rc = read_error(s, sl, e);
            err_prefix(e, "warm fill");
        }
    }
    /* best ranked most recently used: the last to go */
    for (int i = n_loaded - 1; i >= 0; i--) {
        const int v = s->order[i];
        if (s->slots[v].state == S_FAILED) release(s, v);
        else s->pol->use(s, v);
    }
    s->warmed = 1;
    s->warm_n += (uint64_t)n_loaded;
    s->warm_ranked = n;
    s->warm_bytes += bytes;
    s->warm_ms += timer_ms() - t0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ==== Residency, counters, facts ==== */

void xstore_resident_mask(xstore *s, int layer, uint8_t *mask)
{
    pthread_mutex_lock(&s->mu);
    for (int x = 0; x < s->n_expert; x++) {
        const int v = layer >= 0 && layer < s->n_layer ? s->map[layer * s->n_expert + x] : -1;
        mask[x] = v >= 0 && (s->slots[v].state == S_RESIDENT || s->slots[v].state == S_LOADING);
    }
    pthread_mutex_unlock(&s->mu);
}

void xstore_phase_counters(const xstore *s, int phase, xstore_counters *out)
{
    if (phase < 0 || phase >= XSTORE_N_PHASES) { memset(out, 0, sizeof *out); return; }
    *out = s->phase[phase];
}

const uint64_t *xstore_phase_layer_lookups(const xstore *s, int phase)
{
    return phase >= 0 && phase < XSTORE_N_PHASES ? s->layer_lookups[phase] : NULL;
}

void xstore_arm_counters(const xstore *s, int arm, xstore_counters *out)
{
    if (arm < 0 || arm >= XSTORE_N_ARMS) { memset(out, 0, sizeof *out); return; }
    *out = s->arm[arm];
}

int xstore_n_chunks(const xstore *s) { return s->n_chunks; }

int xstore_chunk_arm(const xstore *s, int i, int *index, int *arm)
{
    if (i < 0 || i >= s->n_chunks) return ERR_RANGE;
    if (index) *index = s->chunks[i].index;
    if (arm) *arm = s->chunks[i].arm;
    return 0;
}

int xstore_chunk(const xstore *s, int i, int *phase, xstore_counters *out)
{
    if (i < 0 || i >= s->n_chunks) return ERR_RANGE;
    if (phase) *phase = s->chunks[i].phase;
    *out = s->chunks[i].c;
    return 0;
}

uint64_t   xstore_arena_bytes(const xstore *s) { return s->arena_bytes; }

void xstore_arena_span(const xstore *s, void **base, uint64_t *bytes)
{
    const int mapped = s->arena != MAP_FAILED && s->arena != NULL;
    *base = mapped ? s->arena : NULL;
    *bytes = mapped ? s->arena_bytes : 0;
}
int        xstore_n_slots(const xstore *s)     { return s->n_slots; }
int        xstore_n_classes(const xstore *s)   { return s->n_cls; }

int xstore_n_filled(xstore *s)
{
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].state == S_RESIDENT;
    pthread_mutex_unlock(&s->mu);
    return n;
}
const xio *xstore_io(const xstore *s)          { return s->io; }

void xstore_set_fault(xstore *s, const xio_fault *f) { xio_fault_set(s->io, f); }

int xstore_check(xstore *s, err *e)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    const size_t K = (size_t)s->n_layer * (size_t)s->n_expert;
    int n_mapped = 0;
    for (size_t k = 0; k < K && !rc; k++) {
        const int v = s->map[k];
        if (v < 0) continue;
        n_mapped++;
        if (v >= s->n_slots || s->slots[v].key != (int32_t)k)
            rc = err_setf(e, ERR_INTERNAL, "map[%zu] = slot %d whose key is %d", k, v, v < s->n_slots ? s->slots[v].key : -2);
        else if (s->cls[s->slots[v].cls].slot_bytes != s->cls[s->layer_cls[k / (size_t)s->n_expert]].slot_bytes)
            rc = err_setf(e, ERR_INTERNAL, "key %zu in a slot of the wrong class", k);
    }
    int n_keyed = 0, n_free = 0;
    for (int v = 0; v < s->n_slots && !rc; v++) {
        const slot *sl = &s->slots[v];
        if (sl->pins) rc = err_setf(e, ERR_INTERNAL, "slot %d pinned outside a layer", v);
        else if (sl->key >= 0) {
            n_keyed++;
            if (s->map[sl->key] != v) rc = err_setf(e, ERR_INTERNAL, "slot %d key %d not mapped to it", v, sl->key);
            if (sl->state == S_EMPTY) rc = err_setf(e, ERR_INTERNAL, "slot %d mapped but empty", v);
        } else if (sl->state != S_EMPTY) {
            rc = err_setf(e, ERR_INTERNAL, "slot %d unmapped but in state %d", v, sl->state);
        }
    }
    for (int c = 0; c < s->n_cls && !rc; c++) {
        const sclass *cl = &s->cls[c];
        n_free += cl->n_free;
        for (int i = 0; i < cl->n_free && !rc; i++) {
            const int v = s->free_stack[cl->first + i];
            if (v < cl->first || v >= cl->first + cl->n || s->slots[v].key >= 0)
                rc = err_setf(e, ERR_INTERNAL, "free slot %d of class %d is not free", v, c);
        }
        int n_list = 0;
        for (int v = cl->head; v >= 0 && n_list <= cl->n; v = s->slots[v].next) n_list++;
        int n_cls_keyed = 0;
        for (int v = cl->first; v < cl->first + cl->n; v++) n_cls_keyed += s->slots[v].key >= 0;
        if (!rc && n_list != n_cls_keyed)
            rc = err_setf(e, ERR_INTERNAL, "class %d: %d slots listed, %d mapped", c, n_list, n_cls_keyed);
    }
    if (!rc && n_keyed != n_mapped) rc = err_setf(e, ERR_INTERNAL, "%d keyed slots, %d mapped keys", n_keyed, n_mapped);
    if (!rc && n_keyed + n_free != s->n_slots)
        rc = err_setf(e, ERR_INTERNAL, "%d keyed + %d free != %d slots", n_keyed, n_free, s->n_slots);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ==== Reports ==== */

int xstore_init_line(const xstore *s, char *buf, size_t cap)
{
    char a[32];
    size_t o = 0;
#define PUT(...) do { int n_ = snprintf(buf + o, o < cap ? cap - o : 0, __VA_ARGS__); if (n_ > 0) o += (size_t)n_; } while (0)
    if (s->retain)
        PUT("expert arena %s, %d slots in %d size class%s, ", fmt_bytes(a, sizeof a, (double)s->arena_bytes),
            s->n_slots, s->n_cls, s->n_cls == 1 ? "" : "es");
    else
        PUT("expert arena 0 (stream every lookup: %d buffer slots, %s, in %d size class%s), ", s->n_slots,
            fmt_bytes(a, sizeof a, (double)s->arena_bytes), s->n_cls, s->n_cls == 1 ? "" : "es");
    if (s->warmed) {
        const double sec = s->warm_ms / 1e3;
        PUT("%" PRIu64 " experts read from the profile's top (%" PRIu64 " ranked) in %.1f s (%.2f GB/s); ",
            s->warm_n, s->warm_ranked, sec, sec > 0 ? (double)s->warm_bytes / 1e9 / sec : 0.0);
    } else {
        PUT("no warm fill; ");
    }
    const int threads = xio_mode(s->io) == XIO_URING ? 1 : xio_depth(s->io);
    PUT("%d I/O thread%s, ", threads, threads == 1 ? "" : "s");
    if (s->o.read_ahead > 0) PUT("read-ahead top %d", s->o.read_ahead);
    else PUT("read-ahead off");
    PUT("; evict %s; %s; from %s", s->pol->name, xio_describe(s->io), s->lay.desc ? s->lay.desc : "?");
#undef PUT
    return (int)o;
}

static double frac(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

void xstore_trace(const xstore *s, FILE *out)
{
    for (int ph = 0; ph < XSTORE_N_PHASES; ph++) {
        const xstore_counters *c = &s->phase[ph];
        if (c->chunks == 0) continue;
        const double nc = (double)c->chunks;
        const int prompt = ph == XSTORE_PROMPT;
        fprintf(out, "expert stream %s %" PRIu64 " %s: %" PRIu64 " distinct lookups (%.1f per layer), in the arena "
                "%.4f, streamed ahead %.4f, missed %.4f; %" PRIu64 " streamed in (%.1f MB/%s, %" PRIu64 " reads); "
                "host %.1f ms per %s, of it waiting %.1f ms; %.3f GB/s effective",
                prompt ? "prompts" : "decode", c->chunks, prompt ? "chunks" : "tokens", c->lookups,
                (double)c->lookups / nc / s->n_layer, frac(c->hits, c->lookups), frac(c->ahead, c->lookups),
                frac(c->misses, c->lookups), c->loads, (double)c->bytes / 1e6 / nc, prompt ? "chunk" : "token",
                c->reads, c->host_ms / nc, prompt ? "chunk" : "token", c->wait_ms / nc,
                c->host_ms > 0 ? (double)c->bytes / 1e6 / c->host_ms : 0.0);
        if (c->predicted)
            fprintf(out, ", read-ahead precision %.4f coverage %.4f", frac(c->predicted_used, c->predicted),
                    frac(c->predicted_used, c->lookups_predicted));
        if (c->waves) fprintf(out, ", %" PRIu64 " extra waves", c->waves);
        if (c->io_errors) fprintf(out, ", %" PRIu64 " failed reads", c->io_errors);
        fputc('\n', out);
    }
}

static void json_counters(FILE *f, const xstore_counters *c, int n_layer)
{
    const double nc = c->chunks ? (double)c->chunks : 1.0;
    fprintf(f, "\"chunks\": %" PRIu64 ", \"rows\": %" PRIu64 ", \"lookups\": %" PRIu64 ", \"lookups_per_layer\": %.3f, "
            "\"hits\": %" PRIu64 ", \"ahead\": %" PRIu64 ", \"misses\": %" PRIu64 ", "
            "\"hit_fraction\": %.6f, \"ahead_fraction\": %.6f, \"miss_fraction\": %.6f, "
            "\"streamed_in\": %" PRIu64 ", \"streamed_in_prefetch\": %" PRIu64 ", \"submissions\": %" PRIu64 ", "
            "\"reads\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"predicted\": %" PRIu64 ", \"predicted_used\": %" PRIu64
            ", \"lookups_predicted\": %" PRIu64 ", \"prefetch_precision\": %.6f, \"prefetch_coverage\": %.6f, "
            "\"prefetch_wasted\": %" PRIu64 ", \"extra_waves\": %" PRIu64 ", \"io_errors\": %" PRIu64 ", "
            "\"host_ms\": %.3f, \"wait_ms\": %.3f, \"effective_gbps\": %.6f",
            c->chunks, c->rows, c->lookups, (double)c->lookups / nc / n_layer, c->hits, c->ahead, c->misses,
            frac(c->hits, c->lookups), frac(c->ahead, c->lookups), frac(c->misses, c->lookups), c->loads,
            c->loads_prefetch, c->submissions, c->reads, c->bytes, c->predicted, c->predicted_used,
            c->lookups_predicted, frac(c->predicted_used, c->predicted), frac(c->predicted_used, c->lookups_predicted),
            c->prefetch_wasted, c->waves, c->io_errors, c->host_ms, c->wait_ms,
            c->host_ms > 0 ? (double)c->bytes / 1e6 / c->host_ms : 0.0);
}

void xstore_report_json(const xstore *s, FILE *f, const char *in)
{
    if (!in) in = "";
    fprintf(f, "{\n%s  \"config\": {\"arena_bytes\": %" PRIu64 ", \"arena_requested\": %" PRIu64 ", \"retain\": %s, "
            "\"slots\": %d, \"size_classes\": [", in, s->arena_bytes, s->o.arena_bytes, s->retain ? "true" : "false",
            s->n_slots);
    for (int c = 0; c < s->n_cls; c++)
        fprintf(f, "%s{\"slot_bytes\": %" PRIu64 ", \"slots\": %d, \"layers\": %d}", c ? ", " : "",
                s->cls[c].slot_bytes, s->cls[c].n, s->cls[c].n_layers);
    const int um = xio_mode(s->io) == XIO_URING;
    fprintf(f, "], \"evict\": \"%s\", \"io_mode\": \"%s\", \"io_threads\": %d, \"io_depth\": %d, \"direct\": %s, "
            "\"registered_buffers\": %s, \"read_ahead\": %d, \"io\": \"%s\", \"source\": \"",
            s->pol->name, um ? "io_uring" : "pread", um ? 1 : xio_depth(s->io), xio_depth(s->io),
            s->lay.direct ? "true" : "false", xio_registered(s->io) ? "true" : "false", s->o.read_ahead,
            xio_describe(s->io));
    for (const char *p = s->lay.desc ? s->lay.desc : ""; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        if ((unsigned char)*p >= 0x20) fputc(*p, f);
    }
    fprintf(f, "\"},\n%s  \"warm\": {\"experts\": %" PRIu64 ", \"ranked\": %" PRIu64 ", \"bytes\": %" PRIu64
            ", \"ms\": %.3f},\n%s  \"phases\": {", in, s->warm_n, s->warm_ranked, s->warm_bytes, s->warm_ms, in);
    for (int ph = 0; ph < XSTORE_N_PHASES; ph++) {
        fprintf(f, "%s\n%s    \"%s\": {", ph ? "," : "", in, ph == XSTORE_PROMPT ? "prompt" : "decode");
        json_counters(f, &s->phase[ph], s->n_layer);
        fprintf(f, ", \"layer_lookups\": [");
        for (int l = 0; l < s->n_layer; l++) fprintf(f, "%s%" PRIu64, l ? ", " : "", s->layer_lookups[ph][l]);
        fprintf(f, "]}");
    }
    fprintf(f, "\n%s  },\n%s  \"arms\": {", in, in);
    for (int a = 0; a < XSTORE_N_ARMS; a++) {
        fprintf(f, "%s\n%s    \"%s\": {", a ? "," : "", in, xstore_arm_name(a));
        json_counters(f, &s->arm[a], s->n_layer);
        fputc('}', f);
    }
    fprintf(f, "\n%s  },\n%s  \"chunks_dropped\": %" PRIu64 ",\n%s  \"chunks\": [", in, in, s->chunks_dropped, in);
    for (int i = 0; i < s->n_chunks; i++) {
        fprintf(f, "%s\n%s    {\"phase\": \"%s\", \"index\": %d, \"arm\": \"%s\", ", i ? "," : "", in,
                s->chunks[i].phase == XSTORE_PROMPT ? "prompt" : "decode", s->chunks[i].index,
                xstore_arm_name(s->chunks[i].arm));
        json_counters(f, &s->chunks[i].c, s->n_layer);
        fputc('}', f);
    }
    fprintf(f, "%s%s  ]\n%s}", s->n_chunks ? "\n" : "", s->n_chunks ? in : "", in);
}

/* ==== The xlayout adapter ==== */

static uint64_t xl_slot_bytes(const void *ctx, int layer) { return xlayout_slot_bytes(ctx, layer); }
static int xl_reads(const void *ctx, int layer, int expert, xread r[XLAYOUT_MAX_READS])
{
    return xlayout_reads(ctx, layer, expert, r);
}
static uint64_t xl_part_off(const void *ctx, int layer, int expert, int which)
{
    return xlayout_part_off(ctx, layer, expert, which);
}

void xstore_layout_from_xlayout(xstore_layout *out, const xlayout *x)
{
    *out = (xstore_layout){
        .n_layer = xlayout_n_layer(x), .n_expert = xlayout_n_expert(x), .fd = xlayout_fd(x),
        .direct = xlayout_direct(x), .desc = xlayout_path(x), .ctx = x,
        .slot_bytes = xl_slot_bytes, .reads = xl_reads, .part_off = xl_part_off,
    };
}

/* xio: see xio.h.
 *
 * Shared core: a fixed table of request records, a free list and two FIFO
 * queues (demand, prefetch) threaded through the records by index, all
 * under one mutex. The backends differ only in who performs the read
 * operations: pread workers, or the ring thread submitting SQEs. The same
 * op_finish() decides after every operation whether the request is done,
 * failed or needs another operation (short read, EAGAIN), so both backends
 * have identical semantics, faults included.
 *
 * Injected EIO and EOF in the io_uring backend travel as a NOP SQE whose
 * result is replaced: they complete in ring order like a real read would. */
#include "expert/xio.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { RQ_FREE = 0, RQ_QUEUED = 1, RQ_INFLIGHT = 2 };
enum { MAX_OP_BYTES = 1 << 30, MAX_RETRIES = 16 };
#define EFD_TAG UINT64_MAX

typedef struct rq {
    uint64_t tag;
    uint64_t file_off, bytes, need, done;
    uint8_t *dst;
    uint64_t op_len;      /* bytes asked by the operation in flight */
    uint64_t fail_off;
    int      status;
    int      prio;
    int      state;       /* RQ_* */
    int      n_ops, retries;
    int      late_ms;     /* injected completion delay */
    int      fake;        /* uring: the op in flight is an injected result */
    int      fake_res;
    int      prev, next;  /* queue links (next also links the free list) */
} rq;

typedef struct rq_list { int head, tail; } rq_list;

struct xio {
    xio_opts        o;
    int             mode;
    pthread_mutex_t mu;
    pthread_cond_t  cv;          /* pread: work or stop */
    rq             *rq;
    int             n_rq;
    int             free_head;
    rq_list         q[2];        /* [XIO_DEMAND], [XIO_PREFETCH] */
    int             stop;
    pthread_t      *threads;
    int             n_started;
    /* io_uring */
    struct io_uring ring;
    int             ring_ok;
    int             efd;
    uint64_t        efd_buf;
    int             registered;
    int             inflight;
    int             depth;
    struct iovec   *bufs;        /* owned copy of o.bufs */
    int             n_bufs;
    /* faults and stats (under mu) */
    xio_fault       fault;
    uint64_t        fault_ops;
    xio_stats       st;
    char            desc[200];
};

/* ==== Queues (under mu) ==== */

static void list_push(xio *x, rq_list *l, int i)
{
    x->rq[i].next = -1;
    x->rq[i].prev = l->tail;
    if (l->tail >= 0) x->rq[l->tail].next = i; else l->head = i;
    l->tail = i;
}

static void list_unlink(xio *x, rq_list *l, int i)
{
    rq *r = &x->rq[i];
    if (r->prev >= 0) x->rq[r->prev].next = r->next; else l->head = r->next;
    if (r->next >= 0) x->rq[r->next].prev = r->prev; else l->tail = r->prev;
    r->prev = r->next = -1;
}

/* Next request to start: demand first. -1 when both queues are empty. */
static int pop_next(xio *x)
{
    for (int p = XIO_DEMAND; p <= XIO_PREFETCH; p++) {
        int i = x->q[p].head;
        if (i >= 0) {
            list_unlink(x, &x->q[p], i);
            x->rq[i].state = RQ_INFLIGHT;
            return i;
        }
    }
    return -1;
}

static void free_rq(xio *x, int i)
{
    x->rq[i].state = RQ_FREE;
    x->rq[i].next = x->free_head;
    x->free_head = i;
}

/* ==== Faults (under mu) ==== */

/* The fault kind for the next operation of a request of priority prio. */
static int fault_for_op(xio *x, int prio)
{
    const xio_fault *f = &x->fault;
    if (f->kind == XIO_FAULT_NONE) return 0;
    if ((f->only == 1 && prio != XIO_DEMAND) || (f->only == 2 && prio != XIO_PREFETCH)) return 0;
    const uint64_t n = ++x->fault_ops, nth = f->nth ? f->nth : 1, cnt = f->count ? f->count : 1;
    if (n < nth) return 0;
    const uint64_t d = n - nth;
    if (d < cnt || (f->every && d % f->every == 0)) {
        x->st.faults++;
        return f->kind;
    }
    return 0;
}

/* A shorter length for an injected short read; O_DIRECT keeps 4096 multiples. */
static uint64_t short_len(uint64_t len, int direct)
{
    if (direct) {
        uint64_t h = (len / 2) & ~(uint64_t)4095;
        return h >= 4096 ? h : len;
    }
    return len > 1 ? len / 2 : len;
}

/* ==== Operation results (under mu) ==== */

/* Account one finished operation of request r that returned res (bytes, or
 * a negative errno) for `asked` bytes. Returns 1 when the request is
 * finished (r->status set), 0 when it needs another operation. */
static int op_finish(xio *x, rq *r, int64_t res, uint64_t asked)
{
    r->n_ops++;
    x->st.ops++;
    if (res < 0) {
        if ((res == -EAGAIN || res == -EINTR) && r->retries++ < MAX_RETRIES) return 0;
        r->status = (int)res;
        r->fail_off = r->file_off + r->done;
        x->st.errors++;
        return 1;
    }
    if ((uint64_t)res < asked) x->st.short_ops++;
    if ((uint64_t)res > asked) res = (int64_t)asked;   /* cannot happen; never overrun dst */
    r->done += (uint64_t)res;
    x->st.bytes += (uint64_t)res;
    if (r->done >= r->bytes) return 1;
    if (res == 0) {
        /* end of file: complete when what the caller needs has arrived (an
         * O_DIRECT range rounded up past the end of the file) */
        if (r->done >= r->need) return 1;
        r->status = -ENODATA;
        r->fail_off = r->file_off + r->done;
        x->st.errors++;
        return 1;
    }
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Hand a finished request to the caller and free its record. Called
 * without mu; the record is ours (RQ_INFLIGHT) until freed here. */
static void deliver(xio *x, int i)
{
    rq *r = &x->rq[i];
    if (r->late_ms > 0) sleep_ms(r->late_ms);
    xio_result res = {
        .status = r->status, .file_off = r->file_off, .bytes = r->bytes, .done = r->done,
        .fail_off = r->fail_off, .n_ops = r->n_ops, .prio = r->prio,
    };
    x->o.done(x->o.done_ctx, r->tag, &res);
    pthread_mutex_lock(&x->mu);
    free_rq(x, i);
    pthread_mutex_unlock(&x->mu);
}

/* ==== pread backend ==== */

static void *pread_main(void *p)
{
    xio *x = p;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->stop && x->q[0].head < 0 && x->q[1].head < 0) pthread_cond_wait(&x->cv, &x->mu);
        if (x->stop) break;
        const int i = pop_next(x);
        rq *r = &x->rq[i];
        for (;;) {
            uint64_t want = r->bytes - r->done;
            if (want > MAX_OP_BYTES) want = MAX_OP_BYTES;
            const int f = fault_for_op(x, r->prio);
            if (f == XIO_FAULT_LATE) r->late_ms = x->fault.late_ms;
            pthread_mutex_unlock(&x->mu);
            int64_t res;
            if (f == XIO_FAULT_EIO) res = -EIO;
            else if (f == XIO_FAULT_EOF) res = 0;
            else {
                const uint64_t len = f == XIO_FAULT_SHORT ? short_len(want, x->o.direct) : want;
                ssize_t n = pread(x->o.fd, r->dst + r->done, (size_t)len, (off_t)(r->file_off + r->done));
                res = n < 0 ? -(int64_t)errno : (int64_t)n;
            }
            pthread_mutex_lock(&x->mu);
            if (op_finish(x, r, res, want)) break;
        }
        pthread_mutex_unlock(&x->mu);
        deliver(x, i);
        pthread_mutex_lock(&x->mu);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* ==== io_uring backend ==== */

/* Index of the registered buffer holding [p, p + n), or -1. */
static int fixed_index(const xio *x, const uint8_t *p, uint64_t n)
{
    if (!x->registered) return -1;
    for (int b = 0; b < x->n_bufs; b++) {
        const uint8_t *base = x->bufs[b].iov_base;
        if (p >= base && p + n <= base + x->bufs[b].iov_len) return b;
    }
    return -1;
}

static struct io_uring_sqe *get_sqe(xio *x);

static void arm_eventfd(xio *x)
{
    struct io_uring_sqe *sqe = get_sqe(x);
    if (!sqe) return;   /* cannot happen (see get_sqe); submissions then wake it */
    io_uring_prep_read(sqe, x->efd, &x->efd_buf, sizeof x->efd_buf, 0);
    io_uring_sqe_set_data64(sqe, EFD_TAG);
}

/* An SQE; the ring has room for depth + 2 entries and we never hold more
 * than depth + 1, so after a submit there is always one. NULL only if the
 * kernel refuses to take entries (then the caller fails the request). */
static struct io_uring_sqe *get_sqe(xio *x)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
    for (int tries = 0; !sqe && tries < 100; tries++) {
        io_uring_submit(&x->ring);
        sqe = io_uring_get_sqe(&x->ring);
    }
    return sqe;
}

/* Queue the next operation of request i (under mu). Returns 0, or -1 when
 * no SQE could be had (the request then fails with -EBUSY). */
static int start_op(xio *x, int i)
{
    rq *r = &x->rq[i];
    uint64_t want = r->bytes - r->done;
    if (want > MAX_OP_BYTES) want = MAX_OP_BYTES;
    const int f = fault_for_op(x, r->prio);
    if (f == XIO_FAULT_LATE) r->late_ms = x->fault.late_ms;
    struct io_uring_sqe *sqe = get_sqe(x);
    r->op_len = want;
    r->fake = 0;
    if (!sqe) return -1;
    if (f == XIO_FAULT_EIO || f == XIO_FAULT_EOF) {
        r->fake = 1;
        r->fake_res = f == XIO_FAULT_EIO ? -EIO : 0;
        io_uring_prep_nop(sqe);
    } else {
        const uint64_t len = f == XIO_FAULT_SHORT ? short_len(want, x->o.direct) : want;
        uint8_t *dst = r->dst + r->done;
        const uint64_t off = r->file_off + r->done;
        const int b = fixed_index(x, dst, len);
        if (b >= 0) io_uring_prep_read_fixed(sqe, x->o.fd, dst, (unsigned)len, off, b);
        else io_uring_prep_read(sqe, x->o.fd, dst, (unsigned)len, off);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)i);
    return 0;
}

/* Start request i's next operation, or fail it when that is impossible
 * (under mu; returns with mu held). */
static void start_or_fail(xio *x, int i)
{
    if (start_op(x, i) == 0) return;
    op_finish(x, &x->rq[i], -EBUSY, x->rq[i].op_len);
    x->inflight--;
    pthread_mutex_unlock(&x->mu);
    deliver(x, i);
    pthread_mutex_lock(&x->mu);
}

static void *ring_main(void *p)
{
    xio *x = p;
    pthread_mutex_lock(&x->mu);
    arm_eventfd(x);
    for (;;) {
        while (!x->stop && x->inflight < x->depth) {
            const int i = pop_next(x);
            if (i < 0) break;
            x->inflight++;
            start_or_fail(x, i);
        }
        if (x->stop && x->inflight == 0) break;
        pthread_mutex_unlock(&x->mu);

        io_uring_submit(&x->ring);
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&x->ring, &cqe);
        int rearm = 0;
        while (rc == 0 && cqe) {
            const uint64_t ud = io_uring_cqe_get_data64(cqe);
            const int res = cqe->res;
            io_uring_cqe_seen(&x->ring, cqe);
            if (ud == EFD_TAG) {
                rearm = 1;
            } else {
                const int i = (int)ud;
                rq *r = &x->rq[i];
                pthread_mutex_lock(&x->mu);
                const int64_t got = r->fake ? r->fake_res : res;
                if (!op_finish(x, r, got, r->op_len)) {
                    start_or_fail(x, i);
                    pthread_mutex_unlock(&x->mu);
                } else {
                    x->inflight--;
                    pthread_mutex_unlock(&x->mu);
                    deliver(x, i);
                }
            }
            if (io_uring_peek_cqe(&x->ring, &cqe) != 0) cqe = NULL;
        }
        pthread_mutex_lock(&x->mu);
        if (rearm && !x->stop) arm_eventfd(x);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* Set up the ring; on failure leave ring_ok 0 and say why in *why. */
static int ring_setup(xio *x, char *why, size_t cap)
{
    unsigned entries = 8;
    while (entries < (unsigned)(2 * x->depth + 4)) entries *= 2;
    int rc = io_uring_queue_init(entries, &x->ring, 0);
    if (rc < 0) { snprintf(why, cap, "io_uring_queue_init: %s", strerror(-rc)); return -1; }
    x->ring_ok = 1;
    x->efd = eventfd(0, EFD_CLOEXEC);
    if (x->efd < 0) { snprintf(why, cap, "eventfd: %s", strerror(errno)); return -1; }
    if (x->n_bufs > 0) {
        rc = io_uring_register_buffers(&x->ring, x->bufs, (unsigned)x->n_bufs);
        if (rc == 0) x->registered = 1;
        else snprintf(why, cap, "%s", strerror(-rc));
    }
    return 0;
}

/* ==== Public ==== */

int xio_open(xio **out, const xio_opts *o, err *e)
{
    *out = NULL;
    if (!o || o->fd < 0 || !o->done || o->max_requests <= 0)
        return err_setf(e, ERR_USAGE, "xio: bad options");
    if (o->mode < XIO_AUTO || o->mode > XIO_PREAD) return err_setf(e, ERR_USAGE, "xio: unknown mode %d", o->mode);
    xio *x = calloc(1, sizeof *x);
    if (!x) return err_setf(e, ERR_NOMEM, "out of memory");
    x->o = *o;
    x->efd = -1;
    x->depth = o->depth > 0 ? o->depth : 4;
    if (x->depth > 256) x->depth = 256;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->n_rq = o->max_requests;
    x->rq = calloc((size_t)x->n_rq, sizeof *x->rq);
    if (o->n_bufs > 0) {
        x->bufs = calloc((size_t)o->n_bufs, sizeof *x->bufs);
        if (x->bufs) { memcpy(x->bufs, o->bufs, sizeof *x->bufs * (size_t)o->n_bufs); x->n_bufs = o->n_bufs; }
    }
    if (!x->rq || (o->n_bufs > 0 && !x->bufs)) { xio_close(x); return err_setf(e, ERR_NOMEM, "out of memory"); }
    x->free_head = -1;
    for (int i = x->n_rq - 1; i >= 0; i--) free_rq(x, i);
    x->q[0] = x->q[1] = (rq_list){ -1, -1 };

    char why[128] = "";
    int mode = o->mode;
    if (mode != XIO_PREAD) {
        if (ring_setup(x, why, sizeof why) != 0) {
            if (mode == XIO_URING) {
                err_setf(e, ERR_UNSUPPORTED, "io_uring is not available: %s", why);
                xio_close(x);
                return ERR_UNSUPPORTED;
            }
            if (x->ring_ok) { io_uring_queue_exit(&x->ring); x->ring_ok = 0; }
            if (x->efd >= 0) { close(x->efd); x->efd = -1; }
            mode = XIO_PREAD;
        } else {
            mode = XIO_URING;
        }
    }
    x->mode = mode;
    const int n_thr = mode == XIO_URING ? 1 : (o->n_threads > 0 ? o->n_threads : 4);
    x->threads = calloc((size_t)n_thr, sizeof *x->threads);
    if (!x->threads) { xio_close(x); return err_setf(e, ERR_NOMEM, "out of memory"); }
    for (int t = 0; t < n_thr; t++) {
        if (pthread_create(&x->threads[t], NULL, mode == XIO_URING ? ring_main : pread_main, x) != 0) {
            xio_close(x);
            return err_setf(e, ERR_NOMEM, "xio: cannot start I/O thread %d of %d", t + 1, n_thr);
        }
        x->n_started++;
    }
    const char *how = o->direct ? "O_DIRECT" : "buffered";
    if (mode == XIO_URING)
        snprintf(x->desc, sizeof x->desc, "io_uring, queue depth %d, %s%s%s%s", x->depth, how,
                 x->registered ? ", registered buffers" : x->n_bufs ? ", buffers not registered (" : "",
                 !x->registered && x->n_bufs ? why : "", !x->registered && x->n_bufs ? ")" : "");
    else
        snprintf(x->desc, sizeof x->desc, "pread, %d threads, %s%s%s%s", n_thr, how,
                 why[0] ? " (io_uring: " : "", why, why[0] ? ")" : "");
    *out = x;
    return 0;
}

void xio_close(xio *x)
{
    if (!x) return;
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    /* drop what has not started */
    for (int p = 0; p < 2; p++)
        while (x->q[p].head >= 0) {
            const int i = x->q[p].head;
            list_unlink(x, &x->q[p], i);
            free_rq(x, i);
        }
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (x->efd >= 0) {
        uint64_t one = 1;
        if (write(x->efd, &one, sizeof one) < 0) { /* the ring thread also wakes on its reads */ }
    }
    for (int t = 0; t < x->n_started; t++) pthread_join(x->threads[t], NULL);
    if (x->ring_ok) io_uring_queue_exit(&x->ring);
    if (x->efd >= 0) close(x->efd);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x->threads);
    free(x->bufs);
    free(x->rq);
    free(x);
}

int xio_submit(xio *x, uint64_t file_off, uint64_t bytes, uint64_t need, void *dst, int prio, uint64_t tag,
               int *handle, err *e)
{
    if (bytes == 0) return err_setf(e, ERR_USAGE, "xio: empty read");
    if (need == 0 || need > bytes) need = bytes;
    if (prio != XIO_DEMAND && prio != XIO_PREFETCH) prio = XIO_PREFETCH;
    pthread_mutex_lock(&x->mu);
    const int i = x->free_head;
    if (i < 0 || x->stop) {
        pthread_mutex_unlock(&x->mu);
        return err_setf(e, ERR_RANGE, "xio: %d requests outstanding (the most it was sized for)", x->n_rq);
    }
    x->free_head = x->rq[i].next;
    x->rq[i] = (rq){
        .tag = tag, .file_off = file_off, .bytes = bytes, .need = need, .dst = dst, .prio = prio,
        .state = RQ_QUEUED, .prev = -1, .next = -1,
    };
    list_push(x, &x->q[prio], i);
    x->st.submitted++;
    if (prio == XIO_PREFETCH) x->st.submitted_prefetch++;
    if (handle) *handle = i;
    if (x->mode == XIO_PREAD) pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    if (x->mode == XIO_URING) {
        uint64_t one = 1;
        if (write(x->efd, &one, sizeof one) < 0) { /* counter saturated: the ring is awake anyway */ }
    }
    return 0;
}

void xio_promote(xio *x, int handle)
{
    if (handle < 0 || handle >= x->n_rq) return;
    pthread_mutex_lock(&x->mu);
    rq *r = &x->rq[handle];
    if (r->state == RQ_QUEUED && r->prio == XIO_PREFETCH) {
        list_unlink(x, &x->q[XIO_PREFETCH], handle);
        r->prio = XIO_DEMAND;
        list_push(x, &x->q[XIO_DEMAND], handle);
        x->st.promoted++;
    }
    pthread_mutex_unlock(&x->mu);
}

void xio_get_stats(xio *x, xio_stats *out)
{
    pthread_mutex_lock(&x->mu);
    *out = x->st;
    pthread_mutex_unlock(&x->mu);
}

int xio_mode(const xio *x)       { return x->mode; }
int xio_registered(const xio *x) { return x->registered; }
int xio_depth(const xio *x)      { return x->mode == XIO_URING ? x->depth : x->n_started; }
const char *xio_describe(const xio *x) { return x->desc; }

void xio_fault_set(xio *x, const xio_fault *f)
{
    pthread_mutex_lock(&x->mu);
    if (f) x->fault = *f; else memset(&x->fault, 0, sizeof x->fault);
    x->fault_ops = 0;
    pthread_mutex_unlock(&x->mu);
}

int xio_fault_parse(const char *spec, xio_fault *out, err *e)
{
    memset(out, 0, sizeof *out);
    static const struct { const char *name; int kind; } kinds[] = {
        { "eio", XIO_FAULT_EIO }, { "short", XIO_FAULT_SHORT }, { "eof", XIO_FAULT_EOF }, { "late", XIO_FAULT_LATE },
    };
    const char *p = spec;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t n = strlen(kinds[k].name);
        if (!strncmp(p, kinds[k].name, n) && p[n] == ':') { out->kind = kinds[k].kind; p += n + 1; break; }
    }
    if (!out->kind) goto bad;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || v == 0) goto bad;
    out->nth = v;
    p = end;
    if (out->kind == XIO_FAULT_LATE) {
        if (*p != ':') goto bad;
        v = strtoull(p + 1, &end, 10);
        if (end == p + 1 || v > 600000) goto bad;
        out->late_ms = (int)v;
        p = end;
    }
    while (*p == ',') {
        p++;
        if (!strncmp(p, "count=", 6)) { v = strtoull(p + 6, &end, 10); if (end == p + 6) goto bad; out->count = v; p = end; }
        else if (!strncmp(p, "every=", 6)) { v = strtoull(p + 6, &end, 10); if (end == p + 6) goto bad; out->every = v; p = end; }
        else if (!strncmp(p, "demand", 6)) { out->only = 1; p += 6; }
        else if (!strncmp(p, "prefetch", 8)) { out->only = 2; p += 8; }
        else goto bad;
    }
    if (*p) goto bad;
    return 0;
bad:
    memset(out, 0, sizeof *out);
    return err_setf(e, ERR_USAGE, "bad fault spec '%s' (eio:N, short:N, eof:N or late:N:MS, then ,count=C ,every=E "
                    ",demand ,prefetch)",
                    spec);
}

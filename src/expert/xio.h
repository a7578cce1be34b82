/* xio: the expert store's I/O engine. Reads byte ranges of one file into
 * caller-owned memory, asynchronously, with two priorities.
 *
 * Backends (xio_opts.mode):
 *   XIO_URING  one io_uring driven by one ring thread: it keeps at most
 *              `depth` reads in flight, uses READ_FIXED when the destination
 *              lies in a buffer it managed to register (xio_opts.bufs), and
 *              sleeps in io_uring_wait_cqe (an armed read on an eventfd wakes
 *              it when a request arrives), so an idle engine costs no CPU.
 *   XIO_PREAD  `n_threads` worker threads doing blocking pread(2).
 *   XIO_AUTO   io_uring when the kernel gives us a ring, else pread.
 * Both work with O_DIRECT fds (the caller then passes 4096-aligned offsets,
 * lengths and buffers: xio does not check, the kernel does) and plain ones.
 *
 * Ordering: demand requests are started before any queued prefetch; within
 * a priority, first come first served. A prefetch that becomes a demand is
 * moved to the demand queue by xio_promote (if it has not started yet; a
 * started read simply continues: it is never issued twice).
 *
 * Short reads are continued from where they stopped until the range is
 * complete. A read that hits end of file (an operation returns 0) is
 * complete when at least `need` bytes arrived (an O_DIRECT range rounded up
 * past the end of the file; xlayout.h's EOF rule), otherwise it fails with
 * -ENODATA. Errors are negative errno values in the completion;
 * -EAGAIN/-EINTR are retried (a bounded number of times).
 *
 * Completions: `done(done_ctx, tag, result)` is called exactly once per
 * submitted request, from an I/O thread, never while xio holds its own lock
 * (so the callback may take the caller's lock, and the caller may call
 * xio_submit/xio_promote while holding that lock: the lock order is always
 * caller -> xio). Requests still queued when xio_close starts are dropped
 * without a callback; reads in flight are waited for (they write into the
 * caller's memory) and get their callback.
 *
 * Memory: the request table (max_requests records) is allocated at open;
 * submitting allocates nothing. Submitting more than max_requests
 * outstanding requests is ERR_RANGE (a sizing bug in the caller).
 *
 * Fault injection (tests): xio_fault_set arms a numbered failure on read
 * operations (every pread / every io_uring read SQE counts, retries
 * included), after sqlite's sqlite3FaultSim: fail with EIO, return short
 * (the engine must continue the read), return end-of-file, or complete late.
 * It is an explicit API call on one handle; nothing reads the environment.
 *
 * Thread-safety: xio_submit, xio_promote, xio_stats, xio_fault_set may be
 * called from any thread; xio_open/xio_close from one. */
#ifndef STRATA_XIO_H
#define STRATA_XIO_H

#include <stdint.h>
#include <sys/uio.h>

#include "util/err.h"

typedef struct xio xio;

enum xio_mode { XIO_AUTO = 0, XIO_URING = 1, XIO_PREAD = 2 };
enum xio_prio { XIO_DEMAND = 0, XIO_PREFETCH = 1 };

/* What a request came to. */
typedef struct xio_result {
    int      status;      /* 0, or a negative errno (-EIO, -ENODATA: EOF before file_size) */
    uint64_t file_off;    /* the request's range */
    uint64_t bytes;
    uint64_t done;        /* bytes read (>= need when status is 0) */
    uint64_t fail_off;    /* file offset of the operation that failed (status != 0) */
    int      n_ops;       /* read operations it took (1 + continuations + retries) */
    int      prio;        /* priority it ended with (XIO_DEMAND after a promotion) */
} xio_result;

/* Called once per request from an I/O thread; see the header comment. */
typedef void (*xio_done_fn)(void *ctx, uint64_t tag, const xio_result *r);

typedef struct xio_opts {
    int          mode;        /* enum xio_mode */
    int          fd;          /* borrowed, open for reading; outlives the xio */
    int          direct;      /* fd has O_DIRECT (injected short reads stay 4096-aligned) */
    int          n_threads;   /* pread workers; <= 0: 4 */
    int          depth;       /* io_uring reads in flight; <= 0: 4 */
    int          max_requests;/* outstanding (queued + in flight) requests; > 0 */
    const struct iovec *bufs; /* io_uring: destinations to register (may be NULL) */
    int          n_bufs;      /* each at most 1 GiB (the kernel's limit) */
    xio_done_fn  done;
    void        *done_ctx;
} xio_opts;

/* Start the engine (threads, ring, registration). *out owned by the caller. */
int  xio_open(xio **out, const xio_opts *o, err *e);
/* Drop queued requests, wait for reads in flight, stop the threads. NULL ok. */
void xio_close(xio *x);

/* Queue a read of [file_off, file_off + bytes) into dst, of which the
 * first `need` bytes must arrive (0: all). *handle (may be NULL)
 * identifies the request for xio_promote until its callback returns.
 * ERR_RANGE when max_requests are outstanding, ERR_USAGE for bytes == 0. */
int  xio_submit(xio *x, uint64_t file_off, uint64_t bytes, uint64_t need, void *dst, int prio, uint64_t tag,
                int *handle, err *e);
/* Make a queued prefetch a demand (no-op if it already started, or is a
 * demand). The handle must be one whose callback has not returned yet. */
void xio_promote(xio *x, int handle);

typedef struct xio_stats {
    uint64_t submitted, submitted_prefetch;  /* requests */
    uint64_t promoted;                       /* prefetches turned into demands while queued */
    uint64_t ops;                            /* read operations issued (incl. continuations) */
    uint64_t short_ops;                      /* operations that returned fewer bytes than asked */
    uint64_t bytes;                          /* bytes read */
    uint64_t errors;                         /* requests completed with status != 0 */
    uint64_t faults;                         /* injected faults */
} xio_stats;
void xio_get_stats(xio *x, xio_stats *out);

int xio_mode(const xio *x);          /* XIO_URING or XIO_PREAD (after AUTO) */
int xio_registered(const xio *x);    /* buffers registered with the ring */
int xio_depth(const xio *x);         /* reads in flight at most */
/* One line: "io_uring, queue depth 4, O_DIRECT, registered buffers" or
 * "pread, 4 threads, buffered (io_uring: <why not>)". Borrowed. */
const char *xio_describe(const xio *x);

/* ==== Fault injection (tests) ==== */
enum xio_fault_kind {
    XIO_FAULT_NONE  = 0,
    XIO_FAULT_EIO   = 1,   /* the operation fails with -EIO */
    XIO_FAULT_SHORT = 2,   /* it reads about half (4096-aligned, at least 4096 bytes... when possible) */
    XIO_FAULT_EOF   = 3,   /* it returns 0 bytes (end of file) */
    XIO_FAULT_LATE  = 4,   /* its completion is delivered late_ms late */
};
typedef struct xio_fault {
    int      kind;         /* enum xio_fault_kind */
    uint64_t nth;          /* first faulty operation, 1-based, counted from xio_fault_set */
    uint64_t count;        /* consecutive faulty operations from nth (0 counts as 1) */
    uint64_t every;        /* also every every-th operation after nth (0: none) */
    int      late_ms;      /* XIO_FAULT_LATE */
    int      only;         /* count only operations of: 0 any request, 1 demands, 2 prefetches */
} xio_fault;
/* Arm (kind != NONE) or disarm a fault; resets the operation count. */
void xio_fault_set(xio *x, const xio_fault *f);
/* Parse "eio:N", "short:N", "eof:N", "late:N:MS", optionally followed by
 * ",count=C", ",every=E", ",demand" or ",prefetch" (only operations of
 * that priority count). ERR_USAGE with a message otherwise. */
int  xio_fault_parse(const char *spec, xio_fault *out, err *e);

#endif

/* threadpool: a fixed set of worker threads that run one parallel job at a
 * time. The caller is worker 0, so a pool of n threads starts n-1 pthreads.
 * Waiting workers (and the caller waiting for them) poll for up to 100 us,
 * then block on a condition variable: back-to-back jobs skip the futex
 * round trips, an idle pool costs no CPU. Not reentrant: one tpool_run at
 * a time. */
#ifndef STRATA_THREADPOOL_H
#define STRATA_THREADPOOL_H

#include "util/err.h"

typedef struct tpool tpool;

/* fn is called once on every thread with ith in [0, nth). */
typedef void (*tpool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1. *out owned by the caller; free with tpool_close. */
int  tpool_open(tpool **out, int n_threads, err *e);
void tpool_close(tpool *p);              /* NULL is a no-op; joins workers */
int  tpool_size(const tpool *p);
/* Run fn on all threads and return when every thread has returned. */
void tpool_run(tpool *p, tpool_fn fn, void *ctx);

/* Split [0, n) into nth near-equal contiguous ranges; range of thread ith. */
static inline void tpool_split(long n, int ith, int nth, long *lo, long *hi)
{
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif

/* threadpool: see threadpool.h.
 *
 * Design: one job at a time. tpool_run publishes (fn, ctx), sets `pending`
 * and bumps the generation counter (all atomics; the bump releases fn and
 * ctx); each worker sees the new generation, runs its share and counts
 * `pending` down. Waiting, on both sides, is a bounded spin (TPOOL_SPIN_US
 * of polling with a pause instruction) and only then a condition variable:
 * a decode step is many short jobs back to back, and two futex round trips
 * a job (a sleeping worker woken, the caller woken by the last worker) cost
 * tens of microseconds each on a VM; an idle pool still sleeps (between
 * tokens, while the caller waits for disk), after at most the spin.
 *
 * No lost wake-ups: a sleeper re-checks its condition under the mutex, and
 * whoever changes it (the generation in tpool_run, pending reaching 0 in
 * the last worker) takes the mutex before broadcasting or signalling. The
 * caller runs share 0 itself, so a 1-thread pool never touches a lock. */
#include "util/threadpool.h"
#include "util/timer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* How long a waiter polls before it sleeps. */
#define TPOOL_SPIN_US 100.0

typedef struct worker_arg {
    tpool *pool;
    int    ith;
} worker_arg;

struct tpool {
    int             n;           /* threads including the caller */
    pthread_t      *threads;     /* n-1 workers (owned) */
    worker_arg     *args;        /* n-1 (owned) */
    pthread_mutex_t mu;
    pthread_cond_t  wake;        /* workers wait for a new generation */
    pthread_cond_t  done;        /* caller waits for pending == 0 */
    atomic_ulong    generation;  /* bumped per job (release: fn and ctx are set) */
    atomic_int      pending;     /* workers still running the current job */
    atomic_int      stop;
    tpool_fn        fn;
    void           *ctx;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Step i (from 1) of a poll begun at t0: a pause; 0 once TPOOL_SPIN_US
 * have passed (the clock is read every 64 steps). */
static int spin_step(unsigned i, double t0)
{
    cpu_relax();
    return (i & 63) != 0 || timer_ms() - t0 <= TPOOL_SPIN_US / 1e3;
}

/* Poll until the generation differs from `seen` (or stop), for at most
 * TPOOL_SPIN_US; returns 1 when it did. */
static int spin_for_job(tpool *p, unsigned long seen)
{
    const double t0 = timer_ms();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return 1;
        if (!spin_step(i, t0)) return 0;
    }
}

static void *worker_main(void *p)
{
    worker_arg *a = p;
    tpool *pool = a->pool;
    unsigned long seen = 0;
    for (;;) {
        if (!spin_for_job(pool, seen)) {
            pthread_mutex_lock(&pool->mu);
            while (!atomic_load(&pool->stop) && atomic_load(&pool->generation) == seen)
                pthread_cond_wait(&pool->wake, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) break;
        seen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        pool->fn(pool->ctx, a->ith, pool->n);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);   /* the caller may be between its check and its wait */
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
    return NULL;
}

int tpool_open(tpool **out, int n_threads, err *e)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return err_setf(e, ERR_USAGE, "thread count %d out of range 1..1024", n_threads);
    tpool *p = calloc(1, sizeof *p);
    if (!p) return err_setf(e, ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            tpool_close(p);
            return err_setf(e, ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            p->args[i - 1] = (worker_arg){ p, i };
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->args[i - 1]) != 0) {
                p->n = i;   /* only i-1 workers exist; close joins those */
                tpool_close(p);
                return err_setf(e, ERR_NOMEM, "thread pool: cannot start thread %d of %d", i, n_threads);
            }
        }
    }
    *out = p;
    return 0;
}

void tpool_close(tpool *p)
{
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p->args);
    free(p);
}

int tpool_size(const tpool *p) { return p ? p->n : 1; }

void tpool_run(tpool *p, tpool_fn fn, void *ctx)
{
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);   /* a worker between its check and its wait sees the bump or the broadcast */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    const double t0 = timer_ms();
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        if (!spin_step(i, t0)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}

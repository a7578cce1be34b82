/* threadpool: see threadpool.h.
 *
 * Design: one job at a time. tpool_run publishes (fn, ctx) under the mutex,
 * bumps a generation counter and broadcasts; each worker wakes, runs its
 * share, and the last one to finish signals `done`. Workers wait on a
 * condition variable, so an idle pool costs no CPU (no spinning between
 * tokens, nor while the caller waits for disk). The caller runs share 0
 * itself, so a 1-thread pool never touches a lock.
 *
 * Cost: two futex round trips per job. For the many small jobs of a decode
 * step that is measurable (tens of microseconds); a later speed issue may add
 * a short bounded spin before sleeping, measured against this. */
#include "util/threadpool.h"

#include <pthread.h>
#include <stdlib.h>

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
    unsigned long   generation;  /* bumped per job */
    int             pending;     /* workers still running the current job */
    int             stop;
    tpool_fn        fn;
    void           *ctx;
};

static void *worker_main(void *p)
{
    worker_arg *a = p;
    tpool *pool = a->pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop) break;
        seen = pool->generation;
        tpool_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mu);
        fn(ctx, a->ith, pool->n);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
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
        p->stop = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* cudatest: the helpers the CUDA test programs share (test_cuda.c,
 * test_cuda_layer.c, test_cuda_model.c). Each program defines
 * CUDATEST_SEED (its xorshift64 seed) before including this, and sets g_cu
 * once it has a context. Allocation failures end the test program (exit 2):
 * a test without its buffers has nothing to say. */
#ifndef STRATA_TESTS_CUDATEST_H
#define STRATA_TESTS_CUDATEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "util/err.h"

static cuda_ctx *g_cu;
static uint64_t g_rng = CUDATEST_SEED;

static inline uint64_t rng_next(void)   /* xorshift64 */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static inline float frand(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }   /* [-1, 1) */

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", n); exit(2); }
    return p;
}

static inline void *dev_alloc(size_t n)
{
    void *p = NULL;
    err e = {0};
    if (cuda_alloc(g_cu, &p, n, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }
    return p;
}

static inline void *dev_from(const void *h, size_t n)
{
    void *p = dev_alloc(n);
    err e = {0};
    if (cuda_upload(g_cu, p, h, n, &e)) { fprintf(stderr, "%s\n", e.msg); exit(2); }
    return p;
}

/* sum (a - r)^2 / sum r^2; +inf if any a is not finite */
static inline double nmse(const float *a, const float *r, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - r[i];
        num += d * d;
        den += (double)r[i] * r[i];
    }
    return den > 0 ? num / den : num;
}

static inline int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* the median of v[0..n) (sorts v; n even: the mean of the middle two) */
static inline float median_float(float *v, int n)
{
    if (n <= 0) return 0.0f;
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif

/* sampler: llama.cpp's sampler chain for llama-cli/llama-completion defaults
 * (common/sampling.cpp: penalties, [dry, top-n-sigma: off], top_k,
 * [typical: off], top_p, min_p, [xtc: off], temperature, dist), stage by
 * stage as src/llama-sampling.cpp does it: the same candidate order (a
 * "sorted" flag that each stage sets or clears), the same float and double
 * sums, the same random draw. Where llama.cpp uses std::partial_sort or
 * std::sort, equal logits may come out in any order there; here the lower
 * token id comes first.
 *
 * Greedy (temp <= 0): llama.cpp keeps the first maximum after the other
 * stages and draws from a one-token distribution; the result is the argmax,
 * which is what we compute directly (after the penalties; lowest id wins). */
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float   logit;
    float   p;
} cand;

struct sampler {
    sampler_opts o;
    int32_t      n_vocab;
    cand        *cur;       /* (n_vocab) candidates of the current draw */
    size_t       size;      /* live candidates */
    int          sorted;    /* cur[0..size) is in descending logit order */
    int32_t     *ring;      /* (repeat_last_n) last accepted tokens */
    int          ring_n, ring_first;
    int32_t     *count;     /* (n_vocab) occurrences inside the window */
    sampler_mt   rng;
};

/* ==== mt19937 ==== */

void sampler_mt_seed(sampler_mt *r, uint32_t seed)
{
    r->mt[0] = seed;
    for (uint32_t i = 1; i < 624; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + i;
    r->idx = 624;
}

uint32_t sampler_mt_next(sampler_mt *r)
{
    if (r->idx >= 624) {
        for (int i = 0; i < 624; i++) {
            uint32_t y = (r->mt[i] & 0x80000000u) | (r->mt[(i + 1) % 624] & 0x7fffffffu);
            r->mt[i] = r->mt[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        r->idx = 0;
    }
    uint32_t y = r->mt[r->idx++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double sampler_mt_uniform(sampler_mt *r)
{
    double sum = 0.0, tmp = 1.0;
    for (int k = 0; k < 2; k++) {
        sum += (double)sampler_mt_next(r) * tmp;
        tmp *= 4294967296.0;
    }
    double ret = sum / tmp;
    if (ret >= 1.0) ret = nextafter(1.0, 0.0);
    return ret;
}

/* ==== Candidate ordering ==== */

/* a before b: higher logit, then lower id. */
static inline int better(const cand *a, const cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Sift down in a heap of n whose root is the WORST element. */
static void sift_worst(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l;
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Move the best k of c[0..n) to c[0..k) in descending order (O(n log k)). */
static void partial_sort(cand *c, size_t n, size_t k)
{
    if (k > n) k = n;
    if (k == 0) return;
    if (k == n) { qsort(c, n, sizeof *c, cmp_cand); return; }
    for (size_t i = k / 2; i-- > 0;) sift_worst(c, k, i);
    for (size_t i = k; i < n; i++) {
        if (better(&c[i], &c[0])) {
            cand t = c[0]; c[0] = c[i]; c[i] = t;
            sift_worst(c, k, 0);
        }
    }
    qsort(c, k, sizeof *c, cmp_cand);
}

/* ==== Stages (llama-sampling.cpp) ==== */

static void stage_penalties(sampler *sm)
{
    const sampler_opts *o = &sm->o;
    if (o->repeat_last_n == 0 || o->repeat_penalty == 1.0f) return;
    for (size_t i = 0; i < sm->size; i++) {
        cand *c = &sm->cur[i];
        if (sm->count[c->id] == 0) continue;
        /* divide positive logits, multiply the others (llama.cpp: <= 0) */
        if (c->logit <= 0) c->logit *= o->repeat_penalty;
        else c->logit /= o->repeat_penalty;
    }
    sm->sorted = 0;
}

static void stage_top_k(sampler *sm)
{
    int k = sm->o.top_k;
    if (k <= 0) return;
    if ((size_t)k > sm->size) k = (int)sm->size;
    if (!sm->sorted) partial_sort(sm->cur, sm->size, (size_t)k);
    sm->size = (size_t)k;
    sm->sorted = 1;
}

/* llama_sampler_softmax_impl(cur, do_sort = false): p in float. */
static void softmax_probs(sampler *sm)
{
    float max_l = sm->cur[0].logit;
    if (!sm->sorted)
        for (size_t i = 1; i < sm->size; i++) max_l = sm->cur[i].logit > max_l ? sm->cur[i].logit : max_l;
    float cum = 0.0f;
    for (size_t i = 0; i < sm->size; i++) {
        float p = expf(sm->cur[i].logit - max_l);
        sm->cur[i].p = p;
        cum += p;
    }
    for (size_t i = 0; i < sm->size; i++) sm->cur[i].p /= cum;
}

static void stage_top_p(sampler *sm)
{
    const float top_p = sm->o.top_p;
    if (top_p >= 1.0f) return;
    softmax_probs(sm);
    /* Walk in descending order; when unsorted, sort the best 256 first and
     * everything only if they do not reach top_p (llama.cpp's heuristic;
     * the kept prefix is the same either way). */
    size_t k = sm->size;
    if (!sm->sorted) {
        k = sm->size > 1024 ? 256 : sm->size;
        partial_sort(sm->cur, sm->size, k);
    }
    float cum = 0.0f;
    size_t last = sm->size;
    for (size_t i = 0; i < sm->size; i++) {
        cum += sm->cur[i].p;
        if (cum >= top_p) { last = i + 1; break; }   /* min_keep = 0 */
        if (i + 1 == k && k < sm->size) {
            qsort(sm->cur + k, sm->size - k, sizeof *sm->cur, cmp_cand);
            k = sm->size;
        }
    }
    sm->size = last;
    sm->sorted = 1;
}

static void stage_min_p(sampler *sm)
{
    const float min_p = sm->o.min_p;
    if (min_p <= 0.0f || sm->size == 0) return;
    if (!sm->sorted) {
        /* unsorted: keep, in place and in order, every logit >= max + log(p) */
        float max_l = -INFINITY;
        for (size_t i = 0; i < sm->size; i++) max_l = sm->cur[i].logit > max_l ? sm->cur[i].logit : max_l;
        const float min_logit = max_l + logf(min_p);
        size_t m = 0;
        for (size_t i = 0; i < sm->size; i++)
            if (sm->cur[i].logit >= min_logit) sm->cur[m++] = sm->cur[i];
        if (m > 0) { sm->size = m; return; }
        partial_sort(sm->cur, sm->size, sm->size);   /* not reached for finite logits */
        sm->sorted = 1;
    }
    const float min_logit = sm->cur[0].logit + logf(min_p);
    size_t i = 1;
    while (i < sm->size && !(sm->cur[i].logit < min_logit)) i++;
    sm->size = i;
}

static void stage_temp(sampler *sm)
{
    for (size_t i = 0; i < sm->size; i++) sm->cur[i].logit /= sm->o.temp;
}

static int32_t stage_dist(sampler *sm)
{
    if (sm->size == 1) return sm->cur[0].id;
    float max_l = sm->cur[0].logit;
    if (!sm->sorted)
        for (size_t i = 1; i < sm->size; i++) max_l = sm->cur[i].logit > max_l ? sm->cur[i].logit : max_l;
    double sum = 0.0;
    for (size_t i = 0; i < sm->size; i++) {
        float p = expf(sm->cur[i].logit - max_l);
        sm->cur[i].p = p;
        sum += p;
    }
    const double target = sum * sampler_mt_uniform(&sm->rng);
    double run = 0.0;
    for (size_t i = 0; i < sm->size; i++) {
        run += sm->cur[i].p;
        if (run >= target) return sm->cur[i].id;
    }
    return sm->cur[sm->size - 1].id;
}

/* ==== API ==== */

sampler_opts sampler_default_opts(void)
{
    sampler_opts o = {
        .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0,
    };
    return o;
}

int sampler_open(sampler **out, const sampler_opts *o, int32_t n_vocab, err *e)
{
    *out = NULL;
    if (n_vocab <= 0) return err_setf(e, ERR_USAGE, "sampler: vocabulary of %d tokens", (int)n_vocab);
    if (o->repeat_last_n < 0) return err_setf(e, ERR_USAGE, "sampler: repeat_last_n %d is negative", o->repeat_last_n);
    if (!(o->repeat_penalty > 0.0f)) return err_setf(e, ERR_USAGE, "sampler: repeat penalty must be positive");
    sampler *sm = calloc(1, sizeof *sm);
    if (!sm) return err_setf(e, ERR_NOMEM, "out of memory");
    sm->o = *o;
    sm->n_vocab = n_vocab;
    sm->cur = malloc(sizeof *sm->cur * (size_t)n_vocab);
    sm->count = calloc((size_t)n_vocab, sizeof *sm->count);
    sm->ring = malloc(sizeof *sm->ring * (size_t)(o->repeat_last_n > 0 ? o->repeat_last_n : 1));
    if (!sm->cur || !sm->count || !sm->ring) {
        sampler_close(sm);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    sampler_mt_seed(&sm->rng, o->seed);
    *out = sm;
    return 0;
}

void sampler_close(sampler *sm)
{
    if (!sm) return;
    free(sm->cur);
    free(sm->count);
    free(sm->ring);
    free(sm);
}

void sampler_accept(sampler *sm, int32_t id)
{
    const int cap = sm->o.repeat_last_n;
    if (cap == 0 || id < 0 || id >= sm->n_vocab) return;
    sm->count[id]++;
    if (sm->ring_n == cap) {   /* window full: the oldest leaves */
        sm->count[sm->ring[sm->ring_first]]--;
        sm->ring[sm->ring_first] = id;
        sm->ring_first = (sm->ring_first + 1) % cap;
    } else {
        sm->ring[(sm->ring_first + sm->ring_n) % cap] = id;
        sm->ring_n++;
    }
}

int32_t sampler_sample(sampler *sm, const float *logits)
{
    for (int32_t i = 0; i < sm->n_vocab; i++) sm->cur[i] = (cand){ i, logits[i], 0.0f };
    sm->size = (size_t)sm->n_vocab;
    sm->sorted = 0;
    stage_penalties(sm);
    if (sm->o.temp <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < sm->size; i++)
            if (sm->cur[i].logit > sm->cur[best].logit) best = i;
        return sm->cur[best].id;
    }
    stage_top_k(sm);
    stage_top_p(sm);
    stage_min_p(sm);
    stage_temp(sm);
    return stage_dist(sm);
}

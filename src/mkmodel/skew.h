/* skew: fit router offsets for a Zipf-like expert popularity, and measure it.
 *
 * Works on a sample of router logits: z (n_states x n_expert, row-major) are
 * the logits of the router's random part for n_states hidden states, and
 * q[i] is state i's coordinate along the shared "skew channel" divided by its
 * mean (about 1). A router whose row e gets offset o_e along the channel
 * produces logits z[i][e] + o_e * q[i]. Routing is top-k on the logits (the
 * softmax is monotonic, so it does not change the choice).
 *
 * Pure functions: no allocation beyond their own scratch, no globals. The
 * float results depend only on the inputs (libm's exp/log are used while
 * fitting; mkmodel rounds the offsets to a coarse grid before use). */
#ifndef STRATA_SKEW_H
#define STRATA_SKEW_H

#include <stdint.h>
#include "util/err.h"

typedef struct skew_pop {
    int n_states, n_expert, n_used;
    int n_top1, n_top10, n_top50;          /* experts in the top 1%, 10%, 50% (at least 1) */
    double share_top1, share_top10, share_top50; /* their share of all selections */
    double max_token_frac;                 /* fraction of tokens that use the most popular expert */
    double exponent;                       /* least-squares Zipf exponent: -slope of ln share vs ln rank */
} skew_pop;

/* Offsets o_e (one per expert) such that the expert of popularity rank r
 * (rank_of_expert[e] = r, 0 = most popular) gets a share of selections close
 * to r^-S / sum, capped at 1/n_used (an expert can be chosen at most once per
 * token) with the excess spread over the others. S = 0 gives all zeros.
 * ERR_NOMEM. */
int skew_fit(const float *z, const float *q, int n_states, int n_expert, int n_used,
             double S, const int32_t *rank_of_expert, float *offsets, err *e);

/* Route the sample with offsets (NULL = none) and summarise the popularity. */
int skew_measure(const float *z, const float *q, int n_states, int n_expert, int n_used,
                 const float *offsets, skew_pop *out, err *e);

#endif

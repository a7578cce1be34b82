/* skew: Zipf-like router offsets and popularity statistics (see skew.h).
 *
 * Fitting is a fixed-point iteration on the sample: route, compare each
 * rank's share with its target, move the rank's offset by half the log
 * ratio, replace the offsets by their best non-increasing fit (isotonic
 * regression, which also averages the sampling noise of rare ranks), centre. Forty rounds
 * bring the shares of all but the rarest ranks within a few percent of the
 * target; the rarest ranks are limited by the sample size (an expert that is
 * chosen 0 or 1 times in the sample cannot be fitted finely). */
#include "mkmodel/skew.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* counts[e] += number of states whose top-n_used contains e. */
static void route_counts(const float *z, const float *q, int n_states, int n_expert, int n_used,
                         const float *off, int64_t *counts, float *topv, int32_t *topi)
{
    memset(counts, 0, (size_t)n_expert * sizeof *counts);
    for (int i = 0; i < n_states; i++) {
        const float *zi = z + (size_t)i * (size_t)n_expert;
        float qi = q ? q[i] : 0.0f;
        int n = 0;
        for (int e = 0; e < n_expert; e++) {
            float v = zi[e] + (off ? off[e] * qi : 0.0f);
            if (n == n_used && v <= topv[n - 1]) continue;
            int j = n < n_used ? n++ : n - 1;
            while (j > 0 && topv[j - 1] < v) { topv[j] = topv[j - 1]; topi[j] = topi[j - 1]; j--; }
            topv[j] = v;
            topi[j] = e;
        }
        for (int j = 0; j < n; j++) counts[topi[j]]++;
    }
}

/* Target shares by rank: r^-S normalised, capped at 1/k by water-filling. */
static void zipf_targets(int n, int k, double S, double *t)
{
    char *capped = calloc((size_t)n, 1);
    for (int r = 0; r < n; r++) t[r] = pow(r + 1.0, -S);
    for (int round = 0; round < n; round++) {
        double free_w = 0, budget = 1.0;
        for (int r = 0; r < n; r++) {
            if (capped && capped[r]) budget -= 1.0 / k;
            else free_w += pow(r + 1.0, -S);
        }
        int changed = 0;
        for (int r = 0; r < n; r++) {
            if (capped && capped[r]) { t[r] = 1.0 / k; continue; }
            t[r] = pow(r + 1.0, -S) * budget / free_w;
            if (capped && t[r] > 1.0 / k) { capped[r] = 1; changed = 1; }
        }
        if (!changed) break;
    }
    free(capped);
}

/* Replace v by its least-squares non-increasing fit (pool adjacent
 * violators). Clamping each value to its predecessor instead would let one
 * noisy low value pull the whole tail down. Returns -1 on OOM. */
static int isotonic_decreasing(double *v, int n)
{
    double *sum = malloc((size_t)n * sizeof *sum);
    int *len = malloc((size_t)n * sizeof *len);
    if (!sum || !len) { free(sum); free(len); return -1; }
    int nb = 0;
    for (int i = 0; i < n; i++) {
        sum[nb] = v[i];
        len[nb] = 1;
        nb++;
        while (nb > 1 && sum[nb - 1] / len[nb - 1] > sum[nb - 2] / len[nb - 2]) {
            sum[nb - 2] += sum[nb - 1];
            len[nb - 2] += len[nb - 1];
            nb--;
        }
    }
    for (int b = 0, i = 0; b < nb; b++)
        for (int k = 0; k < len[b]; k++) v[i++] = sum[b] / len[b];
    free(sum);
    free(len);
    return 0;
}

int skew_fit(const float *z, const float *q, int n_states, int n_expert, int n_used,
             double S, const int32_t *rank_of_expert, float *offsets, err *e)
{
    memset(offsets, 0, (size_t)n_expert * sizeof *offsets);
    if (S <= 0) return 0;
    double *target = malloc((size_t)n_expert * sizeof *target);
    double *off_r = malloc((size_t)n_expert * sizeof *off_r);
    int64_t *counts = malloc((size_t)n_expert * sizeof *counts);
    float *topv = malloc((size_t)n_used * sizeof *topv);
    int32_t *topi = malloc((size_t)n_used * sizeof *topi);
    int32_t *expert_of_rank = malloc((size_t)n_expert * sizeof *expert_of_rank);
    double *cum = malloc(((size_t)n_expert + 1) * sizeof *cum);
    if (!target || !off_r || !counts || !topv || !topi || !expert_of_rank || !cum) {
        free(target); free(off_r); free(counts); free(topv); free(topi); free(expert_of_rank); free(cum);
        return err_setf(e, ERR_NOMEM, "route skew: out of memory");
    }
    for (int x = 0; x < n_expert; x++) expert_of_rank[rank_of_expert[x]] = x;
    zipf_targets(n_expert, n_used, S, target);
    for (int r = 0; r < n_expert; r++) off_r[r] = -S * log(r + 1.0);
    const double total = (double)n_states * n_used, floor_share = 0.5 / total;
    for (int it = 0; it < 40; it++) {
        for (int r = 0; r < n_expert; r++) offsets[expert_of_rank[r]] = (float)off_r[r];
        route_counts(z, q, n_states, n_expert, n_used, offsets, counts, topv, topi);
        /* log(target/share) per rank, then its mean over ranks r +- r/4
         * (prefix sums): the top ranks, seen often, move alone; the tail
         * ranks, seen a few times each, move together instead of by their
         * sampling noise. */
        cum[0] = 0;
        for (int r = 0; r < n_expert; r++) {
            double share = (double)counts[expert_of_rank[r]] / total;
            if (share < floor_share) share = floor_share;
            cum[r + 1] = cum[r] + log(target[r]) - log(share);
        }
        for (int r = 0; r < n_expert; r++) {
            int w = (r + 1) / 4, lo = r - w, hi = r + w + 1;
            if (hi > n_expert) hi = n_expert;
            double step = 0.5 * (cum[hi] - cum[lo]) / (hi - lo);
            if (step > 2) step = 2;
            if (step < -2) step = -2;
            off_r[r] += step;
        }
        if (isotonic_decreasing(off_r, n_expert)) {
            free(target); free(off_r); free(counts); free(topv); free(topi); free(expert_of_rank); free(cum);
            return err_setf(e, ERR_NOMEM, "route skew: out of memory");
        }
        double mean = 0;
        for (int r = 0; r < n_expert; r++) mean += off_r[r];
        mean /= n_expert;
        for (int r = 0; r < n_expert; r++) {
            off_r[r] -= mean;
            if (off_r[r] < -40) off_r[r] = -40;
            if (off_r[r] > 40) off_r[r] = 40;
        }
    }
    for (int r = 0; r < n_expert; r++) offsets[expert_of_rank[r]] = (float)off_r[r];
    free(target); free(off_r); free(counts); free(topv); free(topi); free(expert_of_rank); free(cum);
    return 0;
}

static int cmp_desc_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int skew_measure(const float *z, const float *q, int n_states, int n_expert, int n_used,
                 const float *offsets, skew_pop *out, err *e)
{
    memset(out, 0, sizeof *out);
    int64_t *counts = malloc((size_t)n_expert * sizeof *counts);
    float *topv = malloc((size_t)n_used * sizeof *topv);
    int32_t *topi = malloc((size_t)n_used * sizeof *topi);
    if (!counts || !topv || !topi) {
        free(counts); free(topv); free(topi);
        return err_setf(e, ERR_NOMEM, "route skew: out of memory");
    }
    route_counts(z, q, n_states, n_expert, n_used, offsets, counts, topv, topi);
    qsort(counts, (size_t)n_expert, sizeof *counts, cmp_desc_i64);
    double total = (double)n_states * n_used;
    out->n_states = n_states;
    out->n_expert = n_expert;
    out->n_used = n_used;
    out->n_top1 = (n_expert + 99) / 100;
    out->n_top10 = (n_expert + 9) / 10;
    out->n_top50 = (n_expert + 1) / 2;
    double acc = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n_fit = 0;
    for (int r = 0; r < n_expert; r++) {
        acc += (double)counts[r];
        if (r + 1 == out->n_top1) out->share_top1 = acc / total;
        if (r + 1 == out->n_top10) out->share_top10 = acc / total;
        if (r + 1 == out->n_top50) out->share_top50 = acc / total;
        if (counts[r] > 0) {
            double x = log(r + 1.0), y = log((double)counts[r] / total);
            sx += x; sy += y; sxx += x * x; sxy += x * y;
            n_fit++;
        }
    }
    out->max_token_frac = n_states ? (double)counts[0] / n_states : 0;
    if (n_fit >= 2) {
        double den = n_fit * sxx - sx * sx;
        out->exponent = den > 0 ? -(n_fit * sxy - sx * sy) / den : 0;
    }
    free(counts); free(topv); free(topi);
    return 0;
}

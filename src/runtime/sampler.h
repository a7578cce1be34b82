/* sampler: llama.cpp's default sampler chain (the public API is in
 * engine.h: sampler_open / sampler_accept / sampler_sample).
 *
 * What it owns: the candidate array (n_vocab entries), the repeat-penalty
 * window and per-token counts, and the random generator, all allocated at
 * sampler_open; sampling allocates nothing.
 *
 * The generator is std::mt19937 (the 32-bit Mersenne Twister, seeded as
 * C++'s seed(uint32)), and a uniform double in [0, 1) is libstdc++'s
 * generate_canonical<double, 53>: (g1 + g2 * 2^32) / 2^64 from two outputs,
 * nudged below 1. This header exposes it for tests. */
#ifndef STRATA_SAMPLER_H
#define STRATA_SAMPLER_H

#include <stdint.h>

#include "engine.h"

typedef struct sampler_mt {
    uint32_t mt[624];
    int      idx;
} sampler_mt;

void     sampler_mt_seed(sampler_mt *r, uint32_t seed);
uint32_t sampler_mt_next(sampler_mt *r);
double   sampler_mt_uniform(sampler_mt *r);   /* [0, 1) */

#endif

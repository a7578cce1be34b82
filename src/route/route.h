/* route: routing policies (docs/ROUTING.md has the grammar, the semantics
 * and why each choice was made).
 *
 * A policy is parsed once from a readable spec and is immutable afterwards:
 *
 *   prompt.chunk0=exact; prompt=bias(body=3,bonus=0.85,exact-last=32); decode=exact
 *
 * It holds three arms (enum route_arm_id): the first forward chunk of a
 * prompt (a session_eval of several tokens), its later chunks, and decode
 * (a session_eval of one token). An arm is `exact` (the architecture's own
 * routing, what qwen3moe.c's route() does) or
 * `bias(body=B,bonus=X[,exact-last=N][,tail=T:Y])`:
 *
 *   row bonus   b = 0 for the last N prompt rows (exact-last), Y for the last
 *               T prompt rows above those (tail), X otherwise; always X in
 *               decode (where exact-last and tail are parse errors).
 *   b == 0      the row is routed exactly (same bits as exact), and nothing
 *               reads residency for it.
 *   b > 0       delta = max - min of the row's router logits; score(e) =
 *               logit(e) + b * delta if expert e is resident (in memory or
 *               being read, see expert_src_resident_mask), else logit(e),
 *               computed in double. The exact top-B (by the unbiased
 *               probabilities, ops_topk's order: descending, ties to the
 *               lower index) are always kept; the other k - B slots take
 *               the best scores among the rest (ties to the lower index).
 *               The chosen k are put in the exact order (descending
 *               unbiased probability, ties to the lower index), so a set
 *               equal to the exact one gives the exact bits; the weights are
 *               their unbiased softmax probabilities divided by their sum
 *               (double, then float) clamped at 6.103515625e-5, as exact.
 *
 * Residency is read at most once per (chunk, layer), lazily, only when a
 * row of the block has b > 0 and B < k: an arm with no bonus never reads it,
 * so its results cannot depend on arena state or I/O timing.
 *
 * Nothing here allocates after parsing, keeps globals or prints. */
#ifndef STRATA_ROUTE_H
#define STRATA_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

enum route_arm_id {
    ROUTE_ARM_CHUNK0 = 0,   /* key prompt.chunk0: chunk 0 of a prompt */
    ROUTE_ARM_PROMPT = 1,   /* key prompt: later prompt chunks (and chunk 0 without a prompt.chunk0 key) */
    ROUTE_ARM_DECODE = 2,   /* key decode: one-token evaluations */
    ROUTE_N_ARMS     = 3,
};
enum route_kind { ROUTE_EXACT = 0, ROUTE_BIAS = 1 };

/* Parse bounds (the model bounds body again at engine open). */
#define ROUTE_MAX_BODY    1024
#define ROUTE_MAX_ROWS    (1 << 30)    /* exact-last and tail rows */
#define ROUTE_MAX_SPEC    4096         /* bytes of a spec */

typedef struct route_arm {
    int    kind;          /* enum route_kind; the rest is 0 for exact */
    int    body;          /* B: exact top-B always kept, 0..ROUTE_MAX_BODY */
    double bonus;         /* X: finite, >= 0 */
    int    exact_last;    /* N: last N prompt rows routed exactly; 0: none */
    int    tail_rows;     /* T: 0 = no tail; else > exact_last */
    double tail_bonus;    /* Y: finite, >= 0 */
} route_arm;

typedef struct route_policy route_policy;

/* Parse a spec (see docs/ROUTING.md). ERR_USAGE with "route spec: <what>
 * '<text>' at column <c>" (1-based) for anything wrong; ERR_NOMEM.
 * *out owned by the caller (route_policy_free). */
int  route_policy_parse(route_policy **out, const char *spec, err *e);
void route_policy_free(route_policy *p);   /* NULL is a no-op */

/* The model's bounds: every body <= k (ERR_USAGE naming the arm and the
 * column of its body= in the spec). */
int  route_policy_check(const route_policy *p, int n_expert, int k, err *e);

/* Arm `id` (enum route_arm_id), already resolved (prompt.chunk0 falls back
 * to prompt). Never NULL for a valid id. */
const route_arm *route_policy_arm(const route_policy *p, int id);
/* Which arm routes a chunk: phase 0 (prompt) chunk 0 -> CHUNK0, later ->
 * PROMPT; phase 1 (decode) -> DECODE. */
int  route_arm_for(int phase, int chunk_index);
/* "prompt.chunk0", "prompt", "decode" ("?" otherwise). */
const char *route_arm_name(int id);

/* The canonical effective policy: "exact" when every arm is exact, else
 * "prompt.chunk0=A; prompt=B; decode=C" with each arm as route_arm_describe
 * writes it. Parsing it gives the same policy. snprintf's contract (returns
 * the full length; NUL-terminated when cap > 0). */
int  route_policy_describe(const route_policy *p, char *buf, size_t cap);
/* "exact" or "bias(body=3,bonus=0.85[,exact-last=32][,tail=64:0.25])";
 * numbers in the shortest form that reads back to the same value. */
int  route_arm_describe(const route_arm *a, char *buf, size_t cap);

/* 1 if the arm may read residency for a model with k experts per token:
 * bias with body < k and a nonzero bonus or tail bonus. */
int  route_arm_reads_residency(const route_arm *a, int k);
/* 1 if any arm does. */
int  route_policy_reads_residency(const route_policy *p, int k);

/* The bonus of one row: rows_from_end = prompt rows of the same
 * session_eval call after this one (0: the last prompt row; qwen3moe_chunk
 * rows_after plus the rows after it in its chunk). Phase 1 (decode): the
 * arm's bonus. 0 for exact. */
double route_row_bonus(const route_arm *a, int phase, int rows_from_end);

/* ==== Counters (per arm) ==== */
typedef struct route_counters {
    uint64_t blocks;               /* (chunk, layer) MoE blocks routed by the arm */
    uint64_t rows;                 /* rows routed, summed over layers */
    uint64_t rows_biased;          /* of them with a bonus > 0 (body < k) */
    uint64_t slots_changed;        /* row-slots holding an expert not in the row's exact top-k */
    uint64_t slots_changed_resident; /* of them resident at routing time: selections the bias caused */
    uint64_t lookups;              /* distinct experts per block, summed */
    uint64_t lookups_exact;        /* the same for the exact top-k of the same rows */
    uint64_t masked_blocks;        /* blocks that read residency */
    uint64_t masked_lookups;       /* in those blocks: distinct chosen experts, */
    uint64_t masked_resident;      /*   of them resident at routing time; */
    uint64_t masked_lookups_exact; /*   distinct exact top-k experts, */
    uint64_t masked_resident_exact;/*   of them resident */
} route_counters;

/* ==== The per-row path (no allocation) ==== */

/* Caller-owned buffers for a model of X experts and k used (X >= k >= 1):
 * logit X floats, key k doubles, exact k ids, mask/seen/seen_exact X bytes. */
typedef struct route_work {
    float   *logit;
    double  *key;
    int32_t *exact;
    uint8_t *mask;
    uint8_t *seen;
    uint8_t *seen_exact;
} route_work;
/* Bytes of those buffers (for memory plans). */
size_t route_work_bytes(int X, int k);

/* Fills mask[0..X) with 1 for resident experts, 0 otherwise (the layer is
 * the callback's business). */
typedef void (*route_mask_fn)(void *ctx, uint8_t *mask);

/* Exact routing of one row, the architecture's (qwen3moe.c route()):
 * p[0..X) logits in, softmax probabilities out; sel[0..k) the top-k,
 * w[0..k) their renormalised weights. */
void route_exact_row(float *p, int X, int k, int32_t *sel, float *w);

/* Biased selection of one row (b > 0, body < k): logit the row's logits,
 * p its softmax probabilities, exact its exact top-k (route_exact_row's
 * sel), resident the mask. Writes sel[0..k) (exact order) and w[0..k);
 * returns the number of slots not in exact; *changed_resident those of them
 * resident. key: k doubles of scratch. */
int  route_bias_row(const float *logit, const float *p, const int32_t *exact, const uint8_t *resident,
                    int X, int k, int body, double b, int32_t *sel, float *w, double *key,
                    int *changed_resident);

/* Route one block of n_rows rows with arm a: router[j*X ..] logits in,
 * probabilities out; sel/w: n_rows x k. rows_after: prompt rows of the call
 * after the block's last row (qwen3moe_chunk.rows_after). mask_fn is called
 * at most once, and only if a row gets b > 0. ctr may be NULL. */
void route_block(const route_arm *a, int phase, int rows_after, float *router, int n_rows, int X, int k,
                 int32_t *sel, float *w, route_work *wk, route_mask_fn mask_fn, void *mask_ctx,
                 route_counters *ctr);

/* Count a block routed exactly elsewhere (sel: n_rows x k): blocks, rows,
 * lookups = lookups_exact. seen: X bytes of scratch. ctr may be NULL. */
void route_count_exact(route_counters *ctr, const int32_t *sel, int n_rows, int X, int k, uint8_t *seen);

#endif

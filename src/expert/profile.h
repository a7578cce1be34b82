/* profile: how often each layer-expert is looked up on a corpus, prompt and
 * decode kept apart, ranked, so that the expert store can fill its arena from
 * the top before the first token (`--profile PROFILE`).
 *
 * What it owns: the counting (profile_counts, fed by the engine's routing
 * observer), the file format (below), writing and loading it. It does not
 * run the model (`strata profile` in apps/cli/cmd_profile.c does) and does
 * not fill the arena (the store does, from profile_load's ranked list).
 *
 * ==== File format, version 1 (text, one record per line, '\n' ends lines) ====
 *
 *   # strata expert profile (free-form comment lines start with '#')
 *   strata-profile 1 fp=<16 hex> gguf_size=<u64> n_layer=<int> n_expert=<int> k=<int> prompt_tokens=<u64> decode_tokens=<u64> prompt_lookups=<u64> decode_lookups=<u64>
 *   # rank layer expert prompt_count decode_count
 *   0 3 17 1234 56
 *   1 0 5 1200 60
 *   ...
 *
 * - The header line comes first (after any comments) and names the model by
 *   gguf_fingerprint() (fp, 16 lower-case hex digits) and file size.
 * - `*_tokens` are the tokens evaluated in each phase; `*_lookups` the
 *   (row, expert) routing choices observed, i.e. tokens x layers x k when
 *   every layer routes every row (the sum of that phase's count column).
 * - One line per layer-expert, every (layer, expert) of the model exactly
 *   once (n_layer*n_expert lines, unused experts included with zero counts),
 *   ranks 0, 1, 2, ... in order. Rank order: descending score
 *   prompt_count/prompt_lookups + decode_count/decode_lookups (each phase's
 *   share of its own lookups, so that a long prompt does not drown decode; a
 *   phase with no lookups adds 0), ties by layer then expert, ascending.
 * - Fields are separated by single spaces; numbers are decimal without sign.
 *
 * profile_load checks all of it: header syntax, fingerprint/size/n_layer/
 * n_expert against the model ("made for a different model"), every line's
 * ranges, ranks in sequence, no (layer, expert) twice, all present, and the
 * count columns summing to the header's totals. Files over 512 MiB are
 * refused. Errors are one line naming the file and line number.
 *
 * Thread-safety: a profile_counts is fed from one thread at a time (the
 * engine calls the observer from its coordinating thread); a loaded
 * profile is immutable. */
#ifndef STRATA_PROFILE_H
#define STRATA_PROFILE_H

#include <stdint.h>

#include "gguf/gguf.h"
#include "util/err.h"

#define PROFILE_VERSION 1

enum profile_phase { PROFILE_PROMPT = 0, PROFILE_DECODE = 1 };

/* ==== Counting ==== */

typedef struct profile_counts profile_counts;

/* Counters for the model in f (its qwen3moe hyper-parameters give n_layer,
 * n_expert and k; the fingerprint and size are recorded for the file).
 * *out owned by the caller. ERR_UNSUPPORTED/ERR_FORMAT from the model's
 * metadata, ERR_NOMEM. */
int  profile_counts_open(profile_counts **out, const gguf_file *f, err *e);
void profile_counts_close(profile_counts *c);   /* NULL is a no-op */

/* Record one routing decision of `layer` for n_rows rows: experts is
 * (n_rows, k) row-major. Experts or layers out of range are not counted
 * but remembered (profile_write then fails with ERR_INTERNAL: a hook that
 * reports nonsense must not produce a plausible file). */
void profile_counts_route(profile_counts *c, int phase, int layer, const int32_t *experts, int n_rows, int k);
/* Count evaluated tokens of a phase (for the header). */
void profile_counts_tokens(profile_counts *c, int phase, uint64_t n);
uint64_t profile_counts_lookups(const profile_counts *c, int phase);
uint64_t profile_counts_n_tokens(const profile_counts *c, int phase);

/* Rank and write the file (to "<path>.tmp", then renamed). ERR_IO,
 * ERR_INTERNAL (bad routing was observed). */
int profile_write(const profile_counts *c, const char *path, err *e);

/* ==== Loading ==== */

typedef struct profile_entry {
    int32_t  layer, expert;
    uint64_t prompt, decode;   /* counts */
} profile_entry;

typedef struct profile profile;

/* Load and validate `path` for the model with this fingerprint, file size
 * and shape (a store passes gguf_fingerprint(f), gguf_file_size(f),
 * hp->n_layer, hp->n_expert). ERR_NOTFOUND / ERR_IO (cannot read),
 * ERR_FORMAT (malformed, or made for another model: the message says
 * "run 'strata profile -m MODEL -f CORPUS -o PROFILE' to make one for this
 * model"). *out owned by the caller. */
int  profile_load(profile **out, const char *path, uint64_t fingerprint, uint64_t gguf_size,
                  int n_layer, int n_expert, err *e);
void profile_close(profile *p);   /* NULL is a no-op */

/* The ranked list, best first: entries [0, profile_n(p)); borrowed, valid
 * until profile_close(). */
uint64_t             profile_n(const profile *p);
const profile_entry *profile_entries(const profile *p);
uint64_t             profile_lookups(const profile *p, int phase);
uint64_t             profile_n_tokens(const profile *p, int phase);

#endif

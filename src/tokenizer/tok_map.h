/* tok_map: a build-once hash map from byte strings to int32 values, private
 * to the tokenizer.
 *
 * It owns copies of its keys (one growing blob) and is used for the two
 * lookups on the encoding hot path: token text -> id, and BPE merge
 * (left, right) -> rank. A key is a byte string plus a `split` number: for
 * merges the key bytes are left+right concatenated and split = strlen(left),
 * so a pair of adjacent symbols inside a word is looked up without building
 * a string; for plain texts split is 0.
 *
 * Open addressing with linear probing; the table is sized at init for the
 * expected number of keys and grows by doubling. Lookups never allocate and
 * may run concurrently once building is over (no mutable state is touched).
 * Not thread-safe while inserting. */
#ifndef STRATA_TOK_MAP_H
#define STRATA_TOK_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_map_entry {
    uint64_t off;     /* key bytes at blob + off */
    uint32_t len;     /* key length in bytes */
    uint32_t split;   /* see the file comment */
    int32_t  val;
} tok_map_entry;

typedef struct tok_map {
    uint64_t      *slots;   /* (hash tag << 32) | (entry index + 1); 0 = empty */
    size_t         cap;     /* number of slots, a power of two */
    tok_map_entry *ents;    /* owned */
    size_t         n, n_cap;
    char          *blob;    /* owned: all key bytes */
    size_t         blob_n, blob_cap;
} tok_map;

/* Prepare an empty map for about `expected` keys. Returns 0 or ERR_NOMEM. */
int  tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);   /* safe on a zeroed or freed map */

/* Insert key -> val unless the key is present. *existed (may be NULL) is set
 * to 1 when it was present (the old value is kept: first insert wins, as
 * std::map::emplace does), else 0. Returns 0 or ERR_NOMEM. */
int tok_map_put(tok_map *m, const char *key, size_t len, uint32_t split, int32_t val, int *existed);

/* The value for the key, or -1 when absent. */
int32_t tok_map_get(const tok_map *m, const char *key, size_t len, uint32_t split);

#endif

/* tok_map: build-once byte-string hash map (see tok_map.h). */
#include "tokenizer/tok_map.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* FNV-1a over the bytes, then the split folded in and a splitmix finaliser:
 * keys are short (a few bytes) so a simple byte loop is the fast choice. */
static uint64_t key_hash(const char *key, size_t len, uint32_t split)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)key[i];
        h *= 0x100000001b3ull;
    }
    h ^= (uint64_t)split * 0x9e3779b97f4a7c15ull;
    h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27; h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static int grow_slots(tok_map *m, size_t cap)
{
    uint64_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return ERR_NOMEM;
    for (size_t i = 0; i < m->n; i++) {
        const tok_map_entry *en = &m->ents[i];
        uint64_t h = key_hash(m->blob + en->off, en->len, en->split);
        size_t s = (size_t)h & (cap - 1);
        while (slots[s]) s = (s + 1) & (cap - 1);
        slots[s] = ((h >> 32) << 32) | (uint64_t)(i + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int tok_map_init(tok_map *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t cap = 64;
    while (cap < expected * 2 && cap < ((size_t)1 << 40)) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return ERR_NOMEM;
    m->cap = cap;
    return 0;
}

void tok_map_free(tok_map *m)
{
    if (!m) return;
    free(m->slots);
    free(m->ents);
    free(m->blob);
    memset(m, 0, sizeof *m);
}

static int entry_eq(const tok_map *m, const tok_map_entry *en, const char *key, size_t len, uint32_t split)
{
    return en->len == len && en->split == split && memcmp(m->blob + en->off, key, len) == 0;
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len, uint32_t split)
{
    if (!m->cap) return -1;
    uint64_t h = key_hash(key, len, split);
    uint64_t tag = h >> 32;
    size_t s = (size_t)h & (m->cap - 1);
    for (;;) {
        uint64_t v = m->slots[s];
        if (!v) return -1;
        if ((v >> 32) == tag) {
            const tok_map_entry *en = &m->ents[(uint32_t)v - 1];
            if (entry_eq(m, en, key, len, split)) return en->val;
        }
        s = (s + 1) & (m->cap - 1);
    }
}

int tok_map_put(tok_map *m, const char *key, size_t len, uint32_t split, int32_t val, int *existed)
{
    if (existed) *existed = 0;
    if (len > UINT32_MAX) return ERR_NOMEM;
    if (!m->cap && grow_slots(m, 64)) return ERR_NOMEM;
    /* keep the load factor under 1/2 */
    if ((m->n + 1) * 2 > m->cap) {
        if (grow_slots(m, m->cap * 2)) return ERR_NOMEM;
    }
    if (m->n >= UINT32_MAX - 1) return ERR_NOMEM;
    uint64_t h = key_hash(key, len, split);
    uint64_t tag = h >> 32;
    size_t s = (size_t)h & (m->cap - 1);
    for (;;) {
        uint64_t v = m->slots[s];
        if (!v) break;
        if ((v >> 32) == tag && entry_eq(m, &m->ents[(uint32_t)v - 1], key, len, split)) {
            if (existed) *existed = 1;
            return 0;
        }
        s = (s + 1) & (m->cap - 1);
    }
    if (m->n == m->n_cap) {
        size_t nc = m->n_cap ? m->n_cap * 2 : 256;
        tok_map_entry *ne = realloc(m->ents, nc * sizeof *ne);
        if (!ne) return ERR_NOMEM;
        m->ents = ne;
        m->n_cap = nc;
    }
    if (len > m->blob_cap - m->blob_n) {
        size_t nc = m->blob_cap ? m->blob_cap : 4096;
        while (nc - m->blob_n < len) nc *= 2;
        char *nb = realloc(m->blob, nc);
        if (!nb) return ERR_NOMEM;
        m->blob = nb;
        m->blob_cap = nc;
    }
    if (len) memcpy(m->blob + m->blob_n, key, len);
    tok_map_entry *en = &m->ents[m->n];
    en->off = m->blob_n;
    en->len = (uint32_t)len;
    en->split = split;
    en->val = val;
    m->blob_n += len;
    m->n++;
    m->slots[s] = (tag << 32) | (uint64_t)m->n;
    return 0;
}

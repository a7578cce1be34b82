/* strbuf: a growable NUL-terminated byte buffer for the front ends that
 * build text (tool-call rendering, taskeval prompts and reports, the server's
 * request and response bodies). Header-only so toolcall.c stays a
 * self-contained unit the server's test compiles on its own.
 *
 * An allocation failure sets `oom` and makes every later append a no-op, so
 * callers check once at the end. `p` is owned (free it); NULL until the first
 * append. A zero-initialised strbuf is empty. */
#ifndef STRATA_STRBUF_H
#define STRATA_STRBUF_H

#include <stdlib.h>
#include <string.h>

typedef struct strbuf {
    char  *p;      /* owned, NUL-terminated after the first append */
    size_t n, cap;
    int    oom;    /* sticky: an append failed */
} strbuf;

static inline void strbuf_add(strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 128;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static inline void strbuf_str(strbuf *b, const char *s) { strbuf_add(b, s, strlen(s)); }

#endif

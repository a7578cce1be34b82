/* cursor: bounds-checked little-endian reads over a byte buffer.
 *
 * Every byte that comes from disk or the network is read through a cursor.
 * A cursor never reads past `size`; the first failed read records an error
 * (naming `what` and the byte offset, plus `base_off` so offsets are file
 * offsets even when the buffer is a window of a file) and every later read
 * fails too, so a parser can check `c->err->code` once at the end of a block.
 * Header-only (static inline): no state beyond the struct. */
#ifndef STRATA_CURSOR_H
#define STRATA_CURSOR_H

#include <stdint.h>
#include <string.h>
#include "util/err.h"

typedef struct cursor {
    const uint8_t *buf;   /* borrowed */
    uint64_t size;        /* bytes readable in buf */
    uint64_t pos;         /* next byte to read */
    uint64_t base_off;    /* file offset of buf[0], for messages */
    int      failed;      /* sticky: set by the first failed read */
    err     *e;           /* where the first failure is described; may be NULL */
} cursor;

static inline void cursor_init(cursor *c, const void *buf, uint64_t size, uint64_t base_off, err *e)
{
    c->buf = (const uint8_t *)buf; c->size = size; c->pos = 0;
    c->base_off = base_off; c->failed = 0; c->e = e;
}

/* True when n more bytes can be read. Overflow-safe. */
static inline int cursor_has(const cursor *c, uint64_t n)
{
    return !c->failed && c->pos <= c->size && n <= c->size - c->pos;
}

static inline uint64_t cursor_off(const cursor *c) { return c->base_off + c->pos; }

/* Read n bytes into dst (dst may be NULL to skip). Returns 0 or ERR_FORMAT. */
static inline int cursor_read(cursor *c, void *dst, uint64_t n, const char *what)
{
    if (!cursor_has(c, n)) {
        if (!c->failed)
            err_setf(c->e, ERR_FORMAT, "truncated: %s needs %llu bytes at byte offset %llu, only %llu left",
                     what, (unsigned long long)n, (unsigned long long)cursor_off(c),
                     (unsigned long long)(c->pos <= c->size ? c->size - c->pos : 0));
        c->failed = 1;
        if (dst) memset(dst, 0, (size_t)n < 64 ? (size_t)n : 0);
        return ERR_FORMAT;
    }
    if (dst) memcpy(dst, c->buf + c->pos, (size_t)n);
    c->pos += n;
    return 0;
}

/* Borrow a pointer to n bytes in place (no copy); NULL on failure. */
static inline const uint8_t *cursor_take(cursor *c, uint64_t n, const char *what)
{
    if (!cursor_has(c, n)) { cursor_read(c, NULL, n, what); return NULL; }
    const uint8_t *p = c->buf + c->pos;
    c->pos += n;
    return p;
}

#define CURSOR_READ_T(name, T) \
    static inline T cursor_##name(cursor *c, const char *what) \
    { T v = 0; cursor_read(c, &v, sizeof v, what); return v; }
CURSOR_READ_T(u8, uint8_t)
CURSOR_READ_T(i8, int8_t)
CURSOR_READ_T(u16, uint16_t)
CURSOR_READ_T(i16, int16_t)
CURSOR_READ_T(u32, uint32_t)
CURSOR_READ_T(i32, int32_t)
CURSOR_READ_T(u64, uint64_t)
CURSOR_READ_T(i64, int64_t)
CURSOR_READ_T(f32, float)
CURSOR_READ_T(f64, double)
#undef CURSOR_READ_T

/* Overflow-checked size arithmetic: return 0 on success, -1 on overflow. */
static inline int size_mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a) return -1;
    *out = a * b;
    return 0;
}
static inline int size_add_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > UINT64_MAX - a) return -1;
    *out = a + b;
    return 0;
}

#endif

/* err: return codes plus a first-error-wins message.
 *
 * Every fallible library function returns 0 on success or a negative ERR_*
 * code, and fills the caller's `err` with a one-line message that names what
 * is wrong (the field, the byte offset, the tensor, the expert). The library
 * never exits and never prints errors itself: the caller decides.
 *
 * The first error set on an `err` wins: later err_setf() calls keep the
 * original message (the root cause), but still return their own code so a
 * function can write `return err_setf(e, ERR_IO, ...)`.
 * A NULL `err *` is allowed everywhere and discards the message. */
#ifndef STRATA_ERR_H
#define STRATA_ERR_H

#include <stddef.h>

enum err_code {
    ERR_OK          =  0,
    ERR_IO          = -1,  /* read/write/open failed, short read at EOF */
    ERR_FORMAT      = -2,  /* malformed input: bad magic, bad offset, bad shape */
    ERR_NOMEM       = -3,  /* allocation failed or request absurdly large */
    ERR_UNSUPPORTED = -4,  /* valid input we do not handle (type, arch, version) */
    ERR_USAGE       = -5,  /* bad flag or argument from the user */
    ERR_RANGE       = -6,  /* value out of range (token id, context full) */
    ERR_NOTFOUND    = -7,  /* missing key / tensor / file */
    ERR_INTERNAL    = -8,  /* broken invariant detected at run time */
    ERR_CANCELLED   = -9,  /* caller asked to stop */
};

typedef struct err {
    int  code;       /* 0 until the first error */
    char msg[320];   /* NUL-terminated one-line message */
} err;

/* Reset to "no error". */
void err_clear(err *e);

/* Record an error unless one is already recorded; returns `code` either way. */
int err_setf(err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the existing message with context ("loading model: ..."). No-op when
 * no error is recorded. Returns e->code (or ERR_OK for NULL/empty). */
int err_prefix(err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Static name of a code ("ERR_FORMAT"). */
const char *err_name(int code);

#endif

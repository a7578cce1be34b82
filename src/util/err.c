/* err: see err.h. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void err_clear(err *e)
{
    if (!e) return;
    e->code = 0;
    e->msg[0] = '\0';
}

int err_setf(err *e, int code, const char *fmt, ...)
{
    if (!e || e->code != 0) return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

int err_prefix(err *e, const char *fmt, ...)
{
    if (!e || e->code == 0) return ERR_OK;
    char head[sizeof e->msg], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    /* "head: old", truncated to the buffer (the tail of a long message goes). */
    size_t cap = sizeof e->msg - 1, n = 0;
    for (const char *p = head; *p && n < cap; p++) e->msg[n++] = *p;
    for (const char *p = ": "; *p && n < cap; p++) e->msg[n++] = *p;
    for (const char *p = old; *p && n < cap; p++) e->msg[n++] = *p;
    e->msg[n] = '\0';
    return e->code;
}

const char *err_name(int code)
{
    switch (code) {
    case ERR_OK:          return "ERR_OK";
    case ERR_IO:          return "ERR_IO";
    case ERR_FORMAT:      return "ERR_FORMAT";
    case ERR_NOMEM:       return "ERR_NOMEM";
    case ERR_UNSUPPORTED: return "ERR_UNSUPPORTED";
    case ERR_USAGE:       return "ERR_USAGE";
    case ERR_RANGE:       return "ERR_RANGE";
    case ERR_NOTFOUND:    return "ERR_NOTFOUND";
    case ERR_INTERNAL:    return "ERR_INTERNAL";
    case ERR_CANCELLED:   return "ERR_CANCELLED";
    default:              return "ERR_UNKNOWN";
    }
}

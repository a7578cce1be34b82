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
    char buf[2 * sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n < 0) return e->code;
    size_t h = strlen(buf);
    buf[h++] = ':';
    buf[h++] = ' ';
    memcpy(buf + h, e->msg, strlen(e->msg) + 1);
    buf[sizeof e->msg - 1] = '\0';      /* truncate the combined message */
    memcpy(e->msg, buf, sizeof e->msg);
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

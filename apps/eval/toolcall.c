/* toolcall: tool-call parsing (see toolcall.h for the formats and contract).
 *
 * The parse works on a private copy of the text: <think> blocks are cut
 * first, then either the <tool_call> blocks (when the text has the tag) or
 * bare JSON objects are taken out; what remains, trimmed, is the content. */
#include "toolcall.h"
#include "strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_open[] = "<tool_call>";
static const char k_close[] = "</tool_call>";


/* ==== Python-style JSON serialisation (tojson) ==== */

static void put_string(strbuf *b, const char *s)
{
    strbuf_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        char esc[8];
        switch (*p) {
        case '"':  strbuf_add(b, "\\\"", 2); break;
        case '\\': strbuf_add(b, "\\\\", 2); break;
        case '\n': strbuf_add(b, "\\n", 2); break;
        case '\r': strbuf_add(b, "\\r", 2); break;
        case '\t': strbuf_add(b, "\\t", 2); break;
        case '\b': strbuf_add(b, "\\b", 2); break;
        case '\f': strbuf_add(b, "\\f", 2); break;
        default:
            if (*p < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", *p); strbuf_str(b, esc); }
            else strbuf_add(b, (const char *)p, 1);   /* ensure_ascii=False: UTF-8 kept */
        }
    }
    strbuf_add(b, "\"", 1);
}

/* cJSON keeps numbers as doubles, so 1 and 1.0 are the same value: integral
 * values print as integers (what the case files and models write). */
static void put_number(strbuf *b, double v)
{
    char s[40];
    if (!isfinite(v)) snprintf(s, sizeof s, "null");
    else if (v == floor(v) && fabs(v) < 1e16) snprintf(s, sizeof s, "%.0f", v);
    else {
        snprintf(s, sizeof s, "%.15g", v);           /* shortest form that reads back */
        if (strtod(s, NULL) != v) snprintf(s, sizeof s, "%.17g", v);
    }
    strbuf_str(b, s);
}

static void put_value(strbuf *b, const cJSON *v)
{
    if (!v || cJSON_IsNull(v)) { strbuf_str(b, "null"); return; }
    if (cJSON_IsFalse(v)) { strbuf_str(b, "false"); return; }
    if (cJSON_IsTrue(v)) { strbuf_str(b, "true"); return; }
    if (cJSON_IsNumber(v)) { put_number(b, v->valuedouble); return; }
    if (cJSON_IsString(v)) { put_string(b, v->valuestring); return; }
    if (cJSON_IsRaw(v)) { strbuf_str(b, v->valuestring ? v->valuestring : "null"); return; }
    const int obj = cJSON_IsObject(v);
    strbuf_add(b, obj ? "{" : "[", 1);
    int first = 1;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (!first) strbuf_add(b, ", ", 2);
        first = 0;
        if (obj) { put_string(b, c->string); strbuf_add(b, ": ", 2); }
        put_value(b, c);
    }
    strbuf_add(b, obj ? "}" : "]", 1);
}

char *toolcall_tojson(const cJSON *v)
{
    strbuf b = { 0 };
    put_value(&b, v);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}

/* ==== Calls ==== */

const char *toolcall_format_name(int format)
{
    switch (format) {
    case TOOLCALL_TAGGED: return "tagged";
    case TOOLCALL_BARE:   return "bare";
    default:              return "none";
    }
}

static void set_error(toolcall_list *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(toolcall_list *l, const char *fmt, ...)
{
    l->n_malformed++;
    if (l->error[0]) return;    /* the first reason wins */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->error, sizeof l->error, fmt, ap);
    va_end(ap);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Return values of take_call. */
enum { CALL_OK = 0, CALL_NOT_A_CALL = 1, CALL_BAD = 2, CALL_OOM = -1 };

/* Turn a parsed JSON object into a call appended to l. `what` names the
 * place for error messages. CALL_NOT_A_CALL when the object has no "name"
 * (bare JSON that is some other object); CALL_BAD with the reason recorded
 * when it has a name but is not a valid call. */
static int take_call(toolcall_list *l, const cJSON *obj, const char *what, int strict)
{
    if (!cJSON_IsObject(obj)) {
        if (!strict) return CALL_NOT_A_CALL;
        set_error(l, "%s: not a JSON object", what);
        return CALL_BAD;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    /* bare JSON is a call only with both keys: {"name": "Paris"} is an answer */
    if (!strict && (!name || !args)) return CALL_NOT_A_CALL;
    if (!name) {
        set_error(l, "%s: no \"name\"", what);
        return CALL_BAD;
    }
    if (!cJSON_IsString(name) || !name->valuestring[0]) {
        set_error(l, "%s: \"name\" is not a non-empty string", what);
        return CALL_BAD;
    }
    cJSON *copy = NULL;
    if (!args) {
        copy = cJSON_CreateObject();
    } else if (cJSON_IsObject(args)) {
        copy = cJSON_Duplicate(args, 1);
    } else if (cJSON_IsString(args)) {
        copy = cJSON_Parse(args->valuestring);
        if (!copy || !cJSON_IsObject(copy)) {
            cJSON_Delete(copy);
            set_error(l, "%s: \"arguments\" is a string that is not a JSON object", what);
            return CALL_BAD;
        }
    } else {
        set_error(l, "%s: \"arguments\" is not an object", what);
        return CALL_BAD;
    }
    if (!copy) return CALL_OOM;
    toolcall *nc = realloc(l->calls, sizeof *nc * (size_t)(l->n_calls + 1));
    if (!nc) { cJSON_Delete(copy); return CALL_OOM; }
    l->calls = nc;
    toolcall *c = &l->calls[l->n_calls];
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(obj, "id");
    c->name = strdup(name->valuestring);
    c->arguments = copy;
    c->id = cJSON_IsString(id) ? strdup(id->valuestring) : NULL;
    if (!c->name || (cJSON_IsString(id) && !c->id)) {
        free(c->name);
        free(c->id);
        cJSON_Delete(copy);
        return CALL_OOM;
    }
    l->n_calls++;
    return CALL_OK;
}

/* A JSON value that is a call or an array of calls. */
static int take_value(toolcall_list *l, const cJSON *v, const char *what, int strict)
{
    if (!cJSON_IsArray(v)) return take_call(l, v, what, strict);
    if (!v->child) return CALL_NOT_A_CALL;
    /* bare: an array is a list of calls only if its first element is one */
    if (!strict) {
        const cJSON *c = v->child;
        if (!cJSON_IsObject(c) || !cJSON_GetObjectItemCaseSensitive(c, "name") ||
            !(cJSON_GetObjectItemCaseSensitive(c, "arguments") || cJSON_GetObjectItemCaseSensitive(c, "parameters")))
            return CALL_NOT_A_CALL;
    }
    int rc = CALL_OK;
    for (const cJSON *c = v->child; c; c = c->next) {
        int r = take_call(l, c, what, 1);
        if (r == CALL_OOM) return r;
        if (r != CALL_OK) rc = CALL_BAD;
    }
    return rc;
}

/* Cut <think>...</think> blocks out of s (in place); an unclosed <think>
 * runs to the end. Also a lone leading </think> (templates that open the
 * think block in the prompt): everything before it is reasoning. */
static void cut_think(char *s)
{
    char *close0 = strstr(s, "</think>");
    char *open0 = strstr(s, "<think>");
    if (close0 && (!open0 || close0 < open0)) memmove(s, close0 + 8, strlen(close0 + 8) + 1);
    char *p;
    while ((p = strstr(s, "<think>")) != NULL) {
        char *q = strstr(p + 7, "</think>");
        if (!q) { *p = '\0'; break; }
        memmove(p, q + 8, strlen(q + 8) + 1);
    }
}

/* Trim s[0..n) into a new string appended to content. */
static void add_content(strbuf *content, const char *s, size_t n)
{
    if (content->n && n) strbuf_add(content, "\n", 1);
    strbuf_add(content, s, n);
}

static char *trimmed_dup(const char *s, size_t n)
{
    while (n && is_space(*s)) { s++; n--; }
    while (n && is_space(s[n - 1])) n--;
    char *r = malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

static int parse_tagged(toolcall_list *l, const char *s, strbuf *content)
{
    int k = 0;
    const char *p = s;
    for (;;) {
        const char *open = strstr(p, k_open);
        if (!open) { add_content(content, p, strlen(p)); break; }
        add_content(content, p, (size_t)(open - p));
        const char *body = open + sizeof k_open - 1;
        const char *close = strstr(body, k_close);
        const char *next_open = strstr(body, k_open);
        size_t blen;
        k++;
        char what[48];
        snprintf(what, sizeof what, "tool_call %d", k);
        if (!close || (next_open && next_open < close)) {
            /* no closing tag before the next block (or the end): the block
             * runs to there and is malformed whatever it holds */
            blen = next_open ? (size_t)(next_open - body) : strlen(body);
            if (!next_open) l->unclosed = 1;
            set_error(l, "%s: no closing </tool_call>", what);
            p = body + blen;
            if (!next_open) break;
            continue;
        }
        blen = (size_t)(close - body);
        const char *end = NULL;
        cJSON *v = cJSON_ParseWithLengthOpts(body, blen, &end, 0);
        if (!v) {
            set_error(l, "%s: not valid JSON at byte %td", what, end ? end - body : (ptrdiff_t)0);
        } else {
            while (end && end < body + blen && is_space(*end)) end++;
            if (end && end < body + blen) set_error(l, "%s: text after the JSON object", what);
            else if (take_value(l, v, what, 1) == CALL_OOM) { cJSON_Delete(v); return -1; }
            cJSON_Delete(v);
        }
        p = close + sizeof k_close - 1;
    }
    return 0;
}

/* Remove ``` fence markers (with a language word after the opening one)
 * from s in place: the fence around a bare JSON call is not content. */
static void cut_fences(char *s)
{
    char *p;
    while ((p = strstr(s, "```")) != NULL) {
        char *q = p + 3;
        while (*q >= 'a' && *q <= 'z') q++;
        memmove(p, q, strlen(q) + 1);
    }
}

/* Bare JSON: every JSON object or array in the text that is a call (a
 * "name" and "arguments"/"parameters") or a list of calls is taken out.
 * Text that begins (after an optional ```json fence) with '{' but does not
 * parse is a malformed call, and the rest of the text goes with it. */
static int parse_bare(toolcall_list *l, const char *s, strbuf *content)
{
    const char *t = s;
    while (is_space(*t)) t++;
    if (!strncmp(t, "```", 3)) {
        t += 3;
        while (*t >= 'a' && *t <= 'z') t++;
        while (is_space(*t)) t++;
    }
    const char *whole = (*t == '{') ? t : NULL;
    const char *p = s, *copied = s;
    int k = 0;
    while (*p) {
        if (*p != '{' && *p != '[') { p++; continue; }
        const char *end = NULL;
        cJSON *v = cJSON_ParseWithOpts(p, &end, 0);
        if (!v) {
            if (p == whole) {
                set_error(l, "bare JSON: not valid JSON at byte %td", end && end >= p ? end - s : p - s);
                l->format = TOOLCALL_BARE;
                add_content(content, copied, (size_t)(p - copied));
                return 0;
            }
            p++;
            continue;
        }
        char what[48];
        snprintf(what, sizeof what, "bare JSON %d", k + 1);
        int r = take_value(l, v, what, 0);
        cJSON_Delete(v);
        if (r == CALL_OOM) return -1;
        if (r == CALL_NOT_A_CALL) { p = end; continue; }   /* some other JSON: content */
        k++;
        l->format = TOOLCALL_BARE;
        add_content(content, copied, (size_t)(p - copied));
        p = copied = end;
    }
    add_content(content, copied, strlen(copied));
    return 0;
}

int toolcall_parse(const char *text, size_t len, toolcall_list *out)
{
    memset(out, 0, sizeof *out);
    char *s = malloc(len + 1);
    if (!s) return -1;
    memcpy(s, text, len);
    s[len] = '\0';          /* an embedded NUL ends the text */
    cut_think(s);
    strbuf content = { 0 };
    int rc;
    if (strstr(s, k_open)) {
        out->format = TOOLCALL_TAGGED;
        rc = parse_tagged(out, s, &content);
    } else {
        rc = parse_bare(out, s, &content);
    }
    free(s);
    if (rc == 0 && !content.oom) {
        if (out->format == TOOLCALL_BARE && content.p) cut_fences(content.p);
        content.n = content.p ? strlen(content.p) : 0;
        out->content = trimmed_dup(content.p ? content.p : "", content.n);
        if (!out->content) rc = -1;
    } else {
        rc = -1;
    }
    free(content.p);
    return rc;
}

void toolcall_list_free(toolcall_list *l)
{
    if (!l) return;
    for (int i = 0; i < l->n_calls; i++) {
        free(l->calls[i].name);
        free(l->calls[i].id);
        cJSON_Delete(l->calls[i].arguments);
    }
    free(l->calls);
    free(l->content);
    memset(l, 0, sizeof *l);
}

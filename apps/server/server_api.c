/* server_api: the OpenAI wire format for `strata serve`: request JSON in,
 * response JSON out. Pure functions over cJSON; no engine, no sockets.
 *
 * Tools: the engine's chat templates take (role, content) pairs, so the
 * tool definitions are given to the model the way Qwen2.5/Qwen3 (Hermes
 * style) templates render them: a "# Tools" block with the JSON signatures
 * in <tools></tools> appended to the system message, earlier assistant
 * tool_calls written back as <tool_call>{...}</tool_call> blocks, and "tool"
 * messages sent as user turns wrapped in <tool_response></tool_response>.
 * The reply is parsed with toolcall.c (tagged or bare JSON calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "toolcall.h"
#include "strbuf.h"


static char *xstrndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ==== requests ==== */

static int fail(char *msg, size_t cap, const char *fmt, const char *what)
{
    snprintf(msg, cap, fmt, what);
    return 400;
}

/* Message content: a string, null, or an array of {"type":"text","text":...}
 * parts (concatenated). Returns a malloc'd string, or NULL with msg set. */
static char *content_text(const cJSON *c, char *msg, size_t cap)
{
    if (!c || cJSON_IsNull(c)) return xstrndup("", 0);
    if (cJSON_IsString(c)) return xstrndup(c->valuestring, strlen(c->valuestring));
    if (cJSON_IsArray(c)) {
        strbuf b = { 0 };
        strbuf_str(&b, "");
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
                free(b.p);
                fail(msg, cap, "%s", "'content' parts must be {\"type\": \"text\", \"text\": string} (only text is supported)");
                return NULL;
            }
            strbuf_str(&b, tx->valuestring);
        }
        if (b.oom) { free(b.p); fail(msg, cap, "%s", "out of memory"); return NULL; }
        return b.p;
    }
    fail(msg, cap, "%s", "'content' must be a string, an array of text parts or null");
    return NULL;
}

static int add_msg(srv_req *r, const char *role, char *content)
{
    engine_chat_msg *m = realloc(r->msgs, (r->n_msgs + 1) * sizeof *m);
    if (!m) { free(content); return -1; }
    r->msgs = m;
    r->msgs[r->n_msgs++] = (engine_chat_msg){ role, content };
    return 0;
}

/* The "# Tools" system block, as Qwen3's template writes it. */
static char *tools_block(const cJSON *tools, char *msg, size_t cap)
{
    strbuf b = { 0 };
    strbuf_str(&b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(t) || (ty && !cJSON_IsString(ty)) || !cJSON_IsObject(fn) || !cJSON_IsString(nm)) {
            free(b.p);
            fail(msg, cap, "%s", "each tool must be {\"type\": \"function\", \"function\": {\"name\": string, ...}}");
            return NULL;
        }
        char *j = toolcall_tojson(t);
        if (!j) { b.oom = 1; break; }
        strbuf_str(&b, "\n");
        strbuf_str(&b, j);
        free(j);
    }
    strbuf_str(&b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>");
    if (b.oom) { free(b.p); fail(msg, cap, "%s", "out of memory"); return NULL; }
    return b.p;
}

/* An assistant message's tool_calls appended as <tool_call> blocks. */
static int append_tool_calls(strbuf *b, const cJSON *calls, char *msg, size_t cap)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(nm) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args)))
            return fail(msg, cap, "%s", "'tool_calls' entries need function.name (string) and function.arguments");
        cJSON *parsed = NULL;
        if (cJSON_IsString(args)) parsed = cJSON_Parse(args->valuestring);
        const cJSON *a = parsed ? parsed : (cJSON_IsObject(args) ? args : NULL);
        char *aj = a ? toolcall_tojson(a) : NULL;
        cJSON *nmj = cJSON_CreateString(nm->valuestring);
        char *nms = nmj ? toolcall_tojson(nmj) : NULL;
        if (b->n) strbuf_str(b, "\n");
        strbuf_str(b, "<tool_call>\n{\"name\": ");
        strbuf_str(b, nms ? nms : "\"\"");
        strbuf_str(b, ", \"arguments\": ");
        strbuf_str(b, aj ? aj : (cJSON_IsString(args) ? args->valuestring : "{}"));
        strbuf_str(b, "}\n</tool_call>");
        free(aj);
        free(nms);
        cJSON_Delete(nmj);
        cJSON_Delete(parsed);
    }
    return 0;
}

static int parse_messages(srv_req *r, const cJSON *msgs, const cJSON *tools, int use_tools, char *msg, size_t cap)
{
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(msg, cap, "%s", "'messages' must be a non-empty array");
    char *tb = NULL;
    if (use_tools && !(tb = tools_block(tools, msg, cap))) return 400;
    int first = 1;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) { free(tb); return fail(msg, cap, "%s", "each message needs a string 'role'"); }
        const char *rs = role->valuestring;
        const char *lit;
        if (!strcmp(rs, "system") || !strcmp(rs, "developer")) lit = "system";
        else if (!strcmp(rs, "user")) lit = "user";
        else if (!strcmp(rs, "assistant")) lit = "assistant";
        else if (!strcmp(rs, "tool")) lit = "tool";
        else { free(tb); return fail(msg, cap, "unknown message role '%s'", rs); }
        char *text = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), msg, cap);
        if (!text) { free(tb); return 400; }
        strbuf b = { 0 };
        if (tb && first && !strcmp(lit, "system")) {
            strbuf_str(&b, text);
            strbuf_str(&b, "\n\n");
            strbuf_str(&b, tb);
            free(text);
            free(tb);
            tb = NULL;
        } else if (!strcmp(lit, "tool")) {
            strbuf_str(&b, "<tool_response>\n");
            strbuf_str(&b, text);
            strbuf_str(&b, "\n</tool_response>");
            free(text);
            lit = "user";
        } else if (!strcmp(lit, "assistant") && cJSON_GetObjectItemCaseSensitive(m, "tool_calls") &&
                   !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (!cJSON_IsArray(tc)) { free(text); free(tb); return fail(msg, cap, "%s", "'tool_calls' must be an array"); }
            strbuf_str(&b, text);
            free(text);
            if (append_tool_calls(&b, tc, msg, cap)) { free(b.p); free(tb); return 400; }
        } else {
            b.p = text;
        }
        if (b.oom || !b.p) { free(b.p); free(tb); return fail(msg, cap, "%s", "out of memory"); }
        if (tb && first) {  /* no system message: the tools block is one */
            char *t2 = tb;
            tb = NULL;
            if (add_msg(r, "system", t2)) { free(b.p); return fail(msg, cap, "%s", "out of memory"); }
        }
        first = 0;
        if (add_msg(r, lit, b.p)) { free(tb); return fail(msg, cap, "%s", "out of memory"); }
    }
    free(tb);
    return 0;
}

static int get_number(const cJSON *root, const char *key, double lo, double hi, double *out, int *given,
                      char *msg, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(msg, cap, "'%s' must be a number from %g to %g", key, lo, hi);
        return 400;
    }
    *out = v->valuedouble;
    if (given) *given = 1;
    return 0;
}

static int get_int(const cJSON *root, const char *key, double lo, double hi, double *out, int *given,
                   char *msg, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble || v->valuedouble < lo ||
        v->valuedouble > hi) {
        snprintf(msg, cap, "'%s' must be an integer from %.0f to %.0f", key, lo, hi);
        return 400;
    }
    *out = v->valuedouble;
    if (given) *given = 1;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, int *out, char *msg, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return fail(msg, cap, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int srv_req_parse(int kind, const char *body, size_t len, srv_req *r, char *msg, size_t cap)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->so = sampler_default_opts();
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return fail(msg, cap, "%s", "the request body is not valid JSON");
    int rc = 400;
    if (!cJSON_IsObject(root)) { fail(msg, cap, "%s", "the request body must be a JSON object"); goto done; }
    double d;
    int given = 0;
    if (get_bool(root, "stream", &r->stream, msg, cap)) goto done;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, msg, cap)) goto done;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) { fail(msg, cap, "%s", "'stream_options' must be an object"); goto done; }
        if (get_bool(so, "include_usage", &r->include_usage, msg, cap)) goto done;
    }
    const char *mt_keys[] = { "max_tokens", "max_completion_tokens", "n_predict" };
    for (int k = 0; k < 3; k++) {
        given = 0;
        if (get_int(root, mt_keys[k], -1, 1e9, &d, &given, msg, cap)) goto done;
        if (given) r->max_tokens = (int)d;
    }
    given = 0;
    if (get_number(root, "temperature", 0, 100, &d, &given, msg, cap)) goto done;
    if (given) r->so.temp = (float)d;
    given = 0;
    if (get_number(root, "top_p", 0, 1, &d, &given, msg, cap)) goto done;
    if (given) r->so.top_p = (float)d;
    given = 0;
    if (get_number(root, "min_p", 0, 1, &d, &given, msg, cap)) goto done;
    if (given) r->so.min_p = (float)d;
    given = 0;
    if (get_int(root, "top_k", -1, 1e9, &d, &given, msg, cap)) goto done;
    if (given) r->so.top_k = (int)d;
    given = 0;
    if (get_number(root, "repeat_penalty", 1e-6, 1e9, &d, &given, msg, cap)) goto done;
    if (given) r->so.repeat_penalty = (float)d;
    given = 0;
    if (get_int(root, "seed", -1, 4294967295.0, &d, &given, msg, cap)) goto done;
    if (given && d >= 0 && d < 4294967295.0) { r->so.seed = (uint32_t)d; r->seed_set = 1; }
    given = 0;
    if (get_int(root, "n", 1, 1, &d, &given, msg, cap)) goto done;

    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (cJSON_IsString(stop)) {
        if (*stop->valuestring && !(r->stop[r->n_stop++] = strdup(stop->valuestring))) goto oom;
    } else if (cJSON_IsArray(stop)) {
        const cJSON *s;
        cJSON_ArrayForEach(s, stop) {
            if (!cJSON_IsString(s)) { fail(msg, cap, "%s", "'stop' must be a string or an array of strings"); goto done; }
            if (r->n_stop == SRV_MAX_STOP) { snprintf(msg, cap, "'stop' takes at most %d strings", SRV_MAX_STOP); goto done; }
            if (*s->valuestring && !(r->stop[r->n_stop++] = strdup(s->valuestring))) goto oom;
        }
    } else if (stop && !cJSON_IsNull(stop)) {
        fail(msg, cap, "%s", "'stop' must be a string or an array of strings");
        goto done;
    }

    if (kind == SRV_COMPLETION) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = cJSON_GetArrayItem(p, 0);
        if (!cJSON_IsString(p)) { fail(msg, cap, "%s", "'prompt' must be a string (or an array of one string)"); goto done; }
        if (!(r->prompt = strdup(p->valuestring))) goto oom;
    } else {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
        if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) { fail(msg, cap, "%s", "'tools' must be an array"); goto done; }
        int use = cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0;
        if (tc && !cJSON_IsNull(tc)) {
            if (cJSON_IsString(tc)) {
                if (!strcmp(tc->valuestring, "none")) use = 0;
                else if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "required")) {
                    fail(msg, cap, "%s", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
                    goto done;
                }
            } else if (!cJSON_IsObject(tc)) {
                fail(msg, cap, "%s", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object");
                goto done;
            }
        }
        r->tools = use;
        if (parse_messages(r, cJSON_GetObjectItemCaseSensitive(root, "messages"), tools, use, msg, cap)) goto done;
    }
    rc = 0;
    goto done;
oom:
    fail(msg, cap, "%s", "out of memory");
done:
    cJSON_Delete(root);
    return rc;
}

void srv_req_free(srv_req *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->prompt);
    memset(r, 0, sizeof *r);
}

/* ==== responses ==== */

/* NUL cannot live in a cJSON string: utf8_clean writes it as the overlong
 * C0 80 (never valid UTF-8, so never in cleaned text) and this turns it
 * into \u0000 in the printed JSON. */
static char *print_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s || !strstr(s, "\xC0\x80")) return s;
    size_t n = 0;
    for (const char *q = s; (q = strstr(q, "\xC0\x80")); q += 2) n++;
    char *t = malloc(strlen(s) + 4 * n + 1), *w = t;
    if (t) {
        for (const char *q = s; *q;) {
            if (q[0] == '\xC0' && q[1] == '\x80') { memcpy(w, "\\u0000", 6); w += 6; q += 2; }
            else *w++ = *q++;
        }
        *w = '\0';
    }
    free(s);
    return t;
}

/* A copy of s[0..n) that is valid UTF-8: each maximal ill-formed subpart
 * becomes U+FFFD (the Unicode recommended practice, which Python's and
 * browsers' decoders follow), as llama-server replaces invalid bytes. Random
 * and small models emit byte tokens that do not form characters. */
static char *utf8_clean(const char *s, size_t n)
{
    char *t = malloc(3 * n + 1), *o = t;
    if (!t) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c == 0) { memcpy(o, "\xC0\x80", 2); o += 2; i++; continue; }
        if (c < 0x80) { *o++ = (char)c; i++; continue; }
        size_t need = 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        size_t k = 1;
        if (need) {
            while (k <= need && i + k < n && p[i + k] >= (k == 1 ? lo : 0x80) && p[i + k] <= (k == 1 ? hi : 0xBF)) k++;
            if (k == need + 1) { memcpy(o, p + i, k); o += k; i += k; continue; }
        }
        memcpy(o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k;
    }
    *o = '\0';
    return t;
}

static cJSON *add_str_n(cJSON *o, const char *key, const char *s, size_t n)
{
    char *t = utf8_clean(s, n);
    cJSON *v = t ? cJSON_AddStringToObject(o, key, t) : NULL;
    free(t);
    return v;
}

static cJSON *usage_obj(const srv_result *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->prompt_tokens + r->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->cached_tokens);
    return u;
}

/* llama-server's "timings" object. */
static cJSON *timings_obj(const srv_result *r)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "cache_n", r->cached_tokens);
    cJSON_AddNumberToObject(t, "prompt_n", r->prompt_tokens - r->cached_tokens);
    cJSON_AddNumberToObject(t, "prompt_ms", r->prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_second",
                            r->prompt_ms > 0 ? 1e3 * (r->prompt_tokens - r->cached_tokens) / r->prompt_ms : 0.0);
    cJSON_AddNumberToObject(t, "predicted_n", r->completion_tokens);
    cJSON_AddNumberToObject(t, "predicted_ms", r->gen_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second", r->gen_ms > 0 ? 1e3 * r->completion_tokens / r->gen_ms : 0.0);
    return t;
}

/* tool_calls array from a parsed list; call ids are the model's or
 * "call_<response id>_<i>". */
static cJSON *tool_calls_arr(const toolcall_list *l, const srv_result *r, int with_index)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < l->n_calls; i++) {
        cJSON *c = cJSON_CreateObject();
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        char idb[160];
        snprintf(idb, sizeof idb, "call_%s_%d", r->id, i);
        cJSON_AddStringToObject(c, "id", l->calls[i].id ? l->calls[i].id : idb);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", l->calls[i].name);
        char *args = cJSON_PrintUnformatted(l->calls[i].arguments);
        cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
        free(args);
        cJSON_AddItemToArray(arr, c);
    }
    return arr;
}

char *srv_build_response(const srv_req *rq, const srv_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", rq->kind == SRV_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    const char *finish = r->finish;
    if (rq->kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        toolcall_list l;
        int have = 0;
        if (rq->tools && toolcall_parse(r->text, r->len, &l) == 0 && l.n_calls > 0) have = 1;
        if (have) {
            if (l.content && *l.content) add_str_n(m, "content", l.content, strlen(l.content));
            else cJSON_AddNullToObject(m, "content");
            cJSON_AddItemToObject(m, "tool_calls", tool_calls_arr(&l, r, 0));
            finish = "tool_calls";
        } else {
            add_str_n(m, "content", r->text, r->len);
        }
        if (rq->tools) toolcall_list_free(&l);
    } else {
        add_str_n(ch, "text", r->text, r->len);
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish);
    cJSON_AddItemToObject(o, "usage", usage_obj(r));
    cJSON_AddItemToObject(o, "timings", timings_obj(r));
    return print_free(o);
}

static char *sse(cJSON *o)
{
    char *j = print_free(o);
    if (!j) return NULL;
    size_t n = strlen(j);
    char *s = malloc(n + 9);
    if (s) { memcpy(s, "data: ", 6); memcpy(s + 6, j, n); memcpy(s + 6 + n, "\n\n", 3); }
    free(j);
    return s;
}

char *srv_sse_chunk(const srv_req *rq, const srv_result *r, const char *delta, size_t delta_len, int role_chunk,
                    const char *finish, const char *full_text, size_t full_len)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", rq->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    if (rq->kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role_chunk) {
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
        }
        if (delta) add_str_n(d, "content", delta, delta_len);
        if (finish && rq->tools) {
            /* tool requests stream nothing until the end: the whole reply is
             * parsed here and sent as content or tool_calls in this chunk */
            toolcall_list l;
            if (toolcall_parse(full_text, full_len, &l) == 0 && l.n_calls > 0) {
                if (l.content && *l.content) add_str_n(d, "content", l.content, strlen(l.content));
                cJSON_AddItemToObject(d, "tool_calls", tool_calls_arr(&l, r, 1));
                finish = "tool_calls";
            } else if (full_len) {
                add_str_n(d, "content", full_text, full_len);
            }
            toolcall_list_free(&l);
        }
    } else {
        add_str_n(ch, "text", delta ? delta : "", delta ? delta_len : 0);
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (finish) cJSON_AddItemToObject(o, "timings", timings_obj(r));
    return sse(o);
}

char *srv_sse_usage(const srv_req *rq, const srv_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", rq->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_obj(r));
    return sse(o);
}

char *srv_error_json(int status, const char *message)
{
    const char *type = status == 400 || status == 413 ? "invalid_request_error"
                     : status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 405 ? "not_supported_error"
                     : status == 503 ? "unavailable_error" : "server_error";
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddNumberToObject(e, "code", status);
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    return print_free(o);
}

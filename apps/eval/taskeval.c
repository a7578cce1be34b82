/* taskeval: `strata taskeval`, the tool-call task evaluator.
 *
 *   strata taskeval -m MODEL --cases FILE.jsonl [-n N] [--arm NAME] [--json OUT] [engine options]
 *   strata taskeval --replay OUTPUTS --cases FILE.jsonl [--arm NAME] [--json OUT]
 *   strata taskeval --compare A.json B.json
 *
 * Each case (one JSON object per line; docs/TASKEVAL.md) is a conversation,
 * the tool schemas offered and what the model should do: call tools with
 * given argument values, or answer in text. The conversation is formatted
 * with the model's chat template (engine_chat_apply) and generated greedily;
 * the output's tool calls are parsed (toolcall.h) and scored: well-formed,
 * right tool, each expected argument exact and of the right JSON type
 * (strings, numbers, booleans, ids), completed. --replay scores given
 * outputs without a model, which is how the scorer is tested. --compare
 * pairs two arms' --json results by case id: which cases changed, and an
 * exact two-sided sign test.
 *
 * Tools: engine_chat_apply takes roles and contents only, so the tool
 * schemas are rendered into the system message here, with the text of the
 * model's own template: Qwen2.5/Qwen3's ("# Tools ... <tools></tools> XML
 * tags") when the GGUF's template has it, else strata mkmodel's ChatML
 * template (src/mkmodel/mkmodel.c k_chat_template). Tool results (role
 * "tool") and earlier assistant calls are rendered as those templates do.
 *
 * Deliberately not done: sampling (greedy only, so arms differ only by
 * configuration), schema validation of calls beyond the expected values,
 * executing tools or multi-step episodes.
 *
 * Exit codes: 0 done (whatever the scores), 1 runtime error (model, bad
 * case or result file, I/O), 2 usage. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "engine.h"
#include "toolcall.h"
#include "strbuf.h"
#include "util/err.h"

#define CMD "taskeval"

/* ==== Strings ==== */

static void sb_json(strbuf *b, const cJSON *v)
{
    char *s = toolcall_tojson(v);
    if (!s) { b->oom = 1; return; }
    strbuf_str(b, s);
    free(s);
}

/* A copy of s with every byte that is not part of a valid UTF-8 sequence
 * replaced by U+FFFD: JSON text must be UTF-8, and a random-weight model
 * writes arbitrary bytes. NULL when out of memory. */
static char *utf8_clean(const char *s)
{
    strbuf b = { 0 };
    const unsigned char *p = (const unsigned char *)s;
    strbuf_str(&b, "");
    while (*p) {
        int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
        int ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (p[i] & 0xC0) == 0x80;
        if (ok && n == 2) ok = *p >= 0xC2;                                    /* overlong */
        if (ok && n == 3) {
            unsigned cp = (unsigned)(p[0] & 0x0F) << 12 | (unsigned)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);                /* overlong, surrogates */
        }
        if (ok && n == 4) {
            unsigned cp = (unsigned)(p[0] & 0x07) << 18 | (unsigned)(p[1] & 0x3F) << 12 | (unsigned)(p[2] & 0x3F) << 6 |
                          (p[3] & 0x3F);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) { strbuf_add(&b, (const char *)p, (size_t)n); p += n; }
        else { strbuf_str(&b, "\xEF\xBF\xBD"); p++; }
    }
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}

/* Add s to o as key, made valid UTF-8 first. */
static void add_text(cJSON *o, const char *key, const char *s)
{
    char *c = utf8_clean(s ? s : "");
    cJSON_AddStringToObject(o, key, c ? c : "");
    free(c);
}

/* ==== Cases ==== */

enum { CASE_CALL = 0, CASE_ANSWER = 1 };
enum { MATCH_CONTAINS = 0, MATCH_EXACT = 1 };

typedef struct tcase {
    int          line;          /* 1-based line in the case file */
    cJSON       *json;          /* owned: the parsed line; everything below is borrowed from it */
    const char  *id;
    const cJSON *messages;      /* array of {role, content[, tool_calls]} */
    const cJSON *tools;         /* array or NULL */
    int          kind;          /* CASE_CALL / CASE_ANSWER */
    const cJSON *calls;         /* expected.calls: array of {name, arguments[, ids]} */
    const char  *answer;        /* expected.answer */
    int          match;         /* MATCH_* for answers */
    int          allow_extra;   /* expected.allow_extra_args */
} tcase;

typedef struct caseset {
    tcase *c;
    int    n;
} caseset;

static void caseset_free(caseset *cs)
{
    for (int i = 0; i < cs->n; i++) cJSON_Delete(cs->c[i].json);
    free(cs->c);
    cs->c = NULL;
    cs->n = 0;
}

/* Check one parsed case line; returns 0 or a CLI error (message printed). */
static int case_check(const char *path, tcase *c)
{
    const cJSON *j = c->json;
#define BAD(...) do { fprintf(stderr, "strata " CMD ": %s:%d: ", path, c->line); fprintf(stderr, __VA_ARGS__); \
                      fputc('\n', stderr); return CLI_ERR; } while (0)
    if (!cJSON_IsObject(j)) BAD("a case must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (!cJSON_IsString(id) || !id->valuestring[0]) BAD("\"id\" must be a non-empty string");
    c->id = id->valuestring;
    c->messages = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsArray(c->messages) || !c->messages->child) BAD("\"messages\" must be a non-empty array");
    int k = 0;
    for (const cJSON *m = c->messages->child; m; m = m->next, k++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) BAD("messages[%d] needs a string \"role\"", k);
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "tool"))
            BAD("messages[%d]: role must be system, user, assistant or tool, got \"%s\"", k, role->valuestring);
        if (!cJSON_IsString(content) && !(cJSON_IsNull(content) || (!content && tc)))
            BAD("messages[%d] needs a string \"content\"", k);
        if (tc && (!cJSON_IsArray(tc) || strcmp(role->valuestring, "assistant")))
            BAD("messages[%d]: \"tool_calls\" must be an array on an assistant message", k);
    }
    c->tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    if (c->tools && !cJSON_IsArray(c->tools)) BAD("\"tools\" must be an array of tool schemas");
    if (c->tools)
        for (const cJSON *t = c->tools->child; t; t = t->next)
            if (!cJSON_IsObject(t)) BAD("\"tools\" must hold JSON objects");
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(j, "expected");
    if (!cJSON_IsObject(exp)) BAD("\"expected\" must be an object with \"calls\" or \"answer\"");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(exp, "calls");
    const cJSON *answer = cJSON_GetObjectItemCaseSensitive(exp, "answer");
    if (!!calls == !!answer) BAD("\"expected\" needs exactly one of \"calls\" and \"answer\"");
    if (calls) {
        if (!cJSON_IsArray(calls) || !calls->child) BAD("expected.calls must be a non-empty array");
        k = 0;
        for (const cJSON *x = calls->child; x; x = x->next, k++) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(x, "arguments");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(x, "ids");
            if (!cJSON_IsObject(x) || !cJSON_IsString(name)) BAD("expected.calls[%d] needs a string \"name\"", k);
            if (args && !cJSON_IsObject(args)) BAD("expected.calls[%d].arguments must be an object", k);
            if (ids) {
                if (!cJSON_IsArray(ids)) BAD("expected.calls[%d].ids must be an array of argument names", k);
                for (const cJSON *s = ids->child; s; s = s->next)
                    if (!cJSON_IsString(s)) BAD("expected.calls[%d].ids must be an array of argument names", k);
            }
        }
        c->kind = CASE_CALL;
        c->calls = calls;
    } else {
        if (!cJSON_IsString(answer)) BAD("expected.answer must be a string");
        c->kind = CASE_ANSWER;
        c->answer = answer->valuestring;
        const cJSON *match = cJSON_GetObjectItemCaseSensitive(exp, "match");
        if (match && !cJSON_IsString(match)) BAD("expected.match must be \"contains\" or \"exact\"");
        if (!match || !strcmp(match->valuestring, "contains")) c->match = MATCH_CONTAINS;
        else if (!strcmp(match->valuestring, "exact")) c->match = MATCH_EXACT;
        else BAD("expected.match must be \"contains\" or \"exact\", got \"%s\"", match->valuestring);
    }
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(exp, "allow_extra_args");
    if (extra && !cJSON_IsBool(extra)) BAD("expected.allow_extra_args must be true or false");
    c->allow_extra = cJSON_IsTrue(extra);
#undef BAD
    return 0;
}

/* Read a JSONL case file: one case per non-blank line. A bad line is a
 * one-line error naming the file, the line and (for JSON) the column. */
static int cases_load(const char *path, caseset *cs)
{
    size_t len;
    char *text = cli_read_file(CMD, path, &len);
    if (!text) return CLI_ERR;
    int rc = 0, line = 0;
    char *p = text;
    while (*p && !rc) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        size_t a = 0;
        while (a < n && (p[a] == ' ' || p[a] == '\t' || p[a] == '\r')) a++;
        if (a < n) {
            const char *end = NULL;
            cJSON *j = cJSON_ParseWithLengthOpts(p, n, &end, 0);
            size_t at = end ? (size_t)(end - p) : 0;
            while (j && at < n && (p[at] == ' ' || p[at] == '\t' || p[at] == '\r')) at++;
            if (!j || at < n) {
                cJSON_Delete(j);
                rc = cli_fail(CMD, CLI_ERR, "%s:%d: not valid JSON at column %zu", path, line, at + 1);
                break;
            }
            tcase *nc = realloc(cs->c, sizeof *nc * (size_t)(cs->n + 1));
            if (!nc) { cJSON_Delete(j); rc = cli_fail(CMD, CLI_ERR, "out of memory"); break; }
            cs->c = nc;
            tcase *c = &cs->c[cs->n++];
            memset(c, 0, sizeof *c);
            c->line = line;
            c->json = j;
            rc = case_check(path, c);
            for (int i = 0; !rc && i < cs->n - 1; i++)
                if (!strcmp(cs->c[i].id, c->id))
                    rc = cli_fail(CMD, CLI_ERR, "%s:%d: case id \"%s\" already used on line %d", path, line, c->id,
                                  cs->c[i].line);
        }
        p = nl ? nl + 1 : p + n;
    }
    free(text);
    if (!rc && cs->n == 0) rc = cli_fail(CMD, CLI_ERR, "%s: no cases", path);
    return rc;
}

/* ==== Scoring ==== */

enum { K_STRING = 0, K_NUMBER, K_BOOL, K_ID, K_OTHER, K_COUNT };
static const char *const k_kind_names[K_COUNT] = { "strings", "numbers", "booleans", "ids", "other" };
/* JSON keys of the per-kind scores; "ids" (not "id") so a case object's own "id" string is not shadowed. */
static const char *const k_kind_keys[K_COUNT] = { "string", "number", "boolean", "ids", "other" };

typedef struct kcount { int ok, n; } kcount;

typedef struct case_score {
    int    kind;                  /* CASE_* */
    int    format, n_calls, n_malformed;
    int    well_formed, right_tool, completed;
    kcount args, by_kind[K_COUNT];
    int    extra_args;
    double score;                 /* partial credit in [0, 1], see score_case */
    char   note[320];             /* the first reason the case is not completed */
} case_score;

static void note(case_score *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(case_score *s, const char *fmt, ...)
{
    if (s->note[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->note, sizeof s->note, fmt, ap);
    va_end(ap);
}

/* An argument is an id when the expected call lists it in "ids"; without
 * that list, when it is called "id" or ends in "_id". */
static int is_id_arg(const cJSON *exp_call, const char *name)
{
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(exp_call, "ids");
    if (ids) {
        for (const cJSON *s = ids->child; s; s = s->next)
            if (!strcmp(s->valuestring, name)) return 1;
        return 0;
    }
    size_t n = strlen(name);
    return !strcmp(name, "id") || (n > 3 && !strcmp(name + n - 3, "_id"));
}

static int value_kind(const cJSON *exp_call, const char *name, const cJSON *v)
{
    if (is_id_arg(exp_call, name)) return K_ID;
    if (cJSON_IsString(v)) return K_STRING;
    if (cJSON_IsNumber(v)) return K_NUMBER;
    if (cJSON_IsBool(v)) return K_BOOL;
    return K_OTHER;
}

static const char *type_name(const cJSON *v)
{
    if (!v) return "missing";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "array";
    return "object";
}

/* Exact and typed: the same JSON type and value (numbers compare as
 * doubles, so 3 and 3.0 are equal but "3" is not 3; objects compare
 * key by key, arrays in order). */
static int value_equal(const cJSON *want, const cJSON *got)
{
    if (!got) return 0;
    if (cJSON_IsBool(want)) return cJSON_IsBool(got) && cJSON_IsTrue(want) == cJSON_IsTrue(got);
    if (cJSON_IsNumber(want)) return cJSON_IsNumber(got) && want->valuedouble == got->valuedouble;
    if (cJSON_IsString(want)) return cJSON_IsString(got) && !strcmp(want->valuestring, got->valuestring);
    return cJSON_Compare(want, got, 1);
}

/* Short JSON text of v for notes (truncated). */
static void brief(const cJSON *v, char *out, size_t cap)
{
    char *s = v ? toolcall_tojson(v) : NULL;
    snprintf(out, cap, "%s", s ? s : "nothing");
    if (s && strlen(s) >= cap && cap > 4) memcpy(out + cap - 4, "...", 4);
    free(s);
}

static void trim_span(const char **s, size_t *n)
{
    while (*n && strchr(" \t\r\n", **s)) { (*s)++; (*n)--; }
    while (*n && strchr(" \t\r\n", (*s)[*n - 1])) (*n)--;
}

/* Score one output against its case. Partial credit `score`: the mean of
 * well-formed, right tool, the fraction of expected arguments exact (1 when
 * none) and completed for call cases; of well-formed, right tool (no call)
 * and completed for answer cases. Returns -1 when out of memory. */
static int score_case(const tcase *c, const char *output, case_score *s)
{
    memset(s, 0, sizeof *s);
    s->kind = c->kind;
    toolcall_list l;
    if (toolcall_parse(output, strlen(output), &l) != 0) { toolcall_list_free(&l); return -1; }
    s->format = l.format;
    s->n_calls = l.n_calls;
    s->n_malformed = l.n_malformed;
    if (l.n_malformed) note(s, "malformed call: %s", l.error);

    if (c->kind == CASE_ANSWER) {
        s->well_formed = l.n_malformed == 0 && l.content[0] != '\0';
        s->right_tool = l.n_calls == 0;
        if (!s->right_tool) note(s, "called %s, expected an answer", l.calls[0].name);
        if (!s->well_formed) note(s, "no answer text");
        const char *t = l.content;
        size_t tn = strlen(t), an = strlen(c->answer);
        const char *a = c->answer;
        trim_span(&a, &an);
        int match = c->match == MATCH_EXACT ? (tn == an && !memcmp(t, a, an))
                                            : (an == 0 || memmem(t, tn, a, an) != NULL);
        if (!match) note(s, "answer does not %s \"%s\"", c->match == MATCH_EXACT ? "equal" : "contain", c->answer);
        s->completed = s->well_formed && s->right_tool && match;
        s->score = (s->well_formed + s->right_tool + s->completed) / 3.0;
        toolcall_list_free(&l);
        return 0;
    }

    int n_exp = cJSON_GetArraySize(c->calls);
    s->well_formed = l.n_malformed == 0 && l.n_calls > 0;
    if (!l.n_calls && !l.n_malformed) note(s, "no tool call");
    s->right_tool = l.n_calls == n_exp;
    int k = 0;
    for (const cJSON *x = c->calls->child; x; x = x->next, k++) {
        const char *want = cJSON_GetObjectItemCaseSensitive(x, "name")->valuestring;
        const toolcall *got = k < l.n_calls ? &l.calls[k] : NULL;
        const int same = got && !strcmp(got->name, want);
        if (!same) {
            s->right_tool = 0;
            if (got) note(s, "call %d: tool %s, expected %s", k + 1, got->name, want);
            else if (l.n_calls) note(s, "%d call(s), expected %d", l.n_calls, n_exp);
        }
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(x, "arguments");
        for (const cJSON *a = args ? args->child : NULL; a; a = a->next) {
            const int kind = value_kind(x, a->string, a);
            const cJSON *g = same ? cJSON_GetObjectItemCaseSensitive(got->arguments, a->string) : NULL;
            const int ok = same && value_equal(a, g);
            s->args.n++;
            s->args.ok += ok;
            s->by_kind[kind].n++;
            s->by_kind[kind].ok += ok;
            if (same && !ok) {
                char w[96], h[96];
                brief(a, w, sizeof w);
                brief(g, h, sizeof h);
                note(s, "call %d %s: expected %s (%s), got %s (%s)", k + 1, a->string, w, type_name(a), h,
                     type_name(g));
            }
        }
        if (same)
            for (const cJSON *g = got->arguments->child; g; g = g->next)
                if (!args || !cJSON_GetObjectItemCaseSensitive(args, g->string)) {
                    s->extra_args++;
                    if (!c->allow_extra) note(s, "call %d: unexpected argument %s", k + 1, g->string);
                }
    }
    if (l.n_calls > n_exp && s->right_tool == 0) note(s, "%d calls, expected %d", l.n_calls, n_exp);
    s->completed = s->well_formed && s->right_tool && s->args.ok == s->args.n && (c->allow_extra || !s->extra_args);
    s->score = (s->well_formed + s->right_tool + (s->args.n ? (double)s->args.ok / s->args.n : 1.0) + s->completed) / 4.0;
    toolcall_list_free(&l);
    return 0;
}

/* ==== Prompts ==== */

enum { TOOLS_STRATA = 0, TOOLS_QWEN = 1 };

static const char k_qwen_marker[] = "You are provided with function signatures within <tools></tools> XML tags";

/* The system message's tool block, as the two templates write it. */
static void render_tools(strbuf *b, const cJSON *tools, int style)
{
    if (style == TOOLS_QWEN)
        strbuf_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    else
        strbuf_str(b, "Available tools (JSON schemas), one per line:\n<tools>");
    for (const cJSON *t = tools->child; t; t = t->next) {
        strbuf_str(b, "\n");
        sb_json(b, t);
    }
    if (style == TOOLS_QWEN)
        strbuf_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}\n</tool_call>");
    else
        strbuf_str(b, "\n</tools>\nTo call a tool, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.");
}

/* An assistant message's earlier calls, appended to its content (b holds
 * the content so far). Qwen's template puts no newline before the first
 * call of an empty message; strata's always does. */
static void render_calls(strbuf *b, const cJSON *calls, int style)
{
    for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!f) f = c;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (style != TOOLS_QWEN || c != calls->child || b->n) strbuf_str(b, "\n");
        strbuf_str(b, "<tool_call>\n{\"name\": \"");
        strbuf_str(b, cJSON_IsString(name) ? name->valuestring : "");
        strbuf_str(b, "\", \"arguments\": ");
        if (cJSON_IsString(args)) strbuf_str(b, args->valuestring);
        else if (args) sb_json(b, args);
        else strbuf_str(b, "{}");
        strbuf_str(b, "}\n</tool_call>");
    }
}

/* Format case c into *out (malloc'd) with the engine's chat template. The
 * contents are built here (tools into the system message, tool results as
 * <tool_response> user turns) and the template adds the turn markers. */
static int build_prompt(const engine *eng, const char *tmpl, int style, const tcase *c, char **out)
{
    int n_msg = cJSON_GetArraySize(c->messages);
    const int has_tools = c->tools && c->tools->child;
    const cJSON *first = c->messages->child;
    const int has_sys = !strcmp(cJSON_GetObjectItemCaseSensitive(first, "role")->valuestring, "system");
    const int n = n_msg + (has_tools && !has_sys);
    engine_chat_msg *msgs = calloc((size_t)n, sizeof *msgs);
    strbuf *texts = calloc((size_t)n, sizeof *texts);
    int rc = CLI_ERR, k = 0;
    if (!msgs || !texts) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    if (has_tools && !has_sys) {
        msgs[k].role = "system";
        render_tools(&texts[k], c->tools, style);
        k++;
    }
    for (const cJSON *m = first; m; m = m->next, k++) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *text = cJSON_IsString(content) ? content->valuestring : "";
        msgs[k].role = role;
        if (!strcmp(role, "tool")) {
            msgs[k].role = "user";
            strbuf_str(&texts[k], "<tool_response>\n");
            strbuf_str(&texts[k], text);
            strbuf_str(&texts[k], "\n</tool_response>");
        } else {
            strbuf_str(&texts[k], text);
            if (m == first && has_sys && has_tools) {
                strbuf_str(&texts[k], "\n\n");   /* both templates, even after an empty system text */
                render_tools(&texts[k], c->tools, style);
            }
            render_calls(&texts[k], cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), style);
        }
    }
    for (int i = 0; i < n; i++) {
        if (texts[i].oom) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
        msgs[i].content = texts[i].p ? texts[i].p : "";
    }
    err e;
    err_clear(&e);
    int len = engine_chat_apply(eng, tmpl, msgs, (size_t)n, 1, NULL, 0, &e);
    if (len < 0) { cli_fail(CMD, CLI_ERR, "case %s: chat template: %s", c->id, e.msg); goto done; }
    *out = malloc((size_t)len + 1);
    if (!*out) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    if (engine_chat_apply(eng, tmpl, msgs, (size_t)n, 1, *out, (size_t)len + 1, &e) < 0) {
        free(*out);
        *out = NULL;
        cli_fail(CMD, CLI_ERR, "case %s: chat template: %s", c->id, e.msg);
        goto done;
    }
    rc = 0;
done:
    for (int i = 0; texts && i < n; i++) free(texts[i].p);
    free(texts);
    free(msgs);
    return rc;
}

/* ==== Generation ==== */

typedef struct run_cfg {
    const char *model, *cases_path, *replay, *json_out, *arm, *tmpl;
    int         n_predict, n_ctx, n_batch, n_threads, tool_style;   /* tool_style -1: detect */
    int         stream, arena_auto, read_ahead;
    uint64_t    arena_bytes;
    const char *arena_arg;
    int         verbose;
} run_cfg;

/* Greedy generation for one prompt; *out malloc'd. */
static int generate(engine *eng, session *s, sampler *sm, const char *prompt, int n_predict, const char *id,
                    char **out, int *n_prompt, int *n_gen)
{
    err e;
    err_clear(&e);
    const int32_t V = engine_n_vocab(eng);
    const int n_ctx = engine_n_ctx(eng);
    size_t len = strlen(prompt), n_ids = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (len + 8));
    float *logits = malloc(sizeof(float) * (size_t)V);
    strbuf text = { 0 };
    int rc = CLI_ERR;
    if (!ids || !logits) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    if (engine_tokenize(eng, prompt, len, engine_add_bos(eng), 1, ids, len + 8, &n_ids, &e) != 0) {
        cli_fail(CMD, CLI_ERR, "case %s: tokenizing the prompt: %s", id, e.msg);
        goto done;
    }
    if ((long)n_ids + 1 > n_ctx) {
        cli_fail(CMD, CLI_ERR, "case %s: the prompt is %zu tokens, the context %d (raise -c)", id, n_ids, n_ctx);
        goto done;
    }
    session_truncate(s, 0);
    for (size_t i = 0; i < n_ids; i++) sampler_accept(sm, ids[i]);
    if (session_eval(s, ids, (int)n_ids, logits, NULL, &e) != 0) {
        cli_fail(CMD, CLI_ERR, "case %s: %s", id, e.msg);
        goto done;
    }
    int n = 0;
    char piece[256];
    strbuf_str(&text, "");
    while (n < n_predict) {
        int32_t t = sampler_sample(sm, logits);
        sampler_accept(sm, t);
        if (engine_token_is_eog(eng, t)) break;
        int np = engine_token_piece(eng, t, 0, piece, sizeof piece);
        if (np > (int)sizeof piece) np = (int)sizeof piece;
        if (np > 0) strbuf_add(&text, piece, (size_t)np);
        n++;
        if (n >= n_predict || session_n_past(s) + 1 >= n_ctx) break;
        if (session_eval(s, &t, 1, logits, NULL, &e) != 0) { cli_fail(CMD, CLI_ERR, "case %s: %s", id, e.msg); goto done; }
    }
    if (text.oom) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
    *out = text.p;
    text.p = NULL;
    *n_prompt = (int)n_ids;
    *n_gen = n;
    rc = 0;
done:
    free(text.p);
    free(ids);
    free(logits);
    return rc;
}

/* ==== Replay ==== */

/* Outputs to score: a JSONL file of {"id", "output"} objects, or a taskeval
 * --json result (its cases' outputs are scored again). outs[i] gets case
 * i's output (malloc'd). Every case needs one. */
static int replay_load(const char *path, const caseset *cs, char **outs)
{
    size_t len;
    char *text = cli_read_file(CMD, path, &len);
    if (!text) return CLI_ERR;
    int rc = 0;
    cJSON *whole = cJSON_Parse(text);
    cJSON *items = NULL;
    if (cJSON_IsObject(whole) && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(whole, "cases"))) {
        items = cJSON_DetachItemFromObjectCaseSensitive(whole, "cases");
    } else {
        items = cJSON_CreateArray();
        int line = 0;
        for (char *p = text; *p && items && !rc;) {
            char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            line++;
            size_t a = 0;
            while (a < n && strchr(" \t\r", p[a])) a++;
            if (a < n) {
                const char *end = NULL;
                cJSON *j = cJSON_ParseWithLengthOpts(p, n, &end, 0);
                if (!cJSON_IsObject(j)) {
                    rc = cli_fail(CMD, CLI_ERR, "%s:%d: not a JSON object", path, line);
                    cJSON_Delete(j);
                } else {
                    cJSON_AddItemToArray(items, j);
                }
            }
            p = nl ? nl + 1 : p + n;
        }
    }
    cJSON_Delete(whole);
    free(text);
    if (!items) return rc ? rc : cli_fail(CMD, CLI_ERR, "out of memory");
    int k = 0;
    for (const cJSON *it = items->child; it && !rc; it = it->next, k++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *out = cJSON_GetObjectItemCaseSensitive(it, "output");
        if (!cJSON_IsString(id) || !cJSON_IsString(out)) {
            rc = cli_fail(CMD, CLI_ERR, "%s: entry %d needs a string \"id\" and a string \"output\"", path, k + 1);
            break;
        }
        int found = -1;
        for (int i = 0; i < cs->n; i++)
            if (!strcmp(cs->c[i].id, id->valuestring)) found = i;
        if (found < 0) { rc = cli_fail(CMD, CLI_ERR, "%s: output for unknown case \"%s\"", path, id->valuestring); break; }
        if (outs[found]) { rc = cli_fail(CMD, CLI_ERR, "%s: two outputs for case \"%s\"", path, id->valuestring); break; }
        if (!(outs[found] = strdup(out->valuestring))) rc = cli_fail(CMD, CLI_ERR, "out of memory");
    }
    for (int i = 0; !rc && i < cs->n; i++)
        if (!outs[i]) rc = cli_fail(CMD, CLI_ERR, "%s: no output for case \"%s\"", path, cs->c[i].id);
    cJSON_Delete(items);
    return rc;
}

/* ==== Report ==== */

typedef struct totals {
    int    n, n_call, n_answer;
    int    well_formed, right_tool, completed, completed_call, completed_answer;
    kcount args, by_kind[K_COUNT];
    double score_sum;
} totals;

static void tally(totals *t, const case_score *s)
{
    t->n++;
    if (s->kind == CASE_CALL) t->n_call++; else t->n_answer++;
    t->well_formed += s->well_formed;
    t->right_tool += s->right_tool;
    t->completed += s->completed;
    if (s->kind == CASE_CALL) t->completed_call += s->completed; else t->completed_answer += s->completed;
    t->args.ok += s->args.ok;
    t->args.n += s->args.n;
    for (int k = 0; k < K_COUNT; k++) {
        t->by_kind[k].ok += s->by_kind[k].ok;
        t->by_kind[k].n += s->by_kind[k].n;
    }
    t->score_sum += s->score;
}

static const char *yes_no(int v) { return v ? "yes" : "no"; }
static void frac_cell(char *out, size_t cap, kcount k)
{
    if (k.n) snprintf(out, cap, "%d/%d", k.ok, k.n);
    else snprintf(out, cap, "—");
}

static void print_table(FILE *f, const caseset *cs, const case_score *sc)
{
    fprintf(f, "| case | expects | format | calls | well-formed | right tool | args exact | strings | numbers | "
               "booleans | ids | completed |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < cs->n; i++) {
        const case_score *s = &sc[i];
        char a[5][24];
        frac_cell(a[0], sizeof a[0], s->args);
        frac_cell(a[1], sizeof a[1], s->by_kind[K_STRING]);
        frac_cell(a[2], sizeof a[2], s->by_kind[K_NUMBER]);
        frac_cell(a[3], sizeof a[3], s->by_kind[K_BOOL]);
        frac_cell(a[4], sizeof a[4], s->by_kind[K_ID]);
        const char *expects = "answer";
        if (s->kind == CASE_CALL) {
            expects = cJSON_GetObjectItemCaseSensitive(cs->c[i].calls->child, "name")->valuestring;
        }
        fprintf(f, "| %s | %s%s | %s | %d%s | %s | %s | %s | %s | %s | %s | %s | %s |\n", cs->c[i].id, expects,
                s->kind == CASE_CALL && cJSON_GetArraySize(cs->c[i].calls) > 1 ? " +" : "",
                toolcall_format_name(s->format), s->n_calls, s->n_malformed ? " (+bad)" : "", yes_no(s->well_formed),
                yes_no(s->right_tool), a[0], a[1], a[2], a[3], a[4], yes_no(s->completed));
    }
}

static void print_totals(FILE *f, const char *arm, const totals *t)
{
    fprintf(f, "total (arm %s): well-formed %d/%d, right tool %d/%d, arguments exact %d/%d (", arm, t->well_formed,
            t->n, t->right_tool, t->n, t->args.ok, t->args.n);
    int first = 1;
    for (int k = 0; k < K_COUNT; k++) {
        if (k == K_OTHER && !t->by_kind[k].n) continue;
        fprintf(f, "%s%s %d/%d", first ? "" : ", ", k_kind_names[k], t->by_kind[k].ok, t->by_kind[k].n);
        first = 0;
    }
    fprintf(f, "), completed %d/%d (calls %d/%d, answers %d/%d); mean case score %.4f\n", t->completed, t->n,
            t->completed_call, t->n_call, t->completed_answer, t->n_answer, t->n ? t->score_sum / t->n : 0.0);
}

static cJSON *kcount_json(kcount k)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ok", k.ok);
    cJSON_AddNumberToObject(o, "n", k.n);
    return o;
}

static cJSON *totals_json(const totals *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "cases", t->n);
    cJSON_AddNumberToObject(o, "call_cases", t->n_call);
    cJSON_AddNumberToObject(o, "answer_cases", t->n_answer);
    cJSON_AddNumberToObject(o, "well_formed", t->well_formed);
    cJSON_AddNumberToObject(o, "right_tool", t->right_tool);
    cJSON_AddItemToObject(o, "args", kcount_json(t->args));
    for (int k = 0; k < K_COUNT; k++) cJSON_AddItemToObject(o, k_kind_keys[k], kcount_json(t->by_kind[k]));
    cJSON_AddNumberToObject(o, "completed", t->completed);
    cJSON_AddNumberToObject(o, "completed_calls", t->completed_call);
    cJSON_AddNumberToObject(o, "completed_answers", t->completed_answer);
    cJSON_AddNumberToObject(o, "mean_score", t->n ? t->score_sum / t->n : 0.0);
    return o;
}

static void iso_now(char *out, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int write_json(const run_cfg *cfg, const caseset *cs, const case_score *sc, char *const *outs,
                      char *const *prompts, const int *n_prompt, const int *n_gen, const totals *t, const char *model_desc,
                      int argc, char **argv)
{
    cJSON *root = cJSON_CreateObject();
    char date[32];
    iso_now(date, sizeof date);
    cJSON_AddNumberToObject(root, "taskeval", 1);
    cJSON_AddStringToObject(root, "arm", cfg->arm);
    cJSON *av = cJSON_AddArrayToObject(root, "argv");
    for (int i = 0; i < argc; i++) cJSON_AddItemToArray(av, cJSON_CreateString(argv[i]));
    cJSON_AddStringToObject(root, "cases_file", cfg->cases_path);
    if (cfg->replay) cJSON_AddStringToObject(root, "replay", cfg->replay);
    else {
        cJSON_AddStringToObject(root, "model", cfg->model);
        cJSON_AddStringToObject(root, "model_desc", model_desc ? model_desc : "");
        cJSON_AddNumberToObject(root, "n_predict", cfg->n_predict);
        cJSON_AddStringToObject(root, "tool_prompt", cfg->tool_style == TOOLS_QWEN ? "qwen" : "strata");
        cJSON_AddStringToObject(root, "arena", cfg->arena_arg ? cfg->arena_arg : "resident");
        cJSON_AddNumberToObject(root, "read_ahead", cfg->read_ahead);
    }
    cJSON *env = cJSON_AddObjectToObject(root, "env");
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || strncmp(*e, "STRATA_", 7)) continue;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
        cJSON_AddStringToObject(env, key, eq + 1);
    }
    cJSON_AddStringToObject(root, "date", date);
    cJSON *arr = cJSON_AddArrayToObject(root, "cases");
    for (int i = 0; i < cs->n; i++) {
        const case_score *s = &sc[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", cs->c[i].id);
        cJSON_AddStringToObject(o, "kind", s->kind == CASE_CALL ? "call" : "answer");
        add_text(o, "output", outs[i]);
        if (!cfg->replay) {
            add_text(o, "prompt", prompts[i]);
            cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt[i]);
            cJSON_AddNumberToObject(o, "generated_tokens", n_gen[i]);
        }
        cJSON_AddStringToObject(o, "format", toolcall_format_name(s->format));
        cJSON_AddNumberToObject(o, "calls", s->n_calls);
        cJSON_AddNumberToObject(o, "malformed", s->n_malformed);
        cJSON_AddBoolToObject(o, "well_formed", s->well_formed);
        cJSON_AddBoolToObject(o, "right_tool", s->right_tool);
        cJSON_AddItemToObject(o, "args", kcount_json(s->args));
        for (int k = 0; k < K_COUNT; k++) cJSON_AddItemToObject(o, k_kind_keys[k], kcount_json(s->by_kind[k]));
        cJSON_AddNumberToObject(o, "extra_args", s->extra_args);
        cJSON_AddBoolToObject(o, "completed", s->completed);
        cJSON_AddNumberToObject(o, "score", s->score);
        add_text(o, "note", s->note);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddItemToObject(root, "totals", totals_json(t));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return cli_fail(CMD, CLI_ERR, "out of memory");
    FILE *f = fopen(cfg->json_out, "w");
    int bad = !f;
    if (f) {
        bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
        bad |= fclose(f) != 0;
    }
    free(text);
    if (bad) return cli_fail(CMD, CLI_ERR, "cannot write %s", cfg->json_out);
    return 0;
}

/* ==== --compare ==== */

/* Exact two-sided sign test: n discordant pairs, k of them favouring B.
 * p = min(1, 2 * P(X <= min(k, n-k))) for X ~ Binomial(n, 1/2). */
static double sign_test_p(int k, int n)
{
    if (n <= 0) return 1.0;
    int m = k < n - k ? k : n - k;
    double sum = 0;
    for (int i = 0; i <= m; i++)
        sum += exp(lgamma(n + 1.0) - lgamma(i + 1.0) - lgamma(n - i + 1.0) - n * log(2.0));
    double p = 2 * sum;
    return p > 1 ? 1 : p;
}

static cJSON *load_result(const char *path)
{
    size_t len;
    char *text = cli_read_file(CMD, path, &len);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j) || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "cases"))) {
        cJSON_Delete(j);
        cli_fail(CMD, CLI_ERR, "%s: not a taskeval --json result", path);
        return NULL;
    }
    return j;
}

static int do_compare(const char *pa, const char *pb)
{
    cJSON *a = load_result(pa), *b = a ? load_result(pb) : NULL;
    if (!a || !b) { cJSON_Delete(a); return CLI_ERR; }
    const cJSON *arm_a = cJSON_GetObjectItemCaseSensitive(a, "arm"), *arm_b = cJSON_GetObjectItemCaseSensitive(b, "arm");
    const char *na = cJSON_IsString(arm_a) ? arm_a->valuestring : "A";
    const char *nb = cJSON_IsString(arm_b) ? arm_b->valuestring : "B";
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(a, "cases"), *cb = cJSON_GetObjectItemCaseSensitive(b, "cases");
    int rc = 0;
    const cJSON *sets[2] = { ca, cb };
    const char *paths[2] = { pa, pb };
    for (int s = 0; s < 2 && !rc; s++) {
        int k = 0;
        for (const cJSON *x = sets[s]->child; x; x = x->next, k++)
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(x, "id")) ||
                !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(x, "completed")) ||
                !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(x, "score"))) {
                rc = cli_fail(CMD, CLI_ERR, "%s: case %d lacks id, completed or score", paths[s], k + 1);
                break;
            }
    }
    if (rc) { cJSON_Delete(a); cJSON_Delete(b); return rc; }

    printf("taskeval compare: A = arm %s (%s), B = arm %s (%s)\n", na, pa, nb, pb);
    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(a, "cases_file"), *fb = cJSON_GetObjectItemCaseSensitive(b, "cases_file");
    if (cJSON_IsString(fa) && cJSON_IsString(fb) && strcmp(fa->valuestring, fb->valuestring))
        printf("note: the results come from different case files (%s, %s); cases are paired by id\n", fa->valuestring,
               fb->valuestring);
    int paired = 0, only_a = 0, only_b = 0, better = 0, worse = 0, s_up = 0, s_down = 0, changed = 0;
    int done_a = 0, done_b = 0;
    for (const cJSON *x = ca->child; x; x = x->next) {
        const char *id = cJSON_GetObjectItemCaseSensitive(x, "id")->valuestring;
        const cJSON *y = NULL;
        for (const cJSON *z = cb->child; z && !y; z = z->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(z, "id")->valuestring, id)) y = z;
        if (!y) { only_a++; continue; }
        paired++;
        const int pa_ = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "completed"));
        const int pb_ = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(y, "completed"));
        const double sa = cJSON_GetObjectItemCaseSensitive(x, "score")->valuedouble;
        const double sb = cJSON_GetObjectItemCaseSensitive(y, "score")->valuedouble;
        done_a += pa_;
        done_b += pb_;
        if (pb_ > pa_) better++;
        if (pb_ < pa_) worse++;
        if (sb > sa) s_up++;
        if (sb < sa) s_down++;
        const cJSON *oa = cJSON_GetObjectItemCaseSensitive(x, "output"), *ob = cJSON_GetObjectItemCaseSensitive(y, "output");
        const int same_out = cJSON_IsString(oa) && cJSON_IsString(ob) && !strcmp(oa->valuestring, ob->valuestring);
        if (pa_ == pb_ && sa == sb && same_out) continue;
        if (!changed++)
            printf("| case | A completed | B completed | A score | B score | change |\n|---|---|---|---|---|---|\n");
        const char *what = pb_ > pa_ ? "completed in B only" : pb_ < pa_ ? "completed in A only"
                         : sb > sa ? "B scores higher" : sb < sa ? "A scores higher" : "output differs, same score";
        printf("| %s | %s | %s | %.4f | %.4f | %s |\n", id, yes_no(pa_), yes_no(pb_), sa, sb, what);
    }
    for (const cJSON *y = cb->child; y; y = y->next) {
        const char *id = cJSON_GetObjectItemCaseSensitive(y, "id")->valuestring;
        int found = 0;
        for (const cJSON *x = ca->child; x && !found; x = x->next)
            found = !strcmp(cJSON_GetObjectItemCaseSensitive(x, "id")->valuestring, id);
        only_b += !found;
    }
    if (!changed) printf("no case changed (same completion, score and output in all %d paired cases)\n", paired);
    printf("%d paired cases", paired);
    if (only_a || only_b) printf(" (%d only in A, %d only in B: not compared)", only_a, only_b);
    printf("; completed A %d/%d, B %d/%d\n", done_a, paired, done_b, paired);
    printf("completed: %d better in B, %d worse, %d unchanged; exact two-sided sign test p = %.4g (n = %d discordant)\n",
           better, worse, paired - better - worse, sign_test_p(better, better + worse), better + worse);
    printf("case score: %d higher in B, %d lower, %d equal; exact two-sided sign test p = %.4g (n = %d)\n", s_up,
           s_down, paired - s_up - s_down, sign_test_p(s_up, s_up + s_down), s_up + s_down);
    printf("the sign test counts only cases that changed; ties carry no information, and a large p means no "
           "difference was shown, not that there is none\n");
    cJSON_Delete(a);
    cJSON_Delete(b);
    return CLI_OK;
}

/* ==== Command ==== */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata taskeval -m MODEL --cases FILE.jsonl [options]\n"
            "       strata taskeval --replay OUTPUTS --cases FILE.jsonl [--arm NAME] [--json OUT]\n"
            "       strata taskeval --compare A.json B.json\n\n"
            "Tool-call task evaluation: greedy generation per case through the model's chat\n"
            "template, tool calls parsed (<tool_call>{json}</tool_call> or bare JSON) and scored:\n"
            "well-formed, right tool, each argument exact and typed, completed. Case format:\n"
            "docs/TASKEVAL.md.\n\n"
            "  -m, --model FILE          GGUF model\n"
            "  --cases FILE              JSONL case file\n"
            "  -n, --n-predict N         tokens generated per case at most (default 256)\n"
            "  --arm NAME                name of this configuration in the report (default: base)\n"
            "  --json OUT                write per-case outputs and scores and the totals as JSON\n"
            "  --replay FILE             score given outputs instead of generating: JSONL of\n"
            "                            {\"id\": ..., \"output\": ...}, or an earlier --json result\n"
            "  --compare A.json B.json   paired comparison of two arms' --json results: changed\n"
            "                            cases and an exact two-sided sign test\n"
            "  --chat-template NAME      built-in chat template instead of the model's\n"
            "  --tool-prompt strata|qwen tool block wording (default: qwen when the model's template\n"
            "                            has Qwen's, else strata mkmodel's)\n"
            "  -c, --ctx-size N          context size (default 4096 or the model's if smaller)\n"
            "  -b, --batch-size N        prompt chunk rows (default 2048)\n"
            "  -t, --threads N           threads (default: all CPUs)\n"
            "  --arena SIZE|auto|0       stream the routed experts through an arena (see strata run)\n"
            "  --read-ahead N            prefetch the next layer's top N experts (with --arena)\n"
            "  -v, --verbose             the engine's load summary on stderr\n"
            "  -h, --help                this help\n");
}

/* Returns 0, 100 (help shown) or an exit code; *cmp_a and *cmp_b are set for --compare. */
static int parse_args(int argc, char **argv, run_cfg *o, const char **cmp_a, const char **cmp_b)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 256;
    o->arm = "base";
    o->tool_style = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
#define IS(s) (!strcmp(a, s))
#define VALUE() do { if (!(v = cli_value(CMD, argc, argv, &i))) return CLI_USAGE; } while (0)
#define INT(lo, hi, dst) do { VALUE(); if (cli_parse_int(v, lo, hi, &n)) \
        return cli_fail(CMD, CLI_USAGE, "%s needs a whole number from %lld to %lld, got '%s'", a, \
                        (long long)(lo), (long long)(hi), v); dst = (int)n; } while (0)
        if (IS("-h") || IS("--help")) { usage(stdout); return 100; }
        else if (IS("-m") || IS("--model")) { VALUE(); o->model = v; }
        else if (IS("--cases")) { VALUE(); o->cases_path = v; }
        else if (IS("-n") || IS("--n-predict")) INT(1, 1000000, o->n_predict);
        else if (IS("--arm")) { VALUE(); o->arm = v; }
        else if (IS("--json")) { VALUE(); o->json_out = v; }
        else if (IS("--replay")) { VALUE(); o->replay = v; }
        else if (IS("--compare")) {
            if (i + 2 >= argc) return cli_fail(CMD, CLI_USAGE, "--compare needs two result files");
            *cmp_a = argv[++i];
            *cmp_b = argv[++i];
        }
        else if (IS("--chat-template")) { VALUE(); o->tmpl = v; }
        else if (IS("--tool-prompt")) {
            VALUE();
            if (!strcmp(v, "strata")) o->tool_style = TOOLS_STRATA;
            else if (!strcmp(v, "qwen")) o->tool_style = TOOLS_QWEN;
            else return cli_fail(CMD, CLI_USAGE, "--tool-prompt must be strata or qwen, got '%s'", v);
        }
        else if (IS("-c") || IS("--ctx-size")) INT(0, 1 << 24, o->n_ctx);
        else if (IS("-b") || IS("--batch-size")) INT(1, 1 << 20, o->n_batch);
        else if (IS("-t") || IS("--threads")) INT(1, 1024, o->n_threads);
        else if (IS("--arena")) {
            VALUE();
            o->stream = 1;
            o->arena_arg = v;
            if (!strcmp(v, "auto")) o->arena_auto = 1;
            else if (cli_parse_size(v, &o->arena_bytes))
                return cli_fail(CMD, CLI_USAGE, "--arena needs a size (K/M/G suffixes), 0 or auto, got '%s'", v);
        }
        else if (IS("--read-ahead")) INT(0, 65536, o->read_ahead);
        else if (IS("-v") || IS("--verbose")) o->verbose = 1;
        else return cli_fail(CMD, CLI_USAGE, "unknown option '%s' (see strata taskeval --help)", a);
#undef IS
#undef VALUE
#undef INT
    }
    if (*cmp_a) {
        if (o->model || o->cases_path || o->replay)
            return cli_fail(CMD, CLI_USAGE, "--compare takes only the two result files");
        return 0;
    }
    if (!o->cases_path) return cli_fail(CMD, CLI_USAGE, "no case file given (--cases FILE.jsonl)");
    if (!o->model && !o->replay) return cli_fail(CMD, CLI_USAGE, "no model given (-m MODEL, or --replay OUTPUTS)");
    if (o->model && o->replay) return cli_fail(CMD, CLI_USAGE, "give -m or --replay, not both");
    if (o->read_ahead && !o->stream) return cli_fail(CMD, CLI_USAGE, "--read-ahead needs --arena");
    return 0;
}

int cmd_taskeval(int argc, char **argv)
{
    run_cfg cfg;
    const char *cmp_a = NULL, *cmp_b = NULL;
    int rc = parse_args(argc, argv, &cfg, &cmp_a, &cmp_b);
    if (rc == 100) return CLI_OK;
    if (rc) return rc;
    if (cmp_a) return do_compare(cmp_a, cmp_b);

    caseset cs = { 0 };
    if ((rc = cases_load(cfg.cases_path, &cs)) != 0) { caseset_free(&cs); return rc; }
    char **outs = calloc((size_t)cs.n, sizeof *outs), **prompts = calloc((size_t)cs.n, sizeof *prompts);
    case_score *sc = calloc((size_t)cs.n, sizeof *sc);
    int *n_prompt = calloc((size_t)cs.n, sizeof *n_prompt), *n_gen = calloc((size_t)cs.n, sizeof *n_gen);
    engine *eng = NULL;
    session *s = NULL;
    sampler *sm = NULL;
    const char *desc = NULL;
    rc = CLI_ERR;
    if (!outs || !prompts || !sc || !n_prompt || !n_gen) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }

    if (cfg.replay) {
        if (replay_load(cfg.replay, &cs, outs) != 0) goto done;
        printf("taskeval: arm %s, %d cases from %s, outputs replayed from %s\n", cfg.arm, cs.n, cfg.cases_path,
               cfg.replay);
    } else {
        err e;
        err_clear(&e);
        engine_opts eo = {
            .model_path = cfg.model, .n_threads = cfg.n_threads, .n_ctx = cfg.n_ctx, .n_batch = cfg.n_batch,
            .verbose = cfg.verbose, .log = stderr, .stream = cfg.stream, .arena_bytes = cfg.arena_bytes,
            .arena_auto = cfg.arena_auto, .read_ahead = cfg.read_ahead,
        };
        if (engine_open(&eng, &eo, &e) != 0) { cli_fail(CMD, CLI_ERR, "%s", e.msg); goto done; }
        if (session_create(&s, eng, &e) != 0) { cli_fail(CMD, CLI_ERR, "%s", e.msg); goto done; }
        sampler_opts so = sampler_default_opts();
        so.temp = 0;                /* greedy: argmax, lowest id on ties */
        so.repeat_penalty = 1.0f;
        if (sampler_open(&sm, &so, engine_n_vocab(eng), &e) != 0) { cli_fail(CMD, CLI_ERR, "%s", e.msg); goto done; }
        desc = engine_model_desc(eng);
        if (cfg.tool_style < 0) {
            const char *t = engine_chat_template(eng);
            cfg.tool_style = t && strstr(t, k_qwen_marker) ? TOOLS_QWEN : TOOLS_STRATA;
        }
        printf("taskeval: arm %s, %d cases from %s, model %s (%s), greedy, up to %d tokens, tool prompt %s\n",
               cfg.arm, cs.n, cfg.cases_path, cfg.model, desc, cfg.n_predict,
               cfg.tool_style == TOOLS_QWEN ? "qwen" : "strata");
        char route[1024];
        engine_route_describe(eng, route, sizeof route);
        printf("taskeval: routing %s%s\n", route, engine_route_reads_residency(eng)
               ? " (depends on expert residency: not reproducible bit for bit)" : "");
        for (int i = 0; i < cs.n; i++) {
            if (build_prompt(eng, cfg.tmpl, cfg.tool_style, &cs.c[i], &prompts[i]) != 0) goto done;
            /* a fresh sampler state per case: greedy ignores it, but the
             * penalty window must not carry one case into the next */
            sampler_close(sm);
            sm = NULL;
            if (sampler_open(&sm, &so, engine_n_vocab(eng), &e) != 0) {
                cli_fail(CMD, CLI_ERR, "%s", e.msg);
                goto done;
            }
            if (generate(eng, s, sm, prompts[i], cfg.n_predict, cs.c[i].id, &outs[i], &n_prompt[i], &n_gen[i]))
                goto done;
        }
    }
    totals t = { 0 };
    for (int i = 0; i < cs.n; i++) {
        if (score_case(&cs.c[i], outs[i], &sc[i]) != 0) { cli_fail(CMD, CLI_ERR, "out of memory"); goto done; }
        tally(&t, &sc[i]);
    }
    print_table(stdout, &cs, sc);
    int any_note = 0;
    for (int i = 0; i < cs.n; i++)
        if (!sc[i].completed) {
            if (!any_note++) printf("not completed:\n");
            printf("  %s: %s\n", cs.c[i].id, sc[i].note[0] ? sc[i].note : "(no reason recorded)");
        }
    print_totals(stdout, cfg.arm, &t);
    if (cfg.json_out && write_json(&cfg, &cs, sc, outs, prompts, n_prompt, n_gen, &t, desc, argc, argv) != 0) goto done;
    rc = CLI_OK;
done:
    sampler_close(sm);
    session_free(s);
    engine_close(eng);
    for (int i = 0; i < cs.n; i++) {
        if (outs) free(outs[i]);
        if (prompts) free(prompts[i]);
    }
    free(outs);
    free(prompts);
    free(sc);
    free(n_prompt);
    free(n_gen);
    caseset_free(&cs);
    return rc;
}

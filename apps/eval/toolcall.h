/* toolcall: find and parse the tool calls in a model's generated text.
 *
 * Formats (the ones MoE chat models write):
 *   tagged  <tool_call>{"name": "f", "arguments": {...}}</tool_call>, as Qwen2.5/
 *           Qwen3 (and Hermes-style templates) write it; any number of blocks,
 *           with text around them;
 *   bare    a JSON object {"name": "f", "arguments": {...}} (or a JSON array of
 *           them) in the text, optionally inside a ```json fence, as models
 *           without tool-call tokens tend to answer. Looked for only when the
 *           text has no <tool_call> tag.
 * In both, "parameters" is accepted for "arguments" (Llama-3 style), and
 * arguments given as a string holding a JSON object (OpenAI wire style) are
 * decoded. A missing "arguments" means no arguments ({}). <think>...</think>
 * blocks are removed first: a call inside reasoning is not a call.
 *
 * Malformed calls are counted, not dropped silently: a tagged block whose body
 * is not a JSON object with a string "name" and object arguments, a block with
 * no closing tag (generation stopped inside it), or bare text that starts like
 * a JSON object but does not parse. The first reason is kept.
 *
 * Self-contained (cJSON and libc only), no globals; thread-safe for distinct
 * lists. Reused by the server's tool-call path. */
#ifndef STRATA_TOOLCALL_H
#define STRATA_TOOLCALL_H

#include <stddef.h>
#include <cjson/cJSON.h>

enum toolcall_format {
    TOOLCALL_NONE = 0,    /* no call found */
    TOOLCALL_TAGGED = 1,  /* <tool_call> blocks (malformed ones included) */
    TOOLCALL_BARE = 2     /* bare JSON */
};

typedef struct toolcall {
    char  *name;          /* owned, NUL-terminated */
    cJSON *arguments;     /* owned; always a JSON object */
    char  *id;            /* owned; the call's "id" when the model wrote one, else NULL */
} toolcall;

typedef struct toolcall_list {
    int       format;          /* enum toolcall_format */
    toolcall *calls;           /* owned array of n_calls well-formed calls, in text order */
    int       n_calls;
    int       n_malformed;     /* blocks or bare candidates that were not a valid call */
    int       unclosed;        /* 1 when a <tool_call> has no </tool_call> (counted in n_malformed) */
    char     *content;         /* owned: the text outside calls and <think> blocks, trimmed */
    char      error[192];      /* why the first malformed call failed ("" when none) */
} toolcall_list;

/* Parse len bytes of text (need not be NUL-terminated) into *out (fully
 * overwritten; free with toolcall_list_free even on failure). Returns 0, or
 * -1 when out of memory. */
int  toolcall_parse(const char *text, size_t len, toolcall_list *out);
void toolcall_list_free(toolcall_list *l);   /* NULL is a no-op; leaves *l zeroed */

/* "none", "tagged", "bare". */
const char *toolcall_format_name(int format);

/* Serialise JSON as Python's json.dumps does by default (", " and ": "
 * separators, keys in their given order, non-ASCII kept), which is what the
 * chat templates' `tojson` writes. Returns a malloc'd string or NULL (OOM). */
char *toolcall_tojson(const cJSON *v);

#endif

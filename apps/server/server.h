/* server: `strata serve`, an OpenAI-compatible HTTP server (see docs/SERVER.md).
 *
 * server.c   HTTP (libmicrohttpd, thread per connection), the bounded FIFO,
 *            the worker thread that owns the engine's one session, metrics,
 *            signals.
 * server_api.c  the pure part: request JSON -> srv_req (validation, the chat
 *            messages as the template wants them, tools), and the response
 *            JSON (full responses and SSE chunks, tool_calls parsed with
 *            toolcall.c). No engine calls, no I/O.
 */
#ifndef STRATA_SERVER_H
#define STRATA_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "engine.h"

enum srv_kind { SRV_CHAT = 0, SRV_COMPLETION = 1 };

enum { SRV_MAX_STOP = 16 };

/* One parsed request: everything the worker needs. All strings owned. */
typedef struct srv_req {
    int    kind;              /* enum srv_kind */
    int    stream;            /* SSE */
    int    include_usage;     /* stream_options.include_usage */
    int    ignore_eos;        /* llama-server's ignore_eos: end-of-generation tokens impossible */
    int    max_tokens;        /* -1: until end of generation or the context is full */
    sampler_opts so;
    int    seed_set;
    char  *stop[SRV_MAX_STOP];
    int    n_stop;
    int    tools;             /* tools given and tool_choice is not "none": parse tool_calls */
    engine_chat_msg *msgs;    /* chat: messages as the template gets them (roles are literals) */
    size_t n_msgs;
    char  *prompt;            /* completion */
} srv_req;

/* Parse a request body of `kind`. Returns 0, or the HTTP status (400) with
 * a message in msg. *out is always safe to srv_req_free. */
int  srv_req_parse(int kind, const char *body, size_t len, srv_req *out, char *msg, size_t cap);
void srv_req_free(srv_req *r);

/* What the finished generation produced, for the response builders. */
typedef struct srv_result {
    const char *id;           /* "chatcmpl-..." / "cmpl-..." */
    const char *model;
    long long   created;
    const char *text;         /* generated text (stop string removed) */
    size_t      len;
    const char *finish;       /* "stop" or "length" ("tool_calls" is decided here) */
    int         prompt_tokens, completion_tokens, cached_tokens;
    double      prompt_ms, gen_ms;
} srv_result;

/* The non-streaming response body (malloc'd JSON), parsing tool_calls when
 * r->tools is set. NULL on OOM. */
char *srv_build_response(const srv_req *rq, const srv_result *r);
/* SSE: one `data: {...}\n\n` event (malloc'd). delta_text NULL with
 * role_chunk: the opening chat chunk; finish non-NULL: the closing chunk,
 * which for a tool request carries the parsed tool_calls of full_text. */
char *srv_sse_chunk(const srv_req *rq, const srv_result *r, const char *delta, size_t delta_len, int role_chunk,
                    const char *finish, const char *full_text, size_t full_len);
/* SSE usage chunk (stream_options.include_usage). */
char *srv_sse_usage(const srv_req *rq, const srv_result *r);

/* OpenAI-shaped error body: {"error":{"code":S,"message":M,"type":T}}. */
char *srv_error_json(int status, const char *message);

#endif

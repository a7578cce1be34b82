/* Unit checks of apps/server/server_api.c: request parsing and validation,
 * how tools and tool messages reach the template, and the response building
 * (tool_calls parsed from model text, SSE chunks, UTF-8 cleaning). Built and
 * run by tests/cli/test_server.sh; prints "PASS name" / "FAIL name". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "server.h"

static int n_fail;

static void check(const char *name, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) n_fail++;
}

static int parse(int kind, const char *body, srv_req *r, char *msg)
{
    return srv_req_parse(kind, body, strlen(body), r, msg, 256);
}

static int status_of(int kind, const char *body)
{
    srv_req r;
    char msg[256];
    int st = parse(kind, body, &r, msg);
    srv_req_free(&r);
    return st;
}

static cJSON *path(cJSON *o, const char *a, int idx, const char *b)
{
    cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (idx >= 0) x = cJSON_GetArrayItem(x, idx);
    return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

int main(void)
{
    char msg[256];
    srv_req r;

    /* ==== validation ==== */
    check("400 not JSON", status_of(SRV_CHAT, "{nope") == 400);
    check("400 not an object", status_of(SRV_CHAT, "[1]") == 400);
    check("400 messages missing", status_of(SRV_CHAT, "{}") == 400);
    check("400 max_tokens string", status_of(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"3\"}") == 400);
    check("400 max_tokens fraction", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":1.5}") == 400);
    check("400 temperature string", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"temperature\":\"hot\"}") == 400);
    check("400 top_p > 1", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"top_p\":2}") == 400);
    check("400 stream not bool", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"stream\":1}") == 400);
    check("400 n = 2", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"n\":2}") == 400);
    check("400 stop number", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"stop\":3}") == 400);
    check("400 17 stop strings", status_of(SRV_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\","
                                           "\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}") == 400);
    check("400 prompt number", status_of(SRV_COMPLETION, "{\"prompt\":7}") == 400);
    check("400 unknown role", status_of(SRV_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}") == 400);
    check("400 image part", status_of(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}") == 400);
    check("400 tools not array", status_of(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}") == 400);
    check("400 bad tool_choice", status_of(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"always\"}") == 400);

    /* ==== fields ==== */
    int st = parse(SRV_COMPLETION, "{\"prompt\":[\"hi\"],\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"seed\":42,"
                                    "\"stop\":[\"\\n\",\"\"],\"stream\":true,\"stream_options\":{\"include_usage\":true}}", &r, msg);
    check("completion fields", st == 0 && !strcmp(r.prompt, "hi") && r.max_tokens == 5 && r.so.temp == 0.0f &&
                                   r.so.top_p == 0.5f && r.seed_set && r.so.seed == 42 && r.n_stop == 1 &&
                                   !strcmp(r.stop[0], "\n") && r.stream && r.include_usage);
    srv_req_free(&r);
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, msg);
    check("llama-server defaults", st == 0 && r.max_tokens == -1 && r.so.temp > 0.79f && r.so.temp < 0.81f &&
                                       r.so.top_k == 40 && !r.seed_set && !r.tools);
    srv_req_free(&r);

    /* ==== tools in the prompt ==== */
    const char *tool_req =
        "{\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather \"},{\"type\":\"text\",\"text\":\"in Paris?\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]}";
    st = parse(SRV_CHAT, tool_req, &r, msg);
    check("tools request parses", st == 0 && r.tools && r.n_msgs == 4);
    if (st == 0 && r.n_msgs == 4) {
        check("tools block is a system message", !strcmp(r.msgs[0].role, "system") &&
              strstr(r.msgs[0].content, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"") != NULL);
        check("text parts joined", !strcmp(r.msgs[1].content, "Weather in Paris?"));
        check("assistant tool_calls rendered", !strcmp(r.msgs[2].role, "assistant") &&
              !strcmp(r.msgs[2].content, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
        check("tool result as user turn", !strcmp(r.msgs[3].role, "user") &&
              !strcmp(r.msgs[3].content, "<tool_response>\n21C\n</tool_response>"));
    }
    srv_req_free(&r);
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"x\"}],"
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", &r, msg);
    check("tools appended to the system message", st == 0 && r.n_msgs == 2 &&
          !strncmp(r.msgs[0].content, "Be brief.\n\n# Tools", 18));
    srv_req_free(&r);
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", &r, msg);
    check("tool_choice none: no tools", st == 0 && !r.tools && r.n_msgs == 1);
    srv_req_free(&r);

    /* ==== responses ==== */
    srv_req rq;
    parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
          &rq, msg);
    const char *txt = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    srv_result res = { .id = "chatcmpl-1", .model = "m", .created = 1, .text = txt, .len = strlen(txt), .finish = "stop",
                       .prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 4 };
    char *b = srv_build_response(&rq, &res);
    cJSON *o = cJSON_Parse(b);
    cJSON *m = path(o, "choices", 0, "message");
    cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0);
    cJSON *fn = cJSON_GetObjectItem(tc, "function");
    cJSON *args = fn ? cJSON_Parse(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments"))) : NULL;
    check("tagged call -> tool_calls", o && fn && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")), "get_weather") &&
          args && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(args, "city")), "Paris"));
    check("finish_reason tool_calls", o && !strcmp(cJSON_GetStringValue(path(o, "choices", 0, "finish_reason")), "tool_calls"));
    check("text around the call kept", m && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m, "content")), "Let me check."));
    check("call id", tc && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(tc, "id")), "call_chatcmpl-1_0"));
    check("usage", o && cJSON_GetObjectItem(path(o, "usage", -1, NULL), "total_tokens")->valuedouble == 15 &&
          path(o, "usage", -1, "prompt_tokens_details") &&
          cJSON_GetObjectItem(path(o, "usage", -1, "prompt_tokens_details"), "cached_tokens")->valuedouble == 4);
    cJSON_Delete(args);
    cJSON_Delete(o);
    free(b);

    const char *bare = "{\"name\": \"f\", \"arguments\": {}}";
    res.text = bare; res.len = strlen(bare);
    b = srv_build_response(&rq, &res);
    o = cJSON_Parse(b);
    m = path(o, "choices", 0, "message");
    check("bare JSON call, content null", m && cJSON_GetObjectItem(m, "tool_calls") && cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
    cJSON_Delete(o);
    free(b);

    const char *broken = "<tool_call>{\"name\": \"f\", \"argu";
    res.text = broken; res.len = strlen(broken); res.finish = "length";
    b = srv_build_response(&rq, &res);
    o = cJSON_Parse(b);
    m = path(o, "choices", 0, "message");
    check("unclosed call stays text", m && !cJSON_GetObjectItem(m, "tool_calls") &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m, "content")), broken) &&
          !strcmp(cJSON_GetStringValue(path(o, "choices", 0, "finish_reason")), "length"));
    cJSON_Delete(o);
    free(b);

    res.text = txt; res.len = strlen(txt); res.finish = "stop";
    b = srv_sse_chunk(&rq, &res, NULL, 0, 0, "stop", txt, strlen(txt));
    check("SSE closing chunk carries tool_calls", b && !strncmp(b, "data: {", 7) && strstr(b, "\"tool_calls\":[{\"index\":0") &&
          strstr(b, "\"finish_reason\":\"tool_calls\"") && !strcmp(b + strlen(b) - 2, "\n\n"));
    free(b);
    srv_req_free(&rq);

    /* ==== text cleaning ==== */
    parse(SRV_COMPLETION, "{\"prompt\":\"x\"}", &rq, msg);
    const char raw[] = "a\xff" "b\xe2\x82" "c\0d\xc3\xa9";
    res.text = raw; res.len = sizeof raw - 1;
    b = srv_build_response(&rq, &res);
    o = cJSON_Parse(b);
    check("invalid UTF-8 -> U+FFFD, NUL -> \\u0000", b && strstr(b, "\"text\":\"a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\\u0000d\xc3\xa9\"") != NULL);
    check("completion shape", o && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "object")), "text_completion") &&
          cJSON_IsNull(path(o, "choices", 0, "logprobs")));
    cJSON_Delete(o);
    free(b);
    b = srv_sse_usage(&rq, &res);
    check("usage chunk", b && strstr(b, "\"choices\":[]") && strstr(b, "\"usage\":{"));
    free(b);
    srv_req_free(&rq);

    b = srv_error_json(413, "too big");
    check("error shape", b && !strcmp(b, "{\"error\":{\"code\":413,\"message\":\"too big\",\"type\":\"invalid_request_error\"}}"));
    free(b);

    printf("UNIT_DONE failed=%d\n", n_fail);
    return 0;
}

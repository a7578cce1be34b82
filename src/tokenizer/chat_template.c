/* chat_template: llama.cpp's legacy chat formats (see chat_template.h).
 *
 * Detection follows llm_chat_detect_template branch by branch, including the
 * families we do not render, because the order decides ties (a phi-4 template
 * also contains <|im_start|>). Rendering follows llm_chat_apply_template for
 * our families; trim() there is C isspace() on both ends (ASCII space, \t,
 * \n, \v, \f, \r). Output goes through a bounded writer that counts what it
 * could not store, so the caller learns the full length in one pass. */
#include "tokenizer/chat_template.h"

#include <string.h>

/* ==== Names ==== */

static const char *const k_names[CHAT_TMPL_COUNT] = {
    [CHAT_TMPL_CHATML]            = "chatml",
    [CHAT_TMPL_LLAMA2]            = "llama2",
    [CHAT_TMPL_LLAMA2_SYS]        = "llama2-sys",
    [CHAT_TMPL_LLAMA2_SYS_BOS]    = "llama2-sys-bos",
    [CHAT_TMPL_LLAMA2_SYS_STRIP]  = "llama2-sys-strip",
    [CHAT_TMPL_MISTRAL_V1]        = "mistral-v1",
    [CHAT_TMPL_MISTRAL_V3]        = "mistral-v3",
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_TMPL_MISTRAL_V7]        = "mistral-v7",
    [CHAT_TMPL_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_TMPL_LLAMA3]            = "llama3",
    [CHAT_TMPL_LLAMA4]            = "llama4",
    [CHAT_TMPL_DEEPSEEK2]         = "deepseek2",
    [CHAT_TMPL_DEEPSEEK3]         = "deepseek3",
    [CHAT_TMPL_GPT_OSS]           = "gpt-oss",
};

/* llama.cpp names of the families it knows and we do not render: a bare
 * name among these is "recognised but unsupported". */
static const char *const k_other_names[] = {
    "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma", "orion", "openchat", "vicuna",
    "vicuna-orca", "deepseek", "command-r", "chatglm3", "chatglm4", "glmedge", "minicpm",
    "exaone3", "exaone4", "rwkv-world", "granite", "gigachat", "megrez", "yandex", "bailing",
    "smolvlm", "hunyuan-moe", "hunyuan-dense", "kimi-k2", "seed_oss", "dots1", NULL
};

int chat_template_from_name(const char *name)
{
    if (!name) return ERR_NOTFOUND;
    for (int i = 0; i < CHAT_TMPL_COUNT; i++)
        if (!strcmp(name, k_names[i])) return i;
    return ERR_NOTFOUND;
}

const char *chat_template_name(int tmpl)
{
    return tmpl >= 0 && tmpl < CHAT_TMPL_COUNT ? k_names[tmpl] : NULL;
}

/* ==== Detection ==== */

static int has(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

/* llm_chat_detect_template's chain: returns our id, or -1 with *family set to
 * the llama.cpp name of a family we do not render (NULL: nothing matched). */
static int detect(const char *t, const char **family)
{
    *family = NULL;
    int id = chat_template_from_name(t);
    if (id >= 0) return id;
    for (size_t i = 0; k_other_names[i]; i++)
        if (!strcmp(t, k_other_names[i])) { *family = k_other_names[i]; return -1; }

    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>")) { *family = "phi4"; return -1; }
        if (has(t, "<end_of_utterance>")) { *family = "smolvlm"; return -1; }
        return CHAT_TMPL_CHATML;
    }
    if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]")) return CHAT_TMPL_MISTRAL_V7;
        if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
            if (has(t, " [INST]")) return CHAT_TMPL_MISTRAL_V1;
            if (has(t, "\"[INST]\"")) return CHAT_TMPL_MISTRAL_V3_TEKKEN;
            return CHAT_TMPL_MISTRAL_V3;
        }
        if (has(t, "content.strip()")) return CHAT_TMPL_LLAMA2_SYS_STRIP;
        if (has(t, "bos_token + '[INST]")) return CHAT_TMPL_LLAMA2_SYS_BOS;
        if (has(t, "<<SYS>>")) return CHAT_TMPL_LLAMA2_SYS;
        return CHAT_TMPL_LLAMA2;
    }
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) { *family = "phi3"; return -1; }
    if (has(t, "[gMASK]<sop>")) { *family = "chatglm4"; return -1; }
    if (has(t, "<|assistant|>") && has(t, "<|user|>")) { *family = has(t, "</s>") ? "falcon3" : "glmedge"; return -1; }
    if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>")) { *family = "glmedge"; return -1; }
    if (has(t, "<|user|>") && has(t, "<|endoftext|>")) { *family = "zephyr"; return -1; }
    if (has(t, "bos_token + message['role']")) { *family = "monarch"; return -1; }
    if (has(t, "<start_of_turn>")) { *family = "gemma"; return -1; }
    if (has(t, "'\\n\\nAssistant: ' + eos_token")) { *family = "orion"; return -1; }
    if (has(t, "GPT4 Correct ")) { *family = "openchat"; return -1; }
    if (has(t, "USER: ") && has(t, "ASSISTANT: ")) { *family = has(t, "SYSTEM: ") ? "vicuna-orca" : "vicuna"; return -1; }
    if (has(t, "### Instruction:") && has(t, "<|EOT|>")) { *family = "deepseek"; return -1; }
    if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>")) { *family = "command-r"; return -1; }
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return CHAT_TMPL_LLAMA3;
    if (has(t, "[gMASK]sop")) { *family = "chatglm3"; return -1; }
    if (has(t, "<\xe7\x94\xa8\xe6\x88\xb7>")) { *family = "minicpm"; return -1; }   /* <用户> */
    if (has(t, "'Assistant: ' + message['content'] + eos_token")) return CHAT_TMPL_DEEPSEEK2;
    if (has(t, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && has(t, "<\xef\xbd\x9c" "User\xef\xbd\x9c>") &&
        has(t, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"))
        return CHAT_TMPL_DEEPSEEK3;
    if (has(t, "[|system|]") && has(t, "[|assistant|]") && has(t, "[|endofturn|]")) {
        *family = has(t, "[|tool|]") ? "exaone4" : "exaone3";
        return -1;
    }
    if (has(t, "rwkv-world") || has(t, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}")) { *family = "rwkv-world"; return -1; }
    if (has(t, "<|start_of_role|>")) { *family = "granite"; return -1; }
    if (has(t, "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]")) {
        *family = "gigachat";
        return -1;
    }
    if (has(t, "<|role_start|>")) { *family = "megrez"; return -1; }
    if (has(t, " \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd\xd1\x82:")) { *family = "yandex"; return -1; }   /* " Ассистент:" */
    if (has(t, "<role>ASSISTANT</role>") && has(t, "'HUMAN'")) { *family = "bailing"; return -1; }
    if (has(t, "<|header_start|>") && has(t, "<|header_end|>")) return CHAT_TMPL_LLAMA4;
    if (has(t, "<|endofuserprompt|>")) { *family = "dots1"; return -1; }
    if (has(t, "<|extra_0|>") && has(t, "<|extra_4|>")) { *family = "hunyuan-moe"; return -1; }
    if (has(t, "<|start|>") && has(t, "<|channel|>")) return CHAT_TMPL_GPT_OSS;
    if (has(t, "<\xef\xbd\x9chy_Assistant\xef\xbd\x9c>") && has(t, "<\xef\xbd\x9chy_place\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81" "3\xef\xbd\x9c>")) {
        *family = "hunyuan-dense";
        return -1;
    }
    if (has(t, "<|im_assistant|>assistant<|im_middle|>")) { *family = "kimi-k2"; return -1; }
    if (has(t, "<seed:bos>")) { *family = "seed_oss"; return -1; }
    return -1;
}

int chat_template_detect(const char *tmpl)
{
    const char *family;
    int id = detect(tmpl ? tmpl : "chatml", &family);
    if (id >= 0) return id;
    return family ? ERR_UNSUPPORTED : ERR_NOTFOUND;
}

const char *chat_template_detect_family(const char *tmpl)
{
    const char *family;
    int id = detect(tmpl ? tmpl : "chatml", &family);
    return id >= 0 ? k_names[id] : family;
}

/* ==== Rendering ==== */

typedef struct wr { char *out; size_t cap, n; } wr;   /* bounded writer: n counts everything */

static void put_n(wr *w, const char *s, size_t len)
{
    if (w->n < w->cap) {
        size_t room = w->cap - w->n;
        memcpy(w->out + w->n, s, len < room ? len : room);
    }
    w->n += len;
}

static void put(wr *w, const char *s) { put_n(w, s, strlen(s)); }

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* llama.cpp's trim(): isspace() off both ends */
static void put_trim(wr *w, const char *s)
{
    size_t a = 0, b = strlen(s);
    while (a < b && is_space(s[a])) a++;
    while (b > a && is_space(s[b - 1])) b--;
    put_n(w, s + a, b - a);
}

static void put_content(wr *w, const char *s, int trim)
{
    if (trim) put_trim(w, s);
    else put(w, s);
}

int chat_apply(int tmpl, const chat_msg *msgs, size_t n, int add_ass,
               char *out, size_t cap, size_t *n_out, err *e)
{
    if (n_out) *n_out = 0;
    if (tmpl < 0 || tmpl >= CHAT_TMPL_COUNT) return err_setf(e, ERR_USAGE, "chat template id %d is not valid", tmpl);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return err_setf(e, ERR_USAGE, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
    wr w = { out, out ? cap : 0, 0 };

    switch (tmpl) {
    case CHAT_TMPL_CHATML:
        for (size_t i = 0; i < n; i++) {
            put(&w, "<|im_start|>"); put(&w, msgs[i].role); put(&w, "\n");
            put(&w, msgs[i].content); put(&w, "<|im_end|>\n");
        }
        if (add_ass) put(&w, "<|im_start|>assistant\n");
        break;

    case CHAT_TMPL_MISTRAL_V7:
    case CHAT_TMPL_MISTRAL_V7_TEKKEN: {
        const char *sp = tmpl == CHAT_TMPL_MISTRAL_V7 ? " " : "";
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) { put(&w, "[SYSTEM_PROMPT]"); put(&w, sp); put(&w, msgs[i].content); put(&w, "[/SYSTEM_PROMPT]"); }
            else if (!strcmp(r, "user")) { put(&w, "[INST]"); put(&w, sp); put(&w, msgs[i].content); put(&w, "[/INST]"); }
            else { put(&w, sp); put(&w, msgs[i].content); put(&w, "</s>"); }
        }
        break;   /* llama.cpp adds no generation prompt here */
    }

    case CHAT_TMPL_MISTRAL_V1:
    case CHAT_TMPL_MISTRAL_V3:
    case CHAT_TMPL_MISTRAL_V3_TEKKEN: {
        const char *lead = tmpl == CHAT_TMPL_MISTRAL_V1 ? " " : "";
        const char *trail = tmpl == CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
        int trim_ass = tmpl == CHAT_TMPL_MISTRAL_V3;
        int inside = 0;
        for (size_t i = 0; i < n; i++) {
            if (!inside) { put(&w, lead); put(&w, "[INST]"); put(&w, trail); inside = 1; }
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) { put(&w, msgs[i].content); put(&w, "\n\n"); }
            else if (!strcmp(r, "user")) { put(&w, msgs[i].content); put(&w, lead); put(&w, "[/INST]"); }
            else { put(&w, trail); put_content(&w, msgs[i].content, trim_ass); put(&w, "</s>"); inside = 0; }
        }
        break;
    }

    case CHAT_TMPL_LLAMA2:
    case CHAT_TMPL_LLAMA2_SYS:
    case CHAT_TMPL_LLAMA2_SYS_BOS:
    case CHAT_TMPL_LLAMA2_SYS_STRIP: {
        int sys_ok = tmpl != CHAT_TMPL_LLAMA2;
        int bos_inside = tmpl == CHAT_TMPL_LLAMA2_SYS_BOS;
        int strip = tmpl == CHAT_TMPL_LLAMA2_SYS_STRIP;
        int inside = 1;   /* the first [INST] is written without BOS */
        put(&w, "[INST] ");
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!inside) { inside = 1; put(&w, bos_inside ? "<s>[INST] " : "[INST] "); }
            if (!strcmp(r, "system")) {
                if (sys_ok) { put(&w, "<<SYS>>\n"); put_content(&w, msgs[i].content, strip); put(&w, "\n<</SYS>>\n\n"); }
                else { put_content(&w, msgs[i].content, strip); put(&w, "\n"); }
            } else if (!strcmp(r, "user")) {
                put_content(&w, msgs[i].content, strip); put(&w, " [/INST]");
            } else {
                put_content(&w, msgs[i].content, strip); put(&w, "</s>");
                inside = 0;
            }
        }
        break;
    }

    case CHAT_TMPL_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            put(&w, "<|start_header_id|>"); put(&w, msgs[i].role); put(&w, "<|end_header_id|>\n\n");
            put_trim(&w, msgs[i].content); put(&w, "<|eot_id|>");
        }
        if (add_ass) put(&w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;

    case CHAT_TMPL_LLAMA4:
        for (size_t i = 0; i < n; i++) {
            put(&w, "<|header_start|>"); put(&w, msgs[i].role); put(&w, "<|header_end|>\n\n");
            put_trim(&w, msgs[i].content); put(&w, "<|eot|>");
        }
        if (add_ass) put(&w, "<|header_start|>assistant<|header_end|>\n\n");
        break;

    case CHAT_TMPL_DEEPSEEK2:
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) { put(&w, msgs[i].content); put(&w, "\n\n"); }
            else if (!strcmp(r, "user")) { put(&w, "User: "); put(&w, msgs[i].content); put(&w, "\n\n"); }
            else if (!strcmp(r, "assistant")) {
                put(&w, "Assistant: "); put(&w, msgs[i].content);
                put(&w, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
            }
        }
        if (add_ass) put(&w, "Assistant:");
        break;

    case CHAT_TMPL_DEEPSEEK3:
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) { put(&w, msgs[i].content); put(&w, "\n\n"); }
            else if (!strcmp(r, "user")) { put(&w, "<\xef\xbd\x9c" "User\xef\xbd\x9c>"); put(&w, msgs[i].content); }
            else if (!strcmp(r, "assistant")) {
                put(&w, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"); put(&w, msgs[i].content);
                put(&w, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
            }
        }
        if (add_ass) put(&w, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
        break;

    case CHAT_TMPL_GPT_OSS:
        for (size_t i = 0; i < n; i++) {
            put(&w, "<|start|>"); put(&w, msgs[i].role); put(&w, "<|message|>"); put(&w, msgs[i].content);
            put(&w, strcmp(msgs[i].role, "assistant") ? "<|end|>" : "<|return|>");
        }
        if (add_ass) put(&w, "<|start|>assistant");
        break;

    default:
        return err_setf(e, ERR_USAGE, "chat template id %d is not valid", tmpl);
    }

    if (n_out) *n_out = w.n;
    if (w.n < w.cap) { out[w.n] = '\0'; return 0; }
    if (w.cap) out[w.cap - 1] = '\0';
    return err_setf(e, ERR_RANGE, "chat text of %zu bytes (plus NUL) does not fit in %zu", w.n, w.cap);
}

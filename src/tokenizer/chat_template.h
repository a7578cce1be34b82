/* chat_template: llama.cpp's built-in chat formats (llm_chat_detect_template
 * and llm_chat_apply_template in src/llama-chat.cpp), for the MoE families
 * we run.
 *
 * A template is named by a small integer (CHAT_TMPL_*). It is chosen either
 * by name (llama.cpp's names: "chatml", "llama2", "mistral-v7", "llama3",
 * "deepseek3", "gpt-oss", ...) or detected from the text of the model's
 * tokenizer.chat_template by llama.cpp's substring heuristics, in llama.cpp's
 * order, so that a template llama.cpp sends to another family (phi-4's
 * <|im_start|>...<|im_sep|>, say) is not mistaken for one of ours.
 * chat_apply then writes exactly the string llama.cpp's
 * llm_chat_apply_template writes. This is not a Jinja engine: like llama.cpp's
 * legacy path it ignores the template text beyond detection.
 *
 * Stateless; every function is thread-safe. */
#ifndef STRATA_CHAT_TEMPLATE_H
#define STRATA_CHAT_TEMPLATE_H

#include <stddef.h>
#include "util/err.h"

enum chat_tmpl {
    CHAT_TMPL_CHATML = 0,          /* Qwen2/Qwen3 (MoE), OLMoE instruct...: <|im_start|> */
    CHAT_TMPL_LLAMA2,              /* [INST] family (Mixtral): plain */
    CHAT_TMPL_LLAMA2_SYS,          /*   with <<SYS>> */
    CHAT_TMPL_LLAMA2_SYS_BOS,      /*   with <s> inside the history */
    CHAT_TMPL_LLAMA2_SYS_STRIP,    /*   with stripped contents */
    CHAT_TMPL_MISTRAL_V1,
    CHAT_TMPL_MISTRAL_V3,
    CHAT_TMPL_MISTRAL_V3_TEKKEN,
    CHAT_TMPL_MISTRAL_V7,
    CHAT_TMPL_MISTRAL_V7_TEKKEN,
    CHAT_TMPL_LLAMA3,              /* <|start_header_id|> */
    CHAT_TMPL_LLAMA4,              /* <|header_start|> (Llama 4 MoE) */
    CHAT_TMPL_DEEPSEEK2,           /* DeepSeek-V2 "User: ... Assistant:" */
    CHAT_TMPL_DEEPSEEK3,           /* <｜User｜> <｜Assistant｜> */
    CHAT_TMPL_GPT_OSS,             /* harmony: <|start|>role<|message|>... */
    CHAT_TMPL_COUNT
};

typedef struct chat_msg {
    const char *role;      /* "system", "user", "assistant", ... (NUL-terminated, borrowed) */
    const char *content;   /* NUL-terminated, borrowed */
} chat_msg;

/* Template id for a llama.cpp template name, or ERR_NOTFOUND. */
int chat_template_from_name(const char *name);

/* llama.cpp's name for a template id ("chatml", ...), or NULL. */
const char *chat_template_name(int tmpl);

/* Detect the family from tokenizer.chat_template text (a bare name is
 * accepted too, as llama.cpp does; NULL means "chatml", llama.cpp's default).
 * Returns a CHAT_TMPL_* id, ERR_UNSUPPORTED when llama.cpp recognises a
 * family we do not render (chat_template_detect_family() names it), or
 * ERR_NOTFOUND when nothing matches. */
int chat_template_detect(const char *tmpl);

/* llama.cpp's name for the family detect would pick ("phi4", "gemma", ...),
 * including the ones we do not render; NULL when nothing matches. */
const char *chat_template_detect_family(const char *tmpl);

/* Format msgs[0..n) with template tmpl; add_generation_prompt appends the
 * assistant turn's opening where the family has one. Writes at most cap bytes
 * to out (NUL-terminated when the text is shorter than cap; out may be NULL
 * with cap 0) and sets *n_out to the full length. Returns 0, ERR_RANGE when
 * the text does not fit (retry with *n_out + 1), ERR_USAGE for a bad template
 * id or a message with a NULL role/content. */
int chat_apply(int tmpl, const chat_msg *msgs, size_t n, int add_generation_prompt,
               char *out, size_t cap, size_t *n_out, err *e);

#endif

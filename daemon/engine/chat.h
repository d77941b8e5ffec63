/* chat: renders chat messages into a prompt as llama.cpp's built-in chat templates do, the family detected from the model's template text. */
#ifndef CHAT_H
#define CHAT_H

#include <stddef.h>

/* One chat message (the socket protocol's and HTTP's messages are these: proto_msg_t). */
typedef struct chat_msg {
    char role[16];      /* "system" | "user" | "assistant" | "tool" */
    char *content;      /* UTF-8, owned */
    char *tool_calls;   /* assistant: OpenAI's tool_calls array as compact JSON text, owned;
                           NULL = none (engine/chat_tools.h renders it) */
    char *tool_call_id; /* tool: the call it answers, owned; NULL = none */
} chat_msg_t;

/* The families of llama.cpp's built-in templates (c392e50, llama-chat.cpp);
 * chat.c's table holds what each one detects by and renders. */
typedef enum chat_family {
    CHAT_NONE = 0, /* the model has no tokenizer.chat_template */
    CHAT_UNKNOWN,  /* it has one that matches no family */
    CHAT_CHATML,
    CHAT_LLAMA2,
    CHAT_LLAMA2_SYS,
    CHAT_LLAMA2_SYS_BOS,
    CHAT_LLAMA2_SYS_STRIP,
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN,
    CHAT_MISTRAL_V7,
    CHAT_PHI3,
    CHAT_PHI4,
    CHAT_FALCON3,
    CHAT_ZEPHYR,
    CHAT_MONARCH,
    CHAT_GEMMA,
    CHAT_ORION,
    CHAT_OPENCHAT,
    CHAT_VICUNA,
    CHAT_VICUNA_ORCA,
    CHAT_DEEPSEEK,
    CHAT_DEEPSEEK2,
    CHAT_DEEPSEEK3,
    CHAT_COMMAND_R,
    CHAT_LLAMA3,
    CHAT_CHATGLM3,
    CHAT_CHATGLM4,
    CHAT_GLMEDGE,
    CHAT_MINICPM,
    CHAT_EXAONE3,
    CHAT_RWKV_WORLD,
    CHAT_GRANITE,
    CHAT_GIGACHAT,
    CHAT_MEGREZ,
} chat_family_t;

enum {
    CHAT_OK = 0,
    CHAT_ERR_TEMPLATE = -1, /* no template, or one gpuswapd does not know */
    CHAT_ERR_NOMEM = -2,
};

/* Which family a tokenizer.chat_template (Jinja text, or a family name as
 * llama.cpp also accepts) belongs to, by llama.cpp's rules: CHAT_NONE for
 * no text (NULL or empty), CHAT_UNKNOWN when nothing matches. */
chat_family_t chat_detect(const char *tmpl, size_t len);

/* The family of a name ("chatml", "llama3", ..., as llama.cpp spells them);
 * CHAT_UNKNOWN if it is none (the config's chat_template: key uses this). */
chat_family_t chat_family_from_name(const char *name);

/* The name of family f ("chatml", ...): "none" for CHAT_NONE, "unknown" for others without one. */
const char *chat_family_name(chat_family_t f);

/* Writes the family names, comma-separated, into buf (for messages). */
void chat_family_list(char *buf, size_t cap);

/* Renders the messages and the assistant prefix as llama.cpp's
 * llama_chat_apply_template does with add_ass: the text holds no BOS (the
 * tokenizer adds it when the vocabulary asks), and its special-token text
 * must be parsed (tok_encode parse_special = 1). *out is malloc'ed (caller
 * frees). CHAT_ERR_TEMPLATE with the reason in err for CHAT_NONE and
 * CHAT_UNKNOWN. */
int chat_render(chat_family_t f, const chat_msg_t *msgs, size_t n, char **out, char *err,
                size_t errlen);

#endif

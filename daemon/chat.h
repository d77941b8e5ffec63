/* chat: renders chat messages into a prompt with the model's chat template family (ChatML, Llama 2, Llama 3, Zephyr). */
#ifndef CHAT_H
#define CHAT_H

#include <stddef.h>

#include "proto.h"

typedef enum chat_family {
    CHAT_NONE = 0,
    CHAT_CHATML,  /* <|im_start|>role ... <|im_end|> (Qwen, many fine-tunes) */
    CHAT_LLAMA2,  /* [INST] <<SYS>> ... [/INST] */
    CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    CHAT_ZEPHYR,  /* <|user|> ... </s> (TinyLlama chat, Zephyr) */
} chat_family_t;

/* Which family a tokenizer.chat_template (Jinja text) belongs to; CHAT_NONE
 * when it is absent or not one we know (a clear error, never a guess). */
chat_family_t chat_detect(const char *tmpl, size_t len);
const char *chat_family_name(chat_family_t f);

/* Renders messages and the assistant prefix. *out is malloc'ed (caller
 * frees); *add_bos says whether the tokenizer should add BOS. Special-token
 * text in the result must be parsed (tok_encode parse_special = 1). */
int chat_render(chat_family_t f, const proto_msg_t *msgs, size_t n, char **out, int *add_bos,
                char *err, size_t errlen);

#endif

/* chat: renders chat messages into a prompt with the model's chat template family (ChatML, Llama 2, Llama 3, Zephyr). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int contains(const char *s, size_t len, const char *needle)
{
    return s && memmem(s, len, needle, strlen(needle)) != NULL;
}

chat_family_t chat_detect(const char *tmpl, size_t len)
{
    if (!tmpl || !len)
        return CHAT_NONE;
    if (contains(tmpl, len, "<|im_start|>"))
        return CHAT_CHATML;
    if (contains(tmpl, len, "<|start_header_id|>"))
        return CHAT_LLAMA3;
    if (contains(tmpl, len, "<|user|>"))
        return CHAT_ZEPHYR;
    if (contains(tmpl, len, "[INST]"))
        return CHAT_LLAMA2;
    return CHAT_NONE;
}

const char *chat_family_name(chat_family_t f)
{
    switch (f) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA2: return "llama2";
    case CHAT_LLAMA3: return "llama3";
    case CHAT_ZEPHYR: return "zephyr";
    default: return "none";
    }
}

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void put(sbuf_t *b, const char *s)
{
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->len + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

int chat_render(chat_family_t f, const proto_msg_t *msgs, size_t n, char **out, int *add_bos,
                char *err, size_t errlen)
{
    sbuf_t b = {0};
    put(&b, "");
    *add_bos = 1;
    switch (f) {
    case CHAT_CHATML:
        *add_bos = 0;
        for (size_t i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, msgs[i].role);
            put(&b, "\n");
            put(&b, msgs[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
        *add_bos = 0;
        put(&b, "<|begin_of_text|>");
        for (size_t i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content);
            put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_ZEPHYR:
        for (size_t i = 0; i < n; i++) {
            put(&b, "<|");
            put(&b, msgs[i].role);
            put(&b, "|>\n");
            put(&b, msgs[i].content);
            put(&b, "</s>\n");
        }
        put(&b, "<|assistant|>\n");
        break;
    case CHAT_LLAMA2: {
        /* BOS is added by the tokenizer for the first turn; later turns
         * close with </s> and open with <s> as the template does */
        const char *sys = NULL;
        size_t i = 0;
        if (n && strcmp(msgs[0].role, "system") == 0) {
            sys = msgs[0].content;
            i = 1;
        }
        int first = 1;
        for (; i < n; i++) {
            if (strcmp(msgs[i].role, "user") == 0) {
                put(&b, first ? "[INST] " : "<s>[INST] ");
                if (first && sys) {
                    put(&b, "<<SYS>>\n");
                    put(&b, sys);
                    put(&b, "\n<</SYS>>\n\n");
                }
                put(&b, msgs[i].content);
                put(&b, " [/INST]");
                first = 0;
            } else if (strcmp(msgs[i].role, "assistant") == 0) {
                put(&b, " ");
                put(&b, msgs[i].content);
                put(&b, " </s>");
            } else {
                free(b.p);
                snprintf(err, errlen, "the llama2 chat template takes a system message only first");
                return -1;
            }
        }
        break;
    }
    default:
        free(b.p);
        snprintf(err, errlen, "the model has no chat template gpuswapd knows (ChatML, Llama 2, "
                 "Llama 3, Zephyr): use generate with a prompt");
        return -1;
    }
    if (b.oom) {
        free(b.p);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *out = b.p;
    return 0;
}

/* chat_buf: the growing string the chat renderers write prompts into (chat.c, chat_tools.c). */
#ifndef CHAT_BUF_H
#define CHAT_BUF_H

#include <stdlib.h>
#include <string.h>

/* A growing string; oom sticks. */
typedef struct chat_buf {
    char *p;
    size_t len, cap;
    int oom;
} chat_buf_t;

static inline void chat_put(chat_buf_t *b, const char *s, size_t n)
{
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
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static inline void chat_puts(chat_buf_t *b, const char *s)
{
    if (s)
        chat_put(b, s, strlen(s));
}

/* The buffer's string (caller frees), NULL on OOM (the buffer freed). */
static inline char *chat_done(chat_buf_t *b)
{
    if (b->oom) {
        free(b->p);
        return NULL;
    }
    if (!b->p)
        chat_put(b, "", 0);
    return b->oom ? NULL : b->p;
}

#endif

/* tok_spm: the SentencePiece ("llama") family: its byte tokens and the encoding of raw text by merge scores. */
#include <string.h>

#include "engine/tokenizer_int.h"

int tok_parse_byte_token(const char *s, size_t n)
{
    int v = 0;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Emit the ids of one final symbol: its token, or its bytes as <0xNN>
 * tokens, or unk for bytes without a token. */
static void tok_emit_spm(const tok_t *t, const char *s, size_t n, tok_out_t *o)
{
    int32_t id = tok_map_get(&t->vocab, s, n);

    if (id >= 0) {
        tok_out_push(o, id);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        id = t->byte_tok[(unsigned char)s[i]];
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            tok_out_push(o, id);
    }
}

int tok_encode_spm(const tok_t *t, tok_work_t *w, const char *s, size_t n, int prefix, tok_out_t *o)
{
    size_t len = 0;
    int nsym;

    if (tok_reserve((void **)&w->buf, &w->bufcap, 3 * n + 3, 1) < 0)
        return TOK_ERR_NOMEM;
    if (prefix) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + len, "\xE2\x96\x81", 3);
            len += 3;
        } else {
            w->buf[len++] = s[i];
        }
    }
    nsym = tok_merge(t, w, len);
    if (nsym < 0)
        return nsym;
    for (int i = nsym > 0 ? 0 : -1; i >= 0; i = w->sym[i].next)
        tok_emit_spm(t, w->buf + w->sym[i].off, w->sym[i].n, o);
    return 0;
}

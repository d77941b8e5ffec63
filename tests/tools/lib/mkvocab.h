/* mkvocab: the vocabularies mkmodel writes (SentencePiece and GPT-2 byte-level BPE), grown so that every piece is reachable by merges. */
#ifndef MKVOCAB_H
#define MKVOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct mk_vocab {
    char **text;    /* n token strings (owned) */
    float *scores;  /* n (SPM only meaningful) */
    int32_t *types; /* n */
    char **merges;  /* n_merges "left right" strings (owned), GPT-2 only */
    size_t n, cap;  /* tokens used / allocated (cap = target vocab size) */
    size_t n_merges;
    uint32_t *hash;        /* open-addressing table of token index + 1; 0 = empty */
    size_t hash_cap;       /* power of two */
    uint32_t byte_cp[256]; /* GPT-2: code point of each byte's base character */
    int gpt2;
} mk_vocab_t;

/* SentencePiece vocab of n tokens: <unk> <s> </s>, the 256 byte tokens,
 * pieces, a last control token `last` unless NULL, then the n_extra control
 * tokens extra (none: the vocab as before they existed). -1 on failure. */
int mk_vocab_spm(mk_vocab_t *v, size_t n, const char *last, const char *const *extra,
                 size_t n_extra);
/* GPT-2 byte-level BPE vocab of n tokens: 256 byte characters, merged
 * tokens, then <|endoftext|>, <|im_start|>, <|im_end|> and the n_extra control
 * tokens extra. -1 on failure. */
int mk_vocab_gpt2(mk_vocab_t *v, size_t n, const char *const *extra, size_t n_extra);
void mk_vocab_free(mk_vocab_t *v);

#endif

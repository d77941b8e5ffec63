/* cons_trie: the vocabulary trie's layout, for the constrain module's files. */
#ifndef CONS_TRIE_H
#define CONS_TRIE_H

#include <stdint.h>

#include "engine/cons_int.h"

#define CONS_TOKEN_MAX 64 /* bytes of the longest token the trie holds */

/* Tokens laid out as a trie in preorder: node i's byte, its depth (1 = a token's first byte), the
 * index past its subtree, and the tokens ending at it: toks[tok[i] .. tok[i + 1]). */
typedef struct cons_tnodes {
    uint8_t *byte;
    uint8_t *depth;
    uint32_t *skip;
    uint32_t *tok; /* (n + 1) */
    int32_t *toks;
    uint32_t n;
} cons_tnodes_t;

struct cons_vocab {
    int32_t n_vocab;
    uint8_t *pool;     /* every token's bytes */
    uint32_t *tok_off; /* (n_vocab) offset into pool */
    uint8_t *tok_len;  /* (n_vocab) bytes; 0 = not in the trie */
    int32_t *eog;      /* (n_eog) end-of-generation tokens */
    int32_t n_eog;
    cons_tnodes_t all; /* every token with bytes */
    /* Plain string content: the tokens a string's body takes whole and stays in its body (no
     * quote, backslash or control byte; whole UTF-8 characters). Inside a string they are allowed
     * together (as far as a maxLength leaves room), so a mask there walks only `rest`. */
    uint32_t *plain;    /* (ceil(n_vocab / 32)) bit set */
    int32_t *plain_ids; /* (n_plain) */
    uint8_t *tok_chars; /* (n_vocab) characters of a plain token */
    int32_t n_plain;
    uint32_t plain_most; /* characters of the longest plain token */
    cons_tnodes_t rest;  /* the tokens with bytes that are not plain */
};

/* Sets the bits of the tokens that end at node i of t; returns how many. */
static inline int32_t cons_tnodes_take(const cons_tnodes_t *t, uint32_t i, uint32_t *bits)
{
    for (uint32_t k = t->tok[i]; k < t->tok[i + 1]; k++)
        bits[t->toks[k] >> 5] |= 1u << (t->toks[k] & 31);
    return (int32_t)(t->tok[i + 1] - t->tok[i]);
}

/* Sets the bit of every token of t whose bytes states[0] accepts (bits must start cleared; states
 * has CONS_TOKEN_MAX + 1 entries, the rest scratch); returns their count. */
int32_t cons_trie_walk(const cons_tnodes_t *t, const cons_schema_t *sc, cons_state_t *states,
                       uint32_t *bits);
/* The allowed tokens of states[0] (bits cleared first): inside a string's body the plain tokens
 * that fit and a walk of `rest`, elsewhere a walk of `all`. Returns their count (end-of-generation
 * tokens not included). */
int32_t cons_trie_mask(const cons_vocab_t *v, const cons_schema_t *sc, cons_state_t *states,
                       uint32_t *bits);

#endif

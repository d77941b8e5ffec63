/* cons_trie: the vocabulary trie's layout, for the constrain module's files. */
#ifndef CONS_TRIE_H
#define CONS_TRIE_H

#include <stdint.h>

#include "engine/cons_int.h"

#define CONS_TOKEN_MAX 64 /* bytes of the longest token the trie holds */

struct cons_vocab {
    int32_t n_vocab;
    uint8_t *pool;     /* every token's bytes */
    uint32_t *tok_off; /* (n_vocab) offset into pool */
    uint8_t *tok_len;  /* (n_vocab) bytes; 0 = not in the trie */
    int32_t *eog;      /* (n_eog) end-of-generation tokens */
    int32_t n_eog;
    /* the trie in preorder: node i's byte, its depth (1 = a token's first byte), the index past
     * its subtree, and the tokens ending at it: toks[node_tok[i] .. node_tok[i + 1]) */
    uint8_t *node_byte;
    uint8_t *node_depth;
    uint32_t *node_skip;
    uint32_t *node_tok; /* (n_nodes + 1) */
    int32_t *toks;
    uint32_t n_nodes;
};

/* Sets the bit of every token whose bytes states[0] accepts (bits must start cleared; states has
 * CONS_TOKEN_MAX + 1 entries, the rest scratch); *n_allowed gets their count. */
void cons_trie_walk(const cons_vocab_t *v, const cons_schema_t *sc, cons_state_t *states,
                    uint32_t *bits, int32_t *n_allowed);

#endif

/* cons_int: the compiled schema's node table and the byte automaton's state, shared by the
 * constrain module's files (cons_schema.c compiles, cons_match.c steps, cons_trie.c masks). */
#ifndef CONS_INT_H
#define CONS_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/cons_regex.h"
#include "engine/constrain.h"

#define CONS_MAX_DEPTH 32    /* nesting of values in one document */
#define CONS_MAX_LITS 64     /* values of one enum, properties of one object (a uint64_t set) */
#define CONS_MAX_NODES 4096  /* nodes of one compiled schema */
#define CONS_MAX_WS 8        /* consecutive whitespace bytes between JSON tokens */
#define CONS_MAX_COUNT 60000 /* string lengths and item counts above this are unbounded */
#define CONS_INT_DIGITS 15   /* digits of an integer part, of a fraction */
#define CONS_EXP_DIGITS 2    /* digits of an exponent */
#define CONS_UNBOUNDED UINT32_MAX

typedef enum cons_kind {
    CK_ANYOF = 1, /* kids: branches whose first bytes are disjoint */
    CK_OBJECT,    /* props (first, n) in order, or generic (any key) when n == 0 && item >= 0 */
    CK_ARRAY,     /* item, lo..hi items */
    CK_STRING,    /* lo..hi characters */
    CK_NUMBER,
    CK_INTEGER,
    CK_LITS, /* one of n literal JSON texts (enum, const, boolean, null) */
} cons_kind_t;

typedef struct cons_node {
    cons_kind_t kind;
    uint32_t lo, hi;   /* ARRAY: items; STRING: characters; hi CONS_UNBOUNDED = none */
    int32_t item;      /* ARRAY: item node; generic OBJECT: value node; else -1 */
    uint32_t first;    /* ANYOF: into kids; OBJECT: into props; LITS: into lits */
    uint32_t n;        /* how many */
    uint32_t ready;    /* 1 once first_bytes is known (0 while a $ref cycle compiles it) */
    uint32_t start[8]; /* bit set of the bytes a value of this node can start with */
    int64_t min, max;  /* INTEGER: its bounds (INT64_MIN, INT64_MAX: none) */
    int32_t re;        /* STRING: its pattern (pattern or format) in the schema's res, or -1 */
} cons_node_t;

typedef struct cons_prop {
    char *key;    /* the key as JSON text, quotes included ("\"name\"") */
    uint32_t len; /* bytes of key */
    int32_t node; /* the value's node */
    int required;
} cons_prop_t;

typedef struct cons_lit {
    char *text; /* compact JSON text */
    uint32_t len;
} cons_lit_t;

struct cons_schema {
    atomic_int refs;
    cons_node_t *nodes; /* (n_nodes) */
    uint32_t n_nodes, cap_nodes;
    int32_t root;
    int32_t key_str; /* a string node with no bounds (generic objects' keys) */
    int32_t any;     /* the any-value node, -1 until one is needed */
    uint32_t *kids;  /* (n_kids) ANYOF branches */
    uint32_t n_kids, cap_kids;
    cons_prop_t *props; /* (n_props) */
    uint32_t n_props, cap_props;
    cons_lit_t *lits; /* (n_lits) */
    uint32_t n_lits, cap_lits;
    cons_re_t *res; /* (n_res) compiled patterns */
    uint32_t n_res, cap_res;
};

/* Frame states. */
enum {
    ST_START = 0,    /* the value has not begun: whitespace, or its first byte picks the branch */
    ST_O_KEY_OR_END, /* after '{' */
    ST_O_KEY,        /* after ',': a key */
    ST_O_KEYLIT,     /* inside a declared key (cand, pos) */
    ST_O_COLON,      /* after a key */
    ST_O_AFTER,      /* after a member's value: ',' or '}' */
    ST_A_FIRST,      /* after '[' */
    ST_A_ITEM,       /* after ',': an item */
    ST_A_AFTER,      /* after an item: ',' or ']' */
    ST_S_BODY,       /* inside a string */
    ST_S_ESC,        /* after a backslash */
    ST_S_UTF8,       /* inside a multi-byte character (aux: bytes left | first-byte range << 2) */
    ST_N_MINUS,
    ST_N_ZERO,
    ST_N_INT,
    ST_N_DOT,
    ST_N_FRAC,
    ST_N_E,
    ST_N_ESIGN,
    ST_N_EXP,
    ST_L_MATCH, /* inside one of a set of literals (cand, pos) */
};

typedef struct cons_frame {
    uint64_t cand;  /* literal / key candidates still matching (bit i = the i-th of the node's);
                       an integer's digits so far, as a number (aux 1: after a minus); a string's
                       pattern state (cons_re_step) */
    uint16_t node;  /* the node this value follows (after anyOf picked its branch) */
    uint16_t pos;   /* bytes into a literal or key; digits of a number part */
    uint16_t count; /* ARRAY: items begun; STRING: characters; OBJECT: declared props passed */
    uint8_t st;     /* ST_* */
    uint8_t aux;    /* ST_S_UTF8's bytes left and range */
} cons_frame_t;

typedef struct cons_state {
    uint8_t depth; /* frames in use; 0 = the document is complete (or not begun: see begun) */
    uint8_t ws;    /* whitespace bytes in a row */
    uint8_t begun; /* the root frame was pushed */
    cons_frame_t f[CONS_MAX_DEPTH];
} cons_state_t;

/* The state before the first byte of a document of sc. */
void cons_state_init(const cons_schema_t *sc, cons_state_t *s);
/* Feeds one byte: 1 when it may follow, 0 when not (s is then garbage: step a copy). */
int cons_step(const cons_schema_t *sc, cons_state_t *s, uint8_t c);
/* 1 when s is a complete document (only whitespace may follow). */
int cons_state_complete(const cons_schema_t *sc, const cons_state_t *s);
/* Copies the part of src in use into dst. */
static inline void cons_state_copy(cons_state_t *dst, const cons_state_t *src)
{
    dst->depth = src->depth;
    dst->ws = src->ws;
    dst->begun = src->begun;
    for (unsigned i = 0; i < src->depth; i++)
        dst->f[i] = src->f[i];
}

static inline int cons_bit(const uint32_t *set, unsigned c)
{
    return (int)((set[c >> 5] >> (c & 31)) & 1u);
}

#endif

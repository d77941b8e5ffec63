/* cons_gbnf: the compiled grammar (rules flattened into one element table) and the pushdown
 * matcher's state (a bounded set of stacks of element positions), shared by cons_gbnf.c (the
 * parser and compiler), cons_gmatch.c (steps, masks) and constrain.c (the sequence's matcher). */
#ifndef CONS_GBNF_H
#define CONS_GBNF_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/cons_trie.h"
#include "engine/constrain.h"

#define CONS_GBNF_MAX_TEXT 65536  /* bytes of grammar text */
#define CONS_GBNF_MAX_ELEMS 60000 /* elements of the compiled table (positions are uint16_t) */
#define CONS_GBNF_MAX_RULES 4096  /* rules, the generated ones (groups, repetitions) included */
#define CONS_GBNF_MAX_REPEAT 1000 /* m and n of x{m,n} */
#define CONS_GBNF_MAX_STACKS 64   /* parses followed at once */
#define CONS_GBNF_MAX_DEPTH 128   /* frames of one stack (nesting of rules) */
#define CONS_GBNF_POOL 2048       /* frames of all stacks of one state */
#define CONS_GBNF_MAX_EXPAND 256  /* rule references expanded without reading a character */
#define CONS_GBNF_WALK_IDS 64     /* distinct states between characters one mask walk memoizes */
/* states a matcher holds: the current one, one per depth of the trie, the walk's memoized ones */
#define CONS_GBNF_STATES (CONS_TOKEN_MAX + 1 + CONS_GBNF_WALK_IDS)

typedef enum cons_gkind {
    CG_END = 0, /* the end of an alternative */
    CG_CHAR,    /* one character of a class */
    CG_RULE,    /* a reference to a rule */
} cons_gkind_t;

typedef struct cons_gelem {
    uint8_t kind; /* CG_* */
    uint8_t neg;  /* CG_CHAR: the class is every character outside its ranges */
    uint16_t n;   /* CG_CHAR: ranges */
    uint32_t arg; /* CG_CHAR: first range in ranges; CG_RULE: the rule */
} cons_gelem_t;

typedef struct cons_grange {
    uint32_t lo, hi; /* code points, inclusive; a class's ranges are sorted and disjoint */
} cons_grange_t;

struct cons_grammar {
    atomic_int refs;
    cons_gelem_t *elems; /* (n_elems) every rule's alternatives, each closed by CG_END */
    uint32_t n_elems;
    cons_grange_t *ranges; /* (n_ranges) */
    uint32_t n_ranges;
    uint32_t *alt_first; /* (n_rules + 1) rule r's alternatives: alts[alt_first[r] ..) */
    uint32_t *alts;      /* alternatives' first positions in elems */
    uint32_t n_rules;
    uint32_t start; /* position of the start sequence: CG_RULE root, CG_END */
};

/* One matcher state: the parses still alive after the bytes read so far. A stack lists positions
 * bottom first; its top is the next character class to match, the frames below are where to go
 * on once the rule above ends; an empty stack is a complete parse. */
typedef struct cons_gstate {
    uint32_t cp;  /* the bits of a multi-byte character read so far */
    uint8_t need; /* its continuation bytes still to come (0: between characters) */
    uint8_t len;  /* its length in bytes */
    uint16_t n;   /* stacks */
    uint16_t off[CONS_GBNF_MAX_STACKS + 1]; /* stack i = pos[off[i] .. off[i + 1]) */
    uint16_t pos[CONS_GBNF_POOL];
} cons_gstate_t;

/* The state before the first byte: 0, or -1 when the start expands past the limits. */
int cons_gbnf_init(const cons_grammar_t *g, cons_gstate_t *s);
/* Reads byte c from src into dst: 1 when it may follow, 0 when not (dst is then garbage). A
 * byte whose parses would overflow the limits is refused. */
int cons_gbnf_step(const cons_grammar_t *g, const cons_gstate_t *src, cons_gstate_t *dst,
                   uint8_t c);
/* 1 when s is a complete parse of root (between characters, with an empty stack). */
int cons_gbnf_complete(const cons_gstate_t *s);
/* Copies the part of src in use into dst. */
void cons_gbnf_copy(cons_gstate_t *dst, const cons_gstate_t *src);
/* cons_trie_walk for a grammar: sets the bit of every token whose bytes states[0] accepts (bits
 * must start cleared; states has CONS_GBNF_STATES entries, the rest scratch). */
void cons_gbnf_walk(const cons_vocab_t *v, const cons_grammar_t *g, cons_gstate_t *states,
                    uint32_t *bits, int32_t *n_allowed);

#endif

/* cons_regex: a JSON Schema "pattern" (an ECMA-262 regular expression, the subset in
 * docs/CONSTRAINED.md) as a position automaton, stepped one character of a string at a time with
 * its state in 64 bits; the "format"s it enforces are patterns too. */
#ifndef CONS_REGEX_H
#define CONS_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define CONS_RE_POS 62     /* positions (character classes) of one pattern: bits 1..62 */
#define CONS_RE_START 1ull /* state bit: nothing taken yet */
#define CONS_RE_DONE                                                                               \
    (1ull << 63)          /* state bit: an unanchored pattern has matched; anything follows */
#define CONS_RE_OTHER 128 /* the symbol of every non-ASCII character */
#define CONS_RE_FAR 255   /* "unbounded" for a count of characters */

typedef struct cons_re {
    uint64_t first;                       /* positions a match can begin with */
    uint64_t last;                        /* positions a match can end with */
    uint64_t follow[CONS_RE_POS + 1];     /* positions that can follow each position */
    uint64_t by_char[CONS_RE_OTHER + 1];  /* positions each ASCII character (or OTHER) matches */
    uint8_t dmin[CONS_RE_POS + 1];        /* characters from each position to a match, fewest */
    uint8_t dmax[CONS_RE_POS + 1];        /* and most (CONS_RE_FAR: unbounded) */
    uint8_t nullable;                     /* the empty string matches */
    uint8_t anchored_start, anchored_end; /* '^' first, '$' last; else the match may be inside */
} cons_re_t;

/* Compiles pattern into re; 0, or -1 with the reason in err (the part it cannot enforce). */
int cons_re_compile(const char *pattern, cons_re_t *re, char *err, size_t errlen);
/* The pattern of a "format" the compiler enforces (a subset of the format's strings), or NULL. */
const char *cons_re_format(const char *format);
/* The state before the first character. */
uint64_t cons_re_init(const cons_re_t *re);
/* The state after character c (0..127, or CONS_RE_OTHER for any non-ASCII one); 0 when no match
 * can come of it any more. */
uint64_t cons_re_step(const cons_re_t *re, uint64_t state, unsigned c);
/* 1 when the string so far matches. */
int cons_re_accepts(const cons_re_t *re, uint64_t state);
/* The fewest and the most characters (CONS_RE_FAR: unbounded) that can still follow state in a
 * match: a string with a length bound takes a character only when a match still fits. */
void cons_re_left(const cons_re_t *re, uint64_t state, unsigned *fewest, unsigned *most);

#endif

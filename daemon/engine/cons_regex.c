/* cons_regex: JSON Schema patterns as Glushkov position automata (no epsilon moves: a state is the
 * set of positions the last character may have matched), stepped one character at a time.
 * Characters are ASCII ones or one symbol for every non-ASCII character; a class that matches only
 * some non-ASCII characters (\s, \S, '.') is restricted to its ASCII ones, so whatever the
 * automaton lets through matches the pattern. */
#include "engine/cons_regex.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RE_NODES 512
#define RE_INF UINT32_MAX
#define POS_MASK (~(CONS_RE_START | CONS_RE_DONE))

typedef enum {
    RN_EMPTY,
    RN_SET,
    RN_CAT,
    RN_ALT,
    RN_REP
} rn_kind_t;

/* How much of the non-ASCII characters a class item matches. */
enum {
    OTHER_NONE,
    OTHER_SOME,
    OTHER_ALL
};

typedef struct rnode {
    rn_kind_t kind;
    int a, b;        /* CAT, ALT: the two parts; REP: a */
    uint32_t lo, hi; /* REP: counts (hi RE_INF: unbounded) */
    uint64_t set[2]; /* SET: the ASCII characters */
    uint8_t other;   /* SET: 1 when every non-ASCII character matches */
} rnode_t;

typedef struct rparse {
    const char *p, *end; /* cursor and end of the part between the anchors */
    const char *pattern;
    rnode_t n[RE_NODES];
    int nn;
    cons_re_t *re;
    int npos;
    char *err;
    size_t errlen;
    int failed;
} rparse_t;

static int rfail(rparse_t *r, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        int k = snprintf(r->err, r->errlen, "pattern '%.40s': ", r->pattern);
        if (k >= 0 && (size_t)k < r->errlen)
            vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    r->failed = 1;
    return -1;
}

static int node(rparse_t *r, rn_kind_t kind, int a, int b)
{
    if (r->nn >= RE_NODES)
        return rfail(r, "too long");
    r->n[r->nn] = (rnode_t){.kind = kind, .a = a, .b = b};
    return r->nn++;
}

static void set_add(uint64_t set[2], unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi && c < 128; c++)
        set[c >> 6] |= 1ull << (c & 63);
}

/* ------------------------------------------------------------------ parsing */

/* A class escape (\d \D \w \W \s \S) into set; 0 when c is not one. */
static int class_escape(char c, uint64_t set[2], int *other)
{
    uint64_t s[2] = {0, 0};
    char lc = (char)(c | 0x20);
    if (lc == 'd')
        set_add(s, '0', '9');
    else if (lc == 'w') {
        set_add(s, '0', '9');
        set_add(s, 'A', 'Z');
        set_add(s, 'a', 'z');
        set_add(s, '_', '_');
    } else if (lc == 's') {
        set_add(s, '\t', '\r');
        set_add(s, ' ', ' ');
    } else
        return 0;
    int neg = c != lc;
    set[0] |= neg ? ~s[0] : s[0];
    set[1] |= neg ? ~s[1] : s[1];
    /* \d, \w: no non-ASCII; \D, \W: every one; \s, \S: some (Unicode spaces) */
    int o = lc == 's' ? OTHER_SOME : neg ? OTHER_ALL : OTHER_NONE;
    *other = o > *other ? o : *other;
    return 1;
}

/* One character of the pattern (after a backslash when esc): its code, or -1 (failed). */
static int single_escape(rparse_t *r, char c)
{
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x':
    case 'u': {
        int digits = c == 'x' ? 2 : 4, v = 0;
        for (int i = 0; i < digits; i++) {
            char h = r->p < r->end ? *r->p++ : 0;
            int d = h >= '0' && h <= '9'                     ? h - '0'
                    : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10
                                                             : -1;
            if (d < 0)
                return rfail(r, "a malformed \\%c escape", c);
            v = v * 16 + d;
        }
        return v < 128 ? v : rfail(r, "non-ASCII characters are not supported");
    }
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
        return rfail(r, "the escape \\%c is not supported", c); /* \b, \B, \k, back-references */
    return (unsigned char)c < 128 ? (unsigned char)c
                                  : rfail(r, "non-ASCII characters are not supported");
}

/* A literal character of the pattern: its code or -1. */
static int literal(rparse_t *r, char c)
{
    return (unsigned char)c < 128 ? (unsigned char)c
                                  : rfail(r, "non-ASCII characters are not supported");
}

static int leaf(rparse_t *r, const uint64_t set[2], int other)
{
    int i = node(r, RN_SET, -1, -1);
    if (i < 0)
        return -1;
    r->n[i].set[0] = set[0];
    r->n[i].set[1] = set[1];
    r->n[i].other = other == OTHER_ALL;
    return i;
}

/* [...] after its '[' */
static int parse_class(rparse_t *r)
{
    uint64_t set[2] = {0, 0};
    int other = OTHER_NONE, neg = 0, first = 1;
    if (r->p < r->end && *r->p == '^') {
        neg = 1;
        r->p++;
    }
    for (;;) {
        if (r->p >= r->end)
            return rfail(r, "a '[' is not closed");
        char c = *r->p++;
        if (c == ']' && !first)
            break;
        first = 0;
        int lo;
        if (c == '\\') {
            if (r->p >= r->end)
                return rfail(r, "a trailing backslash");
            char e = *r->p++;
            if (class_escape(e, set, &other))
                continue;
            lo = e == 'b' ? '\b' : single_escape(r, e);
        } else
            lo = literal(r, c);
        if (lo < 0)
            return -1;
        int hi = lo;
        if (r->p + 1 < r->end && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            char d = *r->p++;
            hi = d == '\\' ? (r->p < r->end ? single_escape(r, *r->p++) : -1) : literal(r, d);
            if (hi < 0)
                return rfail(r, "a malformed range");
            if (hi < lo)
                return rfail(r, "a range out of order");
        }
        set_add(set, (unsigned)lo, (unsigned)hi);
    }
    if (neg) {
        set[0] = ~set[0];
        set[1] = ~set[1];
        other = other == OTHER_NONE ? OTHER_ALL : other == OTHER_ALL ? OTHER_NONE : OTHER_SOME;
    }
    return leaf(r, set, other);
}

static int parse_alt(rparse_t *r, int depth);

static int parse_atom(rparse_t *r, int depth)
{
    char c = *r->p++;
    uint64_t set[2] = {0, 0};
    int other = OTHER_NONE;
    switch (c) {
    case '(': {
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 >= r->end || r->p[1] != ':')
                return rfail(r, "lookarounds and named groups are not supported");
            r->p += 2;
        }
        int a = parse_alt(r, depth + 1);
        if (a < 0)
            return -1;
        if (r->p >= r->end || *r->p != ')')
            return rfail(r, "a '(' is not closed");
        r->p++;
        return a;
    }
    case '[': return parse_class(r);
    case '.':
        set_add(set, 0, 127);
        set[0] &= ~((1ull << '\n') | (1ull << '\r'));
        return leaf(r, set, OTHER_SOME);
    case '\\': {
        if (r->p >= r->end)
            return rfail(r, "a trailing backslash");
        char e = *r->p++;
        if (class_escape(e, set, &other))
            return leaf(r, set, other);
        int v = single_escape(r, e);
        if (v < 0)
            return -1;
        set_add(set, (unsigned)v, (unsigned)v);
        return leaf(r, set, OTHER_NONE);
    }
    case '^':
    case '$': return rfail(r, "'%c' inside the pattern is not supported", c);
    case ')': return rfail(r, "an unmatched ')'");
    case '*':
    case '+':
    case '?': return rfail(r, "'%c' follows nothing", c);
    }
    int v = literal(r, c);
    if (v < 0)
        return -1;
    set_add(set, (unsigned)v, (unsigned)v);
    return leaf(r, set, OTHER_NONE);
}

/* {n}, {n,}, {n,m} at r->p (after '{'): 1 and the counts, or 0 when it is a literal '{'. */
static int counts(rparse_t *r, uint32_t *lo, uint32_t *hi)
{
    const char *q = r->p;
    uint32_t a = 0, b;
    int nd = 0;
    for (; q < r->end && *q >= '0' && *q <= '9' && nd < 6; q++, nd++)
        a = a * 10 + (uint32_t)(*q - '0');
    if (!nd)
        return 0;
    b = a;
    if (q < r->end && *q == ',') {
        q++;
        b = RE_INF;
        if (q < r->end && *q >= '0' && *q <= '9') {
            b = 0;
            for (nd = 0; q < r->end && *q >= '0' && *q <= '9' && nd < 6; q++, nd++)
                b = b * 10 + (uint32_t)(*q - '0');
        }
    }
    if (q >= r->end || *q != '}')
        return 0;
    r->p = q + 1;
    *lo = a;
    *hi = b;
    return 1;
}

static int parse_piece(rparse_t *r, int depth)
{
    int a = parse_atom(r, depth);
    while (a >= 0 && r->p < r->end) {
        uint32_t lo, hi;
        char c = *r->p;
        if (c == '*' || c == '+' || c == '?') {
            r->p++;
            lo = c == '+';
            hi = c == '?' ? 1 : RE_INF;
        } else if (c == '{') {
            r->p++;
            if (!counts(r, &lo, &hi)) {
                r->p--;
                break; /* a literal '{' */
            }
            if (hi < lo)
                return rfail(r, "{%u,%u} counts out of order", lo, hi);
        } else
            break;
        if (r->p < r->end && *r->p == '?')
            r->p++; /* lazy: the same strings */
        int q = node(r, RN_REP, a, -1);
        if (q < 0)
            return -1;
        r->n[q].lo = lo;
        r->n[q].hi = hi;
        a = q;
    }
    return a;
}

static int parse_cat(rparse_t *r, int depth)
{
    int a = -2; /* none yet */
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        int b = parse_piece(r, depth);
        if (b < 0)
            return -1;
        a = a == -2 ? b : node(r, RN_CAT, a, b);
        if (a < 0)
            return -1;
    }
    return a == -2 ? node(r, RN_EMPTY, -1, -1) : a;
}

static int parse_alt(rparse_t *r, int depth)
{
    int a = parse_cat(r, depth);
    while (a >= 0 && r->p < r->end && *r->p == '|') {
        r->p++;
        if (depth == 0 && (r->re->anchored_start || r->re->anchored_end))
            return rfail(r, "anchors on alternatives ('^a|b$') are not supported");
        int b = parse_cat(r, depth);
        a = b < 0 ? -1 : node(r, RN_ALT, a, b);
    }
    return a;
}

/* ------------------------------------------------------------------ positions */

typedef struct gl {
    uint64_t first, last;
    int nullable;
} gl_t;

static void link(cons_re_t *re, uint64_t from, uint64_t to)
{
    for (; from; from &= from - 1)
        re->follow[__builtin_ctzll(from)] |= to;
}

static gl_t cat(cons_re_t *re, gl_t a, gl_t b)
{
    link(re, a.last, b.first);
    return (gl_t){a.first | (a.nullable ? b.first : 0), b.last | (b.nullable ? a.last : 0),
                  a.nullable && b.nullable};
}

/* Lays node i out as fresh positions (a repeated part once per copy). */
static int emit(rparse_t *r, int i, gl_t *out)
{
    const rnode_t *n = &r->n[i];
    cons_re_t *re = r->re;
    gl_t a, b;
    switch (n->kind) {
    case RN_EMPTY: *out = (gl_t){0, 0, 1}; return 0;
    case RN_SET: {
        if (r->npos >= CONS_RE_POS)
            return rfail(r, "more than %d character positions", CONS_RE_POS);
        int p = ++r->npos;
        uint64_t bit = 1ull << p;
        for (unsigned c = 0; c < 128; c++)
            if (n->set[c >> 6] >> (c & 63) & 1)
                re->by_char[c] |= bit;
        if (n->other)
            re->by_char[CONS_RE_OTHER] |= bit;
        *out = (gl_t){bit, bit, 0};
        return 0;
    }
    case RN_CAT:
        if (emit(r, n->a, &a) || emit(r, n->b, &b))
            return -1;
        *out = cat(re, a, b);
        return 0;
    case RN_ALT:
        if (emit(r, n->a, &a) || emit(r, n->b, &b))
            return -1;
        *out = (gl_t){a.first | b.first, a.last | b.last, a.nullable || b.nullable};
        return 0;
    case RN_REP: break;
    }
    if (n->lo > CONS_RE_POS || (n->hi != RE_INF && n->hi > CONS_RE_POS))
        return rfail(r, "more than %d character positions", CONS_RE_POS);
    gl_t acc = {0, 0, 1};
    for (uint32_t k = 0; k < n->lo; k++) {
        if (emit(r, n->a, &a))
            return -1;
        acc = cat(re, acc, a);
    }
    if (n->hi == RE_INF) { /* one more copy, repeated */
        if (emit(r, n->a, &a))
            return -1;
        link(re, a.last, a.first);
        a.nullable = 1;
        acc = cat(re, acc, a);
    }
    for (uint32_t k = n->lo; n->hi != RE_INF && k < n->hi; k++) {
        if (emit(r, n->a, &a))
            return -1;
        a.nullable = 1;
        acc = cat(re, acc, a);
    }
    *out = acc;
    return 0;
}

/* dmin, dmax by relaxation over the follow sets (every position can reach a last one); a dmax
 * still growing past the number of positions is on a cycle: unbounded. */
static void distances(cons_re_t *re, int npos)
{
    for (int p = 1; p <= npos; p++) {
        re->dmin[p] = re->last >> p & 1 ? 0 : CONS_RE_FAR;
        re->dmax[p] = 0;
    }
    for (int round = 0; round <= npos + 1; round++) {
        int changed = 0;
        for (int p = 1; p <= npos; p++) {
            for (uint64_t q = re->follow[p]; q; q &= q - 1) {
                int k = __builtin_ctzll(q);
                if (re->dmin[k] != CONS_RE_FAR && re->dmin[k] + 1 < re->dmin[p]) {
                    re->dmin[p] = (uint8_t)(re->dmin[k] + 1);
                    changed = 1;
                }
                unsigned m = re->dmax[k] == CONS_RE_FAR ? CONS_RE_FAR : re->dmax[k] + 1u;
                if (m > re->dmax[p]) {
                    re->dmax[p] = (uint8_t)(m > (unsigned)npos ? CONS_RE_FAR : m);
                    changed = 1;
                }
            }
        }
        if (!changed)
            break;
    }
}

void cons_re_left(const cons_re_t *re, uint64_t state, unsigned *fewest, unsigned *most)
{
    unsigned lo = CONS_RE_FAR, hi = 0;
    if (state & CONS_RE_DONE) {
        *fewest = 0;
        *most = CONS_RE_FAR;
        return;
    }
    if (cons_re_accepts(re, state))
        lo = 0;
    uint64_t from = state & POS_MASK, next = 0;
    for (uint64_t p = from; p; p &= p - 1) {
        int k = __builtin_ctzll(p);
        next |= re->follow[k];
    }
    if (state & CONS_RE_START)
        next |= re->first;
    for (uint64_t p = next; p; p &= p - 1) { /* one character to a next position, then its own */
        int k = __builtin_ctzll(p);
        if (re->dmin[k] + 1u < lo)
            lo = re->dmin[k] + 1u;
        unsigned m = re->dmax[k] == CONS_RE_FAR ? CONS_RE_FAR : re->dmax[k] + 1u;
        hi = m > hi ? m : hi;
    }
    if (!re->anchored_start || !re->anchored_end)
        hi = CONS_RE_FAR; /* characters before or after the match */
    *fewest = lo;
    *most = hi;
}

int cons_re_compile(const char *pattern, cons_re_t *re, char *err, size_t errlen)
{
    rparse_t *r = malloc(sizeof *r); /* 20 KB: not on a worker's stack */
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(re, 0, sizeof *re);
    size_t len = strlen(pattern);
    *r = (rparse_t){.p = pattern,
                    .end = pattern + len,
                    .pattern = pattern,
                    .re = re,
                    .err = err,
                    .errlen = errlen};
    if (r->p < r->end && *r->p == '^') {
        re->anchored_start = 1;
        r->p++;
    }
    if (r->end > r->p && r->end[-1] == '$') {
        size_t bs = 0; /* backslashes right before it: an odd number escapes it */
        while (r->end - 1 - bs > r->p && r->end[-2 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (bs % 2 == 0) {
            re->anchored_end = 1;
            r->end--;
        }
    }
    int root = parse_alt(r, 0);
    if (root >= 0 && r->p < r->end)
        root = rfail(r, "an unmatched ')'");
    gl_t g;
    int rc = root < 0 || emit(r, root, &g) ? -1 : 0;
    if (!rc) {
        re->first = g.first;
        re->last = g.last;
        re->nullable = (uint8_t)g.nullable;
        distances(re, r->npos);
    }
    free(r);
    return rc;
}

/* ------------------------------------------------------------------ matching */

uint64_t cons_re_init(const cons_re_t *re)
{
    return re->nullable && !re->anchored_end ? CONS_RE_DONE : CONS_RE_START;
}

uint64_t cons_re_step(const cons_re_t *re, uint64_t state, unsigned c)
{
    if (state & CONS_RE_DONE)
        return CONS_RE_DONE;
    uint64_t cand = (state & CONS_RE_START) || !re->anchored_start ? re->first : 0;
    for (uint64_t p = state & POS_MASK; p; p &= p - 1)
        cand |= re->follow[__builtin_ctzll(p)];
    uint64_t next = cand & re->by_char[c < CONS_RE_OTHER ? c : CONS_RE_OTHER];
    if (!re->anchored_end && (next & re->last))
        return CONS_RE_DONE; /* matched: the rest of the string is free */
    /* unanchored: a match may still begin at any later character */
    return next | (re->anchored_start ? 0 : CONS_RE_START);
}

int cons_re_accepts(const cons_re_t *re, uint64_t state)
{
    return (state & CONS_RE_DONE) || (state & re->last & POS_MASK) ||
           (re->nullable && (state & CONS_RE_START));
}

/* ------------------------------------------------------------------ formats */

/* Each a subset of the format's strings (RFC 3339 dates without February 29th, lower-case
 * hosts with short labels, ...), small enough for the positions of one pattern. */
static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date",
     "^[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
     "|02-(0[1-9]|1[0-9]|2[0-8]))$"},
    {"time",
     "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time",
     "^[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
     "|02-(0[1-9]|1[0-9]|2[0-8]))T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?"
     "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"email", "^[a-z0-9]+([._+-][a-z0-9]+)*@[a-z0-9]{1,8}(\\.[a-z0-9]{1,8})*\\.[a-z]{2,6}$"},
    {"hostname", "^[a-z0-9]{1,8}(\\.[a-z0-9]{1,8})*$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
             "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    {"uri", "^https?://[a-z0-9]{1,8}(\\.[a-z0-9]{1,8})*(/[A-Za-z0-9._~-]*)*$"},
};

const char *cons_re_format(const char *format)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(format, formats[i].name) == 0)
            return formats[i].pattern;
    return NULL;
}

/* cons_gbnf: the GBNF-like grammar front end: parses the text (rules, alternatives, string
 * literals, character classes, groups, repetitions), refuses undefined rules, a missing root and
 * left recursion with their line and column, and flattens the rules into one element table. */
#include "engine/cons_gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GP_UNBOUNDED UINT32_MAX
#define GP_MAX_NEST 64 /* groups inside groups */

/* ------------------------------------------------------------------ parser state */

typedef struct grule {
    char *name;
    cons_gelem_t *e; /* (n) alternatives, each closed by CG_END */
    uint32_t n, cap;
    const char *at;  /* where it is defined (generated rules: the group or the postfix) */
    const char *ref; /* where it is first referenced */
    int defined;
    int gen; /* made by the compiler for a group or a repetition (never found by name) */
    int rep; /* made for x* / x+ / x{m,}: a left cycle through it is an empty repeated item */
} grule_t;

typedef struct gp {
    const char *text, *p;
    grule_t *rules; /* (n_rules) */
    uint32_t n_rules, cap_rules;
    cons_grange_t *ranges; /* (n_ranges) */
    uint32_t n_ranges, cap_ranges;
    uint32_t n_elems; /* elements of all rules */
    int code;         /* the first failure's CONS_ERR_* (0: none yet) */
    char *err;
    size_t errlen;
} gp_t;

/* Records the first failure: the reason, prefixed with at's line and column when at is set.
 * Returns -1. */
static int gp_fail(gp_t *g, const char *at, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g->code)
        return -1;
    g->code = code;
    if (!at) {
        snprintf(g->err, g->errlen, "%s", msg);
        return -1;
    }
    unsigned line = 1, col = 1;
    for (const char *q = g->text; q < at; q++)
        if (*q == '\n') {
            line++;
            col = 1;
        } else
            col++;
    snprintf(g->err, g->errlen, "line %u column %u: %s", line, col, msg);
    return -1;
}

static int gp_nomem(gp_t *g)
{
    return gp_fail(g, NULL, CONS_ERR_NOMEM, "out of memory");
}

/* Appends e to rule r. 0, or -1 past CONS_GBNF_MAX_ELEMS or on OOM. */
static int gp_push(gp_t *g, uint32_t r, cons_gelem_t e)
{
    grule_t *ru = &g->rules[r];
    if (g->n_elems >= CONS_GBNF_MAX_ELEMS)
        return gp_fail(g, g->p, CONS_ERR_UNSUPPORTED,
                       "the grammar compiles to more than %d elements", CONS_GBNF_MAX_ELEMS);
    if (ru->n == ru->cap) {
        uint32_t cap = ru->cap ? 2 * ru->cap : 8;
        cons_gelem_t *e2 = realloc(ru->e, cap * sizeof *e2);
        if (!e2)
            return gp_nomem(g);
        ru->e = e2;
        ru->cap = cap;
    }
    ru->e[ru->n++] = e;
    g->n_elems++;
    return 0;
}

static int gp_push_rule(gp_t *g, uint32_t r, uint32_t target)
{
    return gp_push(g, r, (cons_gelem_t){.kind = CG_RULE, .arg = target});
}

static int gp_push_end(gp_t *g, uint32_t r)
{
    return gp_push(g, r, (cons_gelem_t){.kind = CG_END});
}

/* A new rule named name (len bytes); its id, or -1. */
static int gp_rule_new(gp_t *g, const char *name, size_t len, const char *at)
{
    if (g->n_rules >= CONS_GBNF_MAX_RULES)
        return gp_fail(g, at, CONS_ERR_UNSUPPORTED, "the grammar compiles to more than %d rules",
                       CONS_GBNF_MAX_RULES);
    if (g->n_rules == g->cap_rules) {
        uint32_t cap = g->cap_rules ? 2 * g->cap_rules : 16;
        grule_t *r2 = realloc(g->rules, cap * sizeof *r2);
        if (!r2)
            return gp_nomem(g);
        g->rules = r2;
        g->cap_rules = cap;
    }
    grule_t *ru = &g->rules[g->n_rules];
    *ru = (grule_t){.at = at, .ref = at};
    if (!(ru->name = malloc(len + 1)))
        return gp_nomem(g);
    memcpy(ru->name, name, len);
    ru->name[len] = 0;
    return (int)g->n_rules++;
}

/* A rule the compiler makes inside parent (named parent_N for messages). */
static int gp_rule_gen(gp_t *g, uint32_t parent, const char *at, int rep)
{
    char name[96];
    int len = snprintf(name, sizeof name, "%.80s_%u", g->rules[parent].name, g->n_rules);
    int r = gp_rule_new(g, name, (size_t)len, at);
    if (r >= 0) {
        g->rules[r].defined = g->rules[r].gen = 1;
        g->rules[r].rep = rep;
    }
    return r;
}

/* The rule named name, made (undefined yet) on its first mention. */
static int gp_rule_ref(gp_t *g, const char *name, size_t len, const char *at)
{
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (!g->rules[i].gen && strncmp(g->rules[i].name, name, len) == 0 &&
            g->rules[i].name[len] == 0)
            return (int)i;
    return gp_rule_new(g, name, len, at);
}

/* ------------------------------------------------------------------ lexical */

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static size_t name_len(const char *p)
{
    size_t n = 0;
    while (is_name_char(p[n]))
        n++;
    return n;
}

/* Skips blanks and comments, and line breaks when nl. */
static void gp_space(gp_t *g, int nl)
{
    for (;;) {
        char c = *g->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n'))
            g->p++;
        else if (c == '#')
            while (*g->p && *g->p != '\n')
                g->p++;
        else
            return;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* An escape at g->p (the backslash) into *cp. */
static int gp_escape(gp_t *g, uint32_t *cp)
{
    const char *at = g->p++;
    char c = *g->p++;
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/': *cp = (uint8_t)c; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        g->p = at;
        if ((uint8_t)c < 0x20 || (uint8_t)c >= 0x7f)
            return gp_fail(g, at, CONS_ERR_FORMAT, "unknown escape");
        return gp_fail(g, at, CONS_ERR_FORMAT, "unknown escape '\\%c'", c);
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexval(*g->p);
        if (h < 0)
            return gp_fail(g, at, CONS_ERR_FORMAT, "'\\%c' needs %d hex digits", c, digits);
        v = v << 4 | (uint32_t)h;
        g->p++;
    }
    if (v > 0x10FFFF)
        return gp_fail(g, at, CONS_ERR_FORMAT, "code point above U+10FFFF");
    *cp = v;
    return 0;
}

/* One character of a literal or class (an escape or a UTF-8 sequence) into *cp. */
static int gp_char(gp_t *g, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)g->p;
    if (*s == '\\')
        return gp_escape(g, cp);
    unsigned len = *s < 0x80                  ? 1
                   : *s >= 0xC2 && *s <= 0xDF ? 2
                   : *s >= 0xE0 && *s <= 0xEF ? 3
                   : *s >= 0xF0 && *s <= 0xF4 ? 4
                                              : 0;
    uint32_t v = len == 1 ? *s : len == 2 ? *s & 0x1Fu : len == 3 ? *s & 0x0Fu : *s & 0x07u;
    for (unsigned i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            len = 0;
            break;
        }
        v = v << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!len || v < min_cp[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return gp_fail(g, g->p, CONS_ERR_FORMAT, "invalid UTF-8");
    g->p += len;
    *cp = v;
    return 0;
}

/* ------------------------------------------------------------------ items */

static int gp_range(gp_t *g, uint32_t lo, uint32_t hi)
{
    if (g->n_ranges == g->cap_ranges) {
        uint32_t cap = g->cap_ranges ? 2 * g->cap_ranges : 64;
        cons_grange_t *r2 = realloc(g->ranges, cap * sizeof *r2);
        if (!r2)
            return gp_nomem(g);
        g->ranges = r2;
        g->cap_ranges = cap;
    }
    g->ranges[g->n_ranges++] = (cons_grange_t){lo, hi};
    return 0;
}

static int range_cmp(const void *a, const void *b)
{
    const cons_grange_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The class of ranges[first ..) (sorted and merged here) as an element of rule r. */
static int gp_push_class(gp_t *g, uint32_t r, uint32_t first, int neg)
{
    uint32_t n = g->n_ranges - first, m = 0;
    cons_grange_t *rg = n ? g->ranges + first : NULL;
    if (n)
        qsort(rg, n, sizeof *rg, range_cmp);
    for (uint32_t i = 0; i < n; i++)
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi)
                rg[m - 1].hi = rg[i].hi;
        } else
            rg[m++] = rg[i];
    g->n_ranges = first + m;
    if (m > UINT16_MAX)
        return gp_fail(g, g->p, CONS_ERR_UNSUPPORTED, "a character class of over 65,535 ranges");
    return gp_push(
        g, r, (cons_gelem_t){.kind = CG_CHAR, .neg = (uint8_t)neg, .n = (uint16_t)m, .arg = first});
}

/* "..." at g->p: one element per character. */
static int gp_literal(gp_t *g, uint32_t r)
{
    const char *at = g->p++;
    while (*g->p != '"') {
        if (!*g->p || *g->p == '\n')
            return gp_fail(g, at, CONS_ERR_FORMAT, "unterminated string literal");
        uint32_t cp;
        uint32_t first = g->n_ranges;
        if (gp_char(g, &cp) || gp_range(g, cp, cp) || gp_push_class(g, r, first, 0))
            return -1;
    }
    g->p++;
    return 0;
}

/* [...] or [^...] at g->p. */
static int gp_class(gp_t *g, uint32_t r)
{
    const char *at = g->p++;
    int neg = *g->p == '^';
    uint32_t first = g->n_ranges;
    g->p += neg;
    while (*g->p != ']') {
        if (!*g->p || *g->p == '\n')
            return gp_fail(g, at, CONS_ERR_FORMAT, "unterminated character class");
        const char *ca = g->p;
        uint32_t lo, hi;
        if (gp_char(g, &lo))
            return -1;
        hi = lo;
        if (g->p[0] == '-' && g->p[1] && g->p[1] != ']') {
            g->p++;
            if (gp_char(g, &hi))
                return -1;
            if (hi < lo)
                return gp_fail(g, ca, CONS_ERR_FORMAT, "range ends before it starts");
        }
        if (gp_range(g, lo, hi))
            return -1;
    }
    g->p++;
    if (g->n_ranges == first && !neg)
        return gp_fail(g, at, CONS_ERR_FORMAT, "empty character class");
    return gp_push_class(g, r, first, neg);
}

/* Replaces the item at rule r's elements [item ..) by lo..hi copies of it (hi GP_UNBOUNDED: no
 * upper bound), through generated rules: x{lo,} = x..x S with S ::= x S | "", x{lo,hi} = x..x
 * O(hi-lo) with O(k) ::= x O(k-1) | "". */
static int gp_repeat(gp_t *g, uint32_t r, uint32_t item, uint32_t lo, uint32_t hi, const char *at)
{
    uint32_t n_item = g->rules[r].n - item;
    cons_gelem_t x = {.kind = CG_END};
    if (n_item == 1)
        x = g->rules[r].e[item];
    else { /* a literal of several characters (or none): one rule */
        int w = gp_rule_gen(g, r, at, 0);
        if (w < 0)
            return -1;
        for (uint32_t k = 0; k < n_item; k++)
            if (gp_push(g, (uint32_t)w, g->rules[r].e[item + k]))
                return -1;
        if (gp_push_end(g, (uint32_t)w))
            return -1;
        x = (cons_gelem_t){.kind = CG_RULE, .arg = (uint32_t)w};
    }
    g->rules[r].n = item;
    g->n_elems -= n_item;
    for (uint32_t k = 0; k < lo; k++)
        if (gp_push(g, r, x))
            return -1;
    int last = -1;
    if (hi == GP_UNBOUNDED) {
        int s = gp_rule_gen(g, r, at, 1);
        if (s < 0 || gp_push(g, (uint32_t)s, x) || gp_push_rule(g, (uint32_t)s, (uint32_t)s) ||
            gp_push_end(g, (uint32_t)s) || gp_push_end(g, (uint32_t)s))
            return -1;
        last = s;
    } else
        for (uint32_t k = lo; k < hi; k++) {
            int o = gp_rule_gen(g, r, at, 0);
            if (o < 0 || gp_push(g, (uint32_t)o, x) ||
                (last >= 0 && gp_push_rule(g, (uint32_t)o, (uint32_t)last)) ||
                gp_push_end(g, (uint32_t)o) || gp_push_end(g, (uint32_t)o))
                return -1;
            last = o;
        }
    return last >= 0 ? gp_push_rule(g, r, (uint32_t)last) : 0;
}

/* A decimal count of {m,n} at g->p into *v; 0 when there are no digits (v untouched). */
static int gp_count(gp_t *g, uint32_t *v)
{
    if (*g->p < '0' || *g->p > '9')
        return 0;
    uint64_t x = 0;
    while (*g->p >= '0' && *g->p <= '9') {
        x = x * 10 + (uint64_t)(*g->p++ - '0');
        if (x > CONS_GBNF_MAX_REPEAT)
            x = CONS_GBNF_MAX_REPEAT + 1;
    }
    *v = (uint32_t)x;
    return 1;
}

/* A postfix operator (*, +, ?, {m}, {m,}, {m,n}, {,n}) after the item at [item ..), if any. */
static int gp_postfix(gp_t *g, uint32_t r, uint32_t item)
{
    const char *at = g->p;
    uint32_t lo = 0, hi = GP_UNBOUNDED;
    switch (*g->p) {
    case '*': break;
    case '+': lo = 1; break;
    case '?': hi = 1; break;
    case '{': {
        g->p++;
        gp_space(g, 0);
        int has_lo = gp_count(g, &lo);
        gp_space(g, 0);
        if (*g->p == ',') {
            g->p++;
            gp_space(g, 0);
            gp_count(g, &hi);
            gp_space(g, 0);
        } else if (has_lo)
            hi = lo;
        if (*g->p != '}' || (!has_lo && hi == GP_UNBOUNDED))
            return gp_fail(g, at, CONS_ERR_FORMAT, "expected {m}, {m,}, {m,n} or {,n}");
        if (lo > CONS_GBNF_MAX_REPEAT || (hi != GP_UNBOUNDED && hi > CONS_GBNF_MAX_REPEAT))
            return gp_fail(g, at, CONS_ERR_UNSUPPORTED, "repetition counts above %d",
                           CONS_GBNF_MAX_REPEAT);
        if (hi < lo)
            return gp_fail(g, at, CONS_ERR_FORMAT, "{%u,%u}: the maximum is below the minimum", lo,
                           hi);
        break;
    }
    default: return 0;
    }
    g->p++;
    return gp_repeat(g, r, item, lo, hi, at);
}

static int gp_alts(gp_t *g, uint32_t r, int depth);

/* ( alternatives ) at g->p: a generated rule referenced from r. */
static int gp_group(gp_t *g, uint32_t r, int depth)
{
    const char *at = g->p++;
    if (depth >= GP_MAX_NEST)
        return gp_fail(g, at, CONS_ERR_UNSUPPORTED, "groups nested deeper than %d", GP_MAX_NEST);
    int w = gp_rule_gen(g, r, at, 0);
    if (w < 0 || gp_alts(g, (uint32_t)w, depth + 1))
        return -1;
    if (*g->p != ')')
        return gp_fail(g, at, CONS_ERR_FORMAT, "missing ')' for this '('");
    g->p++;
    return gp_push_rule(g, r, (uint32_t)w);
}

/* A rule name at g->p, referenced from r. */
static int gp_name(gp_t *g, uint32_t r)
{
    const char *at = g->p;
    size_t len = name_len(at);
    g->p += len;
    const char *q = g->p;
    while (*q == ' ' || *q == '\t')
        q++;
    if (strncmp(q, "::=", 3) == 0)
        return gp_fail(g, at, CONS_ERR_FORMAT, "the definition of '%.*s' must start on a new line",
                       (int)len, at);
    int id = gp_rule_ref(g, at, len, at);
    return id < 0 ? -1 : gp_push_rule(g, r, (uint32_t)id);
}

/* One alternative of rule r: items up to '|', ')', the end, or (at depth 0) the line's end. */
static int gp_seq(gp_t *g, uint32_t r, int depth)
{
    for (;;) {
        gp_space(g, depth > 0);
        char c = *g->p;
        if (!c || c == '|' || c == ')' || c == '\n')
            return 0;
        uint32_t item = g->rules[r].n;
        int rc;
        if (c == '"')
            rc = gp_literal(g, r);
        else if (c == '[')
            rc = gp_class(g, r);
        else if (c == '.') {
            g->p++;
            rc = gp_push_class(g, r, g->n_ranges, 1); /* no ranges, negated: any character */
        } else if (c == '(')
            rc = gp_group(g, r, depth);
        else if (is_name_char(c))
            rc = gp_name(g, r);
        else if ((uint8_t)c > 0x20 && (uint8_t)c < 0x7f)
            rc = gp_fail(g, g->p, CONS_ERR_FORMAT, "unexpected '%c'", c);
        else
            rc = gp_fail(g, g->p, CONS_ERR_FORMAT, "unexpected byte 0x%02x", (uint8_t)c);
        if (rc)
            return -1;
        gp_space(g, depth > 0);
        if (gp_postfix(g, r, item))
            return -1;
    }
}

/* Alternatives of rule r separated by '|' (after a '|' a line break is a blank; at depth 0 a
 * line that starts with '|' continues the rule). */
static int gp_alts(gp_t *g, uint32_t r, int depth)
{
    for (;;) {
        if (gp_seq(g, r, depth) || gp_push_end(g, r))
            return -1;
        if (depth == 0) {
            const char *save = g->p;
            gp_space(g, 1);
            if (*g->p != '|')
                g->p = save;
        }
        if (*g->p != '|')
            return 0;
        g->p++;
        gp_space(g, 1);
    }
}

/* The whole text: rule definitions `name ::= alternatives`, one per line (or more lines). */
static int gp_grammar(gp_t *g)
{
    for (;;) {
        gp_space(g, 1);
        if (!*g->p)
            return 0;
        const char *at = g->p;
        size_t len = name_len(at);
        if (!len)
            return gp_fail(g, at, CONS_ERR_FORMAT, "expected a rule name");
        int r = gp_rule_ref(g, at, len, at);
        if (r < 0)
            return -1;
        if (g->rules[r].defined)
            return gp_fail(g, at, CONS_ERR_FORMAT, "rule '%s' is defined twice", g->rules[r].name);
        g->rules[r].defined = 1;
        g->rules[r].at = at;
        g->p += len;
        gp_space(g, 0);
        if (strncmp(g->p, "::=", 3) != 0)
            return gp_fail(g, g->p, CONS_ERR_FORMAT, "expected '::=' after the rule name");
        g->p += 3;
        gp_space(g, 1);
        if (gp_alts(g, (uint32_t)r, 0))
            return -1;
        if (*g->p == ')')
            return gp_fail(g, g->p, CONS_ERR_FORMAT, "unmatched ')'");
    }
}

/* ------------------------------------------------------------------ checks */

/* Which rules can match the empty string (*nul, n_rules entries, caller frees). */
static uint8_t *gp_nullable(gp_t *g)
{
    uint8_t *nul = calloc(g->n_rules ? g->n_rules : 1, 1);
    for (int changed = 1; nul && changed;) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            const grule_t *ru = &g->rules[r];
            int ok = 1; /* the alternative so far is nullable */
            for (uint32_t i = 0; i < ru->n && !nul[r]; i++) {
                cons_gelem_t e = ru->e[i];
                if (e.kind == CG_END) {
                    if (ok)
                        nul[r] = 1, changed = 1;
                    ok = 1;
                } else
                    ok = ok && e.kind == CG_RULE && nul[e.arg];
            }
        }
    }
    return nul;
}

/* Refuses a cycle of leftmost references (a rule that can begin with itself, after rules that
 * match the empty string): the matcher would expand it forever. st holds the cycle from k. */
static int gp_cycle(gp_t *g, const uint32_t *st, uint32_t k, uint32_t sp)
{
    int named = -1;
    for (uint32_t i = k; i < sp; i++) {
        const grule_t *ru = &g->rules[st[i]];
        if (ru->rep)
            return gp_fail(g, ru->at, CONS_ERR_FORMAT,
                           "the repeated item can match the empty string (an endless loop)");
        if (!ru->gen && named < 0)
            named = (int)st[i];
    }
    const grule_t *ru = &g->rules[named >= 0 ? (uint32_t)named : st[k]];
    return gp_fail(g, ru->at, CONS_ERR_FORMAT,
                   "rule '%s' is left-recursive (it can begin with itself)", ru->name);
}

/* A depth-first search over leftmost references, from every rule. */
static int gp_left_recursion(gp_t *g, const uint8_t *nul)
{
    uint32_t n = g->n_rules;
    uint8_t *color = calloc(n, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *st = malloc(n * sizeof *st), *at = malloc(n * sizeof *at);
    uint8_t *left = malloc(n);
    int rc = 0;
    if (!color || !st || !at || !left) {
        rc = gp_nomem(g);
        goto out;
    }
    for (uint32_t r0 = 0; r0 < n && !rc; r0++) {
        if (color[r0])
            continue;
        uint32_t sp = 0;
        st[sp] = r0, at[sp] = 0, left[sp] = 1, color[r0] = 1, sp++;
        while (sp && !rc) {
            const grule_t *ru = &g->rules[st[sp - 1]];
            uint32_t i = at[sp - 1];
            int lf = left[sp - 1], s = -1;
            while (i < ru->n && s < 0) {
                cons_gelem_t e = ru->e[i++];
                if (e.kind == CG_END)
                    lf = 1;
                else if (lf) {
                    lf = e.kind == CG_RULE && nul[e.arg];
                    s = e.kind == CG_RULE ? (int)e.arg : -1;
                }
            }
            at[sp - 1] = i, left[sp - 1] = (uint8_t)lf;
            if (s < 0) {
                color[st[--sp]] = 2;
            } else if (color[s] == 1) {
                uint32_t k = 0;
                while (st[k] != (uint32_t)s)
                    k++;
                rc = gp_cycle(g, st, k, sp);
            } else if (color[s] == 0) {
                st[sp] = (uint32_t)s, at[sp] = 0, left[sp] = 1, color[s] = 1, sp++;
            }
        }
    }
out:
    free(color);
    free(st);
    free(at);
    free(left);
    return rc ? -1 : 0;
}

/* Every rule defined, a root, no left recursion; *root gets the root rule. */
static int gp_check(gp_t *g, uint32_t *root)
{
    int found = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        if (!g->rules[r].defined)
            return gp_fail(g, g->rules[r].ref, CONS_ERR_FORMAT, "undefined rule '%s'",
                           g->rules[r].name);
        if (!g->rules[r].gen && strcmp(g->rules[r].name, "root") == 0)
            *root = r, found = 1;
    }
    if (!found)
        return gp_fail(g, NULL, CONS_ERR_FORMAT, "the grammar has no 'root' rule");
    uint8_t *nul = gp_nullable(g);
    if (!nul)
        return gp_nomem(g);
    int rc = gp_left_recursion(g, nul);
    free(nul);
    return rc;
}

/* ------------------------------------------------------------------ compile */

/* The rules as one table (takes g's ranges). NULL on OOM. */
static cons_grammar_t *gp_flatten(gp_t *g, uint32_t root)
{
    cons_grammar_t *gr = calloc(1, sizeof *gr);
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < g->n_rules; r++)
        for (uint32_t i = 0; i < g->rules[r].n; i++)
            n_alts += g->rules[r].e[i].kind == CG_END;
    if (!gr)
        return NULL;
    atomic_init(&gr->refs, 1);
    gr->n_elems = g->n_elems + 2;
    gr->elems = malloc(gr->n_elems * sizeof *gr->elems);
    gr->alt_first = malloc((g->n_rules + 1) * sizeof *gr->alt_first);
    gr->alts = malloc((n_alts ? n_alts : 1) * sizeof *gr->alts);
    if (!gr->elems || !gr->alt_first || !gr->alts) {
        cons_grammar_unref(gr);
        return NULL;
    }
    uint32_t pos = 0, a = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        const grule_t *ru = &g->rules[r];
        gr->alt_first[r] = a;
        for (uint32_t i = 0; i < ru->n; i++) {
            if (i == 0 || ru->e[i - 1].kind == CG_END)
                gr->alts[a++] = pos;
            gr->elems[pos++] = ru->e[i];
        }
    }
    gr->alt_first[g->n_rules] = a;
    gr->n_rules = g->n_rules;
    gr->start = pos;
    gr->elems[pos] = (cons_gelem_t){.kind = CG_RULE, .arg = root};
    gr->elems[pos + 1] = (cons_gelem_t){.kind = CG_END};
    gr->ranges = g->ranges;
    gr->n_ranges = g->n_ranges;
    g->ranges = NULL;
    return gr;
}

static void gp_free(gp_t *g)
{
    for (uint32_t r = 0; r < g->n_rules; r++) {
        free(g->rules[r].name);
        free(g->rules[r].e);
    }
    free(g->rules);
    free(g->ranges);
}

cons_grammar_t *cons_grammar_compile(const char *text, int *code, char *err, size_t errlen)
{
    gp_t g = {.text = text, .p = text, .err = err, .errlen = errlen};
    cons_grammar_t *gr = NULL;
    cons_gstate_t *s = NULL;
    uint32_t root = 0;
    if (strlen(text) > CONS_GBNF_MAX_TEXT)
        gp_fail(&g, NULL, CONS_ERR_UNSUPPORTED, "the grammar is over %d bytes", CONS_GBNF_MAX_TEXT);
    else if (!gp_grammar(&g) && !gp_check(&g, &root)) {
        if (!(gr = gp_flatten(&g, root)) || !(s = malloc(sizeof *s)))
            gp_nomem(&g);
        else if (cons_gbnf_init(gr, s))
            gp_fail(&g, NULL, CONS_ERR_UNSUPPORTED,
                    "the grammar's start expands past %d parses or %d nested rules at once",
                    CONS_GBNF_MAX_STACKS, CONS_GBNF_MAX_DEPTH);
    }
    free(s);
    gp_free(&g);
    if (g.code) {
        cons_grammar_unref(gr);
        if (code)
            *code = g.code;
        return NULL;
    }
    return gr;
}

cons_grammar_t *cons_grammar_ref(cons_grammar_t *gr)
{
    atomic_fetch_add(&gr->refs, 1);
    return gr;
}

void cons_grammar_unref(cons_grammar_t *gr)
{
    if (!gr || atomic_fetch_sub(&gr->refs, 1) != 1)
        return;
    free(gr->elems);
    free(gr->ranges);
    free(gr->alt_first);
    free(gr->alts);
    free(gr);
}

/* cons_gmatch: the grammar's pushdown matcher: a bounded set of stacks of element positions,
 * advanced one byte at a time (UTF-8 aware: a character's first bytes keep the parses whose class
 * can still hold it), and the vocabulary trie walked with one state per depth for the masks. */
#include <stdlib.h>
#include <string.h>

#include "engine/cons_gbnf.h"

/* Whether class e holds a code point in [lo, hi] (a single one when lo == hi). */
static int class_hits(const cons_grammar_t *g, const cons_gelem_t *e, uint32_t lo, uint32_t hi)
{
    const cons_grange_t *r = g->ranges + e->arg;
    for (uint32_t i = 0; i < e->n; i++) {
        if (r[i].lo > hi)
            break;
        if (e->neg) {
            if (r[i].lo <= lo && hi <= r[i].hi)
                return 0; /* merged ranges: one holds the whole interval or none does */
        } else if (r[i].hi >= lo)
            return 1;
    }
    return e->neg;
}

/* Adds the stack frames[0..n) (its top a class, or empty) unless s holds it already. 0, or -1
 * when s is full. */
static int add_stack(cons_gstate_t *s, const uint16_t *frames, unsigned n)
{
    uint16_t used = s->off[s->n];
    for (unsigned i = 0; i < s->n; i++)
        if ((unsigned)(s->off[i + 1] - s->off[i]) == n &&
            memcmp(s->pos + s->off[i], frames, n * sizeof *frames) == 0)
            return 0;
    if (s->n >= CONS_GBNF_MAX_STACKS || used + n > CONS_GBNF_POOL)
        return -1;
    memcpy(s->pos + used, frames, n * sizeof *frames);
    s->n++;
    s->off[s->n] = (uint16_t)(used + n);
    return 0;
}

/* Adds frames[0..n) to s once its top is a class: finished alternatives are popped, a rule
 * reference on top becomes one stack per alternative (its return position dropped when it
 * ends the caller's alternative, so right recursion does not grow the stack). 0, or -1 past
 * the limits. */
static int push_stack(const cons_grammar_t *g, cons_gstate_t *s, const uint16_t *frames, unsigned n,
                      unsigned level)
{
    while (n && g->elems[frames[n - 1]].kind == CG_END)
        n--;
    if (!n || g->elems[frames[n - 1]].kind == CG_CHAR)
        return add_stack(s, frames, n);
    if (level >= CONS_GBNF_MAX_EXPAND)
        return -1;
    uint16_t buf[CONS_GBNF_MAX_DEPTH];
    uint16_t top = frames[n - 1];
    unsigned m = n - 1;
    memcpy(buf, frames, m * sizeof *buf);
    if (g->elems[top + 1].kind != CG_END)
        buf[m++] = (uint16_t)(top + 1);
    if (m >= CONS_GBNF_MAX_DEPTH)
        return -1;
    uint32_t r = g->elems[top].arg;
    for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++) {
        buf[m] = (uint16_t)g->alts[a];
        if (push_stack(g, s, buf, m + 1, level + 1))
            return -1;
    }
    return 0;
}

static void state_clear(cons_gstate_t *s)
{
    s->cp = 0;
    s->need = s->len = 0;
    s->n = 0;
    s->off[0] = 0;
}

int cons_gbnf_init(const cons_grammar_t *g, cons_gstate_t *s)
{
    uint16_t start = (uint16_t)g->start;
    state_clear(s);
    return push_stack(g, s, &start, 1, 0);
}

int cons_gbnf_complete(const cons_gstate_t *s)
{
    if (s->need)
        return 0;
    for (unsigned i = 0; i < s->n; i++)
        if (s->off[i] == s->off[i + 1])
            return 1;
    return 0;
}

void cons_gbnf_copy(cons_gstate_t *dst, const cons_gstate_t *src)
{
    dst->cp = src->cp;
    dst->need = src->need;
    dst->len = src->len;
    dst->n = src->n;
    memcpy(dst->off, src->off, (src->n + 1u) * sizeof *dst->off);
    memcpy(dst->pos, src->pos, src->off[src->n] * sizeof *dst->pos);
}

/* Decodes byte c after src's partial character: the code points the character can still be,
 * [*lo, *hi] (one once it is whole), into dst's cp/need/len. 0 when c breaks UTF-8 (overlong
 * forms, surrogates and code points above U+10FFFF included). */
static int utf8_next(const cons_gstate_t *src, cons_gstate_t *dst, uint8_t c, uint32_t *lo,
                     uint32_t *hi)
{
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t cp;
    unsigned need, len;
    if (!src->need) {
        if (c < 0x80)
            cp = c, need = 0, len = 1;
        else if (c >= 0xC2 && c <= 0xDF)
            cp = c & 0x1Fu, need = 1, len = 2;
        else if (c >= 0xE0 && c <= 0xEF)
            cp = c & 0x0Fu, need = 2, len = 3;
        else if (c >= 0xF0 && c <= 0xF4)
            cp = c & 0x07u, need = 3, len = 4;
        else
            return 0;
    } else {
        if ((c & 0xC0) != 0x80)
            return 0;
        cp = src->cp << 6 | (c & 0x3Fu);
        need = src->need - 1u;
        len = src->len;
    }
    uint32_t a = cp << (6 * need), b = a | ((1u << (6 * need)) - 1u);
    if (b < min_cp[len] || a > 0x10FFFF || (a >= 0xD800 && b <= 0xDFFF))
        return 0;
    *lo = a < min_cp[len] ? min_cp[len] : a;
    *hi = b > 0x10FFFF ? 0x10FFFF : b;
    dst->cp = need ? cp : 0; /* between characters every state looks the same */
    dst->need = (uint8_t)need;
    dst->len = need ? (uint8_t)len : 0;
    return 1;
}

int cons_gbnf_step(const cons_grammar_t *g, const cons_gstate_t *src, cons_gstate_t *dst, uint8_t c)
{
    uint32_t lo, hi;
    state_clear(dst);
    if (!utf8_next(src, dst, c, &lo, &hi))
        return 0;
    for (unsigned i = 0; i < src->n; i++) {
        const uint16_t *f = src->pos + src->off[i];
        unsigned n = (unsigned)(src->off[i + 1] - src->off[i]);
        if (!n || !class_hits(g, &g->elems[f[n - 1]], lo, hi))
            continue;
        if (dst->need) { /* inside a character: the parse waits for the rest of it */
            if (add_stack(dst, f, n))
                return 0;
            continue;
        }
        uint16_t buf[CONS_GBNF_MAX_DEPTH];
        memcpy(buf, f, n * sizeof *buf);
        buf[n - 1]++;
        if (push_stack(g, dst, buf, n, 0))
            return 0;
    }
    return dst->n > 0;
}

/* ------------------------------------------------------------------ masks */

/* The walk that steps a state per depth at every node (states[1 ..] scratch). */
static int32_t walk_plain(const cons_vocab_t *v, const cons_grammar_t *g, cons_gstate_t *states,
                          uint32_t *bits)
{
    int32_t n = 0;
    uint32_t i = 0;
    while (i < v->all.n) {
        unsigned d = v->all.depth[i];
        if (!cons_gbnf_step(g, &states[d - 1], &states[d], v->all.byte[i])) {
            i = v->all.skip[i];
            continue;
        }
        n += cons_tnodes_take(&v->all, i, bits);
        i++;
    }
    return n;
}

static uint64_t state_hash(const cons_gstate_t *s)
{
    uint64_t h = 1469598103934665603ull;
    h = (h ^ (s->cp << 16 | (uint32_t)s->need << 8 | s->len)) * 1099511628211ull;
    for (unsigned i = 0; i <= s->n; i++)
        h = (h ^ s->off[i]) * 1099511628211ull;
    for (unsigned i = 0; i < s->off[s->n]; i++)
        h = (h ^ s->pos[i]) * 1099511628211ull;
    return h;
}

static int state_eq(const cons_gstate_t *a, const cons_gstate_t *b)
{
    return a->cp == b->cp && a->need == b->need && a->len == b->len && a->n == b->n &&
           memcmp(a->off, b->off, (a->n + 1u) * sizeof *a->off) == 0 &&
           memcmp(a->pos, b->pos, a->off[a->n] * sizeof *a->pos) == 0;
}

#define WALK_UNKNOWN (-1)
#define WALK_REFUSED (-2)
#define WALK_RAW (-3) /* the state at this depth is states[depth] (inside a character) */

/* Interns st among states ids[0 .. *n) (hashes in hash): its id, or -1 when full. */
static int32_t walk_intern(cons_gstate_t *ids, uint64_t *hash, uint32_t *n, const cons_gstate_t *st)
{
    uint64_t h = state_hash(st);
    for (uint32_t k = 0; k < *n; k++)
        if (hash[k] == h && state_eq(&ids[k], st))
            return (int32_t)k;
    if (*n == CONS_GBNF_WALK_IDS)
        return -1;
    cons_gbnf_copy(&ids[*n], st);
    hash[*n] = h;
    return (int32_t)(*n)++;
}

/* The walk over a lazily built automaton: the distinct states met between characters are
 * interned in states[CONS_TOKEN_MAX + 1 ..] (id 0: the current one) and each (state, byte) step
 * from them is computed once, so most nodes cost a table lookup; states inside a character live
 * at their depth in states[1 .. CONS_TOKEN_MAX]. -1 when more states are met than there is room
 * for (bits then dirty). */
static int32_t walk_memo(const cons_vocab_t *v, const cons_grammar_t *g, cons_gstate_t *states,
                         uint32_t *bits, int32_t *next)
{
    cons_gstate_t *ids = states + CONS_TOKEN_MAX + 1;
    uint64_t hash[CONS_GBNF_WALK_IDS];
    int32_t at[CONS_TOKEN_MAX + 1]; /* the state id at each depth of the path (or WALK_RAW) */
    uint32_t n_ids = 0, i = 0;
    int32_t n = 0;
    if (walk_intern(ids, hash, &n_ids, &states[0]) < 0)
        return -1;
    at[0] = 0;
    while (i < v->all.n) {
        unsigned d = v->all.depth[i];
        int32_t from = at[d - 1], to = WALK_UNKNOWN;
        uint8_t b = v->all.byte[i];
        if (from >= 0)
            to = next[from * 256 + b];
        if (to == WALK_UNKNOWN) {
            const cons_gstate_t *src = from >= 0 ? &ids[from] : &states[d - 1];
            to = WALK_REFUSED;
            if (cons_gbnf_step(g, src, &states[d], b))
                to = states[d].need ? WALK_RAW : walk_intern(ids, hash, &n_ids, &states[d]);
            if (to == -1)
                return -1;
            if (from >= 0 && to != WALK_RAW)
                next[from * 256 + b] = to;
        }
        if (to == WALK_REFUSED) {
            i = v->all.skip[i];
            continue;
        }
        at[d] = to;
        n += cons_tnodes_take(&v->all, i, bits);
        i++;
    }
    return n;
}

void cons_gbnf_walk(const cons_vocab_t *v, const cons_grammar_t *g, cons_gstate_t *states,
                    uint32_t *bits, int32_t *n_allowed)
{
    int32_t *next = malloc(CONS_GBNF_WALK_IDS * 256 * sizeof *next);
    int32_t n = -1;
    if (next) {
        memset(next, 0xff, CONS_GBNF_WALK_IDS * 256 * sizeof *next); /* WALK_UNKNOWN */
        n = walk_memo(v, g, states, bits, next);
        free(next);
    }
    if (n < 0) { /* too many distinct states (or no memory): the plain walk */
        memset(bits, 0, ((size_t)v->n_vocab + 31) / 32 * sizeof *bits);
        n = walk_plain(v, g, states, bits);
    }
    *n_allowed = n;
}

/* cons_match: the byte automaton of a compiled schema: one byte at a time, a stack of frames
 * (object, array, string, number, literal set), whitespace between JSON tokens bounded. */
#include "engine/cons_int.h"

#include <string.h>

/* What a frame's handler did with the byte. */
enum {
    R_REJECT = 0, /* the byte cannot follow */
    R_OK,         /* consumed */
    R_END,        /* the frame ended before the byte: pop it and give the byte to its parent */
    R_CLOSE,      /* consumed, and the frame's value is complete: pop it */
    R_AGAIN,      /* give the byte to the top frame again (a frame changed state or was pushed) */
};

static int is_ws(uint8_t c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Whitespace in a state that takes it: bounded per run. */
static int take_ws(cons_state_t *s)
{
    if (s->ws >= CONS_MAX_WS)
        return R_REJECT;
    s->ws++;
    return R_OK;
}

/* Pushes a value of node at ST_START; 0 when the stack is full. */
static int push(cons_state_t *s, uint32_t node)
{
    if (s->depth >= CONS_MAX_DEPTH)
        return 0;
    s->f[s->depth++] = (cons_frame_t){.node = (uint16_t)node, .st = ST_START};
    return 1;
}

static const cons_lit_t *node_lits(const cons_schema_t *sc, const cons_node_t *n)
{
    return sc->lits + n->first;
}

/* ------------------------------------------------------------------ integer bounds */

static int digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

/* Whether an integer whose sign is neg and whose k digits so far make v can still end within n's
 * bounds: itself, or v followed by j more digits (none after a leading 0), up to the digit limit. */
static int int_reachable(const cons_node_t *n, int neg, uint64_t v, unsigned k)
{
    if (n->min == INT64_MIN && n->max == INT64_MAX)
        return 1;
    uint64_t p = 1;
    for (unsigned j = 0; k + j <= CONS_INT_DIGITS && (v || !j); j++, p *= 10) {
        int64_t a = (int64_t)(v * p), b = (int64_t)(v * p + p - 1); /* below 10^15 */
        if (neg) {
            int64_t t = -b;
            b = -a;
            a = t;
        }
        if (a <= n->max && b >= n->min)
            return 1;
    }
    return 0;
}

/* An integer's next digit c: 0 when no integer within n's bounds begins so. Numbers carry no value
 * (their bounds are refused at compile time). */
static int int_digit(const cons_node_t *n, cons_frame_t *f, uint8_t c)
{
    if (n->kind != CK_INTEGER)
        return 1;
    uint64_t v = f->cand * 10 + (uint64_t)(c - '0');
    if (!int_reachable(n, f->aux, v, (unsigned)f->pos + 1u))
        return 0;
    f->cand = v;
    return 1;
}

/* Whether a whole integer (or any number) ends within n's bounds. */
static int int_in_bounds(const cons_node_t *n, const cons_frame_t *f)
{
    if (n->kind != CK_INTEGER)
        return 1;
    int64_t v = f->aux ? -(int64_t)f->cand : (int64_t)f->cand;
    return v >= n->min && v <= n->max;
}

/* ------------------------------------------------------------------ value start */

/* The first byte of a value: anyOf picks its branch by it, then the kind's opening. */
static int start_value(const cons_schema_t *sc, cons_frame_t *f, uint8_t c)
{
    const cons_node_t *n = &sc->nodes[f->node];
    while (n->kind == CK_ANYOF) {
        uint32_t i = 0;
        while (i < n->n && !cons_bit(sc->nodes[sc->kids[n->first + i]].start, c))
            i++;
        if (i == n->n)
            return R_REJECT;
        f->node = (uint16_t)sc->kids[n->first + i];
        n = &sc->nodes[f->node];
    }
    f->pos = f->count = 0;
    switch (n->kind) {
    case CK_OBJECT: f->st = ST_O_KEY_OR_END; return c == '{' ? R_OK : R_REJECT;
    case CK_ARRAY: f->st = ST_A_FIRST; return c == '[' ? R_OK : R_REJECT;
    case CK_STRING:
        f->st = ST_S_BODY;
        f->cand = n->re >= 0 ? cons_re_init(&sc->res[n->re]) : 0;
        return c == '"' ? R_OK : R_REJECT;
    case CK_NUMBER:
    case CK_INTEGER:
        f->cand = f->aux = 0;
        if (c == '-') {
            f->st = ST_N_MINUS;
            f->aux = 1;
            return n->min <= 0 ? R_OK : R_REJECT; /* "-0" is 0 */
        }
        if (!digit(c) || !int_digit(n, f, c))
            return R_REJECT;
        f->st = c == '0' ? ST_N_ZERO : ST_N_INT;
        f->pos = 1;
        return R_OK;
    case CK_LITS: {
        f->st = ST_L_MATCH;
        f->cand = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
        return R_AGAIN; /* ST_L_MATCH takes the byte */
    }
    case CK_ANYOF: break;
    }
    return R_REJECT;
}

/* ------------------------------------------------------------------ literal sets */

static int lits_step(const cons_schema_t *sc, cons_frame_t *f, uint8_t c)
{
    const cons_node_t *n = &sc->nodes[f->node];
    const cons_lit_t *l = node_lits(sc, n);
    uint64_t next = 0;
    int complete = 0, longer = 0;
    for (uint32_t i = 0; i < n->n; i++) {
        if (!(f->cand >> i & 1))
            continue;
        if (l[i].len == f->pos)
            complete = 1;
        else if ((uint8_t)l[i].text[f->pos] == c)
            next |= 1ull << i;
    }
    if (!next)
        return complete ? R_END : R_REJECT;
    f->cand = next;
    f->pos++;
    for (uint32_t i = 0; i < n->n; i++)
        if ((next >> i & 1) && l[i].len > f->pos)
            longer = 1;
    return longer ? R_OK : R_CLOSE; /* complete, nothing longer can follow: done now */
}

/* ------------------------------------------------------------------ objects */

/* The declared properties a key may name now: from count on, up to the first required. */
static uint64_t key_cands(const cons_schema_t *sc, const cons_node_t *n, uint32_t from)
{
    uint64_t m = 0;
    for (uint32_t j = from; j < n->n; j++) {
        m |= 1ull << j;
        if (sc->props[n->first + j].required)
            break;
    }
    return m;
}

/* Whether '}' may come after count declared properties: no required one is left. */
static int may_close(const cons_schema_t *sc, const cons_node_t *n, uint32_t from)
{
    for (uint32_t j = from; j < n->n; j++)
        if (sc->props[n->first + j].required)
            return 0;
    return 1;
}

/* A key opens: a declared one (matched in this frame) or any string (a child frame). */
static int key_open(const cons_schema_t *sc, cons_state_t *s, cons_frame_t *f, const cons_node_t *n)
{
    if (n->n == 0 && n->item >= 0) { /* generic: any key */
        f->st = ST_O_COLON;
        if (!push(s, (uint32_t)sc->key_str))
            return R_REJECT;
        s->f[s->depth - 1].st = ST_S_BODY;
        return R_OK;
    }
    f->cand = key_cands(sc, n, f->count);
    if (!f->cand)
        return R_REJECT;
    f->st = ST_O_KEYLIT;
    f->pos = 1; /* every key starts with its quote */
    return R_OK;
}

static int keylit_step(const cons_schema_t *sc, cons_frame_t *f, const cons_node_t *n, uint8_t c)
{
    uint64_t next = 0;
    for (uint32_t j = 0; j < n->n; j++) {
        const cons_prop_t *p = &sc->props[n->first + j];
        if ((f->cand >> j & 1) && p->len > f->pos && (uint8_t)p->key[f->pos] == c)
            next |= 1ull << j;
    }
    if (!next)
        return R_REJECT;
    f->cand = next;
    f->pos++;
    for (uint32_t j = 0; j < n->n; j++)
        if ((next >> j & 1) && sc->props[n->first + j].len == f->pos) {
            f->count = (uint16_t)(j + 1); /* keys are distinct strings: this one is it */
            f->st = ST_O_COLON;
        }
    return R_OK;
}

static int object_step(const cons_schema_t *sc, cons_state_t *s, cons_frame_t *f, uint8_t c)
{
    const cons_node_t *n = &sc->nodes[f->node];
    switch (f->st) {
    case ST_O_KEY_OR_END:
        if (c == '}' && may_close(sc, n, 0))
            return R_CLOSE;
        /* fallthrough */
    case ST_O_KEY:
        if (is_ws(c))
            return take_ws(s);
        return c == '"' ? key_open(sc, s, f, n) : R_REJECT;
    case ST_O_KEYLIT: return keylit_step(sc, f, n, c);
    case ST_O_COLON:
        if (is_ws(c))
            return take_ws(s);
        if (c != ':')
            return R_REJECT;
        f->st = ST_O_AFTER;
        return push(s, n->n ? (uint32_t)sc->props[n->first + f->count - 1].node : (uint32_t)n->item)
                   ? R_OK
                   : R_REJECT;
    case ST_O_AFTER:
        if (is_ws(c))
            return take_ws(s);
        if (c == '}' && may_close(sc, n, f->count))
            return R_CLOSE;
        if (c == ',' && ((n->n == 0 && n->item >= 0) || f->count < n->n)) {
            f->st = ST_O_KEY;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

/* ------------------------------------------------------------------ arrays */

static int array_step(const cons_schema_t *sc, cons_state_t *s, cons_frame_t *f, uint8_t c)
{
    const cons_node_t *n = &sc->nodes[f->node];
    if (is_ws(c))
        return take_ws(s);
    switch (f->st) {
    case ST_A_FIRST:
        if (c == ']')
            return n->lo == 0 ? R_CLOSE : R_REJECT;
        /* fallthrough */
    case ST_A_ITEM:
        if (f->count >= n->hi)
            return R_REJECT;
        f->count++;
        f->st = ST_A_AFTER;
        if (!push(s, (uint32_t)n->item))
            return R_REJECT;
        return R_AGAIN; /* the byte starts the item just pushed */
    case ST_A_AFTER:
        if (c == ']')
            return f->count >= n->lo ? R_CLOSE : R_REJECT;
        if (c == ',' && f->count < n->hi) {
            f->st = ST_A_ITEM;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

/* ------------------------------------------------------------------ strings */

/* UTF-8 lead bytes: continuation bytes to come and the range of the first (0: 80..BF,
 * 1: A0..BF after E0, 2: 80..9F after ED, 3: 90..BF after F0, 4: 80..8F after F4); 0 = invalid. */
static uint8_t utf8_lead(uint8_t c)
{
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c == 0xE0)
        return 2 | 1 << 2;
    if (c == 0xED)
        return 2 | 2 << 2;
    if (c >= 0xE1 && c <= 0xEF)
        return 2;
    if (c == 0xF0)
        return 3 | 3 << 2;
    if (c >= 0xF1 && c <= 0xF3)
        return 3;
    if (c == 0xF4)
        return 3 | 4 << 2;
    return 0;
}

static int utf8_cont(cons_frame_t *f, uint8_t c)
{
    static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
    static const uint8_t hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    unsigned r = f->aux >> 2, left = f->aux & 3u;
    if (c < lo[r] || c > hi[r])
        return R_REJECT;
    left--;
    f->aux = (uint8_t)left;
    if (!left)
        f->st = ST_S_BODY;
    return R_OK;
}

/* A string's pattern takes character c (an ASCII code or CONS_RE_OTHER) as the string's count-th
 * character, with a match still possible within the string's length bounds: 0 when not. */
static int pattern_takes(const cons_schema_t *sc, const cons_node_t *n, cons_frame_t *f, unsigned c,
                         uint32_t count)
{
    if (n->re < 0)
        return 1;
    const cons_re_t *re = &sc->res[n->re];
    uint64_t next = cons_re_step(re, f->cand, c);
    unsigned fewest, most;
    if (!next)
        return 0;
    cons_re_left(re, next, &fewest, &most);
    if (fewest == CONS_RE_FAR || (n->hi != CONS_UNBOUNDED && count + fewest > n->hi) ||
        (most != CONS_RE_FAR && count + most < n->lo))
        return 0;
    f->cand = next;
    return 1;
}

static const char esc_byte[] = "\"\\/bfnrt", esc_char[] = "\"\\/\b\f\n\r\t";

/* A backslash may open an escape only when the pattern takes one of the characters it writes. */
static int escape_possible(const cons_schema_t *sc, const cons_node_t *n, const cons_frame_t *f)
{
    if (n->re < 0)
        return 1;
    cons_frame_t g = *f;
    for (int i = 0; i < 8; i++)
        if (pattern_takes(sc, n, &g, (uint8_t)esc_char[i], f->count + 1u))
            return 1;
    return 0;
}

static int string_step(const cons_schema_t *sc, const cons_node_t *n, cons_frame_t *f, uint8_t c)
{
    if (f->st == ST_S_UTF8)
        return utf8_cont(f, c);
    if (f->st == ST_S_ESC) {
        const char *e = memchr(esc_byte, c, 8); /* no \u: every character can be written as is */
        if (!e || !pattern_takes(sc, n, f, (uint8_t)esc_char[e - esc_byte], f->count))
            return R_REJECT;
        f->st = ST_S_BODY;
        return R_OK;
    }
    if (c == '"')
        return f->count >= n->lo && (n->re < 0 || cons_re_accepts(&sc->res[n->re], f->cand))
                   ? R_CLOSE
                   : R_REJECT;
    if (c < 0x20 || f->count >= n->hi)
        return R_REJECT;
    if (c == '\\') {
        if (!escape_possible(sc, n, f))
            return R_REJECT;
        f->st = ST_S_ESC;
    } else if (c >= 0x80) {
        uint8_t l = utf8_lead(c);
        if (!l || !pattern_takes(sc, n, f, CONS_RE_OTHER, f->count + 1u))
            return R_REJECT;
        f->aux = l;
        f->st = ST_S_UTF8;
    } else if (!pattern_takes(sc, n, f, c, f->count + 1u))
        return R_REJECT;
    f->count++;
    return R_OK;
}

/* ------------------------------------------------------------------ numbers */

/* A number frame: R_END on a byte that cannot continue it once it is a whole number. */
static int number_step(const cons_node_t *n, cons_frame_t *f, uint8_t c)
{
    int real = n->kind == CK_NUMBER;
    switch (f->st) {
    case ST_N_MINUS:
        if (!digit(c) || !int_digit(n, f, c))
            return R_REJECT;
        f->st = c == '0' ? ST_N_ZERO : ST_N_INT;
        f->pos = 1;
        return R_OK;
    case ST_N_INT:
        if (digit(c) && f->pos < CONS_INT_DIGITS) {
            if (!int_digit(n, f, c))
                return R_REJECT;
            f->pos++;
            return R_OK;
        }
        /* fallthrough */
    case ST_N_ZERO:
        if (real && c == '.')
            f->st = ST_N_DOT;
        else if (real && (c == 'e' || c == 'E'))
            f->st = ST_N_E;
        else
            return int_in_bounds(n, f) ? R_END : R_REJECT;
        f->pos = 0;
        return R_OK;
    case ST_N_DOT:
    case ST_N_ESIGN:
        if (!digit(c))
            return R_REJECT;
        f->st = f->st == ST_N_DOT ? ST_N_FRAC : ST_N_EXP;
        f->pos = 1;
        return R_OK;
    case ST_N_FRAC:
        if (digit(c) && f->pos < CONS_INT_DIGITS) {
            f->pos++;
            return R_OK;
        }
        if (c != 'e' && c != 'E')
            return R_END;
        f->st = ST_N_E;
        return R_OK;
    case ST_N_E:
        if (c == '+' || c == '-') {
            f->st = ST_N_ESIGN;
            return R_OK;
        }
        if (!digit(c))
            return R_REJECT;
        f->st = ST_N_EXP;
        f->pos = 1;
        return R_OK;
    case ST_N_EXP:
        if (digit(c) && f->pos < CONS_EXP_DIGITS) {
            f->pos++;
            return R_OK;
        }
        return R_END;
    }
    return R_REJECT;
}

/* ------------------------------------------------------------------ the automaton */

void cons_state_init(const cons_schema_t *sc, cons_state_t *s)
{
    s->depth = 1;
    s->ws = 0;
    s->begun = 1;
    s->f[0] = (cons_frame_t){.node = (uint16_t)sc->root, .st = ST_START};
}

/* One frame's handler for c. */
static int frame_step(const cons_schema_t *sc, cons_state_t *s, cons_frame_t *f, uint8_t c)
{
    const cons_node_t *n = &sc->nodes[f->node];
    if (f->st == ST_START) /* no whitespace before the document: the openai SDK's stream helper
                              parses the content so far and fails on a blank first chunk */
        return !is_ws(c) ? start_value(sc, f, c) : f == s->f ? R_REJECT : take_ws(s);
    if (f->st <= ST_O_AFTER)
        return object_step(sc, s, f, c);
    if (f->st <= ST_A_AFTER)
        return array_step(sc, s, f, c);
    if (f->st <= ST_S_UTF8)
        return string_step(sc, n, f, c);
    if (f->st <= ST_N_EXP)
        return number_step(n, f, c);
    return lits_step(sc, f, c);
}

int cons_step(const cons_schema_t *sc, cons_state_t *s, uint8_t c)
{
    uint8_t ws = s->ws;
    for (;;) {
        if (s->depth == 0) /* after the document: whitespace only */
            return is_ws(c) && take_ws(s);
        cons_frame_t *f = &s->f[s->depth - 1];
        int r = frame_step(sc, s, f, c);
        switch (r) {
        case R_REJECT: return 0;
        case R_OK:
            if (!is_ws(c) || s->ws == ws)
                s->ws = 0;
            return 1;
        case R_CLOSE:
            s->depth--;
            s->ws = 0;
            return 1;
        case R_END: s->depth--; continue;
        case R_AGAIN: continue;
        }
        return 0;
    }
}

int cons_state_complete(const cons_schema_t *sc, const cons_state_t *s)
{
    if (s->depth == 0)
        return 1;
    if (s->depth > 1)
        return 0;
    const cons_frame_t *f = &s->f[0];
    switch (f->st) {
    case ST_N_ZERO:
    case ST_N_INT: return int_in_bounds(&sc->nodes[f->node], f);
    case ST_N_FRAC:
    case ST_N_EXP: return 1;
    case ST_L_MATCH: {
        const cons_node_t *n = &sc->nodes[f->node];
        for (uint32_t i = 0; i < n->n; i++)
            if ((f->cand >> i & 1) && sc->lits[n->first + i].len == f->pos)
                return 1;
        return 0;
    }
    }
    return 0;
}

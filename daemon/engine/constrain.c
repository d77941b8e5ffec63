/* constrain: a sequence's matcher (mask per step, advance per token) and the cache of compiled
 * schemas and grammars; the schema compiler is cons_schema.c, its automaton cons_match.c, the
 * trie cons_trie.c; the grammar's compiler cons_gbnf.c, its matcher cons_gmatch.c. */
#include "engine/constrain.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cons_gbnf.h"
#include "engine/cons_int.h"
#include "engine/cons_trie.h"

/* ------------------------------------------------------------------ matcher */

#define CONS_LIT_MAX 64 /* bytes of cons_new_repeat's after and between, with a NUL */

struct cons {
    cons_schema_t *sc; /* a reference; NULL when g is set */
    cons_grammar_t *g; /* a reference: the grammar this matcher follows instead of sc */
    const cons_vocab_t *v;
    cons_state_t *states;   /* (CONS_TOKEN_MAX + 1): [0] the current state, the rest scratch */
    cons_gstate_t *gstates; /* (CONS_GBNF_STATES) with g: [0] the current state, the rest scratch */
    uint32_t *bits;         /* (words) the last mask */
    size_t words;
    /* cons_new_repeat: documents of sc joined by lit = after + between (0 bytes: one document) */
    char lit[CONS_LIT_MAX]; /* after then between, NUL-terminated */
    size_t n_after;         /* bytes of after in lit: lit[0, n_after) follows each document */
    size_t n_lit;           /* bytes of lit */
    uint64_t pos;           /* bit p: p bytes of lit matched (1 <= p < n_lit) */
    int doc;                /* 1 while states[0] is a live document (0: only lit can go on) */
    int32_t *xid;           /* (n_x) tokens written as xtext[k] inside lit (cons_allow_tokens) */
    char **xtext;           /* (n_x) owned */
    size_t n_x;
};

cons_t *cons_new(cons_schema_t *sc, const cons_vocab_t *v)
{
    cons_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->words = ((size_t)v->n_vocab + 31) / 32;
    c->states = malloc((CONS_TOKEN_MAX + 1) * sizeof *c->states);
    c->bits = malloc(c->words * sizeof *c->bits);
    if (!c->states || !c->bits) {
        free(c->states);
        free(c->bits);
        free(c);
        return NULL;
    }
    c->sc = cons_schema_ref(sc);
    c->v = v;
    c->doc = 1;
    cons_state_init(sc, &c->states[0]);
    return c;
}

cons_t *cons_new_repeat(cons_schema_t *sc, const cons_vocab_t *v, const char *after,
                        const char *between)
{
    size_t na = strlen(after), nb = strlen(between);
    if (!na || !nb || na + nb >= CONS_LIT_MAX)
        return NULL;
    cons_t *c = cons_new(sc, v);
    if (!c)
        return NULL;
    memcpy(c->lit, after, na);
    memcpy(c->lit + na, between, nb + 1);
    c->n_after = na;
    c->n_lit = na + nb;
    return c;
}

int cons_allow_tokens(cons_t *c, const int32_t *ids, const char *const *texts, size_t n)
{
    int32_t *xid = realloc(c->xid, (c->n_x + n) * sizeof *xid);
    char **xt = xid ? realloc(c->xtext, (c->n_x + n) * sizeof *xt) : NULL;
    if (xid)
        c->xid = xid;
    if (!xt)
        return -1;
    c->xtext = xt;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->v->n_vocab || c->v->tok_len[ids[i]])
            continue; /* only tokens without bytes of their own */
        if (!(c->xtext[c->n_x] = strdup(texts[i])))
            return -1;
        c->xid[c->n_x++] = ids[i];
    }
    return 0;
}

cons_t *cons_new_grammar(cons_grammar_t *g, const cons_vocab_t *v)
{
    cons_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->words = ((size_t)v->n_vocab + 31) / 32;
    c->gstates = malloc(CONS_GBNF_STATES * sizeof *c->gstates);
    c->bits = malloc(c->words * sizeof *c->bits);
    if (!c->gstates || !c->bits || cons_gbnf_init(g, &c->gstates[0])) {
        free(c->gstates);
        free(c->bits);
        free(c);
        return NULL;
    }
    c->g = cons_grammar_ref(g);
    c->v = v;
    return c;
}

void cons_free(cons_t *c)
{
    if (!c)
        return;
    cons_schema_unref(c->sc);
    cons_grammar_unref(c->g);
    for (size_t i = 0; i < c->n_x; i++)
        free(c->xtext[i]);
    free(c->xid);
    free(c->xtext);
    free(c->gstates);
    free(c->states);
    free(c->bits);
    free(c);
}

int cons_complete(const cons_t *c)
{
    if (c->g)
        return cons_gbnf_complete(&c->gstates[0]);
    if (c->n_lit)
        return (int)(c->pos >> c->n_after & 1u);
    return cons_state_complete(c->sc, &c->states[0]);
}

/* ------------------------------------------------------------------ repeated documents */

/* Sets the bits of the tokens that write lit from byte p on without going past its end: the
 * trie's tokens along lit[p..] and the allowed tokens whose text lit holds there; returns how
 * many were not set before. */
static int32_t lit_mask(cons_t *c, size_t p, uint32_t *bits)
{
    const cons_tnodes_t *t = &c->v->all;
    int32_t n = 0;
    for (uint32_t j = 0, end = t->n, q = (uint32_t)p; q < c->n_lit && j < end;) {
        if (t->byte[j] != (uint8_t)c->lit[q]) {
            j = t->skip[j];
            continue;
        }
        for (uint32_t k = t->tok[j]; k < t->tok[j + 1]; k++) {
            int32_t id = t->toks[k];
            n += !(bits[id >> 5] >> (id & 31) & 1u);
            bits[id >> 5] |= 1u << (id & 31);
        }
        end = t->skip[j]; /* on to j's children */
        j++;
        q++;
    }
    for (size_t i = 0; i < c->n_x; i++) {
        size_t l = strlen(c->xtext[i]);
        int32_t id = c->xid[i];
        if (p + l <= c->n_lit && memcmp(c->lit + p, c->xtext[i], l) == 0 &&
            !(bits[id >> 5] >> (id & 31) & 1u)) {
            bits[id >> 5] |= 1u << (id & 31);
            n++;
        }
    }
    return n;
}

/* The allowed tokens of a repeat matcher (bits set here): the document's, and those that write
 * lit from each position reached. Returns their count. */
static int32_t repeat_mask(cons_t *c, uint32_t *bits)
{
    int32_t n = 0;
    if (c->doc)
        n = cons_trie_mask(c->v, c->sc, c->states, bits);
    else
        memset(bits, 0, c->words * sizeof *bits);
    uint64_t pos = c->pos;
    if (c->doc && cons_state_complete(c->sc, &c->states[0]))
        pos |= 1u;
    for (size_t p = 0; p < c->n_lit; p++)
        if (pos >> p & 1u)
            n += lit_mask(c, p, bits);
    return n;
}

/* Feeds bytes to a repeat matcher: the document (while live; lit_only: not the one begun before
 * them) and lit's positions step together; lit's last byte starts the next document. 0, or -1 (c
 * unchanged) when no branch goes on. */
static int repeat_accept_bytes(cons_t *c, const char *bytes, size_t n, int lit_only)
{
    cons_state_t *doc = &c->states[1];
    int live = c->doc;
    uint64_t pos = c->pos;
    cons_state_copy(doc, &c->states[0]);
    if (live && cons_state_complete(c->sc, doc))
        pos |= 1u;
    live = live && !lit_only;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)bytes[i];
        uint64_t next = 0;
        if (live && cons_state_complete(c->sc, doc))
            pos |= 1u;
        for (size_t p = 0; p < c->n_lit; p++)
            if (pos >> p & 1u && (uint8_t)c->lit[p] == b)
                next |= (uint64_t)1u << (p + 1);
        live = live && cons_step(c->sc, doc, b);
        if (next >> c->n_lit & 1u) { /* between written: the next document (lit's '<' ended
                                        the last one) */
            next &= ~((uint64_t)1u << c->n_lit);
            cons_state_init(c->sc, doc);
            live = 1;
        }
        pos = next;
        if (!live && !pos)
            return -1;
    }
    if (live) /* a dead document's state is garbage: never read again */
        cons_state_copy(&c->states[0], doc);
    c->doc = live;
    c->pos = pos;
    return 0;
}

const uint32_t *cons_mask(cons_t *c, int32_t *n_allowed)
{
    int32_t n = 0;
    if (c->g) {
        memset(c->bits, 0, c->words * sizeof *c->bits);
        cons_gbnf_walk(c->v, c->g, c->gstates, c->bits, &n);
    } else if (c->n_lit)
        n = repeat_mask(c, c->bits);
    else
        n = cons_trie_mask(c->v, c->sc, c->states, c->bits);
    if (cons_complete(c))
        for (int32_t i = 0; i < c->v->n_eog; i++) {
            int32_t id = c->v->eog[i];
            c->bits[id >> 5] |= 1u << (id & 31);
            n++;
        }
    if (n_allowed)
        *n_allowed = n;
    return c->bits;
}

int32_t cons_mask_logits(cons_t *c, float *logits)
{
    int32_t n;
    const uint32_t *bits = cons_mask(c, &n);
    int32_t V = c->v->n_vocab;
    for (size_t w = 0; w < c->words; w++) {
        uint32_t b = bits[w];
        if (b == 0xFFFFFFFFu)
            continue;
        int32_t base = (int32_t)(w * 32);
        for (int32_t k = 0; k < 32 && base + k < V; k++)
            if (!(b >> k & 1u))
                logits[base + k] = -INFINITY;
    }
    return n;
}

/* cons_accept_bytes for a grammar: steps between two scratch states. */
static int gbnf_accept_bytes(cons_t *c, const char *bytes, size_t n)
{
    cons_gstate_t *from = &c->gstates[0], *to = &c->gstates[1];
    for (size_t i = 0; i < n; i++) {
        if (!cons_gbnf_step(c->g, from, to, (uint8_t)bytes[i]))
            return -1;
        from = to;
        to = to == &c->gstates[1] ? &c->gstates[2] : &c->gstates[1];
    }
    if (from != &c->gstates[0])
        cons_gbnf_copy(&c->gstates[0], from);
    return 0;
}

int cons_accept_bytes(cons_t *c, const char *bytes, size_t n)
{
    if (c->g)
        return gbnf_accept_bytes(c, bytes, n);
    if (c->n_lit)
        return repeat_accept_bytes(c, bytes, n, 0);
    cons_state_t *tmp = &c->states[1];
    cons_state_copy(tmp, &c->states[0]);
    for (size_t i = 0; i < n; i++)
        if (!cons_step(c->sc, tmp, (uint8_t)bytes[i]))
            return -1;
    cons_state_copy(&c->states[0], tmp);
    return 0;
}

int cons_accept(cons_t *c, int32_t id)
{
    const cons_vocab_t *v = c->v;
    if (id < 0 || id >= v->n_vocab)
        return -1;
    for (int32_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return cons_complete(c) ? 0 : -1;
    for (size_t i = 0; i < c->n_x; i++)
        if (c->xid[i] == id) {
            /* a text allowed only inside lit: the document may not take it */
            return c->n_lit ? repeat_accept_bytes(c, c->xtext[i], strlen(c->xtext[i]), 1) : -1;
        }
    if (!v->tok_len[id])
        return -1;
    return cons_accept_bytes(c, (const char *)v->pool + v->tok_off[id], v->tok_len[id]);
}

/* ------------------------------------------------------------------ cache */

typedef struct centry {
    uint64_t hash;     /* FNV-1a of text */
    char *text;        /* the response_format, compact, keys in the order given; or the grammar */
    cons_schema_t *sc; /* a reference, or NULL for a grammar */
    cons_grammar_t *g; /* a reference, or NULL for a schema */
} centry_t;

struct cons_cache {
    pthread_mutex_t lock;
    centry_t *e; /* (n) oldest first */
    size_t n, cap;
    uint64_t hits, misses;
};

cons_cache_t *cons_cache_new(size_t cap)
{
    cons_cache_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->cap = cap ? cap : 1;
    c->e = calloc(c->cap, sizeof *c->e);
    if (!c->e) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

void cons_cache_free(cons_cache_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->e[i].text);
        cons_schema_unref(c->e[i].sc);
        cons_grammar_unref(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Adds text -> sc or g (taking text and a reference to sc or g), dropping the oldest when full.
 * Caller holds c->lock. */
static void do_cache_put(cons_cache_t *c, uint64_t h, char *text, cons_schema_t *sc,
                         cons_grammar_t *g)
{
    if (c->n == c->cap) {
        free(c->e[0].text);
        cons_schema_unref(c->e[0].sc);
        cons_grammar_unref(c->e[0].g);
        memmove(c->e, c->e + 1, (c->n - 1) * sizeof *c->e);
        c->n--;
    }
    c->e[c->n++] = (centry_t){.hash = h,
                              .text = text,
                              .sc = sc ? cons_schema_ref(sc) : NULL,
                              .g = g ? cons_grammar_ref(g) : NULL};
}

cons_schema_t *cons_cache_get(cons_cache_t *c, const json_t *rf, int *code, char *err,
                              size_t errlen)
{
    char *text = json_dumps(rf, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        if (code)
            *code = CONS_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    uint64_t h = fnv1a(text);
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].sc && c->e[i].hash == h && strcmp(c->e[i].text, text) == 0) {
            cons_schema_t *sc = cons_schema_ref(c->e[i].sc);
            c->hits++;
            pthread_mutex_unlock(&c->lock);
            free(text);
            return sc;
        }
    c->misses++;
    pthread_mutex_unlock(&c->lock);
    cons_schema_t *sc = cons_schema_compile(rf, code, err, errlen); /* outside the lock */
    if (!sc) {
        free(text);
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    do_cache_put(c, h, text, sc, NULL);
    pthread_mutex_unlock(&c->lock);
    return sc;
}

cons_grammar_t *cons_cache_get_grammar(cons_cache_t *c, const char *text, int *code, char *err,
                                       size_t errlen)
{
    uint64_t h = fnv1a(text);
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].g && c->e[i].hash == h && strcmp(c->e[i].text, text) == 0) {
            cons_grammar_t *g = cons_grammar_ref(c->e[i].g);
            c->hits++;
            pthread_mutex_unlock(&c->lock);
            return g;
        }
    c->misses++;
    pthread_mutex_unlock(&c->lock);
    char *copy = strdup(text);
    cons_grammar_t *g = copy ? cons_grammar_compile(text, code, err, errlen) : NULL; /* unlocked */
    if (!copy) {
        if (code)
            *code = CONS_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
    }
    if (!g) {
        free(copy);
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    do_cache_put(c, h, copy, NULL, g);
    pthread_mutex_unlock(&c->lock);
    return g;
}

void cons_cache_counts(cons_cache_t *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->lock);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->lock);
}

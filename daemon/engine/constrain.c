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

struct cons {
    cons_schema_t *sc; /* a reference; NULL when g is set */
    cons_grammar_t *g; /* a reference: the grammar this matcher follows instead of sc */
    const cons_vocab_t *v;
    cons_state_t *states;   /* (CONS_TOKEN_MAX + 1): [0] the current state, the rest scratch */
    cons_gstate_t *gstates; /* (CONS_GBNF_STATES) with g: [0] the current state, the rest scratch */
    uint32_t *bits;         /* (words) the last mask */
    size_t words;
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
    cons_state_init(sc, &c->states[0]);
    return c;
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
    free(c->gstates);
    free(c->states);
    free(c->bits);
    free(c);
}

int cons_complete(const cons_t *c)
{
    if (c->g)
        return cons_gbnf_complete(&c->gstates[0]);
    return cons_state_complete(c->sc, &c->states[0]);
}

const uint32_t *cons_mask(cons_t *c, int32_t *n_allowed)
{
    int32_t n = 0;
    if (c->g) {
        memset(c->bits, 0, c->words * sizeof *c->bits);
        cons_gbnf_walk(c->v, c->g, c->gstates, c->bits, &n);
    } else
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

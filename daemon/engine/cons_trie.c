/* cons_trie: the vocabulary's token bytes as a trie laid out in preorder (each node knows where its
 * subtree ends), so one walk with the automaton's state per depth finds every allowed token and
 * skips a whole subtree at its first rejected byte. */
#include "engine/cons_int.h"
#include "engine/cons_trie.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tb {
    const uint8_t *b; /* token bytes (into the pool) */
    uint32_t len;
    int32_t id;
} tb_t;

static int tb_cmp(const void *a, const void *b)
{
    const tb_t *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->b, y->b, n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Reads every token's bytes into v's pool (tok_off, tok_len) and lists the end-of-generation
 * tokens. */
static int read_tokens(cons_vocab_t *v, const tok_t *t, char *err, size_t errlen)
{
    size_t cap = 1u << 16, used = 0;
    v->pool = malloc(cap);
    v->tok_off = malloc((size_t)v->n_vocab * sizeof *v->tok_off);
    v->tok_len = calloc((size_t)v->n_vocab, sizeof *v->tok_len);
    v->eog = malloc((size_t)v->n_vocab * sizeof *v->eog);
    if (!v->pool || !v->tok_off || !v->tok_len || !v->eog)
        goto nomem;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        char buf[CONS_TOKEN_MAX + 1];
        int n = tok_piece(t, id, 0, buf, sizeof buf);
        v->tok_off[id] = (uint32_t)used;
        if (tok_is_eog(t, id)) {
            v->eog[v->n_eog++] = id;
            continue;
        }
        if (n <= 0 || n > CONS_TOKEN_MAX)
            continue; /* no bytes, or too long: never allowed */
        if (used + (size_t)n > cap) {
            uint8_t *p = realloc(v->pool, cap * 2);
            if (!p)
                goto nomem;
            v->pool = p;
            cap *= 2;
        }
        memcpy(v->pool + used, buf, (size_t)n);
        v->tok_len[id] = (uint8_t)n;
        used += (size_t)n;
    }
    return 0;
nomem:
    snprintf(err, errlen, "out of memory for the vocabulary trie");
    return -1;
}

/* Lays the sorted tokens out as a preorder trie: a node per distinct prefix. */
static int build_nodes(cons_vocab_t *v, const tb_t *tb, size_t n, char *err, size_t errlen)
{
    size_t cap = 1024;
    uint32_t open[CONS_TOKEN_MAX + 1]; /* node at each depth of the current path */
    v->node_byte = malloc(cap);
    v->node_depth = malloc(cap);
    v->node_skip = malloc(cap * sizeof *v->node_skip);
    v->node_tok = malloc((cap + 1) * sizeof *v->node_tok);
    v->toks = malloc((n ? n : 1) * sizeof *v->toks);
    if (!v->node_byte || !v->node_depth || !v->node_skip || !v->node_tok || !v->toks)
        goto nomem;
    uint32_t nn = 0, depth = 0, nt = 0;
    const tb_t *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t lcp = 0;
        if (prev)
            while (lcp < prev->len && lcp < tb[i].len && prev->b[lcp] == tb[i].b[lcp])
                lcp++;
        for (; depth > lcp; depth--) /* close the nodes below the shared prefix */
            v->node_skip[open[depth]] = nn;
        for (uint32_t d = lcp + 1; d <= tb[i].len; d++) {
            if (nn + 1 >= cap) {
                cap *= 2;
                uint8_t *b = realloc(v->node_byte, cap), *dd = realloc(v->node_depth, cap);
                v->node_byte = b ? b : v->node_byte;
                v->node_depth = dd ? dd : v->node_depth;
                uint32_t *s = realloc(v->node_skip, cap * sizeof *s);
                v->node_skip = s ? s : v->node_skip;
                uint32_t *k = realloc(v->node_tok, (cap + 1) * sizeof *k);
                v->node_tok = k ? k : v->node_tok;
                if (!b || !dd || !s || !k)
                    goto nomem;
            }
            v->node_byte[nn] = tb[i].b[d - 1];
            v->node_depth[nn] = (uint8_t)d;
            v->node_tok[nn] = nt;
            open[d] = nn++;
        }
        depth = tb[i].len;
        v->toks[nt++] = tb[i].id; /* ends at the last node opened (or the equal one before) */
        prev = &tb[i];
    }
    for (; depth > 0; depth--)
        v->node_skip[open[depth]] = nn;
    v->node_tok[nn] = nt;
    v->n_nodes = nn;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory for the vocabulary trie");
    return -1;
}

cons_vocab_t *cons_vocab_new(const tok_t *t, char *err, size_t errlen)
{
    cons_vocab_t *v = calloc(1, sizeof *v);
    tb_t *tb = NULL;
    if (!v) {
        snprintf(err, errlen, "out of memory for the vocabulary trie");
        return NULL;
    }
    v->n_vocab = tok_vocab_size(t);
    if (v->n_vocab <= 0) {
        snprintf(err, errlen, "the vocabulary is empty");
        goto fail;
    }
    if (read_tokens(v, t, err, errlen))
        goto fail;
    size_t n = 0;
    tb = malloc((size_t)v->n_vocab * sizeof *tb);
    if (!tb) {
        snprintf(err, errlen, "out of memory for the vocabulary trie");
        goto fail;
    }
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->tok_len[id])
            tb[n++] = (tb_t){.b = v->pool + v->tok_off[id], .len = v->tok_len[id], .id = id};
    qsort(tb, n, sizeof *tb, tb_cmp);
    if (build_nodes(v, tb, n, err, errlen))
        goto fail;
    free(tb);
    return v;
fail:
    free(tb);
    cons_vocab_free(v);
    return NULL;
}

void cons_vocab_free(cons_vocab_t *v)
{
    if (!v)
        return;
    free(v->pool);
    free(v->tok_off);
    free(v->tok_len);
    free(v->eog);
    free(v->node_byte);
    free(v->node_depth);
    free(v->node_skip);
    free(v->node_tok);
    free(v->toks);
    free(v);
}

int32_t cons_vocab_size(const cons_vocab_t *v)
{
    return v->n_vocab;
}

size_t cons_vocab_nodes(const cons_vocab_t *v)
{
    return v->n_nodes;
}

/* ------------------------------------------------------------------ masks */

void cons_trie_walk(const cons_vocab_t *v, const cons_schema_t *sc, cons_state_t *states,
                    uint32_t *bits, int32_t *n_allowed)
{
    int32_t n = 0;
    uint32_t i = 0;
    while (i < v->n_nodes) {
        unsigned d = v->node_depth[i];
        cons_state_t *s = &states[d];
        cons_state_copy(s, &states[d - 1]);
        if (!cons_step(sc, s, v->node_byte[i])) {
            i = v->node_skip[i];
            continue;
        }
        for (uint32_t k = v->node_tok[i]; k < v->node_tok[i + 1]; k++) {
            int32_t id = v->toks[k];
            bits[id >> 5] |= 1u << (id & 31);
            n++;
        }
        i++;
    }
    *n_allowed = n;
}

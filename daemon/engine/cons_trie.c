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
static int build_nodes(cons_tnodes_t *t, const tb_t *tb, size_t n, char *err, size_t errlen)
{
    size_t cap = 1024;
    uint32_t open[CONS_TOKEN_MAX + 1]; /* node at each depth of the current path */
    t->byte = malloc(cap);
    t->depth = malloc(cap);
    t->skip = malloc(cap * sizeof *t->skip);
    t->tok = malloc((cap + 1) * sizeof *t->tok);
    t->toks = malloc((n ? n : 1) * sizeof *t->toks);
    if (!t->byte || !t->depth || !t->skip || !t->tok || !t->toks)
        goto nomem;
    uint32_t nn = 0, depth = 0, nt = 0;
    const tb_t *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t lcp = 0;
        if (prev)
            while (lcp < prev->len && lcp < tb[i].len && prev->b[lcp] == tb[i].b[lcp])
                lcp++;
        for (; depth > lcp; depth--) /* close the nodes below the shared prefix */
            t->skip[open[depth]] = nn;
        for (uint32_t d = lcp + 1; d <= tb[i].len; d++) {
            if (nn + 1 >= cap) {
                cap *= 2;
                uint8_t *b = realloc(t->byte, cap), *dd = realloc(t->depth, cap);
                t->byte = b ? b : t->byte;
                t->depth = dd ? dd : t->depth;
                uint32_t *s = realloc(t->skip, cap * sizeof *s);
                t->skip = s ? s : t->skip;
                uint32_t *k = realloc(t->tok, (cap + 1) * sizeof *k);
                t->tok = k ? k : t->tok;
                if (!b || !dd || !s || !k)
                    goto nomem;
            }
            t->byte[nn] = tb[i].b[d - 1];
            t->depth[nn] = (uint8_t)d;
            t->tok[nn] = nt;
            open[d] = nn++;
        }
        depth = tb[i].len;
        t->toks[nt++] = tb[i].id; /* ends at the last node opened (or the equal one before) */
        prev = &tb[i];
    }
    for (; depth > 0; depth--)
        t->skip[open[depth]] = nn;
    t->tok[nn] = nt;
    t->n = nn;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory for the vocabulary trie");
    return -1;
}

static void free_nodes(cons_tnodes_t *t)
{
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok);
    free(t->toks);
}

/* Runs every token through the body of an unbounded string (the automaton itself, on a one-node
 * schema): a token that leaves it in the body is plain, with the characters it added. */
static int classify_plain(cons_vocab_t *v)
{
    cons_node_t str = {.kind = CK_STRING, .hi = CONS_UNBOUNDED, .item = -1, .ready = 1, .re = -1};
    cons_schema_t sc = {.nodes = &str, .n_nodes = 1, .root = 0, .key_str = 0, .any = -1};
    cons_state_t body, s;
    cons_state_init(&sc, &body);
    if (!cons_step(&sc, &body, '"'))
        return -1;
    v->plain = calloc(((size_t)v->n_vocab + 31) / 32, sizeof *v->plain);
    v->plain_ids = malloc((size_t)v->n_vocab * sizeof *v->plain_ids);
    v->tok_chars = calloc((size_t)v->n_vocab, 1);
    if (!v->plain || !v->plain_ids || !v->tok_chars)
        return -1;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        uint32_t len = v->tok_len[id], i = 0;
        const uint8_t *b = v->pool + v->tok_off[id];
        cons_state_copy(&s, &body);
        while (i < len && cons_step(&sc, &s, b[i]))
            i++;
        if (!len || i < len || s.depth != 1 || s.f[0].st != ST_S_BODY)
            continue;
        v->plain[id >> 5] |= 1u << (id & 31);
        v->plain_ids[v->n_plain++] = id;
        v->tok_chars[id] = (uint8_t)s.f[0].count;
        if (s.f[0].count > v->plain_most)
            v->plain_most = s.f[0].count;
    }
    return 0;
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
    if (build_nodes(&v->all, tb, n, err, errlen))
        goto fail;
    if (classify_plain(v)) {
        snprintf(err, errlen, "out of memory for the vocabulary trie");
        goto fail;
    }
    size_t r = 0; /* the sorted tokens that are not plain, still sorted */
    for (size_t i = 0; i < n; i++)
        if (!cons_bit(v->plain, (unsigned)tb[i].id))
            tb[r++] = tb[i];
    if (build_nodes(&v->rest, tb, r, err, errlen))
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
    free_nodes(&v->all);
    free_nodes(&v->rest);
    free(v->plain);
    free(v->plain_ids);
    free(v->tok_chars);
    free(v);
}

int32_t cons_vocab_size(const cons_vocab_t *v)
{
    return v->n_vocab;
}

size_t cons_vocab_nodes(const cons_vocab_t *v)
{
    return v->all.n;
}

/* ------------------------------------------------------------------ masks */

int32_t cons_trie_walk(const cons_tnodes_t *t, const cons_schema_t *sc, cons_state_t *states,
                       uint32_t *bits)
{
    int32_t n = 0;
    uint32_t i = 0;
    while (i < t->n) {
        unsigned d = t->depth[i];
        cons_state_t *s = &states[d];
        cons_state_copy(s, &states[d - 1]);
        if (!cons_step(sc, s, t->byte[i])) {
            i = t->skip[i];
            continue;
        }
        n += cons_tnodes_take(t, i, bits);
        i++;
    }
    return n;
}

int32_t cons_trie_mask(const cons_vocab_t *v, const cons_schema_t *sc, cons_state_t *states,
                       uint32_t *bits)
{
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    const cons_state_t *s = &states[0];
    const cons_frame_t *f = s->depth ? &s->f[s->depth - 1] : NULL;
    if (!f || f->st != ST_S_BODY || sc->nodes[f->node].re >= 0) { /* a pattern: token by token */
        memset(bits, 0, words * sizeof *bits);
        return cons_trie_walk(&v->all, sc, states, bits);
    }
    uint32_t hi = sc->nodes[f->node].hi, room = hi == CONS_UNBOUNDED ? hi : hi - f->count;
    int32_t n = 0;
    if (room >= v->plain_most) {
        memcpy(bits, v->plain, words * sizeof *bits);
        n = v->n_plain;
    } else {
        memset(bits, 0, words * sizeof *bits);
        for (int32_t i = 0; i < v->n_plain; i++) {
            int32_t id = v->plain_ids[i];
            if (v->tok_chars[id] <= room) {
                bits[id >> 5] |= 1u << (id & 31);
                n++;
            }
        }
    }
    return n + cons_trie_walk(&v->rest, sc, states, bits);
}

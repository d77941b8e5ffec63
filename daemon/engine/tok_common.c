/* tok_common: the machinery both tokenizer families share: the text -> id hash map, UTF-8 and byte-level helpers, scratch buffers and the greedy merge of symbol pairs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_int.h"

/* ------------------------------------------------------------------ errors */

void tok_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ hash map */

static uint32_t tok_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a, then a murmur3 finalizer */

    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

int tok_map_init(tok_map_t *m, size_t n)
{
    size_t cap = 16;

    if (n > SIZE_MAX / 4 / sizeof(tok_slot_t))
        return -1;
    while (cap < n * 2)
        cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return -1;
    m->mask = cap - 1;
    return 0;
}

void tok_map_free(tok_map_t *m)
{
    free(m->slots);
    m->slots = NULL;
}

static tok_slot_t *tok_map_slot(const tok_map_t *m, const char *s, size_t n, uint32_t h)
{
    size_t i = h & m->mask;

    for (;;) {
        tok_slot_t *sl = &m->slots[i];
        if (!sl->key || (sl->hash == h && sl->len == n && memcmp(sl->key, s, n) == 0))
            return sl;
        i = (i + 1) & m->mask;
    }
}

/* Insert key -> val; an existing key keeps its value unless overwrite is set.
 * The map was sized for all inserts at init, so this cannot fail. */
void tok_map_put(tok_map_t *m, const char *s, size_t n, int32_t val, int overwrite)
{
    uint32_t h = tok_hash(s, n);
    tok_slot_t *sl = tok_map_slot(m, s, n, h);

    if (sl->key && !overwrite)
        return;
    sl->key = s;
    sl->len = (uint32_t)n;
    sl->hash = h;
    sl->val = val;
}

int32_t tok_map_get(const tok_map_t *m, const char *s, size_t n)
{
    const tok_slot_t *sl;

    if (!m->slots || n > TOK_MAX_TEXT * 2 + 1)
        return TOK_NONE;
    sl = tok_map_slot(m, s, n, tok_hash(s, n));
    return sl->key ? sl->val : TOK_NONE;
}

/* ------------------------------------------------------------------ UTF-8 and byte-level helpers */

/* Length of a UTF-8 sequence from its lead byte, as llama.cpp's
 * unicode_len_utf8 (continuation and invalid bytes count as 1). */
size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

size_t tok_utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode one (possibly invalid) UTF-8 character of s[0..n); *cp = -1 when
 * invalid. Returns the bytes consumed (>= 1). */
size_t tok_utf8_get(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len = tok_utf8_len(u[0]);
    uint32_t v;

    *cp = -1;
    if (len == 1) {
        if (u[0] < 0x80)
            *cp = u[0];
        return 1;
    }
    if (len > n)
        return 1;
    v = u[0] & (0xFFu >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 1;
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = (int32_t)v;
    return len;
}

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
uint32_t tok_byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 33 + 34; /* 173 */
}

/* Inverse of tok_byte_to_cp; -1 if cp is not a byte-level character. */
int tok_cp_to_byte(int32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return cp;
    if (cp >= 256 && cp <= 288)
        return cp - 256;
    if (cp >= 289 && cp <= 322)
        return cp - 289 + 127;
    if (cp == 323)
        return 173;
    return -1;
}

/* ------------------------------------------------------------------ encoding: shared machinery */

void tok_out_push(tok_out_t *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

int tok_reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t nc;
    void *q;

    if (need <= *cap)
        return 0;
    nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return TOK_ERR_NOMEM;
        nc *= 2;
    }
    q = realloc(*p, nc * elem);
    if (!q)
        return TOK_ERR_NOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static int tok_bigram_before(const tok_bigram_t *a, const tok_bigram_t *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int tok_heap_push(tok_work_t *w, tok_bigram_t b)
{
    size_t i;

    if (tok_reserve((void **)&w->heap, &w->heapcap, w->nheap + 1, sizeof *w->heap) < 0)
        return TOK_ERR_NOMEM;
    i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_bigram_before(&b, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static tok_bigram_t tok_heap_pop(tok_work_t *w)
{
    tok_bigram_t top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && tok_bigram_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!tok_bigram_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* Queue the merge of symbols left and right if the vocabulary allows it. */
static int tok_try_bigram(const tok_t *t, tok_work_t *w, int left, int right)
{
    const tok_sym_t *l, *r;
    tok_bigram_t b;
    size_t size;

    if (left < 0 || right < 0)
        return 0;
    l = &w->sym[left];
    r = &w->sym[right];
    size = (size_t)l->n + r->n;
    if (t->kind == TOK_KIND_SPM) {
        int32_t id;
        if (size > t->max_len)
            return 0;
        id =
            tok_map_get(&t->vocab, w->buf + l->off, size); /* the two symbols are adjacent in buf */
        if (id < 0)
            return 0;
        b.key = -(double)t->score[id];
    } else {
        int32_t rank;
        if (size > TOK_MAX_TEXT * 2) /* longer than any merge line */
            return 0;
        if (tok_reserve((void **)&w->pair, &w->paircap, size + 1, 1) < 0)
            return TOK_ERR_NOMEM;
        memcpy(w->pair, w->buf + l->off, l->n);
        w->pair[l->n] = ' ';
        memcpy(w->pair + l->n + 1, w->buf + r->off, r->n);
        rank = tok_map_get(&t->merges, w->pair, size + 1);
        if (rank < 0)
            return 0;
        b.key = rank;
    }
    b.left = left;
    b.right = right;
    b.size = (uint32_t)size;
    return tok_heap_push(w, b);
}

/* Split w->buf[0..len) into UTF-8 characters and merge greedily: the best
 * queued pair first (highest SPM score / lowest BPE rank; ties leftmost),
 * as llama.cpp does. Returns the symbol count or a negative error. */
int tok_merge(const tok_t *t, tok_work_t *w, size_t len)
{
    size_t off = 0;
    int n = 0;

    if (tok_reserve((void **)&w->sym, &w->symcap, len, sizeof *w->sym) < 0)
        return TOK_ERR_NOMEM;
    while (off < len) {
        size_t cl = tok_utf8_len((unsigned char)w->buf[off]);
        if (cl > len - off)
            cl = len - off;
        w->sym[n] = (tok_sym_t){.prev = n - 1,
                                .next = off + cl == len ? -1 : n + 1,
                                .off = (uint32_t)off,
                                .n = (uint32_t)cl};
        off += cl;
        n++;
    }
    w->nheap = 0;
    for (int i = 1; i < n; i++)
        if (tok_try_bigram(t, w, i - 1, i) < 0)
            return TOK_ERR_NOMEM;
    while (w->nheap) {
        tok_bigram_t b = tok_heap_pop(w);
        tok_sym_t *l = &w->sym[b.left], *r = &w->sym[b.right];

        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: one side was merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = b.left;
        if (tok_try_bigram(t, w, l->prev, b.left) < 0 || tok_try_bigram(t, w, b.left, l->next) < 0)
            return TOK_ERR_NOMEM;
    }
    return n;
}

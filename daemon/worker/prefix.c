/* prefix: one model's prefix cache: finished sequences' KV caches kept under their tokens and found again by the longest prefix a new prompt shares with one (block hashes chained over an isolation seed), least recently used dropped first. */
#include "prefix.h"

#include <stdlib.h>
#include <string.h>

struct pfx_entry {
    uint64_t seed;
    int32_t *toks; /* (n) the tokens whose keys and values kv holds at positions 0.. */
    uint32_t n;
    uint64_t *hash;                /* (n / PFX_BLOCK) chained block hashes */
    kv_seq_t *kv;                  /* owned */
    struct pfx_entry *prev, *next; /* least recently used first */
};

struct pfx {
    pfx_entry_t *old, *young; /* the LRU list */
    uint32_t n, max;
    pfx_free_fn free_kv;
    void *ctx;
};

/* ------------------------------------------------------------------ hashing */

/* FNV-1a over bytes, then a 64-bit finalizer (splitmix64) so chained values spread. */
static uint64_t mix(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t pfx_seed(const char *model, const char *tenant, const char *salt)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, model ? model : "", strlen(model ? model : "") + 1);
    /* a salt replaces the key: whoever names the same salt shares */
    const char *who = salt ? "salt" : tenant ? "key" : "none";
    const char *what = salt ? salt : tenant ? tenant : "";
    h = fnv(h, who, strlen(who) + 1);
    h = fnv(h, what, strlen(what) + 1);
    return mix(h);
}

uint64_t pfx_block_hash(uint64_t prev, const int32_t *toks)
{
    return mix(fnv(prev ^ 0x9e3779b97f4a7c15ull, toks, PFX_BLOCK * sizeof *toks));
}

uint32_t pfx_common(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* ------------------------------------------------------------------ the LRU list */

static void lru_unlink(pfx_t *p, pfx_entry_t *e)
{
    *(e->prev ? &e->prev->next : &p->old) = e->next;
    *(e->next ? &e->next->prev : &p->young) = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(pfx_t *p, pfx_entry_t *e)
{
    e->prev = p->young;
    e->next = NULL;
    *(p->young ? &p->young->next : &p->old) = e;
    p->young = e;
}

/* Unlinks e and frees it; its KV cache is not touched. */
static void entry_free(pfx_t *p, pfx_entry_t *e)
{
    lru_unlink(p, e);
    p->n--;
    free(e->toks);
    free(e->hash);
    free(e);
}

/* Drops e: free_kv on its KV cache, then e itself. */
static void entry_drop(pfx_t *p, pfx_entry_t *e)
{
    kv_seq_t *kv = e->kv;
    entry_free(p, e);
    if (p->free_kv)
        p->free_kv(p->ctx, kv);
}

/* ------------------------------------------------------------------ the cache */

pfx_t *pfx_new(uint32_t max_entries, pfx_free_fn free_kv, void *ctx)
{
    pfx_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->max = max_entries ? max_entries : 1;
    p->free_kv = free_kv;
    p->ctx = ctx;
    return p;
}

void pfx_free(pfx_t *p)
{
    if (!p)
        return;
    while (p->old)
        entry_drop(p, p->old);
    free(p);
}

void pfx_set_max(pfx_t *p, uint32_t max_entries)
{
    p->max = max_entries ? max_entries : 1;
    while (p->n > p->max)
        entry_drop(p, p->old);
}

/* Whole blocks e shares with the chain hash[0, nb). */
static uint32_t blocks_shared(const pfx_entry_t *e, const uint64_t *hash, uint32_t nb)
{
    uint32_t eb = e->n / PFX_BLOCK, n = eb < nb ? eb : nb, i = 0;
    while (i < n && e->hash[i] == hash[i])
        i++;
    return i;
}

/* The chained hashes of toks' whole blocks into hash (n / PFX_BLOCK of them). */
static void chain(uint64_t seed, const int32_t *toks, uint32_t n, uint64_t *hash)
{
    uint64_t h = seed;
    for (uint32_t b = 0; b < n / PFX_BLOCK; b++)
        hash[b] = h = pfx_block_hash(h, toks + (size_t)b * PFX_BLOCK);
}

uint32_t pfx_lookup(const pfx_t *p, uint64_t seed, const int32_t *toks, uint32_t n, uint32_t limit,
                    pfx_entry_t **out)
{
    *out = NULL;
    uint32_t nb = n / PFX_BLOCK, best = 0;
    if (!p || nb == 0 || limit < PFX_BLOCK)
        return 0;
    uint64_t *hash = malloc(nb * sizeof *hash);
    if (!hash)
        return 0;
    chain(seed, toks, n, hash);
    for (pfx_entry_t *e = p->young; e; e = e->prev) {
        if (e->seed != seed || blocks_shared(e, hash, nb) == 0)
            continue;
        /* the hashes found a candidate: the tokens decide, beyond the last whole block too */
        uint32_t c = pfx_common(e->toks, e->n, toks, n);
        c = c < limit ? c : limit;
        if (c >= PFX_BLOCK && c > best) {
            best = c;
            *out = (pfx_entry_t *)e;
        }
    }
    free(hash);
    return best;
}

kv_seq_t *pfx_entry_kv(const pfx_entry_t *e)
{
    return e->kv;
}

uint32_t pfx_entry_len(const pfx_entry_t *e)
{
    return e->n;
}

void pfx_touch(pfx_t *p, pfx_entry_t *e)
{
    lru_unlink(p, e);
    lru_push(p, e);
}

kv_seq_t *pfx_take(pfx_t *p, pfx_entry_t *e)
{
    kv_seq_t *kv = e->kv;
    entry_free(p, e);
    return kv;
}

pfx_entry_t *pfx_insert(pfx_t *p, uint64_t seed, const int32_t *toks, uint32_t n, kv_seq_t *kv)
{
    if (!p || n < PFX_BLOCK)
        return NULL;
    for (pfx_entry_t *e = p->old, *nx; e; e = nx) {
        nx = e->next;
        if (e->seed != seed)
            continue;
        uint32_t c = pfx_common(e->toks, e->n, toks, n);
        if (c == n) { /* it holds all of this one already */
            pfx_touch(p, e);
            return NULL;
        }
        if (c == e->n) /* this one extends it */
            entry_drop(p, e);
    }
    pfx_entry_t *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->toks = malloc((size_t)n * sizeof *toks);
    e->hash = malloc((n / PFX_BLOCK) * sizeof *e->hash);
    if (!e->toks || !e->hash) {
        free(e->toks);
        free(e->hash);
        free(e);
        return NULL;
    }
    memcpy(e->toks, toks, (size_t)n * sizeof *toks);
    chain(seed, toks, n, e->hash);
    e->seed = seed;
    e->n = n;
    e->kv = kv;
    while (p->n >= p->max)
        entry_drop(p, p->old);
    lru_push(p, e);
    p->n++;
    return e;
}

int pfx_forget(pfx_t *p, const kv_seq_t *kv)
{
    for (pfx_entry_t *e = p ? p->old : NULL; e; e = e->next)
        if (e->kv == kv) {
            entry_free(p, e);
            return 1;
        }
    return 0;
}

pfx_entry_t *pfx_find_kv(const pfx_t *p, const kv_seq_t *kv)
{
    for (pfx_entry_t *e = p ? p->old : NULL; e; e = e->next)
        if (e->kv == kv)
            return e;
    return NULL;
}

void pfx_entry_set_kv(pfx_entry_t *e, kv_seq_t *kv)
{
    e->kv = kv;
}

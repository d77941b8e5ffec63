/* prefix: one model's prefix cache: finished sequences' KV caches kept under their tokens and found again by the longest prefix a new prompt shares with one (block hashes chained over an isolation seed), least recently used dropped first. */
#ifndef PREFIX_H
#define PREFIX_H

#include <stdint.h>

#include "engine/kv.h"

/*
 * An entry is a KV cache whose positions [0, n) hold the keys and values of
 * its n tokens. Each whole block of PFX_BLOCK tokens is named by a hash of
 * the tokens and of the hash before it, the first one chained onto a seed
 * that names the model and who may share it (pfx_seed): two prompts find
 * each other only under the same seed, and a lookup compares block hashes
 * first, then the tokens themselves (a hash collision never reuses the
 * wrong keys). The cache owns its entries' KV caches and frees them through
 * the caller's free_kv; it never touches device memory itself.
 */

#define PFX_BLOCK 16u /* tokens per hashed block: a hit reuses at least one */

typedef struct pfx pfx_t;
typedef struct pfx_entry pfx_entry_t;

/* Frees the KV cache of an entry the cache drops (ctx: pfx_new's). */
typedef void (*pfx_free_fn)(void *ctx, kv_seq_t *kv);

/* A cache of at most max_entries entries (at least 1). NULL when out of memory. */
pfx_t *pfx_new(uint32_t max_entries, pfx_free_fn free_kv, void *ctx);
/* Drops every entry (free_kv each) and frees p; accepts NULL. */
void pfx_free(pfx_t *p);
/* A lower bound drops the least recently used entries beyond it now. */
void pfx_set_max(pfx_t *p, uint32_t max_entries);
/* The seed of a request's hash chain: the model, and the cache salt if the request names one,
 * else its API key's name (NULL: no key; every such request shares). Pure. */
uint64_t pfx_seed(const char *model, const char *tenant, const char *salt);
/* The hash of the block of PFX_BLOCK tokens after the one hashed prev (the seed for the first). */
uint64_t pfx_block_hash(uint64_t prev, const int32_t *toks);
/* How many tokens a and b share from their start. */
uint32_t pfx_common(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb);

/* The entry under seed sharing the longest prefix with toks[0, n): *out and the tokens shared,
 * at most limit; 0 and *out NULL when none shares a whole block. */
uint32_t pfx_lookup(const pfx_t *p, uint64_t seed, const int32_t *toks, uint32_t n, uint32_t limit,
                    pfx_entry_t **out);
kv_seq_t *pfx_entry_kv(const pfx_entry_t *e);
uint32_t pfx_entry_len(const pfx_entry_t *e); /* tokens it holds */
/* e was used: the last to be dropped. */
void pfx_touch(pfx_t *p, pfx_entry_t *e);
/* Takes e out of the cache: its KV cache is the caller's from now on (not freed). */
kv_seq_t *pfx_take(pfx_t *p, pfx_entry_t *e);
/* Keeps kv, whose positions [0, n) hold toks[0, n) (copied), under seed. Entries whose tokens
 * it extends are dropped (free_kv); beyond max_entries the least recently used is. NULL when it
 * is not kept (n under one block, an entry under seed already holds all of it, out of memory):
 * kv then stays the caller's. */
pfx_entry_t *pfx_insert(pfx_t *p, uint64_t seed, const int32_t *toks, uint32_t n, kv_seq_t *kv);
/* Forgets the entry holding kv without freeing kv (its memory was reclaimed); 1 if found. */
int pfx_forget(pfx_t *p, const kv_seq_t *kv);
/* The entry holding kv, or NULL. */
pfx_entry_t *pfx_find_kv(const pfx_t *p, const kv_seq_t *kv);
/* The entry's KV now lives in kv (a copy elsewhere: host RAM); the old one is the caller's. */
void pfx_entry_set_kv(pfx_entry_t *e, kv_seq_t *kv);

#endif

/* test_prefix: the prefix cache module (daemon/worker/prefix.c): longest-prefix lookups under a seed, token checks beyond the hashes, LRU bounds, entries superseded, taken and forgotten. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "worker/prefix.h"

/* Each entry's "KV cache" is a tagged heap cell: the free callback counts and frees them. */
static int n_freed;

static void free_kv(void *ctx, kv_seq_t *kv)
{
    (void)ctx;
    n_freed++;
    free(kv);
}

static kv_seq_t *kv_new(void)
{
    return calloc(1, sizeof(kv_seq_t));
}

static void seq(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

static void reset(void)
{
    n_freed = 0;
}

Test(prefix, a_lookup_finds_the_entry_sharing_the_longest_prefix, .init = reset)
{
    pfx_t *p = pfx_new(8, free_kv, NULL);
    uint64_t s = pfx_seed("m", NULL, NULL);
    int32_t a[64], b[64], q[64];
    seq(a, 64, 100);
    seq(b, 64, 100);
    b[20] = 7; /* b shares 20 tokens with a */
    kv_seq_t *ka = kv_new(), *kb = kv_new();
    cr_assert(pfx_insert(p, s, a, 40, ka));
    cr_assert(pfx_insert(p, s, b, 64, kb));
    seq(q, 64, 100);
    q[50] = 9; /* q shares 40 with a, 20 with b */
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, s, q, 64, 63, &e), 40);
    cr_assert_eq(pfx_entry_kv(e), ka);
    /* the limit leaves a token to prefill */
    cr_assert_eq(pfx_lookup(p, s, q, 64, 30, &e), 30);
    pfx_free(p);
    cr_assert_eq(n_freed, 2);
}

Test(prefix, nothing_is_found_under_another_seed_or_without_a_whole_block, .init = reset)
{
    pfx_t *p = pfx_new(8, free_kv, NULL);
    int32_t a[48];
    seq(a, 48, 1);
    uint64_t alice = pfx_seed("m", "alice", NULL), bob = pfx_seed("m", "bob", NULL);
    cr_assert_neq(alice, bob);
    cr_assert_neq(pfx_seed("m", NULL, NULL), pfx_seed("n", NULL, NULL));
    /* a salt is shared across keys */
    cr_assert_eq(pfx_seed("m", "alice", "s"), pfx_seed("m", "bob", "s"));
    cr_assert_neq(pfx_seed("m", "alice", "s"), alice);
    cr_assert(pfx_insert(p, alice, a, 48, kv_new()));
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, bob, a, 48, 47, &e), 0);
    cr_assert_null(e);
    int32_t q[48];
    seq(q, 48, 1);
    q[10] = 0; /* diverges inside the first block */
    cr_assert_eq(pfx_lookup(p, alice, q, 48, 47, &e), 0);
    /* under one block is never kept */
    kv_seq_t *k = kv_new();
    cr_assert_null(pfx_insert(p, alice, a, PFX_BLOCK - 1, k));
    free(k);
    pfx_free(p);
}

Test(prefix, tokens_decide_where_hashes_agree_and_past_the_last_whole_block, .init = reset)
{
    pfx_t *p = pfx_new(8, free_kv, NULL);
    uint64_t s = pfx_seed("m", NULL, NULL);
    int32_t a[40], q[40];
    seq(a, 40, 5);
    seq(q, 40, 5);
    q[37] = 1; /* shares 37 tokens: two whole blocks and 5 more */
    cr_assert(pfx_insert(p, s, a, 40, kv_new()));
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, s, q, 40, 39, &e), 37);
    pfx_free(p);
}

Test(prefix, the_least_recently_used_entry_goes_first, .init = reset)
{
    pfx_t *p = pfx_new(2, free_kv, NULL);
    uint64_t s = pfx_seed("m", NULL, NULL);
    int32_t a[32], b[32], c[32];
    seq(a, 32, 1000);
    seq(b, 32, 2000);
    seq(c, 32, 3000);
    pfx_entry_t *ea = pfx_insert(p, s, a, 32, kv_new());
    cr_assert(pfx_insert(p, s, b, 32, kv_new()));
    pfx_touch(p, ea); /* b is now the oldest */
    cr_assert(pfx_insert(p, s, c, 32, kv_new()));
    cr_assert_eq(n_freed, 1);
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, s, b, 32, 31, &e), 0);
    cr_assert_eq(pfx_lookup(p, s, a, 32, 31, &e), 31);
    pfx_set_max(p, 1); /* a was the oldest now */
    cr_assert_eq(n_freed, 2);
    cr_assert_eq(pfx_lookup(p, s, a, 32, 31, &e), 0);
    cr_assert_eq(pfx_lookup(p, s, c, 32, 31, &e), 31);
    pfx_free(p);
}

Test(prefix, a_longer_sequence_supersedes_the_entry_it_extends_and_a_covered_one_is_not_kept,
     .init = reset)
{
    pfx_t *p = pfx_new(8, free_kv, NULL);
    uint64_t s = pfx_seed("m", NULL, NULL);
    int32_t a[64];
    seq(a, 64, 1);
    cr_assert(pfx_insert(p, s, a, 32, kv_new()));
    cr_assert(pfx_insert(p, s, a, 64, kv_new())); /* the next turn: extends the first */
    cr_assert_eq(n_freed, 1);
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, s, a, 64, 63, &e), 63);
    cr_assert_eq(pfx_entry_len(e), 64);
    kv_seq_t *k = kv_new();
    cr_assert_null(pfx_insert(p, s, a, 48, k)); /* all of it is held already */
    free(k);
    pfx_free(p);
}

Test(prefix, a_taken_entry_is_the_callers_and_a_forgotten_one_is_not_freed, .init = reset)
{
    pfx_t *p = pfx_new(8, free_kv, NULL);
    uint64_t s = pfx_seed("m", NULL, NULL);
    int32_t a[32], b[32];
    seq(a, 32, 1);
    seq(b, 32, 500);
    kv_seq_t *ka = kv_new(), *kb = kv_new();
    pfx_entry_t *ea = pfx_insert(p, s, a, 32, ka);
    cr_assert(pfx_insert(p, s, b, 32, kb));
    cr_assert_eq(pfx_entry_len(ea), 32);
    cr_assert_eq(pfx_take(p, ea), ka);
    cr_assert_eq(pfx_forget(p, kb), 1);
    cr_assert_eq(pfx_forget(p, kb), 0);
    pfx_entry_t *e;
    cr_assert_eq(pfx_lookup(p, s, b, 32, 31, &e), 0);
    pfx_free(p);
    cr_assert_eq(n_freed, 0);
    free(ka);
    free(kb);
}

Test(prefix, common_counts_shared_leading_tokens)
{
    int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9};
    cr_assert_eq(pfx_common(a, 4, b, 3), 2);
    cr_assert_eq(pfx_common(a, 4, a, 2), 2);
    cr_assert_eq(pfx_common(a, 0, b, 3), 0);
}

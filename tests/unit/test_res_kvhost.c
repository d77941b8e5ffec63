/* Unit tests for the host-RAM tier of cached KV (worker/res_kvhost.c) on the sim backend: a cached
 * cache given up by the pool is copied to host RAM exactly, comes back through the copy queue,
 * keeps within its budget least recently used first (the owner told), and a failed copy back
 * says so. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/util.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "testutil.h"

#define PAGE (64u << 10)

typedef struct kfx {
    backend_t *be;
    store_t *store;
    res_t *res;
    store_model_t *sm;
    res_model_t *rm;
} kfx_t;

static void kfx_init(kfx_t *f)
{
    char err[256], path[256];
    be_params_t p = {.kind = BE_KIND_SIM, .memory = 64 * PAGE, .page_size = PAGE, .threads = 1};
    memset(f, 0, sizeof *f);
    f->be = be_open(&p, err, sizeof err);
    cr_assert_not_null(f->be, "%s", err);
    f->store = store_new(f->be, 0);
    f->res = res_new(f->be, err, sizeof err);
    cr_assert_not_null(f->res, "%s", err);
    tu_mkmodel(path, sizeof path, "--type f32 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128");
    cr_assert_eq(store_load(f->store, "m", path, &f->sm, err, sizeof err), 0, "%s", err);
    unlink(path);
    res_cfg_t cfg = {0};
    cr_assert_eq(res_add(f->res, f->sm, &cfg, &f->rm, err, sizeof err), 0, "%s", err);
}

static void kfx_fini(kfx_t *f)
{
    cr_assert_eq(res_remove(f->res, f->rm), 0);
    store_unload(f->store, f->sm);
    res_free(f->res);
    store_free(f->store);
    be_close(f->be);
}

/* A device cache of n positions filled with a pattern of seed (k and v differ). */
static kv_seq_t *filled(kfx_t *f, uint32_t n, int seed)
{
    char err[256];
    kv_seq_t *kv;
    cr_assert_eq(res_kv_new(f->res, f->rm, 64, &kv, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f->res, kv, n, err, sizeof err), 0, "%s", err);
    size_t half = (size_t)n * kv->n_layer * kv->kv_dim * kv_type_size(kv->type);
    for (size_t i = 0; i < half; i++) {
        ((uint8_t *)kv->k)[i] = (uint8_t)(i * 7 + seed);
        ((uint8_t *)kv->v)[i] = (uint8_t)(i * 13 + seed + 1);
    }
    kv->n_past = n;
    return kv;
}

static int dropped;
static kv_seq_t *dropped_kv;
static void on_drop(void *ctx, kv_seq_t *kv)
{
    (void)ctx;
    dropped++;
    dropped_kv = kv;
}

static void stats_of(kfx_t *f, stats_res_t *st)
{
    res_model_stats(f->res, f->rm, st);
}

Test(res_kvhost, a_demoted_cache_comes_back_bit_for_bit_through_the_copy_queue)
{
    kfx_t f;
    kfx_init(&f);
    kv_seq_t *dev = filled(&f, 40, 3), *host = NULL;
    size_t half = (size_t)40 * dev->n_layer * dev->kv_dim * kv_type_size(dev->type);
    res_kv_host_budget(f.res, 1 << 20);
    cr_assert_eq(res_kv_demote(f.res, dev, on_drop, NULL, &host), RES_OK);
    cr_assert(res_kv_is_host(host) && !res_kv_is_host(dev));
    cr_assert_eq(memcmp(host->k, dev->k, half), 0);
    cr_assert_eq(memcmp(host->v, dev->v, half), 0);
    cr_assert_eq(res_kv_host_used(f.res), 2 * half);
    stats_res_t st;
    stats_of(&f, &st);
    cr_assert_eq(st.total_kv_demotions, 1);
    cr_assert_eq(st.curr_kv_host_bytes, 2 * half);
    cr_assert_eq(st.curr_kv_host, 1);
    res_kv_free(f.res, dev);

    char err[256];
    kv_seq_t *dst;
    cr_assert_eq(res_kv_new(f.res, f.rm, 64, &dst, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, dst, 41, err, sizeof err), 0, "%s", err);
    res_restore_t ev;
    cr_assert_eq(res_kv_restore_start(f.res, dst, host, 32, &ev), RES_OK);
    int rc;
    double t0 = util_now_s();
    while ((rc = res_kv_restore_poll(f.res, dst, 32, &ev)) == 0 && util_now_s() - t0 < 10)
        util_sleep_s(0.001);
    cr_assert_eq(rc, 1);
    cr_assert_eq(dst->n_past, 32);
    size_t h32 = half / 40 * 32;
    cr_assert_eq(memcmp(dst->k, host->k, h32), 0);
    cr_assert_eq(memcmp(dst->v, host->v, h32), 0);
    stats_of(&f, &st);
    cr_assert_eq(st.total_kv_restores, 1);
    cr_assert_eq(st.total_kv_restore_bytes, 2 * h32);
    res_kv_free(f.res, dst);
    res_kv_free(f.res, host); /* the owner drops it: freed, no callback */
    cr_assert_eq(res_kv_host_used(f.res), 0);
    cr_assert_eq(dropped, 0);
    kfx_fini(&f);
}

Test(res_kvhost, the_budget_drops_the_least_recently_used_copy_and_tells_its_owner)
{
    kfx_t f;
    kfx_init(&f);
    kv_seq_t *a = filled(&f, 16, 1), *b = filled(&f, 16, 2), *c = filled(&f, 16, 3);
    size_t one = 2 * (size_t)16 * a->n_layer * a->kv_dim * kv_type_size(a->type);
    kv_seq_t *ha, *hb, *hc;
    res_kv_host_budget(f.res, 2 * one);
    dropped = 0;
    cr_assert_eq(res_kv_demote(f.res, a, on_drop, NULL, &ha), RES_OK);
    cr_assert_eq(res_kv_demote(f.res, b, on_drop, NULL, &hb), RES_OK);
    res_kv_touch(f.res, ha); /* a used: b is now the oldest */
    cr_assert_eq(res_kv_demote(f.res, c, on_drop, NULL, &hc), RES_OK);
    cr_assert_eq(dropped, 1);
    cr_assert_eq(dropped_kv, hb);
    cr_assert_eq(res_kv_host_used(f.res), 2 * one);
    /* a copy larger than the whole budget is refused, nothing dropped for it */
    res_kv_host_budget(f.res, one - 1); /* drops down to nothing that fits: both go */
    cr_assert_eq(dropped, 3);
    cr_assert_eq(res_kv_host_used(f.res), 0);
    kv_seq_t *h;
    cr_assert_eq(res_kv_demote(f.res, a, on_drop, NULL, &h), RES_ERR_NOSPACE);
    cr_assert_null(h);
    stats_res_t st;
    stats_of(&f, &st);
    cr_assert_eq(st.total_kv_host_drops, 3);
    res_kv_free(f.res, a);
    res_kv_free(f.res, b);
    res_kv_free(f.res, c);
    kfx_fini(&f);
}

Test(res_kvhost, a_failed_copy_back_is_reported_and_counted)
{
    kfx_t f;
    kfx_init(&f);
    kv_seq_t *dev = filled(&f, 20, 5), *host, *dst;
    char err[256];
    res_kv_host_budget(f.res, 1 << 20);
    cr_assert_eq(res_kv_demote(f.res, dev, on_drop, NULL, &host), RES_OK);
    cr_assert_eq(res_kv_new(f.res, f.rm, 64, &dst, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, dst, 21, err, sizeof err), 0, "%s", err);
    be_fault_t fault = {BE_FAULT_COPY_FAIL, 1, 0};
    cr_assert_eq(f.be->inject(f.be->ctx, &fault), 0);
    res_restore_t ev;
    cr_assert_eq(res_kv_restore_start(f.res, dst, host, 20, &ev), RES_OK);
    int rc;
    double t0 = util_now_s();
    while ((rc = res_kv_restore_poll(f.res, dst, 20, &ev)) == 0 && util_now_s() - t0 < 10)
        util_sleep_s(0.001);
    cr_assert_eq(rc, -1);
    cr_assert_eq(dst->n_past, 0);
    stats_res_t st;
    stats_of(&f, &st);
    cr_assert_eq(st.total_kv_restore_failures, 1);
    cr_assert_eq(st.total_kv_restores, 0);
    /* shapes that do not match are refused before anything is queued */
    kv_seq_t *small;
    cr_assert_eq(res_kv_new(f.res, f.rm, 8, &small, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_restore_start(f.res, small, host, 20, &ev), RES_ERR_DEVICE);
    cr_assert_null(ev.ev[0]);
    res_kv_free(f.res, small);
    res_kv_free(f.res, dst);
    res_kv_free(f.res, dev);
    kfx_fini(&f); /* res_remove drops the model's host copies (its owner told) */
    cr_assert_eq(dropped_kv, host);
}

Test(res_kvhost, a_copy_dropped_while_a_restore_reads_it_lives_until_the_restore_lands)
{
    kfx_t f;
    kfx_init(&f);
    kv_seq_t *dev = filled(&f, 24, 9), *host, *dst;
    char err[256];
    res_kv_host_budget(f.res, 1 << 20);
    cr_assert_eq(res_kv_demote(f.res, dev, on_drop, NULL, &host), RES_OK);
    size_t half = (size_t)24 * dev->n_layer * dev->kv_dim * kv_type_size(dev->type);
    cr_assert_eq(res_kv_new(f.res, f.rm, 64, &dst, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res_kv_ensure(f.res, dst, 25, err, sizeof err), 0, "%s", err);
    res_restore_t rs;
    cr_assert_eq(res_kv_restore_start(f.res, dst, host, 24, &rs), RES_OK);
    /* the budget cannot drop it while it is read; its owner's drop only marks it */
    dropped = 0;
    res_kv_host_budget(f.res, 0);
    cr_assert_eq(dropped, 0);
    cr_assert_eq(res_kv_host_used(f.res), 2 * half);
    res_kv_free(f.res, host);
    int rc;
    double t0 = util_now_s();
    while ((rc = res_kv_restore_poll(f.res, dst, 24, &rs)) == 0 && util_now_s() - t0 < 10)
        util_sleep_s(0.001);
    cr_assert_eq(rc, 1);
    cr_assert_eq(memcmp(dst->k, dev->k, half), 0);
    cr_assert_eq(memcmp(dst->v, dev->v, half), 0);
    cr_assert_eq(res_kv_host_used(f.res), 0, "freed once the restore landed");
    res_kv_free(f.res, dst);
    res_kv_free(f.res, dev);
    kfx_fini(&f);
}

/* test_res_att: attached units (a LoRA adapter's pairs as a residency unit of its base) on the sim backend: paged in as one copy into a range of their own, counted in the pool and the model's quota, evicted least recently used first when idle and never while held, and with their model when it is paged out whole. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "testutil.h"

#define PAGE (16u << 10)
#define POOL_PAGES 64
#define ARGS "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --seed 3"

typedef struct fixture {
    tu_res_t r;
    uint8_t *img; /* POOL_PAGES pages of a pattern: the units' host images */
} fixture_t;

static void fx_open(fixture_t *f, size_t gpu_quota)
{
    tu_res_open(&f->r, ARGS, "b", POOL_PAGES, PAGE, gpu_quota);
    f->img = malloc((size_t)POOL_PAGES * PAGE);
    cr_assert_not_null(f->img);
    for (size_t i = 0; i < (size_t)POOL_PAGES * PAGE; i++)
        f->img[i] = (uint8_t)(i * 7 + i / 251);
}

static void fx_close(fixture_t *f)
{
    tu_res_close(&f->r);
    free(f->img);
}

/* Maps a and waits (up to 5 s) for its copy to land. */
static void map_wait(fixture_t *f, res_att_t *a)
{
    char err[256] = "";
    cr_assert_eq(res_att_map(f->r.res, a, err, sizeof err), RES_OK, "%s", err);
    for (int i = 0; i < 5000 && res_att_state(f->r.res, a) != RES_SEG_RESIDENT; i++)
        usleep(1000);
    cr_assert_eq(res_att_state(f->r.res, a), RES_SEG_RESIDENT);
}

static int resident(fixture_t *f, res_att_t *a)
{
    uint64_t pi, bi, ev;
    int r;
    res_att_stats(f->r.res, a, &pi, &bi, &ev, &r);
    return r;
}

Test(res_att, a_unit_pages_in_as_one_copy_into_its_own_range_counted_in_the_pool)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    res_att_t *a = NULL;
    size_t bytes = PAGE + PAGE / 4, before = tu_res_pool_free(f.r.res);
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, bytes, &a, err, sizeof err), RES_OK, "%s",
                 err);
    cr_assert_eq(res_att_state(f.r.res, a), RES_SEG_ABSENT);
    cr_assert_eq(res_att_span(f.r.res, a), 2 * PAGE);
    map_wait(&f, a);
    cr_assert_eq(memcmp(res_att_addr(a), f.img, bytes), 0, "the device copy differs");
    cr_assert_eq(tu_res_pool_free(f.r.res), before - 2);
    cr_assert_eq(res_model_bytes(f.r.rm), 2 * PAGE);
    uint64_t pi, bi, ev;
    int r;
    res_att_stats(f.r.res, a, &pi, &bi, &ev, &r);
    cr_assert(pi == 1 && bi == bytes && ev == 0 && r == 1, "%lu %lu %lu %d", (unsigned long)pi,
              (unsigned long)bi, (unsigned long)ev, r);
    map_wait(&f, a); /* mapped already: no second copy */
    res_att_stats(f.r.res, a, &pi, &bi, &ev, &r);
    cr_assert_eq(pi, 1);
    cr_assert_eq(res_evict(f.r.res, f.r.rm, RES_CAUSE_ADMIN, 0), RES_OK); /* with its model */
    res_att_stats(f.r.res, a, &pi, &bi, &ev, &r);
    cr_assert(ev == 1 && r == 0 && tu_res_pool_free(f.r.res) == before &&
              res_model_bytes(f.r.rm) == 0);
    res_att_remove(f.r.res, a);
    fx_close(&f);
}

Test(res_att, idle_units_go_least_recently_used_first_and_a_held_one_never)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    size_t n = tu_res_pool_free(f.r.res);
    res_att_t **u = calloc(n + 1, sizeof *u);
    cr_assert_not_null(u);
    for (size_t i = 0; i <= n; i++)
        cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img + i * 64, PAGE, &u[i], err, sizeof err),
                     RES_OK, "%s", err);
    for (size_t i = 0; i < n; i++) /* the pool full of units, u[0] the oldest */
        map_wait(&f, u[i]);
    cr_assert_eq(tu_res_pool_free(f.r.res), 0);
    res_att_hold(u[0], 1); /* held: passed over */
    map_wait(&f, u[n]);
    cr_assert(resident(&f, u[0]) && !resident(&f, u[1]) && resident(&f, u[2]));
    map_wait(&f, u[2]); /* used again: now the newest of the old ones */
    map_wait(&f, u[1]);
    cr_assert(resident(&f, u[0]) && resident(&f, u[2]) && !resident(&f, u[3]));
    cr_assert_eq(memcmp(res_att_addr(u[1]), f.img + 64, PAGE), 0);
    free(u);
    fx_close(&f);
}

Test(res_att, paging_the_model_out_whole_takes_its_idle_units_and_leaves_a_held_one)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    res_att_t *a = NULL, *b = NULL;
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, PAGE, &a, err, sizeof err), RES_OK);
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, PAGE, &b, err, sizeof err), RES_OK);
    cr_assert_eq(res_prefetch(f.r.res, f.r.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    map_wait(&f, a);
    map_wait(&f, b);
    res_att_hold(b, 1);
    cr_assert_eq(res_evict(f.r.res, f.r.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    cr_assert(!resident(&f, a) && resident(&f, b));
    cr_assert_eq(res_model_bytes(f.r.rm), PAGE);
    res_att_hold(b, -1);
    cr_assert_eq(res_evict(f.r.res, f.r.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    cr_assert(!resident(&f, b) && res_model_bytes(f.r.rm) == 0);
    fx_close(&f);
}

Test(res_att, a_unit_beyond_its_models_gpu_quota_is_refused_and_units_count_in_the_quota)
{
    const size_t q = POOL_PAGES / 2 * PAGE;
    fixture_t f;
    fx_open(&f, q);
    char err[256] = "";
    res_att_t *big = NULL, *a = NULL, *b = NULL;
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, q + 1, &big, err, sizeof err), RES_ERR_QUOTA);
    cr_assert_null(big);
    cr_assert(strstr(err, "gpu_quota"), "%s", err);
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, q, &a, err, sizeof err), RES_OK);
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, PAGE, &b, err, sizeof err), RES_OK);
    map_wait(&f, a);
    res_att_hold(a, 1);
    cr_assert_eq(res_att_map(f.r.res, b, err, sizeof err), RES_ERR_NOSPACE); /* a holds the quota */
    res_att_hold(a, -1);
    map_wait(&f, b); /* a idle: it makes way within the quota */
    cr_assert(!resident(&f, a) && res_model_bytes(f.r.rm) == PAGE);
    fx_close(&f);
}

/* Waits (up to 5 s) until every segment of the model landed. */
static void model_wait(fixture_t *f)
{
    for (int i = 0; i < 5000 && !res_fully_resident(f->r.res, f->r.rm); i++)
        usleep(1000);
    cr_assert(res_fully_resident(f->r.res, f->r.rm));
}

/* The predictions an admission makes of a unit it needs: the pages its page-in maps while it is
 * absent (none mapped, or after its copy failed), and when its copy would land: nothing before
 * a copy was timed, else its bytes at the measured bandwidth, behind its model's weights that
 * are not on the device (their page-in goes first). */
Test(res_att, an_absent_units_pages_and_copy_behind_its_models_page_in_count_in_predictions)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    res_att_t *a = NULL;
    const size_t bytes = PAGE + PAGE / 4;
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, bytes, &a, err, sizeof err), RES_OK, "%s",
                 err);
    cr_assert_eq(res_att_missing(f.r.res, a), 2 * PAGE);
    cr_assert_eq(res_copy_bw(f.r.res), 0.0);
    cr_assert_eq(res_att_eta(f.r.res, a), 0.0, "a guess before any copy was timed");

    /* its model on the device: its own copy alone */
    cr_assert_eq(res_prefetch(f.r.res, f.r.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    model_wait(&f);
    double bw = res_copy_bw(f.r.res);
    cr_assert_gt(bw, 0.0, "no copy timed");
    double alone = res_att_eta(f.r.res, a);
    cr_assert_float_eq(alone, (double)bytes / bw, 1e-12 * alone);

    /* its model paged out: behind the model's whole image */
    cr_assert_eq(res_evict(f.r.res, f.r.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    size_t image = res_store_model(f.r.rm)->image_bytes;
    double behind = res_att_eta(f.r.res, a);
    cr_assert_float_eq(behind, (double)(image + bytes) / bw, 1e-12 * behind);
    cr_assert_gt(behind, alone);
    cr_assert_eq(res_att_missing(f.r.res, a), 2 * PAGE, "the model's page-out changed its pages");

    /* mapped: no pages to find; landed: nothing to wait for */
    cr_assert_eq(res_att_map(f.r.res, a, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_att_missing(f.r.res, a), 0);
    cr_assert_leq(res_att_eta(f.r.res, a), (double)bytes / bw * (1 + 1e-12), "in flight");
    map_wait(&f, a);
    cr_assert_eq(res_att_eta(f.r.res, a), 0.0);
    cr_assert_eq(res_att_missing(f.r.res, a), 0);

    /* a failed copy leaves it absent: its pages count again */
    cr_assert_eq(res_evict(f.r.res, f.r.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    be_fault_t fault = {.kind = BE_FAULT_COPY_FAIL, .count = 1};
    cr_assert_eq(f.r.be->inject(f.r.be->ctx, &fault), 0);
    cr_assert_eq(res_att_map(f.r.res, a, err, sizeof err), RES_OK, "%s", err);
    for (int i = 0; i < 5000 && res_att_state(f.r.res, a) != RES_SEG_ABSENT; i++)
        usleep(1000);
    cr_assert_eq(res_att_missing(f.r.res, a), 2 * PAGE, "a failed copy's pages not counted again");
    fx_close(&f);
}

/* The pages a page-in may take without evicting a model with work (res_spare_pages) count the
 * idle units that go before any weights (of a model without weights) or with their model's
 * (an idle one nobody wants), never a held one; a model's own are not room for its page-in. */
Test(res_att, idle_units_are_spare_where_they_go_before_or_with_weights_but_not_for_their_own_model)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    store_model_t *sm2 = NULL;
    res_model_t *c = NULL;
    res_cfg_t cfg = {0};
    cr_assert_eq(store_load(f.r.st, "c", f.r.path, &sm2, err, sizeof err), STORE_OK, "%s", err);
    cr_assert_eq(res_add(f.r.res, sm2, &cfg, &c, err, sizeof err), RES_OK, "%s", err);
    res_att_t *a = NULL;
    cr_assert_eq(res_att_add(f.r.res, f.r.rm, f.img, 2 * PAGE, &a, err, sizeof err), RES_OK);
    map_wait(&f, a);
    res_set_wanted(f.r.rm, 1);
    res_set_wanted(c, 1);
    size_t free0 = tu_res_pool_free(f.r.res), spare = res_spare_pages(f.r.res);
    cr_assert_eq(spare, free0 + 2, "an idle unit of a model without weights is not spare");
    res_att_hold(a, 1);
    cr_assert_eq(res_spare_pages(f.r.res), free0, "a held unit counted as spare");
    res_att_hold(a, -1);

    /* both cold: c's page-in may take a's pages, a's own model's may not */
    size_t missing = res_store_model(f.r.rm)->image_bytes / PAGE;
    cr_assert_gt(spare, missing + 2);
    size_t reserve = (spare - missing) * PAGE;
    cr_assert_eq(res_pagein_fits(f.r.res, c, spare, reserve), 1);
    cr_assert_eq(res_pagein_fits(f.r.res, f.r.rm, spare, reserve), -1,
                 "its own unit taken as room");
    cr_assert_eq(res_pagein_fits(f.r.res, f.r.rm, spare, reserve - 2 * PAGE), 1);

    /* its model holds weights and is wanted: the unit is not spare; unwanted, both are */
    cr_assert_eq(res_prefetch(f.r.res, f.r.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    model_wait(&f);
    size_t free1 = tu_res_pool_free(f.r.res), weights = res_weight_bytes(f.r.rm) / PAGE;
    cr_assert_eq(res_spare_pages(f.r.res), free1);
    res_set_wanted(f.r.rm, 0);
    cr_assert_eq(res_spare_pages(f.r.res), free1 + weights + 2);
    cr_assert_eq(res_remove(f.r.res, c), RES_OK);
    store_unload(f.r.st, sm2);
    fx_close(&f);
}

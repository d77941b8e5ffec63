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
    char path[256];
    backend_t *be;
    store_t *st;
    store_model_t *sm;
    res_t *res;
    res_model_t *rm;
    uint8_t *img; /* POOL_PAGES pages of a pattern: the units' host images */
} fixture_t;

static void fx_open(fixture_t *f, size_t gpu_quota)
{
    char err[512] = "";
    memset(f, 0, sizeof *f);
    tu_mkmodel(f->path, sizeof f->path, ARGS);
    be_params_t p = {
        .kind = BE_KIND_SIM, .memory = POOL_PAGES * PAGE, .page_size = PAGE, .threads = 1};
    f->be = be_open(&p, err, sizeof err);
    cr_assert_not_null(f->be, "%s", err);
    f->st = store_new(f->be, 0);
    cr_assert_eq(store_load(f->st, "b", f->path, &f->sm, err, sizeof err), STORE_OK, "%s", err);
    f->res = res_new(f->be, err, sizeof err);
    cr_assert_not_null(f->res, "%s", err);
    res_cfg_t cfg = {.gpu_quota = gpu_quota};
    cr_assert_eq(res_add(f->res, f->sm, &cfg, &f->rm, err, sizeof err), RES_OK, "%s", err);
    f->img = malloc((size_t)POOL_PAGES * PAGE);
    cr_assert_not_null(f->img);
    for (size_t i = 0; i < (size_t)POOL_PAGES * PAGE; i++)
        f->img[i] = (uint8_t)(i * 7 + i / 251);
}

static void fx_close(fixture_t *f)
{
    cr_assert_eq(res_remove(f->res, f->rm), RES_OK); /* frees the units left */
    res_free(f->res);
    store_unload(f->st, f->sm);
    store_free(f->st);
    be_close(f->be);
    free(f->img);
    unlink(f->path);
}

static size_t pool_free(const res_t *r)
{
    stats_pool_t ps;
    res_pool_stats(r, &ps);
    return ps.curr_pool_free;
}

/* Maps a and waits (up to 5 s) for its copy to land. */
static void map_wait(fixture_t *f, res_att_t *a)
{
    char err[256] = "";
    cr_assert_eq(res_att_map(f->res, a, err, sizeof err), RES_OK, "%s", err);
    for (int i = 0; i < 5000 && res_att_state(f->res, a) != RES_SEG_RESIDENT; i++)
        usleep(1000);
    cr_assert_eq(res_att_state(f->res, a), RES_SEG_RESIDENT);
}

static int resident(fixture_t *f, res_att_t *a)
{
    uint64_t pi, bi, ev;
    int r;
    res_att_stats(f->res, a, &pi, &bi, &ev, &r);
    return r;
}

Test(res_att, a_unit_pages_in_as_one_copy_into_its_own_range_counted_in_the_pool)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    res_att_t *a = NULL;
    size_t bytes = PAGE + PAGE / 4, before = pool_free(f.res);
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, bytes, &a, err, sizeof err), RES_OK, "%s", err);
    cr_assert_eq(res_att_state(f.res, a), RES_SEG_ABSENT);
    cr_assert_eq(res_att_span(f.res, a), 2 * PAGE);
    map_wait(&f, a);
    cr_assert_eq(memcmp(res_att_addr(a), f.img, bytes), 0, "the device copy differs");
    cr_assert_eq(pool_free(f.res), before - 2);
    cr_assert_eq(res_model_bytes(f.rm), 2 * PAGE);
    uint64_t pi, bi, ev;
    int r;
    res_att_stats(f.res, a, &pi, &bi, &ev, &r);
    cr_assert(pi == 1 && bi == bytes && ev == 0 && r == 1, "%lu %lu %lu %d", (unsigned long)pi,
              (unsigned long)bi, (unsigned long)ev, r);
    map_wait(&f, a); /* mapped already: no second copy */
    res_att_stats(f.res, a, &pi, &bi, &ev, &r);
    cr_assert_eq(pi, 1);
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 0), RES_OK); /* with its model */
    res_att_stats(f.res, a, &pi, &bi, &ev, &r);
    cr_assert(ev == 1 && r == 0 && pool_free(f.res) == before && res_model_bytes(f.rm) == 0);
    res_att_remove(f.res, a);
    fx_close(&f);
}

Test(res_att, idle_units_go_least_recently_used_first_and_a_held_one_never)
{
    fixture_t f;
    fx_open(&f, 0);
    char err[256] = "";
    size_t n = pool_free(f.res);
    res_att_t **u = calloc(n + 1, sizeof *u);
    cr_assert_not_null(u);
    for (size_t i = 0; i <= n; i++)
        cr_assert_eq(res_att_add(f.res, f.rm, f.img + i * 64, PAGE, &u[i], err, sizeof err), RES_OK,
                     "%s", err);
    for (size_t i = 0; i < n; i++) /* the pool full of units, u[0] the oldest */
        map_wait(&f, u[i]);
    cr_assert_eq(pool_free(f.res), 0);
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
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, PAGE, &a, err, sizeof err), RES_OK);
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, PAGE, &b, err, sizeof err), RES_OK);
    cr_assert_eq(res_prefetch(f.res, f.rm, RES_EVICT_NONE, err, sizeof err), RES_OK, "%s", err);
    map_wait(&f, a);
    map_wait(&f, b);
    res_att_hold(b, 1);
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    cr_assert(!resident(&f, a) && resident(&f, b));
    cr_assert_eq(res_model_bytes(f.rm), PAGE);
    res_att_hold(b, -1);
    cr_assert_eq(res_evict(f.res, f.rm, RES_CAUSE_ADMIN, 0), RES_OK);
    cr_assert(!resident(&f, b) && res_model_bytes(f.rm) == 0);
    fx_close(&f);
}

Test(res_att, a_unit_beyond_its_models_gpu_quota_is_refused_and_units_count_in_the_quota)
{
    const size_t q = POOL_PAGES / 2 * PAGE;
    fixture_t f;
    fx_open(&f, q);
    char err[256] = "";
    res_att_t *big = NULL, *a = NULL, *b = NULL;
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, q + 1, &big, err, sizeof err), RES_ERR_QUOTA);
    cr_assert_null(big);
    cr_assert(strstr(err, "gpu_quota"), "%s", err);
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, q, &a, err, sizeof err), RES_OK);
    cr_assert_eq(res_att_add(f.res, f.rm, f.img, PAGE, &b, err, sizeof err), RES_OK);
    map_wait(&f, a);
    res_att_hold(a, 1);
    cr_assert_eq(res_att_map(f.res, b, err, sizeof err), RES_ERR_NOSPACE); /* a holds the quota */
    res_att_hold(a, -1);
    map_wait(&f, b); /* a idle: it makes way within the quota */
    cr_assert(!resident(&f, a) && res_model_bytes(f.rm) == PAGE);
    fx_close(&f);
}

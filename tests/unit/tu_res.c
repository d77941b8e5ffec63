/* tu_res: a generated model in a store and a residency manager on the sim backend, shared by the
 * paging-unit tests (test_res_unit for experts, test_res_att for adapters). */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

void tu_res_open(tu_res_t *f, const char *args, const char *name, size_t pool_pages, size_t page,
                 size_t gpu_quota)
{
    char err[512] = "";
    memset(f, 0, sizeof *f);
    tu_mkmodel(f->path, sizeof f->path, args);
    be_params_t p = {
        .kind = BE_KIND_SIM, .memory = pool_pages * page, .page_size = page, .threads = 1};
    f->be = be_open(&p, err, sizeof err);
    cr_assert_not_null(f->be, "%s", err);
    f->st = store_new(f->be, 0);
    cr_assert_eq(store_load(f->st, name, f->path, &f->sm, err, sizeof err), STORE_OK, "%s", err);
    f->res = res_new(f->be, err, sizeof err);
    cr_assert_not_null(f->res, "%s", err);
    res_cfg_t cfg = {.gpu_quota = gpu_quota};
    cr_assert_eq(res_add(f->res, f->sm, &cfg, &f->rm, err, sizeof err), RES_OK, "%s", err);
}

void tu_res_close(tu_res_t *f)
{
    cr_assert_eq(res_remove(f->res, f->rm), RES_OK);
    res_free(f->res);
    store_unload(f->st, f->sm);
    store_free(f->st);
    be_close(f->be);
    unlink(f->path);
}

size_t tu_res_pool_free(const res_t *r)
{
    stats_pool_t ps;
    res_pool_stats(r, &ps);
    return ps.curr_pool_free;
}

/* test_store: the host model store's throttled load (store_set_load_rate): its pace and its progress reports. */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "store.h"
#include "testutil.h"

typedef struct calls {
    int n;
    size_t last_done, total;
    int monotonic;
} calls_t;

static void on_progress(void *ctx, const char *name, size_t done, size_t total)
{
    calls_t *c = ctx;
    cr_assert_str_eq(name, "m");
    if (done < c->last_done)
        c->monotonic = 0;
    c->last_done = done;
    c->total = total;
    c->n++;
}

Test(store, a_throttled_load_takes_its_bytes_over_the_rate_and_reports_each_chunk, .timeout = 60)
{
    char path[256], err[512] = "";
    tu_mkmodel(path, sizeof path,
               "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300");
    be_params_t p = {
        .kind = BE_KIND_SIM, .memory = 64u << 20, .page_size = 64u << 10, .threads = 1};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);

    /* unthrottled: a model this small loads without progress reports */
    store_t *st = store_new(be, 0);
    calls_t c = {.monotonic = 1};
    store_set_progress(st, on_progress, &c);
    store_model_t *m;
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    cr_assert_eq(c.n, 0);
    size_t bytes = m->image_bytes;
    store_unload(st, m);

    /* throttled to a third of its image per second: the weights (the image less
     * its page padding) take copied / rate seconds, between 1 and 3 */
    double rate = (double)bytes / 3;
    store_set_load_rate(st, rate);
    double t0 = util_now_s();
    cr_assert_eq(store_load(st, "m", path, &m, err, sizeof err), STORE_OK, "%s", err);
    double took = util_now_s() - t0;
    double want = (double)c.last_done / rate;
    cr_assert_geq(want, 0.5, "%zu bytes copied", c.last_done);
    cr_assert_geq(took, 0.95 * want, "took %.2f s, want %.2f", took, want);
    cr_assert_lt(took, 30.0, "took %.2f s", took);
    cr_assert_gt(c.n, 3, "%d reports", c.n);
    cr_assert(c.monotonic);
    cr_assert_eq(c.total, m->image_bytes);
    cr_assert_leq(c.last_done, m->image_bytes);
    cr_log_info("throttled load of %zu bytes at %.0f B/s: %.2f s (%.2f s wanted), %d reports",
                c.last_done, rate, took, want, c.n);
    store_unload(st, m);
    store_free(st);
    be_close(be);
    unlink(path);
}

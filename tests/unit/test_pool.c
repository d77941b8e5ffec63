/* Unit tests for the thread pool. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "kernels/pool.h"

typedef struct acc {
    atomic_long sum;
    atomic_int calls;
    long n;
} acc_t;

static void add_range(void *p, int tid, int nth)
{
    acc_t *a = p;
    long lo, hi;
    pool_range(tid, nth, a->n, &lo, &hi);
    long s = 0;
    for (long i = lo; i < hi; i++)
        s += i;
    atomic_fetch_add(&a->sum, s);
    atomic_fetch_add(&a->calls, 1);
}

Test(pool, every_thread_runs_each_job_once_and_ranges_cover_everything)
{
    pool_t *p = pool_new(3);
    cr_assert_not_null(p);
    cr_assert_eq(pool_size(p), 3);
    for (int rep = 0; rep < 2000; rep++) {
        acc_t a = {.n = rep};
        pool_run(p, add_range, &a);
        cr_assert_eq(atomic_load(&a.calls), 3);
        cr_assert_eq(atomic_load(&a.sum), (long)rep * (rep - 1) / 2);
    }
    pool_free(p);
}

Test(pool, ranges_are_contiguous_and_balanced)
{
    long prev = 0;
    for (int t = 0; t < 7; t++) {
        long lo, hi;
        pool_range(t, 7, 100, &lo, &hi);
        cr_assert_eq(lo, prev);
        cr_assert(hi - lo == 14 || hi - lo == 15);
        prev = hi;
    }
    cr_assert_eq(prev, 100);
}

Test(pool, null_pool_runs_inline)
{
    acc_t a = {.n = 10};
    pool_run(NULL, add_range, &a);
    cr_assert_eq(atomic_load(&a.sum), 45);
    pool_free(NULL);
}

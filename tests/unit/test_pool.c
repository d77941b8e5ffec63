/* Unit tests for the thread pool. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "kernels/pool.h"

typedef struct acc {
    atomic_long sum;
    atomic_int calls;
    pool_chunks_t ch;
} acc_t;

static void add_range(void *p, int tid, int nth)
{
    acc_t *a = p;
    (void)tid;
    (void)nth;
    long lo, hi, s = 0;
    while (pool_chunk_next(&a->ch, &lo, &hi))
        for (long i = lo; i < hi; i++)
            s += i;
    atomic_fetch_add(&a->sum, s);
    atomic_fetch_add(&a->calls, 1);
}

Test(pool, every_thread_runs_each_job_once_and_chunks_cover_everything)
{
    pool_t *p = pool_new(3);
    cr_assert_not_null(p);
    cr_assert_eq(pool_size(p), 3);
    for (int rep = 0; rep < 2000; rep++) {
        acc_t a = {0};
        pool_chunks_init(&a.ch, rep, 1 + rep % 7);
        pool_run(p, add_range, &a);
        cr_assert_eq(atomic_load(&a.calls), 3);
        cr_assert_eq(atomic_load(&a.sum), (long)rep * (rep - 1) / 2);
    }
    pool_free(p);
}

Test(pool, chunks_are_contiguous_cover_everything_once_and_then_run_out)
{
    pool_chunks_t c;
    pool_chunks_init(&c, 100, 15);
    long prev = 0, lo, hi;
    for (int i = 0; i < 7; i++) {
        cr_assert(pool_chunk_next(&c, &lo, &hi));
        cr_assert_eq(lo, prev);
        cr_assert_eq(hi - lo, i < 6 ? 15 : 10);
        prev = hi;
    }
    cr_assert_eq(prev, 100);
    cr_assert_not(pool_chunk_next(&c, &lo, &hi));
    cr_assert_not(pool_chunk_next(&c, &lo, &hi));
    pool_chunks_init(&c, 5, 0); /* a chunk holds at least one item */
    cr_assert(pool_chunk_next(&c, &lo, &hi));
    cr_assert_eq(hi - lo, 1);
}

Test(pool, null_pool_runs_inline)
{
    acc_t a = {0};
    pool_chunks_init(&a.ch, 10, 3);
    pool_run(NULL, add_range, &a);
    cr_assert_eq(atomic_load(&a.sum), 45);
    pool_free(NULL);
}

/* pool: a fixed thread pool that runs one parallel job at a time (fork-join). */
#ifndef POOL_H
#define POOL_H

typedef struct pool pool_t;

/* fn runs once on every thread: tid in [0, nth), tid 0 is the caller. */
typedef void (*pool_fn)(void *ctx, int tid, int nth);

/* n_threads <= 0: one per online CPU. NULL on failure. */
pool_t *pool_new(int n_threads);
void pool_free(pool_t *p); /* accepts NULL; joins the workers */
int pool_size(const pool_t *p);
/* Run fn on all threads and wait for all of them. One caller at a time. */
void pool_run(pool_t *p, pool_fn fn, void *ctx);

/* Split n items into nth nearly equal ranges: [*lo, *hi) for thread tid. */
void pool_range(int tid, int nth, long n, long *lo, long *hi);

#endif

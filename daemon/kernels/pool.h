/* pool: a fixed thread pool that runs one parallel job at a time (fork-join). */
#ifndef POOL_H
#define POOL_H

#include <stdatomic.h>

typedef struct pool pool_t;

/* fn runs once on every thread: tid in [0, nth), tid 0 is the caller. */
typedef void (*pool_fn)(void *ctx, int tid, int nth);

/* n_threads <= 0: one per online CPU. NULL on failure. */
pool_t *pool_new(int n_threads);
void pool_free(pool_t *p); /* accepts NULL; joins the workers */
int pool_size(const pool_t *p);
/* Run fn on all threads and wait for all of them. One caller at a time. */
void pool_run(pool_t *p, pool_fn fn, void *ctx);

/* Items [0, n) handed out in chunks to the threads of a job as they come
 * free, so a thread the OS holds back leaves its share to the others:
 * pool_chunks_init before pool_run, then each thread calls pool_chunk_next
 * until it returns 0. */
typedef struct pool_chunks {
    atomic_long next; /* the next chunk's index */
    long n, chunk;    /* items in all, items a chunk (>= 1) */
} pool_chunks_t;
void pool_chunks_init(pool_chunks_t *c, long n, long chunk);
/* The next chunk [*lo, *hi); 0 when every chunk is taken. Thread-safe. */
int pool_chunk_next(pool_chunks_t *c, long *lo, long *hi);

#endif

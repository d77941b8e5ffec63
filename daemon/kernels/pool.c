/* pool: a fixed thread pool that runs one parallel job at a time (fork-join). */
#include "kernels/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Spin this many polls before sleeping on the condition variable: decode
 * steps issue hundreds of short jobs per token. */
#define POOL_SPIN 20000

struct pool {
    int n;              /* threads including the caller */
    pthread_t *threads; /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    atomic_uint gen;    /* bumped per job */
    atomic_int pending; /* workers still running the current job */
    atomic_int stop;
    pool_fn fn; /* current job; written before gen is bumped */
    void *ctx;
};

typedef struct worker_arg {
    pool_t *p;
    int tid;
} worker_arg_t;

static void *worker(void *argp)
{
    worker_arg_t a = *(worker_arg_t *)argp;
    free(argp);
    pool_t *p = a.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins < POOL_SPIN) {
            spins++;
            if ((spins & 255) == 0)
                sched_yield();
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        p->fn(p->ctx, a.tid, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

pool_t *pool_new(int n_threads)
{
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 256)
        n_threads = 256;
    pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads)
        goto fail;
    for (int i = 1; i < n_threads; i++) {
        worker_arg_t *a = malloc(sizeof *a);
        if (!a)
            goto fail;
        a->p = p;
        a->tid = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker, a) != 0) {
            free(a);
            goto fail;
        }
        p->n = i + 1;
    }
    return p;
fail:
    pool_free(p);
    return NULL;
}

void pool_free(pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i + 1 < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int pool_size(const pool_t *p)
{
    return p ? p->n : 1;
}

void pool_run(pool_t *p, pool_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && spins < POOL_SPIN) {
        spins++;
        if ((spins & 255) == 0)
            sched_yield();
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void pool_chunks_init(pool_chunks_t *c, long n, long chunk)
{
    atomic_init(&c->next, 0);
    c->n = n;
    c->chunk = chunk > 0 ? chunk : 1;
}

int pool_chunk_next(pool_chunks_t *c, long *lo, long *hi)
{
    long i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    if (i >= (c->n + c->chunk - 1) / c->chunk)
        return 0;
    *lo = i * c->chunk;
    *hi = *lo + c->chunk < c->n ? *lo + c->chunk : c->n;
    return 1;
}

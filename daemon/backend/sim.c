/* sim: the GPU stand-in: a memfd page pool of exactly device.memory bytes, mmap'ed ranges, a (throttled) copy thread, CPU kernels. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "kernels/cpu_ops.h"
#include "kernels/pool.h"
#include "base/util.h"

#define SIM_NO_PAGE UINT32_MAX
/* Copies are done in chunks so the throttle models a steady link. */
#define SIM_COPY_CHUNK (1u << 20)

struct be_event {
    atomic_int done; /* 1 once the copy has landed, -1 if it failed, 0 while queued */
    be_copy_times_t t;
};

typedef struct sim_copy {
    void *dst;
    const void *src;
    size_t bytes;
    be_event_t *ev;
    struct sim_copy *next;
} sim_copy_t;

typedef struct sim_range {
    char *base;
    size_t bytes;
    uint32_t *page; /* pool page behind each range page, SIM_NO_PAGE if unmapped */
    struct sim_range *next;
} sim_range_t;

typedef struct sim_ctx {
    cpuk_ctx_t kc; /* first: the kernels find their state here */
    pool_t *pool;
    int memfd;
    size_t page, n_pages;
    uint32_t *free_pages; /* stack of free pool pages */
    size_t n_free;
    sim_range_t *ranges;
    pthread_mutex_t map_mu; /* free list and ranges */

    double bandwidth; /* bytes/s, 0 = unthrottled */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu; /* copy queue and event completion */
    pthread_cond_t cv_work, cv_done;
    sim_copy_t *head, *tail;
    int stop;

    /* armed faults (be_fault_t), taken by the next operations of each kind */
    atomic_uint fail_copies, slow_copies, fail_maps;
    int map_short; /* BE_FAULT_MAP_SHORT armed (under map_mu): maps fail until an unmap */
    atomic_uint slow_ms;
} sim_ctx_t;
CPUK_CTX_CHECK(sim_ctx_t, kc);

/* Takes one unit of an armed fault counter; 1 if this operation is hit. */
static int take(atomic_uint *n)
{
    unsigned v = atomic_load(n);
    while (v > 0 && !atomic_compare_exchange_weak(n, &v, v - 1))
        ;
    return v > 0;
}

static void sleep_until(double t)
{
    util_sleep_s(t - util_now_s());
}

/* ------------------------------------------------------------------ copy thread */

static void *copy_thread(void *arg)
{
    sim_ctx_t *s = arg;
    pthread_setname_np(pthread_self(), "gsd-sim-copy");
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (!s->head && s->stop)
            break;
        sim_copy_t *c = s->head;
        s->head = c->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        double t0 = util_now_s();
        int failed = take(&s->fail_copies);
        if (take(&s->slow_copies))
            sleep_until(t0 + atomic_load(&s->slow_ms) / 1e3);
        /* unthrottled: one memcpy, so large copies get the streaming-store path */
        size_t chunk = s->bandwidth > 0 ? SIM_COPY_CHUNK : c->bytes;
        for (size_t off = 0; off < c->bytes && !failed; off += chunk) {
            size_t n = c->bytes - off < chunk ? c->bytes - off : chunk;
            memcpy((char *)c->dst + off, (const char *)c->src + off, n);
            if (s->bandwidth > 0)
                sleep_until(t0 + (double)(off + n) / s->bandwidth);
        }
        double t1 = util_now_s();

        pthread_mutex_lock(&s->mu);
        if (c->ev) {
            c->ev->t.start = t0;
            c->ev->t.end = t1;
            atomic_store(&c->ev->done, failed ? -1 : 1);
        }
        pthread_cond_broadcast(&s->cv_done);
        free(c);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int s_event_new(void *ctx, be_event_t **ev)
{
    (void)ctx;
    *ev = calloc(1, sizeof **ev);
    if (!*ev)
        return BE_ERR_NOMEM;
    atomic_store(&(*ev)->done, 1);
    return 0;
}

static void s_event_free(void *ctx, be_event_t *ev)
{
    sim_ctx_t *s = ctx;
    if (!ev)
        return;
    /* never free an event the copy thread will still write */
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&ev->done))
        pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    free(ev);
}

static int s_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev)
{
    sim_ctx_t *s = ctx;
    sim_copy_t *c = malloc(sizeof *c);
    if (!c)
        return BE_ERR_NOMEM;
    *c = (sim_copy_t){dst, src, bytes, ev, NULL};
    pthread_mutex_lock(&s->mu);
    if (ev) {
        atomic_store(&ev->done, 0);
        ev->t = (be_copy_times_t){util_now_s(), 0, 0};
    }
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int s_wait(void *ctx, be_event_t *ev)
{
    sim_ctx_t *s = ctx;
    if (!atomic_load(&ev->done)) {
        pthread_mutex_lock(&s->mu);
        while (!atomic_load(&ev->done))
            pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    return atomic_load(&ev->done) < 0 ? BE_ERR_DEVICE : 0;
}

static int s_event_done(void *ctx, be_event_t *ev)
{
    (void)ctx;
    int d = atomic_load(&ev->done);
    return d < 0 ? BE_ERR_DEVICE : d;
}

static int s_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    sim_ctx_t *s = ctx;
    if (atomic_load(&ev->done) != 1)
        return BE_ERR_ARG;
    pthread_mutex_lock(&s->mu);
    *t = ev->t;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ------------------------------------------------------------------ page pool */

static sim_range_t *find_range(sim_ctx_t *s, const void *base)
{
    for (sim_range_t *r = s->ranges; r; r = r->next)
        if (r->base == base)
            return r;
    return NULL;
}

static int s_reserve(void *ctx, size_t bytes, void **base)
{
    sim_ctx_t *s = ctx;
    if (bytes == 0 || bytes % s->page)
        return BE_ERR_ARG;
    sim_range_t *r = calloc(1, sizeof *r);
    if (!r)
        return BE_ERR_NOMEM;
    r->bytes = bytes;
    r->page = malloc(bytes / s->page * sizeof *r->page);
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!r->page || p == MAP_FAILED) {
        if (p != MAP_FAILED)
            munmap(p, bytes);
        free(r->page);
        free(r);
        return BE_ERR_NOMEM;
    }
    for (size_t i = 0; i < bytes / s->page; i++)
        r->page[i] = SIM_NO_PAGE;
    r->base = p;
    pthread_mutex_lock(&s->map_mu);
    r->next = s->ranges;
    s->ranges = r;
    pthread_mutex_unlock(&s->map_mu);
    *base = p;
    return 0;
}

/* Replace [p, p+len) with inaccessible anonymous memory. */
static int guard(void *p, size_t len)
{
    void *q =
        mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return q == MAP_FAILED ? BE_ERR_DEVICE : 0;
}

static int do_unmap(sim_ctx_t *s, sim_range_t *r, size_t first, size_t n)
{
    int rc = 0;
    /* push in descending order so later maps pop ascending, contiguous runs */
    for (size_t i = first + n; i-- > first;) {
        if (r->page[i] == SIM_NO_PAGE)
            continue;
        if (guard(r->base + i * s->page, s->page))
            rc = BE_ERR_DEVICE;
        s->free_pages[s->n_free++] = r->page[i];
        r->page[i] = SIM_NO_PAGE;
    }
    return rc;
}

static int s_map(void *ctx, void *base, size_t off, size_t bytes)
{
    sim_ctx_t *s = ctx;
    if (off % s->page || bytes % s->page)
        return BE_ERR_ARG;
    pthread_mutex_lock(&s->map_mu);
    sim_range_t *r = find_range(s, base);
    size_t first = off / s->page, n = bytes / s->page;
    int rc = 0;
    if (!r || off + bytes > r->bytes) {
        rc = BE_ERR_ARG;
        goto out;
    }
    for (size_t i = first; i < first + n; i++) {
        if (r->page[i] != SIM_NO_PAGE) {
            rc = BE_ERR_ARG; /* already mapped: a residency bug */
            goto out;
        }
    }
    if (n > s->n_free || s->map_short || take(&s->fail_maps)) {
        rc = BE_ERR_NOMEM;
        goto out;
    }
    /* any free pages will do: map each run of consecutive pool pages with
     * one mmap call. Not populated here: the first touch (the copy thread's
     * memcpy for weights, as a DMA would; the kernels for KV pages) faults
     * the pages in, so a page-in's cost lands on the copy engine, not on
     * the thread that maps */
    for (size_t i = 0; i < n;) {
        uint32_t p0 = s->free_pages[s->n_free - 1 - i];
        size_t run = 1;
        while (i + run < n && s->free_pages[s->n_free - 1 - i - run] == p0 + run)
            run++;
        void *want = r->base + (first + i) * s->page;
        void *got = mmap(want, run * s->page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                         s->memfd, (off_t)p0 * (off_t)s->page);
        if (got == MAP_FAILED) {
            for (size_t j = 0; j < i; j++) /* undo what this call mapped */
                r->page[first + j] = SIM_NO_PAGE;
            guard(r->base + first * s->page, i * s->page);
            rc = BE_ERR_DEVICE;
            goto out;
        }
        for (size_t j = 0; j < run; j++)
            r->page[first + i + j] = p0 + (uint32_t)j;
        i += run;
    }
    s->n_free -= n;
out:
    pthread_mutex_unlock(&s->map_mu);
    return rc;
}

static int s_unmap(void *ctx, void *base, size_t off, size_t bytes)
{
    sim_ctx_t *s = ctx;
    if (off % s->page || bytes % s->page)
        return BE_ERR_ARG;
    pthread_mutex_lock(&s->map_mu);
    sim_range_t *r = find_range(s, base);
    int rc = BE_ERR_ARG;
    if (r && off + bytes <= r->bytes) {
        size_t n_free = s->n_free;
        rc = do_unmap(s, r, off / s->page, bytes / s->page);
        if (s->n_free > n_free)
            s->map_short = 0; /* something was freed: the device gives again */
    }
    pthread_mutex_unlock(&s->map_mu);
    return rc;
}

static void s_release(void *ctx, void *base, size_t bytes)
{
    sim_ctx_t *s = ctx;
    (void)bytes;
    pthread_mutex_lock(&s->map_mu);
    sim_range_t **pp = &s->ranges;
    while (*pp && (*pp)->base != base)
        pp = &(*pp)->next;
    sim_range_t *r = *pp;
    if (r) {
        do_unmap(s, r, 0, r->bytes / s->page);
        *pp = r->next;
        munmap(r->base, r->bytes);
        free(r->page);
        free(r);
    }
    pthread_mutex_unlock(&s->map_mu);
}

/* ------------------------------------------------------------------ faults */

static int s_inject(void *ctx, const be_fault_t *f)
{
    sim_ctx_t *s = ctx;
    switch (f->kind) {
    case BE_FAULT_OFF:
        atomic_store(&s->fail_copies, 0);
        atomic_store(&s->slow_copies, 0);
        atomic_store(&s->fail_maps, 0);
        pthread_mutex_lock(&s->map_mu);
        s->map_short = 0;
        pthread_mutex_unlock(&s->map_mu);
        return 0;
    case BE_FAULT_COPY_FAIL: atomic_fetch_add(&s->fail_copies, f->count); return 0;
    case BE_FAULT_COPY_SLOW:
        atomic_store(&s->slow_ms, f->delay_ms);
        atomic_fetch_add(&s->slow_copies, f->count);
        return 0;
    case BE_FAULT_MAP_FAIL: atomic_fetch_add(&s->fail_maps, f->count); return 0;
    case BE_FAULT_MAP_SHORT:
        pthread_mutex_lock(&s->map_mu);
        s->map_short = 1;
        pthread_mutex_unlock(&s->map_mu);
        return 0;
    }
    return BE_ERR_ARG;
}

/* ------------------------------------------------------------------ open/close */

static void s_close(void *ctxp)
{
    sim_ctx_t *s = ctxp;
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    while (s->ranges)
        s_release(s, s->ranges->base, s->ranges->bytes);
    if (s->memfd >= 0)
        close(s->memfd);
    free(s->free_pages);
    cpuk_free(s->kc.k);
    pool_free(s->pool);
    pthread_mutex_destroy(&s->map_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s);
}

static const be_ops_t sim_ops = {
    .reserve = s_reserve,
    .map = s_map,
    .unmap = s_unmap,
    .release = s_release,
    .event_new = s_event_new,
    .event_free = s_event_free,
    .copy_h2d = s_copy_h2d,
    .wait = s_wait,
    .event_done = s_event_done,
    .event_times = s_event_times,
    .inject = s_inject,
    .close = s_close,
    CPUK_SLOTS /* kernels and scratch buffers: cpu_ops.c */
};

backend_t *be_sim_open(const be_params_t *p, char *err, size_t errlen)
{
    size_t page = p->page_size ? p->page_size : 2u << 20;
    long sys = sysconf(_SC_PAGESIZE);
    if (page % (size_t)sys) {
        snprintf(err, errlen,
                 "sim backend: page size %zu is not a multiple of the %ld-byte system page", page,
                 sys);
        return NULL;
    }
    if (p->memory < page || p->memory / page > UINT32_MAX - 1) {
        snprintf(err, errlen, "sim backend: device memory %zu bytes is not 1..2^32 pages of %zu",
                 p->memory, page);
        return NULL;
    }
    backend_t *be = calloc(1, sizeof *be);
    sim_ctx_t *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        snprintf(err, errlen, "sim backend: out of memory");
        return NULL;
    }
    s->memfd = -1;
    pthread_mutex_init(&s->map_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->page = page;
    s->n_pages = p->memory / page;
    s->bandwidth = p->sim_bandwidth;
    s->memfd = memfd_create("gpuswapd-sim-pool", MFD_CLOEXEC);
    if (s->memfd < 0 || ftruncate(s->memfd, (off_t)(s->n_pages * page)) != 0) {
        snprintf(err, errlen, "sim backend: memfd of %zu bytes: %s", s->n_pages * page,
                 strerror(errno));
        goto fail;
    }
    s->free_pages = malloc(s->n_pages * sizeof *s->free_pages);
    s->pool = pool_new(p->threads);
    s->kc.k = s->pool ? cpuk_new(s->pool) : NULL;
    if (!s->free_pages || !s->kc.k) {
        snprintf(err, errlen, "sim backend: out of memory");
        goto fail;
    }
    /* pop order = ascending page numbers, so fresh maps are contiguous runs */
    for (size_t i = 0; i < s->n_pages; i++)
        s->free_pages[i] = (uint32_t)(s->n_pages - 1 - i);
    s->n_free = s->n_pages;
    if (pthread_create(&s->thread, NULL, copy_thread, s) != 0) {
        snprintf(err, errlen, "sim backend: cannot start the copy thread");
        goto fail;
    }
    s->thread_started = 1;
    be->name = "sim";
    be->ctx = s;
    be->page_size = page;
    be->pool_bytes = s->n_pages * page;
    be->model_feats = MODEL_FEAT_ALL | MODEL_FEAT_MOE; /* the cpu kernels run every feature */
    be->ops = &sim_ops;
    return be;
fail:
    s_close(s);
    free(be);
    return NULL;
}

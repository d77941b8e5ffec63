/* cpu: the production CPU backend: weights used in place from the host store (zero copy), CPU kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend.h"
#include "kernels/cpu_ops.h"
#include "kernels/pool.h"
#include "base/hugemem.h"
#include "base/util.h"

typedef struct cpu_ctx {
    cpuk_ctx_t kc; /* first: the kernels find their state here */
    pool_t *pool;
} cpu_ctx_t;
CPUK_CTX_CHECK(cpu_ctx_t, kc);

struct be_event {
    be_copy_times_t t;
};

/* Device memory is host memory: a reserved anonymous range whose pages are
 * made accessible on map and inaccessible again on unmap. The range starts on a 2 MiB boundary, so the pool's 2 MiB pages can be huge pages: the
 * attention reads a KV cache's rows a position apart (all layers' K between them, 18 KB in the
 * 134M shape), one 4 KiB page each, which a 2,500-position context's rows overflow the TLB with. */
static int c_reserve(void *ctx, size_t bytes, void **base)
{
    (void)ctx;
    *base = hugemem_reserve(bytes);
    return *base ? 0 : BE_ERR_NOMEM;
}

static int c_map(void *ctx, void *base, size_t off, size_t bytes)
{
    (void)ctx;
    void *p = mmap((char *)base + off, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED)
        return BE_ERR_NOMEM;
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without transparent huge pages, 4 KiB ones */
    return 0;
}

static int c_unmap(void *ctx, void *base, size_t off, size_t bytes)
{
    (void)ctx;
    void *p = mmap((char *)base + off, bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? BE_ERR_DEVICE : 0;
}

static void c_release(void *ctx, void *base, size_t bytes)
{
    (void)ctx;
    munmap(base, bytes);
}

static int c_event_new(void *ctx, be_event_t **ev)
{
    (void)ctx;
    *ev = calloc(1, sizeof **ev);
    return *ev ? 0 : BE_ERR_NOMEM;
}

static void c_event_free(void *ctx, be_event_t *ev)
{
    (void)ctx;
    free(ev);
}

static int c_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev)
{
    (void)ctx;
    double t0 = util_now_s();
    memcpy(dst, src, bytes);
    if (ev)
        ev->t = (be_copy_times_t){t0, t0, util_now_s()};
    return 0;
}

static int c_wait(void *ctx, be_event_t *ev)
{
    (void)ctx;
    (void)ev;
    return 0;
}

static int c_event_done(void *ctx, be_event_t *ev)
{
    (void)ctx;
    (void)ev;
    return 1;
}

static int c_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    (void)ctx;
    *t = ev->t;
    return 0;
}

static void c_close(void *ctxp)
{
    cpu_ctx_t *c = ctxp;
    if (!c)
        return;
    cpuk_free(c->kc.k);
    pool_free(c->pool);
    free(c);
}

static const be_ops_t cpu_ops = {
    .reserve = c_reserve,
    .map = c_map,
    .unmap = c_unmap,
    .release = c_release,
    .event_new = c_event_new,
    .event_free = c_event_free,
    .copy_h2d = c_copy_h2d,
    .wait = c_wait,
    .event_done = c_event_done,
    .event_times = c_event_times,
    .close = c_close,
    CPUK_SLOTS /* kernels and scratch buffers: cpu_ops.c */
};

backend_t *be_cpu_open(const be_params_t *p, char *err, size_t errlen)
{
    backend_t *be = calloc(1, sizeof *be);
    cpu_ctx_t *c = calloc(1, sizeof *c);
    if (!be || !c)
        goto fail;
    c->pool = pool_new(p->threads);
    c->kc.k = c->pool ? cpuk_new(c->pool) : NULL;
    if (!c->kc.k)
        goto fail;
    be->name = "cpu";
    be->ctx = c;
    be->page_size = p->page_size ? p->page_size : 2u << 20;
    be->pool_bytes = p->memory;
    be->zero_copy = 1;
    be->model_feats = MODEL_FEAT_ALL | MODEL_FEAT_MOE; /* the cpu kernels run every feature */
    be->ops = &cpu_ops;
    return be;
fail:
    snprintf(err, errlen, "cpu backend: out of memory");
    c_close(c);
    free(be);
    return NULL;
}

/* backend: the registry that opens cpu, sim or cuda and supplies fallbacks for optional slots. */
#include "backend/backend.h"
#include "base/hugemem.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert((int)BE_ERR_NOMEM == (int)KERN_ERR_NOMEM && (int)BE_ERR_ARG == (int)KERN_ERR_ARG,
               "kernel codes are backend codes");

/* ------------------------------------------------------------------ fallbacks */

/* host memory on huge pages: the cpu backend runs the weights in place from it */
static void *fb_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return hugemem_alloc(bytes);
}

static void fb_host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    hugemem_free(p, bytes);
}

static int fb_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
    return 0;
}

static int fb_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    (void)ctx;
    (void)ev;
    memset(t, 0, sizeof *t);
    return BE_ERR_UNAVAILABLE;
}

static int fb_inject(void *ctx, const be_fault_t *f)
{
    (void)ctx;
    (void)f;
    return BE_ERR_UNAVAILABLE;
}

/* ------------------------------------------------------------------ registry */

#ifdef GPUSWAPD_CUDA
int be_cuda_available(void)
{
    return be_cuda_probe() > 0;
}

int be_cuda_status(char *why, size_t whylen)
{
    return be_cuda_probe_status(why, whylen);
}

int be_cuda_cublas(char *what, size_t whatlen)
{
    return be_cuda_cublas_find(what, whatlen);
}
#else
int be_cuda_available(void)
{
    return 0;
}

int be_cuda_status(char *why, size_t whylen)
{
    snprintf(why, whylen,
             "this gpuswapd was built without CUDA (nvcc not found at build time, or CUDA=0)");
    return 0;
}

int be_cuda_cublas(char *what, size_t whatlen)
{
    snprintf(what, whatlen, "none: this gpuswapd was built without CUDA");
    return 0;
}

backend_t *be_cuda_open(const be_params_t *p, char *err, size_t errlen)
{
    (void)p;
    snprintf(err, errlen, "this gpuswapd was built without CUDA (nvcc not found at build time)");
    return NULL;
}
#endif

static const char *const kind_names[BE_KIND_COUNT] = {
    [BE_KIND_AUTO] = "auto",
    [BE_KIND_CPU] = "cpu",
    [BE_KIND_SIM] = "sim",
    [BE_KIND_CUDA] = "cuda",
};

const char *be_kind_name(be_kind_t k)
{
    return (unsigned)k < BE_KIND_COUNT ? kind_names[k] : NULL;
}

int be_kind_from_name(const char *name, be_kind_t *k)
{
    for (int i = 0; name && i < BE_KIND_COUNT; i++)
        if (strcmp(name, kind_names[i]) == 0) {
            *k = (be_kind_t)i;
            return 0;
        }
    return BE_ERR_ARG;
}

int be_ops_install(backend_t *be, const be_ops_t *ops, char *err, size_t errlen)
{
    if (!ops) {
        snprintf(err, errlen, "backend %s: no ops table", be->name ? be->name : "?");
        return BE_ERR_ARG;
    }
#define X(slot, required, ret, params)                                                             \
    if ((required) && !ops->slot) {                                                                \
        snprintf(err, errlen, "backend %s: required slot '%s' is not set",                         \
                 be->name ? be->name : "?", #slot);                                                \
        return BE_ERR_ARG;                                                                         \
    }                                                                                              \
    be->slot = ops->slot;
    BE_OPS(X)
#undef X
    be->ops = ops;
    if (!be->host_alloc || !be->host_free) {
        be->host_alloc = fb_host_alloc;
        be->host_free = fb_host_free;
    }
    if (!be->copy_d2d)
        be->copy_d2d = fb_copy;
    if (!be->download)
        be->download = fb_copy;
    if (!be->upload)
        be->upload = fb_copy;
    if (!be->event_times)
        be->event_times = fb_event_times;
    if (!be->inject)
        be->inject = fb_inject;
    return 0;
}

backend_t *be_open(const be_params_t *p, char *err, size_t errlen)
{
    backend_t *be;
    switch (p->kind) {
    case BE_KIND_AUTO:
        be = be_cuda_available() ? be_cuda_open(p, err, errlen) : be_cpu_open(p, err, errlen);
        break;
    case BE_KIND_CPU: be = be_cpu_open(p, err, errlen); break;
    case BE_KIND_SIM: be = be_sim_open(p, err, errlen); break;
    case BE_KIND_CUDA: be = be_cuda_open(p, err, errlen); break;
    default:
        snprintf(err, errlen, "unknown backend kind %d (%s, %s, %s, %s)", (int)p->kind,
                 be_kind_name(BE_KIND_AUTO), be_kind_name(BE_KIND_CPU), be_kind_name(BE_KIND_SIM),
                 be_kind_name(BE_KIND_CUDA));
        return NULL;
    }
    if (!be)
        return NULL;
    if (be_ops_install(be, be->ops, err, errlen)) {
        if (be->ops && be->ops->close)
            be->ops->close(be->ctx);
        free(be);
        return NULL;
    }
    return be;
}

/* ------------------------------------------------------------------ helpers */

int be_event_sync(backend_t *be, be_event_t *ev, double timeout_s)
{
    if (!be || !ev)
        return BE_ERR_ARG;
    double t0 = util_now_s();
    long pause_ns = 20000;
    for (;;) {
        int d = be->event_done(be->ctx, ev);
        if (d == 1)
            return 0;
        if (d < 0)
            return d;
        if (d != 0)
            return BE_ERR_DEVICE; /* not a value event_done may return */
        if (util_now_s() - t0 > timeout_s)
            return BE_ERR_TIMEOUT;
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
        if (pause_ns < 1000000)
            pause_ns *= 2;
    }
}

void be_close(backend_t *be)
{
    if (!be)
        return;
    if (be->close)
        be->close(be->ctx);
    free(be);
}

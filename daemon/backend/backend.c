/* backend: the registry that opens cpu, sim or cuda and supplies fallbacks for optional slots. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ fallbacks */

static void *fb_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1))
        return NULL;
    return p;
}

static void fb_host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
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
    snprintf(why, whylen, "this gpuswapd was built without CUDA (nvcc not found at build time, or CUDA=0)");
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

backend_t *be_open(const be_params_t *p, char *err, size_t errlen)
{
    const char *kind = p->kind && *p->kind ? p->kind : "auto";
    backend_t *be;
    if (strcmp(kind, "auto") == 0)
        be = be_cuda_available() ? be_cuda_open(p, err, errlen) : be_cpu_open(p, err, errlen);
    else if (strcmp(kind, "cpu") == 0)
        be = be_cpu_open(p, err, errlen);
    else if (strcmp(kind, "sim") == 0)
        be = be_sim_open(p, err, errlen);
    else if (strcmp(kind, "cuda") == 0)
        be = be_cuda_open(p, err, errlen);
    else {
        snprintf(err, errlen, "unknown backend '%s' (auto, cpu, sim, cuda)", kind);
        return NULL;
    }
    if (!be)
        return NULL;
    if (!be->host_alloc || !be->host_free) {
        be->host_alloc = fb_host_alloc;
        be->host_free = fb_host_free;
    }
    if (!be->download)
        be->download = fb_copy;
    if (!be->upload)
        be->upload = fb_copy;
    if (!be->event_times)
        be->event_times = fb_event_times;
    if (!be->inject)
        be->inject = fb_inject;
    return be;
}

/* ------------------------------------------------------------------ helpers */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int be_event_sync(backend_t *be, be_event_t *ev, double timeout_s)
{
    if (!be || !ev)
        return BE_ERR_ARG;
    double t0 = mono_s();
    long pause_ns = 20000;
    for (;;) {
        int d = be->event_done(be->ctx, ev);
        if (d == 1)
            return 0;
        if (d < 0)
            return d;
        if (d != 0)
            return BE_ERR_DEVICE; /* not a value event_done may return */
        if (mono_s() - t0 > timeout_s)
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

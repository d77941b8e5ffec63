/* cuda_mem: the cuda backend's memory: the VMM page pool (address ranges, pages mapped and unmapped), pinned host memory, copy events and host-to-device copies, scratch buffers and the staged uploads its kernels read. */
#include "cuda_int.cuh"

/* ------------------------------------------------------------------ page pool */

/* One physical allocation mapped at range base + off (one per map call). */
typedef struct cu_map {
    size_t off, bytes;
    CUmemGenericAllocationHandle h;
    uint64_t last_copy; /* number of the latest copy into it (0 = none) */
} cu_map_t;

struct cu_range {
    CUdeviceptr base;
    size_t bytes;
    cu_map_t *maps; /* sorted by off, disjoint */
    size_t n_maps, cap_maps;
    uint64_t last_copy; /* latest copy into no map of this range (a caller bug) */
    struct cu_range *next;
};

static cu_range_t *find_range(cu_ctx_t *c, const void *base)
{
    for (cu_range_t *r = c->ranges; r; r = r->next)
        if (r->base == (CUdeviceptr)base)
            return r;
    return NULL;
}

static cu_range_t *range_containing(cu_ctx_t *c, const void *p)
{
    CUdeviceptr a = (CUdeviceptr)p;
    for (cu_range_t *r = c->ranges; r; r = r->next)
        if (a >= r->base && a < r->base + r->bytes)
            return r;
    return NULL;
}

int cuda_mem_reserve(void *ctx, size_t bytes, void **base)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (bytes == 0 || bytes % c->page)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    cu_range_t *r = (cu_range_t *)calloc(1, sizeof *r);
    if (!r)
        return BE_ERR_NOMEM;
    CUdeviceptr p = 0;
    /* aligned to the largest power of two dividing the page (>= the VMM
     * granularity), so every page boundary is a valid map address */
    size_t align = c->page & (~c->page + 1);
    if (c->drv.address_reserve(&p, bytes, align, 0, 0) != CUDA_SUCCESS) {
        free(r);
        return BE_ERR_NOMEM; /* address space exhausted */
    }
    r->base = p;
    r->bytes = bytes;
    pthread_mutex_lock(&c->mu);
    r->next = c->ranges;
    c->ranges = r;
    pthread_mutex_unlock(&c->mu);
    *base = (void *)p;
    return 0;
}

/* Index of the first map of r ending after off. Caller holds c->mu. */
static size_t map_lower(const cu_range_t *r, size_t off)
{
    size_t lo = 0, hi = r->n_maps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->maps[mid].off + r->maps[mid].bytes <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int cuda_mem_map(void *ctx, void *base, size_t off, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (bytes == 0 || off % c->page || bytes % c->page)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    cu_range_t *r = find_range(c, base);
    size_t i = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr at = 0;
    int mapped = 0;
    if (!r || off > r->bytes || bytes > r->bytes - off) {
        rc = BE_ERR_ARG;
        goto out;
    }
    i = map_lower(r, off);
    if (i < r->n_maps && r->maps[i].off < off + bytes) {
        rc = BE_ERR_ARG; /* already (partly) mapped: a residency bug */
        goto out;
    }
    if (bytes > c->budget - c->used) {
        rc = BE_ERR_NOMEM;
        goto out;
    }
    if (r->n_maps == r->cap_maps) {
        size_t cap = r->cap_maps ? 2 * r->cap_maps : 8;
        cu_map_t *m = (cu_map_t *)realloc(r->maps, cap * sizeof *m);
        if (!m) {
            rc = BE_ERR_NOMEM;
            goto out;
        }
        r->maps = m;
        r->cap_maps = cap;
    }
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = c->dev;
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        at = r->base + off;
        if ((rc = drv_rc(c->drv.create(&h, bytes, &prop, 0))))
            goto out;
        if ((rc = drv_rc(c->drv.map(at, bytes, 0, h, 0))))
            goto fail;
        mapped = 1;
        if ((rc = drv_rc(c->drv.set_access(at, bytes, &acc, 1))))
            goto fail;
    }
    memmove(&r->maps[i + 1], &r->maps[i], (r->n_maps - i) * sizeof *r->maps);
    r->maps[i] = (cu_map_t){off, bytes, h, 0};
    r->n_maps++;
    c->used += bytes;
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
fail:
    if (mapped)
        c->drv.unmap(at, bytes);
    c->drv.release(h);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Nothing queued may still touch maps [i, j) of r when they are unmapped:
 * compute may read any mapped page (weights, KV cache), so it is drained; of
 * the copy stream only the copies up to the latest one into these maps are
 * waited for (copies land in order), not the ones queued after it. Caller
 * holds c->mu. */
static int quiesce(cu_ctx_t *c, const cu_range_t *r, size_t i, size_t j)
{
    int rc = rt_rc(cudaStreamSynchronize(c->compute));
    uint64_t need = r->last_copy;
    for (size_t k = i; k < j; k++)
        if (r->maps[k].last_copy > need)
            need = r->maps[k].last_copy;
    if (need == UINT64_MAX) /* a copy's state is unknown */
        return rt_rc(cudaStreamSynchronize(c->copy)) ? BE_ERR_DEVICE : rc;
    while (c->copies_done.load(std::memory_order_acquire) < need) {
        cudaError_t e = cudaStreamQuery(c->copy);
        if (e != cudaErrorNotReady) {
            /* idle (every callback has run) or broken: nothing left to wait for */
            if (e != cudaSuccess && !rc)
                rc = rt_rc(e);
            break;
        }
        cudaGetLastError();
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return rc;
}

/* Records copy number n as the latest into every map of r overlapping
 * [a, a + bytes), or into r itself when it hits no map. Caller holds c->mu. */
static void mark_copy(cu_range_t *r, CUdeviceptr a, size_t bytes, uint64_t n)
{
    size_t off = a - r->base, end = off + (bytes ? bytes : 1);
    int hit = 0;
    for (size_t k = map_lower(r, off); k < r->n_maps && r->maps[k].off < end; k++) {
        r->maps[k].last_copy = n;
        hit = 1;
    }
    if (!hit)
        r->last_copy = n;
}

/* Unmaps and releases maps [i, j) of r. Caller holds c->mu. */
static int drop_maps(cu_ctx_t *c, cu_range_t *r, size_t i, size_t j)
{
    int rc = 0;
    for (size_t k = i; k < j; k++) {
        cu_map_t *m = &r->maps[k];
        if (c->drv.unmap(r->base + m->off, m->bytes) != CUDA_SUCCESS)
            rc = BE_ERR_DEVICE;
        if (c->drv.release(m->h) != CUDA_SUCCESS)
            rc = BE_ERR_DEVICE;
        c->used -= m->bytes;
    }
    memmove(&r->maps[i], &r->maps[j], (r->n_maps - j) * sizeof *r->maps);
    r->n_maps -= j - i;
    return rc;
}

int cuda_mem_unmap(void *ctx, void *base, size_t off, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (off % c->page || bytes % c->page)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    cu_range_t *r = find_range(c, base);
    if (!r || off > r->bytes || bytes > r->bytes - off) {
        rc = BE_ERR_ARG;
        goto out;
    }
    {
        size_t i = map_lower(r, off), j = i;
        while (j < r->n_maps && r->maps[j].off < off + bytes)
            j++;
        /* every map must lie wholly inside or outside the span */
        if (i < j &&
            (r->maps[i].off < off || r->maps[j - 1].off + r->maps[j - 1].bytes > off + bytes)) {
            rc = BE_ERR_ARG;
            goto out;
        }
        if (i == j)
            goto out;
        if ((rc = quiesce(c, r, i, j)))
            goto out;
        rc = drop_maps(c, r, i, j);
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Caller holds c->mu; r is unlinked and freed. */
static void do_release(cu_ctx_t *c, cu_range_t *r)
{
    if (r->n_maps) {
        quiesce(c, r, 0, r->n_maps);
        drop_maps(c, r, 0, r->n_maps);
    }
    c->drv.address_free(r->base, r->bytes);
    free(r->maps);
    free(r);
}

void cuda_mem_release(void *ctx, void *base, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    (void)bytes;
    if (use_dev(c))
        return;
    pthread_mutex_lock(&c->mu);
    cu_range_t **pp = &c->ranges;
    while (*pp && (*pp)->base != (CUdeviceptr)base)
        pp = &(*pp)->next;
    cu_range_t *r = *pp;
    if (r) {
        *pp = r->next;
        do_release(c, r);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ host memory */

void *cuda_mem_host_alloc(void *ctx, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (use_dev(c))
        return NULL;
    void *p = NULL;
    if (rt_rc(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable)))
        return NULL;
    return p;
}

void cuda_mem_host_free(void *ctx, void *p, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    (void)bytes;
    if (!p || use_dev(c))
        return;
    rt_rc(cudaFreeHost(p));
}

/* ------------------------------------------------------------------ events and copies */

struct be_event {
    cu_ctx_t *c;
    cudaEvent_t start, end;       /* timing events around the copy */
    cudaEvent_t done;             /* after the host callback: the times are valid */
    double queued;                /* CLOCK_MONOTONIC when copy_h2d was called */
    std::atomic<double> host_end; /* CLOCK_MONOTONIC when the copy had landed */
    int used;                     /* 1 once a copy was queued with this event */
};

int cuda_mem_event_new(void *ctx, be_event_t **evp)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    *evp = NULL;
    int rc = use_dev(c);
    if (rc)
        return rc;
    be_event_t *ev = new (std::nothrow) be_event_t();
    if (!ev)
        return BE_ERR_NOMEM;
    ev->c = c;
    ev->host_end.store(0.0);
    int n = 0;
    if (!(rc = rt_rc(cudaEventCreateWithFlags(&ev->start, cudaEventDefault))))
        n++;
    if (!rc && !(rc = rt_rc(cudaEventCreateWithFlags(&ev->end, cudaEventDefault))))
        n++;
    if (!rc && !(rc = rt_rc(cudaEventCreateWithFlags(&ev->done, cudaEventDisableTiming))))
        n++;
    if (rc) {
        if (n > 1)
            cudaEventDestroy(ev->end);
        if (n > 0)
            cudaEventDestroy(ev->start);
        delete ev;
        return rc;
    }
    *evp = ev;
    return 0;
}

void cuda_mem_event_free(void *ctx, be_event_t *ev)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (!ev)
        return;
    use_dev(c);
    /* the host callback of a pending copy still writes into ev */
    if (ev->used)
        cudaEventSynchronize(ev->done);
    cudaEventDestroy(ev->start);
    cudaEventDestroy(ev->end);
    cudaEventDestroy(ev->done);
    cudaGetLastError();
    delete ev;
}

/* Host callbacks on the copy stream, run in stream order once a copy has
 * landed (no CUDA calls allowed in them). */
static void CUDART_CB hf_copy_done_ev(void *arg)
{
    be_event_t *ev = (be_event_t *)arg;
    ev->host_end.store(now_s(), std::memory_order_release);
    ev->c->copies_done.fetch_add(1, std::memory_order_acq_rel);
}

static void CUDART_CB hf_copy_done(void *arg)
{
    cu_ctx_t *c = (cu_ctx_t *)arg;
    c->copies_done.fetch_add(1, std::memory_order_acq_rel);
}

int cuda_mem_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    cu_range_t *r = range_containing(c, dst);
    if (ev) {
        ev->queued = now_s();
        ev->used = 1;
        rc = rt_rc(cudaEventRecord(ev->start, c->copy));
    }
    if (!rc && bytes)
        rc = rt_rc(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->copy));
    if (!rc && ev)
        rc = rt_rc(cudaEventRecord(ev->end, c->copy));
    if (!rc)
        rc = rt_rc(ev ? cudaLaunchHostFunc(c->copy, hf_copy_done_ev, ev)
                      : cudaLaunchHostFunc(c->copy, hf_copy_done, c));
    if (!rc)
        c->copies_issued++;
    if (r) /* on failure the copy's state is unknown: unmap then drains the stream */
        mark_copy(r, (CUdeviceptr)dst, bytes, rc ? UINT64_MAX : c->copies_issued);
    if (!rc && ev)
        rc = rt_rc(cudaEventRecord(ev->done, c->copy));
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int cuda_mem_wait(void *ctx, be_event_t *ev)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc || !ev)
        return rc;
    /* the data is there at ev->end; the host callback need not be waited for */
    return rt_rc(cudaStreamWaitEvent(c->compute, ev->end, 0));
}

int cuda_mem_event_done(void *ctx, be_event_t *ev)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc)
        return rc;
    cudaError_t e = cudaEventQuery(ev->done);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    return rt_rc(e);
}

/* Seconds since open. end is when the host saw the copy land (a few us after
 * the device did); start = end - the device-measured copy duration. */
int cuda_mem_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    memset(t, 0, sizeof *t);
    if (!ev->used)
        return BE_ERR_ARG;
    int d = cuda_mem_event_done(ctx, ev);
    if (d != 1)
        return d < 0 ? d : BE_ERR_ARG;
    float ms = 0;
    int rc = rt_rc(cudaEventElapsedTime(&ms, ev->start, ev->end));
    if (rc)
        return rc;
    double end = ev->host_end.load(std::memory_order_acquire) - c->t0;
    t->queued = ev->queued - c->t0;
    t->end = end;
    t->start = end - (double)ms / 1e3;
    if (t->start < t->queued)
        t->start = t->queued;
    return 0;
}

/* ------------------------------------------------------------------ scratch */

void *cuda_mem_buf_alloc(void *ctx, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (use_dev(c))
        return NULL;
    void *p = NULL;
    if (rt_rc(cudaMalloc(&p, bytes ? bytes : 256)))
        return NULL;
    return p;
}

void cuda_mem_buf_free(void *ctx, void *p)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (!p || use_dev(c))
        return;
    /* kernels queued on the compute stream may still use it */
    cudaStreamSynchronize(c->compute);
    rt_rc(cudaFree(p));
}

int cuda_mem_download(void *ctx, void *host, const void *dev, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc)
        return rc;
    if (bytes &&
        (rc = rt_rc(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->compute))))
        return rc;
    return rt_rc(cudaStreamSynchronize(c->compute));
}

int cuda_mem_upload(void *ctx, void *dev, const void *host, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc)
        return rc;
    if (bytes &&
        (rc = rt_rc(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->compute))))
        return rc;
    return rt_rc(cudaStreamSynchronize(c->compute));
}

static void stage_free(cu_stage_t *s)
{
    if (s->dev)
        cudaFree(s->dev);
    if (s->host)
        cudaFreeHost(s->host);
    s->dev = s->host = NULL;
    s->cap = s->len = 0;
}

int cuda_mem_stage_put(cu_ctx_t *c, int k, const void *src, size_t bytes, const void **dev)
{
    cu_stage_t *s = &c->stage[k];
    if (bytes == 0) {
        *dev = s->dev;
        return 0;
    }
    if (s->len == bytes && memcmp(s->host, src, bytes) == 0) {
        *dev = s->dev;
        return 0;
    }
    int rc;
    s->len = 0;
    if (bytes > s->cap) {
        /* the old buffers may still be read by queued work */
        if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
            return rc;
        size_t cap = s->cap * 2 > bytes ? s->cap * 2 : bytes;
        if (cap < 4096)
            cap = 4096;
        stage_free(s);
        if ((rc = rt_rc(cudaMalloc(&s->dev, cap))))
            return rc;
        if ((rc = rt_rc(cudaHostAlloc(&s->host, cap, cudaHostAllocPortable)))) {
            cudaFree(s->dev);
            s->dev = NULL;
            return rc;
        }
        s->cap = cap;
    } else if ((rc = rt_rc(cudaEventSynchronize(s->ev)))) {
        return rc; /* host must not be rewritten while a copy reads it */
    }
    memcpy(s->host, src, bytes);
    if ((rc = rt_rc(cudaMemcpyAsync(s->dev, s->host, bytes, cudaMemcpyHostToDevice, c->compute))))
        return rc;
    if ((rc = rt_rc(cudaEventRecord(s->ev, c->compute))))
        return rc;
    s->len = bytes;
    *dev = s->dev;
    return 0;
}

/* ------------------------------------------------------------------ close */

void cuda_mem_free_all(cu_ctx_t *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->ranges) {
        cu_range_t *r = c->ranges;
        c->ranges = r->next;
        do_release(c, r);
    }
    pthread_mutex_unlock(&c->mu);
    for (int k = 0; k < STAGE_N; k++) {
        stage_free(&c->stage[k]);
        if (c->stage[k].ev)
            cudaEventDestroy(c->stage[k].ev);
    }
}

int cuda_mem_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc || !bytes)
        return rc;
    return rt_rc(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->compute));
}

/* cuda: the GPU backend: a CUDA VMM page pool, pinned host memory, a copy and a compute stream, cuBLAS GEMM and own kernels. */
/*
 * Linking: the binary carries cudart statically and has no load-time
 * dependency on libcuda or libcublas. Driver-API entry points (VMM) are
 * fetched with cudaGetDriverEntryPointByVersion at open; cuBLAS is optional:
 * located at open (GPUSWAPD_CUBLAS, the loader's path and ldconfig cache, the
 * CUDA install, pip's nvidia/<pkg>/lib folders) and dlopen'ed. Without it
 * the F32/F16/BF16 prefill GEMMs run on a plain tiled kernel of ours (slower,
 * F32 activations); be->desc says which, with the library's path and version.
 * Without a driver or a device, be_cuda_probe() returns 0 and be_cuda_open()
 * fails with a reason; nothing here prints or exits.
 *
 * Threads: the vtable is driven by one worker thread (the engine), but open,
 * host_alloc and close may run on others, so every entry point makes the
 * backend's device current first (cudaSetDevice is per thread). The page-pool
 * tables are guarded by cu_ctx.mu.
 */
#include <cuda.h> /* types and enums only: driver functions come through entry points */
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_api.h>

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <new>

extern "C" {
#include "backend/backend.h"
#include "kernels/quant.h"
#include "kernels/wtype.h"
}

/* ------------------------------------------------------------------ tuning */

#define CU_DEFAULT_PAGE (2u << 20)
/* Share of the free device memory the pool takes when device.memory is 0. */
#define CU_AUTO_POOL_SHARE 0.9
/* GEMV kernel: rows (one warp each) per block, tokens per warp. */
#define MM_WARPS 4
#define MM_TOK 8
/* Up to this many tokens the GEMV kernel (F32 activations, weight read once
 * per MM_TOK tokens) runs for every weight type; above it F32/F16/BF16
 * weights go through cublasGemmEx (F16/BF16: activations rounded to the
 * weight type, F32 accumulation) or, without cuBLAS, k_gemm_tiled (F32
 * activations). Q8_0 always uses the GEMV kernel; the other block types
 * (cuda_quant.cuh) go through cuBLAS on F16 copies of their rows, or
 * without cuBLAS the GEMV kernel. */
#define MM_GEMM_MIN_TOK 9
/* Tiled GEMM (the fallback without cuBLAS): a TILE x TILE block computes
 * TILE weight rows for TILE tokens, stepping TILE columns at a time. */
#define GEMM_TILE 16
/* Attention: warps per (token, head) block, largest head_dim supported. */
#define ATT_WARPS 4
#define ATT_MAX_HD 256
/* Split attention (decode, long contexts): when the (token, head) blocks are
 * fewer than ATT_SPLIT_BLOCKS, the positions are cut into up to
 * ATT_MAX_SPLIT ranges of at least ATT_SPLIT_MIN_POS, one block each; their
 * partial softmax maxima, sums and weighted V go to c->att_part and a second
 * kernel merges them. */
#define ATT_SPLIT_BLOCKS 1024
#define ATT_MAX_SPLIT 32
#define ATT_SPLIT_MIN_POS 128
/* GEMV: independent 16-byte weight loads in flight per lane (VEC paths). */
#define MM_LOADS 4
#define EW_THREADS 256
#define GRID_Y_MAX 65535u

/* ------------------------------------------------------------------ cuBLAS (dlopen'ed) */

typedef cublasStatus_t (*pfn_cublas_create)(cublasHandle_t *);
typedef cublasStatus_t (*pfn_cublas_destroy)(cublasHandle_t);
typedef cublasStatus_t (*pfn_cublas_set_stream)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*pfn_cublas_set_math_mode)(cublasHandle_t, cublasMath_t);
typedef cublasStatus_t (*pfn_cublas_gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                             int, int, int, const void *, const void *,
                                             cudaDataType, int, const void *, cudaDataType, int,
                                             const void *, void *, cudaDataType, int,
                                             cublasComputeType_t, cublasGemmAlgo_t);

typedef cublasStatus_t (*pfn_cublas_get_property)(libraryPropertyType, int *);

typedef struct cu_blas {
    void *lib; /* dlopen handle; NULL: own GEMM kernel */
    void *lt;  /* libcublasLt loaded first from the same folder (may be NULL) */
    pfn_cublas_create create;
    pfn_cublas_destroy destroy;
    pfn_cublas_set_stream set_stream;
    pfn_cublas_set_math_mode set_math_mode; /* may be NULL */
    pfn_cublas_gemm_ex gemm_ex;
    pfn_cublas_get_property get_property;
    cublasHandle_t h; /* NULL: own GEMM kernel */
    char path[512];   /* file loaded */
    int ver[3];       /* major, minor, patch */
    char note[1024];  /* why it is not used, when it is not */
} cu_blas_t;

static void blas_unload(cu_blas_t *b);

/* ------------------------------------------------------------------ driver VMM (entry points) */

typedef struct cu_drv {
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
} cu_drv_t;

/* ------------------------------------------------------------------ context */

/* One physical allocation mapped at range base + off (one per map call). */
typedef struct cu_map {
    size_t off, bytes;
    CUmemGenericAllocationHandle h;
    uint64_t last_copy; /* number of the latest copy into it (0 = none) */
} cu_map_t;

typedef struct cu_range {
    CUdeviceptr base;
    size_t bytes;
    cu_map_t *maps; /* sorted by off, disjoint */
    size_t n_maps, cap_maps;
    uint64_t last_copy; /* latest copy into no map of this range (a caller bug) */
    struct cu_range *next;
} cu_range_t;

/* A small host array uploaded for a kernel (ids, positions, tokens, rows).
 * host is pinned and holds what dev holds once ev has completed, so an
 * identical upload (rope twice per layer, the same tokens for every layer)
 * reuses dev without a copy. */
typedef struct cu_stage {
    void *dev;
    void *host;
    size_t cap;     /* bytes of dev and host */
    size_t len;     /* bytes of the last upload; 0 = none valid */
    cudaEvent_t ev; /* recorded after the last copy from host */
} cu_stage_t;

enum {
    STAGE_IDS,
    STAGE_POS,
    STAGE_TOKS,
    STAGE_ROWS,
    STAGE_FREQS,
    STAGE_N
};

typedef struct cu_ctx {
    int dev;       /* CUDA device ordinal */
    size_t page;   /* pool page: multiple of the VMM granularity */
    size_t budget; /* pool bytes */
    double t0;     /* CLOCK_MONOTONIC at open: origin of event_times */
    cu_drv_t drv;
    cu_blas_t blas;
    cudaStream_t copy, compute;

    pthread_mutex_t mu; /* ranges, used */
    cu_range_t *ranges;
    size_t used; /* bytes of physical allocations mapped */

    uint64_t copies_issued;            /* copies queued on the copy stream (under mu) */
    std::atomic<uint64_t> copies_done; /* copies landed (host callbacks, in stream order) */

    cu_stage_t stage[STAGE_N];
    void *xh;        /* activations rounded to F16/BF16 for cuBLAS */
    size_t xh_cap;   /* bytes */
    void *wh;        /* rows of a block-type weight dequantized to F16 for cuBLAS */
    size_t wh_cap;   /* bytes, at most QK_HALF_MAX or one row */
    float *att_part; /* split attention partials: (token, head, split) x (m, l, acc[head_dim]) */
    size_t att_part_cap; /* bytes */
    char desc[2048];     /* be->desc */
} cu_ctx_t;

struct be_event {
    cu_ctx_t *c;
    cudaEvent_t start, end;       /* timing events around the copy */
    cudaEvent_t done;             /* after the host callback: the times are valid */
    double queued;                /* CLOCK_MONOTONIC when copy_h2d was called */
    std::atomic<double> host_end; /* CLOCK_MONOTONIC when the copy had landed */
    int used;                     /* 1 once a copy was queued with this event */
};

/* ------------------------------------------------------------------ helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runtime error -> backend code; clears the (non-sticky) last error. */
static int rt_rc(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? BE_ERR_NOMEM : BE_ERR_DEVICE;
}

static int drv_rc(CUresult r)
{
    if (r == CUDA_SUCCESS)
        return 0;
    return r == CUDA_ERROR_OUT_OF_MEMORY ? BE_ERR_NOMEM : BE_ERR_DEVICE;
}

/* Makes the backend's device current on the calling thread. */
static int use_dev(cu_ctx_t *c)
{
    return rt_rc(cudaSetDevice(c->dev));
}

/* Status of the kernel launches just queued. */
static int launch_rc(void)
{
    return rt_rc(cudaGetLastError());
}

static unsigned grid_y(size_t n)
{
    return n < GRID_Y_MAX ? (unsigned)(n ? n : 1) : GRID_Y_MAX;
}

static unsigned grid_x(size_t n, unsigned per_block)
{
    size_t b = (n + per_block - 1) / per_block;
    if (b == 0)
        b = 1;
    return b > (1u << 20) ? (1u << 20) : (unsigned)b;
}

/* ------------------------------------------------------------------ page pool */

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

static int c_reserve(void *ctx, size_t bytes, void **base)
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

static int c_map(void *ctx, void *base, size_t off, size_t bytes)
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

static int c_unmap(void *ctx, void *base, size_t off, size_t bytes)
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

static void c_release(void *ctx, void *base, size_t bytes)
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

static void *c_host_alloc(void *ctx, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (use_dev(c))
        return NULL;
    void *p = NULL;
    if (rt_rc(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable)))
        return NULL;
    return p;
}

static void c_host_free(void *ctx, void *p, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    (void)bytes;
    if (!p || use_dev(c))
        return;
    rt_rc(cudaFreeHost(p));
}

/* ------------------------------------------------------------------ events and copies */

static int c_event_new(void *ctx, be_event_t **evp)
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

static void c_event_free(void *ctx, be_event_t *ev)
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

static int c_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev)
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

static int c_wait(void *ctx, be_event_t *ev)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    if (rc || !ev)
        return rc;
    /* the data is there at ev->end; the host callback need not be waited for */
    return rt_rc(cudaStreamWaitEvent(c->compute, ev->end, 0));
}

static int c_event_done(void *ctx, be_event_t *ev)
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
static int c_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    memset(t, 0, sizeof *t);
    if (!ev->used)
        return BE_ERR_ARG;
    int d = c_event_done(ctx, ev);
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

static int c_sync(void *ctx)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    return rc ? rc : rt_rc(cudaStreamSynchronize(c->compute));
}

/* ------------------------------------------------------------------ scratch */

static void *c_buf_alloc(void *ctx, size_t bytes)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (use_dev(c))
        return NULL;
    void *p = NULL;
    if (rt_rc(cudaMalloc(&p, bytes ? bytes : 256)))
        return NULL;
    return p;
}

static void c_buf_free(void *ctx, void *p)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (!p || use_dev(c))
        return;
    /* kernels queued on the compute stream may still use it */
    cudaStreamSynchronize(c->compute);
    rt_rc(cudaFree(p));
}

static int c_download(void *ctx, void *host, const void *dev, size_t bytes)
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

static int c_upload(void *ctx, void *dev, const void *host, size_t bytes)
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

/* Puts bytes of host array src into stage k's device buffer, in order on the
 * compute stream; *dev is where kernels read it. Caller made the device
 * current. */
static int stage_put(cu_ctx_t *c, int k, const void *src, size_t bytes, const void **dev)
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

/* ------------------------------------------------------------------ device code */

__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Element i of a row of the given type as F32 (exact). */
template <int WT> __device__ __forceinline__ float row_elem(const uint8_t *row, size_t i)
{
    if constexpr (WT == GGUF_T_F32) {
        return ((const float *)row)[i];
    } else if constexpr (WT == GGUF_T_F16) {
        return f16_to_f32(((const uint16_t *)row)[i]);
    } else if constexpr (WT == GGUF_T_BF16) {
        return bf16_to_f32(((const uint16_t *)row)[i]);
    } else {
        const uint8_t *b = row + (i / QUANT_Q8_0_BLOCK) * sizeof(quant_block_q8_0_t);
        float d = f16_to_f32(*(const uint16_t *)b);
        return d * (float)(int8_t)b[2 + i % QUANT_Q8_0_BLOCK];
    }
}

template <int WT>
__global__ void k_embed(const uint8_t *tab, size_t row_bytes, uint32_t n, const int32_t *ids,
                        size_t n_tok, float *out, size_t stride)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const uint8_t *row = tab + (size_t)ids[t] * row_bytes;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            out[t * stride + i] = row_elem<WT>(row, i);
    }
}

/* Sum over the block of v (blockDim.x a multiple of 32, <= 1024). */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    unsigned w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    v = warp_sum(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (blockDim.x >> 5) ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads(); /* part/total are reused by the next call */
    return r;
}

/* out may equal x: every element is read before the barrier in block_sum
 * and then read again and written by the same thread. */
__global__ void k_rmsnorm(float *out, const float *x, const float *w, size_t n_tok, uint32_t n,
                          size_t stride, float eps)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const float *xi = x + t * stride;
        float *o = out + t * stride;
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            ss += xi[i] * xi[i];
        ss = block_sum(ss);
        float s = 1.0f / sqrtf(ss / (float)n + eps);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            o[i] = __fmul_rn(__fmul_rn(xi[i], s), w[i]);
    }
}

/* acc[j] += dot(wv[0 .. E), x[j][i .. i + E)) for the first nt of MM_TOK
 * tokens (the GEMV kernels' inner step, whatever decoded the weights). */
template <int E>
__device__ __forceinline__ void acc_tokens(const float *wv, const float *xt, size_t xs, size_t i,
                                           uint32_t nt, float *acc)
{
#pragma unroll
    for (int j = 0; j < MM_TOK; j++) {
        if ((uint32_t)j < nt) {
            const float *xp = xt + (size_t)j * xs + i;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < E; k++)
                s += wv[k] * xp[k];
            acc[j] += s;
        }
    }
}

/* The GEMV kernels' warp: its output row r (false past n_out: the whole
 * warp returns), its MM_TOK-token slice (t0, nt of them, activations xt),
 * the row's weights, and acc zeroed. */
struct gemv_warp {
    unsigned lane;
    size_t r;
    uint32_t t0, nt;
    const float *xt;
    const uint8_t *row;
    float acc[MM_TOK];
};

__device__ __forceinline__ bool gemv_warp_init(gemv_warp *g, const uint8_t *w, size_t row_bytes,
                                               uint32_t n_out, const float *x, size_t xs,
                                               uint32_t n_tok)
{
    g->lane = threadIdx.x & 31;
    g->r = (size_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (g->r >= n_out)
        return false;
    g->t0 = blockIdx.y * MM_TOK;
    g->nt = n_tok - g->t0 < MM_TOK ? n_tok - g->t0 : MM_TOK;
    g->xt = x + (size_t)g->t0 * xs;
    g->row = w + g->r * row_bytes;
#pragma unroll
    for (int j = 0; j < MM_TOK; j++)
        g->acc[j] = 0.0f;
    return true;
}

/* y[t0 + j][r] = the warp's sum of acc[j] for the first nt tokens (lane 0 writes). */
__device__ __forceinline__ void gemv_store(const float *acc, unsigned lane, uint32_t nt, float *y,
                                           size_t ys, uint32_t t0, size_t r)
{
#pragma unroll
    for (int j = 0; j < MM_TOK; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0 && (uint32_t)j < nt)
            y[(size_t)(t0 + j) * ys + r] = s;
    }
}

/* acc[j] += dot(the E weights in raw, x[j][i .. i + E)) for the first nt
 * tokens: raw is one 16-byte load of F32 (E = 4) or F16/BF16 (E = 8). */
template <int WT>
__device__ __forceinline__ void gemv_acc16(const uint4 raw, const float *xt, size_t xs, size_t i,
                                           uint32_t nt, float *acc)
{
    constexpr int E = WT == GGUF_T_F32 ? 4 : 8;
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    float wv[E];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (WT == GGUF_T_F32) {
            wv[k] = __uint_as_float(u[k]);
        } else {
            const uint16_t a = (uint16_t)(u[k] & 0xffff), b = (uint16_t)(u[k] >> 16);
            wv[2 * k] = WT == GGUF_T_F16 ? f16_to_f32(a) : bf16_to_f32(a);
            wv[2 * k + 1] = WT == GGUF_T_F16 ? f16_to_f32(b) : bf16_to_f32(b);
        }
    }
    acc_tokens<E>(wv, xt, xs, i, nt, acc);
}

/* y[t][r] = dot(W row r, x[t]): one warp per output row and MM_TOK tokens,
 * the row dequantised on the fly, F32 accumulation. VEC: 16-byte weight
 * loads (rows 16-byte aligned, n_in a multiple of 16 bytes' worth). */
template <int WT, bool VEC>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_gemv(const uint8_t *w, size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
           size_t xs, float *y, size_t ys, uint32_t n_tok)
{
    gemv_warp g;
    if (!gemv_warp_init(&g, w, row_bytes, n_out, x, xs, n_tok))
        return; /* whole warp */
    const unsigned lane = g.lane;
    const size_t r = g.r;
    const uint32_t t0 = g.t0, nt = g.nt;
    const float *xt = g.xt;
    const uint8_t *row = g.row;
    float *acc = g.acc;

    if constexpr (WT == GGUF_T_Q8_0) {
        /* 4 blocks per step: lanes 8k..8k+7 take block b+k, 4 weights each */
        const uint32_t nb = n_in / QUANT_Q8_0_BLOCK, sub = lane & 7;
        for (uint32_t b = lane >> 3; b < nb; b += 4) {
            const uint8_t *blk = row + (size_t)b * sizeof(quant_block_q8_0_t);
            const float d = f16_to_f32(*(const uint16_t *)blk);
            const uint16_t *qp = (const uint16_t *)(blk + 2 + sub * 4);
            const uint16_t lo = qp[0], hi = qp[1];
            const float q0 = (float)(int8_t)(lo & 0xff), q1 = (float)(int8_t)(lo >> 8);
            const float q2 = (float)(int8_t)(hi & 0xff), q3 = (float)(int8_t)(hi >> 8);
            const size_t i = (size_t)b * QUANT_Q8_0_BLOCK + sub * 4;
#pragma unroll
            for (int j = 0; j < MM_TOK; j++) {
                if ((uint32_t)j < nt) {
                    const float *xp = xt + (size_t)j * xs + i;
                    acc[j] += d * (q0 * xp[0] + q1 * xp[1] + q2 * xp[2] + q3 * xp[3]);
                }
            }
        }
    } else if constexpr (VEC) {
        /* a 16-byte load covers E elements; the warp steps 32 E of them; each
         * lane issues MM_LOADS independent loads before it uses any */
        constexpr size_t E = WT == GGUF_T_F32 ? 4 : 8, STEP = 32 * E;
        size_t i = (size_t)lane * E;
        for (; i + (MM_LOADS - 1) * STEP < n_in; i += MM_LOADS * STEP) {
            uint4 raw[MM_LOADS];
#pragma unroll
            for (int u = 0; u < MM_LOADS; u++)
                raw[u] = __ldg((const uint4 *)(row + (i + u * STEP) * (16 / E)));
#pragma unroll
            for (int u = 0; u < MM_LOADS; u++)
                gemv_acc16<WT>(raw[u], xt, xs, i + u * STEP, nt, acc);
        }
        for (; i < n_in; i += STEP)
            gemv_acc16<WT>(__ldg((const uint4 *)(row + i * (16 / E))), xt, xs, i, nt, acc);
    } else {
        for (size_t i = lane; i < n_in; i += 32) {
            const float wv = row_elem<WT>(row, i);
#pragma unroll
            for (int j = 0; j < MM_TOK; j++)
                if ((uint32_t)j < nt)
                    acc[j] += wv * xt[(size_t)j * xs + i];
        }
    }
    gemv_store(acc, lane, nt, y, ys, t0, r);
}

/* dst (n_tok, n) dense = x (n_tok rows, stride xs) rounded to F16/BF16. */
template <int WT>
__global__ void k_to_half(uint16_t *dst, const float *x, size_t xs, uint32_t n, size_t n_tok)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            const float v = x[t * xs + i];
            if constexpr (WT == GGUF_T_F16)
                dst[t * n + i] = __half_as_ushort(__float2half_rn(v));
            else
                dst[t * n + i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        }
    }
}

/* y[t][r] = dot(W row r, x[t]) for a GEMM_TILE x GEMM_TILE tile of rows r
 * and tokens t (the fallback without cuBLAS): each step stages GEMM_TILE
 * columns of the W rows (as F32) and of the x rows in shared memory, then
 * thread (tx, ty) adds their products for row r0 + tx, token t0 + ty. F32
 * activations and accumulation. Block (GEMM_TILE, GEMM_TILE). */
template <int WT>
__global__ void __launch_bounds__(GEMM_TILE *GEMM_TILE)
    k_gemm_tiled(const uint8_t *w, size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
                 size_t xs, float *y, size_t ys, uint32_t n_tok)
{
    __shared__ float ws[GEMM_TILE][GEMM_TILE + 1]; /* [row][col], padded against bank conflicts */
    __shared__ float xt[GEMM_TILE][GEMM_TILE + 1]; /* [token][col] */
    const uint32_t tx = threadIdx.x, ty = threadIdx.y;
    const size_t r0 = (size_t)blockIdx.x * GEMM_TILE;
    const size_t t0 = (size_t)blockIdx.y * GEMM_TILE;
    float acc = 0.0f;
    for (uint32_t k0 = 0; k0 < n_in; k0 += GEMM_TILE) {
        const uint32_t k = k0 + tx;
        const size_t lr = r0 + ty, lt = t0 + ty; /* the row and token this thread loads */
        ws[ty][tx] = lr < n_out && k < n_in ? row_elem<WT>(w + lr * row_bytes, k) : 0.0f;
        xt[ty][tx] = lt < n_tok && k < n_in ? x[lt * xs + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_TILE; kk++)
            acc += ws[tx][kk] * xt[ty][kk];
        __syncthreads();
    }
    const size_t r = r0 + tx, t = t0 + ty;
    if (r < n_out && t < n_tok)
        y[t * ys + r] = acc;
}

__global__ void k_add_bias(float *y, const float *b, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            y[t * stride + i] += b[i];
}

__global__ void k_add(float *x, const float *y, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            x[t * stride + i] += y[t * stride + i];
}

__global__ void k_silu_mul(float *g, const float *u, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            const float v = g[t * stride + i];
            g[t * stride + i] = v / (1.0f + expf(-v)) * u[t * stride + i];
        }
}

#include "cuda_arch.cuh"

/* One thread per (token, pair index i), looping over heads. Angles are
 * computed in double and rounded, which reproduces the correctly rounded
 * powf/cosf/sinf of the CPU kernel; the rotation is done without FMA
 * contraction, as the CPU does. */
__global__ void k_rope(float *vec, size_t n_tok, size_t stride, uint32_t n_heads, uint32_t hd,
                       uint32_t rope_dim, float base, float freq_scale, int neox,
                       const uint32_t *pos, const float *freqs, float mscale, float ext,
                       float corr_lo, float corr_hi)
{
    const uint32_t half = rope_dim / 2;
    const size_t total = n_tok * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / half;
        const uint32_t i = (uint32_t)(idx % half);
        const float inv_freq =
            rope_pair_freq(i, rope_dim, base, freqs, freq_scale, ext, corr_lo, corr_hi);
        const float theta = (float)pos[t] * inv_freq;
        float c = (float)cos((double)theta), s = (float)sin((double)theta);
        if (mscale != 1.0f) { /* rope.scaling.attn_factor */
            c = __fmul_rn(c, mscale);
            s = __fmul_rn(s, mscale);
        }
        const uint32_t a = neox ? i : 2 * i;
        const uint32_t b = neox ? i + half : 2 * i + 1;
        for (uint32_t h = 0; h < n_heads; h++) {
            float *v = vec + t * stride + (size_t)h * hd;
            const float x0 = v[a], x1 = v[b];
            v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
    }
}

__device__ __forceinline__ size_t kv_off(uint32_t pos, uint32_t n_layer, uint32_t layer, size_t kvd)
{
    return ((size_t)pos * n_layer + layer) * kvd;
}

/* KV cache elements: F32 as is, F16 rounded to nearest even on store and
 * widened on load (the sums stay in F32). */
__device__ __forceinline__ float kv_ld(const float *p, size_t i)
{
    return p[i];
}
__device__ __forceinline__ float kv_ld(const __half *p, size_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ void kv_st(float *p, size_t i, float x)
{
    p[i] = x;
}
__device__ __forceinline__ void kv_st(__half *p, size_t i, float x)
{
    p[i] = __float2half_rn(x);
}
/* The query as the cache type sees it: F16 caches round it to half, as an
 * F16 x F16 product does (the cpu backend does the same). */
__device__ __forceinline__ float kv_q(const float *, float x)
{
    return x;
}
__device__ __forceinline__ float kv_q(const __half *, float x)
{
    return __half2float(__float2half_rn(x));
}

template <typename KV>
__global__ void k_kv_store(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, size_t kvd,
                           size_t stride, const float *k, const float *v, size_t n_tok)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const be_tok_t bt = toks[t];
        KV *kd = (KV *)bt.k_base + kv_off(bt.pos, n_layer, layer, kvd);
        KV *vd = (KV *)bt.v_base + kv_off(bt.pos, n_layer, layer, kvd);
        for (size_t i = threadIdx.x; i < kvd; i += blockDim.x) {
            kv_st(kd, i, k[t * stride + i]);
            kv_st(vd, i, v[t * stride + i]);
        }
    }
}

/* The block's warps walk positions [p0, p1) of one (token, head): warp w
 * takes p0 + w, p0 + w + ATT_WARPS, ... with an online softmax (running max,
 * sum, weighted V in registers: lane holds dims lane + 32j), then the warps
 * are merged through shared memory: on return *mx is the range's softmax
 * maximum, *sum its sum of exp(score - mx), and the range's unnormalised
 * weighted V is sum_w sm_acc[w][i] * f[w]. An empty range gives mx = -inf,
 * sum = 0. No buffer grows with the context. */
template <typename KV>
__device__ void att_range(const be_tok_t &bt, uint32_t layer, uint32_t n_layer, uint32_t kvh,
                          size_t kvd, uint32_t hd, const float *qh, float scale, float cap,
                          uint32_t p0, uint32_t p1, float *sm_m, float *sm_l,
                          float (*sm_acc)[ATT_MAX_HD], float f[ATT_WARPS], float *mx, float *sum)
{
    constexpr int NJ = ATT_MAX_HD / 32;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float qv[NJ], acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const uint32_t i = lane + 32 * j;
        qv[j] = i < hd ? kv_q((const KV *)nullptr, qh[i]) : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (uint32_t p = p0 + warp; p < p1; p += ATT_WARPS) {
        const KV *kp = (const KV *)bt.k_base + kv_off(p, n_layer, layer, kvd) + (size_t)kvh * hd;
        const KV *vp = (const KV *)bt.v_base + kv_off(p, n_layer, layer, kvd) + (size_t)kvh * hd;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t i = lane + 32 * j;
            if (i < hd)
                s += qv[j] * kv_ld(kp, i);
        }
        s = att_softcap(warp_sum(s) * scale, cap);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn); /* 0 on the first position */
        const float e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t i = lane + 32 * j;
            if (i < hd)
                acc[j] = acc[j] * corr + e * kv_ld(vp, i);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const uint32_t i = lane + 32 * j;
        if (i < hd)
            sm_acc[warp][i] = acc[j];
    }
    __syncthreads();
    float x = -INFINITY, su = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        x = fmaxf(x, sm_m[w]);
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm_l[w] > 0.0f ? expf(sm_m[w] - x) : 0.0f; /* idle warps count 0 */
        su += sm_l[w] * f[w];
    }
    *mx = x;
    *sum = su;
}

/* One block per (token, head) over the positions it sees (att_first..pos,
 * att_range), written normalised. */
template <typename KV>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, uint32_t n_head,
                uint32_t n_head_kv, uint32_t hd, size_t stride, const float *q, float *out,
                float scale, float cap, uint32_t window)
{
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_HD];
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head;
    const be_tok_t bt = toks[t];
    float f[ATT_WARPS], mx, sum;
    att_range<KV>(bt, layer, n_layer, h / (n_head / n_head_kv), (size_t)n_head_kv * hd, hd,
                  q + t * stride + (size_t)h * hd, scale, cap, att_first(bt.pos, window),
                  bt.pos + 1, sm_m, sm_l, sm_acc, f, &mx, &sum);
    const float inv = 1.0f / sum;
    float *o = out + t * stride + (size_t)h * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += sm_acc[w][i] * f[w];
        o[i] = v * inv;
    }
}

/* Split attention, part 1: block (t * n_head + h, s) covers positions
 * [w + s * chunk, min(w + (s + 1) * chunk, pos + 1)) of token t, head h
 * (att_range), w = att_first(pos, window),
 * and writes the range's softmax maximum m, sum l (over exp(score - m)) and
 * unnormalised weighted V to
 * part[((t * n_head + h) * n_split + s) * (hd + 2) ...] = m, l, acc[hd].
 * An empty range writes m = -inf, l = 0. */
template <typename KV>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_att_part(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, uint32_t n_head,
               uint32_t n_head_kv, uint32_t hd, size_t stride, const float *q, float scale,
               float cap, uint32_t window, uint32_t chunk, float *part)
{
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_HD];
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head, s = blockIdx.y, n_split = gridDim.y;
    const be_tok_t bt = toks[t];
    const uint32_t p0 = att_first(bt.pos, window) + s * chunk;
    const uint32_t p1 = min(p0 + chunk, bt.pos + 1); /* p1 <= p0: empty */
    float f[ATT_WARPS], mx, sum;
    att_range<KV>(bt, layer, n_layer, h / (n_head / n_head_kv), (size_t)n_head_kv * hd, hd,
                  q + t * stride + (size_t)h * hd, scale, cap, p0, p1, sm_m, sm_l, sm_acc, f, &mx,
                  &sum);
    float *o = part + ((size_t)blockIdx.x * n_split + s) * (hd + 2);
    if (threadIdx.x == 0) {
        o[0] = mx;
        o[1] = sum;
    }
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += sm_acc[w][i] * f[w];
        o[2 + i] = v;
    }
}

/* Split attention, part 2: one block per (token, head) merges its n_split
 * partials: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M the
 * largest m_s of a non-empty range (range 0 never is: it holds the first
 * position the token sees). */
__global__ void k_att_merge(const float *part, uint32_t n_split, uint32_t n_head, uint32_t hd,
                            size_t stride, float *out)
{
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head;
    const float *ps = part + (size_t)blockIdx.x * n_split * (hd + 2);
    float mx = -INFINITY;
    for (uint32_t s = 0; s < n_split; s++)
        if (ps[s * (hd + 2) + 1] > 0.0f)
            mx = fmaxf(mx, ps[s * (hd + 2)]);
    float sum = 0.0f;
    for (uint32_t s = 0; s < n_split; s++) {
        const float l = ps[s * (hd + 2) + 1];
        if (l > 0.0f)
            sum += l * expf(ps[s * (hd + 2)] - mx);
    }
    const float inv = 1.0f / sum;
    float *o = out + t * stride + (size_t)h * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (uint32_t s = 0; s < n_split; s++) {
            const float *p = ps + s * (hd + 2);
            if (p[1] > 0.0f)
                v += p[2 + i] * expf(p[0] - mx);
        }
        o[i] = v * inv;
    }
}

__global__ void k_gather(float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                         uint32_t n, size_t stride)
{
    for (size_t r = blockIdx.x; r < n_rows; r += gridDim.x)
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            dst[r * stride + i] = src[(size_t)rows[r] * stride + i];
}

/* dst and src overlap: rows one after another, as the CPU's memmove loop
 * (rows n <= stride apart never partly overlap, so each row is a plain copy
 * or a no-op). Launched with one block. */
__global__ void k_gather_seq(float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                             uint32_t n, size_t stride)
{
    for (size_t r = 0; r < n_rows; r++) {
        const float *s = src + (size_t)rows[r] * stride;
        float *d = dst + r * stride;
        if (s != d)
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
                d[i] = s[i];
        __syncthreads();
    }
}

#include "cuda_quant.cuh"

/* ------------------------------------------------------------------ kernels (vtable) */

static int type_ok(uint32_t t)
{
    return t == GGUF_T_F32 || t == GGUF_T_F16 || t == GGUF_T_BF16 || t == GGUF_T_Q8_0 || qk_type(t);
}

/* Alignment the kernels' loads need for a weight of this type. */
static int weight_aligned(const be_tensor_t *w)
{
    uintptr_t a = (uintptr_t)w->data;
    return w->type == GGUF_T_F32 ? a % 4 == 0 : a % 2 == 0;
}

static int c_embed(void *ctx, const be_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,
                   size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    if (!tab->data || !type_ok(tab->type) || !weight_aligned(tab) ||
        !quant_row_bytes(tab->type, tab->n_in))
        return BE_ERR_ARG;
    for (size_t t = 0; t < n_tok; t++)
        if (ids[t] < 0 || (uint32_t)ids[t] >= tab->n_out)
            return BE_ERR_ARG; /* would read outside the table: a device fault */
    int rc = use_dev(c);
    if (rc)
        return rc;
    const void *d_ids;
    if ((rc = stage_put(c, STAGE_IDS, ids, n_tok * sizeof *ids, &d_ids)))
        return rc;
    size_t rb = quant_row_bytes(tab->type, tab->n_in);
    const uint8_t *w = (const uint8_t *)tab->data;
    const int32_t *di = (const int32_t *)d_ids;
    unsigned g = grid_y(n_tok);
    switch (tab->type) {
    case GGUF_T_F32:
        k_embed<GGUF_T_F32>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_F16:
        k_embed<GGUF_T_F16>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_BF16:
        k_embed<GGUF_T_BF16>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_Q8_0:
        k_embed<GGUF_T_Q8_0>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    default:
        qk_embed_launch(tab->type, g, c->compute, w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    }
    return launch_rc();
}

static int c_rmsnorm(void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,
                     size_t stride, float eps)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    k_rmsnorm<<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(out, x, w, n_tok, (uint32_t)n, stride,
                                                            eps);
    return launch_rc();
}

static int gemv_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in);
    const uint8_t *wd = (const uint8_t *)w->data;
    const bool aligned16 = (uintptr_t)wd % 16 == 0 && rb % 16 == 0;
    const bool vec = aligned16 && (w->type == GGUF_T_F32 ? w->n_in % 4 == 0 : w->n_in % 8 == 0);
    const size_t max_tok = (size_t)GRID_Y_MAX * MM_TOK;
    for (size_t t0 = 0; t0 < n_tok; t0 += max_tok) {
        const uint32_t nt = (uint32_t)(n_tok - t0 < max_tok ? n_tok - t0 : max_tok);
        const dim3 grid((unsigned)((w->n_out + MM_WARPS - 1) / MM_WARPS),
                        (nt + MM_TOK - 1) / MM_TOK);
        const float *xt = x + t0 * xs;
        float *yt = jb->y + t0 * jb->y_stride;
#define GEMV(T, V)                                                                                 \
    k_gemv<T, V><<<grid, MM_WARPS * 32, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt, xs, yt,    \
                                                         jb->y_stride, nt)
        switch (w->type) {
        case GGUF_T_F32:
            if (vec)
                GEMV(GGUF_T_F32, true);
            else
                GEMV(GGUF_T_F32, false);
            break;
        case GGUF_T_F16:
            if (vec)
                GEMV(GGUF_T_F16, true);
            else
                GEMV(GGUF_T_F16, false);
            break;
        case GGUF_T_BF16:
            if (vec)
                GEMV(GGUF_T_BF16, true);
            else
                GEMV(GGUF_T_BF16, false);
            break;
        case GGUF_T_Q8_0: GEMV(GGUF_T_Q8_0, false); break;
        default:
            qk_gemv_launch(w->type, grid, c->compute, wd, rb, w->n_in, w->n_out, xt, xs, yt,
                           jb->y_stride, nt);
            break;
        }
#undef GEMV
        int rc = launch_rc();
        if (rc)
            return rc;
    }
    return 0;
}

/* x rounded to the weight's half type, dense (n_tok, n_in), in c->xh. */
static int to_half(cu_ctx_t *c, uint32_t type, const float *x, size_t xs, uint32_t n_in,
                   size_t n_tok)
{
    size_t need = n_tok * n_in * sizeof(uint16_t);
    int rc;
    if (need > c->xh_cap) {
        if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
            return rc;
        if (c->xh)
            cudaFree(c->xh);
        c->xh = NULL;
        c->xh_cap = 0;
        size_t cap = need < (1u << 20) ? (1u << 20) : need;
        if ((rc = rt_rc(cudaMalloc(&c->xh, cap))))
            return rc;
        c->xh_cap = cap;
    }
    dim3 grid(grid_x(n_in, EW_THREADS), grid_y(n_tok));
    if (type == GGUF_T_F16)
        k_to_half<GGUF_T_F16>
            <<<grid, EW_THREADS, 0, c->compute>>>((uint16_t *)c->xh, x, xs, n_in, n_tok);
    else
        k_to_half<GGUF_T_BF16>
            <<<grid, EW_THREADS, 0, c->compute>>>((uint16_t *)c->xh, x, xs, n_in, n_tok);
    return launch_rc();
}

/* Row-major W (n_out, n_in) is column-major (n_in, n_out) with ld n_in, and
 * the token rows of x / y are column-major (n_in, n_tok) / (n_out, n_tok)
 * with ld x_stride / y_stride, so Y = op(A)·B with A = W transposed. */
static int gemm_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok,
                       uint32_t *xh_type, uint32_t *xh_n_in)
{
    const be_tensor_t *w = jb->w;
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    int ldb = (int)xs;
    cudaDataType ab = CUDA_R_32F;
    if (w->type != GGUF_T_F32) {
        if (*xh_type != w->type || *xh_n_in != w->n_in) {
            int rc = to_half(c, w->type, x, xs, w->n_in, n_tok);
            if (rc)
                return rc;
            *xh_type = w->type;
            *xh_n_in = w->n_in;
        }
        b = c->xh;
        ldb = (int)w->n_in;
        ab = w->type == GGUF_T_F16 ? CUDA_R_16F : CUDA_R_16BF;
    }
    cublasStatus_t st =
        c->blas.gemm_ex(c->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, (int)n_tok,
                        (int)w->n_in, &one, w->data, ab, (int)w->n_in, b, ab, ldb, &zero, jb->y,
                        CUDA_R_32F, (int)jb->y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
        return BE_ERR_NOMEM;
    return st == CUBLAS_STATUS_SUCCESS ? 0 : BE_ERR_DEVICE;
}

/* A block-type weight through cuBLAS: up to QK_HALF_MAX bytes of its rows
 * at a time dequantized to F16 in c->wh, x rounded to F16 in c->xh, F32
 * accumulation (as an F16 weight's GEMM). */
static int qk_gemm_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok,
                          uint32_t *xh_type, uint32_t *xh_n_in)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in), half_row = (size_t)w->n_in * 2;
    size_t rows = QK_HALF_MAX / half_row;
    rows = rows < 1 ? 1 : rows > w->n_out ? w->n_out : rows;
    int rc;
    if (rows * half_row > c->wh_cap) {
        if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
            return rc;
        if (c->wh)
            cudaFree(c->wh);
        c->wh = NULL;
        c->wh_cap = 0;
        if ((rc = rt_rc(cudaMalloc(&c->wh, rows * half_row))))
            return rc;
        c->wh_cap = rows * half_row;
    }
    if (*xh_type != GGUF_T_F16 || *xh_n_in != w->n_in) {
        if ((rc = to_half(c, GGUF_T_F16, x, xs, w->n_in, n_tok)))
            return rc;
        *xh_type = GGUF_T_F16;
        *xh_n_in = w->n_in;
    }
    const float one = 1.0f, zero = 0.0f;
    for (size_t r0 = 0; r0 < w->n_out; r0 += rows) {
        const size_t nr = w->n_out - r0 < rows ? w->n_out - r0 : rows;
        const dim3 grid(grid_x(w->n_in / QK_CHUNK, EW_THREADS), grid_y(nr));
        qk_half_launch(w->type, grid, c->compute, (uint16_t *)c->wh,
                       (const uint8_t *)w->data + r0 * rb, rb, w->n_in, nr);
        if ((rc = launch_rc()))
            return rc;
        cublasStatus_t st = c->blas.gemm_ex(
            c->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n_tok, (int)w->n_in, &one, c->wh,
            CUDA_R_16F, (int)w->n_in, c->xh, CUDA_R_16F, (int)w->n_in, &zero, jb->y + r0,
            CUDA_R_32F, (int)jb->y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st == CUBLAS_STATUS_ALLOC_FAILED)
            return BE_ERR_NOMEM;
        if (st != CUBLAS_STATUS_SUCCESS)
            return BE_ERR_DEVICE;
    }
    return 0;
}

/* The GEMM without cuBLAS: k_gemm_tiled over tiles of rows and tokens. */
static int tiled_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in);
    const uint8_t *wd = (const uint8_t *)w->data;
    const size_t max_tok = (size_t)GRID_Y_MAX * GEMM_TILE;
    const dim3 block(GEMM_TILE, GEMM_TILE);
    for (size_t t0 = 0; t0 < n_tok; t0 += max_tok) {
        const uint32_t nt = (uint32_t)(n_tok - t0 < max_tok ? n_tok - t0 : max_tok);
        const dim3 grid((unsigned)((w->n_out + GEMM_TILE - 1) / GEMM_TILE),
                        (nt + GEMM_TILE - 1) / GEMM_TILE);
        const float *xt = x + t0 * xs;
        float *yt = jb->y + t0 * jb->y_stride;
        switch (w->type) {
        case GGUF_T_F32:
            k_gemm_tiled<GGUF_T_F32><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                     xs, yt, jb->y_stride, nt);
            break;
        case GGUF_T_F16:
            k_gemm_tiled<GGUF_T_F16><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                     xs, yt, jb->y_stride, nt);
            break;
        case GGUF_T_BF16:
            k_gemm_tiled<GGUF_T_BF16><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                      xs, yt, jb->y_stride, nt);
            break;
        default: return BE_ERR_ARG; /* Q8_0 and the block types take the GEMV kernel */
        }
        int rc = launch_rc();
        if (rc)
            return rc;
    }
    return 0;
}

static int c_matmul(void *ctx, const be_mm_t *jobs, int n_jobs, const float *x, size_t x_stride,
                    size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    for (int j = 0; j < n_jobs; j++) {
        const be_tensor_t *w = jobs[j].w;
        if (!w->data || !type_ok(w->type) || !weight_aligned(w) ||
            !quant_row_bytes(w->type, w->n_in))
            return BE_ERR_ARG;
    }
    int rc = use_dev(c);
    if (rc)
        return rc;
    /* c->xh holds x rounded to this type and width, within this call */
    uint32_t xh_type = UINT32_MAX, xh_n_in = 0;
    for (int j = 0; j < n_jobs && !rc; j++) {
        const be_mm_t *jb = &jobs[j];
        const be_tensor_t *w = jb->w;
        if (w->n_out == 0)
            continue;
        /* block types: cuBLAS on F16 tiles of the weight, else the GEMV */
        const bool blocks = qk_type(w->type);
        const bool gemm = n_tok >= MM_GEMM_MIN_TOK && w->type != GGUF_T_Q8_0 &&
                          (!blocks || c->blas.h) && w->n_in > 0 && x_stride >= w->n_in &&
                          jb->y_stride >= w->n_out && x_stride <= INT32_MAX &&
                          jb->y_stride <= INT32_MAX && n_tok <= INT32_MAX && w->n_in <= INT32_MAX &&
                          w->n_out <= INT32_MAX;
        if (!gemm)
            rc = gemv_launch(c, jb, x, x_stride, n_tok);
        else if (blocks)
            rc = qk_gemm_launch(c, jb, x, x_stride, n_tok, &xh_type, &xh_n_in);
        else if (c->blas.h)
            rc = gemm_launch(c, jb, x, x_stride, n_tok, &xh_type, &xh_n_in);
        else
            rc = tiled_launch(c, jb, x, x_stride, n_tok);
    }
    return rc;
}

/* The three row-wise element kernels (y op= x over n_tok rows of n) share
 * their checks and launch shape. */
typedef void (*ew_kernel_t)(float *, const float *, size_t, uint32_t, size_t);

static int ew_launch(void *ctx, ew_kernel_t k, float *y, const float *x, size_t n_tok, size_t n,
                     size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    k<<<dim3(grid_x(n, EW_THREADS), grid_y(n_tok)), EW_THREADS, 0, c->compute>>>(
        y, x, n_tok, (uint32_t)n, stride);
    return launch_rc();
}

static int c_add_bias(void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_add_bias, y, b, n_tok, n, stride);
}

static int c_add(void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_add, x, y, n_tok, n, stride);
}

static int c_silu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_silu_mul, g, u, n_tok, n, stride);
}

static int c_rope(void *ctx, float *v, size_t n_tok, size_t stride, uint32_t n_heads,
                  const uint32_t *pos, const be_rope_t *hp)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || hp->rope_dim < 2 || n_heads == 0)
        return 0;
    if (hp->rope_dim > hp->head_dim)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    const void *d_pos;
    if ((rc = stage_put(c, STAGE_POS, pos, n_tok * sizeof *pos, &d_pos)))
        return rc;
    const void *d_freqs = NULL;
    if (hp->rope_freqs && (rc = stage_put(c, STAGE_FREQS, hp->rope_freqs,
                                          hp->rope_dim / 2 * sizeof(float), &d_freqs)))
        return rc;
    size_t total = n_tok * (hp->rope_dim / 2);
    k_rope<<<grid_x(total, EW_THREADS), EW_THREADS, 0, c->compute>>>(
        v, n_tok, stride, n_heads, hp->head_dim, hp->rope_dim, hp->rope_base,
        hp->rope_freq_scale != 0.0f ? hp->rope_freq_scale : 1.0f, hp->rope_neox,
        (const uint32_t *)d_pos, (const float *)d_freqs,
        hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f, hp->rope_ext_factor,
        hp->rope_corr_lo, hp->rope_corr_hi);
    return launch_rc();
}

/* Host-side checks of the attention operands (a bad position or head shape
 * would fault the device, which is fatal to the whole context). */
static int att_check(const be_att_t *a, size_t n_tok)
{
    if (a->n_head == 0 || a->n_head_kv == 0 || a->n_head % a->n_head_kv || a->head_dim == 0 ||
        a->head_dim > ATT_MAX_HD || a->layer >= a->n_layer ||
        (a->kv_type != KV_TYPE_F16 && a->kv_type != KV_TYPE_F32))
        return BE_ERR_ARG;
    if (n_tok * a->n_head > (size_t)INT32_MAX)
        return BE_ERR_ARG;
    for (size_t t = 0; t < n_tok; t++) {
        const be_tok_t *bt = &a->toks[t];
        if (!bt->k_base || !bt->v_base || bt->pos >= bt->n_ctx)
            return BE_ERR_ARG;
    }
    return 0;
}

static int c_kv_store(void *ctx, const be_att_t *a, const float *k, const float *v, size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    int rc = att_check(a, n_tok);
    if (rc || (rc = use_dev(c)))
        return rc;
    const void *d_toks;
    if ((rc = stage_put(c, STAGE_TOKS, a->toks, n_tok * sizeof *a->toks, &d_toks)))
        return rc;
    const be_tok_t *dt = (const be_tok_t *)d_toks;
    const size_t kvd = (size_t)a->n_head_kv * a->head_dim;
    if (a->kv_type == KV_TYPE_F16)
        k_kv_store<__half><<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(
            dt, a->layer, a->n_layer, kvd, a->stride, k, v, n_tok);
    else
        k_kv_store<float><<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(
            dt, a->layer, a->n_layer, kvd, a->stride, k, v, n_tok);
    return launch_rc();
}

/* How many position ranges split attention cuts each (token, head) into (1:
 * no split, k_attention), and *chunk, positions per range: few (token, head)
 * blocks over a long context are split so the device has blocks enough to
 * fill it (decode), many are not (prefill). */
static uint32_t att_splits(const be_att_t *a, size_t n_tok, uint32_t *chunk)
{
    const size_t nb = n_tok * a->n_head;
    uint32_t max_span = 0; /* positions the widest token sees (its window) */
    for (size_t t = 0; t < n_tok; t++) {
        const uint32_t span = a->toks[t].pos - att_first(a->toks[t].pos, a->window);
        max_span = span > max_span ? span : max_span;
    }
    const size_t n_pos = (size_t)max_span + 1;
    size_t n = nb >= ATT_SPLIT_BLOCKS ? 1 : (ATT_SPLIT_BLOCKS + nb - 1) / nb;
    const size_t by_len = n_pos / ATT_SPLIT_MIN_POS; /* every range at least ATT_SPLIT_MIN_POS */
    n = n < by_len ? n : by_len;
    n = n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
    if (n <= 1)
        return 1;
    *chunk = (uint32_t)((n_pos + n - 1) / n);
    return (uint32_t)((n_pos + *chunk - 1) / *chunk);
}

static int c_attention(void *ctx, const be_att_t *a, const float *q, float *out, size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    int rc = att_check(a, n_tok);
    if (rc || (rc = use_dev(c)))
        return rc;
    const void *d_toks;
    if ((rc = stage_put(c, STAGE_TOKS, a->toks, n_tok * sizeof *a->toks, &d_toks)))
        return rc;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    const float cap = a->softcap;
    if (cap < 0.0f)
        return BE_ERR_ARG;
    const unsigned nb = (unsigned)(n_tok * a->n_head);
    const be_tok_t *dt = (const be_tok_t *)d_toks;
    uint32_t chunk = 0;
    const uint32_t n_split = att_splits(a, n_tok, &chunk);
    if (n_split > 1) {
        const size_t need = (size_t)nb * n_split * (a->head_dim + 2) * sizeof(float);
        if (need > c->att_part_cap) {
            if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
                return rc;
            if (c->att_part)
                cudaFree(c->att_part);
            c->att_part = NULL;
            c->att_part_cap = 0;
            if ((rc = rt_rc(cudaMalloc((void **)&c->att_part, need))))
                return rc;
            c->att_part_cap = need;
        }
        const dim3 grid(nb, n_split);
        if (a->kv_type == KV_TYPE_F16)
            k_att_part<__half><<<grid, ATT_WARPS * 32, 0, c->compute>>>(
                dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, scale,
                cap, a->window, chunk, c->att_part);
        else
            k_att_part<float><<<grid, ATT_WARPS * 32, 0, c->compute>>>(
                dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, scale,
                cap, a->window, chunk, c->att_part);
        if ((rc = launch_rc()))
            return rc;
        k_att_merge<<<nb, 128, 0, c->compute>>>(c->att_part, n_split, a->n_head, a->head_dim,
                                                a->stride, out);
        return launch_rc();
    }
    if (a->kv_type == KV_TYPE_F16)
        k_attention<__half><<<nb, ATT_WARPS * 32, 0, c->compute>>>(
            dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, out,
            scale, cap, a->window);
    else
        k_attention<float><<<nb, ATT_WARPS * 32, 0, c->compute>>>(
            dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, out,
            scale, cap, a->window);
    return launch_rc();
}

static int c_gather(void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                    size_t n, size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_rows == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX || n > stride)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    uint32_t max_row = 0;
    for (size_t r = 0; r < n_rows; r++)
        if (rows[r] > max_row)
            max_row = rows[r];
    const void *d_rows;
    if ((rc = stage_put(c, STAGE_ROWS, rows, n_rows * sizeof *rows, &d_rows)))
        return rc;
    uintptr_t d0 = (uintptr_t)dst, d1 = (uintptr_t)(dst + (n_rows - 1) * stride + n);
    uintptr_t s0 = (uintptr_t)src, s1 = (uintptr_t)(src + (size_t)max_row * stride + n);
    if (d0 < s1 && s0 < d1)
        k_gather_seq<<<1, EW_THREADS, 0, c->compute>>>(dst, src, (const uint32_t *)d_rows, n_rows,
                                                       (uint32_t)n, stride);
    else
        k_gather<<<grid_y(n_rows), EW_THREADS, 0, c->compute>>>(dst, src, (const uint32_t *)d_rows,
                                                                n_rows, (uint32_t)n, stride);
    return launch_rc();
}

/* ------------------------------------------------------------------ open / close */

static void c_close(void *ctxp)
{
    cu_ctx_t *c = (cu_ctx_t *)ctxp;
    if (!c)
        return;
    cudaSetDevice(c->dev);
    /* no copy callback may run after c is gone */
    if (c->copy)
        cudaStreamSynchronize(c->copy);
    if (c->compute)
        cudaStreamSynchronize(c->compute);
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
    if (c->xh)
        cudaFree(c->xh);
    if (c->wh)
        cudaFree(c->wh);
    if (c->att_part)
        cudaFree(c->att_part);
    if (c->blas.h)
        c->blas.destroy(c->blas.h);
    blas_unload(&c->blas);
    if (c->copy)
        cudaStreamDestroy(c->copy);
    if (c->compute)
        cudaStreamDestroy(c->compute);
    cudaGetLastError();
    pthread_mutex_destroy(&c->mu);
    delete c;
}

static int load_entry(const char *sym, void **fn)
{
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    *fn = NULL;
    cudaError_t e =
        cudaGetDriverEntryPointByVersion(sym, fn, CUDART_VERSION, cudaEnableDefault, &q);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return q == cudaDriverEntryPointSuccess && *fn ? 0 : -1;
}

static int load_driver(cu_drv_t *d, char *err, size_t errlen)
{
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"cuDeviceGet", (void **)&d->device_get},
        {"cuDeviceGetAttribute", (void **)&d->device_get_attribute},
        {"cuMemGetAllocationGranularity", (void **)&d->granularity},
        {"cuMemAddressReserve", (void **)&d->address_reserve},
        {"cuMemAddressFree", (void **)&d->address_free},
        {"cuMemCreate", (void **)&d->create},
        {"cuMemRelease", (void **)&d->release},
        {"cuMemMap", (void **)&d->map},
        {"cuMemUnmap", (void **)&d->unmap},
        {"cuMemSetAccess", (void **)&d->set_access},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        if (load_entry(syms[i].name, syms[i].fn)) {
            snprintf(err, errlen, "cuda backend: driver entry point %s not available",
                     syms[i].name);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ cuBLAS location */

#define CUBLAS_MAJOR (CUDART_VERSION / 1000)
/* RTLD_NODELETE: the cuBLAS libraries carry their own C++ runtime state and
 * are not unloaded by dlclose (LeakSanitizer can then still name them). */
#define BLAS_DLOPEN (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

static void blas_unload(cu_blas_t *b)
{
    if (b->lib)
        dlclose(b->lib);
    if (b->lt)
        dlclose(b->lt);
    b->lib = b->lt = NULL;
}

/* Loads one candidate file (a path, or a bare name for the loader's own
 * search) and checks it: every symbol used, the major version this build's
 * runtime goes with. 0 when usable; otherwise why not in note. */
static int blas_try(cu_blas_t *b, const char *file, char *note, size_t notelen)
{
    const char *slash = strrchr(file, '/');
    if (slash) {
        /* libcublas needs libcublasLt; the toolkit's copy may carry no
         * RUNPATH to find it beside itself, so it is loaded first */
        char lt[600];
        snprintf(lt, sizeof lt, "%.*s/libcublasLt.so.%d", (int)(slash - file), file, CUBLAS_MAJOR);
        if (access(lt, R_OK) == 0)
            b->lt = dlopen(lt, BLAS_DLOPEN);
    }
    b->lib = dlopen(file, BLAS_DLOPEN);
    if (!b->lib) {
        const char *e = dlerror();
        snprintf(note, notelen, "%s", e ? e : "dlopen failed");
        blas_unload(b);
        return -1;
    }
    b->create = (pfn_cublas_create)dlsym(b->lib, "cublasCreate_v2");
    b->destroy = (pfn_cublas_destroy)dlsym(b->lib, "cublasDestroy_v2");
    b->set_stream = (pfn_cublas_set_stream)dlsym(b->lib, "cublasSetStream_v2");
    b->set_math_mode = (pfn_cublas_set_math_mode)dlsym(b->lib, "cublasSetMathMode");
    b->gemm_ex = (pfn_cublas_gemm_ex)dlsym(b->lib, "cublasGemmEx");
    b->get_property = (pfn_cublas_get_property)dlsym(b->lib, "cublasGetProperty");
    if (!b->create || !b->destroy || !b->set_stream || !b->gemm_ex || !b->get_property) {
        snprintf(note, notelen, "%s lacks cublasCreate_v2/cublasGemmEx/cublasGetProperty", file);
        blas_unload(b);
        return -1;
    }
    if (b->get_property(MAJOR_VERSION, &b->ver[0]) != CUBLAS_STATUS_SUCCESS ||
        b->get_property(MINOR_VERSION, &b->ver[1]) != CUBLAS_STATUS_SUCCESS ||
        b->get_property(PATCH_LEVEL, &b->ver[2]) != CUBLAS_STATUS_SUCCESS) {
        snprintf(note, notelen, "%s: cublasGetProperty failed", file);
        blas_unload(b);
        return -1;
    }
    if (b->ver[0] != CUBLAS_MAJOR) {
        snprintf(note, notelen, "%s is cuBLAS %d.%d, this build needs %d.x", file, b->ver[0],
                 b->ver[1], CUBLAS_MAJOR);
        blas_unload(b);
        return -1;
    }
    struct link_map *lm = NULL;
    if (dlinfo(b->lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(b->path, sizeof b->path, "%s", lm->l_name);
    else
        snprintf(b->path, sizeof b->path, "%s", file);
    return 0;
}

/* Tries the files matching a glob pattern in order; 0 once one loads. */
static int blas_try_glob(cu_blas_t *b, const char *pattern, char *note, size_t notelen)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = -1;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && rc; i++)
            rc = blas_try(b, g.gl_pathv[i], note, notelen);
    globfree(&g);
    return rc;
}

/* Finds cuBLAS: GPUSWAPD_CUBLAS (a file, or "none" for the own kernels), the
 * loader's search (LD_LIBRARY_PATH, the ldconfig cache, system folders), the
 * CUDA install ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda*), then pip's
 * nvidia/<pkg>/lib folders under the usual site-packages. 0 with b->lib set,
 * 0 with b->lib NULL and the reason in b->note (own kernels), or -1 with err
 * when GPUSWAPD_CUBLAS names a file that cannot be used. */
static int blas_locate(cu_blas_t *b, char *err, size_t errlen)
{
    char name[64], note[512] = "", pat[1024];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_MAJOR);
    const char *env = getenv("GPUSWAPD_CUBLAS");
    if (env && *env) {
        if (!strcmp(env, "none") || !strcmp(env, "off") || !strcmp(env, "0")) {
            snprintf(b->note, sizeof b->note, "disabled by GPUSWAPD_CUBLAS=%s", env);
            return 0;
        }
        if (blas_try(b, env, note, sizeof note)) {
            snprintf(err, errlen, "cuda backend: GPUSWAPD_CUBLAS=%s cannot be used: %s", env, note);
            return -1;
        }
        return 0;
    }
    char first[512] = ""; /* the first reason a file that exists was refused */
#define BLAS_TRY(call)                                                                             \
    do {                                                                                           \
        note[0] = 0;                                                                               \
        if ((call) == 0)                                                                           \
            return 0;                                                                              \
        if (!first[0] && note[0] &&                                                                \
            ((!strstr(note, "No such file") && !strstr(note, "cannot open shared object")) ||      \
             strstr(note, "libcublasLt")))                                                         \
            snprintf(first, sizeof first, "%s", note);                                             \
    } while (0)
    BLAS_TRY(blas_try(b, name, note, sizeof note));
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof homes / sizeof homes[0]; i++) {
        if (!homes[i] || !*homes[i])
            continue;
        snprintf(pat, sizeof pat, "%s/lib64/%s", homes[i], name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
        snprintf(pat, sizeof pat, "%s/targets/*/lib/%s", homes[i], name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    }
    snprintf(pat, sizeof pat, "/usr/local/cuda-%d*/lib64/%s", CUBLAS_MAJOR, name);
    BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    /* pip wheels: nvidia/cublas/lib (CUDA 12 layout) or nvidia/cu13/lib */
    const char *prefixes[] = {
        getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), getenv("HOME"), "/usr/local", "/usr",
        "/opt/conda"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (!prefixes[i] || !*prefixes[i])
            continue;
        const char *mid = i == 2 ? "/.local/lib" : "/lib";
        snprintf(pat, sizeof pat, "%s%s/python3*/site-packages/nvidia/*/lib/%s", prefixes[i], mid,
                 name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
        snprintf(pat, sizeof pat, "%s%s/python3*/dist-packages/nvidia/*/lib/%s", prefixes[i], mid,
                 name);
        BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
    }
    snprintf(pat, sizeof pat, "/usr/lib/python3/dist-packages/nvidia/*/lib/%s", name);
    BLAS_TRY(blas_try_glob(b, pat, note, sizeof note));
#undef BLAS_TRY
    if (first[0])
        snprintf(b->note, sizeof b->note, "no usable %s (%s)", name, first);
    else
        snprintf(b->note, sizeof b->note,
                 "%s not found in the loader path, the CUDA install or pip nvidia/*/lib folders",
                 name);
    return 0;
}

/* The handle on the compute stream; on failure cuBLAS is dropped (own
 * kernels) with the reason in b->note. */
static void blas_start(cu_blas_t *b, cudaStream_t stream)
{
    if (!b->lib)
        return;
    if (b->create(&b->h) != CUBLAS_STATUS_SUCCESS) {
        b->h = NULL;
        snprintf(b->note, sizeof b->note, "cublasCreate failed with %s", b->path);
    } else if (b->set_stream(b->h, stream) != CUBLAS_STATUS_SUCCESS ||
               (b->set_math_mode &&
                b->set_math_mode(b->h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)) {
        b->destroy(b->h);
        b->h = NULL;
        snprintf(b->note, sizeof b->note, "cannot configure the cuBLAS handle of %s", b->path);
    }
    if (!b->h)
        blas_unload(b);
}

extern "C" int be_cuda_cublas_find(char *what, size_t whatlen)
{
    cu_blas_t b;
    memset(&b, 0, sizeof b);
    char err[1200] = "";
    if (blas_locate(&b, err, sizeof err)) {
        snprintf(what, whatlen, "%s", err);
        return BE_ERR_ARG;
    }
    int found = b.lib != NULL;
    if (found)
        snprintf(what, whatlen, "cuBLAS %d.%d.%d (%s)", b.ver[0], b.ver[1], b.ver[2], b.path);
    else
        snprintf(what, whatlen, "none: %s", b.note);
    blas_unload(&b);
    return found;
}

/* ------------------------------------------------------------------ probe */

/* Appends ", item" (or "item" first) to the string in out. */
static void list_add(char *out, size_t outlen, const char *item)
{
    size_t l = strlen(out);
    if (l + 1 < outlen)
        snprintf(out + l, outlen - l, "%s%s", l ? ", " : "", item);
}

/* The /dev/nvidia* nodes the runtime needs that are missing, into out. */
static void missing_nodes(char *out, size_t outlen)
{
    out[0] = 0;
    if (access("/dev/nvidiactl", F_OK) != 0)
        list_add(out, outlen, "/dev/nvidiactl");
    if (access("/dev/nvidia-uvm", F_OK) != 0)
        list_add(out, outlen, "/dev/nvidia-uvm");
    glob_t g;
    memset(&g, 0, sizeof g);
    int found = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    if (!found)
        list_add(out, outlen, "/dev/nvidia<N>");
}

extern "C" int be_cuda_probe_status(char *why, size_t whylen)
{
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) {
        snprintf(why, whylen, "%d CUDA device%s visible", n, n == 1 ? "" : "s");
        return n;
    }
    cudaGetLastError();
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = CUDART_VERSION;
    cudaGetLastError();
    char drvs[160], nodes[160];
    if (drv == 0)
        snprintf(drvs, sizeof drvs, "no CUDA driver (libcuda.so.1 not found or not loadable)");
    else if (drv < rt)
        snprintf(drvs, sizeof drvs, "driver supports CUDA %d.%d, older than the runtime's %d.%d",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    else
        snprintf(drvs, sizeof drvs, "driver supports CUDA %d.%d", drv / 1000, drv % 1000 / 10);
    missing_nodes(nodes, sizeof nodes);
    snprintf(why, whylen,
             "no usable CUDA device: cudaGetDeviceCount: %s (%s, %d devices); %s; runtime %d.%d "
             "(linked statically); device nodes: %s%s",
             e == cudaSuccess ? "no error" : cudaGetErrorString(e),
             e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e), n, drvs, rt / 1000,
             rt % 1000 / 10, nodes[0] ? nodes : "all present", nodes[0] ? " missing" : "");
    return 0;
}

/* c->desc: the GPU, driver and runtime, VMM granularity, peak memory
 * bandwidth (memory clock x bus width) and which GEMM runs prefill. */
static void describe(cu_ctx_t *c, size_t gran)
{
    cudaDeviceProp prop;
    int drv = 0, rt = 0, mclk = 0, bus = 0;
    if (cudaGetDeviceProperties(&prop, c->dev) != cudaSuccess) {
        memset(&prop, 0, sizeof prop);
        snprintf(prop.name, sizeof prop.name, "GPU %d", c->dev);
    }
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, c->dev);     /* kHz */
    cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, c->dev); /* bits */
    cudaGetLastError();
    const double peak_gbs = 2.0 * (double)mclk * 1e3 * (double)bus / 8.0 / 1e9;
    char gemm[1200];
    if (c->blas.h)
        snprintf(gemm, sizeof gemm, "cuBLAS %d.%d.%d (%s)", c->blas.ver[0], c->blas.ver[1],
                 c->blas.ver[2], c->blas.path);
    else
        snprintf(gemm, sizeof gemm, "own tiled kernel, slower prefill (cuBLAS: %s)", c->blas.note);
    snprintf(c->desc, sizeof c->desc,
             "%s (compute %d.%d, %d SMs, %.1f GiB, peak memory bandwidth %.0f GB/s), driver CUDA "
             "%d.%d, runtime %d.%d, VMM granularity %zu KiB; prefill GEMM: %s",
             prop.name, prop.major, prop.minor, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / 1073741824.0, peak_gbs, drv / 1000, drv % 1000 / 10,
             rt / 1000, rt % 1000 / 10, gran >> 10, gemm);
}

extern "C" int be_cuda_probe(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0 ? n : 0;
}

/* The slots in be_ops_t order (designated initializers in declaration order, as C++ wants). */
static const be_ops_t cuda_ops = {
    .reserve = c_reserve,
    .map = c_map,
    .unmap = c_unmap,
    .release = c_release,
    .host_alloc = c_host_alloc,
    .host_free = c_host_free,
    .event_new = c_event_new,
    .event_free = c_event_free,
    .copy_h2d = c_copy_h2d,
    .wait = c_wait,
    .event_done = c_event_done,
    .event_times = c_event_times,
    .sync = c_sync,
    .buf_alloc = c_buf_alloc,
    .buf_free = c_buf_free,
    .download = c_download,
    .upload = c_upload,
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .matmul = c_matmul,
    .add_bias = c_add_bias,
    .rope = c_rope,
    .kv_store = c_kv_store,
    .attention = c_attention,
    .silu_mul = c_silu_mul,
    .add = c_add,
    .gather = c_gather,
    .scale = c_scale, /* cuda_arch.cuh */
    .softcap = c_softcap,
    .gelu_mul = c_gelu_mul,
    .inject = nullptr, /* no fault injection: be_open supplies the fallback */
    .close = c_close,
};

extern "C" backend_t *be_cuda_open(const be_params_t *p, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
        cudaGetLastError();
        snprintf(err, errlen, "cuda backend: no CUDA device visible");
        return NULL;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "cuda backend: CUDA driver not available: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        return NULL;
    }
    if (p->gpu < 0 || p->gpu >= n) {
        snprintf(err, errlen, "cuda backend: GPU %d requested, %d visible", p->gpu, n);
        return NULL;
    }
    backend_t *be = (backend_t *)calloc(1, sizeof *be);
    cu_ctx_t *c = new (std::nothrow) cu_ctx_t();
    if (!be || !c) {
        free(be);
        delete c;
        snprintf(err, errlen, "cuda backend: out of memory");
        return NULL;
    }
    c->dev = p->gpu;
    c->copies_done.store(0);
    pthread_mutex_init(&c->mu, NULL);

    int major = 0, minor = 0, vmm = 0;
    CUdevice cd = 0;
    size_t gran = 0, free_b = 0, total_b = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if ((e = cudaSetDevice(c->dev)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot use GPU %d: %s", c->dev, cudaGetErrorString(e));
        goto fail;
    }
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->dev) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot query GPU %d", c->dev);
        goto fail;
    }
    if (major < 8) {
        snprintf(err, errlen,
                 "cuda backend: GPU %d has compute capability %d.%d; this build needs 8.0+", c->dev,
                 major, minor);
        goto fail;
    }
    if (load_driver(&c->drv, err, errlen))
        goto fail;
    if (c->drv.device_get(&cd, c->dev) != CUDA_SUCCESS ||
        c->drv.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    cd) != CUDA_SUCCESS ||
        !vmm) {
        snprintf(err, errlen, "cuda backend: GPU %d does not support virtual memory management",
                 c->dev);
        goto fail;
    }
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->dev;
    if (c->drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        !gran) {
        snprintf(err, errlen, "cuda backend: cannot query the VMM allocation granularity");
        goto fail;
    }
    /* the page is the requested size (default 2 MiB) rounded up to the
     * granularity, and the pool budget is a whole number of pages */
    c->page = p->page_size ? p->page_size : CU_DEFAULT_PAGE;
    c->page = (c->page + gran - 1) / gran * gran;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cudaMemGetInfo: %s", cudaGetErrorString(e));
        goto fail;
    }
    if (p->memory == 0) {
        c->budget = (size_t)((double)free_b * CU_AUTO_POOL_SHARE);
    } else if (p->memory > free_b) {
        snprintf(
            err, errlen,
            "cuda backend: device memory budget of %zu bytes exceeds the %zu bytes free on GPU %d"
            " (scratch buffers need headroom too)",
            p->memory, free_b, c->dev);
        goto fail;
    } else {
        c->budget = p->memory;
    }
    c->budget = c->budget / c->page * c->page;
    if (c->budget == 0) {
        snprintf(err, errlen,
                 "cuda backend: device memory budget is smaller than one %zu-byte page", c->page);
        goto fail;
    }
    if (blas_locate(&c->blas, err, errlen))
        goto fail;
    if ((e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot create streams: %s", cudaGetErrorString(e));
        goto fail;
    }
    for (int k = 0; k < STAGE_N; k++) {
        if ((e = cudaEventCreateWithFlags(&c->stage[k].ev, cudaEventDisableTiming)) !=
            cudaSuccess) {
            c->stage[k].ev = NULL;
            snprintf(err, errlen, "cuda backend: cannot create events: %s", cudaGetErrorString(e));
            goto fail;
        }
    }
    blas_start(&c->blas, c->compute);
    c->t0 = now_s();
    describe(c, gran);

    be->name = "cuda";
    be->desc = c->desc;
    be->ctx = c;
    be->page_size = c->page;
    be->pool_bytes = c->budget;
    be->zero_copy = 0;
    be->needs_pinned = 1;
    /* every feature: RoPE factors, linear and YaRN scaling and attention factor
     * in k_rope, q/k norms through rmsnorm, soft-capped and sliding-window
     * attention in the attention kernels, embedding scale, final soft-cap and
     * GELU gate in cuda_arch.cuh */
    be->model_feats = MODEL_FEAT_ALL;
    be->ops = &cuda_ops;
    return be;
fail:
    cudaGetLastError();
    c_close(c);
    free(be);
    return NULL;
}

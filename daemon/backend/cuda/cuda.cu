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
 *
 * This file opens and closes the backend and holds its vtable; the slots
 * live in cuda_mem.cu (memory, events, copies), cuda_kern.cu (activation
 * kernels) and cuda_mm.cu (weight kernels, matmul, LoRA), cuBLAS in cuda_blas.cu
 * (cuda_int.cuh lists them and what calls what).
 */
#include <glob.h>
#include <unistd.h>

#include "cuda_int.cuh"

/* ------------------------------------------------------------------ tuning */

#define CU_DEFAULT_PAGE (2u << 20)
/* Share of the free device memory the pool takes when device.memory is 0. */
#define CU_AUTO_POOL_SHARE 0.9

/* ------------------------------------------------------------------ streams */

static int c_sync(void *ctx)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    int rc = use_dev(c);
    return rc ? rc : rt_rc(cudaStreamSynchronize(c->compute));
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
    cuda_mem_free_all(c);
    if (c->xh)
        cudaFree(c->xh);
    if (c->wh)
        cudaFree(c->wh);
    if (c->att_part)
        cudaFree(c->att_part);
    cuda_blas_close(&c->blas);
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
    .reserve = cuda_mem_reserve,
    .map = cuda_mem_map,
    .unmap = cuda_mem_unmap,
    .release = cuda_mem_release,
    .host_alloc = cuda_mem_host_alloc,
    .host_free = cuda_mem_host_free,
    .event_new = cuda_mem_event_new,
    .event_free = cuda_mem_event_free,
    .copy_h2d = cuda_mem_copy_h2d,
    .wait = cuda_mem_wait,
    .event_done = cuda_mem_event_done,
    .event_times = cuda_mem_event_times,
    .sync = c_sync,
    .buf_alloc = cuda_mem_buf_alloc,
    .buf_free = cuda_mem_buf_free,
    .download = cuda_mem_download,
    .upload = cuda_mem_upload,
    .copy_d2d = cuda_mem_copy_d2d,
    .embed = cuda_mm_embed,
    .rmsnorm = cuda_kern_rmsnorm,
    .matmul = cuda_mm_matmul,
    .add_bias = cuda_kern_add_bias,
    .rope = cuda_kern_rope,
    .kv_store = cuda_kern_kv_store,
    .attention = cuda_kern_attention,
    .silu_mul = cuda_kern_silu_mul,
    .add = cuda_kern_add,
    .gather = cuda_kern_gather,
    .scale = cuda_kern_scale, /* cuda_arch.cuh */
    .softcap = cuda_kern_softcap,
    .gelu_mul = cuda_kern_gelu_mul,
    .moe_scatter = cuda_kern_moe_scatter,
    .moe_sum = cuda_kern_moe_sum,
    .lora_mm = cuda_mm_lora_mm,
    .inject = nullptr, /* no fault injection: be_open supplies the fallback */
    .close = c_close,
};

/* 0 when GPU p->gpu is visible; else -1 with the reason in err. */
static int open_visible(const be_params_t *p, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
        cudaGetLastError();
        snprintf(err, errlen, "cuda backend: no CUDA device visible");
        return -1;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "cuda backend: CUDA driver not available: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        return -1;
    }
    if (p->gpu < 0 || p->gpu >= n) {
        snprintf(err, errlen, "cuda backend: GPU %d requested, %d visible", p->gpu, n);
        return -1;
    }
    return 0;
}

/* Makes c->dev current and checks it: compute capability 8.0+, the
 * driver's entry points (into c->drv), virtual memory management; *gran is
 * its VMM allocation granularity. 0, or -1 with the reason in err. */
static int open_device(cu_ctx_t *c, size_t *gran, char *err, size_t errlen)
{
    int major = 0, minor = 0, vmm = 0;
    CUdevice cd = 0;
    cudaError_t e;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if ((e = cudaSetDevice(c->dev)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot use GPU %d: %s", c->dev, cudaGetErrorString(e));
        return -1;
    }
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->dev) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot query GPU %d", c->dev);
        return -1;
    }
    if (major < 8) {
        snprintf(err, errlen,
                 "cuda backend: GPU %d has compute capability %d.%d; this build needs 8.0+", c->dev,
                 major, minor);
        return -1;
    }
    if (load_driver(&c->drv, err, errlen))
        return -1;
    if (c->drv.device_get(&cd, c->dev) != CUDA_SUCCESS ||
        c->drv.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    cd) != CUDA_SUCCESS ||
        !vmm) {
        snprintf(err, errlen, "cuda backend: GPU %d does not support virtual memory management",
                 c->dev);
        return -1;
    }
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->dev;
    if (c->drv.granularity(gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        !*gran) {
        snprintf(err, errlen, "cuda backend: cannot query the VMM allocation granularity");
        return -1;
    }
    return 0;
}

/* The pool's page (p->page_size, default 2 MiB, rounded up to the
 * granularity) and budget (p->memory, or a share of the free memory; a
 * whole number of pages). 0, or -1 with the reason in err. */
static int open_pool(cu_ctx_t *c, const be_params_t *p, size_t gran, char *err, size_t errlen)
{
    size_t free_b = 0, total_b = 0;
    cudaError_t e;
    c->page = p->page_size ? p->page_size : CU_DEFAULT_PAGE;
    c->page = (c->page + gran - 1) / gran * gran;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cudaMemGetInfo: %s", cudaGetErrorString(e));
        return -1;
    }
    if (p->memory == 0) {
        c->budget = (size_t)((double)free_b * CU_AUTO_POOL_SHARE);
    } else if (p->memory > free_b) {
        snprintf(
            err, errlen,
            "cuda backend: device memory budget of %zu bytes exceeds the %zu bytes free on GPU %d"
            " (scratch buffers need headroom too)",
            p->memory, free_b, c->dev);
        return -1;
    } else {
        c->budget = p->memory;
    }
    c->budget = c->budget / c->page * c->page;
    if (c->budget == 0) {
        snprintf(err, errlen,
                 "cuda backend: device memory budget is smaller than one %zu-byte page", c->page);
        return -1;
    }
    return 0;
}

/* The copy and compute streams and the stage events. 0, or -1 with the
 * reason in err. */
static int open_streams(cu_ctx_t *c, char *err, size_t errlen)
{
    cudaError_t e;
    if ((e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot create streams: %s", cudaGetErrorString(e));
        return -1;
    }
    for (int k = 0; k < STAGE_N; k++) {
        if ((e = cudaEventCreateWithFlags(&c->stage[k].ev, cudaEventDisableTiming)) !=
            cudaSuccess) {
            c->stage[k].ev = NULL;
            snprintf(err, errlen, "cuda backend: cannot create events: %s", cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

extern "C" backend_t *be_cuda_open(const be_params_t *p, char *err, size_t errlen)
{
    if (open_visible(p, err, errlen))
        return NULL;
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

    size_t gran = 0;
    if (open_device(c, &gran, err, errlen) || open_pool(c, p, gran, err, errlen) ||
        cuda_blas_locate(&c->blas, err, errlen) || open_streams(c, err, errlen))
        goto fail;
    cuda_blas_start(&c->blas, c->compute);
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
     * GELU gate in cuda_arch.cuh; mixtures of experts: the router and each
     * expert's matrices (views into the stacked tensors) through the matmul
     * slot, gather, and cuda_arch.cuh's moe_scatter and moe_sum */
    be->model_feats = MODEL_FEAT_ALL | MODEL_FEAT_MOE;
    be->ops = &cuda_ops;
    return be;
fail:
    cudaGetLastError();
    c_close(c);
    free(be);
    return NULL;
}

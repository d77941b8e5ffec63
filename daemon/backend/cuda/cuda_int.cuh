/* cuda_int: what the cuda backend's files share (the context, the cuBLAS and driver tables, small host and device helpers) and the host functions each exports; not for other modules. */
#ifndef CUDA_INT_CUH
#define CUDA_INT_CUH

/* The files, each calling only those below it (make check's file-cycles); a
 * .cu launches only its own kernels (nvcc compiles each without -rdc):
 *   cuda.cu       open and close, the vtable, probe, the driver's entry points, sync
 *   cuda_mm.cu    the weights' kernels: embedding rows, GEMV, F16 tiles, the tiled
 *                 GEMM, and the matmul slot (GEMV, cuBLAS or tiled; cuda_quant.cuh);
 *                 the LoRA products (lora_mm)
 *   cuda_kern.cu  the activations' kernels: rmsnorm, element-wise, RoPE, KV store,
 *                 attention, gather (cuda_arch.cuh: the architectures' extras, MoE)
 *   cuda_blas.cu  cuBLAS: located, dlopen'ed, checked, its handle
 *   cuda_mem.cu   the VMM page pool, pinned host memory, events and copies,
 *                 scratch buffers and the staged uploads kernels read */

#include <cuda.h> /* types and enums only: driver functions come through entry points */
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_api.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <new>

extern "C" {
#include "backend/backend.h"
#include "kernels/quant.h"
#include "kernels/wtype.h"
}

/* ------------------------------------------------------------------ shared tuning */

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

/* One range of device address space (cuda_mem.cu). */
typedef struct cu_range cu_range_t;

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
    STAGE_MOE_ROWS, /* moe_scatter's slot rows */
    STAGE_MOE_W,    /* and their weights */
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

/* ------------------------------------------------------------------ helpers */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runtime error -> backend code; clears the (non-sticky) last error. */
static inline int rt_rc(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? BE_ERR_NOMEM : BE_ERR_DEVICE;
}

static inline int drv_rc(CUresult r)
{
    if (r == CUDA_SUCCESS)
        return 0;
    return r == CUDA_ERROR_OUT_OF_MEMORY ? BE_ERR_NOMEM : BE_ERR_DEVICE;
}

/* Makes the backend's device current on the calling thread. */
static inline int use_dev(cu_ctx_t *c)
{
    return rt_rc(cudaSetDevice(c->dev));
}

/* Status of the kernel launches just queued. */
static inline int launch_rc(void)
{
    return rt_rc(cudaGetLastError());
}

static inline unsigned grid_y(size_t n)
{
    return n < GRID_Y_MAX ? (unsigned)(n ? n : 1) : GRID_Y_MAX;
}

static inline unsigned grid_x(size_t n, unsigned per_block)
{
    size_t b = (n + per_block - 1) / per_block;
    if (b == 0)
        b = 1;
    return b > (1u << 20) ? (1u << 20) : (unsigned)b;
}

/* ------------------------------------------------------------------ device helpers */

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

/* ------------------------------------------------------------------ cuda_mem.cu */

/* the vtable's memory, event and copy slots (backend.h says what each does) */
int cuda_mem_reserve(void *ctx, size_t bytes, void **base);
int cuda_mem_map(void *ctx, void *base, size_t off, size_t bytes);
int cuda_mem_unmap(void *ctx, void *base, size_t off, size_t bytes);
void cuda_mem_release(void *ctx, void *base, size_t bytes);
void *cuda_mem_host_alloc(void *ctx, size_t bytes);
void cuda_mem_host_free(void *ctx, void *p, size_t bytes);
int cuda_mem_event_new(void *ctx, be_event_t **evp);
void cuda_mem_event_free(void *ctx, be_event_t *ev);
int cuda_mem_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev);
int cuda_mem_wait(void *ctx, be_event_t *ev);
int cuda_mem_event_done(void *ctx, be_event_t *ev);
int cuda_mem_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t);
void *cuda_mem_buf_alloc(void *ctx, size_t bytes);
void cuda_mem_buf_free(void *ctx, void *p);
int cuda_mem_download(void *ctx, void *host, const void *dev, size_t bytes);
int cuda_mem_upload(void *ctx, void *dev, const void *host, size_t bytes);
/* Device-to-device on the compute stream (after the compute queued before it); asynchronous:
 * later kernels on the stream see the bytes. */
int cuda_mem_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes);
/* Puts bytes of host array src into stage k's device buffer, in order on the
 * compute stream; *dev is where kernels read it. Caller made the device
 * current. */
int cuda_mem_stage_put(cu_ctx_t *c, int k, const void *src, size_t bytes, const void **dev);
/* Releases every range (draining what still copies into it) and frees the
 * stage buffers and events: close's part for memory. */
void cuda_mem_free_all(cu_ctx_t *c);

/* ------------------------------------------------------------------ cuda_blas.cu */

/* Finds and loads cuBLAS into b: 0 with b->lib set, 0 with b->lib NULL and
 * the reason in b->note (own kernels), or -1 with err when GPUSWAPD_CUBLAS
 * names a file that cannot be used. */
int cuda_blas_locate(cu_blas_t *b, char *err, size_t errlen);
/* The handle on the stream; on failure cuBLAS is dropped (own kernels)
 * with the reason in b->note. */
void cuda_blas_start(cu_blas_t *b, cudaStream_t stream);
/* Destroys the handle, if any, and unloads the libraries. */
void cuda_blas_close(cu_blas_t *b);

/* ------------------------------------------------------------------ cuda_kern.cu */

/* the vtable's activation slots */
int cuda_kern_rmsnorm(void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,
                      size_t stride, float eps);
int cuda_kern_add_bias(void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride);
int cuda_kern_add(void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride);
int cuda_kern_silu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride);
int cuda_kern_rope(void *ctx, float *v, size_t n_tok, size_t stride, uint32_t n_heads,
                   const uint32_t *pos, const be_rope_t *hp);
int cuda_kern_kv_store(void *ctx, const be_att_t *a, const float *k, const float *v, size_t n_tok);
int cuda_kern_attention(void *ctx, const be_att_t *a, const float *q, float *out, size_t n_tok);
int cuda_kern_gather(void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                     size_t n, size_t stride);
/* cuda_arch.cuh */
int cuda_kern_scale(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float s);
int cuda_kern_softcap(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float cap);
int cuda_kern_gelu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride);
int cuda_kern_moe_scatter(void *ctx, float *dst, const float *src, const uint32_t *rows,
                          const float *w, size_t n_rows, size_t n, size_t stride);
int cuda_kern_moe_sum(void *ctx, float *x, const float *ys, size_t n_tok, uint32_t n_slots,
                      size_t n, size_t stride);

/* ------------------------------------------------------------------ cuda_mm.cu */

/* the vtable's weight slots */
int cuda_mm_embed(void *ctx, const be_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,
                  size_t stride);
int cuda_mm_matmul(void *ctx, const be_mm_t *jobs, int n_jobs, const float *x, size_t x_stride,
                   size_t n_tok);
/* y += each job's scale * B (A x) over its rows (k_lora: a block per 8 rows of a job, the jobs'
 * rows disjoint as the pass gives them; A and B of any type the matmul slot takes) */
int cuda_mm_lora_mm(void *ctx, const be_lora_t *jobs, int n_jobs, const float *x, size_t x_stride,
                    float *y, size_t y_stride);

#endif

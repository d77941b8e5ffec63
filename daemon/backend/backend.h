/* backend: the device vtable (page-pool memory, async copies with events, compute kernels) behind which cpu, sim and cuda live. */
#ifndef BACKEND_H
#define BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/tensor.h"

enum {
    BE_OK = 0,
    BE_ERR_NOMEM = -1,  /* device or host memory exhausted */
    BE_ERR_DEVICE = -2, /* driver/kernel failure */
    BE_ERR_ARG = -3,
    BE_ERR_UNAVAILABLE = -4, /* backend not built in or no device visible */
    BE_ERR_TIMEOUT = -5,     /* an event did not complete in time (be_event_sync) */
};

typedef struct be_event be_event_t; /* completion of one async copy */

/* Timestamps of one copy, seconds on CLOCK_MONOTONIC (cpu/sim) or relative
 * to the backend's first event (cuda). */
typedef struct be_copy_times {
    double queued, start, end;
} be_copy_times_t;

/* The kernels' operand types (kernels/tensor.h) under the backend's names: the
 * interface names tensors and their shapes without including model code. */
typedef kern_tensor_t be_tensor_t; /* a weight view (the engine's weights are these) */
typedef kern_tok_t be_tok_t;       /* one token's attention state */
typedef kern_att_t be_att_t;       /* attention operands of one layer */
typedef kern_mm_t be_mm_t;         /* one matmul job */
typedef kern_rope_t be_rope_t;     /* rotary embedding parameters */
typedef kern_lora_t be_lora_t;     /* one LoRA product */

/* Failures a backend can be told to produce (sim only; for tests of the
 * daemon's error paths). Each applies to the next count operations of its
 * kind; BE_FAULT_OFF clears every pending one. */
typedef enum be_fault_kind {
    BE_FAULT_OFF = 0,
    BE_FAULT_COPY_FAIL, /* the copy does not land: its event completes with an error */
    BE_FAULT_COPY_SLOW, /* the copy lands delay_ms late */
    BE_FAULT_MAP_FAIL,  /* map fails with BE_ERR_NOMEM (device memory exhausted) */
    BE_FAULT_MAP_SHORT, /* every map fails with BE_ERR_NOMEM until an unmap frees a page
                           (physical memory taken by someone else); count is ignored */
} be_fault_kind_t;

typedef struct be_fault {
    be_fault_kind_t kind;
    uint32_t count;    /* operations affected, >= 1 */
    uint32_t delay_ms; /* BE_FAULT_COPY_SLOW */
} be_fault_t;

/* The slots of a backend, declared once: X(slot, required, return type, (parameters)).
 * A backend fills a `static const be_ops_t` with designated initializers; be_open checks
 * that every slot with required 1 is set and supplies fallbacks for the optional ones. */
#define BE_OPS(X)                                                                                   \
    /* ---- device memory: reserved virtual ranges backed by pool pages */                          \
    /* Reserve bytes (multiple of page_size) of address space; *base is the                       \
     * device address. Nothing is backed yet. */ \
    X(reserve, 1, int, (void *ctx, size_t bytes, void **base))                                      \
    /* Back [base+off, base+off+bytes) (page multiples) with physical pages.                      \
     * Must succeed whenever the pool has that many free pages. */ \
    X(map, 1, int, (void *ctx, void *base, size_t off, size_t bytes))                               \
    X(unmap, 1, int, (void *ctx, void *base, size_t off, size_t bytes))                             \
    X(release, 1, void, (void *ctx, void *base, size_t bytes))                                      \
    /* ---- host memory for the model store (optional: NULL = aligned malloc) */                    \
    X(host_alloc, 0, void *, (void *ctx, size_t bytes))                                             \
    X(host_free, 0, void, (void *ctx, void *p, size_t bytes))                                       \
    /* ---- copies and events */                                                                    \
    X(event_new, 1, int, (void *ctx, be_event_t **ev))                                              \
    X(event_free, 1, void, (void *ctx, be_event_t *ev))                                             \
    /* Queue a host->device copy on the copy queue; ev completes after it. */                       \
    X(copy_h2d, 1, int, (void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev))      \
    /* Make later compute wait for ev (cpu/sim: block until it completes). */                       \
    X(wait, 1, int, (void *ctx, be_event_t *ev))                                                    \
    /* 1 if complete, 0 if pending, negative on error; never blocks. */                             \
    X(event_done, 1, int, (void *ctx, be_event_t *ev))                                              \
    /* (optional) copy timestamps of a completed event. */                                          \
    X(event_times, 0, int, (void *ctx, be_event_t *ev, be_copy_times_t *t))                         \
    /* Wait for all queued compute. */                                                              \
    X(sync, 1, int, (void *ctx))                                                                    \
    /* ---- scratch buffers for activations (not from the page pool) */                             \
    X(buf_alloc, 1, void *, (void *ctx, size_t bytes))                                              \
    X(buf_free, 1, void, (void *ctx, void *p))                                                      \
    /* (optional) device->host and host->device copies on the compute queue,                      \
     * synchronous; NULL = memcpy (host-addressable device memory). */ \
    X(download, 0, int, (void *ctx, void *host, const void *dev, size_t bytes))                     \
    X(upload, 0, int, (void *ctx, void *dev, const void *host, size_t bytes))                       \
    /* (optional) device->device copy on the compute queue, ordered after the compute queued    \
     * before it (a cached KV prefix into a new sequence's cache); NULL = memcpy. */   \
    X(copy_d2d, 0, int, (void *ctx, void *dst, const void *src, size_t bytes))                      \
    /* ---- kernels (compute queue). Pointers are device addresses; ids and                       \
     * positions are host arrays the backend copies as it needs. */ \
    X(embed, 1, int,                                                                                \
      (void *ctx, const be_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,             \
       size_t stride))                                                                              \
    X(rmsnorm, 1, int,                                                                              \
      (void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,               \
       size_t stride, float eps))                                                                   \
    X(matmul, 1, int,                                                                               \
      (void *ctx, const be_mm_t *jobs, int n_jobs, const float *x, size_t x_stride, size_t n_tok))  \
    X(add_bias, 1, int,                                                                             \
      (void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride))                 \
    X(rope, 1, int,                                                                                 \
      (void *ctx, float *v, size_t n_tok, size_t stride, uint32_t n_heads, const uint32_t *pos,     \
       const be_rope_t *rope))                                                                      \
    /* Store each token's k/v row into its sequence's cache at its position. */                     \
    X(kv_store, 1, int,                                                                             \
      (void *ctx, const be_att_t *a, const float *k, const float *v, size_t n_tok))                 \
    /* Causal attention of each token over positions 0..pos of its sequence. */                     \
    X(attention, 1, int, (void *ctx, const be_att_t *a, const float *q, float *out, size_t n_tok))  \
    X(silu_mul, 1, int,                                                                             \
      (void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride))                 \
    /* x += y */                                                                                    \
    X(add, 1, int, (void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride))    \
    /* Copy rows[] of src (n floats each, stride apart) to dst rows 0.. */                          \
    X(gather, 1, int,                                                                               \
      (void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows, size_t n,      \
       size_t stride))                                                                              \
    /* (optional: a backend without them lists no model_feats that need them,                     \
     * so the pass never calls them there) */ \
    /* x *= s (MODEL_FEAT_EMB_SCALE) */                                                             \
    X(scale, 0, int, (void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float s))         \
    /* x = cap * tanh(x / cap) (MODEL_FEAT_SOFTCAP) */                                              \
    X(softcap, 0, int, (void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float cap))     \
    /* g = gelu_tanh(g) * u (MODEL_FEAT_GELU) */                                                    \
    X(gelu_mul, 0, int,                                                                             \
      (void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride))                 \
    /* dst[rows[r]] = w[r] * src[r], rows of n floats stride apart; rows and w are host         \
     * arrays of n_rows (MODEL_FEAT_MOE: an expert's outputs into their token slots) */   \
    X(moe_scatter, 0, int,                                                                          \
      (void *ctx, float *dst, const float *src, const uint32_t *rows, const float *w,               \
       size_t n_rows, size_t n, size_t stride))                                                     \
    /* x[t] += ys[t*n_slots] + ys[t*n_slots + 1] + ..., the slots summed in order before          \
     * the add (MODEL_FEAT_MOE: each token's expert outputs into its residual) */ \
    X(moe_sum, 0, int,                                                                              \
      (void *ctx, float *x, const float *ys, size_t n_tok, uint32_t n_slots, size_t n,              \
       size_t stride))                                                                              \
    /* (optional) y += each job's scaled low-rank product, its rows of x (LoRA adapters: one call \
     * for a step's adapters on one matrix; without it the pass runs matmul, scale and add) */ \
    X(lora_mm, 0, int,                                                                              \
      (void *ctx, const be_lora_t *jobs, int n_jobs, const float *x, size_t x_stride, float *y,     \
       size_t y_stride))                                                                            \
    /* (optional) arm a fault; BE_ERR_UNAVAILABLE where not supported. */                           \
    X(inject, 0, int, (void *ctx, const be_fault_t *f))                                             \
    X(close, 1, void, (void *ctx))

/* Declares one slot as a function pointer member. */
#define BE_X_SLOT(slot, required, ret, params) ret(*slot) params;

/* A backend's slots; each backend has one `static const` table of them. */
typedef struct be_ops {
    BE_OPS(BE_X_SLOT)
} be_ops_t;

typedef struct backend {
    const char *name; /* "cpu", "sim", "cuda" */
    /* (optional) one line on the device and the libraries in use, for the
     * startup log (cuda: GPU, driver/runtime, cuBLAS path and version or the
     * fallback kernels); owned by the backend, valid until close. */
    const char *desc;
    void *ctx;
    size_t page_size;     /* device page size in bytes (pool granularity) */
    size_t pool_bytes;    /* device memory available to the pool */
    int zero_copy;        /* 1: weights are used in place from host memory (cpu) */
    int needs_pinned;     /* 1: the store should use host_alloc (pinned) */
    uint32_t model_feats; /* MODEL_FEAT_* bits its kernels run; a model needing
                             another is refused at load (model_feats_check) */

    /* ---- the slots, copied from ops by be_open (fallbacks in the optional ones): callers
     * call be->map(be->ctx, ...) */
    BE_OPS(BE_X_SLOT)
    const be_ops_t *ops; /* the backend's own table, as its constructor set it */
} backend_t;

/* The backends the registry knows. */
typedef enum be_kind {
    BE_KIND_AUTO = 0, /* cuda when a GPU is visible, else cpu */
    BE_KIND_CPU,
    BE_KIND_SIM,
    BE_KIND_CUDA,
    BE_KIND_COUNT
} be_kind_t;
/* "auto", "cpu", "sim", "cuda"; NULL outside the enum. */
const char *be_kind_name(be_kind_t k);
/* The kind named name into *k: 0, or BE_ERR_ARG for an unknown name. */
int be_kind_from_name(const char *name, be_kind_t *k);

typedef struct be_params {
    be_kind_t kind;
    size_t memory;        /* device pool bytes (sim: exact; cuda: budget) */
    size_t page_size;     /* 0 = 2 MiB */
    double sim_bandwidth; /* sim copy throttle, bytes/s; 0 = unthrottled */
    int threads;          /* CPU threads for cpu/sim kernels; 0 = all cores */
    int gpu;              /* cuda device index */
} be_params_t;

/* Constructors, called only by the registry (backend.c). Each sets ops to
 * its static const table (optional slots may be NULL) and the plain fields. */
backend_t *be_cpu_open(const be_params_t *p, char *err, size_t errlen);
backend_t *be_sim_open(const be_params_t *p, char *err, size_t errlen);
backend_t *be_cuda_open(const be_params_t *p, char *err, size_t errlen);
int be_cuda_probe(void); /* number of visible CUDA devices (cuda/cuda.cu) */

/* Open a backend (the registry: the one place that knows which exist).
 * Optional slots left NULL get the dispatcher's fallbacks, so callers may
 * call every slot.
 * NULL + reason in err on failure. Close with be_close. */
backend_t *be_open(const be_params_t *p, char *err, size_t errlen);
void be_close(backend_t *be); /* accepts NULL */
/* 1 if a CUDA device is visible (0 when CUDA is not built in). */
int be_cuda_available(void);
/* Number of visible CUDA devices; when 0, why not in why (built without
 * CUDA, driver and runtime versions, the CUDA error, missing /dev/nvidia*
 * nodes). Never fails; for tests and gpu-check. */
int be_cuda_status(char *why, size_t whylen);
int be_cuda_probe_status(char *why, size_t whylen); /* cuda/cuda.cu */
/* Where the cuda backend would find cuBLAS, as it does at open (no device
 * needed): 1 and "cuBLAS <version> (<path>)" in what; 0 and "none: <why>"
 * (the backend then runs its own GEMM kernel; also without CUDA built in);
 * BE_ERR_ARG when GPUSWAPD_CUBLAS names a file that cannot be used. */
int be_cuda_cublas(char *what, size_t whatlen);
int be_cuda_cublas_find(char *what, size_t whatlen); /* cuda/cuda_blas.cu */

/* Checks that ops sets every required slot and copies its slots into be,
 * the dispatcher's fallbacks in the optional ones left NULL; be->ops = ops.
 * 0, or BE_ERR_ARG naming the first missing slot in err. be_open does this
 * for every backend it opens. */
int be_ops_install(backend_t *be, const be_ops_t *ops, char *err, size_t errlen);

/* Block the host until ev completes, polling event_done with a growing
 * pause (20 us .. 1 ms). 0 once complete; the backend's negative code if the
 * event failed (or event_done did); BE_ERR_TIMEOUT if it is still pending
 * after timeout_s (INFINITY: no limit). Unlike be->wait, which on cuda only
 * orders the compute stream after the copy, this returns when the copy has
 * landed and its times (event_times) are valid. */
int be_event_sync(backend_t *be, be_event_t *ev, double timeout_s);

#endif

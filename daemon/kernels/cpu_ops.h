/* cpu_ops: the CPU kernels (portable, with quant's SIMD dots) behind the cpu and sim backends' slots; depends on nothing above kernels/. */
#ifndef CPU_OPS_H
#define CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/pool.h"
#include "kernels/tensor.h"

typedef struct cpuk cpuk_t;

/* pool is borrowed. NULL when out of memory. */
cpuk_t *cpuk_new(pool_t *pool);
void cpuk_free(cpuk_t *k); /* accepts NULL */

/* The head of every backend context that uses these kernels: the context
 * struct's first member, which the compiler checks with CPUK_CTX_CHECK. */
typedef struct cpuk_ctx {
    cpuk_t *k; /* the kernels' state (owned by the backend) */
} cpuk_ctx_t;
/* Fails the build unless ctx_type starts with its cpuk_ctx_t member. */
#define CPUK_CTX_CHECK(ctx_type, member)                                                           \
    _Static_assert(offsetof(ctx_type, member) == 0, #ctx_type " must start with its cpuk_ctx_t");  \
    _Static_assert(_Generic(((ctx_type *)0)->member, cpuk_ctx_t : 1, default : 0),                 \
                   #member " is a cpuk_ctx_t")

/* The kernel and scratch-buffer slots, for a backend's static const be_ops_t
 * (designated initializers); their ctx is a context that CPUK_CTX_CHECK passes. */
#define CPUK_OPS(X)                                                                                \
    X(buf_alloc)                                                                                   \
    X(buf_free)                                                                                    \
    X(sync)                                                                                        \
    X(embed)                                                                                       \
    X(rmsnorm)                                                                                     \
    X(matmul)                                                                                      \
    X(add_bias)                                                                                    \
    X(rope)                                                                                        \
    X(kv_store)                                                                                    \
    X(attention)                                                                                   \
    X(silu_mul)                                                                                    \
    X(add)                                                                                         \
    X(gather)                                                                                      \
    X(scale)                                                                                       \
    X(softcap)                                                                                     \
    X(gelu_mul)                                                                                    \
    X(moe_scatter)                                                                                 \
    X(moe_sum)                                                                                     \
    X(lora_mm)
#define CPUK_X_INIT(slot) .slot = cpuk_##slot,
#define CPUK_SLOTS CPUK_OPS(CPUK_X_INIT)

/* The kernels of CPUK_OPS with their backend slots' signatures (backend.h's
 * BE_OPS; the compiler checks them where a be_ops_t takes them). ctx: a
 * context whose first member is a cpuk_ctx_t; returns KERN_OK or KERN_ERR_*. */
void *cpuk_buf_alloc(void *ctx, size_t bytes);
void cpuk_buf_free(void *ctx, void *p);
int cpuk_sync(void *ctx);
int cpuk_embed(void *ctx, const kern_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,
               size_t stride);
int cpuk_rmsnorm(void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,
                 size_t stride, float eps);
int cpuk_matmul(void *ctx, const kern_mm_t *jobs, int n_jobs, const float *x, size_t x_stride,
                size_t n_tok);
int cpuk_add_bias(void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride);
int cpuk_scale(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float s);
int cpuk_softcap(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float cap);
int cpuk_gelu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride);
int cpuk_rope(void *ctx, float *v, size_t n_tok, size_t stride, uint32_t n_heads,
              const uint32_t *pos, const kern_rope_t *rope);
int cpuk_kv_store(void *ctx, const kern_att_t *a, const float *k, const float *v, size_t n_tok);
int cpuk_attention(void *ctx, const kern_att_t *a, const float *q, float *out, size_t n_tok);
int cpuk_silu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride);
int cpuk_add(void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride);
int cpuk_gather(void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                size_t n, size_t stride);
int cpuk_moe_scatter(void *ctx, float *dst, const float *src, const uint32_t *rows, const float *w,
                     size_t n_rows, size_t n, size_t stride);
int cpuk_lora_mm(void *ctx, const kern_lora_t *jobs, int n_jobs, const float *x, size_t x_stride,
                 float *y, size_t y_stride);
int cpuk_moe_sum(void *ctx, float *x, const float *ys, size_t n_tok, uint32_t n_slots, size_t n,
                 size_t stride);

#endif

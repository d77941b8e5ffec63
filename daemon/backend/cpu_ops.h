/* cpu_ops: the CPU kernels behind the backend vtable, shared by the cpu and sim backends. */
#ifndef CPU_OPS_H
#define CPU_OPS_H

#include <stddef.h>

#include "backend.h"
#include "pool.h"

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
    _Static_assert(_Generic(((ctx_type *)0)->member, cpuk_ctx_t: 1, default: 0), #member " is a cpuk_ctx_t")

/* The kernel and scratch-buffer slots, for a backend's static const be_ops_t
 * (designated initializers); their ctx is a context that CPUK_CTX_CHECK passes. */
#define CPUK_OPS(X)                                                                                \
    X(buf_alloc) X(buf_free) X(sync) X(embed) X(rmsnorm) X(matmul) X(add_bias) X(rope) X(kv_store) \
    X(attention) X(silu_mul) X(add) X(gather)
#define CPUK_X_INIT(slot) .slot = cpuk_##slot,
#define CPUK_SLOTS CPUK_OPS(CPUK_X_INIT)

/* cpuk_<slot> with its slot's signature (BE_OPS); cpu_ops.c defines those of CPUK_OPS. */
#define CPUK_X_FN(slot, required, ret, params) ret cpuk_##slot params;
BE_OPS(CPUK_X_FN)
#undef CPUK_X_FN

#endif

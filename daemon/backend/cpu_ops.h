/* cpu_ops: the CPU kernels behind the backend vtable, shared by the cpu and sim backends. */
#ifndef CPU_OPS_H
#define CPU_OPS_H

#include "backend.h"
#include "pool.h"

typedef struct cpuk cpuk_t;

/* pool is borrowed. NULL when out of memory. */
cpuk_t *cpuk_new(pool_t *pool);
void cpuk_free(cpuk_t *k); /* accepts NULL */

/* Fill the kernel and scratch-buffer slots of be with the CPU kernels; each
 * slot's ctx argument must then be a backend context whose first member is
 * a cpuk_t pointer (struct { cpuk_t *k; ... }). */
void cpuk_fill(backend_t *be);

#endif

/* vbackend: a virtual device for the trace simulator: fake address ranges, a counted page pool, and one FIFO copy queue on a virtual clock. */
#ifndef VBACKEND_H
#define VBACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct vb vb_t;

/* Counters of the virtual device (resettable by vb_new only). */
typedef struct vb_stats {
    uint64_t copies;       /* host->device copies queued */
    uint64_t bytes_copied; /* bytes of them */
    double copy_busy_s;    /* seconds the copy queue was busy */
    double wait_s;         /* seconds compute waited on copy events */
    double host_block_s;  /* seconds the host blocked on a copy (eviction of a segment in flight) */
    uint64_t host_blocks; /* how many times */
    uint64_t mapped_pages; /* pages mapped now */
    uint64_t max_mapped;   /* most pages ever mapped at once */
    uint64_t violations;   /* over-commit, double map, unmap of unmapped pages, bad ranges */
    uint64_t d2h_bytes;    /* bytes downloaded device -> host (KV demoted to the host tier) */
    double d2h_s;          /* seconds the host blocked on those downloads */
} vb_stats_t;

/* Cost of a copy: copy_lat_s + bytes / h2d_bw seconds on the single copy
 * queue; a copy starts when the one before it ends. A download (device ->
 * host, synchronous as the CUDA backend's) blocks the host as long at the
 * same bandwidth; a device-to-device copy costs nothing. Host memory
 * (host_alloc) is a fake address, never touched. */
typedef struct vb_cfg {
    size_t pool_bytes; /* device pool, a multiple of page_size */
    size_t page_size;  /* bytes */
    double h2d_bw;     /* bytes/s host->device */
    double copy_lat_s; /* fixed cost per copy, s */
} vb_cfg_t;

/* NULL on bad cfg or out of memory. The backend_t it returns lives inside vb. */
vb_t *vb_new(const vb_cfg_t *cfg);
void vb_free(vb_t *vb); /* accepts NULL */
backend_t *vb_backend(vb_t *vb);

/* The virtual clock, seconds. vb_advance moves it forward (never back). */
double vb_now(const vb_t *vb);
void vb_advance(vb_t *vb, double dt);
void vb_advance_to(vb_t *vb, double t);
/* When the copy queue drains (<= now when idle). */
double vb_copy_tail(const vb_t *vb);

/* Quiet mode: while on, polling an event never counts as the host blocking
 * on it (the simulator's own state queries). See event_done in vbackend.c. */
void vb_quiet(vb_t *vb, int on);

void vb_get_stats(const vb_t *vb, vb_stats_t *out);

#endif

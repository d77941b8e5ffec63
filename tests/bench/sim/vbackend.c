/* vbackend: a virtual device for the trace simulator: fake address ranges, a counted page pool, and one FIFO copy queue on a virtual clock. */
#include "vbackend.h"

#include <stdlib.h>
#include <string.h>

/* A reservation's device address is (slot + 1) << VB_SHIFT: distinct, never
 * dereferenced, and the slot is found again from any address inside it. */
#define VB_SHIFT 40
#define VB_MAX_RANGE ((size_t)1 << VB_SHIFT)

typedef struct vb_range {
    size_t bytes;    /* 0 = slot free */
    uint8_t *mapped; /* one byte per page: 1 = backed */
    int next_free;   /* free-list link */
} vb_range_t;

struct be_event {
    int has_copy;      /* a copy was queued on it */
    be_copy_times_t t; /* virtual seconds */
};

struct vb {
    backend_t be;
    vb_cfg_t cfg;
    uint64_t n_pages;
    double now;
    double copy_tail; /* when the last queued copy ends */
    vb_range_t *ranges;
    int n_ranges, cap_ranges, free_head;
    const be_event_t *polled; /* last pending event polled, see vb_event_done */
    int quiet;
    vb_stats_t st;
};

/* ------------------------------------------------------------------ clock */

double vb_now(const vb_t *vb)
{
    return vb->now;
}
double vb_copy_tail(const vb_t *vb)
{
    return vb->copy_tail;
}

void vb_advance_to(vb_t *vb, double t)
{
    if (t > vb->now)
        vb->now = t;
    vb->polled = NULL;
}

void vb_advance(vb_t *vb, double dt)
{
    vb_advance_to(vb, vb->now + (dt > 0 ? dt : 0));
}

void vb_quiet(vb_t *vb, int on)
{
    vb->quiet = on;
    vb->polled = NULL;
}

void vb_get_stats(const vb_t *vb, vb_stats_t *out)
{
    *out = vb->st;
}

/* ------------------------------------------------------------------ memory */

static vb_range_t *range_of(vb_t *vb, const void *base)
{
    uintptr_t a = (uintptr_t)base;
    if (a & (VB_MAX_RANGE - 1))
        return NULL;
    uintptr_t slot = (a >> VB_SHIFT) - 1;
    if (a == 0 || slot >= (uintptr_t)vb->n_ranges || vb->ranges[slot].bytes == 0)
        return NULL;
    return &vb->ranges[slot];
}

static int vb_reserve(void *ctx, size_t bytes, void **base)
{
    vb_t *vb = ctx;
    vb->polled = NULL;
    if (bytes == 0 || bytes % vb->cfg.page_size || bytes >= VB_MAX_RANGE) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    int slot = vb->free_head;
    if (slot >= 0) {
        vb->free_head = vb->ranges[slot].next_free;
    } else {
        if (vb->n_ranges == vb->cap_ranges) {
            int cap = vb->cap_ranges ? 2 * vb->cap_ranges : 64;
            vb_range_t *r = realloc(vb->ranges, (size_t)cap * sizeof *r);
            if (!r)
                return BE_ERR_NOMEM;
            vb->ranges = r;
            vb->cap_ranges = cap;
        }
        slot = vb->n_ranges++;
    }
    vb_range_t *r = &vb->ranges[slot];
    r->mapped = calloc(bytes / vb->cfg.page_size, 1);
    if (!r->mapped) {
        r->bytes = 0;
        r->next_free = vb->free_head;
        vb->free_head = slot;
        return BE_ERR_NOMEM;
    }
    r->bytes = bytes;
    *base = (void *)(((uintptr_t)slot + 1) << VB_SHIFT);
    return BE_OK;
}

/* Checks [off, off+bytes) lies in r on page boundaries. */
static int span_ok(const vb_t *vb, const vb_range_t *r, size_t off, size_t bytes)
{
    size_t p = vb->cfg.page_size;
    return r && bytes && off % p == 0 && bytes % p == 0 && off <= r->bytes &&
           bytes <= r->bytes - off;
}

static int vb_map(void *ctx, void *base, size_t off, size_t bytes)
{
    vb_t *vb = ctx;
    vb->polled = NULL;
    vb_range_t *r = range_of(vb, base);
    if (!span_ok(vb, r, off, bytes)) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    size_t p0 = off / vb->cfg.page_size, n = bytes / vb->cfg.page_size;
    if (vb->st.mapped_pages + n > vb->n_pages) {
        vb->st.violations++; /* the pool would be over-committed */
        return BE_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        if (r->mapped[p0 + i]) {
            vb->st.violations++;
            return BE_ERR_ARG;
        }
    memset(r->mapped + p0, 1, n);
    vb->st.mapped_pages += n;
    if (vb->st.mapped_pages > vb->st.max_mapped)
        vb->st.max_mapped = vb->st.mapped_pages;
    return BE_OK;
}

static int vb_unmap(void *ctx, void *base, size_t off, size_t bytes)
{
    vb_t *vb = ctx;
    vb->polled = NULL;
    vb_range_t *r = range_of(vb, base);
    if (!span_ok(vb, r, off, bytes)) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    size_t p0 = off / vb->cfg.page_size, n = bytes / vb->cfg.page_size;
    for (size_t i = 0; i < n; i++) {
        if (!r->mapped[p0 + i]) {
            vb->st.violations++;
            return BE_ERR_ARG;
        }
    }
    memset(r->mapped + p0, 0, n);
    vb->st.mapped_pages -= n;
    return BE_OK;
}

static void vb_release(void *ctx, void *base, size_t bytes)
{
    vb_t *vb = ctx;
    vb->polled = NULL;
    vb_range_t *r = range_of(vb, base);
    if (!r || r->bytes != bytes) {
        vb->st.violations++;
        return;
    }
    size_t n = bytes / vb->cfg.page_size;
    for (size_t i = 0; i < n; i++)
        if (r->mapped[i]) {
            vb->st.violations++; /* released with pages still mapped */
            vb->st.mapped_pages--;
        }
    free(r->mapped);
    r->mapped = NULL;
    r->bytes = 0;
    int slot = (int)(r - vb->ranges);
    r->next_free = vb->free_head;
    vb->free_head = slot;
}

/* ------------------------------------------------------------------ copies */

static int vb_event_new(void *ctx, be_event_t **ev)
{
    (void)ctx;
    *ev = calloc(1, sizeof **ev);
    return *ev ? BE_OK : BE_ERR_NOMEM;
}

static void vb_event_free(void *ctx, be_event_t *ev)
{
    vb_t *vb = ctx;
    if (vb->polled == ev)
        vb->polled = NULL;
    free(ev);
}

static int vb_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, be_event_t *ev)
{
    vb_t *vb = ctx;
    vb->polled = NULL;
    if (!dst || !src || !ev) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    double start = vb->copy_tail > vb->now ? vb->copy_tail : vb->now;
    double dur = vb->cfg.copy_lat_s + (double)bytes / vb->cfg.h2d_bw;
    ev->has_copy = 1;
    ev->t = (be_copy_times_t){.queued = vb->now, .start = start, .end = start + dur};
    vb->copy_tail = start + dur;
    vb->st.copies++;
    vb->st.bytes_copied += bytes;
    vb->st.copy_busy_s += dur;
    return BE_OK;
}

/* KV demoted to host RAM: the host blocks for the download (cudaMemcpyAsync + sync). */
static int vb_download(void *ctx, void *host, const void *dev, size_t bytes)
{
    vb_t *vb = ctx;
    if (!host || !dev) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    double dur = vb->cfg.copy_lat_s + (double)bytes / vb->cfg.h2d_bw;
    vb->st.d2h_bytes += bytes;
    vb->st.d2h_s += dur;
    vb_advance(vb, dur);
    return BE_OK;
}

/* A cached prefix copied into a new KV cache: HBM to HBM, taken as free. */
static int vb_copy_d2d(void *ctx, void *dst, const void *src, size_t bytes)
{
    vb_t *vb = ctx;
    (void)bytes;
    if (!dst || !src) {
        vb->st.violations++;
        return BE_ERR_ARG;
    }
    return BE_OK;
}

/* Host memory of the KV host tier: an address nobody reads (the copies are only timed). */
static void *vb_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return (void *)(uintptr_t)0x1000;
}

static void vb_host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)p;
    (void)bytes;
}

/* Compute waits for the copy: the clock moves to its end. */
static int vb_wait(void *ctx, be_event_t *ev)
{
    vb_t *vb = ctx;
    if (ev->has_copy && ev->t.end > vb->now) {
        vb->st.wait_s += ev->t.end - vb->now;
        vb_advance_to(vb, ev->t.end);
    }
    vb->polled = NULL;
    return BE_OK;
}

/* Never blocks, as the vtable says. One exception models the host blocking:
 * residency's copy_sync (evicting a segment whose copy is still queued)
 * polls the same pending event again and again with nothing in between; on
 * the second poll in a row the clock jumps to the copy's end. Outside such a
 * loop residency polls each event once, and the simulator's own queries run
 * in quiet mode, so nothing else moves the clock here. */
static int vb_event_done(void *ctx, be_event_t *ev)
{
    vb_t *vb = ctx;
    if (!ev->has_copy || ev->t.end <= vb->now)
        return 1;
    if (!vb->quiet && vb->polled == ev) {
        vb->st.host_blocks++;
        vb->st.host_block_s += ev->t.end - vb->now;
        vb_advance_to(vb, ev->t.end);
        return 1;
    }
    vb->polled = ev;
    return 0;
}

static int vb_event_times(void *ctx, be_event_t *ev, be_copy_times_t *t)
{
    vb_t *vb = ctx;
    if (!ev->has_copy || ev->t.end > vb->now)
        return BE_ERR_ARG;
    *t = ev->t;
    return BE_OK;
}

static int vb_sync(void *ctx)
{
    (void)ctx;
    return BE_OK;
}

/* ------------------------------------------------------------------ setup */

vb_t *vb_new(const vb_cfg_t *cfg)
{
    if (!cfg->page_size || cfg->pool_bytes < cfg->page_size || cfg->h2d_bw <= 0)
        return NULL;
    vb_t *vb = calloc(1, sizeof *vb);
    if (!vb)
        return NULL;
    vb->cfg = *cfg;
    vb->n_pages = cfg->pool_bytes / cfg->page_size;
    vb->free_head = -1;
    vb->be = (backend_t){
        .name = "virtual",
        .ctx = vb,
        .page_size = cfg->page_size,
        .pool_bytes = (size_t)vb->n_pages * cfg->page_size,
        .reserve = vb_reserve,
        .map = vb_map,
        .unmap = vb_unmap,
        .release = vb_release,
        .event_new = vb_event_new,
        .event_free = vb_event_free,
        .copy_h2d = vb_copy_h2d,
        .download = vb_download,
        .copy_d2d = vb_copy_d2d,
        .host_alloc = vb_host_alloc,
        .host_free = vb_host_free,
        .wait = vb_wait,
        .event_done = vb_event_done,
        .event_times = vb_event_times,
        .sync = vb_sync,
    };
    return vb;
}

void vb_free(vb_t *vb)
{
    if (!vb)
        return;
    for (int i = 0; i < vb->n_ranges; i++)
        free(vb->ranges[i].mapped);
    free(vb->ranges);
    free(vb);
}

backend_t *vb_backend(vb_t *vb)
{
    return &vb->be;
}

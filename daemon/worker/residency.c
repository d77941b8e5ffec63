/* residency: the device page pool, per-model mappings, pipelined page-in, tail-first GreedyDual eviction, quotas and KV pages. */
#include "residency.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

/* Reload cost model for the GreedyDual score: seconds = fixed + bytes / bw. */
#define RES_COST_FIXED_S 1e-3
#define RES_COST_BW 25e9
/* What res_ready_in answers while no copy has been timed yet: poll again. */
#define RES_POLL_S 1e-3

typedef struct res_seg {
    res_seg_state_t state;
    be_event_t *ev; /* copy completion */
    int timed;      /* copy time already added to the counters */
    be_copy_times_t t;
    uint64_t
        q_end; /* bytes ever queued on the copy engine when its copy was queued, itself included */
    size_t q_span; /* bytes of that copy */
} res_seg_t;

typedef struct res_kv {
    kv_seq_t kv; /* first: kv_seq_t pointers are res_kv pointers */
    res_model_t *m;
    size_t range_bytes;  /* reserved per array (k and v) */
    size_t mapped_bytes; /* mapped per array */
} res_kv_t;

struct res_model {
    res_t *r;
    store_model_t *sm;
    res_cfg_t cfg;
    void *base;          /* device range holding the image layout */
    res_seg_t *segs;     /* sm->n_segs */
    model_weights_t dev; /* weights at base */
    model_layer_t *dev_layers;
    size_t weight_bytes; /* spans mapped (resident or in flight) */
    size_t span_bytes;   /* spans of all its segments (res_pagein_fits: what is missing) */
    size_t kv_bytes;     /* KV pages mapped */
    int running;
    int n_kv;
    kv_type_t kv_live_type; /* type of its live KV caches (while n_kv > 0): a reload's
                                new kv_type applies once they are gone, so one
                                pass never mixes types */
    int n_inflight;         /* segments whose copy is queued and not settled */
    size_t inflight_bytes;  /* their spans */
    int wanted;             /* the caller has work queued for it (res_set_wanted) */
    int prefetch_touched;   /* a prefetch counted as a use since its last pass */
    size_t stolen;          /* bytes evicted while it had live KV caches, since its last pass */
    double freq;            /* uses, for the GreedyDual score */
    double h;               /* GreedyDual value: lowest goes first */
    uint64_t ord;           /* order of res_add: the models list runs newest first */
    struct res_model *if_next, *if_prev; /* the in-flight list (n_inflight > 0) */
    stats_res_t st;
    int err_code;  /* RES_ERR_* of the last failure since acquire, 0 if none */
    char err[192]; /* its message */
    struct res_model *next;
};

struct res {
    backend_t *be;
    size_t page;
    size_t n_pages, free_pages;
    size_t scratch_bytes; /* device scratch in use (res_scratch_note) */
    size_t scratch_pages; /* taken off the pool as the scratch grew (res_scratch_note) */
    size_t cut_pages;     /* pages taken off the budget because the device could not map them */
    size_t peak_used;     /* most device bytes in use at once: pool pages and scratch */
    double L;             /* GreedyDual inflation value */
    res_model_t *models;
    res_model_t *inflight; /* models with copies in flight, in models-list order: settling
                              walks these (the order keeps bw's average as a walk over all) */
    uint64_t n_added;      /* res_add calls (res_model.ord) */
    size_t kv_bytes;       /* KV pages mapped, all models */
    int n_kv_reserve;      /* models with a kv_reserve (update_headroom): res_kv_available_for
                              walks the models only when there are any */
    size_t headroom;       /* bytes kept free of KV: the largest model wholly resident
                                (image, or its gpu_quota when smaller) */
    size_t headroom_min;   /* the most any model needs to run at all (embedding +
                                largest other segment, streaming the rest) */
    double copy_timeout_s; /* a pass waits this long for one segment's copy */
    double max_stall_s;    /* a model with live KV caches loses at most what the copy
                                engine brings back in this long (0 = no bound) */
    uint64_t q_bytes;      /* bytes ever queued on the copy engine (FIFO) */
    uint64_t landed_q;     /* q_end of the latest copy seen landed (copies land in order) */
    double bw;             /* measured copy bandwidth, bytes/s (0 until a copy was timed) */
};

static size_t pages_of(const res_t *r, size_t bytes)
{
    return (bytes + r->page - 1) / r->page;
}

static size_t min_run_bytes(const store_model_t *sm)
{
    size_t mx = 0;
    for (uint32_t s = 1; s < sm->n_segs; s++)
        if (sm->segs[s].span > mx)
            mx = sm->segs[s].span;
    return sm->segs[0].span + mx;
}

static void update_headroom(res_t *r)
{
    r->headroom = 0;
    r->n_kv_reserve = 0;
    /* room for the largest model to be wholly resident (within its quota):
     * with less, paused KV caches can force a running model to re-stream its
     * layers every step (seen in the trace simulator at full load) */
    for (res_model_t *m = r->models; m; m = m->next) {
        size_t b = m->sm->image_bytes;
        if (m->cfg.gpu_quota && m->cfg.gpu_quota < b)
            b = m->cfg.gpu_quota;
        if (b < min_run_bytes(m->sm))
            b = min_run_bytes(m->sm);
        if (b > r->headroom)
            r->headroom = b;
        if (min_run_bytes(m->sm) > r->headroom_min)
            r->headroom_min = min_run_bytes(m->sm);
        r->n_kv_reserve += m->cfg.kv_reserve > 0;
    }
}

size_t res_kv_available(const res_t *r)
{
    size_t pool = r->n_pages * r->page;
    /* with no KV mapped at all, the first cache may take everything but
     * the minimum any model needs to run (it streams): progress is always
     * possible; beyond that KV leaves room for a whole model */
    size_t keep = r->kv_bytes ? r->headroom : r->headroom_min;
    size_t limit = pool > keep ? pool - keep : 0;
    return limit > r->kv_bytes ? limit - r->kv_bytes : 0;
}

size_t res_kv_available_for(const res_t *r, const res_model_t *m)
{
    size_t avail = res_kv_available(r), held = 0;
    for (const res_model_t *v = r->n_kv_reserve ? r->models : NULL; v; v = v->next)
        if (v != m && v->cfg.kv_reserve > v->kv_bytes)
            held += v->cfg.kv_reserve - v->kv_bytes; /* others' reservations not yet used */
    avail = avail > held ? avail - held : 0;
    /* its own reservation holds even where the headroom kept for weights would not */
    size_t own = m->cfg.kv_reserve > m->kv_bytes ? m->cfg.kv_reserve - m->kv_bytes : 0;
    return avail > own ? avail : own;
}

static size_t kv_bytes_typed(const res_t *r, const model_hparams_t *hp, uint32_t n_pos, kv_type_t t)
{
    return 2 * pages_of(r, kv_seq_bytes(hp, n_pos, t) / 2) * r->page;
}

size_t res_kv_bytes_for(const res_t *r, const model_hparams_t *hp, uint32_t n_pos)
{
    return kv_bytes_typed(r, hp, n_pos, KV_TYPE_F16);
}

size_t res_kv_bytes_model(const res_t *r, const res_model_t *m, uint32_t n_pos)
{
    return kv_bytes_typed(r, &m->sm->model->hp, n_pos, m->cfg.kv_type);
}

static size_t quota_of(const res_t *r, const res_model_t *m)
{
    return m->cfg.gpu_quota ? m->cfg.gpu_quota : r->n_pages * r->page;
}

/* ------------------------------------------------------------------ pool */

res_t *res_new(backend_t *be, char *err, size_t errlen)
{
    if (be->page_size == 0 || be->pool_bytes < be->page_size) {
        snprintf(err, errlen, "%s backend: device pool of %zu bytes holds no %zu-byte page",
                 be->name, be->pool_bytes, be->page_size);
        return NULL;
    }
    res_t *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->be = be;
    r->page = be->page_size;
    r->n_pages = be->pool_bytes / be->page_size;
    r->free_pages = r->n_pages;
    r->copy_timeout_s = 30.0;
    return r;
}

void res_free(res_t *r)
{
    if (!r)
        return;
    while (r->models)
        if (res_remove(r, r->models))
            break;
    free(r);
}

size_t res_page_size(const res_t *r)
{
    return r->page;
}
void *res_model_base(const res_model_t *m)
{
    return m->base;
}
const res_cfg_t *res_cfg(const res_model_t *m)
{
    return &m->cfg;
}
store_model_t *res_store_model(const res_model_t *m)
{
    return m->sm;
}
const model_weights_t *res_weights(const res_model_t *m)
{
    return &m->dev;
}
size_t res_model_bytes(const res_model_t *m)
{
    return m->weight_bytes + m->kv_bytes;
}
size_t res_weight_bytes(const res_model_t *m)
{
    return m->weight_bytes;
}

static void update_gauges(res_model_t *m)
{
    m->st.curr_resident_bytes = m->weight_bytes;
    m->st.curr_kv_bytes = m->kv_bytes;
    m->st.curr_running = (uint64_t)m->running;
    m->st.curr_kv_seqs = (uint64_t)m->n_kv;
}

static void set_err(res_model_t *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(res_model_t *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    m->err_code = code;
}

/* The message for a failed acquire or prefetch (what): the recorded cause if any. */
static void err_report(const res_t *r, const res_model_t *m, const char *what, char *err,
                       size_t errlen)
{
    if (m->err_code)
        snprintf(err, errlen, "%s", m->err);
    else
        snprintf(err, errlen, "model '%s': %s failed on the %s backend", m->sm->name, what,
                 r->be->name);
}

/* A copy that failed left garbage: unmap the segment so the next pass
 * pages it in again. */
static void drop_failed(res_t *r, res_model_t *m, uint32_t s)
{
    res_seg_t *sg = &m->segs[s];
    const store_seg_t *ss = &m->sm->segs[s];
    r->be->unmap(r->be->ctx, m->base, ss->off, ss->span);
    sg->state = RES_SEG_ABSENT;
    sg->timed = 0;
    m->weight_bytes -= ss->span;
    r->free_pages += ss->span / r->page;
    m->st.total_device_errors++;
    set_err(m, RES_ERR_DEVICE, "model '%s': the %s backend failed to copy segment %u to the device",
            m->sm->name, r->be->name, s);
    update_gauges(m);
}

/* m's first copy is queued: into the in-flight list at its place in the
 * models list (insertion walks the few models copying). */
static void inflight_link(res_t *r, res_model_t *m)
{
    res_model_t **pp = &r->inflight, *prev = NULL;
    while (*pp && (*pp)->ord > m->ord) {
        prev = *pp;
        pp = &(*pp)->if_next;
    }
    m->if_next = *pp;
    m->if_prev = prev;
    if (*pp)
        (*pp)->if_prev = m;
    *pp = m;
}

static void inflight_unlink(res_t *r, res_model_t *m)
{
    if (m->if_prev)
        m->if_prev->if_next = m->if_next;
    else
        r->inflight = m->if_next;
    if (m->if_next)
        m->if_next->if_prev = m->if_prev;
    m->if_next = m->if_prev = NULL;
}

/* A copy landed (or failed): the FIFO position reached, and its bandwidth. */
static void note_landed(res_t *r, res_model_t *m, res_seg_t *sg, size_t span)
{
    if (--m->n_inflight == 0)
        inflight_unlink(r, m);
    m->inflight_bytes -= sg->q_span;
    if (sg->q_end > r->landed_q)
        r->landed_q = sg->q_end;
    double d = sg->timed ? sg->t.end - sg->t.start : 0;
    if (d > 0) {
        double bw = (double)span / d;
        r->bw = r->bw > 0 ? 0.7 * r->bw + 0.3 * bw : bw;
    }
}

/* Move finished copies to RESIDENT and account their copy time; drop
 * failed ones. */
static void settle_seg(res_t *r, res_model_t *m, uint32_t s)
{
    res_seg_t *sg = &m->segs[s];
    if (sg->state != RES_SEG_INFLIGHT)
        return;
    int done = r->be->event_done(r->be->ctx, sg->ev);
    if (done == 0)
        return;
    if (done < 0) {
        note_landed(r, m, sg, 0);
        drop_failed(r, m, s);
        return;
    }
    sg->state = RES_SEG_RESIDENT;
    if (!sg->timed && r->be->event_times(r->be->ctx, sg->ev, &sg->t) == 0) {
        m->st.total_copy_ns += (uint64_t)((sg->t.end - sg->t.start) * 1e9);
        sg->timed = 1;
    }
    note_landed(r, m, sg, m->sm->segs[s].span);
}

static void settle(res_t *r, res_model_t *m)
{
    if (m->n_inflight == 0)
        return; /* nothing to settle */
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        settle_seg(r, m, s);
}

/* How far the copy engine's FIFO has come: settle every model with copies
 * in flight (a host may hold thousands of models, few of them copying). */
static void settle_all(res_t *r)
{
    for (res_model_t *v = r->inflight, *nx; v; v = nx) {
        nx = v->if_next;
        settle(r, v);
    }
}

/* Block the host until a queued copy has landed or failed (be_event_sync);
 * -1 if it is still in flight after timeout_s (INFINITY: wait for good, as
 * before unmapping it). A failed copy returns 0: settle_seg drops it. */
static int copy_sync(res_t *r, res_seg_t *sg, double timeout_s)
{
    return be_event_sync(r->be, sg->ev, timeout_s) == BE_ERR_TIMEOUT ? -1 : 0;
}

static void count_eviction(res_model_t *m, res_cause_t cause)
{
    switch (cause) {
    case RES_CAUSE_CAPACITY: m->st.evictions_capacity++; break;
    case RES_CAUSE_QUOTA: m->st.evictions_quota++; break;
    case RES_CAUSE_ADMIN: m->st.evictions_admin++; break;
    case RES_CAUSE_PREEMPTION: m->st.evictions_preemption++; break;
    }
}

static int evict_seg(res_t *r, res_model_t *m, uint32_t s, res_cause_t cause)
{
    res_seg_t *sg = &m->segs[s];
    if (sg->state == RES_SEG_ABSENT)
        return 0;
    if (sg->state == RES_SEG_INFLIGHT)
        copy_sync(r, sg, INFINITY);
    settle_seg(r, m, s);
    if (sg->state == RES_SEG_ABSENT)
        return 0; /* its copy failed: already unmapped */
    const store_seg_t *ss = &m->sm->segs[s];
    if (r->be->unmap(r->be->ctx, m->base, ss->off, ss->span))
        return RES_ERR_DEVICE;
    sg->state = RES_SEG_ABSENT;
    sg->timed = 0;
    m->weight_bytes -= ss->span;
    r->free_pages += ss->span / r->page;
    m->st.total_bytes_evicted += ss->span;
    count_eviction(m, cause);
    update_gauges(m);
    return 0;
}

/* Highest-index mapped segment in [lo, hi), or -1. */
static int64_t tail_seg(const res_model_t *m, uint32_t lo, uint32_t hi)
{
    for (uint32_t s = hi; s-- > lo;)
        if (m->segs[s].state != RES_SEG_ABSENT)
            return s;
    return -1;
}

static int evictable(const res_model_t *v)
{
    return v->running == 0 && !v->cfg.pinned && v->weight_bytes > 0;
}

/* Bytes a model with live KV caches may still lose before its next pass:
 * what the copy engine brings back within max_stall / RES_STALL_PARTS (no
 * bound when unset or before any copy was timed), counting that its pages
 * come back behind the copies already queued and the ahead bytes the pass
 * that takes them still queues. The caller steps such a model after as long
 * without a pass (its pass takes them back); the rest is margin. */
static size_t stall_budget(const res_t *r, const res_model_t *v, size_t ahead)
{
    if (r->max_stall_s <= 0 || r->bw <= 0)
        return SIZE_MAX;
    double b = r->max_stall_s / RES_STALL_PARTS * r->bw - (double)(r->q_bytes - r->landed_q) -
               (double)ahead - (double)v->stolen;
    return b > 0 ? (size_t)b : 0;
}

/* GreedyDual-Size-Frequency: value of keeping m per byte of pool. */
static void touch(res_t *r, res_model_t *m)
{
    double bytes = (double)m->sm->image_bytes;
    double cost = RES_COST_FIXED_S + bytes / RES_COST_BW;
    double prio = m->cfg.priority > 0 ? m->cfg.priority : 1.0;
    m->freq += 1.0;
    m->h = r->L + m->freq * prio * cost / bytes * 1e9;
}

/* Which victims a tier takes: 0 idle models (no live KV caches, no copy
 * in flight) nobody waits for; 1 idle models with work queued; 2 idle
 * models whose page-in is under way (unmapping waits for the copy); 3, the
 * last resort, models whose running sequences are paused between passes,
 * while their next tail segment fits the stall budget. */
#define RES_TIERS 4
static int in_tier(const res_t *r, const res_model_t *v, int tier, size_t ahead)
{
    if (tier < 2)
        return v->n_kv == 0 && v->n_inflight == 0 && v->wanted == tier;
    if (tier == 2)
        return v->n_kv == 0 && v->n_inflight > 0;
    int64_t s = tail_seg(v, 0, v->sm->n_segs);
    return v->n_kv > 0 && s >= 0 && v->sm->segs[s].span <= stall_budget(r, v, ahead);
}

/* The cheapest victim (GreedyDual) of the first tier below tiers that has one
 * (ahead: what the page-in that evicts keeps queued, see stall_budget). */
static res_model_t *pick_victim(res_t *r, const res_model_t *except, int tiers, size_t ahead)
{
    res_model_t *best = NULL;
    for (int tier = 0; tier < tiers && !best; tier++)
        for (res_model_t *v = r->models; v; v = v->next)
            if (v != except && evictable(v) && in_tier(r, v, tier, ahead) &&
                (!best || v->h < best->h))
                best = v;
    return best;
}

/* Free pages by evicting other models tail-first (victims from the first
 * tiers only) until need pages are free; ahead as for pick_victim. */
static int make_room_others(res_t *r, const res_model_t *m, size_t need, int tiers, size_t ahead)
{
    while (r->free_pages < need) {
        res_model_t *v = pick_victim(r, m, tiers, ahead);
        if (!v)
            return RES_ERR_NOSPACE;
        r->L = v->h > r->L ? v->h : r->L;
        int64_t s = tail_seg(v, 0, v->sm->n_segs);
        /* a victim with live KV caches has sequences paused mid-generation:
         * that is preemption (their caches stay; the weights come back) */
        if (v->n_kv > 0)
            v->stolen += v->sm->segs[s].span;
        int rc =
            evict_seg(r, v, (uint32_t)s, v->n_kv > 0 ? RES_CAUSE_PREEMPTION : RES_CAUSE_CAPACITY);
        if (rc)
            return rc;
    }
    return 0;
}

/* Records the device's high-water mark after pages or scratch were taken. */
static void note_used(res_t *r)
{
    size_t used = (r->n_pages - r->free_pages) * r->page + r->scratch_bytes;
    if (used > r->peak_used)
        r->peak_used = used;
}

/* A map failed for lack of physical memory (BE_ERR_NOMEM) although the
 * budget said there was room: the device gives less than the budget (other
 * processes, the driver's own use). Lower the budget to what is in use now
 * (never below the largest model wholly resident plus the KV minimum: what
 * the configuration needs to work at all) and
 * evict idle models to free need pages more, so the caller can retry the map
 * once. 0 when it may retry. */
static int device_short(res_t *r, const res_model_t *m, size_t need)
{
    size_t floor = pages_of(r, r->headroom) + 2, used = r->n_pages - r->free_pages;
    size_t keep = used > floor ? used : floor;
    if (keep < r->n_pages) {
        size_t cut = r->n_pages - keep;
        if (cut > r->free_pages)
            cut = r->free_pages;
        r->n_pages -= cut;
        r->free_pages -= cut;
        r->cut_pages += cut;
    }
    /* pages free in the pool are not held on the device: only unmapping
     * gives it room. Evict idle models (tiers 0..2) for need pages more;
     * retry if something was freed and the pool has room for the map */
    size_t before = r->free_pages;
    make_room_others(r, m, before + need, 3, 0);
    return r->free_pages > before && r->free_pages >= need ? 0 : RES_ERR_NOMEM;
}

/* Map segment s and queue its copy. */
static int page_in(res_t *r, res_model_t *m, uint32_t s)
{
    const store_seg_t *ss = &m->sm->segs[s];
    res_seg_t *sg = &m->segs[s];
    uint64_t t0 = util_now_ns();
    int brc = r->be->map(r->be->ctx, m->base, ss->off, ss->span);
    /* a failure recovered by evicting is not a device error (the worker
     * watches that counter for failed page-ins): the lowered budget shows it */
    if (brc == BE_ERR_NOMEM && device_short(r, m, ss->span / r->page) == 0)
        brc = r->be->map(r->be->ctx, m->base, ss->off, ss->span); /* once more, after evicting */
    if (brc) {
        m->st.total_device_errors++;
        if (brc == BE_ERR_NOMEM) {
            set_err(m, RES_ERR_NOMEM,
                    "model '%s': device memory exhausted (the %s backend could not map "
                    "%.1f MiB)",
                    m->sm->name, r->be->name, ss->span / 1048576.0);
            return RES_ERR_NOMEM;
        }
        set_err(m, RES_ERR_DEVICE, "model '%s': the %s backend failed to map segment %u (%d)",
                m->sm->name, r->be->name, s, brc);
        return RES_ERR_DEVICE;
    }
    m->st.total_map_ns += util_now_ns() - t0;
    r->free_pages -= ss->span / r->page;
    note_used(r);
    m->weight_bytes += ss->span;
    /* the host image holds the segment packed: its host_span is copied, the
     * rest of the span (page padding) is never read */
    if (r->be->copy_h2d(r->be->ctx, (uint8_t *)m->base + ss->off, m->sm->image + ss->host_off,
                        ss->host_span, sg->ev)) {
        r->be->unmap(r->be->ctx, m->base, ss->off, ss->span);
        r->free_pages += ss->span / r->page;
        m->weight_bytes -= ss->span;
        m->st.total_device_errors++;
        set_err(m, RES_ERR_DEVICE, "model '%s': the %s backend refused to queue a copy",
                m->sm->name, r->be->name);
        return RES_ERR_DEVICE;
    }
    sg->state = RES_SEG_INFLIGHT;
    sg->timed = 0;
    r->q_bytes += ss->span;
    sg->q_end = r->q_bytes;
    sg->q_span = ss->span;
    if (m->n_inflight++ == 0)
        inflight_link(r, m);
    m->inflight_bytes += ss->span;
    m->st.total_page_ins++;
    m->st.total_bytes_in += ss->span;
    update_gauges(m);
    return 0;
}

/* Page in missing segments in order while they fit the quota and the pool
 * (evicting idle models when evict is set). Stops at the first that does not. */
static int page_in_prefix(res_t *r, res_model_t *m, int evict, size_t ahead)
{
    for (uint32_t s = 0; s < m->sm->n_segs; s++) {
        if (m->segs[s].state != RES_SEG_ABSENT)
            continue;
        if (ahead && m->inflight_bytes >= ahead)
            return 0; /* enough queued for now: the rest in a later call */
        size_t span = m->sm->segs[s].span;
        if (res_model_bytes(m) + span > quota_of(r, m))
            return 0;
        size_t need = span / r->page;
        if (r->free_pages < need) {
            if (!evict)
                return 0;
            /* only a pass (m running) takes pages from running sequences: a
             * page-in ahead of it would lose them again to their next pass
             * before it can run. A victim's pages come back behind what m
             * keeps queued: its window, or (all at once) the rest of it */
            int tiers = evict == RES_EVICT_UNWANTED ? 1 : m->running ? RES_TIERS : RES_TIERS - 1;
            size_t queued = ahead;
            for (uint32_t t = s; !ahead && t < m->sm->n_segs; t++)
                queued += m->segs[t].state == RES_SEG_ABSENT ? m->sm->segs[t].span : 0;
            int rc = make_room_others(r, m, need, tiers, queued);
            if (rc == RES_ERR_NOSPACE)
                return 0;
            if (rc)
                return rc;
        }
        int rc = page_in(r, m, s);
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ models */

int res_add(res_t *r, store_model_t *sm, const res_cfg_t *cfg, res_model_t **out, char *err,
            size_t errlen)
{
    size_t min_bytes = min_run_bytes(sm);
    res_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return RES_ERR_NOMEM;
    }
    m->r = r;
    m->sm = sm;
    m->cfg = *cfg;
    if (m->cfg.priority <= 0)
        m->cfg.priority = 1.0;
    size_t quota = quota_of(r, m);
    if (!r->be->zero_copy && (min_bytes > quota || min_bytes > r->n_pages * r->page)) {
        snprintf(err, errlen,
                 "model '%s': needs at least %.1f MiB on the device (embedding + largest layer), "
                 "but its gpu_quota is %.1f MiB and the pool %.1f MiB",
                 sm->name, min_bytes / 1048576.0, quota / 1048576.0,
                 r->n_pages * r->page / 1048576.0);
        free(m);
        return RES_ERR_QUOTA;
    }
    for (uint32_t s = 0; s < sm->n_segs; s++)
        m->span_bytes += sm->segs[s].span;
    m->segs = calloc(sm->n_segs, sizeof *m->segs);
    m->dev_layers = calloc(sm->model->hp.n_layer, sizeof *m->dev_layers);
    if (!m->segs || !m->dev_layers)
        goto oom;
    if (r->be->zero_copy) {
        /* weights are used in place: always resident, nothing to page */
        for (uint32_t s = 0; s < sm->n_segs; s++)
            m->segs[s].state = RES_SEG_RESIDENT;
        if (store_weights_at(sm, sm->image, STORE_AT_HOST, &m->dev, m->dev_layers))
            goto oom;
    } else {
        if (r->be->reserve(r->be->ctx, sm->image_bytes, &m->base)) {
            snprintf(err, errlen, "model '%s': cannot reserve %.1f MiB of device address space",
                     sm->name, sm->image_bytes / 1048576.0);
            free(m->segs);
            free(m->dev_layers);
            free(m);
            return RES_ERR_DEVICE;
        }
        for (uint32_t s = 0; s < sm->n_segs; s++)
            if (r->be->event_new(r->be->ctx, &m->segs[s].ev))
                goto oom;
        if (store_weights_at(sm, m->base, STORE_AT_DEVICE, &m->dev, m->dev_layers))
            goto oom;
    }
    m->ord = ++r->n_added;
    m->next = r->models;
    r->models = m;
    update_headroom(r);
    update_gauges(m);
    *out = m;
    return RES_OK;
oom:
    snprintf(err, errlen, "out of memory");
    if (m->base)
        r->be->release(r->be->ctx, m->base, sm->image_bytes);
    for (uint32_t s = 0; m->segs && s < sm->n_segs; s++)
        if (m->segs[s].ev)
            r->be->event_free(r->be->ctx, m->segs[s].ev);
    free(m->segs);
    free(m->dev_layers);
    free(m);
    return RES_ERR_NOMEM;
}

int res_remove(res_t *r, res_model_t *m)
{
    if (m->running || m->n_kv)
        return RES_ERR_BUSY;
    if (!r->be->zero_copy) {
        for (uint32_t s = 0; s < m->sm->n_segs; s++) {
            if (m->segs[s].state != RES_SEG_ABSENT)
                evict_seg(r, m, s, RES_CAUSE_ADMIN);
            r->be->event_free(r->be->ctx, m->segs[s].ev);
        }
        r->be->release(r->be->ctx, m->base, m->sm->image_bytes);
    }
    if (m->n_inflight)
        inflight_unlink(r, m); /* a copy that never settled (its evict_seg failed) */
    res_model_t **pp = &r->models;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    update_headroom(r);
    free(m->segs);
    free(m->dev_layers);
    free(m);
    return RES_OK;
}

/* Bytes a pinned model may hold for good: its image, or its quota when smaller. */
static size_t pinned_bytes(const res_t *r, const res_model_t *m)
{
    size_t b = m->sm->image_bytes;
    (void)r;
    return m->cfg.gpu_quota && m->cfg.gpu_quota < b ? m->cfg.gpu_quota : b;
}

/* RES_ERR_QUOTA when pinning m as well leaves no room beside the pinned
 * weights for the KV minimum (one page of K and one of V) and for every
 * unpinned model to run (its embedding + largest other segment). */
static int pin_check(const res_t *r, const res_model_t *m, char *err, size_t errlen)
{
    size_t pinned = 0, run = 0;
    for (const res_model_t *v = r->models; v; v = v->next) {
        if (v == m || v->cfg.pinned)
            pinned += pinned_bytes(r, v);
        else if (min_run_bytes(v->sm) > run)
            run = min_run_bytes(v->sm);
    }
    size_t need = pinned + run + 2 * r->page, pool = r->n_pages * r->page;
    if (need <= pool)
        return RES_OK;
    snprintf(err, errlen,
             "model '%s': pinning it would hold %.1f MiB of pinned weights, which with "
             "%.1f MiB for other models to run and the KV minimum exceeds the %.1f MiB pool",
             m->sm->name, pinned / 1048576.0, run / 1048576.0, pool / 1048576.0);
    return RES_ERR_QUOTA;
}

int res_set_cfg(res_t *r, res_model_t *m, const res_cfg_t *cfg, char *err, size_t errlen)
{
    res_cfg_t c = *cfg;
    if (c.priority <= 0)
        c.priority = 1.0;
    if (c.pinned && !m->cfg.pinned && !r->be->zero_copy) {
        int rc = pin_check(r, m, err, errlen);
        if (rc)
            return rc;
    }
    m->cfg = c;
    update_headroom(r);
    /* shrink to a lowered quota now, tail-first, unless running */
    while (res_model_bytes(m) > quota_of(r, m) && !m->running) {
        int64_t s = tail_seg(m, 0, m->sm->n_segs);
        if (s < 0)
            break;
        if (evict_seg(r, m, (uint32_t)s, RES_CAUSE_QUOTA)) {
            snprintf(err, errlen, "model '%s': eviction failed", m->sm->name);
            return RES_ERR_DEVICE;
        }
    }
    return RES_OK;
}

/* ------------------------------------------------------------------ passes */

int res_acquire(res_t *r, res_model_t *m, char *err, size_t errlen)
{
    settle(r, m); /* drops copies that failed: they are paged in again below */
    set_err(m, 0, "%s", "");
    m->running++;
    m->stolen = 0;
    m->prefetch_touched = 0;
    touch(r, m);
    if (r->be->zero_copy) {
        m->st.total_hits++;
        update_gauges(m);
        return RES_OK;
    }
    int miss = 0;
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        miss |= m->segs[s].state != RES_SEG_RESIDENT;
    if (miss)
        m->st.total_misses++;
    else
        m->st.total_hits++;
    int rc = page_in_prefix(r, m, 1, 0);
    update_gauges(m);
    if (rc) {
        err_report(r, m, "page-in", err, errlen);
        m->running--;
        update_gauges(m);
    }
    return rc;
}

void res_release(res_t *r, res_model_t *m)
{
    if (m->running > 0)
        m->running--;
    settle(r, m);
    update_gauges(m);
}

int res_prefetch(res_t *r, res_model_t *m, int evict, char *err, size_t errlen)
{
    return res_prefetch_ahead(r, m, evict, 0, err, errlen);
}

int res_prefetch_ahead(res_t *r, res_model_t *m, int evict, size_t ahead, char *err, size_t errlen)
{
    if (r->be->zero_copy)
        return RES_OK;
    settle(r, m);
    /* one use per page-in, however many calls queue its segments */
    if (!m->prefetch_touched)
        touch(r, m);
    m->prefetch_touched = 1;
    set_err(m, 0, "%s", "");
    int rc = page_in_prefix(r, m, evict, ahead);
    if (rc)
        err_report(r, m, "prefetch", err, errlen);
    return rc;
}

int res_evict(res_t *r, res_model_t *m, res_cause_t cause, uint32_t max_segs)
{
    if (r->be->zero_copy)
        return RES_OK;
    if (m->running)
        return RES_ERR_BUSY;
    for (uint32_t n = 0; max_segs == 0 || n < max_segs; n++) {
        int64_t s = tail_seg(m, 0, m->sm->n_segs);
        if (s < 0)
            break;
        int rc = evict_seg(r, m, (uint32_t)s, cause);
        if (rc)
            return rc;
    }
    return RES_OK;
}

int res_seg_request(res_t *r, res_model_t *m, uint32_t seg)
{
    if (r->be->zero_copy || m->segs[seg].state != RES_SEG_ABSENT)
        return 0;
    /* streaming: acquire could not fit this one. Make room from idle
     * models, then from this model's own segments, the one needed
     * furthest ahead first (Belady for a cyclic pass): the highest
     * below seg, else the highest above it; never the embedding (tied
     * heads read it at the end of the pass). */
    size_t span = m->sm->segs[seg].span, need = span / r->page;
    for (;;) {
        int over_quota = res_model_bytes(m) + span > quota_of(r, m);
        if (!over_quota && r->free_pages >= need)
            break;
        if (!over_quota && make_room_others(r, m, need, RES_TIERS, 0) == 0)
            break;
        int64_t own = tail_seg(m, 1, seg);
        if (own < 0)
            own = tail_seg(m, seg + 1, m->sm->n_segs);
        if (own < 0) {
            set_err(m, RES_ERR_NOSPACE,
                    "model '%s': no device memory for segment %u now (the "
                    "pool is held by running or pinned models)",
                    m->sm->name, seg);
            return RES_ERR_NOSPACE;
        }
        int rc = evict_seg(r, m, (uint32_t)own, over_quota ? RES_CAUSE_QUOTA : RES_CAUSE_CAPACITY);
        if (rc)
            return rc;
    }
    int rc = page_in(r, m, seg);
    if (rc)
        return rc;
    /* queue the next ones too while they fit without evicting */
    for (uint32_t s = seg + 1; s < m->sm->n_segs; s++) {
        if (m->segs[s].state != RES_SEG_ABSENT)
            continue;
        size_t sp = m->sm->segs[s].span;
        if (res_model_bytes(m) + sp > quota_of(r, m) || r->free_pages < sp / r->page)
            break;
        if ((rc = page_in(r, m, s)))
            return rc;
    }
    return 0;
}

double res_seg_lands_in(res_t *r, res_model_t *m, uint32_t seg)
{
    const res_seg_t *sg = &m->segs[seg];
    if (r->be->zero_copy)
        return 0;
    if (sg->state == RES_SEG_ABSENT)
        return INFINITY;
    settle_all(r);
    if (sg->state != RES_SEG_INFLIGHT)
        return 0;
    if (r->bw <= 0)
        return RES_POLL_S;
    return (double)(sg->q_end - r->landed_q) / r->bw;
}

/* The forward pass's wait hook: segment seg is about to be read. */
static int hook_wait(void *ctx, uint32_t seg)
{
    res_model_t *m = ctx;
    res_t *r = m->r;
    if (r->be->zero_copy)
        return 0;
    res_seg_t *sg = &m->segs[seg];
    int rc = res_seg_request(r, m, seg);
    if (rc)
        return rc;
    if (sg->state == RES_SEG_INFLIGHT) {
        /* wait on the host up to the copy timeout (a stuck or very slow
         * copy fails this pass rather than the whole daemon); the segment
         * stays in flight and lands, or fails, on its own */
        if (copy_sync(r, sg, r->copy_timeout_s)) {
            m->st.total_device_errors++;
            set_err(m, RES_ERR_TIMEOUT,
                    "model '%s': the copy of segment %u to the device did not "
                    "complete within %.3g s",
                    m->sm->name, seg, r->copy_timeout_s);
            return RES_ERR_TIMEOUT;
        }
        if (r->be->wait(r->be->ctx, sg->ev)) {
            settle_seg(r, m, seg);
            if (!m->err_code)
                set_err(m, RES_ERR_DEVICE, "model '%s': the copy of segment %u failed", m->sm->name,
                        seg);
            return RES_ERR_DEVICE;
        }
        settle_seg(r, m, seg);
        /* cuda's wait is a stream dependency: the segment counts as resident
         * for scheduling as soon as compute is ordered after its copy */
        if (sg->state == RES_SEG_INFLIGHT && r->be->event_done(r->be->ctx, sg->ev) < 0) {
            settle_seg(r, m, seg);
            return RES_ERR_DEVICE;
        }
    }
    return 0;
}

double res_ready_in(res_t *r, res_model_t *m, double compute_s)
{
    if (r->be->zero_copy)
        return 0;
    settle_all(r);
    double worst = 0, image = (double)m->sm->image_bytes;
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        if (m->segs[s].state == RES_SEG_ABSENT)
            return INFINITY;
    for (uint32_t s = 0; s < m->sm->n_segs; s++) {
        const res_seg_t *sg = &m->segs[s];
        if (sg->state != RES_SEG_INFLIGHT)
            continue;
        if (r->bw <= 0)
            return RES_POLL_S; /* no copy timed yet: wait for them all */
        /* lands after the bytes queued before it (the one being copied
         * counted whole: an estimate on the late side) */
        double lands = (double)(sg->q_end - r->landed_q) / r->bw;
        double needed = compute_s * (double)m->sm->segs[s].off / image;
        if (lands - needed > worst)
            worst = lands - needed;
    }
    return worst;
}

size_t res_pagein_window(const res_t *r, const res_model_t *m, double round_s, double pass_s)
{
    double cover_s = pass_s > round_s ? pass_s : round_s;
    size_t mx = 0;
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        if (m->sm->segs[s].span > mx)
            mx = m->sm->segs[s].span;
    double busy = r->bw > 0 ? r->bw * cover_s : 0;
    return busy > 2.0 * mx ? (size_t)busy : 2 * mx;
}

int res_inflight(const res_model_t *m)
{
    return m->n_inflight;
}

int res_copy_overdue(res_t *r, res_model_t *m, char *err, size_t errlen)
{
    uint32_t seg = 0;
    while (seg + 1 < m->sm->n_segs && m->segs[seg].state != RES_SEG_INFLIGHT)
        seg++;
    m->st.total_device_errors++;
    set_err(m, RES_ERR_TIMEOUT,
            "model '%s': the copy of segment %u to the device did not "
            "complete within %.3g s",
            m->sm->name, seg, r->copy_timeout_s);
    snprintf(err, errlen, "%s", m->err);
    return RES_ERR_TIMEOUT;
}

size_t res_spare_pages(const res_t *r)
{
    size_t spare = r->free_pages;
    for (const res_model_t *v = r->models; v; v = v->next)
        if (!v->wanted && evictable(v) && v->n_kv == 0 && v->n_inflight == 0)
            spare += v->weight_bytes / r->page;
    return spare;
}

int res_pagein_fits(res_t *r, res_model_t *m, size_t spare, size_t reserve_bytes)
{
    size_t reserve = (reserve_bytes + r->page - 1) / r->page;
    settle(r, m); /* a failed copy is missing again */
    size_t missing = (m->span_bytes - m->weight_bytes) / r->page;
    /* a model above its quota streams the rest through it: what it maps */
    size_t quota = m->cfg.gpu_quota ? m->cfg.gpu_quota / r->page : SIZE_MAX;
    size_t held = m->weight_bytes / r->page;
    if (held + missing > quota)
        missing = quota > held ? quota - held : 0;
    if (!m->wanted && evictable(m) && m->n_kv == 0 && m->n_inflight == 0)
        spare -= m->weight_bytes / r->page; /* counted among the spare: not its own room */
    spare = spare > reserve ? spare - reserve : 0;
    return missing <= spare ? 1 : -1;
}

void res_set_wanted(res_model_t *m, int wanted)
{
    m->wanted = wanted != 0;
}

void res_set_max_stall(res_t *r, double seconds)
{
    r->max_stall_s = seconds > 0 ? seconds : 0;
}

int res_last_error(const res_model_t *m, const char **msg)
{
    if (msg)
        *msg = m->err;
    return m->err_code;
}

void res_set_copy_timeout(res_t *r, double seconds)
{
    r->copy_timeout_s = seconds > 0 ? seconds : 30.0;
}

fwd_hooks_t res_hooks(res_model_t *m)
{
    return (fwd_hooks_t){.wait = hook_wait, .ctx = m};
}

/* ------------------------------------------------------------------ KV caches */

int res_kv_new(res_t *r, res_model_t *m, uint32_t n_ctx, kv_seq_t **out, char *err, size_t errlen)
{
    const model_hparams_t *hp = &m->sm->model->hp;
    res_kv_t *k = calloc(1, sizeof *k);
    if (!k) {
        snprintf(err, errlen, "out of memory");
        return RES_ERR_NOMEM;
    }
    k->m = m;
    k->kv.n_layer = hp->n_layer;
    k->kv.n_ctx = n_ctx;
    k->kv.kv_dim = hp->n_head_kv * hp->head_dim;
    if (m->n_kv == 0)
        m->kv_live_type = m->cfg.kv_type;
    k->kv.type = m->kv_live_type;
    k->kv.owner = k;
    k->range_bytes = res_kv_bytes_model(r, m, n_ctx) / 2;
    void *kb = NULL, *vb = NULL;
    if (r->be->zero_copy) {
        /* host memory is device memory: plain allocations, no quota */
        kb = malloc(k->range_bytes);
        vb = malloc(k->range_bytes);
        if (!kb || !vb) {
            free(kb);
            free(vb);
            free(k);
            snprintf(err, errlen, "model '%s': out of memory for a KV cache of %u positions",
                     m->sm->name, n_ctx);
            return RES_ERR_NOMEM;
        }
    } else if (r->be->reserve(r->be->ctx, k->range_bytes, &kb) ||
               r->be->reserve(r->be->ctx, k->range_bytes, &vb)) {
        if (kb)
            r->be->release(r->be->ctx, kb, k->range_bytes);
        free(k);
        snprintf(err, errlen, "model '%s': cannot reserve address space for a KV cache",
                 m->sm->name);
        return RES_ERR_DEVICE;
    }
    k->kv.k = kb;
    k->kv.v = vb;
    m->n_kv++;
    m->st.total_kv_allocs++;
    update_gauges(m);
    *out = &k->kv;
    return RES_OK;
}

/* Map [off, off+len) of both halves of a KV cache; all or nothing. */
static int kv_map(res_t *r, kv_seq_t *kv, size_t off, size_t len)
{
    int rc = r->be->map(r->be->ctx, kv->k, off, len);
    if (rc)
        return rc;
    if ((rc = r->be->map(r->be->ctx, kv->v, off, len)))
        r->be->unmap(r->be->ctx, kv->k, off, len);
    return rc;
}

int res_kv_ensure(res_t *r, kv_seq_t *kv, uint32_t n_pos, char *err, size_t errlen)
{
    res_kv_t *k = kv->owner;
    res_model_t *m = k->m;
    if (n_pos > kv->n_ctx) {
        snprintf(err, errlen, "model '%s': %u positions exceed the KV cache of %u", m->sm->name,
                 n_pos, kv->n_ctx);
        return RES_ERR_QUOTA;
    }
    if (r->be->zero_copy)
        return RES_OK;
    size_t per_pos = (size_t)kv->n_layer * kv->kv_dim * kv_type_size(kv->type);
    size_t want = pages_of(r, n_pos * per_pos) * r->page;
    if (want <= k->mapped_bytes)
        return RES_OK;
    size_t extra = 2 * (want - k->mapped_bytes);
    /* KV may never take the room a model needs to run (it is not evictable) */
    if (extra > res_kv_available_for(r, m)) {
        snprintf(err, errlen,
                 "model '%s': the KV budget is used up (%.1f MiB of KV mapped; "
                 "%.1f MiB of the pool stay free for weights, %.1f MiB more reserved by other "
                 "models' kv_cache)",
                 m->sm->name, r->kv_bytes / 1048576.0, r->headroom / 1048576.0,
                 (res_kv_available(r) - res_kv_available_for(r, m)) / 1048576.0);
        return RES_ERR_NOSPACE;
    }
    /* quota: shed this model's own tail (not the embedding) */
    while (res_model_bytes(m) + extra > quota_of(r, m)) {
        int64_t s = tail_seg(m, 1, m->sm->n_segs);
        if (s < 0) {
            snprintf(err, errlen,
                     "model '%s': its KV cache cannot grow to %u positions within "
                     "its gpu_quota",
                     m->sm->name, n_pos);
            return RES_ERR_QUOTA;
        }
        if (evict_seg(r, m, (uint32_t)s, RES_CAUSE_QUOTA))
            goto device;
    }
    /* capacity: idle models first, then this model's own tail (it streams) */
    while (r->free_pages < extra / r->page &&
           make_room_others(r, m, extra / r->page, RES_TIERS, 0)) {
        int64_t s = tail_seg(m, 1, m->sm->n_segs);
        if (s < 0) {
            snprintf(err, errlen,
                     "model '%s': no device memory for the KV cache (the pool is "
                     "held by running or pinned models)",
                     m->sm->name);
            return RES_ERR_NOSPACE;
        }
        if (evict_seg(r, m, (uint32_t)s, RES_CAUSE_CAPACITY))
            goto device;
    }
    size_t off = k->mapped_bytes, len = want - k->mapped_bytes;
    int brc = kv_map(r, kv, off, len);
    if (brc == BE_ERR_NOMEM && device_short(r, m, extra / r->page) == 0)
        brc = kv_map(r, kv, off, len); /* once more, after evicting */
    if (brc == BE_ERR_NOMEM) {
        m->st.total_device_errors++;
        snprintf(err, errlen,
                 "model '%s': device memory exhausted (the %s backend could not map "
                 "%.1f MiB of KV cache)",
                 m->sm->name, r->be->name, extra / 1048576.0);
        return RES_ERR_NOMEM;
    }
    if (brc)
        goto device;
    k->mapped_bytes = want;
    r->free_pages -= extra / r->page;
    note_used(r);
    m->kv_bytes += extra;
    r->kv_bytes += extra;
    update_gauges(m);
    return RES_OK;
device: /* every error return says why: callers pass err on to the client */
    snprintf(err, errlen, "model '%s': the device failed to map or unmap KV cache memory",
             m->sm->name);
    return RES_ERR_DEVICE;
}

void res_kv_free(res_t *r, kv_seq_t *kv)
{
    if (!kv)
        return;
    res_kv_t *k = kv->owner;
    res_model_t *m = k->m;
    if (k->mapped_bytes) {
        r->be->unmap(r->be->ctx, kv->k, 0, k->mapped_bytes);
        r->be->unmap(r->be->ctx, kv->v, 0, k->mapped_bytes);
        r->free_pages += 2 * k->mapped_bytes / r->page;
        m->kv_bytes -= 2 * k->mapped_bytes;
        r->kv_bytes -= 2 * k->mapped_bytes;
    }
    if (r->be->zero_copy) {
        free(kv->k);
        free(kv->v);
    } else {
        r->be->release(r->be->ctx, kv->k, k->range_bytes);
        r->be->release(r->be->ctx, kv->v, k->range_bytes);
    }
    m->n_kv--;
    m->st.total_kv_frees++;
    update_gauges(m);
    free(k);
}

/* ------------------------------------------------------------------ scratch */

void res_scratch_note(res_t *r, size_t bytes)
{
    if (r->be->zero_copy)
        return; /* cpu: activations are host memory like everything else */
    r->scratch_bytes = bytes;
    size_t want = pages_of(r, bytes);
    if (want > r->scratch_pages) {
        /* the scratch grew: its pages come off the pool (pages free in the pool are not
         * held on the device), idle models giving theirs back first; what even that
         * cannot free runs beyond the budget, in the device's headroom (peak_device_bytes) */
        size_t more = want - r->scratch_pages, floor = pages_of(r, r->headroom) + 2;
        make_room_others(r, NULL, more, 3, 0);
        if (more > r->free_pages)
            more = r->free_pages;
        if (more > r->n_pages - floor) /* never below what the largest model needs */
            more = r->n_pages > floor ? r->n_pages - floor : 0;
        r->n_pages -= more;
        r->free_pages -= more;
        r->scratch_pages += more;
    }
    note_used(r);
}

/* ------------------------------------------------------------------ state */

res_seg_state_t res_seg_state(res_t *r, res_model_t *m, uint32_t seg)
{
    settle_seg(r, m, seg);
    return m->segs[seg].state;
}

int res_seg_times(res_t *r, res_model_t *m, uint32_t seg, be_copy_times_t *t)
{
    settle_seg(r, m, seg);
    if (m->segs[seg].state != RES_SEG_RESIDENT || !m->segs[seg].timed)
        return RES_ERR_BUSY;
    *t = m->segs[seg].t;
    return RES_OK;
}

int res_fully_resident(res_t *r, res_model_t *m)
{
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        if (res_seg_state(r, m, s) != RES_SEG_RESIDENT)
            return 0;
    return 1;
}

int res_streams(const res_model_t *m)
{
    return !m->r->be->zero_copy && quota_of(m->r, m) < m->span_bytes;
}

int res_lost_pages(const res_model_t *m)
{
    return m->stolen > 0;
}

void res_model_stats(res_t *r, res_model_t *m, stats_res_t *out)
{
    settle(r, m);
    update_gauges(m);
    *out = m->st;
}

void res_pool_stats(const res_t *r, stats_pool_t *out)
{
    out->curr_pool_pages = r->n_pages;
    out->curr_pool_free = r->free_pages;
    out->curr_pool_used = r->n_pages - r->free_pages;
    out->page_size = r->page;
    out->curr_scratch_bytes = r->scratch_bytes;
    out->peak_device_bytes = r->peak_used;
    out->curr_budget_cut_bytes = r->cut_pages * r->page;
    out->curr_scratch_reserved_bytes = r->scratch_pages * r->page;
}

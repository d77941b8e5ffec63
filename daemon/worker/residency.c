/* residency: the device page pool, per-model mappings, pipelined page-in and quotas; eviction in res_evict.c, KV pages in res_kv.c. */
#include "residency.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

#include "residency_int.h"

/* What res_ready_in answers while no copy has been timed yet: poll again. */
#define RES_POLL_S 1e-3

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
size_t res_weight_bytes(const res_model_t *m)
{
    return m->weight_bytes;
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

/* ------------------------------------------------------------------ page-in */

/* Map segment s and queue its copy. */
static int page_in(res_t *r, res_model_t *m, uint32_t s)
{
    const store_seg_t *ss = &m->sm->segs[s];
    res_seg_t *sg = &m->segs[s];
    if (res_units_drop(r, m, s, -1)) /* held unit by unit: whole from now on */
        return RES_ERR_DEVICE;
    uint64_t t0 = util_now_ns();
    int brc = r->be->map(r->be->ctx, m->base, ss->off, ss->span);
    /* a failure recovered by evicting is not a device error (the worker
     * watches that counter for failed page-ins): the lowered budget shows it */
    if (brc == BE_ERR_NOMEM && res_device_short(r, m, ss->span / r->page) == 0)
        brc = r->be->map(r->be->ctx, m->base, ss->off, ss->span); /* once more, after evicting */
    if (brc) {
        m->st.total_device_errors++;
        if (brc == BE_ERR_NOMEM) {
            res_set_err(m, RES_ERR_NOMEM,
                        "model '%s': device memory exhausted (the %s backend could not map "
                        "%.1f MiB)",
                        m->sm->name, r->be->name, ss->span / 1048576.0);
            return RES_ERR_NOMEM;
        }
        res_set_err(m, RES_ERR_DEVICE, "model '%s': the %s backend failed to map segment %u (%d)",
                    m->sm->name, r->be->name, s, brc);
        return RES_ERR_DEVICE;
    }
    m->st.total_map_ns += util_now_ns() - t0;
    r->free_pages -= ss->span / r->page;
    res_note_used(r);
    m->weight_bytes += ss->span;
    /* the host image holds the segment packed: its host_span is copied, the
     * rest of the span (page padding) is never read */
    if (r->be->copy_h2d(r->be->ctx, (uint8_t *)m->base + ss->off, m->sm->image + ss->host_off,
                        ss->host_span, sg->ev)) {
        r->be->unmap(r->be->ctx, m->base, ss->off, ss->span);
        r->free_pages += ss->span / r->page;
        m->weight_bytes -= ss->span;
        m->st.total_device_errors++;
        res_set_err(m, RES_ERR_DEVICE, "model '%s': the %s backend refused to queue a copy",
                    m->sm->name, r->be->name);
        return RES_ERR_DEVICE;
    }
    sg->state = RES_SEG_INFLIGHT;
    sg->timed = 0;
    r->q_bytes += ss->span;
    sg->q_end = r->q_bytes;
    sg->q_span = ss->span;
    if (m->n_inflight++ == 0)
        res_inflight_link(r, m);
    m->inflight_bytes += ss->span;
    m->st.total_page_ins++;
    m->st.total_bytes_in += ss->span;
    res_update_gauges(m);
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
        /* held unit by unit (experts): paged whole instead */
        if (res_units_drop(r, m, s, -1))
            return RES_ERR_DEVICE;
        size_t span = m->sm->segs[s].span;
        if (!res_quota_room(r, m, span))
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
            int rc = res_make_room_others(r, m, need, tiers, queued);
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
    size_t quota = res_quota_of(r, m);
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
    res_update_gauges(m);
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
    while (res_kv_reclaim(r, m))
        ;
    res_kv_host_drop_model(r, m);
    res_att_free_all(r, m);
    if (!r->be->zero_copy) {
        for (uint32_t s = 0; s < m->sm->n_segs; s++) {
            if (m->segs[s].state != RES_SEG_ABSENT || m->segs[s].us)
                res_evict_seg(r, m, s, RES_CAUSE_ADMIN);
            res_units_free(r, &m->segs[s]);
            r->be->event_free(r->be->ctx, m->segs[s].ev);
        }
        r->be->release(r->be->ctx, m->base, m->sm->image_bytes);
    }
    if (m->n_inflight)
        res_inflight_unlink(r, m); /* a copy that never settled (its res_evict_seg failed) */
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
    /* shrink to a lowered quota now, cached KV first, then tail-first, unless running */
    while (!res_quota_room(r, m, 0) && !m->running) {
        int64_t s = res_tail_seg(m, 0, m->sm->n_segs);
        if (s < 0)
            break;
        if (res_evict_seg(r, m, (uint32_t)s, RES_CAUSE_QUOTA)) {
            snprintf(err, errlen, "model '%s': eviction failed", m->sm->name);
            return RES_ERR_DEVICE;
        }
    }
    return RES_OK;
}

/* ------------------------------------------------------------------ passes */

int res_acquire(res_t *r, res_model_t *m, char *err, size_t errlen)
{
    res_settle(r, m); /* drops copies that failed: they are paged in again below */
    res_set_err(m, 0, "%s", "");
    m->running++;
    m->stolen = 0;
    m->prefetch_touched = 0;
    res_touch(r, m);
    if (r->be->zero_copy) {
        m->st.total_hits++;
        res_update_gauges(m);
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
    res_update_gauges(m);
    if (rc) {
        err_report(r, m, "page-in", err, errlen);
        m->running--;
        res_update_gauges(m);
    }
    return rc;
}

void res_release(res_t *r, res_model_t *m)
{
    if (m->running > 0)
        m->running--;
    res_settle(r, m);
    res_update_gauges(m);
}

int res_prefetch(res_t *r, res_model_t *m, int evict, char *err, size_t errlen)
{
    return res_prefetch_ahead(r, m, evict, 0, err, errlen);
}

int res_prefetch_ahead(res_t *r, res_model_t *m, int evict, size_t ahead, char *err, size_t errlen)
{
    if (r->be->zero_copy)
        return RES_OK;
    res_settle(r, m);
    /* one use per page-in, however many calls queue its segments */
    if (!m->prefetch_touched)
        res_touch(r, m);
    m->prefetch_touched = 1;
    res_set_err(m, 0, "%s", "");
    int rc = page_in_prefix(r, m, evict, ahead);
    if (rc)
        err_report(r, m, "prefetch", err, errlen);
    return rc;
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
    if (res_units_drop(r, m, seg, -1)) /* held unit by unit: paged whole instead */
        return RES_ERR_DEVICE;
    size_t span = m->sm->segs[seg].span, need = span / r->page;
    for (;;) {
        int over_quota = !res_quota_room(r, m, span);
        if (!over_quota && r->free_pages >= need)
            break;
        if (!over_quota && res_make_room_others(r, m, need, RES_TIERS, 0) == 0)
            break;
        int64_t own = res_tail_seg(m, 1, seg);
        if (own < 0)
            own = res_tail_seg(m, seg + 1, m->sm->n_segs);
        if (own < 0) {
            res_set_err(m, RES_ERR_NOSPACE,
                        "model '%s': no device memory for segment %u now (the "
                        "pool is held by running or pinned models)",
                        m->sm->name, seg);
            return RES_ERR_NOSPACE;
        }
        int rc =
            res_evict_seg(r, m, (uint32_t)own, over_quota ? RES_CAUSE_QUOTA : RES_CAUSE_CAPACITY);
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
        if (!res_quota_room(r, m, sp) || r->free_pages < sp / r->page)
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
    res_settle_all(r);
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
        if (res_copy_sync(r, sg, r->copy_timeout_s)) {
            m->st.total_device_errors++;
            res_set_err(m, RES_ERR_TIMEOUT,
                        "model '%s': the copy of segment %u to the device did not "
                        "complete within %.3g s",
                        m->sm->name, seg, r->copy_timeout_s);
            return RES_ERR_TIMEOUT;
        }
        if (r->be->wait(r->be->ctx, sg->ev)) {
            res_settle_seg(r, m, seg);
            if (!m->err_code)
                res_set_err(m, RES_ERR_DEVICE, "model '%s': the copy of segment %u failed",
                            m->sm->name, seg);
            return RES_ERR_DEVICE;
        }
        res_settle_seg(r, m, seg);
        /* cuda's wait is a stream dependency: the segment counts as resident
         * for scheduling as soon as compute is ordered after its copy */
        if (sg->state == RES_SEG_INFLIGHT && r->be->event_done(r->be->ctx, sg->ev) < 0) {
            res_settle_seg(r, m, seg);
            return RES_ERR_DEVICE;
        }
    }
    return 0;
}

double res_ready_in(res_t *r, res_model_t *m, double compute_s)
{
    if (r->be->zero_copy)
        return 0;
    res_settle_all(r);
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

double res_pagein_eta(res_t *r, res_model_t *m, double compute_s)
{
    double ready = res_ready_in(r, m, compute_s);
    if (isfinite(ready) || r->bw <= 0)
        return isfinite(ready) && r->bw > 0 ? ready : 0;
    size_t have = res_weight_bytes(m), image = m->sm->image_bytes;
    double queued = (double)r->q_bytes - (double)r->landed_q; /* copies ahead of its page-in */
    return ((double)(image > have ? image - have : 0) + (queued > 0 ? queued : 0)) / r->bw;
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
    res_set_err(m, RES_ERR_TIMEOUT,
                "model '%s': the copy of segment %u to the device did not "
                "complete within %.3g s",
                m->sm->name, seg, r->copy_timeout_s);
    snprintf(err, errlen, "%s", m->err);
    return RES_ERR_TIMEOUT;
}

size_t res_spare_pages(const res_t *r)
{
    size_t spare = r->free_pages + r->kv_cached_bytes / r->page; /* cached KV goes first */
    for (const res_model_t *v = r->models; v; v = v->next) {
        int gone = !v->wanted && res_evictable(v) && v->n_kv == 0 && v->n_inflight == 0;
        if (gone)
            spare += v->weight_bytes / r->page;
        /* idle attached units of a model without weights go before any weights, those of a
         * model that goes with its weights */
        if (gone || !v->weight_bytes)
            spare += res_att_idle_pages(r, v);
    }
    return spare;
}

int res_pagein_fits(res_t *r, res_model_t *m, size_t spare, size_t reserve_bytes)
{
    size_t reserve = (reserve_bytes + r->page - 1) / r->page;
    res_settle(r, m); /* a failed copy is missing again */
    size_t missing = (m->span_bytes - m->weight_bytes) / r->page;
    /* a model above its quota streams the rest through it: what it maps */
    size_t quota = m->cfg.gpu_quota ? m->cfg.gpu_quota / r->page : SIZE_MAX;
    size_t held = m->weight_bytes / r->page;
    if (held + missing > quota)
        missing = quota > held ? quota - held : 0;
    int gone = !m->wanted && res_evictable(m) && m->n_kv == 0 && m->n_inflight == 0;
    size_t own = (gone ? m->weight_bytes / r->page : 0) +
                 (gone || !m->weight_bytes ? res_att_idle_pages(r, m) : 0);
    spare = spare > own ? spare - own : 0; /* counted among the spare: not its own room */
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

/* ------------------------------------------------------------------ scratch */

void res_scratch_note(res_t *r, size_t bytes)
{
    if (r->be->zero_copy)
        return; /* cpu: activations are host memory like everything else */
    r->scratch_bytes = bytes;
    size_t want = res_pages_of(r, bytes);
    if (want > r->scratch_pages) {
        /* the scratch grew: its pages come off the pool (pages free in the pool are not
         * held on the device), idle models giving theirs back first; what even that
         * cannot free runs beyond the budget, in the device's headroom (peak_device_bytes) */
        size_t more = want - r->scratch_pages, floor = res_pages_of(r, r->headroom) + 2;
        res_make_room_others(r, NULL, more, 3, 0);
        if (more > r->free_pages)
            more = r->free_pages;
        if (more > r->n_pages - floor) /* never below what the largest model needs */
            more = r->n_pages > floor ? r->n_pages - floor : 0;
        r->n_pages -= more;
        r->free_pages -= more;
        r->scratch_pages += more;
    }
    res_note_used(r);
}

/* ------------------------------------------------------------------ state */

res_seg_state_t res_seg_state(res_t *r, res_model_t *m, uint32_t seg)
{
    res_settle_seg(r, m, seg);
    return m->segs[seg].state;
}

int res_seg_times(res_t *r, res_model_t *m, uint32_t seg, be_copy_times_t *t)
{
    res_settle_seg(r, m, seg);
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
    return !m->r->be->zero_copy && res_quota_of(m->r, m) < m->span_bytes;
}

int res_lost_pages(const res_model_t *m)
{
    return m->stolen > 0;
}

void res_model_stats(res_t *r, res_model_t *m, stats_res_t *out)
{
    res_settle(r, m);
    res_update_gauges(m);
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

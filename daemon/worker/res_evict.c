/* res_evict: beneath page-in and KV pages: the pool's accounting, copies settled as they land, a segment, unit or attached unit unmapped, and the tail-first GreedyDual victim choice that makes room. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "residency_int.h"

/* Reload cost model for the GreedyDual score: seconds = fixed + bytes / bw. */
#define RES_COST_FIXED_S 1e-3
#define RES_COST_BW 25e9

/* ------------------------------------------------------------------ accounting */

size_t res_pages_of(const res_t *r, size_t bytes)
{
    return (bytes + r->page - 1) / r->page;
}

size_t res_quota_of(const res_t *r, const res_model_t *m)
{
    return m->cfg.gpu_quota ? m->cfg.gpu_quota : r->n_pages * r->page;
}

size_t res_model_bytes(const res_model_t *m)
{
    return m->weight_bytes + m->kv_bytes + m->kv_cached_bytes + m->att_bytes;
}
void res_update_gauges(res_model_t *m)
{
    m->st.curr_resident_bytes = m->weight_bytes;
    m->st.curr_kv_bytes = m->kv_bytes;
    m->st.curr_running = (uint64_t)m->running;
    m->st.curr_kv_seqs = (uint64_t)m->n_kv;
    m->st.curr_kv_cached_bytes = m->kv_cached_bytes;
    m->st.curr_kv_cached = (uint64_t)m->n_kv_cached;
    m->st.curr_kv_host_bytes = m->kv_host_bytes;
    m->st.curr_kv_host = (uint64_t)m->n_kv_host;
}

void res_set_err(res_model_t *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    m->err_code = code;
}

/* Records the device's high-water mark after pages or scratch were taken. */
void res_note_used(res_t *r)
{
    size_t used = (r->n_pages - r->free_pages) * r->page + r->scratch_bytes;
    if (used > r->peak_used)
        r->peak_used = used;
}

/* ------------------------------------------------------------------ cached KV */

void res_kv_destroy(res_t *r, res_kv_t *k)
{
    res_model_t *m = k->m;
    kv_seq_t *kv = &k->kv;
    size_t bytes = 2 * k->mapped_bytes;
    if (k->mapped_bytes) {
        r->be->unmap(r->be->ctx, kv->k, 0, k->mapped_bytes);
        r->be->unmap(r->be->ctx, kv->v, 0, k->mapped_bytes);
        r->free_pages += bytes / r->page;
        r->kv_bytes -= bytes;
    }
    if (r->be->zero_copy) {
        free(kv->k);
        free(kv->v);
    } else {
        r->be->release(r->be->ctx, kv->k, k->range_bytes);
        r->be->release(r->be->ctx, kv->v, k->range_bytes);
    }
    if (k->cached) {
        *(k->lru_prev ? &k->lru_prev->lru_next : &r->cached_old) = k->lru_next;
        *(k->lru_next ? &k->lru_next->lru_prev : &r->cached_new) = k->lru_prev;
        m->kv_cached_bytes -= bytes;
        r->kv_cached_bytes -= bytes;
        m->n_kv_cached--;
    } else {
        m->kv_bytes -= bytes;
        m->n_kv--;
        m->st.total_kv_frees++;
    }
    res_update_gauges(m);
    free(k);
}

int res_kv_reclaim(res_t *r, const res_model_t *m)
{
    res_kv_t *k = r->cached_old;
    while (k && m && k->m != m)
        k = k->lru_next;
    if (!k)
        return 0;
    if (k->drop)
        k->drop(k->drop_ctx, &k->kv);
    res_kv_destroy(r, k);
    return 1;
}

int res_quota_room(res_t *r, res_model_t *m, size_t extra)
{
    size_t quota = res_quota_of(r, m);
    while (res_model_bytes(m) + extra > quota) /* its cached KV, then its idle attached units */
        if (!res_kv_reclaim(r, m) && !res_att_reclaim(r, m, 0))
            return 0;
    return 1;
}

/* ------------------------------------------------------------------ copies in flight */

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
    res_set_err(m, RES_ERR_DEVICE,
                "model '%s': the %s backend failed to copy segment %u to the device", m->sm->name,
                r->be->name, s);
    res_update_gauges(m);
}

/* m's first copy is queued: into the in-flight list at its place in the
 * models list (insertion walks the few models copying). */
void res_inflight_link(res_t *r, res_model_t *m)
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

void res_inflight_unlink(res_t *r, res_model_t *m)
{
    if (m->if_prev)
        m->if_prev->if_next = m->if_next;
    else
        r->inflight = m->if_next;
    if (m->if_next)
        m->if_next->if_prev = m->if_prev;
    m->if_next = m->if_prev = NULL;
}

/* A copy landed (or failed): the FIFO position reached (q_end, its q_span bytes queued), and
 * the bandwidth of its bytes in d seconds (none when d is 0). */
static void landed(res_t *r, res_model_t *m, uint64_t q_end, size_t q_span, size_t bytes, double d)
{
    if (--m->n_inflight == 0)
        res_inflight_unlink(r, m);
    m->inflight_bytes -= q_span;
    if (q_end > r->landed_q)
        r->landed_q = q_end;
    if (d > 0) {
        double bw = (double)bytes / d;
        r->bw = r->bw > 0 ? 0.7 * r->bw + 0.3 * bw : bw;
    }
}

static void note_landed(res_t *r, res_model_t *m, res_seg_t *sg, size_t span)
{
    landed(r, m, sg->q_end, sg->q_span, span, sg->timed ? sg->t.end - sg->t.start : 0);
}

/* Move finished copies to RESIDENT and account their copy time; drop
 * failed ones. */
void res_settle_seg(res_t *r, res_model_t *m, uint32_t s)
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

void res_settle(res_t *r, res_model_t *m)
{
    if (m->n_inflight == 0)
        return; /* nothing to settle */
    for (uint32_t s = 0; s < m->sm->n_segs; s++) {
        res_settle_seg(r, m, s);
        const res_useg_t *us = m->segs[s].us;
        for (uint32_t u = 0; us && us->n_inflight && u < us->n_units; u++)
            res_settle_unit(r, m, s, u);
    }
}

/* How far the copy engine's FIFO has come: settle every model with copies
 * in flight (a host may hold thousands of models, few of them copying). */
void res_settle_all(res_t *r)
{
    for (res_model_t *v = r->inflight, *nx; v; v = nx) {
        nx = v->if_next;
        res_settle(r, v);
    }
}

/* Block the host until a queued copy has landed or failed (be_event_sync);
 * -1 if it is still in flight after timeout_s (INFINITY: wait for good, as
 * before unmapping it). A failed copy returns 0: res_settle_seg drops it. */
int res_copy_sync(res_t *r, res_seg_t *sg, double timeout_s)
{
    return be_event_sync(r->be, sg->ev, timeout_s) == BE_ERR_TIMEOUT ? -1 : 0;
}

/* ------------------------------------------------------------------ units */

static void count_eviction(res_model_t *m, res_cause_t cause)
{
    switch (cause) {
    case RES_CAUSE_CAPACITY: m->st.evictions_capacity++; break;
    case RES_CAUSE_QUOTA: m->st.evictions_quota++; break;
    case RES_CAUSE_ADMIN: m->st.evictions_admin++; break;
    case RES_CAUSE_PREEMPTION: m->st.evictions_preemption++; break;
    }
}

int res_unit_pages(const res_t *r, const store_model_t *sm, uint32_t seg, uint32_t u,
                   size_t iv[STORE_UNIT_RANGES][2])
{
    const store_unit_t *x = store_seg_unit(sm, seg, u);
    int n = 0;
    for (uint32_t k = 0; k < x->n_ranges; k++) {
        if (!x->r[k].bytes)
            continue;
        size_t a = x->r[k].off / r->page, b = res_pages_of(r, x->r[k].off + x->r[k].bytes);
        if (n && a <= iv[n - 1][1]) { /* shares a page with the range before it */
            if (b > iv[n - 1][1])
                iv[n - 1][1] = b;
            continue;
        }
        iv[n][0] = a;
        iv[n][1] = b;
        n++;
    }
    return n;
}

/* Maps or unmaps n pages of segment seg of m from page p (of the segment). */
static int pages_op(res_t *r, res_model_t *m, uint32_t seg, size_t p, size_t n, int map)
{
    size_t off = m->sm->segs[seg].off + p * r->page, bytes = n * r->page;
    if (!map)
        return r->be->unmap(r->be->ctx, m->base, off, bytes);
    int brc = r->be->map(r->be->ctx, m->base, off, bytes);
    if (brc == BE_ERR_NOMEM && res_device_short(r, m, n) == 0)
        brc = r->be->map(r->be->ctx, m->base, off, bytes); /* once more, after evicting */
    return brc;
}

int res_unit_walk(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, int map, size_t stop,
                  size_t *bytes)
{
    res_useg_t *us = m->segs[seg].us;
    size_t iv[STORE_UNIT_RANGES][2], seen = 0, done = 0;
    int n = res_unit_pages(r, m->sm, seg, u, iv), rc = 0;
    for (int i = 0; i < n && seen < stop; i++) {
        size_t run = 0, run_at = 0; /* pages only this unit touches, acted on as one mapping */
        for (size_t p = iv[i][0];; p++) {
            int end = p == iv[i][1] || seen == stop;
            int act = !end && us->held[p] == (map ? 0 : 1), alone = !end && us->cover[p] == 1;
            if (run && !(act && alone)) { /* the run ends here */
                int brc = pages_op(r, m, seg, run_at, run, map);
                if (brc && map) { /* undo the run's counts, then what came before it */
                    for (size_t q = run_at; q < run_at + run; q++)
                        us->held[q]--;
                    res_unit_walk(r, m, seg, u, 0, seen - run, bytes);
                    *bytes = 0;
                    return brc;
                }
                rc = rc ? rc : brc;
                done += run;
                run = 0;
            }
            if (end)
                break;
            if (act && !alone) { /* a page shared with another unit: a mapping of its own */
                int brc = pages_op(r, m, seg, p, 1, map);
                if (brc && map) {
                    res_unit_walk(r, m, seg, u, 0, seen, bytes);
                    *bytes = 0;
                    return brc;
                }
                rc = rc ? rc : brc;
                done++;
            } else if (act && run++ == 0) {
                run_at = p;
            }
            us->held[p] = (uint16_t)(us->held[p] + (map ? 1 : -1));
            seen++;
        }
    }
    *bytes = done * r->page;
    return rc;
}

int res_unit_unmap(res_t *r, res_model_t *m, uint32_t seg, uint32_t u)
{
    res_useg_t *us = m->segs[seg].us;
    size_t b;
    int rc = res_unit_walk(r, m, seg, u, 0, SIZE_MAX, &b);
    us->u[u].state = RES_SEG_ABSENT;
    us->n_mapped--;
    us->bytes -= b;
    m->weight_bytes -= b;
    r->free_pages += b / r->page;
    res_update_gauges(m);
    return rc ? RES_ERR_DEVICE : 0;
}

void res_settle_unit(res_t *r, res_model_t *m, uint32_t seg, uint32_t u)
{
    res_useg_t *us = m->segs[seg].us;
    res_unit_t *x = &us->u[u];
    if (x->state != RES_SEG_INFLIGHT)
        return;
    uint32_t n = store_seg_unit(m->sm, seg, u)->n_ranges;
    int failed = 0;
    for (uint32_t k = 0; k < n; k++) {
        int d = r->be->event_done(r->be->ctx, x->ev[k]);
        if (d == 0)
            return;
        failed |= d < 0;
    }
    be_copy_times_t a, b;
    double d = 0;
    if (!failed && r->be->event_times(r->be->ctx, x->ev[0], &a) == 0 &&
        r->be->event_times(r->be->ctx, x->ev[n - 1], &b) == 0 && b.end > a.start) {
        d = b.end - a.start; /* its copies ran back to back on the FIFO */
        m->st.total_copy_ns += (uint64_t)(d * 1e9);
    }
    us->n_inflight--;
    landed(r, m, x->q_end, x->q_span, failed ? 0 : x->q_span, d);
    x->state = RES_SEG_RESIDENT;
    if (failed) {
        res_unit_unmap(r, m, seg, u);
        m->st.total_device_errors++;
        res_set_err(m, RES_ERR_DEVICE,
                    "model '%s': the %s backend failed to copy unit %u of segment %u to the device",
                    m->sm->name, r->be->name, u, seg);
    }
}

int res_unit_drop(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, int cause)
{
    res_useg_t *us = m->segs[seg].us;
    if (!us || us->u[u].state == RES_SEG_ABSENT)
        return 0;
    res_unit_t *x = &us->u[u];
    if (x->state == RES_SEG_INFLIGHT) /* nothing may land in pages once unmapped */
        for (uint32_t k = 0; k < store_seg_unit(m->sm, seg, u)->n_ranges; k++)
            be_event_sync(r->be, x->ev[k], INFINITY);
    res_settle_unit(r, m, seg, u);
    if (x->state == RES_SEG_ABSENT)
        return 0; /* its copy failed: already unmapped */
    size_t before = m->weight_bytes;
    int rc = res_unit_unmap(r, m, seg, u);
    m->st.total_bytes_evicted += before - m->weight_bytes;
    if (cause >= 0)
        count_eviction(m, (res_cause_t)cause);
    res_update_gauges(m);
    return rc;
}

int res_units_drop(res_t *r, res_model_t *m, uint32_t s, int cause)
{
    res_useg_t *us = m->segs[s].us;
    int rc = 0, any = 0;
    for (uint32_t u = 0; us && us->n_mapped && u < us->n_units; u++) {
        if (us->u[u].state == RES_SEG_ABSENT)
            continue;
        int urc = res_unit_drop(r, m, s, u, -1);
        rc = rc ? rc : urc;
        any = 1;
    }
    if (any && cause >= 0)
        count_eviction(m, (res_cause_t)cause);
    return rc;
}

void res_units_free(res_t *r, res_seg_t *sg)
{
    res_useg_t *us = sg->us;
    if (!us)
        return;
    for (uint32_t u = 0; u < us->n_units; u++)
        for (int k = 0; k < STORE_UNIT_RANGES; k++)
            if (us->u[u].ev[k])
                r->be->event_free(r->be->ctx, us->u[u].ev[k]);
    free(us->u);
    free(us->cover);
    free(us->held);
    free(us);
    sg->us = NULL;
}

/* ------------------------------------------------------------------ attached units */

/* Unmaps a's pages and counts them gone from its model and the pool. */
void res_att_unmap(res_t *r, res_att_t *a)
{
    r->be->unmap(r->be->ctx, a->base, 0, a->span);
    a->state = RES_SEG_ABSENT;
    a->m->att_bytes -= a->span;
    r->free_pages += a->span / r->page;
}

/* Moves a's finished copy to RESIDENT, or unmaps it when the copy failed (the next request
 * pages it in again). Never blocks. */
void res_att_settle(res_t *r, res_att_t *a)
{
    if (a->state != RES_SEG_INFLIGHT)
        return;
    int d = r->be->event_done(r->be->ctx, a->ev);
    if (d == 0)
        return;
    if (a->q_end > r->landed_q) /* copies land in order: what was queued before it has too */
        r->landed_q = a->q_end;
    if (d > 0) {
        a->state = RES_SEG_RESIDENT;
        return;
    }
    res_att_unmap(r, a);
    a->m->st.total_device_errors++;
}

/* Unmaps a (waiting for its copy); an eviction unless its copy failed. */
void res_att_drop(res_t *r, res_att_t *a)
{
    if (a->state == RES_SEG_INFLIGHT)
        be_event_sync(r->be, a->ev, INFINITY);
    res_att_settle(r, a);
    if (a->state == RES_SEG_ABSENT)
        return;
    res_att_unmap(r, a);
    a->evictions++;
}

int res_att_reclaim(res_t *r, const res_model_t *only, int weightless)
{
    if (r->be->zero_copy)
        return 0;
    res_att_t *best = NULL;
    for (res_model_t *m = r->models; m; m = m->next) {
        if ((only && m != only) || (weightless && m->weight_bytes))
            continue;
        for (res_att_t *a = m->atts; a; a = a->next) {
            if (a->holds || a->state == RES_SEG_ABSENT)
                continue;
            if (!best || a->used < best->used)
                best = a;
        }
    }
    if (!best)
        return 0;
    res_att_drop(r, best);
    return 1;
}

void res_att_drop_all(res_t *r, res_model_t *m)
{
    if (r->be->zero_copy)
        return;
    for (res_att_t *a = m->atts; a; a = a->next)
        if (!a->holds) /* a held one's sequences are admitted: they keep it */
            res_att_drop(r, a);
}

/* ------------------------------------------------------------------ eviction */

int res_evict_seg(res_t *r, res_model_t *m, uint32_t s, res_cause_t cause)
{
    res_seg_t *sg = &m->segs[s];
    if (sg->us && sg->us->n_mapped) /* held unit by unit (the segment itself is absent) */
        return res_units_drop(r, m, s, (int)cause);
    if (sg->state == RES_SEG_ABSENT)
        return 0;
    if (sg->state == RES_SEG_INFLIGHT)
        res_copy_sync(r, sg, INFINITY);
    res_settle_seg(r, m, s);
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
    res_update_gauges(m);
    return 0;
}

/* Highest-index mapped segment in [lo, hi), or -1. */
int64_t res_tail_seg(const res_model_t *m, uint32_t lo, uint32_t hi)
{
    for (uint32_t s = hi; s-- > lo;)
        if (m->segs[s].state != RES_SEG_ABSENT || (m->segs[s].us && m->segs[s].us->n_mapped))
            return s;
    return -1;
}

int res_evictable(const res_model_t *v)
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
void res_touch(res_t *r, res_model_t *m)
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
static int in_tier(const res_t *r, const res_model_t *v, int tier, size_t ahead)
{
    if (tier < 2)
        return v->n_kv == 0 && v->n_inflight == 0 && v->wanted == tier;
    if (tier == 2)
        return v->n_kv == 0 && v->n_inflight > 0;
    int64_t s = res_tail_seg(v, 0, v->sm->n_segs);
    return v->n_kv > 0 && s >= 0 && v->sm->segs[s].span <= stall_budget(r, v, ahead);
}

/* The cheapest victim (GreedyDual) of the first tier below tiers that has one
 * (ahead: what the page-in that evicts keeps queued, see stall_budget). */
static res_model_t *pick_victim(res_t *r, const res_model_t *except, int tiers, size_t ahead)
{
    res_model_t *best = NULL;
    for (int tier = 0; tier < tiers && !best; tier++)
        for (res_model_t *v = r->models; v; v = v->next)
            if (v != except && res_evictable(v) && in_tier(r, v, tier, ahead) &&
                (!best || v->h < best->h))
                best = v;
    return best;
}

/* Free pages by evicting other models tail-first (victims from the first
 * tiers only) until need pages are free; ahead as for pick_victim. */
int res_make_room_others(res_t *r, const res_model_t *m, size_t need, int tiers, size_t ahead)
{
    while (r->free_pages < need) {
        if (res_kv_reclaim(r, NULL))
            continue; /* cached KV goes before any weights */
        if (res_att_reclaim(r, NULL, 1))
            continue; /* and idle attached units of models that hold no weights */
        res_model_t *v = pick_victim(r, m, tiers, ahead);
        if (!v) { /* no weights left to take: idle attached units, least recently used first */
            if (res_att_reclaim(r, NULL, 0))
                continue;
            return RES_ERR_NOSPACE;
        }
        r->L = v->h > r->L ? v->h : r->L;
        int64_t s = res_tail_seg(v, 0, v->sm->n_segs);
        /* a victim with live KV caches has sequences paused mid-generation:
         * that is preemption (their caches stay; the weights come back) */
        if (v->n_kv > 0)
            v->stolen += v->sm->segs[s].span;
        int rc = res_evict_seg(r, v, (uint32_t)s,
                               v->n_kv > 0 ? RES_CAUSE_PREEMPTION : RES_CAUSE_CAPACITY);
        if (rc)
            return rc;
        while (!v->weight_bytes && res_att_reclaim(r, v, 0))
            ; /* its last weights went: its idle attached units go with them */
    }
    return 0;
}

/* A map failed for lack of physical memory (BE_ERR_NOMEM) although the
 * budget said there was room: the device gives less than the budget (other
 * processes, the driver's own use). Lower the budget to what is in use now
 * (never below the largest model wholly resident plus the KV minimum: what
 * the configuration needs to work at all) and
 * evict idle models to free need pages more, so the caller can retry the map
 * once. 0 when it may retry. */
int res_device_short(res_t *r, const res_model_t *m, size_t need)
{
    size_t floor = res_pages_of(r, r->headroom) + 2, used = r->n_pages - r->free_pages;
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
    res_make_room_others(r, m, before + need, 3, 0);
    return r->free_pages > before && r->free_pages >= need ? 0 : RES_ERR_NOMEM;
}

int res_evict(res_t *r, res_model_t *m, res_cause_t cause, uint32_t max_segs)
{
    if (r->be->zero_copy)
        return RES_OK;
    if (m->running)
        return RES_ERR_BUSY;
    if (max_segs == 0) { /* paged out whole: its cached KV leaves the device too (to host RAM),
                            and its attached units */
        while (res_kv_reclaim(r, m))
            ;
        res_att_drop_all(r, m);
    }
    for (uint32_t n = 0; max_segs == 0 || n < max_segs; n++) {
        int64_t s = res_tail_seg(m, 0, m->sm->n_segs);
        if (s < 0)
            break;
        int rc = res_evict_seg(r, m, (uint32_t)s, cause);
        if (rc)
            return rc;
    }
    return RES_OK;
}

/* res_unit: units below a segment (a MoE layer's experts, store_seg_units) mapped, copied and evicted on their own, beside the whole-segment paging of residency.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "residency_int.h"

/* Checks seg and unit against m's layout; RES_ERR_ARG with a message if out of range. */
static int unit_check(const res_model_t *m, uint32_t seg, uint32_t u, char *err, size_t errlen)
{
    if (seg < m->sm->n_segs && u < store_seg_units(m->sm, seg))
        return RES_OK;
    snprintf(err, errlen, "model '%s': segment %u has no unit %u", m->sm->name, seg, u);
    return RES_ERR_ARG;
}

/* Segment seg's unit state: every page's cover by its units, nothing held. */
static int useg_new(res_t *r, res_model_t *m, uint32_t seg)
{
    res_useg_t *us = calloc(1, sizeof *us);
    size_t pages = m->sm->segs[seg].span / r->page;
    if (!us)
        return RES_ERR_NOMEM;
    us->n_units = store_seg_units(m->sm, seg);
    us->u = calloc(us->n_units, sizeof *us->u);
    us->cover = calloc(pages, sizeof *us->cover);
    us->held = calloc(pages, sizeof *us->held);
    m->segs[seg].us = us;
    if (!us->u || !us->cover || !us->held) {
        res_units_free(r, &m->segs[seg]);
        return RES_ERR_NOMEM;
    }
    for (uint32_t u = 0; u < us->n_units; u++) {
        size_t iv[STORE_UNIT_RANGES][2];
        int n = res_unit_pages(r, m->sm, seg, u, iv);
        for (int i = 0; i < n; i++)
            for (size_t p = iv[i][0]; p < iv[i][1]; p++)
                us->cover[p]++;
    }
    return RES_OK;
}

/* Pages unit u would map: its pages no mapped unit holds yet. */
static size_t unit_new_pages(const res_t *r, const res_model_t *m, uint32_t seg, uint32_t u)
{
    const res_useg_t *us = m->segs[seg].us;
    size_t iv[STORE_UNIT_RANGES][2], n_new = 0;
    int n = res_unit_pages(r, m->sm, seg, u, iv);
    for (int i = 0; i < n; i++)
        for (size_t p = iv[i][0]; p < iv[i][1]; p++)
            n_new += us->held[p] == 0;
    return n_new;
}

/* Queues the copies of unit u's ranges (its pages mapped): RES_ERR_DEVICE when the backend
 * refuses one (those queued before it have landed then). */
static int unit_copy(res_t *r, res_model_t *m, uint32_t seg, uint32_t u)
{
    const store_seg_t *ss = &m->sm->segs[seg];
    const store_unit_t *su = store_seg_unit(m->sm, seg, u);
    res_unit_t *x = &m->segs[seg].us->u[u];
    for (uint32_t k = 0; k < su->n_ranges; k++) {
        const store_range_t *rg = &su->r[k];
        if (r->be->copy_h2d(r->be->ctx, (uint8_t *)m->base + ss->off + rg->off,
                            m->sm->image + ss->host_off + rg->off, rg->bytes, x->ev[k])) {
            for (uint32_t j = 0; j < k; j++) /* nothing may land in pages once unmapped */
                be_event_sync(r->be, x->ev[j], INFINITY);
            return RES_ERR_DEVICE;
        }
    }
    return RES_OK;
}

int res_unit_map(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, char *err, size_t errlen)
{
    int rc = unit_check(m, seg, u, err, errlen);
    if (rc || r->be->zero_copy)
        return rc;
    res_settle(r, m); /* a failed copy is absent again */
    res_seg_t *sg = &m->segs[seg];
    if (sg->state != RES_SEG_ABSENT)
        return RES_OK; /* held whole: the unit is there (or in flight) with it */
    if (!sg->us && useg_new(r, m, seg)) {
        snprintf(err, errlen, "out of memory");
        return RES_ERR_NOMEM;
    }
    res_useg_t *us = sg->us;
    res_unit_t *x = &us->u[u];
    if (x->state != RES_SEG_ABSENT)
        return RES_OK;
    const store_unit_t *su = store_seg_unit(m->sm, seg, u);
    size_t need = unit_new_pages(r, m, seg, u);
    if (!res_quota_room(r, m, need * r->page) ||
        (r->free_pages < need &&
         res_make_room_others(r, m, need, m->running ? RES_TIERS : RES_TIERS - 1, 0))) {
        snprintf(err, errlen,
                 "model '%s': no device memory for unit %u of segment %u now (%zu pages: its "
                 "gpu_quota, or the pool held by running or pinned models)",
                 m->sm->name, u, seg, need);
        return RES_ERR_NOSPACE;
    }
    for (uint32_t k = 0; k < su->n_ranges; k++)
        if (!x->ev[k] && r->be->event_new(r->be->ctx, &x->ev[k])) {
            snprintf(err, errlen, "out of memory");
            return RES_ERR_NOMEM;
        }
    size_t b;
    int brc = res_unit_walk(r, m, seg, u, 1, SIZE_MAX, &b);
    if (brc) {
        m->st.total_device_errors++;
        snprintf(err, errlen, "model '%s': the %s backend failed to map unit %u of segment %u (%d)",
                 m->sm->name, r->be->name, u, seg, brc);
        return brc == BE_ERR_NOMEM ? RES_ERR_NOMEM : RES_ERR_DEVICE;
    }
    us->n_mapped++;
    us->bytes += b;
    m->weight_bytes += b;
    r->free_pages -= b / r->page;
    res_note_used(r);
    x->state = RES_SEG_RESIDENT; /* mapped: res_unit_unmap undoes it if no copy is queued */
    if (unit_copy(r, m, seg, u)) {
        res_unit_unmap(r, m, seg, u);
        m->st.total_device_errors++;
        snprintf(err, errlen, "model '%s': the %s backend refused to queue a copy", m->sm->name,
                 r->be->name);
        return RES_ERR_DEVICE;
    }
    x->state = RES_SEG_INFLIGHT;
    r->q_bytes += su->bytes;
    x->q_end = r->q_bytes;
    x->q_span = su->bytes;
    if (m->n_inflight++ == 0)
        res_inflight_link(r, m);
    m->inflight_bytes += su->bytes;
    us->n_inflight++;
    m->st.total_bytes_in += su->bytes;
    res_update_gauges(m);
    return RES_OK;
}

int res_unit_evict(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, res_cause_t cause)
{
    char err[160];
    int rc = unit_check(m, seg, u, err, sizeof err);
    if (rc || r->be->zero_copy)
        return rc;
    if (m->running)
        return RES_ERR_BUSY;
    if (m->segs[seg].state != RES_SEG_ABSENT)
        return RES_ERR_BUSY; /* held whole: it leaves with its segment */
    return res_unit_drop(r, m, seg, u, (int)cause);
}

res_seg_state_t res_unit_state(res_t *r, res_model_t *m, uint32_t seg, uint32_t u)
{
    char err[160];
    if (unit_check(m, seg, u, err, sizeof err))
        return RES_SEG_ABSENT;
    if (r->be->zero_copy)
        return RES_SEG_RESIDENT;
    res_settle_seg(r, m, seg);
    if (m->segs[seg].state != RES_SEG_ABSENT || !m->segs[seg].us)
        return m->segs[seg].state;
    res_settle_unit(r, m, seg, u);
    return m->segs[seg].us->u[u].state;
}

int res_unit_wait(res_t *r, res_model_t *m, uint32_t seg, uint32_t u)
{
    char err[160];
    int rc = unit_check(m, seg, u, err, sizeof err);
    if (rc || r->be->zero_copy)
        return rc;
    res_seg_t *sg = &m->segs[seg];
    res_unit_t *x = sg->us ? &sg->us->u[u] : NULL;
    if (sg->state != RES_SEG_ABSENT) { /* held whole: the pass's wait */
        fwd_hooks_t h = res_hooks(m);
        return h.wait(h.ctx, seg);
    }
    if (!x || x->state == RES_SEG_ABSENT)
        return RES_ERR_NOSPACE;
    for (uint32_t k = 0;
         x->state == RES_SEG_INFLIGHT && k < store_seg_unit(m->sm, seg, u)->n_ranges; k++) {
        if (be_event_sync(r->be, x->ev[k], r->copy_timeout_s) == BE_ERR_TIMEOUT) {
            m->st.total_device_errors++;
            res_set_err(m, RES_ERR_TIMEOUT,
                        "model '%s': the copy of unit %u of segment %u to the device did not "
                        "complete within %.3g s",
                        m->sm->name, u, seg, r->copy_timeout_s);
            return RES_ERR_TIMEOUT;
        }
        if (r->be->wait(r->be->ctx, x->ev[k]))
            rc = RES_ERR_DEVICE;
    }
    res_settle_unit(r, m, seg, u);
    return rc ? rc : x->state == RES_SEG_ABSENT ? RES_ERR_DEVICE : RES_OK;
}

size_t res_unit_bytes(const res_model_t *m, uint32_t seg)
{
    return seg < m->sm->n_segs && m->segs[seg].us ? m->segs[seg].us->bytes : 0;
}

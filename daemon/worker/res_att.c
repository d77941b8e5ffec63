/* res_att: attached units: small images a model owns outside its store image (a LoRA adapter's pairs), each with a device range of its own, added, paged in on request, held while used and removed (their unmapping, settling and victim choice are in res_evict.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "residency_int.h"

/* ------------------------------------------------------------------ lifetime */

int res_att_add(res_t *r, res_model_t *m, const void *host, size_t bytes, res_att_t **out,
                char *err, size_t errlen)
{
    *out = NULL;
    res_att_t *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return RES_ERR_NOMEM;
    }
    a->m = m;
    a->host = host;
    a->bytes = bytes;
    a->span = res_pages_of(r, bytes ? bytes : 1) * r->page;
    if (r->be->zero_copy) {
        a->state = RES_SEG_RESIDENT;
    } else {
        size_t cap = res_quota_of(r, m);
        if (a->span > cap || a->span > r->n_pages * r->page) {
            snprintf(err, errlen,
                     "its %zu bytes on the device exceed the gpu_quota of '%s' or the pool "
                     "(%zu bytes)",
                     a->span, m->sm->name, cap);
            free(a);
            return RES_ERR_QUOTA;
        }
        if (r->be->reserve(r->be->ctx, a->span, &a->base) || r->be->event_new(r->be->ctx, &a->ev)) {
            snprintf(err, errlen, "the %s backend could not reserve %zu bytes for it", r->be->name,
                     a->span);
            if (a->base)
                r->be->release(r->be->ctx, a->base, a->span);
            free(a);
            return RES_ERR_DEVICE;
        }
    }
    a->next = m->atts;
    m->atts = a;
    *out = a;
    return RES_OK;
}

void res_att_remove(res_t *r, res_att_t *a)
{
    if (!a)
        return;
    res_model_t *m = a->m;
    for (res_att_t **pp = &m->atts; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    if (!r->be->zero_copy) {
        res_att_drop(r, a);
        r->be->event_free(r->be->ctx, a->ev);
        r->be->release(r->be->ctx, a->base, a->span);
    }
    free(a);
}

void res_att_free_all(res_t *r, res_model_t *m)
{
    while (m->atts)
        res_att_remove(r, m->atts);
}

/* ------------------------------------------------------------------ paging */

int res_att_map(res_t *r, res_att_t *a, char *err, size_t errlen)
{
    a->used = ++r->att_tick;
    if (r->be->zero_copy)
        return RES_OK;
    res_att_settle(r, a);
    if (a->state != RES_SEG_ABSENT)
        return RES_OK;
    res_model_t *m = a->m;
    size_t need = a->span / r->page;
    a->holds++; /* never its own victim while room is made */
    /* room as a segment's page-in makes it (never from m's own weights) */
    int rc = !res_quota_room(r, m, a->span)
                 ? RES_ERR_NOSPACE
                 : res_make_room_others(r, m, need, m->running ? RES_TIERS : RES_TIERS - 1, 0);
    a->holds--;
    if (rc) {
        snprintf(err, errlen,
                 "no device memory for an adapter of '%s' now (%zu pages: its gpu_quota, or the "
                 "pool held by running or pinned models)",
                 m->sm->name, need);
        return RES_ERR_NOSPACE;
    }
    int brc = r->be->map(r->be->ctx, a->base, 0, a->span);
    if (brc == BE_ERR_NOMEM && !res_device_short(r, m, need))
        brc = r->be->map(r->be->ctx, a->base, 0, a->span);
    if (brc) {
        m->st.total_device_errors++;
        snprintf(err, errlen, "the %s backend failed to map an adapter of '%s' (%d)", r->be->name,
                 m->sm->name, brc);
        return RES_ERR_DEVICE;
    }
    m->att_bytes += a->span;
    r->free_pages -= need;
    res_note_used(r);
    a->state = RES_SEG_INFLIGHT;
    if (r->be->copy_h2d(r->be->ctx, a->base, a->host, a->bytes, a->ev)) {
        res_att_unmap(r, a);
        m->st.total_device_errors++;
        snprintf(err, errlen, "the %s backend refused to queue a copy", r->be->name);
        return RES_ERR_DEVICE;
    }
    r->q_bytes += a->bytes;
    a->q_end = r->q_bytes;
    a->page_ins++;
    a->bytes_in += a->bytes;
    return RES_OK;
}

res_seg_state_t res_att_state(res_t *r, res_att_t *a)
{
    res_att_settle(r, a);
    return a->state;
}

void res_att_hold(res_att_t *a, int delta)
{
    if (delta > 0)
        a->holds++;
    else if (a->holds)
        a->holds--;
}

/* ------------------------------------------------------------------ predictions */

size_t res_att_missing(res_t *r, res_att_t *a)
{
    if (r->be->zero_copy)
        return 0;
    res_att_settle(r, a); /* a failed copy is missing again */
    return a->state == RES_SEG_ABSENT ? a->span : 0;
}

double res_att_eta(res_t *r, res_att_t *a)
{
    if (r->be->zero_copy || r->bw <= 0)
        return 0;
    res_settle_all(r); /* where the copy engine's FIFO has got to */
    res_att_settle(r, a);
    if (a->state == RES_SEG_RESIDENT)
        return 0;
    if (a->state == RES_SEG_INFLIGHT) /* behind the copies queued before it */
        return a->q_end > r->landed_q ? (double)(a->q_end - r->landed_q) / r->bw : 0;
    /* absent: queued when its request is admitted, behind the copies queued now and the
     * weights of its model's page-in (admission follows it) */
    size_t have = a->m->weight_bytes, image = a->m->sm->image_bytes;
    double ahead = (double)(r->q_bytes - r->landed_q) + (double)(image > have ? image - have : 0);
    return (ahead + (double)a->bytes) / r->bw;
}

size_t res_att_idle_pages(const res_t *r, const res_model_t *m)
{
    size_t pages = 0;
    for (const res_att_t *a = r->be->zero_copy ? NULL : m->atts; a; a = a->next)
        if (!a->holds && a->state != RES_SEG_ABSENT)
            pages += a->span / r->page;
    return pages;
}

/* ------------------------------------------------------------------ state */

void *res_att_addr(const res_att_t *a)
{
    return a->base ? a->base : (void *)a->host;
}

size_t res_att_span(const res_t *r, const res_att_t *a)
{
    return r->be->zero_copy ? 0 : a->span;
}

void res_att_stats(res_t *r, res_att_t *a, uint64_t *page_ins, uint64_t *bytes_in,
                   uint64_t *evictions, int *resident)
{
    *page_ins = a->page_ins;
    *bytes_in = a->bytes_in;
    *evictions = a->evictions;
    *resident = res_att_state(r, a) == RES_SEG_RESIDENT;
}

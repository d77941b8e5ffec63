/* res_kvhost: the host-RAM tier of cached KV: a cached cache the pool gives up (or a paged-out model's) copied to host memory within a budget, least recently used dropped first, and copied back into a new sequence's cache on the copy queue. */
#include <stdlib.h>
#include <string.h>

#include "residency_int.h"

/* Bytes one position takes in k (or v), every layer. */
static size_t per_pos_of(const kv_seq_t *kv)
{
    return (size_t)kv->n_layer * kv->kv_dim * kv_type_size(kv->type);
}

static void host_unlink(res_t *r, res_kv_t *k)
{
    *(k->lru_prev ? &k->lru_prev->lru_next : &r->host_old) = k->lru_next;
    *(k->lru_next ? &k->lru_next->lru_prev : &r->host_new) = k->lru_prev;
    k->lru_prev = k->lru_next = NULL;
}

static void host_push(res_t *r, res_kv_t *k)
{
    k->lru_prev = r->host_new;
    k->lru_next = NULL;
    *(r->host_new ? &r->host_new->lru_next : &r->host_old) = k;
    r->host_new = k;
}

static void host_mem_free(res_t *r, void *p, size_t bytes)
{
    if (!p)
        return;
    if (r->be->host_free)
        r->be->host_free(r->be->ctx, p, bytes);
    else
        free(p);
}

static void *host_mem_alloc(res_t *r, size_t bytes)
{
    return r->be->host_alloc ? r->be->host_alloc(r->be->ctx, bytes) : malloc(bytes);
}

/* Frees a host copy that is out of the list and idle. */
static void host_free(res_t *r, res_kv_t *k)
{
    res_model_t *m = k->m;
    host_mem_free(r, k->kv.k, k->host_bytes / 2);
    host_mem_free(r, k->kv.v, k->host_bytes / 2);
    m->kv_host_bytes -= k->host_bytes;
    m->n_kv_host--;
    r->kv_host_bytes -= k->host_bytes;
    m->st.total_kv_host_drops++;
    res_update_gauges(m);
    free(k);
}

void res_kv_host_destroy(res_t *r, res_kv_t *k)
{
    if (k->doomed)
        return;
    host_unlink(r, k);
    if (k->busy) { /* a restore reads it: freed when that lands */
        k->doomed = 1;
        return;
    }
    host_free(r, k);
}

/* A restore from k ended. */
static void host_release(res_t *r, res_kv_t *k)
{
    if (--k->busy == 0 && k->doomed)
        host_free(r, k);
}

/* Drops the least recently used host copy (its owner forgets it first); 0 when there is none. */
static int host_reclaim(res_t *r, const res_model_t *m)
{
    res_kv_t *k = r->host_old;
    while (k && ((m && k->m != m) || k->busy))
        k = k->lru_next;
    if (!k)
        return 0;
    if (k->drop)
        k->drop(k->drop_ctx, &k->kv);
    res_kv_host_destroy(r, k);
    return 1;
}

void res_kv_host_budget(res_t *r, size_t bytes)
{
    r->kv_host_budget = bytes;
    while (r->kv_host_bytes > r->kv_host_budget && host_reclaim(r, NULL))
        ;
}

void res_kv_host_drop_model(res_t *r, const res_model_t *m)
{
    while (host_reclaim(r, m))
        ;
}

size_t res_kv_host_used(const res_t *r)
{
    return r->kv_host_bytes;
}

int res_kv_is_host(const kv_seq_t *kv)
{
    const res_kv_t *k = kv->owner;
    return k && k->host;
}

double res_copy_bw(const res_t *r)
{
    return r->bw;
}

void res_kv_host_touch(res_t *r, res_kv_t *k)
{
    if (r->host_new == k)
        return;
    host_unlink(r, k);
    host_push(r, k);
}

int res_kv_demote(res_t *r, const kv_seq_t *dev, res_kv_drop_fn drop, void *ctx, kv_seq_t **out)
{
    const res_kv_t *d = dev->owner;
    res_model_t *m = d->m;
    size_t half = (size_t)dev->n_past * per_pos_of(dev), bytes = 2 * half;
    *out = NULL;
    if (r->be->zero_copy || dev->n_past == 0 || bytes > r->kv_host_budget)
        return RES_ERR_NOSPACE; /* host memory is where it is already; or it never fits */
    while (r->kv_host_bytes + bytes > r->kv_host_budget && host_reclaim(r, NULL))
        ;
    res_kv_t *k = calloc(1, sizeof *k);
    void *kb = k ? host_mem_alloc(r, half) : NULL, *vb = kb ? host_mem_alloc(r, half) : NULL;
    if (!vb) {
        host_mem_free(r, kb, half);
        free(k);
        return RES_ERR_NOMEM;
    }
    int rc = r->be->download ? r->be->download(r->be->ctx, kb, dev->k, half) ||
                                   r->be->download(r->be->ctx, vb, dev->v, half)
                             : (memcpy(kb, dev->k, half), memcpy(vb, dev->v, half), 0);
    if (rc) {
        host_mem_free(r, kb, half);
        host_mem_free(r, vb, half);
        free(k);
        m->st.total_device_errors++;
        return RES_ERR_DEVICE;
    }
    k->kv = *dev;
    k->kv.n_ctx = dev->n_past;
    k->kv.k = kb;
    k->kv.v = vb;
    k->kv.owner = k;
    k->m = m;
    k->host = 1;
    k->host_bytes = bytes;
    k->drop = drop;
    k->drop_ctx = ctx;
    host_push(r, k);
    m->kv_host_bytes += bytes;
    m->n_kv_host++;
    r->kv_host_bytes += bytes;
    m->st.total_kv_demotions++;
    res_update_gauges(m);
    *out = &k->kv;
    return RES_OK;
}

int res_kv_restore_start(res_t *r, kv_seq_t *dst, const kv_seq_t *host, uint32_t n,
                         res_restore_t *rs)
{
    size_t half = (size_t)n * per_pos_of(host);
    be_event_t **ev = rs->ev;
    ev[0] = ev[1] = NULL;
    rs->src = NULL;
    if (n > host->n_past || n > dst->n_ctx || dst->type != host->type ||
        dst->n_layer != host->n_layer || dst->kv_dim != host->kv_dim)
        return RES_ERR_DEVICE;
    if (r->be->event_new(r->be->ctx, &ev[0]) || r->be->event_new(r->be->ctx, &ev[1]))
        goto fail;
    if (r->be->copy_h2d(r->be->ctx, dst->k, host->k, half, ev[0]) ||
        r->be->copy_h2d(r->be->ctx, dst->v, host->v, half, ev[1])) {
        /* one may be queued: its copy must land before the events (and dst) go */
        r->be->wait(r->be->ctx, ev[0]);
        goto fail;
    }
    rs->src = host->owner;
    ((res_kv_t *)rs->src)->busy++;
    res_kv_host_touch(r, rs->src);
    return RES_OK;
fail:
    for (int i = 0; i < 2; i++)
        if (ev[i])
            r->be->event_free(r->be->ctx, ev[i]);
    ev[0] = ev[1] = NULL;
    ((res_kv_t *)dst->owner)->m->st.total_kv_restore_failures++;
    return RES_ERR_DEVICE;
}

/* Frees rs's events and lets go of its host copy. */
static void restore_end(res_t *r, res_restore_t *rs)
{
    for (int i = 0; i < 2; i++)
        if (rs->ev[i])
            r->be->event_free(r->be->ctx, rs->ev[i]);
    rs->ev[0] = rs->ev[1] = NULL;
    if (rs->src)
        host_release(r, rs->src);
    rs->src = NULL;
}

int res_kv_restore_poll(res_t *r, kv_seq_t *dst, uint32_t n, res_restore_t *rs)
{
    res_model_t *m = ((res_kv_t *)dst->owner)->m;
    int d0 = r->be->event_done(r->be->ctx, rs->ev[0]),
        d1 = r->be->event_done(r->be->ctx, rs->ev[1]);
    if ((d0 == 0 && d1 >= 0) || (d1 == 0 && d0 >= 0))
        return 0; /* still copying (a failed one waits for the other to land too) */
    restore_end(r, rs);
    if (d0 < 0 || d1 < 0) {
        m->st.total_kv_restore_failures++;
        return -1;
    }
    dst->n_past = n;
    m->st.total_kv_restores++;
    m->st.total_kv_restore_bytes += 2 * (uint64_t)n * per_pos_of(dst);
    return 1;
}

void res_kv_restore_cancel(res_t *r, res_restore_t *rs)
{
    for (int i = 0; i < 2; i++)
        if (rs->ev[i])
            r->be->wait(r->be->ctx, rs->ev[i]); /* the copy writes into the cache until it lands */
    restore_end(r, rs);
}

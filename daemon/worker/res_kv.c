/* res_kv: KV caches on the device: the KV budget beside the weights, a cache's reserved ranges and the pages mapped as it grows. */
#include <stdio.h>
#include <stdlib.h>

#include "residency_int.h"

/* ------------------------------------------------------------------ the KV budget */

/* The budget as mapped now, cached KV counted as held (res_kv_ensure reclaims it until the
 * room is there). */
static size_t kv_available_now(const res_t *r)
{
    size_t pool = r->n_pages * r->page;
    /* with no KV mapped at all, the first cache may take everything but
     * the minimum any model needs to run (it streams): progress is always
     * possible; beyond that KV leaves room for a whole model */
    size_t keep = r->kv_bytes ? r->headroom : r->headroom_min;
    size_t limit = pool > keep ? pool - keep : 0;
    return limit > r->kv_bytes ? limit - r->kv_bytes : 0;
}

size_t res_kv_available(const res_t *r)
{
    /* cached KV is reclaimed as soon as a live cache needs its room */
    size_t live = r->kv_bytes - r->kv_cached_bytes, pool = r->n_pages * r->page;
    size_t keep = live ? r->headroom : r->headroom_min;
    size_t limit = pool > keep ? pool - keep : 0;
    return limit > live ? limit - live : 0;
}

/* res_kv_available_for over avail (what the pool has for KV). */
static size_t kv_available_for(const res_t *r, const res_model_t *m, size_t avail)
{
    size_t held = 0;
    for (const res_model_t *v = r->n_kv_reserve ? r->models : NULL; v; v = v->next)
        if (v != m && v->cfg.kv_reserve > v->kv_bytes)
            held += v->cfg.kv_reserve - v->kv_bytes; /* others' reservations not yet used */
    avail = avail > held ? avail - held : 0;
    /* its own reservation holds even where the headroom kept for weights would not */
    size_t own = m->cfg.kv_reserve > m->kv_bytes ? m->cfg.kv_reserve - m->kv_bytes : 0;
    return avail > own ? avail : own;
}

size_t res_kv_available_for(const res_t *r, const res_model_t *m)
{
    return kv_available_for(r, m, res_kv_available(r));
}

static size_t kv_bytes_typed(const res_t *r, const model_hparams_t *hp, uint32_t n_pos, kv_type_t t)
{
    return 2 * res_pages_of(r, kv_seq_bytes(hp, n_pos, t) / 2) * r->page;
}

size_t res_kv_bytes_for(const res_t *r, const model_hparams_t *hp, uint32_t n_pos)
{
    return kv_bytes_typed(r, hp, n_pos, KV_TYPE_F16);
}

size_t res_kv_bytes_model(const res_t *r, const res_model_t *m, uint32_t n_pos)
{
    return kv_bytes_typed(r, &m->sm->model->hp, n_pos, m->cfg.kv_type);
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
    res_update_gauges(m);
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
    size_t want = res_pages_of(r, n_pos * per_pos) * r->page;
    if (want <= k->mapped_bytes)
        return RES_OK;
    size_t extra = 2 * (want - k->mapped_bytes);
    /* KV may never take the room a model needs to run (it is not evictable); cached KV goes */
    while (extra > kv_available_for(r, m, kv_available_now(r)) && res_kv_reclaim(r, NULL))
        ;
    if (extra > kv_available_for(r, m, kv_available_now(r))) {
        snprintf(err, errlen,
                 "model '%s': the KV budget is used up (%.1f MiB of KV mapped; "
                 "%.1f MiB of the pool stay free for weights, %.1f MiB more reserved by other "
                 "models' kv_cache)",
                 m->sm->name, r->kv_bytes / 1048576.0, r->headroom / 1048576.0,
                 (res_kv_available(r) - res_kv_available_for(r, m)) / 1048576.0);
        return RES_ERR_NOSPACE;
    }
    /* quota: shed this model's own tail (not the embedding) */
    while (!res_quota_room(r, m, extra)) {
        int64_t s = res_tail_seg(m, 1, m->sm->n_segs);
        if (s < 0) {
            snprintf(err, errlen,
                     "model '%s': its KV cache cannot grow to %u positions within "
                     "its gpu_quota",
                     m->sm->name, n_pos);
            return RES_ERR_QUOTA;
        }
        if (res_evict_seg(r, m, (uint32_t)s, RES_CAUSE_QUOTA))
            goto device;
    }
    /* capacity: idle models first, then this model's own tail (it streams) */
    while (r->free_pages < extra / r->page &&
           res_make_room_others(r, m, extra / r->page, RES_TIERS, 0)) {
        int64_t s = res_tail_seg(m, 1, m->sm->n_segs);
        if (s < 0) {
            snprintf(err, errlen,
                     "model '%s': no device memory for the KV cache (the pool is "
                     "held by running or pinned models)",
                     m->sm->name);
            return RES_ERR_NOSPACE;
        }
        if (res_evict_seg(r, m, (uint32_t)s, RES_CAUSE_CAPACITY))
            goto device;
    }
    size_t off = k->mapped_bytes, len = want - k->mapped_bytes;
    int brc = kv_map(r, kv, off, len);
    if (brc == BE_ERR_NOMEM && res_device_short(r, m, extra / r->page) == 0)
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
    res_note_used(r);
    m->kv_bytes += extra;
    r->kv_bytes += extra;
    res_update_gauges(m);
    return RES_OK;
device: /* every error return says why: callers pass err on to the client */
    snprintf(err, errlen, "model '%s': the device failed to map or unmap KV cache memory",
             m->sm->name);
    return RES_ERR_DEVICE;
}

void res_kv_free(res_t *r, kv_seq_t *kv)
{
    res_kv_t *k = kv ? kv->owner : NULL;
    if (k && k->host)
        res_kv_host_destroy(r, k);
    else if (k)
        res_kv_destroy(r, k);
}

/* ------------------------------------------------------------------ cached KV */

void res_kv_cache(res_t *r, kv_seq_t *kv, res_kv_drop_fn drop, void *ctx)
{
    res_kv_t *k = kv->owner;
    res_model_t *m = k->m;
    size_t bytes = 2 * k->mapped_bytes;
    if (k->cached)
        return;
    k->cached = 1;
    k->drop = drop;
    k->drop_ctx = ctx;
    m->n_kv--;
    m->st.total_kv_frees++; /* a live cache ended */
    m->kv_bytes -= bytes;
    m->kv_cached_bytes += bytes;
    m->n_kv_cached++;
    r->kv_cached_bytes += bytes;
    k->lru_prev = r->cached_new;
    k->lru_next = NULL;
    *(r->cached_new ? &r->cached_new->lru_next : &r->cached_old) = k;
    r->cached_new = k;
    res_update_gauges(m);
}

static void kv_unlink(res_t *r, res_kv_t *k)
{
    *(k->lru_prev ? &k->lru_prev->lru_next : &r->cached_old) = k->lru_next;
    *(k->lru_next ? &k->lru_next->lru_prev : &r->cached_new) = k->lru_prev;
    k->lru_prev = k->lru_next = NULL;
}

void res_kv_uncache(res_t *r, kv_seq_t *kv)
{
    res_kv_t *k = kv->owner;
    res_model_t *m = k->m;
    size_t bytes = 2 * k->mapped_bytes;
    if (!k->cached)
        return;
    kv_unlink(r, k);
    k->cached = 0;
    k->drop = NULL;
    k->drop_ctx = NULL;
    if (m->n_kv == 0)
        m->kv_live_type = kv->type;
    m->n_kv++;
    m->st.total_kv_allocs++;
    m->kv_bytes += bytes;
    m->kv_cached_bytes -= bytes;
    m->n_kv_cached--;
    r->kv_cached_bytes -= bytes;
    res_update_gauges(m);
}

void res_kv_touch(res_t *r, kv_seq_t *kv)
{
    res_kv_t *k = kv->owner;
    if (k->host) {
        res_kv_host_touch(r, k);
        return;
    }
    if (!k->cached || r->cached_new == k)
        return;
    kv_unlink(r, k);
    k->lru_prev = r->cached_new;
    *(r->cached_new ? &r->cached_new->lru_next : &r->cached_old) = k;
    r->cached_new = k;
}

int res_kv_copy(res_t *r, kv_seq_t *dst, const kv_seq_t *src, uint32_t n)
{
    size_t per_pos = (size_t)src->n_layer * src->kv_dim * kv_type_size(src->type);
    if (n > src->n_past || n > dst->n_ctx || dst->type != src->type ||
        dst->n_layer != src->n_layer || dst->kv_dim != src->kv_dim)
        return RES_ERR_DEVICE;
    if (r->be->copy_d2d(r->be->ctx, dst->k, src->k, n * per_pos) ||
        r->be->copy_d2d(r->be->ctx, dst->v, src->v, n * per_pos))
        return RES_ERR_DEVICE;
    dst->n_past = n;
    return RES_OK;
}

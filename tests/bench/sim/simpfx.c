/* simpfx: the simulator's prefix cache for conversations (sessions' last turns' KV on the device, reclaimed to a host tier), with the worker's admission rules. */
#include "simpfx.h"

#include <stdlib.h>

#define SPFX_BLOCK 16u /* the daemon's PFX_BLOCK: a hit reuses at least one block */

typedef struct spfx_entry {
    struct spfx *p;
    kv_seq_t *kv;                   /* device (cached) or host copy; NULL = none */
    uint32_t n;                     /* tokens it holds */
    int model;                      /* global index */
    struct spfx_entry *prev, *next; /* the model's entries, most recently used first */
} spfx_entry_t;

typedef struct spfx_list {
    spfx_entry_t *head, *tail;
    uint32_t n;
} spfx_list_t;

struct spfx {
    res_t *r;
    uint32_t max_entries;
    size_t host_bytes;
    spfx_list_t *models; /* n_models */
    int n_models;
    spfx_entry_t **by_id; /* cap_id, by session id (NULL: never kept) */
    size_t cap_id;
    spfx_stats_t st;
};

/* ------------------------------------------------------------------ entries */

static void unlink_entry(spfx_entry_t *e)
{
    spfx_list_t *l = &e->p->models[e->model];
    *(e->prev ? &e->prev->next : &l->head) = e->next;
    *(e->next ? &e->next->prev : &l->tail) = e->prev;
    e->prev = e->next = NULL;
    l->n--;
}

static void push_entry(spfx_entry_t *e)
{
    spfx_list_t *l = &e->p->models[e->model];
    e->prev = NULL;
    e->next = l->head;
    *(l->head ? &l->head->prev : &l->tail) = e;
    l->head = e;
    l->n++;
}

/* The entry no longer holds KV (the caller frees it, or residency did). */
static void forget(spfx_entry_t *e)
{
    if (!e->kv)
        return;
    unlink_entry(e);
    e->kv = NULL;
    e->n = 0;
}

/* The host tier dropped e's copy (budget). */
static void host_dropped(void *ctx, kv_seq_t *kv)
{
    spfx_entry_t *e = ctx;
    if (e->kv == kv) {
        e->p->st.host_drops++;
        forget(e);
    }
}

/* The pool reclaims e's device KV (it needs the room): a copy to the host tier, or forget it. */
static void reclaimed(void *ctx, kv_seq_t *kv)
{
    spfx_entry_t *e = ctx;
    spfx_t *p = e->p;
    kv_seq_t *host;
    if (e->kv != kv)
        return;
    if (p->host_bytes && res_kv_demote(p->r, kv, host_dropped, e, &host) == RES_OK) {
        e->kv = host;
        p->st.demotions++;
        return;
    }
    p->st.device_drops++;
    forget(e);
}

static spfx_entry_t *entry_of(spfx_t *p, uint32_t id, int make)
{
    if (id >= p->cap_id) {
        if (!make)
            return NULL;
        size_t cap = p->cap_id ? p->cap_id : 1024;
        while (cap <= id)
            cap *= 2;
        spfx_entry_t **v = realloc(p->by_id, cap * sizeof *v);
        if (!v)
            return NULL;
        for (size_t i = p->cap_id; i < cap; i++)
            v[i] = NULL;
        p->by_id = v;
        p->cap_id = cap;
    }
    if (!p->by_id[id] && make && (p->by_id[id] = calloc(1, sizeof **p->by_id)))
        p->by_id[id]->p = p;
    return p->by_id[id];
}

/* ------------------------------------------------------------------ the cache */

spfx_t *spfx_new(res_t *r, int n_models, uint32_t max_entries, size_t host_bytes)
{
    spfx_t *p = calloc(1, sizeof *p);
    if (!p || !(p->models = calloc((size_t)n_models, sizeof *p->models))) {
        free(p);
        return NULL;
    }
    p->r = r;
    p->n_models = n_models;
    p->max_entries = max_entries ? max_entries : 1;
    p->host_bytes = host_bytes;
    res_kv_host_budget(r, host_bytes);
    return p;
}

void spfx_free(spfx_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->cap_id; i++) {
        spfx_entry_t *e = p->by_id[i];
        if (e && e->kv) {
            kv_seq_t *kv = e->kv;
            forget(e);
            res_kv_free(p->r, kv);
        }
        free(e);
    }
    res_kv_host_budget(p->r, 0);
    free(p->by_id);
    free(p->models);
    free(p);
}

const spfx_stats_t *spfx_stats(const spfx_t *p)
{
    return &p->st;
}

/* Frees e's KV (the cache drops it). */
static void drop_entry(spfx_entry_t *e)
{
    kv_seq_t *kv = e->kv;
    forget(e);
    res_kv_free(e->p->r, kv);
    e->p->st.entry_drops++;
}

int spfx_keep(spfx_t *p, const wl_req_t *rq, kv_seq_t *kv)
{
    if (!p || !rq->session || !kv || kv->n_past < SPFX_BLOCK || rq->model >= p->n_models)
        return 0;
    spfx_entry_t *e = entry_of(p, rq->session, 1);
    if (!e)
        return 0;
    if (e->kv)
        drop_entry(e); /* an earlier turn's, which this one extends */
    e->kv = kv;
    e->n = kv->n_past;
    e->model = rq->model;
    push_entry(e);
    res_kv_cache(p->r, kv, reclaimed, e);
    spfx_list_t *l = &p->models[e->model];
    while (l->n > p->max_entries)
        drop_entry(l->tail);
    return 1;
}

/* ------------------------------------------------------------------ admission */

/* Tokens of rq's prompt e's KV holds (0 under a block). */
static uint32_t shared(const spfx_entry_t *e, const wl_req_t *rq)
{
    if (!e || !e->kv || e->model != rq->model)
        return 0;
    uint32_t n = e->n < rq->history ? e->n : rq->history;
    n = n < rq->prompt - 1 ? n : rq->prompt - 1;
    return n >= SPFX_BLOCK ? n : 0;
}

/* The worker's restore_pays: copying n positions back beats prefilling them. */
static int restore_pays(const spfx_t *p, const pass_time_t *pt, const kv_seq_t *host, uint32_t n)
{
    double bw = res_copy_bw(p->r);
    double copy_s =
        bw > 0 ? 2.0 * n * host->n_layer * host->kv_dim * kv_type_size(host->type) / bw : 0;
    double prefill_s = pass_time_for(pt, n, 1) - pass_time_for(pt, 1, 1);
    return copy_s == 0 || prefill_s <= 0 || copy_s < prefill_s;
}

int spfx_admit(spfx_t *p, res_model_t *rm, const pass_time_t *pt, const wl_req_t *rq,
               uint32_t n_ctx, kv_seq_t **kv, res_restore_t *rs, uint32_t *n_restore, char *err,
               size_t errlen)
{
    *n_restore = 0;
    *kv = NULL;
    spfx_entry_t *e = p && rq->session && rq->prompt >= 2 ? entry_of(p, rq->session, 0) : NULL;
    if (p && rq->session)
        p->st.lookups++;
    uint32_t n = shared(e, rq);
    if (n && !res_kv_is_host(e->kv) && e->kv->n_ctx >= n_ctx && 2 * n >= e->n) {
        kv_seq_t *k = e->kv; /* adopted whole */
        forget(e);
        res_kv_uncache(p->r, k);
        k->n_past = n;
        *kv = k;
        p->st.hits++;
        p->st.hit_tokens += n;
        return res_kv_ensure(p->r, k, rq->prompt + 1, err, errlen);
    }
    int rc = res_kv_new(p->r, rm, n_ctx, kv, err, errlen);
    if (!rc)
        rc = res_kv_ensure(p->r, *kv, rq->prompt + 1, err, errlen);
    if (rc || !(n = shared(e, rq))) /* the room may have come from this very entry */
        return rc;
    if (res_kv_is_host(e->kv)) {
        if (!restore_pays(p, pt, e->kv, n) || res_kv_restore_start(p->r, *kv, e->kv, n, rs)) {
            p->st.host_recomputes++;
            return 0;
        }
        *n_restore = n;
        p->st.restores++;
        p->st.restore_tokens += n;
    } else {
        if (res_kv_copy(p->r, *kv, e->kv, n))
            return 0;
        res_kv_touch(p->r, e->kv);
        p->st.hits++;
        p->st.hit_tokens += n;
    }
    unlink_entry(e);
    push_entry(e);
    return 0;
}

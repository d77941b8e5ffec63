/* worker_pfx: the prefix cache on the worker: a request's cached prefix found at admission (adopted whole or copied into its KV cache), the wait for a prefix admitted with it, and a finished sequence's KV kept for the next. Calls only the core (worker.c) and below. */
#include "worker_int.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the model's cache */

/* Whether m reuses prefixes now (scheduler.prefix_cache and models.prefix_cache). */
static int pfx_enabled(const wk_t *w, const wk_model_t *m)
{
    return w->cfg->scheduler.prefix_cache && m->cfg.prefix_cache > 0;
}

/* The cache dropped an entry (LRU, superseded): its KV cache goes back to the pool. */
static void pfx_free_kv(void *ctx, kv_seq_t *kv)
{
    wk_model_t *m = ctx;
    m->svc.total_prefix_evictions++;
    res_kv_free(m->w->res, kv);
}

size_t wk_kv_host_budget(const wk_t *w)
{
    uint64_t b = w->cfg->host.kv_cache, mem = w->cfg->host.memory;
    size_t used = store_used(w->store);
    if (w->be->zero_copy)
        return 0; /* its caches are host memory already */
    if (mem)
        b = used < mem && mem - used < b ? mem - used : used < mem ? b : 0;
    return (size_t)b;
}

/* The host tier dropped a copy (LRU, budget): the cache forgets it. */
static void pfx_host_dropped(void *ctx, kv_seq_t *kv)
{
    wk_model_t *m = ctx;
    if (pfx_forget(m->pfx, kv))
        m->svc.total_prefix_evictions++;
}

/* The pool reclaimed a cached KV cache (it needed the room, or its model was paged out): a copy
 * goes to the host tier when it fits there, else the cache forgets it. */
static void pfx_reclaimed(void *ctx, kv_seq_t *kv)
{
    wk_model_t *m = ctx;
    pfx_entry_t *e = pfx_find_kv(m->pfx, kv);
    kv_seq_t *host;
    if (!e)
        return;
    res_kv_host_budget(m->w->res, wk_kv_host_budget(m->w));
    if (res_kv_demote(m->w->res, kv, pfx_host_dropped, m, &host) == RES_OK) {
        pfx_entry_set_kv(e, host);
        return;
    }
    pfx_forget(m->pfx, kv);
    m->svc.total_prefix_evictions++;
}

void wk_pfx_close(wk_model_t *m)
{
    pfx_free(m->pfx);
    m->pfx = NULL;
}

int wk_pfx_wanted(const wk_t *w, const wk_model_t *m, const wk_seq_t *s)
{
    return pfx_enabled(w, m) && !s->req.cache_off;
}

void wk_pfx_seed(const wk_model_t *m, wk_seq_t *s)
{
    /* an adapter's KV differs from its base's and every other adapter's: never shared */
    s->pfx_seed =
        pfx_seed(s->adapter ? s->adapter->name : m->name, s->req.tenant, s->req.cache_salt);
}

/* ------------------------------------------------------------------ lookups */

/* Where a prefix comes from: a cached entry, or a live sequence's cache (its prompt's
 * positions already computed). */
typedef struct pfx_src {
    pfx_entry_t *e;
    const kv_seq_t *kv;
    uint32_t n; /* tokens reused: whole blocks at least, one prompt token left to prefill */
} pfx_src_t;

/* The live sequence (in list, linked by next_active) sharing the longest prefix with s. */
static void live_best(const wk_seq_t *list, const wk_seq_t *s, uint32_t limit, pfx_src_t *best)
{
    for (const wk_seq_t *o = list; o; o = o->next_active) {
        if (o == s || !o->kv || o->pfx_seed != s->pfx_seed || o->redo)
            continue;
        uint32_t have = o->kv->n_past < o->n_prompt ? o->kv->n_past : o->n_prompt;
        uint32_t c = pfx_common(o->prompt, have, s->prompt, s->n_prompt);
        c = c < limit ? c : limit;
        if (c >= PFX_BLOCK && c > best->n)
            *best = (pfx_src_t){NULL, o->kv, c};
    }
}

/* The longest prefix of s's prompt there is to reuse now: cached entries, the model's running
 * sequences and those admitted with s (fresh). */
static pfx_src_t pfx_find(wk_model_t *m, const wk_seq_t *s, const wk_seq_t *fresh)
{
    pfx_src_t best = {0};
    uint32_t limit = s->n_prompt - 1; /* the last prompt token is run: its logits */
    best.n = pfx_lookup(m->pfx, s->pfx_seed, s->prompt, s->n_prompt, limit, &best.e);
    if (best.e)
        best.kv = pfx_entry_kv(best.e);
    live_best(m->active, s, limit, &best);
    live_best(fresh, s, limit, &best);
    return best;
}

uint32_t wk_pfx_hint(wk_t *w, wk_model_t *m, const wk_seq_t *s)
{
    if (!wk_pfx_wanted(w, m, s) || s->n_prompt < 2)
        return 0;
    return pfx_find(m, s, NULL).n;
}

int wk_pfx_wait(wk_t *w, wk_model_t *m, const wk_seq_t *s, const wk_seq_t *fresh)
{
    if (!fresh || !wk_pfx_wanted(w, m, s) || s->n_prompt < 2)
        return 0;
    uint32_t now = pfx_find(m, s, fresh).n;
    /* one admitted this pass prefills a longer shared prefix: reuse it next pass */
    for (const wk_seq_t *f = fresh; f; f = f->next_active) {
        if (f->pfx_seed != s->pfx_seed || !f->kv || f->kv->n_past >= f->n_prompt)
            continue;
        uint32_t c = pfx_common(f->prompt, f->n_prompt, s->prompt, s->n_prompt - 1);
        if (c >= now + PFX_BLOCK) {
            m->svc.total_prefix_waits++;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ admission */

/* Whether copying n positions of a host copy back beats prefilling them: at the measured copy
 * bandwidth against the model's measured prefill rate (either unknown: copy). */
static int restore_pays(const wk_t *w, const wk_model_t *m, const kv_seq_t *host, uint32_t n)
{
    double bw = res_copy_bw(w->res);
    double copy_s =
        bw > 0 ? 2.0 * n * host->n_layer * host->kv_dim * kv_type_size(host->type) / bw : 0;
    double prefill_s = pass_time_for(&m->pass, n, 1) - pass_time_for(&m->pass, 1, 1);
    return copy_s == 0 || prefill_s <= 0 || copy_s < prefill_s;
}

/* Takes a cached entry's KV cache whole when it fits s and most of it is reused; 0 then. */
static int pfx_adopt(wk_t *w, wk_model_t *m, wk_seq_t *s, const pfx_src_t *src, uint32_t n_ctx,
                     char *err, size_t errlen)
{
    kv_seq_t *kv = pfx_entry_kv(src->e);
    if (res_kv_is_host(kv) || kv->n_ctx < n_ctx || 2 * src->n < pfx_entry_len(src->e))
        return -1;
    pfx_take(m->pfx, src->e);
    res_kv_uncache(w->res, kv);
    kv->n_past = src->n; /* positions past the match are overwritten by its prefill */
    s->kv = kv;
    return res_kv_ensure(w->res, kv, s->n_prompt + 1, err, errlen);
}

int wk_pfx_admit(wk_t *w, wk_model_t *m, wk_seq_t *s, const wk_seq_t *fresh, uint32_t n_ctx,
                 char *err, size_t errlen)
{
    int on = wk_pfx_wanted(w, m, s) && s->n_prompt >= 2;
    pfx_src_t src = {0};
    if (on) {
        n_ctx = wk_model_context(m); /* room to be adopted by the next turn */
        src = pfx_find(m, s, fresh);
        m->svc.total_prefix_lookups++;
        m->svc.total_prefix_lookup_tokens += s->n_prompt;
    }
    if (src.e) {
        int rc = pfx_adopt(w, m, s, &src, n_ctx, err, errlen);
        if (rc == 0) {
            s->n_cached = src.n;
            m->svc.total_prefix_hits++;
            m->svc.total_prefix_hit_tokens += src.n;
            return 0;
        }
        if (s->kv)
            return rc; /* adopted but could not grow: the caller frees it */
    }
    int rc = res_kv_new(w->res, m->rm, n_ctx, &s->kv, err, errlen);
    if (!rc)
        rc = res_kv_ensure(w->res, s->kv, s->n_prompt + 1, err, errlen);
    if (rc || !on)
        return rc;
    /* the room may have come from cached entries: look again, then copy */
    src = pfx_find(m, s, fresh);
    if (src.n && res_kv_is_host(src.kv)) { /* from host RAM: on the copy queue, if it pays */
        if (!restore_pays(w, m, src.kv, src.n) ||
            res_kv_restore_start(w->res, s->kv, src.kv, src.n, &s->restore)) {
            m->svc.total_prefix_host_recomputes++;
            return 0;
        }
    } else if (src.n == 0 || res_kv_copy(w->res, s->kv, src.kv, src.n))
        return 0; /* a copy the backend refused: prefill it all */
    if (src.e) {
        pfx_touch(m->pfx, src.e);
        res_kv_touch(w->res, pfx_entry_kv(src.e));
    }
    s->n_cached = src.n;
    m->svc.total_prefix_hits++;
    m->svc.total_prefix_hit_tokens += src.n;
    m->svc.total_prefix_copies++;
    return 0;
}

/* ------------------------------------------------------------------ a sequence ends */

void wk_pfx_keep(wk_t *w, wk_seq_t *s)
{
    wk_model_t *m = w->models[s->model];
    kv_seq_t *kv = s->kv;
    if (!pfx_enabled(w, m)) {
        wk_pfx_close(m); /* turned off by a reload: what it held goes back */
        return;
    }
    if (!kv || s->req.cache_off || kv->n_past < PFX_BLOCK || s->redo)
        return;
    if (!m->pfx && !(m->pfx = pfx_new(m->cfg.prefix_cache, pfx_free_kv, m)))
        return;
    pfx_set_max(m->pfx, m->cfg.prefix_cache);
    /* positions [0, n_past) hold the prompt, then the generated tokens fed back */
    uint32_t n = kv->n_past;
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    if (!toks)
        return;
    uint32_t np = n < s->n_prompt ? n : s->n_prompt;
    memcpy(toks, s->prompt, (size_t)np * sizeof *toks);
    if (n > np)
        memcpy(toks + np, s->gen, (size_t)(n - np) * sizeof *toks);
    if (pfx_insert(m->pfx, s->pfx_seed, toks, n, kv)) {
        res_kv_cache(w->res, kv, pfx_reclaimed, m);
        s->kv = NULL;
    }
    free(toks);
}

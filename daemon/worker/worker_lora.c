/* worker_lora: LoRA adapters in the daemon: each loaded beside its base as a residency unit of the base's (paged in while its requests run), found by name, reported, added and dropped by reloads; their requests run in their base's batches. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each pair's A and B start on this boundary in the device copy. */
#define LORA_DEV_ALIGN 256u

/* ------------------------------------------------------------------ lookups */

wk_adapter_t *wk_lora_find(const wk_t *w, const char *name)
{
    for (int i = 0; name && i < w->n_adapters; i++)
        if (w->adapters[i] && !w->adapters[i]->removing && !strcmp(w->adapters[i]->name, name))
            return w->adapters[i];
    return NULL;
}

/* Its base as loaded now (in host RAM), or NULL. */
static wk_model_t *lora_base(const wk_t *w, const wk_adapter_t *a)
{
    int mi = wk_find_model(w, a->cfg.base);
    return mi >= 0 && w->models[mi]->sm ? w->models[mi] : NULL;
}

int wk_lora_usable(wk_t *w, uint64_t conn, const proto_req_t *req, wk_adapter_t *a)
{
    wk_model_t *b = lora_base(w, a);
    if (a->load_error) {
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "adapter '%s' failed to load: %s",
                      a->name, a->load_error);
        return 0;
    }
    if (!b || !a->lora || a->on != b->serial) {
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL,
                      "adapter '%s' is unavailable: its base '%s' is not loaded", a->name,
                      a->cfg.base);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ loading */

static size_t lora_align(size_t n)
{
    return (n + LORA_DEV_ALIGN - 1) / LORA_DEV_ALIGN * LORA_DEV_ALIGN;
}

/* Drops a's pairs, its host image and its residency unit (no sequence holds them). */
static void lora_unload(wk_t *w, wk_adapter_t *a)
{
    if (a->att) { /* its residency counters outlive the unit */
        uint64_t pi, bi, ev;
        int resident;
        res_att_stats(w->res, a->att, &pi, &bi, &ev, &resident);
        a->st.total_page_ins += pi;
        a->st.total_bytes_in += bi;
        a->st.total_evictions += ev;
    }
    res_att_remove(w->res, a->att);
    if (a->img)
        w->be->host_free(w->be->ctx, a->img, a->img_bytes);
    free(a->dev.pairs);
    lora_close(a->lora);
    a->att = NULL;
    a->img = NULL;
    a->img_bytes = 0;
    a->dev = (lora_weights_t){0};
    a->lora = NULL;
    a->on = 0;
}

/* One view's bytes into the host image at *off, the view rebased onto dev + *off. */
static void lora_pack(wk_adapter_t *a, model_weight_t *v, uint8_t *dev, size_t *off)
{
    memcpy((uint8_t *)a->img + *off, v->data, v->nbytes);
    v->data = dev + *off;
    *off += lora_align(v->nbytes);
}

/* a's residency unit on its base b: every pair's A and B packed into one host image (the home
 * its page-ins copy from; zero-copy backends read the pairs where they are), a->dev pointing
 * at the unit's device range. */
static int lora_place(wk_t *w, wk_adapter_t *a, wk_model_t *b, char *err, size_t errlen)
{
    const lora_weights_t *src = &a->lora->w;
    size_t n = (size_t)src->n_layer * LORA_N_TARGETS, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (src->pairs[i].a.data)
            bytes += lora_align(src->pairs[i].a.nbytes) + lora_align(src->pairs[i].b.nbytes);
    a->dev = *src;
    a->dev.pairs = malloc((n ? n : 1) * sizeof *a->dev.pairs);
    int zc = w->be->zero_copy;
    if (!a->dev.pairs || (!zc && !(a->img = w->be->host_alloc(w->be->ctx, bytes ? bytes : 1)))) {
        snprintf(err, errlen, "out of host memory for its %zu bytes", bytes);
        return -1;
    }
    memcpy(a->dev.pairs, src->pairs, n * sizeof *a->dev.pairs);
    a->img_bytes = zc ? 0 : bytes;
    size_t page = res_page_size(w->res), span = (bytes + page - 1) / page * page;
    if (!zc && a->cfg.gpu_quota && span > a->cfg.gpu_quota) {
        snprintf(err, errlen, "its %zu bytes on the device exceed its gpu_quota (%llu bytes)", span,
                 (unsigned long long)a->cfg.gpu_quota);
        return -1;
    }
    if (res_att_add(w->res, b->rm, a->img, a->img_bytes, &a->att, err, errlen))
        return -1;
    for (uint32_t k = 0; k < a->refs; k++) /* sequences that wait on it already hold it */
        res_att_hold(a->att, 1);
    if (zc)
        return 0;
    uint8_t *dev = res_att_addr(a->att);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        lora_pair_t *p = &a->dev.pairs[i];
        if (p->a.data) {
            lora_pack(a, &p->a, dev, &off);
            lora_pack(a, &p->b, dev, &off);
        }
    }
    return 0;
}

/* Opens a's file against its base b and attaches its residency unit to b's (paged in by its
 * first request); a failure is kept in a->load_error (a 'failed' adapter; its base serves
 * on). */
static void lora_load(wk_t *w, wk_adapter_t *a, wk_model_t *b)
{
    char err[1024];
    a->lora =
        lora_open(a->cfg.adapter, b->sm->model, (float)a->cfg.adapter_scale, NULL, err, sizeof err);
    if (a->lora && !lora_place(w, a, b, err, sizeof err)) {
        a->on = b->serial;
        log_info("adapter '%s' of '%s': %u pairs, rank %u, %.1f KiB paged in on request", a->name,
                 b->name, (unsigned)a->lora->n_pairs, (unsigned)a->lora->w.rank_max,
                 res_att_span(w->res, a->att) / 1024.0);
        return;
    }
    lora_unload(w, a);
    a->on = b->serial; /* failed on this load of its base: tried again with its next */
    log_error("%s:%d: adapter '%s': %s", w->cfg->file, a->cfg.line, a->name, err);
    a->load_error = strdup(err);
}

uint32_t wk_lora_ref(wk_adapter_t *a, int delta)
{
    if (delta > 0)
        a->refs++;
    else if (a->refs)
        a->refs--;
    if (a->att)
        res_att_hold(a->att, delta);
    return a->refs;
}

int wk_lora_page(wk_t *w, wk_seq_t *s, char *err, size_t errlen)
{
    wk_adapter_t *a = s->adapter;
    if (!a)
        return RES_OK;
    if (!a->att) {
        snprintf(err, errlen, "adapter '%s' is unavailable: its base '%s' is not loaded", a->name,
                 a->cfg.base);
        return RES_ERR_ARG;
    }
    return res_att_map(w->res, a->att, err, errlen);
}

int wk_lora_ready(wk_t *w, wk_seq_t *s, char *err, size_t errlen)
{
    int rc = wk_lora_page(w, s, err, errlen);
    if (rc == RES_OK)
        return !s->adapter || res_att_state(w->res, s->adapter->att) == RES_SEG_RESIDENT;
    return rc == RES_ERR_NOSPACE ? 0 : -1;
}

void wk_lora_detach(wk_t *w, const wk_model_t *m)
{
    for (int i = 0; i < w->n_adapters; i++) {
        wk_adapter_t *a = w->adapters[i];
        if (a && a->att && a->on == m->serial)
            lora_unload(w, a); /* on is 0 now: it loads again with its base's next load */
    }
}

static void lora_free(wk_t *w, wk_adapter_t *a)
{
    if (!a)
        return;
    lora_unload(w, a);
    free(a->load_error);
    free(a->name);
    free(a);
}

static wk_adapter_t *lora_new(const cfg_model_t *c)
{
    wk_adapter_t *a = calloc(1, sizeof *a);
    if (a && !(a->name = strdup(c->name))) {
        free(a);
        return NULL;
    }
    if (a)
        a->cfg = *c;
    return a;
}

/* ------------------------------------------------------------------ sync */

/* Adapters gone from cfg, or changed there, are marked removing; the rest point at cfg's strings. */
static void lora_mark(wk_t *w, const cfg_t *cfg)
{
    for (int i = 0; i < w->n_adapters; i++) {
        wk_adapter_t *a = w->adapters[i];
        if (!a || a->removing)
            continue;
        const cfg_model_t *c = cfg_find_model(cfg, a->name);
        char what[256] = "";
        int again = c && c->adapter && cfg_model_reloads(&a->cfg, c, what, sizeof what);
        if (c && c->adapter && !again && c->gpu_quota != a->cfg.gpu_quota) {
            snprintf(what, sizeof what, "gpu_quota"); /* its quota is checked as it loads */
            again = 1;
        }
        if (!c || !c->adapter || again) {
            a->removing = 1;
            if (c && c->adapter)
                log_info("adapter '%s' loads again (%s changed)", a->name, what);
        } else {
            a->cfg = *c;
        }
    }
}

void wk_lora_sync(wk_t *w, const cfg_t *cfg)
{
    w->lora_dirty = 0;
    if (cfg)
        lora_mark(w, cfg);
    for (size_t j = 0; cfg && j < cfg->n_models; j++) { /* new (or changed) adapters */
        const cfg_model_t *c = &cfg->models[j];
        if (!c->adapter || wk_lora_find(w, c->name))
            continue;
        int slot = 0;
        while (slot < w->n_adapters && w->adapters[slot])
            slot++;
        if (slot == w->cap_adapters) { /* no fixed limit: the table grows */
            int cap = w->cap_adapters ? 2 * w->cap_adapters : 16;
            wk_adapter_t **t = realloc(w->adapters, (size_t)cap * sizeof *t);
            if (!t) {
                log_error("adapter '%s' and those after it are not served: out of memory", c->name);
                break;
            }
            memset(t + w->cap_adapters, 0, (size_t)(cap - w->cap_adapters) * sizeof *t);
            w->adapters = t;
            w->cap_adapters = cap;
        }
        wk_adapter_t *a = lora_new(c);
        if (!a)
            break;
        w->adapters[slot] = a;
        w->n_adapters += slot == w->n_adapters;
    }
    for (int i = 0; i < w->n_adapters; i++) {
        wk_adapter_t *a = w->adapters[i];
        if (!a)
            continue;
        if (a->refs)
            continue; /* its sequences finish on what they have */
        if (a->removing) {
            log_info("adapter '%s' removed", a->name);
            lora_free(w, a);
            w->adapters[i] = NULL;
            continue;
        }
        wk_model_t *b = lora_base(w, a);
        if (a->on == (b ? b->serial : 0))
            continue;
        /* its base came, went or was loaded again: it follows it */
        lora_unload(w, a);
        free(a->load_error);
        a->load_error = NULL;
        if (b)
            lora_load(w, a, b);
    }
}

void wk_lora_free_all(wk_t *w)
{
    for (int i = 0; i < w->n_adapters; i++) {
        lora_free(w, w->adapters[i]);
        w->adapters[i] = NULL;
    }
    free(w->adapters);
    w->adapters = NULL;
    w->n_adapters = w->cap_adapters = 0;
}

/* ------------------------------------------------------------------ reports */

/* Its counters: the worker's, its residency unit's (those of units it had before added), and
 * its state now. */
static void lora_stats(wk_t *w, const wk_adapter_t *a, stats_adapter_t *st)
{
    *st = a->st;
    st->curr_refs = a->refs;
    st->curr_resident = st->curr_device_bytes = 0;
    if (!a->att)
        return;
    uint64_t pi, bi, ev;
    int resident;
    res_att_stats(w->res, a->att, &pi, &bi, &ev, &resident);
    st->total_page_ins += pi;
    st->total_bytes_in += bi;
    st->total_evictions += ev;
    st->curr_resident = (uint64_t)resident;
    if (res_att_state(w->res, a->att) != RES_SEG_ABSENT)
        st->curr_device_bytes = res_att_span(w->res, a->att);
}

/* 'failed' (its file), 'unavailable' (its base is not in host RAM), else its base's state,
 * 'partial' while its base is resident and it is not. */
static const char *lora_state(wk_t *w, const wk_adapter_t *a)
{
    if (a->load_error)
        return wk_state_name(WK_STATE_FAILED);
    wk_model_t *b = lora_base(w, a);
    if (!b || !a->lora || !a->att || a->on != b->serial)
        return "unavailable";
    stats_res_t st;
    res_model_stats(w->res, b->rm, &st);
    if (res_fully_resident(w->res, b->rm))
        return wk_state_name(res_att_state(w->res, a->att) == RES_SEG_RESIDENT ? WK_STATE_RESIDENT
                                                                               : WK_STATE_PARTIAL);
    return wk_state_name(st.curr_resident_bytes ? WK_STATE_PARTIAL : WK_STATE_HOST);
}

void wk_lora_report_models(wk_t *w, json_t *arr, int admin)
{
    for (int i = 0; i < w->n_adapters; i++) {
        wk_adapter_t *a = w->adapters[i];
        if (!a || a->removing)
            continue;
        json_t *o = json_pack("{s:s, s:s, s:s}", "name", a->name, "state", lora_state(w, a), "base",
                              a->cfg.base);
        wk_model_t *b = lora_base(w, a);
        if (b) {
            const model_t *mod = b->sm->model;
            char tn[16];
            json_object_set_new(o, "arch", json_string(model_arch_name(mod->hp.arch)));
            json_object_set_new(o, "type", json_string(wk_type_name(mod->wtype, tn)));
            json_object_set_new(o, "context", json_integer(wk_model_context(b)));
        }
        if (a->lora) {
            json_object_set_new(o, "adapter_rank", json_integer(a->lora->w.rank_max));
            json_object_set_new(o, "adapter_pairs", json_integer(a->lora->n_pairs));
        }
        if (admin) {
            stats_adapter_t st;
            lora_stats(w, a, &st);
            json_object_set_new(o, "adapter_scale", json_real(a->cfg.adapter_scale));
            json_object_set_new(o, "adapter_bytes", json_integer((json_int_t)a->img_bytes));
            json_object_set_new(o, "adapter_resident", json_boolean(st.curr_resident));
            json_object_set_new(o, "curr_refs", json_integer(a->refs));
            if (a->load_error)
                json_object_set_new(o, "error", json_string(a->load_error));
        }
        json_array_append_new(arr, o);
    }
}

json_t *wk_lora_report_stats(wk_t *w)
{
    json_t *all = json_object();
    for (int i = 0; i < w->n_adapters; i++) {
        wk_adapter_t *a = w->adapters[i];
        if (!a || a->removing)
            continue;
        stats_adapter_t st;
        lora_stats(w, a, &st);
        json_t *o = json_pack("{s:s, s:s, s:I}", "base", a->cfg.base, "state", lora_state(w, a),
                              "adapter_bytes", (json_int_t)a->img_bytes);
#define LORA_STAT(name, help) json_object_set_new(o, #name, json_integer((json_int_t)st.name));
        STATS_ADAPTER(LORA_STAT)
#undef LORA_STAT
        if (a->load_error)
            json_object_set_new(o, "error", json_string(a->load_error));
        json_object_set_new(all, a->name, o);
    }
    return all;
}

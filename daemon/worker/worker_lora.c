/* worker_lora: LoRA adapters in the daemon: each loaded beside its base (a device copy of its pairs), found by name, reported, added and dropped by reloads; their requests run in their base's batches. */
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

/* Drops a's pairs and their device copy (no sequence holds them). */
static void lora_unload(wk_t *w, wk_adapter_t *a)
{
    if (a->buf)
        w->be->buf_free(w->be->ctx, a->buf);
    free(a->dev.pairs);
    lora_close(a->lora);
    a->buf = NULL;
    a->dev = (lora_weights_t){0};
    a->dev_bytes = 0;
    a->lora = NULL;
    a->on = 0;
}

/* One view's bytes copied into the device buffer at *off; the view rebased onto them. */
static int lora_put(wk_t *w, wk_adapter_t *a, model_weight_t *v, size_t *off)
{
    void *dst = (uint8_t *)a->buf + *off;
    if (w->be->upload(w->be->ctx, dst, v->data, v->nbytes))
        return -1;
    v->data = dst;
    *off += (v->nbytes + LORA_DEV_ALIGN - 1) / LORA_DEV_ALIGN * LORA_DEV_ALIGN;
    return 0;
}

/* The device copy: every pair's A and B in one buffer, a->dev pointing into it. */
static int lora_upload(wk_t *w, wk_adapter_t *a, char *err, size_t errlen)
{
    const lora_weights_t *src = &a->lora->w;
    size_t n = (size_t)src->n_layer * LORA_N_TARGETS, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (src->pairs[i].a.data)
            bytes +=
                (src->pairs[i].a.nbytes + LORA_DEV_ALIGN - 1) / LORA_DEV_ALIGN * LORA_DEV_ALIGN +
                (src->pairs[i].b.nbytes + LORA_DEV_ALIGN - 1) / LORA_DEV_ALIGN * LORA_DEV_ALIGN;
    a->dev = *src;
    a->dev.pairs = malloc((n ? n : 1) * sizeof *a->dev.pairs);
    if (a->dev.pairs && w->be->zero_copy) { /* the cpu backend reads them where they are */
        memcpy(a->dev.pairs, src->pairs, n * sizeof *a->dev.pairs);
        return 0;
    }
    a->buf = bytes ? w->be->buf_alloc(w->be->ctx, bytes) : NULL;
    if (!a->dev.pairs || (bytes && !a->buf)) {
        snprintf(err, errlen, "no device memory for its %zu bytes", bytes);
        return -1;
    }
    memcpy(a->dev.pairs, src->pairs, n * sizeof *a->dev.pairs);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        lora_pair_t *p = &a->dev.pairs[i];
        if (p->a.data && (lora_put(w, a, &p->a, &off) || lora_put(w, a, &p->b, &off))) {
            snprintf(err, errlen, "copying its pairs to the device failed");
            return -1;
        }
    }
    a->dev_bytes = bytes;
    return 0;
}

/* Opens a's file against its base b and makes the device copy; a failure is kept in
 * a->load_error (a 'failed' adapter; its base serves on). */
static void lora_load(wk_t *w, wk_adapter_t *a, wk_model_t *b)
{
    char err[1024];
    a->lora =
        lora_open(a->cfg.adapter, b->sm->model, (float)a->cfg.adapter_scale, NULL, err, sizeof err);
    if (a->lora && !lora_upload(w, a, err, sizeof err)) {
        a->on = b->serial;
        log_info("adapter '%s' of '%s': %u pairs, rank %u, %.1f KiB on the device", a->name,
                 b->name, (unsigned)a->lora->n_pairs, (unsigned)a->lora->w.rank_max,
                 a->dev_bytes / 1024.0);
        return;
    }
    lora_unload(w, a);
    a->on = b->serial; /* failed on this load of its base: tried again with its next */
    log_error("%s:%d: adapter '%s': %s", w->cfg->file, a->cfg.line, a->name, err);
    a->load_error = strdup(err);
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
        char what[256];
        if (!c || !c->adapter || cfg_model_reloads(&a->cfg, c, what, sizeof what)) {
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
        if (slot == WK_MAX_MODELS) {
            log_warning("adapter '%s' and those after it are not served: at most %d adapters",
                        c->name, WK_MAX_MODELS);
            break;
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

size_t wk_lora_dev_bytes(const wk_t *w)
{
    size_t n = 0;
    for (int i = 0; i < w->n_adapters; i++)
        if (w->adapters[i])
            n += w->adapters[i]->dev_bytes;
    return n;
}

void wk_lora_free_all(wk_t *w)
{
    for (int i = 0; i < w->n_adapters; i++) {
        lora_free(w, w->adapters[i]);
        w->adapters[i] = NULL;
    }
    w->n_adapters = 0;
}

/* ------------------------------------------------------------------ reports */

/* 'failed' (its file), 'unavailable' (its base is not in host RAM), else its base's state. */
static const char *lora_state(wk_t *w, const wk_adapter_t *a)
{
    if (a->load_error)
        return wk_state_name(WK_STATE_FAILED);
    wk_model_t *b = lora_base(w, a);
    if (!b || !a->lora || a->on != b->serial)
        return "unavailable";
    stats_res_t st;
    res_model_stats(w->res, b->rm, &st);
    if (res_fully_resident(w->res, b->rm))
        return wk_state_name(WK_STATE_RESIDENT);
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
            json_object_set_new(o, "adapter_scale", json_real(a->cfg.adapter_scale));
            json_object_set_new(o, "adapter_bytes", json_integer((json_int_t)a->dev_bytes));
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
        json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "base", a->cfg.base, "state",
                              lora_state(w, a), "total_requests", (json_int_t)a->total_requests,
                              "total_generated_tokens", (json_int_t)a->total_generated_tokens,
                              "total_failed", (json_int_t)a->total_failed, "adapter_bytes",
                              (json_int_t)a->dev_bytes, "curr_refs", (json_int_t)a->refs);
        if (a->load_error)
            json_object_set_new(o, "error", json_string(a->load_error));
        json_object_set_new(all, a->name, o);
    }
    return all;
}

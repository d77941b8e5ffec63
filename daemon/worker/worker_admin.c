/* worker_admin: the worker's admin ops (load, evict, pin, fault, drain), model loading and reload. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ models */

/* Loads one configured model into the store and registers it; failures are
 * kept as a 'failed' model with the reason. */
wk_model_t *wk_model_load(wk_t *w, const cfg_model_t *c)
{
    wk_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->name = strdup(c->name);
    m->cfg = *c;
    m->w = w;
    m->serial = ++w->n_loads;
    if (!m->name) {
        free(m);
        return NULL;
    }
    char err[1024];
    log_info("loading model '%s' from %s", c->name, c->path);
    m->loading = 1;
    w->loading = m;
    w->load_decile = 0;
    store_set_shared(w->store, w->res ? res_kv_host_used(w->res) : 0);
    int src = store_load(w->store, c->name, c->path, &m->sm, err, sizeof err);
    if (src == STORE_ERR_BUDGET && w->res && res_kv_host_used(w->res)) {
        /* cached KV in host RAM counts against host.memory too: models come first */
        res_kv_host_budget(w->res, 0);
        store_set_shared(w->store, 0);
        src = store_load(w->store, c->name, c->path, &m->sm, err, sizeof err);
    }
    m->loading = 0;
    w->loading = NULL;
    if (src != STORE_OK) {
        log_error("%s:%d: %s", w->cfg->file, c->line, err);
        m->load_error = strdup(err);
        m->sm = NULL;
        return m;
    }
    model_set_context(m->sm->model, wk_model_context(m)); /* phi3: long or short RoPE factors */
    res_cfg_t rc = wk_res_cfg_of(c);
    if (res_add(w->res, m->sm, &rc, &m->rm, err, sizeof err) != RES_OK) {
        log_error("%s:%d: %s", w->cfg->file, c->line, err);
        m->load_error = strdup(err);
        store_unload(w->store, m->sm);
        m->sm = NULL;
        return m;
    }
    gguf_str_t tmpl = {0};
    if (gguf_get_str(m->sm->model->gguf, "tokenizer.chat_template", &tmpl) == 0)
        m->chat = chat_detect(tmpl.ptr, tmpl.len);
    m->tools = chat_tools_detect(m->chat, tmpl.ptr, tmpl.len);
    gguf_str_t tool_use = {0}; /* Hermes 2 Pro/3 files: a second template for requests with tools */
    if ((m->tools == CHAT_TOOLS_GENERIC || m->tools == CHAT_TOOLS_PENDING) &&
        gguf_get_str(m->sm->model->gguf, "tokenizer.chat_template.tool_use", &tool_use) == 0 &&
        chat_tools_detect(m->chat, tool_use.ptr, tool_use.len) == CHAT_TOOLS_HERMES2)
        m->tools = CHAT_TOOLS_HERMES2;
    m->swap_in_s = (double)m->sm->image_bytes / 10e9;
    /* the context that applies, said once; a warning only when the file asked for more */
    uint32_t ctx = wk_model_context(m);
    if (c->max_context_set && ctx < c->max_context)
        log_warning("%s:%d: model '%s': max_context %u lowered to %u, the model's context_length",
                    w->cfg->file, c->line, c->name, (unsigned)c->max_context, (unsigned)ctx);
    char tn[16];
    log_info(
        "model '%s': %s %s, %.1f M params, context %u, %.1f MiB in host RAM, loaded in %.0f ms",
        c->name, model_arch_name(m->sm->model->hp.arch), wk_type_name(m->sm->model->wtype, tn),
        m->sm->model->n_params / 1e6, (unsigned)ctx, m->sm->host_bytes / 1048576.0, m->sm->load_ms);
    return m;
}

void wk_model_free(wk_t *w, wk_model_t *m)
{
    if (!m)
        return;
    if (m->rm) {
        wk_pfx_close(m);
        wk_lora_detach(w, m); /* its adapters' units first */
        res_remove(w->res, m->rm);
    }
    if (m->sm)
        store_unload(w->store, m->sm);
    cons_vocab_free(m->cons_vocab);
    free(m->load_error);
    free(m->name);
    free(m);
}

/* Answers the inference socket's `models` requests waiting in the inbox
 * (the loading model shows as 'loading'); everything else waits its turn. */
static void serve_models_while_loading(wk_t *w)
{
    wk_in_t *take = NULL, **tail = &take;
    pthread_mutex_lock(&w->mu);
    wk_in_t **pp = &w->in_head, *last = NULL;
    while (*pp) {
        wk_in_t *in = *pp;
        if (in->kind == IN_REQ && !in->admin && in->req.op == PROTO_OP_MODELS) {
            *pp = in->next;
            in->next = NULL;
            *tail = in;
            tail = &in->next;
        } else {
            last = in;
            pp = &in->next;
        }
    }
    w->in_tail = last;
    pthread_mutex_unlock(&w->mu);
    while (take) {
        wk_in_t *nx = take->next;
        wk_send_ok(w, take->conn, take->req.id, wk_report_models(w, 0));
        proto_req_free(&take->req);
        free(take);
        take = nx;
    }
}

void wk_load_progress(void *ctx, const char *name, size_t done, size_t total)
{
    wk_t *w = ctx;
    wk_beat(w); /* a large load is progress too */
    int decile = total ? (int)(10 * done / total) : 10;
    if (decile > w->load_decile) {
        w->load_decile = decile;
        log_info("loading model '%s': %.0f%% (%.1f of %.1f MiB)", name, 100.0 * done / total,
                 done / 1048576.0, total / 1048576.0);
    }
    serve_models_while_loading(w);
}

/* ------------------------------------------------------------------ admin */

_Static_assert(PROTO_FAULT_STALL == BE_FAULT_MAP_SHORT + 1,
               "the admin fault kinds are the backend's, then stall");

static void admin_fault(wk_t *w, uint64_t conn, const proto_req_t *req)
{
    if (!w->cfg->device.fault_injection) {
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST,
                      "fault injection is off (device.fault_injection, backend sim only)");
        return;
    }
    be_fault_t f = {(be_fault_kind_t)req->fault, req->fault_count ? req->fault_count : 1,
                    req->fault_delay_ms};
    if (req->fault == PROTO_FAULT_STALL) {
        /* the worker's own: a planted stall the latency tests must catch */
        w->stall_left = f.count;
        w->stall_ms = f.delay_ms;
    } else if (req->fault == BE_FAULT_OFF) {
        w->stall_left = 0;
    }
    if (req->fault != PROTO_FAULT_STALL && w->be->inject(w->be->ctx, &f)) {
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "the %s backend cannot inject faults",
                      w->be->name);
        return;
    }
    log_warning("fault injection: %s, next %u operations, delay %u ms",
                proto_fault_name(req->fault), f.count, f.delay_ms);
    wk_send_ok(w, conn, req->id, json_pack("{s:b}", "armed", req->fault != BE_FAULT_OFF));
}

/* Ops that name no model; 1 if req was one of them (and is answered). */
static int admin_global(wk_t *w, uint64_t conn, const proto_req_t *req)
{
    switch (req->op) {
    case PROTO_OP_STATS: wk_send_ok(w, conn, req->id, wk_report_stats(w)); return 1;
    case PROTO_OP_MODELS: wk_send_ok(w, conn, req->id, wk_report_models(w, 1)); return 1;
    case PROTO_OP_DRAIN:
        if (!w->draining) {
            w->draining = 1;
            w->drain_conn = conn;
            w->drain_id = req->id ? json_incref(req->id) : NULL;
        }
        return 1;
    case PROTO_OP_FAULT: admin_fault(w, conn, req); return 1;
    case PROTO_OP_RELOAD: {
        /* the loop owns config files: ask it, it answers */
        wk_out_t *o = calloc(1, sizeof *o);
        if (o) {
            o->kind = WK_OUT_RELOAD;
            o->conn = conn;
            o->id = req->id ? json_incref(req->id) : NULL;
            wk_push_out(w, o);
        }
        return 1;
    }
    default: return 0;
    }
}

static void admin_load(wk_t *w, uint64_t conn, const proto_req_t *req, int mi, double t_recv)
{
    wk_model_t *m = w->models[mi];
    char err[512];
    if (res_fully_resident(w->res, m->rm)) {
        wk_send_ok(w, conn, req->id,
                   json_pack("{s:s, s:s, s:I, s:f}", "model", m->name, "state",
                             wk_state_name(WK_STATE_RESIDENT), "bytes",
                             (json_int_t)m->sm->image_bytes, "swap_ms", 0.0));
        return;
    }
    size_t q = m->cfg.gpu_quota;
    if (q && q < m->sm->image_bytes) {
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST,
                      "model '%s' (%.1f MiB) cannot be resident within its gpu_quota of %.1f MiB",
                      m->name, m->sm->image_bytes / 1048576.0, q / 1048576.0);
        return;
    }
    wk_pagein_begin(w, mi, t_recv, RES_EVICT_ANY);
    int prc =
        res_prefetch_ahead(w->res, m->rm, RES_EVICT_ANY, wk_pagein_window(w, mi), err, sizeof err);
    if (prc) {
        m->paging_since = 0;
        wk_send_error(w, conn, req->id, wk_device_error_code(prc), "%s", err);
        return;
    }
    wk_load_t *l = calloc(1, sizeof *l);
    if (!l)
        return;
    l->model = mi;
    l->conn = conn;
    l->id = req->id ? json_incref(req->id) : NULL;
    l->stream = req->stream;
    l->t0 = t_recv;
    stats_res_t st;
    res_model_stats(w->res, m->rm, &st);
    l->device_errors = st.total_device_errors;
    l->next = w->loads;
    w->loads = l;
}

static void admin_evict(wk_t *w, uint64_t conn, const proto_req_t *req, wk_model_t *m)
{
    if (m->cfg.pinned) {
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "model '%s' is pinned: unpin it first",
                      m->name);
        return;
    }
    stats_res_t a, b;
    res_model_stats(w->res, m->rm, &a);
    if (res_evict(w->res, m->rm, RES_CAUSE_ADMIN, 0) == RES_ERR_BUSY) {
        wk_send_error(w, conn, req->id, PROTO_E_OVERLOADED, "model '%s' has running work", m->name);
        return;
    }
    res_model_stats(w->res, m->rm, &b);
    wk_send_ok(w, conn, req->id,
               json_pack("{s:s, s:I}", "model", m->name, "bytes_evicted",
                         (json_int_t)(b.total_bytes_evicted - a.total_bytes_evicted)));
}

static void admin_pin(wk_t *w, uint64_t conn, const proto_req_t *req, wk_model_t *m)
{
    char err[512];
    cfg_model_t c = m->cfg;
    c.pinned = req->op == PROTO_OP_PIN;
    res_cfg_t rc = wk_res_cfg_of(&c);
    int src = res_set_cfg(w->res, m->rm, &rc, err, sizeof err);
    if (src) {
        wk_send_error(w, conn, req->id,
                      src == RES_ERR_QUOTA ? PROTO_E_BAD_REQUEST : wk_device_error_code(src), "%s",
                      err);
        return;
    }
    m->cfg.pinned = c.pinned;
    wk_send_ok(w, conn, req->id,
               json_pack("{s:s, s:b}", "model", m->name, "pinned", m->cfg.pinned));
}

void wk_admin_op(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv)
{
    if (admin_global(w, conn, req))
        return;
    wk_adapter_t *ad = req->model ? wk_lora_find(w, req->model) : NULL;
    if (ad) { /* it has no pages of its own: it follows its base */
        wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST,
                      "'%s' is an adapter of '%s': load, evict and pin its base", ad->name,
                      ad->cfg.base);
        return;
    }
    int mi = wk_named_model(w, conn, req);
    if (mi < 0)
        return;
    wk_model_t *m = w->models[mi];
    switch (req->op) {
    case PROTO_OP_LOAD: admin_load(w, conn, req, mi, t_recv); break;
    case PROTO_OP_EVICT: admin_evict(w, conn, req, m); break;
    case PROTO_OP_PIN:
    case PROTO_OP_UNPIN: admin_pin(w, conn, req, m); break;
    default: wk_send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "op not accepted here"); break;
    }
}

/* Device failures an admin load retries through before it gives up. */
#define WK_LOAD_RETRIES 3

void wk_admin_poll_loads(wk_t *w)
{
    for (wk_load_t **pp = &w->loads; *pp;) {
        wk_load_t *l = *pp;
        wk_model_t *m = l->model < w->n_models ? w->models[l->model] : NULL;
        if (!m || !m->rm) {
            wk_send_error(w, l->conn, l->id, PROTO_E_UNKNOWN_MODEL, "the model went away");
        } else if (res_fully_resident(w->res, m->rm)) {
            double ms = (wk_now() - l->t0) * 1e3;
            wk_send_ok(w, l->conn, l->id,
                       json_pack("{s:s, s:s, s:I, s:f}", "model", m->name, "state",
                                 wk_state_name(WK_STATE_RESIDENT), "bytes",
                                 (json_int_t)m->sm->image_bytes, "swap_ms", ms));
        } else {
            stats_res_t st;
            res_model_stats(w->res, m->rm, &st);
            if (l->stream && st.curr_resident_bytes != l->last_bytes) {
                l->last_bytes = st.curr_resident_bytes;
                wk_event_t ev = {.kind = WK_EVENT_PROGRESS,
                                 .conn = l->conn,
                                 .id = l->id ? json_deep_copy(l->id) : NULL,
                                 .model = strdup(m->name),
                                 .bytes = l->last_bytes,
                                 .total = m->sm->image_bytes};
                if (ev.model)
                    wk_emit(w, &ev);
                else
                    wk_event_clear(&ev);
            }
            /* not all queued (pool held by others, or a copy failed and
             * was dropped): try again, a few times for device failures */
            char err[256];
            const char *why = NULL;
            if (st.total_device_errors - l->device_errors >= WK_LOAD_RETRIES)
                res_last_error(m->rm, &why);
            else if (res_prefetch_ahead(w->res, m->rm, RES_EVICT_ANY, wk_pagein_window(w, l->model),
                                        err, sizeof err))
                res_last_error(m->rm, &why);
            else if (!m->paging_since && res_inflight(m->rm) > 0)
                wk_pagein_begin(w, l->model, wk_now(),
                                RES_EVICT_ANY); /* requests now wait for it */
            if (!why) {
                pp = &l->next;
                continue;
            }
            wk_send_error(w, l->conn, l->id, PROTO_E_INTERNAL, "%s", *why ? why : err);
        }
        *pp = l->next;
        json_decref(l->id);
        free(l);
    }
}

/* ------------------------------------------------------------------ reload */

void wk_apply_reload(wk_t *w, const cfg_t *next)
{
    w->cfg = next;
    store_set_budget(w->store, next->host.memory);
    res_kv_host_budget(w->res, wk_kv_host_budget(w)); /* a lower host.kv_cache applies now */
    sched_cfg_t sc = wk_sched_cfg_of(next);
    sched_set_cfg(w->sched, &sc);
    res_set_max_stall(w->res, next->scheduler.max_stall_ms / 1e3);
    /* removed models: drop queued requests (cancelled), remove when idle */
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m)
            continue;
        const cfg_model_t *c = cfg_find_model(next, m->name);
        if (c && c->adapter)
            c = NULL; /* now an adapter: the model goes */
        if (!c) {
            m->removing = 1;
            for (sched_item_t *it = sched_peek(w->sched, i), *nx; it; it = nx) {
                nx = it->next;
                wk_seq_t *sq = it->user;
                m->svc.total_cancelled++;
                wk_send_error(w, sq->conn, sq->id, PROTO_E_CANCELLED,
                              "model '%s' was removed by a reload before this request started",
                              m->name);
                sched_remove(w->sched, it);
                wk_seq_free(w, sq);
            }
            continue;
        }
        if (!m->sm) {
            /* it failed to load: try again (the file may have been fixed) */
            wk_model_free(w, m);
            w->models[i] = NULL; /* the report may run while it loads */
            w->models[i] = wk_model_load(w, c);
            continue;
        }
        char what[256];
        if (cfg_model_reloads(&m->cfg, c, what, sizeof what)) {
            /* it loads again from its file (below, as an added model); this one
             * finishes what it holds, queued and running, and goes when idle */
            m->removing = 1;
            continue;
        }
        m->cfg = *c;
        if (m->rm) {
            res_cfg_t rc = wk_res_cfg_of(c);
            char err[256];
            if (res_set_cfg(w->res, m->rm, &rc, err, sizeof err) == RES_ERR_QUOTA) {
                log_warning("reload: %s; model '%s' stays unpinned", err, m->name);
                m->cfg.pinned = rc.pinned = 0;
                res_set_cfg(w->res, m->rm, &rc, err, sizeof err);
            }
        }
    }
    for (size_t j = 0; j < next->n_models && w->n_models < WK_MAX_MODELS; j++) {
        if (!next->models[j].adapter && wk_find_model(w, next->models[j].name) < 0) {
            wk_model_t *nm = wk_model_load(w, &next->models[j]); /* listed as loading meanwhile */
            w->models[w->n_models++] = nm;
        }
    }
    sched_resize(w->sched, w->n_models);
    /* the old cfg's strings are no longer referenced: point names at ours */
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i] && !w->models[i]->removing) {
            const cfg_model_t *c = cfg_find_model(next, w->models[i]->name);
            if (c)
                w->models[i]->cfg = *c;
        }
    /* adapters added, removed or changed; those of a base loaded again follow it */
    wk_lora_sync(w, next);
}

void wk_reap_removed(wk_t *w)
{
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (m && m->removing && m->n_active == 0 && sched_queued(w->sched, i) == 0) {
            log_info("model '%s' removed", m->name);
            wk_model_free(w, m);
            w->models[i] = NULL;
            w->lora_dirty = 1; /* its adapters let go of it */
        }
    }
    if (w->lora_dirty)
        wk_lora_sync(w, NULL);
}

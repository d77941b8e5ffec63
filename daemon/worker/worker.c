/* worker: the worker's core, which every other worker file may call and which calls none of them: the clock and heartbeat, the outbox and its sink (wk_emit), model lookup and the settings derived from the config. */
#include "worker_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double wk_now(void)
{
    return util_now_s();
}

/* ------------------------------------------------------------------ outbox */

void wk_out_free(wk_out_t *o)
{
    if (!o)
        return;
    wk_event_clear(&o->ev);
    json_decref(o->id);
    free(o);
}

void wk_push_out(wk_t *w, wk_out_t *o)
{
    pthread_mutex_lock(&w->mu);
    if (w->out_tail)
        w->out_tail->next = o;
    else
        w->out_head = o;
    w->out_tail = o;
    pthread_mutex_unlock(&w->mu);
    if (w->notify)
        w->notify(w->notify_ctx);
}

void wk_emit(wk_t *w, wk_event_t *ev)
{
    wk_out_t *o = calloc(1, sizeof *o);
    if (!o) {
        wk_event_clear(ev);
        return;
    }
    o->kind = WK_OUT_EVENT;
    o->ev = *ev;
    memset(ev, 0, sizeof *ev);
    wk_push_out(w, o);
}

/* An ERROR event of code for conn (retry_ms: try again after, 0 = not said). */
static void send_error_v(wk_t *w, uint64_t conn, const json_t *id, proto_err_t code,
                         uint32_t retry_ms, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    wk_event_t ev = {.kind = WK_EVENT_ERROR,
                     .conn = conn,
                     .id = id ? json_deep_copy(id) : NULL,
                     .code = code,
                     .message = strdup(msg),
                     .retry_ms = retry_ms};
    wk_emit(w, &ev);
}

void wk_send_error(wk_t *w, uint64_t conn, const json_t *id, proto_err_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_error_v(w, conn, id, code, 0, fmt, ap);
    va_end(ap);
}

void wk_send_retry(wk_t *w, uint64_t conn, const json_t *id, uint32_t retry_ms, const char *fmt,
                   ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_error_v(w, conn, id, PROTO_E_OVERLOADED, retry_ms, fmt, ap);
    va_end(ap);
}

void wk_send_ok(wk_t *w, uint64_t conn, const json_t *id, json_t *body)
{
    if (body && !json_is_object(body)) { /* no answer to give (the encoder's rule) */
        json_decref(body);
        return;
    }
    wk_event_t ev = {
        .kind = WK_EVENT_RESULT, .conn = conn, .id = id ? json_deep_copy(id) : NULL, .body = body};
    wk_emit(w, &ev);
}

wk_out_t *wk_take(wk_t *w)
{
    pthread_mutex_lock(&w->mu);
    wk_out_t *o = w->out_head;
    w->out_head = w->out_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    return o;
}

/* ------------------------------------------------------------------ models */

static const char *const state_names[WK_STATE_COUNT] = {
    [WK_STATE_LOADING] = "loading",   [WK_STATE_HOST] = "host",     [WK_STATE_PARTIAL] = "partial",
    [WK_STATE_RESIDENT] = "resident", [WK_STATE_FAILED] = "failed",
};

const char *wk_state_name(wk_state_t s)
{
    return (unsigned)s < WK_STATE_COUNT ? state_names[s] : NULL;
}

const char *wk_type_name(uint32_t t, char *buf)
{
    const char *n = gguf_ttype_name(t);
    size_t i = 0;
    for (; n[i] && i < 15; i++)
        buf[i] = (char)tolower((unsigned char)n[i]);
    buf[i] = 0;
    return buf;
}

int wk_find_model(const wk_t *w, const char *name)
{
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i] && !w->models[i]->removing && strcmp(w->models[i]->name, name) == 0)
            return i;
    return -1;
}

/* Positions a request of this model may use: max_context, at most what the
 * model was trained for. */
uint32_t wk_model_context(const wk_model_t *m)
{
    return cfg_model_context(&m->cfg, m->sm->model->hp.n_ctx_train);
}

res_cfg_t wk_res_cfg_of(const cfg_model_t *c)
{
    return (res_cfg_t){.gpu_quota = c->gpu_quota,
                       .pinned = c->pinned,
                       .priority = c->priority,
                       .kv_type = c->kv_type == CFG_KV_F32 ? KV_TYPE_F32 : KV_TYPE_F16,
                       .kv_reserve = c->kv_cache};
}

void wk_beat(wk_t *w)
{
    atomic_store(&w->beat_ns, (uint64_t)(wk_now() * 1e9));
}

sched_cfg_t wk_sched_cfg_of(const cfg_t *c)
{
    return (sched_cfg_t){
        .policy =
            c->scheduler.policy == CFG_POLICY_FIFO ? SCHED_POLICY_FIFO : SCHED_POLICY_SWAP_AWARE,
        .max_wait_s = c->scheduler.max_wait_ms / 1e3,
        .max_stall_s = c->scheduler.max_stall_ms / 1e3,
        .quantum = c->scheduler.quantum,
        .min_quantum_s = 0.05,
        .queue_limit = c->scheduler.queue_limit,
        .max_queued = c->scheduler.max_queued,
    };
}

/* ------------------------------------------------------------------ requests */

int wk_allowed(const proto_req_t *req, const char *name)
{
    if (!req->allow)
        return 1;
    for (size_t i = 0; name && i < req->n_allow; i++)
        if (strcmp(req->allow[i], name) == 0)
            return 1;
    return 0;
}

/* A model the caller's key may not use is answered exactly as one that does
 * not exist, and the list names only the models it may use. */
int wk_named_model(wk_t *w, uint64_t conn, const proto_req_t *req)
{
    int mi = req->model && wk_allowed(req, req->model) ? wk_find_model(w, req->model) : -1;
    if (mi < 0) {
        char names[1024] = "";
        for (int i = 0; i < w->n_models; i++) {
            if (!w->models[i] || w->models[i]->removing || !wk_allowed(req, w->models[i]->name))
                continue;
            if (names[0])
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, w->models[i]->name, sizeof names - strlen(names) - 1);
        }
        for (int i = 0; i < w->n_adapters; i++) { /* and the adapters */
            const wk_adapter_t *a = w->adapters[i];
            if (!a || a->removing || !wk_allowed(req, a->name))
                continue;
            if (names[0])
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, a->name, sizeof names - strlen(names) - 1);
        }
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "no model '%s' (configured: %s)",
                      req->model ? req->model : "", names);
        return -1;
    }
    wk_model_t *m = w->models[mi];
    if (!m->sm) {
        wk_send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "model '%s' failed to load: %s",
                      m->name, m->load_error ? m->load_error : "?");
        return -1;
    }
    return mi;
}

/* The answer for requests a device failure (RES_ERR_*) ended: memory that
 * ran out is worth retrying, anything else is the device's fault. */
proto_err_t wk_device_error_code(int res_err)
{
    return res_err == RES_ERR_NOMEM || res_err == RES_ERR_NOSPACE ? PROTO_E_OVERLOADED
                                                                  : PROTO_E_INTERNAL;
}

/* ------------------------------------------------------------------ counts */

uint32_t wk_active_total(const wk_t *w)
{
    uint32_t n = 0;
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i])
            n += w->models[i]->n_active;
    return n;
}

uint32_t wk_in_flight(const wk_t *w)
{
    return sched_queued_total(w->sched) + wk_active_total(w);
}

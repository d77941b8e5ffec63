/* worker_deadline: first-token deadlines (docs/overload.md): each request's first-token time predicted from its model's page-in, the work queued ahead of it and its own prefill; one predicted to miss is refused at once, on arrival or while queued, with when to try again. */
#include <math.h>

#include "worker_int.h"

/* retry_after_ms bounds: never "now", never more than an hour */
#define DL_RETRY_MIN_MS 100u
#define DL_RETRY_MAX_MS 3600000u

void wk_dl_start(wk_seq_t *s, const wk_model_t *m)
{
    uint64_t ms = s->req.deadline_ms ? s->req.deadline_ms : m->cfg.deadline_ms;
    s->t_deadline = ms ? s->t_arrival + (double)ms / 1e3 : 0;
    s->dl_predicted = -1;
}

/* Seconds until model m can run a pass (res_pagein_eta): one figure for all its queue. */
static double wait_of(wk_t *w, const wk_model_t *m)
{
    return res_pagein_eta(w->res, m->rm, m->pass.pass_s);
}

/* The wait of s: its model's (wait_of), or its adapter's copy where that lands later
 * (res_att_eta: an adapter not on the device is paged in as s is admitted, behind its model's
 * page-in, and s sits out the passes until its copy lands). */
static double wait_for(wk_t *w, const wk_seq_t *s, double model_wait)
{
    const wk_adapter_t *a = s->adapter;
    double aw = a && a->att ? res_att_eta(w->res, a->att) : 0;
    return aw > model_wait ? aw : model_wait;
}

/* Predicted seconds from now to s's first token with ahead requests of its model queued before
 * it and wait_s until the model can run (sched_first_token_s): that wait, the admission gaps,
 * its own prefill pass. */
static double predict(const wk_model_t *m, const wk_seq_t *s, uint32_t ahead, double wait_s)
{
    uint32_t fresh = s->n_prompt > s->pfx_hint ? s->n_prompt - s->pfx_hint : 1;
    return sched_first_token_s(&m->gap, ahead, wait_s, pass_time_for(&m->pass, fresh, 1));
}

/* When s, sent again, is predicted to get its first token within half its deadline: the
 * prediction for a request joining the back of its model's queue now, less that half; at least
 * DL_RETRY_MIN_MS. (The predicted miss alone sent retries back just at the deadline's edge.) */
static uint32_t retry_ms_of(wk_t *w, const wk_seq_t *s, double wait_s)
{
    const wk_model_t *m = w->models[s->model];
    double tail = predict(m, s, sched_queued(w->sched, s->model), wait_s);
    double ms = ceil((tail - (s->t_deadline - s->t_arrival) / 2) * 1e3);
    if (!(ms >= DL_RETRY_MIN_MS))
        return DL_RETRY_MIN_MS;
    return ms > DL_RETRY_MAX_MS ? DL_RETRY_MAX_MS : (uint32_t)ms;
}

int wk_dl_arrival(wk_t *w, wk_seq_t *s)
{
    if (!s->t_deadline)
        return 0;
    wk_model_t *m = w->models[s->model];
    double now = wk_now(), wait = wait_for(w, s, wait_of(w, m));
    double p = predict(m, s, sched_queued(w->sched, s->model), wait);
    s->dl_predicted = now - s->t_arrival + p;
    double left = s->t_deadline - now;
    if (p <= left)
        return 0;
    if (m->cfg.deadline_keep) { /* served late rather than refused: the deadline goes */
        m->svc.total_deadline_kept++;
        s->t_deadline = 0;
        return 0;
    }
    m->svc.total_deadline_refused++;
    m->svc.total_batch_refused += s->req.batch != 0;
    wk_send_retry(w, s->conn, s->id, retry_ms_of(w, s, wait),
                  "model '%s' cannot give a first token within %.0f ms: predicted %.0f ms (%u "
                  "requests queued ahead)",
                  m->name, (s->t_deadline - s->t_arrival) * 1e3, s->dl_predicted * 1e3,
                  sched_queued(w->sched, s->model));
    return 1;
}

/* Refuses the queued requests of model mi predicted to miss their deadlines now. */
static void sweep_model(wk_t *w, int mi, double now)
{
    wk_model_t *m = w->models[mi];
    uint32_t ahead = 0;
    double wait = wait_of(w, m);
    sched_item_t *it = sched_peek(w->sched, mi);
    while (it) {
        sched_item_t *next = it->next;
        wk_seq_t *s = it->user;
        double ws = s->t_deadline ? wait_for(w, s, wait) : 0;
        double p = s->t_deadline ? predict(m, s, ahead, ws) : 0;
        double left = s->t_deadline - now;
        if (s->t_deadline && p > left && m->cfg.deadline_keep) {
            m->svc.total_deadline_kept += s->index == 0;
            s->t_deadline = 0;
        }
        if (!s->t_deadline || p <= left) {
            ahead++;
            it = next;
            continue;
        }
        m->svc.total_deadline_dropped++;
        m->svc.total_batch_refused += s->req.batch != 0 && s->index == 0;
        char msg[256];
        snprintf(msg, sizeof msg,
                 "model '%s' can no longer give a first token within %.0f ms: %.0f ms queued, "
                 "%.0f ms more predicted",
                 m->name, (s->t_deadline - s->t_arrival) * 1e3, (now - s->t_arrival) * 1e3,
                 p * 1e3);
        wk_seq_refuse(w, s, retry_ms_of(w, s, ws), msg);
        it = next;
    }
}

void wk_dl_sweep(wk_t *w, double now)
{
    for (int mi = 0; mi < w->n_models; mi++)
        if (w->models[mi] && sched_queued(w->sched, mi))
            sweep_model(w, mi, now);
}

void wk_dl_admitted(wk_t *w, wk_model_t *m, int mi, double now)
{
    sched_gap_note(&m->gap, now, sched_queued(w->sched, mi) > 0);
}

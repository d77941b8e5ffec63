/* worker_step: one scheduling round on the worker: the scheduler's view of every model, then one model's step in named phases (acquire, admit, grow, run, account, emit). */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ views */

uint32_t wk_active_total(const wk_t *w)
{
    uint32_t n = 0;
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i])
            n += w->models[i]->n_active;
    return n;
}

/* Whether the next queued request of model mi would get its KV cache now. */
static int can_admit(wk_t *w, int mi, uint32_t n_active_all)
{
    sched_item_t *it = sched_peek(w->sched, mi);
    if (!it)
        return 0;
    wk_model_t *m = w->models[mi];
    if (w->be->zero_copy || n_active_all == 0)
        return 1; /* nothing to wait for: admission decides */
    const wk_seq_t *s = it->user;
    uint32_t n_ctx = s->n_prompt + s->max_tokens;
    return res_kv_bytes_for(w->res, &m->sm->model->hp, n_ctx) <= res_kv_available(w->res);
}

static void build_views(wk_t *w, sched_model_view_t *views)
{
    uint32_t n_active_all = wk_active_total(w);
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        views[i] = (sched_model_view_t){0};
        if (!m || !m->sm)
            continue;
        views[i].resident = res_fully_resident(w->res, m->rm);
        views[i].n_active = m->n_active;
        views[i].max_batch = m->cfg.max_batch ? m->cfg.max_batch : 1;
        views[i].swap_in_s = m->swap_in_s;
        views[i].priority = m->cfg.priority;
        views[i].can_admit = can_admit(w, i, n_active_all);
    }
}

/* ------------------------------------------------------------------ step phases */

typedef struct timed_hooks {
    fwd_hooks_t inner;
    wk_t *w;
    double waited; /* seconds blocked in waits */
} timed_hooks_t;

static int timed_wait(void *ctx, uint32_t seg)
{
    timed_hooks_t *h = ctx;
    double t0 = wk_now();
    wk_beat(h->w); /* a long pass still shows progress segment by segment */
    int rc = h->inner.wait(h->inner.ctx, seg);
    h->waited += wk_now() - t0;
    wk_beat(h->w);
    return rc;
}

/* The model could not be paged in: what was to run now fails (the active
 * sequences and those this pass would admit); the rest stay queued for a
 * later pass, and other models go on. */
static void step_acquire_failed(wk_t *w, int mi, uint32_t admit, int arc, const char *err)
{
    wk_model_t *m = w->models[mi];
    proto_err_t code = wk_device_error_code(arc);
    for (wk_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next_active;
        wk_seq_fail(w, s, code, err);
    }
    for (uint32_t k = 0; k < admit; k++) {
        sched_item_t *it = sched_peek(w->sched, mi);
        if (!it)
            break;
        wk_seq_fail(w, it->user, code, err);
    }
}

/* Admit: a KV cache each; stop at the first that does not fit now. Returns
 * the admitted sequences, linked by next_active. */
static wk_seq_t *step_admit(wk_t *w, int mi, uint32_t admit)
{
    wk_model_t *m = w->models[mi];
    char err[512];
    uint32_t ctx = wk_model_context(m);
    wk_seq_t *fresh = NULL, **fresh_tail = &fresh;
    for (uint32_t k = 0; k < admit; k++) {
        sched_item_t *it = sched_peek(w->sched, mi);
        if (!it)
            break;
        wk_seq_t *s = it->user;
        uint32_t n_ctx = s->n_prompt + s->max_tokens;
        if (n_ctx > ctx)
            n_ctx = ctx;
        /* the whole cache is mapped at admission, so a running sequence
         * never runs out of KV memory mid-stream */
        if (res_kv_new(w->res, m->rm, n_ctx, &s->kv, err, sizeof err) ||
            res_kv_ensure(w->res, s->kv, n_ctx, err, sizeof err)) {
            if (s->kv)
                res_kv_free(w->res, s->kv);
            s->kv = NULL;
            if (wk_active_total(w) == 0 && !fresh) {
                /* nothing else holds KV memory: this request can never fit */
                sched_pop(w->sched, mi);
                wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
                continue;
            }
            break;
        }
        sched_pop(w->sched, mi);
        s->state = SEQ_ACTIVE;
        s->t_admit = wk_now();
        *fresh_tail = s;
        fresh_tail = &s->next_active;
    }
    return fresh;
}

/* Grow the active caches by one position, then let the fresh ones join;
 * returns how many sequences the pass runs. */
static uint32_t step_join(wk_t *w, wk_model_t *m, wk_seq_t *fresh)
{
    char err[512];
    for (wk_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next_active;
        if (res_kv_ensure(w->res, s->kv, s->kv->n_past + 1, err, sizeof err))
            wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
    }
    if (fresh) {
        wk_seq_t **tail = &fresh;
        while (*tail)
            tail = &(*tail)->next_active;
        *tail = m->active;
        m->active = fresh;
    }
    uint32_t n = 0;
    for (wk_seq_t *s = m->active; s; s = s->next_active)
        n++;
    m->n_active = n;
    return n;
}

/* One pass's buffers: the sequences in order, their inputs and logits. */
typedef struct step_pass {
    uint32_t n;
    fwd_seq_t *fs;
    wk_seq_t **order;
    float *logits;
    timed_hooks_t th;
    stats_res_t before;
    int rc;
    char err[512];
} step_pass_t;

static void pass_free(step_pass_t *p)
{
    free(p->fs);
    free(p->order);
    free(p->logits);
}

/* Run the forward pass (the model is acquired); 0 or -1 out of memory. */
static int step_run(wk_t *w, wk_model_t *m, step_pass_t *p)
{
    const model_t *mod = m->sm->model;
    p->fs = calloc(p->n, sizeof *p->fs);
    p->order = calloc(p->n, sizeof *p->order);
    p->logits = malloc((size_t)p->n * mod->hp.n_vocab * sizeof(float));
    if (!p->fs || !p->order || !p->logits)
        return -1;
    uint32_t i = 0;
    for (wk_seq_t *s = m->active; s; s = s->next_active, i++) {
        p->order[i] = s;
        int prefill = s->kv->n_past == 0;
        p->fs[i] = (fwd_seq_t){s->kv, prefill ? s->prompt : &s->last, prefill ? s->n_prompt : 1,
                               p->logits + (size_t)i * mod->hp.n_vocab};
        if (prefill)
            m->svc.total_prompt_tokens += s->n_prompt;
    }
    p->th = (timed_hooks_t){.inner = res_hooks(m->rm), .w = w};
    fwd_hooks_t hooks = {.wait = timed_wait, .ctx = &p->th};
    p->rc = fwd_run(w->fwd, &mod->hp, res_weights(m->rm), p->fs, (int)p->n, &hooks, p->err,
                    sizeof p->err);
    return 0;
}

/* After the pass: the measured swap-in time and the swap histogram; 1 if
 * the pass paged something in. */
static int step_account(wk_t *w, wk_model_t *m, const step_pass_t *p)
{
    stats_res_t after;
    res_model_stats(w->res, m->rm, &after);
    const stats_res_t *b = &p->before;
    int paged = after.total_bytes_in != b->total_bytes_in;
    if (paged && res_fully_resident(w->res, m->rm) && after.total_copy_ns > b->total_copy_ns)
        m->swap_in_s = (double)m->sm->image_bytes / (double)(after.total_bytes_in -
                       b->total_bytes_in) * (after.total_copy_ns - b->total_copy_ns) / 1e9;
    if (paged)
        stats_hist_add(&m->swap, p->th.waited * 1e3);
    m->svc.total_steps++;
    return paged;
}

/* Each sequence of the pass: its error, or its token sampled and streamed. */
static void step_emit(wk_t *w, wk_model_t *m, step_pass_t *p, int paged)
{
    double t = wk_now();
    for (uint32_t i = 0; i < p->n; i++) {
        wk_seq_t *s = p->order[i];
        if (p->rc) {
            const char *why;
            int rerr = res_last_error(m->rm, &why);
            if (rerr && i == 0)
                snprintf(p->err, sizeof p->err, "%s", why);
            wk_seq_fail(w, s, p->rc == FWD_ERR_CONTEXT ? PROTO_E_CONTEXT_OVERFLOW
                        : rerr ? wk_device_error_code(rerr) : PROTO_E_INTERNAL, p->err);
            continue;
        }
        s->swap_s += p->th.waited;
        if (s->n_gen == 0 && paged) {
            s->swapped = 1;
            m->svc.total_swapped_requests++;
        }
        wk_seq_token(w, s, p->fs[i].logits, t);
    }
}

/* One forward pass for a model: admit new sequences, run them with the
 * active ones, sample, stream, finish. */
static void step(wk_t *w, int mi, uint32_t admit)
{
    wk_model_t *m = w->models[mi];
    char err[512];
    step_pass_t p = {0};
    res_model_stats(w->res, m->rm, &p.before);
    int arc = res_acquire(w->res, m->rm, err, sizeof err);
    if (arc) {
        step_acquire_failed(w, mi, admit, arc, err);
        return;
    }
    wk_seq_t *fresh = step_admit(w, mi, admit);
    p.n = step_join(w, m, fresh);
    if (p.n == 0 || step_run(w, m, &p)) {
        pass_free(&p);
        res_release(w->res, m->rm);
        return;
    }
    res_release(w->res, m->rm);
    int paged = step_account(w, m, &p);
    step_emit(w, m, &p, paged);
    pass_free(&p);
}

/* ------------------------------------------------------------------ round */

void wk_round(wk_t *w)
{
    sched_model_view_t views[WK_MAX_MODELS];
    build_views(w, views);
    sched_plan_t plan;
    sched_next(w->sched, wk_now(), views, &plan);
    if (plan.model >= 0)
        step(w, plan.model, plan.admit);
    if (plan.prefetch >= 0 && w->models[plan.prefetch] && w->models[plan.prefetch]->rm) {
        char err[256];
        res_prefetch(w->res, w->models[plan.prefetch]->rm, 0, err, sizeof err);
    }
}

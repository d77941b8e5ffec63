/* worker_step: one scheduling round on the worker: the scheduler's view of every model, then one model's step in named phases (acquire, admit, grow, run, account, emit). */
#include "worker_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ views */

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
    /* the cache grows page by page: admission needs the prompt's pages */
    return res_kv_bytes_model(w->res, m->rm, s->n_prompt + 1) <=
           res_kv_available_for(w->res, m->rm);
}

/* Whether s's adapter (if it names one) is on the device with its copy landed. */
static int adapter_ready(wk_t *w, const wk_seq_t *s)
{
    const wk_adapter_t *a = s->adapter;
    return !a || (a->att && res_att_state(w->res, a->att) == RES_SEG_RESIDENT);
}

/* The compute of mi's next pass: its running sequences (one token each, or
 * a parked one's prompt and generated ids) and the queued requests it has
 * room for (their prompts; not those whose adapter is not on the device: its
 * copy is queued as they are admitted, behind the model's, and they sit the
 * pass out). For a model paging in, res_ready_in's compute: a first pass
 * that prefills starts while its last copies land. */
static double next_pass_s(wk_t *w, int mi)
{
    wk_model_t *m = w->models[mi];
    uint32_t toks = 0, nseq = 0, mb = m->cfg.max_batch ? m->cfg.max_batch : 1;
    for (const wk_seq_t *s = m->active; s; s = s->next_active, nseq++)
        toks += s->parked ? s->n_prompt + s->n_gen : 1;
    for (sched_item_t *it = sched_peek(w->sched, mi); it && nseq < mb; it = it->next, nseq++) {
        const wk_seq_t *q = it->user; /* a cached prefix is not prefilled */
        if (adapter_ready(w, q))
            toks += q->n_prompt - (q->pfx_hint < q->n_prompt ? q->pfx_hint : 0);
    }
    return pass_time_for(&m->pass, toks, nseq);
}

/* Distinct adapters queued_need tells apart (beyond, an adapter may count twice: the safe side). */
#define QUEUED_ADAPTERS_MAX 32

/* The pages of the adapters the first n queued requests from it name that are not on the device
 * (res_att_missing), each adapter once: their admission maps them before their caches. */
static size_t queued_adapters(wk_t *w, sched_item_t *it, uint32_t n)
{
    const wk_adapter_t *seen[QUEUED_ADAPTERS_MAX];
    int n_seen = 0;
    size_t bytes = 0;
    for (uint32_t k = 0; it && k < n; it = it->next, k++) {
        const wk_seq_t *s = it->user;
        const wk_adapter_t *a = s->adapter;
        int dup = 0;
        for (int j = 0; a && j < n_seen && !dup; j++)
            dup = seen[j] == a;
        if (!a || !a->att || dup)
            continue;
        if (n_seen < QUEUED_ADAPTERS_MAX)
            seen[n_seen++] = a;
        bytes += res_att_missing(w->res, a->att);
    }
    return bytes;
}

/* The pool bytes the requests model i could admit take as they are admitted: their KV pages
 * (prompt + 1 each: caches grow as sequences advance) and their adapters' pages not on the
 * device (queued_adapters). */
static size_t queued_need(wk_t *w, const sched_model_view_t *views, int i)
{
    wk_model_t *m = w->models[i];
    sched_item_t *it = m && m->sm ? sched_peek(w->sched, i) : NULL;
    if (!it)
        return 0;
    uint32_t q = sched_queued(w->sched, i), mb = views[i].max_batch;
    uint32_t room = m->n_active < mb ? mb - m->n_active : 0, n = q < room ? q : room;
    const wk_seq_t *s = it->user;
    return (size_t)n * res_kv_bytes_model(w->res, m->rm, s->n_prompt + 1) +
           queued_adapters(w, it, n);
}

/* views[].fits of the cold models with work (the scheduler drains a busy
 * model rather than preempt one when a page-in does not fit, for at most
 * max_wait): their page-in against the free pages and those of models nobody
 * has work for, beside the KV caches (and the adapters not on the device) of
 * the requests the models on the device (or coming) could admit, and its
 * own: other cold models' requests
 * take no KV until their own page-in (counted, they kept every page-in
 * "not fitting" whenever a dozen models had queues: 12 models at 60% load,
 * the most popular drained for 30 s) */
static void fill_fits(wk_t *w, sched_model_view_t *views)
{
    if (w->be->zero_copy)
        return;                                          /* cpu: nothing pages in */
    size_t reserve = 0, spare = res_spare_pages(w->res); /* once a round: a walk over every model */
    for (int i = 0; i < w->n_models; i++)
        if (views[i].resident || views[i].loading)
            reserve += queued_need(w, views, i);
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (m && m->sm && !views[i].resident && !views[i].loading &&
            (m->n_active > 0 || sched_queued(w->sched, i) > 0))
            views[i].fits =
                res_pagein_fits(w->res, m->rm, spare, reserve + queued_need(w, views, i));
    }
}

/* Seconds until model m, with running sequences and no page-in under way,
 * has gone a part of max_stall (RES_STALL_PARTS) without a pass: then it is
 * stepped even if it lost pages (<= 0: due now); INFINITY if it never comes
 * due (no sequences running, paging in, or no max_stall). */
static double stall_part_left(const wk_t *w, const wk_model_t *m, double now)
{
    double part = (double)w->cfg->scheduler.max_stall_ms / 1e3 / RES_STALL_PARTS;
    if (part <= 0 || m->paging_since || m->n_active == 0)
        return INFINITY;
    return m->last_step + part - now;
}

/* What the scheduler sees of each model. busy: the model whose pass waits
 * for a copy while others step aside (-1 = none): it counts as loading, and
 * only models that run without waiting count as resident. */
static void build_views(wk_t *w, sched_model_view_t *views, int busy)
{
    uint32_t n_active_all = wk_active_total(w);
    double now = wk_now();
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        views[i] = (sched_model_view_t){0};
        if (!m || !m->sm)
            continue;
        /* runnable without a page-in: on the device, or its last copies
         * covered. A model with running sequences that lost pages (the last
         * resort: what comes back in a part of max_stall, RES_STALL_PARTS)
         * runs once that part passed without a step, even while another
         * model pages in, or, if another model took them, while that
         * model's pass waits for copies (step_aside): its pass takes them
         * back at once (others step while they land) */
        int ready =
            !m->paging_since && i != busy && res_ready_in(w->res, m->rm, next_pass_s(w, i)) == 0;
        int due = stall_part_left(w, m, now) <= 0;
        views[i].resident = ready || (due && (busy < 0 || (i != busy && res_lost_pages(m->rm))));
        views[i].n_active = m->n_active;
        views[i].max_batch = m->cfg.max_batch ? m->cfg.max_batch : 1;
        views[i].swap_in_s = m->swap_in_s;
        views[i].priority = m->cfg.priority;
        views[i].can_admit = can_admit(w, i, n_active_all);
        views[i].loading = m->paging_since > 0 || i == busy;
        views[i].queued = m->paging_since > 0 && i != busy && m->paging_queued;
        res_set_wanted(m->rm, views[i].n_active > 0 || sched_queued(w->sched, i) > 0);
        views[i].last_step = m->last_step;
        for (wk_seq_t *q = m->active; q; q = q->next_active) {
            views[i].n_active_batch += q->req.batch != 0;
            uint32_t left = sched_passes_left(w->sched, i, q->n_gen, q->max_tokens, m->n_active);
            if (left > views[i].steps_left)
                views[i].steps_left = left;
            left = sched_passes_left(w->sched, i, q->n_gen, q->max_tokens, 1);
            if (!views[i].steps_min || left < views[i].steps_min)
                views[i].steps_min = left;
        }
        views[i].streams = res_streams(m->rm);
    }
    fill_fits(w, views);
}

/* ------------------------------------------------------------------ step phases */

typedef struct timed_hooks {
    fwd_hooks_t inner;
    wk_t *w;
    int mi;        /* the model whose pass this is */
    int streams;   /* the pass began before its copies were covered (it streams, or takes
                      back pages it lost): its waits let others step whatever they take */
    double waited; /* seconds blocked in waits (and stepping aside) */
} timed_hooks_t;

static int step(wk_t *w, int mi, uint32_t admit);

/* Seconds until the soonest model other than busy whose running sequences
 * lost pages to another model comes due for a pass (build_views: a part of
 * max_stall without one); INFINITY if none. */
static double stall_due_in(wk_t *w, int busy, double now)
{
    double due = INFINITY;
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (i == busy || !m || !m->sm || !res_lost_pages(m->rm))
            continue;
        double in = stall_part_left(w, m, now);
        due = in < due ? in : due;
    }
    return due;
}

/* While the pass of model busy waits for segment seg's copy (it streams
 * through its quota or a full pool, or gets back pages it lost), the worker
 * steps the other models that can run now, one level deep (their own waits
 * just block). A streaming pass (every step of busy waits for copies) lets
 * them step as long as the copy has not landed, busy resuming at most one
 * of their steps late; a pass whose copies were covered by its compute (a
 * page-in done in the background) only for steps that end before the copy
 * lands, so a swapped-in model's first token is not put off. */
static void step_aside(wk_t *w, int busy, uint32_t seg, int streams)
{
    res_model_t *rm = w->models[busy]->rm;
    w->aside = 1;
    for (;;) {
        double left = res_seg_lands_in(w->res, rm, seg);
        if (!(left > 0) || isinf(left))
            break;
        sched_model_view_t views[WK_MAX_MODELS];
        build_views(w, views, busy);
        sched_plan_t plan;
        sched_next(w->sched, wk_now(), views, &plan);
        if (plan.model < 0 || !views[plan.model].resident) {
            /* a model that lost pages comes due before the copy lands:
             * wait for it rather than for the copy */
            double due = stall_due_in(w, busy, wk_now());
            if (due > 0 && due < left) {
                util_sleep_s(due);
                continue;
            }
            break;
        }
        wk_model_t *m = w->models[plan.model];
        double last = m->last_step;
        if (!streams && next_pass_s(w, plan.model) > left)
            break;
        step(w, plan.model, plan.admit);
        if (m->last_step == last)
            break; /* it could not run: wait for the copy */
    }
    w->aside = 0;
}

static void pagein_topup(wk_t *w, int busy);

static int timed_wait(void *ctx, uint32_t seg)
{
    timed_hooks_t *h = ctx;
    wk_t *w = h->w;
    double t0 = wk_now();
    wk_beat(w); /* a long pass still shows progress segment by segment */
    int rc = 0;
    if (!w->aside && !w->be->zero_copy) {
        pagein_topup(w, h->mi);
        /* its copy queued (what this pass streams), others step meanwhile */
        rc = res_seg_request(w->res, w->models[h->mi]->rm, seg);
        if (!rc)
            step_aside(w, h->mi, seg, h->streams);
    }
    if (!rc)
        rc = h->inner.wait(h->inner.ctx, seg);
    h->waited += wk_now() - t0;
    wk_beat(w);
    return rc;
}

/* The model could not be paged in: what was to run now fails (the active
 * sequences and those this pass would admit); the rest stay queued for a
 * later pass, and other models go on. */
static void step_failed(wk_t *w, int mi, uint32_t admit, proto_err_t code, const char *err)
{
    wk_model_t *m = w->models[mi];
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

/* Positions a sequence may reach: prompt + max_tokens, within the context. */
static uint32_t seq_ctx(const wk_model_t *m, const wk_seq_t *s)
{
    uint32_t n_ctx = s->n_prompt + s->max_tokens, ctx = wk_model_context(m);
    return n_ctx < ctx ? n_ctx : ctx;
}

/* Whether a sequence other than s holds a KV cache (anywhere): if none does,
 * s's cache can never get more pages by waiting. */
static int kv_held_by_others(const wk_t *w, const wk_seq_t *s)
{
    for (int i = 0; i < w->n_models; i++)
        for (const wk_seq_t *o = w->models[i] ? w->models[i]->active : NULL; o; o = o->next_active)
            if (o != s && o->kv)
                return 1;
    return 0;
}

static int has_parked(const wk_model_t *m)
{
    for (const wk_seq_t *s = m->active; s; s = s->next_active)
        if (s->parked)
            return 1;
    return 0;
}

/* Admit: a KV cache each, its prompt's pages mapped (it grows page by page
 * from there); stop at the first that does not fit now, and admit none
 * while the model has parked sequences (they get the pages first). Returns
 * the admitted sequences, linked by next_active. */
static wk_seq_t *step_admit(wk_t *w, int mi, uint32_t admit)
{
    wk_model_t *m = w->models[mi];
    char err[512] = "";
    wk_seq_t *fresh = NULL, **fresh_tail = &fresh;
    if (has_parked(m))
        admit = 0;
    for (uint32_t k = 0; k < admit; k++) {
        sched_item_t *it = sched_peek(w->sched, mi);
        if (!it)
            break;
        wk_seq_t *s = it->user;
        uint32_t mb = m->cfg.max_batch ? m->cfg.max_batch : 1;
        if (s->req.batch && mb > 1 && m->n_active + k + 1 >= mb)
            break; /* the batch class never takes a model's last slot: an interactive request
                      arriving finds one (its queue comes first) */
        if (wk_pfx_wait(w, m, s, fresh))
            break; /* one admitted now prefills the prefix it shares: reuse it next pass */
        /* its adapter's pages before its cache's: an admitted sequence never waits on pages
         * that admitted sequences' caches hold */
        int lrc = wk_lora_page(w, s, err, sizeof err);
        if (lrc == RES_ERR_NOSPACE && (wk_active_total(w) || fresh))
            break;
        if (lrc) {
            sched_pop(w->sched, mi);
            wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
            continue;
        }
        if (wk_pfx_admit(w, m, s, fresh, seq_ctx(m, s), err, sizeof err)) {
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
        wk_dl_admitted(w, m, mi, s->t_admit);
        *fresh_tail = s;
        fresh_tail = &s->next_active;
    }
    return fresh;
}

/* The pool ran short for s's next position: give its cache back (it stays
 * active, parked, and is recomputed when pages are back) unless no other
 * sequence holds a cache, when waiting cannot help: then it fails. */
static void seq_park(wk_t *w, wk_model_t *m, wk_seq_t *s, const char *err)
{
    if (!kv_held_by_others(w, s)) {
        wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
        return;
    }
    if (s->restore.ev[0]) { /* a copy back lands before its cache goes; it is recomputed */
        res_kv_restore_cancel(w->res, &s->restore);
        s->n_cached = 0;
    }
    res_kv_free(w->res, s->kv);
    s->kv = NULL;
    s->parked = 1;
    m->svc.total_kv_recomputes++;
}

/* A parked sequence gets its cache back if the pages are there: its next
 * pass prefills prompt + generated ids (logits bit-identical to decoding on).
 * 0 when it runs in this pass. */
static int seq_unpark(wk_t *w, wk_model_t *m, wk_seq_t *s)
{
    char err[512];
    uint32_t n = s->n_prompt + s->n_gen;
    if (!s->redo) {
        if (!(s->redo = malloc(n * sizeof *s->redo))) {
            wk_seq_fail(w, s, PROTO_E_INTERNAL, "out of memory");
            return -1;
        }
        memcpy(s->redo, s->prompt, s->n_prompt * sizeof *s->redo);
        memcpy(s->redo + s->n_prompt, s->gen, s->n_gen * sizeof *s->redo);
        s->n_redo = n;
    }
    if (res_kv_new(w->res, m->rm, seq_ctx(m, s), &s->kv, err, sizeof err) ||
        res_kv_ensure(w->res, s->kv, n + 1, err, sizeof err)) {
        res_kv_free(w->res, s->kv);
        s->kv = NULL;
        if (!kv_held_by_others(w, s))
            wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
        return -1;
    }
    s->parked = 0;
    return 0;
}

/* Whether s waits for its cached prefix to land from host RAM (it joins a pass once it has;
 * if the copy failed it prefills the whole prompt instead). */
static int seq_restoring(wk_t *w, wk_model_t *m, wk_seq_t *s)
{
    if (!s->restore.ev[0])
        return 0;
    int rc = res_kv_restore_poll(w->res, s->kv, s->n_cached, &s->restore);
    if (rc < 0) { /* recompute: the hit is undone */
        s->kv->n_past = 0;
        m->svc.total_prefix_hit_tokens -= s->n_cached;
        m->svc.total_prefix_host_recomputes++;
        s->n_cached = 0;
    }
    return rc == 0;
}

/* Whether s waits for its adapter's page-in (queued now if it was not): 1, or 0 when it can run;
 * -1 when the adapter can never be paged in (s failed). A request waits for its adapter as for
 * its model: never a pass without it. */
static int seq_lora_wait(wk_t *w, wk_seq_t *s)
{
    char err[512];
    int rc = wk_lora_ready(w, s, err, sizeof err);
    if (rc >= 0)
        return !rc;
    wk_seq_fail(w, s, PROTO_E_OVERLOADED, err);
    return -1;
}

/* Grow the active caches by one position (parking those the pool cannot
 * grow, bringing parked ones back), then let the fresh ones join; returns
 * how many sequences the pass runs. */
static uint32_t step_join(wk_t *w, wk_model_t *m, wk_seq_t *fresh)
{
    char err[512];
    for (wk_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next_active;
        if (s->parked)
            seq_unpark(w, m, s);
        else if (res_kv_ensure(w->res, s->kv, s->kv->n_past + 1, err, sizeof err))
            seq_park(w, m, s, err);
    }
    if (fresh) {
        wk_seq_t **tail = &fresh;
        while (*tail)
            tail = &(*tail)->next_active;
        *tail = m->active;
        m->active = fresh;
    }
    uint32_t n = 0, run = 0;
    for (wk_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next_active;
        int lw = s->parked ? 0 : seq_lora_wait(w, s);
        if (lw < 0) /* failed and gone */
            continue;
        s->lora_wait = lw;
        n++;
        run += !s->parked && !s->lora_wait && !seq_restoring(w, m, s);
    }
    m->n_active = n;
    return run;
}

/* One pass's buffers: the sequences in order, their inputs and logits. */
typedef struct step_pass {
    uint32_t n;
    fwd_seq_t *fs;
    wk_seq_t **order;
    float *logits;
    timed_hooks_t th;
    stats_res_t before;
    int cold;     /* the model was not wholly resident when the pass began */
    int streams;  /* nor were its copies covered by its compute (res_ready_in) */
    double t_end; /* when the pass ended */
    int rc;
    char err[512];
} step_pass_t;

static void pass_free(step_pass_t *p)
{
    free(p->fs);
    free(p->order);
    free(p->logits);
}

/* The pass's sequences of one adapter next to each other (the base's first), each group in
 * arrival order: consecutive sequences of an adapter share its products. */
static void group_adapters(wk_seq_t **order, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        wk_seq_t *s = order[i];
        uint32_t j = i;
        while (j > 0 && (uintptr_t)order[j - 1]->adapter > (uintptr_t)s->adapter) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = s;
    }
}

/* Run the forward pass (the model is acquired); 0 or -1 out of memory. */
static int step_run(wk_t *w, int mi, step_pass_t *p)
{
    wk_model_t *m = w->models[mi];
    const model_t *mod = m->sm->model;
    p->fs = calloc(p->n, sizeof *p->fs);
    p->order = calloc(p->n, sizeof *p->order);
    p->logits = malloc((size_t)p->n * mod->hp.n_vocab * sizeof(float));
    if (!p->fs || !p->order || !p->logits)
        return -1;
    uint32_t i = 0, rank_max = 0;
    for (wk_seq_t *s = m->active; s; s = s->next_active)
        if (!s->parked && !s->restore.ev[0] && !s->lora_wait)
            p->order[i++] = s;
    group_adapters(p->order, i);
    for (i = 0; i < p->n; i++) {
        wk_seq_t *s = p->order[i];
        const lora_weights_t *lw = s->adapter ? &s->adapter->dev : NULL;
        if (lw && lw->rank_max > rank_max)
            rank_max = lw->rank_max;
        const int32_t *t = s->redo ? s->redo : s->prompt; /* a rebuilt cache: prompt + generated */
        uint32_t nt = s->redo ? s->n_redo : s->n_prompt;
        uint32_t past = s->kv->n_past; /* a cached prefix is there already */
        int prefill = past < nt;
        p->fs[i] = (fwd_seq_t){s->kv, prefill ? t + past : &s->last, prefill ? nt - past : 1,
                               p->logits + (size_t)i * mod->hp.n_vocab, lw};
        if (prefill && !s->redo)
            m->svc.total_prompt_tokens += s->n_prompt - past;
    }
    fwd_t *f =
        w->aside ? w->fwd_aside : w->fwd; /* an aside step keeps the waiting pass's scratch */
    /* the pass's activation scratch is device memory too: counted beside the pool (both
     * forward scratches: an aside step's and the waiting pass's) */
    size_t n_tok = 0;
    for (uint32_t k = 0; k < p->n; k++)
        n_tok += p->fs[k].n_tokens;
    /* and so are the adapters' products (a step without any: what f holds of them; the
     * adapters' weights are pool pages of their own, res_att.c) */
    size_t lora = fwd_lora_scratch(f, &mod->hp, rank_max ? n_tok : 0, rank_max ? rank_max : 1);
    res_scratch_note(w->res, fwd_scratch_after(f, &mod->hp, n_tok, p->n) + lora +
                                 fwd_scratch_bytes(w->aside ? w->fwd : w->fwd_aside));
    p->th = (timed_hooks_t){.inner = res_hooks(m->rm), .w = w, .mi = mi, .streams = p->streams};
    fwd_hooks_t hooks = {.wait = timed_wait, .ctx = &p->th};
    double t0 = wk_now();
    p->rc =
        fwd_run(f, &mod->hp, res_weights(m->rm), p->fs, (int)p->n, &hooks, p->err, sizeof p->err);
    p->t_end = wk_now();
    for (uint32_t k = 0; k < p->n; k++) { /* rebuilt (or failed with the pass) */
        free(p->order[k]->redo);
        p->order[k]->redo = NULL;
    }
    double compute = p->t_end - t0 - p->th.waited;
    if (!p->rc)
        pass_time_note(&m->pass, compute, (uint32_t)n_tok, p->n);
    m->last_step = p->t_end;
    return 0;
}

/* After the pass: the measured swap-in time (a model streaming its layers);
 * 1 if the pass paged something in. */
static int step_account(wk_t *w, wk_model_t *m, const step_pass_t *p)
{
    stats_res_t after;
    res_model_stats(w->res, m->rm, &after);
    const stats_res_t *b = &p->before;
    int paged = after.total_bytes_in != b->total_bytes_in;
    if (paged && res_fully_resident(w->res, m->rm) && after.total_copy_ns > b->total_copy_ns)
        m->swap_in_s = (double)m->sm->image_bytes /
                       (double)(after.total_bytes_in - b->total_bytes_in) *
                       (after.total_copy_ns - b->total_copy_ns) / 1e9;
    m->svc.total_steps++;
    return paged;
}

/* Each sequence of the pass: its error, or its token sampled and streamed. */
static void step_emit(wk_t *w, wk_model_t *m, step_pass_t *p, int paged)
{
    double t = p->t_end;
    for (uint32_t i = 0; i < p->n; i++) {
        wk_seq_t *s = p->order[i];
        if (p->rc) {
            const char *why;
            int rerr = res_last_error(m->rm, &why);
            if (rerr && i == 0)
                snprintf(p->err, sizeof p->err, "%s", why);
            wk_seq_fail(w, s,
                        p->rc == FWD_ERR_CONTEXT ? PROTO_E_CONTEXT_OVERFLOW
                        : rerr                   ? wk_device_error_code(rerr)
                                                 : PROTO_E_INTERNAL,
                        p->err);
            continue;
        }
        if (s->n_gen == 0) {
            /* its first token: held up by the copies this pass waited on */
            if (p->cold || paged) {
                s->swap_s += p->th.waited;
                s->swapped = 1;
            }
            if (s->swapped) {
                m->svc.total_swapped_requests++;
                stats_hist_add(&m->hist.swap, s->swap_s * 1e3);
            }
        }
        wk_seq_token(w, s, p->fs[i].logits, t);
    }
}

/* One forward pass for a model: admit new sequences, run them with the
 * active ones, sample, stream, finish. 0 when no sequence could run (their
 * caches are landing from host RAM, or the model could not be acquired). */
static int step(wk_t *w, int mi, uint32_t admit)
{
    wk_model_t *m = w->models[mi];
    char err[512];
    step_pass_t p = {0};
    if (w->stall_left) { /* admin fault "stall" (tests only) */
        w->stall_left--;
        util_sleep_s(w->stall_ms / 1e3);
    }
    res_model_stats(w->res, m->rm, &p.before);
    p.cold = !res_fully_resident(w->res, m->rm);
    p.streams = p.cold && res_ready_in(w->res, m->rm, next_pass_s(w, mi)) != 0;
    int arc = res_acquire(w->res, m->rm, err, sizeof err);
    if (arc) {
        step_failed(w, mi, admit, wk_device_error_code(arc), err);
        return 0;
    }
    wk_seq_t *fresh = step_admit(w, mi, admit);
    p.n = step_join(w, m, fresh);
    if (p.n == 0 || step_run(w, mi, &p)) {
        pass_free(&p);
        res_release(w->res, m->rm);
        return 0;
    }
    res_release(w->res, m->rm);
    int paged = step_account(w, m, &p);
    step_emit(w, m, &p, paged);
    pass_free(&p);
    return 1;
}

/* ------------------------------------------------------------------ page-ins */

/* The most the loop sleeps while a page-in lands (new requests wake it). */
#define WK_NAP_MAX_S 0.002

/* The next round (and poll of the page-ins) comes after at most the
 * longest pass of a model. */
static double round_gap(const wk_t *w)
{
    double longest = WK_NAP_MAX_S;
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i] && w->models[i]->pass.pass_s > longest)
            longest = w->models[i]->pass.pass_s;
    return longest;
}

/* The copies a page-in of mi keeps queued, its next pass computing pass_s. */
static size_t pagein_window(const wk_t *w, int mi, double pass_s)
{
    return res_pagein_window(w->res, w->models[mi]->rm, 2 * round_gap(w), pass_s);
}

size_t wk_pagein_window(wk_t *w, int mi)
{
    return pagein_window(w, mi, next_pass_s(w, mi));
}

void wk_pagein_begin(wk_t *w, int mi, double now, int evict)
{
    wk_model_t *m = w->models[mi];
    if (m->paging_since > 0) {
        if (evict == RES_EVICT_ANY)
            m->paging_evict = evict;
        return;
    }
    stats_res_t st;
    res_model_stats(w->res, m->rm, &st);
    m->paging_since = now > 0 ? now : 1e-9;
    m->paging_evict = evict;
    m->paging_errors = st.total_device_errors;
    m->paging_inflight = -1;
    m->paging_moved = now;
    m->paging_queued = 0;
}

/* The page-in is over (the model can run, or streams the rest): every
 * request of it still waiting for its first token was held up by it from
 * its arrival or the page-in's start, whichever came later. */
static void pagein_end(wk_t *w, int mi, double now)
{
    wk_model_t *m = w->models[mi];
    double since = m->paging_since;
    m->paging_since = 0;
    if (now > since)
        m->swap_in_s = now - since;
    for (sched_item_t *it = sched_peek(w->sched, mi); it; it = it->next) {
        wk_seq_t *s = it->user;
        double held = now - (s->t_arrival > since ? s->t_arrival : since);
        if (held > 0) {
            s->swap_s += held;
            s->swap_wait_s += held;
            s->swapped = 1;
        }
    }
}

/* The page-in failed (a copy failed or took past device.copy_timeout):
 * what was waiting for it fails as a pass waiting on it would. */
static void pagein_fail(wk_t *w, int mi, proto_err_t code, const char *msg)
{
    wk_model_t *m = w->models[mi];
    m->paging_since = 0;
    uint32_t room = m->cfg.max_batch > m->n_active ? m->cfg.max_batch - m->n_active : 1;
    step_failed(w, mi, room, code, msg);
}

/* A page-in under way with copies left to queue (res_ready_in infinite)
 * queues its next segments, as the copy engine nears them; *in: then how
 * long until m can run. */
static int pagein_more(wk_t *w, int mi, double *in, char *err, size_t errlen)
{
    wk_model_t *m = w->models[mi];
    double pass = next_pass_s(w, mi);
    *in = res_ready_in(w->res, m->rm, pass);
    if (!isinf(*in))
        return 0;
    int rc =
        res_prefetch_ahead(w->res, m->rm, m->paging_evict, pagein_window(w, mi, pass), err, errlen);
    if (!rc)
        *in = res_ready_in(w->res, m->rm, pass);
    return rc;
}

/* Where the page-in of mi stands: 0 when the model can run now (page-in
 * over), -1 when it failed (its waiting requests answered), else seconds
 * until it may. Never blocks. */
static double pagein_poll(wk_t *w, int mi, double now)
{
    wk_model_t *m = w->models[mi];
    char err[512];
    stats_res_t st;
    res_model_stats(w->res, m->rm, &st);
    if (st.total_device_errors != m->paging_errors) {
        const char *why;
        int rerr = res_last_error(m->rm, &why);
        snprintf(err, sizeof err, "%s", *why ? why : "a copy to the device failed");
        pagein_fail(w, mi, rerr ? wk_device_error_code(rerr) : PROTO_E_INTERNAL, err);
        return -1;
    }
    double in;
    int rc = pagein_more(w, mi, &in, err, sizeof err);
    if (rc) {
        pagein_fail(w, mi, wk_device_error_code(rc), err);
        return -1;
    }
    if (isinf(in) && res_inflight(m->rm) == 0)
        in = 0;                            /* no room for more now: it streams the rest */
    m->paging_queued = in <= round_gap(w); /* all queued, landing before the next round */
    int n = res_inflight(m->rm);
    if (n != m->paging_inflight) {
        m->paging_inflight = n;
        m->paging_moved = now;
    }
    double timeout = (double)w->cfg->device.copy_timeout_ms / 1e3;
    if (in > 0 && n > 0 && now - m->paging_moved > timeout) {
        pagein_fail(w, mi, wk_device_error_code(res_copy_overdue(w->res, m->rm, err, sizeof err)),
                    err);
        return -1;
    }
    if (in == 0)
        pagein_end(w, mi, now);
    return in;
}

/* Before each segment of busy's pass (not one stepped aside): the page-ins
 * under way with copies left to queue get their next ones, as pagein_poll
 * gives them between rounds. Their window covers the longest pass seen, but
 * a pass can be longer (a prefill after decode steps): without this the
 * copy engine idled through it (tracesim, H200 settings, 30 BF16 models at
 * 0.1 req/s with the real token mix: worst p99 TTFT of three seeds 2.12 s,
 * 1.60 s with it). Failures show at the next poll. */
static void pagein_topup(wk_t *w, int busy)
{
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        char err[256];
        double in;
        if (i != busy && m && m->rm && m->paging_since > 0)
            (void)pagein_more(w, i, &in, err, sizeof err);
    }
}

/* The scheduler chose mi and it is not resident: 1 when its pass can start
 * now (covered, or it streams what does not fit), 0 when its page-in now
 * runs on the copy engine (or failed, answered). */
static int pagein_start(wk_t *w, int mi, uint32_t admit, double now)
{
    wk_model_t *m = w->models[mi];
    double pass = next_pass_s(w, mi);
    if (res_ready_in(w->res, m->rm, pass) == 0)
        return 1;
    char err[512];
    wk_pagein_begin(w, mi, now, RES_EVICT_ANY);
    int rc = res_prefetch_ahead(w->res, m->rm, RES_EVICT_ANY, pagein_window(w, mi, pass), err,
                                sizeof err);
    if (rc) {
        m->paging_since = 0;
        step_failed(w, mi, admit, wk_device_error_code(rc), err);
        return 0;
    }
    return pagein_poll(w, mi, now) == 0;
}

/* ------------------------------------------------------------------ round */

/* The page-ins under way; returns the soonest one may end (a nap bound). */
static double poll_pageins(wk_t *w, double now)
{
    double nap = WK_NAP_MAX_S;
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (m && m->rm && m->paging_since > 0) {
            double in = pagein_poll(w, i, now);
            if (in < nap)
                nap = in > 0 ? in : 0;
        }
    }
    return nap;
}

static void prefetch(wk_t *w, int mi, double now)
{
    wk_model_t *m = w->models[mi];
    if (!m || !m->rm || m->paging_since > 0)
        return;
    /* a page-in in the background: into free pages, or those of idle
     * models nobody waits for */
    char err[256];
    res_prefetch_ahead(w->res, m->rm, RES_EVICT_UNWANTED, wk_pagein_window(w, mi), err, sizeof err);
    if (res_inflight(m->rm) > 0)
        wk_pagein_begin(w, mi, now, RES_EVICT_UNWANTED); /* its requests wait for it now */
}

double wk_round(wk_t *w)
{
    double now = wk_now();
    double nap = poll_pageins(w, now);
    wk_dl_sweep(w, now);
    sched_model_view_t views[WK_MAX_MODELS];
    build_views(w, views, -1);
    sched_plan_t plan;
    sched_next(w->sched, now, views, &plan);
    /* the prefetch first: its copies run while the step computes (after a
     * step they would start a whole step late: a long prefill's worth) */
    if (plan.prefetch >= 0)
        prefetch(w, plan.prefetch, now);
    int stepped = 0;
    if (plan.model >= 0 &&
        (views[plan.model].resident || pagein_start(w, plan.model, plan.admit, now))) {
        stepped = step(w, plan.model, plan.admit); /* none ran: poll again after a nap */
    }
    return stepped ? 0 : nap;
}

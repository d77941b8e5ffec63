/* scheduler: per-model request queues and the policy that picks which model steps next (swap-aware or fifo); no threads, no engine. Its names keep the sched_ prefix. */
#include "scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How long a cold model's request may wait for a drain before its page-in
 * preempts running sequences: max_wait itself (so the max_wait promise
 * holds), or this many measured steps (EWMA) where steps are slow
 * (memcheck: 20-50x); and one such preempting page-in per
 * SCHED_PREEMPT_GAP_HOLDS holds at most (scheduler.h). */
#define SCHED_HOLD_WAITS 1.0
#define SCHED_HOLD_STEPS 100.0
/* how many holds a streaming model's page-in waits for another streaming
 * model's drain before it preempts (the running one keeps admitting: the
 * bound keeps a steady stream of its requests from holding the other off
 * for good) */
#define SCHED_HOLD_STREAMS 60.0
/* above any urgency of a request within max_wait */
#define SCHED_URGENCY_LATE 1e12

/* Output lengths (sched_passes_left): buckets of 2^(1/3) ratio (1 to 2^21
 * tokens), each finished sequence fading the others by SCHED_OUT_DECAY (a
 * window of about 1/(1 - decay) sequences); below SCHED_OUT_MIN sequences'
 * weight the lengths are not used; whether asks are exact (most sequences
 * ran to their max_tokens) a model decides from its own sequences once they
 * weigh SCHED_OUT_MIN_MODEL (77 models at 0.1 req/s see about 30 each in
 * 300 s). */
#define SCHED_OUT_BUCKETS 64
#define SCHED_OUT_DECAY (1.0 - 1.0 / 1024)
#define SCHED_OUT_MIN 32.0
#define SCHED_OUT_MIN_MODEL 8.0

typedef struct mqueue {
    sched_item_t *head, *tail;
    sched_item_t *first_batch; /* the batch class's items are the queue's tail from here */
    uint32_t n, n_batch;
    double out_seen, out_capped; /* its finished sequences, and those that ran to their
                                    max_tokens (faded as the global ones, on its own) */
} mqueue_t;

struct sched {
    sched_cfg_t cfg;
    int n;
    mqueue_t *q;
    uint32_t total;
    uint64_t next_seq;
    int cur;            /* model last switched to (paged in), -1 none */
    double cur_since;   /* when */
    double cur_quantum; /* how long it is protected from being switched away from */
    int rr;             /* round-robin cursor over resident models */
    int gate;        /* resident model admitting nothing so that it drains for a page-in, -1 none */
    int last_model;  /* model the last plan stepped while resident, -1 none */
    double last_now; /* when that plan was made */
    double step_s;   /* EWMA of a resident step's duration, measured between plans (0 = none yet) */
    double preempt_at; /* when the last page-in that preempts running sequences started */
    double out_w[SCHED_OUT_BUCKETS];   /* finished sequences by output length (faded) */
    double out_sum[SCHED_OUT_BUCKETS]; /* their tokens */
    double out_total;                  /* sum of out_w (faded alike) */
    double out_capped;                 /* of those, ended at their max_tokens (faded alike) */
    double above_w[SCHED_OUT_BUCKETS]; /* sum of out_w over the buckets above */
    int out_dirty;                     /* above_w to be summed again */
    int interactive; /* this plan: a model has interactive work, queued or running (deferred) */
};

sched_t *sched_new(const sched_cfg_t *cfg, int n_models)
{
    sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cfg = *cfg;
    s->cur = -1;
    s->gate = -1;
    s->last_model = -1;
    s->preempt_at = -INFINITY;
    if (sched_resize(s, n_models)) {
        free(s);
        return NULL;
    }
    return s;
}

void sched_free(sched_t *s)
{
    if (!s)
        return;
    free(s->q);
    free(s);
}

void sched_set_cfg(sched_t *s, const sched_cfg_t *cfg)
{
    s->cfg = *cfg;
}

int sched_resize(sched_t *s, int n_models)
{
    if (n_models < 0)
        return SCHED_ERR_ARG;
    for (int m = n_models; m < s->n; m++)
        if (s->q[m].n)
            return SCHED_ERR_ARG;
    mqueue_t *q = realloc(s->q, (size_t)(n_models ? n_models : 1) * sizeof *q);
    if (!q)
        return SCHED_ERR_ARG;
    for (int m = s->n; m < n_models; m++)
        memset(&q[m], 0, sizeof q[m]);
    s->q = q;
    s->n = n_models;
    if (s->cur >= n_models)
        s->cur = -1;
    if (s->gate >= n_models)
        s->gate = -1;
    if (s->last_model >= n_models)
        s->last_model = -1;
    return SCHED_OK;
}

int sched_submit(sched_t *s, sched_item_t *it)
{
    if (it->model < 0 || it->model >= s->n)
        return SCHED_ERR_ARG;
    mqueue_t *q = &s->q[it->model];
    if (q->n >= s->cfg.queue_limit || s->total >= s->cfg.max_queued)
        return SCHED_ERR_OVERLOADED;
    it->seq = s->next_seq++;
    sched_item_t *before = it->batch ? NULL : q->first_batch; /* interactive: ahead of batch */
    it->next = before;
    it->prev = before ? before->prev : q->tail;
    if (it->prev)
        it->prev->next = it;
    else
        q->head = it;
    if (before)
        before->prev = it;
    else
        q->tail = it;
    if (it->batch && !q->first_batch)
        q->first_batch = it;
    q->n++;
    q->n_batch += it->batch != 0;
    s->total++;
    it->queued = 1;
    return SCHED_OK;
}

void sched_remove(sched_t *s, sched_item_t *it)
{
    if (!it->queued)
        return;
    mqueue_t *q = &s->q[it->model];
    if (q->first_batch == it)
        q->first_batch = it->next;
    q->n_batch -= it->batch != 0;
    if (it->prev)
        it->prev->next = it->next;
    else
        q->head = it->next;
    if (it->next)
        it->next->prev = it->prev;
    else
        q->tail = it->prev;
    it->next = it->prev = NULL;
    it->queued = 0;
    q->n--;
    s->total--;
}

sched_item_t *sched_peek(sched_t *s, int model)
{
    return model >= 0 && model < s->n ? s->q[model].head : NULL;
}

sched_item_t *sched_pop(sched_t *s, int model)
{
    sched_item_t *it = sched_peek(s, model);
    if (it)
        sched_remove(s, it);
    return it;
}

uint32_t sched_queued(const sched_t *s, int model)
{
    return model >= 0 && model < s->n ? s->q[model].n : 0;
}

uint32_t sched_queued_total(const sched_t *s)
{
    return s->total;
}

/* ------------------------------------------------------------------ output lengths */

static int out_bucket(uint32_t n)
{
    int b = (int)(3.0 * log2((double)n + 1.0));
    return b < SCHED_OUT_BUCKETS ? b : SCHED_OUT_BUCKETS - 1;
}

void sched_note_output(sched_t *s, int model, uint32_t n_gen, uint32_t max_tokens)
{
    if (model >= 0 && model < s->n) {
        mqueue_t *q = &s->q[model];
        q->out_seen = q->out_seen * SCHED_OUT_DECAY + 1.0;
        q->out_capped = q->out_capped * SCHED_OUT_DECAY + (n_gen >= max_tokens);
    }
    s->out_total = s->out_total * SCHED_OUT_DECAY + 1.0;
    s->out_capped = s->out_capped * SCHED_OUT_DECAY + (n_gen >= max_tokens);
    for (int b = 0; b < SCHED_OUT_BUCKETS; b++) {
        s->out_w[b] *= SCHED_OUT_DECAY;
        s->out_sum[b] *= SCHED_OUT_DECAY;
    }
    int b = out_bucket(n_gen);
    s->out_w[b] += 1.0;
    s->out_sum[b] += n_gen;
    s->out_dirty = 1;
}

uint32_t sched_passes_left(sched_t *s, int model, uint32_t n_gen, uint32_t max_tokens,
                           uint32_t n_running)
{
    uint32_t asked = max_tokens > n_gen ? max_tokens - n_gen : 0;
    /* too few seen, or most ran to their max_tokens (the model's own
     * sequences where it has had enough, else all): the asks say it */
    double seen = s->out_total, capped = s->out_capped;
    if (model >= 0 && model < s->n && s->q[model].out_seen >= SCHED_OUT_MIN_MODEL)
        seen = s->q[model].out_seen, capped = s->q[model].out_capped;
    if (s->out_total < SCHED_OUT_MIN || 2.0 * capped >= seen)
        return asked;
    if (s->out_dirty) {
        double w = 0;
        for (int b = SCHED_OUT_BUCKETS - 1; b >= 0; b--) {
            s->above_w[b] = w;
            w += s->out_w[b];
        }
        s->out_dirty = 0;
    }
    /* among the lengths seen past n_gen's bucket, the n/(n+1) quantile (the
     * expected longest of n): a sequence longer than any seen, what it asked */
    int b = out_bucket(n_gen);
    if (s->above_w[b] < 1.0)
        return asked;
    double n = n_running ? (double)n_running : 1.0, want = s->above_w[b] * n / (n + 1.0), acc = 0;
    int k = b + 1;
    while (k < SCHED_OUT_BUCKETS - 1 && (acc += s->out_w[k]) < want)
        k++;
    double left = (s->out_w[k] > 0 ? s->out_sum[k] / s->out_w[k] : (double)n_gen) - (double)n_gen;
    uint32_t est = left < 1.0 ? 1 : (uint32_t)lround(left);
    return est < asked ? est : asked;
}

/* ------------------------------------------------------------------ policies */

/* Work that can make progress now: active sequences, or queued requests it
 * can admit (a queue blocked on KV memory waits for others to finish). */
/* m's work is all of the batch class (queued and running) while another model has interactive
 * work: it waits, but for max_stall (batch work uses what interactive work leaves). */
static int deferred(const sched_t *s, const sched_model_view_t *v, int m)
{
    return s->interactive && s->q[m].n == s->q[m].n_batch && v[m].n_active == v[m].n_active_batch;
}

static int any_work(const sched_t *s, const sched_model_view_t *v, int m)
{
    return !v[m].loading && ((s->q[m].n > 0 && v[m].can_admit) || v[m].n_active > 0);
}

static int has_work(const sched_t *s, const sched_model_view_t *v, int m)
{
    return any_work(s, v, m) && !deferred(s, v, m);
}

static int any_loading(const sched_t *s, const sched_model_view_t *v)
{
    for (int m = 0; m < s->n; m++)
        if (v[m].loading)
            return 1;
    return 0;
}

/* A page-in under way that is not queued (view.queued): it has copies left
 * to queue (the caller queues them as the copy engine nears them), so a
 * page-in started meanwhile would share the copy engine with it; or the
 * copies land after the next round, which can start the next one then. */
static int any_unqueued(const sched_t *s, const sched_model_view_t *v)
{
    for (int m = 0; m < s->n; m++)
        if (v[m].loading && !v[m].queued)
            return 1;
    return 0;
}

/* A model that could take the device now: one page-in at a time, so while
 * one loads only resident models are candidates. */
static int eligible(const sched_t *s, const sched_model_view_t *v, int m, int loading)
{
    return has_work(s, v, m) && (v[m].resident || !loading);
}

/* The running model (sequences admitted) that has gone longest without a
 * pass, if that is max_stall or more; -1 if none. */
static int stalled_running(const sched_t *s, double now, const sched_model_view_t *v, int loading)
{
    int model = -1;
    if (s->cfg.max_stall_s <= 0)
        return -1;
    for (int m = 0; m < s->n; m++)
        if (v[m].n_active > 0 && any_work(s, v, m) && (v[m].resident || !loading) &&
            now - v[m].last_step >= s->cfg.max_stall_s &&
            (model < 0 || v[m].last_step < v[model].last_step))
            model = m;
    return model;
}

/* During cur's quantum: cur, or a resident model with work (sequences
 * running or requests it can admit) that has waited longer since its last
 * pass: stepping a resident model swaps nothing, so the quantum keeps cur
 * from being switched away from, not a request of a resident model
 * waiting for it (up to 4 swap-in times: 1.2 s for an 8B BF16 model at
 * 55 GB/s); ties keep cur. */
static int quantum_pick(const sched_t *s, const sched_model_view_t *v)
{
    int model = has_work(s, v, s->cur) ? s->cur : -1;
    for (int m = 0; m < s->n; m++)
        if (m != s->cur && v[m].resident && has_work(s, v, m) &&
            (model < 0 || v[m].last_step < v[model].last_step))
            model = m;
    return model;
}

static uint32_t room(const sched_model_view_t *v, int m)
{
    return v[m].n_active < v[m].max_batch ? v[m].max_batch - v[m].n_active : 0;
}

static void plan_fifo(sched_t *s, const sched_model_view_t *v, sched_plan_t *p)
{
    /* finish what runs first (it arrived earlier), else the oldest request */
    int model = -1;
    for (int m = 0; m < s->n && model < 0; m++)
        if (v[m].n_active > 0)
            model = m;
    if (model < 0) {
        uint64_t best = UINT64_MAX;
        for (int m = 0; m < s->n; m++)
            if (s->q[m].head && v[m].can_admit && s->q[m].head->seq < best) {
                best = s->q[m].head->seq;
                model = m;
            }
    }
    if (model < 0 || v[model].loading)
        return;
    p->model = model;
    p->switched = !v[model].resident;
    /* admit only requests that are next in global arrival order */
    uint32_t cap = room(v, model), k = 0;
    sched_item_t *mine = s->q[model].head;
    while (mine && k < cap) {
        int older_elsewhere = 0;
        for (int m = 0; m < s->n; m++)
            if (m != model && s->q[m].head && s->q[m].head->seq < mine->seq)
                older_elsewhere = 1;
        if (older_elsewhere)
            break;
        k++;
        mine = mine->next;
    }
    p->admit = k;
}

/* Which cold model pages in first: one whose oldest request waited past
 * max_wait before any other, the oldest such first (the starvation bound's
 * order: ranked by queue depth too, popular models' deep queues overtook
 * the old requests of others: 12 models alike at 60% load, p99 TTFT 36.6 s this
 * way against 44.5 s); below max_wait, wait x priority x sqrt(queue depth). */
static double urgency(const sched_t *s, const sched_model_view_t *v, int m, double now)
{
    double wait = s->q[m].head ? now - s->q[m].head->t_arrival : 0.0;
    double depth = (double)s->q[m].n + v[m].n_active;
    double prio = v[m].priority > 0 ? v[m].priority : 1.0;
    if (wait > s->cfg.max_wait_s)
        return SCHED_URGENCY_LATE + wait * prio;
    return (wait + 1e-3) * prio * sqrt(depth > 0 ? depth : 1.0);
}

static void switch_to(sched_t *s, const sched_model_view_t *v, int m, double now)
{
    s->cur = m;
    s->cur_since = now;
    double q = s->cfg.quantum * v[m].swap_in_s;
    s->cur_quantum = q > s->cfg.min_quantum_s ? q : s->cfg.min_quantum_s;
}

/* A resident model that could be evicted without pausing running sequences
 * (no sequences admitted), other than except; -1 if none. */
static int idle_resident(const sched_t *s, const sched_model_view_t *v, int except)
{
    for (int m = 0; m < s->n; m++)
        if (m != except && v[m].resident && v[m].n_active == 0)
            return m;
    return -1;
}

/* Whether a page-in of cold model c would preempt running sequences: the
 * caller says it does not fit beside the work queued, another model has
 * sequences running (their KV caches hold pages, and their passes need
 * their weights back: resident or not), and no resident model can go
 * without pausing them. */
static int pagein_blocked(const sched_t *s, const sched_model_view_t *v, int c)
{
    if (v[c].fits >= 0)
        return 0;
    int running = 0;
    for (int m = 0; m < s->n; m++)
        running |= m != c && v[m].n_active > 0;
    return running && idle_resident(s, v, c) < 0;
}

/* A streaming model with sequences running other than c; -1 if none. */
static int running_streamer(const sched_t *s, const sched_model_view_t *v, int c)
{
    for (int m = 0; m < s->n; m++)
        if (m != c && v[m].streams && v[m].n_active > 0)
            return m;
    return -1;
}

/* Whether such a page-in waits (a drain instead): within the hold, or within
 * a hold of the last page-in that preempted (under overload, more models with
 * running sequences than the pool holds, preemptions are so spaced a hold
 * apart instead of one model taking pages from another on every pass). */
static int switch_preempts(const sched_t *s, double now, const sched_model_view_t *v, int c)
{
    if (!pagein_blocked(s, v, c))
        return 0;
    /* the hold is bounded: past it the page-in preempts (SCHED_HOLD_WAITS
     * max_waits, or SCHED_HOLD_STEPS measured steps where steps are slow) */
    const sched_item_t *h = s->q[c].head;
    double hold = s->cfg.max_wait_s * SCHED_HOLD_WAITS;
    if (s->step_s * SCHED_HOLD_STEPS > hold)
        hold = s->step_s * SCHED_HOLD_STEPS;
    /* a streaming model's page-in waits SCHED_HOLD_STREAMS holds for another
     * streaming model's drain: two streaming at once take each other's
     * pages on every pass, and each pass streams what the other took (two
     * 70B Q4_K_M-sized at 24 GiB quotas in a 40 GiB pool, tracesim: 17.4 TB
     * copied against 14.6 TB one after the other; the other 8B and 3B
     * models' requests waited behind their passes, p99 TTFT 294 s against
     * 119 s) */
    if (v[c].streams && running_streamer(s, v, c) >= 0 && h &&
        now - h->t_arrival <= hold * SCHED_HOLD_STREAMS)
        return 1;
    /* and past it one such page-in per SCHED_PREEMPT_GAP_HOLDS holds at most:
     * under overload (more models with running sequences than the pool
     * holds) the others drain */
    return !h || now - h->t_arrival <= hold || now - s->preempt_at < hold * SCHED_PREEMPT_GAP_HOLDS;
}

/* A model the drain may gate or step: resident, or streaming with sequences
 * running (never resident between its passes). */
static int drainable(const sched_model_view_t *v, int m)
{
    return v[m].resident || (v[m].streams && v[m].n_active > 0);
}

/* The model to drain for c's page-in (it admits nothing until its
 * sequences are done): for a streaming c the streaming model running, else
 * the drainable model with fewest sequences running, so the soonest done;
 * a gate already set stays while its model has sequences running. A gated
 * streaming model's next pass plans a page-in that fits and so lifts the
 * gate (it keeps admitting: SCHED_HOLD_STREAMS bounds the wait). */
static void pick_gate(sched_t *s, const sched_model_view_t *v, int c)
{
    int streamer = v[c].streams ? running_streamer(s, v, c) : -1;
    if (streamer >= 0 && (s->gate < 0 || !v[s->gate].streams)) {
        s->gate = streamer;
        return;
    }
    if (s->gate >= 0 && v[s->gate].n_active > 0)
        return;
    s->gate = -1;
    for (int m = 0; m < s->n; m++)
        if (drainable(v, m) && v[m].n_active > 0 &&
            (s->gate < 0 || v[m].n_active < v[s->gate].n_active))
            s->gate = m;
}

/* Instead of a page-in that would preempt running sequences: drain one
 * model (pick_gate: it admits nothing more) and step a resident model with
 * work meanwhile, or a streaming one with sequences running (not resident
 * between its passes, and the one a streaming c waits for). Its sequences
 * finish, it becomes the idle victim, and the page-in starts then without
 * pausing anyone. -1 if no such model has work. */
static int drain_pick(sched_t *s, const sched_model_view_t *v, int c)
{
    pick_gate(s, v, c);
    int model = -1;
    for (int k = 0; k < s->n && model < 0; k++) {
        int m = (s->rr + 1 + k) % s->n;
        if (drainable(v, m) && has_work(s, v, m) && (m != s->gate || v[m].n_active > 0)) {
            model = m;
            s->rr = m;
        }
    }
    return model;
}

/* The model of the oldest request past max_wait that could take the device
 * now (a model that cannot admit but has sequences running counts, or its
 * queue would starve behind others); -1 if none. */
static int late_pick(const sched_t *s, double now, const sched_model_view_t *v, int loading)
{
    int model = -1;
    double oldest = INFINITY;
    for (int m = 0; m < s->n; m++) {
        const sched_item_t *h = s->q[m].head;
        if (h && now - h->t_arrival > s->cfg.max_wait_s && h->t_arrival < oldest &&
            eligible(s, v, m, loading) &&
            ((room(v, m) > 0 && v[m].can_admit) || v[m].n_active > 0)) {
            oldest = h->t_arrival;
            model = m;
        }
    }
    return model;
}

/* A resident model with work, in round-robin order from the last one
 * picked; with SCHED_SRPT_RUNNING or more resident models running
 * sequences, the first in that order with the fewest passes left (0 for one
 * that can admit a queued request: its first token; a full batch with a queue
 * counts to its first free slot). -1 if none. */
static int resident_pick(sched_t *s, const sched_model_view_t *v)
{
    int running = 0;
    for (int m = 0; m < s->n; m++)
        running += v[m].resident && v[m].n_active > 0;
    int model = -1;
    uint32_t best = UINT32_MAX;
    for (int k = 0; k < s->n; k++) {
        int m = (s->rr + 1 + k) % s->n;
        if (!has_work(s, v, m) || !v[m].resident)
            continue;
        /* requests queued: 0 where it can admit one (its first token), else (a full batch) when
         * its first slot frees; only sequences running: its longest */
        int admits = v[m].n_active < v[m].max_batch && v[m].can_admit;
        uint32_t left = v[m].n_active == 0 ? 0
                        : s->q[m].n == 0   ? v[m].steps_left
                        : admits           ? 0
                        : v[m].steps_min   ? v[m].steps_min
                                           : v[m].steps_left;
        if (model < 0 || (running >= SCHED_SRPT_RUNNING && left < best)) {
            model = m;
            best = left;
        }
        if (running < SCHED_SRPT_RUNNING)
            break;
    }
    if (model >= 0)
        s->rr = model;
    return model;
}

/* Swap-aware: keep the device on resident models as long as they have work;
 * page a model in only when nothing resident can progress, or when a request
 * has waited past max_wait; a freshly swapped-in model keeps the device for
 * its quantum (a multiple of its swap-in time) first, interleaved with the
 * resident models that have work (no page-in takes the device from it
 * meanwhile; stepping a resident model swaps nothing). A page-in runs in the
 * background (the caller's copy engine): a loading model is not stepped,
 * others are, and no second page-in starts until it can run; the prefetch
 * suggestion starts one early where the caller finds room (also queued
 * behind a page-in whose copies are all queued). Waiting is so
 * bounded by max_wait plus one quantum (plus a page-in under way), and a
 * resident model with running sequences by max_stall plus one step.
 * Where the caller says a page-in would not fit beside the work queued
 * (view.fits < 0) and every resident model has sequences running, the
 * page-in waits instead of preempting them: one resident model is drained
 * (admits nothing) until it is idle and can go, for at most the hold bound
 * (SCHED_HOLD_*: max_wait); past it the page-in preempts, at most one such
 * page-in per SCHED_PREEMPT_GAP_HOLDS holds, and the drained model still
 * admits nothing until its sequences are done; prefetch suggestions go only
 * to models that fit. */
static void plan_swap_aware(sched_t *s, double now, const sched_model_view_t *v, sched_plan_t *p)
{
    int loading = any_loading(s, v);
    /* measured step time: between a plan that stepped a resident model and
     * the next, while that model still has sequences running (the caller
     * steps on without a nap then, so the gap is the step) */
    if (s->last_model >= 0 && v[s->last_model].n_active > 0 && now > s->last_now) {
        double dt = now - s->last_now;
        s->step_s = s->step_s > 0 ? 0.8 * s->step_s + 0.2 * dt : dt;
    }
    s->last_model = -1;
    s->last_now = now;
    /* the quantum of a model being paged in starts when it can run */
    if (s->cur >= 0 && v[s->cur].loading)
        s->cur_since = now;
    /* 0. running streams: none goes max_stall without a pass */
    int model = stalled_running(s, now, v, loading);
    /* 1. a model being swapped in keeps the device for its quantum */
    int in_quantum = s->cur >= 0 && now - s->cur_since < s->cur_quantum;
    if (model < 0 && in_quantum && has_work(s, v, s->cur))
        model = quantum_pick(s, v);
    /* 2. starvation bound: the oldest request past max_wait wins */
    if (model < 0)
        model = late_pick(s, now, v, loading);
    /* 3. resident models with work, round robin (no swap needed); with
     * many running, shortest remaining first (SCHED_SRPT_RUNNING) */
    if (model < 0)
        model = resident_pick(s, v);
    /* 4. otherwise page in the most urgent model (one page-in at a time) */
    if (model < 0) {
        double best = -1;
        for (int m = 0; m < s->n; m++) {
            if (!eligible(s, v, m, loading))
                continue;
            double u = urgency(s, v, m, now);
            if (u > best) {
                best = u;
                model = m;
            }
        }
    }
    if (model < 0)
        return;
    if (!v[model].resident && switch_preempts(s, now, v, model)) {
        int alt = drain_pick(s, v, model);
        if (alt >= 0)
            model = alt;
    }
    if (!v[model].resident) {
        /* the page-in starts: it fits, and nobody drains for it any more; or
         * past the hold it preempts, and the drained model goes on admitting
         * nothing until its sequences are done, so the running models shrink
         * back to what the pool holds (else they take pages from each other
         * on every pass for as long as all keep admitting) */
        if (pagein_blocked(s, v, model)) {
            pick_gate(s, v, model);
            s->preempt_at = now;
        } else
            s->gate = -1;
        if (model != s->cur)
            switch_to(s, v, model, now);
    } else {
        s->last_model = model;
    }
    /* a drained model picked once it is idle (the page-in it drained for
     * went another way, or a request of its own was older): the drain is
     * over, or its queue would wait behind a gate nobody lifts */
    if (model == s->gate && v[model].n_active == 0)
        s->gate = -1;
    p->model = model;
    p->switched = !v[model].resident;
    uint32_t cap = room(v, model);
    p->admit =
        v[model].can_admit && model != s->gate ? (s->q[model].n < cap ? s->q[model].n : cap) : 0;
    /* prefetch the next most urgent cold model (the caller pages it in where
     * that evicts nobody with work), and only while no page-in has copies
     * left to queue nor starts with this plan: the copy engine serves cold
     * models in order (several sharing it each land as late as the last: 30
     * BF16 models at 0.1 req/s each, H200 settings, p99 TTFT 2.15 s with them
     * against 1.95 s without). Behind a page-in whose copies are all queued
     * and land before the next round it goes at once: its copies follow (the
     * copy engine is FIFO) instead of the engine idling until the round after
     * a long step (an 8B Q4_K_M page-in takes 0.09 s at 55 GB/s, a prefill of
     * 2048 tokens longer) */
    double best = -1;
    int unqueued = any_unqueued(s, v);
    for (int m = 0; m < s->n && !unqueued && v[model].resident; m++) {
        if (m == model || v[m].resident || v[m].loading || s->q[m].n == 0 || !v[m].can_admit ||
            v[m].fits < 0 || deferred(s, v, m))
            continue;
        double u = urgency(s, v, m, now);
        if (u > best) {
            best = u;
            p->prefetch = m;
        }
    }
}

void sched_gap_note(sched_gap_t *g, double now, int backlog)
{
    if (g->backlog && g->last > 0) {
        double gap = now - g->last;
        if (g->n == SCHED_GAP_WINDOW)
            g->sum -= g->s[g->next];
        else
            g->n++;
        g->s[g->next] = gap;
        g->sum += gap;
        g->next = (g->next + 1) % SCHED_GAP_WINDOW;
    }
    g->last = now;
    g->backlog = backlog;
}

double sched_first_token_s(const sched_gap_t *g, uint32_t ahead, double wait_s, double prefill_s)
{
    double gap = g->n ? g->sum / g->n : 0;
    return wait_s + (double)ahead * (gap > 0 ? gap : 0) + prefill_s;
}

void sched_next(sched_t *s, double now, const sched_model_view_t *views, sched_plan_t *plan)
{
    plan->model = -1;
    plan->admit = 0;
    plan->prefetch = -1;
    plan->switched = 0;
    s->interactive = 0;
    for (int m = 0; m < s->n && !s->interactive; m++)
        s->interactive = s->q[m].n > s->q[m].n_batch || views[m].n_active > views[m].n_active_batch;
    if (s->cfg.policy == SCHED_POLICY_FIFO)
        plan_fifo(s, views, plan);
    else
        plan_swap_aware(s, now, views, plan);
}

/* worker_loop: the worker thread and its public face: start and stop, the inbox (requests to
 * admission, admin operations to worker_admin, reloads, drains), a scheduling round (worker_step)
 * per turn, readiness and status. The top of the worker: nothing in it calls back up here. */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void update_status(wk_t *w);

/* ------------------------------------------------------------------ start */

/* The backend the config names, by its name (the two tables spell the same names). */
static be_kind_t backend_kind(cfg_backend_t b)
{
    be_kind_t k = BE_KIND_AUTO;
    be_kind_from_name(cfg_backend_name(b), &k);
    return k;
}

/* The start's summary: every model that could not be loaded, at warning level. */
static void log_failed_models(const wk_t *w)
{
    int failed = 0;
    char sum[2048] = "";
    size_t used = 0;
    for (int i = 0; i < w->n_models; i++) {
        const wk_model_t *m = w->models[i];
        if (m->sm)
            continue;
        int k = snprintf(sum + used, sizeof sum - used, "%s'%s': %s", failed++ ? "; " : "", m->name,
                         m->load_error ? m->load_error : "not loaded");
        if (k > 0)
            used = used + (size_t)k < sizeof sum ? used + (size_t)k : sizeof sum - 1;
    }
    if (failed)
        log_warning("%d of %d models could not be loaded and are unavailable (failed in `gpuswap "
                    "models`, \"available\": false in /v1/models; --strict refuses to start): %s",
                    failed, w->n_models, sum);
}

/* What the device came out as, against what the config asked. */
static void log_device(const wk_t *w)
{
    const cfg_t *cfg = w->cfg;
    char hostmem[32], a[32], b[32];
    if (cfg->device.page_size && w->be->page_size != cfg->device.page_size)
        log_info("device.page_size %s changed to %s (the %s backend's granularity)",
                 cfg_format_size(cfg->device.page_size, a, sizeof a),
                 cfg_format_size(w->be->page_size, b, sizeof b), w->be->name);
    if (cfg->device.memory && w->be->pool_bytes != cfg->device.memory && !w->be->zero_copy)
        log_info("device.memory %s lowered to %s (whole pages)",
                 cfg_format_size(cfg->device.memory, a, sizeof a),
                 cfg_format_size(w->be->pool_bytes, b, sizeof b));
    log_info("%s backend, device pool %.1f MiB in %.0f KiB pages, host budget %s", w->be->name,
             w->be->pool_bytes / 1048576.0, w->be->page_size / 1024.0,
             cfg->host.memory ? cfg_format_size(cfg->host.memory, hostmem, sizeof hostmem)
                              : "unlimited");
    if (w->be->desc)
        log_info("%s backend: %s", w->be->name, w->be->desc);
}

wk_t *wk_new(const cfg_t *cfg, wk_notify_fn notify, void *notify_ctx, char *err, size_t errlen)
{
    wk_t *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->cfg = cfg;
    w->notify = notify;
    w->notify_ctx = notify_ctx;
    w->t_start = wk_now();
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    be_params_t bp = {
        .kind = backend_kind(cfg->device.backend),
        .memory = cfg->device.memory,
        .page_size = cfg->device.page_size,
        .sim_bandwidth = (double)cfg->device.sim_bandwidth,
        .threads = (int)cfg->device.threads,
        .gpu = cfg->device.gpu,
    };
    char berr[512];
    w->be = be_open(&bp, berr, sizeof berr);
    if (!w->be) {
        snprintf(err, errlen, "%s: device: %s", cfg->file, berr);
        goto fail;
    }
    if (w->be->zero_copy && w->be->pool_bytes == 0)
        w->be->pool_bytes = w->be->page_size; /* cpu: no device pool, nothing pages */
    w->store = store_new(w->be, cfg->host.memory);
    if (w->store)
        store_set_progress(w->store, wk_load_progress, w);
    if (w->store && cfg->device.backend == CFG_BACKEND_SIM)
        store_set_load_rate(w->store, (double)cfg->device.sim_load_bandwidth);
    w->res = res_new(w->be, berr, sizeof berr);
    if (w->res) {
        res_set_copy_timeout(w->res, (double)cfg->device.copy_timeout_ms / 1e3);
        res_set_max_stall(w->res, cfg->scheduler.max_stall_ms / 1e3);
    }
    sched_cfg_t sc = wk_sched_cfg_of(cfg);
    w->sched = sched_new(&sc, 0);
    w->fwd = fwd_new(w->be);
    w->fwd_aside = fwd_new(w->be);
    if (w->fwd)
        fwd_set_chunk(w->fwd, cfg->device.prefill_chunk);
    if (w->fwd_aside)
        fwd_set_chunk(w->fwd_aside, cfg->device.prefill_chunk);
    if (!w->store || !w->res || !w->sched || !w->fwd || !w->fwd_aside) {
        snprintf(err, errlen, "setup failed: %s", berr);
        goto fail;
    }
    log_device(w);
    for (size_t i = 0; i < cfg->n_models && w->n_models < WK_MAX_MODELS; i++) {
        if (cfg->models[i].adapter)
            continue; /* adapters: once their bases are in (wk_lora_sync) */
        wk_model_t *nm = wk_model_load(w, &cfg->models[i]);
        w->models[w->n_models++] = nm;
    }
    log_failed_models(w);
    wk_lora_sync(w, cfg);
    if (sched_resize(w->sched, w->n_models)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    update_status(w); /* readiness before the thread starts: the models are loaded */
    return w;
fail:
    wk_free(w);
    return NULL;
}

/* ------------------------------------------------------------------ the loop */

/* Puts list (in order) back at the head of the inbox, before what came since. */
static void requeue_front(wk_t *w, wk_in_t *list)
{
    wk_in_t *tail = list;
    while (tail->next)
        tail = tail->next;
    pthread_mutex_lock(&w->mu);
    tail->next = w->in_head;
    w->in_head = list;
    if (!w->in_tail)
        w->in_tail = tail;
    pthread_mutex_unlock(&w->mu);
}

/* stopping: the loop is going away, so everything is handled now. */
static void process_inbox(wk_t *w, wk_in_t *in, int stopping)
{
    while (in) {
        wk_in_t *nx = in->next;
        switch (in->kind) {
        case IN_REQ:
            if (in->admin) { /* admin operations (admin socket) */
                wk_admin_op(w, in->conn, &in->req, in->t_recv);
                proto_req_free(&in->req);
            } else {
                wk_handle_req(w, in->conn, &in->req, in->t_recv);
            }
            break;
        case IN_CANCEL_CONN: wk_cancel_where(w, in->conn, NULL, 1); break;
        case IN_RELOAD:
            /* what came after it waits in the inbox, where a long model load still
             * answers `models` (wk_load_progress); the next round takes the rest */
            if (nx && !stopping) {
                requeue_front(w, nx);
                nx = NULL;
            }
            wk_apply_reload(w, in->cfg);
            atomic_fetch_sub(&w->reload_pub, 1);
            break;
        case IN_DRAIN: w->draining = 1; break;
        }
        free(in);
        in = nx;
    }
}

/* Readiness from the worker's own state (worker thread): the first model that
 * is not in host RAM names the reason. */
static wk_ready_t ready_of(wk_t *w, int loaded, char *why, size_t len)
{
    if (w->draining) {
        snprintf(why, len, "draining: finishing in-flight requests, accepting no new ones");
        return WK_READY_DRAINING;
    }
    int failed = 0;
    const char *first = NULL, *first_err = NULL;
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || m->removing || m->sm)
            continue;
        if (!failed++) {
            first = m->name;
            first_err = m->load_error;
        }
    }
    if (failed) {
        snprintf(why, len, "%d of %d configured models not in host RAM: '%s': %s", failed,
                 loaded + failed, first, first_err ? first_err : "not loaded");
        return WK_READY_FAILED;
    }
    snprintf(why, len, "%d models in host RAM", loaded);
    return WK_READY_OK;
}

static void update_status(wk_t *w)
{
    stats_pool_t ps;
    res_pool_stats(w->res, &ps);
    int resident = 0, loaded = 0;
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || !m->sm || m->removing)
            continue;
        loaded++;
        resident += res_fully_resident(w->res, m->rm);
    }
    char buf[256], why[256];
    snprintf(buf, sizeof buf, "%d models (%d resident), pool %llu/%llu pages used, %u in flight%s",
             loaded, resident, (unsigned long long)ps.curr_pool_used,
             (unsigned long long)ps.curr_pool_pages, wk_in_flight(w),
             w->draining ? ", draining" : "");
    wk_ready_t ready = ready_of(w, loaded, why, sizeof why);
    pthread_mutex_lock(&w->mu);
    memcpy(w->status, buf, sizeof buf);
    memcpy(w->ready_why, why, sizeof why);
    pthread_mutex_unlock(&w->mu);
    if (w->draining)
        atomic_store(&w->draining_pub, 1);
    atomic_store(&w->ready_pub, (int)ready);
}

/* Draining and nothing left in flight: answer the drain, tell the loop. */
static void drain_check(wk_t *w)
{
    if (!w->draining || wk_in_flight(w) != 0 || w->drain_told)
        return;
    w->drain_told = 1;
    if (w->drain_conn)
        wk_send_ok(w, w->drain_conn, w->drain_id,
                   json_pack("{s:I}", "completed", (json_int_t)w->drain_completed));
    wk_out_t *o = calloc(1, sizeof *o);
    if (o) {
        o->kind = WK_OUT_IDLE;
        wk_push_out(w, o);
    }
}

static void *worker_main(void *arg)
{
    wk_t *w = arg;
    /* named for top -H, and for the latency tests, which read its run-queue
     * wait (/proc/PID/task/TID/schedstat) to tell neighbours' load from stalls */
    pthread_setname_np(pthread_self(), "gsd-worker");
    for (;;) {
        wk_beat(w);
        pthread_mutex_lock(&w->mu);
        int idle = wk_in_flight(w) == 0 && !w->loads;
        /* idle, or nothing could step (page-ins landing): sleep, woken by the inbox */
        double nap = idle ? WK_IDLE_WAIT_MS / 1e3 : w->nap_s;
        if (nap > 0 && !w->in_head && !w->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(nap * 1e9);
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        int stop = w->stop;
        wk_in_t *in = w->in_head;
        w->in_head = w->in_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        if (stop) {
            /* give back what is still queued: the loop is going away */
            process_inbox(w, in, 1);
            break;
        }
        process_inbox(w, in, 0);
        if (w->loads)
            wk_admin_poll_loads(w);
        w->nap_s = wk_round(w);
        wk_reap_removed(w);
        update_status(w);
        drain_check(w);
    }
    return NULL;
}

static void push_in(wk_t *w, wk_in_t *in)
{
    pthread_mutex_lock(&w->mu);
    if (w->in_tail)
        w->in_tail->next = in;
    else
        w->in_head = in;
    w->in_tail = in;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void wk_submit(wk_t *w, uint64_t conn, int admin, proto_req_t *req)
{
    wk_in_t *in = calloc(1, sizeof *in);
    if (!in) {
        proto_req_free(req);
        return;
    }
    in->kind = IN_REQ;
    if (admin && req->op == PROTO_OP_DRAIN)
        atomic_store(&w->draining_pub, 1); /* /ready flips before the worker sees it */
    in->t_recv = wk_now();
    in->conn = conn;
    in->admin = admin;
    in->req = *req;
    memset(req, 0, sizeof *req);
    push_in(w, in);
}

void wk_cancel_conn(wk_t *w, uint64_t conn)
{
    wk_in_t *in = calloc(1, sizeof *in);
    if (!in)
        return;
    in->kind = IN_CANCEL_CONN;
    in->conn = conn;
    push_in(w, in);
}

void wk_reload(wk_t *w, const cfg_t *next)
{
    wk_in_t *in = calloc(1, sizeof *in);
    if (!in)
        return;
    in->kind = IN_RELOAD;
    in->cfg = next;
    atomic_fetch_add(&w->reload_pub, 1); /* not ready until the worker has loaded it */
    push_in(w, in);
}

void wk_drain(wk_t *w)
{
    wk_in_t *in = calloc(1, sizeof *in);
    if (!in)
        return;
    in->kind = IN_DRAIN;
    atomic_store(&w->draining_pub, 1); /* /ready flips before the worker sees it */
    push_in(w, in);
}

double wk_stalled_s(wk_t *w)
{
    double t = (double)atomic_load(&w->beat_ns) / 1e9;
    return t > 0 ? wk_now() - t : 0;
}

void wk_status(wk_t *w, char *buf, size_t len)
{
    pthread_mutex_lock(&w->mu);
    snprintf(buf, len, "%s", w->status[0] ? w->status : "starting");
    pthread_mutex_unlock(&w->mu);
}

int wk_draining(wk_t *w)
{
    return atomic_load(&w->draining_pub);
}

void wk_leave(wk_t *w)
{
    atomic_store(&w->leaving_pub, 1);
}

const char *wk_ready_name(wk_ready_t r)
{
    switch (r) {
    case WK_READY_OK: return "ready";
    case WK_READY_LOADING: return "loading";
    case WK_READY_FAILED: return "failed";
    case WK_READY_DRAINING: return "draining";
    }
    return "?";
}

wk_ready_t wk_readiness(wk_t *w, char *reason, size_t len)
{
    wk_ready_t r = (wk_ready_t)atomic_load(&w->ready_pub);
    const char *why = NULL;
    if (atomic_load(&w->draining_pub)) {
        r = WK_READY_DRAINING;
        why = "draining: finishing in-flight requests, accepting no new ones";
    } else if (atomic_load(&w->leaving_pub)) {
        r = WK_READY_DRAINING;
        why = "draining soon: still serving while load balancers take this host out "
              "(listen.drain_linger)";
    } else if (atomic_load(&w->reload_pub) > 0) {
        r = WK_READY_LOADING;
        why = "a reload is loading models into host RAM";
    }
    if (reason && len) {
        if (why)
            snprintf(reason, len, "%s", why);
        else {
            pthread_mutex_lock(&w->mu);
            snprintf(reason, len, "%s", w->ready_why);
            pthread_mutex_unlock(&w->mu);
        }
    }
    return r;
}

int wk_start(wk_t *w)
{
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
        return -1;
    w->started = 1;
    return 0;
}

void wk_free(wk_t *w)
{
    if (!w)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    for (wk_in_t *in = w->in_head, *nx; in; in = nx) {
        nx = in->next;
        proto_req_free(&in->req);
        free(in);
    }
    for (wk_load_t *l = w->loads, *nx; l; l = nx) {
        nx = l->next;
        json_decref(l->id);
        free(l);
    }
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m)
            continue;
        while (m->active) {
            wk_seq_t *s = m->active;
            m->active = s->next_active;
            wk_seq_free(w, s);
        }
        if (w->sched)
            for (sched_item_t *it; (it = sched_pop(w->sched, i));)
                wk_seq_free(w, it->user);
        wk_model_free(w, m);
    }
    for (wk_out_t *o = w->out_head, *nx; o; o = nx) {
        nx = o->next;
        wk_out_free(o);
    }
    json_decref(w->drain_id);
    if (w->be)
        wk_lora_free_all(w); /* every sequence (holding them) is gone */
    fwd_free(w->fwd);
    fwd_free(w->fwd_aside);
    sched_free(w->sched);
    cons_cache_free(w->cons_cache);
    res_free(w->res);
    store_free(w->store);
    be_close(w->be);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* main: gpuswapd's command line and daemon lifecycle: config, worker, server, signals (TERM drains, HUP reloads), sd_notify. */
#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>

#include "base/log.h"
#include "config.h"
#include "oneshot/generate.h"
#include "oneshot/tokenize_cli.h"
#include "http.h"
#include "preflight.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "kernels/quant.h"
#include "server.h"
#include "worker/worker.h"

#define DEFAULT_CONFIG "/etc/gpuswapd/gpuswapd.yaml"

typedef struct daemon_state {
    struct event_base *base;
    const char *config_path;
    cfg_t *cfg;  /* current */
    cfg_t **old; /* configs replaced by reloads: kept until exit */
    size_t n_old;
    wk_t *wk;
    srv_t *srv;
    http_t *http; /* NULL unless listen.http */
    auth_t *auth; /* API keys (auth:), reloaded with the config */
    struct event *sig_term, *sig_int, *sig_hup, *watchdog, *drain_timer;
    int draining;
    int exit_code;
    struct event *flush_timer;
    int flush_ticks;
    struct event *linger; /* listen.drain_linger before a drain starts; NULL if none yet */
    int term_seen;        /* SIGTERM/SIGINT handled once */
    int drain_req_set;    /* an admin drain waits in drain_req for the linger to end */
    uint64_t drain_conn;  /* its admin connection */
    proto_req_t drain_req;
    double watchdog_s; /* WATCHDOG_USEC in seconds, 0 when off */
    int stall_logged;  /* the current worker stall has been logged */
} daemon_state_t;

static void usage(FILE *f)
{
    fputs(
        "usage: gpuswapd serve [--http HOST:PORT] [--strict] MODEL.gguf...\n"
        "                                          serve GGUF files (OpenAI HTTP on " CFG_DEFAULT_HTTP
        ")\n"
        "       gpuswapd [serve] [--config FILE] [--strict]\n"
        "                                          run the daemon on a config (default " DEFAULT_CONFIG
        ");\n"
        "                                          --strict: refuse to start when a model cannot load\n"
        "       gpuswapd --check-config FILE [--remote]\n"
        "                                          validate a config, its listeners and models, print it;\n"
        "                                          --remote: a config for another host (no listener checks)\n"
        "       gpuswapd generate --model FILE ... run a model once (generate --help)\n"
        "       gpuswapd tokenize --model FILE < TEXT  print the token ids of stdin (tokenize --help)\n"
        "       gpuswapd options                   every config option: type, default, what a reload\n"
        "                                          does, a line of doc (a Markdown table)\n"
        "       gpuswapd version\n",
        f);
}

/* The worker's wake-up: the server exists before the worker thread starts. */
static void srv_notify_tramp(void *ctx)
{
    daemon_state_t *d = ctx;
    if (d->srv)
        srv_notify(d->srv);
}

static void notify_status(daemon_state_t *d)
{
    char st[256];
    wk_status(d->wk, st, sizeof st);
    sd_notifyf(0, "STATUS=%s", st);
}

/* The auth section of the stats report (worker thread; auth_report locks). */
static json_t *auth_report_fn(void *ctx)
{
    return auth_report(ctx);
}

/* ------------------------------------------------------------------ reload */

/* "a, b.c" (cfg_model_changes, cfg_changes) as a JSON array of strings. */
static json_t *split_list(const char *list)
{
    json_t *a = json_array();
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        json_array_append_new(a, json_stringn(p, n));
        p += n;
        p += strspn(p, ", ");
    }
    return a;
}

/* Re-reads the config; answers an admin reload when conn != 0. */
static void do_reload(daemon_state_t *d, uint64_t conn, const json_t *id)
{
    char err[1024];
    cfg_t *next = NULL;
    if (cfg_load_file(d->config_path, &next, err, sizeof err) ||
        cfg_reload_check(d->cfg, next, err, sizeof err) ||
        (auth_reload(d->auth, next) && snprintf(err, sizeof err, "auth: out of memory"))) {
        log_warning("reload refused, keeping the running config: %s", err);
        sd_notifyf(0, "READY=1\nSTATUS=reload refused, running the previous config: %s", err);
        cfg_free(next);
        if (conn)
            srv_send_error(d->srv, conn, id, PROTO_E_BAD_REQUEST, err);
        return;
    }
    /* every changed key by name: per model, and the top-level settings */
    json_t *added = json_array(), *removed = json_array(), *changed = json_array();
    json_t *keys = json_object(), *settings = json_array(), *reloaded = json_array();
    char list[1024];
    for (size_t i = 0; i < next->n_models; i++) {
        const cfg_model_t *o = cfg_find_model(d->cfg, next->models[i].name);
        if (!o)
            json_array_append_new(added, json_string(next->models[i].name));
        else if (cfg_model_changes(o, &next->models[i], list, sizeof list)) {
            json_array_append_new(changed, json_string(next->models[i].name));
            json_object_set_new(keys, next->models[i].name, split_list(list));
            log_notice("reload: model '%s': %s changed", next->models[i].name, list);
            if (cfg_model_reloads(o, &next->models[i], list, sizeof list)) {
                json_array_append_new(reloaded, json_string(next->models[i].name));
                log_notice("reload: model '%s' loads again from its file (%s)",
                           next->models[i].name, list);
            }
        }
    }
    for (size_t i = 0; i < d->cfg->n_models; i++)
        if (!cfg_find_model(next, d->cfg->models[i].name))
            json_array_append_new(removed, json_string(d->cfg->models[i].name));
    if (cfg_changes(d->cfg, next, list, sizeof list)) {
        json_decref(settings);
        settings = split_list(list);
        log_notice("reload: %s changed", list);
    }
    log_set_level(LOG_LEVEL_OF_INDEX(next->log.level));
    log_notice("reloaded %s (%zu added, %zu removed, %zu changed, %zu settings)", d->config_path,
               json_array_size(added), json_array_size(removed), json_array_size(changed),
               json_array_size(settings));
    cfg_t **no = realloc(d->old, (d->n_old + 1) * sizeof *no);
    if (no) {
        d->old = no;
        d->old[d->n_old++] = d->cfg;
    }
    d->cfg = next;
    srv_set_cfg(d->srv, next);
    wk_reload(d->wk, next);
    if (conn)
        srv_send_result(d->srv, conn, id,
                        json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "added", added, "removed",
                                  removed, "changed", changed, "changed_keys", keys, "settings",
                                  settings, "reloaded", reloaded));
    else {
        json_decref(added);
        json_decref(removed);
        json_decref(changed);
        json_decref(keys);
        json_decref(settings);
        json_decref(reloaded);
    }
    sd_notify(0, "READY=1");
}

static void hook_reload(void *ctx, uint64_t conn, const json_t *id)
{
    do_reload(ctx, conn, id);
}

/* After draining: exit once the answers have left (or after 2 s). */
static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    if (srv_pending_output(d->srv) == 0 || ++d->flush_ticks > 200) {
        log_notice("drained, exiting");
        event_base_loopexit(d->base, NULL);
        return;
    }
    struct timeval tv = {0, 10000};
    evtimer_add(d->flush_timer, &tv);
}

static void hook_drained(void *ctx)
{
    daemon_state_t *d = ctx;
    if (!d->flush_timer)
        d->flush_timer = evtimer_new(d->base, on_flush, d);
    on_flush(-1, 0, d);
}

/* listen.drain_linger: /ready fails from now on, requests are still served; the
 * drain itself (fn) starts when the linger is over. 1 if it lingers. */
static int linger_first(daemon_state_t *d, event_callback_fn fn)
{
    wk_leave(d->wk);
    uint64_t ms = d->cfg->listen.drain_linger_ms;
    if (!ms || d->linger)
        return d->linger != NULL;
    d->linger = evtimer_new(d->base, fn, d);
    if (!d->linger)
        return 0;
    log_notice("leaving: /ready answers 503, serving %llu ms more before draining",
               (unsigned long long)ms);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(d->linger, &tv);
    return 1;
}

static void admin_drain_now(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    if (d->drain_req_set) {
        d->drain_req_set = 0;
        wk_submit(d->wk, d->drain_conn, 1, &d->drain_req);
    }
}

/* An admin drain: like SIGTERM, the linger first. */
static void hook_drain(void *ctx, uint64_t conn, proto_req_t *req)
{
    daemon_state_t *d = ctx;
    if (d->drain_req_set) { /* a second one while lingering: the first one answers */
        proto_req_free(req);
        return;
    }
    d->drain_conn = conn;
    d->drain_req = *req;
    memset(req, 0, sizeof *req);
    d->drain_req_set = 1;
    if (!linger_first(d, admin_drain_now))
        admin_drain_now(-1, 0, d);
}

/* ------------------------------------------------------------------ signals */

static void start_drain_now(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    if (d->draining)
        return;
    admin_drain_now(-1, 0, d); /* an admin drain that was lingering too */
    d->draining = 1;
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    log_notice("draining (up to %llu ms)", (unsigned long long)d->cfg->scheduler.drain_timeout_ms);
    srv_drain(d->srv);
    wk_drain(d->wk);
    struct timeval tv = {(time_t)(d->cfg->scheduler.drain_timeout_ms / 1000),
                         (suseconds_t)(d->cfg->scheduler.drain_timeout_ms % 1000) * 1000};
    evtimer_add(d->drain_timer, &tv);
}

static void start_drain(daemon_state_t *d)
{
    if (d->draining || d->term_seen++)
        return;
    if (!linger_first(d, start_drain_now))
        start_drain_now(-1, 0, d);
}

static void on_term(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    start_drain(arg);
}

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    sd_notify(0, "RELOADING=1");
    do_reload(d, 0, NULL);
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    log_warning("drain timeout: abandoning what is still in flight");
    event_base_loopexit(d->base, NULL);
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_state_t *d = arg;
    /* the loop is alive; ping only if the worker is too: a worker stuck
     * longer than a copy may take (plus one watchdog period) is hung, and
     * the missing ping lets systemd restart the daemon */
    double stalled = wk_stalled_s(d->wk);
    double limit = (double)d->cfg->device.copy_timeout_ms / 1e3 + d->watchdog_s;
    if (stalled > limit) {
        if (!d->stall_logged)
            log_warning("the worker has made no progress for %.1f s: withholding the "
                        "watchdog ping",
                        stalled);
        d->stall_logged = 1;
        return;
    }
    if (d->stall_logged)
        log_notice("the worker is making progress again");
    d->stall_logged = 0;
    sd_notify(0, "WATCHDOG=1");
    notify_status(d);
}

/* ------------------------------------------------------------------ serve */

/* Raises the soft RLIMIT_NOFILE to fit the configured connections (inference and HTTP, each up
 * to listen.max_connections, plus admin clients, model files and the daemon's own), at most to
 * the hard limit; says so when it changes it or when the hard limit is too low. */
static void raise_nofile(const cfg_t *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = 2 * (rlim_t)c->listen.max_connections + c->n_models + 256;
    rlim_t to = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < to) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = to;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            log_notice("open-file limit raised from %llu to %llu for listen.max_connections %u",
                       (unsigned long long)was, (unsigned long long)to,
                       (unsigned)c->listen.max_connections);
    }
    if (to < want)
        log_warning("open-file hard limit %llu is below the %llu that listen.max_connections %u "
                    "needs: connections past it are refused (raise LimitNOFILE=)",
                    (unsigned long long)to, (unsigned long long)want,
                    (unsigned)c->listen.max_connections);
}

/* One command to try it, on stderr at every start (after "serving on ..."). */
static void say_try(const cfg_t *c)
{
    if (c->listen.http)
        log_notice(
            "OpenAI API on http://%s/v1; try: curl -s http://%s/v1/completions -H "
            "'Content-Type: application/json' -d '{\"model\":\"%s\",\"prompt\":\"Once upon a "
            "time\",\"max_tokens\":32}'",
            c->listen.http, c->listen.http, c->models[0].name);
    else if (c->listen.socket)
        log_notice("try: GPUSWAP_SOCKET=%s gpuswap generate -m %s \"Once upon a time\"",
                   c->listen.socket, c->models[0].name);
}

/* Loads the config and checks its listeners before any model loads (which can take minutes).
 * 0, or 1 with the reasons logged and nothing held. */
static int serve_config(daemon_state_t *d, const char *path)
{
    char err[1024];
    if (cfg_load_file(path, &d->cfg, err, sizeof err)) {
        log_error("%s", err);
        if (!strcmp(path, DEFAULT_CONFIG) && access(path, F_OK) != 0)
            log_error("no config at %s. To serve GGUF files: gpuswapd serve MODEL.gguf...; with a "
                      "config of your own: gpuswapd --config FILE (the project's "
                      "config/gpuswapd.yaml documents every key; a file with only `models:` is "
                      "enough); gpuswapd --help",
                      path);
        return 1;
    }
    log_set_level(LOG_LEVEL_OF_INDEX(d->cfg->log.level));
    char problems[4096];
    int np = preflight(d->cfg, 1, problems, sizeof problems);
    if (np) {
        for (char *line = strtok(problems, "\n"); line; line = strtok(NULL, "\n"))
            log_error("%s: %s", d->cfg->file, line);
        log_error("%d problem%s with the listeners; nothing started", np, np == 1 ? "" : "s");
        cfg_free(d->cfg);
        return 1;
    }
    return 0;
}

/* TERM and INT drain, HUP reloads; the drain timer. Caught from before the sockets exist: a
 * SIGTERM that arrives as the first clients connect drains rather than kills. */
static void serve_signals(daemon_state_t *d)
{
    d->sig_term = evsignal_new(d->base, SIGTERM, on_term, d);
    d->sig_int = evsignal_new(d->base, SIGINT, on_term, d);
    d->sig_hup = evsignal_new(d->base, SIGHUP, on_hup, d);
    d->drain_timer = evtimer_new(d->base, on_drain_timeout, d);
    evsignal_add(d->sig_term, NULL);
    evsignal_add(d->sig_int, NULL);
    evsignal_add(d->sig_hup, NULL);
}

/* The key store, the socket server and (with listen.http or metrics.listen) HTTP.
 * 0, or -1 with the reason logged. */
static int serve_front(daemon_state_t *d)
{
    char err[1024];
    srv_hooks_t hooks = {
        .reload = hook_reload, .drained = hook_drained, .drain = hook_drain, .ctx = d};
    d->auth = auth_new(d->cfg, err, sizeof err);
    if (!d->auth) {
        log_error("%s", err);
        return -1;
    }
    wk_set_report_section(d->wk, "auth", auth_report_fn, d->auth);
    if (d->cfg->auth.n_keys || d->cfg->auth.http || d->cfg->auth.tcp)
        log_notice("auth: %zu API keys; a key is required on %s", d->cfg->auth.n_keys,
                   d->cfg->auth.http && d->cfg->auth.tcp ? "listen.http and listen.tcp"
                   : d->cfg->auth.http                   ? "listen.http"
                   : d->cfg->auth.tcp                    ? "listen.tcp"
                                                         : "no listener (the auth op is optional)");
    d->srv = srv_new(d->base, d->cfg, d->wk, &hooks, err, sizeof err);
    if (!d->srv) {
        log_error("%s", err);
        return -1;
    }
    srv_set_auth(d->srv, d->auth);
    if (d->cfg->listen.http || d->cfg->metrics.listen) {
        d->http = http_new(d->base, d->cfg, d->wk, d->srv, err, sizeof err);
        if (!d->http) {
            log_error("%s", err);
            return -1;
        }
        if (d->cfg->listen.http)
            log_notice("http on %s", d->cfg->listen.http);
        if (d->cfg->metrics.listen)
            log_notice("metrics on %s", d->cfg->metrics.listen);
    }
    return 0;
}

/* systemd's watchdog, when the unit has one: a ping every half period (on_watchdog). */
static void serve_watchdog(daemon_state_t *d)
{
    uint64_t wd_us = 0;
    if (sd_watchdog_enabled(0, &wd_us) > 0 && wd_us > 0) {
        d->watchdog_s = (double)wd_us / 1e6;
        d->watchdog = event_new(d->base, -1, EV_PERSIST, on_watchdog, d);
        struct timeval tv = {(time_t)(wd_us / 2 / 1000000), (suseconds_t)(wd_us / 2 % 1000000)};
        evtimer_add(d->watchdog, &tv);
    }
}

/* Frees what serve built, the worker first (it may still wake the server). */
static void serve_free(daemon_state_t *d)
{
    wk_free(d->wk);
    http_free(d->http);
    srv_free(d->srv);
    auth_free(d->auth);
    if (d->sig_term)
        event_free(d->sig_term);
    if (d->sig_int)
        event_free(d->sig_int);
    if (d->sig_hup)
        event_free(d->sig_hup);
    if (d->drain_timer)
        event_free(d->drain_timer);
    if (d->watchdog)
        event_free(d->watchdog);
    if (d->flush_timer)
        event_free(d->flush_timer);
    if (d->linger)
        event_free(d->linger);
    if (d->drain_req_set)
        proto_req_free(&d->drain_req);
    event_base_free(d->base);
    for (size_t i = 0; i < d->n_old; i++)
        cfg_free(d->old[i]);
    free(d->old);
    cfg_free(d->cfg);
}

/* Builds the worker and the front end, serves until the loop ends, frees them; 0 or 1. */
static int serve_run(daemon_state_t *d, int strict)
{
    char err[1024];
    /* the worker's wake-up needs the server; the server needs the worker:
     * create the worker with a trampoline that reads d->srv */
    d->wk = wk_new(d->cfg, srv_notify_tramp, d, err, sizeof err);
    if (!d->wk) {
        log_error("%s", err);
        return 1;
    }
    if (strict && wk_readiness(d->wk, err, sizeof err) == WK_READY_FAILED) {
        log_error("--strict: %s; not starting", err);
        return 1;
    }
    serve_signals(d);
    if (serve_front(d))
        return 1;
    if (wk_start(d->wk)) {
        log_error("cannot start the worker thread");
        return 1;
    }
    serve_watchdog(d);
    log_notice("serving on %s (admin %s)%s%s", d->cfg->listen.socket ? d->cfg->listen.socket : "-",
               d->cfg->admin.socket ? d->cfg->admin.socket : "-",
               d->cfg->listen.tcp ? ", tcp " : "", d->cfg->listen.tcp ? d->cfg->listen.tcp : "");
    say_try(d->cfg);
    sd_notify(0, "READY=1");
    notify_status(d);
    event_base_dispatch(d->base);
    return 0;
}

static int serve(const char *path, int strict)
{
    daemon_state_t d = {.config_path = path};
    if (serve_config(&d, path))
        return 1;
    signal(SIGPIPE, SIG_IGN);
    raise_nofile(d.cfg);
    if (evthread_use_pthreads() != 0) {
        log_error("libevent without thread support");
        cfg_free(d.cfg);
        return 1;
    }
    d.base = event_base_new();
    if (!d.base) {
        cfg_free(d.cfg);
        return 1;
    }
    int rc = serve_run(&d, strict);
    serve_free(&d);
    return rc;
}

/* --check-config of an adapter: opened against its base (whose own problems its entry names).
 * 1 if it is refused (named on stderr), else 0. */
static int check_adapter(const cfg_t *c, const cfg_model_t *m)
{
    char err[1024];
    const cfg_model_t *b = cfg_find_model(c, m->base);
    model_t *mo = b && b->path ? model_open(b->path, err, sizeof err) : NULL;
    if (!mo) {
        fprintf(stderr, "%s:%d: adapter '%s': its base '%s' cannot be opened\n", c->file, m->line,
                m->name, m->base);
        return 1;
    }
    lora_t *a = lora_open(m->adapter, mo, (float)m->adapter_scale, NULL, err, sizeof err);
    if (!a)
        fprintf(stderr, "%s:%d: adapter '%s': %s\n", c->file, m->line, m->name, err);
    else {
        char on[128] = ""; /* the matrices it has pairs on */
        for (int t = 0; t < LORA_N_TARGETS; t++)
            for (uint32_t l = 0; l < a->w.n_layer; l++)
                if (lora_pair(&a->w, l, (lora_target_t)t)) {
                    snprintf(on + strlen(on), sizeof on - strlen(on), "%s%s", on[0] ? "," : "",
                             lora_target_name((lora_target_t)t));
                    break;
                }
        fprintf(stderr, "%s:%d: adapter '%s' of '%s': %u pairs on %s, rank %u, %.1f MiB\n", c->file,
                m->line, m->name, m->base, (unsigned)a->n_pairs, on, (unsigned)a->w.rank_max,
                a->bytes / 1048576.0);
    }
    int bad = a == NULL;
    lora_close(a);
    model_close(mo);
    return bad;
}

/* --check-config: loads the config, checks its listeners as the daemon will open them (preflight),
 * opens every model's GGUF header (metadata, tensor table, tokenizer: what the engine must
 * understand, not the weights) and prints the effective config, each model's max_context as it
 * applies. Every problem is named on stderr (a model with its file:line); 1 if any, else 0.
 * remote: the config is another host's (gpuswap fleet render): the listener checks, which only
 * that host can make (its addresses, directories, ports), are left out. */
static int check_config(const char *path, int remote)
{
    cfg_t *c = NULL;
    char err[1024];
    if (cfg_load_file(path, &c, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    char problems[4096] = "";
    int bad = remote ? 0 : preflight(c, 0, problems, sizeof problems);
    for (char *line = strtok(problems, "\n"); line; line = strtok(NULL, "\n"))
        fprintf(stderr, "%s: %s\n", c->file, line);
    for (size_t i = 0; i < c->n_models; i++) {
        cfg_model_t *m = &c->models[i];
        if (m->adapter) {
            bad += check_adapter(c, m);
            continue;
        }
        model_t *mo = model_open(m->path, err, sizeof err);
        if (!mo) {
            fprintf(stderr, "%s:%d: model '%s': %s\n", c->file, m->line, m->name, err);
            bad++;
            continue;
        }
        uint32_t ctx = cfg_model_context(m, mo->hp.n_ctx_train);
        fprintf(stderr,
                "%s:%d: model '%s': %s %s, %u layers, trained context %u, max_context %u%s\n",
                c->file, m->line, m->name, model_arch_name(mo->hp.arch), gguf_ttype_name(mo->wtype),
                (unsigned)mo->hp.n_layer, (unsigned)mo->hp.n_ctx_train, (unsigned)ctx,
                ctx == m->max_context ? ""
                : m->max_context_set  ? " (lowered from the file's, the model's context_length)"
                                      : " (the default 4096, at most the model's context)");
        m->max_context = ctx; /* printed as it applies */
        model_close(mo);
    }
    cfg_print(c, stdout);
    if (bad)
        fprintf(stderr, "%s: %d problem%s\n", c->file, bad, bad == 1 ? "" : "s");
    cfg_free(c);
    return bad ? 1 : 0;
}

/* A model name from a file name: the name without its folder and .gguf, each character outside
 * [A-Za-z0-9._:-] as '-'; unique among the first n names (-2, -3, ...). */
static void name_of_file(const char *path, char names[][129], size_t n)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t len = strlen(base);
    if (len > 5 && !strcasecmp(base + len - 5, ".gguf"))
        len -= 5;
    if (len > 120)
        len = 120;
    char name[129];
    for (size_t i = 0; i < len; i++)
        name[i] = isalnum((unsigned char)base[i]) || strchr("._:-", base[i]) ? base[i] : '-';
    name[len] = 0;
    if (!len)
        snprintf(name, sizeof name, "model");
    snprintf(names[n], 129, "%s", name);
    for (int k = 2;; k++) {
        int dup = 0;
        for (size_t j = 0; j < n; j++)
            dup |= !strcmp(names[j], names[n]);
        if (!dup)
            break;
        snprintf(names[n], 129, "%.112s-%d", name, k % 1000000);
    }
}

/* Writes s as a YAML double-quoted scalar. */
static void yaml_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\x%02x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* gpuswapd serve MODEL.gguf...: writes a config of the files (absolute paths, names from the file
 * names, listen.http as given, every other key at its default) into the runtime directory and
 * serves it: a SIGHUP re-reads that file, which an operator may edit. */
static int serve_files(char **files, int n, const char *http, int strict)
{
    char dir[PATH_MAX], path[PATH_MAX + 16];
    if (cfg_runtime_dir(NULL, dir, sizeof dir) || (mkdir(dir, 0700) != 0 && errno != EEXIST)) {
        fprintf(stderr, "gpuswapd serve: cannot create the runtime directory %s: %s\n", dir,
                strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/serve.yaml", dir);
    char(*names)[129] = calloc((size_t)n, sizeof *names);
    char **abs = calloc((size_t)n, sizeof *abs);
    int rc = 1;
    FILE *f = NULL;
    if (!names || !abs)
        goto out;
    for (int i = 0; i < n; i++) {
        if (!(abs[i] = realpath(files[i], NULL))) {
            fprintf(stderr, "gpuswapd serve: %s: %s\n", files[i], strerror(errno));
            goto out;
        }
        name_of_file(abs[i], names, (size_t)i);
    }
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "w"))) {
        fprintf(stderr, "gpuswapd serve: %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    fprintf(f,
            "# written by `gpuswapd serve`: the files it serves, every other key at its default\n"
            "# (config/gpuswapd.yaml documents them); a SIGHUP re-reads this file\n"
            "listen:\n  http: ");
    yaml_quoted(f, http);
    fputs("\nmodels:\n", f);
    for (int i = 0; i < n; i++) {
        fputs("  - name: ", f);
        yaml_quoted(f, names[i]);
        fputs("\n    path: ", f);
        yaml_quoted(f, abs[i]);
        fputc('\n', f);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        f = NULL;
        fprintf(stderr, "gpuswapd serve: %s: %s\n", path, strerror(errno));
        goto out;
    }
    f = NULL;
    log_notice("gpuswapd serve: config %s", path);
    rc = serve(path, strict);
out:
    for (int i = 0; abs && i < n; i++)
        free(abs[i]);
    free(abs);
    free(names);
    return rc;
}

/* GPUSWAPD_ISA caps the CPU kernels' instruction set (auto, avx512, vnni, avx2, portable), so an
 * AVX-512 machine can run and measure the AVX2 and plain C paths: 0, or 2 for a bad value. */
static int isa_from_env(void)
{
    const char *v = getenv("GPUSWAPD_ISA");
    quant_isa_t want;
    if (!v || !*v)
        return 0;
    if (quant_isa_parse(v, &want)) {
        fprintf(stderr,
                "gpuswapd: GPUSWAPD_ISA='%s': expected auto, avx512, vnni, avx2 or portable\n", v);
        return 2;
    }
    quant_isa_t best = quant_isa_set(QUANT_ISA_AUTO), got = quant_isa_set(want);
    fprintf(stderr, "gpuswapd: CPU kernels: %s (GPUSWAPD_ISA=%s; this CPU's best: %s)\n",
            quant_isa_name(got), v, quant_isa_name(best));
    return 0;
}

int main(int argc, char **argv)
{
    if (isa_from_env())
        return 2;
    if (argc >= 2 && strcmp(argv[1], "generate") == 0)
        return gen_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0)
        return tokenize_cli_main(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0)) {
        printf("gpuswapd %s\n", GPUSWAPD_VERSION);
        return 0;
    }
    if (argc >= 2 && (strcmp(argv[1], "options") == 0 || strcmp(argv[1], "--options") == 0))
        return cfg_options_markdown(stdout) || fflush(stdout) ? 1 : 0;
    if (argc >= 2 && (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
                      strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    int first = 1, is_serve = 0, strict = 0, remote = 0, n_files = 0;
    if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        first = 2, is_serve = 1;
    const char *config = NULL, *check = NULL, *http = NULL;
    char **files = calloc((size_t)argc, sizeof *files);
    if (!files)
        return 1;
    for (int i = first; i < argc; i++) {
        if ((strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) && i + 1 < argc)
            config = argv[++i];
        else if (strcmp(argv[i], "--check-config") == 0 && i + 1 < argc)
            check = argv[++i];
        else if (strcmp(argv[i], "--remote") == 0)
            remote = 1;
        else if (strcmp(argv[i], "--strict") == 0)
            strict = 1;
        else if (is_serve && strcmp(argv[i], "--http") == 0 && i + 1 < argc)
            http = argv[++i];
        else if (is_serve && argv[i][0] != '-')
            files[n_files++] = argv[i];
        else {
            fprintf(stderr, "gpuswapd: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            free(files);
            return 2;
        }
    }
    int rc;
    if ((n_files || http) && (config || check)) {
        fprintf(stderr, "gpuswapd serve: model files or a config, not both\n");
        rc = 2;
    } else if (remote && !check) {
        fprintf(stderr, "gpuswapd: --remote goes with --check-config\n");
        rc = 2;
    } else if (http && !n_files) {
        fprintf(stderr, "gpuswapd serve: --http needs model files\n");
        rc = 2;
    } else if (check)
        rc = check_config(check, remote);
    else if (n_files)
        rc = serve_files(files, n_files, http ? http : CFG_DEFAULT_HTTP, strict);
    else
        rc = serve(config ? config : DEFAULT_CONFIG, strict);
    free(files);
    return rc;
}

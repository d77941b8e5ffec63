/* worker: the device worker thread: owns backend, store, residency, scheduler and sequences; talks to the loop only through its inbox and outbox. */
#include "worker.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "chat.h"
#include "forward.h"
#include "residency.h"
#include "sampler.h"
#include "sched.h"
#include "stats.h"
#include "store.h"
#include "tokenizer.h"

#define WK_MAX_MODELS 256
#define WK_IDLE_WAIT_MS 200

/* ------------------------------------------------------------------ types */

typedef enum seq_state { SEQ_NEW = 0, SEQ_QUEUED, SEQ_ACTIVE } seq_state_t;

typedef struct wk_seq {
    sched_item_t item;      /* first: sched items are sequences */
    uint64_t conn;
    json_t *id;
    proto_req_t req;
    int model;
    seq_state_t state;
    int32_t *prompt;
    uint32_t n_prompt, max_tokens, n_gen;
    kv_seq_t *kv;
    sampler_t *smp;
    tok_stream_t ts;
    char *text;             /* generated text so far (NUL-terminated) */
    size_t text_len, text_cap;
    size_t sent;            /* bytes of text already streamed */
    int32_t last;           /* token to feed next step */
    int stopped_on_string;
    double t_arrival, t_admit, t_first;
    double swap_s;          /* time this request's steps waited on page-in */
    int swapped;
    struct wk_seq *next_active;
} wk_seq_t;

typedef struct wk_model {
    char *name;
    cfg_model_t cfg;        /* copy; strings point into the worker's current cfg */
    store_model_t *sm;
    res_model_t *rm;
    chat_family_t chat;
    char *load_error;       /* why it is 'failed' */
    wk_seq_t *active;       /* admitted sequences */
    uint32_t n_active;
    double swap_in_s;       /* last measured full page-in time */
    int removing;           /* gone from the config: drop once idle */
    stats_svc_t svc;
    stats_hist_t ttft, latency, queue, swap;
} wk_model_t;

typedef enum in_kind { IN_REQ = 1, IN_CANCEL_CONN, IN_RELOAD, IN_DRAIN } in_kind_t;

typedef struct wk_in {
    in_kind_t kind;
    uint64_t conn;
    int admin;
    proto_req_t req;
    const cfg_t *cfg;
    struct wk_in *next;
} wk_in_t;

typedef struct wk_load {
    int model;
    uint64_t conn;
    json_t *id;
    int stream;
    double t0;
    size_t last_bytes;
    uint64_t device_errors; /* the model's count when the load began */
    struct wk_load *next;
} wk_load_t;

struct wk {
    _Atomic uint64_t beat_ns; /* CLOCK_MONOTONIC of the worker's last sign of progress */
    const cfg_t *cfg;
    backend_t *be;
    store_t *store;
    res_t *res;
    sched_t *sched;
    fwd_t *fwd;
    wk_model_t *models[WK_MAX_MODELS];
    int n_models;           /* slots used (some may be NULL after reloads) */
    wk_load_t *loads;
    double t_start;

    pthread_t thread;
    int started;
    pthread_mutex_t mu;     /* inbox, outbox, stop, status */
    pthread_cond_t cv;
    wk_in_t *in_head, *in_tail;
    wk_out_t *out_head, *out_tail;
    int stop;
    wk_notify_fn notify;
    void *notify_ctx;
    char status[256];
    int draining_pub;       /* copy of draining for wk_draining (HTTP /health), under mu */

    int draining;
    uint64_t drain_conn;
    json_t *drain_id;
    uint64_t drain_completed;
    int drain_told;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpuswapd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ------------------------------------------------------------------ outbox */

void wk_out_free(wk_out_t *o)
{
    if (!o)
        return;
    free(o->line);
    json_decref(o->id);
    free(o->message);
    free(o);
}

static void push_out(wk_t *w, wk_out_t *o)
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

static void send_line(wk_t *w, uint64_t conn, char *line)
{
    if (!line)
        return;
    wk_out_t *o = calloc(1, sizeof *o);
    if (!o) {
        free(line);
        return;
    }
    o->kind = WK_OUT_LINE;
    o->conn = conn;
    o->line = line;
    push_out(w, o);
}

static void send_error(wk_t *w, uint64_t conn, const json_t *id, proto_err_t code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void send_error(wk_t *w, uint64_t conn, const json_t *id, proto_err_t code,
                       const char *fmt, ...)
{
    wk_out_t *o = calloc(1, sizeof *o);
    if (!o)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    o->kind = WK_OUT_ERROR;
    o->conn = conn;
    o->id = id ? json_deep_copy(id) : NULL;
    o->code = code;
    o->message = strdup(msg);
    push_out(w, o);
}

static void send_ok(wk_t *w, uint64_t conn, const json_t *id, json_t *body)
{
    send_line(w, conn, proto_encode_ok(id, body));
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

static int find_model(const wk_t *w, const char *name)
{
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i] && !w->models[i]->removing && strcmp(w->models[i]->name, name) == 0)
            return i;
    return -1;
}

/* Positions a request of this model may use: max_context, at most what the
 * model was trained for. */
static uint32_t model_context(const wk_model_t *m)
{
    uint32_t train = m->sm->model->hp.n_ctx_train;
    return m->cfg.max_context < train ? m->cfg.max_context : train;
}

static res_cfg_t res_cfg_of(const cfg_model_t *c)
{
    return (res_cfg_t){.gpu_quota = c->gpu_quota, .pinned = c->pinned, .priority = c->priority};
}

static const char *model_state(wk_t *w, wk_model_t *m)
{
    if (!m->sm)
        return "failed";
    stats_res_t st;
    res_model_stats(w->res, m->rm, &st);
    if (res_fully_resident(w->res, m->rm))
        return "resident";
    return st.curr_resident_bytes ? "partial" : "host";
}

/* "q4_k" for GGUF_T_Q4_K: gguf's name in lower case (buf: 16 bytes) */
static const char *type_name(uint32_t t, char *buf)
{
    const char *n = gguf_ttype_name(t);
    size_t i = 0;
    for (; n[i] && i < 15; i++)
        buf[i] = (char)tolower((unsigned char)n[i]);
    buf[i] = 0;
    return buf;
}

/* Loads one configured model into the store and registers it; failures are
 * kept as a 'failed' model with the reason. */
static wk_model_t *load_model(wk_t *w, const cfg_model_t *c)
{
    wk_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->name = strdup(c->name);
    m->cfg = *c;
    if (!m->name) {
        free(m);
        return NULL;
    }
    char err[1024];
    logf_("loading model '%s' from %s", c->name, c->path);
    if (store_load(w->store, c->name, c->path, &m->sm, err, sizeof err) != STORE_OK) {
        logf_("%s:%d: %s", w->cfg->file, c->line, err);
        m->load_error = strdup(err);
        m->sm = NULL;
        return m;
    }
    res_cfg_t rc = res_cfg_of(c);
    if (res_add(w->res, m->sm, &rc, &m->rm, err, sizeof err) != RES_OK) {
        logf_("%s:%d: %s", w->cfg->file, c->line, err);
        m->load_error = strdup(err);
        store_unload(w->store, m->sm);
        m->sm = NULL;
        return m;
    }
    gguf_str_t tmpl = {0};
    if (gguf_get_str(m->sm->model->gguf, "tokenizer.chat_template", &tmpl) == 0)
        m->chat = chat_detect(tmpl.ptr, tmpl.len);
    m->swap_in_s = (double)m->sm->image_bytes / 10e9;
    if (c->max_context > m->sm->model->hp.n_ctx_train)
        logf_("%s:%d: model '%s': max_context %u lowered to %u, the model's context_length", w->cfg->file,
              c->line, c->name, (unsigned)c->max_context, (unsigned)m->sm->model->hp.n_ctx_train);
    char tn[16];
    logf_("model '%s': %s %s, %.1f M params, %.1f MiB in host RAM, loaded in %.0f ms", c->name,
          model_arch_name(m->sm->model->hp.arch), type_name(m->sm->model->wtype, tn),
          m->sm->model->n_params / 1e6, m->sm->image_bytes / 1048576.0, m->sm->load_ms);
    return m;
}

static void free_model(wk_t *w, wk_model_t *m)
{
    if (!m)
        return;
    if (m->rm)
        res_remove(w->res, m->rm);
    if (m->sm)
        store_unload(w->store, m->sm);
    free(m->load_error);
    free(m->name);
    free(m);
}

static void beat(wk_t *w)
{
    atomic_store(&w->beat_ns, (uint64_t)(now_s() * 1e9));
}

static void load_progress(void *ctx, const char *name, size_t done, size_t total)
{
    beat(ctx); /* a large load is progress too */
    logf_("loading model '%s': %.0f%% (%.1f of %.1f MiB)", name, 100.0 * done / total,
          done / 1048576.0, total / 1048576.0);
}

static sched_cfg_t sched_cfg_of(const cfg_t *c)
{
    return (sched_cfg_t){
        .policy = c->scheduler.policy == CFG_POLICY_FIFO ? SCHED_POLICY_FIFO : SCHED_POLICY_SWAP_AWARE,
        .max_wait_s = c->scheduler.max_wait_ms / 1e3,
        .quantum = c->scheduler.quantum,
        .min_quantum_s = 0.05,
        .queue_limit = c->scheduler.queue_limit,
        .max_queued = c->scheduler.max_queued,
    };
}

static const char *backend_kind(cfg_backend_t b)
{
    switch (b) {
    case CFG_BACKEND_CUDA: return "cuda";
    case CFG_BACKEND_SIM: return "sim";
    case CFG_BACKEND_CPU: return "cpu";
    default: return "auto";
    }
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
    w->t_start = now_s();
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
        store_set_progress(w->store, load_progress, w);
    w->res = res_new(w->be, berr, sizeof berr);
    if (w->res)
        res_set_copy_timeout(w->res, (double)cfg->device.copy_timeout_ms / 1e3);
    sched_cfg_t sc = sched_cfg_of(cfg);
    w->sched = sched_new(&sc, 0);
    w->fwd = fwd_new(w->be);
    if (!w->store || !w->res || !w->sched || !w->fwd) {
        snprintf(err, errlen, "setup failed: %s", berr);
        goto fail;
    }
    char hostmem[32], a[32], b[32];
    if (cfg->device.page_size && w->be->page_size != cfg->device.page_size)
        logf_("device.page_size %s changed to %s (the %s backend's granularity)",
              cfg_format_size(cfg->device.page_size, a, sizeof a), cfg_format_size(w->be->page_size, b, sizeof b),
              w->be->name);
    if (cfg->device.memory && w->be->pool_bytes != cfg->device.memory && !w->be->zero_copy)
        logf_("device.memory %s lowered to %s (whole pages)", cfg_format_size(cfg->device.memory, a, sizeof a),
              cfg_format_size(w->be->pool_bytes, b, sizeof b));
    logf_("%s backend, device pool %.1f MiB in %.0f KiB pages, host budget %s", w->be->name,
          w->be->pool_bytes / 1048576.0, w->be->page_size / 1024.0,
          cfg->host.memory ? cfg_format_size(cfg->host.memory, hostmem, sizeof hostmem) : "unlimited");
    for (size_t i = 0; i < cfg->n_models && w->n_models < WK_MAX_MODELS; i++)
        w->models[w->n_models++] = load_model(w, &cfg->models[i]);
    if (sched_resize(w->sched, w->n_models)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return w;
fail:
    wk_free(w);
    return NULL;
}

/* ------------------------------------------------------------------ sequences */

static void seq_free(wk_t *w, wk_seq_t *s)
{
    if (!s)
        return;
    if (s->kv)
        res_kv_free(w->res, s->kv);
    sampler_free(s->smp);
    json_decref(s->id);
    proto_req_free(&s->req);
    free(s->prompt);
    free(s->text);
    free(s);
}

static void unlink_active(wk_model_t *m, wk_seq_t *s)
{
    wk_seq_t **pp = &m->active;
    while (*pp && *pp != s)
        pp = &(*pp)->next_active;
    if (*pp) {
        *pp = s->next_active;
        m->n_active--;
    }
}

/* Appends n bytes to the generated text (kept NUL-terminated); -1 when out
 * of memory (the text is then left as it was). */
static int text_append(wk_seq_t *s, const char *p, size_t n)
{
    size_t need = s->text_len + n + 1;
    if (need > s->text_cap) {
        size_t nc = need * 2;
        char *nt = realloc(s->text, nc);
        if (!nt)
            return -1;
        s->text = nt;
        s->text_cap = nc;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}

/* Ends a sequence with a done event (and frees it). */
static void seq_finish(wk_t *w, wk_seq_t *s, const char *reason)
{
    wk_model_t *m = w->models[s->model];
    double t = now_s();
    char piece[64];
    int np = tok_stream_flush(&s->ts, piece, sizeof piece);
    if (np > 0 && !s->stopped_on_string)
        text_append(s, piece, (size_t)np);
    if (s->req.stream && s->text_len > s->sent) {
        send_line(w, s->conn, proto_encode_token(s->id, s->text + s->sent, -1));
        s->sent = s->text_len;
    }
    proto_timing_t tm = {
        .queue_ms = ((s->t_admit ? s->t_admit : t) - s->t_arrival) * 1e3,
        .swap_ms = s->swap_s * 1e3,
        .ttft_ms = s->t_first ? (s->t_first - s->t_arrival) * 1e3 : 0,
        .total_ms = (t - s->t_arrival) * 1e3,
        .swapped = s->swapped,
    };
    send_line(w, s->conn, proto_encode_done(s->id, s->text ? s->text : "", reason, s->n_prompt,
                                            s->n_gen, &tm));
    if (strcmp(reason, "cancelled") == 0)
        m->svc.total_cancelled++;
    else
        m->svc.total_completed++;
    stats_hist_add(&m->latency, tm.total_ms);
    stats_hist_add(&m->queue, tm.queue_ms);
    if (s->t_first)
        stats_hist_add(&m->ttft, tm.ttft_ms);
    if (s->state == SEQ_ACTIVE)
        unlink_active(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    if (w->draining)
        w->drain_completed++;
    seq_free(w, s);
}

static void seq_fail(wk_t *w, wk_seq_t *s, proto_err_t code, const char *msg)
{
    wk_model_t *m = w->models[s->model];
    send_error(w, s->conn, s->id, code, "%s", msg);
    m->svc.total_failed++;
    if (s->state == SEQ_ACTIVE)
        unlink_active(m, s);
    else if (s->state == SEQ_QUEUED)
        sched_remove(w->sched, &s->item);
    seq_free(w, s);
}

/* Appends text to the sequence; returns 1 when a stop string ended it. */
static int seq_append(wk_seq_t *s, const char *p, size_t n)
{
    size_t old_len = s->text_len;
    if (text_append(s, p, n))
        return 0;
    for (size_t i = 0; i < s->req.n_stop; i++) {
        /* a stop string may end anywhere in the new bytes: it starts at
         * most strlen(stop) - 1 bytes before them */
        size_t l = strlen(s->req.stop[i]);
        size_t from = old_len >= l ? old_len - l + 1 : 0;
        const char *hit = strstr(s->text + from, s->req.stop[i]);
        if (hit) {
            s->text_len = (size_t)(hit - s->text);
            s->text[s->text_len] = 0;
            s->stopped_on_string = 1;
            return 1;
        }
    }
    return 0;
}

/* How many bytes at the end of the text may still turn into a stop string. */
static size_t holdback(const wk_seq_t *s)
{
    size_t h = 0;
    for (size_t i = 0; i < s->req.n_stop; i++) {
        size_t l = strlen(s->req.stop[i]);
        if (l - 1 > h)
            h = l - 1;
    }
    return h;
}

/* Validates and queues a generate/chat request. */
/* The index of the loaded model a request names, or -1 after answering
 * unknown_model: the message lists the configured models, or says why the
 * named one failed. */
static int named_model(wk_t *w, uint64_t conn, const proto_req_t *req)
{
    int mi = req->model ? find_model(w, req->model) : -1;
    if (mi < 0) {
        char names[1024] = "";
        for (int i = 0; i < w->n_models; i++) {
            if (!w->models[i] || w->models[i]->removing)
                continue;
            if (names[0])
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, w->models[i]->name, sizeof names - strlen(names) - 1);
        }
        send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "no model '%s' (configured: %s)",
                   req->model ? req->model : "", names);
        return -1;
    }
    wk_model_t *m = w->models[mi];
    if (!m->sm) {
        send_error(w, conn, req->id, PROTO_E_UNKNOWN_MODEL, "model '%s' failed to load: %s",
                   m->name, m->load_error ? m->load_error : "?");
        return -1;
    }
    return mi;
}

static void submit_gen(wk_t *w, uint64_t conn, proto_req_t *req)
{
    int mi = named_model(w, conn, req);
    if (mi < 0) {
        proto_req_free(req);
        return;
    }
    wk_model_t *m = w->models[mi];
    if (w->draining) {
        send_error(w, conn, req->id, PROTO_E_SHUTTING_DOWN, "the daemon is draining");
        proto_req_free(req);
        return;
    }
    wk_seq_t *s = calloc(1, sizeof *s);
    if (!s) {
        send_error(w, conn, req->id, PROTO_E_INTERNAL, "out of memory");
        proto_req_free(req);
        return;
    }
    s->req = *req;
    memset(req, 0, sizeof *req);
    s->conn = conn;
    s->id = s->req.id ? json_incref(s->req.id) : NULL;
    s->model = mi;
    s->t_arrival = now_s();
    const model_t *mod = m->sm->model;
    char err[512];
    /* prompt tokens */
    if (s->req.op == PROTO_OP_CHAT || s->req.prompt) {
        char *text = s->req.prompt;
        int add_bos = tok_add_bos(mod->tok), owned = 0;
        if (s->req.op == PROTO_OP_CHAT) {
            if (chat_render(m->chat, s->req.messages, s->req.n_messages, &text, &add_bos, err,
                            sizeof err)) {
                send_error(w, conn, s->id, PROTO_E_BAD_REQUEST, "model '%s': %s", m->name, err);
                seq_free(w, s);
                return;
            }
            owned = 1;
        }
        size_t cap = strlen(text) + 8;
        s->prompt = malloc(cap * sizeof *s->prompt);
        int n = s->prompt ? tok_encode(mod->tok, text, strlen(text), add_bos, 1, s->prompt, cap)
                          : TOK_ERR_NOMEM;
        if (owned)
            free(text);
        if (n < 0) {
            send_error(w, conn, s->id, PROTO_E_INTERNAL, "tokenizer failed (%d)", n);
            seq_free(w, s);
            return;
        }
        s->n_prompt = (uint32_t)n;
    } else {
        s->prompt = malloc((s->req.n_tokens ? s->req.n_tokens : 1) * sizeof *s->prompt);
        if (!s->prompt) {
            send_error(w, conn, s->id, PROTO_E_INTERNAL, "out of memory");
            seq_free(w, s);
            return;
        }
        for (size_t i = 0; i < s->req.n_tokens; i++) {
            if ((uint32_t)s->req.tokens[i] >= mod->hp.n_vocab) {
                send_error(w, conn, s->id, PROTO_E_BAD_REQUEST,
                           "tokens[%zu] = %d is outside the vocabulary of %u", i,
                           s->req.tokens[i], mod->hp.n_vocab);
                seq_free(w, s);
                return;
            }
            s->prompt[i] = s->req.tokens[i];
        }
        s->n_prompt = (uint32_t)s->req.n_tokens;
    }
    if (s->n_prompt == 0) {
        send_error(w, conn, s->id, PROTO_E_BAD_REQUEST, "the prompt is empty");
        seq_free(w, s);
        return;
    }
    s->max_tokens = s->req.has_max_tokens ? (uint32_t)s->req.max_tokens
                                          : (uint32_t)m->cfg.defaults.max_tokens;
    uint32_t ctx = model_context(m);
    if ((uint64_t)s->n_prompt + s->max_tokens > ctx) {
        if (s->n_prompt >= ctx || s->req.has_max_tokens) {
            send_error(w, conn, s->id, PROTO_E_CONTEXT_OVERFLOW,
                       "%u prompt tokens + %u max_tokens exceed the context of %u for model '%s'",
                       s->n_prompt, s->max_tokens, ctx, m->name);
            seq_free(w, s);
            return;
        }
        s->max_tokens = ctx - s->n_prompt; /* the default shrinks to what fits */
    }
    sampler_params_t sp;
    sampler_params_default(&sp);
    sp.temperature = s->req.has_temperature ? s->req.temperature : m->cfg.defaults.temperature;
    sp.top_k = s->req.has_top_k ? s->req.top_k : m->cfg.defaults.top_k;
    sp.top_p = s->req.has_top_p ? s->req.top_p : m->cfg.defaults.top_p;
    sp.min_p = s->req.has_min_p ? s->req.min_p : m->cfg.defaults.min_p;
    sp.repeat_penalty =
        s->req.has_repeat_penalty ? s->req.repeat_penalty : m->cfg.defaults.repeat_penalty;
    sp.seed = s->req.has_seed ? s->req.seed : (uint64_t)(s->t_arrival * 1e9);
    s->smp = sampler_new(&sp, (int32_t)mod->hp.n_vocab, err, sizeof err);
    if (!s->smp) {
        send_error(w, conn, s->id, PROTO_E_BAD_REQUEST, "%s", err);
        seq_free(w, s);
        return;
    }
    for (uint32_t i = 0; i < s->n_prompt; i++)
        sampler_accept(s->smp, s->prompt[i]);
    tok_stream_init(&s->ts, mod->tok, 0);
    if (s->max_tokens == 0) {
        /* nothing to generate: answered at once, never queued */
        m->svc.total_requests++;
        seq_finish(w, s, "length");
        return;
    }
    s->item.model = mi;
    s->item.t_arrival = s->t_arrival;
    s->item.user = s;
    s->state = SEQ_QUEUED;
    if (sched_submit(w->sched, &s->item) != SCHED_OK) {
        send_error(w, conn, s->id, PROTO_E_OVERLOADED,
                   "model '%s' has %u requests queued (limit %u, %u in all)", m->name,
                   sched_queued(w->sched, mi), w->cfg->scheduler.queue_limit,
                   sched_queued_total(w->sched));
        seq_free(w, s);
        return;
    }
    m->svc.total_requests++;
}

/* Every sequence of a connection (queued or active), for cancel. */
static int cancel_where(wk_t *w, uint64_t conn, const json_t *target, int silent)
{
    int found = 0;
    for (int mi = 0; mi < w->n_models; mi++) {
        wk_model_t *m = w->models[mi];
        if (!m)
            continue;
        for (wk_seq_t *s = m->active, *nx; s; s = nx) {
            nx = s->next_active;
            if (s->conn == conn && (!target || (s->id && json_equal(s->id, target)))) {
                found++;
                if (silent) {
                    m->svc.total_cancelled++;
                    unlink_active(m, s);
                    seq_free(w, s);
                } else {
                    seq_finish(w, s, "cancelled");
                }
            }
        }
        for (sched_item_t *it = sched_peek(w->sched, mi), *nx; it; it = nx) {
            nx = it->next;
            wk_seq_t *s = it->user;
            if (s->conn == conn && (!target || (s->id && json_equal(s->id, target)))) {
                found++;
                if (silent) {
                    m->svc.total_cancelled++;
                    sched_remove(w->sched, it);
                    seq_free(w, s);
                } else {
                    seq_finish(w, s, "cancelled");
                }
            }
        }
    }
    return found;
}

/* ------------------------------------------------------------------ reports */

static json_t *svc_json(const wk_model_t *m)
{
    json_t *o = json_object();
#define SVC_JSON(name, help) json_object_set_new(o, #name, json_integer((json_int_t)m->svc.name));
    STATS_SVC_COUNTERS(SVC_JSON)
#undef SVC_JSON
    json_object_set_new(o, "ttft_ms_p50", json_real(stats_hist_quantile(&m->ttft, 0.5)));
    json_object_set_new(o, "ttft_ms_p99", json_real(stats_hist_quantile(&m->ttft, 0.99)));
    json_object_set_new(o, "latency_ms_p50", json_real(stats_hist_quantile(&m->latency, 0.5)));
    json_object_set_new(o, "latency_ms_p99", json_real(stats_hist_quantile(&m->latency, 0.99)));
    json_object_set_new(o, "queue_ms_p99", json_real(stats_hist_quantile(&m->queue, 0.99)));
    return o;
}

static json_t *hist_json(const stats_hist_t *h)
{
    json_t *b = json_array();
    for (int i = 0; i < STATS_HIST_BUCKETS; i++)
        json_array_append_new(b, json_integer((json_int_t)h->b[i]));
    return json_pack("{s:I, s:f, s:o}", "count", (json_int_t)h->n, "sum_ms", h->sum_ms,
                     "buckets", b);
}

/* The stats report (one builder for the admin socket, the CLI and /metrics). */
static json_t *report(wk_t *w)
{
    stats_pool_t ps;
    res_pool_stats(w->res, &ps);
    json_t *pool = json_pack("{s:I, s:I, s:I, s:I}", "page_size", (json_int_t)ps.page_size,
                             "curr_pool_pages", (json_int_t)ps.curr_pool_pages, "curr_pool_used",
                             (json_int_t)ps.curr_pool_used, "curr_pool_free",
                             (json_int_t)ps.curr_pool_free);
    json_t *models = json_object();
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || m->removing)
            continue;
        json_t *o = svc_json(m);
        if (m->rm) {
            stats_res_t st;
            res_model_stats(w->res, m->rm, &st);
#define RES_JSON(name, help) json_object_set_new(o, #name, json_integer((json_int_t)st.name));
            STATS_RES_COUNTERS(RES_JSON)
            STATS_RES_GAUGES(RES_JSON)
#undef RES_JSON
            json_object_set_new(o, "gpu_quota", json_integer((json_int_t)m->cfg.gpu_quota));
            json_object_set_new(o, "weight_bytes", json_integer((json_int_t)m->sm->image_bytes));
        }
        json_object_set_new(o, "state", json_string(model_state(w, m)));
        json_object_set_new(o, "curr_queued", json_integer(sched_queued(w->sched, i)));
        json_object_set_new(o, "curr_active", json_integer(m->n_active));
        json_object_set_new(o, "hist_ttft_ms", hist_json(&m->ttft));
        json_object_set_new(o, "hist_queue_ms", hist_json(&m->queue));
        json_object_set_new(o, "hist_swap_ms", hist_json(&m->swap));
        json_object_set_new(models, m->name, o);
    }
    json_t *server = json_object();
#define SRV_JSON(name, help)                                                                       \
    json_object_set_new(server, #name, json_integer((json_int_t)stats_server.name));
    STATS_SERVER_COUNTERS(SRV_JSON)
#undef SRV_JSON
    for (int e = 1; e < PROTO_E_COUNT && e < 16; e++) {
        char k[64];
        snprintf(k, sizeof k, "total_errors_%s", proto_err_code((proto_err_t)e));
        json_object_set_new(server, k, json_integer((json_int_t)stats_server.errors_by_code[e]));
    }
    return json_pack("{s:f, s:s, s:s, s:o, s:o, s:o}", "uptime_s", now_s() - w->t_start,
                     "backend", w->be->name, "policy",
                     w->cfg->scheduler.policy == CFG_POLICY_FIFO ? "fifo" : "swap-aware", "pool",
                     pool, "models", models, "server", server);
}

static json_t *models_json(wk_t *w, int admin)
{
    json_t *arr = json_array();
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || m->removing)
            continue;
        json_t *o = json_pack("{s:s, s:s}", "name", m->name, "state", model_state(w, m));
        if (m->sm) {
            const model_t *mod = m->sm->model;
            json_object_set_new(o, "arch", json_string(model_arch_name(mod->hp.arch)));
            char tn[16];
            json_object_set_new(o, "type", json_string(type_name(mod->wtype, tn)));
            json_t *tt = json_object();
            for (uint32_t t = 0; t < MODEL_N_TTYPES; t++)
                if (mod->n_tensors_of[t])
                    json_object_set_new(tt, type_name(t, tn), json_integer(mod->n_tensors_of[t]));
            json_object_set_new(o, "tensor_types", tt);
            json_object_set_new(o, "bytes_per_param",
                                json_real(mod->n_params ? (double)mod->weight_bytes / (double)mod->n_params : 0));
            json_object_set_new(o, "params", json_integer((json_int_t)mod->n_params));
            json_object_set_new(o, "context", json_integer(model_context(m)));
        }
        if (admin) {
            json_object_set_new(o, "pinned", json_boolean(m->cfg.pinned));
            json_object_set_new(o, "priority", json_real(m->cfg.priority));
            json_object_set_new(o, "gpu_quota", json_integer((json_int_t)m->cfg.gpu_quota));
            if (m->sm) {
                stats_res_t st;
                res_model_stats(w->res, m->rm, &st);
                json_object_set_new(o, "weight_bytes", json_integer((json_int_t)m->sm->image_bytes));
                json_object_set_new(o, "curr_resident_bytes",
                                    json_integer((json_int_t)st.curr_resident_bytes));
                json_object_set_new(o, "curr_kv_bytes", json_integer((json_int_t)st.curr_kv_bytes));
                json_object_set_new(o, "curr_running", json_integer((json_int_t)m->n_active));
            }
            json_object_set_new(o, "curr_queued", json_integer(sched_queued(w->sched, i)));
            if (m->load_error)
                json_object_set_new(o, "error", json_string(m->load_error));
        }
        json_array_append_new(arr, o);
    }
    return json_pack("{s:o}", "models", arr);
}

/* ------------------------------------------------------------------ admin */

/* The answer for requests a device failure (RES_ERR_*) ended: memory that
 * ran out is worth retrying, anything else is the device's fault. */
static proto_err_t device_error_code(int res_err)
{
    return res_err == RES_ERR_NOMEM || res_err == RES_ERR_NOSPACE ? PROTO_E_OVERLOADED
                                                                   : PROTO_E_INTERNAL;
}

static void admin_op(wk_t *w, uint64_t conn, proto_req_t *req)
{
    char err[512];
    switch (req->op) {
    case PROTO_OP_STATS:
        send_ok(w, conn, req->id, report(w));
        return;
    case PROTO_OP_MODELS:
        send_ok(w, conn, req->id, models_json(w, 1));
        return;
    case PROTO_OP_DRAIN:
        if (!w->draining) {
            w->draining = 1;
            w->drain_conn = conn;
            w->drain_id = req->id ? json_incref(req->id) : NULL;
        }
        return;
    case PROTO_OP_FAULT: {
        if (!w->cfg->device.fault_injection) {
            send_error(w, conn, req->id, PROTO_E_BAD_REQUEST,
                       "fault injection is off (device.fault_injection, backend sim only)");
            return;
        }
        be_fault_t f = {(be_fault_kind_t)req->fault, req->fault_count ? req->fault_count : 1,
                        req->fault_delay_ms};
        if (w->be->inject(w->be->ctx, &f)) {
            send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "the %s backend cannot inject faults",
                       w->be->name);
            return;
        }
        logf_("fault injection: %s, next %u operations, delay %u ms", proto_fault_name(req->fault),
              f.count, f.delay_ms);
        send_ok(w, conn, req->id, json_pack("{s:b}", "armed", req->fault != BE_FAULT_OFF));
        return;
    }
    case PROTO_OP_RELOAD: {
        /* the loop owns config files: ask it, it answers */
        wk_out_t *o = calloc(1, sizeof *o);
        if (o) {
            o->kind = WK_OUT_RELOAD;
            o->conn = conn;
            o->id = req->id ? json_incref(req->id) : NULL;
            push_out(w, o);
        }
        return;
    }
    default:
        break;
    }
    int mi = named_model(w, conn, req);
    if (mi < 0)
        return;
    wk_model_t *m = w->models[mi];
    if (req->op == PROTO_OP_LOAD) {
        if (res_fully_resident(w->res, m->rm)) {
            send_ok(w, conn, req->id,
                    json_pack("{s:s, s:s, s:I, s:f}", "model", m->name, "state", "resident",
                              "bytes", (json_int_t)m->sm->image_bytes, "swap_ms", 0.0));
            return;
        }
        size_t q = m->cfg.gpu_quota;
        if (q && q < m->sm->image_bytes) {
            send_error(w, conn, req->id, PROTO_E_BAD_REQUEST,
                       "model '%s' (%.1f MiB) cannot be resident within its gpu_quota of %.1f MiB",
                       m->name, m->sm->image_bytes / 1048576.0, q / 1048576.0);
            return;
        }
        int prc = res_prefetch(w->res, m->rm, 1, err, sizeof err);
        if (prc) {
            send_error(w, conn, req->id, device_error_code(prc), "%s", err);
            return;
        }
        wk_load_t *l = calloc(1, sizeof *l);
        if (!l)
            return;
        l->model = mi;
        l->conn = conn;
        l->id = req->id ? json_incref(req->id) : NULL;
        l->stream = req->stream;
        l->t0 = now_s();
        stats_res_t st;
        res_model_stats(w->res, m->rm, &st);
        l->device_errors = st.total_device_errors;
        l->next = w->loads;
        w->loads = l;
        return;
    }
    if (req->op == PROTO_OP_EVICT) {
        if (m->cfg.pinned) {
            send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "model '%s' is pinned: unpin it first",
                       m->name);
            return;
        }
        stats_res_t a, b;
        res_model_stats(w->res, m->rm, &a);
        if (res_evict(w->res, m->rm, RES_CAUSE_ADMIN, 0) == RES_ERR_BUSY) {
            send_error(w, conn, req->id, PROTO_E_OVERLOADED, "model '%s' has running work",
                       m->name);
            return;
        }
        res_model_stats(w->res, m->rm, &b);
        send_ok(w, conn, req->id,
                json_pack("{s:s, s:I}", "model", m->name, "bytes_evicted",
                          (json_int_t)(b.total_bytes_evicted - a.total_bytes_evicted)));
        return;
    }
    if (req->op == PROTO_OP_PIN || req->op == PROTO_OP_UNPIN) {
        m->cfg.pinned = req->op == PROTO_OP_PIN;
        res_cfg_t rc = res_cfg_of(&m->cfg);
        res_set_cfg(w->res, m->rm, &rc, err, sizeof err);
        send_ok(w, conn, req->id,
                json_pack("{s:s, s:b}", "model", m->name, "pinned", m->cfg.pinned));
        return;
    }
    send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "op not accepted here");
}

/* Device failures an admin load retries through before it gives up. */
#define WK_LOAD_RETRIES 3

static void poll_loads(wk_t *w)
{
    for (wk_load_t **pp = &w->loads; *pp;) {
        wk_load_t *l = *pp;
        wk_model_t *m = l->model < w->n_models ? w->models[l->model] : NULL;
        if (!m || !m->rm) {
            send_error(w, l->conn, l->id, PROTO_E_UNKNOWN_MODEL, "the model went away");
        } else if (res_fully_resident(w->res, m->rm)) {
            double ms = (now_s() - l->t0) * 1e3;
            send_ok(w, l->conn, l->id,
                    json_pack("{s:s, s:s, s:I, s:f}", "model", m->name, "state", "resident",
                              "bytes", (json_int_t)m->sm->image_bytes, "swap_ms", ms));
        } else {
            stats_res_t st;
            res_model_stats(w->res, m->rm, &st);
            if (l->stream && st.curr_resident_bytes != l->last_bytes) {
                l->last_bytes = st.curr_resident_bytes;
                send_line(w, l->conn, proto_encode_progress(l->id, m->name, l->last_bytes,
                                                            m->sm->image_bytes));
            }
            /* not all queued (pool held by others, or a copy failed and
             * was dropped): try again, a few times for device failures */
            char err[256];
            const char *why = NULL;
            if (st.total_device_errors - l->device_errors >= WK_LOAD_RETRIES)
                res_last_error(m->rm, &why);
            else if (res_prefetch(w->res, m->rm, 1, err, sizeof err))
                res_last_error(m->rm, &why);
            if (!why) {
                pp = &l->next;
                continue;
            }
            send_error(w, l->conn, l->id, PROTO_E_INTERNAL, "%s", *why ? why : err);
        }
        *pp = l->next;
        json_decref(l->id);
        free(l);
    }
}

/* ------------------------------------------------------------------ inbox */

static void handle_req(wk_t *w, uint64_t conn, int admin, proto_req_t *req)
{
    if (admin) {
        admin_op(w, conn, req);
        proto_req_free(req);
        return;
    }
    switch (req->op) {
    case PROTO_OP_GENERATE:
    case PROTO_OP_CHAT:
        submit_gen(w, conn, req);
        return;
    case PROTO_OP_MODELS:
        send_ok(w, conn, req->id, models_json(w, 0));
        break;
    case PROTO_OP_CANCEL: {
        int found = cancel_where(w, conn, req->target_id, 0);
        send_ok(w, conn, req->id, json_pack("{s:b}", "found", found > 0));
        break;
    }
    case PROTO_OP_TOKENIZE: {
        int mi = named_model(w, conn, req);
        if (mi < 0)
            break;
        const tok_t *t = w->models[mi]->sm->model->tok;
        size_t len = strlen(req->text), cap = len + 8;
        int32_t *ids = malloc(cap * sizeof *ids);
        int n = ids ? tok_encode(t, req->text, len, req->add_bos && tok_add_bos(t), 1, ids, cap)
                    : TOK_ERR_NOMEM;
        if (n < 0) {
            send_error(w, conn, req->id, PROTO_E_INTERNAL, "tokenizer failed (%d)", n);
        } else {
            json_t *arr = json_array();
            for (int i = 0; i < n; i++)
                json_array_append_new(arr, json_integer(ids[i]));
            send_ok(w, conn, req->id, json_pack("{s:o}", "tokens", arr));
        }
        free(ids);
        break;
    }
    default:
        send_error(w, conn, req->id, PROTO_E_BAD_REQUEST, "op not accepted on this socket");
        break;
    }
    proto_req_free(req);
}

static void apply_reload(wk_t *w, const cfg_t *next)
{
    w->cfg = next;
    sched_cfg_t sc = sched_cfg_of(next);
    sched_set_cfg(w->sched, &sc);
    /* removed models: drop queued requests (cancelled), remove when idle */
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m)
            continue;
        const cfg_model_t *c = cfg_find_model(next, m->name);
        if (!c) {
            m->removing = 1;
            for (sched_item_t *it = sched_peek(w->sched, i), *nx; it; it = nx) {
                nx = it->next;
                wk_seq_t *sq = it->user;
                m->svc.total_cancelled++;
                send_error(w, sq->conn, sq->id, PROTO_E_CANCELLED,
                           "model '%s' was removed by a reload before this request started",
                           m->name);
                sched_remove(w->sched, it);
                seq_free(w, sq);
            }
            continue;
        }
        if (!m->sm) {
            /* it failed to load: try again (the file may have been fixed) */
            free_model(w, m);
            w->models[i] = load_model(w, c);
            continue;
        }
        m->cfg = *c;
        if (m->rm) {
            res_cfg_t rc = res_cfg_of(c);
            char err[256];
            res_set_cfg(w->res, m->rm, &rc, err, sizeof err);
        }
    }
    for (size_t j = 0; j < next->n_models && w->n_models < WK_MAX_MODELS; j++)
        if (find_model(w, next->models[j].name) < 0)
            w->models[w->n_models++] = load_model(w, &next->models[j]);
    sched_resize(w->sched, w->n_models);
    /* the old cfg's strings are no longer referenced: point names at ours */
    for (int i = 0; i < w->n_models; i++)
        if (w->models[i] && !w->models[i]->removing) {
            const cfg_model_t *c = cfg_find_model(next, w->models[i]->name);
            if (c)
                w->models[i]->cfg = *c;
        }
}

static void reap_removed(wk_t *w)
{
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (m && m->removing && m->n_active == 0 && sched_queued(w->sched, i) == 0) {
            logf_("model '%s' removed", m->name);
            free_model(w, m);
            w->models[i] = NULL;
        }
    }
}

static void process_inbox(wk_t *w, wk_in_t *in)
{
    while (in) {
        wk_in_t *nx = in->next;
        switch (in->kind) {
        case IN_REQ: handle_req(w, in->conn, in->admin, &in->req); break;
        case IN_CANCEL_CONN: cancel_where(w, in->conn, NULL, 1); break;
        case IN_RELOAD: apply_reload(w, in->cfg); break;
        case IN_DRAIN: w->draining = 1; break;
        }
        free(in);
        in = nx;
    }
}

/* ------------------------------------------------------------------ steps */

typedef struct timed_hooks {
    fwd_hooks_t inner;
    wk_t *w;
    double waited; /* seconds blocked in waits */
} timed_hooks_t;

static int timed_wait(void *ctx, uint32_t seg)
{
    timed_hooks_t *h = ctx;
    double t0 = now_s();
    beat(h->w); /* a long pass still shows progress segment by segment */
    int rc = h->inner.wait(h->inner.ctx, seg);
    h->waited += now_s() - t0;
    beat(h->w);
    return rc;
}

static uint32_t active_total(const wk_t *w)
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

/* One forward pass for a model: admit new sequences, run them with the
 * active ones, sample, stream, finish. */
static void step(wk_t *w, int mi, uint32_t admit)
{
    wk_model_t *m = w->models[mi];
    const model_t *mod = m->sm->model;
    char err[512];
    stats_res_t before;
    res_model_stats(w->res, m->rm, &before);
    int arc = res_acquire(w->res, m->rm, err, sizeof err);
    if (arc) {
        /* the model could not be paged in: what was to run now fails (the
         * active sequences and those this pass would admit); the rest stay
         * queued for a later pass, and other models go on */
        proto_err_t code = device_error_code(arc);
        for (wk_seq_t *s = m->active, *nx; s; s = nx) {
            nx = s->next_active;
            seq_fail(w, s, code, err);
        }
        for (uint32_t k = 0; k < admit; k++) {
            sched_item_t *it = sched_peek(w->sched, mi);
            if (!it)
                break;
            seq_fail(w, it->user, code, err);
        }
        return;
    }
    uint32_t ctx = model_context(m);
    /* admit: a KV cache each; stop at the first that does not fit now */
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
            if (active_total(w) == 0 && !fresh) {
                /* nothing else holds KV memory: this request can never fit */
                sched_pop(w->sched, mi);
                seq_fail(w, s, PROTO_E_OVERLOADED, err);
                continue;
            }
            break;
        }
        sched_pop(w->sched, mi);
        s->state = SEQ_ACTIVE;
        s->t_admit = now_s();
        *fresh_tail = s;
        fresh_tail = &s->next_active;
    }
    /* grow active caches by one position */
    for (wk_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next_active;
        if (res_kv_ensure(w->res, s->kv, s->kv->n_past + 1, err, sizeof err))
            seq_fail(w, s, PROTO_E_OVERLOADED, err);
    }
    /* join: fresh ones become active */
    if (fresh) {
        *fresh_tail = m->active;
        m->active = fresh;
    }
    uint32_t n = 0;
    for (wk_seq_t *s = m->active; s; s = s->next_active)
        n++;
    m->n_active = n;
    if (n == 0) {
        res_release(w->res, m->rm);
        return;
    }
    fwd_seq_t *fs = calloc(n, sizeof *fs);
    wk_seq_t **order = calloc(n, sizeof *order);
    float *logits = malloc((size_t)n * mod->hp.n_vocab * sizeof(float));
    if (!fs || !order || !logits) {
        free(fs);
        free(order);
        free(logits);
        res_release(w->res, m->rm);
        return;
    }
    uint32_t i = 0;
    for (wk_seq_t *s = m->active; s; s = s->next_active, i++) {
        order[i] = s;
        int prefill = s->kv->n_past == 0;
        fs[i] = (fwd_seq_t){s->kv, prefill ? s->prompt : &s->last, prefill ? s->n_prompt : 1,
                            logits + (size_t)i * mod->hp.n_vocab};
        if (prefill)
            m->svc.total_prompt_tokens += s->n_prompt;
    }
    timed_hooks_t th = {.inner = res_hooks(m->rm), .w = w};
    fwd_hooks_t hooks = {.wait = timed_wait, .ctx = &th};
    int rc = fwd_run(w->fwd, &mod->hp, res_weights(m->rm), fs, (int)n, &hooks, err, sizeof err);
    res_release(w->res, m->rm);
    stats_res_t after;
    res_model_stats(w->res, m->rm, &after);
    int paged = after.total_bytes_in != before.total_bytes_in;
    if (paged && res_fully_resident(w->res, m->rm) && after.total_copy_ns > before.total_copy_ns)
        m->swap_in_s = (double)m->sm->image_bytes / (double)(after.total_bytes_in -
                       before.total_bytes_in) * (after.total_copy_ns - before.total_copy_ns) / 1e9;
    if (paged)
        stats_hist_add(&m->swap, th.waited * 1e3);
    m->svc.total_steps++;
    double t = now_s();
    for (i = 0; i < n; i++) {
        wk_seq_t *s = order[i];
        if (rc) {
            const char *why;
            int rerr = res_last_error(m->rm, &why);
            if (rerr && i == 0)
                snprintf(err, sizeof err, "%s", why);
            seq_fail(w, s, rc == FWD_ERR_CONTEXT ? PROTO_E_CONTEXT_OVERFLOW
                     : rerr ? device_error_code(rerr) : PROTO_E_INTERNAL, err);
            continue;
        }
        s->swap_s += th.waited;
        if (s->n_gen == 0 && paged) {
            s->swapped = 1;
            m->svc.total_swapped_requests++;
        }
        int32_t id = sampler_sample(s->smp, fs[i].logits);
        s->last = id;
        s->n_gen++;
        m->svc.total_generated_tokens++;
        if (!s->t_first)
            s->t_first = t;
        int eog = tok_is_eog(mod->tok, id);
        char piece[256];
        int np = eog ? 0 : tok_stream_feed(&s->ts, id, piece, sizeof piece);
        int stop = np > 0 && seq_append(s, piece, (size_t)np);
        if (s->req.stream && !stop) {
            size_t hold = holdback(s);
            if (s->text_len > s->sent + hold) {
                size_t upto = s->text_len - hold;
                /* never split a UTF-8 character between two events */
                while (upto > s->sent && ((unsigned char)s->text[upto] & 0xC0) == 0x80)
                    upto--;
                char saved = s->text[upto];
                s->text[upto] = 0;
                send_line(w, s->conn, proto_encode_token(s->id, s->text + s->sent, id));
                s->text[upto] = saved;
                s->sent = upto;
            }
        }
        if (stop)
            seq_finish(w, s, "stop");
        else if (eog)
            seq_finish(w, s, "eos");
        else if (s->n_gen >= s->max_tokens)
            seq_finish(w, s, "length");
    }
    free(fs);
    free(order);
    free(logits);
}

static uint32_t in_flight(const wk_t *w)
{
    return sched_queued_total(w->sched) + active_total(w);
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
    char buf[256];
    snprintf(buf, sizeof buf, "%d models (%d resident), pool %llu/%llu pages used, %u in flight%s",
             loaded, resident, (unsigned long long)ps.curr_pool_used,
             (unsigned long long)ps.curr_pool_pages, in_flight(w), w->draining ? ", draining" : "");
    pthread_mutex_lock(&w->mu);
    memcpy(w->status, buf, sizeof buf);
    w->draining_pub = w->draining;
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg)
{
    wk_t *w = arg;
    sched_model_view_t views[WK_MAX_MODELS];
    for (;;) {
        beat(w);
        pthread_mutex_lock(&w->mu);
        int idle = in_flight(w) == 0 && !w->loads;
        if (idle && !w->in_head && !w->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += WK_IDLE_WAIT_MS * 1000000L;
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
            process_inbox(w, in);
            break;
        }
        process_inbox(w, in);
        if (w->loads)
            poll_loads(w);
        uint32_t n_active_all = active_total(w);
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
        sched_plan_t plan;
        sched_next(w->sched, now_s(), views, &plan);
        if (plan.model >= 0)
            step(w, plan.model, plan.admit);
        if (plan.prefetch >= 0 && w->models[plan.prefetch] && w->models[plan.prefetch]->rm) {
            char err[256];
            res_prefetch(w->res, w->models[plan.prefetch]->rm, 0, err, sizeof err);
        }
        reap_removed(w);
        update_status(w);
        if (w->draining && in_flight(w) == 0 && !w->drain_told) {
            w->drain_told = 1;
            if (w->drain_conn)
                send_ok(w, w->drain_conn, w->drain_id,
                        json_pack("{s:I}", "completed", (json_int_t)w->drain_completed));
            wk_out_t *o = calloc(1, sizeof *o);
            if (o) {
                o->kind = WK_OUT_IDLE;
                push_out(w, o);
            }
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ loop side */

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
    push_in(w, in);
}

void wk_drain(wk_t *w)
{
    wk_in_t *in = calloc(1, sizeof *in);
    if (!in)
        return;
    in->kind = IN_DRAIN;
    push_in(w, in);
}

double wk_stalled_s(wk_t *w)
{
    double t = (double)atomic_load(&w->beat_ns) / 1e9;
    return t > 0 ? now_s() - t : 0;
}

void wk_status(wk_t *w, char *buf, size_t len)
{
    pthread_mutex_lock(&w->mu);
    snprintf(buf, len, "%s", w->status[0] ? w->status : "starting");
    pthread_mutex_unlock(&w->mu);
}

int wk_draining(wk_t *w)
{
    pthread_mutex_lock(&w->mu);
    int d = w->draining_pub;
    pthread_mutex_unlock(&w->mu);
    return d;
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
            seq_free(w, s);
        }
        if (w->sched)
            for (sched_item_t *it; (it = sched_pop(w->sched, i));)
                seq_free(w, it->user);
        free_model(w, m);
    }
    for (wk_out_t *o = w->out_head, *nx; o; o = nx) {
        nx = o->next;
        wk_out_free(o);
    }
    json_decref(w->drain_id);
    fwd_free(w->fwd);
    sched_free(w->sched);
    res_free(w->res);
    store_free(w->store);
    be_close(w->be);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* worker_int: the worker's private types and the functions its files (worker*.c) share; not for other modules. */
#ifndef WORKER_INT_H
#define WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/log.h"
#include "base/util.h"
#include "engine/chat.h"
#include "engine/chat_tools.h"
#include "engine/constrain.h"
#include "engine/forward.h"
#include "engine/lora.h"
#include "residency.h"
#include "engine/sampler.h"
#include "passtime.h"
#include "prefix.h"
#include "scheduler.h"
#include "stats.h"
#include "store.h"
#include "engine/tokenizer.h"
#include "worker.h"

#define WK_MAX_MODELS 256
#define WK_IDLE_WAIT_MS 200

typedef enum seq_state {
    SEQ_NEW = 0,
    SEQ_QUEUED,
    SEQ_ACTIVE
} seq_state_t;

/* The sibling sequences of one request with n > 1 (one per choice), shared by them. */
typedef struct wk_group {
    uint32_t n;         /* choices */
    uint32_t left;      /* choices not yet ended */
    uint32_t refs;      /* sequences still holding it */
    uint32_t generated; /* tokens of the choices ended so far */
    int failed;         /* an error was sent: the others end without a word */
} wk_group_t;

/* wk_seq_t.tools: the tool calls its output may hold (docs/TOOLS.md). */
enum {
    WK_TOOLS_OFF = 0, /* none: the text is content */
    WK_TOOLS_BLOCKS,  /* tool_choice auto, native syntax: <tool_call> blocks parsed at the end,
                         the text from the first one on held back from the stream */
    WK_TOOLS_FORCED,  /* required or named: the whole output is one call's JSON (constrained),
                         held back from the stream */
    WK_TOOLS_JSON,    /* tool_choice auto, Llama 3.x: the whole output may be one call's JSON,
                         held back from the stream while it starts with "{" (or only spaces) */
};

/* A LoRA adapter (a models[] entry with base and adapter: worker_lora.c): its own name in every
 * API, its requests queued and stepped with its base's, each sequence carrying its pairs. */
typedef struct wk_adapter {
    char *name;
    cfg_model_t cfg;    /* copy; strings point into the worker's current cfg */
    lora_t *lora;       /* opened against its base's model; NULL while not loaded */
    uint64_t on;        /* the serial of the base load it was opened against (or failed
                           on); 0 = none */
    lora_weights_t dev; /* lora->w rebased onto its device copy (att): what the passes read */
    void *img;          /* every pair packed (host RAM, be->host_alloc): what its page-ins copy;
                           NULL on zero-copy (the pairs are read where they are); owned */
    size_t img_bytes;   /* bytes of img */
    res_att_t *att;     /* its residency unit, attached to its base's (NULL while not loaded) */
    char *load_error;   /* why it is 'failed' (a bad file); NULL otherwise */
    int removing;       /* gone from the config (or changed): dropped once refs is 0 */
    uint32_t refs;      /* its sequences, queued and admitted (each holds att) */
    stats_adapter_t st; /* its counters (those of its residency come from att) */
} wk_adapter_t;

typedef struct wk_seq {
    sched_item_t item; /* first: sched items are sequences */
    uint64_t conn;
    json_t *id;
    proto_req_t req;
    int model;
    wk_adapter_t *adapter; /* the adapter its request named (holds a ref), or NULL: the base */
    int lora_wait;         /* its adapter's page-in has not landed: it sits this pass out */
    seq_state_t state;
    int32_t *prompt;
    uint32_t n_prompt, max_tokens, n_gen;
    kv_seq_t *kv;
    sampler_t *smp;
    cons_t *cons; /* response_format's matcher: masks each step's logits; NULL = free text */
    tok_stream_t ts;
    char *text; /* generated text so far (NUL-terminated) */
    size_t text_len, text_cap;
    size_t sent;  /* bytes of text already streamed */
    int32_t last; /* token to feed next step */
    int32_t *gen; /* the n_gen ids generated so far (gen_cap room): a parked
                               sequence's cache is rebuilt by prefilling prompt + gen */
    uint32_t gen_cap;
    int32_t *redo; /* prompt + gen (n_redo ids) for the pass that rebuilds its cache */
    uint32_t n_redo;
    int parked; /* its KV cache was given back when the pool ran short: it
                               stays active, without a cache, until the pages are back */
    int stopped_on_string;
    int tools;                      /* WK_TOOLS_*: how its output is read for tool calls */
    chat_tools_style_t tools_style; /* the syntax its prompt was rendered in (seq_tools) */
    chat_tools_stream_t *calls;     /* its output read for tool calls as it grows; owned, NULL
                                       when tools is WK_TOOLS_OFF */
    uint64_t pfx_seed;     /* its prefix cache chain's seed: model, API key or cache_salt */
    uint32_t pfx_hint;     /* prompt tokens a cached prefix covered when it arrived (its cost) */
    uint32_t n_cached;     /* prompt tokens its KV cache got from a cached prefix, not prefilled */
    res_restore_t restore; /* a cached prefix copied back from host RAM, in flight: it runs
                              once both copies land (n_cached positions), else recomputes */
    double t_arrival;      /* wk_now() when the loop received the request */
    double t_deadline;     /* wk_now() its first token is due by (arrival + its deadline); 0 =
                              none (worker_deadline.c) */
    double dl_predicted;   /* s from arrival to its first token as predicted on arrival; < 0 =
                              not predicted */
    double t_admit;        /* when its first pass started (it got its KV cache) */
    double t_first;        /* when its first token was sampled */
    double swap_s;         /* s its first token was held up by its model's page-in: waiting
                               for it before the first pass, and on copies within that pass */
    double swap_wait_s;    /* the part of swap_s before its first pass */
    int swapped;           /* it waited for a page-in (swap_s counts) */
    uint32_t index;        /* its choice in its request (n > 1), else 0 */
    wk_group_t *grp;       /* its siblings' shared count (n > 1), else NULL */
    size_t echo_len;       /* bytes of text that are the echoed prompt (stop strings start after) */
    json_t *lp;            /* logprobs: the entries of its tokens so far (array; without stream) */
    float *raw;            /* logprobs: (n_vocab) the step's logits as the model gave them */
    struct wk_seq *next_active;
} wk_seq_t;

typedef struct wk_model {
    char *name;
    cfg_model_t cfg; /* copy; strings point into the worker's current cfg */
    store_model_t *sm;
    res_model_t *rm;
    chat_family_t chat;
    chat_tools_style_t tools; /* its template's tool-call syntax (chat_tools_detect) */
    struct wk *w;             /* its worker (the prefix cache's callbacks) */
    pfx_t *pfx;               /* its prefix cache (worker_pfx.c), NULL until a sequence is kept */
    char *load_error;         /* why it is 'failed' */
    uint64_t serial;          /* this load's number (1, 2, ...): what its adapters follow */
    wk_seq_t *active;         /* admitted sequences */
    uint32_t n_active;
    double swap_in_s;       /* last measured full page-in time */
    double paging_since;    /* wk_now() when its current page-in started (0 = none): it is on
                               the copy engine and the model cannot run yet */
    int paging_evict;       /* what that page-in may evict (RES_EVICT_*) */
    uint64_t paging_errors; /* its total_device_errors when the page-in started */
    int paging_inflight;    /* segments in flight when last looked, -1 = not yet */
    double paging_moved;    /* when that count last changed (copy timeout) */
    int paging_queued;      /* its last poll found every copy it needs queued, landing before
                               the next round (sched view.queued) */
    pass_time_t pass;       /* its passes' compute, measured (passtime.h) */
    sched_gap_t gap;        /* its admission gap (deadlines: the wait per request ahead) */
    double last_step;       /* wk_now() when its last pass ended (0 = never) */
    int removing;           /* gone from the config: drop once idle */
    int loading;            /* being read into host RAM (wk_model_load): state 'loading' */
    stats_svc_t svc;
    stats_hists_t hist;       /* latency histograms (stats.h STATS_HISTS) */
    cons_vocab_t *cons_vocab; /* its token-byte trie, built on the first constrained request */
} wk_model_t;

typedef enum in_kind {
    IN_REQ = 1,
    IN_CANCEL_CONN,
    IN_RELOAD,
    IN_DRAIN
} in_kind_t;

typedef struct wk_in {
    in_kind_t kind;
    double t_recv; /* wk_now() when the loop handed it over */
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
    double t0; /* when the load request was received */
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
    fwd_t *fwd_aside;    /* for passes stepped while another pass waits for a copy */
    int aside;           /* such a pass is running (steps aside do not nest) */
    uint32_t stall_left; /* admin fault "stall": passes left that first sleep stall_ms */
    uint32_t stall_ms;
    wk_model_t *models[WK_MAX_MODELS];
    int n_models;            /* slots used (some may be NULL after reloads) */
    wk_model_t *loading;     /* the model wk_model_load is reading, maybe not in models[] yet */
    wk_adapter_t **adapters; /* LoRA adapters (worker_lora.c), cap_adapters slots; owned */
    int n_adapters;          /* slots used (some may be NULL after reloads) */
    int cap_adapters;
    uint64_t n_loads; /* models loaded so far (wk_model_t.serial) */
    int lora_dirty;  /* an adapter or a base may have come or gone: wk_lora_sync at the next reap */
    int load_decile; /* tenths of it logged so far */
    wk_load_t *loads;
    double t_start;
    double nap_s;             /* how long the loop may sleep before the next round (0 = none) */
    uint64_t n_tool_calls;    /* tool calls answered so far: their ids' serial */
    cons_cache_t *cons_cache; /* compiled response_format schemas (made on first use) */

    pthread_t thread;
    int started;
    pthread_mutex_t mu; /* inbox, outbox, stop, status */
    pthread_cond_t cv;
    wk_in_t *in_head, *in_tail;
    wk_out_t *out_head, *out_tail;
    int stop;
    wk_notify_fn notify;
    void *notify_ctx;
    const char *extra_name;         /* (optional) a section the stats report adds: its name, */
    json_t *(*extra_fn)(void *ctx); /* the builder (worker thread; returns a new object) */
    void *extra_ctx;
    char status[256];
    char ready_why[256];      /* readiness reason for wk_readiness, under mu */
    _Atomic int draining_pub; /* a drain was handed over (loop or worker side): wk_draining */
    _Atomic int leaving_pub;  /* readiness off ahead of the drain: wk_leave */
    _Atomic int ready_pub;    /* wk_ready_t published by the worker after each round */
    _Atomic int reload_pub;   /* reloads handed over by the loop, not yet applied by the worker */

    int draining;
    uint64_t drain_conn;
    json_t *drain_id;
    uint64_t drain_completed;
    int drain_told;
};
/*
 * The worker's files, each calling only those after it in this list (make check's file rule
 * keeps it; none calls back up):
 *   worker_loop.c    the thread, the inbox, readiness (the public face, worker.h)
 *   worker_admin.c   model loads and frees, admin operations, reloads
 *   worker_req.c     admission of client requests, cancel, models, tokenize
 *   worker_step.c    a scheduling round: views, page-ins, one model's pass
 *   worker_deadline.c  first-token deadlines: predictions, refusals on arrival and in the queue
 *   worker_report.c  the stats and models reports
 *   worker_lora.c    LoRA adapters: loaded beside their base, lookups, reports, reloads
 *   worker_seq.c     a sequence's tokens and end
 *   worker_pfx.c     the prefix cache: reuse at admission, a finished sequence kept
 *   worker.c         the core: clock, heartbeat, outbox and sink, lookups, counts
 */

/* ------------------------------------------------------------------ worker.c (core) */

/* "q4_k" for GGUF_T_Q4_K: gguf's name in lower case, written into buf (16 bytes) */
const char *wk_type_name(uint32_t t, char *buf);
double wk_now(void);   /* CLOCK_MONOTONIC seconds */
void wk_beat(wk_t *w); /* the worker shows progress (watchdog) */
/* Outbox: each call queues one item for the loop and wakes it. */
void wk_push_out(wk_t *w, wk_out_t *o);
/* The worker's sink: every answer leaves as one event (wk_event.h) for the
 * loop's front ends to encode. Takes what ev owns and zeroes it (released
 * if it cannot be queued). */
void wk_emit(wk_t *w, wk_event_t *ev);
/* An ERROR event for conn, tagged with a copy of id. */
void wk_send_error(wk_t *w, uint64_t conn, const json_t *id, proto_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A RESULT event: body (taken; an object, or NULL for none) tagged with a copy
 * of id; a body that is not an object is dropped, and nothing is sent. */
void wk_send_ok(wk_t *w, uint64_t conn, const json_t *id, json_t *body);
/* An overloaded ERROR event that says when to try again (retry_ms, retry_after_ms on the wire). */
void wk_send_retry(wk_t *w, uint64_t conn, const json_t *id, uint32_t retry_ms, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));
int wk_find_model(const wk_t *w, const char *name);
uint32_t wk_model_context(const wk_model_t *m);
res_cfg_t wk_res_cfg_of(const cfg_model_t *c);
sched_cfg_t wk_sched_cfg_of(const cfg_t *c);
/* Whether req's API key (req->allow, set by the server) may use model name. */
int wk_allowed(const proto_req_t *req, const char *name);
/* The index of the loaded model a request names, or -1 after answering
 * unknown_model: the message lists the configured models (those the key may
 * use), or says why the named one failed. */
int wk_named_model(wk_t *w, uint64_t conn, const proto_req_t *req);
/* The answer for requests a device failure (RES_ERR_*) ended. */
proto_err_t wk_device_error_code(int res_err);
uint32_t wk_active_total(const wk_t *w); /* admitted sequences, every model */
uint32_t wk_in_flight(const wk_t *w);    /* queued + admitted */

/* ------------------------------------------------------------------ worker_pfx.c */

/* Drops m's prefix cache (its KV caches back to the pool); before its res_remove. */
void wk_pfx_close(wk_model_t *m);
/* Whether s may reuse and leave cached prefixes (on for m, and s did not opt out). */
int wk_pfx_wanted(const wk_t *w, const wk_model_t *m, const wk_seq_t *s);
/* s->pfx_seed from m's name (its adapter's, where it has one), s's API key and its cache_salt. */
void wk_pfx_seed(const wk_model_t *m, wk_seq_t *s);
/* Prompt tokens of s a cached prefix would cover now (the scheduler's cost of its prefill). */
uint32_t wk_pfx_hint(wk_t *w, wk_model_t *m, const wk_seq_t *s);
/* 1 when s should wait a pass: one of fresh (admitted in this pass) prefills a longer prefix it
 * shares than any s could reuse now. */
int wk_pfx_wait(wk_t *w, wk_model_t *m, const wk_seq_t *s, const wk_seq_t *fresh);
/* s's KV cache for admission (n_ctx positions, its prompt's pages mapped): a cached entry
 * adopted, or a new one with the longest shared prefix copied in (s->n_cached, kv->n_past);
 * a RES_ERR_* code and err otherwise (s->kv, if set, is the caller's to free). */
int wk_pfx_admit(wk_t *w, wk_model_t *m, wk_seq_t *s, const wk_seq_t *fresh, uint32_t n_ctx,
                 char *err, size_t errlen);
/* s ends normally: its KV cache (s->kv, then NULL) stays cached for a later prefix, if kept. */
void wk_pfx_keep(wk_t *w, wk_seq_t *s);
/* What the host tier may hold now: host.kv_cache, within what host.memory leaves the models. */
size_t wk_kv_host_budget(const wk_t *w);

/* ------------------------------------------------------------------ worker_lora.c */

/* The adapter called name (not removing), or NULL. */
wk_adapter_t *wk_lora_find(const wk_t *w, const char *name);
/* Whether a request may run on adapter a now: 1, else 0 after answering unknown_model (it failed
 * to load, or its base is not loaded). */
int wk_lora_usable(wk_t *w, uint64_t conn, const proto_req_t *req, wk_adapter_t *a);
/* The config's adapters made to match cfg (NULL: as they are): new ones added, removed or changed
 * ones dropped once no sequence holds them, each loaded while its base is in host RAM and unloaded
 * when the base goes or loads again (they follow it). After the start, reloads and reaps. */
void wk_lora_sync(wk_t *w, const cfg_t *cfg);
/* Takes (delta +1) or drops (-1) a sequence's reference to a (holding its device copy);
 * returns the references left. */
uint32_t wk_lora_ref(wk_adapter_t *a, int delta);
/* Pages s's adapter (if any) in: its pages mapped and its copy queued unless they are (a use,
 * for its recency). RES_OK, RES_ERR_NOSPACE (no room now), else another RES_ERR_* (err). */
int wk_lora_page(wk_t *w, wk_seq_t *s, char *err, size_t errlen);
/* Whether s's adapter (if any) is on the device for s's next pass: 1 yes; 0 s waits (its
 * page-in is queued now if it was not, or the pool has no room for it yet); -1 it never will
 * be (err says why). A use, for its recency. */
int wk_lora_ready(wk_t *w, wk_seq_t *s, char *err, size_t errlen);
/* Base m leaves (wk_model_free): its adapters' device copies go first. */
void wk_lora_detach(wk_t *w, const wk_model_t *m);
/* The adapters' entries of the models list and the stats report. */
void wk_lora_report_models(wk_t *w, json_t *arr, int admin);
json_t *wk_lora_report_stats(wk_t *w);
void wk_lora_free_all(wk_t *w);

/* ------------------------------------------------------------------ worker_seq.c */

void wk_seq_free(wk_t *w, wk_seq_t *s); /* accepts NULL */
void wk_seq_unlink(wk_model_t *m, wk_seq_t *s);
/* Ends a sequence with a done event (reason: finish_reason) and frees it. */
void wk_seq_finish(wk_t *w, wk_seq_t *s, proto_finish_t reason);
/* Ends a sequence with an error and frees it. */
void wk_seq_fail(wk_t *w, wk_seq_t *s, proto_err_t code, const char *msg);
/* Ends a queued sequence refused for its deadline (overloaded, try again after retry_ms) and
 * frees it; counted by the caller, not as failed. */
void wk_seq_refuse(wk_t *w, wk_seq_t *s, uint32_t retry_ms, const char *msg);
/* Samples the next token from logits (a pass that ended at time t), streams
 * its text and finishes the sequence when it is done (s may be freed). */
void wk_seq_token(wk_t *w, wk_seq_t *s, float *logits, double t);

/* ------------------------------------------------------------------ worker_deadline.c */

/* s->t_deadline from its request's deadline_ms, else its model's deadline (none: 0). */
void wk_dl_start(wk_seq_t *s, const wk_model_t *m);
/* On arrival, before it is queued: 1 after refusing s (overloaded, retry_after_ms; s stays the
 * caller's to free) when its first token is predicted to miss its deadline, else 0. */
int wk_dl_arrival(wk_t *w, wk_seq_t *s);
/* Each round: refuses the queued requests now predicted to miss their deadlines. */
void wk_dl_sweep(wk_t *w, double now);
/* A request of model m (index mi) was admitted at now (its queue popped): the admission gap. */
void wk_dl_admitted(wk_t *w, wk_model_t *m, int mi, double now);

/* ------------------------------------------------------------------ worker_report.c */

json_t *wk_report_stats(wk_t *w);
json_t *wk_report_models(wk_t *w, int admin);

/* ------------------------------------------------------------------ worker_step.c */

/* A page-in of model mi is on the copy engine from now (started by the
 * scheduler's choice, a prefetch or an admin load; evict: RES_EVICT_*). */
void wk_pagein_begin(wk_t *w, int mi, double now, int evict);
/* What a page-in of mi keeps queued on the copy engine: enough to last until
 * the next round (twice the longest pass) and through mi's next pass, two
 * segments at least (res_pagein_window). */
size_t wk_pagein_window(wk_t *w, int mi);
/* One scheduling round: follow the page-ins under way, ask the scheduler,
 * step the chosen model or start its page-in, prefetch. Returns how long the
 * loop may sleep before the next one (0 when it stepped). */
double wk_round(wk_t *w);

/* ------------------------------------------------------------------ worker_req.c */

int wk_cancel_where(wk_t *w, uint64_t conn, const json_t *target, int silent);
/* One client request from the inbox (not an admin one: wk_admin_op); takes req. */
void wk_handle_req(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv);

/* ------------------------------------------------------------------ worker_admin.c */

wk_model_t *wk_model_load(wk_t *w, const cfg_model_t *c);
void wk_model_free(wk_t *w, wk_model_t *m); /* accepts NULL */
void wk_load_progress(void *ctx, const char *name, size_t done, size_t total);
/* One admin-socket operation (load, evict, pin, stats, fault, ...); req stays the caller's. */
void wk_admin_op(wk_t *w, uint64_t conn, proto_req_t *req, double t_recv);
void wk_admin_poll_loads(wk_t *w);
void wk_apply_reload(wk_t *w, const cfg_t *next);
void wk_reap_removed(wk_t *w);

#endif

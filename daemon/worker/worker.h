/* worker: the device worker thread: owns backend, store, residency, scheduler and sequences; talks to the loop only through its inbox and outbox. */
#ifndef WORKER_H
#define WORKER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "proto.h"
#include "wk_event.h"

typedef struct wk wk_t;

/* Called on the worker thread after it appends to the outbox (the loop's
 * wake-up, e.g. event_active). */
typedef void (*wk_notify_fn)(void *ctx);

typedef enum wk_out_kind {
    WK_OUT_EVENT = 1, /* an event for a connection: the loop's front ends encode it */
    WK_OUT_RELOAD,    /* the admin asked for a config reload */
    WK_OUT_IDLE,      /* draining and nothing is left in flight */
} wk_out_kind_t;

typedef struct wk_out {
    wk_out_kind_t kind;
    wk_event_t ev; /* EVENT: owned (wk_event.h) */
    uint64_t conn; /* RELOAD: the admin connection to answer */
    json_t *id;    /* RELOAD: its request id (owned ref, may be NULL) */
    struct wk_out *next;
} wk_out_t;

void wk_out_free(wk_out_t *o); /* one item; accepts NULL */

/* Opens the backend and loads every model of cfg (logging to stderr); the
 * config is copied by reference: cfg must stay alive until wk_free or the
 * next successful wk_reload. NULL + reason on failure (a model that fails
 * to load is skipped with a log line, not fatal). */
wk_t *wk_new(const cfg_t *cfg, wk_notify_fn notify, void *notify_ctx, char *err, size_t errlen);
int wk_start(wk_t *w);
/* Stops the thread (in-flight work is abandoned: call after draining). */
void wk_free(wk_t *w); /* accepts NULL */

/* Adds section name (a string that outlives w) to every stats report: fn(ctx)
 * runs on the worker thread while it builds one and returns a new object
 * (NULL: left out); it must be thread-safe. Call before wk_start. */
void wk_set_report_section(wk_t *w, const char *name, json_t *(*fn)(void *ctx), void *ctx);

/* From the loop thread: */
void wk_submit(wk_t *w, uint64_t conn, int admin, proto_req_t *req); /* takes req's contents */
void wk_cancel_conn(wk_t *w, uint64_t conn);                         /* the connection is gone */
void wk_reload(wk_t *w, const cfg_t *next); /* apply a validated config (loop keeps it alive) */
void wk_drain(wk_t *w);                     /* finish in-flight work, then WK_OUT_IDLE */
wk_out_t *wk_take(wk_t *w);                 /* outbox items in order, caller frees */
/* One-line summary for sd_notify STATUS (thread-safe snapshot). */
void wk_status(wk_t *w, char *buf, size_t len);
/* Seconds since the worker last showed progress (a loop turn or a segment of
 * a pass); it turns at least every WK_IDLE_WAIT_MS when idle. Any thread. */
double wk_stalled_s(wk_t *w);
/* Whether the worker is draining (SIGTERM or admin drain): new requests are
 * refused. A thread-safe snapshot, set as soon as the loop hands the drain over. */
int wk_draining(wk_t *w);
/* The daemon is leaving: readiness (wk_readiness) says draining from now on,
 * while requests are still accepted until the drain is handed over (the
 * loop's listen.drain_linger). Any thread. */
void wk_leave(wk_t *w);

/* A model's state in the models list and stats ("state"). */
typedef enum wk_state {
    WK_STATE_LOADING,  /* being read into host RAM */
    WK_STATE_HOST,     /* in host RAM, nothing on the device */
    WK_STATE_PARTIAL,  /* some of its pages on the device */
    WK_STATE_RESIDENT, /* every page on the device */
    WK_STATE_FAILED,   /* could not be loaded (load_error says why) */
    WK_STATE_COUNT
} wk_state_t;
/* "loading", "host", "partial", "resident", "failed"; NULL outside the enum. */
const char *wk_state_name(wk_state_t s);

/* Readiness for load balancers (HTTP /ready): ready once every configured
 * model is in host RAM and while not draining. */
typedef enum wk_ready {
    WK_READY_OK = 0,   /* every configured model is in host RAM, not draining */
    WK_READY_LOADING,  /* a reload is loading models (or the worker has not reported) */
    WK_READY_FAILED,   /* a configured model could not be loaded */
    WK_READY_DRAINING, /* draining: finishing in-flight work, accepting none */
} wk_ready_t;
/* The current readiness, and a sentence saying why (reason may be NULL). Any
 * thread: a drain or a reload flips it from the loop at once, the worker
 * updates it after each round. */
wk_ready_t wk_readiness(wk_t *w, char *reason, size_t len);
const char *wk_ready_name(wk_ready_t r); /* "ready", "loading", "failed", "draining" */

#endif

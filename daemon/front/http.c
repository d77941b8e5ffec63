/* http: the OpenAI-compatible HTTP front end on libevent's evhttp in the loop thread: listeners, connections, routing, API keys, replies and SSE; the OpenAI JSON is http_openai.c's, the /metrics text http_metrics.c's. */
#include "http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hostport.h"
#include "http_int.h"
#include "proto.h"

#define HTTP_BUCKETS 256
#define HTTP_MAX_HEADERS (64 * 1024) /* bytes of request headers */
#define HTTP_MAX_REFUSED 64          /* connections over the limit kept open for their 503 */
#define HTTP_REFUSED_TIMEOUT_S 5     /* how long such a connection may take to send its request */

typedef enum hkind {
    HK_NONE = 0,   /* answered locally (routing errors) */
    HK_HEALTH,     /* GET /health: liveness */
    HK_READY,      /* GET /ready: readiness */
    HK_COMPLETION, /* POST /v1/completions */
    HK_CHAT,       /* POST /v1/chat/completions */
    HK_MODELS,     /* GET /v1/models */
    HK_MODEL,      /* GET /v1/models/{id} */
    HK_METRICS,    /* GET /metrics */
    HK_OLLAMA,     /* /api/...: Ollama's API, the route in hreq.ol (http_ollama.c) */
} hkind_t;

/* One HTTP request from arrival until its answer is written or its connection
 * goes away; evhttp serves one request per connection at a time. */
typedef struct hreq {
    uint64_t conn; /* id in the server's space: the worker's routing key */
    http_t *h;
    struct evhttp_request *req; /* owned by evhttp */
    struct evhttp_connection *evcon;
    struct hconn *hc;     /* its connection; NULL if untracked */
    struct event *closed; /* EV_CLOSED on the socket while the worker has it; NULL if none */
    hkind_t kind;
    int stream;           /* SSE answer */
    int include_usage;    /* stream_options.include_usage */
    int calls_streamed;   /* token events brought delta.tool_calls: the done's calls were sent */
    int started;          /* SSE headers sent */
    int answered;         /* final reply handed to evhttp: ignore further lines */
    int submitted;        /* the worker has (had) it: cancel on disconnect */
    int status;           /* status for the next error instead of the code's; 0 = by code */
    char rid[64];         /* "cmpl-..." / "chatcmpl-...": the OpenAI id and our request id */
    char *model;          /* requested model name (owned), NULL for non-inference */
    auth_key_t *key;      /* its Authorization's key (a reference); NULL if none needed */
    int admitted;         /* a generate/chat slot of key is held until it ends */
    uint32_t retry_after; /* Retry-After seconds of its 429 or 503; 0 = the default 1 */
    uint32_t retry_ms;    /* and retry-after-ms (the OpenAI SDKs read it first); 0 = none */
    time_t created;       /* unix seconds at arrival */
    json_t *choices;      /* n > 1 without stream: the choices ended so far (array), owned */
    size_t offset[PROTO_MAX_CHOICES]; /* completions' logprobs text_offset, per choice */
    uint32_t roles;                   /* streamed chat: choices whose role chunk went out (bits) */
    http_ol_t ol;                     /* HK_OLLAMA: its route */
    int64_t keep_alive;               /* HK_OLLAMA: ms (http_ol_req_t); HTTP_KA_NONE absent */
    int ol_load;                      /* HK_OLLAMA: a load/unload without prompt (admin op) */
    struct hreq *hnext;
} hreq_t;

/* One HTTP connection from accept until evhttp frees it, counted against
 * listen.max_connections. evhttp has no connection limit of its own (libevent
 * 2.1): conn_bev_new (its bufferevent callback) sees every accepted
 * connection first, conn_adopt learns the evhttp_connection right after and
 * owns its close callback from then on. */
typedef struct hconn {
    http_t *h;
    struct bufferevent *bev;         /* made by conn_bev_new, owned by evhttp; we hold a
                                      * reference only until conn_adopt */
    struct evhttp_connection *evcon; /* NULL until conn_adopt */
    hreq_t *req;                     /* the request being served, NULL between requests */
    int refused;                     /* over the limit: its request gets a 503, then it closes */
    /* evhttp reads a header up to a NUL byte and drops the rest of its line ("Bearer KEY\0x"
     * reads as "Bearer KEY"): conn_in_scan watches the raw bytes for NULs instead */
    struct evbuffer_cb_entry *scan; /* conn_in_scan on bev's input; NULL: out of memory */
    uint64_t in_total;              /* bytes read from the socket, all requests */
    uint64_t nul_at;    /* stream offset of the first NUL byte not in an answered request;
                        UINT64_MAX = none */
    struct hconn *next; /* pending list, then the bucket of evcon */
} hconn_t;

struct http {
    struct event_base *base;
    const cfg_t *cfg;
    wk_t *wk;
    srv_t *srv;
    struct evhttp *eh;
    struct evhttp_bound_socket *bound;
    struct evhttp *eh_metrics; /* metrics.listen: GET /metrics and /health only; NULL if off */
    hreq_t *buckets[HTTP_BUCKETS];
    hconn_t *conns[HTTP_BUCKETS]; /* adopted connections, by evcon */
    hconn_t *pending;             /* accepted, not yet adopted */
    struct event *adopt;          /* runs conn_adopt right after the accept */
    uint32_t n_conns;             /* open connections within the limit */
    uint32_t n_refused;           /* open connections over it, waiting for their 503 */
    uint32_t salt;                /* makes ids differ between daemon runs */
    time_t t_start;               /* "created" of /v1/models entries */
    int early_close;              /* the event backend reports peer close (EV_CLOSED) */
    int freeing;                  /* in http_free: the worker is gone */
    auth_t *auth;                 /* the server's API keys (srv_auth); NULL = none */
    http_ka_t *ka;                /* Ollama's keep_alive timers */
};

/* ------------------------------------------------------------------ request table */

static hreq_t *hreq_find(http_t *h, uint64_t conn)
{
    for (hreq_t *r = h->buckets[conn % HTTP_BUCKETS]; r; r = r->hnext)
        if (r->conn == conn)
            return r;
    return NULL;
}

static void disarm_closed(hreq_t *r)
{
    if (r->closed) {
        event_free(r->closed);
        r->closed = NULL;
    }
}

/* Forgets r (evhttp keeps or frees the request itself). */
static void hreq_free(hreq_t *r)
{
    http_t *h = r->h;
    hreq_t **pp = &h->buckets[r->conn % HTTP_BUCKETS];
    while (*pp && *pp != r)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = r->hnext;
    disarm_closed(r);
    if (r->hc)
        r->hc->req = NULL;
    else if (r->evcon)
        evhttp_connection_set_closecb(r->evcon, NULL, NULL);
    if (r->admitted)
        auth_finish(h->auth, r->key, 0, auth_now());
    auth_key_unref(r->key);
    free(r->model);
    json_decref(r->choices);
    free(r);
}

/* The connection is going away before the answer was written. */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    hreq_t *r = arg;
    if (r->submitted && !r->answered && !r->h->freeing)
        wk_cancel_conn(r->h->wk, r->conn);
    /* after a network failure evhttp has let go of the request and leaves
     * freeing it to us; otherwise it frees it with the connection */
    if (!evhttp_request_get_connection(r->req))
        evhttp_request_free(r->req);
    r->evcon = NULL;
    hreq_free(r);
}

/* evhttp wrote the whole answer. */
static void on_complete(struct evhttp_request *req, void *arg)
{
    (void)req;
    hreq_free(arg);
}

/* The peer closed while the worker was on it: drop the connection now (the
 * close callback cancels) rather than at the next write. */
static void on_peer_closed(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    hreq_t *r = arg;
    struct evhttp_connection *evcon = r->evcon;
    disarm_closed(r);
    if (evcon)
        evhttp_connection_free(evcon); /* calls on_conn_close, which frees r */
}

static void arm_closed(hreq_t *r)
{
    if (!r->h->early_close || r->closed || !r->evcon)
        return;
    evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(r->evcon));
    if (fd < 0)
        return;
    r->closed = event_new(r->h->base, fd, EV_CLOSED, on_peer_closed, r);
    if (r->closed && event_add(r->closed, NULL) != 0)
        disarm_closed(r);
}

/* ------------------------------------------------------------------ connections */

static size_t conn_bucket(const struct evhttp_connection *evcon)
{
    return ((uintptr_t)evcon / sizeof(void *)) % HTTP_BUCKETS;
}

static hconn_t *conn_find(http_t *h, const struct evhttp_connection *evcon)
{
    for (hconn_t *c = h->conns[conn_bucket(evcon)]; c; c = c->next)
        if (c->evcon == evcon)
            return c;
    return NULL;
}

/* The input buffer's callback (before evhttp parses what arrived): counts the bytes
 * and notes where the first NUL byte after the last request answered lies. */
static void conn_in_scan(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    hconn_t *c = arg;
    if (!info->n_added)
        return;
    c->in_total += info->n_added;
    if (c->nul_at != UINT64_MAX)
        return;
    size_t len = evbuffer_get_length(in); /* the new bytes are its last n_added */
    struct evbuffer_ptr p;
    if (evbuffer_ptr_set(in, &p, len > info->n_added ? len - info->n_added : 0, EVBUFFER_PTR_SET) !=
        0)
        return;
    p = evbuffer_search(in, "", 1, &p);
    if (p.pos >= 0)
        c->nul_at = c->in_total - len + (uint64_t)p.pos;
}

/* Whether the request evhttp just read whole on c held a NUL byte (a header, or a body:
 * JSON has none either). Its bytes end where the unread input begins. */
static int conn_request_has_nul(hconn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    uint64_t end = c->in_total - evbuffer_get_length(in);
    if (c->nul_at >= end)
        return 0;
    /* the next requests: look again in what is read beyond this one */
    struct evbuffer_ptr p = evbuffer_search(in, "", 1, NULL);
    c->nul_at = p.pos >= 0 ? end + (uint64_t)p.pos : UINT64_MAX;
    return 1;
}

static void conn_scan_stop(hconn_t *c)
{
    if (c->scan)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->scan);
    c->scan = NULL;
}

static void conn_uncount(hconn_t *c)
{
    if (c->refused)
        c->h->n_refused--;
    else
        c->h->n_conns--;
}

/* evhttp closes the connection: ends its request (cancelling it in the
 * worker) and frees its slot. */
static void conn_closed(struct evhttp_connection *evcon, void *arg)
{
    hconn_t *c = arg;
    http_t *h = c->h;
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    if (c->req)
        on_conn_close(evcon, c->req); /* frees the request, which clears c->req */
    hconn_t **pp = &h->conns[conn_bucket(evcon)];
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    conn_scan_stop(c);
    conn_uncount(c);
    free(c);
}

/* Runs right after evhttp accepted connections (in the same loop iteration,
 * before any of them is read): learns each one's evhttp_connection, which
 * evhttp makes the argument of the bufferevent's callbacks, and takes its
 * close callback. Refused connections get a short timeout, or, as the event
 * (what != 0, not called from inside a request), are closed at once when too
 * many of them are waiting already. */
static void conn_adopt(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    http_t *h = arg;
    while (h->pending) {
        hconn_t *c = h->pending;
        h->pending = c->next;
        void *cbarg = NULL;
        bufferevent_getcb(c->bev, NULL, NULL, NULL, &cbarg);
        struct evhttp_connection *evcon = cbarg;
        if (!evcon || evhttp_connection_get_bufferevent(evcon) != c->bev) {
            /* evhttp failed to set the connection up and freed the
             * bufferevent already (bufferevent_free clears its callbacks) */
            conn_scan_stop(c);
            bufferevent_decref(c->bev);
            conn_uncount(c);
            free(c);
            continue;
        }
        bufferevent_decref(c->bev); /* evhttp's reference keeps it */
        c->evcon = evcon;
        c->next = h->conns[conn_bucket(evcon)];
        h->conns[conn_bucket(evcon)] = c;
        evhttp_connection_set_closecb(evcon, conn_closed, c);
        if (c->refused) {
            if (h->n_refused > HTTP_MAX_REFUSED && what)
                evhttp_connection_free(evcon); /* calls conn_closed */
            else
                evhttp_connection_set_timeout(evcon, HTTP_REFUSED_TIMEOUT_S);
        }
    }
}

/* evhttp's bufferevent constructor, called for every accepted connection
 * before evhttp wraps it: counts it against listen.max_connections, or marks
 * it refused, and queues it for conn_adopt. The bufferevent (NULL: evhttp
 * makes its own) belongs to evhttp. */
static struct bufferevent *conn_bev_new(struct event_base *base, void *arg)
{
    http_t *h = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    hconn_t *c = bev ? calloc(1, sizeof *c) : NULL;
    if (!c)
        return bev; /* out of memory: served, not counted */
    c->h = h;
    c->bev = bev;
    c->nul_at = UINT64_MAX;
    c->scan = evbuffer_add_cb(bufferevent_get_input(bev), conn_in_scan, c);
    bufferevent_incref(bev); /* valid until conn_adopt even if evhttp drops it */
    c->refused = h->n_conns >= h->cfg->listen.max_connections;
    if (c->refused)
        h->n_refused++;
    else
        h->n_conns++;
    c->next = h->pending;
    h->pending = c;
    event_active(h->adopt, EV_READ, 0);
    return bev;
}

static hreq_t *hreq_new(http_t *h, struct evhttp_request *req)
{
    hreq_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->h = h;
    r->req = req;
    r->evcon = evhttp_request_get_connection(req);
    if (r->evcon && h->pending)
        conn_adopt(-1, 0, h);
    r->hc = r->evcon ? conn_find(h, r->evcon) : NULL;
    if (r->hc)
        r->hc->req = r;
    r->conn = srv_conn_id_new(h->srv);
    r->created = time(NULL);
    snprintf(r->rid, sizeof r->rid, "%08x%016llx", h->salt, (unsigned long long)r->conn);
    r->hnext = h->buckets[r->conn % HTTP_BUCKETS];
    h->buckets[r->conn % HTTP_BUCKETS] = r;
    if (r->evcon && !r->hc) /* untracked connection: watch it for this request */
        evhttp_connection_set_closecb(r->evcon, on_conn_close, r);
    evhttp_request_set_on_complete_cb(req, on_complete, r);
    return r;
}

static size_t http_pending(void *ctx)
{
    http_t *h = ctx;
    size_t n = 0;
    for (int b = 0; b < HTTP_BUCKETS; b++)
        for (hreq_t *r = h->buckets[b]; r; r = r->hnext)
            if (r->evcon)
                n += evbuffer_get_length(
                    bufferevent_get_output(evhttp_connection_get_bufferevent(r->evcon)));
    return n;
}

/* ------------------------------------------------------------------ replies */

/* Sends body (stolen) as the whole answer; r may be freed by the time it returns. */
static void reply_json(hreq_t *r, int status, json_t *body)
{
    struct evbuffer *buf = evbuffer_new();
    char *text = body ? json_dumps(body, PROTO_DUMP_FLAGS) : NULL;
    json_decref(body);
    struct evkeyvalq *hd = evhttp_request_get_output_headers(r->req);
    evhttp_add_header(hd, "Content-Type", "application/json");
    if (status == 429 || status == 503) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", r->retry_after ? r->retry_after : 1);
        evhttp_add_header(hd, "Retry-After", ra);
        if (r->retry_ms && snprintf(ra, sizeof ra, "%u", r->retry_ms) > 0)
            evhttp_add_header(hd, "retry-after-ms", ra);
    }
    if (status == 401)
        evhttp_add_header(hd, "WWW-Authenticate", "Bearer");
    if (buf && text) {
        evbuffer_add(buf, text, strlen(text));
        evbuffer_add(buf, "\n", 1);
    } else
        status = 500;
    free(text);
    r->answered = 1;
    disarm_closed(r);
    evhttp_send_reply(r->req, status, NULL, buf);
    if (buf)
        evbuffer_free(buf);
}

static void reply_text(hreq_t *r, int status, const char *ctype, struct evbuffer *buf)
{
    evhttp_add_header(evhttp_request_get_output_headers(r->req), "Content-Type", ctype);
    r->answered = 1;
    disarm_closed(r);
    evhttp_send_reply(r->req, status, NULL, buf);
}

static int status_of(proto_err_t code)
{
    switch (code) {
    case PROTO_E_BAD_JSON:
    case PROTO_E_BAD_REQUEST:
    case PROTO_E_CONTEXT_OVERFLOW: return 400;
    case PROTO_E_UNAUTHORIZED: return 401;
    case PROTO_E_FORBIDDEN: return 403;
    case PROTO_E_UNKNOWN_MODEL: return 404;
    case PROTO_E_TOO_LARGE: return 413;
    case PROTO_E_RATE_LIMITED:
        return 429;          /* the caller's key: another replica would say the same */
    case PROTO_E_OVERLOADED: /* this engine, as OpenAI answers it: another replica may serve it */
    case PROTO_E_CANCELLED:
    case PROTO_E_SHUTTING_DOWN: return 503;
    default: return 500;
    }
}

static const char *type_of(int status)
{
    if (status == 429)
        return "rate_limit_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

/* {"error":{"message","type","param":null,"code"}} */
static json_t *error_body(int status, const char *code, const char *message)
{
    return json_pack("{s:{s:o, s:s, s:n, s:s}}", "error", "message",
                     proto_str_new(message ? message : code), "type", type_of(status), "param",
                     "code", code);
}

static void send_sse(hreq_t *r, json_t *obj /* stolen */)
{
    char *text = obj ? json_dumps(obj, PROTO_DUMP_FLAGS) : NULL;
    json_decref(obj);
    struct evbuffer *buf = evbuffer_new();
    if (buf && text) {
        evbuffer_add_printf(buf, r->kind == HK_OLLAMA ? "%s\n" : "data: %s\n\n", text);
        evhttp_send_reply_chunk(r->req, buf);
    }
    if (buf)
        evbuffer_free(buf);
    free(text);
}

/* Ends the event stream; r may be freed by the time it returns. */
static void sse_end(hreq_t *r, int done)
{
    if (done) {
        struct evbuffer *buf = evbuffer_new();
        if (buf) {
            evbuffer_add(buf, "data: [DONE]\n\n", 14);
            evhttp_send_reply_chunk(r->req, buf);
            evbuffer_free(buf);
        }
    }
    r->answered = 1;
    disarm_closed(r);
    evhttp_send_reply_end(r->req);
}

/* The one way an HTTP error leaves: through the server's emitter (counted),
 * which hands the error event back to http_event. status 0 = the code's. */
static void http_fail(hreq_t *r, int status, proto_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void http_fail(hreq_t *r, int status, proto_err_t code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = status;
    srv_send_error(r->h->srv, r->conn, NULL, code, msg);
}

/* What r's OpenAI answers say of it. */
static http_answer_t answer_of(hreq_t *r)
{
    return (http_answer_t){.rid = r->rid,
                           .model = r->model,
                           .created = r->created,
                           .chat = r->kind == HK_CHAT,
                           .offset = r->offset};
}

/* A streamed chat choice opens with the role: once per index, before its first chunk. */
static void role_chunk(hreq_t *r, uint32_t index)
{
    if (r->kind != HK_CHAT || index >= 32 || (r->roles & (1u << index)))
        return;
    r->roles |= 1u << index;
    http_answer_t a = answer_of(r);
    send_sse(r, http_role_chunk_of(&a, index));
}

static void stream_start(hreq_t *r)
{
    if (r->started)
        return;
    struct evkeyvalq *hd = evhttp_request_get_output_headers(r->req);
    evhttp_add_header(hd, "Content-Type",
                      r->kind == HK_OLLAMA ? "application/x-ndjson" : "text/event-stream");
    evhttp_add_header(hd, "Cache-Control", "no-cache");
    evhttp_send_reply_start(r->req, 200, "OK");
    r->started = 1;
    role_chunk(r, 0);
}

/* Sends each chunk of chunks (stolen; NULL: none). */
static void send_chunks(hreq_t *r, json_t *chunks)
{
    for (size_t i = 0; i < json_array_size(chunks); i++)
        send_sse(r, json_incref(json_array_get(chunks, i)));
    json_decref(chunks);
}

static void gen_token(hreq_t *r, const wk_event_t *ev)
{
    if (!r->stream)
        return;
    stream_start(r);
    role_chunk(r, ev->index);
    http_answer_t a = answer_of(r);
    if ((ev->text && ev->text[0]) || ev->logprobs)
        send_sse(r, http_chunk_of(&a, ev, 0));
    r->calls_streamed |= ev->tool_calls != NULL; /* the calls' deltas, as the model writes them */
    send_chunks(r, ev->tool_calls ? http_tool_deltas_of(&a, ev) : NULL);
}

/* The key's generate slot ends with its request's tokens. */
static void key_finish(hreq_t *r, const wk_event_t *ev)
{
    if (r->admitted) {
        r->admitted = 0;
        auth_finish(r->h->auth, r->key,
                    (uint64_t)ev->prompt_tokens + (uint64_t)ev->completion_tokens, auth_now());
    }
}

static void gen_done(hreq_t *r, const wk_event_t *ev)
{
    http_answer_t a = answer_of(r);
    if (ev->left > 0) { /* n > 1: one choice ended, the others go on */
        if (r->stream) {
            stream_start(r);
            role_chunk(r, ev->index);
            send_chunks(r, r->calls_streamed ? NULL : http_tool_chunks_of(&a, ev));
            send_sse(r, http_chunk_of(&a, ev, 0));
        } else {
            if (!r->choices)
                r->choices = json_array();
            json_array_append_new(r->choices, http_choice_of(&a, ev));
        }
        return;
    }
    key_finish(r, ev);
    if (r->stream) {
        stream_start(r);
        role_chunk(r, ev->index);
        send_chunks(r, r->calls_streamed ? NULL : http_tool_chunks_of(&a, ev));
        send_sse(r, http_chunk_of(&a, ev, 0));
        if (r->include_usage)
            send_sse(r, http_chunk_of(&a, ev, 1));
        sse_end(r, 1);
        return;
    }
    reply_json(r, 200, http_completion_of(&a, ev, r->choices));
}

static void any_error(hreq_t *r, const wk_event_t *ev)
{
    const char *code = proto_err_code(ev->code);
    int status = r->status ? r->status : status_of(ev->code);
    if (ev->retry_ms) { /* refused for its deadline (docs/overload.md): when to try again */
        r->retry_after = (ev->retry_ms + 999) / 1000;
        r->retry_ms = ev->retry_ms;
    }
    json_t *body = r->kind == HK_OLLAMA ? http_ollama_error_of(ev->message ? ev->message : code)
                                        : error_body(status, code, ev->message);
    if (r->started) {
        send_sse(r, body);
        sse_end(r, 0);
        return;
    }
    reply_json(r, status, body);
}

/* ------------------------------------------------------------------ /v1/models, /metrics */

static void models_ok(hreq_t *r, const json_t *body)
{
    json_t *data = json_array();
    size_t i;
    const json_t *m;
    json_array_foreach (json_object_get(body, "models"), i, m) {
        const char *name = json_string_value(json_object_get(m, "name"));
        if (!name)
            continue;
        json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", name, "object", "model", "created",
                              (json_int_t)r->h->t_start, "owned_by", "gpuswapd");
        const json_t *ctx = json_object_get(m, "context");
        if (json_is_integer(ctx))
            json_object_set_new(o, "context_length", json_integer(json_integer_value(ctx)));
        /* a model that could not be loaded stays listed, marked: "available": false, "error" */
        const char *state = json_string_value(json_object_get(m, "state"));
        int failed = state && (!strcmp(state, "failed") || !strcmp(state, "unavailable"));
        json_object_set_new(o, "available", json_boolean(!failed));
        /* an adapter names its base (vLLM's "parent" too) */
        const json_t *base = json_object_get(m, "base");
        if (base)
            json_object_set(o, "parent", (json_t *)base);
        /* gpuswapd's own fields, as the socket's models answer has them */
        static const char *const own[] = {"tensor_types", "bytes_per_param", "state", "base"};
        for (size_t k = 0; k < sizeof own / sizeof *own; k++) {
            json_t *v = json_object_get(m, own[k]);
            if (v)
                json_object_set(o, own[k], v);
        }
        if (r->kind == HK_MODEL && strcmp(name, r->model) == 0) {
            json_decref(data);
            reply_json(r, 200, o);
            return;
        }
        json_array_append_new(data, o);
    }
    if (r->kind == HK_MODEL) {
        json_decref(data);
        http_fail(r, 0, PROTO_E_UNKNOWN_MODEL, "no model '%s'", r->model);
        return;
    }
    reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void metrics_ok(hreq_t *r, const json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        http_fail(r, 0, PROTO_E_INTERNAL, "out of memory");
        return;
    }
    http_metrics_render(b, body, r->h->cfg->metrics.vllm_compat);
    reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

/* ------------------------------------------------------------------ Ollama's answers */

/* The worker's events for an Ollama request: NDJSON chunks and the final object, the
 * models lists, a load's answer; keep_alive applies once its request is done. */
static void ollama_event(hreq_t *r, const wk_event_t *ev)
{
    http_ol_answer_t a = {.ol = r->ol, .model = r->model, .stream = r->stream};
    if (ev->kind == WK_EVENT_RESULT && r->ol_load) {
        http_ka_apply(r->h->ka, r->model, r->keep_alive);
        reply_json(r, 200, http_ollama_load_of(&a, r->keep_alive == 0));
    } else if (ev->kind == WK_EVENT_RESULT) {
        http_ol_list_t l = {r->ol, r->model, r->key, r->h->ka, r->h->t_start};
        json_t *o = http_ollama_list_of(&l, ev->body);
        if (o || r->ol != HTTP_OL_SHOW)
            reply_json(r, 200, o);
        else
            http_fail(r, 0, PROTO_E_UNKNOWN_MODEL, "model '%s' not found", r->model);
    } else if (ev->kind == WK_EVENT_TOKEN && r->stream && ev->text && ev->text[0]) {
        stream_start(r);
        send_sse(r, http_ollama_chunk_of(&a, ev));
    } else if (ev->kind == WK_EVENT_DONE) {
        key_finish(r, ev);
        http_ka_apply(r->h->ka, r->model, r->keep_alive);
        if (!r->stream) {
            reply_json(r, 200, http_ollama_chunk_of(&a, ev));
            return;
        }
        stream_start(r);
        send_sse(r, http_ollama_chunk_of(&a, ev));
        sse_end(r, 0);
    }
}

/* ------------------------------------------------------------------ answers from the worker */

/* Every event for one of our ids, worker answers and srv_send_error's: the
 * OpenAI encoders (http_openai.c) build the answer from its fields. */
static void http_event(void *ctx, const wk_event_t *ev)
{
    http_t *h = ctx;
    hreq_t *r = hreq_find(h, ev->conn);
    if (!r || r->answered)
        return;
    if (r->kind == HK_OLLAMA && ev->kind != WK_EVENT_ERROR) {
        ollama_event(r, ev);
        return;
    }
    int gen = r->kind == HK_COMPLETION || r->kind == HK_CHAT;
    switch (ev->kind) {
    case WK_EVENT_ERROR: any_error(r, ev); break;
    case WK_EVENT_TOKEN:
        if (gen)
            gen_token(r, ev);
        break;
    case WK_EVENT_DONE:
        if (gen)
            gen_done(r, ev);
        break;
    case WK_EVENT_RESULT:
        if (r->kind == HK_MODELS || r->kind == HK_MODEL)
            models_ok(r, ev->body);
        else if (r->kind == HK_METRICS)
            metrics_ok(r, ev->body);
        break;
    case WK_EVENT_PROGRESS: break;
    }
}

/* ------------------------------------------------------------------ API keys */

/* Whether r may go on: 0 when its listener needs no key or its Authorization
 * names a known key (then r->key is set), else -1 after answering 401, or 429
 * while its address backs off. */
static int key_check(hreq_t *r)
{
    http_t *h = r->h;
    if (!auth_required(h->auth, AUTH_LST_HTTP))
        return 0;
    struct evkeyvalq *in = evhttp_request_get_input_headers(r->req);
    const char *hdr = evhttp_find_header(in, "Authorization"), *tok = NULL;
    size_t len = 0;
    char *peer = NULL;
    ev_uint16_t port = 0;
    char addr[64] = "";
    if (r->evcon)
        evhttp_connection_get_peer(r->evcon, &peer, &port);
    char *xff = http_forwarded_for(in);
    auth_client_addr(h->auth, peer, xff, addr, sizeof addr);
    free(xff);
    if (auth_parse_bearer(hdr, &tok, &len))
        tok = NULL, len = 0;
    uint32_t retry = 0;
    int rc = auth_check(h->auth, AUTH_LST_HTTP, addr, tok, len, auth_now(), &r->key, &retry);
    if (rc == AUTH_E_BACKOFF) {
        r->retry_after = retry;
        http_fail(r, 429, PROTO_E_RATE_LIMITED,
                  "too many failed API key attempts from this address: retry in %u s", retry);
        return -1;
    }
    if (rc) {
        http_fail(
            r, 401, PROTO_E_UNAUTHORIZED, "%s",
            tok   ? "Incorrect API key provided."
            : hdr ? "The Authorization header is not of the form 'Bearer KEY'."
                  : "You didn't provide an API key: send the header 'Authorization: Bearer KEY'.");
        return -1;
    }
    return 0;
}

/* Admits one request of r's key (gen: generate/chat) and gives req the key's
 * allow-list: 0, or -1 after answering 429 (req stays the caller's). */
static int key_admit(hreq_t *r, int gen, proto_req_t *req)
{
    static const char *const what[AUTH_CAUSE_COUNT] = {"requests-per-second", "concurrent-requests",
                                                       "tokens-per-minute"};
    auth_cause_t cause = AUTH_CAUSE_RATE;
    uint32_t retry = 0;
    if (auth_admit(r->h->auth, r->key, gen, auth_now(), &cause, &retry)) {
        r->retry_after = retry;
        http_fail(r, 429, PROTO_E_RATE_LIMITED, "API key '%s' is over its %s limit: retry in %u s",
                  auth_key_name(r->key), what[cause], retry);
        return -1;
    }
    r->admitted = gen;
    if (auth_key_apply(r->key, req)) {
        http_fail(r, 0, PROTO_E_INTERNAL, "out of memory");
        return -1;
    }
    return 0;
}

/* r's body (*len bytes, not NUL-terminated), or NULL after answering 413. */
static const char *body_of(hreq_t *r, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    *len = evbuffer_get_length(in);
    if (*len > r->h->cfg->listen.max_line) {
        http_fail(r, 0, PROTO_E_TOO_LARGE, "request body of %zu bytes is longer than %llu", *len,
                  (unsigned long long)r->h->cfg->listen.max_line);
        return NULL;
    }
    return *len ? (const char *)evbuffer_pullup(in, -1) : "";
}

static void do_generate(hreq_t *r)
{
    http_t *h = r->h;
    size_t len;
    const char *data = body_of(r, &len);
    if (!data)
        return;
    char err[512];
    char *line = NULL;
    http_ol_req_t ol = {.keep_alive = HTTP_KA_NONE};
    int rc = r->kind == HK_OLLAMA
                 ? http_ollama_map(r->ol, data, len, r->rid, &line, &ol, err, sizeof err)
                 : http_request_map(r->kind == HK_CHAT ? "/v1/chat/completions" : "/v1/completions",
                                    data, len, r->rid, &line, &r->include_usage, err, sizeof err);
    if (rc < 0) {
        http_fail(r, 0, (proto_err_t)-rc, "%s", err);
        return;
    }
    r->keep_alive = ol.keep_alive;
    r->ol_load = ol.load; /* an admin load (keep_alive 0: unpin, then unload) */
    /* the socket's codec validates the rest and words the errors */
    proto_req_t req;
    json_t *id = NULL;
    rc = proto_parse_request(line, strlen(line), ol.load, &req, &id, err, sizeof err);
    free(line);
    json_decref(id);
    if (rc < 0) {
        http_fail(r, 0, (proto_err_t)-rc, "%s", err);
        return;
    }
    if (http_request_headers(evhttp_request_get_input_headers(r->req), &req, err, sizeof err)) {
        proto_req_free(&req);
        http_fail(r, 0, PROTO_E_BAD_REQUEST, "%s", err);
        return;
    }
    r->stream = req.stream;
    r->model = strdup(req.model ? req.model : "");
    if (!r->model) {
        proto_req_free(&req);
        http_fail(r, 0, PROTO_E_INTERNAL, "out of memory");
        return;
    }
    if (wk_draining(h->wk)) {
        proto_req_free(&req);
        http_fail(r, 0, PROTO_E_SHUTTING_DOWN,
                  "the daemon is shutting down and accepts no new requests");
        return;
    }
    if (ol.load && r->key && !auth_key_allows(r->key, r->model)) {
        proto_req_free(&req);
        http_fail(r, 0, PROTO_E_UNKNOWN_MODEL, "model '%s' not found", r->model);
        return;
    }
    if (ol.load && ol.keep_alive == 0)
        req.op = PROTO_OP_UNPIN;
    if (r->key && key_admit(r, !ol.load, &req)) {
        proto_req_free(&req);
        return;
    }
    r->submitted = 1;
    arm_closed(r);
    wk_submit(h->wk, r->conn, ol.load, &req);
}

/* models (inference op) and stats (admin op) go to the worker as such. */
static void do_worker_op(hreq_t *r, proto_op_t op, int admin)
{
    proto_req_t req = {.op = op, .id = json_string(r->rid)};
    if (r->key && key_admit(r, 0, &req)) {
        proto_req_free(&req);
        return;
    }
    r->submitted = 1;
    wk_submit(r->h->wk, r->conn, admin, &req);
}

/* Ollama's routes: generations as do_generate's, the lists from the admin models answer. */
static void do_ollama(hreq_t *r)
{
    size_t len;
    const char *data;
    char err[256];
    switch (r->ol) {
    case HTTP_OL_VERSION:
        reply_json(r, 200, json_pack("{s:s}", "version", GPUSWAPD_VERSION));
        return;
    case HTTP_OL_CHAT:
    case HTTP_OL_GENERATE: do_generate(r); return;
    case HTTP_OL_SHOW:
        if (!(data = body_of(r, &len)))
            return;
        int rc = http_ollama_model_of(data, len, &r->model, err, sizeof err);
        if (rc < 0) {
            http_fail(r, 0, (proto_err_t)-rc, "%s", err);
            return;
        }
        /* fall through */
    default: do_worker_op(r, PROTO_OP_MODELS, 1); return;
    }
}

/* ------------------------------------------------------------------ routing */

static void on_request(struct evhttp_request *req, void *arg)
{
    http_t *h = arg;
    hreq_t *r = hreq_new(h, req);
    if (!r) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    if (r->hc && r->hc->refused) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        http_fail(r, 503, PROTO_E_OVERLOADED,
                  "too many HTTP connections (listen.max_connections is %u): retry later",
                  h->cfg->listen.max_connections);
        return;
    }
    if (r->hc && !r->hc->scan) {
        http_fail(r, 0, PROTO_E_INTERNAL, "out of memory");
        return;
    }
    if (r->hc && conn_request_has_nul(r->hc)) { /* RFC 9110 5.5: reject it */
        http_fail(r, 400, PROTO_E_BAD_REQUEST,
                  "the request holds a NUL byte, which no header (nor a JSON body) may");
        return;
    }
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !path[0])
        path = "/";
    int get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD, post = cmd == EVHTTP_REQ_POST;
    int want_post = 0;
    hkind_t kind = HK_NONE;
    if ((r->ol = http_ollama_route(path, &want_post)) != HTTP_OL_NONE) {
        kind = HK_OLLAMA;
    } else if (strcmp(path, "/v1/completions") == 0) {
        kind = HK_COMPLETION;
        want_post = 1;
    } else if (strcmp(path, "/v1/chat/completions") == 0) {
        kind = HK_CHAT;
        want_post = 1;
    } else if (strcmp(path, "/v1/models") == 0) {
        kind = HK_MODELS;
    } else if (strncmp(path, "/v1/models/", 11) == 0 && path[11]) {
        kind = HK_MODEL;
    } else if (strcmp(path, "/metrics") == 0) {
        kind = HK_METRICS;
    } else if (strcmp(path, "/health") == 0) {
        kind = HK_HEALTH;
    } else if (strcmp(path, "/ready") == 0) {
        kind = HK_READY;
    } else {
        r->kind = strncmp(path, "/api/", 5) == 0 ? HK_OLLAMA : HK_NONE; /* the error's shape */
        http_fail(r, 404, PROTO_E_BAD_REQUEST, "no such path: %s", path);
        return;
    }
    r->kind = kind;
    if (want_post ? !post : !get) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                          want_post ? "POST" : "GET, HEAD");
        http_fail(r, 405, PROTO_E_BAD_REQUEST, "%s takes %s only", path,
                  want_post ? "POST" : "GET");
        return;
    }
    if (kind != HK_HEALTH && kind != HK_READY && key_check(r))
        return;
    switch (kind) {
    case HK_NONE: return; /* not reached: answered above */
    case HK_HEALTH:       /* liveness: the loop answers, draining or not */
        reply_json(
            r, 200,
            json_pack("{s:s}", "status",
                      wk_readiness(h->wk, NULL, 0) == WK_READY_DRAINING ? "draining" : "ok"));
        return;
    case HK_READY: { /* readiness: every model in host RAM and not draining */
        char why[256];
        wk_ready_t rd = wk_readiness(h->wk, why, sizeof why);
        reply_json(r, rd == WK_READY_OK ? 200 : 503,
                   json_pack("{s:s, s:s}", "status", wk_ready_name(rd), "reason", why));
        return;
    }
    case HK_COMPLETION:
    case HK_CHAT:
        snprintf(r->rid, sizeof r->rid, "%s-%08x%016llx", kind == HK_CHAT ? "chatcmpl" : "cmpl",
                 h->salt, (unsigned long long)r->conn);
        do_generate(r);
        return;
    case HK_MODEL: {
        char *name = evhttp_uridecode(path + 11, 0, NULL);
        r->model = name ? strdup(name) : NULL;
        free(name);
        if (!r->model) {
            http_fail(r, 0, PROTO_E_INTERNAL, "out of memory");
            return;
        }
        do_worker_op(r, PROTO_OP_MODELS, 0);
        return;
    }
    case HK_MODELS: do_worker_op(r, PROTO_OP_MODELS, 0); return;
    case HK_OLLAMA: do_ollama(r); return;
    case HK_METRICS:
        if (r->key &&
            !auth_key_allows(r->key, NULL)) { /* it names every model: keys for all only */
            http_fail(r, 404, PROTO_E_BAD_REQUEST, "no such path: %s", path);
            return;
        }
        do_worker_op(r, PROTO_OP_STATS, 1);
        return;
    }
}

/* metrics.listen: scrapers' own listener, GET /metrics and /health only. Its
 * connections are not counted against listen.max_connections. */
static void on_metrics_request(struct evhttp_request *req, void *arg)
{
    http_t *h = arg;
    hreq_t *r = hreq_new(h, req);
    if (!r) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    int metrics = path && strcmp(path, "/metrics") == 0,
        health = path && strcmp(path, "/health") == 0;
    if (!metrics && !health) {
        http_fail(r, 404, PROTO_E_BAD_REQUEST,
                  "no such path on metrics.listen: %s (only /metrics "
                  "and /health)",
                  path ? path : "");
        return;
    }
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        http_fail(r, 405, PROTO_E_BAD_REQUEST, "%s takes GET only", path);
        return;
    }
    if (health) {
        r->kind = HK_HEALTH;
        reply_json(
            r, 200,
            json_pack("{s:s}", "status",
                      wk_readiness(h->wk, NULL, 0) == WK_READY_DRAINING ? "draining" : "ok"));
        return;
    }
    r->kind = HK_METRICS;
    do_worker_op(r, PROTO_OP_STATS, 1);
}

/* ------------------------------------------------------------------ lifecycle */

/* Binds eh to "host:port" hp (named key in messages) with our backlog. */
static int bind_hostport(struct evhttp *eh, const cfg_t *cfg, const char *key, const char *hp,
                         struct evhttp_bound_socket **bound, char *err, size_t errlen)
{
    char host[HOSTPORT_HOST_MAX], why[160];
    unsigned port;
    if (hostport_split(hp, host, sizeof host, &port, why, sizeof why)) { /* [::1]:8400 -> ::1 */
        snprintf(err, errlen, "%s: bad host:port '%s': %s", key, hp ? hp : "", why);
        return -1;
    }
    errno = 0;
    *bound = evhttp_bind_socket_with_handle(eh, host, (ev_uint16_t)port);
    if (!*bound) {
        snprintf(err, errlen, "%s: cannot listen on %s: %s", key, hp,
                 errno ? strerror(errno) : "bind failed");
        return -1;
    }
    /* evhttp listens with a backlog of 128: a second listen() sets ours */
    evutil_socket_t lfd = evhttp_bound_socket_get_fd(*bound);
    if (listen(lfd, srv_backlog(cfg)) != 0) {
        snprintf(err, errlen, "%s: listen on %s: %s", key, hp, strerror(errno));
        return -1;
    }
    return 0;
}

http_t *http_new(struct event_base *base, const cfg_t *cfg, wk_t *wk, srv_t *srv, char *err,
                 size_t errlen)
{
    http_t *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->base = base;
    h->cfg = cfg;
    h->wk = wk;
    h->srv = srv;
    h->t_start = time(NULL);
    h->salt = (uint32_t)(h->t_start * 2654435761u) ^ (uint32_t)getpid();
    h->early_close = (event_base_get_features(base) & EV_FEATURE_EARLY_CLOSE) != 0;
    h->auth = srv_auth(srv);
    h->adopt = event_new(base, -1, 0, conn_adopt, h);
    h->ka = http_ka_new(base, wk, srv);
    h->eh = h->adopt && h->ka ? evhttp_new(base) : NULL;
    if (!h->eh) {
        snprintf(err, errlen, "listen.http: cannot create the HTTP server");
        goto fail;
    }
    /* bodies up to 2 x max_line are read and answered with our 413; past that
     * evhttp reads (and drops) the rest before answering 413 itself */
    uint64_t cap = cfg->listen.max_line * 2;
    evhttp_set_max_body_size(h->eh, cap > (uint64_t)INT64_MAX ? -1 : (ev_ssize_t)cap);
    evhttp_set_max_headers_size(h->eh, HTTP_MAX_HEADERS);
    evhttp_set_flags(h->eh, EVHTTP_SERVER_LINGERING_CLOSE);
    evhttp_set_allowed_methods(h->eh, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                          EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                          EVHTTP_REQ_PATCH);
    evhttp_set_gencb(h->eh, on_request, h);
    evhttp_set_bevcb(h->eh, conn_bev_new, h);
    if (cfg->listen.http &&
        bind_hostport(h->eh, cfg, "listen.http", cfg->listen.http, &h->bound, err, errlen))
        goto fail;
    if (cfg->metrics.listen) {
        struct evhttp_bound_socket *mb = NULL;
        h->eh_metrics = evhttp_new(base);
        if (!h->eh_metrics) {
            snprintf(err, errlen, "metrics.listen: cannot create the HTTP server");
            goto fail;
        }
        evhttp_set_max_body_size(h->eh_metrics, 4096); /* bodies are read and refused */
        evhttp_set_max_headers_size(h->eh_metrics, HTTP_MAX_HEADERS);
        evhttp_set_allowed_methods(h->eh_metrics,
                                   EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
        evhttp_set_gencb(h->eh_metrics, on_metrics_request, h);
        if (bind_hostport(h->eh_metrics, cfg, "metrics.listen", cfg->metrics.listen, &mb, err,
                          errlen))
            goto fail;
    }
    srv_foreign_t f = {.event = http_event, .pending = http_pending, .ctx = h};
    srv_set_foreign(srv, &f);
    return h;
fail:
    http_free(h);
    return NULL;
}

void http_free(http_t *h)
{
    if (!h)
        return;
    h->freeing = 1;
    if (h->srv)
        srv_set_foreign(h->srv, NULL);
    /* frees every connection: their close callbacks forget our requests */
    if (h->eh)
        evhttp_free(h->eh);
    if (h->eh_metrics)
        evhttp_free(h->eh_metrics);
    for (int b = 0; b < HTTP_BUCKETS; b++)
        while (h->buckets[b]) {
            h->buckets[b]->evcon = NULL; /* gone with evhttp */
            hreq_free(h->buckets[b]);
        }
    /* connections evhttp did not report closed, and accepted ones not yet adopted */
    for (int b = 0; b < HTTP_BUCKETS; b++)
        while (h->conns[b]) {
            hconn_t *c = h->conns[b];
            h->conns[b] = c->next;
            free(c);
        }
    while (h->pending) {
        hconn_t *c = h->pending;
        h->pending = c->next;
        bufferevent_decref(c->bev);
        free(c);
    }
    if (h->adopt)
        event_free(h->adopt);
    http_ka_free(h->ka);
    free(h);
}

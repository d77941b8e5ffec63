/* server: the libevent side: listeners, connections, line framing and limits, dispatch to the worker, the one error emitter. */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "auth.h"
#include "hostport.h"
#include "worker/stats.h"

#define SRV_BUCKETS 1024

typedef struct conn {
    uint64_t id;
    int admin;
    struct bufferevent *bev;
    srv_t *s;
    int closing;           /* close once the output is flushed */
    uint32_t inflight;     /* requests handed to the worker (approximate) */
    auth_listener_t lkind; /* which listener accepted it (auth.tcp applies to AUTH_LST_TCP) */
    char addr[64];         /* the peer's address, for the back-off after failed keys */
    auth_key_t *key;       /* the key of its auth op (a reference), NULL before one */
    json_t **gen;          /* (n_gen) ids of its generate/chat requests in flight under key */
    size_t n_gen, cap_gen;
    struct conn *hnext;
} conn_t;

#define SRV_MAX_LISTENERS 8

/* A listener slot; it is also the accept callback's argument. */
typedef struct lst {
    struct evconnlistener *l;
    srv_t *s;
    int admin;
    auth_listener_t lkind; /* unix or tcp (admin: unused) */
    char *unlink_path;     /* unix socket we created */
} lst_t;

struct srv {
    struct event_base *base;
    const cfg_t *cfg;
    wk_t *wk;
    srv_hooks_t hooks;
    struct event *wake;
    lst_t lst[SRV_MAX_LISTENERS];
    int n_lst;
    conn_t *buckets[SRV_BUCKETS];
    uint64_t next_id;
    uint32_t n_conns;
    int draining;
    srv_foreign_t foreign; /* events for ids not in the table (HTTP) */
    auth_t *auth;          /* API keys (srv_set_auth); NULL = the auth op is refused */
    int from_worker;       /* sending the worker's answers (wake_cb): only they end requests */
};

/* ------------------------------------------------------------------ connection table */

static conn_t *conn_find(srv_t *s, uint64_t id)
{
    for (conn_t *c = s->buckets[id % SRV_BUCKETS]; c; c = c->hnext)
        if (c->id == id)
            return c;
    return NULL;
}

/* Releases the key's slots for whatever c still has in flight, and the key. */
static void conn_auth_drop(conn_t *c)
{
    for (size_t i = 0; i < c->n_gen; i++) {
        auth_finish(c->s->auth, c->key, 0, auth_now());
        json_decref(c->gen[i]);
    }
    free(c->gen);
    c->gen = NULL;
    c->n_gen = c->cap_gen = 0;
    auth_key_unref(c->key);
    c->key = NULL;
}

/* An event from the worker to a connection with generate/chat requests in
 * flight under a key: when it ends one of them (a done or error event), the
 * key's slot is released and its tokens charged. The server's own errors
 * never do: one tagged with the id of a request still running must not free
 * its slot. */
static void conn_auth_event(conn_t *c, const wk_event_t *ev)
{
    if ((ev->kind != WK_EVENT_DONE && ev->kind != WK_EVENT_ERROR) ||
        (ev->kind == WK_EVENT_DONE && ev->left > 0)) /* n > 1: the last choice ends it */
        return;
    const json_t *id = ev->id ? ev->id : json_null();
    for (size_t i = 0; i < c->n_gen; i++) {
        if (!json_equal(c->gen[i], id))
            continue;
        uint64_t used = ev->kind == WK_EVENT_DONE
                            ? (uint64_t)ev->prompt_tokens + (uint64_t)ev->completion_tokens
                            : 0;
        auth_finish(c->s->auth, c->key, used, auth_now());
        json_decref(c->gen[i]);
        c->gen[i] = c->gen[--c->n_gen];
        break;
    }
}

static void conn_free(conn_t *c)
{
    srv_t *s = c->s;
    conn_t **pp = &s->buckets[c->id % SRV_BUCKETS];
    while (*pp && *pp != c)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = c->hnext;
    bufferevent_free(c->bev);
    if (!c->admin)
        s->n_conns--;
    stats_server.curr_connections--;
    conn_auth_drop(c);
    /* whatever it still had in flight is cancelled and its KV cache freed */
    wk_cancel_conn(s->wk, c->id);
    free(c);
}

static void conn_write(conn_t *c, const char *line, size_t len)
{
    if (c->closing)
        return;
    bufferevent_write(c->bev, line, len);
}

/* ------------------------------------------------------------------ answers */

char *srv_event_line(const wk_event_t *ev)
{
    proto_choice_t choice = {.index = ev->index,
                             .n = ev->choices,
                             .left = ev->left,
                             .logprobs = ev->logprobs,
                             .tool_calls = ev->tool_calls};
    switch (ev->kind) {
    case WK_EVENT_TOKEN: return proto_encode_token(ev->id, ev->text, ev->token, ev->ts, &choice);
    case WK_EVENT_DONE:
        return proto_encode_done(ev->id, ev->text ? ev->text : "", proto_finish_name(ev->finish),
                                 ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens,
                                 &ev->timing, &choice);
    case WK_EVENT_ERROR: return proto_encode_error(ev->id, ev->code, ev->message, ev->retry_ms);
    case WK_EVENT_RESULT: return proto_encode_ok(ev->id, json_incref(ev->body));
    case WK_EVENT_PROGRESS: return proto_encode_progress(ev->id, ev->model, ev->bytes, ev->total);
    }
    return NULL;
}

void srv_emit(srv_t *s, const wk_event_t *ev)
{
    if (ev->kind == WK_EVENT_ERROR) {
        stats_server.total_errors++;
        if ((int)ev->code > 0 && (int)ev->code < 16)
            stats_server.errors_by_code[ev->code]++;
    }
    conn_t *c = conn_find(s, ev->conn);
    if (!c) {
        if (s->foreign.event)
            s->foreign.event(s->foreign.ctx, ev);
        return;
    }
    if (c->n_gen && s->from_worker)
        conn_auth_event(c, ev);
    if (c->closing)
        return;
    char *line = srv_event_line(ev);
    if (line)
        conn_write(c, line, strlen(line));
    free(line);
}

void srv_send_error(srv_t *s, uint64_t conn, const json_t *id, proto_err_t code,
                    const char *message)
{
    /* borrowed for the call: srv_emit keeps nothing of it */
    wk_event_t ev = {.kind = WK_EVENT_ERROR,
                     .conn = conn,
                     .id = (json_t *)id,
                     .code = code,
                     .message = (char *)message};
    srv_emit(s, &ev);
}

void srv_send_result(srv_t *s, uint64_t conn, const json_t *id, json_t *body)
{
    if (body && !json_is_object(body)) {
        json_decref(body);
        return;
    }
    wk_event_t ev = {.kind = WK_EVENT_RESULT, .conn = conn, .id = (json_t *)id, .body = body};
    srv_emit(s, &ev);
    json_decref(body);
}

static void close_after_flush(conn_t *c)
{
    c->closing = 1;
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_free(c);
}

/* ------------------------------------------------------------------ API keys */

/* The auth op: checks the key and binds the connection to it. */
static void conn_auth_op(conn_t *c, const proto_req_t *req)
{
    srv_t *s = c->s;
    if (!s->auth) {
        srv_send_error(s, c->id, req->id, PROTO_E_UNAUTHORIZED, "this daemon has no API keys");
        return;
    }
    if (c->n_gen) {
        srv_send_error(
            s, c->id, req->id, PROTO_E_BAD_REQUEST,
            "this connection has requests in flight under its key: authenticate before sending them");
        return;
    }
    auth_key_t *k = NULL;
    uint32_t retry = 0;
    int rc = auth_check(s->auth, c->lkind, c->addr, req->key, req->key_len, auth_now(), &k, &retry);
    if (rc == AUTH_E_BACKOFF) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "too many failed API key attempts from this address: retry in %u s", retry);
        srv_send_error(s, c->id, req->id, PROTO_E_RATE_LIMITED, msg);
        return;
    }
    if (rc) {
        srv_send_error(s, c->id, req->id, PROTO_E_UNAUTHORIZED, "unknown API key");
        return;
    }
    auth_key_unref(c->key);
    c->key = k;
    srv_send_result(s, c->id, req->id, json_pack("{s:s}", "key", auth_key_name(k)));
}

/* Applies the connection's key to req before it goes to the worker: 0, or -1
 * after answering unauthorized or rate_limited (req is still the caller's). */
static int conn_auth_admit(conn_t *c, proto_req_t *req)
{
    srv_t *s = c->s;
    if (!c->key) {
        if (!auth_required(s->auth, c->lkind))
            return 0;
        /* auth_check with no key counts it (total_auth_missing) and refuses an address
         * that backs off, as HTTP does */
        auth_key_t *none = NULL;
        uint32_t retry = 0;
        if (auth_check(s->auth, c->lkind, c->addr, NULL, 0, auth_now(), &none, &retry) ==
            AUTH_E_BACKOFF) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "too many failed API key attempts from this address: retry in %u s", retry);
            srv_send_error(s, c->id, req->id, PROTO_E_RATE_LIMITED, msg);
            return -1;
        }
        srv_send_error(
            s, c->id, req->id, PROTO_E_UNAUTHORIZED,
            "this listener requires an API key: send {\"op\":\"auth\",\"key\":\"...\"} first");
        return -1;
    }
    if (req->op == PROTO_OP_CANCEL)
        return 0;
    int gen = req->op == PROTO_OP_GENERATE || req->op == PROTO_OP_CHAT;
    auth_cause_t cause = AUTH_CAUSE_RATE;
    uint32_t retry = 0;
    if (auth_admit(s->auth, c->key, gen, auth_now(), &cause, &retry)) {
        static const char *const what[AUTH_CAUSE_COUNT] = {
            "requests-per-second", "concurrent-requests", "tokens-per-minute"};
        char msg[160];
        snprintf(msg, sizeof msg, "API key '%s' is over its %s limit: retry in %u s",
                 auth_key_name(c->key), what[cause], retry);
        srv_send_error(s, c->id, req->id, PROTO_E_RATE_LIMITED, msg);
        return -1;
    }
    if (auth_key_apply(c->key, req))
        goto nomem;
    if (!gen)
        return 0;
    if (c->n_gen == c->cap_gen) {
        size_t cap = c->cap_gen ? 2 * c->cap_gen : 8;
        json_t **g = realloc(c->gen, cap * sizeof *g);
        if (!g)
            goto nomem;
        c->gen = g;
        c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = json_incref(req->id ? req->id : json_null());
    return 0;
nomem:
    if (gen)
        auth_finish(s->auth, c->key, 0, auth_now());
    srv_send_error(s, c->id, req->id, PROTO_E_INTERNAL, "out of memory");
    return -1;
}

/* ------------------------------------------------------------------ reading */

static void handle_line(conn_t *c, const char *line, size_t len)
{
    srv_t *s = c->s;
    stats_server.total_lines++;
    if (len == 0 || (len == 1 && line[0] == '\r'))
        return; /* blank lines are ignored */
    proto_req_t req;
    json_t *id = NULL;
    char err[512];
    int rc = proto_parse_request(line, len, c->admin, &req, &id, err, sizeof err);
    if (rc < 0) {
        srv_send_error(s, c->id, id, (proto_err_t)-rc, err);
        json_decref(id);
        return;
    }
    if (!c->admin && req.op == PROTO_OP_AUTH) {
        conn_auth_op(c, &req);
        proto_req_free(&req);
        return;
    }
    if (s->draining && !c->admin && (req.op == PROTO_OP_GENERATE || req.op == PROTO_OP_CHAT)) {
        srv_send_error(s, c->id, req.id, PROTO_E_SHUTTING_DOWN,
                       "the daemon is shutting down and accepts no new requests");
        proto_req_free(&req);
        return;
    }
    if (!c->admin && s->auth && conn_auth_admit(c, &req)) {
        proto_req_free(&req);
        return;
    }
    c->inflight++;
    if (c->admin && req.op == PROTO_OP_DRAIN && s->hooks.drain) {
        s->hooks.drain(s->hooks.ctx, c->id, &req);
        return;
    }
    wk_submit(s->wk, c->id, c->admin, &req);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    srv_t *s = c->s;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t max = s->cfg->listen.max_line;
    while (!c->closing) {
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_LF);
        if (eol.pos < 0) {
            if (evbuffer_get_length(in) > max) {
                char msg[128];
                snprintf(msg, sizeof msg, "request line longer than %zu bytes: closing", max);
                srv_send_error(s, c->id, NULL, PROTO_E_TOO_LARGE, msg);
                close_after_flush(c);
            }
            return;
        }
        size_t len = (size_t)eol.pos;
        if (len > max) {
            char msg[128];
            snprintf(msg, sizeof msg, "request line of %zu bytes is longer than %zu: closing", len,
                     max);
            srv_send_error(s, c->id, NULL, PROTO_E_TOO_LARGE, msg);
            close_after_flush(c);
            return;
        }
        char *line = malloc(len + 1);
        if (!line) {
            close_after_flush(c);
            return;
        }
        evbuffer_remove(in, line, len);
        evbuffer_drain(in, 1); /* the '\n' */
        line[len] = 0;
        handle_line(c, line, len);
        free(line);
    }
}

static void write_cb(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    if (c->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        conn_free(c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    conn_t *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        /* the client went away (or finished): cancel what it still has */
        conn_free(c);
    }
}

/* ------------------------------------------------------------------ accepting */

static int peer_allowed(const cfg_t *cfg, int fd)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return 0;
    if (cr.uid == 0 || cr.uid == getuid())
        return 1;
    for (size_t i = 0; i < cfg->admin.uids.n; i++)
        if (cfg->admin.uids.ids[i] == cr.uid)
            return 1;
    for (size_t i = 0; i < cfg->admin.gids.n; i++)
        if (cfg->admin.gids.ids[i] == cr.gid)
            return 1;
    if (cfg->admin.gids.n == 0)
        return 0;
    /* the peer's supplementary groups too (an operators' group usually is one) */
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) != 0)
        return 0;
    for (size_t g = 0; g < glen / sizeof groups[0]; g++)
        for (size_t i = 0; i < cfg->admin.gids.n; i++)
            if (cfg->admin.gids.ids[i] == groups[g])
                return 1;
    return 0;
}

static void accept2_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int slen,
                       void *arg)
{
    (void)l;
    const lst_t *lc = arg;
    srv_t *s = lc->s;
    conn_t *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    if (!c || !bev) {
        free(c);
        evutil_closesocket(fd);
        return;
    }
    c->id = ++s->next_id;
    c->admin = lc->admin;
    c->lkind = lc->lkind;
    snprintf(c->addr, sizeof c->addr, "unix");
    if (sa && sa->sa_family == AF_INET && (size_t)slen >= sizeof(struct sockaddr_in))
        inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, c->addr, sizeof c->addr);
    else if (sa && sa->sa_family == AF_INET6 && (size_t)slen >= sizeof(struct sockaddr_in6))
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, c->addr, sizeof c->addr);
    c->bev = bev;
    c->s = s;
    c->hnext = s->buckets[c->id % SRV_BUCKETS];
    s->buckets[c->id % SRV_BUCKETS] = c;
    if (!c->admin)
        s->n_conns++; /* admin connections do not take client slots */
    stats_server.total_connections++;
    stats_server.curr_connections++;
    bufferevent_setcb(bev, read_cb, write_cb, event_cb, c);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    if (c->admin && !peer_allowed(s->cfg, fd)) {
        srv_send_error(s, c->id, NULL, PROTO_E_FORBIDDEN, "this user may not use the admin socket");
        close_after_flush(c);
        return;
    }
    if (!c->admin && s->n_conns > s->cfg->listen.max_connections) {
        srv_send_error(s, c->id, NULL, PROTO_E_OVERLOADED, "too many connections");
        close_after_flush(c);
    }
}

/* ------------------------------------------------------------------ listeners */

int srv_path_check(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "socket path too long: %s", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; not replacing it", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, (const struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc == 0) {
        snprintf(err, errlen, "%s is in use by a running process (another gpuswapd?)", path);
        return -1;
    }
    if (e != ECONNREFUSED) {
        snprintf(err, errlen, "%s: cannot tell whether it is in use: %s", path, strerror(e));
        return -1;
    }
    return 1;
}

/* 0 when path is free to bind: absent, or a stale socket no one listens on
 * (left by a daemon that was killed), which is removed. A live socket or
 * anything that is not a socket is never replaced. */
static int claim_path(const char *path, char *err, size_t errlen)
{
    int rc = srv_path_check(path, err, errlen);
    if (rc == 1 && unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "%s: stale socket: %s", path, strerror(errno));
        return -1;
    }
    return rc < 0 ? -1 : 0;
}

int srv_backlog(const cfg_t *cfg)
{
    uint32_t n = cfg->listen.max_connections;
    return n < 128 ? 128 : n < SOMAXCONN ? (int)n : SOMAXCONN;
}

static int unix_listen(const char *path, unsigned mode, int backlog, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "socket path too long: %s", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (claim_path(path, err, errlen)) {
        close(fd);
        return -1;
    }
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc != 0 || chmod(path, mode) != 0 || listen(fd, backlog) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* A socket bound to hostport (SO_REUSEADDR), not yet listening; -1 with the reason. */
static int tcp_bind(const char *hostport, char *err, size_t errlen)
{
    char host[HOSTPORT_HOST_MAX], serv[8], why[160];
    unsigned port;
    if (hostport_split(hostport, host, sizeof host, &port, why, sizeof why)) {
        snprintf(err, errlen, "bad host:port '%s': %s", hostport, why);
        return -1;
    }
    snprintf(serv, sizeof serv, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *ai;
    int g = getaddrinfo(host, serv, &hints, &ai);
    if (g) {
        snprintf(err, errlen, "%s: %s", hostport, gai_strerror(g));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s%s", hostport, strerror(e),
                 e == EADDRINUSE      ? " (another process listens there)"
                 : e == EACCES        ? " (a port below 1024 needs root or CAP_NET_BIND_SERVICE)"
                 : e == EADDRNOTAVAIL ? " (no interface of this host has that address)"
                                      : "");
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    return fd;
}

int srv_tcp_check(const char *hostport, char *err, size_t errlen)
{
    int fd = tcp_bind(hostport, err, errlen);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int tcp_listen(const char *hostport, int backlog, char *err, size_t errlen)
{
    int fd = tcp_bind(hostport, err, errlen);
    if (fd >= 0 && listen(fd, backlog) != 0) {
        snprintf(err, errlen, "%s: %s", hostport, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int add_listener(srv_t *s, int fd, int admin, const char *unlink_path, char *err,
                        size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    auth_listener_t lkind = AUTH_LST_UNIX;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
        lkind = AUTH_LST_TCP;
    if (s->n_lst == SRV_MAX_LISTENERS) {
        close(fd);
        snprintf(err, errlen, "more than %d listening sockets", SRV_MAX_LISTENERS);
        return -1;
    }
    lst_t *ls = &s->lst[s->n_lst];
    *ls = (lst_t){.s = s, .admin = admin, .lkind = lkind};
    /* backlog 0: the socket listens already (ours with srv_backlog, systemd's with Backlog=) */
    ls->l = evconnlistener_new(s->base, accept2_cb, ls,
                               LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (!ls->l) {
        close(fd);
        snprintf(err, errlen, "cannot listen");
        return -1;
    }
    ls->unlink_path = unlink_path ? strdup(unlink_path) : NULL;
    s->n_lst++;
    return 0;
}

/* Sockets handed over by systemd (gpuswapd.socket): matched by path. */
static int adopt_systemd(srv_t *s, const cfg_t *cfg, int *got_main, int *got_admin, int *got_tcp)
{
    int n = sd_listen_fds(1);
    char err[256];
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        /* passed sockets may be blocking: libevent accepts until EAGAIN */
        evutil_make_socket_nonblocking(fd);
        if (cfg->admin.socket && sd_is_socket_unix(fd, SOCK_STREAM, 1, cfg->admin.socket, 0) > 0) {
            if (add_listener(s, fd, 1, NULL, err, sizeof err) == 0)
                *got_admin = 1;
        } else if (cfg->listen.socket &&
                   sd_is_socket_unix(fd, SOCK_STREAM, 1, cfg->listen.socket, 0) > 0) {
            if (add_listener(s, fd, 0, NULL, err, sizeof err) == 0)
                *got_main = 1;
        } else if (sd_is_socket_inet(fd, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0) {
            if (add_listener(s, fd, 0, NULL, err, sizeof err) == 0)
                *got_tcp = 1;
        } else {
            close(fd);
        }
    }
    return n > 0 ? n : 0;
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_t *s = arg;
    s->from_worker = 1;
    for (wk_out_t *o = wk_take(s->wk), *nx; o; o = nx) {
        nx = o->next;
        switch (o->kind) {
        case WK_OUT_EVENT: srv_emit(s, &o->ev); break;
        case WK_OUT_RELOAD:
            if (s->hooks.reload)
                s->hooks.reload(s->hooks.ctx, o->conn, o->id);
            break;
        case WK_OUT_IDLE:
            if (s->hooks.drained)
                s->hooks.drained(s->hooks.ctx);
            break;
        }
        wk_out_free(o);
    }
    s->from_worker = 0;
}

void srv_notify(void *srv)
{
    srv_t *s = srv;
    event_active(s->wake, EV_READ, 0);
}

srv_t *srv_new(struct event_base *base, const cfg_t *cfg, wk_t *wk, const srv_hooks_t *hooks,
               char *err, size_t errlen)
{
    srv_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->base = base;
    s->cfg = cfg;
    s->wk = wk;
    s->hooks = *hooks;
    s->wake = event_new(base, -1, EV_PERSIST | EV_READ, wake_cb, s);
    if (!s->wake)
        goto fail;
    int got_main = 0, got_admin = 0, got_tcp = 0;
    adopt_systemd(s, cfg, &got_main, &got_admin, &got_tcp);
    char e[512];
    if (cfg->listen.socket && !got_main) {
        int fd = unix_listen(cfg->listen.socket, cfg->listen.mode, srv_backlog(cfg), e, sizeof e);
        if (fd < 0 || add_listener(s, fd, 0, cfg->listen.socket, e, sizeof e)) {
            snprintf(err, errlen, "listen.socket: %s", e);
            goto fail;
        }
    }
    if (cfg->admin.socket && !got_admin) {
        int fd = unix_listen(cfg->admin.socket, cfg->admin.mode, srv_backlog(cfg), e, sizeof e);
        if (fd < 0 || add_listener(s, fd, 1, cfg->admin.socket, e, sizeof e)) {
            snprintf(err, errlen, "admin.socket: %s", e);
            goto fail;
        }
    }
    if (cfg->listen.tcp && !got_tcp) {
        int fd = tcp_listen(cfg->listen.tcp, srv_backlog(cfg), e, sizeof e);
        if (fd < 0 || add_listener(s, fd, 0, NULL, e, sizeof e)) {
            snprintf(err, errlen, "listen.tcp: %s", e);
            goto fail;
        }
    }
    return s;
fail:
    srv_free(s);
    return NULL;
}

static void close_listener(lst_t *ls)
{
    if (!ls->l)
        return;
    evconnlistener_free(ls->l);
    ls->l = NULL;
    if (ls->unlink_path)
        unlink(ls->unlink_path);
}

void srv_drain(srv_t *s)
{
    s->draining = 1;
    /* stop accepting inference connections; admin stays for drain answers */
    for (int i = 0; i < s->n_lst; i++)
        if (!s->lst[i].admin)
            close_listener(&s->lst[i]);
}

size_t srv_pending_output(const srv_t *s)
{
    size_t n = 0;
    for (int b = 0; b < SRV_BUCKETS; b++)
        for (conn_t *c = s->buckets[b]; c; c = c->hnext)
            n += evbuffer_get_length(bufferevent_get_output(c->bev));
    if (s->foreign.pending)
        n += s->foreign.pending(s->foreign.ctx);
    return n;
}

void srv_set_foreign(srv_t *s, const srv_foreign_t *f)
{
    if (f)
        s->foreign = *f;
    else
        memset(&s->foreign, 0, sizeof s->foreign);
}

uint64_t srv_conn_id_new(srv_t *s)
{
    return ++s->next_id;
}

void srv_set_cfg(srv_t *s, const cfg_t *cfg)
{
    s->cfg = cfg;
    /* connections authenticated with a key the reload revoked are closed */
    for (int b = 0; b < SRV_BUCKETS; b++) {
        for (conn_t *c = s->buckets[b], *nx; c; c = nx) {
            nx = c->hnext;
            if (!c->key || !auth_key_revoked(c->key) || c->closing)
                continue;
            srv_send_error(s, c->id, NULL, PROTO_E_UNAUTHORIZED,
                           "the API key was revoked: closing");
            close_after_flush(c);
        }
    }
}

void srv_set_auth(srv_t *s, auth_t *a)
{
    s->auth = a;
}

auth_t *srv_auth(const srv_t *s)
{
    return s->auth;
}

void srv_free(srv_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_lst; i++) {
        close_listener(&s->lst[i]);
        free(s->lst[i].unlink_path);
    }
    for (int b = 0; b < SRV_BUCKETS; b++) {
        while (s->buckets[b]) {
            conn_t *c = s->buckets[b];
            s->buckets[b] = c->hnext;
            bufferevent_free(c->bev);
            conn_auth_drop(c);
            free(c);
        }
    }
    if (s->wake)
        event_free(s->wake);
    free(s);
}

/* server: the libevent side: listeners, connections, line framing and limits, dispatch to the worker, the one error emitter. */
#ifndef SERVER_H
#define SERVER_H

#include <event2/event.h>
#include <jansson.h>
#include <stdint.h>

#include "auth.h"
#include "config.h"
#include "proto.h"
#include "worker/worker.h"

typedef struct srv srv_t;

/* What the server asks of main (loop thread). */
typedef struct srv_hooks {
    /* an admin asked for a reload: main reloads and answers with srv_answer_* */
    void (*reload)(void *ctx, uint64_t conn, const json_t *id);
    /* the worker finished draining */
    void (*drained)(void *ctx);
    /* (optional) an admin asked for a drain: main hands req (taken) to the worker with
     * wk_submit, now or after listen.drain_linger; NULL: straight to the worker */
    void (*drain)(void *ctx, uint64_t conn, proto_req_t *req);
    void *ctx;
} srv_hooks_t;

/* Binds the configured sockets, or adopts systemd's (sd_listen_fds). */
srv_t *srv_new(struct event_base *base, const cfg_t *cfg, wk_t *wk, const srv_hooks_t *hooks,
               char *err, size_t errlen);
void srv_free(srv_t *s); /* accepts NULL; unlinks the sockets it created */

/* Worker wake-up target: safe to call from any thread. */
void srv_notify(void *srv);
/* Stop accepting: close listeners; further inference requests get shutting_down. */
void srv_drain(srv_t *s);
/* Every answer of the loop thread leaves through srv_emit: the worker's events
 * (from the outbox) and the loop's own. An error is counted (the one error
 * emitter); an event for a connection the server owns is encoded once into a
 * socket line (srv_event_line), one for another id goes to foreign.event.
 * ev is borrowed: nothing of it is kept. Loop thread. */
void srv_emit(srv_t *s, const wk_event_t *ev);
/* An ERROR event for conn (message NULL: the code itself), through srv_emit. */
void srv_send_error(srv_t *s, uint64_t conn, const json_t *id, proto_err_t code,
                    const char *message);
/* A RESULT event for conn: body (taken; an object, NULL for none) tagged id,
 * through srv_emit; a body that is not an object is dropped. */
void srv_send_result(srv_t *s, uint64_t conn, const json_t *id, json_t *body);
/* The socket encoder: ev as its one protocol line (proto/PROTOCOL.md; the
 * proto_encode_* of its kind), malloc'ed, ending in '\n' (caller frees);
 * NULL on OOM or a RESULT body that is not an object. Pure. */
char *srv_event_line(const wk_event_t *ev);
/* Bytes still waiting in connections' output buffers. */
size_t srv_pending_output(const srv_t *s);
/* The config the server was set up with changed (reload); listeners stay.
 * Connections whose key the reload revoked (auth_reload first) get an
 * unauthorized error and are closed. */
void srv_set_cfg(srv_t *s, const cfg_t *cfg);
/* The API keys (daemon/auth.c) the auth op checks, auth.tcp requires and
 * HTTP uses (srv_auth); a must outlive s. Loop thread. */
void srv_set_auth(srv_t *s, auth_t *a);
auth_t *srv_auth(const srv_t *s);

/* Connections the server does not own (the HTTP module's, daemon/http.c) take
 * their ids from the server's space (srv_conn_id_new); every event for an id
 * the server does not know, worker answers and srv_send_error alike, goes to
 * foreign.event (the other front end's encoder; ev borrowed for the call),
 * and srv_pending_output adds foreign.pending. Loop thread. */
typedef struct srv_foreign {
    void (*event)(void *ctx, const wk_event_t *ev);
    size_t (*pending)(void *ctx); /* bytes still waiting in its output buffers */
    void *ctx;
} srv_foreign_t;
void srv_set_foreign(srv_t *s, const srv_foreign_t *f); /* NULL: drop such events (the default) */
/* The listen backlog of every listener: listen.max_connections (at least 128, at most SOMAXCONN),
 * so a burst of connects up to the limit waits in the kernel rather than failing with EAGAIN;
 * those past the limit are accepted and refused with an answer. */
int srv_backlog(const cfg_t *cfg);

/* Checks without side effects, as the listeners will open (daemon/preflight.c): whether a unix
 * socket path is free to bind: 0 absent, 1 a stale socket (no one listens; it is replaced), -1
 * with the reason (in use, not a socket, too long); whether "host:port" resolves and binds (the
 * port free, allowed to this user): 0, or -1 with the reason. */
int srv_path_check(const char *path, char *err, size_t errlen);
int srv_tcp_check(const char *hostport, char *err, size_t errlen);
uint64_t srv_conn_id_new(srv_t *s);

#endif

/* fuzz_http: OpenAI request bodies through http_request_map and the mapped line through proto_parse_request; raw request bytes through libevent's evhttp on a loopback Unix socket. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "front/auth.h"
#include "config.h"
#include "fuzz.h"
#include "front/http.h"
#include "proto.h"

#define FZ_RID "cmpl-fuzz"
#define FZ_MAX_RAW (64 * 1024) /* bytes of a raw request: fits the socket buffer */

/*
 * Input: one selector byte, then
 *   'c'  a body for POST /v1/completions
 *   'h'  a body for POST /v1/chat/completions
 *   'p'  a route path up to the first '\n', then the body
 *   'r'  raw HTTP/1.x bytes sent to an evhttp server whose request callback
 *        routes like the daemon's (the two POST routes are mapped and
 *        parsed, the rest answered 404/405; an Authorization header goes
 *        through auth_parse_bearer, X-Forwarded-For through auth_client_addr)
 *   'a'  an Authorization header value up to the first '\n', then an
 *        X-Forwarded-For value (the API key hooks, daemon/front/auth.c)
 * Any other selector byte picks one of c, h, p, r by its value mod 4.
 */

/* Maps body for path and checks what comes back; returns an HTTP status. */
static int fz_map(const char *path, const char *body, size_t len)
{
    char *line = (char *)0x1, err[512];
    int usage = 0;
    err[0] = '\0';
    int rc = http_request_map(path, body, len, FZ_RID, &line, &usage, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(line == NULL, "line set on failure");
        FUZZ_CHECK(rc == -PROTO_E_BAD_JSON || rc == -PROTO_E_BAD_REQUEST || rc == -PROTO_E_INTERNAL,
                   "rc %d", rc);
        FUZZ_CHECK(err[0], "no reason for rc %d", rc);
        return 400;
    }
    FUZZ_CHECK(line && !strchr(line, '\n'), "mapped line: %s", line ? line : "(null)");
    proto_req_t req;
    json_t *id = NULL;
    rc = proto_parse_request(line, strlen(line), 0, &req, &id, err, sizeof err);
    if (rc != 0) {
        /* the mapped line is well-formed JSON: only its values can be wrong */
        FUZZ_CHECK(rc == -PROTO_E_BAD_REQUEST, "rc %d (%s) for mapped line %s", rc, err, line);
        /* no id for a line refused before it is read (nested past PROTO_MAX_DEPTH) */
        FUZZ_CHECK(!id || (json_is_string(id) && strcmp(json_string_value(id), FZ_RID) == 0),
                   "error tagged with another id: %s", line);
        json_decref(id);
        free(line);
        return 400;
    }
    int chat = strcmp(path, "/v1/chat/completions") == 0;
    FUZZ_CHECK(req.op == (chat ? PROTO_OP_CHAT : PROTO_OP_GENERATE), "op %d for %s", (int)req.op,
               path);
    FUZZ_CHECK(json_is_string(req.id) && strcmp(json_string_value(req.id), FZ_RID) == 0, "id");
    proto_req_free(&req);
    free(line);
    return 200;
}

/* ------------------------------------------------------------------ API key headers */

static auth_t *fz_auth;

/* A store with one trusted proxy (127.0.0.1) and one key, made once. */
static auth_t *fz_auth_get(void)
{
    if (fz_auth)
        return fz_auth;
    static const char yaml[] =
        "listen:\n  http: 127.0.0.1:8400\nauth:\n  http: true\n  max_failures: 1000000\n"
        "  trusted_proxies: [\"127.0.0.1\", \"::1\"]\n  keys:\n    - name: k\n"
        "      hash: \"sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"\n"
        "      models: [\"*\"]\nmodels:\n  - name: a\n    path: /m/a.gguf\n";
    char err[256];
    cfg_t *c = NULL;
    FUZZ_CHECK(cfg_load_string(yaml, "fuzz.yaml", &c, err, sizeof err) == 0, "%s", err);
    fz_auth = auth_new(c, err, sizeof err);
    FUZZ_CHECK(fz_auth, "%s", err);
    cfg_free(c);
    return fz_auth;
}

/* hdr (an Authorization value) and xff (an X-Forwarded-For value, may be NULL), NUL-terminated. */
static void fz_auth_headers(const char *hdr, const char *xff)
{
    const char *tok = NULL;
    size_t len = 0;
    if (auth_parse_bearer(hdr, &tok, &len) == 0) {
        FUZZ_CHECK(hdr && tok >= hdr && tok + len <= hdr + strlen(hdr) && len > 0,
                   "token outside the header");
        for (size_t i = 0; i < len; i++)
            FUZZ_CHECK((unsigned char)tok[i] > 0x20 && tok[i] != 0x7f, "blank in the token");
    }
    auth_t *a = fz_auth_get();
    char out[64];
    memset(out, 'x', sizeof out);
    auth_client_addr(a, "127.0.0.1", xff, out, sizeof out);
    FUZZ_CHECK(memchr(out, 0, sizeof out), "address not terminated");
    unsigned char bin[16];
    FUZZ_CHECK(inet_pton(AF_INET, out, bin) == 1 || inet_pton(AF_INET6, out, bin) == 1,
               "not an address: %s", out);
    auth_client_addr(a, "192.0.2.1", xff, out, sizeof out);
    FUZZ_CHECK(strcmp(out, "192.0.2.1") == 0, "an untrusted peer's X-Forwarded-For was believed");
    auth_key_t *k = NULL;
    uint32_t retry = 0;
    int rc = auth_check(a, AUTH_LST_HTTP, "198.51.100.1", tok, tok ? len : 0, 1, &k, &retry);
    FUZZ_CHECK(rc == AUTH_OK ? k != NULL && len == 3 && memcmp(tok, "foo", 3) == 0 : k == NULL,
               "rc %d for a token of %zu bytes", rc, len);
    auth_key_unref(k);
}

/* ------------------------------------------------------------------ raw requests through evhttp */

static struct event_base *fz_base;
static struct evhttp *fz_eh;
static struct sockaddr_un fz_addr;
static socklen_t fz_addrlen;

static void fz_on_request(struct evhttp_request *req, void *arg)
{
    (void)arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !path[0])
        path = "/";
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    struct evkeyvalq *hd = evhttp_request_get_input_headers(req);
    const char *authz = evhttp_find_header(hd, "Authorization");
    if (authz)
        fz_auth_headers(authz, evhttp_find_header(hd, "X-Forwarded-For"));
    int status = 404;
    if (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0) {
        status = 405;
        if (cmd == EVHTTP_REQ_POST) {
            struct evbuffer *in = evhttp_request_get_input_buffer(req);
            size_t len = evbuffer_get_length(in);
            const char *data = len ? (const char *)evbuffer_pullup(in, -1) : "";
            status = fz_map(path, data, len);
        }
    } else if (strncmp(path, "/v1/models/", 11) == 0 && path[11]) {
        char *name = evhttp_uridecode(path + 11, 0, NULL);
        status = name ? 200 : 500;
        free(name);
    }
    evhttp_send_reply(req, status, NULL, NULL);
}

static int fz_server_init(void)
{
    if (fz_eh)
        return 0;
    fz_base = event_base_new();
    fz_eh = fz_base ? evhttp_new(fz_base) : NULL;
    FUZZ_CHECK(fz_eh, "evhttp_new");
    /* the daemon's settings (http_new), max_line at its 1MiB default */
    evhttp_set_max_body_size(fz_eh, 2 << 20);
    evhttp_set_max_headers_size(fz_eh, 64 * 1024);
    evhttp_set_flags(fz_eh, EVHTTP_SERVER_LINGERING_CLOSE);
    evhttp_set_allowed_methods(fz_eh, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                          EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                          EVHTTP_REQ_PATCH);
    evhttp_set_timeout(fz_eh, 5);
    evhttp_set_gencb(fz_eh, fz_on_request, NULL);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(lfd >= 0, "socket: %s", strerror(errno));
    memset(&fz_addr, 0, sizeof fz_addr);
    fz_addr.sun_family = AF_UNIX;
    /* abstract name: nothing on disk */
    int n = snprintf(fz_addr.sun_path + 1, sizeof fz_addr.sun_path - 1, "gpuswapd-fuzz-http-%d",
                     (int)getpid());
    fz_addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    FUZZ_CHECK(bind(lfd, (struct sockaddr *)&fz_addr, fz_addrlen) == 0 && listen(lfd, 16) == 0,
               "bind/listen: %s", strerror(errno));
    FUZZ_CHECK(evhttp_accept_socket(fz_eh, lfd) == 0, "evhttp_accept_socket");
    return 0;
}

typedef struct fz_client {
    int fd;
    const uint8_t *data; /* bytes still to send */
    size_t left;
    struct event *ev;
} fz_client_t;

/* Sends the request, half-closes, reads answers until the server closes. */
static void fz_on_client(evutil_socket_t fd, short what, void *arg)
{
    fz_client_t *c = arg;
    if (what & EV_TIMEOUT) {
        event_base_loopbreak(fz_base);
        return;
    }
    if ((what & EV_WRITE) && c->left) {
        ssize_t k = send(fd, c->data, c->left, MSG_NOSIGNAL);
        if (k > 0) {
            c->data += k;
            c->left -= (size_t)k;
        } else if (k < 0 && errno != EAGAIN && errno != EINTR) {
            c->left = 0;
        }
        if (!c->left) {
            shutdown(fd, SHUT_WR);
            event_del(c->ev);
            event_assign(c->ev, fz_base, fd, EV_READ | EV_PERSIST, fz_on_client, c);
            struct timeval tv = {10, 0};
            event_add(c->ev, &tv);
        }
    }
    if (what & EV_READ) {
        char buf[4096];
        ssize_t k = read(fd, buf, sizeof buf);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            event_base_loopbreak(fz_base);
    }
}

static void fz_raw(const uint8_t *data, size_t size)
{
    if (size > FZ_MAX_RAW)
        return;
    fz_server_init();
    fz_client_t c = {.data = data, .left = size};
    c.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(c.fd >= 0, "socket: %s", strerror(errno));
    if (connect(c.fd, (struct sockaddr *)&fz_addr, fz_addrlen) != 0 && errno != EAGAIN) {
        FUZZ_CHECK(0, "connect: %s", strerror(errno));
    }
    c.ev = event_new(fz_base, c.fd, size ? EV_WRITE | EV_PERSIST : EV_READ | EV_PERSIST,
                     fz_on_client, &c);
    FUZZ_CHECK(c.ev, "event_new");
    if (!size)
        shutdown(c.fd, SHUT_WR);
    struct timeval tv = {10, 0};
    event_add(c.ev, &tv);
    event_base_dispatch(fz_base);
    event_free(c.ev);
    close(c.fd);
    /* let evhttp see the close and free the connection */
    event_base_loop(fz_base, EVLOOP_NONBLOCK);
}

int fuzz_http(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int sel = data[0];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    if (sel != 'c' && sel != 'h' && sel != 'p' && sel != 'r' && sel != 'a')
        sel = "chpr"[sel % 4];
    switch (sel) {
    case 'c': fz_map("/v1/completions", body, len); break;
    case 'h': fz_map("/v1/chat/completions", body, len); break;
    case 'p': {
        const char *nl = memchr(body, '\n', len);
        size_t pl = nl ? (size_t)(nl - body) : len;
        char *path = malloc(pl + 1);
        if (!path)
            return 0;
        memcpy(path, body, pl);
        path[pl] = '\0';
        size_t skip = nl ? pl + 1 : pl;
        fz_map(path, body + skip, len - skip);
        free(path);
        break;
    }
    case 'r': fz_raw(data + 1, len); break;
    case 'a': {
        char *copy = malloc(len + 1);
        if (!copy)
            return 0;
        memcpy(copy, body, len);
        copy[len] = '\0'; /* a NUL inside ends the values, as in a header */
        char *nl = strchr(copy, '\n');
        if (nl)
            *nl = '\0';
        fz_auth_headers(copy, nl ? nl + 1 : NULL);
        free(copy);
        break;
    }
    }
    return 0;
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_http(data, size);
}
#endif

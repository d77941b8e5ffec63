/* gpuswap_io: the gpuswap CLI's plumbing: messages, signals, the line reader, the connection to the daemon and its answers. */
#include "gpuswap_int.h"

#include "proto.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GS_LINE_INIT 1024      /* bytes: first size of a line buffer (grows by doubling) */
#define GS_CANCEL_WAIT_MS 3000 /* ms to wait for the cancelled done after Ctrl-C */

/* ------------------------------------------------------------------ messages */

void gs_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpuswap: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int gs_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpuswap: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fprintf(stderr, "Try 'gpuswap %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return GS_EXIT_USAGE;
}

int64_t gs_now_ms(void)
{
    return (int64_t)util_now_ms();
}

/* ------------------------------------------------------------------ signals
 * SIGINT and SIGTERM stay blocked except inside ppoll(), so every wait sees a
 * signal exactly once (no race between checking the flag and sleeping). */

static volatile sig_atomic_t g_signal; /* signal received and not yet handled, 0 if none */
static sigset_t g_waitmask;            /* the mask during waits: SIGINT, SIGTERM deliverable */

static void gs_on_signal(int sig)
{
    g_signal = sig;
}

void gs_signals_init(void)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = gs_on_signal;
    sigemptyset(&sa.sa_mask);
    /* keep SIGINT ignored when started ignored (a background job of a script) */
    if (sigaction(SIGINT, NULL, &old) == 0 && old.sa_handler != SIG_IGN)
        sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &g_waitmask);
    sigdelset(&g_waitmask, SIGINT);
    sigdelset(&g_waitmask, SIGTERM);
}

/* Takes the pending signal: returns its number (0 if none) and clears it. */
int gs_signal_take(void)
{
    int s = g_signal;
    g_signal = 0;
    return s;
}

/* ------------------------------------------------------------------ line reader */

void gs_lines_init(gs_lines_t *lb, int fd)
{
    memset(lb, 0, sizeof *lb);
    lb->fd = fd;
}

void gs_lines_free(gs_lines_t *lb)
{
    free(lb->buf);
    lb->buf = NULL;
    lb->start = lb->end = lb->cap = lb->scan = 0;
}

/* Waits until fd (or nothing, fd < 0) is readable or deadline (monotonic ms, < 0 = never).
 * Returns 1 readable, GS_LINE_TIMEOUT, GS_LINE_SIGNAL or GS_LINE_ERR. */
int gs_wait(int fd, int64_t deadline)
{
    for (;;) {
        if (g_signal)
            return GS_LINE_SIGNAL;
        struct timespec ts, *tp = NULL;
        if (deadline >= 0) {
            int64_t left = deadline - gs_now_ms();
            if (left <= 0)
                return GS_LINE_TIMEOUT;
            ts.tv_sec = left / 1000;
            ts.tv_nsec = (left % 1000) * 1000000;
            tp = &ts;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = ppoll(fd >= 0 ? &p : NULL, fd >= 0 ? 1 : 0, tp, &g_waitmask);
        if (n > 0)
            return 1;
        if (n == 0 && fd >= 0)
            return GS_LINE_TIMEOUT;
        if (n < 0 && errno != EINTR)
            return GS_LINE_ERR;
    }
}

/* Returns the next line in *line (NUL-terminated, without "\n" or "\r\n"; valid
 * until the next call) and its length, or one of the GS_LINE_* conditions. */
/* Whether SIGINT or SIGTERM is pending (blocked outside waits): it is then delivered at once,
 * so that Ctrl-C takes effect also while whole lines are still buffered (a loaded client may have
 * read the rest of an answer in one go, and would otherwise print it all before noticing). */
static int gs_signal_due(void)
{
    sigset_t p;
    if (g_signal)
        return 1;
    if (sigpending(&p) != 0 || (!sigismember(&p, SIGINT) && !sigismember(&p, SIGTERM)))
        return 0;
    struct timespec zero = {0, 0};
    ppoll(NULL, 0, &zero, &g_waitmask); /* the handler runs and sets g_signal */
    return g_signal != 0;
}

int gs_lines_next(gs_lines_t *lb, int64_t deadline, char **line, size_t *len)
{
    for (;;) {
        if (gs_signal_due())
            return GS_LINE_SIGNAL;
        if (lb->buf) {
            char *from = lb->buf + lb->start + lb->scan;
            char *nl = memchr(from, '\n', lb->end - lb->start - lb->scan);
            if (nl) {
                *line = lb->buf + lb->start;
                *len = (size_t)(nl - *line);
                *nl = '\0';
                if (*len && (*line)[*len - 1] == '\r')
                    (*line)[--*len] = '\0';
                lb->start = (size_t)(nl + 1 - lb->buf);
                lb->scan = 0;
                return GS_LINE_OK;
            }
            lb->scan = lb->end - lb->start;
        }
        if (lb->eof) {
            if (lb->start == lb->end)
                return GS_LINE_EOF;
            *line = lb->buf + lb->start;
            *len = lb->end - lb->start;
            lb->buf[lb->end] = '\0';
            lb->start = lb->end;
            lb->scan = 0;
            return GS_LINE_PARTIAL;
        }
        if (lb->start > 0) {
            memmove(lb->buf, lb->buf + lb->start, lb->end - lb->start);
            lb->end -= lb->start;
            lb->start = 0;
        }
        if (lb->end + 1 >= lb->cap) {
            if (lb->cap >= GS_LINE_MAX)
                return GS_LINE_TOOLONG;
            size_t cap = lb->cap ? lb->cap * 2 : GS_LINE_INIT;
            char *nb = realloc(lb->buf, cap);
            if (!nb) {
                errno = ENOMEM;
                return GS_LINE_ERR;
            }
            lb->buf = nb;
            lb->cap = cap;
        }
        int w = gs_wait(lb->fd, deadline);
        if (w < 0)
            return w;
        ssize_t n = read(lb->fd, lb->buf + lb->end, lb->cap - lb->end - 1);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return GS_LINE_ERR;
        }
        if (n == 0)
            lb->eof = 1;
        else
            lb->end += (size_t)n;
    }
}

/* ------------------------------------------------------------------ connection */

const char *gs_api_key; /* --api-key or GPUSWAP_API_KEY: authenticates inference connections */

static int gs_conn_auth(gs_conn_t *c);

/* Connects to listen.tcp at "host:port". Returns the fd, or -1 with a message printed. */
static int gs_tcp_connect(const char *hp)
{
    char host[256];
    const char *colon = strrchr(hp, ':');
    if (!colon || (size_t)(colon - hp) >= sizeof host) {
        gs_err("cannot connect to %s: not HOST:PORT", hp);
        return -1;
    }
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = 0;
    if (host[0] == '[' && colon > hp + 1 && colon[-1] == ']') {
        memmove(host, host + 1, strlen(host) - 2);
        host[strlen(host) - 2] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &ai);
    if (g) {
        gs_err("cannot connect to %s: %s", hp, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, p->ai_addr, p->ai_addrlen) < 0) {
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0)
        gs_err("cannot connect to %s: %s", hp, strerror(errno));
    freeaddrinfo(ai);
    return fd;
}

/* Connects to the Unix socket at path (or, for the inference socket, to
 * listen.tcp when path is HOST:PORT without a '/'), then sends the API key
 * if one is set. Returns 0, or GS_EXIT_CONN (GS_EXIT_ERROR when the key is
 * refused) with a message printed. */
int gs_conn_open(gs_conn_t *c, const char *path, const char *which)
{
    memset(c, 0, sizeof *c);
    c->path = path;
    c->fd = -1;
    if (strcmp(which, "admin") && !strchr(path, '/') && strchr(path, ':')) {
        int fd = gs_tcp_connect(path);
        if (fd < 0)
            return GS_EXIT_CONN;
        c->fd = fd;
        gs_lines_init(&c->in, fd);
        return gs_conn_auth(c);
    }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        gs_err("cannot connect to %s: socket path too long", path);
        return GS_EXIT_CONN;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        gs_err("socket: %s", strerror(errno));
        return GS_EXIT_CONN;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        int admin = strcmp(which, "admin") == 0;
        gs_err("cannot connect to %s socket %s: %s", which, path, strerror(e));
        if (e == ENOENT || e == ECONNREFUSED)
            fprintf(stderr, "gpuswap: is gpuswapd running? Point to it with %s or %s\n",
                    admin ? "--admin-socket" : "--socket",
                    admin ? "GPUSWAP_ADMIN_SOCKET" : "GPUSWAP_SOCKET");
        else if (e == EACCES && admin)
            fprintf(stderr, "gpuswap: the admin socket is for root and the daemon's user\n");
        return GS_EXIT_CONN;
    }
    c->fd = fd;
    gs_lines_init(&c->in, fd);
    return strcmp(which, "admin") ? gs_conn_auth(c) : 0;
}

void gs_conn_close(gs_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    gs_lines_free(&c->in);
}

/* Writes line whole. Returns 0, or -errno (nothing printed). */
static int gs_conn_send(gs_conn_t *c, const char *line)
{
    size_t n = strlen(line);
    while (n) {
        ssize_t w = send(c->fd, line, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        line += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The final line of a request. */

void gs_answer_free(gs_answer_t *a)
{
    proto_event_free(&a->ev);
    free(a->line);
    memset(a, 0, sizeof *a);
}

/* Called with each token or progress event of the request in flight. */

/* Sends a cancel for target; returns 0 or GS_EXIT_CONN. */
static int gs_conn_cancel(gs_conn_t *c, const json_t *target)
{
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_CANCEL;
    req.id = json_integer(++c->next_id);
    req.target_id = (json_t *)target;
    char *line = proto_encode_request(&req);
    json_decref(req.id);
    if (!line) {
        gs_err("out of memory");
        return GS_EXIT_CONN;
    }
    int e = gs_conn_send(c, line);
    free(line);
    if (e) {
        gs_err("connection to %s lost: %s", c->path, strerror(-e));
        return GS_EXIT_CONN;
    }
    return 0;
}

/* Sends req (its id is assigned here; req->id must be NULL) and reads until the
 * request's final line, passing token and progress events to fn. When
 * cancellable, a SIGINT/SIGTERM sends a cancel and keeps waiting (at most
 * GS_CANCEL_WAIT_MS) for the final line, marking ans->interrupted; otherwise,
 * or at a second signal, it gives up. Returns 0 with *ans filled (caller frees
 * with gs_answer_free), 128+signal when interrupted without an answer, or
 * GS_EXIT_CONN (message printed) when the connection failed. */
int gs_conn_call(gs_conn_t *c, proto_req_t *req, int cancellable, gs_partial_fn fn, void *ctx,
                 gs_answer_t *ans)
{
    memset(ans, 0, sizeof *ans);
    json_t *id = json_integer(++c->next_id);
    req->id = id;
    char *out = proto_encode_request(req);
    req->id = NULL;
    if (!out) {
        json_decref(id);
        gs_err("cannot encode the request (out of memory or a value out of range)");
        return GS_EXIT_USAGE;
    }
    /* a failed write may still have an answer waiting: the daemon refuses a line
     * over its max_line with too_large and hangs up while we are still sending */
    int send_err = -gs_conn_send(c, out);
    free(out);
    int64_t deadline = send_err ? gs_now_ms() + 1000 : -1;
    int sig = 0, rc = 0;
    while (rc == 0) {
        char *line;
        size_t len;
        int r = gs_lines_next(&c->in, deadline, &line, &len);
        if (r == GS_LINE_SIGNAL) {
            int s = gs_signal_take();
            if (!cancellable || sig || send_err) {
                rc = 128 + s;
                break;
            }
            sig = s;
            deadline = gs_now_ms() + GS_CANCEL_WAIT_MS;
            rc = gs_conn_cancel(c, id);
            continue;
        }
        if (r == GS_LINE_TIMEOUT && sig) {
            gs_err("no answer to the cancel within %d ms; giving up", GS_CANCEL_WAIT_MS);
            rc = 128 + sig;
            break;
        }
        if (r != GS_LINE_OK) {
            if (sig) {
                rc = 128 + sig;
            } else if (send_err) {
                gs_err("connection to %s lost: %s", c->path, strerror(send_err));
                rc = GS_EXIT_CONN;
            } else {
                if (r == GS_LINE_EOF)
                    gs_err("connection to %s lost: the daemon closed it", c->path);
                else if (r == GS_LINE_PARTIAL)
                    gs_err("connection to %s lost in the middle of an answer", c->path);
                else if (r == GS_LINE_TOOLONG)
                    gs_err("answer from %s longer than %zu bytes", c->path, GS_LINE_MAX);
                else
                    gs_err("connection to %s lost: %s", c->path, strerror(errno));
                rc = GS_EXIT_CONN;
            }
            break;
        }
        proto_event_t ev;
        char err[256];
        if (proto_parse_event(line, len, &ev, err, sizeof err) != 0) {
            gs_err("unreadable answer from %s: %s", c->path, err);
            rc = GS_EXIT_CONN;
            break;
        }
        /* another request's line (our cancel's answer); an error tagged null
         * (bad_json, too_large, forbidden) is about the only request we sent */
        int ours = ev.id ? json_equal(ev.id, id) : ev.kind == PROTO_EV_ERROR;
        if (!ours) {
            proto_event_free(&ev);
            continue;
        }
        if (ev.kind == PROTO_EV_TOKEN || ev.kind == PROTO_EV_PROGRESS) {
            if (fn)
                fn(&ev, ctx);
            proto_event_free(&ev);
            continue;
        }
        ans->ev = ev;
        ans->line = strdup(line);
        ans->interrupted = sig;
        if (!ans->line) {
            gs_answer_free(ans);
            gs_err("out of memory");
            rc = GS_EXIT_CONN;
        }
        break;
    }
    json_decref(id);
    return rc;
}

/* ------------------------------------------------------------------ answers */

const char *gs_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* A number field (integer or real); dflt when absent or not a number. */
double gs_num(const json_t *o, const char *key, double dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* Prints an error answer as "gpuswap: CODE: MESSAGE" on stderr. */
static void gs_print_error(const gs_answer_t *a)
{
    const json_t *e = json_object_get(a->ev.root, "error");
    gs_err("%s: %s", gs_str(e, "code"), gs_str(e, "message"));
}

/* Sends the auth op with gs_api_key (if set) on a fresh inference connection.
 * 0, GS_EXIT_ERROR after printing the daemon's refusal, or GS_EXIT_CONN. */
static int gs_conn_auth(gs_conn_t *c)
{
    if (!gs_api_key)
        return 0;
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_AUTH;
    req.key = (char *)gs_api_key; /* borrowed: not freed here */
    gs_answer_t a;
    int rc = gs_conn_call(c, &req, 0, NULL, NULL, &a);
    if (rc) {
        gs_conn_close(c);
        return rc;
    }
    if (a.ev.kind == PROTO_EV_ERROR) {
        gs_print_error(&a);
        rc = GS_EXIT_ERROR;
        gs_conn_close(c);
    }
    gs_answer_free(&a);
    return rc;
}

/* Shared ending of a command: prints the error, or the answer line with --json.
 * Returns GS_EXIT_ERROR for an error answer, else -1 (caller goes on to print text). */
int gs_answer_common(const gs_answer_t *a, int json)
{
    if (json) {
        puts(a->line);
        fflush(stdout);
    }
    if (a->ev.kind == PROTO_EV_ERROR) {
        gs_print_error(a);
        return GS_EXIT_ERROR;
    }
    return -1;
}

/* "a, b, c" from an array of strings, or "none"; malloc'ed. */
char *gs_join_names(const json_t *arr)
{
    size_t n = 5, i;
    const json_t *v;
    json_array_foreach (arr, i, v) {
        n += strlen(json_string_value(v) ? json_string_value(v) : "") + 2;
    }
    char *s = malloc(n);
    if (!s)
        return NULL;
    s[0] = '\0';
    json_array_foreach (arr, i, v) {
        if (i)
            strcat(s, ", ");
        strcat(s, json_string_value(v) ? json_string_value(v) : "");
    }
    if (!s[0])
        strcpy(s, "none");
    return s;
}

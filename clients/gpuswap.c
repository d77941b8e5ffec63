/* gpuswap: the command-line client of gpuswapd, speaking the JSON-line sockets of proto/PROTOCOL.md. */

#include "keyhash.h"
#include "fleet.h"
#include "proto.h"
#include "base/util.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GS_DEFAULT_SOCKET "/run/gpuswapd/gpuswapd.sock"
#define GS_DEFAULT_ADMIN "/run/gpuswapd/admin.sock"
#define GS_LINE_INIT 1024             /* bytes: first size of a line buffer (grows by doubling) */
#define GS_LINE_MAX ((size_t)1 << 30) /* bytes: longest line accepted from the daemon or stdin */
#define GS_CANCEL_WAIT_MS 3000        /* ms to wait for the cancelled done after Ctrl-C */
#define GS_MIB 1048576.0

/* Exit codes (documented in the top-level --help). */
enum {
    GS_EXIT_OK = 0,
    GS_EXIT_ERROR = 1,
    GS_EXIT_USAGE = 2,
    GS_EXIT_CONN = 3
};

/* ------------------------------------------------------------------ messages */

static void gs_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gs_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpuswap: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int64_t gs_now_ms(void)
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

static void gs_signals_init(void)
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
static int gs_signal_take(void)
{
    int s = g_signal;
    g_signal = 0;
    return s;
}

/* ------------------------------------------------------------------ line reader */

enum {
    GS_LINE_OK = 1,       /* a whole line */
    GS_LINE_EOF = 0,      /* end of input at a line boundary */
    GS_LINE_ERR = -1,     /* read or poll error (errno) */
    GS_LINE_TIMEOUT = -2, /* the deadline passed */
    GS_LINE_SIGNAL = -3,  /* a signal arrived (g_signal is set) */
    GS_LINE_TOOLONG = -4, /* a line longer than GS_LINE_MAX */
    GS_LINE_PARTIAL = -5, /* end of input in the middle of a line (the line is returned) */
};

typedef struct gs_lines {
    int fd;
    char *buf; /* (cap) bytes; unread data is [start, end); one byte always spare for a NUL */
    size_t start, end, cap;
    size_t scan; /* bytes after start already searched for '\n' */
    int eof;
} gs_lines_t;

static void gs_lines_init(gs_lines_t *lb, int fd)
{
    memset(lb, 0, sizeof *lb);
    lb->fd = fd;
}

static void gs_lines_free(gs_lines_t *lb)
{
    free(lb->buf);
    lb->buf = NULL;
    lb->start = lb->end = lb->cap = lb->scan = 0;
}

/* Waits until fd (or nothing, fd < 0) is readable or deadline (monotonic ms, < 0 = never).
 * Returns 1 readable, GS_LINE_TIMEOUT, GS_LINE_SIGNAL or GS_LINE_ERR. */
static int gs_wait(int fd, int64_t deadline)
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

static int gs_lines_next(gs_lines_t *lb, int64_t deadline, char **line, size_t *len)
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

typedef struct gs_answer gs_answer_t;
/* Called with each token or progress event of the request in flight. */
typedef void (*gs_partial_fn)(const proto_event_t *ev, void *ctx);

typedef struct gs_conn {
    const char *path; /* the socket path (borrowed) */
    int fd;
    gs_lines_t in; /* lines from the daemon */
    json_int_t next_id;
} gs_conn_t;

static const char
    *g_api_key; /* --api-key or GPUSWAP_API_KEY: authenticates inference connections */

static int gs_conn_call(gs_conn_t *c, proto_req_t *req, int cancellable, gs_partial_fn fn,
                        void *ctx, struct gs_answer *ans);
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
static int gs_conn_open(gs_conn_t *c, const char *path, const char *which)
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

static void gs_conn_close(gs_conn_t *c)
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
struct gs_answer {
    proto_event_t ev; /* kind DONE, OK or ERROR; owns the parsed line */
    char *line;       /* the line as received (malloc'ed, no newline) */
    int interrupted;  /* the signal that made us send a cancel, else 0 */
};

static void gs_answer_free(gs_answer_t *a)
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
static int gs_conn_call(gs_conn_t *c, proto_req_t *req, int cancellable, gs_partial_fn fn,
                        void *ctx, gs_answer_t *ans)
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

static const char *gs_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* A number field (integer or real); dflt when absent or not a number. */
static double gs_num(const json_t *o, const char *key, double dflt)
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

/* Sends the auth op with g_api_key (if set) on a fresh inference connection.
 * 0, GS_EXIT_ERROR after printing the daemon's refusal, or GS_EXIT_CONN. */
static int gs_conn_auth(gs_conn_t *c)
{
    if (!g_api_key)
        return 0;
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_AUTH;
    req.key = (char *)g_api_key; /* borrowed: not freed here */
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
static int gs_answer_common(const gs_answer_t *a, int json)
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
static char *gs_join_names(const json_t *arr)
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

/* ------------------------------------------------------------------ options */

enum gs_key {
    K_HELP,
    K_SOCKET,
    K_ADMIN,
    K_JSON,
    K_MODEL,
    K_MAX_TOKENS,
    K_SEED,
    K_STOP,
    K_VERBOSE,
    K_SYSTEM,
    K_WATCH,
    K_INTERVAL,
    K_COUNT,
    K_API_KEY,
    K_SAMPLER, /* K_SAMPLER + i: sampling parameter i of sampler_params.h */
};

/* Which commands take an option. */
#define S_GLOBAL 0x01u
#define S_MODEL 0x02u
#define S_SAMPLING 0x04u
#define S_VERBOSE 0x08u
#define S_SYSTEM 0x10u
#define S_WATCH 0x20u

typedef struct gs_optdef {
    const char *lng; /* --long */
    char shrt;       /* -s, or 0 */
    int has_arg;
    unsigned set; /* S_* */
    enum gs_key key;
} gs_optdef_t;

static const gs_optdef_t gs_optdefs[] = {
    {"help", 'h', 0, S_GLOBAL, K_HELP},
    {"socket", 0, 1, S_GLOBAL, K_SOCKET},
    {"admin-socket", 0, 1, S_GLOBAL, K_ADMIN},
    {"json", 0, 0, S_GLOBAL, K_JSON},
    {"api-key", 0, 1, S_GLOBAL, K_API_KEY},
    {"model", 'm', 1, S_MODEL, K_MODEL},
    {"max-tokens", 'n', 1, S_SAMPLING, K_MAX_TOKENS},
/* --top-p for top_p: gs_optname_eq takes '-' for '_' */
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    {#name, 0, 1, S_SAMPLING, (enum gs_key)(K_SAMPLER + SAMPLER_PARAM_##name)},
    SAMPLER_PARAMS(X)
#undef X
        {"temp", 0, 1, S_SAMPLING, (enum gs_key)(K_SAMPLER + SAMPLER_PARAM_temperature)},
    {"seed", 0, 1, S_SAMPLING, K_SEED},
    {"stop", 0, 1, S_SAMPLING, K_STOP},
    {"verbose", 'v', 0, S_VERBOSE, K_VERBOSE},
    {"system", 0, 1, S_SYSTEM, K_SYSTEM},
    {"watch", 'w', 0, S_WATCH, K_WATCH},
    {"interval", 'i', 1, S_WATCH, K_INTERVAL},
    {"count", 'c', 1, S_WATCH, K_COUNT},
};
#define GS_N_OPTDEFS (sizeof gs_optdefs / sizeof gs_optdefs[0])

/* Everything the command line says. Strings are borrowed from argv or the environment. */
typedef struct gs_opts {
    const char *socket, *admin_socket;
    const char *api_key; /* sent in an auth op on the inference socket; NULL = none */
    int json, verbose, help;
    const char *model;
    const char *system;
    proto_req_t samp;           /* sampling fields and has_* flags; stop points into stop[] */
    char *stop[PROTO_MAX_STOP]; /* borrowed */
    int watch;
    double interval; /* s between stats refreshes */
    long count;      /* refreshes, 0 = until interrupted */
    char **pos;      /* (n_pos) positional arguments */
    int n_pos;
} gs_opts_t;

typedef struct gs_cmd gs_cmd_t;
struct gs_cmd {
    const char *name;
    int (*run)(const gs_cmd_t *cmd, gs_opts_t *o);
    unsigned opts;       /* S_* beyond S_GLOBAL */
    const char *summary; /* one line for the command list */
    const char *help;    /* full text for CMD --help */
};

static int gs_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int gs_usage_error(const char *cmd, const char *fmt, ...)
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

static int gs_parse_ll(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int gs_parse_f32(const char *s, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || fabs(v) > FLT_MAX)
        return -1;
    *out = (float)v;
    return 0;
}

/* Applies one option with its value. Returns 0 or GS_EXIT_USAGE (message printed). */
static int gs_opt_apply(const char *cmd, gs_opts_t *o, const gs_optdef_t *d, const char *val)
{
    proto_req_t *s = &o->samp;
    long long v;
    if (d->key >= K_SAMPLER) {
        /* only the number is checked here: the daemon checks the range, in one place */
        int i = (int)(d->key - K_SAMPLER);
        float f;
        if (sampler_param_descs[i].kind == SAMPLER_KIND_I32) {
            if (gs_parse_ll(val, INT32_MIN, INT32_MAX, &v))
                return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
            proto_req_sampler_set(s, i, (double)v);
        } else {
            if (gs_parse_f32(val, &f))
                return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
            proto_req_sampler_set(s, i, f);
        }
        return 0;
    }
    switch (d->key) {
    case K_HELP: o->help = 1; return 0;
    case K_SOCKET: o->socket = val; return 0;
    case K_ADMIN: o->admin_socket = val; return 0;
    case K_API_KEY: o->api_key = val; return 0;
    case K_JSON: o->json = 1; return 0;
    case K_MODEL: o->model = val; return 0;
    case K_VERBOSE: o->verbose = 1; return 0;
    case K_SYSTEM: o->system = val; return 0;
    case K_WATCH: o->watch = 1; return 0;
    case K_MAX_TOKENS:
        if (gs_parse_ll(val, 0, INT32_MAX, &v))
            break;
        s->max_tokens = (int32_t)v;
        s->has_max_tokens = 1;
        return 0;
    case K_SEED:
        if (gs_parse_ll(val, 0, INT64_MAX, &v))
            break;
        s->seed = (uint64_t)v;
        s->has_seed = 1;
        return 0;
    case K_SAMPLER: break;
    case K_STOP:
        if (s->n_stop >= PROTO_MAX_STOP)
            return gs_usage_error(cmd, "at most %d --stop strings", PROTO_MAX_STOP);
        if (!*val)
            return gs_usage_error(cmd, "--stop needs a non-empty string");
        o->stop[s->n_stop++] = (char *)val;
        s->stop = o->stop;
        return 0;
    case K_INTERVAL: {
        char *end;
        errno = 0;
        double iv = strtod(val, &end);
        if (!*val || *end || errno || !(iv > 0) || iv > 86400)
            return gs_usage_error(cmd, "--interval takes seconds > 0 (got '%s')", val);
        o->interval = iv;
        o->watch = 1;
        return 0;
    }
    case K_COUNT:
        if (gs_parse_ll(val, 1, LONG_MAX, &v))
            return gs_usage_error(cmd, "--count takes a positive integer (got '%s')", val);
        o->count = (long)v;
        o->watch = 1;
        return 0;
    }
    return gs_usage_error(cmd, "invalid value '%s' for --%s", val, d->lng);
}

/* 1 when the nl bytes of name spell the option lng, '-' standing for its '_'. */
static int gs_optname_eq(const char *lng, const char *name, size_t nl)
{
    if (strlen(lng) != nl)
        return 0;
    for (size_t i = 0; i < nl; i++)
        if (lng[i] != name[i] && !(lng[i] == '_' && name[i] == '-'))
            return 0;
    return 1;
}

/* Parses argv[from..argc) as options in the sets allowed (S_GLOBAL always)
 * and positional arguments; stops at the first positional when stop_at_pos.
 * Returns the index it stopped at, or -GS_EXIT_USAGE. */
static int gs_opts_parse(const char *cmd, gs_opts_t *o, unsigned allowed, int argc, char **argv,
                         int from, int stop_at_pos)
{
    allowed |= S_GLOBAL;
    int only_pos = 0;
    int i;
    for (i = from; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (stop_at_pos)
                return i;
            o->pos[o->n_pos++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const gs_optdef_t *d = NULL;
        const char *val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t nl = eq ? (size_t)(eq - name) : strlen(name);
            for (size_t k = 0; k < GS_N_OPTDEFS; k++)
                if (gs_optname_eq(gs_optdefs[k].lng, name, nl))
                    d = &gs_optdefs[k];
            if (d && eq) {
                if (!d->has_arg)
                    return -gs_usage_error(cmd, "option '--%s' takes no value", d->lng);
                val = eq + 1;
            }
        } else {
            for (size_t k = 0; k < GS_N_OPTDEFS; k++)
                if (gs_optdefs[k].shrt == a[1])
                    d = &gs_optdefs[k];
            if (d && a[2]) {
                if (!d->has_arg)
                    return -gs_usage_error(cmd, "option '-%c' takes no value", a[1]);
                val = a + 2;
            }
        }
        if (!d || !(d->set & allowed)) {
            if (!cmd && d)
                return -gs_usage_error(cmd, "option '%s' goes after the command", a);
            return -gs_usage_error(cmd, "unknown option '%s'%s%s", a, cmd ? " for " : "",
                                   cmd ? cmd : "");
        }
        if (d->has_arg && !val) {
            if (i + 1 >= argc)
                return -gs_usage_error(cmd, "option '%s' needs a value", a);
            val = argv[++i];
        }
        if (gs_opt_apply(cmd, o, d, val))
            return -GS_EXIT_USAGE;
    }
    return i;
}

/* Copies the sampling options and stream flag into a request. */
static void gs_req_sampling(proto_req_t *req, const gs_opts_t *o)
{
    const proto_req_t *s = &o->samp;
    req->max_tokens = s->max_tokens;
    req->has_max_tokens = s->has_max_tokens;
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    req->name = s->name;                                                                           \
    req->has_##name = s->has_##name;
    SAMPLER_PARAMS(X)
#undef X
    req->seed = s->seed;
    req->has_seed = s->has_seed;
    req->stop = s->stop;
    req->n_stop = s->n_stop;
}

/* ------------------------------------------------------------------ generate, chat */

typedef struct gs_stream {
    int printed; /* bytes of token text written to stdout */
} gs_stream_t;

static void gs_on_token(const proto_event_t *ev, void *ctx)
{
    gs_stream_t *st = ctx;
    const json_t *t = json_object_get(ev->root, "text");
    size_t n = json_string_length(t);
    if (n) {
        fwrite(json_string_value(t), 1, n, stdout);
        fflush(stdout);
        st->printed += (int)n;
    }
}

/* Timing of a done event, on stderr (-v). */
static void gs_print_timing(const gs_answer_t *a)
{
    const json_t *r = a->ev.root;
    const json_t *u = json_object_get(r, "usage"), *t = json_object_get(r, "timing");
    double total = gs_num(t, "total_ms", 0), ttft = gs_num(t, "ttft_ms", 0);
    double gen = gs_num(u, "completion_tokens", 0);
    fprintf(stderr,
            "gpuswap: %.0f prompt + %.0f generated tokens (%s); queue %.1f ms, swap %.1f ms%s, "
            "ttft %.1f ms, total %.1f ms",
            gs_num(u, "prompt_tokens", 0), gen, gs_str(r, "finish_reason"),
            gs_num(t, "queue_ms", 0), gs_num(t, "swap_ms", 0),
            json_is_true(json_object_get(t, "swapped")) ? " (swapped)" : "", ttft, total);
    if (gen > 1 && total > ttft)
        fprintf(stderr, ", %.1f tokens/s after the first", (gen - 1) * 1e3 / (total - ttft));
    fputc('\n', stderr);
}

/* Reads all of stdin into a malloc'ed string, without one trailing newline. NULL on error. */
static char *gs_read_stdin(void)
{
    size_t n = 0, cap = 4096;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *ns = cap < GS_LINE_MAX ? realloc(s, cap * 2) : NULL;
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
            cap *= 2;
        }
        ssize_t r = read(0, s + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(s);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n && s[n - 1] == '\n')
        n--;
    if (n && s[n - 1] == '\r')
        n--;
    s[n] = '\0';
    return s;
}

static int gs_cmd_generate(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (!o->model)
        return gs_usage_error(cmd->name, "generate needs -m MODEL");
    char *prompt = NULL;
    if (o->n_pos == 0 || (o->n_pos == 1 && strcmp(o->pos[0], "-") == 0)) {
        if (o->n_pos == 0 && isatty(0))
            return gs_usage_error(cmd->name, "no prompt (give it as an argument, or on stdin)");
        prompt = gs_read_stdin();
        if (!prompt) {
            gs_err("cannot read the prompt from stdin: %s", strerror(errno));
            return GS_EXIT_USAGE;
        }
    } else {
        size_t n = 1;
        for (int i = 0; i < o->n_pos; i++)
            n += strlen(o->pos[i]) + 1;
        prompt = malloc(n);
        if (!prompt) {
            gs_err("out of memory");
            return GS_EXIT_ERROR;
        }
        prompt[0] = '\0';
        for (int i = 0; i < o->n_pos; i++) {
            if (i)
                strcat(prompt, " ");
            strcat(prompt, o->pos[i]);
        }
    }
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_GENERATE;
    req.model = (char *)o->model;
    req.prompt = prompt;
    gs_req_sampling(&req, o);
    req.stream = !o->json;

    gs_conn_t c;
    int rc = gs_conn_open(&c, o->socket, "inference");
    if (rc) {
        free(prompt);
        return rc;
    }
    gs_stream_t st = {0};
    gs_answer_t a;
    rc = gs_conn_call(&c, &req, 1, gs_on_token, &st, &a);
    free(prompt);
    gs_conn_close(&c);
    if (rc) {
        if (st.printed)
            putchar('\n');
        return rc;
    }
    if (a.ev.kind == PROTO_EV_DONE && !o->json)
        putchar('\n');
    else if (st.printed)
        putchar('\n');
    fflush(stdout);
    rc = gs_answer_common(&a, o->json);
    if (rc < 0) {
        rc = GS_EXIT_OK;
        if (o->verbose)
            gs_print_timing(&a);
        if (a.interrupted) {
            gs_err("cancelled");
            rc = 128 + a.interrupted;
        }
    }
    gs_answer_free(&a);
    return rc;
}

typedef struct gs_history {
    proto_msg_t *m; /* (n) messages; contents owned */
    size_t n, cap;
} gs_history_t;

static int gs_history_add(gs_history_t *h, const char *role, const char *content, size_t len)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 8;
        proto_msg_t *nm = realloc(h->m, cap * sizeof *nm);
        if (!nm)
            return -1;
        h->m = nm;
        h->cap = cap;
    }
    proto_msg_t *m = &h->m[h->n];
    memset(m, 0, sizeof *m);
    snprintf(m->role, sizeof m->role, "%s", role);
    m->content = malloc(len + 1);
    if (!m->content)
        return -1;
    memcpy(m->content, content, len);
    m->content[len] = '\0';
    h->n++;
    return 0;
}

static void gs_history_truncate(gs_history_t *h, size_t n)
{
    while (h->n > n)
        free(h->m[--h->n].content);
}

static int gs_cmd_chat(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (!o->model)
        return gs_usage_error(cmd->name, "chat needs -m MODEL");
    if (o->n_pos)
        return gs_usage_error(cmd->name, "chat takes no arguments (it reads messages from stdin)");
    gs_history_t h = {0};
    if (o->system && gs_history_add(&h, "system", o->system, strlen(o->system))) {
        gs_err("out of memory");
        return GS_EXIT_ERROR;
    }
    size_t base = h.n;
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->socket, "inference");
    if (rc) {
        gs_history_truncate(&h, 0);
        free(h.m);
        return rc;
    }
    int tty = isatty(0);
    if (tty)
        fprintf(stderr,
                "Chatting with %s. /exit or Ctrl-D ends, /reset forgets the history, "
                "Ctrl-C stops an answer.\n",
                o->model);
    gs_lines_t in;
    gs_lines_init(&in, 0);
    rc = GS_EXIT_OK;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        char *line;
        size_t len;
        int r = gs_lines_next(&in, -1, &line, &len);
        if (r == GS_LINE_SIGNAL) {
            if (tty)
                putchar('\n');
            rc = 128 + gs_signal_take();
            break;
        }
        if (r == GS_LINE_EOF) {
            if (tty)
                putchar('\n');
            break;
        }
        if (r != GS_LINE_OK && r != GS_LINE_PARTIAL) {
            gs_err("cannot read stdin: %s",
                   r == GS_LINE_TOOLONG ? "line too long" : strerror(errno));
            rc = GS_EXIT_ERROR;
            break;
        }
        size_t b = 0;
        while (b < len && (line[b] == ' ' || line[b] == '\t'))
            b++;
        if (b == len)
            continue;
        if (strcmp(line + b, "/exit") == 0 || strcmp(line + b, "/quit") == 0)
            break;
        if (strcmp(line + b, "/reset") == 0) {
            gs_history_truncate(&h, base);
            continue;
        }
        if (gs_history_add(&h, "user", line, len)) {
            gs_err("out of memory");
            rc = GS_EXIT_ERROR;
            break;
        }
        proto_req_t req;
        memset(&req, 0, sizeof req);
        req.op = PROTO_OP_CHAT;
        req.model = (char *)o->model;
        req.messages = h.m;
        req.n_messages = h.n;
        gs_req_sampling(&req, o);
        req.stream = !o->json;
        gs_stream_t st = {0};
        gs_answer_t a;
        rc = gs_conn_call(&c, &req, 1, gs_on_token, &st, &a);
        if (rc) {
            if (st.printed)
                putchar('\n');
            break;
        }
        if (st.printed || (a.ev.kind == PROTO_EV_DONE && !o->json))
            putchar('\n');
        fflush(stdout);
        int e = gs_answer_common(&a, o->json);
        if (e >= 0) {
            gs_history_truncate(&h, h.n - 1); /* drop the unanswered turn */
            gs_answer_free(&a);
            if (!tty) {
                rc = e;
                break;
            }
            continue;
        }
        const json_t *t = json_object_get(a.ev.root, "text");
        if (o->verbose)
            gs_print_timing(&a);
        if (a.interrupted)
            fprintf(stderr, "[answer cancelled]\n");
        int oom = gs_history_add(&h, "assistant", json_string_value(t), json_string_length(t));
        gs_answer_free(&a);
        if (oom) {
            gs_err("out of memory");
            rc = GS_EXIT_ERROR;
            break;
        }
    }
    fflush(stdout);
    gs_lines_free(&in);
    gs_conn_close(&c);
    gs_history_truncate(&h, 0);
    free(h.m);
    return rc;
}

/* ------------------------------------------------------------------ models, stats */

/* "693.4K", "8.03B": a parameter count for humans. */
static void gs_fmt_count(char *buf, size_t n, double v)
{
    if (v >= 1e9)
        snprintf(buf, n, "%.2fB", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, n, "%.1fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, n, "%.1fK", v / 1e3);
    else
        snprintf(buf, n, "%.0f", v);
}

static int gs_cmd_models(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos)
        return gs_usage_error(cmd->name, "models takes no arguments");
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->socket, "inference");
    if (rc)
        return rc;
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_MODELS;
    gs_answer_t a;
    rc = gs_conn_call(&c, &req, 0, NULL, NULL, &a);
    gs_conn_close(&c);
    if (rc)
        return rc;
    rc = gs_answer_common(&a, o->json);
    if (rc < 0) {
        rc = GS_EXIT_OK;
        if (!o->json) {
            const json_t *models = json_object_get(a.ev.root, "models"), *m;
            size_t i;
            int w = 5;
            json_array_foreach (models, i, m) {
                if ((int)strlen(gs_str(m, "name")) > w)
                    w = (int)strlen(gs_str(m, "name"));
            }
            printf("%-*s  %-9s %-6s %-6s %5s %8s %8s  %s\n", w, "MODEL", "STATE", "ARCH", "TYPE",
                   "BITS", "PARAMS", "CONTEXT", "TENSORS");
            json_array_foreach (models, i, m) {
                char params[32];
                gs_fmt_count(params, sizeof params, gs_num(m, "params", 0));
                printf("%-*s  %-9s %-6s %-6s %5.2f %8s %8.0f  ", w, gs_str(m, "name"),
                       gs_str(m, "state"), gs_str(m, "arch"), gs_str(m, "type"),
                       8 * gs_num(m, "bytes_per_param", 0), params, gs_num(m, "context", 0));
                /* tensor count per type: q4_k:193,q6_k:33,f32:65 */
                const char *type, *sep = "";
                const json_t *n;
                json_object_foreach ((json_t *)json_object_get(m, "tensor_types"), type, n) {
                    printf("%s%s:%.0f", sep, type, json_number_value(n));
                    sep = ",";
                }
                printf("%s\n", *sep ? "" : "-");
            }
        }
    }
    gs_answer_free(&a);
    return rc;
}

static void gs_print_stats(const json_t *r)
{
    double up = gs_num(r, "uptime_s", 0);
    printf("gpuswapd: up %.0fh%02.0fm%02.0fs, backend %s, policy %s\n", floor(up / 3600),
           floor(fmod(up, 3600) / 60), floor(fmod(up, 60)), gs_str(r, "backend"),
           gs_str(r, "policy"));
    const json_t *models = json_object_get(r, "models"), *m;
    const char *name;
    int w = 5;
    json_object_foreach ((json_t *)models, name, m) {
        if ((int)strlen(name) > w)
            w = (int)strlen(name);
    }
    printf("%-*s  %-9s %18s %9s %9s %8s %6s %16s\n", w, "MODEL", "STATE", "RESIDENT/QUOTA MiB",
           "PAGE-INS", "EVICTIONS", "HIT RATE", "QUEUE", "TTFT p50/p99 ms");
    json_object_foreach ((json_t *)models, name, m) {
        char res[48], hit[16], ttft[48];
        double quota = gs_num(m, "gpu_quota", 0);
        if (quota > 0)
            snprintf(res, sizeof res, "%.1f/%.1f", gs_num(m, "curr_resident_bytes", 0) / GS_MIB,
                     quota / GS_MIB);
        else
            snprintf(res, sizeof res, "%.1f/-", gs_num(m, "curr_resident_bytes", 0) / GS_MIB);
        double hits = gs_num(m, "total_hits", 0), misses = gs_num(m, "total_misses", 0);
        if (hits + misses > 0)
            snprintf(hit, sizeof hit, "%.1f%%", 100.0 * hits / (hits + misses));
        else
            snprintf(hit, sizeof hit, "-");
        const json_t *hist = json_object_get(m, "hist_ttft_ms");
        int have_ttft =
            hist ? gs_num(hist, "count", 0) > 0 : json_object_get(m, "ttft_ms_p50") != NULL;
        if (have_ttft)
            snprintf(ttft, sizeof ttft, "%.1f/%.1f", gs_num(m, "ttft_ms_p50", 0),
                     gs_num(m, "ttft_ms_p99", 0));
        else
            snprintf(ttft, sizeof ttft, "-");
        double ev = gs_num(m, "evictions_capacity", 0) + gs_num(m, "evictions_quota", 0) +
                    gs_num(m, "evictions_admin", 0) + gs_num(m, "evictions_preemption", 0);
        printf("%-*s  %-9s %18s %9.0f %9.0f %8s %6.0f %16s\n", w, name, gs_str(m, "state"), res,
               gs_num(m, "total_page_ins", 0), ev, hit, gs_num(m, "curr_queued", 0), ttft);
    }
    const json_t *p = json_object_get(r, "pool");
    double page = gs_num(p, "page_size", 0), used = gs_num(p, "curr_pool_used", 0),
           fr = gs_num(p, "curr_pool_free", 0);
    printf("pool: %.0f/%.0f pages used, %.0f free; %.1f MiB used, %.1f MiB free (%.0f KiB pages)\n",
           used, gs_num(p, "curr_pool_pages", 0), fr, used * page / GS_MIB, fr * page / GS_MIB,
           page / 1024);
    /* API keys (auth:): usage per key, failed attempts per listener that requires keys */
    const json_t *auth = json_object_get(r, "auth"), *keys = json_object_get(auth, "keys"), *k;
    if (json_object_size(keys)) {
        int kw = 7;
        json_object_foreach ((json_t *)keys, name, k) {
            if ((int)strlen(name) > kw)
                kw = (int)strlen(name);
        }
        printf("%-*s  %10s %12s %24s %9s\n", kw, "API KEY", "REQUESTS", "TOKENS",
               "REJECTED RATE/CONC/TPM", "IN FLIGHT");
        json_object_foreach ((json_t *)keys, name, k) {
            char rej[64];
            snprintf(rej, sizeof rej, "%.0f/%.0f/%.0f", gs_num(k, "rejected_rate", 0),
                     gs_num(k, "rejected_concurrency", 0), gs_num(k, "rejected_tokens", 0));
            printf("%-*s  %10.0f %12.0f %24s %9.0f\n", kw, name, gs_num(k, "total_requests", 0),
                   gs_num(k, "total_tokens", 0), rej, gs_num(k, "curr_inflight", 0));
        }
    }
    const json_t *lst = json_object_get(auth, "listeners"), *l;
    json_object_foreach ((json_t *)lst, name, l) {
        if (json_is_true(json_object_get(l, "required")))
            printf(
                "auth on %s: %.0f ok, %.0f without a key, %.0f wrong keys, %.0f refused while backing off\n",
                name, gs_num(l, "total_auth_ok", 0), gs_num(l, "total_auth_missing", 0),
                gs_num(l, "total_auth_invalid", 0), gs_num(l, "total_auth_backoff", 0));
    }
}

static int gs_cmd_stats(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos)
        return gs_usage_error(cmd->name, "stats takes no arguments");
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->admin_socket, "admin");
    if (rc)
        return rc;
    int clear = o->watch && isatty(1);
    for (long k = 0;; k++) {
        proto_req_t req;
        memset(&req, 0, sizeof req);
        req.op = PROTO_OP_STATS;
        gs_answer_t a;
        rc = gs_conn_call(&c, &req, 0, NULL, NULL, &a);
        if (rc)
            break;
        if (clear && !o->json)
            fputs("\033[H\033[2J", stdout);
        else if (k > 0 && !o->json)
            putchar('\n');
        rc = gs_answer_common(&a, o->json);
        if (rc < 0 && !o->json)
            gs_print_stats(a.ev.root);
        fflush(stdout);
        gs_answer_free(&a);
        if (rc >= 0)
            break;
        rc = GS_EXIT_OK;
        if (!o->watch || (o->count && k + 1 >= o->count))
            break;
        int w = gs_wait(-1, gs_now_ms() + (int64_t)(o->interval * 1000));
        if (w == GS_LINE_SIGNAL) {
            rc = 128 + gs_signal_take();
            break;
        }
    }
    gs_conn_close(&c);
    return rc;
}

/* ------------------------------------------------------------------ admin ops */

typedef struct gs_progress {
    int tty;   /* stderr is a terminal: draw the bar */
    int drawn; /* a bar is on screen */
    const char *model;
} gs_progress_t;

static void gs_on_progress(const proto_event_t *ev, void *ctx)
{
    gs_progress_t *p = ctx;
    if (!p->tty)
        return;
    double b = gs_num(ev->root, "bytes", 0), t = gs_num(ev->root, "total", 0);
    double f = t > 0 ? b / t : 0;
    if (f > 1)
        f = 1;
    char bar[31];
    int fill = (int)(f * 30 + 0.5);
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r%s [%s] %3.0f%% %.1f/%.1f MiB", p->model, bar, f * 100, b / GS_MIB,
            t / GS_MIB);
    fflush(stderr);
    p->drawn = 1;
}

/* The model of load/evict/pin/unpin: -m MODEL or the one positional argument. */
static int gs_model_arg(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->model && o->n_pos == 0)
        return 0;
    if (!o->model && o->n_pos == 1) {
        o->model = o->pos[0];
        return 0;
    }
    return gs_usage_error(cmd->name, "%s takes exactly one model", cmd->name);
}

static int gs_cmd_admin(const gs_cmd_t *cmd, gs_opts_t *o)
{
    proto_req_t req;
    memset(&req, 0, sizeof req);
    if (strcmp(cmd->name, "reload") == 0 || strcmp(cmd->name, "drain") == 0) {
        if (o->n_pos)
            return gs_usage_error(cmd->name, "%s takes no arguments", cmd->name);
        req.op = cmd->name[0] == 'r' ? PROTO_OP_RELOAD : PROTO_OP_DRAIN;
    } else {
        if (gs_model_arg(cmd, o))
            return GS_EXIT_USAGE;
        req.model = (char *)o->model;
        req.op = strcmp(cmd->name, "load") == 0    ? PROTO_OP_LOAD
                 : strcmp(cmd->name, "evict") == 0 ? PROTO_OP_EVICT
                 : strcmp(cmd->name, "pin") == 0   ? PROTO_OP_PIN
                                                   : PROTO_OP_UNPIN;
        req.stream = req.op == PROTO_OP_LOAD;
    }
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->admin_socket, "admin");
    if (rc)
        return rc;
    gs_progress_t pr = {.tty = isatty(2), .model = o->model};
    gs_answer_t a;
    rc = gs_conn_call(&c, &req, 0, gs_on_progress, &pr, &a);
    gs_conn_close(&c);
    if (pr.drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    if (rc)
        return rc;
    rc = gs_answer_common(&a, o->json);
    if (rc < 0) {
        rc = GS_EXIT_OK;
        const json_t *r = a.ev.root;
        const char *model = json_string_value(json_object_get(r, "model"));
        if (!model)
            model = o->model;
        if (o->json) {
            /* printed already */
        } else if (req.op == PROTO_OP_LOAD) {
            printf("%s %s (%.1f MiB in %.1f ms)\n", model, gs_str(r, "state"),
                   gs_num(r, "bytes", 0) / GS_MIB, gs_num(r, "swap_ms", 0));
        } else if (req.op == PROTO_OP_EVICT) {
            printf("%s evicted (%.1f MiB freed)\n", model, gs_num(r, "bytes_evicted", 0) / GS_MIB);
        } else if (req.op == PROTO_OP_PIN || req.op == PROTO_OP_UNPIN) {
            printf("%s %s\n", model,
                   json_is_true(json_object_get(r, "pinned")) ? "pinned" : "unpinned");
        } else if (req.op == PROTO_OP_RELOAD) {
            char *ad = gs_join_names(json_object_get(r, "added"));
            char *rm = gs_join_names(json_object_get(r, "removed"));
            char *st = gs_join_names(json_object_get(r, "settings"));
            printf("reloaded: added %s; removed %s; changed ", ad ? ad : "?", rm ? rm : "?");
            /* each changed model with the keys that changed: "tiny (chat_template, gpu_quota)" */
            const json_t *ch = json_object_get(r, "changed"),
                         *keys = json_object_get(r, "changed_keys");
            size_t i;
            const json_t *m;
            if (!json_array_size(ch))
                printf("none");
            json_array_foreach (ch, i, m) {
                char *k = gs_join_names(json_object_get(keys, json_string_value(m)));
                printf("%s%s (%s)", i ? ", " : "", json_string_value(m), k ? k : "?");
                free(k);
            }
            printf("; settings %s\n", st ? st : "none");
            free(ad);
            free(rm);
            free(st);
        } else {
            printf("drained: %.0f requests completed during the drain; the daemon exits\n",
                   gs_num(r, "completed", 0));
        }
    }
    gs_answer_free(&a);
    return rc;
}

/* ------------------------------------------------------------------ help */

/* Marks where gs_cmd_help prints the sampling options (gs_sampling_help). */
#define GS_SAMPLING_HELP "\001"

/* The sampling options, from sampler_params.h. */
static void gs_sampling_help(FILE *f)
{
    fputs("  -n, --max-tokens N     tokens to generate at most (default: the model's)\n", f);
    for (int i = 0; i < SAMPLER_PARAM_COUNT; i++) {
        const sampler_param_desc_t *d = &sampler_param_descs[i];
        char opt[64], range[64];
        int n = snprintf(opt, sizeof opt, "--%s%s %s", d->name,
                         i == SAMPLER_PARAM_temperature ? ", --temp" : "",
                         d->kind == SAMPLER_KIND_I32 ? "N" : "F");
        for (int k = 2; k < n && opt[k] != ' ' && opt[k] != ','; k++)
            if (opt[k] == '_')
                opt[k] = '-';
        fprintf(f, "  %-22s %s\n", opt, d->help);
        fprintf(f, "  %-22s in %s; default: the model's (built in: %s)\n", "",
                sampler_param_range_text(d, range, sizeof range), d->def_text);
    }
    fputs("  --seed N               same request + seed + model = same tokens\n"
          "  --stop STR             stop when the text ends with STR (repeatable, up to 16)\n",
          f);
}

/* Prints a new API key and the config lines that accept it (the daemon stores only the hash). */
static int gs_cmd_keygen(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos > 1)
        return gs_usage_error(cmd->name, "keygen takes at most one NAME");
    const char *name = o->n_pos ? o->pos[0] : "NAME";
    char key[80], hash[KEYHASH_LEN + 1];
    if (keyhash_gen(key, sizeof key, hash)) {
        gs_err("cannot draw random bytes for a key");
        return GS_EXIT_ERROR;
    }
    if (o->json)
        printf("{\"key\":\"%s\",\"hash\":\"%s\",\"name\":\"%s\"}\n", key, hash, name);
    else
        printf(
            "%s\n"
            "# the API key above, shown once; paste this entry under auth.keys in gpuswapd.yaml:\n"
            "  - name: %s\n"
            "    hash: \"%s\"\n"
            "    models: [\"*\"]\n",
            key, name, hash);
    explicit_bzero(key, sizeof key);
    return GS_EXIT_OK;
}

static const gs_cmd_t gs_cmds[] = {
    {"generate", gs_cmd_generate, S_MODEL | S_SAMPLING | S_VERBOSE,
     "complete a prompt, streaming tokens",
     "usage: gpuswap generate -m MODEL [options] PROMPT...\n"
     "       gpuswap generate -m MODEL [options] < prompt.txt\n"
     "Streams the completion to stdout as it is generated, then a newline. The\n"
     "words of PROMPT are joined with spaces; without PROMPT (or with '-') the\n"
     "prompt is read from stdin. Ctrl-C cancels the request, prints what came so\n"
     "far and exits 130.\n"
     "  -m, --model MODEL      a configured model (see gpuswap models)\n" GS_SAMPLING_HELP
     "  -v, --verbose          print token counts and timing to stderr\n"
     "  --json                 print only the done event, one JSON line\n"},
    {"chat", gs_cmd_chat, S_MODEL | S_SAMPLING | S_VERBOSE | S_SYSTEM,
     "chat with a model (reads stdin)",
     "usage: gpuswap chat -m MODEL [--system TEXT] [options]\n"
     "Reads one user message per line from stdin (a terminal or a pipe), sends\n"
     "the whole conversation so far with the model's chat template, streams the\n"
     "answer and keeps it in the history. '/exit' or end of input ends the chat,\n"
     "'/reset' forgets the history. At a terminal, Ctrl-C stops the answer being\n"
     "generated; at the prompt it exits 130. An error answer ends a piped chat\n"
     "with exit 1; at a terminal the turn is dropped and the chat goes on.\n"
     "  -m, --model MODEL      a configured model\n"
     "  --system TEXT          a system message to start the conversation\n" GS_SAMPLING_HELP
     "  -v, --verbose          print token counts and timing of each answer to stderr\n"
     "  --json                 print each answer's done event as one JSON line\n"},
    {"models", gs_cmd_models, 0, "list the configured models",
     "usage: gpuswap models [--json]\n"
     "Lists the configured models with their state (loading, host, partial,\n"
     "resident, failed), architecture, weight type, bits per weight, parameters and context.\n"
     "Uses the inference socket.\n"},
    {"stats", gs_cmd_stats, S_WATCH, "paging and latency statistics",
     "usage: gpuswap stats [--watch [-i SECONDS] [--count N]] [--json]\n"
     "One row per model: state, resident/quota MiB ('-': no quota), page-ins,\n"
     "evictions (all causes), hit rate (segment hits / lookups), queued requests,\n"
     "time to first token p50/p99; then the device page pool.\n"
     "  -w, --watch            refresh until interrupted (clears the screen on a terminal)\n"
     "  -i, --interval SECONDS between refreshes (default 2; implies --watch)\n"
     "  -c, --count N          stop after N refreshes (implies --watch)\n"
     "  --json                 print the daemon's stats answer, one JSON line per refresh\n"},
    {"load", gs_cmd_admin, S_MODEL, "page a model onto the device now",
     "usage: gpuswap load MODEL [--json]\n"
     "Pages MODEL's weights onto the device and waits until they are all there,\n"
     "drawing a progress bar on stderr when it is a terminal; then prints\n"
     "\"MODEL resident (N MiB in X ms)\". Ctrl-C stops waiting (the load goes on).\n"},
    {"evict", gs_cmd_admin, S_MODEL, "unmap a model from the device",
     "usage: gpuswap evict MODEL [--json]\n"
     "Unmaps MODEL's weights from the device (the host copy stays). A pinned\n"
     "model must be unpinned first.\n"},
    {"pin", gs_cmd_admin, S_MODEL, "never evict a model",
     "usage: gpuswap pin MODEL [--json]\n"
     "Marks MODEL as never evicted (it does not page it in: use load).\n"},
    {"unpin", gs_cmd_admin, S_MODEL, "allow evicting a model again",
     "usage: gpuswap unpin MODEL [--json]\n"},
    {"reload", gs_cmd_admin, 0, "re-read the daemon's configuration",
     "usage: gpuswap reload [--json]\n"
     "Re-reads the configuration file (as SIGHUP does) and prints the models\n"
     "added, removed and changed. A bad file is an error; the old one stays.\n"},
    {"keygen", gs_cmd_keygen, 0, "print a new API key and its config entry",
     "usage: gpuswap keygen [NAME] [--json]\n"
     "Prints a new random API key on the first line, then the auth.keys entry\n"
     "that accepts it (its SHA-256 hash: the daemon never stores the key) for\n"
     "gpuswapd.yaml. Talks to no daemon. --json prints {\"key\",\"hash\",\"name\"}.\n"},
    {"drain", gs_cmd_admin, 0, "finish running requests and stop the daemon",
     "usage: gpuswap drain [--json]\n"
     "The daemon refuses new requests, finishes those in flight, answers with\n"
     "how many completed, and exits with status 0.\n"},
};
#define GS_N_CMDS (sizeof gs_cmds / sizeof gs_cmds[0])

static void gs_help(FILE *f)
{
    fputs("usage: gpuswap [--socket PATH] [--admin-socket PATH] COMMAND [options] [args]\n"
          "The command-line client of gpuswapd.\n\nCommands:\n",
          f);
    for (size_t i = 0; i < GS_N_CMDS; i++)
        fprintf(f, "  %-9s %s\n", gs_cmds[i].name, gs_cmds[i].summary);
    fprintf(f, "  %-9s %s\n", "fleet", "render a fleet's configs (gpuswap fleet --help)");
    fputs(
        "\n'gpuswap COMMAND --help' describes a command. Options of every command:\n"
        "  --socket PATH          inference socket (env GPUSWAP_SOCKET, default " GS_DEFAULT_SOCKET
        ")\n"
        "  --admin-socket PATH    admin socket, for stats load evict pin unpin reload drain\n"
        "                         (env GPUSWAP_ADMIN_SOCKET, default " GS_DEFAULT_ADMIN ")\n"
        "  --api-key KEY          authenticate inference connections with an API key\n"
        "                         (env GPUSWAP_API_KEY); --socket HOST:PORT uses listen.tcp\n"
        "  --json                 print the daemon's answer as one JSON line (errors too)\n"
        "  -h, --help             this help\n"
        "\nExit status:\n"
        "  0    success\n"
        "  1    the daemon answered an error (its code and message are printed on stderr)\n"
        "  2    usage error\n"
        "  3    cannot connect to the daemon, or the connection was lost\n"
        "  130  interrupted (Ctrl-C; 143 for SIGTERM)\n",
        f);
}

static void gs_cmd_help(FILE *f, const gs_cmd_t *c)
{
    const char *mark = strchr(c->help, GS_SAMPLING_HELP[0]);
    if (mark) {
        fwrite(c->help, 1, (size_t)(mark - c->help), f);
        gs_sampling_help(f);
        fputs(mark + 1, f);
    } else {
        fputs(c->help, f);
    }
    fputs("Options of every command: --socket PATH, --admin-socket PATH, --json, --help\n"
          "(see gpuswap --help, which also lists the exit codes).\n",
          f);
}

static const gs_cmd_t *gs_cmd_find(const char *name)
{
    for (size_t i = 0; i < GS_N_CMDS; i++)
        if (strcmp(gs_cmds[i].name, name) == 0)
            return &gs_cmds[i];
    return NULL;
}

/* ------------------------------------------------------------------ main */

static const char *gs_env(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "fleet") == 0)
        return fleet_main(argc - 1, argv + 1); /* talks to no daemon: its own arguments */
    gs_opts_t o;
    memset(&o, 0, sizeof o);
    o.socket = gs_env("GPUSWAP_SOCKET", GS_DEFAULT_SOCKET);
    o.admin_socket = gs_env("GPUSWAP_ADMIN_SOCKET", GS_DEFAULT_ADMIN);
    o.api_key = gs_env("GPUSWAP_API_KEY", NULL);
    o.interval = 2;
    o.pos = calloc((size_t)argc + 1, sizeof *o.pos);
    if (!o.pos) {
        gs_err("out of memory");
        return GS_EXIT_ERROR;
    }
    int rc;
    int i = gs_opts_parse(NULL, &o, 0, argc, argv, 1, 1);
    if (i < 0) {
        rc = -i;
        goto out;
    }
    if (i >= argc) {
        if (o.help) {
            gs_help(stdout);
            rc = GS_EXIT_OK;
        } else {
            gs_help(stderr);
            rc = GS_EXIT_USAGE;
        }
        goto out;
    }
    const char *name = argv[i];
    if (strcmp(name, "help") == 0) {
        const gs_cmd_t *c = i + 1 < argc ? gs_cmd_find(argv[i + 1]) : NULL;
        if (i + 1 < argc && !c) {
            rc = gs_usage_error(NULL, "unknown command '%s'", argv[i + 1]);
            goto out;
        }
        if (c)
            gs_cmd_help(stdout, c);
        else
            gs_help(stdout);
        rc = GS_EXIT_OK;
        goto out;
    }
    const gs_cmd_t *cmd = gs_cmd_find(name);
    if (!cmd) {
        rc = gs_usage_error(NULL, "unknown command '%s'", name);
        goto out;
    }
    int help_first = o.help; /* gpuswap --help CMD */
    o.help = 0;
    i = gs_opts_parse(cmd->name, &o, cmd->opts, argc, argv, i + 1, 0);
    if (i < 0) {
        rc = -i;
        goto out;
    }
    if (o.help || help_first) {
        gs_cmd_help(stdout, cmd);
        rc = GS_EXIT_OK;
        goto out;
    }
    gs_signals_init();
    g_api_key = o.api_key;
    rc = cmd->run(cmd, &o);
out:
    fflush(stdout);
    free(o.pos);
    return rc;
}

/* gpuswap_int: what the gpuswap CLI's files share; not for other programs. They stack without a
 * cycle: gpuswap.c (options, help, the command table, main) -> gpuswap_gen.c (generate, chat) and
 * gpuswap_admin.c (models, stats, admin ops, keygen) -> gpuswap_io.c (messages, signals, the line
 * reader, the daemon connection and its answers). */
#ifndef GPUSWAP_INT_H
#define GPUSWAP_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define GS_LINE_MAX ((size_t)1 << 30) /* bytes: longest line accepted from the daemon or stdin */
#define GS_MIB 1048576.0

/* Exit codes (documented in the top-level --help). */
enum {
    GS_EXIT_OK = 0,
    GS_EXIT_ERROR = 1,
    GS_EXIT_USAGE = 2,
    GS_EXIT_CONN = 3
};

/* ------------------------------------------------------------------ options (gpuswap.c) */

/* Which commands take an option. */
#define S_GLOBAL 0x01u
#define S_MODEL 0x02u
#define S_SAMPLING 0x04u
#define S_VERBOSE 0x08u
#define S_SYSTEM 0x10u
#define S_WATCH 0x20u

/* Everything the command line says. Strings are borrowed from argv or the environment. */
typedef struct gs_opts {
    const char *socket, *admin_socket;
    const char *api_key; /* sent in an auth op on the inference socket; NULL = none */
    int json, verbose, help;
    int no_retry; /* --no-retry: an overloaded answer with retry_after_ms is not retried */
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

/* ------------------------------------------------------------------ gpuswap_io.c: messages */

/* "gpuswap: " + the message + a newline on stderr. */
void gs_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A usage error: the message and "Try 'gpuswap [CMD] --help'." on stderr. Returns GS_EXIT_USAGE. */
int gs_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The monotonic clock, ms. */
int64_t gs_now_ms(void);

/* ------------------------------------------------------------------ gpuswap_io.c: signals */

/* Blocks SIGINT and SIGTERM outside waits and installs their handler (main, once). */
void gs_signals_init(void);
/* Takes the pending signal: returns its number (0 if none) and clears it. */
int gs_signal_take(void);
/* Waits until fd (or nothing, fd < 0) is readable or deadline (monotonic ms, < 0 = never).
 * Returns 1 readable, GS_LINE_TIMEOUT, GS_LINE_SIGNAL or GS_LINE_ERR. */
int gs_wait(int fd, int64_t deadline);

/* ------------------------------------------------------------------ gpuswap_io.c: line reader */

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

void gs_lines_init(gs_lines_t *lb, int fd);
void gs_lines_free(gs_lines_t *lb);
/* The next line of lb (until deadline, monotonic ms, < 0 = never): GS_LINE_OK with *line (NUL
 * in place of the newline, valid until the next call) and *len, or another GS_LINE_* code. */
int gs_lines_next(gs_lines_t *lb, int64_t deadline, char **line, size_t *len);

/* ------------------------------------------------------------------ gpuswap_io.c: connection */

typedef struct gs_answer gs_answer_t;
/* Called with each token or progress event of the request in flight. */
typedef void (*gs_partial_fn)(const proto_event_t *ev, void *ctx);

typedef struct gs_conn {
    const char *path; /* the socket path (borrowed) */
    int fd;
    gs_lines_t in; /* lines from the daemon */
    json_int_t next_id;
} gs_conn_t;

/* The final line of a request. */
struct gs_answer {
    proto_event_t ev; /* kind DONE, OK or ERROR; owns the parsed line */
    char *line;       /* the line as received (malloc'ed, no newline) */
    int interrupted;  /* the signal that made us send a cancel, else 0 */
};

/* --api-key or GPUSWAP_API_KEY: authenticates inference connections (set by main) */
extern const char *gs_api_key;

/* Connects to the Unix socket at path (or, for the inference socket, to
 * listen.tcp when path is HOST:PORT without a '/'), then sends the API key
 * if one is set. Returns 0, or GS_EXIT_CONN (GS_EXIT_ERROR when the key is
 * refused) with a message printed. */
int gs_conn_open(gs_conn_t *c, const char *path, const char *which);
void gs_conn_close(gs_conn_t *c);
/* Sends req (its id is assigned here; req->id must be NULL) and reads until the
 * request's final line, passing token and progress events to fn. When
 * cancellable, a SIGINT/SIGTERM sends a cancel and keeps waiting (at most
 * GS_CANCEL_WAIT_MS) for the final line, marking ans->interrupted; otherwise,
 * or at a second signal, it gives up. Returns 0 with *ans filled (caller frees
 * with gs_answer_free), 128+signal when interrupted without an answer, or
 * GS_EXIT_CONN (message printed) when the connection failed. */
int gs_conn_call(gs_conn_t *c, proto_req_t *req, int cancellable, gs_partial_fn fn, void *ctx,
                 gs_answer_t *ans);
void gs_answer_free(gs_answer_t *a);

/* ------------------------------------------------------------------ gpuswap_io.c: answers */

/* A string field, "" when absent. */
const char *gs_str(const json_t *o, const char *key);
/* A number field (integer or real); dflt when absent or not a number. */
double gs_num(const json_t *o, const char *key, double dflt);
/* Shared ending of a command: prints the error, or the answer line with --json.
 * Returns GS_EXIT_ERROR for an error answer, else -1 (caller goes on to print text). */
int gs_answer_common(const gs_answer_t *a, int json);
/* "a, b, c" from an array of strings, or "none"; malloc'ed. */
char *gs_join_names(const json_t *arr);

/* ------------------------------------------------------------------ the commands */

/* gpuswap_gen.c */
int gs_cmd_generate(const gs_cmd_t *cmd, gs_opts_t *o);
int gs_cmd_chat(const gs_cmd_t *cmd, gs_opts_t *o);
/* gpuswap_admin.c */
int gs_cmd_models(const gs_cmd_t *cmd, gs_opts_t *o);
int gs_cmd_stats(const gs_cmd_t *cmd, gs_opts_t *o);
int gs_cmd_admin(const gs_cmd_t *cmd, gs_opts_t *o);
int gs_cmd_keygen(const gs_cmd_t *cmd, gs_opts_t *o);

#endif

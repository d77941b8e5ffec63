/* gpuswap_gen: the gpuswap commands that generate: generate (a prompt, streamed) and chat (a conversation from stdin). */
#include "gpuswap_int.h"

#include "proto.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    req->deadline_ms = s->deadline_ms;
    req->batch = s->batch;
}

/* Retries of an overloaded answer that says when to try again (retry_after_ms): at most this
 * many, waiting at most GS_RETRY_BUDGET_MS in all (docs/overload.md). */
#define GS_RETRIES 3
#define GS_RETRY_BUDGET_MS 30000

/* gs_conn_call, again after the wait an overloaded answer asks for while nothing was printed
 * (*printed: bytes of text the request streamed), unless --no-retry or the budget is spent. */
static int gs_call_retrying(gs_conn_t *c, proto_req_t *req, const gs_opts_t *o, gs_partial_fn fn,
                            void *ctx, const int *printed, gs_answer_t *a)
{
    int64_t waited = 0;
    for (int tries = 0;; tries++) {
        int rc = gs_conn_call(c, req, 1, fn, ctx, a);
        if (rc || a->ev.kind != PROTO_EV_ERROR || o->no_retry || tries == GS_RETRIES || *printed)
            return rc;
        const json_t *e = json_object_get(a->ev.root, "error");
        double ms = gs_num(e, "retry_after_ms", 0);
        if (strcmp(gs_str(e, "code"), "overloaded") != 0 || ms <= 0 ||
            waited + (int64_t)ms > GS_RETRY_BUDGET_MS)
            return rc;
        if (o->verbose)
            gs_err("overloaded: %s; trying again in %.0f ms", gs_str(e, "message"), ms);
        gs_answer_free(a);
        waited += (int64_t)ms;
        if (gs_wait(-1, gs_now_ms() + (int64_t)ms) == GS_LINE_SIGNAL)
            return 128 + gs_signal_take();
    }
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

int gs_cmd_generate(const gs_cmd_t *cmd, gs_opts_t *o)
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
    rc = gs_call_retrying(&c, &req, o, gs_on_token, &st, &st.printed, &a);
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

int gs_cmd_chat(const gs_cmd_t *cmd, gs_opts_t *o)
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
        rc = gs_call_retrying(&c, &req, o, gs_on_token, &st, &st.printed, &a);
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

/* http_ollama: the Ollama API on the HTTP listener (/api/...): request bodies mapped onto the socket protocol's lines, the NDJSON answers built from the worker's events, and keep_alive's timers (docs/ollama.md). */
#include "http_int.h"

#include <ctype.h>
#include <event2/event.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto.h"

/* expires_at of a model no timer unloads (pinned, or left to capacity eviction) */
#define OL_FOREVER "2318-11-26T00:00:00Z"

/* ------------------------------------------------------------------ routes */

http_ol_t http_ollama_route(const char *path, int *want_post)
{
    static const struct {
        const char *path;
        http_ol_t ol;
        int post;
    } routes[] = {
        {"/api/chat", HTTP_OL_CHAT, 1}, {"/api/generate", HTTP_OL_GENERATE, 1},
        {"/api/tags", HTTP_OL_TAGS, 0}, {"/api/ps", HTTP_OL_PS, 0},
        {"/api/show", HTTP_OL_SHOW, 1}, {"/api/version", HTTP_OL_VERSION, 0},
    };
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (strcmp(path, routes[i].path) == 0) {
            *want_post = routes[i].post;
            return routes[i].ol;
        }
    return HTTP_OL_NONE;
}

/* ------------------------------------------------------------------ keep_alive */

/* A Go duration ("5m", "1h30m", "-1s", "300ms") or a bare number of seconds, in ms;
 * 0, or -1 when s is neither. */
static int ka_parse_duration(const char *s, int64_t *ms)
{
    char *end;
    double secs = strtod(s, &end);
    if (end != s && *end == '\0' && isfinite(secs)) {
        *ms = (int64_t)(secs * 1000.0);
        return 0;
    }
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ms", 1},
                 {"s", 1e3},   {"m", 6e4},   {"h", 3.6e6}};
    const char *p = s;
    int neg = *p == '-';
    if (*p == '-' || *p == '+')
        p++;
    if (!*p)
        return -1;
    double total = 0;
    while (*p) {
        double v = strtod(p, &end);
        if (end == p || v < 0 || (*p != '.' && !isdigit((unsigned char)*p)))
            return -1;
        p = end;
        size_t u = 0, nu = sizeof units / sizeof *units;
        /* the longest unit that matches: "ms" before "m" */
        size_t best = nu, blen = 0;
        for (u = 0; u < nu; u++) {
            size_t l = strlen(units[u].unit);
            if (l > blen && strncmp(p, units[u].unit, l) == 0)
                best = u, blen = l;
        }
        if (best == nu)
            return -1;
        total += v * units[best].ms;
        p += blen;
    }
    if (!isfinite(total) || total > 9e15)
        return -1;
    *ms = (int64_t)(neg ? -total : total);
    return 0;
}

/* keep_alive as ms into *ka (negative: forever): 0, or -1 with the reason in err. */
static int ka_parse(const json_t *v, int64_t *ka, char *err, size_t errlen)
{
    if (!v || json_is_null(v))
        return 0;
    if (json_is_number(v) && isfinite(json_number_value(v)) && fabs(json_number_value(v)) < 9e12) {
        *ka = (int64_t)(json_number_value(v) * 1000.0); /* a number is seconds */
        if (*ka < 0)
            *ka = -1;
        return 0;
    }
    if (json_is_string(v) && ka_parse_duration(json_string_value(v), ka) == 0) {
        if (*ka < 0)
            *ka = -1;
        return 0;
    }
    snprintf(err, errlen,
             "field 'keep_alive' must be a duration (\"5m\", \"1h\", \"-1\") or a number of "
             "seconds");
    return -1;
}

typedef struct ka_entry {
    struct http_ka *ka;
    char *model;         /* owned */
    struct event *timer; /* unpins and evicts at the deadline */
    time_t deadline;     /* unix seconds */
    struct ka_entry *next;
} ka_entry_t;

struct http_ka {
    struct event_base *base;
    wk_t *wk;
    srv_t *srv;
    ka_entry_t *timers; /* models a keep_alive duration holds pinned */
};

http_ka_t *http_ka_new(struct event_base *base, wk_t *wk, srv_t *srv)
{
    http_ka_t *ka = calloc(1, sizeof *ka);
    if (ka) {
        ka->base = base;
        ka->wk = wk;
        ka->srv = srv;
    }
    return ka;
}

static void ka_entry_free(ka_entry_t *e)
{
    if (e->timer)
        event_free(e->timer);
    free(e->model);
    free(e);
}

void http_ka_free(http_ka_t *ka)
{
    if (!ka)
        return;
    while (ka->timers) {
        ka_entry_t *e = ka->timers;
        ka->timers = e->next;
        ka_entry_free(e);
    }
    free(ka);
}

/* Hands an admin op on model to the worker; its answer comes back under an id
 * nobody owns, and the HTTP sink drops it. */
static void ka_admin(http_ka_t *ka, proto_op_t op, const char *model)
{
    proto_req_t req = {.op = op, .id = json_string("keep_alive"), .model = strdup(model)};
    if (!req.id || !req.model) {
        proto_req_free(&req);
        return;
    }
    wk_submit(ka->wk, srv_conn_id_new(ka->srv), 1, &req);
}

/* Forgets model's timer; 1 if it had one. */
static int ka_cancel(http_ka_t *ka, const char *model)
{
    for (ka_entry_t **pp = &ka->timers; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->model, model) == 0) {
            ka_entry_t *e = *pp;
            *pp = e->next;
            ka_entry_free(e);
            return 1;
        }
    return 0;
}

static void ka_expired(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ka_entry_t *e = arg;
    http_ka_t *ka = e->ka;
    ka_admin(ka, PROTO_OP_UNPIN, e->model);
    ka_admin(ka, PROTO_OP_EVICT, e->model);
    ka_cancel(ka, e->model);
}

void http_ka_apply(http_ka_t *ka, const char *model, int64_t keep_alive)
{
    if (!ka || !model || keep_alive == HTTP_KA_NONE)
        return;
    ka_cancel(ka, model);
    if (keep_alive == 0) { /* unload now, as Ollama does */
        ka_admin(ka, PROTO_OP_UNPIN, model);
        ka_admin(ka, PROTO_OP_EVICT, model);
        return;
    }
    ka_admin(ka, PROTO_OP_PIN, model);
    if (keep_alive < 0)
        return;
    ka_entry_t *e = calloc(1, sizeof *e);
    if (!e || !(e->model = strdup(model))) {
        free(e);
        return;
    }
    e->ka = ka;
    e->deadline = time(NULL) + (time_t)((keep_alive + 999) / 1000);
    e->timer = evtimer_new(ka->base, ka_expired, e);
    struct timeval tv = {.tv_sec = keep_alive / 1000, .tv_usec = (keep_alive % 1000) * 1000};
    if (!e->timer || evtimer_add(e->timer, &tv) != 0) {
        ka_entry_free(e);
        return;
    }
    e->next = ka->timers;
    ka->timers = e;
}

time_t http_ka_deadline(const http_ka_t *ka, const char *model)
{
    for (const ka_entry_t *e = ka ? ka->timers : NULL; e; e = e->next)
        if (strcmp(e->model, model) == 0)
            return e->deadline;
    return 0;
}

/* ------------------------------------------------------------------ requests */

/* null, false, "", [] and {}: an Ollama field left at its default. */
static int is_unset(const json_t *v)
{
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_string(v) && json_string_length(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0);
}

/* Ollama's options: copied under our names, or ignored (hardware and runtime knobs, and
 * sampler options gpuswapd lacks); an unknown option is ignored too, as Ollama does. */
static int map_options(json_t *out, const json_t *opts, char *err, size_t errlen)
{
    static const struct {
        const char *name, *as;
    } copy[] = {
        {"temperature", "temperature"},
        {"top_k", "top_k"},
        {"top_p", "top_p"},
        {"min_p", "min_p"},
        {"repeat_penalty", "repeat_penalty"},
        {"presence_penalty", "presence_penalty"},
        {"frequency_penalty", "frequency_penalty"},
        {"stop", "stop"},
    };
    if (!opts || json_is_null(opts))
        return 0;
    if (!json_is_object(opts)) {
        snprintf(err, errlen, "field 'options' must be an object");
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach ((json_t *)opts, key, v) {
        if (json_is_null(v))
            continue;
        if (strcmp(key, "num_predict") == 0 || strcmp(key, "seed") == 0) {
            /* negative: Ollama's "no limit" (-1, -2 = fill the context) and "random" */
            if (json_is_integer(v) && json_integer_value(v) < 0)
                continue;
            json_object_set(out, key[0] == 'n' ? "max_tokens" : "seed", v);
            continue;
        }
        for (size_t i = 0; i < sizeof copy / sizeof *copy; i++)
            if (strcmp(key, copy[i].name) == 0)
                json_object_set(out, copy[i].as, v); /* the codec checks type and range */
    }
    return 0;
}

/* format: "json" -> json_object; a schema (object) -> json_schema; "" / null -> none. */
static int map_format(json_t *out, const json_t *v, char *err, size_t errlen)
{
    if (is_unset(v))
        return 0;
    if (json_is_string(v) && strcmp(json_string_value(v), "json") == 0) {
        json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (json_is_object(v)) {
        json_object_set_new(out, "response_format",
                            json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
                                      "name", "format", "schema", v));
        return 0;
    }
    snprintf(err, errlen, "field 'format' must be \"json\" or a JSON schema (an object)");
    return -1;
}

/* Fields of a message or request that gpuswapd refuses unless unset, and why. */
static int refuse_set(const json_t *o, const char *where, char *err, size_t errlen)
{
    static const struct {
        const char *name, *why;
    } refused[] = {
        {"images", "images are not supported: gpuswapd serves text-only models"},
        {"template", "template overrides are not supported: the model's own chat template "
                     "applies (or raw: true)"},
        {"context", "context (the token ids of an earlier answer) is not supported: send the "
                    "conversation as /api/chat messages"},
        {"think", "thinking is not supported by gpuswapd's models"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (!is_unset(json_object_get(o, refused[i].name))) {
            snprintf(err, errlen, "%s%s", where, refused[i].why);
            return -1;
        }
    return 0;
}

/* An assistant message's Ollama tool_calls ([{"function": {"name", "arguments": {..}}}]) as the
 * chat op's (ids made up: Ollama has none). NULL with the reason when malformed. */
static json_t *map_tool_calls(const json_t *calls, size_t i, char *err, size_t errlen)
{
    json_t *arr = json_array();
    size_t j;
    const json_t *c;
    if (!json_is_array(calls)) {
        snprintf(err, errlen, "messages[%zu]: field 'tool_calls' must be an array", i);
        json_decref(arr);
        return NULL;
    }
    json_array_foreach (calls, j, c) {
        const json_t *f = json_object_get(c, "function");
        char id[48];
        if (!json_is_object(f)) {
            snprintf(err, errlen, "messages[%zu].tool_calls[%zu]: 'function' must be an object", i,
                     j);
            json_decref(arr);
            return NULL;
        }
        snprintf(id, sizeof id, "call_%zu_%zu", i, j);
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:O}", "id", id, "type", "function", "function", f));
    }
    return arr;
}

static int map_messages(json_t *out, const json_t *v, char *err, size_t errlen)
{
    if (!json_is_array(v)) {
        snprintf(err, errlen, "field 'messages' must be an array");
        return -1;
    }
    json_t *arr = json_array();
    json_object_set_new(out, "messages", arr);
    size_t i;
    const json_t *m;
    json_array_foreach (v, i, m) {
        char where[48];
        snprintf(where, sizeof where, "messages[%zu]: ", i);
        if (!json_is_object(m)) {
            snprintf(err, errlen, "%smust be an object", where);
            return -1;
        }
        if (refuse_set(m, where, err, errlen))
            return -1;
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *calls = json_object_get(m, "tool_calls");
        json_t *o = json_object(), *c = json_object_get(m, "content");
        json_object_set(o, "role", json_object_get(m, "role")); /* NULL: the codec says so */
        json_object_set_new(o, "content", c && !json_is_null(c) ? json_incref(c) : json_string(""));
        json_array_append_new(arr, o);
        if (role && strcmp(role, "tool") == 0) { /* a result: Ollama names no call, we make one */
            char id[32];
            snprintf(id, sizeof id, "call_%zu", i);
            json_object_set_new(o, "tool_call_id", json_string(id));
        }
        if (!is_unset(calls)) {
            json_t *mapped = map_tool_calls(calls, i, err, errlen);
            if (!mapped)
                return -1;
            json_object_set_new(o, "tool_calls", mapped);
        }
    }
    return 0;
}

/* /api/generate's prompt: the model's template (as one user turn after system) unless raw
 * or suffix (fill in the middle), which run the text as it is. */
static int map_prompt(json_t *out, const json_t *body, char *err, size_t errlen)
{
    const json_t *prompt = json_object_get(body, "prompt"),
                 *suffix = json_object_get(body, "suffix"),
                 *system = json_object_get(body, "system");
    if (prompt && !json_is_null(prompt) && !json_is_string(prompt)) {
        snprintf(err, errlen, "field 'prompt' must be a string");
        return -1;
    }
    if (json_is_true(json_object_get(body, "raw")) || !is_unset(suffix)) {
        json_object_set_new(out, "op", json_string("generate"));
        json_object_set_new(out, "prompt",
                            json_is_string(prompt) ? json_incref((json_t *)prompt)
                                                   : json_string(""));
        if (!is_unset(suffix))
            json_object_set(out, "suffix", (json_t *)suffix);
        return 0;
    }
    json_t *msgs = json_array();
    if (!is_unset(system))
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", prompt));
    json_object_set_new(out, "messages", msgs);
    return 0;
}

/* Translates an Ollama body into our request object (new reference), or NULL with the reason. */
static json_t *map_request(http_ol_t ol, const char *rid, json_t *body, http_ol_req_t *info,
                           char *err, size_t errlen)
{
    json_t *out = json_pack("{s:s, s:s}", "op", "chat", "id", rid);
    const json_t *model = json_object_get(body, "model"), *stream = json_object_get(body, "stream");
    if (!json_is_string(model) || json_string_length(model) == 0) {
        snprintf(err, errlen, "field 'model' is required");
        goto fail;
    }
    json_object_set(out, "model", (json_t *)model);
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        snprintf(err, errlen, "field 'stream' must be a boolean");
        goto fail;
    }
    info->stream = !json_is_false(stream); /* Ollama streams unless told not to */
    json_object_set_new(out, "stream", json_boolean(info->stream));
    const json_t *tools = json_object_get(body, "tools");
    if (!is_unset(tools)) { /* chat: the chat op's tools (tool_choice auto, as Ollama has it) */
        if (ol != HTTP_OL_CHAT) {
            snprintf(err, errlen, "field 'tools' is for /api/chat");
            goto fail;
        }
        json_object_set(out, "tools", (json_t *)tools);
    }
    if (refuse_set(body, "", err, errlen) ||
        ka_parse(json_object_get(body, "keep_alive"), &info->keep_alive, err, errlen) ||
        map_options(out, json_object_get(body, "options"), err, errlen) ||
        map_format(out, json_object_get(body, "format"), err, errlen))
        goto fail;
    const json_t *msgs = json_object_get(body, "messages");
    info->load = ol == HTTP_OL_CHAT ? !msgs || (json_is_array(msgs) && json_array_size(msgs) == 0)
                                    : is_unset(json_object_get(body, "prompt")) &&
                                          is_unset(json_object_get(body, "suffix"));
    if (info->load) { /* Ollama's load request: the admin op (unload: http.c's, keep_alive 0) */
        json_decref(out);
        info->stream = 0;
        return json_pack("{s:s, s:s, s:O}", "op", "load", "id", rid, "model", model);
    }
    if (ol == HTTP_OL_CHAT ? map_messages(out, msgs, err, errlen)
                           : map_prompt(out, body, err, errlen))
        goto fail;
    return out;
fail:
    json_decref(out);
    return NULL;
}

int http_ollama_map(http_ol_t ol, const char *body, size_t len, const char *rid, char **line,
                    http_ol_req_t *info, char *err, size_t errlen)
{
    *line = NULL;
    *info = (http_ol_req_t){.keep_alive = HTTP_KA_NONE};
    if (ol != HTTP_OL_CHAT && ol != HTTP_OL_GENERATE) {
        snprintf(err, errlen, "not a generation route");
        return -PROTO_E_BAD_REQUEST;
    }
    json_error_t je;
    json_t *root = len ? json_loadb(body, len, 0, &je) : NULL;
    if (!root) {
        if (len)
            snprintf(err, errlen, "invalid JSON at byte %d: %s", je.position, je.text);
        else
            snprintf(err, errlen, "empty request body");
        return -PROTO_E_BAD_JSON;
    }
    json_t *mapped = json_is_object(root) ? map_request(ol, rid, root, info, err, errlen) : NULL;
    if (!json_is_object(root))
        snprintf(err, errlen, "the request body must be a JSON object");
    json_decref(root);
    if (!mapped)
        return -PROTO_E_BAD_REQUEST;
    *line = json_dumps(mapped, JSON_COMPACT);
    json_decref(mapped);
    if (!*line) {
        snprintf(err, errlen, "out of memory");
        return -PROTO_E_INTERNAL;
    }
    return 0;
}

int http_ollama_model_of(const char *body, size_t len, char **model, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = len ? json_loadb(body, len, 0, &je) : NULL;
    const char *name = json_string_value(json_object_get(root, "model"));
    if (!name || !*name)
        name = json_string_value(json_object_get(root, "name")); /* its older name */
    if (!name || !*name) {
        snprintf(err, errlen, root ? "field 'model' is required" : "invalid or empty JSON body");
        json_decref(root);
        *model = NULL;
        return root ? -PROTO_E_BAD_REQUEST : -PROTO_E_BAD_JSON;
    }
    *model = strdup(name);
    json_decref(root);
    return *model ? 0 : -PROTO_E_INTERNAL;
}

/* ------------------------------------------------------------------ answers */

/* RFC 3339 in UTC with nanoseconds, as Ollama writes times. */
static json_t *time_str(const struct timespec *ts)
{
    struct tm tm;
    char buf[64];
    gmtime_r(&ts->tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%09ldZ", (long)ts->tv_nsec);
    return json_string(buf);
}

static json_t *now_str(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return time_str(&ts);
}

static json_int_t ns_of(double ms)
{
    return ms > 0 ? (json_int_t)llround(ms * 1e6) : 0;
}

/* A DONE event's tool calls in Ollama's shape ([{"function": {"name", "arguments": {..}}}]: the
 * arguments an object), or NULL when there are none. */
static json_t *ollama_calls_of(const json_t *calls)
{
    if (!json_array_size(calls))
        return NULL;
    json_t *arr = json_array();
    size_t i;
    const json_t *c;
    json_array_foreach (calls, i, c) {
        const json_t *f = json_object_get(c, "function"), *args = json_object_get(f, "arguments");
        json_t *obj = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL)
                                           : json_incref((json_t *)args);
        json_array_append_new(arr, json_pack("{s:{s:O, s:o}}", "function", "name",
                                             json_object_get(f, "name"), "arguments",
                                             obj ? obj : json_object()));
    }
    return arr;
}

json_t *http_ollama_chunk_of(const http_ol_answer_t *a, const wk_event_t *ev)
{
    int done = ev->kind == WK_EVENT_DONE;
    if (!done && ev->kind != WK_EVENT_TOKEN)
        return NULL;
    /* streamed: the last object carries no text, the tokens had it all */
    json_t *text = proto_str_new(done && a->stream ? "" : ev->text ? ev->text : "");
    json_t *o = json_pack("{s:s, s:o}", "model", a->model ? a->model : "", "created_at", now_str());
    if (a->ol == HTTP_OL_CHAT)
        json_object_set_new(o, "message",
                            json_pack("{s:s, s:o}", "role", "assistant", "content", text));
    else
        json_object_set_new(o, "response", text);
    json_object_set_new(o, "done", json_boolean(done));
    if (!done)
        return o;
    json_t *calls = a->ol == HTTP_OL_CHAT ? ollama_calls_of(ev->tool_calls) : NULL;
    if (calls)
        json_object_set_new(json_object_get(o, "message"), "tool_calls", calls);
    const proto_timing_t *t = &ev->timing;
    double prefill = t->ttft_ms - t->queue_ms - t->swap_ms;
    json_t *tail = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "done_reason",
        ev->finish == PROTO_FINISH_LENGTH ? "length" : "stop", "total_duration", ns_of(t->total_ms),
        "load_duration", ns_of(t->swap_ms), "prompt_eval_count", (json_int_t)ev->prompt_tokens,
        "prompt_eval_duration", ns_of(prefill), "eval_count", (json_int_t)ev->completion_tokens,
        "eval_duration", ns_of(t->total_ms - t->ttft_ms));
    json_object_update(o, tail);
    json_decref(tail);
    return o;
}

json_t *http_ollama_load_of(const http_ol_answer_t *a, int unload)
{
    json_t *o = json_pack("{s:s, s:o}", "model", a->model ? a->model : "", "created_at", now_str());
    if (a->ol == HTTP_OL_CHAT)
        json_object_set_new(o, "message",
                            json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
    else
        json_object_set_new(o, "response", json_string(""));
    json_object_set_new(o, "done", json_true());
    json_object_set_new(o, "done_reason", json_string(unload ? "unload" : "load"));
    return o;
}

json_t *http_ollama_error_of(const char *message)
{
    return json_pack("{s:o}", "error", proto_str_new(message ? message : "error"));
}

/* "8.0M", "1.2B": Ollama's parameter_size. */
static json_t *param_size(json_int_t n)
{
    char buf[32];
    if (n >= 1000000000)
        snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
    else if (n >= 1000000)
        snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
    else
        snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
    return json_string(buf);
}

static json_t *details_of(const json_t *m)
{
    const char *arch = json_string_value(json_object_get(m, "arch"));
    const char *type = json_string_value(json_object_get(m, "type"));
    char q[16] = "";
    for (size_t i = 0; type && type[i] && i + 1 < sizeof q; i++)
        q[i] = (char)toupper((unsigned char)type[i]);
    return json_pack("{s:s, s:s, s:s, s:[s], s:o, s:s}", "parent_model", "", "format", "gguf",
                     "family", arch ? arch : "", "families", arch ? arch : "", "parameter_size",
                     param_size(json_integer_value(json_object_get(m, "params"))),
                     "quantization_level", q);
}

/* A stable stand-in for Ollama's sha256 digest: FNV-1a of the name, hex. */
static json_t *digest_of(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    char buf[80];
    snprintf(buf, sizeof buf, "%016llx%016llx%016llx%016llx", (unsigned long long)h,
             (unsigned long long)~h, (unsigned long long)(h * 31), (unsigned long long)(h ^ 0xa5));
    return json_string(buf);
}

static json_t *entry_of(const http_ol_list_t *l, const json_t *m, const char *name)
{
    json_t *size = json_object_get(m, "weight_bytes");
    struct timespec started = {.tv_sec = l->t_start};
    json_t *o =
        json_pack("{s:s, s:s, s:o, s:I, s:o, s:o}", "name", name, "model", name, "modified_at",
                  time_str(&started), "size", size ? json_integer_value(size) : 0, "digest",
                  digest_of(name), "details", details_of(m));
    if (l->ol != HTTP_OL_PS)
        return o;
    json_object_del(o, "modified_at");
    json_object_set_new(
        o, "size_vram",
        json_integer(json_integer_value(json_object_get(m, "curr_resident_bytes"))));
    time_t dl = http_ka_deadline(l->ka, name);
    struct timespec ts = {.tv_sec = dl};
    json_object_set_new(o, "expires_at", dl ? time_str(&ts) : json_string(OL_FOREVER));
    json_object_set_new(o, "context_length",
                        json_integer(json_integer_value(json_object_get(m, "context"))));
    return o;
}

static json_t *show_of(const json_t *m, const char *name)
{
    const char *arch = json_string_value(json_object_get(m, "arch"));
    json_t *info = json_object();
    char key[96];
    json_object_set_new(info, "general.architecture", json_string(arch ? arch : ""));
    json_object_set(info, "general.parameter_count", json_object_get(m, "params"));
    snprintf(key, sizeof key, "%s.context_length", arch ? arch : "general");
    json_object_set(info, key, json_object_get(m, "context"));
    return json_pack("{s:s, s:s, s:s, s:o, s:o, s:[s], s:s}", "modelfile", "", "parameters", "",
                     "template", "", "details", details_of(m), "model_info", info, "capabilities",
                     "completion", "name", name);
}

json_t *http_ollama_list_of(const http_ol_list_t *l, const json_t *rep)
{
    json_t *models = json_array();
    size_t i;
    const json_t *m;
    json_array_foreach (json_object_get(rep, "models"), i, m) {
        const char *name = json_string_value(json_object_get(m, "name"));
        const char *state = json_string_value(json_object_get(m, "state"));
        if (!name || (l->key && !auth_key_allows(l->key, name)))
            continue;
        if (l->ol == HTTP_OL_SHOW) {
            if (strcmp(name, l->model ? l->model : "") == 0) {
                json_decref(models);
                return show_of(m, name);
            }
            continue;
        }
        if (l->ol == HTTP_OL_PS &&
            !(state && (strcmp(state, "resident") == 0 || strcmp(state, "partial") == 0)))
            continue;
        if (l->ol == HTTP_OL_TAGS && state && strcmp(state, "failed") == 0)
            continue;
        json_array_append_new(models, entry_of(l, m, name));
    }
    if (l->ol == HTTP_OL_SHOW) {
        json_decref(models);
        return NULL;
    }
    return json_pack("{s:o}", "models", models);
}

/* proto: the JSON-line codec of the inference and admin sockets (proto/PROTOCOL.md), shared by the daemon and the C client: names, the requests (parsed by the daemon, encoded by clients); the answers are proto_answer.c's. */
#include "proto.h"
#include "proto_int.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ names */

static const char *const err_codes[PROTO_E_COUNT] = {
    [PROTO_E_BAD_JSON] = "bad_json",           [PROTO_E_BAD_REQUEST] = "bad_request",
    [PROTO_E_UNKNOWN_MODEL] = "unknown_model", [PROTO_E_TOO_LARGE] = "too_large",
    [PROTO_E_OVERLOADED] = "overloaded",       [PROTO_E_CONTEXT_OVERFLOW] = "context_overflow",
    [PROTO_E_CANCELLED] = "cancelled",         [PROTO_E_SHUTTING_DOWN] = "shutting_down",
    [PROTO_E_INTERNAL] = "internal",           [PROTO_E_FORBIDDEN] = "forbidden",
    [PROTO_E_UNAUTHORIZED] = "unauthorized",   [PROTO_E_RATE_LIMITED] = "rate_limited",
};

const char *proto_err_code(proto_err_t e)
{
    if ((int)e <= 0 || e >= PROTO_E_COUNT)
        return err_codes[PROTO_E_INTERNAL];
    return err_codes[e];
}

proto_err_t proto_err_from_code(const char *code)
{
    if (!code)
        return 0;
    for (int e = 1; e < PROTO_E_COUNT; e++)
        if (strcmp(err_codes[e], code) == 0)
            return (proto_err_t)e;
    return 0;
}

/* Fields a request may carry besides "op" and "id". */
typedef enum pfield {
    F_MODEL,
    F_PROMPT,
    F_TOKENS,
    F_MESSAGES,
    F_TEXT,
    F_ADD_BOS,
    F_TARGET,
    F_MAX_TOKENS,
    F_SAMPLER, /* the first of SAMPLER_PARAM_COUNT fields, in sampler_params.h order */
    F_SEED = F_SAMPLER + SAMPLER_PARAM_COUNT,
    F_STOP,
    F_STREAM,
    F_FAULT,
    F_TIMES,
    F_DELAY_MS,
    F_KEY,
    F_CACHE_PROMPT,
    F_CACHE_SALT,
    F_LOGPROBS,
    F_TOP_LOGPROBS,
    F_LOGIT_BIAS,
    F_N,
    F_ECHO,
    F_SUFFIX,
    F_RESPONSE_FORMAT,
    F_GRAMMAR,
    F_TOOLS,
    F_TOOL_CHOICE,
    F_PARALLEL_TOOLS,
    F_DEADLINE_MS,
    F_CLASS,
    F_COUNT
} pfield_t;

static const char *const field_names[F_COUNT] = {
    [F_MODEL] = "model",
    [F_PROMPT] = "prompt",
    [F_TOKENS] = "tokens",
    [F_MESSAGES] = "messages",
    [F_TEXT] = "text",
    [F_ADD_BOS] = "add_bos",
    [F_TARGET] = "target",
    [F_MAX_TOKENS] = "max_tokens",
#define X(name, kind, ctype, lo, hi, bounds, def, help) [F_SAMPLER + SAMPLER_PARAM_##name] = #name,
    SAMPLER_PARAMS(X)
#undef X
        [F_SEED] = "seed",
    [F_STOP] = "stop",
    [F_STREAM] = "stream",
    [F_FAULT] = "fault",
    [F_TIMES] = "count",
    [F_DELAY_MS] = "delay_ms",
    [F_KEY] = "key",
    [F_CACHE_PROMPT] = "cache_prompt",
    [F_CACHE_SALT] = "cache_salt",
    [F_LOGPROBS] = "logprobs",
    [F_TOP_LOGPROBS] = "top_logprobs",
    [F_LOGIT_BIAS] = "logit_bias",
    [F_N] = "n",
    [F_ECHO] = "echo",
    [F_SUFFIX] = "suffix",
    [F_RESPONSE_FORMAT] = "response_format",
    [F_GRAMMAR] = "grammar",
    [F_TOOLS] = "tools",
    [F_TOOL_CHOICE] = "tool_choice",
    [F_PARALLEL_TOOLS] = "parallel_tool_calls",
    [F_DEADLINE_MS] = "deadline_ms",
    [F_CLASS] = "class",
};

static const char *const finish_names[PROTO_FINISH_COUNT] = {
    [PROTO_FINISH_STOP] = "stop",
    [PROTO_FINISH_EOS] = "eos",
    [PROTO_FINISH_LENGTH] = "length",
    [PROTO_FINISH_CANCELLED] = "cancelled",
};

const char *proto_finish_name(proto_finish_t f)
{
    return (unsigned)f < PROTO_FINISH_COUNT ? finish_names[f] : NULL;
}

/* The kinds the admin "fault" op takes. */
static const char *const fault_names[] = {"off",      "copy_fail", "copy_slow",
                                          "map_fail", "map_short", "stall"};
#define N_FAULTS ((int)(sizeof fault_names / sizeof fault_names[0]))

_Static_assert(PROTO_FAULT_STALL == N_FAULTS - 1, "stall is the last fault name");

const char *proto_fault_name(int fault)
{
    return fault >= 0 && fault < N_FAULTS ? fault_names[fault] : NULL;
}

#define FB(f) ((uint64_t)1 << (f))
#define F_SAMPLER_BITS ((((uint64_t)1 << SAMPLER_PARAM_COUNT) - 1u) << F_SAMPLER)
#define F_SAMPLING                                                                                 \
    (FB(F_MAX_TOKENS) | F_SAMPLER_BITS | FB(F_SEED) | FB(F_STOP) | FB(F_STREAM) |                  \
     FB(F_CACHE_PROMPT) | FB(F_CACHE_SALT) | FB(F_LOGPROBS) | FB(F_TOP_LOGPROBS) |                 \
     FB(F_LOGIT_BIAS) | FB(F_N) | FB(F_RESPONSE_FORMAT) | FB(F_GRAMMAR) | FB(F_DEADLINE_MS) |      \
     FB(F_CLASS))
_Static_assert(F_COUNT <= 64, "request fields are a uint64_t mask");

enum {
    SOCK_INFERENCE = 1,
    SOCK_ADMIN = 2,
    SOCK_BOTH = 3
};

/* One row per op: the sockets that take it, the fields it allows and those it requires.
 * generate's "prompt or tokens" rule is checked separately. */
static const struct op_desc {
    const char *name;
    int sockets;
    uint64_t allowed;
    uint64_t required;
} op_table[] = {
    [PROTO_OP_GENERATE] = {"generate", SOCK_INFERENCE,
                           FB(F_MODEL) | FB(F_PROMPT) | FB(F_TOKENS) | F_SAMPLING | FB(F_ECHO) |
                               FB(F_SUFFIX),
                           FB(F_MODEL)},
    [PROTO_OP_CHAT] = {"chat", SOCK_INFERENCE,
                       FB(F_MODEL) | FB(F_MESSAGES) | F_SAMPLING | FB(F_TOOLS) | FB(F_TOOL_CHOICE) |
                           FB(F_PARALLEL_TOOLS),
                       FB(F_MODEL) | FB(F_MESSAGES)},
    [PROTO_OP_TOKENIZE] = {"tokenize", SOCK_INFERENCE, FB(F_MODEL) | FB(F_TEXT) | FB(F_ADD_BOS),
                           FB(F_MODEL) | FB(F_TEXT)},
    [PROTO_OP_MODELS] = {"models", SOCK_BOTH, 0, 0},
    [PROTO_OP_CANCEL] = {"cancel", SOCK_INFERENCE, FB(F_TARGET), FB(F_TARGET)},
    [PROTO_OP_STATS] = {"stats", SOCK_ADMIN, 0, 0},
    [PROTO_OP_LOAD] = {"load", SOCK_ADMIN, FB(F_MODEL) | FB(F_STREAM), FB(F_MODEL)},
    [PROTO_OP_EVICT] = {"evict", SOCK_ADMIN, FB(F_MODEL), FB(F_MODEL)},
    [PROTO_OP_PIN] = {"pin", SOCK_ADMIN, FB(F_MODEL), FB(F_MODEL)},
    [PROTO_OP_UNPIN] = {"unpin", SOCK_ADMIN, FB(F_MODEL), FB(F_MODEL)},
    [PROTO_OP_RELOAD] = {"reload", SOCK_ADMIN, 0, 0},
    [PROTO_OP_DRAIN] = {"drain", SOCK_ADMIN, 0, 0},
    [PROTO_OP_FAULT] = {"fault", SOCK_ADMIN, FB(F_FAULT) | FB(F_TIMES) | FB(F_DELAY_MS),
                        FB(F_FAULT)},
    [PROTO_OP_AUTH] = {"auth", SOCK_INFERENCE, FB(F_KEY), FB(F_KEY)},
};
#define N_OPS ((int)(sizeof op_table / sizeof op_table[0]))

const char *proto_op_name(proto_op_t op)
{
    if ((int)op <= 0 || (int)op >= N_OPS)
        return NULL;
    return op_table[op].name;
}

static const char *const roles[] = {"system", "user", "assistant", "tool"};

/* ------------------------------------------------------------------ helpers */

/* The JSON type of v as a message word. */
const char *proto_type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Edit distance of a and b, or a large number when either is too long to care. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na > 32 || nb > 32)
        return 99;
    size_t row[33];
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* The known field (or "op"/"id") closest to key, if it is a plausible typo. */
static const char *suggest_field(const char *key)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (int f = 0; f < F_COUNT; f++) {
        size_t d = edit_distance(key, field_names[f]);
        if (d < best_d && d < strlen(field_names[f])) {
            best_d = d;
            best = field_names[f];
        }
    }
    return best;
}

/* The shortest decimal double that reads back as f, so 0.7f is written "0.7". */
static json_t *float_new(float f)
{
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f)
            return json_real(d);
    }
    return json_real((double)f);
}

/* ------------------------------------------------------------------ request parser */

/* Whether v holds a string with a NUL character (\u0000), at any depth (PROTO_MAX_DEPTH). */
static int has_nul(const json_t *v)
{
    if (json_is_string(v))
        return memchr(json_string_value(v), 0, json_string_length(v)) != NULL;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (has_nul(json_array_get(v, i)))
                return 1;
        return 0;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *m;
        json_object_foreach ((json_t *)v, k, m)
            if (has_nul(m))
                return 1;
    }
    return 0;
}

/* A short printable rendering of a string value for messages. */
void proto_quote_short(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n + 3 <= cap || cap < 8)
        snprintf(out, cap, "'%s'", s);
    else
        snprintf(out, cap, "'%.*s...'", (int)(cap - 6), s);
}

/* An id or target: a string of at most PROTO_MAX_ID_BYTES, or an integer. */
static int check_id(const char *name, const json_t *v, char *err, size_t errlen)
{
    if (json_is_integer(v))
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > PROTO_MAX_ID_BYTES)
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field '%s' is longer than %d bytes", name, PROTO_MAX_ID_BYTES);
        return 0;
    }
    return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                      "field '%s' must be a string or an integer (got %s)", name,
                      proto_type_word(v));
}

/* A string field of min..max bytes into a new heap copy (*out). */
static int get_string(const char *name, const json_t *v, size_t min, size_t max, char **out,
                      char *err, size_t errlen)
{
    if (!json_is_string(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' must be a string (got %s)",
                          name, proto_type_word(v));
    size_t n = json_string_length(v);
    if (n < min)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' must not be empty", name);
    if (n > max)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' is longer than %zu bytes",
                          name, max);
    char *s = malloc(n + 1);
    if (!s)
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    memcpy(s, json_string_value(v), n + 1);
    *out = s;
    return 0;
}

static int get_int(const char *name, const json_t *v, json_int_t lo, json_int_t hi, json_int_t *out,
                   char *err, size_t errlen)
{
    if (!json_is_integer(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field '%s' must be an integer (got %s)", name, proto_type_word(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field '%s' must be in %" JSON_INTEGER_FORMAT " .. %" JSON_INTEGER_FORMAT
                          " (got %" JSON_INTEGER_FORMAT ")",
                          name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(const char *name, const json_t *v, int *out, char *err, size_t errlen)
{
    if (!json_is_boolean(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field '%s' must be true or false (got %s)", name, proto_type_word(v));
    *out = json_is_true(v);
    return 0;
}

/* A number that fits a float; the range is the caller's. */
static int get_float(const char *name, const json_t *v, float *out, double *raw, char *err,
                     size_t errlen)
{
    if (!json_is_number(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' must be a number (got %s)",
                          name, proto_type_word(v));
    double d = json_number_value(v);
    if (!isfinite(d) || fabs(d) > FLT_MAX)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' is out of range (got %g)",
                          name, d);
    *out = (float)d;
    *raw = d;
    return 0;
}

static int parse_tokens(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    if (!json_is_array(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'tokens' must be an array of token ids (got %s)",
                          proto_type_word(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'tokens' must not be empty");
    if (n > PROTO_MAX_TOKENS)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'tokens' has %zu entries (max %d)", n, PROTO_MAX_TOKENS);
    req->tokens = malloc(n * sizeof *req->tokens);
    if (!req->tokens)
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i);
        if (!json_is_integer(t))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field 'tokens[%zu]' must be an integer token id (got %s)", i,
                              proto_type_word(t));
        json_int_t x = json_integer_value(t);
        if (x < 0 || x > INT32_MAX)
            return proto_fail(
                err, errlen, PROTO_E_BAD_REQUEST,
                "field 'tokens[%zu]' must be a token id in 0 .. %d (got %" JSON_INTEGER_FORMAT ")",
                i, INT32_MAX, x);
        req->tokens[i] = (int32_t)x;
    }
    req->n_tokens = n;
    return 0;
}

static int parse_messages(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    if (!json_is_array(v))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'messages' must be an array (got %s)", proto_type_word(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'messages' must not be empty");
    if (n > PROTO_MAX_MESSAGES)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'messages' has %zu entries (max %d)", n, PROTO_MAX_MESSAGES);
    req->messages = calloc(n, sizeof *req->messages);
    if (!req->messages)
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    req->n_messages = n; /* contents are NULL until filled; proto_req_free copes */
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        proto_msg_t *pm = &req->messages[i];
        char name[48];
        if (!json_is_object(m))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field 'messages[%zu]' must be an object (got %s)", i,
                              proto_type_word(m));
        const char *key;
        json_t *val;
        json_object_foreach ((json_t *)m, key, val) {
            if (strcmp(key, "role") != 0 && strcmp(key, "content") != 0 &&
                strcmp(key, "tool_calls") != 0 && strcmp(key, "tool_call_id") != 0) {
                char q[72];
                proto_quote_short(q, sizeof q, key);
                return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                                  "unknown field %s in 'messages[%zu]' (a message has role, "
                                  "content, tool_calls, tool_call_id)",
                                  q, i);
            }
        }
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        snprintf(name, sizeof name, "messages[%zu].role", i);
        if (!role)
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "missing field '%s'", name);
        if (!json_is_string(role))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field '%s' must be a string (got %s)", name, proto_type_word(role));
        const char *r = json_string_value(role);
        size_t k = 0;
        while (k < sizeof roles / sizeof roles[0] && strcmp(roles[k], r) != 0)
            k++;
        if (k == sizeof roles / sizeof roles[0]) {
            char q[48];
            proto_quote_short(q, sizeof q, r);
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field '%s' must be system, user, assistant or tool (got %s)", name,
                              q);
        }
        snprintf(pm->role, sizeof pm->role, "%s", roles[k]);
        snprintf(name, sizeof name, "messages[%zu].content", i);
        int rc = proto_parse_msg_tools(i, m, (int)k, pm, err, errlen);
        if (!rc && !pm->content && !content) /* content "" set: calls without content */
            rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "missing field '%s'", name);
        if (rc || (!pm->content &&
                   (rc = get_string(name, content, 0, SIZE_MAX, &pm->content, err, errlen))))
            return rc;
    }
    return 0;
}

static int parse_stop(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    size_t n;
    if (json_is_string(v))
        n = 1;
    else if (json_is_array(v))
        n = json_array_size(v);
    else
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'stop' must be a string or an array of strings (got %s)",
                          proto_type_word(v));
    if (n > PROTO_MAX_STOP)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'stop' has %zu entries (max %d)",
                          n, PROTO_MAX_STOP);
    if (n == 0)
        return 0;
    req->stop = calloc(n, sizeof *req->stop);
    if (!req->stop)
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    req->n_stop = n;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        const json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (json_is_string(v))
            snprintf(name, sizeof name, "stop");
        else
            snprintf(name, sizeof name, "stop[%zu]", i);
        int rc = get_string(name, s, 1, PROTO_MAX_STOP_BYTES, &req->stop[i], err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Where each sampling parameter and its has_ flag live in a request. */
static const struct req_sampler_off {
    size_t val, has;
} req_sampler_off[SAMPLER_PARAM_COUNT] = {
#define X(name, kind, ctype, lo, hi, bounds, def, help)                                            \
    [SAMPLER_PARAM_##name] = {offsetof(proto_req_t, name), offsetof(proto_req_t, has_##name)},
    SAMPLER_PARAMS(X)
#undef X
};

void proto_req_sampler_get(const proto_req_t *req, int i, double *v, int *has)
{
    const char *base = (const char *)req;
    const sampler_param_desc_t *d = &sampler_param_descs[i];
    if (d->kind == SAMPLER_KIND_I32) {
        int32_t x;
        memcpy(&x, base + req_sampler_off[i].val, sizeof x);
        *v = x;
    } else {
        float x;
        memcpy(&x, base + req_sampler_off[i].val, sizeof x);
        *v = x;
    }
    memcpy(has, base + req_sampler_off[i].has, sizeof *has);
}

void proto_req_sampler_set(proto_req_t *req, int i, double v)
{
    char *base = (char *)req;
    const sampler_param_desc_t *d = &sampler_param_descs[i];
    if (d->kind == SAMPLER_KIND_I32) {
        int32_t x = (int32_t)v;
        memcpy(base + req_sampler_off[i].val, &x, sizeof x);
    } else {
        float x = (float)v;
        memcpy(base + req_sampler_off[i].val, &x, sizeof x);
    }
    int one = 1;
    memcpy(base + req_sampler_off[i].has, &one, sizeof one);
}

/* Parses sampling parameter i (sampler_params.h) into req, checking its range. */
static int parse_sampler(int i, const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    const sampler_param_desc_t *d = &sampler_param_descs[i];
    int rc;
    if (d->kind == SAMPLER_KIND_I32) {
        json_int_t x;
        if ((rc = get_int(d->name, v, (json_int_t)d->lo, (json_int_t)d->hi, &x, err, errlen)))
            return rc;
        proto_req_sampler_set(req, i, (double)x);
        return 0;
    }
    float f = 0;
    double raw = 0;
    char range[64];
    if ((rc = get_float(d->name, v, &f, &raw, err, errlen)))
        return rc;
    if (!sampler_param_in_range(d, raw))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field '%s' must be in %s (got %g)",
                          d->name, sampler_param_range_text(d, range, sizeof range), raw);
    proto_req_sampler_set(req, i, raw);
    return 0;
}

/* response_format: {"type": "text"} (left NULL), "json_object" or "json_schema" (kept for the
 * worker, which compiles it: PROTOCOL.md). */
static int parse_response_format(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    const char *t = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !t)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'response_format' must be an object with a string 'type'");
    if (strcmp(t, "text") == 0)
        return 0;
    if (strcmp(t, "json_object") != 0 && strcmp(t, "json_schema") != 0)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'response_format' type must be text, json_object or json_schema");
    if (strcmp(t, "json_schema") == 0 &&
        !json_is_object(json_object_get(json_object_get(v, "json_schema"), "schema")))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "field 'response_format' json_schema needs json_schema.schema");
    if (!(req->response_format = json_deep_copy(v)))
        return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    return 0;
}

/* Parses one known field f (already allowed for the op) into req. */
static int parse_field(pfield_t f, const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    const char *name = field_names[f];
    json_int_t x = 0;
    int rc;
    if (f >= F_SAMPLER && f < F_SAMPLER + SAMPLER_PARAM_COUNT)
        return parse_sampler((int)(f - F_SAMPLER), v, req, err, errlen);
    switch (f) {
    case F_MODEL: return get_string(name, v, 1, PROTO_MAX_NAME_BYTES, &req->model, err, errlen);
    case F_PROMPT: return get_string(name, v, 0, SIZE_MAX, &req->prompt, err, errlen);
    case F_TOKENS: return parse_tokens(v, req, err, errlen);
    case F_MESSAGES: return parse_messages(v, req, err, errlen);
    case F_TEXT: return get_string(name, v, 0, SIZE_MAX, &req->text, err, errlen);
    case F_ADD_BOS: return get_bool(name, v, &req->add_bos, err, errlen);
    case F_TARGET: {
        if ((rc = check_id(name, v, err, errlen)))
            return rc;
        char num[32];
        const char *s = num;
        if (json_is_integer(v))
            snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        else
            s = json_string_value(v);
        if (!(req->target = strdup(s)))
            return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
        req->target_id = json_deep_copy(v);
        if (!req->target_id)
            return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
        return 0;
    }
    case F_MAX_TOKENS:
        if ((rc = get_int(name, v, 0, INT32_MAX, &x, err, errlen)))
            return rc;
        req->max_tokens = (int32_t)x;
        req->has_max_tokens = 1;
        return 0;
    case F_SEED:
        if ((rc = get_int(name, v, 0, INT64_MAX, &x, err, errlen)))
            return rc;
        req->seed = (uint64_t)x;
        req->has_seed = 1;
        return 0;
    case F_STOP: return parse_stop(v, req, err, errlen);
    case F_STREAM: return get_bool(name, v, &req->stream, err, errlen);
    case F_CACHE_PROMPT: {
        int on = 1;
        if ((rc = get_bool(name, v, &on, err, errlen)))
            return rc;
        req->cache_off = !on;
        return 0;
    }
    case F_CACHE_SALT:
        return get_string(name, v, 1, PROTO_MAX_NAME_BYTES, &req->cache_salt, err, errlen);
    case F_LOGPROBS: return get_bool(name, v, &req->logprobs, err, errlen);
    case F_ECHO: return get_bool(name, v, &req->echo, err, errlen);
    case F_SUFFIX: return get_string(name, v, 0, SIZE_MAX, &req->suffix, err, errlen);
    case F_TOP_LOGPROBS:
        if ((rc = get_int(name, v, 0, PROTO_MAX_TOP_LOGPROBS, &x, err, errlen)))
            return rc;
        req->top_logprobs = (int32_t)x;
        return 0;
    case F_N:
        if ((rc = get_int(name, v, 1, PROTO_MAX_CHOICES, &x, err, errlen)))
            return rc;
        req->n = (uint32_t)x;
        return 0;
    case F_DEADLINE_MS:
        if ((rc = get_int(name, v, 1, PROTO_MAX_DEADLINE_MS, &x, err, errlen)))
            return rc;
        req->deadline_ms = (uint32_t)x;
        return 0;
    case F_CLASS: {
        const char *c = json_string_value(v);
        if (!c || (strcmp(c, "interactive") != 0 && strcmp(c, "batch") != 0))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field 'class' must be \"interactive\" or \"batch\"");
        req->batch = strcmp(c, "batch") == 0;
        return 0;
    }
    case F_LOGIT_BIAS: return proto_parse_logit_bias(v, req, err, errlen);
    case F_RESPONSE_FORMAT: return parse_response_format(v, req, err, errlen);
    case F_GRAMMAR: return get_string(name, v, 1, SIZE_MAX, &req->grammar, err, errlen);
    case F_TOOLS: return proto_parse_tools(v, req, err, errlen);
    case F_TOOL_CHOICE: return proto_parse_tool_choice(v, req, err, errlen);
    case F_PARALLEL_TOOLS: return proto_parse_parallel_tools(v, req, err, errlen);
    case F_FAULT: {
        if (!json_is_string(v))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "field 'fault' must be a string (got %s)", proto_type_word(v));
        for (int k = 0; k < N_FAULTS; k++)
            if (strcmp(json_string_value(v), fault_names[k]) == 0) {
                req->fault = k;
                return 0;
            }
        return proto_fail(
            err, errlen, PROTO_E_BAD_REQUEST,
            "field 'fault' must be one of off, copy_fail, copy_slow, map_fail, map_short, "
            "stall");
    }
    case F_TIMES:
        if ((rc = get_int(name, v, 1, 1000000, &x, err, errlen)))
            return rc;
        req->fault_count = (uint32_t)x;
        return 0;
    case F_DELAY_MS:
        if ((rc = get_int(name, v, 0, 3600000, &x, err, errlen)))
            return rc;
        req->fault_delay_ms = (uint32_t)x;
        return 0;
    case F_KEY: /* never echoed in a message; a NUL in it stays, for the server to refuse the
                 * whole key as a wrong one (unauthorized, with the request's id) */
        if ((rc = get_string(name, v, 1, PROTO_MAX_KEY_BYTES, &req->key, err, errlen)))
            return rc;
        req->key_len = json_string_length(v);
        return 0;
    case F_SAMPLER:
    case F_COUNT: break;
    }
    return proto_fail(err, errlen, PROTO_E_INTERNAL, "field table out of step");
}

/* The body of proto_parse_request once root is an object; req->id is set first. */
static int parse_object(const json_t *root, int admin, proto_req_t *req, char *err, size_t errlen)
{
    int rc;
    req->add_bos = 1;
    const json_t *id = json_object_get(root, "id");
    if (id) {
        if ((rc = check_id("id", id, err, errlen)))
            return rc;
        if (!(req->id = json_deep_copy(id)))
            return proto_fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    }

    const json_t *op = json_object_get(root, "op");
    if (!op)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "missing field 'op'");
    if (!json_is_string(op))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'op' must be a string (got %s)",
                          proto_type_word(op));
    const char *opname = json_string_value(op);
    int o = 1;
    while (o < N_OPS && strcmp(op_table[o].name, opname) != 0)
        o++;
    char q[72];
    proto_quote_short(q, sizeof q, opname);
    if (o == N_OPS)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "unknown op %s", q);
    const struct op_desc *od = &op_table[o];
    if (!(od->sockets & (admin ? SOCK_ADMIN : SOCK_INFERENCE)))
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          admin ? "op %s is not an admin op (use the inference socket)"
                                : "op %s is only valid on the admin socket",
                          q);
    req->op = (proto_op_t)o;

    uint64_t seen = 0;
    const char *key;
    json_t *val;
    json_object_foreach ((json_t *)root, key, val) {
        if (strcmp(key, "op") == 0 || strcmp(key, "id") == 0)
            continue;
        int f = 0;
        while (f < F_COUNT && strcmp(field_names[f], key) != 0)
            f++;
        proto_quote_short(q, sizeof q, key);
        if (f == F_COUNT) {
            const char *s = suggest_field(key);
            if (s)
                return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                                  "unknown field %s (did you mean '%s'?)", q, s);
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "unknown field %s", q);
        }
        if (!(od->allowed & FB(f)))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "field %s is not valid for op '%s'",
                              q, od->name);
        if ((rc = parse_field((pfield_t)f, val, req, err, errlen)))
            return rc;
        seen |= FB(f);
    }

    for (int f = 0; f < F_COUNT; f++)
        if ((od->required & FB(f)) && !(seen & FB(f)))
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "missing field '%s'",
                              field_names[f]);
    if (req->op == PROTO_OP_GENERATE) {
        int np = !!(seen & FB(F_PROMPT)), nt = !!(seen & FB(F_TOKENS));
        if (np && nt)
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "give either 'prompt' or 'tokens', not both");
        if (!np && !nt)
            return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                              "missing field 'prompt' (or 'tokens')");
    }
    if (req->grammar && req->response_format)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "give either 'grammar' or 'response_format', not both");
    if ((rc = proto_tools_check(req, err, errlen)))
        return rc;
    if (req->top_logprobs > 0 && !req->logprobs)
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "'top_logprobs' needs 'logprobs': true");
    if (req->echo &&
        req->logprobs) /* the prompt's own logprobs would need every position's logits */
        return proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                          "'echo' and 'logprobs' together are not supported");
    return 0;
}

int proto_parse_request(const char *line, size_t len, int admin, proto_req_t *req, json_t **id_out,
                        char *err, size_t errlen)
{
    memset(req, 0, sizeof *req);
    if (id_out)
        *id_out = NULL;
    if (err && errlen)
        err[0] = '\0';

    int rc = 0;
    json_t *root =
        proto_load_line(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &rc, err, errlen);
    if (!root)
        return rc;
    if (!json_is_object(root)) {
        rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "a request must be a JSON object (got %s)", proto_type_word(root));
        json_decref(root);
        return rc;
    }
    /* \u0000 is read only so that a key holding one fails as the wrong key it is; in any
     * other string (an id, a name, a prompt: C strings from here on) it is invalid JSON */
    const char *k;
    json_t *v;
    json_object_foreach (root, k, v) {
        if (strcmp(k, field_names[F_KEY]) != 0 && has_nul(v)) {
            rc = proto_fail(err, errlen, PROTO_E_BAD_JSON,
                            "invalid JSON: \\u0000 in field '%s' (allowed in 'key' only)", k);
            json_decref(root);
            return rc;
        }
    }
    rc = parse_object(root, admin, req, err, errlen);
    json_decref(root);
    if (rc) {
        if (id_out) {
            *id_out = req->id;
            req->id = NULL;
        }
        proto_req_free(req);
    }
    return rc;
}

void proto_req_free(proto_req_t *req)
{
    if (!req)
        return;
    json_decref(req->id);
    json_decref(req->target_id);
    json_decref(req->response_format);
    free(req->grammar);
    free(req->model);
    free(req->prompt);
    free(req->tokens);
    proto_tools_free(req);
    for (size_t i = 0; i < req->n_messages; i++)
        free(req->messages[i].content);
    free(req->messages);
    free(req->text);
    free(req->target);
    for (size_t i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    free(req->stop);
    free(req->bias_ids);
    free(req->bias);
    free(req->suffix);
    if (req->key) {
        explicit_bzero(req->key, req->key_len ? req->key_len : strlen(req->key));
        free(req->key);
    }
    for (size_t i = 0; i < req->n_allow; i++)
        free(req->allow[i]);
    free(req->allow);
    free(req->tenant);
    free(req->cache_salt);
    memset(req, 0, sizeof *req);
}

/* ------------------------------------------------------------------ client side */

/* Adds req's field f to root; -1 on OOM or an unencodable value. */
static int encode_field(json_t *root, pfield_t f, const proto_req_t *req)
{
    const char *name = field_names[f];
    if (f >= F_SAMPLER && f < F_SAMPLER + SAMPLER_PARAM_COUNT) {
        int i = (int)(f - F_SAMPLER), has;
        double v;
        proto_req_sampler_get(req, i, &v, &has);
        if (!has)
            return 0;
        return proto_set_new(root, name,
                             sampler_param_descs[i].kind == SAMPLER_KIND_I32
                                 ? json_integer((json_int_t)v)
                                 : float_new((float)v));
    }
    switch (f) {
    case F_MODEL: return req->model ? proto_set_new(root, name, proto_str_new(req->model)) : 0;
    case F_PROMPT: return req->prompt ? proto_set_new(root, name, proto_str_new(req->prompt)) : 0;
    case F_TOKENS: {
        if (!req->tokens)
            return 0;
        json_t *a = json_array();
        if (!a)
            return -1;
        for (size_t i = 0; i < req->n_tokens; i++)
            if (json_array_append_new(a, json_integer(req->tokens[i]))) {
                json_decref(a);
                return -1;
            }
        return proto_set_new(root, name, a);
    }
    case F_MESSAGES: {
        if (!req->messages)
            return 0;
        json_t *a = json_array();
        if (!a)
            return -1;
        for (size_t i = 0; i < req->n_messages; i++) {
            json_t *m = json_object();
            if (!m || proto_set_new(m, "role", proto_str_new(req->messages[i].role)) ||
                proto_set_new(m, "content", proto_str_new(req->messages[i].content)) ||
                proto_tools_encode_msg(m, &req->messages[i]) || json_array_append_new(a, m)) {
                json_decref(a);
                return -1;
            }
        }
        return proto_set_new(root, name, a);
    }
    case F_TEXT: return req->text ? proto_set_new(root, name, proto_str_new(req->text)) : 0;
    case F_ADD_BOS: return proto_set_new(root, name, json_boolean(req->add_bos));
    case F_TARGET:
        if (req->target_id)
            return proto_set_new(root, name, json_deep_copy(req->target_id));
        return req->target ? proto_set_new(root, name, proto_str_new(req->target)) : 0;
    case F_MAX_TOKENS:
        return req->has_max_tokens ? proto_set_new(root, name, json_integer(req->max_tokens)) : 0;
    case F_SEED:
        if (!req->has_seed)
            return 0;
        if (req->seed > INT64_MAX)
            return -1;
        return proto_set_new(root, name, json_integer((json_int_t)req->seed));
    case F_STOP: {
        if (req->n_stop == 0)
            return 0;
        json_t *a = json_array();
        if (!a)
            return -1;
        for (size_t i = 0; i < req->n_stop; i++)
            if (json_array_append_new(a, proto_str_new(req->stop[i]))) {
                json_decref(a);
                return -1;
            }
        return proto_set_new(root, name, a);
    }
    case F_STREAM: return req->stream ? proto_set_new(root, name, json_true()) : 0;
    case F_CACHE_PROMPT: return req->cache_off ? proto_set_new(root, name, json_false()) : 0;
    case F_CACHE_SALT:
        return req->cache_salt ? proto_set_new(root, name, proto_str_new(req->cache_salt)) : 0;
    case F_LOGPROBS: return req->logprobs ? proto_set_new(root, name, json_true()) : 0;
    case F_ECHO: return req->echo ? proto_set_new(root, name, json_true()) : 0;
    case F_SUFFIX: return req->suffix ? proto_set_new(root, name, proto_str_new(req->suffix)) : 0;
    case F_TOP_LOGPROBS:
        return req->top_logprobs ? proto_set_new(root, name, json_integer(req->top_logprobs)) : 0;
    case F_N: return req->n ? proto_set_new(root, name, json_integer(req->n)) : 0;
    case F_DEADLINE_MS:
        return req->deadline_ms ? proto_set_new(root, name, json_integer(req->deadline_ms)) : 0;
    case F_CLASS: return req->batch ? proto_set_new(root, name, json_string("batch")) : 0;
    case F_LOGIT_BIAS:
        return req->n_bias ? proto_set_new(root, name, proto_logit_bias_new(req)) : 0;
    case F_RESPONSE_FORMAT:
        return req->response_format
                   ? proto_set_new(root, name, json_deep_copy(req->response_format))
                   : 0;
    case F_GRAMMAR:
        return req->grammar ? proto_set_new(root, name, proto_str_new(req->grammar)) : 0;
    case F_TOOLS: return proto_tools_encode(root, req); /* all three */
    case F_TOOL_CHOICE:
    case F_PARALLEL_TOOLS: return 0;
    case F_FAULT:
        return proto_fault_name(req->fault)
                   ? proto_set_new(root, name, json_string(proto_fault_name(req->fault)))
                   : -1;
    case F_TIMES:
        return req->fault_count ? proto_set_new(root, name, json_integer(req->fault_count)) : 0;
    case F_DELAY_MS:
        return req->fault_delay_ms ? proto_set_new(root, name, json_integer(req->fault_delay_ms))
                                   : 0;
    case F_KEY:
        if (!req->key)
            return 0;
        return proto_set_new(root, name,
                             req->key_len ? json_stringn(req->key, req->key_len)
                                          : proto_str_new(req->key));
    case F_SAMPLER:
    case F_COUNT: break;
    }
    return -1;
}

char *proto_encode_request(const proto_req_t *req)
{
    const char *opname = proto_op_name(req->op);
    if (!opname)
        return NULL;
    json_t *root = json_object();
    if (!root || proto_set_new(root, "op", json_string(opname)) ||
        (req->id && proto_set_new(root, "id", proto_id_new(req->id)))) {
        json_decref(root);
        return NULL;
    }
    uint64_t allowed = op_table[req->op].allowed;
    for (int f = 0; f < F_COUNT; f++)
        if ((allowed & FB(f)) && encode_field(root, (pfield_t)f, req)) {
            json_decref(root);
            return NULL;
        }
    return proto_line_finish(root);
}

/* http_openai: the OpenAI side of HTTP, pure and thread-free: request bodies mapped onto the socket protocol's lines, and the OpenAI JSON answers built from the worker's events. */
#include "http_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* ------------------------------------------------------------------ completions: answers */

/* OpenAI's finish_reason: length -> "length"; stop, eos, cancelled -> "stop". */
static const char *finish_of(proto_finish_t reason)
{
    return reason == PROTO_FINISH_LENGTH ? "length" : "stop";
}

static json_t *chunk_new(const http_answer_t *a, json_t *choices /* stolen */)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", a->rid, "object",
                     a->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)a->created, "model", a->model ? a->model : "", "choices", choices);
}

/* Characters (code points) of UTF-8 text s. */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; s && *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* chat's form of one of our entries (proto_logprob_new): {token, logprob, bytes}, with
 * top_logprobs when top is set. A new object. */
static json_t *chat_logprob(const json_t *e, int top)
{
    json_t *o = json_pack("{s:O, s:O, s:O}", "token", json_object_get(e, "text"), "logprob",
                          json_object_get(e, "logprob"), "bytes", json_object_get(e, "bytes"));
    if (!o || !top)
        return o;
    json_t *alts = json_array();
    size_t i;
    const json_t *x;
    json_array_foreach (json_object_get(e, "top_logprobs"), i, x)
        json_array_append_new(alts, chat_logprob(x, 0));
    json_object_set_new(o, "top_logprobs", alts);
    return o;
}

/* OpenAI's logprobs of a choice from our entries (one object or an array of them): chat's
 * {content: [...], refusal: null}, completions' {tokens, token_logprobs, top_logprobs,
 * text_offset} (offset: the first token's text_offset, advanced past them). NULL entries: null. */
static json_t *logprobs_of(const http_answer_t *a, const json_t *entries, size_t *offset)
{
    if (!entries)
        return json_null();
    json_t *one = json_is_array(entries) ? NULL : json_pack("[O]", entries);
    const json_t *arr = one ? one : entries;
    json_t *out = a->chat ? json_pack("{s:[], s:n}", "content", "refusal")
                          : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                      "top_logprobs", "text_offset");
    size_t i, at = offset ? *offset : 0;
    const json_t *e;
    json_array_foreach (arr, i, e) {
        if (a->chat) {
            json_array_append_new(json_object_get(out, "content"), chat_logprob(e, 1));
            continue;
        }
        const json_t *text = json_object_get(e, "text");
        json_array_append(json_object_get(out, "tokens"), (json_t *)text);
        json_array_append(json_object_get(out, "token_logprobs"), json_object_get(e, "logprob"));
        json_t *alts = json_object();
        size_t k;
        const json_t *x;
        json_array_foreach (json_object_get(e, "top_logprobs"), k, x) {
            const char *t = json_string_value(json_object_get(x, "text"));
            if (t && !json_object_get(alts, t)) /* two tokens of one text: the likelier */
                json_object_set(alts, t, json_object_get(x, "logprob"));
        }
        json_array_append_new(json_object_get(out, "top_logprobs"), alts);
        json_array_append_new(json_object_get(out, "text_offset"), json_integer((json_int_t)at));
        at += utf8_chars(json_string_value(text));
    }
    if (offset)
        *offset = at;
    json_decref(one);
    return out;
}

/* One streamed choice: text NULL with finish set for the last one. */
static json_t *chunk_choice(const http_answer_t *a, const wk_event_t *ev, const char *text,
                            const char *finish, int role)
{
    uint32_t index = ev ? ev->index : 0;
    size_t *off = a->offset && index < PROTO_MAX_CHOICES ? &a->offset[index] : NULL;
    json_t *c =
        json_pack("{s:i, s:o}", "index", (int)index, "logprobs",
                  logprobs_of(a, ev && ev->kind == WK_EVENT_TOKEN ? ev->logprobs : NULL, off));
    if (!c)
        return NULL;
    if (a->chat) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text)
            json_object_set_new(delta, "content", proto_str_new(text));
        json_object_set_new(c, "delta", delta);
    } else {
        json_object_set_new(c, "text", proto_str_new(text));
    }
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return json_pack("[o]", c);
}

static json_t *usage_of(const wk_event_t *ev)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)ev->prompt_tokens,
                     "completion_tokens", (json_int_t)ev->completion_tokens, "total_tokens",
                     (json_int_t)ev->prompt_tokens + (json_int_t)ev->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)ev->cached_tokens);
}

json_t *http_chunk_of(const http_answer_t *a, const wk_event_t *ev, int usage)
{
    if (ev->kind == WK_EVENT_DONE && usage) {
        json_t *c = chunk_new(a, json_array());
        if (c && json_object_set_new(c, "usage", usage_of(ev))) {
            json_decref(c);
            return NULL;
        }
        return c;
    }
    if (ev->kind == WK_EVENT_TOKEN)
        return chunk_new(a, chunk_choice(a, ev, ev->text ? ev->text : "", NULL, 0));
    if (ev->kind == WK_EVENT_DONE)
        return chunk_new(
            a, chunk_choice(a, ev, NULL, ev->tool_calls ? "tool_calls" : finish_of(ev->finish), 0));
    return NULL;
}

json_t *http_choice_of(const http_answer_t *a, const wk_event_t *ev)
{
    if (ev->kind != WK_EVENT_DONE)
        return NULL;
    json_t *choice = json_pack("{s:i}", "index", (int)ev->index);
    if (!choice)
        return NULL;
    if (a->chat)
        json_object_set_new(choice, "message", http_tools_message(ev));
    else
        json_object_set_new(choice, "text", proto_str_new(ev->text));
    json_object_set_new(choice, "logprobs", logprobs_of(a, ev->logprobs, NULL));
    json_object_set_new(choice, "finish_reason",
                        json_string(ev->tool_calls ? "tool_calls" : finish_of(ev->finish)));
    return choice;
}

static int choice_cmp(const void *pa, const void *pb)
{
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)pa, "index"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)pb, "index"));
    return (x > y) - (x < y);
}

json_t *http_completion_of(const http_answer_t *a, const wk_event_t *ev, const json_t *more)
{
    json_t *last = http_choice_of(a, ev);
    if (!last)
        return NULL;
    size_t n = json_array_size(more) + 1;
    json_t **v = malloc(n * sizeof *v);
    json_t *choices = json_array();
    if (!v || !choices) {
        free(v);
        json_decref(last);
        json_decref(choices);
        return NULL;
    }
    for (size_t i = 0; i + 1 < n; i++)
        v[i] = json_array_get(more, i);
    v[n - 1] = last;
    qsort(v, n, sizeof *v, choice_cmp);
    for (size_t i = 0; i < n; i++)
        json_array_append(choices, v[i]);
    free(v);
    json_decref(last);
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", a->rid, "object",
                     a->chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)a->created, "model", a->model ? a->model : "", "choices", choices,
                     "usage", usage_of(ev));
}

json_t *http_role_chunk_of(const http_answer_t *a, uint32_t index)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN, .index = index};
    return chunk_new(a, chunk_choice(a, &ev, "", NULL, 1));
}

/* ------------------------------------------------------------------ completions: requests */

/* null, false, 0, "", [] and {}: the value of an OpenAI option that is off. */
static int is_off(const json_t *v)
{
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_number(v) && json_number_value(v) == 0) ||
           (json_is_string(v) && json_string_length(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0);
}

enum {
    OP_CMPL = 1,
    OP_CHAT = 2,
    OP_BOTH = 3
};

typedef enum fkind {
    F_COPY = 1, /* copied under `as` (null = absent), validated by the codec */
    F_IGNORE,   /* accepted and ignored */
    F_OFF,      /* accepted while off (is_off), else not supported */
    F_ONE,      /* n, best_of: null or 1 */
    F_PROMPT,
    F_MESSAGES,
    F_STREAM_OPTIONS,
    F_RESPONSE_FORMAT,
    F_TOOL_CHOICE,
    F_CMPL_LOGPROBS, /* completions' logprobs: N -> logprobs true, top_logprobs N */
} fkind_t;

static const struct {
    const char *name, *as;
    fkind_t kind;
    int ops;
} http_fields[] = {
    {"model", "model", F_COPY, OP_BOTH},
    {"prompt", NULL, F_PROMPT, OP_CMPL},
    {"messages", NULL, F_MESSAGES, OP_CHAT},
    {"max_tokens", "max_tokens", F_COPY, OP_BOTH},
    {"max_completion_tokens", "max_tokens", F_COPY, OP_CHAT},
#define X(name, kind, ctype, lo, hi, bounds, def, help) {#name, #name, F_COPY, OP_BOTH},
    SAMPLER_PARAMS(X) /* temperature, top_p, ..., presence_penalty, frequency_penalty */
#undef X
    {"repetition_penalty", "repeat_penalty", F_COPY, OP_BOTH},
    {"seed", "seed", F_COPY, OP_BOTH},
    {"stop", "stop", F_COPY, OP_BOTH},
    {"stream", "stream", F_COPY, OP_BOTH},
    {"stream_options", NULL, F_STREAM_OPTIONS, OP_BOTH},
    {"cache_prompt", "cache_prompt", F_COPY, OP_BOTH}, /* llama.cpp's name: false = no reuse */
    {"cache_salt", "cache_salt", F_COPY, OP_BOTH},     /* vLLM's: who shares cached prefixes */
    {"n", "n", F_COPY, OP_BOTH},
    {"best_of", NULL, F_ONE, OP_CMPL},
    {"user", NULL, F_IGNORE, OP_BOTH},
    {"store", NULL, F_IGNORE, OP_CHAT},
    {"metadata", NULL, F_IGNORE, OP_CHAT},
    {"service_tier", NULL, F_IGNORE, OP_BOTH},
    {"parallel_tool_calls", "parallel_tool_calls", F_COPY, OP_CHAT},
    {"echo", "echo", F_COPY, OP_CMPL},
    {"suffix", "suffix", F_COPY, OP_CMPL},
    {"logprobs", NULL, F_CMPL_LOGPROBS, OP_CMPL},
    {"logprobs", "logprobs", F_COPY, OP_CHAT},
    {"top_logprobs", "top_logprobs", F_COPY, OP_CHAT},
    {"logit_bias", "logit_bias", F_COPY, OP_BOTH},
    {"tools", "tools", F_COPY, OP_CHAT}, /* the socket validates them (PROTOCOL.md) */
    {"functions", NULL, F_OFF, OP_CHAT},
    {"tool_choice", "tool_choice", F_COPY, OP_CHAT},
    {"function_call", NULL, F_TOOL_CHOICE, OP_CHAT}, /* the legacy functions API: off only */
    {"response_format", NULL, F_RESPONSE_FORMAT, OP_CHAT},
    {"grammar", "grammar", F_COPY, OP_BOTH}, /* llama.cpp's extension: a GBNF-like grammar */
};

/* OpenAI's prompt: a string, an array of one string, token ids, or an array
 * of one array of token ids. 0, or -1 with the reason in err. */
static int map_prompt(json_t *out, json_t *v, char *err, size_t errlen)
{
    if (!json_is_array(v)) {
        json_object_set(out, "prompt", v); /* a string, or the codec names the type */
        return 0;
    }
    size_t n = json_array_size(v);
    if (n == 0) {
        snprintf(err, errlen, "field 'prompt' is an empty array");
        return -1;
    }
    int all_ints = 1;
    for (size_t i = 0; i < n; i++)
        all_ints &= json_is_integer(json_array_get(v, i));
    if (all_ints) {
        json_object_set(out, "tokens", v);
        return 0;
    }
    if (n > 1) {
        snprintf(err, errlen, "field 'prompt' holds %zu prompts: one per request is supported", n);
        return -1;
    }
    json_t *one = json_array_get(v, 0);
    if (json_is_array(one))
        json_object_set(out, "tokens", one);
    else
        json_object_set(out, "prompt", one);
    return 0;
}

/* A message's content: a string, null (""), or text parts joined by '\n'. */
static json_t *map_content(size_t i, const json_t *c, char *err, size_t errlen)
{
    if (!c || json_is_null(c))
        return json_string("");
    if (!json_is_array(c))
        return json_incref((json_t *)c); /* a string, or the codec names the type */
    size_t len = 0, k;
    const json_t *part;
    json_array_foreach (c, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(text)) {
            snprintf(err, errlen,
                     "messages[%zu].content[%zu]: only {\"type\":\"text\",\"text\":...} "
                     "parts are supported",
                     i, k);
            return NULL;
        }
        len += json_string_length(text) + 1;
    }
    char *s = malloc(len + 1), *p = s;
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    json_array_foreach (c, k, part) {
        const json_t *text = json_object_get(part, "text");
        if (k)
            *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    json_t *out = json_stringn(s, (size_t)(p - s));
    free(s);
    if (!out)
        snprintf(err, errlen, "messages[%zu].content is not valid UTF-8", i);
    return out;
}

static int map_messages(json_t *out, json_t *v, char *err, size_t errlen)
{
    if (!json_is_array(v)) {
        json_object_set(out, "messages", v);
        return 0;
    }
    json_t *arr = json_array();
    json_object_set_new(out, "messages", arr);
    size_t i;
    json_t *m;
    json_array_foreach (v, i, m) {
        if (!json_is_object(m)) {
            json_array_append(arr, m); /* the codec names the type */
            continue;
        }
        json_t *o = json_object();
        json_array_append_new(arr, o);
        const char *key;
        json_t *x;
        json_object_foreach (m, key, x) {
            if (strcmp(key, "role") == 0) {
                const char *role = json_string_value(x);
                json_object_set_new(o, "role",
                                    role && strcmp(role, "developer") == 0 ? json_string("system")
                                                                           : json_incref(x));
            } else if (strcmp(key, "content") == 0) {
                json_t *c = map_content(i, x, err, errlen);
                if (!c)
                    return -1;
                json_object_set_new(o, "content", c);
            } else if (strcmp(key, "name") == 0) {
                /* ignored */
            } else if ((strcmp(key, "tool_calls") == 0 || strcmp(key, "tool_call_id") == 0) &&
                       !json_is_null(x)) {
                json_object_set(o, key, x); /* the socket validates them */
            } else if ((strcmp(key, "tool_calls") == 0 || strcmp(key, "refusal") == 0 ||
                        strcmp(key, "function_call") == 0) &&
                       is_off(x)) {
                /* off */
            } else {
                snprintf(err, errlen, "messages[%zu]: field '%s' is not supported", i, key);
                return -1;
            }
        }
        if (!json_object_get(o, "content") && json_object_get(o, "role") &&
            !json_object_get(o, "tool_calls"))
            json_object_set_new(o, "content", json_string(""));
    }
    return 0;
}

/* Translates an OpenAI body (op OP_CMPL or OP_CHAT) into our request object
 * tagged rid (new reference), or NULL with the reason in err. */
static json_t *map_request(int op, const char *rid, json_t *body, int *include_usage, char *err,
                           size_t errlen)
{
    json_t *out = json_pack("{s:s, s:s}", "op", op == OP_CHAT ? "chat" : "generate", "id", rid);
    const char *key;
    json_t *v;
    json_object_foreach (body, key, v) {
        size_t f = 0, nf = sizeof http_fields / sizeof *http_fields;
        while (f < nf && !((http_fields[f].ops & op) && strcmp(http_fields[f].name, key) == 0))
            f++;
        if (f == nf) {
            snprintf(err, errlen, "unknown field '%s'", key);
            goto fail;
        }
        switch (http_fields[f].kind) {
        case F_COPY:
            if (!json_is_null(v))
                json_object_set(out, http_fields[f].as, v);
            break;
        case F_IGNORE: break;
        case F_OFF:
            if (!is_off(v)) {
                snprintf(err, errlen, "field '%s' is not supported (only its default, off)", key);
                goto fail;
            }
            break;
        case F_ONE:
            if (json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 1))
                break;
            if (json_is_integer(v) && json_integer_value(v) > 1)
                snprintf(err, errlen, "%s > 1 is not supported: one choice per request", key);
            else
                snprintf(err, errlen, "field '%s' must be a positive integer", key);
            goto fail;
        case F_PROMPT:
            if (!json_is_null(v) && map_prompt(out, v, err, errlen))
                goto fail;
            break;
        case F_MESSAGES:
            if (!json_is_null(v) && map_messages(out, v, err, errlen))
                goto fail;
            break;
        case F_STREAM_OPTIONS:
            if (json_is_object(v))
                *include_usage = json_is_true(json_object_get(v, "include_usage"));
            else if (!json_is_null(v)) {
                snprintf(err, errlen, "field 'stream_options' must be an object");
                goto fail;
            }
            break;
        case F_RESPONSE_FORMAT: {
            if (!is_off(v)) /* text, json_object, json_schema: the socket field (PROTOCOL.md) */
                json_object_set(out, "response_format", v);
            break;
        }
        case F_CMPL_LOGPROBS:
            if (json_is_null(v))
                break;
            if (!json_is_integer(v)) {
                snprintf(err, errlen, "field 'logprobs' must be an integer (0 .. %d) or null",
                         PROTO_MAX_TOP_LOGPROBS);
                goto fail;
            }
            json_object_set_new(out, "logprobs", json_true());
            json_object_set(out, "top_logprobs", v); /* the codec checks its range */
            break;
        case F_TOOL_CHOICE: {
            const char *t = json_string_value(v);
            if (!is_off(v) && !(t && strcmp(t, "none") == 0)) {
                snprintf(err, errlen, "field '%s' is not supported (no tools)", key);
                goto fail;
            }
            break;
        }
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* http_request_map for a known op (OP_CMPL or OP_CHAT). */
static int map_body(int op, const char *body, size_t len, const char *rid, char **line,
                    int *include_usage, char *err, size_t errlen)
{
    *line = NULL;
    json_error_t je;
    json_t *root = len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!root) {
        if (len)
            snprintf(err, errlen, "invalid JSON at byte %d: %s", je.position, je.text);
        else
            snprintf(err, errlen, "empty request body");
        return -PROTO_E_BAD_JSON;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        snprintf(err, errlen, "the request body must be a JSON object");
        return -PROTO_E_BAD_REQUEST;
    }
    json_t *mapped = map_request(op, rid, root, include_usage, err, errlen);
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

int http_request_map(const char *path, const char *body, size_t len, const char *rid, char **line,
                     int *include_usage, char *err, size_t errlen)
{
    if (path && strcmp(path, "/v1/completions") == 0)
        return map_body(OP_CMPL, body, len, rid, line, include_usage, err, errlen);
    if (path && strcmp(path, "/v1/chat/completions") == 0)
        return map_body(OP_CHAT, body, len, rid, line, include_usage, err, errlen);
    *line = NULL;
    snprintf(err, errlen, "no such path: %s", path ? path : "");
    return -PROTO_E_BAD_REQUEST;
}

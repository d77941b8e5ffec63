/* proto_answer: the answer lines of the socket protocol: the daemon's encoders (token, done, error, ok, progress) and the clients' parser of them. */
#include "proto.h"
#include "proto_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ encoders */

/* A new object with "id" first. */
static json_t *answer_new(const json_t *id)
{
    json_t *root = json_object();
    if (!root)
        return NULL;
    if (proto_set_new(root, "id", proto_id_new(id))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Adds c's fields to an answer: "index" (and on done "left") when n > 1, "logprobs" when
 * given; -1 on OOM. */
static int choice_add(json_t *root, const proto_choice_t *c, int done)
{
    if (!c)
        return 0;
    if (c->n > 1 && (proto_set_new(root, "index", json_integer(c->index)) ||
                     (done && proto_set_new(root, "left", json_integer(c->left)))))
        return -1;
    if (done && c->tool_calls &&
        (proto_set_new(root, "tool_calls", json_deep_copy(c->tool_calls)) ||
         proto_set_new(root, "finish_reason", json_string("tool_calls"))))
        return -1;
    /* a token's: the calls as written (OpenAI's delta.tool_calls entries) */
    if (!done && c->tool_calls && proto_set_new(root, "tool_calls", json_deep_copy(c->tool_calls)))
        return -1;
    return c->logprobs ? proto_set_new(root, "logprobs", json_deep_copy(c->logprobs)) : 0;
}

char *proto_encode_token(const json_t *id, const char *text, int32_t token, double ts,
                         const proto_choice_t *c)
{
    json_t *root = answer_new(id);
    if (!root || proto_set_new(root, "event", json_string("token")) ||
        proto_set_new(root, "text", proto_str_new(text)) ||
        proto_set_new(root, "token", json_integer(token)) ||
        (ts >= 0 && proto_set_new(root, "ts", json_real(round(ts * 1e6) / 1e6))) ||
        choice_add(root, c, 0)) {
        json_decref(root);
        return NULL;
    }
    return proto_line_finish(root);
}

json_t *proto_logprob_new(int32_t token, const char *piece, size_t n, double logprob)
{
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < n; i++)
        if (json_array_append_new(bytes, json_integer((unsigned char)piece[i]))) {
            json_decref(bytes);
            bytes = NULL;
        }
    char *z = strndup(piece, n); /* a NUL byte ends "text" there; "bytes" has them all */
    json_t *o = json_object();
    if (!o || !z || !bytes || proto_set_new(o, "token", json_integer(token)) ||
        proto_set_new(o, "text", proto_str_new(z))) {
        json_decref(bytes);
        json_decref(o);
        free(z);
        return NULL;
    }
    if (proto_set_new(o, "bytes", bytes) || /* stolen */
        proto_set_new(o, "logprob", json_real(isfinite(logprob) ? logprob : -9999.0))) {
        json_decref(o);
        o = NULL;
    }
    free(z);
    return o;
}

char *proto_encode_done(const json_t *id, const char *text, const char *finish_reason,
                        uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens,
                        const proto_timing_t *t, const proto_choice_t *c)
{
    json_t *root = answer_new(id);
    json_t *usage = json_object();
    json_t *timing = t ? json_object() : NULL;
    int bad = !root || !usage || (t && !timing);
    bad =
        bad || proto_set_new(root, "event", json_string("done")) ||
        proto_set_new(root, "text", proto_str_new(text)) ||
        proto_set_new(root, "finish_reason", proto_str_new(finish_reason ? finish_reason : "stop"));
    bad = bad || proto_set_new(usage, "prompt_tokens", json_integer(prompt_tokens)) ||
          proto_set_new(usage, "completion_tokens", json_integer(completion_tokens)) ||
          (cached_tokens && proto_set_new(usage, "cached_tokens", json_integer(cached_tokens)));
    if (!bad && t)
        bad = proto_set_new(timing, "queue_ms", proto_ms_new(t->queue_ms)) ||
              proto_set_new(timing, "swap_ms", proto_ms_new(t->swap_ms)) ||
              proto_set_new(timing, "ttft_ms", proto_ms_new(t->ttft_ms)) ||
              proto_set_new(timing, "total_ms", proto_ms_new(t->total_ms)) ||
              proto_set_new(timing, "swapped", json_boolean(t->swapped));
    if (bad) {
        json_decref(root);
        json_decref(usage);
        json_decref(timing);
        return NULL;
    }
    int rc = json_object_set_new(root, "usage", usage);
    if (timing)
        rc |= json_object_set_new(root, "timing", timing);
    rc |= choice_add(root, c, 1);
    if (rc) {
        json_decref(root);
        return NULL;
    }
    return proto_line_finish(root);
}

char *proto_encode_error(const json_t *id, proto_err_t code, const char *message,
                         uint32_t retry_after_ms)
{
    const char *c = proto_err_code(code);
    json_t *root = answer_new(id);
    json_t *e = json_object();
    if (!root || !e || proto_set_new(e, "code", json_string(c)) ||
        proto_set_new(e, "message", proto_str_new(message ? message : c)) ||
        (retry_after_ms && proto_set_new(e, "retry_after_ms", json_integer(retry_after_ms))) ||
        proto_set_new(root, "event", json_string("error")) ||
        proto_set_new(root, "ok", json_false())) {
        json_decref(root);
        json_decref(e);
        return NULL;
    }
    if (json_object_set_new(root, "error", e)) {
        json_decref(root);
        return NULL;
    }
    return proto_line_finish(root);
}

char *proto_encode_ok(const json_t *id, json_t *body)
{
    if (body && !json_is_object(body)) {
        json_decref(body);
        return NULL;
    }
    json_t *root = answer_new(id);
    if (!root || proto_set_new(root, "ok", json_true())) {
        json_decref(root);
        json_decref(body);
        return NULL;
    }
    if (body) {
        const char *key;
        json_t *val;
        json_object_foreach (body, key, val) {
            if (strcmp(key, "id") == 0 || strcmp(key, "ok") == 0)
                continue;
            if (json_object_set(root, key, val)) {
                json_decref(root);
                json_decref(body);
                return NULL;
            }
        }
        json_decref(body);
    }
    return proto_line_finish(root);
}

char *proto_encode_progress(const json_t *id, const char *model, uint64_t bytes, uint64_t total)
{
    json_t *root = answer_new(id);
    if (!root || proto_set_new(root, "event", json_string("progress")) ||
        proto_set_new(root, "model", proto_str_new(model)) ||
        proto_set_new(root, "bytes",
                      json_integer((json_int_t)(bytes > INT64_MAX ? INT64_MAX : bytes))) ||
        proto_set_new(root, "total",
                      json_integer((json_int_t)(total > INT64_MAX ? INT64_MAX : total)))) {
        json_decref(root);
        return NULL;
    }
    return proto_line_finish(root);
}

int proto_parse_event(const char *line, size_t len, proto_event_t *ev, char *err, size_t errlen)
{
    memset(ev, 0, sizeof *ev);
    if (err && errlen)
        err[0] = '\0';
    int rc = 0;
    json_t *root = proto_load_line(line, len, 0, &rc, err, errlen);
    if (!root)
        return rc;
    if (!json_is_object(root)) {
        rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "an answer must be a JSON object (got %s)", proto_type_word(root));
        goto fail;
    }
    const json_t *event = json_object_get(root, "event");
    const json_t *ok = json_object_get(root, "ok");
    int kind = 0;
    if (event) {
        const char *e = json_string_value(event);
        if (!e) {
            rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST,
                            "field 'event' must be a string (got %s)", proto_type_word(event));
            goto fail;
        }
        if (strcmp(e, "token") == 0)
            kind = PROTO_EV_TOKEN;
        else if (strcmp(e, "done") == 0)
            kind = PROTO_EV_DONE;
        else if (strcmp(e, "error") == 0)
            kind = PROTO_EV_ERROR;
        else if (strcmp(e, "progress") == 0)
            kind = PROTO_EV_PROGRESS;
        else {
            char q[72];
            proto_quote_short(q, sizeof q, e);
            rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "unknown event %s", q);
            goto fail;
        }
    } else if (json_is_boolean(ok)) {
        kind = json_is_true(ok) ? PROTO_EV_OK : PROTO_EV_ERROR;
    } else {
        rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "answer has neither 'event' nor 'ok'");
        goto fail;
    }

    const char *missing = NULL;
    switch (kind) {
    case PROTO_EV_TOKEN:
        if (!json_is_string(json_object_get(root, "text")))
            missing = "text";
        else if (!json_is_integer(json_object_get(root, "token")))
            missing = "token";
        break;
    case PROTO_EV_DONE:
        if (!json_is_string(json_object_get(root, "text")))
            missing = "text";
        else if (!json_is_string(json_object_get(root, "finish_reason")))
            missing = "finish_reason";
        break;
    case PROTO_EV_ERROR:
        if (!json_is_string(json_object_get(json_object_get(root, "error"), "code")))
            missing = "error.code";
        break;
    case PROTO_EV_PROGRESS:
        if (!json_is_integer(json_object_get(root, "bytes")))
            missing = "bytes";
        else if (!json_is_integer(json_object_get(root, "total")))
            missing = "total";
        break;
    default: break;
    }
    if (missing) {
        rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "%s event without a valid '%s'",
                        kind == PROTO_EV_TOKEN   ? "token"
                        : kind == PROTO_EV_DONE  ? "done"
                        : kind == PROTO_EV_ERROR ? "error"
                                                 : "progress",
                        missing);
        goto fail;
    }
    ev->kind = kind;
    ev->root = root;
    ev->id = json_object_get(root, "id");
    if (json_is_null(ev->id))
        ev->id = NULL;
    return 0;

fail:
    json_decref(root);
    return rc;
}

void proto_event_free(proto_event_t *ev)
{
    if (!ev)
        return;
    json_decref(ev->root);
    memset(ev, 0, sizeof *ev);
}

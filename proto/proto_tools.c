/* proto_tools: the chat op's tool fields (tools, tool_choice, parallel_tool_calls) and the tool parts of messages (role tool, tool_calls, tool_call_id), parsed and encoded (PROTOCOL.md "Tool calls"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tools.h"
#include "proto_int.h"

/* Below proto.c (it calls nothing there): its own message writer and setters. */
__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen, proto_err_t code,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -(int)code;
}

static const char *type_word(const json_t *v)
{
    static const char *const words[] = {"object", "array",   "string",  "integer",
                                        "number", "boolean", "boolean", "null"};
    return v ? words[json_typeof(v)] : "?";
}

/* Sets key in obj to v (stolen); -1 when v is NULL or the set fails. */
static int set_new(json_t *obj, const char *key, json_t *v)
{
    return v ? json_object_set_new(obj, key, v) : -1;
}

#define TOOLS_MAX 64 /* tools in one request */

/* A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-]. */
static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

int proto_parse_tools(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    size_t i;
    const json_t *t;
    if (!json_is_array(v))
        return fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'tools' must be an array (got %s)",
                    type_word(v));
    if (json_array_size(v) > TOOLS_MAX)
        return fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'tools' has %zu entries (max %d)",
                    json_array_size(v), TOOLS_MAX);
    json_array_foreach (v, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *fn = json_object_get(t, "function");
        const json_t *name = json_object_get(fn, "name"), *d = json_object_get(fn, "description");
        const json_t *params = json_object_get(fn, "parameters");
        if (!type || strcmp(type, "function") != 0 || !json_is_object(fn))
            return fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "field 'tools[%zu]' must be {\"type\": \"function\", \"function\": "
                        "{...}}",
                        i);
        if (!name_ok(json_string_value(name)))
            return fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "field 'tools[%zu].function.name' must be 1..64 of a-z, A-Z, 0-9, "
                        "_ and -",
                        i);
        if ((d && !json_is_string(d)) || (params && !json_is_object(params)))
            return fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "field 'tools[%zu].function': description must be a string and "
                        "parameters a JSON schema object",
                        i);
        for (size_t k = 0; k < i; k++)
            if (json_equal(name, json_object_get(json_object_get(json_array_get(v, k), "function"),
                                                 "name")))
                return fail(err, errlen, PROTO_E_BAD_REQUEST,
                            "field 'tools[%zu]': function '%s' is listed twice", i,
                            json_string_value(name));
    }
    if (!(req->tools = json_deep_copy(v)))
        return fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    return 0;
}

int proto_parse_tool_choice(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    static const char *const names[] = {"auto", "none", "required"};
    const char *s = json_string_value(v);
    for (int i = 0; s && i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            req->tool_choice = i; /* CHAT_TOOL_AUTO, _NONE, _REQUIRED */
            req->tool_choice_set = 1;
            return 0;
        }
    const char *type = json_string_value(json_object_get(v, "type"));
    const char *name = json_string_value(json_object_get(json_object_get(v, "function"), "name"));
    if (!type || strcmp(type, "function") != 0 || !name_ok(name))
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "field 'tool_choice' must be auto, none, required or {\"type\": "
                    "\"function\", \"function\": {\"name\": ...}}");
    if (!(req->tool_name = strdup(name)))
        return fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    req->tool_choice = CHAT_TOOL_NAMED;
    req->tool_choice_set = 1;
    return 0;
}

int proto_parse_parallel_tools(const json_t *v, proto_req_t *req, char *err, size_t errlen)
{
    if (!json_is_boolean(v))
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "field 'parallel_tool_calls' must be a boolean (got %s)", type_word(v));
    req->tools_serial = json_is_false(v);
    return 0;
}

void proto_tools_free(proto_req_t *req)
{
    for (size_t i = 0; i < req->n_messages; i++) {
        free(req->messages[i].tool_calls);
        free(req->messages[i].tool_call_id);
    }
    json_decref(req->tools);
    free(req->tool_name);
}

/* The checks across fields, after the whole request is read. */
int proto_tools_check(const proto_req_t *req, char *err, size_t errlen)
{
    if ((req->tool_choice == CHAT_TOOL_REQUIRED || req->tool_choice == CHAT_TOOL_NAMED) &&
        !json_array_size(req->tools))
        return fail(err, errlen, PROTO_E_BAD_REQUEST, "'tool_choice' %s needs 'tools'",
                    req->tool_choice == CHAT_TOOL_NAMED ? "naming a function" : "required");
    if (req->tool_choice == CHAT_TOOL_NAMED) {
        size_t i;
        const json_t *t;
        json_array_foreach (req->tools, i, t)
            if (strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                       req->tool_name) == 0)
                return 0;
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "'tool_choice' names function '%s', which 'tools' does not list",
                    req->tool_name);
    }
    if (json_array_size(req->tools) && req->tool_choice != CHAT_TOOL_NONE &&
        (req->response_format || req->grammar))
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "'tools' cannot go with 'response_format' or 'grammar' (unless "
                    "'tool_choice' is none)");
    return 0;
}

/* A message's tool_calls: an array of {id, type: "function", function: {name, arguments (a
 * string, or an object)}}, kept as compact JSON text. */
static int parse_tool_calls(size_t i, const json_t *v, proto_msg_t *pm, char *err, size_t errlen)
{
    size_t k;
    const json_t *c;
    if (!json_is_array(v))
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "field 'messages[%zu].tool_calls' must be an array (got %s)", i, type_word(v));
    json_array_foreach (v, k, c) {
        const json_t *fn = json_object_get(c, "function");
        const json_t *args = json_object_get(fn, "arguments");
        const json_t *id = json_object_get(c, "id");
        if (!json_is_string(json_object_get(fn, "name")) || (id && !json_is_string(id)) ||
            !(json_is_string(args) || json_is_object(args)))
            return fail(err, errlen, PROTO_E_BAD_REQUEST,
                        "field 'messages[%zu].tool_calls[%zu]' must be {\"id\": ..., "
                        "\"type\": \"function\", \"function\": {\"name\": ..., "
                        "\"arguments\": ...}}",
                        i, k);
    }
    if (!(pm->tool_calls = json_dumps(v, JSON_COMPACT)))
        return fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    return 0;
}

int proto_parse_msg_tools(size_t i, const json_t *m, int role, proto_msg_t *pm, char *err,
                          size_t errlen)
{
    const json_t *calls = json_object_get(m, "tool_calls");
    const json_t *tid = json_object_get(m, "tool_call_id");
    const json_t *content = json_object_get(m, "content");
    if ((calls && role != 2) || (tid && role != 3))
        return fail(err, errlen, PROTO_E_BAD_REQUEST, "field 'messages[%zu].%s' is for %s messages",
                    i, calls && role != 2 ? "tool_calls" : "tool_call_id",
                    calls && role != 2 ? "assistant" : "tool");
    if (role == 3 && !tid) /* as OpenAI: a result answers one call */
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "field 'messages[%zu].tool_call_id' is required in tool messages", i);
    int rc = calls ? parse_tool_calls(i, calls, pm, err, errlen) : 0;
    if (rc)
        return rc;
    if (tid && !(json_is_string(tid) && json_string_length(tid) <= 256))
        return fail(err, errlen, PROTO_E_BAD_REQUEST,
                    "field 'messages[%zu].tool_call_id' must be a string of at most 256 "
                    "bytes",
                    i);
    if (tid && !(pm->tool_call_id = strdup(json_string_value(tid))))
        return fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    if (pm->tool_calls && (!content || json_is_null(content)) && !(pm->content = strdup("")))
        return fail(err, errlen, PROTO_E_INTERNAL, "out of memory");
    return 0;
}

/* Adds the tool fields of req to root (the inverse of the parsing); -1 on OOM. */
int proto_tools_encode(json_t *root, const proto_req_t *req)
{
    static const char *const names[] = {"auto", "none", "required"};
    if (req->tools && set_new(root, "tools", json_deep_copy(req->tools)))
        return -1;
    if (req->tool_choice == CHAT_TOOL_NAMED) {
        if (set_new(root, "tool_choice",
                    json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name",
                              req->tool_name)))
            return -1;
    } else if ((req->tool_choice > 0 || req->tool_choice_set) && req->tool_choice < 3 &&
               set_new(root, "tool_choice", json_string(names[req->tool_choice]))) {
        return -1;
    }
    if (req->tools_serial && set_new(root, "parallel_tool_calls", json_false()))
        return -1;
    return 0;
}

/* Adds a message's tool parts to m; -1 on OOM. */
int proto_tools_encode_msg(json_t *m, const proto_msg_t *pm)
{
    if (pm->tool_calls &&
        set_new(m, "tool_calls", json_loads(pm->tool_calls, JSON_DECODE_ANY, NULL)))
        return -1;
    if (pm->tool_call_id && set_new(m, "tool_call_id", json_string(pm->tool_call_id)))
        return -1;
    return 0;
}

/* http_tools: the OpenAI shapes of tool calls in chat answers: message.tool_calls, and the streamed delta.tool_calls chunks (docs/TOOLS.md). */
#include <stdlib.h>
#include <string.h>

#include "http_int.h"
#include "proto.h"

json_t *http_tools_message(const wk_event_t *ev)
{
    const char *text = ev->text ? ev->text : "";
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          ev->tool_calls && !*text ? json_null() : proto_str_new(text));
    if (m && ev->tool_calls && json_object_set(m, "tool_calls", ev->tool_calls)) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* One chunk whose choice's delta holds tool_calls [call]. */
static json_t *tool_chunk(const http_answer_t *a, uint32_t index, json_t *call /* stolen */)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:[o]}, s:n, s:n}]}", "id", a->rid, "object",
                     "chat.completion.chunk", "created", (json_int_t)a->created, "model",
                     a->model ? a->model : "", "choices", "index", (int)index, "delta",
                     "tool_calls", call, "logprobs", "finish_reason");
}

json_t *http_tool_deltas_of(const http_answer_t *a, const wk_event_t *ev)
{
    json_t *out = json_array();
    size_t k;
    const json_t *d;
    json_array_foreach (ev->tool_calls, k, d) {
        json_array_append_new(out, tool_chunk(a, ev->index, json_deep_copy(d)));
    }
    return out;
}

json_t *http_tool_chunks_of(const http_answer_t *a, const wk_event_t *ev)
{
    json_t *out = json_array();
    size_t k;
    const json_t *c;
    json_array_foreach (ev->tool_calls, k, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        size_t n = args ? strlen(args) : 0;
        json_array_append_new(
            out, tool_chunk(a, ev->index,
                            json_pack("{s:i, s:O, s:s, s:{s:O, s:s}}", "index", (int)k, "id",
                                      json_object_get(c, "id"), "type", "function", "function",
                                      "name", json_object_get(fn, "name"), "arguments", "")));
        for (size_t at = 0; at < n;) {
            size_t len = n - at > 32 ? 32 : n - at;
            while (at + len < n && len > 1 && ((unsigned char)args[at + len] & 0xC0) == 0x80)
                len--;
            json_t *frag = json_stringn(args + at, len);
            json_array_append_new(out, tool_chunk(a, ev->index,
                                                  json_pack("{s:i, s:{s:o}}", "index", (int)k,
                                                            "function", "arguments", frag)));
            at += len;
        }
    }
    return out;
}

/* Unit tests for chat_tools_stream: calls streamed as written (a call opens with its name, its arguments follow in fragments), the content held back, and the end's parse agreeing with what was streamed. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

static json_t *tools_of(void)
{
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"f2\"}}]",
                      0, NULL);
}

/* What a client puts together from the deltas: per index {id, name, arguments}, and how many
 * argument fragments came. */
typedef struct got {
    json_t *calls; /* array by index */
    int frags;
    size_t content; /* the largest content cut seen */
    /* what the end returned: the calls, the content and the count */
    json_t *end_calls;
    char *end;
    int n;
} got_t;

static void got_free(got_t *g)
{
    json_decref(g->end_calls);
    json_decref(g->calls);
    free(g->end);
}

static void take(got_t *g, json_t *deltas)
{
    size_t i;
    json_t *d;
    json_array_foreach (deltas, i, d) {
        size_t k = (size_t)json_integer_value(json_object_get(d, "index"));
        const json_t *fn = json_object_get(d, "function");
        while (json_array_size(g->calls) <= k)
            json_array_append_new(
                g->calls, json_pack("{s:s, s:s, s:s}", "id", "", "name", "", "arguments", ""));
        json_t *c = json_array_get(g->calls, k);
        if (json_object_get(d, "id")) {
            cr_assert_str_eq(json_string_value(json_object_get(c, "id")), "", "opened twice");
            json_object_set(c, "id", json_object_get(d, "id"));
            json_object_set(c, "name", json_object_get(fn, "name"));
            cr_assert_str_eq(json_string_value(json_object_get(d, "type")), "function");
        }
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        if (a && *a) {
            char *cat = NULL;
            cr_assert(
                asprintf(&cat, "%s%s", json_string_value(json_object_get(c, "arguments")), a) > 0);
            json_object_set_new(c, "arguments", json_string(cat));
            free(cat);
            g->frags++;
        }
    }
    json_decref(deltas);
}

/* Feeds text a byte at a time, then ends; returns what was put together (got_free). */
static got_t run(chat_tools_style_t st, const char *text, int forced, int parallel)
{
    json_t *tools = tools_of();
    chat_tools_stream_t *ts = chat_tools_stream_new(st, tools, forced, parallel, "call_x_");
    got_t g = {.calls = json_array()};
    json_t *d;
    for (size_t len = 1; len <= strlen(text); len++) {
        size_t cut = chat_tools_stream_feed(ts, text, len, &d);
        cr_assert(cut <= len);
        if (cut > g.content)
            g.content = cut;
        take(&g, d);
    }
    g.n = chat_tools_stream_end(ts, text, &g.end_calls, &g.end, &d);
    take(&g, d);
    chat_tools_stream_free(ts);
    json_decref(tools);
    return g;
}

static const char *fld(const json_t *call, const char *k)
{
    const json_t *fn = json_object_get(call, "function");
    return json_string_value(json_object_get(strcmp(k, "id") ? fn : call, k));
}

Test(chat_tools_stream, hermes_call_opens_with_its_name_and_its_arguments_grow)
{
    const char *t = "Hi <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                    "\"Z\xC3\xBCrich\", \"n\": 12}}\n</tool_call>";
    got_t g = run(CHAT_TOOLS_HERMES, t, 0, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(g.content, 3, "content stops at the marker");
    cr_assert_str_eq(g.end, "Hi");
    cr_assert_eq(json_array_size(g.calls), 1);
    json_t *c = json_array_get(g.calls, 0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(c, "arguments")),
                     "{\"city\":\"Z\xC3\xBCrich\",\"n\":12}");
    cr_assert_str_eq(fld(json_array_get(g.end_calls, 0), "arguments"),
                     json_string_value(json_object_get(c, "arguments")));
    cr_assert_str_eq(fld(json_array_get(g.end_calls, 0), "id"),
                     json_string_value(json_object_get(c, "id")));
    cr_assert_gt(g.frags, 10, "one fragment a byte, not one at the end: %d", g.frags);
    got_free(&g);
}

Test(chat_tools_stream, a_half_written_call_stays_content_and_its_opened_delta_stands)
{
    const char *t = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Pa";
    got_t g = run(CHAT_TOOLS_HERMES, t, 0, 1);
    cr_assert_eq(g.n, 0, "no call: the text is content");
    cr_assert_null(g.end_calls);
    cr_assert_eq(g.content, 0);
    cr_assert_eq(json_array_size(g.calls), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                     "{\"city\":\"Pa");
    got_free(&g);
}

Test(chat_tools_stream, an_invalid_opened_call_keeps_its_index_and_the_next_follows)
{
    const char *t = "<tool_call>{\"name\":\"f2\",\"arguments\":{\"x\": }}</tool_call> "
                    "<tool_call>{\"name\":\"get_weather\",\"arguments\":{}}</tool_call>";
    got_t g = run(CHAT_TOOLS_HERMES, t, 0, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(json_array_size(g.calls), 2);
    cr_assert_str_eq(fld(json_array_get(g.end_calls, 0), "id"),
                     json_string_value(json_object_get(json_array_get(g.calls, 1), "id")));
    cr_assert_str_eq(g.end, "<tool_call>{\"name\":\"f2\",\"arguments\":{\"x\": }}</tool_call>");
    got_free(&g);
}

Test(chat_tools_stream, arguments_before_the_name_come_whole_at_the_end)
{
    const char *t = "{\"parameters\": {\"a\": [1, 2]}, \"name\": \"f2\"}";
    got_t g = run(CHAT_TOOLS_LLAMA3, t, 0, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(g.content, 0, "held while it may be a call");
    cr_assert_eq(g.frags, 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                     "{\"a\":[1,2]}");
    cr_assert_str_eq(fld(json_array_get(g.end_calls, 0), "id"), "call_x_0");
    got_free(&g);
}

Test(chat_tools_stream, mistral_lists_stream_each_call_with_its_nine_character_id)
{
    const char *t = "ok[TOOL_CALLS] [{\"name\": \"f2\", \"arguments\": {}}, {\"name\": "
                    "\"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"x\"}]";
    got_t g = run(CHAT_TOOLS_MISTRAL, t, 0, 1);
    cr_assert_eq(g.n, 2);
    cr_assert_eq(g.content, 2);
    cr_assert_eq(json_array_size(g.calls), 2);
    for (size_t k = 0; k < 2; k++) {
        const json_t *c = json_array_get(g.calls, k);
        cr_assert_str_eq(fld(json_array_get(g.end_calls, k), "id"),
                         json_string_value(json_object_get(c, "id")));
        cr_assert_eq(strlen(json_string_value(json_object_get(c, "id"))), 9);
        cr_assert_str_eq(fld(json_array_get(g.end_calls, k), "arguments"),
                         json_string_value(json_object_get(c, "arguments")));
    }
    got_free(&g);
}

Test(chat_tools_stream, without_parallel_only_the_first_call_streams)
{
    const char *t = "[TOOL_CALLS][{\"name\": \"f2\", \"arguments\": {}}, {\"name\": \"f2\", "
                    "\"arguments\": {\"b\": 1}}]";
    got_t g = run(CHAT_TOOLS_MISTRAL, t, 0, 0);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(json_array_size(g.calls), 1);
    cr_assert_str_eq(g.end, "[TOOL_CALLS][{\"name\":\"f2\",\"arguments\":{\"b\":1}}]");
    got_free(&g);
}

Test(chat_tools_stream, a_forced_call_streams_and_holds_all_content)
{
    const char *t = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
    got_t g = run(CHAT_TOOLS_GENERIC, t, 1, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(g.content, 0);
    cr_assert_gt(g.frags, 5);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                     "{\"city\":\"Oslo\"}");
    got_free(&g);
}

Test(chat_tools_stream, the_scanner_reads_cut_off_and_whole_values)
{
    int st;
    cr_assert_eq(ct_json_skip("{\"a\": \"}\"}x", 11, 0, &st), 10);
    cr_assert_eq(st, 1);
    ct_json_skip("[1, {\"b\"", 8, 0, &st);
    cr_assert_eq(st, 0);
    cr_assert_eq(ct_json_skip("12,", 3, 0, &st), 2);
    cr_assert_eq(st, 1);
    chat_buf_t b = {0};
    ct_json_compact(&b, "{ \"a b\" : [1, 2] }", 18);
    cr_assert_str_eq(b.p, "{\"a b\":[1,2]}");
    free(b.p);
}

Test(chat_tools_stream, a_marker_after_long_prose_is_found_as_it_arrives)
{
    const char *t =
        "Let me look that up for you, it takes a moment. <tool_call>\n{\"name\": \"f2\", "
        "\"arguments\": {\"q\": \"x\"}}\n</tool_call> done";
    got_t g = run(CHAT_TOOLS_QWEN3, t, 0, 1);
    cr_assert_eq(g.n, 1);
    cr_assert_eq(g.content, strlen("Let me look that up for you, it takes a moment. "));
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(g.calls, 0), "arguments")),
                     "{\"q\":\"x\"}");
    cr_assert_str_eq(g.end, "Let me look that up for you, it takes a moment.  done");
    got_free(&g);
}

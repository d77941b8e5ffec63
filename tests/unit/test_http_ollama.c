/* test_http_ollama: Ollama request bodies mapped onto the socket protocol's lines (http_ollama_map). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "front/http.h"
#include "front/http_int.h"
#include "proto.h"

/* Maps body on route ol; asserts success and that the line is exactly want. */
static http_ol_req_t maps_to(http_ol_t ol, const char *body, const char *want)
{
    char *line = NULL, err[256] = "";
    http_ol_req_t info;
    int rc = http_ollama_map(ol, body, strlen(body), "r1", &line, &info, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", body, err);
    cr_assert_str_eq(line, want);
    free(line);
    return info;
}

/* Maps body; asserts the error code and that the message holds part. */
static void refused(http_ol_t ol, const char *body, int code, const char *part)
{
    char *line = NULL, err[256] = "";
    http_ol_req_t info;
    int rc = http_ollama_map(ol, body, strlen(body), "r1", &line, &info, err, sizeof err);
    cr_assert_eq(rc, -code, "%s: rc %d (%s)", body, rc, err);
    cr_assert_null(line);
    cr_assert(strstr(err, part), "%s: '%s' lacks '%s'", body, err, part);
}

Test(http_ollama, chat_streams_by_default_and_maps_the_messages)
{
    http_ol_req_t i = maps_to(
        HTTP_OL_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{\"op\":\"chat\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    cr_assert_eq(i.stream, 1);
    cr_assert_eq(i.keep_alive, HTTP_KA_NONE);
    cr_assert_eq(i.load, 0);
}

Test(http_ollama, options_map_onto_the_sampling_fields_and_unknown_ones_are_ignored)
{
    maps_to(HTTP_OL_GENERATE,
            "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"stream\":false,\"options\":"
            "{\"num_predict\":5,\"temperature\":0,\"top_k\":3,\"seed\":7,\"stop\":[\"x\"],"
            "\"num_ctx\":4096,\"mirostat\":0,\"no_such_option\":1}}",
            "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"m\",\"stream\":false,\"max_tokens\":5,"
            "\"temperature\":0,\"top_k\":3,\"seed\":7,\"stop\":[\"x\"],\"prompt\":\"p\"}");
}

Test(http_ollama, negative_num_predict_and_seed_leave_the_defaults)
{
    maps_to(HTTP_OL_GENERATE,
            "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"options\":{\"num_predict\":-1,"
            "\"seed\":-1}}",
            "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,\"prompt\":\"p\"}");
}

Test(http_ollama, generate_without_raw_runs_the_chat_template_with_system)
{
    maps_to(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"system\":\"s\"}",
            "{\"op\":\"chat\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,\"messages\":["
            "{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"p\"}]}");
}

Test(http_ollama, format_json_and_a_schema_become_response_format)
{
    maps_to(HTTP_OL_CHAT, "{\"model\":\"m\",\"format\":\"json\",\"messages\":[]}",
            "{\"op\":\"load\",\"id\":\"r1\",\"model\":\"m\"}");
    maps_to(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"format\":\"json\"}",
            "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,"
            "\"response_format\":{\"type\":\"json_object\"},\"prompt\":\"p\"}");
    maps_to(HTTP_OL_GENERATE,
            "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"format\":{\"type\":\"object\"}}",
            "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,"
            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"format\","
            "\"schema\":{\"type\":\"object\"}}},\"prompt\":\"p\"}");
    refused(HTTP_OL_CHAT, "{\"model\":\"m\",\"format\":\"yaml\",\"messages\":[]}",
            PROTO_E_BAD_REQUEST, "format");
}

Test(http_ollama, keep_alive_takes_durations_numbers_and_minus_one)
{
    static const struct {
        const char *ka;
        int64_t ms;
    } cases[] = {{"\"5m\"", 300000}, {"\"1h30m\"", 5400000}, {"\"300ms\"", 300}, {"10", 10000},
                 {"0", 0},           {"\"0\"", 0},           {"-1", -1},         {"\"-1m\"", -1},
                 {"1.5", 1500}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char body[128], *line = NULL, err[256] = "";
        http_ol_req_t info;
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"p\",\"keep_alive\":%s}",
                 cases[k].ka);
        cr_assert_eq(http_ollama_map(HTTP_OL_GENERATE, body, strlen(body), "r1", &line, &info, err,
                                     sizeof err),
                     0, "%s: %s", body, err);
        free(line);
        cr_assert_eq(info.keep_alive, cases[k].ms, "%s: %lld", body, (long long)info.keep_alive);
    }
    refused(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"keep_alive\":\"soon\"}",
            PROTO_E_BAD_REQUEST, "keep_alive");
}

Test(http_ollama, no_prompt_is_a_load_request)
{
    http_ol_req_t i = maps_to(HTTP_OL_GENERATE, "{\"model\":\"m\",\"keep_alive\":0}",
                              "{\"op\":\"load\",\"id\":\"r1\",\"model\":\"m\"}");
    cr_assert_eq(i.load, 1);
    cr_assert_eq(i.keep_alive, 0);
    cr_assert_eq(i.stream, 0);
}

Test(http_ollama, images_template_context_think_and_tools_on_generate_are_refused)
{
    refused(
        HTTP_OL_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}",
        PROTO_E_BAD_REQUEST, "messages[0]: images");
    refused(HTTP_OL_GENERATE,
            "{\"model\":\"m\",\"prompt\":\"p\",\"tools\":[{\"type\":\"function\",\"function\":"
            "{\"name\":\"f\"}}]}",
            PROTO_E_BAD_REQUEST, "'tools' is for /api/chat");
    refused(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"template\":\"{{ .Prompt }}\"}",
            PROTO_E_BAD_REQUEST, "template");
    refused(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"context\":[1,2]}",
            PROTO_E_BAD_REQUEST, "context");
    refused(HTTP_OL_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"think\":true}",
            PROTO_E_BAD_REQUEST, "thinking");
    /* left at their defaults they pass */
    maps_to(HTTP_OL_GENERATE,
            "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true,\"images\":[],\"template\":\"\","
            "\"context\":null,\"think\":false}",
            "{\"op\":\"generate\",\"id\":\"r1\",\"model\":\"m\",\"stream\":true,\"prompt\":\"p\"}");
}

Test(http_ollama, a_body_without_model_or_not_json_is_an_error)
{
    refused(HTTP_OL_CHAT, "{\"messages\":[]}", PROTO_E_BAD_REQUEST, "model");
    refused(HTTP_OL_CHAT, "{", PROTO_E_BAD_JSON, "invalid JSON");
    refused(HTTP_OL_CHAT, "[]", PROTO_E_BAD_REQUEST, "object");
}

/* /api/chat's tools pass through (tool_choice auto); a tool result gets a made-up call id, an
 * assistant's calls ids and their type. */
Test(http_ollama, chat_tools_results_and_calls_map_onto_the_chat_op)
{
    maps_to(
        HTTP_OL_CHAT,
        "{\"model\":\"m\",\"stream\":false,\"tools\":[{\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"x\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
        "\"arguments\":{\"a\":1}}}]},"
        "{\"role\":\"tool\",\"content\":\"42\"}]}",
        "{\"op\":\"chat\",\"id\":\"r1\",\"model\":\"m\",\"stream\":false,\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":"
        "\"\",\"tool_calls\":[{\"id\":\"call_1_0\",\"type\":\"function\",\"function\":{\"name\":"
        "\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":\"42\","
        "\"tool_call_id\":\"call_2\"}]}");
    refused(HTTP_OL_CHAT,
            "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"\","
            "\"tool_calls\":[{\"name\":\"f\"}]}]}",
            PROTO_E_BAD_REQUEST, "'function' must be an object");
}

/* A DONE event's calls: Ollama's shape, the arguments an object. */
Test(http_ollama, a_done_event_carries_its_tool_calls_with_object_arguments)
{
    wk_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = WK_EVENT_DONE;
    ev.text = (char *)"";
    ev.tool_calls = json_loads("[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":"
                               "\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]",
                               0, NULL);
    cr_assert_not_null(ev.tool_calls);
    http_ol_answer_t a = {.ol = HTTP_OL_CHAT, .model = "m", .stream = 0};
    json_t *o = http_ollama_chunk_of(&a, &ev);
    json_t *calls = json_object_get(json_object_get(o, "message"), "tool_calls");
    cr_assert_eq(json_array_size(calls), 1);
    json_t *f = json_object_get(json_array_get(calls, 0), "function");
    cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "f");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(f, "arguments"), "a")), 1);
    json_decref(o);
    json_decref(ev.tool_calls);
}

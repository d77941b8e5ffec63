/* Unit tests for chat_tools: Python-compatible JSON, the Qwen2.5/Hermes rendering, the generic form, the call schema and the parser of tool calls. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

static json_t *tools_of(void)
{
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                      "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                      "\"string\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"f2\"}}]",
                      0, NULL);
}

static void expect_pyjson(const char *in, const char *want)
{
    json_t *v = json_loads(in, JSON_DECODE_ANY, NULL);
    cr_assert_not_null(v, "%s", in);
    char *s = chat_tools_pyjson(v);
    cr_assert_str_eq(s, want);
    free(s);
    json_decref(v);
}

Test(chat_tools, pyjson_writes_as_python_json_dumps)
{
    expect_pyjson("{\"b\":1,\"a\":[true,null,\"x\\n\\u0001\\\"\"]}",
                  "{\"b\": 1, \"a\": [true, null, \"x\\n\\u0001\\\"\"]}");
    expect_pyjson("[1.0, 0.1, 1e-7, 2.5e-07, 1e16, 1e15, 123.456, -0.0001]",
                  "[1.0, 0.1, 1e-07, 2.5e-07, 1e+16, 1000000000000000.0, 123.456, -0.0001]");
    expect_pyjson("\"Z\xC3\xBCrich /\"", "\"Z\xC3\xBCrich /\"");
}

Test(chat_tools, qwen_templates_are_hermes_and_a_textless_llama3_is_pending)
{
    const char *q = "<|im_start|>... # Tools ... <tool_call>";
    cr_assert_eq(chat_tools_detect(CHAT_CHATML, q, strlen(q)), CHAT_TOOLS_HERMES);
    cr_assert_eq(chat_tools_detect(CHAT_CHATML, "<|im_start|>", 12), CHAT_TOOLS_GENERIC);
    cr_assert_eq(chat_tools_detect(CHAT_LLAMA3, NULL, 0), CHAT_TOOLS_PENDING);
    cr_assert_eq(chat_tools_detect(CHAT_CHATML, "<|im_start|><tool_call>", 23), CHAT_TOOLS_PENDING);
}

Test(chat_tools, hermes_renders_calls_and_grouped_results)
{
    chat_msg_t m[4] = {{.role = "user", .content = "q"},
                       {.role = "assistant",
                        .content = "",
                        .tool_calls = "[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":"
                                      "\"f2\",\"arguments\":\"{\\\"x\\\":1}\"}}]"},
                       {.role = "tool", .content = "r1"},
                       {.role = "tool", .content = "r2"}};
    char *out, err[128];
    cr_assert_eq(
        chat_tools_render(CHAT_CHATML, CHAT_TOOLS_HERMES, m, 4, NULL, 0, &out, err, sizeof err),
        CHAT_OK);
    cr_assert_str_eq(out, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                          "helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f2\", \"arguments\": "
                          "{\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
                          "r1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
                          "<|im_start|>assistant\n");
    free(out);
}

Test(chat_tools, generic_lists_tools_in_the_system_message_and_results_as_user_turns)
{
    json_t *tools = tools_of();
    chat_msg_t m[2] = {{.role = "user", .content = "q"}, {.role = "tool", .content = "r"}};
    char *out, err[128];
    cr_assert_eq(
        chat_tools_render(CHAT_CHATML, CHAT_TOOLS_GENERIC, m, 2, tools, 1, &out, err, sizeof err),
        CHAT_OK);
    cr_assert(strstr(out, "<|im_start|>system\nYou can call these functions") == out, "%s", out);
    cr_assert_not_null(strstr(out, "<|im_start|>user\nResult of the function call: r<|im_end|>"));
    cr_assert_null(strstr(out, "<tool_call>"));
    free(out);
    json_decref(tools);
}

Test(chat_tools, parser_takes_valid_blocks_and_leaves_the_rest_as_content)
{
    json_t *tools = tools_of(), *calls;
    char *content;
    const char *text = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\":\"nope\",\"arguments\":{}}"
                       "</tool_call><tool_call>{\"name\":\"f2\",\"arguments\":{}}</tool_call>";
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_HERMES, text, tools, 0, 1, "call_", &calls, &content),
                 2);
    cr_assert_str_eq(content, "Sure.\n<tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>");
    json_t *c0 = json_array_get(calls, 0);
    cr_assert_str_eq(json_string_value(json_object_get(c0, "id")), "call_0");
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")),
        "{\"city\":\"Oslo\"}");
    json_decref(calls);
    free(content);
    /* not parallel: the second valid call stays content */
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_HERMES, text, tools, 0, 0, "c", &calls, &content), 1);
    cr_assert_not_null(strstr(content, "\"f2\""));
    json_decref(calls);
    free(content);
    json_decref(tools);
}

Test(chat_tools, half_written_or_invalid_calls_are_no_calls)
{
    json_t *tools = tools_of(), *calls = NULL;
    char *content = NULL;
    const char *half = "<tool_call>\n{\"name\": \"f2\", \"argu";
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_HERMES, half, tools, 0, 1, "c", &calls, &content), 0);
    cr_assert_null(calls);
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_HERMES, "<tool_call>{bad</tool_call>", tools, 0, 1,
                                  "c", &calls, &content),
                 0);
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_GENERIC, "{\"name\":\"f2\",\"arguments\":{}}", tools,
                                  1, 1, "c", &calls, &content),
                 1);
    cr_assert_str_eq(content, "");
    json_decref(calls);
    free(content);
    json_decref(tools);
}

Test(chat_tools, call_schema_pins_the_named_function_and_its_parameters)
{
    json_t *tools = tools_of();
    json_t *s = chat_tools_call_schema(CHAT_TOOLS_HERMES, tools, "get_weather", 0);
    cr_assert_not_null(s);
    json_t *props =
        json_object_get(json_object_get(json_object_get(s, "json_schema"), "schema"), "properties");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(props, "name"), "const")),
                     "get_weather");
    cr_assert_not_null(json_object_get(json_object_get(props, "arguments"), "properties"));
    json_decref(s);
    cr_assert_null(chat_tools_call_schema(CHAT_TOOLS_HERMES, tools, "missing", 0));
    s = chat_tools_call_schema(CHAT_TOOLS_HERMES, tools, NULL, 0);
    cr_assert_eq(
        json_array_size(json_object_get(
            json_object_get(
                json_object_get(json_object_get(json_object_get(s, "json_schema"), "schema"),
                                "properties"),
                "name"),
            "enum")),
        2);
    json_decref(s);
    /* required with one tool: that tool's name and parameters, as when named */
    json_array_remove(tools, 1);
    s = chat_tools_call_schema(CHAT_TOOLS_HERMES, tools, NULL, 0);
    props =
        json_object_get(json_object_get(json_object_get(s, "json_schema"), "schema"), "properties");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(props, "name"), "const")),
                     "get_weather");
    cr_assert_not_null(json_object_get(json_object_get(props, "arguments"), "properties"));
    json_decref(s);
    json_decref(tools);
}

/* ------------------------------------------------------------------ Llama 3.x */

Test(chat_tools, llama3_templates_are_told_apart_by_their_date)
{
    const char *l31 = "<|start_header_id|> tools_in_user_message Environment: ipython "
                      "<|python_tag|> '\"parameters\": ' date_string = \"26 Jul 2024\"";
    const char *l32 = "<|start_header_id|> tools_in_user_message Environment: ipython "
                      "'\"parameters\": ' strftime_now(\"%d %b %Y\")";
    cr_assert_eq(chat_tools_detect(CHAT_LLAMA3, l31, strlen(l31)), CHAT_TOOLS_LLAMA3);
    cr_assert_eq(chat_tools_detect(CHAT_LLAMA3, l32, strlen(l32)), CHAT_TOOLS_LLAMA32);
    cr_assert_eq(chat_tools_detect(CHAT_LLAMA3, "<|start_header_id|>", 19), CHAT_TOOLS_PENDING);
    cr_assert_str_eq(chat_tools_style_name(CHAT_TOOLS_LLAMA32), "llama3.2");
}

Test(chat_tools, llama3_renders_tools_in_the_first_user_message_and_results_as_ipython)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f2\","
                               "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]",
                               0, NULL);
    chat_msg_t m[4] = {{.role = "system", .content = " s\n"},
                       {.role = "user", .content = "q "},
                       {.role = "assistant",
                        .content = "",
                        .tool_calls = "[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":"
                                      "\"f2\",\"arguments\":\"{\\\"x\\\":[1,2.5]}\"}}]"},
                       {.role = "tool", .content = "r\"1"}};
    char *out, err[128];
    cr_assert_eq(
        chat_tools_render(CHAT_LLAMA3, CHAT_TOOLS_LLAMA3, m, 4, tools, 1, &out, err, sizeof err),
        CHAT_OK);
    cr_assert_str_eq(
        out, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting "
             "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\ns<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
             "respond with a JSON for a function call with its proper arguments that best answers "
             "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
             "dictionary of argument name and its value}.Do not use variables.\n\n{\n    "
             "\"type\": \"function\",\n    \"function\": {\n        \"name\": \"f2\",\n        "
             "\"parameters\": {\n            \"type\": \"object\",\n            \"properties\": "
             "{}\n        }\n    }\n}\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
             "\n\n{\"name\": \"f2\", \"parameters\": {\"x\": [1, 2.5]}}<|eot_id|>"
             "<|start_header_id|>ipython<|end_header_id|>\n\n\"r\\\"1\"<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    json_decref(tools);
}

Test(chat_tools, llama3_refuses_what_its_template_raises_on)
{
    json_t *tools = tools_of();
    chat_msg_t two[2] = {{.role = "user", .content = "q"},
                         {.role = "assistant",
                          .tool_calls = "[{\"function\":{\"name\":\"f2\",\"arguments\":{}}},"
                                        "{\"function\":{\"name\":\"f2\",\"arguments\":{}}}]"}};
    chat_msg_t sys[1] = {{.role = "system", .content = "s"}};
    char *out, err[128];
    cr_assert_eq(
        chat_tools_render(CHAT_LLAMA3, CHAT_TOOLS_LLAMA32, two, 2, tools, 0, &out, err, sizeof err),
        CHAT_ERR_TEMPLATE);
    cr_assert_not_null(strstr(err, "one tool call"));
    cr_assert_eq(
        chat_tools_render(CHAT_LLAMA3, CHAT_TOOLS_LLAMA3, sys, 1, tools, 0, &out, err, sizeof err),
        CHAT_ERR_TEMPLATE);
    json_decref(tools);
}

Test(chat_tools, llama3_output_that_is_one_parameters_object_is_a_call)
{
    json_t *tools = tools_of(), *calls = NULL;
    char *content = NULL;
    const char *call = " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n";
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_LLAMA3, call, tools, 0, 1, "c", &calls, &content), 1);
    cr_assert_str_eq(content, "");
    const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Oslo\"}");
    json_decref(calls);
    free(content);
    calls = NULL;
    content = NULL;
    const char *no[] = {"It is sunny. {\"name\": \"f2\", \"parameters\": {}}",
                        "{\"name\": \"nope\", \"parameters\": {}}",
                        "{\"name\": \"f2\", \"arguments\": {}}", "{\"name\": \"f2\", \"param"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        cr_assert_eq(
            chat_tools_parse(CHAT_TOOLS_LLAMA32, no[i], tools, 0, 1, "c", &calls, &content), 0,
            "%s", no[i]);
        cr_assert_null(calls);
    }
    json_decref(tools);
}

Test(chat_tools, llama3_call_schema_names_parameters)
{
    json_t *tools = tools_of();
    json_t *s = chat_tools_call_schema(CHAT_TOOLS_LLAMA3, tools, "get_weather", 0);
    json_t *schema = json_object_get(json_object_get(s, "json_schema"), "schema");
    cr_assert_not_null(json_object_get(
        json_object_get(json_object_get(schema, "properties"), "parameters"), "properties"));
    cr_assert_null(json_object_get(json_object_get(schema, "properties"), "arguments"));
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(schema, "required"), 1)),
                     "parameters");
    json_decref(s);
    json_decref(tools);
}

/* ------------------------------------------------------------------ Qwen3, Hermes 2, Mistral, Phi-4 */

Test(chat_tools, the_newer_families_are_told_apart_by_their_template_text)
{
    const char *q3 = "<|im_start|> # Tools <tool_call> reasoning_content";
    const char *h2 = "<|im_start|> function calling AI model json_to_python_type <tool_call>";
    const char *nemo = "[AVAILABLE_TOOLS] [TOOL_RESULTS] {{- \"[INST]\" + message[\"content\"]";
    const char *v3 = "[AVAILABLE_TOOLS] [TOOL_RESULTS] {{- \"[INST] \" + message[\"content\"]";
    const char *phi = "<|tool|> message['tools'] <|/tool|> <|assistant|>";
    cr_assert_eq(chat_tools_detect(CHAT_CHATML, q3, strlen(q3)), CHAT_TOOLS_QWEN3);
    cr_assert_eq(chat_tools_detect(CHAT_CHATML, h2, strlen(h2)), CHAT_TOOLS_HERMES2);
    cr_assert_eq(chat_tools_detect(CHAT_MISTRAL_V3_TEKKEN, nemo, strlen(nemo)), CHAT_TOOLS_MISTRAL);
    cr_assert_eq(chat_tools_detect(CHAT_MISTRAL_V3, v3, strlen(v3)), CHAT_TOOLS_PENDING);
    const char *v3full = "{{- \"[AVAILABLE_TOOLS] [\" }} '[TOOL_RESULTS] {\"content\": ' "
                         "{{- \"[INST] \" + message[\"content\"] {{- \"[TOOL_CALLS] [\" }} "
                         "{{- \" \" + message[\"content\"]|trim + eos_token}}";
    cr_assert_eq(chat_tools_detect(CHAT_MISTRAL_V3, v3full, strlen(v3full)), CHAT_TOOLS_MISTRAL3);
    cr_assert_str_eq(chat_tools_marker(CHAT_TOOLS_MISTRAL3), "[TOOL_CALLS]");
    cr_assert(chat_tools_listed(CHAT_TOOLS_MISTRAL3));
    cr_assert_eq(chat_tools_detect(CHAT_PHI4, phi, strlen(phi)), CHAT_TOOLS_PHI4);
    cr_assert_str_eq(chat_tools_marker(CHAT_TOOLS_QWEN3), "<tool_call>");
    cr_assert_str_eq(chat_tools_marker(CHAT_TOOLS_MISTRAL), "[TOOL_CALLS]");
    cr_assert_str_eq(chat_tools_marker(CHAT_TOOLS_PHI4), "<|tool_call|>");
    cr_assert_null(chat_tools_marker(CHAT_TOOLS_LLAMA3));
    cr_assert(chat_tools_listed(CHAT_TOOLS_MISTRAL) && !chat_tools_listed(CHAT_TOOLS_HERMES2));
}

Test(chat_tools, listed_calls_are_parsed_after_the_marker_with_mistral_ids)
{
    json_t *tools = tools_of(), *calls;
    char *content;
    const char *text = "Let me see. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Oslo\"}}, {\"name\": \"f2\", \"arguments\": {}}] after";
    cr_assert_eq(
        chat_tools_parse(CHAT_TOOLS_MISTRAL, text, tools, 0, 1, "call_1_", &calls, &content), 2);
    cr_assert_str_eq(content, "Let me see.  after");
    const char *id = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
    cr_assert_eq(strlen(id), 9);
    cr_assert_eq(strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"), 9);
    cr_assert_str_neq(id, json_string_value(json_object_get(json_array_get(calls, 1), "id")));
    json_decref(calls);
    free(content);
    /* not parallel: the first is the call, the others stay content as written */
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_MISTRAL, text, tools, 0, 0, "c", &calls, &content), 1);
    cr_assert_str_eq(content, "Let me see. [TOOL_CALLS][{\"name\":\"f2\",\"arguments\":{}}] after");
    json_decref(calls);
    free(content);
    /* Phi-4-mini: the closing tag is taken with the list */
    const char *phi = "<|tool_call|>[{\"name\": \"f2\", \"arguments\": {\"a\": 1}}]<|/tool_call|>";
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_PHI4, phi, tools, 0, 1, "c", &calls, &content), 1);
    cr_assert_str_eq(content, "");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "c0");
    json_decref(calls);
    free(content);
    /* forced: the whole text is the list */
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_PHI4, "[{\"name\":\"f2\",\"arguments\":{}}]", tools, 1,
                                  0, "c", &calls, &content),
                 1);
    json_decref(calls);
    free(content);
    json_decref(tools);
}

Test(chat_tools, a_list_with_any_bad_call_or_half_written_is_content)
{
    json_t *tools = tools_of(), *calls = NULL;
    char *content = NULL;
    const char *bad[] = {"[TOOL_CALLS][{\"name\": \"f2\", \"arguments\": {}}, {\"name\": \"nope\", "
                         "\"arguments\": {}}]",
                         "[TOOL_CALLS][{\"name\": \"f2\", \"argu", "[TOOL_CALLS][]",
                         "[TOOL_CALLS]{\"name\": \"f2\", \"arguments\": {}}",
                         "[TOOL_CALLS][{\"name\": \"f2\", \"arguments\": \"{}\"}]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(
            chat_tools_parse(CHAT_TOOLS_MISTRAL, bad[i], tools, 0, 1, "c", &calls, &content), 0,
            "%s", bad[i]);
        cr_assert_null(calls);
        cr_assert_null(content);
    }
    json_decref(tools);
}

Test(chat_tools, the_list_families_force_one_call_as_a_list)
{
    json_t *tools = tools_of();
    json_t *s = chat_tools_call_schema(CHAT_TOOLS_MISTRAL, tools, "f2", 0);
    json_t *schema = json_object_get(json_object_get(s, "json_schema"), "schema");
    cr_assert_str_eq(json_string_value(json_object_get(schema, "type")), "array");
    cr_assert_eq(json_integer_value(json_object_get(schema, "minItems")), 1);
    cr_assert_eq(json_integer_value(json_object_get(schema, "maxItems")), 1);
    cr_assert_str_eq(
        json_string_value(json_object_get(
            json_object_get(json_object_get(json_object_get(schema, "items"), "properties"),
                            "name"),
            "const")),
        "f2");
    json_decref(s);
    json_decref(tools);
}

Test(chat_tools, mistral_ids_are_nine_letters_and_digits_and_stable)
{
    char a[10], b[10], c[10];
    ct_mistral_id("call_1_", 0, a);
    ct_mistral_id("call_1_", 0, b);
    ct_mistral_id("call_1_", 1, c);
    cr_assert_str_eq(a, b);
    cr_assert_str_neq(a, c);
    cr_assert_eq(strlen(a), 9);
}

/* The calls each family's renderer writes for an assistant message, cut out of the prompt (from
 * the marker to the turn's end) and parsed back: the same calls, in order. */
Test(chat_tools, every_family_parses_back_the_parallel_calls_it_renders)
{
    static const struct {
        chat_tools_style_t st;
        const char *end;
    } fam[] = {{CHAT_TOOLS_HERMES, "<|im_end|>"},
               {CHAT_TOOLS_QWEN3, "<|im_end|>"},
               {CHAT_TOOLS_HERMES2, "<|im_end|>"},
               {CHAT_TOOLS_MISTRAL, "</s>"},
               {CHAT_TOOLS_PHI4, "<|end|>"}};
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"f2\",\"description\":\"e\"}}]",
        0, NULL);
    chat_msg_t m[2] = {{.role = "user", .content = "QQQ"},
                       {.role = "assistant",
                        .content = "",
                        .tool_calls = "[{\"id\":\"abcdefgh1\",\"type\":\"function\",\"function\":"
                                      "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
                                      "\\\"Z\\u00fcrich \\\\\\\"x\\\\\\\"\\\"}\"}},{\"id\":"
                                      "\"abcdefgh2\",\"type\":\"function\",\"function\":{\"name\":"
                                      "\"f2\",\"arguments\":\"{\\\"n\\\":[1,2.5,null]}\"}}]"}};
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        char *out, err[256], *content;
        json_t *calls;
        cr_assert_eq(
            chat_tools_render(CHAT_CHATML, fam[f].st, m, 2, tools, 0, &out, err, sizeof err),
            CHAT_OK, "%s: %s", chat_tools_style_name(fam[f].st), err);
        char *at =
            strstr(strstr(out, "QQQ"), chat_tools_marker(fam[f].st)); /* after the user turn */
        cr_assert_not_null(at, "%s: %s", chat_tools_style_name(fam[f].st), out);
        char *end = strstr(at, fam[f].end);
        cr_assert_not_null(end);
        *end = '\0';
        cr_assert_eq(chat_tools_parse(fam[f].st, at, tools, 0, 1, "c", &calls, &content), 2,
                     "%s: %s", chat_tools_style_name(fam[f].st), at);
        cr_assert_str_eq(content, "");
        json_t *f0 = json_object_get(json_array_get(calls, 0), "function");
        json_t *f1 = json_object_get(json_array_get(calls, 1), "function");
        cr_assert_str_eq(json_string_value(json_object_get(f0, "name")), "get_weather");
        cr_assert_str_eq(json_string_value(json_object_get(f0, "arguments")),
                         "{\"city\":\"Z\xC3\xBCrich \\\"x\\\"\"}");
        cr_assert_str_eq(json_string_value(json_object_get(f1, "name")), "f2");
        cr_assert_str_eq(json_string_value(json_object_get(f1, "arguments")),
                         "{\"n\":[1,2.5,null]}");
        json_decref(calls);
        free(content);
        free(out);
    }
    json_decref(tools);
}

/* required with parallel calls: the list families take one or more calls */
Test(chat_tools, required_with_parallel_calls_lists_one_or_more)
{
    json_t *tools = tools_of();
    json_t *s = chat_tools_call_schema(CHAT_TOOLS_PHI4, tools, NULL, 1);
    json_t *schema = json_object_get(json_object_get(s, "json_schema"), "schema");
    cr_assert_eq(json_integer_value(json_object_get(schema, "minItems")), 1);
    cr_assert_null(json_object_get(schema, "maxItems"));
    json_decref(s);
    json_decref(tools);
}

/* Llama 3.1's built-in tools: brave_search, wolfram_alpha, code_interpreter. */
static json_t *builtin_tools_of(void)
{
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"brave_search\"}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"code_interpreter\"}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]",
                      0, NULL);
}

static void expect_builtin(chat_tools_style_t st, const char *text, const char *name,
                           const char *args)
{
    json_t *tools = builtin_tools_of(), *calls;
    char *content;
    int n = chat_tools_parse(st, text, tools, 0, 1, "c_", &calls, &content);
    if (!name) {
        cr_assert_eq(n, 0, "%s", text);
    } else {
        cr_assert_eq(n, 1, "%s", text);
        const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        cr_assert_str_eq(json_string_value(json_object_get(fn, "name")), name);
        cr_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), args);
        cr_assert_str_eq(content, "");
        json_decref(calls);
        free(content);
    }
    json_decref(tools);
}

Test(chat_tools, llama31_builtin_calls_parse_into_json_arguments)
{
    expect_builtin(CHAT_TOOLS_LLAMA3, "<|python_tag|>brave_search.call(query=\"Euro \\\"24\\\"\")",
                   "brave_search", "{\"query\":\"Euro \\\"24\\\"\"}");
    expect_builtin(CHAT_TOOLS_LLAMA3, " brave_search.call(query='a', count=\"3\") \n",
                   "brave_search", "{\"query\":\"a\",\"count\":\"3\"}");
    expect_builtin(CHAT_TOOLS_LLAMA3, "<|python_tag|>import math\nprint(math.pi)\n",
                   "code_interpreter", "{\"code\":\"import math\\nprint(math.pi)\"}");
    expect_builtin(
        CHAT_TOOLS_LLAMA3,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        "get_weather", "{\"city\":\"Oslo\"}");
    expect_builtin(CHAT_TOOLS_LLAMA3, "brave_search.call(query=\"a\") and more", NULL, NULL);
    expect_builtin(CHAT_TOOLS_LLAMA3, "brave_search.call(query=3)", NULL, NULL);
    expect_builtin(CHAT_TOOLS_LLAMA3, "wolfram_alpha.call(query=\"x\")", NULL,
                   NULL);                                      /* not listed */
    expect_builtin(CHAT_TOOLS_LLAMA3, "print(1)", NULL, NULL); /* code needs the tag */
    expect_builtin(CHAT_TOOLS_LLAMA32, "<|python_tag|>brave_search.call(query=\"a\")", NULL, NULL);
}

Test(chat_tools, llama31_stream_holds_what_may_become_a_builtin_call)
{
    json_t *tools = builtin_tools_of(), *d;
    chat_tools_stream_t *ts = chat_tools_stream_new(CHAT_TOOLS_LLAMA3, tools, 0, 1, "c_");
    cr_assert_eq(chat_tools_stream_feed(ts, "<|pyth", 6, &d), 0);
    cr_assert_eq(chat_tools_stream_feed(ts, " brave_sea", 10, &d), 0);
    cr_assert_eq(chat_tools_stream_feed(ts, "brave_search.call(query=", 24, &d), 0);
    cr_assert_eq(chat_tools_stream_feed(ts, "brave new", 9, &d), 9);
    cr_assert_null(d);
    chat_tools_stream_free(ts);
    ts = chat_tools_stream_new(CHAT_TOOLS_LLAMA32, tools, 0, 1, "c_");
    cr_assert_eq(chat_tools_stream_feed(ts, "<|pyth", 6, &d), 6, "3.2 has no built-in tools");
    chat_tools_stream_free(ts);
    json_decref(tools);
}

Test(chat_tools, mistral_v3_spaces_its_tags_and_trims_answers)
{
    chat_msg_t m[3] = {{.role = "user", .content = "q"},
                       {.role = "assistant", .content = "  a \n"},
                       {.role = "user", .content = "r"}};
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    char *out, err[128];
    cr_assert_eq(chat_tools_render(CHAT_MISTRAL_V3, CHAT_TOOLS_MISTRAL3, m, 3, tools, 1, &out, err,
                                   sizeof err),
                 CHAT_OK);
    cr_assert_str_eq(out, "[INST] q[/INST] a</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", "
                          "\"function\": {\"name\": \"f\"}}][/AVAILABLE_TOOLS][INST] r[/INST]"
                          "[TOOL_CALLS]");
    free(out);
    json_decref(tools);
}

/* Unit tests for required with parallel calls in the <tool_call> styles (one or more blocks,
 * enforced by cons_new_repeat over a real 32,000-token vocabulary, and parsed back) and for the
 * call markers a vocabulary may hold as control tokens (chat_tools_is_marker). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tools.h"
#include "engine/constrain.h"
#include "testutil.h"

static json_t *tools_of(void)
{
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                      "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
                      "\"string\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"f2\"}}]",
                      0, NULL);
}

#define CALL1 "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
#define CALL2 "{\"name\": \"f2\", \"arguments\": {}}"
#define TWO CALL1 "\n</tool_call>\n<tool_call>\n" CALL2 "\n</tool_call>"

/* A matcher of required's blocks for tools_of() (the worker's: the prompt opened the first). */
static cons_t *blocks_new(void)
{
    char err[256] = "";
    json_t *tools = tools_of();
    json_t *rf = chat_tools_call_schema(CHAT_TOOLS_HERMES, tools, NULL, 1);
    cons_schema_t *sc = cons_schema_compile(rf, NULL, err, sizeof err);
    cr_assert_not_null(sc, "%s", err);
    cons_t *c = cons_new_repeat(sc, tu_vocab_trie, "\n</tool_call>", "\n<tool_call>\n");
    cr_assert_not_null(c);
    cons_schema_unref(sc);
    json_decref(rf);
    json_decref(tools);
    return c;
}

/* Whether text is accepted whole, and complete after it. */
static int blocks_take(const char *text, int *complete)
{
    cons_t *c = blocks_new();
    int ok = cons_accept_bytes(c, text, strlen(text)) == 0;
    *complete = ok && cons_complete(c);
    cons_free(c);
    return ok;
}

static int mask_has(cons_t *c, int32_t id)
{
    const uint32_t *bits = cons_mask(c, NULL);
    return (int)(bits[id >> 5] >> (id & 31) & 1u);
}

Test(chat_tools, required_blocks_admit_one_or_two_calls_and_end_only_after_a_block,
     .init = tu_vocab_setup, .fini = tu_vocab_teardown)
{
    int done;
    cr_assert(blocks_take(CALL1 "\n</tool_call>", &done) && done);
    cr_assert(blocks_take(TWO, &done) && done);
    cr_assert(blocks_take(TWO "\n<tool_call>\n" CALL1 "\n</tool_call>", &done) && done);
    /* on the way: not complete (no end of generation) */
    cr_assert(blocks_take(CALL1, &done) && !done);
    cr_assert(blocks_take(CALL1 "\n</tool_call>\n<tool_call>\n", &done) && !done);
    cr_assert(blocks_take(CALL1 "\n</tool_call>\n<tool_call>\n{\"name\": \"f2\"", &done) && !done);
    cons_t *c = blocks_new();
    int32_t eos = tok_eos(tu_vocab_tok);
    cr_assert_eq(cons_accept(c, eos), -1, "an end before the first call");
    cr_assert_eq(cons_accept_bytes(c, CALL1 "\n</tool_call>", strlen(CALL1) + 13), 0);
    cr_assert(mask_has(c, eos));
    cr_assert_eq(cons_accept(c, eos), 0);
    cons_free(c);
}

Test(chat_tools, required_blocks_refuse_malformed_calls, .init = tu_vocab_setup,
     .fini = tu_vocab_teardown)
{
    int done;
    const char *bad[] = {
        CALL1 "</tool_call>",                                          /* no newline */
        CALL1 "\n</tool_call>x",                                       /* text after a block */
        CALL1 "\n</tool_call>\n\n<tool_call>\n" CALL2,                 /* a blank line */
        CALL1 "\n</tool_call>\n<tool_call>\n{\"name\": \"nope\"",      /* an unknown function */
        CALL1 "\n</tool_call>\n<tool_call>\n{\"name\": \"f2\", \"x\"", /* another key */
        CALL1 "\n<tool_call>\n" CALL2,                                 /* a block not closed */
        "\n</tool_call>",                                              /* no call */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(!blocks_take(bad[i], &done), "accepted %s", bad[i]);
}

Test(chat_tools, required_blocks_offer_the_tags_tokens_and_allowed_control_tokens_only_there,
     .init = tu_vocab_setup, .fini = tu_vocab_teardown)
{
    /* <s> (1) stands for a vocabulary whose </tool_call> is a control token */
    int32_t ids[1] = {1}, nl = tok_find(tu_vocab_tok, "<0x0A>");
    const char *texts[1] = {"</tool_call>"};
    cons_t *c = blocks_new();
    cr_assert_eq(cons_allow_tokens(c, ids, texts, 1), 0);
    cr_assert(!mask_has(c, 1) && !mask_has(c, nl));
    cr_assert_eq(cons_accept(c, 1), -1, "the marker before the call");
    cr_assert_eq(cons_accept_bytes(c, CALL1, strlen(CALL1)), 0);
    cr_assert(mask_has(c, nl), "the newline token %d", nl);
    cr_assert(!mask_has(c, 1));
    cr_assert_eq(cons_accept(c, nl), 0);
    cr_assert(mask_has(c, 1) && !cons_complete(c));
    cr_assert_eq(cons_accept(c, 1), 0);
    cr_assert(cons_complete(c));
    cr_assert_eq(cons_accept(c, 1), -1, "the marker twice");
    cr_assert_eq(cons_accept_bytes(c, "\n<tool_call>\n" CALL2, strlen(CALL2) + 13), 0);
    cr_assert(!cons_complete(c) && !mask_has(c, 1));
    cons_free(c);
}

Test(chat_tools, required_blocks_parse_back_as_two_calls_streamed_and_not)
{
    json_t *tools = tools_of(), *calls, *deltas = NULL;
    char *content;
    int n = chat_tools_parse(CHAT_TOOLS_HERMES, TWO, tools, 1, 1, "c_", &calls, &content);
    cr_assert_eq(n, 2);
    const json_t *f0 = json_object_get(json_array_get(calls, 0), "function");
    const json_t *f1 = json_object_get(json_array_get(calls, 1), "function");
    cr_assert_str_eq(json_string_value(json_object_get(f0, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(f0, "arguments")), "{\"city\":\"Paris\"}");
    cr_assert_str_eq(json_string_value(json_object_get(f1, "name")), "f2");
    cr_assert_str_eq(content, "");
    json_decref(calls);
    free(content);
    /* a second call cut short: the first is the call, the rest content */
    const char *cut = CALL1 "\n</tool_call>\n<tool_call>\n{\"name\": \"f2\", \"argu";
    cr_assert_eq(chat_tools_parse(CHAT_TOOLS_HERMES, cut, tools, 1, 1, "c_", &calls, &content), 1);
    cr_assert(strstr(content, "{\"name\": \"f2\", \"argu") != NULL, "%s", content);
    json_decref(calls);
    free(content);
    /* streamed: both calls open as they are written, and nothing is content */
    chat_tools_stream_t *ts = chat_tools_stream_new(CHAT_TOOLS_HERMES, tools, 1, 1, "c_");
    size_t opened = 0, len = strlen(TWO);
    for (size_t i = 1; i <= len; i++) {
        cr_assert_eq(chat_tools_stream_feed(ts, TWO, i, &deltas), 0);
        for (size_t k = 0; k < json_array_size(deltas); k++)
            opened += json_object_get(json_array_get(deltas, k), "id") != NULL;
        json_decref(deltas);
    }
    cr_assert_eq(opened, 2);
    cr_assert_eq(chat_tools_stream_end(ts, TWO, &calls, &content, &deltas), 2);
    cr_assert_null(deltas, "both calls were streamed whole");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(calls, 1), "id")), "c_1");
    json_decref(calls);
    free(content);
    chat_tools_stream_free(ts);
    json_decref(tools);
}

Test(chat_tools, markers_are_each_styles_call_tags)
{
    static const struct {
        chat_tools_style_t st;
        const char *text;
        int want;
    } cases[] = {
        {CHAT_TOOLS_HERMES, "<tool_call>", 1},     {CHAT_TOOLS_QWEN3, "</tool_call>", 1},
        {CHAT_TOOLS_HERMES2, "<tool_call>", 1},    {CHAT_TOOLS_HERMES, "[TOOL_CALLS]", 0},
        {CHAT_TOOLS_MISTRAL, "[TOOL_CALLS]", 1},   {CHAT_TOOLS_MISTRAL3, "[TOOL_CALLS]", 1},
        {CHAT_TOOLS_MISTRAL, "</tool_call>", 0},   {CHAT_TOOLS_PHI4, "<|tool_call|>", 1},
        {CHAT_TOOLS_PHI4, "<|/tool_call|>", 1},    {CHAT_TOOLS_LLAMA3, "<|python_tag|>", 1},
        {CHAT_TOOLS_LLAMA32, "<|python_tag|>", 0}, {CHAT_TOOLS_GENERIC, "<tool_call>", 0},
        {CHAT_TOOLS_HERMES, "<|im_end|>", 0},      {CHAT_TOOLS_HERMES, "<tool_call", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_assert_eq(chat_tools_is_marker(cases[i].st, cases[i].text, strlen(cases[i].text)),
                     cases[i].want, "%s %s", chat_tools_style_name(cases[i].st), cases[i].text);
}

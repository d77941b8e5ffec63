/* test_http: the OpenAI encoders: a worker event (wk_event.h) becomes a streamed chunk or a whole completion from its typed fields. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "front/http.h"
#include "worker/wk_event.h"

static const http_answer_t cmpl = {.rid = "cmpl-1", .model = "tiny", .created = 1700000000};
static const http_answer_t chat = {
    .rid = "chatcmpl-1", .model = "tiny", .created = 1700000000, .chat = 1};

/* Asserts that j dumps (compact, keys in order) to exactly want; frees j. */
static void json_is(json_t *j, const char *want)
{
    cr_assert_not_null(j);
    char *got = json_dumps(j, JSON_COMPACT);
    cr_assert_str_eq(got, want);
    free(got);
    json_decref(j);
}

static wk_event_t done_of(proto_finish_t f)
{
    return (wk_event_t){.kind = WK_EVENT_DONE,
                        .id = json_string("cmpl-1"),
                        .text = strdup(" there was"),
                        .finish = f,
                        .prompt_tokens = 5,
                        .completion_tokens = 3,
                        .timing = {.total_ms = 10}};
}

Test(http, a_token_event_is_a_text_completion_chunk)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN, .text = strdup(" there"), .token = 727, .ts = 1};
    json_is(http_chunk_of(&cmpl, &ev, 0),
            "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"logprobs\":null,\"text\":\" there\","
            "\"finish_reason\":null}]}");
    wk_event_clear(&ev);
}

Test(http, a_chat_token_event_is_a_delta_chunk)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN, .text = strdup("hi"), .token = 1, .ts = -1};
    json_is(http_chunk_of(&chat, &ev, 0),
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"logprobs\":null,"
            "\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}");
    wk_event_clear(&ev);
}

Test(http, a_done_event_streams_openais_finish_reason)
{
    static const char *const want[PROTO_FINISH_COUNT] = {
        [PROTO_FINISH_STOP] = "stop",
        [PROTO_FINISH_EOS] = "stop",
        [PROTO_FINISH_LENGTH] = "length",
        [PROTO_FINISH_CANCELLED] = "stop",
    };
    for (int f = 0; f < PROTO_FINISH_COUNT; f++) {
        wk_event_t ev = done_of((proto_finish_t)f);
        json_t *c = http_chunk_of(&chat, &ev, 0);
        json_t *choice = json_array_get(json_object_get(c, "choices"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), want[f]);
        cr_assert_eq(json_object_size(json_object_get(choice, "delta")), 0,
                     "the last chunk carries no text");
        json_decref(c);
        wk_event_clear(&ev);
    }
    wk_event_t ev = done_of(PROTO_FINISH_LENGTH);
    json_is(http_chunk_of(&cmpl, &ev, 0),
            "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"logprobs\":null,\"text\":\"\","
            "\"finish_reason\":\"length\"}]}");
    wk_event_clear(&ev);
}

Test(http, a_done_event_gives_the_usage_chunk)
{
    wk_event_t ev = done_of(PROTO_FINISH_EOS);
    json_is(
        http_chunk_of(&chat, &ev, 1),
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    wk_event_clear(&ev);
}

Test(http, a_done_event_without_stream_is_the_whole_completion)
{
    wk_event_t ev = done_of(PROTO_FINISH_STOP);
    json_is(http_completion_of(&chat, &ev, NULL),
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
            "\"content\":\" there was\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,"
            "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    json_is(http_completion_of(&cmpl, &ev, NULL),
            "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\" there was\","
            "\"logprobs\":null,\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,"
            "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(ev.text); /* no text made */
    ev.text = NULL;
    json_t *c = http_completion_of(&cmpl, &ev, NULL);
    cr_assert_str_eq(json_string_value(
                         json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text")),
                     "");
    json_decref(c);
    wk_event_clear(&ev);
}

Test(http, bad_utf8_in_event_text_becomes_replacement_characters)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN,
                     .text = strdup("a\xc0"
                                    "b"),
                     .token = 1,
                     .ts = -1};
    json_t *c = http_chunk_of(&cmpl, &ev, 0);
    cr_assert_not_null(c, "text that is not UTF-8 still makes a chunk");
    cr_assert_str_eq(json_string_value(
                         json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text")),
                     "a\xef\xbf\xbd"
                     "b");
    json_decref(c);
    wk_event_clear(&ev);
}

Test(http, events_that_are_not_generation_give_no_chunk)
{
    wk_event_t ev = {.kind = WK_EVENT_ERROR, .code = PROTO_E_INTERNAL};
    cr_assert_null(http_chunk_of(&cmpl, &ev, 0));
    cr_assert_null(http_completion_of(&cmpl, &ev, NULL));
    ev.kind = WK_EVENT_TOKEN;
    cr_assert_null(http_completion_of(&cmpl, &ev, NULL), "a token is no whole answer");
    ev.kind = WK_EVENT_RESULT;
    cr_assert_null(http_chunk_of(&cmpl, &ev, 1));
}

/* ------------------------------------------------------------------ logprobs, n */

/* Our entry for token id with text t and logprob lp, with one alternative. */
static json_t *entry(int id, const char *t, double lp)
{
    json_t *e = proto_logprob_new(id, t, strlen(t), lp);
    json_object_set_new(e, "top_logprobs",
                        json_pack("[o]", proto_logprob_new(id, t, strlen(t), lp)));
    return e;
}

Test(http, chat_logprobs_take_openais_content_shape)
{
    wk_event_t ev = done_of(PROTO_FINISH_STOP);
    ev.logprobs = json_pack("[o]", entry(9, "hi", -0.25));
    json_t *c = http_completion_of(&chat, &ev, NULL);
    json_t *lp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
    char *got = json_dumps(lp, JSON_COMPACT);
    cr_assert_str_eq(got, "{\"content\":[{\"token\":\"hi\",\"logprob\":-0.25,\"bytes\":[104,105],"
                          "\"top_logprobs\":[{\"token\":\"hi\",\"logprob\":-0.25,"
                          "\"bytes\":[104,105]}]}],\"refusal\":null}");
    free(got);
    json_decref(c);
    wk_event_clear(&ev);
}

Test(http, completion_logprobs_take_the_legacy_shape_with_text_offsets)
{
    wk_event_t ev = done_of(PROTO_FINISH_STOP);
    ev.logprobs = json_pack("[o, o]", entry(9, "h\xc3\xa9", -0.5), entry(3, "y", -1));
    json_t *c = http_completion_of(&cmpl, &ev, NULL);
    json_t *lp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
    char *got = json_dumps(lp, JSON_COMPACT);
    cr_assert_str_eq(got, "{\"tokens\":[\"h\xc3\xa9\",\"y\"],\"token_logprobs\":[-0.5,-1.0],"
                          "\"top_logprobs\":[{\"h\xc3\xa9\":-0.5},{\"y\":-1.0}],"
                          "\"text_offset\":[0,2]}");
    free(got);
    json_decref(c);
    wk_event_clear(&ev);
}

Test(http, a_streamed_token_carries_its_index_and_logprobs)
{
    size_t off[PROTO_MAX_CHOICES] = {0, 4};
    http_answer_t a = cmpl;
    a.offset = off;
    wk_event_t ev = {
        .kind = WK_EVENT_TOKEN, .text = strdup("y"), .token = 3, .index = 1, .choices = 2};
    ev.logprobs = entry(3, "y", -1);
    json_t *c = http_chunk_of(&a, &ev, 0);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    cr_assert_eq(json_integer_value(json_object_get(ch, "index")), 1);
    json_t *to = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    cr_assert_eq(json_integer_value(json_array_get(to, 0)), 4);
    cr_assert_eq(off[1], 5, "the choice's offset moves past the token");
    json_decref(c);
    wk_event_clear(&ev);
}

Test(http, the_last_done_of_n_gathers_every_choice_by_index)
{
    wk_event_t a = done_of(PROTO_FINISH_STOP), b = done_of(PROTO_FINISH_LENGTH);
    a.index = 2;
    b.index = 0;
    json_t *more = json_pack("[o]", http_choice_of(&cmpl, &a));
    b.index = 1;
    json_array_append_new(more,
                          http_choice_of(&cmpl, &(wk_event_t){.kind = WK_EVENT_DONE, .text = "x"}));
    json_t *c = http_completion_of(&cmpl, &b, more);
    json_t *ch = json_object_get(c, "choices");
    cr_assert_eq(json_array_size(ch), 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(ch, i), "index")),
                     (json_int_t)i);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ch, 1), "finish_reason")),
                     "length");
    json_decref(c);
    json_decref(more);
    wk_event_clear(&a);
    wk_event_clear(&b);
}

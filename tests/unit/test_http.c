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
    json_is(http_chunk_of(&chat, &ev, 1),
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
            "\"completion_tokens\":3,\"total_tokens\":8}}");
    wk_event_clear(&ev);
}

Test(http, a_done_event_without_stream_is_the_whole_completion)
{
    wk_event_t ev = done_of(PROTO_FINISH_STOP);
    json_is(http_completion_of(&chat, &ev, NULL),
            "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
            "\"content\":\" there was\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}");
    json_is(http_completion_of(&cmpl, &ev, NULL),
            "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
            "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\" there was\","
            "\"logprobs\":null,\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}");
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

/* test_server: the socket front end's encoder: a worker event (wk_event.h) becomes the protocol line proto_encode_* writes, byte for byte. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "front/server.h"
#include "worker/wk_event.h"

/* Asserts that ev encodes to exactly want (both lines; want is freed). */
static void line_is(const wk_event_t *ev, char *want)
{
    cr_assert_not_null(want);
    char *got = srv_event_line(ev);
    cr_assert_not_null(got);
    cr_assert_str_eq(got, want);
    free(got);
    free(want);
}

Test(server, a_token_event_is_the_token_line)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN,
                     .id = json_string("r1"),
                     .text = strdup(" there"),
                     .token = 727,
                     .ts = 12.3456789};
    char *line = srv_event_line(&ev);
    cr_assert_str_eq(line, "{\"id\":\"r1\",\"event\":\"token\",\"text\":\" there\",\"token\":727,"
                           "\"ts\":12.345679}\n");
    free(line);
    line_is(&ev, proto_encode_token(ev.id, ev.text, ev.token, ev.ts, NULL));
    ev.ts = -1; /* not given: no "ts" */
    ev.token = -1;
    line_is(&ev, proto_encode_token(ev.id, ev.text, -1, -1, NULL));
    wk_event_clear(&ev);
}

Test(server, a_done_event_is_the_done_line_with_usage_and_timing)
{
    wk_event_t ev = {
        .kind = WK_EVENT_DONE,
        .id = json_integer(12),
        .text = strdup(" there was ..."),
        .finish = PROTO_FINISH_LENGTH,
        .prompt_tokens = 5,
        .completion_tokens = 64,
        .timing = {
            .queue_ms = 0.4, .swap_ms = 212.0, .ttft_ms = 231.5, .total_ms = 910.2, .swapped = 1}};
    char *line = srv_event_line(&ev);
    cr_assert_str_eq(line, "{\"id\":12,\"event\":\"done\",\"text\":\" there was ...\","
                           "\"finish_reason\":\"length\","
                           "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":64},"
                           "\"timing\":{\"queue_ms\":0.4,\"swap_ms\":212.0,\"ttft_ms\":231.5,"
                           "\"total_ms\":910.2,\"swapped\":true}}\n");
    free(line);
    for (int f = 0; f < PROTO_FINISH_COUNT; f++) {
        ev.finish = (proto_finish_t)f;
        line_is(&ev, proto_encode_done(ev.id, ev.text, proto_finish_name(ev.finish), 5, 64, 0,
                                       &ev.timing, NULL));
    }
    free(ev.text); /* a sequence that made no text */
    ev.text = NULL;
    line_is(&ev,
            proto_encode_done(ev.id, "", proto_finish_name(ev.finish), 5, 64, 0, &ev.timing, NULL));
    wk_event_clear(&ev);
}

Test(server, an_error_event_is_the_error_line)
{
    wk_event_t ev = {.kind = WK_EVENT_ERROR,
                     .id = json_string("r2"),
                     .code = PROTO_E_UNKNOWN_MODEL,
                     .message = strdup("no model 'llama4' (configured: a, b)")};
    line_is(&ev, proto_encode_error(ev.id, ev.code, ev.message, ev.retry_ms));
    free(ev.message); /* no message: the code itself */
    ev.message = NULL;
    json_decref(ev.id); /* no id: null */
    ev.id = NULL;
    char *line = srv_event_line(&ev);
    cr_assert_str_eq(line,
                     "{\"id\":null,\"event\":\"error\",\"ok\":false,"
                     "\"error\":{\"code\":\"unknown_model\",\"message\":\"unknown_model\"}}\n");
    free(line);
    wk_event_clear(&ev);
}

Test(server, a_result_event_is_the_ok_line_and_keeps_its_body)
{
    wk_event_t ev = {.kind = WK_EVENT_RESULT,
                     .id = json_string("m"),
                     .body = json_pack("{s:[s], s:b}", "models", "a", "ok", 0)};
    char *line = srv_event_line(&ev);
    cr_assert_str_eq(line, "{\"id\":\"m\",\"ok\":true,\"models\":[\"a\"]}\n");
    free(line);
    cr_assert_eq(ev.body->refcount, 1, "the event still owns its body alone");
    line_is(&ev, proto_encode_ok(ev.id, json_incref(ev.body)));
    json_decref(ev.body); /* no body: just ok */
    ev.body = NULL;
    line_is(&ev, proto_encode_ok(ev.id, NULL));
    ev.body = json_integer(3);
    cr_assert_null(srv_event_line(&ev), "a body that is not an object gives no line");
    wk_event_clear(&ev);
}

Test(server, a_progress_event_is_the_progress_line)
{
    wk_event_t ev = {.kind = WK_EVENT_PROGRESS,
                     .id = json_string("l"),
                     .model = strdup("qwen2-7b"),
                     .bytes = 4194304000ull,
                     .total = 15231233024ull};
    line_is(&ev, proto_encode_progress(ev.id, ev.model, ev.bytes, ev.total));
    wk_event_clear(&ev);
}

Test(server, bad_utf8_in_event_text_is_written_as_replacement_characters)
{
    wk_event_t ev = {.kind = WK_EVENT_TOKEN,
                     .text = strdup("a\xc0\xaf"
                                    "b"),
                     .token = 1,
                     .ts = -1};
    char *line = srv_event_line(&ev);
    cr_assert(strstr(line, "\"text\":\"a\xef\xbf\xbd\xef\xbf\xbd"
                           "b\""),
              "%s", line);
    free(line);
    wk_event_clear(&ev);
}

/* test_wk_event: the worker's events: clearing one releases what it owns, field by field from WK_EVENT_FIELDS. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "worker/wk_event.h"

static int is_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

Test(wk_event, clear_releases_owned_fields_and_zeroes_the_event)
{
    json_t *id = json_string("r1"), *body = json_object();
    json_incref(id);
    json_incref(body);
    wk_event_t ev = {.kind = WK_EVENT_DONE,
                     .conn = 7,
                     .id = id,
                     .text = strdup("all"),
                     .message = strdup("m"),
                     .model = strdup("x"),
                     .body = body,
                     .prompt_tokens = 3};
    wk_event_clear(&ev);
    cr_assert(is_zero(&ev, sizeof ev));
    cr_assert_eq(id->refcount, 1, "its reference to the id was dropped");
    cr_assert_eq(body->refcount, 1, "its reference to the body was dropped");
    json_decref(id);
    json_decref(body);
}

Test(wk_event, clear_accepts_null_and_an_empty_event)
{
    wk_event_clear(NULL);
    wk_event_t ev = {0};
    wk_event_clear(&ev);
    cr_assert(is_zero(&ev, sizeof ev));
}

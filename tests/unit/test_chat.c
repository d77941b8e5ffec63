/* Unit tests for chat: llama.cpp's recorded template detections and renderings (tests/data/chat), names, errors. */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "testutil.h"

#define CHAT_REF "chat/llama-cpp-templates.json"

static json_t *load_ref(void)
{
    char path[1024];
    json_error_t je;
    json_t *j;

    tu_data_path(path, sizeof path, CHAT_REF);
    j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s:%d: %s", path, je.line, je.text);
    return j;
}

/* The messages of a recorded conversation (caller frees the array). */
static chat_msg_t *conversation(json_t *conv, size_t *n)
{
    chat_msg_t *m = calloc(json_array_size(conv) + 1, sizeof *m);
    size_t i;
    json_t *v;

    cr_assert_not_null(m);
    json_array_foreach (conv, i, v) {
        const char *role = json_string_value(json_object_get(v, "role"));
        cr_assert_not_null(role);
        cr_assert_lt(strlen(role), sizeof m[i].role);
        strcpy(m[i].role, role);
        m[i].content = (char *)json_string_value(json_object_get(v, "content"));
        cr_assert_not_null(m[i].content);
    }
    *n = json_array_size(conv);
    return m;
}

/* Shows where two strings part, for a readable failure. */
static void expect_same(const char *got, const char *want, const char *family, const char *conv)
{
    size_t i = 0;

    while (got[i] && got[i] == want[i])
        i++;
    cr_assert(got[i] == want[i],
              "%s, conversation \"%s\": differs at byte %zu:\n got  \"%s\"\n want \"%s\"", family,
              conv, i, got + (i > 20 ? i - 20 : 0), want + (i > 20 ? i - 20 : 0));
}

/* ------------------------------------------------------------------ llama.cpp's recorded outputs */

Test(chat, every_recorded_template_is_detected_as_llama_cpp_detects_it)
{
    json_t *ref = load_ref(), *v;
    json_t *det = json_object_get(ref, "detections");
    size_t i, n_real = 0;

    cr_assert(json_array_size(det) >= 60, "only %zu detections", json_array_size(det));
    json_array_foreach (det, i, v) {
        const char *tmpl = json_string_value(json_object_get(v, "template"));
        const char *want = json_string_value(json_object_get(v, "family"));
        const char *src = json_string_value(json_object_get(v, "source"));
        chat_family_t f = chat_detect(tmpl, strlen(tmpl));

        if (strcmp(want, "unknown") == 0) /* llama.cpp: no template text or no family */
            cr_assert(f == CHAT_UNKNOWN || (f == CHAT_NONE && !*tmpl),
                      "%s: got family %d, want unknown", src, (int)f);
        else
            cr_assert_eq(f, chat_family_from_name(want), "%s (%.60s...): got family %d, want %s",
                         src, tmpl, (int)f, want);
        n_real += strcmp(src, "synthetic") != 0 && strcmp(src, "the family name") != 0;
    }
    cr_assert_geq(n_real, 30, "the real templates of llama.cpp's test-chat-template are all there");
    json_decref(ref);
}

Test(chat, every_family_renders_every_recorded_conversation_exactly_as_llama_cpp)
{
    json_t *ref = load_ref();
    json_t *convs = json_object_get(ref, "conversations");
    json_t *rend = json_object_get(ref, "renderings"), *per;
    const char *family;
    size_t n_checked = 0;

    cr_assert_geq(json_object_size(rend), 33);
    json_object_foreach (rend, family, per) {
        chat_family_t f = chat_family_from_name(family);
        const char *cname;
        json_t *want;

        cr_assert_neq(f, CHAT_UNKNOWN, "llama.cpp family \"%s\" is not in chat.c's table", family);
        json_object_foreach (per, cname, want) {
            size_t n;
            chat_msg_t *m = conversation(json_object_get(convs, cname), &n);
            char *out = NULL, err[256] = "";

            cr_assert_eq(chat_render(f, m, n, &out, err, sizeof err), CHAT_OK, "%s: %s", family,
                         err);
            expect_same(out, json_string_value(want), family, cname);
            free(out);
            free(m);
            n_checked++;
        }
    }
    cr_assert_geq(n_checked, 33 * 7);
    json_decref(ref);
}

/* ------------------------------------------------------------------ names and errors */

Test(chat, family_names_round_trip_and_unknown_names_are_refused)
{
    char list[1024];

    cr_assert_eq(chat_family_from_name("llama3"), CHAT_LLAMA3);
    cr_assert_eq(chat_family_from_name("mistral-v3-tekken"), CHAT_MISTRAL_V3_TEKKEN);
    cr_assert_eq(chat_family_from_name("Llama3"), CHAT_UNKNOWN);
    cr_assert_eq(chat_family_from_name(""), CHAT_UNKNOWN);
    cr_assert_eq(chat_family_from_name(NULL), CHAT_UNKNOWN);
    chat_family_list(list, sizeof list);
    cr_assert(strstr(list, "chatml, ") != NULL && strstr(list, "gemma") != NULL &&
                  strstr(list, "megrez") != NULL,
              "%s", list);
}

Test(chat, a_missing_or_unknown_template_is_a_clear_error)
{
    chat_msg_t m = {.role = "user", .content = "Hi"};
    char *out = (char *)"untouched", err[1024] = "";

    cr_assert_eq(chat_detect(NULL, 0), CHAT_NONE);
    cr_assert_eq(chat_detect("{{ x }}", 7), CHAT_UNKNOWN);
    cr_assert_eq(chat_render(CHAT_NONE, &m, 1, &out, err, sizeof err), CHAT_ERR_TEMPLATE);
    cr_assert_null(out);
    cr_assert(strstr(err, "has no chat template") && strstr(err, "chat_template:") &&
                  strstr(err, "llama3"),
              "%s", err);
    cr_assert_eq(chat_render(CHAT_UNKNOWN, &m, 1, &out, err, sizeof err), CHAT_ERR_TEMPLATE);
    cr_assert(strstr(err, "none gpuswapd knows") && strstr(err, "chat_template:"), "%s", err);
}

Test(chat, a_family_name_as_the_whole_text_is_detected_before_markers)
{
    /* "chatml" as the whole text is the name, though it holds no marker */
    cr_assert_eq(chat_detect("chatml", 6), CHAT_CHATML);
    /* a prefix of a name is not the name */
    cr_assert_eq(chat_detect("chat", 4), CHAT_UNKNOWN);
    /* text that only starts with "mistral" still goes the [INST] way */
    cr_assert_eq(chat_detect("mistral, no markers", 19), CHAT_LLAMA2);
}

/* chat_tools_mistral: tool prompts of Mistral Nemo-Instruct-2407's template ([AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]) and its 9-character call ids (docs/TOOLS.md). */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MISTRAL_EOS "</s>"

void ct_mistral_id(const char *id_prefix, size_t index, char out[10])
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the prefix and the index */
    for (const char *p = id_prefix; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    for (size_t i = 0; i < sizeof index; i++)
        h = (h ^ ((index >> (8 * i)) & 0xff)) * 1099511628211ULL;
    for (int i = 0; i < 9; i++, h /= 62)
        out[i] = digits[h % 62];
    out[9] = '\0';
}

/* The id a call or result carries in the prompt: the client's when it has 9 letters and
 * digits (the template's rule), else one made from it (so a call and its result still match). */
static void mistral_id(const char *id, char out[10])
{
    size_t n = id ? strlen(id) : 0, alnum = id ? strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "abcdefghijklmnopqrstuvwxyz0123456789")
                                               : 0;
    if (n == 9 && alnum == 9) {
        memcpy(out, id, 10);
        return;
    }
    ct_mistral_id(id ? id : "", 0, out);
}

static int is_role(const chat_msg_t *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* "[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]": each function's keys in order ("return" left
 * out), a string value written raw between quotes as the template does, others as JSON. */
static void mistral_tools(chat_buf_t *b, const json_t *tools, int v3)
{
    size_t i;
    const json_t *t;
    chat_puts(b, v3 ? "[AVAILABLE_TOOLS] [" : "[AVAILABLE_TOOLS][");
    json_array_foreach (tools, i, t) {
        const char *k;
        const json_t *v;
        int first = 1;
        chat_puts(b, "{\"type\": \"function\", \"function\": {");
        json_object_foreach ((json_t *)ct_tool_fn(t), k, v) {
            if (strcmp(k, "return") == 0)
                continue;
            chat_puts(b, first ? "\"" : ", \"");
            first = 0;
            chat_puts(b, k);
            if (json_is_string(v)) {
                chat_puts(b, "\": \"");
                chat_puts(b, json_string_value(v));
                chat_put(b, "\"", 1);
            } else {
                chat_puts(b, "\": ");
                ct_py_dump(b, v, -1, 0);
            }
        }
        chat_puts(b, "}}");
        chat_puts(b, i + 1 < json_array_size(tools) ? ", " : "]");
    }
    chat_puts(b, "[/AVAILABLE_TOOLS]");
}

/* "[TOOL_CALLS][{function as JSON without its closing brace, "id": "..."}, ...]</s>". */
static void mistral_calls(chat_buf_t *b, const json_t *calls, int v3)
{
    size_t k;
    const json_t *c;
    chat_puts(b, v3 ? "[TOOL_CALLS] [" : "[TOOL_CALLS][");
    json_array_foreach (calls, k, c) {
        const json_t *fn = json_object_get(c, "function");
        json_t *f = json_is_object(fn) ? json_copy((json_t *)fn) : json_object();
        const char *name = NULL;
        json_t *args = ct_call_args(c, &name);
        char id[10];
        if (!f || (args && json_object_set_new(f, "arguments", args))) {
            b->oom = 1;
            json_decref(f);
            return;
        }
        chat_buf_t one = {0};
        ct_py_dump(&one, f, -1, 0);
        json_decref(f);
        if (one.oom || !one.len) {
            b->oom = 1;
            free(one.p);
            return;
        }
        chat_put(b, one.p, one.len - 1);
        free(one.p);
        mistral_id(json_string_value(json_object_get(c, "id")), id);
        chat_puts(b, ", \"id\": \"");
        chat_puts(b, id);
        chat_puts(b, "\"}");
        chat_puts(b, k + 1 < json_array_size(calls) ? ", " : "]" MISTRAL_EOS);
    }
}

/* The template's check: after the optional system message, user and assistant alternate
 * (calls and results aside). */
static int mistral_alternates(const chat_msg_t *msgs, size_t n, char *err, size_t errlen)
{
    size_t idx = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_role(&msgs[i], "tool") || msgs[i].tool_calls)
            continue;
        if (is_role(&msgs[i], "user") != (idx++ % 2 == 0)) {
            snprintf(err, errlen,
                     "After the optional system message, conversation roles must "
                     "alternate user/assistant/user/assistant/...");
            return -1;
        }
    }
    return 0;
}

int ct_render_mistral(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                      const json_t *tools, char *err, size_t errlen)
{
    int v3 = st == CHAT_TOOLS_MISTRAL3; /* v3: spaces after the tags, answers trimmed */
    const char *sys = n && is_role(&msgs[0], "system") ? msgs[0].content : NULL;
    const chat_msg_t *m = msgs + (n && is_role(&msgs[0], "system"));
    size_t nm = n - (size_t)(m - msgs), last_user = nm;
    for (size_t i = 0; i < nm; i++)
        if (is_role(&m[i], "user"))
            last_user = i;
    if (mistral_alternates(m, nm, err, errlen))
        return CHAT_ERR_TEMPLATE;
    for (size_t i = 0; i < nm; i++) {
        const char *content = m[i].content ? m[i].content : "";
        if (is_role(&m[i], "user")) {
            /* the template compares messages by value: an equal earlier user turn gets the
             * tools too */
            if (json_array_size(tools) && last_user < nm &&
                strcmp(content, m[last_user].content ? m[last_user].content : "") == 0)
                mistral_tools(b, tools, v3);
            chat_puts(b, v3 ? "[INST] " : "[INST]");
            if (i + 1 == nm && sys) {
                chat_puts(b, sys);
                chat_puts(b, "\n\n");
            }
            chat_puts(b, content);
            chat_puts(b, "[/INST]");
        } else if (m[i].tool_calls) {
            json_t *calls = json_loads(m[i].tool_calls, 0, NULL);
            mistral_calls(b, calls, v3);
            json_decref(calls);
        } else if (is_role(&m[i], "assistant")) {
            if (v3) {
                chat_put(b, " ", 1);
                ct_put_trimmed(b, content);
            } else {
                chat_puts(b, content);
            }
            chat_puts(b, MISTRAL_EOS);
        } else if (is_role(&m[i], "tool")) {
            char id[10];
            mistral_id(m[i].tool_call_id, id);
            chat_puts(b, v3 ? "[TOOL_RESULTS] {\"content\": " : "[TOOL_RESULTS]{\"content\": ");
            chat_puts(b, content);
            chat_puts(b, ", \"call_id\": \"");
            chat_puts(b, id);
            chat_puts(b, "\"}[/TOOL_RESULTS]");
        } else {
            snprintf(err, errlen,
                     "Only user and assistant roles are supported, with the "
                     "exception of an initial optional system message!");
            return CHAT_ERR_TEMPLATE;
        }
    }
    return CHAT_OK;
}

/* chat_tools_llama: tool prompts of Llama 3.1/3.2/3.3-Instruct's templates (docs/TOOLS.md). */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define L3_HDR(role) "<|start_header_id|>" role "<|end_header_id|>\n\n"
#define L3_FORMAT                                                                                  \
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "      \
    "name and its value}.Do not use variables.\n\n"

/* Today as strftime("%d %b %Y") in the C locale, local time (Llama 3.2's strftime_now). */
static void l3_today(char *out, size_t n)
{
    static const char *mon[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm)) {
        snprintf(out, n, "26 Jul 2024");
        return;
    }
    snprintf(out, n, "%02d %s %d", tm.tm_mday, mon[tm.tm_mon % 12], tm.tm_year + 1900);
}

/* The system turn and, with tools, the first user turn that lists them; returns the index of
 * the first message left for the loop, or -1 (tools but no message to put them in). */
static long l3_head(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                    const json_t *tools)
{
    char date[32];
    size_t i = 0, k;
    const json_t *t;
    int listed = json_array_size(tools) > 0;
    if (st == CHAT_TOOLS_LLAMA32)
        l3_today(date, sizeof date);
    else
        snprintf(date, sizeof date, "26 Jul 2024");
    chat_puts(b, L3_HDR("system"));
    if (listed)
        chat_puts(b, "Environment: ipython\n");
    chat_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    chat_puts(b, date);
    chat_puts(b, "\n\n");
    if (n && strcmp(msgs[0].role, "system") == 0)
        ct_put_trimmed(b, msgs[i++].content);
    chat_puts(b, "<|eot_id|>");
    if (!listed)
        return (long)i;
    if (i == n)
        return -1;
    chat_puts(b, L3_HDR("user") "Given the following functions, please respond with a JSON for a "
                                "function call with its proper arguments that best answers the "
                                "given prompt.\n\n" L3_FORMAT);
    json_array_foreach (tools, k, t) {
        ct_py_dump(b, t, 4, 0);
        chat_puts(b, "\n\n");
    }
    ct_put_trimmed(b, msgs[i++].content);
    chat_puts(b, "<|eot_id|>");
    return (long)i;
}

/* Llama 3.1/3.2/3.3-Instruct's template (custom tools, tools_in_user_message true, no
 * builtin_tools), add_generation_prompt on. CHAT_OK or CHAT_ERR_TEMPLATE with err set. */
int ct_render_llama3(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                     const json_t *tools, char *err, size_t errlen)
{
    long first = l3_head(b, st, msgs, n, tools);
    if (first < 0) {
        snprintf(err, errlen,
                 "the Llama 3 template puts the tools in the first user message: "
                 "there is none");
        return CHAT_ERR_TEMPLATE;
    }
    for (size_t i = (size_t)first; i < n; i++) {
        const chat_msg_t *m = &msgs[i];
        if (strcmp(m->role, "tool") == 0 || strcmp(m->role, "ipython") == 0) {
            chat_puts(b, L3_HDR("ipython"));
            ct_py_string(b, m->content ? m->content : "", m->content ? strlen(m->content) : 0);
            chat_puts(b, "<|eot_id|>");
        } else if (m->tool_calls) {
            json_t *calls = json_loads(m->tool_calls, 0, NULL);
            const char *name = NULL;
            if (json_array_size(calls) != 1) {
                json_decref(calls);
                snprintf(err, errlen,
                         "messages[%zu]: Llama 3 models take one tool call per "
                         "assistant message",
                         i);
                return CHAT_ERR_TEMPLATE;
            }
            json_t *args = ct_call_args(json_array_get(calls, 0), &name);
            chat_puts(b, L3_HDR("assistant") "{\"name\": \"");
            chat_puts(b, name ? name : "");
            chat_puts(b, "\", \"parameters\": ");
            if (args)
                ct_py_dump(b, args, -1, 0);
            else
                b->oom = 1;
            chat_puts(b, "}<|eot_id|>");
            json_decref(args);
            json_decref(calls);
        } else {
            chat_puts(b, "<|start_header_id|>");
            chat_puts(b, m->role);
            chat_puts(b, "<|end_header_id|>\n\n");
            ct_put_trimmed(b, m->content);
            chat_puts(b, "<|eot_id|>");
        }
    }
    chat_puts(b, L3_HDR("assistant"));
    return CHAT_OK;
}

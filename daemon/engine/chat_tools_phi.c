/* chat_tools_phi: tool prompts of Phi-4-mini-instruct's template (the tools of the system message between <|tool|> and <|/tool|>; calls as <|tool_call|>[...]<|/tool_call|>) (docs/TOOLS.md). */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Microsoft's example system message for a request with tools and none of its own. */
#define PHI4_TOOLS_SYSTEM "You are a helpful assistant with some tools."

/* The system message's tools field: the functions as one JSON list (json.dumps). */
static void phi4_tools(chat_buf_t *b, const json_t *tools)
{
    size_t i;
    const json_t *t;
    chat_puts(b, "<|tool|>[");
    json_array_foreach (tools, i, t) {
        if (i)
            chat_puts(b, ", ");
        ct_py_dump(b, ct_tool_fn(t), -1, 0);
    }
    chat_puts(b, "]<|/tool|>");
}

/* An assistant message's calls as the model writes them. */
static void phi4_calls(chat_buf_t *b, const json_t *calls)
{
    size_t k;
    const json_t *c;
    chat_puts(b, "<|tool_call|>[");
    json_array_foreach (calls, k, c) {
        if (k)
            chat_puts(b, ", ");
        ct_put_call(b, c);
    }
    chat_puts(b, "]<|/tool_call|>");
}

int ct_render_phi4(chat_buf_t *b, const chat_msg_t *msgs, size_t n, const json_t *tools, char *err,
                   size_t errlen)
{
    (void)err;
    (void)errlen;
    int listed = json_array_size(tools) > 0;
    if (listed && !(n && strcmp(msgs[0].role, "system") == 0)) {
        chat_puts(b, "<|system|>" PHI4_TOOLS_SYSTEM);
        phi4_tools(b, tools);
        chat_puts(b, "<|end|>");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *calls = msgs[i].tool_calls ? json_loads(msgs[i].tool_calls, 0, NULL) : NULL;
        chat_puts(b, "<|");
        chat_puts(b, msgs[i].role);
        chat_puts(b, "|>");
        chat_puts(b, msgs[i].content);
        if (i == 0 && listed && strcmp(msgs[0].role, "system") == 0)
            phi4_tools(b, tools);
        if (json_array_size(calls))
            phi4_calls(b, calls);
        chat_puts(b, "<|end|>");
        json_decref(calls);
    }
    chat_puts(b, "<|assistant|>");
    return CHAT_OK;
}

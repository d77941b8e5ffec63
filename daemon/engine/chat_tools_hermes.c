/* chat_tools_hermes: tool prompts of the <tool_call> families: Qwen2.5-Instruct's, Qwen3's and Hermes 2 Pro/3's tool_use templates (docs/TOOLS.md). */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN_DEFAULT_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

/* Qwen's system turn with the tools; system NULL: none (Qwen3) or Qwen2.5's default. */
static void qwen_tools_block(chat_buf_t *b, chat_tools_style_t st, const char *system,
                             const json_t *tools)
{
    size_t i;
    const json_t *t;
    chat_puts(b, "<|im_start|>system\n");
    if (system || st == CHAT_TOOLS_HERMES) {
        chat_puts(b, system ? system : QWEN_DEFAULT_SYSTEM);
        chat_puts(b, "\n\n");
    }
    chat_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user "
                 "query.\n\nYou are provided with function signatures within <tools></tools> XML "
                 "tags:\n<tools>");
    json_array_foreach (tools, i, t) {
        chat_put(b, "\n", 1);
        ct_py_dump(b, t, -1, 0);
    }
    chat_puts(b,
              "\n</tools>\n\nFor each function call, return a json object with function name and "
              "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
              "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
}

static int is_role(const chat_msg_t *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* A tool result in Qwen's form: grouped into one user turn with its neighbours. */
static void qwen_tool_result(chat_buf_t *b, const chat_msg_t *msgs, size_t n, size_t i)
{
    if (i == 0 || !is_role(&msgs[i - 1], "tool"))
        chat_puts(b, "<|im_start|>user");
    chat_puts(b, "\n<tool_response>\n");
    chat_puts(b, msgs[i].content);
    chat_puts(b, "\n</tool_response>");
    if (i + 1 == n || !is_role(&msgs[i + 1], "tool"))
        chat_puts(b, "<|im_end|>\n");
}

/* An assistant turn with calls as Qwen2.5's and Hermes' templates write it: the content (if any;
 * NULL: dropped) on its own line, then each call as a block on its own line. */
static void assistant_calls(chat_buf_t *b, const char *content, const json_t *calls)
{
    size_t k;
    const json_t *c;
    chat_puts(b, "<|im_start|>assistant");
    if (content && *content) {
        chat_put(b, "\n", 1);
        chat_puts(b, content);
    }
    json_array_foreach (calls, k, c) {
        chat_puts(b, "\n<tool_call>\n");
        ct_put_call(b, c);
        chat_puts(b, "\n</tool_call>");
    }
    chat_puts(b, "<|im_end|>\n");
}

/* Qwen3's last_query_index: the last user message that is not only a tool response. */
static size_t qwen3_last_query(const chat_msg_t *msgs, size_t n)
{
    static const char o[] = "<tool_response>", c[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        const char *t = msgs[i].content ? msgs[i].content : "";
        size_t l = strlen(t);
        int wrapped = strncmp(t, o, sizeof o - 1) == 0 && l >= sizeof c - 1 &&
                      strcmp(t + l - (sizeof c - 1), c) == 0;
        if (is_role(&msgs[i], "user") && !wrapped)
            return i;
    }
    return n ? n - 1 : 0;
}

/* s[0, n) without the leading (lead) or trailing newlines, as Python's lstrip/rstrip("\n"). */
static void put_unnl(chat_buf_t *b, const char *s, size_t n, int lead, int trail)
{
    while (lead && n && *s == '\n')
        s++, n--;
    while (trail && n && s[n - 1] == '\n')
        n--;
    chat_put(b, s, n);
}

/* One assistant message in Qwen3's form: content split at </think> into reasoning and answer,
 * the reasoning kept after the last user query; then the calls. */
static void qwen3_assistant(chat_buf_t *b, const chat_msg_t *m, int after_query, int last,
                            const json_t *calls)
{
    const char *all = m->content ? m->content : "";
    const char *cut = strstr(all, "</think>"), *ans = all, *rs = "", *re = rs;
    size_t k;
    const json_t *c;
    if (cut) {
        const char *lastcut = cut;
        for (const char *q; (q = strstr(lastcut + 1, "</think>"));)
            lastcut = q;
        ans = lastcut + strlen("</think>");
        while (*ans == '\n')
            ans++;
        rs = all;
        for (const char *q = all; (q = strstr(q, "<think>")) && q < cut; q++)
            rs = q + strlen("<think>");
        re = cut;
        while (re > rs && re[-1] == '\n')
            re--;
        while (rs < re && *rs == '\n')
            rs++;
    }
    chat_puts(b, "<|im_start|>assistant\n");
    if (after_query && (last || re > rs)) {
        /* reasoning: rstrip then lstrip of newlines, then strip: the same */
        chat_puts(b, "<think>\n");
        put_unnl(b, rs, (size_t)(re - rs), 1, 1);
        chat_puts(b, "\n</think>\n\n");
        put_unnl(b, ans, strlen(ans), 1, 0);
    } else {
        chat_puts(b, ans);
    }
    json_array_foreach (calls, k, c) {
        if (k || *ans)
            chat_put(b, "\n", 1);
        chat_puts(b, "<tool_call>\n");
        ct_put_call(b, c);
        chat_puts(b, "\n</tool_call>");
    }
    chat_puts(b, "<|im_end|>\n");
}

/* Qwen2.5-Instruct's and Qwen3's templates. */
static void render_qwen(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                        const json_t *tools)
{
    const char *sys0 = n && is_role(&msgs[0], "system") ? msgs[0].content : NULL;
    size_t lq = qwen3_last_query(msgs, n);
    if (json_array_size(tools)) {
        qwen_tools_block(b, st, sys0, tools);
    } else if (sys0 || st == CHAT_TOOLS_HERMES) {
        chat_puts(b, "<|im_start|>system\n");
        chat_puts(b, sys0 ? sys0 : QWEN_DEFAULT_SYSTEM);
        chat_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        const chat_msg_t *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        json_t *calls = m->tool_calls ? json_loads(m->tool_calls, 0, NULL) : NULL;
        if (is_role(m, "tool")) {
            qwen_tool_result(b, msgs, n, i);
        } else if (st == CHAT_TOOLS_QWEN3 && is_role(m, "assistant")) {
            qwen3_assistant(b, m, i > lq, i + 1 == n, calls);
        } else if (is_role(m, "user") || (is_role(m, "system") && i > 0) ||
                   (is_role(m, "assistant") && !json_array_size(calls))) {
            chat_puts(b, "<|im_start|>");
            chat_puts(b, m->role);
            chat_put(b, "\n", 1);
            chat_puts(b, content);
            chat_puts(b, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            assistant_calls(b, content, calls);
        }
        json_decref(calls);
    }
    chat_puts(b, "<|im_start|>assistant\n");
}

/* ------------------------------------------------------------------ Hermes 2 Pro / 3 */

/* The template's json_to_python_type macro as Jinja 3.1 evaluates it: an array's items are
 * read through the |items filter (a generator, so "Union[]"), a type that is a string outside
 * the map recurses on its own characters without end (an error: -1). */
static int py_type(chat_buf_t *b, const json_t *spec, int depth)
{
    static const char *const map[][2] = {
        {"string", "str"}, {"number", "float"}, {"integer", "int"}, {"boolean", "bool"}};
    const json_t *t = json_object_get(spec, "type");
    if (depth > 32)
        return -1;
    if (!t || json_is_array(t) || json_is_object(t)) { /* undefined or iterable: a union */
        size_t i;
        const char *k;
        const json_t *x;
        int first = 1;
        chat_puts(b, "Union[");
        if (json_is_array(t)) {
            json_array_foreach (t, i, x) {
                json_t *one = json_pack("{s:O}", "type", x);
                int rc = one ? py_type(b, one, depth + 1) : -1;
                json_decref(one);
                if (rc)
                    return -1;
                if (i + 1 < json_array_size(t))
                    chat_put(b, ",", 1);
            }
        } else if (json_is_object(t)) {
            json_object_foreach ((json_t *)t, k, x) {
                json_t *one = json_pack("{s:s}", "type", k);
                if (!first)
                    chat_put(b, ",", 1);
                first = 0;
                int rc = one ? py_type(b, one, depth + 1) : -1;
                json_decref(one);
                if (rc)
                    return -1;
            }
        }
        chat_puts(b, "]");
        return 0;
    }
    if (!json_is_string(t)) { /* a number, a boolean, null */
        chat_puts(b, "Any");
        return 0;
    }
    const char *s = json_string_value(t);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i][0]) == 0) {
            chat_puts(b, map[i][1]);
            return 0;
        }
    if (strcmp(s, "array") == 0) {
        chat_puts(b, "list[Union[]]");
    } else if (strcmp(s, "object") == 0) {
        const json_t *ap = json_object_get(spec, "additionalProperties");
        if (!ap) {
            chat_puts(b, "dict");
            return 0;
        }
        chat_puts(b, "dict[str, ");
        if (py_type(b, json_is_object(ap) ? ap : NULL, depth + 1))
            return -1;
        chat_puts(b, "]");
    } else {
        return -1;
    }
    return 0;
}

/* One tool of Hermes' system turn; -1 where the template fails (err set). */
static int hermes2_tool(chat_buf_t *b, const json_t *tool, char *err, size_t errlen)
{
    const json_t *fn = json_object_get(tool, "function") ? json_object_get(tool, "function") : tool;
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *desc = json_string_value(json_object_get(fn, "description"));
    const json_t *params = json_object_get(fn, "parameters");
    const json_t *props = json_object_get(params, "properties"), *x, *ret;
    const char *k;
    int first = 1;
    if (!name || !desc) {
        snprintf(err, errlen,
                 "Hermes' tool_use template needs a name and a description (a "
                 "string) for every tool");
        return -1;
    }
    chat_puts(b, "{\"type\": \"function\", \"function\": {\"name\": \"");
    chat_puts(b, name);
    chat_puts(b, "\", \"description\": \"");
    chat_puts(b, name);
    chat_put(b, "(", 1);
    json_object_foreach ((json_t *)props, k, x) {
        chat_puts(b, first ? "" : ", ");
        first = 0;
        chat_puts(b, k);
        chat_puts(b, ": ");
        if (py_type(b, x, 0))
            goto bad_type;
    }
    chat_put(b, ")", 1);
    if ((ret = json_object_get(fn, "return"))) {
        chat_puts(b, " -> ");
        if (py_type(b, ret, 0))
            goto bad_type;
    }
    chat_puts(b, " - ");
    chat_puts(b, desc);
    chat_puts(b, "\n\n");
    first = 1;
    json_object_foreach ((json_t *)props, k, x) {
        chat_puts(b, first ? "    Args:\n" : "");
        first = 0;
        chat_puts(b, "        ");
        chat_puts(b, k);
        chat_put(b, "(", 1);
        py_type(b, x, 0);
        chat_puts(b, "): ");
        ct_put_trimmed(b, json_string_value(json_object_get(x, "description")));
    }
    if (json_is_string(json_object_get(ret, "description"))) {
        chat_puts(b, "\n    Returns:\n        ");
        chat_puts(b, json_string_value(json_object_get(ret, "description")));
    }
    chat_puts(b, "\", \"parameters\": ");
    if (json_object_size(props))
        ct_py_dump(b, params, -1, 0);
    else
        chat_puts(b, "{}");
    chat_put(b, "}", 1);
    return 0;
bad_type:
    snprintf(err, errlen,
             "tool '%s': Hermes' tool_use template cannot write a parameter of this JSON type "
             "as a Python type (its json_to_python_type recurses without end)",
             name);
    return -1;
}

#define HERMES2_SYSTEM                                                                             \
    "<|im_start|>system\nYou are a function calling AI model. You are provided with function "     \
    "signatures within <tools></tools> XML tags. You may call one or more functions to assist "    \
    "with the user query. Don't make assumptions about what values to plug into functions. "       \
    "Here are the available tools: <tools> "
#define HERMES2_FORMAT                                                                             \
    " </tools>Use the following pydantic model json schema for each tool call you will make: "     \
    "{\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, \"arguments\": "     \
    "{\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\": [\"name\", \"arguments\"], " \
    "\"title\": \"FunctionCall\", \"type\": \"object\"}}\nFor each function call return a json "   \
    "object with function name and arguments within <tool_call></tool_call> XML tags as "          \
    "follows:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-dict>}\n"             \
    "</tool_call><|im_end|>\n"

/* Hermes 2 Pro / Hermes 3's tool_use template (no tools: an empty list). */
static int render_hermes2(chat_buf_t *b, const chat_msg_t *msgs, size_t n, const json_t *tools,
                          char *err, size_t errlen)
{
    size_t i;
    const json_t *t;
    chat_puts(b, HERMES2_SYSTEM);
    json_array_foreach (tools, i, t) {
        if (hermes2_tool(b, t, err, errlen))
            return CHAT_ERR_TEMPLATE;
        if (i + 1 < json_array_size(tools))
            chat_put(b, "\n", 1);
    }
    chat_puts(b, HERMES2_FORMAT);
    for (i = 0; i < n; i++) {
        const chat_msg_t *m = &msgs[i];
        if (is_role(m, "tool")) {
            if (i > 0 && !is_role(&msgs[i - 1], "tool"))
                chat_puts(b, "<|im_start|>tool\n");
            chat_puts(b, "<tool_response>\n");
            chat_puts(b, m->content);
            chat_puts(b, i + 1 < n ? "\n</tool_response>\n" : "\n</tool_response>");
            if (i + 1 == n || !is_role(&msgs[i + 1], "tool"))
                chat_puts(b, "<|im_end|>");
        } else if (is_role(m, "assistant") && m->tool_calls) {
            json_t *calls = json_loads(m->tool_calls, 0, NULL);
            assistant_calls(b, NULL, calls); /* the template drops the content */
            json_decref(calls);
        } else if (is_role(m, "user") || is_role(m, "system") || is_role(m, "assistant")) {
            chat_puts(b, "<|im_start|>");
            chat_puts(b, m->role);
            chat_put(b, "\n", 1);
            chat_puts(b, m->content);
            chat_puts(b, "<|im_end|>\n");
        }
    }
    chat_puts(b, "<|im_start|>assistant\n");
    return CHAT_OK;
}

int ct_render_hermes(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                     const json_t *tools, char *err, size_t errlen)
{
    if (st == CHAT_TOOLS_HERMES2)
        return render_hermes2(b, msgs, n, tools, err, errlen);
    render_qwen(b, st, msgs, n, tools);
    return CHAT_OK;
}

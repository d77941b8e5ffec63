/* chat_tools: tool calls in chat prompts (OpenAI's tools, assistant tool_calls, tool results) rendered per family, and the tool calls a model wrote parsed back (docs/TOOLS.md). */
#include "engine/chat_tools.h"
#include "engine/chat_buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ text */

/* ------------------------------------------------------------------ Python's json.dumps */

static void py_string(chat_buf_t *b, const char *s, size_t n)
{
    chat_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
        }
        if (e)
            chat_puts(b, e);
        else
            chat_put(b, s + i, 1);
    }
    chat_put(b, "\"", 1);
}

/* A double as Python's float repr: the shortest digits that read back, fixed notation for
 * exponents -4 .. 15 (with ".0" when integral), else d.ddde+XX. */
static void py_real(chat_buf_t *b, double x)
{
    char s[40], out[64];
    if (isnan(x) || isinf(x)) { /* json.dumps writes these; JSON cannot carry them anyway */
        chat_puts(b, isnan(x) ? "NaN" : x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, x);
        if (strtod(s, NULL) == x)
            break;
    }
    snprintf(s, sizeof s, "%.*e", p - 1, x);
    char digits[24];
    size_t nd = 0;
    const char *q = s;
    int neg = *q == '-';
    q += neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.");
            for (int i = -1; i > exp; i--)
                out[o++] = '0';
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits);
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits + exp + 1);
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits + 1);
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    chat_puts(b, out);
}

/* Python's line break and indent before an item at depth d (indent < 0: none). */
static void py_nl(chat_buf_t *b, int indent, int d)
{
    if (indent < 0)
        return;
    chat_put(b, "\n", 1);
    for (int i = 0; i < indent * d; i++)
        chat_put(b, " ", 1);
}

/* v as json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: None) at depth d. */
static void py_dump(chat_buf_t *b, const json_t *v, int indent, int d)
{
    char num[32];
    const char *sep = indent < 0 ? ", " : ",";
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        const json_t *x;
        int first = 1;
        chat_put(b, "{", 1);
        json_object_foreach ((json_t *)v, k, x) {
            if (!first)
                chat_puts(b, sep);
            first = 0;
            py_nl(b, indent, d + 1);
            py_string(b, k, strlen(k));
            chat_put(b, ": ", 2);
            py_dump(b, x, indent, d + 1);
        }
        if (!first)
            py_nl(b, indent, d);
        chat_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        const json_t *x;
        chat_put(b, "[", 1);
        json_array_foreach (v, i, x) {
            if (i)
                chat_puts(b, sep);
            py_nl(b, indent, d + 1);
            py_dump(b, x, indent, d + 1);
        }
        if (json_array_size(v))
            py_nl(b, indent, d);
        chat_put(b, "]", 1);
        break;
    }
    case JSON_STRING: py_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        chat_puts(b, num);
        break;
    case JSON_REAL: py_real(b, json_real_value(v)); break;
    case JSON_TRUE: chat_puts(b, "true"); break;
    case JSON_FALSE: chat_puts(b, "false"); break;
    case JSON_NULL: chat_puts(b, "null"); break;
    }
}

char *chat_tools_pyjson(const json_t *v)
{
    chat_buf_t b = {0};
    py_dump(&b, v, -1, 0);
    return chat_done(&b);
}

/* ------------------------------------------------------------------ detection */

static int has(const char *s, size_t len, const char *needle)
{
    return s && memmem(s, len, needle, strlen(needle)) != NULL;
}

chat_tools_style_t chat_tools_detect(chat_family_t f, const char *tmpl, size_t len)
{
    if (has(tmpl, len, "<tool_call>") && has(tmpl, len, "# Tools") &&
        has(tmpl, len, "<|im_start|>"))
        return CHAT_TOOLS_HERMES;
    if (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "Environment: ipython") &&
        has(tmpl, len, "tools_in_user_message") && has(tmpl, len, "\"parameters\": "))
        return has(tmpl, len, "strftime_now") ? CHAT_TOOLS_LLAMA32 : CHAT_TOOLS_LLAMA3;
    if (has(tmpl, len, "<tool_call>") || has(tmpl, len, "[AVAILABLE_TOOLS]") ||
        has(tmpl, len, "<|python_tag|>") || has(tmpl, len, "ipython") || has(tmpl, len, "<|tool|>"))
        return CHAT_TOOLS_PENDING;
    switch (f) {
    case CHAT_LLAMA3:
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
    case CHAT_MISTRAL_V7:
    case CHAT_PHI4: return CHAT_TOOLS_PENDING;
    default: return CHAT_TOOLS_GENERIC;
    }
}

const char *chat_tools_style_name(chat_tools_style_t st)
{
    switch (st) {
    case CHAT_TOOLS_HERMES: return "hermes";
    case CHAT_TOOLS_PENDING: return "pending";
    case CHAT_TOOLS_LLAMA3: return "llama3";
    case CHAT_TOOLS_LLAMA32: return "llama3.2";
    default: return "generic";
    }
}

int chat_tools_is_llama3(chat_tools_style_t st)
{
    return st == CHAT_TOOLS_LLAMA3 || st == CHAT_TOOLS_LLAMA32;
}

int chat_tools_in_messages(const chat_msg_t *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (msgs[i].tool_calls || strcmp(msgs[i].role, "tool") == 0)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ rendering */

/* A call's {name, arguments} from one OpenAI tool_calls entry (its function object, or the
 * entry itself); the arguments as a JSON value: a string that parses is parsed (OpenAI sends
 * text, the template wants the object), else the value as given. New reference or NULL. */
static json_t *call_args(const json_t *call, const char **name)
{
    const json_t *fn = json_object_get(call, "function");
    if (!json_is_object(fn))
        fn = call;
    *name = json_string_value(json_object_get(fn, "name"));
    const json_t *a = json_object_get(fn, "arguments");
    if (json_is_string(a)) {
        json_t *parsed = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
        if (parsed)
            return parsed;
    }
    return a ? json_incref((json_t *)a) : json_object();
}

/* One call as {"name": "N", "arguments": A} with A in json.dumps form. */
static void put_call(chat_buf_t *b, const json_t *call)
{
    const char *name = NULL;
    json_t *args = call_args(call, &name);
    chat_puts(b, "{\"name\": \"");
    chat_puts(b, name ? name : "");
    chat_puts(b, "\", \"arguments\": ");
    char *s = args ? chat_tools_pyjson(args) : NULL;
    chat_puts(b, s ? s : "{}");
    free(s);
    json_decref(args);
    chat_put(b, "}", 1);
}

#define QWEN_DEFAULT_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

static void hermes_tools_block(chat_buf_t *b, const char *system, const json_t *tools)
{
    size_t i;
    const json_t *t;
    chat_puts(b, "<|im_start|>system\n");
    chat_puts(b, system ? system : QWEN_DEFAULT_SYSTEM);
    chat_puts(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
                 "query.\n\nYou are provided with function signatures within <tools></tools> XML "
                 "tags:\n<tools>");
    json_array_foreach (tools, i, t) {
        char *s = chat_tools_pyjson(t);
        chat_put(b, "\n", 1);
        if (!s)
            b->oom = 1;
        chat_puts(b, s);
        free(s);
    }
    chat_puts(b,
              "\n</tools>\n\nFor each function call, return a json object with function name and "
              "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
              "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
}

/* Qwen2.5-Instruct's template, add_generation_prompt on. */
static void render_hermes(chat_buf_t *b, const chat_msg_t *msgs, size_t n, const json_t *tools)
{
    const char *sys0 = n && strcmp(msgs[0].role, "system") == 0 ? msgs[0].content : NULL;
    if (json_array_size(tools)) {
        hermes_tools_block(b, sys0 ? sys0 : NULL, tools);
    } else {
        chat_puts(b, "<|im_start|>system\n");
        chat_puts(b, sys0 ? sys0 : QWEN_DEFAULT_SYSTEM);
        chat_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        const chat_msg_t *m = &msgs[i];
        const char *content = m->content ? m->content : "";
        json_t *calls = m->tool_calls ? json_loads(m->tool_calls, 0, NULL) : NULL;
        int is_tool = strcmp(m->role, "tool") == 0;
        if (strcmp(m->role, "user") == 0 || (strcmp(m->role, "system") == 0 && i > 0) ||
            (strcmp(m->role, "assistant") == 0 && !json_array_size(calls))) {
            chat_puts(b, "<|im_start|>");
            chat_puts(b, m->role);
            chat_put(b, "\n", 1);
            chat_puts(b, content);
            chat_puts(b, "<|im_end|>\n");
        } else if (strcmp(m->role, "assistant") == 0) {
            size_t k;
            const json_t *c;
            chat_puts(b, "<|im_start|>assistant");
            if (*content) {
                chat_put(b, "\n", 1);
                chat_puts(b, content);
            }
            json_array_foreach (calls, k, c) {
                chat_puts(b, "\n<tool_call>\n");
                put_call(b, c);
                chat_puts(b, "\n</tool_call>");
            }
            chat_puts(b, "<|im_end|>\n");
        } else if (is_tool) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool") != 0)
                chat_puts(b, "<|im_start|>user");
            chat_puts(b, "\n<tool_response>\n");
            chat_puts(b, content);
            chat_puts(b, "\n</tool_response>");
            if (i + 1 == n || strcmp(msgs[i + 1].role, "tool") != 0)
                chat_puts(b, "<|im_end|>\n");
        }
        json_decref(calls);
    }
    chat_puts(b, "<|im_start|>assistant\n");
}

/* Python's str.strip() whitespace (ASCII: the Unicode spaces beyond it are not trimmed). */
static int py_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* s as Jinja's |trim writes it (NULL: ""). */
static void put_trimmed(chat_buf_t *b, const char *s)
{
    if (!s)
        return;
    size_t e = strlen(s);
    while (py_space((unsigned char)*s))
        s++, e--;
    while (e && py_space((unsigned char)s[e - 1]))
        e--;
    chat_put(b, s, e);
}

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
        put_trimmed(b, msgs[i++].content);
    chat_puts(b, "<|eot_id|>");
    if (!listed)
        return (long)i;
    if (i == n)
        return -1;
    chat_puts(b, L3_HDR("user") "Given the following functions, please respond with a JSON for a "
                                "function call with its proper arguments that best answers the "
                                "given prompt.\n\n" L3_FORMAT);
    json_array_foreach (tools, k, t) {
        py_dump(b, t, 4, 0);
        chat_puts(b, "\n\n");
    }
    put_trimmed(b, msgs[i++].content);
    chat_puts(b, "<|eot_id|>");
    return (long)i;
}

/* Llama 3.1/3.2/3.3-Instruct's template (custom tools, tools_in_user_message true, no
 * builtin_tools), add_generation_prompt on. CHAT_OK or CHAT_ERR_TEMPLATE with err set. */
static int render_llama3(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
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
            py_string(b, m->content ? m->content : "", m->content ? strlen(m->content) : 0);
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
            json_t *args = call_args(json_array_get(calls, 0), &name);
            chat_puts(b, L3_HDR("assistant") "{\"name\": \"");
            chat_puts(b, name ? name : "");
            chat_puts(b, "\", \"parameters\": ");
            if (args)
                py_dump(b, args, -1, 0);
            else
                b->oom = 1;
            chat_puts(b, "}<|eot_id|>");
            json_decref(args);
            json_decref(calls);
        } else {
            chat_puts(b, "<|start_header_id|>");
            chat_puts(b, m->role);
            chat_puts(b, "<|end_header_id|>\n\n");
            put_trimmed(b, m->content);
            chat_puts(b, "<|eot_id|>");
        }
    }
    chat_puts(b, L3_HDR("assistant"));
    return CHAT_OK;
}

/* The generic form's system text for tools (docs/TOOLS.md). */
static void generic_tools_text(chat_buf_t *b, const json_t *tools)
{
    size_t i;
    const json_t *t;
    chat_puts(b, "You can call these functions (OpenAI tool objects, one a line):");
    json_array_foreach (tools, i, t) {
        char *s = chat_tools_pyjson(t);
        chat_put(b, "\n", 1);
        if (!s)
            b->oom = 1;
        chat_puts(b, s);
        free(s);
    }
    chat_puts(b, "\nTo call one, answer with only a JSON object: {\"name\": <function-name>, "
                 "\"arguments\": <args-json-object>}");
}

/* Families without a rendered tool syntax: the messages rewritten into system, user and
 * assistant ones (tools in the first system message, calls as their JSON, results as user
 * messages), then chat_render. */
static int render_generic(chat_family_t f, const chat_msg_t *msgs, size_t n, const json_t *tools,
                          char **out, char *err, size_t errlen)
{
    chat_msg_t *v = calloc(n + 1, sizeof *v);
    size_t nv = 0;
    int rc = CHAT_ERR_NOMEM, listed = json_array_size(tools) > 0;
    if (!v)
        goto done;
    if (listed) {
        chat_buf_t b = {0};
        int merge = n && strcmp(msgs[0].role, "system") == 0;
        if (merge) {
            chat_puts(&b, msgs[0].content);
            chat_puts(&b, "\n\n");
        }
        generic_tools_text(&b, tools);
        snprintf(v[nv].role, sizeof v[nv].role, "system");
        if (!(v[nv++].content = chat_done(&b)))
            goto done;
        msgs += merge;
        n -= (size_t)merge;
    }
    for (size_t i = 0; i < n; i++, nv++) {
        chat_buf_t b = {0};
        json_t *calls = msgs[i].tool_calls ? json_loads(msgs[i].tool_calls, 0, NULL) : NULL;
        size_t k;
        const json_t *c;
        int is_tool = strcmp(msgs[i].role, "tool") == 0;
        snprintf(v[nv].role, sizeof v[nv].role, "%s", is_tool ? "user" : msgs[i].role);
        if (is_tool)
            chat_puts(&b, "Result of the function call: ");
        chat_puts(&b, msgs[i].content);
        json_array_foreach (calls, k, c) {
            if (b.len)
                chat_put(&b, "\n", 1);
            put_call(&b, c);
        }
        json_decref(calls);
        if (!(v[nv].content = chat_done(&b)))
            goto done;
    }
    rc = chat_render(f, v, nv, out, err, errlen);
done:
    for (size_t i = 0; v && i < nv; i++)
        free(v[i].content);
    free(v);
    if (rc == CHAT_ERR_NOMEM)
        snprintf(err, errlen, "out of memory rendering the chat");
    return rc;
}

int chat_tools_render(chat_family_t f, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                      const json_t *tools, int forced, char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (st != CHAT_TOOLS_HERMES && !chat_tools_is_llama3(st))
        return render_generic(f, msgs, n, tools, out, err, errlen);
    chat_buf_t b = {0};
    if (st == CHAT_TOOLS_HERMES) {
        render_hermes(&b, msgs, n, tools);
        if (forced)
            chat_puts(&b, "<tool_call>\n");
    } else {
        int rc = render_llama3(&b, st, msgs, n, tools, err, errlen);
        if (rc) {
            free(b.p);
            return rc;
        }
    }
    if (!(*out = chat_done(&b))) {
        snprintf(err, errlen, "out of memory rendering the chat");
        return CHAT_ERR_NOMEM;
    }
    return CHAT_OK;
}

/* ------------------------------------------------------------------ enforcement */

/* The tool object's function (OpenAI: {"type": "function", "function": {...}}). */
static const json_t *tool_fn(const json_t *tool)
{
    return json_object_get(tool, "function");
}

static const json_t *tool_named(const json_t *tools, const char *name)
{
    size_t i;
    const json_t *t;
    json_array_foreach (tools, i, t) {
        const char *nm = json_string_value(json_object_get(tool_fn(t), "name"));
        if (nm && name && strcmp(nm, name) == 0)
            return t;
    }
    return NULL;
}

json_t *chat_tools_call_schema(chat_tools_style_t st, const json_t *tools, const char *name)
{
    json_t *name_s, *args_s;
    const char *key = chat_tools_is_llama3(st) ? "parameters" : "arguments";
    /* required with one tool: that tool is the call, its parameters enforced as when named (the
     * automaton has no union of object schemas, so several tools leave the arguments open) */
    if (!name && json_array_size(tools) == 1)
        name = json_string_value(json_object_get(tool_fn(json_array_get(tools, 0)), "name"));
    if (name) {
        const json_t *t = tool_named(tools, name);
        if (!t)
            return NULL;
        const json_t *params = json_object_get(tool_fn(t), "parameters");
        name_s = json_pack("{s:s}", "const", name);
        args_s =
            json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    } else {
        json_t *names = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach (tools, i, t)
            json_array_append_new(names, json_copy(json_object_get(tool_fn(t), "name")));
        name_s = json_pack("{s:o}", "enum", names);
        args_s = json_pack("{s:s}", "type", "object");
    }
    return json_pack("{s:s, s:{s:s, s:{s:s, s:{s:o, s:o}, s:[ss], s:b}}}", "type", "json_schema",
                     "json_schema", "name", "tool_call", "schema", "type", "object", "properties",
                     "name", name_s, key, args_s, "required", "name", key, "additionalProperties",
                     0);
}

/* ------------------------------------------------------------------ parsing */

/* One call from JSON text (n bytes): {id, type, function: {name, arguments}} when it is an
 * object with a string name among the tools and an object under key ("arguments", Llama 3's
 * "parameters"); else NULL. */
static json_t *call_of(const char *s, size_t n, const json_t *tools, const char *key,
                       const char *id)
{
    json_t *o = json_loadb(s, n, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *args = json_object_get(o, key);
    json_t *call = NULL;
    if (name && json_is_object(args) && tool_named(tools, name)) {
        char *a = json_dumps(args, JSON_COMPACT);
        if (a)
            call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", a);
        free(a);
    }
    json_decref(o);
    return call;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The content left when calls were taken out: trimmed of whitespace at both ends. */
static char *trimmed(const chat_buf_t *b)
{
    size_t s = 0, e = b->len;
    while (s < e && is_ws(b->p[s]))
        s++;
    while (e > s && is_ws(b->p[e - 1]))
        e--;
    return strndup(b->p ? b->p + s : "", e - s);
}

#define TC_OPEN "<tool_call>"
#define TC_CLOSE "</tool_call>"

int chat_tools_parse(chat_tools_style_t st, const char *text, const json_t *tools, int forced,
                     int parallel, const char *id_prefix, json_t **calls, char **content)
{
    char id[96];
    chat_buf_t rest = {0};
    json_t *arr = json_array();
    *calls = NULL;
    *content = NULL;
    if (!arr)
        return -1;
    if (forced || chat_tools_is_llama3(st)) { /* the whole text is the call, or content */
        snprintf(id, sizeof id, "%s0", id_prefix);
        json_t *c = call_of(text, strlen(text), tools,
                            chat_tools_is_llama3(st) ? "parameters" : "arguments", id);
        if (c)
            json_array_append_new(arr, c);
    } else if (st == CHAT_TOOLS_HERMES) {
        const char *p = text;
        for (;;) {
            const char *o = strstr(p, TC_OPEN);
            const char *e = o ? strstr(o + strlen(TC_OPEN), TC_CLOSE) : NULL;
            if (!o || !e) { /* no block, or a half-written one: content */
                chat_puts(&rest, p);
                break;
            }
            const char *in = o + strlen(TC_OPEN);
            json_t *c = NULL;
            if (parallel || json_array_size(arr) == 0) {
                snprintf(id, sizeof id, "%s%zu", id_prefix, json_array_size(arr));
                c = call_of(in, (size_t)(e - in), tools, "arguments", id);
            }
            chat_put(&rest, p, (size_t)(o - p));
            if (c)
                json_array_append_new(arr, c);
            else /* invalid JSON, no such function, or a second call without parallel */
                chat_put(&rest, o, (size_t)(e + strlen(TC_CLOSE) - o));
            p = e + strlen(TC_CLOSE);
        }
    }
    int n = (int)json_array_size(arr);
    if (n == 0 || rest.oom) {
        json_decref(arr);
        free(rest.p);
        return rest.oom ? -1 : 0;
    }
    *content = trimmed(&rest);
    free(rest.p);
    if (!*content) {
        json_decref(arr);
        return -1;
    }
    *calls = arr;
    return n;
}

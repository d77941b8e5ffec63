/* chat_tools: tool calls in chat prompts (OpenAI's tools, assistant tool_calls, tool results) rendered per family, and the tool calls a model wrote parsed back (docs/TOOLS.md). */
#include "engine/chat_tools.h"
#include "engine/chat_buf.h"
#include "engine/chat_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ detection */

static int has(const char *s, size_t len, const char *needle)
{
    return s && memmem(s, len, needle, strlen(needle)) != NULL;
}

chat_tools_style_t chat_tools_detect(chat_family_t f, const char *tmpl, size_t len)
{
    int chatml = has(tmpl, len, "<|im_start|>") && has(tmpl, len, "<tool_call>");
    if (chatml && has(tmpl, len, "# Tools"))
        return has(tmpl, len, "reasoning_content") ? CHAT_TOOLS_QWEN3 : CHAT_TOOLS_HERMES;
    if (chatml && has(tmpl, len, "function calling AI model") &&
        has(tmpl, len, "json_to_python_type"))
        return CHAT_TOOLS_HERMES2;
    if (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "Environment: ipython") &&
        has(tmpl, len, "tools_in_user_message") && has(tmpl, len, "\"parameters\": "))
        return has(tmpl, len, "strftime_now") ? CHAT_TOOLS_LLAMA32 : CHAT_TOOLS_LLAMA3;
    if (has(tmpl, len, "[AVAILABLE_TOOLS]") && has(tmpl, len, "[TOOL_RESULTS]") &&
        has(tmpl, len, "\"[INST]\" + message[\"content\"]")) /* Nemo's; v3's has "[INST] " */
        return CHAT_TOOLS_MISTRAL;
    if (has(tmpl, len, "\"[AVAILABLE_TOOLS] [\"") && has(tmpl, len, "'[TOOL_RESULTS] {") &&
        has(tmpl, len, "\"[INST] \" + message[\"content\"]") &&
        has(tmpl, len, "\"[TOOL_CALLS] [\"") && has(tmpl, len, "message[\"content\"]|trim"))
        return CHAT_TOOLS_MISTRAL3; /* Mistral-7B-Instruct-v0.3's (and Large-2407's) */
    if (has(tmpl, len, "<|tool|>") && has(tmpl, len, "message['tools']") &&
        has(tmpl, len, "<|/tool|>") && has(tmpl, len, "<|assistant|>"))
        return CHAT_TOOLS_PHI4;
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

/* One row a style: its name, the text that opens a call (or a list of calls), the text that
 * closes a block (block styles), the markers the output parser must see, and whether calls come
 * as one JSON list. */
typedef struct style_row {
    const char *name;
    const char *marker; /* chat_tools_marker */
    const char *open;   /* chat_tools_is_marker: the opening text, NULL: none */
    const char *close;  /* chat_tools_is_marker: the closing text, NULL: none */
    int listed;         /* chat_tools_listed */
} style_row_t;

static const style_row_t style_rows[] = {
    [CHAT_TOOLS_GENERIC] = {"generic", NULL, NULL, NULL, 0},
    [CHAT_TOOLS_HERMES] = {"hermes", "<tool_call>", "<tool_call>", "</tool_call>", 0},
    [CHAT_TOOLS_PENDING] = {"pending", NULL, NULL, NULL, 0},
    [CHAT_TOOLS_LLAMA3] = {"llama3", NULL, "<|python_tag|>", NULL, 0},
    [CHAT_TOOLS_LLAMA32] = {"llama3.2", NULL, NULL, NULL, 0},
    [CHAT_TOOLS_QWEN3] = {"qwen3", "<tool_call>", "<tool_call>", "</tool_call>", 0},
    [CHAT_TOOLS_HERMES2] = {"hermes2", "<tool_call>", "<tool_call>", "</tool_call>", 0},
    [CHAT_TOOLS_MISTRAL] = {"mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", NULL, 1},
    [CHAT_TOOLS_PHI4] = {"phi4", "<|tool_call|>", "<|tool_call|>", "<|/tool_call|>", 1},
    [CHAT_TOOLS_MISTRAL3] = {"mistral-v3", "[TOOL_CALLS]", "[TOOL_CALLS]", NULL, 1},
};

static const style_row_t *style_row(chat_tools_style_t st)
{
    size_t i = (size_t)st;
    return i < sizeof style_rows / sizeof style_rows[0] && style_rows[i].name ? &style_rows[i]
                                                                              : &style_rows[0];
}

const char *chat_tools_style_name(chat_tools_style_t st)
{
    return style_row(st)->name;
}

int chat_tools_is_llama3(chat_tools_style_t st)
{
    return st == CHAT_TOOLS_LLAMA3 || st == CHAT_TOOLS_LLAMA32;
}

const char *chat_tools_marker(chat_tools_style_t st)
{
    return style_row(st)->marker;
}

static int text_is(const char *m, const char *text, size_t len)
{
    return m && strlen(m) == len && memcmp(m, text, len) == 0;
}

int chat_tools_is_marker(chat_tools_style_t st, const char *text, size_t len)
{
    const style_row_t *r = style_row(st);
    return text_is(r->open, text, len) || text_is(r->close, text, len);
}

int chat_tools_listed(chat_tools_style_t st)
{
    return style_row(st)->listed;
}

int chat_tools_in_messages(const chat_msg_t *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (msgs[i].tool_calls || strcmp(msgs[i].role, "tool") == 0)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ rendering */

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
            ct_put_call(&b, c);
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
    chat_buf_t b = {0};
    int rc;
    *out = NULL;
    switch (st) {
    case CHAT_TOOLS_HERMES:
    case CHAT_TOOLS_QWEN3:
    case CHAT_TOOLS_HERMES2: rc = ct_render_hermes(&b, st, msgs, n, tools, err, errlen); break;
    case CHAT_TOOLS_LLAMA3:
    case CHAT_TOOLS_LLAMA32: rc = ct_render_llama3(&b, st, msgs, n, tools, err, errlen); break;
    case CHAT_TOOLS_MISTRAL:
    case CHAT_TOOLS_MISTRAL3: rc = ct_render_mistral(&b, st, msgs, n, tools, err, errlen); break;
    case CHAT_TOOLS_PHI4: rc = ct_render_phi4(&b, msgs, n, tools, err, errlen); break;
    default: return render_generic(f, msgs, n, tools, out, err, errlen);
    }
    if (rc) {
        free(b.p);
        return rc;
    }
    /* a forced call: the prompt opens it (the listed styles' array is the constrained output) */
    if (forced && chat_tools_marker(st)) {
        chat_puts(&b, chat_tools_marker(st));
        if (!chat_tools_listed(st))
            chat_put(&b, "\n", 1);
    }
    if (!(*out = chat_done(&b))) {
        snprintf(err, errlen, "out of memory rendering the chat");
        return CHAT_ERR_NOMEM;
    }
    return CHAT_OK;
}

/* ------------------------------------------------------------------ enforcement */

json_t *chat_tools_call_schema(chat_tools_style_t st, const json_t *tools, const char *name,
                               int many)
{
    json_t *name_s, *args_s;
    const char *key = chat_tools_is_llama3(st) ? "parameters" : "arguments";
    /* required with one tool: that tool is the call, its parameters enforced as when named (the
     * automaton has no union of object schemas, so several tools leave the arguments open) */
    if (!name && json_array_size(tools) == 1)
        name = json_string_value(json_object_get(ct_tool_fn(json_array_get(tools, 0)), "name"));
    if (name) {
        const json_t *t = ct_tool_named(tools, name);
        if (!t)
            return NULL;
        const json_t *params = json_object_get(ct_tool_fn(t), "parameters");
        name_s = json_pack("{s:s}", "const", name);
        args_s =
            json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    } else {
        json_t *names = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach (tools, i, t) {
            json_array_append_new(names, json_copy(json_object_get(ct_tool_fn(t), "name")));
        }
        name_s = json_pack("{s:o}", "enum", names);
        args_s = json_pack("{s:s}", "type", "object");
    }
    json_t *call =
        json_pack("{s:s, s:{s:o, s:o}, s:[ss], s:b}", "type", "object", "properties", "name",
                  name_s, key, args_s, "required", "name", key, "additionalProperties", 0);
    if (call && chat_tools_listed(st)) /* one call (or more), as the list these families write */
        call = many ? json_pack("{s:s, s:o, s:i}", "type", "array", "items", call, "minItems", 1)
                    : json_pack("{s:s, s:o, s:i, s:i}", "type", "array", "items", call, "minItems",
                                1, "maxItems", 1);
    return call ? json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema", "name",
                            "tool_call", "schema", call)
                : NULL;
}

/* ------------------------------------------------------------------ parsing */

#define TC_CLOSE "</tool_call>"

/* HERMES-style blocks: marker, one call's JSON, TC_CLOSE; the rest (and any block that is no
 * valid call, half-written, or a second one without parallel) is content. */
static void parse_blocks(const char *p, const char *open, const json_t *tools, int parallel,
                         const char *id_prefix, json_t *arr, chat_buf_t *rest)
{
    char id[96];
    for (;;) {
        const char *o = strstr(p, open);
        const char *e = o ? strstr(o + strlen(open), TC_CLOSE) : NULL;
        if (!o || !e) {
            chat_puts(rest, p);
            return;
        }
        const char *in = o + strlen(open);
        json_t *c = NULL;
        if (parallel || json_array_size(arr) == 0) {
            snprintf(id, sizeof id, "%s%zu", id_prefix, json_array_size(arr));
            c = ct_call_of(in, (size_t)(e - in), tools, "arguments", id);
        }
        chat_put(rest, p, (size_t)(o - p));
        if (c)
            json_array_append_new(arr, c);
        else
            chat_put(rest, o, (size_t)(e + strlen(TC_CLOSE) - o));
        p = e + strlen(TC_CLOSE);
    }
}

/* A JSON array of calls at p (spaces first allowed); Phi-4-mini's closing tag after it is
 * skipped. Every element must be a valid call (else none is taken: the text stays content);
 * without parallel the first is taken and the others stay content (as a JSON array in *extra).
 * Returns the end of what was read, or NULL. */
static const char *parse_list(chat_tools_style_t st, const char *p, const json_t *tools,
                              int parallel, const char *id_prefix, json_t *arr, chat_buf_t *extra)
{
    static const char phi_close[] = "<|/tool_call|>";
    json_error_t je;
    char id[96];
    size_t i;
    const json_t *x;
    p += strspn(p, " \t\r\n");
    json_t *list = json_loads(p, JSON_DISABLE_EOF_CHECK, &je), *got = json_array();
    const char *end = json_is_array(list) && json_array_size(list) ? p + je.position : NULL;
    size_t at = 1, len = end ? (size_t)(end - p) : 0; /* each element's text, as written */
    json_array_foreach (end ? list : NULL, i, x) {
        int vst;
        at += strspn(p + at, " \t\r\n");
        size_t e = ct_json_skip(p, len, at, &vst);
        if (st == CHAT_TOOLS_MISTRAL || st == CHAT_TOOLS_MISTRAL3)
            ct_mistral_id(id_prefix, i, id);
        else
            snprintf(id, sizeof id, "%s%zu", id_prefix, i);
        json_t *c = vst == 1 ? ct_call_of(p + at, e - at, tools, "arguments", id) : NULL;
        at = e + strspn(p + e, " \t\r\n") + 1; /* past the "," */
        if (!c || json_array_append_new(got, c)) {
            end = NULL;
            break;
        }
    }
    if (end && !parallel && json_array_size(list) > 1) {
        json_array_remove(list, 0);
        char *more = json_dumps(list, JSON_COMPACT);
        if (!more)
            extra->oom = 1;
        chat_puts(extra, more);
        free(more);
        while (json_array_size(got) > 1)
            json_array_remove(got, 1);
    }
    if (end)
        json_array_extend(arr, got);
    json_decref(got);
    json_decref(list);
    if (end && st == CHAT_TOOLS_PHI4) {
        const char *q = end + strspn(end, " \t\r\n");
        if (strncmp(q, phi_close, sizeof phi_close - 1) == 0)
            end = q + sizeof phi_close - 1;
    }
    return end;
}

int chat_tools_parse(chat_tools_style_t st, const char *text, const json_t *tools, int forced,
                     int parallel, const char *id_prefix, json_t **calls, char **content)
{
    char id[96];
    chat_buf_t rest = {0};
    json_t *arr = json_array();
    const char *marker = chat_tools_marker(st);
    *calls = NULL;
    *content = NULL;
    if (!arr)
        return -1;
    if (forced && chat_tools_listed(st)) { /* the whole text is the list */
        if (!parse_list(st, text, tools, parallel, id_prefix, arr, &rest))
            chat_puts(&rest, text);
    } else if (forced || chat_tools_is_llama3(st)) { /* the whole text is the call, or content */
        snprintf(id, sizeof id, "%s0", id_prefix);
        json_t *c = ct_call_of(text, strlen(text), tools,
                               chat_tools_is_llama3(st) ? "parameters" : "arguments", id);
        if (!c && !forced && st == CHAT_TOOLS_LLAMA3) /* a built-in tool's call */
            c = ct_llama3_builtin_call(text, tools, id);
        if (c)
            json_array_append_new(arr, c);
        else if (forced && parallel && marker) { /* required's blocks: the prompt opened one */
            chat_buf_t all = {0};
            chat_puts(&all, marker);
            chat_puts(&all, text);
            if (!all.oom)
                parse_blocks(all.p, marker, tools, parallel, id_prefix, arr, &rest);
            rest.oom |= all.oom;
            free(all.p);
        }
    } else if (marker && chat_tools_listed(st)) { /* content, then the marker and the list */
        const char *o = strstr(text, marker);
        chat_buf_t more = {0};
        const char *e =
            o ? parse_list(st, o + strlen(marker), tools, parallel, id_prefix, arr, &more) : NULL;
        if (e) {
            chat_put(&rest, text, (size_t)(o - text));
            if (more.len) { /* calls beyond the first without parallel: content, as written */
                chat_puts(&rest, marker);
                chat_put(&rest, more.p, more.len);
            }
            chat_puts(&rest, e);
            rest.oom |= more.oom;
            free(more.p);
        } else {
            chat_puts(&rest, text);
        }
    } else if (marker) {
        parse_blocks(text, marker, tools, parallel, id_prefix, arr, &rest);
    }
    int n = (int)json_array_size(arr);
    if (n == 0 || rest.oom) {
        json_decref(arr);
        free(rest.p);
        return rest.oom ? -1 : 0;
    }
    *content = ct_trimmed(&rest);
    free(rest.p);
    if (!*content) {
        json_decref(arr);
        return -1;
    }
    *calls = arr;
    return n;
}

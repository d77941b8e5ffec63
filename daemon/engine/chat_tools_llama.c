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

/* ------------------------------------------------------------------ built-in tools */

static const char *const l3_builtin_names[] = {"brave_search", "wolfram_alpha", "code_interpreter"};

int ct_llama3_builtin(chat_tools_style_t st, const char *name)
{
    if (st != CHAT_TOOLS_LLAMA3 || !name) /* Llama 3.2's template has no builtin_tools */
        return 0;
    for (size_t i = 0; i < sizeof l3_builtin_names / sizeof *l3_builtin_names; i++)
        if (strcmp(name, l3_builtin_names[i]) == 0)
            return 1;
    return 0;
}

static const char *tool_name(const json_t *t)
{
    return json_string_value(json_object_get(ct_tool_fn(t), "name"));
}

/* The request's tools split as the template takes them: the built-in ones' names (builtin_tools,
 * in their order) into *builtin (new array, NULL when none), the others into *custom (new
 * array, NULL when none: the template's tools none). -1 on OOM. */
static int l3_split(chat_tools_style_t st, const json_t *tools, json_t **builtin, json_t **custom)
{
    size_t i;
    const json_t *t;
    *builtin = *custom = NULL;
    json_array_foreach (tools, i, t) {
        json_t **to = ct_llama3_builtin(st, tool_name(t)) ? builtin : custom;
        if (!*to && !(*to = json_array()))
            return -1;
        if (json_array_append_new(*to, to == builtin ? json_string(tool_name(t))
                                                     : json_incref((json_t *)t)))
            return -1;
    }
    return 0;
}

/* "Tools: " and the built-in tools but code_interpreter, as the template's system turn lists
 * them. */
static void l3_builtin_line(chat_buf_t *b, const json_t *builtin)
{
    size_t i, k = 0;
    const json_t *v;
    chat_puts(b, "Tools: ");
    json_array_foreach (builtin, i, v) {
        if (strcmp(json_string_value(v), "code_interpreter") == 0)
            continue;
        chat_puts(b, k++ ? ", " : "");
        chat_puts(b, json_string_value(v));
    }
    chat_puts(b, "\n\n");
}

/* A built-in call as the template writes it: <|python_tag|>name.call(k="v", ...); each value
 * must be a string (the template joins them with +). CHAT_OK or CHAT_ERR_TEMPLATE. */
static int l3_put_builtin_call(chat_buf_t *b, const char *name, const json_t *args, size_t i,
                               char *err, size_t errlen)
{
    const char *k;
    const json_t *v;
    size_t n = 0;
    if (!json_is_object(args)) {
        snprintf(err, errlen, "messages[%zu]: %s's arguments must be an object", i, name);
        return CHAT_ERR_TEMPLATE;
    }
    chat_puts(b, "<|python_tag|>");
    chat_puts(b, name);
    chat_puts(b, ".call(");
    json_object_foreach ((json_t *)args, k, v) {
        if (!json_is_string(v)) {
            snprintf(err, errlen,
                     "messages[%zu]: Llama 3.1's template writes built-in tool %s's "
                     "arguments as strings: '%s' is not one",
                     i, name, k);
            return CHAT_ERR_TEMPLATE;
        }
        chat_puts(b, n++ ? ", " : "");
        chat_puts(b, k);
        chat_puts(b, "=\"");
        chat_puts(b, json_string_value(v));
        chat_puts(b, "\"");
    }
    chat_puts(b, ")");
    return CHAT_OK;
}

/* ------------------------------------------------------------------ rendering */

/* The system turn and, with custom tools, the first user turn that lists them; returns the
 * index of the first message left for the loop, or -1 (tools but no message to put them in). */
static long l3_head(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                    const json_t *tools, const json_t *builtin)
{
    char date[32];
    size_t i = 0, k;
    const json_t *t;
    int listed = tools != NULL;
    if (st == CHAT_TOOLS_LLAMA32)
        l3_today(date, sizeof date);
    else
        snprintf(date, sizeof date, "26 Jul 2024");
    chat_puts(b, L3_HDR("system"));
    if (listed || builtin)
        chat_puts(b, "Environment: ipython\n");
    if (builtin)
        l3_builtin_line(b, builtin);
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

/* An assistant message's one call: JSON, or (builtin listed, the call one of them) the
 * built-in form; then <|eom_id|> with builtin, else <|eot_id|>. */
static int l3_put_call(chat_buf_t *b, const chat_msg_t *m, size_t i, const json_t *builtin,
                       char *err, size_t errlen)
{
    json_t *calls = json_loads(m->tool_calls, 0, NULL);
    const char *name = NULL;
    int rc = CHAT_OK;
    if (json_array_size(calls) != 1) {
        json_decref(calls);
        snprintf(err, errlen,
                 "messages[%zu]: Llama 3 models take one tool call per assistant message", i);
        return CHAT_ERR_TEMPLATE;
    }
    json_t *args = ct_call_args(json_array_get(calls, 0), &name);
    size_t k;
    const json_t *v;
    int is_builtin = 0;
    json_array_foreach (builtin, k, v) {
        is_builtin |= name && strcmp(json_string_value(v), name) == 0;
    }
    chat_puts(b, L3_HDR("assistant"));
    if (is_builtin) {
        rc = l3_put_builtin_call(b, name, args, i, err, errlen);
    } else {
        chat_puts(b, "{\"name\": \"");
        chat_puts(b, name ? name : "");
        chat_puts(b, "\", \"parameters\": ");
        if (args)
            ct_py_dump(b, args, -1, 0);
        else
            b->oom = 1;
        chat_puts(b, "}");
    }
    chat_puts(b, builtin ? "<|eom_id|>" : "<|eot_id|>");
    json_decref(args);
    json_decref(calls);
    return rc;
}

/* Llama 3.1/3.2/3.3-Instruct's template (custom tools, tools_in_user_message true; for 3.1/3.3
 * the built-in tools among them as builtin_tools), add_generation_prompt on. CHAT_OK or
 * CHAT_ERR_TEMPLATE with err set. */
int ct_render_llama3(chat_buf_t *b, chat_tools_style_t st, const chat_msg_t *msgs, size_t n,
                     const json_t *tools, char *err, size_t errlen)
{
    json_t *builtin, *custom;
    int rc = CHAT_OK;
    if (l3_split(st, tools, &builtin, &custom)) {
        b->oom = 1;
        goto done;
    }
    long first = l3_head(b, st, msgs, n, custom, builtin);
    if (first < 0) {
        snprintf(err, errlen,
                 "the Llama 3 template puts the tools in the first user message: "
                 "there is none");
        rc = CHAT_ERR_TEMPLATE;
        goto done;
    }
    for (size_t i = (size_t)first; i < n && rc == CHAT_OK; i++) {
        const chat_msg_t *m = &msgs[i];
        if (strcmp(m->role, "tool") == 0 || strcmp(m->role, "ipython") == 0) {
            chat_puts(b, L3_HDR("ipython"));
            ct_py_string(b, m->content ? m->content : "", m->content ? strlen(m->content) : 0);
            chat_puts(b, "<|eot_id|>");
        } else if (m->tool_calls) {
            rc = l3_put_call(b, m, i, builtin, err, errlen);
        } else {
            chat_puts(b, "<|start_header_id|>");
            chat_puts(b, m->role);
            chat_puts(b, "<|end_header_id|>\n\n");
            ct_put_trimmed(b, m->content);
            chat_puts(b, "<|eot_id|>");
        }
    }
    chat_puts(b, L3_HDR("assistant"));
done:
    json_decref(builtin);
    json_decref(custom);
    return rc;
}

/* ------------------------------------------------------------------ built-in calls */

#define L3_TAG "<|python_tag|>"

/* A Python string literal at *p ('...' or "..." with backslash escapes) appended to b; the
 * position past it, or NULL. */
static const char *l3_py_str(const char *p, chat_buf_t *b)
{
    char q = *p;
    if (q != '"' && q != '\'')
        return NULL;
    for (p++; *p && *p != q; p++) {
        char c = *p;
        if (c == '\\') {
            c = *++p;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
            if (!c)
                return NULL;
        }
        chat_put(b, &c, 1);
    }
    return *p == q ? p + 1 : NULL;
}

/* name.call(k="v", ...) at p, nothing but spaces after it: its arguments {k: "v", ...}, or
 * NULL. */
static json_t *l3_call_args(const char *p)
{
    json_t *args = json_object();
    p += strspn(p, " ");
    while (args && *p != ')') {
        size_t kl = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        char key[128];
        chat_buf_t v = {0};
        const char *q = p + kl + strspn(p + kl, " ");
        if (!kl || kl >= sizeof key || *q != '=')
            goto bad;
        snprintf(key, sizeof key, "%.*s", (int)kl, p);
        q += 1 + strspn(q + 1, " ");
        const char *e = l3_py_str(q, &v);
        char *sv = e ? chat_done(&v) : NULL;
        if (!e)
            free(v.p);
        if (!sv || json_object_set_new(args, key, json_string(sv))) {
            free(sv);
            goto bad;
        }
        free(sv);
        p = e + strspn(e, " ");
        if (*p == ',')
            p += 1 + strspn(p + 1, " ");
        else if (*p != ')')
            goto bad;
    }
    if (args && p[1 + strspn(p + 1, " \t\r\n")] == '\0')
        return args;
bad:
    json_decref(args);
    return NULL;
}

/* A call {id, type, function: {name, arguments}} with args (stolen) as its compact JSON. */
static json_t *l3_call_new(const char *name, json_t *args, const char *id)
{
    char *a = args ? json_dumps(args, JSON_COMPACT) : NULL;
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                              "name", name, "arguments", a)
                  : NULL;
    free(a);
    json_decref(args);
    return c;
}

json_t *ct_llama3_builtin_call(const char *text, const json_t *tools, const char *id)
{
    const char *p = text + strspn(text, " \t\r\n");
    int tag = strncmp(p, L3_TAG, strlen(L3_TAG)) == 0;
    size_t i;
    const json_t *t;
    p += tag ? strlen(L3_TAG) : 0;
    if (tag) { /* a custom call after the tag, as Llama 3.1 sometimes writes it */
        json_t *c = ct_call_of(p, strlen(p), tools, "parameters", id);
        if (c)
            return c;
    }
    json_array_foreach (tools, i, t) {
        const char *name = tool_name(t);
        size_t nl = name ? strlen(name) : 0;
        if (ct_llama3_builtin(CHAT_TOOLS_LLAMA3, name) && strncmp(p, name, nl) == 0 &&
            strncmp(p + nl, ".call(", 6) == 0)
            return l3_call_new(name, l3_call_args(p + nl + 6), id);
    }
    if (!tag || !ct_tool_named(tools, "code_interpreter"))
        return NULL;
    size_t n = strlen(p); /* the code as written, trailing spaces left out */
    while (n && strchr(" \t\r\n", p[n - 1]))
        n--;
    json_t *code = json_stringn(p, n);
    return code ? l3_call_new("code_interpreter", json_pack("{s:o}", "code", code), id) : NULL;
}

int ct_llama3_may_call(const char *text, size_t len, const json_t *tools)
{
    size_t i;
    const json_t *t;
    size_t tl = strlen(L3_TAG), n = len < tl ? len : tl;
    if (memcmp(text, L3_TAG, n) == 0)
        return 1; /* the tag, or a part of it */
    json_array_foreach (tools, i, t) {
        char head[96];
        const char *name = tool_name(t);
        if (!ct_llama3_builtin(CHAT_TOOLS_LLAMA3, name))
            continue;
        snprintf(head, sizeof head, "%s.call(", name);
        n = len < strlen(head) ? len : strlen(head);
        if (memcmp(text, head, n) == 0)
            return 1;
    }
    return 0;
}

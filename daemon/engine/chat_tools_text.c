/* chat_tools_text: the text pieces every tool renderer and the parser share: Python's json.dumps, the calls of an assistant message, Jinja's trim, the request's tools, one call read from JSON. */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ct_py_string(chat_buf_t *b, const char *s, size_t n)
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
void ct_py_dump(chat_buf_t *b, const json_t *v, int indent, int d)
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
            ct_py_string(b, k, strlen(k));
            chat_put(b, ": ", 2);
            ct_py_dump(b, x, indent, d + 1);
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
            ct_py_dump(b, x, indent, d + 1);
        }
        if (json_array_size(v))
            py_nl(b, indent, d);
        chat_put(b, "]", 1);
        break;
    }
    case JSON_STRING: ct_py_string(b, json_string_value(v), json_string_length(v)); break;
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
    ct_py_dump(&b, v, -1, 0);
    return chat_done(&b);
}

/* A call's {name, arguments} from one OpenAI tool_calls entry (its function object, or the
 * entry itself); the arguments as a JSON value: a string that parses is parsed (OpenAI sends
 * text, the template wants the object), else the value as given. New reference or NULL. */
json_t *ct_call_args(const json_t *call, const char **name)
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
void ct_put_call(chat_buf_t *b, const json_t *call)
{
    const char *name = NULL;
    json_t *args = ct_call_args(call, &name);
    chat_puts(b, "{\"name\": \"");
    chat_puts(b, name ? name : "");
    chat_puts(b, "\", \"arguments\": ");
    char *s = args ? chat_tools_pyjson(args) : NULL;
    chat_puts(b, s ? s : "{}");
    free(s);
    json_decref(args);
    chat_put(b, "}", 1);
}

/* Python's str.strip() whitespace (ASCII: the Unicode spaces beyond it are not trimmed). */
static int py_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* s as Jinja's |trim writes it (NULL: ""). */
void ct_put_trimmed(chat_buf_t *b, const char *s)
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

/* The tool object's function (OpenAI: {"type": "function", "function": {...}}). */
const json_t *ct_tool_fn(const json_t *tool)
{
    return json_object_get(tool, "function");
}

const json_t *ct_tool_named(const json_t *tools, const char *name)
{
    size_t i;
    const json_t *t;
    json_array_foreach (tools, i, t) {
        const char *nm = json_string_value(json_object_get(ct_tool_fn(t), "name"));
        if (nm && name && strcmp(nm, name) == 0)
            return t;
    }
    return NULL;
}

/* One call from JSON text (n bytes): {id, type, function: {name, arguments}} when it is an
 * object with a string name among the tools and an object under key ("arguments", Llama 3's
 * "parameters"); else NULL. */
json_t *ct_call_of(const char *s, size_t n, const json_t *tools, const char *key, const char *id)
{
    json_t *o = json_loadb(s, n, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "name"));
    const json_t *args = json_object_get(o, key);
    json_t *call = NULL;
    if (name && json_is_object(args) && ct_tool_named(tools, name)) {
        /* the arguments as written, spaces outside strings left out (as streamed) */
        ct_scan_t sc;
        size_t i = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
            i++;
        ct_call_scan(s, n, i, key, &sc);
        chat_buf_t raw = {0};
        if (sc.state == 1 && sc.args == 2)
            ct_json_compact(&raw, s + sc.a0, sc.a1 - sc.a0);
        char *a = sc.state == 1 && sc.args == 2 ? chat_done(&raw) : json_dumps(args, JSON_COMPACT);
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
char *ct_trimmed(const chat_buf_t *b)
{
    size_t s = 0, e = b->len;
    while (s < e && is_ws(b->p[s]))
        s++;
    while (e > s && is_ws(b->p[e - 1]))
        e--;
    return strndup(b->p ? b->p + s : "", e - s);
}

/* chat_tools_json: the JSON scanning the tool-call parser and stream share: a value's end, a call object's parts and arguments text, read as the model writes them (maybe cut off). */
#include "engine/chat_buf.h"
#include "engine/chat_tools_int.h"

#include <string.h>

/* ------------------------------------------------------------------ JSON scanning */

size_t ct_json_ws(const char *s, size_t len, size_t i)
{
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* The end of the string whose opening quote is at i (past its closing quote). */
static size_t skip_string(const char *s, size_t len, size_t i, int *st)
{
    for (i++; i < len; i++) {
        if (s[i] == '\\') {
            i++;
        } else if (s[i] == '"') {
            *st = 1;
            return i + 1;
        }
    }
    *st = 0;
    return len;
}

size_t ct_json_skip(const char *s, size_t len, size_t i, int *st)
{
    if (i >= len) {
        *st = 0;
        return len;
    }
    if (s[i] == '"')
        return skip_string(s, len, i, st);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < len) {
            char c = s[i];
            if (c == '"') {
                i = skip_string(s, len, i, st);
                if (!*st)
                    return len;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0) {
                *st = 1;
                return i + 1;
            }
            i++;
        }
        *st = 0;
        return len;
    }
    if (s[i] == '}' || s[i] == ']' || s[i] == ',' || s[i] == ':') {
        *st = -1;
        return i;
    }
    size_t b = i; /* a number, true, false or null: up to what ends it */
    while (i < len && !strchr(",]} \t\r\n", s[i]))
        i++;
    *st = i < len ? 1 : 0;
    return i > b ? i : (*st = -1, i);
}

void ct_json_compact(chat_buf_t *b, const char *s, size_t n)
{
    size_t i = 0, run = 0;
    while (i < n) {
        if (s[i] == '"') {
            int st;
            size_t e = skip_string(s, n, i, &st);
            i = e;
            continue;
        }
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
            chat_put(b, s + run, i - run);
            run = ++i;
            continue;
        }
        i++;
    }
    chat_put(b, s + run, n - run);
}

static int span_is(const char *s, size_t a, size_t e, const char *word)
{
    return e - a == strlen(word) && memcmp(s + a, word, e - a) == 0;
}

void ct_call_scan(const char *s, size_t len, size_t i, const char *key, ct_scan_t *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->state = -1;
    if (i >= len || s[i] != '{')
        return;
    for (i = ct_json_ws(s, len, i + 1);;) {
        int st;
        if (i < len && s[i] == '}') {
            sc->state = 1;
            sc->end = i + 1;
            return;
        }
        if (i < len && s[i] != '"')
            return;
        size_t k0 = i + 1, ke = skip_string(s, len, i, &st);
        if (!st || (i = ct_json_ws(s, len, ke)) >= len) {
            sc->state = 0;
            return;
        }
        if (s[i] != ':')
            return;
        size_t v = ct_json_ws(s, len, i + 1), ve = ct_json_skip(s, len, v, &st);
        int is_name = span_is(s, k0, ke - 1, "name"), is_args = span_is(s, k0, ke - 1, key);
        if (is_args) { /* the last one counts, as jansson keeps it */
            sc->a0 = v;
            sc->a1 = ve;
            sc->args = st == 1 ? 2 : 1;
            sc->name_first = sc->name1 > sc->name0;
        }
        if (st < 0)
            return;
        if (!st || v >= len) {
            sc->state = 0;
            return;
        }
        if (is_name) {
            sc->name0 = sc->name1 = 0;
            if (s[v] == '"' && !memchr(s + v + 1, '\\', ve - v - 2)) {
                sc->name0 = v + 1;
                sc->name1 = ve - 1;
            }
        }
        i = ct_json_ws(s, len, ve);
        if (i < len && s[i] == ',') {
            i = ct_json_ws(s, len, i + 1);
            continue;
        }
        if (i < len && s[i] != '}')
            return;
        if (i >= len) {
            sc->state = 0;
            return;
        }
    }
}

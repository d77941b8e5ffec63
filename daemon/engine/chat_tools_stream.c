/* chat_tools_stream: a generation's tool calls streamed as the model writes them (OpenAI's delta.tool_calls: a call's index, id, type and name first, then its arguments text as it grows; docs/TOOLS.md "Streaming"). */
#include "engine/chat_buf.h"
#include "engine/chat_tools.h"
#include "engine/chat_tools_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the stream */

/* A call whose deltas were sent. */
typedef struct ts_call {
    char id[96];
    char *name;      /* the function's name, owned */
    chat_buf_t sent; /* its arguments text sent so far (compact) */
} ts_call_t;

struct chat_tools_stream {
    chat_tools_style_t st;
    json_t *tools; /* a reference */
    int forced, parallel;
    size_t
        no_marker; /* bytes of the text known to hold no call marker (its search resumes there) */
    char prefix[64];
    ts_call_t *calls; /* (n) in index order */
    size_t n, cap;
};

chat_tools_stream_t *chat_tools_stream_new(chat_tools_style_t st, const json_t *tools, int forced,
                                           int parallel, const char *id_prefix)
{
    chat_tools_stream_t *ts = calloc(1, sizeof *ts);
    if (!ts)
        return NULL;
    ts->st = st;
    ts->tools = json_incref((json_t *)tools);
    ts->forced = forced;
    ts->parallel = parallel;
    snprintf(ts->prefix, sizeof ts->prefix, "%s", id_prefix ? id_prefix : "");
    return ts;
}

void chat_tools_stream_free(chat_tools_stream_t *ts)
{
    if (!ts)
        return;
    for (size_t i = 0; i < ts->n; i++) {
        free(ts->calls[i].name);
        free(ts->calls[i].sent.p);
    }
    free(ts->calls);
    json_decref(ts->tools);
    free(ts);
}

static void ts_id(const chat_tools_stream_t *ts, size_t index, char *out, size_t cap)
{
    if (ts->st == CHAT_TOOLS_MISTRAL || ts->st == CHAT_TOOLS_MISTRAL3) {
        char m[10];
        ct_mistral_id(ts->prefix, index, m);
        snprintf(out, cap, "%s", m);
    } else {
        snprintf(out, cap, "%s%zu", ts->prefix, index);
    }
}

/* Appends the delta that opens call index (arguments ""). */
static int delta_open(json_t *deltas, size_t index, const char *id, const char *name)
{
    return json_array_append_new(deltas, json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index",
                                                   (int)index, "id", id, "type", "function",
                                                   "function", "name", name, "arguments", ""));
}

/* Appends an arguments fragment (n bytes, whole UTF-8 characters) of call index. */
static int delta_args(json_t *deltas, size_t index, const char *frag, size_t n)
{
    json_t *s = json_stringn(frag, n);
    if (!s)
        return -1; /* not UTF-8: the end's parse decides */
    return json_array_append_new(
        deltas, json_pack("{s:i, s:{s:o}}", "index", (int)index, "function", "arguments", s));
}

/* How many of n bytes end on a whole UTF-8 character. */
static size_t utf8_whole(const char *p, size_t n)
{
    size_t i = n;
    while (i > 0 && ((unsigned char)p[i - 1] & 0xC0) == 0x80 && n - i < 3)
        i--;
    if (i == 0)
        return n;
    unsigned char c = (unsigned char)p[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return n - (i - 1) >= need ? n : i - 1;
}

/* Call k's region scanned in sc: opens it (its name known, before its arguments) and sends its
 * arguments text written since the last time. 0, or -1 when it cannot open (yet or ever). */
static int ts_call_feed(chat_tools_stream_t *ts, const char *text, size_t len, size_t k,
                        const ct_scan_t *sc, json_t *deltas)
{
    if (k == ts->n) {
        if (!sc->args || !sc->name_first || (!ts->parallel && k > 0))
            return -1;
        char *name = strndup(text + sc->name0, sc->name1 - sc->name0);
        if (!name || !ct_tool_named(ts->tools, name)) {
            free(name);
            return -1;
        }
        if (ts->n == ts->cap) {
            size_t nc = ts->cap ? ts->cap * 2 : 4;
            ts_call_t *nw = realloc(ts->calls, nc * sizeof *nw);
            if (!nw) {
                free(name);
                return -1;
            }
            ts->calls = nw;
            ts->cap = nc;
        }
        ts_call_t *c = &ts->calls[ts->n++];
        memset(c, 0, sizeof *c);
        c->name = name;
        ts_id(ts, k, c->id, sizeof c->id);
        delta_open(deltas, k, c->id, name);
    }
    ts_call_t *c = &ts->calls[k];
    chat_buf_t now = {0};
    ct_json_compact(&now, text + sc->a0, (sc->args == 2 ? sc->a1 : len) - sc->a0);
    size_t upto = utf8_whole(now.p ? now.p : "", now.len);
    if (!now.oom && upto > c->sent.len &&
        memcmp(now.p, c->sent.p ? c->sent.p : "", c->sent.len) == 0 &&
        delta_args(deltas, k, now.p + c->sent.len, upto - c->sent.len) == 0)
        chat_put(&c->sent, now.p + c->sent.len, upto - c->sent.len);
    free(now.p);
    return 0;
}

/* Where the first call marker mk starts in text, or len: searched from where the last search
 * left off (the text only grows), so a long answer is not searched again at every token. */
static size_t ts_first_marker(chat_tools_stream_t *ts, const char *mk, const char *text, size_t len)
{
    size_t ml = strlen(mk), from = ts->no_marker < len ? ts->no_marker : 0;
    const char *o = memmem(text + from, len - from, mk, ml);
    if (o)
        return (size_t)(o - text);
    ts->no_marker = len >= ml ? len - ml + 1 : 0;
    return len;
}

/* The first tool-call region at or after i in free generation, per style: where its call object
 * (or list) starts, or len when none (yet). */
static size_t ts_region(chat_tools_stream_t *ts, const char *text, size_t len, size_t i)
{
    const char *mk = chat_tools_marker(ts->st);
    if (ts->forced && i == 0)
        return ct_json_ws(text, len, 0);
    if ((ts->forced && (!ts->parallel || chat_tools_listed(ts->st))) ||
        chat_tools_is_llama3(ts->st) || !mk)
        return i == 0 ? ct_json_ws(text, len, 0) : len; /* one call, the whole output */
    size_t o = i == 0 ? ts_first_marker(ts, mk, text, len) : len;
    if (i > 0) {
        const char *p = memmem(text + i, len - i, mk, strlen(mk));
        o = p ? (size_t)(p - text) : len;
    }
    return o < len ? ct_json_ws(text, len, o + strlen(mk)) : len;
}

/* Sends what the calls written in text so far add to the stream. */
static void ts_calls_feed(chat_tools_stream_t *ts, const char *text, size_t len, json_t *deltas)
{
    const char *key = chat_tools_is_llama3(ts->st) ? "parameters" : "arguments";
    int listed = chat_tools_listed(ts->st);
    size_t i = ts_region(ts, text, len, 0), k = 0;
    if (listed) { /* one list: [call, call...] */
        if (i >= len || text[i] != '[')
            return;
        i = ct_json_ws(text, len, i + 1);
    }
    while (i < len && text[i] == '{') {
        ct_scan_t sc;
        ct_call_scan(text, len, i, key, &sc);
        if (sc.state < 0 || ts_call_feed(ts, text, len, k++, &sc, deltas) || sc.state == 0)
            return;
        if (!listed) {
            i = ts_region(ts, text, len, sc.end);
            continue;
        }
        i = ct_json_ws(text, len, sc.end);
        if (i >= len || text[i] != ',')
            return;
        i = ct_json_ws(text, len, i + 1);
    }
}

/* Where content must stop short for tool calls: all of a forced call's output, and auto's text
 * from the first call marker on (or a tail that may still become one); Llama 3's whole output
 * while it may still be a call (spaces, or "{" first). */
static size_t ts_content_cut(chat_tools_stream_t *ts, const char *text, size_t len)
{
    const char *mk = chat_tools_marker(ts->st);
    if (ts->forced)
        return 0;
    if (chat_tools_is_llama3(ts->st)) { /* "{", or a built-in call's tag or name.call( */
        size_t i = ct_json_ws(text, len, 0);
        return i == len || text[i] == '{' ||
                       (ts->st == CHAT_TOOLS_LLAMA3 &&
                        ct_llama3_may_call(text + i, len - i, ts->tools))
                   ? 0
                   : len;
    }
    if (!mk)
        return len;
    size_t o = ts_first_marker(ts, mk, text, len);
    if (o < len)
        return o;
    for (size_t k = strlen(mk) - 1; k > 0; k--) /* a tail that opens a marker */
        if (len >= k && memcmp(text + len - k, mk, k) == 0)
            return len - k;
    return len;
}

size_t chat_tools_stream_feed(chat_tools_stream_t *ts, const char *text, size_t len,
                              json_t **deltas)
{
    json_t *d = json_array();
    *deltas = NULL;
    if (d && text)
        ts_calls_feed(ts, text, len, d);
    if (json_array_size(d))
        *deltas = d;
    else
        json_decref(d);
    return text ? ts_content_cut(ts, text, len) : 0;
}

/* Sends final call c (of the end's parse) as call index: what its arguments add to what was sent
 * (the whole call when it was not opened); its id becomes the streamed one. */
static int ts_call_end(chat_tools_stream_t *ts, json_t *c, size_t index, int opened, json_t *deltas)
{
    char id[96];
    json_t *fn = json_object_get(c, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    size_t n = args ? strlen(args) : 0, from = 0;
    if (opened) {
        snprintf(id, sizeof id, "%s", ts->calls[index].id);
        from = ts->calls[index].sent.len;
    } else {
        ts_id(ts, index, id, sizeof id);
        if (delta_open(deltas, index, id, json_string_value(json_object_get(fn, "name"))))
            return -1;
    }
    if (n > from && delta_args(deltas, index, args + from, n - from))
        return -1;
    return json_object_set_new(c, "id", json_string(id));
}

int chat_tools_stream_end(chat_tools_stream_t *ts, const char *text, json_t **calls, char **content,
                          json_t **deltas)
{
    *deltas = NULL;
    int n = chat_tools_parse(ts->st, text ? text : "", ts->tools, ts->forced, ts->parallel,
                             ts->prefix, calls, content);
    if (n <= 0)
        return n;
    json_t *d = json_array();
    size_t j = 0, next = ts->n;
    for (size_t i = 0; d && i < (size_t)n; i++) {
        json_t *c = json_array_get(*calls, i);
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        /* an opened call the parse did not take (half-written, invalid) keeps its index */
        while (j < ts->n && (strcmp(ts->calls[j].name, name) != 0 ||
                             strncmp(args, ts->calls[j].sent.p ? ts->calls[j].sent.p : "",
                                     ts->calls[j].sent.len) != 0))
            j++;
        int opened = j < ts->n;
        if (ts_call_end(ts, c, opened ? j++ : next++, opened, d)) {
            json_decref(d);
            d = NULL;
        }
    }
    if (!d) {
        json_decref(*calls);
        free(*content);
        *calls = NULL;
        *content = NULL;
        return -1;
    }
    if (json_array_size(d))
        *deltas = d;
    else
        json_decref(d);
    return n;
}

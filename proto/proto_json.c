/* proto_json: the JSON text helpers of the socket codec: UTF-8-safe strings, ids, times, one answer line out and one request line in (depth-checked). */
#include "proto.h"
#include "proto_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Writes a message into err (when given) and returns -code. */
int proto_fail(char *err, size_t errlen, proto_err_t code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -(int)code;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid
 * (overlong, surrogate, above U+10FFFF, truncated). */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* A JSON string of s (NULL = ""); invalid UTF-8 bytes become U+FFFD. NULL on OOM. */
json_t *proto_str_new(const char *s)
{
    if (!s)
        s = "";
    json_t *j = json_string(s);
    if (j)
        return j;
    size_t n = strlen(s);
    char *buf = malloc(n * 3 + 1);
    if (!buf)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq_len(u + i, n - i);
        if (l) {
            memcpy(buf + o, u + i, l);
            o += l;
            i += l;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = '\0';
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

/* A copy of id for an answer (null when absent). */
json_t *proto_id_new(const json_t *id)
{
    return id ? json_deep_copy(id) : json_null();
}

/* Sets key in obj to v (stolen); returns -1 when v is NULL or the set fails. */
int proto_set_new(json_t *obj, const char *key, json_t *v)
{
    if (!v)
        return -1;
    return json_object_set_new(obj, key, v);
}

/* A time in ms rounded to 3 decimals; non-finite values become 0 (json_real refuses them). */
json_t *proto_ms_new(double ms)
{
    if (!isfinite(ms))
        ms = 0.0;
    return json_real(round(ms * 1000.0) / 1000.0);
}

typedef struct linebuf {
    char *buf;
    size_t len, cap;
} linebuf_t;

static int linebuf_put(const char *data, size_t size, void *arg)
{
    linebuf_t *lb = arg;
    if (lb->len + size + 2 > lb->cap) {
        size_t cap = lb->cap ? lb->cap : 256;
        while (lb->len + size + 2 > cap)
            cap *= 2;
        char *nb = realloc(lb->buf, cap);
        if (!nb)
            return -1;
        lb->buf = nb;
        lb->cap = cap;
    }
    memcpy(lb->buf + lb->len, data, size);
    lb->len += size;
    return 0;
}

/* Dumps root as one compact line with '\n' and releases root (NULL root = OOM upstream). */
char *proto_line_finish(json_t *root)
{
    if (!root)
        return NULL;
    linebuf_t lb = {0};
    int rc = json_dump_callback(root, linebuf_put, &lb, PROTO_DUMP_FLAGS);
    json_decref(root);
    if (rc != 0 || !lb.buf) {
        free(lb.buf);
        return NULL;
    }
    lb.buf[lb.len++] = '\n';
    lb.buf[lb.len] = '\0';
    return lb.buf;
}

/* 0 when no bracket in line[0..len) is nested deeper than PROTO_MAX_DEPTH
 * (outside strings), so jansson never recurses far on hostile input. */
static int depth_ok(const char *line, size_t len)
{
    int depth = 0, in_str = 0, esc = 0;
    for (size_t i = 0; i < len; i++) {
        char c = line[i];
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > PROTO_MAX_DEPTH)
                return 0;
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    return 1;
}

/* Parses line as one JSON value; NULL with the error in err. */
json_t *proto_load_line(const char *line, size_t len, size_t flags, int *rc, char *err,
                        size_t errlen)
{
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
        i++;
    if (i == len) {
        *rc = proto_fail(err, errlen, PROTO_E_BAD_JSON, "empty line");
        return NULL;
    }
    if (!depth_ok(line, len)) {
        *rc = proto_fail(err, errlen, PROTO_E_BAD_REQUEST, "JSON nested deeper than %d levels",
                         PROTO_MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(line, len, flags | JSON_DECODE_ANY, &je);
    if (!root) {
        *rc = proto_fail(err, errlen, PROTO_E_BAD_JSON, "invalid JSON at byte %d: %s", je.position,
                         je.text);
        return NULL;
    }
    return root;
}

/* cons_schema: compiles a response_format (json_object, or a JSON schema's supported subset) into
 * the node table the byte automaton follows; a part it cannot enforce is refused by its pointer. */
#include "engine/cons_int.h"

#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ compile context */

typedef struct cref {
    char *ref;    /* "#/$defs/x" as written */
    int32_t node; /* the node standing for it */
} cref_t;

typedef struct cctx {
    cons_schema_t *sc;
    const json_t *root; /* the schema document ($ref targets are found in it) */
    cref_t *refs;       /* (n_refs) */
    size_t n_refs;
    int depth; /* recursion guard */
    int code;  /* CONS_ERR_* once failed */
    char *err;
    size_t errlen;
} cctx_t;

#define MAX_RECURSION 64
#define PATH_BYTES 512

static int32_t fail(cctx_t *x, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records the first failure: "<pointer>: <reason>"; returns -1. */
static int32_t fail(cctx_t *x, int code, const char *path, const char *fmt, ...)
{
    if (x->code)
        return -1;
    x->code = code;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(x->err, x->errlen, "%s: %s", *path ? path : "/", why);
    return -1;
}

/* path + "/" + key with JSON pointer escapes (~0, ~1), truncated to fit out. */
static void path_join(char *out, const char *path, const char *key)
{
    size_t n = (size_t)snprintf(out, PATH_BYTES, "%s/", path);
    for (const char *k = key; *k && n + 3 < PATH_BYTES; k++) {
        if (*k == '~' || *k == '/') {
            out[n++] = '~';
            out[n++] = *k == '~' ? '0' : '1';
        } else
            out[n++] = *k;
    }
    out[n < PATH_BYTES ? n : PATH_BYTES - 1] = 0;
}

static void path_index(char *out, const char *path, const char *key, size_t i)
{
    snprintf(out, PATH_BYTES, "%s/%s/%zu", path, key, i);
}

/* Grows an array of elem-byte items to hold one more; -1 on OOM. */
static int grow(void **arr, uint32_t n, uint32_t *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    uint32_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

static int32_t node_new(cctx_t *x, cons_kind_t kind, const char *path)
{
    cons_schema_t *sc = x->sc;
    if (sc->n_nodes >= CONS_MAX_NODES)
        return fail(x, CONS_ERR_UNSUPPORTED, path, "the schema needs more than %d nodes",
                    CONS_MAX_NODES);
    if (grow((void **)&sc->nodes, sc->n_nodes, &sc->cap_nodes, sizeof *sc->nodes))
        return fail(x, CONS_ERR_NOMEM, path, "out of memory");
    sc->nodes[sc->n_nodes] = (cons_node_t){.kind = kind,
                                           .hi = CONS_UNBOUNDED,
                                           .item = -1,
                                           .ready = 1,
                                           .min = INT64_MIN,
                                           .max = INT64_MAX,
                                           .re = -1};
    return (int32_t)sc->n_nodes++;
}

static void set_bit(uint32_t *set, unsigned c)
{
    set[c >> 5] |= 1u << (c & 31);
}

/* A node of a scalar or container kind with its opening bytes. */
static int32_t node_kind(cctx_t *x, cons_kind_t kind, const char *path)
{
    int32_t i = node_new(x, kind, path);
    if (i < 0)
        return -1;
    uint32_t *st = x->sc->nodes[i].start;
    switch (kind) {
    case CK_OBJECT: set_bit(st, '{'); break;
    case CK_ARRAY: set_bit(st, '['); break;
    case CK_STRING: set_bit(st, '"'); break;
    case CK_NUMBER:
    case CK_INTEGER:
        set_bit(st, '-');
        for (unsigned c = '0'; c <= '9'; c++)
            set_bit(st, c);
        break;
    case CK_ANYOF:
    case CK_LITS: break;
    }
    return i;
}

/* A literal set node from n JSON values; each is dumped compact, duplicates dropped. */
static int32_t node_lits(cctx_t *x, json_t *const *vals, size_t n, const char *path)
{
    if (n == 0)
        return fail(x, CONS_ERR_UNSUPPORTED, path, "no value is allowed");
    if (n > CONS_MAX_LITS)
        return fail(x, CONS_ERR_UNSUPPORTED, path, "more than %d values are not supported",
                    CONS_MAX_LITS);
    int32_t id = node_kind(x, CK_LITS, path);
    if (id < 0)
        return -1;
    cons_schema_t *sc = x->sc;
    sc->nodes[id].first = sc->n_lits;
    for (size_t i = 0; i < n; i++) {
        char *t = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
        if (!t || grow((void **)&sc->lits, sc->n_lits, &sc->cap_lits, sizeof *sc->lits)) {
            free(t);
            return fail(x, CONS_ERR_NOMEM, path, "out of memory");
        }
        int dup = 0;
        for (uint32_t j = sc->nodes[id].first; j < sc->n_lits; j++)
            dup |= strcmp(sc->lits[j].text, t) == 0;
        if (dup) {
            free(t);
            continue;
        }
        sc->lits[sc->n_lits++] = (cons_lit_t){.text = t, .len = (uint32_t)strlen(t)};
        set_bit(sc->nodes[id].start, (uint8_t)t[0]);
    }
    sc->nodes[id].n = sc->n_lits - sc->nodes[id].first;
    return id;
}

/* An anyOf node over kids (n of them), refused unless their first bytes are disjoint. */
static int32_t node_anyof(cctx_t *x, const int32_t *kids, size_t n, const char *path)
{
    cons_schema_t *sc = x->sc;
    uint32_t seen[8] = {0};
    for (size_t i = 0; i < n; i++) {
        const cons_node_t *k = &sc->nodes[kids[i]];
        if (!k->ready)
            return fail(x, CONS_ERR_UNSUPPORTED, path,
                        "a branch refers back to the anyOf itself: recursive unions are not "
                        "supported");
        for (unsigned w = 0; w < 8; w++)
            if (seen[w] & k->start[w]) {
                unsigned c = w * 32 + (unsigned)__builtin_ctz(seen[w] & k->start[w]);
                return fail(x, CONS_ERR_UNSUPPORTED, path,
                            "branch %zu can begin with '%c' like an earlier one: only branches "
                            "told apart by their first byte (different JSON types) are supported",
                            i, c >= 0x20 && c < 0x7f ? (int)c : '?');
            } else
                seen[w] |= k->start[w];
    }
    int32_t id = node_kind(x, CK_ANYOF, path);
    if (id < 0)
        return -1;
    sc->nodes[id].first = sc->n_kids;
    sc->nodes[id].n = (uint32_t)n;
    memcpy(sc->nodes[id].start, seen, sizeof seen);
    for (size_t i = 0; i < n; i++) {
        if (grow((void **)&sc->kids, sc->n_kids, &sc->cap_kids, sizeof *sc->kids))
            return fail(x, CONS_ERR_NOMEM, path, "out of memory");
        sc->kids[sc->n_kids++] = (uint32_t)kids[i];
    }
    return id;
}

/* The any-value node (json_object's values, the empty schema), built once per schema. */
static int32_t node_any(cctx_t *x)
{
    cons_schema_t *sc = x->sc;
    if (sc->any >= 0)
        return sc->any;
    int32_t k[5];
    if ((k[0] = node_kind(x, CK_OBJECT, "")) < 0 || (k[1] = node_kind(x, CK_ARRAY, "")) < 0 ||
        (k[2] = node_kind(x, CK_STRING, "")) < 0 || (k[3] = node_kind(x, CK_NUMBER, "")) < 0)
        return -1;
    json_t *v[3] = {json_true(), json_false(), json_null()};
    if ((k[4] = node_lits(x, v, 3, "")) < 0)
        return -1;
    int32_t a = node_anyof(x, k, 5, "");
    if (a < 0)
        return -1;
    sc->nodes[k[0]].item = a;
    sc->nodes[k[1]].item = a;
    sc->any = a;
    return a;
}

/* ------------------------------------------------------------------ keywords */

/* Keywords that say nothing about the value (or are read elsewhere: the definitions where a
 * $ref finds them, nullable in compile(), an identifier at the root in check_keywords): allowed
 * everywhere. */
static const char *const annotations[] = {
    "title",      "description",     "default",          "examples",      "$schema",     "$comment",
    "deprecated", "readOnly",        "writeOnly",        "$defs",         "definitions", "nullable",
    "$anchor",    "contentEncoding", "contentMediaType", "contentSchema",
};
/* Keywords the compiler enforces. */
static const char *const enforced[] = {
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "uniqueItems",
    "minProperties",
    "dependencies",
    "dependentRequired",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "pattern",
    "format",
};
/* The other keywords of JSON Schema (drafts 3 to 2020-12) that constrain a value: refused, since
 * an output that ignored them could be invalid. A keyword in none of the three lists is not JSON
 * Schema ("x-...", Snowplow's "self"): validators ignore it, and so does the compiler. */
static const char *const refused[] = {
    "patternProperties",
    "propertyNames",
    "multipleOf",
    "divisibleBy",
    "maxProperties",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "additionalItems",
    "extends",
    "disallow",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
};

static int in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return 1;
    return 0;
}

#define IN(k, list) in_list(k, list, sizeof list / sizeof list[0])

/* Refuses the first keyword of s that is neither enforced nor an annotation; and, when only is
 * set, any enforced keyword but only (a $ref or a union must stand alone). */
static int check_keywords(cctx_t *x, const json_t *s, const char *only, const char *path)
{
    const char *k;
    json_t *v;
    char p[PATH_BYTES];
    json_object_foreach ((json_t *)s, k, v) {
        if (IN(k, annotations))
            continue;
        path_join(p, path, k);
        if (!strcmp(k, "$id") || (!strcmp(k, "id") && json_is_string(v))) { /* draft 4: "id" */
            if (*path) /* below the root it would change what a "#/..." $ref resolves against */
                return (int)fail(x, CONS_ERR_UNSUPPORTED, p, "'%s' below the root is not supported",
                                 k);
            continue;
        }
        if (IN(k, refused))
            return (int)fail(x, CONS_ERR_UNSUPPORTED, p, "keyword '%s' is not supported", k);
        if (!IN(k, enforced))
            continue; /* not JSON Schema */
        if (only && strcmp(k, only) != 0 && !(strcmp(k, "type") == 0 && strcmp(only, "$ref") != 0))
            return (int)fail(x, CONS_ERR_UNSUPPORTED, p,
                             "keyword '%s' beside '%s' is not supported", k, only);
    }
    return 0;
}

/* A count keyword (minItems ...) into *out: absent leaves it; above CONS_MAX_COUNT a maximum is
 * unbounded and a minimum refused. */
static int count_kw(cctx_t *x, const json_t *s, const char *kw, int is_max, uint32_t *out,
                    const char *path)
{
    json_t *v = json_object_get(s, kw);
    if (!v)
        return 0;
    char p[PATH_BYTES];
    path_join(p, path, kw);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return (int)fail(x, CONS_ERR_FORMAT, p, "must be a non-negative integer");
    json_int_t n = json_integer_value(v);
    if (n > CONS_MAX_COUNT) {
        if (!is_max)
            return (int)fail(x, CONS_ERR_UNSUPPORTED, p, "minimums above %d are not supported",
                             CONS_MAX_COUNT);
        *out = CONS_UNBOUNDED;
        return 0;
    }
    *out = (uint32_t)n;
    return 0;
}

static int bounds(cctx_t *x, const json_t *s, const char *lo_kw, const char *hi_kw, int32_t id,
                  const char *path)
{
    cons_node_t *n = &x->sc->nodes[id];
    uint32_t lo = 0, hi = CONS_UNBOUNDED;
    if (count_kw(x, s, lo_kw, 0, &lo, path) || count_kw(x, s, hi_kw, 1, &hi, path))
        return -1;
    if (lo > hi)
        return (int)fail(x, CONS_ERR_UNSUPPORTED, path, "%s %u is above %s %u: no value fits",
                         lo_kw, lo, hi_kw, hi);
    n->lo = lo;
    n->hi = hi;
    return 0;
}

/* ------------------------------------------------------------------ schemas */

static int32_t compile(cctx_t *x, const json_t *s, const char *path);

/* dependencies (draft 4 to 7; dependentRequired from 2019-09) naming properties: every property
 * named becomes required, so it is there whenever the property that needs it is. The schema form
 * is refused. */
static int dependencies(cctx_t *x, const json_t *s, int32_t id, const char *path)
{
    static const char *const kws[] = {"dependencies", "dependentRequired"};
    const cons_node_t *n = &x->sc->nodes[id];
    char p[PATH_BYTES], q[PATH_BYTES];
    for (size_t w = 0; w < 2; w++) {
        const json_t *d = json_object_get(s, kws[w]), *v;
        const char *k;
        path_join(p, path, kws[w]);
        if (d && !json_is_object(d))
            return (int)fail(x, CONS_ERR_FORMAT, p, "must be an object");
        json_object_foreach ((json_t *)d, k, v) {
            path_join(q, p, k);
            if (!json_is_array(v))
                return (int)fail(x, CONS_ERR_UNSUPPORTED, q,
                                 "schema dependencies are not supported");
            size_t i;
            const json_t *name;
            json_array_foreach (v, i, name) {
                char *key = json_is_string(name) ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
                uint32_t j = 0;
                while (key && j < n->n && strcmp(x->sc->props[n->first + j].key, key) != 0)
                    j++;
                free(key);
                if (!key || j == n->n)
                    return (int)fail(x, CONS_ERR_UNSUPPORTED, q,
                                     "a dependency on a property that is not declared");
                x->sc->props[n->first + j].required = 1;
            }
        }
    }
    return 0;
}

/* minProperties k over declared properties: the first optional ones become required until k are
 * (a document with them has at least k); more than are declared is refused. */
static int min_properties(cctx_t *x, const json_t *s, int32_t id, const char *path)
{
    const json_t *v = json_object_get(s, "minProperties");
    char p[PATH_BYTES];
    path_join(p, path, "minProperties");
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return (int)fail(x, CONS_ERR_FORMAT, p, "must be a non-negative integer");
    const cons_node_t *n = &x->sc->nodes[id];
    json_int_t want = json_integer_value(v), have = 0;
    for (uint32_t j = 0; j < n->n; j++)
        have += x->sc->props[n->first + j].required;
    for (uint32_t j = 0; j < n->n && have < want; j++)
        if (!x->sc->props[n->first + j].required) {
            x->sc->props[n->first + j].required = 1;
            have++;
        }
    if (have < want)
        return (int)fail(x, CONS_ERR_UNSUPPORTED, p,
                         "%lld properties, more than the declared ones, are not supported",
                         (long long)want);
    return 0;
}

static int32_t compile_object(cctx_t *x, const json_t *s, const char *path)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    char p[PATH_BYTES], q[PATH_BYTES];
    if (props && !json_is_object(props))
        return fail(x, CONS_ERR_FORMAT, path, "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail(x, CONS_ERR_FORMAT, path, "'required' must be an array");
    size_t np = props ? json_object_size(props) : 0;
    if (np > CONS_MAX_LITS)
        return fail(x, CONS_ERR_UNSUPPORTED, path, "more than %d properties are not supported",
                    CONS_MAX_LITS);
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        path_index(p, path, "required", i);
        if (!r)
            return fail(x, CONS_ERR_FORMAT, p, "must be a string");
        if (!props || !json_object_get(props, r))
            return fail(x, CONS_ERR_UNSUPPORTED, p, "'%s' is required but not among the properties",
                        r);
    }
    int32_t id = node_kind(x, CK_OBJECT, path);
    if (id < 0)
        return -1;
    if (!props) { /* a map: any key, values of additionalProperties (any when absent or true) */
        int32_t item = -1;
        path_join(p, path, "additionalProperties");
        if (!addl || json_is_true(addl))
            item = node_any(x);
        else if (json_is_object(addl))
            item = compile(x, addl, p);
        else if (!json_is_false(addl))
            return fail(x, CONS_ERR_FORMAT, p, "must be a boolean or a schema");
        if (item < 0 && !json_is_false(addl))
            return -1;
        x->sc->nodes[id].item = item;
        return dependencies(x, s, id, path) || min_properties(x, s, id, path) ? -1 : id;
    }
    const char *k;
    json_t *v;
    uint32_t first = x->sc->n_props;
    path_join(q, path, "properties");
    json_object_foreach ((json_t *)props, k, v) {
        cons_schema_t *sc = x->sc;
        if (grow((void **)&sc->props, sc->n_props, &sc->cap_props, sizeof *sc->props))
            return fail(x, CONS_ERR_NOMEM, path, "out of memory");
        json_t *ks = json_string(k);
        char *key = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!key)
            return fail(x, CONS_ERR_NOMEM, path, "out of memory");
        int required = 0;
        for (size_t i = 0; req && i < json_array_size(req); i++)
            required |= strcmp(json_string_value(json_array_get(req, i)), k) == 0;
        sc->props[sc->n_props++] = (cons_prop_t){
            .key = key, .len = (uint32_t)strlen(key), .node = -1, .required = required};
    }
    /* values after the keys: compiling them may add properties of nested objects */
    uint32_t j = 0;
    json_object_foreach ((json_t *)props, k, v) {
        path_join(p, q, k);
        int32_t vn = compile(x, v, p);
        if (vn < 0)
            return -1;
        x->sc->props[first + j++].node = vn;
    }
    x->sc->nodes[id].first = first;
    x->sc->nodes[id].n = (uint32_t)np;
    return dependencies(x, s, id, path) || min_properties(x, s, id, path) ? -1 : id;
}

static int32_t compile_array(cctx_t *x, const json_t *s, const char *path)
{
    const json_t *items = json_object_get(s, "items");
    const json_t *uniq = json_object_get(s, "uniqueItems");
    char p[PATH_BYTES];
    int32_t id = node_kind(x, CK_ARRAY, path);
    if (id < 0 || bounds(x, s, "minItems", "maxItems", id, path))
        return -1;
    if (uniq && !json_is_boolean(uniq)) {
        path_join(p, path, "uniqueItems");
        return fail(x, CONS_ERR_FORMAT, p, "must be a boolean");
    }
    if (json_is_true(uniq)) { /* at most one item: unique whatever it is */
        path_join(p, path, "uniqueItems");
        if (x->sc->nodes[id].lo > 1)
            return fail(x, CONS_ERR_UNSUPPORTED, p,
                        "unique items beside minItems above 1 are not supported");
        x->sc->nodes[id].hi = 1;
    }
    path_join(p, path, "items");
    if (items && json_is_array(items))
        return fail(x, CONS_ERR_UNSUPPORTED, p, "tuple items are not supported");
    int32_t item = items ? compile(x, items, p) : node_any(x);
    if (item < 0)
        return -1;
    x->sc->nodes[id].item = item;
    return id;
}

static const char *const num_bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};

/* The first numeric bound keyword of s, or NULL. */
static const char *num_bound_of(const json_t *s)
{
    for (size_t i = 0; i < 4; i++)
        if (json_object_get(s, num_bounds[i]))
            return num_bounds[i];
    return NULL;
}

/* The first keyword of s that constrains only values of one type (a numeric bound, pattern,
 * format), or NULL: beside no "type" or beside an enum it is refused (neither is checked). */
static const char *typed_only_of(const json_t *s)
{
    const char *b = num_bound_of(s);
    return b                               ? b
           : json_object_get(s, "pattern") ? "pattern"
           : json_object_get(s, "format")  ? "format"
                                           : NULL;
}

/* A string node's pattern, from "pattern" or a "format" it knows (not both). */
static int string_pattern(cctx_t *x, const json_t *s, int32_t id, const char *path)
{
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    char p[PATH_BYTES], why[160];
    if (!pat && !fmt)
        return 0;
    path_join(p, path, pat ? "pattern" : "format");
    if (pat && fmt)
        return (int)fail(x, CONS_ERR_UNSUPPORTED, p, "'pattern' beside 'format' is not supported");
    const char *text = json_string_value(pat ? pat : fmt);
    if (!text)
        return (int)fail(x, CONS_ERR_FORMAT, p, "must be a string");
    const char *re = pat ? text : cons_re_format(text);
    if (!re)
        return (int)fail(x, CONS_ERR_UNSUPPORTED, p,
                         "format '%s' is not supported (date, time, date-time, email, hostname, "
                         "ipv4, uuid, uri are)",
                         text);
    cons_schema_t *sc = x->sc;
    if (grow((void **)&sc->res, sc->n_res, &sc->cap_res, sizeof *sc->res))
        return (int)fail(x, CONS_ERR_NOMEM, p, "out of memory");
    if (cons_re_compile(re, &sc->res[sc->n_res], why, sizeof why))
        return (int)fail(x, CONS_ERR_UNSUPPORTED, p, "%s", why);
    sc->nodes[id].re = (int32_t)sc->n_res++;
    return 0;
}

/* An integer node's bounds from minimum, maximum and their exclusive forms (draft 4's booleans or
 * the later numbers), as the integers they admit, clamped to the digit limit. */
static int int_bounds(cctx_t *x, const json_t *s, int32_t id, const char *path)
{
    const double lim = 999999999999999.0; /* CONS_INT_DIGITS nines */
    double lo = -lim, hi = lim;
    char p[PATH_BYTES];
    for (size_t i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, num_bounds[i]);
        path_join(p, path, num_bounds[i]);
        if (!v)
            continue;
        int excl = i >= 2, upper = i % 2;
        double b;
        if (excl && json_is_boolean(v)) { /* draft 4: modifies minimum / maximum */
            const json_t *m = json_object_get(s, num_bounds[i - 2]);
            if (!json_is_true(v))
                continue;
            if (!json_is_number(m))
                return (int)fail(x, CONS_ERR_FORMAT, p, "true needs '%s'", num_bounds[i - 2]);
            b = json_number_value(m);
        } else if (json_is_number(v))
            b = json_number_value(v);
        else
            return (int)fail(x, CONS_ERR_FORMAT, p, "must be a number");
        if (!isfinite(b))
            return (int)fail(x, CONS_ERR_FORMAT, p, "must be finite");
        /* the integers admitted: >= ceil(b) (> b: floor(b) + 1), <= floor(b) (< b: ceil(b) - 1) */
        double e = upper ? (excl ? ceil(b) - 1 : floor(b)) : (excl ? floor(b) + 1 : ceil(b));
        if (upper && e < hi)
            hi = e;
        if (!upper && e > lo)
            lo = e;
    }
    if (lo > hi)
        return (int)fail(x, CONS_ERR_UNSUPPORTED, path, "no integer within the bounds (%.0f..%.0f)",
                         lo, hi);
    cons_node_t *n = &x->sc->nodes[id];
    n->min = lo <= -lim ? INT64_MIN : (int64_t)lo;
    n->max = hi >= lim ? INT64_MAX : (int64_t)hi;
    if (n->min > 0) /* no minus sign */
        n->start['-' >> 5] &= ~(1u << ('-' & 31));
    return 0;
}

/* One JSON type ("object" ...) with the keywords that apply to it. */
static int32_t compile_typed(cctx_t *x, const json_t *s, const char *type, const char *path)
{
    if (strcmp(type, "object") == 0)
        return compile_object(x, s, path);
    if (strcmp(type, "array") == 0)
        return compile_array(x, s, path);
    if (strcmp(type, "string") == 0) {
        int32_t id = node_kind(x, CK_STRING, path);
        return id < 0 || bounds(x, s, "minLength", "maxLength", id, path) ||
                       string_pattern(x, s, id, path)
                   ? -1
                   : id;
    }
    if (strcmp(type, "number") == 0) {
        const char *b = num_bound_of(s);
        char p[PATH_BYTES];
        path_join(p, path, b ? b : "");
        return b ? fail(x, CONS_ERR_UNSUPPORTED, p,
                        "'%s' is supported on integers, not on numbers with fractions", b)
                 : node_kind(x, CK_NUMBER, path);
    }
    if (strcmp(type, "integer") == 0) {
        int32_t id = node_kind(x, CK_INTEGER, path);
        return id < 0 || int_bounds(x, s, id, path) ? -1 : id;
    }
    if (strcmp(type, "boolean") == 0) {
        json_t *v[2] = {json_true(), json_false()};
        return node_lits(x, v, 2, path);
    }
    if (strcmp(type, "null") == 0) {
        json_t *v[1] = {json_null()};
        return node_lits(x, v, 1, path);
    }
    char p[PATH_BYTES];
    path_join(p, path, "type");
    return fail(x, CONS_ERR_FORMAT, p, "unknown type '%s'", type);
}

/* The value JSON pointer ptr (without '#') names in the document; NULL when none. */
static const json_t *pointer_get(const json_t *doc, const char *ptr)
{
    char tok[256];
    while (*ptr == '/') {
        ptr++;
        size_t n = 0;
        for (; *ptr && *ptr != '/'; ptr++) {
            char c = *ptr;
            if (c == '~' && (ptr[1] == '0' || ptr[1] == '1'))
                c = *++ptr == '0' ? '~' : '/';
            if (n + 1 >= sizeof tok)
                return NULL;
            tok[n++] = c;
        }
        tok[n] = 0;
        if (json_is_object(doc))
            doc = json_object_get(doc, tok);
        else if (json_is_array(doc)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            doc = *tok && !*end ? json_array_get(doc, i) : NULL;
        } else
            return NULL;
        if (!doc)
            return NULL;
    }
    return *ptr ? NULL : doc;
}

/* A local $ref ("#", "#/$defs/x"): one node per target, so recursion ends in a cycle. */
static int32_t compile_ref(cctx_t *x, const json_t *s, const char *path)
{
    char p[PATH_BYTES];
    path_join(p, path, "$ref");
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    if (!ref)
        return fail(x, CONS_ERR_FORMAT, p, "must be a string");
    if (check_keywords(x, s, "$ref", path))
        return -1;
    for (size_t i = 0; i < x->n_refs; i++)
        if (strcmp(x->refs[i].ref, ref) == 0)
            return x->refs[i].node;
    const json_t *t = ref[0] == '#' ? pointer_get(x->root, ref + 1) : NULL;
    if (!t)
        return fail(x, CONS_ERR_UNSUPPORTED, p, "'%s' is not a pointer into this schema", ref);
    int32_t slot = node_new(x, CK_ANYOF, p);
    cref_t *nr = realloc(x->refs, (x->n_refs + 1) * sizeof *nr);
    if (slot < 0 || !nr)
        return nr ? -1 : fail(x, CONS_ERR_NOMEM, p, "out of memory");
    x->refs = nr;
    if (!(nr[x->n_refs].ref = strdup(ref)))
        return fail(x, CONS_ERR_NOMEM, p, "out of memory");
    nr[x->n_refs++].node = slot;
    x->sc->nodes[slot].ready = 0;
    int32_t got = compile(x, t, ref + 1);
    if (got < 0)
        return -1;
    x->sc->nodes[slot] = x->sc->nodes[got]; /* the slot becomes the target (indices are shared) */
    return slot;
}

/* A branch of a union that has "type" beside it, as one schema: the branch with that type (all of
 * the two must hold); a new reference, or NULL after fail() when the branch names another type or
 * is a $ref or a boolean. */
static json_t *typed_branch(cctx_t *x, const json_t *b, const json_t *type, const char *path)
{
    char p[PATH_BYTES];
    path_join(p, path, "type");
    if (!json_is_object(b) || json_object_get(b, "$ref")) {
        fail(x, CONS_ERR_UNSUPPORTED, path, "a 'type' beside a union whose branch is %s",
             json_is_object(b) ? "a $ref" : "not an object");
        return NULL;
    }
    const json_t *own = json_object_get(b, "type");
    if (own && !json_equal(own, type)) {
        fail(x, CONS_ERR_UNSUPPORTED, p, "a type other than the 'type' beside its union");
        return NULL;
    }
    json_t *c = json_copy((json_t *)b);
    if (!c || json_object_set(c, "type", (json_t *)type)) {
        json_decref(c);
        fail(x, CONS_ERR_NOMEM, path, "out of memory");
        return NULL;
    }
    return c;
}

/* The branches that are literal sets (enum, const) as one literal set in the first one's place:
 * their union, less (for oneOf, where a value must match exactly one branch) the values of more
 * than one. Returns the branches left, 0 after fail(). */
static size_t merge_lits(cctx_t *x, int32_t *kids, size_t n, int one_of, const char *path)
{
    cons_schema_t *sc = x->sc;
    const char *texts[CONS_MAX_LITS];
    json_t *vals[CONS_MAX_LITS] = {0};
    size_t nt = 0, nv = 0, nl = 0, k = 0;
    int32_t at = -1;
    for (size_t i = 0; i < n; i++)
        nl += sc->nodes[kids[i]].kind == CK_LITS && sc->nodes[kids[i]].ready;
    if (nl < 2)
        return n;
    for (size_t i = 0; i < n; i++) {
        const cons_node_t *nd = &sc->nodes[kids[i]];
        if (nd->kind != CK_LITS || !nd->ready) {
            kids[k++] = kids[i];
            continue;
        }
        if (at < 0)
            at = (int32_t)k++;
        for (uint32_t j = 0; j < nd->n; j++) {
            if (nt == CONS_MAX_LITS) {
                fail(x, CONS_ERR_UNSUPPORTED, path, "more than %d values are not supported",
                     CONS_MAX_LITS);
                return 0;
            }
            texts[nt++] = sc->lits[nd->first + j].text;
        }
    }
    for (size_t i = 0; i < nt; i++) {
        size_t seen = 0;
        for (size_t j = 0; j < nt; j++)
            seen += strcmp(texts[i], texts[j]) == 0;
        if (one_of && seen > 1)
            continue;
        if (!(vals[nv] = json_loads(texts[i], JSON_DECODE_ANY, NULL)))
            break;
        nv++;
    }
    int32_t id = node_lits(x, vals, nv, path);
    for (size_t v = 0; v < nv; v++)
        json_decref(vals[v]);
    if (id < 0)
        return 0;
    kids[at] = id;
    return k;
}

/* anyOf / oneOf (branches of different types: at most one matches, so they are the same) and an
 * allOf of one schema. */
static int32_t compile_union(cctx_t *x, const json_t *s, const char *kw, const char *path)
{
    const json_t *arr = json_object_get(s, kw);
    char p[PATH_BYTES], q[PATH_BYTES];
    path_join(p, path, kw);
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return fail(x, CONS_ERR_FORMAT, p, "must be a non-empty array");
    if (check_keywords(x, s, kw, path))
        return -1;
    size_t n = json_array_size(arr);
    if (strcmp(kw, "allOf") == 0) {
        if (n != 1)
            return fail(x, CONS_ERR_UNSUPPORTED, p, "allOf of several schemas is not supported");
        path_index(q, path, kw, 0);
        return compile(x, json_array_get(arr, 0), q);
    }
    if (n > CONS_MAX_LITS)
        return fail(x, CONS_ERR_UNSUPPORTED, p, "more than %d branches", CONS_MAX_LITS);
    int32_t kids[CONS_MAX_LITS];
    const json_t *type = json_object_get(s, "type");
    for (size_t i = 0; i < n; i++) {
        path_index(q, path, kw, i);
        json_t *b = type ? typed_branch(x, json_array_get(arr, i), type, q) : NULL;
        if (type && !b)
            return -1;
        kids[i] = compile(x, type ? b : json_array_get(arr, i), q);
        json_decref(b);
        if (kids[i] < 0)
            return -1;
    }
    if (n > 1 && (n = merge_lits(x, kids, n, strcmp(kw, "oneOf") == 0, p)) == 0)
        return -1;
    return n == 1 ? kids[0] : node_anyof(x, kids, n, p);
}

/* Whether JSON value v is of schema type t. */
static int type_fits(const json_t *v, const char *t)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return strcmp(t, "object") == 0;
    case JSON_ARRAY: return strcmp(t, "array") == 0;
    case JSON_STRING: return strcmp(t, "string") == 0;
    case JSON_INTEGER: return strcmp(t, "integer") == 0 || strcmp(t, "number") == 0;
    case JSON_REAL: return strcmp(t, "number") == 0;
    case JSON_TRUE:
    case JSON_FALSE: return strcmp(t, "boolean") == 0;
    case JSON_NULL: return strcmp(t, "null") == 0;
    }
    return 0;
}

/* enum / const: the literals that also fit "type" when it is given. */
static int32_t compile_enum(cctx_t *x, const json_t *s, const char *path)
{
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    const json_t *type = json_object_get(s, "type");
    char p[PATH_BYTES];
    path_join(p, path, c ? "const" : "enum");
    if (!c && !json_is_array(e))
        return fail(x, CONS_ERR_FORMAT, p, "must be an array");
    size_t n = c ? 1 : json_array_size(e), k = 0;
    if (n > CONS_MAX_LITS)
        return fail(x, CONS_ERR_UNSUPPORTED, p, "more than %d values are not supported",
                    CONS_MAX_LITS);
    json_t *vals[CONS_MAX_LITS];
    for (size_t i = 0; i < n; i++) {
        json_t *v = c ? (json_t *)c : json_array_get(e, i);
        int fits = !type;
        if (json_is_string(type))
            fits = type_fits(v, json_string_value(type));
        for (size_t j = 0; json_is_array(type) && j < json_array_size(type); j++)
            fits |= json_is_string(json_array_get(type, j)) &&
                    type_fits(v, json_string_value(json_array_get(type, j)));
        int listed = !(c && e);
        for (size_t j = 0; !listed && j < json_array_size(e); j++)
            listed = json_equal(c, json_array_get(e, j));
        if (fits && listed)
            vals[k++] = v;
    }
    return node_lits(x, vals, k, p);
}

/* The keyword that tells a schema without "type" its type, or NULL (any value). */
static const char *implied_type(const json_t *s)
{
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
        json_object_get(s, "maxItems"))
        return "array";
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return "string";
    return NULL;
}

static int32_t compile_body(cctx_t *x, const json_t *s, const char *path)
{
    if (json_object_get(s, "$ref"))
        return compile_ref(x, s, path);
    static const char *const unions[] = {"anyOf", "oneOf", "allOf"};
    for (size_t i = 0; i < 3; i++)
        if (json_object_get(s, unions[i]))
            return compile_union(x, s, unions[i], path);
    if (check_keywords(x, s, NULL, path))
        return -1;
    const json_t *type = json_object_get(s, "type");
    char p[PATH_BYTES];
    const char *b = typed_only_of(s);
    if (b && (!type || json_object_get(s, "enum") || json_object_get(s, "const"))) {
        path_join(p, path, b);
        return fail(x, CONS_ERR_UNSUPPORTED, p, "'%s' needs a \"type\" (and no enum)", b);
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return compile_enum(x, s, path);
    path_join(p, path, "type");
    if (!type) {
        const char *t = implied_type(s);
        return t ? compile_typed(x, s, t, path) : node_any(x);
    }
    if (json_is_string(type))
        return compile_typed(x, s, json_string_value(type), path);
    size_t n = json_array_size(type);
    if (!json_is_array(type) || n == 0 || n > 7)
        return fail(x, CONS_ERR_FORMAT, p, "must be a type name or an array of them");
    int32_t kids[7];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t = json_string_value(json_array_get(type, i));
        if (!t)
            return fail(x, CONS_ERR_FORMAT, p, "must be a type name or an array of them");
        if (strcmp(t, "integer") == 0) { /* beside "number" it adds nothing */
            int num = 0;
            for (size_t j = 0; j < n; j++)
                num |= json_is_string(json_array_get(type, j)) &&
                       strcmp(json_string_value(json_array_get(type, j)), "number") == 0;
            if (num)
                continue;
        }
        if ((kids[k++] = compile_typed(x, s, t, path)) < 0)
            return -1;
    }
    return k == 1 ? kids[0] : node_anyof(x, kids, k, p);
}

/* OpenAPI's "nullable": true (the openai SDK's zod helper writes it for .nullable()): node id or
 * null. A node that can begin with 'n' takes null already (null in its enum, or any value). */
static int32_t compile_nullable(cctx_t *x, const json_t *s, int32_t id, const char *path)
{
    const json_t *v = json_object_get(s, "nullable");
    char p[PATH_BYTES];
    path_join(p, path, "nullable");
    if (v && !json_is_boolean(v))
        return fail(x, CONS_ERR_FORMAT, p, "must be a boolean");
    if (!json_is_true(v) || x->sc->nodes[id].start['n' >> 5] & 1u << ('n' & 31))
        return id;
    json_t *null[1] = {json_null()};
    int32_t kids[2] = {id, node_lits(x, null, 1, p)};
    return kids[1] < 0 ? -1 : node_anyof(x, kids, 2, p);
}

static int32_t compile(cctx_t *x, const json_t *s, const char *path)
{
    if (json_is_true(s))
        return node_any(x);
    if (json_is_false(s))
        return fail(x, CONS_ERR_UNSUPPORTED, path, "the schema false allows no value");
    if (!json_is_object(s))
        return fail(x, CONS_ERR_FORMAT, path, "a schema must be an object or a boolean");
    if (x->depth >= MAX_RECURSION)
        return fail(x, CONS_ERR_UNSUPPORTED, path, "nested deeper than %d schemas", MAX_RECURSION);
    x->depth++;
    int32_t id = compile_body(x, s, path);
    x->depth--;
    return id < 0 ? -1 : compile_nullable(x, s, id, path);
}

/* ------------------------------------------------------------------ the schema object */

static cons_schema_t *schema_alloc(void)
{
    cons_schema_t *sc = calloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    atomic_init(&sc->refs, 1);
    sc->any = -1;
    sc->root = -1;
    return sc;
}

static void schema_free(cons_schema_t *sc)
{
    for (uint32_t i = 0; i < sc->n_props; i++)
        free(sc->props[i].key);
    for (uint32_t i = 0; i < sc->n_lits; i++)
        free(sc->lits[i].text);
    free(sc->nodes);
    free(sc->kids);
    free(sc->props);
    free(sc->lits);
    free(sc->res);
    free(sc);
}

cons_schema_t *cons_schema_ref(cons_schema_t *sc)
{
    atomic_fetch_add(&sc->refs, 1);
    return sc;
}

void cons_schema_unref(cons_schema_t *sc)
{
    if (sc && atomic_fetch_sub(&sc->refs, 1) == 1)
        schema_free(sc);
}

/* The schema of a response_format, or NULL for json_object (any object); -1 after fail(). */
static int format_schema(cctx_t *x, const json_t *rf, const json_t **schema)
{
    *schema = NULL;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return (int)fail(x, CONS_ERR_FORMAT, "response_format", "must be an object with a type");
    if (strcmp(type, "json_object") == 0)
        return 0;
    if (strcmp(type, "json_schema") != 0)
        return (int)fail(x, CONS_ERR_FORMAT, "response_format",
                         "type '%s' is not json_object or json_schema", type);
    const json_t *js = json_object_get(rf, "json_schema");
    *schema = json_object_get(js, "schema");
    if (!*schema)
        return (int)fail(x, CONS_ERR_FORMAT, "response_format", "json_schema.schema is missing");
    return 0;
}

cons_schema_t *cons_schema_compile(const json_t *rf, int *code, char *err, size_t errlen)
{
    cons_schema_t *sc = schema_alloc();
    char dummy[8];
    cctx_t x = {.sc = sc, .err = err ? err : dummy, .errlen = err ? errlen : sizeof dummy};
    const json_t *schema = NULL;
    if (!sc) {
        x.code = CONS_ERR_NOMEM;
        snprintf(x.err, x.errlen, "out of memory");
        goto fail;
    }
    if (format_schema(&x, rf, &schema) || (sc->key_str = node_kind(&x, CK_STRING, "")) < 0)
        goto fail;
    if (!schema) { /* json_object: an object of any members */
        int32_t any = node_any(&x);
        if (any < 0 || (sc->root = node_kind(&x, CK_OBJECT, "")) < 0)
            goto fail;
        sc->nodes[sc->root].item = any;
    } else {
        x.root = schema;
        if ((sc->root = compile(&x, schema, "")) < 0)
            goto fail;
    }
    for (size_t i = 0; i < x.n_refs; i++)
        free(x.refs[i].ref);
    free(x.refs);
    return sc;
fail:
    for (size_t i = 0; i < x.n_refs; i++)
        free(x.refs[i].ref);
    free(x.refs);
    if (code)
        *code = x.code ? x.code : CONS_ERR_NOMEM;
    if (sc)
        schema_free(sc);
    return NULL;
}

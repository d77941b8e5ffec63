/* config: loads gpuswapd's YAML configuration into a validated plain struct, driven by one table of option descriptors. */
#include "config.h"
#include "config_int.h"

#include "base/num.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

#include "base/log.h"
#include "engine/chat.h"
#include "keyhash.h"
#include "hostport.h"

/* ------------------------------------------------------------------ setting one value */

/* Describes o's bounds for a message, e.g. "between 1 and 4096", "> 0". */
static void fmt_bound(const opt_t *o, double v, char *buf, size_t n)
{
    switch (o->type) {
    case OPT_SIZE:
    case OPT_RATE: cfg_format_size((uint64_t)v, buf, n); break;
    case OPT_DURATION: cfg_format_duration_ms((uint64_t)v, buf, n); break;
    default: snprintf(buf, n, "%.15g", v);
    }
}

static void fmt_bounds(const opt_t *o, char *buf, size_t n)
{
    char lo[32], hi[32];
    fmt_bound(o, o->lo, lo, sizeof lo);
    fmt_bound(o, o->hi, hi, sizeof hi);
    const char *lop = o->flags & OPT_LO_OPEN ? ">" : ">=",
               *hip = o->flags & OPT_HI_OPEN ? "<" : "<=";
    if (o->hi == UNBOUNDED)
        snprintf(buf, n, "must be %s %s", lop, lo);
    else if (!(o->flags & (OPT_LO_OPEN | OPT_HI_OPEN)))
        snprintf(buf, n, "must be between %s and %s", lo, hi);
    else
        snprintf(buf, n, "must be %s %s and %s %s", lop, lo, hip, hi);
}

static bool in_bounds(const opt_t *o, double v)
{
    if (o->flags & OPT_LO_OPEN ? v <= o->lo : v < o->lo)
        return false;
    if (o->hi == UNBOUNDED)
        return true;
    return o->flags & OPT_HI_OPEN ? v < o->hi : v <= o->hi;
}

/* text, or dir/text for a relative OPT_PATH value when dir is set; NULL when out of memory. */
static char *opt_path_join(const opt_t *o, const char *dir, const char *text)
{
    if (!(o->flags & OPT_PATH) || !dir || text[0] == '/')
        return strdup(text);
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, text) < 0 ? NULL : p;
}

static int set_str(const opt_t *o, const char *text, void *field, const char *name, const char *dir,
                   const char *val, char *msg, size_t n)
{
    char why[160] = "";
    if (!*text && (o->flags & OPT_NULLABLE) && !(o->flags & OPT_TILDE)) {
        free(*(char **)field);
        *(char **)field = NULL;
        return 0;
    }
    char *copy = opt_path_join(o, dir, text);
    if (!copy) {
        snprintf(msg, n, "out of memory");
        return CFG_ERR_NOMEM;
    }
    if (o->check && o->check(&copy, why, sizeof why)) {
        snprintf(msg, n, "invalid %s \"%s\" for %s (%s)", o->what ? o->what : "value", val, name,
                 why);
        free(copy);
        return CFG_ERR_INVALID;
    }
    free(*(char **)field);
    *(char **)field = copy;
    return 0;
}

static int set_mode(const char *text, void *field, const char *name, const char *val, char *msg,
                    size_t n)
{
    size_t len = strlen(text);
    if (len == 0 || len > 4 || strspn(text, "01234567") != len) {
        snprintf(msg, n, "invalid mode \"%s\" for %s (use an octal string such as \"0660\")", val,
                 name);
        return CFG_ERR_INVALID;
    }
    unsigned m = (unsigned)strtoul(text, NULL, 8);
    if (m > 0777) {
        snprintf(msg, n, "invalid mode \"%s\" for %s (at most 0777)", val, name);
        return CFG_ERR_INVALID;
    }
    memcpy(field, &m, sizeof m);
    return 0;
}

/* OPT_SIZE, OPT_RATE (a size, "/s" allowed), OPT_DURATION: the field and *num set. */
static int set_scaled(const opt_t *o, const char *text, void *field, double *num, const char *name,
                      const char *val, char *msg, size_t n)
{
    char why[160] = "", buf[80];
    uint64_t v;
    if (o->type == OPT_DURATION) {
        if (cfg_parse_duration_ms(text, &v, why, sizeof why)) {
            snprintf(msg, n, "invalid duration \"%s\" for %s (%s)", val, name, why);
            return CFG_ERR_INVALID;
        }
    } else {
        const char *t = text;
        size_t len = strlen(text);
        if (o->type == OPT_RATE && len >= 2 && len < sizeof buf &&
            strcmp(text + len - 2, "/s") == 0) {
            memcpy(buf, text, len - 2);
            buf[len - 2] = 0;
            t = buf;
        }
        if (cfg_parse_size(t, &v, why, sizeof why)) {
            snprintf(msg, n, "invalid %s \"%s\" for %s (%s%s)",
                     o->type == OPT_RATE ? "rate" : "size", val, name, why,
                     o->type == OPT_RATE ? ", per second" : "");
            return CFG_ERR_INVALID;
        }
    }
    memcpy(field, &v, sizeof v);
    *num = (double)v;
    return 0;
}

/* OPT_U32, OPT_I32, OPT_DOUBLE, OPT_FLOAT: the field (an integer only when in
 * bounds) and *num set; out of range reads as infinite for the bounds check. */
static int set_number(const opt_t *o, const char *text, void *field, double *num, const char *name,
                      const char *val, char *msg, size_t n)
{
    if (o->type == OPT_U32 || o->type == OPT_I32) {
        int64_t v = 0;
        int r = num_i64(text, &v);
        if (r == NUM_SYNTAX) {
            snprintf(msg, n, "invalid integer \"%s\" for %s", val, name);
            return CFG_ERR_INVALID;
        }
        *num = r == NUM_RANGE ? (text[0] == '-' ? -HUGE_VAL : HUGE_VAL) : (double)v;
        if (in_bounds(o, *num)) { /* every U32/I32 bound lies inside its type */
            if (o->type == OPT_U32) {
                uint32_t u = (uint32_t)v;
                memcpy(field, &u, sizeof u);
            } else {
                int32_t i = (int32_t)v;
                memcpy(field, &i, sizeof i);
            }
        }
        return 0;
    }
    int r = num_double(text, o->type == OPT_FLOAT, num);
    if (r == NUM_SYNTAX) {
        snprintf(msg, n, "invalid number \"%s\" for %s", val, name);
        return CFG_ERR_INVALID;
    }
    if (r == NUM_RANGE)
        *num = HUGE_VAL;
    if (o->type == OPT_DOUBLE) {
        memcpy(field, num, sizeof *num);
    } else {
        float f = (float)*num;
        memcpy(field, &f, sizeof f);
    }
    return 0;
}

/* OPT_BOOL, OPT_ENUM: one of the names. */
static int set_choice(const opt_t *o, const char *text, void *field, const char *name,
                      const char *val, char *msg, size_t n)
{
    if (o->type == OPT_BOOL) {
        int b;
        if (strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0) {
            b = 1;
        } else if (strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0) {
            b = 0;
        } else {
            snprintf(msg, n, "invalid boolean \"%s\" for %s (use true, false, yes, no)", val, name);
            return CFG_ERR_INVALID;
        }
        memcpy(field, &b, sizeof b);
        return 0;
    }
    for (int i = 0; o->names[i]; i++) {
        if (strcmp(text, o->names[i]) == 0) {
            memcpy(field, &i, sizeof i);
            return 0;
        }
    }
    int len = 0;
    char list[96];
    list[0] = 0;
    for (int i = 0; o->names[i]; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%s", i ? ", " : "", o->names[i]);
    snprintf(msg, n, "invalid value \"%s\" for %s (use %s)", val, name, list);
    return CFG_ERR_INVALID;
}

int cfg_opt_set(const opt_t *o, const char *text, bool null, void *field, const char *name,
                const char *dir, char *msg, size_t n)
{
    char val[64], why[160];
    cfg_sanitize(text, val, sizeof val);
    why[0] = 0;
    if (null && o->type == OPT_STR && (o->flags & OPT_NULLABLE)) {
        free(*(char **)field);
        *(char **)field = NULL;
        return 0;
    }
    if (null) {
        snprintf(msg, n, "missing value for %s", name);
        return CFG_ERR_INVALID;
    }
    double num = 0; /* the value as a number, for the bounds check */
    int rc;
    switch (o->type) {
    case OPT_STR: return set_str(o, text, field, name, dir, val, msg, n);
    case OPT_MODE: return set_mode(text, field, name, val, msg, n);
    case OPT_BOOL:
    case OPT_ENUM: return set_choice(o, text, field, name, val, msg, n);
    case OPT_SIZE:
    case OPT_RATE:
    case OPT_DURATION: rc = set_scaled(o, text, field, &num, name, val, msg, n); break;
    case OPT_U32:
    case OPT_I32:
    case OPT_DOUBLE:
    case OPT_FLOAT: rc = set_number(o, text, field, &num, name, val, msg, n); break;
    default: snprintf(msg, n, "internal: %s is not a scalar option", name); return CFG_ERR_INVALID;
    }
    if (rc)
        return rc;
    if (!in_bounds(o, num)) {
        char b[96];
        fmt_bounds(o, b, sizeof b);
        snprintf(msg, n, "invalid value \"%s\" for %s (%s)", val, name, b);
        return CFG_ERR_INVALID;
    }
    if (o->check && o->check(field, why, sizeof why)) {
        snprintf(msg, n, "invalid value \"%s\" for %s (%s)", val, name, why);
        return CFG_ERR_INVALID;
    }
    return 0;
}

/* Sets every option of one kind (OPT_KIND_*: top level, model, key) that has a default. */
static int apply_defaults(int kind, void *base, char *err, size_t errlen)
{
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) != kind || !o->def)
            continue;
        char msg[256];
        int rc =
            cfg_opt_set(o, o->def, false, (char *)base + o->off, o->key, NULL, msg, sizeof msg);
        if (rc) {
            cfg_set_err(err, errlen, "internal: default of %s.%s: %s", o->section, o->key, msg);
            return rc;
        }
    }
    return 0;
}

static void free_fields(int kind, void *base)
{
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) != kind)
            continue;
        void *f = (char *)base + o->off;
        if (o->type == OPT_STR) {
            free(*(char **)f);
            *(char **)f = NULL;
        } else if (o->type == OPT_IDLIST) {
            cfg_idlist_t *l = f;
            free(l->ids);
            l->ids = NULL;
            l->n = 0;
        } else if (o->type == OPT_STRLIST) {
            cfg_strlist_t *l = f;
            for (size_t k = 0; k < l->n; k++)
                free(l->v[k]);
            free(l->v);
            l->v = NULL;
            l->n = 0;
        }
    }
}

/* ------------------------------------------------------------------ loader */

typedef struct mark {
    int line, col; /* 1-based; line 0 = not set */
} mark_t;

typedef struct ld {
    const char *file;
    const char
        *dir; /* the config file's directory, absolute: relative paths start there; NULL = cwd */
    yaml_document_t *doc;
    cfg_t *c;
    char *err;
    size_t errlen;
    mark_t root;
    mark_t top[CFG_MAX_OPTS]; /* where each top-level option's value is */
    mark_t *model;            /* n_models x cfg_n_opts: where each model option's value is */
    mark_t *model_at;         /* n_models: where each model entry starts */
    mark_t *key;              /* n_keys x cfg_n_opts: where each key option's value is */
    mark_t *key_at;           /* n_keys: where each key entry starts */
} ld_t;

static mark_t mark_of(const yaml_node_t *n)
{
    return (mark_t){(int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

static int ld_fail(ld_t *ld, mark_t m, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ld_fail(ld_t *ld, mark_t m, int code, const char *fmt, ...)
{
    if (!ld->err || !ld->errlen)
        return code;
    int k = snprintf(ld->err, ld->errlen, "%s:%d:%d: ", ld->file, m.line, m.col);
    if (k >= 0 && (size_t)k < ld->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ld->err + k, ld->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return code;
}

static bool node_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* "a mapping", "a list", "\"abc\"" or "nothing", for type-mismatch messages. */
static const char *describe(const yaml_node_t *n, char *buf, size_t len)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (node_is_null(n))
        return "nothing";
    char v[64];
    snprintf(buf, len, "\"%s\"", cfg_sanitize((const char *)n->data.scalar.value, v, sizeof v));
    return buf;
}

/* Optimal string alignment distance (edits and transpositions), for "did you mean". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

static int unknown_key(ld_t *ld, const yaml_node_t *k, const char *section, const char *where)
{
    const char *key = (const char *)k->data.scalar.value;
    char kb[64], in[96], hint[128];
    cfg_sanitize(key, kb, sizeof kb);
    if (*where)
        snprintf(in, sizeof in, "in %s", where);
    else
        snprintf(in, sizeof in, "at the top level");
    hint[0] = 0;
    const opt_t *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < cfg_n_opts; i++) {
        if (strcmp(cfg_opts[i].section, section))
            continue;
        size_t d = edit_distance(key, cfg_opts[i].key);
        if (d < bestd && d < strlen(key)) {
            best = &cfg_opts[i];
            bestd = d;
        }
    }
    if (best) {
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", best->key);
    } else {
        for (size_t i = 0; i < cfg_n_opts; i++) {
            if (strcmp(cfg_opts[i].key, key) || !strcmp(cfg_opts[i].section, section))
                continue;
            const char *s = cfg_opts[i].section;
            if (!*s)
                snprintf(hint, sizeof hint, " ('%s' belongs at the top level)", cfg_opts[i].key);
            else if (cfg_opt_is_model(&cfg_opts[i]))
                snprintf(hint, sizeof hint, " ('%s' belongs in each models[] entry%s)",
                         cfg_opts[i].key, s[6] ? ", under defaults" : "");
            else
                snprintf(hint, sizeof hint, " (did you mean '%s.%s'?)", s, cfg_opts[i].key);
            break;
        }
    }
    return ld_fail(ld, mark_of(k), CFG_ERR_INVALID, "unknown key '%s' %s%s", kb, in, hint);
}

static int load_map(ld_t *ld, yaml_node_t *map, const char *section, const char *where, void *base,
                    mark_t *marks);

static int load_idlist(ld_t *ld, yaml_node_t *v, const char *name, cfg_idlist_t *l)
{
    char d[80];
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a list of ids for %s, got %s",
                       name, describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    uint32_t *ids = n ? calloc(n, sizeof *ids) : NULL;
    if (n && !ids)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        int64_t x = -1;
        if (it->type != YAML_SCALAR_NODE ||
            num_i64_in((const char *)it->data.scalar.value, 0, 4294967294LL, &x)) {
            free(ids);
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID,
                           "invalid id %s in %s[%zu] (use a number 0..4294967294)",
                           describe(it, d, sizeof d), name, i);
        }
        ids[i] = (uint32_t)x;
    }
    free(l->ids);
    l->ids = ids;
    l->n = n;
    return 0;
}

static int load_strlist(ld_t *ld, yaml_node_t *v, const opt_t *o, const char *name,
                        cfg_strlist_t *l)
{
    char d[80], val[64], why[160];
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a list for %s, got %s", name,
                       describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    char **strs = n ? calloc(n, sizeof *strs) : NULL;
    if (n && !strs)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        const char *text =
            it->type == YAML_SCALAR_NODE ? (const char *)it->data.scalar.value : NULL;
        if (!text || node_is_null(it) || !*text || strlen(text) != it->data.scalar.length) {
            rc = ld_fail(ld, mark_of(it), CFG_ERR_INVALID,
                         "invalid %s %s in %s[%zu] (use a non-empty string)",
                         o->what ? o->what : "value", describe(it, d, sizeof d), name, i);
        } else if (!(strs[i] = strdup(text))) {
            rc = ld_fail(ld, mark_of(it), CFG_ERR_NOMEM, "out of memory");
        } else if (o->check && o->check(&strs[i], why, sizeof why)) {
            rc = ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "invalid %s \"%s\" in %s[%zu] (%s)",
                         o->what ? o->what : "value", cfg_sanitize(text, val, sizeof val), name, i,
                         why);
        }
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            free(strs[i]);
        free(strs);
        return rc;
    }
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = strs;
    l->n = n;
    return 0;
}

static int load_keys(ld_t *ld, yaml_node_t *v)
{
    char d[80];
    cfg_t *c = ld->c;
    if (node_is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                       "expected a list of keys for auth.keys, got %s", describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return 0;
    c->auth.keys = calloc(n, sizeof *c->auth.keys);
    ld->key = calloc(n * cfg_n_opts, sizeof *ld->key);
    ld->key_at = calloc(n, sizeof *ld->key_at);
    if (!c->auth.keys || !ld->key || !ld->key_at)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    c->auth.n_keys = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        cfg_key_t *k = &c->auth.keys[i];
        char where[32];
        snprintf(where, sizeof where, "auth.keys[%zu]", i);
        ld->key_at[i] = mark_of(it);
        k->line = ld->key_at[i].line;
        if (it->type != YAML_MAPPING_NODE)
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                           where, describe(it, d, sizeof d));
        int rc = apply_defaults(OPT_KIND_KEY, k, ld->err, ld->errlen);
        if (rc)
            return rc;
        rc = load_map(ld, it, "auth.keys", where, k, &ld->key[i * cfg_n_opts]);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_models(ld_t *ld, yaml_node_t *v)
{
    char d[80];
    cfg_t *c = ld->c;
    if (v->type != YAML_SEQUENCE_NODE)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                       "expected a list of models for models, got %s", describe(v, d, sizeof d));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "models must list at least one model");
    c->models = calloc(n, sizeof *c->models);
    ld->model = calloc(n * cfg_n_opts, sizeof *ld->model);
    ld->model_at = calloc(n, sizeof *ld->model_at);
    if (!c->models || !ld->model || !ld->model_at)
        return ld_fail(ld, mark_of(v), CFG_ERR_NOMEM, "out of memory");
    c->n_models = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        cfg_model_t *m = &c->models[i];
        char where[32];
        snprintf(where, sizeof where, "models[%zu]", i);
        ld->model_at[i] = mark_of(it);
        m->line = ld->model_at[i].line;
        if (it->type != YAML_MAPPING_NODE)
            return ld_fail(ld, mark_of(it), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                           where, describe(it, d, sizeof d));
        int rc = apply_defaults(true, m, ld->err, ld->errlen);
        if (rc)
            return rc;
        rc = load_map(ld, it, "models", where, m, &ld->model[i * cfg_n_opts]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Loads the pairs of map, a mapping for section (e.g. "device",
 * "models.defaults"), into base; where is its display name ("device",
 * "models[2].defaults", "" at the top); marks records where each option was set. */
static int load_map(ld_t *ld, yaml_node_t *map, const char *section, const char *where, void *base,
                    mark_t *marks)
{
    char d[80];
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(ld->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return ld_fail(ld, mark_of(k), CFG_ERR_INVALID, "expected a key %s%s, got %s",
                           *where ? "in " : "at the top level", where, describe(k, d, sizeof d));
        int i = cfg_opt_find(section, (const char *)k->data.scalar.value);
        if (i < 0)
            return unknown_key(ld, k, section, where);
        const opt_t *o = &cfg_opts[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s%s", where, *where ? "." : "", o->key);
        if (marks[i].line)
            return ld_fail(ld, mark_of(k), CFG_ERR_INVALID,
                           "duplicate key '%s' %s%s (first set at line %d)", o->key,
                           *where ? "in " : "at the top level", where, marks[i].line);
        marks[i] = mark_of(v);
        int rc;
        switch (o->type) {
        case OPT_SECTION: {
            if (node_is_null(v))
                break;
            if (v->type != YAML_MAPPING_NODE)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "expected a mapping for %s, got %s",
                               name, describe(v, d, sizeof d));
            char child[64];
            snprintf(child, sizeof child, "%s%s%s", section, *section ? "." : "", o->key);
            rc = load_map(ld, v, child, name, base, marks);
            if (rc)
                return rc;
            break;
        }
        case OPT_MODELS:
            rc = load_models(ld, v);
            if (rc)
                return rc;
            break;
        case OPT_IDLIST:
            rc = load_idlist(ld, v, name, (cfg_idlist_t *)((char *)base + o->off));
            if (rc)
                return rc;
            break;
        case OPT_STRLIST:
            rc = load_strlist(ld, v, o, name, (cfg_strlist_t *)((char *)base + o->off));
            if (rc)
                return rc;
            break;
        case OPT_KEYS:
            rc = load_keys(ld, v);
            if (rc)
                return rc;
            break;
        default: {
            if (v->type != YAML_SCALAR_NODE)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID,
                               "expected a single value for %s, got %s", name,
                               describe(v, d, sizeof d));
            const char *text = (const char *)v->data.scalar.value;
            if (strlen(text) != v->data.scalar.length)
                return ld_fail(ld, mark_of(v), CFG_ERR_INVALID, "value for %s contains a NUL byte",
                               name);
            char msg[384];
            rc = cfg_opt_set(o, text, node_is_null(v), (char *)base + o->off, name, ld->dir, msg,
                             sizeof msg);
            if (rc)
                return ld_fail(ld, mark_of(v), rc, "%s", msg);
        }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ cross-field checks */

/* Where option section.key was set, else where its section was, else the file start. */
static mark_t at_top(const ld_t *ld, const char *section, const char *key)
{
    int i = cfg_opt_find(section, key);
    if (i >= 0 && ld->top[i].line)
        return ld->top[i];
    i = cfg_opt_find("", section);
    if (i >= 0 && ld->top[i].line)
        return ld->top[i];
    return ld->root;
}

static mark_t at_model(const ld_t *ld, size_t mi, const char *section, const char *key)
{
    int i = cfg_opt_find(section, key);
    if (i >= 0 && ld->model[mi * cfg_n_opts + (size_t)i].line)
        return ld->model[mi * cfg_n_opts + (size_t)i];
    return ld->model_at[mi];
}

static bool model_set(const ld_t *ld, size_t mi, const char *section, const char *key)
{
    int i = cfg_opt_find(section, key);
    return i >= 0 && ld->model[mi * cfg_n_opts + (size_t)i].line != 0;
}

static mark_t at_key(const ld_t *ld, size_t ki, const char *key)
{
    int i = cfg_opt_find("auth.keys", key);
    if (i >= 0 && ld->key[ki * cfg_n_opts + (size_t)i].line)
        return ld->key[ki * cfg_n_opts + (size_t)i];
    return ld->key_at[ki];
}

/* auth.keys: names and hashes unique, every listed model configured (or "*"). */
static int validate_keys(ld_t *ld)
{
    cfg_t *c = ld->c;
    for (size_t i = 0; i < c->auth.n_keys; i++) {
        cfg_key_t *k = &c->auth.keys[i];
        if (!k->name)
            return ld_fail(ld, ld->key_at[i], CFG_ERR_INVALID,
                           "missing required key 'name' in auth.keys[%zu]", i);
        if (!k->hash)
            return ld_fail(
                ld, ld->key_at[i], CFG_ERR_INVALID,
                "missing required key 'hash' in auth.keys[%zu] ('%s'; `gpuswap keygen` prints one)",
                i, k->name);
        if (k->models.n == 0)
            return ld_fail(
                ld, at_key(ld, i, "models"), CFG_ERR_INVALID,
                "auth.keys[%zu] ('%s') lists no models (name them, or use [\"*\"] for every model)",
                i, k->name);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->auth.keys[j].name, k->name) == 0)
                return ld_fail(
                    ld, at_key(ld, i, "name"), CFG_ERR_INVALID,
                    "duplicate key name \"%s\" in auth.keys[%zu] (auth.keys[%zu], line %d, has it too)",
                    k->name, i, j, c->auth.keys[j].line);
            if (strcmp(c->auth.keys[j].hash, k->hash) == 0)
                return ld_fail(ld, at_key(ld, i, "hash"), CFG_ERR_INVALID,
                               "auth.keys[%zu] ('%s') has the same hash as auth.keys[%zu] ('%s')",
                               i, k->name, j, c->auth.keys[j].name);
        }
        for (size_t m = 0; m < k->models.n; m++) {
            const char *name = k->models.v[m];
            if (strcmp(name, "*") == 0 || cfg_find_model(c, name))
                continue;
            char s[64];
            return ld_fail(ld, at_key(ld, i, "models"), CFG_ERR_INVALID,
                           "auth.keys[%zu].models[%zu] \"%s\" is not a configured model", i, m,
                           cfg_sanitize(name, s, sizeof s));
        }
    }
    return 0;
}

/* models[i]'s file keys: path, or an adapter (adapter with base, never with path). */
static int check_adapter_keys(ld_t *ld, size_t i)
{
    const cfg_model_t *m = &ld->c->models[i];
    if (m->adapter && m->path)
        return ld_fail(ld, at_model(ld, i, "models", "adapter"), CFG_ERR_INVALID,
                       "models[%zu] ('%s') has both path and adapter (an adapter's model file is "
                       "its base's)",
                       i, m->name);
    if (m->adapter && !m->base)
        return ld_fail(ld, at_model(ld, i, "models", "adapter"), CFG_ERR_INVALID,
                       "models[%zu] ('%s') has an adapter but no base (the model it applies to)", i,
                       m->name);
    if (m->base && !m->adapter)
        return ld_fail(ld, at_model(ld, i, "models", "base"), CFG_ERR_INVALID,
                       "models[%zu] ('%s') has a base but no adapter file", i, m->name);
    if (!m->path && !m->adapter)
        return ld_fail(ld, ld->model_at[i], CFG_ERR_INVALID,
                       "missing required key 'path' in models[%zu] ('%s')", i, m->name);
    return 0;
}

/* Every adapter's base is a model of the config that is not an adapter itself. */
static int check_adapter_bases(ld_t *ld)
{
    const cfg_t *c = ld->c;
    for (size_t i = 0; i < c->n_models; i++) {
        const cfg_model_t *m = &c->models[i];
        if (!m->base)
            continue;
        const cfg_model_t *b = cfg_find_model(c, m->base);
        if (!b)
            return ld_fail(ld, at_model(ld, i, "models", "base"), CFG_ERR_INVALID,
                           "unknown base \"%s\" for models[%zu] ('%s'): no model of that name",
                           m->base, i, m->name);
        if (b->base)
            return ld_fail(ld, at_model(ld, i, "models", "base"), CFG_ERR_INVALID,
                           "base \"%s\" of models[%zu] ('%s') is itself an adapter (of '%s'); a "
                           "base is a model with a path",
                           m->base, i, m->name, b->base);
    }
    return 0;
}

static int validate(ld_t *ld)
{
    cfg_t *c = ld->c;
    char a[32], b[32], s[64];
    if (c->n_models == 0)
        return ld_fail(
            ld, ld->root, CFG_ERR_INVALID,
            "missing required key 'models' (a list of at least one model, each with a name and a path)");

    /* listeners */
    if (!c->listen.socket && !c->listen.tcp && !c->listen.http)
        return ld_fail(ld, at_top(ld, "listen", "socket"), CFG_ERR_INVALID,
                       "no listener: set listen.socket, listen.tcp or listen.http");
    if (c->listen.tcp && c->listen.http && strcmp(c->listen.tcp, c->listen.http) == 0)
        return ld_fail(ld, at_top(ld, "listen", "http"), CFG_ERR_INVALID,
                       "listen.http \"%s\" is the same address as listen.tcp",
                       cfg_sanitize(c->listen.http, s, sizeof s));
    for (int k = 0; c->metrics.listen && k < 2; k++) {
        const char *other = k ? c->listen.tcp : c->listen.http;
        if (other && strcmp(other, c->metrics.listen) == 0)
            return ld_fail(ld, at_top(ld, "metrics", "listen"), CFG_ERR_INVALID,
                           "metrics.listen \"%s\" is the same address as %s",
                           cfg_sanitize(c->metrics.listen, s, sizeof s),
                           k ? "listen.tcp" : "listen.http");
    }
    if (c->auth.http && !c->listen.http)
        return ld_fail(ld, at_top(ld, "auth", "http"), CFG_ERR_INVALID,
                       "auth.http requires a key on listen.http, which is off");
    if (c->auth.tcp && !c->listen.tcp)
        return ld_fail(ld, at_top(ld, "auth", "tcp"), CFG_ERR_INVALID,
                       "auth.tcp requires a key on listen.tcp, which is off");
    if (c->listen.socket && c->admin.socket && strcmp(c->listen.socket, c->admin.socket) == 0)
        return ld_fail(ld, at_top(ld, "admin", "socket"), CFG_ERR_INVALID,
                       "admin.socket \"%s\" is the same path as listen.socket",
                       cfg_sanitize(c->admin.socket, s, sizeof s));

    /* device */
    uint64_t mem = c->device.memory;
    if (c->device.backend == CFG_BACKEND_SIM && mem == 0) {
        int i = cfg_opt_find("device", "memory");
        mark_t m = ld->top[i].line ? ld->top[i] : at_top(ld, "device", "backend");
        return ld_fail(
            ld, m, CFG_ERR_INVALID,
            "device.memory is required for backend sim (the size of the simulated device)");
    }
    if (c->device.fault_injection && c->device.backend != CFG_BACKEND_SIM)
        return ld_fail(ld, at_top(ld, "device", "fault_injection"), CFG_ERR_INVALID,
                       "device.fault_injection is for testing and needs backend sim");
    if (mem && mem % c->device.page_size)
        return ld_fail(ld, at_top(ld, "device", "memory"), CFG_ERR_INVALID,
                       "device.memory %s is not a multiple of device.page_size %s",
                       cfg_format_size(mem, a, sizeof a),
                       cfg_format_size(c->device.page_size, b, sizeof b));

    /* models */
    uint64_t pinned = 0;
    for (size_t i = 0; i < c->n_models; i++) {
        cfg_model_t *m = &c->models[i];
        if (!m->name)
            return ld_fail(ld, ld->model_at[i], CFG_ERR_INVALID,
                           "missing required key 'name' in models[%zu]", i);
        int rc = check_adapter_keys(ld, i);
        if (rc)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->models[j].name, m->name) == 0)
                return ld_fail(
                    ld, at_model(ld, i, "models", "name"), CFG_ERR_INVALID,
                    "duplicate model name \"%s\" in models[%zu] (models[%zu], line %d, has it too)",
                    m->name, i, j, c->models[j].line);
        if (!model_set(ld, i, "models", "max_batch"))
            m->max_batch = c->scheduler.max_batch;
        m->max_context_set = model_set(ld, i, "models", "max_context");
        if (m->gpu_quota && m->kv_cache > m->gpu_quota)
            return ld_fail(
                ld, at_model(ld, i, "models", "kv_cache"), CFG_ERR_INVALID,
                "models[%zu].kv_cache %s exceeds its gpu_quota %s (the quota covers weights and KV)",
                i, cfg_format_size(m->kv_cache, a, sizeof a),
                cfg_format_size(m->gpu_quota, b, sizeof b));
        if (mem && m->gpu_quota > mem)
            return ld_fail(ld, at_model(ld, i, "models", "gpu_quota"), CFG_ERR_INVALID,
                           "models[%zu].gpu_quota %s exceeds device.memory %s", i,
                           cfg_format_size(m->gpu_quota, a, sizeof a),
                           cfg_format_size(mem, b, sizeof b));
        if (mem && m->kv_cache > mem)
            return ld_fail(ld, at_model(ld, i, "models", "kv_cache"), CFG_ERR_INVALID,
                           "models[%zu].kv_cache %s exceeds device.memory %s", i,
                           cfg_format_size(m->kv_cache, a, sizeof a),
                           cfg_format_size(mem, b, sizeof b));
        if ((uint32_t)m->defaults.max_tokens > m->max_context) {
            mark_t at = model_set(ld, i, "models.defaults", "max_tokens")
                            ? at_model(ld, i, "models.defaults", "max_tokens")
                            : at_model(ld, i, "models", "max_context");
            return ld_fail(ld, at, CFG_ERR_INVALID,
                           "models[%zu].defaults.max_tokens %d exceeds its max_context %u", i,
                           (int)m->defaults.max_tokens, (unsigned)m->max_context);
        }
        if (mem && m->pinned && m->gpu_quota) {
            pinned += m->gpu_quota; /* each <= mem, so no overflow for any sane count */
            if (pinned > mem)
                return ld_fail(ld, at_model(ld, i, "models", "pinned"), CFG_ERR_INVALID,
                               "the gpu_quota of the pinned models up to models[%zu] add up to %s, "
                               "more than device.memory %s",
                               i, cfg_format_size(pinned, a, sizeof a),
                               cfg_format_size(mem, b, sizeof b));
        }
    }
    int rc = check_adapter_bases(ld);
    return rc ? rc : validate_keys(ld);
}

/* ------------------------------------------------------------------ public API */

/* The 1-based line and column of byte offset off in text (reader errors carry only an offset). */
static mark_t mark_at_offset(const char *text, size_t off)
{
    mark_t m = {1, 1};
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') {
            m.line++;
            m.col = 1;
        } else if (((unsigned char)text[i] & 0xc0) != 0x80) {
            m.col++;
        }
    }
    return m;
}

/* Loads the one document of parser into ld->c. */
int cfg_runtime_dir(const char *config_dir, char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int k;
    if (geteuid() == 0)
        k = snprintf(buf, len, "/run/gpuswapd");
    else if (xdg && xdg[0] == '/')
        k = snprintf(buf, len, "%s/gpuswapd", xdg);
    else if (config_dir)
        k = snprintf(buf, len, "%s", config_dir);
    else
        k = snprintf(buf, len, "/tmp/gpuswapd-%u", (unsigned)geteuid());
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

/* The defaults that depend on how the file is written and who runs it: a config without a listen
 * section (a models-only config) serves OpenAI HTTP on CFG_DEFAULT_HTTP; a socket the file does
 * not name goes to the runtime directory (cfg_runtime_dir: the table's /run/gpuswapd as root),
 * which the daemon creates when missing (c->rundir). */
static int runtime_defaults(ld_t *ld)
{
    cfg_t *c = ld->c;
    if (!ld->top[cfg_opt_find("", "listen")].line && !c->listen.http &&
        !(c->listen.http = strdup(CFG_DEFAULT_HTTP)))
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    static const struct {
        const char *section, *file;
        size_t off;
    } socks[] = {{"listen", "gpuswapd.sock", offsetof(cfg_t, listen.socket)},
                 {"admin", "admin.sock", offsetof(cfg_t, admin.socket)}};
    char dir[PATH_MAX], path[PATH_MAX + 32];
    if (cfg_runtime_dir(ld->dir, dir, sizeof dir))
        return ld_fail(ld, ld->root, CFG_ERR_INVALID, "the runtime directory's path is too long");
    for (size_t i = 0; i < sizeof socks / sizeof *socks; i++) {
        if (ld->top[cfg_opt_find(socks[i].section, "socket")].line)
            continue;
        if (geteuid() == 0) { /* the table's default, in /run/gpuswapd: created if missing */
            if (!c->rundir && !(c->rundir = strdup(dir)))
                return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
            continue;
        }
        char **field = (char **)((char *)c + socks[i].off), why[64];
        snprintf(path, sizeof path, "%s/%s", dir, socks[i].file);
        if (cfg_check_sockpath(&(const char *){path}, why, sizeof why))
            return ld_fail(ld, ld->root, CFG_ERR_INVALID,
                           "%s.socket: the default %s is %s: set it in the file", socks[i].section,
                           path, why);
        free(*field);
        if (!(*field = strdup(path)) || (!c->rundir && !(c->rundir = strdup(dir))))
            return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    }
    return 0;
}

uint32_t cfg_model_context(const cfg_model_t *m, uint32_t n_ctx_train)
{
    return n_ctx_train && m->max_context > n_ctx_train ? n_ctx_train : m->max_context;
}

static int load_document(ld_t *ld, yaml_parser_t *parser, const char *yaml)
{
    yaml_document_t doc2;
    int rc;
    if (!yaml_parser_load(parser, ld->doc)) {
        ld->doc = NULL;
        goto syntax;
    }
    if (!yaml_parser_load(parser, &doc2))
        goto syntax;
    yaml_node_t *extra = yaml_document_get_root_node(&doc2);
    mark_t extra_at = extra ? mark_of(extra) : ld->root;
    yaml_document_delete(&doc2);
    if (extra)
        return ld_fail(ld, extra_at, CFG_ERR_INVALID,
                       "a second YAML document; the config is one document");

    yaml_node_t *root = yaml_document_get_root_node(ld->doc);
    if (!root || node_is_null(root))
        return ld_fail(ld, ld->root, CFG_ERR_INVALID,
                       "the config is empty (at least 'models' is required)");
    ld->root = mark_of(root);
    if (root->type != YAML_MAPPING_NODE) {
        char d[80];
        return ld_fail(ld, ld->root, CFG_ERR_INVALID, "expected a mapping at the top level, got %s",
                       describe(root, d, sizeof d));
    }
    ld->c = calloc(1, sizeof *ld->c);
    if (!ld->c || !(ld->c->file = strdup(ld->file)))
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    rc = apply_defaults(false, ld->c, ld->err, ld->errlen);
    if (!rc)
        rc = load_map(ld, root, "", "", ld->c, ld->top);
    if (!rc)
        rc = runtime_defaults(ld);
    if (!rc)
        rc = validate(ld);
    return rc;

syntax:
    if (parser->error == YAML_MEMORY_ERROR)
        return ld_fail(ld, ld->root, CFG_ERR_NOMEM, "out of memory");
    mark_t m = {(int)parser->problem_mark.line + 1, (int)parser->problem_mark.column + 1};
    if (parser->error == YAML_READER_ERROR)
        m = mark_at_offset(yaml, parser->problem_offset);
    return ld_fail(ld, m, CFG_ERR_SYNTAX, "YAML syntax error: %s%s%s",
                   parser->problem ? parser->problem : "unknown", parser->context ? " " : "",
                   parser->context ? parser->context : "");
}

/* cfg_load_string with relative paths taken from dir (NULL: the working directory). */
static int load_string_in(const char *yaml, const char *name, const char *dir, cfg_t **out,
                          char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = 0;
    if (!name)
        name = "<config>";
    yaml_parser_t parser;
    yaml_document_t doc;
    ld_t ld = {.file = name, .dir = dir, .doc = &doc, .err = err, .errlen = errlen, .root = {1, 1}};
    if (!yaml_parser_initialize(&parser)) {
        cfg_set_err(err, errlen, "%s: out of memory", name);
        return CFG_ERR_NOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, strlen(yaml));
    int rc = load_document(&ld, &parser, yaml);
    if (ld.doc)
        yaml_document_delete(ld.doc);
    yaml_parser_delete(&parser);
    free(ld.model);
    free(ld.model_at);
    free(ld.key);
    free(ld.key_at);
    if (rc) {
        cfg_free(ld.c);
        return rc;
    }
    *out = ld.c;
    return 0;
}

int cfg_load_string(const char *yaml, const char *name, cfg_t **out, char *err, size_t errlen)
{
    return load_string_in(yaml, name, NULL, out, err, errlen);
}

/* The absolute directory of path, as named (symlinks not followed); NULL when out of memory or the
 * working directory is gone. The caller frees it. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == path)
        return strdup("/");
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : NULL, *cwd = NULL, *abs = NULL;
    if (dir && dir[0] == '/')
        return dir;
    if ((cwd = getcwd(NULL, 0)) &&
        asprintf(&abs, "%s%s%s", cwd, dir ? "/" : "", dir ? dir : "") < 0)
        abs = NULL;
    free(dir);
    free(cwd);
    return abs;
}

int cfg_load_file(const char *path, cfg_t **out, char *err, size_t errlen)
{
    enum {
        MAX_FILE = 16 << 20
    };
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        cfg_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return CFG_ERR_IO;
    }
    size_t cap = 0, len = 0;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap >= MAX_FILE) {
                cfg_set_err(err, errlen, "%s: larger than 16MiB; not a config file?", path);
                rc = CFG_ERR_INVALID;
                goto out;
            }
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                cfg_set_err(err, errlen, "%s: out of memory", path);
                rc = CFG_ERR_NOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t k = fread(buf + len, 1, cap - 1 - len, f);
        len += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        cfg_set_err(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = CFG_ERR_IO;
        goto out;
    }
    buf[len] = 0;
    if (memchr(buf, 0, len)) {
        cfg_set_err(err, errlen, "%s: contains a NUL byte; not a YAML file", path);
        rc = CFG_ERR_INVALID;
        goto out;
    }
    char *dir = dir_of(path);
    if (!dir) {
        cfg_set_err(err, errlen, "%s: cannot resolve its directory: %s", path, strerror(errno));
        rc = CFG_ERR_IO;
        goto out;
    }
    rc = load_string_in(buf, path, dir, out, err, errlen);
    free(dir);
out:
    free(buf);
    fclose(f);
    return rc;
}

void cfg_free(cfg_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_models; i++)
        free_fields(true, &c->models[i]);
    free(c->models);
    for (size_t i = 0; i < c->auth.n_keys; i++)
        free_fields(OPT_KIND_KEY, &c->auth.keys[i]);
    free(c->auth.keys);
    free_fields(false, c);
    free(c->file);
    free(c->rundir);
    free(c);
}

const cfg_model_t *cfg_find_model(const cfg_t *c, const char *name)
{
    for (size_t i = 0; c && name && i < c->n_models; i++)
        if (c->models[i].name && strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

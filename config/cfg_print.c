/* cfg_print: the effective config written back as YAML, what a reload changes, and whether it may. */
#include "config_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ printing and reload */

static void print_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void cfg_value_write(FILE *f, const opt_t *o, const void *field, bool quote)
{
    char buf[64];
    switch (o->type) {
    case OPT_STR: {
        const char *s = *(char *const *)field;
        if (s && quote)
            print_quoted(f, s);
        else if (s)
            fputs(s, f);
        else
            fputs("~", f);
        break;
    }
    case OPT_MODE: {
        unsigned m;
        memcpy(&m, field, sizeof m);
        fprintf(f, quote ? "\"%04o\"" : "%04o", m);
        break;
    }
    case OPT_SIZE:
    case OPT_RATE: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%s%s", cfg_format_size(v, buf, sizeof buf),
                o->type == OPT_RATE && v ? "/s" : "");
        break;
    }
    case OPT_DURATION: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        fputs(cfg_format_duration_ms(v, buf, sizeof buf), f);
        break;
    }
    case OPT_U32: {
        uint32_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%u", (unsigned)v);
        break;
    }
    case OPT_I32: {
        int32_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "%d", (int)v);
        break;
    }
    case OPT_DOUBLE: { /* shortest text that reads back to the same double */
        double v;
        memcpy(&v, field, sizeof v);
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        fputs(buf, f);
        break;
    }
    case OPT_FLOAT: {
        float v;
        memcpy(&v, field, sizeof v);
        for (int prec = 6; prec <= 9; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
            if (strtof(buf, NULL) == v)
                break;
        }
        fputs(buf, f);
        break;
    }
    case OPT_BOOL: {
        int v;
        memcpy(&v, field, sizeof v);
        fputs(v ? "true" : "false", f);
        break;
    }
    case OPT_ENUM: {
        int v;
        memcpy(&v, field, sizeof v);
        fputs(o->names[v], f);
        break;
    }
    case OPT_IDLIST: {
        const cfg_idlist_t *l = field;
        fputc('[', f);
        for (size_t i = 0; i < l->n; i++)
            fprintf(f, "%s%u", i ? ", " : "", (unsigned)l->ids[i]);
        fputc(']', f);
        break;
    }
    case OPT_STRLIST: {
        const cfg_strlist_t *l = field;
        fputc('[', f);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                fputs(", ", f);
            print_quoted(f, l->v[i]);
        }
        fputc(']', f);
        break;
    }
    default: break;
    }
}

/* Writes the options of section at indent; dash: the first line opens a list item. */
static void print_section(FILE *f, const cfg_t *c, const char *section, const void *base,
                          int indent, bool dash)
{
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (strcmp(o->section, section))
            continue;
        if (dash)
            fprintf(f, "%*s- ", indent - 2, "");
        else
            fprintf(f, "%*s", indent, "");
        dash = false;
        if (o->type == OPT_SECTION) {
            char child[64];
            snprintf(child, sizeof child, "%s%s%s", section, *section ? "." : "", o->key);
            fprintf(f, "%s:\n", o->key);
            print_section(f, c, child, base, indent + 2, false);
        } else if (o->type == OPT_MODELS) {
            fprintf(f, "%s:\n", o->key);
            for (size_t m = 0; m < c->n_models; m++)
                print_section(f, c, "models", &c->models[m], indent + 4, true);
        } else if (o->type == OPT_KEYS) {
            fprintf(f, "%s:%s\n", o->key, c->auth.n_keys ? "" : " []");
            for (size_t k = 0; k < c->auth.n_keys; k++)
                print_section(f, c, "auth.keys", &c->auth.keys[k], indent + 4, true);
        } else {
            fprintf(f, "%s: ", o->key);
            cfg_value_write(f, o, (const char *)base + o->off, true);
            fputc('\n', f);
        }
    }
}

int cfg_print(const cfg_t *c, FILE *f)
{
    fputs("# gpuswapd effective configuration (every key, defaults filled in)\n", f);
    print_section(f, c, "", c, 0, false);
    return ferror(f) ? CFG_ERR_IO : 0;
}

static bool value_equal(const opt_t *o, const void *a, const void *b)
{
    switch (o->type) {
    case OPT_STR: {
        const char *x = *(char *const *)a, *y = *(char *const *)b;
        return x == y || (x && y && strcmp(x, y) == 0);
    }
    case OPT_IDLIST: {
        const cfg_idlist_t *x = a, *y = b;
        return x->n == y->n && (x->n == 0 || memcmp(x->ids, y->ids, x->n * sizeof *x->ids) == 0);
    }
    case OPT_STRLIST: {
        const cfg_strlist_t *x = a, *y = b;
        if (x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++)
            if (strcmp(x->v[i], y->v[i]))
                return false;
        return true;
    }
    case OPT_SIZE:
    case OPT_RATE:
    case OPT_DURATION: return memcmp(a, b, sizeof(uint64_t)) == 0;
    case OPT_DOUBLE: return *(const double *)a == *(const double *)b;
    case OPT_FLOAT: return *(const float *)a == *(const float *)b;
    default: /* every remaining type is 4 bytes wide */ return memcmp(a, b, 4) == 0;
    }
}

/* Appends "name" to buf, comma-separated; counts it in *n. */
static void change_add(char *buf, size_t len, size_t *used, int *n, const char *sec,
                       const char *key)
{
    int k =
        snprintf(buf + *used, len - *used, "%s%s%s%s", *n ? ", " : "", sec, *sec ? "." : "", key);
    if (k > 0)
        *used = *used + (size_t)k < len ? *used + (size_t)k : len - 1;
    ++*n;
}

/* The model options that differ between a and b (only_class >= 0: those of that CFG_APPLY_*
 * class), named into buf as the file names them; the count. */
static int model_diff(const cfg_model_t *a, const cfg_model_t *b, int only_class, char *buf,
                      size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < cfg_n_opts && len; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) != OPT_KIND_MODEL || o->type == OPT_SECTION ||
            !strcmp(o->key, "name") || (only_class >= 0 && (int)o->apply != only_class))
            continue;
        if (!value_equal(o, (const char *)a + o->off, (const char *)b + o->off))
            change_add(buf, len, &used, &n, strcmp(o->section, "models") ? o->section + 7 : "",
                       o->key);
    }
    return n;
}

int cfg_model_changes(const cfg_model_t *a, const cfg_model_t *b, char *buf, size_t len)
{
    return model_diff(a, b, -1, buf, len);
}

int cfg_changes(const cfg_t *a, const cfg_t *b, char *buf, size_t len)
{
    size_t used = 0;
    int n = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < cfg_n_opts && len; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) != OPT_KIND_TOP || o->type == OPT_SECTION || o->type == OPT_MODELS)
            continue;
        bool same = true;
        if (o->type == OPT_KEYS) {
            same = a->auth.n_keys == b->auth.n_keys;
            for (size_t k = 0; same && k < a->auth.n_keys; k++)
                for (size_t j = 0; same && j < cfg_n_opts; j++)
                    if (cfg_opt_kind(&cfg_opts[j]) == OPT_KIND_KEY)
                        same = value_equal(&cfg_opts[j],
                                           (const char *)&a->auth.keys[k] + cfg_opts[j].off,
                                           (const char *)&b->auth.keys[k] + cfg_opts[j].off);
        } else
            same = value_equal(o, (const char *)a + o->off, (const char *)b + o->off);
        if (!same)
            change_add(buf, len, &used, &n, o->section, o->key);
    }
    return n;
}

/* "name (was -> now)" of a top-level option that differs, appended to f. */
static void describe_change(FILE *f, const opt_t *o, const void *a, const void *b)
{
    char *was = NULL, *now = NULL;
    size_t wl = 0, nl = 0;
    FILE *fw = open_memstream(&was, &wl), *fn = open_memstream(&now, &nl);
    if (fw) {
        cfg_value_write(fw, o, a, true);
        fclose(fw);
    }
    if (fn) {
        cfg_value_write(fn, o, b, true);
        fclose(fn);
    }
    char sw[64], sn[64];
    fprintf(f, "%s.%s cannot change on reload (%s -> %s)", o->section, o->key,
            cfg_sanitize(was ? was : "?", sw, sizeof sw),
            cfg_sanitize(now ? now : "?", sn, sizeof sn));
    free(was);
    free(now);
}

int cfg_reload_check(const cfg_t *cur, const cfg_t *next, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    char *text = NULL;
    size_t tl = 0;
    FILE *f = open_memstream(&text, &tl);
    if (!f)
        return CFG_ERR_NOMEM;
    int n = 0;
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) != OPT_KIND_TOP || o->type == OPT_SECTION || o->type == OPT_MODELS ||
            o->type == OPT_KEYS || o->apply != CFG_APPLY_RESTART)
            continue;
        const void *a = (const char *)cur + o->off, *b = (const char *)next + o->off;
        if (value_equal(o, a, b))
            continue;
        fputs(n++ ? "; " : "", f);
        describe_change(f, o, a, b);
    }
    fclose(f);
    if (n)
        cfg_set_err(err, errlen, "%s: %s; restart gpuswapd to apply %s",
                    next->file ? next->file : "<config>", text ? text : "?", n > 1 ? "them" : "it");
    free(text);
    return n ? CFG_ERR_RELOAD : 0;
}

int cfg_model_reloads(const cfg_model_t *a, const cfg_model_t *b, char *buf, size_t len)
{
    return model_diff(a, b, CFG_APPLY_MODEL, buf, len);
}

static const char *const apply_names[] = {"live", "reloads the model", "restart"};

/* The option table's type column: "size", "one of `a`, `b`", ... */
static const char *opt_type_name(const opt_t *o, char *buf, size_t len)
{
    switch (o->type) {
    case OPT_MODELS: return "list of models";
    case OPT_STR: return o->flags & OPT_PATH ? "path" : "string";
    case OPT_MODE: return "octal mode";
    case OPT_SIZE: return "size";
    case OPT_RATE: return "size per second";
    case OPT_DURATION: return "duration";
    case OPT_U32:
    case OPT_I32: return "integer";
    case OPT_DOUBLE:
    case OPT_FLOAT: return "number";
    case OPT_BOOL: return "bool";
    case OPT_IDLIST: return "list of ids";
    case OPT_STRLIST: return "list of strings";
    case OPT_KEYS: return "list of keys";
    case OPT_ENUM: {
        size_t used = 0;
        buf[0] = 0;
        for (int i = 0; o->names[i] && used < len; i++) {
            int k = snprintf(buf + used, len - used, "%s`%s`", i ? ", " : "", o->names[i]);
            used += k > 0 ? (size_t)k : 0;
        }
        return buf;
    }
    default: return "";
    }
}

int cfg_options_markdown(FILE *f)
{
    fputs("| option | type | default | on reload | what |\n| --- | --- | --- | --- | --- |\n", f);
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (o->type == OPT_SECTION)
            continue;
        char def[64] = "";
        if (o->def)
            snprintf(def, sizeof def, "`%s`", o->def);
        else if (o->type == OPT_STR || o->type == OPT_IDLIST || o->type == OPT_STRLIST)
            snprintf(def, sizeof def, "none");
        char type[128];
        fprintf(f, "| `%s%s%s` | %s | %s | %s | %s |\n", o->section, *o->section ? "." : "", o->key,
                opt_type_name(o, type, sizeof type), def, apply_names[o->apply],
                o->doc ? o->doc : "");
    }
    return ferror(f) ? CFG_ERR_IO : 0;
}

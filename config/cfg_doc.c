/* cfg_doc: a config built option by option against the schema and written with libyaml's emitter (see cfg_doc.h). */
#include "cfg_doc.h"

#include "config_int.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

struct cfg_doc {
    cfg_t c;                    /* the values set; the rest zero (nothing here applies defaults) */
    bool set[CFG_MAX_OPTS];     /* top-level options set */
    bool (*mset)[CFG_MAX_OPTS]; /* per model: its options set */
};

cfg_doc_t *cfg_doc_new(void)
{
    return calloc(1, sizeof(cfg_doc_t));
}

static void free_field(const opt_t *o, void *field)
{
    if (o->type == OPT_STR) {
        free(*(char **)field);
        *(char **)field = NULL;
    }
}

void cfg_doc_free(cfg_doc_t *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < cfg_n_opts; i++) {
        const opt_t *o = &cfg_opts[i];
        if (cfg_opt_kind(o) == OPT_KIND_TOP)
            free_field(o, (char *)&d->c + o->off);
        else if (cfg_opt_kind(o) == OPT_KIND_MODEL)
            for (size_t m = 0; m < d->c.n_models; m++)
                free_field(o, (char *)&d->c.models[m] + o->off);
    }
    free(d->c.models);
    free(d->mset);
    free(d);
}

static bool scalar_type(opt_type_t t)
{
    return t != OPT_SECTION && t != OPT_MODELS && t != OPT_KEYS && t != OPT_IDLIST &&
           t != OPT_STRLIST;
}

/* The option called dotted under prefix ("" or "models"): its index, or -1. */
static int find(const char *prefix, const char *dotted)
{
    char sec[96];
    const char *dot = strrchr(dotted, '.');
    const char *key = dot ? dot + 1 : dotted;
    size_t sl = dot ? (size_t)(dot - dotted) : 0;
    int w =
        snprintf(sec, sizeof sec, "%s%s%.*s", prefix, *prefix && sl ? "." : "", (int)sl, dotted);
    if (w < 0 || (size_t)w >= sizeof sec)
        return -1;
    int i = cfg_opt_find(sec, key);
    return i >= 0 && scalar_type(cfg_opts[i].type) ? i : -1;
}

int cfg_doc_known(const char *dotted)
{
    int i = find("", dotted);
    return i >= 0 && cfg_opt_kind(&cfg_opts[i]) == OPT_KIND_TOP;
}

static int doc_set(const opt_t *o, void *base, bool *set, const char *name, const char *text,
                   char *why, size_t n)
{
    void *field = (char *)base + o->off;
    free_field(o, field);
    int rc = cfg_opt_set(o, text, false, field, name, NULL, why, n);
    if (rc) {
        free_field(o, field);
        *set = false;
        return rc;
    }
    *set = true;
    return 0;
}

int cfg_doc_set(cfg_doc_t *d, const char *dotted, const char *text, char *why, size_t n)
{
    int i = find("", dotted);
    if (i < 0 || cfg_opt_kind(&cfg_opts[i]) != OPT_KIND_TOP) {
        snprintf(why, n,
                 "%s is not a gpuswapd option with one value (`gpuswapd options` lists them)",
                 dotted);
        return CFG_ERR_INVALID;
    }
    return doc_set(&cfg_opts[i], &d->c, &d->set[i], dotted, text, why, n);
}

int cfg_doc_add_model(cfg_doc_t *d)
{
    size_t m = d->c.n_models;
    cfg_model_t *models = realloc(d->c.models, (m + 1) * sizeof *models);
    if (!models)
        return -1;
    d->c.models = models;
    memset(&models[m], 0, sizeof *models);
    bool(*mset)[CFG_MAX_OPTS] = realloc(d->mset, (m + 1) * sizeof *mset);
    if (!mset)
        return -1;
    d->mset = mset;
    memset(mset[m], 0, sizeof mset[m]);
    d->c.n_models = m + 1;
    return (int)m;
}

int cfg_doc_model_set(cfg_doc_t *d, size_t m, const char *key, const char *text, char *why,
                      size_t n)
{
    int i = find("models", key);
    char name[128];
    snprintf(name, sizeof name, "models[%zu].%s", m, key);
    if (m >= d->c.n_models || i < 0) {
        snprintf(why, n, "%s is not a model option with one value", name);
        return CFG_ERR_INVALID;
    }
    return doc_set(&cfg_opts[i], &d->c.models[m], &d->mset[m][i], name, text, why, n);
}

/* ------------------------------------------------------------------ writing */

typedef struct em {
    yaml_emitter_t e;
    int failed;
} em_t;

static void ev_emit(em_t *em, yaml_event_t *ev, int made)
{
    if (!made || !yaml_emitter_emit(&em->e, ev))
        em->failed = 1;
}

static void put_scalar(em_t *em, const char *s, yaml_scalar_style_t style)
{
    yaml_event_t ev;
    if (em->failed)
        return;
    ev_emit(em, &ev,
            yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1,
                                         style));
}

static void put_open(em_t *em, bool seq)
{
    yaml_event_t ev;
    if (em->failed)
        return;
    if (seq)
        ev_emit(
            em, &ev,
            yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE));
    else
        ev_emit(em, &ev,
                yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE));
}

static void put_close(em_t *em, bool seq)
{
    yaml_event_t ev;
    if (em->failed)
        return;
    ev_emit(em, &ev,
            seq ? yaml_sequence_end_event_initialize(&ev) : yaml_mapping_end_event_initialize(&ev));
}

/* One option's value as config text. */
static void put_value(em_t *em, const opt_t *o, const void *field)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    if (!mf) {
        em->failed = 1;
        return;
    }
    cfg_value_write(mf, o, field, false);
    if (fclose(mf)) {
        free(text);
        em->failed = 1;
        return;
    }
    /* plain where YAML allows it, else quoted: the loader reads every value by its option's
     * type, so a plain "true" or "0660" stays what the option means */
    put_scalar(em, text, YAML_ANY_SCALAR_STYLE);
    free(text);
}

/* Whether any option set lies in section or below it. */
static bool any_set(const bool *set, const char *section)
{
    size_t l = strlen(section);
    for (size_t i = 0; i < cfg_n_opts; i++)
        if (set[i] && !strncmp(cfg_opts[i].section, section, l) &&
            (cfg_opts[i].section[l] == 0 || cfg_opts[i].section[l] == '.'))
            return true;
    return false;
}

static void put_section(em_t *em, const cfg_doc_t *d, const char *section, const void *base,
                        const bool *set)
{
    for (size_t i = 0; i < cfg_n_opts && !em->failed; i++) {
        const opt_t *o = &cfg_opts[i];
        if (strcmp(o->section, section))
            continue;
        if (o->type == OPT_SECTION) {
            char child[96];
            snprintf(child, sizeof child, "%s%s%s", section, *section ? "." : "", o->key);
            if (!any_set(set, child))
                continue;
            put_scalar(em, o->key, YAML_PLAIN_SCALAR_STYLE);
            put_open(em, false);
            put_section(em, d, child, base, set);
            put_close(em, false);
        } else if (o->type == OPT_MODELS && d->c.n_models) {
            put_scalar(em, o->key, YAML_PLAIN_SCALAR_STYLE);
            put_open(em, true);
            for (size_t m = 0; m < d->c.n_models; m++) {
                put_open(em, false);
                put_section(em, d, "models", &d->c.models[m], d->mset[m]);
                put_close(em, false);
            }
            put_close(em, true);
        } else if (set[i]) {
            put_scalar(em, o->key, YAML_PLAIN_SCALAR_STYLE);
            put_value(em, o, (const char *)base + o->off);
        }
    }
}

int cfg_doc_write(const cfg_doc_t *d, FILE *fp)
{
    em_t em = {.failed = 0};
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&em.e))
        return CFG_ERR_NOMEM;
    yaml_emitter_set_output_file(&em.e, fp);
    yaml_emitter_set_unicode(&em.e, 1);
    yaml_emitter_set_width(&em.e, -1);
    ev_emit(&em, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
    if (!em.failed)
        ev_emit(&em, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
    put_open(&em, false);
    put_section(&em, d, "", &d->c, d->set);
    put_close(&em, false);
    if (!em.failed)
        ev_emit(&em, &ev, yaml_document_end_event_initialize(&ev, 1));
    if (!em.failed)
        ev_emit(&em, &ev, yaml_stream_end_event_initialize(&ev));
    if (!em.failed && !yaml_emitter_flush(&em.e))
        em.failed = 1;
    yaml_emitter_delete(&em.e);
    return em.failed || ferror(fp) ? CFG_ERR_IO : 0;
}

/* fleet: loads fleet.yaml and places every model on `replicas` hosts by bounded rendezvous hashing; fleet_render.c writes the files of a placed fleet, fleet_cli.c is `gpuswap fleet`. */
#include "fleet.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "base/num.h"
#include "cfg_doc.h"
#include "config.h"
#include "hostport.h"

#define FLEET_SLACK 1.5 /* a host carries at most this multiple of its share */

/* ------------------------------------------------------------------ loading */

typedef struct ld {
    const char *file;
    yaml_document_t *doc;
    cfg_doc_t *check; /* where values meant for hosts' configs are checked by the daemon's schema */
    char *err;
    size_t errlen;
} ld_t;

static int ld_fail(ld_t *ld, const yaml_node_t *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ld_fail(ld_t *ld, const yaml_node_t *at, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        snprintf(ld->err, ld->errlen, "%s:%zu:%zu: %s", ld->file, at->start_mark.line + 1,
                 at->start_mark.column + 1, msg);
    else
        snprintf(ld->err, ld->errlen, "%s: %s", ld->file, msg);
    return code;
}

static const char *scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int get_str(ld_t *ld, const yaml_node_t *v, const char *key, char **out)
{
    const char *s = scalar(v);
    if (!s || !*s)
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s must be a non-empty string", key);
    free(*out);
    *out = strdup(s);
    return *out ? 0 : FLEET_ERR_NOMEM;
}

static int get_size(ld_t *ld, const yaml_node_t *v, const char *key, uint64_t *out)
{
    const char *s = scalar(v);
    char why[128] = "";
    if (!s || cfg_parse_size(s, out, why, sizeof why))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid size \"%s\" for %s (%s)", s ? s : "", key,
                       why[0] ? why : "a scalar like 80GiB");
    return 0;
}

static int get_ms(ld_t *ld, const yaml_node_t *v, const char *key, uint64_t *out)
{
    const char *s = scalar(v);
    char why[128] = "";
    if (!s || cfg_parse_duration_ms(s, out, why, sizeof why))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid duration \"%s\" for %s (%s)", s ? s : "",
                       key, why);
    return 0;
}

static int get_num(ld_t *ld, const yaml_node_t *v, const char *key, double lo, double hi,
                   int integer, double *out)
{
    const char *s = scalar(v);
    double d;
    if (num_double_in(s, lo, hi, &d) || (integer && d != floor(d)))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid value \"%s\" for %s (%s %g..%g)",
                       s ? s : "", key, integer ? "an integer" : "a number", lo, hi);
    *out = d;
    return 0;
}

/* Names of hosts and models: what may go into file names and HAProxy identifiers. */
static int name_ok(const char *s, int colon)
{
    if (!s || !*s || strlen(s) > 128 || s[0] == '.' || s[0] == '-')
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-' || (colon && *p == ':')))
            return 0;
    return 1;
}

/* Walks a mapping: for each pair, fn(key, value) must accept the key; a key
 * given twice is an error. */
typedef int (*ld_pair_fn)(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                          const yaml_node_t *v);

static int ld_map(ld_t *ld, const yaml_node_t *map, const char *what, void *ctx, ld_pair_fn fn)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return ld_fail(ld, map, FLEET_ERR_INVALID, "%s must be a mapping", what);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(ld->doc, p->value);
        const char *key = scalar(k);
        if (!key)
            return ld_fail(ld, k, FLEET_ERR_INVALID, "keys of %s must be strings", what);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
            if (scalar(yaml_document_get_node(ld->doc, q->key)) &&
                !strcmp(scalar(yaml_document_get_node(ld->doc, q->key)), key))
                return ld_fail(ld, k, FLEET_ERR_INVALID, "duplicate key '%s' in %s", key, what);
        int rc = fn(ld, ctx, key, k, v);
        if (rc)
            return rc;
    }
    return 0;
}

static int unknown(ld_t *ld, const yaml_node_t *k, const char *key, const char *what)
{
    return ld_fail(ld, k, FLEET_ERR_INVALID, "unknown key '%s' in %s", key, what);
}

/* value, read as daemon option `option`, the way the daemon's loader reads it: 0, or an
 * error naming name (the fleet file's key) at v. */
static int check_opt(ld_t *ld, const yaml_node_t *v, const char *name, const char *option)
{
    char why[320];
    const char *s = scalar(v);
    if (!s || !*s)
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s must be a non-empty scalar", name);
    if (cfg_doc_set(ld->check, option, s, why, sizeof why))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s: %s", name, why);
    return 0;
}

static int proxy_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                      const yaml_node_t *v)
{
    fleet_t *f = ctx;
    double d;
    int rc;
    if (!strcmp(key, "listen")) {
        char why[160];
        if ((rc = get_str(ld, v, "proxy.listen", &f->proxy.listen)))
            return rc;
        if (hostport_check(f->proxy.listen, why, sizeof why))
            return ld_fail(ld, v, FLEET_ERR_INVALID, "proxy.listen \"%s\" is not host:port (%s)",
                           f->proxy.listen, why);
        return 0;
    }
    if (!strcmp(key, "addresses")) {
        if (v->type != YAML_SEQUENCE_NODE ||
            v->data.sequence.items.top == v->data.sequence.items.start)
            return ld_fail(ld, v, FLEET_ERR_INVALID,
                           "proxy.addresses must be a non-empty list of addresses");
        size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
        f->proxy.addresses = calloc(n, sizeof *f->proxy.addresses);
        if (!f->proxy.addresses)
            return FLEET_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) {
            const yaml_node_t *a = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
            const char *s = scalar(a);
            if (!s || !*s || strspn(s, "0123456789abcdefABCDEF.:/") != strlen(s))
                return ld_fail(ld, a, FLEET_ERR_INVALID,
                               "proxy.addresses[%zu] must be an IP address or prefix", i);
            if (!(f->proxy.addresses[i] = strdup(s)))
                return FLEET_ERR_NOMEM;
            f->proxy.n_addresses++;
        }
        return 0;
    }
    if (!strcmp(key, "max_request")) {
        if ((rc = get_size(ld, v, "proxy.max_request", &f->proxy.max_request)))
            return rc;
        if (f->proxy.max_request < 1024 || f->proxy.max_request > (64u << 20))
            return ld_fail(ld, v, FLEET_ERR_INVALID, "proxy.max_request must be 1KiB..64MiB");
        return check_opt(ld, v, "proxy.max_request", "listen.max_line");
    }
    if (!strcmp(key, "balance_factor")) {
        if ((rc = get_num(ld, v, "proxy.balance_factor", 101, 1000, 1, &d)))
            return rc;
        f->proxy.balance_factor = (uint32_t)d;
        return 0;
    }
    if (!strcmp(key, "check_interval")) {
        if ((rc = get_ms(ld, v, "proxy.check_interval", &f->proxy.check_ms)))
            return rc;
        return f->proxy.check_ms >= 100 ? 0
                                        : ld_fail(ld, v, FLEET_ERR_INVALID,
                                                  "proxy.check_interval must be at least 100ms");
    }
    if (!strcmp(key, "stream_timeout")) {
        if ((rc = get_ms(ld, v, "proxy.stream_timeout", &f->proxy.stream_timeout_ms)))
            return rc;
        return f->proxy.stream_timeout_ms >= 1000
                   ? 0
                   : ld_fail(ld, v, FLEET_ERR_INVALID, "proxy.stream_timeout must be at least 1s");
    }
    return unknown(ld, k, key, "proxy");
}

/* Fleet's short names in defaults: for the daemon options every host gets, and the value
 * each host gets when the file says nothing (NULL: the daemon's own default). */
static const struct {
    const char *key, *option, *def;
} fleet_opt_names[] = {
    {"backend", "device.backend", "auto"},
    {"page_size", "device.page_size", "2MiB"},
    {"threads", "device.threads", "0"},
    {"sim_bandwidth", "device.sim_bandwidth", NULL},
    {"vllm_compat", "metrics.vllm_compat", "true"},
    {"drain_timeout", "scheduler.drain_timeout", "30s"},
};

/* The daemon options fleet sets per host from hosts[] and proxy: not for defaults. */
static const char *const fleet_owned[] = {"listen.socket",       "listen.http",  "listen.max_line",
                                          "listen.drain_linger", "admin.socket", "device.memory",
                                          "host.memory"};

/* Sets defaults option `option` to s (replacing an earlier value). */
static int put_option(fleet_t *f, const char *option, const char *s)
{
    size_t i = 0;
    while (i < f->defaults.n_options && strcmp(f->defaults.options[i], option))
        i++;
    if (i == f->defaults.n_options) {
        char **o = realloc(f->defaults.options, (i + 1) * sizeof *o);
        if (o)
            f->defaults.options = o;
        char **v = realloc(f->defaults.values, (i + 1) * sizeof *v);
        if (v)
            f->defaults.values = v;
        if (!o || !v || !(o[i] = strdup(option)))
            return FLEET_ERR_NOMEM;
        v[i] = NULL;
        f->defaults.n_options++;
    }
    free(f->defaults.values[i]);
    f->defaults.values[i] = strdup(s);
    return f->defaults.values[i] ? 0 : FLEET_ERR_NOMEM;
}

static int defaults_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                         const yaml_node_t *v)
{
    fleet_t *f = ctx;
    char name[128];
    int rc;
    if (!strcmp(key, "run_dir"))
        return get_str(ld, v, "defaults.run_dir", &f->defaults.run_dir);
    snprintf(name, sizeof name, "defaults.%s", key);
    const char *option = NULL;
    for (size_t i = 0; i < sizeof fleet_opt_names / sizeof *fleet_opt_names; i++)
        if (!strcmp(key, fleet_opt_names[i].key))
            option = fleet_opt_names[i].option;
    if (!option && cfg_doc_known(key))
        option = key;
    if (!option)
        return ld_fail(ld, k, FLEET_ERR_INVALID,
                       "unknown key '%s' in defaults (fleet's short names, run_dir, or a daemon "
                       "option by its dotted name, e.g. scheduler.max_stall)",
                       key);
    for (size_t i = 0; i < sizeof fleet_owned / sizeof *fleet_owned; i++)
        if (!strcmp(option, fleet_owned[i]))
            return ld_fail(ld, k, FLEET_ERR_INVALID,
                           "%s is set by the fleet for each host (hosts[].http, device_memory, "
                           "host_memory, run_dir; proxy.max_request), not in defaults",
                           option);
    if ((rc = check_opt(ld, v, name, option)))
        return rc;
    return put_option(f, option, scalar(v));
}

static int k8s_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                    const yaml_node_t *v)
{
    fleet_t *f = ctx;
    if (!strcmp(key, "namespace"))
        return get_str(ld, v, "kubernetes.namespace", &f->k8s.namespace_);
    if (!strcmp(key, "image"))
        return get_str(ld, v, "kubernetes.image", &f->k8s.image);
    if (!strcmp(key, "models_dir"))
        return get_str(ld, v, "kubernetes.models_dir", &f->k8s.models_dir);
    if (!strcmp(key, "port")) {
        double d;
        int rc = get_num(ld, v, "kubernetes.port", 1, 65535, 1, &d);
        f->k8s.port = (unsigned)d;
        return rc;
    }
    return unknown(ld, k, key, "kubernetes");
}

typedef struct item_ctx {
    fleet_t *f;
    size_t i;
    char what[64];
    unsigned seen; /* bit per required key */
} item_ctx_t;

static int host_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                     const yaml_node_t *v)
{
    item_ctx_t *c = ctx;
    fleet_host_t *h = &c->f->hosts[c->i];
    char nm[96];
    snprintf(nm, sizeof nm, "%s.%s", c->what, key);
    int rc;
    if (!strcmp(key, "name")) {
        c->seen |= 1;
        if ((rc = get_str(ld, v, nm, &h->name)))
            return rc;
        return name_ok(h->name, 0) ? 0
                                   : ld_fail(ld, v, FLEET_ERR_INVALID,
                                             "invalid host name \"%s\" ([A-Za-z0-9._-]+)", h->name);
    }
    if (!strcmp(key, "http")) {
        char why[160];
        c->seen |= 2;
        if ((rc = get_str(ld, v, nm, &h->http)))
            return rc;
        /* the daemon's listen.http check: what the host's gpuswapd.yaml gets passes its
         * --check-config */
        return hostport_check(h->http, why, sizeof why)
                   ? ld_fail(ld, v, FLEET_ERR_INVALID, "%s \"%s\" is not host:port (%s)", nm,
                             h->http, why)
                   : check_opt(ld, v, nm, "listen.http");
    }
    if (!strcmp(key, "device_memory")) {
        c->seen |= 4;
        return (rc = get_size(ld, v, nm, &h->device_memory))
                   ? rc
                   : check_opt(ld, v, nm, "device.memory");
    }
    if (!strcmp(key, "host_memory")) {
        c->seen |= 8;
        return (rc = get_size(ld, v, nm, &h->host_memory)) ? rc
                                                           : check_opt(ld, v, nm, "host.memory");
    }
    if (!strcmp(key, "run_dir"))
        return get_str(ld, v, nm, &h->run_dir);
    if (!strcmp(key, "pool")) {
        if ((rc = get_str(ld, v, nm, &h->pool)))
            return rc;
        return name_ok(h->pool, 0)
                   ? 0
                   : ld_fail(ld, v, FLEET_ERR_INVALID, "invalid pool name \"%s\"", h->pool);
    }
    return unknown(ld, k, key, c->what);
}

static int model_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                      const yaml_node_t *v)
{
    item_ctx_t *c = ctx;
    fleet_model_t *m = &c->f->models[c->i];
    char nm[96];
    snprintf(nm, sizeof nm, "%s.%s", c->what, key);
    double d;
    int rc;
    if (!strcmp(key, "name")) {
        c->seen |= 1;
        if ((rc = get_str(ld, v, nm, &m->name)))
            return rc;
        return name_ok(m->name, 1)
                   ? 0
                   : ld_fail(ld, v, FLEET_ERR_INVALID,
                             "invalid model name \"%s\" ([A-Za-z0-9._:-]+)", m->name);
    }
    if (!strcmp(key, "path")) {
        c->seen |= 2;
        return get_str(ld, v, nm, &m->path);
    }
    if (!strcmp(key, "size")) {
        c->seen |= 4;
        if ((rc = get_size(ld, v, nm, &m->size)))
            return rc;
        return m->size ? 0 : ld_fail(ld, v, FLEET_ERR_INVALID, "%s must be more than 0", nm);
    }
    if (!strcmp(key, "load")) {
        if ((rc = get_num(ld, v, nm, 1e-9, 1e9, 0, &d)))
            return rc;
        m->load = d;
        return 0;
    }
    if (!strcmp(key, "replicas")) {
        if ((rc = get_num(ld, v, nm, 1, FLEET_MAX_HOSTS, 1, &d)))
            return rc;
        m->replicas = (uint32_t)d;
        return 0;
    }
    return unknown(ld, k, key, c->what);
}

/* A sequence of mappings into hosts or models. */
static int ld_items(ld_t *ld, const yaml_node_t *v, const char *what, size_t max, void **arr,
                    size_t elem, size_t line_off, size_t *n, fleet_t *f, ld_pair_fn fn,
                    unsigned required, const char *const *req_names)
{
    if (v->type != YAML_SEQUENCE_NODE || v->data.sequence.items.top == v->data.sequence.items.start)
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s must be a non-empty list", what);
    size_t cnt = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (cnt > max)
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s: at most %zu entries", what, max);
    *arr = calloc(cnt, elem);
    if (!*arr)
        return FLEET_ERR_NOMEM;
    for (size_t i = 0; i < cnt; i++) {
        const yaml_node_t *it = yaml_document_get_node(ld->doc, v->data.sequence.items.start[i]);
        item_ctx_t c = {.f = f, .i = i};
        snprintf(c.what, sizeof c.what, "%s[%zu]", what, i);
        *n = i + 1;
        *(int *)((char *)*arr + i * elem + line_off) = (int)it->start_mark.line + 1;
        int rc = ld_map(ld, it, c.what, &c, fn);
        if (rc)
            return rc;
        for (unsigned b = 0; (1u << b) <= required; b++)
            if ((required & (1u << b)) && !(c.seen & (1u << b)))
                return ld_fail(ld, it, FLEET_ERR_INVALID, "%s: '%s' is required", c.what,
                               req_names[b]);
    }
    return 0;
}

static int top_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                    const yaml_node_t *v)
{
    fleet_t *f = ctx;
    static const char *const host_req[] = {"name", "http", "device_memory", "host_memory"};
    static const char *const model_req[] = {"name", "path", "size"};
    if (!strcmp(key, "proxy"))
        return ld_map(ld, v, "proxy", f, proxy_pair);
    if (!strcmp(key, "defaults"))
        return ld_map(ld, v, "defaults", f, defaults_pair);
    if (!strcmp(key, "kubernetes"))
        return ld_map(ld, v, "kubernetes", f, k8s_pair);
    if (!strcmp(key, "hosts"))
        return ld_items(ld, v, "hosts", FLEET_MAX_HOSTS, (void **)&f->hosts, sizeof *f->hosts,
                        offsetof(fleet_host_t, line), &f->n_hosts, f, host_pair, 15, host_req);
    if (!strcmp(key, "models"))
        return ld_items(ld, v, "models", FLEET_MAX_MODELS, (void **)&f->models, sizeof *f->models,
                        offsetof(fleet_model_t, line), &f->n_models, f, model_pair, 7, model_req);
    return unknown(ld, k, key, "the fleet file");
}

static int set_default(char **field, const char *value)
{
    if (*field)
        return 0;
    *field = strdup(value);
    return *field ? 0 : FLEET_ERR_NOMEM;
}

/* fleet_opt_names' defaults for what the file did not set, first and in the table's order;
 * then drain_timeout_ms from scheduler.drain_timeout (the daemon's default if unset). */
static int finish_options(ld_t *ld, fleet_t *f)
{
    size_t n_named = sizeof fleet_opt_names / sizeof *fleet_opt_names, k = 0;
    for (size_t i = 0; i < n_named; i++) {
        const char *opt = fleet_opt_names[i].option;
        size_t j = 0;
        while (j < f->defaults.n_options && strcmp(f->defaults.options[j], opt))
            j++;
        if (j == f->defaults.n_options) {
            if (!fleet_opt_names[i].def)
                continue;
            if (put_option(f, opt, fleet_opt_names[i].def))
                return FLEET_ERR_NOMEM;
        }
        /* move it to position k: the named options lead, in the table's order */
        char *o = f->defaults.options[j], *v = f->defaults.values[j];
        memmove(&f->defaults.options[k + 1], &f->defaults.options[k], (j - k) * sizeof o);
        memmove(&f->defaults.values[k + 1], &f->defaults.values[k], (j - k) * sizeof v);
        f->defaults.options[k] = o;
        f->defaults.values[k++] = v;
    }
    f->defaults.drain_timeout_ms = 30000;
    for (size_t j = 0; j < f->defaults.n_options; j++) {
        char why[128];
        if (!strcmp(f->defaults.options[j], "scheduler.drain_timeout") &&
            cfg_parse_duration_ms(f->defaults.values[j], &f->defaults.drain_timeout_ms, why,
                                  sizeof why))
            return ld_fail(ld, NULL, FLEET_ERR_INVALID, "defaults.drain_timeout: %s", why);
    }
    return 0;
}

/* Defaults, then the checks that span entries. */
static int ld_finish(ld_t *ld, fleet_t *f, const yaml_node_t *root)
{
    int rc;
    if (!f->proxy.listen || !f->proxy.n_addresses)
        return ld_fail(ld, root, FLEET_ERR_INVALID,
                       "proxy.listen and proxy.addresses are required");
    if (!f->n_hosts || !f->n_models)
        return ld_fail(ld, root, FLEET_ERR_INVALID, "hosts and models are required");
    if ((rc = finish_options(ld, f)))
        return rc;
    if (set_default(&f->defaults.run_dir, "/run/gpuswapd") ||
        set_default(&f->k8s.namespace_, "gpuswapd") ||
        set_default(&f->k8s.image, "gpuswapd:latest") ||
        set_default(&f->k8s.models_dir, "/var/lib/gpuswapd/models"))
        return FLEET_ERR_NOMEM;
    for (size_t i = 0; i < f->n_hosts; i++) {
        fleet_host_t *h = &f->hosts[i];
        if (set_default(&h->run_dir, f->defaults.run_dir) || set_default(&h->pool, "gpuswapd"))
            return FLEET_ERR_NOMEM;
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(f->hosts[j].name, h->name))
                return ld_fail(ld, NULL, FLEET_ERR_INVALID,
                               "hosts[%zu] (line %d): host '%s' is "
                               "also hosts[%zu]",
                               i, h->line, h->name, j);
            if (!strcmp(f->hosts[j].http, h->http))
                return ld_fail(ld, NULL, FLEET_ERR_INVALID,
                               "hosts[%zu] (line %d): http %s is "
                               "also hosts[%zu]'s",
                               i, h->line, h->http, j);
        }
    }
    for (size_t i = 0; i < f->n_models; i++) {
        fleet_model_t *m = &f->models[i];
        if (!m->replicas)
            m->replicas = f->n_hosts < 2 ? 1 : 2;
        if (m->load == 0)
            m->load = 1;
        if (m->replicas > f->n_hosts)
            return ld_fail(ld, NULL, FLEET_ERR_INVALID,
                           "models[%zu] (line %d): '%s' wants %u "
                           "replicas, the fleet has %zu hosts",
                           i, m->line, m->name, m->replicas, f->n_hosts);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(f->models[j].name, m->name))
                return ld_fail(ld, NULL, FLEET_ERR_INVALID,
                               "models[%zu] (line %d): model '%s' "
                               "is also models[%zu]",
                               i, m->line, m->name, j);
    }
    return 0;
}

int fleet_load_string(const char *yaml, const char *name, fleet_t **out, char *err, size_t errlen)
{
    *out = NULL;
    fleet_t *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    f->file = strdup(name);
    f->proxy.max_request = 1u << 20;
    f->proxy.balance_factor = 150;
    f->proxy.check_ms = 1000;
    f->proxy.stream_timeout_ms = 600000;
    f->k8s.port = 8400;
    yaml_parser_t p;
    yaml_document_t doc;
    int have_doc = 0, rc;
    ld_t ld = {.file = name, .doc = &doc, .err = err, .errlen = errlen, .check = cfg_doc_new()};
    if (!f->file || !ld.check || !yaml_parser_initialize(&p)) {
        cfg_doc_free(ld.check);
        free(f->file);
        free(f);
        snprintf(err, errlen, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)yaml, strlen(yaml));
    if (!yaml_parser_load(&p, &doc)) {
        snprintf(err, errlen, "%s:%zu:%zu: %s", name, p.problem_mark.line + 1,
                 p.problem_mark.column + 1, p.problem ? p.problem : "YAML syntax error");
        rc = FLEET_ERR_SYNTAX;
        goto done;
    }
    have_doc = 1;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        rc = ld_fail(&ld, NULL, FLEET_ERR_INVALID, "empty fleet file");
        goto done;
    }
    rc = ld_map(&ld, root, "the fleet file", f, top_pair);
    if (!rc)
        rc = ld_finish(&ld, f, root);
    if (rc == FLEET_ERR_NOMEM)
        snprintf(err, errlen, "out of memory");
done:
    cfg_doc_free(ld.check);
    if (have_doc)
        yaml_document_delete(&doc);
    yaml_parser_delete(&p);
    if (rc) {
        fleet_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int fleet_load_file(const char *path, fleet_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return FLEET_ERR_IO;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!nb) {
                free(buf);
                fclose(fp);
                snprintf(err, errlen, "%s: too large or out of memory", path);
                return FLEET_ERR_IO;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        snprintf(err, errlen, "%s: read error", path);
        return FLEET_ERR_IO;
    }
    buf[len] = 0;
    int rc = fleet_load_string(buf, path, out, err, errlen);
    free(buf);
    return rc;
}

void fleet_free(fleet_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_hosts; i++) {
        free(f->hosts[i].name);
        free(f->hosts[i].http);
        free(f->hosts[i].run_dir);
        free(f->hosts[i].pool);
    }
    free(f->hosts);
    for (size_t i = 0; i < f->n_models; i++) {
        free(f->models[i].name);
        free(f->models[i].path);
    }
    free(f->models);
    for (size_t i = 0; i < f->proxy.n_addresses; i++)
        free(f->proxy.addresses[i]);
    free(f->proxy.addresses);
    free(f->proxy.listen);
    for (size_t i = 0; i < f->defaults.n_options; i++) {
        free(f->defaults.options[i]);
        free(f->defaults.values[i]);
    }
    free(f->defaults.options);
    free(f->defaults.values);
    free(f->defaults.run_dir);
    free(f->k8s.namespace_);
    free(f->k8s.image);
    free(f->k8s.models_dir);
    free(f->file);
    free(f);
}

/* ------------------------------------------------------------------ placement */

/* FNV-1a of "model\0host", finished with splitmix64: a uniform 64-bit value
 * that depends only on the two names. */
static uint64_t hrw_hash(const char *model, const char *host)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = model;; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
        if (!*p)
            break;
    }
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* Weighted rendezvous score: higher wins; a host with twice the weight wins
 * twice as many models in expectation. */
static double hrw_score(const char *model, const char *host, double weight)
{
    double u = ((double)(hrw_hash(model, host) >> 11) + 0.5) / 9007199254740992.0; /* (0,1) */
    return weight / -log(u);
}

typedef struct pl_order {
    size_t m;
    double cost;
} pl_order_t;

/* Costliest first, then by name (qsort_r's context: the fleet). */
static int pl_cmp(const void *a, const void *b, void *ctx)
{
    const pl_order_t *x = a, *y = b;
    const fleet_t *f = ctx;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return strcmp(f->models[x->m].name, f->models[y->m].name);
}

int fleet_place(const fleet_t *f, unsigned char *place, char *err, size_t errlen)
{
    size_t H = f->n_hosts, M = f->n_models;
    memset(place, 0, M * H);
    double bytes = 0, load = 0, mem = 0;
    for (size_t m = 0; m < M; m++) {
        bytes += (double)f->models[m].size * f->models[m].replicas;
        load += f->models[m].load;
    }
    for (size_t h = 0; h < H; h++)
        mem += (double)f->hosts[h].device_memory;
    pl_order_t *ord = calloc(M, sizeof *ord);
    double *used = calloc(H, sizeof *used), *share = calloc(H, sizeof *share);
    uint64_t *held = calloc(H, sizeof *held);
    if (!ord || !used || !share || !held) {
        free(ord);
        free(used);
        free(share);
        free(held);
        snprintf(err, errlen, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    /* a placement costs its share of all bytes plus its share of all load;
     * the costs add up to 2, and a host's fair part is its share of memory */
    for (size_t m = 0; m < M; m++) {
        ord[m].m = m;
        ord[m].cost =
            (double)f->models[m].size / bytes + f->models[m].load / f->models[m].replicas / load;
    }
    for (size_t h = 0; h < H; h++)
        share[h] = mem > 0 ? 2.0 * (double)f->hosts[h].device_memory / mem : 2.0 / (double)H;
    qsort_r(ord, M, sizeof *ord, pl_cmp, (void *)f);
    /* costliest models first, each replica on the best-ranked host with room */
    for (size_t i = 0; i < M; i++) {
        size_t m = ord[i].m;
        const fleet_model_t *mo = &f->models[m];
        for (uint32_t r = 0; r < mo->replicas; r++) {
            size_t best = H, fallback = H;
            double best_s = -1, fb_ratio = INFINITY;
            for (size_t h = 0; h < H; h++) {
                if (place[m * H + h])
                    continue;
                double w = share[h] / 2.0;
                double s = hrw_score(mo->name, f->hosts[h].name, w);
                double after = used[h] + ord[i].cost;
                if (after <= FLEET_SLACK * share[h] && s > best_s) {
                    best_s = s;
                    best = h;
                }
                double ratio = after / share[h];
                if (ratio < fb_ratio || (ratio == fb_ratio && fallback < H &&
                                         strcmp(f->hosts[h].name, f->hosts[fallback].name) < 0)) {
                    fb_ratio = ratio;
                    fallback = h;
                }
            }
            if (best == H)
                best = fallback;
            place[m * H + best] = 1;
            used[best] += ord[i].cost;
            held[best] += mo->size;
        }
    }
    int rc = 0;
    for (size_t h = 0; h < H && !rc; h++)
        if (f->hosts[h].host_memory && held[h] > f->hosts[h].host_memory) {
            char a[32], b[32];
            snprintf(err, errlen,
                     "%s:%d: host '%s' must hold %s of models, more than its "
                     "host_memory %s: add hosts or memory, or lower replicas",
                     f->file, f->hosts[h].line, f->hosts[h].name,
                     cfg_format_size(held[h], a, sizeof a),
                     cfg_format_size(f->hosts[h].host_memory, b, sizeof b));
            rc = FLEET_ERR_PLACE;
        }
    free(ord);
    free(used);
    free(share);
    free(held);
    return rc;
}

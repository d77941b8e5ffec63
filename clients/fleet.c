/* fleet: loads fleet.yaml, places every model on `replicas` hosts by bounded rendezvous hashing, and renders each host's gpuswapd.yaml, systemd drop-ins, haproxy.cfg and Kubernetes manifests. */
#include "fleet.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "config.h"
#include "hostport.h"

#define FLEET_SLACK 1.5          /* a host carries at most this multiple of its share */
#define FLEET_HEADER_BYTES 16384 /* bytes of request headers HAProxy's buffer leaves room for */
#define FLEET_MAXREWRITE 1024    /* HAProxy's tune.maxrewrite default, reserved in the buffer */
#define FLEET_EPP_PORT 9002      /* the endpoint picker's ext-proc gRPC port (GIE v1.0.0) */
#define FLEET_EPP_HEALTH_PORT 9003
#define FLEET_GIE_VERSION "v1.0.0" /* the Gateway API Inference Extension release we target */

/* ------------------------------------------------------------------ loading */

typedef struct ld {
    const char *file;
    yaml_document_t *doc;
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

/* A size per second: "25GiB" or "25GiB/s". */
static int get_rate(ld_t *ld, const yaml_node_t *v, const char *key, uint64_t *out)
{
    const char *s = scalar(v);
    char buf[64], why[128] = "";
    size_t l = s ? strlen(s) : 0;
    if (!s || l >= sizeof buf)
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid rate for %s", key);
    memcpy(buf, s, l + 1);
    if (l > 2 && strcmp(buf + l - 2, "/s") == 0)
        buf[l - 2] = 0;
    if (cfg_parse_size(buf, out, why, sizeof why))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid rate \"%s\" for %s (%s)", s, key, why);
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
    char *end = NULL;
    errno = 0;
    double d = s && *s ? strtod(s, &end) : NAN;
    if (!s || !*s || *end || errno || !(d >= lo && d <= hi) || (integer && d != floor(d)))
        return ld_fail(ld, v, FLEET_ERR_INVALID, "invalid value \"%s\" for %s (%s %g..%g)",
                       s ? s : "", key, integer ? "an integer" : "a number", lo, hi);
    *out = d;
    return 0;
}

static int get_bool(ld_t *ld, const yaml_node_t *v, const char *key, int *out)
{
    const char *s = scalar(v);
    if (s && (!strcasecmp(s, "true") || !strcasecmp(s, "yes")))
        *out = 1;
    else if (s && (!strcasecmp(s, "false") || !strcasecmp(s, "no")))
        *out = 0;
    else
        return ld_fail(ld, v, FLEET_ERR_INVALID, "%s must be true or false", key);
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
        return 0;
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

static int defaults_pair(ld_t *ld, void *ctx, const char *key, const yaml_node_t *k,
                         const yaml_node_t *v)
{
    fleet_t *f = ctx;
    double d;
    int rc;
    if (!strcmp(key, "backend")) {
        if ((rc = get_str(ld, v, "defaults.backend", &f->defaults.backend)))
            return rc;
        static const char *const ok[] = {"auto", "cuda", "sim", "cpu"};
        for (size_t i = 0; i < 4; i++)
            if (!strcmp(f->defaults.backend, ok[i]))
                return 0;
        return ld_fail(ld, v, FLEET_ERR_INVALID, "defaults.backend must be auto, cuda, sim or cpu");
    }
    if (!strcmp(key, "page_size"))
        return get_size(ld, v, "defaults.page_size", &f->defaults.page_size);
    if (!strcmp(key, "threads")) {
        if ((rc = get_num(ld, v, "defaults.threads", 0, 4096, 1, &d)))
            return rc;
        f->defaults.threads = (uint32_t)d;
        return 0;
    }
    if (!strcmp(key, "sim_bandwidth"))
        return get_rate(ld, v, "defaults.sim_bandwidth", &f->defaults.sim_bandwidth);
    if (!strcmp(key, "run_dir"))
        return get_str(ld, v, "defaults.run_dir", &f->defaults.run_dir);
    if (!strcmp(key, "vllm_compat"))
        return get_bool(ld, v, "defaults.vllm_compat", &f->defaults.vllm_compat);
    if (!strcmp(key, "drain_timeout"))
        return get_ms(ld, v, "defaults.drain_timeout", &f->defaults.drain_timeout_ms);
    return unknown(ld, k, key, "defaults");
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
        /* hostport.h's syntax, as the daemon's listen.http takes it: what the host's
         * gpuswapd.yaml gets passes its --check-config */
        return hostport_check(h->http, why, sizeof why)
                   ? ld_fail(ld, v, FLEET_ERR_INVALID, "%s \"%s\" is not host:port (%s)", nm,
                             h->http, why)
                   : 0;
    }
    if (!strcmp(key, "device_memory")) {
        c->seen |= 4;
        return get_size(ld, v, nm, &h->device_memory);
    }
    if (!strcmp(key, "host_memory")) {
        c->seen |= 8;
        return get_size(ld, v, nm, &h->host_memory);
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

/* Defaults, then the checks that span entries. */
static int ld_finish(ld_t *ld, fleet_t *f, const yaml_node_t *root)
{
    if (!f->proxy.listen || !f->proxy.n_addresses)
        return ld_fail(ld, root, FLEET_ERR_INVALID,
                       "proxy.listen and proxy.addresses are required");
    if (!f->n_hosts || !f->n_models)
        return ld_fail(ld, root, FLEET_ERR_INVALID, "hosts and models are required");
    if (set_default(&f->defaults.backend, "auto") ||
        set_default(&f->defaults.run_dir, "/run/gpuswapd") ||
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
    f->defaults.page_size = 2u << 20;
    f->defaults.vllm_compat = 1;
    f->defaults.drain_timeout_ms = 30000;
    f->k8s.port = 8400;
    yaml_parser_t p;
    yaml_document_t doc;
    int have_doc = 0, rc;
    ld_t ld = {.file = name, .doc = &doc, .err = err, .errlen = errlen};
    if (!f->file || !yaml_parser_initialize(&p)) {
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
    free(f->defaults.backend);
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

/* ------------------------------------------------------------------ writing */

typedef struct wr {
    const char *dir;
    char *err;
    size_t errlen;
} wr_t;

/* mkdir -p of path's directories (path itself is a file). */
static int mkdirs_for(wr_t *w, const char *path)
{
    char buf[4096];
    if (strlen(path) >= sizeof buf) {
        snprintf(w->err, w->errlen, "%s: path too long", path);
        return FLEET_ERR_IO;
    }
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            snprintf(w->err, w->errlen, "%s: cannot create: %s", buf, strerror(errno));
            return FLEET_ERR_IO;
        }
        *p = '/';
    }
    return 0;
}

/* Opens DIR/rel for writing into a temporary file that wr_close renames. */
static FILE *wr_open(wr_t *w, const char *rel, char *tmp, size_t tmplen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", w->dir, rel);
    if (mkdirs_for(w, path))
        return NULL;
    snprintf(tmp, tmplen, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp)
        snprintf(w->err, w->errlen, "%s: cannot write: %s", tmp, strerror(errno));
    return fp;
}

static int wr_close(wr_t *w, FILE *fp, const char *tmp)
{
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) {
        snprintf(w->err, w->errlen, "%s: write error", tmp);
        unlink(tmp);
        return FLEET_ERR_IO;
    }
    char path[4096];
    snprintf(path, sizeof path, "%.*s", (int)(strlen(tmp) - 4), tmp);
    if (rename(tmp, path) != 0) {
        snprintf(w->err, w->errlen, "%s: cannot rename: %s", path, strerror(errno));
        unlink(tmp);
        return FLEET_ERR_IO;
    }
    return 0;
}

/* The fleet file's base name, as rendered files cite it (wherever it was rendered from). */
static const char *src_name(const fleet_t *f)
{
    const char *b = strrchr(f->file, '/');
    return b ? b + 1 : f->file;
}

/* A YAML double-quoted scalar: paths may hold ": " or " #", which plain scalars may not. */
static void put_quoted(FILE *fp, const char *v)
{
    fputc('"', fp);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(fp, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(fp, "\\x%02x", *p);
        else
            fputc(*p, fp);
    }
    fputc('"', fp);
}

static const char *sz(uint64_t v, char *buf, size_t n)
{
    return cfg_format_size(v, buf, n);
}

/* One host's gpuswapd.yaml. k8s: the pod's variant (listens on every
 * address of the pod, sockets in /run/gpuswapd). */
static void put_host_config(FILE *fp, const fleet_t *f, const unsigned char *place, size_t h,
                            int k8s)
{
    const fleet_host_t *ho = &f->hosts[h];
    size_t H = f->n_hosts, n = 0;
    uint64_t bytes = 0;
    double load = 0;
    char a[32], b[32];
    for (size_t m = 0; m < f->n_models; m++)
        if (place[m * H + h]) {
            n++;
            bytes += f->models[m].size;
            load += f->models[m].load / f->models[m].replicas;
        }
    const char *run = k8s ? "/run/gpuswapd" : ho->run_dir;
    fprintf(fp,
            "# gpuswapd on %s, rendered by `gpuswap fleet render %s`: re-render, do not edit.\n"
            "# %zu models, %s of weights, expected load %.3g (the fleet's units).\n",
            ho->name, src_name(f), n, sz(bytes, a, sizeof a), load);
    char sock[4200];
    snprintf(sock, sizeof sock, "%s/gpuswapd.sock", run);
    fprintf(fp, "listen:\n  socket: ");
    put_quoted(fp, sock);
    fputc('\n', fp);
    if (k8s) {
        fprintf(fp, "  http: 0.0.0.0:%u\n", f->k8s.port);
    } else if (ho->http[0] == '[') { /* [::1]:8400 plain would be a YAML flow sequence */
        fprintf(fp, "  http: ");
        put_quoted(fp, ho->http);
        fputc('\n', fp);
    } else {
        fprintf(fp, "  http: %s\n", ho->http);
    }
    /* a draining host fails /ready and keeps serving for three health checks, so the
     * proxy takes it out of rotation before it refuses anything */
    uint64_t linger = 3 * f->proxy.check_ms < 1000 ? 1000 : 3 * f->proxy.check_ms;
    snprintf(sock, sizeof sock, "%s/admin.sock", run);
    fprintf(fp, "  max_line: %s\n  drain_linger: %s\nadmin:\n  socket: ",
            sz(f->proxy.max_request, a, sizeof a), cfg_format_duration_ms(linger, b, sizeof b));
    put_quoted(fp, sock);
    fputc('\n', fp);
    fprintf(fp, "device:\n  backend: %s\n  memory: %s\n  page_size: %s\n  threads: %u\n",
            f->defaults.backend, sz(ho->device_memory, a, sizeof a),
            sz(f->defaults.page_size, b, sizeof b), f->defaults.threads);
    if (f->defaults.sim_bandwidth)
        fprintf(fp, "  sim_bandwidth: %s\n", sz(f->defaults.sim_bandwidth, a, sizeof a));
    fprintf(fp,
            "host:\n  memory: %s\nscheduler:\n  drain_timeout: %s\nmetrics:\n  vllm_compat: %s\n",
            sz(ho->host_memory, a, sizeof a),
            cfg_format_duration_ms(f->defaults.drain_timeout_ms, b, sizeof b),
            f->defaults.vllm_compat ? "true" : "false");
    if (!k8s)
        fprintf(
            fp,
            "# API keys: add an auth: section (README \"API keys\"; http: true, keys from `gpuswap keygen`)\n"
            "# with this host's HAProxy addresses in auth.trusted_proxies, so that its back-off after\n"
            "# failed keys counts per client (X-Forwarded-For) rather than per proxy.\n");
    fprintf(fp, "models:\n");
    for (size_t m = 0; m < f->n_models; m++)
        if (place[m * H + h]) {
            fprintf(fp, "  - name: %s\n    path: ", f->models[m].name);
            put_quoted(fp, f->models[m].path);
            fputc('\n', fp);
        }
}

static int render_hosts(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char rel[1024], tmp[4200];
    for (size_t h = 0; h < f->n_hosts; h++) {
        const fleet_host_t *ho = &f->hosts[h];
        snprintf(rel, sizeof rel, "hosts/%s/gpuswapd.yaml", ho->name);
        FILE *fp = wr_open(w, rel, tmp, sizeof tmp);
        if (!fp)
            return FLEET_ERR_IO;
        put_host_config(fp, f, place, h, 0);
        if (wr_close(w, fp, tmp))
            return FLEET_ERR_IO;
        snprintf(rel, sizeof rel, "hosts/%s/gpuswapd.service.d/fleet.conf", ho->name);
        if (!(fp = wr_open(w, rel, tmp, sizeof tmp)))
            return FLEET_ERR_IO;
        fprintf(fp,
                "# /etc/systemd/system/gpuswapd.service.d/fleet.conf on %s, rendered by\n"
                "# `gpuswap fleet render %s`: the unit allows only localhost; the fleet's\n"
                "# proxy connects to listen.http (%s) from these addresses.\n"
                "[Service]\nIPAddressAllow=",
                ho->name, src_name(f), ho->http);
        for (size_t i = 0; i < f->proxy.n_addresses; i++)
            fprintf(fp, "%s%s", i ? " " : "", f->proxy.addresses[i]);
        fprintf(fp, "\n");
        if (wr_close(w, fp, tmp))
            return FLEET_ERR_IO;
    }
    return 0;
}

/* tune.bufsize: the largest request body plus its headers plus the rewrite
 * reserve, rounded up to 16 bytes and never below HAProxy's default. */
static uint64_t haproxy_bufsize(const fleet_t *f)
{
    uint64_t b = f->proxy.max_request + FLEET_HEADER_BYTES + FLEET_MAXREWRITE;
    b = (b + 15) / 16 * 16;
    return b < 16384 ? 16384 : b;
}

static void put_servers(FILE *fp, const fleet_t *f, const unsigned char *place, size_t m)
{
    for (size_t h = 0; h < f->n_hosts; h++)
        if (m == (size_t)-1 || place[m * f->n_hosts + h])
            fprintf(fp, "    server %s %s\n", f->hosts[h].name, f->hosts[h].http);
}

static int render_haproxy(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200], a[32];
    FILE *fp = wr_open(w, "haproxy.cfg", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    uint64_t bufsize = haproxy_bufsize(f);
    uint64_t maxconn = (uint64_t)(1ull << 30) / (2 * bufsize); /* two buffers a connection, 1 GiB */
    if (maxconn > 20000)
        maxconn = 20000;
    if (maxconn < 256)
        maxconn = 256;
    unsigned long long inter = (unsigned long long)f->proxy.check_ms;
    fprintf(
        fp,
        "# HAProxy (>= 2.6) in front of the gpuswapd fleet, rendered by `gpuswap fleet render %s`:\n"
        "# re-render, do not edit. Each request goes to a backend of its model's replicas,\n"
        "# the model read from the JSON body; within it consistent hashing of the model name\n"
        "# keeps it on one replica until that one has more than %u%% of the average load, so\n"
        "# a hot model spills to its other replicas. Hosts leave rotation when /ready fails\n"
        "# (draining, models not loaded), and requests are retried on another replica when\n"
        "# the connection fails or the host answers 503 before any response started.\n"
        "global\n"
        "    maxconn %llu\n"
        "    # the whole request must fit one buffer to be read as JSON and to be retried:\n"
        "    # proxy.max_request %s + %u of headers + the %u-byte rewrite reserve\n"
        "    tune.bufsize %llu\n"
        "\n"
        "defaults\n"
        "    mode http\n"
        "    option http-buffer-request\n"
        "    # a fresh connection to the host per request: a generation is never retried once\n"
        "    # sent, so never send one on a pooled connection the host may have closed\n"
        "    option http-server-close\n"
        "    timeout connect 2s\n"
        "    timeout http-request 30s\n"
        "    timeout queue 30s\n"
        "    # a generation may be silent this long between two streamed chunks (and until\n"
        "    # the answer of a request that does not stream)\n"
        "    timeout client %llus\n"
        "    timeout server %llus\n"
        "    timeout http-keep-alive 10s\n"
        "    timeout check 2s\n"
        "    retries 3\n"
        "    retry-on conn-failure 503\n"
        "    option redispatch 1\n"
        "    # the client's address for the hosts' back-off after failed API keys (they believe\n"
        "    # it from this proxy only when it is in their auth.trusted_proxies)\n"
        "    option forwardfor\n"
        "    option httpchk GET /ready\n"
        "    http-check expect status 200\n"
        "    # a refused connection or a 5xx (a draining host answers 503) takes the host out at\n"
        "    # once, so the retry goes to another replica; /ready checks bring it back\n"
        "    default-server check inter %llums fastinter %llums downinter %llums fall 1 rise 1 "
        "observe layer7 error-limit 1 on-error mark-down\n"
        "\n"
        "frontend gpuswapd\n"
        "    # TLS ends here: for clients outside a trusted network bind with a certificate\n"
        "    # (the PEM holds the chain and the key), e.g.\n"
        "    #   bind :443 ssl crt /etc/haproxy/certs/gpuswapd.pem alpn h2,http/1.1\n"
        "    # API keys (auth: in each host's gpuswapd.yaml, http: true) pass through untouched in\n"
        "    # the Authorization header: never expose a keyed port without TLS\n"
        "    bind %s\n"
        "    http-request set-var(txn.model) req.body,json_query('$.model') if { method POST }\n",
        src_name(f), f->proxy.balance_factor, (unsigned long long)maxconn,
        sz(f->proxy.max_request, a, sizeof a), FLEET_HEADER_BYTES, FLEET_MAXREWRITE,
        (unsigned long long)bufsize, (unsigned long long)(f->proxy.stream_timeout_ms / 1000),
        (unsigned long long)(f->proxy.stream_timeout_ms / 1000), inter, inter, inter,
        f->proxy.listen);
    for (size_t m = 0; m < f->n_models; m++)
        fprintf(fp, "    use_backend model_%s if { var(txn.model) -m str %s }\n", f->models[m].name,
                f->models[m].name);
    fprintf(fp, "    # /v1/models, /health, /metrics and unknown models: any host that is ready\n"
                "    default_backend any\n");
    for (size_t m = 0; m < f->n_models; m++) {
        fprintf(fp,
                "\nbackend model_%s\n"
                "    balance hash var(txn.model)\n"
                "    hash-type consistent\n"
                "    hash-balance-factor %u\n",
                f->models[m].name, f->proxy.balance_factor);
        put_servers(fp, f, place, m);
    }
    fprintf(fp, "\nbackend any\n    balance roundrobin\n");
    put_servers(fp, f, place, (size_t)-1);
    return wr_close(w, fp, tmp);
}

static int render_placement(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200], a[32];
    FILE *fp = wr_open(w, "placement.txt", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    size_t H = f->n_hosts;
    fprintf(fp, "# placement rendered from %s: model -> hosts, then host -> bytes, load, models\n",
            src_name(f));
    for (size_t m = 0; m < f->n_models; m++) {
        fprintf(fp, "%s:", f->models[m].name);
        for (size_t h = 0; h < H; h++)
            if (place[m * H + h])
                fprintf(fp, " %s", f->hosts[h].name);
        fprintf(fp, "\n");
    }
    for (size_t h = 0; h < H; h++) {
        uint64_t bytes = 0;
        double load = 0;
        size_t n = 0;
        for (size_t m = 0; m < f->n_models; m++)
            if (place[m * H + h]) {
                bytes += f->models[m].size;
                load += f->models[m].load / f->models[m].replicas;
                n++;
            }
        fprintf(fp, "host %s: %zu models, %s, load %.4g\n", f->hosts[h].name, n,
                sz(bytes, a, sizeof a), load);
    }
    return wr_close(w, fp, tmp);
}

/* ------------------------------------------------------------------ Kubernetes */

static void put_labels(FILE *fp, int indent, const char *pool)
{
    fprintf(fp, "%*sapp.kubernetes.io/name: gpuswapd\n", indent, "");
    if (pool)
        fprintf(fp, "%*sgpuswapd/pool: %s\n", indent, "", pool);
}

static int render_k8s_pool(wr_t *w, const fleet_t *f, const unsigned char *place, const char *pool,
                           unsigned port)
{
    char rel[1024], tmp[4200];
    snprintf(rel, sizeof rel, "k8s/pool-%s.yaml", pool);
    FILE *fp = wr_open(w, rel, tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    const char *ns = f->k8s.namespace_;
    size_t n = 0;
    fprintf(fp,
            "# Node pool '%s': its hosts' configs (ConfigMap, one key per pod ordinal) and the\n"
            "# StatefulSet running them; rendered by `gpuswap fleet render %s`.\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpuswapd-%s-config\n"
            "  namespace: %s\n  labels:\n",
            pool, src_name(f), pool, ns);
    put_labels(fp, 4, pool);
    fprintf(fp, "data:\n");
    for (size_t h = 0; h < f->n_hosts; h++) {
        if (strcmp(f->hosts[h].pool, pool))
            continue;
        fprintf(fp, "  # pod gpuswapd-%s-%zu is host '%s'\n  \"%zu.yaml\": |\n", pool, n,
                f->hosts[h].name, n);
        char *text = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&text, &len);
        if (!mf) {
            fclose(fp);
            unlink(tmp);
            snprintf(w->err, w->errlen, "out of memory");
            return FLEET_ERR_NOMEM;
        }
        put_host_config(mf, f, place, h, 1);
        fclose(mf);
        for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            fprintf(fp, "    %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        }
        free(text);
        n++;
    }
    uint64_t grace = f->defaults.drain_timeout_ms / 1000 + 15;
    fprintf(
        fp,
        "---\n"
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: gpuswapd-%s\n  namespace: %s\n"
        "  labels:\n",
        pool, ns);
    put_labels(fp, 4, pool);
    fprintf(fp,
            "spec:\n"
            "  serviceName: gpuswapd\n"
            "  replicas: %zu\n"
            "  podManagementPolicy: Parallel\n"
            "  selector:\n    matchLabels:\n",
            n);
    put_labels(fp, 6, pool);
    fprintf(fp, "  template:\n    metadata:\n      labels:\n");
    put_labels(fp, 8, pool);
    fprintf(
        fp,
        "      annotations:\n"
        "        prometheus.io/scrape: \"true\"\n"
        "        prometheus.io/port: \"%u\"\n"
        "        prometheus.io/path: /metrics\n"
        "    spec:\n"
        "      # SIGTERM drains: /ready fails at once, running requests finish\n"
        "      terminationGracePeriodSeconds: %llu\n"
        "      nodeSelector:\n"
        "        gpuswapd/pool: %s\n"
        "      containers:\n"
        "        - name: gpuswapd\n"
        "          image: %s\n"
        "          # the pod's ordinal picks its host's config\n"
        "          command: [\"/bin/sh\", \"-c\", \"exec gpuswapd --config /etc/gpuswapd/${HOSTNAME##*-}.yaml\"]\n"
        "          ports:\n"
        "            - name: http\n"
        "              containerPort: %u\n"
        "          readinessProbe:\n"
        "            httpGet:\n              path: /ready\n              port: http\n"
        "            periodSeconds: 2\n"
        "            failureThreshold: 1\n"
        "          livenessProbe:\n"
        "            httpGet:\n              path: /health\n              port: http\n"
        "            periodSeconds: 10\n"
        "            failureThreshold: 3\n"
        "          startupProbe:\n"
        "            httpGet:\n              path: /health\n              port: http\n"
        "            periodSeconds: 5\n"
        "            failureThreshold: 120\n"
        "          resources:\n"
        "            limits:\n"
        "              nvidia.com/gpu: 1\n"
        "          volumeMounts:\n"
        "            - name: config\n              mountPath: /etc/gpuswapd\n              readOnly: true\n"
        "            - name: models\n              mountPath: %s\n              readOnly: true\n"
        "            - name: run\n              mountPath: /run/gpuswapd\n"
        "      volumes:\n"
        "        - name: config\n          configMap:\n            name: gpuswapd-%s-config\n"
        "        - name: models\n          hostPath:\n            path: %s\n            type: Directory\n"
        "        - name: run\n          emptyDir: {}\n",
        port, (unsigned long long)grace, pool, f->k8s.image, port, f->k8s.models_dir, pool,
        f->k8s.models_dir);
    return wr_close(w, fp, tmp);
}

static int render_k8s(wr_t *w, const fleet_t *f, const unsigned char *place)
{
    char tmp[4200];
    unsigned port0 = f->k8s.port;
    /* pools in order of first appearance */
    for (size_t h = 0; h < f->n_hosts; h++) {
        size_t j = 0;
        while (j < h && strcmp(f->hosts[j].pool, f->hosts[h].pool))
            j++;
        if (j < h)
            continue;
        int rc = render_k8s_pool(w, f, place, f->hosts[h].pool, port0);
        if (rc)
            return rc;
    }
    const char *ns = f->k8s.namespace_;
    FILE *fp = wr_open(w, "k8s/service.yaml", tmp, sizeof tmp);
    if (!fp)
        return FLEET_ERR_IO;
    fprintf(fp,
            "# The pods' stable DNS names (gpuswapd-<pool>-<n>.gpuswapd.%s.svc), rendered by\n"
            "# `gpuswap fleet render %s`.\n"
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: gpuswapd\n  namespace: %s\n"
            "  labels:\n",
            ns, src_name(f), ns);
    put_labels(fp, 4, NULL);
    fprintf(fp, "spec:\n  clusterIP: None\n  publishNotReadyAddresses: false\n  selector:\n");
    put_labels(fp, 4, NULL);
    fprintf(fp, "  ports:\n    - name: http\n      port: %u\n      targetPort: http\n", port0);
    int rc = wr_close(w, fp, tmp);
    if (rc)
        return rc;
    if (!(fp = wr_open(w, "k8s/inferencepool.yaml", tmp, sizeof tmp)))
        return FLEET_ERR_IO;
    fprintf(fp,
            "# The Gateway API Inference Extension (" FLEET_GIE_VERSION
            ") over the fleet, rendered by\n"
            "# `gpuswap fleet render %s`: an InferencePool of every gpuswapd pod and its\n"
            "# endpoint picker, which scrapes each pod's /metrics (metrics.vllm_compat names) and\n"
            "# prefers pods where the request's model is resident (lora-affinity-scorer), then\n"
            "# short queues and free KV cache. An HTTPRoute of your Gateway points at the pool.\n"
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
            "metadata:\n  name: gpuswapd\n  namespace: %s\n"
            "spec:\n  targetPorts:\n    - number: %u\n  selector:\n    matchLabels:\n",
            src_name(f), ns, port0);
    put_labels(fp, 6, NULL);
    fprintf(
        fp,
        "  endpointPickerRef:\n    name: gpuswapd-epp\n    kind: Service\n    port:\n"
        "      number: %u\n"
        "---\n"
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "spec:\n  selector:\n    app.kubernetes.io/name: gpuswapd-epp\n  ports:\n"
        "    - name: grpc\n      protocol: TCP\n      port: %u\n      targetPort: %u\n"
        "      appProtocol: http2\n  type: ClusterIP\n"
        "---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpuswapd-epp-config\n  namespace: %s\n"
        "data:\n  plugins.yaml: |\n"
        "    apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
        "    kind: EndpointPickerConfig\n"
        "    plugins:\n"
        "      - type: lora-affinity-scorer\n"
        "      - type: queue-scorer\n"
        "      - type: kv-cache-utilization-scorer\n"
        "      - type: max-score-picker\n"
        "    schedulingProfiles:\n"
        "      - name: default\n"
        "        plugins:\n"
        "          - pluginRef: lora-affinity-scorer\n"
        "            weight: 4\n"
        "          - pluginRef: queue-scorer\n"
        "            weight: 1\n"
        "          - pluginRef: kv-cache-utilization-scorer\n"
        "            weight: 1\n"
        "          - pluginRef: max-score-picker\n"
        "---\n"
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "spec:\n  replicas: 1\n  selector:\n    matchLabels:\n"
        "      app.kubernetes.io/name: gpuswapd-epp\n"
        "  template:\n    metadata:\n      labels:\n        app.kubernetes.io/name: gpuswapd-epp\n"
        "    spec:\n      serviceAccountName: gpuswapd-epp\n"
        "      terminationGracePeriodSeconds: 130\n"
        "      containers:\n"
        "        - name: epp\n"
        "          image: registry.k8s.io/gateway-api-inference-extension/epp:" FLEET_GIE_VERSION
        "\n"
        "          args:\n"
        "            - --pool-name=gpuswapd\n"
        "            - --pool-namespace=%s\n"
        "            - --grpc-port=%u\n"
        "            - --grpc-health-port=%u\n"
        "            - --config-file=/config/plugins.yaml\n"
        "            # gpuswapd's metrics.vllm_compat names (these are also the defaults)\n"
        "            - --total-queued-requests-metric=vllm:num_requests_waiting\n"
        "            - --kv-cache-usage-percentage-metric=vllm:gpu_cache_usage_perc\n"
        "            - --lora-info-metric=vllm:lora_requests_info\n"
        "          ports:\n"
        "            - containerPort: %u\n"
        "            - containerPort: %u\n"
        "            - name: metrics\n              containerPort: 9090\n"
        "          livenessProbe:\n"
        "            grpc:\n              port: %u\n              service: inference-extension\n"
        "            periodSeconds: 10\n"
        "          readinessProbe:\n"
        "            grpc:\n              port: %u\n              service: inference-extension\n"
        "            periodSeconds: 10\n"
        "          volumeMounts:\n"
        "            - name: config\n              mountPath: /config\n"
        "      volumes:\n"
        "        - name: config\n          configMap:\n            name: gpuswapd-epp-config\n"
        "---\n"
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: gpuswapd-epp\n  namespace: %s\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: gpuswapd-epp\n"
        "  namespace: %s\n"
        "rules:\n"
        "  - apiGroups: [\"inference.networking.k8s.io\"]\n"
        "    resources: [\"inferencepools\"]\n    verbs: [\"get\", \"watch\", \"list\"]\n"
        "  - apiGroups: [\"inference.networking.x-k8s.io\"]\n"
        "    resources: [\"inferenceobjectives\", \"inferencepools\"]\n"
        "    verbs: [\"get\", \"watch\", \"list\"]\n"
        "  - apiGroups: [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"get\", \"watch\", \"list\"]\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n"
        "  name: gpuswapd-epp\n  namespace: %s\n"
        "subjects:\n  - kind: ServiceAccount\n    name: gpuswapd-epp\n    namespace: %s\n"
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: gpuswapd-epp\n",
        FLEET_EPP_PORT, ns, FLEET_EPP_PORT, FLEET_EPP_PORT, ns, ns, ns, FLEET_EPP_PORT,
        FLEET_EPP_HEALTH_PORT, FLEET_EPP_PORT, FLEET_EPP_HEALTH_PORT, FLEET_EPP_HEALTH_PORT,
        FLEET_EPP_HEALTH_PORT, ns, ns, ns, ns);
    return wr_close(w, fp, tmp);
}

int fleet_render(const fleet_t *f, const char *dir, char *err, size_t errlen)
{
    unsigned char *place = calloc(f->n_models * f->n_hosts, 1);
    if (!place) {
        snprintf(err, errlen, "out of memory");
        return FLEET_ERR_NOMEM;
    }
    int rc = fleet_place(f, place, err, errlen);
    wr_t w = {.dir = dir, .err = err, .errlen = errlen};
    if (!rc && mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        rc = FLEET_ERR_IO;
    }
    if (!rc)
        rc = render_hosts(&w, f, place);
    if (!rc)
        rc = render_haproxy(&w, f, place);
    if (!rc)
        rc = render_placement(&w, f, place);
    if (!rc)
        rc = render_k8s(&w, f, place);
    free(place);
    return rc;
}

/* ------------------------------------------------------------------ CLI */

static const char fleet_usage[] =
    "usage: gpuswap fleet render FLEET.yaml --out DIR\n"
    "       gpuswap fleet place FLEET.yaml\n"
    "render writes, deterministically, under DIR: hosts/<host>/gpuswapd.yaml (the\n"
    "models placed on it), hosts/<host>/gpuswapd.service.d/fleet.conf (systemd drop-in\n"
    "allowing the proxy), haproxy.cfg (model-affinity routing), placement.txt and\n"
    "k8s/*.yaml (StatefulSet per node pool, headless Service, InferencePool and its\n"
    "endpoint picker). place prints the placement only. config/fleet/fleet.yaml\n"
    "documents the fleet file. Exit status: 0 ok, 1 invalid fleet or I/O error, 2 usage.\n";

int fleet_main(int argc, char **argv)
{
    const char *verb = argc > 1 ? argv[1] : NULL, *file = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(fleet_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strncmp(argv[i], "--out=", 6))
            out = argv[i] + 6;
        else if (argv[i][0] != '-' && !file)
            file = argv[i];
        else {
            fprintf(stderr, "gpuswap fleet: unexpected argument '%s'\n%s", argv[i], fleet_usage);
            return 2;
        }
    }
    if (verb && (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help"))) {
        fputs(fleet_usage, stdout);
        return 0;
    }
    int render = verb && !strcmp(verb, "render"), place_only = verb && !strcmp(verb, "place");
    if ((!render && !place_only) || !file || (render && !out) || (place_only && out)) {
        fputs(fleet_usage, stderr);
        return 2;
    }
    char err[1024];
    fleet_t *f = NULL;
    if (fleet_load_file(file, &f, err, sizeof err)) {
        fprintf(stderr, "gpuswap fleet: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (render) {
        rc = fleet_render(f, out, err, sizeof err);
        if (!rc)
            printf("rendered %zu hosts, %zu models into %s\n", f->n_hosts, f->n_models, out);
    } else {
        unsigned char *place = calloc(f->n_models * f->n_hosts, 1);
        rc = place ? fleet_place(f, place, err, sizeof err) : FLEET_ERR_NOMEM;
        for (size_t m = 0; !rc && m < f->n_models; m++) {
            printf("%s:", f->models[m].name);
            for (size_t h = 0; h < f->n_hosts; h++)
                if (place[m * f->n_hosts + h])
                    printf(" %s", f->hosts[h].name);
            printf("\n");
        }
        free(place);
        if (rc == FLEET_ERR_NOMEM)
            snprintf(err, sizeof err, "out of memory");
    }
    if (rc)
        fprintf(stderr, "gpuswap fleet: %s\n", err);
    fleet_free(f);
    return rc ? 1 : 0;
}

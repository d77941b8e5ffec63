/* http_metrics: the Prometheus text of GET /metrics, rendered from the worker's one stats report. */
#include "http_int.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/stats.h"

/* Prometheus label value: backslash, double quote and newline escaped. */
static void prom_escape(struct evbuffer *b, const char *v)
{
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '\\')
            evbuffer_add(b, "\\\\", 2);
        else if (*p == '"')
            evbuffer_add(b, "\\\"", 2);
        else if (*p == '\n')
            evbuffer_add(b, "\\n", 2);
        else
            evbuffer_add(b, p, 1);
    }
}

/* # HELP / # TYPE; help text escapes backslash and newline. */
static void prom_family(struct evbuffer *b, const char *name, const char *type, const char *help,
                        const char *help_tail)
{
    evbuffer_add_printf(b, "# HELP gpuswapd_%s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            evbuffer_add(b, "\\\\", 2);
        else if (*p == '\n')
            evbuffer_add(b, "\\n", 2);
        else
            evbuffer_add(b, p, 1);
    }
    evbuffer_add_printf(b, "%s\n# TYPE gpuswapd_%s %s\n", help_tail ? help_tail : "", name, type);
}

/* gpuswapd_<name>{model="..",<k>="<v>"} value; model/k NULL = no such label. */
static void prom_sample(struct evbuffer *b, const char *name, const char *model, const char *k,
                        const char *v, double value)
{
    evbuffer_add_printf(b, "gpuswapd_%s", name);
    if (model || k) {
        evbuffer_add(b, "{", 1);
        if (model) {
            evbuffer_add(b, "model=\"", 7);
            prom_escape(b, model);
            evbuffer_add(b, "\"", 1);
        }
        if (k) {
            evbuffer_add_printf(b, "%s%s=\"", model ? "," : "", k);
            prom_escape(b, v);
            evbuffer_add(b, "\"", 1);
        }
        evbuffer_add(b, "}", 1);
    }
    if (value < 9e15 && value > -9e15 && value == (double)(long long)value)
        evbuffer_add_printf(b, " %lld\n", (long long)value);
    else
        evbuffer_add_printf(b, " %.9g\n", value);
}

typedef struct prom_def {
    const char *key; /* field of the stats report */
    const char *help;
} prom_def_t;

#define PROM_DEF(name, help) {#name, help},
static const prom_def_t prom_model_stats[] = {
    STATS_SVC_COUNTERS(PROM_DEF) STATS_RES_COUNTERS(PROM_DEF) STATS_RES_GAUGES(PROM_DEF)};
static const prom_def_t prom_server_stats[] = {STATS_SERVER_COUNTERS(PROM_DEF)};
static const prom_def_t prom_adapter_stats[] = {STATS_ADAPTER(PROM_DEF)};
#undef PROM_DEF

/* Report fields that are not in the X-macro lists. */
static const prom_def_t prom_model_extra[] = {
    {"curr_queued", "requests waiting in the model's queue"},
    {"curr_active", "sequences in the model's running batch"},
    {"gpu_quota", "configured gpu_quota (weights + KV cache), bytes; 0 = none"},
    {"weight_bytes", "bytes of the model's weights"},
    {"bytes_per_param", "weight bytes per parameter (x 8: bits per weight)"},
    {"prefix_hit_rate", "share of looked-up prompt tokens a cached prefix covered"},
    {"deadline_goodput", "of the requests with a deadline, the share whose first token came within "
                         "it (refusals count as misses)"},
};

/* Every histogram of the stats report (stats.h STATS_HISTS), once each. */
static const struct {
    const char *key, *name, *help;
} prom_hists[] = {
#define PROM_HIST(field, metric, help) {"hist_" #field "_ms", metric, help},
    STATS_HISTS(PROM_HIST)
#undef PROM_HIST
};

/* Stats key -> metric name and kind: total_x -> x_total (counter; x_ns ->
 * x_seconds_total, scaled), curr_x -> x (gauge), other keys gauges as
 * named, bytes-valued ones with a _bytes unit. 1 for a counter. */
static int prom_name(const char *key, char *out, size_t n, double *scale)
{
    *scale = 1;
    if (strncmp(key, "total_", 6) == 0) {
        const char *base = key + 6;
        size_t l = strlen(base);
        if (l > 3 && strcmp(base + l - 3, "_ns") == 0) {
            snprintf(out, n, "%.*s_seconds_total", (int)(l - 3), base);
            *scale = 1e-9;
        } else {
            snprintf(out, n, "%s_total", base);
        }
        return 1;
    }
    if (strncmp(key, "curr_", 5) == 0)
        snprintf(out, n, "%s", key + 5);
    else if (strcmp(key, "gpu_quota") == 0)
        snprintf(out, n, "gpu_quota_bytes");
    else
        snprintf(out, n, "%s", key);
    return 0;
}

static void prom_model_family(struct evbuffer *b, const json_t *models, const prom_def_t *d)
{
    char name[128];
    double scale;
    int counter = prom_name(d->key, name, sizeof name, &scale);
    size_t hl = strlen(d->help);
    int ns = scale != 1 && hl > 4 && strcmp(d->help + hl - 4, ", ns") == 0;
    char help[256];
    snprintf(help, sizeof help, "%.*s", ns ? (int)(hl - 4) : (int)hl, d->help);
    prom_family(b, name, counter ? "counter" : "gauge", help, ns ? ", seconds" : NULL);
    const char *model;
    const json_t *m;
    json_object_foreach ((json_t *)models, model, m) {
        const json_t *v = json_object_get(m, d->key);
        if (json_is_number(v))
            prom_sample(b, name, model, NULL, NULL, json_number_value(v) * scale);
    }
}

static void prom_hist(struct evbuffer *b, const json_t *models, int k)
{
    prom_family(b, prom_hists[k].name, "histogram", prom_hists[k].help, NULL);
    char bucket[96], le[32];
    snprintf(bucket, sizeof bucket, "%s_bucket", prom_hists[k].name);
    const char *model;
    const json_t *m;
    json_object_foreach ((json_t *)models, model, m) {
        const json_t *h = json_object_get(m, prom_hists[k].key);
        const json_t *bs = json_object_get(h, "buckets");
        if (!json_is_array(bs))
            continue;
        uint64_t acc = 0;
        /* the last bucket also holds everything above its bound: only +Inf says it */
        for (size_t i = 0; i + 1 < json_array_size(bs) && i + 1 < STATS_HIST_BUCKETS; i++) {
            acc += (uint64_t)json_integer_value(json_array_get(bs, i));
            snprintf(le, sizeof le, "%.6g", stats_hist_bound((int)i) / 1e3);
            prom_sample(b, bucket, model, "le", le, (double)acc);
        }
        uint64_t count = (uint64_t)json_integer_value(json_object_get(h, "count"));
        prom_sample(b, bucket, model, "le", "+Inf", (double)count);
        char nm[96];
        snprintf(nm, sizeof nm, "%s_sum", prom_hists[k].name);
        prom_sample(b, nm, model, NULL, NULL,
                    json_number_value(json_object_get(h, "sum_ms")) / 1e3);
        snprintf(nm, sizeof nm, "%s_count", prom_hists[k].name);
        prom_sample(b, nm, model, NULL, NULL, (double)count);
    }
}

/* The report's "adapters" (stats.h STATS_ADAPTER), each field one family
 * gpuswapd_adapter_<name>{adapter="..",base=".."}. */
static void prom_adapters(struct evbuffer *b, const json_t *adapters)
{
    for (size_t i = 0; i < sizeof prom_adapter_stats / sizeof *prom_adapter_stats; i++) {
        char name[128], fam[160];
        double scale;
        int counter = prom_name(prom_adapter_stats[i].key, name, sizeof name, &scale);
        snprintf(fam, sizeof fam, "adapter_%s", name);
        prom_family(b, fam, counter ? "counter" : "gauge", prom_adapter_stats[i].help, NULL);
        const char *ad;
        const json_t *a;
        json_object_foreach ((json_t *)adapters, ad, a) {
            const json_t *v = json_object_get(a, prom_adapter_stats[i].key);
            if (!json_is_number(v))
                continue;
            evbuffer_add_printf(b, "gpuswapd_%s{adapter=\"", fam);
            prom_escape(b, ad);
            evbuffer_add(b, "\",base=\"", 8);
            prom_escape(b, json_string_value(json_object_get(a, "base")));
            evbuffer_add_printf(b, "\"} %.17g\n", json_number_value(v) * scale);
        }
    }
}

/* The stats report as Prometheus text exposition 0.0.4. */
static void prom_render(struct evbuffer *b, const json_t *rep)
{
    const json_t *models = json_object_get(rep, "models");
    const json_t *pool = json_object_get(rep, "pool");
    const json_t *server = json_object_get(rep, "server");
    const char *model;
    const json_t *m;

    prom_family(b, "info", "gauge", "the daemon's backend and scheduling policy (always 1)", NULL);
    evbuffer_add(b, "gpuswapd_info{backend=\"", 23);
    prom_escape(b, json_string_value(json_object_get(rep, "backend")));
    evbuffer_add(b, "\",policy=\"", 10);
    prom_escape(b, json_string_value(json_object_get(rep, "policy")));
    evbuffer_add(b, "\"} 1\n", 5);
    prom_family(b, "uptime_seconds", "gauge", "seconds since the daemon started", NULL);
    prom_sample(b, "uptime_seconds", NULL, NULL, NULL,
                json_number_value(json_object_get(rep, "uptime_s")));

    prom_family(b, "pool_pages", "gauge", "device pool pages, by state", NULL);
    prom_sample(b, "pool_pages", NULL, "state", "used",
                json_number_value(json_object_get(pool, "curr_pool_used")));
    prom_sample(b, "pool_pages", NULL, "state", "free",
                json_number_value(json_object_get(pool, "curr_pool_free")));
    prom_family(b, "pool_page_size_bytes", "gauge", "bytes per device pool page", NULL);
    prom_sample(b, "pool_page_size_bytes", NULL, NULL, NULL,
                json_number_value(json_object_get(pool, "page_size")));

    int evictions_done = 0;
    for (size_t i = 0; i < sizeof prom_model_stats / sizeof *prom_model_stats; i++) {
        const prom_def_t *d = &prom_model_stats[i];
        if (strncmp(d->key, "evictions_", 10) != 0) {
            prom_model_family(b, models, d);
            continue;
        }
        /* evictions_<cause>: one family, the cause a label */
        if (evictions_done++)
            continue;
        prom_family(b, "evictions_total", "counter", "segments evicted from the device, by cause",
                    NULL);
        for (size_t j = i; j < sizeof prom_model_stats / sizeof *prom_model_stats; j++) {
            const char *key = prom_model_stats[j].key;
            if (strncmp(key, "evictions_", 10) != 0)
                continue;
            json_object_foreach ((json_t *)models, model, m) {
                const json_t *v = json_object_get(m, key);
                if (json_is_number(v))
                    prom_sample(b, "evictions_total", model, "cause", key + 10,
                                json_number_value(v));
            }
        }
    }
    for (size_t i = 0; i < sizeof prom_model_extra / sizeof *prom_model_extra; i++)
        prom_model_family(b, models, &prom_model_extra[i]);

    prom_family(b, "tensors", "gauge", "tensors of the model's file, by weight type", NULL);
    json_object_foreach ((json_t *)models, model, m) {
        json_t *tt = json_object_get(m, "tensor_types");
        for (void *it = json_object_iter(tt); it; it = json_object_iter_next(tt, it))
            prom_sample(b, "tensors", model, "type", json_object_iter_key(it),
                        json_number_value(json_object_iter_value(it)));
    }
    prom_family(b, "model_state", "gauge", "1 for the model's current state, else 0", NULL);
    json_object_foreach ((json_t *)models, model, m) {
        const char *st = json_string_value(json_object_get(m, "state"));
        for (int s = 0; s < WK_STATE_COUNT; s++)
            prom_sample(b, "model_state", model, "state", wk_state_name((wk_state_t)s),
                        st && strcmp(st, wk_state_name((wk_state_t)s)) == 0);
    }
    for (int k = 0; k < (int)(sizeof prom_hists / sizeof *prom_hists); k++)
        prom_hist(b, models, k);
    prom_adapters(b, json_object_get(rep, "adapters"));

    for (size_t i = 0; i < sizeof prom_server_stats / sizeof *prom_server_stats; i++) {
        const prom_def_t *d = &prom_server_stats[i];
        if (strcmp(d->key, "total_errors") == 0) {
            /* by code: total_errors_<code> */
            prom_family(b, "errors_total", "counter", "error answers sent, by code", NULL);
            for (int e = 1; e < PROTO_E_COUNT; e++) {
                char key[64];
                snprintf(key, sizeof key, "total_errors_%s", proto_err_code((proto_err_t)e));
                const json_t *v = json_object_get(server, key);
                if (json_is_number(v))
                    prom_sample(b, "errors_total", NULL, "code", proto_err_code((proto_err_t)e),
                                json_number_value(v));
            }
            continue;
        }
        char name[128];
        double scale;
        int counter = prom_name(d->key, name, sizeof name, &scale);
        prom_family(b, name, counter ? "counter" : "gauge", d->help, NULL);
        prom_sample(b, name, NULL, NULL, NULL,
                    json_number_value(json_object_get(server, d->key)) * scale);
    }
}

/* ------------------------------------------------------------------ inference-gateway gauges */

/* What the Gateway API Inference Extension's endpoint picker (v1.0.0, its
 * model-server protocol) reads, derived from the stats report: queued
 * requests, KV-cache use, and the adapter-style info gauge with resident
 * models as running, queued-but-not-resident ones as waiting and how many
 * models fit in the pool as max. */
typedef struct prom_gw {
    double waiting;   /* requests queued, all models */
    double running;   /* sequences in running batches, all models */
    double kv_usage;  /* KV-cache bytes / device pool bytes, 0..1 */
    unsigned max_fit; /* most models whose weights fit in the pool together (smallest first) */
    struct evbuffer *running_models, *waiting_models; /* comma-separated names, no spaces */
} prom_gw_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void gw_list_add(struct evbuffer *b, const char *name)
{
    if (evbuffer_get_length(b))
        evbuffer_add(b, ",", 1);
    evbuffer_add(b, name, strlen(name));
}

/* 0, or -1 out of memory; g's buffers are the caller's (gw_free) either way. */
static int gw_compute(const json_t *rep, prom_gw_t *g)
{
    memset(g, 0, sizeof *g);
    g->running_models = evbuffer_new();
    g->waiting_models = evbuffer_new();
    const json_t *models = json_object_get(rep, "models");
    const json_t *pool = json_object_get(rep, "pool");
    double pool_bytes = json_number_value(json_object_get(pool, "curr_pool_pages")) *
                        json_number_value(json_object_get(pool, "page_size"));
    size_t n = json_object_size(models), k = 0;
    uint64_t *sizes = calloc(n ? n : 1, sizeof *sizes);
    if (!g->running_models || !g->waiting_models || !sizes) {
        free(sizes);
        return -1;
    }
    double kv = 0;
    const char *model;
    const json_t *m;
    json_object_foreach ((json_t *)models, model, m) {
        double queued = json_number_value(json_object_get(m, "curr_queued"));
        const char *st = json_string_value(json_object_get(m, "state"));
        int resident = st && strcmp(st, wk_state_name(WK_STATE_RESIDENT)) == 0;
        g->waiting += queued;
        g->running += json_number_value(json_object_get(m, "curr_active"));
        kv += json_number_value(json_object_get(m, "curr_kv_bytes"));
        if (resident)
            gw_list_add(g->running_models, model);
        else if (queued > 0)
            gw_list_add(g->waiting_models, model);
        if (json_is_integer(json_object_get(m, "weight_bytes")))
            sizes[k++] = (uint64_t)json_integer_value(json_object_get(m, "weight_bytes"));
    }
    qsort(sizes, k, sizeof *sizes, cmp_u64);
    double sum = 0;
    for (size_t i = 0; i < k && sum + (double)sizes[i] <= pool_bytes; i++) {
        sum += (double)sizes[i];
        g->max_fit++;
    }
    free(sizes);
    g->kv_usage = pool_bytes > 0 ? kv / pool_bytes : 0;
    if (g->kv_usage > 1)
        g->kv_usage = 1;
    return 0;
}

static void gw_free(prom_gw_t *g)
{
    if (g->running_models)
        evbuffer_free(g->running_models);
    if (g->waiting_models)
        evbuffer_free(g->waiting_models);
}

/* name{running_k="..",waiting_k="..",max_k="N"} value */
static void gw_info(struct evbuffer *b, const char *name, const char *run_k, const char *wait_k,
                    const char *max_k, const prom_gw_t *g, double value)
{
    evbuffer_add_printf(b, "%s{%s=\"", name, run_k);
    size_t rl = evbuffer_get_length(g->running_models), wl = evbuffer_get_length(g->waiting_models);
    prom_escape(b, rl ? (const char *)evbuffer_pullup(g->running_models, -1) : "");
    /* the lists end in a NUL (gw_seal): pulled up, they read as strings */
    evbuffer_add_printf(b, "\",%s=\"", wait_k);
    prom_escape(b, wl ? (const char *)evbuffer_pullup(g->waiting_models, -1) : "");
    evbuffer_add_printf(b, "\",%s=\"%u\"} %.0f\n", max_k, g->max_fit, value);
}

/* NUL-terminates the name lists so they read as strings. */
static void gw_seal(prom_gw_t *g)
{
    evbuffer_add(g->running_models, "", 1);
    evbuffer_add(g->waiting_models, "", 1);
}

static void prom_gateway(struct evbuffer *b, const json_t *rep, int vllm)
{
    prom_gw_t g;
    if (gw_compute(rep, &g)) {
        gw_free(&g);
        return;
    }
    gw_seal(&g);
    double now = (double)time(NULL);
    prom_family(b, "requests_waiting", "gauge",
                "requests queued for their model, all models (the inference gateway's queue gauge)",
                NULL);
    prom_sample(b, "requests_waiting", NULL, NULL, NULL, g.waiting);
    prom_family(b, "requests_running", "gauge", "sequences in running batches, all models", NULL);
    prom_sample(b, "requests_running", NULL, NULL, NULL, g.running);
    prom_family(b, "kv_cache_usage_ratio", "gauge",
                "bytes of KV cache mapped on the device over the device pool's bytes, 0..1", NULL);
    prom_sample(b, "kv_cache_usage_ratio", NULL, NULL, NULL, g.kv_usage);
    prom_family(b, "models_info", "gauge",
                "models resident on the device (running_models), queued but not resident "
                "(waiting_models) and how many fit in the pool (max_models); the value is the unix "
                "time of this report",
                NULL);
    gw_info(b, "gpuswapd_models_info", "running_models", "waiting_models", "max_models", &g, now);
    if (vllm) {
        /* the names the endpoint picker (Gateway API Inference Extension v1.0.0) reads by
         * default, and vllm:kv_cache_usage_perc that later releases read */
        static const char *const fam[][3] = {
            {"vllm:num_requests_waiting", "requests queued (gpuswapd_requests_waiting)", "w"},
            {"vllm:num_requests_running", "sequences running (gpuswapd_requests_running)", "r"},
            {"vllm:gpu_cache_usage_perc", "KV-cache use, 0..1 (gpuswapd_kv_cache_usage_ratio)",
             "k"},
            {"vllm:kv_cache_usage_perc", "KV-cache use, 0..1 (gpuswapd_kv_cache_usage_ratio)", "k"},
        };
        for (size_t i = 0; i < sizeof fam / sizeof *fam; i++) {
            double v = fam[i][2][0] == 'w'   ? g.waiting
                       : fam[i][2][0] == 'r' ? g.running
                                             : g.kv_usage;
            evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.9g\n", fam[i][0], fam[i][1],
                                fam[i][0], fam[i][0], v);
        }
        evbuffer_add_printf(b, "# HELP vllm:lora_requests_info models as adapters: resident "
                               "(running), queued but not resident (waiting), how many fit (max); "
                               "the value is the unix time of this report\n"
                               "# TYPE vllm:lora_requests_info gauge\n");
        gw_info(b, "vllm:lora_requests_info", "running_lora_adapters", "waiting_lora_adapters",
                "max_lora", &g, now);
    }
    gw_free(&g);
}

/* The auth section of the report: attempts per listener by result, and per
 * key requests, tokens, rejections by cause and requests in flight (labelled
 * by the key's configured name; no key material). */
static void prom_auth(struct evbuffer *b, const json_t *auth)
{
    static const char *const results[][2] = {{"ok", "total_auth_ok"},
                                             {"missing", "total_auth_missing"},
                                             {"invalid", "total_auth_invalid"},
                                             {"backoff", "total_auth_backoff"}};
    static const char *const causes[][2] = {{"rate", "rejected_rate"},
                                            {"concurrency", "rejected_concurrency"},
                                            {"tokens", "rejected_tokens"}};
    const json_t *lst = json_object_get(auth, "listeners"), *keys = json_object_get(auth, "keys"),
                 *v;
    const char *name;
    if (!auth)
        return;
    prom_family(b, "auth_attempts_total", "counter",
                "API key checks by listener and result (ok, missing, invalid, backoff)", NULL);
    json_object_foreach ((json_t *)lst, name, v) {
        for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
            evbuffer_add_printf(
                b, "gpuswapd_auth_attempts_total{listener=\"%s\",result=\"%s\"} %lld\n", name,
                results[i][0], (long long)json_integer_value(json_object_get(v, results[i][1])));
    }
    static const struct {
        const char *metric, *field, *type, *help;
    } per_key[] = {
        {"key_requests_total", "total_requests", "counter", "requests admitted under the API key"},
        {"key_tokens_total", "total_tokens", "counter",
         "prompt + completion tokens of the key's finished requests"},
        {"key_inflight", "curr_inflight", "gauge", "generate/chat requests of the key in flight"},
    };
    for (size_t f = 0; f < sizeof per_key / sizeof per_key[0]; f++) {
        prom_family(b, per_key[f].metric, per_key[f].type, per_key[f].help, NULL);
        json_object_foreach ((json_t *)keys, name, v) {
            evbuffer_add_printf(b, "gpuswapd_%s{key=\"", per_key[f].metric);
            prom_escape(b, name);
            evbuffer_add_printf(
                b, "\"} %lld\n",
                (long long)json_integer_value(json_object_get(v, per_key[f].field)));
        }
    }
    prom_family(b, "key_rejections_total", "counter",
                "requests of the API key refused by a limit, by cause (rate, concurrency, tokens)",
                NULL);
    json_object_foreach ((json_t *)keys, name, v) {
        for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++) {
            evbuffer_add_printf(b, "gpuswapd_key_rejections_total{key=\"");
            prom_escape(b, name);
            evbuffer_add_printf(b, "\",cause=\"%s\"} %lld\n", causes[i][0],
                                (long long)json_integer_value(json_object_get(v, causes[i][1])));
        }
    }
}

void http_metrics_render(struct evbuffer *b, const json_t *rep, int vllm_compat)
{
    prom_render(b, rep);
    prom_gateway(b, rep, vllm_compat);
    prom_auth(b, json_object_get(rep, "auth"));
}

/* worker_report: the stats report and the models list, built on the worker thread from its own state. */
#include "worker_int.h"

#include <stdio.h>
#include <string.h>

static const char *model_state(wk_t *w, wk_model_t *m)
{
    if (m->loading)
        return wk_state_name(WK_STATE_LOADING);
    if (!m->sm)
        return wk_state_name(WK_STATE_FAILED);
    stats_res_t st;
    res_model_stats(w->res, m->rm, &st);
    if (res_fully_resident(w->res, m->rm))
        return wk_state_name(WK_STATE_RESIDENT);
    return wk_state_name(st.curr_resident_bytes ? WK_STATE_PARTIAL : WK_STATE_HOST);
}

/* tensor_types (tensor count per type, every tensor of the file, the type
 * names lower-cased from wtype's table) and bytes_per_param into o. */
static void types_report(json_t *o, const model_t *mod)
{
    char tn[16];
    json_t *tt = json_object();
    for (uint32_t t = 0; t < MODEL_N_TTYPES; t++)
        if (mod->n_tensors_of[t])
            json_object_set_new(tt, wk_type_name(t, tn), json_integer(mod->n_tensors_of[t]));
    json_object_set_new(o, "tensor_types", tt);
    json_object_set_new(
        o, "bytes_per_param",
        json_real(mod->n_params ? (double)mod->weight_bytes / (double)mod->n_params : 0));
}

static json_t *svc_json(const wk_model_t *m)
{
    json_t *o = json_object();
#define SVC_JSON(name, help) json_object_set_new(o, #name, json_integer((json_int_t)m->svc.name));
    STATS_SVC_COUNTERS(SVC_JSON)
#undef SVC_JSON
    json_object_set_new(o, "ttft_ms_p50", json_real(stats_hist_quantile(&m->hist.ttft, 0.5)));
    json_object_set_new(o, "ttft_ms_p99", json_real(stats_hist_quantile(&m->hist.ttft, 0.99)));
    json_object_set_new(o, "latency_ms_p50", json_real(stats_hist_quantile(&m->hist.latency, 0.5)));
    json_object_set_new(o, "latency_ms_p99",
                        json_real(stats_hist_quantile(&m->hist.latency, 0.99)));
    json_object_set_new(o, "queue_ms_p99", json_real(stats_hist_quantile(&m->hist.queue, 0.99)));
    /* of the prompt tokens that looked for a cached prefix, the share it covered */
    json_object_set_new(o, "prefix_hit_rate",
                        json_real(m->svc.total_prefix_lookup_tokens
                                      ? (double)m->svc.total_prefix_hit_tokens /
                                            (double)m->svc.total_prefix_lookup_tokens
                                      : 0));
    /* of the requests with a deadline, the share whose first token came within it: refusals
     * (on arrival and from the queue) count as misses */
    const stats_svc_t *v = &m->svc;
    uint64_t with = v->total_deadline_met + v->total_deadline_missed + v->total_deadline_refused +
                    v->total_deadline_dropped;
    json_object_set_new(o, "deadline_goodput",
                        json_real(with ? (double)v->total_deadline_met / (double)with : 0));
    return o;
}

/* The model's KV cache type and the bytes one token of context takes in it
 * (k and v, every layer): F16 halves what F32 takes. */
static void kv_report(json_t *o, const wk_model_t *m)
{
    kv_type_t t = m->cfg.kv_type == CFG_KV_F32 ? KV_TYPE_F32 : KV_TYPE_F16;
    json_object_set_new(o, "kv_type", json_string(kv_type_name(t)));
    json_object_set_new(o, "kv_cache", json_integer((json_int_t)m->cfg.kv_cache));
    json_object_set_new(o, "kv_bytes_per_token",
                        json_integer((json_int_t)kv_bytes_per_pos(&m->sm->model->hp, t)));
}

static json_t *hist_json(const stats_hist_t *h)
{
    json_t *b = json_array();
    for (int i = 0; i < STATS_HIST_BUCKETS; i++)
        json_array_append_new(b, json_integer((json_int_t)h->b[i]));
    return json_pack("{s:I, s:f, s:o}", "count", (json_int_t)h->n, "sum_ms", h->sum_ms, "buckets",
                     b);
}

/* The stats report (one builder for the admin socket, the CLI and /metrics). */
json_t *wk_report_stats(wk_t *w)
{
    stats_pool_t ps;
    res_pool_stats(w->res, &ps);
    json_t *pool =
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "page_size", (json_int_t)ps.page_size,
                  "curr_pool_pages", (json_int_t)ps.curr_pool_pages, "curr_pool_used",
                  (json_int_t)ps.curr_pool_used, "curr_pool_free", (json_int_t)ps.curr_pool_free,
                  "curr_scratch_bytes", (json_int_t)ps.curr_scratch_bytes, "peak_device_bytes",
                  (json_int_t)ps.peak_device_bytes, "curr_budget_cut_bytes",
                  (json_int_t)ps.curr_budget_cut_bytes, "curr_scratch_reserved_bytes",
                  (json_int_t)ps.curr_scratch_reserved_bytes);
    json_t *models = json_object();
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || m->removing)
            continue;
        json_t *o = svc_json(m);
        if (m->rm) {
            stats_res_t st;
            res_model_stats(w->res, m->rm, &st);
#define RES_JSON(name, help) json_object_set_new(o, #name, json_integer((json_int_t)st.name));
            STATS_RES_COUNTERS(RES_JSON)
            STATS_RES_GAUGES(RES_JSON)
#undef RES_JSON
            json_object_set_new(o, "gpu_quota", json_integer((json_int_t)m->cfg.gpu_quota));
            json_object_set_new(o, "weight_bytes", json_integer((json_int_t)m->sm->image_bytes));
            json_object_set_new(o, "host_bytes", json_integer((json_int_t)m->sm->host_bytes));
            kv_report(o, m);
            types_report(o, m->sm->model);
        }
        json_object_set_new(o, "state", json_string(model_state(w, m)));
        json_object_set_new(o, "curr_queued", json_integer(sched_queued(w->sched, i)));
        json_object_set_new(o, "curr_active", json_integer(m->n_active));
#define HIST_JSON(field, metric, help)                                                             \
    json_object_set_new(o, "hist_" #field "_ms", hist_json(&m->hist.field));
        STATS_HISTS(HIST_JSON)
#undef HIST_JSON
        json_object_set_new(models, m->name, o);
    }
    json_t *server = json_object();
#define SRV_JSON(name, help)                                                                       \
    json_object_set_new(server, #name, json_integer((json_int_t)stats_server.name));
    STATS_SERVER_COUNTERS(SRV_JSON)
#undef SRV_JSON
    for (int e = 1; e < PROTO_E_COUNT; e++) {
        char k[64];
        snprintf(k, sizeof k, "total_errors_%s", proto_err_code((proto_err_t)e));
        json_object_set_new(server, k, json_integer((json_int_t)stats_server.errors_by_code[e]));
    }
    json_t *rep = json_pack("{s:f, s:s, s:s, s:o, s:o, s:o, s:o}", "uptime_s",
                            wk_now() - w->t_start, "backend", w->be->name, "policy",
                            cfg_policy_name(w->cfg->scheduler.policy), "pool", pool, "models",
                            models, "adapters", wk_lora_report_stats(w), "server", server);
    json_t *extra = rep && w->extra_fn ? w->extra_fn(w->extra_ctx) : NULL;
    if (extra)
        json_object_set_new(rep, w->extra_name, extra);
    return rep;
}

void wk_set_report_section(wk_t *w, const char *name, json_t *(*fn)(void *ctx), void *ctx)
{
    w->extra_name = name;
    w->extra_fn = fn;
    w->extra_ctx = ctx;
}

json_t *wk_report_models(wk_t *w, int admin)
{
    json_t *arr = json_array();
    for (int i = 0; i < w->n_models; i++) {
        wk_model_t *m = w->models[i];
        if (!m || m->removing)
            continue;
        json_t *o = json_pack("{s:s, s:s}", "name", m->name, "state", model_state(w, m));
        if (m->sm) {
            const model_t *mod = m->sm->model;
            json_object_set_new(o, "arch", json_string(model_arch_name(mod->hp.arch)));
            char tn[16];
            json_object_set_new(o, "type", json_string(wk_type_name(mod->wtype, tn)));
            types_report(o, mod);
            json_object_set_new(o, "params", json_integer((json_int_t)mod->n_params));
            json_object_set_new(o, "context", json_integer(wk_model_context(m)));
        }
        if (admin) {
            json_object_set_new(o, "pinned", json_boolean(m->cfg.pinned));
            json_object_set_new(o, "priority", json_real(m->cfg.priority));
            json_object_set_new(o, "gpu_quota", json_integer((json_int_t)m->cfg.gpu_quota));
            if (m->sm) {
                stats_res_t st;
                res_model_stats(w->res, m->rm, &st);
                json_object_set_new(o, "weight_bytes",
                                    json_integer((json_int_t)m->sm->image_bytes));
                json_object_set_new(o, "host_bytes", json_integer((json_int_t)m->sm->host_bytes));
                json_object_set_new(o, "curr_resident_bytes",
                                    json_integer((json_int_t)st.curr_resident_bytes));
                json_object_set_new(o, "curr_kv_bytes", json_integer((json_int_t)st.curr_kv_bytes));
                json_object_set_new(o, "streams", json_boolean(res_streams(m->rm)));
                kv_report(o, m);
                json_object_set_new(o, "curr_running", json_integer((json_int_t)m->n_active));
            }
            json_object_set_new(o, "curr_queued", json_integer(sched_queued(w->sched, i)));
            if (m->load_error)
                json_object_set_new(o, "error", json_string(m->load_error));
        }
        json_array_append_new(arr, o);
    }
    wk_lora_report_models(w, arr, admin); /* each with its base */
    /* a model a reload adds is not in models[] until it has loaded */
    int listed = 0;
    for (int i = 0; w->loading && i < w->n_models; i++)
        listed |= w->models[i] == w->loading;
    if (w->loading && !listed)
        json_array_append_new(arr, json_pack("{s:s, s:s}", "name", w->loading->name, "state",
                                             wk_state_name(WK_STATE_LOADING)));
    return json_pack("{s:o}", "models", arr);
}

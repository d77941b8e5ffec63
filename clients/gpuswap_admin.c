/* gpuswap_admin: the gpuswap commands that read or steer the daemon (models, stats, load, evict, pin, unpin, reload, drain) and keygen, which talks to none. */
#include "gpuswap_int.h"

#include "keyhash.h"
#include "proto.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ models, stats */

/* "693.4K", "8.03B": a parameter count for humans. */
static void gs_fmt_count(char *buf, size_t n, double v)
{
    if (v >= 1e9)
        snprintf(buf, n, "%.2fB", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, n, "%.1fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, n, "%.1fK", v / 1e3);
    else
        snprintf(buf, n, "%.0f", v);
}

int gs_cmd_models(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos)
        return gs_usage_error(cmd->name, "models takes no arguments");
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->socket, "inference");
    if (rc)
        return rc;
    proto_req_t req;
    memset(&req, 0, sizeof req);
    req.op = PROTO_OP_MODELS;
    gs_answer_t a;
    rc = gs_conn_call(&c, &req, 0, NULL, NULL, &a);
    gs_conn_close(&c);
    if (rc)
        return rc;
    rc = gs_answer_common(&a, o->json);
    if (rc < 0) {
        rc = GS_EXIT_OK;
        if (!o->json) {
            const json_t *models = json_object_get(a.ev.root, "models"), *m;
            size_t i;
            int w = 5;
            json_array_foreach (models, i, m) {
                if ((int)strlen(gs_str(m, "name")) > w)
                    w = (int)strlen(gs_str(m, "name"));
            }
            printf("%-*s  %-9s %-6s %-6s %5s %8s %8s  %s\n", w, "MODEL", "STATE", "ARCH", "TYPE",
                   "BITS", "PARAMS", "CONTEXT", "TENSORS");
            json_array_foreach (models, i, m) {
                char params[32];
                gs_fmt_count(params, sizeof params, gs_num(m, "params", 0));
                printf("%-*s  %-9s %-6s %-6s %5.2f %8s %8.0f  ", w, gs_str(m, "name"),
                       gs_str(m, "state"), gs_str(m, "arch"), gs_str(m, "type"),
                       8 * gs_num(m, "bytes_per_param", 0), params, gs_num(m, "context", 0));
                /* tensor count per type: q4_k:193,q6_k:33,f32:65 */
                const char *type, *sep = "";
                const json_t *n;
                json_object_foreach ((json_t *)json_object_get(m, "tensor_types"), type, n) {
                    printf("%s%s:%.0f", sep, type, json_number_value(n));
                    sep = ",";
                }
                printf("%s\n", *sep ? "" : "-");
            }
        }
    }
    gs_answer_free(&a);
    return rc;
}

static void gs_print_stats(const json_t *r)
{
    double up = gs_num(r, "uptime_s", 0);
    printf("gpuswapd: up %.0fh%02.0fm%02.0fs, backend %s, policy %s\n", floor(up / 3600),
           floor(fmod(up, 3600) / 60), floor(fmod(up, 60)), gs_str(r, "backend"),
           gs_str(r, "policy"));
    const json_t *models = json_object_get(r, "models"), *m;
    const char *name;
    int w = 5;
    json_object_foreach ((json_t *)models, name, m) {
        if ((int)strlen(name) > w)
            w = (int)strlen(name);
    }
    printf("%-*s  %-9s %18s %9s %9s %8s %6s %16s\n", w, "MODEL", "STATE", "RESIDENT/QUOTA MiB",
           "PAGE-INS", "EVICTIONS", "HIT RATE", "QUEUE", "TTFT p50/p99 ms");
    json_object_foreach ((json_t *)models, name, m) {
        char res[48], hit[16], ttft[48];
        double quota = gs_num(m, "gpu_quota", 0);
        if (quota > 0)
            snprintf(res, sizeof res, "%.1f/%.1f", gs_num(m, "curr_resident_bytes", 0) / GS_MIB,
                     quota / GS_MIB);
        else
            snprintf(res, sizeof res, "%.1f/-", gs_num(m, "curr_resident_bytes", 0) / GS_MIB);
        double hits = gs_num(m, "total_hits", 0), misses = gs_num(m, "total_misses", 0);
        if (hits + misses > 0)
            snprintf(hit, sizeof hit, "%.1f%%", 100.0 * hits / (hits + misses));
        else
            snprintf(hit, sizeof hit, "-");
        const json_t *hist = json_object_get(m, "hist_ttft_ms");
        int have_ttft =
            hist ? gs_num(hist, "count", 0) > 0 : json_object_get(m, "ttft_ms_p50") != NULL;
        if (have_ttft)
            snprintf(ttft, sizeof ttft, "%.1f/%.1f", gs_num(m, "ttft_ms_p50", 0),
                     gs_num(m, "ttft_ms_p99", 0));
        else
            snprintf(ttft, sizeof ttft, "-");
        double ev = gs_num(m, "evictions_capacity", 0) + gs_num(m, "evictions_quota", 0) +
                    gs_num(m, "evictions_admin", 0) + gs_num(m, "evictions_preemption", 0);
        printf("%-*s  %-9s %18s %9.0f %9.0f %8s %6.0f %16s\n", w, name, gs_str(m, "state"), res,
               gs_num(m, "total_page_ins", 0), ev, hit, gs_num(m, "curr_queued", 0), ttft);
    }
    const json_t *p = json_object_get(r, "pool");
    double page = gs_num(p, "page_size", 0), used = gs_num(p, "curr_pool_used", 0),
           fr = gs_num(p, "curr_pool_free", 0);
    printf("pool: %.0f/%.0f pages used, %.0f free; %.1f MiB used, %.1f MiB free (%.0f KiB pages)\n",
           used, gs_num(p, "curr_pool_pages", 0), fr, used * page / GS_MIB, fr * page / GS_MIB,
           page / 1024);
    /* API keys (auth:): usage per key, failed attempts per listener that requires keys */
    const json_t *auth = json_object_get(r, "auth"), *keys = json_object_get(auth, "keys"), *k;
    if (json_object_size(keys)) {
        int kw = 7;
        json_object_foreach ((json_t *)keys, name, k) {
            if ((int)strlen(name) > kw)
                kw = (int)strlen(name);
        }
        printf("%-*s  %10s %12s %24s %9s\n", kw, "API KEY", "REQUESTS", "TOKENS",
               "REJECTED RATE/CONC/TPM", "IN FLIGHT");
        json_object_foreach ((json_t *)keys, name, k) {
            char rej[64];
            snprintf(rej, sizeof rej, "%.0f/%.0f/%.0f", gs_num(k, "rejected_rate", 0),
                     gs_num(k, "rejected_concurrency", 0), gs_num(k, "rejected_tokens", 0));
            printf("%-*s  %10.0f %12.0f %24s %9.0f\n", kw, name, gs_num(k, "total_requests", 0),
                   gs_num(k, "total_tokens", 0), rej, gs_num(k, "curr_inflight", 0));
        }
    }
    const json_t *lst = json_object_get(auth, "listeners"), *l;
    json_object_foreach ((json_t *)lst, name, l) {
        if (json_is_true(json_object_get(l, "required")))
            printf(
                "auth on %s: %.0f ok, %.0f without a key, %.0f wrong keys, %.0f refused while backing off\n",
                name, gs_num(l, "total_auth_ok", 0), gs_num(l, "total_auth_missing", 0),
                gs_num(l, "total_auth_invalid", 0), gs_num(l, "total_auth_backoff", 0));
    }
}

int gs_cmd_stats(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos)
        return gs_usage_error(cmd->name, "stats takes no arguments");
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->admin_socket, "admin");
    if (rc)
        return rc;
    int clear = o->watch && isatty(1);
    for (long k = 0;; k++) {
        proto_req_t req;
        memset(&req, 0, sizeof req);
        req.op = PROTO_OP_STATS;
        gs_answer_t a;
        rc = gs_conn_call(&c, &req, 0, NULL, NULL, &a);
        if (rc)
            break;
        if (clear && !o->json)
            fputs("\033[H\033[2J", stdout);
        else if (k > 0 && !o->json)
            putchar('\n');
        rc = gs_answer_common(&a, o->json);
        if (rc < 0 && !o->json)
            gs_print_stats(a.ev.root);
        fflush(stdout);
        gs_answer_free(&a);
        if (rc >= 0)
            break;
        rc = GS_EXIT_OK;
        if (!o->watch || (o->count && k + 1 >= o->count))
            break;
        int w = gs_wait(-1, gs_now_ms() + (int64_t)(o->interval * 1000));
        if (w == GS_LINE_SIGNAL) {
            rc = 128 + gs_signal_take();
            break;
        }
    }
    gs_conn_close(&c);
    return rc;
}

/* ------------------------------------------------------------------ admin ops */

typedef struct gs_progress {
    int tty;   /* stderr is a terminal: draw the bar */
    int drawn; /* a bar is on screen */
    const char *model;
} gs_progress_t;

static void gs_on_progress(const proto_event_t *ev, void *ctx)
{
    gs_progress_t *p = ctx;
    if (!p->tty)
        return;
    double b = gs_num(ev->root, "bytes", 0), t = gs_num(ev->root, "total", 0);
    double f = t > 0 ? b / t : 0;
    if (f > 1)
        f = 1;
    char bar[31];
    int fill = (int)(f * 30 + 0.5);
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r%s [%s] %3.0f%% %.1f/%.1f MiB", p->model, bar, f * 100, b / GS_MIB,
            t / GS_MIB);
    fflush(stderr);
    p->drawn = 1;
}

/* The model of load/evict/pin/unpin: -m MODEL or the one positional argument. */
static int gs_model_arg(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->model && o->n_pos == 0)
        return 0;
    if (!o->model && o->n_pos == 1) {
        o->model = o->pos[0];
        return 0;
    }
    return gs_usage_error(cmd->name, "%s takes exactly one model", cmd->name);
}

int gs_cmd_admin(const gs_cmd_t *cmd, gs_opts_t *o)
{
    proto_req_t req;
    memset(&req, 0, sizeof req);
    if (strcmp(cmd->name, "reload") == 0 || strcmp(cmd->name, "drain") == 0) {
        if (o->n_pos)
            return gs_usage_error(cmd->name, "%s takes no arguments", cmd->name);
        req.op = cmd->name[0] == 'r' ? PROTO_OP_RELOAD : PROTO_OP_DRAIN;
    } else {
        if (gs_model_arg(cmd, o))
            return GS_EXIT_USAGE;
        req.model = (char *)o->model;
        req.op = strcmp(cmd->name, "load") == 0    ? PROTO_OP_LOAD
                 : strcmp(cmd->name, "evict") == 0 ? PROTO_OP_EVICT
                 : strcmp(cmd->name, "pin") == 0   ? PROTO_OP_PIN
                                                   : PROTO_OP_UNPIN;
        req.stream = req.op == PROTO_OP_LOAD;
    }
    gs_conn_t c;
    int rc = gs_conn_open(&c, o->admin_socket, "admin");
    if (rc)
        return rc;
    gs_progress_t pr = {.tty = isatty(2), .model = o->model};
    gs_answer_t a;
    rc = gs_conn_call(&c, &req, 0, gs_on_progress, &pr, &a);
    gs_conn_close(&c);
    if (pr.drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    if (rc)
        return rc;
    rc = gs_answer_common(&a, o->json);
    if (rc < 0) {
        rc = GS_EXIT_OK;
        const json_t *r = a.ev.root;
        const char *model = json_string_value(json_object_get(r, "model"));
        if (!model)
            model = o->model;
        if (o->json) {
            /* printed already */
        } else if (req.op == PROTO_OP_LOAD) {
            printf("%s %s (%.1f MiB in %.1f ms)\n", model, gs_str(r, "state"),
                   gs_num(r, "bytes", 0) / GS_MIB, gs_num(r, "swap_ms", 0));
        } else if (req.op == PROTO_OP_EVICT) {
            printf("%s evicted (%.1f MiB freed)\n", model, gs_num(r, "bytes_evicted", 0) / GS_MIB);
        } else if (req.op == PROTO_OP_PIN || req.op == PROTO_OP_UNPIN) {
            printf("%s %s\n", model,
                   json_is_true(json_object_get(r, "pinned")) ? "pinned" : "unpinned");
        } else if (req.op == PROTO_OP_RELOAD) {
            char *ad = gs_join_names(json_object_get(r, "added"));
            char *rm = gs_join_names(json_object_get(r, "removed"));
            char *st = gs_join_names(json_object_get(r, "settings"));
            printf("reloaded: added %s; removed %s; changed ", ad ? ad : "?", rm ? rm : "?");
            /* each changed model with the keys that changed: "tiny (chat_template, gpu_quota)" */
            const json_t *ch = json_object_get(r, "changed"),
                         *keys = json_object_get(r, "changed_keys");
            size_t i;
            const json_t *m;
            if (!json_array_size(ch))
                printf("none");
            json_array_foreach (ch, i, m) {
                char *k = gs_join_names(json_object_get(keys, json_string_value(m)));
                printf("%s%s (%s)", i ? ", " : "", json_string_value(m), k ? k : "?");
                free(k);
            }
            printf("; settings %s\n", st ? st : "none");
            free(ad);
            free(rm);
            free(st);
        } else {
            printf("drained: %.0f requests completed during the drain; the daemon exits\n",
                   gs_num(r, "completed", 0));
        }
    }
    gs_answer_free(&a);
    return rc;
}

/* Prints a new API key and the config lines that accept it (the daemon stores only the hash). */
int gs_cmd_keygen(const gs_cmd_t *cmd, gs_opts_t *o)
{
    if (o->n_pos > 1)
        return gs_usage_error(cmd->name, "keygen takes at most one NAME");
    const char *name = o->n_pos ? o->pos[0] : "NAME";
    char key[80], hash[KEYHASH_LEN + 1];
    if (keyhash_gen(key, sizeof key, hash)) {
        gs_err("cannot draw random bytes for a key");
        return GS_EXIT_ERROR;
    }
    if (o->json)
        printf("{\"key\":\"%s\",\"hash\":\"%s\",\"name\":\"%s\"}\n", key, hash, name);
    else
        printf(
            "%s\n"
            "# the API key above, shown once; paste this entry under auth.keys in gpuswapd.yaml:\n"
            "  - name: %s\n"
            "    hash: \"%s\"\n"
            "    models: [\"*\"]\n",
            key, name, hash);
    explicit_bzero(key, sizeof key);
    return GS_EXIT_OK;
}

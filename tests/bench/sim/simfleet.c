/* simfleet: a fleet of simulated gpuswapd hosts behind a router (model affinity as `gpuswap fleet render` places and HAProxy routes, round-robin, least-loaded), on the simulator's shared virtual clock. */
#include "simfleet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

static const char *const route_names[SIMFLEET_ROUTE_COUNT] = {"affinity", "round-robin",
                                                              "least-loaded"};

const char *simfleet_route_name(simfleet_route_t r)
{
    return r < SIMFLEET_ROUTE_COUNT ? route_names[r] : "?";
}

int simfleet_route_parse(const char *s, simfleet_route_t *r)
{
    for (int i = 0; i < SIMFLEET_ROUTE_COUNT; i++)
        if (strcmp(s, route_names[i]) == 0) {
            *r = (simfleet_route_t)i;
            return 0;
        }
    return -1;
}

uint32_t simfleet_replicas(double share, int n_hosts, uint32_t min)
{
    double need = ceil(2.0 * share * n_hosts - 1e-9);
    uint32_t r = need > min ? (uint32_t)need : min;
    return r > (uint32_t)n_hosts ? (uint32_t)n_hosts : r;
}

/* ------------------------------------------------------------------ router */

typedef struct router {
    simfleet_route_t route;
    int n_hosts;
    uint32_t factor; /* hash-balance-factor, percent */
    int *rep;        /* affinity: each model's replicas in its hash-ring order */
    size_t *rep_off; /* n_models + 1: model m's replicas are rep[rep_off[m] .. rep_off[m+1]) */
    size_t next;     /* round-robin cursor; least-loaded: where ties start */
} router_t;

/* Bounded-load consistent hashing as HAProxy's chash_server_is_eligible
 * does it, all weights equal: with P requests in flight on the model's
 * backend, ceil((P + 1) * factor / 100) slots are shared out over its R
 * replicas; a request goes to the first replica in the model's ring order
 * that is below its slots. */
static int route_affinity(router_t *r, const sim_fleet_t *f, int model)
{
    const int *rep = r->rep + r->rep_off[model];
    uint32_t R = (uint32_t)(r->rep_off[model + 1] - r->rep_off[model]);
    uint64_t P = 0;
    for (uint32_t i = 0; i < R; i++)
        P += sim_fleet_model_load(f, rep[i], model);
    uint64_t slots = ((P + 1) * r->factor + 99) / 100;
    for (uint32_t i = 0; i < R; i++) {
        uint64_t mine = slots / R + (i < slots % R);
        if (mine == 0)
            mine = 1;
        if (sim_fleet_model_load(f, rep[i], model) < mine)
            return rep[i];
    }
    return rep[0];
}

static int route(void *ctx, const sim_fleet_t *f, const wl_req_t *rq)
{
    router_t *r = ctx;
    int H = r->n_hosts;
    switch (r->route) {
    case SIMFLEET_AFFINITY: return route_affinity(r, f, rq->model);
    case SIMFLEET_ROUND_ROBIN: return (int)(r->next++ % (size_t)H);
    case SIMFLEET_LEAST_LOADED: {
        int best = -1;
        size_t best_load = 0;
        for (int k = 0; k < H; k++) {
            int h = (int)((r->next + (size_t)k) % (size_t)H);
            size_t l = sim_fleet_load(f, h);
            if (best < 0 || l < best_load) {
                best = h;
                best_load = l;
            }
        }
        r->next = (size_t)best + 1; /* ties rotate */
        return best;
    }
    default: return 0;
    }
}

/* A replica's place on model m's hash ring (splitmix64 of the pair): the
 * order HAProxy tries the servers of a model's backend in. */
static uint64_t ring_pos(int m, int h)
{
    uint64_t x = ((uint64_t)(uint32_t)m << 32 | (uint32_t)h) + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Image bytes of model m of the configuration (what placement balances). */
static uint64_t model_bytes_of(const sim_cfg_t *c, int m)
{
    return c->models ? sim_models_image_bytes(c->models, m % sim_models_count(c->models))
                     : sim_model_bytes(sim_cfg_shape(c, m), c->page_size);
}

/* The placement fleet_place makes for this fleet: hosts h0000.. with the
 * pool as device memory, models m00000.. with their image size, expected
 * load and replicas; fills r->rep in ring order. */
static int place(const sim_cfg_t *c, const simfleet_cfg_t *fc, router_t *r, int *max_models,
                 char *err, size_t errlen)
{
    int H = fc->n_hosts, M = c->n_models;
    int rc = SIM_ERR_NOMEM;
    fleet_t f = {.file = "tracesim", .n_hosts = (size_t)H, .n_models = (size_t)M};
    char(*hname)[16] = calloc((size_t)H, sizeof *hname);
    char(*mname)[16] = calloc((size_t)M, sizeof *mname);
    f.hosts = calloc((size_t)H, sizeof *f.hosts);
    f.models = calloc((size_t)M, sizeof *f.models);
    unsigned char *pl = malloc((size_t)M * (size_t)H);
    int *count = calloc((size_t)H, sizeof *count);
    r->rep_off = calloc((size_t)M + 1, sizeof *r->rep_off);
    if (!hname || !mname || !f.hosts || !f.models || !pl || !count || !r->rep_off) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int h = 0; h < H; h++) {
        snprintf(hname[h], sizeof hname[h], "h%04d", h);
        f.hosts[h] = (fleet_host_t){.name = hname[h], .device_memory = c->pool_bytes};
    }
    for (int m = 0; m < M; m++) {
        snprintf(mname[m], sizeof mname[m], "m%05d", m);
        uint64_t size = model_bytes_of(c, m);
        double load = fc->load ? fc->load[m] : 1.0 / M;
        f.models[m] = (fleet_model_t){.name = mname[m],
                                      .size = size,
                                      .load = load,
                                      .replicas = simfleet_replicas(load, H, fc->replicas)};
    }
    if (fleet_place(&f, pl, err, errlen) != FLEET_OK) {
        rc = SIM_ERR_SETUP;
        goto done;
    }
    size_t total = 0;
    for (int m = 0; m < M; m++) {
        r->rep_off[m] = total;
        for (int h = 0; h < H; h++)
            total += pl[(size_t)m * H + h];
    }
    r->rep_off[M] = total;
    r->rep = malloc((total ? total : 1) * sizeof *r->rep);
    if (!r->rep) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int m = 0; m < M; m++) {
        int *rep = r->rep + r->rep_off[m];
        size_t k = 0;
        for (int h = 0; h < H; h++)
            if (pl[(size_t)m * H + h]) {
                count[h]++;
                /* insertion by ring position (R is small) */
                size_t j = k++;
                for (; j > 0 && ring_pos(m, rep[j - 1]) > ring_pos(m, h); j--)
                    rep[j] = rep[j - 1];
                rep[j] = h;
            }
    }
    *max_models = 0;
    for (int h = 0; h < H; h++)
        if (count[h] > *max_models)
            *max_models = count[h];
    rc = SIM_OK;
done:
    free(hname);
    free(mname);
    free(f.hosts);
    free(f.models);
    free(pl);
    free(count);
    return rc;
}

int simfleet_run(const sim_cfg_t *c, const simfleet_cfg_t *fc, const wl_req_t *reqs, size_t n,
                 sim_result_t *out, int *max_models, char *err, size_t errlen)
{
    if (fc->n_hosts < 1 || fc->n_hosts > FLEET_MAX_HOSTS || c->n_models > FLEET_MAX_MODELS ||
        fc->route >= SIMFLEET_ROUTE_COUNT || fc->replicas < 1 || fc->balance_factor <= 100) {
        snprintf(err, errlen,
                 "bad fleet: 1..%d hosts, at most %d models, replicas >= 1, "
                 "balance factor > 100",
                 FLEET_MAX_HOSTS, FLEET_MAX_MODELS);
        return SIM_ERR_ARG;
    }
    router_t r = {.route = fc->route, .n_hosts = fc->n_hosts, .factor = fc->balance_factor};
    int mm = c->n_models, rc = SIM_OK;
    if (fc->route == SIMFLEET_AFFINITY)
        rc = place(c, fc, &r, &mm, err, errlen);
    if (rc == SIM_OK) {
        sim_hosts_t hs = {.n_hosts = fc->n_hosts, .route = route, .route_ctx = &r};
        rc = sim_run_fleet(c, SIM_POL_DEFAULT, &hs, reqs, n, out, err, errlen);
    }
    if (max_models)
        *max_models = mm;
    free(r.rep);
    free(r.rep_off);
    return rc;
}

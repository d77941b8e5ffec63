/* simfleet: a fleet of simulated gpuswapd hosts behind a router (model affinity as `gpuswap fleet render` places and HAProxy routes, round-robin, least-loaded), on the simulator's shared virtual clock. */
#ifndef SIMFLEET_H
#define SIMFLEET_H

#include <stddef.h>
#include <stdint.h>

#include "sim.h"
#include "workload.h"

typedef enum simfleet_route {
    SIMFLEET_AFFINITY = 0, /* fleet_place's placement; HAProxy's bounded-load consistent hash
                               over a model's replicas (balance hash, hash-balance-factor) */
    SIMFLEET_ROUND_ROBIN,  /* every host serves every model; requests in turn */
    SIMFLEET_LEAST_LOADED, /* every host serves every model; fewest queued + running */
    SIMFLEET_ROUTE_COUNT
} simfleet_route_t;

const char *simfleet_route_name(simfleet_route_t r);
int simfleet_route_parse(const char *s, simfleet_route_t *r); /* 0 or -1 */

typedef struct simfleet_cfg {
    int n_hosts;
    simfleet_route_t route;
    uint32_t replicas;       /* affinity: replicas of a model at least (fleet.yaml's replicas) */
    uint32_t balance_factor; /* affinity: HAProxy hash-balance-factor, percent > 100 */
    const double *load;      /* affinity: c->n_models expected shares of the requests (the
                                 fleet file's load): placement input; borrowed */
} simfleet_cfg_t;

/* Replicas a model with this share of the requests gets in an H-host fleet:
 * at least min, and enough that none carries more than half a host's share. */
uint32_t simfleet_replicas(double share, int n_hosts, uint32_t min);

/* Runs gpuswapd's default policy on every host of the fleet, routed by
 * fc->route. 0 or SIM_ERR_* with the reason in err; *max_models (optional):
 * the most models one host was configured with (affinity: placed on it;
 * otherwise: requested from it). */
int simfleet_run(const sim_cfg_t *c, const simfleet_cfg_t *fc, const wl_req_t *reqs, size_t n,
                 sim_result_t *out, int *max_models, char *err, size_t errlen);

#endif

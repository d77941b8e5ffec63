/* fleet: a fleet of gpuswapd hosts described in fleet.yaml, model placement over it, and the files `gpuswap fleet render` writes. */
#ifndef FLEET_H
#define FLEET_H

#include <stddef.h>
#include <stdint.h>

enum {
    FLEET_OK = 0,
    FLEET_ERR_IO = -1,      /* a file cannot be read or written */
    FLEET_ERR_SYNTAX = -2,  /* not well-formed YAML */
    FLEET_ERR_INVALID = -3, /* well-formed, but not a valid fleet */
    FLEET_ERR_NOMEM = -4,
    FLEET_ERR_PLACE = -5, /* the models do not fit the hosts */
};

#define FLEET_MAX_HOSTS 1024
#define FLEET_MAX_MODELS 4096

typedef struct fleet_host {
    char *name;    /* [A-Za-z0-9._-]+, unique; owned */
    char *http;    /* "host:port" its HTTP listener binds and the proxy connects to; owned */
    char *run_dir; /* directory of its sockets; owned (defaults.run_dir when unset) */
    char *pool;    /* Kubernetes node pool (one StatefulSet each), default "gpuswapd"; owned */
    uint64_t device_memory; /* bytes of the device pool (gpuswapd device.memory) */
    uint64_t host_memory;   /* bytes of host RAM for the model store (host.memory) */
    int line;               /* 1-based line of its entry in fleet.yaml */
} fleet_host_t;

typedef struct fleet_model {
    char *name;        /* the "model" of requests, [A-Za-z0-9._:-]+, unique; owned */
    char *path;        /* GGUF file on every host that serves it; owned */
    uint64_t size;     /* bytes of weights, what placement balances */
    double load;       /* expected requests/s (relative weights are enough), > 0, default 1 */
    uint32_t replicas; /* hosts that serve it, 1..hosts, default 2 */
    int line;
} fleet_model_t;

typedef struct fleet {
    char *file; /* name it was loaded under, for messages; owned */
    struct {
        char *listen;     /* HAProxy frontend "host:port"; owned */
        char **addresses; /* n_addresses addresses the proxy connects from; owned */
        size_t n_addresses;
        uint64_t max_request;       /* bytes: largest request body accepted, default 1MiB */
        uint32_t balance_factor;    /* hash-balance-factor, percent > 100, default 150 */
        uint64_t check_ms;          /* /ready check interval, default 1s */
        uint64_t stream_timeout_ms; /* longest silence on a connection, default 10m */
    } proxy;
    struct {           /* what every host's gpuswapd.yaml gets */
        char *run_dir; /* default socket directory, default /run/gpuswapd; owned */
        /* daemon options by dotted name ("device.page_size"), each checked against the
         * daemon's schema: fleet's short names and defaults (fleet_opt_names) first, then
         * every other option the file names, in file order; owned */
        char **options, **values;
        size_t n_options;
        uint64_t drain_timeout_ms; /* scheduler.drain_timeout's value, for Kubernetes' grace */
    } defaults;
    struct {
        char *namespace_; /* default "gpuswapd"; owned */
        char *image;      /* default "gpuswapd:latest"; owned */
        char *models_dir; /* node directory mounted read-only where model paths point, owned */
        unsigned port;    /* every pod's listen.http port, default 8400 */
    } k8s;
    fleet_host_t *hosts; /* n_hosts >= 1, in file order; owned */
    size_t n_hosts;
    fleet_model_t *models; /* n_models >= 1, in file order; owned */
    size_t n_models;
} fleet_t;

/* Loads and validates a fleet file: unknown or duplicate keys, wrong types
 * and impossible values are errors "file:line:col: reason". 0 with *out (the
 * caller frees it with fleet_free), or a FLEET_ERR_* code. */
int fleet_load_file(const char *path, fleet_t **out, char *err, size_t errlen);
int fleet_load_string(const char *yaml, const char *name, fleet_t **out, char *err, size_t errlen);
void fleet_free(fleet_t *f); /* accepts NULL */

/* Placement: which hosts serve each model. place[m * n_hosts + h] is 1 when
 * host h serves model m. Every model gets `replicas` distinct hosts, chosen
 * by weighted rendezvous (HRW) hashing of (model, host) names, bounded so no
 * host carries more than 1.5x its share (by device memory) of bytes plus
 * expected load; so adding a host moves about 1/H of the placements. The
 * result depends only on the names, sizes, loads and memories: the order of
 * the hosts in the file does not change it. place is caller-allocated
 * (n_models * n_hosts bytes). 0, or FLEET_ERR_PLACE with the reason (a host's
 * host_memory too small for what it must hold). */
int fleet_place(const fleet_t *f, unsigned char *place, char *err, size_t errlen);

/* Writes, deterministically, under dir (created if missing):
 *   hosts/<host>/gpuswapd.yaml                  the host's config (its models)
 *   hosts/<host>/gpuswapd.service.d/fleet.conf  systemd drop-in: IPAddressAllow= the proxy
 *   haproxy.cfg                                 model-affinity routing (HAProxy >= 2.6)
 *   placement.txt                               the placement, for people
 *   k8s/<name>.yaml                             StatefulSets, ConfigMaps, headless Service,
 *                                               InferencePool and endpoint picker
 * 0, or a FLEET_ERR_* code with the reason. */
int fleet_render(const fleet_t *f, const char *dir, char *err, size_t errlen);

/* `gpuswap fleet ...` (argv[0] is "fleet"): the CLI's entry; returns the exit status. */
int fleet_main(int argc, char **argv);

#endif

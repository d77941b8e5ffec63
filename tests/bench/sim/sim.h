/* sim: runs the real scheduler and residency manager on the virtual device under a cost model, for one policy over one trace, and Belady's bound. */
#ifndef SIM_H
#define SIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "worker/scheduler.h"
#include "workload.h"

enum {
    SIM_OK = 0,
    SIM_ERR_ARG = -1,
    SIM_ERR_NOMEM = -2,
    SIM_ERR_SETUP = -3, /* residency refused the models */
    SIM_ERR_STUCK = -4, /* no policy progress and no future event */
};

/* The cost model. A forward step for T tokens of S sequences of a model
 * takes
 *   t_fixed + sum over layers (layer_bytes / hbm_bw + 2 * layer_params * T / flops
 *                              + kv_bytes_read / n_layer / hbm_bw
 *                              + (t_step + t_token * T) / n_layer)
 *           + head_bytes / hbm_bw + 2 * head_params * S / flops
 * where kv_bytes_read is every sequence's K and V cache (positions so far
 * plus this step's) and the head runs once per sequence (its last token).
 * hbm_bw or flops 0 drops its terms; t_step and t_token are compute measured
 * on a machine (the sim backend's CPU kernels, say), spread evenly over the
 * layers. Layer l's share starts only after layer l's copy event (the
 * segment hook waits), so a page-in overlaps compute as in the real forward
 * pass. A copy of b bytes takes copy_lat + b / h2d_bw on one FIFO copy
 * queue. Each scheduling round costs t_round of host time. */
typedef struct sim_cost {
    double h2d_bw;     /* bytes/s, host -> device */
    double copy_lat_s; /* s per copy (one per segment) */
    double hbm_bw;     /* bytes/s, device memory; 0 = no memory terms */
    double flops;      /* FLOP/s, dense matmul throughput; 0 = no matmul terms */
    double t_fixed_s;  /* s per step (launches, sampling), before the pass */
    double t_step_s;   /* s per step, measured compute, spread over the layers */
    double t_token_s;  /* s per token of a step, measured compute, spread over the layers */
    double t_round_s;  /* s of host time per scheduling round */
} sim_cost_t;

/* Shape of every model (all models alike). */
typedef struct sim_shape {
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab;
    double wbytes; /* bytes per weight (Q8_0: 34/32, F16: 2) */
    int tied;      /* output head shares the embedding (head segment holds only its norm) */
    /* mixture of experts (n_expert 0: dense). A layer holds a router (n_embd x n_expert) and
     * n_expert experts of three n_embd x n_ff_exp matrices beside its attention and a dense
     * FFN of n_ff (0: none); pages in whole. A token computes n_expert_used experts, and a
     * step of t tokens reads the ones its tokens select: n_expert (1 - (1 - k/n)^t) of them on
     * average (independent uniform routing), the active parameters for one token. */
    uint32_t n_expert, n_expert_used, n_ff_exp;
    uint32_t head_dim; /* per-head width; 0: n_embd / n_head */
} sim_shape_t;

/* Models built from GGUF files by the daemon's own store (store_load), so
 * their segment layout is the daemon's exactly. Opaque; see sim_models_load. */
typedef struct sim_models sim_models_t;

typedef struct sim_cfg {
    int n_models;
    sim_shape_t shape;         /* every model's, unless models or shapes is set */
    const sim_shape_t *shapes; /* (optional) model i has shapes[i % n_shapes]: borrowed */
    int n_shapes;
    size_t quota_bytes;         /* a model larger than this gets it as its gpu_quota (0 = none) */
    const sim_models_t *models; /* (optional) model i is file i % count: borrowed */
    size_t page_size;           /* bytes */
    size_t pool_bytes;          /* device pool, bytes (see sim_pool_bytes) */
    uint32_t max_batch;         /* per model */
    uint32_t max_context;       /* per sequence */
    uint32_t ask_tokens;        /* requests ask for max_tokens this (within the context, at
                                   least their output) and stop at their output; 0 = ask
                                   for the output */
    uint32_t ask_stride;        /* ask_tokens applies to models whose index % this is 0
                                   (0 or 1: all) */
    sched_cfg_t sched;          /* policy is set per run */
    uint32_t lru_batch_n;       /* lru-batch: models kept loaded at most (0 = as many as fit);
                                   lora-slots: device adapter slots */
    sim_cost_t cost;
    int prefix_cache;        /* conversations (wl_req_t.session): each session's last turn's KV
                                  kept as cached KV, reused by its next turn (simpfx.h) */
    uint32_t prefix_entries; /* prefix cache entries per model at most (models.prefix_cache) */
    size_t kv_host_bytes;    /* host-RAM tier of the KV the pool reclaims, bytes (0 = none) */
    double slo_ttft_s;       /* a request meets the SLO when its TTFT is below this */
    double deadline_s;       /* every request's first-token deadline (0 = none): the default and
                                fifo refuse one predicted to miss it, as the worker does
                                (worker_deadline.c), on arrival and while queued */
    int deadline_drop;       /* lru-batch refuses so too (the baseline with the same drop) */
    FILE *dump;              /* (optional) one CSV line per request and run: borrowed */
    /* LoRA adapters (issue 46): lora_n adapters on model 0, requests naming one in
     * wl_req_t.adapter (0: none; read only when lora_n > 0). An adapter's requests queue and step
     * with model 0's; a pass adds, for each distinct adapter among its sequences, its bytes /
     * hbm_bw and 2 lora_params x its tokens / flops. The device copies of all lora_n adapters
     * (lora-slots: of lru_batch_n slots) take pool room with model 0's layers: they page in and
     * out with it (the daemon keeps each adapter of a loaded base on the device). */
    uint32_t lora_n;
    double lora_bytes;  /* one adapter's device bytes */
    double lora_params; /* one adapter's parameters */
} sim_cfg_t;

typedef enum sim_policy {
    SIM_POL_DEFAULT = 0, /* gpuswapd: sched swap-aware + prefetch into free pages */
    SIM_POL_FIFO,        /* gpuswapd with policy: fifo */
    SIM_POL_LRU,         /* Ollama-like load on demand, LRU eviction (see sim.c) */
    SIM_POL_LRU_BATCH,   /* fair baseline: keep up to lru_batch_n models loaded, LRU eviction,
                            batch every queued request of a loaded model (see sim.c) */
    SIM_POL_BELADY,      /* offline bound on model loads for the arrival order */
    SIM_POL_LORA_SLOTS,  /* multi-LoRA with lru_batch_n device adapter slots, LRU (vLLM's
                            max_loras): the default's scheduler; a request is admitted only while
                            its adapter holds a slot (others behind it may pass it); a slot goes
                            to a new adapter, evicting the least recently used one with no
                            running sequence, for a copy of its bytes over h2d before the pass */
    SIM_POL_COUNT
} sim_policy_t;

const char *sim_policy_name(sim_policy_t p);
int sim_policy_parse(const char *s, sim_policy_t *p);

typedef struct sim_result {
    size_t requests; /* in the trace */
    size_t completed, failed;
    size_t refused;      /* refused for their deadline (deadline_s): misses in ttft_p99, slo_frac */
    double adm_ttft_p99; /* s, p99 TTFT of the requests served (ttft_p99 counts the refused) */
    uint64_t page_ins;   /* segments copied host -> device */
    uint64_t model_loads; /* times a model became wholly mapped from not wholly mapped */
    uint64_t bytes_in;    /* bytes copied host -> device */
    uint64_t belady_own;  /* Belady's loads for this run's own order of model uses */
    uint32_t belady_k;    /* models that fit the pool at once (for Belady) */
    uint64_t steps;       /* forward steps */
    double gpu_busy;      /* compute time / (last completion - first arrival) */
    double makespan_s;    /* last completion - first arrival */
    double copy_busy;     /* copy queue busy time / makespan */
    double ttft_p50, ttft_p99, ttft_max; /* s, completed requests */
    double e2e_p50, e2e_p99, e2e_max;    /* s, arrival to last token */
    double slo_frac;                     /* requests with TTFT < slo over all requests */
    uint64_t max_mapped_pages, pool_pages;
    uint64_t violations;  /* virtual device misuse (over-commit, bad maps): must be 0 */
    uint64_t host_blocks; /* evictions that waited for a copy in flight */
    uint64_t preempted;   /* segments evicted from models with paused sequences (live KV) */
    uint64_t active_left; /* sequences still counted active at the end (must be 0) */
    uint64_t recomputes;  /* sequences whose KV cache went back when the pool ran short */
    /* prefix cache and host tier (conversations) */
    uint64_t prompt_tokens;   /* prompt tokens of the requests admitted */
    uint64_t prefill_tokens;  /* prompt tokens computed (the rest came from the cache) */
    uint64_t pfx_hits;        /* prefixes reused from the device (adopted or copied) */
    uint64_t pfx_hit_tokens;  /* their tokens */
    uint64_t kv_demotions;    /* cached KV the pool reclaimed, copied to the host tier */
    uint64_t kv_device_drops; /* cached KV the pool reclaimed and forgot (no host room) */
    uint64_t kv_host_drops;   /* host copies dropped for the budget */
    uint64_t kv_restores;     /* host copies copied back on the copy queue */
    uint64_t kv_restore_tokens;
    uint64_t kv_host_recomputes; /* a host copy whose restore did not pay: prefilled */
    uint64_t kv_d2h_bytes;       /* bytes downloaded to the host tier */
    uint64_t lora_loads;         /* lora-slots: adapters copied into a slot */
} sim_result_t;

/* Load n GGUF files with the real store for this page size (the device
 * page: segment spans are rounded to it). NULL + reason in err on failure;
 * free with sim_models_free. */
sim_models_t *sim_models_load(const char *const *paths, int n, size_t page_size, char *err,
                              size_t errlen);
void sim_models_free(sim_models_t *ms); /* accepts NULL */
int sim_models_count(const sim_models_t *ms);
size_t sim_models_page_size(const sim_models_t *ms);
/* The cost-model shape of file i (hyperparameters, bytes per weight, tying). */
void sim_models_shape(const sim_models_t *ms, int i, sim_shape_t *out);
/* Image bytes of file i: the daemon's weight_bytes for it. */
size_t sim_models_image_bytes(const sim_models_t *ms, int i);
/* Segments of file i (n_layer + 2). */
uint32_t sim_models_segs(const sim_models_t *ms, int i);

/* The shape of model i of a configuration without GGUF files. */
const sim_shape_t *sim_cfg_shape(const sim_cfg_t *c, int i);
/* Image bytes of one model of this shape with this page size. */
size_t sim_model_bytes(const sim_shape_t *sh, size_t page_size);
/* A pool holding n_models whole models plus kv_headroom bytes, in pages. */
size_t sim_pool_bytes(const sim_shape_t *sh, size_t page_size, double n_models, size_t kv_headroom);
/* Parameters of one model of this shape: all of them (what pages in) and those one token
 * computes (MoE: k experts a layer; the embedding and head counted in both). */
void sim_shape_params(const sim_shape_t *sh, double *total, double *active);
/* Weight bytes a step of t tokens reads from device memory (layers and head; MoE: the
 * experts its tokens select, on average). */
double sim_step_read(const sim_shape_t *sh, double t);
/* Requests/s one model can serve with every model resident and full batches
 * of max_batch (a reference for "load"). */
double sim_capacity(const sim_cfg_t *c, double mean_prompt, double mean_output);
/* Step time of the cost model for t tokens of s sequences reading kv_pos positions. */
double sim_step_time(const sim_cfg_t *c, double t, double s, double kv_pos);

/* Run one policy over reqs (sorted by t). 0 or SIM_ERR_*, reason in err. */
int sim_run(const sim_cfg_t *c, sim_policy_t pol, const wl_req_t *reqs, size_t n, sim_result_t *out,
            char *err, size_t errlen);

/* A fleet: n_hosts hosts, each a pool of its own (the cfg's device, cost
 * model and scheduler) with its own residency, scheduler and virtual device,
 * all on one virtual clock (one event loop takes the hosts' rounds and the
 * arrivals in time order). Each request goes, at its arrival, to the host
 * route() names; a host takes a model into its configuration on the model's
 * first request (idle models cost a host nothing). The result sums page-ins,
 * loads and steps over the hosts and takes latency quantiles over all
 * requests; gpu_busy and copy_busy are averages over the hosts; belady_own
 * sums each host's bound. */
typedef struct sim_fleet sim_fleet_t;

typedef struct sim_hosts {
    int n_hosts;
    /* the host (0 .. n_hosts-1) for rq, which arrives now; may query f */
    int (*route)(void *ctx, const sim_fleet_t *f, const wl_req_t *rq);
    void *route_ctx;
} sim_hosts_t;

/* Run policy pol (default or fifo) on every host of a fleet. */
int sim_run_fleet(const sim_cfg_t *c, sim_policy_t pol, const sim_hosts_t *hs, const wl_req_t *reqs,
                  size_t n, sim_result_t *out, char *err, size_t errlen);
/* For routers: requests queued or running on a host, all models or one. */
int sim_fleet_hosts(const sim_fleet_t *f);
size_t sim_fleet_load(const sim_fleet_t *f, int host);
uint32_t sim_fleet_model_load(const sim_fleet_t *f, int host, int model);

/* LoRA targets (sim_lora_params): the projections an adapter adapts. */
enum {
    SIM_LORA_Q = 1,
    SIM_LORA_K = 2,
    SIM_LORA_V = 4,
    SIM_LORA_O = 8,
    SIM_LORA_GATE = 16,
    SIM_LORA_UP = 32,
    SIM_LORA_DOWN = 64,
};
/* Parameters of one rank-r adapter of this (dense) shape on these targets: A (n_in x r) and B
 * (r x n_out) per target per layer. Its bytes: this times sh->wbytes. */
double sim_lora_params(const sim_shape_t *sh, uint32_t rank, unsigned targets);

/* Belady's optimal eviction: loads needed to serve seq (model ids, n of them)
 * with room for k models, starting empty. */
uint64_t sim_belady(const int *seq, size_t n, int n_models, uint32_t k);

#endif

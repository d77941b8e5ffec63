/* stats: every counter and gauge declared once (X-macros), expanded for structs, reset, aggregation and reports. */
#ifndef STATS_H
#define STATS_H

#include <stdint.h>

#include "proto.h"

/* Per-model residency counters (resettable): X(name, help). */
#define STATS_RES_COUNTERS(X)                                                                      \
    X(total_page_ins, "segments copied host->device")                                              \
    X(total_bytes_in, "bytes paged in host->device (segment spans)")                               \
    X(total_copy_ns, "time the copy queue spent on this model's segments, ns")                     \
    X(total_map_ns, "time spent mapping device pages for this model, ns")                          \
    X(total_hits, "acquires that found every segment resident")                                    \
    X(total_misses, "acquires that had to page something in")                                      \
    X(evictions_capacity, "segments evicted to make room for another model")                       \
    X(evictions_quota, "segments evicted to keep the model within its gpu_quota")                  \
    X(evictions_admin, "segments evicted by an operator")                                          \
    X(evictions_preemption, "segments evicted to preempt running work")                            \
    X(total_bytes_evicted, "bytes of segments unmapped")                                           \
    X(total_kv_allocs, "KV caches created")                                                        \
    X(total_kv_frees, "KV caches freed")                                                           \
    X(total_kv_demotions, "cached KV caches copied to host RAM (the pool gave them up)")           \
    X(total_kv_host_drops, "cached KV caches dropped from host RAM (LRU, superseded, budget)")     \
    X(total_kv_restores, "cached KV caches copied back from host RAM into a sequence's")           \
    X(total_kv_restore_bytes, "bytes copied back from host RAM")                                   \
    X(total_kv_restore_failures, "copies back from host RAM that failed (recomputed instead)")     \
    X(total_device_errors, "failed or timed-out device maps and copies")

/* Per-model gauges (state, never reset): X(name, help). */
#define STATS_RES_GAUGES(X)                                                                        \
    X(curr_resident_bytes, "bytes of weights mapped on the device")                                \
    X(curr_kv_bytes, "bytes of KV cache mapped on the device")                                     \
    X(curr_running, "forward passes in progress")                                                  \
    X(curr_kv_seqs, "live KV caches")                                                              \
    X(curr_kv_cached_bytes, "bytes of KV cache kept for prefix reuse (reclaimed first)")           \
    X(curr_kv_cached, "KV caches kept for prefix reuse")                                           \
    X(curr_kv_host_bytes, "bytes of cached KV kept in host RAM")                                   \
    X(curr_kv_host, "cached KV caches kept in host RAM")

typedef struct stats_res {
#define STATS_FIELD(name, help) uint64_t name;
    STATS_RES_COUNTERS(STATS_FIELD)
    STATS_RES_GAUGES(STATS_FIELD)
#undef STATS_FIELD
} stats_res_t;

/* Pool-wide gauges. */
typedef struct stats_pool {
    uint64_t curr_pool_pages; /* pages in the pool */
    uint64_t curr_pool_used;  /* pages mapped */
    uint64_t curr_pool_free;  /* pages free */
    uint64_t page_size;       /* bytes */
    uint64_t
        curr_scratch_bytes; /* device scratch of the forward pass (activations), beside the pool */
    uint64_t
        peak_device_bytes; /* most device bytes in use at once: pool pages (weights, KV) + scratch */
    uint64_t curr_budget_cut_bytes; /* taken off the pool because the device could not map them */
    uint64_t curr_scratch_reserved_bytes; /* taken off the pool for the forward pass's scratch */
} stats_pool_t;

/* Per-model service counters (resettable): X(name, help). */
#define STATS_SVC_COUNTERS(X)                                                                      \
    X(total_requests, "generate/chat requests accepted")                                           \
    X(total_completed, "requests that ended with a done event")                                    \
    X(total_cancelled, "requests cancelled by the client or its disconnect")                       \
    X(total_failed, "requests that ended with an error after being accepted")                      \
    X(total_prompt_tokens, "prompt tokens prefilled (those a cached prefix covered are not)")      \
    X(total_prefix_lookups, "requests that looked for a cached prefix of their prompt")            \
    X(total_prefix_lookup_tokens, "prompt tokens of the requests that looked")                     \
    X(total_prefix_hits, "requests that reused a cached prefix")                                   \
    X(total_prefix_hit_tokens, "prompt tokens reused from the prefix cache, not prefilled")        \
    X(total_prefix_copies, "hits whose KV was copied (the rest adopted a cached sequence whole)")  \
    X(total_prefix_waits,                                                                          \
      "requests held back a pass to reuse the prefix of one admitted with them")                   \
    X(total_prefix_evictions, "cached prefixes dropped (LRU, memory pressure, superseded)")        \
    X(total_prefix_host_recomputes,                                                                \
      "hits on a prefix in host RAM prefilled instead (copying back would take longer, or it "     \
      "could not be queued)")                                                                      \
    X(total_generated_tokens, "tokens generated")                                                  \
    X(total_steps, "forward passes run")                                                           \
    X(total_swapped_requests, "requests whose first token waited for their model's page-in")       \
    X(total_stopped_early,                                                                         \
      "requests that ended before their max_tokens (eos or a stop string): where most do, "        \
      "shortest remaining first goes by the output lengths seen")                                  \
    X(total_kv_recomputes,                                                                         \
      "sequences whose KV cache was given back when the pool ran short, then recomputed")          \
    X(total_batch_requests, "requests of the batch class accepted (docs/overload.md)")             \
    X(total_queue_refused, "requests refused on arrival: the model's queue or all queues full")    \
    X(total_batch_refused, "requests of the batch class refused (for their deadline or a queue)")  \
    X(total_deadline_refused, "requests refused on arrival: predicted to miss their deadline")     \
    X(total_deadline_dropped, "queued requests refused once predicted to miss their deadline")     \
    X(total_deadline_kept,                                                                         \
      "requests predicted to miss their deadline and kept without it (deadline_miss: keep)")       \
    X(total_deadline_met, "requests with a deadline whose first token came within it")             \
    X(total_deadline_missed, "requests with a deadline whose first token came after it")

typedef struct stats_svc {
#define STATS_FIELD(name, help) uint64_t name;
    STATS_SVC_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
} stats_svc_t;

/* Per-adapter counters and gauges (LoRA adapters, residency units of their base): X(name, help);
 * in the stats report's "adapters" and on /metrics as gpuswapd_adapter_* by adapter and base. */
#define STATS_ADAPTER(X)                                                                           \
    X(total_requests, "generate/chat requests that named the adapter")                             \
    X(total_generated_tokens, "tokens the adapter's sequences generated")                          \
    X(total_failed, "the adapter's requests answered with an error")                               \
    X(total_page_ins, "times the adapter's weights were copied host->device")                      \
    X(total_bytes_in, "bytes of the adapter's weights copied host->device")                        \
    X(total_evictions,                                                                             \
      "times the adapter's weights left the device (idle under pressure, with its base, admin)")   \
    X(curr_resident, "1 while the adapter's weights are on the device (copy landed), else 0")      \
    X(curr_device_bytes, "device bytes the adapter's weights take while paged in (whole pages)")   \
    X(curr_refs, "the adapter's requests queued or running")

typedef struct stats_adapter {
#define STATS_FIELD(name, help) uint64_t name;
    STATS_ADAPTER(STATS_FIELD)
#undef STATS_FIELD
} stats_adapter_t;

/* Server-wide counters, updated on the loop thread and read by the report
 * builder on the worker thread: atomics, the only state the two share. */
#define STATS_SERVER_COUNTERS(X)                                                                   \
    X(total_connections, "client connections accepted (inference and admin)")                      \
    X(curr_connections, "client connections open")                                                 \
    X(total_lines, "request lines read")                                                           \
    X(total_errors, "error answers sent")

typedef struct stats_server {
#define STATS_FIELD(name, help) _Atomic uint64_t name;
    STATS_SERVER_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
    _Atomic uint64_t errors_by_code[PROTO_E_COUNT]; /* indexed by proto_err_t */
} stats_server_t;

extern stats_server_t stats_server;

/* Latency histogram: log-spaced buckets from 0.01 ms to ~10 min. */
#define STATS_HIST_BUCKETS 96
typedef struct stats_hist {
    uint64_t b[STATS_HIST_BUCKETS]; /* counts per bucket */
    uint64_t n;                     /* observations */
    double sum_ms;                  /* their sum */
} stats_hist_t;

void stats_hist_add(stats_hist_t *h, double ms);
/* q in [0,1]: upper bound of the bucket holding that quantile, ms; 0 if empty. */
double stats_hist_quantile(const stats_hist_t *h, double q);
/* Upper bound of bucket i, ms. */
double stats_hist_bound(int i);

/* Per-model latency histograms, X(field, metric, help): a stats_hist_t field of
 * stats_hists_t, "hist_<field>_ms" in the stats report and gpuswapd_<metric>
 * (seconds) on /metrics, each once. */
#define STATS_HISTS(X)                                                                             \
    X(ttft, "ttft_seconds", "time from receiving a request to its first token")                    \
    X(latency, "latency_seconds", "time from receiving a request to its done event (total_ms)")    \
    X(queue, "queue_seconds", "time a request waited for its first step, swap-in excluded")        \
    X(swap, "swap_in_seconds",                                                                     \
      "time a request's first token waited for its model's page-in (swap_ms)")                     \
    X(ttft_error, "ttft_prediction_error_seconds",                                                 \
      "how far a request's first token came from the time predicted on its arrival (deadlines)")

typedef struct stats_hists {
#define STATS_HIST_FIELD(field, metric, help) stats_hist_t field;
    STATS_HISTS(STATS_HIST_FIELD)
#undef STATS_HIST_FIELD
} stats_hists_t;

/* Zero the resettable counters, keep the gauges. */
static inline void stats_res_reset(stats_res_t *s)
{
#define STATS_ZERO(name, help) s->name = 0;
    STATS_RES_COUNTERS(STATS_ZERO)
#undef STATS_ZERO
}

/* a += b for counters and gauges alike (totals over models). */
static inline void stats_res_add(stats_res_t *a, const stats_res_t *b)
{
#define STATS_ADD(name, help) a->name += b->name;
    STATS_RES_COUNTERS(STATS_ADD)
    STATS_RES_GAUGES(STATS_ADD)
#undef STATS_ADD
}

#endif

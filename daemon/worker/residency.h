/* residency: the device page pool, per-model mappings, pipelined page-in, tail-first GreedyDual eviction, quotas and KV pages. */
#ifndef RESIDENCY_H
#define RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "stats.h"
#include "store.h"

enum {
    RES_OK = 0,
    RES_ERR_NOSPACE = -1, /* no room now: the rest of the pool is running or pinned */
    RES_ERR_QUOTA = -2,   /* can never fit: gpu_quota or the pool is too small */
    RES_ERR_DEVICE = -3,  /* backend failure */
    RES_ERR_NOMEM = -4,
    RES_ERR_BUSY = -5,    /* model has running work or live KV caches */
    RES_ERR_TIMEOUT = -6, /* a copy did not complete within the copy timeout */
    RES_ERR_ARG = -7,     /* no such segment or unit */
};

typedef enum res_cause {
    RES_CAUSE_CAPACITY = 0,
    RES_CAUSE_QUOTA,
    RES_CAUSE_ADMIN,
    RES_CAUSE_PREEMPTION,
} res_cause_t;

typedef enum res_seg_state {
    RES_SEG_ABSENT = 0,
    RES_SEG_INFLIGHT, /* mapped, copy queued */
    RES_SEG_RESIDENT, /* mapped, copy completed */
} res_seg_state_t;

typedef struct res_cfg {
    size_t gpu_quota;  /* bytes of weights + KV the model may hold; 0 = the whole pool */
    int pinned;        /* never evicted */
    double priority;   /* > 0; scales how much the model is worth keeping (default 1) */
    kv_type_t kv_type; /* element type of its KV caches (0 = KV_TYPE_F16) */
    size_t kv_reserve; /* bytes of KV only this model may map (config kv_cache): other
                         models' caches never take them; 0 = none */
} res_cfg_t;

typedef struct res res_t;
typedef struct res_model res_model_t;
typedef struct res_att res_att_t;

/* be is borrowed. The pool is be->pool_bytes / be->page_size pages. */
res_t *res_new(backend_t *be, char *err, size_t errlen);
void res_free(res_t *r); /* models must have been removed; accepts NULL */

/* Register a loaded model: reserves its virtual range, maps nothing. Fails
 * with RES_ERR_QUOTA when the quota or pool cannot hold its embedding plus
 * its largest other segment (the minimum to run, streaming the rest). */
int res_add(res_t *r, store_model_t *sm, const res_cfg_t *cfg, res_model_t **out, char *err,
            size_t errlen);
/* RES_ERR_BUSY while running or holding KV caches. Its attached units are freed with it (their
 * owner removes them first, or forgets them). */
int res_remove(res_t *r, res_model_t *m);
/* Pinning a model that, with the other pinned ones, leaves no room for the
 * KV minimum and for every unpinned model to run fails with RES_ERR_QUOTA
 * (and changes nothing). */
int res_set_cfg(res_t *r, res_model_t *m, const res_cfg_t *cfg, char *err, size_t errlen);
const res_cfg_t *res_cfg(const res_model_t *m);
store_model_t *res_store_model(const res_model_t *m);

/* Begin a forward pass: the model counts as running (never a victim) until
 * res_release. Missing segments are mapped and their copies queued layer 0
 * first, evicting idle models tail-first as needed; what does not fit now
 * (quota, or the pool held by running work) is streamed in by the hooks. */
int res_acquire(res_t *r, res_model_t *m, char *err, size_t errlen);
void res_release(res_t *r, res_model_t *m);
/* Weights to run the pass with (device addresses) and the hooks that wait
 * for each segment's copy (and page in what acquire could not). */
const model_weights_t *res_weights(const res_model_t *m);
fwd_hooks_t res_hooks(res_model_t *m);

/* Map segment seg of a running m and queue its copy if it is not mapped
 * (m streams: acquire could not fit it), making room from idle models, then
 * from m's own segments; the ones after it too while they fit. Never waits
 * for a copy (but evicting a segment whose copy is in flight waits for
 * that copy). The hooks' wait does this first. */
int res_seg_request(res_t *r, res_model_t *m, uint32_t seg);
/* Seconds until segment seg's copy lands at the measured bandwidth, behind
 * the copies queued before it: 0 when resident, INFINITY when not mapped.
 * Never blocks. */
double res_seg_lands_in(res_t *r, res_model_t *m, uint32_t seg);
/* Seconds until a pass of m can start without waiting on a copy longer
 * than the compute ahead of it covers (PipeSwitch: layer i is needed
 * compute_s * offset_i / image after the pass starts, and lands when the
 * copy engine's FIFO reaches it at the measured bandwidth): 0 = runnable
 * now; INFINITY while a segment is not even queued (the model streams, or
 * its page-in could not be queued whole). Never blocks. */
double res_ready_in(res_t *r, res_model_t *m, double compute_s);
/* Seconds until m can run a pass computing compute_s, for a prediction (deadlines): res_ready_in
 * while every segment is at least queued, else the bytes not on the device at the measured copy
 * bandwidth plus what the copy queue holds before them; 0 when no copy was timed yet (never a
 * guess). Never blocks. */
double res_pagein_eta(res_t *r, res_model_t *m, double compute_s);
/* Segments of m whose copy is queued and has not landed. */
int res_inflight(const res_model_t *m);
/* The caller saw none of m's copies land for the copy timeout: counted as a
 * device error; RES_ERR_TIMEOUT and the message (the copies stay queued and
 * land, or fail, on their own). */
int res_copy_overdue(res_t *r, res_model_t *m, char *err, size_t errlen);
/* Bound on what a model with live KV caches (running sequences paused
 * between passes) may lose to another model's pass: what the copy engine
 * brings back in half of seconds behind the copies queued ahead (0 = no
 * bound); the caller steps it after the other half. Such models are
 * victims only when no idle one is left. */
void res_set_max_stall(res_t *r, double seconds);

/* The RES_ERR_* code and message of the last failure of m since its last
 * res_acquire (page-in, copy, map or timeout), 0 and "" if none. */
int res_last_error(const res_model_t *m, const char **msg);
/* How long a pass waits for one segment's copy (default 30 s). */
void res_set_copy_timeout(res_t *r, double seconds);

/* What res_prefetch may evict to make room. */
enum {
    RES_EVICT_NONE = 0,     /* free pages only */
    RES_EVICT_ANY = 1,      /* idle models, as acquire does (but never pages of paused running
                               sequences: only a pass of m takes those, as the last resort) */
    RES_EVICT_UNWANTED = 2, /* only idle models nobody has work for (res_set_wanted) */
};
/* Page in what fits, evicting as evict (RES_EVICT_*) allows; the copies
 * are queued, nothing waits for them. Not running. */
int res_prefetch(res_t *r, res_model_t *m, int evict, char *err, size_t errlen);
/* res_prefetch a little at a time: queues segments only while m's copies in
 * flight stay under ahead bytes (0 = all), so each call maps and evicts only
 * what the copy engine reaches soon (a background page-in's host work is
 * spread over the caller's rounds). */
int res_prefetch_ahead(res_t *r, res_model_t *m, int evict, size_t ahead, char *err, size_t errlen);
/* What res_prefetch_ahead should keep in flight for m when the caller calls
 * again within round_s, and m's next pass computes pass_s (it may start only
 * once every copy it needs is queued, res_ready_in): its two largest
 * segments, or what the copy engine moves in the longer of the two at the
 * measured bandwidth if more (the engine never idles for want of queued
 * copies). */
size_t res_pagein_window(const res_t *r, const res_model_t *m, double round_s, double pass_s);
/* Whether the caller has work queued for m: an idle model nobody waits for
 * is the first victim. */
void res_set_wanted(res_model_t *m, int wanted);
/* Pages a page-in may take without evicting a model someone has work for:
 * the free ones plus those of idle, unwanted models (res_set_wanted), cached
 * KV, and the attached units nobody holds of models without weights or of
 * those idle, unwanted ones (they go before, or with, the weights). Call
 * after every model's res_set_wanted of the round, once for all the cold
 * models it sizes (res_pagein_fits). */
size_t res_spare_pages(const res_t *r);
/* Whether m's page-in fits without evicting a model someone has work for: its
 * missing segments (up to its gpu_quota) in spare (res_spare_pages, less m's
 * own pages and idle attached units if counted there), beside reserve_bytes
 * kept for the KV caches (and the adapters not on the device,
 * res_att_missing) of queued work. 1 yes, -1 no (sched_model_view_t.fits). */
int res_pagein_fits(res_t *r, res_model_t *m, size_t spare, size_t reserve_bytes);
/* max_stall in parts: a model whose running sequences lost pages is stepped
 * once max_stall / RES_STALL_PARTS passed without a pass, and loses at most
 * what the copy engine brings back in as long; the rest of max_stall is the
 * margin for the step under way and the host's own delays. */
#define RES_STALL_PARTS 3
/* Evict up to max_segs segments tail-first (0 = all). RES_ERR_BUSY if running. */
int res_evict(res_t *r, res_model_t *m, res_cause_t cause, uint32_t max_segs);

/* Units below a segment (res_unit.c): a MoE layer's experts (store_seg_units: the layer's other
 * tensors as unit STORE_UNIT_REST, routed expert e as STORE_UNIT_EXPERT(e)). A segment is held
 * either whole (one mapping, one copy: what acquire, prefetch and the hooks page in) or unit by
 * unit: each unit mapped, copied and evicted on its own, counted in m's weight bytes, quota and
 * the pool like segments, the segment itself RES_SEG_ABSENT meanwhile; a page two units share
 * stays mapped while either holds it. A unit of a segment held whole is there with it (and
 * leaves with it); paging a segment whole drops its units first, and evicting the segment (tail
 * first, quota, admin) drops them all as one eviction. */
/* Maps unit u of segment seg and queues its copies, making room from idle models (and, for a
 * running m, the last resort of res_make_room_others) when the pool is short; nothing waits for
 * the copies. RES_OK if it is mapped already (or its segment is held whole); RES_ERR_NOSPACE
 * (its quota or the pool), RES_ERR_ARG, RES_ERR_DEVICE, RES_ERR_NOMEM, with err. */
int res_unit_map(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, char *err, size_t errlen);
/* Unmaps unit u (waiting for its copies), the rest of the segment untouched; counted as an
 * eviction under cause. RES_ERR_BUSY while m runs or when its segment is held whole. */
int res_unit_evict(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, res_cause_t cause);
/* Its state: its segment's while held whole, else the unit's own. */
res_seg_state_t res_unit_state(res_t *r, res_model_t *m, uint32_t seg, uint32_t u);
/* Waits (up to the copy timeout) for unit u's copies and orders later compute after them, as
 * the hooks do for a segment: 0 when it can be read; RES_ERR_NOSPACE when it is not mapped,
 * RES_ERR_TIMEOUT, RES_ERR_DEVICE (its copy failed: unmapped again). */
int res_unit_wait(res_t *r, res_model_t *m, uint32_t seg, uint32_t u);
/* Bytes of pages segment seg's units hold mapped (0 when none, or held whole). */
size_t res_unit_bytes(const res_model_t *m, uint32_t seg);

/* Attached units (res_att.c): small images that belong to a model without being in its store
 * image (a LoRA adapter's pairs). Each stays in host RAM (the caller's image) and has a device
 * range of its own, reserved once, so its device address never changes; it is paged in on
 * request (res_att_map: its pages mapped, one copy queued on the copy engine behind what is
 * there), kept while held (res_att_hold), and otherwise a victim when the pool is short:
 * attached units of models that hold no weights go before any weights, the others least
 * recently used first once no weights are left to take (never a held one, never weights a
 * running model needs). They leave with their model when it is paged out whole (res_evict
 * with max_segs 0) or when a capacity eviction takes its last weights, and count in its
 * gpu_quota and the pool like its segments. On a zero-copy backend they are read in place:
 * always resident, no pages. */
/* Adds one for host[0, bytes) (kept by the caller until res_att_remove): RES_ERR_QUOTA when
 * its pages exceed the model's gpu_quota or the pool (it could never be paged in),
 * RES_ERR_DEVICE, RES_ERR_NOMEM, with err. */
int res_att_add(res_t *r, res_model_t *m, const void *host, size_t bytes, res_att_t **out,
                char *err, size_t errlen);
/* Unmaps (waiting for its copy) and frees it; accepts NULL. */
void res_att_remove(res_t *r, res_att_t *a);
/* Maps it and queues its copy unless mapped already (a use, for its recency), making room
 * from its model's quota (cached KV, its other idle units) and the pool (as above; idle
 * models too, and for a running model the last resort of res_make_room_others). RES_OK when
 * mapped (in flight or resident); RES_ERR_NOSPACE (not now), RES_ERR_DEVICE, with err. */
int res_att_map(res_t *r, res_att_t *a, char *err, size_t errlen);
/* Its state, settled without blocking (RES_SEG_RESIDENT: its copy landed; readable). */
res_seg_state_t res_att_state(res_t *r, res_att_t *a);
/* Holds it (delta +1) or lets it go (-1): a held unit is never a victim of the pool. */
void res_att_hold(res_att_t *a, int delta);
/* Its device address (the image's layout starts there; the host image on zero-copy). */
void *res_att_addr(const res_att_t *a);
/* Device bytes it takes while mapped (whole pages; 0 on zero-copy). */
size_t res_att_span(const res_t *r, const res_att_t *a);
/* Pool bytes a page-in of it would map now: its span while absent (a failed copy settled
 * as absent), 0 when mapped (in flight or resident) or on zero-copy. For predictions: what an
 * admission that needs it takes beside its KV cache. */
size_t res_att_missing(res_t *r, res_att_t *a);
/* Seconds until it can be read if its request were admitted now, at the measured copy
 * bandwidth: 0 when resident, on zero-copy or before any copy was timed (never a guess); in
 * flight, the bytes queued up to its copy's end; absent, the bytes queued now, its model's
 * weights not mapped (its page-in goes first) and its own. Never blocks. */
double res_att_eta(res_t *r, res_att_t *a);
/* Its counters: copies queued, their bytes, evictions; whether its copy has landed. */
void res_att_stats(res_t *r, res_att_t *a, uint64_t *page_ins, uint64_t *bytes_in,
                   uint64_t *evictions, int *resident);

/* KV caches in device pages, counted against the model's quota. */
int res_kv_new(res_t *r, res_model_t *m, uint32_t n_ctx, kv_seq_t **out, char *err, size_t errlen);
/* Map pages so positions [0, n_pos) fit; may evict (own tail for quota,
 * idle models for capacity). RES_ERR_NOSPACE / RES_ERR_QUOTA otherwise. */
int res_kv_ensure(res_t *r, kv_seq_t *kv, uint32_t n_pos, char *err, size_t errlen);
void res_kv_free(res_t *r, kv_seq_t *kv); /* accepts NULL */
/* Cached KV (a prefix cache's entries: finished sequences kept for reuse): a KV cache handed to
 * res_kv_cache stops counting as live (curr_kv_seqs, curr_kv_bytes; counted in curr_kv_cached*)
 * and becomes the first thing the pool gives up: before any model's weights (capacity), before
 * its model's own weights (gpu_quota), and whenever the KV budget is short. The pool frees it
 * least recently used first, calling drop(ctx, kv) just before (the owner forgets it; kv is freed
 * after). Zero-copy backends have no budget: nothing is reclaimed, the owner bounds its cache. */
typedef void (*res_kv_drop_fn)(void *ctx, kv_seq_t *kv);
void res_kv_cache(res_t *r, kv_seq_t *kv, res_kv_drop_fn drop, void *ctx);
/* A cached KV cache becomes a live sequence's again (its owner takes it back). */
void res_kv_uncache(res_t *r, kv_seq_t *kv);
/* A cached KV cache was used (copied from): last to go. */
void res_kv_touch(res_t *r, kv_seq_t *kv);
/* Copies positions [0, n) of src into dst (k and v, every layer: position-major, so one
 * device-to-device copy per array) and sets dst->n_past = n; dst must hold n positions mapped
 * (res_kv_ensure) and share src's shape and type. RES_ERR_DEVICE if the backend fails. */
int res_kv_copy(res_t *r, kv_seq_t *dst, const kv_seq_t *src, uint32_t n);

/* The host-RAM tier (res_kvhost.c): cached KV the pool gives up, copied to host memory so a later
 * prompt sharing its prefix copies it back instead of recomputing it. Copies live in one list over
 * all models, least recently used dropped first when the budget (host.kv_cache, within
 * host.memory) is short; dropping one calls its drop(ctx, kv) first. Zero-copy backends keep none
 * (their caches are host memory already). */
void res_kv_host_budget(res_t *r, size_t bytes); /* drops the oldest beyond it now */
size_t res_kv_host_used(const res_t *r);
void res_kv_host_drop_model(res_t *r, const res_model_t *m);
/* Copies positions [0, n_past) of the device cache dev into a new host copy (*out, owned by the
 * tier: freed by res_kv_free or dropped by the budget, calling drop). RES_ERR_NOSPACE when it
 * cannot fit the budget, RES_ERR_NOMEM, RES_ERR_DEVICE (the copy failed). */
int res_kv_demote(res_t *r, const kv_seq_t *dev, res_kv_drop_fn drop, void *ctx, kv_seq_t **out);
int res_kv_is_host(const kv_seq_t *kv); /* a host copy (res_kv_demote) */
/* The measured copy bandwidth (bytes/s; 0 until a copy was timed). */
double res_copy_bw(const res_t *r);
/* A copy back in flight: its two events and the host copy it reads (kept until it lands). */
typedef struct res_restore {
    be_event_t *ev[2];
    void *src;
} res_restore_t;
/* Queues the copy of a host copy's positions [0, n) into the device cache dst (mapped for them)
 * on the copy queue, behind what is queued there; the host copy is not dropped until it lands.
 * RES_ERR_DEVICE when it cannot be queued (nothing is then; rs stays empty). */
int res_kv_restore_start(res_t *r, kv_seq_t *dst, const kv_seq_t *host, uint32_t n,
                         res_restore_t *rs);
/* Whether the copy landed: 1 (dst->n_past = n), 0 not yet, -1 it failed (dst holds garbage:
 * recompute); rs is empty again once it returns non-zero. Never blocks. */
int res_kv_restore_poll(res_t *r, kv_seq_t *dst, uint32_t n, res_restore_t *rs);
/* A restore whose sequence ends first: waits for its copies and empties rs (accepts an empty
 * one). */
void res_kv_restore_cancel(res_t *r, res_restore_t *rs);

/* KV bytes that may still be mapped: the pool minus what is mapped as KV
 * minus headroom for the largest model to be resident (its image, or its
 * gpu_quota when smaller), so KV never starves paging. With no KV mapped
 * at all only the minimum to run is kept, so one sequence always fits. */
size_t res_kv_available(const res_t *r); /* cached KV counts as available: it is reclaimed */
/* What model m may still map as KV: res_kv_available less the part of other
 * models' kv_reserve they have not mapped yet, and at least the part of its
 * own it has not (a reservation holds even against the weights' headroom). */
size_t res_kv_available_for(const res_t *r, const res_model_t *m);
/* Pool bytes a KV cache of n_pos positions takes (k and v, whole pages), F16. */
size_t res_kv_bytes_for(const res_t *r, const model_hparams_t *hp, uint32_t n_pos);
/* The same for a cache of model m (its configured kv_type). */
size_t res_kv_bytes_model(const res_t *r, const res_model_t *m, uint32_t n_pos);

/* The forward pass's device scratch (activations, bounded by
 * device.prefill_chunk) is bytes now: device memory the backend allocates
 * beside the pool, so as it grows its pages come off the pool (never given
 * back: the scratch only grows), evicting idle models when the free pages
 * are short; counted with the pool pages in the stats' peak_device_bytes.
 * A no-op on a zero-copy backend. */
void res_scratch_note(res_t *r, size_t bytes);

/* State for tests, stats and schedulers. */
res_seg_state_t res_seg_state(res_t *r, res_model_t *m, uint32_t seg);
int res_seg_times(res_t *r, res_model_t *m, uint32_t seg, be_copy_times_t *t);
size_t res_model_bytes(const res_model_t *m); /* resident weights + KV + attached units */
size_t res_weight_bytes(
    const res_model_t *m); /* weight spans mapped (resident or in flight); settles nothing */
int res_fully_resident(res_t *r, res_model_t *m);
/* Whether m's weights exceed its gpu_quota (or the pool): every pass of it
 * streams what the quota does not hold. */
int res_streams(const res_model_t *m);
/* Whether m's running sequences lost weight pages to another model since its
 * last pass began (the last resort: preemption within the stall budget). */
int res_lost_pages(const res_model_t *m);
void res_model_stats(res_t *r, res_model_t *m, stats_res_t *out);
void res_pool_stats(const res_t *r, stats_pool_t *out);
size_t res_page_size(const res_t *r);
/* Device address of the model's range (the image layout starts there); NULL for zero-copy. */
void *res_model_base(const res_model_t *m);

#endif

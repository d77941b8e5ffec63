/* residency_int: what residency's files share (residency.c, res_kv.c, res_evict.c): the pool's and models' fields and the accounting, settling and eviction helpers res_evict.c offers the files above it; not for other modules. */
#ifndef RESIDENCY_INT_H
#define RESIDENCY_INT_H

#include <stddef.h>
#include <stdint.h>

#include "residency.h"

/* A unit of a segment held unit by unit (res_unit.c, store_unit_t). */
typedef struct res_unit {
    res_seg_state_t state;
    be_event_t *ev[STORE_UNIT_RANGES]; /* one per range's copy; made at its first map */
    uint64_t q_end;                    /* as res_seg_t's, for its last copy */
    size_t q_span;                     /* bytes its copies queued */
} res_unit_t;

/* A segment held unit by unit: made at its first unit's map; the segment's own state stays
 * RES_SEG_ABSENT meanwhile (res_unit.c). A page is mapped while a mapped unit touches it: a run
 * of pages only one unit touches is one mapping, a page two share is one of its own, so each
 * unmap undoes whole mappings (cuda's rule). */
typedef struct res_useg {
    uint32_t n_units;    /* store_seg_units */
    res_unit_t *u;       /* n_units */
    uint16_t *cover;     /* per page of the segment's span: units touching it */
    uint16_t *held;      /* per page: mapped units touching it (mapped while > 0) */
    uint32_t n_mapped;   /* units mapped (in flight or resident) */
    uint32_t n_inflight; /* units whose copies are queued and not settled */
    size_t bytes;        /* bytes of pages mapped */
} res_useg_t;

/* A segment of a model on the device. */
typedef struct res_seg {
    res_seg_state_t state;
    be_event_t *ev; /* copy completion */
    int timed;      /* copy time already added to the counters */
    be_copy_times_t t;
    uint64_t
        q_end; /* bytes ever queued on the copy engine when its copy was queued, itself included */
    size_t q_span;  /* bytes of that copy */
    res_useg_t *us; /* held unit by unit (experts): NULL until a unit is first mapped */
} res_seg_t;

/* An attached unit (res_att.c): a small image of a model's that is not in its store image (a LoRA
 * adapter's pairs), with a device range of its own. */
struct res_att {
    res_model_t *m;        /* the model it belongs to */
    const void *host;      /* its image in host RAM: the caller's, borrowed while it is added */
    size_t bytes;          /* of the image */
    size_t span;           /* whole pages: its device range, what it takes mapped */
    void *base;            /* its reserved device range (NULL on zero-copy: host is read) */
    res_seg_state_t state; /* mapped and copied as a segment is */
    be_event_t *ev;        /* copy completion */
    uint64_t q_end;        /* as res_seg_t's */
    uint32_t holds;        /* res_att_hold: never a victim while > 0 */
    uint64_t used;         /* res.att_tick at its last use: the least recently used goes first */
    uint64_t page_ins;     /* copies queued */
    uint64_t bytes_in;     /* their bytes */
    uint64_t evictions;    /* times it was unmapped (not counting a failed copy) */
    struct res_att *next;  /* its model's list */
};

/* A KV cache (res_kv.c): its ranges, its pages, and whether it is a live sequence's or cached
 * (finished, kept for a later prefix hit: evictable, on the pool's LRU list). */
typedef struct res_kv {
    kv_seq_t kv; /* first: kv_seq_t pointers are res_kv pointers */
    res_model_t *m;
    size_t range_bytes;  /* reserved per array (k and v) */
    size_t mapped_bytes; /* mapped per array */
    int cached;          /* res_kv_cache: not a live sequence's; reclaimable */
    int host;            /* a copy in host RAM (res_kvhost.c): k and v are host memory, in
                            the host list (lru_prev/next), drop called when it is dropped */
    size_t host_bytes;   /* host: bytes of k and v together */
    int busy;            /* host: restores reading it now (never dropped while > 0) */
    int doomed;          /* host: dropped while busy, out of the list: freed when idle */
    res_kv_drop_fn drop; /* the cache's owner forgets it before it is freed */
    void *drop_ctx;
    struct res_kv *lru_prev, *lru_next; /* the pool's cached list, oldest first */
} res_kv_t;

struct res_model {
    res_t *r;
    store_model_t *sm;
    res_cfg_t cfg;
    void *base;          /* device range holding the image layout */
    res_seg_t *segs;     /* sm->n_segs */
    model_weights_t dev; /* weights at base */
    model_layer_t *dev_layers;
    size_t weight_bytes;    /* spans mapped (resident or in flight) */
    size_t span_bytes;      /* spans of all its segments (res_pagein_fits: what is missing) */
    size_t kv_bytes;        /* KV pages mapped by live caches */
    res_att_t *atts;        /* its attached units (res_att.c) */
    size_t att_bytes;       /* their pages mapped (counted in its gpu_quota) */
    size_t kv_cached_bytes; /* KV pages mapped by cached ones (res_kv_cache) */
    size_t kv_host_bytes;   /* its cached KV in host RAM (res_kvhost.c) */
    int n_kv_host;
    int running;
    int n_kv;               /* live KV caches */
    int n_kv_cached;        /* cached ones */
    kv_type_t kv_live_type; /* type of its live KV caches (while n_kv > 0): a reload's
                                new kv_type applies once they are gone, so one
                                pass never mixes types */
    int n_inflight;         /* segments whose copy is queued and not settled */
    size_t inflight_bytes;  /* their spans */
    int wanted;             /* the caller has work queued for it (res_set_wanted) */
    int prefetch_touched;   /* a prefetch counted as a use since its last pass */
    size_t stolen;          /* bytes evicted while it had live KV caches, since its last pass */
    double freq;            /* uses, for the GreedyDual score */
    double h;               /* GreedyDual value: lowest goes first */
    uint64_t ord;           /* order of res_add: the models list runs newest first */
    struct res_model *if_next, *if_prev; /* the in-flight list (n_inflight > 0) */
    stats_res_t st;
    int err_code;  /* RES_ERR_* of the last failure since acquire, 0 if none */
    char err[192]; /* its message */
    struct res_model *next;
};

struct res {
    backend_t *be;
    size_t page;
    size_t n_pages, free_pages;
    size_t scratch_bytes; /* device scratch in use (res_scratch_note) */
    size_t scratch_pages; /* taken off the pool as the scratch grew (res_scratch_note) */
    size_t cut_pages;     /* pages taken off the budget because the device could not map them */
    size_t peak_used;     /* most device bytes in use at once: pool pages and scratch */
    double L;             /* GreedyDual inflation value */
    res_model_t *models;
    res_model_t *inflight;  /* models with copies in flight, in models-list order: settling
                              walks these (the order keeps bw's average as a walk over all) */
    uint64_t n_added;       /* res_add calls (res_model.ord) */
    size_t kv_bytes;        /* KV pages mapped, all models, cached ones included */
    size_t kv_cached_bytes; /* of which cached (reclaimable) */
    struct res_kv *cached_old, *cached_new; /* cached KV caches, least recently used first */
    struct res_kv *host_old, *host_new;     /* cached KV in host RAM, least recently used first */
    size_t kv_host_bytes, kv_host_budget;   /* host RAM they take, and may take */
    int n_kv_reserve;      /* models with a kv_reserve (update_headroom): res_kv_available_for
                              walks the models only when there are any */
    size_t headroom;       /* bytes kept free of KV: the largest model wholly resident
                                (image, or its gpu_quota when smaller) */
    size_t headroom_min;   /* the most any model needs to run at all (embedding +
                                largest other segment, streaming the rest) */
    double copy_timeout_s; /* a pass waits this long for one segment's copy */
    double max_stall_s;    /* a model with live KV caches loses at most what the copy
                                engine brings back in this long (0 = no bound) */
    uint64_t q_bytes;      /* bytes ever queued on the copy engine (FIFO) */
    uint64_t landed_q;     /* q_end of the latest copy seen landed (copies land in order) */
    double bw;             /* measured copy bandwidth, bytes/s (0 until a copy was timed) */
    uint64_t att_tick;     /* uses of attached units so far (res_att.used) */
};

/* Which victims a tier takes (res_evict.c: in_tier); a caller passes how many it allows. */
#define RES_TIERS 4

/* ------------------------------------------------------------------ res_evict.c: accounting */

/* Pages that hold bytes. */
size_t res_pages_of(const res_t *r, size_t bytes);
/* The most m may hold on the device: its gpu_quota, else the pool. */
size_t res_quota_of(const res_t *r, const res_model_t *m);
/* Copies m's byte and count fields into its stats gauges. */
void res_update_gauges(res_model_t *m);
/* Records m's last failure: a RES_ERR_* code (0: none) and its message. */
void res_set_err(res_model_t *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records the device's high-water mark after pages or scratch were taken. */
void res_note_used(res_t *r);

/* ------------------------------------------------------------------ res_evict.c: cached KV */

/* Unmaps and releases a KV cache's memory and counts it gone (live or cached); frees k. */
void res_kv_destroy(res_t *r, res_kv_t *k); /* a device cache (res_kv_free picks) */
/* ------------------------------------------------------------------ res_kvhost.c */
void res_kv_host_destroy(res_t *r, res_kv_t *k); /* unlinks and frees a host copy */
void res_kv_host_touch(res_t *r, res_kv_t *k);   /* used: the last to be dropped */
/* Frees the least recently used cached KV cache (m's only, unless m is NULL), its owner told
 * first; 1 if there was one. */
int res_kv_reclaim(res_t *r, const res_model_t *m);
/* Whether extra bytes more fit m's gpu_quota, after reclaiming m's cached KV and then its idle
 * attached units as needed. */
int res_quota_room(res_t *r, res_model_t *m, size_t extra);

/* ------------------------------------------------------------------ res_evict.c: copies in flight */

/* m's first copy is queued: into the in-flight list at its place in the models list. */
void res_inflight_link(res_t *r, res_model_t *m);
void res_inflight_unlink(res_t *r, res_model_t *m);
/* Moves segment s's finished copy to RESIDENT (or drops a failed one). */
void res_settle_seg(res_t *r, res_model_t *m, uint32_t s);
/* res_settle_seg for each of m's segments, when it has copies in flight. */
void res_settle(res_t *r, res_model_t *m);
/* res_settle for every model with copies in flight. */
void res_settle_all(res_t *r);
/* Blocks until sg's copy has landed or failed; -1 if still in flight after timeout_s. */
int res_copy_sync(res_t *r, res_seg_t *sg, double timeout_s);

/* ------------------------------------------------------------------ res_evict.c: units */

/* Pages of unit u of segment seg as intervals [iv[i][0], iv[i][1]) of page indices from the
 * segment's start, ascending, disjoint, merged where ranges share a page; returns how many. */
int res_unit_pages(const res_t *r, const store_model_t *sm, uint32_t seg, uint32_t u,
                   size_t iv[STORE_UNIT_RANGES][2]);
/* Maps (map 1) or unmaps (map 0) the pages of unit u that it alone holds: held counts move by
 * one on each of its pages, and the pages going from 0 to 1 (map) or 1 to 0 (unmap) are mapped
 * or unmapped, the runs only this unit touches as one mapping. Stops after the first stop pages
 * of the unit (SIZE_MAX: all). *bytes gets what it mapped or unmapped. A failed map leaves every
 * count and mapping as before the call and returns the backend's code. */
int res_unit_walk(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, int map, size_t stop,
                  size_t *bytes);
/* Unmaps what unit u holds alone and counts it gone from m and the pool (no eviction counted);
 * its copies have landed or failed. */
int res_unit_unmap(res_t *r, res_model_t *m, uint32_t seg, uint32_t u);
/* Moves unit u's finished copies to RESIDENT (or drops it when one failed). */
void res_settle_unit(res_t *r, res_model_t *m, uint32_t seg, uint32_t u);
/* Unmaps unit u of segment seg (waiting for its copies); counts an eviction under cause unless
 * cause is negative (a whole page-in dropping the units first). */
int res_unit_drop(res_t *r, res_model_t *m, uint32_t seg, uint32_t u, int cause);
/* Drops every mapped unit of segment s (cause as for res_unit_drop, the eviction counted once). */
int res_units_drop(res_t *r, res_model_t *m, uint32_t s, int cause);
/* Frees segment s's unit state (its units unmapped already). */
void res_units_free(res_t *r, res_seg_t *sg);

/* ------------------------------------------------------------------ res_evict.c: attached units */

/* Unmaps attached unit a's pages and counts them gone from its model and the pool. */
void res_att_unmap(res_t *r, res_att_t *a);
/* Moves a's finished copy to RESIDENT, or unmaps it when the copy failed (the next request pages
 * it in again). Never blocks. */
void res_att_settle(res_t *r, res_att_t *a);
/* Unmaps a (waiting for its copy); an eviction unless its copy failed. */
void res_att_drop(res_t *r, res_att_t *a);
/* Unmaps the least recently used attached unit nobody holds (of model only, unless NULL; with
 * weightless, only of models holding no weights) and counts it evicted; 1 if there was one. */
int res_att_reclaim(res_t *r, const res_model_t *only, int weightless);
/* Unmaps every attached unit of m nobody holds, counted as evictions. */
void res_att_drop_all(res_t *r, res_model_t *m);
/* ------------------------------------------------------------------ res_att.c */
/* Frees m's attached units (res_remove: their owner forgot them). */
void res_att_free_all(res_t *r, res_model_t *m);
/* Pages of m's attached units mapped and not held (victims; as last settled: never blocks). */
size_t res_att_idle_pages(const res_t *r, const res_model_t *m);

/* ------------------------------------------------------------------ res_evict.c: eviction */

/* Unmaps segment s of m (waiting for its copy), counting the eviction under cause. */
int res_evict_seg(res_t *r, res_model_t *m, uint32_t s, res_cause_t cause);
/* Highest-index mapped segment in [lo, hi) (whole or by units), or -1. */
int64_t res_tail_seg(const res_model_t *m, uint32_t lo, uint32_t hi);
/* Whether v's weights may be taken: not running, not pinned, holding some. */
int res_evictable(const res_model_t *v);
/* GreedyDual-Size-Frequency: a use of m raises the value of keeping it. */
void res_touch(res_t *r, res_model_t *m);
/* Evicts other models tail-first (victims from the first tiers only) until need pages are
 * free; ahead: what the page-in that evicts keeps queued. RES_ERR_NOSPACE when none is left. */
int res_make_room_others(res_t *r, const res_model_t *m, size_t need, int tiers, size_t ahead);
/* A map failed for lack of physical memory: lowers the budget and evicts idle models for need
 * pages more; 0 when the caller may retry the map once. */
int res_device_short(res_t *r, const res_model_t *m, size_t need);

#endif

/* simpfx: the simulator's prefix cache for conversations: each session's last finished turn's KV kept in the device pool (the residency's cached KV, reclaimed least recently used before any weights), a host-RAM tier for what the pool reclaims, and the worker's admission rules (adopt, copy, restore or prefill). */
#ifndef SIMPFX_H
#define SIMPFX_H

#include <stddef.h>
#include <stdint.h>

#include "worker/passtime.h"
#include "worker/residency.h"
#include "workload.h"

/*
 * The daemon's prefix cache (worker_pfx.c, prefix.h) matches token blocks;
 * a simulated request has no tokens, only its session: turn k + 1's prompt
 * starts with turn k's prompt and output, so the entry a session's last turn
 * left shares min(its positions, prompt - 1) tokens with the next turn's
 * prompt (0 under PFX_BLOCK). Per model at most max_entries entries (the
 * least recently used dropped, as models.prefix_cache); an entry's KV is a
 * cached KV cache of the residency (res_kv_cache: the pool's first reclaim,
 * before any weights). When the pool reclaims one, a copy goes to the host
 * tier (res_kv_demote, within host_bytes, least recently used dropped) or
 * the entry is forgotten. Admission as the worker's wk_pfx_admit: a device
 * entry is adopted whole (it fits and most of it is reused) or copied into a
 * new cache; a host copy is restored on the copy queue when its copy time
 * (bytes / the measured copy bandwidth) is below the prefill time of the
 * model's measured pass rate, else the prompt is prefilled whole.
 */
typedef struct spfx spfx_t;

typedef struct spfx_stats {
    uint64_t lookups;         /* admissions of requests with a session */
    uint64_t hits;            /* a prefix reused from the device (adopted or copied) */
    uint64_t hit_tokens;      /* tokens of them */
    uint64_t restores;        /* host copies queued back on the copy queue */
    uint64_t restore_tokens;  /* tokens of them */
    uint64_t host_recomputes; /* a host copy there whose restore did not pay: prefilled */
    uint64_t demotions;       /* entries the pool reclaimed, copied to the host tier */
    uint64_t device_drops;    /* entries the pool reclaimed with no room in the host tier */
    uint64_t host_drops;      /* host copies dropped for the budget */
    uint64_t entry_drops;     /* entries over max_entries, or superseded */
} spfx_stats_t;

/* A cache for n_models models (global indices) on residency r; host_bytes 0 = no host tier.
 * NULL when out of memory. */
spfx_t *spfx_new(res_t *r, int n_models, uint32_t max_entries, size_t host_bytes);
/* Frees every entry's KV and p; accepts NULL. Call before the models leave r. */
void spfx_free(spfx_t *p);
const spfx_stats_t *spfx_stats(const spfx_t *p);

/* A KV cache for rq (model rm, n_ctx positions at most, pass times pt): a cached prefix adopted
 * or copied into it (kv->n_past = its tokens), or a restore from the host tier queued (rs gets
 * its events, *n_restore its tokens: the sequence waits for res_kv_restore_poll), or a new one
 * (n_past 0). The prompt's positions mapped. res_kv_new/res_kv_ensure's code on failure (*kv
 * may be set: the caller frees it). */
int spfx_admit(spfx_t *p, res_model_t *rm, const pass_time_t *pt, const wl_req_t *rq,
               uint32_t n_ctx, kv_seq_t **kv, res_restore_t *rs, uint32_t *n_restore, char *err,
               size_t errlen);
/* rq finished with kv (positions [0, n_past) its prompt and output): 1 if the cache keeps it
 * (no longer the caller's), 0 if not (the caller frees it). */
int spfx_keep(spfx_t *p, const wl_req_t *rq, kv_seq_t *kv);

#endif

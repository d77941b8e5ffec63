/* store: the host model store: loads GGUF models and repacks each into segments in (pinned) host RAM, laid out for page-aligned device ranges. */
#ifndef STORE_H
#define STORE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/model.h"

enum {
    STORE_OK = 0,
    STORE_ERR_LOAD = -1,   /* the file cannot be opened or is not a model we run */
    STORE_ERR_BUDGET = -2, /* does not fit the host memory budget */
    STORE_ERR_NOMEM = -3,
    STORE_ERR_EXISTS = -4,
};

/* One segment of a model image: the embedding, one per layer, or the head. */
/* Weight views per layer the store lays out (norms, projections, biases,
 * q/k norms, post-norms; absent ones are empty). A model has
 * 1 + STORE_PER_LAYER * n_layer + 1 views, plus the output head unless tied. */
#define STORE_PER_LAYER 24

/* A segment has two homes: the device range (page-aligned, so it maps and
 * evicts by whole pages) and the host image (packed at the model's host
 * alignment, so a small model holds no device-page padding in host RAM).
 * Tensors sit at the same offsets from either start; a page-in copies
 * host_span bytes, and the device rest of span is never read. */
typedef struct store_seg {
    size_t off;       /* device: bytes from the range start; a multiple of the page size */
    size_t bytes;     /* bytes of tensor data in it */
    size_t span;      /* device: bytes it occupies, bytes rounded up to whole pages */
    size_t host_off;  /* host: bytes from the image start; a multiple of host_align */
    size_t host_span; /* host: bytes it occupies (what a page-in copies), <= span */
} store_seg_t;

/* Paging units below a segment (mixture of experts): in a MoE layer, each routed expert (the
 * slices of the stacked gate, up and down tensors that model_expert_view takes: three byte
 * ranges) and the layer's other tensors (attention, norms, router, shared expert: the range
 * before the stacked ones). A unit's ranges sit at the same offsets from the segment's start in
 * the host image and the device range; together a segment's units cover all its bytes, and two
 * may share the page where one's bytes end and the next's begin. The residency manager maps,
 * copies and evicts them one by one (res_unit_map); paging moves whole segments by default. */
#define STORE_UNIT_RANGES 3
#define STORE_UNIT_REST 0u              /* a MoE layer's tensors other than the routed experts */
#define STORE_UNIT_EXPERT(e) (1u + (e)) /* routed expert e (0 <= e < n_expert) */

typedef struct store_range {
    size_t off;   /* bytes from the segment's start (host and device alike) */
    size_t bytes; /* tensor bytes (the copy) */
} store_range_t;

typedef struct store_unit {
    uint32_t n_ranges;                  /* 1..STORE_UNIT_RANGES, ascending and disjoint */
    store_range_t r[STORE_UNIT_RANGES]; /* n_ranges of them */
    size_t bytes;                       /* their sum */
} store_unit_t;

typedef struct store_model {
    char *name;           /* owned */
    char *path;           /* owned */
    model_t *model;       /* owned: hyperparameters, tokenizer, file mapping */
    uint8_t *image;       /* host copy of all segments, host_alloc'ed (pinned if wanted) */
    size_t image_bytes;   /* device layout: sum of spans (the range it reserves, all resident) */
    size_t host_bytes;    /* host image: sum of host_spans (what it holds in host RAM) */
    size_t host_align;    /* bytes: host segment alignment, the page size or, where
                             that padding would take over 1/64 of the weights, less
                             (down to 4 KiB) */
    uint32_t n_segs;      /* n_layer + 2: FWD_SEG_EMBED, layers, FWD_SEG_HEAD */
    store_seg_t *segs;    /* n_segs */
    model_weights_t host; /* weights pointing into image */
    size_t n_w;           /* weight views (store.c's list order) */
    size_t *woff; /* n_w offsets from their segment's start, one per view (0 for absent ones) */
    uint32_t n_expert;   /* routed experts per MoE layer (hp.n_expert); 0: a dense model */
    store_unit_t *units; /* n_layer x (n_expert + 1), layer-major (STORE_UNIT_REST, then
                            STORE_UNIT_EXPERT(e)); NULL for a dense model */
    double load_ms;      /* wall time of the load */
} store_model_t;

typedef struct store store_t;

/* be is borrowed (its host_alloc backs the images); budget 0 = unlimited. */
store_t *store_new(const backend_t *be, size_t host_budget);
void store_free(store_t *s); /* unloads every model; accepts NULL */
/* A new budget (host.memory on reload): loads from now on must fit it; the
 * models loaded stay, also when they hold more than it. */
void store_set_budget(store_t *s, size_t host_budget);
/* Bytes of the budget held outside the store (cached KV in host RAM): loads fit beside them. */
void store_set_shared(store_t *s, size_t bytes);

/* (optional) called while a large model is copied into its image, about
 * every tenth of it: the daemon logs loading progress with it. */
typedef void (*store_progress_fn)(void *ctx, const char *name, size_t done, size_t total);
void store_set_progress(store_t *s, store_progress_fn fn, void *ctx);

/* Load and repack one model. Refused (STORE_ERR_BUDGET) when it does not
 * fit what is left of the budget; the store is unchanged then. */
int store_load(store_t *s, const char *name, const char *path, store_model_t **out, char *err,
               size_t errlen);
void store_unload(store_t *s, store_model_t *m);
size_t store_used(const store_t *s); /* host bytes of loaded models */
/* Loads copy at most bytes_per_s into host RAM (0: unthrottled), reporting
 * progress after every chunk: the sim backend's slow load, to watch a model
 * in its `loading` state. */
void store_set_load_rate(store_t *s, double bytes_per_s);

/* Places segments whose bytes are set: their off, span, host_off and
 * host_span, and the model's image_bytes, host_bytes and host_align. Device
 * ranges align segments to page; the host image to host_align, the page
 * halved (down to 4 KiB) while the padding would exceed 1/64 of the tensor
 * bytes. store_load uses it; so does the trace simulator for the models it
 * builds from shapes. */
void store_layout_segments(store_model_t *m, size_t page);

/* Units of segment seg (n_expert + 1 for a MoE layer's, see store_unit_t); 0 for the embedding,
 * the head, a dense layer's: those page in whole only. */
uint32_t store_seg_units(const store_model_t *m, uint32_t seg);
/* Unit u (< store_seg_units) of segment seg. */
const store_unit_t *store_seg_unit(const store_model_t *m, uint32_t seg, uint32_t u);

/* Which layout a copy of the segments has: the host image's (host_off) or
 * a device range's (off). */
typedef enum store_at {
    STORE_AT_HOST = 0,
    STORE_AT_DEVICE,
} store_at_t;

/* Fill w (layers: caller's array of n_layer) with the model's weights as
 * they sit at base, a copy of the segments in layout at (the image itself,
 * or a device range). */
int store_weights_at(const store_model_t *m, const void *base, store_at_t at, model_weights_t *w,
                     model_layer_t *layers);

#endif

/* store: the host model store: loads GGUF models and repacks each into segments in (pinned) host RAM, laid out for page-aligned device ranges. */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/forward.h"
#include "base/util.h"

/* Tensors inside a segment start on this boundary (kernels like aligned rows). */
#define STORE_TENSOR_ALIGN 256

/* Host segment alignment: at most the device page, halved while the page
 * padding of the host image would exceed 1/STORE_HOST_WASTE of its tensor
 * bytes, down to STORE_HOST_ALIGN_MIN (a host page). A large model keeps
 * the device layout in host RAM too (a page-in copies whole pages, as
 * before); a small one is packed (a 1.2 MB model took 14 MiB at 2 MiB pages). */
#define STORE_HOST_WASTE 64
#define STORE_HOST_ALIGN_MIN (4u << 10)

/* Models smaller than this load without progress reports. */
#define STORE_PROGRESS_MIN (256u << 20)
/* Bytes copied between two waits of a throttled load. */
#define STORE_THROTTLE_CHUNK (64u << 10)

struct store {
    const backend_t *be;
    size_t budget; /* bytes, 0 = unlimited */
    size_t shared; /* bytes of the budget others hold (cached KV in host RAM) */
    size_t used;
    double load_rate; /* bytes/s a load copies at (store_set_load_rate); 0 = as fast as it can */
    store_progress_fn progress;
    void *progress_ctx;
};

void store_set_load_rate(store_t *s, double bytes_per_s)
{
    s->load_rate = bytes_per_s > 0 ? bytes_per_s : 0;
}

void store_set_progress(store_t *s, store_progress_fn fn, void *ctx)
{
    s->progress = fn;
    s->progress_ctx = ctx;
}

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

void store_set_budget(store_t *s, size_t host_budget)
{
    s->budget = host_budget;
}

void store_set_shared(store_t *s, size_t bytes)
{
    s->shared = bytes;
}

store_t *store_new(const backend_t *be, size_t host_budget)
{
    store_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->be = be;
    s->budget = host_budget;
    return s;
}

void store_free(store_t *s)
{
    free(s);
}

size_t store_used(const store_t *s)
{
    return s->used;
}

/* Every weight view of a model with the segment it belongs to; tied output
 * is left out (it aliases the embedding). Returns the count
 * (store_weight_count). */
static size_t list_weights(model_weights_t *w, uint32_t n_layer, model_weight_t **v, uint32_t *seg)
{
    size_t n = 0;
    v[n] = &w->tok_embd;
    seg[n++] = FWD_SEG_EMBED;
    for (uint32_t l = 0; l < n_layer; l++) {
        model_layer_t *L = &w->layers[l];
        model_weight_t *lw[STORE_PER_LAYER] = {
            &L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->wo, &L->ffn_norm,
            &L->w_gate, &L->w_up, &L->w_down, &L->q_norm, &L->k_norm, &L->post_attn_norm,
            &L->post_ffn_norm,
            /* mixture of experts: the router and shared expert with the rest, then the stacked
             * experts last, so the rest is one range before them (store_seg_units) */
            &L->gate_inp, &L->gate_inp_shexp, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
            &L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < STORE_PER_LAYER; i++) {
            v[n] = lw[i];
            seg[n++] = FWD_SEG_LAYER(l);
        }
    }
    v[n] = &w->output_norm;
    seg[n++] = FWD_SEG_HEAD(n_layer);
    if (!w->tied) {
        v[n] = &w->output;
        seg[n++] = FWD_SEG_HEAD(n_layer);
    }
    return n;
}

/* Where the stacked expert views sit in a layer's list (the last three of it). */
#define STORE_EXPS_AT (STORE_PER_LAYER - 3)

/* The units of each MoE layer (store_unit_t) from the laid-out views: the rest is the range
 * before the stacked experts, expert e the e-th slice of each. 0, or STORE_ERR_NOMEM. */
static int layout_units(store_model_t *m, model_weight_t *const *v, const size_t *off)
{
    const model_hparams_t *hp = &m->model->hp;
    const uint32_t E = hp->n_expert;
    if (E == 0)
        return STORE_OK;
    m->units = calloc((size_t)hp->n_layer * (E + 1), sizeof *m->units);
    if (!m->units)
        return STORE_ERR_NOMEM;
    m->n_expert = E;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        size_t at = 1 + (size_t)l * STORE_PER_LAYER + STORE_EXPS_AT;
        store_unit_t *u = &m->units[(size_t)l * (E + 1)];
        if (!v[at]->data) /* a dense layer among MoE ones: paged whole */
            continue;
        u[STORE_UNIT_REST] = (store_unit_t){1, {{0, off[at]}}, off[at]};
        for (uint32_t e = 0; e < E; e++) {
            store_unit_t *x = &u[STORE_UNIT_EXPERT(e)];
            for (int k = 0; k < STORE_UNIT_RANGES; k++) {
                size_t slice = v[at + k]->nbytes / E; /* model_expert_view's slice */
                x->r[k] = (store_range_t){off[at + k] + e * slice, slice};
                x->bytes += slice;
            }
            x->n_ranges = STORE_UNIT_RANGES;
        }
    }
    return STORE_OK;
}

uint32_t store_seg_units(const store_model_t *m, uint32_t seg)
{
    if (!m->units || seg == FWD_SEG_EMBED || seg >= m->n_segs - 1)
        return 0;
    const store_unit_t *rest = &m->units[(size_t)(seg - 1) * (m->n_expert + 1)];
    return rest->n_ranges ? m->n_expert + 1 : 0;
}

const store_unit_t *store_seg_unit(const store_model_t *m, uint32_t seg, uint32_t u)
{
    return &m->units[(size_t)(seg - 1) * (m->n_expert + 1) + u];
}

/* Lays the tensors out: each segment's tensor bytes, and offsets from its
 * start written into off[]. */
static void layout_tensors(store_model_t *m, model_weight_t **v, const uint32_t *seg, size_t nw,
                           size_t *off)
{
    for (uint32_t s = 0; s < m->n_segs; s++) {
        size_t cur = 0;
        for (size_t i = 0; i < nw; i++) {
            if (seg[i] != s || !v[i]->data)
                continue;
            cur = round_up(cur, STORE_TENSOR_ALIGN);
            off[i] = cur;
            cur += v[i]->nbytes;
        }
        m->segs[s].bytes = cur;
    }
}

/* Bytes the segments take when each is rounded up to align. */
static size_t spans_at(const store_model_t *m, size_t align)
{
    size_t n = 0;
    for (uint32_t s = 0; s < m->n_segs; s++)
        n += round_up(m->segs[s].bytes ? m->segs[s].bytes : 1, align);
    return n;
}

void store_layout_segments(store_model_t *m, size_t page)
{
    size_t tensors = 0;
    for (uint32_t s = 0; s < m->n_segs; s++)
        tensors += m->segs[s].bytes;
    size_t align = page;
    while (align > STORE_HOST_ALIGN_MIN && align % 2 == 0 &&
           spans_at(m, align) - tensors > tensors / STORE_HOST_WASTE)
        align /= 2;
    m->host_align = align;
    size_t pos = 0, hpos = 0;
    for (uint32_t s = 0; s < m->n_segs; s++) {
        store_seg_t *sg = &m->segs[s];
        size_t b = sg->bytes ? sg->bytes : 1;
        sg->off = pos;
        sg->span = round_up(b, page);
        pos += sg->span;
        sg->host_off = hpos;
        sg->host_span = round_up(b, align);
        hpos += sg->host_span;
    }
    m->image_bytes = pos;
    m->host_bytes = hpos;
}

static void free_model(const store_t *s, store_model_t *m)
{
    if (!m)
        return;
    if (m->image)
        s->be->host_free(s->be->ctx, m->image, m->host_bytes);
    free(m->host.layers);
    free(m->segs);
    free(m->woff);
    free(m->units);
    model_close(m->model);
    free(m->name);
    free(m->path);
    free(m);
}

int store_load(store_t *s, const char *name, const char *path, store_model_t **out, char *err,
               size_t errlen)
{
    double t0 = util_now_ms();
    int rc = STORE_ERR_NOMEM;
    model_weight_t **v = NULL;
    uint32_t *seg = NULL;
    size_t *off = NULL;
    store_model_t *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->name = strdup(name);
    m->path = strdup(path);
    if (!m->name || !m->path)
        goto oom;
    char merr[512];
    m->model = model_open(path, merr, sizeof merr);
    if (!m->model) {
        snprintf(err, errlen, "model '%s': %s", name, merr);
        rc = STORE_ERR_LOAD;
        goto fail;
    }
    const model_hparams_t *hp = &m->model->hp;
    if (model_feats_check(hp, s->be->model_feats, s->be->name, merr, sizeof merr)) {
        snprintf(err, errlen, "model '%s' (%s): %s", name, path, merr);
        rc = STORE_ERR_LOAD;
        goto fail;
    }
    m->n_segs = hp->n_layer + 2;
    m->segs = calloc(m->n_segs, sizeof *m->segs);
    m->host.layers = calloc(hp->n_layer, sizeof *m->host.layers);
    size_t maxw = 4 + (size_t)hp->n_layer * STORE_PER_LAYER;
    v = calloc(maxw, sizeof *v);
    seg = calloc(maxw, sizeof *seg);
    off = calloc(maxw, sizeof *off);
    if (!m->segs || !m->host.layers || !v || !seg || !off)
        goto oom;
    /* views of the file's weights, then the same views rebased on the image */
    model_weights_t file = m->model->w;
    size_t nw = list_weights(&file, hp->n_layer, v, seg);
    layout_tensors(m, v, seg, nw, off);
    store_layout_segments(m, s->be->page_size);
    if (layout_units(m, v, off))
        goto oom;
    size_t taken = s->used + s->shared, left = s->budget > taken ? s->budget - taken : 0;
    if (s->budget && m->host_bytes > left) {
        snprintf(err, errlen,
                 "model '%s' (%s): needs %.1f MiB of host memory, %.1f MiB of the %.1f MiB "
                 "host budget are left",
                 name, path, m->host_bytes / 1048576.0, left / 1048576.0, s->budget / 1048576.0);
        rc = STORE_ERR_BUDGET;
        goto fail;
    }
    m->image = s->be->host_alloc(s->be->ctx, m->host_bytes);
    if (!m->image) {
        snprintf(err, errlen, "model '%s': cannot allocate %.1f MiB of %shost memory", name,
                 m->host_bytes / 1048576.0, s->be->needs_pinned ? "pinned " : "");
        rc = STORE_ERR_NOMEM;
        goto fail;
    }
    /* zero the padding so the image (and what every page-in copies) is deterministic */
    memset(m->image, 0, m->host_bytes);
    size_t copied = 0, next_report = m->host_bytes / 10;
    double t_copy = util_now_s();
    for (size_t i = 0; i < nw; i++) {
        if (!v[i]->data)
            continue;
        for (size_t done = 0; done < v[i]->nbytes;) {
            /* throttled: chunks, each no sooner than the rate allows, each reported */
            size_t n = v[i]->nbytes - done;
            if (s->load_rate > 0 && n > STORE_THROTTLE_CHUNK)
                n = STORE_THROTTLE_CHUNK;
            memcpy(m->image + m->segs[seg[i]].host_off + off[i] + done,
                   (const char *)v[i]->data + done, n);
            done += n;
            copied += n;
            if (s->load_rate > 0) {
                double wait = t_copy + (double)copied / s->load_rate - util_now_s();
                if (wait > 0)
                    nanosleep(&(struct timespec){(time_t)wait,
                                                 (long)((wait - (double)(time_t)wait) * 1e9)},
                              NULL);
                if (s->progress)
                    s->progress(s->progress_ctx, name, copied, m->host_bytes);
            } else if (s->progress && m->host_bytes >= STORE_PROGRESS_MIN &&
                       copied >= next_report) {
                s->progress(s->progress_ctx, name, copied, m->host_bytes);
                next_report += m->host_bytes / 10;
            }
        }
    }
    m->woff = off;
    m->n_w = nw;
    off = NULL;
    if (store_weights_at(m, m->image, STORE_AT_HOST, &m->host, m->host.layers))
        goto oom;
    s->used += m->host_bytes;
    m->load_ms = util_now_ms() - t0;
    free(v);
    free(seg);
    *out = m;
    return STORE_OK;
oom:
    snprintf(err, errlen, "model '%s': out of memory", name);
    rc = STORE_ERR_NOMEM;
fail:
    free(v);
    free(seg);
    free(off);
    free_model(s, m);
    return rc;
}

void store_unload(store_t *s, store_model_t *m)
{
    if (!m)
        return;
    s->used -= m->host_bytes;
    free_model(s, m);
}

int store_weights_at(const store_model_t *m, const void *base, store_at_t at, model_weights_t *w,
                     model_layer_t *layers)
{
    const model_hparams_t *hp = &m->model->hp;
    model_weight_t **v = malloc(m->n_w * sizeof *v);
    uint32_t *seg = malloc(m->n_w * sizeof *seg);
    if (!v || !seg) {
        free(v);
        free(seg);
        return STORE_ERR_NOMEM;
    }
    *w = m->model->w;
    memcpy(layers, m->model->w.layers, hp->n_layer * sizeof *layers);
    w->layers = layers;
    size_t nw = list_weights(w, hp->n_layer, v, seg);
    for (size_t i = 0; i < nw; i++) {
        if (!v[i]->data)
            continue;
        const store_seg_t *sg = &m->segs[seg[i]];
        v[i]->data =
            (const uint8_t *)base + (at == STORE_AT_HOST ? sg->host_off : sg->off) + m->woff[i];
    }
    if (w->tied)
        w->output = w->tok_embd;
    free(v);
    free(seg);
    return STORE_OK;
}

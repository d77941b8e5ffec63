/* sim: runs the real scheduler and residency manager on the virtual device under a cost model, for one policy over one trace, and Belady's bound. */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "worker/passtime.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "simpfx.h"
#include "vbackend.h"

/* Policies:
 * - default: the daemon's worker loop (worker.c, worker_step.c) on the
 *   virtual device: arrivals are submitted as submit_gen does (a prompt plus
 *   max_tokens past the context fails, as the daemon's context_overflow),
 *   then each round follows the page-ins under way (res_ready_in, more
 *   segments with res_prefetch_ahead), builds the per-model views (loading,
 *   last step, wanted), calls sched_next (swap-aware), runs one step of the
 *   chosen model (res_acquire, admissions with whole KV caches, the pass
 *   through the segment hooks, the page-ins under way topped up before each
 *   segment, res_release) or, when it is not resident,
 *   starts its page-in in the background, and then prefetches the suggested
 *   model (evicting only idle models nobody waits for).
 * - fifo: the same loop with SCHED_POLICY_FIFO.
 * - lru (Ollama / llama.cpp router style): one global queue in arrival
 *   order, head of line blocking. The head request joins its model's batch
 *   at once if the model is wholly resident and has batch room; if the model
 *   is not resident the dispatcher evicts whole idle models, least recently
 *   used first, until the model fits, loads it whole and waits until the load
 *   has landed before it dispatches anything else (no pipelining, no
 *   batching of requests that wait behind it). Models with work run their
 *   steps round robin (separate runners sharing the GPU) while another loads.
 * - lru-batch (a fair baseline: Ollama with parallel slots, llama-swap's
 *   by-model collation): every request joins its model's queue at arrival
 *   (no head of line across models). A model not loaded is loaded whole on
 *   demand, one load at a time, the cold model whose oldest request is
 *   oldest first; at most lru_batch_n models hold weights, so the least
 *   recently used idle one (nothing running or queued) is evicted first,
 *   and more while the pages are short. Loaded models with work step round
 *   robin, each step admitting every queued request of the model up to
 *   max_batch; a load overlaps the others' steps.
 * - belady: no run; the fewest whole-model loads that can serve the arrival
 *   order with room for k models (Belady's furthest-next-use eviction).
 * - lora-slots (LoRA adapters, cfg.lora_n; vLLM's max_loras): the default's
 *   loop with lru_batch_n adapter slots beside model 0 instead of a device
 *   copy of every adapter; a step admits the queued requests whose adapters
 *   hold or can take a slot (an empty one, else the least recently used one
 *   with no running sequence), in queue order, and copies the adapters that
 *   took one over host-to-device before its pass (admit_next, slot_take).
 * Every policy with cfg.lora_n: an adapter's requests are model 0's, and a
 * pass adds each distinct adapter's bytes and its tokens' FLOPs
 * (lora_pass_s). */

static const char *const pol_names[SIM_POL_COUNT] = {"default",   "fifo",   "lru",
                                                     "lru-batch", "belady", "lora-slots"};

const char *sim_policy_name(sim_policy_t p)
{
    return p < SIM_POL_COUNT ? pol_names[p] : "?";
}

int sim_policy_parse(const char *s, sim_policy_t *p)
{
    for (int i = 0; i < SIM_POL_COUNT; i++)
        if (strcmp(s, pol_names[i]) == 0) {
            *p = (sim_policy_t)i;
            return SIM_OK;
        }
    return SIM_ERR_ARG;
}

/* ------------------------------------------------------------------ cost model */

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

typedef struct shape_info {
    uint32_t n_layer;
    double layer_params, layer_bytes; /* one transformer layer: all of it (what pages in) */
    double act_params;                /* a token's share of layer_params (MoE: k experts) */
    double n_expert, n_expert_used;   /* 0: dense */
    double expert_bytes;              /* one expert's three matrices */
    double embed_bytes;               /* token embedding table */
    double head_store_bytes;          /* what the head segment holds */
    double head_params, head_read;    /* output matmul: params, bytes read */
    double kv_pos_layer;              /* K+V bytes per position per layer (F32) */
} shape_info_t;

static shape_info_t shape_info(const sim_shape_t *sh)
{
    shape_info_t s;
    s.n_layer = sh->n_layer;
    double d = sh->n_embd, hd = sh->head_dim ? sh->head_dim : (double)sh->n_embd / sh->n_head,
           kvd = sh->n_head_kv * hd;
    s.layer_params =
        d * (sh->n_head * hd) + 2 * d * kvd + (sh->n_head * hd) * d + 3.0 * d * sh->n_ff;
    s.act_params = s.layer_params;
    s.n_expert = sh->n_expert;
    s.n_expert_used = sh->n_expert_used;
    s.expert_bytes = 3.0 * d * sh->n_ff_exp * sh->wbytes;
    if (sh->n_expert) { /* the router, every expert; a token computes k of them */
        double router = d * sh->n_expert, expert = 3.0 * d * sh->n_ff_exp;
        s.act_params = s.layer_params + router + sh->n_expert_used * expert;
        s.layer_params += router + sh->n_expert * expert;
    }
    s.layer_bytes = s.layer_params * sh->wbytes + 2 * d * 4;
    s.embed_bytes = (double)sh->n_vocab * d * sh->wbytes;
    s.head_params = (double)sh->n_vocab * d;
    s.head_read = s.head_params * sh->wbytes + d * 4;
    s.head_store_bytes = d * 4 + (sh->tied ? 0 : s.head_params * sh->wbytes);
    s.kv_pos_layer = 2 * kvd * 4;
    return s;
}

const sim_shape_t *sim_cfg_shape(const sim_cfg_t *c, int i)
{
    return c->shapes && c->n_shapes > 0 ? &c->shapes[i % c->n_shapes] : &c->shape;
}

size_t sim_model_bytes(const sim_shape_t *sh, size_t page)
{
    shape_info_t s = shape_info(sh);
    return round_up((size_t)s.embed_bytes, page) +
           sh->n_layer * round_up((size_t)s.layer_bytes, page) +
           round_up((size_t)s.head_store_bytes, page);
}

size_t sim_pool_bytes(const sim_shape_t *sh, size_t page, double n_models, size_t kv_headroom)
{
    double b = (double)sim_model_bytes(sh, page) * n_models + (double)kv_headroom;
    return (size_t)(b / page) * page;
}

/* Bytes a step of t tokens reads of one layer: all of it, or (MoE) all but the experts its
 * tokens did not select: n (1 - (1 - k/n)^t) of them selected on average. */
static double layer_read(const shape_info_t *s, double t)
{
    if (s->n_expert <= 0)
        return s->layer_bytes;
    double sel = s->n_expert * (1.0 - pow(1.0 - s->n_expert_used / s->n_expert, t > 1 ? t : 1));
    return s->layer_bytes - (s->n_expert - sel) * s->expert_bytes;
}

/* One layer's share of a step of t tokens reading kv_pos positions (of this layer). */
static double layer_time(const sim_cfg_t *c, const shape_info_t *s, double t, double kv_pos)
{
    const sim_cost_t *k = &c->cost;
    double dt = (k->t_step_s + k->t_token_s * t) / s->n_layer;
    if (k->hbm_bw > 0)
        dt += (layer_read(s, t) + kv_pos * s->kv_pos_layer) / k->hbm_bw;
    if (k->flops > 0)
        dt += 2 * s->act_params * t / k->flops;
    return dt;
}

void sim_shape_params(const sim_shape_t *sh, double *total, double *active)
{
    shape_info_t s = shape_info(sh);
    double outer = (double)sh->n_vocab * sh->n_embd + (sh->tied ? 0 : s.head_params);
    *total = s.n_layer * s.layer_params + outer;
    *active = s.n_layer * s.act_params + outer;
}

double sim_lora_params(const sim_shape_t *sh, uint32_t rank, unsigned targets)
{
    double d = sh->n_embd, hd = sh->head_dim ? sh->head_dim : (double)sh->n_embd / sh->n_head;
    double q = sh->n_head * hd, kv = sh->n_head_kv * hd, per = 0;
    per += targets & SIM_LORA_Q ? d + q : 0; /* A: n_in x r, B: r x n_out */
    per += targets & SIM_LORA_K ? d + kv : 0;
    per += targets & SIM_LORA_V ? d + kv : 0;
    per += targets & SIM_LORA_O ? q + d : 0;
    per += targets & SIM_LORA_GATE ? d + sh->n_ff : 0;
    per += targets & SIM_LORA_UP ? d + sh->n_ff : 0;
    per += targets & SIM_LORA_DOWN ? sh->n_ff + d : 0;
    return (double)sh->n_layer * rank * per;
}

double sim_step_read(const sim_shape_t *sh, double t)
{
    shape_info_t s = shape_info(sh);
    return s.n_layer * layer_read(&s, t) + s.head_read;
}

static double head_time(const sim_cfg_t *c, const shape_info_t *s, double n_seqs)
{
    const sim_cost_t *k = &c->cost;
    return (k->hbm_bw > 0 ? s->head_read / k->hbm_bw : 0) +
           (k->flops > 0 ? 2 * s->head_params * n_seqs / k->flops : 0);
}

double sim_step_time(const sim_cfg_t *c, double t, double s, double kv_pos)
{
    shape_info_t si = shape_info(&c->shape);
    return c->cost.t_fixed_s + c->shape.n_layer * layer_time(c, &si, t, kv_pos) +
           head_time(c, &si, s);
}

double sim_capacity(const sim_cfg_t *c, double p, double o)
{
    double b = c->max_batch;
    double t = sim_step_time(c, b * p, b, b * p);
    if (o > 1)
        t += (o - 1) * sim_step_time(c, b, b, b * (p + o / 2));
    return b / t;
}

/* ------------------------------------------------------------------ GGUF models */

struct sim_models {
    backend_t host; /* the store's backend: page size and host memory only */
    store_t *store;
    int n;
    store_model_t **sm; /* n, loaded by the store (freed by sim_models_free) */
};

static void *host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    return posix_memalign(&p, 4096, bytes ? bytes : 1) ? NULL : p;
}

static void host_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

void sim_models_free(sim_models_t *ms)
{
    if (!ms)
        return;
    for (int i = 0; i < ms->n; i++)
        store_unload(ms->store, ms->sm[i]);
    store_free(ms->store);
    free(ms->sm);
    free(ms);
}

sim_models_t *sim_models_load(const char *const *paths, int n, size_t page_size, char *err,
                              size_t errlen)
{
    if (n < 1 || page_size == 0) {
        snprintf(err, errlen, "no model files, or no page size");
        return NULL;
    }
    sim_models_t *ms = calloc(1, sizeof *ms);
    if (!ms)
        goto oom;
    /* lays out any model the engine reads (nothing here computes) */
    ms->host = (backend_t){.name = "host",
                           .page_size = page_size,
                           .host_alloc = host_alloc,
                           .host_free = host_free,
                           .model_feats = MODEL_FEAT_ALL | MODEL_FEAT_MOE};
    ms->store = store_new(&ms->host, 0);
    ms->sm = calloc((size_t)n, sizeof *ms->sm);
    if (!ms->store || !ms->sm)
        goto oom;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "file%d", i);
        if (store_load(ms->store, name, paths[i], &ms->sm[i], err, errlen) != STORE_OK)
            goto fail;
        ms->n++;
    }
    return ms;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    sim_models_free(ms);
    return NULL;
}

int sim_models_count(const sim_models_t *ms)
{
    return ms->n;
}
size_t sim_models_page_size(const sim_models_t *ms)
{
    return ms->host.page_size;
}
size_t sim_models_image_bytes(const sim_models_t *ms, int i)
{
    return ms->sm[i]->image_bytes;
}
uint32_t sim_models_segs(const sim_models_t *ms, int i)
{
    return ms->sm[i]->n_segs;
}

void sim_models_shape(const sim_models_t *ms, int i, sim_shape_t *out)
{
    const model_t *mod = ms->sm[i]->model;
    const model_hparams_t *hp = &mod->hp;
    double wb;
    switch (mod->wtype) {
    case GGUF_T_F32: wb = 4; break;
    case GGUF_T_Q8_0: wb = 34.0 / 32; break;
    default: wb = 2; break; /* F16, BF16 */
    }
    *out = (sim_shape_t){.n_layer = hp->n_layer,
                         .n_embd = hp->n_embd,
                         .n_ff = hp->n_expert ? hp->n_ff_shexp : hp->n_ff, /* MoE: shared */
                         .n_head = hp->n_head,
                         .n_head_kv = hp->n_head_kv,
                         .n_vocab = hp->n_vocab,
                         .wbytes = wb,
                         .tied = mod->w.tied,
                         .n_expert = hp->n_expert,
                         .n_expert_used = hp->n_expert_used,
                         .n_ff_exp = hp->n_ff_exp,
                         /* only where it is not n_embd / n_head (the dense formula's) */
                         .head_dim = hp->head_dim * hp->n_head != hp->n_embd ? hp->head_dim : 0};
}

/* ------------------------------------------------------------------ Belady */

uint64_t sim_belady(const int *seq, size_t n, int n_models, uint32_t k)
{
    if (n == 0 || k == 0)
        return n;
    size_t *nxt = malloc(n * sizeof *nxt), *last = malloc((size_t)n_models * sizeof *last);
    int *cache = malloc(k * sizeof *cache);
    uint8_t *in = calloc((size_t)n_models, 1);
    size_t *next_use = malloc((size_t)n_models * sizeof *next_use);
    uint64_t loads = 0;
    if (!nxt || !last || !cache || !in || !next_use) {
        loads = UINT64_MAX;
        goto done;
    }
    for (int m = 0; m < n_models; m++)
        last[m] = SIZE_MAX;
    for (size_t i = n; i-- > 0;) {
        nxt[i] = last[seq[i]];
        last[seq[i]] = i;
    }
    uint32_t used = 0;
    for (size_t i = 0; i < n; i++) {
        int m = seq[i];
        next_use[m] = nxt[i];
        if (in[m])
            continue;
        loads++;
        if (used < k) {
            cache[used++] = m;
        } else {
            uint32_t vi = 0;
            for (uint32_t j = 1; j < k; j++)
                if (next_use[cache[j]] > next_use[cache[vi]])
                    vi = j;
            in[cache[vi]] = 0;
            cache[vi] = m;
        }
        in[m] = 1;
    }
done:
    free(nxt);
    free(last);
    free(cache);
    free(in);
    free(next_use);
    return loads;
}

/* ------------------------------------------------------------------ state */

typedef enum seq_state {
    SEQ_WAITING = 0,
    SEQ_ACTIVE,
    SEQ_DONE,
    SEQ_FAILED
} seq_state_t;

typedef struct sim_seq {
    sched_item_t item; /* item.user points back here */
    const wl_req_t *rq;
    seq_state_t state;
    kv_seq_t *kv;
    uint32_t n_gen;
    int parked;             /* its cache was given back when the pool ran short (the worker's
                               seq_park): the next pass that gets the pages recomputes it */
    int swapped;            /* its first step paged weights in (the worker's "swapped") */
    int refused;            /* refused for its deadline (cfg.deadline_s) */
    int in_pass;            /* it runs in the pass under way */
    res_restore_t rev;      /* a restore of its prefix from the host tier under way */
    uint32_t n_restore;     /* its tokens (0: none) */
    double t_first, t_done; /* virtual s */
    struct sim *host;       /* the host it was routed to */
    struct sim_seq *next;   /* active list or lru pending list */
} sim_seq_t;

typedef struct vmodel {
    store_model_t *sm; /* &own, or a GGUF-built one of cfg.models (borrowed) */
    store_model_t own; /* built in memory from the shape: segment layout only */
    model_t mod;       /* own's hyperparameters; no tensors */
    size_t *woff;
    char name[32];
    shape_info_t si;   /* cost-model shape */
    uint32_t ctx;      /* positions a sequence may use (the worker's ctx) */
    size_t span_bytes; /* its segments' spans, all of them */
    res_model_t *rm;
    sim_seq_t *active;
    uint32_t n_active;
    double swap_in_s;    /* as the worker measures it */
    double paging_since; /* virtual s its background page-in started (0 = none) */
    int paging_evict;    /* RES_EVICT_* of that page-in */
    int paging_queued;   /* its last poll found every copy it needs queued, landing before the
                            next round (sched view.queued) */
    pass_time_t pt;      /* its passes' compute (the worker's estimate) */
    double last_step;    /* when its last pass ended */
    sched_gap_t gap;     /* its admission gap (deadlines) */
    /* lru policy */
    sim_seq_t *pend_head, *pend_tail;
    uint32_t n_pend;
    int loading;
    double last_use;
    size_t quota; /* its gpu_quota, below its size (0 = none) */
} vmodel_t;

typedef struct sim {
    const sim_cfg_t *c;
    sim_policy_t pol;
    vb_t *vb;
    backend_t *be;
    res_t *res;
    sched_t *sched;
    vmodel_t **m; /* n_m models it serves, local index order; owned */
    int n_m, cap_m;
    int n_paging; /* models with paging_since > 0 (paging_mark): a host of many models walks
                     them for page-ins only while there are any */
    int *local;   /* c->n_models: the local index of a model, -1 = not served */
    sched_model_view_t *views; /* cap_m */
    sim_seq_t *seqs;           /* every request of the run (borrowed; lru uses the order) */
    size_t in_flight;          /* queued + pending + active */
    uint32_t n_active;         /* sequences active over all its models */
    double wake;               /* virtual s of its next round (when in_flight > 0) */
    int firm;                  /* an arrival before wake does not bring the round forward */
    size_t gq_head, gq_n;      /* lru: global queue = seqs[gq_head..gq_n) in order */
    int rr;                    /* lru round-robin cursor */
    int *uses;                 /* models stepped, consecutive repeats folded */
    size_t n_uses, cap_uses;
    double busy_s;
    uint64_t loads, steps;
    size_t failed;
    size_t refused;      /* for their deadlines */
    int inconsistent;    /* a model's active count disagreed with its list */
    uint64_t recomputes; /* sequences parked (cache given back), recomputed later */
    spfx_t *pfx;         /* conversations' prefix cache (c->prefix_cache), else NULL */
    uint64_t prompt_tokens, prefill_tokens;
    /* LoRA (c->lora_n), per adapter 1..lora_n */
    uint64_t *lora_stamp; /* the pass that counted it last (lora_pass_s) */
    uint64_t lora_pass;
    /* lora-slots: lru_batch_n slots */
    uint32_t *lora_run;  /* per adapter: its sequences admitted and not ended */
    int *lora_slot;      /* per adapter: its slot, -1 = none */
    uint32_t *slot_ad;   /* per slot: its adapter, 0 = empty */
    double *slot_used;   /* per slot: when its adapter last ran */
    uint64_t lora_loads; /* adapters copied into a slot */
} sim_t;

static double now(const sim_t *S)
{
    return vb_now(S->vb);
}

static int all_mapped(sim_t *S, vmodel_t *m)
{
    vb_quiet(S->vb, 1);
    int ok = 1;
    for (uint32_t s = 0; s < m->sm->n_segs && ok; s++)
        ok = res_seg_state(S->res, m->rm, s) != RES_SEG_ABSENT;
    vb_quiet(S->vb, 0);
    return ok;
}

static int fully_resident(sim_t *S, vmodel_t *m)
{
    vb_quiet(S->vb, 1);
    int ok = res_fully_resident(S->res, m->rm);
    vb_quiet(S->vb, 0);
    return ok;
}

static void model_stats(sim_t *S, vmodel_t *m, stats_res_t *st)
{
    vb_quiet(S->vb, 1);
    res_model_stats(S->res, m->rm, st);
    vb_quiet(S->vb, 0);
}

static size_t missing_pages(sim_t *S, vmodel_t *m)
{
    size_t n = 0;
    vb_quiet(S->vb, 1);
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        if (res_seg_state(S->res, m->rm, s) == RES_SEG_ABSENT)
            n += m->sm->segs[s].span / S->c->page_size;
    vb_quiet(S->vb, 0);
    return n;
}

static size_t free_pages(const sim_t *S)
{
    stats_pool_t ps;
    res_pool_stats(S->res, &ps);
    return ps.curr_pool_free;
}

static void note_use(sim_t *S, int mi)
{
    if (S->n_uses && S->uses[S->n_uses - 1] == mi)
        return;
    if (S->n_uses == S->cap_uses) {
        size_t cap = S->cap_uses ? 2 * S->cap_uses : 1024;
        int *u = realloc(S->uses, cap * sizeof *u);
        if (!u)
            return; /* the own-order bound is then computed on a prefix */
        S->uses = u;
        S->cap_uses = cap;
    }
    S->uses[S->n_uses++] = mi;
}

/* Adapter device copies beside model 0: every adapter, or lora-slots' slots. */
static double lora_copies(const sim_t *S)
{
    return S->pol == SIM_POL_LORA_SLOTS ? S->c->lru_batch_n : S->c->lora_n;
}

/* Builds model i's own store model from the shape: segment spans, a model_t
 * with hyperparameters and empty weight views (so store_weights_at has
 * nothing to rebase). */
static int vmodel_build(sim_t *S, vmodel_t *m, int i, char *err, size_t errlen)
{
    const sim_shape_t *sh = sim_cfg_shape(S->c, i);
    size_t page = S->c->page_size;
    store_model_t *sm = &m->own;
    model_hparams_t *hp = &m->mod.hp;
    hp->arch = MODEL_ARCH_LLAMA;
    hp->n_ctx_train = S->c->max_context;
    hp->n_embd = sh->n_embd;
    hp->n_ff = sh->n_ff;
    hp->n_layer = sh->n_layer;
    hp->n_head = sh->n_head;
    hp->n_head_kv = sh->n_head_kv;
    hp->head_dim = sh->head_dim ? sh->head_dim : sh->n_embd / sh->n_head;
    hp->rope_dim = hp->head_dim;
    hp->n_vocab = sh->n_vocab;
    m->mod.w.tied =
        1; /* no separate output view: the store then lists 2 + STORE_PER_LAYER n_layer */
    m->mod.w.layers = calloc(sh->n_layer, sizeof *m->mod.w.layers);
    sm->n_w = 2 + STORE_PER_LAYER * (size_t)sh->n_layer;
    m->woff = calloc(sm->n_w, sizeof *m->woff);
    sm->n_segs = sh->n_layer + 2;
    sm->segs = calloc(sm->n_segs, sizeof *sm->segs);
    if (!m->mod.w.layers || !m->woff || !sm->segs) {
        snprintf(err, errlen, "out of memory");
        return SIM_ERR_NOMEM;
    }
    sm->woff = m->woff;
    sm->name = m->name;
    sm->path = m->name;
    sm->model = &m->mod;
    for (uint32_t s = 0; s < sm->n_segs; s++) {
        double b = s == FWD_SEG_EMBED               ? m->si.embed_bytes
                   : s == FWD_SEG_HEAD(sh->n_layer) ? m->si.head_store_bytes
                                                    : m->si.layer_bytes;
        if (i == 0 && S->c->lora_n && s != FWD_SEG_EMBED && s != FWD_SEG_HEAD(sh->n_layer))
            b += lora_copies(S) * S->c->lora_bytes / sh->n_layer; /* its adapters beside it */
        sm->segs[s].bytes = (size_t)b;
    }
    store_layout_segments(sm, page); /* as the store lays a file out */
    /* a host address the virtual device never reads; distinct per model */
    sm->image = (uint8_t *)(uintptr_t)(((uint64_t)0x7f00 + (uint64_t)i) << 32);
    m->sm = sm;
    return SIM_OK;
}

/* Sets m up as model gm of the configuration (from the shape, or from file
 * gm % count of cfg.models) and registers it with residency as the worker's
 * load_model does. */
static int vmodel_init(sim_t *S, vmodel_t *m, int gm, char *err, size_t errlen)
{
    snprintf(m->name, sizeof m->name, "m%02d", gm);
    if (S->c->models) {
        int f = gm % sim_models_count(S->c->models);
        sim_shape_t sh;
        sim_models_shape(S->c->models, f, &sh);
        m->si = shape_info(&sh);
        m->sm = S->c->models->sm[f]; /* residency only reads it: shared by models of one file */
    } else {
        m->si = shape_info(sim_cfg_shape(S->c, gm));
        int rc = vmodel_build(S, m, gm, err, errlen);
        if (rc)
            return rc;
    }
    for (uint32_t s = 0; s < m->sm->n_segs; s++)
        m->span_bytes += m->sm->segs[s].span;
    uint32_t train = m->sm->model->hp.n_ctx_train;
    m->ctx = S->c->max_context < train ? S->c->max_context : train;
    m->swap_in_s = (double)m->sm->image_bytes / 10e9; /* the worker's first guess */
    res_cfg_t rc = {.gpu_quota = 0, .pinned = 0, .priority = 1.0};
    if (S->c->quota_bytes && m->sm->image_bytes > S->c->quota_bytes)
        rc.gpu_quota = m->quota = S->c->quota_bytes; /* it streams what does not fit */
    int rc2 = res_add(S->res, m->sm, &rc, &m->rm, err, errlen);
    return rc2 ? SIM_ERR_SETUP : SIM_OK;
}

/* Model gm's local index on host S, registering it first if the host does
 * not serve it yet (as a daemon configured with it would have it loaded:
 * idle, nothing on the device); -1 + reason in err on failure. */
static int vhost_model(sim_t *S, int gm, char *err, size_t errlen)
{
    if (S->local[gm] >= 0)
        return S->local[gm];
    if (S->n_m == S->cap_m) {
        int cap = S->cap_m ? 2 * S->cap_m : 16;
        vmodel_t **m = realloc(S->m, (size_t)cap * sizeof *m);
        if (m)
            S->m = m;
        sched_model_view_t *v = m ? realloc(S->views, (size_t)cap * sizeof *v) : NULL;
        if (!v) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        S->views = v;
        S->cap_m = cap;
    }
    vmodel_t *vm = calloc(1, sizeof *vm);
    if (!vm || sched_resize(S->sched, S->n_m + 1) != SCHED_OK) {
        free(vm);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    S->m[S->n_m++] = vm; /* counted now: vhost_free frees what vmodel_init left */
    if (vmodel_init(S, vm, gm, err, errlen))
        return -1;
    S->local[gm] = S->n_m - 1;
    return S->n_m - 1;
}

static void vhost_free(sim_t *S)
{
    if (!S)
        return;
    spfx_free(S->pfx); /* its cached KV goes back before the models leave */
    for (int i = 0; S->m && i < S->n_m; i++) {
        if (S->m[i]->rm)
            res_remove(S->res, S->m[i]->rm);
        free(S->m[i]->mod.w.layers);
        free(S->m[i]->woff);
        free(S->m[i]->own.segs);
        free(S->m[i]);
    }
    res_free(S->res);
    sched_free(S->sched);
    vb_free(S->vb);
    free(S->m);
    free(S->local);
    free(S->views);
    free(S->uses);
    free(S->lora_stamp);
    free(S->lora_run);
    free(S->lora_slot);
    free(S->slot_ad);
    free(S->slot_used);
    free(S);
}

/* A host: its virtual device, residency and scheduler, serving no model
 * yet. NULL + reason in err. Free with vhost_free. */
static sim_t *vhost_new(const sim_cfg_t *c, sim_policy_t pol, sim_seq_t *seqs, char *err,
                        size_t errlen)
{
    sim_t *S = calloc(1, sizeof *S);
    if (!S) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    S->c = c;
    S->pol = pol;
    S->seqs = seqs;
    S->wake = INFINITY;
    vb_cfg_t vc = {.pool_bytes = c->pool_bytes,
                   .page_size = c->page_size,
                   .h2d_bw = c->cost.h2d_bw,
                   .copy_lat_s = c->cost.copy_lat_s};
    S->vb = vb_new(&vc);
    if (!S->vb) {
        snprintf(err, errlen, "bad virtual device (pool %zu, page %zu)", c->pool_bytes,
                 c->page_size);
        goto fail;
    }
    S->be = vb_backend(S->vb);
    S->res = res_new(S->be, err, errlen);
    if (!S->res)
        goto fail;
    res_set_max_stall(S->res, c->sched.max_stall_s); /* as the worker does */
    sched_cfg_t sc = c->sched;
    sc.policy = pol == SIM_POL_FIFO ? SCHED_POLICY_FIFO : SCHED_POLICY_SWAP_AWARE;
    S->sched = sched_new(&sc, 0);
    S->local = malloc((size_t)c->n_models * sizeof *S->local);
    if (!S->sched || !S->local) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c->n_models; i++)
        S->local[i] = -1;
    if (c->lora_n) {
        size_t na = (size_t)c->lora_n + 1, ns = pol == SIM_POL_LORA_SLOTS ? c->lru_batch_n : 0;
        S->lora_stamp = calloc(na, sizeof *S->lora_stamp);
        S->lora_run = calloc(na, sizeof *S->lora_run);
        S->lora_slot = malloc(na * sizeof *S->lora_slot);
        S->slot_ad = calloc(ns + 1, sizeof *S->slot_ad);
        S->slot_used = calloc(ns + 1, sizeof *S->slot_used);
        if (!S->lora_stamp || !S->lora_run || !S->lora_slot || !S->slot_ad || !S->slot_used) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < na; i++)
            S->lora_slot[i] = -1;
    }
    if (c->prefix_cache &&
        !(S->pfx = spfx_new(S->res, c->n_models, c->prefix_entries, c->kv_host_bytes))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return S;
fail:
    vhost_free(S);
    return NULL;
}

/* ------------------------------------------------------------------ sequences */

/* The max_tokens s asks for: its output, or c->ask_tokens where more (for
 * the models c->ask_stride picks), within ctx (a client asking for more
 * than it uses: the sequence stops at its output, as at an end-of-sequence
 * token). */
static uint32_t asked(const sim_t *S, const sim_seq_t *s, uint32_t ctx)
{
    uint32_t stride = S->c->ask_stride ? S->c->ask_stride : 1;
    uint32_t a = s->rq->model % stride ? 0 : S->c->ask_tokens;
    uint32_t room = ctx > s->rq->prompt ? ctx - s->rq->prompt : 0;
    if (a > room)
        a = room;
    return a > s->rq->output ? a : s->rq->output;
}

/* A restore of s's prefix under way ends first (the worker's res_kv_restore_cancel). */
static void restore_cancel(sim_t *S, sim_seq_t *s)
{
    if (!s->n_restore)
        return;
    res_kv_restore_cancel(S->res, &s->rev);
    s->n_restore = 0;
}

/* Whether s's restore landed (its prefix in its cache: it joins the next pass); a failed one
 * leaves it to prefill. Polled quietly: the worker polls once a round. */
static int restore_landed(sim_t *S, sim_seq_t *s)
{
    if (!s->n_restore)
        return 1;
    vb_quiet(S->vb, 1);
    int rc = res_kv_restore_poll(S->res, s->kv, s->n_restore, &s->rev);
    vb_quiet(S->vb, 0);
    if (rc == 0)
        return 0;
    s->n_restore = 0;
    return 1;
}

static void seq_end(sim_t *S, vmodel_t *m, sim_seq_t *s, seq_state_t how)
{
    if (s->state == SEQ_ACTIVE && S->pol == SIM_POL_LORA_SLOTS && s->rq->adapter) {
        uint32_t ad = s->rq->adapter; /* its slot is free to go once no sequence runs in it */
        S->lora_run[ad]--;
        S->slot_used[S->lora_slot[ad]] = now(S);
    }
    if (s->state == SEQ_ACTIVE) {
        sim_seq_t **pp = &m->active;
        while (*pp && *pp != s)
            pp = &(*pp)->next;
        if (*pp) {
            *pp = s->next;
            m->n_active--;
            S->n_active--;
        }
    }
    restore_cancel(S, s);
    if (s->kv && !(how == SEQ_DONE && spfx_keep(S->pfx, s->rq, s->kv)))
        res_kv_free(S->res, s->kv);
    s->kv = NULL;
    if (how == SEQ_DONE && s->n_gen > 0) /* as the worker's wk_seq_finish */
        sched_note_output(S->sched, s->item.model, s->n_gen, asked(S, s, m->ctx));
    s->state = how;
    s->t_done = now(S);
    if (how == SEQ_FAILED)
        S->failed++;
    S->in_flight--;
}

/* The next waiting request of model mi (sched queue, or lru pending list). */
static int pol_pending(const sim_t *S)
{
    return S->pol == SIM_POL_LRU || S->pol == SIM_POL_LRU_BATCH;
}

static sim_seq_t *peek_waiting(sim_t *S, int mi)
{
    if (pol_pending(S))
        return S->m[mi]->pend_head;
    sched_item_t *it = sched_peek(S->sched, mi);
    return it ? it->user : NULL;
}

static void pop_waiting(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    if (pol_pending(S)) {
        m->pend_head = m->pend_head->next;
        if (!m->pend_head)
            m->pend_tail = NULL;
        m->n_pend--;
    } else {
        sched_pop(S->sched, mi);
    }
    if (S->c->deadline_s > 0)
        sched_gap_note(&m->gap, now(S),
                       (pol_pending(S) ? m->n_pend : sched_queued(S->sched, mi)) > 0);
}

/* ------------------------------------------------------------------ lora-slots */

/* The slot adapter ad would run in: its own, an empty one, else the least recently used one
 * whose adapter runs no sequence; -1 = none. */
static int slot_find(const sim_t *S, uint32_t ad)
{
    if (S->lora_slot[ad] >= 0)
        return S->lora_slot[ad];
    int best = -1;
    for (uint32_t k = 0; k < S->c->lru_batch_n; k++) {
        if (!S->slot_ad[k])
            return (int)k;
        if (!S->lora_run[S->slot_ad[k]] && (best < 0 || S->slot_used[k] < S->slot_used[best]))
            best = (int)k;
    }
    return best;
}

/* A sequence of adapter ad (slot_find found it one) is admitted: the seconds its adapter's
 * copy into the slot takes (0: there already). */
static double slot_take(sim_t *S, uint32_t ad)
{
    int k = slot_find(S, ad);
    double load = 0;
    if (S->slot_ad[k] != ad) {
        if (S->slot_ad[k])
            S->lora_slot[S->slot_ad[k]] = -1;
        S->slot_ad[k] = ad;
        S->lora_slot[ad] = k;
        load = S->c->cost.copy_lat_s + S->c->lora_bytes / S->c->cost.h2d_bw;
        S->lora_loads++;
    }
    S->lora_run[ad]++;
    S->slot_used[k] = now(S);
    return load;
}

/* The next request of mi to admit: the head of its queue, or with lora-slots the first queued
 * one whose adapter can have a slot (vLLM skips the others and keeps their places). */
static sim_seq_t *admit_next(sim_t *S, int mi)
{
    if (S->pol != SIM_POL_LORA_SLOTS)
        return peek_waiting(S, mi);
    for (sched_item_t *it = sched_peek(S->sched, mi); it; it = it->next) {
        sim_seq_t *s = it->user;
        if (!s->rq->adapter || slot_find(S, s->rq->adapter) >= 0)
            return s;
    }
    return NULL;
}

/* s (of admit_next) leaves mi's queue. */
static void admit_take(sim_t *S, int mi, sim_seq_t *s)
{
    if (s == peek_waiting(S, mi)) {
        pop_waiting(S, mi);
        return;
    }
    sched_remove(S->sched, &s->item);
    if (S->c->deadline_s > 0)
        sched_gap_note(&S->m[mi]->gap, now(S), sched_queued(S->sched, mi) > 0);
}

/* ------------------------------------------------------------------ one step */

/* The worker's can_admit: the next queued request of mi would get its KV
 * cache now (it grows page by page: admission needs the prompt's pages). */
static int can_admit(sim_t *S, int mi)
{
    sim_seq_t *s = peek_waiting(S, mi);
    if (!s)
        return 0;
    if (S->n_active == 0)
        return 1; /* nothing to wait for: admission decides */
    return res_kv_bytes_model(S->res, S->m[mi]->rm, s->rq->prompt + 1) <=
           res_kv_available_for(S->res, S->m[mi]->rm);
}

/* Whether a sequence other than me holds a KV cache (the worker's
 * kv_held_by_others: waiting for pages can help only then). */
static int kv_held_by_others(const sim_t *S, const sim_seq_t *me)
{
    for (int i = 0; i < S->n_m; i++)
        for (const sim_seq_t *s = S->m[i]->active; s; s = s->next)
            if (s != me && s->kv)
                return 1;
    return 0;
}

/* The worker's seq_park: the pool ran short for s's next position; its
 * cache goes back (it stays active, recomputed when pages are back) unless
 * nobody else holds one: then it fails. 1 if it failed. */
static int seq_park(sim_t *S, vmodel_t *m, sim_seq_t *s)
{
    if (!kv_held_by_others(S, s)) {
        seq_end(S, m, s, SEQ_FAILED);
        return 1;
    }
    restore_cancel(S, s);
    res_kv_free(S->res, s->kv);
    s->kv = NULL;
    s->parked = 1;
    S->recomputes++;
    return 0;
}

/* The worker's seq_unpark: a cache for prompt + generated tokens again. */
static void seq_unpark(sim_t *S, vmodel_t *m, sim_seq_t *s, uint32_t ctx)
{
    char err[256];
    uint32_t n_ctx = s->rq->prompt + asked(S, s, ctx);
    if (res_kv_new(S->res, m->rm, n_ctx < ctx ? n_ctx : ctx, &s->kv, err, sizeof err) ||
        res_kv_ensure(S->res, s->kv, s->rq->prompt + s->n_gen + 1, err, sizeof err)) {
        if (s->kv)
            res_kv_free(S->res, s->kv);
        s->kv = NULL;
        if (!kv_held_by_others(S, s))
            seq_end(S, m, s, SEQ_FAILED);
        return;
    }
    s->parked = 0;
}

static int has_parked(const vmodel_t *m)
{
    for (const sim_seq_t *s = m->active; s; s = s->next)
        if (s->parked)
            return 1;
    return 0;
}

static void pagein_topup(sim_t *S, int busy);

/* One segment of model busy's pass, as the worker's timed_wait: the page-ins
 * under way get their next copies first, then it waits for segment seg
 * through residency's hook and spends dt of compute. */
static int seg_run(sim_t *S, int busy, fwd_hooks_t *h, uint32_t seg, double dt)
{
    pagein_topup(S, busy);
    if (h->wait(h->ctx, seg))
        return -1;
    vb_advance(S->vb, dt);
    S->busy_s += dt;
    return 0;
}

/* s's KV cache at admission: a new one with the prompt's pages mapped, or (a
 * conversation's turn, with the prefix cache) one holding its cached prefix
 * or with its restore from the host tier queued (the worker's wk_pfx_admit,
 * whose caches span the model's context, to be adopted by the next turn). */
static int seq_admit_kv(sim_t *S, vmodel_t *m, sim_seq_t *s, uint32_t n_ctx, char *err,
                        size_t errlen)
{
    if (S->pfx && s->rq->session)
        return spfx_admit(S->pfx, m->rm, &m->pt, s->rq, m->ctx, &s->kv, &s->rev, &s->n_restore, err,
                          errlen);
    int rc = res_kv_new(S->res, m->rm, n_ctx, &s->kv, err, errlen);
    return rc ? rc : res_kv_ensure(S->res, s->kv, s->rq->prompt + 1, err, errlen);
}

/* Tokens s runs in its next pass: its prompt past what its cache holds (a
 * fresh sequence, a parked one with its generated tokens), else one. */
static uint32_t seq_tokens(const sim_seq_t *s)
{
    uint32_t have = s->rq->prompt + s->n_gen;
    return s->kv->n_past + 1 < have ? have - s->kv->n_past : 1;
}

/* The adapters' share of a pass of m (pass_load set in_pass): each distinct adapter's bytes
 * read once, its tokens' low-rank products. */
static double lora_pass_s(sim_t *S, const vmodel_t *m)
{
    const sim_cfg_t *c = S->c;
    if (!c->lora_n)
        return 0;
    uint64_t stamp = ++S->lora_pass;
    double d = 0, toks = 0;
    for (const sim_seq_t *s = m->active; s; s = s->next) {
        uint32_t ad = s->in_pass ? s->rq->adapter : 0;
        if (!ad)
            continue;
        toks += seq_tokens(s);
        if (S->lora_stamp[ad] != stamp) {
            S->lora_stamp[ad] = stamp;
            d++;
        }
    }
    return (c->cost.hbm_bw > 0 ? d * c->lora_bytes / c->cost.hbm_bw : 0) +
           (c->cost.flops > 0 ? 2 * c->lora_params * toks / c->cost.flops : 0);
}

/* The pass of m: tokens, sequences and KV positions read, each sequence's
 * in_pass set (parked ones and those whose restore is under way sit out);
 * the first sequence still restoring, or NULL. */
static sim_seq_t *pass_load(sim_t *S, vmodel_t *m, double *toks, double *kv_pos, double *nseq)
{
    sim_seq_t *restoring = NULL;
    *toks = *kv_pos = *nseq = 0;
    for (sim_seq_t *s = m->active; s; s = s->next) {
        s->in_pass = 0;
        if (s->parked)
            continue;
        if (!restore_landed(S, s)) {
            restoring = restoring ? restoring : s;
            continue;
        }
        uint32_t nt = seq_tokens(s);
        *toks += nt;
        *kv_pos += s->kv->n_past + nt;
        (*nseq)++;
        s->in_pass = 1;
    }
    return restoring;
}

/* Mirrors worker.c step(): acquire, admit with KV caches, grow caches, one
 * pass (cost model) through the segment hooks, release, finish sequences. */
static void step(sim_t *S, int mi, uint32_t admit)
{
    vmodel_t *m = S->m[mi];
    char err[256];
    int mapped_before = all_mapped(S, m);
    int cold = !fully_resident(S, m);
    stats_res_t before, after;
    model_stats(S, m, &before);
    if (res_acquire(S->res, m->rm, err, sizeof err)) {
        while (m->active)
            seq_end(S, m, m->active, SEQ_FAILED);
        return;
    }
    uint32_t ctx = m->ctx;
    sim_seq_t *fresh = NULL, **fresh_tail = &fresh;
    if (has_parked(m))
        admit = 0;        /* parked sequences get the pages first */
    double lora_load = 0; /* lora-slots: adapters copied into slots for this pass */
    for (uint32_t k = 0; k < admit; k++) {
        sim_seq_t *s = admit_next(S, mi);
        if (!s)
            break;
        uint32_t n_ctx = s->rq->prompt + asked(S, s, ctx);
        if (n_ctx > ctx)
            n_ctx = ctx;
        /* the prompt's pages mapped, as the worker does (the cache grows
         * page by page from there) */
        if (seq_admit_kv(S, m, s, n_ctx, err, sizeof err)) {
            if (s->kv)
                res_kv_free(S->res, s->kv);
            s->kv = NULL;
            if (S->n_active == 0 && !fresh) {
                admit_take(S, mi, s);
                seq_end(S, m, s, SEQ_FAILED);
                continue;
            }
            break;
        }
        admit_take(S, mi, s);
        if (S->pol == SIM_POL_LORA_SLOTS && s->rq->adapter)
            lora_load += slot_take(S, s->rq->adapter);
        S->prompt_tokens += s->rq->prompt;
        s->state = SEQ_ACTIVE;
        *fresh_tail = s;
        fresh_tail = &s->next;
    }
    /* end the admitted list: the last one's link still points into the
     * pending list when only some pending requests were admitted */
    *fresh_tail = NULL;
    if (lora_load > 0) { /* the copies into the slots, before the pass (vLLM's activate) */
        vb_advance(S->vb, lora_load);
        S->busy_s += lora_load;
    }
    /* grow by one position, parking what the pool cannot grow, bringing
     * parked sequences back (the worker's step_join) */
    for (sim_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next;
        if (s->parked)
            seq_unpark(S, m, s, ctx);
        else if (res_kv_ensure(S->res, s->kv, s->kv->n_past + 1, err, sizeof err))
            seq_park(S, m, s);
    }
    uint32_t n_fresh = 0;
    for (sim_seq_t *s = fresh; s; s = s->next)
        n_fresh++;
    if (fresh) {
        *fresh_tail = m->active;
        m->active = fresh;
    }
    m->n_active += n_fresh;
    S->n_active += n_fresh;
    uint32_t n_list = 0;
    for (sim_seq_t *s = m->active; s; s = s->next)
        n_list++;
    if (n_list != m->n_active) {
        S->inconsistent = 1; /* the run stops with an error */
        res_release(S->res, m->rm);
        return;
    }
    if (m->n_active == 0) {
        res_release(S->res, m->rm);
        return;
    }
    /* the pass: tokens, sequences and KV positions read (a fresh sequence
     * prefills its prompt, one brought back from parking its prompt and the
     * tokens it generated) */
    double toks = 0, kv_pos = 0, nseq = 0;
    pass_load(S, m, &toks, &kv_pos, &nseq); /* restoring sequences sit out until theirs lands */
    for (sim_seq_t *s = m->active; s; s = s->next)
        if (s->in_pass && s->n_gen == 0)
            S->prefill_tokens += seq_tokens(s);
    if (nseq == 0) { /* every sequence waits for pages */
        res_release(S->res, m->rm);
        return;
    }
    fwd_hooks_t h = res_hooks(m->rm);
    uint32_t L = m->si.n_layer;
    double lt = layer_time(S->c, &m->si, toks, kv_pos / L) + lora_pass_s(S, m) / L;
    vb_advance(S->vb, S->c->cost.t_fixed_s);
    S->busy_s += S->c->cost.t_fixed_s;
    double busy0 = S->busy_s;
    int rc = seg_run(S, mi, &h, FWD_SEG_EMBED, 0);
    for (uint32_t l = 0; l < L && !rc; l++)
        rc = seg_run(S, mi, &h, FWD_SEG_LAYER(l), lt);
    if (!rc)
        rc = seg_run(S, mi, &h, FWD_SEG_HEAD(L), head_time(S->c, &m->si, nseq));
    if (!rc)
        for (sim_seq_t *s = m->active; s; s = s->next)
            if (s->in_pass)
                s->kv->n_past += seq_tokens(s);
    res_release(S->res, m->rm);
    S->steps++;
    if (!rc)
        pass_time_note(&m->pt, S->c->cost.t_fixed_s + S->busy_s - busy0, (uint32_t)toks,
                       (uint32_t)nseq);
    m->last_step = now(S);
    model_stats(S, m, &after);
    int paged = after.total_bytes_in != before.total_bytes_in;
    if (paged && fully_resident(S, m) && after.total_copy_ns > before.total_copy_ns)
        m->swap_in_s = (double)m->sm->image_bytes /
                       (double)(after.total_bytes_in - before.total_bytes_in) *
                       (double)(after.total_copy_ns - before.total_copy_ns) / 1e9;
    double t = now(S);
    for (sim_seq_t *s = m->active, *nx; s; s = nx) {
        nx = s->next;
        if (rc) {
            seq_end(S, m, s, SEQ_FAILED);
            continue;
        }
        if (!s->in_pass)
            continue;
        if (s->n_gen == 0 && (paged || cold))
            s->swapped = 1;
        if (++s->n_gen == 1)
            s->t_first = t;
        if (s->n_gen >= s->rq->output)
            seq_end(S, m, s, SEQ_DONE);
    }
    if (!mapped_before && all_mapped(S, m))
        S->loads++;
    m->last_use = t;
    note_use(S, mi);
}

/* ------------------------------------------------------------------ policies */

/* ------------------------------------------------------------------ page-ins (worker_step.c) */

/* As the worker's next_pass_s: the compute of mi's next pass, its running
 * sequences (one token each, or a parked one's prompt and generated tokens)
 * and the queued requests it has room for (their prompts). */
static double next_pass_s(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    uint32_t toks = 0, nseq = 0, mb = S->c->max_batch;
    for (sim_seq_t *s = m->active; s; s = s->next, nseq++)
        toks += s->parked ? s->rq->prompt + s->n_gen : 1;
    sched_item_t *it = pol_pending(S) ? NULL : sched_peek(S->sched, mi);
    for (; it && nseq < mb; it = it->next, nseq++)
        toks += ((sim_seq_t *)it->user)->rq->prompt;
    return pass_time_for(&m->pt, toks, nseq);
}

static double ready_in(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    vb_quiet(S->vb, 1);
    double in = res_ready_in(S->res, m->rm, next_pass_s(S, mi));
    vb_quiet(S->vb, 0);
    return in;
}

/* As the worker's round_gap: the next round comes after at most the
 * longest pass of a model. */
static double round_gap(const sim_t *S)
{
    double longest = 0;
    for (int i = 0; i < S->n_m; i++)
        if (S->m[i]->pt.pass_s > longest)
            longest = S->m[i]->pt.pass_s;
    return longest;
}

/* Queue the next segments of mi's page-in (as the copy engine nears them),
 * as the worker's wk_pagein_window: the copies ahead cover the next round
 * and mi's next pass. */
static void pagein_more(sim_t *S, int mi, int evict)
{
    char err[256];
    vmodel_t *m = S->m[mi];
    int before = all_mapped(S, m);
    /* not quiet: evicting a victim whose copy is in flight blocks the host */
    res_prefetch_ahead(S->res, m->rm, evict,
                       res_pagein_window(S->res, m->rm, 2 * round_gap(S), next_pass_s(S, mi)), err,
                       sizeof err);
    if (!before && all_mapped(S, m))
        S->loads++;
}

/* As the worker's pagein_topup: before each segment of busy's pass, the
 * page-ins under way with copies left to queue get their next ones. */
static void pagein_topup(sim_t *S, int busy)
{
    for (int i = 0; i < S->n_m && S->n_paging > 0; i++) {
        vmodel_t *m = S->m[i];
        if (i != busy && m->paging_since > 0 && isinf(ready_in(S, i)))
            pagein_more(S, i, m->paging_evict);
    }
}

/* A page-in starts (since: now) or ends (0): m->paging_since and S->n_paging. */
static void paging_mark(sim_t *S, vmodel_t *m, double since)
{
    S->n_paging += (since > 0) - (m->paging_since > 0);
    m->paging_since = since;
}

/* The page-in ended: the requests waiting for their first token waited for it. */
static void pagein_end(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    paging_mark(S, m, 0);
    for (sched_item_t *it = sched_peek(S->sched, mi); it; it = it->next)
        ((sim_seq_t *)it->user)->swapped = 1;
}

/* As the worker's pagein_poll (no device failures here): 0 when m can run. */
static double pagein_poll(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    double in = ready_in(S, mi);
    if (isinf(in)) {
        pagein_more(S, mi, m->paging_evict);
        in = ready_in(S, mi);
        if (isinf(in) && res_inflight(m->rm) == 0)
            in = 0;
    }
    m->paging_queued = in <= round_gap(S); /* all queued, landing before the next round */
    if (in == 0)
        pagein_end(S, mi);
    return in;
}

static int pagein_start(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    if (ready_in(S, mi) == 0)
        return 1;
    paging_mark(S, m, now(S) > 0 ? now(S) : 1e-9);
    m->paging_evict = RES_EVICT_ANY;
    pagein_more(S, mi, RES_EVICT_ANY);
    return pagein_poll(S, mi) == 0;
}

/* The worker's fill_fits: the views' fits of the cold models with work,
 * res_pagein_fits beside the KV caches (prompt pages: caches grow as
 * sequences advance) of the requests the models on the device (or coming)
 * could admit, and its own. */
/* The KV pages (prompt + 1 each) of the requests model i could admit. */
static size_t queued_kv(sim_t *S, int i)
{
    vmodel_t *m = S->m[i];
    sim_seq_t *h = peek_waiting(S, i);
    if (!h)
        return 0;
    uint32_t q = sched_queued(S->sched, i), mb = S->views[i].max_batch;
    uint32_t room = m->n_active < mb ? mb - m->n_active : 0;
    return (size_t)(q < room ? q : room) * res_kv_bytes_model(S->res, m->rm, h->rq->prompt + 1);
}

static void fill_fits(sim_t *S)
{
    size_t reserve = 0, spare = res_spare_pages(S->res);
    for (int i = 0; i < S->n_m; i++)
        if (S->views[i].resident || S->views[i].loading)
            reserve += queued_kv(S, i);
    for (int i = 0; i < S->n_m; i++)
        if (!S->views[i].resident && !S->views[i].loading &&
            (S->m[i]->n_active > 0 || sched_queued(S->sched, i) > 0))
            S->views[i].fits =
                res_pagein_fits(S->res, S->m[i]->rm, spare, reserve + queued_kv(S, i));
}

/* The worker's round: page-ins, views, sched_next, one step or a page-in
 * start, prefetch. 1 if it stepped; *nap: when a page-in may end. */
static int round_plan(sim_t *S, double *nap, int *started);

/* The worker naps at most WK_NAP_MAX_S (2 ms) after a round that stepped
 * nothing, and its next round finds the model whose page-in just started
 * loading and steps a resident one: one round that started a page-in is
 * followed at once by another (the copies run meanwhile). */
static int round_sched(sim_t *S, double *nap)
{
    int started = 0;
    int stepped = round_plan(S, nap, &started);
    if (!stepped && started) {
        vb_advance(S->vb, S->c->cost.t_round_s);
        stepped = round_plan(S, nap, &started);
    }
    return stepped;
}

static int round_plan(sim_t *S, double *nap, int *started)
{
    *started = 0;
    for (int i = 0; i < S->n_m && S->n_paging > 0; i++)
        if (S->m[i]->paging_since > 0)
            pagein_poll(S, i);
    int settled = 0;
    for (int i = 0; i < S->n_m; i++) {
        vmodel_t *m = S->m[i];
        /* an idle model's residency decides nothing (sched_next reads it only
         * for models with work): not asked, so a host serving thousands of
         * models costs what its busy ones do */
        int work = m->n_active > 0 || sched_queued(S->sched, i) > 0;
        /* the first res_ready_in of a round settles every model's copies;
         * after it, a model with a segment not even mapped is not ready
         * (INFINITY) without asking again (a walk over every model) */
        int ready = 0;
        if (work && !m->paging_since && (!settled || res_weight_bytes(m->rm) == m->span_bytes)) {
            ready = ready_in(S, i) == 0;
            settled = 1;
        }
        S->views[i] = (sched_model_view_t){
            .resident = ready,
            .n_active = m->n_active,
            .max_batch = S->c->max_batch,
            .swap_in_s = m->swap_in_s,
            .priority = 1.0,
            .can_admit = can_admit(S, i),
            .loading = m->paging_since > 0,
            .queued = m->paging_since > 0 && m->paging_queued,
            .last_step = m->last_step,
            .streams = res_streams(m->rm),
        };
        for (sim_seq_t *q = m->active; q; q = q->next) {
            uint32_t left =
                sched_passes_left(S->sched, i, q->n_gen, asked(S, q, m->ctx), m->n_active);
            if (left > S->views[i].steps_left)
                S->views[i].steps_left = left;
            left = sched_passes_left(S->sched, i, q->n_gen, asked(S, q, m->ctx), 1);
            if (!S->views[i].steps_min || left < S->views[i].steps_min)
                S->views[i].steps_min = left;
        }
        res_set_wanted(m->rm, work);
    }
    fill_fits(S);
    sched_plan_t plan;
    sched_next(S->sched, now(S), S->views, &plan);
    /* the prefetch first, as the worker: its copies run during the step */
    if (plan.prefetch >= 0 && S->m[plan.prefetch]->paging_since == 0) {
        vmodel_t *pm = S->m[plan.prefetch];
        pagein_more(S, plan.prefetch, RES_EVICT_UNWANTED);
        if (res_inflight(pm->rm) > 0) {
            paging_mark(S, pm, now(S) > 0 ? now(S) : 1e-9);
            pm->paging_queued = 0; /* the next round's poll says */
            pm->paging_evict = RES_EVICT_UNWANTED;
        }
    }
    int stepped = 0;
    if (plan.model >= 0 && (S->views[plan.model].resident || pagein_start(S, plan.model))) {
        step(S, plan.model, plan.admit);
        stepped = 1;
    } else if (plan.model >= 0) {
        *started = S->m[plan.model]->paging_since > 0;
    }
    /* nothing stepped: the loop waits until a page-in may end */
    *nap = INFINITY;
    for (int i = 0; i < S->n_m && S->n_paging > 0; i++)
        if (S->m[i]->paging_since > 0) {
            double in = ready_in(S, i);
            if (isinf(in)) /* more to queue once what is queued lands */
                in = vb_copy_tail(S->vb) - now(S);
            if (in < *nap)
                *nap = in;
        }
    return stepped;
}

/* Least recently used idle model holding weights, other than except; -1 if none. */
static int lru_victim(sim_t *S, int except)
{
    int best = -1;
    for (int i = 0; i < S->n_m; i++) {
        vmodel_t *v = S->m[i];
        if (i == except || v->n_active || v->n_pend || v->loading)
            continue;
        stats_res_t st;
        model_stats(S, v, &st);
        if (st.curr_resident_bytes == 0)
            continue;
        if (best < 0 || v->last_use < S->m[best]->last_use)
            best = i;
    }
    return best;
}

static void lru_dispatch(sim_t *S)
{
    while (S->gq_head < S->gq_n) {
        sim_seq_t *s = &S->seqs[S->gq_head];
        if (s->state == SEQ_FAILED) {
            S->gq_head++; /* refused at submission */
            continue;
        }
        int mi = s->rq->model;
        vmodel_t *m = S->m[mi];
        if (m->loading) {
            if (fully_resident(S, m))
                m->loading = 0;
            else if (all_mapped(S, m))
                return; /* still landing: the head waits */
            else
                m->loading = 0; /* lost pages meanwhile: load again */
        }
        if (fully_resident(S, m)) {
            if (m->n_active + m->n_pend >= S->c->max_batch)
                return;
            s->next = NULL;
            if (m->pend_tail)
                m->pend_tail->next = s;
            else
                m->pend_head = s;
            m->pend_tail = s;
            m->n_pend++;
            S->gq_head++;
            continue;
        }
        size_t need = missing_pages(S, m);
        while (free_pages(S) < need) {
            int v = lru_victim(S, mi);
            if (v < 0)
                return; /* the rest is held by running models: wait */
            res_evict(S->res, S->m[v]->rm, RES_CAUSE_CAPACITY, 0);
        }
        char err[256];
        int before = all_mapped(S, m);
        res_prefetch(S->res, m->rm, 0, err, sizeof err);
        if (all_mapped(S, m)) {
            if (!before)
                S->loads++;
            m->loading = 1;
        }
        return;
    }
}

static int round_lru(sim_t *S)
{
    lru_dispatch(S);
    int n = S->n_m;
    for (int k = 0; k < n; k++) {
        int mi = (S->rr + 1 + k) % n;
        vmodel_t *m = S->m[mi];
        if (m->n_active + m->n_pend > 0 && !m->loading) {
            S->rr = mi;
            step(S, mi, m->n_pend);
            return 1;
        }
    }
    return 0;
}

/* Models holding weights (resident or in flight), other than except. */
static int lrub_holding(sim_t *S, int except)
{
    int n = 0;
    for (int i = 0; i < S->n_m; i++)
        if (i != except && res_weight_bytes(S->m[i]->rm) > 0)
            n++;
    return n;
}

/* Loaded for lru-batch: every segment mapped, or for a model with a quota
 * below its size what the quota holds (its steps stream the rest). */
static int lrub_loaded(sim_t *S, vmodel_t *m)
{
    if (m->quota)
        return res_weight_bytes(m->rm) + m->sm->segs[1].span > m->quota || all_mapped(S, m);
    return all_mapped(S, m);
}

static void lrub_dispatch(sim_t *S)
{
    /* one load at a time: the next starts once the last has landed */
    for (int i = 0; i < S->n_m; i++) {
        vmodel_t *m = S->m[i];
        if (!m->loading)
            continue;
        if (fully_resident(S, m) || !all_mapped(S, m) || res_inflight(m->rm) == 0)
            m->loading = 0; /* landed, or lost pages meanwhile (loaded again when wanted) */
        else
            return;
    }
    /* the cold model with the oldest waiting request */
    int pick = -1;
    for (int i = 0; i < S->n_m; i++) {
        vmodel_t *m = S->m[i];
        if (m->n_pend && !lrub_loaded(S, m) &&
            (pick < 0 || m->pend_head->rq->t < S->m[pick]->pend_head->rq->t))
            pick = i;
    }
    if (pick < 0)
        return;
    vmodel_t *m = S->m[pick];
    uint32_t n_max = S->c->lru_batch_n ? S->c->lru_batch_n : UINT32_MAX;
    size_t need = missing_pages(S, m);
    if (m->quota) { /* what its quota holds, no more */
        size_t page = S->c->page_size, held = res_weight_bytes(m->rm) / page;
        size_t q = m->quota / page > held ? m->quota / page - held : 0;
        need = need < q ? need : q;
    }
    int holding = lrub_holding(S, pick);
    while ((uint32_t)holding >= n_max || free_pages(S) < need) {
        int v = lru_victim(S, pick);
        if (v < 0)
            return; /* the rest is held by models with work: wait */
        res_evict(S->res, S->m[v]->rm, RES_CAUSE_CAPACITY, 0);
        holding = lrub_holding(S, pick);
    }
    char err[256];
    res_prefetch(S->res, m->rm, RES_EVICT_NONE, err, sizeof err);
    if (lrub_loaded(S, m)) {
        S->loads++;
        m->loading = res_inflight(m->rm) > 0;
    }
}

static int round_lrub(sim_t *S)
{
    lrub_dispatch(S);
    int n = S->n_m;
    for (int k = 0; k < n; k++) {
        int mi = (S->rr + 1 + k) % n;
        vmodel_t *m = S->m[mi];
        if (m->loading ||
            (m->n_active == 0 &&
             (m->n_pend == 0 || !(m->quota ? lrub_loaded(S, m) : fully_resident(S, m)))))
            continue;
        uint32_t room = m->n_active < S->c->max_batch ? S->c->max_batch - m->n_active : 0;
        S->rr = mi;
        step(S, mi, m->n_pend < room ? m->n_pend : room);
        return 1;
    }
    return 0;
}

static int any_loading(const sim_t *S)
{
    for (int i = 0; i < S->n_m; i++)
        if (S->m[i]->loading)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ run */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

/* Image bytes and segments of model i of the configuration. */
static size_t cfg_image_bytes(const sim_cfg_t *c, int i)
{
    return c->models ? sim_models_image_bytes(c->models, i % sim_models_count(c->models))
                     : sim_model_bytes(sim_cfg_shape(c, i), c->page_size);
}

static uint32_t cfg_segs(const sim_cfg_t *c, int i)
{
    return c->models ? sim_models_segs(c->models, i % sim_models_count(c->models))
                     : sim_cfg_shape(c, i)->n_layer + 2;
}

/* Models that fit the pool at once, for Belady: counted with the largest. */
static uint32_t belady_k(const sim_cfg_t *c)
{
    size_t img = 0;
    for (int i = 0; i < c->n_models; i++)
        if (cfg_image_bytes(c, i) > img)
            img = cfg_image_bytes(c, i);
    return (uint32_t)(c->pool_bytes / c->page_size / (img / c->page_size));
}

/* Belady's loads for the arrival order; page-ins and bytes as if every load
 * were of model 0's size (exact when the models are alike). */
static void belady_only(const sim_cfg_t *c, const wl_req_t *reqs, size_t n, sim_result_t *out)
{
    size_t img = cfg_image_bytes(c, 0);
    uint32_t k = belady_k(c);
    int *seq = malloc((n ? n : 1) * sizeof *seq);
    memset(out, 0, sizeof *out);
    out->requests = n;
    out->belady_k = k;
    if (!seq)
        return;
    for (size_t i = 0; i < n; i++)
        seq[i] = reqs[i].model;
    out->model_loads = sim_belady(seq, n, c->n_models, k);
    out->belady_own = out->model_loads;
    out->page_ins = out->model_loads * cfg_segs(c, 0);
    out->bytes_in = out->model_loads * img;
    out->ttft_p50 = out->ttft_p99 = out->ttft_max = NAN;
    out->e2e_p50 = out->e2e_p99 = out->e2e_max = NAN;
    out->gpu_busy = out->makespan_s = out->copy_busy = out->slo_frac = NAN;
    free(seq);
}

/* ------------------------------------------------------------------ hosts on one clock */

struct sim_fleet {
    const sim_cfg_t *c;
    sim_t **h; /* n_hosts hosts; owned */
    int n_hosts;
};

int sim_fleet_hosts(const sim_fleet_t *f)
{
    return f->n_hosts;
}

size_t sim_fleet_load(const sim_fleet_t *f, int host)
{
    return f->h[host]->in_flight;
}

uint32_t sim_fleet_model_load(const sim_fleet_t *f, int host, int model)
{
    const sim_t *S = f->h[host];
    int lm = S->local[model];
    return lm < 0 ? 0 : S->m[lm]->n_active + sched_queued(S->sched, lm);
}

/* The next round of S: INFINITY while it has nothing in flight. */
/* ------------------------------------------------------------------ deadlines */

/* Whether this run refuses requests predicted to miss cfg.deadline_s. */
static int dl_drops(const sim_t *S)
{
    return S->c->deadline_s > 0 && (S->pol == SIM_POL_DEFAULT || S->pol == SIM_POL_FIFO ||
                                    (S->pol == SIM_POL_LRU_BATCH && S->c->deadline_drop));
}

/* Seconds until model mi can run, as the worker predicts it (res_pagein_eta). */
static double dl_wait(sim_t *S, int mi)
{
    vmodel_t *m = S->m[mi];
    vb_quiet(S->vb, 1);
    double eta = res_pagein_eta(S->res, m->rm, m->pt.pass_s);
    vb_quiet(S->vb, 0);
    return eta;
}

/* s (of model mi, ahead requests queued before it, wait_s until mi runs) is predicted to miss
 * its deadline (sched_first_token_s, as the worker). */
static int dl_late(sim_t *S, int mi, const sim_seq_t *s, uint32_t ahead, double wait_s)
{
    vmodel_t *m = S->m[mi];
    double p = sched_first_token_s(&m->gap, ahead, wait_s, pass_time_for(&m->pt, s->rq->prompt, 1));
    return now(S) + p > s->rq->t + S->c->deadline_s;
}

static void dl_refuse(sim_t *S, sim_seq_t *s)
{
    s->state = SEQ_FAILED;
    s->refused = 1;
    s->t_done = now(S);
    S->in_flight--;
    S->refused++;
}

/* The worker's wk_dl_sweep: every queued request now predicted to miss is refused. */
static void dl_sweep(sim_t *S)
{
    for (int mi = 0; mi < S->n_m; mi++) {
        vmodel_t *m = S->m[mi];
        if (!(pol_pending(S) ? m->n_pend : sched_queued(S->sched, mi)))
            continue;
        uint32_t ahead = 0;
        double wait = dl_wait(S, mi);
        if (pol_pending(S)) {
            sim_seq_t **pp = &m->pend_head, *prev = NULL;
            while (*pp) {
                sim_seq_t *s = *pp;
                if (!dl_late(S, mi, s, ahead, wait)) {
                    ahead++;
                    prev = s;
                    pp = &s->next;
                    continue;
                }
                *pp = s->next;
                if (m->pend_tail == s)
                    m->pend_tail = prev;
                m->n_pend--;
                dl_refuse(S, s);
            }
            continue;
        }
        for (sched_item_t *it = sched_peek(S->sched, mi), *next; it; it = next) {
            next = it->next;
            if (!dl_late(S, mi, it->user, ahead, wait)) {
                ahead++;
                continue;
            }
            sched_remove(S->sched, it);
            dl_refuse(S, it->user);
        }
    }
}

static double vhost_wake(const sim_t *S)
{
    return S->in_flight ? S->wake : INFINITY;
}

/* Request s arrives at S at virtual time t (the arrivals of a round are
 * submitted before it, as the worker drains its inbox). */
static int vhost_submit(sim_t *S, sim_seq_t *s, double t, size_t *rejected, char *err,
                        size_t errlen)
{
    if (S->in_flight == 0 || !S->firm)
        vb_advance_to(S->vb, t); /* an idle or napping host wakes for it */
    int lm = vhost_model(S, s->rq->model, err, errlen);
    if (lm < 0)
        return SIM_ERR_SETUP;
    s->host = S;
    s->item.model = lm;
    S->in_flight++;
    /* submit_gen: a prompt plus max_tokens past the context is refused */
    int refuse = (uint64_t)s->rq->prompt + s->rq->output > S->m[lm]->ctx;
    if (!refuse && dl_drops(S) &&
        dl_late(S, lm, s, pol_pending(S) ? S->m[lm]->n_pend : sched_queued(S->sched, lm),
                dl_wait(S, lm))) {
        dl_refuse(S, s); /* on arrival, before it is queued */
        (*rejected)++;
        if (!S->firm || S->in_flight == 0)
            S->wake = now(S);
        return SIM_OK;
    }
    if (S->pol == SIM_POL_LRU)
        S->gq_n = (size_t)(s - S->seqs) + 1;
    if (!refuse && S->pol == SIM_POL_LRU_BATCH) {
        vmodel_t *m = S->m[lm];
        s->next = NULL;
        if (m->pend_tail)
            m->pend_tail->next = s;
        else
            m->pend_head = s;
        m->pend_tail = s;
        m->n_pend++;
    }
    if (!refuse && !pol_pending(S) && sched_submit(S->sched, &s->item) != SCHED_OK)
        refuse = 1;
    if (refuse) {
        s->state = SEQ_FAILED;
        s->t_done = now(S);
        S->in_flight--;
        S->failed++;
        (*rejected)++;
    }
    if (!S->firm || S->in_flight == 0)
        S->wake = now(S);
    return SIM_OK;
}

/* One round of S at its wake time; sets when the next one is due. */
static void vhost_round(sim_t *S)
{
    const sim_cfg_t *c = S->c;
    vb_advance_to(S->vb, S->wake);
    vb_advance(S->vb, c->cost.t_round_s);
    if (dl_drops(S))
        dl_sweep(S);
    double nap = INFINITY;
    int stepped = S->pol == SIM_POL_LRU         ? round_lru(S)
                  : S->pol == SIM_POL_LRU_BATCH ? round_lrub(S)
                                                : round_sched(S, &nap);
    S->firm = 0;
    if (stepped) {
        S->wake = now(S);
        return;
    }
    /* nothing stepped: wait until a page-in may land (or an arrival) */
    S->wake = INFINITY;
    if (isfinite(nap)) {
        S->wake = now(S) + (nap > 0 ? nap : c->cost.t_round_s);
        S->firm = nap <= 0;
    }
    if (pol_pending(S) && any_loading(S)) {
        double tail = vb_copy_tail(S->vb);
        if (tail > now(S) && tail < S->wake)
            S->wake = tail;
        else if (!isfinite(S->wake))
            S->wake = now(S), S->firm = 1; /* the load has landed: the next round dispatches */
    }
}

/* A tournament tree over the hosts' next rounds: node 1 holds the earliest
 * (the lowest host index among equals); leaves are P + host. */
typedef struct wake_tree {
    int P;     /* leaves, a power of two >= hosts */
    double *w; /* 2P: wake times (INFINITY past the hosts) */
    int *h;    /* 2P: the host each node's time is from */
} wake_tree_t;

static int wake_tree_init(wake_tree_t *t, int n_hosts)
{
    t->P = 1;
    while (t->P < n_hosts)
        t->P *= 2;
    t->w = malloc(2 * (size_t)t->P * sizeof *t->w);
    t->h = malloc(2 * (size_t)t->P * sizeof *t->h);
    if (!t->w || !t->h)
        return -1;
    for (int i = 0; i < 2 * t->P; i++) {
        t->w[i] = INFINITY;
        t->h[i] = i >= t->P ? i - t->P : 0;
    }
    return 0;
}

static void wake_tree_set(wake_tree_t *t, int host, double w)
{
    int i = t->P + host;
    t->w[i] = w;
    for (i /= 2; i >= 1; i /= 2) {
        int l = 2 * i, r = l + 1;
        int pick = t->w[r] < t->w[l] ? r : l;
        t->w[i] = t->w[pick];
        t->h[i] = t->h[pick];
    }
}

/* Adds host S's prefix cache and host tier counters to out. */
static void pfx_result(const sim_t *S, sim_result_t *out)
{
    out->prompt_tokens += S->prompt_tokens;
    out->prefill_tokens += S->prefill_tokens;
    if (!S->pfx)
        return;
    const spfx_stats_t *st = spfx_stats(S->pfx);
    out->pfx_hits += st->hits;
    out->pfx_hit_tokens += st->hit_tokens;
    out->kv_demotions += st->demotions;
    out->kv_device_drops += st->device_drops;
    out->kv_host_drops += st->host_drops;
    out->kv_restores += st->restores;
    out->kv_restore_tokens += st->restore_tokens;
    out->kv_host_recomputes += st->host_recomputes;
}

static int run_hosts(const sim_cfg_t *c, sim_policy_t pol, const sim_hosts_t *hs,
                     const wl_req_t *reqs, size_t n, sim_result_t *out, char *err, size_t errlen)
{
    int H = hs ? hs->n_hosts : 1;
    sim_fleet_t F_ = {.c = c, .n_hosts = H}, *F = &F_;
    sim_seq_t *seqs = calloc(n ? n : 1, sizeof *seqs);
    F->h = calloc((size_t)H, sizeof *F->h);
    double *ttft = malloc((n ? n : 1) * sizeof *ttft), *e2e = malloc((n ? n : 1) * sizeof *e2e);
    wake_tree_t wt = {0};
    int rc = SIM_ERR_NOMEM;
    if (!seqs || !F->h || !ttft || !e2e || wake_tree_init(&wt, H)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int h = 0; h < H; h++)
        if (!(F->h[h] = vhost_new(c, pol, seqs, err, errlen))) {
            rc = SIM_ERR_ARG;
            goto fail;
        }
    /* one host serves every model from the start, in model order (as the
     * daemon's config lists them); fleet hosts take a model on its first request */
    if (!hs)
        for (int i = 0; i < c->n_models; i++)
            if (vhost_model(F->h[0], i, err, errlen) < 0) {
                rc = SIM_ERR_SETUP;
                goto fail;
            }
    for (size_t i = 0; i < n; i++) {
        seqs[i].rq = &reqs[i];
        seqs[i].item.model = reqs[i].model;
        seqs[i].item.t_arrival = reqs[i].t;
        seqs[i].item.user = &seqs[i];
    }
    double t0 = n ? reqs[0].t : 0;
    for (int h = 0; h < H; h++)
        vb_advance_to(F->h[h]->vb, t0);
    /* one event loop over every host in virtual time: the earliest round
     * next, an arrival before any round due at the same time */
    size_t next = 0, rejected = 0;
    for (;;) {
        double wmin = wt.w[1];
        int hmin = isfinite(wmin) ? wt.h[1] : -1;
        if (next < n && reqs[next].t <= wmin) {
            int h = hs ? hs->route(hs->route_ctx, F, &reqs[next]) : 0;
            if (h < 0 || h >= H) {
                snprintf(err, errlen, "request %zu routed to no host (%d)", next, h);
                rc = SIM_ERR_ARG;
                goto fail;
            }
            if ((rc = vhost_submit(F->h[h], &seqs[next], reqs[next].t, &rejected, err, errlen)))
                goto fail;
            wake_tree_set(&wt, h, vhost_wake(F->h[h]));
            next++;
            continue;
        }
        if (hmin >= 0) {
            vhost_round(F->h[hmin]);
            if (F->h[hmin]->inconsistent) {
                snprintf(err, errlen,
                         "%s: host %d: a model's active sequences and their count "
                         "disagree at t = %.3f s",
                         sim_policy_name(pol), hmin, now(F->h[hmin]));
                rc = SIM_ERR_STUCK;
                goto fail;
            }
            wake_tree_set(&wt, hmin, vhost_wake(F->h[hmin]));
            continue;
        }
        size_t left = 0;
        for (int h = 0; h < H; h++)
            left += F->h[h]->in_flight;
        if (left == 0)
            break;
        for (int h = 0; h < H; h++)
            if (F->h[h]->in_flight) {
                snprintf(err, errlen, "%s: host %d stuck with %zu requests in flight at t = %.3f s",
                         sim_policy_name(pol), h, F->h[h]->in_flight, now(F->h[h]));
                break;
            }
        rc = SIM_ERR_STUCK;
        goto fail;
    }
    /* results */
    memset(out, 0, sizeof *out);
    out->requests = n;
    size_t k = 0, slo = 0;
    double t_end = t0;
    for (size_t i = 0; i < n; i++) {
        const sim_seq_t *s = &seqs[i];
        if (c->dump)
            fprintf(c->dump, "%s,%zu,%d,%.6f,%u,%u,%s,%.6f,%.6f,%d\n", sim_policy_name(pol), i,
                    s->rq->model, s->rq->t, s->rq->prompt, s->rq->output,
                    s->state == SEQ_DONE ? "done"
                    : s->refused         ? "refused"
                                         : "failed",
                    s->t_first - s->rq->t, s->t_done - s->rq->t, s->swapped);
        if (s->state != SEQ_DONE)
            continue;
        ttft[k] = s->t_first - s->rq->t;
        e2e[k] = s->t_done - s->rq->t;
        slo += ttft[k] < c->slo_ttft_s;
        if (s->t_done > t_end)
            t_end = s->t_done;
        k++;
    }
    out->completed = k;
    qsort(ttft, k, sizeof *ttft, cmp_double);
    qsort(e2e, k, sizeof *e2e, cmp_double);
    out->ttft_p50 = quantile(ttft, k, 0.5);
    out->ttft_p99 = quantile(ttft, k, 0.99);
    out->adm_ttft_p99 = out->ttft_p99;
    size_t r = 0;
    for (int h = 0; h < H; h++)
        r += F->h[h]->refused;
    if (r) { /* the refused count as misses: no first token ever */
        for (size_t i = 0; i < r; i++)
            ttft[k + i] = INFINITY;
        out->ttft_p99 = quantile(ttft, k + r, 0.99);
    }
    out->refused = r;
    out->ttft_max = k ? ttft[k - 1] : NAN;
    out->e2e_p50 = quantile(e2e, k, 0.5);
    out->e2e_p99 = quantile(e2e, k, 0.99);
    out->e2e_max = k ? e2e[k - 1] : NAN;
    out->slo_frac = n ? (double)slo / (double)n : NAN;
    out->makespan_s = t_end - t0;
    out->pool_pages = c->pool_bytes / c->page_size;
    out->belady_k = belady_k(c);
    double busy = 0, copy = 0;
    for (int h = 0; h < H; h++) {
        sim_t *S = F->h[h];
        for (int i = 0; i < S->n_m; i++) {
            stats_res_t st;
            model_stats(S, S->m[i], &st);
            out->page_ins += st.total_page_ins;
            out->bytes_in += st.total_bytes_in;
            out->preempted += st.evictions_preemption;
        }
        vb_stats_t vs;
        vb_get_stats(S->vb, &vs);
        out->failed += S->failed;
        out->recomputes += S->recomputes;
        out->steps += S->steps;
        out->lora_loads += S->lora_loads;
        out->model_loads += S->loads;
        busy += S->busy_s;
        copy += vs.copy_busy_s;
        if (vs.max_mapped > out->max_mapped_pages)
            out->max_mapped_pages = vs.max_mapped;
        out->violations += vs.violations + (vs.max_mapped > out->pool_pages);
        out->host_blocks += vs.host_blocks;
        out->kv_d2h_bytes += vs.d2h_bytes;
        pfx_result(S, out);
        out->active_left += S->n_active;
        for (int i = 0; i < S->n_m; i++)
            out->active_left += S->m[i]->n_active;
        out->belady_own += sim_belady(S->uses, S->n_uses, S->n_m, out->belady_k);
    }
    double span = out->makespan_s * H;
    out->gpu_busy = span > 0 ? busy / span : 0;
    out->copy_busy = span > 0 ? copy / span : 0;
    rc = SIM_OK;
fail:
    for (size_t i = 0; seqs && i < n; i++)
        if (seqs[i].kv) {
            restore_cancel(seqs[i].host, &seqs[i]);
            res_kv_free(seqs[i].host->res, seqs[i].kv);
        }
    for (int h = 0; F->h && h < H; h++)
        vhost_free(F->h[h]);
    free(F->h);
    free(wt.w);
    free(wt.h);
    free(seqs);
    free(ttft);
    free(e2e);
    return rc;
}

static int check_run(const sim_cfg_t *c, sim_policy_t pol, const wl_req_t *reqs, size_t n,
                     char *err, size_t errlen)
{
    if (c->n_models < 1 || c->max_batch < 1 || pol >= SIM_POL_COUNT ||
        (!c->models && (c->shape.n_head == 0 || c->shape.n_layer == 0))) {
        snprintf(err, errlen, "bad simulator configuration");
        return SIM_ERR_ARG;
    }
    if (c->models && sim_models_page_size(c->models) != c->page_size) {
        snprintf(err, errlen, "the models were laid out for %zu-byte pages, the device has %zu",
                 sim_models_page_size(c->models), c->page_size);
        return SIM_ERR_ARG;
    }
    if (c->lora_n && (c->models || c->lora_bytes <= 0 ||
                      (pol == SIM_POL_LORA_SLOTS && (!c->lru_batch_n || c->cost.h2d_bw <= 0)))) {
        snprintf(err, errlen,
                 "LoRA adapters need model shapes (no GGUF files), and lora-slots slots");
        return SIM_ERR_ARG;
    }
    if (pol == SIM_POL_LORA_SLOTS && !c->lora_n) {
        snprintf(err, errlen, "lora-slots needs LoRA adapters");
        return SIM_ERR_ARG;
    }
    for (size_t i = 0; i < n; i++)
        if (c->lora_n && (reqs[i].adapter > c->lora_n || (reqs[i].adapter && reqs[i].model))) {
            snprintf(err, errlen, "request %zu: bad adapter", i);
            return SIM_ERR_ARG;
        }
    for (size_t i = 0; i < n; i++)
        if (reqs[i].model < 0 || reqs[i].model >= c->n_models || reqs[i].prompt == 0 ||
            reqs[i].output == 0 || (i && reqs[i].t < reqs[i - 1].t)) {
            snprintf(err, errlen, "request %zu: bad model, length or order", i);
            return SIM_ERR_ARG;
        }
    return SIM_OK;
}

int sim_run(const sim_cfg_t *c, sim_policy_t pol, const wl_req_t *reqs, size_t n, sim_result_t *out,
            char *err, size_t errlen)
{
    int rc = check_run(c, pol, reqs, n, err, errlen);
    if (rc)
        return rc;
    if (pol == SIM_POL_BELADY) {
        belady_only(c, reqs, n, out);
        return SIM_OK;
    }
    return run_hosts(c, pol, NULL, reqs, n, out, err, errlen);
}

int sim_run_fleet(const sim_cfg_t *c, sim_policy_t pol, const sim_hosts_t *hs, const wl_req_t *reqs,
                  size_t n, sim_result_t *out, char *err, size_t errlen)
{
    int rc = check_run(c, pol, reqs, n, err, errlen);
    if (rc)
        return rc;
    if (!hs || hs->n_hosts < 1 || !hs->route || (pol != SIM_POL_DEFAULT && pol != SIM_POL_FIFO)) {
        snprintf(err, errlen, "a fleet needs hosts, a router and the default or fifo policy");
        return SIM_ERR_ARG;
    }
    return run_hosts(c, pol, hs, reqs, n, out, err, errlen);
}

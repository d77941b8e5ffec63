/* forward: the transformer forward pass for a batch of sequences of one model, as a sequence of backend kernels. */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/moe.h"

/* Rows [r0, r0 + n) of a step, all of sequences of adapter lw. */
typedef struct fwd_lseg {
    size_t r0, n;
    const lora_weights_t *lw;
} fwd_lseg_t;

/* Mixture-of-experts host state (reserve_moe_host): cap_host tokens a pass. */
typedef struct fwd_moe {
    float *rl_host;                /* host (cap_host, cap_route) copy of the router logits */
    uint32_t *sel;                 /* host (cap_tok, k): the selected experts */
    float *w;                      /* host (cap_tok, k) their weights; (cap_tok) the shared gates */
    uint32_t *rows;                /* host (cap_tok): the shared expert's slot rows */
    float *sh_w;                   /* host (cap_tok) */
    size_t cap_host, cap_r, cap_k; /* tokens, router columns and slots they are sized for */
    moe_plan_t plan;
    uint64_t reads; /* expert matrices read (one per selected expert, layer and pass) */
    uint8_t *used;  /* (n_layer, n_expert) flags of the last step */
    size_t used_cap;
} fwd_moe_t;

struct fwd {
    const backend_t *be;
    uint32_t chunk; /* most tokens one pass over the layers takes; 0 = all */
    size_t cap_tok, cap_out, cap_width, cap_ff, cap_vocab;
    size_t cap_route, cap_slots; /* MoE: router columns, expert-output slots per token */
    size_t n_host;               /* entries of the host arrays */
    size_t scratch, peak;        /* device scratch bytes allocated now, and the most ever */
    /* device scratch, (cap_tok, width) unless noted */
    float *x, *xb, *q, *k, *v, *att;
    float *hb, *hb2; /* (cap_tok, cap_ff) */
    float *fin;      /* (cap_out, width) last hidden state of the rows returned */
    float *out;      /* (cap_out, cap_vocab) logits of the rows returned */
    float *rl;       /* MoE (cap_tok, cap_route): router logits, qwen2moe's shared gate last */
    float *ys;       /* MoE (cap_tok * cap_slots, width): each token's weighted expert outputs */
    /* host, n_host entries: the whole step's tokens */
    be_tok_t *toks;
    uint32_t *pos, *sel;
    int32_t *ids;
    fwd_moe_t moe;
    /* LoRA: the step's runs of consecutive sequences of one adapter, and device scratch for
     * their products: la (cap_ltok, cap_lrank) = A x, lb (cap_ltok, cap_lw) = B (A x) */
    fwd_lseg_t *lsegs;
    be_lora_t *ljobs; /* cap_lsegs: one backend call's jobs (be->lora_mm) */
    size_t n_lsegs, cap_lsegs;
    float *la, *lb;
    size_t cap_ltok, cap_lrank, cap_lw;
    size_t lscratch; /* their bytes (fwd_scratch_bytes adds them) */
};

fwd_t *fwd_new(const backend_t *be)
{
    fwd_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->be = be;
    f->chunk = FWD_CHUNK_DEFAULT;
    return f;
}

void fwd_set_chunk(fwd_t *f, uint32_t tokens)
{
    f->chunk = tokens;
}

size_t fwd_scratch_bytes(const fwd_t *f)
{
    return f->scratch + f->lscratch;
}

size_t fwd_scratch_peak(const fwd_t *f)
{
    return f->peak;
}

/* Row width of the activation buffers: the model width or the attention
 * width (n_head * head_dim, wider when attention.key_length says so). */
static size_t act_width(const model_hparams_t *hp)
{
    size_t att = (size_t)hp->n_head * hp->head_dim;
    return att > hp->n_embd ? att : hp->n_embd;
}

/* The FFN's activation width: n_ff, or a MoE model's widest expert. */
static size_t ffn_width(const model_hparams_t *hp)
{
    if (!hp->n_expert)
        return hp->n_ff;
    return hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
}

/* MoE: router logits per token (the shared expert's gate too) and expert
 * outputs per token (the shared expert's too); 0 for a dense model. */
static size_t route_cols(const model_hparams_t *hp)
{
    return hp->n_expert ? hp->n_expert + (hp->n_ff_shexp != 0) : 0;
}

static size_t slot_rows(const model_hparams_t *hp)
{
    return hp->n_expert ? hp->n_expert_used + (hp->n_ff_shexp != 0) : 0;
}

/* The one formula for scratch bytes: six (tokens, width) activations, two
 * (tokens, ff), the returned rows' hidden states and logits, and for MoE the
 * router logits (tokens, r) and expert-output slots (tokens * sl, width). */
static size_t dims_bytes(size_t nt, size_t no, size_t w, size_t ff, size_t nv, size_t r, size_t sl)
{
    return (6 * nt * w + 2 * nt * ff + no * w + no * nv + nt * r + nt * sl * w) * sizeof(float);
}

size_t fwd_scratch_need(const model_hparams_t *hp, size_t n_tok, size_t n_out)
{
    return dims_bytes(n_tok, n_out, act_width(hp), ffn_width(hp), hp->n_vocab, route_cols(hp),
                      slot_rows(hp));
}

uint32_t fwd_chunk_tokens(const fwd_t *f, size_t n_tok)
{
    return (uint32_t)(f->chunk && n_tok > f->chunk ? f->chunk : n_tok);
}

static size_t max_sz(size_t a, size_t b)
{
    return a > b ? a : b;
}

size_t fwd_scratch_after(const fwd_t *f, const model_hparams_t *hp, size_t n_tok, size_t n_out)
{
    return dims_bytes(max_sz(fwd_chunk_tokens(f, n_tok), f->cap_tok),
                      max_sz(n_out ? n_out : 1, f->cap_out), max_sz(act_width(hp), f->cap_width),
                      max_sz(ffn_width(hp), f->cap_ff), max_sz(hp->n_vocab, f->cap_vocab),
                      max_sz(route_cols(hp), f->cap_route), max_sz(slot_rows(hp), f->cap_slots));
}

static void free_dev(fwd_t *f)
{
    const backend_t *be = f->be;
    float **dev[] = {&f->x,  &f->xb,  &f->q,   &f->k,   &f->v,  &f->att,
                     &f->hb, &f->hb2, &f->fin, &f->out, &f->rl, &f->ys};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        if (*dev[i])
            be->buf_free(be->ctx, *dev[i]);
        *dev[i] = NULL;
    }
    f->cap_tok = f->cap_out = f->cap_width = f->cap_ff = f->cap_vocab = 0;
    f->cap_route = f->cap_slots = 0;
    f->scratch = 0;
}

static void free_host(fwd_t *f)
{
    free(f->toks);
    free(f->pos);
    free(f->sel);
    free(f->ids);
    f->toks = NULL;
    f->pos = f->sel = NULL;
    f->ids = NULL;
    f->n_host = 0;
}

static void free_moe_host(fwd_moe_t *m)
{
    free(m->rl_host);
    free(m->sel);
    free(m->w);
    free(m->rows);
    free(m->sh_w);
    m->rl_host = m->w = m->sh_w = NULL;
    m->sel = m->rows = NULL;
    m->cap_host = m->cap_r = m->cap_k = 0;
}

/* MoE host arrays for passes of n_tok tokens, and the step's expert flags. */
static int reserve_moe_host(fwd_t *f, const model_hparams_t *hp, size_t n_tok)
{
    fwd_moe_t *m = &f->moe;
    size_t used = (size_t)hp->n_layer * hp->n_expert;
    if (used > m->used_cap) {
        uint8_t *u = calloc(used, 1);
        if (!u)
            return -1;
        free(m->used);
        m->used = u;
        m->used_cap = used;
    }
    memset(m->used, 0, m->used_cap);
    if (n_tok <= m->cap_host && route_cols(hp) <= m->cap_r && slot_rows(hp) <= m->cap_k)
        return 0;
    free_moe_host(m);
    size_t r = f->cap_route, k = f->cap_slots; /* reserve() made these fit hp */
    n_tok = max_sz(n_tok, f->cap_tok);
    int ok = (m->rl_host = malloc(n_tok * r * sizeof *m->rl_host)) != NULL;
    ok = ok && (m->sel = malloc(n_tok * k * sizeof *m->sel)) != NULL;
    ok = ok && (m->w = malloc(n_tok * k * sizeof *m->w)) != NULL;
    ok = ok && (m->rows = malloc(n_tok * sizeof *m->rows)) != NULL;
    ok = ok && (m->sh_w = malloc(n_tok * sizeof *m->sh_w)) != NULL;
    if (!ok) {
        free_moe_host(m);
        return -1;
    }
    m->cap_host = n_tok;
    m->cap_r = r;
    m->cap_k = k;
    return 0;
}

uint64_t fwd_expert_reads(const fwd_t *f)
{
    return f->moe.reads;
}

const uint8_t *fwd_experts_used(const fwd_t *f)
{
    return f->moe.used;
}

static void free_lora(fwd_t *f)
{
    const backend_t *be = f->be;
    if (f->la)
        be->buf_free(be->ctx, f->la);
    if (f->lb)
        be->buf_free(be->ctx, f->lb);
    f->la = f->lb = NULL;
    f->lscratch = 0;
    f->cap_ltok = f->cap_lrank = f->cap_lw = 0;
}

size_t fwd_lora_scratch(const fwd_t *f, const model_hparams_t *hp, size_t n_tok, uint32_t rank_max)
{
    if (!rank_max)
        return 0;
    size_t nt = max_sz(fwd_chunk_tokens(f, n_tok), f->cap_ltok);
    size_t w = max_sz(max_sz(act_width(hp), ffn_width(hp)), f->cap_lw);
    return nt * (max_sz(rank_max, f->cap_lrank) + w) * sizeof(float);
}

/* LoRA scratch for passes of n_tok tokens with pairs of rank up to rank (grown on demand, never
 * shrunk), and room for a segment per sequence. */
static int reserve_lora(fwd_t *f, const model_hparams_t *hp, size_t n_tok, uint32_t rank,
                        int n_seqs)
{
    if ((size_t)n_seqs > f->cap_lsegs) {
        fwd_lseg_t *sg = realloc(f->lsegs, (size_t)n_seqs * sizeof *sg);
        if (sg)
            f->lsegs = sg;
        be_lora_t *jb = sg ? realloc(f->ljobs, (size_t)n_seqs * sizeof *jb) : NULL;
        if (!jb)
            return -1;
        f->ljobs = jb;
        f->cap_lsegs = (size_t)n_seqs;
    }
    size_t w = max_sz(act_width(hp), ffn_width(hp));
    if (n_tok <= f->cap_ltok && rank <= f->cap_lrank && w <= f->cap_lw)
        return 0;
    size_t nt = max_sz(n_tok, f->cap_ltok), r = max_sz(rank, f->cap_lrank);
    w = max_sz(w, f->cap_lw);
    free_lora(f);
    const backend_t *be = f->be;
    if (!(f->la = be->buf_alloc(be->ctx, nt * r * sizeof(float))) ||
        !(f->lb = be->buf_alloc(be->ctx, nt * w * sizeof(float)))) {
        free_lora(f);
        return -1;
    }
    f->cap_ltok = nt;
    f->cap_lrank = r;
    f->cap_lw = w;
    f->lscratch = nt * (r + w) * sizeof(float);
    if (f->scratch + f->lscratch > f->peak)
        f->peak = f->scratch + f->lscratch;
    return 0;
}

void fwd_free(fwd_t *f)
{
    if (!f)
        return;
    free_lora(f);
    free(f->lsegs);
    free(f->ljobs);
    free_dev(f);
    free_host(f);
    free_moe_host(&f->moe);
    moe_plan_free(&f->moe.plan);
    free(f->moe.used);
    free(f);
}

/* Host arrays for a step of n_tok tokens. */
static int reserve_host(fwd_t *f, size_t n_tok)
{
    if (n_tok <= f->n_host)
        return 0;
    free_host(f);
    int ok = (f->toks = malloc(n_tok * sizeof *f->toks)) != NULL;
    ok = ok && (f->pos = malloc(n_tok * sizeof *f->pos)) != NULL;
    ok = ok && (f->sel = malloc(n_tok * sizeof *f->sel)) != NULL;
    ok = ok && (f->ids = malloc(n_tok * sizeof *f->ids)) != NULL;
    if (!ok) {
        free_host(f);
        return -1;
    }
    f->n_host = n_tok;
    return 0;
}

/* Device scratch for passes of n_tok tokens returning n_out rows of logits:
 * grown on demand, never shrunk. */
static int reserve(fwd_t *f, const model_hparams_t *hp, size_t n_tok, size_t n_out)
{
    size_t width = act_width(hp), ffw = ffn_width(hp), rc = route_cols(hp), sr = slot_rows(hp);
    if (n_out == 0)
        n_out = 1;
    if (n_tok <= f->cap_tok && n_out <= f->cap_out && width <= f->cap_width && ffw <= f->cap_ff &&
        hp->n_vocab <= f->cap_vocab && rc <= f->cap_route && sr <= f->cap_slots)
        return 0;
    size_t nt = max_sz(n_tok, f->cap_tok), no = max_sz(n_out, f->cap_out);
    size_t w = max_sz(width, f->cap_width), ff = max_sz(ffw, f->cap_ff);
    size_t nv = max_sz(hp->n_vocab, f->cap_vocab);
    size_t r = max_sz(rc, f->cap_route), sl = max_sz(sr, f->cap_slots);
    free_dev(f);
    const backend_t *be = f->be;
    float **dev[] = {&f->x, &f->xb, &f->q, &f->k, &f->v, &f->att};
    int ok = 1;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        ok = ok && (*dev[i] = be->buf_alloc(be->ctx, nt * w * sizeof(float))) != NULL;
    ok = ok && (f->hb = be->buf_alloc(be->ctx, nt * ff * sizeof(float))) != NULL;
    ok = ok && (f->hb2 = be->buf_alloc(be->ctx, nt * ff * sizeof(float))) != NULL;
    ok = ok && (f->fin = be->buf_alloc(be->ctx, no * w * sizeof(float))) != NULL;
    ok = ok && (f->out = be->buf_alloc(be->ctx, no * nv * sizeof(float))) != NULL;
    ok = ok && (!r || (f->rl = be->buf_alloc(be->ctx, nt * r * sizeof(float))) != NULL);
    ok = ok && (!sl || (f->ys = be->buf_alloc(be->ctx, nt * sl * w * sizeof(float))) != NULL);
    if (!ok) {
        free_dev(f);
        return -1;
    }
    f->cap_tok = nt;
    f->cap_out = no;
    f->cap_width = w;
    f->cap_ff = ff;
    f->cap_vocab = nv;
    f->cap_route = r;
    f->cap_slots = sl;
    f->scratch = dims_bytes(nt, no, w, ff, nv, r, sl);
    if (f->scratch + f->lscratch > f->peak)
        f->peak = f->scratch + f->lscratch;
    return 0;
}

/* Runs one backend call; on failure records which kernel failed. */
#define BE_CALL(op, ...)                                                                           \
    do {                                                                                           \
        int rc_ = be->op(be->ctx, __VA_ARGS__);                                                    \
        if (rc_) {                                                                                 \
            snprintf(err, errlen, "%s backend: %s failed (%d)", be->name, #op, rc_);               \
            return rc_ == BE_ERR_NOMEM ? FWD_ERR_NOMEM : FWD_ERR_DEVICE;                           \
        }                                                                                          \
    } while (0)

/* Per-head RMSNorm (qwen3, gemma3 q/k norms): each token's n_heads heads of hd
 * values are rows of the backend's rmsnorm, one call per token. */
static int head_norm(const backend_t *be, float *v, const model_weight_t *w, size_t n_tok,
                     size_t stride, uint32_t n_heads, uint32_t hd, float eps, char *err,
                     size_t errlen)
{
    for (size_t t = 0; t < n_tok; t++) {
        float *row = v + t * stride;
        BE_CALL(rmsnorm, row, row, w->data, n_heads, hd, hd, eps);
    }
    return 0;
}

/* The attention window of layer l: the sliding window on SWA layers (all
 * but every swa_pattern-th), else 0 (every position). */
static uint32_t layer_window(const model_hparams_t *hp, uint32_t l)
{
    if (!hp->swa_window || (hp->swa_pattern && (l + 1) % hp->swa_pattern == 0))
        return 0;
    return hp->swa_window;
}

static int wait_seg(const fwd_hooks_t *h, uint32_t seg, char *err, size_t errlen)
{
    if (!h || !h->wait)
        return 0;
    int rc = h->wait(h->ctx, seg);
    if (rc) {
        snprintf(err, errlen, "segment %u did not become resident (%d)", seg, rc);
        return FWD_ERR_DEVICE;
    }
    return 0;
}

static int validate(const model_hparams_t *hp, const fwd_seq_t *seqs, int n_seqs, size_t *n_tok,
                    char *err, size_t errlen)
{
    if (n_seqs <= 0) {
        snprintf(err, errlen, "empty batch");
        return FWD_ERR_ARG;
    }
    *n_tok = 0;
    for (int s = 0; s < n_seqs; s++) {
        const fwd_seq_t *sq = &seqs[s];
        if (!sq->kv || sq->n_tokens == 0 || !sq->tokens) {
            snprintf(err, errlen, "sequence %d has no tokens or no KV cache", s);
            return FWD_ERR_ARG;
        }
        if (sq->kv->n_layer != hp->n_layer || sq->kv->kv_dim != hp->n_head_kv * hp->head_dim) {
            snprintf(err, errlen, "sequence %d: KV cache shaped for another model", s);
            return FWD_ERR_ARG;
        }
        if (sq->kv->type != seqs[0].kv->type) {
            snprintf(err, errlen,
                     "sequence %d: KV cache is %s, sequence 0's is %s (one type per step)", s,
                     kv_type_name(sq->kv->type), kv_type_name(seqs[0].kv->type));
            return FWD_ERR_ARG;
        }
        if ((uint64_t)sq->kv->n_past + sq->n_tokens > sq->kv->n_ctx) {
            snprintf(err, errlen, "sequence %d: %u + %u tokens exceed the context of %u", s,
                     sq->kv->n_past, sq->n_tokens, sq->kv->n_ctx);
            return FWD_ERR_CONTEXT;
        }
        for (uint32_t i = 0; i < sq->n_tokens; i++) {
            if (sq->tokens[i] < 0 || (uint32_t)sq->tokens[i] >= hp->n_vocab) {
                snprintf(err, errlen, "sequence %d: token id %d outside vocabulary of %u", s,
                         sq->tokens[i], hp->n_vocab);
                return FWD_ERR_TOKEN;
            }
        }
        *n_tok += sq->n_tokens;
    }
    return 0;
}

/* y (stride ys) += scale B (A x) over the chunk's rows [t0, t0 + nt) of x (stride xs), for each
 * adapter segment in them with a pair on target tg of layer l: A x into f->la, B (A x) into f->lb
 * (stride ys), scaled, added; llama.cpp's order of operations. */
static int lora_add(fwd_t *f, uint32_t l, lora_target_t tg, const float *x, size_t xs, float *y,
                    size_t ys, size_t t0, size_t nt, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    int nj = 0;
    for (size_t i = 0; i < f->n_lsegs; i++) {
        const fwd_lseg_t *sg = &f->lsegs[i];
        size_t a = max_sz(sg->r0, t0), b = sg->r0 + sg->n < t0 + nt ? sg->r0 + sg->n : t0 + nt;
        const lora_pair_t *p = a < b ? lora_pair(sg->lw, l, tg) : NULL;
        if (!p)
            continue;
        size_t n = b - a, r = a - t0;
        if (be->lora_mm) { /* one call for them all */
            f->ljobs[nj++] = (be_lora_t){&p->a, &p->b, p->scale, r, n};
            continue;
        }
        be_mm_t ja = {&p->a, f->la, f->cap_lrank};
        BE_CALL(matmul, &ja, 1, x + r * xs, xs, n);
        be_mm_t jb = {&p->b, f->lb, ys};
        BE_CALL(matmul, &jb, 1, f->la, f->cap_lrank, n);
        BE_CALL(scale, f->lb, n, p->b.n_out, ys, p->scale);
        BE_CALL(add, y + r * ys, f->lb, n, p->b.n_out, ys);
    }
    if (nj)
        BE_CALL(lora_mm, f->ljobs, nj, x, xs, y, ys);
    return 0;
}

/* lora_add where the step has adapters (returns from the caller on failure). */
#define LORA_ADD(...)                                                                              \
    do {                                                                                           \
        int lrc_ = f->n_lsegs ? lora_add(f, __VA_ARGS__, err, errlen) : 0;                         \
        if (lrc_)                                                                                  \
            return lrc_;                                                                           \
    } while (0)

/* The dense FFN of f->xb's nt rows (normed), added into the residual f->x. */
static int ffn_dense(fwd_t *f, const model_hparams_t *hp, const model_layer_t *L, uint32_t l,
                     size_t t0, size_t nt, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    const uint32_t d = hp->n_embd, ff = hp->n_ff;
    const size_t W = f->cap_width, FF = f->cap_ff;
    be_mm_t gu[2] = {{&L->w_gate, f->hb, FF}, {&L->w_up, f->hb2, FF}};
    BE_CALL(matmul, gu, 2, f->xb, W, nt);
    LORA_ADD(l, LORA_GATE, f->xb, W, f->hb, FF, t0, nt);
    LORA_ADD(l, LORA_UP, f->xb, W, f->hb2, FF, t0, nt);
    if (hp->gelu)
        BE_CALL(gelu_mul, f->hb, f->hb2, nt, ff, FF);
    else
        BE_CALL(silu_mul, f->hb, f->hb2, nt, ff, FF);
    be_mm_t dn = {&L->w_down, f->xb, W};
    BE_CALL(matmul, &dn, 1, f->hb, FF, nt);
    LORA_ADD(l, LORA_DOWN, f->hb, FF, f->xb, W, t0, nt);
    if (L->post_ffn_norm.data)
        BE_CALL(rmsnorm, f->xb, f->xb, L->post_ffn_norm.data, nt, d, W, hp->rms_eps);
    BE_CALL(add, f->x, f->xb, nt, d, W);
    return 0;
}

/* A SwiGLU FFN (gate, up, down) of n rows of x (stride W) into out (stride W). */
static int ffn_swiglu(fwd_t *f, const model_weight_t *gate, const model_weight_t *up,
                      const model_weight_t *down, const float *x, size_t n, float *out, char *err,
                      size_t errlen)
{
    const backend_t *be = f->be;
    const size_t W = f->cap_width, FF = f->cap_ff;
    be_mm_t gu[2] = {{gate, f->hb, FF}, {up, f->hb2, FF}};
    BE_CALL(matmul, gu, 2, x, W, n);
    BE_CALL(silu_mul, f->hb, f->hb2, n, gate->n_out, FF);
    be_mm_t dn = {down, out, W};
    BE_CALL(matmul, &dn, 1, f->hb, FF, n);
    return 0;
}

/* The routed experts (and qwen2moe's shared one) of f->xb's nt rows (normed),
 * added into the residual f->x: the router's logits come to the host, each
 * token takes its top k (moe_route), and the tokens are grouped by expert so
 * each selected expert's matrices are read once for the pass (moe_plan): its
 * rows gathered into f->q, its output in f->k scattered, weighted, into the
 * tokens' slots of f->ys, which moe_sum adds to the residual in slot order
 * (llama.cpp's order: the experts by rank, then the shared expert). */
static int ffn_moe(fwd_t *f, const model_hparams_t *hp, const model_layer_t *L, uint32_t l,
                   size_t nt, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    fwd_moe_t *m = &f->moe;
    const uint32_t d = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    const size_t W = f->cap_width, R = route_cols(hp), S = slot_rows(hp);
    const int shexp = hp->n_ff_shexp != 0;
    be_mm_t r[2] = {{&L->gate_inp, f->rl, R}, {&L->gate_inp_shexp, f->rl + E, R}};
    BE_CALL(matmul, r, shexp ? 2 : 1, f->xb, W, nt);
    BE_CALL(download, m->rl_host, f->rl, nt * R * sizeof(float));
    for (size_t t = 0; t < nt; t++)
        moe_route(m->rl_host + t * R, E, K, hp->moe_norm_w, m->sel + t * K, m->w + t * K);
    int prc = moe_plan_build(&m->plan, m->sel, m->w, nt, K, E, (uint32_t)S);
    if (prc) {
        snprintf(err, errlen, "expert routing failed (%d)", prc);
        return prc == MOE_ERR_NOMEM ? FWD_ERR_NOMEM : FWD_ERR_ARG;
    }
    const moe_plan_t *p = &m->plan;
    int rc;
    for (uint32_t g = 0; g < p->n_groups; g++) {
        uint32_t e = p->expert[g], i0 = p->start[g], n = p->start[g + 1] - i0;
        model_weight_t gate = model_expert_view(&L->gate_exps, E, e);
        model_weight_t up = model_expert_view(&L->up_exps, E, e);
        model_weight_t down = model_expert_view(&L->down_exps, E, e);
        BE_CALL(gather, f->q, f->xb, p->tok + i0, n, d, W);
        if ((rc = ffn_swiglu(f, &gate, &up, &down, f->q, n, f->k, err, errlen)))
            return rc;
        BE_CALL(moe_scatter, f->ys, f->k, p->dst + i0, p->w + i0, n, d, W);
        m->reads++;
        m->used[(size_t)l * E + e] = 1;
    }
    if (shexp) {
        if ((rc = ffn_swiglu(f, &L->gate_shexp, &L->up_shexp, &L->down_shexp, f->xb, nt, f->k, err,
                             errlen)))
            return rc;
        for (size_t t = 0; t < nt; t++) {
            m->rows[t] = (uint32_t)(t * S + K);
            m->sh_w[t] = 1.0f / (1.0f + expf(-m->rl_host[t * R + E]));
        }
        BE_CALL(moe_scatter, f->ys, f->k, m->rows, m->sh_w, nt, d, W);
    }
    BE_CALL(moe_sum, f->x, f->ys, nt, (uint32_t)S, d, W);
    return 0;
}

/* One pass over the layers for tokens [t0, t0 + nt) of the step: their k/v
 * rows land in their caches, so a later chunk attends to them. The last
 * hidden state of each returned row in the chunk is kept in f->fin. */
static int run_chunk(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, kv_type_t kt,
                     size_t t0, size_t nt, const fwd_hooks_t *hooks, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    const uint32_t d = hp->n_embd, hd = hp->head_dim;
    const size_t W = f->cap_width;
    int rc;
    if ((rc = wait_seg(hooks, 0, err, errlen)))
        return rc;
    BE_CALL(embed, &w->tok_embd, f->ids + t0, nt, f->x, W);
    if (hp->emb_scale != 0.0f)
        BE_CALL(scale, f->x, nt, d, W, hp->emb_scale);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &w->layers[l];
        if ((rc = wait_seg(hooks, 1 + l, err, errlen)))
            return rc;
        BE_CALL(rmsnorm, f->xb, f->x, L->attn_norm.data, nt, d, W, hp->rms_eps);
        be_mm_t qkv[3] = {{&L->wq, f->q, W}, {&L->wk, f->k, W}, {&L->wv, f->v, W}};
        BE_CALL(matmul, qkv, 3, f->xb, W, nt);
        LORA_ADD(l, LORA_Q, f->xb, W, f->q, W, t0, nt);
        LORA_ADD(l, LORA_K, f->xb, W, f->k, W, t0, nt);
        LORA_ADD(l, LORA_V, f->xb, W, f->v, W, t0, nt);
        if (L->bq.data) {
            BE_CALL(add_bias, f->q, L->bq.data, nt, L->bq.n_in, W);
            BE_CALL(add_bias, f->k, L->bk.data, nt, L->bk.n_in, W);
            BE_CALL(add_bias, f->v, L->bv.data, nt, L->bv.n_in, W);
        }
        if (L->q_norm.data) {
            if ((rc = head_norm(be, f->q, &L->q_norm, nt, W, hp->n_head, hd, hp->rms_eps, err,
                                errlen)) ||
                (rc = head_norm(be, f->k, &L->k_norm, nt, W, hp->n_head_kv, hd, hp->rms_eps, err,
                                errlen)))
                return rc;
        }
        /* sliding layers may have their own, unscaled RoPE (gemma3) */
        be_rope_t rp = model_rope_of(hp);
        if (hp->rope_base_swa != 0.0f && layer_window(hp, l)) {
            rp.rope_base = hp->rope_base_swa;
            rp.rope_freq_scale = 1.0f;
            rp.rope_freqs = NULL;
            rp.rope_ext_factor = 0.0f;
        }
        BE_CALL(rope, f->q, nt, W, hp->n_head, f->pos + t0, &rp);
        BE_CALL(rope, f->k, nt, W, hp->n_head_kv, f->pos + t0, &rp);
        be_att_t at = {.toks = f->toks + t0,
                       .layer = l,
                       .n_layer = hp->n_layer,
                       .n_head = hp->n_head,
                       .n_head_kv = hp->n_head_kv,
                       .head_dim = hd,
                       .stride = W,
                       .scale = hp->att_scale,
                       .softcap = hp->attn_softcap,
                       .window = layer_window(hp, l),
                       .kv_type = kt};
        BE_CALL(kv_store, &at, f->k, f->v, nt);
        BE_CALL(attention, &at, f->q, f->att, nt);
        be_mm_t o = {&L->wo, f->xb, W};
        BE_CALL(matmul, &o, 1, f->att, W, nt);
        LORA_ADD(l, LORA_O, f->att, W, f->xb, W, t0, nt);
        if (L->post_attn_norm.data)
            BE_CALL(rmsnorm, f->xb, f->xb, L->post_attn_norm.data, nt, d, W, hp->rms_eps);
        BE_CALL(add, f->x, f->xb, nt, d, W);
        BE_CALL(rmsnorm, f->xb, f->x, L->ffn_norm.data, nt, d, W, hp->rms_eps);
        if (hp->n_expert)
            rc = ffn_moe(f, hp, L, l, nt, err, errlen);
        else
            rc = ffn_dense(f, hp, L, l, t0, nt, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* The step's runs of consecutive sequences of one adapter (none without adapters). */
static void lora_segments(fwd_t *f, const fwd_seq_t *seqs, int n_seqs)
{
    f->n_lsegs = 0;
    size_t r = 0;
    for (int s = 0; s < n_seqs; r += seqs[s].n_tokens, s++) {
        if (!seqs[s].lora)
            continue;
        fwd_lseg_t *last = f->n_lsegs ? &f->lsegs[f->n_lsegs - 1] : NULL;
        if (last && last->lw == seqs[s].lora && last->r0 + last->n == r)
            last->n += seqs[s].n_tokens;
        else
            f->lsegs[f->n_lsegs++] = (fwd_lseg_t){r, seqs[s].n_tokens, seqs[s].lora};
    }
}

int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, const fwd_hooks_t *hooks, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    size_t n_tok;
    int rc = validate(hp, seqs, n_seqs, &n_tok, err, errlen);
    if (rc)
        return rc;
    if (model_feats_check(hp, be->model_feats, be->name, err, errlen))
        return FWD_ERR_ARG; /* the optional kernels it needs are absent */
    size_t n_sel = 0;
    for (int s = 0; s < n_seqs; s++)
        n_sel += seqs[s].logits != NULL;
    size_t chunk = fwd_chunk_tokens(f, n_tok);
    uint32_t rank = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s].lora && seqs[s].lora->n_layer != hp->n_layer) {
            snprintf(err, errlen, "sequence %d: an adapter of %u layers on a model of %u", s,
                     seqs[s].lora->n_layer, hp->n_layer);
            return FWD_ERR_ARG;
        }
        if (seqs[s].lora && seqs[s].lora->rank_max > rank)
            rank = seqs[s].lora->rank_max;
    }
    if (rank && !be->scale) {
        snprintf(err, errlen, "%s backend: LoRA adapters need its scale kernel", be->name);
        return FWD_ERR_ARG;
    }
    if (reserve_host(f, n_tok) || reserve(f, hp, chunk, n_sel) ||
        (hp->n_expert && reserve_moe_host(f, hp, chunk)) ||
        (rank && reserve_lora(f, hp, chunk, rank, n_seqs))) {
        snprintf(err, errlen, "out of memory for %zu tokens", chunk);
        return FWD_ERR_NOMEM;
    }
    lora_segments(f, seqs, n_seqs);
    const uint32_t d = hp->n_embd;
    const size_t W = f->cap_width;
    n_sel = 0;
    for (int s = 0, t = 0; s < n_seqs; s++) {
        kv_seq_t *kv = seqs[s].kv;
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, t++) {
            f->pos[t] = kv->n_past + i;
            f->ids[t] = seqs[s].tokens[i];
            f->toks[t] = (be_tok_t){kv->k, kv->v, kv->n_ctx, kv->n_past + i};
        }
        if (seqs[s].logits)
            f->sel[n_sel++] = (uint32_t)(t - 1);
    }

    /* chunk by chunk: each chunk's k/v rows are in the caches before the
     * next attends to them; a returned row's hidden state is kept in fin */
    size_t j = 0;
    for (size_t t0 = 0; t0 < n_tok; t0 += chunk) {
        size_t nt = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        if ((rc = run_chunk(f, hp, w, seqs[0].kv->type, t0, nt, hooks, err, errlen)))
            return rc;
        size_t j0 = j;
        while (j < n_sel && f->sel[j] < t0 + nt)
            f->sel[j++] -= (uint32_t)t0; /* rows within this chunk */
        if (j > j0)
            BE_CALL(gather, f->fin + j0 * W, f->x, f->sel + j0, j - j0, d, W);
    }
    for (int s = 0; s < n_seqs; s++)
        seqs[s].kv->n_past += seqs[s].n_tokens;
    if (n_sel == 0)
        return be->sync(be->ctx) ? FWD_ERR_DEVICE : FWD_OK;
    if ((rc = wait_seg(hooks, hp->n_layer + 1, err, errlen)))
        return rc;
    /* the output head only for the rows returned */
    BE_CALL(rmsnorm, f->fin, f->fin, w->output_norm.data, n_sel, d, W, hp->rms_eps);
    be_mm_t oj = {&w->output, f->out, hp->n_vocab};
    BE_CALL(matmul, &oj, 1, f->fin, W, n_sel);
    if (hp->final_softcap != 0.0f)
        BE_CALL(softcap, f->out, n_sel, hp->n_vocab, hp->n_vocab, hp->final_softcap);
    for (int s = 0, jj = 0; s < n_seqs; s++) {
        if (!seqs[s].logits)
            continue;
        /* be_open gives every backend a download (memcpy by default) */
        const float *src = f->out + (size_t)jj++ * hp->n_vocab;
        BE_CALL(download, seqs[s].logits, src, hp->n_vocab * sizeof(float));
    }
    return FWD_OK;
}

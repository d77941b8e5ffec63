/* forward: the transformer forward pass for a batch of sequences of one model, as a sequence of backend kernels. */
#include "engine/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fwd {
    const backend_t *be;
    uint32_t chunk; /* most tokens one pass over the layers takes; 0 = all */
    size_t cap_tok, cap_out, cap_width, cap_ff, cap_vocab;
    size_t n_host;        /* entries of the host arrays */
    size_t scratch, peak; /* device scratch bytes allocated now, and the most ever */
    /* device scratch, (cap_tok, width) unless noted */
    float *x, *xb, *q, *k, *v, *att;
    float *hb, *hb2; /* (cap_tok, cap_ff) */
    float *fin;      /* (cap_out, width) last hidden state of the rows returned */
    float *out;      /* (cap_out, cap_vocab) logits of the rows returned */
    /* host, n_host entries: the whole step's tokens */
    be_tok_t *toks;
    uint32_t *pos, *sel;
    int32_t *ids;
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
    return f->scratch;
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

/* The one formula for scratch bytes: six (tokens, width) activations, two
 * (tokens, ff), and the returned rows' hidden states and logits. */
static size_t dims_bytes(size_t nt, size_t no, size_t w, size_t ff, size_t nv)
{
    return (6 * nt * w + 2 * nt * ff + no * w + no * nv) * sizeof(float);
}

size_t fwd_scratch_need(const model_hparams_t *hp, size_t n_tok, size_t n_out)
{
    return dims_bytes(n_tok, n_out, act_width(hp), hp->n_ff, hp->n_vocab);
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
                      max_sz(hp->n_ff, f->cap_ff), max_sz(hp->n_vocab, f->cap_vocab));
}

static void free_dev(fwd_t *f)
{
    const backend_t *be = f->be;
    float **dev[] = {&f->x,   &f->xb, &f->q,   &f->k,   &f->v,
                     &f->att, &f->hb, &f->hb2, &f->fin, &f->out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        if (*dev[i])
            be->buf_free(be->ctx, *dev[i]);
        *dev[i] = NULL;
    }
    f->cap_tok = f->cap_out = f->cap_width = f->cap_ff = f->cap_vocab = 0;
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

void fwd_free(fwd_t *f)
{
    if (!f)
        return;
    free_dev(f);
    free_host(f);
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
    size_t width = act_width(hp);
    if (n_out == 0)
        n_out = 1;
    if (n_tok <= f->cap_tok && n_out <= f->cap_out && width <= f->cap_width &&
        hp->n_ff <= f->cap_ff && hp->n_vocab <= f->cap_vocab)
        return 0;
    size_t nt = n_tok > f->cap_tok ? n_tok : f->cap_tok;
    size_t no = n_out > f->cap_out ? n_out : f->cap_out;
    size_t w = width > f->cap_width ? width : f->cap_width;
    size_t ff = hp->n_ff > f->cap_ff ? hp->n_ff : f->cap_ff;
    size_t nv = hp->n_vocab > f->cap_vocab ? hp->n_vocab : f->cap_vocab;
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
    if (!ok) {
        free_dev(f);
        return -1;
    }
    f->cap_tok = nt;
    f->cap_out = no;
    f->cap_width = w;
    f->cap_ff = ff;
    f->cap_vocab = nv;
    f->scratch = (6 * nt * w + 2 * nt * ff + no * w + no * nv) * sizeof(float);
    if (f->scratch > f->peak)
        f->peak = f->scratch;
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

/* One pass over the layers for tokens [t0, t0 + nt) of the step: their k/v
 * rows land in their caches, so a later chunk attends to them. The last
 * hidden state of each returned row in the chunk is kept in f->fin. */
static int run_chunk(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, kv_type_t kt,
                     size_t t0, size_t nt, const fwd_hooks_t *hooks, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    const uint32_t d = hp->n_embd, hd = hp->head_dim, ff = hp->n_ff;
    const size_t W = f->cap_width, FF = f->cap_ff;
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
        if (L->post_attn_norm.data)
            BE_CALL(rmsnorm, f->xb, f->xb, L->post_attn_norm.data, nt, d, W, hp->rms_eps);
        BE_CALL(add, f->x, f->xb, nt, d, W);
        BE_CALL(rmsnorm, f->xb, f->x, L->ffn_norm.data, nt, d, W, hp->rms_eps);
        be_mm_t gu[2] = {{&L->w_gate, f->hb, FF}, {&L->w_up, f->hb2, FF}};
        BE_CALL(matmul, gu, 2, f->xb, W, nt);
        if (hp->gelu)
            BE_CALL(gelu_mul, f->hb, f->hb2, nt, ff, FF);
        else
            BE_CALL(silu_mul, f->hb, f->hb2, nt, ff, FF);
        be_mm_t dn = {&L->w_down, f->xb, W};
        BE_CALL(matmul, &dn, 1, f->hb, FF, nt);
        if (L->post_ffn_norm.data)
            BE_CALL(rmsnorm, f->xb, f->xb, L->post_ffn_norm.data, nt, d, W, hp->rms_eps);
        BE_CALL(add, f->x, f->xb, nt, d, W);
    }
    return 0;
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
    if (reserve_host(f, n_tok) || reserve(f, hp, chunk, n_sel)) {
        snprintf(err, errlen, "out of memory for %zu tokens", chunk);
        return FWD_ERR_NOMEM;
    }
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

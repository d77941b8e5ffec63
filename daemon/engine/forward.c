/* forward: the transformer forward pass for a batch of sequences of one model, as a sequence of backend kernels. */
#include "engine/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fwd {
    const backend_t *be;
    size_t cap_tok, cap_width, cap_ff, cap_vocab;
    /* device scratch, (cap_tok, width) unless noted */
    float *x, *xb, *q, *k, *v, *att;
    float *hb, *hb2;  /* (cap_tok, cap_ff) */
    float *out;       /* (cap_tok, cap_vocab) logits of selected tokens */
    /* host */
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
    return f;
}

static void free_bufs(fwd_t *f)
{
    const backend_t *be = f->be;
    float **dev[] = {&f->x, &f->xb, &f->q, &f->k, &f->v, &f->att, &f->hb, &f->hb2, &f->out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        if (*dev[i])
            be->buf_free(be->ctx, *dev[i]);
        *dev[i] = NULL;
    }
    free(f->toks);
    free(f->pos);
    free(f->sel);
    free(f->ids);
    f->toks = NULL;
    f->pos = f->sel = NULL;
    f->ids = NULL;
    f->cap_tok = f->cap_width = f->cap_ff = f->cap_vocab = 0;
}

void fwd_free(fwd_t *f)
{
    if (!f)
        return;
    free_bufs(f);
    free(f);
}

static int reserve(fwd_t *f, const model_hparams_t *hp, size_t n_tok)
{
    size_t width = hp->n_embd;
    if (n_tok <= f->cap_tok && width <= f->cap_width && hp->n_ff <= f->cap_ff &&
        hp->n_vocab <= f->cap_vocab)
        return 0;
    size_t nt = n_tok > f->cap_tok ? n_tok : f->cap_tok;
    size_t w = width > f->cap_width ? width : f->cap_width;
    size_t ff = hp->n_ff > f->cap_ff ? hp->n_ff : f->cap_ff;
    size_t nv = hp->n_vocab > f->cap_vocab ? hp->n_vocab : f->cap_vocab;
    free_bufs(f);
    const backend_t *be = f->be;
    float **dev[] = {&f->x, &f->xb, &f->q, &f->k, &f->v, &f->att};
    int ok = 1;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        ok = ok && (*dev[i] = be->buf_alloc(be->ctx, nt * w * sizeof(float))) != NULL;
    ok = ok && (f->hb = be->buf_alloc(be->ctx, nt * ff * sizeof(float))) != NULL;
    ok = ok && (f->hb2 = be->buf_alloc(be->ctx, nt * ff * sizeof(float))) != NULL;
    ok = ok && (f->out = be->buf_alloc(be->ctx, nt * nv * sizeof(float))) != NULL;
    ok = ok && (f->toks = malloc(nt * sizeof *f->toks)) != NULL;
    ok = ok && (f->pos = malloc(nt * sizeof *f->pos)) != NULL;
    ok = ok && (f->sel = malloc(nt * sizeof *f->sel)) != NULL;
    ok = ok && (f->ids = malloc(nt * sizeof *f->ids)) != NULL;
    if (!ok) {
        free_bufs(f);
        return -1;
    }
    f->cap_tok = nt;
    f->cap_width = w;
    f->cap_ff = ff;
    f->cap_vocab = nv;
    return 0;
}

/* Runs one backend call; on failure records which kernel failed. */
#define BE_CALL(op, ...)                                                                           \
    do {                                                                                           \
        int rc_ = be->op(be->ctx, __VA_ARGS__);                                                    \
        if (rc_) {                                                                                 \
            snprintf(err, errlen, "%s backend: %s failed (%d)", be->name, #op, rc_);              \
            return rc_ == BE_ERR_NOMEM ? FWD_ERR_NOMEM : FWD_ERR_DEVICE;                          \
        }                                                                                          \
    } while (0)

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

int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, const fwd_hooks_t *hooks, char *err, size_t errlen)
{
    const backend_t *be = f->be;
    size_t n_tok;
    int rc = validate(hp, seqs, n_seqs, &n_tok, err, errlen);
    if (rc)
        return rc;
    if (reserve(f, hp, n_tok)) {
        snprintf(err, errlen, "out of memory for %zu tokens", n_tok);
        return FWD_ERR_NOMEM;
    }
    const uint32_t d = hp->n_embd, hd = hp->head_dim, ff = hp->n_ff;
    const be_rope_t rope = model_rope_of(hp);
    const size_t W = f->cap_width, FF = f->cap_ff;
    size_t n_sel = 0;
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

    if ((rc = wait_seg(hooks, 0, err, errlen)))
        return rc;
    BE_CALL(embed, &w->tok_embd, f->ids, n_tok, f->x, W);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &w->layers[l];
        if ((rc = wait_seg(hooks, 1 + l, err, errlen)))
            return rc;
        BE_CALL(rmsnorm, f->xb, f->x, L->attn_norm.data, n_tok, d, W, hp->rms_eps);
        be_mm_t qkv[3] = {{&L->wq, f->q, W}, {&L->wk, f->k, W}, {&L->wv, f->v, W}};
        BE_CALL(matmul, qkv, 3, f->xb, W, n_tok);
        if (L->bq.data) {
            BE_CALL(add_bias, f->q, L->bq.data, n_tok, L->bq.n_in, W);
            BE_CALL(add_bias, f->k, L->bk.data, n_tok, L->bk.n_in, W);
            BE_CALL(add_bias, f->v, L->bv.data, n_tok, L->bv.n_in, W);
        }
        BE_CALL(rope, f->q, n_tok, W, hp->n_head, f->pos, &rope);
        BE_CALL(rope, f->k, n_tok, W, hp->n_head_kv, f->pos, &rope);
        be_att_t at = {.toks = f->toks, .layer = l, .n_layer = hp->n_layer, .n_head = hp->n_head,
                       .n_head_kv = hp->n_head_kv, .head_dim = hd, .stride = W};
        BE_CALL(kv_store, &at, f->k, f->v, n_tok);
        BE_CALL(attention, &at, f->q, f->att, n_tok);
        be_mm_t o = {&L->wo, f->xb, W};
        BE_CALL(matmul, &o, 1, f->att, W, n_tok);
        BE_CALL(add, f->x, f->xb, n_tok, d, W);
        BE_CALL(rmsnorm, f->xb, f->x, L->ffn_norm.data, n_tok, d, W, hp->rms_eps);
        be_mm_t gu[2] = {{&L->w_gate, f->hb, FF}, {&L->w_up, f->hb2, FF}};
        BE_CALL(matmul, gu, 2, f->xb, W, n_tok);
        BE_CALL(silu_mul, f->hb, f->hb2, n_tok, ff, FF);
        be_mm_t dn = {&L->w_down, f->xb, W};
        BE_CALL(matmul, &dn, 1, f->hb, FF, n_tok);
        BE_CALL(add, f->x, f->xb, n_tok, d, W);
    }
    for (int s = 0; s < n_seqs; s++)
        seqs[s].kv->n_past += seqs[s].n_tokens;
    if (n_sel == 0)
        return be->sync(be->ctx) ? FWD_ERR_DEVICE : FWD_OK;
    if ((rc = wait_seg(hooks, hp->n_layer + 1, err, errlen)))
        return rc;
    BE_CALL(gather, f->xb, f->x, f->sel, n_sel, d, W);
    BE_CALL(rmsnorm, f->xb, f->xb, w->output_norm.data, n_sel, d, W, hp->rms_eps);
    be_mm_t oj = {&w->output, f->out, hp->n_vocab};
    BE_CALL(matmul, &oj, 1, f->xb, W, n_sel);
    for (int s = 0, j = 0; s < n_seqs; s++) {
        if (!seqs[s].logits)
            continue;
        /* be_open gives every backend a download (memcpy by default) */
        const float *src = f->out + (size_t)j++ * hp->n_vocab;
        BE_CALL(download, seqs[s].logits, src, hp->n_vocab * sizeof(float));
    }
    return FWD_OK;
}

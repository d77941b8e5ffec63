/* forward: the transformer forward pass for a batch of sequences of one model (CPU kernels). */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* Tokens per GEMM block: keeps the activations of a block in L2 while the
 * weight rows stream through. */
#define FWD_TOK_BLOCK 32

struct fwd {
    pool_t *pool;
    size_t cap_tok;   /* tokens the activation buffers hold */
    size_t cap_ctx;   /* positions each score buffer holds */
    int cap_threads;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* (cap_tok, width) activations */
    float *out;       /* (cap_tok, n_vocab) logits of selected tokens */
    float *scores;    /* (threads, cap_ctx) attention scratch */
    float *inv_freq;  /* (rope_dim/2) */
    uint32_t *pos;    /* (cap_tok) position of each token */
    uint32_t *seq;    /* (cap_tok) sequence index of each token */
    uint32_t *sel;    /* (cap_tok) token rows whose logits are wanted */
    size_t cap_vocab, cap_width, cap_ff, cap_freq;
};

fwd_t *fwd_new(pool_t *pool)
{
    fwd_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->pool = pool;
    return f;
}

static void free_bufs(fwd_t *f)
{
    free(f->x); free(f->xb); free(f->q); free(f->k); free(f->v); free(f->att);
    free(f->hb); free(f->hb2); free(f->out); free(f->scores); free(f->inv_freq);
    free(f->pos); free(f->seq); free(f->sel);
    f->x = f->xb = f->q = f->k = f->v = f->att = f->hb = f->hb2 = f->out = NULL;
    f->scores = f->inv_freq = NULL;
    f->pos = f->seq = f->sel = NULL;
    f->cap_tok = f->cap_ctx = 0;
}

void fwd_free(fwd_t *f)
{
    if (!f)
        return;
    free_bufs(f);
    free(f);
}

static int reserve(fwd_t *f, const model_hparams_t *hp, size_t n_tok, size_t n_ctx)
{
    size_t width = hp->n_embd > hp->n_head * hp->head_dim ? hp->n_embd : hp->n_head * hp->head_dim;
    int nth = pool_size(f->pool);
    if (n_tok <= f->cap_tok && n_ctx <= f->cap_ctx && width <= f->cap_width &&
        hp->n_ff <= f->cap_ff && hp->n_vocab <= f->cap_vocab && nth <= f->cap_threads &&
        hp->rope_dim / 2 <= f->cap_freq)
        return 0;
    if (n_tok < f->cap_tok) n_tok = f->cap_tok;
    if (n_ctx < f->cap_ctx) n_ctx = f->cap_ctx;
    if (width < f->cap_width) width = f->cap_width;
    size_t ff = hp->n_ff > f->cap_ff ? hp->n_ff : f->cap_ff;
    size_t vocab = hp->n_vocab > f->cap_vocab ? hp->n_vocab : f->cap_vocab;
    size_t nfreq = hp->rope_dim / 2 > f->cap_freq ? hp->rope_dim / 2 : f->cap_freq;
    free_bufs(f);
    f->x = malloc(n_tok * width * sizeof(float));
    f->xb = malloc(n_tok * width * sizeof(float));
    f->q = malloc(n_tok * width * sizeof(float));
    f->k = malloc(n_tok * width * sizeof(float));
    f->v = malloc(n_tok * width * sizeof(float));
    f->att = malloc(n_tok * width * sizeof(float));
    f->hb = malloc(n_tok * ff * sizeof(float));
    f->hb2 = malloc(n_tok * ff * sizeof(float));
    f->out = malloc(n_tok * vocab * sizeof(float));
    f->scores = malloc((size_t)nth * n_ctx * sizeof(float));
    f->inv_freq = malloc((nfreq ? nfreq : 1) * sizeof(float));
    f->pos = malloc(n_tok * sizeof(uint32_t));
    f->seq = malloc(n_tok * sizeof(uint32_t));
    f->sel = malloc(n_tok * sizeof(uint32_t));
    if (!f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 || !f->out ||
        !f->scores || !f->inv_freq || !f->pos || !f->seq || !f->sel) {
        free_bufs(f);
        f->cap_width = f->cap_ff = f->cap_vocab = f->cap_freq = 0;
        f->cap_threads = 0;
        return -1;
    }
    f->cap_tok = n_tok;
    f->cap_ctx = n_ctx;
    f->cap_width = width;
    f->cap_ff = ff;
    f->cap_vocab = vocab;
    f->cap_freq = nfreq;
    f->cap_threads = nth;
    return 0;
}

/* ------------------------------------------------------------------ matmul */

/* y[t][r] = dot(W row r, x[t]) for every token t, several weights at once
 * (their rows are concatenated and split across threads). */
typedef struct mm_job {
    const model_weight_t *w;
    const float *x;   /* (n_tok, x_stride) */
    float *y;         /* (n_tok, y_stride) */
    size_t x_stride, y_stride;
} mm_job_t;

typedef struct mm_task {
    const mm_job_t *jobs;
    int n_jobs;
    size_t n_tok;
    const uint32_t *rows; /* token indices to compute, NULL = 0..n_tok-1 */
} mm_task_t;

static void mm_worker(void *ctxp, int tid, int nth)
{
    const mm_task_t *t = ctxp;
    long total = 0;
    for (int j = 0; j < t->n_jobs; j++)
        total += t->jobs[j].w->n_out;
    long lo, hi;
    pool_range(tid, nth, total, &lo, &hi);
    for (size_t tb = 0; tb < t->n_tok; tb += FWD_TOK_BLOCK) {
        size_t te = tb + FWD_TOK_BLOCK < t->n_tok ? tb + FWD_TOK_BLOCK : t->n_tok;
        long base = 0;
        for (int j = 0; j < t->n_jobs; j++) {
            const mm_job_t *jb = &t->jobs[j];
            long n_out = jb->w->n_out;
            long r0 = lo > base ? lo - base : 0;
            long r1 = hi - base < n_out ? hi - base : n_out;
            size_t rb = quant_row_bytes(jb->w->type, jb->w->n_in);
            for (long r = r0; r < r1; r++) {
                const void *row = (const uint8_t *)jb->w->data + (size_t)r * rb;
                for (size_t ti = tb; ti < te; ti += QUANT_DOTN_MAX) {
                    int nx = (int)(te - ti < QUANT_DOTN_MAX ? te - ti : QUANT_DOTN_MAX);
                    const float *xs[QUANT_DOTN_MAX];
                    size_t tok[QUANT_DOTN_MAX];
                    for (int i = 0; i < nx; i++) {
                        tok[i] = t->rows ? t->rows[ti + i] : ti + i;
                        xs[i] = jb->x + tok[i] * jb->x_stride;
                    }
                    float out[QUANT_DOTN_MAX];
                    quant_dotn(jb->w->type, row, xs, nx, jb->w->n_in, out);
                    for (int i = 0; i < nx; i++)
                        jb->y[(t->rows ? ti + i : tok[i]) * jb->y_stride + (size_t)r] = out[i];
                }
            }
            base += n_out;
        }
    }
}

static void matmul(fwd_t *f, const mm_job_t *jobs, int n_jobs, size_t n_tok, const uint32_t *rows)
{
    mm_task_t t = {.jobs = jobs, .n_jobs = n_jobs, .n_tok = n_tok, .rows = rows};
    pool_run(f->pool, mm_worker, &t);
}

/* ------------------------------------------------------------------ small ops */

static void rmsnorm(float *o, const float *x, const float *w, size_t n, float eps)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        o[i] = x[i] * s * w[i];
}

static void add_bias(float *y, const model_weight_t *b, size_t n_tok, size_t stride)
{
    if (!b->data)
        return;
    const float *bv = b->data;
    for (size_t t = 0; t < n_tok; t++)
        for (size_t i = 0; i < b->n_in; i++)
            y[t * stride + i] += bv[i];
}

static void rope(float *vec, uint32_t n_heads, const model_hparams_t *hp, const float *inv_freq,
                 uint32_t pos)
{
    uint32_t hd = hp->head_dim, half = hp->rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float theta = (float)pos * inv_freq[i];
            float c = cosf(theta), s = sinf(theta);
            uint32_t a = hp->rope_neox ? i : 2 * i;
            uint32_t b = hp->rope_neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ------------------------------------------------------------------ attention */

typedef struct att_task {
    fwd_t *f;
    const model_hparams_t *hp;
    fwd_seq_t *seqs;
    uint32_t layer;
    size_t n_tok;
} att_task_t;

static void att_worker(void *ctxp, int tid, int nth)
{
    const att_task_t *a = ctxp;
    const model_hparams_t *hp = a->hp;
    fwd_t *f = a->f;
    uint32_t hd = hp->head_dim;
    size_t W = f->cap_width; /* row stride of q and att */
    uint32_t group = hp->n_head / hp->n_head_kv;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = f->scores + (size_t)tid * f->cap_ctx;
    long lo, hi;
    pool_range(tid, nth, (long)(a->n_tok * hp->n_head), &lo, &hi);
    for (long item = lo; item < hi; item++) {
        size_t t = (size_t)item / hp->n_head;
        uint32_t h = (uint32_t)((size_t)item % hp->n_head);
        const kv_seq_t *kv = a->seqs[f->seq[t]].kv;
        uint32_t pos = f->pos[t], kvh = h / group;
        const float *q = f->q + t * W + (size_t)h * hd;
        float mx = -INFINITY;
        for (uint32_t p = 0; p <= pos; p++) {
            float s = quant_dot_f32(q, kv_k_at(kv, a->layer, p) + (size_t)kvh * hd, hd) * scale;
            sc[p] = s;
            if (s > mx)
                mx = s;
        }
        float sum = 0.0f;
        for (uint32_t p = 0; p <= pos; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        float inv = 1.0f / sum;
        float *o = f->att + t * W + (size_t)h * hd;
        memset(o, 0, hd * sizeof(float));
        for (uint32_t p = 0; p <= pos; p++)
            quant_axpy_f32(o, sc[p] * inv, kv_v_at(kv, a->layer, p) + (size_t)kvh * hd, hd);
    }
}

/* ------------------------------------------------------------------ the pass */

int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, char *err, size_t errlen)
{
    if (n_seqs <= 0) {
        snprintf(err, errlen, "empty batch");
        return FWD_ERR_ARG;
    }
    size_t n_tok = 0, max_ctx = 0;
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
        n_tok += sq->n_tokens;
        if (sq->kv->n_ctx > max_ctx)
            max_ctx = sq->kv->n_ctx;
    }
    if (reserve(f, hp, n_tok, max_ctx)) {
        snprintf(err, errlen, "out of memory for %zu tokens", n_tok);
        return FWD_ERR_NOMEM;
    }

    const uint32_t d = hp->n_embd, hd = hp->head_dim;
    const uint32_t kvd = hp->n_head_kv * hd, ff = hp->n_ff;
    const size_t W = f->cap_width, FF = f->cap_ff;
    size_t n_sel = 0;
    for (int s = 0, t = 0; s < n_seqs; s++) {
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, t++) {
            f->pos[t] = seqs[s].kv->n_past + i;
            f->seq[t] = (uint32_t)s;
        }
        if (seqs[s].logits)
            f->sel[n_sel++] = (uint32_t)(t - 1);
    }
    for (uint32_t i = 0; i < hp->rope_dim / 2; i++)
        f->inv_freq[i] = powf(hp->rope_base, -2.0f * (float)i / (float)hp->rope_dim);

    /* embedding */
    size_t erb = quant_row_bytes(w->tok_embd.type, d);
    for (int s = 0, t = 0; s < n_seqs; s++)
        for (uint32_t i = 0; i < seqs[s].n_tokens; i++, t++)
            quant_row_to_f32(w->tok_embd.type,
                             (const uint8_t *)w->tok_embd.data + (size_t)seqs[s].tokens[i] * erb,
                             f->x + (size_t)t * W, d);

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &w->layers[l];
        for (size_t t = 0; t < n_tok; t++)
            rmsnorm(f->xb + t * W, f->x + t * W, L->attn_norm.data, d, hp->rms_eps);
        mm_job_t qkv[3] = {
            {&L->wq, f->xb, f->q, W, W},
            {&L->wk, f->xb, f->k, W, W},
            {&L->wv, f->xb, f->v, W, W},
        };
        matmul(f, qkv, 3, n_tok, NULL);
        add_bias(f->q, &L->bq, n_tok, W);
        add_bias(f->k, &L->bk, n_tok, W);
        add_bias(f->v, &L->bv, n_tok, W);
        for (size_t t = 0; t < n_tok; t++) {
            rope(f->q + t * W, hp->n_head, hp, f->inv_freq, f->pos[t]);
            rope(f->k + t * W, hp->n_head_kv, hp, f->inv_freq, f->pos[t]);
            kv_seq_t *kv = seqs[f->seq[t]].kv;
            memcpy(kv_k_at(kv, l, f->pos[t]), f->k + t * W, kvd * sizeof(float));
            memcpy(kv_v_at(kv, l, f->pos[t]), f->v + t * W, kvd * sizeof(float));
        }
        att_task_t at = {.f = f, .hp = hp, .seqs = seqs, .layer = l, .n_tok = n_tok};
        pool_run(f->pool, att_worker, &at);
        mm_job_t o = {&L->wo, f->att, f->xb, W, W};
        matmul(f, &o, 1, n_tok, NULL);
        for (size_t t = 0; t < n_tok; t++)
            for (uint32_t i = 0; i < d; i++)
                f->x[t * W + i] += f->xb[t * W + i];

        for (size_t t = 0; t < n_tok; t++)
            rmsnorm(f->xb + t * W, f->x + t * W, L->ffn_norm.data, d, hp->rms_eps);
        mm_job_t gu[2] = {
            {&L->w_gate, f->xb, f->hb, W, FF},
            {&L->w_up, f->xb, f->hb2, W, FF},
        };
        matmul(f, gu, 2, n_tok, NULL);
        for (size_t t = 0; t < n_tok; t++) {
            float *g = f->hb + t * FF, *u = f->hb2 + t * FF;
            for (uint32_t i = 0; i < ff; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        mm_job_t dn = {&L->w_down, f->hb, f->xb, FF, W};
        matmul(f, &dn, 1, n_tok, NULL);
        for (size_t t = 0; t < n_tok; t++)
            for (uint32_t i = 0; i < d; i++)
                f->x[t * W + i] += f->xb[t * W + i];
    }

    for (int s = 0; s < n_seqs; s++)
        seqs[s].kv->n_past += seqs[s].n_tokens;
    if (n_sel == 0)
        return FWD_OK;
    for (size_t j = 0; j < n_sel; j++)
        rmsnorm(f->xb + f->sel[j] * W, f->x + f->sel[j] * W, w->output_norm.data, d, hp->rms_eps);
    mm_job_t oj = {&w->output, f->xb, f->out, W, hp->n_vocab};
    matmul(f, &oj, 1, n_sel, f->sel);
    for (int s = 0, j = 0; s < n_seqs; s++)
        if (seqs[s].logits)
            memcpy(seqs[s].logits, f->out + (size_t)j++ * hp->n_vocab, hp->n_vocab * sizeof(float));
    return FWD_OK;
}

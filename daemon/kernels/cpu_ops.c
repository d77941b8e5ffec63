/* cpu_ops: the CPU kernels behind the backend vtable, shared by the cpu and sim backends. */
#include "kernels/cpu_ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attk.h"
#include "kernels/quant.h"
#include "kernels/wtype.h"

/* A matmul's token blocks hold at most this many bytes of activations (in
 * the format its weights take), so a block's activations stay in L2 while
 * every weight row streams through once per block: a 128-token prefill of
 * the 134M shape streams its weights once, not three times (with the
 * token-parallel small ops, one thread: F16 622 -> 641, Q8_0 604 -> 700
 * tok/s); 1.5 MiB, not 1 MiB, keeps F32's and F16's FFN down projection
 * (8 KiB a token) in one block too (F32 prefill about +4%)... */
#define CPUK_ACT_L2 (3u << 19)
/* ...but never fewer tokens than this (the fixed blocks before), so wide
 * rows (an 8B model's FFN: 57 KB of F32 activations a token) never stream
 * the weights more often than they did. */
#define CPUK_TOK_MIN 48
/* Rows a thread takes at a time in a matmul (a multiple of every tile's rows). */
#define CPUK_MM_CHUNK 64
/* A decode matmul's chunks a thread (mm_chunk_rows): one run of rows each (on huge pages, two
 * threads' F16 decode 108-110 tok/s with 4 chunks a thread, 119-121 with 1; F32 and Q6_K gain
 * too, Q8_0 177 -> 172) */
#define CPUK_MM_SPLIT 1
/* Tokens per block are a multiple of this (the tiles' 4 and 6 tokens). */
#define CPUK_TOK_ALIGN 12
/* Element-wise ops go parallel from this many elements on (below, a
 * fork-join costs more than the op). */
#define CPUK_PAR_MIN 32768

struct cpuk {
    pool_t *pool;
    float *scores; /* (threads, att_slot) attention scratch */
    size_t cap_ctx, cap_hd;
    uint32_t *blk; /* attention's blocks of tokens (att_blocks), blk_cap entries */
    size_t blk_cap;
    uint16_t *pan_mem;     /* (threads, 2, cap_ctx, cap_hd) halves: each thread's K and V panel */
    struct att_panel *pan; /* (threads) what each thread's panel holds */
    uint64_t att_gen;      /* attention calls so far: a panel holds rows of call att_gen only */
    void *xq[QUANT_ACT_COUNT];      /* a matmul's activations quantized per format (n_tok rows) */
    size_t xq_cap[QUANT_ACT_COUNT]; /* bytes */
};

/* Backend contexts start with the kernel state (CPUK_CTX_CHECK). */
static cpuk_t *K(void *ctx)
{
    return ((cpuk_ctx_t *)ctx)->k;
}

/* Token-parallel small ops: fn(arg, t0, t1) handles tokens [t0, t1); each
 * token's result does not depend on the split. Serial for one token (a
 * fork-join would cost more than the op). */
typedef void (*rows_fn)(const void *arg, size_t t0, size_t t1);

typedef struct rows_task {
    rows_fn fn;
    const void *arg;
    pool_chunks_t ch; /* the tokens */
} rows_task_t;

/* Chunks of tokens taken as threads come free (a thread the OS holds back
 * leaves its share to the others). */
static void rows_worker(void *ctxp, int tid, int nth)
{
    rows_task_t *rt = ctxp;
    (void)tid;
    (void)nth;
    long lo, hi;
    while (pool_chunk_next(&rt->ch, &lo, &hi))
        rt->fn(rt->arg, (size_t)lo, (size_t)hi);
}

static void par_rows(cpuk_t *k, size_t n_tok, rows_fn fn, const void *arg)
{
    if (n_tok < 2 || pool_size(k->pool) < 2) {
        fn(arg, 0, n_tok);
        return;
    }
    rows_task_t rt = {.fn = fn, .arg = arg};
    /* about four chunks a thread */
    pool_chunks_init(&rt.ch, (long)n_tok, (long)n_tok / (4 * pool_size(k->pool)));
    pool_run(k->pool, rows_worker, &rt);
}

/* par_rows for cheap ops of `work` elements in all: serial below CPUK_PAR_MIN. */
static void par_rows_min(cpuk_t *k, size_t n_tok, size_t work, rows_fn fn, const void *arg)
{
    if (work < CPUK_PAR_MIN)
        fn(arg, 0, n_tok);
    else
        par_rows(k, n_tok, fn, arg);
}

cpuk_t *cpuk_new(pool_t *pool)
{
    cpuk_t *k = calloc(1, sizeof *k);
    if (k)
        k->pool = pool;
    return k;
}

void cpuk_free(cpuk_t *k)
{
    if (!k)
        return;
    free(k->scores);
    free(k->blk);
    free(k->pan_mem);
    free(k->pan);
    for (int a = 0; a < QUANT_ACT_COUNT; a++)
        free(k->xq[a]);
    free(k);
}

/* ------------------------------------------------------------------ matmul */

typedef struct mm_task {
    const kern_mm_t *jobs;
    int n_jobs;
    const float *x;
    size_t x_stride, n_tok;
    size_t tok_block;                   /* tokens per block (tok_block_for) */
    const uint8_t *xq[QUANT_ACT_COUNT]; /* x quantized per format, n_tok rows */
    size_t xq_stride[QUANT_ACT_COUNT];  /* bytes per row */
    long total;                         /* the jobs' rows laid end to end */
    long rows;                          /* rows a chunk (mm_chunk_rows) */
    pool_chunks_t ch;                   /* (token block, row chunk) pairs (mm_worker) */
} mm_task_t;

/* Rows [lo, hi) of the jobs' rows laid end to end, against tokens [tb, te). */
static void mm_range(const mm_task_t *t, size_t tb, size_t te, long lo, long hi)
{
    long base = 0;
    for (int j = 0; j < t->n_jobs; j++) {
        const kern_mm_t *jb = &t->jobs[j];
        long n_out = jb->w->n_out;
        long r0 = lo > base ? lo - base : 0;
        long r1 = hi - base < n_out ? hi - base : n_out;
        size_t rb = quant_row_bytes(jb->w->type, jb->w->n_in);
        quant_act_t act = quant_act_for(jb->w->type);
        if (te - tb == 1) {
            /* decode: one row at a time (measured faster than multi-row
             * decode tiles), the range's rows in one call */
            if (r1 <= r0)
                goto next;
            const void *row = (const uint8_t *)jb->w->data + (size_t)r0 * rb;
            float *y = jb->y + tb * jb->y_stride + (size_t)r0;
            if (act != QUANT_ACT_F32) {
                const void *xq = t->xq[act] + tb * t->xq_stride[act];
                quant_vdot_tile(jb->w->type, row, rb, (int)(r1 - r0), &xq, 1, jb->w->n_in, y);
            } else {
                const float *xs = t->x + tb * t->x_stride;
                quant_dot_tile(jb->w->type, row, rb, (int)(r1 - r0), &xs, 1, jb->w->n_in, y);
            }
            goto next;
        }
        /* prefill: tiles of rows x tokens as quant_tile_shape says; rows
             * outer, so a row tile stays in L1 across the token block */
        int step, cols;
        quant_tile_shape(jb->w->type, &step, &cols);
        for (long r = r0; r < r1; r += step) {
            int nr = (int)(r1 - r < step ? r1 - r : step);
            const void *row = (const uint8_t *)jb->w->data + (size_t)r * rb;
            /* the next row tile's weights fetched from memory while this one runs, a share a
             * token tile (prefill streamed them at the first token tile's pace, four or sixteen
             * rows at once: F32 prefill +8%) */
            const char *pf = (const char *)row + (size_t)nr * rb;
            const char *pf_end =
                r + nr < r1 ? pf + (size_t)(r1 - r - nr < step ? r1 - r - nr : step) * rb : pf;
            size_t pf_lines =
                ((size_t)(pf_end - pf) / 64 * (size_t)cols + (te - tb) - 1) / (te - tb) + 1;
            for (size_t ti = tb; ti < te; ti += (size_t)cols) {
                int nx = (int)(te - ti < (size_t)cols ? te - ti : (size_t)cols);
                for (size_t k = 0; k < pf_lines && pf < pf_end; k++, pf += 64)
                    __builtin_prefetch(pf, 0, 3);
                float out[QUANT_TILE_MAX];
                if (act != QUANT_ACT_F32) {
                    const void *xq[QUANT_TILE_MAX];
                    for (int i = 0; i < nx; i++)
                        xq[i] = t->xq[act] + (ti + i) * t->xq_stride[act];
                    quant_vdot_tile(jb->w->type, row, rb, nr, xq, nx, jb->w->n_in, out);
                } else {
                    const float *xs[QUANT_TILE_MAX];
                    for (int i = 0; i < nx; i++)
                        xs[i] = t->x + (ti + i) * t->x_stride;
                    quant_dot_tile(jb->w->type, row, rb, nr, xs, nx, jb->w->n_in, out);
                }
                /* a token's nr results side by side in y: contiguous stores (rows outer
                 * stored a float a token row apart: 765 -> 860 tok/s on Q4_K_M prefill) */
                for (int i = 0; i < nx; i++)
                    for (int k = 0; k < nr; k++)
                        jb->y[(ti + i) * jb->y_stride + (size_t)(r + k)] = out[k * nx + i];
            }
        }
    next:
        base += n_out;
    }
}

/* Rows a chunk: on one thread all of them; a prefill's CPUK_MM_CHUNK, so threads finish
 * together; a decode's CPUK_MM_SPLIT chunks a thread, each a long run of memory for the
 * prefetchers */
static long mm_chunk_rows(long total, size_t n_tok, int nth)
{
    if (nth == 1)
        return total;
    if (n_tok > 1)
        return CPUK_MM_CHUNK;
    long rows = total / (nth * CPUK_MM_SPLIT);
    rows -= rows % CPUK_MM_CHUNK;
    return rows > CPUK_MM_CHUNK ? rows : CPUK_MM_CHUNK;
}

static void mm_worker(void *ctxp, int tid, int nth)
{
    mm_task_t *t = ctxp;
    (void)tid;
    (void)nth;
    /* chunks of t->rows rows as threads come free, token block by token block
     * (each result is computed the same whichever thread takes it) */
    long rows = t->rows, total = t->total;
    long n_ch = (total + rows - 1) / rows;
    long id, id_end;
    while (pool_chunk_next(&t->ch, &id, &id_end)) {
        size_t tb = (size_t)(id / n_ch) * t->tok_block;
        size_t te = tb + t->tok_block < t->n_tok ? tb + t->tok_block : t->n_tok;
        long lo = id % n_ch * rows;
        mm_range(t, tb, te, lo, lo + rows < total ? lo + rows : total);
    }
}

typedef struct act_job {
    quant_act_t act;
    const float *x;
    size_t x_stride;
    void *dst;
    size_t rb, width; /* bytes per quantized row, values quantized per row */
} act_job_t;

static void act_rows(const void *argp, size_t t0, size_t t1)
{
    const act_job_t *j = argp;
    for (size_t i = t0; i < t1; i++)
        quant_act_from_f32(j->act, j->x + i * j->x_stride, (uint8_t *)j->dst + i * j->rb, j->width);
}

/* Tokens per block: as few blocks as keep each within CPUK_ACT_L2 bytes
 * of activations (or CPUK_TOK_MIN tokens), as even as CPUK_TOK_ALIGN
 * allows (the widest job's activation row sets the size). */
static size_t tok_block_for(const kern_mm_t *jobs, int n_jobs, size_t n_tok)
{
    size_t row = 0;
    for (int j = 0; j < n_jobs; j++) {
        quant_act_t a = quant_act_for(jobs[j].w->type);
        size_t b = quant_act_bytes(a, jobs[j].w->n_in);
        if (!b)
            b = jobs[j].w->n_in * sizeof(float);
        if (b > row)
            row = b;
    }
    size_t max = row ? CPUK_ACT_L2 / row : n_tok;
    max = max < CPUK_TOK_MIN ? CPUK_TOK_MIN : max - max % CPUK_TOK_ALIGN;
    size_t nb = (n_tok + max - 1) / max;
    size_t tb = (n_tok + nb - 1) / nb;
    return (tb + CPUK_TOK_ALIGN - 1) / CPUK_TOK_ALIGN * CPUK_TOK_ALIGN;
}

int cpuk_matmul(void *ctx, const kern_mm_t *jobs, int n_jobs, const float *x, size_t x_stride,
                size_t n_tok)
{
    cpuk_t *k = K(ctx);
    mm_task_t t = {.jobs = jobs,
                   .n_jobs = n_jobs,
                   .x = x,
                   .x_stride = x_stride,
                   .n_tok = n_tok,
                   .tok_block = tok_block_for(jobs, n_jobs, n_tok)};
    long total = 0, n_blk = (long)((n_tok + t.tok_block - 1) / t.tok_block);
    for (int j = 0; j < n_jobs; j++)
        total += jobs[j].w->n_out;
    t.total = total;
    t.rows = mm_chunk_rows(total, n_tok, pool_size(k->pool));
    pool_chunks_init(&t.ch, n_blk * ((total + t.rows - 1) / t.rows), 1);
    /* quantize the activations once per product, for each format a job
     * needs, as wide as its widest job (blocks are quantized independently,
     * so a narrower job reads a prefix) */
    size_t width[QUANT_ACT_COUNT] = {0};
    for (int j = 0; j < n_jobs; j++) {
        quant_act_t a = quant_act_for(jobs[j].w->type);
        if (a != QUANT_ACT_F32 && jobs[j].w->n_in > width[a])
            width[a] = jobs[j].w->n_in;
    }
    for (int a = 1; a < QUANT_ACT_COUNT; a++) {
        if (!width[a])
            continue;
        size_t rb = quant_act_bytes((quant_act_t)a, width[a]);
        if (!rb)
            return KERN_ERR_ARG;
        if (rb * n_tok > k->xq_cap[a]) {
            void *p = malloc(rb * n_tok);
            if (!p)
                return KERN_ERR_NOMEM;
            free(k->xq[a]);
            k->xq[a] = p;
            k->xq_cap[a] = rb * n_tok;
        }
        act_job_t aj = {(quant_act_t)a, x, x_stride, k->xq[a], rb, width[a]};
        par_rows(k, n_tok, act_rows, &aj);
        t.xq[a] = k->xq[a];
        t.xq_stride[a] = rb;
    }
    pool_run(k->pool, mm_worker, &t);
    return 0;
}

/* ------------------------------------------------------------------ small ops */

int cpuk_embed(void *ctx, const kern_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,
               size_t stride)
{
    (void)ctx;
    size_t rb = quant_row_bytes(tab->type, tab->n_in);
    for (size_t t = 0; t < n_tok; t++)
        quant_row_to_f32(tab->type, (const uint8_t *)tab->data + (size_t)ids[t] * rb,
                         out + t * stride, tab->n_in);
    return 0;
}

/* the arguments of the token-parallel element-wise ops */
typedef struct ew_job {
    float *out;
    const float *x, *w;
    size_t n, stride;
    float eps;
} ew_job_t;

static void rmsnorm_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    float *out = j->out;
    const float *x = j->x, *w = j->w;
    size_t n = j->n, stride = j->stride;
    float eps = j->eps;
    for (size_t t = t0; t < t1; t++) {
        const float *xi = x + t * stride;
        float *o = out + t * stride;
        float ss = 0.0f;
        for (size_t i = 0; i < n; i++)
            ss += xi[i] * xi[i];
        float s = 1.0f / sqrtf(ss / (float)n + eps);
        for (size_t i = 0; i < n; i++)
            o[i] = xi[i] * s * w[i];
    }
}

int cpuk_rmsnorm(void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,
                 size_t stride, float eps)
{
    ew_job_t j = {out, x, w, n, stride, eps};
    par_rows(K(ctx), n_tok, rmsnorm_rows, &j);
    return 0;
}

static void add_bias_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    for (size_t t = t0; t < t1; t++)
        for (size_t i = 0; i < j->n; i++)
            j->out[t * j->stride + i] += j->w[i];
}

int cpuk_add_bias(void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride)
{
    ew_job_t j = {y, NULL, b, n, stride, 0.0f};
    par_rows_min(K(ctx), n_tok, n_tok * n, add_bias_rows, &j);
    return 0;
}

/* Angle per position of pair i: base^(-2i/rope_dim) divided by the pair's
 * frequency factor (llama3 rope_freqs, phi3 LongRoPE), times the linear
 * scale; with YaRN the scaled frequency and the unscaled one are mixed by
 * the pair's ramp (1 up to rope_corr_lo, 0 from rope_corr_hi on) times the
 * extrapolation factor (YaRN's magnitude scale is in rope_attn_factor). */
static float k_rope_freq(const kern_rope_t *hp, uint32_t i)
{
    float f = powf(hp->rope_base, -2.0f * (float)i / (float)hp->rope_dim);
    if (hp->rope_freqs)
        f /= hp->rope_freqs[i];
    float scaled = hp->rope_freq_scale != 0.0f ? f * hp->rope_freq_scale : f;
    if (hp->rope_ext_factor == 0.0f)
        return scaled;
    float span = hp->rope_corr_hi - hp->rope_corr_lo;
    float y = ((float)i - hp->rope_corr_lo) / (span > 0.001f ? span : 0.001f);
    float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * hp->rope_ext_factor;
    return scaled * (1.0f - mix) + f * mix;
}

typedef struct rope_job {
    float *vec;
    size_t stride;
    uint32_t n_heads;
    const uint32_t *pos;
    const kern_rope_t *hp;
} rope_job_t;

static void rope_rows(const void *argp, size_t t0, size_t t1)
{
    const rope_job_t *j = argp;
    float *vec = j->vec;
    size_t stride = j->stride;
    uint32_t n_heads = j->n_heads;
    const uint32_t *pos = j->pos;
    const kern_rope_t *hp = j->hp;
    uint32_t hd = hp->head_dim, half = hp->rope_dim / 2;
    /* the frequencies once per call (every real head fits the table; a
     * wider one computes them as it goes) */
    float inv_freq[512];
    int cached = half <= 512;
    for (uint32_t i = 0; cached && i < half; i++)
        inv_freq[i] = k_rope_freq(hp, i);
    for (size_t t = t0; t < t1; t++) {
        for (uint32_t i = 0; i < half; i++) {
            float f = cached ? inv_freq[i] : k_rope_freq(hp, i);
            float theta = (float)pos[t] * f;
            float c = cosf(theta), s = sinf(theta);
            if (hp->rope_attn_factor != 0.0f && hp->rope_attn_factor != 1.0f) {
                c *= hp->rope_attn_factor;
                s *= hp->rope_attn_factor;
            }
            uint32_t a = hp->rope_neox ? i : 2 * i;
            uint32_t b = hp->rope_neox ? i + half : 2 * i + 1;
            for (uint32_t h = 0; h < n_heads; h++) {
                float *v = vec + t * stride + (size_t)h * hd;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

int cpuk_rope(void *ctx, float *vec, size_t n_tok, size_t stride, uint32_t n_heads,
              const uint32_t *pos, const kern_rope_t *hp)
{
    rope_job_t j = {vec, stride, n_heads, pos, hp};
    par_rows_min(K(ctx), n_tok, n_tok * n_heads * hp->head_dim, rope_rows, &j);
    return 0;
}

static inline size_t kv_off(const kern_att_t *a, uint32_t pos)
{
    return ((size_t)pos * a->n_layer + a->layer) * a->n_head_kv * a->head_dim;
}

/* Elements between one position's K (or V) row of a layer and the next position's: all layers'
 * rows of a position lie between them (the position-major kv_seq_t layout). */
static inline size_t kv_row_elems(const kern_att_t *a)
{
    return (size_t)a->n_layer * a->n_head_kv * a->head_dim;
}

/* Address of element off of a cache of the att's type. */
static inline void *kv_at(const kern_att_t *a, void *base, size_t off)
{
    return (char *)base + off * (a->kv_type == KV_TYPE_F16 ? 2 : sizeof(float));
}

typedef struct kvs_job {
    const kern_att_t *a;
    const float *k, *v;
} kvs_job_t;

static void kv_store_rows(const void *argp, size_t t0, size_t t1)
{
    const kvs_job_t *j = argp;
    const kern_att_t *a = j->a;
    const float *k = j->k, *v = j->v;
    size_t kvd = (size_t)a->n_head_kv * a->head_dim;
    for (size_t t = t0; t < t1; t++) {
        const kern_tok_t *bt = &a->toks[t];
        void *kd = kv_at(a, bt->k_base, kv_off(a, bt->pos));
        void *vd = kv_at(a, bt->v_base, kv_off(a, bt->pos));
        if (a->kv_type == KV_TYPE_F16) {
            quant_row_from_f32(GGUF_T_F16, k + t * a->stride, kd, kvd);
            quant_row_from_f32(GGUF_T_F16, v + t * a->stride, vd, kvd);
        } else {
            memcpy(kd, k + t * a->stride, kvd * sizeof(float));
            memcpy(vd, v + t * a->stride, kvd * sizeof(float));
        }
    }
}

int cpuk_kv_store(void *ctx, const kern_att_t *a, const float *k, const float *v, size_t n_tok)
{
    kvs_job_t j = {a, k, v};
    par_rows_min(K(ctx), n_tok, n_tok * a->n_head_kv * a->head_dim, kv_store_rows, &j);
    return 0;
}

/* Queries per attention item: the consecutive tokens of one sequence (a prompt's) in a step, taken
 * together, so each K and V row is read (and converted) once for them all rather than once a token
 * (a 250-token chunk over 2,500 cached positions read 7.5 MB of cache per token and layer). 16
 * against 8: attention's share of that step's time beside the matmuls 0.48 against 0.54 (32: 0.51). */
#define CPUK_ATT_QB 16

typedef struct att_task {
    cpuk_t *k;
    const kern_att_t *a;
    const float *q;
    float *out;
    const uint32_t *blk; /* (n_blk + 1) first token of each block, then n_tok */
    size_t n_blk;
    uint64_t gen;     /* this call's att_gen */
    pool_chunks_t ch; /* the (block, head) items */
} att_task_t;

/* Per thread: CPUK_ATT_QB rows of cap_ctx scores, CPUK_ATT_QB queries of cap_hd (F16 caches:
 * rounded to half), cap_hd floats of room for a half-rounded query, and attk's scratch. */
static size_t att_slot(const cpuk_t *k)
{
    return CPUK_ATT_QB * (k->cap_ctx + k->cap_hd) + k->cap_hd + attk_scratch_floats(k->cap_hd);
}

/* The first position a token at pos attends to (a sliding window sees the last `window`). */
static uint32_t att_first(const kern_att_t *a, uint32_t pos)
{
    return a->window && pos >= a->window ? pos - a->window + 1 : 0;
}

/* A KV head's rows as one item reads them: F16 caches at k/v, position p's row p * stride halves
 * on (the cache itself, or a thread's panel); F32 caches through kv_at. */
typedef struct att_rows {
    const uint16_t *k, *v;
    size_t stride;
} att_rows_t;

/* What a thread's panel holds: rows 0 .. n - 1 of one sequence's KV head in attention call gen,
 * each head_dim halves, back to back, so a prompt's blocks read them from cache: in the cache
 * itself rows are a position apart (18 KB in the 134M shape), which maps a head's rows onto a
 * small share of the cache's sets, and a long context's rows do not stay cached between blocks. */
struct att_panel {
    const void *k_base;
    uint32_t kvh, n;
    uint64_t gen;
};

/* Scores of nq queries (positions pos0 .. pos0 + nq - 1, kv head kvh) against positions
 * lo .. hi into sc (a row of cap_ctx per query), each result its single dot's (F16 caches:
 * attk's blocks). Entries past a query's own position are written and not used. */
static void att_scores(const kern_att_t *a, const kern_tok_t *bt, const att_rows_t *rw,
                       uint32_t kvh, const float **qs, int nq, uint32_t lo, uint32_t hi, float *sc,
                       size_t cap, float *scratch)
{
    uint32_t hd = a->head_dim;
    if (a->kv_type == KV_TYPE_F16) {
        attk_scores_f16(qs, nq, rw->k + lo * rw->stride, rw->stride, lo, hi, hd, sc, cap, scratch);
        return;
    }
    for (uint32_t p = lo; p <= hi; p++)
        for (int j = 0; j < nq; j++)
            sc[(size_t)j * cap + p] =
                quant_dot_f32(qs[j], kv_at(a, bt->k_base, kv_off(a, p) + (size_t)kvh * hd), hd);
}

/* Scores of one query over p0 .. pos become its softmax weights (F16 caches: rounded to half,
 * as an F16 V x P product sees them). */
static void att_softmax(const kern_att_t *a, float *sc, uint32_t p0, uint32_t pos)
{
    float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    float cap = a->softcap, mx = -INFINITY;
    if (cap == 0.0f)
        mx = attk_scale_max(sc + p0, pos + 1 - p0, scale);
    else
        for (uint32_t p = p0; p <= pos; p++) {
            float s = cap * tanhf(sc[p] * scale / cap);
            sc[p] = s;
            if (s > mx)
                mx = s;
        }
    float inv = 1.0f / quant_exp_shift(sc + p0, pos + 1 - p0, mx);
    if (a->kv_type != KV_TYPE_F16) {
        for (uint32_t p = p0; p <= pos; p++)
            sc[p] *= inv;
        return;
    }
    attk_mul_round_f16(sc + p0, pos + 1 - p0, inv);
}

/* o += the weights w[p] times V rows p for p = lo .. hi (none when lo > hi). */
static void att_values(const kern_att_t *a, const kern_tok_t *bt, const att_rows_t *rw,
                       uint32_t kvh, float *o, const float *w, uint32_t lo, uint32_t hi)
{
    uint32_t hd = a->head_dim;
    if (lo > hi)
        return;
    if (a->kv_type == KV_TYPE_F16) {
        const float *wl = w + lo;
        attk_values_f16(&o, &wl, 1, rw->v + lo * rw->stride, rw->stride, hi + 1 - lo, hd);
        return;
    }
    for (uint32_t p = lo; p <= hi; p++)
        quant_axpy_f32(o, w[p], kv_at(a, bt->v_base, kv_off(a, p) + (size_t)kvh * hd), hd);
}

/* The rows an item reads: with a panel (pan, NULL: none), this thread's copy of the head's rows,
 * brought up to row last first; else the cache's own. */
static att_rows_t att_rows_of(const att_task_t *at, struct att_panel *pan, uint16_t *mem,
                              const kern_tok_t *bt, uint32_t kvh, uint32_t last)
{
    const kern_att_t *a = at->a;
    size_t hd = a->head_dim, rs = kv_row_elems(a);
    const uint16_t *k0 = kv_at(a, bt->k_base, kv_off(a, 0) + kvh * hd);
    const uint16_t *v0 = kv_at(a, bt->v_base, kv_off(a, 0) + kvh * hd);
    if (!pan || a->kv_type != KV_TYPE_F16)
        return (att_rows_t){k0, v0, rs};
    uint16_t *pk = mem, *pv = mem + at->k->cap_ctx * at->k->cap_hd;
    if (pan->gen != at->gen || pan->k_base != bt->k_base || pan->kvh != kvh)
        *pan = (struct att_panel){bt->k_base, kvh, 0, at->gen};
    for (uint32_t p = pan->n; p <= last; p++) {
        if (p + 8 <= last) /* the whole row 8 positions ahead, a line at a time */
            for (size_t o = 0; o < hd * sizeof *pk; o += 64) {
                __builtin_prefetch((const char *)(k0 + (p + 8) * rs) + o);
                __builtin_prefetch((const char *)(v0 + (p + 8) * rs) + o);
            }
        memcpy(pk + p * hd, k0 + p * rs, hd * sizeof *pk);
        memcpy(pv + p * hd, v0 + p * rs, hd * sizeof *pv);
    }
    if (last + 1 > pan->n)
        pan->n = last + 1;
    return (att_rows_t){pk, pv, hd};
}

/* One item: the queries of a block (tokens t0 .. t0 + nq - 1 of one sequence at consecutive
 * positions) for head h, its rows rw. Every output is what the token alone would get: its scores
 * are single dots, its weights its own softmax, and its V rows are added in position order. */
static void att_item(const att_task_t *at, float *scr, const att_rows_t *rw, size_t t0, int nq,
                     uint32_t h)
{
    const kern_att_t *a = at->a;
    cpuk_t *k = at->k;
    uint32_t hd = a->head_dim, kvh = h / (a->n_head / a->n_head_kv);
    const kern_tok_t *bt = &a->toks[t0];
    float *sc = scr, *qh = scr + CPUK_ATT_QB * k->cap_ctx, *room = qh + CPUK_ATT_QB * k->cap_hd;
    float *kscr = room + k->cap_hd;
    const float *qs[CPUK_ATT_QB];
    float *os[CPUK_ATT_QB];
    const float *ws[CPUK_ATT_QB];
    for (int j = 0; j < nq; j++) {
        const float *q = at->q + (t0 + j) * a->stride + (size_t)h * hd;
        if (a->kv_type == KV_TYPE_F16) { /* as an F16 x F16 product sees it: q rounded to half */
            quant_row_from_f32(GGUF_T_F16, q, (uint16_t *)room, hd);
            quant_row_to_f32(GGUF_T_F16, (const uint16_t *)room, qh + (size_t)j * k->cap_hd, hd);
            q = qh + (size_t)j * k->cap_hd;
        }
        qs[j] = q;
        os[j] = at->out + (t0 + j) * a->stride + (size_t)h * hd;
        ws[j] = sc + (size_t)j * k->cap_ctx;
        memset(os[j], 0, hd * sizeof(float));
    }
    uint32_t pos0 = bt->pos, last = pos0 + (uint32_t)nq - 1;
    att_scores(a, bt, rw, kvh, qs, nq, att_first(a, pos0), last, sc, k->cap_ctx, kscr);
    for (int j = 0; j < nq; j++)
        att_softmax(a, sc + (size_t)j * k->cap_ctx, att_first(a, pos0 + (uint32_t)j),
                    pos0 + (uint32_t)j);
    /* the rows every query sees, lo .. hi, read once for them all; before them the rows only the
     * earlier queries' windows reach, after them those only the later queries reach */
    uint32_t lo = att_first(a, last), hi = pos0;
    if (lo > hi || a->kv_type != KV_TYPE_F16) {
        for (int j = 0; j < nq; j++)
            att_values(a, bt, rw, kvh, os[j], ws[j], att_first(a, pos0 + (uint32_t)j),
                       pos0 + (uint32_t)j);
        return;
    }
    for (int j = 0; lo > 0 && j < nq; j++)
        att_values(a, bt, rw, kvh, os[j], ws[j], att_first(a, pos0 + (uint32_t)j), lo - 1);
    const float *wl[CPUK_ATT_QB];
    for (int j = 0; j < nq; j++)
        wl[j] = ws[j] + lo;
    attk_values_f16(os, wl, nq, rw->v + lo * rw->stride, rw->stride, hi + 1 - lo, hd);
    for (int j = 1; j < nq; j++)
        att_values(a, bt, rw, kvh, os[j], ws[j], hi + 1, pos0 + (uint32_t)j);
}

/* Whether block b's sequence has another block in the step (a prompt's: its rows are read by
 * every one of them, so a panel pays). */
static int att_multi(const att_task_t *at, size_t b)
{
    const void *kb = at->a->toks[at->blk[b]].k_base;
    return (b > 0 && at->a->toks[at->blk[b - 1]].k_base == kb) ||
           (b + 1 < at->n_blk && at->a->toks[at->blk[b + 1]].k_base == kb);
}

static void att_worker(void *ctxp, int tid, int nth)
{
    att_task_t *at = ctxp;
    cpuk_t *k = at->k;
    float *scr = k->scores + (size_t)tid * att_slot(k);
    uint16_t *mem = k->pan_mem + (size_t)tid * 2 * k->cap_ctx * k->cap_hd;
    /* items (head, block) taken one at a time as threads come free: a causal prompt's later
     * blocks cost more, and a thread the OS holds back leaves its share to the others; a head's
     * blocks one after another, so its panel serves them all */
    (void)nth;
    long item, item_end;
    while (pool_chunk_next(&at->ch, &item, &item_end)) {
        size_t b = (size_t)item % at->n_blk;
        uint32_t h = (uint32_t)((size_t)item / at->n_blk), t0 = at->blk[b];
        int nq = (int)(at->blk[b + 1] - t0);
        const kern_tok_t *bt = &at->a->toks[t0];
        struct att_panel *pan = !at->a->window && att_multi(at, b) ? &k->pan[tid] : NULL;
        att_rows_t rw = att_rows_of(at, pan, mem, bt, h / (at->a->n_head / at->a->n_head_kv),
                                    bt->pos + (uint32_t)nq - 1);
        att_item(at, scr, &rw, t0, nq, h);
    }
}

/* Splits the step's tokens into blocks of consecutive positions of one sequence (at most
 * CPUK_ATT_QB each): blk gets each block's first token and then n_tok; returns the count. */
static size_t att_blocks(const kern_att_t *a, size_t n_tok, uint32_t *blk)
{
    size_t n = 0;
    for (size_t t = 0; t < n_tok; t++) {
        const kern_tok_t *p = t ? &a->toks[t - 1] : NULL, *c = &a->toks[t];
        if (!p || t - blk[n - 1] >= CPUK_ATT_QB || p->k_base != c->k_base ||
            p->v_base != c->v_base || c->pos != p->pos + 1)
            blk[n++] = (uint32_t)t;
    }
    blk[n] = (uint32_t)n_tok;
    return n;
}

int cpuk_attention(void *ctx, const kern_att_t *a, const float *q, float *out, size_t n_tok)
{
    cpuk_t *k = K(ctx);
    if (a->kv_type != KV_TYPE_F16 && a->kv_type != KV_TYPE_F32)
        return KERN_ERR_ARG;
    size_t need = 0;
    for (size_t t = 0; t < n_tok; t++)
        if ((size_t)a->toks[t].pos + 1 > need)
            need = (size_t)a->toks[t].pos + 1;
    if (need > k->cap_ctx || a->head_dim > k->cap_hd) {
        size_t ctx_n = need > k->cap_ctx ? need : k->cap_ctx;
        size_t hd_n = a->head_dim > k->cap_hd ? a->head_dim : k->cap_hd;
        float *s = malloc((size_t)pool_size(k->pool) *
                          (CPUK_ATT_QB * (ctx_n + hd_n) + hd_n + attk_scratch_floats(hd_n)) *
                          sizeof(float));
        if (!s)
            return KERN_ERR_NOMEM;
        size_t nt = (size_t)pool_size(k->pool);
        uint16_t *pm = malloc(nt * 2 * ctx_n * hd_n * sizeof *pm);
        struct att_panel *pn = calloc(nt, sizeof *pn);
        if (!pm || !pn) {
            free(s);
            free(pm);
            free(pn);
            return KERN_ERR_NOMEM;
        }
        free(k->scores);
        free(k->pan_mem);
        free(k->pan);
        k->scores = s;
        k->pan_mem = pm;
        k->pan = pn;
        k->cap_ctx = ctx_n;
        k->cap_hd = hd_n;
    }
    if (n_tok + 1 > k->blk_cap) {
        uint32_t *b = realloc(k->blk, (n_tok + 1) * sizeof *b);
        if (!b)
            return KERN_ERR_NOMEM;
        k->blk = b;
        k->blk_cap = n_tok + 1;
    }
    att_task_t at = {.k = k, .a = a, .q = q, .out = out, .blk = k->blk, .gen = ++k->att_gen};
    at.n_blk = att_blocks(a, n_tok, k->blk);
    pool_chunks_init(&at.ch, (long)(at.n_blk * a->n_head), 1);
    pool_run(k->pool, att_worker, &at);
    return 0;
}

static void silu_mul_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    for (size_t t = t0; t < t1; t++) {
        float *gi = j->out + t * j->stride;
        const float *ui = j->x + t * j->stride;
        for (size_t i = 0; i < j->n; i++)
            gi[i] = gi[i] / (1.0f + expf(-gi[i])) * ui[i];
    }
}

int cpuk_silu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride)
{
    ew_job_t j = {g, u, NULL, n, stride, 0.0f};
    par_rows(K(ctx), n_tok, silu_mul_rows, &j);
    return 0;
}

static void scale_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    for (size_t t = t0; t < t1; t++)
        for (size_t i = 0; i < j->n; i++)
            j->out[t * j->stride + i] *= j->eps;
}

/* (the factor rides in ew_job_t's eps) */
int cpuk_scale(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float s)
{
    ew_job_t j = {x, NULL, NULL, n, stride, s};
    par_rows_min(K(ctx), n_tok, n_tok * n, scale_rows, &j);
    return 0;
}

int cpuk_softcap(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float cap)
{
    (void)ctx;
    for (size_t t = 0; t < n_tok; t++)
        for (size_t i = 0; i < n; i++)
            x[t * stride + i] = cap * tanhf(x[t * stride + i] / cap);
    return 0;
}

static void gelu_mul_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    size_t n = j->n;
    for (size_t t = t0; t < t1; t++) {
        float *gi = j->out + t * j->stride;
        const float *ui = j->x + t * j->stride;
        for (size_t i = 0; i < n; i++) {
            float x = gi[i];
            gi[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * ui[i];
        }
    }
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
int cpuk_gelu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride)
{
    ew_job_t j = {g, u, NULL, n, stride, 0.0f};
    par_rows(K(ctx), n_tok, gelu_mul_rows, &j);
    return 0;
}

static void add_rows(const void *argp, size_t t0, size_t t1)
{
    const ew_job_t *j = argp;
    for (size_t t = t0; t < t1; t++)
        for (size_t i = 0; i < j->n; i++)
            j->out[t * j->stride + i] += j->x[t * j->stride + i];
}

int cpuk_add(void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride)
{
    ew_job_t j = {x, y, NULL, n, stride, 0.0f};
    par_rows_min(K(ctx), n_tok, n_tok * n, add_rows, &j);
    return 0;
}

int cpuk_gather(void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                size_t n, size_t stride)
{
    (void)ctx;
    for (size_t r = 0; r < n_rows; r++)
        memmove(dst + r * stride, src + (size_t)rows[r] * stride, n * sizeof(float));
    return 0;
}

/* ------------------------------------------------------------------ mixture of experts */

int cpuk_moe_scatter(void *ctx, float *dst, const float *src, const uint32_t *rows, const float *w,
                     size_t n_rows, size_t n, size_t stride)
{
    (void)ctx;
    for (size_t r = 0; r < n_rows; r++) {
        float *d = dst + (size_t)rows[r] * stride;
        const float *x = src + r * stride;
        for (size_t i = 0; i < n; i++)
            d[i] = w[r] * x[i];
    }
    return 0;
}

typedef struct moe_sum_job {
    float *x;
    const float *ys;
    uint32_t n_slots;
    size_t n, stride;
} moe_sum_job_t;

static void moe_sum_rows(const void *argp, size_t t0, size_t t1)
{
    const moe_sum_job_t *j = argp;
    for (size_t t = t0; t < t1; t++) {
        float *x = j->x + t * j->stride;
        const float *y = j->ys + t * j->n_slots * j->stride;
        for (size_t i = 0; i < j->n; i++) {
            float s = y[i];
            for (uint32_t k = 1; k < j->n_slots; k++)
                s += y[k * j->stride + i];
            x[i] += s;
        }
    }
}

int cpuk_moe_sum(void *ctx, float *x, const float *ys, size_t n_tok, uint32_t n_slots, size_t n,
                 size_t stride)
{
    moe_sum_job_t j = {x, ys, n_slots, n, stride};
    par_rows_min(K(ctx), n_tok, n_tok * n * n_slots, moe_sum_rows, &j);
    return 0;
}

void *cpuk_buf_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return malloc(bytes ? bytes : 1);
}

void cpuk_buf_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

int cpuk_sync(void *ctx)
{
    (void)ctx;
    return 0;
}

/* ------------------------------------------------------------------ LoRA */

typedef struct lora_task {
    const kern_lora_t *jobs;
    int n_jobs;
    const float *x;
    float *y;
    size_t x_stride, y_stride;
    size_t q_bytes, f_floats; /* per-thread scratch: quantized activations, rank + n_out floats */
    pool_chunks_t ch;         /* the jobs' rows laid end to end */
    int failed;
} lora_task_t;

/* out = w x for one token, as cpuk_matmul computes it (x quantized to w's activation format). */
static void lora_vec(const kern_tensor_t *w, const float *x, void *q, float *out)
{
    size_t rb = quant_row_bytes(w->type, w->n_in);
    quant_act_t act = quant_act_for(w->type);
    if (act != QUANT_ACT_F32) {
        quant_act_from_f32(act, x, q, w->n_in);
        const void *xq = q;
        quant_vdot_tile(w->type, w->data, rb, (int)w->n_out, &xq, 1, w->n_in, out);
    } else {
        quant_dot_tile(w->type, w->data, rb, (int)w->n_out, &x, 1, w->n_in, out);
    }
}

static void lora_worker(void *ctxp, int tid, int nth)
{
    lora_task_t *t = ctxp;
    (void)tid;
    (void)nth;
    void *q = malloc(t->q_bytes);
    float *f = malloc(t->f_floats * sizeof *f);
    if (!q || !f) {
        __atomic_store_n(&t->failed, 1, __ATOMIC_RELAXED);
        free(q);
        free(f);
        return;
    }
    long id, id_end;
    while (pool_chunk_next(&t->ch, &id, &id_end)) {
        for (long r = id; r < id_end; r++) {
            int j = 0;
            size_t k = (size_t)r;
            while (k >= t->jobs[j].n_rows)
                k -= t->jobs[j++].n_rows;
            const kern_lora_t *jb = &t->jobs[j];
            size_t row = jb->row0 + k;
            uint32_t rank = jb->a->n_out;
            lora_vec(jb->a, t->x + row * t->x_stride, q, f);
            lora_vec(jb->b, f, q, f + rank);
            float *y = t->y + row * t->y_stride;
            for (uint32_t i = 0; i < jb->b->n_out; i++) {
                float v = f[rank + i] * jb->scale; /* the scale, then the add */
                y[i] = y[i] + v;
            }
        }
    }
    free(q);
    free(f);
}

int cpuk_lora_mm(void *ctx, const kern_lora_t *jobs, int n_jobs, const float *x, size_t x_stride,
                 float *y, size_t y_stride)
{
    cpuk_t *k = K(ctx);
    lora_task_t t = {
        .jobs = jobs, .n_jobs = n_jobs, .x = x, .y = y, .x_stride = x_stride, .y_stride = y_stride};
    long total = 0;
    for (int j = 0; j < n_jobs; j++) {
        const kern_lora_t *jb = &jobs[j];
        if (jb->a->n_out != jb->b->n_in)
            return KERN_ERR_ARG;
        size_t qa = quant_act_bytes(quant_act_for(jb->a->type), jb->a->n_in);
        size_t qb = quant_act_bytes(quant_act_for(jb->b->type), jb->b->n_in);
        t.q_bytes = qa > t.q_bytes ? qa : t.q_bytes;
        t.q_bytes = qb > t.q_bytes ? qb : t.q_bytes;
        size_t fl = (size_t)jb->a->n_out + jb->b->n_out;
        t.f_floats = fl > t.f_floats ? fl : t.f_floats;
        total += (long)jb->n_rows;
    }
    if (!total)
        return 0;
    t.q_bytes = t.q_bytes ? t.q_bytes : 1;
    pool_chunks_init(&t.ch, total, 1);
    if (pool_size(k->pool) == 1 || total == 1)
        lora_worker(&t, 0, 1);
    else
        pool_run(k->pool, lora_worker, &t);
    return t.failed ? KERN_ERR_NOMEM : 0;
}

/* cuda_kern: the cuda backend's kernels on activations (rmsnorm, bias and residual adds, SiLU gate, RoPE, KV store, attention, row gather; cuda_arch.cuh's scale, soft-cap and GELU gate) and the vtable slots that launch them. */
#include "cuda_int.cuh"

/* ------------------------------------------------------------------ tuning */

/* Attention: warps per (token, head) block, largest head_dim supported. */
#define ATT_WARPS 4
#define ATT_MAX_HD 256
/* Split attention (decode, long contexts): when the (token, head) blocks are
 * fewer than ATT_SPLIT_BLOCKS, the positions are cut into up to
 * ATT_MAX_SPLIT ranges of at least ATT_SPLIT_MIN_POS, one block each; their
 * partial softmax maxima, sums and weighted V go to c->att_part and a second
 * kernel merges them. */
#define ATT_SPLIT_BLOCKS 1024
#define ATT_MAX_SPLIT 32
#define ATT_SPLIT_MIN_POS 128

/* ------------------------------------------------------------------ device code */

/* Sum over the block of v (blockDim.x a multiple of 32, <= 1024). */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    unsigned w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    v = warp_sum(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (blockDim.x >> 5) ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads(); /* part/total are reused by the next call */
    return r;
}

/* out may equal x: every element is read before the barrier in block_sum
 * and then read again and written by the same thread. */
__global__ void k_rmsnorm(float *out, const float *x, const float *w, size_t n_tok, uint32_t n,
                          size_t stride, float eps)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const float *xi = x + t * stride;
        float *o = out + t * stride;
        float ss = 0.0f;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            ss += xi[i] * xi[i];
        ss = block_sum(ss);
        float s = 1.0f / sqrtf(ss / (float)n + eps);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            o[i] = __fmul_rn(__fmul_rn(xi[i], s), w[i]);
    }
}

__global__ void k_add_bias(float *y, const float *b, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            y[t * stride + i] += b[i];
}

__global__ void k_add(float *x, const float *y, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            x[t * stride + i] += y[t * stride + i];
}

__global__ void k_silu_mul(float *g, const float *u, size_t n_tok, uint32_t n, size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            const float v = g[t * stride + i];
            g[t * stride + i] = v / (1.0f + expf(-v)) * u[t * stride + i];
        }
}

#include "cuda_arch.cuh"

/* One thread per (token, pair index i), looping over heads. Angles are
 * computed in double and rounded, which reproduces the correctly rounded
 * powf/cosf/sinf of the CPU kernel; the rotation is done without FMA
 * contraction, as the CPU does. */
__global__ void k_rope(float *vec, size_t n_tok, size_t stride, uint32_t n_heads, uint32_t hd,
                       uint32_t rope_dim, float base, float freq_scale, int neox,
                       const uint32_t *pos, const float *freqs, float mscale, float ext,
                       float corr_lo, float corr_hi)
{
    const uint32_t half = rope_dim / 2;
    const size_t total = n_tok * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / half;
        const uint32_t i = (uint32_t)(idx % half);
        const float inv_freq =
            rope_pair_freq(i, rope_dim, base, freqs, freq_scale, ext, corr_lo, corr_hi);
        const float theta = (float)pos[t] * inv_freq;
        float c = (float)cos((double)theta), s = (float)sin((double)theta);
        if (mscale != 1.0f) { /* rope.scaling.attn_factor */
            c = __fmul_rn(c, mscale);
            s = __fmul_rn(s, mscale);
        }
        const uint32_t a = neox ? i : 2 * i;
        const uint32_t b = neox ? i + half : 2 * i + 1;
        for (uint32_t h = 0; h < n_heads; h++) {
            float *v = vec + t * stride + (size_t)h * hd;
            const float x0 = v[a], x1 = v[b];
            v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
    }
}

__device__ __forceinline__ size_t kv_off(uint32_t pos, uint32_t n_layer, uint32_t layer, size_t kvd)
{
    return ((size_t)pos * n_layer + layer) * kvd;
}

/* KV cache elements: F32 as is, F16 rounded to nearest even on store and
 * widened on load (the sums stay in F32). */
__device__ __forceinline__ float kv_ld(const float *p, size_t i)
{
    return p[i];
}
__device__ __forceinline__ float kv_ld(const __half *p, size_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ void kv_st(float *p, size_t i, float x)
{
    p[i] = x;
}
__device__ __forceinline__ void kv_st(__half *p, size_t i, float x)
{
    p[i] = __float2half_rn(x);
}
/* The query as the cache type sees it: F16 caches round it to half, as an
 * F16 x F16 product does (the cpu backend does the same). */
__device__ __forceinline__ float kv_q(const float *, float x)
{
    return x;
}
__device__ __forceinline__ float kv_q(const __half *, float x)
{
    return __half2float(__float2half_rn(x));
}

template <typename KV>
__global__ void k_kv_store(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, size_t kvd,
                           size_t stride, const float *k, const float *v, size_t n_tok)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const be_tok_t bt = toks[t];
        KV *kd = (KV *)bt.k_base + kv_off(bt.pos, n_layer, layer, kvd);
        KV *vd = (KV *)bt.v_base + kv_off(bt.pos, n_layer, layer, kvd);
        for (size_t i = threadIdx.x; i < kvd; i += blockDim.x) {
            kv_st(kd, i, k[t * stride + i]);
            kv_st(vd, i, v[t * stride + i]);
        }
    }
}

/* The block's warps walk positions [p0, p1) of one (token, head): warp w
 * takes p0 + w, p0 + w + ATT_WARPS, ... with an online softmax (running max,
 * sum, weighted V in registers: lane holds dims lane + 32j), then the warps
 * are merged through shared memory: on return *mx is the range's softmax
 * maximum, *sum its sum of exp(score - mx), and the range's unnormalised
 * weighted V is sum_w sm_acc[w][i] * f[w]. An empty range gives mx = -inf,
 * sum = 0. No buffer grows with the context. */
template <typename KV>
__device__ void att_range(const be_tok_t &bt, uint32_t layer, uint32_t n_layer, uint32_t kvh,
                          size_t kvd, uint32_t hd, const float *qh, float scale, float cap,
                          uint32_t p0, uint32_t p1, float *sm_m, float *sm_l,
                          float (*sm_acc)[ATT_MAX_HD], float f[ATT_WARPS], float *mx, float *sum)
{
    constexpr int NJ = ATT_MAX_HD / 32;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float qv[NJ], acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const uint32_t i = lane + 32 * j;
        qv[j] = i < hd ? kv_q((const KV *)nullptr, qh[i]) : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (uint32_t p = p0 + warp; p < p1; p += ATT_WARPS) {
        const KV *kp = (const KV *)bt.k_base + kv_off(p, n_layer, layer, kvd) + (size_t)kvh * hd;
        const KV *vp = (const KV *)bt.v_base + kv_off(p, n_layer, layer, kvd) + (size_t)kvh * hd;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t i = lane + 32 * j;
            if (i < hd)
                s += qv[j] * kv_ld(kp, i);
        }
        s = att_softcap(warp_sum(s) * scale, cap);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn); /* 0 on the first position */
        const float e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t i = lane + 32 * j;
            if (i < hd)
                acc[j] = acc[j] * corr + e * kv_ld(vp, i);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const uint32_t i = lane + 32 * j;
        if (i < hd)
            sm_acc[warp][i] = acc[j];
    }
    __syncthreads();
    float x = -INFINITY, su = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        x = fmaxf(x, sm_m[w]);
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm_l[w] > 0.0f ? expf(sm_m[w] - x) : 0.0f; /* idle warps count 0 */
        su += sm_l[w] * f[w];
    }
    *mx = x;
    *sum = su;
}

/* One block per (token, head) over the positions it sees (att_first..pos,
 * att_range), written normalised. */
template <typename KV>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, uint32_t n_head,
                uint32_t n_head_kv, uint32_t hd, size_t stride, const float *q, float *out,
                float scale, float cap, uint32_t window)
{
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_HD];
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head;
    const be_tok_t bt = toks[t];
    float f[ATT_WARPS], mx, sum;
    att_range<KV>(bt, layer, n_layer, h / (n_head / n_head_kv), (size_t)n_head_kv * hd, hd,
                  q + t * stride + (size_t)h * hd, scale, cap, att_first(bt.pos, window),
                  bt.pos + 1, sm_m, sm_l, sm_acc, f, &mx, &sum);
    const float inv = 1.0f / sum;
    float *o = out + t * stride + (size_t)h * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += sm_acc[w][i] * f[w];
        o[i] = v * inv;
    }
}

/* Split attention, part 1: block (t * n_head + h, s) covers positions
 * [w + s * chunk, min(w + (s + 1) * chunk, pos + 1)) of token t, head h
 * (att_range), w = att_first(pos, window),
 * and writes the range's softmax maximum m, sum l (over exp(score - m)) and
 * unnormalised weighted V to
 * part[((t * n_head + h) * n_split + s) * (hd + 2) ...] = m, l, acc[hd].
 * An empty range writes m = -inf, l = 0. */
template <typename KV>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_att_part(const be_tok_t *toks, uint32_t layer, uint32_t n_layer, uint32_t n_head,
               uint32_t n_head_kv, uint32_t hd, size_t stride, const float *q, float scale,
               float cap, uint32_t window, uint32_t chunk, float *part)
{
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_HD];
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head, s = blockIdx.y, n_split = gridDim.y;
    const be_tok_t bt = toks[t];
    const uint32_t p0 = att_first(bt.pos, window) + s * chunk;
    const uint32_t p1 = min(p0 + chunk, bt.pos + 1); /* p1 <= p0: empty */
    float f[ATT_WARPS], mx, sum;
    att_range<KV>(bt, layer, n_layer, h / (n_head / n_head_kv), (size_t)n_head_kv * hd, hd,
                  q + t * stride + (size_t)h * hd, scale, cap, p0, p1, sm_m, sm_l, sm_acc, f, &mx,
                  &sum);
    float *o = part + ((size_t)blockIdx.x * n_split + s) * (hd + 2);
    if (threadIdx.x == 0) {
        o[0] = mx;
        o[1] = sum;
    }
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += sm_acc[w][i] * f[w];
        o[2 + i] = v;
    }
}

/* Split attention, part 2: one block per (token, head) merges its n_split
 * partials: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M the
 * largest m_s of a non-empty range (range 0 never is: it holds the first
 * position the token sees). */
__global__ void k_att_merge(const float *part, uint32_t n_split, uint32_t n_head, uint32_t hd,
                            size_t stride, float *out)
{
    const size_t t = blockIdx.x / n_head;
    const uint32_t h = blockIdx.x % n_head;
    const float *ps = part + (size_t)blockIdx.x * n_split * (hd + 2);
    float mx = -INFINITY;
    for (uint32_t s = 0; s < n_split; s++)
        if (ps[s * (hd + 2) + 1] > 0.0f)
            mx = fmaxf(mx, ps[s * (hd + 2)]);
    float sum = 0.0f;
    for (uint32_t s = 0; s < n_split; s++) {
        const float l = ps[s * (hd + 2) + 1];
        if (l > 0.0f)
            sum += l * expf(ps[s * (hd + 2)] - mx);
    }
    const float inv = 1.0f / sum;
    float *o = out + t * stride + (size_t)h * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (uint32_t s = 0; s < n_split; s++) {
            const float *p = ps + s * (hd + 2);
            if (p[1] > 0.0f)
                v += p[2 + i] * expf(p[0] - mx);
        }
        o[i] = v * inv;
    }
}

__global__ void k_gather(float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                         uint32_t n, size_t stride)
{
    for (size_t r = blockIdx.x; r < n_rows; r += gridDim.x)
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            dst[r * stride + i] = src[(size_t)rows[r] * stride + i];
}

/* dst and src overlap: rows one after another, as the CPU's memmove loop
 * (rows n <= stride apart never partly overlap, so each row is a plain copy
 * or a no-op). Launched with one block. */
__global__ void k_gather_seq(float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                             uint32_t n, size_t stride)
{
    for (size_t r = 0; r < n_rows; r++) {
        const float *s = src + (size_t)rows[r] * stride;
        float *d = dst + r * stride;
        if (s != d)
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
                d[i] = s[i];
        __syncthreads();
    }
}

/* ------------------------------------------------------------------ kernels (vtable) */

int cuda_kern_rmsnorm(void *ctx, float *out, const float *x, const float *w, size_t n_tok, size_t n,
                      size_t stride, float eps)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    k_rmsnorm<<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(out, x, w, n_tok, (uint32_t)n, stride,
                                                            eps);
    return launch_rc();
}

/* The three row-wise element kernels (y op= x over n_tok rows of n) share
 * their checks and launch shape. */
typedef void (*ew_kernel_t)(float *, const float *, size_t, uint32_t, size_t);

static int ew_launch(void *ctx, ew_kernel_t k, float *y, const float *x, size_t n_tok, size_t n,
                     size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    k<<<dim3(grid_x(n, EW_THREADS), grid_y(n_tok)), EW_THREADS, 0, c->compute>>>(
        y, x, n_tok, (uint32_t)n, stride);
    return launch_rc();
}

int cuda_kern_add_bias(void *ctx, float *y, const float *b, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_add_bias, y, b, n_tok, n, stride);
}

int cuda_kern_add(void *ctx, float *x, const float *y, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_add, x, y, n_tok, n, stride);
}

int cuda_kern_silu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride)
{
    return ew_launch(ctx, k_silu_mul, g, u, n_tok, n, stride);
}

int cuda_kern_rope(void *ctx, float *v, size_t n_tok, size_t stride, uint32_t n_heads,
                   const uint32_t *pos, const be_rope_t *hp)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0 || hp->rope_dim < 2 || n_heads == 0)
        return 0;
    if (hp->rope_dim > hp->head_dim)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    const void *d_pos;
    if ((rc = cuda_mem_stage_put(c, STAGE_POS, pos, n_tok * sizeof *pos, &d_pos)))
        return rc;
    const void *d_freqs = NULL;
    if (hp->rope_freqs && (rc = cuda_mem_stage_put(c, STAGE_FREQS, hp->rope_freqs,
                                                   hp->rope_dim / 2 * sizeof(float), &d_freqs)))
        return rc;
    size_t total = n_tok * (hp->rope_dim / 2);
    k_rope<<<grid_x(total, EW_THREADS), EW_THREADS, 0, c->compute>>>(
        v, n_tok, stride, n_heads, hp->head_dim, hp->rope_dim, hp->rope_base,
        hp->rope_freq_scale != 0.0f ? hp->rope_freq_scale : 1.0f, hp->rope_neox,
        (const uint32_t *)d_pos, (const float *)d_freqs,
        hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f, hp->rope_ext_factor,
        hp->rope_corr_lo, hp->rope_corr_hi);
    return launch_rc();
}

/* Host-side checks of the attention operands (a bad position or head shape
 * would fault the device, which is fatal to the whole context). */
static int att_check(const be_att_t *a, size_t n_tok)
{
    if (a->n_head == 0 || a->n_head_kv == 0 || a->n_head % a->n_head_kv || a->head_dim == 0 ||
        a->head_dim > ATT_MAX_HD || a->layer >= a->n_layer ||
        (a->kv_type != KV_TYPE_F16 && a->kv_type != KV_TYPE_F32))
        return BE_ERR_ARG;
    if (n_tok * a->n_head > (size_t)INT32_MAX)
        return BE_ERR_ARG;
    for (size_t t = 0; t < n_tok; t++) {
        const be_tok_t *bt = &a->toks[t];
        if (!bt->k_base || !bt->v_base || bt->pos >= bt->n_ctx)
            return BE_ERR_ARG;
    }
    return 0;
}

int cuda_kern_kv_store(void *ctx, const be_att_t *a, const float *k, const float *v, size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    int rc = att_check(a, n_tok);
    if (rc || (rc = use_dev(c)))
        return rc;
    const void *d_toks;
    if ((rc = cuda_mem_stage_put(c, STAGE_TOKS, a->toks, n_tok * sizeof *a->toks, &d_toks)))
        return rc;
    const be_tok_t *dt = (const be_tok_t *)d_toks;
    const size_t kvd = (size_t)a->n_head_kv * a->head_dim;
    if (a->kv_type == KV_TYPE_F16)
        k_kv_store<__half><<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(
            dt, a->layer, a->n_layer, kvd, a->stride, k, v, n_tok);
    else
        k_kv_store<float><<<grid_y(n_tok), EW_THREADS, 0, c->compute>>>(
            dt, a->layer, a->n_layer, kvd, a->stride, k, v, n_tok);
    return launch_rc();
}

/* How many position ranges split attention cuts each (token, head) into (1:
 * no split, k_attention), and *chunk, positions per range: few (token, head)
 * blocks over a long context are split so the device has blocks enough to
 * fill it (decode), many are not (prefill). */
static uint32_t att_splits(const be_att_t *a, size_t n_tok, uint32_t *chunk)
{
    const size_t nb = n_tok * a->n_head;
    uint32_t max_span = 0; /* positions the widest token sees (its window) */
    for (size_t t = 0; t < n_tok; t++) {
        const uint32_t span = a->toks[t].pos - att_first(a->toks[t].pos, a->window);
        max_span = span > max_span ? span : max_span;
    }
    const size_t n_pos = (size_t)max_span + 1;
    size_t n = nb >= ATT_SPLIT_BLOCKS ? 1 : (ATT_SPLIT_BLOCKS + nb - 1) / nb;
    const size_t by_len = n_pos / ATT_SPLIT_MIN_POS; /* every range at least ATT_SPLIT_MIN_POS */
    n = n < by_len ? n : by_len;
    n = n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
    if (n <= 1)
        return 1;
    *chunk = (uint32_t)((n_pos + n - 1) / n);
    return (uint32_t)((n_pos + *chunk - 1) / *chunk);
}

int cuda_kern_attention(void *ctx, const be_att_t *a, const float *q, float *out, size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    int rc = att_check(a, n_tok);
    if (rc || (rc = use_dev(c)))
        return rc;
    const void *d_toks;
    if ((rc = cuda_mem_stage_put(c, STAGE_TOKS, a->toks, n_tok * sizeof *a->toks, &d_toks)))
        return rc;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    const float cap = a->softcap;
    if (cap < 0.0f)
        return BE_ERR_ARG;
    const unsigned nb = (unsigned)(n_tok * a->n_head);
    const be_tok_t *dt = (const be_tok_t *)d_toks;
    uint32_t chunk = 0;
    const uint32_t n_split = att_splits(a, n_tok, &chunk);
    if (n_split > 1) {
        const size_t need = (size_t)nb * n_split * (a->head_dim + 2) * sizeof(float);
        if (need > c->att_part_cap) {
            if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
                return rc;
            if (c->att_part)
                cudaFree(c->att_part);
            c->att_part = NULL;
            c->att_part_cap = 0;
            if ((rc = rt_rc(cudaMalloc((void **)&c->att_part, need))))
                return rc;
            c->att_part_cap = need;
        }
        const dim3 grid(nb, n_split);
        if (a->kv_type == KV_TYPE_F16)
            k_att_part<__half><<<grid, ATT_WARPS * 32, 0, c->compute>>>(
                dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, scale,
                cap, a->window, chunk, c->att_part);
        else
            k_att_part<float><<<grid, ATT_WARPS * 32, 0, c->compute>>>(
                dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, scale,
                cap, a->window, chunk, c->att_part);
        if ((rc = launch_rc()))
            return rc;
        k_att_merge<<<nb, 128, 0, c->compute>>>(c->att_part, n_split, a->n_head, a->head_dim,
                                                a->stride, out);
        return launch_rc();
    }
    if (a->kv_type == KV_TYPE_F16)
        k_attention<__half><<<nb, ATT_WARPS * 32, 0, c->compute>>>(
            dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, out,
            scale, cap, a->window);
    else
        k_attention<float><<<nb, ATT_WARPS * 32, 0, c->compute>>>(
            dt, a->layer, a->n_layer, a->n_head, a->n_head_kv, a->head_dim, a->stride, q, out,
            scale, cap, a->window);
    return launch_rc();
}

int cuda_kern_gather(void *ctx, float *dst, const float *src, const uint32_t *rows, size_t n_rows,
                     size_t n, size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_rows == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX || n > stride)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    uint32_t max_row = 0;
    for (size_t r = 0; r < n_rows; r++)
        if (rows[r] > max_row)
            max_row = rows[r];
    const void *d_rows;
    if ((rc = cuda_mem_stage_put(c, STAGE_ROWS, rows, n_rows * sizeof *rows, &d_rows)))
        return rc;
    uintptr_t d0 = (uintptr_t)dst, d1 = (uintptr_t)(dst + (n_rows - 1) * stride + n);
    uintptr_t s0 = (uintptr_t)src, s1 = (uintptr_t)(src + (size_t)max_row * stride + n);
    if (d0 < s1 && s0 < d1)
        k_gather_seq<<<1, EW_THREADS, 0, c->compute>>>(dst, src, (const uint32_t *)d_rows, n_rows,
                                                       (uint32_t)n, stride);
    else
        k_gather<<<grid_y(n_rows), EW_THREADS, 0, c->compute>>>(dst, src, (const uint32_t *)d_rows,
                                                                n_rows, (uint32_t)n, stride);
    return launch_rc();
}

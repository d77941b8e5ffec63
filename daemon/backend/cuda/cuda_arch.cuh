/* cuda_arch: the device pieces the architectures beyond plain llama need (included once, by
 * cuda_kern.cu, after its element-wise kernels): YaRN's per-pair RoPE frequency, the sliding window's first
 * position, the embedding-scale, soft-cap and GELU-gate kernels, and the mixture of experts' scatter
 * and slot sum, with their launchers. Each mirrors the cpu kernel of the same name in
 * kernels/cpu_ops.c operation for operation. */
#ifndef CUDA_ARCH_CUH
#define CUDA_ARCH_CUH

/* ------------------------------------------------------------------ RoPE */

/* Pair i's angle per position, as k_rope_freq in cpu_ops.c: base^(-2i/rope_dim) (computed in
 * double and rounded, the correctly rounded powf) divided by the pair's factor, times the linear
 * scale; with YaRN (ext != 0) the scaled and the unscaled frequency mixed by the pair's ramp
 * (1 up to lo, 0 from hi on) times ext. Every step rounded as the CPU rounds it (no FMA). */
__device__ __forceinline__ float rope_pair_freq(uint32_t i, uint32_t rope_dim, float base,
                                                const float *freqs, float freq_scale, float ext,
                                                float lo, float hi)
{
    const float e = -2.0f * (float)i / (float)rope_dim;
    float f = (float)pow((double)base, (double)e);
    if (freqs) /* llama3 rope_freqs / phi3 LongRoPE: divide the pair's frequency */
        f = __fdiv_rn(f, freqs[i]);
    const float scaled = __fmul_rn(f, freq_scale);
    if (ext == 0.0f)
        return scaled;
    const float span = hi - lo;
    const float y = __fdiv_rn(__fsub_rn((float)i, lo), span > 0.001f ? span : 0.001f);
    const float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), ext);
    return __fadd_rn(__fmul_rn(scaled, __fsub_rn(1.0f, mix)), __fmul_rn(f, mix));
}

/* ------------------------------------------------------------------ attention window */

/* First position a token at pos attends to: a sliding window sees the last `window` positions
 * (cpu_ops.c att_worker); window 0 sees them all. */
__host__ __device__ __forceinline__ uint32_t att_first(uint32_t pos, uint32_t window)
{
    return window && pos >= window ? pos - window + 1 : 0;
}

/* Soft-capped score: cap * tanh(s / cap); cap 0 leaves s (gemma2's attn_logit_softcapping). */
__device__ __forceinline__ float att_softcap(float s, float cap)
{
    return cap != 0.0f ? cap * tanhf(s / cap) : s;
}

/* ------------------------------------------------------------------ element-wise */

/* x *= s over n_tok rows of n (gemma's sqrt(n_embd) embedding scale). */
__global__ void k_scale(float *x, size_t n_tok, uint32_t n, size_t stride, float s)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            x[t * stride + i] *= s;
}

/* x = cap * tanh(x / cap) (gemma2's final_logit_softcapping). */
__global__ void k_softcap(float *x, size_t n_tok, uint32_t n, size_t stride, float cap)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            x[t * stride + i] = cap * tanhf(x[t * stride + i] / cap);
}

/* g = gelu_tanh(g) * u: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (gemma's gate). */
__global__ void k_gelu_mul(float *g, const float *u, size_t n_tok, uint32_t n, size_t stride)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            const float x = g[t * stride + i];
            g[t * stride + i] =
                0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[t * stride + i];
        }
}

/* Launch shape and checks of the one-parameter row kernels (as ew_launch in cuda_kern.cu). */
static int arch_rows_launch(cu_ctx_t *c, size_t n_tok, size_t n, dim3 *grid)
{
    if (n > UINT32_MAX)
        return BE_ERR_ARG;
    *grid = dim3(grid_x(n, EW_THREADS), grid_y(n_tok));
    return use_dev(c);
}

int cuda_kern_scale(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float s)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    dim3 grid;
    if (n_tok == 0 || n == 0)
        return 0;
    int rc = arch_rows_launch(c, n_tok, n, &grid);
    if (rc)
        return rc;
    k_scale<<<grid, EW_THREADS, 0, c->compute>>>(x, n_tok, (uint32_t)n, stride, s);
    return launch_rc();
}

int cuda_kern_softcap(void *ctx, float *x, size_t n_tok, size_t n, size_t stride, float cap)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    dim3 grid;
    if (n_tok == 0 || n == 0)
        return 0;
    if (!(cap > 0.0f))
        return BE_ERR_ARG;
    int rc = arch_rows_launch(c, n_tok, n, &grid);
    if (rc)
        return rc;
    k_softcap<<<grid, EW_THREADS, 0, c->compute>>>(x, n_tok, (uint32_t)n, stride, cap);
    return launch_rc();
}

int cuda_kern_gelu_mul(void *ctx, float *g, const float *u, size_t n_tok, size_t n, size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    dim3 grid;
    if (n_tok == 0 || n == 0)
        return 0;
    int rc = arch_rows_launch(c, n_tok, n, &grid);
    if (rc)
        return rc;
    k_gelu_mul<<<grid, EW_THREADS, 0, c->compute>>>(g, u, n_tok, (uint32_t)n, stride);
    return launch_rc();
}

/* ------------------------------------------------------------------ mixture of experts */

/* dst[rows[r]] = w[r] * src[r] (cpuk_moe_scatter): each thread takes elements i and walks the rows in
 * order, so a row named twice ends as the cpu leaves it (the last write). */
__global__ void k_moe_scatter(float *dst, const float *src, const uint32_t *rows, const float *w,
                              size_t n_rows, uint32_t n, size_t stride)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        for (size_t r = 0; r < n_rows; r++)
            dst[(size_t)rows[r] * stride + i] = w[r] * src[r * stride + i];
}

/* x[t] += ys[t * n_slots] + ys[t * n_slots + 1] + ... (cpuk_moe_sum): the slots summed in order,
 * then added, each step one F32 rounding as on the cpu. */
__global__ void k_moe_sum(float *x, const float *ys, size_t n_tok, uint32_t n_slots, uint32_t n,
                          size_t stride)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y) {
        const float *y = ys + t * n_slots * stride;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            float s = y[i];
            for (uint32_t k = 1; k < n_slots; k++)
                s = __fadd_rn(s, y[k * stride + i]);
            x[t * stride + i] = __fadd_rn(x[t * stride + i], s);
        }
    }
}

int cuda_kern_moe_scatter(void *ctx, float *dst, const float *src, const uint32_t *rows,
                          const float *w, size_t n_rows, size_t n, size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_rows == 0 || n == 0)
        return 0;
    if (n > UINT32_MAX || n > stride)
        return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    const void *d_rows, *d_w;
    if ((rc = cuda_mem_stage_put(c, STAGE_MOE_ROWS, rows, n_rows * sizeof *rows, &d_rows)) ||
        (rc = cuda_mem_stage_put(c, STAGE_MOE_W, w, n_rows * sizeof *w, &d_w)))
        return rc;
    k_moe_scatter<<<grid_x(n, EW_THREADS), EW_THREADS, 0, c->compute>>>(
        dst, src, (const uint32_t *)d_rows, (const float *)d_w, n_rows, (uint32_t)n, stride);
    return launch_rc();
}

int cuda_kern_moe_sum(void *ctx, float *x, const float *ys, size_t n_tok, uint32_t n_slots,
                      size_t n, size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    dim3 grid;
    if (n_tok == 0 || n == 0)
        return 0;
    if (n_slots == 0 || n > stride)
        return BE_ERR_ARG;
    int rc = arch_rows_launch(c, n_tok, n, &grid);
    if (rc)
        return rc;
    k_moe_sum<<<grid, EW_THREADS, 0, c->compute>>>(x, ys, n_tok, n_slots, (uint32_t)n, stride);
    return launch_rc();
}

#endif

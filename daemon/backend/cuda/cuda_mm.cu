/* cuda_mm: the cuda backend's kernels on weights of every type (embedding rows, the GEMV, activations rounded to F16/BF16, the tiled GEMM; cuda_quant.cuh's block types) and the embed and matmul slots, which pick the GEMV, cuBLAS or the tiled GEMM. */
#include "cuda_int.cuh"

/* ------------------------------------------------------------------ tuning */

/* GEMV kernel: rows (one warp each) per block, tokens per warp. */
#define MM_WARPS 4
#define MM_TOK 8
/* Up to this many tokens the GEMV kernel (F32 activations, weight read once
 * per MM_TOK tokens) runs for every weight type; above it F32/F16/BF16
 * weights go through cublasGemmEx (F16/BF16: activations rounded to the
 * weight type, F32 accumulation) or, without cuBLAS, k_gemm_tiled (F32
 * activations). Q8_0 always uses the GEMV kernel; the other block types
 * (cuda_quant.cuh) go through cuBLAS on F16 copies of their rows, or
 * without cuBLAS the GEMV kernel. */
#define MM_GEMM_MIN_TOK 9
/* Tiled GEMM (the fallback without cuBLAS): a TILE x TILE block computes
 * TILE weight rows for TILE tokens, stepping TILE columns at a time. */
#define GEMM_TILE 16
/* GEMV: independent 16-byte weight loads in flight per lane (VEC paths). */
#define MM_LOADS 4

/* ------------------------------------------------------------------ device code */

/* Element i of a row of the given type as F32 (exact). */
template <int WT> __device__ __forceinline__ float row_elem(const uint8_t *row, size_t i)
{
    if constexpr (WT == GGUF_T_F32) {
        return ((const float *)row)[i];
    } else if constexpr (WT == GGUF_T_F16) {
        return f16_to_f32(((const uint16_t *)row)[i]);
    } else if constexpr (WT == GGUF_T_BF16) {
        return bf16_to_f32(((const uint16_t *)row)[i]);
    } else {
        const uint8_t *b = row + (i / QUANT_Q8_0_BLOCK) * sizeof(quant_block_q8_0_t);
        float d = f16_to_f32(*(const uint16_t *)b);
        return d * (float)(int8_t)b[2 + i % QUANT_Q8_0_BLOCK];
    }
}

template <int WT>
__global__ void k_embed(const uint8_t *tab, size_t row_bytes, uint32_t n, const int32_t *ids,
                        size_t n_tok, float *out, size_t stride)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const uint8_t *row = tab + (size_t)ids[t] * row_bytes;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            out[t * stride + i] = row_elem<WT>(row, i);
    }
}

/* acc[j] += dot(wv[0 .. E), x[j][i .. i + E)) for the first nt of MM_TOK
 * tokens (the GEMV kernels' inner step, whatever decoded the weights). */
template <int E>
__device__ __forceinline__ void acc_tokens(const float *wv, const float *xt, size_t xs, size_t i,
                                           uint32_t nt, float *acc)
{
#pragma unroll
    for (int j = 0; j < MM_TOK; j++) {
        if ((uint32_t)j < nt) {
            const float *xp = xt + (size_t)j * xs + i;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < E; k++)
                s += wv[k] * xp[k];
            acc[j] += s;
        }
    }
}

/* The GEMV kernels' warp: its output row r (false past n_out: the whole
 * warp returns), its MM_TOK-token slice (t0, nt of them, activations xt),
 * the row's weights, and acc zeroed. */
struct gemv_warp {
    unsigned lane;
    size_t r;
    uint32_t t0, nt;
    const float *xt;
    const uint8_t *row;
    float acc[MM_TOK];
};

__device__ __forceinline__ bool gemv_warp_init(gemv_warp *g, const uint8_t *w, size_t row_bytes,
                                               uint32_t n_out, const float *x, size_t xs,
                                               uint32_t n_tok)
{
    g->lane = threadIdx.x & 31;
    g->r = (size_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (g->r >= n_out)
        return false;
    g->t0 = blockIdx.y * MM_TOK;
    g->nt = n_tok - g->t0 < MM_TOK ? n_tok - g->t0 : MM_TOK;
    g->xt = x + (size_t)g->t0 * xs;
    g->row = w + g->r * row_bytes;
#pragma unroll
    for (int j = 0; j < MM_TOK; j++)
        g->acc[j] = 0.0f;
    return true;
}

/* y[t0 + j][r] = the warp's sum of acc[j] for the first nt tokens (lane 0 writes). */
__device__ __forceinline__ void gemv_store(const float *acc, unsigned lane, uint32_t nt, float *y,
                                           size_t ys, uint32_t t0, size_t r)
{
#pragma unroll
    for (int j = 0; j < MM_TOK; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0 && (uint32_t)j < nt)
            y[(size_t)(t0 + j) * ys + r] = s;
    }
}

/* acc[j] += dot(the E weights in raw, x[j][i .. i + E)) for the first nt
 * tokens: raw is one 16-byte load of F32 (E = 4) or F16/BF16 (E = 8). */
template <int WT>
__device__ __forceinline__ void gemv_acc16(const uint4 raw, const float *xt, size_t xs, size_t i,
                                           uint32_t nt, float *acc)
{
    constexpr int E = WT == GGUF_T_F32 ? 4 : 8;
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    float wv[E];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (WT == GGUF_T_F32) {
            wv[k] = __uint_as_float(u[k]);
        } else {
            const uint16_t a = (uint16_t)(u[k] & 0xffff), b = (uint16_t)(u[k] >> 16);
            wv[2 * k] = WT == GGUF_T_F16 ? f16_to_f32(a) : bf16_to_f32(a);
            wv[2 * k + 1] = WT == GGUF_T_F16 ? f16_to_f32(b) : bf16_to_f32(b);
        }
    }
    acc_tokens<E>(wv, xt, xs, i, nt, acc);
}

/* y[t][r] = dot(W row r, x[t]): one warp per output row and MM_TOK tokens,
 * the row dequantised on the fly, F32 accumulation. VEC: 16-byte weight
 * loads (rows 16-byte aligned, n_in a multiple of 16 bytes' worth). */
template <int WT, bool VEC>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_gemv(const uint8_t *w, size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
           size_t xs, float *y, size_t ys, uint32_t n_tok)
{
    gemv_warp g;
    if (!gemv_warp_init(&g, w, row_bytes, n_out, x, xs, n_tok))
        return; /* whole warp */
    const unsigned lane = g.lane;
    const size_t r = g.r;
    const uint32_t t0 = g.t0, nt = g.nt;
    const float *xt = g.xt;
    const uint8_t *row = g.row;
    float *acc = g.acc;

    if constexpr (WT == GGUF_T_Q8_0) {
        /* 4 blocks per step: lanes 8k..8k+7 take block b+k, 4 weights each */
        const uint32_t nb = n_in / QUANT_Q8_0_BLOCK, sub = lane & 7;
        for (uint32_t b = lane >> 3; b < nb; b += 4) {
            const uint8_t *blk = row + (size_t)b * sizeof(quant_block_q8_0_t);
            const float d = f16_to_f32(*(const uint16_t *)blk);
            const uint16_t *qp = (const uint16_t *)(blk + 2 + sub * 4);
            const uint16_t lo = qp[0], hi = qp[1];
            const float q0 = (float)(int8_t)(lo & 0xff), q1 = (float)(int8_t)(lo >> 8);
            const float q2 = (float)(int8_t)(hi & 0xff), q3 = (float)(int8_t)(hi >> 8);
            const size_t i = (size_t)b * QUANT_Q8_0_BLOCK + sub * 4;
#pragma unroll
            for (int j = 0; j < MM_TOK; j++) {
                if ((uint32_t)j < nt) {
                    const float *xp = xt + (size_t)j * xs + i;
                    acc[j] += d * (q0 * xp[0] + q1 * xp[1] + q2 * xp[2] + q3 * xp[3]);
                }
            }
        }
    } else if constexpr (VEC) {
        /* a 16-byte load covers E elements; the warp steps 32 E of them; each
         * lane issues MM_LOADS independent loads before it uses any */
        constexpr size_t E = WT == GGUF_T_F32 ? 4 : 8, STEP = 32 * E;
        size_t i = (size_t)lane * E;
        for (; i + (MM_LOADS - 1) * STEP < n_in; i += MM_LOADS * STEP) {
            uint4 raw[MM_LOADS];
#pragma unroll
            for (int u = 0; u < MM_LOADS; u++)
                raw[u] = __ldg((const uint4 *)(row + (i + u * STEP) * (16 / E)));
#pragma unroll
            for (int u = 0; u < MM_LOADS; u++)
                gemv_acc16<WT>(raw[u], xt, xs, i + u * STEP, nt, acc);
        }
        for (; i < n_in; i += STEP)
            gemv_acc16<WT>(__ldg((const uint4 *)(row + i * (16 / E))), xt, xs, i, nt, acc);
    } else {
        for (size_t i = lane; i < n_in; i += 32) {
            const float wv = row_elem<WT>(row, i);
#pragma unroll
            for (int j = 0; j < MM_TOK; j++)
                if ((uint32_t)j < nt)
                    acc[j] += wv * xt[(size_t)j * xs + i];
        }
    }
    gemv_store(acc, lane, nt, y, ys, t0, r);
}

/* dst (n_tok, n) dense = x (n_tok rows, stride xs) rounded to F16/BF16. */
template <int WT>
__global__ void k_to_half(uint16_t *dst, const float *x, size_t xs, uint32_t n, size_t n_tok)
{
    for (size_t t = blockIdx.y; t < n_tok; t += gridDim.y) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x) {
            const float v = x[t * xs + i];
            if constexpr (WT == GGUF_T_F16)
                dst[t * n + i] = __half_as_ushort(__float2half_rn(v));
            else
                dst[t * n + i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        }
    }
}

/* y[t][r] = dot(W row r, x[t]) for a GEMM_TILE x GEMM_TILE tile of rows r
 * and tokens t (the fallback without cuBLAS): each step stages GEMM_TILE
 * columns of the W rows (as F32) and of the x rows in shared memory, then
 * thread (tx, ty) adds their products for row r0 + tx, token t0 + ty. F32
 * activations and accumulation. Block (GEMM_TILE, GEMM_TILE). */
template <int WT>
__global__ void __launch_bounds__(GEMM_TILE *GEMM_TILE)
    k_gemm_tiled(const uint8_t *w, size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
                 size_t xs, float *y, size_t ys, uint32_t n_tok)
{
    __shared__ float ws[GEMM_TILE][GEMM_TILE + 1]; /* [row][col], padded against bank conflicts */
    __shared__ float xt[GEMM_TILE][GEMM_TILE + 1]; /* [token][col] */
    const uint32_t tx = threadIdx.x, ty = threadIdx.y;
    const size_t r0 = (size_t)blockIdx.x * GEMM_TILE;
    const size_t t0 = (size_t)blockIdx.y * GEMM_TILE;
    float acc = 0.0f;
    for (uint32_t k0 = 0; k0 < n_in; k0 += GEMM_TILE) {
        const uint32_t k = k0 + tx;
        const size_t lr = r0 + ty, lt = t0 + ty; /* the row and token this thread loads */
        ws[ty][tx] = lr < n_out && k < n_in ? row_elem<WT>(w + lr * row_bytes, k) : 0.0f;
        xt[ty][tx] = lt < n_tok && k < n_in ? x[lt * xs + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_TILE; kk++)
            acc += ws[tx][kk] * xt[ty][kk];
        __syncthreads();
    }
    const size_t r = r0 + tx, t = t0 + ty;
    if (r < n_out && t < n_tok)
        y[t * ys + r] = acc;
}

#include "cuda_quant.cuh"

/* ------------------------------------------------------------------ kernels (vtable) */

static int type_ok(uint32_t t)
{
    return t == GGUF_T_F32 || t == GGUF_T_F16 || t == GGUF_T_BF16 || t == GGUF_T_Q8_0 || qk_type(t);
}

/* Alignment the kernels' loads need for a weight of this type. */
static int weight_aligned(const be_tensor_t *w)
{
    uintptr_t a = (uintptr_t)w->data;
    return w->type == GGUF_T_F32 ? a % 4 == 0 : a % 2 == 0;
}

int cuda_mm_embed(void *ctx, const be_tensor_t *tab, const int32_t *ids, size_t n_tok, float *out,
                  size_t stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    if (!tab->data || !type_ok(tab->type) || !weight_aligned(tab) ||
        !quant_row_bytes(tab->type, tab->n_in))
        return BE_ERR_ARG;
    for (size_t t = 0; t < n_tok; t++)
        if (ids[t] < 0 || (uint32_t)ids[t] >= tab->n_out)
            return BE_ERR_ARG; /* would read outside the table: a device fault */
    int rc = use_dev(c);
    if (rc)
        return rc;
    const void *d_ids;
    if ((rc = cuda_mem_stage_put(c, STAGE_IDS, ids, n_tok * sizeof *ids, &d_ids)))
        return rc;
    size_t rb = quant_row_bytes(tab->type, tab->n_in);
    const uint8_t *w = (const uint8_t *)tab->data;
    const int32_t *di = (const int32_t *)d_ids;
    unsigned g = grid_y(n_tok);
    switch (tab->type) {
    case GGUF_T_F32:
        k_embed<GGUF_T_F32>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_F16:
        k_embed<GGUF_T_F16>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_BF16:
        k_embed<GGUF_T_BF16>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    case GGUF_T_Q8_0:
        k_embed<GGUF_T_Q8_0>
            <<<g, EW_THREADS, 0, c->compute>>>(w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    default:
        qk_embed_launch(tab->type, g, c->compute, w, rb, tab->n_in, di, n_tok, out, stride);
        break;
    }
    return launch_rc();
}

static int gemv_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in);
    const uint8_t *wd = (const uint8_t *)w->data;
    const bool aligned16 = (uintptr_t)wd % 16 == 0 && rb % 16 == 0;
    const bool vec = aligned16 && (w->type == GGUF_T_F32 ? w->n_in % 4 == 0 : w->n_in % 8 == 0);
    const size_t max_tok = (size_t)GRID_Y_MAX * MM_TOK;
    for (size_t t0 = 0; t0 < n_tok; t0 += max_tok) {
        const uint32_t nt = (uint32_t)(n_tok - t0 < max_tok ? n_tok - t0 : max_tok);
        const dim3 grid((unsigned)((w->n_out + MM_WARPS - 1) / MM_WARPS),
                        (nt + MM_TOK - 1) / MM_TOK);
        const float *xt = x + t0 * xs;
        float *yt = jb->y + t0 * jb->y_stride;
#define GEMV(T, V)                                                                                 \
    k_gemv<T, V><<<grid, MM_WARPS * 32, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt, xs, yt,    \
                                                         jb->y_stride, nt)
        switch (w->type) {
        case GGUF_T_F32:
            if (vec)
                GEMV(GGUF_T_F32, true);
            else
                GEMV(GGUF_T_F32, false);
            break;
        case GGUF_T_F16:
            if (vec)
                GEMV(GGUF_T_F16, true);
            else
                GEMV(GGUF_T_F16, false);
            break;
        case GGUF_T_BF16:
            if (vec)
                GEMV(GGUF_T_BF16, true);
            else
                GEMV(GGUF_T_BF16, false);
            break;
        case GGUF_T_Q8_0: GEMV(GGUF_T_Q8_0, false); break;
        default:
            qk_gemv_launch(w->type, grid, c->compute, wd, rb, w->n_in, w->n_out, xt, xs, yt,
                           jb->y_stride, nt);
            break;
        }
#undef GEMV
        int rc = launch_rc();
        if (rc)
            return rc;
    }
    return 0;
}

/* x rounded to the weight's half type, dense (n_tok, n_in), in c->xh. */
static int to_half(cu_ctx_t *c, uint32_t type, const float *x, size_t xs, uint32_t n_in,
                   size_t n_tok)
{
    size_t need = n_tok * n_in * sizeof(uint16_t);
    int rc;
    if (need > c->xh_cap) {
        if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
            return rc;
        if (c->xh)
            cudaFree(c->xh);
        c->xh = NULL;
        c->xh_cap = 0;
        size_t cap = need < (1u << 20) ? (1u << 20) : need;
        if ((rc = rt_rc(cudaMalloc(&c->xh, cap))))
            return rc;
        c->xh_cap = cap;
    }
    dim3 grid(grid_x(n_in, EW_THREADS), grid_y(n_tok));
    if (type == GGUF_T_F16)
        k_to_half<GGUF_T_F16>
            <<<grid, EW_THREADS, 0, c->compute>>>((uint16_t *)c->xh, x, xs, n_in, n_tok);
    else
        k_to_half<GGUF_T_BF16>
            <<<grid, EW_THREADS, 0, c->compute>>>((uint16_t *)c->xh, x, xs, n_in, n_tok);
    return launch_rc();
}

/* Row-major W (n_out, n_in) is column-major (n_in, n_out) with ld n_in, and
 * the token rows of x / y are column-major (n_in, n_tok) / (n_out, n_tok)
 * with ld x_stride / y_stride, so Y = op(A)·B with A = W transposed. */
static int gemm_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok,
                       uint32_t *xh_type, uint32_t *xh_n_in)
{
    const be_tensor_t *w = jb->w;
    const float one = 1.0f, zero = 0.0f;
    const void *b = x;
    int ldb = (int)xs;
    cudaDataType ab = CUDA_R_32F;
    if (w->type != GGUF_T_F32) {
        if (*xh_type != w->type || *xh_n_in != w->n_in) {
            int rc = to_half(c, w->type, x, xs, w->n_in, n_tok);
            if (rc)
                return rc;
            *xh_type = w->type;
            *xh_n_in = w->n_in;
        }
        b = c->xh;
        ldb = (int)w->n_in;
        ab = w->type == GGUF_T_F16 ? CUDA_R_16F : CUDA_R_16BF;
    }
    cublasStatus_t st =
        c->blas.gemm_ex(c->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, (int)n_tok,
                        (int)w->n_in, &one, w->data, ab, (int)w->n_in, b, ab, ldb, &zero, jb->y,
                        CUDA_R_32F, (int)jb->y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
        return BE_ERR_NOMEM;
    return st == CUBLAS_STATUS_SUCCESS ? 0 : BE_ERR_DEVICE;
}

/* A block-type weight through cuBLAS: up to QK_HALF_MAX bytes of its rows
 * at a time dequantized to F16 in c->wh, x rounded to F16 in c->xh, F32
 * accumulation (as an F16 weight's GEMM). */
static int qk_gemm_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok,
                          uint32_t *xh_type, uint32_t *xh_n_in)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in), half_row = (size_t)w->n_in * 2;
    size_t rows = QK_HALF_MAX / half_row;
    rows = rows < 1 ? 1 : rows > w->n_out ? w->n_out : rows;
    int rc;
    if (rows * half_row > c->wh_cap) {
        if ((rc = rt_rc(cudaStreamSynchronize(c->compute))))
            return rc;
        if (c->wh)
            cudaFree(c->wh);
        c->wh = NULL;
        c->wh_cap = 0;
        if ((rc = rt_rc(cudaMalloc(&c->wh, rows * half_row))))
            return rc;
        c->wh_cap = rows * half_row;
    }
    if (*xh_type != GGUF_T_F16 || *xh_n_in != w->n_in) {
        if ((rc = to_half(c, GGUF_T_F16, x, xs, w->n_in, n_tok)))
            return rc;
        *xh_type = GGUF_T_F16;
        *xh_n_in = w->n_in;
    }
    const float one = 1.0f, zero = 0.0f;
    for (size_t r0 = 0; r0 < w->n_out; r0 += rows) {
        const size_t nr = w->n_out - r0 < rows ? w->n_out - r0 : rows;
        const dim3 grid(grid_x(w->n_in / QK_CHUNK, EW_THREADS), grid_y(nr));
        qk_half_launch(w->type, grid, c->compute, (uint16_t *)c->wh,
                       (const uint8_t *)w->data + r0 * rb, rb, w->n_in, nr);
        if ((rc = launch_rc()))
            return rc;
        cublasStatus_t st = c->blas.gemm_ex(
            c->blas.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n_tok, (int)w->n_in, &one, c->wh,
            CUDA_R_16F, (int)w->n_in, c->xh, CUDA_R_16F, (int)w->n_in, &zero, jb->y + r0,
            CUDA_R_32F, (int)jb->y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st == CUBLAS_STATUS_ALLOC_FAILED)
            return BE_ERR_NOMEM;
        if (st != CUBLAS_STATUS_SUCCESS)
            return BE_ERR_DEVICE;
    }
    return 0;
}

/* The GEMM without cuBLAS: k_gemm_tiled over tiles of rows and tokens. */
static int tiled_launch(cu_ctx_t *c, const be_mm_t *jb, const float *x, size_t xs, size_t n_tok)
{
    const be_tensor_t *w = jb->w;
    const size_t rb = quant_row_bytes(w->type, w->n_in);
    const uint8_t *wd = (const uint8_t *)w->data;
    const size_t max_tok = (size_t)GRID_Y_MAX * GEMM_TILE;
    const dim3 block(GEMM_TILE, GEMM_TILE);
    for (size_t t0 = 0; t0 < n_tok; t0 += max_tok) {
        const uint32_t nt = (uint32_t)(n_tok - t0 < max_tok ? n_tok - t0 : max_tok);
        const dim3 grid((unsigned)((w->n_out + GEMM_TILE - 1) / GEMM_TILE),
                        (nt + GEMM_TILE - 1) / GEMM_TILE);
        const float *xt = x + t0 * xs;
        float *yt = jb->y + t0 * jb->y_stride;
        switch (w->type) {
        case GGUF_T_F32:
            k_gemm_tiled<GGUF_T_F32><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                     xs, yt, jb->y_stride, nt);
            break;
        case GGUF_T_F16:
            k_gemm_tiled<GGUF_T_F16><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                     xs, yt, jb->y_stride, nt);
            break;
        case GGUF_T_BF16:
            k_gemm_tiled<GGUF_T_BF16><<<grid, block, 0, c->compute>>>(wd, rb, w->n_in, w->n_out, xt,
                                                                      xs, yt, jb->y_stride, nt);
            break;
        default: return BE_ERR_ARG; /* Q8_0 and the block types take the GEMV kernel */
        }
        int rc = launch_rc();
        if (rc)
            return rc;
    }
    return 0;
}

int cuda_mm_matmul(void *ctx, const be_mm_t *jobs, int n_jobs, const float *x, size_t x_stride,
                   size_t n_tok)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    if (n_tok == 0)
        return 0;
    for (int j = 0; j < n_jobs; j++) {
        const be_tensor_t *w = jobs[j].w;
        if (!w->data || !type_ok(w->type) || !weight_aligned(w) ||
            !quant_row_bytes(w->type, w->n_in))
            return BE_ERR_ARG;
    }
    int rc = use_dev(c);
    if (rc)
        return rc;
    /* c->xh holds x rounded to this type and width, within this call */
    uint32_t xh_type = UINT32_MAX, xh_n_in = 0;
    for (int j = 0; j < n_jobs && !rc; j++) {
        const be_mm_t *jb = &jobs[j];
        const be_tensor_t *w = jb->w;
        if (w->n_out == 0)
            continue;
        /* block types: cuBLAS on F16 tiles of the weight, else the GEMV */
        const bool blocks = qk_type(w->type);
        const bool gemm = n_tok >= MM_GEMM_MIN_TOK && w->type != GGUF_T_Q8_0 &&
                          (!blocks || c->blas.h) && w->n_in > 0 && x_stride >= w->n_in &&
                          jb->y_stride >= w->n_out && x_stride <= INT32_MAX &&
                          jb->y_stride <= INT32_MAX && n_tok <= INT32_MAX && w->n_in <= INT32_MAX &&
                          w->n_out <= INT32_MAX;
        if (!gemm)
            rc = gemv_launch(c, jb, x, x_stride, n_tok);
        else if (blocks)
            rc = qk_gemm_launch(c, jb, x, x_stride, n_tok, &xh_type, &xh_n_in);
        else if (c->blas.h)
            rc = gemm_launch(c, jb, x, x_stride, n_tok, &xh_type, &xh_n_in);
        else
            rc = tiled_launch(c, jb, x, x_stride, n_tok);
    }
    return rc;
}

/* ------------------------------------------------------------------ LoRA */

/* LoRA kernel: warps per block; a block's token rows (of one job: each weight row read once for
 * them, as the GEMV's MM_TOK); jobs per launch (the launch's job table travels as its parameter,
 * under 4 KiB); the most rank floats a row's products keep in shared memory (48 KiB a block). */
#define LORA_WARPS 4
#define LORA_TOK 8
#define LORA_JOBS 48
#define LORA_RANK_MAX (12288 / LORA_TOK)

/* One job as the kernel reads it. */
struct cu_lora_job {
    const uint8_t *a, *b; /* (rank, n_in) and (n_out, rank) rows of their types */
    size_t a_rb, b_rb;    /* bytes per row of a and b */
    size_t row0, n_rows;  /* its rows of x and y */
    size_t first;         /* its first block: the blocks of the launch's jobs before it */
    uint32_t a_type, b_type;
    uint32_t n_in, rank, n_out;
    float scale;
};

struct cu_lora_args {
    cu_lora_job job[LORA_JOBS];
    int n_jobs;
    size_t total; /* blocks: LORA_TOK rows of a job each */
};
static_assert(sizeof(cu_lora_args) <= 4096, "k_lora's parameter exceeds 4 KiB");

/* acc[t] = the warp's dot of row (n elements of type WT) with v + t * vs, for the first nt of
 * LORA_TOK vectors (every lane gets them). */
template <int WT>
__device__ __forceinline__ void lora_dot_t(const uint8_t *row, uint32_t n, const float *v,
                                           size_t vs, uint32_t nt, unsigned lane, float *acc)
{
    float s[LORA_TOK];
#pragma unroll
    for (int t = 0; t < LORA_TOK; t++)
        s[t] = 0.0f;
    if constexpr (WT == GGUF_T_F32 || WT == GGUF_T_F16 || WT == GGUF_T_BF16 || WT == GGUF_T_Q8_0) {
        for (uint32_t i = lane; i < n; i += 32) {
            const float w = row_elem<WT>(row, i);
#pragma unroll
            for (int t = 0; t < LORA_TOK; t++)
                if ((uint32_t)t < nt)
                    s[t] += w * v[t * vs + i];
        }
    } else {
        for (uint32_t i = lane * QK_CHUNK; i < n; i += 32 * QK_CHUNK) {
            float w[QK_CHUNK];
            qk_row8<WT>(row, i, w);
#pragma unroll
            for (int t = 0; t < LORA_TOK; t++)
                if ((uint32_t)t < nt)
#pragma unroll
                    for (int k = 0; k < QK_CHUNK; k++)
                        s[t] += w[k] * v[t * vs + i + k];
        }
    }
#pragma unroll
    for (int t = 0; t < LORA_TOK; t++)
        acc[t] = warp_sum(s[t]);
}

/* lora_dot_t for a type known at run time (the same for the whole warp). */
__device__ void lora_dot(uint32_t type, const uint8_t *row, uint32_t n, const float *v, size_t vs,
                         uint32_t nt, unsigned lane, float *acc)
{
    switch (type) {
    case GGUF_T_F32: lora_dot_t<GGUF_T_F32>(row, n, v, vs, nt, lane, acc); break;
    case GGUF_T_F16: lora_dot_t<GGUF_T_F16>(row, n, v, vs, nt, lane, acc); break;
    case GGUF_T_BF16: lora_dot_t<GGUF_T_BF16>(row, n, v, vs, nt, lane, acc); break;
    case GGUF_T_Q8_0: lora_dot_t<GGUF_T_Q8_0>(row, n, v, vs, nt, lane, acc); break;
#define QK_CASE(T, B, S)                                                                           \
    case T: lora_dot_t<T>(row, n, v, vs, nt, lane, acc); break;
        QK_TYPES(QK_CASE)
#undef QK_CASE
    default: /* refused on the host */
#pragma unroll
        for (int t = 0; t < LORA_TOK; t++)
            acc[t] = 0.0f;
        break;
    }
}

/* y[t] += scale * (B (A x[t])) for the launch's jobs, a block per LORA_TOK token rows of a job:
 * its warps take A's rows (the rows' rank products into h, shared), then B's rows, each product
 * scaled, then added (the cpu's order: two roundings, no fused multiply-add). F32 activations
 * and accumulation. */
__global__ void __launch_bounds__(LORA_WARPS * 32)
    k_lora(const __grid_constant__ cu_lora_args args, const float *x, size_t xs, float *y,
           size_t ys)
{
    extern __shared__ float h[]; /* (LORA_TOK, rank) */
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float acc[LORA_TOK];
    for (size_t blk = blockIdx.x; blk < args.total; blk += gridDim.x) {
        int j = 0;
        while (j + 1 < args.n_jobs && args.job[j + 1].first <= blk)
            j++;
        const cu_lora_job *jb = &args.job[j];
        const size_t done = (blk - jb->first) * LORA_TOK, r0 = jb->row0 + done;
        const uint32_t nt = (uint32_t)(jb->n_rows - done < LORA_TOK ? jb->n_rows - done : LORA_TOK);
        const uint32_t rank = jb->rank;
        for (uint32_t k = warp; k < rank; k += LORA_WARPS) {
            lora_dot(jb->a_type, jb->a + k * jb->a_rb, jb->n_in, x + r0 * xs, xs, nt, lane, acc);
#pragma unroll
            for (int t = 0; t < LORA_TOK; t++)
                if (lane == 0 && (uint32_t)t < nt)
                    h[t * rank + k] = acc[t];
        }
        __syncthreads();
        for (uint32_t i = warp; i < jb->n_out; i += LORA_WARPS) {
            lora_dot(jb->b_type, jb->b + i * jb->b_rb, rank, h, rank, nt, lane, acc);
#pragma unroll
            for (int t = 0; t < LORA_TOK; t++) {
                if (lane == 0 && (uint32_t)t < nt) {
                    float *yi = y + (r0 + t) * ys + i;
                    *yi = __fadd_rn(*yi, __fmul_rn(acc[t], jb->scale));
                }
            }
        }
        __syncthreads(); /* h is the next block's */
    }
}

/* 1 when the job's tensors can go to k_lora. */
static int lora_job_ok(const be_lora_t *jb)
{
    const be_tensor_t *t[2] = {jb->a, jb->b};
    for (int k = 0; k < 2; k++)
        if (!t[k]->data || !type_ok(t[k]->type) || !weight_aligned(t[k]) ||
            !quant_row_bytes(t[k]->type, t[k]->n_in) ||
            (qk_type(t[k]->type) && t[k]->n_in % QK_CHUNK))
            return 0;
    return jb->a->n_out == jb->b->n_in && jb->a->n_out <= LORA_RANK_MAX;
}

static int lora_launch(cu_ctx_t *c, const cu_lora_args *args, uint32_t rank_max, const float *x,
                       size_t xs, float *y, size_t ys)
{
    const size_t shm = (size_t)LORA_TOK * (rank_max ? rank_max : 1) * sizeof(float);
    k_lora<<<grid_x(args->total, 1), LORA_WARPS * 32, shm, c->compute>>>(*args, x, xs, y, ys);
    return launch_rc();
}

int cuda_mm_lora_mm(void *ctx, const be_lora_t *jobs, int n_jobs, const float *x, size_t x_stride,
                    float *y, size_t y_stride)
{
    cu_ctx_t *c = (cu_ctx_t *)ctx;
    for (int j = 0; j < n_jobs; j++)
        if (!lora_job_ok(&jobs[j]))
            return BE_ERR_ARG;
    int rc = use_dev(c);
    if (rc)
        return rc;
    cu_lora_args args;
    memset(&args, 0, sizeof args);
    uint32_t rank_max = 0;
    for (int j = 0; j < n_jobs && !rc; j++) {
        const be_lora_t *jb = &jobs[j];
        if (jb->n_rows == 0 || jb->b->n_out == 0)
            continue;
        const be_tensor_t *a = jb->a, *b = jb->b;
        args.job[args.n_jobs++] = (cu_lora_job){
            .a = (const uint8_t *)a->data,
            .b = (const uint8_t *)b->data,
            .a_rb = quant_row_bytes(a->type, a->n_in),
            .b_rb = quant_row_bytes(b->type, b->n_in),
            .row0 = jb->row0,
            .n_rows = jb->n_rows,
            .first = args.total,
            .a_type = a->type,
            .b_type = b->type,
            .n_in = a->n_in,
            .rank = a->n_out,
            .n_out = b->n_out,
            .scale = jb->scale,
        };
        args.total += (jb->n_rows + LORA_TOK - 1) / LORA_TOK;
        rank_max = a->n_out > rank_max ? a->n_out : rank_max;
        if (args.n_jobs == LORA_JOBS) {
            rc = lora_launch(c, &args, rank_max, x, x_stride, y, y_stride);
            args.n_jobs = 0;
            args.total = 0;
            rank_max = 0;
        }
    }
    if (!rc && args.n_jobs)
        rc = lora_launch(c, &args, rank_max, x, x_stride, y, y_stride);
    return rc;
}

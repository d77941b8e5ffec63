/* cuda_quant: the CUDA kernels of the block types beside Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS): decode, GEMV, embedding rows and F16 tiles for cuBLAS. */
/*
 * Included once by cuda_mm.cu after its device helpers (f16_to_f32, warp_sum)
 * and tuning constants (MM_WARPS, MM_TOK, MM_LOADS). The bit layouts are
 * those of daemon/kernels/quant_fmt.c (its unpack_* functions, which follow
 * ggml's block structs); every decoder below names the function it mirrors
 * and keeps its index math. Values are computed as quant_fmt.c's exact
 * dequantizer does, (d * sc) * q - dm * mn with each product and the
 * difference rounded on its own (no FMA), so a row decodes to the same
 * floats on both backends. Everything above the QK_DECODERS_ONLY line is
 * also compiled on the host by tests/tools/cuda_decode_check.cpp
 * (tests/integration/test_cuda_decode.sh), which checks every decoder
 * against quant_row_to_f32 bit for bit on machines without a GPU.
 */

/* The block types this file serves, with elements and bytes per block;
 * qk_type() checks them against wtype's table before any launch. */
#define QK_TYPES(X)                                                                                \
    X(GGUF_T_Q4_0, 32, 18)                                                                         \
    X(GGUF_T_Q4_1, 32, 20)                                                                         \
    X(GGUF_T_Q5_0, 32, 22)                                                                         \
    X(GGUF_T_Q5_1, 32, 24)                                                                         \
    X(GGUF_T_Q2_K, 256, 84)                                                                        \
    X(GGUF_T_Q3_K, 256, 110)                                                                       \
    X(GGUF_T_Q4_K, 256, 144)                                                                       \
    X(GGUF_T_Q5_K, 256, 176)                                                                       \
    X(GGUF_T_Q6_K, 256, 210)                                                                       \
    X(GGUF_T_IQ4_NL, 32, 18)                                                                       \
    X(GGUF_T_IQ4_XS, 256, 136)

/* Elements a lane decodes at once: every sub-block scale of these types
 * covers a multiple of 8 aligned elements, so one chunk has one scale. */
#define QK_CHUNK 8
/* Bytes of the F16 copy of a block-type weight that a prefill GEMM
 * dequantizes at once (rows at a time; at least one row). */
#define QK_HALF_MAX (64u << 20)

template <int WT> struct qk_fmt;
#define QK_FMT(T, B, S)                                                                            \
    template <> struct qk_fmt<T> {                                                                 \
        static constexpr uint32_t blck = B, bytes = S;                                             \
    };
QK_TYPES(QK_FMT)
#undef QK_FMT

/* The IQ4 grid as four little-endian words of four int8 levels, in
 * registers: lanes look up different levels at once, which a __constant__
 * table would serve one address at a time. */
struct qk_grid_words {
    uint32_t w[4];
};
__host__ __device__ constexpr qk_grid_words qk_grid_pack()
{
    constexpr int8_t g[16] = QUANT_IQ4_GRID;
    qk_grid_words p = {{0, 0, 0, 0}};
    for (int i = 0; i < 16; i++)
        p.w[i / 4] |= (uint32_t)(uint8_t)g[i] << 8 * (i % 4);
    return p;
}

/* Level n (0..15) of the grid: __byte_perm picks byte n % 8 of a word pair. */
__device__ __forceinline__ int qk_grid(uint32_t n)
{
    constexpr qk_grid_words G = qk_grid_pack();
    const uint32_t lo = __byte_perm(G.w[0], G.w[1], n & 7), hi = __byte_perm(G.w[2], G.w[3], n & 7);
    return (int8_t)(n & 8 ? hi : lo);
}

/* F16 at p (2-byte aligned: every block size here is even). */
__device__ __forceinline__ float qk_h(const uint8_t *p)
{
    return f16_to_f32(*(const uint16_t *)p);
}

/* quant_fmt.c q3_scale: scale i (0..15) of Q3_K's 12-byte field, offset 32. */
__device__ __forceinline__ int qk_q3_scale(const uint8_t *s, uint32_t i)
{
    const int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    const int hi = (s[8 + i % 4] >> 2 * (i / 4)) & 3;
    return (lo | hi << 4) - 32;
}

/* quant_fmt.c k4_scales_get: scale and min j (0..7) of Q4_K/Q5_K's 12 bytes. */
__device__ __forceinline__ void qk_k4_scale(const uint8_t *s, uint32_t j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Elements e .. e + 7 of the block at b (e a multiple of 8) into v. */
template <int WT> __device__ __forceinline__ void qk_dq8(const uint8_t *b, uint32_t e, float *v)
{
    int q[QK_CHUNK];
    float ds, ms = 0.0f; /* value = ds * q - ms */
    if constexpr (WT == GGUF_T_Q4_0 || WT == GGUF_T_IQ4_NL || WT == GGUF_T_Q4_1) {
        /* unpack_q4_0 / unpack_iq4_nl / unpack_q4_1: element j < 16 is the low
         * nibble of qs[j], element j + 16 the high nibble */
        const uint8_t *qs = b + (WT == GGUF_T_Q4_1 ? 4 : 2);
        const uint32_t j = e & 15, sh = e & 16 ? 4 : 0;
        ds = qk_h(b);
        /* one_scale: dm = -m with mn 1 (Q4_1), else dm = -0 with mn 0 */
        ms = WT == GGUF_T_Q4_1 ? -qk_h(b + 2) : -0.0f;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++) {
            const int n = (qs[j + k] >> sh) & 15;
            q[k] = WT == GGUF_T_Q4_0 ? n - 8 : WT == GGUF_T_IQ4_NL ? qk_grid(n) : n;
        }
    } else if constexpr (WT == GGUF_T_Q5_0 || WT == GGUF_T_Q5_1) {
        /* unpack_q5_0 / unpack_q5_1: as Q4_0, bit 4 of element i is bit i of qh */
        constexpr uint32_t hoff = WT == GGUF_T_Q5_0 ? 2 : 4;
        const uint8_t *hp = b + hoff, *qs = b + hoff + 4;
        const uint32_t qh =
            (uint32_t)hp[0] | (uint32_t)hp[1] << 8 | (uint32_t)hp[2] << 16 | (uint32_t)hp[3] << 24;
        const uint32_t j = e & 15, sh = e & 16 ? 4 : 0;
        ds = qk_h(b);
        ms = WT == GGUF_T_Q5_1 ? -qk_h(b + 2) : -0.0f;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++) {
            const int n = ((qs[j + k] >> sh) & 15) | (int)((qh >> (e + k)) & 1) << 4;
            q[k] = WT == GGUF_T_Q5_0 ? n - 16 : n;
        }
    } else if constexpr (WT == GGUF_T_Q2_K) {
        /* unpack_q2_k: element 128n + 32k + l is bits 2k..2k+1 of qs[32n + l];
         * scales[s] (s = element / 16): scale low nibble, min high nibble */
        const uint32_t s = e / 16, n = e / 128, k2 = e % 128 / 32, l = e % 32;
        ds = __fmul_rn(qk_h(b + 80), (float)(b[s] & 15));
        ms = __fmul_rn(qk_h(b + 82), (float)(b[s] >> 4));
        const uint8_t *qs = b + 16 + 32 * n + l;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++)
            q[k] = (qs[k] >> 2 * k2) & 3;
    } else if constexpr (WT == GGUF_T_Q3_K) {
        /* unpack_q3_k: low two bits as Q2_K in qs (b + 32); bit 4n + k of
         * hmask[l] set: low2, clear: low2 - 4; scales at b + 96 */
        const uint32_t n = e / 128, k2 = e % 128 / 32, l = e % 32;
        ds = __fmul_rn(qk_h(b + 108), (float)qk_q3_scale(b + 96, e / 16));
        const uint8_t *hm = b + l, *qs = b + 32 + 32 * n + l;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++) {
            const int lo = (qs[k] >> 2 * k2) & 3, hb = (hm[k] >> (4 * n + k2)) & 1;
            q[k] = lo - (hb ? 0 : 4);
        }
    } else if constexpr (WT == GGUF_T_Q4_K || WT == GGUF_T_Q5_K) {
        /* unpack_q4_k / unpack_q5_k: chunk c of 64 takes the low nibbles of
         * qs[32c..32c+31], then their high nibbles; Q5_K's bit 4 of element
         * 64c + 32h + l is bit 2c + h of qh[l] */
        const uint32_t c = e / 64, h = e % 64 / 32, l = e % 32;
        int sc, mn;
        qk_k4_scale(b + 4, e / 32, &sc, &mn);
        ds = __fmul_rn(qk_h(b), (float)sc);
        ms = __fmul_rn(qk_h(b + 2), (float)mn);
        const uint8_t *qs = b + (WT == GGUF_T_Q4_K ? 16 : 48) + 32 * c + l;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++) {
            int n = (qs[k] >> 4 * h) & 15;
            if constexpr (WT == GGUF_T_Q5_K)
                n |= ((b[16 + l + k] >> (2 * c + h)) & 1) << 4;
            q[k] = n;
        }
    } else if constexpr (WT == GGUF_T_Q6_K) {
        /* unpack_q6_k: in half n, element 32g + l takes nibble g / 2 of
         * ql[64n + 32(g % 2) + l] and bits 2g..2g+1 of qh[32n + l]; int8
         * scales at b + 192, one per 16 elements; offset 32 */
        const uint32_t n = e / 128, g = e % 128 / 32, l = e % 32;
        ds = __fmul_rn(qk_h(b + 208), (float)(int8_t)b[192 + e / 16]);
        const uint8_t *ql = b + 64 * n + 32 * (g % 2) + l, *qh = b + 128 + 32 * n + l;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++) {
            const int lo = (ql[k] >> 4 * (g / 2)) & 15, hi = (qh[k] >> 2 * g) & 3;
            q[k] = (lo | hi << 4) - 32;
        }
    } else {
        static_assert(WT == GGUF_T_IQ4_XS, "a type without a decoder");
        /* unpack_iq4_xs: sub-block s of 32 is one IQ4_NL block's nibbles at
         * qs[16s..] (b + 8); its six-bit scale (offset 32): low nibble s % 2
         * of scales_l[s / 2] (b + 4), top bits 2s..2s+1 of scales_h (b + 2) */
        const uint32_t s = e / 32, j = e % 32;
        const uint32_t sh = (uint32_t)b[2] | (uint32_t)b[3] << 8;
        const int ls = ((b[4 + s / 2] >> 4 * (s % 2)) & 15) | (int)((sh >> 2 * s) & 3) << 4;
        ds = __fmul_rn(qk_h(b), (float)(ls - 32));
        const uint8_t *qs = b + 8 + 16 * s + (j & 15);
        const uint32_t nsh = j & 16 ? 4 : 0;
#pragma unroll
        for (int k = 0; k < QK_CHUNK; k++)
            q[k] = qk_grid((qs[k] >> nsh) & 15);
    }
#pragma unroll
    for (int k = 0; k < QK_CHUNK; k++)
        v[k] = __fsub_rn(__fmul_rn(ds, (float)q[k]), ms);
}

/* Elements i .. i + 7 (i a multiple of 8) of a row of type WT into v. */
template <int WT> __device__ __forceinline__ void qk_row8(const uint8_t *row, size_t i, float *v)
{
    constexpr uint32_t B = qk_fmt<WT>::blck;
    qk_dq8<WT>(row + i / B * qk_fmt<WT>::bytes, (uint32_t)(i % B), v);
}

#ifndef QK_DECODERS_ONLY /* tests/tools/cuda_decode_check.cpp compiles the decoders above on the host */

template <int WT>
__global__ void k_embed_q(const uint8_t *tab, size_t row_bytes, uint32_t n, const int32_t *ids,
                          size_t n_tok, float *out, size_t stride)
{
    for (size_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const uint8_t *row = tab + (size_t)ids[t] * row_bytes;
        for (uint32_t c = threadIdx.x; c < n / QK_CHUNK; c += blockDim.x) {
            float v[QK_CHUNK];
            qk_row8<WT>(row, (size_t)c * QK_CHUNK, v);
#pragma unroll
            for (int k = 0; k < QK_CHUNK; k++)
                out[t * stride + (size_t)c * QK_CHUNK + k] = v[k];
        }
    }
}

/* y[t][r] = dot(W row r, x[t]) as k_gemv: one warp per row and MM_TOK
 * tokens, F32 activations and accumulation. Lane l decodes chunks of 8
 * elements at l * 8 + 256 u (a warp step covers 256 elements, one K block
 * or eight 32-blocks) and decodes MM_LOADS chunks before it uses any. */
template <int WT>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_gemv_q(const uint8_t *w, size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
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
    constexpr size_t STEP = 32 * QK_CHUNK;
    size_t i = (size_t)lane * QK_CHUNK;
    for (; i + (MM_LOADS - 1) * STEP < n_in; i += MM_LOADS * STEP) {
        float wv[MM_LOADS][QK_CHUNK];
#pragma unroll
        for (int u = 0; u < MM_LOADS; u++)
            qk_row8<WT>(row, i + u * STEP, wv[u]);
#pragma unroll
        for (int u = 0; u < MM_LOADS; u++)
            acc_tokens<QK_CHUNK>(wv[u], xt, xs, i + u * STEP, nt, acc);
    }
    for (; i < n_in; i += STEP) {
        float wv[QK_CHUNK];
        qk_row8<WT>(row, i, wv);
        acc_tokens<QK_CHUNK>(wv, xt, xs, i, nt, acc);
    }
    gemv_store(acc, lane, nt, y, ys, t0, r);
}

/* dst (n_rows, n_in) dense F16 = rows of W (row_bytes apart) decoded. */
template <int WT>
__global__ void k_dequant_half(uint16_t *dst, const uint8_t *w, size_t row_bytes, uint32_t n_in,
                               size_t n_rows)
{
    for (size_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
        for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < n_in / QK_CHUNK;
             c += (size_t)gridDim.x * blockDim.x) {
            float v[QK_CHUNK];
            qk_row8<WT>(w + r * row_bytes, c * QK_CHUNK, v);
#pragma unroll
            for (int k = 0; k < QK_CHUNK; k++)
                dst[r * n_in + c * QK_CHUNK + k] = __half_as_ushort(__float2half_rn(v[k]));
        }
    }
}

/* ------------------------------------------------------------------ host side */

/* 1 when t is one of QK_TYPES and its block matches wtype's table. */
static int qk_type(uint32_t t)
{
    uint32_t blck = 0, bytes = 0;
    switch (t) {
#define QK_CASE(T, B, S)                                                                           \
    case T: return gguf_ttype_traits(t, &blck, &bytes) == 0 && blck == (B) && bytes == (S);
        QK_TYPES(QK_CASE)
#undef QK_CASE
    default: return 0;
    }
}

/* The launches, by type (t one of QK_TYPES); launch errors are read by the caller. */
static void qk_embed_launch(uint32_t t, unsigned grid, cudaStream_t s, const uint8_t *tab,
                            size_t row_bytes, uint32_t n, const int32_t *ids, size_t n_tok,
                            float *out, size_t stride)
{
    switch (t) {
#define QK_CASE(T, B, S)                                                                           \
    case T:                                                                                        \
        k_embed_q<T><<<grid, EW_THREADS, 0, s>>>(tab, row_bytes, n, ids, n_tok, out, stride);      \
        break;
        QK_TYPES(QK_CASE)
#undef QK_CASE
    default: break;
    }
}

static void qk_gemv_launch(uint32_t t, dim3 grid, cudaStream_t s, const uint8_t *w,
                           size_t row_bytes, uint32_t n_in, uint32_t n_out, const float *x,
                           size_t xs, float *y, size_t ys, uint32_t n_tok)
{
    switch (t) {
#define QK_CASE(T, B, S)                                                                           \
    case T:                                                                                        \
        k_gemv_q<T>                                                                                \
            <<<grid, MM_WARPS * 32, 0, s>>>(w, row_bytes, n_in, n_out, x, xs, y, ys, n_tok);       \
        break;
        QK_TYPES(QK_CASE)
#undef QK_CASE
    default: break;
    }
}

static void qk_half_launch(uint32_t t, dim3 grid, cudaStream_t s, uint16_t *dst, const uint8_t *w,
                           size_t row_bytes, uint32_t n_in, size_t n_rows)
{
    switch (t) {
#define QK_CASE(T, B, S)                                                                           \
    case T: k_dequant_half<T><<<grid, EW_THREADS, 0, s>>>(dst, w, row_bytes, n_in, n_rows); break;
        QK_TYPES(QK_CASE)
#undef QK_CASE
    default: break;
    }
}

#endif /* QK_DECODERS_ONLY */

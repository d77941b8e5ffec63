/* quant_avx512: quant's AVX-512 kernels (x86, compiled per function for AVX-512 F/BW/VL/VNNI; picked at run time by quant.c): the float tiles, the Q8_0, Q4_K and Q6_K integer dots, Q8_0's prefill tiles and Q4_K's and Q6_K's 16-row decode kernels. */
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
/* ------------------------------------------------------------------ AVX-512 kernels
 * 64 bytes an instruction (AVX-512 F, BW, VL and VNNI): the F32/F16/BF16
 * tile with 16-lane accumulators in register tiles of up to 4 rows x 6
 * vectors (prefill uses 4 x 6, its accumulators named), and the integer
 * dots of Q8_0, Q4_K and Q6_K (the other block types keep their AVX2
 * kernels). Within a block every product and sum is exact (maddubs, then
 * vpdpwssd by the sub-block scales). Q8_0 sums blocks in float lanes, as
 * llama.cpp does (one horizontal sum a row, not one a block): it differs
 * from the portable dot by float rounding only (tested within 1e-5 of the
 * sum of |products|). Q4_K and Q6_K reduce each block's integer sums and
 * take the portable float terms, bit for bit as quant_k512.c's prefill
 * tiles; their decode kernels do so sixteen rows at a time (one reduction
 * tree for the sixteen). Every kernel keeps one chain per (row, vector) in
 * one order whatever the tile shape, so batched, prefilled and
 * token-by-token results stay identical. */
#define AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define AVX512 __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

AVX512_INLINE __m512 load16(uint32_t type, const uint8_t *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    case GGUF_T_BF16: {
        __m512i v =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    default: return _mm512_loadu_ps((const float *)w + i);
    }
}

AVX512_INLINE void tile_avx512_body(uint32_t type, const uint8_t *w, size_t rb, int nr,
                                    const float *const *x, int nx, size_t n, float *out)
{
    __m512 acc[24];
#pragma GCC unroll 24
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* the rows' weights held, one activation vector at a time (at 4 x 6,
         * 24 accumulators + 4 + 1 of the 32 registers: GCC spills some) */
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            wv[r] = load16(type, w + (size_t)r * rb, i);
#pragma GCC unroll 6
        for (int t = 0; t < nx; t++) {
            __m512 xv = _mm512_loadu_ps(x[t] + i);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc[r * nx + t] = _mm512_fmadd_ps(wv[r], xv, acc[r * nx + t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
#pragma GCC unroll 6
        for (int t = 0; t < nx; t++) {
            float s = _mm512_reduce_add_ps(acc[r * nx + t]);
            for (size_t j = i; j < n; j++)
                s += w_at(type, w + (size_t)r * rb, j) * x[t][j];
            out[r * nx + t] = s;
        }
    }
}

/* the end of one (row, vector) of a float tile: the lanes' sum, then the
 * elements past the last 16, as tile_avx512_body ends */
AVX512_INLINE float tile_avx512_end(uint32_t type, const uint8_t *w, const float *x, __m512 acc,
                                    size_t i, size_t n)
{
    float s = _mm512_reduce_add_ps(acc);
    for (size_t j = i; j < n; j++)
        s += w_at(type, w, j) * x[j];
    return s;
}

/* The 4 x 6 tile with its 24 accumulators named (GCC keeps the generic
 * body's accumulator array in memory, a load and a store per FMA): the
 * generic body's operations in its order, so the same results. 24
 * accumulators, 4 weight vectors and 1 activation vector: 29 of the 32
 * registers. */
#define T46_ROW(r)                                                                                 \
    __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0, \
           c##r##4 = c##r##0, c##r##5 = c##r##0;
#define T46_FMA(t)                                                                                 \
    {                                                                                              \
        __m512 xv = _mm512_loadu_ps(x[t] + i);                                                     \
        c0##t = _mm512_fmadd_ps(v0, xv, c0##t);                                                    \
        c1##t = _mm512_fmadd_ps(v1, xv, c1##t);                                                    \
        c2##t = _mm512_fmadd_ps(v2, xv, c2##t);                                                    \
        c3##t = _mm512_fmadd_ps(v3, xv, c3##t);                                                    \
    }
#define T46_END(r)                                                                                 \
    {                                                                                              \
        const uint8_t *wr = w + (size_t)(r)*rb;                                                    \
        out[r * 6 + 0] = tile_avx512_end(type, wr, x[0], c##r##0, i, n);                           \
        out[r * 6 + 1] = tile_avx512_end(type, wr, x[1], c##r##1, i, n);                           \
        out[r * 6 + 2] = tile_avx512_end(type, wr, x[2], c##r##2, i, n);                           \
        out[r * 6 + 3] = tile_avx512_end(type, wr, x[3], c##r##3, i, n);                           \
        out[r * 6 + 4] = tile_avx512_end(type, wr, x[4], c##r##4, i, n);                           \
        out[r * 6 + 5] = tile_avx512_end(type, wr, x[5], c##r##5, i, n);                           \
    }
AVX512_INLINE void tile46_avx512_body(uint32_t type, const uint8_t *w, size_t rb,
                                      const float *const *x, size_t n, float *out)
{
    T46_ROW(0) T46_ROW(1) T46_ROW(2) T46_ROW(3) size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v0 = load16(type, w, i), v1 = load16(type, w + rb, i);
        __m512 v2 = load16(type, w + 2 * rb, i), v3 = load16(type, w + 3 * rb, i);
        T46_FMA(0) T46_FMA(1) T46_FMA(2) T46_FMA(3) T46_FMA(4) T46_FMA(5)
    }
    T46_END(0) T46_END(1) T46_END(2) T46_END(3)
}
#undef T46_ROW
#undef T46_FMA
#undef T46_END

/* the 4 x 6 tile of each float type, apart (inlined into quant_avx512_tile's many shapes, its
 * registers spill) */
AVX512 __attribute__((noinline)) static void tile46_avx512(uint32_t type, const uint8_t *w,
                                                           size_t rb, const float *const *x,
                                                           size_t n, float *out)
{
    switch (type) {
    case GGUF_T_F16: tile46_avx512_body(GGUF_T_F16, w, rb, x, n, out); break;
    case GGUF_T_BF16: tile46_avx512_body(GGUF_T_BF16, w, rb, x, n, out); break;
    default: tile46_avx512_body(GGUF_T_F32, w, rb, x, n, out); break;
    }
}

/* Decode (one vector, many rows): row after row, each its one chain in the one-row order (so
 * the same results as any tile shape), prefetching the weights ROWS_PF bytes ahead in the rows'
 * one stream: F16 decode 50 -> 54 tok/s, Q8_0's 60 -> 80 (one thread). Eight rows' chains at
 * once, eight streams, measured 58 -> 43; two, 52 -> 47 (on AVX2 two win: rows_avx2). */
#define ROWS_PF 1024 /* bytes ahead: 512-8192 measured, 1024-2048 best */
AVX512_INLINE void rows_avx512_body(uint32_t type, const uint8_t *w, size_t rb, int nr,
                                    const float *x, size_t n, float *out)
{
    size_t es = type == GGUF_T_F32 ? 4 : 2;
    for (int r = 0; r < nr; r++, w += rb) {
        __m512 c0 = _mm512_setzero_ps();
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            if ((i * es) % 64 == 0)
                _mm_prefetch((const char *)w + i * es + ROWS_PF, _MM_HINT_T0);
            c0 = _mm512_fmadd_ps(load16(type, w, i), _mm512_loadu_ps(x + i), c0);
        }
        out[r] = tile_avx512_end(type, w, x, c0, i, n);
    }
}

AVX512 __attribute__((noinline)) static void rows_avx512(uint32_t type, const uint8_t *w, size_t rb,
                                                         int nr, const float *x, size_t n,
                                                         float *out)
{
    switch (type) {
    case GGUF_T_F16: rows_avx512_body(GGUF_T_F16, w, rb, nr, x, n, out); break;
    case GGUF_T_BF16: rows_avx512_body(GGUF_T_BF16, w, rb, nr, x, n, out); break;
    default: rows_avx512_body(GGUF_T_F32, w, rb, nr, x, n, out); break;
    }
}

/* (kept by hand: one row of cases per tile height) */
// clang-format off
/* Specialise on (nr, nx), up to 4 x 6, so the loops unroll into registers. */
#define TILE16_CASE(R, X, type)                                                                    \
    case R * 8 + X: tile_avx512_body(type, w, rb, R, x, X, n, out); break;
#define TILE16_SHAPES(type)                                                                        \
    switch (nr * 8 + nx) {                                                                         \
    case 4 * 8 + 6: tile46_avx512(type, w, rb, x, n, out); break;                                  \
    TILE16_CASE(1, 1, type) TILE16_CASE(1, 2, type) TILE16_CASE(1, 3, type) TILE16_CASE(1, 4, type) \
    TILE16_CASE(2, 1, type) TILE16_CASE(2, 2, type) TILE16_CASE(2, 3, type) TILE16_CASE(2, 4, type) \
    TILE16_CASE(3, 1, type) TILE16_CASE(3, 2, type) TILE16_CASE(3, 3, type) TILE16_CASE(3, 4, type) \
    TILE16_CASE(4, 1, type) TILE16_CASE(4, 2, type) TILE16_CASE(4, 3, type) TILE16_CASE(4, 4, type) \
    TILE16_CASE(1, 5, type) TILE16_CASE(2, 5, type) TILE16_CASE(3, 5, type) TILE16_CASE(4, 5, type) \
    TILE16_CASE(1, 6, type) TILE16_CASE(2, 6, type) TILE16_CASE(3, 6, type)                         \
    default:                                                                                       \
        for (int r_ = 0; r_ < nr; r_++)                                                            \
            for (int t_ = 0; t_ < nx; t_++)                                                        \
                tile_avx512_body(type, w + (size_t)r_ * rb, rb, 1, &x[t_], 1, n,                  \
                                 &out[r_ * nx + t_]);                                              \
        break;                                                                                     \
    }
// clang-format on

AVX512 void quant_avx512_tile(uint32_t type, const void *wv, size_t rb, int nr,
                              const float *const *x, int nx, size_t n, float *out)
{
    const uint8_t *w = wv;
    if (type != GGUF_T_Q8_0 && nx == 1 && nr >= 8) {
        rows_avx512(type, w, rb, nr, x[0], n, out);
        return;
    }
    switch (type) {
    case GGUF_T_Q8_0: quant_avx2_tile(type, wv, rb, nr, x, nx, n, out); break; /* the exact path */
    case GGUF_T_F16: TILE16_SHAPES(GGUF_T_F16) break;
    case GGUF_T_BF16: TILE16_SHAPES(GGUF_T_BF16) break;
    default: TILE16_SHAPES(GGUF_T_F32) break;
    }
}

/* Q8_0: one block a 256-bit vector, |q| x (x with q's sign) by the EVEX
 * vpdpbusd (AVX-512 VL + VNNI: CPUs with AVX-512 VNNI but no AVX-VNNI have
 * it too), the AVX-VNNI kernel's very lanes, so the same results. Two
 * blocks a 512-bit vector measured slower here (decode 147-174 vs
 * 178-196 tok/s on the 134M shape, one thread, side by side). */
AVX512_INLINE void vdot_q8_0_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    __m256 acc[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i aq = _mm256_abs_epi8(q);
        float d = rd_f16c(w);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = hsum256(acc[t]);
}

/* Lane i: the sum of v[i]'s sixteen int32 lanes, by a transpose-and-add
 * tree (three operations a vector, not a reduction each). */
AVX512_INLINE __m512i reduce16_epi32(const __m512i *v)
{
    __m512i x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* 128-bit lane L: v[2i]'s partials at 0, 2, v[2i + 1]'s at 1, 3 */
        x[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* 128-bit lane L, dword j: lane L of v[4i + j] */
        y[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(x[2 * i], x[2 * i + 1]),
                                _mm512_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        z[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(y[2 * i], y[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(y[2 * i], y[2 * i + 1], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(z[0], z[1], 0x88),
                            _mm512_shuffle_i32x4(z[0], z[1], 0xdd));
}

/* Q4_K: per 64 values, the low nibbles of 32 bytes (sub-block 2c) then
 * their high nibbles (2c + 1) in one vector, against 64 activations; per
 * block the integer sums (values x scales in sum[t], activation sums x
 * mins in mins[t], as lanes), then k_term: the portable dot bit for bit,
 * as quant_k512.c's prefill tile (decode and prefill must agree). */
AVX512_INLINE void q4k_block_sums(const uint8_t *w, const void *const *xq, size_t k, int nx,
                                  __m512i *sum, __m512i *mins)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    uint8_t sc[8], mn[8];
    k4_scales_bytes(w + 4, sc, mn);
    uint64_t sc64, mn64;
    memcpy(&sc64, sc, 8);
    memcpy(&mn64, mn, 8);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
    __m256i mnv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn64), dup));
    for (int t = 0; t < nx; t++)
        sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c)));
        __m512i q = _mm512_and_si512(_mm512_srlv_epi16(b, shv), m4);
        /* int16 lanes 0..15: scale 2c, 16..31: scale 2c + 1 */
        __m512i s =
            _mm512_permutexvar_epi16(_mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                                                        _mm256_set1_epi16((short)(2 * c + 1)), 1),
                                     sc16);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * c;
            __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)aq));
            sum[t] = _mm512_dpwssd_epi32(sum[t], p, s);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nx; t++) {
        const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
        __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
        mins[t] = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, mnv));
    }
}

AVX512_INLINE void vdot_q4_k_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 144) {
        __m512i sum[QUANT_DOTN_MAX], mins[QUANT_DOTN_MAX];
        q4k_block_sums(w, xq, k, nx, sum, mins);
        float d = rd_f16c(w), dm = rd_f16c(w + 2);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            acc[t] += k_term(d, dm, _mm512_reduce_add_epi32(sum[t]),
                             hsum_i32(_mm512_castsi512_si256(mins[t])), a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* 16 rows' dwords at byte offset off of block k (rows rb bytes apart), lane r: row r */
AVX512_INLINE __m512i rows16_dword(const uint8_t *w, size_t rb, size_t off)
{
    __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)rb));
    return _mm512_i32gather_epi32(idx, w + off, 1);
}

/* Q4_K decode, sixteen rows at a time against one token: each row's
 * values x scales as above, the sixteen rows' reduced together (lane r:
 * row r); the mins, d and dmin by gathers, lane r row r; the float terms
 * lane by lane, in the portable order. Rows over 2^31 / 16 bytes (past the
 * gathers' int32 offsets) and the last nr % 16: the one-row kernel. */
/* Decode kernels of 16 rows: the next group's rows prefetched while this group runs, a line at a
 * time (two threads, whose chunks of rows interleave: Q4_K_M decode 233-265 -> 335-357 tok/s,
 * Q6_K 180 -> 243-255; one thread within noise) */
AVX512_INLINE void rows16_prefetch_next(const uint8_t *w, size_t rb, int r0, int nr)
{
    int n = nr - (r0 + 16) < 16 ? nr - (r0 + 16) : 16;
    if (n <= 0)
        return;
    const char *p = (const char *)(w + (size_t)(r0 + 16) * rb);
    for (size_t o = 0; o < (size_t)n * rb; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T0);
}

AVX512 static void vrows_q4_k_avx512(const uint8_t *w, size_t rb, int nr, const void *xq,
                                     size_t nblk, float *out)
{
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m2 = _mm512_set1_epi32(0x03030303), ff = _mm512_set1_epi32(0xff);
    int r0 = 0;
    for (; rb <= 0x7fffffff / 16 && r0 + 16 <= nr; r0 += 16) {
        __m512 acc = _mm512_setzero_ps();
        rows16_prefetch_next(w, rb, r0, nr);
        for (size_t k0 = 0; k0 < nblk; k0 += 8) {
            /* row by row over 8 blocks (each row's bytes in order), then block by block */
            int nb = nblk - k0 < 8 ? (int)(nblk - k0) : 8;
            __m512i S[8][16], mins;
            for (int r = 0; r < 16; r++)
                for (int kk = 0; kk < nb; kk++)
                    q4k_block_sums(w + (size_t)(r0 + r) * rb + (k0 + (size_t)kk) * 144, &xq,
                                   k0 + (size_t)kk, 1, &S[kk][r], &mins);
            for (int kk = 0; kk < nb; kk++) {
                size_t k = k0 + (size_t)kk;
                const uint8_t *b0 = w + (size_t)r0 * rb + k * 144;
                const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq + k;
                __m512i h = rows16_dword(b0, rb, 0), sb = rows16_dword(b0, rb, 8);
                __m512i sc = rows16_dword(b0, rb, 12);
                /* mins 0..3 and 4..7 (k4_scales_bytes), int16 pairs against sub-block sums */
                __m512i n03 = _mm512_and_si512(sb, m6);
                __m512i n47 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(sc, 4), m4),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sb, 6), m2), 4));
                __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums),
                                               _mm256_set1_epi16(1));
                bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(bs, bs), 0x08);
                int32_t bw[8];
                _mm256_storeu_si256((__m256i *)bw, bs);
                __m512i sm = _mm512_setzero_si512();
                for (int j = 0; j < 4; j++) {
                    __m512i v = _mm512_srli_epi32(j < 2 ? n03 : n47, (unsigned)(16 * (j % 2)));
                    __m512i pr = _mm512_or_si512(
                        _mm512_and_si512(v, ff),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8), ff), 16));
                    sm = _mm512_dpwssd_epi32(sm, pr, _mm512_set1_epi32(bw[j]));
                }
                __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
                __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
                __m512 v =
                    _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(reduce16_epi32(S[kk]))),
                                  _mm512_mul_ps(dm, _mm512_cvtepi32_ps(sm)));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(a->d), v));
            }
        }
        _mm512_storeu_ps(out + r0, acc);
    }
    for (; r0 < nr; r0++)
        vdot_q4_k_avx512_body(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

/* Q6_K: per half (128 values), the low nibbles of its 64 ql bytes with qh
 * bits 0-1 / 2-3 (values 0..63), then the high nibbles with bits 4-5 / 6-7
 * (64..127), each as value + 32; the offset comes back with the
 * activation sums, as in the AVX2 kernel (sum[t]: the block's integer sum
 * as lanes); then k_term: the portable dot bit for bit, as quant_k512.c's
 * prefill tile. */
AVX512_INLINE void q6k_block_sums(const uint8_t *w, const void *const *xq, size_t k, int nx,
                                  __m512i *sum, int with_off)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    /* int16 lane i of the 64 values [h]alf-quarter pair: scale 8n + 4h + i / 8 */
    const __m512i lane = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22,
                                                            21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                                            11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           3);
    __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
    __m512i sc16 = _mm512_zextsi256_si512(sc16y);
    for (int t = 0; t < nx; t++)
        sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        __m512i ql = _mm512_loadu_si512((const void *)(w + 64 * n));
        __m512i qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * n)));
        __m512i q01 = _mm512_or_si512(
            _mm512_and_si512(ql, m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh01), m2), 4));
        __m512i q23 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m2), 4));
        __m512i s01 = _mm512_permutexvar_epi16(
            _mm512_add_epi16(lane, _mm512_set1_epi16((short)(8 * n))), sc16);
        __m512i s23 = _mm512_permutexvar_epi16(
            _mm512_add_epi16(lane, _mm512_set1_epi16((short)(8 * n + 4))), sc16);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n;
            __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512((const void *)aq));
            __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512((const void *)(aq + 64)));
            sum[t] = _mm512_dpwssd_epi32(sum[t], p01, s01);
            sum[t] = _mm512_dpwssd_epi32(sum[t], p23, s23);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; with_off && t < nx; t++) {
        const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
        __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
        /* the offset: 32 x activation sums x scales, off the first 8 lanes */
        sum[t] = _mm512_sub_epi32(
            sum[t], _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_madd_epi16(bs, sc16y), 5)));
    }
}

AVX512_INLINE void vdot_q6_k_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 210) {
        __m512i sum[QUANT_DOTN_MAX];
        q6k_block_sums(w, xq, k, nx, sum, 1);
        float d = rd_f16c(w + 208);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++)
            acc[t] += k_term(d, 0.0f, _mm512_reduce_add_epi32(sum[t]), 0,
                             (const quant_act_q8k_t *)xq[t] + k);
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* Q6_K decode, sixteen rows at a time against one token, as Q4_K's (d by a gather). */
AVX512 static void vrows_q6_k_avx512(const uint8_t *w, size_t rb, int nr, const void *xq,
                                     size_t nblk, float *out)
{
    int r0 = 0;
    for (; rb <= 0x7fffffff / 16 && r0 + 16 <= nr; r0 += 16) {
        __m512 acc = _mm512_setzero_ps();
        rows16_prefetch_next(w, rb, r0, nr);
        for (size_t k0 = 0; k0 < nblk; k0 += 8) {
            int nb = nblk - k0 < 8 ? (int)(nblk - k0) : 8;
            __m512i S[8][16];
            for (int r = 0; r < 16; r++)
                for (int kk = 0; kk < nb; kk++)
                    q6k_block_sums(w + (size_t)(r0 + r) * rb + (k0 + (size_t)kk) * 210, &xq,
                                   k0 + (size_t)kk, 1, &S[kk][r], 0);
            for (int kk = 0; kk < nb; kk++) {
                size_t k = k0 + (size_t)kk;
                const uint8_t *b0 = w + (size_t)r0 * rb + k * 210;
                const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq + k;
                /* the offset, lane r row r: scales 2j, 2j + 1 as int16 pairs against the
                 * activation sums' dword j */
                int32_t bw[8];
                memcpy(bw, a->bsums, 32);
                __m512i off = _mm512_setzero_si512();
                const __m512i lo16 = _mm512_set1_epi32(0xffff);
                for (int j = 0; j < 4; j++) {
                    __m512i sc = rows16_dword(b0, rb, 192 + 4 * (size_t)j);
                    __m512i e = _mm512_srai_epi16(_mm512_slli_epi16(sc, 8), 8);
                    __m512i od = _mm512_srai_epi16(sc, 8);
                    __m512i p0 =
                        _mm512_or_si512(_mm512_and_si512(e, lo16), _mm512_slli_epi32(od, 16));
                    __m512i p1 =
                        _mm512_or_si512(_mm512_srli_epi32(e, 16), _mm512_andnot_si512(lo16, od));
                    off = _mm512_dpwssd_epi32(off, p0, _mm512_set1_epi32(bw[2 * j]));
                    off = _mm512_dpwssd_epi32(off, p1, _mm512_set1_epi32(bw[2 * j + 1]));
                }
                /* d: the high half of the dword at 206 (no read past the block) */
                __m512 d = _mm512_cvtph_ps(
                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(rows16_dword(b0, rb, 206), 16)));
                /* k_term with no mins: a->d * (d * sq - 0) */
                __m512i sq = _mm512_sub_epi32(reduce16_epi32(S[kk]), _mm512_slli_epi32(off, 5));
                __m512 v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sq));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(a->d), v));
            }
        }
        _mm512_storeu_ps(out + r0, acc);
    }
    for (; r0 < nr; r0++)
        vdot_q6_k_avx512_body(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

#define VDOT512_SHAPES(body)                                                                       \
    AVX512 static void body##_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,     \
                                 float *out)                                                       \
    {                                                                                              \
        switch (nx) {                                                                              \
        case 1: body##_body(w, xq, 1, nblk, out); break;                                           \
        case 2: body##_body(w, xq, 2, nblk, out); break;                                           \
        case 3: body##_body(w, xq, 3, nblk, out); break;                                           \
        default: body##_body(w, xq, 4, nblk, out); break;                                          \
        }                                                                                          \
    }
VDOT512_SHAPES(vdot_q8_0_avx512)
VDOT512_SHAPES(vdot_q4_k_avx512)
VDOT512_SHAPES(vdot_q6_k_avx512)

/* Q8_0 prefill: a register tile of up to 4 rows x 4 token pairs, each
 * weight block loaded once for every token and each activation block once
 * for every row. The weights go unsigned (q + 128, by xor), so rows share
 * the activations as they are; each lane starts from -128 x the sum of its
 * four activations and vpdpbusd adds the four (q + 128) x a products: the
 * exact q x a lane sums of the one-row kernel above. A 512-bit vector holds
 * one block of two tokens (lanes 0-7, 8-15), scaled and summed in the very
 * float order of the one-row kernel, so every result is bit-identical to
 * it. */
AVX512_INLINE void vtile_q8_0_avx512_body(const uint8_t *w, size_t rb, const void *const *xq,
                                          size_t nblk, float *out, int ostride, int R, int P)
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < R * P; i++)
        acc[i] = _mm512_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        __m512i wu[4];
        __m512 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + (size_t)r * rb + 34 * k;
            wu[r] = _mm512_xor_si512(
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 2))), c80);
            dw[r] = _mm512_set1_ps(rd_f16c(b));
        }
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const quant_act_q8_t *a0 = (const quant_act_q8_t *)xq[2 * p] + k;
            const quant_act_q8_t *a1 = (const quant_act_q8_t *)xq[2 * p + 1] + k;
            __m512i x = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a0->qs)),
                _mm256_loadu_si256((const __m256i *)a1->qs), 1);
            __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c80, x));
            __m512 da = _mm512_mask_mov_ps(_mm512_set1_ps(a0->d), 0xff00, _mm512_set1_ps(a1->d));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i s = _mm512_dpbusd_epi32(corr, wu[r], x);
                acc[r * P + p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], da),
                                                 acc[r * P + p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            __m512i v = _mm512_castps_si512(acc[r * P + p]);
            out[r * ostride + 2 * p] = hsum256(_mm512_castps512_ps256(acc[r * P + p]));
            out[r * ostride + 2 * p + 1] =
                hsum256(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(v, 1)));
        }
}

/* (kept by hand: one row of cases per tile height) */
// clang-format off
#define VTILE8_CASE(R, P)                                                                          \
    case R * 8 + P: vtile_q8_0_avx512_body(w, rb, xq, nblk, out, ostride, R, P); break;
// clang-format on

/* Any nr x nx: tiles of up to 4 rows x 4 token pairs; an odd last token
 * takes the one-row kernel (the same results). */
AVX512 static void vtile_q8_0_avx512(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                     int nx, size_t nblk, float *out0)
{
    int np = nx / 2, ostride = nx;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        int R = nr - r0 < 4 ? nr - r0 : 4;
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (int p0 = 0; p0 < np; p0 += 4) {
            int P = np - p0 < 4 ? np - p0 : 4;
            const void *const *xq = xq0 + 2 * p0;
            float *out = out0 + (size_t)r0 * nx + 2 * p0;
            // clang-format off
            switch (R * 8 + P) {
            VTILE8_CASE(1, 1) VTILE8_CASE(1, 2) VTILE8_CASE(1, 3) VTILE8_CASE(1, 4)
            VTILE8_CASE(2, 1) VTILE8_CASE(2, 2) VTILE8_CASE(2, 3) VTILE8_CASE(2, 4)
            VTILE8_CASE(3, 1) VTILE8_CASE(3, 2) VTILE8_CASE(3, 3) VTILE8_CASE(3, 4)
            VTILE8_CASE(4, 1) VTILE8_CASE(4, 2) VTILE8_CASE(4, 3) default: VTILE8_CASE(4, 4)
            }
            // clang-format on
        }
        if (nx & 1)
            for (int r = 0; r < R; r++)
                vdot_q8_0_avx512_body(w + (size_t)r * rb, xq0 + nx - 1, 1, nblk,
                                      out0 + (size_t)(r0 + r) * nx + nx - 1);
    }
}
#undef VTILE8_CASE

/* Q8_0 decode: the one-row dot row by row (the same results), each row's lines prefetched
 * ROWS_PF bytes ahead (as rows_avx512) */
AVX512 static void vrows_q8_0_avx512(const uint8_t *w, size_t rb, int nr, const void *xq,
                                     size_t nblk, float *out)
{
    for (int r = 0; r < nr; r++, w += rb) {
        for (size_t o = 0; o < rb; o += 64)
            _mm_prefetch((const char *)w + o + ROWS_PF, _MM_HINT_T0);
        vdot_q8_0_avx512_body(w, &xq, 1, nblk, out + r);
    }
}

vdot_row_fn quant_avx512_vdot_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q8_0: return vdot_q8_0_avx512_nx;
    case GGUF_T_Q4_K: return vdot_q4_k_avx512_nx;
    case GGUF_T_Q6_K: return vdot_q6_k_avx512_nx;
    default: return NULL;
    }
}

vrows_fn quant_avx512_vrows_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q8_0: return vrows_q8_0_avx512;
    case GGUF_T_Q4_K: return vrows_q4_k_avx512;
    case GGUF_T_Q6_K: return vrows_q6_k_avx512;
    default: return NULL;
    }
}

vtile_fn quant_avx512_vtile_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_avx512 : quant_k512_vtile_for(type);
}
#endif

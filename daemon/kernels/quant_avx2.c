/* quant_avx2: quant's AVX2 kernels (x86, compiled per function for avx2, fma and f16c; picked at run time by quant.c): the float tiles, the integer dots, their AVX-VNNI variants, F16 rows and the activation quantizers. */
#include <math.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
/* ------------------------------------------------------------------ AVX2 kernels */

AVX2_INLINE __m256 load8(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    case GGUF_T_BF16: {
        __m256i v =
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    default: return _mm256_loadu_ps((const float *)w + i);
    }
}

/* nr rows x nx vectors (nr * nx <= QUANT_TILE_MAX), one accumulator per
 * pair: each weight chunk is loaded once for nx vectors, each vector chunk
 * once for nr rows. */
AVX2_INLINE void tile_avx2_body(uint32_t type, const uint8_t *w, size_t rb, int nr,
                                const float *const *x, int nx, size_t n, float *out)
{
    __m256 acc[QUANT_TILE_MAX];
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[QUANT_DOTN_MAX];
#pragma GCC unroll 8
        for (int t = 0; t < nx; t++)
            xv[t] = _mm256_loadu_ps(x[t] + i);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            __m256 wv = load8(type, w + (size_t)r * rb, i);
#pragma GCC unroll 8
            for (int t = 0; t < nx; t++)
                acc[r * nx + t] = _mm256_fmadd_ps(wv, xv[t], acc[r * nx + t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < nx; t++) {
            float s = hsum256(acc[r * nx + t]);
            for (size_t j = i; j < n; j++)
                s += w_at(type, w + (size_t)r * rb, j) * x[t][j];
            out[r * nx + t] = s;
        }
    }
}

/* The 4 x 3 tile (4 rows, 3 vectors) with its 12 accumulators named (GCC keeps the generic body's
 * accumulator array in memory, a load and a store per FMA): the 3 vectors' chunks and one row's,
 * all 16 registers; 7 loads for 12 FMAs (F16 prefill 1.4x the 2 x 4 tile's, 6 loads for 8). The
 * generic body's operations in its order (lane sums, then the tail added element by element), so
 * the same results. */
#define T43_FMA(r)                                                                                 \
    {                                                                                              \
        __m256 wv = load8(type, w + (size_t)(r)*rb, i);                                            \
        c##r##0 = _mm256_fmadd_ps(wv, x0, c##r##0);                                                \
        c##r##1 = _mm256_fmadd_ps(wv, x1, c##r##1);                                                \
        c##r##2 = _mm256_fmadd_ps(wv, x2, c##r##2);                                                \
    }
#define T43_END(r, t) out[(r)*3 + (t)] = hsum256(c##r##t)
AVX2_INLINE void tile43_avx2_body(uint32_t type, const uint8_t *w, size_t rb, const float *const *x,
                                  size_t n, float *out)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x0 = _mm256_loadu_ps(x[0] + i), x1 = _mm256_loadu_ps(x[1] + i);
        __m256 x2 = _mm256_loadu_ps(x[2] + i);
        T43_FMA(0) T43_FMA(1) T43_FMA(2) T43_FMA(3)
    }
    T43_END(0, 0);
    T43_END(0, 1);
    T43_END(0, 2);
    T43_END(1, 0);
    T43_END(1, 1);
    T43_END(1, 2);
    T43_END(2, 0);
    T43_END(2, 1);
    T43_END(2, 2);
    T43_END(3, 0);
    T43_END(3, 1);
    T43_END(3, 2);
    /* the elements past the last 8, after every lane sum (no call while accumulators live) */
    for (int p = 0; p < 12; p++)
        for (size_t j = i; j < n; j++)
            out[p] += w_at(type, w + (size_t)(p / 3) * rb, j) * x[p % 3][j];
}
#undef T43_FMA
#undef T43_END

/* the 4 x 3 tile of each float type, apart */
AVX2 __attribute__((noinline)) static void tile43_avx2(uint32_t type, const uint8_t *w, size_t rb,
                                                       const float *const *x, size_t n, float *out)
{
    switch (type) {
    case GGUF_T_F16: tile43_avx2_body(GGUF_T_F16, w, rb, x, n, out); break;
    case GGUF_T_BF16: tile43_avx2_body(GGUF_T_BF16, w, rb, x, n, out); break;
    default: tile43_avx2_body(GGUF_T_F32, w, rb, x, n, out); break;
    }
}

/* Decode (one vector, many rows): two rows at a time, each its one chain in the one-row order
 * (the same results), the weights prefetched ROWS_PF bytes ahead (as quant_avx512.c's
 * rows_avx512): a row's 8-lane chain alone waits on its FMAs' latency (F16 decode 38-42 tok/s,
 * two rows 48-50, one thread) */
#define ROWS_PF 1024
AVX2_INLINE void rows_avx2_body(uint32_t type, const uint8_t *w, size_t rb, int nr, const float *x,
                                size_t n, float *out)
{
    size_t es = type == GGUF_T_F32 ? 4 : 2;
    int r = 0;
    for (; r + 2 <= nr; r += 2, w += 2 * rb) {
        __m256 c0 = _mm256_setzero_ps(), c1 = c0;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            if ((i * es) % 64 == 0) {
                _mm_prefetch((const char *)w + i * es + ROWS_PF, _MM_HINT_T0);
                _mm_prefetch((const char *)w + rb + i * es + ROWS_PF, _MM_HINT_T0);
            }
            __m256 xv = _mm256_loadu_ps(x + i);
            c0 = _mm256_fmadd_ps(load8(type, w, i), xv, c0);
            c1 = _mm256_fmadd_ps(load8(type, w + rb, i), xv, c1);
        }
        float s = hsum256(c0), s1 = hsum256(c1);
        for (size_t j = i; j < n; j++)
            s += w_at(type, w, j) * x[j];
        for (size_t j = i; j < n; j++)
            s1 += w_at(type, w + rb, j) * x[j];
        out[r] = s;
        out[r + 1] = s1;
    }
    for (; r < nr; r++, w += rb) {
        __m256 c0 = _mm256_setzero_ps();
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            if ((i * es) % 64 == 0)
                _mm_prefetch((const char *)w + i * es + ROWS_PF, _MM_HINT_T0);
            c0 = _mm256_fmadd_ps(load8(type, w, i), _mm256_loadu_ps(x + i), c0);
        }
        float s = hsum256(c0);
        for (size_t j = i; j < n; j++)
            s += w_at(type, w, j) * x[j];
        out[r] = s;
    }
}

AVX2 __attribute__((noinline)) static void rows_avx2(uint32_t type, const uint8_t *w, size_t rb,
                                                     int nr, const float *x, size_t n, float *out)
{
    switch (type) {
    case GGUF_T_F16: rows_avx2_body(GGUF_T_F16, w, rb, nr, x, n, out); break;
    case GGUF_T_BF16: rows_avx2_body(GGUF_T_BF16, w, rb, nr, x, n, out); break;
    default: rows_avx2_body(GGUF_T_F32, w, rb, nr, x, n, out); break;
    }
}

AVX2_INLINE __m256 q8_load8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

AVX2_INLINE void tile_q8_0_avx2_body(const uint8_t *w, size_t rb, int nr, const float *const *x,
                                     int nx, size_t n, float *out)
{
    __m256 acc[QUANT_TILE_MAX];
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm256_setzero_ps();
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const quant_block_q8_0_t *b = (const quant_block_q8_0_t *)(w + (size_t)r * rb) + k;
            __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
            __m256 q0 = q8_load8(b->qs), q1 = q8_load8(b->qs + 8);
            __m256 q2 = q8_load8(b->qs + 16), q3 = q8_load8(b->qs + 24);
#pragma GCC unroll 8
            for (int t = 0; t < nx; t++) {
                const float *xb = x[t] + k * QUANT_Q8_0_BLOCK;
                __m256 sv = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
                sv = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8), sv);
                sv = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), sv);
                sv = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), sv);
                acc[r * nx + t] = _mm256_fmadd_ps(sv, d, acc[r * nx + t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        out[p] = hsum256(acc[p]);
}

/* Specialise on (nr, nx) so the loops unroll into registers. */
#define TILE_SHAPES(call)                                                                          \
    switch (nr * 8 + nx) {                                                                         \
    case 1 * 8 + 1: call(1, 1); break;                                                             \
    case 1 * 8 + 2: call(1, 2); break;                                                             \
    case 1 * 8 + 3: call(1, 3); break;                                                             \
    case 1 * 8 + 4: call(1, 4); break;                                                             \
    case 2 * 8 + 1: call(2, 1); break;                                                             \
    case 2 * 8 + 2: call(2, 2); break;                                                             \
    case 2 * 8 + 3: call(2, 3); break;                                                             \
    case 2 * 8 + 4: call(2, 4); break;                                                             \
    case 3 * 8 + 1: call(3, 1); break;                                                             \
    case 3 * 8 + 2: call(3, 2); break;                                                             \
    case 4 * 8 + 1: call(4, 1); break;                                                             \
    case 4 * 8 + 2: call(4, 2); break;                                                             \
    default:                                                                                       \
        for (int r_ = 0; r_ < nr; r_++)                                                            \
            for (int t_ = 0; t_ < nx; t_++) {                                                      \
                const float *xs_[1] = {x[t_]};                                                     \
                call##_ONE(r_, t_, xs_);                                                           \
            }                                                                                      \
        break;                                                                                     \
    }

AVX2 void quant_avx2_tile(uint32_t type, const void *wv, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out)
{
    const uint8_t *w = wv;
    if (type == GGUF_T_Q8_0) {
#define Q8T(R, X) tile_q8_0_avx2_body(w, rb, R, x, X, n, out)
#define Q8T_ONE(r, t, xs)                                                                          \
    tile_q8_0_avx2_body(w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(Q8T)
#undef Q8T
#undef Q8T_ONE
        return;
    }
    if (nr == 4 && nx == 3) {
        tile43_avx2(type, w, rb, x, n, out);
        return;
    }
    if (nx == 1 && nr >= 8) {
        rows_avx2(type, w, rb, nr, x[0], n, out);
        return;
    }
    switch (type) {
    case GGUF_T_F16: {
#define F16T(R, X) tile_avx2_body(GGUF_T_F16, w, rb, R, x, X, n, out)
#define F16T_ONE(r, t, xs)                                                                         \
    tile_avx2_body(GGUF_T_F16, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(F16T)
#undef F16T
#undef F16T_ONE
        break;
    }
    case GGUF_T_BF16: {
#define BF16T(R, X) tile_avx2_body(GGUF_T_BF16, w, rb, R, x, X, n, out)
#define BF16T_ONE(r, t, xs)                                                                        \
    tile_avx2_body(GGUF_T_BF16, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(BF16T)
#undef BF16T
#undef BF16T_ONE
        break;
    }
    default: {
#define F32T(R, X) tile_avx2_body(GGUF_T_F32, w, rb, R, x, X, n, out)
#define F32T_ONE(r, t, xs)                                                                         \
    tile_avx2_body(GGUF_T_F32, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(F32T)
#undef F32T
#undef F32T_ONE
        break;
    }
    }
}

AVX2 float quant_avx2_dot_f32(const float *a, const float *b, size_t n)
{
    /* attention's q.k: two chains for latency, its own order (not a matmul) */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

AVX2 void quant_avx2_axpy(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* ------------------------------------------------------------------ AVX2 integer dots
 * maddubs (u8 x s8 -> pairs summed in int16) then madd by the sub-block
 * scale (-> int32): every product and sum is exact (pairs stay below
 * 2 * 63 * 127; totals below 2^31), so the integer sums equal the portable
 * ones and the shared float terms make results bit-identical. */

/* The 32-value types past Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): float lanes, not the portable
 * order (one hsum per block costs more than the dot): lane j of each
 * block's int32 vector (values 4j..4j+3) is scaled by d_w * d_a and
 * accumulated with FMA, the lanes summed at the end. They differ from the
 * portable dot by float rounding only (tested within 1e-5 of the sum of
 * |products|). */
/* 32 bits -> 32 bytes, 16 where the bit is set */
AVX2_INLINE __m256i q5_high_bits(uint32_t qh)
{
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
}

/* the 32 values of a block, signed (Q4_1 and Q5_1: unsigned, the min apart) */
AVX2_INLINE __m256i q32_values(const uint8_t *w, uint32_t type)
{
    if (type == GGUF_T_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(w + 2));
    const size_t qs = type == GGUF_T_Q4_1   ? 4
                      : type == GGUF_T_Q5_0 ? 6
                      : type == GGUF_T_Q5_1 ? 8
                                            : 2;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadu_si128((const __m128i *)(w + qs));
    __m256i v = _mm256_setr_m128i(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    switch (type) {
    case GGUF_T_Q4_0: return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    case GGUF_T_Q4_1: return v;
    case GGUF_T_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(v, q5_high_bits(rd_u32(w + 2))),
                               _mm256_set1_epi8(16));
    case GGUF_T_Q5_1: return _mm256_or_si256(v, q5_high_bits(rd_u32(w + 4)));
    default:
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid)), v);
    }
}

AVX2_INLINE void vdot_q32_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                               float *out, uint32_t type)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int mins = type == GGUF_T_Q4_1 || type == GGUF_T_Q5_1;
    size_t bb; /* block bytes, as in gguf's table */
    switch (type) {
    case GGUF_T_Q8_0: bb = 34; break;
    case GGUF_T_Q4_1: bb = 20; break;
    case GGUF_T_Q5_0: bb = 22; break;
    case GGUF_T_Q5_1: bb = 24; break;
    default: bb = 18; break;
    }
    __m256 acc[QUANT_DOTN_MAX];
    float macc[QUANT_DOTN_MAX] = {0}; /* the mins' part: m x d_a x activation sum */
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += bb) {
        __m256i q = q32_values(w, type);
        __m256i aq = mins ? q : _mm256_abs_epi8(q);
        float d = rd_f16c(w), m = mins ? rd_f16c(w + 2) : 0.0f;
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            /* |q| x (x with q's sign): |q| <= 128 and |x| <= 127 keep pairs exact */
            __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(aq, mins ? x : _mm256_sign_epi8(x, q)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
            if (mins)
                macc[t] += m * a->s;
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = hsum256(acc[t]) + macc[t];
}

/* The 32-value types' entry points: vdot_q32_avx2 specialised per type. */
#define VDOT_Q32_AVX2(name, T)                                                                     \
    AVX2_INLINE void vdot_##name##_avx2_body(const uint8_t *w, const void *const *xq, int nx,      \
                                             size_t nblk, float *out)                              \
    {                                                                                              \
        vdot_q32_avx2(w, xq, nx, nblk, out, T);                                                    \
    }
VDOT_Q32_AVX2(q4_0, GGUF_T_Q4_0)
VDOT_Q32_AVX2(q4_1, GGUF_T_Q4_1)
VDOT_Q32_AVX2(q5_0, GGUF_T_Q5_0)
VDOT_Q32_AVX2(q5_1, GGUF_T_Q5_1)
VDOT_Q32_AVX2(iq4_nl, GGUF_T_IQ4_NL)
#undef VDOT_Q32_AVX2

/* the totals of four int32 vectors in the lanes of one (exact: every total below 2^31) */
AVX2_INLINE __m128i hsum4_i32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* Q8_0 in the portable dot's order (quant_fmt_vdot_row): per (row, token) each block's exact
 * integer dot s (|q| x (x with q's sign), in any grouping the same integer), then sum = sum +
 * (d x d_a) x (float)s in block order from 0.0f, a multiply and an add (no FMA); 2-4 tokens in
 * the lanes of one __m128, the same operations lane by lane. Bit for bit the portable dot: its
 * min term, (0 x 0) x s, is a zero, and adding a zero of either sign leaves a sum started at
 * +0.0f unchanged (never -0: x + y is -0 only when both are). quant_q256.c takes this order. */
AVX2_INLINE void vdot_q8_0_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    const __m256i ones = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
    if (nx == 1) {
        const quant_act_q8_t *a = (const quant_act_q8_t *)xq[0];
        float sum = 0.0f;
        for (size_t k = 0; k < nblk; k++, w += 34) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
            __m256i x = _mm256_loadu_si256((const __m256i *)a[k].qs);
            __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)), ones);
            float dd = rd_f16c(w) * a[k].d;
            float term = dd * (float)hsum_i32(p);
            sum = sum + term;
        }
        out[0] = sum;
        return;
    }
    __m128 acc = _mm_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i aq = _mm256_abs_epi8(q);
        __m256i p[QUANT_DOTN_MAX];
        float da[QUANT_DOTN_MAX];
#pragma GCC unroll 4
        for (int t = 0; t < QUANT_DOTN_MAX; t++) {
            if (t >= nx) {
                p[t] = zero;
                da[t] = 0.0f;
                continue;
            }
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            p[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(x, q)), ones);
            da[t] = a->d;
        }
        __m128 dd = _mm_mul_ps(_mm_set1_ps(rd_f16c(w)), _mm_setr_ps(da[0], da[1], da[2], da[3]));
        __m128 term = _mm_mul_ps(dd, _mm_cvtepi32_ps(hsum4_i32(p[0], p[1], p[2], p[3])));
        acc = _mm_add_ps(acc, term);
    }
    float o[4];
    _mm_storeu_ps(o, acc);
    for (int t = 0; t < nx; t++)
        out[t] = o[t];
}

/* IQ4_XS: grid values (|q| <= 127) by sign trick, each 32-value sub-block's
 * pair sums scaled by its int16 scale; bit-identical to the portable dot. */
AVX2_INLINE void vdot_iq4_xs_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                       float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 136) {
        unsigned sh = (unsigned)(w[2] | w[3] << 8);
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            /* sub-blocks 2p and 2p + 1: A holds values 0..15 of each, B 16..31 */
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 8 + 32 * p));
            __m256i qa = _mm256_shuffle_epi8(grid, _mm256_and_si256(v, m4));
            __m256i qb = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            __m256i aa = _mm256_abs_epi8(qa), ab = _mm256_abs_epi8(qb);
            int l0 = ((w[4 + p] & 15) | ((sh >> 4 * p) & 3) << 4) - 32;
            int l1 = ((w[4 + p] >> 4) | ((sh >> (4 * p + 2)) & 3) << 4) - 32;
            __m256i scv = _mm256_setr_m128i(_mm_set1_epi16((short)l0), _mm_set1_epi16((short)l1));
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *x = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * p;
                __m256i xa = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)x),
                                               _mm_loadu_si128((const __m128i *)(x + 32)));
                __m256i xb = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(x + 16)),
                                               _mm_loadu_si128((const __m128i *)(x + 48)));
                __m256i pa = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(xa, qa));
                __m256i pb = _mm256_maddubs_epi16(ab, _mm256_sign_epi8(xb, qb));
                /* (pa + pb would overflow int16: each pair reaches 2 * 127 * 127) */
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(pa, scv));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(pb, scv));
            }
        }
        float d = rd_f16c(w);
        for (int t = 0; t < nx; t++)
            acc[t] += k_term(d, 0.0f, hsum_i32(sum[t]), 0, (const quant_act_q8k_t *)xq[t] + k);
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* Q4_K, and Q5_K (five = 1: qh[32] before qs, bit 2c / 2c + 1 of qh[l] is
 * bit 4 of element 64c + l / 64c + 32 + l) */
AVX2_INLINE void vdot_q45_k_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                 float *out, int five)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const size_t bb = five ? 176 : 144;
    const uint8_t *qs0 = w + (five ? 48 : 16);
    /* byte pairs (2j, 2j+1) of a 128-bit lane: broadcast int16 j */
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += bb, qs0 += bb) {
        uint8_t sc[8], mn[8];
        k4_scales_bytes(w + 4, sc, mn);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        uint64_t sc64, mn64;
        memcpy(&sc64, sc, 8);
        memcpy(&mn64, mn, 8);
        /* scales as int16 in both halves; mins as int16 pairs (one per 16 bsums) */
        __m256i scv =
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
        __m256i mnv =
            _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn64), dup));
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs0 + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) { /* qh was shifted right by 2c: its bits 0 and 1 are this chunk's */
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                hi = _mm256_or_si256(
                    hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            __m256i s0 =
                _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c))));
            __m256i s1 =
                _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * c;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                __m256i p1 =
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p0, s0));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p1, s1));
            }
        }
        float d = rd_f16c(w), dm = rd_f16c(w + 2);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t sm = hsum_i32(_mm256_madd_epi16(bs, mnv));
            acc[t] += k_term(d, dm, hsum_i32(sum[t]), sm, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

AVX2_INLINE __m256i q6_values(__m256i ql, __m256i qh, int g)
{
    /* values + 32 (0..63): nibble g / 2 of ql, bits 2g..2g+1 of qh */
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
    __m256i hi;
    switch (g) {
    case 0: hi = qh; break;
    case 1: hi = _mm256_srli_epi16(qh, 2); break;
    case 2: hi = _mm256_srli_epi16(qh, 4); break;
    default: hi = _mm256_srli_epi16(qh, 6); break;
    }
    return _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hi, m2), 4));
}

AVX2_INLINE void vdot_q6_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 210) {
        /* the 16 scales as int16; per half, its 8 in both 128-bit lanes */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                          _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * n));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * n + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * n));
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i q = q6_values(g % 2 ? ql1 : ql0, qh, g);
                /* the two 16-value sub-blocks of these 32: scales 2g, 2g + 1 of the half */
                __m256i scv = _mm256_shuffle_epi8(
                    sch[n],
                    _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g))),
                                      _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g + 1)))));
#pragma GCC unroll 4
                for (int t = 0; t < nx; t++) {
                    const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n + 32 * g;
                    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float d = rd_f16c(w + 208);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            /* the values' offset: 32 x activation sums x scales */
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t off = hsum_i32(_mm256_madd_epi16(bs, sc16));
            acc[t] += k_term(d, 0.0f, hsum_i32(sum[t]) - 32 * off, 0, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* Q2_K and Q3_K: 2-bit fields (Q3_K: plus its hmask bit, as value + 4 in
 * 0..7, the offset taken back with the activation sums); 16-value
 * sub-blocks, two per 32 values as in Q6_K. Bit-identical to the portable
 * dot. */
AVX2_INLINE void vdot_q23_k_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                 float *out, int three)
{
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const size_t bb = three ? 110 : 84;
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += bb) {
        const uint8_t *qs = three ? w + 32 : w + 16;
        __m256i sc16, mn16 = _mm256_setzero_si256();
        if (three) { /* q3_scale four at a time */
            uint32_t a = rd_u32(w + 96), b = rd_u32(w + 100), c = rd_u32(w + 104);
            uint32_t v[4] = {(a & 0x0f0f0f0fu) | (c & 0x03030303u) << 4,
                             (b & 0x0f0f0f0fu) | ((c >> 2) & 0x03030303u) << 4,
                             ((a >> 4) & 0x0f0f0f0fu) | ((c >> 4) & 0x03030303u) << 4,
                             ((b >> 4) & 0x0f0f0f0fu) | ((c >> 6) & 0x03030303u) << 4};
            __m128i u = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)v), _mm_set1_epi8(32));
            sc16 = _mm256_cvtepi8_epi16(u);
        } else {
            __m128i s8 = _mm_loadu_si128((const __m128i *)w);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(15)));
            mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
        }
        __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                          _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i hm = three ? _mm256_loadu_si256((const __m256i *)w) : _mm256_setzero_si256();
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_and_si256(qv, m2); /* qv shifted right by 2j */
                qv = _mm256_srli_epi16(qv, 2);
                if (three) { /* hm shifted right by 4n + j: bit 0 is this group's */
                    q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));
                    hm = _mm256_srli_epi16(hm, 1);
                }
                __m256i scv = _mm256_shuffle_epi8(
                    sch[n],
                    _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j))),
                                      _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j + 1)))));
#pragma GCC unroll 4
                for (int t = 0; t < nx; t++) {
                    const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n + 32 * j;
                    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float d = rd_f16c(w + (three ? 108 : 80));
        float dm = three ? 0.0f : rd_f16c(w + 82);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t sq = hsum_i32(sum[t]), sm = 0;
            if (three)
                sq -= 4 * hsum_i32(_mm256_madd_epi16(bs, sc16));
            else
                sm = hsum_i32(_mm256_madd_epi16(bs, mn16));
            acc[t] += k_term(d, dm, sq, sm, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

AVX2_INLINE void vdot_q2_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q23_k_avx2(w, xq, nx, nblk, out, 0);
}

AVX2_INLINE void vdot_q3_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q23_k_avx2(w, xq, nx, nblk, out, 1);
}

/* Specialise on nx so the token loops unroll into registers. */
#define VDOT_SHAPES(body)                                                                          \
    AVX2 static void body##_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,       \
                               float *out)                                                         \
    {                                                                                              \
        switch (nx) {                                                                              \
        case 1: body##_body(w, xq, 1, nblk, out); break;                                           \
        case 2: body##_body(w, xq, 2, nblk, out); break;                                           \
        case 3: body##_body(w, xq, 3, nblk, out); break;                                           \
        default: body##_body(w, xq, 4, nblk, out); break;                                          \
        }                                                                                          \
    }
AVX2_INLINE void vdot_q4_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q45_k_avx2(w, xq, nx, nblk, out, 0);
}

AVX2_INLINE void vdot_q5_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q45_k_avx2(w, xq, nx, nblk, out, 1);
}

VDOT_SHAPES(vdot_q8_0_avx2)
VDOT_SHAPES(vdot_q4_0_avx2)
VDOT_SHAPES(vdot_q4_1_avx2)
VDOT_SHAPES(vdot_q5_0_avx2)
VDOT_SHAPES(vdot_q5_1_avx2)
VDOT_SHAPES(vdot_iq4_nl_avx2)
VDOT_SHAPES(vdot_iq4_xs_avx2)
VDOT_SHAPES(vdot_q2_k_avx2)
VDOT_SHAPES(vdot_q3_k_avx2)
VDOT_SHAPES(vdot_q4_k_avx2)
VDOT_SHAPES(vdot_q5_k_avx2)
VDOT_SHAPES(vdot_q6_k_avx2)

/* ------------------------------------------------------------------ AVX-VNNI integer dots
 * vpdpbusd sums four u8 x s8 products into each int32 lane: the lanes of
 * maddubs + madd in one exact instruction. Q8_0 keeps its float lanes
 * (8 a block, FMA by d x d_a, summed at the end), not the AVX2 table's
 * portable order: its tile and one-row dot here and quant_q256.c's lanes
 * decode kernel agree bit for bit. (Q4_K and Q6_K scale each 16-bit pair
 * sum as they go: vpdpbusd would save them nothing.) */
#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni")))

VNNI_INLINE void vdot_q8_0_vnni_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
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
            __m256i p = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
        }
    }
    for (int t = 0; t < nx; t++) {
        __m128 lo = _mm256_castps256_ps128(acc[t]), hi = _mm256_extractf128_ps(acc[t], 1);
        lo = _mm_add_ps(lo, hi);
        __m128 sh = _mm_movehdup_ps(lo), sm = _mm_add_ps(lo, sh);
        sh = _mm_movehl_ps(sh, sm);
        out[t] = _mm_cvtss_f32(_mm_add_ss(sm, sh)); /* as hsum256 */
    }
}

VNNI static void vdot_q8_0_vnni_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                   float *out)
{
    switch (nx) {
    case 1: vdot_q8_0_vnni_body(w, xq, 1, nblk, out); break;
    case 2: vdot_q8_0_vnni_body(w, xq, 2, nblk, out); break;
    case 3: vdot_q8_0_vnni_body(w, xq, 3, nblk, out); break;
    default: vdot_q8_0_vnni_body(w, xq, 4, nblk, out); break;
    }
}

/* Q8_0 prefill, as the AVX-512 tile below on 256 bits: up to 2 rows x 4
 * tokens, unsigned weights (q + 128) shared by the tokens, each token's
 * lanes started from -128 x its activation sums; the one-row kernel's lanes
 * and float order, so the same results bit for bit. */
VNNI_INLINE void vtile_q8_0_vnni_body(const uint8_t *w, size_t rb, const void *const *xq,
                                      size_t nblk, float *out, int ostride, int R, int T)
{
    const __m256i c80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R * T; i++)
        acc[i] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        __m256i wu[2];
        __m256 dw[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + (size_t)r * rb + 34 * k;
            wu[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), c80);
            dw[r] = _mm256_set1_ps(rd_f16c(b));
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i corr = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, c80, x));
            __m256 da = _mm256_set1_ps(a->d);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i s = _mm256_dpbusd_avx_epi32(corr, wu[r], x);
                acc[r * T + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], da),
                                                 acc[r * T + t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            out[r * ostride + t] = hsum256(acc[r * T + t]);
}

/* Any nr x nx, in tiles of up to 2 rows x 4 tokens. */
VNNI static void vtile_q8_0_vnni(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                 int nx, size_t nblk, float *out0)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        int R = nr - r0 < 2 ? nr - r0 : 2;
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (int t0 = 0; t0 < nx; t0 += 4) {
            int T = nx - t0 < 4 ? nx - t0 : 4;
            const void *const *xq = xq0 + t0;
            float *out = out0 + (size_t)r0 * nx + t0;
            int ostride = nx;
            switch (R * 8 + T) {
            case 9: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 1); break;
            case 10: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 2); break;
            case 11: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 3); break;
            case 12: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 4); break;
            case 17: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 1); break;
            case 18: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 2); break;
            case 19: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 3); break;
            default: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 4); break;
            }
        }
    }
}

vdot_row_fn quant_vnni_vdot_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vdot_q8_0_vnni_nx : quant_avx2_vdot_for(type);
}

vtile_fn quant_vnni_vtile_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_vnni : NULL;
}

vdot_row_fn quant_avx2_vdot_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q8_0: return vdot_q8_0_avx2_nx;
    case GGUF_T_Q4_0: return vdot_q4_0_avx2_nx;
    case GGUF_T_Q4_1: return vdot_q4_1_avx2_nx;
    case GGUF_T_Q5_0: return vdot_q5_0_avx2_nx;
    case GGUF_T_Q5_1: return vdot_q5_1_avx2_nx;
    case GGUF_T_IQ4_NL: return vdot_iq4_nl_avx2_nx;
    case GGUF_T_IQ4_XS: return vdot_iq4_xs_avx2_nx;
    case GGUF_T_Q2_K: return vdot_q2_k_avx2_nx;
    case GGUF_T_Q3_K: return vdot_q3_k_avx2_nx;
    case GGUF_T_Q4_K: return vdot_q4_k_avx2_nx;
    case GGUF_T_Q5_K: return vdot_q5_k_avx2_nx;
    case GGUF_T_Q6_K: return vdot_q6_k_avx2_nx;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------ F16 rows and activation quantizers */

AVX2 void quant_avx2_f16_to_f32_row(const uint16_t *s, float *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = quant_f16_to_f32(s[i]);
}

AVX2 void quant_avx2_f32_to_f16_row(const float *s, uint16_t *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = quant_f32_to_f16(s[i]);
}

/* 8 products x * id rounded to nearest even (lrintf's default mode) */
AVX2_INLINE __m256i round8(const float *x, __m256 id)
{
    return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
}

/* 32 int32 (four vectors) to int8, in order */
AVX2_INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2_INLINE float hmax256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

AVX2 void quant_avx2_act_q8(const float *x, quant_act_q8_t *a, size_t nb)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t k = 0; k < nb; k++, x += QUANT_Q8_0_BLOCK) {
        __m256 m = _mm256_and_ps(_mm256_loadu_ps(x), abs);
        for (int j = 8; j < QUANT_Q8_0_BLOCK; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs));
        float amax = hmax256(m);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i q0 = round8(x, idv), q1 = round8(x + 8, idv);
        __m256i q2 = round8(x + 16, idv), q3 = round8(x + 24, idv);
        _mm256_storeu_si256((__m256i *)a[k].qs, pack32(q0, q1, q2, q3));
        int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        a[k].d = f16_round(d);
        a[k].s = f16_round(d * (float)sum);
    }
}

AVX2 void quant_avx2_act_q8k(const float *x, quant_act_q8k_t *a, size_t nb)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lim = _mm256_set1_epi32(127);
    for (size_t k = 0; k < nb; k++, x += QUANT_K_BLOCK) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QUANT_K_BLOCK; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs));
        float amax = hmax256(m), v = 0.0f;
        for (int j = 0; j < QUANT_K_BLOCK && amax != 0.0f; j++) /* the first of largest magnitude */
            if (fabsf(x[j]) == amax) {
                v = x[j];
                break;
            }
        float id = v != 0.0f ? -127.0f / v : 0.0f, d = v != 0.0f ? 1.0f / id : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        for (int j = 0; j < QUANT_K_BLOCK; j += 32) {
            __m256i q0 = _mm256_min_epi32(round8(x + j, idv), lim);
            __m256i q1 = _mm256_min_epi32(round8(x + j + 8, idv), lim);
            __m256i q2 = _mm256_min_epi32(round8(x + j + 16, idv), lim);
            __m256i q3 = _mm256_min_epi32(round8(x + j + 24, idv), lim);
            _mm256_storeu_si256((__m256i *)(a[k].qs + j), pack32(q0, q1, q2, q3));
            a[k].bsums[j / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q0, q1));
            a[k].bsums[j / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q2, q3));
        }
        a[k].d = d;
    }
}

/* as quant_avx2_f16_to_f32_row then quant_avx2_axpy, without the row in between */
AVX2 void quant_avx2_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            y + i, _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                   _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * quant_f16_to_f32(x[i]);
}

/* quant_avx2_axpy_f16 over rows in order, y held in registers across them: per
 * element the same FMAs in the same order */
AVX2 void quant_avx2_axpy_f16_rows(float *y, const float *a, const uint16_t *x, size_t x_stride,
                                   size_t nrows, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);
        __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);
        const uint16_t *xr = x + i;
        for (size_t p = 0; p < nrows; p++, xr += x_stride) {
            __m256 av = _mm256_set1_ps(a[p]);
            y0 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xr)), y0);
            y1 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 8))),
                                 y1);
            y2 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 16))),
                                 y2);
            y3 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 24))),
                                 y3);
        }
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
        _mm256_storeu_ps(y + i + 16, y2);
        _mm256_storeu_ps(y + i + 24, y3);
    }
    if (i < n)
        for (size_t p = 0; p < nrows; p++)
            quant_avx2_axpy_f16(y + i, a[p], x + p * x_stride + i, n - i);
}

/* e^x for x <= 0 (8 lanes): x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts), e^r by its
 * degree-6 Taylor polynomial in Horner form, times 2^n through the exponent bits; 0 below -87.3
 * (the smallest normal float's log). */
AVX2_INLINE __m256 exp8_neg(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

AVX2 float quant_avx2_exp_shift(float *x, size_t n, float mx)
{
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp8_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    float sum = hsum256(acc);
    if (i < n) { /* the tail through the same lanes */
        float t[8] = {0};
        for (size_t j = i; j < n; j++)
            t[j - i] = x[j] - mx;
        __m256 v = exp8_neg(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, v);
        for (size_t j = i; j < n; j++) {
            x[j] = t[j - i];
            sum += x[j];
        }
    }
    return sum;
}

/* Rows ahead a strided row walk prefetches: a KV cache's rows are a position apart (18 KB in the
 * 134M shape), past what the hardware prefetchers follow. */
#define AXPY_PF_ROWS 8

/* Four outputs over 16 columns of every row, the eight accumulators in registers. */
AVX2_INLINE void axpy_f16_rows16x4(float *const *y, const float *const *a, size_t off,
                                   const uint16_t *x, size_t x_stride, size_t nrows)
{
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
    __m256 c00 = _mm256_loadu_ps(y[0] + off), c01 = _mm256_loadu_ps(y[0] + off + 8);
    __m256 c10 = _mm256_loadu_ps(y[1] + off), c11 = _mm256_loadu_ps(y[1] + off + 8);
    __m256 c20 = _mm256_loadu_ps(y[2] + off), c21 = _mm256_loadu_ps(y[2] + off + 8);
    __m256 c30 = _mm256_loadu_ps(y[3] + off), c31 = _mm256_loadu_ps(y[3] + off + 8);
    x += off;
    for (size_t p = 0; p < nrows; p++, x += x_stride) {
        _mm_prefetch((const char *)(x + AXPY_PF_ROWS * x_stride), _MM_HINT_T0);
        __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
        __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 8)));
        __m256 v = _mm256_set1_ps(a0[p]);
        c00 = _mm256_fmadd_ps(v, x0, c00);
        c01 = _mm256_fmadd_ps(v, x1, c01);
        v = _mm256_set1_ps(a1[p]);
        c10 = _mm256_fmadd_ps(v, x0, c10);
        c11 = _mm256_fmadd_ps(v, x1, c11);
        v = _mm256_set1_ps(a2[p]);
        c20 = _mm256_fmadd_ps(v, x0, c20);
        c21 = _mm256_fmadd_ps(v, x1, c21);
        v = _mm256_set1_ps(a3[p]);
        c30 = _mm256_fmadd_ps(v, x0, c30);
        c31 = _mm256_fmadd_ps(v, x1, c31);
    }
    _mm256_storeu_ps(y[0] + off, c00);
    _mm256_storeu_ps(y[0] + off + 8, c01);
    _mm256_storeu_ps(y[1] + off, c10);
    _mm256_storeu_ps(y[1] + off + 8, c11);
    _mm256_storeu_ps(y[2] + off, c20);
    _mm256_storeu_ps(y[2] + off + 8, c21);
    _mm256_storeu_ps(y[3] + off, c30);
    _mm256_storeu_ps(y[3] + off + 8, c31);
}

/* quant_avx2_axpy_f16_rows for four outputs at a time over 16 columns, each row's 16 halves
 * converted once for them all; per element of each output the same FMAs in the same order, and
 * the columns past the last 16 as quant_avx2_axpy_f16 does them (its 8-wide FMAs, then its scalar
 * tail). Outputs past a multiple of four: quant_avx2_axpy_f16_rows each. */
AVX2 void quant_avx2_axpy_f16_rows_n(float *const *y, const float *const *a, int ny,
                                     const uint16_t *x, size_t x_stride, size_t nrows, size_t n)
{
    int j0 = 0;
    for (; j0 + 4 <= ny; j0 += 4) {
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            axpy_f16_rows16x4(y + j0, a + j0, i, x, x_stride, nrows);
        if (i < n)
            for (int j = j0; j < j0 + 4; j++)
                for (size_t p = 0; p < nrows; p++)
                    quant_avx2_axpy_f16(y[j] + i, a[j][p], x + p * x_stride + i, n - i);
    }
    for (; j0 < ny; j0++)
        quant_avx2_axpy_f16_rows(y[j0], a[j0], x, x_stride, nrows, n);
}
#endif

/* quant_q256: quant's Q8_0 kernels on AVX2 past the row dot (x86, compiled per function; picked by quant.c through quant_k256.c): the AVX2 table's prefill tile and eight-row decode kernel, each result quant_avx2.c's Q8_0 row dot's (the portable dot's) bit for bit, and the AVX-VNNI table's eight-row decode kernel in its float lanes. */
#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
#define Q256 __attribute__((target("avx2,fma,f16c")))
#define Q256_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* ------------------------------------------------------------------ prefill */

/* the totals of eight int32 vectors in the lanes of one, lane r p[r]'s (exact: every total below
 * 2^31): one transpose-add tree */
Q256_INLINE __m256i hsum8_i32(const __m256i p[8])
{
    /* s0: rows 0-3's low-half and high-half sums, s1 rows 4-7's */
    __m256i s0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i s1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0, s1, 0x21),
                            _mm256_blend_epi32(s0, s1, 0xf0));
}

/* the d of block k of eight rows rb bytes apart, as floats (a gather of each block's first four
 * bytes, their low halves packed) */
Q256_INLINE __m256 q8v_dw8(const uint8_t *w, size_t rb, size_t k)
{
    const __m256i idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    __m256i g = _mm256_and_si256(_mm256_i32gather_epi32((const int *)(w + 34 * k), idx, 1),
                                 _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(
        _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
}

/* Q8_0 prefill in quant_avx2.c's Q8_0 order (the portable dot's): a tile of 8 rows x up to
 * Q8V_T tokens; per (token, block) the 8 rows' exact int32 lanes (|q| x (x with q's sign),
 * pairs summed) reduced by one transpose-add tree to one vector of the 8 rows' integer dots,
 * converted once, multiplied by the rows' d x the token's d_a and added to the token's
 * accumulator (lanes = rows): each lane the one-row kernel's float operations in its order, so
 * every result the same bit for bit, whatever the shape. The rows' |q| are taken once a block
 * for the tile's tokens. */
#define Q8V_R 8 /* rows a tile (the lanes of one float vector) */
#define Q8V_T 4 /* tokens a tile */

Q256_INLINE void vtile_q8_0_q256_body(const uint8_t *w, size_t rb, const void *const *xq,
                                      size_t nblk, float *out, int ostride, int T, const float *dwt)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q8V_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        __m256i aq[Q8V_R];
#pragma GCC unroll 8
        for (int r = 0; r < Q8V_R; r++)
            aq[r] = _mm256_abs_epi8(
                _mm256_loadu_si256((const __m256i *)(w + (size_t)r * rb + 34 * k + 2)));
        __m256 dw = dwt ? _mm256_loadu_ps(dwt + Q8V_R * k) : q8v_dw8(w, rb, k);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i p[Q8V_R];
#pragma GCC unroll 8
            for (int r = 0; r < Q8V_R; r++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(w + (size_t)r * rb + 34 * k + 2));
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(x, q)), ones);
            }
            __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a->d));
            __m256 term = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(hsum8_i32(p)));
            acc[t] = _mm256_add_ps(acc[t], term);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float o[Q8V_R];
        _mm256_storeu_ps(o, acc[t]);
        for (int r = 0; r < Q8V_R; r++)
            out[r * ostride + t] = o[r];
    }
}

/* the rows' d as floats, block-major (8 a block), once a tile of rows for all its tokens (rows
 * of more blocks: in the tile, once a token group) */
#define Q8V_BLK_MAX 2048
static _Thread_local float q8v_dw[Q8V_R * Q8V_BLK_MAX];

/* Any nr x nx: tiles of 8 rows x up to Q8V_T tokens; the last nr % 8 rows by the one-row
 * kernel (the same results). */
Q256 static void vtile_q8_0_q256(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                 int nx, size_t nblk, float *out0)
{
    float *dwt = nblk <= Q8V_BLK_MAX ? q8v_dw : NULL;
    int r0 = 0;
    for (; r0 + Q8V_R <= nr; r0 += Q8V_R) {
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (size_t k = 0; dwt && k < nblk; k++)
            for (int r = 0; r < Q8V_R; r++)
                dwt[Q8V_R * k + (size_t)r] = rd_f16c(w + (size_t)r * rb + 34 * k);
        for (int t0 = 0; t0 < nx; t0 += Q8V_T) {
            int T = nx - t0 < Q8V_T ? nx - t0 : Q8V_T;
            const void *const *xq = xq0 + t0;
            float *out = out0 + (size_t)r0 * nx + t0;
            switch (T) {
            case 1: vtile_q8_0_q256_body(w, rb, xq, nblk, out, nx, 1, dwt); break;
            case 2: vtile_q8_0_q256_body(w, rb, xq, nblk, out, nx, 2, dwt); break;
            case 3: vtile_q8_0_q256_body(w, rb, xq, nblk, out, nx, 3, dwt); break;
            default: vtile_q8_0_q256_body(w, rb, xq, nblk, out, nx, 4, dwt); break;
            }
        }
    }
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q8_0);
    for (; r0 < nr; r0++)
        for (int t0 = 0; t0 < nx; t0 += QUANT_DOTN_MAX) {
            float o[QUANT_DOTN_MAX];
            int T = nx - t0 < QUANT_DOTN_MAX ? nx - t0 : QUANT_DOTN_MAX;
            fn(w0 + (size_t)r0 * rb, xq0 + t0, T, nblk, o);
            for (int t = 0; t < T; t++)
                out0[(size_t)r0 * nx + (size_t)(t0 + t)] = o[t];
        }
}

vtile_fn quant_q256_vtile_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_q256 : NULL;
}

/* ------------------------------------------------------------------ decode */

#define Q8V_PF 2 /* row groups ahead the Q8_0 decode kernels prefetch */

/* Block k's share of the group of 8 rows Q8V_PF groups after the one at w0 (rows rb apart), when
 * rows r0 .. that group's end are within nr */
Q256_INLINE void q8v_prefetch(const uint8_t *w0, size_t rb, int r0, int nr, size_t k)
{
    if (r0 + 8 * (Q8V_PF + 1) > nr)
        return;
    const uint8_t *pf = w0 + (size_t)Q8V_PF * 8 * rb;
    for (int i = 0; i < 8 * 34; i += 64)
        _mm_prefetch((const char *)(pf + 8 * 34 * k + (size_t)i), _MM_HINT_T0);
}

/* Q8_0 decode in quant_avx2.c's Q8_0 order (the portable dot's): eight rows a block at a time,
 * their exact int32 lanes reduced by hsum8_i32 to the 8 rows' integer dots, converted once,
 * times the rows' d x d_a, added to one accumulator (lanes = rows): the one-row kernel's results
 * bit for bit. The rows Q8V_PF groups on are prefetched a block's share at a time: one token
 * reads each weight once, from memory or a far cache, and the hardware prefetchers stop at 4 KB
 * pages (57 -> 80-90 tok/s, Q8_0 decode of the 134M model, one thread). */
Q256 static void vrows_q8_0_q256(const uint8_t *w, size_t rb, int nr, const void *xq, size_t nblk,
                                 float *out)
{
    const __m256i ones = _mm256_set1_epi16(1);
    int r0 = 0;
    for (; r0 + 8 <= nr; r0 += 8) {
        const uint8_t *w0 = w + (size_t)r0 * rb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t k = 0; k < nblk; k++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            q8v_prefetch(w0, rb, r0, nr, k);
            __m256i p[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(w0 + (size_t)r * rb + 34 * k + 2));
                p[r] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)), ones);
            }
            __m256 dd = _mm256_mul_ps(q8v_dw8(w0, rb, k), _mm256_set1_ps(a->d));
            __m256 term = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(hsum8_i32(p)));
            acc = _mm256_add_ps(acc, term);
        }
        _mm256_storeu_ps(out + r0, acc);
    }
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q8_0);
    for (; r0 < nr; r0++)
        fn(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

/* Q8_0 decode in the AVX-VNNI table's float lanes (its one-row dot's: each row's 8 lanes FMA by
 * d x d_a a block, summed at the end by hsum256; the same results bit for bit), eight rows a
 * block at a time, prefetched as vrows_q8_0_q256. */
Q256 static void vrows_q8_0_lanes_q256(const uint8_t *w, size_t rb, int nr, const void *xq,
                                       size_t nblk, float *out)
{
    const __m256i ones = _mm256_set1_epi16(1);
    int r0 = 0;
    for (; r0 + 8 <= nr; r0 += 8) {
        const uint8_t *w0 = w + (size_t)r0 * rb;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            acc[r] = _mm256_setzero_ps();
        for (size_t k = 0; k < nblk; k++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            q8v_prefetch(w0, rb, r0, nr, k);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const uint8_t *b = w0 + (size_t)r * rb + 34 * k;
                __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
                __m256i p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)), ones);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(rd_f16c(b) * a->d),
                                         acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            out[r0 + r] = hsum256(acc[r]);
    }
    vdot_row_fn fn = quant_vnni_vdot_for(GGUF_T_Q8_0);
    for (; r0 < nr; r0++)
        fn(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

vrows_fn quant_q256_vrows_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vrows_q8_0_q256 : NULL;
}

vrows_fn quant_q256_lanes_vrows_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vrows_q8_0_lanes_q256 : NULL;
}
#endif

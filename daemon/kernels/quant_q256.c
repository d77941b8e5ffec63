/* quant_q256: quant's Q8_0 kernels on AVX2 past the row dot (x86, compiled per function; picked by quant.c through quant_k256.c for the AVX2 and AVX-VNNI kernels): the prefill register tile and the eight-row decode kernel, each result quant_avx2.c's Q8_0 row dot's bit for bit. */
#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
#define Q256 __attribute__((target("avx2,fma,f16c")))
#define Q256_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* ------------------------------------------------------------------ prefill */

/* Q8_0 prefill: a register tile of up to Q8V_R rows x Q8V_T tokens, one
 * accumulator a (row, token) holding vdot_q8_0_avx2's very lanes: the
 * int32 lanes of |q| x (x with q's sign), pairs summed, are the same
 * integers; each converted exactly (|lane| <= 4 x 128 x 127 < 2^22: the
 * float bits of 1.5 x 2^23 + lane, less 1.5 x 2^23, an integer add and a
 * float subtract in place of vcvtdq2ps, which measured 4% faster here), FMA
 * by the same d x d_a (float products, a table of them a few blocks at a
 * time, so the tile's inner loop only loads them), blocks in order, the lanes
 * summed at the end by hsum256: every result the one-row kernel's bit for
 * bit, whatever the shape. */
#define Q8V_R 3   /* rows a tile (3 x 4 measured faster than 2 x 4, 4 x 4 and 4 x 2) */
#define Q8V_T 4   /* tokens a tile (<= 4: d_a of a block's tokens in one __m128) */
#define Q8V_KC 32 /* blocks a table of d x d_a */

Q256_INLINE void vtile_q8_0_q256_body(const uint8_t *w, size_t rb, const void *const *xq,
                                      size_t nblk, float *out, int ostride, int R, int T,
                                      const float *dwt)
{
    const __m256i ones = _mm256_set1_epi16(1), magic_i = _mm256_set1_epi32(0x4b400000);
    const __m256 magic_f = _mm256_set1_ps(12582912.0f);
    __m256 acc[Q8V_R * Q8V_T];
    float dd[Q8V_KC][Q8V_R][4]; /* d x d_a of block k0 + kk, row r, token t */
#pragma GCC unroll 12
    for (int i = 0; i < R * T; i++)
        acc[i] = _mm256_setzero_ps();
    for (size_t k0 = 0; k0 < nblk; k0 += Q8V_KC) {
        int nb = nblk - k0 < Q8V_KC ? (int)(nblk - k0) : Q8V_KC;
        for (int kk = 0; kk < nb; kk++) {
            /* d_a of the tokens, built in a register (a store of a few floats then a vector
             * load of them stalls on store forwarding) */
#define Q8V_DA(t) (T > (t) ? ((const quant_act_q8_t *)xq[t])[k0 + (size_t)kk].d : 0.0f)
            __m128 dav = _mm_setr_ps(Q8V_DA(0), Q8V_DA(1), Q8V_DA(2), Q8V_DA(3));
#undef Q8V_DA
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                size_t k = k0 + (size_t)kk;
                float d = dwt ? dwt[(size_t)r * nblk + k] : rd_f16c(w + (size_t)r * rb + 34 * k);
                _mm_storeu_ps(dd[kk][r], _mm_mul_ps(_mm_set1_ps(d), dav));
            }
        }
        for (int kk = 0; kk < nb; kk++) {
            size_t k = k0 + (size_t)kk;
            __m256i q[Q8V_R], aq[Q8V_R];
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) {
                q[r] = _mm256_loadu_si256((const __m256i *)(w + (size_t)r * rb + 34 * k + 2));
                aq[r] = _mm256_abs_epi8(q[r]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
                __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m256i p = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(x, q[r])), ones);
                    __m256 f =
                        _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(p, magic_i)), magic_f);
                    acc[r * T + t] =
                        _mm256_fmadd_ps(f, _mm256_broadcast_ss(&dd[kk][r][t]), acc[r * T + t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            out[r * ostride + t] = hsum256(acc[r * T + t]);
}

/* the rows' d as floats, once a tile of rows for all its tokens (rows of more blocks: in the
 * tile, once a token group) */
#define Q8V_BLK_MAX 2048
static _Thread_local float q8v_dw[Q8V_R * Q8V_BLK_MAX];

/* Any nr x nx, in tiles of up to Q8V_R rows x Q8V_T tokens. */
Q256 static void vtile_q8_0_q256(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                 int nx, size_t nblk, float *out0)
{
    float *dwt = nblk <= Q8V_BLK_MAX ? q8v_dw : NULL;
    for (int r0 = 0; r0 < nr; r0 += Q8V_R) {
        int R = nr - r0 < Q8V_R ? nr - r0 : Q8V_R;
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (int r = 0; dwt && r < R; r++)
            for (size_t k = 0; k < nblk; k++)
                dwt[(size_t)r * nblk + k] = rd_f16c(w + (size_t)r * rb + 34 * k);
        for (int t0 = 0; t0 < nx; t0 += Q8V_T) {
            int T = nx - t0 < Q8V_T ? nx - t0 : Q8V_T;
            const void *const *xq = xq0 + t0;
            float *out = out0 + (size_t)r0 * nx + t0;
            switch (R * 8 + T) {
#define Q8V_CASE(r, t)                                                                             \
    case r * 8 + t: vtile_q8_0_q256_body(w, rb, xq, nblk, out, nx, r, t, dwt); break;
                Q8V_CASE(1, 1)
                Q8V_CASE(1, 2)
                Q8V_CASE(1, 3)
                Q8V_CASE(1, 4)
                Q8V_CASE(2, 1)
                Q8V_CASE(2, 2)
                Q8V_CASE(2, 3)
                Q8V_CASE(2, 4)
                Q8V_CASE(3, 1)
                Q8V_CASE(3, 2)
                Q8V_CASE(3, 3)
                Q8V_CASE(3, 4)
#undef Q8V_CASE
            default: break;
            }
        }
    }
}

vtile_fn quant_q256_vtile_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_q256 : NULL;
}

/* ------------------------------------------------------------------ decode */

#define Q8V_PF 2 /* row groups ahead the Q8_0 decode kernel prefetches */

/* Q8_0 decode: eight rows a block at a time, each row's lanes and float order as
 * vdot_q8_0_avx2's with one token (the same results bit for bit), the rows Q8V_PF groups on
 * prefetched a block's share at a time: one token reads each weight once, from memory or a
 * far cache, and the hardware prefetchers stop at 4 KB pages (57 -> 80-90 tok/s, Q8_0 decode
 * of the 134M model, one thread). */
Q256 static void vrows_q8_0_q256(const uint8_t *w, size_t rb, int nr, const void *xq, size_t nblk,
                                 float *out)
{
    const __m256i ones = _mm256_set1_epi16(1);
    int r0 = 0;
    for (; r0 + 8 <= nr; r0 += 8) {
        const uint8_t *w0 = w + (size_t)r0 * rb;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            acc[r] = _mm256_setzero_ps();
        const uint8_t *pf = w0 + (size_t)Q8V_PF * 8 * rb;
        for (size_t k = 0; k < nblk; k++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            if (r0 + 8 * (Q8V_PF + 1) <= nr)
                for (int i = 0; i < 8 * 34; i += 64)
                    _mm_prefetch((const char *)(pf + 8 * 34 * k + (size_t)i), _MM_HINT_T0);
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
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q8_0);
    for (; r0 < nr; r0++)
        fn(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

vrows_fn quant_q256_vrows_for(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vrows_q8_0_q256 : NULL;
}
#endif

/* quant_k512: quant's Q4_K and Q6_K prefill tiles on AVX-512 VNNI (x86, compiled per function; picked by quant_avx512.c): sixteen weight rows interleaved a 32-bit lane each, so one broadcast word of activations feeds sixteen rows' vpdpbusd. */
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
/* ------------------------------------------------------------------ the interleaved tiles
 * Per call, the tile's rows are repacked a few blocks at a time into a
 * thread-local scratch (lane r holds row r) by gathers: Q4_K's packed
 * nibbles as they are (dword j of 64-value chunk c), Q6_K's values + 32 as
 * bytes, the scales as int32 lanes, Q4_K's mins as int16 pairs, d and dmin
 * as floats. The repack is paid once per call and amortized over its
 * tokens (quant_tile_shape asks 16 rows x 32 tokens), never kept between
 * calls: the weights' bytes, and so the store's and the pool's sizes, stay
 * as the file has them.
 *
 * Per block and token, lane r computes row r's integer sums exactly as the
 * portable dot does. Q4_K: four vpdpbusd (u4 x s8, 16 products, |sum| <=
 * 16 x 15 x 128 < 2^15) then one vpdpwssd by the sub-block scale (the
 * sum's upper int16 is its sign, paired with a zero), twice a sub-block;
 * the mins by four vpdpwssd of mins pairs with the activations' sub-block
 * sums. Q6_K: four vpdpbusd a 16-value sub-block (values + 32) times its
 * scale (vpmulld), less 32 x scales x activation sums. The float term is
 * k_term's expression lane by lane, summed over blocks in order: every
 * result is the portable dot's bit for bit, whatever the tile shape, token
 * grouping or chunking (and so the AVX-512 decode kernels', which are
 * exact too). */
#define K512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define K512 __attribute__((target(K512_TARGET)))
#define K512_INLINE static inline __attribute__((always_inline, target(K512_TARGET)))

#define K512_ROWS 16   /* rows a tile: one per 32-bit lane */
#define K512_CHUNK 6   /* Q4_K blocks repacked at a time (17 KB of scratch) */
#define K512_TOK 8     /* tokens a register pass */
#define K512_NX_MAX 32 /* tokens a call keeps accumulators for; more go 32 at a time */

/* one block of 16 rows, lane r holding row r */
typedef struct k512_blk {
    __m512i qs[32]; /* dword j of chunk c at 8c + j: sub-block 2c's low nibbles, 2c + 1's high */
    __m512i sc[8];  /* sub-block scales, int32 (0..63) */
    __m512i mn[4];  /* mins of sub-blocks 2k and 2k + 1 as two int16 */
    __m512 d, dm;   /* the block's F16 factors as floats */
} k512_blk_t;

/* one Q6_K block of 16 rows, lane r holding row r */
typedef struct k512_q6 {
    __m512i q[64];  /* values + 32 (0..63) of elements 4i..4i+3 at i */
    __m512i sc[16]; /* sub-block scales, int32 (-128..127) */
    __m512i scp[8]; /* scales 2j and 2j + 1 as two int16 */
    __m512 d;       /* the block's F16 factor as a float */
} k512_q6_t;

#define K512_CHUNK6 3 /* Q6_K blocks repacked at a time (17 KB) */

static _Thread_local union {
    k512_blk_t q4[K512_CHUNK];
    k512_q6_t q6[K512_CHUNK6];
} k512_scratch;

/* bytes 0..3 of every lane as int16 pairs (b0 | b1 << 16), (b2 | b3 << 16) */
K512_INLINE __m512i k512_pair_lo(__m512i v)
{
    const __m512i ff = _mm512_set1_epi32(0xff);
    return _mm512_or_si512(_mm512_and_si512(v, ff),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8), ff), 16));
}

K512_INLINE __m512i k512_pair_hi(__m512i v)
{
    return k512_pair_lo(_mm512_srli_epi32(v, 16));
}

/* Repack block k of rows 0..nr-1 (rb bytes apart) into *o; absent rows read nothing and
 * compute zeros. */
K512_INLINE void k512_repack(const uint8_t *w, __m512i idx, __mmask16 m, k512_blk_t *o)
{
    const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 32
    for (int i = 0; i < 32; i++)
        o->qs[i] = _mm512_mask_i32gather_epi32(z, m, idx, w + 16 + 4 * i, 1);
    __m512i h = _mm512_mask_i32gather_epi32(z, m, idx, w, 1);
    __m512i a = _mm512_mask_i32gather_epi32(z, m, idx, w + 4, 1);
    __m512i b = _mm512_mask_i32gather_epi32(z, m, idx, w + 8, 1);
    __m512i c = _mm512_mask_i32gather_epi32(z, m, idx, w + 12, 1);
    /* k4_scales_bytes on 16 rows: scales 0..3, mins 0..3, scales 4..7, mins 4..7 */
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m2 = _mm512_set1_epi32(0x03030303), ff = _mm512_set1_epi32(0xff);
    __m512i s03 = _mm512_and_si512(a, m6), n03 = _mm512_and_si512(b, m6);
    __m512i s47 =
        _mm512_or_si512(_mm512_and_si512(c, m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), m2), 4));
    __m512i n47 =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b, 6), m2), 4));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        o->sc[j] = _mm512_and_si512(_mm512_srli_epi32(s03, 8 * j), ff);
        o->sc[4 + j] = _mm512_and_si512(_mm512_srli_epi32(s47, 8 * j), ff);
    }
    o->mn[0] = k512_pair_lo(n03);
    o->mn[1] = k512_pair_hi(n03);
    o->mn[2] = k512_pair_lo(n47);
    o->mn[3] = k512_pair_hi(n47);
    o->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    o->dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
}

/* T tokens (xq[0..T-1], block k0 on) against nb repacked blocks, into acc[0..T-1] */
K512_INLINE void k512_pass(const k512_blk_t *bl, int nb, const void *const *xq, size_t k0,
                           __m512 *acc, int T)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), z = _mm512_setzero_si512();
    for (int k = 0; k < nb; k++) {
        const k512_blk_t *B = &bl[k];
        const quant_act_q8k_t *a[K512_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a[t] = (const quant_act_q8k_t *)xq[t] + k0 + (size_t)k;
        __m512i sq[K512_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            sq[t] = z;
#pragma GCC unroll 1
        for (int s = 0; s < 8; s++) {
            /* sub-block s: chunk s / 2, low nibbles for even s, high for odd */
            __m512i wv[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512i p = B->qs[8 * (s / 2) + j];
                wv[j] = _mm512_and_si512(s & 1 ? _mm512_srli_epi16(p, 4) : p, m4);
            }
            __m512i scs = B->sc[s];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int8_t *x = a[t]->qs + 32 * s;
                int32_t xw[8];
                memcpy(xw, x, 32);
                __m512i p0 = _mm512_dpbusd_epi32(z, wv[0], _mm512_set1_epi32(xw[0]));
                __m512i p1 = _mm512_dpbusd_epi32(z, wv[4], _mm512_set1_epi32(xw[4]));
                p0 = _mm512_dpbusd_epi32(p0, wv[1], _mm512_set1_epi32(xw[1]));
                p1 = _mm512_dpbusd_epi32(p1, wv[5], _mm512_set1_epi32(xw[5]));
                p0 = _mm512_dpbusd_epi32(p0, wv[2], _mm512_set1_epi32(xw[2]));
                p1 = _mm512_dpbusd_epi32(p1, wv[6], _mm512_set1_epi32(xw[6]));
                p0 = _mm512_dpbusd_epi32(p0, wv[3], _mm512_set1_epi32(xw[3]));
                p1 = _mm512_dpbusd_epi32(p1, wv[7], _mm512_set1_epi32(xw[7]));
                sq[t] = _mm512_dpwssd_epi32(sq[t], p0, scs);
                sq[t] = _mm512_dpwssd_epi32(sq[t], p1, scs);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            /* the activations' sub-block sums as int16 pairs (2k, 2k + 1) */
            __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[t]->bsums),
                                           _mm256_set1_epi16(1));
            bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(bs, bs), 0x08);
            int32_t bw[8];
            _mm256_storeu_si256((__m256i *)bw, bs);
            __m512i sm = _mm512_dpwssd_epi32(z, B->mn[0], _mm512_set1_epi32(bw[0]));
            sm = _mm512_dpwssd_epi32(sm, B->mn[1], _mm512_set1_epi32(bw[1]));
            sm = _mm512_dpwssd_epi32(sm, B->mn[2], _mm512_set1_epi32(bw[2]));
            sm = _mm512_dpwssd_epi32(sm, B->mn[3], _mm512_set1_epi32(bw[3]));
            /* k_term: a->d * (d * sq - dm * sm), then added */
            __m512 v = _mm512_sub_ps(_mm512_mul_ps(B->d, _mm512_cvtepi32_ps(sq[t])),
                                     _mm512_mul_ps(B->dm, _mm512_cvtepi32_ps(sm)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(a[t]->d), v));
        }
    }
}

/* k512_pass specialised on the token count */
K512 static void k512_pass_n(const k512_blk_t *bl, int nb, const void *const *xq, size_t k0,
                             __m512 *acc, int T)
{
    switch (T) {
    case 1: k512_pass(bl, nb, xq, k0, acc, 1); break;
    case 2: k512_pass(bl, nb, xq, k0, acc, 2); break;
    case 3: k512_pass(bl, nb, xq, k0, acc, 3); break;
    case 4: k512_pass(bl, nb, xq, k0, acc, 4); break;
    case 5: k512_pass(bl, nb, xq, k0, acc, 5); break;
    case 6: k512_pass(bl, nb, xq, k0, acc, 6); break;
    case 7: k512_pass(bl, nb, xq, k0, acc, 7); break;
    default: k512_pass(bl, nb, xq, k0, acc, 8); break;
    }
}

/* Repack Q6_K block k of rows 0..nr-1 into *o (the dword of d and scales 14, 15 at 206: no
 * read past the block) */
K512_INLINE void k512_repack6(const uint8_t *w, __m512i idx, __mmask16 m, k512_q6_t *o)
{
    const __m512i z = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f);
    const __m512i m2 = _mm512_set1_epi8(3);
    __m512i ql[32], qh[16];
#pragma GCC unroll 32
    for (int i = 0; i < 32; i++)
        ql[i] = _mm512_mask_i32gather_epi32(z, m, idx, w + 4 * i, 1);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        qh[i] = _mm512_mask_i32gather_epi32(z, m, idx, w + 128 + 4 * i, 1);
        /* elements 4i..4i+3: half n = i / 32, group g = i / 8 % 4, l / 4 = i % 8 */
#pragma GCC unroll 64
    for (int i = 0; i < 64; i++) {
        int n = i / 32, g = i / 8 % 4, l4 = i % 8;
        __m512i lo = _mm512_and_si512(
            _mm512_srli_epi16(ql[16 * n + 8 * (g % 2) + l4], (unsigned)(4 * (g / 2))), m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(qh[8 * n + l4], (unsigned)(2 * g)), m2);
        o->q[i] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
    }
    const __m512i lo16 = _mm512_set1_epi32(0xffff);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i x = _mm512_mask_i32gather_epi32(z, m, idx, w + 192 + 4 * j, 1);
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            o->sc[4 * j + b] = _mm512_srai_epi32(_mm512_slli_epi32(x, (unsigned)(24 - 8 * b)), 24);
        /* int16 lanes: bytes 0, 2 and 1, 3 sign-extended */
        __m512i e = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 8), od = _mm512_srai_epi16(x, 8);
        o->scp[2 * j] = _mm512_or_si512(_mm512_and_si512(e, lo16), _mm512_slli_epi32(od, 16));
        o->scp[2 * j + 1] =
            _mm512_or_si512(_mm512_srli_epi32(e, 16), _mm512_andnot_si512(lo16, od));
    }
    __m512i h = _mm512_mask_i32gather_epi32(z, m, idx, w + 206, 1);
    o->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
}

/* T tokens against nb repacked Q6_K blocks: per sub-block of 16, four vpdpbusd (values + 32)
 * times the scale; the offset 32 x scales x activation sums comes off per block, as the
 * AVX2 kernel does */
K512_INLINE void k512_pass6(const k512_q6_t *bl, int nb, const void *const *xq, size_t k0,
                            __m512 *acc, int T)
{
    const __m512i z = _mm512_setzero_si512();
    for (int k = 0; k < nb; k++) {
        const k512_q6_t *B = &bl[k];
        const quant_act_q8k_t *a[K512_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a[t] = (const quant_act_q8k_t *)xq[t] + k0 + (size_t)k;
        __m512i sq[K512_TOK];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            sq[t] = z;
#pragma GCC unroll 1
        for (int s = 0; s < 16; s++) {
            __m512i w0 = B->q[4 * s], w1 = B->q[4 * s + 1], w2 = B->q[4 * s + 2];
            __m512i w3 = B->q[4 * s + 3], scs = B->sc[s];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                int32_t xw[4];
                memcpy(xw, a[t]->qs + 16 * s, 16);
                __m512i p = _mm512_dpbusd_epi32(z, w0, _mm512_set1_epi32(xw[0]));
                p = _mm512_dpbusd_epi32(p, w1, _mm512_set1_epi32(xw[1]));
                p = _mm512_dpbusd_epi32(p, w2, _mm512_set1_epi32(xw[2]));
                p = _mm512_dpbusd_epi32(p, w3, _mm512_set1_epi32(xw[3]));
                sq[t] = _mm512_add_epi32(sq[t], _mm512_mullo_epi32(p, scs));
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            int32_t bw[8];
            memcpy(bw, a[t]->bsums, 32);
            __m512i off = z;
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                off = _mm512_dpwssd_epi32(off, B->scp[j], _mm512_set1_epi32(bw[j]));
            /* k_term with no mins: a->d * (d * sq - 0) */
            __m512 v = _mm512_mul_ps(
                B->d, _mm512_cvtepi32_ps(_mm512_sub_epi32(sq[t], _mm512_slli_epi32(off, 5))));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(a[t]->d), v));
        }
    }
}

K512 static void k512_pass6_n(const k512_q6_t *bl, int nb, const void *const *xq, size_t k0,
                              __m512 *acc, int T)
{
    switch (T) {
    case 1: k512_pass6(bl, nb, xq, k0, acc, 1); break;
    case 2: k512_pass6(bl, nb, xq, k0, acc, 2); break;
    case 3: k512_pass6(bl, nb, xq, k0, acc, 3); break;
    case 4: k512_pass6(bl, nb, xq, k0, acc, 4); break;
    case 5: k512_pass6(bl, nb, xq, k0, acc, 5); break;
    case 6: k512_pass6(bl, nb, xq, k0, acc, 6); break;
    case 7: k512_pass6(bl, nb, xq, k0, acc, 7); break;
    default: k512_pass6(bl, nb, xq, k0, acc, 8); break;
    }
}

/* up to 16 rows x up to K512_NX_MAX tokens of Q4_K (q6 = 0) or Q6_K, out[r * ostride + t] */
K512 static void k512_tile16(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                             size_t nblk, float *out, int ostride, int q6)
{
    __m512 acc[K512_NX_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm512_setzero_ps();
    __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)rb));
    __mmask16 m = (__mmask16)((1u << nr) - 1);
    int chunk = q6 ? K512_CHUNK6 : K512_CHUNK;
    for (size_t k0 = 0; k0 < nblk; k0 += (size_t)chunk) {
        int nb = nblk - k0 < (size_t)chunk ? (int)(nblk - k0) : chunk;
        for (int k = 0; k < nb; k++) {
            if (q6)
                k512_repack6(w + (k0 + (size_t)k) * 210, idx, m, &k512_scratch.q6[k]);
            else
                k512_repack(w + (k0 + (size_t)k) * 144, idx, m, &k512_scratch.q4[k]);
        }
        for (int t0 = 0; t0 < nx; t0 += K512_TOK) {
            int T = nx - t0 < K512_TOK ? nx - t0 : K512_TOK;
            if (q6)
                k512_pass6_n(k512_scratch.q6, nb, xq + t0, k0, acc + t0, T);
            else
                k512_pass_n(k512_scratch.q4, nb, xq + t0, k0, acc + t0, T);
        }
    }
    for (int t = 0; t < nx; t++) {
        float v[K512_ROWS];
        _mm512_storeu_ps(v, acc[t]);
        for (int r = 0; r < nr; r++)
            out[r * ostride + t] = v[r];
    }
}

/* Any nr x nx: 16 rows x 32 tokens at a time (rows over 2^31 / 16 bytes, past the gathers'
 * int32 offsets: the AVX2 row dot, the same results). */
K512_INLINE void k512_vtile(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                            size_t nblk, float *out, int q6)
{
    if (rb > 0x7fffffff / K512_ROWS) {
        vdot_row_fn fn = quant_avx2_vdot_for(q6 ? GGUF_T_Q6_K : GGUF_T_Q4_K);
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nx; t++)
                fn(w + (size_t)r * rb, xq + t, 1, nblk, out + (size_t)r * nx + t);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += K512_ROWS) {
        int R = nr - r0 < K512_ROWS ? nr - r0 : K512_ROWS;
        for (int t0 = 0; t0 < nx; t0 += K512_NX_MAX)
            k512_tile16(w + (size_t)r0 * rb, rb, R, xq + t0,
                        nx - t0 < K512_NX_MAX ? nx - t0 : K512_NX_MAX, nblk,
                        out + (size_t)r0 * nx + t0, nx, q6);
    }
}

K512 static void vtile_q4_k_k512(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                                 size_t nblk, float *out)
{
    k512_vtile(w, rb, nr, xq, nx, nblk, out, 0);
}

K512 static void vtile_q6_k_k512(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                                 size_t nblk, float *out)
{
    k512_vtile(w, rb, nr, xq, nx, nblk, out, 1);
}

vtile_fn quant_k512_vtile_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q4_K: return vtile_q4_k_k512;
    case GGUF_T_Q6_K: return vtile_q6_k_k512;
    default: return NULL;
    }
}
#endif

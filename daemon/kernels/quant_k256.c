/* quant_k256: quant's Q4_K prefill tile on AVX2 (x86, compiled per function; picked by quant.c for the AVX2 and AVX-VNNI kernels): quant_k512.c's interleaved tile on 256 bits, eight weight rows a 32-bit lane each. */
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
/* ------------------------------------------------------------------ the interleaved tile
 * As quant_k512.c's Q4_K tile (its comment has the layout and the bounds),
 * eight rows a vector, AVX2 only (no AVX-VNNI instruction, so one kernel
 * serves both tables): per 16 products of a row, four vpmaddubsw (pairs,
 * |.| <= 2 x 15 x 128) summed in int16 (<= 15360), then one vpmaddwd by
 * the scale in both int16 halves. Lane r holds row r's exact integer sums
 * and the float term is k_term's, lane by lane, blocks in order: the
 * portable dot bit for bit, as the AVX2 row dots (decode) are. */
#define K256_TARGET "avx2,fma,f16c"
#define K256 __attribute__((target(K256_TARGET)))
#define K256_INLINE static inline __attribute__((always_inline, target(K256_TARGET)))

#define K256_ROWS 8    /* rows a tile: one per 32-bit lane */
#define K256_CHUNK 12  /* blocks repacked at a time (17 KB of scratch) */
#define K256_TOK 4     /* tokens a register pass */
#define K256_NX_MAX 32 /* tokens a call keeps accumulators for */

/* one Q4_K block of 8 rows, lane r holding row r */
typedef struct k256_blk {
    __m256i qs[32]; /* dword j of chunk c at 8c + j: sub-block 2c's low nibbles, 2c + 1's high */
    __m256i sc[8];  /* sub-block scales in both int16 halves */
    __m256i mn[4];  /* mins of sub-blocks 2k and 2k + 1 as two int16 */
    __m256 d, dm;   /* the block's F16 factors as floats */
} k256_blk_t;

static _Thread_local k256_blk_t k256_scratch[K256_CHUNK];

K256_INLINE __m256i k256_pair(__m256i v)
{
    const __m256i ff = _mm256_set1_epi32(0xff);
    return _mm256_or_si256(_mm256_and_si256(v, ff),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 8), ff), 16));
}

/* Repack block w (rows idx bytes apart, absent rows masked off) into *o. */
K256_INLINE void k256_repack(const uint8_t *w, __m256i idx, __m256i m, k256_blk_t *o)
{
    const __m256i z = _mm256_setzero_si256();
#pragma GCC unroll 32
    for (int i = 0; i < 32; i++)
        o->qs[i] = _mm256_mask_i32gather_epi32(z, (const int *)(w + 16 + 4 * i), idx, m, 1);
    __m256i h = _mm256_mask_i32gather_epi32(z, (const int *)w, idx, m, 1);
    __m256i a = _mm256_mask_i32gather_epi32(z, (const int *)(w + 4), idx, m, 1);
    __m256i b = _mm256_mask_i32gather_epi32(z, (const int *)(w + 8), idx, m, 1);
    __m256i c = _mm256_mask_i32gather_epi32(z, (const int *)(w + 12), idx, m, 1);
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i m2 = _mm256_set1_epi32(0x03030303), ff = _mm256_set1_epi32(0xff);
    __m256i s03 = _mm256_and_si256(a, m6), n03 = _mm256_and_si256(b, m6);
    __m256i s47 =
        _mm256_or_si256(_mm256_and_si256(c, m4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a, 6), m2), 4));
    __m256i n47 =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), m4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(b, 6), m2), 4));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i lo = _mm256_and_si256(_mm256_srli_epi32(s03, 8 * j), ff);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi32(s47, 8 * j), ff);
        o->sc[j] = _mm256_or_si256(lo, _mm256_slli_epi32(lo, 16));
        o->sc[4 + j] = _mm256_or_si256(hi, _mm256_slli_epi32(hi, 16));
    }
    o->mn[0] = k256_pair(n03);
    o->mn[1] = k256_pair(_mm256_srli_epi32(n03, 16));
    o->mn[2] = k256_pair(n47);
    o->mn[3] = k256_pair(_mm256_srli_epi32(n47, 16));
    /* d and dmin: the int32 lanes' low and high halves, packed to eight int16 each */
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    __m256i dd = _mm256_and_si256(h, lo16), dmm = _mm256_srli_epi32(h, 16);
    __m128i d16 = _mm_packus_epi32(_mm256_castsi256_si128(dd), _mm256_extracti128_si256(dd, 1));
    __m128i m16 = _mm_packus_epi32(_mm256_castsi256_si128(dmm), _mm256_extracti128_si256(dmm, 1));
    o->d = _mm256_cvtph_ps(d16);
    o->dm = _mm256_cvtph_ps(m16);
}

/* 16 products of each row (four words of activations x against wv[0..3]) times the scale,
 * added to sq */
K256_INLINE __m256i k256_dot16(__m256i sq, const __m256i *wv, const int32_t *xw, __m256i scs)
{
    __m256i p0 = _mm256_maddubs_epi16(wv[0], _mm256_set1_epi32(xw[0]));
    __m256i p1 = _mm256_maddubs_epi16(wv[1], _mm256_set1_epi32(xw[1]));
    __m256i p2 = _mm256_maddubs_epi16(wv[2], _mm256_set1_epi32(xw[2]));
    __m256i p3 = _mm256_maddubs_epi16(wv[3], _mm256_set1_epi32(xw[3]));
    __m256i p = _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3));
    return _mm256_add_epi32(sq, _mm256_madd_epi16(p, scs));
}

/* T tokens (block k0 on) against nb repacked blocks, into acc[0..T-1] */
K256_INLINE void k256_pass(const k256_blk_t *bl, int nb, const void *const *xq, size_t k0,
                           __m256 *acc, int T)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), z = _mm256_setzero_si256();
    for (int k = 0; k < nb; k++) {
        const k256_blk_t *B = &bl[k];
        const quant_act_q8k_t *a[K256_TOK];
        __m256i sq[K256_TOK];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            a[t] = (const quant_act_q8k_t *)xq[t] + k0 + (size_t)k;
            sq[t] = z;
        }
#pragma GCC unroll 1
        for (int s = 0; s < 16; s++) {
            /* half s % 2 (words 4h..4h+3) of sub-block s / 2: chunk s / 4, low or high nibbles */
            int sb = s / 2, h = s % 2;
            __m256i wv[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i p = B->qs[8 * (sb / 2) + 4 * h + j];
                wv[j] = _mm256_and_si256(sb & 1 ? _mm256_srli_epi16(p, 4) : p, m4);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                int32_t xw[4];
                memcpy(xw, a[t]->qs + 32 * sb + 16 * h, 16);
                sq[t] = k256_dot16(sq[t], wv, xw, B->sc[sb]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[t]->bsums),
                                           _mm256_set1_epi16(1));
            bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(bs, bs), 0x08);
            int32_t bw[8];
            _mm256_storeu_si256((__m256i *)bw, bs);
            __m256i sm = z;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                sm = _mm256_add_epi32(sm, _mm256_madd_epi16(B->mn[j], _mm256_set1_epi32(bw[j])));
            /* k_term: a->d * (d * sq - dm * sm), then added */
            __m256 v = _mm256_sub_ps(_mm256_mul_ps(B->d, _mm256_cvtepi32_ps(sq[t])),
                                     _mm256_mul_ps(B->dm, _mm256_cvtepi32_ps(sm)));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(a[t]->d), v));
        }
    }
}

/* k256_pass specialised on the token count */
K256 static void k256_pass_n(const k256_blk_t *bl, int nb, const void *const *xq, size_t k0,
                             __m256 *acc, int T)
{
    switch (T) {
    case 1: k256_pass(bl, nb, xq, k0, acc, 1); break;
    case 2: k256_pass(bl, nb, xq, k0, acc, 2); break;
    case 3: k256_pass(bl, nb, xq, k0, acc, 3); break;
    default: k256_pass(bl, nb, xq, k0, acc, 4); break;
    }
}

/* up to 8 rows x up to K256_NX_MAX tokens, out[r * ostride + t] */
K256 static void k256_tile8(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                            size_t nblk, float *out, int ostride)
{
    __m256 acc[K256_NX_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i idx = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)rb));
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
    for (size_t k0 = 0; k0 < nblk; k0 += K256_CHUNK) {
        int nb = nblk - k0 < K256_CHUNK ? (int)(nblk - k0) : K256_CHUNK;
        for (int k = 0; k < nb; k++)
            k256_repack(w + (k0 + (size_t)k) * 144, idx, m, &k256_scratch[k]);
        for (int t0 = 0; t0 < nx; t0 += K256_TOK)
            k256_pass_n(k256_scratch, nb, xq + t0, k0, acc + t0,
                        nx - t0 < K256_TOK ? nx - t0 : K256_TOK);
    }
    for (int t = 0; t < nx; t++) {
        float v[K256_ROWS];
        _mm256_storeu_ps(v, acc[t]);
        for (int r = 0; r < nr; r++)
            out[r * ostride + t] = v[r];
    }
}

/* Any nr x nx: 8 rows x 32 tokens at a time (rows over 2^31 / 8 bytes, past the gathers' int32
 * offsets: the AVX2 row dot, the same results). */
K256 static void vtile_q4_k_k256(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                                 size_t nblk, float *out)
{
    if (rb > 0x7fffffff / K256_ROWS) {
        vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q4_K);
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nx; t++)
                fn(w + (size_t)r * rb, xq + t, 1, nblk, out + (size_t)r * nx + t);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += K256_ROWS) {
        int R = nr - r0 < K256_ROWS ? nr - r0 : K256_ROWS;
        for (int t0 = 0; t0 < nx; t0 += K256_NX_MAX)
            k256_tile8(w + (size_t)r0 * rb, rb, R, xq + t0,
                       nx - t0 < K256_NX_MAX ? nx - t0 : K256_NX_MAX, nblk,
                       out + (size_t)r0 * nx + t0, nx);
    }
}

vtile_fn quant_k256_vtile_for(uint32_t type)
{
    return type == GGUF_T_Q4_K ? vtile_q4_k_k256 : NULL;
}
#endif

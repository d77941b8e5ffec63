/* quant_k256: quant's K-quant kernels on AVX2 (x86, compiled per function; picked by quant.c for the AVX2 and AVX-VNNI kernels): Q4_K's prefill tile (quant_k512.c's interleaved tile on 256 bits, eight weight rows a 32-bit lane each), Q6_K's prefill tile and the Q4_K and Q6_K decode kernels (eight rows at a time, nothing repacked). */
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

/* a word of activations in every lane (vpbroadcastd from memory: a load, no shuffle) */
K256_INLINE __m256i k256_bcast32(const int8_t *x)
{
    return _mm256_broadcastd_epi32(_mm_loadu_si32(x));
}

/* 16 products of each row (four words of activations x against wv[0..3]) times the scale,
 * added to sq */
K256_INLINE __m256i k256_dot16(__m256i sq, const __m256i *wv, const int8_t *x, __m256i scs)
{
    __m256i p0 = _mm256_maddubs_epi16(wv[0], k256_bcast32(x));
    __m256i p1 = _mm256_maddubs_epi16(wv[1], k256_bcast32(x + 4));
    __m256i p2 = _mm256_maddubs_epi16(wv[2], k256_bcast32(x + 8));
    __m256i p3 = _mm256_maddubs_epi16(wv[3], k256_bcast32(x + 12));
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
            for (int t = 0; t < T; t++)
                sq[t] = k256_dot16(sq[t], wv, a[t]->qs + 32 * sb + 16 * h, B->sc[sb]);
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

/* ------------------------------------------------------------------ the eight-row kernels
 * Q4_K and Q6_K against one token (decode), and Q6_K against up to four
 * (its prefill tile), eight rows at a time, nothing repacked: each row's
 * block is summed as the AVX2 row dot sums it (maddubs, then vpmaddwd by
 * the sub-block's scale, an int32 vector of partial sums), the eight rows'
 * vectors reduced together by one transpose-and-add tree (lane r: row r's
 * exact integer sum); the scales' other uses, d and dmin come by gathers,
 * lane r row r, and the float term is k_term's expression lane by lane,
 * blocks in order: the portable dot bit for bit, as the interleaved tile
 * and the row dots are. Rows past the last multiple of eight, and rows
 * over 2^31 / 8 bytes (past the gathers' int32 offsets): the AVX2 row dot.
 * Decode prefetches the rows K256_PF groups on (rows end to end only). */

#define K256_PF 2 /* row groups ahead the decode kernels prefetch */

/* Prefetch block k's share of the row group K256_PF groups on (8 rows of nblk blocks of bb
 * bytes, from g): the hardware prefetchers stop at 4 KB pages, and one token's weights are
 * read once, from memory or a far cache. */
K256_INLINE void k256_prefetch(const uint8_t *g, size_t rb, size_t bb, size_t k)
{
    const uint8_t *p = g + (size_t)K256_PF * 8 * rb + 8 * bb * k;
    for (size_t i = 0; i < 8 * bb; i += 64)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

/* lane r: the sum of v[r]'s eight int32 lanes */
K256_INLINE __m256i k256_reduce8(const __m256i *v)
{
    __m256i x[4], y[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* 128-bit lane L: v[2i]'s partials at 0, 2, v[2i + 1]'s at 1, 3 */
        x[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* 128-bit lane L, dword j: lane L's part of v[4i + j] */
        y[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(x[2 * i], x[2 * i + 1]),
                                _mm256_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(y[0], y[1], 0x20),
                            _mm256_permute2x128_si256(y[0], y[1], 0x31));
}

/* 8 rows' dwords at byte offset off of a block (rows idx bytes apart), lane r: row r */
K256_INLINE __m256i k256_rows8(const uint8_t *b, __m256i idx, size_t off)
{
    return _mm256_i32gather_epi32((const int *)(b + off), idx, 1);
}

/* int16 lanes all byte j of each 128-bit lane of v, zero-extended */
K256_INLINE __m256i k256_bcast_u8(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(j - 0x8000)));
}

/* one Q4_K block of a row (scale bytes sc8) against 256 activations aq: values x scales as
 * int32 partial sums */
K256_INLINE __m256i k256_q4k_row(const uint8_t *b, const int8_t *aq, const uint8_t *sc8)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    uint64_t s64;
    memcpy(&s64, sc8, 8);
    __m256i scb = _mm256_set1_epi64x((long long)s64), sum = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(aq + 64 * c)));
        __m256i p1 =
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 64 * c + 32)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p0, k256_bcast_u8(scb, 2 * c)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p1, k256_bcast_u8(scb, 2 * c + 1)));
    }
    return sum;
}

K256 static void vrows_q4_k_k256(const uint8_t *w, size_t rb, int nr, const void *xq, size_t nblk,
                                 float *out)
{
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i m2 = _mm256_set1_epi32(0x03030303), lo16 = _mm256_set1_epi32(0xffff);
    const __m256i ev = _mm256_set1_epi32(0x00ff00ff);
    /* row r's eight scale bytes in scs (unpacklo then unpackhi of scales 0..3 and 4..7): at
     * pos[r] */
    static const int pos[8] = {0, 8, 32, 40, 16, 24, 48, 56};
    __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                     _mm256_set1_epi32((int)(rb <= 0x7fffffff / 8 ? rb : 0)));
    int r0 = 0;
    for (; rb <= 0x7fffffff / 8 && r0 + 8 <= nr; r0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        const uint8_t *w0 = w + (size_t)r0 * rb;
        int pf = rb == 144 * nblk && r0 + 8 * (K256_PF + 1) <= nr;
        for (size_t k = 0; k < nblk; k++) {
            const uint8_t *b0 = w0 + k * 144;
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq + k;
            if (pf)
                k256_prefetch(w0, rb, 144, k);
            __m256i h = k256_rows8(b0, idx, 0), sa = k256_rows8(b0, idx, 4);
            __m256i sb = k256_rows8(b0, idx, 8), sc = k256_rows8(b0, idx, 12);
            /* k4_scales_bytes lane by lane: scales 0..3, 4..7 and mins 0..3, 4..7 */
            __m256i s03 = _mm256_and_si256(sa, m6), n03 = _mm256_and_si256(sb, m6);
            __m256i s47 = _mm256_or_si256(
                _mm256_and_si256(sc, m4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sa, 6), m2), 4));
            __m256i n47 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32(sc, 4), m4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sb, 6), m2), 4));
            uint8_t scs[64];
            _mm256_storeu_si256((__m256i *)scs, _mm256_unpacklo_epi32(s03, s47));
            _mm256_storeu_si256((__m256i *)(scs + 32), _mm256_unpackhi_epi32(s03, s47));
            __m256i S[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                S[r] = k256_q4k_row(b0 + (size_t)r * rb, a->qs, scs + pos[r]);
            __m256i sq = k256_reduce8(S);
            /* mins: (2j, 2j + 2) and (2j + 1, 2j + 3) as int16 pairs against the activations'
             * 32-value sums */
            int32_t bp[8];
            _mm256_storeu_si256((__m256i *)bp,
                                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums),
                                                  _mm256_set1_epi16(1)));
            __m256i sm = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int j = 0; j < 2; j++) {
                __m256i n = j ? n47 : n03;
                uint32_t pe = (uint16_t)bp[4 * j] | (uint32_t)(uint16_t)bp[4 * j + 2] << 16;
                uint32_t po = (uint16_t)bp[4 * j + 1] | (uint32_t)(uint16_t)bp[4 * j + 3] << 16;
                sm = _mm256_add_epi32(
                    sm, _mm256_madd_epi16(_mm256_and_si256(n, ev), _mm256_set1_epi32((int)pe)));
                sm = _mm256_add_epi32(
                    sm, _mm256_madd_epi16(_mm256_srli_epi16(n, 8), _mm256_set1_epi32((int)po)));
            }
            __m256i dd = _mm256_and_si256(h, lo16), dmm = _mm256_srli_epi32(h, 16);
            __m256 d = _mm256_cvtph_ps(
                _mm_packus_epi32(_mm256_castsi256_si128(dd), _mm256_extracti128_si256(dd, 1)));
            __m256 dm = _mm256_cvtph_ps(
                _mm_packus_epi32(_mm256_castsi256_si128(dmm), _mm256_extracti128_si256(dmm, 1)));
            /* k_term: a->d * (d * sq - dm * sm), then added */
            __m256 v = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sq)),
                                     _mm256_mul_ps(dm, _mm256_cvtepi32_ps(sm)));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(a->d), v));
        }
        _mm256_storeu_ps(out + r0, acc);
    }
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q4_K);
    for (; r0 < nr; r0++)
        fn(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

/* one Q6_K block k of a row against T tokens: values x scales less 32 x activation sums x
 * scales, as int32 partial sums, sum[t] */
K256_INLINE void k256_q6k_row(const uint8_t *b, const void *const *xq, size_t k, int T,
                              __m256i *sum)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
        __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
        sum[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                  _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
    }
    /* per half, its 8 scales in both 128-bit lanes */
    __m256i schs[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                       _mm256_permute2x128_si256(sc16, sc16, 0x11)};
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        __m256i sch = schs[n];
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            /* values + 32: nibble g / 2 of ql, bits 2g..2g + 1 of qh */
            __m256i ql = g % 2 ? ql1 : ql0;
            __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
            __m256i hi = g ? _mm256_srli_epi16(qh, 2 * g) : qh;
            __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hi, m2), 4));
            /* sub-blocks 2g and 2g + 1 of the half: int16 scale lanes */
            __m256i scv = _mm256_shuffle_epi8(
                sch, _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g))),
                                       _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g + 1)))));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n + 32 * g;
                __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, scv));
            }
        }
    }
}

/* 8 rows x T tokens of Q6_K, out[r * ostride + t] */
K256_INLINE void k256_q6k_tile8(const uint8_t *w, size_t rb, __m256i idx, const void *const *xq,
                                int T, size_t nblk, float *out, int ostride)
{
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        const uint8_t *b0 = w + k * 210;
        __m256i S[4][8], s[4];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            k256_q6k_row(b0 + (size_t)r * rb, xq, k, T, s);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                S[t][r] = s[t];
        }
        /* d: the high half of the dword at 206 (no read past the block) */
        __m256i dh = _mm256_srli_epi32(k256_rows8(b0, idx, 206), 16);
        __m256 d = _mm256_cvtph_ps(
            _mm_packus_epi32(_mm256_castsi256_si128(dh), _mm256_extracti128_si256(dh, 1)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            /* k_term with no mins: a->d * (d * sq - 0) */
            __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(k256_reduce8(S[t])));
            float ad = ((const quant_act_q8k_t *)xq[t] + k)->d;
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(ad), v));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float v[8];
        _mm256_storeu_ps(v, acc[t]);
        for (int r = 0; r < 8; r++)
            out[r * ostride + t] = v[r];
    }
}

/* Any nr x nx of Q6_K: 8 rows x 4 tokens at a time; the last nr % 8 rows (and rows over
 * 2^31 / 8 bytes) by the AVX2 row dot, the same results. */
K256 static void vtile_q6_k_k256(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                                 size_t nblk, float *out)
{
    __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                     _mm256_set1_epi32((int)(rb <= 0x7fffffff / 8 ? rb : 0)));
    int r0 = 0;
    for (; rb <= 0x7fffffff / 8 && r0 + 8 <= nr; r0 += 8)
        for (int t0 = 0; t0 < nx; t0 += 4) {
            const uint8_t *wr = w + (size_t)r0 * rb;
            float *o = out + (size_t)r0 * nx + t0;
            switch (nx - t0) {
            case 1: k256_q6k_tile8(wr, rb, idx, xq + t0, 1, nblk, o, nx); break;
            case 2: k256_q6k_tile8(wr, rb, idx, xq + t0, 2, nblk, o, nx); break;
            case 3: k256_q6k_tile8(wr, rb, idx, xq + t0, 3, nblk, o, nx); break;
            default: k256_q6k_tile8(wr, rb, idx, xq + t0, 4, nblk, o, nx); break;
            }
        }
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q6_K);
    for (; r0 < nr; r0++)
        for (int t0 = 0; t0 < nx; t0 += QUANT_DOTN_MAX)
            fn(w + (size_t)r0 * rb, xq + t0, nx - t0 < QUANT_DOTN_MAX ? nx - t0 : QUANT_DOTN_MAX,
               nblk, out + (size_t)r0 * nx + t0);
}

/* Q6_K decode: as the tile with one token, its eight results stored at once (measured faster
 * than the tile with T = 1) */
K256 static void vrows_q6_k_k256(const uint8_t *w, size_t rb, int nr, const void *xq, size_t nblk,
                                 float *out)
{
    __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                     _mm256_set1_epi32((int)(rb <= 0x7fffffff / 8 ? rb : 0)));
    int r0 = 0;
    for (; rb <= 0x7fffffff / 8 && r0 + 8 <= nr; r0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        const uint8_t *w0 = w + (size_t)r0 * rb;
        int pf = rb == 210 * nblk && r0 + 8 * (K256_PF + 1) <= nr;
        for (size_t k = 0; k < nblk; k++) {
            const uint8_t *b0 = w0 + k * 210;
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq + k;
            if (pf)
                k256_prefetch(w0, rb, 210, k);
            __m256i S[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                k256_q6k_row(b0 + (size_t)r * rb, &xq, k, 1, &S[r]);
            __m256i dh = _mm256_srli_epi32(k256_rows8(b0, idx, 206), 16);
            __m256 d = _mm256_cvtph_ps(
                _mm_packus_epi32(_mm256_castsi256_si128(dh), _mm256_extracti128_si256(dh, 1)));
            __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(k256_reduce8(S)));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(a->d), v));
        }
        _mm256_storeu_ps(out + r0, acc);
    }
    vdot_row_fn fn = quant_avx2_vdot_for(GGUF_T_Q6_K);
    for (; r0 < nr; r0++)
        fn(w + (size_t)r0 * rb, &xq, 1, nblk, out + r0);
}

vtile_fn quant_k256_vtile_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q4_K: return vtile_q4_k_k256;
    case GGUF_T_Q6_K: return vtile_q6_k_k256;
    default: return quant_q256_vtile_for(type);
    }
}

vrows_fn quant_k256_vrows_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q4_K: return vrows_q4_k_k256;
    case GGUF_T_Q6_K: return vrows_q6_k_k256;
    default: return quant_q256_vrows_for(type);
    }
}

vrows_fn quant_k256_lanes_vrows_for(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q4_K: return vrows_q4_k_k256;
    case GGUF_T_Q6_K: return vrows_q6_k_k256;
    default: return quant_q256_lanes_vrows_for(type);
    }
}
#endif

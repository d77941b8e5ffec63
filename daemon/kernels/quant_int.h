/* quant_int: what quant's files share inside the module (quant.h is its one interface); not for other modules. */
#ifndef QUANT_INT_H
#define QUANT_INT_H

/* The files, each calling only those below it (make check's file-cycles):
 *   quant.c         the run-time ISA choice (cpuid) and the entry points that dispatch
 *   quant_avx512.c  the AVX-512 kernels (its Q8_0 exact path: quant_avx2_tile)
 *   quant_k512.c    the AVX-512 VNNI tiles of 16 interleaved rows (Q4_K, Q6_K prefill)
 *   quant_k256.c    the AVX2 K-quant tiles (Q4_K: 8 interleaved rows; Q6_K: 8 rows) and
 *                   decode kernels (Q4_K, Q6_K: 8 rows)
 *   quant_q256.c    the AVX2 Q8_0 prefill tile and decode kernel
 *   quant_avx2.c    the AVX2 and AVX-VNNI kernels, F16 rows, activation quantizers
 *   quant_fmt.c     F16/BF16 scalars, the block formats and their table, the quantizers,
 *                   the portable reference kernels */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/wtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QUANT_HAVE_X86 1
#else
#define QUANT_HAVE_X86 0
#endif

/* ------------------------------------------------------------------ shared helpers */

/* the 16 levels of IQ4_NL and IQ4_XS (a non-uniform 4-bit grid) */
static const int8_t iq4_grid[16] = QUANT_IQ4_GRID;

static inline uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline float f16_round(float v)
{
    return quant_f16_to_f32(quant_f32_to_f16(v));
}

/* element i of an F32, F16 or BF16 row */
static inline float w_at(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16: return quant_f16_to_f32(((const uint16_t *)w)[i]);
    case GGUF_T_BF16: return quant_bf16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* Q4_K's 12-byte scale field (see quant_fmt.c's k4_scales_get) as 8 scale
 * and 8 min bytes, four at a time */
static inline void k4_scales_bytes(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a = rd_u32(s), b = rd_u32(s + 4), c = rd_u32(s + 8);
    uint32_t v[4] = {a & 0x3f3f3f3fu, b & 0x3f3f3f3fu,
                     (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4,
                     ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4};
    memcpy(sc, &v[0], 4);
    memcpy(mn, &v[1], 4);
    memcpy(sc + 4, &v[2], 4);
    memcpy(mn + 4, &v[3], 4);
}

/* ------------------------------------------------------------------ integer dots
 * Per block: integer sums per sub-block (|sum| < 2^31: at most 256 products
 * of |q| <= 127 by |a| <= 127, times |sc| <= 128), one float expression. */

/* The float side of one block's dot, shared by every kernel so that the
 * SIMD ones equal the portable one bit for bit: 32-blocks with d, min
 * factor dm and integer min mn; 256-blocks with integer sums sq (values x
 * scales) and sm (activation sums x mins). */
static inline float q8_term(float d, float dm, int mn, int32_t s, const quant_act_q8_t *a)
{
    return (d * a->d) * (float)s - (dm * (float)mn) * a->s;
}

static inline float k_term(float d, float dm, int32_t sq, int32_t sm, const quant_act_q8k_t *a)
{
    return a->d * (d * (float)sq - dm * (float)sm);
}

/* a row of nblk weight blocks against nx (<= QUANT_DOTN_MAX) activation
 * rows of the type's format, out[t]; each result independent of nx */
typedef void (*vdot_row_fn)(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                            float *out);

/* nr weight rows (rb bytes apart) against nx activation rows, out[r * nx +
 * t]: a prefill register tile, each result identical to the type's
 * vdot_row_fn on that row and token alone */
typedef void (*vtile_fn)(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                         size_t nblk, float *out);

/* nr weight rows (rb bytes apart) against one activation row, out[r]: a decode kernel, each
 * result identical to the type's vdot_row_fn and vtile_fn */
typedef void (*vrows_fn)(const uint8_t *w, size_t rb, int nr, const void *xq, size_t nblk,
                         float *out);

/* ------------------------------------------------------------------ quant_fmt.c */

/* One block type's row of the table (opaque outside quant_fmt.c). */
typedef struct qfmt qfmt_t;

/* The table's row of a block type; NULL for F32, F16, BF16 and unsupported types. */
const qfmt_t *quant_fmt_of(uint32_t type);
/* block size (elements) and bytes of a type (gguf's table) */
void quant_fmt_traits(uint32_t type, size_t *blck, size_t *bytes);
/* quant_row_from_f32 and quant_row_to_f32 with scalar F16 conversions */
void quant_fmt_row_from_f32(uint32_t type, const float *x, void *dst, size_t n);
void quant_fmt_row_to_f32(uint32_t type, const void *src, float *dst, size_t n);
/* the portable activation quantizers: nb blocks of 32 (Q8) or 256 (Q8K) values */
void quant_fmt_act_q8(const float *x, quant_act_q8_t *a, size_t nb);
void quant_fmt_act_q8k(const float *x, quant_act_q8k_t *a, size_t nb);
/* the portable integer dot of one row of nblk blocks (bb bytes each) */
float quant_fmt_vdot_row(const qfmt_t *f, const uint8_t *w, size_t bb, const void *xq, size_t nblk);
/* the exact dot tile of a block type: F32 activations against exactly dequantized blocks */
void quant_fmt_tile_exact(const qfmt_t *f, const void *w, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out);
/* the portable kernels of F32, F16, BF16 and Q8_0 (the kernels table's slots) */
void quant_fmt_tile(uint32_t type, const void *w, size_t rb, int nr, const float *const *x, int nx,
                    size_t n, float *out);
float quant_fmt_dot_f32(const float *a, const float *b, size_t n);
void quant_fmt_axpy(float *y, float a, const float *x, size_t n);

#if QUANT_HAVE_X86
/* ------------------------------------------------------------------ x86 helpers */
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE float hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

/* an F16 factor of a block, by F16C (the same value as quant_fmt.c's rd_f16) */
AVX2_INLINE float rd_f16c(const uint8_t *p)
{
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

AVX2_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
    return _mm_cvtsi128_si32(x);
}

/* ------------------------------------------------------------------ quant_avx2.c */

/* the AVX2 kernels table's slots (F32, F16, BF16, Q8_0 tiles; attention's dot; axpy) */
AVX2 void quant_avx2_tile(uint32_t type, const void *w, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out);
AVX2 float quant_avx2_dot_f32(const float *a, const float *b, size_t n);
AVX2 void quant_avx2_axpy(float *y, float a, const float *x, size_t n);
/* the integer dot of a block type (NULL: none) on AVX2, and with AVX-VNNI */
vdot_row_fn quant_avx2_vdot_for(uint32_t type);
vdot_row_fn quant_vnni_vdot_for(uint32_t type);
/* the AVX-VNNI prefill tile of a block type (NULL: none) */
vtile_fn quant_vnni_vtile_for(uint32_t type);
/* F16 rows by F16C (the same values as the scalar conversions; only a NaN's payload may differ) */
AVX2 void quant_avx2_f16_to_f32_row(const uint16_t *s, float *d, size_t n);
AVX2 void quant_avx2_f32_to_f16_row(const float *s, uint16_t *d, size_t n);
/* the activation quantizers (the same values as quant_fmt_act_q8 and _q8k) */
AVX2 void quant_avx2_act_q8(const float *x, quant_act_q8_t *a, size_t nb);
AVX2 void quant_avx2_act_q8k(const float *x, quant_act_q8k_t *a, size_t nb);
/* quant_axpy_f16 and quant_axpy_f16_rows */
AVX2 void quant_avx2_axpy_f16(float *y, float a, const uint16_t *x, size_t n);
AVX2 void quant_avx2_axpy_f16_rows(float *y, const float *a, const uint16_t *x, size_t x_stride,
                                   size_t nrows, size_t n);
/* quant_exp_shift */
AVX2 float quant_avx2_exp_shift(float *x, size_t n, float mx);
/* quant_axpy_f16_rows_n */
AVX2 void quant_avx2_axpy_f16_rows_n(float *const *y, const float *const *a, int ny,
                                     const uint16_t *x, size_t x_stride, size_t nrows, size_t n);

/* ------------------------------------------------------------------ quant_k256.c */

/* the AVX2 prefill tiles, for the AVX2 and AVX-VNNI tables (NULL: none): 8 interleaved rows
 * (Q4_K), 8 rows x 4 tokens (Q6_K), bit for bit the portable dot; else quant_q256_vtile_for's */
vtile_fn quant_k256_vtile_for(uint32_t type);
/* the AVX2 decode kernels of 8 rows at a time, nothing repacked, for the AVX2 table (NULL:
 * none): Q4_K, Q6_K bit for bit the portable dot; else quant_q256_vrows_for's */
vrows_fn quant_k256_vrows_for(uint32_t type);
/* the same for the AVX-VNNI table, but Q8_0: quant_q256_lanes_vrows_for's */
vrows_fn quant_k256_lanes_vrows_for(uint32_t type);

/* ------------------------------------------------------------------ quant_q256.c */

/* the AVX2 table's prefill tile (Q8_0: 8 rows x 4 tokens; NULL: none) and decode kernel (Q8_0:
 * 8 rows at a time; NULL: none): each result the AVX2 row dot's, the portable dot's bit for bit */
vtile_fn quant_q256_vtile_for(uint32_t type);
vrows_fn quant_q256_vrows_for(uint32_t type);
/* the AVX-VNNI table's decode kernel (Q8_0: 8 rows at a time, in float lanes; NULL: none):
 * each result the AVX-VNNI row dot's */
vrows_fn quant_q256_lanes_vrows_for(uint32_t type);

/* ------------------------------------------------------------------ quant_avx512.c */

/* the AVX-512 float tile (Q8_0: quant_avx2_tile) */
void quant_avx512_tile(uint32_t type, const void *w, size_t rb, int nr, const float *const *x,
                       int nx, size_t n, float *out);
/* the 512-bit integer dot (Q8_0, Q4_K, Q6_K) and prefill tile (Q8_0; Q4_K and Q6_K by
 * quant_k512.c) of a type; NULL: none */
vdot_row_fn quant_avx512_vdot_for(uint32_t type);
vtile_fn quant_avx512_vtile_for(uint32_t type);
/* the AVX-512 decode kernel of 16 rows at a time (Q4_K, Q6_K); NULL: none */
vrows_fn quant_avx512_vrows_for(uint32_t type);

/* ------------------------------------------------------------------ quant_k512.c */

/* the AVX-512 VNNI prefill tile of 16 interleaved rows (Q4_K, Q6_K; NULL: none), bit for bit
 * the portable dot */
vtile_fn quant_k512_vtile_for(uint32_t type);
#endif

#endif

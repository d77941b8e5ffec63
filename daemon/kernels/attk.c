/* attk: attention's inner loops over an F16 KV cache, portable, AVX2 and AVX-512 (picked by quant's ISA). */
#include "kernels/attk.h"

#include <math.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/wtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTK_X86 1
#else
#define ATTK_X86 0
#endif

/* K rows ahead the scores prefetch (the rows a position apart are past what the hardware
 * prefetchers follow: 18 KB in the 134M shape) */
#define ATTK_PF 12
/* K rows a block of the AVX-512 scores: one 16-lane vector of results */
#define ATTK_ROWS 16

size_t attk_scratch_floats(size_t hd)
{
    return (size_t)ATTK_ROWS * ((hd + 15) / 16 * 16);
}

/* ------------------------------------------------------------------ portable
 * The F16 tile of quant (four rows by up to four queries, each result its single dot's) and
 * quant's row sums (AVX2 takes those for the value sums too). */

static void scores_tile(const float *const *qs, int nq, const uint16_t *k, size_t ks, uint32_t lo,
                        uint32_t hi, size_t hd, float *sc, size_t cap)
{
    for (uint32_t p = lo; p <= hi; p += 4) {
        int nr = hi + 1 - p < 4 ? (int)(hi + 1 - p) : 4;
        const uint16_t *kr = k + (size_t)(p - lo) * ks;
        for (int r = 0; r < 4 && p + ATTK_PF + (uint32_t)r <= hi; r++)
            for (size_t b = 0; b < hd * 2; b += 64)
                __builtin_prefetch((const char *)(kr + (ATTK_PF + (size_t)r) * ks) + b);
        for (int j0 = 0; j0 < nq; j0 += 4) {
            int nx = nq - j0 < 4 ? nq - j0 : 4;
            float t[16];
            quant_dot_tile(GGUF_T_F16, kr, ks * 2, nr, qs + j0, nx, hd, t);
            for (int r = 0; r < nr; r++)
                for (int j = 0; j < nx; j++)
                    sc[(size_t)(j0 + j) * cap + p + r] = t[r * nx + j];
        }
    }
}

#if ATTK_X86
/* ------------------------------------------------------------------ AVX-512 */
#define ATTK_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
#define ATTK_AVX512 __attribute__((target(ATTK_TARGET)))
#define ATTK_INLINE static inline __attribute__((always_inline, target(ATTK_TARGET)))

/* The lane mask of the elements d .. d + 15 below n. */
ATTK_INLINE __mmask16 lanes(size_t d, size_t n)
{
    return d >= n ? 0 : n - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1);
}

/* Sixteen vectors to one: lane i the sum of a[i]'s lanes, by one tree whatever i (within each
 * 128-bit quarter (x0 + x2) + (x1 + x3), then quarters (q0 + q1) + (q2 + q3)). */
ATTK_INLINE __m512 sum16(const __m512 *a)
{
    __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                         _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
}

/* One query against nr (<= 16) rows of floats in kf, chunk-major (dims d .. d + 15 of row r at
 * kf + d * 16 + r * 16, zero past hd): 16 lanes of scores. */
ATTK_INLINE __m512 scores_block(const float *q, const float *kf, size_t hd, int nr)
{
    __m512 acc[ATTK_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < ATTK_ROWS; r++)
        acc[r] = _mm512_setzero_ps();
    for (size_t d = 0; d < hd; d += 16) {
        __m512 qv = _mm512_maskz_loadu_ps(lanes(d, hd), q + d);
        const float *c = kf + d * ATTK_ROWS;
#pragma GCC unroll 16
        for (int r = 0; r < nr; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(c + r * 16), qv, acc[r]);
    }
    return sum16(acc);
}

/* Blocks of 16 rows: each converted to floats once (into scratch) for all the queries, each
 * query's 16 dots summed by one tree. A row past the block's end has no accumulator. */
ATTK_AVX512 static void scores_avx512(const float *const *q, int nq, const uint16_t *k, size_t ks,
                                      uint32_t lo, uint32_t hi, size_t hd, float *sc, size_t cap,
                                      float *kf)
{
    size_t hdp = (hd + 15) / 16 * 16;
    for (uint32_t p = lo; p <= hi; p += ATTK_ROWS) {
        int nr = hi + 1 - p < ATTK_ROWS ? (int)(hi + 1 - p) : ATTK_ROWS;
        const uint16_t *kr = k + (size_t)(p - lo) * ks;
        for (int r = 0; r < nr; r++) {
            const uint16_t *row = kr + (size_t)r * ks;
            if (p + ATTK_ROWS + (uint32_t)r <= hi)
                for (size_t b = 0; b < hd * 2; b += 64)
                    _mm_prefetch((const char *)(row + ATTK_ROWS * ks) + b, _MM_HINT_T0);
            for (size_t d = 0; d < hdp; d += 16)
                _mm512_storeu_ps(kf + d * ATTK_ROWS + (size_t)r * 16,
                                 _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(d, hd), row + d)));
        }
        __mmask16 m = (__mmask16)(nr == 16 ? 0xffff : (1u << nr) - 1);
        for (int j = 0; j < nq; j++) {
            __m512 s;
            switch (nr) { /* full blocks unrolled; the last one as it comes */
            case ATTK_ROWS: s = scores_block(q[j], kf, hd, ATTK_ROWS); break;
            default: s = scores_block(q[j], kf, hd, nr); break;
            }
            _mm512_mask_storeu_ps(sc + (size_t)j * cap + p, m, s);
        }
    }
}

/* ny (<= 4) outputs over the 64 columns from col: the accumulators in registers across the rows,
 * each row's halves converted once for them all (columns past hd masked off). */
ATTK_INLINE void values_group(float *const *o, const float *const *w, int ny, const uint16_t *v,
                              size_t vs, size_t nrows, size_t hd, size_t col)
{
    __m512 acc[4][4], vx[4];
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        mk[c] = lanes(col + 16 * (size_t)c, hd);
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[j][c] = _mm512_maskz_loadu_ps(mk[c], o[j] + col + 16 * c);
    const uint16_t *x = v + col;
    for (size_t p = 0; p < nrows; p++, x += vs) {
        /* the row 8 ahead, both cache lines of its 64 halves */
        _mm_prefetch((const char *)(x + 8 * vs), _MM_HINT_T0);
        _mm_prefetch((const char *)(x + 8 * vs) + 64, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            vx[c] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[c], x + 16 * c));
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) {
            __m512 a = _mm512_set1_ps(w[j][p]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[j][c] = _mm512_fmadd_ps(a, vx[c], acc[j][c]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_mask_storeu_ps(o[j] + col + 16 * c, mk[c], acc[j][c]);
}

/* Columns 64 at a time (the last chunk masked), outputs four at a time. */
ATTK_AVX512 static void values_avx512(float *const *o, const float *const *w, int ny,
                                      const uint16_t *v, size_t vs, size_t nrows, size_t hd)
{
    for (int j0 = 0; j0 < ny; j0 += 4)
        for (size_t col = 0; col < hd; col += 64)
            switch (ny - j0) { /* the group's size a constant, so its loops unroll */
            case 1: values_group(o + j0, w + j0, 1, v, vs, nrows, hd, col); break;
            case 2: values_group(o + j0, w + j0, 2, v, vs, nrows, hd, col); break;
            case 3: values_group(o + j0, w + j0, 3, v, vs, nrows, hd, col); break;
            default: values_group(o + j0, w + j0, 4, v, vs, nrows, hd, col); break;
            }
}

ATTK_AVX512 static float scale_max_avx512(float *s, size_t n, float scale)
{
    __m512 sv = _mm512_set1_ps(scale), mx = _mm512_set1_ps(-INFINITY);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(i, n);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + i), sv);
        _mm512_mask_storeu_ps(s + i, m, x);
        mx = _mm512_mask_max_ps(mx, m, mx, x);
    }
    return _mm512_reduce_max_ps(mx);
}

ATTK_AVX512 static void mul_round_avx512(float *s, size_t n, float inv)
{
    __m512 iv = _mm512_set1_ps(inv);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(i, n);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + i), iv);
        __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_mask_storeu_ps(s + i, m, _mm512_cvtph_ps(h));
    }
}
#endif
#if ATTK_X86
/* ------------------------------------------------------------------ AVX2
 * The same scheme eight lanes wide: blocks of 8 K rows converted once for all the queries, each
 * query's 8 dots summed by one tree ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). The value
 * sums stay quant's (four outputs x 16 columns). */
#define ATTK2_TARGET "avx2,fma,f16c"
#define ATTK_AVX2 __attribute__((target(ATTK2_TARGET)))
#define ATTK2_INLINE static inline __attribute__((always_inline, target(ATTK2_TARGET)))
#define ATTK2_ROWS 8

/* Eight halves from row + d as floats, zero past n. */
ATTK2_INLINE __m256 load8_f16(const uint16_t *row, size_t d, size_t n)
{
    if (n - d >= 8)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + d)));
    uint16_t t[8] = {0};
    memcpy(t, row + d, (n - d) * sizeof *t);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

/* Eight floats from x + d, zero past n. */
ATTK2_INLINE __m256 load8_f32(const float *x, size_t d, size_t n)
{
    if (n - d >= 8)
        return _mm256_loadu_ps(x + d);
    float t[8] = {0};
    memcpy(t, x + d, (n - d) * sizeof *t);
    return _mm256_loadu_ps(t);
}

ATTK2_INLINE __m256 sum8(const __m256 *a)
{
    __m256 h0 = _mm256_hadd_ps(a[0], a[1]), h1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h2 = _mm256_hadd_ps(a[4], a[5]), h3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20),
                         _mm256_permute2f128_ps(g0, g1, 0x31));
}

ATTK2_INLINE __m256 scores_block8(const float *q, const float *kf, size_t hd, int nr)
{
    __m256 acc[ATTK2_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < ATTK2_ROWS; r++)
        acc[r] = _mm256_setzero_ps();
    for (size_t d = 0; d < hd; d += 8) {
        __m256 qv = load8_f32(q, d, hd);
        const float *c = kf + d * ATTK2_ROWS;
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(c + r * 8), qv, acc[r]);
    }
    return sum8(acc);
}

ATTK_AVX2 static void scores_avx2(const float *const *q, int nq, const uint16_t *k, size_t ks,
                                  uint32_t lo, uint32_t hi, size_t hd, float *sc, size_t cap,
                                  float *kf)
{
    size_t hdp = (hd + 7) / 8 * 8;
    for (uint32_t p = lo; p <= hi; p += ATTK2_ROWS) {
        int nr = hi + 1 - p < ATTK2_ROWS ? (int)(hi + 1 - p) : ATTK2_ROWS;
        const uint16_t *kr = k + (size_t)(p - lo) * ks;
        for (int r = 0; r < nr; r++) {
            const uint16_t *row = kr + (size_t)r * ks;
            if (p + 2 * ATTK2_ROWS + (uint32_t)r <= hi)
                for (size_t b = 0; b < hd * 2; b += 64)
                    _mm_prefetch((const char *)(row + 2 * ATTK2_ROWS * ks) + b, _MM_HINT_T0);
            for (size_t d = 0; d < hdp; d += 8)
                _mm256_storeu_ps(kf + d * ATTK2_ROWS + (size_t)r * 8, load8_f16(row, d, hd));
        }
        for (int j = 0; j < nq; j++) {
            float t[ATTK2_ROWS];
            __m256 s = nr == ATTK2_ROWS ? scores_block8(q[j], kf, hd, ATTK2_ROWS)
                                        : scores_block8(q[j], kf, hd, nr);
            if (nr == ATTK2_ROWS) {
                _mm256_storeu_ps(sc + (size_t)j * cap + p, s);
                continue;
            }
            _mm256_storeu_ps(t, s);
            memcpy(sc + (size_t)j * cap + p, t, (size_t)nr * sizeof *t);
        }
    }
}

ATTK_AVX2 static float scale_max_avx2(float *s, size_t n, float scale)
{
    __m256 sv = _mm256_set1_ps(scale), mx = _mm256_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + i), sv);
        _mm256_storeu_ps(s + i, x);
        mx = _mm256_max_ps(mx, x);
    }
    float m[8], r = -INFINITY;
    _mm256_storeu_ps(m, mx);
    for (int j = 0; j < 8; j++)
        r = m[j] > r ? m[j] : r;
    for (; i < n; i++) {
        s[i] *= scale;
        r = s[i] > r ? s[i] : r;
    }
    return r;
}

ATTK_AVX2 static void mul_round_avx2(float *s, size_t n, float inv)
{
    __m256 iv = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + i), iv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(s + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++)
        s[i] = quant_f16_to_f32(quant_f32_to_f16(s[i] * inv));
}
#endif

/* ------------------------------------------------------------------ entry points */

#if ATTK_X86
static int use_avx512(void)
{
    return quant_isa_get() == QUANT_ISA_AVX512;
}

static int use_avx2(void)
{
    quant_isa_t i = quant_isa_get();
    return i == QUANT_ISA_AVX2 || i == QUANT_ISA_AVX2_VNNI;
}
#endif

void attk_scores_f16(const float *const *q, int nq, const uint16_t *k, size_t k_stride, uint32_t lo,
                     uint32_t hi, size_t hd, float *sc, size_t cap, float *scratch)
{
    if (lo > hi)
        return;
#if ATTK_X86
    if (use_avx512()) {
        scores_avx512(q, nq, k, k_stride, lo, hi, hd, sc, cap, scratch);
        return;
    }
    if (use_avx2()) {
        scores_avx2(q, nq, k, k_stride, lo, hi, hd, sc, cap, scratch);
        return;
    }
#endif
    (void)scratch;
    scores_tile(q, nq, k, k_stride, lo, hi, hd, sc, cap);
}

void attk_values_f16(float *const *o, const float *const *w, int ny, const uint16_t *v,
                     size_t v_stride, size_t nrows, size_t hd)
{
    if (!nrows)
        return;
#if ATTK_X86
    if (use_avx512()) {
        values_avx512(o, w, ny, v, v_stride, nrows, hd);
        return;
    }
#endif
    if (ny == 1)
        quant_axpy_f16_rows(o[0], w[0], v, v_stride, nrows, hd);
    else
        quant_axpy_f16_rows_n(o, w, ny, v, v_stride, nrows, hd);
}

float attk_scale_max(float *s, size_t n, float scale)
{
#if ATTK_X86
    if (use_avx512())
        return scale_max_avx512(s, n, scale);
    if (use_avx2())
        return scale_max_avx2(s, n, scale);
#endif
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        s[i] *= scale;
        if (s[i] > mx)
            mx = s[i];
    }
    return mx;
}

void attk_mul_round_f16(float *s, size_t n, float inv)
{
#if ATTK_X86
    if (use_avx512()) {
        mul_round_avx512(s, n, inv);
        return;
    }
    if (use_avx2()) {
        mul_round_avx2(s, n, inv);
        return;
    }
#endif
    uint16_t hw[64];
    for (size_t p = 0; p < n; p += 64) {
        size_t m = n - p < 64 ? n - p : 64;
        for (size_t i = 0; i < m; i++)
            s[p + i] *= inv;
        quant_row_from_f32(GGUF_T_F16, s + p, hw, m);
        quant_row_to_f32(GGUF_T_F16, hw, s + p, m);
    }
}

/* quant: weight-type conversions (F16, BF16, Q8_0) and the SIMD dot/row kernels. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define QUANT_HAVE_X86 1
#else
#define QUANT_HAVE_X86 0
#endif

/* ------------------------------------------------------------------ scalars */

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t f;
    if (exp == 0) {
        if (man == 0) {
            f = sign;
        } else {
            /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            f = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        f = sign | 0x7f800000u | (man << 13);
    } else {
        f = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float r;
    memcpy(&r, &f, 4);
    return r;
}

uint16_t quant_f32_to_f16(float fv)
{
    uint32_t x;
    memcpy(&x, &fv, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: half subnormal or zero */
        uint32_t exp = a >> 23;
        if (exp < 102)
            return sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp;
        uint32_t m = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = (a >> 13) - ((127u - 15u) << 10);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t f = (uint32_t)h << 16;
    float r;
    memcpy(&r, &f, 4);
    return r;
}

uint16_t quant_f32_to_bf16(float fv)
{
    uint32_t x;
    memcpy(&x, &fv, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

int quant_type_supported(uint32_t type)
{
    return type == GGUF_T_F32 || type == GGUF_T_F16 || type == GGUF_T_BF16 || type == GGUF_T_Q8_0;
}

size_t quant_row_bytes(uint32_t type, size_t n)
{
    switch (type) {
    case GGUF_T_F32: return n * 4;
    case GGUF_T_F16: case GGUF_T_BF16: return n * 2;
    case GGUF_T_Q8_0:
        if (n % QUANT_Q8_0_BLOCK)
            return 0;
        return n / QUANT_Q8_0_BLOCK * sizeof(quant_block_q8_0_t);
    default: return 0;
    }
}

void quant_row_from_f32(uint32_t type, const float *x, void *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, x, n * 4); break;
    case GGUF_T_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = quant_f32_to_f16(x[i]);
        break;
    }
    case GGUF_T_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = quant_f32_to_bf16(x[i]);
        break;
    }
    case GGUF_T_Q8_0: {
        quant_block_q8_0_t *b = dst;
        for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
            const float *xb = x + k * QUANT_Q8_0_BLOCK;
            float amax = 0.0f;
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[k].d = quant_f32_to_f16(d);
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                b[k].qs[j] = (int8_t)roundf(xb[j] * id);
        }
        break;
    }
    default: break;
    }
}

void quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, src, n * 4); break;
    case GGUF_T_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = quant_f16_to_f32(s[i]);
        break;
    }
    case GGUF_T_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = quant_bf16_to_f32(s[i]);
        break;
    }
    case GGUF_T_Q8_0: {
        const quant_block_q8_0_t *b = src;
        for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
            float d = quant_f16_to_f32(b[k].d);
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                dst[k * QUANT_Q8_0_BLOCK + j] = d * (float)b[k].qs[j];
        }
        break;
    }
    default: break;
    }
}

/* ------------------------------------------------------------------ portable kernels
 * Every kernel computes each (row, vector) pair with its own accumulator
 * chain in the same order, whatever the tile size, so out[r][t] does not
 * depend on how many rows or vectors share the call. */

static inline float w_at(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16: return quant_f16_to_f32(((const uint16_t *)w)[i]);
    case GGUF_T_BF16: return quant_bf16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* one pair: 8 lanes over 8-element chunks, reduced pairwise, then the tail */
static float pair_plain(uint32_t type, const void *w, const float *x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += w_at(type, w, i + l) * x[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += w_at(type, w, i) * x[i];
    return s;
}

static float pair_q8_0_plain(const void *w, const float *x, size_t n)
{
    const quant_block_q8_0_t *b = w;
    float acc = 0.0f;
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
        const float *xb = x + k * QUANT_Q8_0_BLOCK;
        float s = 0.0f;
        for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
            s += (float)b[k].qs[j] * xb[j];
        acc += s * quant_f16_to_f32(b[k].d);
    }
    return acc;
}

static void tile_portable(uint32_t type, const void *w, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out)
{
    for (int r = 0; r < nr; r++) {
        const void *row = (const uint8_t *)w + (size_t)r * rb;
        for (int t = 0; t < nx; t++)
            out[r * nx + t] = type == GGUF_T_Q8_0 ? pair_q8_0_plain(row, x[t], n)
                                                  : pair_plain(type, row, x[t], n);
    }
}

static float dot_f32_portable(const float *a, const float *b, size_t n)
{
    return pair_plain(GGUF_T_F32, a, b, n);
}

static void axpy_portable(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* ------------------------------------------------------------------ AVX2 kernels */
#if QUANT_HAVE_X86
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

AVX2_INLINE __m256 load8(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    case GGUF_T_BF16: {
        __m256i v = _mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    default:
        return _mm256_loadu_ps((const float *)w + i);
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

AVX2 static void tile_avx2(uint32_t type, const void *wv, size_t rb, int nr, const float *const *x,
                           int nx, size_t n, float *out)
{
    const uint8_t *w = wv;
    if (type == GGUF_T_Q8_0) {
#define Q8T(R, X) tile_q8_0_avx2_body(w, rb, R, x, X, n, out)
#define Q8T_ONE(r, t, xs) tile_q8_0_avx2_body(w + (size_t)(r) * rb, rb, 1, xs, 1, n, &out[(r) * nx + (t)])
        TILE_SHAPES(Q8T)
#undef Q8T
#undef Q8T_ONE
        return;
    }
    switch (type) {
    case GGUF_T_F16: {
#define F16T(R, X) tile_avx2_body(GGUF_T_F16, w, rb, R, x, X, n, out)
#define F16T_ONE(r, t, xs) tile_avx2_body(GGUF_T_F16, w + (size_t)(r) * rb, rb, 1, xs, 1, n, &out[(r) * nx + (t)])
        TILE_SHAPES(F16T)
#undef F16T
#undef F16T_ONE
        break;
    }
    case GGUF_T_BF16: {
#define BF16T(R, X) tile_avx2_body(GGUF_T_BF16, w, rb, R, x, X, n, out)
#define BF16T_ONE(r, t, xs) tile_avx2_body(GGUF_T_BF16, w + (size_t)(r) * rb, rb, 1, xs, 1, n, &out[(r) * nx + (t)])
        TILE_SHAPES(BF16T)
#undef BF16T
#undef BF16T_ONE
        break;
    }
    default: {
#define F32T(R, X) tile_avx2_body(GGUF_T_F32, w, rb, R, x, X, n, out)
#define F32T_ONE(r, t, xs) tile_avx2_body(GGUF_T_F32, w + (size_t)(r) * rb, rb, 1, xs, 1, n, &out[(r) * nx + (t)])
        TILE_SHAPES(F32T)
#undef F32T
#undef F32T_ONE
        break;
    }
    }
}

AVX2 static float dot_f32_avx2(const float *a, const float *b, size_t n)
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

AVX2 static void axpy_avx2(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}
#endif

/* ------------------------------------------------------------------ dispatch */

typedef struct kernels {
    void (*tile)(uint32_t, const void *, size_t, int, const float *const *, int, size_t, float *);
    float (*dot_f32)(const float *, const float *, size_t);
    void (*axpy)(float *, float, const float *, size_t);
} kernels_t;

static const kernels_t k_portable = {tile_portable, dot_f32_portable, axpy_portable};
#if QUANT_HAVE_X86
static const kernels_t k_avx2 = {tile_avx2, dot_f32_avx2, axpy_avx2};
#endif

static const kernels_t *k_cur;
static quant_isa_t isa_cur = QUANT_ISA_PORTABLE;

static int cpu_has_avx2(void)
{
#if QUANT_HAVE_X86
    /* f16c through cpuid: clang's __builtin_cpu_supports does not know it */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return 0;
#endif
}

quant_isa_t quant_isa_set(quant_isa_t want)
{
    if (want != QUANT_ISA_PORTABLE && cpu_has_avx2()) {
#if QUANT_HAVE_X86
        k_cur = &k_avx2;
        isa_cur = QUANT_ISA_AVX2;
        return isa_cur;
#endif
    }
    k_cur = &k_portable;
    isa_cur = QUANT_ISA_PORTABLE;
    return isa_cur;
}

static inline const kernels_t *kern(void)
{
    if (!k_cur)
        quant_isa_set(QUANT_ISA_AUTO);
    return k_cur;
}

quant_isa_t quant_isa_get(void)
{
    kern();
    return isa_cur;
}

const char *quant_isa_name(quant_isa_t isa)
{
    switch (isa) {
    case QUANT_ISA_AVX2: return "avx2";
    case QUANT_ISA_PORTABLE: return "portable";
    default: return "auto";
    }
}

void quant_dot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const float *const *x,
                    int nx, size_t n, float *out)
{
    kern()->tile(type, w, row_bytes, nr, x, nx, n, out);
}

void quant_dotn(uint32_t type, const void *w, const float *const *x, int nx, size_t n, float *out)
{
    kern()->tile(type, w, 0, 1, x, nx, n, out);
}

float quant_dot(uint32_t type, const void *w, const float *x, size_t n)
{
    float r;
    kern()->tile(type, w, 0, 1, &x, 1, n, &r);
    return r;
}

float quant_dot_f32(const float *a, const float *b, size_t n)
{
    return kern()->dot_f32(a, b, n);
}

void quant_axpy_f32(float *y, float a, const float *x, size_t n)
{
    kern()->axpy(y, a, x, n);
}

/* quant: weight-type conversions (F16, BF16, Q8_0) and the SIMD dot/row kernels. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"

#if defined(__x86_64__) || defined(__i386__)
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
 * Each dotn keeps per-vector state independent of nx, so out[j] does not
 * depend on how many vectors share the call. */

static inline float w_at(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16: return quant_f16_to_f32(((const uint16_t *)w)[i]);
    case GGUF_T_BF16: return quant_bf16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

static void dotn_plain(uint32_t type, const void *w, const float *const *x, int nx, size_t n,
                       float *out)
{
    float acc[QUANT_DOTN_MAX][4] = {{0}};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float wv[4];
        for (int l = 0; l < 4; l++)
            wv[l] = w_at(type, w, i + l);
        for (int t = 0; t < nx; t++)
            for (int l = 0; l < 4; l++)
                acc[t][l] += wv[l] * x[t][i + l];
    }
    for (int t = 0; t < nx; t++) {
        float s = (acc[t][0] + acc[t][1]) + (acc[t][2] + acc[t][3]);
        for (size_t j = i; j < n; j++)
            s += w_at(type, w, j) * x[t][j];
        out[t] = s;
    }
}

static void dotn_q8_0_plain(const void *w, const float *const *x, int nx, size_t n, float *out)
{
    const quant_block_q8_0_t *b = w;
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
        float d = quant_f16_to_f32(b[k].d);
        for (int t = 0; t < nx; t++) {
            const float *xb = x[t] + k * QUANT_Q8_0_BLOCK;
            float s = 0.0f;
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                s += (float)b[k].qs[j] * xb[j];
            acc[t] += s * d;
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

static void dotn_portable(uint32_t type, const void *w, const float *const *x, int nx, size_t n,
                          float *out)
{
    if (type == GGUF_T_Q8_0)
        dotn_q8_0_plain(w, x, nx, n, out);
    else
        dotn_plain(type, w, x, nx, n, out);
}

static float dot_f32_portable(const float *a, const float *b, size_t n)
{
    const float *xs[1] = {b};
    float r;
    dotn_plain(GGUF_T_F32, a, xs, 1, n, &r);
    return r;
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

/* Float-like rows: two accumulators per vector, 16 elements a step. */
AVX2_INLINE void dotn_avx2_body(uint32_t type, const void *w, const float *const *x, int nx,
                                size_t n, float *out)
{
    __m256 a0[QUANT_DOTN_MAX], a1[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        a0[t] = a1[t] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = load8(type, w, i);
        __m256 w1 = load8(type, w, i + 8);
        for (int t = 0; t < nx; t++) {
            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i + 8), a1[t]);
        }
    }
    for (int t = 0; t < nx; t++) {
        float s = hsum256(_mm256_add_ps(a0[t], a1[t]));
        for (size_t j = i; j < n; j++)
            s += w_at(type, w, j) * x[t][j];
        out[t] = s;
    }
}

AVX2_INLINE __m256 q8_load8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

AVX2_INLINE void dotn_q8_0_avx2_body(const void *w, const float *const *x, int nx, size_t n,
                                     float *out)
{
    const quant_block_q8_0_t *b = w;
    __m256 acc[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[k].d));
        __m256 q0 = q8_load8(b[k].qs), q1 = q8_load8(b[k].qs + 8);
        __m256 q2 = q8_load8(b[k].qs + 16), q3 = q8_load8(b[k].qs + 24);
        for (int t = 0; t < nx; t++) {
            const float *xb = x[t] + k * QUANT_Q8_0_BLOCK;
            __m256 s = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
            __m256 s2 = _mm256_mul_ps(q1, _mm256_loadu_ps(xb + 8));
            s = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), s);
            s2 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), s2);
            acc[t] = _mm256_fmadd_ps(_mm256_add_ps(s, s2), d, acc[t]);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = hsum256(acc[t]);
}

/* Specialise on nx so the per-vector loops unroll. */
#define DOTN_CASES(call)                                                                           \
    switch (nx) {                                                                                  \
    case 1: call(1); break;                                                                        \
    case 2: call(2); break;                                                                        \
    case 3: call(3); break;                                                                        \
    default: call(4); break;                                                                       \
    }

AVX2 static void dotn_avx2(uint32_t type, const void *w, const float *const *x, int nx, size_t n,
                           float *out)
{
    if (type == GGUF_T_Q8_0) {
#define Q8CALL(k) dotn_q8_0_avx2_body(w, x, k, n, out)
        DOTN_CASES(Q8CALL)
#undef Q8CALL
        return;
    }
    switch (type) {
    case GGUF_T_F16: {
#define F16CALL(k) dotn_avx2_body(GGUF_T_F16, w, x, k, n, out)
        DOTN_CASES(F16CALL)
#undef F16CALL
        break;
    }
    case GGUF_T_BF16: {
#define BF16CALL(k) dotn_avx2_body(GGUF_T_BF16, w, x, k, n, out)
        DOTN_CASES(BF16CALL)
#undef BF16CALL
        break;
    }
    default: {
#define F32CALL(k) dotn_avx2_body(GGUF_T_F32, w, x, k, n, out)
        DOTN_CASES(F32CALL)
#undef F32CALL
        break;
    }
    }
}

AVX2 static float dot_f32_avx2(const float *a, const float *b, size_t n)
{
    const float *xs[1] = {b};
    float r;
    dotn_avx2_body(GGUF_T_F32, a, xs, 1, n, &r);
    return r;
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
    void (*dotn)(uint32_t, const void *, const float *const *, int, size_t, float *);
    float (*dot_f32)(const float *, const float *, size_t);
    void (*axpy)(float *, float, const float *, size_t);
} kernels_t;

static const kernels_t k_portable = {dotn_portable, dot_f32_portable, axpy_portable};
#if QUANT_HAVE_X86
static const kernels_t k_avx2 = {dotn_avx2, dot_f32_avx2, axpy_avx2};
#endif

static const kernels_t *k_cur;
static quant_isa_t isa_cur = QUANT_ISA_PORTABLE;

static int cpu_has_avx2(void)
{
#if QUANT_HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
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

void quant_dotn(uint32_t type, const void *w, const float *const *x, int nx, size_t n, float *out)
{
    kern()->dotn(type, w, x, nx, n, out);
}

float quant_dot(uint32_t type, const void *w, const float *x, size_t n)
{
    float r;
    kern()->dotn(type, w, &x, 1, n, &r);
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

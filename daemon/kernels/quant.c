/* quant: weight formats (F32, F16, BF16, the legacy, K and IQ4 block quants), their conversions and the dot kernels: the run-time ISA choice and the entry points that dispatch (the formats and portable kernels in quant_fmt.c, the SIMD ones in quant_avx2.c and quant_avx512.c). */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "kernels/quant_int.h"
#include "kernels/wtype.h"

#if QUANT_HAVE_X86
#include <cpuid.h>
#endif

/* ------------------------------------------------------------------ dispatch */

typedef struct kernels {
    void (*tile)(uint32_t, const void *, size_t, int, const float *const *, int, size_t, float *);
    float (*dot_f32)(const float *, const float *, size_t);
    void (*axpy)(float *, float, const float *, size_t);
    vdot_row_fn (*vdot_for)(uint32_t type); /* NULL result: the portable integer dot */
    vtile_fn (*vtile_for)(uint32_t type);   /* NULL result: vdot_for's kernel row by row */
    vrows_fn (*vrows_for)(uint32_t type);   /* decode, 16 rows and more (NULL result: vdot_for's) */
} kernels_t;

static vdot_row_fn vdot_for_portable(uint32_t type)
{
    (void)type;
    return NULL;
}

static vtile_fn vtile_for_none(uint32_t type)
{
    (void)type;
    return NULL;
}

static vrows_fn vrows_for_none(uint32_t type)
{
    (void)type;
    return NULL;
}

#if QUANT_HAVE_X86
static int vnni_ok; /* the CPU has AVX-VNNI too (set by quant_isa_set) */

/* AVX-512's integer dots where it has them, else AVX-VNNI's or AVX2's */
static vdot_row_fn vdot_for_avx512(uint32_t type)
{
    vdot_row_fn fn = quant_avx512_vdot_for(type);
    return fn ? fn : vnni_ok ? quant_vnni_vdot_for(type) : quant_avx2_vdot_for(type);
}

/* AVX-VNNI's tiles where it has them, else the AVX2 ones (quant_k256.c) */
static vtile_fn vtile_for_vnni(uint32_t type)
{
    vtile_fn fn = quant_vnni_vtile_for(type);
    return fn ? fn : quant_k256_vtile_for(type);
}

static vtile_fn vtile_for_avx512(uint32_t type)
{
    vtile_fn fn = quant_avx512_vtile_for(type);
    return fn ? fn : vnni_ok ? vtile_for_vnni(type) : quant_k256_vtile_for(type);
}
#endif

static const kernels_t k_portable = {quant_fmt_tile,    quant_fmt_dot_f32, quant_fmt_axpy,
                                     vdot_for_portable, vtile_for_none,    vrows_for_none};
#if QUANT_HAVE_X86
static const kernels_t k_avx2 = {quant_avx2_tile,     quant_avx2_dot_f32,   quant_avx2_axpy,
                                 quant_avx2_vdot_for, quant_k256_vtile_for, quant_k256_vrows_for};
static const kernels_t k_vnni = {quant_avx2_tile, quant_avx2_dot_f32,
                                 quant_avx2_axpy, quant_vnni_vdot_for,
                                 vtile_for_vnni,  quant_k256_lanes_vrows_for};
static const kernels_t k_avx512 = {quant_avx512_tile, quant_avx2_dot_f32, quant_avx2_axpy,
                                   vdot_for_avx512,   vtile_for_avx512,   quant_avx512_vrows_for};
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

static int cpu_has_avxvnni(void)
{
#if QUANT_HAVE_X86
    unsigned a, b, c, d; /* CPUID.(7,1):EAX bit 4 */
    return cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
#else
    return 0;
#endif
}

static int cpu_has_avx512(void)
{
#if QUANT_HAVE_X86
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

quant_isa_t quant_isa_set(quant_isa_t want)
{
#if QUANT_HAVE_X86
    vnni_ok = cpu_has_avxvnni();
    if ((want == QUANT_ISA_AUTO || want == QUANT_ISA_AVX512) && cpu_has_avx512()) {
        k_cur = &k_avx512;
        isa_cur = QUANT_ISA_AVX512;
        return isa_cur;
    }
    if ((want == QUANT_ISA_AUTO || want == QUANT_ISA_AVX512 || want == QUANT_ISA_AVX2_VNNI) &&
        vnni_ok) {
        k_cur = &k_vnni;
        isa_cur = QUANT_ISA_AVX2_VNNI;
        return isa_cur;
    }
#endif
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

void quant_tile_shape(uint32_t type, int *rows, int *cols)
{
    *rows = 2;
    *cols = QUANT_DOTN_MAX;
#if QUANT_HAVE_X86
    const kernels_t *k = kern();
    if (k == &k_avx512 && quant_act_for(type) == QUANT_ACT_F32) {
        *rows = 4; /* quant_avx512.c's 4 x 6 tile, its accumulators in registers (F16 rows */
        *cols = 6; /* widened once a call for 24 vectors measured 10-25% slower) */
    } else if (k == &k_avx512 && quant_act_for(type) == QUANT_ACT_Q8 && type == GGUF_T_Q8_0) {
        *rows = 4; /* 4 x 6: 1.3-1.5x the one-row kernel's prefill; 4 x 4 and 4 x 8 within noise */
        *cols = 6;
    } else if (k == &k_avx512 && quant_act_for(type) == QUANT_ACT_Q8K &&
               (type == GGUF_T_Q4_K || type == GGUF_T_Q6_K)) {
        *rows = 16; /* quant_k512.c: 16 interleaved rows, repacked once a call for 32 tokens */
        *cols = 32;
    } else if ((k == &k_avx2 || k == &k_vnni) && quant_act_for(type) == QUANT_ACT_F32) {
        *rows = 4; /* quant_avx2.c's 4 x 3 tile, 16 registers: F16 prefill 1.4x the 2 x 4's */
        *cols = 3;
    } else if ((k == &k_avx2 || k == &k_vnni) && quant_act_for(type) == QUANT_ACT_Q8K &&
               type == GGUF_T_Q4_K) {
        *rows = 8; /* quant_k256.c: 8 interleaved rows, repacked once a call for 32 tokens */
        *cols = 32;
    } else if ((k == &k_avx2 || k == &k_vnni) && quant_act_for(type) == QUANT_ACT_Q8K &&
               type == GGUF_T_Q6_K) {
        *rows = 8;  /* quant_k256.c: 8 rows x 4 tokens, nothing repacked, its rows kept in L1 */
        *cols = 16; /* across 16 tokens */
    } else if (k == &k_avx2 && quant_act_for(type) == QUANT_ACT_Q8 && type == GGUF_T_Q8_0) {
        *rows = 8;  /* quant_q256.c's tile of 8 rows x 4 tokens, its rows kept in L1 */
        *cols = 16; /* across 16 tokens */
    }
#endif
}

/* F16 rows and activation quantizers by F16C and AVX2 when the kernels are
 * SIMD ones (the same values: the conversions are exact one way and round
 * to nearest even the other, only a NaN's payload may differ; the
 * quantizers take products, rounding and maxima as the portable ones); off
 * x86 the kernels are the portable ones. */
static int f16_rows_simd(void)
{
    return kern() != &k_portable;
}

void quant_row_from_f32(uint32_t type, const float *x, void *dst, size_t n)
{
    if (type == GGUF_T_F16 && f16_rows_simd()) {
#if QUANT_HAVE_X86
        quant_avx2_f32_to_f16_row(x, dst, n);
        return;
#endif
    }
    quant_fmt_row_from_f32(type, x, dst, n);
}

void quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n)
{
    if (type == GGUF_T_F16 && f16_rows_simd()) {
#if QUANT_HAVE_X86
        quant_avx2_f16_to_f32_row(src, dst, n);
        return;
#endif
    }
    quant_fmt_row_to_f32(type, src, dst, n);
}

void quant_act_from_f32(quant_act_t act, const float *x, void *dst, size_t n)
{
    switch (act) {
    case QUANT_ACT_Q8:
        if (f16_rows_simd()) {
#if QUANT_HAVE_X86
            quant_avx2_act_q8(x, dst, n / QUANT_Q8_0_BLOCK);
            break;
#endif
        }
        quant_fmt_act_q8(x, dst, n / QUANT_Q8_0_BLOCK);
        break;
    case QUANT_ACT_Q8K:
        if (f16_rows_simd()) {
#if QUANT_HAVE_X86
            quant_avx2_act_q8k(x, dst, n / QUANT_K_BLOCK);
            break;
#endif
        }
        quant_fmt_act_q8k(x, dst, n / QUANT_K_BLOCK);
        break;
    default: memcpy(dst, x, n * sizeof(float)); break;
    }
}

quant_isa_t quant_isa_get(void)
{
    kern();
    return isa_cur;
}

int quant_isa_parse(const char *s, quant_isa_t *isa)
{
    static const struct {
        const char *name;
        quant_isa_t isa;
    } names[] = {{"auto", QUANT_ISA_AUTO},
                 {"avx512", QUANT_ISA_AVX512},
                 {"vnni", QUANT_ISA_AVX2_VNNI},
                 {"avx2", QUANT_ISA_AVX2},
                 {"portable", QUANT_ISA_PORTABLE}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *isa = names[i].isa;
            return 0;
        }
    return -1;
}

const char *quant_isa_name(quant_isa_t isa)
{
    switch (isa) {
    case QUANT_ISA_AVX2: return "avx2";
    case QUANT_ISA_AVX2_VNNI: return "avx2-vnni";
    case QUANT_ISA_AVX512: return "avx512";
    case QUANT_ISA_PORTABLE: return "portable";
    default: return "auto";
    }
}

/* F32, F16, BF16 and Q8_0 go to the ISA's kernels; the other block types
 * take the portable exact kernel. */
static void tile_any(uint32_t type, const void *w, size_t rb, int nr, const float *const *x, int nx,
                     size_t n, float *out)
{
    if (type != GGUF_T_Q8_0 && type != GGUF_T_F16 && type != GGUF_T_F32 && type != GGUF_T_BF16) {
        const qfmt_t *f = quant_fmt_of(type);
        if (f) {
            quant_fmt_tile_exact(f, w, rb, nr, x, nx, n, out);
            return;
        }
    }
    kern()->tile(type, w, rb, nr, x, nx, n, out);
}

void quant_dot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const float *const *x,
                    int nx, size_t n, float *out)
{
    tile_any(type, w, row_bytes, nr, x, nx, n, out);
}

void quant_dotn(uint32_t type, const void *w, const float *const *x, int nx, size_t n, float *out)
{
    tile_any(type, w, 0, 1, x, nx, n, out);
}

float quant_dot(uint32_t type, const void *w, const float *x, size_t n)
{
    float r;
    tile_any(type, w, 0, 1, &x, 1, n, &r);
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

void quant_axpy_f16_rows(float *y, const float *a, const uint16_t *x, size_t x_stride, size_t nrows,
                         size_t n)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable) {
        quant_avx2_axpy_f16_rows(y, a, x, x_stride, nrows, n);
        return;
    }
#endif
    for (size_t p = 0; p < nrows; p++)
        quant_axpy_f16(y, a[p], x + p * x_stride, n);
}

float quant_exp_shift(float *x, size_t n, float mx)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable)
        return quant_avx2_exp_shift(x, n, mx);
#endif
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    return sum;
}

void quant_axpy_f16_rows_n(float *const *y, const float *const *a, int ny, const uint16_t *x,
                           size_t x_stride, size_t nrows, size_t n)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable) {
        quant_avx2_axpy_f16_rows_n(y, a, ny, x, x_stride, nrows, n);
        return;
    }
#endif
    for (int j = 0; j < ny; j++)
        quant_axpy_f16_rows(y[j], a[j], x, x_stride, nrows, n);
}

void quant_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable) {
        quant_avx2_axpy_f16(y, a, x, n);
        return;
    }
#endif
    float v[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        quant_row_to_f32(GGUF_T_F16, x + i, v, m);
        kern()->axpy(y + i, a, v, m);
    }
}

void quant_vdot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const void *const *xq,
                     int nx, size_t n, float *out)
{
    const qfmt_t *f = quant_fmt_of(type);
    size_t blck, bytes;
    quant_fmt_traits(type, &blck, &bytes);
    vdot_row_fn fn = f ? kern()->vdot_for(type) : NULL;
    vtile_fn tile = f && nx > 1 ? kern()->vtile_for(type) : NULL;
    vrows_fn rows = f && nx == 1 && nr >= 16 ? kern()->vrows_for(type) : NULL;
    if (rows) {
        rows(w, row_bytes, nr, xq[0], n / blck, out);
        return;
    }
    if (tile) {
        tile(w, row_bytes, nr, xq, nx, n / blck, out);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * row_bytes;
        if (fn) {
            for (int t0 = 0; t0 < nx; t0 += QUANT_DOTN_MAX)
                fn(row, xq + t0, nx - t0 < QUANT_DOTN_MAX ? nx - t0 : QUANT_DOTN_MAX, n / blck,
                   out + r * nx + t0);
            continue;
        }
        for (int t = 0; t < nx; t++)
            out[r * nx + t] = f ? quant_fmt_vdot_row(f, row, bytes, xq[t], n / blck) : 0.0f;
    }
}

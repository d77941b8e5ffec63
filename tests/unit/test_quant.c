/* Unit tests for quant: F16/BF16 and block-type conversions (against llama.cpp's files), and the dot kernels (exact, quantized-activation, portable and SIMD). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t st = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (float)((st >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

Test(quant, every_f16_value_round_trips_through_f32)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        cr_assert_eq(quant_f32_to_f16(f), h, "half 0x%04x -> %g -> 0x%04x", h, (double)f,
                     quant_f32_to_f16(f));
    }
}

Test(quant, f32_to_f16_rounds_to_nearest_even_and_saturates_to_inf)
{
    cr_assert_eq(quant_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(quant_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(quant_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(quant_f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(quant_f32_to_f16(1e-8f), 0x0000);
    cr_assert_eq(quant_f32_to_f16(5.9604645e-08f), 0x0001); /* smallest subnormal */
    /* 1 + 2^-11 is a tie between 1 and 1+2^-10: even mantissa wins */
    cr_assert_eq(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert(isnan(quant_f16_to_f32(quant_f32_to_f16(NAN))));
}

Test(quant, bf16_keeps_the_top_16_bits_with_rounding)
{
    cr_assert_eq(quant_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(quant_bf16_to_f32(0x3f80), 1.0f);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            cr_assert_eq(quant_f32_to_bf16(f), h);
    }
    cr_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(NAN))));
}

Test(quant, q8_0_round_trip_error_is_within_half_a_step)
{
    float x[256], y[256];
    quant_block_q8_0_t b[8];
    for (int i = 0; i < 256; i++)
        x[i] = frand() * 3.0f;
    quant_row_from_f32(GGUF_T_Q8_0, x, b, 256);
    quant_row_to_f32(GGUF_T_Q8_0, b, y, 256);
    for (int k = 0; k < 8; k++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[k * 32 + j]));
        float step = amax / 127.0f;
        for (int j = 0; j < 32; j++)
            cr_assert_leq(fabsf(x[k * 32 + j] - y[k * 32 + j]), step * 0.5f + amax * 1e-3f);
    }
    cr_assert_eq(quant_row_bytes(GGUF_T_Q8_0, 256), 8 * 34);
    cr_assert_eq(quant_row_bytes(GGUF_T_Q8_0, 33), 0);
}

static void check_dotn_consistency(quant_isa_t isa)
{
    quant_isa_set(isa);
    const uint32_t types[4] = {GGUF_T_F32, GGUF_T_F16, GGUF_T_BF16, GGUF_T_Q8_0};
    const size_t ns[4] = {32, 96, 800, 2048};
    for (int ti = 0; ti < 4; ti++) {
        for (int ni = 0; ni < 4; ni++) {
            size_t n = ns[ni];
            float *w = malloc(n * sizeof(float)), *x[4];
            void *wq = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                w[i] = frand();
            for (int j = 0; j < 4; j++) {
                x[j] = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    x[j][i] = frand();
            }
            quant_row_from_f32(types[ti], w, wq, n);
            float *wd = malloc(n * sizeof(float));
            quant_row_to_f32(types[ti], wq, wd, n);
            for (int nx = 1; nx <= 4; nx++) {
                float out[4];
                quant_dotn(types[ti], wq, (const float *const *)x, nx, n, out);
                for (int j = 0; j < nx; j++) {
                    float one = quant_dot(types[ti], wq, x[j], n);
                    cr_assert_eq(memcmp(&one, &out[j], 4), 0, "%s n=%zu nx=%d j=%d: %g vs %g",
                                 gguf_ttype_name(types[ti]), n, nx, j, (double)one, (double)out[j]);
                    double ref = 0, mag = 0;
                    for (size_t i = 0; i < n; i++) {
                        ref += (double)wd[i] * x[j][i];
                        mag += fabs((double)wd[i] * x[j][i]);
                    }
                    cr_assert_leq(fabs(ref - one), 1e-5 * mag + 1e-6, "%s n=%zu: %g vs %g",
                                  gguf_ttype_name(types[ti]), n, (double)one, ref);
                }
            }
            free(w);
            free(wq);
            free(wd);
            for (int j = 0; j < 4; j++)
                free(x[j]);
        }
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(quant, portable_dotn_equals_dot_bit_for_bit_and_matches_float64)
{
    check_dotn_consistency(QUANT_ISA_PORTABLE);
}

Test(quant, avx2_dotn_equals_dot_bit_for_bit_and_matches_float64)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_dotn_consistency(QUANT_ISA_AVX2);
}

Test(quant, avx512_dotn_equals_dot_bit_for_bit_and_matches_float64)
{
    if (quant_isa_set(QUANT_ISA_AVX512) != QUANT_ISA_AVX512)
        cr_skip_test("CPU lacks AVX-512 (F, BW, VL, VNNI)");
    check_dotn_consistency(QUANT_ISA_AVX512);
}

/* Every float tile shape the prefill uses (up to 4 rows x 4 vectors, and
 * the pair-by-pair fallback beyond) gives each (row, vector) the result of
 * a single dot, on every ISA; lengths with a tail past the vector width. */
Test(quant, float_tiles_of_every_shape_equal_single_dots)
{
    const uint32_t types[3] = {GGUF_T_F32, GGUF_T_F16, GGUF_T_BF16};
    const size_t ns[3] = {64, 776, 2051};
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (int ti = 0; ti < 3; ti++)
            for (int ni = 0; ni < 3; ni++) {
                size_t n = ns[ni];
                uint8_t *w = malloc(9 * n * 4);
                float *x[6], *wf = malloc(n * sizeof(float));
                for (int r = 0; r < 9; r++) {
                    for (size_t i = 0; i < n; i++)
                        wf[i] = frand();
                    quant_row_from_f32(types[ti], wf, w + (size_t)r * n * 4, n);
                }
                for (int j = 0; j < 6; j++) {
                    x[j] = malloc(n * sizeof(float));
                    for (size_t i = 0; i < n; i++)
                        x[j][i] = frand();
                }
                for (int nr = 1; nr <= 9; nr++) /* 8 and more rows of one vector: decode's rows */
                    for (int nx = 1; nx <= 6; nx++) {
                        float out[54];
                        quant_dot_tile(types[ti], w, n * 4, nr, (const float *const *)x, nx, n,
                                       out);
                        for (int r = 0; r < nr; r++)
                            for (int j = 0; j < nx; j++) {
                                float one = quant_dot(types[ti], w + (size_t)r * n * 4, x[j], n);
                                cr_assert_eq(memcmp(&one, &out[r * nx + j], 4), 0,
                                             "%s %s n=%zu %dx%d (%d,%d): %.9g vs %.9g",
                                             quant_isa_name((quant_isa_t)isa),
                                             gguf_ttype_name(types[ti]), n, nr, nx, r, j,
                                             (double)one, (double)out[r * nx + j]);
                            }
                    }
                free(w);
                free(wf);
                for (int j = 0; j < 6; j++)
                    free(x[j]);
            }
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(quant, f16_rows_convert_as_the_scalar_conversions_on_every_isa)
{
    uint16_t *h = malloc(65536 * 2), *h2 = malloc(65536 * 2);
    float *f = malloc(65536 * sizeof(float));
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (uint32_t i = 0; i < 65536; i++)
            h[i] = (uint16_t)i;
        quant_row_to_f32(GGUF_T_F16, h, f, 65535); /* odd: a tail */
        for (uint32_t i = 0; i < 65535; i++) {
            float e = quant_f16_to_f32(h[i]);
            if (!isnan(e))
                cr_assert_eq(memcmp(&e, &f[i], 4), 0, "%s: %04x", quant_isa_name((quant_isa_t)isa),
                             i);
        }
        for (uint32_t i = 0; i < 65536; i++) { /* every half value, the ties to its next, beside */
            float lo = quant_f16_to_f32((uint16_t)(i >> 2)),
                  hi = quant_f16_to_f32((uint16_t)((i >> 2) + 1));
            float mid = isfinite(hi) && isfinite(lo) ? lo + (hi - lo) / 2 : lo;
            f[i] = (i & 3) == 0   ? lo
                   : (i & 3) == 1 ? mid
                   : (i & 3) == 2 ? nextafterf(mid, hi)
                                  : nextafterf(mid, lo);
        }
        quant_row_from_f32(GGUF_T_F16, f, h2, 65533);
        for (uint32_t i = 0; i < 65533; i++)
            if (!isnan(f[i]))
                cr_assert_eq(h2[i], quant_f32_to_f16(f[i]), "%s: %.9g",
                             quant_isa_name((quant_isa_t)isa), (double)f[i]);
    }
    quant_isa_set(QUANT_ISA_AUTO);
    free(h);
    free(h2);
    free(f);
}

/* The SIMD activation quantizers give the portable one's bytes: values,
 * scales, sums (random rows, rows with ties of magnitude, zeros). */
Test(quant, activations_quantize_to_the_same_bytes_on_every_isa)
{
    const size_t n = 2048;
    float *x = malloc(n * sizeof(float));
    for (int a = QUANT_ACT_Q8; a <= QUANT_ACT_Q8K; a++) {
        size_t ab = quant_act_bytes((quant_act_t)a, n);
        uint8_t *ref = malloc(ab), *got = malloc(ab);
        for (int trial = 0; trial < 6; trial++) {
            for (size_t i = 0; i < n; i++)
                x[i] = trial == 0   ? 0.0f
                       : trial == 1 ? (i % 7 == 3   ? -2.0f
                                       : i % 7 == 5 ? 2.0f
                                                    : frand())
                                    : frand() * (float)trial * (i % 97 == 0 ? 50.0f : 1.0f);
            quant_isa_set(QUANT_ISA_PORTABLE);
            quant_act_from_f32((quant_act_t)a, x, ref, n);
            for (int isa = 2; isa <= 4; isa++) {
                if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
                    continue;
                memset(got, 0x55, ab);
                quant_act_from_f32((quant_act_t)a, x, got, n);
                cr_assert_eq(memcmp(ref, got, ab), 0, "%s act %d trial %d",
                             quant_isa_name((quant_isa_t)isa), a, trial);
            }
        }
        free(ref);
        free(got);
    }
    quant_isa_set(QUANT_ISA_AUTO);
    free(x);
}

Test(quant, f16_axpy_equals_expanding_the_row_then_axpy_on_every_isa)
{
    const size_t n = 203;
    uint16_t h[203];
    float x[203], y1[203], y2[203];
    for (size_t i = 0; i < n; i++)
        h[i] = quant_f32_to_f16(frand() * 4.0f);
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (size_t i = 0; i < n; i++)
            y1[i] = y2[i] = frand();
        quant_row_to_f32(GGUF_T_F16, h, x, n);
        quant_axpy_f32(y1, 0.37f, x, n);
        quant_axpy_f16(y2, 0.37f, h, n);
        cr_assert_eq(memcmp(y1, y2, sizeof y1), 0, "%s", quant_isa_name((quant_isa_t)isa));
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

/* The attention's V sum: F16 rows (strided, as a KV cache's) accumulated
 * at once equal one quant_axpy_f16 per row in order, bit for bit, on every
 * ISA, for head sizes with and without a tail past 32. */
Test(quant, f16_axpy_over_rows_equals_one_axpy_per_row_on_every_isa)
{
    enum {
        ROWS = 37,
        STRIDE = 300
    };
    static uint16_t h[ROWS * STRIDE];
    float a[ROWS], y1[203], y2[203];
    for (size_t i = 0; i < ROWS * STRIDE; i++)
        h[i] = quant_f32_to_f16(frand() * 4.0f);
    for (int r = 0; r < ROWS; r++)
        a[r] = frand();
    const size_t ns[4] = {64, 128, 203, 7};
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (int ni = 0; ni < 4; ni++) {
            size_t n = ns[ni];
            for (size_t i = 0; i < n; i++)
                y1[i] = y2[i] = frand();
            for (int r = 0; r < ROWS; r++)
                quant_axpy_f16(y1, a[r], h + r * STRIDE, n);
            quant_axpy_f16_rows(y2, a, h, STRIDE, ROWS, n);
            cr_assert_eq(memcmp(y1, y2, n * sizeof(float)), 0, "%s n=%zu",
                         quant_isa_name((quant_isa_t)isa), n);
        }
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

/* Attention's blocks: several outputs over the same F16 rows at once equal one
 * quant_axpy_f16_rows each, bit for bit, on every ISA, for 1 to 9 outputs (groups of
 * four and a rest) and head sizes with tails past 16 and 8. */
Test(quant, f16_axpy_over_rows_for_several_outputs_equals_one_call_each_on_every_isa)
{
    enum {
        ROWS = 29,
        STRIDE = 300,
        NY = 9
    };
    static uint16_t h[ROWS * STRIDE];
    static float a[NY][ROWS], y1[NY][203], y2[NY][203];
    for (size_t i = 0; i < ROWS * STRIDE; i++)
        h[i] = quant_f32_to_f16(frand() * 4.0f);
    for (int j = 0; j < NY; j++)
        for (int r = 0; r < ROWS; r++)
            a[j][r] = frand();
    const size_t ns[5] = {64, 80, 203, 7, 40};
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (int ni = 0; ni < 5; ni++)
            for (int ny = 1; ny <= NY; ny++) {
                size_t n = ns[ni];
                float *ys[NY];
                const float *as[NY];
                for (int j = 0; j < ny; j++) {
                    for (size_t i = 0; i < n; i++)
                        y1[j][i] = y2[j][i] = frand();
                    quant_axpy_f16_rows(y1[j], a[j], h, STRIDE, ROWS, n);
                    ys[j] = y2[j];
                    as[j] = a[j];
                }
                quant_axpy_f16_rows_n(ys, as, ny, h, STRIDE, ROWS, n);
                for (int j = 0; j < ny; j++)
                    cr_assert_eq(memcmp(y1[j], y2[j], n * sizeof(float)), 0, "%s n=%zu ny=%d j=%d",
                                 quant_isa_name((quant_isa_t)isa), n, ny, j);
            }
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

/* A softmax's exponentials on every ISA: each within 1e-6 relative of expf (0 or denormal below
 * -87.3), the sum within 1e-6 of theirs, for lengths with and without a tail. */
Test(quant, exp_shift_matches_expf_on_every_isa)
{
    static float x[1003], y[1003];
    for (int i = 0; i < 1003; i++)
        x[i] = i < 8 ? -(float)i * 15.0f : -95.0f * frand() * frand() + 3.0f;
    const float mx = 3.0f;
    const size_t ns[3] = {1003, 7, 64};
    for (int isa = 1; isa <= 4; isa++) {
        if (quant_isa_set((quant_isa_t)isa) != (quant_isa_t)isa)
            continue;
        for (int ni = 0; ni < 3; ni++) {
            size_t n = ns[ni];
            memcpy(y, x, n * sizeof(float));
            double want = 0.0;
            float got = quant_exp_shift(y, n, mx);
            for (size_t i = 0; i < n; i++) {
                float e = expf(x[i] - mx);
                want += e;
                if (e < 1.2e-38f)
                    cr_assert_leq(y[i], 1.2e-38f, "%s x=%g", quant_isa_name((quant_isa_t)isa),
                                  x[i]);
                else
                    cr_assert_leq(fabsf(y[i] - e), 1e-6f * e, "%s x=%g: %g vs %g",
                                  quant_isa_name((quant_isa_t)isa), x[i], y[i], e);
            }
            cr_assert_leq(fabs(got - want), 1e-6 * want, "%s n=%zu: %g vs %g",
                          quant_isa_name((quant_isa_t)isa), n, got, want);
        }
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(quant, axpy_and_dot_f32_handle_odd_lengths)
{
    for (int isa = 1; isa <= 4; isa++) {
        quant_isa_set((quant_isa_t)isa);
        float a[37], b[37], y[37];
        for (int i = 0; i < 37; i++) {
            a[i] = (float)i;
            b[i] = 1.0f;
            y[i] = 1.0f;
        }
        cr_assert_float_eq(quant_dot_f32(a, b, 37), 666.0f, 1e-3);
        quant_axpy_f32(y, 2.0f, a, 37);
        cr_assert_float_eq(y[36], 73.0f, 1e-6);
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

/* ------------------------------------------------------------------ block types */

/* every block type the engine computes with, and how far this
 * round-to-nearest quantizer may land from the value: rms error / rms of the
 * row, for rows of uniform values (3 bits ~ 1/(2^3 * sqrt 12) ...) */
static const struct {
    uint32_t type;
    double rms_rel;
} btypes[] = {
    {GGUF_T_Q8_0, 0.006}, {GGUF_T_Q4_0, 0.09},  {GGUF_T_Q4_1, 0.07},   {GGUF_T_Q5_0, 0.045},
    {GGUF_T_Q5_1, 0.035}, {GGUF_T_Q2_K, 0.40},  {GGUF_T_Q3_K, 0.20},   {GGUF_T_Q4_K, 0.09},
    {GGUF_T_Q5_K, 0.045}, {GGUF_T_Q6_K, 0.025}, {GGUF_T_IQ4_NL, 0.10}, {GGUF_T_IQ4_XS, 0.10},
};
#define N_BTYPES (sizeof btypes / sizeof btypes[0])

Test(quant, every_block_type_round_trips_within_its_quantization_error)
{
    const size_t n = 1024;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(n * 4);
    for (size_t ti = 0; ti < N_BTYPES; ti++) {
        uint32_t t = btypes[ti].type, blck, bytes;
        cr_assert(quant_type_supported(t), "%s", gguf_ttype_name(t));
        cr_assert_eq(gguf_ttype_traits(t, &blck, &bytes), 0);
        cr_assert_eq(quant_row_bytes(t, n), n / blck * bytes);
        cr_assert_eq(quant_row_bytes(t, n + 16), 0, "%s: partial block", gguf_ttype_name(t));
        double e2 = 0, x2 = 0;
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * (1.0f + (float)(i / 256)); /* a different range per 256 */
        quant_row_from_f32(t, x, q, n);
        quant_row_to_f32(t, q, y, n);
        for (size_t i = 0; i < n; i++) {
            e2 += (double)(x[i] - y[i]) * (x[i] - y[i]);
            x2 += (double)x[i] * x[i];
        }
        double rel = sqrt(e2 / x2);
        cr_log_info("%s round trip: rms error %.4f of rms", gguf_ttype_name(t), rel);
        cr_assert_leq(rel, btypes[ti].rms_rel, "%s: rms error %.4f of rms", gguf_ttype_name(t),
                      rel);
        /* zeros stay zeros */
        memset(x, 0, n * sizeof(float));
        quant_row_from_f32(t, x, q, n);
        quant_row_to_f32(t, q, y, n);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(y[i], 0.0f, "%s: zero row gives %g", gguf_ttype_name(t), (double)y[i]);
    }
    free(x);
    free(y);
    free(q);
}

/* Fills nx random activation rows and a quantized weight row of type t. */
static void rand_row(uint32_t t, size_t n, void *wq, float *wd, float **x, int nx)
{
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        w[i] = frand();
    quant_row_from_f32(t, w, wq, n);
    quant_row_to_f32(t, wq, wd, n);
    for (int j = 0; j < nx; j++)
        for (size_t i = 0; i < n; i++)
            x[j][i] = frand() * 2.0f;
    free(w);
}

Test(quant, exact_dots_of_block_types_match_float64_whatever_the_tile)
{
    const size_t n = 768;
    float *x[4], *wd = malloc(2 * n * sizeof(float));
    uint8_t *wq = malloc(2 * n * 4);
    for (int j = 0; j < 4; j++)
        x[j] = malloc(n * sizeof(float));
    for (int isa = 1; isa <= 4; isa++) {
        quant_isa_set((quant_isa_t)isa);
        for (size_t ti = 0; ti < N_BTYPES; ti++) {
            uint32_t t = btypes[ti].type;
            size_t rb = quant_row_bytes(t, n);
            rand_row(t, n, wq, wd, x, 4);
            rand_row(t, n, wq + rb, wd + n, x, 4);
            float tile[8];
            quant_dot_tile(t, wq, rb, 2, (const float *const *)x, 4, n, tile);
            for (int r = 0; r < 2; r++)
                for (int j = 0; j < 4; j++) {
                    float one = quant_dot(t, wq + r * rb, x[j], n);
                    cr_assert_eq(memcmp(&one, &tile[r * 4 + j], 4), 0, "%s r=%d j=%d",
                                 gguf_ttype_name(t), r, j);
                    double ref = 0, mag = 0;
                    for (size_t i = 0; i < n; i++) {
                        ref += (double)wd[r * n + i] * x[j][i];
                        mag += fabs((double)wd[r * n + i] * x[j][i]);
                    }
                    cr_assert_leq(fabs(ref - one), 1e-5 * mag, "%s: %g vs %g", gguf_ttype_name(t),
                                  (double)one, ref);
                }
        }
    }
    quant_isa_set(QUANT_ISA_AUTO);
    for (int j = 0; j < 4; j++)
        free(x[j]);
    free(wd);
    free(wq);
}

Test(quant, quantized_activation_dots_equal_the_dequantized_values_dot)
{
    quant_isa_set(QUANT_ISA_PORTABLE); /* the SIMD ones are compared with these below */
    const size_t n = 1024;
    float *x[4], *wd = malloc(2 * n * sizeof(float)), *xd = malloc(n * sizeof(float));
    uint8_t *wq = malloc(2 * n * 4);
    for (int j = 0; j < 4; j++)
        x[j] = malloc(n * sizeof(float));
    for (size_t ti = 0; ti < N_BTYPES; ti++) {
        uint32_t t = btypes[ti].type;
        quant_act_t act = quant_act_of(t);
        cr_assert_neq(act, QUANT_ACT_F32, "%s has no integer dot", gguf_ttype_name(t));
        size_t rb = quant_row_bytes(t, n), ab = quant_act_bytes(act, n);
        rand_row(t, n, wq, wd, x, 4);
        rand_row(t, n, wq + rb, wd + n, x, 4);
        uint8_t *xq = malloc(4 * ab);
        const void *xqs[4];
        for (int j = 0; j < 4; j++) {
            quant_act_from_f32(act, x[j], xq + j * ab, n);
            xqs[j] = xq + j * ab;
        }
        float tile[8];
        quant_vdot_tile(t, wq, rb, 2, xqs, 4, n, tile);
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 4; j++) {
                float one = quant_vdot_portable(t, wq + r * rb, xqs[j], n);
                cr_assert_eq(memcmp(&one, &tile[r * 4 + j], 4), 0, "%s r=%d j=%d",
                             gguf_ttype_name(t), r, j);
                /* the quantized activations' values, dequantized by hand;
                 * Q4_1/Q5_1 take their mins' product from s = d * sum in
                 * F16, which may differ from the values' sum by the slack */
                size_t bl = act == QUANT_ACT_Q8 ? 32 : 256;
                double slack = 0;
                for (size_t k = 0; k < n / bl; k++) {
                    float d;
                    const int8_t *qs;
                    if (act == QUANT_ACT_Q8) {
                        const quant_act_q8_t *a = (const quant_act_q8_t *)xqs[j] + k;
                        d = a->d;
                        qs = a->qs;
                        int sum = 0;
                        for (int i = 0; i < 32; i++)
                            sum += qs[i];
                        cr_assert_leq(fabsf(a->s - d * (float)sum),
                                      1e-3f * fabsf(d * (float)sum) + 1e-30f);
                        float wmax = 0;
                        for (int i = 0; i < 32; i++)
                            wmax = fmaxf(wmax, fabsf(wd[r * n + k * 32 + i]));
                        slack += wmax * fabs((double)a->s - (double)d * sum);
                    } else {
                        const quant_act_q8k_t *a = (const quant_act_q8k_t *)xqs[j] + k;
                        d = a->d;
                        qs = a->qs;
                    }
                    for (size_t i = 0; i < bl; i++) {
                        xd[k * bl + i] = d * (float)qs[i];
                        /* half a step, plus the F16 rounding of Q8's d */
                        cr_assert_leq(fabsf(xd[k * bl + i] - x[j][k * bl + i]), 0.57f * fabsf(d));
                    }
                }
                double ref = 0, mag = 0;
                for (size_t i = 0; i < n; i++) {
                    ref += (double)wd[r * n + i] * xd[i];
                    mag += fabs((double)wd[r * n + i] * xd[i]);
                }
                cr_assert_leq(fabs(ref - one), 1e-5 * mag + slack, "%s: %g vs %g",
                              gguf_ttype_name(t), (double)one, ref);
            }
        free(xq);
    }
    for (int j = 0; j < 4; j++)
        free(x[j]);
    free(wd);
    free(xd);
    free(wq);
}

/* The first rows of every matrix in kquant/ktest-llama-<name>.gguf against
 * the gguf Python package's exact dequantization: |diff| <= 1e-6 max|row|.
 * worst[] collects the largest ratio per type. */
static void check_dequant_file(const char *name, double *worst)
{
    char rel[256], path[1024], err[512];
    snprintf(rel, sizeof rel, "kquant/ktest-llama-%s.gguf", name);
    tu_data_path(path, sizeof path, rel);
    gguf_t *g = gguf_open(path, err, sizeof err);
    cr_assert_not_null(g, "%s", err);
    snprintf(rel, sizeof rel, "kquant/ktest-llama-%s.dequant.json", name);
    tu_data_path(path, sizeof path, rel);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    const char *tname;
    json_t *v;
    int n_checked = 0;
    json_object_foreach (j, tname, v) {
        const gguf_tensor_t *t = gguf_find_tensor(g, tname);
        cr_assert_not_null(t, "%s: no tensor %s", name, tname);
        const char *want_type = json_string_value(json_object_get(v, "type"));
        cr_assert_str_eq(gguf_ttype_name(t->type), want_type, "%s", tname);
        cr_assert(quant_type_supported(t->type), "%s: %s", tname, want_type);
        json_t *rows = json_object_get(v, "rows");
        size_t n = t->ne[0], rb = quant_row_bytes(t->type, n);
        cr_assert_gt(json_array_size(rows), 0);
        float *y = malloc(n * sizeof(float));
        for (size_t r = 0; r < json_array_size(rows); r++) {
            json_t *row = json_array_get(rows, r);
            cr_assert_eq(json_array_size(row), n);
            quant_row_to_f32(t->type, (const uint8_t *)t->data + r * rb, y, n);
            double mx = 0, md = 0;
            for (size_t i = 0; i < n; i++) {
                double want = json_number_value(json_array_get(row, i));
                mx = fmax(mx, fabs(want));
                md = fmax(md, fabs(want - (double)y[i]));
            }
            cr_assert_gt(mx, 0.0, "%s row %zu is all zeros", tname, r);
            cr_assert_leq(md, 1e-6 * mx, "%s %s row %zu: max |diff| %g, max |row| %g", name, tname,
                          r, md, mx);
            if (md / mx > worst[t->type])
                worst[t->type] = md / mx;
            n_checked++;
        }
        free(y);
    }
    cr_assert_gt(n_checked, 0);
    json_decref(j);
    gguf_close(g);
}

Test(quant, every_kquant_file_dequantizes_to_the_gguf_package_values, .timeout = 60)
{
    static const char *const files[] = {"Q8_0",   "Q4_0",   "Q4_1", "Q5_0",   "Q5_1",  "Q2_K",
                                        "Q3_K_M", "Q4_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"};
    double worst[64];
    for (int i = 0; i < 64; i++)
        worst[i] = -1.0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++)
        check_dequant_file(files[f], worst);
    for (size_t ti = 0; ti < N_BTYPES; ti++) {
        uint32_t t = btypes[ti].type;
        cr_assert_geq(worst[t], 0.0, "no tensor of type %s in the set", gguf_ttype_name(t));
        cr_log_info("%s: max |diff| / max |row| = %.3g", gguf_ttype_name(t), worst[t]);
    }
}

/* ------------------------------------------------------------------ SIMD integer dots */

/* A row of nblk blocks of random bytes (every bit pattern is a valid block
 * but for the F16 factors, set to finite values) of a type whose F16
 * factors sit at d_off (and d_off + 2 when two). */
static void rand_blocks(uint8_t *w, size_t nblk, size_t bytes, size_t d_off, int two)
{
    for (size_t i = 0; i < nblk * bytes; i++)
        w[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t k = 0; k < nblk; k++)
        for (int j = 0; j <= two; j++) {
            uint16_t h = quant_f32_to_f16(frand() * 0.05f);
            memcpy(w + k * bytes + d_off + 2 * j, &h, 2);
        }
}

/* Every SIMD integer dot equals the portable one on the same quantized
 * activations: Q2_K..Q6_K and IQ4_XS bit for bit; the 32-value types
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), whose SIMD kernels sum in float
 * lanes (Q8_0 on AVX2: the portable order, bit for bit, as
 * test_quant_ktile.c checks), within 1e-5 of the sum of |products| (float rounding of another
 * order). Random blocks (Q8_0 values include -128) and activations,
 * some at the extremes +-127; whatever the tile shape, each result is the
 * one a single dot gives. */
static void check_simd_vdots(quant_isa_t isa)
{
    static const struct {
        uint32_t type;
        size_t d_off;
        int two;
        int lanes; /* float-lane kernel: within a tolerance, not bit for bit */
    } ts[] = {{GGUF_T_Q8_0, 0, 0, 1},   {GGUF_T_Q4_0, 0, 0, 1},  {GGUF_T_IQ4_NL, 0, 0, 1},
              {GGUF_T_Q4_1, 0, 1, 1},   {GGUF_T_Q5_0, 0, 0, 1},  {GGUF_T_Q5_1, 0, 1, 1},
              {GGUF_T_Q4_K, 0, 1, 0},   {GGUF_T_Q5_K, 0, 1, 0},  {GGUF_T_Q6_K, 208, 0, 0},
              {GGUF_T_IQ4_XS, 0, 0, 0}, {GGUF_T_Q2_K, 80, 1, 0}, {GGUF_T_Q3_K, 108, 0, 0}};
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        uint32_t t = ts[ti].type, blck, bytes;
        gguf_ttype_traits(t, &blck, &bytes);
        const size_t n = blck == 32 ? 2016 : 2048; /* 63 blocks: an odd last one */
        quant_act_t act = quant_act_of(t);
        size_t rb = quant_row_bytes(t, n), ab = quant_act_bytes(act, n);
        uint8_t *w = malloc(2 * rb), *xq = malloc(4 * ab);
        float *x = malloc(n * sizeof(float));
        for (int trial = 0; trial < 8; trial++) {
            rand_blocks(w, 2 * n / blck, bytes, ts[ti].d_off, ts[ti].two);
            const void *xs[4];
            for (int j = 0; j < 4; j++) {
                for (size_t i = 0; i < n; i++) /* trial 0: saturating +-extremes */
                    x[i] = trial == 0 ? (i % 3 ? 1.0f : -1.0f) : frand() * (float)(1 + j);
                quant_act_from_f32(act, x, xq + j * ab, n);
                xs[j] = xq + j * ab;
            }
            float tile[8];
            quant_isa_set(isa);
            quant_vdot_tile(t, w, rb, 2, xs, 4, n, tile);
            for (int r = 0; r < 2; r++)
                for (int j = 0; j < 4; j++) {
                    float one;
                    quant_vdot_tile(t, w + r * rb, rb, 1, &xs[j], 1, n, &one);
                    cr_assert_eq(memcmp(&one, &tile[r * 4 + j], 4), 0, "%s %s: tile != single",
                                 quant_isa_name(isa), gguf_ttype_name(t));
                    float p = quant_vdot_portable(t, w + r * rb, xs[j], n);
                    int lanes = ts[ti].lanes;
                    if (!lanes) {
                        cr_assert_eq(memcmp(&p, &one, 4), 0, "%s %s trial %d: %.9g vs %.9g",
                                     quant_isa_name(isa), gguf_ttype_name(t), trial, (double)one,
                                     (double)p);
                        continue;
                    }
                    /* sum of |products| of the dequantized values (32-value blocks),
                     * and for Q4_1/Q5_1 of |min x s| (F16 m after d) */
                    float *wd = malloc(n * sizeof(float));
                    quant_row_to_f32(t, w + r * rb, wd, n);
                    double mag = 0;
                    for (size_t i = 0; i < n; i++) {
                        if (act == QUANT_ACT_Q8K) { /* |dequantized value x activation| */
                            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xs[j] + i / 256;
                            mag += fabs((double)wd[i] * a->d * a->qs[i % 256]);
                            continue;
                        }
                        const quant_act_q8_t *a = (const quant_act_q8_t *)xs[j] + i / 32;
                        mag += fabs((double)wd[i] * a->d * a->qs[i % 32]);
                        if (ts[ti].two && i % 32 == 0) {
                            uint16_t h;
                            memcpy(&h, w + r * rb + i / 32 * bytes + 2, 2);
                            mag += fabs((double)quant_f16_to_f32(h) * a->s);
                        }
                    }
                    free(wd);
                    cr_assert_leq(fabs((double)p - one), 1e-5 * mag, "%s %s trial %d: %.9g vs %.9g",
                                  quant_isa_name(isa), gguf_ttype_name(t), trial, (double)one,
                                  (double)p);
                }
        }
        free(w);
        free(xq);
        free(x);
    }
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(quant, avx2_integer_dots_equal_the_portable_ones)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_simd_vdots(QUANT_ISA_AVX2);
}

Test(quant, avx512_integer_dots_equal_the_portable_ones)
{
    if (quant_isa_set(QUANT_ISA_AVX512) != QUANT_ISA_AVX512)
        cr_skip_test("CPU lacks AVX-512 (F, BW, VL, VNNI)");
    check_simd_vdots(QUANT_ISA_AVX512);
}

Test(quant, avx_vnni_integer_dots_equal_the_portable_ones_and_the_avx2_ones)
{
    if (quant_isa_set(QUANT_ISA_AVX2_VNNI) != QUANT_ISA_AVX2_VNNI)
        cr_skip_test("CPU lacks AVX-VNNI");
    check_simd_vdots(QUANT_ISA_AVX2_VNNI);
    /* the types whose AVX-VNNI dot is the AVX2 one give the same results bit for bit; Q8_0 not
     * (AVX2 takes the portable order, AVX-VNNI its float lanes: they differ by rounding, each
     * table's own kernels agree, as check_q8_0_tiles and the decode tests check) */
    static const struct {
        uint32_t type;
        size_t d_off;
        int two;
    } ts[] = {{GGUF_T_Q4_0, 0, 0}, {GGUF_T_Q4_1, 0, 1},   {GGUF_T_Q5_0, 0, 0},
              {GGUF_T_Q4_K, 0, 1}, {GGUF_T_Q6_K, 208, 0}, {GGUF_T_Q3_K, 108, 0}};
    const size_t n = 1024;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = frand();
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        uint32_t t = ts[ti].type, blck, bytes;
        gguf_ttype_traits(t, &blck, &bytes);
        quant_act_t act = quant_act_of(t);
        uint8_t *w = malloc(quant_row_bytes(t, n));
        uint8_t *xq = malloc(quant_act_bytes(act, n));
        rand_blocks(w, n / blck, bytes, ts[ti].d_off, ts[ti].two);
        quant_act_from_f32(act, x, xq, n);
        const void *xs[1] = {xq};
        float a, b;
        quant_isa_set(QUANT_ISA_AVX2_VNNI);
        quant_vdot_tile(t, w, 0, 1, xs, 1, n, &a);
        quant_isa_set(QUANT_ISA_AVX2);
        quant_vdot_tile(t, w, 0, 1, xs, 1, n, &b);
        cr_assert_eq(memcmp(&a, &b, 4), 0, "%s: %.9g vs %.9g", gguf_ttype_name(t), (double)a,
                     (double)b);
        free(w);
        free(xq);
    }
    quant_isa_set(QUANT_ISA_AUTO);
    free(x);
}

/* Q8_0's prefill tiles (AVX-512: up to 4 rows x 4 token pairs, AVX-VNNI: 2
 * rows x 4 tokens, AVX2: 8 rows x 4 tokens, their remainders and an odd last token) give every
 * (row, token) the one-row dot's result bit for bit, for every shape up to
 * 17 rows x 13 tokens; activations at the +-127 extremes included. */
static void check_q8_0_tiles(quant_isa_t isa)
{
    const size_t n = 2016, rb = quant_row_bytes(GGUF_T_Q8_0, n);
    const size_t ab = quant_act_bytes(QUANT_ACT_Q8, n);
    enum {
        NR = 17, /* 16 rows and more of one token: the decode kernels (vrows) */
        NX = 13
    };
    uint8_t *w = malloc(NR * rb), *xq = malloc(NX * ab);
    float *x = malloc(n * sizeof(float)), *out = malloc(NR * NX * sizeof(float));
    for (int trial = 0; trial < 2; trial++) {
        rand_blocks(w, NR * n / 32, 34, 0, 0);
        const void *xs[NX];
        for (int j = 0; j < NX; j++) {
            for (size_t i = 0; i < n; i++)
                x[i] = trial == 0 && j % 2 ? (i % 3 ? 1.0f : -1.0f) : frand() * (float)(1 + j);
            quant_act_from_f32(QUANT_ACT_Q8, x, xq + j * ab, n);
            xs[j] = xq + j * ab;
        }
        quant_isa_set(isa);
        for (int nr = 1; nr <= NR; nr++)
            for (int nx = 1; nx <= NX; nx++) {
                quant_vdot_tile(GGUF_T_Q8_0, w, rb, nr, xs, nx, n, out);
                for (int r = 0; r < nr; r++)
                    for (int j = 0; j < nx; j++) {
                        float one;
                        quant_vdot_tile(GGUF_T_Q8_0, w + r * rb, rb, 1, &xs[j], 1, n, &one);
                        cr_assert_eq(memcmp(&one, &out[r * nx + j], 4), 0,
                                     "%s %dx%d (%d,%d): %.9g vs %.9g", quant_isa_name(isa), nr, nx,
                                     r, j, (double)one, (double)out[r * nx + j]);
                    }
            }
    }
    quant_isa_set(QUANT_ISA_AUTO);
    free(w);
    free(xq);
    free(x);
    free(out);
}

Test(quant, q8_0_tiles_of_every_shape_equal_single_dots_on_avx512)
{
    if (quant_isa_set(QUANT_ISA_AVX512) != QUANT_ISA_AVX512)
        cr_skip_test("CPU lacks AVX-512 (F, BW, VL, VNNI)");
    check_q8_0_tiles(QUANT_ISA_AVX512);
}

Test(quant, q8_0_tiles_of_every_shape_equal_single_dots_on_avx_vnni)
{
    if (quant_isa_set(QUANT_ISA_AVX2_VNNI) != QUANT_ISA_AVX2_VNNI)
        cr_skip_test("CPU lacks AVX-VNNI");
    check_q8_0_tiles(QUANT_ISA_AVX2_VNNI);
}

Test(quant, q8_0_tiles_of_every_shape_equal_single_dots_on_avx2)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_q8_0_tiles(QUANT_ISA_AVX2);
}

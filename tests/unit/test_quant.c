/* Unit tests for quant: F16/BF16/Q8_0 conversions and the dot kernels (portable and AVX2). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

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
                                 gguf_ttype_name(types[ti]), n, nx, j, (double)one,
                                 (double)out[j]);
                    double ref = 0, mag = 0;
                    for (size_t i = 0; i < n; i++) {
                        ref += (double)wd[i] * x[j][i];
                        mag += fabs((double)wd[i] * x[j][i]);
                    }
                    cr_assert_leq(fabs(ref - one), 1e-5 * mag + 1e-6, "%s n=%zu: %g vs %g",
                                  gguf_ttype_name(types[ti]), n, (double)one, ref);
                }
            }
            free(w); free(wq); free(wd);
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

Test(quant, axpy_and_dot_f32_handle_odd_lengths)
{
    for (int isa = 1; isa <= 2; isa++) {
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

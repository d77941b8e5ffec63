/* Unit tests for attk: attention's F16 scores and value sums on every ISA against float64, and each result the same bits however the queries and rows are grouped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attk.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t st = 0x2545f4914f6cdd1dull;
static float frand(void)
{
    return tu_frand(&st);
}

#define ROWS 53   /* positions: three full blocks of 16 and a tail */
#define NQ 7      /* queries: a group of four and a tail of three */
#define STRIDE 40 /* extra halves between rows, as the other heads and layers are */

static void f16_rows(uint16_t *k, size_t hd)
{
    for (size_t p = 0; p < ROWS; p++)
        for (size_t i = 0; i < hd + STRIDE; i++)
            k[p * (hd + STRIDE) + i] = quant_f32_to_f16(frand());
}

/* Sets isa or skips the test (a CPU without it); the ISAs a CPU has, each in turn. */
static int isa_ok(quant_isa_t isa)
{
    return quant_isa_set(isa) == isa;
}

static void check_scores(size_t hd)
{
    size_t ks = hd + STRIDE, cap = ROWS + 3;
    uint16_t *k = malloc(ROWS * ks * sizeof *k);
    float *q = malloc(NQ * hd * sizeof *q), *sc = calloc(NQ * cap, sizeof *sc);
    float *one = calloc(cap, sizeof *one), *scr = malloc(attk_scratch_floats(hd) * sizeof *scr);
    f16_rows(k, hd);
    for (size_t i = 0; i < NQ * hd; i++)
        q[i] = frand();
    const float *qs[NQ];
    for (int j = 0; j < NQ; j++)
        qs[j] = q + (size_t)j * hd;
    attk_scores_f16(qs, NQ, k, ks, 0, ROWS - 1, hd, sc, cap, scr);
    for (int j = 0; j < NQ; j++) {
        for (uint32_t p = 0; p < ROWS; p++) {
            double ref = 0, mag = 0;
            for (size_t i = 0; i < hd; i++) {
                double x = (double)quant_f16_to_f32(k[p * ks + i]) * qs[j][i];
                ref += x;
                mag += fabs(x);
            }
            cr_assert(fabs(sc[(size_t)j * cap + p] - ref) <= 1e-5 * mag,
                      "hd %zu q %d p %u: %g vs %g", hd, j, p, (double)sc[(size_t)j * cap + p], ref);
        }
        /* alone and from another first row: the same bits */
        uint32_t lo = (uint32_t)(j * 5);
        attk_scores_f16(&qs[j], 1, k + lo * ks, ks, lo, ROWS - 1, hd, one, cap, scr);
        for (uint32_t p = lo; p < ROWS; p++)
            cr_assert(one[p] == sc[(size_t)j * cap + p], "hd %zu q %d p %u alone from %u: %a vs %a",
                      hd, j, p, lo, (double)one[p], (double)sc[(size_t)j * cap + p]);
    }
    free(k);
    free(q);
    free(sc);
    free(one);
    free(scr);
}

static void check_values(size_t hd)
{
    size_t vs = hd + STRIDE;
    uint16_t *v = malloc(ROWS * vs * sizeof *v);
    float *w = malloc(NQ * ROWS * sizeof *w), *o = malloc(NQ * hd * sizeof *o);
    float *alone = malloc(hd * sizeof *alone);
    f16_rows(v, hd);
    for (size_t i = 0; i < NQ * ROWS; i++)
        w[i] = frand();
    float *os[NQ];
    const float *ws[NQ];
    for (int j = 0; j < NQ; j++) {
        os[j] = o + (size_t)j * hd;
        ws[j] = w + (size_t)j * ROWS;
        for (size_t i = 0; i < hd; i++)
            os[j][i] = frand();
    }
    float *start = malloc(NQ * hd * sizeof *start);
    memcpy(start, o, NQ * hd * sizeof *o);
    attk_values_f16(os, ws, NQ, v, vs, ROWS, hd);
    for (int j = 0; j < NQ; j++) {
        memcpy(alone, start + (size_t)j * hd, hd * sizeof *alone);
        float *ao = alone;
        attk_values_f16(&ao, &ws[j], 1, v, vs, ROWS, hd);
        for (size_t i = 0; i < hd; i++) {
            double ref = start[(size_t)j * hd + i], mag = fabs(ref);
            for (size_t p = 0; p < ROWS; p++) {
                double x = (double)ws[j][p] * quant_f16_to_f32(v[p * vs + i]);
                ref += x;
                mag += fabs(x);
            }
            cr_assert(fabs(os[j][i] - ref) <= 1e-5 * mag, "hd %zu q %d i %zu: %g vs %g", hd, j, i,
                      (double)os[j][i], ref);
            cr_assert(alone[i] == os[j][i], "hd %zu q %d i %zu alone: %a vs %a", hd, j, i,
                      (double)alone[i], (double)os[j][i]);
        }
    }
    free(v);
    free(w);
    free(o);
    free(alone);
    free(start);
}

static void check_softmax_helpers(void)
{
    float s[37], ref[37];
    for (int n = 0; n <= 37; n += 37) {
        for (int i = 0; i < 37; i++)
            s[i] = ref[i] = frand() * 30.0f;
        float mx = attk_scale_max(s, (size_t)n, 0.125f), rm = -INFINITY;
        for (int i = 0; i < n; i++) {
            ref[i] *= 0.125f;
            rm = ref[i] > rm ? ref[i] : rm;
            cr_assert(s[i] == ref[i]);
        }
        cr_assert(mx == rm, "max %g vs %g", (double)mx, (double)rm);
    }
    for (int i = 0; i < 37; i++)
        s[i] = ref[i] = fabsf(frand()) * (i % 3 ? 1.0f : 1e-6f);
    attk_mul_round_f16(s, 37, 0.37f);
    for (int i = 0; i < 37; i++)
        cr_assert(s[i] == quant_f16_to_f32(quant_f32_to_f16(ref[i] * 0.37f)), "%d: %a", i,
                  (double)s[i]);
}

static const size_t head_dims[] = {64, 80, 128, 256};

static void check_all(void)
{
    for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; i++) {
        check_scores(head_dims[i]);
        check_values(head_dims[i]);
    }
    check_softmax_helpers();
}

Test(attk, portable_matches_float64_and_groups_give_the_same_bits)
{
    cr_assert(isa_ok(QUANT_ISA_PORTABLE));
    check_all();
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(attk, avx2_matches_float64_and_groups_give_the_same_bits)
{
    if (!isa_ok(QUANT_ISA_AVX2))
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_all();
    quant_isa_set(QUANT_ISA_AUTO);
}

Test(attk, avx512_matches_float64_and_groups_give_the_same_bits)
{
    if (!isa_ok(QUANT_ISA_AVX512))
        cr_skip_test("CPU lacks AVX-512 (F, BW, VL, VNNI)");
    check_all();
    quant_isa_set(QUANT_ISA_AUTO);
}

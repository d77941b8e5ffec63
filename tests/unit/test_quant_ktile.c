/* Unit tests for quant's K-quant tiles and decode kernels (Q4_K, Q6_K): every tile shape, on every ISA, gives each (row, token) the portable integer dot bit for bit; and Q8_0's decode kernels give each row the one-row kernel's result, its AVX2 kernels the portable dot's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/wtype.h"
#include "testutil.h"

static uint64_t st = 0x2545f4914f6cdd1dull;
static float frand(void)
{
    return tu_frand(&st);
}

enum {
    KT_ROWS = 35, /* past two 16-row tiles */
    KT_TOK = 41,  /* past a 32-token call and its 8-token passes */
    KT_BLK = 9,   /* past the repack chunks (6 and 3 blocks) and decode's 8 */
};

/* Q4_K or Q6_K rows: random bytes (every pattern is a valid block) but for finite F16
 * factors; trial 0 sets every value and Q4_K scale and min to its largest (Q6_K: 31, scales
 * -128 and 127 alternating), the integer sums' worst case */
static void kt_rows(uint32_t type, uint8_t *w, size_t nrow, size_t rb, int trial)
{
    int q6 = type == GGUF_T_Q6_K;
    size_t bb = q6 ? 210 : 144;
    for (size_t i = 0; i < nrow * rb; i++)
        w[i] = trial == 0 ? 0xff : (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t b = 0; b < nrow * rb / bb; b++) {
        for (int j = 0; j < (q6 ? 1 : 2); j++) {
            uint16_t h = quant_f32_to_f16(frand() * 0.05f);
            memcpy(w + b * bb + (q6 ? 208 : 2 * j), &h, 2);
        }
        for (int j = 0; q6 && trial == 0 && j < 16; j++)
            w[b * bb + 192 + j] = j % 2 ? 0x7f : 0x80;
    }
}

/* Tiles of 1..KT_ROWS rows x 1..KT_TOK tokens (a sample of the shapes: every one up to 18 x 10
 * and those at the tiles' edges), rows a stride apart wider than the dot (gap: one block more)
 * or end to end (the decode kernels' prefetch of the rows ahead), against the portable dot of
 * each (row, token). */
static void check_k_tiles_gap(uint32_t type, quant_isa_t isa, int gap)
{
    const size_t n = KT_BLK * 256,
                 rb = quant_row_bytes(type, n) + (gap ? quant_row_bytes(type, 256) : 0);
    const size_t ab = quant_act_bytes(QUANT_ACT_Q8K, n);
    uint8_t *w = malloc(KT_ROWS * rb), *xq = malloc(KT_TOK * ab);
    float *x = malloc(n * sizeof(float)), *out = malloc(KT_ROWS * KT_TOK * sizeof(float));
    float *ref = malloc(KT_ROWS * KT_TOK * sizeof(float));
    static const int rs[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                             12, 13, 14, 15, 16, 17, 18, 31, 32, 33, 35};
    static const int xs_n[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 41};
    for (int trial = 0; trial < 3; trial++) {
        kt_rows(type, w, KT_ROWS, rb, trial);
        const void *xs[KT_TOK];
        for (int j = 0; j < KT_TOK; j++) {
            for (size_t i = 0; i < n; i++) /* trial 0: activations at -127 and +127 */
                x[i] = trial == 0 ? (j % 2 ? -1.0f : 1.0f) : frand() * (float)(1 + j % 5);
            if (trial == 0 && j % 3 == 2)
                for (size_t i = 0; i < n; i++)
                    x[i] = i % 3 ? 1.0f : -1.0f;
            quant_act_from_f32(QUANT_ACT_Q8K, x, xq + j * ab, n);
            xs[j] = xq + j * ab;
        }
        for (int r = 0; r < KT_ROWS; r++)
            for (int j = 0; j < KT_TOK; j++)
                ref[r * KT_TOK + j] = quant_vdot_portable(type, w + r * rb, xs[j], n);
        quant_isa_set(isa);
        for (size_t ri = 0; ri < sizeof rs / sizeof rs[0]; ri++)
            for (size_t xi = 0; xi < sizeof xs_n / sizeof xs_n[0]; xi++) {
                int nr = rs[ri], nx = xs_n[xi];
                if (nr > 18 && nx < 8 && nx != 1)
                    continue;
                quant_vdot_tile(type, w, rb, nr, xs, nx, n, out);
                for (int r = 0; r < nr; r++)
                    for (int j = 0; j < nx; j++)
                        cr_assert_eq(memcmp(&ref[r * KT_TOK + j], &out[r * nx + j], 4), 0,
                                     "%s %s trial %d %dx%d (%d,%d): %.9g vs portable %.9g",
                                     quant_isa_name(isa), gguf_ttype_name(type), trial, nr, nx, r,
                                     j, (double)out[r * nx + j], (double)ref[r * KT_TOK + j]);
            }
        quant_isa_set(QUANT_ISA_AUTO);
    }
    free(w);
    free(xq);
    free(x);
    free(out);
    free(ref);
}

static void check_k_tiles(uint32_t type, quant_isa_t isa)
{
    check_k_tiles_gap(type, isa, 1);
    check_k_tiles_gap(type, isa, 0);
}

Test(quant_ktile, k_quant_tiles_of_every_shape_equal_the_portable_dot_on_avx512)
{
    if (quant_isa_set(QUANT_ISA_AVX512) != QUANT_ISA_AVX512)
        cr_skip_test("CPU lacks AVX-512 (F, BW, VL, VNNI)");
    check_k_tiles(GGUF_T_Q4_K, QUANT_ISA_AVX512);
    check_k_tiles(GGUF_T_Q6_K, QUANT_ISA_AVX512);
}

Test(quant_ktile, k_quant_tiles_of_every_shape_equal_the_portable_dot_on_avx_vnni)
{
    if (quant_isa_set(QUANT_ISA_AVX2_VNNI) != QUANT_ISA_AVX2_VNNI)
        cr_skip_test("CPU lacks AVX-VNNI");
    check_k_tiles(GGUF_T_Q4_K, QUANT_ISA_AVX2_VNNI);
    check_k_tiles(GGUF_T_Q6_K, QUANT_ISA_AVX2_VNNI);
}

Test(quant_ktile, k_quant_tiles_of_every_shape_equal_the_portable_dot_on_avx2)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_k_tiles(GGUF_T_Q4_K, QUANT_ISA_AVX2);
    check_k_tiles(GGUF_T_Q6_K, QUANT_ISA_AVX2);
}

Test(quant_ktile, k_quant_tiles_on_the_portable_kernels_equal_the_portable_dot)
{
    check_k_tiles(GGUF_T_Q4_K, QUANT_ISA_PORTABLE);
    check_k_tiles(GGUF_T_Q6_K, QUANT_ISA_PORTABLE);
}

/* Q8_0 decode (AVX2 and AVX-VNNI: eight rows at a time from 16 rows on) gives every row the
 * one-row kernel's result bit for bit, for every row count up to KT_ROWS, rows end to end or a
 * block apart; random blocks (values include -128) and activations, and the +-127 extremes. */
static void check_q8_0_rows(quant_isa_t isa)
{
    const size_t n = 63 * 32, ab = quant_act_bytes(QUANT_ACT_Q8, n);
    for (int gap = 0; gap < 2; gap++) {
        const size_t rb = quant_row_bytes(GGUF_T_Q8_0, n) + (gap ? 34 : 0);
        uint8_t *w = malloc(KT_ROWS * rb), *xq = malloc(ab);
        float *x = malloc(n * sizeof(float)), out[KT_ROWS];
        for (int trial = 0; trial < 3; trial++) {
            for (size_t i = 0; i < KT_ROWS * rb; i++)
                w[i] = (uint8_t)(frand() * 128.0f + 128.0f);
            for (size_t b = 0; b < KT_ROWS * rb / 34; b++) {
                uint16_t h = quant_f32_to_f16(frand() * 0.05f);
                memcpy(w + b * 34, &h, 2);
            }
            for (size_t i = 0; i < n; i++)
                x[i] = trial == 0 ? (i % 3 ? 1.0f : -1.0f) : frand() * (float)(1 + trial);
            quant_act_from_f32(QUANT_ACT_Q8, x, xq, n);
            const void *xs[1] = {xq};
            quant_isa_set(isa);
            for (int nr = 1; nr <= KT_ROWS; nr++) {
                quant_vdot_tile(GGUF_T_Q8_0, w, rb, nr, xs, 1, n, out);
                for (int r = 0; r < nr; r++) {
                    float one;
                    quant_vdot_tile(GGUF_T_Q8_0, w + r * rb, rb, 1, xs, 1, n, &one);
                    cr_assert_eq(memcmp(&one, &out[r], 4), 0,
                                 "%s gap %d trial %d %d rows (%d): %.9g vs %.9g",
                                 quant_isa_name(isa), gap, trial, nr, r, (double)out[r],
                                 (double)one);
                }
            }
            quant_isa_set(QUANT_ISA_AUTO);
        }
        free(w);
        free(xq);
        free(x);
    }
}

Test(quant_ktile, q8_0_decode_rows_equal_the_one_row_kernel_on_avx2)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    check_q8_0_rows(QUANT_ISA_AVX2);
}

Test(quant_ktile, q8_0_decode_rows_equal_the_one_row_kernel_on_avx_vnni)
{
    if (quant_isa_set(QUANT_ISA_AVX2_VNNI) != QUANT_ISA_AVX2_VNNI)
        cr_skip_test("CPU lacks AVX-VNNI");
    check_q8_0_rows(QUANT_ISA_AVX2_VNNI);
}

/* Q8_0 on the AVX2 kernels takes the portable dot's order: the one-row kernel (1 to 4 tokens),
 * the prefill tile (8 rows x 4 tokens, its remainders by the one-row kernel) and the decode
 * kernel (8 rows at a time from 16 rows on) give every (row, token) quant_vdot_portable's result
 * bit for bit; random blocks, every value -128 against activations at the +-127 extremes, odd
 * row counts, rows of 1 to 301 blocks. */
Test(quant_ktile, q8_0_avx2_kernels_equal_the_portable_dot_bit_for_bit)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    enum {
        NR = 19,
        NX = 7
    };
    static const size_t nbs[] = {1, 3, 17, 64, 301};
    static const int nrs[] = {1, 3, 7, 8, 9, 16, 17, 19};
    for (size_t bi = 0; bi < sizeof nbs / sizeof nbs[0]; bi++) {
        const size_t n = nbs[bi] * 32, rb = quant_row_bytes(GGUF_T_Q8_0, n);
        const size_t ab = quant_act_bytes(QUANT_ACT_Q8, n);
        uint8_t *w = malloc(NR * rb), *xq = malloc(NX * ab);
        float *x = malloc(n * sizeof(float)), ref[NR * NX], out[NR * NX];
        for (int trial = 0; trial < 3; trial++) {
            for (size_t i = 0; i < NR * rb; i++)
                w[i] = trial == 0 ? 0x80 : (uint8_t)(frand() * 128.0f + 128.0f);
            for (size_t b = 0; b < NR * rb / 34; b++) {
                uint16_t h = quant_f32_to_f16(frand() * 0.05f);
                memcpy(w + b * 34, &h, 2);
            }
            const void *xs[NX];
            for (int j = 0; j < NX; j++) {
                for (size_t i = 0; i < n; i++)
                    x[i] = trial < 2 && (trial == 0 || j % 2) ? ((i + (size_t)j) % 3 ? 1.0f : -1.0f)
                                                              : frand() * (float)(1 + j);
                quant_act_from_f32(QUANT_ACT_Q8, x, xq + j * ab, n);
                xs[j] = xq + j * ab;
            }
            for (int r = 0; r < NR; r++)
                for (int j = 0; j < NX; j++)
                    ref[r * NX + j] = quant_vdot_portable(GGUF_T_Q8_0, w + r * rb, xs[j], n);
            quant_isa_set(QUANT_ISA_AVX2);
            for (size_t ri = 0; ri < sizeof nrs / sizeof nrs[0]; ri++)
                for (int nx = 1; nx <= NX; nx++) {
                    int nr = nrs[ri];
                    quant_vdot_tile(GGUF_T_Q8_0, w, rb, nr, xs, nx, n, out);
                    for (int r = 0; r < nr; r++)
                        for (int j = 0; j < nx; j++)
                            cr_assert_eq(memcmp(&ref[r * NX + j], &out[r * nx + j], 4), 0,
                                         "%zu blocks trial %d %dx%d (%d,%d): %.9g vs %.9g", nbs[bi],
                                         trial, nr, nx, r, j, (double)out[r * nx + j],
                                         (double)ref[r * NX + j]);
                }
            quant_isa_set(QUANT_ISA_AUTO);
        }
        free(w);
        free(xq);
        free(x);
    }
}

/* Q8_0's AVX2 prefill tile on rows of more blocks than its table of the rows' d holds (2048:
 * gathered a block at a time instead) gives every (row, token) the one-row kernel's result bit
 * for bit (an 8-row tile and a last row). */
Test(quant_ktile, q8_0_tiles_of_long_rows_equal_the_one_row_kernel_on_avx2)
{
    if (quant_isa_set(QUANT_ISA_AVX2) != QUANT_ISA_AVX2)
        cr_skip_test("CPU lacks AVX2/FMA/F16C");
    enum {
        NR = 9,
        NX = 6
    };
    const size_t n = 2050 * 32, rb = quant_row_bytes(GGUF_T_Q8_0, n);
    const size_t ab = quant_act_bytes(QUANT_ACT_Q8, n);
    uint8_t *w = malloc(NR * rb), *xq = malloc(NX * ab);
    float *x = malloc(n * sizeof(float)), out[NR * NX];
    for (size_t i = 0; i < NR * rb; i++)
        w[i] = (uint8_t)(frand() * 128.0f + 128.0f);
    for (size_t b = 0; b < NR * rb / 34; b++) {
        uint16_t h = quant_f32_to_f16(frand() * 0.05f);
        memcpy(w + b * 34, &h, 2);
    }
    const void *xs[NX];
    for (int j = 0; j < NX; j++) {
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * (float)(1 + j);
        quant_act_from_f32(QUANT_ACT_Q8, x, xq + j * ab, n);
        xs[j] = xq + j * ab;
    }
    quant_isa_set(QUANT_ISA_AVX2);
    quant_vdot_tile(GGUF_T_Q8_0, w, rb, NR, xs, NX, n, out);
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < NX; j++) {
            float one;
            quant_vdot_tile(GGUF_T_Q8_0, w + r * rb, rb, 1, &xs[j], 1, n, &one);
            cr_assert_eq(memcmp(&one, &out[r * NX + j], 4), 0, "(%d,%d): %.9g vs %.9g", r, j,
                         (double)out[r * NX + j], (double)one);
        }
    quant_isa_set(QUANT_ISA_AUTO);
    free(w);
    free(xq);
    free(x);
}

/* Unit tests for quant's K-quant prefill tiles (Q4_K, Q6_K): every tile shape, on every ISA, gives each (row, token) the portable integer dot bit for bit. */
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
 * and those at the tiles' edges), rows a stride apart wider than the dot, against the portable
 * dot of each (row, token). */
static void check_k_tiles(uint32_t type, quant_isa_t isa)
{
    const size_t n = KT_BLK * 256, rb = quant_row_bytes(type, n) + quant_row_bytes(type, 256);
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

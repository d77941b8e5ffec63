/* cuda_decode_check: the CUDA block-type decoders (daemon/backend/cuda/cuda_quant.cuh) compiled on the host and checked against quant_row_to_f32 bit for bit, for machines without a GPU. */
/*
 * The CUDA intrinsics the decoders use are given host meanings that keep
 * their rounding: __fmul_rn / __fsub_rn round each product and difference
 * on its own (volatile keeps the compiler from fusing them), f16_to_f32 is
 * quant's exact conversion, __byte_perm picks one byte as the device's does
 * for selectors 0..7 (the upper bytes of its result, which the decoders
 * drop, are left 0). Every type of QK_TYPES, every 8-element chunk
 * of 64 rows of 1024 elements: rows made by quant's quantizer, then the
 * same rows as random bytes (every scale and value bit pattern). Exit 0
 * when no value differs; prints one line per type.
 * Build: c++ -std=c++17 -iquote daemon this file quant*.o wtype.o (see
 * tests/integration/test_cuda_decode.sh).
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "kernels/quant.h"
#include "kernels/wtype.h"
}

#define __host__
#define __device__
#define __forceinline__ inline
#define __constant__ static
static inline float f16_to_f32(uint16_t h)
{
    return quant_f16_to_f32(h);
}
static inline float __fmul_rn(float a, float b)
{
    volatile float r = a * b;
    return r;
}
static inline float __fsub_rn(float a, float b)
{
    volatile float r = a - b;
    return r;
}
/* byte s (0..7, the selector's low nibble; bit 3 would sign-replicate and
 * is never set here) of the 8 bytes y:x */
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
    const uint64_t xy = (uint64_t)y << 32 | x;
    return (uint32_t)(xy >> 8 * (s & 7)) & 0xff;
}
#define QK_DECODERS_ONLY
#include "backend/cuda/cuda_quant.cuh"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

template <int WT> static long check(const char *name, uint32_t n, int rows)
{
    const size_t rb = quant_row_bytes(WT, n);
    float *f = (float *)malloc(sizeof(float) * n * rows), *want = (float *)malloc(sizeof(float) * n);
    uint8_t *q = (uint8_t *)malloc(rb * rows);
    for (size_t i = 0; i < (size_t)n * rows; i++) {
        float u = (float)(next_u32() >> 8) / (float)(1 << 24) - 0.5f;
        /* outliers and offset sub-blocks: scales and mins of every size */
        f[i] = u * (i % 97 == 0 ? 9.0f : 1.0f) + ((i / 256) % 3 == 0 ? 0.3f : 0.0f);
    }
    quant_row_from_f32(WT, f, q, (size_t)n * rows);
    long bad = 0, checked = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (size_t i = 0; i < rb * rows; i++)
                q[i] = (uint8_t)next_u32();
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = q + r * rb;
            quant_row_to_f32(WT, row, want, n);
            for (uint32_t i = 0; i < n; i += QK_CHUNK) {
                float got[QK_CHUNK];
                qk_row8<WT>(row, i, got);
                for (int k = 0; k < QK_CHUNK; k++, checked++) {
                    const float g = got[k], w = want[i + k];
                    if (memcmp(&g, &w, sizeof g) == 0 || (std::isnan(g) && std::isnan(w)))
                        continue;
                    if (bad++ < 3)
                        printf("%s: %s rows, row %d element %u: decoder %.9g, quant %.9g\n", name,
                               pass ? "random-byte" : "quantized", r, i + k, g, w);
                }
            }
        }
    }
    printf("%-7s %ld values, %ld differ\n", name, checked, bad);
    free(f);
    free(want);
    free(q);
    return bad;
}

int main(void)
{
    long bad = 0;
#define QK_CHECK(T, B, S)                                                                          \
    if (gguf_ttype_traits(T, NULL, NULL) != 0 || quant_row_bytes(T, 1024) != 1024 / (B) * (S)) {   \
        printf("%s: QK_TYPES says %d elements in %d bytes, wtype disagrees\n",                      \
               gguf_ttype_name(T), B, S);                                                          \
        bad++;                                                                                     \
    }                                                                                              \
    bad += check<T>(gguf_ttype_name(T), 1024, 64);
    QK_TYPES(QK_CHECK)
#undef QK_CHECK
    printf("cuda_decode_check: %s\n", bad ? "FAIL" : "ok, every decoder equals quant_row_to_f32");
    return bad != 0;
}

/* quant: weight-type conversions (F16, BF16, Q8_0) and the SIMD dot/row kernels. */
#ifndef QUANT_H
#define QUANT_H

#include <stddef.h>
#include <stdint.h>

#define QUANT_Q8_0_BLOCK 32

/* One Q8_0 block: 32 int8 weights sharing an F16 scale (34 bytes, as ggml). */
typedef struct quant_block_q8_0 {
    uint16_t d;      /* scale, IEEE half */
    int8_t qs[QUANT_Q8_0_BLOCK];
} quant_block_q8_0_t;

/* Instruction-set choice for the kernels. AUTO picks the best the CPU has
 * (AVX2+FMA+F16C) at first use; PORTABLE forces the plain C kernels. */
typedef enum quant_isa {
    QUANT_ISA_AUTO = 0,
    QUANT_ISA_PORTABLE = 1,
    QUANT_ISA_AVX2 = 2,
} quant_isa_t;

/* Select kernels; returns the ISA actually in use (AVX2 falls back to
 * PORTABLE when the CPU lacks it). Not thread-safe: call before work starts. */
quant_isa_t quant_isa_set(quant_isa_t want);
quant_isa_t quant_isa_get(void);
const char *quant_isa_name(quant_isa_t isa);

float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);   /* round to nearest even */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);  /* round to nearest even, NaN kept */

/* Weight types the engine computes with (gguf_ttype_t values). */
int quant_type_supported(uint32_t type);
/* Bytes of a row of n elements; 0 if n is not a whole number of blocks. */
size_t quant_row_bytes(uint32_t type, size_t n);

/* Convert n floats into a row of the given type (n a multiple of the block). */
void quant_row_from_f32(uint32_t type, const float *x, void *dst, size_t n);
/* Expand a row of the given type into n floats. */
void quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n);

/* dot(w_row, x) for a weight row of the given type and an F32 vector, F32
 * accumulation. */
float quant_dot(uint32_t type, const void *w, const float *x, size_t n);

#define QUANT_DOTN_MAX 4
/* nx (1..QUANT_DOTN_MAX) dots of one weight row against vectors x[0..nx-1]:
 * the row is loaded and converted once. out[j] is bit-identical to
 * quant_dot(type, w, x[j], n), so batching never changes results. */
void quant_dotn(uint32_t type, const void *w, const float *const *x, int nx, size_t n, float *out);

/* The GEMM tile: nr consecutive weight rows (row_bytes apart) against nx
 * vectors, out[r * nx + t]; nr * nx <= QUANT_TILE_MAX is the fast path
 * (larger shapes work, pair by pair). Every out[r * nx + t] is bit-identical
 * to quant_dot of that row and vector. */
#define QUANT_TILE_MAX 8
void quant_dot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const float *const *x,
                    int nx, size_t n, float *out);

/* Plain F32 kernels used by the forward pass. */
float quant_dot_f32(const float *a, const float *b, size_t n);
/* y[i] += a * x[i] */
void quant_axpy_f32(float *y, float a, const float *x, size_t n);

#endif

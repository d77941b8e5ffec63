/* quant: weight formats (F32, F16, BF16, the legacy, K and IQ4 block quants), their conversions and the dot kernels. */
#ifndef QUANT_H
#define QUANT_H

#include <stddef.h>
#include <stdint.h>

#define QUANT_Q8_0_BLOCK 32

/* The 16 levels of IQ4_NL and IQ4_XS (a non-uniform 4-bit grid), as an
 * initializer: quant.c's table and the CUDA backend's constant table. */
#define QUANT_IQ4_GRID                                                                             \
    {                                                                                              \
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113                   \
    }

/* One Q8_0 block: 32 int8 weights sharing an F16 scale (34 bytes, as ggml). */
typedef struct quant_block_q8_0 {
    uint16_t d; /* scale, IEEE half */
    int8_t qs[QUANT_Q8_0_BLOCK];
} quant_block_q8_0_t;

/* Instruction-set choice for the kernels. AUTO picks the best the CPU has
 * (AVX-512, else AVX2+FMA+F16C with AVX-VNNI, else AVX2) at first use; PORTABLE forces the
 * plain C kernels. */
typedef enum quant_isa {
    QUANT_ISA_AUTO = 0,
    QUANT_ISA_PORTABLE = 1,
    QUANT_ISA_AVX2 = 2,
    QUANT_ISA_AVX2_VNNI = 3, /* AVX2 plus AVX-VNNI's vpdpbusd for the int8 dots */
    QUANT_ISA_AVX512 = 4, /* AVX-512 F/BW/VL/VNNI: the float tile and the Q8_0, Q4_K, Q6_K dots */
} quant_isa_t;

/* Select kernels; returns the ISA actually in use (one the CPU lacks falls
 * back to the next: AVX512 to AVX2_VNNI to AVX2 to PORTABLE; AUTO starts at
 * AVX512). Not thread-safe: call before work starts. */
quant_isa_t quant_isa_set(quant_isa_t want);
quant_isa_t quant_isa_get(void);
const char *quant_isa_name(quant_isa_t isa);
/* "auto", "avx512", "vnni", "avx2" or "portable" into *isa: 0, or -1 for anything else. */
int quant_isa_parse(const char *s, quant_isa_t *isa);

float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f); /* round to nearest even */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even, NaN kept */

/* Weight types the engine computes with (gguf_ttype_t values). */
int quant_type_supported(uint32_t type);
/* Writes the supported type names ("F32, F16, ...") into buf (cap bytes). */
void quant_type_list(char *buf, size_t cap);
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
 * vectors, out[r * nx + t]; the shapes quant_tile_shape names are the fast
 * path (others work, pair by pair), and QUANT_TILE_MAX bounds their nr * nx
 * (callers' buffers: prefill's 16 x 32). Every out[r * nx + t] is
 * bit-identical to quant_dot of that row and vector. */
#define QUANT_TILE_MAX 512
void quant_dot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const float *const *x,
                    int nx, size_t n, float *out);

/* ------------------------------------------------------------------ quantized activations
 * The fast path: the activations of a matrix product are quantized once to
 * 8-bit blocks and every weight row is dotted with them in integers (as the
 * fastest CPU engines do). Q8 blocks (32 values) serve the 32-element types,
 * Q8K blocks (256 values, with sums per 16) the K-quants and IQ4_XS. The
 * exact path (quant_dot*, F32 activations) stays as the reference. */

typedef enum quant_act {
    QUANT_ACT_F32 = 0, /* no quantization: the exact path */
    QUANT_ACT_Q8 = 1,
    QUANT_ACT_Q8K = 2,
} quant_act_t;
#define QUANT_ACT_COUNT 3

#define QUANT_K_BLOCK 256

/* 32 activations: x[i] ~= d * qs[i], d an F16 value; s ~= d * sum of qs
 * (F16, for the mins of Q4_1/Q5_1). The values are rounded as llama.cpp's
 * Q8_0/Q8_1 activations are, so results track its logits closely. */
typedef struct quant_act_q8 {
    float d;
    float s;
    int8_t qs[QUANT_Q8_0_BLOCK];
} quant_act_q8_t;

/* 256 activations: x[i] ~= d * qs[i] (the value of largest magnitude maps
 * to -127, so d may be negative, as llama.cpp's Q8_K); bsums[j] = sum of
 * qs[16j..16j+15]. */
typedef struct quant_act_q8k {
    float d;
    int8_t qs[QUANT_K_BLOCK];
    int16_t bsums[QUANT_K_BLOCK / 16];
} quant_act_q8k_t;

/* Which dot path the engine takes for quantized weights: FAST quantizes the
 * activations (types whose table entry says so), EXACT keeps F32 activations
 * for every type. Not thread-safe: call before work starts. */
typedef enum quant_path {
    QUANT_PATH_FAST = 0,
    QUANT_PATH_EXACT = 1,
} quant_path_t;
void quant_path_set(quant_path_t p);

/* The activation format the engine uses for weights of this type under the
 * current path (QUANT_ACT_F32: plain F32 vectors, quant_dot_tile). */
quant_act_t quant_act_for(uint32_t type);
/* The activation format a type's integer dot takes (QUANT_ACT_F32 if none). */
quant_act_t quant_act_of(uint32_t type);
/* The tile (rows x vectors, at most QUANT_TILE_MAX) the current kernels
 * serve best in prefill for weights of this type under the current path:
 * float tiles 4 x 3 on AVX2 (all 16 registers) and 4 x 6 on AVX-512 (its
 * accumulators named, in registers: 1.6x the 4 x 4 tile whose accumulator
 * array GCC kept in memory), Q8_0's integer tiles 2 x 4 (AVX-VNNI) and 4 x 6 (AVX-512),
 * Q4_K's and Q6_K's 16 x 32 on AVX-512 (quant_k512.c: 16 rows interleaved
 * once a call), Q4_K's 8 x 32 on AVX2 and AVX-VNNI (quant_k256.c), other
 * integer dots one row x 4; results never depend on it. */
void quant_tile_shape(uint32_t type, int *rows, int *cols);
/* Bytes of n activations in format act; 0 if n is not a whole number of blocks. */
size_t quant_act_bytes(quant_act_t act, size_t n);
/* Quantize n floats into format act (n a multiple of its block). */
void quant_act_from_f32(quant_act_t act, const float *x, void *dst, size_t n);

/* nr weight rows (row_bytes apart) against nx quantized activation rows
 * (format quant_act_of(type)), out[r * nx + t]. Each result is identical
 * whatever the tile shape. The SIMD kernels equal the portable dot bit for
 * bit for the 256-value types (prefill tiles and decode alike); for the
 * 32-value types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) they sum in float
 * lanes, within 1e-5 of the sum of |products| of it. */
void quant_vdot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const void *const *xq,
                     int nx, size_t n, float *out);
/* The portable integer dot of one row, for testing the SIMD ones. */
float quant_vdot_portable(uint32_t type, const void *w, const void *xq, size_t n);

/* Plain F32 kernels used by the forward pass. */
float quant_dot_f32(const float *a, const float *b, size_t n);
/* y[i] += a * x[i] */
void quant_axpy_f32(float *y, float a, const float *x, size_t n);
/* y[i] += a * x[i] for an F16 row x: the same results as expanding x with
 * quant_row_to_f32 and calling quant_axpy_f32. */
void quant_axpy_f16(float *y, float a, const uint16_t *x, size_t n);
/* quant_axpy_f16(y, a[p], x + p * x_stride, n) for p = 0 .. nrows - 1, in
 * that order, with the same results (the rows' sum held in registers). */
void quant_axpy_f16_rows(float *y, const float *a, const uint16_t *x, size_t x_stride, size_t nrows,
                         size_t n);
/* x[i] = e^(x[i] - mx) for i < n (mx at least every x[i]: a softmax's shift); returns their sum.
 * The SIMD path: a degree-6 polynomial after range reduction (within 1e-6 relative of expf; 0
 * below -87.3, where expf gives denormals), the sum in eight lanes. */
float quant_exp_shift(float *x, size_t n, float mx);
/* quant_axpy_f16_rows(y[j], a[j], x, x_stride, nrows, n) for j = 0 .. ny - 1, each y[j] with the
 * same results, the rows read once for them all (attention: the queries of a block share the
 * V rows). */
void quant_axpy_f16_rows_n(float *const *y, const float *const *a, int ny, const uint16_t *x,
                           size_t x_stride, size_t nrows, size_t n);

#endif

/* wtype: the tensor (weight) element types of GGUF files, ggml's numbering: one table of block size, bytes per block and name. */
#ifndef WTYPE_H
#define WTYPE_H

#include <stdint.h>

/* Tensor element types (ggml numbering). Only those listed are accepted by the
 * reader; which ones the engine computes with is quant's business. */
typedef enum gguf_ttype {
    GGUF_T_F32 = 0,
    GGUF_T_F16 = 1,
    GGUF_T_Q4_0 = 2,
    GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6,
    GGUF_T_Q5_1 = 7,
    GGUF_T_Q8_0 = 8,
    GGUF_T_Q8_1 = 9,
    GGUF_T_Q2_K = 10,
    GGUF_T_Q3_K = 11,
    GGUF_T_Q4_K = 12,
    GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14,
    GGUF_T_Q8_K = 15,
    GGUF_T_IQ2_XXS = 16,
    GGUF_T_IQ2_XS = 17,
    GGUF_T_IQ3_XXS = 18,
    GGUF_T_IQ1_S = 19,
    GGUF_T_IQ4_NL = 20,
    GGUF_T_IQ3_S = 21,
    GGUF_T_IQ2_S = 22,
    GGUF_T_IQ4_XS = 23,
    GGUF_T_I8 = 24,
    GGUF_T_I16 = 25,
    GGUF_T_I32 = 26,
    GGUF_T_I64 = 27,
    GGUF_T_F64 = 28,
    GGUF_T_IQ1_M = 29,
    GGUF_T_BF16 = 30,
    GGUF_T_TQ1_0 = 34,
    GGUF_T_TQ2_0 = 35,
    GGUF_T_MXFP4 = 39,
} gguf_ttype_t;

#define WTYPE_ERR_UNKNOWN (-5) /* = GGUF_ERR_TYPE: a type not in the table */

/* Type traits: block size (elements) and bytes per block; 0 on success,
 * WTYPE_ERR_UNKNOWN (GGUF_ERR_TYPE) for unknown types. blck, bytes may be NULL. */
int gguf_ttype_traits(uint32_t type, uint32_t *blck, uint32_t *bytes);
const char *gguf_ttype_name(uint32_t type); /* "F32", "Q8_0", "?" */

#endif

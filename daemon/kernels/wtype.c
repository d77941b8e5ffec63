/* wtype: the one table of GGUF tensor element types (block size, bytes, name). */
#include "kernels/wtype.h"

#include <stddef.h>

static const struct {
    uint32_t type, blck, bytes;
    const char *name;
} ttype_table[] = {
    {GGUF_T_F32, 1, 4, "F32"},
    {GGUF_T_F16, 1, 2, "F16"},
    {GGUF_T_Q4_0, 32, 18, "Q4_0"},
    {GGUF_T_Q4_1, 32, 20, "Q4_1"},
    {GGUF_T_Q5_0, 32, 22, "Q5_0"},
    {GGUF_T_Q5_1, 32, 24, "Q5_1"},
    {GGUF_T_Q8_0, 32, 34, "Q8_0"},
    {GGUF_T_Q8_1, 32, 36, "Q8_1"},
    {GGUF_T_Q2_K, 256, 84, "Q2_K"},
    {GGUF_T_Q3_K, 256, 110, "Q3_K"},
    {GGUF_T_Q4_K, 256, 144, "Q4_K"},
    {GGUF_T_Q5_K, 256, 176, "Q5_K"},
    {GGUF_T_Q6_K, 256, 210, "Q6_K"},
    {GGUF_T_Q8_K, 256, 292, "Q8_K"},
    {GGUF_T_I8, 1, 1, "I8"},
    {GGUF_T_I16, 1, 2, "I16"},
    {GGUF_T_I32, 1, 4, "I32"},
    {GGUF_T_I64, 1, 8, "I64"},
    {GGUF_T_F64, 1, 8, "F64"},
    {GGUF_T_BF16, 1, 2, "BF16"},
    {GGUF_T_IQ2_XXS, 256, 66, "IQ2_XXS"},
    {GGUF_T_IQ2_XS, 256, 74, "IQ2_XS"},
    {GGUF_T_IQ3_XXS, 256, 98, "IQ3_XXS"},
    {GGUF_T_IQ1_S, 256, 50, "IQ1_S"},
    {GGUF_T_IQ4_NL, 32, 18, "IQ4_NL"},
    {GGUF_T_IQ3_S, 256, 110, "IQ3_S"},
    {GGUF_T_IQ2_S, 256, 82, "IQ2_S"},
    {GGUF_T_IQ4_XS, 256, 136, "IQ4_XS"},
    {GGUF_T_IQ1_M, 256, 56, "IQ1_M"},
    {GGUF_T_TQ1_0, 256, 54, "TQ1_0"},
    {GGUF_T_TQ2_0, 256, 66, "TQ2_0"},
    {GGUF_T_MXFP4, 32, 17, "MXFP4"},
};

int gguf_ttype_traits(uint32_t type, uint32_t *blck, uint32_t *bytes)
{
    for (size_t i = 0; i < sizeof ttype_table / sizeof ttype_table[0]; i++) {
        if (ttype_table[i].type == type) {
            if (blck)
                *blck = ttype_table[i].blck;
            if (bytes)
                *bytes = ttype_table[i].bytes;
            return 0;
        }
    }
    return WTYPE_ERR_UNKNOWN;
}

const char *gguf_ttype_name(uint32_t type)
{
    for (size_t i = 0; i < sizeof ttype_table / sizeof ttype_table[0]; i++)
        if (ttype_table[i].type == type)
            return ttype_table[i].name;
    return "?";
}

/* Unit tests for model: which weight types a file may hold, and how one the engine does not compute with is refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "testutil.h"

Test(model, refuses_every_unimplemented_weight_type_naming_the_tensor_and_the_type)
{
    static const uint32_t refused[] = {GGUF_T_IQ2_XXS, GGUF_T_IQ2_XS, GGUF_T_IQ3_XXS,
                                       GGUF_T_IQ1_S,   GGUF_T_IQ3_S,  GGUF_T_IQ2_S,
                                       GGUF_T_IQ1_M,   GGUF_T_TQ1_0,  GGUF_T_TQ2_0,
                                       GGUF_T_MXFP4,   GGUF_T_Q8_1,   GGUF_T_Q8_K};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        uint32_t t = refused[i];
        cr_assert_not(quant_type_supported(t), "%s", gguf_ttype_name(t));
        char path[256], err[512], want[128];
        tu_tiny_model_file(path, sizeof path, GGUF_T_Q4_K, 0, 256, 512, "blk.1.ffn_up.weight", t);
        model_t *m = model_open(path, err, sizeof err);
        unlink(path);
        cr_assert_null(m, "%s was accepted", gguf_ttype_name(t));
        snprintf(want, sizeof want, "tensor 'blk.1.ffn_up.weight' has type %s, which is not supported",
                 gguf_ttype_name(t));
        cr_assert(strstr(err, want) != NULL, "%s: %s", gguf_ttype_name(t), err);
        cr_assert(strstr(err, "IQ4_XS") != NULL, "the supported types are listed: %s", err);
    }
}

Test(model, opens_a_file_that_mixes_block_types_per_tensor)
{
    char path[256], err[512];
    tu_tiny_model_file(path, sizeof path, GGUF_T_Q4_K, 1, 256, 512, "blk.0.ffn_down.weight",
                       GGUF_T_Q6_K);
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(m->w.layers[0].w_down.type, GGUF_T_Q6_K);
    cr_assert_eq(m->w.layers[0].w_up.type, GGUF_T_Q4_K);
    cr_assert_eq(m->w.layers[1].w_down.type, GGUF_T_Q4_K);
    model_close(m);
}

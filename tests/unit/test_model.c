/* Unit tests for model: which weight types a file may hold, and how one the engine does not compute with is refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/model.h"
#include "kernels/quant.h"
#include "testutil.h"

Test(model, refuses_every_unimplemented_weight_type_naming_the_tensor_and_the_type)
{
    static const uint32_t refused[] = {GGUF_T_IQ2_XXS, GGUF_T_IQ2_XS, GGUF_T_IQ3_XXS, GGUF_T_IQ1_S,
                                       GGUF_T_IQ3_S,   GGUF_T_IQ2_S,  GGUF_T_IQ1_M,   GGUF_T_TQ1_0,
                                       GGUF_T_TQ2_0,   GGUF_T_MXFP4,  GGUF_T_Q8_1,    GGUF_T_Q8_K};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        uint32_t t = refused[i];
        cr_assert_not(quant_type_supported(t), "%s", gguf_ttype_name(t));
        char path[256], err[512], want[128];
        tu_tiny_model_file(path, sizeof path, GGUF_T_Q4_K, 0, 256, 512, "blk.1.ffn_up.weight", t);
        model_t *m = model_open(path, err, sizeof err);
        unlink(path);
        cr_assert_null(m, "%s was accepted", gguf_ttype_name(t));
        snprintf(want, sizeof want,
                 "tensor 'blk.1.ffn_up.weight' has type %s, which is not supported",
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

Test(model, counts_tensors_per_type_and_weight_bytes_per_parameter)
{
    /* llama, d 256, ff 512, 2 layers, vocab 300: token_embd and output, 7
     * matrices a layer (Q4_K but blk.0.ffn_down Q6_K), 2 norms a layer and
     * output_norm (F32) */
    char path[256], err[512];
    tu_tiny_model_file(path, sizeof path, GGUF_T_Q4_K, 0, 256, 512, "blk.0.ffn_down.weight",
                       GGUF_T_Q6_K);
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(m, "%s", err);
    const uint64_t d = 256, ff = 512, nv = 300, kvd = 128;
    const uint64_t layer = d * d * 2 + d * kvd * 2 + d * ff * 3, norms = 5 * d;
    cr_assert_eq(m->n_tensors_of[GGUF_T_F32], 5);
    cr_assert_eq(m->n_tensors_of[GGUF_T_Q4_K], 15);
    cr_assert_eq(m->n_tensors_of[GGUF_T_Q6_K], 1);
    uint32_t total = 0;
    for (uint32_t t = 0; t < MODEL_N_TTYPES; t++)
        total += m->n_tensors_of[t];
    cr_assert_eq(total, 21, "no other type counted: %u", total);
    cr_assert_eq(m->n_params, 2 * d * nv + 2 * layer + norms);
    const uint64_t q6 = d * ff, q4 = 2 * d * nv + 2 * layer - q6;
    cr_assert_eq(m->weight_bytes, q4 / 256 * 144 + q6 / 256 * 210 + norms * 4);
    double bpp = (double)m->weight_bytes / (double)m->n_params;
    cr_assert(bpp > 144.0 / 256 && bpp < 0.6, "%.4f bytes a parameter", bpp);
    model_close(m);
}

/* ------------------------------------------------------------------ mkmodel --type */

#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"

/* Logits of the last of 8 prompt tokens. */
static void last_logits(model_t *m, float *out)
{
    char err[256];
    be_params_t p = {.kind = BE_KIND_CPU, .threads = 1};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    fwd_t *f = fwd_new(be);
    kv_seq_t *kv = kv_seq_new(&m->hp, 16, KV_TYPE_F32);
    int32_t t[8] = {1, 17, 300, 42, 99, 250, 7, 123};
    fwd_seq_t s = {kv, t, 8, out, NULL};
    cr_assert_eq(fwd_run(f, &m->hp, &m->w, &s, 1, NULL, err, sizeof err), 0, "%s", err);
    kv_seq_free(kv);
    fwd_free(f);
    be_close(be);
}

static double rms_rel(const float *a, const float *ref, uint32_t n)
{
    double mean = 0, var = 0, e2 = 0;
    for (uint32_t i = 0; i < n; i++)
        mean += ref[i] / n;
    for (uint32_t i = 0; i < n; i++) {
        var += (ref[i] - mean) * (ref[i] - mean);
        e2 += (double)(a[i] - ref[i]) * (a[i] - ref[i]);
    }
    return sqrt(e2 / var);
}

Test(model, mkmodel_writes_every_block_type_and_recipe_the_engine_reads, .timeout = 60)
{
    static const struct {
        const char *arg;
        uint32_t main, output, ffn_down0; /* token_embd/ffn_up, output, blk.0.ffn_down */
        double twin; /* bound on rms vs the F32 twin's logits / their std (measured x 1.5:
                      * 8 random layers amplify weight error; a wrong sign or scale
                      * gives > 1.4) */
    } cases[] = {
        {"q4_0", GGUF_T_Q4_0, GGUF_T_Q4_0, GGUF_T_Q4_0, 0.7},
        {"q4_1", GGUF_T_Q4_1, GGUF_T_Q4_1, GGUF_T_Q4_1, 0.8},
        {"q5_0", GGUF_T_Q5_0, GGUF_T_Q5_0, GGUF_T_Q5_0, 0.3},
        {"q5_1", GGUF_T_Q5_1, GGUF_T_Q5_1, GGUF_T_Q5_1, 0.35},
        {"q8_0", GGUF_T_Q8_0, GGUF_T_Q8_0, GGUF_T_Q8_0, 0.05},
        {"q2_k", GGUF_T_Q2_K, GGUF_T_Q2_K, GGUF_T_Q2_K, 1.8},
        {"q3_k", GGUF_T_Q3_K, GGUF_T_Q3_K, GGUF_T_Q3_K, 1.3},
        {"q4_k", GGUF_T_Q4_K, GGUF_T_Q4_K, GGUF_T_Q4_K, 0.85},
        {"q5_k", GGUF_T_Q5_K, GGUF_T_Q5_K, GGUF_T_Q5_K, 0.35},
        {"q6_k", GGUF_T_Q6_K, GGUF_T_Q6_K, GGUF_T_Q6_K, 0.18},
        {"iq4_nl", GGUF_T_IQ4_NL, GGUF_T_IQ4_NL, GGUF_T_IQ4_NL, 0.6},
        {"iq4_xs", GGUF_T_IQ4_XS, GGUF_T_IQ4_XS, GGUF_T_IQ4_XS, 0.7},
        {"q3_k_m", GGUF_T_Q3_K, GGUF_T_Q5_K, GGUF_T_Q5_K, 1.2},
        {"q4_k_m", GGUF_T_Q4_K, GGUF_T_Q6_K, GGUF_T_Q6_K, 0.85},
        {"q5_k_m", GGUF_T_Q5_K, GGUF_T_Q6_K, GGUF_T_Q6_K, 0.3},
    };
    const char *shape = "--dim 256 --ff 512 --layers 8 --heads 4 --kv-heads 2 --vocab 320 --seed 5";
    char path[256], args[512], err[512];
    snprintf(args, sizeof args, "--type f32 %s", shape);
    tu_mkmodel(path, sizeof path, args);
    model_t *twin = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(twin, "%s", err);
    const uint32_t nv = twin->hp.n_vocab;
    float *lt = malloc(nv * sizeof(float)), *lf = malloc(nv * sizeof(float)),
          *le = malloc(nv * sizeof(float));
    last_logits(twin, lt);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "--type %s %s", cases[i].arg, shape);
        tu_mkmodel(path, sizeof path, args);
        model_t *m = model_open(path, err, sizeof err);
        unlink(path);
        cr_assert_not_null(m, "%s: %s", cases[i].arg, err);
        cr_assert_eq(m->w.tok_embd.type, cases[i].main, "%s", cases[i].arg);
        cr_assert_eq(m->w.layers[1].w_up.type, cases[i].main, "%s", cases[i].arg);
        cr_assert_eq(m->w.output.type, cases[i].output, "%s", cases[i].arg);
        cr_assert_eq(m->w.layers[0].w_down.type, cases[i].ffn_down0, "%s", cases[i].arg);
        cr_assert_eq(m->w.layers[1].w_down.type, cases[i].main, "%s: layer 1 stays", cases[i].arg);
        quant_path_set(QUANT_PATH_FAST);
        last_logits(m, lf);
        quant_path_set(QUANT_PATH_EXACT);
        last_logits(m, le);
        quant_path_set(QUANT_PATH_FAST);
        double fe = rms_rel(lf, le, nv), tw = rms_rel(le, lt, nv);
        cr_log_info("%s: fast vs exact %.2f%%, exact vs F32 twin %.1f%% of std", cases[i].arg,
                    100 * fe, 100 * tw);
        /* activation quantization, amplified by 8 random layers (<= 6% measured) */
        cr_assert_leq(fe, 0.09, "%s: fast vs exact path %.3f of std", cases[i].arg, fe);
        cr_assert_leq(tw, cases[i].twin, "%s: vs the F32 twin %.3f of std", cases[i].arg, tw);
        model_close(m);
    }
    free(lt);
    free(lf);
    free(le);
    model_close(twin);
}

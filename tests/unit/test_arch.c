/* Unit tests for the architecture table in model.c: what each architecture reads, what a strict load refuses (naming it), and the batching invariants of each architecture's forward pass. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "worker/store.h"
#include "testutil.h"

#define ARCH_SHAPE "--dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 320"

/* Writes mkmodel ARCH_SHAPE + args and opens it; NULL with err on refusal. */
static model_t *arch_open(const char *args, char *err, size_t errlen)
{
    char path[256], all[512];
    snprintf(all, sizeof all, "%s %s", ARCH_SHAPE, args);
    tu_mkmodel(path, sizeof path, all);
    model_t *m = model_open(path, err, errlen);
    unlink(path);
    return m;
}

static void assert_refused(const char *args, const char *want)
{
    char err[512] = "";
    model_t *m = arch_open(args, err, sizeof err);
    cr_assert_null(m, "%s: the file was accepted", args);
    cr_assert(strstr(err, want) != NULL, "%s: error '%s' does not name '%s'", args, err, want);
}

/* ------------------------------------------------------------------ strict loading */

Test(arch, an_unknown_architecture_is_refused_by_name)
{
    assert_refused("--arch llama --arch-name mamba", "architecture 'mamba' is not supported");
}

Test(arch, unknown_and_unimplemented_rope_scaling_types_are_refused_by_name)
{
    assert_refused("--rope-scaling bogus:2", "'llama.rope.scaling.type' = 'bogus' is unknown");
    assert_refused("--rope-scaling longrope:4",
                   "'llama.rope.scaling.type' = 'longrope' is not implemented");
    /* gemma3's local layers have their own base: YaRN there is not done */
    assert_refused("--arch gemma3 --window 4 --rope-scaling yarn:4",
                   "YaRN RoPE scaling of a gemma3 model is not implemented");
    assert_refused("--arch qwen2 --rope-scaling longrope",
                   "'qwen2.rope.scaling.type' = 'longrope' is not implemented");
}

Test(arch, an_unexpected_tensor_such_as_moe_experts_is_refused_by_name)
{
    assert_refused("--extra-tensor blk.0.ffn_gate_exps.weight",
                   "tensor 'blk.0.ffn_gate_exps.weight' is not used");
    /* qwen2 has no q/k norms: a stray one is refused, not skipped */
    assert_refused("--arch qwen2 --extra-tensor blk.1.attn_q_norm.weight",
                   "tensor 'blk.1.attn_q_norm.weight' is not used");
    /* rope_freqs belongs to llama; on qwen3 nothing would read it */
    assert_refused("--arch qwen3 --extra-tensor rope_freqs.weight",
                   "tensor 'rope_freqs.weight' is not used");
}

Test(arch, an_unknown_arch_key_or_an_expert_count_is_refused_by_name)
{
    assert_refused("--extra-u32 llama.attention.sliding_window=16",
                   "metadata key 'llama.attention.sliding_window' is not understood");
    assert_refused("--extra-u32 llama.expert_count=8", "'llama.expert_count' = 8");
    /* YaRN's tuning keys of later llama.cpp versions change the ramp: not read, so refused */
    assert_refused("--rope-scaling yarn:4 --extra-u32 llama.rope.scaling.yarn_beta_fast=16",
                   "metadata key 'llama.rope.scaling.yarn_beta_fast' is not understood");
}

Test(arch, keys_that_leave_the_math_alone_are_accepted)
{
    char err[512];
    model_t *m =
        arch_open("--extra-u32 llama.rope.scaling.original_context_length=8192", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    model_close(m);
    m = arch_open("--extra-u32 llama.expert_count=0", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    model_close(m);
    /* other namespaces (general., tokenizer.) are not the architecture's */
    m = arch_open("--extra-u32 general.quantization_version=2", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    model_close(m);
}

Test(arch, a_value_length_unlike_the_key_length_is_refused)
{
    assert_refused("--head-dim 32 --extra-u32 llama.attention.value_length=16", "value_length");
}

/* ------------------------------------------------------------------ what each arch reads */

Test(arch, llama3_rope_freqs_and_linear_scaling_are_read_as_features)
{
    char err[512];
    model_t *m = arch_open("--rope-freqs", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_not_null(m->hp.rope_freqs);
    cr_assert_eq(m->hp.feats, MODEL_FEAT_ROPE_FREQS);
    cr_assert_float_eq(m->hp.rope_freqs[0], 1.0f, 0.0f);                      /* fast pair kept */
    cr_assert_float_eq(m->hp.rope_freqs[m->hp.rope_dim / 2 - 1], 8.0f, 0.0f); /* slow pair / 8 */
    cr_assert_float_eq(m->hp.rope_freq_scale, 1.0f, 0.0f);
    model_close(m);
    m = arch_open("--rope-scaling linear:4", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.rope_freq_scale, 0.25f, 0.0f);
    cr_assert_eq(m->hp.feats, MODEL_FEAT_ROPE_LINEAR);
    model_close(m);
    /* "none" never scales, whatever the factor (as llama.cpp reads it) */
    m = arch_open("--rope-scaling none:4", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.rope_freq_scale, 1.0f, 0.0f);
    cr_assert_eq(m->hp.feats, 0);
    model_close(m);
}

Test(arch, yarn_reads_its_correction_range_and_magnitude_scale_as_llama_cpp_does)
{
    char err[512];
    /* rope_dim 16, base 10000, original context 64: the pairs turning 32
     * times (-0.99, floored and clamped to 0) and once (2.02, ceiled) */
    model_t *m = arch_open("--rope-scaling yarn:4 --rope-orig-ctx 64", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.rope_freq_scale, 0.25f, 0.0f);
    cr_assert_float_eq(m->hp.rope_ext_factor, 1.0f, 0.0f);
    cr_assert_float_eq(m->hp.rope_corr_lo, 0.0f, 0.0f);
    cr_assert_float_eq(m->hp.rope_corr_hi, 3.0f, 0.0f);
    cr_assert_float_eq(m->hp.rope_attn_factor, 1.0f + 0.1f * logf(4.0f), 1e-6f);
    cr_assert_eq(m->hp.feats,
                 MODEL_FEAT_ROPE_LINEAR | MODEL_FEAT_ROPE_YARN | MODEL_FEAT_ROPE_MSCALE);
    model_close(m);
    /* without the key the original context is context_length (2048 here:
     * 2.02 floored, 5.03 ceiled); the file's attn_factor multiplies YaRN's */
    m = arch_open("--rope-scaling yarn:4 --rope-attn-factor 2", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.rope_corr_lo, 2.0f, 0.0f);
    cr_assert_float_eq(m->hp.rope_corr_hi, 6.0f, 0.0f);
    cr_assert_float_eq(m->hp.rope_attn_factor, 2.0f * (1.0f + 0.1f * logf(4.0f)), 1e-6f);
    model_close(m);
}

Test(arch, qwen3_reads_per_head_norms_and_a_key_length_wider_than_dim_over_heads)
{
    char err[512];
    model_t *m = arch_open("--arch qwen3 --head-dim 32", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(m->hp.arch, MODEL_ARCH_QWEN3);
    cr_assert_eq(m->hp.head_dim, 32);
    cr_assert(m->hp.rope_neox);
    cr_assert_eq(m->hp.feats, MODEL_FEAT_QK_NORM);
    cr_assert_eq(m->w.layers[1].q_norm.n_in, 32);
    cr_assert_not_null(m->w.layers[1].k_norm.data);
    cr_assert_null(m->w.layers[0].bq.data);
    cr_assert_eq(m->w.layers[0].wq.n_out, 4 * 32);
    cr_assert_eq(m->w.layers[0].wo.n_in, 4 * 32);
    model_close(m);
}

Test(arch, a_backend_without_a_feature_refuses_the_model_naming_it)
{
    char err[512];
    model_t *m = arch_open("--rope-freqs --rope-scaling linear:2", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(model_feats_check(&m->hp, MODEL_FEAT_ALL, "cpu", err, sizeof err), 0);
    cr_assert_eq(model_feats_check(&m->hp, MODEL_FEAT_ROPE_LINEAR | MODEL_FEAT_QK_NORM, "cuda", err,
                                   sizeof err),
                 MODEL_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "the cuda backend cannot run this llama model") != NULL, "%s", err);
    cr_assert(strstr(err, "rope_freqs") != NULL, "%s", err);
    cr_assert(strstr(err, "linear") == NULL, "only the missing feature is named: %s", err);
    model_close(m);
}

/* ------------------------------------------------------------------ batching invariants */

/* Three sequences: one prefill, token by token, all three batched, and a
 * prefill in chunks of 5 tokens give bit-identical logits. */
static void check_batch_equals_single(const char *args)
{
    char err[512];
    model_t *m = arch_open(args, err, sizeof err);
    cr_assert_not_null(m, "%s: %s", args, err);
    be_params_t p = {.kind = BE_KIND_CPU, .threads = 2};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    fwd_t *f = fwd_new(be);
    const uint32_t nv = m->hp.n_vocab;
    int32_t toks[3][24];
    uint32_t lens[3] = {24, 2, 9};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 24; i++)
            toks[s][i] = (int32_t)((i * 37 + s * 101 + 5) % 300 + 3);
    float *single[3], *batched[3], *stepwise[3];
    for (int s = 0; s < 3; s++) {
        single[s] = malloc(nv * sizeof(float));
        batched[s] = malloc(nv * sizeof(float));
        stepwise[s] = malloc(nv * sizeof(float));
        kv_seq_t *kv = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
        fwd_seq_t sq = {kv, toks[s], lens[s], single[s], NULL};
        cr_assert_eq(fwd_run(f, &m->hp, &m->w, &sq, 1, NULL, err, sizeof err), 0, "%s", err);
        kv_seq_reset(kv);
        for (uint32_t i = 0; i < lens[s]; i++) {
            fwd_seq_t one = {kv, &toks[s][i], 1, stepwise[s], NULL};
            cr_assert_eq(fwd_run(f, &m->hp, &m->w, &one, 1, NULL, err, sizeof err), 0, "%s", err);
        }
        kv_seq_free(kv);
    }
    kv_seq_t *kvs[3];
    fwd_seq_t b[3];
    for (int s = 0; s < 3; s++) {
        kvs[s] = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
        b[s] = (fwd_seq_t){kvs[s], toks[s], lens[s], batched[s], NULL};
    }
    cr_assert_eq(fwd_run(f, &m->hp, &m->w, b, 3, NULL, err, sizeof err), 0, "%s", err);
    /* and prefilled 5 tokens a pass (chunks cross the sliding windows) */
    float *chunked[3];
    fwd_set_chunk(f, 5);
    for (int s = 0; s < 3; s++) {
        chunked[s] = malloc(nv * sizeof(float));
        kv_seq_t *kv = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
        fwd_seq_t sq = {kv, toks[s], lens[s], chunked[s], NULL};
        cr_assert_eq(fwd_run(f, &m->hp, &m->w, &sq, 1, NULL, err, sizeof err), 0, "%s", err);
        kv_seq_free(kv);
    }
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(memcmp(single[s], chunked[s], nv * sizeof(float)), 0,
                     "%s seq %d: chunked prefill logits differ", args, s);
        free(chunked[s]);
        cr_assert_eq(memcmp(single[s], batched[s], nv * sizeof(float)), 0,
                     "%s seq %d: batched logits differ from single", args, s);
        cr_assert_eq(memcmp(single[s], stepwise[s], nv * sizeof(float)), 0,
                     "%s seq %d: prefill logits differ from token-by-token", args, s);
        kv_seq_free(kvs[s]);
        free(single[s]);
        free(batched[s]);
        free(stepwise[s]);
    }
    fwd_free(f);
    be_close(be);
    model_close(m);
}

Test(arch, qwen3_batched_prefilled_and_stepwise_logits_are_identical)
{
    check_batch_equals_single("--arch qwen3 --type f16 --head-dim 32");
}

Test(arch, llama_with_rope_freqs_batched_prefilled_and_stepwise_logits_are_identical)
{
    check_batch_equals_single("--arch llama --type q8_0 --rope-freqs");
}

Test(arch, llama_with_yarn_batched_prefilled_and_stepwise_logits_are_identical)
{
    check_batch_equals_single("--arch llama --type f16 --rope-scaling yarn:4 --rope-orig-ctx 8");
}

Test(arch, gemma2_batched_prefilled_and_stepwise_logits_are_identical_through_its_window)
{
    /* 24-token sequences over a window of 8: the sliding layers drop positions */
    check_batch_equals_single("--arch gemma2 --type q8_0 --softcap 5,10 --window 8 --head-dim 32");
}

Test(arch, gemma3_batched_prefilled_and_stepwise_logits_are_identical_through_its_window)
{
    check_batch_equals_single("--arch gemma3 --type f16 --window 8 --layers 7 --rope-base 1000000 "
                              "--rope-scaling linear:8");
}

Test(arch, gemma3_reads_q_k_norms_a_local_rope_base_and_needs_its_window)
{
    char err[512];
    model_t *m = arch_open("--arch gemma3 --window 8 --rope-base 1000000", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(m->hp.swa_pattern, 6);
    cr_assert_float_eq(m->hp.rope_base_swa, 10000.0f, 0.0f);
    cr_assert_float_eq(m->hp.attn_softcap, 0.0f, 0.0f);
    cr_assert_eq(m->hp.feats,
                 MODEL_FEAT_QK_NORM | MODEL_FEAT_EMB_SCALE | MODEL_FEAT_SWA | MODEL_FEAT_GELU);
    cr_assert_not_null(m->w.layers[0].q_norm.data);
    model_close(m);
    /* gemma3 has no soft-caps: a file that says otherwise is refused */
    assert_refused("--arch gemma3 --window 8 --extra-u32 gemma3.final_logit_softcapping=30",
                   "'gemma3.final_logit_softcapping' is not understood");
}

Test(arch, phi3_batched_prefilled_and_stepwise_logits_are_identical_through_its_window)
{
    check_batch_equals_single("--arch phi3 --type q8_0 --window 8 --rope-factors");
}

Test(arch, phi3_splits_its_fused_tensors_into_row_views_and_caps_the_context_for_short_factors)
{
    char err[512];
    model_t *m =
        arch_open("--arch phi3 --type q8_0 --window 8 --rope-factors --ctx 2048", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    const model_layer_t *L = &m->w.layers[1];
    size_t rb = 68; /* Q8_0 row of 64 */
    cr_assert_eq(L->wq.n_out, 64);
    cr_assert_eq(L->wk.n_out, 32);
    cr_assert_eq(L->wv.n_out, 32);
    cr_assert_eq((const char *)L->wk.data, (const char *)L->wq.data + 64 * rb);
    cr_assert_eq((const char *)L->wv.data, (const char *)L->wk.data + 32 * rb);
    cr_assert_eq(L->wv.nbytes, 32 * rb);
    cr_assert_eq(L->w_gate.n_out, 128);
    cr_assert_eq((const char *)L->w_up.data, (const char *)L->w_gate.data + 128 * rb);
    cr_assert_eq(m->hp.swa_window, 8);
    cr_assert_eq(m->hp.swa_pattern, 0);
    cr_assert_not_null(m->hp.rope_freqs);
    /* the short factors until the context passes the original 64, then the
     * long ones (llama.cpp's choice by n_ctx) */
    cr_assert_eq(m->hp.n_ctx_train, 2048);
    const float *shortf = m->hp.rope_freqs;
    cr_assert_eq(shortf, m->hp.rope_freqs_short);
    model_set_context(m, 2048);
    cr_assert_eq(m->hp.rope_freqs, m->hp.rope_freqs_long);
    cr_assert_float_eq(m->hp.rope_freqs[7], 1.0f + 39.0f * 7.0f / 8.0f, 1e-5f);
    model_set_context(m, 64);
    cr_assert_eq(m->hp.rope_freqs, shortf);
    model_close(m);
    m = arch_open("--arch phi3 --window 8 --rope-factors --rope-attn-factor 1.19", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.rope_attn_factor, 1.19f, 0.0f);
    cr_assert(m->hp.feats & MODEL_FEAT_ROPE_MSCALE);
    model_close(m);
    /* fused only, as llama.cpp loads phi3: a separate attn_q is left over */
    assert_refused("--arch phi3 --rope-factors --extra-tensor blk.0.attn_q.weight",
                   "tensor 'blk.0.attn_q.weight' is not used");
}

Test(arch, gemma2_reads_its_soft_caps_window_and_post_norms)
{
    char err[512];
    model_t *m = arch_open("--arch gemma2 --softcap 5,10 --window 16", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_float_eq(m->hp.attn_softcap, 5.0f, 0.0f);
    cr_assert_float_eq(m->hp.final_softcap, 10.0f, 0.0f);
    cr_assert_eq(m->hp.swa_window, 16);
    cr_assert_eq(m->hp.swa_pattern, 2);
    cr_assert_float_eq(m->hp.emb_scale, 8.0f, 0.0f);
    cr_assert(m->hp.gelu && m->hp.rope_neox && m->w.tied);
    cr_assert_not_null(m->w.layers[1].post_attn_norm.data);
    cr_assert_not_null(m->w.layers[1].post_ffn_norm.data);
    cr_assert_eq(m->hp.feats,
                 MODEL_FEAT_EMB_SCALE | MODEL_FEAT_SOFTCAP | MODEL_FEAT_SWA | MODEL_FEAT_GELU);
    model_close(m);
    /* llama.cpp reads gemma2's head from token_embd: an output.weight is refused */
    assert_refused("--arch gemma2 --extra-tensor output.weight",
                   "tensor 'output.weight' is not used");
}

Test(arch, llama_with_linear_rope_batched_prefilled_and_stepwise_logits_are_identical)
{
    check_batch_equals_single("--arch llama --type bf16 --rope-scaling linear:4 --tied");
}

/* ------------------------------------------------------------------ the new cpu kernels */

static backend_t *arch_cpu(void)
{
    char err[256];
    be_params_t p = {.kind = BE_KIND_CPU, .threads = 2};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    return be;
}

Test(arch, softcap_gelu_and_scale_kernels_follow_their_formulas)
{
    backend_t *be = arch_cpu();
    float x[2][8] = {{-100, -5, -0.5f, 0, 0.25f, 3, 9.9f, 50}, {1, 2, 3, 4, 5, 6, 7, 8}};
    float x0[2][8], g[2][8], u[2][8], s[2][8];
    memcpy(x0, x, sizeof x0);
    memcpy(g, x, sizeof g);
    memcpy(s, x, sizeof s);
    for (int i = 0; i < 8; i++)
        u[0][i] = u[1][i] = 0.5f + 0.25f * (float)i;
    /* stride 8, 2 rows, the first 7 of each: the 8th stays as it was */
    cr_assert_eq(be->softcap(be->ctx, &x[0][0], 2, 7, 8, 10.0f), 0);
    cr_assert_eq(be->gelu_mul(be->ctx, &g[0][0], &u[0][0], 2, 7, 8), 0);
    cr_assert_eq(be->scale(be->ctx, &s[0][0], 2, 7, 8, 8.0f), 0);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 8; i++) {
            double v = x0[r][i];
            double cap = i < 7 ? 10.0 * tanh(v / 10.0) : v;
            double gl = i < 7 ? 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) *
                                    (0.5 + 0.25 * i)
                              : v;
            double sc = i < 7 ? 8.0 * v : v;
            cr_assert_float_eq(x[r][i], cap, 1e-5 * fmax(1, fabs(cap)), "softcap(%g)", v);
            cr_assert_float_eq(g[r][i], gl, 1e-5 * fmax(1, fabs(gl)), "gelu(%g)", v);
            cr_assert_float_eq(s[r][i], sc, 1e-6 * fmax(1, fabs(sc)), "scale(%g)", v);
        }
    }
    be_close(be);
}

/* One head of width 4 over 7 positions: the kernel against a double
 * softmax over the last `window` positions with soft-capped scores. */
static void check_attention(uint32_t window, float cap, float scale)
{
    backend_t *be = arch_cpu();
    enum {
        HD = 4,
        NCTX = 8,
        NT = 7
    };
    float k[NCTX * HD], v[NCTX * HD], q[NT * HD], out[NT * HD];
    for (int i = 0; i < NCTX * HD; i++) {
        k[i] = sinf(0.7f * (float)i) * 3.0f;
        v[i] = cosf(0.3f * (float)i);
    }
    for (int i = 0; i < NT * HD; i++)
        q[i] = cosf(1.1f * (float)i) * 2.0f;
    be_tok_t toks[NT];
    for (uint32_t t = 0; t < NT; t++)
        toks[t] = (be_tok_t){k, v, NCTX, t};
    be_att_t a = {.toks = toks,
                  .layer = 0,
                  .n_layer = 1,
                  .n_head = 1,
                  .n_head_kv = 1,
                  .head_dim = HD,
                  .stride = HD,
                  .scale = scale,
                  .softcap = cap,
                  .window = window,
                  .kv_type = KV_TYPE_F32};
    cr_assert_eq(be->attention(be->ctx, &a, q, out, NT), 0);
    for (uint32_t t = 0; t < NT; t++) {
        uint32_t p0 = window && t >= window ? t - window + 1 : 0;
        double sc[NT], mx = -INFINITY, sum = 0, o[HD] = {0};
        for (uint32_t p = p0; p <= t; p++) {
            double d = 0;
            for (int i = 0; i < HD; i++)
                d += (double)q[t * HD + i] * k[p * HD + i];
            d *= scale != 0.0f ? scale : 0.5; /* 1/sqrt(4) */
            if (cap != 0.0f)
                d = cap * tanh(d / cap);
            sc[p] = d;
            mx = fmax(mx, d);
        }
        for (uint32_t p = p0; p <= t; p++)
            sum += sc[p] = exp(sc[p] - mx);
        for (uint32_t p = p0; p <= t; p++)
            for (int i = 0; i < HD; i++)
                o[i] += sc[p] / sum * v[p * HD + i];
        for (int i = 0; i < HD; i++)
            cr_assert_float_eq(out[t * HD + i], o[i], 1e-5, "window %u cap %g: token %u dim %d",
                               window, (double)cap, t, i);
    }
    be_close(be);
}

Test(arch, attention_with_a_window_soft_cap_and_scale_matches_a_double_softmax)
{
    check_attention(0, 0.0f, 0.0f); /* plain causal, the default scale */
    check_attention(3, 0.0f, 0.0f); /* the last three positions only */
    check_attention(1, 0.0f, 0.0f); /* itself only */
    check_attention(0, 2.0f, 0.0f); /* scores soft-capped at 2 */
    check_attention(4, 1.5f, 0.3f); /* all three, with a query scale */
}

/* ------------------------------------------------------------------ the backend's features at load */

Test(arch, the_store_refuses_a_model_whose_features_the_backend_lacks_naming_them)
{
    char err[512], path[256];
    be_params_t p = {.kind = BE_KIND_SIM, .memory = 8u << 20, .page_size = 64u << 10};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    tu_mkmodel(path, sizeof path, ARCH_SHAPE " --arch gemma2 --window 16");
    store_t *s = store_new(be, 0);
    store_model_t *m = NULL;
    /* as the cuda backend declares itself: no gemma kernels */
    be->model_feats = MODEL_FEAT_ROPE_FREQS | MODEL_FEAT_ROPE_LINEAR | MODEL_FEAT_QK_NORM;
    cr_assert_eq(store_load(s, "g", path, &m, err, sizeof err), STORE_ERR_LOAD);
    cr_assert_null(m);
    cr_assert(strstr(err, "the sim backend cannot run this gemma2 model") != NULL, "%s", err);
    cr_assert(strstr(err, "soft-capping") && strstr(err, "sliding-window attention") &&
                  strstr(err, "GELU") && strstr(err, "embedding scale"),
              "%s", err);
    cr_assert_eq(store_used(s), 0);
    be->model_feats = MODEL_FEAT_ALL; /* what sim really runs */
    cr_assert_eq(store_load(s, "g", path, &m, err, sizeof err), STORE_OK, "%s", err);
    store_unload(s, m);
    unlink(path);
    store_free(s);
    be_close(be);
}

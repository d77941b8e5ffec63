/* Unit tests for mixtures of experts (issue 45): routing and gating per family against plain scalar references written here, the grouped batch path against token-by-token runs, the expert-read counter, and the refusals. */
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
#include "engine/moe.h"
#include "testutil.h"

#define MOE_SHAPE "--dim 64 --layers 2 --heads 4 --kv-heads 2 --vocab 320"

/* mkmodel arguments of each family (8 experts, top 2; qwen3moe also top 4) */
static const struct {
    const char *name, *args;
} moe_families[] = {
    {"mixtral", "--arch llama --ff 128 --experts 8 --experts-used 2 --seed 61"},
    {"qwen2moe", "--arch qwen2moe --ff 256 --experts 8 --experts-used 2 --expert-ff 64 "
                 "--shared-ff 96 --seed 62"},
    {"qwen3moe", "--arch qwen3moe --ff 256 --experts 8 --experts-used 2 --expert-ff 128 "
                 "--seed 63"},
    {"qwen3moe-top4", "--arch qwen3moe --ff 256 --experts 8 --experts-used 4 --expert-ff 64 "
                      "--seed 64"},
};
#define N_FAMILIES (sizeof moe_families / sizeof moe_families[0])

static model_t *moe_open(const char *args, const char *type, char *err, size_t errlen)
{
    char path[256], all[512];
    snprintf(all, sizeof all, "%s --type %s %s", MOE_SHAPE, type, args);
    tu_mkmodel(path, sizeof path, all);
    model_t *m = model_open(path, err, errlen);
    unlink(path);
    return m;
}

static backend_t *moe_be(int threads)
{
    char err[256];
    be_params_t p = {.kind = BE_KIND_CPU, .threads = threads};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    return be;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* ------------------------------------------------------------------ routing */

/* The gating written out plainly in double: softmax, the k largest by
 * repeated scans, their probabilities, renormalised when norm. Returns the
 * smallest gap between the k-th and the (k+1)-th probability (a tie would
 * make the choice arbitrary). */
static double ref_route(const float *l, uint32_t n, uint32_t k, int norm, uint32_t *sel, double *w)
{
    double p[256], mx = l[0], sum = 0;
    for (uint32_t e = 1; e < n; e++)
        mx = l[e] > mx ? l[e] : mx;
    for (uint32_t e = 0; e < n; e++)
        sum += p[e] = exp((double)l[e] - mx);
    int taken[256] = {0};
    for (uint32_t j = 0; j < k; j++) {
        int best = -1;
        for (uint32_t e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best]))
                best = (int)e;
        taken[best] = 1;
        sel[j] = (uint32_t)best;
        w[j] = p[best] / sum;
    }
    double gap = INFINITY;
    for (uint32_t e = 0; e < n; e++)
        if (!taken[e])
            gap = fmin(gap, (w[k - 1] - p[e] / sum));
    if (norm) {
        double s = 0;
        for (uint32_t j = 0; j < k; j++)
            s += w[j];
        for (uint32_t j = 0; j < k; j++)
            w[j] /= s;
    }
    return gap;
}

Test(moe, routing_takes_the_top_k_of_a_softmax_over_every_expert_as_a_scalar_reference_does)
{
    static const uint32_t shapes[][2] = {{8, 1}, {8, 2}, {8, 8}, {60, 4}, {128, 8}, {256, 8}};
    uint64_t s = 7;
    float l[256], w[8];
    uint32_t sel[8], rsel[8];
    double rw[8];
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        uint32_t n = shapes[c][0], k = shapes[c][1];
        for (int norm = 0; norm < 2; norm++) {
            for (int trial = 0; trial < 200; trial++) {
                for (uint32_t e = 0; e < n; e++)
                    l[e] = (float)((double)lcg(&s) / 2147483648.0 * 8.0 - 4.0);
                double gap = ref_route(l, n, k, norm, rsel, rw);
                moe_route(l, n, k, norm, sel, w);
                if (gap < 1e-5)
                    continue; /* a near tie: either choice is right */
                double wsum = 0;
                for (uint32_t j = 0; j < k; j++) {
                    cr_assert_eq(sel[j], rsel[j], "%u experts top %u norm %d: slot %u", n, k, norm,
                                 j);
                    cr_assert(fabs(w[j] - rw[j]) <= 1e-6 * fmax(1e-3, rw[j]),
                              "%u/%u norm %d: weight %g, reference %g", n, k, norm, (double)w[j],
                              rw[j]);
                    wsum += w[j];
                }
                if (norm)
                    cr_assert(fabs(wsum - 1.0) < 1e-6, "renormalised weights sum to %g", wsum);
            }
        }
    }
}

Test(moe, a_plan_groups_every_selection_once_by_expert_with_its_slot_and_weight)
{
    const uint32_t n_tok = 37, k = 3, n_exp = 16, slots = 4;
    uint32_t sel[37 * 3];
    float w[37 * 3];
    uint64_t s = 11;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t j = 0; j < k; j++) {
            uint32_t e;
            int dup;
            do { /* distinct experts per token, as routing gives */
                e = (uint32_t)(lcg(&s) % n_exp);
                dup = 0;
                for (uint32_t i = 0; i < j; i++)
                    dup |= sel[t * k + i] == e;
            } while (dup);
            sel[t * k + j] = e;
            w[t * k + j] = (float)(t * k + j);
        }
    moe_plan_t p = {0};
    cr_assert_eq(moe_plan_build(&p, sel, w, n_tok, k, n_exp, slots), MOE_OK);
    cr_assert_eq(p.start[p.n_groups], n_tok * k);
    int seen[37 * 3] = {0};
    for (uint32_t g = 0; g < p.n_groups; g++) {
        cr_assert(g == 0 || p.expert[g] > p.expert[g - 1], "groups ascend by expert");
        cr_assert_gt(p.start[g + 1], p.start[g], "no empty group");
        for (uint32_t i = p.start[g]; i < p.start[g + 1]; i++) {
            uint32_t t = p.tok[i], j = p.dst[i] - t * slots;
            cr_assert(i == p.start[g] || t > p.tok[i - 1], "tokens ascend within a group");
            cr_assert_lt(j, k);
            cr_assert_eq(sel[t * k + j], p.expert[g]);
            cr_assert_eq(p.w[i], w[t * k + j]);
            seen[t * k + j]++;
        }
    }
    for (uint32_t i = 0; i < n_tok * k; i++)
        cr_assert_eq(seen[i], 1, "selection %u placed %d times", i, seen[i]);
    sel[5] = n_exp;
    cr_assert_eq(moe_plan_build(&p, sel, w, n_tok, k, n_exp, slots), MOE_ERR_ARG);
    cr_assert_eq(moe_plan_build(&p, sel, w, n_tok, k, n_exp, k - 1), MOE_ERR_ARG);
    moe_plan_free(&p);
}

/* ------------------------------------------------------------------ one token against a scalar pass */

static const float *row_of(const model_weight_t *w, uint32_t r)
{
    return (const float *)w->data + (size_t)r * w->n_in;
}

static double dotd(const float *a, const double *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += (double)a[i] * x[i];
    return s;
}

static void rmsnorm_d(const double *x, const model_weight_t *w, uint32_t n, float eps, double *o)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        o[i] = x[i] * r * ((const float *)w->data)[i];
}

static double silu_d(double x)
{
    return x / (1.0 + exp(-x));
}

/* y += scale * down(silu(gate h) * up h) for one expert's (F32) matrices */
static void swiglu_d(const model_weight_t *g, const model_weight_t *u, const model_weight_t *dn,
                     uint32_t r0, uint32_t ff, const double *h, uint32_t d, double scale, double *y)
{
    double *a = malloc(ff * sizeof *a);
    for (uint32_t i = 0; i < ff; i++)
        a[i] = silu_d(dotd(row_of(g, r0 + i), h, d)) * dotd(row_of(u, r0 + i), h, d);
    for (uint32_t o = 0; o < d; o++)
        y[o] += scale * dotd(row_of(dn, (dn->n_out / (g->n_out / ff)) * (r0 / ff) + o), a, ff);
    free(a);
}

/* The family's MoE FFN of h (as the model card defines it), added into y. */
static void moe_ffn_d(const model_hparams_t *hp, const model_layer_t *L, const double *h, double *y)
{
    const uint32_t d = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, fe = hp->n_ff_exp;
    float lg[256];
    for (uint32_t e = 0; e < E; e++)
        lg[e] = (float)dotd(row_of(&L->gate_inp, e), h, d);
    uint32_t sel[8];
    double w[8];
    ref_route(lg, E, K, hp->arch != MODEL_ARCH_QWEN2MOE, sel, w);
    for (uint32_t j = 0; j < K; j++)
        swiglu_d(&L->gate_exps, &L->up_exps, &L->down_exps, sel[j] * fe, fe, h, d, w[j], y);
    if (hp->arch == MODEL_ARCH_QWEN2MOE) {
        double g = 1.0 / (1.0 + exp(-dotd(row_of(&L->gate_inp_shexp, 0), h, d)));
        swiglu_d(&L->gate_shexp, &L->up_shexp, &L->down_shexp, 0, hp->n_ff_shexp, h, d, g, y);
    }
}

/* Logits of one token at position 0 (attention over itself is its own v):
 * the whole pass in double from the F32 weights. */
static void ref_one_token(const model_t *m, int32_t tok, double *logits)
{
    const model_hparams_t *hp = &m->hp;
    const uint32_t d = hp->n_embd, hd = hp->head_dim, nkv = hp->n_head_kv;
    double x[256], h[256], att[256], v[256], y[256];
    for (uint32_t i = 0; i < d; i++)
        x[i] = row_of(&m->w.tok_embd, (uint32_t)tok)[i];
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &m->w.layers[l];
        rmsnorm_d(x, &L->attn_norm, d, hp->rms_eps, h);
        for (uint32_t i = 0; i < nkv * hd; i++)
            v[i] =
                dotd(row_of(&L->wv, i), h, d) + (L->bv.data ? ((const float *)L->bv.data)[i] : 0);
        for (uint32_t hq = 0; hq < hp->n_head; hq++)
            for (uint32_t i = 0; i < hd; i++)
                att[hq * hd + i] = v[hq / (hp->n_head / nkv) * hd + i];
        for (uint32_t o = 0; o < d; o++)
            x[o] += dotd(row_of(&L->wo, o), att, hp->n_head * hd);
        rmsnorm_d(x, &L->ffn_norm, d, hp->rms_eps, h);
        memset(y, 0, sizeof y);
        moe_ffn_d(hp, L, h, y);
        for (uint32_t o = 0; o < d; o++)
            x[o] += y[o];
    }
    rmsnorm_d(x, &m->w.output_norm, d, hp->rms_eps, h);
    for (uint32_t r = 0; r < hp->n_vocab; r++)
        logits[r] = dotd(row_of(&m->w.output, r), h, d);
}

Test(moe, each_family_gates_and_sums_its_experts_as_a_scalar_pass_does, .timeout = 60)
{
    for (size_t fi = 0; fi < N_FAMILIES; fi++) {
        char err[512];
        model_t *m = moe_open(moe_families[fi].args, "f32", err, sizeof err);
        cr_assert_not_null(m, "%s: %s", moe_families[fi].name, err);
        cr_assert(m->hp.feats & MODEL_FEAT_MOE);
        cr_assert_eq(m->hp.moe_norm_w, m->hp.arch != MODEL_ARCH_QWEN2MOE);
        backend_t *be = moe_be(2);
        fwd_t *f = fwd_new(be);
        const uint32_t nv = m->hp.n_vocab;
        float *got = malloc(nv * sizeof *got);
        double *want = malloc(nv * sizeof *want);
        for (int32_t tok = 3; tok < 300; tok += 37) {
            kv_seq_t *kv = kv_seq_new(&m->hp, 4, KV_TYPE_F32);
            fwd_seq_t sq = {kv, &tok, 1, got, NULL};
            cr_assert_eq(fwd_run(f, &m->hp, &m->w, &sq, 1, NULL, err, sizeof err), 0, "%s", err);
            kv_seq_free(kv);
            ref_one_token(m, tok, want);
            double mx = 1, md = 0;
            for (uint32_t i = 0; i < nv; i++) {
                mx = fmax(mx, fabs(want[i]));
                md = fmax(md, fabs(got[i] - want[i]));
            }
            cr_assert_leq(md, 1e-4 * mx, "%s token %d: max |engine - scalar| %g of max %g",
                          moe_families[fi].name, tok, md, mx);
        }
        free(got);
        free(want);
        fwd_free(f);
        be_close(be);
        model_close(m);
    }
}

/* ------------------------------------------------------------------ batching */

static void check_batch(const char *args, const char *type, kv_type_t kt)
{
    char err[512];
    model_t *m = moe_open(args, type, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    backend_t *be = moe_be(2);
    fwd_t *f = fwd_new(be);
    const uint32_t nv = m->hp.n_vocab;
    int32_t toks[3][9] = {{1, 5, 9, 13, 200, 17, 3, 80, 99}, {1, 42}, {1, 7, 7, 7, 299}};
    uint32_t lens[3] = {9, 2, 5};
    float *single[3], *batched[3], *stepwise[3];
    for (int s = 0; s < 3; s++) {
        single[s] = malloc(nv * sizeof(float));
        batched[s] = malloc(nv * sizeof(float));
        stepwise[s] = malloc(nv * sizeof(float));
        kv_seq_t *kv = kv_seq_new(&m->hp, 64, kt);
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
        kvs[s] = kv_seq_new(&m->hp, 64, kt);
        b[s] = (fwd_seq_t){kvs[s], toks[s], lens[s], batched[s], NULL};
    }
    static const uint32_t chunks[] = {1, 4, 7, 0};
    for (int c = 0; c < 4; c++) {
        fwd_set_chunk(f, chunks[c]);
        for (int s = 0; s < 3; s++)
            kv_seq_reset(kvs[s]);
        cr_assert_eq(fwd_run(f, &m->hp, &m->w, b, 3, NULL, err, sizeof err), 0, "%s", err);
        for (int s = 0; s < 3; s++) {
            cr_assert_eq(memcmp(single[s], batched[s], nv * sizeof(float)), 0,
                         "%s %s seq %d: batched logits (chunks of %u) differ from single", args,
                         type, s, chunks[c]);
            cr_assert_eq(memcmp(single[s], stepwise[s], nv * sizeof(float)), 0,
                         "%s %s seq %d: prefill logits differ from token-by-token", args, type, s);
        }
    }
    for (int s = 0; s < 3; s++) {
        kv_seq_free(kvs[s]);
        free(single[s]);
        free(batched[s]);
        free(stepwise[s]);
    }
    fwd_free(f);
    be_close(be);
    model_close(m);
}

Test(moe, grouped_batches_give_the_logits_of_single_and_token_by_token_runs_bit_for_bit,
     .timeout = 120)
{
    static const char *const types[] = {"f32", "f16", "bf16", "q8_0"};
    for (size_t fi = 0; fi < N_FAMILIES; fi++)
        for (size_t ti = 0; ti < 4; ti++)
            check_batch(moe_families[fi].args, types[ti], ti % 2 ? KV_TYPE_F16 : KV_TYPE_F32);
}

Test(moe, a_decode_step_of_eight_sequences_reads_each_selected_expert_once, .timeout = 60)
{
    char err[512];
    model_t *m = moe_open(moe_families[0].args, "q8_0", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    const model_hparams_t *hp = &m->hp;
    const size_t n_flags = (size_t)hp->n_layer * hp->n_expert;
    backend_t *be = moe_be(2);
    fwd_t *f = fwd_new(be);
    kv_seq_t *kv[8];
    fwd_seq_t sq[8];
    int32_t prompt[3], next[8];
    float *l = malloc(8 * hp->n_vocab * sizeof *l);
    for (int s = 0; s < 8; s++) {
        kv[s] = kv_seq_new(hp, 16, KV_TYPE_F16);
        prompt[0] = 1, prompt[1] = 10 + 31 * s, prompt[2] = 200 - 13 * s;
        sq[s] = (fwd_seq_t){kv[s], prompt, 3, NULL, NULL};
        cr_assert_eq(fwd_run(f, hp, &m->w, &sq[s], 1, NULL, err, sizeof err), 0, "%s", err);
        next[s] = 5 + 29 * s;
    }
    /* each sequence alone: k experts a layer each, the union of what they took */
    uint8_t *uni = calloc(n_flags, 1);
    uint64_t r0 = fwd_expert_reads(f);
    for (int s = 0; s < 8; s++) {
        sq[s] = (fwd_seq_t){kv[s], &next[s], 1, l + (size_t)s * hp->n_vocab, NULL};
        cr_assert_eq(fwd_run(f, hp, &m->w, &sq[s], 1, NULL, err, sizeof err), 0, "%s", err);
        const uint8_t *u = fwd_experts_used(f);
        for (size_t i = 0; i < n_flags; i++)
            uni[i] |= u[i];
        kv[s]->n_past--; /* the same step again below, batched */
    }
    uint64_t single = fwd_expert_reads(f) - r0;
    cr_assert_eq(single, 8ull * hp->n_layer * hp->n_expert_used);
    /* the same step batched: each expert some sequence took is read once */
    uint64_t r1 = fwd_expert_reads(f);
    cr_assert_eq(fwd_run(f, hp, &m->w, sq, 8, NULL, err, sizeof err), 0, "%s", err);
    uint64_t batched = fwd_expert_reads(f) - r1;
    size_t distinct = 0;
    const uint8_t *u = fwd_experts_used(f);
    for (size_t i = 0; i < n_flags; i++) {
        cr_assert_eq(u[i], uni[i], "flag %zu: batched %d, union of singles %d", i, u[i], uni[i]);
        distinct += uni[i];
    }
    cr_assert_eq(batched, distinct, "%llu expert reads for %zu selected experts",
                 (unsigned long long)batched, distinct);
    cr_assert_lt(batched, single);
    free(uni);
    free(l);
    for (int s = 0; s < 8; s++)
        kv_seq_free(kv[s]);
    fwd_free(f);
    be_close(be);
    model_close(m);
}

/* ------------------------------------------------------------------ refusals */

static void assert_moe_refused(const char *args, const char *want)
{
    char err[512] = "", path[256], all[512];
    snprintf(all, sizeof all, "%s %s", MOE_SHAPE, args);
    tu_mkmodel(path, sizeof path, all);
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_null(m, "%s: the file was accepted", args);
    cr_assert(strstr(err, want) != NULL, "%s: error '%s' does not name '%s'", args, err, want);
}

Test(moe, gating_the_engine_does_not_compute_is_refused_by_name)
{
    const char *q3 = "--arch qwen3moe --ff 256 --experts 8 --experts-used 2";
    char a[256];
    snprintf(a, sizeof a, "%s --extra-u32 qwen3moe.expert_gating_func=2", q3);
    assert_moe_refused(a, "'qwen3moe.expert_gating_func' = 2 (sigmoid) is not implemented");
    snprintf(a, sizeof a, "%s --extra-u32 qwen3moe.expert_group_count=4", q3);
    assert_moe_refused(a, "metadata key 'qwen3moe.expert_group_count' is not understood");
    snprintf(a, sizeof a, "%s --extra-u32 qwen3moe.expert_shared_count=1", q3);
    assert_moe_refused(a, "metadata key 'qwen3moe.expert_shared_count' is not understood");
    snprintf(a, sizeof a, "%s --extra-u32 qwen3moe.expert_weights_scale=2", q3);
    assert_moe_refused(a, "'qwen3moe.expert_weights_scale' is not a finite float");
    /* experts on an architecture without them, or counts that make no sense */
    assert_moe_refused("--arch qwen2 --ff 128 --extra-u32 qwen2.expert_count=8 --extra-u32 "
                       "qwen2.expert_used_count=2",
                       "mixture of experts ('qwen2.expert_count' = 8, expert_used_count 2) is not "
                       "implemented for qwen2");
    assert_moe_refused("--arch llama --ff 128 --extra-u32 llama.expert_count=8 --extra-u32 "
                       "llama.expert_used_count=9",
                       "'llama.expert_count' = 8 with expert_used_count 9");
    assert_moe_refused("--arch qwen3 --ff 128 --arch-name qwen3moe", "'qwen3moe.expert_count' = 0");
    /* a dense FFN tensor in a MoE file is not silently skipped */
    assert_moe_refused("--arch llama --ff 128 --experts 8 --experts-used 2 --extra-tensor "
                       "blk.1.ffn_gate.weight",
                       "tensor 'blk.1.ffn_gate.weight' is not used");
}

Test(moe, a_backend_without_the_expert_kernels_refuses_a_moe_model_by_name)
{
    char err[512];
    model_t *m = moe_open(moe_families[1].args, "f16", err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(model_feats_check(&m->hp, MODEL_FEAT_ALL, "cuda", err, sizeof err),
                 MODEL_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "cannot run this qwen2moe model: it lacks mixture of experts") != NULL,
              "%s", err);
    cr_assert_eq(model_feats_check(&m->hp, MODEL_FEAT_ALL | MODEL_FEAT_MOE, "cpu", err, sizeof err),
                 0);
    model_close(m);
}

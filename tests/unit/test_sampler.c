/* test_sampler: greedy, seeding, top-k/top-p/min-p, repetition penalty and the sampled distribution. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

/* ------------------------------------------------------------------ helpers */

/* Parameters with every filter off: plain softmax(logits / T) sampling. */
static sampler_params_t plain_params(float temperature, uint64_t seed)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 0;
    p.seed = seed;
    return p;
}

static sampler_t *new_or_fail(const sampler_params_t *p, int32_t n_vocab)
{
    char err[256] = "";
    sampler_t *s = sampler_new(p, n_vocab, err, sizeof err);
    cr_assert_not_null(s, "sampler_new: %s", err);
    return s;
}

/* Samples once from a copy of logits (sampler_sample scribbles on its input). */
static int32_t sample_copy(sampler_t *s, const float *logits, int32_t n, float *scratch)
{
    memcpy(scratch, logits, (size_t)n * sizeof *scratch);
    return sampler_sample(s, scratch);
}

/* Deterministic pseudo-random logits in [-8, 8). */
static void fill_logits(float *l, int32_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = (float)(x >> 8) / (float)(1u << 24) * 16.0f - 8.0f;
    }
}

/* ------------------------------------------------------------------ greedy */

Test(sampler, greedy_picks_the_argmax_and_breaks_ties_by_lowest_id)
{
    sampler_params_t p = plain_params(0.0f, 1);
    sampler_t *s = new_or_fail(&p, 6);
    float l[6] = {0.5f, 3.0f, -1.0f, 2.0f, 3.0f, 1.0f};
    cr_assert_eq(sampler_sample(s, l), 1);
    float m[6] = {-5.0f, -4.0f, -3.0f, -2.0f, -1.0f, -0.5f};
    cr_assert_eq(sampler_sample(s, m), 5);
    sampler_free(s);
}

Test(sampler, negative_temperature_is_greedy)
{
    sampler_params_t p = plain_params(-1.0f, 1);
    sampler_t *s = new_or_fail(&p, 4);
    for (int i = 0; i < 20; i++) {
        float l[4] = {0.1f, 0.2f, 0.9f, 0.3f};
        cr_assert_eq(sampler_sample(s, l), 2);
    }
    sampler_free(s);
}

Test(sampler, nan_and_inf_logits_do_not_crash_and_nan_is_never_chosen)
{
    sampler_params_t p = plain_params(1.0f, 3);
    sampler_t *s = new_or_fail(&p, 4);
    float scratch[4];
    const float nan_l[4] = {NAN, 1.0f, NAN, 0.5f};
    for (int i = 0; i < 200; i++) {
        int32_t id = sample_copy(s, nan_l, 4, scratch);
        cr_assert(id == 1 || id == 3, "picked %d", id);
    }
    const float inf_l[4] = {1.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 50; i++)
        cr_assert_eq(sample_copy(s, inf_l, 4, scratch), 1);
    const float all_bad[4] = {NAN, -INFINITY, NAN, -INFINITY};
    int32_t id = sample_copy(s, all_bad, 4, scratch);
    cr_assert(id >= 0 && id < 4);
    sampler_free(s);

    p.temperature = 0;
    s = new_or_fail(&p, 4);
    cr_assert_eq(sample_copy(s, nan_l, 4, scratch), 1);
    sampler_free(s);
}

/* ------------------------------------------------------------------ seeding */

static void draw_sequence(uint64_t seed, int32_t *out, int n)
{
    enum {
        V = 1000
    };
    sampler_params_t p;
    sampler_params_default(&p);
    p.temperature = 1.5f; /* flat enough that many tokens are in play */
    p.top_k = 200;
    p.top_p = 0.99f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.1f;
    p.seed = seed;
    sampler_t *s = new_or_fail(&p, V);
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < n; i++) {
        fill_logits(l, V, (uint32_t)i); /* the same logit sequence for every seed */
        out[i] = sampler_sample(s, l);
    }
    free(l);
    sampler_free(s);
}

Test(sampler, same_seed_gives_the_same_100_tokens_and_different_seeds_differ)
{
    int32_t a[100], b[100], c[100];
    draw_sequence(42, a, 100);
    draw_sequence(42, b, 100);
    draw_sequence(43, c, 100);
    cr_assert_arr_eq(a, b, sizeof a);
    int differ = 0;
    for (int i = 0; i < 100; i++)
        differ += a[i] != c[i];
    cr_assert_gt(differ, 10, "seeds 42 and 43 agree on %d of 100 tokens", 100 - differ);
}

/* ------------------------------------------------------------------ filters */

Test(sampler, top_k_of_one_equals_greedy)
{
    enum {
        V = 5000
    };
    sampler_params_t pg = plain_params(0.0f, 0);
    sampler_params_t pk = plain_params(2.0f, 7);
    pk.top_k = 1;
    sampler_t *g = new_or_fail(&pg, V), *k = new_or_fail(&pk, V);
    float *l = malloc(V * sizeof *l), *scratch = malloc(V * sizeof *l);
    for (uint32_t r = 0; r < 50; r++) {
        fill_logits(l, V, r);
        if (r % 5 == 0)
            l[r * 7] = l[r * 7 + 1] = 9.0f; /* a tie at the top */
        cr_assert_eq(sample_copy(k, l, V, scratch), sample_copy(g, l, V, scratch), "round %u", r);
    }
    free(l);
    free(scratch);
    sampler_free(g);
    sampler_free(k);
}

Test(sampler, tiny_top_p_equals_greedy)
{
    enum {
        V = 3000
    };
    sampler_params_t pg = plain_params(0.0f, 0);
    sampler_params_t pp = plain_params(1.0f, 9);
    pp.top_p = 1e-6f;
    sampler_t *g = new_or_fail(&pg, V), *tp = new_or_fail(&pp, V);
    float *l = malloc(V * sizeof *l), *scratch = malloc(V * sizeof *l);
    for (uint32_t r = 0; r < 50; r++) {
        fill_logits(l, V, r + 100);
        cr_assert_eq(sample_copy(tp, l, V, scratch), sample_copy(g, l, V, scratch), "round %u", r);
    }
    free(l);
    free(scratch);
    sampler_free(g);
    sampler_free(tp);
}

Test(sampler, top_k_draws_only_from_the_k_best_of_a_large_vocabulary)
{
    enum {
        V = 152064,
        K = 40
    };
    sampler_params_t p = plain_params(5.0f, 11); /* hot: the tail would show up without top-k */
    p.top_k = K;
    sampler_t *s = new_or_fail(&p, V);
    float *l = malloc(V * sizeof *l), *scratch = malloc(V * sizeof *l);
    for (int32_t i = 0; i < V; i++)
        l[i] = (float)((i * 7919) % V) / 1000.0f; /* a permutation: top K ids are known */
    int hits[K] = {0};
    for (int r = 0; r < 400; r++) {
        int32_t id = sample_copy(s, l, V, scratch);
        int32_t rank = V - 1 - (int32_t)((int64_t)id * 7919 % V);
        cr_assert(rank >= 0 && rank < K, "token %d has rank %d", id, rank);
        hits[rank]++;
    }
    int distinct = 0;
    for (int i = 0; i < K; i++)
        distinct += hits[i] > 0;
    cr_assert_gt(distinct, K / 2, "only %d of the top %d were ever drawn", distinct, K);
    free(l);
    free(scratch);
    sampler_free(s);
}

Test(sampler, min_p_drops_tokens_below_min_p_times_the_best_probability)
{
    /* T = 1: p_i / p_max = exp(l_i - l_max) = 1, 0.5, 0.2, 0.05, 0.01 */
    const float l[5] = {0.0f, logf(0.5f), logf(0.2f), logf(0.05f), logf(0.01f)};
    sampler_params_t p = plain_params(1.0f, 5);
    p.min_p = 0.1f;
    sampler_t *s = new_or_fail(&p, 5);
    int hits[5] = {0};
    float scratch[5];
    for (int r = 0; r < 5000; r++)
        hits[sample_copy(s, l, 5, scratch)]++;
    cr_assert_eq(hits[3], 0);
    cr_assert_eq(hits[4], 0);
    /* survivors keep their relative weights 1 : 0.5 : 0.2 (of 1.7) */
    cr_assert(hits[0] > 2600 && hits[0] < 3300, "token 0 drawn %d times", hits[0]);
    cr_assert(hits[1] > 1250 && hits[1] < 1700, "token 1 drawn %d times", hits[1]);
    cr_assert(hits[2] > 450 && hits[2] < 750, "token 2 drawn %d times", hits[2]);
    sampler_free(s);
}

Test(sampler, top_p_keeps_the_smallest_set_reaching_top_p)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps {0, 1} (0.8 >= 0.75) */
    const float l[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    sampler_params_t p = plain_params(1.0f, 13);
    p.top_p = 0.75f;
    sampler_t *s = new_or_fail(&p, 4);
    int hits[4] = {0};
    float scratch[4];
    for (int r = 0; r < 4000; r++)
        hits[sample_copy(s, l, 4, scratch)]++;
    cr_assert_eq(hits[0], 0);
    cr_assert_eq(hits[2], 0);
    /* renormalised 0.625 / 0.375 */
    cr_assert(hits[1] > 2300 && hits[1] < 2700, "token 1 drawn %d times", hits[1]);
    sampler_free(s);
}

/* ------------------------------------------------------------------ penalty */

Test(sampler, repetition_penalty_changes_the_greedy_choice_only_within_the_window)
{
    sampler_params_t p = plain_params(0.0f, 0);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;
    sampler_t *s = new_or_fail(&p, 4);
    const float l[4] = {2.0f, 1.6f, -1.0f, -0.9f};
    float scratch[4];
    cr_assert_eq(sample_copy(s, l, 4, scratch), 0); /* 0 enters the history */
    /* 2.0 / 1.5 = 1.33 < 1.6: token 1 wins now */
    cr_assert_eq(sample_copy(s, l, 4, scratch), 1);
    /* history {0, 1}: 1.33 vs 1.07 -> 0 again */
    cr_assert_eq(sample_copy(s, l, 4, scratch), 0);
    sampler_free(s);

    /* negative logits are multiplied: -0.9 * 1.5 = -1.35 < -1.0 */
    s = new_or_fail(&p, 4);
    const float neg[4] = {-5.0f, -5.0f, -1.0f, -0.9f};
    sampler_accept(s, 3);
    cr_assert_eq(sample_copy(s, neg, 4, scratch), 2);
    /* tokens that slid out of the window (3, after 2 and 2) are not penalised */
    sampler_accept(s, 2);
    cr_assert_eq(sample_copy(s, neg, 4, scratch), 3);
    sampler_free(s);
}

Test(sampler, repetition_penalty_applies_once_per_distinct_token)
{
    sampler_params_t p = plain_params(0.0f, 0);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 8;
    sampler_t *s = new_or_fail(&p, 3);
    for (int i = 0; i < 8; i++)
        sampler_accept(s, 0);
    /* once: 3.0 / 1.5 = 2.0 > 1.9; eight times would be 0.12 */
    const float l[3] = {3.0f, 1.9f, 0.0f};
    float scratch[3];
    cr_assert_eq(sample_copy(s, l, 3, scratch), 0);
    sampler_free(s);
}

Test(sampler, presence_penalty_is_subtracted_once_from_each_generated_token)
{
    sampler_params_t p = plain_params(0.0f, 0);
    p.presence_penalty = 0.5f;
    sampler_t *s = new_or_fail(&p, 3);
    /* prompt tokens do not count: 0 stays ahead of 1 by 0.4 */
    sampler_accept(s, 0);
    const float l[3] = {3.0f, 2.6f, 2.2f};
    float scratch[3];
    cr_assert_eq(sample_copy(s, l, 3, scratch), 0);
    /* 0 was generated: 2.5 < 2.6 -> 1; then 1 too: 2.5, 2.1, 2.2 -> 0 */
    cr_assert_eq(sample_copy(s, l, 3, scratch), 1);
    cr_assert_eq(sample_copy(s, l, 3, scratch), 0);
    /* 0 generated twice: still penalised once (2.5 vs 2.1 vs 2.2) */
    cr_assert_eq(sample_copy(s, l, 3, scratch), 0);
    /* the logits handed over are the penalised ones */
    cr_assert_float_eq(scratch[0], 2.5f, 1e-6);
    cr_assert_float_eq(scratch[1], 2.1f, 1e-6);
    cr_assert_float_eq(scratch[2], 2.2f, 1e-6);
    sampler_free(s);
}

Test(sampler, frequency_penalty_grows_with_each_occurrence)
{
    sampler_params_t p = plain_params(0.0f, 0);
    p.frequency_penalty = 0.3f;
    sampler_t *s = new_or_fail(&p, 3);
    const float l[3] = {3.0f, 2.5f, 0.0f};
    float scratch[3];
    /* 0 (3.0), 0 (2.7), then 2.4 < 2.5 -> 1, then 2.4 vs 2.2 -> 0, then 2.1 vs 2.2 -> 1 */
    const int32_t want[5] = {0, 0, 1, 0, 1};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(sample_copy(s, l, 3, scratch), want[i], "step %d", i);
    /* the last step saw counts 3 and 1: 3.0 - 0.9, 2.5 - 0.3 */
    cr_assert_float_eq(scratch[0], 2.1f, 1e-6);
    cr_assert_float_eq(scratch[1], 2.2f, 1e-6);
    cr_assert_float_eq(scratch[2], 0.0f, 1e-6);
    sampler_free(s);
}

Test(sampler, negative_presence_penalty_favours_generated_tokens)
{
    sampler_params_t p = plain_params(0.0f, 0);
    p.presence_penalty = -2.0f;
    sampler_t *s = new_or_fail(&p, 3);
    const float l[3] = {1.0f, 2.0f, 2.5f};
    float scratch[3];
    cr_assert_eq(sample_copy(s, l, 3, scratch), 2);
    /* 2 is boosted to 4.5, so it repeats */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sample_copy(s, l, 3, scratch), 2);
    sampler_free(s);
}

Test(sampler, non_finite_presence_or_frequency_penalty_is_rejected)
{
    sampler_params_t p = plain_params(1.0f, 0);
    char err[256] = "";
    p.presence_penalty = NAN;
    cr_assert_null(sampler_new(&p, 10, err, sizeof err));
    cr_assert(strstr(err, "presence_penalty"), "%s", err);
    p.presence_penalty = 0;
    p.frequency_penalty = INFINITY;
    cr_assert_null(sampler_new(&p, 10, err, sizeof err));
    cr_assert(strstr(err, "frequency_penalty"), "%s", err);
}

Test(sampler, the_table_gives_the_defaults_and_ranges)
{
    sampler_params_t p;
    sampler_params_default(&p);
    cr_assert_float_eq(p.presence_penalty, 0.0f, 1e-9);
    cr_assert_float_eq(p.frequency_penalty, 0.0f, 1e-9);
    const sampler_param_desc_t *d = sampler_param_find("presence_penalty");
    cr_assert_not_null(d);
    cr_assert(sampler_param_in_range(d, -2.0) && sampler_param_in_range(d, 2.0));
    cr_assert(!sampler_param_in_range(d, 2.01) && !sampler_param_in_range(d, NAN));
    d = sampler_param_find("top_p");
    cr_assert(!sampler_param_in_range(d, 0.0) && sampler_param_in_range(d, 1.0), "top_p is (0, 1]");
    char buf[64];
    cr_assert_str_eq(sampler_param_range_text(d, buf, sizeof buf), "(0, 1]");
    cr_assert_null(sampler_param_find("presence"));
}

/* ------------------------------------------------------------------ distribution */

/* Pearson chi-square of observed counts against softmax(logits / T), 7
 * degrees of freedom; 24.32 is the 0.999 quantile. With a fixed seed the
 * test is deterministic; the bound says a correct sampler passes for all
 * but about one seed in a thousand. */
Test(sampler, draw_frequencies_match_softmax_of_logits_over_temperature)
{
    enum {
        V = 8,
        N = 100000
    };
    const float l[V] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.5f, 1.2f, 0.7f};
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        sampler_params_t p = plain_params(temps[t], 1234 + t);
        sampler_t *s = new_or_fail(&p, V);
        double prob[V], z = 0;
        for (int i = 0; i < V; i++)
            z += prob[i] = exp((double)l[i] / temps[t]);
        long hits[V] = {0};
        float scratch[V];
        for (int r = 0; r < N; r++)
            hits[sample_copy(s, l, V, scratch)]++;
        double chi2 = 0;
        for (int i = 0; i < V; i++) {
            double e = N * prob[i] / z;
            chi2 += (hits[i] - e) * (hits[i] - e) / e;
        }
        cr_assert_lt(chi2, 24.32, "T=%g: chi-square %.2f over 7 dof", (double)temps[t], chi2);
        sampler_free(s);
    }
}

/* ------------------------------------------------------------------ params */

static void expect_rejected(const sampler_params_t *p, int32_t n_vocab, const char *word)
{
    char err[256] = "";
    sampler_t *s = sampler_new(p, n_vocab, err, sizeof err);
    cr_assert_null(s, "accepted parameters that should fail on %s", word);
    cr_assert(strstr(err, word), "message '%s' does not mention %s", err, word);
}

Test(sampler, bad_parameters_are_rejected_with_a_message_naming_them)
{
    sampler_params_t base;
    sampler_params_default(&base);
    sampler_params_t p;
    p = base;
    p.temperature = NAN;
    expect_rejected(&p, 10, "temperature");
    p = base;
    p.temperature = INFINITY;
    expect_rejected(&p, 10, "temperature");
    p = base;
    p.top_p = -0.5f;
    expect_rejected(&p, 10, "top_p");
    p = base;
    p.top_p = NAN;
    expect_rejected(&p, 10, "top_p");
    p = base;
    p.min_p = NAN;
    expect_rejected(&p, 10, "min_p");
    p = base;
    p.min_p = 1.5f;
    expect_rejected(&p, 10, "min_p");
    p = base;
    p.repeat_penalty = 0.0f;
    expect_rejected(&p, 10, "repeat_penalty");
    p = base;
    p.repeat_penalty = NAN;
    expect_rejected(&p, 10, "repeat_penalty");
    p = base;
    p.repeat_last_n = -1;
    expect_rejected(&p, 10, "repeat_last_n");
    expect_rejected(&base, 0, "vocabulary");
    char err[64] = "";
    cr_assert_null(sampler_new(NULL, 10, err, sizeof err));
    cr_assert_neq(err[0], 0);
    sampler_free(NULL);
}

Test(sampler, defaults_are_the_documented_values)
{
    sampler_params_t p;
    sampler_params_default(&p);
    cr_assert_float_eq(p.temperature, 0.8f, 1e-6);
    cr_assert_eq(p.top_k, 40);
    cr_assert_float_eq(p.top_p, 0.95f, 1e-6);
    cr_assert_float_eq(p.min_p, 0.05f, 1e-6);
    cr_assert_float_eq(p.repeat_penalty, 1.0f, 1e-6);
    cr_assert_eq(p.repeat_last_n, 64);
    cr_assert_eq(p.seed, 0);
    sampler_free(new_or_fail(&p, 32000));
}

/* ------------------------------------------------------------------ logprobs, logit_bias, choices */

Test(sampler, logprobs_are_the_log_softmax_of_the_raw_logits_best_first)
{
    enum {
        V = 1000
    };
    static float l[V];
    fill_logits(l, V, 3);
    l[17] = l[18] = 9.0f; /* a tie: lower id first */
    sampler_logprob_t top[20];
    double lse = sampler_logprobs(l, V, 20, top);
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)l[i] - lse);
    cr_assert_float_eq(sum, 1.0, 1e-9, "exp(logit - lse) sums to 1");
    cr_assert_eq(top[0].id, 17);
    cr_assert_eq(top[1].id, 18);
    for (int j = 0; j < 20; j++) {
        cr_assert_float_eq(top[j].logprob, (double)l[top[j].id] - lse, 1e-6);
        if (j)
            cr_assert_geq(top[j - 1].logprob, top[j].logprob);
    }
    int above = 0; /* nothing outside the top 20 beats the 20th */
    for (int i = 0; i < V; i++)
        above += l[i] > l[top[19].id];
    cr_assert_leq(above, 19);
}

Test(sampler, logprobs_treat_nan_and_minus_inf_as_impossible)
{
    float l[4] = {NAN, -INFINITY, 0.0f, 0.0f};
    sampler_logprob_t top[4];
    double lse = sampler_logprobs(l, 4, 4, top);
    cr_assert_float_eq(lse, log(2.0), 1e-9);
    cr_assert_eq(top[0].id, 2);
    cr_assert_eq(top[1].id, 3);
    cr_assert_float_eq(top[0].logprob, -log(2.0), 1e-6);
    cr_assert(isinf(top[2].logprob) && top[2].logprob < 0);
}

Test(sampler, logit_bias_is_added_before_the_greedy_choice)
{
    float l[5] = {1, 5, 2, 3, 4}, scratch[5];
    int32_t ids[2] = {1, 0};
    float bias[2] = {-100, 3.5f};
    sampler_params_t p = plain_params(0, 1);
    p.bias_ids = ids;
    p.bias = bias;
    p.n_bias = 2;
    sampler_t *s = new_or_fail(&p, 5);
    cr_assert_eq(sample_copy(s, l, 5, scratch), 0, "4.5 beats 4 once 5 is banned");
    sampler_free(s);
    bias[1] = 100;
    ids[0] = 4;
    s = new_or_fail(&p, 5); /* sampler_new copied the earlier arrays: these are new ones */
    cr_assert_eq(sample_copy(s, l, 5, scratch), 0);
    sampler_free(s);
}

Test(sampler, logit_bias_outside_the_vocabulary_is_rejected)
{
    int32_t ids[1] = {5};
    float bias[1] = {1};
    sampler_params_t p = plain_params(0, 1);
    p.bias_ids = ids;
    p.bias = bias;
    p.n_bias = 1;
    char err[256] = "";
    cr_assert_null(sampler_new(&p, 5, err, sizeof err));
    cr_assert(strstr(err, "logit_bias"), "%s", err);
}

Test(sampler, choice_seeds_keep_choice_zero_and_differ_for_the_others)
{
    cr_assert_eq(sampler_seed_of_choice(42, 0), 42);
    cr_assert_eq(sampler_seed_of_choice(42, 1), sampler_seed_of_choice(42, 1));
    cr_assert_neq(sampler_seed_of_choice(42, 1), sampler_seed_of_choice(42, 2));
    cr_assert_neq(sampler_seed_of_choice(42, 1), 42);
    cr_assert_neq(sampler_seed_of_choice(42, 1), sampler_seed_of_choice(43, 1));
}

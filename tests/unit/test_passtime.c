/* Unit tests for passtime: a pass's compute split into a decode step and a time per prompt token. */
#include <criterion/criterion.h>

#include "worker/passtime.h"

Test(passtime, nothing_measured_says_zero)
{
    pass_time_t p = {0};
    cr_assert_eq(pass_time_for(&p, 100, 1), 0.0);
    pass_time_note(&p, 0, 10, 1); /* no compute measured: ignored */
    pass_time_note(&p, 1.0, 10, 0);
    cr_assert_eq(p.pass_s, 0.0);
}

Test(passtime, before_a_decode_step_and_a_prefill_the_average_pass_is_the_answer)
{
    pass_time_t p = {0};
    pass_time_note(&p, 0.5, 500, 1); /* a first pass that prefills: no step to split it by */
    cr_assert_float_eq(pass_time_for(&p, 1000, 1), 0.5, 1e-12);
    pass_time_note(&p, 0.01, 1, 1); /* a decode step: still no prefill after it */
    cr_assert_float_eq(pass_time_for(&p, 1000, 1), 0.8 * 0.5 + 0.2 * 0.01, 1e-12);
    cr_assert_eq(p.prefill_tokens, 0.0);
}

Test(passtime, a_prefill_is_a_step_plus_a_time_per_token_beyond_one_per_sequence)
{
    pass_time_t p = {0};
    pass_time_note(&p, 0.01, 1, 1);
    pass_time_note(&p, 0.01 + 0.001 * 99, 100, 1); /* 1 ms per token beyond the first */
    cr_assert_float_eq(pass_time_for(&p, 1000, 1), 0.01 + 0.001 * 999, 1e-9);
    cr_assert_float_eq(pass_time_for(&p, 4, 4), 0.01, 1e-12); /* four decoding: a step */
    /* two sequences decoding and a prompt of 50 joining: 50 tokens beyond one per sequence */
    cr_assert_float_eq(pass_time_for(&p, 52, 3), 0.01 + 0.001 * 49, 1e-9);
}

Test(passtime, a_short_prompts_pass_weighs_by_its_tokens_not_as_one_sample)
{
    pass_time_t p = {0};
    pass_time_note(&p, 0.01, 1, 1);
    pass_time_note(&p, 0.01 + 0.001 * 999, 1000, 1);
    /* a 4-token prompt that took no longer than a step (timer noise, fixed costs) */
    for (int i = 0; i < 5; i++)
        pass_time_note(&p, 0.009, 4, 1);
    double per = (pass_time_for(&p, 1001, 1) - p.step_s) / 1000;
    cr_assert(per > 0.0009, "per-token time dragged down to %g by short passes", per);
    cr_assert(per < 0.0011, "per-token %g", per);
}

Test(passtime, the_averages_follow_a_change)
{
    pass_time_t p = {0};
    pass_time_note(&p, 0.01, 1, 1);
    pass_time_note(&p, 0.01 + 0.001 * 100, 101, 1);
    for (int i = 0; i < 40; i++) { /* the device got twice as fast */
        pass_time_note(&p, 0.005, 1, 1);
        pass_time_note(&p, 0.005 + 0.0005 * 100, 101, 1);
    }
    cr_assert_float_eq(pass_time_for(&p, 201, 1), 0.005 + 0.0005 * 200, 1e-4);
}

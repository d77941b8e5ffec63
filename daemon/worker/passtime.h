/* passtime: a model's measured pass compute, as a part per pass and a part per prompt token, to say how long its next pass will compute (a cold model's first pass starts while its last copies land). */
#ifndef PASSTIME_H
#define PASSTIME_H

#include <stdint.h>

/* Moving averages of what the model's passes computed (the time they waited
 * for copies left out). Zeroed: nothing measured. */
typedef struct pass_time {
    double pass_s;         /* a pass, whatever it ran (0 = none measured) */
    double step_s;         /* a pass of one token per sequence (decode; 0 = none measured) */
    double prefill_s;      /* of a pass with more tokens (a prompt's prefill), what it took
                              beyond step_s; from passes after step_s was known (0 = none) */
    double prefill_tokens; /* the tokens beyond one per sequence of those passes */
} pass_time_t;

/* A pass of n_tokens for n_seqs sequences computed compute_s. */
void pass_time_note(pass_time_t *p, double compute_s, uint32_t n_tokens, uint32_t n_seqs);

/* What a pass of n_tokens for n_seqs sequences will compute: step_s plus,
 * for each token beyond one per sequence, prefill_s / prefill_tokens (a
 * ratio of averages: a short prompt's pass, mostly fixed costs, weighs
 * little); pass_s until both are measured (0 when nothing is). */
double pass_time_for(const pass_time_t *p, uint32_t n_tokens, uint32_t n_seqs);

#endif

/* sampler: picks the next token from logits (greedy, temperature, top-k, top-p, min-p, repetition/presence/frequency penalties, seeded). */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sampler_params.h"

/* The sampler accepts wider values than the table's ranges where they have a
 * meaning: temperature <= 0 is greedy, top_k <= 0, top_p >= 1 and min_p <= 0
 * are off; repeat_penalty divides positive logits of recent tokens and
 * multiplies negative ones; presence_penalty / frequency_penalty are
 * subtracted (once / once per occurrence) from the logits of generated tokens. */
typedef struct sampler_params {
    SAMPLER_PARAMS(SAMPLER_X_FIELD)
    int32_t repeat_last_n; /* window of recent tokens the penalty looks at; 0 = off */
    uint64_t seed;         /* same params + same seed + same logits = same tokens */
    /* logit_bias: bias[i] is added to the logit of token bias_ids[i] before any other step
     * (penalties, temperature, truncation); (n_bias) entries, copied by sampler_new. */
    const int32_t *bias_ids;
    const float *bias;
    int32_t n_bias;
} sampler_params_t;

/* Defaults: those of SAMPLER_PARAMS, repeat_last_n 64, seed 0, no logit_bias. */
void sampler_params_default(sampler_params_t *p);

typedef struct sampler sampler_t;

/* NULL on bad parameters (NaN, negative top_p...) with a reason in err. */
sampler_t *sampler_new(const sampler_params_t *p, int32_t n_vocab, char *err, size_t errlen);
void sampler_free(sampler_t *s); /* accepts NULL */

/* Choose a token from n_vocab logits (the array is used as scratch and
 * modified). Records the chosen token in the repetition history. */
int32_t sampler_sample(sampler_t *s, float *logits);
/* Add a token to the repetition history without sampling (prompt tokens). */
void sampler_accept(sampler_t *s, int32_t id);

/* One alternative of a token's distribution: an id and its log-probability. */
typedef struct sampler_logprob {
    int32_t id;
    float logprob; /* natural log, <= 0 */
} sampler_logprob_t;

/* The model's raw distribution, as OpenAI's logprobs define it: the
 * log-softmax of the n_vocab logits as the model gave them, before logit_bias,
 * penalties, temperature or truncation. Writes the k (0..n_vocab) likeliest
 * tokens into top, best first (ties: lower id first), and returns the
 * log-sum-exp of the logits, so token i's log-probability is logits[i] minus
 * it. NaN logits count as -inf. logits is only read. */
double sampler_logprobs(const float *logits, int32_t n_vocab, int32_t k, sampler_logprob_t *top);

/* The seed of choice i of a request seeded with seed (n > 1 siblings): seed
 * itself for choice 0, so n = 1 draws what it always drew; a fixed mix of
 * seed and i for the others. */
uint64_t sampler_seed_of_choice(uint64_t seed, uint32_t i);

#endif

/* sampler: picks the next token from logits (greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded). */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sampler_params {
    float temperature;    /* <= 0: greedy argmax */
    int32_t top_k;        /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off; logits of recent tokens divided (>0) / multiplied (<0) */
    int32_t repeat_last_n;/* window of recent tokens the penalty looks at; 0 = off */
    uint64_t seed;        /* same params + same seed + same logits = same tokens */
} sampler_params_t;

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * repeat_penalty 1.0, repeat_last_n 64, seed 0. */
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

#endif

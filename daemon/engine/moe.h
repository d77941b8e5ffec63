/* moe: mixture-of-experts routing on the host: each token's experts and weights from its router logits, and a step's tokens grouped by expert so that each selected expert's weights are read once. */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

enum {
    MOE_OK = 0,
    MOE_ERR_NOMEM = -1,
    MOE_ERR_ARG = -2, /* an expert id or count out of range */
};

/* One token's routing as llama.cpp's softmax gating does it: probabilities
 * p = softmax(logits) over all n_expert experts (float exponentials summed
 * in double), the k most probable (ties: the lower id first) into sel[0..k)
 * in descending order, their probabilities into w[0..k), divided by their
 * sum when norm_w (Mixtral, Qwen3-MoE; not Qwen2-MoE). 1 <= k <= n_expert <=
 * 256. */
void moe_route(const float *logits, uint32_t n_expert, uint32_t k, int norm_w, uint32_t *sel,
               float *w);

/* A step's (token, slot) pairs grouped by expert: group g is expert
 * expert[g] (ascending) and holds entries [start[g], start[g + 1]), tokens
 * ascending. Entry i takes row tok[i] of the step's input and writes its
 * output, times w[i], to row dst[i] = tok * n_slots + slot of the slots
 * buffer. The arrays are the plan's (moe_plan_free). */
typedef struct moe_plan {
    uint32_t n_groups;
    uint32_t *expert; /* n_groups */
    uint32_t *start;  /* n_groups + 1 */
    uint32_t *tok;    /* n_tok * k entries */
    uint32_t *dst;
    float *w;
    size_t cap;      /* entries allocated */
    uint32_t *count; /* n_expert scratch (cap_expert) */
    uint32_t cap_expert;
} moe_plan_t;

/* Groups n_tok tokens' selections (sel/w: k per token, as moe_route gives
 * them) by expert. Slot j of token t is its j-th selection. MOE_ERR_ARG if
 * an id is >= n_expert or n_slots < k. */
int moe_plan_build(moe_plan_t *p, const uint32_t *sel, const float *w, size_t n_tok, uint32_t k,
                   uint32_t n_expert, uint32_t n_slots);
void moe_plan_free(moe_plan_t *p); /* the arrays; p itself is the caller's */

#endif

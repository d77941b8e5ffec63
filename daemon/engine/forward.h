/* forward: the transformer forward pass for a batch of sequences of one model (CPU kernels). */
#ifndef FORWARD_H
#define FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "model.h"
#include "pool.h"

enum {
    FWD_OK = 0,
    FWD_ERR_CONTEXT = -1, /* a sequence would run past its KV cache */
    FWD_ERR_TOKEN = -2,   /* token id outside the vocabulary */
    FWD_ERR_NOMEM = -3,
    FWD_ERR_ARG = -4,
};

/* One sequence's share of a step: n_tokens > 1 is prefill, 1 is decode. */
typedef struct fwd_seq {
    kv_seq_t *kv;          /* tokens land at positions kv->n_past.. ; n_past advances */
    const int32_t *tokens; /* n_tokens ids */
    uint32_t n_tokens;
    float *logits;         /* n_vocab floats for the last token; NULL = not wanted */
} fwd_seq_t;

typedef struct fwd fwd_t;

/* pool is borrowed (NULL = single-threaded). Scratch grows on demand. */
fwd_t *fwd_new(pool_t *pool);
void fwd_free(fwd_t *f); /* accepts NULL */

/* Run one step for n_seqs sequences of the model described by hp/w. On
 * error nothing is written to any KV cache's n_past and err says why. */
int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, char *err, size_t errlen);

#endif

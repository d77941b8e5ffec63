/* forward: the transformer forward pass for a batch of sequences of one model, as a sequence of backend kernels. */
#ifndef FORWARD_H
#define FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "engine/model.h"

enum {
    FWD_OK = 0,
    FWD_ERR_CONTEXT = -1, /* a sequence would run past its KV cache */
    FWD_ERR_TOKEN = -2,   /* token id outside the vocabulary */
    FWD_ERR_NOMEM = -3,
    FWD_ERR_ARG = -4,
    FWD_ERR_DEVICE = -5,  /* a backend kernel or copy failed */
};

/* Segments of a model, in the order the pass needs them. */
#define FWD_SEG_EMBED 0u
#define FWD_SEG_LAYER(l) (1u + (l))
#define FWD_SEG_HEAD(n_layer) (1u + (n_layer))

/* (optional) called before the pass first reads a segment's weights, so a
 * paged-in model's layer i waits only for layer i's copy. */
typedef struct fwd_hooks {
    int (*wait)(void *ctx, uint32_t segment); /* 0 = ready */
    void *ctx;
} fwd_hooks_t;

/* One sequence's share of a step: n_tokens > 1 is prefill, 1 is decode. */
typedef struct fwd_seq {
    kv_seq_t *kv;          /* tokens land at positions kv->n_past.. ; n_past advances */
    const int32_t *tokens; /* n_tokens ids */
    uint32_t n_tokens;
    float *logits;         /* n_vocab floats for the last token; NULL = not wanted */
} fwd_seq_t;

typedef struct fwd fwd_t;

/* be is borrowed; activations live in its scratch buffers, grown on demand. */
fwd_t *fwd_new(const backend_t *be);
void fwd_free(fwd_t *f); /* accepts NULL */

/* Run one step for n_seqs sequences of the model described by hp/w. On
 * error nothing is written to any KV cache's n_past and err says why. */
int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, const fwd_hooks_t *hooks, char *err, size_t errlen);

#endif

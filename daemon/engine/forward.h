/* forward: the transformer forward pass for a batch of sequences of one model, as a sequence of backend kernels. */
#ifndef FORWARD_H
#define FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "engine/lora.h"
#include "engine/model.h"

enum {
    FWD_OK = 0,
    FWD_ERR_CONTEXT = -1, /* a sequence would run past its KV cache */
    FWD_ERR_TOKEN = -2,   /* token id outside the vocabulary */
    FWD_ERR_NOMEM = -3,
    FWD_ERR_ARG = -4,
    FWD_ERR_DEVICE = -5, /* a backend kernel or copy failed */
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
    float *logits;              /* n_vocab floats for the last token; NULL = not wanted (only
                              the rows wanted go through the output head) */
    const lora_weights_t *lora; /* (optional) its adapter's pairs beside the base's matrices;
                                   NULL = the base alone. Consecutive sequences of one adapter
                                   share its products (one read of its pairs for them) */
} fwd_seq_t;

typedef struct fwd fwd_t;

/* Tokens one pass over the layers takes by default (fwd_set_chunk). */
#define FWD_CHUNK_DEFAULT 512u

/* be is borrowed; activations live in its scratch buffers, grown on demand
 * up to what one chunk needs. */
fwd_t *fwd_new(const backend_t *be);
void fwd_free(fwd_t *f); /* accepts NULL */
/* At most tokens tokens per pass over the layers (0 = a step's tokens in one
 * pass): a longer step (a long prompt, a large batch) runs chunk after chunk,
 * each appending its k/v rows to the caches before the next attends to them,
 * so device scratch is sized by the chunk, not by the prompt. Results are
 * the same bit for bit whatever the chunk. */
void fwd_set_chunk(fwd_t *f, uint32_t tokens);
/* Tokens per pass for a step of n_tok tokens. */
uint32_t fwd_chunk_tokens(const fwd_t *f, size_t n_tok);
/* Device scratch bytes a pass of n_tok tokens returning n_out rows of
 * logits needs (activations, the returned rows' hidden states and logits). */
size_t fwd_scratch_need(const model_hparams_t *hp, size_t n_tok, size_t n_out);
/* Device scratch bytes f will hold after a step of n_tok tokens (chunked)
 * returning n_out rows of logits for a model shaped hp (buffers only grow). */
size_t fwd_scratch_after(const fwd_t *f, const model_hparams_t *hp, size_t n_tok, size_t n_out);
/* Device scratch bytes allocated now, and the most ever allocated. */
size_t fwd_scratch_bytes(const fwd_t *f);
size_t fwd_scratch_peak(const fwd_t *f);

/* Mixture of experts: expert matrix reads (each selected expert's gate, up
 * and down read once per layer per pass over the layers: once a step, or
 * once a chunk of a longer one) since f was made. */
uint64_t fwd_expert_reads(const fwd_t *f);
/* Flags of the last fwd_run of a MoE model: entry layer * n_expert + e is 1
 * when some token of the step selected expert e in that layer; NULL before
 * the first. Owned by f, valid until the next fwd_run. */
const uint8_t *fwd_experts_used(const fwd_t *f);

/* Device scratch bytes the adapters' products of a step of n_tok tokens add
 * (rank_max: the largest rank among its adapters; 0 = none), on top of
 * fwd_scratch_need/after. */
size_t fwd_lora_scratch(const fwd_t *f, const model_hparams_t *hp, size_t n_tok, uint32_t rank_max);

/* Run one step for n_seqs sequences of the model described by hp/w. On
 * error nothing is written to any KV cache's n_past and err says why. */
int fwd_run(fwd_t *f, const model_hparams_t *hp, const model_weights_t *w, fwd_seq_t *seqs,
            int n_seqs, const fwd_hooks_t *hooks, char *err, size_t errlen);

#endif

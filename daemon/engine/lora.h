/* lora: a LoRA adapter in llama.cpp's GGUF format (general.type adapter, adapter.type lora), read strictly against its base model: per layer, low-rank pairs on the base's projections, applied beside them (never merged). */
#ifndef LORA_H
#define LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"
#include "engine/model.h"

enum {
    LORA_OK = 0,
    LORA_ERR_IO = -1,
    LORA_ERR_FORMAT = -2,      /* not a LoRA adapter, or an inconsistent one */
    LORA_ERR_BASE = -3,        /* made for another base: architecture or shapes differ */
    LORA_ERR_UNSUPPORTED = -4, /* a tensor or key the engine does not apply exactly */
    LORA_ERR_NOMEM = -5,
};

/* The base matrices an adapter may carry a pair for, with their GGUF names
 * (blk.N.<name>.weight): X(enum, name). */
#define LORA_TARGETS(X)                                                                            \
    X(LORA_Q, "attn_q")                                                                            \
    X(LORA_K, "attn_k")                                                                            \
    X(LORA_V, "attn_v")                                                                            \
    X(LORA_O, "attn_output")                                                                       \
    X(LORA_GATE, "ffn_gate")                                                                       \
    X(LORA_UP, "ffn_up")                                                                           \
    X(LORA_DOWN, "ffn_down")

#define LORA_X_ENUM(e, name) e,
typedef enum lora_target {
    LORA_TARGETS(LORA_X_ENUM) LORA_N_TARGETS
} lora_target_t;
#undef LORA_X_ENUM

/* One pair: y += scale * B (A x), A (n_in -> rank), B (rank -> n_out), as
 * llama.cpp computes it (two products, the scale, then the add). a.data NULL:
 * no pair on that matrix. */
typedef struct lora_pair {
    model_weight_t a, b;
    float scale; /* the adapter's scale x alpha / rank (alpha 0: the scale alone) */
} lora_pair_t;

/* Plain data, like model_weights_t: the pointers may be rebased onto another
 * copy of the bytes and the pass runs on that. */
typedef struct lora_weights {
    lora_pair_t *pairs; /* n_layer * LORA_N_TARGETS, layer-major */
    uint32_t n_layer;
    uint32_t rank_max; /* the largest rank of any pair */
} lora_weights_t;

/* Layer l's pair on target t, or NULL where the adapter has none. */
static inline const lora_pair_t *lora_pair(const lora_weights_t *w, uint32_t l, lora_target_t t)
{
    const lora_pair_t *p = &w->pairs[(size_t)l * LORA_N_TARGETS + t];
    return p->a.data ? p : NULL;
}

typedef struct lora {
    lora_weights_t w;
    float alpha;      /* adapter.lora.alpha (0 = absent) */
    float scale;      /* what the adapter was opened with */
    uint32_t n_pairs; /* pairs present */
    uint64_t bytes;   /* bytes of every pair's A and B */
    gguf_t *gguf;     /* owned: the mapping the pairs point into */
} lora_t;

/* Open an adapter for base at scale (llama.cpp's --lora-scaled; 1 = --lora):
 * every tensor a pair on a matrix of base's with matching shapes, of a type
 * the kernels run (F32, F16, BF16, Q8_0, ...). NULL and err (naming the file
 * and what is wrong) on failure; *code (optional) the LORA_ERR_*. */
lora_t *lora_open(const char *path, const model_t *base, float scale, int *code, char *err,
                  size_t errlen);
/* The same from an opened gguf (ownership passes, also on failure). */
lora_t *lora_from_gguf(gguf_t *g, const model_t *base, float scale, int *code, char *err,
                       size_t errlen);
void lora_close(lora_t *a); /* accepts NULL */
const char *lora_target_name(lora_target_t t);
/* The base matrix target t of layer l adapts (its data NULL when the base has none). */
const model_weight_t *lora_base_view(const model_t *base, uint32_t l, lora_target_t t);

#endif

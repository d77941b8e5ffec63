/* model: Llama-family hyperparameters and weight views taken from a GGUF file. */
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"
#include "kernels/tensor.h"
#include "engine/tokenizer.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 1, /* Llama 2/3, Mistral, TinyLlama, SmolLM: normal RoPE */
    MODEL_ARCH_QWEN2 = 2, /* adds q/k/v biases, NeoX RoPE */
} model_arch_t;

enum {
    MODEL_OK = 0,
    MODEL_ERR_IO = -1,
    MODEL_ERR_FORMAT = -2,     /* bad or inconsistent file */
    MODEL_ERR_UNSUPPORTED = -3,/* architecture or weight type we do not run */
    MODEL_ERR_NOMEM = -4,
};

typedef struct model_hparams {
    model_arch_t arch;
    uint32_t n_ctx_train; /* context length the model was trained for */
    uint32_t n_embd;      /* model width (dim) */
    uint32_t n_ff;        /* feed-forward hidden width */
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;    /* n_embd / n_head */
    uint32_t rope_dim;    /* dims of each head that RoPE rotates (even) */
    uint32_t n_vocab;
    float rope_base;      /* theta base, default 10000 */
    float rms_eps;
    int rope_neox;        /* 1: pairs (i, i + rope_dim/2); 0: pairs (2i, 2i+1) */
} model_hparams_t;

/* The rope parameters of hp, for the backend's rope op. */
static inline kern_rope_t model_rope_of(const model_hparams_t *hp)
{
    return (kern_rope_t){hp->head_dim, hp->rope_dim, hp->rope_base, hp->rope_neox};
}

/* A view of one tensor (kernels/tensor.h): rows of n_in elements of the stored type. */
typedef kern_tensor_t model_weight_t;

typedef struct model_layer {
    model_weight_t attn_norm;          /* (n_embd) F32 */
    model_weight_t wq, wk, wv;         /* (n_embd -> n_head*hd), (n_embd -> n_head_kv*hd) */
    model_weight_t bq, bk, bv;         /* qwen2 biases, F32; data NULL for llama */
    model_weight_t wo;                 /* (n_head*hd -> n_embd) */
    model_weight_t ffn_norm;           /* (n_embd) F32 */
    model_weight_t w_gate, w_up;       /* (n_embd -> n_ff) */
    model_weight_t w_down;             /* (n_ff -> n_embd) */
} model_layer_t;

/* Plain data: the pointers may be rebased onto another copy of the bytes
 * (a pinned host store, device pages) and the forward pass runs on that. */
typedef struct model_weights {
    model_weight_t tok_embd;    /* (n_embd) x n_vocab rows */
    model_weight_t output_norm; /* (n_embd) F32 */
    model_weight_t output;      /* (n_embd -> n_vocab); = tok_embd when tied */
    int tied;                   /* output.weight absent in the file */
    model_layer_t *layers;      /* n_layer of them */
} model_weights_t;

/* gguf_ttype_t values are below this */
#define MODEL_N_TTYPES 40

typedef struct model {
    model_hparams_t hp;
    model_weights_t w;
    gguf_t *gguf;   /* owned: the mapping the weights point into */
    tok_t *tok;     /* owned */
    uint32_t wtype; /* dominant 2-D weight type, for display */
    uint64_t n_params;
    uint64_t weight_bytes;
    uint32_t n_tensors_of[MODEL_N_TTYPES]; /* tensors per gguf_ttype_t */
} model_t;

/* Open a GGUF, validate every tensor against the hyperparameters, build the
 * tokenizer. NULL + reason (naming the file) in err on failure. */
model_t *model_open(const char *path, char *err, size_t errlen);
/* Same, from an already opened gguf (ownership passes to the model, also on
 * failure). */
model_t *model_from_gguf(gguf_t *g, char *err, size_t errlen);
void model_close(model_t *m); /* accepts NULL */

const char *model_arch_name(model_arch_t a);

#endif

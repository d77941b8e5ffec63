/* model: Llama-family hyperparameters and weight views taken from a GGUF file, read strictly (every tensor and math-changing key understood, or the file is refused). */
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"
#include "kernels/tensor.h"
#include "engine/tokenizer.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 1,    /* Llama 2/3, Mistral, TinyLlama, SmolLM: normal RoPE */
    MODEL_ARCH_QWEN2 = 2,    /* adds q/k/v biases, NeoX RoPE */
    MODEL_ARCH_QWEN3 = 3,    /* per-head q/k RMSNorm, no biases, NeoX RoPE */
    MODEL_ARCH_GEMMA2 = 4,   /* embedding scale, post norms, GELU gate, soft-caps, SWA layers */
    MODEL_ARCH_PHI3 = 6,     /* fused QKV and gate/up, long/short RoPE factors, sliding window */
    MODEL_ARCH_GEMMA3 = 5,   /* gemma2 without soft-caps, with q/k norms, 5 of 6 layers SWA with
                              their own RoPE base */
    MODEL_ARCH_QWEN2MOE = 7, /* qwen2 attention; routed experts plus a sigmoid-gated shared one */
    MODEL_ARCH_QWEN3MOE = 8, /* qwen3 attention; routed experts, weights renormalised */
} model_arch_t;

/* Computation features beyond the plain Llama block that a model uses
 * (MODEL_FEAT_*) are declared in kernels/tensor.h: a backend lists those its
 * kernels run (backend_t.model_feats) and a model needing another is refused
 * at load (model_feats_check). */

enum {
    MODEL_OK = 0,
    MODEL_ERR_IO = -1,
    MODEL_ERR_FORMAT = -2,      /* bad or inconsistent file */
    MODEL_ERR_UNSUPPORTED = -3, /* architecture or weight type we do not run */
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
    uint32_t head_dim; /* attention.key_length, default n_embd / n_head */
    uint32_t rope_dim; /* dims of each head that RoPE rotates (even) */
    uint32_t n_vocab;
    float rope_base; /* theta base, default 10000 */
    float rms_eps;
    int rope_neox;           /* 1: pairs (i, i + rope_dim/2); 0: pairs (2i, 2i+1) */
    float rope_freq_scale;   /* positions are multiplied by this (1 / linear factor; 1 = none) */
    float rope_attn_factor;  /* rotated q/k values are multiplied by this
                                 (rope.scaling.attn_factor); 0 or 1 = none */
    const float *rope_freqs; /* (rope_dim/2) divisors of each pair's frequency, host memory
                                 (the file mapping); NULL = none */
    float rope_ext_factor;   /* YaRN extrapolation mix (1); 0 = no YaRN */
    float rope_corr_lo, rope_corr_hi; /* YaRN correction range, in pairs (kern_rope_t) */
    const float *rope_freqs_short, *rope_freqs_long; /* phi3 LongRoPE factors (rope_dim/2,
                                 the file mapping); NULL = none. model_set_context
                                 points rope_freqs at one of them */
    uint32_t rope_ctx_orig; /* phi3: contexts above this take the long factors */
    uint32_t feats;         /* MODEL_FEAT_* bits this model needs */
    float emb_scale;        /* embeddings are multiplied by this; 0 = not (gemma: sqrt(n_embd)) */
    float att_scale;        /* attention score scale; 0 = 1/sqrt(head_dim) */
    float attn_softcap;     /* attention scores soft-capped at this; 0 = none */
    float final_softcap;    /* output logits soft-capped at this; 0 = none */
    uint32_t swa_window;    /* sliding window of the SWA layers, positions; 0 = none */
    uint32_t swa_pattern;   /* layer l slides unless (l + 1) % swa_pattern == 0 (gemma2: 2);
                             0: every layer (phi3) */
    float rope_base_swa;    /* RoPE base of the sliding layers, unscaled; 0 = as the others */
    int gelu;               /* 1: GELU-tanh gate, 0: SiLU */
    /* mixture of experts (MODEL_FEAT_MOE): each token's FFN is the weighted sum of the
     * n_expert_used experts its router ranks highest (softmax over all n_expert logits) */
    uint32_t n_expert;      /* routed experts per layer; 0 = a dense model */
    uint32_t n_expert_used; /* experts each token takes (top-k), 1..n_expert */
    uint32_t n_ff_exp;      /* an expert's feed-forward width */
    uint32_t n_ff_shexp;    /* the shared expert's width (qwen2moe); 0 = none */
    int moe_norm_w;         /* 1: the k selected probabilities renormalised to sum 1 */
} model_hparams_t;

/* Most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS). */
#define MODEL_MAX_EXPERTS 256u

/* The rope parameters of hp, for the backend's rope op. */
static inline kern_rope_t model_rope_of(const model_hparams_t *hp)
{
    return (kern_rope_t){.head_dim = hp->head_dim,
                         .rope_dim = hp->rope_dim,
                         .rope_base = hp->rope_base,
                         .rope_neox = hp->rope_neox,
                         .rope_freq_scale = hp->rope_freq_scale,
                         .rope_attn_factor = hp->rope_attn_factor,
                         .rope_freqs = hp->rope_freqs,
                         .rope_ext_factor = hp->rope_ext_factor,
                         .rope_corr_lo = hp->rope_corr_lo,
                         .rope_corr_hi = hp->rope_corr_hi};
}

/* A view of one tensor (kernels/tensor.h): rows of n_in elements of the stored type. */
typedef kern_tensor_t model_weight_t;

typedef struct model_layer {
    model_weight_t attn_norm;      /* (n_embd) F32 */
    model_weight_t wq, wk, wv;     /* (n_embd -> n_head*hd), (n_embd -> n_head_kv*hd) */
    model_weight_t bq, bk, bv;     /* qwen2 biases, F32; data NULL for llama */
    model_weight_t q_norm, k_norm; /* (head_dim) F32 per-head norms (qwen3); data NULL otherwise */
    model_weight_t post_attn_norm; /* (n_embd) F32 norm of the attention output (gemma2) */
    model_weight_t post_ffn_norm;  /* (n_embd) F32 norm of the FFN output (gemma2) */
    model_weight_t wo;             /* (n_head*hd -> n_embd) */
    model_weight_t ffn_norm;       /* (n_embd) F32 */
    model_weight_t w_gate, w_up;   /* (n_embd -> n_ff) */
    model_weight_t w_down;         /* (n_ff -> n_embd) */
    /* MoE layers (hp.n_expert > 0; data NULL otherwise): expert e's matrices are rows
     * [e * n_ff_exp, (e + 1) * n_ff_exp) of the stacked ones (model_expert_view) */
    model_weight_t gate_inp;             /* (n_embd -> n_expert) router */
    model_weight_t gate_exps, up_exps;   /* (n_embd -> n_ff_exp) x n_expert, stacked */
    model_weight_t down_exps;            /* (n_ff_exp -> n_embd) x n_expert, stacked */
    model_weight_t gate_inp_shexp;       /* (n_embd -> 1) shared expert's gate (qwen2moe) */
    model_weight_t gate_shexp, up_shexp; /* (n_embd -> n_ff_shexp) */
    model_weight_t down_shexp;           /* (n_ff_shexp -> n_embd) */
} model_layer_t;

/* Expert e of a stacked expert tensor of n_expert experts: a view of its rows. */
static inline model_weight_t model_expert_view(const model_weight_t *w, uint32_t n_expert,
                                               uint32_t e)
{
    model_weight_t v = *w;
    size_t bytes = w->nbytes / n_expert;
    v.n_out = w->n_out / n_expert;
    v.data = (const uint8_t *)w->data + (size_t)e * bytes;
    v.nbytes = bytes;
    return v;
}

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
/* The context (positions per sequence) the model will be run with, as
 * llama.cpp's n_ctx: a phi3 file whose long RoPE factors differ from the
 * short ones takes the long ones (for every position) when n_ctx is above
 * rope.scaling.original_context_length, the short ones otherwise. No effect
 * on other files. Call before running it. */
void model_set_context(model_t *m, uint32_t n_ctx);

const char *model_arch_name(model_arch_t a);

/* 0 if a backend whose kernels run the features `supported` (MODEL_FEAT_*)
 * can run a model needing hp->feats; else MODEL_ERR_UNSUPPORTED and err
 * names the backend and each missing feature. */
int model_feats_check(const model_hparams_t *hp, uint32_t supported, const char *backend, char *err,
                      size_t errlen);

#endif

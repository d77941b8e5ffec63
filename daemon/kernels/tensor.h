/* tensor: the plain operand types of the compute kernels (a weight tensor view, matmul jobs, attention operands, rope parameters); the backend interface names them, the engine fills them. */
#ifndef TENSOR_H
#define TENSOR_H

#include <stddef.h>
#include <stdint.h>

/* Kernel return codes; backend.h's BE_ERR_* have the same values. */
enum {
    KERN_OK = 0,
    KERN_ERR_NOMEM = -1, /* memory exhausted */
    KERN_ERR_ARG = -3,   /* operands out of range */
};

/* A view of one tensor: rows of n_in elements of the stored type. */
typedef struct kern_tensor {
    uint32_t type;    /* gguf_ttype_t (kernels/wtype.h) */
    uint32_t n_in;    /* elements per row (ne[0]) */
    uint32_t n_out;   /* rows (ne[1]); 1 for vectors */
    const void *data; /* n_out rows of quant_row_bytes(type, n_in); NULL if absent */
    size_t nbytes;
} kern_tensor_t;

/* Where one token of a step reads and writes its attention state. The KV
 * cache layout is the kv_seq_t one (engine/kv.h): base pointers in device memory. */
typedef struct kern_tok {
    void *k_base;   /* kv_seq_t.k of its sequence (device address) */
    void *v_base;   /* kv_seq_t.v of its sequence */
    uint32_t n_ctx; /* that sequence's capacity */
    uint32_t pos;   /* position of this token */
} kern_tok_t;

/* Element type of a KV cache (engine/kv.h names it kv_type_t). */
typedef enum kv_type {
    KV_TYPE_F16 = 0, /* IEEE half, rounded to nearest even (the default) */
    KV_TYPE_F32 = 1,
} kv_type_t;

/* Operands of the attention op for one layer. */
typedef struct kern_att {
    const kern_tok_t *toks; /* n_tok entries, host memory */
    uint32_t layer, n_layer;
    uint32_t n_head, n_head_kv, head_dim;
    size_t stride;     /* floats between rows of q/out/k/v */
    float scale;       /* score scale; 0 = 1/sqrt(head_dim) */
    float softcap;     /* scores become softcap*tanh(s/softcap); 0 = none (gemma2) */
    uint32_t window;   /* attend to the last `window` positions only; 0 = all */
    kv_type_t kv_type; /* element type of every token's cache. F16: rows are
                          rounded to half on store; q is rounded to half and
                          the products summed in F32 on read; cpu/sim also
                          round the softmax weights to half before weighting
                          V (llama.cpp's F16-KV math), cuda keeps them F32 */
} kern_att_t;

/* A matmul job: y[t][r] = dot(W row r, x[t]) for t < n_tok. Several jobs
 * sharing x may be passed in one call (q/k/v, gate/up) so a backend can fuse
 * them. */
typedef struct kern_mm {
    const kern_tensor_t *w; /* data is a device address */
    float *y;
    size_t y_stride;
} kern_mm_t;

/* A LoRA job: y[t] += scale * (b (a x[t])) for the call's rows t in [row0, row0 + n_rows), a
 * (n_in -> rank) and b (rank -> n_out) products as a kern_mm_t's, the scale then the add. */
typedef struct kern_lora {
    const kern_tensor_t *a, *b; /* data are device addresses */
    float scale;
    size_t row0, n_rows;
} kern_lora_t;

/* Rotary position embedding of the first rope_dim of each head_dim. */
typedef struct kern_rope {
    uint32_t head_dim;
    uint32_t rope_dim;     /* <= head_dim, even */
    float rope_base;       /* theta base */
    int rope_neox;         /* 1: pairs (i, i + rope_dim/2) (NeoX); 0: adjacent pairs (GPT-J) */
    float rope_freq_scale; /* positions are multiplied by this (1 / linear factor; 0 or 1 = none) */
    float rope_attn_factor; /* rotated values are multiplied by this (0 or 1 = none) */
    const float
        *rope_freqs; /* (rope_dim/2) divisors of each pair's frequency, host memory; NULL = none */
    float rope_ext_factor; /* YaRN: 0 = none; else pair i's frequency mixes the scaled one
                              (weight 1 - r) with the unscaled (r = ext * ramp(i)) */
    float rope_corr_lo, rope_corr_hi; /* YaRN ramp: 1 for pairs i <= lo, 0 from hi on */
} kern_rope_t;

/* Model features beyond the plain llama pass: a backend lists those its kernels
 * run (backend_t.model_feats) and a model needing another is refused at load
 * (engine/model.h: model_feats_check). */
enum {
    MODEL_FEAT_ROPE_FREQS = 1u << 0,  /* per-pair RoPE frequency factors (llama3 rope_freqs) */
    MODEL_FEAT_ROPE_LINEAR = 1u << 1, /* linear RoPE scaling: positions times rope_freq_scale */
    MODEL_FEAT_QK_NORM = 1u << 2,     /* per-head RMSNorm of q and k before RoPE */
    MODEL_FEAT_EMB_SCALE = 1u << 3,   /* embeddings times sqrt(n_embd) (backend scale) */
    MODEL_FEAT_SOFTCAP = 1u << 4,     /* attention-score and final-logit soft-capping */
    MODEL_FEAT_SWA = 1u << 5,         /* sliding-window attention layers */
    MODEL_FEAT_GELU = 1u << 6,        /* GELU (tanh) gated feed-forward */
    MODEL_FEAT_ROPE_MSCALE = 1u << 7, /* RoPE cos/sin times rope_attn_factor (Phi-3 LongRoPE) */
    MODEL_FEAT_ROPE_YARN = 1u << 8,   /* YaRN: per-pair ramp between scaled and unscaled freqs */
    MODEL_FEAT_ALL = (1u << 9) - 1,   /* every feature of the dense families */
    /* routed experts: the moe_scatter and moe_sum kernels (not in MODEL_FEAT_ALL: a backend
     * lists it when it has them) */
    MODEL_FEAT_MOE = 1u << 9,
};

#endif

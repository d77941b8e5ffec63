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
    float *k_base;  /* kv_seq_t.k of its sequence (device address) */
    float *v_base;  /* kv_seq_t.v of its sequence */
    uint32_t n_ctx; /* that sequence's capacity */
    uint32_t pos;   /* position of this token */
} kern_tok_t;

/* Operands of the attention op for one layer. */
typedef struct kern_att {
    const kern_tok_t *toks; /* n_tok entries, host memory */
    uint32_t layer, n_layer;
    uint32_t n_head, n_head_kv, head_dim;
    size_t stride; /* floats between rows of q/out/k/v */
} kern_att_t;

/* A matmul job: y[t][r] = dot(W row r, x[t]) for t < n_tok. Several jobs
 * sharing x may be passed in one call (q/k/v, gate/up) so a backend can fuse
 * them. */
typedef struct kern_mm {
    const kern_tensor_t *w; /* data is a device address */
    float *y;
    size_t y_stride;
} kern_mm_t;

/* Rotary position embedding of the first rope_dim of each head_dim. */
typedef struct kern_rope {
    uint32_t head_dim;
    uint32_t rope_dim;  /* <= head_dim, even */
    float rope_base;    /* theta base */
    int rope_neox;      /* 1: pairs (i, i + rope_dim/2) (NeoX); 0: adjacent pairs (GPT-J) */
} kern_rope_t;

#endif

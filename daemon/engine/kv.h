/* kv: the per-sequence key/value cache of the attention layers (F16 by default, F32 on request). */
#ifndef KV_H
#define KV_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

/* The element type of a KV cache, kv_type_t, is kernels/tensor.h's (the kernels read it):
 * F16 halves the bytes per token; F32 keeps the rows exactly as computed. */

typedef struct kv_seq {
    uint32_t n_layer;
    uint32_t n_ctx;  /* positions this sequence may hold */
    uint32_t kv_dim; /* n_head_kv * head_dim */
    uint32_t n_past; /* positions filled so far */
    kv_type_t type;  /* element type of k and v */
    void *k;         /* (n_ctx, n_layer, kv_dim) elements of type: position-major,
                         so a growing sequence only ever needs more memory at the end */
    void *v;         /* (n_ctx, n_layer, kv_dim) */
    void *owner;     /* NULL: k/v are malloc'ed by kv_seq_new; else whoever
                         mapped them (the residency manager) */
} kv_seq_t;

/* Bytes of one element of type t (2 or 4). */
size_t kv_type_size(kv_type_t t);
/* "f16" / "f32". */
const char *kv_type_name(kv_type_t t);
/* Bytes one position takes in k and v together, all layers. */
size_t kv_bytes_per_pos(const model_hparams_t *hp, kv_type_t t);
/* Bytes a sequence of n_ctx positions needs (k and v). */
size_t kv_seq_bytes(const model_hparams_t *hp, uint32_t n_ctx, kv_type_t t);
/* NULL when out of memory or n_ctx is 0. Free with kv_seq_free. */
kv_seq_t *kv_seq_new(const model_hparams_t *hp, uint32_t n_ctx, kv_type_t t);
void kv_seq_free(kv_seq_t *s); /* accepts NULL */
void kv_seq_reset(kv_seq_t *s);

#endif

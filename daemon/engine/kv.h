/* kv: the per-sequence key/value cache of the attention layers (F32). */
#ifndef KV_H
#define KV_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

typedef struct kv_seq {
    uint32_t n_layer;
    uint32_t n_ctx;   /* positions this sequence may hold */
    uint32_t kv_dim;  /* n_head_kv * head_dim */
    uint32_t n_past;  /* positions filled so far */
    float *k;         /* (n_ctx, n_layer, kv_dim): position-major, so a growing
                         sequence only ever needs more memory at the end */
    float *v;         /* (n_ctx, n_layer, kv_dim) */
    void *owner;      /* NULL: k/v are malloc'ed by kv_seq_new; else whoever
                         mapped them (the residency manager) */
} kv_seq_t;

/* Bytes a sequence of n_ctx positions needs. */
size_t kv_seq_bytes(const model_hparams_t *hp, uint32_t n_ctx);
/* NULL when out of memory or n_ctx is 0. Free with kv_seq_free. */
kv_seq_t *kv_seq_new(const model_hparams_t *hp, uint32_t n_ctx);
void kv_seq_free(kv_seq_t *s); /* accepts NULL */
void kv_seq_reset(kv_seq_t *s);

#endif

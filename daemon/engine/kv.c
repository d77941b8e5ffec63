/* kv: the per-sequence key/value cache of the attention layers (F32). */
#include "engine/kv.h"

#include <stdlib.h>

size_t kv_seq_bytes(const model_hparams_t *hp, uint32_t n_ctx)
{
    return 2 * (size_t)hp->n_layer * n_ctx * hp->n_head_kv * hp->head_dim * sizeof(float);
}

kv_seq_t *kv_seq_new(const model_hparams_t *hp, uint32_t n_ctx)
{
    if (n_ctx == 0)
        return NULL;
    kv_seq_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->n_layer = hp->n_layer;
    s->n_ctx = n_ctx;
    s->kv_dim = hp->n_head_kv * hp->head_dim;
    size_t n = (size_t)s->n_layer * n_ctx * s->kv_dim;
    s->k = malloc(n * sizeof(float));
    s->v = malloc(n * sizeof(float));
    if (!s->k || !s->v) {
        kv_seq_free(s);
        return NULL;
    }
    return s;
}

void kv_seq_free(kv_seq_t *s)
{
    if (!s)
        return;
    free(s->k);
    free(s->v);
    free(s);
}

void kv_seq_reset(kv_seq_t *s)
{
    s->n_past = 0;
}

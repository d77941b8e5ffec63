/* kv: the per-sequence key/value cache of the attention layers (F16 by default, F32 on request). */
#include "engine/kv.h"

#include <stdlib.h>
#include <sys/mman.h>

/* Caches of at least this many bytes sit on 2 MiB boundaries with a transparent-huge-page hint, as
 * the cpu backend's pool pages do: attention reads their rows a position apart (all layers' K
 * between them), one 4 KiB page each, which a long context overflows the TLB with. */
#define KV_HUGE ((size_t)2 << 20)

size_t kv_type_size(kv_type_t t)
{
    return t == KV_TYPE_F32 ? 4 : 2;
}

const char *kv_type_name(kv_type_t t)
{
    return t == KV_TYPE_F32 ? "f32" : "f16";
}

size_t kv_bytes_per_pos(const model_hparams_t *hp, kv_type_t t)
{
    return 2 * (size_t)hp->n_layer * hp->n_head_kv * hp->head_dim * kv_type_size(t);
}

size_t kv_seq_bytes(const model_hparams_t *hp, uint32_t n_ctx, kv_type_t t)
{
    return kv_bytes_per_pos(hp, t) * n_ctx;
}

/* n bytes, free()d by the caller; NULL when out of memory. */
static void *kv_alloc(size_t n)
{
    if (n < KV_HUGE)
        return malloc(n);
    size_t r = (n + KV_HUGE - 1) / KV_HUGE * KV_HUGE;
    void *p = aligned_alloc(KV_HUGE, r);
    if (p)
        madvise(p, r, MADV_HUGEPAGE); /* a hint: without transparent huge pages, 4 KiB ones */
    return p;
}

kv_seq_t *kv_seq_new(const model_hparams_t *hp, uint32_t n_ctx, kv_type_t t)
{
    if (n_ctx == 0 || (t != KV_TYPE_F16 && t != KV_TYPE_F32))
        return NULL;
    kv_seq_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->n_layer = hp->n_layer;
    s->n_ctx = n_ctx;
    s->kv_dim = hp->n_head_kv * hp->head_dim;
    s->type = t;
    size_t n = (size_t)s->n_layer * n_ctx * s->kv_dim;
    s->k = kv_alloc(n * kv_type_size(t));
    s->v = kv_alloc(n * kv_type_size(t));
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

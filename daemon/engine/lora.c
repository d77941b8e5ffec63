/* lora: a LoRA adapter in llama.cpp's GGUF format (general.type adapter, adapter.type lora), read strictly against its base model: per layer, low-rank pairs on the base's projections, applied beside them (never merged). */
#include "engine/lora.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/wtype.h"

#define LORA_MAX_RANK 8192u

#define LORA_X_NAME(e, name) name,
static const char *const lora_names[LORA_N_TARGETS] = {LORA_TARGETS(LORA_X_NAME)};
#undef LORA_X_NAME

const char *lora_target_name(lora_target_t t)
{
    return (unsigned)t < LORA_N_TARGETS ? lora_names[t] : "?";
}

/* err and *code (optional) set; returns c. */
__attribute__((format(printf, 5, 6))) static int fail(int *code, int c, char *err, size_t errlen,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (code)
        *code = c;
    return c;
}

/* general.type adapter, adapter.type lora, the base's architecture, alpha;
 * any other key outside general.* is refused (it would change the math:
 * llama.cpp's newer adapter kinds add keys). */
static int check_meta(const gguf_t *g, const model_t *base, float *alpha, int *code, char *err,
                      size_t errlen)
{
    const char *path = gguf_path(g);
    char type[64] = "", atype[64] = "", arch[64] = "", barch[64] = "";
    if (gguf_get_str_buf(g, "general.type", type, sizeof type) < 0 || strcmp(type, "adapter"))
        return fail(code, LORA_ERR_FORMAT, err, errlen,
                    "%s: not an adapter (general.type '%s', expected 'adapter')", path, type);
    if (gguf_get_str_buf(g, "adapter.type", atype, sizeof atype) < 0 || strcmp(atype, "lora"))
        return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                    "%s: adapter.type '%s' is not implemented (only 'lora')", path, atype);
    if (gguf_get_str_buf(g, "general.architecture", arch, sizeof arch) < 0 ||
        gguf_get_str_buf(base->gguf, "general.architecture", barch, sizeof barch) < 0 ||
        strcmp(arch, barch))
        return fail(code, LORA_ERR_BASE, err, errlen,
                    "%s: an adapter for architecture '%s', the base '%s' is '%s'", path, arch,
                    gguf_path(base->gguf), barch);
    *alpha = 0.0f;
    if (gguf_get(g, "adapter.lora.alpha") && gguf_get_f32(g, "adapter.lora.alpha", alpha))
        return fail(code, LORA_ERR_FORMAT, err, errlen, "%s: adapter.lora.alpha is not a float32",
                    path);
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const char *k = gguf_kv_at(g, i)->key;
        if (strncmp(k, "general.", 8) && strcmp(k, "adapter.type") &&
            strcmp(k, "adapter.lora.alpha"))
            return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                        "%s: metadata key '%s' is not implemented, so the adapter is refused", path,
                        k);
    }
    return 0;
}

/* blk.N.<target>.weight -> layer and target; -1 if the name is not one. */
static int parse_name(const char *name, uint32_t n_layer, uint32_t *layer, lora_target_t *t)
{
    unsigned l;
    int n = 0;
    if (sscanf(name, "blk.%u.%n", &l, &n) != 1 || n == 0 || l >= n_layer)
        return -1;
    const char *rest = name + n;
    for (int k = 0; k < LORA_N_TARGETS; k++) {
        size_t len = strlen(lora_names[k]);
        if (!strncmp(rest, lora_names[k], len) && !strcmp(rest + len, ".weight")) {
            *layer = l;
            *t = (lora_target_t)k;
            return 0;
        }
    }
    return -1;
}

const model_weight_t *lora_base_view(const model_t *base, uint32_t l, lora_target_t t)
{
    const model_layer_t *L = &base->w.layers[l];
    const model_weight_t *v[LORA_N_TARGETS] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                               &L->w_gate, &L->w_up, &L->w_down};
    return v[t];
}

/* One tensor of the file into its pair's A or B slot. */
static int take_tensor(lora_t *a, const model_t *base, const gguf_tensor_t *t, int *code, char *err,
                       size_t errlen)
{
    const char *path = gguf_path(a->gguf);
    char name[256];
    size_t len = strlen(t->name);
    int is_a = len > 7 && !strcmp(t->name + len - 7, ".lora_a");
    int is_b = len > 7 && !strcmp(t->name + len - 7, ".lora_b");
    if (!is_a && !is_b) {
        if (len > 12 && !strcmp(t->name + len - 12, "_norm.weight"))
            return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                        "%s: tensor '%s' (a fine-tuned norm) is not applied by this engine, so the "
                        "adapter is refused",
                        path, t->name);
        return fail(code, LORA_ERR_FORMAT, err, errlen,
                    "%s: tensor '%s' is neither a .lora_a nor a .lora_b", path, t->name);
    }
    if (len - 7 >= sizeof name)
        return fail(code, LORA_ERR_FORMAT, err, errlen, "%s: tensor name too long", path);
    memcpy(name, t->name, len - 7);
    name[len - 7] = 0;
    uint32_t l;
    lora_target_t tg;
    if (parse_name(name, base->hp.n_layer, &l, &tg) || !gguf_find_tensor(base->gguf, name)) {
        if (gguf_find_tensor(base->gguf, name))
            return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                        "%s: a pair on '%s' is not applied by this engine (only %s, %s, %s, %s, "
                        "%s, %s and %s of each layer), so the adapter is refused",
                        path, name, lora_names[0], lora_names[1], lora_names[2], lora_names[3],
                        lora_names[4], lora_names[5], lora_names[6]);
        return fail(code, LORA_ERR_BASE, err, errlen,
                    "%s: tensor '%s' is not in the base model %s (an adapter for another base?)",
                    path, name, gguf_path(base->gguf));
    }
    if (base->hp.arch == MODEL_ARCH_PHI3 && tg == LORA_UP)
        return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                    "%s: a pair on '%s' (phi3's fused gate and up) is not applied by this engine, "
                    "so the adapter is refused",
                    path, name);
    lora_pair_t *p = &a->w.pairs[(size_t)l * LORA_N_TARGETS + tg];
    model_weight_t *w = is_a ? &p->a : &p->b;
    if (w->data)
        return fail(code, LORA_ERR_FORMAT, err, errlen, "%s: tensor '%s' twice", path, t->name);
    uint32_t blck;
    if (t->n_dims != 2 || t->ne[0] == 0 || t->ne[1] == 0 || t->ne[0] > UINT32_MAX ||
        t->ne[1] > UINT32_MAX || !quant_type_supported(t->type) ||
        gguf_ttype_traits(t->type, &blck, NULL) || t->ne[0] % blck)
        return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                    "%s: tensor '%s' (%u dims, [%llu, %llu], type %u) is not a matrix the "
                    "kernels run",
                    path, t->name, t->n_dims, (unsigned long long)t->ne[0],
                    (unsigned long long)t->ne[1], (unsigned)t->type);
    *w = (model_weight_t){.type = t->type,
                          .n_in = (uint32_t)t->ne[0],
                          .n_out = (uint32_t)t->ne[1],
                          .data = t->data,
                          .nbytes = t->nbytes};
    return 0;
}

/* Every pair whole and shaped for its base matrix; scales; rank and bytes. */
static int check_pairs(lora_t *a, const model_t *base, int *code, char *err, size_t errlen)
{
    const char *path = gguf_path(a->gguf);
    for (uint32_t l = 0; l < a->w.n_layer; l++) {
        for (int k = 0; k < LORA_N_TARGETS; k++) {
            lora_pair_t *p = &a->w.pairs[(size_t)l * LORA_N_TARGETS + k];
            if (!p->a.data && !p->b.data)
                continue;
            if (!p->a.data || !p->b.data)
                return fail(code, LORA_ERR_FORMAT, err, errlen,
                            "%s: blk.%u.%s.weight has a %s but no %s", path, l, lora_names[k],
                            p->a.data ? "lora_a" : "lora_b", p->a.data ? "lora_b" : "lora_a");
            const model_weight_t *bw = lora_base_view(base, l, (lora_target_t)k);
            uint32_t rank = p->b.n_in;
            if (p->a.n_out != rank)
                return fail(code, LORA_ERR_FORMAT, err, errlen,
                            "%s: blk.%u.%s.weight: lora_a has rank %u, lora_b %u (lora_a not "
                            "transposed?)",
                            path, l, lora_names[k], p->a.n_out, rank);
            if (p->a.n_in != bw->n_in || p->b.n_out != bw->n_out)
                return fail(code, LORA_ERR_BASE, err, errlen,
                            "%s: blk.%u.%s.weight: the pair maps %u -> %u, the base matrix %u -> "
                            "%u (an adapter for another base?)",
                            path, l, lora_names[k], p->a.n_in, p->b.n_out, bw->n_in, bw->n_out);
            if (rank > LORA_MAX_RANK)
                return fail(code, LORA_ERR_UNSUPPORTED, err, errlen,
                            "%s: blk.%u.%s.weight: rank %u (at most %u)", path, l, lora_names[k],
                            rank, LORA_MAX_RANK);
            p->scale = a->alpha != 0.0f ? a->scale * a->alpha / (float)rank : a->scale;
            if (rank > a->w.rank_max)
                a->w.rank_max = rank;
            a->n_pairs++;
            a->bytes += p->a.nbytes + p->b.nbytes;
        }
    }
    if (!a->n_pairs)
        return fail(code, LORA_ERR_FORMAT, err, errlen, "%s: an adapter with no lora pairs", path);
    return 0;
}

lora_t *lora_from_gguf(gguf_t *g, const model_t *base, float scale, int *code, char *err,
                       size_t errlen)
{
    lora_t *a = calloc(1, sizeof *a);
    if (!a) {
        gguf_close(g);
        fail(code, LORA_ERR_NOMEM, err, errlen, "out of memory");
        return NULL;
    }
    a->gguf = g;
    a->scale = scale;
    a->w.n_layer = base->hp.n_layer;
    a->w.pairs = calloc((size_t)base->hp.n_layer * LORA_N_TARGETS, sizeof *a->w.pairs);
    if (!a->w.pairs) {
        fail(code, LORA_ERR_NOMEM, err, errlen, "out of memory");
        goto bad;
    }
    if (check_meta(g, base, &a->alpha, code, err, errlen))
        goto bad;
    for (size_t i = 0; i < gguf_tensor_count(g); i++)
        if (take_tensor(a, base, gguf_tensor_at(g, i), code, err, errlen))
            goto bad;
    if (check_pairs(a, base, code, err, errlen))
        goto bad;
    if (code)
        *code = LORA_OK;
    return a;
bad:
    lora_close(a);
    return NULL;
}

lora_t *lora_open(const char *path, const model_t *base, float scale, int *code, char *err,
                  size_t errlen)
{
    gguf_t *g = gguf_open(path, err, errlen);
    if (!g) {
        if (code)
            *code = LORA_ERR_IO;
        return NULL;
    }
    return lora_from_gguf(g, base, scale, code, err, errlen);
}

void lora_close(lora_t *a)
{
    if (!a)
        return;
    free(a->w.pairs);
    gguf_close(a->gguf);
    free(a);
}

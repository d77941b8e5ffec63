/* model: Llama-family hyperparameters and weight views taken from a GGUF file. */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"

const char *model_arch_name(model_arch_t a)
{
    switch (a) {
    case MODEL_ARCH_LLAMA: return "llama";
    case MODEL_ARCH_QWEN2: return "qwen2";
    default: return "?";
    }
}

/* Reads "<arch>.<suffix>" as u32; absent -> def (def < 0 means required). */
static int hp_u32(const gguf_t *g, const char *arch, const char *suffix, int64_t def, uint32_t *out,
                  char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, out);
    if (rc == GGUF_ERR_NOTFOUND && def >= 0) {
        *out = (uint32_t)def;
        return 0;
    }
    if (rc == GGUF_ERR_NOTFOUND) {
        snprintf(err, errlen, "%s: missing metadata key '%s'", gguf_path(g), key);
        return -1;
    }
    if (rc) {
        snprintf(err, errlen, "%s: metadata key '%s' is not an unsigned 32-bit integer",
                 gguf_path(g), key);
        return -1;
    }
    return 0;
}

static int hp_f32(const gguf_t *g, const char *arch, const char *suffix, float def, float *out,
                  char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    if (rc == GGUF_ERR_NOTFOUND) {
        *out = def;
        return 0;
    }
    if (rc || !isfinite(*out)) {
        snprintf(err, errlen, "%s: metadata key '%s' is not a finite float", gguf_path(g), key);
        return -1;
    }
    return 0;
}

/* Looks a tensor up and checks its shape (n_in x n_out; n_out 0 = 1-D) and
 * type. required = 0 lets it be absent (data stays NULL). */
static int get_weight(const gguf_t *g, const char *name, uint32_t n_in, uint32_t n_out,
                      int f32_only, int required, model_weight_t *w, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    if (!t) {
        if (!required)
            return 0;
        snprintf(err, errlen, "%s: missing tensor '%s'", gguf_path(g), name);
        return -1;
    }
    uint32_t want_dims = n_out ? 2 : 1;
    int ok = t->ne[0] == n_in && (n_out ? t->ne[1] == n_out : 1);
    for (uint32_t d = want_dims; d < GGUF_MAX_DIMS; d++)
        ok = ok && t->ne[d] == 1;
    if (!ok) {
        snprintf(err, errlen,
                 "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%u, %u]",
                 gguf_path(g), name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                 (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], n_in,
                 n_out ? n_out : 1);
        return -1;
    }
    if (f32_only ? t->type != GGUF_T_F32 : !quant_type_supported(t->type)) {
        char types[256];
        if (f32_only)
            snprintf(types, sizeof types, "norms and biases must be F32");
        else
            quant_type_list(types, sizeof types);
        snprintf(err, errlen, "%s: tensor '%s' has type %s, which is not supported here (%s)",
                 gguf_path(g), name, gguf_ttype_name(t->type), types);
        return -1;
    }
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out ? n_out : 1;
    w->data = t->data;
    w->nbytes = t->nbytes;
    return 0;
}

static int read_hparams(const gguf_t *g, model_hparams_t *hp, char *err, size_t errlen)
{
    gguf_str_t a;
    if (gguf_get_str(g, "general.architecture", &a)) {
        snprintf(err, errlen, "%s: missing or non-string 'general.architecture'", gguf_path(g));
        return MODEL_ERR_FORMAT;
    }
    char arch[32];
    if (a.len >= sizeof arch) {
        snprintf(err, errlen, "%s: architecture name too long", gguf_path(g));
        return MODEL_ERR_FORMAT;
    }
    memcpy(arch, a.ptr, a.len);
    arch[a.len] = 0;
    memset(hp, 0, sizeof *hp);
    if (strcmp(arch, "llama") == 0) {
        hp->arch = MODEL_ARCH_LLAMA;
    } else if (strcmp(arch, "qwen2") == 0) {
        hp->arch = MODEL_ARCH_QWEN2;
        hp->rope_neox = 1;
    } else {
        snprintf(err, errlen, "%s: architecture '%s' is not supported (llama, qwen2)",
                 gguf_path(g), arch);
        return MODEL_ERR_UNSUPPORTED;
    }
    if (hp_u32(g, arch, "embedding_length", -1, &hp->n_embd, err, errlen) ||
        hp_u32(g, arch, "block_count", -1, &hp->n_layer, err, errlen) ||
        hp_u32(g, arch, "feed_forward_length", -1, &hp->n_ff, err, errlen) ||
        hp_u32(g, arch, "attention.head_count", -1, &hp->n_head, err, errlen) ||
        hp_u32(g, arch, "context_length", 2048, &hp->n_ctx_train, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp_u32(g, arch, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->n_embd == 0 || hp->n_embd > 65536 || hp->n_layer == 0 || hp->n_layer > 1024 ||
        hp->n_ff == 0 || hp->n_ff > 1u << 20 || hp->n_head == 0 || hp->n_head > 1024 ||
        hp->n_head_kv == 0 || hp->n_ctx_train == 0 || hp->n_ctx_train > 1u << 24) {
        snprintf(err, errlen,
                 "%s: implausible hyperparameters (embd %u, layers %u, ff %u, heads %u/%u, ctx %u)",
                 gguf_path(g), hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_head_kv,
                 hp->n_ctx_train);
        return MODEL_ERR_FORMAT;
    }
    if (hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv) {
        snprintf(err, errlen,
                 "%s: embedding %u not divisible by %u heads, or heads not a multiple of %u KV heads",
                 gguf_path(g), hp->n_embd, hp->n_head, hp->n_head_kv);
        return MODEL_ERR_FORMAT;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if (hp_u32(g, arch, "rope.dimension_count", hp->head_dim, &hp->rope_dim, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2) {
        snprintf(err, errlen, "%s: rope.dimension_count %u must be even and at most head dim %u",
                 gguf_path(g), hp->rope_dim, hp->head_dim);
        return MODEL_ERR_FORMAT;
    }
    if (hp_f32(g, arch, "rope.freq_base", 10000.0f, &hp->rope_base, err, errlen) ||
        hp_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->rope_base <= 0.0f || hp->rms_eps <= 0.0f || hp->rms_eps > 1.0f) {
        snprintf(err, errlen, "%s: rope base %g / rms epsilon %g out of range", gguf_path(g),
                 (double)hp->rope_base, (double)hp->rms_eps);
        return MODEL_ERR_FORMAT;
    }
    const gguf_tensor_t *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        snprintf(err, errlen, "%s: missing tensor 'token_embd.weight'", gguf_path(g));
        return MODEL_ERR_FORMAT;
    }
    if (te->ne[1] == 0 || te->ne[1] > (1u << 24)) {
        snprintf(err, errlen, "%s: token_embd.weight has %llu rows", gguf_path(g),
                 (unsigned long long)te->ne[1]);
        return MODEL_ERR_FORMAT;
    }
    hp->n_vocab = (uint32_t)te->ne[1];
    uint32_t nv;
    if (hp_u32(g, arch, "vocab_size", hp->n_vocab, &nv, err, errlen))
        return MODEL_ERR_FORMAT;
    if (nv != hp->n_vocab) {
        snprintf(err, errlen, "%s: vocab_size %u disagrees with token_embd.weight (%u rows)",
                 gguf_path(g), nv, hp->n_vocab);
        return MODEL_ERR_FORMAT;
    }
    return 0;
}

static int read_weights(const gguf_t *g, const model_hparams_t *hp, model_weights_t *w, char *err,
                        size_t errlen)
{
    uint32_t d = hp->n_embd, q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    if (get_weight(g, "token_embd.weight", d, hp->n_vocab, 0, 1, &w->tok_embd, err, errlen) ||
        get_weight(g, "output_norm.weight", d, 0, 1, 1, &w->output_norm, err, errlen) ||
        get_weight(g, "output.weight", d, hp->n_vocab, 0, 0, &w->output, err, errlen))
        return -1;
    if (!w->output.data) {
        w->output = w->tok_embd;
        w->tied = 1;
    }
    w->layers = calloc(hp->n_layer, sizeof *w->layers);
    if (!w->layers) {
        snprintf(err, errlen, "%s: out of memory", gguf_path(g));
        return -1;
    }
    int bias = hp->arch == MODEL_ARCH_QWEN2;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        model_layer_t *L = &w->layers[l];
        char n[13][64];
        static const char *const suf[13] = {
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
            "attn_q.bias",      "attn_k.bias",   "attn_v.bias",   "attn_output.weight",
            "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
            "unused",
        };
        for (int i = 0; i < 12; i++)
            snprintf(n[i], sizeof n[i], "blk.%u.%s", l, suf[i]);
        if (get_weight(g, n[0], d, 0, 1, 1, &L->attn_norm, err, errlen) ||
            get_weight(g, n[1], d, q, 0, 1, &L->wq, err, errlen) ||
            get_weight(g, n[2], d, kv, 0, 1, &L->wk, err, errlen) ||
            get_weight(g, n[3], d, kv, 0, 1, &L->wv, err, errlen) ||
            get_weight(g, n[4], q, 0, 1, bias, &L->bq, err, errlen) ||
            get_weight(g, n[5], kv, 0, 1, bias, &L->bk, err, errlen) ||
            get_weight(g, n[6], kv, 0, 1, bias, &L->bv, err, errlen) ||
            get_weight(g, n[7], q, d, 0, 1, &L->wo, err, errlen) ||
            get_weight(g, n[8], d, 0, 1, 1, &L->ffn_norm, err, errlen) ||
            get_weight(g, n[9], d, hp->n_ff, 0, 1, &L->w_gate, err, errlen) ||
            get_weight(g, n[10], d, hp->n_ff, 0, 1, &L->w_up, err, errlen) ||
            get_weight(g, n[11], hp->n_ff, d, 0, 1, &L->w_down, err, errlen))
            return -1;
    }
    return 0;
}

model_t *model_from_gguf(gguf_t *g, char *err, size_t errlen)
{
    model_t *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "%s: out of memory", gguf_path(g));
        gguf_close(g);
        return NULL;
    }
    m->gguf = g;
    if (read_hparams(g, &m->hp, err, errlen) || read_weights(g, &m->hp, &m->w, err, errlen))
        goto fail;
    char terr[256];
    m->tok = tok_open(g, terr, sizeof terr);
    if (!m->tok) {
        snprintf(err, errlen, "%s: tokenizer: %s", gguf_path(g), terr);
        goto fail;
    }
    if ((uint32_t)tok_vocab_size(m->tok) != m->hp.n_vocab) {
        snprintf(err, errlen, "%s: tokenizer has %d tokens but the model has %u", gguf_path(g),
                 tok_vocab_size(m->tok), m->hp.n_vocab);
        goto fail;
    }
    m->wtype = m->w.layers[0].wq.type;
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        m->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        m->weight_bytes += t->nbytes;
        if (t->type < MODEL_N_TTYPES)
            m->n_tensors_of[t->type]++;
    }
    quant_isa_get(); /* pick kernels before any worker thread runs */
    return m;
fail:
    model_close(m);
    return NULL;
}

model_t *model_open(const char *path, char *err, size_t errlen)
{
    gguf_t *g = gguf_open(path, err, errlen);
    if (!g)
        return NULL;
    return model_from_gguf(g, err, errlen);
}

void model_close(model_t *m)
{
    if (!m)
        return;
    tok_close(m->tok);
    free(m->w.layers);
    gguf_close(m->gguf);
    free(m);
}

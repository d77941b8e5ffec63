/* model: Llama-family hyperparameters and weight views taken from a GGUF file, read strictly (every tensor and math-changing key understood, or the file is refused). */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"

/* ------------------------------------------------------------------ architectures */

/* What distinguishes one architecture from the plain Llama block, as data:
 * read_hparams and read_weights consult this table and nothing else. */
typedef struct model_arch_desc {
    const char *name; /* general.architecture */
    model_arch_t arch;
    int rope_neox;           /* NeoX RoPE pairs */
    int qkv_bias;            /* attn_{q,k,v}.bias: 0 absent, 1 optional, 2 required */
    int qk_norm;             /* attn_q_norm / attn_k_norm (head_dim) required */
    int rope_freqs;          /* rope_freqs.weight allowed (llama3 RoPE scaling) */
    int gemma;               /* Gemma block: sqrt(n_embd) embedding scale, post-attention and
                          post-FFN norms, GELU gate, sliding-window layers */
    uint32_t swa_pattern;    /* sliding-window layer pattern (gemma2: every other layer) */
    const char *const *keys; /* "<arch>." keys beyond model_known_keys; NULL-terminated */
    int softcaps;            /* gemma: attention and final soft-caps (gemma2) */
    int tied_only;           /* the head is token_embd; an output.weight is refused (gemma2) */
    float rope_base_swa;     /* gemma: RoPE base of the sliding layers (gemma3: 10000); 0 = same */
    uint32_t big_layers;     /* gemma: the layer count of the largest model, whose query scale is
                            1/sqrt(n_embd/n_head) (its query_pre_attn_scalar) */
    int phi3;                /* attn_qkv and ffn_up (gate then up) fused, rope_factors_short/long,
                          every layer sliding (attention.sliding_window) */
    int moe;                 /* routed experts: 0 never, 1 when expert_count says (llama:
                                Mixtral), 2 always (the *moe families) */
    int moe_norm_w;          /* the selected experts' weights renormalised (llama.cpp's norm_w) */
    int moe_shexp;           /* a shared expert gated by sigmoid(ffn_gate_inp_shexp . x) */
} model_arch_desc_t;

static const char *const model_gemma2_keys[] = {
    "attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping", NULL};
static const char *const model_gemma3_keys[] = {"attention.sliding_window", NULL};
static const char *const model_phi3_keys[] = {"attention.sliding_window", NULL};
/* llama.cpp reads no expert width for llama (the experts are n_ff wide): ignored */
static const char *const model_llama_keys[] = {"expert_feed_forward_length", NULL};
static const char *const model_qwen2moe_keys[] = {"expert_feed_forward_length",
                                                  "expert_shared_feed_forward_length", NULL};
static const char *const model_qwen3moe_keys[] = {"expert_feed_forward_length", NULL};

static const model_arch_desc_t model_archs[] = {
    {.name = "llama",
     .arch = MODEL_ARCH_LLAMA,
     .qkv_bias = 1,
     .rope_freqs = 1,
     .keys = model_llama_keys,
     .moe = 1,
     .moe_norm_w = 1},
    {.name = "qwen2", .arch = MODEL_ARCH_QWEN2, .rope_neox = 1, .qkv_bias = 2},
    {.name = "qwen3", .arch = MODEL_ARCH_QWEN3, .rope_neox = 1, .qk_norm = 1},
    {.name = "gemma2",
     .arch = MODEL_ARCH_GEMMA2,
     .rope_neox = 1,
     .gemma = 1,
     .swa_pattern = 2,
     .keys = model_gemma2_keys,
     .softcaps = 1,
     .tied_only = 1,
     .big_layers = 46},
    {.name = "gemma3",
     .arch = MODEL_ARCH_GEMMA3,
     .rope_neox = 1,
     .qk_norm = 1,
     .gemma = 1,
     .swa_pattern = 6,
     .keys = model_gemma3_keys,
     .rope_base_swa = 10000.0f,
     .big_layers = 62},
    {.name = "phi3", .arch = MODEL_ARCH_PHI3, .rope_neox = 1, .keys = model_phi3_keys, .phi3 = 1},
    {.name = "qwen2moe",
     .arch = MODEL_ARCH_QWEN2MOE,
     .rope_neox = 1,
     .qkv_bias = 2,
     .keys = model_qwen2moe_keys,
     .moe = 2,
     .moe_shexp = 1},
    {.name = "qwen3moe",
     .arch = MODEL_ARCH_QWEN3MOE,
     .rope_neox = 1,
     .qk_norm = 1,
     .keys = model_qwen3moe_keys,
     .moe = 2,
     .moe_norm_w = 1},
};
#define MODEL_N_ARCHS (sizeof model_archs / sizeof model_archs[0])

/* "<arch>.<suffix>" keys the loader reads (and so understands) or knows to
 * leave the computation alone; any other "<arch>." key refuses the file. */
static const char *const model_known_keys[] = {
    /* read */
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    "rope.scaling.attn_factor",
    "rope.scaling.original_context_length",
    "vocab_size",
    "expert_count",
    "expert_used_count",
    "expert_gating_func",  /* read_moe: only what the family computes */
    "expert_weights_norm", /* likewise */
    "expert_weights_scale",
    /* no effect on the forward pass with the scalings implemented here */
    "rope.scaling.finetuned",
    "tensor_data_layout",
};

static const model_arch_desc_t *arch_find(model_arch_t a)
{
    for (size_t i = 0; i < MODEL_N_ARCHS; i++)
        if (model_archs[i].arch == a)
            return &model_archs[i];
    return NULL;
}

const char *model_arch_name(model_arch_t a)
{
    const model_arch_desc_t *d = arch_find(a);
    return d ? d->name : "?";
}

int model_feats_check(const model_hparams_t *hp, uint32_t supported, const char *backend, char *err,
                      size_t errlen)
{
    static const char *const names[] = {"RoPE frequency factors (rope_freqs)",
                                        "linear RoPE scaling",
                                        "per-head q/k RMSNorm",
                                        "embedding scale",
                                        "soft-capping",
                                        "sliding-window attention",
                                        "GELU feed-forward",
                                        "RoPE attention factor",
                                        "YaRN RoPE scaling",
                                        "mixture of experts"};
    uint32_t missing = hp->feats & ~supported;
    if (!missing)
        return 0;
    int n = snprintf(err, errlen, "the %s backend cannot run this %s model: it lacks", backend,
                     model_arch_name(hp->arch));
    const char *sep = " ";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(missing & (1u << i)))
            continue;
        if (n >= 0 && (size_t)n < errlen)
            n += snprintf(err + n, errlen - (size_t)n, "%s%s", sep, names[i]);
        sep = ", ";
    }
    return MODEL_ERR_UNSUPPORTED;
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
 * type. required = 0 lets it be absent (data stays NULL). Marks it taken in
 * used[] (one flag per file tensor). */
static int get_weight_n(const gguf_t *g, uint8_t *used, const char *name, uint32_t n_in,
                        uint32_t n_out, uint32_t n_mat, int f32_only, int required,
                        model_weight_t *w, char *err, size_t errlen);

static int get_weight(const gguf_t *g, uint8_t *used, const char *name, uint32_t n_in,
                      uint32_t n_out, int f32_only, int required, model_weight_t *w, char *err,
                      size_t errlen)
{
    return get_weight_n(g, used, name, n_in, n_out, 0, f32_only, required, w, err, errlen);
}

/* get_weight of n_mat matrices stacked on the third dimension (n_mat 0: a
 * 2-D or 1-D tensor): one view of n_out * n_mat rows. */
static int get_weight_n(const gguf_t *g, uint8_t *used, const char *name, uint32_t n_in,
                        uint32_t n_out, uint32_t n_mat, int f32_only, int required,
                        model_weight_t *w, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    if (!t) {
        if (!required)
            return 0;
        snprintf(err, errlen, "%s: missing tensor '%s'", gguf_path(g), name);
        return -1;
    }
    used[t - gguf_tensor_at(g, 0)] = 1;
    uint32_t want_dims = n_mat ? 3 : n_out ? 2 : 1;
    int ok = t->ne[0] == n_in && (n_out ? t->ne[1] == n_out : 1) && (!n_mat || t->ne[2] == n_mat);
    for (uint32_t d = want_dims; d < GGUF_MAX_DIMS; d++)
        ok = ok && t->ne[d] == 1;
    if (!ok) {
        snprintf(err, errlen,
                 "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%u, %u, %u]",
                 gguf_path(g), name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                 (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], n_in,
                 n_out ? n_out : 1, n_mat ? n_mat : 1);
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
    w->n_out = (n_out ? n_out : 1) * (n_mat ? n_mat : 1);
    w->data = t->data;
    w->nbytes = t->nbytes;
    return 0;
}

/* Copies a string-valued key into buf (NUL-terminated). 1 if present, 0 if
 * absent, -1 (err set) if not a string or too long. */
static int hp_str(const gguf_t *g, const char *key, char *buf, size_t cap, char *err, size_t errlen)
{
    int rc = gguf_get_str_buf(g, key, buf, cap);
    if (rc < 0)
        snprintf(err, errlen, "%s: metadata key '%s' is not a string of under %zu bytes",
                 gguf_path(g), key, cap);
    return rc < 0 ? -1 : rc;
}

static int key_in(const char *const *list, size_t n, const char *k, size_t kl)
{
    for (size_t j = 0; j < n && list[j]; j++)
        if (strlen(list[j]) == kl && !memcmp(list[j], k, kl))
            return 1;
    return 0;
}

/* Every "<arch>." key must be one the loader knows (model_known_keys and
 * the architecture's own). */
static int check_keys(const gguf_t *g, const model_arch_desc_t *ad, char *err, size_t errlen)
{
    const char *arch = ad->name;
    size_t al = strlen(arch);
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        const char *k = kv->key;
        size_t kl = strlen(k);
        if (kl <= al + 1 || memcmp(k, arch, al) || k[al] != '.')
            continue;
        int known = key_in(model_known_keys, sizeof model_known_keys / sizeof model_known_keys[0],
                           k + al + 1, kl - al - 1) ||
                    (ad->keys && key_in(ad->keys, SIZE_MAX, k + al + 1, kl - al - 1));
        if (!known) {
            snprintf(err, errlen,
                     "%s: metadata key '%.*s' is not understood by this engine's %s loader "
                     "(it may change the computation, so the file is refused)",
                     gguf_path(g), (int)(kl > 200 ? 200 : kl), k, arch);
            return MODEL_ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/* YaRN's correction range for rope_dim dims trained on n_orig positions:
 * the (fractional) pair index whose wavelength makes `rotations` turns over
 * n_orig positions, for beta_fast 32 (start, floored) and beta_slow 1 (end,
 * ceiled), clamped to [0, rope_dim - 1] as llama.cpp clamps them. */
static float yarn_corr_dim(uint32_t rope_dim, uint32_t n_orig, float rotations, float base)
{
    return (float)rope_dim * logf((float)n_orig / (rotations * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

/* RoPE scaling keys: type none/linear/yarn (absent = linear, as llama.cpp
 * reads it) with rope.scaling.factor or the older rope.scale_linear, and
 * rope.scaling.attn_factor. YaRN (llama.cpp c392e50's reading: extrapolation
 * factor 1, beta_fast 32, beta_slow 1, the original context from
 * rope.scaling.original_context_length or context_length) scales the
 * frequencies by 1/factor outside the correction range and multiplies cos
 * and sin by attn_factor * (1 + 0.1 ln factor). LongRoPE is refused by name
 * (phi3 files carry it as tensors, read_phi3_weights). */
static int read_rope_scaling(const gguf_t *g, const model_arch_desc_t *ad, model_hparams_t *hp,
                             char *err, size_t errlen)
{
    const char *arch = ad->name;
    char key[128], type[32] = "linear";
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (hp_str(g, key, type, sizeof type, err, errlen) < 0)
        return MODEL_ERR_FORMAT;
    if (ad->phi3 && !strcmp(type, "longrope"))
        strcpy(type, "none"); /* phi3: the factors are tensors (read_phi3_rope) */
    int yarn = !strcmp(type, "yarn");
    if (strcmp(type, "none") && strcmp(type, "linear") && !yarn) {
        int known = !strcmp(type, "longrope");
        snprintf(err, errlen, "%s: %s '%s' = '%s' is %s (none, linear and yarn are)", gguf_path(g),
                 "RoPE scaling type", key, type, known ? "not implemented" : "unknown");
        return MODEL_ERR_UNSUPPORTED;
    }
    float factor = 0.0f, attn = 1.0f;
    uint32_t orig;
    if (hp_f32(g, arch, "rope.scaling.factor", 0.0f, &factor, err, errlen) ||
        (factor == 0.0f && hp_f32(g, arch, "rope.scale_linear", 0.0f, &factor, err, errlen)) ||
        hp_f32(g, arch, "rope.scaling.attn_factor", 1.0f, &attn, err, errlen) ||
        hp_u32(g, arch, "rope.scaling.original_context_length", hp->n_ctx_train, &orig, err,
               errlen))
        return MODEL_ERR_FORMAT;
    if (!(attn > 0.0f && attn <= 100.0f)) {
        snprintf(err, errlen, "%s: '%s.rope.scaling.attn_factor' = %g out of range", gguf_path(g),
                 arch, (double)attn);
        return MODEL_ERR_FORMAT;
    }
    if (factor < 0.0f || factor > 1e6f) {
        snprintf(err, errlen, "%s: RoPE scaling factor %g out of range", gguf_path(g),
                 (double)factor);
        return MODEL_ERR_FORMAT;
    }
    hp->rope_ctx_orig = orig;
    hp->rope_freq_scale = 1.0f;
    if (strcmp(type, "none") && factor != 0.0f && factor != 1.0f) {
        hp->rope_freq_scale = 1.0f / factor;
        hp->feats |= MODEL_FEAT_ROPE_LINEAR;
    }
    if (yarn) {
        if (ad->rope_base_swa != 0.0f) {
            snprintf(err, errlen, "%s: YaRN RoPE scaling of a %s model is not implemented",
                     gguf_path(g), arch);
            return MODEL_ERR_UNSUPPORTED;
        }
        if (orig == 0) {
            snprintf(err, errlen,
                     "%s: YaRN needs a positive '%s.rope.scaling.original_context_"
                     "length' or context_length",
                     gguf_path(g), arch);
            return MODEL_ERR_FORMAT;
        }
        float lo = floorf(yarn_corr_dim(hp->rope_dim, orig, 32.0f, hp->rope_base));
        float hi = ceilf(yarn_corr_dim(hp->rope_dim, orig, 1.0f, hp->rope_base));
        hp->rope_ext_factor = 1.0f;
        hp->rope_corr_lo = lo > 0.0f ? lo : 0.0f;
        hp->rope_corr_hi = hi < (float)hp->rope_dim - 1.0f ? hi : (float)hp->rope_dim - 1.0f;
        attn *= 1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale);
        hp->feats |= MODEL_FEAT_ROPE_YARN;
    }
    if (attn != 1.0f) { /* llama.cpp's RoPE mscale: cos and sin times the factor */
        hp->rope_attn_factor = attn;
        hp->feats |= MODEL_FEAT_ROPE_MSCALE;
    }
    return 0;
}

/* Gemma 2 and 3: gemma2's soft-caps (llama.cpp's defaults when absent: 50
 * and 30) and sliding window (default 4096; gemma3 must say), gemma3's local
 * RoPE base, and the query scale: 1/sqrt(head_dim), except for the 27B
 * (46 / 62 layers), whose published query_pre_attn_scalar is n_embd/n_head
 * and which llama.cpp recognizes by its layer count. */
static int read_gemma(const gguf_t *g, const char *arch, const model_arch_desc_t *ad,
                      model_hparams_t *hp, char *err, size_t errlen)
{
    uint32_t window;
    if ((ad->softcaps &&
         (hp_f32(g, arch, "attn_logit_softcapping", 50.0f, &hp->attn_softcap, err, errlen) ||
          hp_f32(g, arch, "final_logit_softcapping", 30.0f, &hp->final_softcap, err, errlen))) ||
        hp_u32(g, arch, "attention.sliding_window", ad->softcaps ? 4096 : -1, &window, err, errlen))
        return MODEL_ERR_FORMAT;
    hp->rope_base_swa = ad->rope_base_swa;
    if (hp->attn_softcap < 0.0f || hp->final_softcap < 0.0f) {
        snprintf(err, errlen, "%s: negative soft-cap", gguf_path(g));
        return MODEL_ERR_FORMAT;
    }
    hp->emb_scale = sqrtf((float)hp->n_embd);
    hp->gelu = 1;
    hp->swa_window = window;
    hp->swa_pattern = ad->swa_pattern;
    if (hp->n_layer == ad->big_layers && hp->n_embd % hp->n_head == 0)
        hp->att_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->feats |= MODEL_FEAT_EMB_SCALE | MODEL_FEAT_GELU;
    if (hp->attn_softcap > 0.0f || hp->final_softcap > 0.0f)
        hp->feats |= MODEL_FEAT_SOFTCAP;
    if (window > 0)
        hp->feats |= MODEL_FEAT_SWA;
    return 0;
}

/* Phi-3: every layer attends within attention.sliding_window (required,
 * except for the published 4k/128k shapes, for which llama.cpp supplies it). */
static int read_phi3(const gguf_t *g, const char *arch, model_hparams_t *hp, char *err,
                     size_t errlen)
{
    int64_t def = -1;
    if ((hp->n_layer == 32 || hp->n_layer == 40) && hp->n_ctx_train == 4096)
        def = 2047;
    else if (hp->n_layer == 32 && hp->n_head_kv == 32 && hp->n_ctx_train == 131072)
        def = 262144;
    else if (hp->n_layer == 40 && hp->n_ctx_train == 131072)
        def = 131072;
    if (hp_u32(g, arch, "attention.sliding_window", def, &hp->swa_window, err, errlen))
        return MODEL_ERR_FORMAT;
    hp->swa_pattern = 0;
    if (hp->swa_window)
        hp->feats |= MODEL_FEAT_SWA;
    return 0;
}

/* A view of rows [r0, r0 + n) of a weight (row-major, any type). */
static model_weight_t weight_rows(const model_weight_t *w, uint32_t r0, uint32_t n)
{
    size_t rb = quant_row_bytes(w->type, w->n_in);
    model_weight_t v = *w;
    v.n_out = n;
    v.data = (const uint8_t *)w->data + (size_t)r0 * rb;
    v.nbytes = (size_t)n * rb;
    return v;
}

/* rope_dim/2 positive finite F32 factors of tensor `name` (may be absent:
 * *out NULL). */
static int get_rope_factors(const gguf_t *g, uint8_t *used, const char *name, uint32_t half,
                            const float **out, char *err, size_t errlen)
{
    model_weight_t w;
    if (get_weight(g, used, name, half, 0, 1, 0, &w, err, errlen))
        return -1;
    const float *v = w.data;
    for (uint32_t i = 0; v && i < half; i++) {
        if (!isfinite(v[i]) || v[i] <= 0.0f) {
            snprintf(err, errlen, "%s: %s[%u] = %g is not a positive factor", gguf_path(g), name, i,
                     (double)v[i]);
            return -1;
        }
    }
    *out = v;
    return 0;
}

/* Phi-3's fused tensors split into the q/k/v and gate/up views (rows are
 * independent in every type), and its LongRoPE factors: both or neither;
 * the short ones until model_set_context says the context is longer than
 * rope.scaling.original_context_length (llama.cpp's choice). */
static int read_phi3_weights(const gguf_t *g, uint8_t *used, model_hparams_t *hp, model_layer_t *L,
                             uint32_t l, char *err, size_t errlen)
{
    uint32_t d = hp->n_embd, q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    char n[96];
    model_weight_t f;
    snprintf(n, sizeof n, "blk.%u.attn_qkv.weight", l);
    if (get_weight(g, used, n, d, q + 2 * kv, 0, 1, &f, err, errlen))
        return -1;
    L->wq = weight_rows(&f, 0, q);
    L->wk = weight_rows(&f, q, kv);
    L->wv = weight_rows(&f, q + kv, kv);
    snprintf(n, sizeof n, "blk.%u.ffn_up.weight", l);
    if (get_weight(g, used, n, d, 2 * hp->n_ff, 0, 1, &f, err, errlen))
        return -1;
    L->w_gate = weight_rows(&f, 0, hp->n_ff);
    L->w_up = weight_rows(&f, hp->n_ff, hp->n_ff);
    if (l > 0)
        return 0;
    const float *s = NULL, *lg = NULL;
    uint32_t half = hp->rope_dim / 2;
    if (get_rope_factors(g, used, "rope_factors_short.weight", half, &s, err, errlen) ||
        get_rope_factors(g, used, "rope_factors_long.weight", half, &lg, err, errlen))
        return -1;
    if (!s != !lg) {
        snprintf(err, errlen, "%s: phi3 needs both rope_factors_short and rope_factors_long",
                 gguf_path(g));
        return -1;
    }
    if (!s)
        return 0;
    hp->rope_freqs = hp->rope_freqs_short = s;
    hp->rope_freqs_long = lg;
    hp->feats |= MODEL_FEAT_ROPE_FREQS;
    return 0;
}

void model_set_context(model_t *m, uint32_t n_ctx)
{
    model_hparams_t *hp = &m->hp;
    if (hp->rope_freqs_short)
        hp->rope_freqs = n_ctx > hp->rope_ctx_orig ? hp->rope_freqs_long : hp->rope_freqs_short;
}

/* general.architecture, found in model_archs (*ad): hp zeroed and its arch set. */
static int read_arch(const gguf_t *g, char *arch, size_t archlen, model_hparams_t *hp,
                     const model_arch_desc_t **out, char *err, size_t errlen)
{
    int rc = hp_str(g, "general.architecture", arch, archlen, err, errlen);
    if (rc <= 0) {
        if (rc == 0)
            snprintf(err, errlen, "%s: missing or non-string 'general.architecture'", gguf_path(g));
        return MODEL_ERR_FORMAT;
    }
    memset(hp, 0, sizeof *hp);
    const model_arch_desc_t *ad = NULL;
    for (size_t i = 0; i < MODEL_N_ARCHS; i++)
        if (!strcmp(arch, model_archs[i].name))
            ad = &model_archs[i];
    if (!ad) {
        char names[128] = "";
        for (size_t i = 0, n = 0; i < MODEL_N_ARCHS && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "",
                                  model_archs[i].name);
        snprintf(err, errlen, "%s: architecture '%s' is not supported (%s)", gguf_path(g), arch,
                 names);
        return MODEL_ERR_UNSUPPORTED;
    }
    hp->arch = ad->arch;
    hp->rope_neox = ad->rope_neox;
    *out = ad;
    return 0;
}

/* Width, depth, feed-forward, heads and trained context, within plausible bounds. */
static int read_shape(const gguf_t *g, const char *arch, model_hparams_t *hp, char *err,
                      size_t errlen)
{
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
    return 0;
}

/* The head width (key and value alike) and the rotated part of it. */
static int read_head_dims(const gguf_t *g, const char *arch, model_hparams_t *hp, char *err,
                          size_t errlen)
{
    /* head width: attention.key_length, else n_embd / n_head */
    uint32_t vlen;
    if (hp_u32(g, arch, "attention.key_length",
               hp->n_embd % hp->n_head ? 0 : hp->n_embd / hp->n_head, &hp->head_dim, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->head_dim == 0 || hp->n_head % hp->n_head_kv) {
        snprintf(err, errlen,
                 "%s: embedding %u not divisible by %u heads (and no attention.key_length), or "
                 "heads not a multiple of %u KV heads",
                 gguf_path(g), hp->n_embd, hp->n_head, hp->n_head_kv);
        return MODEL_ERR_FORMAT;
    }
    if (hp_u32(g, arch, "attention.value_length", hp->head_dim, &vlen, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->head_dim > 1024 || (uint64_t)hp->n_head * hp->head_dim > 65536) {
        snprintf(err, errlen, "%s: implausible head width %u (x %u heads)", gguf_path(g),
                 hp->head_dim, hp->n_head);
        return MODEL_ERR_FORMAT;
    }
    if (vlen != hp->head_dim) {
        snprintf(err, errlen,
                 "%s: '%s.attention.value_length' = %u differs from key_length %u: not implemented",
                 gguf_path(g), arch, vlen, hp->head_dim);
        return MODEL_ERR_UNSUPPORTED;
    }
    if (hp_u32(g, arch, "rope.dimension_count", hp->head_dim, &hp->rope_dim, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2) {
        snprintf(err, errlen, "%s: rope.dimension_count %u must be even and at most head dim %u",
                 gguf_path(g), hp->rope_dim, hp->head_dim);
        return MODEL_ERR_FORMAT;
    }
    return 0;
}

/* The vocabulary size: token_embd.weight's rows, which vocab_size must agree with. */
static int read_vocab_size(const gguf_t *g, const char *arch, model_hparams_t *hp, char *err,
                           size_t errlen)
{
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

/* A declared expert key whose value the family does not compute: refused naming it. */
static int moe_refuse(const gguf_t *g, const char *arch, const char *key, const char *val,
                      const char *want, char *err, size_t errlen)
{
    snprintf(err, errlen,
             "%s: '%s.%s' = %s is not implemented (a %s model's experts are computed with %s), so "
             "the file is refused",
             gguf_path(g), arch, key, val, arch, want);
    return MODEL_ERR_UNSUPPORTED;
}

/* Mixture of experts: expert_count and expert_used_count (both or neither;
 * the *moe families need them), each expert's width (llama: n_ff, as
 * llama.cpp reads Mixtral; the qwen families: expert_feed_forward_length,
 * else n_ff / n_expert_used) and qwen2moe's shared expert's
 * (expert_shared_feed_forward_length, else n_ff). These families gate with a
 * softmax over every expert's logit, take the top k and renormalise their
 * weights where ad->moe_norm_w: a file declaring another gating function,
 * normalisation or a weight scale is refused naming the key. */
static int read_moe(const gguf_t *g, const model_arch_desc_t *ad, model_hparams_t *hp, char *err,
                    size_t errlen)
{
    const char *arch = ad->name;
    uint32_t ne, nu, gating;
    float scale;
    if (hp_u32(g, arch, "expert_count", 0, &ne, err, errlen) ||
        hp_u32(g, arch, "expert_used_count", 0, &nu, err, errlen))
        return MODEL_ERR_FORMAT;
    if (!ne && !nu && ad->moe < 2)
        return 0;
    if (!ad->moe) {
        snprintf(err, errlen,
                 "%s: mixture of experts ('%s.expert_count' = %u, expert_used_count %u) is not "
                 "implemented for %s",
                 gguf_path(g), arch, ne, nu, arch);
        return MODEL_ERR_UNSUPPORTED;
    }
    if (ne == 0 || nu == 0 || nu > ne || ne > MODEL_MAX_EXPERTS) {
        snprintf(err, errlen,
                 "%s: '%s.expert_count' = %u with expert_used_count %u: a mixture of experts needs "
                 "1 <= expert_used_count <= expert_count <= %u",
                 gguf_path(g), arch, ne, nu, MODEL_MAX_EXPERTS);
        return MODEL_ERR_FORMAT;
    }
    hp->n_expert = ne;
    hp->n_expert_used = nu;
    hp->moe_norm_w = ad->moe_norm_w;
    hp->n_ff_exp = hp->n_ff;
    if ((ad->moe == 2 && hp_u32(g, arch, "expert_feed_forward_length", hp->n_ff / nu, &hp->n_ff_exp,
                                err, errlen)) ||
        (ad->moe_shexp && hp_u32(g, arch, "expert_shared_feed_forward_length", hp->n_ff,
                                 &hp->n_ff_shexp, err, errlen)) ||
        hp_u32(g, arch, "expert_gating_func", 1, &gating, err, errlen) ||
        hp_f32(g, arch, "expert_weights_scale", 1.0f, &scale, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->n_ff_exp == 0 || hp->n_ff_exp > 1u << 20 || hp->n_ff_shexp > 1u << 20 ||
        (ad->moe_shexp && hp->n_ff_shexp == 0)) {
        snprintf(err, errlen, "%s: implausible expert widths (%u, shared %u)", gguf_path(g),
                 hp->n_ff_exp, hp->n_ff_shexp);
        return MODEL_ERR_FORMAT;
    }
    char key[128], val[32];
    int norm;
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if (gguf_get(g, key) && gguf_get_bool(g, key, &norm)) {
        snprintf(err, errlen, "%s: metadata key '%s' is not a boolean", gguf_path(g), key);
        return MODEL_ERR_FORMAT;
    }
    const char *want = ad->moe_norm_w ? "softmax gating (1), weights renormalised, unscaled"
                                      : "softmax gating (1), weights not renormalised, unscaled";
    if (gating != 1) {
        snprintf(val, sizeof val, "%u%s", gating, gating == 2 ? " (sigmoid)" : "");
        return moe_refuse(g, arch, "expert_gating_func", val, want, err, errlen);
    }
    if (gguf_get(g, key) && !norm != !ad->moe_norm_w)
        return moe_refuse(g, arch, "expert_weights_norm", norm ? "true" : "false", want, err,
                          errlen);
    if (scale != 1.0f) {
        snprintf(val, sizeof val, "%g", (double)scale);
        return moe_refuse(g, arch, "expert_weights_scale", val, want, err, errlen);
    }
    hp->feats |= MODEL_FEAT_MOE;
    return 0;
}

static int read_hparams(const gguf_t *g, model_hparams_t *hp, char *err, size_t errlen)
{
    char arch[32];
    const model_arch_desc_t *ad = NULL;
    int rc;
    if ((rc = read_arch(g, arch, sizeof arch, hp, &ad, err, errlen)) ||
        (rc = check_keys(g, ad, err, errlen)) || (rc = read_shape(g, arch, hp, err, errlen)) ||
        (rc = read_head_dims(g, arch, hp, err, errlen)))
        return rc;
    if (hp_f32(g, arch, "rope.freq_base", 10000.0f, &hp->rope_base, err, errlen) ||
        hp_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err, errlen))
        return MODEL_ERR_FORMAT;
    if (hp->rope_base <= 0.0f || hp->rms_eps <= 0.0f || hp->rms_eps > 1.0f) {
        snprintf(err, errlen, "%s: rope base %g / rms epsilon %g out of range", gguf_path(g),
                 (double)hp->rope_base, (double)hp->rms_eps);
        return MODEL_ERR_FORMAT;
    }
    if ((rc = read_rope_scaling(g, ad, hp, err, errlen)))
        return rc;
    if (ad->qk_norm)
        hp->feats |= MODEL_FEAT_QK_NORM;
    if (ad->gemma && (rc = read_gemma(g, arch, ad, hp, err, errlen)))
        return rc;
    if (ad->phi3 && (rc = read_phi3(g, arch, hp, err, errlen)))
        return rc;
    if ((rc = read_moe(g, ad, hp, err, errlen)))
        return rc;
    return read_vocab_size(g, arch, hp, err, errlen);
}

/* rope_freqs.weight (llama3): rope_dim/2 positive F32 divisors. */
static int read_rope_freqs(const gguf_t *g, uint8_t *used, const model_arch_desc_t *ad,
                           model_hparams_t *hp, char *err, size_t errlen)
{
    if (!ad->rope_freqs || !gguf_find_tensor(g, "rope_freqs.weight"))
        return 0; /* absent, or left over and refused by name */
    if (get_rope_factors(g, used, "rope_freqs.weight", hp->rope_dim / 2, &hp->rope_freqs, err,
                         errlen))
        return -1;
    hp->feats |= MODEL_FEAT_ROPE_FREQS;
    return 0;
}

/* A MoE layer's router and stacked experts, and qwen2moe's shared expert
 * with its gate (the dense FFN tensors are not looked up: a stray one is refused). */
static int read_moe_weights(const gguf_t *g, uint8_t *used, const model_arch_desc_t *ad,
                            const model_hparams_t *hp, model_layer_t *L, uint32_t l, char *err,
                            size_t errlen)
{
    uint32_t d = hp->n_embd, ne = hp->n_expert, fe = hp->n_ff_exp, fs = hp->n_ff_shexp;
    const struct {
        const char *suf;
        model_weight_t *w;
        uint32_t n_in, n_out, n_mat;
    } mt[] = {
        {"ffn_gate_inp.weight", &L->gate_inp, d, ne, 0},
        {"ffn_gate_exps.weight", &L->gate_exps, d, fe, ne},
        {"ffn_up_exps.weight", &L->up_exps, d, fe, ne},
        {"ffn_down_exps.weight", &L->down_exps, fe, d, ne},
        {"ffn_gate_inp_shexp.weight", &L->gate_inp_shexp, d, 0, 0},
        {"ffn_gate_shexp.weight", &L->gate_shexp, d, fs, 0},
        {"ffn_up_shexp.weight", &L->up_shexp, d, fs, 0},
        {"ffn_down_shexp.weight", &L->down_shexp, fs, d, 0},
    };
    size_t n = ad->moe_shexp ? sizeof mt / sizeof mt[0] : 4;
    for (size_t i = 0; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s", l, mt[i].suf);
        if (get_weight_n(g, used, name, mt[i].n_in, mt[i].n_out, mt[i].n_mat, 0, 1, mt[i].w, err,
                         errlen))
            return -1;
    }
    return 0; /* (the shared expert's 1-D gate is a one-row matrix: n_out 1) */
}

static int read_weights(const gguf_t *g, uint8_t *used, model_hparams_t *hp, model_weights_t *w,
                        char *err, size_t errlen)
{
    const model_arch_desc_t *ad = arch_find(hp->arch);
    uint32_t d = hp->n_embd, q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    uint32_t hd = hp->head_dim;
    int dense = hp->n_expert == 0; /* else the FFN is read_moe_weights' */
    if (get_weight(g, used, "token_embd.weight", d, hp->n_vocab, 0, 1, &w->tok_embd, err, errlen) ||
        get_weight(g, used, "output_norm.weight", d, 0, 1, 1, &w->output_norm, err, errlen) ||
        (!ad->tied_only &&
         get_weight(g, used, "output.weight", d, hp->n_vocab, 0, 0, &w->output, err, errlen)) ||
        read_rope_freqs(g, used, ad, hp, err, errlen))
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
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        model_layer_t *L = &w->layers[l];
        /* per layer: the tensor's suffix, its view, shape, F32-only, presence
         * (0 absent: never looked up, so a stray one is refused; 1 optional; 2 required) */
        const struct {
            const char *suf;
            model_weight_t *w;
            uint32_t n_in, n_out;
            int f32, need;
        } lt[] = {
            {"attn_norm.weight", &L->attn_norm, d, 0, 1, 2},
            {"attn_q.weight", &L->wq, d, q, 0, ad->phi3 ? 0 : 2},
            {"attn_k.weight", &L->wk, d, kv, 0, ad->phi3 ? 0 : 2},
            {"attn_v.weight", &L->wv, d, kv, 0, ad->phi3 ? 0 : 2},
            {"attn_q.bias", &L->bq, q, 0, 1, ad->qkv_bias},
            {"attn_k.bias", &L->bk, kv, 0, 1, ad->qkv_bias},
            {"attn_v.bias", &L->bv, kv, 0, 1, ad->qkv_bias},
            {"attn_q_norm.weight", &L->q_norm, hd, 0, 1, ad->qk_norm ? 2 : 0},
            {"attn_k_norm.weight", &L->k_norm, hd, 0, 1, ad->qk_norm ? 2 : 0},
            {"attn_output.weight", &L->wo, q, d, 0, 2},
            {"ffn_norm.weight", &L->ffn_norm, d, 0, 1, 2},
            {"ffn_gate.weight", &L->w_gate, d, hp->n_ff, 0, ad->phi3 || !dense ? 0 : 2},
            {"ffn_up.weight", &L->w_up, d, hp->n_ff, 0, ad->phi3 || !dense ? 0 : 2},
            {"ffn_down.weight", &L->w_down, hp->n_ff, d, 0, dense ? 2 : 0},
            {"post_attention_norm.weight", &L->post_attn_norm, d, 0, 1, ad->gemma ? 2 : 0},
            {"post_ffw_norm.weight", &L->post_ffn_norm, d, 0, 1, ad->gemma ? 2 : 0},
        };
        for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) {
            char n[96];
            snprintf(n, sizeof n, "blk.%u.%s", l, lt[i].suf);
            if (lt[i].need && get_weight(g, used, n, lt[i].n_in, lt[i].n_out, lt[i].f32,
                                         lt[i].need == 2, lt[i].w, err, errlen))
                return -1;
        }
        if (ad->phi3 && read_phi3_weights(g, used, hp, L, l, err, errlen))
            return -1;
        if (!dense && read_moe_weights(g, used, ad, hp, L, l, err, errlen))
            return -1;
        if (!L->bq.data != !L->bk.data || !L->bq.data != !L->bv.data) {
            snprintf(err, errlen, "%s: layer %u has some but not all of the q/k/v biases",
                     gguf_path(g), l);
            return -1;
        }
    }
    /* strict: a tensor nobody took would be silently ignored math */
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        if (used[i])
            continue;
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        snprintf(err, errlen,
                 "%s: tensor '%.*s' is not used by this engine's %s architecture (a feature it "
                 "does not implement), so the file is refused",
                 gguf_path(g), 200, t->name, ad->name);
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
    if (read_hparams(g, &m->hp, err, errlen))
        goto fail;
    uint8_t *used = calloc(gguf_tensor_count(g) + 1, 1);
    if (!used) {
        snprintf(err, errlen, "%s: out of memory", gguf_path(g));
        goto fail;
    }
    int wrc = read_weights(g, used, &m->hp, &m->w, err, errlen);
    free(used);
    if (wrc)
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

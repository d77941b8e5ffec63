/* tokenizer: text <-> token ids from GGUF tokenizer.* metadata, following llama.cpp's SPM and GPT-2 BPE tokenizers: loading the vocabulary, the special tokens, dispatch to the families (tok_spm.c, tok_bpe.c), decoding and the streaming decoder. */
#include "engine/tokenizer.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer_int.h"

/* ------------------------------------------------------------------ the tokenizer */

static int tok_str_eq(gguf_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* An optional token id: absent, -1 and 4294967295 mean none. */
static int tok_load_id(const gguf_t *g, const char *key, int32_t n_vocab, int32_t *out, char *err,
                       size_t errlen)
{
    int64_t v;
    uint64_t u;
    int rc = gguf_get_i64(g, key, &v);

    *out = TOK_NONE;
    if (rc == GGUF_ERR_NOTFOUND)
        return 0;
    if (rc == GGUF_ERR_TYPE && gguf_get_u64(g, key, &u) == 0 && u == UINT64_MAX)
        return 0;
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not an integer token id", key);
        return TOK_ERR_FORMAT;
    }
    if (v == -1 || v == (int64_t)UINT32_MAX)
        return 0;
    if (v < 0 || v >= n_vocab) {
        tok_err(err, errlen, "tokenizer: %s = %lld is out of range (vocabulary has %d tokens)", key,
                (long long)v, (int)n_vocab);
        return TOK_ERR_RANGE;
    }
    *out = (int32_t)v;
    return 0;
}

static int tok_load_bool(const gguf_t *g, const char *key, int def, int *out, char *err,
                         size_t errlen)
{
    int rc = gguf_get_bool(g, key, out);

    if (rc == GGUF_ERR_NOTFOUND) {
        *out = def;
        return 0;
    }
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not a bool", key);
        return TOK_ERR_FORMAT;
    }
    *out = *out != 0;
    return 0;
}

static int tok_is_int_vtype(gguf_vtype_t t)
{
    return t == GGUF_VT_UINT8 || t == GGUF_VT_INT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_INT16 ||
           t == GGUF_VT_UINT32 || t == GGUF_VT_INT32 || t == GGUF_VT_UINT64 || t == GGUF_VT_INT64;
}

/* A required or optional array with n elements of an accepted type. */
static int tok_load_arr(const gguf_t *g, const char *key, int required, int want_float, uint64_t n,
                        const gguf_value_t **out, char *err, size_t errlen)
{
    int rc = gguf_get_arr(g, key, GGUF_VT_COUNT, out);
    gguf_vtype_t et;

    if (rc == GGUF_ERR_NOTFOUND && !required) {
        *out = NULL;
        return 0;
    }
    if (rc == GGUF_ERR_NOTFOUND) {
        tok_err(err, errlen, "tokenizer: %s is missing", key);
        return TOK_ERR_FORMAT;
    }
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: %s is not an array", key);
        return TOK_ERR_FORMAT;
    }
    et = (*out)->v.arr.type;
    if (want_float ? (et != GGUF_VT_FLOAT32 && et != GGUF_VT_FLOAT64) : !tok_is_int_vtype(et)) {
        tok_err(err, errlen, "tokenizer: %s has elements of type %s, expected %s", key,
                gguf_vtype_name(et), want_float ? "float" : "integer");
        return TOK_ERR_FORMAT;
    }
    if ((*out)->v.arr.n != n) {
        tok_err(err, errlen, "tokenizer: %s has %llu elements but tokenizer.ggml.tokens has %llu",
                key, (unsigned long long)(*out)->v.arr.n, (unsigned long long)n);
        return TOK_ERR_FORMAT;
    }
    return 0;
}

static int tok_load_vocab(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    const gguf_value_t *toks, *scores, *types;
    uint64_t n;
    size_t total = 0, pos = 0;
    int rc;

    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_COUNT, &toks) != 0) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is missing or not an array");
        return TOK_ERR_FORMAT;
    }
    if (toks->v.arr.type != GGUF_VT_STRING || !toks->v.arr.items) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is not an array of strings");
        return TOK_ERR_FORMAT;
    }
    n = toks->v.arr.n;
    if (n == 0 || n >= (uint64_t)INT32_MAX) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.tokens has %llu tokens",
                (unsigned long long)n);
        return TOK_ERR_FORMAT;
    }
    t->n_vocab = (int32_t)n;

    rc = tok_load_arr(g, "tokenizer.ggml.scores", t->kind == TOK_KIND_SPM, 1, n, &scores, err,
                      errlen);
    if (rc < 0)
        return rc;
    rc = tok_load_arr(g, "tokenizer.ggml.token_type", 1, 0, n, &types, err, errlen);
    if (rc < 0)
        return rc;

    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = toks->v.arr.items[i].v.str.len;
        if (l == 0) {
            tok_err(err, errlen, "tokenizer: token %llu has empty text", (unsigned long long)i);
            return TOK_ERR_FORMAT;
        }
        if (l > TOK_MAX_TEXT) {
            tok_err(err, errlen, "tokenizer: token %llu is %llu bytes long (limit %u)",
                    (unsigned long long)i, (unsigned long long)l, TOK_MAX_TEXT);
            return TOK_ERR_FORMAT;
        }
        total += (size_t)l + 1;
    }

    t->pool = malloc(total);
    t->off = malloc(n * sizeof *t->off);
    t->len = malloc(n * sizeof *t->len);
    t->type = malloc(n);
    t->flag = calloc(n, 1);
    t->byte_val = calloc(n, 1);
    if (scores)
        t->score = malloc(n * sizeof *t->score);
    if (!t->pool || !t->off || !t->len || !t->type || !t->flag || !t->byte_val ||
        (scores && !t->score) || tok_map_init(&t->vocab, n) < 0) {
        tok_err(err, errlen, "tokenizer: out of memory for %llu tokens", (unsigned long long)n);
        return TOK_ERR_NOMEM;
    }

    for (uint64_t i = 0; i < n; i++) {
        gguf_str_t s = toks->v.arr.items[i].v.str;
        int64_t ty = gguf_arr_i64(types, i);

        if (ty < 0 || ty > TOK_TYPE_BYTE) {
            tok_err(err, errlen, "tokenizer: token %llu has unknown token_type %lld",
                    (unsigned long long)i, (long long)ty);
            return TOK_ERR_FORMAT;
        }
        t->type[i] = (uint8_t)ty;
        if (scores) {
            double sc = gguf_arr_f64(scores, i);
            if (isnan(sc)) {
                tok_err(err, errlen, "tokenizer: token %llu has a NaN score",
                        (unsigned long long)i);
                return TOK_ERR_FORMAT;
            }
            t->score[i] = (float)sc;
        }
        memcpy(t->pool + pos, s.ptr, s.len);
        t->pool[pos + s.len] = '\0';
        t->off[i] = pos;
        t->len[i] = (uint32_t)s.len;
        pos += s.len + 1;
        if (s.len > t->max_len)
            t->max_len = s.len;
        if (t->kind == TOK_KIND_SPM && ty == TOK_TYPE_BYTE) {
            int b = tok_parse_byte_token(s.ptr, s.len);
            if (b < 0) {
                tok_err(err, errlen,
                        "tokenizer: byte token %llu has text \"%.*s\", expected <0xNN>",
                        (unsigned long long)i, (int)(s.len > 32 ? 32 : s.len), s.ptr);
                return TOK_ERR_FORMAT;
            }
            t->byte_val[i] = (uint8_t)b;
        }
        /* llama.cpp: token_to_id[text] = i, so a duplicate maps to its last id */
        tok_map_put(&t->vocab, t->pool + t->off[i], s.len, (int32_t)i, 1);
    }
    return 0;
}

typedef struct tok_special_sort {
    uint32_t len;
    int32_t id;
} tok_special_sort_t;

static int tok_special_cmp(const void *a, const void *b)
{
    const tok_special_sort_t *x = a, *y = b;

    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int tok_build_specials(tok_t *t, char *err, size_t errlen)
{
    tok_special_sort_t *tmp;
    size_t k = 0;

    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN)
            k++;
    }
    if (k == 0)
        return 0;
    tmp = malloc(k * sizeof *tmp);
    t->specials = malloc(k * sizeof *t->specials);
    if (!tmp || !t->specials) {
        free(tmp);
        tok_err(err, errlen, "tokenizer: out of memory for %zu special tokens", k);
        return TOK_ERR_NOMEM;
    }
    k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN)
            tmp[k++] = (tok_special_sort_t){.len = t->len[i], .id = i};
    }
    qsort(tmp, k, sizeof *tmp, tok_special_cmp);
    for (size_t i = 0; i < k; i++)
        t->specials[i] = tmp[i].id;
    t->n_specials = k;
    free(tmp);
    return 0;
}

/* Token texts that end generation in llama.cpp (c392e50), which also makes
 * each such token CONTROL whatever the file says (so its text is parsed only
 * as a special token and not printed). */
static const char *const tok_eog_text[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
};

/* Fill-in-the-middle pad, repository and file-separator tokens: llama.cpp
 * ends generation at them too, by id from the key or else by these texts. */
static const struct {
    const char *key;
    const char *text[4];
} tok_fim_eog[] = {
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<PAD>"}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
};

/* The fill-in-the-middle prefix, suffix and middle tokens: by id from the keys, else by the
 * texts of the families llama.cpp knows (Qwen2.5-Coder, StarCoder, CodeLlama, DeepSeek-Coder). */
static const char *const tok_fim_key[3] = {"tokenizer.ggml.fim_pre_token_id",
                                           "tokenizer.ggml.fim_suf_token_id",
                                           "tokenizer.ggml.fim_mid_token_id"};
static const char *const tok_fim_text[][3] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
    {"<fim-prefix>", "<fim-suffix>", "<fim-middle>"},
    {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>", "\xe2\x96\x81<MID>"},
    {"<PRE>", "<SUF>", "<MID>"},
    {"<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "begin\xef\xbd\x9c>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "hole\xef\xbd\x9c>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "end\xef\xbd\x9c>"},
};

static int tok_build_fim(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    int found = 1;
    for (int i = 0; i < 3; i++) {
        if (tok_load_id(g, tok_fim_key[i], t->n_vocab, &t->fim[i], err, errlen) < 0)
            return TOK_ERR_FORMAT;
        found &= t->fim[i] >= 0;
    }
    for (size_t f = 0; !found && f < sizeof tok_fim_text / sizeof tok_fim_text[0]; f++) {
        found = 1;
        for (int i = 0; i < 3; i++) {
            t->fim[i] = tok_map_get(&t->vocab, tok_fim_text[f][i], strlen(tok_fim_text[f][i]));
            found &= t->fim[i] >= 0;
        }
    }
    if (!found)
        t->fim[0] = t->fim[1] = t->fim[2] = -1;
    return 0;
}

int tok_fim(const tok_t *t, int32_t ids[3])
{
    if (t->fim[0] < 0)
        return -1;
    memcpy(ids, t->fim, sizeof t->fim);
    return 0;
}

/* Marks the end-of-generation tokens: EOS, EOT and EOM ids, the texts above
 * and the FIM ones. Runs before tok_build_specials (it changes types). */
static int tok_build_eog(tok_t *t, const gguf_t *g, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof tok_eog_text / sizeof tok_eog_text[0]; i++) {
        int32_t id = tok_map_get(&t->vocab, tok_eog_text[i], strlen(tok_eog_text[i]));
        if (id >= 0) {
            t->flag[id] |= TOK_F_EOG;
            t->type[id] = TOK_TYPE_CONTROL;
        }
    }
    for (size_t i = 0; i < sizeof tok_fim_eog / sizeof tok_fim_eog[0]; i++) {
        int32_t id;
        if (tok_load_id(g, tok_fim_eog[i].key, t->n_vocab, &id, err, errlen) < 0)
            return TOK_ERR_FORMAT;
        if (id >= 0) {
            t->flag[id] |= TOK_F_EOG;
            continue;
        }
        for (size_t k = 0; k < 4 && tok_fim_eog[i].text[k]; k++) {
            id = tok_map_get(&t->vocab, tok_fim_eog[i].text[k], strlen(tok_fim_eog[i].text[k]));
            if (id >= 0) {
                t->flag[id] |= TOK_F_EOG;
                t->type[id] = TOK_TYPE_CONTROL;
            }
        }
    }
    if (t->eos >= 0)
        t->flag[t->eos] |= TOK_F_EOG;
    if (t->eot >= 0)
        t->flag[t->eot] |= TOK_F_EOG;
    if (t->eom >= 0)
        t->flag[t->eom] |= TOK_F_EOG;
    return 0;
}

/* Whitespace that special tokens swallow, as llama.cpp sets it by model:
 * Phi-3 (general.name holding "phi-3" or "phi3", any case) strips it after
 * every special token but <unk>, <s> and <|endoftext|>, and after </s>; the
 * jina-v2 de/es/code pre-tokenizers strip it before <mask>. */
static void tok_build_strip(tok_t *t, const gguf_t *g)
{
    gguf_str_t name = {0}, pre = {0};
    char lower[256], pre_s[64];
    size_t n = 0, np = 0;

    if (gguf_get_str(g, "general.name", &name) == 0) {
        n = name.len < sizeof lower - 1 ? name.len : sizeof lower - 1;
        for (size_t i = 0; i < n; i++) {
            char c = name.ptr[i];
            lower[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
        }
    }
    lower[n] = '\0';
    if (t->kind == TOK_KIND_BPE && gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0) {
        np = pre.len < sizeof pre_s - 1 ? pre.len : sizeof pre_s - 1;
        memcpy(pre_s, pre.ptr, np);
    }
    pre_s[np] = '\0';
    if (strstr(pre_s, "jina-v2-de") || strstr(pre_s, "jina-v2-es") ||
        strstr(pre_s, "jina-v2-code")) {
        int32_t id = tok_map_get(&t->vocab, "<mask>", 6);
        if (id >= 0)
            t->flag[id] |= TOK_F_LSTRIP;
    } else if (strstr(lower, "phi-3") || strstr(lower, "phi3")) {
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        int32_t id;
        for (size_t i = 0; i < t->n_specials; i++)
            t->flag[t->specials[i]] |= TOK_F_RSTRIP;
        if ((id = tok_map_get(&t->vocab, "</s>", 4)) >= 0)
            t->flag[id] |= TOK_F_RSTRIP;
        for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
            if ((id = tok_map_get(&t->vocab, keep[i], strlen(keep[i]))) >= 0)
                t->flag[id] &= (uint8_t)~TOK_F_RSTRIP;
    }
}

static void tok_build_bytes(tok_t *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char s[8];
        int32_t id;

        if (t->kind == TOK_KIND_SPM) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            id = tok_map_get(&t->vocab, s, 6);
            if (id < 0) { /* llama.cpp falls back to the byte itself as a token */
                s[0] = (char)b;
                id = tok_map_get(&t->vocab, s, 1);
            }
        } else {
            size_t n = tok_utf8_put(s, tok_byte_to_cp(b));
            id = tok_map_get(&t->vocab, s, n);
        }
        t->byte_tok[b] = id;
    }
}

tok_t *tok_open(const gguf_t *g, char *err, size_t errlen)
{
    tok_t *t = NULL;
    gguf_str_t model;
    int rc;

    if (!g) {
        tok_err(err, errlen, "tokenizer: no model");
        return NULL;
    }
    rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != 0) {
        tok_err(err, errlen, "tokenizer: tokenizer.ggml.model is %s",
                rc == GGUF_ERR_NOTFOUND ? "missing" : "not a string");
        return NULL;
    }
    t = calloc(1, sizeof *t);
    if (!t) {
        tok_err(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    if (tok_str_eq(model, "llama")) {
        t->kind = TOK_KIND_SPM;
    } else if (tok_str_eq(model, "gpt2")) {
        t->kind = TOK_KIND_BPE;
    } else {
        tok_err(err, errlen,
                "tokenizer: unsupported tokenizer.ggml.model \"%.*s\" (want llama or gpt2)",
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }

    if (tok_load_vocab(t, g, err, errlen) < 0)
        goto fail;
    if (t->kind == TOK_KIND_BPE && tok_load_merges(t, g, err, errlen) < 0)
        goto fail;
    if (tok_load_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err, errlen) < 0 ||
        tok_load_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err, errlen) < 0)
        goto fail;
    if (t->kind == TOK_KIND_BPE && tok_compile_pre(t, g, err, errlen) < 0)
        goto fail;
    if (tok_load_bool(g, "tokenizer.ggml.add_bos_token",
                      t->kind == TOK_KIND_SPM || (t->pre && (t->pre->flags & TOK_PRE_ADD_BOS)),
                      &t->add_bos, err, errlen) < 0 ||
        tok_load_bool(g, "tokenizer.ggml.add_space_prefix", 1, &t->add_space_prefix, err, errlen) <
            0)
        goto fail;
    if (tok_build_eog(t, g, err, errlen) < 0 || tok_build_fim(t, g, err, errlen) < 0 ||
        tok_build_specials(t, err, errlen) < 0)
        goto fail;
    tok_build_strip(t, g);
    tok_build_bytes(t);
    return t;

fail:
    tok_close(t);
    return NULL;
}

void tok_close(tok_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    tok_map_free(&t->vocab);
    tok_map_free(&t->merges);
    free(t->mpool);
    free(t->specials);
    free(t->byte_val);
    free(t->flag);
    free(t->type);
    free(t->score);
    free(t->len);
    free(t->off);
    free(t->pool);
    free(t);
}

/* ------------------------------------------------------------------ accessors */

tok_kind_t tok_kind(const tok_t *t)
{
    return t ? t->kind : 0;
}
int32_t tok_vocab_size(const tok_t *t)
{
    return t ? t->n_vocab : 0;
}
int32_t tok_bos(const tok_t *t)
{
    return t ? t->bos : TOK_NONE;
}
int32_t tok_eos(const tok_t *t)
{
    return t ? t->eos : TOK_NONE;
}
int tok_add_bos(const tok_t *t)
{
    return t && t->add_bos && t->bos >= 0;
}

int tok_is_eog(const tok_t *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->flag[id] & TOK_F_EOG);
}

int tok_type(const tok_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return TOK_ERR_RANGE;
    return t->type[id];
}

const char *tok_text(const tok_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    return t->pool + t->off[id];
}

int32_t tok_find(const tok_t *t, const char *text)
{
    if (!t || !text)
        return TOK_NONE;
    return tok_map_get(&t->vocab, text, strlen(text));
}

/* ------------------------------------------------------------------ encoding: the input split at special tokens */

static void tok_work_free(tok_work_t *w)
{
    free(w->buf);
    free(w->sym);
    free(w->heap);
    free(w->pair);
    free(w->frag);
    free(w->frag2);
    free(w->piece);
    free(w->piece2);
    pcre2_match_data_free(w->md);
}

/* ASCII whitespace, as C's isspace in the "C" locale. */
static int tok_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Split the input into raw text and special-token fragments: for each
 * special token, longest text first, every occurrence in the remaining raw
 * text is cut out (llama.cpp tokenizer_st_partition), with the whitespace
 * before (TOK_F_LSTRIP) or after (TOK_F_RSTRIP) it where the token says so.
 * USER_DEFINED tokens are always cut out (as llama.cpp and Hugging Face do);
 * CONTROL and UNKNOWN ones only with parse_special. */
static int tok_partition(const tok_t *t, tok_work_t *w, const char *text, size_t len,
                         int parse_special)
{
    w->nfrag = 0;
    if (len == 0)
        return 0;
    if (tok_reserve((void **)&w->frag, &w->fragcap, 1, sizeof *w->frag) < 0)
        return TOK_ERR_NOMEM;
    w->frag[0] = (tok_frag_t){.off = 0, .len = len, .id = TOK_NONE};
    w->nfrag = 1;

    for (size_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        const char *st = t->pool + t->off[id];
        size_t sl = t->len[id], nf = 0, need = 0;

        if (!parse_special && t->type[id] != TOK_TYPE_USER_DEFINED)
            continue;
        for (size_t i = 0; i < w->nfrag; i++) { /* count the new fragments */
            const tok_frag_t *f = &w->frag[i];
            size_t pos = f->off, end = f->off + f->len;
            const char *p;
            if (f->id >= 0)
                continue;
            while (pos < end && (p = memmem(text + pos, end - pos, st, sl)) != NULL) {
                need += 2;
                pos = (size_t)(p - text) + sl;
            }
        }
        if (need == 0)
            continue;
        if (tok_reserve((void **)&w->frag2, &w->frag2cap, w->nfrag + need, sizeof *w->frag2) < 0)
            return TOK_ERR_NOMEM;
        for (size_t i = 0; i < w->nfrag; i++) {
            const tok_frag_t *f = &w->frag[i];
            size_t pos = f->off, end = f->off + f->len;
            const char *p;
            if (f->id >= 0) {
                w->frag2[nf++] = *f;
                continue;
            }
            while (pos < end && (p = memmem(text + pos, end - pos, st, sl)) != NULL) {
                size_t at = (size_t)(p - text), left = at;
                if (t->flag[id] & TOK_F_LSTRIP)
                    while (left > pos && tok_is_space(text[left - 1]))
                        left--;
                if (left > pos)
                    w->frag2[nf++] = (tok_frag_t){.off = pos, .len = left - pos, .id = TOK_NONE};
                w->frag2[nf++] = (tok_frag_t){.off = at, .len = sl, .id = id};
                pos = at + sl;
                if (t->flag[id] & TOK_F_RSTRIP)
                    while (pos < end && tok_is_space(text[pos]))
                        pos++;
            }
            if (pos < end)
                w->frag2[nf++] = (tok_frag_t){.off = pos, .len = end - pos, .id = TOK_NONE};
        }
        tok_frag_t *tmp = w->frag;
        size_t tmpcap = w->fragcap;
        w->frag = w->frag2;
        w->fragcap = w->frag2cap;
        w->frag2 = tmp;
        w->frag2cap = tmpcap;
        w->nfrag = nf;
    }
    return 0;
}

/* ------------------------------------------------------------------ encoding: entry point */

int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, size_t cap)
{
    tok_work_t w = {0};
    tok_out_t o = {.ids = ids, .cap = ids ? cap : 0, .n = 0};
    int prev_special = 1; /* SPM: the space prefix goes before the first text and after specials */
    int rc = 0;

    if (!t || (!text && len))
        return TOK_ERR_RANGE;
    if (len > TOK_MAX_INPUT)
        return TOK_ERR_RANGE;
    if (add_bos && t->bos >= 0)
        tok_out_push(&o, t->bos);
    rc = tok_partition(t, &w, text, len, parse_special);
    for (size_t i = 0; rc == 0 && i < w.nfrag; i++) {
        const tok_frag_t f = w.frag[i];
        if (f.id >= 0) {
            tok_out_push(&o, f.id);
            prev_special = 1;
        } else if (t->kind == TOK_KIND_SPM) {
            rc =
                tok_encode_spm(t, &w, text + f.off, f.len, t->add_space_prefix && prev_special, &o);
            prev_special = 0;
        } else {
            rc = tok_encode_bpe(t, &w, text + f.off, f.len, &o);
        }
    }
    tok_work_free(&w);
    if (rc < 0)
        return rc;
    if (o.n > INT_MAX)
        return TOK_ERR_RANGE;
    return (int)o.n;
}

/* ------------------------------------------------------------------ decoding */

typedef struct tok_wr {
    char *buf;
    size_t cap;
    size_t n; /* full length, may exceed cap */
} tok_wr_t;

static void tok_wr_put(tok_wr_t *w, const char *s, size_t n)
{
    if (w->n < w->cap) {
        size_t k = w->cap - w->n < n ? w->cap - w->n : n;
        memcpy(w->buf + w->n, s, k);
    }
    w->n += n;
}

int tok_piece(const tok_t *t, int32_t id, int special, char *buf, size_t cap)
{
    tok_wr_t w = {.buf = buf, .cap = buf ? cap : 0, .n = 0};
    const char *s;
    size_t n;

    if (!t || id < 0 || id >= t->n_vocab)
        return TOK_ERR_RANGE;
    s = t->pool + t->off[id];
    n = t->len[id];
    switch (t->type[id]) {
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
        if (special)
            tok_wr_put(&w, s, n);
        break;
    case TOK_TYPE_USER_DEFINED: tok_wr_put(&w, s, n); break;
    case TOK_TYPE_NORMAL:
    case TOK_TYPE_BYTE:
        if (t->kind == TOK_KIND_SPM && t->type[id] == TOK_TYPE_BYTE) {
            char c = (char)t->byte_val[id];
            tok_wr_put(&w, &c, 1);
        } else if (t->kind == TOK_KIND_SPM) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    tok_wr_put(&w, " ", 1);
                    i += 3;
                } else {
                    tok_wr_put(&w, s + i, 1);
                    i++;
                }
            }
        } else {
            for (size_t i = 0; i < n;) {
                int32_t cp;
                size_t cl = tok_utf8_get(s + i, n - i, &cp);
                int b = tok_cp_to_byte(cp);
                if (b >= 0) {
                    char c = (char)b;
                    tok_wr_put(&w, &c, 1);
                } else {
                    tok_wr_put(&w, s + i, cl); /* not a byte-level char: as stored */
                }
                i += cl;
            }
        }
        break;
    default: /* UNUSED, undefined: nothing, as llama.cpp */ break;
    }
    if (w.n < w.cap)
        buf[w.n] = '\0';
    return (int)w.n;
}

/* ------------------------------------------------------------------ streaming decoder */

void tok_stream_init(tok_stream_t *s, const tok_t *t, int special)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->special = special;
}

/* Emit the complete characters of b[0..m) into out (cap, NUL-terminated),
 * invalid sequences (and NUL bytes) as U+FFFD; an incomplete tail goes back into s->pending
 * unless final. Nothing in s changes when out is too small. */
static int tok_stream_emit(tok_stream_t *s, const unsigned char *b, size_t m, int final, char *out,
                           size_t cap)
{
    static const char repl[3] = {'\xEF', '\xBF', '\xBD'};
    size_t i = 0, o = 0, hold = 0;

    if (!out || cap == 0)
        return TOK_ERR_RANGE;
    while (i < m) {
        unsigned char c = b[i];
        size_t need, k = 1;
        unsigned lo = 0x80, hi = 0xBF;
        const char *src;
        size_t srcn;

        if (c == 0x00) {
            need = SIZE_MAX; /* NUL would end the C string the text travels in */
        } else if (c < 0x80) {
            need = 0;
        } else if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            need = SIZE_MAX; /* never valid */
        }
        if (need != SIZE_MAX) {
            while (k <= need && i + k < m) {
                unsigned d = b[i + k];
                if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF))
                    break;
                k++;
            }
        }
        if (need != SIZE_MAX && k == need + 1) {
            src = (const char *)b + i;
            srcn = k;
        } else if (need != SIZE_MAX && i + k == m && !final) {
            hold = k; /* incomplete, but valid so far: wait for more */
            break;
        } else {
            src = repl; /* one U+FFFD for the maximal invalid prefix */
            srcn = 3;
        }
        if (o + srcn + 1 > cap)
            return TOK_ERR_RANGE;
        memcpy(out + o, src, srcn);
        o += srcn;
        i += k;
    }
    out[o] = '\0';
    memcpy(s->pending, b + i, hold);
    s->npending = hold;
    if (o > INT_MAX)
        return TOK_ERR_RANGE;
    return (int)o;
}

int tok_stream_feed(tok_stream_t *s, int32_t id, char *out, size_t cap)
{
    unsigned char small[256], *b = small;
    size_t np;
    int n, rc;

    if (!s || !s->t)
        return TOK_ERR_RANGE;
    np = s->npending < sizeof s->pending ? s->npending : sizeof s->pending;
    n = tok_piece(s->t, id, s->special, NULL, 0);
    if (n < 0)
        return n;
    if (np + (size_t)n > sizeof small) {
        b = malloc(np + (size_t)n);
        if (!b)
            return TOK_ERR_NOMEM;
    }
    memcpy(b, s->pending, np);
    tok_piece(s->t, id, s->special, (char *)b + np, (size_t)n);
    rc = tok_stream_emit(s, b, np + (size_t)n, 0, out, cap);
    if (b != small)
        free(b);
    return rc;
}

int tok_stream_flush(tok_stream_t *s, char *out, size_t cap)
{
    unsigned char b[sizeof s->pending];
    size_t np;

    if (!s)
        return TOK_ERR_RANGE;
    np = s->npending < sizeof s->pending ? s->npending : sizeof s->pending;
    memcpy(b, s->pending, np);
    return tok_stream_emit(s, b, np, 1, out, cap);
}

/* mkseeds: writes the GGUF seeds of tests/fuzz/corpus/gguf/ with ggufw (run once by hand; the files are committed).
 *
 *   make BUILD=build-fz build-fz/libgpuswapd.a build-fz/libtesttools.a
 *   cc -std=c11 -D_GNU_SOURCE -iquote daemon/engine -iquote tests/tools/lib tests/fuzz/mkseeds.c \
 *      build-fz/libtesttools.a build-fz/libgpuswapd.a $(pkg-config --libs libpcre2-8) -lm -pthread \
 *      -o /tmp/mkseeds && /tmp/mkseeds tests/fuzz/corpus/gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggufw.h"
#include "engine/model.h"
#include "kernels/quant.h"

static const char *dir;

static void save(ggufw_t *w, const char *name, int want_model)
{
    uint8_t *buf;
    size_t len;
    char path[512], err[256] = "";
    if (ggufw_write_mem(w, &buf, &len)) {
        fprintf(stderr, "%s: write failed\n", name);
        exit(1);
    }
    gguf_t *g = gguf_open_mem(buf, len, name, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s: %s\n", name, err);
        exit(1);
    }
    model_t *m = model_from_gguf(g, err, sizeof err);
    if (want_model && !m) {
        fprintf(stderr, "%s: %s\n", name, err);
        exit(1);
    }
    model_close(m);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "%s: cannot write\n", path);
        exit(1);
    }
    printf("%s: %zu bytes%s\n", path, len, m ? " (a model)" : "");
    free(buf);
    ggufw_free(w);
}

/* A small SPM or BPE vocabulary of nv tokens. */
static void vocab(ggufw_t *w, int bpe, uint32_t nv)
{
    const char **toks = malloc(nv * sizeof *toks);
    float *scores = malloc(nv * sizeof *scores);
    int32_t *types = malloc(nv * sizeof *types);
    char(*b)[16] = malloc(nv * sizeof *b);
    for (uint32_t i = 0; i < nv; i++) {
        if (i == 0)
            snprintf(b[i], 16, bpe ? "<|endoftext|>" : "<unk>");
        else if (i == 1)
            snprintf(b[i], 16, bpe ? "<|im_start|>" : "<s>");
        else if (i == 2)
            snprintf(b[i], 16, bpe ? "<|im_end|>" : "</s>");
        else if (i < 3 + 26)
            snprintf(b[i], 16, "%c", 'a' + (int)(i - 3));
        else if (i == 29)
            snprintf(b[i], 16, bpe ? "\xC4\xA0" : "\xE2\x96\x81");
        else
            snprintf(b[i], 16, "%c%c", 'a' + (int)(i % 26), 'a' + (int)(i / 26 % 26));
        toks[i] = b[i];
        scores[i] = -(float)i;
        types[i] = i == 0 && !bpe ? 2 : i < 3 ? 3 : 1;
    }
    ggufw_kv_str(w, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
    if (bpe)
        ggufw_kv_str(w, "tokenizer.ggml.pre", "qwen2");
    ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, nv);
    ggufw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, nv);
    ggufw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, nv);
    if (bpe) {
        const char *merges[] = {"a b", "c d", "e f"};
        ggufw_kv_arr_str(w, "tokenizer.ggml.merges", merges, 3);
    }
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    free(toks);
    free(scores);
    free(types);
    free(b);
}

static void tensor(ggufw_t *w, const char *name, uint32_t type, uint32_t n_in, uint32_t n_out)
{
    size_t n = (size_t)n_in * (n_out ? n_out : 1);
    float *x = malloc(n * sizeof *x);
    void *q = malloc(n * sizeof(float) + 64);
    for (size_t i = 0; i < n; i++)
        x[i] = n_out ? (float)((i * 7919) % 17) / 17.0f - 0.5f : 1.0f;
    uint32_t t = n_out ? type : GGUF_T_F32;
    quant_row_from_f32(t, x, q, n);
    uint64_t ne[2] = {n_in, n_out ? n_out : 1};
    ggufw_tensor(w, name, t, n_out ? 2 : 1, ne, q, quant_row_bytes(t, n_in) * ne[1]);
    free(x);
    free(q);
}

/* A one-layer model: d 32, 2 heads / 1 KV head, ff 32. */
static void model(const char *name, const char *arch, uint32_t type, int bpe, int tied)
{
    const uint32_t d = 32, nh = 2, nkv = 1, ff = 32, nv = 40, hd = d / nh;
    ggufw_t *w = ggufw_new(3, 32);
    char k[128];
    ggufw_kv_str(w, "general.architecture", arch);
#define KU(s, v) (snprintf(k, sizeof k, "%s." s, arch), ggufw_kv_u32(w, k, v))
    KU("embedding_length", d);
    KU("block_count", 1);
    KU("feed_forward_length", ff);
    KU("attention.head_count", nh);
    KU("attention.head_count_kv", nkv);
    KU("context_length", 64);
#undef KU
    snprintf(k, sizeof k, "%s.rope.freq_base", arch);
    ggufw_kv_f32(w, k, 10000.0f);
    vocab(w, bpe, nv);
    tensor(w, "token_embd.weight", type, d, nv);
    tensor(w, "output_norm.weight", type, d, 0);
    if (!tied)
        tensor(w, "output.weight", type, d, nv);
    tensor(w, "blk.0.attn_norm.weight", type, d, 0);
    tensor(w, "blk.0.attn_q.weight", type, d, d);
    tensor(w, "blk.0.attn_k.weight", type, d, nkv * hd);
    tensor(w, "blk.0.attn_v.weight", type, d, nkv * hd);
    if (strcmp(arch, "qwen2") == 0) {
        tensor(w, "blk.0.attn_q.bias", type, d, 0);
        tensor(w, "blk.0.attn_k.bias", type, nkv * hd, 0);
        tensor(w, "blk.0.attn_v.bias", type, nkv * hd, 0);
    }
    tensor(w, "blk.0.attn_output.weight", type, d, d);
    tensor(w, "blk.0.ffn_norm.weight", type, d, 0);
    tensor(w, "blk.0.ffn_gate.weight", type, d, ff);
    tensor(w, "blk.0.ffn_up.weight", type, d, ff);
    tensor(w, "blk.0.ffn_down.weight", type, ff, d);
    save(w, name, 1);
}

static void le(uint8_t **p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        *(*p)++ = (uint8_t)(v >> (8 * i));
}

int main(int argc, char **argv)
{
    dir = argc > 1 ? argv[1] : ".";
    model("llama-q8_0.gguf", "llama", GGUF_T_Q8_0, 0, 0);
    model("qwen2-f16-bpe.gguf", "qwen2", GGUF_T_F16, 1, 1);
    model("llama-bf16-tied.gguf", "llama", GGUF_T_BF16, 0, 1);

    /* every metadata type, nested arrays, v2, alignment 64, odd tensor types */
    ggufw_t *w = ggufw_new(2, 64);
    ggufw_kv_str(w, "general.architecture", "llama");
    ggufw_kv_str(w, "general.name", "types \xC3\xA9");
    uint8_t raw[256], *p;
    for (uint32_t t = 0; t <= 12; t++) {
        if (t == 8 || t == 9)
            continue;
        char key[32];
        snprintf(key, sizeof key, "t.scalar.%u", t);
        p = raw;
        le(&p, 0x8000000000000001ull, 8);
        ggufw_kv_raw(w, key, t, raw, t == 0 || t == 1 || t == 7 ? 1 : t <= 3 ? 2 : t <= 6 ? 4 : 8);
        snprintf(key, sizeof key, "t.array.%u", t);
        p = raw;
        le(&p, t, 4);
        le(&p, 3, 8);
        for (int i = 0; i < 24; i++)
            *p++ = t == 7 ? (uint8_t)(i & 1) : (uint8_t)(i * 37 + t);
        size_t es = t == 0 || t == 1 || t == 7 ? 1 : t <= 3 ? 2 : t <= 6 ? 4 : 8;
        ggufw_kv_raw(w, key, 9, raw, 12 + 3 * es);
    }
    p = raw; /* [[1, 2], ["x"]] as an array of arrays */
    le(&p, 9, 4);
    le(&p, 2, 8);
    le(&p, 4, 4);
    le(&p, 2, 8);
    le(&p, 1, 4);
    le(&p, 2, 4);
    le(&p, 8, 4);
    le(&p, 1, 8);
    le(&p, 1, 8);
    *p++ = 'x';
    ggufw_kv_raw(w, "t.nested", 9, raw, (size_t)(p - raw));
    const char *strs[] = {"", "a", "\xF0\x9F\x98\x80"};
    ggufw_kv_arr_str(w, "t.strings", strs, 3);
    uint64_t ne[4] = {32, 2, 1, 1};
    uint8_t data[256] = {0};
    ggufw_tensor(w, "q4_0", GGUF_T_Q4_0, 2, ne, data, 36);
    ggufw_tensor(w, "i8", GGUF_T_I8, 4, ne, data, 64);
    uint64_t ne1[1] = {3};
    ggufw_tensor(w, "f64", GGUF_T_F64, 1, ne1, data, 24);
    save(w, "types-v2-align64.gguf", 0);

    w = ggufw_new(3, 0); /* nothing at all */
    save(w, "empty-v3.gguf", 0);
    return 0;
}

/* tu_model: a small random Llama/Qwen2 model written to a temp GGUF and opened, shared by the unit tests. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "ggufw.h"
#include "engine/model.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t tu_rng_state = 42;

/* A small random model built in memory (no tokenizer needed by fwd_run:
 * model_from_gguf wants one, so a minimal SPM vocab is written). */
model_t *tu_tiny_model(uint32_t type, int qwen)
{
    char path[256];
    tu_tiny_model_file(path, sizeof path, type, qwen, 64, 96, NULL, 0);
    char err[256];
    model_t *m = model_open(path, err, sizeof err);
    unlink(path); /* the mapping stays valid */
    cr_assert_not_null(m, "%s", err);
    return m;
}

void tu_tiny_model_file(char *path, size_t cap, uint32_t type, int qwen, uint32_t d, uint32_t ff,
                        const char *odd_name, uint32_t odd_type)
{
    const uint32_t nl = 2, nh = 4, nkv = 2, nv = 300, hd = d / nh;
    ggufw_t *w = ggufw_new(3, 32);
    const char *arch = qwen ? "qwen2" : "llama";
    char k[128];
    ggufw_kv_str(w, "general.architecture", arch);
#define KU(s, v) (snprintf(k, sizeof k, "%s." s, arch), ggufw_kv_u32(w, k, v))
    KU("embedding_length", d);
    KU("block_count", nl);
    KU("feed_forward_length", ff);
    KU("attention.head_count", nh);
    KU("attention.head_count_kv", nkv);
    KU("context_length", 256);
#undef KU
    const char **toks = malloc(nv * sizeof *toks);
    float *scores = malloc(nv * sizeof(float));
    int32_t *types = malloc(nv * sizeof(int32_t));
    char(*buf)[16] = malloc(nv * sizeof *buf);
    for (uint32_t i = 0; i < nv; i++) {
        if (i == 0)
            snprintf(buf[i], 16, "<unk>");
        else if (i == 1)
            snprintf(buf[i], 16, "<s>");
        else if (i == 2)
            snprintf(buf[i], 16, "</s>");
        else if (i < 259)
            snprintf(buf[i], 16, "<0x%02X>", i - 3);
        else
            snprintf(buf[i], 16, "t%u", i);
        toks[i] = buf[i];
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    ggufw_kv_str(w, "tokenizer.ggml.model", "llama");
    ggufw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, nv);
    ggufw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, nv);
    ggufw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, nv);
    ggufw_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    ggufw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    struct {
        const char *name;
        uint32_t n_in, n_out;
        int norm;
    } ts[] = {
        {"token_embd.weight", d, nv, 0},
        {"output_norm.weight", d, 0, 1},
        {"output.weight", d, nv, 0},
    };
    float *tmp = malloc(sizeof(float) * ff * nv);
    void *q = malloc(sizeof(float) * ff * nv);
    for (size_t t = 0; t < 3 + nl * 12; t++) {
        const char *name;
        char nb[64];
        uint32_t n_in, n_out;
        int norm;
        if (t < 3) {
            name = ts[t].name;
            n_in = ts[t].n_in;
            n_out = ts[t].n_out;
            norm = ts[t].norm;
        } else {
            uint32_t l = (uint32_t)(t - 3) / 12, j = (uint32_t)(t - 3) % 12;
            static const char *const suf[12] = {
                "attn_norm.weight",   "attn_q.weight",   "attn_k.weight",   "attn_v.weight",
                "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                "ffn_down.weight",    "attn_q.bias",     "attn_k.bias",     "attn_v.bias"};
            const uint32_t shp[12][2] = {{d, 0},  {d, d}, {d, nkv * hd}, {d, nkv * hd},
                                         {d, d},  {d, 0}, {d, ff},       {d, ff},
                                         {ff, d}, {d, 0}, {nkv * hd, 0}, {nkv * hd, 0}};
            if (j >= 9 && !qwen)
                continue;
            snprintf(nb, sizeof nb, "blk.%u.%s", l, suf[j]);
            name = nb;
            n_in = shp[j][0];
            n_out = shp[j][1];
            norm = n_out == 0;
        }
        size_t n = (size_t)n_in * (n_out ? n_out : 1);
        for (size_t i = 0; i < n; i++)
            tmp[i] = norm ? 1.0f + 0.1f * tu_frand(&tu_rng_state)
                          : tu_frand(&tu_rng_state) * sqrtf(3.0f / n_in);
        uint32_t tt = norm ? GGUF_T_F32 : type;
        uint64_t ne[2] = {n_in, n_out ? n_out : 1};
        if (odd_name && strcmp(name, odd_name) == 0) {
            /* a type the engine may not compute with: arbitrary bytes of its size */
            uint32_t blck, bytes;
            cr_assert_eq(gguf_ttype_traits(odd_type, &blck, &bytes), 0);
            size_t nb = (size_t)n_in / blck * bytes * ne[1];
            memset(q, 0x5a, nb);
            ggufw_tensor(w, name, odd_type, n_out ? 2 : 1, ne, q, nb);
            continue;
        }
        quant_row_from_f32(tt, tmp, q, n);
        ggufw_tensor(w, name, tt, n_out ? 2 : 1, ne, q, quant_row_bytes(tt, n_in) * ne[1]);
    }
    close(tu_tmpfile(path, cap, "gpuswapd-tiny"));
    cr_assert_eq(ggufw_write_file(w, path), 0);
    ggufw_free(w);
    free(tmp);
    free(q);
    free(toks);
    free(scores);
    free(types);
    free(buf);
}

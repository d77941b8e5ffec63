/* Unit tests of LoRA adapters (engine/lora.c and their products in engine/forward.c): what an adapter file must be against its base, and a step of sequences of different adapters (and of the base alone) giving each sequence what it gets alone. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "testutil.h"

#define LORA_SHAPE "--dim 64 --layers 3 --heads 4 --kv-heads 2 --ff 128 --vocab 300"

static model_t *base_open(const char *args, char *path, size_t cap)
{
    char err[512], all[512];
    snprintf(all, sizeof all, "%s %s", LORA_SHAPE, args);
    tu_mkmodel(path, cap, all);
    model_t *m = model_open(path, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    return m;
}

/* mklora's adapter for the base file at base_path, opened at scale. */
static lora_t *adapter(const model_t *m, const char *base_path, const char *args, float scale,
                       int *code, char *err, size_t errlen)
{
    char path[256], cmd[1024];
    close(tu_tmpfile(path, sizeof path, "gpuswapd-lora"));
    snprintf(cmd, sizeof cmd, "%s/mklora --base %s --out %s %s", tu_build_dir(), base_path, path,
             args);
    cr_assert_eq(system(cmd), 0, "mklora failed: %s", cmd);
    lora_t *a = lora_open(path, m, scale, code, err, errlen);
    unlink(path);
    return a;
}

static backend_t *cpu_be(void)
{
    char err[256];
    be_params_t p = {.kind = BE_KIND_CPU, .threads = 2};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    return be;
}

Test(lora, pairs_scales_and_refusals_against_the_base)
{
    char bpath[256], opath[256], err[512];
    model_t *m = base_open("--type f16 --seed 1", bpath, sizeof bpath);
    int code = -99;
    lora_t *a =
        adapter(m, bpath, "--rank 8 --alpha 32 --targets q,v,down", 0.5f, &code, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    cr_assert_eq(code, LORA_OK);
    cr_assert_eq(a->n_pairs, 3 * 3);
    cr_assert_eq(a->w.rank_max, 8);
    for (uint32_t l = 0; l < 3; l++) {
        cr_assert_not_null(lora_pair(&a->w, l, LORA_Q));
        cr_assert_null(lora_pair(&a->w, l, LORA_K));
        const lora_pair_t *p = lora_pair(&a->w, l, LORA_DOWN);
        cr_assert_not_null(p);
        cr_assert_float_eq(p->scale, 0.5f * 32.0f / 8.0f, 1e-6, "scale x alpha / rank");
        cr_assert_eq(p->a.n_in, 128);
        cr_assert_eq(p->a.n_out, 8);
        cr_assert_eq(p->b.n_in, 8);
        cr_assert_eq(p->b.n_out, 64);
    }
    lora_close(a);
    a = adapter(m, bpath, "--rank 4 --alpha -1", 2.0f, &code, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    cr_assert_float_eq(lora_pair(&a->w, 0, LORA_O)->scale, 2.0f, 1e-6, "no alpha: the scale");
    lora_close(a);
    /* made for a wider base, or another architecture: refused as LORA_ERR_BASE */
    model_t *other = base_open("--type f16 --seed 2 --ff 256", opath, sizeof opath);
    a = adapter(other, opath, "--rank 8 --targets up", 1.0f, &code, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    lora_close(a);
    char cmd[1024], lpath[256];
    close(tu_tmpfile(lpath, sizeof lpath, "gpuswapd-lora"));
    snprintf(cmd, sizeof cmd, "%s/mklora --base %s --out %s --rank 8 --targets up", tu_build_dir(),
             opath, lpath);
    cr_assert_eq(system(cmd), 0);
    cr_assert_null(lora_open(lpath, m, 1.0f, &code, err, sizeof err));
    cr_assert_eq(code, LORA_ERR_BASE, "%s", err);
    cr_assert(strstr(err, "the pair maps 64 -> 256, the base matrix 64 -> 128"), "%s", err);
    unlink(lpath);
    a = adapter(m, bpath, "--rank 8 --arch qwen3", 1.0f, &code, err, sizeof err);
    cr_assert_null(a);
    cr_assert_eq(code, LORA_ERR_BASE, "%s", err);
    /* the base itself is not an adapter */
    cr_assert_null(lora_open(bpath, m, 1.0f, &code, err, sizeof err));
    cr_assert_eq(code, LORA_ERR_FORMAT, "%s", err);
    model_close(other);
    model_close(m);
    unlink(bpath);
    unlink(opath);
}

/* Logits of seq alone (a fresh cache), with its adapter. */
static void alone(fwd_t *f, const model_t *m, const int32_t *toks, uint32_t n,
                  const lora_weights_t *lw, float *out)
{
    char err[512];
    kv_seq_t *kv = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
    fwd_seq_t s = {kv, toks, n, out, lw};
    cr_assert_eq(fwd_run(f, &m->hp, &m->w, &s, 1, NULL, err, sizeof err), 0, "%s", err);
    kv_seq_free(kv);
}

static void mixed_batch(const char *base_args, const char *lora_args)
{
    char bpath[256], err[512];
    model_t *m = base_open(base_args, bpath, sizeof bpath);
    lora_t *ad[2];
    for (int i = 0; i < 2; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s --seed %d", lora_args, 10 + i);
        ad[i] = adapter(m, bpath, args, 1.0f, NULL, err, sizeof err);
        cr_assert_not_null(ad[i], "%s", err);
    }
    backend_t *be = cpu_be();
    fwd_t *f = fwd_new(be);
    const uint32_t nv = m->hp.n_vocab;
    enum {
        NS = 6
    };
    /* adapters 0, 1, none, 0, 0, 1: runs of one adapter and interleaved ones */
    const lora_weights_t *lw[NS] = {&ad[0]->w, &ad[1]->w, NULL, &ad[0]->w, &ad[0]->w, &ad[1]->w};
    int32_t toks[NS][5] = {{1, 5, 9, 13, 200}, {1, 42}, {1, 7, 7}, {1, 2}, {3}, {1, 5, 9, 13, 200}};
    uint32_t lens[NS] = {5, 2, 3, 2, 1, 5};
    float *want[NS], *got[NS], *plain = malloc(nv * sizeof(float));
    for (int s = 0; s < NS; s++) {
        want[s] = malloc(nv * sizeof(float));
        got[s] = malloc(nv * sizeof(float));
        alone(f, m, toks[s], lens[s], lw[s], want[s]);
    }
    alone(f, m, toks[0], lens[0], NULL, plain);
    cr_assert_neq(memcmp(plain, want[0], nv * sizeof(float)), 0, "the adapter changes the logits");
    cr_assert_neq(memcmp(want[0], want[5], nv * sizeof(float)), 0, "two adapters differ");
    /* the backend's one-call LoRA kernel against matmul, scale and add per segment */
    backend_t plain_be = *be;
    plain_be.lora_mm = NULL;
    fwd_t *f2 = fwd_new(&plain_be);
    static const uint32_t chunks[] = {1, 4, 0};
    for (int c = 0; c < 6; c++) {
        fwd_t *fc = c < 3 ? f : f2;
        fwd_set_chunk(fc, chunks[c % 3]);
        kv_seq_t *kvs[NS];
        fwd_seq_t b[NS];
        for (int s = 0; s < NS; s++) {
            kvs[s] = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
            b[s] = (fwd_seq_t){kvs[s], toks[s], lens[s], got[s], lw[s]};
        }
        cr_assert_eq(fwd_run(fc, &m->hp, &m->w, b, NS, NULL, err, sizeof err), 0, "%s", err);
        for (int s = 0; s < NS; s++) {
            cr_assert_eq(memcmp(want[s], got[s], nv * sizeof(float)), 0,
                         "%s / %s seq %d: batched (chunks of %u%s) differs from alone", base_args,
                         lora_args, s, chunks[c % 3], c < 3 ? "" : ", without lora_mm");
            kv_seq_free(kvs[s]);
        }
    }
    for (int s = 0; s < NS; s++) {
        free(want[s]);
        free(got[s]);
    }
    free(plain);
    fwd_free(f2);
    fwd_free(f);
    be_close(be);
    lora_close(ad[0]);
    lora_close(ad[1]);
    model_close(m);
    unlink(bpath);
}

Test(lora, a_step_of_several_adapters_gives_each_sequence_what_it_gets_alone)
{
    mixed_batch("--type q8_0 --seed 3", "--rank 8 --type f16 --targets q,k,v,o");
    mixed_batch("--type f16 --seed 4", "--rank 32 --type q8_0 --targets q,k,v,o,gate,up,down");
    mixed_batch("--arch qwen2 --type bf16 --seed 5", "--rank 16 --type bf16 --targets v,gate,down");
}

Test(lora, scale_zero_is_the_base_and_a_foreign_adapter_is_an_argument_error)
{
    char bpath[256], opath[256], err[512];
    model_t *m = base_open("--type f32 --seed 6", bpath, sizeof bpath);
    lora_t *a = adapter(m, bpath, "--rank 8 --type f32 --targets q,k,v,o,gate,up,down", 0.0f, NULL,
                        err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    backend_t *be = cpu_be();
    fwd_t *f = fwd_new(be);
    const uint32_t nv = m->hp.n_vocab;
    float *x = malloc(nv * sizeof(float)), *y = malloc(nv * sizeof(float));
    int32_t toks[4] = {1, 9, 8, 7};
    alone(f, m, toks, 4, NULL, x);
    alone(f, m, toks, 4, &a->w, y);
    cr_assert_eq(memcmp(x, y, nv * sizeof(float)), 0, "scale 0 adds zeros");
    /* an adapter of another depth */
    char args[256];
    snprintf(args, sizeof args, "--type f32 --seed 7 --layers 2");
    model_t *two = base_open(args, opath, sizeof opath);
    lora_t *b = adapter(two, opath, "--rank 8", 1.0f, NULL, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    kv_seq_t *kv = kv_seq_new(&m->hp, 64, KV_TYPE_F16);
    fwd_seq_t s = {kv, toks, 4, x, &b->w};
    cr_assert_eq(fwd_run(f, &m->hp, &m->w, &s, 1, NULL, err, sizeof err), FWD_ERR_ARG);
    cr_assert(strstr(err, "an adapter of 2 layers on a model of 3"), "%s", err);
    cr_assert_eq(kv->n_past, 0, "nothing written");
    kv_seq_free(kv);
    free(x);
    free(y);
    fwd_free(f);
    be_close(be);
    lora_close(a);
    lora_close(b);
    model_close(m);
    model_close(two);
    unlink(bpath);
    unlink(opath);
}

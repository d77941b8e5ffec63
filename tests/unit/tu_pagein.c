/* tu_pagein: the page-in correctness check shared by test_residency (sim) and test_backend_cuda (cuda): swapped-in and quota-streamed passes equal a resident pass bit for bit. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "worker/residency.h"
#include "worker/store.h"
#include "testutil.h"

#define PI_PROMPT 12 /* over the GEMM threshold of the cuda backend */
#define PI_DECODE 3
#define PI_CTX 32

static const int32_t pi_prompt[PI_PROMPT] = {1, 17, 42, 99, 7, 250, 3, 311, 64, 128, 5, 401};
static const int32_t pi_decode[PI_DECODE] = {5, 123, 77};

/* One acquire .. release pass: prefill then decode; (1 + PI_DECODE) logit
 * rows into out. */
static void pi_pass(res_t *res, res_model_t *rm, fwd_t *fw, float *out)
{
    char err[256] = "";
    const model_t *m = res_store_model(rm)->model;
    cr_assert_eq(res_acquire(res, rm, err, sizeof err), 0, "acquire: %s", err);
    kv_seq_t *kv = NULL;
    cr_assert_eq(res_kv_new(res, rm, PI_CTX, &kv, err, sizeof err), 0, "kv: %s", err);
    cr_assert_eq(res_kv_ensure(res, kv, PI_PROMPT, err, sizeof err), 0, "kv: %s", err);
    fwd_hooks_t h = res_hooks(rm);
    fwd_seq_t s = {kv, pi_prompt, PI_PROMPT, out, NULL};
    cr_assert_eq(fwd_run(fw, &m->hp, res_weights(rm), &s, 1, &h, err, sizeof err), 0, "prefill: %s",
                 err);
    for (int i = 0; i < PI_DECODE; i++) {
        cr_assert_eq(res_kv_ensure(res, kv, PI_PROMPT + i + 1, err, sizeof err), 0, "kv: %s", err);
        fwd_seq_t d = {kv, &pi_decode[i], 1, out + (size_t)(i + 1) * m->hp.n_vocab, NULL};
        cr_assert_eq(fwd_run(fw, &m->hp, res_weights(rm), &d, 1, &h, err, sizeof err), 0,
                     "decode %d: %s", i, err);
    }
    res_kv_free(res, kv);
    res_release(res, rm);
}

/* Index of the first float that differs bit for bit, or -1. */
static long pi_first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return (long)i;
    return -1;
}

void tu_pagein_equal(backend_t *be)
{
    char path[256], err[512] = "";
    tu_mkmodel(
        path, sizeof path,
        "--type f16 --dim 128 --layers 6 --heads 8 --kv-heads 4 --ff 384 --vocab 512 --seed 11");
    store_t *st = store_new(be, 0);
    cr_assert_not_null(st);
    res_t *res = res_new(be, err, sizeof err);
    cr_assert_not_null(res, "%s", err);
    store_model_t *sm;
    cr_assert_eq(store_load(st, "pagein", path, &sm, err, sizeof err), 0, "%s", err);
    unlink(path);
    res_model_t *rm;
    res_cfg_t cfg = {0};
    cr_assert_eq(res_add(res, sm, &cfg, &rm, err, sizeof err), 0, "%s", err);
    size_t page = res_page_size(res);
    cr_assert_geq(be->pool_bytes / page, 16, "pool of %zu pages is too small for this check",
                  be->pool_bytes / page);
    fwd_t *fw = fwd_new(be);
    cr_assert_not_null(fw);
    const size_t n = (1 + PI_DECODE) * (size_t)sm->model->hp.n_vocab;
    float *resident = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    cr_assert(resident && got);

    /* a first pass pages everything in; the second runs fully resident */
    pi_pass(res, rm, fw, got);
    cr_assert(res_fully_resident(res, rm), "not fully resident after a pass with a free pool");
    stats_res_t a, b;
    res_model_stats(res, rm, &a);
    pi_pass(res, rm, fw, resident);
    res_model_stats(res, rm, &b);
    cr_assert_eq(b.total_page_ins, a.total_page_ins, "the resident pass paged something in");
    long d = pi_first_diff(got, resident, n);
    cr_assert_eq(d, -1, "%s: first pass vs resident pass differ at logit %ld", be->name, d);

    /* swapped out entirely, then one pass pages it all in again */
    cr_assert_eq(res_evict(res, rm, RES_CAUSE_ADMIN, 0), 0);
    cr_assert_eq(res_model_bytes(rm), 0);
    pi_pass(res, rm, fw, got);
    res_model_stats(res, rm, &a);
    cr_assert_geq(a.total_page_ins - b.total_page_ins, sm->n_segs,
                  "the swapped-in pass paged in %llu segments",
                  (unsigned long long)(a.total_page_ins - b.total_page_ins));
    d = pi_first_diff(got, resident, n);
    cr_assert_eq(d, -1,
                 "%s: swapped-in pass differs from the resident pass at logit %ld (%g vs %g)",
                 be->name, d, d >= 0 ? got[d] : 0.0, d >= 0 ? resident[d] : 0.0);

    /* a quota of the minimum to run (embedding + largest segment) + the KV
     * cache + one page: the layers stream through, evicting each other */
    size_t mx = 0;
    for (uint32_t s = 1; s < sm->n_segs; s++)
        if (sm->segs[s].span > mx)
            mx = sm->segs[s].span;
    res_cfg_t q = {.gpu_quota = sm->segs[0].span + mx +
                                res_kv_bytes_for(res, &sm->model->hp, PI_CTX) + page};
    cr_assert_lt(q.gpu_quota, sm->image_bytes, "the quota would hold the whole model");
    cr_assert_eq(res_set_cfg(res, rm, &q, err, sizeof err), 0, "%s", err);
    for (int k = 0; k < 2; k++) {
        pi_pass(res, rm, fw, got);
        cr_assert_leq(res_model_bytes(rm), q.gpu_quota);
        d = pi_first_diff(got, resident, n);
        cr_assert_eq(d, -1,
                     "%s: streamed pass %d differs from the resident pass at logit %ld (%g vs %g)",
                     be->name, k, d, d >= 0 ? got[d] : 0.0, d >= 0 ? resident[d] : 0.0);
    }
    res_model_stats(res, rm, &b);
    cr_assert_gt(b.evictions_quota, 0, "nothing was evicted for the quota: no streaming happened");

    free(resident);
    free(got);
    fwd_free(fw);
    cr_assert_eq(res_remove(res, rm), 0);
    store_unload(st, sm);
    res_free(res);
    store_free(st);
}

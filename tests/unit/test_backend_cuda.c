/* Unit tests for the cuda backend: its page pool, every kernel and whole forward passes against the cpu backend (skipped without a GPU, failed with the reason under GPUSWAPD_REQUIRE_CUDA=1). */
/*
 * Tolerances (max |cuda - cpu| over a result, relative to max |cpu|):
 *   exact conversions (embed, kv_store, gather, add, add_bias)    0
 *   F32 elementwise kernels, rmsnorm, rope, attention (split too)  1e-5 .. 1e-4
 *   matmul through the GEMV kernel (<= 8 tokens, every type) and
 *   F32 GEMM (cuBLAS, F32 compute)                                 1e-4
 *   F16/BF16 GEMM through cuBLAS (> 8 tokens: activations rounded
 *   to the weight type, F32 accumulation)                          2e-2
 *   any GEMM on the own tiled kernel (GPUSWAPD_CUBLAS=none or no
 *   cuBLAS found: F32 activations and accumulation)                1e-4
 *   forward-pass logits: F32/Q8_0 1e-3, F16 2e-2, BF16 5e-2 (the
 *   prefill goes through the half GEMM and its error carries on)
 *   block types (Q4_0 .. IQ4_XS) against the cpu's exact path (F32
 *   activations): embed 0, GEMV 1e-4, prefill through cuBLAS on F16
 *   copies of the weight rows 2e-2, Q4_K_M forward logits 2e-2; the
 *   llama.cpp-quantized files of tests/data/kquant: rms(cuda - llama.cpp
 *   logits) <= 6% of their std at every position (the bound)
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "ggufw.h"
#include "engine/kv.h"
#include "engine/lora.h"
#include "engine/model.h"
#include "kernels/quant.h"
#include "testutil.h"

/* ------------------------------------------------------------------ helpers */

#define POOL_BYTES (256u << 20)

/* GPUSWAPD_REQUIRE_CUDA=1 (gpu-check): a missing GPU fails the test with the
 * reason instead of skipping it, so a run cannot pass with nothing tested. */
static int cuda_required(void)
{
    const char *e = getenv("GPUSWAPD_REQUIRE_CUDA");
    return e && *e && strcmp(e, "0") != 0;
}

/* own_gemm: GPUSWAPD_CUBLAS=none, so prefill GEMMs run on the backend's own
 * tiled kernel whether cuBLAS is installed or not. */
static backend_t *open_cuda_with(size_t memory, int own_gemm)
{
    char err[512] = "";
    if (!be_cuda_available()) {
        char why[1024] = "";
        be_cuda_status(why, sizeof why);
        /* without a device the backend must still fail politely */
        be_params_t p = {.kind = BE_KIND_CUDA, .memory = memory};
        backend_t *be = be_open(&p, err, sizeof err);
        cr_assert_null(be, "cuda backend opened without a visible device");
        cr_assert(err[0] != '\0', "no reason given");
        if (cuda_required())
            cr_assert_fail("GPUSWAPD_REQUIRE_CUDA is set but CUDA is unusable: %s (be_open: %s)",
                           why, err);
        cr_skip_test("no CUDA device visible: skipping (%s; %s)", why, err);
    }
    const char *old = getenv("GPUSWAPD_CUBLAS");
    char *saved = old ? strdup(old) : NULL;
    if (own_gemm)
        setenv("GPUSWAPD_CUBLAS", "none", 1);
    be_params_t p = {.kind = BE_KIND_CUDA, .memory = memory};
    backend_t *be = be_open(&p, err, sizeof err);
    if (own_gemm) {
        if (saved)
            setenv("GPUSWAPD_CUBLAS", saved, 1);
        else
            unsetenv("GPUSWAPD_CUBLAS");
    }
    free(saved);
    cr_assert_not_null(be, "be_open(cuda): %s", err);
    cr_assert_str_eq(be->name, "cuda");
    cr_assert_not_null(be->desc, "cuda backend without a description");
    cr_log_info("cuda backend: %s", be->desc);
    if (own_gemm)
        cr_assert(strstr(be->desc, "prefill GEMM: own tiled kernel") != NULL,
                  "GPUSWAPD_CUBLAS=none but: %s", be->desc);
    return be;
}

static backend_t *open_cuda_sized(size_t memory)
{
    return open_cuda_with(memory, 0);
}

static backend_t *open_cuda(void)
{
    return open_cuda_with(POOL_BYTES, 0);
}

/* 1 if be runs its prefill GEMMs through cuBLAS. */
static int uses_cublas(const backend_t *be)
{
    return strstr(be->desc, "prefill GEMM: cuBLAS") != NULL;
}

static backend_t *open_cpu(void)
{
    /* the cuda kernels take F32 activations: compare with the cpu's exact path */
    quant_path_set(QUANT_PATH_EXACT);
    char err[256];
    be_params_t p = {.kind = BE_KIND_CPU, .threads = 2};
    backend_t *be = be_open(&p, err, sizeof err);
    cr_assert_not_null(be, "%s", err);
    return be;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rand_vec(size_t n, float scale)
{
    float *v = malloc(n * sizeof(float));
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

/* A buffer of the backend holding a copy of host (bytes). */
static void *dput(backend_t *be, const void *host, size_t bytes)
{
    void *d = be->buf_alloc(be->ctx, bytes);
    cr_assert_not_null(d, "%s: buf_alloc(%zu)", be->name, bytes);
    if (host)
        cr_assert_eq(be->upload(be->ctx, d, host, bytes), 0, "%s: upload", be->name);
    return d;
}

/* malloc'ed host copy of a backend buffer; the caller frees it. */
static float *dget(backend_t *be, const void *dev, size_t bytes)
{
    float *h = malloc(bytes);
    cr_assert_not_null(h);
    cr_assert_eq(be->sync(be->ctx), 0, "%s: sync", be->name);
    cr_assert_eq(be->download(be->ctx, h, dev, bytes), 0, "%s: download", be->name);
    return h;
}

/* Compares rows (n floats, stride apart) of got and want. */
static void check_rows(const char *what, const float *got, const float *want, size_t n_rows,
                       size_t n, size_t stride, double tol)
{
    double mx = 0, md = 0;
    size_t at = 0;
    for (size_t r = 0; r < n_rows; r++) {
        for (size_t i = 0; i < n; i++) {
            double w = want[r * stride + i], g = got[r * stride + i];
            cr_assert(isfinite(g), "%s: row %zu elem %zu is %g", what, r, i, g);
            if (fabs(w) > mx)
                mx = fabs(w);
            if (fabs(g - w) > md) {
                md = fabs(g - w);
                at = r * stride + i;
            }
        }
    }
    double bound = tol * (mx > 0 ? mx : 1.0);
    cr_assert_leq(md, bound, "%s: max |cuda - cpu| = %g at %zu (cuda %g, cpu %g), bound %g", what,
                  md, at, (double)got[at], (double)want[at], bound);
}

static const uint32_t all_types[4] = {GGUF_T_F32, GGUF_T_F16, GGUF_T_BF16, GGUF_T_Q8_0};
/* the block types of cuda_quant.cuh */
static const uint32_t block_types[11] = {GGUF_T_Q4_0, GGUF_T_Q4_1,   GGUF_T_Q5_0,  GGUF_T_Q5_1,
                                         GGUF_T_Q2_K, GGUF_T_Q3_K,   GGUF_T_Q4_K,  GGUF_T_Q5_K,
                                         GGUF_T_Q6_K, GGUF_T_IQ4_NL, GGUF_T_IQ4_XS};
#define N_BLOCK_TYPES (sizeof block_types / sizeof block_types[0])

/* ------------------------------------------------------------------ page pool, copies, events */

Test(backend_cuda, pool_maps_unmaps_and_enforces_its_budget, .timeout = 60)
{
    /* GPUSWAPD_PLANT_CUDA_FAILURE=1, a test-only switch: the gpu-check dry run plants this one
     * failing assertion and expects its text and file:line in the report */
    const char *plant = getenv("GPUSWAPD_PLANT_CUDA_FAILURE");
    cr_assert(!plant || strcmp(plant, "1") != 0,
              "planted failure (GPUSWAPD_PLANT_CUDA_FAILURE=1): the report must show this text");
    backend_t *be = open_cuda_sized(16u << 20);
    size_t pg = be->page_size;
    cr_assert_geq(pg, 2u << 20);
    size_t n_pages = be->pool_bytes / pg;
    cr_assert_geq(n_pages, 2);
    void *base = NULL;
    cr_assert_eq(be->reserve(be->ctx, (n_pages + 4) * pg, &base), 0);
    cr_assert_not_null(base);
    cr_assert_eq(be->reserve(be->ctx, pg + 1, &base), BE_ERR_ARG);

    /* two maps filling the budget; one more page is refused */
    size_t a = n_pages / 2, b = n_pages - a;
    cr_assert_eq(be->map(be->ctx, base, 0, a * pg), 0);
    cr_assert_eq(be->map(be->ctx, base, a * pg, b * pg), 0);
    cr_assert_eq(be->map(be->ctx, base, n_pages * pg, pg), BE_ERR_NOMEM);
    cr_assert_eq(be->map(be->ctx, base, 0, pg), BE_ERR_ARG, "double map accepted");

    /* data survives a copy and reads back */
    size_t nb = n_pages * pg;
    unsigned char *src = be->host_alloc(be->ctx, nb);
    cr_assert_not_null(src);
    for (size_t i = 0; i < nb; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    be_event_t *ev;
    cr_assert_eq(be->event_new(be->ctx, &ev), 0);
    cr_assert_eq(be->copy_h2d(be->ctx, base, src, nb, ev), 0);
    cr_assert_eq(be->wait(be->ctx, ev), 0);
    unsigned char *back = malloc(nb);
    cr_assert_eq(be->download(be->ctx, back, base, nb), 0);
    cr_assert_eq(memcmp(back, src, nb), 0, "copied pages read back differently");
    for (int i = 0; i < 10000 && be->event_done(be->ctx, ev) != 1; i++)
        usleep(1000);
    cr_assert_eq(be->event_done(be->ctx, ev), 1);
    be_copy_times_t t;
    cr_assert_eq(be->event_times(be->ctx, ev, &t), 0);
    cr_assert(t.queued >= 0 && t.queued <= t.start && t.start <= t.end, "times %g %g %g", t.queued,
              t.start, t.end);

    /* unmapping part of a map is an error; a span over both maps frees them */
    if (a > 1)
        cr_assert_eq(be->unmap(be->ctx, base, pg, pg), BE_ERR_ARG);
    cr_assert_eq(be->unmap(be->ctx, base, 0, (n_pages + 4) * pg), 0);
    cr_assert_eq(be->map(be->ctx, base, 4 * pg, n_pages * pg), 0, "freed pages not reusable");
    be->release(be->ctx, base, (n_pages + 4) * pg);

    be->event_free(be->ctx, ev);
    be->host_free(be->ctx, src, nb);
    free(back);
    be_close(be);
}

/* ------------------------------------------------------------------ kernels */

/* A random (n_out, n_in) weight of the given type (host bytes, malloc'ed). */
static void *rand_weight(uint32_t type, uint32_t n_in, uint32_t n_out, size_t *bytes)
{
    float *f = rand_vec((size_t)n_in * n_out, sqrtf(3.0f / (float)n_in));
    *bytes = quant_row_bytes(type, n_in) * n_out;
    void *q = malloc(*bytes);
    cr_assert_not_null(q);
    quant_row_from_f32(type, f, q, (size_t)n_in * n_out);
    free(f);
    return q;
}

/* Rows 0, 36, 5, 5, 17 and 1 of a random (37, n_in) weight of the type,
 * embedded on cuda and cpu into rows of stride floats: equal exactly. */
static void embed_matches(backend_t *cu, backend_t *cp, uint32_t type, uint32_t n_in, size_t stride)
{
    const uint32_t n_rows = 37;
    const int32_t ids[6] = {0, 36, 5, 5, 17, 1};
    size_t wb;
    void *wh = rand_weight(type, n_in, n_rows, &wb);
    float *res[2];
    backend_t *bes[2] = {cu, cp};
    for (int k = 0; k < 2; k++) {
        backend_t *be = bes[k];
        void *wd = dput(be, wh, wb);
        float *out = dput(be, NULL, 6 * stride * sizeof(float));
        model_weight_t tab = {type, n_in, n_rows, wd, wb};
        cr_assert_eq(be->embed(be->ctx, &tab, ids, 6, out, stride), 0, "%s %s",
                     gguf_ttype_name(type), be->name);
        res[k] = dget(be, out, 6 * stride * sizeof(float));
        be->buf_free(be->ctx, wd);
        be->buf_free(be->ctx, out);
    }
    check_rows(gguf_ttype_name(type), res[0], res[1], 6, n_in, stride, 0.0);
    free(res[0]);
    free(res[1]);
    free(wh);
}

Test(backend_cuda, embed_matches_cpu_exactly_for_every_weight_type, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    for (int ti = 0; ti < 4; ti++)
        embed_matches(cu, cp, all_types[ti], 96, 100);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, rmsnorm_matches_cpu_also_in_place, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t n_tok = 7, n = 200, stride = 256;
    float *x = rand_vec(n_tok * stride, 3.0f), *w = rand_vec(n, 1.0f);
    for (int inplace = 0; inplace < 2; inplace++) {
        float *res[2];
        backend_t *bes[2] = {cu, cp};
        for (int k = 0; k < 2; k++) {
            backend_t *be = bes[k];
            float *dx = dput(be, x, n_tok * stride * sizeof(float));
            float *dw = dput(be, w, n * sizeof(float));
            float *dout = inplace ? dx : dput(be, NULL, n_tok * stride * sizeof(float));
            cr_assert_eq(be->rmsnorm(be->ctx, dout, dx, dw, n_tok, n, stride, 1e-5f), 0);
            res[k] = dget(be, dout, n_tok * stride * sizeof(float));
            be->buf_free(be->ctx, dx);
            be->buf_free(be->ctx, dw);
            if (!inplace)
                be->buf_free(be->ctx, dout);
        }
        check_rows(inplace ? "rmsnorm in place" : "rmsnorm", res[0], res[1], n_tok, n, stride,
                   1e-5);
        free(res[0]);
        free(res[1]);
    }
    free(x);
    free(w);
    be_close(cu);
    be_close(cp);
}

typedef enum {
    EW_ADD_BIAS,
    EW_ADD,
    EW_SILU_MUL,
    EW_SCALE,    /* x *= 3.5 (gemma's embedding scale) */
    EW_SOFTCAP,  /* x = 2 tanh(x / 2): values up to 4 land on both sides of the cap */
    EW_GELU_MUL, /* gelu_tanh(g) * u */
} ew_op_t;

static int ew_call(backend_t *be, ew_op_t op, float *da, const float *db, size_t n_tok, size_t n,
                   size_t stride)
{
    switch (op) {
    case EW_ADD_BIAS: return be->add_bias(be->ctx, da, db, n_tok, n, stride);
    case EW_ADD: return be->add(be->ctx, da, db, n_tok, n, stride);
    case EW_SILU_MUL: return be->silu_mul(be->ctx, da, db, n_tok, n, stride);
    case EW_SCALE: return be->scale(be->ctx, da, n_tok, n, stride, 3.5f);
    case EW_SOFTCAP: return be->softcap(be->ctx, da, n_tok, n, stride, 2.0f);
    case EW_GELU_MUL: return be->gelu_mul(be->ctx, da, db, n_tok, n, stride);
    }
    return -1;
}

static void check_elementwise(ew_op_t op, const char *name, double tol)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t n_tok = 5, n = 300, stride = 320;
    float *a = rand_vec(n_tok * stride, 4.0f), *b = rand_vec(n_tok * stride, 2.0f);
    float *res[2];
    backend_t *bes[2] = {cu, cp};
    for (int k = 0; k < 2; k++) {
        backend_t *be = bes[k];
        float *da = dput(be, a, n_tok * stride * sizeof(float));
        float *db = dput(be, b, n_tok * stride * sizeof(float));
        int rc = ew_call(be, op, da, db, n_tok, n, stride);
        cr_assert_eq(rc, 0, "%s: %s", be->name, name);
        res[k] = dget(be, da, n_tok * stride * sizeof(float));
        be->buf_free(be->ctx, da);
        be->buf_free(be->ctx, db);
    }
    check_rows(name, res[0], res[1], n_tok, n, stride, tol);
    /* the gaps between rows are left alone */
    for (size_t t = 0; t < n_tok; t++)
        for (size_t i = n; i < stride; i++)
            cr_assert_eq(res[0][t * stride + i], a[t * stride + i], "%s wrote past n", name);
    free(res[0]);
    free(res[1]);
    free(a);
    free(b);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, add_bias_matches_cpu_exactly, .timeout = 60)
{
    check_elementwise(EW_ADD_BIAS, "add_bias", 0.0);
}

Test(backend_cuda, add_matches_cpu_exactly, .timeout = 60)
{
    check_elementwise(EW_ADD, "add", 0.0);
}

Test(backend_cuda, silu_mul_matches_cpu, .timeout = 60)
{
    check_elementwise(EW_SILU_MUL, "silu_mul", 1e-5);
}

Test(backend_cuda, scale_matches_cpu_exactly, .timeout = 60)
{
    check_elementwise(EW_SCALE, "scale", 0.0);
}

Test(backend_cuda, softcap_matches_cpu, .timeout = 60)
{
    check_elementwise(EW_SOFTCAP, "softcap", 1e-5);
}

Test(backend_cuda, gelu_mul_matches_cpu, .timeout = 60)
{
    check_elementwise(EW_GELU_MUL, "gelu_mul", 1e-5);
}

Test(backend_cuda, gather_matches_cpu_also_in_place, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t n_src = 9, n = 70, stride = 80;
    const uint32_t rows[4] = {8, 3, 3, 0};
    const uint32_t rows_ip[3] = {2, 5, 8}; /* compaction in place, as forward.c could do */
    float *x = rand_vec(n_src * stride, 1.0f);
    for (int inplace = 0; inplace < 2; inplace++) {
        float *res[2];
        backend_t *bes[2] = {cu, cp};
        for (int k = 0; k < 2; k++) {
            backend_t *be = bes[k];
            float *dx = dput(be, x, n_src * stride * sizeof(float));
            float *dd = inplace ? dx : dput(be, NULL, n_src * stride * sizeof(float));
            cr_assert_eq(
                be->gather(be->ctx, dd, dx, inplace ? rows_ip : rows, inplace ? 3 : 4, n, stride),
                0);
            res[k] = dget(be, dd, (inplace ? 3 : 4) * stride * sizeof(float));
            be->buf_free(be->ctx, dx);
            if (!inplace)
                be->buf_free(be->ctx, dd);
        }
        check_rows(inplace ? "gather in place" : "gather", res[0], res[1], inplace ? 3 : 4, n,
                   stride, 0.0);
        free(res[0]);
        free(res[1]);
    }
    free(x);
    be_close(cu);
    be_close(cp);
}

static void check_rope(int neox)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    be_rope_t hp = {.head_dim = 64, .rope_dim = 64, .rope_base = 10000.0f, .rope_neox = neox};
    const uint32_t n_heads = 3;
    const size_t n_tok = 6, stride = 200;
    const uint32_t pos[6] = {0, 1, 2, 511, 4097, 30001};
    float *x = rand_vec(n_tok * stride, 1.0f);
    float factors[32]; /* llama3-like: 1 for fast pairs, 8 for slow ones, between */
    for (int i = 0; i < 32; i++)
        factors[i] = i < 12 ? 1.0f : i > 20 ? 8.0f : 1.0f + 7.0f * (float)(i - 12) / 9.0f;
    for (int partial = 0; partial < 7; partial++) {
        hp.rope_dim = partial == 1 ? 32 : 64; /* rotating part of each head only */
        hp.rope_freq_scale = partial == 2 || partial >= 5 ? 0.25f : 0.0f; /* linear scaling by 4 */
        hp.rope_freqs = partial == 3 || partial == 4 || partial == 6 ? factors : NULL; /* factors */
        hp.rope_attn_factor = partial == 4 || partial == 6 ? 1.19f : 0.0f; /* attention factor */
        /* YaRN: fast pairs (below 3) unscaled, slow ones (from 20) scaled, a ramp between */
        hp.rope_ext_factor = partial >= 5 ? 1.0f : 0.0f;
        hp.rope_corr_lo = 3.0f;
        hp.rope_corr_hi = 20.0f;
        float *res[2];
        backend_t *bes[2] = {cu, cp};
        for (int k = 0; k < 2; k++) {
            backend_t *be = bes[k];
            float *dx = dput(be, x, n_tok * stride * sizeof(float));
            cr_assert_eq(be->rope(be->ctx, dx, n_tok, stride, n_heads, pos, &hp), 0);
            res[k] = dget(be, dx, n_tok * stride * sizeof(float));
            be->buf_free(be->ctx, dx);
        }
        check_rows(neox ? "rope neox" : "rope", res[0], res[1], n_tok, n_heads * hp.head_dim,
                   stride, 1e-4);
        free(res[0]);
        free(res[1]);
    }
    free(x);
    be_close(cu);
    be_close(cp);
}

/* rope_matches_cpu_* cover YaRN too (partial 5 and 6) */
Test(backend_cuda, rope_matches_cpu_up_to_position_30000, .timeout = 60)
{
    check_rope(0);
}

Test(backend_cuda, neox_rope_matches_cpu_up_to_position_30000, .timeout = 60)
{
    check_rope(1);
}

/* Two jobs sharing x (as q/k/v), strided x and y (rows of ys), for n_tok tokens. */
static void check_matmul_shape(backend_t *cu, backend_t *cp, uint32_t type, uint32_t n_in,
                               const uint32_t n_out[2], size_t ys, size_t n_tok, double tol)
{
    const size_t xs = n_in + 8;
    size_t wb[2];
    void *wh[2] = {rand_weight(type, n_in, n_out[0], &wb[0]),
                   rand_weight(type, n_in, n_out[1], &wb[1])};
    float *x = rand_vec(n_tok * xs, 1.0f);
    float *res[2][2];
    backend_t *bes[2] = {cu, cp};
    for (int k = 0; k < 2; k++) {
        backend_t *be = bes[k];
        void *wd[2] = {dput(be, wh[0], wb[0]), dput(be, wh[1], wb[1])};
        float *dx = dput(be, x, n_tok * xs * sizeof(float));
        float *dy[2] = {dput(be, NULL, n_tok * ys * sizeof(float)),
                        dput(be, NULL, n_tok * ys * sizeof(float))};
        model_weight_t w[2] = {{type, n_in, n_out[0], wd[0], wb[0]},
                               {type, n_in, n_out[1], wd[1], wb[1]}};
        be_mm_t jobs[2] = {{&w[0], dy[0], ys}, {&w[1], dy[1], ys}};
        cr_assert_eq(be->matmul(be->ctx, jobs, 2, dx, xs, n_tok), 0, "%s matmul", be->name);
        for (int j = 0; j < 2; j++) {
            res[k][j] = dget(be, dy[j], n_tok * ys * sizeof(float));
            be->buf_free(be->ctx, dy[j]);
            be->buf_free(be->ctx, wd[j]);
        }
        be->buf_free(be->ctx, dx);
    }
    for (int j = 0; j < 2; j++) {
        char what[96];
        snprintf(what, sizeof what, "matmul %s n_in %u n_tok %zu job %d", gguf_ttype_name(type),
                 n_in, n_tok, j);
        check_rows(what, res[0][j], res[1][j], n_tok, n_out[j], ys, tol);
        free(res[0][j]);
        free(res[1][j]);
        free(wh[j]);
    }
    free(x);
}

static void check_matmul(backend_t *cu, backend_t *cp, uint32_t type, uint32_t n_in, size_t n_tok,
                         double tol)
{
    const uint32_t n_out[2] = {96, 40};
    check_matmul_shape(cu, cp, type, n_in, n_out, 128, n_tok, tol);
}

Test(backend_cuda, matmul_for_few_tokens_matches_cpu_for_every_weight_type, .timeout = 120)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t toks[3] = {1, 5, 8};
    for (int ti = 0; ti < 4; ti++)
        for (int k = 0; k < 3; k++) {
            check_matmul(cu, cp, all_types[ti], 256, toks[k], 1e-4); /* 16-byte weight loads */
            check_matmul(cu, cp, all_types[ti], 96, toks[k],
                         1e-4); /* lanes idle in the last step */
            if (all_types[ti] != GGUF_T_Q8_0)
                check_matmul(cu, cp, all_types[ti], 98, toks[k], 1e-4); /* scalar weight loads */
        }
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, gemv_with_several_loads_in_flight_matches_cpu_with_and_without_a_tail,
     .timeout = 120)
{
    /* F16/BF16 lanes load 4 x 16 bytes (4 x 256 weights a warp) before using them, F32 4 x 128:
     * whole groups only (4096), groups and a tail of single loads (1280, 4096 + 384) */
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const uint32_t n_in[3] = {4096, 1280, 4096 + 384};
    const size_t toks[2] = {1, 3};
    for (int ti = 0; ti < 3; ti++)
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 2; j++)
                check_matmul(cu, cp, all_types[ti], n_in[k], toks[j], 1e-4);
    be_close(cu);
    be_close(cp);
}

/* Over MM_GEMM_MIN_TOK tokens F32/F16/BF16 go through the GEMM: cuBLAS
 * (half types: activations rounded to the weight type) or, without it, the
 * own tiled kernel (F32 activations, so as close to the cpu as the GEMV). */
static void check_matmul_many(int own_gemm)
{
    backend_t *cu = open_cuda_with(POOL_BYTES, own_gemm), *cp = open_cpu();
    const int blas = uses_cublas(cu);
    if (!own_gemm && !blas) {
        char why[2048];
        snprintf(why, sizeof why, "%s", cu->desc);
        be_close(cu);
        be_close(cp);
        cr_skip_test("cuBLAS not in use, its GEMM path is not tested: %s", why);
    }
    const size_t toks[3] = {9, 70, 300};
    for (int ti = 0; ti < 4; ti++) {
        uint32_t t = all_types[ti];
        double tol = blas && (t == GGUF_T_F16 || t == GGUF_T_BF16) ? 2e-2 : 1e-4;
        for (int k = 0; k < 3; k++) {
            check_matmul(cu, cp, t, 256, toks[k], tol);
            if (t != GGUF_T_Q8_0)
                check_matmul(cu, cp, t, 98, toks[k], tol); /* partial column tiles */
        }
    }
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, matmul_for_many_tokens_through_cublas_matches_cpu_for_every_weight_type,
     .timeout = 120)
{
    check_matmul_many(0);
}

Test(backend_cuda, matmul_for_many_tokens_on_the_own_gemm_kernel_matches_cpu_for_every_weight_type,
     .timeout = 120)
{
    check_matmul_many(1);
}

/* The gemma/phi3 attention operands run_attention_kv passes (0 = none): set
 * by a test, reset by att_feats_reset. */
static float att_scale, att_cap;
static uint32_t att_window;

static void att_feats_reset(void)
{
    att_scale = att_cap = 0.0f;
    att_window = 0;
}

/* ------------------------------------------------------------------ block types */

/* The block types against the cpu's exact path (F32 activations, rows
 * dequantized as quant_row_to_f32 does); the fast path's quantized
 * activations would differ from both by their rounding. */
Test(backend_cuda, embed_of_every_block_type_matches_cpu_exactly, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    /* 1024 wide: four K blocks, 32 legacy blocks a row */
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++)
        embed_matches(cu, cp, block_types[ti], 1024, 1100);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, gemv_of_every_block_type_matches_the_cpu_exact_path, .timeout = 120)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    quant_path_set(QUANT_PATH_EXACT);
    /* a warp step is 256 elements, MM_LOADS steps a group: 256 (one step),
     * 1280 (a group and a tail step), 96 (32-element types: lanes idle) */
    const uint32_t n_in[3] = {256, 1280, 96};
    const size_t toks[4] = {1, 3, 5, 8};
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++) {
        uint32_t blck;
        cr_assert_eq(gguf_ttype_traits(block_types[ti], &blck, NULL), 0);
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 4; j++)
                if (n_in[k] % blck == 0)
                    check_matmul(cu, cp, block_types[ti], n_in[k], toks[j], 1e-4);
    }
    quant_path_set(QUANT_PATH_FAST);
    be_close(cu);
    be_close(cp);
}

/* Over MM_GEMM_MIN_TOK tokens: cuBLAS on F16 copies of the weight rows (x
 * rounded to F16) or, without cuBLAS, the GEMV kernel. */
static void check_block_prefill(int own_gemm)
{
    backend_t *cu = open_cuda_with(POOL_BYTES, own_gemm), *cp = open_cpu();
    const int blas = uses_cublas(cu);
    if (!own_gemm && !blas) {
        char why[2048];
        snprintf(why, sizeof why, "%s", cu->desc);
        be_close(cu);
        be_close(cp);
        cr_skip_test("cuBLAS not in use, the block types' GEMM path is not tested: %s", why);
    }
    quant_path_set(QUANT_PATH_EXACT);
    const size_t toks[3] = {9, 70, 300};
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++)
        for (int k = 0; k < 3; k++)
            check_matmul(cu, cp, block_types[ti], 512, toks[k], blas ? 2e-2 : 1e-4);
    quant_path_set(QUANT_PATH_FAST);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, prefill_of_every_block_type_through_cublas_matches_the_cpu_exact_path,
     .timeout = 120)
{
    check_block_prefill(0);
}

Test(backend_cuda, prefill_of_every_block_type_without_cublas_matches_the_cpu_exact_path,
     .timeout = 120)
{
    check_block_prefill(1);
}

Test(backend_cuda, prefill_of_a_block_weight_over_its_f16_scratch_runs_in_row_chunks,
     .timeout = 120)
{
    /* 16384 inputs: 32 KiB an F16 row, 2048 rows to QK_HALF_MAX (64 MiB):
     * 2100 rows take two chunks, the second of 52 rows */
    backend_t *cu = open_cuda(), *cp = open_cpu();
    if (!uses_cublas(cu)) {
        char why[2048];
        snprintf(why, sizeof why, "%s", cu->desc);
        be_close(cu);
        be_close(cp);
        cr_skip_test("cuBLAS not in use, no F16 copies of block-type rows to chunk: %s", why);
    }
    quant_path_set(QUANT_PATH_EXACT);
    const uint32_t n_out[2] = {2100, 40};
    check_matmul_shape(cu, cp, GGUF_T_Q4_K, 16384, n_out, 2112, 9, 2e-2);
    quant_path_set(QUANT_PATH_FAST);
    be_close(cu);
    be_close(cp);
}

/* Fills a sequence's cache at positions 0..n_pos-1 of layer `layer` with
 * kv_store, then runs attention for tokens at the given positions. */
static float *run_attention_kv(backend_t *be, uint32_t hd, uint32_t n_head, uint32_t n_head_kv,
                               uint32_t n_ctx, uint32_t n_pos, const float *kv_rows,
                               const float *q_rows, const uint32_t *qpos, size_t n_q, int kv_type)
{
    const uint32_t n_layer = 2, layer = 1;
    const size_t kvd = (size_t)n_head_kv * hd, stride = (size_t)n_head * hd;
    size_t cache = (size_t)n_ctx * n_layer * kvd * sizeof(float);
    float *k = dput(be, NULL, cache), *v = dput(be, NULL, cache);
    float *dkv = dput(be, kv_rows, 2 * (size_t)n_pos * stride * sizeof(float));
    be_tok_t *toks = malloc(n_pos * sizeof *toks);
    for (uint32_t p = 0; p < n_pos; p++)
        toks[p] = (be_tok_t){k, v, n_ctx, p};
    be_att_t a = {.toks = toks,
                  .layer = layer,
                  .n_layer = n_layer,
                  .n_head = n_head,
                  .n_head_kv = n_head_kv,
                  .head_dim = hd,
                  .stride = stride,
                  .scale = att_scale,
                  .softcap = att_cap,
                  .window = att_window,
                  .kv_type = kv_type};
    cr_assert_eq(be->kv_store(be->ctx, &a, dkv, dkv + (size_t)n_pos * stride, n_pos), 0);
    for (size_t t = 0; t < n_q; t++)
        toks[t] = (be_tok_t){k, v, n_ctx, qpos[t]};
    float *dq = dput(be, q_rows, n_q * stride * sizeof(float));
    float *dout = dput(be, NULL, n_q * stride * sizeof(float));
    cr_assert_eq(be->attention(be->ctx, &a, dq, dout, n_q), 0, "%s attention", be->name);
    float *out = dget(be, dout, n_q * stride * sizeof(float));
    be->buf_free(be->ctx, k);
    be->buf_free(be->ctx, v);
    be->buf_free(be->ctx, dkv);
    be->buf_free(be->ctx, dq);
    be->buf_free(be->ctx, dout);
    free(toks);
    return out;
}

static float *run_attention(backend_t *be, uint32_t hd, uint32_t n_head, uint32_t n_head_kv,
                            uint32_t n_ctx, uint32_t n_pos, const float *kv_rows,
                            const float *q_rows, const uint32_t *qpos, size_t n_q)
{
    return run_attention_kv(be, hd, n_head, n_head_kv, n_ctx, n_pos, kv_rows, q_rows, qpos, n_q,
                            KV_TYPE_F16);
}

/* Decode at a long context: n_q tokens (sequences) at the given positions of one cache, few
 * (token, head) blocks, so the cuda backend splits the positions over several blocks per head
 * and merges the partial softmaxes in a second kernel. */
static void check_split_attention(uint32_t hd, uint32_t n_head, uint32_t n_head_kv, uint32_t n_pos,
                                  const uint32_t *qpos, size_t n_q, int kv_type)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t stride = (size_t)n_head * hd;
    float *kv = rand_vec(2 * (size_t)n_pos * stride, 2.0f);
    float *q = rand_vec(n_q * stride, 2.0f);
    float *a = run_attention_kv(cu, hd, n_head, n_head_kv, n_pos, n_pos, kv, q, qpos, n_q, kv_type);
    float *b = run_attention_kv(cp, hd, n_head, n_head_kv, n_pos, n_pos, kv, q, qpos, n_q, kv_type);
    char what[128];
    snprintf(what, sizeof what,
             "split attention hd %u heads %u/%u, %zu tokens over %u positions, %s KV", hd, n_head,
             n_head_kv, n_q, n_pos, kv_type == KV_TYPE_F16 ? "F16" : "F32");
    check_rows(what, a, b, n_q, stride, stride, 1e-4);
    free(a);
    free(b);
    free(kv);
    free(q);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, split_decode_attention_matches_cpu_at_context_4096_on_f16_and_f32_kv,
     .timeout = 120)
{
    /* the 8B shape at batch 1: 32 blocks, split into 32 ranges of 128 positions */
    const uint32_t last[1] = {4095};
    check_split_attention(128, 32, 8, 4096, last, 1, KV_TYPE_F16);
    check_split_attention(128, 32, 8, 4096, last, 1, KV_TYPE_F32);
    /* batch 4 at unequal positions: ranges past a short sequence's end are empty; position
     * 130 has one full range and one of 3 positions; a range cut mid-way (4000) */
    const uint32_t mixed[4] = {4095, 130, 4000, 1};
    check_split_attention(128, 8, 2, 4096, mixed, 4, KV_TYPE_F16);
    check_split_attention(64, 8, 8, 4096, mixed, 4, KV_TYPE_F32);
}

static void check_attention(uint32_t hd, uint32_t n_head, uint32_t n_head_kv, uint32_t n_pos)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t stride = (size_t)n_head * hd;
    float *kv = rand_vec(2 * (size_t)n_pos * stride, 2.0f);
    const uint32_t qpos[5] = {0, 1, 7, n_pos / 2, n_pos - 1};
    float *q = rand_vec(5 * stride, 2.0f);
    float *a = run_attention(cu, hd, n_head, n_head_kv, n_pos + 3, n_pos, kv, q, qpos, 5);
    float *b = run_attention(cp, hd, n_head, n_head_kv, n_pos + 3, n_pos, kv, q, qpos, 5);
    char what[96];
    snprintf(what, sizeof what, "attention hd %u heads %u/%u over %u positions", hd, n_head,
             n_head_kv, n_pos);
    check_rows(what, a, b, 5, stride, stride, 1e-4);
    free(a);
    free(b);
    free(kv);
    free(q);
    be_close(cu);
    be_close(cp);
}

Test(backend_cuda, kv_store_and_attention_match_cpu_for_short_contexts, .timeout = 60)
{
    check_attention(8, 8, 8, 12);  /* stories260K's shape: lanes mostly idle */
    check_attention(96, 4, 2, 40); /* grouped-query, head_dim not a multiple of 32 */
}

Test(backend_cuda, attention_matches_cpu_over_a_long_context, .timeout = 120)
{
    check_attention(128, 4, 1, 5000);
}

Test(backend_cuda, soft_capped_sliding_window_attention_matches_cpu_over_short_contexts,
     .timeout = 60)
{
    /* gemma2's shape of the operands: a query scale, scores capped at 5 (q and k up to 2 give
     * scores well past it), windows of 4 and 16 over 40 positions (every token beyond the
     * window drops its first positions), and a window wider than the context */
    const uint32_t windows[3] = {4, 16, 4096};
    for (int w = 0; w < 3; w++) {
        att_scale = 0.3f;
        att_cap = 5.0f;
        att_window = windows[w];
        check_attention(96, 4, 2, 40);
        check_attention(8, 8, 8, 12);
    }
    att_feats_reset();
}

Test(backend_cuda, split_decode_attention_with_a_window_and_soft_cap_matches_cpu, .timeout = 120)
{
    /* the split path over a window: 1000 positions of 4096 (7 ranges of 143 from pos - 999),
     * tokens whose window starts mid-cache and one (130) whose window holds all it has */
    const uint32_t mixed[4] = {4095, 130, 4000, 1};
    att_cap = 50.0f;
    att_window = 1000;
    check_split_attention(128, 8, 2, 4096, mixed, 4, KV_TYPE_F16);
    check_split_attention(64, 8, 8, 4096, mixed, 4, KV_TYPE_F32);
    att_feats_reset();
}

Test(backend_cuda, bad_operands_are_refused_before_reaching_the_device, .timeout = 60)
{
    backend_t *cu = open_cuda();
    float *buf = dput(cu, NULL, 4096 * sizeof(float));
    model_weight_t tab = {GGUF_T_F32, 16, 4, buf, 16 * 4 * sizeof(float)};
    int32_t bad_id = 4;
    cr_assert_eq(cu->embed(cu->ctx, &tab, &bad_id, 1, buf, 16), BE_ERR_ARG);
    be_tok_t tok = {buf, buf, 8, 8}; /* pos == n_ctx */
    be_att_t a = {.toks = &tok,
                  .layer = 0,
                  .n_layer = 1,
                  .n_head = 2,
                  .n_head_kv = 1,
                  .head_dim = 8,
                  .stride = 16};
    cr_assert_eq(cu->attention(cu->ctx, &a, buf, buf + 1024, 1), BE_ERR_ARG);
    cr_assert_eq(cu->kv_store(cu->ctx, &a, buf, buf, 1), BE_ERR_ARG);
    /* block types without cuda kernels are refused, not computed */
    model_weight_t iq2 = {GGUF_T_IQ2_XXS, 256, 4, buf, 4 * 66};
    be_mm_t job = {&iq2, buf + 2048, 16};
    cr_assert_eq(cu->matmul(cu->ctx, &job, 1, buf + 1024, 256, 1), BE_ERR_ARG);
    int32_t id0 = 0;
    cr_assert_eq(cu->embed(cu->ctx, &iq2, &id0, 1, buf + 2048, 256), BE_ERR_ARG);
    /* MoE: rows wider than their stride, no slots to sum */
    uint32_t row0 = 0;
    float w1 = 1.0f;
    cr_assert_eq(cu->moe_scatter(cu->ctx, buf, buf + 1024, &row0, &w1, 1, 17, 16), BE_ERR_ARG);
    cr_assert_eq(cu->moe_sum(cu->ctx, buf, buf + 1024, 1, 0, 16, 16), BE_ERR_ARG);
    cr_assert_eq(cu->sync(cu->ctx), 0, "device state damaged");
    cu->buf_free(cu->ctx, buf);
    be_close(cu);
}

/* ------------------------------------------------------------------ forward pass */

/* A model's weights paged into one mapped range of the device pool. */
typedef struct dev_model {
    void *base;
    size_t bytes;
    model_weights_t w;
} dev_model_t;

#define DEV_ALIGN 256

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* Lays out (copy = 0) or copies (copy = 1) one tensor at *off. */
static void place(backend_t *be, dev_model_t *dm, model_weight_t *dst, const model_weight_t *src,
                  size_t *off, be_event_t *ev, int copy)
{
    *dst = *src;
    if (!src->data)
        return;
    if (copy) {
        dst->data = (char *)dm->base + *off;
        cr_assert_eq(be->copy_h2d(be->ctx, (void *)dst->data, src->data, src->nbytes, ev), 0);
    }
    *off = align_up(*off + src->nbytes, DEV_ALIGN);
}

static void dev_model_walk(backend_t *be, dev_model_t *dm, const model_t *m, be_event_t *ev,
                           int copy, size_t *total)
{
    size_t off = 0;
    place(be, dm, &dm->w.tok_embd, &m->w.tok_embd, &off, ev, copy);
    place(be, dm, &dm->w.output_norm, &m->w.output_norm, &off, ev, copy);
    if (m->w.tied)
        dm->w.output = dm->w.tok_embd;
    else
        place(be, dm, &dm->w.output, &m->w.output, &off, ev, copy);
    dm->w.tied = m->w.tied;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer_t *s = &m->w.layers[l];
        model_layer_t *d = &dm->w.layers[l];
        /* every view of the layer: the dense ones, the q/k and post norms
         * (qwen3, gemma) and the router and experts (MoE) */
        const model_weight_t *sw[] = {&s->attn_norm,
                                      &s->wq,
                                      &s->wk,
                                      &s->wv,
                                      &s->bq,
                                      &s->bk,
                                      &s->bv,
                                      &s->wo,
                                      &s->ffn_norm,
                                      &s->w_gate,
                                      &s->w_up,
                                      &s->w_down,
                                      &s->q_norm,
                                      &s->k_norm,
                                      &s->post_attn_norm,
                                      &s->post_ffn_norm,
                                      &s->gate_inp,
                                      &s->gate_exps,
                                      &s->up_exps,
                                      &s->down_exps,
                                      &s->gate_inp_shexp,
                                      &s->gate_shexp,
                                      &s->up_shexp,
                                      &s->down_shexp};
        model_weight_t *dw[] = {&d->attn_norm,
                                &d->wq,
                                &d->wk,
                                &d->wv,
                                &d->bq,
                                &d->bk,
                                &d->bv,
                                &d->wo,
                                &d->ffn_norm,
                                &d->w_gate,
                                &d->w_up,
                                &d->w_down,
                                &d->q_norm,
                                &d->k_norm,
                                &d->post_attn_norm,
                                &d->post_ffn_norm,
                                &d->gate_inp,
                                &d->gate_exps,
                                &d->up_exps,
                                &d->down_exps,
                                &d->gate_inp_shexp,
                                &d->gate_shexp,
                                &d->up_shexp,
                                &d->down_shexp};
        _Static_assert(sizeof sw / sizeof sw[0] * sizeof(model_weight_t) == sizeof(model_layer_t),
                       "a layer view the device copy would miss");
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
            place(be, dm, dw[i], sw[i], &off, ev, copy);
    }
    *total = off;
}

/* Reserve a range, map it, copy every tensor, make compute wait. */
static dev_model_t *dev_model_load(backend_t *be, const model_t *m)
{
    dev_model_t *dm = calloc(1, sizeof *dm);
    dm->w.layers = calloc(m->hp.n_layer, sizeof *dm->w.layers);
    size_t total;
    dev_model_walk(be, dm, m, NULL, 0, &total);
    dm->bytes = align_up(total, be->page_size);
    cr_assert_eq(be->reserve(be->ctx, dm->bytes, &dm->base), 0);
    cr_assert_eq(be->map(be->ctx, dm->base, 0, dm->bytes), 0);
    be_event_t *ev;
    cr_assert_eq(be->event_new(be->ctx, &ev), 0);
    dev_model_walk(be, dm, m, ev, 1, &total);
    cr_assert_eq(be->wait(be->ctx, ev), 0);
    cr_assert_eq(be->sync(be->ctx), 0);
    be->event_free(be->ctx, ev);
    return dm;
}

static void dev_model_free(backend_t *be, dev_model_t *dm)
{
    cr_assert_eq(be->unmap(be->ctx, dm->base, 0, dm->bytes), 0);
    be->release(be->ctx, dm->base, dm->bytes);
    free(dm->w.layers);
    free(dm);
}

/* A KV cache in a mapped range of the pool (as the residency manager does). */
static kv_seq_t *dev_kv_new(backend_t *be, const model_hparams_t *hp, uint32_t n_ctx, kv_type_t kt,
                            void **base, size_t *bytes)
{
    kv_seq_t *kv = calloc(1, sizeof *kv);
    kv->n_layer = hp->n_layer;
    kv->n_ctx = n_ctx;
    kv->kv_dim = hp->n_head_kv * hp->head_dim;
    kv->type = kt;
    size_t half = align_up(kv_seq_bytes(hp, n_ctx, kt) / 2, DEV_ALIGN);
    *bytes = align_up(2 * half, be->page_size);
    cr_assert_eq(be->reserve(be->ctx, *bytes, base), 0);
    cr_assert_eq(be->map(be->ctx, *base, 0, *bytes), 0);
    kv->k = *base;
    kv->v = (char *)*base + half;
    kv->owner = be;
    return kv;
}

/* Prefill of 9 tokens (over the GEMM threshold) then 4 decode steps; the
 * logits of every step are compared with the cpu backend's. */
static void check_forward_with(const model_t *m, double tol, const char *what, int own_gemm,
                               kv_type_t kt)
{
    backend_t *cu = open_cuda_with(POOL_BYTES, own_gemm), *cp = open_cpu();
    dev_model_t *dm = dev_model_load(cu, m);
    void *kv_base;
    size_t kv_bytes;
    kv_seq_t *kc = dev_kv_new(cu, &m->hp, 64, kt, &kv_base, &kv_bytes);
    kv_seq_t *kp = kv_seq_new(&m->hp, 64, kt);
    fwd_t *fc = fwd_new(cu), *fp = fwd_new(cp);
    const uint32_t nv = m->hp.n_vocab;
    float *lc = malloc(nv * sizeof(float)), *lp = malloc(nv * sizeof(float));
    int32_t prompt[9] = {1, 5, 9, 13, 200, 17, 3, 80, 99};
    char err[256];
    for (int step = 0; step < 5; step++) {
        uint32_t n = step == 0 ? 9 : 1;
        const int32_t *t = step == 0 ? prompt : &prompt[step];
        fwd_seq_t sc = {kc, t, n, lc, NULL}, sp = {kp, t, n, lp, NULL};
        cr_assert_eq(fwd_run(fc, &m->hp, &dm->w, &sc, 1, NULL, err, sizeof err), 0, "cuda: %s",
                     err);
        cr_assert_eq(fwd_run(fp, &m->hp, &m->w, &sp, 1, NULL, err, sizeof err), 0, "cpu: %s", err);
        char s[128];
        snprintf(s, sizeof s, "%s step %d logits (%s, %s KV)", what, step,
                 uses_cublas(cu) ? "cuBLAS" : "own GEMM kernel", kv_type_name(kt));
        check_rows(s, lc, lp, 1, nv, nv, tol);
    }
    cr_assert_eq(kc->n_past, kp->n_past);
    free(lc);
    free(lp);
    fwd_free(fc);
    fwd_free(fp);
    kv_seq_free(kp);
    cr_assert_eq(cu->unmap(cu->ctx, kv_base, 0, kv_bytes), 0);
    cu->release(cu->ctx, kv_base, kv_bytes);
    free(kc);
    dev_model_free(cu, dm);
    be_close(cu);
    be_close(cp);
}

/* Both prefill GEMM paths: cuBLAS when present, then the own kernel; F32
 * KV caches, then F16 ones (cuda weights V by F32 softmax weights where cpu
 * rounds them to half: a tolerance of at least 1e-2 there). */
static void check_forward(const model_t *m, double tol, const char *what)
{
    check_forward_with(m, tol, what, 0, KV_TYPE_F32);
    check_forward_with(m, tol, what, 1, KV_TYPE_F32);
    check_forward_with(m, tol > 1e-2 ? tol : 1e-2, what, 0, KV_TYPE_F16);
}

Test(backend_cuda, forward_pass_matches_cpu_for_f32_llama, .timeout = 60)
{
    model_t *m = tu_tiny_model(GGUF_T_F32, 0);
    check_forward(m, 1e-3, "F32 llama");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_f16_llama, .timeout = 60)
{
    model_t *m = tu_tiny_model(GGUF_T_F16, 0);
    check_forward(m, 2e-2, "F16 llama");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_bf16_qwen2, .timeout = 60)
{
    model_t *m = tu_tiny_model(GGUF_T_BF16, 1);
    check_forward(m, 5e-2, "BF16 qwen2");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_q8_0_qwen2, .timeout = 60)
{
    model_t *m = tu_tiny_model(GGUF_T_Q8_0, 1);
    check_forward(m, 1e-3, "Q8_0 qwen2");
    model_close(m);
}

/* A generated model of ARCH_SHAPE plus args, for the architecture passes. */
static model_t *arch_model(const char *args)
{
    char path[256], all[512], err[512];
    snprintf(all, sizeof all, "--dim 64 --layers 4 --heads 4 --kv-heads 2 --ff 128 --vocab 300 %s",
             args);
    tu_mkmodel(path, sizeof path, all);
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(m, "%s: %s", args, err);
    return m;
}

/* 13 positions over windows of 4: the sliding layers drop positions from the fifth on */
Test(backend_cuda, forward_pass_matches_cpu_for_gemma2_with_soft_caps_and_a_window, .timeout = 120)
{
    model_t *m = arch_model("--arch gemma2 --type f32 --softcap 5,10 --window 4 --head-dim 32");
    check_forward(m, 1e-3, "F32 gemma2");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_gemma3_with_q_k_norms_and_two_rope_bases,
     .timeout = 120)
{
    model_t *m = arch_model("--arch gemma3 --type q8_0 --window 4 --layers 7 --rope-base 1000000 "
                            "--rope-scaling linear:8");
    check_forward(m, 1e-3, "Q8_0 gemma3");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_windowed_phi3_with_long_rope_factors,
     .timeout = 120)
{
    model_t *m = arch_model("--arch phi3 --type f16 --window 4 --rope-factors "
                            "--rope-attn-factor 1.19");
    model_set_context(m, 2048); /* the long factors */
    check_forward(m, 2e-2, "F16 phi3");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_cpu_for_llama_with_yarn, .timeout = 120)
{
    model_t *m = arch_model("--arch llama --type f32 --rope-scaling yarn:4 --rope-orig-ctx 8");
    check_forward(m, 1e-3, "F32 llama YaRN");
    model_close(m);
}

Test(backend_cuda, forward_pass_matches_the_cpu_exact_path_for_a_q4_k_m_llama, .timeout = 120)
{
    backend_t *probe = open_cuda(); /* skips without a GPU */
    be_close(probe);
    char path[256], err[512];
    tu_mkmodel(path, sizeof path,
               "--type q4_k_m --dim 256 --ff 512 --layers 4 --heads 4 --kv-heads 2 --vocab 320 "
               "--seed 7");
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(m, "%s", err);
    cr_assert_eq(m->w.layers[1].w_up.type, GGUF_T_Q4_K);
    cr_assert_eq(m->w.output.type, GGUF_T_Q6_K);
    quant_path_set(QUANT_PATH_EXACT);
    check_forward(m, 2e-2, "Q4_K_M llama");
    quant_path_set(QUANT_PATH_FAST);
    model_close(m);
}

/* Every llama.cpp-quantized file of tests/data/kquant (llama and qwen2, each
 * block type, the _K_M mixes) on cuda against llama.cpp's logits at every
 * prompt position, the bound: rms(cuda - llama.cpp) <= 6% of the
 * std of llama.cpp's logits. Positions 0..n-2 token by token (the GEMV),
 * the last as a prefill of the whole prompt (cuBLAS on F16 rows when
 * present). F32 activations, as the cpu's exact path: argmax is logged,
 * not asserted (llama.cpp rounds its activations to 8 bits). */
static double kquant_rms(const float *l, const json_t *row, uint32_t nv, int *agree)
{
    tu_ref_cmp_t c = tu_ref_cmp(l, row, nv);
    uint32_t mine = 0;
    for (uint32_t i = 0; i < nv; i++)
        if (l[i] > l[mine])
            mine = i;
    *agree = c.margin > 0.1 ? (mine == c.best ? 1 : 0) : -1;
    return c.rms / c.std;
}

Test(backend_cuda, kquant_files_match_llama_cpp_logits_at_every_position_on_cuda, .timeout = 180)
{
    static const char *const types[] = {"Q8_0",   "Q4_0",   "Q4_1", "Q5_0",   "Q5_1",  "Q2_K",
                                        "Q3_K_M", "Q4_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"};
    static const char *const archs[] = {"llama", "qwen2"};
    backend_t *cu = open_cuda();
    fwd_t *f = fwd_new(cu);
    int all_cmp = 0, all_agree = 0;
    for (int a = 0; a < 2; a++)
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            char rel[256], path[1024], err[512];
            snprintf(rel, sizeof rel, "kquant/ktest-%s-%s.gguf", archs[a], types[t]);
            tu_data_path(path, sizeof path, rel);
            model_t *m = model_open(path, err, sizeof err);
            cr_assert_not_null(m, "%s", err);
            snprintf(rel, sizeof rel, "kquant/ktest-%s-%s.ref.json", archs[a], types[t]);
            tu_data_path(path, sizeof path, rel);
            json_error_t je;
            json_t *ref = json_load_file(path, 0, &je);
            cr_assert_not_null(ref, "%s: %s", path, je.text);
            const json_t *pj = json_object_get(ref, "prompt"),
                         *logits = json_object_get(ref, "logits");
            int32_t prompt[64];
            const size_t np = json_array_size(pj);
            cr_assert(np >= 2 && np <= 64 && json_array_size(logits) == np, "%s", rel);
            for (size_t i = 0; i < np; i++)
                prompt[i] = (int32_t)json_integer_value(json_array_get(pj, i));
            const uint32_t nv = m->hp.n_vocab;
            dev_model_t *dm = dev_model_load(cu, m);
            void *kb[2];
            size_t kbytes[2];
            kv_seq_t *kv = dev_kv_new(cu, &m->hp, 64, KV_TYPE_F32, &kb[0], &kbytes[0]);
            kv_seq_t *kv2 = dev_kv_new(cu, &m->hp, 64, KV_TYPE_F32, &kb[1], &kbytes[1]);
            float *l = malloc(nv * sizeof(float));
            double worst = 0;
            int n_cmp = 0, n_agree = 0;
            for (size_t p = 0; p < np; p++) {
                fwd_seq_t s = p + 1 < np ? (fwd_seq_t){kv, &prompt[p], 1, l, NULL}
                                         : (fwd_seq_t){kv2, prompt, (uint32_t)np, l, NULL};
                cr_assert_eq(fwd_run(f, &m->hp, &dm->w, &s, 1, NULL, err, sizeof err), 0,
                             "%s-%s position %zu: %s", archs[a], types[t], p, err);
                int agree;
                double r = kquant_rms(l, json_array_get(logits, p), nv, &agree);
                cr_assert_leq(r, 0.06, "%s-%s position %zu%s: rms diff %.2f%% of std", archs[a],
                              types[t], p, p + 1 < np ? "" : " (prefill)", 100 * r);
                worst = fmax(worst, r);
                n_cmp += agree >= 0;
                n_agree += agree > 0;
            }
            cr_log_info("cuda %s-%s: worst rms diff %.2f%% of std, argmax %d/%d", archs[a],
                        types[t], 100 * worst, n_agree, n_cmp);
            all_cmp += n_cmp;
            all_agree += n_agree;
            free(l);
            for (int k = 0; k < 2; k++) {
                cr_assert_eq(cu->unmap(cu->ctx, kb[k], 0, kbytes[k]), 0);
                cu->release(cu->ctx, kb[k], kbytes[k]);
            }
            free(kv);
            free(kv2);
            dev_model_free(cu, dm);
            json_decref(ref);
            model_close(m);
        }
    cr_log_info("cuda: argmax agrees with llama.cpp at %d of %d positions with margin > 0.1",
                all_agree, all_cmp);
    fwd_free(f);
    be_close(cu);
}

Test(backend_cuda, stories260k_forward_pass_matches_cpu, .timeout = 60)
{
    backend_t *probe = open_cuda(); /* skips without a GPU */
    be_close(probe);
    char path[1024], err[512];
    tu_data_path(path, sizeof path, "stories260K.gguf");
    model_t *m = model_open(path, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    check_forward(m, 1e-3, "stories260K");
    model_close(m);
}

/* ------------------------------------------------------------------ page-in on the real path */

/* store -> VMM map -> copy -> forward: the logits of a swapped-in pass and of
 * passes streamed under a small quota equal a resident pass's bit for bit
 * (tu_pagein.c; test_residency.c runs the same check on sim). */
Test(backend_cuda, swapped_in_and_quota_streamed_passes_equal_a_resident_pass_bit_for_bit,
     .timeout = 120)
{
    backend_t *cu = open_cuda_sized(128u << 20);
    tu_pagein_equal(cu);
    be_close(cu);
}

Test(backend_cuda, swapped_in_and_streamed_passes_are_bit_identical_on_the_own_gemm_kernel,
     .timeout = 120)
{
    backend_t *cu = open_cuda_with(128u << 20, 1);
    tu_pagein_equal(cu);
    be_close(cu);
}

/* ------------------------------------------------------------------ mixture of experts */

/* An expert's outputs into their tokens' slots: rows 4, 0, 7 and 4 again (the cpu's last write
 * stands) of a 9-row buffer, each weighted; the rows not named keep their bytes. */
Test(backend_cuda, moe_scatter_matches_cpu_exactly_and_leaves_other_rows_alone, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t n_dst = 9, n = 300, stride = 320;
    const uint32_t rows[4] = {4, 0, 7, 4};
    const float w[4] = {0.625f, 0.3f, 1.0f / 3.0f, 0.9f};
    float *src = rand_vec(4 * stride, 2.0f), *dst0 = rand_vec(n_dst * stride, 1.0f);
    float *res[2];
    backend_t *bes[2] = {cu, cp};
    for (int k = 0; k < 2; k++) {
        backend_t *be = bes[k];
        float *ds = dput(be, src, 4 * stride * sizeof(float));
        float *dd = dput(be, dst0, n_dst * stride * sizeof(float));
        cr_assert_eq(be->moe_scatter(be->ctx, dd, ds, rows, w, 4, n, stride), 0, "%s", be->name);
        res[k] = dget(be, dd, n_dst * stride * sizeof(float));
        be->buf_free(be->ctx, ds);
        be->buf_free(be->ctx, dd);
    }
    check_rows("moe_scatter", res[0], res[1], n_dst, stride, stride, 0.0);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[0][4 * stride + i], w[3] * src[3 * stride + i], "row 4: the last write");
    for (size_t i = 0; i < n_dst * stride; i++) {
        size_t r = i / stride;
        if ((r != 0 && r != 4 && r != 7) || i % stride >= n)
            cr_assert_eq(res[0][i], dst0[i], "moe_scatter wrote element %zu outside its rows", i);
    }
    free(res[0]);
    free(res[1]);
    free(src);
    free(dst0);
    be_close(cu);
    be_close(cp);
}

/* Each token's slots summed in order, then added to its residual: 1 slot (top 1), 2 (top 2),
 * 5 (top 4 and a shared expert). */
Test(backend_cuda, moe_sum_matches_cpu_exactly_for_one_to_five_slots, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const size_t n_tok = 6, n = 300, stride = 320;
    const uint32_t slots[3] = {1, 2, 5};
    for (int si = 0; si < 3; si++) {
        const uint32_t ns = slots[si];
        float *x = rand_vec(n_tok * stride, 4.0f), *ys = rand_vec(n_tok * ns * stride, 3.0f);
        float *res[2];
        backend_t *bes[2] = {cu, cp};
        for (int k = 0; k < 2; k++) {
            backend_t *be = bes[k];
            float *dx = dput(be, x, n_tok * stride * sizeof(float));
            float *dy = dput(be, ys, n_tok * ns * stride * sizeof(float));
            cr_assert_eq(be->moe_sum(be->ctx, dx, dy, n_tok, ns, n, stride), 0, "%s", be->name);
            res[k] = dget(be, dx, n_tok * stride * sizeof(float));
            be->buf_free(be->ctx, dx);
            be->buf_free(be->ctx, dy);
        }
        char what[64];
        snprintf(what, sizeof what, "moe_sum of %u slots", ns);
        check_rows(what, res[0], res[1], n_tok, stride, stride, 0.0);
        free(res[0]);
        free(res[1]);
        free(x);
        free(ys);
    }
    be_close(cu);
    be_close(cp);
}

/* The engine's expert matrices: model_expert_view of a stacked (4 experts x 40 rows) weight at
 * experts 1 and 3 (offsets of whole rows, so as aligned as the stacked rows: the GEMV's 16-byte
 * loads where the row size allows them), for 3 tokens (the GEMV) and 12 (the GEMM: cuBLAS or the
 * own kernel), every weight type. */
static void check_expert_view(backend_t *cu, backend_t *cp, uint32_t type, uint32_t n_in,
                              size_t n_tok, double tol)
{
    const uint32_t n_exp = 4, n_rows = 40;
    const size_t xs = n_in + 8, ys = 48;
    size_t wb;
    void *wh = rand_weight(type, n_in, n_exp * n_rows, &wb);
    float *x = rand_vec(n_tok * xs, 1.0f);
    for (uint32_t e = 1; e < n_exp; e += 2) {
        float *res[2];
        backend_t *bes[2] = {cu, cp};
        for (int k = 0; k < 2; k++) {
            backend_t *be = bes[k];
            void *wd = dput(be, wh, wb);
            float *dx = dput(be, x, n_tok * xs * sizeof(float));
            float *dy = dput(be, NULL, n_tok * ys * sizeof(float));
            model_weight_t stacked = {type, n_in, n_exp * n_rows, wd, wb};
            model_weight_t v = model_expert_view(&stacked, n_exp, e);
            cr_assert_eq(v.n_out, n_rows);
            be_mm_t job = {&v, dy, ys};
            cr_assert_eq(be->matmul(be->ctx, &job, 1, dx, xs, n_tok), 0, "%s matmul", be->name);
            res[k] = dget(be, dy, n_tok * ys * sizeof(float));
            be->buf_free(be->ctx, dy);
            be->buf_free(be->ctx, dx);
            be->buf_free(be->ctx, wd);
        }
        char what[96];
        snprintf(what, sizeof what, "expert %u of 4, %s n_in %u, %zu tokens", e,
                 gguf_ttype_name(type), n_in, n_tok);
        check_rows(what, res[0], res[1], n_tok, n_rows, ys, tol);
        free(res[0]);
        free(res[1]);
    }
    free(wh);
    free(x);
}

Test(backend_cuda, matmul_on_an_expert_view_matches_cpu_for_every_weight_type, .timeout = 120)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const int blas = uses_cublas(cu);
    for (int ti = 0; ti < 4; ti++) {
        uint32_t t = all_types[ti];
        check_expert_view(cu, cp, t, 256, 3, 1e-4);
        check_expert_view(cu, cp, t, 256, 12,
                          blas && (t == GGUF_T_F16 || t == GGUF_T_BF16) ? 2e-2 : 1e-4);
    }
    for (size_t ti = 0; ti < N_BLOCK_TYPES; ti++) {
        check_expert_view(cu, cp, block_types[ti], 256, 3, 1e-4);
        check_expert_view(cu, cp, block_types[ti], 256, 12, blas ? 2e-2 : 1e-4);
    }
    be_close(cu);
    be_close(cp);
}

/* A generated mixture-of-experts model (mkmodel args); fails the test when it does not open. */
static model_t *moe_model(const char *args)
{
    char path[256], err[512];
    tu_mkmodel(path, sizeof path, args);
    model_t *m = model_open(path, err, sizeof err);
    unlink(path);
    cr_assert_not_null(m, "%s: %s", args, err);
    cr_assert(m->hp.n_expert > 0, "%s: not a mixture of experts", args);
    return m;
}

#define MOE_SEQS 3

/* 1 when a step's expert flags (fwd_experts_used) differ; the first (layer, expert) that does
 * into *at. */
static int moe_routes_differ(const model_t *m, const fwd_t *fc, const fwd_t *fp, size_t *at)
{
    const uint8_t *uc = fwd_experts_used(fc), *up = fwd_experts_used(fp);
    for (size_t i = 0; i < (size_t)m->hp.n_layer * m->hp.n_expert; i++)
        if (uc[i] != up[i]) {
            *at = i;
            return 1;
        }
    return 0;
}

/* Three sequences prefilled together (plen tokens each: 4, 3, 1 stays on the GEMV; 12, 5, 1
 * takes the GEMM for the dense matrices) then three batched decode steps of all three, F32 KV
 * caches: every step's logits against the cpu backend's (its exact path), the experts each step
 * selected and the expert reads equal. */
static void check_moe_forward(const model_t *m, const uint32_t plen[MOE_SEQS], int own_gemm,
                              double tol, const char *what)
{
    backend_t *cu = open_cuda_with(POOL_BYTES, own_gemm), *cp = open_cpu();
    dev_model_t *dm = dev_model_load(cu, m);
    void *kv_base[MOE_SEQS];
    size_t kv_bytes[MOE_SEQS];
    kv_seq_t *kc[MOE_SEQS], *kp[MOE_SEQS];
    const uint32_t nv = m->hp.n_vocab;
    float *lc = malloc(MOE_SEQS * nv * sizeof(float)), *lp = malloc(MOE_SEQS * nv * sizeof(float));
    int32_t toks[MOE_SEQS][16];
    for (int s = 0; s < MOE_SEQS; s++) {
        kc[s] = dev_kv_new(cu, &m->hp, 32, KV_TYPE_F32, &kv_base[s], &kv_bytes[s]);
        kp[s] = kv_seq_new(&m->hp, 32, KV_TYPE_F32);
        for (int i = 0; i < 16; i++)
            toks[s][i] = (int32_t)(1 + (uint32_t)(s * 16 + i) * 7919u % (nv - 1));
    }
    fwd_t *fc = fwd_new(cu), *fp = fwd_new(cp);
    char err[256];
    for (int step = 0; step < 4; step++) {
        fwd_seq_t sc[MOE_SEQS], sp[MOE_SEQS];
        for (int s = 0; s < MOE_SEQS; s++) {
            const int32_t *t = step == 0 ? toks[s] : &toks[s][plen[s] + (uint32_t)step - 1];
            uint32_t n = step == 0 ? plen[s] : 1;
            sc[s] = (fwd_seq_t){.kv = kc[s], .tokens = t, .n_tokens = n, .logits = lc + s * nv};
            sp[s] = (fwd_seq_t){.kv = kp[s], .tokens = t, .n_tokens = n, .logits = lp + s * nv};
        }
        uint64_t rc0 = fwd_expert_reads(fc), rp0 = fwd_expert_reads(fp);
        cr_assert_eq(fwd_run(fc, &m->hp, &dm->w, sc, MOE_SEQS, NULL, err, sizeof err), 0,
                     "cuda: %s", err);
        cr_assert_eq(fwd_run(fp, &m->hp, &m->w, sp, MOE_SEQS, NULL, err, sizeof err), 0, "cpu: %s",
                     err);
        size_t at = 0;
        cr_assert(!moe_routes_differ(m, fc, fp, &at),
                  "%s step %d: cuda and cpu route differently at layer %zu expert %zu", what, step,
                  at / m->hp.n_expert, at % m->hp.n_expert);
        cr_assert_eq(fwd_expert_reads(fc) - rc0, fwd_expert_reads(fp) - rp0,
                     "%s step %d: expert reads", what, step);
        for (int s = 0; s < MOE_SEQS; s++) {
            char w[160];
            snprintf(w, sizeof w, "%s step %d sequence %d logits (%s)", what, step, s,
                     uses_cublas(cu) ? "cuBLAS" : "own GEMM kernel");
            check_rows(w, lc + s * nv, lp + s * nv, 1, nv, nv, tol);
        }
    }
    for (int s = 0; s < MOE_SEQS; s++) {
        cr_assert_eq(kc[s]->n_past, kp[s]->n_past);
        kv_seq_free(kp[s]);
        cr_assert_eq(cu->unmap(cu->ctx, kv_base[s], 0, kv_bytes[s]), 0);
        cu->release(cu->ctx, kv_base[s], kv_bytes[s]);
        free(kc[s]);
    }
    free(lc);
    free(lp);
    fwd_free(fc);
    fwd_free(fp);
    dev_model_free(cu, dm);
    be_close(cu);
    be_close(cp);
}

static const uint32_t moe_gemv_plen[MOE_SEQS] = {4, 3, 1}; /* 8 tokens: every matrix on the GEMV */
static const uint32_t moe_gemm_plen[MOE_SEQS] = {12, 5, 1};

#define MOE_CUDA_SHAPE "--dim 64 --layers 2 --heads 4 --kv-heads 2 --vocab 320 --experts 8"

/* gpu-check's MoE decode check (stage unit): a small Mixtral-style file, batched decode of three
 * sequences on cuda against cpu, both GEMM paths for the prefill. */
Test(backend_cuda, moe_decode_of_a_mixtral_style_f32_file_matches_cpu, .timeout = 120)
{
    backend_t *probe = open_cuda(); /* skips without a GPU, before mkmodel */
    be_close(probe);
    model_t *m = moe_model(MOE_CUDA_SHAPE " --arch llama --type f32 --ff 128 --experts-used 2 "
                                          "--seed 61");
    check_moe_forward(m, moe_gemv_plen, 0, 1e-3, "F32 mixtral");
    check_moe_forward(m, moe_gemm_plen, 0, 1e-3, "F32 mixtral");
    check_moe_forward(m, moe_gemm_plen, 1, 1e-3, "F32 mixtral");
    model_close(m);
}

Test(backend_cuda, moe_decode_of_a_q8_0_qwen2moe_with_its_shared_expert_matches_cpu, .timeout = 120)
{
    backend_t *probe = open_cuda();
    be_close(probe);
    model_t *m = moe_model(MOE_CUDA_SHAPE " --arch qwen2moe --type q8_0 --ff 256 --experts-used 2 "
                                          "--expert-ff 64 --shared-ff 96 --seed 62");
    check_moe_forward(m, moe_gemv_plen, 0, 1e-3, "Q8_0 qwen2moe");
    model_close(m);
}

Test(backend_cuda, moe_decode_of_an_f16_qwen3moe_top_4_matches_cpu, .timeout = 120)
{
    backend_t *probe = open_cuda();
    be_close(probe);
    model_t *m = moe_model(MOE_CUDA_SHAPE " --arch qwen3moe --type f16 --ff 256 --experts-used 4 "
                                          "--expert-ff 64 --seed 64");
    check_moe_forward(m, moe_gemv_plen, 0, 1e-3, "F16 qwen3moe top 4");
    model_close(m);
}

Test(backend_cuda, moe_decode_of_a_q4_k_m_mixtral_matches_the_cpu_exact_path, .timeout = 120)
{
    backend_t *probe = open_cuda();
    be_close(probe);
    model_t *m = moe_model("--dim 256 --layers 2 --heads 4 --kv-heads 2 --vocab 320 --experts 4 "
                           "--arch llama --type q4_k_m --ff 256 --experts-used 2 --seed 65");
    check_moe_forward(m, moe_gemv_plen, 0, 1e-3, "Q4_K_M mixtral");
    quant_path_set(QUANT_PATH_FAST);
    model_close(m);
}

/* ------------------------------------------------------------------ LoRA adapters */

/* One adapter of a lora_mm check: A (rank, n_in) and B (n_out, rank), host bytes. */
typedef struct lora_ad {
    uint32_t type_a, type_b, rank;
    float scale;
} lora_ad_t;

/* lora_mm of n_seg segments (segment s: seg_n[s] rows of adapter seg_ad[s], one untouched row
 * before each) on cuda and cpu: the products added to y agree within tol, the rows and columns
 * outside the segments keep their bytes. */
static void check_lora(backend_t *cu, backend_t *cp, const lora_ad_t *ads, int n_ad,
                       const int *seg_ad, const size_t *seg_n, int n_seg, uint32_t n_in,
                       uint32_t n_out, double tol)
{
    const size_t xs = n_in + 8, ys = n_out + 24;
    size_t n_rows = 1;
    for (int s = 0; s < n_seg; s++)
        n_rows += seg_n[s] + 1;
    float *x = rand_vec(n_rows * xs, 1.0f), *y0 = rand_vec(n_rows * ys, 0.25f);
    void **ha = calloc((size_t)n_ad * 2, sizeof *ha);
    size_t *hb = calloc((size_t)n_ad * 2, sizeof *hb);
    model_weight_t *w = calloc((size_t)n_ad * 2, sizeof *w);
    be_lora_t *jobs = calloc((size_t)n_seg, sizeof *jobs);
    uint8_t *inside = calloc(n_rows, 1);
    cr_assert(ha && hb && w && jobs && inside);
    for (int a = 0; a < n_ad; a++) {
        ha[2 * a] = rand_weight(ads[a].type_a, n_in, ads[a].rank, &hb[2 * a]);
        ha[2 * a + 1] = rand_weight(ads[a].type_b, ads[a].rank, n_out, &hb[2 * a + 1]);
    }
    float *res[2];
    backend_t *bes[2] = {cu, cp};
    for (int k = 0; k < 2; k++) {
        backend_t *be = bes[k];
        for (int a = 0; a < n_ad; a++) {
            w[2 * a] = (model_weight_t){ads[a].type_a, n_in, ads[a].rank,
                                        dput(be, ha[2 * a], hb[2 * a]), hb[2 * a]};
            w[2 * a + 1] = (model_weight_t){ads[a].type_b, ads[a].rank, n_out,
                                            dput(be, ha[2 * a + 1], hb[2 * a + 1]), hb[2 * a + 1]};
        }
        size_t r = 1;
        for (int s = 0; s < n_seg; s++) {
            const int a = seg_ad[s];
            jobs[s] = (be_lora_t){&w[2 * a], &w[2 * a + 1], ads[a].scale, r, seg_n[s]};
            for (size_t i = 0; i < seg_n[s]; i++)
                inside[r + i] = 1;
            r += seg_n[s] + 1;
        }
        float *dx = dput(be, x, n_rows * xs * sizeof(float));
        float *dy = dput(be, y0, n_rows * ys * sizeof(float));
        cr_assert_eq(be->lora_mm(be->ctx, jobs, n_seg, dx, xs, dy, ys), 0, "%s lora_mm", be->name);
        res[k] = dget(be, dy, n_rows * ys * sizeof(float));
        be->buf_free(be->ctx, dx);
        be->buf_free(be->ctx, dy);
        for (int i = 0; i < 2 * n_ad; i++)
            be->buf_free(be->ctx, (void *)w[i].data);
    }
    char what[128];
    snprintf(what, sizeof what, "lora_mm of %d segments over %d adapters (A %s, B %s), n_in %u",
             n_seg, n_ad, gguf_ttype_name(ads[0].type_a), gguf_ttype_name(ads[0].type_b), n_in);
    check_rows(what, res[0], res[1], n_rows, n_out, ys, tol);
    size_t changed = 0;
    for (size_t r = 0; r < n_rows; r++)
        for (size_t i = 0; i < ys; i++) {
            if (!inside[r] || i >= n_out)
                cr_assert_eq(res[0][r * ys + i], y0[r * ys + i],
                             "%s: row %zu elem %zu outside the segments written", what, r, i);
            else
                changed += res[1][r * ys + i] != y0[r * ys + i];
        }
    cr_assert_gt(changed, 0, "%s: no product was added", what);
    for (int i = 0; i < 2 * n_ad; i++)
        free(ha[i]);
    free(res[0]);
    free(res[1]);
    free(x);
    free(y0);
    free(ha);
    free(hb);
    free(w);
    free(jobs);
    free(inside);
}

/* A step's segments: adapter 0 (3 rows), 1 (1 row), 2 (5 rows), 0 again (2 rows), 1 with no
 * rows, 2 (1 row); ranks 8, 16 and 4 (32, 64 and 32 where B's rows are Q8_0 blocks), for every
 * weight type, and A and B of different types in one adapter. */
Test(backend_cuda, lora_mm_matches_cpu_for_every_adapter_type_over_mixed_segments, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const int seg_ad[6] = {0, 1, 2, 0, 1, 2};
    const size_t seg_n[6] = {3, 1, 5, 2, 0, 1};
    for (int ti = 0; ti < 4; ti++) {
        const uint32_t t = all_types[ti];
        const int q = t == GGUF_T_Q8_0;
        const lora_ad_t ads[3] = {
            {t, t, q ? 32 : 8, 2.0f}, {t, t, q ? 64 : 16, 0.5f}, {t, t, q ? 32 : 4, 1.0f / 3.0f}};
        check_lora(cu, cp, ads, 3, seg_ad, seg_n, 6, 256, 96, 1e-4);
        check_lora(cu, cp, ads, 3, seg_ad, seg_n, 6, 96, 300, 1e-4);
    }
    const lora_ad_t mixed[3] = {{GGUF_T_F16, GGUF_T_F32, 8, 1.5f},
                                {GGUF_T_BF16, GGUF_T_F16, 16, 0.75f},
                                {GGUF_T_Q8_0, GGUF_T_Q8_0, 32, 1.0f}};
    check_lora(cu, cp, mixed, 3, seg_ad, seg_n, 6, 256, 96, 1e-4);
    be_close(cu);
    be_close(cp);
}

/* Block-type adapters (Q4_0, Q6_K, IQ4_NL A; Q4_0 B of rank 32) against the cpu's exact path. */
Test(backend_cuda, lora_mm_of_block_type_adapters_matches_the_cpu_exact_path, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    const int seg_ad[4] = {0, 1, 2, 0};
    const size_t seg_n[4] = {2, 3, 1, 4};
    const lora_ad_t ads[3] = {{GGUF_T_Q4_0, GGUF_T_Q4_0, 32, 1.0f},
                              {GGUF_T_Q6_K, GGUF_T_F16, 16, 0.5f},
                              {GGUF_T_IQ4_NL, GGUF_T_F32, 8, 2.0f}};
    check_lora(cu, cp, ads, 3, seg_ad, seg_n, 4, 512, 200, 1e-4);
    be_close(cu);
    be_close(cp);
}

/* More segments than one launch carries (100 of 1 to 3 rows over 5 F16 adapters, one of rank
 * 256), a prefill-sized segment (40 rows), and operands lora_mm refuses. */
Test(backend_cuda, lora_mm_over_many_segments_and_a_long_one_matches_cpu, .timeout = 60)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    int seg_ad[101];
    size_t seg_n[101];
    for (int s = 0; s < 100; s++) {
        seg_ad[s] = s % 5;
        seg_n[s] = 1 + (size_t)(s % 3);
    }
    seg_ad[100] = 2;
    seg_n[100] = 40;
    const lora_ad_t ads[5] = {{GGUF_T_F16, GGUF_T_F16, 8, 1.0f},
                              {GGUF_T_F16, GGUF_T_F16, 16, 0.5f},
                              {GGUF_T_F16, GGUF_T_F16, 256, 0.25f},
                              {GGUF_T_F16, GGUF_T_F16, 4, 2.0f},
                              {GGUF_T_F16, GGUF_T_F16, 8, 1.0f}};
    check_lora(cu, cp, ads, 5, seg_ad, seg_n, 101, 256, 128, 1e-4);

    /* B's rank differs from A's: refused before a launch */
    model_weight_t a = {GGUF_T_F32, 64, 8, NULL, 0}, b = {GGUF_T_F32, 4, 32, NULL, 0};
    float *dx = dput(cu, NULL, 64 * sizeof(float)), *dy = dput(cu, NULL, 32 * sizeof(float));
    a.data = dx;
    b.data = dy;
    be_lora_t job = {&a, &b, 1.0f, 0, 1};
    cr_assert_eq(cu->lora_mm(cu->ctx, &job, 1, dx, 64, dy, 32), BE_ERR_ARG);
    cu->buf_free(cu->ctx, dx);
    cu->buf_free(cu->ctx, dy);
    be_close(cu);
    be_close(cp);
}

/* mklora's adapter for the base file at base_path (args: its options), opened at scale. */
static lora_t *lora_made(const model_t *m, const char *base_path, const char *args, float scale)
{
    char path[256], cmd[1024], err[512] = "";
    close(tu_tmpfile(path, sizeof path, "gpuswapd-lora"));
    snprintf(cmd, sizeof cmd, "%s/mklora --base %s --out %s %s", tu_build_dir(), base_path, path,
             args);
    cr_assert_eq(system(cmd), 0, "mklora failed: %s", cmd);
    int code = 0;
    lora_t *a = lora_open(path, m, scale, &code, err, sizeof err);
    unlink(path);
    cr_assert_not_null(a, "%s", err);
    return a;
}

/* a's pairs copied into one device buffer (*buf, each A and B DEV_ALIGN-aligned, as the daemon
 * packs an adapter) and rebased onto it; the caller frees the pairs and the buffer. */
static lora_weights_t dev_lora(backend_t *be, const lora_t *a, void **buf)
{
    const size_t n = (size_t)a->w.n_layer * LORA_N_TARGETS;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (a->w.pairs[i].a.data)
            total += align_up(a->w.pairs[i].a.nbytes, DEV_ALIGN) +
                     align_up(a->w.pairs[i].b.nbytes, DEV_ALIGN);
    uint8_t *host = calloc(total ? total : 1, 1);
    lora_weights_t w = a->w;
    w.pairs = calloc(n, sizeof *w.pairs);
    cr_assert(host && w.pairs);
    *buf = dput(be, NULL, total ? total : 1);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        w.pairs[i] = a->w.pairs[i];
        if (!a->w.pairs[i].a.data)
            continue;
        model_weight_t *v[2] = {&w.pairs[i].a, &w.pairs[i].b};
        for (int k = 0; k < 2; k++) {
            memcpy(host + off, v[k]->data, v[k]->nbytes);
            v[k]->data = (uint8_t *)*buf + off;
            off += align_up(v[k]->nbytes, DEV_ALIGN);
        }
    }
    cr_assert_eq(be->upload(be->ctx, *buf, host, total ? total : 1), 0);
    free(host);
    return w;
}

/* One step of three sequences (an F16 adapter of rank 8 on q, k, v, o; the base alone; a Q8_0
 * adapter of rank 32 on q, v, gate, up, down), a prefill of 9 tokens each then 3 decode steps:
 * every sequence's logits on cuda (lora_mm) match the cpu's. */
Test(backend_cuda, a_step_of_two_adapters_and_the_base_matches_cpu, .timeout = 120)
{
    backend_t *cu = open_cuda(), *cp = open_cpu();
    char bpath[256], err[256];
    tu_mkmodel(bpath, sizeof bpath,
               "--type f32 --dim 64 --layers 3 --heads 4 --kv-heads 2 --ff 128 --vocab 300 "
               "--seed 1");
    model_t *m = model_open(bpath, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    lora_t *ad[2] = {
        lora_made(m, bpath, "--rank 8 --targets q,k,v,o --type f16 --seed 2 --gain 4", 1.0f),
        lora_made(m, bpath, "--rank 32 --targets q,v,gate,up,down --type q8_0 --seed 3 --gain 4",
                  0.5f)};
    void *abuf[2];
    lora_weights_t dw[2] = {dev_lora(cu, ad[0], &abuf[0]), dev_lora(cu, ad[1], &abuf[1])};
    dev_model_t *dm = dev_model_load(cu, m);
    const uint32_t nv = m->hp.n_vocab;
    void *kvb[3];
    size_t kvn[3];
    kv_seq_t *kc[3], *kp[3];
    float *lc = malloc(3 * nv * sizeof(float)), *lp = malloc(3 * nv * sizeof(float));
    for (int q = 0; q < 3; q++) {
        kc[q] = dev_kv_new(cu, &m->hp, 64, KV_TYPE_F32, &kvb[q], &kvn[q]);
        kp[q] = kv_seq_new(&m->hp, 64, KV_TYPE_F32);
    }
    fwd_t *fc = fwd_new(cu), *fp = fwd_new(cp);
    const int32_t prompt[3][12] = {{1, 5, 9, 13, 200, 17, 3, 80, 99, 4, 7, 11},
                                   {2, 6, 10, 14, 201, 18, 4, 81, 98, 5, 8, 12},
                                   {1, 5, 9, 13, 200, 17, 3, 80, 99, 6, 9, 13}};
    const lora_weights_t *lw_cu[3] = {&dw[0], NULL, &dw[1]};
    const lora_weights_t *lw_cp[3] = {&ad[0]->w, NULL, &ad[1]->w};
    for (int step = 0; step < 4; step++) {
        const uint32_t n = step == 0 ? 9 : 1;
        fwd_seq_t sc[3], sp[3];
        for (int q = 0; q < 3; q++) {
            const int32_t *t = step == 0 ? prompt[q] : &prompt[q][8 + step];
            sc[q] = (fwd_seq_t){kc[q], t, n, lc + q * nv, lw_cu[q]};
            sp[q] = (fwd_seq_t){kp[q], t, n, lp + q * nv, lw_cp[q]};
        }
        cr_assert_eq(fwd_run(fc, &m->hp, &dm->w, sc, 3, NULL, err, sizeof err), 0, "cuda: %s", err);
        cr_assert_eq(fwd_run(fp, &m->hp, &m->w, sp, 3, NULL, err, sizeof err), 0, "cpu: %s", err);
        for (int q = 0; q < 3; q++) {
            char what[96];
            snprintf(what, sizeof what, "step %d, sequence %d (%s) logits", step, q,
                     q == 1   ? "the base"
                     : q == 0 ? "F16 adapter"
                              : "Q8_0 adapter");
            check_rows(what, lc + q * nv, lp + q * nv, 1, nv, nv, 1e-3);
        }
        if (step == 0) { /* sequences 0 and 2 share their prompt: only their adapters differ */
            double d = 0;
            for (uint32_t i = 0; i < nv; i++)
                d = fmax(d, fabs((double)lc[i] - lc[2 * nv + i]));
            cr_assert_gt(d, 1e-2, "the two adapters gave the same logits: no product ran");
        }
    }
    for (int q = 0; q < 3; q++) {
        kv_seq_free(kp[q]);
        cr_assert_eq(cu->unmap(cu->ctx, kvb[q], 0, kvn[q]), 0);
        cu->release(cu->ctx, kvb[q], kvn[q]);
        free(kc[q]);
    }
    fwd_free(fc);
    fwd_free(fp);
    free(lc);
    free(lp);
    for (int k = 0; k < 2; k++) {
        cu->buf_free(cu->ctx, abuf[k]);
        free(dw[k].pairs);
        lora_close(ad[k]);
    }
    dev_model_free(cu, dm);
    model_close(m);
    unlink(bpath);
    be_close(cu);
    be_close(cp);
}

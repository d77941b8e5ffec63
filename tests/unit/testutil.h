/* testutil: shared helpers for the unit tests (paths, generated models). */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A float uniform in [-1, 1) from the xorshift64 state *s (never 0), reproducible run to run. */
static inline float tu_frand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static inline const char *tu_build_dir(void)
{
    const char *e = getenv("GPUSWAPD_BUILD");
    return e && *e ? e : "build";
}

/* The vendored reference data (tests/data, see its README), or $GPUSWAPD_DATA. */
static inline const char *tu_data_dir(void)
{
    const char *e = getenv("GPUSWAPD_DATA");
    return e && *e ? e : "tests/data";
}

/* Writes <data dir>/<rel> into path (cap bytes) and checks that it is readable:
 * when it is not, the test fails under CI=true (a clone carries every file) and
 * is skipped, naming the file, elsewhere. */
static inline void tu_data_path(char *path, size_t cap, const char *rel)
{
    int n = snprintf(path, cap, "%s/%s", tu_data_dir(), rel);
    cr_assert(n > 0 && (size_t)n < cap, "data path too long");
    if (access(path, R_OK) == 0)
        return;
    const char *ci = getenv("CI");
    if (ci && *ci && strcmp(ci, "false") != 0)
        cr_assert_fail("reference data missing: %s (tests/data/README.md lists every file)", path);
    cr_skip_test("reference data missing: %s", path);
}

/* Creates an empty temp file under $TMPDIR (else /tmp) named <prefix>-XXXXXX;
 * its path goes into path (cap bytes). Returns the open fd; the caller closes
 * and unlinks it. Fails the test when it cannot. */
static inline int tu_tmpfile(char *path, size_t cap, const char *prefix)
{
    const char *dir = getenv("TMPDIR");
    int n = snprintf(path, cap, "%s/%s-XXXXXX", dir && *dir ? dir : "/tmp", prefix);
    cr_assert(n > 0 && (size_t)n < cap, "temp path too long");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp(%s)", path);
    return fd;
}

/* Writes a generated model to a fresh temp path (into path, cap bytes) by
 * running mkmodel with args. Fails the test when mkmodel fails. */
static inline void tu_mkmodel(char *path, size_t cap, const char *args)
{
    close(tu_tmpfile(path, cap, "gpuswapd-test"));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/mkmodel --out %s %s >/dev/null", tu_build_dir(), path, args);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
}
#include "engine/constrain.h"
/* The real 32,000-token SPM vocabulary of tests/data (tu_vocab_tok) and its trie for constrained
 * decoding (tu_vocab_trie), a test's fixture: .init = tu_vocab_setup (fails the test on error),
 * .fini = tu_vocab_teardown. (tu_vocab.c) */
extern tok_t *tu_vocab_tok;
extern cons_vocab_t *tu_vocab_trie;
void tu_vocab_setup(void);
void tu_vocab_teardown(void);

#include "engine/model.h"
/* A small random model (dim 64, 2 layers, GQA 4/2, vocab 300) of the given
 * weight type, llama or (qwen = 1) qwen2 with biases; fails the test on error.
 * Free with model_close. (tu_model.c) */
model_t *tu_tiny_model(uint32_t type, int qwen);

#include "backend/backend.h"
/* Pages a generated F16 model (6 layers) through the store and the residency
 * manager on be and asserts that a pass right after evicting everything and
 * passes streamed under a gpu_quota of the minimum to run equal a resident
 * pass's logits bit for bit (12-token prefill, over the GEMM threshold, then
 * 3 decode steps). be needs a pool of >= 16 of its pages. (tu_pagein.c) */
void tu_pagein_equal(backend_t *be);
/* The same model with embedding width d and FFN width ff written to a fresh
 * temp file (path, cap bytes; the caller unlinks it); the tensor odd_name
 * (unless NULL) gets type odd_type and arbitrary bytes of its size. */
void tu_tiny_model_file(char *path, size_t cap, uint32_t type, int qwen, uint32_t d, uint32_t ff,
                        const char *odd_name, uint32_t odd_type);

#include "worker/residency.h"
#include "worker/store.h"
/* A generated model (mkmodel args) loaded into a store and added to a residency manager on a
 * sim backend of pool_pages pages of page bytes, with gpu_quota (0: none); fails the test on
 * error. (tu_res.c) */
typedef struct tu_res {
    char path[256];
    backend_t *be;
    store_t *st;
    store_model_t *sm;
    res_t *res;
    res_model_t *rm;
} tu_res_t;
void tu_res_open(tu_res_t *f, const char *args, const char *name, size_t pool_pages, size_t page,
                 size_t gpu_quota);
void tu_res_close(tu_res_t *f); /* removes the model (and the units left), frees the rest */
size_t tu_res_pool_free(const res_t *r); /* the pool's free bytes */

#include <jansson.h>
/* Logits l[nv] against a reference row (a JSON array, llama.cpp's): the rms
 * of the difference, the reference's std, its argmax and its top-1 margin.
 * (tu_logits.c) */
typedef struct tu_ref_cmp {
    double rms, std, margin;
    uint32_t best;
} tu_ref_cmp_t;
tu_ref_cmp_t tu_ref_cmp(const float *l, const json_t *row, uint32_t nv);
#endif

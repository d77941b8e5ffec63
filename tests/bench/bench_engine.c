/* bench_engine: prefill and decode tokens/s of the CPU engine for one model at given thread counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "kernels/pool.h"
#include "kernels/quant.h"
#include "base/hugemem.h"
#include "base/util.h"
#include "engine/gguf.h"

/* usage: bench_engine MODEL PROMPT_TOKENS DECODE_TOKENS REPS THREADS... ; prints CSV rows
 * model,type,threads,isa,prefill_tok_s,decode_tok_s (best of REPS; the prompt's prefill, then
 * DECODE_TOKENS single-token steps from an empty cache, as llama-bench's pp and tg tests). BENCH_EXACT=1 runs the
 * exact path (F32 activations) for quantized weights; BENCH_ISA picks the kernels; BENCH_DEPTH=D
 * first fills D positions of the cache (untimed), and both tests then start at position D, as
 * llama-bench's -d. The weights are read into host memory on huge pages, as the daemon's store
 * holds them (base/hugemem); BENCH_MMAP=1 runs them from the file's mapping instead. */
/* The whole file in hugemem, its size in *bytes; NULL on error. */
static void *read_image(const char *path, size_t *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    void *p = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (p = hugemem_alloc((size_t)n)) != NULL) {
            if (fread(p, 1, (size_t)n, f) != (size_t)n) {
                hugemem_free(p, (size_t)n);
                p = NULL;
            } else {
                *bytes = (size_t)n;
            }
        }
    }
    fclose(f);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL PROMPT_TOKENS DECODE_TOKENS REPS THREADS...\n", argv[0]);
        return 2;
    }
    char err[512];
    const char *isa = getenv("BENCH_ISA"); /* portable, avx2, vnni or avx512 (default: the best) */
    if (isa && *isa)
        quant_isa_set(!strcmp(isa, "portable") ? QUANT_ISA_PORTABLE
                      : !strcmp(isa, "avx2")   ? QUANT_ISA_AVX2
                      : !strcmp(isa, "vnni")   ? QUANT_ISA_AVX2_VNNI
                                               : QUANT_ISA_AVX512);
    const char *exact = getenv("BENCH_EXACT");
    if (exact && *exact && strcmp(exact, "0") != 0)
        quant_path_set(QUANT_PATH_EXACT);
    /* the weights in host memory as the daemon's store holds them (huge pages), not in the
     * file's page cache */
    size_t img_bytes = 0;
    const char *mm = getenv("BENCH_MMAP"); /* 1: run the weights from the file's mapping */
    int mapped = mm && *mm && strcmp(mm, "0") != 0;
    void *img = mapped ? NULL : read_image(argv[1], &img_bytes);
    gguf_t *g = mapped ? gguf_open(argv[1], err, sizeof err)
                : img  ? gguf_open_mem(img, img_bytes, argv[1], err, sizeof err)
                       : NULL;
    model_t *m = g ? model_from_gguf(g, err, sizeof err) : NULL;
    if (!m) {
        if (mapped || img)
            fprintf(stderr, "%s\n", err);
        else
            fprintf(stderr, "%s: cannot read it into memory\n", argv[1]);
        return 1;
    }
    int np = atoi(argv[2]), nd = atoi(argv[3]), reps = atoi(argv[4]);
    const char *dep = getenv("BENCH_DEPTH");
    int depth = dep && *dep ? atoi(dep) : 0;
    if (np < 1 || nd < 1 || reps < 1 || depth < 0 ||
        (uint32_t)(depth + np + nd) > m->hp.n_ctx_train) {
        fprintf(stderr, "bad token counts\n");
        return 2;
    }
    int32_t *prompt = malloc((size_t)(np > depth ? np : depth) * sizeof *prompt);
    for (int i = 0; i < (np > depth ? np : depth); i++)
        prompt[i] = (int32_t)(1 + (i * 7919) % (m->hp.n_vocab - 1));
    float *logits = malloc(m->hp.n_vocab * sizeof(float));
    const char *name = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];
    for (int a = 5; a < argc; a++) {
        int nth = atoi(argv[a]);
        be_params_t bp = {.kind = BE_KIND_CPU, .threads = nth};
        backend_t *be = be_open(&bp, err, sizeof err);
        if (!be) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        fwd_t *f = fwd_new(be);
        kv_seq_t *kv = kv_seq_new(&m->hp, (uint32_t)(depth + np + nd), KV_TYPE_F16);
        double best_p = 1e30, best_d = 1e30;
        kv_seq_reset(kv);
        for (int d0 = 0; d0 < depth; d0 += 512) { /* in chunks, as the daemon prefills */
            fwd_seq_t ds = {kv, prompt + d0, (uint32_t)(depth - d0 < 512 ? depth - d0 : 512),
                            logits, NULL};
            if (fwd_run(f, &m->hp, &m->w, &ds, 1, NULL, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
        }
        for (int r = 0; r < reps; r++) {
            kv->n_past = (uint32_t)depth; /* the first depth positions stay filled */
            fwd_seq_t s = {kv, prompt, (uint32_t)np, logits, NULL};
            double t0 = util_now_s();
            if (fwd_run(f, &m->hp, &m->w, &s, 1, NULL, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            /* decode from an empty cache (or depth), as llama-bench's tg test does */
            kv->n_past = (uint32_t)depth;
            double t1 = util_now_s();
            for (int i = 0; i < nd; i++) {
                int32_t tok = (int32_t)(1 + (i * 104729) % (m->hp.n_vocab - 1));
                fwd_seq_t d = {kv, &tok, 1, logits, NULL};
                if (fwd_run(f, &m->hp, &m->w, &d, 1, NULL, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
            }
            double t2 = util_now_s();
            if (t1 - t0 < best_p)
                best_p = t1 - t0;
            if (t2 - t1 < best_d)
                best_d = t2 - t1;
        }
        printf("%s,%s,%d,%s,%.1f,%.1f\n", name, gguf_ttype_name(m->wtype), nth,
               quant_isa_name(quant_isa_get()), np / best_p, nd / best_d);
        fflush(stdout);
        kv_seq_free(kv);
        fwd_free(f);
        be_close(be);
    }
    free(prompt);
    free(logits);
    model_close(m);
    hugemem_free(img, img_bytes);
    return 0;
}

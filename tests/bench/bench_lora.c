/* bench_lora: a decode step of sequences of as many different LoRA adapters on one base, against the same step of the base alone; and whether each sequence's logits in the mixed step equal those it gets served alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/util.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/lora.h"
#include "engine/model.h"

#define BL_PROMPT 32
#define BL_MAX 64

/* usage: bench_lora BASE ADAPTER,ADAPTER,... STEPS REPS THREADS... ; prints CSV rows
 * model,threads,seqs,base_ms,lora_ms,ratio,equal_alone
 * per decode step of one sequence per adapter (each prefilled with BL_PROMPT tokens): the step
 * with every sequence on the base alone against the step with sequence s on adapter s (best of
 * REPS runs of STEPS steps); ratio = base_ms / lora_ms (the throughput with adapters over the
 * base's); equal_alone: each sequence's logits of a mixed prefill and decode step equal, bit for
 * bit, those it gets served alone. */

typedef struct bl {
    model_t *m;
    lora_t *ad[BL_MAX];
    int ns;
    kv_seq_t *kv[BL_MAX];
    fwd_seq_t sq[BL_MAX];
    int32_t tok[BL_MAX], prompt[BL_MAX][BL_PROMPT];
    float *logits;
    char err[512];
} bl_t;

/* One step of every sequence (adapters or not) on one token each; or their prompts. */
static int bl_step(bl_t *b, fwd_t *f, int with_lora, int prefill)
{
    for (int s = 0; s < b->ns; s++)
        b->sq[s] =
            (fwd_seq_t){b->kv[s], prefill ? b->prompt[s] : &b->tok[s], prefill ? BL_PROMPT : 1,
                        b->logits + (size_t)s * b->m->hp.n_vocab, with_lora ? &b->ad[s]->w : NULL};
    return fwd_run(f, &b->m->hp, &b->m->w, b->sq, b->ns, NULL, b->err, sizeof b->err);
}

/* Mixed prefill and decode step against each sequence alone. 1 equal, 0 not, -1 error. */
static int bl_equal_alone(bl_t *b, fwd_t *f)
{
    const uint32_t nv = b->m->hp.n_vocab;
    for (int s = 0; s < b->ns; s++)
        kv_seq_reset(b->kv[s]), b->tok[s] = (int32_t)(5 + s);
    if (bl_step(b, f, 1, 1) || bl_step(b, f, 1, 0))
        return -1;
    float *one = malloc(nv * sizeof *one);
    kv_seq_t *kv = kv_seq_new(&b->m->hp, BL_PROMPT + 1, KV_TYPE_F16);
    int equal = one && kv;
    for (int s = 0; equal && s < b->ns; s++) {
        kv_seq_reset(kv);
        fwd_seq_t p = {kv, b->prompt[s], BL_PROMPT, NULL, &b->ad[s]->w};
        fwd_seq_t d = {kv, &b->tok[s], 1, one, &b->ad[s]->w};
        if (fwd_run(f, &b->m->hp, &b->m->w, &p, 1, NULL, b->err, sizeof b->err) ||
            fwd_run(f, &b->m->hp, &b->m->w, &d, 1, NULL, b->err, sizeof b->err)) {
            equal = -1;
            break;
        }
        equal = !memcmp(one, b->logits + (size_t)s * nv, nv * sizeof *one);
    }
    free(one);
    kv_seq_free(kv);
    return equal;
}

static int bl_open(bl_t *b, const char *base, char *list)
{
    b->m = model_open(base, b->err, sizeof b->err);
    if (!b->m)
        return -1;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (b->ns == BL_MAX) {
            snprintf(b->err, sizeof b->err, "at most %d adapters", BL_MAX);
            return -1;
        }
        if (!(b->ad[b->ns++] = lora_open(p, b->m, 1.0f, NULL, b->err, sizeof b->err)))
            return -1;
    }
    const uint32_t nv = b->m->hp.n_vocab;
    for (int s = 0; s < b->ns; s++)
        for (int i = 0; i < BL_PROMPT; i++)
            b->prompt[s][i] = (int32_t)(1 + ((s * BL_PROMPT + i) * 7919) % (nv - 1));
    b->logits = malloc((size_t)b->ns * nv * sizeof *b->logits);
    return b->logits ? 0 : -1;
}

static int bl_threads(bl_t *b, int threads, int steps, int reps, const char *name)
{
    be_params_t bp = {.kind = BE_KIND_CPU, .threads = threads};
    backend_t *be = be_open(&bp, b->err, sizeof b->err);
    if (!be)
        return -1;
    fwd_t *f = fwd_new(be);
    const uint32_t n_ctx = BL_PROMPT + (uint32_t)(steps * reps * 2) + 2;
    for (int s = 0; s < b->ns; s++)
        if (!(b->kv[s] = kv_seq_new(&b->m->hp, n_ctx, KV_TYPE_F16)))
            return -1;
    int rc = bl_step(b, f, 1, 1);
    double best[2] = {1e30, 1e30};
    for (int r = 0; !rc && r < reps; r++) {
        for (int l = 0; !rc && l < 2; l++) {
            double t0 = util_now_s();
            for (int k = 0; !rc && k < steps; k++) {
                for (int s = 0; s < b->ns; s++)
                    b->tok[s] =
                        (int32_t)(1 + ((r * steps + k) * 104729 + s * 31) % (b->m->hp.n_vocab - 1));
                rc = bl_step(b, f, l, 0);
            }
            double ms = (util_now_s() - t0) * 1e3 / steps;
            best[l] = ms < best[l] ? ms : best[l];
        }
    }
    int eq = rc ? -1 : bl_equal_alone(b, f);
    if (!rc && eq >= 0)
        printf("%s,%d,%d,%.2f,%.2f,%.3f,%s\n", name, threads, b->ns, best[0], best[1],
               best[0] / best[1], eq ? "yes" : "NO");
    fflush(stdout);
    for (int s = 0; s < b->ns; s++)
        kv_seq_free(b->kv[s]);
    fwd_free(f);
    be_close(be);
    return rc || eq < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s BASE ADAPTER,ADAPTER,... STEPS REPS THREADS...\n", argv[0]);
        return 2;
    }
    static bl_t b;
    int steps = atoi(argv[3]), reps = atoi(argv[4]), rc = 0;
    if (steps < 1 || reps < 1 || bl_open(&b, argv[1], argv[2])) {
        fprintf(stderr, "bench_lora: %s\n", b.err[0] ? b.err : "bad arguments");
        return 2;
    }
    const char *name = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];
    printf("model,threads,seqs,base_ms,lora_ms,ratio,equal_alone\n");
    for (int a = 5; !rc && a < argc; a++)
        if ((rc = bl_threads(&b, atoi(argv[a]), steps, reps, name)))
            fprintf(stderr, "bench_lora: %s\n", b.err);
    for (int s = 0; s < b.ns; s++)
        lora_close(b.ad[s]);
    free(b.logits);
    model_close(b.m);
    return rc ? 1 : 0;
}

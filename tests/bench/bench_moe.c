/* bench_moe: a decode step of several sequences of a mixture-of-experts model, batched against one step per sequence, with the expert reads each takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/util.h"
#include "engine/forward.h"
#include "engine/kv.h"
#include "engine/model.h"

/* usage: bench_moe MODEL SEQS STEPS REPS THREADS... ; prints CSV rows
 * model,threads,seqs,single_ms,batched_ms,speedup,single_reads,batched_reads,selected
 * per decode round of SEQS sequences (each prefilled with 16 tokens): SEQS single-sequence
 * steps against one step of all SEQS (best of REPS runs of STEPS rounds), the expert matrices
 * each round read (fwd_expert_reads) and how many distinct (layer, expert) pairs the batched
 * round's tokens selected (fwd_experts_used): batched_reads == selected means each selected
 * expert was read once. */
static int bench_round(fwd_t *f, model_t *m, kv_seq_t **kv, fwd_seq_t *sq, int ns, int batched,
                       int32_t *tok, float *logits, char *err, size_t errlen)
{
    for (int s = 0; s < ns; s++)
        sq[s] = (fwd_seq_t){kv[s], &tok[s], 1, logits + (size_t)s * m->hp.n_vocab, NULL};
    if (batched)
        return fwd_run(f, &m->hp, &m->w, sq, ns, NULL, err, errlen);
    for (int s = 0; s < ns; s++)
        if (fwd_run(f, &m->hp, &m->w, &sq[s], 1, NULL, err, errlen))
            return -1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL SEQS STEPS REPS THREADS...\n", argv[0]);
        return 2;
    }
    char err[512];
    model_t *m = model_open(argv[1], err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int ns = atoi(argv[2]), steps = atoi(argv[3]), reps = atoi(argv[4]);
    if (ns < 1 || ns > 256 || steps < 1 || reps < 1 || !m->hp.n_expert) {
        fprintf(stderr, "bad arguments (or not a mixture of experts)\n");
        return 2;
    }
    const uint32_t nv = m->hp.n_vocab, n_ctx = 16 + (uint32_t)(steps * reps * 2) + 1;
    const size_t n_flags = (size_t)m->hp.n_layer * m->hp.n_expert;
    float *logits = malloc((size_t)ns * nv * sizeof *logits);
    kv_seq_t **kv = calloc((size_t)ns, sizeof *kv);
    fwd_seq_t *sq = calloc((size_t)ns, sizeof *sq);
    int32_t *tok = calloc((size_t)ns, sizeof *tok), prompt[16];
    const char *name = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];
    printf("model,threads,seqs,single_ms,batched_ms,speedup,single_reads,batched_reads,selected\n");
    for (int a = 5; a < argc; a++) {
        be_params_t bp = {.kind = BE_KIND_CPU, .threads = atoi(argv[a])};
        backend_t *be = be_open(&bp, err, sizeof err);
        if (!be) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        fwd_t *f = fwd_new(be);
        for (int s = 0; s < ns; s++) {
            kv[s] = kv_seq_new(&m->hp, n_ctx, KV_TYPE_F16);
            for (int i = 0; i < 16; i++)
                prompt[i] = (int32_t)(1 + ((s * 16 + i) * 7919) % (nv - 1));
            fwd_seq_t p = {kv[s], prompt, 16, NULL, NULL};
            if (!kv[s] || fwd_run(f, &m->hp, &m->w, &p, 1, NULL, err, sizeof err)) {
                fprintf(stderr, "prefill: %s\n", err);
                return 1;
            }
        }
        double best[2] = {1e30, 1e30};
        double reads[2] = {0, 0}, selected = 0; /* per round, over the last run */
        for (int r = 0; r < reps; r++) {
            for (int b = 0; b < 2; b++) {
                uint64_t r0 = fwd_expert_reads(f);
                size_t sel = 0;
                double t0 = util_now_s();
                for (int k = 0; k < steps; k++) {
                    for (int s = 0; s < ns; s++)
                        tok[s] = (int32_t)(1 + ((r * steps + k) * 104729 + s * 31) % (nv - 1));
                    if (bench_round(f, m, kv, sq, ns, b, tok, logits, err, sizeof err)) {
                        fprintf(stderr, "%s\n", err);
                        return 1;
                    }
                    const uint8_t *u = fwd_experts_used(f); /* the round's (or its last step's) */
                    for (size_t i = 0; b && i < n_flags; i++)
                        sel += u[i];
                }
                double ms = (util_now_s() - t0) * 1e3 / steps;
                best[b] = ms < best[b] ? ms : best[b];
                reads[b] = (double)(fwd_expert_reads(f) - r0) / steps;
                if (b)
                    selected = (double)sel / steps;
            }
        }
        printf("%s,%s,%d,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f\n", name, argv[a], ns, best[0], best[1],
               best[0] / best[1], reads[0], reads[1], selected);
        fflush(stdout);
        for (int s = 0; s < ns; s++)
            kv_seq_free(kv[s]);
        fwd_free(f);
        be_close(be);
    }
    free(logits);
    free(kv);
    free(sq);
    free(tok);
    model_close(m);
    return 0;
}

/* costs: the simulator's device figures, measured ones from gpu-check's figures files (tests/tools/gpu-check.sh) or an H200's datasheet figures. */
#ifndef COSTS_H
#define COSTS_H

#include <stddef.h>

#include "sim.h"

/* An H200 SXM's datasheet figures (the fallback for each figure a report lacks). */
#define COSTS_H200_H2D_GBS 55.0   /* PCIe Gen5 x16: 64 GB/s a direction, ~55 in practice */
#define COSTS_H200_HBM_GBS 4800.0 /* HBM3e */
#define COSTS_H200_TFLOPS 989.0   /* dense BF16 tensor cores */

/* Where each figure came from: "measured: ..." or "datasheet: ...". */
typedef struct costs_src {
    char h2d[256], hbm[256], step[256], flops[256];
    int n_measured; /* figures taken from the report (0: all from the datasheet) */
} costs_src_t;

/* Sets cost->h2d_bw, hbm_bw, flops, t_fixed_s, t_step_s and t_token_s.
 * what: "h200" (the datasheet), or gpu-check figures files (gpu-check-N-figures.txt), several
 * separated by commas or concatenated into one:
 *  - h2d_bw: the page-in GB/s of the 8B stage (ttft8b), else the paging stage's;
 *  - hbm_bw, t_step_s, t_token_s: a least-squares fit of step time = t_step + bytes / hbm_bw +
 *    t_token * batch to the decode figures ("decode B C TOK_S BYTES_PER_TOKEN": batch, context): of the fits with hbm_bw and no more unknowns than distinct points (one point:
 *    hbm_bw alone) whose terms come out non-negative, the closest; t_fixed_s is then 0 (the fit
 *    holds it);
 *  - flops: 2 x parameters x tokens / (time - weight read) for the longest prefill figure, the
 *    parameters being the 8B model's bytes / 2 (BF16), its weight bytes those the batch-1 decode
 *    reads a token.
 * A figure the report lacks keeps the datasheet's. 0, or -1 with the reason in err (an unreadable
 * file; a report with no figure at all is not an error: src->n_measured says 0). */
int costs_load(const char *what, sim_cost_t *cost, costs_src_t *src, char *err, size_t errlen);

#endif

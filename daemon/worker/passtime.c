/* passtime: a model's measured pass compute, as a part per pass and a part per prompt token, to say how long its next pass will compute (a cold model's first pass starts while its last copies land). */
#include "passtime.h"

/* weight of the newest measurement in each moving average */
#define PASS_TIME_NEW 0.2

static void average(double *avg, double x, int first)
{
    *avg = first ? x : (1.0 - PASS_TIME_NEW) * *avg + PASS_TIME_NEW * x;
}

void pass_time_note(pass_time_t *p, double compute_s, uint32_t n_tokens, uint32_t n_seqs)
{
    if (!(compute_s > 0) || n_seqs == 0)
        return;
    average(&p->pass_s, compute_s, p->pass_s == 0);
    if (n_tokens <= n_seqs) {
        average(&p->step_s, compute_s, p->step_s == 0);
        return;
    }
    if (!(p->step_s > 0))
        return; /* no decode step yet to tell the fixed part from the tokens' */
    double beyond = compute_s > p->step_s ? compute_s - p->step_s : 0;
    int first = p->prefill_tokens == 0;
    average(&p->prefill_s, beyond, first);
    average(&p->prefill_tokens, (double)(n_tokens - n_seqs), first);
}

double pass_time_for(const pass_time_t *p, uint32_t n_tokens, uint32_t n_seqs)
{
    if (!(p->step_s > 0) || !(p->prefill_s > 0) || !(p->prefill_tokens > 0))
        return p->pass_s;
    uint32_t extra = n_tokens > n_seqs ? n_tokens - n_seqs : 0;
    return p->step_s + p->prefill_s / p->prefill_tokens * (double)extra;
}

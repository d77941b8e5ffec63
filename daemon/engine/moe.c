/* moe: mixture-of-experts routing on the host: each token's experts and weights from its router logits, and a step's tokens grouped by expert so that each selected expert's weights are read once. */
#include "engine/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void moe_route(const float *logits, uint32_t n_expert, uint32_t k, int norm_w, uint32_t *sel,
               float *w)
{
    float p[256];
    float max = -INFINITY;
    for (uint32_t e = 0; e < n_expert; e++)
        max = logits[e] > max ? logits[e] : max;
    double sum = 0.0;
    for (uint32_t e = 0; e < n_expert; e++) {
        p[e] = expf(logits[e] - max);
        sum += (double)p[e];
    }
    float inv = (float)(1.0 / sum);
    for (uint32_t e = 0; e < n_expert; e++)
        p[e] *= inv;
    /* top k by selection: k is small (2..8) */
    uint8_t taken[256] = {0};
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best = 0;
        int found = 0;
        for (uint32_t e = 0; e < n_expert; e++) {
            if (taken[e])
                continue;
            if (!found || p[e] > p[best]) {
                best = e;
                found = 1;
            }
        }
        taken[best] = 1;
        sel[j] = best;
        w[j] = p[best];
    }
    if (!norm_w)
        return;
    double s = 0.0;
    for (uint32_t j = 0; j < k; j++)
        s += (double)w[j];
    float fs = (float)s;
    for (uint32_t j = 0; j < k; j++)
        w[j] = w[j] / fs;
}

static int plan_reserve(moe_plan_t *p, size_t n, uint32_t n_expert)
{
    if (n > p->cap) {
        uint32_t *tok = malloc(n * sizeof *tok), *dst = malloc(n * sizeof *dst);
        float *w = malloc(n * sizeof *w);
        if (!tok || !dst || !w) {
            free(tok);
            free(dst);
            free(w);
            return MOE_ERR_NOMEM;
        }
        free(p->tok);
        free(p->dst);
        free(p->w);
        p->tok = tok;
        p->dst = dst;
        p->w = w;
        p->cap = n;
    }
    if (n_expert > p->cap_expert) {
        uint32_t *ex = malloc(n_expert * sizeof *ex), *st = malloc((n_expert + 1) * sizeof *st);
        uint32_t *cnt = malloc(n_expert * sizeof *cnt);
        if (!ex || !st || !cnt) {
            free(ex);
            free(st);
            free(cnt);
            return MOE_ERR_NOMEM;
        }
        free(p->expert);
        free(p->start);
        free(p->count);
        p->expert = ex;
        p->start = st;
        p->count = cnt;
        p->cap_expert = n_expert;
    }
    return MOE_OK;
}

int moe_plan_build(moe_plan_t *p, const uint32_t *sel, const float *w, size_t n_tok, uint32_t k,
                   uint32_t n_expert, uint32_t n_slots)
{
    if (n_slots < k || n_expert == 0)
        return MOE_ERR_ARG;
    size_t n = n_tok * k;
    for (size_t i = 0; i < n; i++)
        if (sel[i] >= n_expert)
            return MOE_ERR_ARG;
    if (plan_reserve(p, n, n_expert))
        return MOE_ERR_NOMEM;
    /* a counting sort by expert; tokens stay in order within each group */
    memset(p->count, 0, n_expert * sizeof *p->count);
    for (size_t i = 0; i < n; i++)
        p->count[sel[i]]++;
    p->n_groups = 0;
    uint32_t at = 0;
    for (uint32_t e = 0; e < n_expert; e++) {
        if (!p->count[e])
            continue;
        p->expert[p->n_groups] = e;
        p->start[p->n_groups++] = at;
        uint32_t c = p->count[e];
        p->count[e] = at; /* now the next free entry of its group */
        at += c;
    }
    p->start[p->n_groups] = at;
    for (size_t t = 0; t < n_tok; t++) {
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = p->count[sel[t * k + j]]++;
            p->tok[i] = (uint32_t)t;
            p->dst[i] = (uint32_t)(t * n_slots + j);
            p->w[i] = w[t * k + j];
        }
    }
    return MOE_OK;
}

void moe_plan_free(moe_plan_t *p)
{
    if (!p)
        return;
    free(p->expert);
    free(p->start);
    free(p->tok);
    free(p->dst);
    free(p->w);
    free(p->count);
    memset(p, 0, sizeof *p);
}

/* conv: conversation workloads for the simulator (sessions of turns, each prompt the whole history). */
#include "conv.h"

#include <math.h>
#include <stdlib.h>

static uint32_t draw_len(wl_rng_t *r, const wl_len_t *l)
{
    double x = l->median * (l->sigma > 0 ? exp(l->sigma * wl_rng_normal(r)) : 1.0);
    x = x < l->min ? l->min : x > l->max ? l->max : x;
    return (uint32_t)(x + 0.5);
}

static int cmp_t(const void *a, const void *b)
{
    const wl_req_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->session < y->session ? -1 : x->session > y->session;
}

static int push(wl_req_t **v, size_t *n, size_t *cap, const wl_req_t *r)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 1024;
        wl_req_t *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return -1;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = *r;
    return 0;
}

/* One session's turns from t (those in [0, duration) kept). */
static int session(const conv_params_t *p, wl_rng_t *r, double t, int model, uint32_t id,
                   wl_req_t **v, size_t *n, size_t *cap)
{
    double mu = log(p->think_s) - 0.5 * p->think_sigma * p->think_sigma;
    uint32_t hist = 0;
    for (int k = 0; k < p->turns && t < p->duration_s; k++) {
        uint32_t add, out;
        if (p->n_tok) {
            const wl_req_t *s = &p->tok[wl_rng_u64(r) % p->n_tok];
            add = s->prompt, out = s->output;
        } else {
            add = draw_len(r, &p->prompt), out = draw_len(r, &p->output);
        }
        if (p->max_ctx && (uint64_t)hist + add + out > p->max_ctx)
            break;
        wl_req_t q = {.t = t,
                      .model = model,
                      .prompt = hist + add,
                      .output = out,
                      .session = id,
                      .history = hist};
        if (t >= 0 && push(v, n, cap, &q))
            return -1;
        hist += add + out;
        t += exp(mu + p->think_sigma * wl_rng_normal(r));
    }
    return 0;
}

int conv_generate(const conv_params_t *p, wl_req_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (p->n_models < 1 || p->rate <= 0 || p->duration_s <= 0 || p->turns < 1 || p->think_s <= 0)
        return WL_ERR_ARG;
    double *cdf = malloc((size_t)p->n_models * sizeof *cdf), sum = 0;
    if (!cdf)
        return WL_ERR_NOMEM;
    wl_params_t wp = {.n_models = p->n_models, .zipf_s = p->zipf_s};
    for (int i = 0; i < p->n_models; i++)
        cdf[i] = sum += wl_popularity(&wp, i);
    wl_rng_t r;
    wl_rng_seed(&r, p->seed);
    double srate = p->rate / p->turns, t = -(p->turns - 1) * p->think_s;
    size_t cap = 0;
    uint32_t id = 0;
    int rc = WL_OK;
    for (;;) {
        t += -log(wl_rng_uniform(&r)) / srate;
        if (t >= p->duration_s)
            break;
        double u = wl_rng_uniform(&r) * sum;
        int model = 0;
        while (model < p->n_models - 1 && cdf[model] < u)
            model++;
        if (session(p, &r, t, model, ++id, out, n, &cap)) {
            rc = WL_ERR_NOMEM;
            break;
        }
    }
    free(cdf);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
        return rc;
    }
    qsort(*out, *n, sizeof **out, cmp_t);
    return WL_OK;
}

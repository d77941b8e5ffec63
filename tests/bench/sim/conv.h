/* conv: conversation workloads for the simulator: sessions of several turns bound to one model, each turn's prompt the whole history plus its new tokens, think times between turns. */
#ifndef CONV_H
#define CONV_H

#include <stddef.h>
#include <stdint.h>

#include "workload.h"

/*
 * Sessions start as a Poisson process of rate / turns a second over
 * [-(turns - 1) x think_s, duration): every session's turns fall where they
 * fall, and only those in [0, duration) are kept, so the turn rate is about
 * `rate` from the start (a session begun before 0 arrives with its history
 * and no cached prefix, as after a restart). A session's model is a Zipf(zipf_s)
 * draw. Turn k + 1 arrives think time after turn k (open loop: a lognormal of
 * mean think_s and sigma think_sigma, whatever turn k's latency). Turn k's
 * prompt = history + new tokens, its output drawn; history grows by both. New
 * and output tokens are drawn from the lognormals, or (n_tok > 0) as one
 * seeded draw of a request of tok (its prompt the new tokens). A session ends
 * after `turns` turns, or before a turn whose prompt + output would pass
 * max_ctx.
 */
typedef struct conv_params {
    int n_models;
    double zipf_s;
    double rate;       /* turns/s over all sessions */
    double duration_s; /* turns in [0, duration) */
    int turns;         /* per session, at most */
    double think_s;    /* mean think time between turns, s */
    double think_sigma;
    wl_len_t prompt, output; /* a turn's new tokens and output */
    const wl_req_t *tok;     /* (optional) token counts drawn from these instead: borrowed */
    size_t n_tok;
    uint32_t max_ctx; /* prompt + output at most (0 = no bound) */
    uint64_t seed;
} conv_params_t;

/* *out malloc'ed (caller frees), sorted by t; sessions numbered from 1 in start order. */
int conv_generate(const conv_params_t *p, wl_req_t **out, size_t *n);

#endif
